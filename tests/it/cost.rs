//! Knowing the cost: `estimate` before a run, `inspect` after it, and the
//! progress shown while it runs.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, RecordBatch, StringArray,
};
use arrow::datatypes::Float32Type;
use embedjob::simulate::{KeySpec, SimConfig, Simulator};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use serde_json::Value;

use crate::cli::{bin, no_key, run, text};
use crate::support::{simulator, KEY};

/// A corpus mixing markdown, plain text, code and non-ASCII text, so that
/// chunk boundaries and token counts are not all alike; with `repeats`,
/// some chunks repeat the text of others.
fn corpus(dir: &Path, repeats: bool) -> PathBuf {
    let root = dir.join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..12 {
        let mut body = format!("# Notes {i}\n\n");
        for p in 0..(2 + i % 4) {
            body.push_str(&format!(
                "Paragraph {p}: vector indexes, tokens and batches; café, naïve, 東京, \
                 emoji 🚀 and `code_{i}()`. {}\n\n",
                (0..1 + (i * p) % 9)
                    .map(|k| if repeats {
                        "Embedding runs cost money. ".to_string()
                    } else {
                        format!("Run {i}.{p}.{k} costs money. ")
                    })
                    .collect::<String>()
            ));
        }
        let name = if i % 3 == 0 { "txt" } else { "md" };
        std::fs::write(root.join(format!("note{i:02}.{name}")), body).unwrap();
    }
    root
}

fn write_job(dir: &Path, base_url: &str, backend_extra: &str) -> PathBuf {
    write_job_over(dir, corpus(dir, true), base_url, backend_extra)
}

fn write_job_over(dir: &Path, root: PathBuf, base_url: &str, backend_extra: &str) -> PathBuf {
    let job = format!(
        r#"name = "cost"
[source]
kind = "files"
paths = ["{root}"]
[chunking]
max_tokens = 48
overlap_tokens = 6
[backend]
kind = "api"
base_url = "{base_url}"
model = "svc-embed-1"
max_inputs_per_request = 5
max_tokens_per_request = 200
concurrency = 3
timeout_seconds = 5
{backend_extra}
[output]
path = "{out}"
"#,
        root = root.display(),
        out = dir.join("out/result.parquet").display()
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, job).unwrap();
    path
}

async fn embedjob(args: &[&str]) -> Output {
    let mut command = bin();
    command.env("EMBEDJOB_API_KEY", KEY).args(args);
    run(command).await
}

fn json(output: &Output) -> Value {
    let (stdout, stderr) = no_key(output, KEY);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}\n{stderr}"))
}

fn path_arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[tokio::test]
async fn the_estimate_is_what_the_run_sends_and_pays_for() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), "");

    let output = embedjob(&["estimate", path_arg(&job), "--json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let estimate = json(&output);
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "an estimate sends no embedding request"
    );
    assert!(
        !dir.path().join("out").exists(),
        "an estimate writes nothing"
    );

    let output = embedjob(&["run", path_arg(&job), "--json", "--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary = json(&output);
    let ledger = sim.ledger();

    assert!(estimate["requests"].as_u64().unwrap() > 5, "{estimate}");
    // Repeated texts are sent once, by the estimate as by the run.
    assert!(
        estimate["repeated_chunks"].as_u64().unwrap() > 0,
        "{estimate}"
    );
    assert_eq!(estimate["repeated_chunks"], summary["deduplicated"]);
    assert_eq!(estimate["requests"], summary["requests"]);
    assert_eq!(estimate["requests"].as_u64(), Some(ledger.billed_requests));
    assert_eq!(estimate["chunks"], summary["chunks"]);
    assert_eq!(estimate["documents"], summary["documents"]);
    // Tolerance 0: chunks are counted with cl100k over exactly the text sent,
    // as the simulator bills (encode_ordinary, special tokens as text), and a
    // run without faults bills each request once.
    assert_eq!(estimate["tokens"].as_u64(), Some(ledger.prompt_tokens));
    assert_eq!(estimate["tokens"], summary["estimated_tokens"]);
    let cost = estimate["cost"].as_f64().unwrap();
    let billed = summary["cost"].as_f64().unwrap();
    assert!((cost - billed).abs() < 1e-12, "{cost} vs {billed}");
    assert_eq!(estimate["input_per_1k"].as_f64(), Some(0.0001));
    assert_eq!(estimate["context_window"].as_u64(), Some(8192));
    assert_eq!(estimate["shortest_duration_seconds"], Value::Null);

    // The human form: a table on stdout, nothing on stderr. With the output
    // in place, the next run would send nothing; --fresh estimates starting over.
    let output = embedjob(&["estimate", path_arg(&job)]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stdout.contains("requests             0\n"), "{stdout}");
    let output = embedjob(&["estimate", path_arg(&job), "--fresh"]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let requests = format!("requests             {}", summary["requests"]);
    assert!(stdout.contains(&requests), "{stdout}");
    assert!(stdout.contains("cost "), "{stdout}");
}

#[tokio::test]
async fn the_estimate_follows_set_overrides_and_rate_limits() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), "");
    let output = embedjob(&[
        "estimate",
        path_arg(&job),
        "--json",
        "--set",
        "backend.max_inputs_per_request=1",
        "--set",
        "backend.model=svc-embed-1-l",
        "--set",
        "backend.requests_per_minute=120",
    ])
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let estimate = json(&output);
    // One chunk a request.
    assert_eq!(estimate["requests"], estimate["chunks_to_send"]);
    assert_eq!(estimate["model"], "svc-embed-1-l");
    assert_eq!(estimate["dimensions"], 3072);
    assert_eq!(estimate["input_per_1k"].as_f64(), Some(0.00013));
    // 120 a minute: a burst of 2, then one every half second.
    let requests = estimate["requests"].as_f64().unwrap();
    assert_eq!(
        estimate["shortest_duration_seconds"].as_f64(),
        Some((requests - 2.0) * 0.5)
    );
    assert_eq!(sim.ledger().embedding_requests, 0);
}

#[tokio::test]
async fn estimate_errors_are_config_errors_with_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig {
        keys: vec![KeySpec {
            key: KEY.to_string(),
            models: Some(vec!["svc-embed-1".to_string()]),
        }],
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), "");
    let cases: [(&str, Vec<&str>, &str); 4] = [
        (
            "an unknown key in the job file",
            vec!["--set", "backend.colour=blue"],
            "backend.colour",
        ),
        (
            "a model the key cannot see",
            vec!["--set", "backend.model=svc-embed-1-l"],
            "svc-embed-1-l",
        ),
        (
            "a missing input",
            vec!["--set", "source.paths=[\"/nonexistent/docs\"]"],
            "/nonexistent/docs",
        ),
        (
            "a chunk size beyond the model's window",
            vec![
                "--set",
                "chunking.max_tokens=9000",
                "--set",
                "backend.max_tokens_per_request=9000",
            ],
            "context window",
        ),
    ];
    for (case, extra, named) in cases {
        let mut args = vec!["estimate", path_arg(&job), "--json"];
        args.extend(extra);
        let output = embedjob(&args).await;
        let (stdout, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(2), "{case}: {stderr}");
        assert!(stdout.is_empty(), "{case}: {stdout}");
        assert!(stderr.contains(named), "{case}: {stderr}");
    }

    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", "sk-refused-9999")
        .args(["estimate", path_arg(&job)]);
    let output = run(command).await;
    let (stdout, stderr) = no_key(&output, "sk-refused-9999");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("refused the API key"), "{stderr}");
    assert_eq!(sim.ledger().embedding_requests, 0);
}

/// Runs a small job and returns the output's path.
async fn good_output(dir: &Path, sim: &Simulator) -> PathBuf {
    let job = write_job(dir, &sim.base_url(), "");
    let output = embedjob(&["run", path_arg(&job), "--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    dir.join("out/result.parquet")
}

#[tokio::test]
async fn inspect_reports_a_good_output() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let path = good_output(dir.path(), &sim).await;
    let ledger = sim.ledger();

    let output = embedjob(&["inspect", path_arg(&path), "--json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let report = json(&output);
    assert_eq!(report["ok"], true);
    let file = &report["files"][0];
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/result.parquet.summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(file["rows"], summary["written"]);
    assert_eq!(file["model"], "svc-embed-1");
    assert_eq!(file["backend"], "api");
    assert_eq!(file["dimensions"], 1024);
    assert_eq!(file["schema_version"], "1");
    assert_eq!(file["prompt_tokens"].as_u64(), Some(ledger.prompt_tokens));
    assert_eq!(file["requests"].as_u64(), Some(ledger.billed_requests));
    assert_eq!(file["cost"], summary["cost"]);
    assert_eq!(file["problem_count"], 0);
    assert_eq!(report["totals"]["rows"], summary["written"]);

    let output = embedjob(&["inspect", path_arg(&path)]).await;
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(stdout.contains("svc-embed-1 (api backend), 1024 dimensions"));
}

/// The output's record batches and `embedjob.*` metadata.
fn read(path: &Path) -> (Vec<RecordBatch>, Vec<(String, String)>) {
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let metadata = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .iter()
        .filter(|kv| kv.key.starts_with("embedjob."))
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect();
    let batches = builder.build().unwrap().map(Result::unwrap).collect();
    (batches, metadata)
}

/// Writes `batches` and `metadata` to `path`, as a tool other than embedjob would.
fn write(path: &Path, batches: &[RecordBatch], metadata: &[(String, String)]) {
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batches[0].schema(), None).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    for (key, value) in metadata {
        writer.append_key_value_metadata(KeyValue::new(key.clone(), value.clone()));
    }
    writer.close().unwrap();
}

/// `batch` with `row`'s vector replaced by `change(vector)`.
fn with_vector(batch: &RecordBatch, row: usize, change: impl Fn(&mut [f32])) -> RecordBatch {
    let index = batch.schema().index_of("embedding").unwrap();
    let list = batch.column(index).as_fixed_size_list();
    let size = list.value_length() as usize;
    let mut values = list
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec();
    change(&mut values[row * size..(row + 1) * size]);
    let arrow::datatypes::DataType::FixedSizeList(item, length) = list.data_type().clone() else {
        unreachable!()
    };
    let changed = FixedSizeListArray::new(
        item,
        length,
        Arc::new(Float32Array::from(values)),
        list.nulls().cloned(),
    );
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[index] = Arc::new(changed);
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

/// `batch` with `row`'s id replaced by `id`.
fn with_id(batch: &RecordBatch, row: usize, id: &str) -> RecordBatch {
    let index = batch.schema().index_of("id").unwrap();
    let ids: Vec<String> = (0..batch.num_rows())
        .map(|i| {
            if i == row {
                id.to_string()
            } else {
                batch.column(index).as_string::<i32>().value(i).to_string()
            }
        })
        .collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[index] = Arc::new(StringArray::from(ids));
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

fn first_id(batch: &RecordBatch) -> String {
    batch
        .column_by_name("id")
        .unwrap()
        .as_string::<i32>()
        .value(0)
        .to_string()
}

/// Inspects `path`, expecting a failed check whose report names `check` and `detail`.
async fn assert_flagged(case: &str, path: &Path, check: &str, detail: &str) {
    let output = embedjob(&["inspect", path_arg(path)]).await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{case}: {stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("- {check}")) && stdout.contains(detail),
        "{case}: {stdout}"
    );
    assert!(
        stderr.contains(&path.display().to_string()) && stderr.contains(check),
        "{case}: {stderr}"
    );

    let output = embedjob(&["inspect", path_arg(path), "--json"]).await;
    assert_eq!(output.status.code(), Some(1), "{case}");
    let report = json(&output);
    assert_eq!(report["ok"], false, "{case}");
    let problems = report["files"][0]["problems"].as_array().unwrap();
    assert!(
        problems.iter().any(|p| p["check"] == check),
        "{case}: {problems:?}"
    );
}

#[tokio::test]
async fn inspect_flags_tampered_and_damaged_files() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let good = good_output(dir.path(), &sim).await;
    let (batches, metadata) = read(&good);
    assert!(batches[0].num_rows() >= 3);
    let tampered = |name: &str, batches: &[RecordBatch], metadata: &[(String, String)]| {
        let path = dir.path().join(name);
        write(&path, batches, metadata);
        path
    };
    // The rewrite alone changes nothing inspect checks.
    let copy = tampered("copy.parquet", &batches, &metadata);
    let output = embedjob(&["inspect", path_arg(&copy)]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));

    let mut nan = batches.clone();
    nan[0] = with_vector(&batches[0], 2, |v| v[7] = f32::NAN);
    let path = tampered("nan.parquet", &nan, &metadata);
    assert_flagged("NaN", &path, "finite", "row 3").await;
    assert_flagged("NaN", &path, "finite", "value 7 of the vector is NaN").await;

    let mut zero = batches.clone();
    zero[0] = with_vector(&batches[0], 1, |v| v.fill(0.0));
    let path = tampered("zero.parquet", &zero, &metadata);
    assert_flagged("all zeros", &path, "not_all_zero", "row 2").await;

    let mut duplicate = batches.clone();
    duplicate[0] = with_id(&batches[0], 2, &first_id(&batches[0]));
    let path = tampered("duplicate.parquet", &duplicate, &metadata);
    let repeated = format!("id {:?} repeats", first_id(&batches[0]));
    assert_flagged("duplicate id", &path, "unique_ids", &repeated).await;

    let mut wrong = metadata.clone();
    for (key, value) in &mut wrong {
        if key == "embedjob.dimensions" {
            *value = "512".to_string();
        }
    }
    let path = tampered("dimensions.parquet", &batches, &wrong);
    assert_flagged(
        "wrong dimensions",
        &path,
        "dimensions",
        "embedjob.dimensions is 512",
    )
    .await;

    let without: Vec<(String, String)> = metadata
        .iter()
        .filter(|(k, _)| k != "embedjob.model")
        .cloned()
        .collect();
    let path = tampered("no-model.parquet", &batches, &without);
    assert_flagged("missing key", &path, "metadata", "embedjob.model").await;

    let bytes = std::fs::read(&good).unwrap();
    let path = dir.path().join("truncated.parquet");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_flagged(
        "truncated",
        &path,
        "readable",
        "not a readable Parquet file",
    )
    .await;

    // Garbage in the middle of the vectors' compressed pages.
    let mut damaged = bytes.clone();
    let (start, len) = embedding_chunk(&good);
    for byte in &mut damaged[start + len / 3..start + len / 3 + 256] {
        *byte = 0x5a;
    }
    let path = dir.path().join("damaged.parquet");
    std::fs::write(&path, &damaged).unwrap();
    assert_flagged("damaged pages", &path, "readable", "damaged.parquet").await;
}

/// The byte range of the first row group's `embedding` column chunk.
fn embedding_chunk(path: &Path) -> (usize, usize) {
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let group = builder.metadata().row_group(0);
    let column = group
        .columns()
        .iter()
        .find(|c| c.column_path().string().starts_with("embedding"))
        .unwrap();
    let start = column
        .dictionary_page_offset()
        .unwrap_or(column.data_page_offset());
    (start as usize, column.compressed_size() as usize)
}

#[tokio::test]
async fn inspect_checks_a_directory_as_one_index() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let good = good_output(dir.path(), &sim).await;
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let (batches, metadata) = read(&good);
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    // Two halves of the output: together, one index with unique ids.
    let half = batches[0].num_rows() / 2;
    let first = batches[0].slice(0, half);
    let mut second = vec![batches[0].slice(half, batches[0].num_rows() - half)];
    second.extend(batches[1..].iter().cloned());
    write(
        &shards.join("a.parquet"),
        std::slice::from_ref(&first),
        &metadata,
    );
    write(&shards.join("b.parquet"), &second, &metadata);
    std::fs::write(shards.join("notes.txt"), "not an output").unwrap();

    let output = embedjob(&["inspect", path_arg(&shards), "--json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
    let report = json(&output);
    assert_eq!(report["ok"], true);
    assert_eq!(report["totals"]["files"], 2);
    assert_eq!(report["totals"]["rows"].as_u64(), Some(rows as u64));
    let files: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(files[0].ends_with("a.parquet") && files[1].ends_with("b.parquet"));

    // The same rows in a third file: every id repeats across the directory.
    write(&shards.join("c.parquet"), &[first], &metadata);
    let output = embedjob(&["inspect", path_arg(&shards)]).await;
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("- unique_ids"), "{stdout}");
    assert!(
        stdout.contains("a.parquet)"),
        "names the first file: {stdout}"
    );
    assert!(stdout.contains(&format!("{half} problems")), "{stdout}");

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (path, named) in [
        (empty.as_path(), "no *.parquet files"),
        (Path::new("/nonexistent/out.parquet"), "no such file"),
    ] {
        let output = embedjob(&["inspect", path_arg(path), "--json"]).await;
        assert_eq!(output.status.code(), Some(2));
        assert!(output.stdout.is_empty());
        assert!(
            text(&output.stderr).contains(named),
            "{}",
            text(&output.stderr)
        );
    }
}

/// Runs `args` with stderr on a pseudo-terminal (util-linux `script`) and
/// stdout in a file; returns (what the terminal showed, stdout).
async fn under_a_terminal(dir: &Path, args: &[&str]) -> (String, String) {
    let exe = env!("CARGO_BIN_EXE_embedjob");
    let stdout_file = dir.join("stdout.json");
    let screen_file = dir.join("screen.txt");
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let inner = format!("'{exe}' {} > '{}'", quoted.join(" "), stdout_file.display());
    let mut command = std::process::Command::new("script");
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .env("COLUMNS", "100")
        .env("TERM", "xterm")
        .args(["-qfec", &inner])
        .arg(&screen_file)
        .stdin(std::process::Stdio::null());
    let output = run(command).await;
    assert!(
        output.status.success(),
        "`script` (util-linux) runs the command under a pseudo-terminal: {output:?}"
    );
    let screen = std::fs::read_to_string(&screen_file).unwrap();
    let stdout = std::fs::read_to_string(&stdout_file).unwrap();
    assert!(!screen.contains(KEY) && !stdout.contains(KEY));
    (screen, stdout)
}

#[tokio::test]
async fn a_terminal_gets_a_progress_bar_and_stdout_stays_json() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig {
        latency_ms: 60,
        ..SimConfig::default()
    })
    .await;
    // No repeated texts: every chunk read is sent, so the bar can fill.
    let job = write_job_over(dir.path(), corpus(dir.path(), false), &sim.base_url(), "");
    // One request at a time and a channel of one batch: reading ends only
    // near the end of the run, so the bar is first shown without a total.
    let args = [
        "run",
        path_arg(&job),
        "--json",
        "--set",
        "pipeline.channel_capacity=1",
        "--set",
        "backend.concurrency=1",
        "--set",
        "backend.max_inputs_per_request=2",
    ];
    let (screen, stdout) = under_a_terminal(dir.path(), &args).await;
    let summary: Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
    let chunks = summary["chunks"].as_u64().unwrap();
    let requests = summary["requests"].as_u64().unwrap();
    // A bar redrawn in place, with its elements.
    assert!(
        screen.contains('\r') || screen.contains("\x1b["),
        "{screen:?}"
    );
    assert!(screen.contains("tokens/s"), "{screen}");
    assert!(screen.contains("retries"), "{screen}");
    assert!(screen.contains("ETA"), "{screen}");
    assert!(
        screen.contains("chunks done ("),
        "before the total is known: {screen}"
    );
    assert!(
        screen.contains(&format!("{chunks}/{chunks} chunks")),
        "the bar ends full: {screen}"
    );
    assert!(screen.contains(&format!("{requests} req")), "{screen}");
    assert!(
        !screen.contains("chunks done, "),
        "no progress lines on a terminal: {screen}"
    );
    assert!(screen.contains('█'), "the bar is drawn: {screen}");

    let mut quiet = args.to_vec();
    quiet.push("--quiet");
    let (screen, stdout) = under_a_terminal(dir.path(), &quiet).await;
    serde_json::from_str::<Value>(&stdout).expect("stdout is one JSON object");
    assert!(
        !screen.contains("chunks") && !screen.contains("ETA"),
        "--quiet shows nothing: {screen}"
    );
}

#[tokio::test]
async fn the_local_estimate_needs_no_key_and_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), true);
    let job = dir.path().join("local.toml");
    std::fs::write(
        &job,
        format!(
            "[source]\nkind = \"files\"\npaths = [\"{}\"]\n[chunking]\nmax_tokens = 64\noverlap_tokens = 8\n\
             [backend]\nkind = \"local\"\nmax_inputs_per_request = 6\n[output]\npath = \"{}\"\n",
            root.display(),
            dir.path().join("out/local.parquet").display()
        ),
    )
    .unwrap();
    let mut command = bin();
    command.args(["estimate", path_arg(&job), "--json"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let estimate: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(estimate["backend"], "local");
    assert_eq!(estimate["cost"].as_f64(), Some(0.0));
    assert_eq!(estimate["dimensions"], 384);

    let mut command = bin();
    command.args(["run", path_arg(&job), "--json", "--quiet"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(estimate["requests"], summary["requests"]);
    assert_eq!(estimate["chunks"], summary["chunks"]);
    // Counted with the model's own tokenizer, as the run counts its chunks;
    // the model's usage adds [CLS] and [SEP] to every chunk.
    assert_eq!(estimate["tokens"], summary["estimated_tokens"]);
    assert_eq!(
        summary["usage"]["prompt_tokens"].as_u64(),
        Some(
            estimate["tokens"].as_u64().unwrap() + 2 * estimate["chunks_to_send"].as_u64().unwrap()
        )
    );
}
