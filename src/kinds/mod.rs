//! Every stage's kinds together, for reading a job file: `job` knows no
//! kind, so a job is read with the kinds the source, backend and sink
//! registries list (`source::KINDS`, `backend::KINDS`, `sink::KINDS`).

use std::path::Path;

use crate::job::{Job, JobErrors, Kinds};

/// The kinds of every stage.
pub fn all() -> Kinds {
    Kinds {
        source: crate::source::kinds(),
        backend: crate::backend::kinds(),
        output: crate::sink::kinds(),
    }
}

/// [`crate::job::load`] with every stage's kinds.
pub fn load(path: &Path, overrides: &[String]) -> Result<Job, JobErrors> {
    crate::job::load(path, overrides, &all())
}

/// [`crate::job::parse`] with every stage's kinds.
pub fn parse(text: &str, default_name: &str, overrides: &[String]) -> Result<Job, Vec<String>> {
    crate::job::parse(text, default_name, overrides, &all())
}

#[cfg(test)]
mod hostile;
#[cfg(test)]
mod tests;
