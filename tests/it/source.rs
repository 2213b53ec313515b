//! Sources through the binary: bad input named with its file, row or column,
//! and inputs written by other tools read as they come.

use std::path::Path;

use embedjob::simulate::SimConfig;
use serde_json::Value;

use crate::cli::{no_key, run, text};
use crate::run::{read_output, run_job, write_job};
use crate::support::{simulator, KEY};

/// Bad input: a clear error naming the file (and row or column), a non-zero exit, no output.
#[tokio::test]
async fn bad_input_is_named_and_leaves_no_output() {
    let sim = simulator(SimConfig::default()).await;
    struct Case {
        name: &'static str,
        setup: fn(&Path) -> String,
        exit: i32,
        needles: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "invalid utf-8",
            setup: |d| {
                std::fs::create_dir_all(d.join("in")).unwrap();
                std::fs::write(d.join("in/good.txt"), "fine text").unwrap();
                std::fs::write(d.join("in/bad.txt"), b"ok \xff\xfe broken").unwrap();
                format!("kind = \"files\"\npaths = [\"{}\"]", d.join("in").display())
            },
            exit: 1,
            needles: &["bad.txt", "UTF-8"],
        },
        Case {
            name: "empty input",
            setup: |d| {
                std::fs::create_dir_all(d.join("in")).unwrap();
                std::fs::write(d.join("in/blank.txt"), "   \n").unwrap();
                format!("kind = \"files\"\npaths = [\"{}\"]", d.join("in").display())
            },
            exit: 1,
            needles: &["no documents"],
        },
        Case {
            name: "glob matches nothing",
            setup: |d| {
                format!(
                    "kind = \"files\"\npaths = [\"{}/nothing/*.md\"]",
                    d.display()
                )
            },
            exit: 2,
            needles: &["nothing/*.md"],
        },
        Case {
            name: "jsonl bad row",
            setup: |d| {
                std::fs::write(
                    d.join("in.jsonl"),
                    "{\"id\":\"a\",\"text\":\"one\"}\n{\"id\":\"b\",\"text\":42}\n",
                )
                .unwrap();
                format!(
                    "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"",
                    d.join("in.jsonl").display()
                )
            },
            exit: 1,
            needles: &["in.jsonl", "2"],
        },
        Case {
            name: "duplicate ids",
            setup: |d| {
                std::fs::write(
                    d.join("in.jsonl"),
                    "{\"id\":\"a\",\"text\":\"one\"}\n{\"id\":\"a\",\"text\":\"two\"}\n",
                )
                .unwrap();
                format!(
                    "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"",
                    d.join("in.jsonl").display()
                )
            },
            exit: 1,
            needles: &["duplicate", "\"a\""],
        },
        Case {
            name: "csv missing column",
            setup: |d| {
                std::fs::write(d.join("in.csv"), "id,body\n1,hello\n").unwrap();
                format!(
                    "kind = \"csv\"\npath = \"{}\"\ntext_field = \"text\"",
                    d.join("in.csv").display()
                )
            },
            exit: 2,
            needles: &["in.csv", "text"],
        },
        Case {
            name: "corrupt parquet",
            setup: |d| {
                std::fs::write(
                    d.join("in.parquet"),
                    b"PAR1 this is not really parquet PAR1",
                )
                .unwrap();
                format!(
                    "kind = \"parquet\"\npath = \"{}\"\ntext_field = \"text\"",
                    d.join("in.parquet").display()
                )
            },
            exit: 1,
            needles: &["in.parquet"],
        },
    ];
    for case in cases {
        let dir = tempfile::tempdir().unwrap();
        let source = (case.setup)(dir.path());
        let job = write_job(dir.path(), &sim.base_url(), &source, "");
        let output = run_job(&job, &[]).await;
        let (stdout, stderr) = no_key(&output, KEY);
        assert_eq!(
            output.status.code(),
            Some(case.exit),
            "{}: {stderr}",
            case.name
        );
        assert!(stdout.is_empty(), "{}: {stdout}", case.name);
        assert!(!stderr.contains("panicked"), "{}: {stderr}", case.name);
        for needle in case.needles {
            assert!(
                stderr.contains(needle),
                "{}: {needle:?} not in {stderr}",
                case.name
            );
        }
        let out = dir.path().join("out");
        let summary = out.join("result.parquet.summary.json");
        let leftovers: Vec<_> = std::fs::read_dir(&out)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| *p != summary)
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            leftovers.is_empty(),
            "{}: no partial output, found {leftovers:?}",
            case.name
        );
        // A run that failed once it started says so in its summary.
        if let Ok(text) = std::fs::read_to_string(&summary) {
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(value["exit_code"], case.exit, "{}: {value}", case.name);
            assert!(value["error"].is_string(), "{}: {value}", case.name);
        }
    }
}

/// Parquet written by pyarrow (default, large_string, string_view,
/// dictionary) and by DuckDB reads as a source, nulls and empties skipped.
#[tokio::test]
async fn parquet_inputs_from_pyarrow_and_duckdb_are_read() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("inputs");
    let mut command = std::process::Command::new(&python);
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/write_inputs.py"))
        .arg(&inputs);
    let output = run(command).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let sim = simulator(SimConfig::default()).await;
    for file in [
        "pyarrow_default.parquet",
        "pyarrow_large.parquet",
        "pyarrow_view.parquet",
        "pyarrow_dictionary.parquet",
        "duckdb.parquet",
    ] {
        let source = format!(
            "kind = \"parquet\"\npath = \"{}\"\ntext_field = \"body\"\nid_field = \"id\"",
            inputs.join(file).display()
        );
        let job = write_job(dir.path(), &sim.base_url(), &source, "");
        let output = run_job(&job, &["--json"]).await;
        assert_eq!(
            output.status.code(),
            Some(0),
            "{file}: {}",
            text(&output.stderr)
        );
        let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(summary["documents"], 40, "{file}: {summary}");
        assert_eq!(summary["skipped_null"], 5, "{file}");
        assert_eq!(summary["skipped_empty"], 5, "{file}");
        let rows = read_output(&dir.path().join("out/result.parquet"));
        assert!(
            rows.ids.iter().any(|id| id == "rec-0#0"),
            "{file}: ids come from the id column"
        );
        assert!(
            !rows.ids.iter().any(|id| id.starts_with("rec-3#")),
            "{file}: null skipped"
        );
    }
}
