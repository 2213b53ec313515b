//! Batch mode's sending stage, in place of [`super::dispatch`]: each batch
//! the reader packs becomes a line of a request file in the checkpoint
//! (with its index, see [`crate::state::batches`]), and each file closes at
//! the Batch API's limits or the enqueued-token cap. Chunks a live batch may
//! still answer are not written again; those the service refused as bad
//! input are quarantined, as the synchronous path does.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tokio::sync::mpsc;

use super::write::SinkMessage;
use super::RunError;
use crate::batch::Batch;
use crate::fsio::FsError;
use crate::state::batches::{
    index_path, requests_path, BatchPart, BatchRecord, IndexLine, IndexedChunk, PartState,
};
use crate::store::hash_key;
use crate::types::Chunk;

/// The Batch API's limits on one file, as OpenAI states them.
#[derive(Debug, Clone, Copy)]
pub(super) struct FileLimits {
    pub lines: u64,
    pub bytes: u64,
    pub inputs: u64,
}

impl Default for FileLimits {
    fn default() -> Self {
        // 200 MB counted in decimal megabytes, the smaller reading.
        FileLimits {
            lines: 50_000,
            bytes: 200_000_000,
            inputs: 50_000,
        }
    }
}

/// What a request line carries besides the texts.
pub(super) struct RequestBody {
    pub model: String,
    pub dimensions: Option<usize>,
}

/// What the stage did.
#[derive(Debug, Default)]
pub(super) struct Submitted {
    /// Parts prepared by this run (recorded, not yet uploaded).
    pub prepared: u64,
    /// Chunks written to request files.
    pub written: u64,
    /// Chunks a live batch may still answer.
    pub pending: u64,
    /// Chunks left for a later run by the enqueued-token cap or the budget.
    pub held_back: u64,
    pub quarantined: u64,
    /// Why the budget held chunks back, once it did.
    pub over_budget: Option<String>,
}

/// `budget.max_cost` in batch mode: what this run collected, what is
/// enqueued and what is being prepared, at the batch price, stay within it.
#[derive(Debug, Clone)]
pub(super) struct SubmitBudget {
    pub max_cost: f64,
    /// The batch price per local token: per token billed, times the ratio
    /// of billed to local tokens the job's last run recorded.
    pub per_token: f64,
    /// What the lines collected in this run cost, and the window probe's
    /// synchronous requests.
    pub billed: f64,
    /// Why no line fits, whatever its size: the window probe could cost
    /// more than the budget, and was not sent.
    pub spent: Option<String>,
}

impl SubmitBudget {
    /// Why `tokens` more in batches would go over, if they would.
    #[allow(clippy::cast_precision_loss)]
    fn over(&self, tokens: u64) -> Option<String> {
        if self.spent.is_some() {
            return self.spent.clone();
        }
        let projected = self.billed + tokens as f64 * self.per_token;
        (projected > self.max_cost).then(|| {
            format!(
                "stopped at the budget of {}: {:.6} billed, the next request would bring it to {projected:.6}",
                self.max_cost, self.billed
            )
        })
    }
}

/// The stage, on a blocking thread.
pub(super) struct Submit {
    pub dir: PathBuf,
    pub record: BatchRecord,
    pub body: RequestBody,
    pub limits: FileLimits,
    /// The most tokens enqueued at once, when known.
    pub cap: Option<u64>,
    pub budget: Option<SubmitBudget>,
    /// Content keys of chunks in live parts.
    pub pending: HashSet<u128>,
}

/// Whether a line went into a request file.
enum Added {
    Yes,
    /// The enqueued-token cap leaves no room.
    Capped,
    /// The budget leaves no room: why.
    OverBudget(String),
}

/// The request file being written.
struct OpenFile {
    number: u64,
    requests: BufWriter<File>,
    index: BufWriter<File>,
    lines: u64,
    inputs: u64,
    bytes: u64,
    tokens: u64,
}

impl Submit {
    /// Writes the request files; returns the record with the parts
    /// prepared, each recorded as its file was closed.
    pub(super) fn run(
        mut self,
        mut batches: mpsc::Receiver<Result<Batch, RunError>>,
        sink: &mpsc::Sender<SinkMessage>,
    ) -> Result<(BatchRecord, Submitted), RunError> {
        let alone: HashSet<u128> = keys(self.record.alone.iter());
        let refused: HashMap<u128, String> = self
            .record
            .refused
            .iter()
            .filter_map(|(hash, reason)| {
                crate::state::batches::parse_hash(hash).map(|h| (hash_key(&h), reason.clone()))
            })
            .collect();
        let mut report = Submitted::default();
        let mut open: Option<OpenFile> = None;
        let mut full = false;
        let enqueued = self.record.enqueued_tokens();
        while let Some(batch) = batches.blocking_recv() {
            let batch = batch?;
            let mut kept = Vec::with_capacity(batch.len());
            for chunk in batch.chunks {
                let key = hash_key(&chunk.content_hash);
                if let Some(reason) = refused.get(&key) {
                    report.quarantined += 1;
                    let message = SinkMessage::Quarantine {
                        chunk,
                        reason: format!("the service refused it as bad input: {reason}"),
                        status: Some(400),
                    };
                    if sink.blocking_send(message).is_err() {
                        return Ok((self.record, report));
                    }
                } else if self.pending.contains(&key) {
                    report.pending += 1;
                } else {
                    kept.push(chunk);
                }
            }
            // A text whose line was refused goes alone, so the refusal names it.
            let (single, together): (Vec<Chunk>, Vec<Chunk>) = kept
                .into_iter()
                .partition(|c| alone.contains(&hash_key(&c.content_hash)));
            let lines = single
                .into_iter()
                .map(|c| vec![c])
                .chain(Some(together).filter(|t| !t.is_empty()));
            for line in lines {
                let count = line.len() as u64;
                if full {
                    report.held_back += count;
                    continue;
                }
                match self.add_line(&mut open, &line, enqueued)? {
                    Added::Yes => report.written += count,
                    Added::Capped => {
                        full = true;
                        report.held_back += count;
                    }
                    Added::OverBudget(why) => {
                        full = true;
                        report.held_back += count;
                        report.over_budget = Some(why);
                    }
                }
            }
        }
        if let Some(file) = open.take() {
            self.close(file)?;
        }
        report.prepared = self
            .record
            .parts
            .iter()
            .filter(|p| p.state == PartState::Prepared)
            .count() as u64;
        Ok((self.record, report))
    }

    /// Adds a line to the open file, closing it first when the line would
    /// pass a limit; not when the enqueued-token cap or the budget leaves no room.
    fn add_line(
        &mut self,
        open: &mut Option<OpenFile>,
        chunks: &[Chunk],
        enqueued: u64,
    ) -> Result<Added, RunError> {
        let tokens: u64 = chunks.iter().map(|c| u64::from(c.token_count)).sum();
        let number = match open {
            Some(file) => file.number,
            None => self.record.next_number(),
        };
        let line_number = open.as_ref().map_or(0, |f| f.lines);
        let custom_id = format!("p{number}-{line_number}");
        let line = self.request_line(&custom_id, chunks)?;
        let bytes = line.len() as u64 + 1;
        if let Some(file) = open.as_ref() {
            let over = file.lines + 1 > self.limits.lines
                || file.inputs + chunks.len() as u64 > self.limits.inputs
                || file.bytes + bytes > self.limits.bytes;
            if over {
                let file = open.take().expect("checked above");
                self.close(file)?;
                return self.add_line(open, chunks, enqueued);
            }
        }
        // Tokens this run has prepared, besides the open file's.
        let prepared: u64 = self
            .record
            .parts
            .iter()
            .filter(|p| p.state == PartState::Prepared)
            .map(|p| p.tokens)
            .sum();
        let open_tokens = open.as_ref().map_or(0, |f| f.tokens);
        let first = enqueued + prepared + open_tokens == 0;
        // A first line over the cap alone still goes: nothing else would ever make room.
        if self
            .cap
            .is_some_and(|cap| !first && enqueued + prepared + open_tokens + tokens > cap)
        {
            return Ok(Added::Capped);
        }
        let ahead = enqueued + prepared + open_tokens + tokens;
        if let Some(why) = self.budget.as_ref().and_then(|b| b.over(ahead)) {
            return Ok(Added::OverBudget(why));
        }
        let file = match open {
            Some(file) => file,
            None => open.insert(self.create(number)?),
        };
        let index = IndexLine {
            custom_id,
            chunks: chunks
                .iter()
                .map(|c| IndexedChunk(c.content_hash_hex(), c.token_count))
                .collect(),
        };
        let index_line = serde_json::to_string(&index)
            .map_err(|e| RunError::Internal(format!("cannot write a request's index: {e}")))?;
        let path = requests_path(&self.dir, number);
        file.requests
            .write_all(line.as_bytes())
            .and_then(|()| file.requests.write_all(b"\n"))
            .map_err(FsError::io(&path, "cannot write"))?;
        let path = index_path(&self.dir, number);
        file.index
            .write_all(index_line.as_bytes())
            .and_then(|()| file.index.write_all(b"\n"))
            .map_err(FsError::io(&path, "cannot write"))?;
        file.lines += 1;
        file.inputs += chunks.len() as u64;
        file.bytes += bytes;
        file.tokens += tokens;
        Ok(Added::Yes)
    }

    /// One request of the file, as the Batch API takes it.
    fn request_line(&self, custom_id: &str, chunks: &[Chunk]) -> Result<String, RunError> {
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        let mut body = serde_json::json!({
            "model": self.body.model,
            "input": texts,
            "encoding_format": "base64",
        });
        if let Some(dimensions) = self.body.dimensions {
            body["dimensions"] = dimensions.into();
        }
        let line = serde_json::json!({
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/embeddings",
            "body": body,
        });
        serde_json::to_string(&line)
            .map_err(|e| RunError::Internal(format!("cannot write a request: {e}")))
    }

    fn create(&self, number: u64) -> Result<OpenFile, RunError> {
        let open = |path: &Path| -> Result<BufWriter<File>, RunError> {
            Ok(BufWriter::new(
                File::create(path).map_err(FsError::io(path, "cannot create"))?,
            ))
        };
        Ok(OpenFile {
            number,
            requests: open(&requests_path(&self.dir, number))?,
            index: open(&index_path(&self.dir, number))?,
            lines: 0,
            inputs: 0,
            bytes: 0,
            tokens: 0,
        })
    }

    /// Makes the file durable, then records its part, before any upload.
    fn close(&mut self, file: OpenFile) -> Result<(), RunError> {
        for (writer, path) in [
            (file.requests, requests_path(&self.dir, file.number)),
            (file.index, index_path(&self.dir, file.number)),
        ] {
            let file = writer
                .into_inner()
                .map_err(|e| FsError::io(&path, "cannot write")(e.into_error()))?;
            file.sync_all().map_err(FsError::io(&path, "cannot sync"))?;
        }
        self.record.parts.push(BatchPart {
            number: file.number,
            lines: file.lines,
            inputs: file.inputs,
            tokens: file.tokens,
            prepared_at: unix_now(),
            file_id: None,
            batch_id: None,
            state: PartState::Prepared,
            expires_at: None,
            status: None,
        });
        self.record.save(&self.dir)?;
        Ok(())
    }
}

fn keys<'a>(hashes: impl Iterator<Item = &'a String>) -> HashSet<u128> {
    hashes
        .filter_map(|h| crate::state::batches::parse_hash(h))
        .map(|h| hash_key(&h))
        .collect()
}

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::state::batches::read_index;
    use crate::types::content_hash;

    fn chunk(text: &str, tokens: u32) -> Chunk {
        Chunk {
            id: format!("d#{text}"),
            doc_id: Arc::from("d"),
            source: Arc::from("d"),
            chunk_index: 0,
            byte_start: 0,
            byte_end: text.len() as u64,
            text: text.to_string(),
            content_hash: content_hash(text),
            token_count: tokens,
            metadata: None,
        }
    }

    fn submit(dir: &Path, limits: FileLimits, cap: Option<u64>) -> Submit {
        Submit {
            dir: dir.to_path_buf(),
            record: BatchRecord::load(dir).unwrap(),
            body: RequestBody {
                model: "m".into(),
                dimensions: Some(8),
            },
            limits,
            cap,
            budget: None,
            pending: HashSet::new(),
        }
    }

    fn run(stage: Submit, batches: Vec<Batch>) -> (BatchRecord, Submitted, Vec<SinkMessage>) {
        let (tx, rx) = mpsc::channel(batches.len() + 1);
        for batch in batches {
            tx.try_send(Ok(batch)).unwrap();
        }
        drop(tx);
        let (sink_tx, mut sink_rx) = mpsc::channel(16);
        let (record, report) = stage.run(rx, &sink_tx).unwrap();
        drop(sink_tx);
        let mut messages = Vec::new();
        while let Ok(m) = sink_rx.try_recv() {
            messages.push(m);
        }
        (record, report, messages)
    }

    #[test]
    fn lines_carry_the_request_and_files_close_at_the_limits() {
        let dir = tempfile::tempdir().unwrap();
        let limits = FileLimits {
            lines: 2,
            bytes: u64::MAX,
            inputs: 3,
        };
        let batches = vec![
            Batch::new(vec![chunk("a", 1), chunk("b", 1)]),
            Batch::new(vec![chunk("c", 1), chunk("d", 1)]),
            Batch::new(vec![chunk("e", 1)]),
        ];
        let (record, report, _) = run(submit(dir.path(), limits, None), batches);
        // 2 + 2 inputs pass the 3-input limit: the second line starts file 2.
        assert_eq!(record.parts.len(), 2);
        assert_eq!((record.parts[0].inputs, record.parts[1].inputs), (2, 3));
        assert_eq!(report.written, 5);
        let text = std::fs::read_to_string(requests_path(dir.path(), 1)).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(line["custom_id"], "p1-0");
        assert_eq!(line["url"], "/v1/embeddings");
        assert_eq!(line["body"]["input"], serde_json::json!(["a", "b"]));
        assert_eq!(line["body"]["encoding_format"], "base64");
        assert_eq!(line["body"]["dimensions"], 8);
        let index = read_index(&index_path(dir.path(), 2)).unwrap();
        assert_eq!(index[1].custom_id, "p2-1");
        assert_eq!(index[1].chunks[0].0, hex::encode(content_hash("e")));
        // Recorded on disk before any upload.
        assert_eq!(BatchRecord::load(dir.path()).unwrap(), record);
    }

    #[test]
    fn pending_refused_and_capped_chunks_are_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut stage = submit(dir.path(), FileLimits::default(), Some(3));
        stage.pending.insert(hash_key(&content_hash("a")));
        stage
            .record
            .refused
            .insert(hex::encode(content_hash("b")), "bad".into());
        stage.record.alone.insert(hex::encode(content_hash("c")));
        let batches = vec![
            Batch::new(vec![
                chunk("a", 1),
                chunk("b", 1),
                chunk("c", 1),
                chunk("d", 1),
            ]),
            Batch::new(vec![chunk("e", 2)]),
        ];
        let (record, report, messages) = run(stage, batches);
        assert_eq!(report.pending, 1);
        assert_eq!(report.quarantined, 1);
        assert!(matches!(messages[0], SinkMessage::Quarantine { .. }));
        // c alone, then d: 2 tokens; e's 2 more would pass the cap of 3.
        assert_eq!(report.written, 2);
        assert_eq!(report.held_back, 1);
        assert_eq!(record.parts[0].lines, 2);
    }

    #[test]
    fn the_budget_holds_back_what_would_go_over_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut stage = submit(dir.path(), FileLimits::default(), None);
        // 1 per token, 2 already billed: 3 more tokens fit a budget of 5.
        stage.budget = Some(SubmitBudget {
            max_cost: 5.0,
            per_token: 1.0,
            billed: 2.0,
            spent: None,
        });
        let batches = vec![
            Batch::new(vec![chunk("a", 1), chunk("b", 1)]),
            Batch::new(vec![chunk("c", 2)]),
            Batch::new(vec![chunk("d", 1)]),
        ];
        let (record, report, _) = run(stage, batches);
        assert_eq!(report.written, 2);
        assert_eq!(
            report.held_back, 2,
            "c would bring it to 6, d waits behind it"
        );
        assert_eq!(record.parts[0].tokens, 2);
        let why = report.over_budget.unwrap();
        assert!(why.contains("budget of 5: 2.000000 billed"), "{why}");
        assert!(why.contains("6.000000"), "{why}");
    }
}
