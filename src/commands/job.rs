//! The commands that take a job file: `run` and `estimate`.

use tokio::sync::watch;

use super::{messages, print_json, Outcome};
use crate::backend::{Embedding, RecordedWindow};
use crate::cli::{EstimateArgs, RunArgs};
use crate::exit::{Exit, Failure};
use crate::pipeline::{Classifier, Failed, Rechunker, RunOptions, StopRequest, Summary};
use crate::state::{Fingerprint, JobState, Settled, StateError, StateLocation};

pub async fn run(args: &RunArgs) -> Outcome {
    let mut overrides = args.job.overrides.clone();
    if let Some(cost) = args.max_cost {
        overrides.push(format!("budget.max_cost={cost:?}"));
    }
    let job = load(&args.job.job, &overrides, args.shard.as_deref())?;
    if job.shard.is_none() && whole_over_shards(&job)?.is_some() {
        return Err(Failure::usage(anyhow::anyhow!(
            "`output.path` {} is the directory of a split job's shards: run each shard \
             with --shard I/N, or give the job another `output.path`",
            job.output.state_stem(&job.name).display()
        )));
    }
    // Claimed by a run only: an estimate changes nothing.
    if let (Some(shard), Some(file)) = (job.shard, job.output.params.output_file()) {
        shard
            .claim(crate::fsio::parent_dir(file))
            .map_err(|e| Failure::usage(anyhow::anyhow!(e)))?;
    }
    let deadline = args.max_duration.map(|d| std::time::Instant::now() + d);
    let mut interval: Option<std::time::Duration> = None;
    // With --wait, the budget is the whole invocation's: each run gets what the earlier left.
    let mut this_run = job.clone();
    let mut summary = loop {
        let (summary, poll) = run_once(args, &this_run).await?;
        if let (Some(max), Some(spent)) = (
            this_run.budget.max_cost,
            summary.batch.as_ref().and_then(|b| b.collected_cost),
        ) {
            this_run.budget.max_cost = Some((max - spent).max(0.0));
        }
        let pending = summary.batch.as_ref().map_or(0, |b| b.pending_batches);
        let (true, Some(poll)) = (args.wait && pending > 0 && summary.error.is_none(), poll) else {
            break summary;
        };
        // Backing off: twice as long each time, up to ten minutes.
        let wait = interval.map_or(poll, |i| (i * 2).min(std::time::Duration::from_secs(600)));
        interval = Some(wait);
        let wait = match deadline {
            Some(end) => match end.checked_duration_since(std::time::Instant::now()) {
                Some(left) if !left.is_zero() => wait.min(left),
                _ => break summary,
            },
            None => wait,
        };
        if !args.quiet {
            messages::note(&format!(
                "{}; looking again in {}",
                summary.stopped.as_deref().unwrap_or("batches pending"),
                humantime::format_duration(std::time::Duration::from_secs(wait.as_secs().max(1)))
            ));
        }
        let mut stop = stop_on_signals();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => break summary,
        }
    };
    summary.carry_on = Some(carry_on_command(args, job.shard));
    if args.json {
        print_json(&serde_json::to_value(&summary).map_err(Failure::failed)?)?;
    } else {
        print!("{}", crate::secret::scrub(&summary.text()));
    }
    Ok(summary.exit())
}

/// One run of the job: its stages built, its state opened, the pipeline
/// driven; with the first interval between polls in batch mode.
async fn run_once(
    args: &RunArgs,
    job: &crate::job::Job,
) -> Result<(Summary, Option<std::time::Duration>), Failure> {
    // The lock first, where a run may hold it: one that overlaps another
    // asks the service nothing (a window probe it sent would be paid for
    // and lost). Where the lock's directory is not there yet, no run holds
    // it, and a run that fails before its work creates nothing.
    let location = StateLocation::for_job(job);
    let lock_path = location.lock();
    let lock_dir = lock_path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let lock = if lock_dir.is_dir() {
        match JobState::lock(&location) {
            Ok(lock) => Some(lock),
            Err(e) => return Err(failed_before_work(job, None, state_failure(e), args.json)),
        }
    } else {
        None
    };
    let built = async {
        if !args.fresh {
            check_settled(job, &location).await?;
        }
        crate::pipeline::build(job).await
    };
    let stages = match built.await {
        Ok(stages) => stages,
        Err(failure) => {
            // The summary of a run that failed is written under the lock.
            drop(lock);
            return Err(failed_before_work(job, None, failure, args.json));
        }
    };
    messages::follow(&stages.backend.notices());
    messages::warn_all(stages.backend.warnings());
    let info = stages.backend.info().clone();
    if job.budget.max_cost.is_some() && info.input_per_1k.is_none() {
        let failure = Failure::usage(anyhow::anyhow!(
            "`budget.max_cost` is set, but model {} has no price to count it with",
            info.model
        ));
        drop(lock);
        return Err(failed_before_work(job, Some(&info), failure, args.json));
    }
    let options = RunOptions {
        progress: !args.quiet,
        fresh: args.fresh,
        max_duration: args.max_duration,
        stop: Some(stop_on_signals()),
        warnings: messages::printed(),
    };
    let fingerprint = Fingerprint::new(job, &info.model, info.dimensions, info.chunk_window());
    let opened = match lock {
        Some(lock) => JobState::open_locked(&job.name, location, lock, &fingerprint, args.fresh),
        None => JobState::open(&job.name, location, &fingerprint, args.fresh),
    };
    let state = match opened {
        Ok(state) => state,
        Err(e) => {
            return Err(failed_before_work(
                job,
                Some(&info),
                state_failure(e),
                args.json,
            ))
        }
    };
    messages::warn_all(state.warnings());
    if let (Some(previous), true) = (state.taken_over(), options.progress) {
        messages::note(&format!(
            "{}: taking over from a run that is gone ({previous})",
            state.location().lock().display()
        ));
    }
    let poll = stages.backend.batch().map(|service| service.poll);
    let summary = match crate::pipeline::execute(job, stages, state, options).await {
        Ok(summary) => summary,
        Err(Failed { error, summary }) => {
            if args.json {
                print_json(&serde_json::to_value(&summary).map_err(Failure::failed)?)?;
            }
            return Err(Failure {
                exit: error.exit(),
                error: error.into(),
            });
        }
    };
    Ok((summary, poll))
}

/// Refuses a job file changed since its checkpoint was started or its
/// output made, before the service is asked anything (see
/// [`crate::state::check_settled`]): a model lookup and a window probe would
/// be paid for, and the run refused after them.
async fn check_settled(job: &crate::job::Job, location: &StateLocation) -> Result<(), Failure> {
    // An output that cannot be read yet is the sink's to report.
    let recorded = crate::sink::recorded(&job.output, job.shard)
        .await
        .unwrap_or_default();
    let output = job.output.params.output_file().map_or_else(
        || format!("the {} output", job.output.params.kind()),
        |file| file.display().to_string(),
    );
    crate::state::check_settled(location, &Settled::of(job), (&output, &recorded))
        .map_err(state_failure)
}

/// Loads the job file, and with `--shard`, makes the job that shard of it.
fn load(
    path: &std::path::Path,
    overrides: &[String],
    shard: Option<&str>,
) -> Result<crate::job::Job, Failure> {
    let mut job = crate::kinds::load(path, overrides).map_err(Failure::usage)?;
    let Some(spec) = shard else {
        return Ok(job);
    };
    let shard = crate::job::shard::parse(spec, |name| std::env::var(name).ok())
        .map_err(|e| Failure::usage(anyhow::anyhow!(e)))?;
    job.split(shard).map_err(|problems| {
        Failure::usage(crate::job::JobErrors {
            file: path.to_path_buf(),
            problems,
        })
    })?;
    Ok(job)
}

/// For a job not split, whose output holds the outputs of a split job's
/// shards (a Parquet `output.path` that is a directory): how many shards.
fn whole_over_shards(job: &crate::job::Job) -> Result<Option<u32>, Failure> {
    job.output
        .params
        .shards_held()
        .map_err(|e| Failure::usage(anyhow::anyhow!(e)))
}

/// The job as each of its shards runs it: the job itself, unless it is not
/// split and its output is the directory of a split job's shards.
fn parts_of(job: &crate::job::Job) -> Result<Vec<crate::job::Job>, Failure> {
    let Some(count) = whole_over_shards(job)?.filter(|_| job.shard.is_none()) else {
        return Ok(vec![job.clone()]);
    };
    (0..count)
        .map(|index| {
            let mut part = job.clone();
            let shard = crate::job::Shard { index, count };
            part.split(shard)
                .map_err(|problems| Failure::usage(anyhow::anyhow!(problems.join("; "))))?;
            Ok(part)
        })
        .collect()
}

/// The command that runs the job again as `args` did, less `--fresh` (which
/// would throw away what the stopped run committed) and the output flags.
fn carry_on_command(args: &RunArgs, job_shard: Option<crate::job::Shard>) -> String {
    let mut words = vec![
        "embedjob".to_string(),
        "run".to_string(),
        shell_word(&args.job.job.to_string_lossy()),
    ];
    for assignment in &args.job.overrides {
        words.push("--set".to_string());
        words.push(shell_word(assignment));
    }
    if let Some(cost) = args.max_cost {
        words.push(format!("--max-cost {cost}"));
    }
    if let Some(shard) = job_shard {
        words.push(format!("--shard {shard}"));
    }
    if let Some(limit) = args.max_duration {
        let limit = humantime::format_duration(limit)
            .to_string()
            .replace(' ', "");
        words.push(format!("--max-duration {limit}"));
    }
    words.join(" ")
}

/// `word` as a shell reads it back: quoted when it holds anything but
/// plain characters.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A run that failed before its stages ran replaces the summary an earlier
/// run left, so that it is not taken for this one's; the summary is printed
/// with `--json`. When another run of the job holds its state, that run's
/// summary is left alone; when there is none, none is written (nothing was
/// done, and no directory is made for it).
fn failed_before_work(
    job: &crate::job::Job,
    info: Option<&crate::backend::BackendInfo>,
    failure: Failure,
    json: bool,
) -> Failure {
    let held_elsewhere = matches!(
        failure.error.downcast_ref::<StateError>(),
        Some(StateError::Locked { .. })
    );
    if held_elsewhere {
        return failure;
    }
    let summary = Summary::before_work(job, info, &format!("{:#}", failure.error), failure.exit);
    let Ok(value) = serde_json::to_value(&summary) else {
        return failure;
    };
    let location = StateLocation::for_job(job);
    if location.summary().exists() {
        if let Err(e) = crate::state::write_summary_unlocked(&location, &value) {
            messages::warn(&format!(
                "the summary of this run could not be written: {e}"
            ));
        }
    }
    if json {
        if let Err(e) = print_json(&value) {
            return e;
        }
    }
    failure
}

/// The first SIGINT or SIGTERM asks the run to stop after the requests in
/// flight; a second one, at once.
fn stop_on_signals() -> watch::Receiver<StopRequest> {
    let (tx, rx) = watch::channel(StopRequest::Running);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        let mut received = 0;
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            received += 1;
            let request = if received == 1 {
                messages::note(&format!(
                    "{name}: stopping after the requests in flight (again to stop at once)"
                ));
                StopRequest::Graceful(format!("stopped by {name}"))
            } else {
                StopRequest::Now(format!("stopped by {name}"))
            };
            if tx.send(request).is_err() {
                return;
            }
        }
    });
    rx
}

pub async fn estimate(args: &EstimateArgs) -> Outcome {
    let mut job = load(&args.job.job, &args.job.overrides, args.shard.as_deref())?;
    // An estimate sends nothing that is billed: a run probes for a window nobody lists.
    if let Some(api) = job
        .backend
        .params
        .as_any_mut()
        .downcast_mut::<crate::backend::api::ApiParams>()
    {
        api.probe_window = false;
    }
    // The run's own set-up: the same key checks, model listing and chunker.
    let Embedding { backend, chunker } = crate::backend::build(&job).await?;
    let info = backend.info().clone();
    messages::follow(&backend.notices());
    let warnings = backend.warnings();
    messages::warn_all(&warnings);
    let price_source = backend.price_source();
    let sync_price = backend.batch().map(|service| service.sync_input_per_1k);
    let fresh = args.fresh;
    // A job not split, over a directory of shards: what all of them hold.
    let parts = parts_of(&job)?;
    let shards = (parts.len() > 1).then_some(parts.len() as u64);
    let mut sinks = Vec::with_capacity(parts.len());
    for part in &parts {
        let sink = crate::sink::open(&part.output, part.shard)
            .await
            .map_err(crate::sink::failure)?;
        sinks.push(sink);
    }
    let estimate = tokio::task::spawn_blocking(move || {
        // What a run would reuse, found as the run finds it, without its lock or clean-up.
        let fingerprint = Fingerprint::new(&job, &info.model, info.dimensions, info.chunk_window());
        let mut reuse = crate::state::Reuse::default();
        let mut ratio = None;
        let mut pieces = None;
        let mut keeps_rows = false;
        let tokenizer = crate::backend::tokenizer_name(&job.chunking);
        for (part, sink) in parts.iter().zip(&sinks) {
            let held = sink.held().map_err(Failure::failed)?;
            ratio = ratio.or_else(|| {
                held.as_ref()
                    .and_then(|held| learned_ratio(held.metadata(), &fingerprint))
            });
            // The chunks the last run cut mid-run, cut as a run would cut them.
            if let Some(held) = held.as_ref().filter(|_| !fresh) {
                let recorded = RecordedWindow::of_output(held.metadata(), &info.model, tokenizer);
                pieces = pieces.or(recorded.pieces);
            }
            let held = if fresh { None } else { held };
            let location = StateLocation::for_job(part);
            crate::state::peek_into(&mut reuse, &part.name, &location, &fingerprint, held, fresh)
                .map_err(state_failure)?;
            messages::warn_all(reuse.warnings.drain(..));
            keeps_rows = sink.keeps_rows();
        }
        let mut warnings = warnings;
        if ratio.is_none() {
            let unknown = crate::estimate::unknown_count_warning(&info, tokenizer);
            messages::warn_all(&unknown);
            warnings.extend(unknown);
        }
        let rechunk = Rechunker::new(std::sync::Arc::clone(&chunker), pieces);
        let classifier = Classifier::new(reuse.store, reuse.held_ids, keeps_rows)
            .cutting(std::sync::Arc::new(rechunk));
        crate::estimate::estimate(&job, chunker.as_ref(), &info, classifier)
            .map(|e| crate::estimate::Estimate {
                warnings,
                price_source,
                shards,
                ..e.with_billed_ratio(ratio).with_sync_price(sync_price)
            })
            .map_err(|e| Failure {
                exit: e.exit(),
                error: e.into(),
            })
    })
    .await
    .map_err(|e| Failure::failed(anyhow::anyhow!("the estimate stopped unexpectedly: {e}")))??;
    if args.json {
        print_json(&serde_json::to_value(&estimate).map_err(Failure::failed)?)?;
    } else {
        print!(
            "{}",
            crate::secret::scrub(&crate::estimate::table(&estimate))
        );
    }
    Ok(Exit::Success)
}

/// The ratio of billed to local tokens the job's last output recorded, when
/// it was made under the same fingerprint (the same tokenizer and model).
fn learned_ratio(
    metadata: &std::collections::BTreeMap<String, String>,
    fingerprint: &Fingerprint,
) -> Option<f64> {
    let made_under = Fingerprint::from_json(metadata.get(crate::contract::FINGERPRINT_KEY)?)?;
    if !fingerprint.differences(&made_under).is_empty() {
        return None;
    }
    metadata
        .get(crate::contract::TOKEN_RATIO_KEY)?
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r > 0.0)
}

fn state_failure(e: StateError) -> Failure {
    Failure::found(e.is_found_before_work(), e)
}
