//! Tests that each pin a bug, named after it.

use crate::cli::{bin, run, text};

/// A local job took the api kind's keys (`requests_per_minute`,
/// `max_retries`, …) without a word, though they limit nothing there.
#[tokio::test]
async fn regression_api_keys_in_a_local_job_were_silently_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        "[source]\nkind = \"files\"\npaths = [\"docs\"]\n\
         [backend]\nkind = \"local\"\nrequests_per_minute = 60\nmax_retries = 3\n\
         [output]\npath = \"out.parquet\"\n",
    )
    .unwrap();
    let mut command = bin();
    command.arg("estimate").arg(&job).arg("--json");
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty());
    for key in ["requests_per_minute", "max_retries"] {
        let problem = format!("`backend.{key}` does not apply to kind \"local\"");
        assert!(stderr.contains(&problem), "{problem} missing from {stderr}");
    }
}

/// `run` and `estimate` stopped with "unknown model" against servers that
/// have no `GET /v1/models/{id}` (infinity, llama-cpp-python), although the
/// model was in their listing.
#[tokio::test]
async fn regression_a_server_without_the_model_route_was_taken_for_an_unknown_model() {
    use embedjob::simulate::SimConfig;

    let sim = crate::support::simulator(SimConfig {
        model_route: false,
        bare_listing: true,
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let root = crate::run::corpus(dir.path(), 3);
    let job = crate::run::write_job(
        dir.path(),
        &sim.base_url(),
        &crate::run::files_source(&root),
        "",
    );
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", crate::support::KEY)
        .arg("estimate")
        .arg(&job)
        .arg("--json");
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let estimate: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(estimate["chunks"].as_u64().unwrap() > 0);
    assert!(
        stderr.contains("context window of model svc-embed-1 is unknown"),
        "{stderr}"
    );
}

/// `backend.dimensions = 512` for a model of 1024 was never sent: every
/// answer failed the length check and was retried until the retries ran
/// out, each attempt billed.
#[tokio::test]
async fn regression_declared_dimensions_were_never_sent_and_every_answer_was_paid_for_again() {
    use embedjob::simulate::SimConfig;

    let sim = crate::support::simulator(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let root = crate::run::corpus(dir.path(), 4);
    let job = crate::run::write_job(
        dir.path(),
        &sim.base_url(),
        &crate::run::files_source(&root),
        "dimensions = 512",
    );
    let output = crate::run::run_job(&job, &["--json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["dimensions"], 512);
    assert_eq!(summary["retries"], 0);
    let ledger = sim.ledger();
    assert!(
        ledger.texts.values().all(|&n| n == 1),
        "each text billed once"
    );
}

/// A request that timed out was sent again whole, and a slow server
/// computed and billed it twice.
#[tokio::test]
async fn regression_a_timed_out_request_was_sent_again_whole() {
    use embedjob::simulate::SimConfig;

    let sim = crate::support::simulator(SimConfig {
        latency_per_input_ms: 300,
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..4 {
        std::fs::write(root.join(format!("{i}.txt")), format!("text {i}")).unwrap();
    }
    let job = crate::run::write_job(
        dir.path(),
        &sim.base_url(),
        &crate::run::files_source(&root),
        "",
    );
    let output = crate::run::run_job(&job, &["--json", "--set", "backend.timeout_seconds=1"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let ledger = sim.ledger();
    assert_eq!(
        ledger.billed_sizes.get(&4),
        Some(&1),
        "the request of 4 was billed once: {:?}",
        ledger.billed_sizes
    );
    assert!(ledger.texts.values().all(|&n| n == 2), "{:?}", ledger.texts);
}
