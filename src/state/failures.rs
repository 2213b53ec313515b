//! The failures file: one JSON line per quarantined chunk, `<stem>.failures.jsonl`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::fsio::{remove_if_exists, FsError, TempFile};
use crate::types::Chunk;

/// One line of the failures file. The chunk's text is left out: the offsets
/// and the hash locate it in the input.
#[derive(Serialize)]
struct FailureLine<'a> {
    id: &'a str,
    doc_id: &'a str,
    chunk_index: u32,
    source: &'a str,
    byte_start: u64,
    byte_end: u64,
    token_count: u32,
    content_hash: &'a str,
    reason: &'a str,
    status: Option<u16>,
}

struct Open {
    // Declared before `temp` so that the file is closed before it is removed.
    writer: BufWriter<File>,
    temp: TempFile,
}

/// Quarantined chunks of a run, written to the job's failures file.
///
/// The file is created on the first failure, under a temporary name, and
/// renamed into place by [`FailuresFile::finish`]. A run that quarantined
/// nothing removes the failures file of an earlier run at finish, since it no
/// longer describes the output. [`FailuresFile::abort`], or dropping it,
/// leaves any earlier failures file untouched.
pub struct FailuresFile {
    path: PathBuf,
    open: Option<Open>,
    count: u64,
}

/// What a finished failures file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailuresReport {
    /// Quarantined chunks.
    pub count: u64,
    /// The failures file, when there were failures.
    pub path: Option<PathBuf>,
}

impl std::fmt::Debug for FailuresFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailuresFile")
            .field("path", &self.path)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl FailuresFile {
    /// The failures file at `path`. Nothing is created yet.
    pub fn new(path: PathBuf) -> Self {
        FailuresFile {
            path,
            open: None,
            count: 0,
        }
    }

    /// Where the file appears on finish.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Chunks recorded so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Records one quarantined chunk, with why the service rejected it and the
    /// HTTP status if there was one.
    pub fn record(
        &mut self,
        chunk: &Chunk,
        reason: &str,
        status: Option<u16>,
    ) -> Result<(), FsError> {
        let hash = chunk.content_hash_hex();
        // The reason is the service's message: it may echo the key.
        let reason = crate::secret::scrub(reason);
        let line = FailureLine {
            id: &chunk.id,
            doc_id: &chunk.doc_id,
            chunk_index: chunk.chunk_index,
            source: &chunk.source,
            byte_start: chunk.byte_start,
            byte_end: chunk.byte_end,
            token_count: chunk.token_count,
            content_hash: &hash,
            reason: &reason,
            status,
        };
        let open = match &mut self.open {
            Some(open) => open,
            None => {
                let (temp, file) = TempFile::create(&self.path)?;
                self.open.insert(Open {
                    writer: BufWriter::new(file),
                    temp,
                })
            }
        };
        let io_error = FsError::io(open.temp.temp_path(), "cannot write");
        serde_json::to_writer(&mut open.writer, &line).map_err(|source| FsError::Json {
            path: open.temp.temp_path().to_path_buf(),
            source,
        })?;
        open.writer.write_all(b"\n").map_err(io_error)?;
        self.count += 1;
        Ok(())
    }

    /// Moves the failures file into place, or, when nothing was recorded,
    /// removes a failures file left by an earlier run.
    pub fn finish(self) -> Result<FailuresReport, FsError> {
        let FailuresFile { path, open, count } = self;
        let Some(Open { writer, temp }) = open else {
            remove_if_exists(&path)?;
            return Ok(FailuresReport { count, path: None });
        };
        let file = writer
            .into_inner()
            .map_err(|e| FsError::io(temp.temp_path(), "cannot write")(e.into_error()))?;
        temp.commit(file)?;
        Ok(FailuresReport {
            count,
            path: Some(path),
        })
    }

    /// Drops what was recorded; an earlier failures file stays as it was.
    pub fn abort(self) {
        drop(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateLocation;
    use crate::testing::{chunk, names};

    fn failures_of(output: &Path) -> FailuresFile {
        FailuresFile::new(StateLocation::beside(output).failures())
    }

    #[test]
    fn a_run_without_failures_leaves_no_failures_file() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out.parquet");
        let failures = failures_of(&output);
        assert_eq!(
            failures.path(),
            dir.path().join("out.parquet.failures.jsonl")
        );
        let report = failures.finish().unwrap();
        assert_eq!(
            report,
            FailuresReport {
                count: 0,
                path: None
            }
        );
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn failures_are_written_one_json_line_each_on_finish() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("sub/out.parquet");
        let mut failures = failures_of(&output);
        let first = chunk("a.md", 3);
        failures
            .record(&first, "input too large: 9000 tokens", Some(413))
            .unwrap();
        failures
            .record(&chunk("b.md", 0), "rejected", None)
            .unwrap();
        assert_eq!(failures.count(), 2);
        assert!(!failures.path().exists(), "only complete files appear");

        let report = failures.finish().unwrap();
        let path = dir.path().join("sub/out.parquet.failures.jsonl");
        assert_eq!(
            report,
            FailuresReport {
                count: 2,
                path: Some(path.clone())
            }
        );
        assert_eq!(
            names(&dir.path().join("sub")),
            ["out.parquet.failures.jsonl"]
        );

        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            serde_json::json!({
                "id": "a.md#3",
                "doc_id": "a.md",
                "chunk_index": 3,
                "source": "input/a.md",
                "byte_start": first.byte_start,
                "byte_end": first.byte_end,
                "token_count": first.token_count,
                "content_hash": first.content_hash_hex(),
                "reason": "input too large: 9000 tokens",
                "status": 413,
            })
        );
        assert_eq!(lines[1]["id"], "b.md#0");
        assert_eq!(lines[1]["status"], serde_json::Value::Null);
    }

    #[test]
    fn a_later_run_without_failures_removes_the_old_failures_file() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out.parquet");
        let mut failures = failures_of(&output);
        failures
            .record(&chunk("a.md", 0), "rejected", Some(400))
            .unwrap();
        failures.finish().unwrap();
        assert_eq!(names(dir.path()), ["out.parquet.failures.jsonl"]);

        failures_of(&output).finish().unwrap();
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[test]
    fn a_later_run_with_failures_replaces_the_old_failures_file() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out.parquet");
        let mut failures = failures_of(&output);
        failures
            .record(&chunk("old.md", 0), "rejected", Some(400))
            .unwrap();
        failures
            .record(&chunk("old.md", 1), "rejected", Some(400))
            .unwrap();
        failures.finish().unwrap();

        let mut failures = failures_of(&output);
        failures
            .record(&chunk("new.md", 0), "rejected", Some(413))
            .unwrap();
        let path = failures.finish().unwrap().path.unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("new.md#0"), "{text}");
    }

    #[test]
    fn abort_leaves_the_earlier_failures_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out.parquet");
        let mut failures = failures_of(&output);
        failures
            .record(&chunk("old.md", 0), "rejected", Some(400))
            .unwrap();
        let path = failures.finish().unwrap().path.unwrap();
        let before = std::fs::read(&path).unwrap();

        let mut failures = failures_of(&output);
        failures
            .record(&chunk("new.md", 0), "rejected", Some(413))
            .unwrap();
        failures.abort();
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(names(dir.path()), ["out.parquet.failures.jsonl"]);

        let mut failures = failures_of(&output);
        failures
            .record(&chunk("new.md", 0), "rejected", Some(413))
            .unwrap();
        drop(failures);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(names(dir.path()), ["out.parquet.failures.jsonl"]);
    }
}
