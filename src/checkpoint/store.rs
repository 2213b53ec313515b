//! Vectors already paid for, found by the content hash of their chunk.
//!
//! A [`Store`] indexes Parquet files in the output's layout (the previous
//! output and checkpoint parts) by `content_hash`, keeping 24 bytes or so per
//! row in memory and none of the vectors: [`Store::fetch`] reads the rows it
//! is asked for, checking that each still holds the hash it was indexed by.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::PageIndexPolicy;

use super::{CheckpointError, Earlier};
use crate::client::Usage;

/// Where a stored vector came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The output of the last finished run.
    Previous,
    /// A part committed by an earlier, unfinished run.
    Checkpoint,
}

/// A row of one of the store's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    file: u32,
    row: u32,
}

struct StoredFile {
    path: PathBuf,
    origin: Origin,
    rows: usize,
    /// The footer, kept for the files read most (see [`Store::fetch`]).
    metadata: Option<ArrowReaderMetadata>,
}

/// Footers kept at once; parts are small and re-read cheaply.
const CACHED_FOOTERS: usize = 16;
/// Rows decoded at a time when indexing a file.
const INDEX_BATCH_ROWS: usize = 8192;

/// An index of stored vectors by content hash.
#[derive(Default)]
pub struct Store {
    files: Vec<StoredFile>,
    index: HashMap<u128, Location>,
    dimensions: Option<usize>,
    earlier: Earlier,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("files", &self.files.len())
            .field("vectors", &self.index.len())
            .field("dimensions", &self.dimensions)
            .finish_non_exhaustive()
    }
}

/// The index key of a content hash: its first 128 bits. [`Store::fetch`]
/// compares all 256 before a vector is used.
pub fn hash_key(hash: &[u8; 32]) -> u128 {
    let mut first = [0u8; 16];
    first.copy_from_slice(&hash[..16]);
    u128::from_be_bytes(first)
}

/// A compact, in-process hash of a chunk id.
pub fn id_key(id: &str) -> u64 {
    crate::source::id_hash(id)
}

impl Store {
    pub fn new() -> Store {
        Store::default()
    }

    /// Vectors indexed.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The length of every stored vector, once a file is added.
    pub fn dimensions(&self) -> Option<usize> {
        self.dimensions
    }

    /// Usage and requests recorded in the checkpoint parts added.
    pub fn earlier(&self) -> Earlier {
        self.earlier
    }

    /// Indexes the vectors of `path`. A hash already indexed keeps its first
    /// location. With `ids`, the key ([`id_key`]) of every row's id is added
    /// to it.
    pub fn add(
        &mut self,
        path: &Path,
        origin: Origin,
        ids: Option<&mut HashSet<u64>>,
    ) -> Result<(), CheckpointError> {
        let corrupt = |message: String| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            message,
        };
        let file_index = u32::try_from(self.files.len())
            .map_err(|_| corrupt("too many files in the store".into()))?;
        let metadata = load_metadata(path)?;
        let dimensions = embedding_dimensions(&metadata).map_err(corrupt)?;
        match self.dimensions {
            Some(d) if d != dimensions => {
                return Err(corrupt(format!(
                    "holds {dimensions}-dimensional vectors where the rest hold {d}"
                )))
            }
            _ => self.dimensions = Some(dimensions),
        }
        let key_values = crate::sink::key_values(metadata.metadata());
        if let Some(declared) = key_values.get("embedjob.dimensions") {
            if declared.parse::<usize>().ok() != Some(dimensions) {
                return Err(corrupt(format!(
                    "embedjob.dimensions says {declared}, the vectors have {dimensions}"
                )));
            }
        }
        if origin == Origin::Checkpoint {
            let number = |key: &str| {
                key_values
                    .get(key)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            self.earlier.parts += 1;
            self.earlier.usage += Usage {
                prompt_tokens: number("embedjob.usage.prompt_tokens"),
                total_tokens: number("embedjob.usage.total_tokens"),
            };
            self.earlier.requests += number("embedjob.requests");
        }

        let file = open(path)?;
        let schema = metadata.parquet_schema();
        let mut columns = vec![column(&metadata, "content_hash").map_err(corrupt)?];
        if ids.is_some() {
            columns.push(column(&metadata, "id").map_err(corrupt)?);
        }
        let mask = ProjectionMask::roots(schema, columns);
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata.clone())
            .with_projection(mask)
            .with_batch_size(INDEX_BATCH_ROWS)
            .build()
            .map_err(|e| corrupt(e.to_string()))?;
        let mut ids = ids;
        let mut row: u32 = 0;
        loop {
            let batch = match guard(path, || reader.next())? {
                None => break,
                Some(batch) => batch.map_err(|e| corrupt(e.to_string()))?,
            };
            let hashes = string_column(&batch, "content_hash").map_err(corrupt)?;
            let id_column = match ids {
                Some(_) => Some(string_column(&batch, "id").map_err(corrupt)?),
                None => None,
            };
            for i in 0..batch.num_rows() {
                let hash = parse_hash(hashes.value(i)).ok_or_else(|| {
                    corrupt(format!("row {}: content_hash is not a SHA-256", row + 1))
                })?;
                self.index.entry(hash_key(&hash)).or_insert(Location {
                    file: file_index,
                    row,
                });
                if let (Some(ids), Some(column)) = (ids.as_deref_mut(), id_column) {
                    ids.insert(id_key(column.value(i)));
                }
                row = row
                    .checked_add(1)
                    .ok_or_else(|| corrupt("more rows than a store file may hold".into()))?;
            }
        }
        if origin == Origin::Checkpoint {
            self.earlier.rows += u64::from(row);
        }
        self.files.push(StoredFile {
            path: path.to_path_buf(),
            origin,
            rows: row as usize,
            metadata: None,
        });
        Ok(())
    }

    /// Where the vector of a chunk with this content hash is stored.
    pub fn locate(&self, hash: &[u8; 32]) -> Option<(Location, Origin)> {
        self.index
            .get(&hash_key(hash))
            .map(|&location| (location, self.files[location.file as usize].origin))
    }

    /// The vectors at `wanted`, in order and flat, each checked to be stored
    /// under the full hash given with it.
    pub fn fetch(&mut self, wanted: &[(Location, [u8; 32])]) -> Result<Vec<f32>, CheckpointError> {
        let Some(dimensions) = self.dimensions else {
            return if wanted.is_empty() {
                Ok(Vec::new())
            } else {
                Err(CheckpointError::Corrupt {
                    path: PathBuf::new(),
                    message: "the store holds no files".into(),
                })
            };
        };
        let mut values = vec![0f32; wanted.len() * dimensions];
        let mut order: Vec<usize> = (0..wanted.len()).collect();
        order.sort_by_key(|&i| (wanted[i].0.file, wanted[i].0.row));
        for group in order.chunk_by(|&a, &b| wanted[a].0.file == wanted[b].0.file) {
            let file_index = wanted[group[0]].0.file as usize;
            self.fetch_from(file_index, group, wanted, dimensions, &mut values)?;
        }
        Ok(values)
    }

    /// Reads the rows of one file that `group` (indices into `wanted`, sorted
    /// by row) asks for, and copies each vector to its place in `values`.
    fn fetch_from(
        &mut self,
        file_index: usize,
        group: &[usize],
        wanted: &[(Location, [u8; 32])],
        dimensions: usize,
        values: &mut [f32],
    ) -> Result<(), CheckpointError> {
        let path = self.files[file_index].path.clone();
        let corrupt = |message: String| CheckpointError::Corrupt {
            path: path.clone(),
            message,
        };
        let metadata = match &self.files[file_index].metadata {
            Some(metadata) => metadata.clone(),
            None => {
                let metadata = load_metadata(&path)?;
                if self.files.iter().filter(|f| f.metadata.is_some()).count() >= CACHED_FOOTERS {
                    for f in &mut self.files {
                        f.metadata = None;
                    }
                }
                self.files[file_index].metadata = Some(metadata.clone());
                metadata
            }
        };
        let rows: Vec<usize> = {
            let mut rows: Vec<usize> = group.iter().map(|&i| wanted[i].0.row as usize).collect();
            rows.dedup();
            rows
        };
        let total = self.files[file_index].rows;
        if rows.last().is_some_and(|&r| r >= total) {
            return Err(corrupt(format!("has {total} rows, fewer than indexed")));
        }
        // Only the row groups holding wanted rows are read, and within them
        // only the pages holding wanted rows (by the offset index).
        let mut groups = Vec::new();
        let mut ranges = Vec::with_capacity(rows.len());
        let (mut group_start, mut read_rows) = (0usize, 0usize);
        let mut wanted_rows = rows.iter().peekable();
        for (index, row_group) in metadata.metadata().row_groups().iter().enumerate() {
            let group_rows = usize::try_from(row_group.num_rows()).unwrap_or(0);
            let group_end = group_start + group_rows;
            let mut touched = false;
            while let Some(&&row) = wanted_rows.peek() {
                if row >= group_end {
                    break;
                }
                let at = read_rows + (row - group_start);
                ranges.push(at..at + 1);
                touched = true;
                wanted_rows.next();
            }
            if touched {
                groups.push(index);
                read_rows += group_rows;
            }
            group_start = group_end;
        }
        let selection = RowSelection::from_consecutive_ranges(ranges.into_iter(), read_rows);
        let mask = ProjectionMask::roots(
            metadata.parquet_schema(),
            [
                column(&metadata, "content_hash").map_err(corrupt)?,
                column(&metadata, "embedding").map_err(corrupt)?,
            ],
        );
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(open(&path)?, metadata)
            .with_projection(mask)
            .with_row_groups(groups)
            .with_row_selection(selection)
            .with_batch_size(rows.len().clamp(1, 4096))
            .build()
            .map_err(|e| corrupt(e.to_string()))?;
        // The k-th row read is rows[k]; `group` lists the wanted entries in the same row order.
        let mut pending = group.iter().peekable();
        let mut k = 0usize;
        while let Some(batch) = guard(&path, || reader.next())? {
            let batch = batch.map_err(|e| corrupt(e.to_string()))?;
            let hashes = string_column(&batch, "content_hash").map_err(corrupt)?;
            let embedding = batch
                .column_by_name("embedding")
                .and_then(|c| c.as_fixed_size_list_opt())
                .ok_or_else(|| corrupt("no fixed-size-list column \"embedding\"".into()))?;
            let floats = embedding
                .values()
                .as_primitive_opt::<Float32Type>()
                .ok_or_else(|| corrupt("\"embedding\" does not hold float32 values".into()))?;
            for i in 0..batch.num_rows() {
                let Some(&row) = rows.get(k) else {
                    return Err(corrupt("returned more rows than selected".into()));
                };
                if embedding.is_null(i) {
                    return Err(corrupt(format!("row {}: the embedding is null", row + 1)));
                }
                let stored = parse_hash(hashes.value(i));
                let start = embedding.value_offset_at(i);
                let vector = &floats.values()[start..start + dimensions];
                while let Some(&&entry) = pending.peek() {
                    if wanted[entry].0.row as usize != row {
                        break;
                    }
                    if stored.as_ref() != Some(&wanted[entry].1) {
                        return Err(corrupt(format!(
                            "row {}: holds another chunk's vector than the index says",
                            row + 1
                        )));
                    }
                    values[entry * dimensions..(entry + 1) * dimensions].copy_from_slice(vector);
                    pending.next();
                }
                k += 1;
            }
        }
        if k != rows.len() {
            return Err(corrupt(format!(
                "returned {k} of the {} rows selected",
                rows.len()
            )));
        }
        Ok(())
    }
}

fn open(path: &Path) -> Result<File, CheckpointError> {
    File::open(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        action: "cannot open",
        source,
    })
}

fn load_metadata(path: &Path) -> Result<ArrowReaderMetadata, CheckpointError> {
    let file = open(path)?;
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    guard(path, || ArrowReaderMetadata::load(&file, options))?.map_err(|e| {
        CheckpointError::Corrupt {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    })
}

fn column(metadata: &ArrowReaderMetadata, name: &str) -> Result<usize, String> {
    metadata
        .schema()
        .index_of(name)
        .map_err(|_| format!("no column {name:?}"))
}

fn embedding_dimensions(metadata: &ArrowReaderMetadata) -> Result<usize, String> {
    let schema = metadata.schema();
    let field = schema
        .field_with_name("embedding")
        .map_err(|_| "no column \"embedding\"".to_string())?;
    match field.data_type() {
        DataType::FixedSizeList(item, size)
            if item.data_type() == &DataType::Float32 && *size > 0 =>
        {
            usize::try_from(*size).map_err(|e| e.to_string())
        }
        other => Err(format!(
            "\"embedding\" is {other}, not a fixed-size list of float32"
        )),
    }
}

fn string_column<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> Result<&'a arrow::array::StringArray, String> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name:?}"))?;
    if column.null_count() > 0 {
        return Err(format!("column {name:?} holds nulls"));
    }
    column
        .as_string_opt::<i32>()
        .ok_or_else(|| format!("column {name:?} is not utf8"))
}

fn parse_hash(hex_text: &str) -> Option<[u8; 32]> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut hash).ok()?;
    Some(hash)
}

/// Runs a step of the Parquet decoder, turning a panic on a damaged file into
/// an error that names it.
fn guard<T>(path: &Path, step: impl FnOnce() -> T) -> Result<T, CheckpointError> {
    crate::source::catch_decoder_panic(step).map_err(|message| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::chunk::{content_hash, Chunk};
    use crate::sink::{EmbeddedBatch, OutputMetadata, ParquetSink, Sink};
    use crate::validate::Vectors;

    fn chunk(i: u32, text: &str) -> Chunk {
        Chunk {
            id: format!("d#{i}"),
            doc_id: Arc::from("d"),
            source: Arc::from("d.txt"),
            chunk_index: i,
            byte_start: 0,
            byte_end: text.len() as u64,
            text: text.to_string(),
            content_hash: content_hash(text),
            token_count: 1,
        }
    }

    /// Writes `texts` with vectors `[i, i + 0.5]`, in row groups of `group_rows` rows.
    fn write(path: &Path, texts: &[&str], group_rows: u64) {
        let mut sink = ParquetSink::create(path, 2, false, group_rows * 100).unwrap();
        for (i, text) in texts.iter().enumerate() {
            let v = i as f32;
            sink.write(&EmbeddedBatch {
                chunks: vec![chunk(i as u32, text)],
                vectors: Vectors {
                    dimensions: 2,
                    values: vec![v, v + 0.5],
                    usage: Usage::default(),
                },
            })
            .unwrap();
        }
        let metadata = OutputMetadata {
            model: "m".into(),
            dimensions: 2,
            backend: "api".into(),
            ..OutputMetadata::default()
        };
        Box::new(sink).finish(&metadata).unwrap();
    }

    #[test]
    fn vectors_are_found_by_content_and_fetched_in_the_order_asked() {
        let dir = tempfile::tempdir().unwrap();
        let texts: Vec<String> = (0..300).map(|i| format!("text {i}")).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let a = dir.path().join("a.parquet");
        let b = dir.path().join("b.parquet");
        write(&a, &refs[..200], 64);
        write(&b, &["other", "text 5"], 64);

        let mut store = Store::new();
        let mut ids = HashSet::new();
        store.add(&a, Origin::Previous, Some(&mut ids)).unwrap();
        store.add(&b, Origin::Checkpoint, None).unwrap();
        assert_eq!(store.dimensions(), Some(2));
        assert_eq!(
            store.len(),
            201,
            "text 5 is indexed once, at its first place"
        );
        assert!(ids.contains(&id_key("d#199")) && !ids.contains(&id_key("d#200")));
        assert_eq!(store.earlier().parts, 1);
        assert_eq!(store.earlier().rows, 2);

        assert!(store.locate(&content_hash("text 250")).is_none());
        let (loc5, origin5) = store.locate(&content_hash("text 5")).unwrap();
        assert_eq!(origin5, Origin::Previous);
        let (other, origin) = store.locate(&content_hash("other")).unwrap();
        assert_eq!(origin, Origin::Checkpoint);

        let asks = ["text 190", "text 3", "text 70", "text 3", "text 71"];
        let mut wanted: Vec<(Location, [u8; 32])> = asks
            .iter()
            .map(|t| (store.locate(&content_hash(t)).unwrap().0, content_hash(t)))
            .collect();
        wanted.push((other, content_hash("other")));
        wanted.push((loc5, content_hash("text 5")));
        let values = store.fetch(&wanted).unwrap();
        assert_eq!(
            values,
            [190.0, 190.5, 3.0, 3.5, 70.0, 70.5, 3.0, 3.5, 71.0, 71.5, 0.0, 0.5, 5.0, 5.5]
        );
    }

    #[test]
    fn a_vector_stored_under_another_hash_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.parquet");
        write(&a, &["one", "two"], 64);
        let mut store = Store::new();
        store.add(&a, Origin::Previous, None).unwrap();
        let (loc, _) = store.locate(&content_hash("one")).unwrap();
        let err = store.fetch(&[(loc, content_hash("two"))]).unwrap_err();
        assert!(err.to_string().contains("another chunk's vector"), "{err}");
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.parquet");
        write(&a, &["one", "two"], 64);
        let bytes = std::fs::read(&a).unwrap();
        std::fs::write(&a, &bytes[..bytes.len() / 2]).unwrap();
        let err = Store::new().add(&a, Origin::Previous, None).unwrap_err();
        assert!(err.to_string().contains("a.parquet"), "{err}");
    }
}
