//! Committing vectors as they are paid for: part files in the checkpoint.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Checkpoint, StateError};
use crate::contract::{DISCARDED_TOKENS_KEY, FINGERPRINT_KEY, LOCAL_TOKENS_KEY};
use crate::parquet_io::{Compression, FileOptions, VectorFile};
use crate::store::hash_key;
use crate::types::{EmbeddedBatch, MetadataSchema, OutputMetadata, Usage};

/// The number of a part file, `part-000042.parquet` → 42.
pub(super) fn part_number(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

struct OpenPart {
    file: VectorFile,
    usage: Usage,
    requests: u64,
    /// Of `usage`, prompt tokens that paid for discarded vectors.
    discarded_tokens: u64,
    /// Local token count of the rows.
    local_tokens: u64,
    /// Vector bytes written to the part.
    bytes: u64,
    /// Rows written to the part.
    rows: u64,
    /// The metadata columns of its rows.
    metadata: Option<Arc<MetadataSchema>>,
}

/// Billing that no vector carries: requests whose vectors were all
/// discarded, or whose answers arrived after the run gave up on them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Billed {
    pub usage: Usage,
    pub requests: u64,
    /// Of `usage.prompt_tokens`, those that paid for discarded vectors.
    pub discarded_tokens: u64,
}

/// A part is committed once it holds this many bytes of vectors, even with
/// more batches waiting: it bounds both the memory a part takes to write and
/// what a kill can lose.
const MAX_PART_BYTES: u64 = 4 << 20;

/// Writes newly embedded batches to part files in the checkpoint, each part
/// written under a temporary name, fsynced and renamed into place by
/// [`PartWriter::commit`]. The pipeline commits whenever it has no further
/// batch at hand (and a quarter of a second has passed since the last
/// commit) or the part holds a set number of rows, and sends no request
/// while more answers wait (see `pipeline::dispatch::Exposure`).
///
/// A part holds the output's columns without `text`, and records in its
/// metadata the usage and requests that paid for its vectors.
pub struct PartWriter {
    checkpoint: Checkpoint,
    next_number: u64,
    /// Vector bytes at which a part is committed (and its row group size).
    part_bytes: u64,
    template: OutputMetadata,
    open: Option<OpenPart>,
    /// The content keys of the rows in the open part.
    open_keys: HashSet<u128>,
    committed: Vec<PathBuf>,
    /// Rows in the parts this writer committed.
    committed_rows: u64,
    /// The vector length of the checkpoint's parts, once known: billing
    /// without vectors then goes into a part of no rows.
    dimensions: Option<usize>,
    /// Billing without vectors waiting for a part to carry it.
    pending: Billed,
    /// The metadata columns of the rows appended last (parts carry them
    /// too, so they read like the output).
    metadata: Option<Arc<MetadataSchema>>,
}

impl PartWriter {
    /// A writer of parts numbered after those already in `checkpoint`, for
    /// vectors of `model` from a `backend` (`api` or `local`), each part at
    /// most `row_group_bytes` (and 4 MiB) of vectors.
    pub fn new(checkpoint: Checkpoint, model: &str, backend: &str, row_group_bytes: u64) -> Self {
        let next_number = checkpoint
            .parts()
            .iter()
            .filter_map(|p| part_number(p))
            .max()
            .unwrap_or(0)
            + 1;
        let mut template = OutputMetadata {
            model: model.to_string(),
            backend: backend.to_string(),
            ..OutputMetadata::default()
        };
        template.extra.insert(
            FINGERPRINT_KEY.to_string(),
            checkpoint.fingerprint().to_json(),
        );
        PartWriter {
            checkpoint,
            next_number,
            part_bytes: row_group_bytes.clamp(1, MAX_PART_BYTES),
            template,
            open: None,
            open_keys: HashSet::new(),
            committed: Vec::new(),
            committed_rows: 0,
            dimensions: None,
            pending: Billed::default(),
            metadata: None,
        }
    }

    /// Lets billing without vectors be committed in a part of no rows, for
    /// a checkpoint whose parts hold vectors of `dimensions` values. (A
    /// checkpoint that holds no vector yet is not started for it: a run
    /// stopped by a wrong setting can then be run again with the right one.)
    #[must_use]
    pub fn with_dimensions(mut self, dimensions: Option<usize>) -> Self {
        self.dimensions = dimensions;
        self
    }

    fn open_part(&mut self, dimensions: usize) -> Result<(), StateError> {
        if self.open.is_some() {
            return Ok(());
        }
        self.checkpoint.create()?;
        let path = self
            .checkpoint
            .dir()
            .join(format!("part-{:06}.parquet", self.next_number));
        let options = FileOptions {
            include_text: false,
            row_group_bytes: self.part_bytes,
            compression: Compression::None,
        };
        let file =
            VectorFile::create_with_metadata(&path, dimensions, options, self.metadata.clone())?;
        self.next_number += 1;
        self.dimensions = Some(dimensions);
        let pending = std::mem::take(&mut self.pending);
        self.open = Some(OpenPart {
            file,
            usage: pending.usage,
            requests: pending.requests,
            discarded_tokens: pending.discarded_tokens,
            local_tokens: 0,
            bytes: 0,
            rows: 0,
            metadata: self.metadata.clone(),
        });
        Ok(())
    }

    /// Sets a key the parts committed from now on carry in their metadata
    /// (batch mode: the batch a part's rows came from).
    pub fn set_extra(&mut self, key: &str, value: String) {
        self.template.extra.insert(key.to_string(), value);
    }

    /// Records billing that no vector carries, in the next part committed.
    pub fn add_billed(&mut self, billed: Billed) -> Result<(), StateError> {
        if billed == Billed::default() {
            return Ok(());
        }
        if let Some(dimensions) = self.dimensions {
            self.open_part(dimensions)?;
        }
        match self.open.as_mut() {
            Some(part) => {
                part.usage += billed.usage;
                part.requests += billed.requests;
                part.discarded_tokens += billed.discarded_tokens;
            }
            None => {
                self.pending.usage += billed.usage;
                self.pending.requests += billed.requests;
                self.pending.discarded_tokens += billed.discarded_tokens;
            }
        }
        Ok(())
    }

    /// Adds a batch that one successful request paid for.
    pub fn append(&mut self, batch: &EmbeddedBatch) -> Result<(), StateError> {
        let metadata = batch.metadata_schema();
        if self.open.as_ref().is_some_and(|p| p.metadata != metadata) {
            // A part opened for billing alone before this run's first rows.
            self.commit()?;
        }
        self.metadata = metadata;
        self.open_part(batch.vectors.dimensions)?;
        if let Some(part) = self.open.as_mut() {
            part.file.write(batch)?;
            self.open_keys
                .extend(batch.chunks.iter().map(|c| hash_key(&c.content_hash)));
            part.usage += batch.vectors.usage;
            part.requests += 1;
            part.discarded_tokens += batch.vectors.discarded.prompt_tokens;
            part.local_tokens += batch
                .chunks
                .iter()
                .map(|c| u64::from(c.token_count))
                .sum::<u64>();
            part.bytes += 4 * batch.vectors.values.len() as u64;
            part.rows += batch.chunks.len() as u64;
            if part.bytes >= self.part_bytes {
                return self.commit();
            }
        }
        Ok(())
    }

    /// Makes everything appended so far durable.
    pub fn commit(&mut self) -> Result<(), StateError> {
        let Some(part) = self.open.take() else {
            return Ok(());
        };
        self.open_keys.clear();
        let mut metadata = self.template.clone();
        metadata.dimensions = part.file.dimensions();
        metadata.usage = part.usage;
        metadata.requests = part.requests;
        metadata.extra.insert(
            DISCARDED_TOKENS_KEY.to_string(),
            part.discarded_tokens.to_string(),
        );
        metadata
            .extra
            .insert(LOCAL_TOKENS_KEY.to_string(), part.local_tokens.to_string());
        let report = part.file.finish(&metadata)?;
        self.committed.push(report.path);
        self.committed_rows += part.rows;
        Ok(())
    }

    /// Whether the part being written, not yet committed, holds a vector
    /// for this content key ([`crate::store::hash_key`]).
    pub fn holds_uncommitted(&self, key: u128) -> bool {
        self.open_keys.contains(&key)
    }

    /// Rows appended to the part being written, not yet committed.
    pub fn open_rows(&self) -> u64 {
        self.open.as_ref().map_or(0, |p| p.rows)
    }

    /// Rows in the parts this writer committed.
    pub fn committed_rows(&self) -> u64 {
        self.committed_rows
    }

    /// Parts this writer committed.
    pub fn committed(&self) -> &[PathBuf] {
        &self.committed
    }

    /// Removes the checkpoint, once the output holds every vector in it.
    pub fn remove_checkpoint(self) -> Result<(), StateError> {
        self.checkpoint.remove()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::parquet_io::ParquetRows;
    use crate::state::{Fingerprint, StateLocation};
    use crate::store::{Origin, Store};
    use crate::types::{content_hash, Chunk, Vectors};

    #[test]
    fn part_names_are_numbered() {
        assert_eq!(part_number(Path::new("x/part-000042.parquet")), Some(42));
        assert_eq!(part_number(Path::new("x/.part-000042.parquet.tmp-9")), None);
        assert_eq!(part_number(Path::new("x/part-.parquet")), None);
        assert_eq!(part_number(Path::new("x/manifest.json")), None);
    }

    #[test]
    fn committed_parts_hold_the_vectors_and_what_they_cost() {
        let dir = tempfile::tempdir().unwrap();
        let output = StateLocation::beside(&dir.path().join("docs.parquet"));
        let fingerprint = Fingerprint::from_json(r#"{"backend.model":"m"}"#).unwrap();
        let checkpoint = Checkpoint::open("docs", &output, &fingerprint, false).unwrap();
        let mut parts = PartWriter::new(checkpoint, "m", "api", 1 << 20);
        let batch = |texts: &[&str], tokens: u64| EmbeddedBatch {
            chunks: texts
                .iter()
                .enumerate()
                .map(|(i, t)| Chunk {
                    id: format!("d#{i}"),
                    doc_id: Arc::from("d"),
                    source: Arc::from("d"),
                    chunk_index: i as u32,
                    byte_start: 0,
                    byte_end: 1,
                    text: (*t).to_string(),
                    content_hash: content_hash(t),
                    token_count: 1,
                    metadata: None,
                })
                .collect(),
            vectors: Vectors {
                dimensions: 1,
                values: (0..texts.len()).map(|i| i as f32 + 1.0).collect(),
                usage: Usage {
                    prompt_tokens: tokens,
                    completion_tokens: 0,
                    total_tokens: tokens,
                },
                discarded: Usage {
                    prompt_tokens: tokens / 5,
                    completion_tokens: 0,
                    total_tokens: tokens / 5,
                },
            },
        };
        parts.append(&batch(&["a", "b"], 5)).unwrap();
        parts.append(&batch(&["c"], 2)).unwrap();
        assert!(
            parts.committed().is_empty(),
            "small parts wait for a commit"
        );
        parts.commit().unwrap();
        parts.commit().unwrap();
        parts.append(&batch(&["d"], 1)).unwrap();
        parts.commit().unwrap();
        assert_eq!(parts.committed().len(), 2);

        let reopened = Checkpoint::open("docs", &output, &fingerprint, false).unwrap();
        assert_eq!(reopened.parts(), parts.committed());
        let mut store = Store::new();
        for part in reopened.parts() {
            let rows = ParquetRows::open(part).unwrap();
            store.add(Box::new(rows), Origin::Checkpoint, None).unwrap();
        }
        assert_eq!(store.earlier().usage.prompt_tokens, 8);
        assert_eq!(store.earlier().requests, 3);
        assert_eq!(store.earlier().rows, 4);
        assert_eq!(store.earlier().discarded_tokens, 1, "5 / 5 + 2 / 5 + 1 / 5");
        assert_eq!(store.earlier().local_tokens, 4);
        assert_eq!(store.earlier().batch_tokens, 0, "no part is a batch's");
        let (loc, _) = store.locate(&content_hash("d")).unwrap();
        assert_eq!(store.fetch(&[(loc, content_hash("d"))]).unwrap(), [1.0]);
        let mut next = PartWriter::new(reopened, "m", "api", 8).with_dimensions(Some(1));
        assert_eq!(next.next_number, 3);
        // A run that paid only for vectors it discarded still records what
        // it paid; here a batch's lines, at the batch price.
        next.set_extra(crate::contract::BATCH_ID_KEY, "batch_1".to_string());
        next.add_billed(Billed {
            usage: Usage {
                prompt_tokens: 6,
                completion_tokens: 0,
                total_tokens: 6,
            },
            requests: 2,
            discarded_tokens: 6,
        })
        .unwrap();
        next.commit().unwrap();
        let again = Checkpoint::open("docs", &output, &fingerprint, false).unwrap();
        let mut store = Store::new();
        for part in again.parts() {
            let rows = ParquetRows::open(part).unwrap();
            store.add(Box::new(rows), Origin::Checkpoint, None).unwrap();
        }
        assert_eq!(store.earlier().usage.prompt_tokens, 14);
        assert_eq!(store.earlier().requests, 5);
        assert_eq!(store.earlier().rows, 4, "a part of no rows");
        assert_eq!(store.earlier().discarded_tokens, 7);
        assert_eq!(store.earlier().batch_tokens, 6, "the batch's part");
        assert_eq!(next.next_number, 4);
        next.append(&batch(&["e", "f"], 1)).unwrap();
        assert_eq!(
            next.committed().len(),
            2,
            "a full part is committed at once"
        );
    }

    #[test]
    fn billing_before_the_first_rows_of_a_resumed_run_does_not_hold_back_metadata_columns() {
        use crate::types::{MetaValue, Metadata, MetadataField, MetadataSchema};
        let dir = tempfile::tempdir().unwrap();
        let output = StateLocation::beside(&dir.path().join("docs.parquet"));
        let fingerprint = Fingerprint::from_json(r#"{"backend.model":"m"}"#).unwrap();
        let checkpoint = Checkpoint::open("docs", &output, &fingerprint, false).unwrap();
        // A resumed run: the parts' vector length is known before any row.
        let mut parts = PartWriter::new(checkpoint, "m", "api", 1 << 20).with_dimensions(Some(1));
        parts
            .add_billed(Billed {
                usage: Usage {
                    prompt_tokens: 3,
                    completion_tokens: 0,
                    total_tokens: 3,
                },
                requests: 1,
                discarded_tokens: 3,
            })
            .unwrap();
        let schema = Arc::new(MetadataSchema {
            fields: vec![MetadataField {
                field: "lang".to_string(),
                column: "lang".to_string(),
                data_type: arrow::datatypes::DataType::Utf8,
            }],
        });
        let batch = EmbeddedBatch {
            chunks: vec![Chunk {
                id: "d#0".to_string(),
                doc_id: Arc::from("d"),
                source: Arc::from("d"),
                chunk_index: 0,
                byte_start: 0,
                byte_end: 1,
                text: "a".to_string(),
                content_hash: content_hash("a"),
                token_count: 1,
                metadata: Some(Arc::new(Metadata {
                    schema,
                    values: vec![MetaValue::Text("en".into())].into_boxed_slice(),
                })),
            }],
            vectors: Vectors {
                dimensions: 1,
                values: vec![0.5],
                usage: Usage {
                    prompt_tokens: 1,
                    completion_tokens: 0,
                    total_tokens: 1,
                },
                discarded: Usage::default(),
            },
        };
        parts.append(&batch).unwrap();
        parts.commit().unwrap();
        assert_eq!(
            parts.committed().len(),
            2,
            "the billing alone, then the rows"
        );
        let file = std::fs::File::open(&parts.committed()[1]).unwrap();
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        assert!(reader.schema().field_with_name("lang").is_ok());
        let reopened = Checkpoint::open("docs", &output, &fingerprint, false).unwrap();
        let mut store = Store::new();
        for part in reopened.parts() {
            let rows = ParquetRows::open(part).unwrap();
            store.add(Box::new(rows), Origin::Checkpoint, None).unwrap();
        }
        assert_eq!(store.earlier().usage.prompt_tokens, 4);
        assert_eq!(store.earlier().rows, 1);
    }
}
