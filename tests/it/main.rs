//! The integration tests, built as one binary.

mod local;
mod simulator;
