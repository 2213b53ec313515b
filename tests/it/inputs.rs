//! Inputs read with a limit through the binary: the job file, Parquet text
//! cells, and `embed -`'s stdin; each over its limit is an error that names
//! what was too large and where.

use crate::support::{bin, run, text};

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
