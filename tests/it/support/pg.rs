//! A PostgreSQL database of the test's own, and pgvector jobs on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::str::FromStr;

use tokio_postgres::{Client, NoTls};

use super::{bin, no_key, run, KEY};

/// The variable the test jobs name in `output.password_env`.
pub const PASSWORD_ENV: &str = "EMBEDJOB_TEST_PG_PASSWORD";

/// A database of the test's own on the test server.
pub struct TestDb {
    /// `postgresql://postgres@127.0.0.1:PORT/<name>`, without the password.
    pub url: String,
    pub password: String,
    pub name: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let admin_url = std::env::var("EMBEDJOB_TEST_PG_URL").expect(
            "EMBEDJOB_TEST_PG_URL is not set: start a server with \
             `export $(scripts/setup-postgres)` (scripts/test does this)",
        );
        let password = std::env::var(PASSWORD_ENV).expect("EMBEDJOB_TEST_PG_PASSWORD is set");
        let name = format!("embedjob_{:016x}", rand::random::<u64>());
        let admin = connect(&admin_url, &password).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let base = admin_url.rsplit_once('/').unwrap().0;
        TestDb {
            url: format!("{base}/{name}"),
            password,
            name,
        }
    }

    pub async fn client(&self) -> Client {
        connect(&self.url, &self.password).await
    }

    /// The table's rows by id: text, content hash and vector.
    pub async fn rows(&self, table: &str) -> BTreeMap<String, (String, String, Vec<f32>)> {
        let client = self.client().await;
        let rows = client
            .query(
                &format!("SELECT id, text, content_hash, embedding FROM {table}"),
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                let vector: pgvector::Vector = r.get(3);
                (r.get(0), (r.get(1), r.get(2), vector.to_vec()))
            })
            .collect()
    }

    pub async fn metadata(&self, table: &str) -> BTreeMap<String, String> {
        let client = self.client().await;
        let rows = client
            .query(&format!("SELECT key, value FROM {table}_embedjob"), &[])
            .await
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }
}

async fn connect(url: &str, password: &str) -> Client {
    let mut config = tokio_postgres::Config::from_str(url).unwrap();
    config.password(password);
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A job in `dir` embedding `source` with the simulator at `base_url` into
/// `table` of `db`, its state under `dir/state`.
pub fn write_pg_job(
    dir: &Path,
    base_url: &str,
    source: &str,
    db: &TestDb,
    table: &str,
    output_extra: &str,
) -> PathBuf {
    let job = format!(
        r#"name = "pg-test"
[source]
{source}
[chunking]
max_tokens = 64
overlap_tokens = 8
[backend]
kind = "api"
base_url = "{base_url}"
model = "svc-embed-1"
max_inputs_per_request = 8
concurrency = 4
max_retries = 10
timeout_seconds = 5
[output]
kind = "pgvector"
url = "{url}"
password_env = "{PASSWORD_ENV}"
table = "{table}"
state_dir = "{state}"
{output_extra}
"#,
        url = db.url,
        state = dir.join("state").display()
    );
    let path = dir.join(format!("{table}.toml"));
    std::fs::write(&path, job).unwrap();
    path
}

/// Runs a job; asserts neither the key nor the database password shows.
pub async fn run_pg(job: &Path, db: &TestDb, extra: &[&str]) -> Output {
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .env(PASSWORD_ENV, &db.password)
        .arg("run")
        .arg(job)
        .args(extra);
    let output = run(command).await;
    no_secrets(&output, db);
    output
}

pub fn no_secrets(output: &Output, db: &TestDb) -> (String, String) {
    let (stdout, stderr) = no_key(output, KEY);
    assert!(!stdout.contains(&db.password), "password on stdout");
    assert!(!stderr.contains(&db.password), "password on stderr");
    (stdout, stderr)
}

/// Server processes paused with SIGSTOP, continued when dropped: a database
/// that stops answering mid-run, as a hung server or a lost network does.
pub struct Paused(Vec<i32>);

impl TestDb {
    /// Pauses the server processes of every other connection to this database.
    pub async fn pause_other_connections(&self) -> Paused {
        let client = self.client().await;
        let rows = client
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        let paused = Paused(rows.iter().map(|r| r.get(0)).collect());
        for pid in &paused.0 {
            signal("-STOP", *pid);
        }
        paused
    }
}

impl Paused {
    pub fn count(&self) -> usize {
        self.0.len()
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for pid in &self.0 {
            signal("-CONT", *pid);
        }
    }
}

fn signal(name: &str, pid: i32) {
    let status = std::process::Command::new("kill")
        .arg(name)
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {name} {pid}");
}
