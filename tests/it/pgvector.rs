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
    // A kill loses the 4 requests in flight and the answers that came while
    // the writer was committing the last batch: at most two rounds, 2 texts
    // a request.
    assert!(
        billed_twice <= kills * (2 * 4) * 2,
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
    let wrong = "not-the-password-7731";
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
