//! The data every stage passes on: a [`Document`] from a source becomes
//! [`Chunk`]s, a backend answers a request with [`RawVectors`], which
//! `validate` turns into checked [`Vectors`], and the sink receives them with
//! their chunks as an [`EmbeddedBatch`]. [`Usage`] is what a request was
//! billed.
//!
//! These types belong to no stage, so that no stage has to reach into
//! another for them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One document to chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// A file's path relative to its root, or the record's id (or row number).
    pub doc_id: String,
    /// The input file, as the job names it.
    pub source: Arc<str>,
    pub text: String,
    /// The record's `source.metadata_fields`, shared by its chunks.
    pub metadata: Option<Arc<Metadata>>,
}

/// The output columns `source.metadata_fields` add, in order, with the
/// types the input gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataSchema {
    pub fields: Vec<MetadataField>,
}

/// One metadata column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataField {
    /// The field as the job names it (a column, or a dotted JSON path).
    pub field: String,
    /// The output column (see `crate::contract::metadata_column`).
    pub column: String,
    /// Its type in the output: a string, boolean, integer, float, date or
    /// timestamp type, as in the input.
    pub data_type: arrow::datatypes::DataType,
}

/// One record's metadata values, one per field of `schema`. Its chunks
/// share it, so a document's metadata is kept once however many chunks it
/// makes.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    pub schema: Arc<MetadataSchema>,
    pub values: Box<[MetaValue]>,
}

/// A metadata value as read, before it takes its column's type: integers,
/// dates and timestamps as `Int` (or `UInt`), in the input's own unit.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Text(Box<str>),
}

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
    /// Its document's metadata, shared with the document's other chunks.
    pub metadata: Option<Arc<Metadata>>,
}

impl Chunk {
    pub fn content_hash_hex(&self) -> String {
        hex::encode(self.content_hash)
    }
}

/// SHA-256 of a chunk's text, the `content_hash` of [`Chunk`].
#[must_use]
pub fn content_hash(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Tokens a request was billed, as the service's `usage` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    /// The reply's tokens (a chat's); embeddings have none, and then the
    /// count is left out of what is written.
    #[serde(
        default,
        deserialize_with = "null_as_zero",
        skip_serializing_if = "is_zero"
    )]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

/// Some servers write `null` for the completion tokens of an answer without any.
fn null_as_zero<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    Ok(Option::<u64>::deserialize(deserializer)?.unwrap_or(0))
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// Sums saturate: a server can claim any count, and a sum that wrapped
/// would report a huge bill as a small one.
impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;

    fn add(mut self, other: Usage) -> Usage {
        self += other;
        self
    }
}

impl Usage {
    /// `self - other`, each count at least 0.
    #[must_use]
    pub fn saturating_sub(self, other: Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.saturating_sub(other.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_sub(other.completion_tokens),
            total_tokens: self.total_tokens.saturating_sub(other.total_tokens),
        }
    }

    pub fn is_zero(&self) -> bool {
        self.prompt_tokens == 0 && self.completion_tokens == 0 && self.total_tokens == 0
    }
}

/// A backend's answer to one request, before any check: the vectors one
/// after another in `values`, in the order they came, each item's `index`
/// and place beside them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawVectors {
    /// One per vector, in the order received.
    pub items: Vec<RawItem>,
    /// Every item's vector, in the order received.
    pub values: Vec<f32>,
    pub usage: Option<Usage>,
    /// The model the answer says made it, when it says.
    pub model: Option<String>,
}

/// Where one item's vector sits in [`RawVectors::values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawItem {
    /// As received; signed so that a negative index is reported as such.
    pub index: i64,
    pub start: usize,
    pub len: usize,
}

impl RawVectors {
    /// Item `i`'s vector.
    pub fn vector(&self, i: usize) -> &[f32] {
        let item = self.items[i];
        &self.values[item.start..item.start + item.len]
    }

    /// Vectors already in input order, as a local model makes them.
    pub fn in_order(vectors: Vec<Vec<f32>>, usage: Usage) -> RawVectors {
        let total = vectors.iter().map(Vec::len).sum();
        let mut values = Vec::with_capacity(total);
        let items = vectors
            .into_iter()
            .enumerate()
            .map(|(index, vector)| {
                let start = values.len();
                values.extend_from_slice(&vector);
                RawItem {
                    index: i64::try_from(index).unwrap_or(i64::MAX),
                    start,
                    len: vector.len(),
                }
            })
            .collect();
        RawVectors {
            items,
            values,
            usage: Some(usage),
            model: None,
        }
    }
}

/// Vectors that passed every check, in input order, stored row after row.
#[derive(Debug, Clone, PartialEq)]
pub struct Vectors {
    pub dimensions: usize,
    pub values: Vec<f32>,
    /// Everything billed for these vectors: every response that carried
    /// usage, including those whose vectors failed a check.
    pub usage: Usage,
    /// Of `usage`, what paid for vectors that failed a check and were sent again.
    pub discarded: Usage,
}

impl Vectors {
    pub fn len(&self) -> usize {
        self.values.len().checked_div(self.dimensions).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.dimensions..(i + 1) * self.dimensions]
    }

    pub fn rows(&self) -> std::slice::ChunksExact<'_, f32> {
        self.values.chunks_exact(self.dimensions.max(1))
    }
}

/// Chunks with the vectors that passed validation, row for row.
#[derive(Debug, Clone)]
pub struct EmbeddedBatch {
    pub chunks: Vec<Chunk>,
    pub vectors: Vectors,
}

impl EmbeddedBatch {
    /// The metadata columns its chunks carry (every chunk of a run carries
    /// the same ones), as the first chunk says.
    pub fn metadata_schema(&self) -> Option<Arc<MetadataSchema>> {
        self.chunks
            .first()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| Arc::clone(&m.schema))
    }
}

/// A compact hash of a chunk or document id, for sets of ids seen. The std
/// hasher is deterministic within a process, which is all such a set needs.
pub fn id_key(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    hasher.finish()
}

/// A 128-bit hash of an id, for checks that must not mistake two ids.
pub fn id_key128(id: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    // Two independent SipHash runs.
    let half = |salt: u8| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut hasher);
        id.hash(&mut hasher);
        hasher.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// What an output's metadata records about the run that made it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OutputMetadata {
    pub model: String,
    pub dimensions: usize,
    /// `api` or `local`.
    pub backend: String,
    pub usage: Usage,
    /// Embedding requests that succeeded.
    pub requests: u64,
    /// Only when the model's pricing is known.
    pub cost: Option<f64>,
    /// Further keys, written as given; they may not repeat a key above.
    pub extra: std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_tokens_are_read_when_given_and_written_only_when_some() {
        let chat: Usage = serde_json::from_str(
            r#"{"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}"#,
        )
        .unwrap();
        assert_eq!(chat.completion_tokens, 5);
        assert_eq!(
            serde_json::to_value(chat).unwrap()["completion_tokens"],
            5,
            "{chat:?}"
        );
        for embeddings in [
            r#"{"prompt_tokens": 7, "total_tokens": 7}"#,
            r#"{"prompt_tokens": 7, "completion_tokens": null, "total_tokens": 7}"#,
        ] {
            let usage: Usage = serde_json::from_str(embeddings).unwrap();
            assert_eq!(usage.completion_tokens, 0, "{embeddings}");
            assert_eq!(
                serde_json::to_string(&usage).unwrap(),
                r#"{"prompt_tokens":7,"total_tokens":7}"#,
                "an embedding's usage is written as before"
            );
        }
        let sum = chat + chat;
        assert_eq!(sum.completion_tokens, 10);
        assert_eq!(sum.saturating_sub(chat), chat);
        assert!(!Usage {
            completion_tokens: 1,
            ..Usage::default()
        }
        .is_zero());
    }
}
