//! The commands that take a job file: `run` and `estimate`.

use tokio::sync::watch;

use super::{print_json, Outcome};
use crate::cli::{EstimateArgs, RunArgs};
use crate::exit::{Exit, Failure};
use crate::pipeline::{Classifier, Failed, RunOptions, StopRequest, Summary};
use crate::stages::Embedding;
use crate::state::{Fingerprint, JobState, StateError, StateLocation};

pub async fn run(args: &RunArgs) -> Outcome {
    let mut overrides = args.job.overrides.clone();
    if let Some(cost) = args.max_cost {
        overrides.push(format!("budget.max_cost={cost:?}"));
    }
    let job = crate::job::load(&args.job.job, &overrides).map_err(Failure::usage)?;
    let stages = match crate::stages::build(&job).await {
        Ok(stages) => stages,
        Err(failure) => return Err(failed_before_work(&job, None, failure, args.json)),
    };
    let info = stages.backend.info().clone();
    if job.budget.max_cost.is_some() && info.input_per_1k.is_none() {
        let failure = Failure::usage(anyhow::anyhow!(
            "`budget.max_cost` is set, but model {} has no price to count it with",
            info.model
        ));
        return Err(failed_before_work(&job, Some(&info), failure, args.json));
    }
    let options = RunOptions {
        progress: !args.quiet,
        fresh: args.fresh,
        max_duration: args.max_duration,
        stop: Some(stop_on_signals()),
    };
    let fingerprint = Fingerprint::new(&job, &info);
    let state = match JobState::open(
        &job.name,
        StateLocation::for_job(&job),
        &fingerprint,
        args.fresh,
    ) {
        Ok(state) => state,
        Err(e) => {
            return Err(failed_before_work(
                &job,
                Some(&info),
                state_failure(e),
                args.json,
            ))
        }
    };
    if let (Some(previous), true) = (state.taken_over(), options.progress) {
        eprintln!(
            "embedjob: {}: taking over from a run that is gone ({previous})",
            state.location().lock().display()
        );
    }
    let summary = match crate::pipeline::execute(&job, stages, state, options).await {
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
    if args.json {
        print_json(&serde_json::to_value(&summary).map_err(Failure::failed)?)?;
    } else {
        print!("{}", crate::secret::scrub(&summary.text()));
    }
    Ok(summary.exit())
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
            crate::progress::warn(&format!(
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
                eprintln!(
                    "embedjob: {name}: stopping after the requests in flight (again to stop at once)"
                );
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
    let job = crate::job::load(&args.job.job, &args.job.overrides).map_err(Failure::usage)?;
    // The run's own set-up: the same key checks, model listing and chunker.
    let Embedding { backend, chunker } = crate::stages::build_embedding(&job).await?;
    let info = backend.info().clone();
    let fresh = args.fresh;
    let estimate = tokio::task::spawn_blocking(move || {
        // What a run would reuse, found as the run finds it, without its lock or clean-up.
        let sink = crate::sink::open(&job.output);
        let held = if fresh {
            None
        } else {
            sink.held().map_err(Failure::failed)?
        };
        let fingerprint = Fingerprint::new(&job, &info);
        let location = StateLocation::for_job(&job);
        let reuse = crate::state::peek(&job.name, &location, &fingerprint, held, fresh)
            .map_err(state_failure)?;
        let classifier = Classifier::new(reuse.store, reuse.held_ids, sink.keeps_rows());
        crate::estimate::estimate(&job, chunker.as_ref(), &info, classifier).map_err(|e| Failure {
            exit: e.exit(),
            error: e.into(),
        })
    })
    .await
    .map_err(|e| Failure::failed(anyhow::anyhow!("the estimate stopped unexpectedly: {e}")))??;
    if args.json {
        print_json(&serde_json::to_value(&estimate).map_err(Failure::failed)?)?;
    } else {
        print!("{}", crate::estimate::table(&estimate));
    }
    Ok(Exit::Success)
}

fn state_failure(e: StateError) -> Failure {
    Failure {
        exit: if e.is_found_before_work() {
            Exit::Usage
        } else {
            Exit::Failed
        },
        error: e.into(),
    }
}
