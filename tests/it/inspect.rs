//! `inspect`: an output checked after the fact, its metadata shown and every
//! vector checked.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, RecordBatch, StringArray,
};
use arrow::datatypes::Float32Type;
use embedjob::simulate::{SimConfig, Simulator};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use serde_json::Value;

use crate::support::{embedjob, json, path_arg, simulator, text, write_cost_job};

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

/// Runs a small job and returns the output's path.
async fn good_output(dir: &Path, sim: &Simulator) -> PathBuf {
    let job = write_cost_job(dir, &sim.base_url(), "");
    let output = embedjob(&["run", path_arg(&job), "--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    dir.join("out/result.parquet")
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

/// Regression: two jobs' outputs in one folder made `inspect out/` report
/// every shared id as a repeat. A folder is checked as one dataset: files of
/// different jobs or configurations are reported once as a mix, and ids are
/// checked within each dataset.
#[tokio::test]
async fn regression_inspect_says_when_a_directory_mixes_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let first = good_output(dir.path(), &sim).await;
    // The same documents, so the same ids, by another job with another model.
    let job = write_cost_job(dir.path(), &sim.base_url(), "");
    let other = dir.path().join("out/large.parquet");
    let output = embedjob(&[
        "run",
        path_arg(&job),
        "--quiet",
        "--set",
        "name=large",
        "--set",
        "backend.model=svc-embed-1-l",
        "--set",
        &format!("output.path={}", other.display()),
    ])
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let folder = first.parent().unwrap();

    let output = embedjob(&["inspect", path_arg(folder)]).await;
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("one_dataset: "), "{stdout}");
    assert!(stdout.contains("mixes 2 datasets"), "{stdout}");
    assert!(
        stdout.contains("job \"large\", model svc-embed-1-l, 3072 dimensions: large.parquet"),
        "{stdout}"
    );
    assert!(
        stdout.contains("job \"cost\", model svc-embed-1, 1024 dimensions: result.parquet"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("unique_ids"),
        "no repeats across datasets: {stdout}"
    );
    assert!(stdout.contains("; 1 problem\n"), "{stdout}");
    assert!(
        text(&output.stderr).contains("1 failed check"),
        "{}",
        text(&output.stderr)
    );

    let output = embedjob(&["inspect", path_arg(folder), "--json"]).await;
    let report = json(&output);
    assert_eq!(report["datasets"].as_array().unwrap().len(), 2);
    assert_eq!(report["problems"][0]["check"], "one_dataset");
    // Each file on its own passes.
    for file in [&first, &other] {
        let output = embedjob(&["inspect", path_arg(file)]).await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
    }
}
