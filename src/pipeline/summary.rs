//! What a run did: the [`Summary`] printed with `--json`, written to the
//! job's state and shown to people, and the exit code it calls for.

use std::fmt::Write as _;

use serde::Serialize;

use super::dispatch::Dispatched;
use super::read::ReadReport;
use super::write::Written;
use crate::backend::BackendKind;
use crate::backend::{BackendInfo, BackendStats};
use crate::display::{count, counted};
use crate::exit::Exit;
use crate::job::Job;
use crate::source::SkippedFiles;
use crate::store::Earlier;
use crate::types::Usage;

/// What a run did; printed with `--json` and written to the job's state.
///
/// `usage`, `requests` and `cost` are what this run was billed. Of the
/// chunks, `embedded` were sent, `reused` came from the previous output,
/// `resumed` from the checkpoint of an unfinished run, and `deduplicated`
/// repeat another chunk's text; compared with the previous output (by chunk
/// id), chunks are `added`, `changed` or `unchanged` (their vector reused),
/// and `removed` ones are gone.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub job: String,
    /// The shard of the job this run embedded (`--shard`), `I/N`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::job::Shard>,
    pub output: String,
    /// Where quarantined chunks are listed, for the human form.
    #[serde(skip)]
    pub failures_file: String,
    /// Where a stopped run's vectors are kept, for the human form.
    #[serde(skip)]
    pub checkpoint_dir: String,
    pub backend: String,
    pub model: String,
    pub dimensions: Option<usize>,
    pub documents: u64,
    pub skipped_null: u64,
    pub skipped_empty: u64,
    /// Files passed over because they are not UTF-8 text.
    pub skipped_files: SkippedFiles,
    pub chunks: u64,
    pub written: u64,
    pub quarantined: u64,
    pub embedded: u64,
    pub reused: u64,
    pub resumed: u64,
    pub deduplicated: u64,
    pub added: u64,
    pub changed: u64,
    pub unchanged: u64,
    pub removed: u64,
    /// Local token count of the chunks sent.
    pub estimated_tokens: u64,
    /// Local token count of the chunks not sent because their vector was at hand.
    pub tokens_saved: u64,
    /// Every response that carried usage, whether or not its vectors passed.
    pub usage: Usage,
    /// Of `usage.prompt_tokens`, the tokens that paid for vectors that failed
    /// a check and were discarded.
    pub discarded_tokens: u64,
    /// Billed tokens (those discarded left out) over the local count of the
    /// same chunks; the next estimate scales by it.
    pub billed_token_ratio: Option<f64>,
    /// Billed by earlier, unfinished runs for vectors this run reused.
    pub resumed_usage: Usage,
    pub requests: u64,
    pub retries: u64,
    pub invalid_responses: u64,
    pub throttled: u64,
    /// Seconds during which requests waited for the service's quota (or
    /// `requests_per_minute` / `tokens_per_minute`).
    pub quota_wait_seconds: f64,
    /// The mean rate achieved: requests answered per minute of the run.
    pub requests_per_minute: f64,
    /// The mean rate achieved: tokens billed per minute of the run.
    pub tokens_per_minute: f64,
    /// Requests given up on after `backend.timeout_seconds`; the service may
    /// have billed them without `usage` reaching this run.
    pub timeouts: u64,
    pub cost: Option<f64>,
    /// Limits on requests the service's answers taught this run.
    pub learned_limits: LearnedLimits,
    /// The tokenizer chunks (and a learned window) are counted in.
    pub tokenizer: String,
    /// The requests in flight `backend.concurrency = "auto"` settled on,
    /// and its range after the first sign of a queue; null for a fixed number.
    pub concurrency: Option<crate::rate::SettledConcurrency>,
    /// What the service does not tell, and what had to change to work with it.
    pub warnings: Vec<String>,
    /// Why the run stopped before the end, when it did.
    pub stopped: Option<String>,
    /// Batch mode: what was collected at the batch price, sent, and left pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<super::BatchSummary>,
    /// Vectors the checkpoint holds for the next run when this one stopped
    /// (this run's and earlier runs'); 0 when the run finished.
    pub committed: u64,
    /// The command that carries a stopped run on, for people; set by the
    /// command that ran it.
    #[serde(skip)]
    pub carry_on: Option<String>,
    /// Why the run failed, when it did (`exit_code` 1, or 2 for a problem
    /// found before any work); `usage`, `requests` and `cost` are then what
    /// it was billed before it failed, kept in the checkpoint.
    pub error: Option<String>,
    pub elapsed_seconds: f64,
    pub chunks_per_second: f64,
    pub exit_code: u8,
}

/// Limits on requests learned from the service during a run; `None` where
/// the configured one held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LearnedLimits {
    pub max_inputs_per_request: Option<usize>,
    pub max_tokens_per_request: Option<u64>,
    /// The tokens (by the local count) requests were cut to for the
    /// service's token quota, a hundredth of it, when its headers told it
    /// and batches were larger.
    pub quota_tokens_per_request: Option<u64>,
    /// Requests in flight, when timeouts lowered it.
    pub concurrency: Option<usize>,
    /// The model's window, when the service listed none and a probe or a
    /// refusal taught it; counted in `tokenizer`.
    pub context_window: Option<crate::backend::LearnedWindow>,
    /// What probing for the window cost, when it was probed for.
    pub window_probe: Option<crate::backend::ProbeCost>,
    /// The tokens of a text the server read whole, counted in `tokenizer`,
    /// when the model lists no window and a probe (this run's, or the one an
    /// earlier run recorded) found none: chunks no longer are read whole.
    pub read_whole: Option<u64>,
}

impl LearnedLimits {
    fn is_empty(&self) -> bool {
        *self == LearnedLimits::default()
    }
}

/// What a run was billed, all responses counted.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Bill {
    pub usage: Usage,
    pub discarded_tokens: u64,
    pub ratio: Option<f64>,
    /// Of `usage`, the input tokens the window probe's requests were billed.
    pub probed: u64,
}

/// Everything a finished run reports, gathered from its stages.
pub(super) struct Outcome<'a> {
    pub job: &'a Job,
    pub output: String,
    pub location: &'a crate::state::StateLocation,
    pub info: &'a BackendInfo,
    pub read: &'a ReadReport,
    pub dispatched: &'a Dispatched,
    pub written: &'a Written,
    pub stats: BackendStats,
    pub earlier: Earlier,
    pub bill: Bill,
    pub limits: LearnedLimits,
    pub warnings: Vec<String>,
    pub elapsed_seconds: f64,
    pub error: Option<&'a super::RunError>,
}

/// `n` over `seconds`, per minute; 0 for a run of no time.
#[allow(clippy::cast_precision_loss)]
fn per_minute(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 * 60.0 / seconds
    } else {
        0.0
    }
}

impl Summary {
    pub(super) fn new(o: &Outcome<'_>) -> Summary {
        let c = &o.read.counts;
        let stopped = o.dispatched.stopped.clone();
        let exit = if let Some(error) = o.error {
            error.exit()
        } else if stopped.is_some() {
            Exit::Stopped
        } else if o.written.quarantined > 0 {
            Exit::Quarantined
        } else {
            Exit::Success
        };
        Summary {
            job: o.job.name.clone(),
            shard: o.job.shard,
            output: o.output.clone(),
            failures_file: o.location.failures().display().to_string(),
            checkpoint_dir: o.location.checkpoint().display().to_string(),
            backend: o.info.kind.to_string(),
            model: o.info.model.clone(),
            dimensions: o.written.dimensions.or(o.info.dimensions),
            documents: o.read.source.documents,
            skipped_null: o.read.source.skipped_null,
            skipped_empty: o.read.source.skipped_empty,
            skipped_files: o.read.skipped_files.clone(),
            chunks: c.chunks,
            written: o.written.rows.map_or(0, |rows| rows + o.read.kept),
            quarantined: o.written.quarantined,
            embedded: o.dispatched.embedded,
            reused: c.reused,
            resumed: c.resumed,
            deduplicated: c.deduplicated,
            added: c.added,
            changed: c.changed,
            unchanged: c.unchanged,
            removed: if stopped.is_none() { c.removed } else { 0 },
            estimated_tokens: c.sent_tokens,
            tokens_saved: c.tokens_saved,
            usage: o.bill.usage,
            discarded_tokens: o.bill.discarded_tokens,
            billed_token_ratio: o.bill.ratio,
            resumed_usage: o.earlier.usage,
            requests: o.stats.requests,
            retries: o.stats.retries,
            invalid_responses: o.stats.invalid_responses,
            throttled: o.stats.throttled,
            quota_wait_seconds: o.stats.quota_wait_ms as f64 / 1000.0,
            requests_per_minute: per_minute(o.stats.requests, o.elapsed_seconds),
            tokens_per_minute: per_minute(o.bill.usage.prompt_tokens, o.elapsed_seconds),
            timeouts: o.stats.timeouts,
            cost: run_cost(o.info, o.bill.usage, o.dispatched, o.bill.probed),
            learned_limits: o.limits,
            tokenizer: crate::backend::tokenizer_name(&o.job.chunking).to_string(),
            concurrency: o.stats.concurrency,
            warnings: o.warnings.clone(),
            committed: if stopped.is_some() {
                o.earlier.rows + o.dispatched.embedded
            } else {
                0
            },
            carry_on: None,
            batch: o.dispatched.batch.clone(),
            stopped,
            error: o.error.map(|e| error_text(&e.to_string())),
            elapsed_seconds: o.elapsed_seconds,
            chunks_per_second: if o.elapsed_seconds > 0.0 {
                c.chunks as f64 / o.elapsed_seconds
            } else {
                0.0
            },
            exit_code: exit.code(),
        }
    }

    /// The summary of a run that failed before its stages ran (a service
    /// that cannot be reached, a model refused, the job's state unreadable):
    /// nothing was done or billed.
    pub fn before_work(job: &Job, info: Option<&BackendInfo>, error: &str, exit: Exit) -> Summary {
        let fallback;
        let info = if let Some(info) = info {
            info
        } else {
            fallback = BackendInfo {
                kind: crate::backend::info_kind(&job.backend),
                model: job.backend.shared.model.clone().unwrap_or_default(),
                dimensions: job.backend.shared.dimensions,
                context_window: None,
                input_per_1k: None,
                output_per_1k: None,
                other_input_per_1k: None,
                special_tokens: 0,
                max_inputs_per_request: None,
            };
            &fallback
        };
        let location = crate::state::StateLocation::for_job(job);
        let mut summary = Summary::new(&Outcome {
            job,
            output: job.output.state_stem(&job.name).display().to_string(),
            location: &location,
            info,
            read: &ReadReport::default(),
            dispatched: &Dispatched::default(),
            written: &Written::default(),
            stats: BackendStats::default(),
            earlier: Earlier::default(),
            bill: Bill::default(),
            limits: LearnedLimits::default(),
            warnings: Vec::new(),
            elapsed_seconds: 0.0,
            error: None,
        });
        summary.error = Some(error_text(error));
        summary.exit_code = exit.code();
        summary
    }

    /// Marks the run failed with `error`, after the fact.
    pub(super) fn fail(&mut self, error: &super::RunError) {
        self.error = Some(error_text(&error.to_string()));
        self.exit_code = error.exit().code();
    }

    /// The exit code the run calls for.
    pub fn exit(&self) -> Exit {
        match self.exit_code {
            0 => Exit::Success,
            2 => Exit::Usage,
            3 => Exit::Quarantined,
            4 => Exit::Stopped,
            _ => Exit::Failed,
        }
    }

    /// The human form.
    pub fn text(&self) -> String {
        let s = self;
        let mut out = match &s.stopped {
            None => format!(
                "{}: {} from {} written to {}\n",
                self.job_text(),
                counted(s.written, "chunk"),
                counted(s.documents, "document"),
                s.output
            ),
            Some(reason) => self.stopped_text(reason),
        };
        let _ = writeln!(
            out,
            "  model {} ({} backend), {} dimensions",
            s.model,
            s.backend,
            s.dimensions
                .map_or_else(|| "?".to_string(), |d| d.to_string())
        );
        self.service_text(&mut out);
        let _ = writeln!(
            out,
            "  chunks: {} embedded, {} reused from the last output, {} resumed, {}; \
             {} added, {} changed, {} unchanged, {} removed; {} saved",
            s.embedded,
            s.reused,
            s.resumed,
            counted(s.deduplicated, "repeat"),
            s.added,
            s.changed,
            s.unchanged,
            s.removed,
            counted(s.tokens_saved, "token")
        );
        self.skipped_text(&mut out);
        if let Some(batch) = &s.batch {
            batch_text(batch, &mut out);
        }
        if s.quarantined > 0 {
            let _ = writeln!(
                out,
                "  quarantined: {} (see {})",
                counted(s.quarantined, "chunk"),
                s.failures_file
            );
        }
        for warning in &s.warnings {
            let _ = writeln!(out, "  warning: {warning}");
        }
        let _ = writeln!(
            out,
            "  {:.1}s, {:.0} chunks/s",
            s.elapsed_seconds, s.chunks_per_second
        );
        out
    }

    /// The head of a stopped run's summary: why, what the checkpoint holds,
    /// and how to carry on.
    /// `docs`, or `docs (shard 1/4)`.
    fn job_text(&self) -> String {
        match self.shard {
            Some(shard) => format!("{} (shard {shard})", self.job),
            None => self.job.clone(),
        }
    }

    fn stopped_text(&self, reason: &str) -> String {
        let mut out = format!(
            "{}: {reason} before the end; {} is as it was\n",
            self.job_text(),
            self.output
        );
        let _ = writeln!(
            out,
            "  committed: {} in {} ({} from this run), kept for the next run",
            counted(self.committed, "vector"),
            self.checkpoint_dir,
            self.embedded
        );
        let carry_on = self
            .carry_on
            .clone()
            .unwrap_or_else(|| "run the job again".to_string());
        let _ = writeln!(
            out,
            "  to carry on: {carry_on} (only what is not committed is sent)"
        );
        out
    }

    /// Tokens, requests and what the service taught the run.
    fn service_text(&self, out: &mut String) {
        let s = self;
        let retries = format!(
            "{} ({} throttled, {})",
            count(s.retries, "retry", "retries"),
            s.throttled,
            counted(s.invalid_responses, "invalid response")
        );
        if s.backend == BackendKind::Local.to_string() {
            let _ = writeln!(
                out,
                "  tokens: {} counted locally; {}; the local model bills nothing",
                s.estimated_tokens,
                counted(s.requests, "request")
            );
        } else {
            let _ = writeln!(
                out,
                "  tokens: {} billed, {} estimated locally; {}, {retries}",
                s.usage.prompt_tokens,
                s.estimated_tokens,
                counted(s.requests, "request")
            );
            let _ = writeln!(
                out,
                "  rate: {:.1} requests and {:.0} tokens a minute on average; {} waiting for the quota",
                s.requests_per_minute,
                s.tokens_per_minute,
                crate::display::duration(s.quota_wait_seconds)
            );
            if let Some(c) = s.concurrency {
                let _ = writeln!(
                    out,
                    "  concurrency: auto, settled at {} in flight (range {}-{})",
                    c.settled, c.lowest, c.highest
                );
            }
            if let Some(cost) = s.cost {
                let _ = writeln!(out, "  cost: {cost:.6}");
            }
            // The window probe's vectors are dropped too, and said on their own line.
            let probe = s.learned_limits.window_probe.map_or(0, |p| p.tokens);
            if s.discarded_tokens > probe {
                let _ = writeln!(
                    out,
                    "  of the tokens billed, {} paid for vectors that failed a check and were sent again",
                    s.discarded_tokens - probe
                );
            }
        }
        if s.timeouts > 0 {
            let _ = writeln!(
                out,
                "  {} timed out; the service may have billed them too",
                counted(s.timeouts, "request")
            );
        }
        if !s.learned_limits.is_empty() {
            let l = &s.learned_limits;
            let mut parts = Vec::new();
            if let Some(n) = l.max_inputs_per_request {
                parts.push(format!("{n} inputs per request"));
            }
            if let Some(n) = l.max_tokens_per_request {
                parts.push(format!("{n} tokens per request"));
            }
            if let Some(n) = l.quota_tokens_per_request {
                parts.push(format!("{n} tokens per request for its token quota"));
            }
            if let Some(n) = l.concurrency {
                parts.push(format!("{n} requests in flight"));
            }
            if let Some(w) = l.context_window {
                let own = w
                    .server_tokens
                    .map_or(String::new(), |n| format!(", {n} of its own"));
                parts.push(format!("{} {} tokens a text{own}", w.tokens, s.tokenizer));
            }
            if !parts.is_empty() {
                let _ = writeln!(
                    out,
                    "  learned from the service: at most {}",
                    parts.join(", ")
                );
            }
            if let Some(n) = l.read_whole {
                let _ = writeln!(
                    out,
                    "  no window found: the service read a text of {n} {} tokens whole",
                    s.tokenizer
                );
            }
            if let Some(probe) = l.window_probe {
                let _ = writeln!(
                    out,
                    "  window probe: {}, {}",
                    counted(probe.requests, "request"),
                    counted(probe.tokens, "token")
                );
            }
        }
    }

    fn skipped_text(&self, out: &mut String) {
        let s = self;
        if s.skipped_null + s.skipped_empty > 0 {
            let _ = writeln!(
                out,
                "  skipped: {} null, {} empty {}",
                s.skipped_null,
                s.skipped_empty,
                if s.skipped_null + s.skipped_empty == 1 {
                    "text"
                } else {
                    "texts"
                }
            );
        }
        if s.skipped_files.count > 0 {
            let _ = writeln!(out, "  skipped {}", s.skipped_files.text());
        }
    }
}

/// An error as the summary keeps it: without the key, and of a sane length.
fn error_text(error: &str) -> String {
    let mut text = crate::secret::scrub(error).into_owned();
    crate::secret::truncate_chars(&mut text, MAX_ERROR_CHARS);
    text
}

/// The longest error a summary keeps.
const MAX_ERROR_CHARS: usize = 2000;

/// What `usage` cost at the model's prices, `probed` tokens of it billed
/// for the window probe's requests. In batch mode the model's price is the
/// batch one, and the probe's requests were synchronous: their tokens are
/// at the synchronous price, when it is known.
fn run_cost(info: &BackendInfo, usage: Usage, dispatched: &Dispatched, probed: u64) -> Option<f64> {
    let synchronous = if dispatched.batch.is_some() {
        probed
    } else {
        0
    };
    info.cost_with_other(usage, synchronous)
}

/// Batch mode's line: collected at the batch price, sent, pending.
fn batch_text(b: &super::BatchSummary, out: &mut String) {
    let price = |p: Option<f64>| p.map_or_else(|| "unknown".to_string(), |p| format!("${p}"));
    let _ = writeln!(
        out,
        "  batch mode: {} collected ({} stored, {} tokens billed at {} per 1k{}, sync {}), \
         {} created, {} adopted, {} pending ({})",
        count(b.collected.batches, "batch", "batches"),
        counted(b.collected.vectors, "vector"),
        b.collected.usage.prompt_tokens,
        price(b.input_per_1k),
        b.collected_cost
            .map_or_else(String::new, |c| format!(": ${c:.6}")),
        price(b.sync_input_per_1k),
        b.created,
        b.adopted,
        b.pending_batches,
        counted(b.pending_chunks, "chunk"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::RunError;

    fn job(dir: &std::path::Path) -> Job {
        let text = format!(
            "[source]\nkind = \"files\"\npaths = [\"unused\"]\n\
             [backend]\nkind = \"local\"\n\
             [output]\npath = \"{}\"\n",
            dir.join("docs.parquet").display()
        );
        crate::kinds::parse(&text, "docs", &[]).unwrap()
    }

    fn usage(tokens: u64) -> Usage {
        Usage {
            prompt_tokens: tokens,
            completion_tokens: 0,
            total_tokens: tokens,
        }
    }

    fn info(input_per_1k: Option<f64>) -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Api,
            model: "svc-embed-1".to_string(),
            dimensions: Some(1024),
            context_window: None,
            input_per_1k,
            output_per_1k: None,
            other_input_per_1k: None,
            special_tokens: 0,
            max_inputs_per_request: None,
        }
    }

    /// The summary of a run of `job` that read 2 documents into 5 chunks,
    /// sent 3 of them and wrote all 5, with what `change` makes of it.
    fn summary(
        job: &Job,
        change: impl FnOnce(&mut ReadReport, &mut Dispatched, &mut Written, &mut Earlier),
        error: Option<&RunError>,
    ) -> Summary {
        let mut read = ReadReport::default();
        read.source.documents = 2;
        read.counts.chunks = 5;
        read.counts.reused = 2;
        let mut dispatched = Dispatched {
            embedded: 3,
            ..Dispatched::default()
        };
        let mut written = Written {
            rows: Some(5),
            ..Written::default()
        };
        let mut earlier = Earlier::default();
        change(&mut read, &mut dispatched, &mut written, &mut earlier);
        let location = crate::state::StateLocation::for_job(job);
        Summary::new(&Outcome {
            job,
            output: "out/docs.parquet".to_string(),
            location: &location,
            info: &info(Some(0.02)),
            read: &read,
            dispatched: &dispatched,
            written: &written,
            stats: BackendStats {
                requests: 3,
                ..BackendStats::default()
            },
            earlier,
            bill: Bill {
                usage: usage(1500),
                ..Bill::default()
            },
            limits: LearnedLimits::default(),
            warnings: Vec::new(),
            elapsed_seconds: 2.0,
            error,
        })
    }

    #[test]
    fn the_exit_code_follows_the_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path());

        let done = summary(&job, |_, _, _, _| {}, None);
        assert_eq!((done.exit_code, done.exit()), (0, Exit::Success));
        assert_eq!(done.written, 5);
        assert_eq!(done.committed, 0);

        let quarantined = summary(&job, |_, _, w, _| w.quarantined = 1, None);
        assert_eq!(
            (quarantined.exit_code, quarantined.exit()),
            (3, Exit::Quarantined)
        );

        let stopped = summary(
            &job,
            |r, d, _, e| {
                d.stopped = Some("stopped by the time limit".to_string());
                r.counts.removed = 4;
                e.rows = 7;
            },
            None,
        );
        assert_eq!((stopped.exit_code, stopped.exit()), (4, Exit::Stopped));
        // What the checkpoint holds: earlier runs' vectors and this run's.
        assert_eq!(stopped.committed, 10);
        // Rows of the last output are not removed by a run that stopped.
        assert_eq!(stopped.removed, 0);

        let error = RunError::Internal("the writer stopped".to_string());
        let failed = summary(
            &job,
            |_, d, w, _| {
                d.stopped = Some("interrupted".to_string());
                w.quarantined = 1;
            },
            Some(&error),
        );
        assert_eq!((failed.exit_code, failed.exit()), (1, Exit::Failed));
        assert_eq!(failed.error.as_deref(), Some("the writer stopped"));

        let mut later = summary(&job, |_, _, _, _| {}, None);
        later.fail(&error);
        assert_eq!((later.exit_code, later.exit()), (1, Exit::Failed));
        assert_eq!(later.error.as_deref(), Some("the writer stopped"));
    }

    #[test]
    fn a_run_that_failed_before_work_did_and_billed_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path());
        let s = Summary::before_work(&job, None, "the service refused the key", Exit::Usage);
        assert_eq!((s.exit_code, s.exit()), (2, Exit::Usage));
        assert_eq!(s.error.as_deref(), Some("the service refused the key"));
        assert_eq!(s.backend, "local");
        assert_eq!((s.documents, s.written, s.requests), (0, 0, 0));
        assert_eq!(s.usage, Usage::default());

        let long = "x".repeat(MAX_ERROR_CHARS + 500);
        let s = Summary::before_work(&job, Some(&info(None)), &long, Exit::Failed);
        assert_eq!((s.exit_code, s.exit()), (1, Exit::Failed));
        assert_eq!(s.backend, "api");
        let kept = s.error.unwrap();
        // Cut, and the cut marked.
        assert_eq!(kept.chars().count(), MAX_ERROR_CHARS + 1);
        assert!(kept.ends_with("x…"), "{kept}");
    }

    #[test]
    fn an_unknown_exit_code_is_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = summary(&job(dir.path()), |_, _, _, _| {}, None);
        s.exit_code = 9;
        assert_eq!(s.exit(), Exit::Failed);
    }

    #[test]
    fn the_human_form_counts_what_the_run_did() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = summary(
            &job(dir.path()),
            |r, _, w, _| {
                r.source.skipped_null = 1;
                r.counts.deduplicated = 1;
                r.counts.added = 5;
                r.skipped_files = SkippedFiles {
                    count: 2,
                    first: vec!["a.bin".to_string(), "b.bin".to_string()],
                    ..SkippedFiles::default()
                };
                w.quarantined = 1;
            },
            None,
        );
        s.retries = 1;
        s.timeouts = 2;
        s.discarded_tokens = 100;
        s.warnings = vec!["the service sends no rate headers".to_string()];
        s.learned_limits = LearnedLimits {
            max_inputs_per_request: Some(16),
            max_tokens_per_request: None,
            quota_tokens_per_request: Some(640),
            concurrency: Some(2),
            ..LearnedLimits::default()
        };
        let text = s.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "docs: 5 chunks from 2 documents written to out/docs.parquet"
        );
        assert_eq!(
            lines[1],
            "  model svc-embed-1 (api backend), 1024 dimensions"
        );
        assert_eq!(
            lines[2],
            "  tokens: 1500 billed, 0 estimated locally; 3 requests, 1 retry (0 throttled, 0 invalid responses)"
        );
        assert_eq!(
            lines[3],
            "  rate: 90.0 requests and 45000 tokens a minute on average; 0.0s waiting for the quota"
        );
        assert_eq!(lines[4], "  cost: 0.030000");
        assert!(lines[5].starts_with("  of the tokens billed, 100 paid for vectors"));
        assert_eq!(
            lines[6],
            "  2 requests timed out; the service may have billed them too"
        );
        assert_eq!(
            lines[7],
            "  learned from the service: at most 16 inputs per request, \
             640 tokens per request for its token quota, 2 requests in flight"
        );
        assert_eq!(
            lines[8],
            "  chunks: 3 embedded, 2 reused from the last output, 0 resumed, 1 repeat; \
             5 added, 0 changed, 0 unchanged, 0 removed; 0 tokens saved"
        );
        assert_eq!(lines[9], "  skipped: 1 null, 0 empty text");
        assert_eq!(lines[10], format!("  skipped {}", s.skipped_files.text()));
        assert!(lines[10].contains("a.bin"), "{}", lines[10]);
        assert_eq!(
            lines[11],
            format!("  quarantined: 1 chunk (see {})", s.failures_file)
        );
        assert_eq!(lines[12], "  warning: the service sends no rate headers");
        assert_eq!(lines[13], "  2.0s, 2 chunks/s");
        assert_eq!(lines.len(), 14, "{text}");
    }

    #[test]
    fn a_text_read_whole_is_reported_in_the_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = summary(&job(dir.path()), |_, _, _, _| {}, None);
        assert!(!s.text().contains("read a text"), "{}", s.text());
        s.learned_limits.read_whole = Some(640);
        let text = s.text();
        assert!(
            text.lines().any(|line| line
                == format!(
                    "  no window found: the service read a text of 640 {} tokens whole",
                    s.tokenizer
                )),
            "{text}"
        );
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(value["learned_limits"]["read_whole"], 640);
    }

    #[test]
    fn the_concurrency_auto_settled_on_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = summary(&job(dir.path()), |_, _, _, _| {}, None);
        assert!(!s.text().contains("concurrency"), "{}", s.text());
        s.concurrency = Some(crate::rate::SettledConcurrency {
            settled: 12,
            lowest: 9,
            highest: 16,
        });
        let text = s.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[4],
            "  concurrency: auto, settled at 12 in flight (range 9-16)"
        );
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(
            value["concurrency"],
            serde_json::json!({"settled": 12, "lowest": 9, "highest": 16})
        );
    }

    #[test]
    fn the_local_backend_bills_nothing_and_learns_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = summary(&job(dir.path()), |_, _, _, _| {}, None);
        s.backend = BackendKind::Local.to_string();
        s.estimated_tokens = 42;
        let text = s.text();
        assert!(
            text.contains(
                "\n  tokens: 42 counted locally; 3 requests; the local model bills nothing\n"
            ),
            "{text}"
        );
        assert!(!text.contains("cost"), "{text}");
        assert!(!text.contains("learned"), "{text}");
        assert!(!text.contains("skipped"), "{text}");
    }

    #[test]
    fn a_stopped_run_says_what_is_kept_and_how_to_carry_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut job = job(dir.path());
        job.shard = Some(crate::job::Shard { index: 1, count: 4 });
        let mut s = summary(
            &job,
            |_, d, _, e| {
                d.stopped = Some("stopped by the budget".to_string());
                e.rows = 2;
            },
            None,
        );
        let text = s.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "docs (shard 1/4): stopped by the budget before the end; out/docs.parquet is as it was"
        );
        assert_eq!(
            lines[1],
            format!(
                "  committed: 5 vectors in {} (3 from this run), kept for the next run",
                s.checkpoint_dir
            )
        );
        assert_eq!(
            lines[2],
            "  to carry on: run the job again (only what is not committed is sent)"
        );
        s.carry_on = Some("embedjob run docs.toml --shard 1/4".to_string());
        assert!(s
            .text()
            .contains("  to carry on: embedjob run docs.toml --shard 1/4 (only"));
    }

    #[test]
    fn the_json_form_has_the_documented_keys() {
        let dir = tempfile::tempdir().unwrap();
        let mut job = job(dir.path());
        let s = summary(&job, |_, _, _, _| {}, None);
        let value = serde_json::to_value(&s).unwrap();
        let object = value.as_object().unwrap();
        for key in [
            "job",
            "output",
            "backend",
            "model",
            "dimensions",
            "documents",
            "skipped_null",
            "skipped_empty",
            "skipped_files",
            "chunks",
            "written",
            "quarantined",
            "embedded",
            "reused",
            "resumed",
            "deduplicated",
            "added",
            "changed",
            "unchanged",
            "removed",
            "estimated_tokens",
            "tokens_saved",
            "usage",
            "discarded_tokens",
            "billed_token_ratio",
            "resumed_usage",
            "requests",
            "retries",
            "invalid_responses",
            "throttled",
            "quota_wait_seconds",
            "requests_per_minute",
            "tokens_per_minute",
            "timeouts",
            "cost",
            "learned_limits",
            "concurrency",
            "warnings",
            "stopped",
            "committed",
            "error",
            "elapsed_seconds",
            "chunks_per_second",
            "exit_code",
        ] {
            assert!(object.contains_key(key), "no {key:?} in {value}");
        }
        // What is only for people stays out, and the shard only when there is one.
        for key in ["failures_file", "checkpoint_dir", "carry_on", "shard"] {
            assert!(!object.contains_key(key), "{key:?} in {value}");
        }
        assert_eq!(value["usage"]["prompt_tokens"], 1500);
        assert_eq!(value["skipped_files"]["count"], 0);
        assert_eq!(
            value["learned_limits"]["concurrency"],
            serde_json::Value::Null
        );
        assert_eq!(value["exit_code"], 0);
        assert_eq!(value["cost"], 0.03);

        job.shard = Some(crate::job::Shard { index: 0, count: 2 });
        let s = summary(&job, |_, _, _, _| {}, None);
        assert_eq!(serde_json::to_value(&s).unwrap()["shard"], "0/2");
    }

    #[test]
    fn the_cost_needs_a_price() {
        let usage = usage(2500);
        assert_eq!(info(None).cost(usage), None);
        assert_eq!(info(Some(0.0)).cost(usage), Some(0.0));
        let priced = info(Some(0.02)).cost(usage).unwrap();
        assert!((priced - 0.05).abs() < 1e-12, "{priced}");
        assert_eq!(info(Some(f64::INFINITY)).cost(usage), None);
        assert!((per_minute(30, 60.0) - 30.0).abs() < 1e-12);
        assert!(per_minute(30, 0.0).abs() < f64::EPSILON);
    }

    #[test]
    fn tokens_sent_the_other_way_are_at_its_price_when_it_is_known() {
        let usage = usage(2500);
        // Batch mode at 0.01, the probe's 500 tokens at the synchronous 0.02.
        let batch = BackendInfo {
            other_input_per_1k: Some(0.02),
            ..info(Some(0.01))
        };
        let priced = batch.cost_with_other(usage, 500).unwrap();
        assert!(
            (priced - (2.0 * 0.01 + 0.5 * 0.02)).abs() < 1e-12,
            "{priced}"
        );
        // No more than the usage is at the other price.
        let all = batch.cost_with_other(usage, 9000).unwrap();
        assert!((all - 2.5 * 0.02).abs() < 1e-12, "{all}");
        // Without the other price, every token is at the run's.
        let unknown = info(Some(0.01)).cost_with_other(usage, 500).unwrap();
        assert!((unknown - 0.025).abs() < 1e-12, "{unknown}");
        assert_eq!(info(None).cost_with_other(usage, 500), None);
    }
}
