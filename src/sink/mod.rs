//! Sinks: where validated vectors go.

use crate::chunk::Chunk;
use crate::validate::Vectors;

/// Chunks with the vectors that passed validation, row for row.
#[derive(Debug, Clone)]
pub struct EmbeddedBatch {
    pub chunks: Vec<Chunk>,
    pub vectors: Vectors,
}
