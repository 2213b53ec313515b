//! Inputs read with a limit through the binary: the job file, Parquet text
//! cells, and `embed -`'s stdin; each over its limit is an error that names
//! what was too large and where.

use std::io::{Read, Write};
use std::process::Stdio;

use embedjob::simulate::{self, SimConfig};
use serde_json::Value;

use crate::support::{
    bin, no_key, run, run_with_stdin, simulator, text, wait, wait_for_billed, KEY,
};

/// Regression: the job file was read whole, so `run /dev/zero` read until
/// memory ran out. A file one byte over the limit is refused, naming the
/// file and the limit.
#[tokio::test]
async fn regression_a_job_file_over_its_limit_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("huge.toml");
    // Sparse: one byte over the limit costs no disk.
    let file = std::fs::File::create(&job).unwrap();
    file.set_len(embedjob::bounded::MAX_JOB_FILE_BYTES + 1)
        .unwrap();
    for command in ["run", "estimate"] {
        let mut c = bin();
        c.arg(command).arg(&job);
        let output = run(c).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains("huge.toml"), "{command}: {stderr}");
        assert!(stderr.contains("more than 16 MiB"), "{command}: {stderr}");
        assert!(output.stdout.is_empty(), "{command}");
    }
}

fn embed_command(base_url: &str, args: &[&str]) -> std::process::Command {
    let mut command = bin();
    command
        .env("EMBEDJOB_BASE_URL", base_url)
        .env("EMBEDJOB_API_KEY", KEY)
        .arg("embed")
        .args(args);
    command
}

/// Regression: `embed -` read all of stdin before sending anything. Two
/// groups of 128 lines are embedded while stdin is still open; the rest
/// follows once it closes, and `--json` gives the same document as before,
/// its vectors in input order.
#[tokio::test]
async fn regression_embed_sends_each_group_of_stdin_as_it_comes() {
    let sim = simulator(SimConfig::default()).await;
    let texts: Vec<String> = (0..266).map(|i| format!("streamed line {i}")).collect();
    let mut child = embed_command(&sim.base_url(), &["--model", "svc-embed-1", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it comes, so that a full pipe never holds the command back.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        stdout.read_to_end(&mut all).map(|_| all)
    });
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = texts.iter().map(|t| format!("{t}\n"));
    // Two whole groups (with a blank line, skipped) and stdin left open.
    let first: String = lines.by_ref().take(256).collect();
    stdin.write_all(format!("\n{first}").as_bytes()).unwrap();
    stdin.flush().unwrap();
    assert!(
        wait_for_billed(&sim, &mut child, 2).await,
        "the command ended before sending"
    );
    assert_eq!(sim.ledger().billed_requests, 2);
    let rest: String = lines.collect();
    stdin.write_all(rest.as_bytes()).unwrap();
    drop(stdin);
    let output = wait(child).await;
    let stdout = reader.join().unwrap().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let value: Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(value["backend"], "api");
    assert_eq!(value["model"], "svc-embed-1");
    assert_eq!(value["dimensions"], 1024);
    assert!(value["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let rows = value["embeddings"].as_array().unwrap();
    assert_eq!(rows.len(), 266);
    for (row, text) in rows.iter().zip(&texts).step_by(19) {
        let got: Vec<f32> = serde_json::from_value(row.clone()).unwrap();
        assert_eq!(got, simulate::embedding_vector(1024, text));
    }
    assert_eq!(sim.ledger().billed_requests, 3);
}

/// A line of stdin over the lines' limit, or over the model's window (as
/// the service lists it, 8192 tokens for svc-embed-1, counted as a job
/// counts), is refused before anything of it is sent, naming its line.
/// Before any request that is a usage error (2), after some a failure (1).
#[tokio::test]
async fn embed_refuses_a_line_too_long_or_over_the_window_naming_it() {
    let sim = simulator(SimConfig::default()).await;
    let limit = usize::try_from(embedjob::bounded::MAX_LINE_BYTES).unwrap();
    // "word" and 8999 " word": one cl100k token each, 9000 in all.
    let over_window = format!("word{}", " word".repeat(8999));
    let group: String = (0..128).map(|i| format!("short {i}\n")).collect();
    let cases = [
        (
            format!("hello\n\n{}\n", "x".repeat(limit + 1)),
            2,
            vec!["stdin line 3", "more than 64 MiB"],
            0,
        ),
        (
            format!("hello\n{over_window}\nbye\n"),
            2,
            vec!["stdin line 2", "9000 tokens", "window of 8192 tokens"],
            0,
        ),
        (
            format!("{group}{over_window}\n"),
            1,
            vec!["stdin line 129", "9000 tokens"],
            1,
        ),
    ];
    for (input, exit, needles, billed) in cases {
        sim.reset_ledger();
        let command = embed_command(&sim.base_url(), &["--model", "svc-embed-1", "--json", "-"]);
        let output = run_with_stdin(command, input.into_bytes()).await;
        let (stdout, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(exit), "{stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
        }
        assert_eq!(sim.ledger().billed_requests, billed, "{stderr}");
        // Nothing before any request; after, an object no reader takes whole.
        if billed == 0 {
            assert!(stdout.is_empty(), "{stdout}");
        } else {
            assert!(stdout.starts_with("{\"backend\":\"api\""), "{stdout}");
            assert!(serde_json::from_str::<Value>(&stdout).is_err());
        }
    }
}

/// The local model's window (256 tokens, 254 of text besides `[CLS]` and
/// `[SEP]`) is checked as its tokenizer counts, for stdin's lines and for
/// texts given: a longer text was cut by the model without a word.
#[tokio::test]
async fn embed_local_refuses_a_text_over_the_models_window() {
    // One WordPiece token a word: 300 of them are over the 254 of text.
    let long = "word ".repeat(300);
    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["embed", "--local", "-"]);
    let output = run_with_stdin(command, format!("fine\n{long}\n").into_bytes()).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for needle in ["stdin line 2", "300 tokens", "window of 254 tokens"] {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    assert!(output.stdout.is_empty());
    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["embed", "--local", "fine", &long]);
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("text 2: 300 tokens"), "{stderr}");
}
