//! A batch's life on the compressed clock: validating, in progress (its
//! lines run as they fall due), finalizing, then completed; or failed,
//! expired, or cancelled on the way.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::files::StoredFile;
use super::lines::{expire_line, record, run_line, Outcome};
use super::validate::{validate, LineError, Span, Valid};
use super::{unix_now, Batches};
use crate::simulate::handlers::Caller;

/// How often a running batch looks at the clock and at a cancellation.
const TICK: Duration = Duration::from_millis(10);
/// Lines run between two looks at the clock.
const LINES_PER_STEP: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Validating => "validating",
            Status::Failed => "failed",
            Status::InProgress => "in_progress",
            Status::Finalizing => "finalizing",
            Status::Completed => "completed",
            Status::Expired => "expired",
            Status::Cancelling => "cancelling",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Status::Failed | Status::Completed | Status::Expired | Status::Cancelled
        )
    }
}

/// One batch, as the routes show it.
#[derive(Debug)]
pub(crate) struct Batch {
    pub id: String,
    /// Its place among the batches created, from 0.
    pub seq: u64,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    /// As given: an object of strings, or null.
    pub metadata: Value,
    pub created_at: u64,
    pub status: Status,
    pub errors: Vec<LineError>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    /// `in_progress_at`, `finalizing_at`, ... as they happen.
    pub times: Vec<(&'static str, u64)>,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    /// Tokens billed for its completed lines.
    pub tokens: u64,
    pub model: Option<String>,
    /// Tokens it holds of its model's enqueued-token quota.
    pub enqueued: u64,
}

impl Batch {
    pub fn new(id: String, seq: u64, input_file_id: String, metadata: Value) -> Batch {
        Batch {
            id,
            seq,
            endpoint: "/v1/embeddings".to_string(),
            input_file_id,
            completion_window: "24h".to_string(),
            metadata,
            created_at: unix_now(),
            status: Status::Validating,
            errors: Vec::new(),
            output_file_id: None,
            error_file_id: None,
            times: Vec::new(),
            total: 0,
            completed: 0,
            failed: 0,
            tokens: 0,
            model: None,
            enqueued: 0,
        }
    }

    fn stamp(&mut self, status: Status) {
        self.status = status;
        let at = match status {
            Status::Validating => return,
            Status::Failed => "failed_at",
            Status::InProgress => "in_progress_at",
            Status::Finalizing => "finalizing_at",
            Status::Completed => "completed_at",
            Status::Expired => "expired_at",
            Status::Cancelling => "cancelling_at",
            Status::Cancelled => "cancelled_at",
        };
        self.times.push((at, unix_now()));
    }

    /// Asks a running batch to stop; false when it has ended already.
    pub fn cancel(&mut self) -> bool {
        if self.status.is_terminal() {
            return false;
        }
        if self.status != Status::Cancelling {
            self.stamp(Status::Cancelling);
        }
        true
    }

    pub fn json(&self) -> Value {
        let time = |name: &str| {
            self.times
                .iter()
                .find(|(at, _)| *at == name)
                .map(|(_, t)| *t)
        };
        let errors = (!self.errors.is_empty()).then(|| {
            json!({"object": "list", "data": self.errors.iter().map(LineError::json).collect::<Vec<_>>()})
        });
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.name(),
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": time("in_progress_at"),
            "expires_at": self.created_at + 24 * 3600,
            "finalizing_at": time("finalizing_at"),
            "completed_at": time("completed_at"),
            "failed_at": time("failed_at"),
            "expired_at": time("expired_at"),
            "cancelling_at": time("cancelling_at"),
            "cancelled_at": time("cancelled_at"),
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "usage": {
                "input_tokens": self.tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.tokens,
            },
            "metadata": self.metadata,
        })
    }
}

/// A batch's clock: when its stages begin, and how many lines are due at an instant.
struct Clock {
    start: Instant,
    duration: Duration,
    expire_at: Option<Instant>,
}

impl Clock {
    fn in_progress_at(&self) -> Instant {
        self.start + self.duration / 10
    }

    fn end(&self) -> Instant {
        self.start + self.duration
    }

    /// Lines due by `at`: spread evenly over the eight tenths in progress.
    fn due(&self, at: Instant, lines: usize) -> usize {
        let Some(since) = at.checked_duration_since(self.in_progress_at()) else {
            return 0;
        };
        let span = (self.duration * 8 / 10).as_nanos();
        if span == 0 {
            return lines;
        }
        let due = since.as_nanos().saturating_mul(lines as u128) / span;
        usize::try_from(due).unwrap_or(usize::MAX).min(lines)
    }
}

/// What a running batch works with, handed to a blocking thread and back.
struct Work {
    input: Arc<StoredFile>,
    reader: File,
    lines: Vec<Span>,
    /// The order the lines run in, which is the output's.
    order: Vec<usize>,
    done: usize,
    rng: StdRng,
    output: (String, std::path::PathBuf, BufWriter<File>),
    errors: (String, std::path::PathBuf, BufWriter<File>),
}

impl Work {
    fn read_line(&mut self, index: usize) -> std::io::Result<Vec<u8>> {
        let span = self.lines[index];
        let mut raw = vec![0; span.len as usize];
        self.reader.seek(SeekFrom::Start(span.offset))?;
        self.reader.read_exact(&mut raw)?;
        Ok(raw)
    }
}

/// Runs batch `id` to its end. It holds the API only between its steps, so
/// that a simulator shut down ends it.
pub(crate) async fn run(api: Weak<Batches>, id: String, input: Arc<StoredFile>, caller: Caller) {
    let start = Instant::now();
    let Some(batches) = api.upgrade() else { return };
    let config = batches.config.clone();
    let Some(seq) = batches.with_batch(&id, |batch| batch.seq) else {
        return;
    };
    let clock = Clock {
        start,
        duration: config.duration,
        expire_at: config.expires(seq).map(|after| start + after),
    };
    let path = input.path.clone();
    let valid = tokio::task::spawn_blocking(move || validate(&path, "/v1/embeddings", &config))
        .await
        .unwrap_or_else(|_| Err(vec![LineError::new("server_error", "Validation failed.")]));
    let valid = match valid {
        Ok(_) if seq < batches.config.fail_validation => Err(vec![LineError::new(
            "invalid_request",
            "The batch failed validation (a simulated failure); try again.",
        )]),
        other => other,
    };
    let valid = match valid.and_then(|valid| batches.enqueue(&id, valid)) {
        Ok(valid) => valid,
        Err(errors) => {
            batches.with_batch(&id, |batch| {
                batch.errors = errors;
                batch.stamp(Status::Failed);
            });
            return;
        }
    };
    let Ok(mut work) = batches.start_work(input, valid, seq) else {
        batches.end(&id, None, Status::Failed);
        return;
    };
    drop(batches);
    loop {
        let Some(batches) = api.upgrade() else { return };
        let now = Instant::now();
        let Some(status) = batches.with_batch(&id, |batch| batch.status) else {
            return;
        };
        if status == Status::Cancelling {
            finish(batches, id, work, Status::Cancelled).await;
            return;
        }
        let horizon = clock.expire_at.map_or(now, |at| at.min(now));
        if status == Status::Validating && horizon >= clock.in_progress_at() {
            batches.with_batch(&id, |batch| batch.stamp(Status::InProgress));
        }
        let mut due = clock.due(horizon, work.lines.len());
        if seq < batches.config.stuck {
            due = due.min(work.lines.len() / 2);
        }
        if due > work.done {
            let until = due.min(work.done + LINES_PER_STEP);
            let (api, step_id) = (Arc::clone(&batches), id.clone());
            let stepped = tokio::task::spawn_blocking(move || {
                let result = api.step(&step_id, &mut work, caller, until);
                (work, result)
            });
            match stepped.await {
                Ok((back, Ok(()))) => work = back,
                _ => {
                    batches.end(&id, None, Status::Failed);
                    return;
                }
            }
            continue;
        }
        let done = work.done == work.lines.len();
        if !done && clock.expire_at.is_some_and(|at| now >= at) {
            finish(batches, id, work, Status::Expired).await;
            return;
        }
        if done && seq >= batches.config.stuck {
            // Every batch passes through finalizing, however short its time.
            if status == Status::InProgress {
                batches.with_batch(&id, |batch| batch.stamp(Status::Finalizing));
            } else if status == Status::Finalizing && now >= clock.end() {
                finish(batches, id, work, Status::Completed).await;
                return;
            }
        }
        drop(batches);
        tokio::time::sleep(TICK).await;
    }
}

/// Ends the batch with `status` off the async threads: writing the lines an
/// expiry leaves and flushing the files are blocking work.
async fn finish(batches: Arc<Batches>, id: String, mut work: Work, status: Status) {
    let _ = tokio::task::spawn_blocking(move || {
        let written = status != Status::Expired || batches.expire_rest(&id, &mut work).is_ok();
        batches.end(&id, written.then_some(work), status);
    })
    .await;
}

impl Batches {
    /// Applies `change` to batch `id`, if it exists.
    pub(crate) fn with_batch<T>(
        &self,
        id: &str,
        change: impl FnOnce(&mut Batch) -> T,
    ) -> Option<T> {
        let mut state = self.state();
        Batches::batch_mut(&mut state, id).map(change)
    }

    /// Takes the batch's tokens from its model's enqueued-token quota, or
    /// refuses as OpenAI does when the quota would be passed.
    fn enqueue(&self, id: &str, valid: Valid) -> Result<Valid, Vec<LineError>> {
        let mut state = self.state();
        let queued: u64 = state
            .batches
            .iter()
            .filter(|batch| batch.model.as_deref() == Some(valid.model.as_str()))
            .map(|batch| batch.enqueued)
            .sum();
        if let Some(limit) = self.config.enqueued_tokens {
            if queued.saturating_add(valid.tokens) > limit {
                return Err(vec![LineError::new(
                    "token_limit_exceeded",
                    format!(
                        "Enqueued token limit reached for {} in organization org-simulated. \
                         Limit: {limit} enqueued tokens. Please try again once some \
                         in_progress batches have been completed.",
                        valid.model
                    ),
                )]);
            }
        }
        let batch = Batches::batch_mut(&mut state, id).ok_or_else(Vec::new)?;
        batch.model = Some(valid.model.clone());
        batch.enqueued = valid.tokens;
        batch.total = valid.lines.len() as u64;
        Ok(valid)
    }

    fn start_work(&self, input: Arc<StoredFile>, valid: Valid, seq: u64) -> std::io::Result<Work> {
        let reader = File::open(&input.path)?;
        let mut rng = StdRng::seed_from_u64(self.shared.config.faults.seed ^ seq.rotate_left(32));
        let mut order: Vec<usize> = (0..valid.lines.len()).collect();
        if !self.config.in_order {
            order.shuffle(&mut rng);
        }
        let open = || -> std::io::Result<_> {
            let (id, path) = self.new_path()?;
            let file = BufWriter::new(File::create(&path)?);
            Ok((id, path, file))
        };
        Ok(Work {
            input,
            reader,
            lines: valid.lines,
            order,
            done: 0,
            rng,
            output: open()?,
            errors: open()?,
        })
    }

    /// Runs the lines of `work` up to position `until` of its order, as many
    /// at once as there are cores, each written and billed in that order.
    fn step(&self, id: &str, work: &mut Work, caller: Caller, until: usize) -> std::io::Result<()> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let (mut completed, mut failed, mut tokens) = (0, 0, 0);
        while work.done < until {
            let mut round = Vec::new();
            for position in work.done..until.min(work.done + threads) {
                let index = work.order[position];
                let fail = self.config.line_failures > 0.0
                    && work.rng.random::<f64>() < self.config.line_failures;
                round.push((index, work.read_line(index)?, fail));
            }
            let ran: Vec<_> = std::thread::scope(|scope| {
                let running: Vec<_> = round
                    .iter()
                    .map(|(index, raw, fail)| {
                        scope.spawn(move || run_line(&self.shared, caller, id, *index, raw, *fail))
                    })
                    .collect();
                running.into_iter().map(|thread| thread.join()).collect()
            });
            for ran in ran {
                let ran = ran.map_err(|_| std::io::Error::other("a line's thread panicked"))?;
                match record(&self.shared, ran, &mut work.output.2, &mut work.errors.2)? {
                    Outcome::Completed(billed) => {
                        completed += 1;
                        tokens += billed;
                    }
                    Outcome::Failed => failed += 1,
                }
                work.done += 1;
            }
        }
        self.with_batch(id, |batch| {
            batch.completed += completed;
            batch.failed += failed;
            batch.tokens += tokens;
        });
        Ok(())
    }

    /// Writes every line not run yet as expired.
    fn expire_rest(&self, id: &str, work: &mut Work) -> std::io::Result<()> {
        let mut expired = 0;
        while work.done < work.lines.len() {
            let index = work.order[work.done];
            let raw = work.read_line(index)?;
            expire_line(&self.shared, id, index, &raw, &mut work.errors.2)?;
            work.done += 1;
            expired += 1;
        }
        self.with_batch(id, |batch| batch.failed += expired);
        Ok(())
    }

    /// Ends the batch with `status`, its output and error files kept when
    /// they hold a line; without `work` (its files unwritable) it fails.
    fn end(&self, id: &str, work: Option<Work>, status: Status) {
        let mut files = (None, None);
        let mut status = status;
        if let Some(work) = work {
            let Work {
                output,
                errors,
                input,
                ..
            } = work;
            drop(input);
            let mut keep =
                |(file_id, path, mut writer): (String, std::path::PathBuf, BufWriter<File>),
                 name: &str| {
                    let written = writer.flush().and_then(|()| writer.get_ref().metadata());
                    drop(writer);
                    match written {
                        Ok(meta) if meta.len() > 0 => Some(self.keep_output(
                            file_id,
                            path,
                            format!("{id}_{name}.jsonl"),
                            meta.len(),
                        )),
                        Ok(_) => {
                            let _ = std::fs::remove_file(&path);
                            None
                        }
                        Err(_) => {
                            let _ = std::fs::remove_file(&path);
                            status = Status::Failed;
                            None
                        }
                    }
                };
            files = (keep(output, "output"), keep(errors, "error"));
        }
        self.with_batch(id, |batch| {
            batch.output_file_id = files.0;
            batch.error_file_id = files.1;
            batch.enqueued = 0;
            if status == Status::Failed && batch.errors.is_empty() {
                batch.errors.push(LineError::new(
                    "server_error",
                    "The batch could not be run: its files could not be read or written.",
                ));
            }
            batch.stamp(status);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_fall_due_evenly_over_the_time_in_progress() {
        let start = Instant::now();
        let clock = Clock {
            start,
            duration: Duration::from_secs(10),
            expire_at: None,
        };
        // In progress from 1 s to 9 s: 100 lines, one every 80 ms.
        assert_eq!(clock.due(start, 100), 0);
        assert_eq!(clock.due(start + Duration::from_millis(999), 100), 0);
        assert_eq!(clock.due(start + Duration::from_secs(5), 100), 50);
        assert_eq!(clock.due(start + Duration::from_secs(9), 100), 100);
        assert_eq!(clock.due(start + Duration::from_secs(60), 100), 100);
        let instant = Clock {
            start,
            duration: Duration::ZERO,
            expire_at: None,
        };
        assert_eq!(instant.due(start, 7), 7);
    }

    #[test]
    fn only_running_batches_can_be_cancelled() {
        let mut batch = Batch::new("batch_1".into(), 0, "file-1".into(), Value::Null);
        assert!(batch.cancel());
        assert_eq!(batch.status, Status::Cancelling);
        assert!(batch.cancel(), "cancelling twice is still accepted");
        batch.stamp(Status::Cancelled);
        assert!(!batch.cancel());
        assert_eq!(batch.json()["status"], "cancelled");
        assert!(batch.json()["cancelling_at"].is_u64());
    }
}
