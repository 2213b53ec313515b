//! A job split into shards (`--shard I/N`), run as separate processes at
//! once against one service: the shards' files make the single run's
//! dataset, under one quota, each shard re-runs and resumes on its own, and
//! a pgvector table is shared by all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use embedjob::job::Shard;
use embedjob::simulate::{self, QuotaConfig, SimConfig, Simulator};
use serde_json::Value;

use crate::support::{
    bin, corpus, expected_chunks, files_source, no_key, read_output, run, run_job, run_pg,
    simulator, spawn_job, text, text_hash, wait, wait_for_billed, write_job, write_pg_job, TestDb,
    KEY, PASSWORD_ENV,
};

const SHARDS: u32 = 4;

/// The chunks of `expected` whose document belongs to `shard`.
fn of_shard(expected: &BTreeMap<String, String>, shard: u32) -> BTreeMap<String, String> {
    expected
        .iter()
        .filter(|(id, _)| Shard::of(doc_id(id), SHARDS) == shard)
        .map(|(id, text)| (id.clone(), text.clone()))
        .collect()
}

fn doc_id(chunk_id: &str) -> &str {
    chunk_id.rsplit_once('#').map_or(chunk_id, |(doc, _)| doc)
}

fn shard_file(dir: &Path, index: u32) -> PathBuf {
    dir.join(Shard::new(index, SHARDS).unwrap().file_name())
}

/// Rows of a Parquet file by id: text and vector.
fn rows_by_id(path: &Path) -> BTreeMap<String, (String, Vec<f32>)> {
    let rows = read_output(path);
    rows.ids
        .into_iter()
        .zip(rows.texts)
        .zip(rows.vectors)
        .map(|((id, text), vector)| (id, (text, vector)))
        .collect()
}

/// The union of the shards' files; ids repeated across them fail.
fn union(dir: &Path) -> BTreeMap<String, (String, Vec<f32>)> {
    let mut all = BTreeMap::new();
    for index in 0..SHARDS {
        let rows = rows_by_id(&shard_file(dir, index));
        for (id, row) in rows {
            assert_eq!(
                Shard::of(doc_id(&id), SHARDS),
                index,
                "{id} is in shard {index}'s file"
            );
            assert!(all.insert(id.clone(), row).is_none(), "{id} in two shards");
        }
    }
    all
}

/// pyarrow, DuckDB, Polars and LanceDB read the directory as one table:
/// the same rows, ids and vectors as `rows`.
async fn readers_see_one_table(shards: &Path, rows: &BTreeMap<String, (String, Vec<f32>)>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python (scripts/test does)",
        python.display()
    );
    let mut command = std::process::Command::new(python);
    command
        .arg(root.join("tests/reference/read_dataset.py"))
        .arg(shards);
    let output = run(command).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    let ids: Vec<&str> = rows.keys().map(String::as_str).collect();
    let ids = text_hash(&ids.join("\n"));
    let sum: f64 = rows
        .values()
        .flat_map(|(_, vector)| vector.iter().map(|v| f64::from(*v)))
        .sum();
    for reader in ["pyarrow", "duckdb", "polars", "lancedb"] {
        let got = &seen[reader];
        assert_eq!(
            got["rows"].as_u64(),
            Some(rows.len() as u64),
            "{reader}: {seen}"
        );
        assert_eq!(got["ids"].as_str(), Some(ids.as_str()), "{reader}'s ids");
        assert_eq!(got["dimensions"].as_u64(), Some(1024), "{reader}");
        let read = got["vector_sum"].as_f64().unwrap();
        assert!(
            (read - sum).abs() < 0.01,
            "{reader}: vector sum {read}, not {sum}"
        );
    }
}

fn json(output: &Output) -> Value {
    let (stdout, stderr) = no_key(output, KEY);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

fn expect_exit(output: &Output, code: i32) {
    assert_eq!(output.status.code(), Some(code), "{}", text(&output.stderr));
}

/// Runs the `SHARDS` shards of `job` as processes at once; their outputs in
/// shard order.
async fn run_shards(job: &Path, extra: &[&str]) -> Vec<Output> {
    let children: Vec<_> = (0..SHARDS)
        .map(|i| {
            let shard = format!("{i}/{SHARDS}");
            let mut args = vec!["--json", "--quiet", "--shard", shard.as_str()];
            args.extend_from_slice(extra);
            spawn_job(job, &args)
        })
        .collect();
    let mut outputs = Vec::new();
    for child in children {
        outputs.push(wait(child).await);
    }
    outputs
}

/// How many times each text must be billed: once per shard that has a chunk
/// with that text (shards do not see each other's texts).
fn bills_expected(expected: &BTreeMap<String, String>) -> HashMap<String, u64> {
    let mut shards_of: HashMap<String, HashSet<u32>> = HashMap::new();
    for (id, text) in expected {
        shards_of
            .entry(text_hash(text))
            .or_default()
            .insert(Shard::of(doc_id(id), SHARDS));
    }
    shards_of
        .into_iter()
        .map(|(hash, shards)| (hash, shards.len() as u64))
        .collect()
}

fn quota_sim() -> SimConfig {
    SimConfig {
        latency_ms: 5,
        quota: QuotaConfig {
            requests_per_minute: Some(10),
            window: Duration::from_millis(500),
            ..QuotaConfig::default()
        },
        ..SimConfig::default()
    }
}

fn edit_corpus(root: &Path) -> Vec<String> {
    // A document of each of two shards changes, one is added, one is deleted.
    let mut touched = Vec::new();
    for (name, body) in [
        (
            "doc001.md",
            "# Document 1\n\nRewritten: nothing here was embedded before.\n",
        ),
        (
            "doc002.md",
            "# Document 2\n\nAlso rewritten, a new text for its shard.\n",
        ),
        (
            "doc900.md",
            "# Document 900\n\nA new document, new to every shard.\n",
        ),
    ] {
        std::fs::write(root.join(name), body).unwrap();
        touched.push(name.to_string());
    }
    std::fs::remove_file(root.join("doc004.md")).unwrap();
    touched.push("doc004.md".to_string());
    touched
}

#[tokio::test]
async fn four_shards_at_once_under_one_quota_make_the_single_runs_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let expected = expected_chunks(&root);
    let sim = simulator(quota_sim()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let shards = dir.path().join("out/shards");
    let out = format!("output.path={}", shards.display());
    let small = "backend.max_inputs_per_request=2";
    let outputs = run_shards(&job, &["--set", &out, "--set", small]).await;
    let mut throttled = 0;
    for (i, output) in outputs.iter().enumerate() {
        expect_exit(output, 0);
        let summary = json(output);
        throttled += summary["throttled"].as_u64().unwrap();
        assert_eq!(summary["shard"], format!("{i}/{SHARDS}"));
        let mine = of_shard(&expected, i as u32);
        assert_eq!(summary["written"].as_u64(), Some(mine.len() as u64));
    }

    // The same job run whole, on a service of its own.
    let single = simulator(SimConfig::default()).await;
    let whole = dir.path().join("single.parquet");
    let output = run_job(
        &job,
        &[
            "--quiet",
            "--set",
            &format!("backend.base_url={}", single.base_url()),
            "--set",
            &format!("output.path={}", whole.display()),
        ],
    )
    .await;
    expect_exit(&output, 0);
    assert_eq!(
        union(&shards),
        rows_by_id(&whole),
        "the shards make the single run's rows"
    );
    assert_eq!(union(&shards).len(), expected.len());

    // Every text billed once per shard that holds it, and the quota held:
    // four processes paced by one key's headers are rarely refused.
    let ledger = sim.ledger();
    assert_eq!(
        ledger.texts,
        bills_expected(&expected),
        "no text billed twice"
    );
    let refused = ledger.refused_total();
    eprintln!(
        "shards: {refused} of {} requests refused",
        ledger.embedding_requests
    );
    assert!(
        refused * 10 <= ledger.embedding_requests,
        "{refused} of {} requests refused",
        ledger.embedding_requests
    );
    assert_eq!(
        throttled, refused,
        "every refusal waited out, none failed a run"
    );

    // The directory is one dataset: every shard, unique ids, summed usage.
    let mut inspect = bin();
    inspect.arg("inspect").arg(&shards).arg("--json");
    let report = run(inspect).await;
    expect_exit(&report, 0);
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(
        report["totals"]["rows"].as_u64(),
        Some(expected.len() as u64)
    );
    assert_eq!(
        report["totals"]["prompt_tokens"].as_u64(),
        Some(ledger.prompt_tokens),
        "usage summed over the shards"
    );
    let state: Vec<_> = std::fs::read_dir(&shards).unwrap().collect();
    assert_eq!(
        state.len(),
        SHARDS as usize,
        "nothing but the shards' files"
    );

    readers_see_one_table(&shards, &union(&shards)).await;
    each_shard_reruns_with_only_its_new_texts(&sim, &job, &root, &shards, &expected).await;
}

/// Edits the corpus and runs the shards again: each sends only its own new
/// texts, and the directory follows the edits.
async fn each_shard_reruns_with_only_its_new_texts(
    sim: &Simulator,
    job: &Path,
    root: &Path,
    shards: &Path,
    expected: &BTreeMap<String, String>,
) {
    let out = format!("output.path={}", shards.display());
    let before: HashSet<String> = expected.values().cloned().collect();
    edit_corpus(root);
    let after = expected_chunks(root);
    let billed_before = sim.ledger().texts;
    let outputs = run_shards(job, &["--set", &out]).await;
    for (i, output) in outputs.iter().enumerate() {
        expect_exit(output, 0);
        let new: HashSet<String> = of_shard(&after, i as u32)
            .into_values()
            .filter(|t| !before.contains(t))
            .collect();
        let summary = json(output);
        assert_eq!(
            summary["embedded"].as_u64(),
            Some(new.len() as u64),
            "shard {i} sends only its new texts: {summary}"
        );
    }
    let billed_after = sim.ledger().texts;
    let newly: HashSet<&String> = billed_after
        .iter()
        .filter(|(hash, n)| billed_before.get(*hash) != Some(n))
        .map(|(hash, _)| hash)
        .collect();
    let wanted: HashSet<String> = after
        .values()
        .filter(|t| !before.contains(*t))
        .map(|t| text_hash(t))
        .collect();
    assert_eq!(
        newly,
        wanted.iter().collect(),
        "only the new texts were billed"
    );
    let rows = union(shards);
    assert_eq!(
        rows.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "the deleted document's rows are gone, the new ones are there"
    );
    for (id, (text, vector)) in &rows {
        assert_eq!(&after[id], text);
        assert_eq!(vector, &simulate::embedding_vector(1024, text), "{id}");
    }
}

/// The files of the shards other than `index`: their bytes and times.
fn others(
    shards: &Path,
    state: &Path,
    index: u32,
) -> BTreeMap<PathBuf, (Vec<u8>, std::time::SystemTime)> {
    let mut files = BTreeMap::new();
    for dir in [shards, state] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_file() && !name.starts_with(&Shard::new(index, SHARDS).unwrap().name()) {
                let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
                files.insert(path.clone(), (std::fs::read(&path).unwrap(), modified));
            }
        }
    }
    files
}

#[tokio::test]
async fn a_killed_shard_resumes_alone_and_the_dataset_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 48);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig {
        latency_ms: 40,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let shards = dir.path().join("out/shards");
    let state = dir.path().join("out/shards.embedjob");
    let out = format!("output.path={}", shards.display());
    let settings = [
        "--quiet",
        "--set",
        out.as_str(),
        "--set",
        "backend.max_inputs_per_request=2",
        "--set",
        "backend.concurrency=2",
    ];
    for index in 1..SHARDS {
        let shard = format!("{index}/{SHARDS}");
        let output = run_job(&job, &[&settings[..], &["--shard", &shard]].concat()).await;
        expect_exit(&output, 0);
    }
    let before = others(&shards, &state, 0);
    let billed_by_others = sim.ledger().billed_requests;

    let zero = [&settings[..], &["--shard", "0/4"]].concat();
    let mut killed = spawn_job(&job, &zero);
    assert!(
        wait_for_billed(&sim, &mut killed, billed_by_others + 3).await,
        "shard 0 was still running when killed"
    );
    killed.kill().unwrap();
    let killed = wait(killed).await;
    assert_eq!(killed.status.code(), None, "killed by a signal");
    assert!(state.join("part-00000-of-00004.parquet.lock").exists());
    assert!(
        !shard_file(&shards, 0).exists(),
        "a killed shard writes no file"
    );

    let output = run_job(&job, &zero).await;
    expect_exit(&output, 0);
    assert_eq!(
        others(&shards, &state, 0),
        before,
        "the other shards untouched"
    );
    let rows = union(&shards);
    assert_eq!(rows.len(), expected.len(), "the dataset is whole");
    for (id, (text, _)) in &rows {
        assert_eq!(&expected[id], text);
    }
    // What the one kill lost (docs/running.md): at most `concurrency` (2)
    // requests of `max_inputs_per_request` (2) texts in flight, plus as many
    // texts answered and waiting for their commit: 2 × 2 × 2.
    let billed_twice: u64 = sim
        .ledger()
        .texts
        .values()
        .map(|n| n.saturating_sub(1))
        .sum();
    let duplicates: u64 = bills_expected(&expected).values().map(|n| n - 1).sum();
    assert!(
        billed_twice - duplicates <= 2 * 2 * 2,
        "{billed_twice} texts billed twice"
    );
    let mut inspect = bin();
    inspect.arg("inspect").arg(&shards);
    expect_exit(&run(inspect).await, 0);

    // A damaged shard file is reported as damaged, not as a missing shard.
    let damaged = shard_file(&shards, 3);
    let bytes = std::fs::read(&damaged).unwrap();
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let mut inspect = bin();
    inspect.arg("inspect").arg(&shards).arg("--json");
    let output = run(inspect).await;
    expect_exit(&output, 1);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    let file = &report["files"][3];
    assert_eq!(file["problems"][0]["check"], "readable", "{file}");
}

#[tokio::test]
async fn the_shard_comes_from_the_schedulers_environment_and_bad_splits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let shards = dir.path().join("out/result.parquet");
    let scheduled = |env: &[(&str, &str)], shard: &str| {
        let mut command = bin();
        command
            .env("EMBEDJOB_API_KEY", KEY)
            .envs(env.iter().copied())
            .args(["run", "--quiet", "--json", "--shard", shard])
            .arg(&job);
        command
    };
    // A Kubernetes Indexed Job gives the index; the count is the flag's.
    let output = run(scheduled(&[("JOB_COMPLETION_INDEX", "1")], "4")).await;
    expect_exit(&output, 0);
    assert_eq!(json(&output)["shard"], "1/4");
    assert!(shard_file(&shards, 1).exists());
    // The progress lines of processes sharing a terminal say which shard they are.
    let output = run_job(&job, &["--shard", "1/4"]).await;
    expect_exit(&output, 0);
    let (stdout, stderr) = no_key(&output, KEY);
    assert!(stderr.starts_with("embedjob shard 1/4: "), "{stderr}");
    assert!(stdout.starts_with("test (shard 1/4): "), "{stdout}");
    // A Slurm array (--array=1-4) gives both; its ids start at 1.
    let slurm = [
        ("SLURM_ARRAY_TASK_ID", "3"),
        ("SLURM_ARRAY_TASK_MIN", "1"),
        ("SLURM_ARRAY_TASK_COUNT", "4"),
    ];
    let output = run(scheduled(&slurm, "auto")).await;
    expect_exit(&output, 0);
    assert_eq!(json(&output)["shard"], "2/4");
    assert_eq!(
        rows_by_id(&shard_file(&shards, 2)).len(),
        of_shard(&expected, 2).len()
    );
    // Without the environment, a count alone is refused before any work.
    let requests = sim.ledger().embedding_requests;
    let output = run(scheduled(&[], "4")).await;
    expect_exit(&output, 2);
    assert!(
        text(&output.stderr).contains("JOB_COMPLETION_INDEX"),
        "{}",
        text(&output.stderr)
    );
    for bad in ["4/4", "x", "1/0"] {
        let output = run(scheduled(&[], bad)).await;
        expect_exit(&output, 2);
        assert!(text(&output.stderr).contains(&format!("--shard {bad}")));
    }
    // Files of another split would hold the same documents twice.
    let output = run(scheduled(&[], "0/2")).await;
    expect_exit(&output, 2);
    let stderr = text(&output.stderr);
    assert!(stderr.contains("part-00001-of-00004.parquet"), "{stderr}");
    assert!(!shards.join("part-00000-of-00002.parquet").exists());
    // A file where the directory should be.
    let file = dir.path().join("out/file.parquet");
    std::fs::write(&file, b"not a directory").unwrap();
    let mut command = scheduled(&[], "0/4");
    command.args(["--set", &format!("output.path={}", file.display())]);
    let output = run(command).await;
    expect_exit(&output, 2);
    assert!(
        text(&output.stderr).contains("is a file"),
        "{}",
        text(&output.stderr)
    );
    // Without --shard, the directory is not taken for a file.
    let output = run_job(&job, &["--quiet"]).await;
    expect_exit(&output, 2);
    assert!(
        text(&output.stderr).contains("is the directory of a split job's shards"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(sim.ledger().embedding_requests, requests, "nothing sent");

    // The two missing shards are named by inspect.
    let mut inspect = bin();
    inspect.arg("inspect").arg(&shards);
    let output = run(inspect).await;
    expect_exit(&output, 1);
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains(
            "2 of 4 shards are missing: part-00000-of-00004.parquet, part-00003-of-00004.parquet"
        ),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_shards_estimate_counts_its_own_documents() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "requests_per_minute = 40\ntokens_per_minute = 100000",
    );
    let estimate = |shard: Option<String>| {
        let mut command = bin();
        command
            .env("EMBEDJOB_API_KEY", KEY)
            .args(["estimate", "--json"])
            .arg(&job);
        if let Some(shard) = shard {
            command.args(["--shard", &shard]);
        }
        run(command)
    };
    let whole = estimate(None).await;
    expect_exit(&whole, 0);
    let whole = json(&whole);
    assert_eq!(whole["requests_per_minute"].as_u64(), Some(40));
    let mut chunks = 0;
    for i in 0..SHARDS {
        let output = estimate(Some(format!("{i}/{SHARDS}"))).await;
        expect_exit(&output, 0);
        let part = json(&output);
        assert_eq!(part["shard"], format!("{i}/{SHARDS}"));
        assert_eq!(
            part["chunks"].as_u64(),
            Some(of_shard(&expected, i).len() as u64)
        );
        chunks += part["chunks"].as_u64().unwrap();
        // The job's limits are the whole job's: each shard gets its share.
        assert_eq!(part["requests_per_minute"].as_u64(), Some(10));
        assert_eq!(part["tokens_per_minute"].as_u64(), Some(25_000));
    }
    assert_eq!(whole["chunks"].as_u64(), Some(chunks));
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "an estimate sends nothing"
    );
    let output = estimate(Some("0/41".to_string())).await;
    expect_exit(&output, 2);
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("`backend.requests_per_minute` is 40"),
        "{stderr}"
    );

    // Two shards run; the whole job's estimate finds what they hold.
    for i in 0..2 {
        expect_exit(
            &run_job(&job, &["--quiet", "--shard", &format!("{i}/{SHARDS}")]).await,
            0,
        );
    }
    let stored: HashSet<String> = (0..2)
        .flat_map(|i| of_shard(&expected, i).into_values())
        .collect();
    let new: HashSet<&String> = expected.values().filter(|t| !stored.contains(*t)).collect();
    let billed = sim.ledger().embedding_requests;
    let output = estimate(None).await;
    expect_exit(&output, 0);
    let whole = json(&output);
    assert_eq!(whole["shards"].as_u64(), Some(u64::from(SHARDS)), "{whole}");
    assert_eq!(whole["chunks"].as_u64(), Some(expected.len() as u64));
    assert_eq!(
        whole["chunks_to_send"].as_u64(),
        Some(new.len() as u64),
        "{whole}"
    );
    assert_eq!(
        sim.ledger().embedding_requests,
        billed,
        "an estimate sends nothing"
    );
    // A run of the whole job over the shards' directory is refused.
    let output = run_job(&job, &["--quiet"]).await;
    expect_exit(&output, 2);
    assert!(text(&output.stderr).contains("split job's shards"));
}

/// A job over a corpus of `documents` into table `chunks` of a database
/// of its own, against a simulator.
struct PgJob {
    db: TestDb,
    dir: tempfile::TempDir,
    root: PathBuf,
    expected: BTreeMap<String, String>,
    sim: Simulator,
    job: PathBuf,
}

impl PgJob {
    async fn new(documents: usize) -> PgJob {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let root = corpus(dir.path(), documents);
        let expected = expected_chunks(&root);
        let sim = simulator(SimConfig {
            latency_ms: 5,
            ..SimConfig::default()
        })
        .await;
        let source = files_source(&root);
        let job = write_pg_job(dir.path(), &sim.base_url(), &source, &db, "chunks", "");
        PgJob {
            db,
            dir,
            root,
            expected,
            sim,
            job,
        }
    }
}

#[tokio::test]
async fn four_shards_write_one_pgvector_table_and_each_syncs_only_its_own_rows() {
    let PgJob {
        db,
        dir: _dir,
        root,
        expected,
        sim,
        job,
    } = PgJob::new(32).await;
    let children: Vec<_> = (0..SHARDS)
        .map(|i| {
            let mut command = bin();
            command
                .env("EMBEDJOB_API_KEY", KEY)
                .env(PASSWORD_ENV, &db.password)
                .args([
                    "run",
                    "--quiet",
                    "--json",
                    "--shard",
                    &format!("{i}/{SHARDS}"),
                ])
                .arg(&job)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            command.spawn().unwrap()
        })
        .collect();
    for child in children {
        expect_exit(&wait(child).await, 0);
    }
    let rows = db.rows("chunks").await;
    assert_eq!(
        rows.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "the table holds every shard's chunks once"
    );
    for (id, (text, hash, vector)) in &rows {
        assert_eq!(&expected[id], text);
        assert_eq!(hash, &text_hash(text));
        assert_eq!(vector, &simulate::embedding_vector(1024, text));
    }
    let metadata = db.metadata("chunks").await;
    for i in 0..SHARDS {
        let key = format!("part-{i:05}-of-00004:embedjob.generation");
        assert_eq!(
            metadata.get(&key).map(String::as_str),
            Some("1"),
            "{metadata:?}"
        );
    }

    // Edits in every shard; shard 1 alone runs again: only its texts are
    // sent, only its rows change, and the others' stay as they were.
    let before: HashSet<String> = expected.values().cloned().collect();
    edit_corpus(&root);
    let after = expected_chunks(&root);
    let billed = sim.ledger().billed_requests;
    let output = run_pg(&job, &db, &["--json", "--quiet", "--shard", "1/4"]).await;
    expect_exit(&output, 0);
    let mine_after = of_shard(&after, 1);
    let new_texts = mine_after.values().filter(|t| !before.contains(*t)).count();
    assert_eq!(json(&output)["embedded"].as_u64(), Some(new_texts as u64));
    assert!(sim.ledger().billed_requests > billed || new_texts == 0);
    let rows = db.rows("chunks").await;
    let wanted: BTreeMap<String, String> = expected
        .iter()
        .filter(|(id, _)| Shard::of(doc_id(id), SHARDS) != 1)
        .chain(mine_after.iter())
        .map(|(id, text)| (id.clone(), text.clone()))
        .collect();
    assert_eq!(
        rows.iter()
            .map(|(id, row)| (id.clone(), row.0.clone()))
            .collect::<BTreeMap<_, _>>(),
        wanted,
        "shard 1's rows follow the edits, the others' are untouched"
    );

    // The other shards catch up; the table then follows the whole corpus.
    for i in [0, 2, 3] {
        let output = run_pg(&job, &db, &["--quiet", "--shard", &format!("{i}/{SHARDS}")]).await;
        expect_exit(&output, 0);
    }
    let rows = db.rows("chunks").await;
    assert_eq!(
        rows.iter()
            .map(|(id, row)| (id.clone(), row.0.clone()))
            .collect::<BTreeMap<_, _>>(),
        after
    );

    one_configuration_per_table(&job, &db).await;
}

/// The table is one dataset: a shard that starts afresh under another
/// configuration removes the rows the others made under the old one, and a
/// shard still under the old one is refused.
async fn one_configuration_per_table(job: &Path, db: &TestDb) {
    let changed = "chunking.max_tokens=48";
    let output = run_pg(
        job,
        db,
        &["--quiet", "--shard", "2/4", "--set", changed, "--fresh"],
    )
    .await;
    expect_exit(&output, 0);
    assert!(text(&output.stderr).contains("removed the rows shard 0/4 made"));
    let rows = db.rows("chunks").await;
    assert!(!rows.is_empty());
    assert!(rows.keys().all(|id| Shard::of(doc_id(id), SHARDS) == 2));
    let output = run_pg(job, db, &["--quiet", "--shard", "3/4"]).await;
    expect_exit(&output, 2);
    let stderr = text(&output.stderr);
    assert!(stderr.contains("different configuration"), "{stderr}");
    let output = run_pg(job, db, &["--quiet", "--shard", "3/4", "--set", changed]).await;
    expect_exit(&output, 0);
    let rows = db.rows("chunks").await;
    assert!(rows.keys().any(|id| Shard::of(doc_id(id), SHARDS) == 3));
}

/// The Kubernetes manifest in `examples/shards/`, read with PyYAML: the
/// container's arguments, the Job's completions and the ConfigMap's job file.
async fn kubernetes_example() -> (Vec<String>, u64, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = "import json, sys, yaml\n\
        docs = list(yaml.safe_load_all(open(sys.argv[1])))\n\
        job = next(d for d in docs if d['kind'] == 'Job')\n\
        config = next(d for d in docs if d['kind'] == 'ConfigMap')\n\
        print(json.dumps({'args': job['spec']['template']['spec']['containers'][0]['args'],\n\
            'completions': job['spec']['completions'], 'job': config['data']['docs.toml']}))";
    let mut command = std::process::Command::new(root.join(".cache/venv/bin/python"));
    command
        .args(["-c", read])
        .arg(root.join("examples/shards/kubernetes-indexed-job.yaml"));
    let output = run(command).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let manifest: Value = serde_json::from_slice(&output.stdout).unwrap();
    let args = manifest["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    (
        args,
        manifest["completions"].as_u64().unwrap(),
        manifest["job"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn the_scheduler_examples_run_their_shards() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 16);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig::default()).await;

    // Kubernetes: the ConfigMap's job file, pointed at the corpus and the
    // simulator, run with the container's arguments in 4 "pods".
    let (args, completions, job_text) = kubernetes_example().await;
    assert_eq!(completions, u64::from(SHARDS));
    let job = dir.path().join("docs.toml");
    std::fs::write(&job, job_text).unwrap();
    let shards = dir.path().join("k8s");
    let overrides = [
        format!("source.paths=[\"{}\"]", root.display()),
        format!("backend.base_url={}", sim.base_url()),
        "backend.model=svc-embed-1".to_string(),
        "chunking.max_tokens=64".to_string(),
        "chunking.overlap_tokens=8".to_string(),
        format!("output.path={}", shards.display()),
    ];
    for index in 0..SHARDS {
        let mut command = bin();
        command
            .env("EMBEDJOB_API_KEY", KEY)
            .env("JOB_COMPLETION_INDEX", index.to_string());
        for arg in &args {
            command.arg(if arg == "/jobs/docs.toml" {
                job.as_os_str()
            } else {
                arg.as_ref()
            });
        }
        for o in &overrides {
            command.args(["--set", o]);
        }
        expect_exit(&run(command).await, 0);
    }
    assert_eq!(union(&shards).len(), expected.len());

    // Slurm: the array script as 4 tasks of --array=1-4.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shards/slurm-array.sh");
    let slurm_job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_embedjob")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for task in 1..=SHARDS {
        let mut command = std::process::Command::new("bash");
        command
            .arg(&script)
            .env("PATH", &path)
            .env("EMBEDJOB_API_KEY", KEY)
            .env("JOB_FILE", &slurm_job)
            .env("SLURM_ARRAY_TASK_ID", task.to_string())
            .env("SLURM_ARRAY_TASK_MIN", "1")
            .env("SLURM_ARRAY_TASK_COUNT", SHARDS.to_string());
        expect_exit(&run(command).await, 0);
    }
    let slurm = dir.path().join("out/result.parquet");
    assert_eq!(
        union(&slurm),
        union(&shards),
        "one job, one dataset, either way"
    );
}

#[tokio::test]
async fn a_table_filled_by_a_whole_run_is_split_without_paying_again() {
    let PgJob {
        db,
        dir: _dir,
        expected,
        sim,
        job,
        ..
    } = PgJob::new(12).await;
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);
    let billed = sim.ledger().billed_requests;
    for i in 0..2 {
        let output = run_pg(
            &job,
            &db,
            &["--json", "--quiet", "--shard", &format!("{i}/2")],
        )
        .await;
        expect_exit(&output, 0);
        let summary = json(&output);
        assert_eq!(summary["embedded"].as_u64(), Some(0), "{summary}");
        assert_eq!(summary["removed"].as_u64(), Some(0), "{summary}");
    }
    assert_eq!(sim.ledger().billed_requests, billed, "nothing sent again");
    let rows = db.rows("chunks").await;
    assert_eq!(rows.len(), expected.len());
    // A whole run again takes the table back from the shards.
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);
    let metadata = db.metadata("chunks").await;
    assert!(
        metadata.keys().all(|k| !k.starts_with("part-")),
        "{metadata:?}"
    );
    assert_eq!(sim.ledger().billed_requests, billed);
}

#[tokio::test]
async fn a_shard_without_documents_writes_an_empty_file_with_the_inputs_columns() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.jsonl");
    let records: String = (0..3)
        .map(|i| {
            format!(
                "{{\"id\": \"r{i}\", \"text\": \"record {i} has some text\", \"lang\": \"en\"}}\n"
            )
        })
        .collect();
    std::fs::write(&input, records).unwrap();
    let source = format!(
        "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"\nmetadata_fields = [\"lang\"]",
        input.display()
    );
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &source, "");
    let shards = dir.path().join("out/result.parquet");
    let count = 8;
    let mut empty = 0;
    for index in 0..count {
        let output = run_job(
            &job,
            &["--json", "--quiet", "--shard", &format!("{index}/{count}")],
        )
        .await;
        expect_exit(&output, 0);
        let file = shards.join(Shard::new(index, count).unwrap().file_name());
        let rows = read_output(&file);
        assert_eq!(rows.metadata["embedjob.shard"], format!("{index}/{count}"));
        if rows.ids.is_empty() {
            empty += 1;
            assert_eq!(json(&output)["written"].as_u64(), Some(0));
        }
    }
    assert!(empty >= 5, "3 records leave most of 8 shards empty");
    let mut inspect = bin();
    inspect.arg("inspect").arg(&shards);
    expect_exit(&run(inspect).await, 0);
    // Every reader sees the three rows, the empty files' columns agreeing.
    let mut rows = BTreeMap::new();
    for entry in std::fs::read_dir(&shards).unwrap() {
        rows.extend(rows_by_id(&entry.unwrap().path()));
    }
    assert_eq!(rows.len(), 3);
    readers_see_one_table(&shards, &rows).await;
}

#[tokio::test]
async fn regression_two_splits_started_at_once_both_wrote_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let counts = |shards: &Path| -> HashSet<u32> {
        std::fs::read_dir(shards)
            .map(|entries| {
                entries
                    .filter_map(|e| Shard::from_file_name(e.unwrap().file_name().to_str()?))
                    .map(|s| s.count)
                    .collect()
            })
            .unwrap_or_default()
    };
    // Pairs of splits, each into a directory of its own, started at once.
    for (round, (a, b)) in [(4, 8), (2, 3), (8, 4)].into_iter().enumerate() {
        let shards = dir.path().join(format!("out{round}/result.parquet"));
        let path = format!("output.path={}", shards.display());
        let spawn = |spec: String| {
            spawn_job(
                &job,
                &["--quiet", "--shard", spec.as_str(), "--set", path.as_str()],
            )
        };
        let (first, second) = (spawn(format!("1/{a}")), spawn(format!("1/{b}")));
        let (first, second) = (wait(first).await, wait(second).await);
        let (kept, refused, output) = match (first.status.code(), second.status.code()) {
            (Some(0), Some(2)) => (a, b, &second),
            (Some(2), Some(0)) => (b, a, &first),
            codes => panic!(
                "{codes:?}: {}\n{}",
                text(&first.stderr),
                text(&second.stderr)
            ),
        };
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains(&format!("into {kept} shards"))
                || stderr.contains(&format!("-of-{kept:05}.parquet")),
            "names the split already there: {stderr}"
        );
        assert_eq!(counts(&shards), HashSet::from([kept]), "one split survives");
        // Later, one after the other, even before any of its files is written (here,
        // removed): the other split is still refused, the kept one runs on.
        std::fs::remove_dir_all(&shards).unwrap();
        let output = wait(spawn(format!("0/{refused}"))).await;
        expect_exit(&output, 2);
        let stderr = text(&output.stderr);
        assert!(stderr.contains(&format!("into {kept} shards")), "{stderr}");
        assert!(counts(&shards).is_empty(), "nothing written: {stderr}");
        expect_exit(&wait(spawn(format!("0/{kept}"))).await, 0);
        assert_eq!(counts(&shards), HashSet::from([kept]));
    }
}

#[tokio::test]
async fn regression_a_document_renamed_between_shard_runs_was_held_twice_unnoticed() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let shards = dir.path().join("out/result.parquet");
    let inspect = || async {
        let mut command = bin();
        command.arg("inspect").arg(&shards);
        run(command).await
    };
    let all_shards = || async {
        for output in run_shards(&job, &[]).await {
            expect_exit(&output, 0);
        }
    };
    let run_one = |index: u32| {
        let (spec, job) = (format!("{index}/{SHARDS}"), job.clone());
        async move { run_job(&job, &["--quiet", "--shard", spec.as_str()]).await }
    };
    let id_of = |name: &str| -> String {
        let ids: HashSet<String> = expected_chunks(&root)
            .keys()
            .map(|id| doc_id(id).to_string())
            .collect();
        ids.into_iter().find(|id| id.ends_with(name)).unwrap()
    };
    all_shards().await;
    expect_exit(&inspect().await, 0);

    // Renamed into another shard, and only that shard runs: the document is in two files.
    let old = id_of("doc001.md");
    let (name, new) = (0..64)
        .map(|k| format!("renamed{k}.md"))
        .map(|name| (name.clone(), old.replace("doc001.md", &name)))
        .find(|(_, new)| Shard::of(new, SHARDS) != Shard::of(&old, SHARDS))
        .unwrap();
    std::fs::rename(root.join("doc001.md"), root.join(&name)).unwrap();
    expect_exit(&run_one(Shard::of(&new, SHARDS)).await, 0);
    let output = inspect().await;
    expect_exit(&output, 1);
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("the shards read different inputs"),
        "{stdout}"
    );
    // Once every shard has run on the same input, it is there once.
    all_shards().await;
    expect_exit(&inspect().await, 0);
    let docs: HashSet<String> = union(&shards)
        .keys()
        .map(|id| doc_id(id).to_string())
        .collect();
    assert!(docs.contains(&new) && !docs.contains(&old));

    // Removed, and a shard not its own runs: its copy is still held.
    let gone = id_of("doc002.md");
    std::fs::remove_file(root.join("doc002.md")).unwrap();
    let other = (Shard::of(&gone, SHARDS) + 1) % SHARDS;
    expect_exit(&run_one(other).await, 0);
    let output = inspect().await;
    expect_exit(&output, 1);
    assert!(text(&output.stdout).contains("read different inputs"));
}

/// Runs shard `index` of the pgvector job; the warnings of shards that read
/// different inputs, which the summary carries and stderr shows.
async fn run_pg_shard(job: &Path, db: &TestDb, index: u32) -> Vec<String> {
    let spec = format!("{index}/{SHARDS}");
    let output = run_pg(job, db, &["--json", "--quiet", "--shard", spec.as_str()]).await;
    expect_exit(&output, 0);
    let warnings: Vec<String> = json(&output)["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .filter(|w| w.contains("read different inputs"))
        .collect();
    for warning in &warnings {
        assert!(text(&output.stderr).contains(warning.as_str()));
    }
    warnings
}

/// The documents the table holds rows of.
async fn docs_held(db: &TestDb) -> BTreeSet<String> {
    let rows = db.rows("chunks").await;
    rows.keys().map(|id| doc_id(id).to_string()).collect()
}

/// What `query` says on stderr of the job's table.
async fn query_stderr(job: &Path, db: &TestDb) -> String {
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .env(PASSWORD_ENV, &db.password)
        .arg("query")
        .arg(job)
        .arg("Document 1")
        .args(["-k", "3"]);
    let output = run(command).await;
    expect_exit(&output, 0);
    text(&output.stderr)
}

/// The pgvector counterpart of the test above. Each shard holds the rows of
/// its own documents (by the hash of `doc_id`), so a document renamed into
/// another shard is held under both names from the run of its new shard to
/// the next run of its old one, which removes it as gone. Every shard
/// finishing on another input than the table's other shards names them;
/// a search of the table says so too; once all have run on one input, the
/// table holds each document once and neither a shard nor a search warns.
#[tokio::test]
async fn regression_a_document_renamed_between_pgvector_shard_runs_was_held_twice_unnoticed() {
    let PgJob {
        db,
        dir: _dir,
        root,
        sim: _sim,
        job,
        ..
    } = PgJob::new(12).await;
    for index in 0..SHARDS {
        assert_eq!(run_pg_shard(&job, &db, index).await, [""; 0], "one input");
    }
    let old = docs_held(&db)
        .await
        .into_iter()
        .find(|id| id.ends_with("doc001.md"))
        .unwrap();
    let (name, new) = (0..64)
        .map(|k| format!("renamed{k}.md"))
        .map(|name| (name.clone(), old.replace("doc001.md", &name)))
        .find(|(_, new)| Shard::of(new, SHARDS) != Shard::of(&old, SHARDS))
        .unwrap();
    let (from, to) = (Shard::of(&old, SHARDS), Shard::of(&new, SHARDS));
    std::fs::rename(root.join("doc001.md"), root.join(&name)).unwrap();

    // Its new shard runs first: the table holds it twice, and says so.
    let warnings = run_pg_shard(&job, &db, to).await;
    let behind: Vec<String> = (0..SHARDS)
        .filter(|i| *i != to)
        .map(|i| format!("{i}/{SHARDS}"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(&format!(
            "until shards {} run again on the input shard {to}/{SHARDS} read",
            behind.join(", ")
        )),
        "{warnings:?}"
    );
    let held = docs_held(&db).await;
    assert!(held.contains(&old) && held.contains(&new), "{held:?}");
    let said = query_stderr(&job, &db).await;
    assert!(said.contains("its shards read different inputs"), "{said}");

    // The shard that held it runs again: the old name's rows are removed.
    let rest: Vec<u32> = (0..SHARDS).filter(|i| *i != from && *i != to).collect();
    let warnings = run_pg_shard(&job, &db, from).await;
    assert_eq!(warnings.len(), 1, "two are still behind: {warnings:?}");
    let still = format!(
        "until shards {}/{SHARDS}, {}/{SHARDS} run",
        rest[0], rest[1]
    );
    assert!(warnings[0].contains(&still), "{warnings:?}");
    let held = docs_held(&db).await;
    assert!(!held.contains(&old) && held.contains(&new), "{held:?}");

    // The others catch up; the last to run, and a search, have nothing to say.
    assert_eq!(run_pg_shard(&job, &db, rest[0]).await.len(), 1);
    assert_eq!(run_pg_shard(&job, &db, rest[1]).await, [""; 0]);
    let said = query_stderr(&job, &db).await;
    assert!(!said.contains("different inputs"), "{said}");
    let rows = db.rows("chunks").await;
    assert_eq!(
        rows.iter()
            .map(|(id, row)| (id.clone(), row.0.clone()))
            .collect::<BTreeMap<_, _>>(),
        expected_chunks(&root),
        "each document once, under its new name"
    );
}
