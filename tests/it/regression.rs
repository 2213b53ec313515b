//! Tests that each pin a bug, named after it.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use embedjob::simulate::{embedding_vector, ModelSpec, SimConfig};
use serde_json::Value;

use crate::support::{
    assert_complete, bin, corpus, expected_chunks, files_source, honest, hostile_server, inputs,
    json_response, read_output, run, run_command, run_job, run_measured, simulator, text,
    three_documents, write_job, HOSTILE_KEY,
};

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
    let root = corpus(dir.path(), 3);
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
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
    let root = corpus(dir.path(), 4);
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "dimensions = 512",
    );
    let output = run_job(&job, &["--json"]).await;
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
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json", "--set", "backend.timeout_seconds=1"]).await;
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

fn expect_exit(output: &Output, code: i32) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn checkpoint_parts(dir: &Path) -> Vec<PathBuf> {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir.join("out/result.parquet.checkpoint"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    parts.retain(|p| p.extension().is_some_and(|e| e == "parquet"));
    parts.sort();
    parts
}

/// A run that pays for `good` requests and is then refused for good,
/// leaving a checkpoint: the corpus of `documents` documents, one chunk a
/// request.
async fn checkpointed_run(dir: &Path, documents: usize, good: usize) -> PathBuf {
    let root = corpus(dir, documents);
    let server = hostile_server(move |n, request| {
        if n < good {
            honest(request)
        } else {
            json_response(
                StatusCode::UNAUTHORIZED,
                r#"{"error":{"message":"key revoked","code":"invalid_api_key"}}"#,
            )
        }
    })
    .await;
    let job = write_job(dir, &server.base_url, &files_source(&root), "");
    let output = run_measured(run_command(
        &job,
        &[
            "--set",
            "backend.max_inputs_per_request=2",
            "--set",
            "backend.concurrency=1",
        ],
    ))
    .await
    .output;
    expect_exit(&output, 1);
    assert!(
        !checkpoint_parts(dir).is_empty(),
        "the paid vectors are kept"
    );
    job
}

/// Flips one bit of a vector stored in `file`: of the first vector of one
/// of `texts` found in it.
fn flip_a_vector_bit(file: &Path, texts: &[&String]) {
    let mut bytes = std::fs::read(file).unwrap();
    for text in texts {
        let vector = embedding_vector(1024, text);
        let needle: Vec<u8> = vector[..4].iter().flat_map(|v| v.to_le_bytes()).collect();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            bytes[at + 40] ^= 0x10;
            std::fs::write(file, bytes).unwrap();
            return;
        }
    }
    panic!("no vector of the corpus found in {}", file.display());
}

/// Bit flips inside a checkpoint part were resumed without complaint: two
/// wrong vectors ended up in the output.
#[tokio::test]
async fn regression_bit_flips_in_a_checkpoint_part_were_resumed_as_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let job = checkpointed_run(dir.path(), 12, 3).await;
    let expected = expected_chunks(&dir.path().join("docs"));
    let texts: Vec<&String> = expected.values().collect();
    let parts = checkpoint_parts(dir.path());
    flip_a_vector_bit(&parts[0], &texts);

    let sim = simulator(SimConfig::default()).await;
    let output = run_measured(run_command(
        &job,
        &["--set", &format!("backend.base_url={}", sim.base_url())],
    ))
    .await
    .output;
    let stderr = expect_exit(&output, 0);
    let name = parts[0].file_name().unwrap().to_str().unwrap();
    assert!(
        stderr.contains("checkpoint part discarded") && stderr.contains(name),
        "a warning names the part: {stderr}"
    );
    assert!(stderr.contains("checksum"), "{stderr}");
    assert_complete(
        &read_output(&dir.path().join("out/result.parquet")),
        &expected,
        1024,
    );
    assert!(
        sim.ledger().billed_requests > 0,
        "its chunks were sent again"
    );
}

/// A checkpoint whose manifest.json was deleted, resumed under another
/// model: the old model's vectors were written under the new one.
#[tokio::test]
async fn regression_a_checkpoint_without_its_manifest_was_resumed_under_another_model() {
    let dir = tempfile::tempdir().unwrap();
    let job = checkpointed_run(dir.path(), 12, 3).await;
    let expected = expected_chunks(&dir.path().join("docs"));
    std::fs::remove_file(
        dir.path()
            .join("out/result.parquet.checkpoint/manifest.json"),
    )
    .unwrap();

    let mut models = ModelSpec::defaults();
    models.push(ModelSpec::embedding("svc-embed-2", 1024));
    let sim = simulator(SimConfig {
        models,
        ..SimConfig::default()
    })
    .await;
    let output = run_measured(run_command(
        &job,
        &[
            "--json",
            "--set",
            &format!("backend.base_url={}", sim.base_url()),
            "--set",
            "backend.model=svc-embed-2",
            "--set",
            "backend.dimensions=1024",
        ],
    ))
    .await
    .output;
    let stderr = expect_exit(&output, 0);
    assert!(
        stderr.contains("result.parquet.checkpoint: discarded") && stderr.contains("manifest.json"),
        "{stderr}"
    );
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        summary["resumed"], 0,
        "nothing of the old model is used: {summary}"
    );
    let distinct: std::collections::HashSet<&String> = expected.values().collect();
    assert_eq!(
        sim.ledger().texts.len(),
        distinct.len(),
        "every chunk was embedded by the new model"
    );
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_eq!(rows.metadata["embedjob.model"], "svc-embed-2");
    assert_eq!(rows.ids.len(), expected.len());
}

/// Rewrites a Parquet file with one vector value changed and everything
/// else, its metadata too, as it was: what a flipped bit does to a file.
fn change_one_value_keeping_the_metadata(file: &Path) {
    use arrow::array::{Array, AsArray, FixedSizeListArray, Float32Array, RecordBatch};
    use arrow::datatypes::Float32Type;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let builder =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(file).unwrap()).unwrap();
    let key_values = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    let schema = builder.schema().clone();
    let mut batches: Vec<RecordBatch> = builder.build().unwrap().map(Result::unwrap).collect();
    let first = batches[0].clone();
    let column = first.schema().index_of("embedding").unwrap();
    let list = first.column(column).as_fixed_size_list();
    let mut values = list
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec();
    values[5] = -values[5] + 0.25;
    let Some(arrow::datatypes::DataType::FixedSizeList(item, size)) =
        Some(list.data_type().clone())
    else {
        unreachable!()
    };
    let changed = FixedSizeListArray::new(item, size, Arc::new(Float32Array::from(values)), None);
    let mut columns = first.columns().to_vec();
    columns[column] = Arc::new(changed);
    batches[0] = RecordBatch::try_new(first.schema(), columns).unwrap();
    let out = std::fs::File::create(file).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(out, schema, None).unwrap();
    for batch in &batches {
        writer.write(batch).unwrap();
    }
    for kv in key_values {
        writer.append_key_value_metadata(kv);
    }
    writer.close().unwrap();
}

/// A previous output damaged on disk was reused: its wrong vector was
/// copied into the next output.
#[tokio::test]
async fn regression_a_damaged_previous_output_was_reused() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let extra = ["--set", "output.include_text=true"];
    expect_exit(&run_measured(run_command(&job, &extra)).await.output, 0);
    let output_file = dir.path().join("out/result.parquet");
    let rows = read_output(&output_file);
    assert!(rows.metadata["embedjob.checksum"].starts_with("xxh3-64:"));
    change_one_value_keeping_the_metadata(&output_file);
    let billed = sim.ledger().billed_requests;

    let output = run_measured(run_command(&job, &extra)).await.output;
    let stderr = expect_exit(&output, 0);
    assert!(
        stderr.contains("result.parquet") && stderr.contains("not reused"),
        "{stderr}"
    );
    assert!(sim.ledger().billed_requests > billed, "sent again");
    assert_complete(&read_output(&output_file), &expected, 1024);
}

/// Numbers too large for the program: `Retry-After`-sized durations from a
/// flag, a job key or the environment, and capacities and sizes near
/// `i64::MAX`, panicked (exit 101). They are refused by name, or, where they
/// are harmless, accepted.
#[tokio::test]
async fn regression_huge_numbers_in_flags_job_keys_and_the_environment_panicked() {
    let sim = simulator(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let root = three_documents(dir.path());
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let max = i64::MAX.to_string();
    let refused: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--max-duration".into(), "99999999999999999999".into()],
            "--max-duration",
        ),
        (
            vec!["--max-duration".into(), "1e300h".into()],
            "--max-duration",
        ),
        (vec!["--max-cost".into(), "1e309".into()], "budget.max_cost"),
        (
            vec!["--set".into(), "backend.timeout_seconds=1e30".into()],
            "backend.timeout_seconds",
        ),
        (
            vec!["--set".into(), "backend.timeout_seconds=-1".into()],
            "backend.timeout_seconds",
        ),
        (
            vec!["--set".into(), format!("pipeline.channel_capacity={max}")],
            "pipeline.channel_capacity",
        ),
        (
            vec!["--set".into(), format!("backend.dimensions={max}")],
            "backend.dimensions",
        ),
        (
            vec![
                "--set".into(),
                format!("backend.max_inputs_per_request={max}"),
            ],
            "backend.max_inputs_per_request",
        ),
        (
            vec![
                "--set".into(),
                format!("backend.max_tokens_per_request={max}"),
            ],
            "backend.max_tokens_per_request",
        ),
        (
            vec!["--set".into(), format!("chunking.max_tokens={max}")],
            "chunking.max_tokens",
        ),
        (
            vec!["--set".into(), format!("backend.max_retries={max}")],
            "backend.max_retries",
        ),
        (
            vec!["--set".into(), format!("output.row_group_bytes={max}")],
            "output.row_group_bytes",
        ),
        (
            vec!["--set".into(), format!("backend.requests_per_minute={max}")],
            "backend.requests_per_minute",
        ),
        (
            vec!["--set".into(), "pipeline.progress_seconds=1e300".into()],
            "pipeline.progress_seconds",
        ),
    ];
    for (args, named) in refused {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = run_measured(run_command(&job, &args)).await.output;
        let stderr = expect_exit(&output, 2);
        assert!(stderr.contains(named), "{args:?}: {named} not in {stderr}");
    }
    let accepted = [
        format!("backend.tokens_per_minute={}", i64::MAX),
        format!("budget.max_cost={:e}", f64::MAX),
    ];
    for setting in &accepted {
        let output = run_measured(run_command(&job, &["--set", setting]))
            .await
            .output;
        expect_exit(&output, 0);
    }
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", HOSTILE_KEY)
        .env("EMBEDJOB_BASE_URL", sim.base_url())
        .env("EMBEDJOB_TIMEOUT_SECONDS", "1e30")
        .args(["models"]);
    let stderr = expect_exit(&run(command).await, 2);
    assert!(stderr.contains("EMBEDJOB_TIMEOUT_SECONDS"), "{stderr}");
}

/// A failed run (exit 1) printed nothing with `--json` and left the
/// previous run's summary, which said `exit_code: 0`.
#[tokio::test]
async fn regression_a_failed_run_left_the_summary_of_a_successful_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = three_documents(dir.path());
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    expect_exit(&run_measured(run_command(&job, &[])).await.output, 0);
    let summary_file = dir.path().join("out/result.parquet.summary.json");
    let first: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_file).unwrap()).unwrap();
    assert_eq!(first["exit_code"], 0);

    for i in 0..4 {
        std::fs::write(
            root.join(format!("new{i}.txt")),
            format!("new text number {i}"),
        )
        .unwrap();
    }
    let billed = Arc::new(std::sync::Mutex::new(0u64));
    let counted = Arc::clone(&billed);
    let server = hostile_server(move |n, request| {
        if n == 0 {
            let texts = inputs(request);
            *counted.lock().unwrap() += texts
                .iter()
                .map(|t| u64::from(embedjob::simulate::count_tokens(t)))
                .sum::<u64>();
            return honest(request);
        }
        json_response(
            StatusCode::FORBIDDEN,
            r#"{"error":{"message":"account suspended"}}"#,
        )
    })
    .await;
    let output = run_measured(run_command(
        &job,
        &[
            "--json",
            "--set",
            &format!("backend.base_url={}", server.base_url),
            "--set",
            "backend.max_inputs_per_request=1",
            "--set",
            "backend.concurrency=1",
        ],
    ))
    .await
    .output;
    let stderr = expect_exit(&output, 1);
    assert!(stderr.contains("account suspended"), "{stderr}");
    let printed: Value = serde_json::from_slice(&output.stdout).expect("--json prints the summary");
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_file).unwrap()).unwrap();
    for summary in [&printed, &written] {
        assert_eq!(summary["exit_code"], 1, "{summary}");
        assert!(summary["error"]
            .as_str()
            .unwrap()
            .contains("account suspended"));
        assert_eq!(
            summary["usage"]["prompt_tokens"],
            *billed.lock().unwrap(),
            "{summary}"
        );
        assert_eq!(summary["requests"], 1, "{summary}");
    }
    assert_eq!(server.requests.load(Ordering::SeqCst), 2);
}

/// Job A (`out/a.parquet`) removed the temporary file of job B
/// (`out/a.parquet.b.parquet`), which then failed.
#[tokio::test]
async fn regression_a_job_removed_the_temporary_files_of_another_job() {
    let dir = tempfile::tempdir().unwrap();
    let root = three_documents(dir.path());
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let live = std::process::id();
    let dead = 999_999_999u32;
    let others = [
        format!(".a.parquet.b.parquet.tmp-{live}"),
        format!(".a.parquet.b.parquet.tmp-{dead}"),
        format!(".a.parquet.b.parquet.summary.json.tmp-{dead}"),
        format!(".a.parquet.tmp-{live}"),
    ];
    let stale = [
        format!(".a.parquet.tmp-{dead}"),
        format!(".a.parquet.summary.json.tmp-{dead}"),
    ];
    for name in others.iter().chain(&stale) {
        std::fs::write(out.join(name), b"in progress").unwrap();
    }
    let output = run_measured(run_command(
        &job,
        &[
            "--set",
            &format!("output.path={}", out.join("a.parquet").display()),
        ],
    ))
    .await
    .output;
    expect_exit(&output, 0);
    for name in &others {
        assert!(
            out.join(name).exists(),
            "{name} is not job A's, or its writer lives"
        );
    }
    for name in &stale {
        assert!(
            !out.join(name).exists(),
            "{name}, job A's own and dead, is cleaned up"
        );
    }
}

/// A glob through a symlink loop ran to 651 MB and 60 s without an answer,
/// and a `me -> .` link made one file count 41 times.
#[cfg(unix)]
#[tokio::test]
async fn regression_a_glob_through_a_symlink_loop_never_ended() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(docs.join("sub")).unwrap();
    std::fs::write(docs.join("a.md"), "alpha text").unwrap();
    std::fs::write(docs.join("sub/b.md"), "beta text").unwrap();
    std::os::unix::fs::symlink(".", docs.join("me")).unwrap();
    std::os::unix::fs::symlink("..", docs.join("sub/up")).unwrap();
    std::os::unix::fs::symlink("a.md", docs.join("sub/also-a.md")).unwrap();
    let sim = simulator(SimConfig::default()).await;
    for source in [
        format!("kind = \"files\"\npaths = [\"{}/**/*.md\"]", docs.display()),
        files_source(&docs),
    ] {
        let job = write_job(dir.path(), &sim.base_url(), &source, "");
        let output = run_measured(run_command(&job, &["--json", "--fresh"]))
            .await
            .output;
        expect_exit(&output, 0);
        let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(summary["documents"], 2, "{source}: {summary}");
        let mut ids = read_output(&dir.path().join("out/result.parquet")).ids;
        ids.sort();
        assert_eq!(ids, ["a.md#0", "sub/b.md#0"], "{source}");
    }
}

/// A JSON Lines input of `n` records, all with the same text or all different.
fn records(dir: &Path, n: usize, identical: bool) -> PathBuf {
    use std::io::Write;
    let path = dir.join(if identical {
        "same.jsonl"
    } else {
        "distinct.jsonl"
    });
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for i in 0..n {
        let text = if identical {
            "the same sentence about vector indexes, again and again".to_string()
        } else {
            format!("a sentence about vector indexes, number {i}")
        };
        writeln!(file, "{{\"id\": \"r{i}\", \"text\": \"{text}\"}}").unwrap();
    }
    path
}

/// 1,000,000 identical texts peaked at 645 MB, where distinct texts peak at
/// 162 MB: every repeat was held until the end of the run.
#[tokio::test]
async fn regression_identical_texts_took_far_more_memory_than_distinct_ones() {
    const N: usize = 200_000;
    let mut models = ModelSpec::defaults();
    models.push(ModelSpec::embedding("svc-tiny", 8));
    let sim = simulator(SimConfig {
        models,
        ..SimConfig::default()
    })
    .await;
    let mut peaks = Vec::new();
    for identical in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let input = records(dir.path(), N, identical);
        let source = format!(
            "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"",
            input.display()
        );
        let job = write_job(dir.path(), &sim.base_url(), &source, "dimensions = 8");
        let measured = run_measured(run_command(
            &job,
            &[
                "--json",
                "--set",
                "backend.model=svc-tiny",
                "--set",
                "backend.max_inputs_per_request=256",
                "--set",
                "output.include_text=false",
            ],
        ))
        .await;
        expect_exit(&measured.output, 0);
        let summary: Value = serde_json::from_slice(&measured.output.stdout).unwrap();
        assert_eq!(summary["written"], N, "{summary}");
        if identical {
            assert_eq!(summary["deduplicated"], N - 1, "{summary}");
            assert_eq!(summary["embedded"], 1, "{summary}");
        }
        peaks.push(measured.peak_rss_mb);
    }
    let (distinct, identical) = (peaks[0], peaks[1]);
    eprintln!("peak RSS: {distinct:.0} MB distinct, {identical:.0} MB identical");
    assert!(
        identical <= distinct * 1.2 + 10.0,
        "identical texts peaked at {identical:.0} MB, distinct ones at {distinct:.0} MB"
    );
}

/// A job file with 15 values of the wrong type reported 7 problems: only the
/// first of each section.
#[tokio::test]
async fn regression_a_job_file_with_fifteen_wrong_types_reported_seven() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    let wrong = [
        ("source.paths", "paths = \"docs\""),
        ("chunking.max_tokens", "max_tokens = \"many\""),
        ("chunking.overlap_tokens", "overlap_tokens = true"),
        ("chunking.markdown", "markdown = 3"),
        ("backend.model", "model = 7"),
        ("backend.dimensions", "dimensions = \"wide\""),
        ("backend.concurrency", "concurrency = 1.5"),
        ("backend.timeout_seconds", "timeout_seconds = \"soon\""),
        ("backend.max_retries", "max_retries = -1"),
        (
            "backend.server_renames_models",
            "server_renames_models = \"yes\"",
        ),
        ("output.include_text", "include_text = \"yes\""),
        ("output.row_group_bytes", "row_group_bytes = \"big\""),
        ("pipeline.channel_capacity", "channel_capacity = [1]"),
        ("pipeline.progress_seconds", "progress_seconds = \"often\""),
        ("budget.max_cost", "max_cost = \"cheap\""),
    ];
    let section = |name: &str| {
        wrong
            .iter()
            .filter(|(key, _)| key.starts_with(&format!("{name}.")))
            .map(|(_, line)| format!("{line}\n"))
            .collect::<String>()
    };
    std::fs::write(
        &job,
        format!(
            "[source]\nkind = \"files\"\n{}[chunking]\n{}[backend]\nkind = \"api\"\n\
             base_url = \"http://127.0.0.1:9\"\n{}[output]\npath = \"out.parquet\"\n{}\
             [pipeline]\n{}[budget]\n{}",
            section("source"),
            section("chunking"),
            section("backend"),
            section("output"),
            section("pipeline"),
            section("budget"),
        ),
    )
    .unwrap();
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", HOSTILE_KEY)
        .arg("estimate")
        .arg(&job);
    let stderr = expect_exit(&run(command).await, 2);
    assert!(stderr.contains("15 problems"), "{stderr}");
    for (key, _) in wrong {
        assert!(
            stderr.contains(&format!("`{key}`")),
            "{key} missing from {stderr}"
        );
    }
}

/// A file that disappeared after the run started gave exit 2, which means
/// the job was refused before any work.
#[tokio::test(flavor = "multi_thread")]
async fn regression_a_file_that_vanished_mid_run_was_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..10 {
        std::fs::write(
            root.join(format!("d{i}.txt")),
            format!("document number {i}"),
        )
        .unwrap();
    }
    let release = Arc::new(tokio::sync::Notify::new());
    let waiting = Arc::clone(&release);
    let server = hostile_server(move |_, request| {
        let body = Bytes::from(embedjob::simulate::embeddings_response_body(
            "svc-embed-1",
            1024,
            &inputs(request)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        ));
        let release = Arc::clone(&waiting);
        let held = futures::stream::once(async move {
            release.notified().await;
            Ok::<Bytes, std::io::Error>(body)
        });
        json_response(StatusCode::OK, Body::from_stream(held))
    })
    .await;
    let job = write_job(dir.path(), &server.base_url, &files_source(&root), "");
    let command = run_command(
        &job,
        &[
            "--set",
            "backend.max_inputs_per_request=1",
            "--set",
            "backend.concurrency=1",
            "--set",
            "pipeline.channel_capacity=1",
        ],
    );
    let running = tokio::spawn(run_measured(command));
    let started = std::time::Instant::now();
    while server.requests.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "no request came"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The reader waits behind the request in flight, far from the last file.
    std::fs::remove_file(root.join("d9.txt")).unwrap();
    let releasing = tokio::spawn(async move {
        loop {
            release.notify_waiters();
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    });
    let output = running.await.unwrap().output;
    releasing.abort();
    let stderr = expect_exit(&output, 1);
    assert!(stderr.contains("d9.txt"), "{stderr}");
    assert!(!dir.path().join("out/result.parquet").exists());
    assert!(
        !checkpoint_parts(dir.path()).is_empty(),
        "what was paid for before is kept"
    );
}

/// An answer with one damaged vector keeps the good ones and sends the
/// damaged input again alone; when that re-send failed for good (or met a
/// used-up quota), the good vectors, billed, were dropped with it and the
/// next run paid for them again. They now reach the checkpoint.
#[tokio::test]
async fn regression_good_vectors_were_dropped_when_the_re_send_of_a_damaged_one_failed() {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    // The re-send's answer: a used-up quota (the run stops, resumable) or a
    // refusal that is no fault of size (the run fails).
    let refusals = [
        (
            StatusCode::TOO_MANY_REQUESTS,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            4,
        ),
        (
            StatusCode::BAD_REQUEST,
            r#"{"error":{"message":"unsupported input","type":"invalid_request_error"}}"#,
            1,
        ),
    ];
    for (status, body, exit) in refusals {
        let billed: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let healed = Arc::new(AtomicBool::new(false));
        let (ledger, good) = (Arc::clone(&billed), Arc::clone(&healed));
        let server = hostile_server(move |_, request| {
            let texts = inputs(request);
            let whole = good.load(Ordering::SeqCst);
            if texts.len() == 1 && !whole {
                return json_response(status, body);
            }
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let mut answer: Value = serde_json::from_slice(
                &embedjob::simulate::embeddings_response_body("svc-embed-1", 1024, &refs),
            )
            .unwrap();
            if !whole {
                // The last vector one value short: billed, and sent again alone.
                let last = texts.len() - 1;
                answer["data"][last]["embedding"]
                    .as_array_mut()
                    .unwrap()
                    .pop();
            }
            let mut ledger = ledger.lock().unwrap();
            for text in texts {
                *ledger.entry(text).or_default() += 1;
            }
            json_response(StatusCode::OK, answer.to_string())
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let root = three_documents(dir.path());
        let job = write_job(dir.path(), &server.base_url, &files_source(&root), "");
        let settings = [
            "--set",
            "backend.max_inputs_per_request=3",
            "--set",
            "backend.concurrency=1",
        ];
        let output = run(run_command(&job, &settings)).await;
        assert_eq!(output.status.code(), Some(exit), "{}", text(&output.stderr));
        let first: HashMap<String, u64> = billed.lock().unwrap().clone();
        assert_eq!(first.len(), 3, "one request of three: {first:?}");

        healed.store(true, Ordering::SeqCst);
        let output = run(run_command(&job, &[&settings[..], &["--json"]].concat())).await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(summary["resumed"], 2, "{summary}");
        let all = billed.lock().unwrap().clone();
        let twice: Vec<&String> = all.iter().filter(|(_, &n)| n > 1).map(|(t, _)| t).collect();
        assert_eq!(
            twice.len(),
            1,
            "only the damaged text is billed again ({status}): {all:?}"
        );
        let rows = read_output(&dir.path().join("out/result.parquet"));
        assert_eq!(rows.ids.len(), 3);
    }
}

/// `chat` against a server that drips (a few bytes at a time, never an
/// event, never `[DONE]`) never ended: each read put the read timeout off,
/// nothing bounded the wait for the answer's headers or an error's body,
/// and only whole events were held to the stream's limit.
#[tokio::test]
async fn regression_a_chat_stream_that_drips_forever_never_ended() {
    use std::time::Duration;

    use crate::support::{scripted_server, Scripted};

    // `EMBEDJOB_TIMEOUT_SECONDS`: the answer must begin within it and each
    // event follow the last within it; ten times it bounds a whole stream.
    let timeout = Duration::from_secs(1);
    // Well inside the timeout, so that each read puts a read timeout off.
    let drip = Duration::from_millis(100);
    // Pieces for longer than any bound below.
    let many = 2_000;

    // A stream that sends no event is given up after the timeout, before the
    // whole stream's limit (ten timeouts) could be what ends it.
    let event = b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}";
    let bytes: Vec<Vec<u8>> = event.iter().cycle().take(many).map(|b| vec![*b]).collect();
    let comments = vec![b": keep-alive\n\n".to_vec(); many];
    for pieces in [bytes, comments] {
        let (base, _) = scripted_server(vec![Scripted {
            pieces,
            pause: Some(drip),
            ..Scripted::sse(&[])
        }])
        .await;
        let output = chat_within(&base, timeout, timeout * 10).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("the stream sent no event for 1s"),
            "{stderr}"
        );
    }

    // An error's body, or an answer's headers, that drip in: each attempt
    // to open the stream is given up after the timeout. `chat` makes four
    // (three retries), with backoffs of at most 2 × (0.25 + 0.5 + 1) s, and
    // is given one more timeout to start.
    let bound = timeout * 5 + Duration::from_millis(3_500);
    let error_body = Scripted {
        status: 503,
        headers: vec![("content-type", "application/json".to_string())],
        pieces: vec![b" ".to_vec(); many],
        abort: false,
        pause: Some(drip),
    };
    let (base, _) = scripted_server(vec![error_body]).await;
    let headers = dripping_headers_server(drip, many).await;
    for base in [base, headers] {
        let output = chat_within(&base, timeout, bound).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("timed out"), "{stderr}");
    }
}

/// Runs `embedjob chat` against `base` with the request `timeout`; fails
/// the test (and ends the process) when it is still running after `bound`.
async fn chat_within(
    base: &str,
    timeout: std::time::Duration,
    bound: std::time::Duration,
) -> Output {
    use std::process::Stdio;
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", HOSTILE_KEY)
        .env("EMBEDJOB_BASE_URL", base)
        .env(
            "EMBEDJOB_TIMEOUT_SECONDS",
            timeout.as_secs_f64().to_string(),
        )
        .args(["chat", "--model", "svc-base", "hello"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("the binary starts");
    let pid = child.id();
    let waiting = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap());
    if let Ok(output) = tokio::time::timeout(bound, waiting).await {
        return output.unwrap();
    }
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    panic!("`chat` against {base} was still running after {bound:?}");
}

/// A server on 127.0.0.1 that answers `200 OK` and then drips a header one
/// byte every `pause`, `bytes` of them, never ending the headers.
async fn dripping_headers_server(pause: std::time::Duration, bytes: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut request).await;
                if socket
                    .write_all(b"HTTP/1.1 200 OK\r\nx-drip: ")
                    .await
                    .is_err()
                {
                    return;
                }
                for _ in 0..bytes {
                    tokio::time::sleep(pause).await;
                    if socket.write_all(b"a").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}
