//! Shared fixtures for every topic file: the binary and a simulator per
//! test (here), job files and corpora (`jobs`), raw and hostile servers
//! (`servers`), a PostgreSQL database per test (`pg`), and runs under a
//! memory cap with the bombs they read (`memory`). Topic files import from
//! here only.

mod jobs;
mod memory;
mod pg;
mod servers;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use embedjob::client::{ApiKey, Client, ClientConfig};
use embedjob::simulate::{SimConfig, Simulator};
use serde_json::Value;

pub use jobs::*;
pub use memory::*;
pub use pg::*;
pub use servers::*;

pub const KEY: &str = "sk-test-SECRET-4242-do-not-print";

pub async fn simulator(config: SimConfig) -> Simulator {
    Simulator::start(config)
        .await
        .expect("simulator starts on 127.0.0.1")
}

pub fn client(base_url: &str) -> Client {
    client_with_key(base_url, KEY)
}

pub fn client_with_key(base_url: &str, key: &str) -> Client {
    let mut config = ClientConfig::new(base_url, ApiKey::new(key));
    config.timeout = Duration::from_secs(5);
    config.connect_timeout = Duration::from_secs(2);
    Client::new(config).expect("client builds")
}

pub fn bin() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_embedjob"));
    command
        .env_remove("EMBEDJOB_API_KEY")
        .env_remove("EMBEDJOB_BASE_URL")
        .env_remove("EMBEDJOB_TIMEOUT_SECONDS")
        .env_remove("EMBEDJOB_API_PATH")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR");
    command
}

/// Runs the binary off the test's runtime, so an in-process simulator keeps serving.
pub async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("the binary runs"))
        .await
        .unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts the key appears in neither stream and returns (stdout, stderr).
pub fn no_key(output: &Output, key: &str) -> (String, String) {
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(!stdout.contains(key), "key on stdout: {stdout}");
    assert!(!stderr.contains(key), "key on stderr: {stderr}");
    (stdout, stderr)
}

/// Runs the binary with `input` on its stdin.
pub async fn run_with_stdin(mut command: Command, input: Vec<u8>) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary runs");
        let mut stdin = child.stdin.take().unwrap();
        // Written from a thread of its own, so a full pipe cannot stall the test.
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(&input);
        });
        let output = child.wait_with_output().expect("the binary ends");
        writer.join().unwrap();
        output
    })
    .await
    .unwrap()
}

pub async fn embedjob(args: &[&str]) -> Output {
    let mut command = bin();
    command.env("EMBEDJOB_API_KEY", KEY).args(args);
    run(command).await
}

pub fn json(output: &Output) -> Value {
    let (stdout, stderr) = no_key(output, KEY);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}\n{stderr}"))
}

pub fn path_arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

pub async fn run_job(job: &Path, extra: &[&str]) -> Output {
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .arg("run")
        .arg(job)
        .args(extra);
    run(command).await
}

pub fn spawn_job(job: &Path, extra: &[&str]) -> Child {
    bin()
        .env("EMBEDJOB_API_KEY", KEY)
        .arg("run")
        .arg(job)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

pub async fn wait(child: Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

/// Waits until the simulator has billed `requests` requests in all, or the
/// child has exited; `true` if the count was reached with the child running.
pub async fn wait_for_billed(sim: &Simulator, child: &mut Child, requests: u64) -> bool {
    let started = Instant::now();
    loop {
        if sim.ledger().billed_requests >= requests {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the job never reached {requests} billed requests"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `query JOB TEXT -k K --json`'s results; `env` adds variables.
pub async fn query_json(job: &Path, text: &str, k: usize, env: &[(&str, &str)]) -> Vec<Value> {
    let output = query_output(job, text, &["-k", &k.to_string(), "--json"], env).await;
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        self::text(&output.stderr)
    );
    let (stdout, _) = no_key(&output, KEY);
    let value: Value = serde_json::from_str(&stdout).expect("one JSON object on stdout");
    let results = value["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), k.min(results.len()));
    results
}

pub async fn query_output(
    job: &Path,
    text: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut command = bin();
    command.env("EMBEDJOB_API_KEY", KEY);
    for (name, value) in env {
        command.env(name, value);
    }
    command.arg("query").arg(job).arg(text).args(args);
    run(command).await
}
