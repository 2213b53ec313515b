//! Warnings found below the commands, carried up to them as values.
//!
//! Library code does not print. A layer that finds something worth a word
//! returns it (a `warnings` list in what it reports) or puts it in a
//! [`Warnings`] it shares with its caller; the command hands what arrives to
//! its printer (`commands::messages`), which scrubs the key from every line.

use std::sync::{Arc, Mutex, PoisonError};

/// One warning: the program's own, or a line another library logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The library that logged it (`onnxruntime`), when not the program.
    pub from: Option<&'static str>,
    pub text: String,
}

impl Warning {
    pub fn new(text: impl Into<String>) -> Warning {
        Warning {
            from: None,
            text: text.into(),
        }
    }

    /// A line `from` logged.
    pub fn logged(from: &'static str, text: impl Into<String>) -> Warning {
        Warning {
            from: Some(from),
            text: text.into(),
        }
    }
}

/// Warnings held until someone takes them, at most this many; a layer that
/// repeats itself with no one reading must not grow without bound.
const MAX_HELD: usize = 1000;

/// Where a lower layer puts its warnings, shared (clones are one place)
/// with whoever prints them. They are held until taken, or, once a reader
/// is set with [`Warnings::forward`], handed to it as they come.
#[derive(Clone, Default)]
pub struct Warnings(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    held: Vec<Warning>,
    reader: Option<fn(&Warning)>,
}

impl std::fmt::Debug for Warnings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warnings")
            .field("held", &self.lock().held.len())
            .finish_non_exhaustive()
    }
}

impl Warnings {
    pub fn new() -> Warnings {
        Warnings::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change is a single step: the list stays whole even if a holder panicked.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn warn(&self, text: impl Into<String>) {
        self.push(Warning::new(text));
    }

    pub fn push(&self, warning: Warning) {
        let mut inner = self.lock();
        match inner.reader {
            // Handed on under the lock, so that warnings keep their order.
            Some(reader) => reader(&warning),
            None if inner.held.len() < MAX_HELD => inner.held.push(warning),
            None => {}
        }
    }

    /// Hands every warning to `reader` from now on, those held first.
    pub fn forward(&self, reader: fn(&Warning)) {
        let mut inner = self.lock();
        for warning in inner.held.drain(..) {
            reader(&warning);
        }
        inner.reader = Some(reader);
    }

    /// The warnings held, which are then gone.
    pub fn take(&self) -> Vec<Warning> {
        std::mem::take(&mut self.lock().held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn warnings_are_held_until_taken_and_shared_by_clones() {
        let warnings = Warnings::new();
        let layer = warnings.clone();
        layer.warn("first");
        layer.push(Warning::logged("onnxruntime", "second"));
        assert_eq!(
            warnings.take(),
            vec![
                Warning::new("first"),
                Warning::logged("onnxruntime", "second")
            ]
        );
        assert!(warnings.take().is_empty());
        for n in 0..MAX_HELD + 10 {
            layer.warn(format!("{n}"));
        }
        assert_eq!(warnings.take().len(), MAX_HELD, "held within a bound");
    }

    static READ: AtomicUsize = AtomicUsize::new(0);

    fn count(_: &Warning) {
        READ.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn a_reader_gets_those_held_and_those_that_come() {
        let warnings = Warnings::new();
        warnings.warn("before");
        warnings.forward(count);
        assert_eq!(READ.load(Ordering::SeqCst), 1);
        warnings.clone().warn("after");
        assert_eq!(READ.load(Ordering::SeqCst), 2);
        assert!(warnings.take().is_empty(), "nothing is held once read");
    }
}
