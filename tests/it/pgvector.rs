//! The pgvector output against a real PostgreSQL with pgvector (started by
//! `scripts/setup-postgres`, found through `EMBEDJOB_TEST_PG_URL`): runs,
//! re-runs that keep the table in sync, kills and resumes, and the errors a
//! user meets. Each test works in a database of its own.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Output;

use embedjob::simulate::{self, SimConfig};
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::support::{
    bin, corpus, edit_one_add_one_delete_one, expected_chunks, files_source, no_secrets,
    query_json, run as run_command, run_pg, simulator, spawn_job, text, text_hash, wait,
    wait_for_billed, write_pg_job, Edits, TestDb, KEY, PASSWORD_ENV,
};

fn expect_exit(output: &Output, code: i32) {
    assert_eq!(output.status.code(), Some(code), "{}", text(&output.stderr));
}

fn summary(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)))
}

/// The table holds exactly the expected chunks, each with the simulator's
/// vector for its text and its content hash.
fn assert_table(
    rows: &BTreeMap<String, (String, String, Vec<f32>)>,
    expected: &BTreeMap<String, String>,
) {
    let ids: Vec<&String> = rows.keys().collect();
    let wanted: Vec<&String> = expected.keys().collect();
    assert_eq!(
        ids, wanted,
        "the table holds every chunk once, and no other"
    );
    for (id, (text, hash, vector)) in rows {
        assert_eq!(&expected[id], text, "row {id}'s text");
        assert_eq!(hash, &text_hash(text), "row {id}'s content hash");
        assert_eq!(
            vector,
            &simulate::embedding_vector(1024, text),
            "row {id}'s vector"
        );
    }
}

/// No file of the job's state holds the password.
fn assert_state_has_no_password(dir: &Path, db: &TestDb) {
    let mut stack = vec![dir.join("state")];
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !String::from_utf8_lossy(&bytes).contains(&db.password),
                    "{} holds the password",
                    path.display()
                );
            }
        }
    }
}

#[tokio::test]
async fn a_run_fills_the_table_and_a_rerun_after_edits_keeps_it_in_sync() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 24);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "chunks",
        "",
    );

    let output = run_pg(&job, &db, &["--json"]).await;
    expect_exit(&output, 0);
    let first = summary(&output);
    let before = expected_chunks(&root);
    assert_table(&db.rows("chunks").await, &before);
    assert_eq!(first["written"].as_u64(), Some(before.len() as u64));
    assert!(
        first["output"].as_str().unwrap().contains("chunks"),
        "{first}"
    );
    let metadata = db.metadata("chunks").await;
    assert_eq!(metadata["embedjob.model"], "svc-embed-1");
    assert_eq!(metadata["embedjob.dimensions"], "1024");
    assert_eq!(
        metadata["embedjob.usage.prompt_tokens"],
        sim.ledger().prompt_tokens.to_string()
    );
    assert!(metadata["embedjob.fingerprint"].contains("svc-embed-1"));
    assert!(!dir.path().join("state/pg-test.chunks.checkpoint").exists());
    assert!(dir
        .path()
        .join("state/pg-test.chunks.summary.json")
        .exists());

    let Edits {
        after,
        to_send,
        unchanged,
        changed,
        added,
        removed,
    } = edit_one_add_one_delete_one(&root, &before);
    sim.reset_ledger();
    let output = run_pg(&job, &db, &["--json"]).await;
    expect_exit(&output, 0);
    let second = summary(&output);
    let ledger = sim.ledger();
    let sent: HashSet<String> = ledger.texts.keys().cloned().collect();
    assert_eq!(sent, to_send, "only the new and changed texts were sent");
    assert!(ledger.texts.values().all(|&n| n == 1));
    assert_eq!(second["unchanged"].as_u64(), Some(unchanged), "{second}");
    assert_eq!(second["changed"].as_u64(), Some(changed), "{second}");
    assert_eq!(second["added"].as_u64(), Some(added), "{second}");
    assert_eq!(second["removed"].as_u64(), Some(removed), "{second}");
    let incremental = db.rows("chunks").await;
    assert_table(&incremental, &after);

    // The same job into a new table: a fresh run's rows are the same.
    let fresh_job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "fresh",
        "",
    );
    expect_exit(&run_pg(&fresh_job, &db, &["--quiet"]).await, 0);
    assert_eq!(
        incremental,
        db.rows("fresh").await,
        "the table equals a fresh run's"
    );

    // Nothing changed: nothing is sent, nothing is written.
    sim.reset_ledger();
    let output = run_pg(&job, &db, &["--json"]).await;
    expect_exit(&output, 0);
    assert_eq!(sim.ledger().embedding_requests, 0);
    assert_eq!(summary(&output)["removed"], 0);
    assert_table(&db.rows("chunks").await, &after);
    assert_state_has_no_password(dir.path(), &db);
}

#[tokio::test]
async fn a_run_killed_at_random_points_resumes_and_the_table_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig {
        latency_ms: 30,
        ..SimConfig::default()
    })
    .await;
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "chunks",
        "",
    );
    let settings = [
        "--quiet",
        "--set",
        "backend.max_inputs_per_request=2",
        "--set",
        "backend.concurrency=4",
    ];
    expect_exit(&run_pg(&job, &db, &settings).await, 0);
    let before = expected_chunks(&root);

    // Many new documents, one edited, one deleted: the killed runs hold
    // new rows and removals that must all land, once.
    for i in 200..300 {
        std::fs::write(
            root.join(format!("new{i}.md")),
            format!("# New {i}\n\nA document added after the first run, number {i}. ")
                .repeat(1 + i % 3),
        )
        .unwrap();
    }
    let Edits { after, .. } = edit_one_add_one_delete_one(&root, &before);
    let old_texts: HashSet<&String> = before.values().collect();
    let distinct: HashSet<&String> = after.values().filter(|t| !old_texts.contains(t)).collect();
    sim.reset_ledger();

    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut kills = 0u64;
    for _ in 0..3 {
        // Past the first requests in flight, so that some answers were committed.
        let at = sim.ledger().billed_requests + rng.random_range(6..=12);
        let mut child = spawn_job(&job, &settings);
        if !wait_for_billed(&sim, &mut child, at).await {
            expect_exit(&wait(child).await, 0);
            break;
        }
        child.kill().unwrap();
        let output = wait(child).await;
        assert_eq!(output.status.code(), None, "killed (seed {seed})");
        kills += 1;
        // Until a run finishes, the table is as the first run left it.
        assert_table(&db.rows("chunks").await, &before);
    }
    assert!(kills >= 2, "killed mid-way at least twice (seed {seed})");

    let output = run_pg(&job, &db, &[&settings[..], &["--json"]].concat()).await;
    expect_exit(&output, 0);
    let last = summary(&output);
    assert!(last["resumed"].as_u64().unwrap() > 0, "{last}");
    assert_table(&db.rows("chunks").await, &after);
    assert!(!dir.path().join("state/pg-test.chunks.checkpoint").exists());

    let ledger = sim.ledger();
    let mut billed_twice = 0;
    for text in &distinct {
        let count = ledger.texts.get(&text_hash(text)).copied().unwrap_or(0);
        assert!(count >= 1, "every new text was billed");
        billed_twice += count - 1;
    }
    assert_eq!(
        ledger.texts.len(),
        distinct.len(),
        "no text the table held was sent again"
    );
    // What a kill loses (docs/running.md): at most `concurrency` (4) requests
    // of `max_inputs_per_request` (2) texts in flight, plus as many texts
    // answered and waiting for their commit: 2 × 4 × 2 texts a kill.
    let (concurrency, max_inputs) = (4, 2);
    assert!(
        billed_twice <= kills * 2 * concurrency * max_inputs,
        "seed {seed}: {billed_twice} texts billed twice in {kills} kills"
    );
}

#[tokio::test]
async fn a_table_made_under_another_configuration_is_refused_unless_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "chunks",
        "",
    );
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);

    sim.reset_ledger();
    let larger = ["--quiet", "--set", "backend.model=svc-embed-1-l"];
    let output = run_pg(&job, &db, &larger).await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("table chunks"), "{stderr}");
    assert!(
        stderr.contains("backend.model: svc-embed-1 → svc-embed-1-l"),
        "{stderr}"
    );
    assert!(stderr.contains("--fresh"), "{stderr}");
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "refused before any work"
    );
    assert_eq!(db.metadata("chunks").await["embedjob.dimensions"], "1024");

    let output = run_pg(&job, &db, &[&larger[..], &["--fresh"]].concat()).await;
    expect_exit(&output, 0);
    let rows = db.rows("chunks").await;
    assert_eq!(rows.len(), expected_chunks(&root).len());
    assert!(rows.values().all(|(_, _, v)| v.len() == 3072));
    assert_eq!(
        db.metadata("chunks").await["embedjob.model"],
        "svc-embed-1-l"
    );

    // The HNSW index holds at most 2000 dimensions: refused before any work.
    sim.reset_ledger();
    let output = run_pg(
        &job,
        &db,
        &[&larger[..], &["--set", "output.index=hnsw"]].concat(),
    )
    .await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("2000"), "{stderr}");
    assert_eq!(sim.ledger().embedding_requests, 0);
}

#[tokio::test]
async fn the_hnsw_index_is_built_and_used_to_search() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 10);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "indexed",
        "index = \"hnsw\"",
    );
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);
    let client = db.client().await;
    let definition: String = client
        .query_one(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'indexed' AND indexname = 'indexed_hnsw'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(definition.contains("hnsw"), "{definition}");
    assert!(definition.contains("vector_cosine_ops"), "{definition}");
    let (id, text) = expected_chunks(&root).into_iter().nth(5).unwrap();
    let hits = query_json(&job, &text, 3, &[(PASSWORD_ENV, db.password.as_str())]).await;
    assert_eq!(hits[0]["id"], id.as_str());
}

fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn database_errors_are_clear_and_never_show_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 3);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let source = files_source(&root);

    // Nothing listens there.
    let port = closed_port();
    let job = write_pg_job(dir.path(), &sim.base_url(), &source, &db, "chunks", "");
    let unreachable = format!("url=postgresql://postgres@127.0.0.1:{port}/postgres");
    let output = run_pg(&job, &db, &["--set", &format!("output.{unreachable}")]).await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot reach the database at 127.0.0.1:{port}/postgres"
        )),
        "{stderr}"
    );

    // A wrong password: refused, and neither password is shown.
    // No word of the message in it: any 8 characters of a password are scrubbed.
    let wrong = "not-the-secret-7731x";
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .env("WRONG_PASSWORD", wrong)
        .args(["run", "--quiet"])
        .arg(&job)
        .args(["--set", "output.password_env=WRONG_PASSWORD"]);
    let output = run_command(command).await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains(wrong), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(stderr.contains("WRONG_PASSWORD"), "{stderr}");

    // A password in the URL is refused without being echoed.
    let in_url = db
        .url
        .replacen("postgres@", &format!("postgres:{}@", db.password), 1);
    let output = run_pg(&job, &db, &["--set", &format!("output.url={in_url}")]).await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("holds a password (not shown)"), "{stderr}");

    // A database where the extension is not created and the user may not create it.
    let admin = db.client().await;
    let role = format!("{}_user", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{pw}'",
            pw = db.password
        ))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {role}_db OWNER {role}"))
        .await
        .unwrap();
    let base = db
        .url
        .rsplit_once('/')
        .unwrap()
        .0
        .replacen("postgres@", &format!("{role}@"), 1);
    let output = run_pg(
        &job,
        &db,
        &["--set", &format!("output.url={base}/{role}_db")],
    )
    .await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no pgvector extension"), "{stderr}");
    assert!(stderr.contains("CREATE EXTENSION vector"), "{stderr}");

    // A table of the same name that embedjob did not make is left alone.
    admin
        .batch_execute("CREATE TABLE theirs (id int PRIMARY KEY)")
        .await
        .unwrap();
    let theirs = write_pg_job(dir.path(), &sim.base_url(), &source, &db, "theirs", "");
    let output = run_pg(&theirs, &db, &["--fresh"]).await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not made by embedjob"), "{stderr}");
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "no work before the checks"
    );

    // A job-file key error: a password env var that is not set.
    let output = run_pg(
        &job,
        &db,
        &["--set", "output.password_env=EMBEDJOB_NO_SUCH_VAR"],
    )
    .await;
    let (_, stderr) = no_secrets(&output, &db);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("EMBEDJOB_NO_SUCH_VAR"), "{stderr}");
}

/// A Parquet input of three records whose metadata columns have most of the
/// types a metadata column can take; record b's are null but for `lang`.
fn typed_records(path: &Path) {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, BooleanArray, Date32Array, DictionaryArray, Float32Array, Float64Array,
        Int16Array, RecordBatch, StringArray, TimestampMicrosecondArray, TimestampMillisecondArray,
        UInt64Array,
    };
    use arrow::datatypes::Int8Type;

    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(StringArray::from(vec!["a", "b", "c"]))),
        (
            "text",
            Arc::new(StringArray::from(vec![
                "Lighthouse keepers climb the spiral stairs at dusk.",
                "Sourdough starters are fed flour and water for days.",
                "The coastal train leaves from platform nine on weekdays.",
            ])),
        ),
        (
            "rank",
            Arc::new(Int16Array::from(vec![Some(3), None, Some(-7)])),
        ),
        (
            "views",
            Arc::new(UInt64Array::from(vec![Some(u64::MAX), None, Some(0)])),
        ),
        (
            "score",
            Arc::new(Float32Array::from(vec![Some(0.1), None, Some(1.5)])),
        ),
        (
            "ratio",
            Arc::new(Float64Array::from(vec![Some(2.5), None, Some(-0.25)])),
        ),
        // 2024-05-17 and 1999-12-31.
        (
            "day",
            Arc::new(Date32Array::from(vec![Some(19_860), None, Some(10_956)])),
        ),
        (
            "at",
            Arc::new(
                TimestampMillisecondArray::from(vec![Some(1_715_934_600_123), None, Some(0)])
                    .with_timezone("UTC"),
            ),
        ),
        (
            "local",
            Arc::new(TimestampMicrosecondArray::from(vec![
                Some(1_715_934_600_000_001),
                None,
                Some(0),
            ])),
        ),
        (
            "draft",
            Arc::new(BooleanArray::from(vec![Some(false), None, Some(true)])),
        ),
        (
            "lang",
            Arc::new(DictionaryArray::<Int8Type>::from_iter(["en", "fr", "de"])),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn records_source(input: &Path, fields: &[&str]) -> String {
    let fields: Vec<String> = fields.iter().map(|f| format!("{f:?}")).collect();
    format!(
        "kind = \"parquet\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"\n\
         metadata_fields = [{}]",
        input.display(),
        fields.join(", ")
    )
}

/// The table's columns beyond `embedding`, with their SQL types, in order.
async fn metadata_columns(db: &TestDb, table: &str) -> Vec<(String, String)> {
    let client = db.client().await;
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&table],
        )
        .await
        .unwrap();
    let all: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let embedding = all
        .iter()
        .position(|(name, _)| name == "embedding")
        .unwrap();
    all[embedding + 1..].to_vec()
}

/// Each row's metadata as PostgreSQL prints it, by id.
async fn metadata_values(
    db: &TestDb,
    table: &str,
    columns: &[&str],
) -> BTreeMap<String, Vec<Option<String>>> {
    let client = db.client().await;
    client.batch_execute("SET TIME ZONE 'UTC'").await.unwrap();
    let select: Vec<String> = columns.iter().map(|c| format!("{c}::text")).collect();
    let rows = client
        .query(
            &format!("SELECT doc_id, {} FROM {table}", select.join(", ")),
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let values = (1..=columns.len()).map(|i| r.get(i)).collect();
            (r.get(0), values)
        })
        .collect()
}

/// The table holds `typed_records`' metadata as typed columns, and records them.
async fn assert_typed_columns(db: &TestDb, table: &str, all: &[&str]) {
    let expected_types = [
        ("rank", "smallint"),
        ("views", "numeric(20,0)"),
        ("score", "real"),
        ("ratio", "double precision"),
        ("day", "date"),
        ("at", "timestamp with time zone"),
        ("local", "timestamp without time zone"),
        ("draft", "boolean"),
        ("lang", "text"),
    ];
    let expected_types: Vec<(String, String)> = expected_types
        .iter()
        .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
        .collect();
    assert_eq!(metadata_columns(db, table).await, expected_types);
    let values = metadata_values(db, table, all).await;
    let row = |values: &[Option<&str>]| -> Vec<Option<String>> {
        values.iter().map(|v| v.map(str::to_string)).collect()
    };
    assert_eq!(
        values["a"],
        row(&[
            Some("3"),
            Some("18446744073709551615"),
            Some("0.1"),
            Some("2.5"),
            Some("2024-05-17"),
            Some("2024-05-17 08:30:00.123+00"),
            Some("2024-05-17 08:30:00.000001"),
            Some("false"),
            Some("en"),
        ])
    );
    assert_eq!(
        values["b"],
        row(&[None, None, None, None, None, None, None, None, Some("fr")])
    );
    assert_eq!(
        values["c"],
        row(&[
            Some("-7"),
            Some("0"),
            Some("1.5"),
            Some("-0.25"),
            Some("1999-12-31"),
            Some("1970-01-01 00:00:00+00"),
            Some("1970-01-01 00:00:00"),
            Some("true"),
            Some("de"),
        ])
    );
    assert_eq!(
        db.metadata(table).await["embedjob.metadata_columns"],
        serde_json::to_string(&expected_types).unwrap()
    );
}

/// `source.metadata_fields` of every type reach the table as typed columns,
/// `query --json` returns them as it does from a Parquet output, and a
/// table made without them gets them on the next run, its vectors reused.
#[tokio::test]
async fn metadata_fields_become_typed_columns_that_query_returns() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.parquet");
    typed_records(&input);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let all = [
        "rank", "views", "score", "ratio", "day", "at", "local", "draft", "lang",
    ];

    // A first run without metadata fields makes a table without their columns.
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &records_source(&input, &[]),
        &db,
        "typed",
        "",
    );
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);
    assert!(metadata_columns(&db, "typed").await.is_empty());
    let vectors = db.rows("typed").await;
    assert_eq!(vectors.len(), 3);

    // With the fields: the columns are added, and every row written again
    // with its values, from the vectors the table holds.
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &records_source(&input, &all),
        &db,
        "typed",
        "",
    );
    sim.reset_ledger();
    let output = run_pg(&job, &db, &["--json"]).await;
    expect_exit(&output, 0);
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "no vector is paid for again"
    );
    assert_eq!(summary(&output)["reused"], 3, "{}", text(&output.stdout));
    assert_eq!(db.rows("typed").await, vectors);
    assert_typed_columns(&db, "typed", &all).await;

    // `query --json` returns them, as it does from a Parquet output of the same job.
    let parquet_job = crate::support::write_job(
        dir.path(),
        &sim.base_url(),
        &records_source(&input, &all),
        "",
    );
    expect_exit(
        &crate::support::run_job(&parquet_job, &["--quiet"]).await,
        0,
    );
    let password = [(PASSWORD_ENV, db.password.as_str())];
    let expected = serde_json::json!({
        "rank": 3,
        "views": u64::MAX,
        "score": 0.1,
        "ratio": 2.5,
        "day": "2024-05-17",
        "at": "2024-05-17T08:30:00.123Z",
        "local": "2024-05-17T08:30:00.000001",
        "draft": false,
        "lang": "en",
    });
    let text_a = "Lighthouse keepers climb the spiral stairs at dusk.";
    let from_table = crate::support::query_json(&job, text_a, 3, &password).await;
    assert_eq!(from_table[0]["id"], "a#0");
    assert_eq!(from_table[0]["metadata"], expected, "{from_table:#?}");
    let from_file = crate::support::query_json(&parquet_job, text_a, 3, &[]).await;
    assert_eq!(from_file[0]["metadata"], expected, "{from_file:#?}");
    let text_b = "Sourdough starters are fed flour and water for days.";
    let from_table = crate::support::query_json(&job, text_b, 1, &password).await;
    let from_file = crate::support::query_json(&parquet_job, text_b, 1, &[]).await;
    assert_eq!(from_table[0]["metadata"]["day"], Value::Null);
    assert_eq!(from_table[0]["metadata"]["lang"], "fr");
    assert_eq!(from_table[0]["metadata"], from_file[0]["metadata"]);

    // Fewer fields: the columns embedjob made and no longer writes are dropped.
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &records_source(&input, &["lang", "day"]),
        &db,
        "typed",
        "",
    );
    sim.reset_ledger();
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);
    assert_eq!(sim.ledger().embedding_requests, 0);
    let names: Vec<String> = metadata_columns(&db, "typed")
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["day", "lang"]);
    let results = crate::support::query_json(&job, text_a, 1, &password).await;
    assert_eq!(
        results[0]["metadata"],
        serde_json::json!({"lang": "en", "day": "2024-05-17"})
    );

    // Unchanged: the rows stay as they are (a row written again has a new xmin).
    let before = row_versions(&db, "typed").await;
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);
    assert_eq!(row_versions(&db, "typed").await, before);
}

/// Each row's `xmin`, by id: the transaction that last wrote it.
async fn row_versions(db: &TestDb, table: &str) -> BTreeMap<String, String> {
    let client = db.client().await;
    let rows = client
        .query(&format!("SELECT id, xmin::text FROM {table}"), &[])
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// A column the user added to the table is never dropped, and one in the
/// way of a metadata field (another type) is refused before any work,
/// naming the table and the column.
#[tokio::test]
async fn a_column_of_the_tables_own_is_kept_and_never_taken_for_a_field() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.parquet");
    typed_records(&input);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let job = |fields: &[&str]| {
        let source = records_source(&input, fields);
        write_pg_job(dir.path(), &sim.base_url(), &source, &db, "own", "")
    };
    expect_exit(&run_pg(&job(&["lang"]), &db, &["--quiet"]).await, 0);
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE own ADD COLUMN rank integer; UPDATE own SET rank = 42")
        .await
        .unwrap();

    let output = run_pg(&job(&["lang", "rank"]), &db, &["--quiet"]).await;
    expect_exit(&output, 2);
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("table own") && stderr.contains("\"rank\" is integer, not smallint"),
        "{stderr}"
    );
    assert_eq!(
        metadata_values(&db, "own", &["rank"]).await["a"],
        [Some("42".to_string())]
    );

    // Without fields, the column embedjob made goes and the user's stays.
    sim.reset_ledger();
    expect_exit(&run_pg(&job(&[]), &db, &["--quiet"]).await, 0);
    assert_eq!(sim.ledger().embedding_requests, 0);
    let columns = metadata_columns(&db, "own").await;
    assert_eq!(columns, [("rank".to_string(), "integer".to_string())]);
    assert_eq!(
        metadata_values(&db, "own", &["rank"]).await["c"],
        [Some("42".to_string())]
    );
}

/// A row whose vector has no cosine direction came out of `query` with the
/// score `null`: pgvector's distance to an all-zero vector is NaN. pgvector
/// refuses NaN and infinities in a `vector`; should one be stored anyway,
/// it is passed over the same way. Damaged rows are never results, and the
/// query says how many it passed over.
#[tokio::test]
async fn regression_a_damaged_vector_in_the_table_was_a_result_without_a_score() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 8);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "damaged",
        "",
    );
    expect_exit(&run_pg(&job, &db, &["--quiet"]).await, 0);
    let chunks = expected_chunks(&root);
    let ids: Vec<&String> = chunks.keys().collect();
    let client = db.client().await;
    let mut damaged = HashSet::new();
    for (id, value) in [(ids[0], "0"), (ids[1], "'NaN'"), (ids[2], "'Infinity'")] {
        let set = format!(
            "UPDATE damaged SET embedding = array_fill({value}::real, ARRAY[1024])::vector \
             WHERE id = $1"
        );
        match client.execute(&set, &[id]).await {
            Ok(1) => {
                damaged.insert(id.clone());
            }
            Ok(n) => panic!("{n} rows updated"),
            // pgvector does not store NaN or an infinity in a vector.
            Err(e) => assert_ne!(value, "0", "{e}"),
        }
    }
    assert!(damaged.contains(ids[0]));

    let password = [(PASSWORD_ENV, db.password.as_str())];
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .env(PASSWORD_ENV, &db.password)
        .arg("query")
        .arg(&job)
        .arg(&chunks[ids[0]])
        .args(["-k", "1000", "--json"]);
    let output = run_command(command).await;
    let (stdout, stderr) = no_secrets(&output, &db);
    expect_exit(&output, 0);
    let value: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(value["passed_over"], damaged.len(), "{stdout}");
    let results = value["results"].as_array().unwrap();
    assert_eq!(results.len(), chunks.len() - damaged.len(), "{stdout}");
    for (rank, hit) in results.iter().enumerate() {
        assert_eq!(hit["rank"], rank + 1);
        assert!(hit["score"].as_f64().is_some_and(f64::is_finite), "{hit}");
        assert!(!damaged.contains(hit["id"].as_str().unwrap()), "{hit}");
    }
    assert!(
        stderr.contains(&format!("passed over {} stored row", damaged.len())),
        "{stderr}"
    );
    // An undamaged table passes nothing over.
    let other = query_json(&job, &chunks[ids[3]], 2, &password).await;
    assert_eq!(other[0]["id"], ids[3].as_str());
}

/// The SQL condition by which a shard finds its rows in a shared table was
/// tested only against a literal copy of itself. It is held here to the
/// shard Rust gives each document (`Shard::of`), in a real database, for
/// ids of every shape: non-ASCII, blank or invisible, long, quoted.
#[tokio::test]
async fn regression_the_shard_sql_was_tested_only_against_a_copy_of_itself() {
    use embedjob::job::Shard;
    use embedjob::sink::pgvector::shard_condition;

    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let alphabet: Vec<char> = "aZ09 -_/.#'\"\\\tçéßøΩжא中文日本🦀👩‍👩‍👧\u{301}\u{200b}\u{feff}\u{7f}"
        .chars()
        .collect();
    let mut ids: Vec<String> = [
        "", " ", "  ", "\t", "\n", "\u{200b}", "\u{feff}", "\u{a0}", "'", "\\", "é", "e\u{301}",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect();
    ids.push("x".repeat(10_000));
    ids.push("🦀".repeat(1_000));
    let mut unique: std::collections::BTreeSet<String> = ids.into_iter().collect();
    while unique.len() < 2_000 {
        let len = rng.random_range(1..40);
        unique.insert(
            (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect(),
        );
    }
    let ids: Vec<String> = unique.into_iter().collect();

    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE ids (doc_id text NOT NULL)")
        .await
        .unwrap();
    client
        .execute("INSERT INTO ids SELECT unnest($1::text[])", &[&ids])
        .await
        .unwrap();
    for count in [1, 2, 3, 4, 7, 16] {
        for index in 0..count {
            let shard = Shard::new(index, count).unwrap();
            let sql = format!("SELECT doc_id FROM ids WHERE {}", shard_condition(shard));
            let found: HashSet<String> = client
                .query(&sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            let wanted: HashSet<String> = ids
                .iter()
                .filter(|id| Shard::of(id, count) == index)
                .cloned()
                .collect();
            let only_sql: Vec<&String> = found.difference(&wanted).take(3).collect();
            let only_rust: Vec<&String> = wanted.difference(&found).take(3).collect();
            assert!(
                only_sql.is_empty() && only_rust.is_empty(),
                "shard {shard}: the SQL alone holds {only_sql:?}, Rust alone {only_rust:?}"
            );
        }
    }
}

/// A job file named `name` on `table`, otherwise as [`write_pg_job`] writes it.
fn named_pg_job(
    dir: &Path,
    name: &str,
    base_url: &str,
    source: &str,
    db: &TestDb,
    table: &str,
) -> std::path::PathBuf {
    let job = write_pg_job(dir, base_url, source, db, table, "");
    let text = std::fs::read_to_string(&job).unwrap().replacen(
        "name = \"pg-test\"",
        &format!("name = \"{name}\""),
        1,
    );
    let path = dir.join(format!("{name}-{table}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn regression_a_second_job_on_a_table_deleted_the_first_jobs_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let (root_a, root_b) = (corpus(&a_dir, 4), corpus(&b_dir, 9));
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let a = |table: &str| {
        named_pg_job(
            dir.path(),
            "docs-a",
            &sim.base_url(),
            &files_source(&root_a),
            &db,
            table,
        )
    };
    let b = |table: &str| {
        named_pg_job(
            dir.path(),
            "docs-b",
            &sim.base_url(),
            &files_source(&root_b),
            &db,
            table,
        )
    };
    let ids = |root: &Path| expected_chunks(root).into_keys().collect::<HashSet<_>>();

    // One after the other, under the same configuration and under another.
    expect_exit(&run_pg(&a("shared"), &db, &["--quiet"]).await, 0);
    let before = db.rows("shared").await;
    for extra in [&[][..], &["--set", "backend.model=svc-embed-1-l"][..]] {
        sim.reset_ledger();
        let output = run_pg(&b("shared"), &db, &[&["--quiet"][..], extra].concat()).await;
        let (_, stderr) = no_secrets(&output, &db);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        for needle in [
            "table shared",
            "\"docs-a\"",
            "\"docs-b\"",
            "output.table",
            "--fresh",
        ] {
            assert!(stderr.contains(needle), "{needle}: {stderr}");
        }
        assert_eq!(
            sim.ledger().embedding_requests,
            0,
            "refused before any work"
        );
        assert_eq!(
            db.rows("shared").await,
            before,
            "the first job's rows are intact"
        );
    }

    // Both at once into a new table: one owns it, the other is refused.
    let (race_a, race_b) = (a("race"), b("race"));
    let (first, second) = tokio::join!(
        run_pg(&race_a, &db, &["--quiet"]),
        run_pg(&race_b, &db, &["--quiet"])
    );
    let codes = (first.status.code(), second.status.code());
    let (winner, root) = match codes {
        (Some(0), Some(2)) => ("docs-a", &root_a),
        (Some(2), Some(0)) => ("docs-b", &root_b),
        _ => panic!(
            "{codes:?}: {}\n{}",
            text(&first.stderr),
            text(&second.stderr)
        ),
    };
    let loser = if winner == "docs-a" { &second } else { &first };
    assert!(
        text(&loser.stderr).contains(&format!("\"{winner}\"")),
        "{}",
        text(&loser.stderr)
    );
    assert_eq!(db.metadata("race").await["embedjob.job"], winner);
    let held: HashSet<String> = db.rows("race").await.into_keys().collect();
    assert_eq!(
        held,
        ids(root),
        "the table holds the owner's rows, all of them"
    );

    // Taken over on purpose.
    expect_exit(&run_pg(&b("shared"), &db, &["--quiet", "--fresh"]).await, 0);
    assert_eq!(db.metadata("shared").await["embedjob.job"], "docs-b");
    let held: HashSet<String> = db.rows("shared").await.into_keys().collect();
    assert_eq!(held, ids(&root_b));
}

#[tokio::test]
async fn regression_a_metadata_table_embedjob_did_not_make_was_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 3);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let admin = db.client().await;
    // Its very shape, without embedjob's row; another shape; and empty.
    let foreign = [
        (
            "kv",
            "(key text PRIMARY KEY, value text NOT NULL)",
            "('owner', 'me')",
        ),
        ("other", "(id int, note text)", "(1, 'mine')"),
        ("bare", "(key text PRIMARY KEY, value text NOT NULL)", ""),
    ];
    for (table, columns, row) in foreign {
        admin
            .batch_execute(&format!("CREATE TABLE {table}_embedjob {columns}"))
            .await
            .unwrap();
        if !row.is_empty() {
            admin
                .batch_execute(&format!("INSERT INTO {table}_embedjob VALUES {row}"))
                .await
                .unwrap();
        }
        let dump = format!("SELECT string_agg(t::text, ';') FROM {table}_embedjob t");
        let before: Option<String> = admin.query_one(&dump, &[]).await.unwrap().get(0);
        let job = write_pg_job(
            dir.path(),
            &sim.base_url(),
            &files_source(&root),
            &db,
            table,
            "",
        );
        for extra in [&["--quiet"][..], &["--quiet", "--fresh"][..]] {
            sim.reset_ledger();
            let output = run_pg(&job, &db, extra).await;
            let (_, stderr) = no_secrets(&output, &db);
            assert_eq!(output.status.code(), Some(2), "{table} {extra:?}: {stderr}");
            assert!(stderr.contains(&format!("{table}_embedjob")), "{stderr}");
            assert!(stderr.contains("not made by embedjob"), "{stderr}");
            assert_eq!(
                sim.ledger().embedding_requests,
                0,
                "refused before any work"
            );
            let after: Option<String> = admin.query_one(&dump, &[]).await.unwrap().get(0);
            assert_eq!(after, before, "{table}_embedjob is unchanged");
            let made: bool = admin
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
                .await
                .unwrap()
                .get(0);
            assert!(!made, "no table {table} made beside it");
        }
    }
}

#[tokio::test]
async fn regression_two_configurations_of_one_job_at_once_replaced_each_others_rows() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 4);
    let db = TestDb::new().await;
    let sim = simulator(SimConfig::default()).await;
    let job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "same",
        "",
    );
    let ids: HashSet<String> = expected_chunks(&root).into_keys().collect();
    let other_state = format!("output.state_dir={}", dir.path().join("other").display());
    // One job name, two configurations, at once, each with the state of another
    // machine (the job's lock does not make them take turns): the second to
    // finish does not replace the first's rows.
    let larger = [
        "--quiet",
        "--set",
        "backend.model=svc-embed-1-l",
        "--set",
        other_state.as_str(),
    ];
    // "At once" made certain: this session holds the lock finishing runs take
    // in turn until both wait on it, so each read the table before either
    // finished (on a loaded machine one could otherwise finish before the
    // other starts, and then replacing its rows is right).
    let holder = db.client().await;
    let key = embedjob::sink::pgvector::finishing_lock_key("same");
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let first = async {
        let output = run_pg(&job, &db, &["--quiet"]).await;
        finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        output
    };
    let second = async {
        let output = run_pg(&job, &db, &larger).await;
        finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        output
    };
    let release = async {
        // Bounded: a run that ends before reaching the lock ends the wait too.
        for _ in 0..6_000 {
            let waiting: i64 = holder
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting >= 2 || finished.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        holder
            .execute("SELECT pg_advisory_unlock($1)", &[&key])
            .await
            .unwrap();
    };
    let (first, second, ()) = tokio::join!(first, second, release);
    let codes = (first.status.code(), second.status.code());
    let (model, dimensions) = match codes {
        (Some(0), Some(code)) if code != 0 => ("svc-embed-1", 1024),
        (Some(code), Some(0)) if code != 0 => ("svc-embed-1-l", 3072),
        _ => panic!(
            "{codes:?}: {}\n{}",
            text(&first.stderr),
            text(&second.stderr)
        ),
    };
    assert_eq!(db.metadata("same").await["embedjob.model"], model);
    let rows = db.rows("same").await;
    assert_eq!(rows.keys().cloned().collect::<HashSet<_>>(), ids);
    assert!(rows.values().all(|(_, _, v)| v.len() == dimensions));
}

/// Rows in the checkpoint's committed parts (each renamed into place whole);
/// `None` when a part went away while it was read.
fn committed_rows(checkpoint: &Path) -> Option<u64> {
    let Ok(entries) = std::fs::read_dir(checkpoint) else {
        return Some(0);
    };
    let mut rows = 0;
    for entry in entries {
        let path = entry.ok()?.path();
        let name = path.file_name()?.to_string_lossy().into_owned();
        if name.starts_with("part-") && name.ends_with(".parquet") {
            let file = std::fs::File::open(&path).ok()?;
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .ok()?;
            rows += reader.metadata().file_metadata().num_rows() as u64;
        }
    }
    Some(rows)
}

/// Texts the simulator billed, repeats counted.
fn billed_texts(ledger: &simulate::Ledger) -> u64 {
    ledger.texts.values().sum()
}

/// A run whose database stops answering mid-run: its writer blocks in the
/// rows' `COPY` and commits no more to the checkpoint, so by the exposure
/// rule the run stops sending. What a kill then loses is the documented
/// bound (docs/running.md): `2 × concurrency × max_inputs_per_request`
/// texts paid for and not committed, at every instant, and billed twice
/// after the resume.
#[tokio::test]
async fn a_run_behind_a_database_that_stopped_answering_stops_sending_and_a_kill_loses_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    // More rows than the writer can hand the stopped server before its COPY
    // blocks: a COPY goes out at every 4 MiB of rows (about 950 of 1024
    // dimensions), and the socket's buffers, stopped before the first, hold
    // less than two.
    let records = 4000u64;
    let input = dir.path().join("in.jsonl");
    let lines: String = (0..records)
        .map(|i| {
            format!(
                "{{\"id\":\"r{i}\",\"text\":\"Record {i} of the slow output test, about \
                 checkpoints, commits and what a kill can lose: {}\"}}\n",
                "padding ".repeat(i as usize % 7)
            )
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let source = format!(
        "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"",
        input.display()
    );
    let db = TestDb::new().await;
    // With a latency, the reader is always ahead of the requests: no request
    // in flight then means the run holds back, not that it has nothing to send.
    let sim = simulator(SimConfig {
        latency_ms: 20,
        ..SimConfig::default()
    })
    .await;
    let job = write_pg_job(dir.path(), &sim.base_url(), &source, &db, "chunks", "");
    let checkpoint = dir.path().join("state/pg-test.chunks.checkpoint");
    // write_pg_job's backend: concurrency 4, requests of 8 inputs.
    let (concurrency, max_inputs) = (4u64, 8u64);
    let most = concurrency * max_inputs;
    let bound = 2 * most;

    let mut child = spawn_job(&job, &["--quiet"]);
    // Sending means the table was opened: the database stops answering now.
    assert!(
        wait_for_billed(&sim, &mut child, 1).await,
        "{}",
        text(&wait(child).await.stderr)
    );
    let paused = db.pause_other_connections().await;
    assert!(paused.count() >= 1, "the run holds a connection");

    // The run sends while at most `most` texts answered wait for their
    // commit, and up to `concurrency` requests of `max_inputs` are in
    // flight, so at every instant the texts billed and not committed are at
    // most `bound`. It has stopped when more than `most` wait, no request is
    // in flight, and nothing changes for a second: a run free to send has a
    // request in flight again within a latency (20 ms) of its last answer,
    // and its other pauses (a commit, reading ahead) take milliseconds.
    const QUIET: std::time::Duration = std::time::Duration::from_secs(1);
    let mut quiet: Option<(std::time::Instant, (u64, u64, u64))> = None;
    let started = std::time::Instant::now();
    let stalled = loop {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            break Err("the run never stopped sending".to_string());
        }
        let ledger = sim.ledger();
        // Read after the ledger: a later commit can only lower the difference.
        let Some(committed) = committed_rows(&checkpoint) else {
            continue;
        };
        let billed = billed_texts(&ledger);
        if billed > committed + bound {
            break Err(format!(
                "{billed} texts billed, {committed} committed: more than {bound} exposed"
            ));
        }
        let state = (billed, committed, ledger.embedding_requests);
        if billed > committed + most && ledger.embedding_requests == ledger.billed_requests {
            match quiet {
                Some((since, seen)) if seen == state => {
                    if since.elapsed() >= QUIET {
                        break Ok((billed, committed));
                    }
                }
                _ => quiet = Some((std::time::Instant::now(), state)),
            }
        } else {
            quiet = None;
        }
        if child.try_wait().unwrap().is_some() {
            break Err("the run ended before its output stalled".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    };
    let _ = child.kill();
    let output = wait(child).await;
    drop(paused);
    let (billed, committed) = stalled.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), None, "killed");
    assert!(billed < records, "the run stalled before its end");

    let output = run_pg(&job, &db, &["--quiet", "--json"]).await;
    expect_exit(&output, 0);
    let last = summary(&output);
    assert!(last["resumed"].as_u64().unwrap() >= committed, "{last}");
    assert_eq!(db.rows("chunks").await.len() as u64, records);
    let ledger = sim.ledger();
    assert_eq!(ledger.texts.len() as u64, records, "every text billed");
    let billed_twice: u64 = ledger.texts.values().map(|n| n - 1).sum();
    assert!(
        billed_twice <= bound,
        "{billed_twice} texts billed twice after one kill, more than {bound}"
    );
}

/// A job over `root` into `table` of `db`, with the default chunking, against
/// a server that lists no window (see `window.rs`).
fn window_pg_job(
    dir: &Path,
    base_url: &str,
    root: &Path,
    db: &TestDb,
    table: &str,
    backend_extra: &str,
) -> std::path::PathBuf {
    let job = format!(
        r#"name = "window"
[source]
{source}
[backend]
kind = "api"
base_url = "{base_url}"
api_path = ""
model = "svc-embed-1"
concurrency = 4
max_retries = 3
timeout_seconds = 10
{backend_extra}
[output]
kind = "pgvector"
url = "{url}"
password_env = "{PASSWORD_ENV}"
table = "{table}"
state_dir = "{state}"
"#,
        source = files_source(root),
        url = db.url,
        state = dir.join("state").display()
    );
    let path = dir.join(format!("{table}.toml"));
    std::fs::write(&path, job).unwrap();
    path
}

/// The window a run learned is kept in the table's metadata, as a Parquet
/// footer keeps it, and read back: the next run and `estimate` chunk as the
/// first run did (to the window the probe found, or as the job says with
/// the chunks refused mid-run cut into the same pieces), and nothing is sent
/// again, neither a probe nor a text.
#[tokio::test]
async fn the_window_a_run_learned_is_read_back_from_the_table() {
    let db = TestDb::new().await;
    for (table, backend_extra) in [("probed", ""), ("refused", "probe_window = false")] {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::window::prose(dir.path());
        let sim = simulator(crate::window::unlisted("tei")).await;
        let job = window_pg_job(
            dir.path(),
            &sim.base_url(),
            &root,
            &db,
            table,
            backend_extra,
        );
        let output = run_pg(&job, &db, &["--json"]).await;
        expect_exit(&output, 0);
        let first = summary(&output);
        let window = first["learned_limits"]["context_window"].clone();
        assert_eq!(window["server_tokens"], 256, "{table}: {first}");
        assert_eq!(first["quarantined"], 0, "{table}: {first}");
        let rows = db.rows(table).await;
        let recorded = db.metadata(table).await["embedjob.context_window"].clone();
        assert!(
            recorded.contains("\"tokenizer\":\"cl100k_base\""),
            "{recorded}"
        );
        let ledger = sim.ledger();

        let mut command = bin();
        command
            .env("EMBEDJOB_API_KEY", KEY)
            .env(PASSWORD_ENV, &db.password)
            .args(["estimate", job.to_str().unwrap(), "--json"]);
        let output = run_command(command).await;
        expect_exit(&output, 0);
        let estimate = summary(&output);
        assert_eq!(estimate["chunks"], rows.len() as u64, "{table}: {estimate}");
        assert_eq!(estimate["tokens"], 0, "{table}: {estimate}");
        if backend_extra.is_empty() {
            assert_eq!(estimate["context_window"], window["tokens"], "{estimate}");
        }

        let output = run_pg(&job, &db, &["--json"]).await;
        expect_exit(&output, 0);
        let again = summary(&output);
        assert_eq!(again["requests"], 0, "{table}: {again}");
        assert_eq!(again["unchanged"], rows.len() as u64, "{table}: {again}");
        assert_eq!(again["learned_limits"]["context_window"], window, "{again}");
        assert_eq!(again["learned_limits"]["window_probe"], Value::Null);
        let after = sim.ledger();
        assert_eq!(
            (after.embedding_requests, after.prompt_tokens, after.texts),
            (
                ledger.embedding_requests,
                ledger.prompt_tokens,
                ledger.texts
            ),
            "{table}: nothing was sent again"
        );
        assert_eq!(db.rows(table).await, rows, "{table}");
        assert_eq!(
            db.metadata(table).await["embedjob.context_window"],
            recorded
        );
    }
}
