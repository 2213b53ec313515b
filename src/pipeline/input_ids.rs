//! A shard reads the whole input and embeds its own documents. What it read
//! is recorded with its output (`embedjob.input`: the count and an
//! order-free digest of every document id), so that `inspect` can tell
//! shards that ran on different inputs: a document renamed between their
//! runs (and so moved to another shard) would otherwise sit in two of them.

use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::job::Shard;
use crate::source::{SkippedFiles, Source, SourceError, SourceStats};
use crate::types::{Document, MetadataSchema};

/// Every document id of an input: how many, and the wrapping sum of their
/// hashes' first eight bytes, the same in whatever order they are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputIds {
    count: u64,
    sum: u64,
}

impl InputIds {
    pub fn add(&mut self, id: &str) {
        let hash = Sha256::digest(id.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&hash[..8]);
        self.count += 1;
        self.sum = self.sum.wrapping_add(u64::from_be_bytes(first));
    }

    /// As `embedjob.input` records it: `12 documents, ids 0123456789abcdef`.
    pub fn text(&self) -> String {
        format!("{} documents, ids {:016x}", self.count, self.sum)
    }
}

/// The whole input, of which only `shard`'s documents are returned; every
/// id read is counted into the shared [`InputIds`].
pub struct ShardOfInput {
    inner: Box<dyn Source>,
    shard: Shard,
    returned: u64,
    ids: Arc<Mutex<InputIds>>,
}

impl ShardOfInput {
    pub fn new(inner: Box<dyn Source>, shard: Shard) -> (ShardOfInput, Arc<Mutex<InputIds>>) {
        let ids = Arc::new(Mutex::new(InputIds::default()));
        let source = ShardOfInput {
            inner,
            shard,
            returned: 0,
            ids: Arc::clone(&ids),
        };
        (source, ids)
    }
}

impl Source for ShardOfInput {
    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        while let Some(document) = self.inner.next_document()? {
            if let Ok(mut ids) = self.ids.lock() {
                ids.add(&document.doc_id);
            }
            if self.shard.holds(&document.doc_id) {
                self.returned += 1;
                return Ok(Some(document));
            }
        }
        Ok(None)
    }

    /// The documents returned (the shard's own); the rows passed over are the whole input's.
    fn stats(&self) -> SourceStats {
        SourceStats {
            documents: self.returned,
            ..self.inner.stats()
        }
    }

    fn last_row(&self) -> Option<u64> {
        self.inner.last_row()
    }

    fn skipped_files(&self) -> SkippedFiles {
        self.inner.skipped_files()
    }

    fn metadata_schema(&self) -> Option<Arc<MetadataSchema>> {
        self.inner.metadata_schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ids: &[&str]) -> InputIds {
        let mut all = InputIds::default();
        ids.iter().for_each(|id| all.add(id));
        all
    }

    #[test]
    fn the_same_ids_in_any_order_agree_and_a_renamed_one_does_not() {
        assert_eq!(of(&["a", "b", "c"]), of(&["c", "a", "b"]));
        assert_ne!(of(&["a", "b", "c"]), of(&["a", "b", "d"]));
        assert_ne!(of(&["a", "b"]), of(&["a", "b", "c"]));
        assert_eq!(of(&[]).text(), "0 documents, ids 0000000000000000");
    }
}
