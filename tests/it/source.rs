//! Sources through the binary: bad input named with its file, row or column,
//! and inputs written by other tools read as they come.

use std::path::Path;

use embedjob::simulate::SimConfig;
use serde_json::Value;

use crate::support::{
    bin, no_key, path_arg, read_output, run, run_job, run_with_stdin, simulator, text, write_job,
    KEY,
};

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
            name: "invalid utf-8, on_invalid = \"error\"",
            setup: |d| {
                std::fs::create_dir_all(d.join("in")).unwrap();
                std::fs::write(d.join("in/good.txt"), "fine text").unwrap();
                std::fs::write(d.join("in/bad.txt"), b"ok \xff\xfe broken").unwrap();
                format!(
                    "kind = \"files\"\npaths = [\"{}\"]\non_invalid = \"error\"",
                    d.join("in").display()
                )
            },
            exit: 1,
            needles: &["bad.txt", "UTF-8"],
        },
        Case {
            name: "invalid utf-8 in a file named on its own",
            setup: |d| {
                std::fs::create_dir_all(d.join("in")).unwrap();
                std::fs::write(d.join("in/bad.txt"), b"ok \xff\xfe broken").unwrap();
                format!(
                    "kind = \"files\"\npaths = [\"{}\"]",
                    d.join("in/bad.txt").display()
                )
            },
            exit: 1,
            needles: &["bad.txt", "UTF-8"],
        },
        Case {
            name: "stdin for parquet",
            setup: |_| "kind = \"parquet\"\npath = \"-\"\ntext_field = \"text\"".to_string(),
            exit: 2,
            needles: &["stdin", "Parquet"],
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

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A directory as people have them: text files, a gzip-compressed one, a
/// zstd-compressed one and a binary file. The compressed files are read as
/// their text; the binary file is passed over, counted and named.
#[tokio::test]
async fn a_directory_with_a_gz_file_a_binary_file_and_text_files_runs() {
    let sim = simulator(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("in");
    std::fs::create_dir_all(root.join("drafts")).unwrap();
    std::fs::write(root.join("a.md"), "# A\n\nThe first text file.").unwrap();
    std::fs::write(root.join("drafts/b.txt"), "A draft, in a folder.").unwrap();
    let zipped = "# Zipped\n\nA text that came gzip-compressed.";
    std::fs::write(root.join("c.md.gz"), gzip(zipped.as_bytes())).unwrap();
    let squeezed = "A log line that came zstd-compressed.";
    std::fs::write(
        root.join("d.log.zst"),
        zstd::encode_all(squeezed.as_bytes(), 3).unwrap(),
    )
    .unwrap();
    let mut binary = b"\x7fELF\x02\x01\x01\x00\x00\x00".to_vec();
    binary.extend((0..=255u8).cycle().take(4096));
    std::fs::write(root.join("tool.bin"), &binary).unwrap();

    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &format!("kind = \"files\"\npaths = [\"{}\"]", root.display()),
        "",
    );
    let output = run_job(&job, &["--json"]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["documents"], 4, "{summary}");
    assert_eq!(summary["skipped_files"]["count"], 1, "{summary}");
    let skipped = summary["skipped_files"]["first"][0].as_str().unwrap();
    assert!(skipped.ends_with("tool.bin"), "{skipped}");
    let rows = read_output(&dir.path().join("out/result.parquet"));
    let text_of = |id: &str| {
        let at = rows.ids.iter().position(|i| i == id).unwrap_or_else(|| {
            panic!("{id} is not in the output: {:?}", rows.ids);
        });
        rows.texts[at].clone()
    };
    assert_eq!(text_of("c.md.gz#0"), zipped);
    assert_eq!(text_of("d.log.zst#0"), squeezed);
    assert_eq!(text_of("drafts/b.txt#0"), "A draft, in a folder.");

    // People see the file named in the summary.
    let output = run_job(&job, &["--fresh"]).await;
    let (stdout, _) = no_key(&output, KEY);
    assert!(
        stdout.contains("skipped 1 file: ")
            && stdout.contains("tool.bin (not valid UTF-8: first bad byte at offset"),
        "{stdout}"
    );

    // Filters keep and leave out files by their path below the directory.
    let output = run_job(
        &job,
        &[
            "--json",
            "--set",
            "source.include=[\"*.md\", \"*.md.gz\", \"**/*.txt\"]",
            "--set",
            "source.exclude=[\"drafts/**\"]",
        ],
    )
    .await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["documents"], 2, "{summary}");
    assert_eq!(summary["skipped_files"]["count"], 0, "{summary}");

    // Strictness on request: the binary file stops the job, named.
    let output = run_job(&job, &["--set", "source.on_invalid=error"]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("tool.bin") && stderr.contains("UTF-8"),
        "{stderr}"
    );
}

/// `path = "-"`: JSON Lines (here gzip-compressed) and CSV piped into a run.
#[tokio::test]
async fn records_come_from_stdin() {
    let sim = simulator(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..12)
        .map(|i| format!("{{\"id\": \"r{i}\", \"text\": \"Record {i} arrives on stdin.\"}}\n"))
        .collect();
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        "kind = \"jsonl\"\npath = \"-\"\ntext_field = \"text\"\nid_field = \"id\"",
        "",
    );
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .args(["run", path_arg(&job), "--json"]);
    let output = run_with_stdin(command, gzip(lines.as_bytes())).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["documents"], 12);
    let rows = read_output(&dir.path().join("out/result.parquet"));
    let mut ids = rows.ids.clone();
    ids.sort();
    assert_eq!(ids.len(), 12);
    assert!(ids.contains(&"r7#0".to_string()), "{ids:?}");
    assert!(rows
        .texts
        .contains(&"Record 7 arrives on stdin.".to_string()));

    // CSV, and a repeated id named as coming from stdin.
    let csv = "id,text\na,first row\nb,second row\na,third row\n";
    std::fs::remove_dir_all(dir.path().join("out")).unwrap();
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        "kind = \"csv\"\npath = \"-\"\ntext_field = \"text\"",
        "",
    );
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .args(["run", path_arg(&job), "--json"]);
    let output = run_with_stdin(command, csv.as_bytes().to_vec()).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["documents"], 3);
    let mut command = bin();
    command.env("EMBEDJOB_API_KEY", KEY).args([
        "run",
        path_arg(&job),
        "--set",
        "source.id_field=id",
    ]);
    let output = run_with_stdin(command, csv.as_bytes().to_vec()).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("duplicate document id \"a\"") && stderr.contains("<stdin> row 3"),
        "{stderr}"
    );
}

/// `source.metadata_fields` from JSON Lines (dotted paths) and from Parquet
/// (dates, timestamps, narrow integers, dictionaries): pyarrow reads the
/// columns back with the input's types and values.
#[tokio::test]
async fn metadata_columns_read_back_in_pyarrow_with_their_types() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python",
        python.display()
    );
    let sim = simulator(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        r#"{"id": "a", "text": "First page.", "url": "https://a", "meta": {"lang": "en", "year": 2021}, "score": 0.5, "draft": false}"#,
        r#"{"id": "b", "text": "Second page.", "url": null, "meta": {"lang": "fr", "year": 2022}, "score": 2, "draft": true}"#,
    ];
    std::fs::write(dir.path().join("pages.jsonl"), lines.join("\n")).unwrap();
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &format!(
            "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"\n\
             metadata_fields = [\"url\", \"meta.lang\", \"meta.year\", \"score\", \"draft\"]",
            dir.path().join("pages.jsonl").display()
        ),
        "",
    );
    let output = run_job(&job, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let read_back = |path: &Path| {
        let script = "import json, sys, pyarrow.parquet as pq\n\
            t = pq.read_table(sys.argv[1])\n\
            rows = sorted(t.to_pylist(), key=lambda r: r['id'])\n\
            print(json.dumps({'types': {f.name: str(f.type) for f in t.schema}, \
            'rows': [{k: (str(v) if k in ('day', 'at') else v) for k, v in r.items() \
            if k not in ('embedding',)} for r in rows]}))";
        let output = std::process::Command::new(&python)
            .args(["-c", script])
            .arg(path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let table = read_back(&dir.path().join("out/result.parquet"));
    let types = &table["types"];
    assert_eq!(types["url"], "string");
    assert_eq!(types["meta_lang"], "string");
    assert_eq!(types["meta_year"], "int64");
    assert_eq!(types["score"], "double");
    assert_eq!(types["draft"], "bool");
    let rows = &table["rows"];
    assert_eq!(rows[0]["url"], "https://a");
    assert_eq!(rows[1]["url"], Value::Null);
    assert_eq!(rows[1]["meta_lang"], "fr");
    assert_eq!(rows[0]["meta_year"], 2021);
    assert_eq!(rows[1]["score"], 2.0);
    assert_eq!(rows[1]["draft"], true);

    // A Parquet input written by pyarrow keeps its column types.
    let input = dir.path().join("records.parquet");
    let script = "import sys, datetime, pyarrow as pa, pyarrow.parquet as pq\n\
        pq.write_table(pa.table({\n\
          'text': ['one', 'two'],\n\
          'rank': pa.array([3, None], pa.int16()),\n\
          'day': pa.array([datetime.date(2024, 5, 17), None], pa.date32()),\n\
          'at': pa.array([datetime.datetime(2024, 5, 17, 8, 30), None], pa.timestamp('ms', tz='UTC')),\n\
          'tag': pa.array(['x', 'y']).dictionary_encode(),\n\
        }), sys.argv[1], compression='brotli')";
    let output = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(&input)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    std::fs::remove_dir_all(dir.path().join("out")).unwrap();
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &format!(
            "kind = \"parquet\"\npath = \"{}\"\ntext_field = \"text\"\n\
             metadata_fields = [\"rank\", \"day\", \"at\", \"tag\"]",
            input.display()
        ),
        "",
    );
    let output = run_job(&job, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let table = read_back(&dir.path().join("out/result.parquet"));
    let types = &table["types"];
    assert_eq!(types["rank"], "int16");
    assert_eq!(types["day"], "date32[day]");
    assert_eq!(types["at"], "timestamp[ms, tz=UTC]");
    assert_eq!(types["tag"], "string");
    let rows = &table["rows"];
    assert_eq!(rows[0]["rank"], 3);
    assert_eq!(rows[0]["day"], "2024-05-17");
    assert_eq!(rows[0]["at"], "2024-05-17 08:30:00+00:00");
    assert_eq!(rows[1]["tag"], "y");
    assert_eq!(rows[1]["day"], "None");
}
