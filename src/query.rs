//! Searching a job's output: the chunks nearest to a query vector by cosine
//! similarity.
//!
//! A Parquet output is scanned a record batch at a time, keeping only the
//! best `k` rows in a heap, so memory does not grow with the output. A
//! pgvector output is searched by the database with its own operator
//! (`crate::sink::pgvector::search`).
//!
//! A row whose vector has no direction to compare (a NaN or an infinity in
//! it, all zeros, or no vector at all) is never a result: both searches pass
//! over it and count it ([`Found::passed_over`]).

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Float32Type};
use parquet::arrow::ProjectionMask;
use serde::Serialize;

use crate::contract::{arrow_value, is_standard_column, json_value, readable};
use crate::parquet_io::{embedding_dimensions, guard, key_values, open_reader, FileError};

/// Rows decoded at a time.
const SCAN_BATCH_ROWS: usize = 1024;

/// The most results one query returns.
pub const MAX_K: usize = 1000;

/// One result: a chunk and how close it is to the query.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    /// 1 for the nearest.
    pub rank: usize,
    /// Cosine similarity, from -1 to 1.
    pub score: f64,
    pub id: String,
    pub doc_id: String,
    /// The chunk's text, when the output holds it.
    pub text: Option<String>,
    /// The chunk's metadata columns (`source.metadata_fields`), by name;
    /// left out when the output has none.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// What a search found: the results, and how many damaged rows it passed over.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Found {
    pub hits: Vec<Hit>,
    /// Rows that could not be compared: a vector with a NaN or an infinity,
    /// an all-zero vector (cosine similarity has no meaning for it), or no
    /// vector or id.
    pub passed_over: u64,
    /// What the output says of itself worth a word: shards of one table
    /// that read different inputs.
    pub warnings: Vec<String>,
}

/// Whether a stored vector can be compared by cosine similarity: every
/// value finite and not all of them zero.
pub fn comparable(vector: &[f32]) -> bool {
    vector.iter().all(|v| v.is_finite()) && vector.iter().any(|&v| v != 0.0)
}

/// A search that cannot be done. Every variant names the output.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{path}: no output yet: run the job first")]
    NoOutput { path: PathBuf },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path}: {message}")]
    Layout { path: PathBuf, message: String },
    #[error("{output} holds {held}; the query was embedded with {query}: {hint}")]
    Mismatch {
        output: String,
        held: String,
        query: String,
        hint: &'static str,
    },
    #[error(
        "the query's vector cannot be compared (a NaN or an infinity in it, or all zeros): \
         the model {model} gave no direction for the text"
    )]
    QueryVector { model: String },
}

/// Checks that the query's own vector can be compared: with a NaN in it
/// every row would score NaN, and with all zeros every row would score 0.
pub fn check_query(vector: &[f32], model: &str) -> Result<(), QueryError> {
    if comparable(vector) {
        Ok(())
    } else {
        Err(QueryError::QueryVector {
            model: model.to_string(),
        })
    }
}

impl QueryError {
    /// Problems found before the search starts.
    pub fn is_found_before_work(&self) -> bool {
        matches!(
            self,
            QueryError::NoOutput { .. } | QueryError::Mismatch { .. }
        )
    }
}

/// Checks that the output's vectors were made by the model the query was
/// embedded with, as its metadata (`embedjob.model`, `embedjob.dimensions`)
/// records.
pub fn check_model(
    output: &str,
    metadata: &BTreeMap<String, String>,
    model: &str,
    dimensions: usize,
) -> Result<(), QueryError> {
    let held_model = metadata.get(crate::contract::MODEL_KEY).map(String::as_str);
    let held_dimensions = metadata
        .get(crate::contract::DIMENSIONS_KEY)
        .and_then(|d| d.parse::<usize>().ok());
    let same_model = held_model.is_none_or(|m| m == model);
    let same_length = held_dimensions.is_none_or(|d| d == dimensions);
    if same_model && same_length {
        return Ok(());
    }
    Err(QueryError::Mismatch {
        output: output.to_string(),
        held: format!(
            "vectors of model {} ({} dimensions)",
            held_model.unwrap_or("?"),
            held_dimensions.map_or_else(|| "?".to_string(), |d| d.to_string())
        ),
        query: format!("model {model} ({dimensions} dimensions)"),
        hint: "query with the job that made the output",
    })
}

/// A candidate in the heap: ordered by score, then by id (the smaller id
/// ranks first among equal scores), so that results do not depend on the
/// order rows are read in.
#[derive(Debug, PartialEq)]
struct Candidate {
    score: f64,
    id: String,
    doc_id: String,
    text: Option<String>,
    metadata: serde_json::Map<String, serde_json::Value>,
}

impl Eq for Candidate {}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.id.cmp(&self.id))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The best `k` of what it is offered, in a min-heap of size `k`.
struct TopK {
    k: usize,
    heap: BinaryHeap<Reverse<Candidate>>,
}

impl TopK {
    fn new(k: usize) -> TopK {
        TopK {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
        }
    }

    /// Whether a row of this score and id would enter.
    fn admits(&self, score: f64, id: &str) -> bool {
        if self.heap.len() < self.k {
            return true;
        }
        self.heap.peek().is_some_and(|Reverse(worst)| {
            score
                .total_cmp(&worst.score)
                .then_with(|| worst.id.as_str().cmp(id))
                == Ordering::Greater
        })
    }

    fn push(&mut self, candidate: Candidate) {
        self.heap.push(Reverse(candidate));
        if self.heap.len() > self.k {
            self.heap.pop();
        }
    }

    fn into_hits(self) -> Vec<Hit> {
        let mut best: Vec<Candidate> = self.heap.into_iter().map(|Reverse(c)| c).collect();
        best.sort_by(|a, b| b.cmp(a));
        best.into_iter()
            .enumerate()
            .map(|(i, c)| Hit {
                rank: i + 1,
                score: c.score,
                id: c.id,
                doc_id: c.doc_id,
                text: c.text,
                metadata: c.metadata,
            })
            .collect()
    }
}

fn norm(vector: &[f32]) -> f64 {
    vector
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt()
}

/// Cosine similarity; 0 when either vector is all zeros.
fn cosine(query: &[f32], query_norm: f64, row: &[f32]) -> f64 {
    let dot: f64 = query
        .iter()
        .zip(row)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    let row_norm = norm(row);
    if query_norm == 0.0 || row_norm == 0.0 {
        0.0
    } else {
        dot / (query_norm * row_norm)
    }
}

/// A Parquet output's metadata, checked to hold vectors as long as `query`.
pub fn parquet_metadata(
    path: &Path,
    dimensions: usize,
) -> Result<BTreeMap<String, String>, QueryError> {
    if !path.exists() {
        return Err(QueryError::NoOutput {
            path: path.to_path_buf(),
        });
    }
    let builder = open_reader(path)?;
    let held = embedding_dimensions(builder.schema()).map_err(|message| QueryError::Layout {
        path: path.to_path_buf(),
        message,
    })?;
    let metadata = key_values(builder.metadata());
    if held != dimensions {
        return Err(QueryError::Mismatch {
            output: path.display().to_string(),
            held: format!("{held}-dimensional vectors"),
            query: format!("{dimensions} dimensions"),
            hint: "query with the job that made the output",
        });
    }
    Ok(metadata)
}

/// The `k` rows of a Parquet output (one file, or the files of a split
/// job) nearest to `query`, best first, read a record batch at a time.
pub fn search_parquet(
    files: &[std::path::PathBuf],
    query: &[f32],
    k: usize,
) -> Result<Found, QueryError> {
    let mut top = TopK::new(k);
    let mut passed_over = 0;
    for file in files {
        passed_over += scan(file, query, &mut top)?;
    }
    Ok(Found {
        hits: top.into_hits(),
        passed_over,
        warnings: Vec::new(),
    })
}

/// Offers every comparable row of the file at `path` to `top`; the number
/// of rows passed over.
fn scan(path: &Path, query: &[f32], top: &mut TopK) -> Result<u64, QueryError> {
    let builder = open_reader(path)?;
    let layout = |message: String| QueryError::Layout {
        path: path.to_path_buf(),
        message,
    };
    let schema = builder.schema().clone();
    let dimensions = embedding_dimensions(&schema).map_err(layout)?;
    if dimensions != query.len() {
        return Err(layout(format!(
            "holds {dimensions}-dimensional vectors, the query's has {}",
            query.len()
        )));
    }
    let metadata_columns: Vec<(String, DataType)> = schema
        .fields()
        .iter()
        .filter(|f| !is_standard_column(f.name()))
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    let wanted: Vec<usize> = ["id", "doc_id", "text", "embedding"]
        .into_iter()
        .chain(metadata_columns.iter().map(|(name, _)| name.as_str()))
        .filter_map(|name| schema.index_of(name).ok())
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(SCAN_BATCH_ROWS)
        .build()
        .map_err(|e| FileError::corrupt(path, e))?;
    let query_norm = norm(query);
    let mut reader = reader;
    let mut passed_over = 0;
    while let Some(batch) = guard(path, || reader.next())? {
        let batch = batch.map_err(|e| FileError::corrupt(path, e))?;
        let strings = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_string_opt::<i32>())
        };
        let ids = strings("id").ok_or_else(|| layout("no utf8 column \"id\"".to_string()))?;
        let doc_ids = strings("doc_id");
        let texts = strings("text");
        let embedding = batch
            .column_by_name("embedding")
            .and_then(|c| c.as_fixed_size_list_opt())
            .ok_or_else(|| layout("no fixed-size-list column \"embedding\"".to_string()))?;
        let floats = embedding
            .values()
            .as_primitive_opt::<Float32Type>()
            .ok_or_else(|| layout("\"embedding\" does not hold float32 values".to_string()))?;
        let metadata = metadata_columns
            .iter()
            .filter_map(|(name, data_type)| {
                let column = batch.column_by_name(name)?;
                Some(
                    readable(column, data_type)
                        .map(|values| (name, data_type, values))
                        .map_err(|e| layout(format!("column {name:?}: {e}"))),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        for i in 0..batch.num_rows() {
            let start = embedding.value_offset_at(i);
            let Some(row) = floats.values().get(start..start + dimensions) else {
                return Err(layout(format!("row {i}: the embedding is cut short")));
            };
            // A NaN would rank first (`total_cmp`) with no score to show.
            if embedding.is_null(i) || ids.is_null(i) || !comparable(row) {
                passed_over += 1;
                continue;
            }
            let score = cosine(query, query_norm, row);
            let id = ids.value(i);
            if !top.admits(score, id) {
                continue;
            }
            let optional = |column: Option<&arrow::array::StringArray>| {
                column
                    .filter(|c| c.is_valid(i))
                    .map(|c| c.value(i).to_string())
            };
            top.push(Candidate {
                score,
                id: id.to_string(),
                doc_id: optional(doc_ids).unwrap_or_default(),
                text: optional(texts),
                metadata: metadata
                    .iter()
                    .map(|(name, data_type, values)| {
                        let value = arrow_value(values, i);
                        ((*name).clone(), json_value(&value, data_type))
                    })
                    .collect(),
            });
        }
    }
    Ok(passed_over)
}

/// The human form: one line per result, with a snippet of the text.
pub fn table(hits: &[Hit]) -> String {
    let mut out = String::new();
    for hit in hits {
        let snippet = hit
            .text
            .as_deref()
            .map(|t| snippet(t, 80))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:>3}  {:.4}  {}  {}\n",
            hit.rank, hit.score, hit.id, snippet
        ));
    }
    out
}

/// The start of `text` on one line, cut at `max_chars`.
pub fn snippet(text: &str, max_chars: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(score: f64, id: &str) -> Candidate {
        Candidate {
            score,
            id: id.to_string(),
            doc_id: String::new(),
            text: None,
            metadata: serde_json::Map::new(),
        }
    }

    #[test]
    fn the_heap_keeps_the_best_k_in_order_with_ties_by_id() {
        let mut top = TopK::new(3);
        for (score, id) in [(0.1, "a"), (0.9, "b"), (0.5, "c"), (0.9, "a"), (0.2, "d")] {
            if top.admits(score, id) {
                top.push(candidate(score, id));
            }
        }
        let hits = top.into_hits();
        let ranked: Vec<(&str, usize)> = hits.iter().map(|h| (h.id.as_str(), h.rank)).collect();
        assert_eq!(ranked, [("a", 1), ("b", 2), ("c", 3)]);
    }

    #[test]
    fn only_finite_vectors_with_a_direction_are_comparable() {
        assert!(comparable(&[0.0, -1.5]));
        for bad in [
            [f32::NAN, 1.0],
            [f32::INFINITY, 1.0],
            [f32::NEG_INFINITY, 0.0],
            [0.0, 0.0],
            [-0.0, 0.0],
        ] {
            assert!(!comparable(&bad), "{bad:?}");
            assert!(check_query(&bad, "m").is_err(), "{bad:?}");
        }
        assert!(!comparable(&[]));
    }

    #[test]
    fn cosine_is_scale_free_and_zero_for_zero_vectors() {
        let q = [1.0, 0.0];
        assert!((cosine(&q, norm(&q), &[5.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!((cosine(&q, norm(&q), &[0.0, 3.0])).abs() < 1e-12);
        assert_eq!(cosine(&q, norm(&q), &[0.0, 0.0]), 0.0);
    }
}
