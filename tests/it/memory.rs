//! Compression bombs, endless lines and records, and an endless tokenizer
//! file, read by the binary under a cap on its memory: each run ends with
//! the documented error or skip, and never meets the cap.
//!
//! The cap, derived from the mechanism (`src/bounded.rs`):
//! - an ordinary run maps less than 64 MiB of data plus 16 MiB a core
//!   (runtime threads' stacks and allocator arenas), which
//!   `an_ordinary_run_fits_in_the_allowance_for_the_runtime` holds to;
//! - a bounded read holds at most 64 MiB + 1 bytes in one buffer, whose
//!   capacity at most doubles to 128 MiB as it grows;
//!
//! so a bounded run maps less than 192 MiB + 16 MiB a core, and [`cap`] is
//! twice that. Reading a bomb of B bytes whole needs at least B, and every
//! bomb here is twice the cap: the code before the bounds ends each run by
//! an allocator abort or an "out of memory" error.

use std::path::Path;
use std::process::Output;

use embedjob::simulate::SimConfig;
use serde_json::Value;

use crate::support::{
    bomb, capped_bin, no_key, path_arg, run, simulator, write_job, Squeeze, KEY, MIB,
};

/// Data an ordinary run may map: 64 MiB plus 16 MiB a core.
fn runtime_allowance() -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    64 * MIB + 16 * MIB * cores
}

/// Twice what a bounded run maps: the runtime and one 128 MiB buffer.
fn cap() -> u64 {
    2 * (runtime_allowance() + 128 * MIB)
}

/// MiB in a bomb: twice the cap, so reading it whole cannot fit.
fn bomb_mib() -> u64 {
    2 * cap() / MIB
}

/// `embedjob run JOB ARGS…` with its data capped at `limit`.
async fn run_capped(job: &Path, args: &[&str], limit: u64) -> Output {
    let mut command = capped_bin(limit);
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .arg("run")
        .arg(job)
        .args(args);
    run(command).await
}

/// The run exited with `code` (not killed by a signal, as an allocator
/// abort is), no allocation failed, and stderr says `message`.
fn assert_ended(output: &Output, code: i32, message: &str, what: &str) -> String {
    let (_, stderr) = no_key(output, KEY);
    assert_eq!(output.status.code(), Some(code), "{what}: {stderr}");
    for failed in ["memory allocation", "out of memory"] {
        assert!(!stderr.contains(failed), "{what}: {stderr}");
    }
    assert!(stderr.contains(message), "{what}: {stderr}");
    stderr
}

/// A job over `source` against a fresh simulator, in `dir`.
async fn job(dir: &Path, source: &str) -> (embedjob::simulate::Simulator, std::path::PathBuf) {
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir, &sim.base_url(), source, "");
    (sim, job)
}

#[tokio::test]
async fn an_ordinary_run_fits_in_the_allowance_for_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.md"), "# A\n\nAn ordinary document.").unwrap();
    let (sim, job) = job(dir.path(), &crate::support::files_source(&root)).await;
    let output = run_capped(&job, &["--json"], runtime_allowance()).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["written"], 1, "{summary}");
    assert_eq!(sim.ledger().billed_requests, 1);
}

#[tokio::test]
async fn memory_cap_gzip_and_zstd_bombs_are_passed_over_in_a_folder_and_named_on_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.md"), "# A\n\nAn ordinary document.").unwrap();
    let gz = root.join("bomb.txt.gz");
    let zst = root.join("bomb.txt.zst");
    std::fs::write(&gz, bomb(Squeeze::Gzip, b"", bomb_mib())).unwrap();
    std::fs::write(&zst, bomb(Squeeze::Zstd, b"", bomb_mib())).unwrap();
    let (sim, job) = job(dir.path(), &crate::support::files_source(&root)).await;

    // In a folder: passed over, named in the summary; the rest is embedded.
    let output = run_capped(&job, &["--json"], cap()).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("memory"), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["written"], 1, "{summary}");
    assert_eq!(summary["skipped_files"]["count"], 2, "{summary}");
    let skipped = summary["skipped_files"]["first"].to_string();
    assert!(
        skipped.contains("bomb.txt.gz") && skipped.contains("bomb.txt.zst"),
        "{skipped}"
    );
    for reason in summary["skipped_files"]["reasons"].as_array().unwrap() {
        let reason = reason.as_str().unwrap();
        assert!(
            reason.starts_with("more than 64 MiB (decompressed)"),
            "{reason}"
        );
    }
    assert_eq!(sim.ledger().billed_requests, 1);

    // Named on its own, each is an error that names it and the limit.
    for bomb in [&gz, &zst] {
        let paths = format!("source.paths=[\"{}\"]", path_arg(bomb));
        let output = run_capped(&job, &["--fresh", "--set", &paths], cap()).await;
        let stderr = assert_ended(
            &output,
            1,
            "more than 64 MiB (decompressed), the most a document may hold",
            path_arg(bomb),
        );
        assert!(stderr.contains(path_arg(bomb)), "{stderr}");
    }
}

#[tokio::test]
async fn memory_cap_a_compressed_jsonl_line_that_never_ends_is_an_error_naming_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl.gz");
    let head = b"{\"id\":\"0\",\"text\":\"fine\"}\n{\"id\":\"1\",\"text\":\"";
    std::fs::write(&input, bomb(Squeeze::Gzip, head, bomb_mib())).unwrap();
    let source = format!(
        "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"",
        input.display()
    );
    let (_sim, job) = job(dir.path(), &source).await;
    let output = run_capped(&job, &[], cap()).await;
    let stderr = assert_ended(
        &output,
        1,
        "row 2: a line of more than 64 MiB (decompressed), the most a line may hold",
        "endless line",
    );
    assert!(stderr.contains("in.jsonl.gz"), "{stderr}");
}

#[tokio::test]
async fn memory_cap_a_csv_quote_that_never_closes_is_an_error_naming_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv.zst");
    std::fs::write(
        &input,
        bomb(Squeeze::Zstd, b"id,text\n0,fine\n1,\"", bomb_mib()),
    )
    .unwrap();
    let source = format!(
        "kind = \"csv\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"",
        input.display()
    );
    let (_sim, job) = job(dir.path(), &source).await;
    let output = run_capped(&job, &[], cap()).await;
    let stderr = assert_ended(
        &output,
        1,
        "row 2: a record of more than 64 MiB (decompressed), the most a record may hold",
        "unclosed quote",
    );
    assert!(stderr.contains("in.csv.zst"), "{stderr}");
}

#[tokio::test]
async fn memory_cap_a_tokenizer_file_that_never_ends_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.md"), "An ordinary document.").unwrap();
    let (sim, job) = job(dir.path(), &crate::support::files_source(&root)).await;
    let output = run_capped(&job, &["--set", "chunking.tokenizer=\"/dev/zero\""], cap()).await;
    assert_ended(
        &output,
        2,
        "cannot load the /dev/zero tokenizer: `chunking.tokenizer`: more than 64 MiB, \
         the most a tokenizer file may hold",
        "/dev/zero",
    );
    assert_eq!(sim.ledger().embedding_requests, 0);
}
