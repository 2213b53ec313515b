//! The `embedjob` binary: commands, exit codes, and that the key never shows.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use embedjob::simulate::{self, KeySpec, SimConfig};
use serde_json::Value;

use crate::support::{bin, no_key, run, run_with_stdin, simulator, text, KEY};

fn with_service(base_url: &str, key: &str, args: &[&str]) -> Command {
    let mut command = bin();
    command
        .env("EMBEDJOB_BASE_URL", base_url)
        .env("EMBEDJOB_API_KEY", key)
        .args(args);
    command
}

#[tokio::test]
async fn models_lists_and_shows() {
    let sim = simulator(SimConfig::default()).await;
    let output = run(with_service(&sim.base_url(), KEY, &["models"])).await;
    let (stdout, _) = no_key(&output, KEY);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.starts_with("ID"), "{stdout}");
    for id in ["svc-base", "svc-pro", "svc-embed-1", "svc-embed-1-l"] {
        assert!(stdout.contains(id), "{id} missing: {stdout}");
    }

    let output = run(with_service(&sim.base_url(), KEY, &["models", "--json"])).await;
    let (stdout, _) = no_key(&output, KEY);
    let value: Value = serde_json::from_str(&stdout).expect("one JSON object on stdout");
    assert!(value["models"].as_array().unwrap().len() >= 4);

    let output = run(with_service(
        &sim.base_url(),
        KEY,
        &["models", "svc-embed-1-l", "--json"],
    ))
    .await;
    let (stdout, _) = no_key(&output, KEY);
    let value: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(value["id"], "svc-embed-1-l");
    assert!(value["pricing"]["input_per_1k"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn embed_prints_the_services_vectors() {
    let sim = simulator(SimConfig::default()).await;
    let output = run(with_service(
        &sim.base_url(),
        KEY,
        &[
            "embed",
            "--model",
            "svc-embed-1",
            "--json",
            "first text",
            "second text",
        ],
    ))
    .await;
    let (stdout, _) = no_key(&output, KEY);
    assert!(output.status.success(), "{output:?}");
    let value: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(value["dimensions"], 1024);
    let rows = value["embeddings"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, text) in rows.iter().zip(["first text", "second text"]) {
        let got: Vec<f32> = serde_json::from_value(row.clone()).unwrap();
        assert_eq!(got, simulate::embedding_vector(1024, text));
    }
    assert!(value["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    let output = run(with_service(
        &sim.base_url(),
        KEY,
        &["embed", "--model", "svc-embed-1", "hello"],
    ))
    .await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert!(stdout.starts_with("0\t1024\t["), "{stdout}");
    assert!(stderr.contains("prompt tokens"), "{stderr}");
}

#[tokio::test]
async fn chat_streams_and_waits() {
    let sim = simulator(SimConfig::default()).await;
    let streamed = run(with_service(
        &sim.base_url(),
        KEY,
        &[
            "chat",
            "--model",
            "svc-base",
            "--system",
            "be brief",
            "--temperature",
            "0.5",
            "hello there",
        ],
    ))
    .await;
    let (stdout, _) = no_key(&streamed, KEY);
    assert!(streamed.status.success(), "{streamed:?}");
    assert!(stdout.contains("hello there"), "{stdout}");
    let plain = run(with_service(
        &sim.base_url(),
        KEY,
        &["chat", "--model", "svc-base", "--no-stream", "hello there"],
    ))
    .await;
    assert_eq!(text(&plain.stdout), stdout);

    let limited = run(with_service(
        &sim.base_url(),
        KEY,
        &[
            "chat",
            "--model",
            "svc-base",
            "--max-tokens",
            "2",
            "one two three four five",
        ],
    ))
    .await;
    assert!(limited.status.success());
    assert!(
        text(&limited.stdout).split_whitespace().count() <= 2,
        "{}",
        text(&limited.stdout)
    );
}

/// `chat` goes through the rate control the embeddings use: a rate limit
/// is waited out and uses up none of its three retries.
#[tokio::test]
async fn chat_waits_out_rate_limits_beyond_its_retries() {
    let sim = simulator(SimConfig {
        faults: simulate::Faults {
            rate_429: 1.0,
            retry_after_seconds: 0,
            limit: Some(5),
            ..simulate::Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    for stream in [false, true] {
        let mut args = vec!["chat", "--model", "svc-base", "hello there"];
        if !stream {
            args.insert(1, "--no-stream");
        }
        let output = run(with_service(&sim.base_url(), KEY, &args)).await;
        let (stdout, stderr) = no_key(&output, KEY);
        assert!(output.status.success(), "{stderr}");
        assert!(stdout.contains("You said: hello there"), "{stdout}");
    }
    let ledger = sim.ledger();
    assert_eq!(ledger.faults["429"], 5, "{:?}", ledger.faults);
    assert_eq!(ledger.chat_requests, 7, "five refusals, then two replies");
}

#[tokio::test]
async fn failures_are_one_line_with_the_right_exit_code_and_no_key() {
    let sim = simulator(SimConfig {
        keys: vec![KeySpec {
            key: KEY.to_string(),
            models: None,
        }],
        ..SimConfig::default()
    })
    .await;
    let base = sim.base_url();
    let refused_key = "sk-refused-SECRET-777";
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port())
    };
    for (command, code, needle, secret) in failure_cases(&base, refused_key, &closed_port) {
        let described = format!("{command:?}").replace(secret, "<key>");
        let output = run(command).await;
        let (stdout, stderr) = no_key(&output, secret);
        assert_eq!(output.status.code(), Some(code), "{described}: {stderr}");
        assert!(
            stdout.is_empty(),
            "{described}: nothing on stdout on failure, got {stdout}"
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{described}: one line: {stderr}"
        );
        assert!(
            stderr.starts_with("embedjob: error: "),
            "{described}: {stderr}"
        );
        assert!(
            stderr.contains(needle),
            "{described}: {needle:?} not in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{described}: {stderr}");
    }
}

/// Commands that must fail: each with its exit code, a word its message must
/// hold, and the key it must not show.
fn failure_cases<'a>(
    base: &str,
    refused_key: &'a str,
    closed_port: &str,
) -> Vec<(Command, i32, &'a str, &'a str)> {
    vec![
        (
            {
                let mut c = bin();
                c.env("EMBEDJOB_BASE_URL", base).args(["models"]);
                c
            },
            2,
            "EMBEDJOB_API_KEY",
            KEY,
        ),
        (
            {
                let mut c = bin();
                c.env("EMBEDJOB_API_KEY", KEY).args(["models"]);
                c
            },
            2,
            "EMBEDJOB_BASE_URL",
            KEY,
        ),
        (
            with_service(base, refused_key, &["models", "--json"]),
            1,
            "401",
            refused_key,
        ),
        (
            with_service(base, refused_key, &["embed", "--model", "svc-embed-1", "x"]),
            1,
            "401",
            refused_key,
        ),
        (
            with_service(base, refused_key, &["chat", "--model", "svc-base", "x"]),
            1,
            "401",
            refused_key,
        ),
        (
            with_service(base, KEY, &["models", "svc-missing"]),
            1,
            "svc-missing",
            KEY,
        ),
        (
            with_service(base, KEY, &["embed", "--model", "svc-missing", "x"]),
            1,
            "404",
            KEY,
        ),
        (
            with_service(base, KEY, &["embed", "--model", "svc-base", "x"]),
            1,
            "400",
            KEY,
        ),
        (
            with_service(
                base,
                KEY,
                &["chat", "--model", "svc-base", "--temperature", "2.5", "x"],
            ),
            2,
            "temperature",
            KEY,
        ),
        (
            with_service(
                base,
                KEY,
                &["chat", "--model", "svc-base", "--temperature", "-0.1", "x"],
            ),
            2,
            "temperature",
            KEY,
        ),
        (
            with_service(closed_port, KEY, &["models"]),
            1,
            "connect",
            KEY,
        ),
        (
            with_service("ftp://nowhere", KEY, &["models"]),
            2,
            "base URL",
            KEY,
        ),
    ]
}

#[tokio::test]
async fn simulate_serves_on_the_port_it_prints() {
    let mut child = bin()
        .args([
            "simulate",
            "--port",
            "0",
            "--key",
            &format!("{KEY}=svc-embed-1"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let first_line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let base = first_line.trim().to_string();
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    let output = run(with_service(&base, KEY, &["models", "--json"])).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    let ids: Vec<&str> = value["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["svc-embed-1"]);
}

#[tokio::test]
async fn bad_simulator_options_are_usage_errors() {
    let output = run({
        let mut c = bin();
        c.args(["simulate", "--rate-429", "0.8", "--rate-500", "0.8"]);
        c
    })
    .await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let output = run({
        let mut c = bin();
        c.args([
            "simulate",
            "--quota-window",
            "sliding",
            "--quota-reset",
            "newest",
        ]);
        c
    })
    .await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("--quota-reset newest: expected oldest or whole"),
        "{}",
        text(&output.stderr)
    );
}

/// `embed -` reads one text per line from stdin (blank lines skipped), in
/// requests of at most 128 texts, each vector checked as a run checks it.
#[tokio::test]
async fn embed_reads_texts_from_stdin_one_per_line() {
    let sim = simulator(SimConfig::default()).await;
    let texts: Vec<String> = (0..300).map(|i| format!("line number {i}")).collect();
    let input = format!("{}\n\n   \n", texts.join("\n"));
    let command = with_service(
        &sim.base_url(),
        KEY,
        &["embed", "--model", "svc-embed-1", "--json", "-"],
    );
    let output = run_with_stdin(command, input.into_bytes()).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert!(output.status.success(), "{stderr}");
    let value: Value = serde_json::from_str(&stdout).unwrap();
    let rows = value["embeddings"].as_array().unwrap();
    assert_eq!(rows.len(), 300);
    for (row, text) in rows.iter().zip(&texts).step_by(37) {
        let got: Vec<f32> = serde_json::from_value(row.clone()).unwrap();
        assert_eq!(got, simulate::embedding_vector(1024, text));
    }
    assert_eq!(
        sim.ledger().billed_requests,
        3,
        "requests of at most 128 texts"
    );

    // `-` is the text "-" no more; with other texts it is a usage error.
    let command = with_service(
        &sim.base_url(),
        KEY,
        &["embed", "--model", "svc-embed-1", "-", "x"],
    );
    let output = run_with_stdin(command, b"a\n".to_vec()).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("give it alone"),
        "{}",
        text(&output.stderr)
    );
    let command = with_service(
        &sim.base_url(),
        KEY,
        &["embed", "--model", "svc-embed-1", "-"],
    );
    let output = run_with_stdin(command, b"\n\n".to_vec()).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("no text"),
        "{}",
        text(&output.stderr)
    );
}

/// `init` writes a commented job for a folder or a file of records, which
/// runs as written; it does not overwrite a job file unless told to.
#[tokio::test]
async fn init_writes_a_commented_job_that_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("my docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("a.md"), "# A\n\nSome text.").unwrap();
    let mut command = bin();
    command.current_dir(dir.path()).args(["init", "my docs"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.contains("wrote my-docs.toml"), "{stdout}");
    assert!(stdout.contains("embedjob run my-docs.toml"), "{stdout}");
    let written = std::fs::read_to_string(dir.path().join("my-docs.toml")).unwrap();
    for needle in [
        "name = \"my-docs\"",
        "kind = \"files\"",
        "paths = [\"my docs\"]",
        "# include = ",
        "# on_invalid = ",
        "kind = \"local\"",
        "# kind = \"api\"",
        "path = \"out/my-docs.parquet\"",
    ] {
        assert!(written.contains(needle), "{needle:?} not in:\n{written}");
    }
    let job = embedjob::kinds::load(&dir.path().join("my-docs.toml"), &[]).unwrap();
    assert_eq!(
        job.source.describe(),
        dir.path().join("my docs").display().to_string()
    );

    let mut command = bin();
    command.current_dir(dir.path()).args(["init", "my docs"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("--force"),
        "{}",
        text(&output.stderr)
    );

    // Records: the text and id fields found, the other fields offered as metadata.
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("pages.jsonl"),
        "{\"uid\": 1, \"id\": \"p1\", \"title\": \"T\", \"content\": \"The page.\", \"lang\": \"en\"}\n",
    )
    .unwrap();
    let mut command = bin();
    command
        .current_dir(dir.path())
        .args(["init", "data/pages.jsonl", "-o", "jobs/pages.toml"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let written = std::fs::read_to_string(dir.path().join("jobs/pages.toml")).unwrap();
    for needle in [
        "kind = \"jsonl\"",
        "path = \"../data/pages.jsonl\"",
        "text_field = \"content\"",
        "id_field = \"id\"",
        "# metadata_fields = [\"lang\", \"title\", \"uid\"]",
    ] {
        assert!(written.contains(needle), "{needle:?} not in:\n{written}");
    }
    let job = embedjob::kinds::load(&dir.path().join("jobs/pages.toml"), &[]).unwrap();
    assert_eq!(
        job.source.describe(),
        dir.path().join("data/pages.jsonl").display().to_string()
    );
}

/// `--help` shows examples; completions and the manual page are generated.
#[tokio::test]
async fn help_shows_examples_and_completions_and_man_pages_are_generated() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["init", "--help"],
        &["embed", "--help"],
    ] {
        let mut command = bin();
        command.args(args);
        let output = run(command).await;
        let stdout = text(&output.stdout);
        assert!(output.status.success(), "{args:?}");
        assert!(
            stdout.contains("Examples:\n  embedjob "),
            "{args:?}: {stdout}"
        );
    }
    for (shell, needle) in [
        ("bash", "complete -F _embedjob"),
        ("zsh", "#compdef embedjob"),
        ("fish", "complete -c embedjob"),
    ] {
        let mut command = bin();
        command.args(["completions", shell]);
        let output = run(command).await;
        let stdout = text(&output.stdout);
        assert!(output.status.success(), "{shell}");
        assert!(stdout.contains(needle), "{shell}: {needle:?} missing");
        assert!(stdout.contains("max-duration"), "{shell}: flags completed");
    }
    let mut command = bin();
    command.arg("man");
    let output = run(command).await;
    let page = text(&output.stdout);
    assert!(page.contains(".TH embedjob 1"), "{page}");
    assert!(page.contains("completions"), "{page}");
    let mut command = bin();
    command.args(["man", "run"]);
    let page = text(&run(command).await.stdout);
    assert!(page.contains(".TH embedjob-run 1"), "{page}");
    assert!(page.contains("max\\-duration"), "{page}");
    let mut command = bin();
    command.args(["man", "nothing"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(2));
}

/// Durations are read by humantime (`1h30m` too); a bad one is refused
/// before the job is read, never with a panic. A TOML error names its line
/// and column, and so does a problem with a key the file writes.
#[tokio::test]
async fn durations_and_job_file_errors_say_where() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    for good in ["1h30m", "1h 30m", "90s", "30m", "2h", "45", "1.5h"] {
        let mut command = bin();
        command
            .arg("run")
            .arg(&missing)
            .args(["--max-duration", good]);
        let output = run(command).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{good}: {stderr}");
        assert!(
            stderr.contains("cannot read the job file"),
            "{good}: {stderr}"
        );
    }
    for bad in ["0", "soon", "1e300", "-5", "5 parsecs"] {
        let mut command = bin();
        command
            .arg("run")
            .arg(&missing)
            .arg(format!("--max-duration={bad}"));
        let output = run(command).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--max-duration"), "{bad}: {stderr}");
        assert!(!stderr.contains("panicked"), "{bad}: {stderr}");
    }

    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        "name = \"x\"\n[source]\nkind = \"files\"\npaths = [\"a\"\n",
    )
    .unwrap();
    let mut command = bin();
    command.arg("run").arg(&job);
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not valid TOML at line 4, column 13"),
        "{stderr}"
    );

    std::fs::write(
        &job,
        "[source]\nkind = \"files\"\npaths = [\"a\"]\n[backend]\nkind = \"local\"\n  threads = 0\n\
         colour = \"blue\"\n[output]\npath = \"o.parquet\"\n",
    )
    .unwrap();
    let mut command = bin();
    command.arg("run").arg(&job);
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("line 6, column 3: `backend.threads` must be between 1 and 1024"),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 7, column 1: unknown key `backend.colour`"),
        "{stderr}"
    );
}
