//! embedjob: a batch job runner that turns text into vector indexes.

pub mod simulate;
