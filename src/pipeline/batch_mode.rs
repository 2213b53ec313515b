//! `backend.mode = "batch"`, wired into a run: before the stages start, the
//! job's own batches are adopted and those that ended are collected into
//! the checkpoint ([`collect`]); the reading stage then finds their vectors
//! stored, and what it still has to send is written to request files
//! ([`submit`]) and sent as new batches ([`enqueue`]). A run that leaves
//! anything on the service stops, resumable (exit 4), with the output as it
//! was; the run that finds nothing pending finishes the output.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::collect::{collect, BatchSummary};
use super::dispatch::Dispatched;
use super::enqueue::{adopt, forget_lost_uploads, send, Tag};
use super::submit::{FileLimits, RequestBody, Submit, SubmitBudget};
use super::write::SinkMessage;
use super::RunError;
use crate::backend::api::BatchService;
use crate::backend::BackendStats;
use crate::batch::Batch;
use crate::state::batches::BatchRecord;
use crate::state::{Fingerprint, JobState};

/// What the batch stages work with, once collection is done.
pub(super) struct BatchMode {
    service: Arc<BatchService>,
    dir: PathBuf,
    tag: Tag,
    record: BatchRecord,
    summary: BatchSummary,
    /// `budget.max_cost`.
    max_cost: Option<f64>,
}

impl BatchMode {
    /// In batch mode (`service`), adopts and collects.
    pub(super) async fn start(
        service: Option<Arc<BatchService>>,
        job: &crate::job::Job,
        fingerprint: &Fingerprint,
        state: &mut JobState,
        options: &super::RunOptions,
    ) -> Result<Option<BatchMode>, RunError> {
        match service {
            Some(service) => Ok(Some(
                Self::collect(service, job, fingerprint, state, options).await?,
            )),
            None => Ok(None),
        }
    }

    /// Adopts and collects before the run reads anything; the parts
    /// committed are then listed for reuse.
    pub(super) async fn collect(
        service: Arc<BatchService>,
        job: &crate::job::Job,
        fingerprint: &Fingerprint,
        state: &mut JobState,
        options: &super::RunOptions,
    ) -> Result<BatchMode, RunError> {
        let dir = state.batch_dir()?;
        let mut record = BatchRecord::load(&dir)?;
        let tag = Tag::new(&job.name, fingerprint);
        let adopted = adopt(&service, &tag, &dir, &mut record).await?;
        let forgotten = forget_lost_uploads(&service, &tag, &record).await?;
        if forgotten > 0 {
            options.warnings.warn(format!(
                "deleted {} on the service uploaded by an earlier run that never recorded it; \
                 it is uploaded again",
                crate::display::count(forgotten, "request file", "request files")
            ));
        }
        let mut parts = state.part_writer(
            &service.model,
            &crate::backend::BackendKind::Api.to_string(),
            super::output_row_group_bytes(job),
        );
        let collected = collect(&service, &dir, &mut record, &mut parts, state.parts()).await?;
        state.relist_parts()?;
        for warning in &collected.warnings {
            options.warnings.warn(warning.clone());
        }
        let summary = BatchSummary {
            input_per_1k: service.input_per_1k,
            sync_input_per_1k: service.sync_input_per_1k,
            collected_cost: service
                .input_per_1k
                .map(|price| collected.usage.prompt_tokens as f64 / 1000.0 * price),
            collected,
            adopted,
            ..BatchSummary::default()
        };
        Ok(BatchMode {
            service,
            dir,
            tag,
            record,
            summary,
            max_cost: job.budget.max_cost,
        })
    }

    /// The sending stage: request files from the reader's batches, then
    /// their batches created. Ends as a resumable stop while anything is
    /// left on the service.
    pub(super) async fn submit(
        self,
        batches: mpsc::Receiver<Result<Batch, RunError>>,
        sink: &mpsc::Sender<SinkMessage>,
        earlier: (Option<f64>, &BackendStats),
    ) -> Dispatched {
        let mut dispatched = Dispatched::default();
        match self.run(batches, sink, earlier).await {
            Ok((summary, over_budget)) => {
                let pending = summary.pending_batches > 0 || summary.held_back_chunks > 0;
                dispatched.stopped = match over_budget {
                    // Worded as the synchronous path's budget stop, then what waits.
                    Some(why) if summary.pending_batches > 0 => {
                        Some(format!("{why}; {}", pending_text(&summary)))
                    }
                    Some(why) => Some(why),
                    None => pending.then(|| pending_text(&summary)),
                };
                dispatched.batch = Some(summary);
            }
            Err(e) => dispatched.failure = Some(e),
        }
        dispatched
    }

    async fn run(
        self,
        batches: mpsc::Receiver<Result<Batch, RunError>>,
        sink: &mpsc::Sender<SinkMessage>,
        (previous_ratio, stats): (Option<f64>, &BackendStats),
    ) -> Result<(BatchSummary, Option<String>), RunError> {
        let (held, probed) = (stats.probe_held, stats.window_probe.map(|p| p.tokens));
        let BatchMode {
            service,
            dir,
            tag,
            record,
            mut summary,
            max_cost,
        } = self;
        let cap = match (service.max_enqueued_tokens, record.learned_cap) {
            (Some(set), Some(learned)) => Some(set.min(learned)),
            (set, learned) => set.or(learned),
        };
        let stage = Submit {
            pending: record.pending_keys(&dir)?,
            dir: dir.clone(),
            record,
            body: RequestBody {
                model: service.model.clone(),
                dimensions: service.dimensions,
            },
            limits: FileLimits::default(),
            cap,
            budget: max_cost.map(|max_cost| SubmitBudget {
                max_cost,
                // A line is billed in the service's count: the job's last
                // run recorded its ratio to the local one (a finite, positive
                // ratio, as `recall` reads it).
                per_token: service.input_per_1k.unwrap_or(0.0) / 1000.0
                    * previous_ratio.unwrap_or(1.0),
                // What was collected, and the window probe's synchronous
                // requests, at the synchronous price.
                billed: summary.collected_cost.unwrap_or(0.0)
                    + service
                        .sync_input_per_1k
                        .zip(probed)
                        .map_or(0.0, |(price, tokens)| tokens as f64 / 1000.0 * price),
                spent: held.map(|held| held.stop(max_cost, &service.model)),
            }),
        };
        let sink = sink.clone();
        let (mut record, submitted) =
            tokio::task::spawn_blocking(move || stage.run(batches, &sink))
                .await
                .map_err(|e| RunError::stage_stopped("submitting", &e))??;
        let sent = send(&service, &tag, &dir, &mut record).await?;
        summary.collected.warnings.extend(sent.warnings);
        summary.created = sent.created;
        summary.adopted += sent.adopted;
        summary.submitted_chunks = submitted.written;
        summary.held_back_chunks = submitted.held_back;
        summary.pending_batches = record.live().count() as u64;
        summary.pending_chunks = record.live().map(|p| p.inputs).sum();
        summary.window_ends_at = record.live().filter_map(|p| p.expires_at).max();
        summary.enqueued_token_cap = cap;
        Ok((summary, submitted.over_budget))
    }
}

/// Why a run that leaves batches pending stops: what waits, and until when.
fn pending_text(s: &BatchSummary) -> String {
    let mut what = vec![crate::display::count(s.pending_chunks, "chunk", "chunks")];
    if let Some(end) = s.window_ends_at {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(end);
        what.push(format!(
            "window ending by {}",
            humantime::format_rfc3339_seconds(at)
        ));
    }
    if s.held_back_chunks > 0 {
        what.push(format!(
            "{} more to send as they end",
            crate::display::count(s.held_back_chunks, "chunk", "chunks")
        ));
    }
    format!(
        "waiting for {} on the service in batch mode ({})",
        crate::display::count(s.pending_batches, "batch", "batches"),
        what.join(", ")
    )
}
