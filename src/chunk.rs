//! Token-aware chunking.

use std::sync::Arc;

use crate::source::Document;

/// A piece of a document, the unit that is embedded and written.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// `{doc_id}#{chunk_index}`.
    pub id: String,
    pub doc_id: Arc<str>,
    pub source: Arc<str>,
    pub chunk_index: u32,
    /// `text == document[byte_start..byte_end]`.
    pub byte_start: u64,
    pub byte_end: u64,
    pub text: String,
    /// SHA-256 of `text`.
    pub content_hash: [u8; 32],
    /// Tokens in `text`, counted locally.
    pub token_count: u32,
}

impl Chunk {
    pub fn content_hash_hex(&self) -> String {
        hex::encode(self.content_hash)
    }
}

/// Splits documents into chunks.
pub trait Chunker: Send + Sync {
    fn chunk(&self, document: &Document) -> Vec<Chunk>;
    fn count_tokens(&self, text: &str) -> usize;
}
