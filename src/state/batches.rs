//! Batch mode's record in the checkpoint (`batches.json`): every request
//! file the job prepared, and what the service made of it. A part's number
//! and request file are recorded before the upload, its file id right after
//! the upload, its batch id right after the batch is created, so that a run
//! killed at any point finds, on the next run, what it may have paid for.
//!
//! Beside each request file, an index (`requests-NNNNNN.index.jsonl`): one
//! line per request, its `custom_id` and its chunks' content hashes and
//! token counts, from which collection rebuilds what a line answers without
//! reading the request file back.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StateError;
use crate::fsio::{self, FsError};
use crate::store::hash_key;

const RECORD: &str = "batches.json";
const RECORD_VERSION: u32 = 1;

/// Where a part stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartState {
    /// Its request file is written; not uploaded yet.
    Prepared,
    /// Uploaded (`file_id`), no batch known yet.
    Uploaded,
    /// A batch was created for it (`batch_id`).
    Submitted,
    /// Its answers are in the checkpoint's parts.
    Collected,
}

/// One request file and its batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchPart {
    pub number: u64,
    pub lines: u64,
    pub inputs: u64,
    pub tokens: u64,
    /// When it was prepared (Unix seconds): the listing is read back to here.
    pub prepared_at: u64,
    pub file_id: Option<String>,
    pub batch_id: Option<String>,
    pub state: PartState,
    pub expires_at: Option<u64>,
    /// The batch's status when last seen.
    pub status: Option<String>,
}

impl BatchPart {
    /// Whether its chunks may still be answered: not collected.
    pub fn is_live(&self) -> bool {
        self.state != PartState::Collected
    }
}

/// A chunk of a request line: its content hash and local token count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexedChunk(pub String, pub u32);

/// One line of a request file's index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexLine {
    pub custom_id: String,
    pub chunks: Vec<IndexedChunk>,
}

/// The job's batches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    pub version: u32,
    pub parts: Vec<BatchPart>,
    /// The most tokens the service let the job enqueue, learned from a
    /// `token_limit_exceeded` failure.
    pub learned_cap: Option<u64>,
    /// Content hashes of texts to send alone: their line, of several, was
    /// refused as bad input.
    #[serde(default)]
    pub alone: BTreeSet<String>,
    /// Content hashes of texts refused as bad input when sent alone, with
    /// the service's reason: quarantined as the synchronous path does.
    #[serde(default)]
    pub refused: BTreeMap<String, String>,
}

impl BatchRecord {
    /// The record in checkpoint directory `dir`, or an empty one.
    pub fn load(dir: &Path) -> Result<BatchRecord, StateError> {
        let path = dir.join(RECORD);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let record: BatchRecord =
                    serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                if record.version != RECORD_VERSION {
                    return Err(StateError::Corrupt {
                        path,
                        message: format!("batch record version {} is not known", record.version),
                    });
                }
                Ok(record)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BatchRecord {
                version: RECORD_VERSION,
                ..BatchRecord::default()
            }),
            Err(source) => Err(FsError::Io {
                path,
                action: "cannot read",
                source,
            }
            .into()),
        }
    }

    /// Writes the record, whole or not at all.
    pub fn save(&self, dir: &Path) -> Result<(), StateError> {
        let value = serde_json::to_value(self).map_err(|e| StateError::Corrupt {
            path: dir.join(RECORD),
            message: e.to_string(),
        })?;
        Ok(fsio::write_json_atomically(&dir.join(RECORD), &value)?)
    }

    /// The number the next part takes.
    pub fn next_number(&self) -> u64 {
        self.parts.iter().map(|p| p.number).max().unwrap_or(0) + 1
    }

    pub fn part_mut(&mut self, number: u64) -> Option<&mut BatchPart> {
        self.parts.iter_mut().find(|p| p.number == number)
    }

    /// Parts not collected.
    pub fn live(&self) -> impl Iterator<Item = &BatchPart> {
        self.parts.iter().filter(|p| p.is_live())
    }

    /// Tokens in batches the service may be holding.
    pub fn enqueued_tokens(&self) -> u64 {
        self.parts
            .iter()
            .filter(|p| matches!(p.state, PartState::Uploaded | PartState::Submitted))
            .map(|p| p.tokens)
            .sum()
    }

    /// The content keys ([`hash_key`]) of the chunks in live parts: not to be
    /// sent again while their batch may still answer them.
    pub fn pending_keys(&self, dir: &Path) -> Result<HashSet<u128>, StateError> {
        let mut keys = HashSet::new();
        for part in self.live() {
            for line in read_index(&index_path(dir, part.number))? {
                for chunk in line.chunks {
                    if let Some(hash) = parse_hash(&chunk.0) {
                        keys.insert(hash_key(&hash));
                    }
                }
            }
        }
        Ok(keys)
    }
}

/// The request file of part `number`.
pub fn requests_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("requests-{number:06}.jsonl"))
}

/// The index of part `number`'s request file.
pub fn index_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("requests-{number:06}.index.jsonl"))
}

/// A part's index, by line.
pub fn read_index(path: &Path) -> Result<Vec<IndexLine>, StateError> {
    let file = std::fs::File::open(path).map_err(FsError::io(path, "cannot open"))?;
    let mut lines = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(FsError::io(path, "cannot read"))?;
        let parsed: IndexLine = serde_json::from_str(&line).map_err(|e| StateError::Corrupt {
            path: path.to_path_buf(),
            message: format!("line {}: {e}", n + 1),
        })?;
        lines.push(parsed);
    }
    Ok(lines)
}

/// A part's index as a map from `custom_id`.
pub fn index_by_id(path: &Path) -> Result<HashMap<String, Vec<IndexedChunk>>, StateError> {
    Ok(read_index(path)?
        .into_iter()
        .map(|line| (line.custom_id, line.chunks))
        .collect())
}

/// A content hash from its hex form.
pub fn parse_hash(hex_hash: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_hash).ok()?;
    bytes.try_into().ok()
}

/// Removes a part's local files once its batch is collected.
pub fn remove_part_files(dir: &Path, number: u64) -> Result<(), StateError> {
    fsio::remove_if_exists(&requests_path(dir, number))?;
    fsio::remove_if_exists(&index_path(dir, number))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(number: u64, state: PartState, tokens: u64) -> BatchPart {
        BatchPart {
            number,
            lines: 1,
            inputs: 1,
            tokens,
            prepared_at: 0,
            file_id: None,
            batch_id: None,
            state,
            expires_at: None,
            status: None,
        }
    }

    #[test]
    fn the_record_reads_back_what_was_saved() {
        let dir = tempfile::tempdir().unwrap();
        let empty = BatchRecord::load(dir.path()).unwrap();
        assert!(empty.parts.is_empty());
        let mut record = empty;
        record.parts.push(part(1, PartState::Submitted, 10));
        record.parts.push(part(2, PartState::Collected, 5));
        record.parts.push(part(3, PartState::Prepared, 7));
        record.refused.insert("ab".into(), "bad".into());
        record.save(dir.path()).unwrap();
        let back = BatchRecord::load(dir.path()).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.next_number(), 4);
        // Prepared parts are not on the service yet: only submitted ones count.
        assert_eq!(back.enqueued_tokens(), 10);
        assert_eq!(back.live().count(), 2);
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(RECORD), "{").unwrap();
        let error = BatchRecord::load(dir.path()).unwrap_err().to_string();
        assert!(error.contains("batches.json"), "{error}");
    }

    #[test]
    fn pending_keys_come_from_the_live_parts_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let hash = crate::types::content_hash("a");
        let line = IndexLine {
            custom_id: "p1-0".into(),
            chunks: vec![IndexedChunk(hex::encode(hash), 1)],
        };
        std::fs::write(
            index_path(dir.path(), 1),
            serde_json::to_string(&line).unwrap() + "\n",
        )
        .unwrap();
        let mut record = BatchRecord::load(dir.path()).unwrap();
        record.parts.push(part(1, PartState::Submitted, 1));
        let keys = record.pending_keys(dir.path()).unwrap();
        assert!(keys.contains(&hash_key(&hash)));
        record.parts[0].state = PartState::Collected;
        assert!(record.pending_keys(dir.path()).unwrap().is_empty());
    }
}
