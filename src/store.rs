//! Vectors already paid for, found by the content hash of their chunk.
//!
//! A [`Store`] indexes [`StoredRows`] (the rows a sink already holds, and
//! the parts a checkpoint committed) by `content_hash`, keeping about 24
//! bytes a row in memory and none of the vectors: [`Store::fetch`] reads the
//! rows it is asked for, checking that each still holds the hash it was
//! indexed by. A Parquet file is one kind of stored rows
//! ([`crate::parquet_io::ParquetRows`]); a sink that keeps its rows
//! elsewhere offers them through the same trait.

use std::collections::{BTreeMap, HashMap};

use crate::types::Usage;

/// Rows of chunks with their vectors, kept somewhere a run can read them
/// back: the answer to "which content hashes do you already hold?".
pub trait StoredRows: Send {
    /// The file or table, for messages.
    fn name(&self) -> String;
    /// The length of every vector held.
    fn dimensions(&self) -> usize;
    /// What the rows' writer recorded (`embedjob.*` keys).
    fn metadata(&self) -> &BTreeMap<String, String>;
    /// Calls `visit` with each row's content hash, and its id when
    /// `with_ids`, in row order.
    fn scan(&mut self, with_ids: bool, visit: &mut dyn FnMut(Row<'_>)) -> Result<(), StoreError>;
    /// Reads `rows` (ascending, distinct) and calls `found` with each one's
    /// position in `rows`, content hash and vector.
    fn read(&mut self, rows: &[usize], found: &mut ReadRow<'_>) -> Result<(), StoreError>;
    /// Lets go of what was kept to read faster (a footer, a connection).
    fn release(&mut self) {}
    /// Checks that the rows are still what was written, where a checksum
    /// was recorded with them; the error says why not. Rows kept where they
    /// cannot be damaged unnoticed (a database) need no check.
    fn verify(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Called by [`StoredRows::read`] with each row's position in the rows
/// asked for, its content hash and its vector.
pub type ReadRow<'a> = dyn FnMut(usize, &[u8; 32], &[f32]) + 'a;

/// One row as [`StoredRows::scan`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub content_hash: [u8; 32],
    pub id: Option<&'a str>,
}

/// Stored rows that cannot be read, or that do not hold what they claim.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{name}: not a readable checkpoint or output: {message}")]
    Corrupt { name: String, message: String },
    /// The file or table behind the rows failed to read.
    #[error(transparent)]
    Unreadable(Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    pub fn corrupt(name: impl Into<String>, message: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            name: name.into(),
            message: message.into(),
        }
    }
}

/// Where a stored vector came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// What the sink held from the last finished run.
    Previous,
    /// A part committed by an earlier, unfinished run.
    Checkpoint,
}

/// A row of one of the store's sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    source: u32,
    row: u32,
}

/// Usage and requests recorded in parts committed by earlier attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Earlier {
    pub parts: u64,
    pub rows: u64,
    pub usage: Usage,
    pub requests: u64,
    /// Of `usage`, the prompt tokens that paid for discarded vectors.
    pub discarded_tokens: u64,
    /// The local token count of the chunks the parts hold.
    pub local_tokens: u64,
    /// Of `usage`, the prompt tokens of parts whose rows came from a batch
    /// of the Batch API (billed at the batch price; the rest were billed
    /// for synchronous requests).
    pub batch_tokens: u64,
}

struct Source {
    rows: Box<dyn StoredRows>,
    origin: Origin,
    len: usize,
    /// Whether `rows` keeps something to read faster (see [`CACHED_SOURCES`]).
    warm: bool,
}

/// Sources kept warm at once; parts are small and re-opened cheaply.
const CACHED_SOURCES: usize = 16;

/// An index of stored vectors by content hash.
#[derive(Default)]
pub struct Store {
    sources: Vec<Source>,
    index: HashMap<u128, Location>,
    dimensions: Option<usize>,
    earlier: Earlier,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("sources", &self.sources.len())
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

/// The ids of the rows a sink held, each with the first 64 bits of its
/// content hash: 16 bytes a row, enough to tell an unchanged chunk from a
/// changed one and to count removed ones.
pub type HeldIds = HashMap<u64, u64>;

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

    /// The length of every stored vector, once a source is added.
    pub fn dimensions(&self) -> Option<usize> {
        self.dimensions
    }

    /// Usage and requests recorded in the checkpoint parts added.
    pub fn earlier(&self) -> Earlier {
        self.earlier
    }

    /// Indexes the vectors of `rows`. A hash already indexed keeps its first
    /// location. With `ids`, every row's id key ([`crate::types::id_key`])
    /// is added to it with the key of its hash.
    pub fn add(
        &mut self,
        mut rows: Box<dyn StoredRows>,
        origin: Origin,
        ids: Option<&mut HeldIds>,
    ) -> Result<(), StoreError> {
        let name = rows.name();
        let corrupt = |message: String| StoreError::corrupt(name.clone(), message);
        let source = u32::try_from(self.sources.len())
            .map_err(|_| corrupt("too many files in the store".into()))?;
        let dimensions = rows.dimensions();
        if let Some(d) = self.dimensions.filter(|&d| d != dimensions) {
            return Err(corrupt(format!(
                "holds {dimensions}-dimensional vectors where the rest hold {d}"
            )));
        }
        if let Some(declared) = rows.metadata().get(crate::contract::DIMENSIONS_KEY) {
            if declared.parse::<usize>().ok() != Some(dimensions) {
                return Err(corrupt(format!(
                    "{} says {declared}, the vectors have {dimensions}",
                    crate::contract::DIMENSIONS_KEY
                )));
            }
        }
        let mut count: u64 = 0;
        let mut ids = ids;
        let with_ids = ids.is_some();
        let index = &mut self.index;
        let scanned = rows.scan(with_ids, &mut |row| {
            if let Ok(at) = u32::try_from(count) {
                index
                    .entry(hash_key(&row.content_hash))
                    .or_insert(Location { source, row: at });
            }
            if let (Some(ids), Some(id)) = (ids.as_deref_mut(), row.id) {
                ids.insert(crate::types::id_key(id), hash_prefix(&row.content_hash));
            }
            count += 1;
        });
        let scanned = scanned.and_then(|()| {
            u32::try_from(count)
                .map(drop)
                .map_err(|_| corrupt("more rows than a store file may hold".into()))
        });
        if let Err(e) = scanned {
            // Rows of a source that is not added must not be found.
            self.index.retain(|_, location| location.source != source);
            return Err(e);
        }
        self.dimensions = Some(dimensions);
        if origin == Origin::Checkpoint {
            self.count_earlier(rows.metadata());
            self.earlier.rows += count;
        }
        self.sources.push(Source {
            rows,
            origin,
            len: usize::try_from(count).unwrap_or(usize::MAX),
            warm: false,
        });
        Ok(())
    }

    fn count_earlier(&mut self, metadata: &BTreeMap<String, String>) {
        let number = |key: &str| {
            metadata
                .get(key)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        self.earlier.parts += 1;
        let prompt_tokens = number(crate::contract::PROMPT_TOKENS_KEY);
        self.earlier.usage += Usage {
            prompt_tokens,
            completion_tokens: 0,
            total_tokens: number(crate::contract::TOTAL_TOKENS_KEY),
        };
        if metadata.contains_key(crate::contract::BATCH_ID_KEY) {
            self.earlier.batch_tokens = self.earlier.batch_tokens.saturating_add(prompt_tokens);
        }
        self.earlier.requests = self
            .earlier
            .requests
            .saturating_add(number(crate::contract::REQUESTS_KEY));
        self.earlier.discarded_tokens = self
            .earlier
            .discarded_tokens
            .saturating_add(number(crate::contract::DISCARDED_TOKENS_KEY));
        self.earlier.local_tokens = self
            .earlier
            .local_tokens
            .saturating_add(number(crate::contract::LOCAL_TOKENS_KEY));
    }

    /// Where the vector of a chunk with this content hash is stored.
    pub fn locate(&self, hash: &[u8; 32]) -> Option<(Location, Origin)> {
        self.index
            .get(&hash_key(hash))
            .map(|&location| (location, self.sources[location.source as usize].origin))
    }

    /// The ids of `wanted` id keys, read again from the sources of `origin`.
    pub fn ids_of(&mut self, origin: Origin, wanted: &HeldIds) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        for source in self.sources.iter_mut().filter(|s| s.origin == origin) {
            source.rows.scan(true, &mut |row| {
                if let Some(id) = row.id {
                    if wanted.contains_key(&crate::types::id_key(id)) {
                        found.push(id.to_string());
                    }
                }
            })?;
        }
        Ok(found)
    }

    /// The vectors at `wanted`, in order and flat, each checked to be stored
    /// under the full hash given with it.
    pub fn fetch(&mut self, wanted: &[(Location, [u8; 32])]) -> Result<Vec<f32>, StoreError> {
        let Some(dimensions) = self.dimensions else {
            return if wanted.is_empty() {
                Ok(Vec::new())
            } else {
                Err(StoreError::corrupt("the store", "it holds no files"))
            };
        };
        let mut values = vec![0f32; wanted.len() * dimensions];
        let mut order: Vec<usize> = (0..wanted.len()).collect();
        order.sort_by_key(|&i| (wanted[i].0.source, wanted[i].0.row));
        for group in order.chunk_by(|&a, &b| wanted[a].0.source == wanted[b].0.source) {
            let source = wanted[group[0]].0.source as usize;
            self.warm_up(source);
            self.fetch_from(source, group, wanted, dimensions, &mut values)?;
        }
        Ok(values)
    }

    /// Keeps at most [`CACHED_SOURCES`] sources warm.
    fn warm_up(&mut self, source: usize) {
        if self.sources[source].warm {
            return;
        }
        if self.sources.iter().filter(|s| s.warm).count() >= CACHED_SOURCES {
            for s in &mut self.sources {
                s.rows.release();
                s.warm = false;
            }
        }
        self.sources[source].warm = true;
    }

    /// Reads the rows of one source that `group` (indices into `wanted`,
    /// sorted by row) asks for, and copies each vector to its place in `values`.
    fn fetch_from(
        &mut self,
        source: usize,
        group: &[usize],
        wanted: &[(Location, [u8; 32])],
        dimensions: usize,
        values: &mut [f32],
    ) -> Result<(), StoreError> {
        let Source {
            rows: stored, len, ..
        } = &mut self.sources[source];
        let name = stored.name();
        let mut rows: Vec<usize> = group.iter().map(|&i| wanted[i].0.row as usize).collect();
        rows.dedup();
        if rows.last().is_some_and(|r| r >= len) {
            return Err(StoreError::corrupt(
                name,
                format!("has {len} rows, fewer than indexed"),
            ));
        }
        // The k-th row read is rows[k]; `group` lists the wanted entries in the same row order.
        let mut pending = group.iter().peekable();
        let mut problem = None;
        let mut seen = 0usize;
        stored.read(&rows, &mut |k, hash, vector| {
            seen = seen.max(k + 1);
            if problem.is_some() {
                return;
            }
            if vector.len() != dimensions {
                problem = Some(format!(
                    "row {}: a vector of {} values",
                    rows[k] + 1,
                    vector.len()
                ));
                return;
            }
            while let Some(&&entry) = pending.peek() {
                if wanted[entry].0.row as usize != rows[k] {
                    break;
                }
                if hash != &wanted[entry].1 {
                    problem = Some(format!(
                        "row {}: holds another chunk's vector than the index says",
                        rows[k] + 1
                    ));
                    return;
                }
                values[entry * dimensions..(entry + 1) * dimensions].copy_from_slice(vector);
                pending.next();
            }
        })?;
        if let Some(message) = problem {
            return Err(StoreError::corrupt(name, message));
        }
        if seen != rows.len() || pending.peek().is_some() {
            return Err(StoreError::corrupt(
                name,
                format!("returned {seen} of the {} rows selected", rows.len()),
            ));
        }
        Ok(())
    }
}

/// The first 64 bits of a content hash.
pub fn hash_prefix(hash: &[u8; 32]) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::path::Path;

    use super::*;
    use crate::parquet_io::{Compression, FileOptions, ParquetRows, VectorFile};
    use crate::types::{content_hash, id_key, Chunk, EmbeddedBatch, OutputMetadata, Vectors};

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
            metadata: None,
        }
    }

    fn rows(path: &Path) -> Box<dyn StoredRows> {
        Box::new(ParquetRows::open(path).unwrap())
    }

    /// Writes `texts` with vectors `[i, i + 0.5]`, in row groups of `group_rows` rows.
    fn write(path: &Path, texts: &[&str], group_rows: u64) {
        let options = FileOptions {
            include_text: false,
            row_group_bytes: group_rows * 100,
            compression: Compression::Zstd,
        };
        let mut sink = VectorFile::create(path, 2, options).unwrap();
        for (i, text) in texts.iter().enumerate() {
            let v = i as f32;
            sink.write(&EmbeddedBatch {
                chunks: vec![chunk(i as u32, text)],
                vectors: Vectors {
                    dimensions: 2,
                    values: vec![v, v + 0.5],
                    usage: Usage::default(),
                    discarded: Usage::default(),
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
        sink.finish(&metadata).unwrap();
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
        let mut ids = HeldIds::new();
        store
            .add(rows(&a), Origin::Previous, Some(&mut ids))
            .unwrap();
        store.add(rows(&b), Origin::Checkpoint, None).unwrap();
        assert_eq!(store.dimensions(), Some(2));
        assert_eq!(
            store.len(),
            201,
            "text 5 is indexed once, at its first place"
        );
        assert!(ids.contains_key(&id_key("d#199")) && !ids.contains_key(&id_key("d#200")));
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
        store.add(rows(&a), Origin::Previous, None).unwrap();
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
        let err = ParquetRows::open(&a)
            .and_then(|r| Store::new().add(Box::new(r), Origin::Previous, None))
            .unwrap_err();
        assert!(err.to_string().contains("a.parquet"), "{err}");
    }
}
