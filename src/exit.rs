//! Exit codes, as the command-line contract lists them.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success.
    Success,
    /// 1: the job failed.
    Failed,
    /// 2: a usage or config error, found before any work started.
    Usage,
    /// 3: finished, but some chunks were quarantined.
    Quarantined,
    /// 4: stopped early and can be resumed.
    Stopped,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Quarantined => 3,
            Exit::Stopped => 4,
        }
    }
}

/// An error together with the exit code it calls for.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Failure {
            exit: Exit::Usage,
            error: error.into(),
        }
    }

    pub fn failed(error: impl Into<anyhow::Error>) -> Self {
        Failure {
            exit: Exit::Failed,
            error: error.into(),
        }
    }

    /// A usage problem (exit 2) when it was `found_before_work`, else a
    /// failure (exit 1).
    pub fn found(found_before_work: bool, error: impl Into<anyhow::Error>) -> Self {
        if found_before_work {
            Failure::usage(error)
        } else {
            Failure::failed(error)
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.error)
    }
}
