//! What a run did: the [`Summary`] printed with `--json`, written to the
//! job's state and shown to people, and the exit code it calls for.

use std::fmt::Write as _;

use serde::Serialize;

use super::dispatch::Dispatched;
use super::read::ReadReport;
use super::write::Written;
use crate::backend::{BackendInfo, BackendStats};
use crate::exit::Exit;
use crate::job::Job;
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
    pub output: String,
    pub backend: String,
    pub model: String,
    pub dimensions: Option<usize>,
    pub documents: u64,
    pub skipped_null: u64,
    pub skipped_empty: u64,
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
    pub usage: Usage,
    /// Billed by earlier, unfinished runs for vectors this run reused.
    pub resumed_usage: Usage,
    pub requests: u64,
    pub retries: u64,
    pub invalid_responses: u64,
    pub throttled: u64,
    pub cost: Option<f64>,
    /// Why the run stopped before the end, when it did.
    pub stopped: Option<String>,
    /// Why the run failed, when it did (`exit_code` 1, or 2 for a problem
    /// found before any work); `usage`, `requests` and `cost` are then what
    /// it was billed before it failed, kept in the checkpoint.
    pub error: Option<String>,
    pub elapsed_seconds: f64,
    pub chunks_per_second: f64,
    pub exit_code: u8,
}

/// Everything a finished run reports, gathered from its stages.
pub(super) struct Outcome<'a> {
    pub job: &'a str,
    pub output: String,
    pub info: &'a BackendInfo,
    pub read: &'a ReadReport,
    pub dispatched: &'a Dispatched,
    pub written: &'a Written,
    pub stats: BackendStats,
    pub earlier: Earlier,
    pub elapsed_seconds: f64,
    pub error: Option<&'a super::RunError>,
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
            job: o.job.to_string(),
            output: o.output.clone(),
            backend: o.info.kind.to_string(),
            model: o.info.model.clone(),
            dimensions: o.written.dimensions.or(o.info.dimensions),
            documents: o.read.source.documents,
            skipped_null: o.read.source.skipped_null,
            skipped_empty: o.read.source.skipped_empty,
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
            usage: o.dispatched.usage,
            resumed_usage: o.earlier.usage,
            requests: o.stats.requests,
            retries: o.stats.retries,
            invalid_responses: o.stats.invalid_responses,
            throttled: o.stats.throttled,
            cost: cost(o.info, o.dispatched.usage),
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
                kind: job.backend.kind(),
                model: job.backend.shared.model.clone().unwrap_or_default(),
                dimensions: job.backend.shared.dimensions,
                context_window: None,
                input_per_1k: None,
            };
            &fallback
        };
        let mut summary = Summary::new(&Outcome {
            job: &job.name,
            output: job.output.state_stem().display().to_string(),
            info,
            read: &ReadReport::default(),
            dispatched: &Dispatched::default(),
            written: &Written::default(),
            stats: BackendStats::default(),
            earlier: Earlier::default(),
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
        let mut out = format!(
            "{job}: {written} chunks from {documents} documents written to {output}\n",
            job = s.job,
            written = s.written,
            documents = s.documents,
            output = s.output
        );
        let _ = writeln!(
            out,
            "  model {} ({} backend), {} dimensions",
            s.model,
            s.backend,
            s.dimensions
                .map_or_else(|| "?".to_string(), |d| d.to_string())
        );
        let _ = writeln!(
            out,
            "  tokens: {} billed, {} estimated locally; {} requests, {} retries ({} throttled, {} invalid responses)",
            s.usage.prompt_tokens, s.estimated_tokens, s.requests, s.retries, s.throttled, s.invalid_responses
        );
        if let Some(cost) = s.cost {
            let _ = writeln!(out, "  cost: {cost:.6}");
        }
        let _ = writeln!(
            out,
            "  chunks: {} embedded, {} reused from the last output, {} resumed, {} repeats; \
             {} added, {} changed, {} unchanged, {} removed; {} tokens saved",
            s.embedded,
            s.reused,
            s.resumed,
            s.deduplicated,
            s.added,
            s.changed,
            s.unchanged,
            s.removed,
            s.tokens_saved
        );
        if let Some(reason) = &s.stopped {
            let _ = writeln!(
                out,
                "  {reason}: what was done is kept; run the job again to carry on"
            );
        }
        if s.skipped_null + s.skipped_empty > 0 {
            let _ = writeln!(
                out,
                "  skipped: {} null, {} empty texts",
                s.skipped_null, s.skipped_empty
            );
        }
        if s.quarantined > 0 {
            let _ = writeln!(
                out,
                "  quarantined: {} chunks (see {}.failures.jsonl)",
                s.quarantined, s.output
            );
        }
        let _ = writeln!(
            out,
            "  {:.1}s, {:.0} chunks/s",
            s.elapsed_seconds, s.chunks_per_second
        );
        out
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

/// What `usage` costs at the model's price, when it has one.
pub(super) fn cost(info: &BackendInfo, usage: Usage) -> Option<f64> {
    info.input_per_1k
        .map(|price| usage.prompt_tokens as f64 / 1000.0 * price)
        .filter(|cost| cost.is_finite())
}
