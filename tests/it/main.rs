//! The integration tests, built as one binary.

mod simulator;
