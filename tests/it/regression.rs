//! Tests that each pin a bug, named after it.

use crate::cli::{bin, run, text};

/// A local job took the api kind's keys (`requests_per_minute`,
/// `max_retries`, …) without a word, though they limit nothing there.
#[tokio::test]
async fn regression_api_keys_in_a_local_job_were_silently_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        "[source]\nkind = \"files\"\npaths = [\"docs\"]\n\
         [backend]\nkind = \"local\"\nrequests_per_minute = 60\nmax_retries = 3\n\
         [output]\npath = \"out.parquet\"\n",
    )
    .unwrap();
    let mut command = bin();
    command.arg("estimate").arg(&job).arg("--json");
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty());
    for key in ["requests_per_minute", "max_retries"] {
        let problem = format!("`backend.{key}` does not apply to kind \"local\"");
        assert!(stderr.contains(&problem), "{problem} missing from {stderr}");
    }
}
