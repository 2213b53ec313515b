//! Fixtures for the unit tests of the stages that write and read vectors.

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::types::{Chunk, EmbeddedBatch, Usage, Vectors};

pub(crate) fn chunk(doc: &str, index: u32) -> Chunk {
    let text = format!("text of {doc}, part {index} \u{e9}");
    let byte_start = u64::from(index) * 100;
    Chunk {
        id: format!("{doc}#{index}"),
        doc_id: Arc::from(doc),
        source: Arc::from(format!("input/{doc}").as_str()),
        chunk_index: index,
        byte_start,
        byte_end: byte_start + text.len() as u64,
        content_hash: Sha256::digest(text.as_bytes()).into(),
        token_count: index + 1,
        text,
        metadata: None,
    }
}

/// The value at position `j` of row `row`'s vector.
pub(crate) fn value(row: usize, j: usize) -> f32 {
    row as f32 * 10.0 + j as f32 + 0.25
}

/// Rows `first..first + len` of document `doc`, with their vectors.
pub(crate) fn batch(doc: &str, first: u32, len: u32, dimensions: usize) -> EmbeddedBatch {
    let chunks: Vec<Chunk> = (first..first + len).map(|i| chunk(doc, i)).collect();
    let values = (first..first + len)
        .flat_map(|i| (0..dimensions).map(move |j| value(i as usize, j)))
        .collect();
    EmbeddedBatch {
        chunks,
        vectors: Vectors {
            dimensions,
            values,
            usage: Usage::default(),
            discarded: Usage::default(),
        },
    }
}

/// The names in `dir`, sorted.
pub(crate) fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
