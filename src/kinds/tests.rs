//! The job file read with every stage's kinds: the shared sections, each
//! kind's parameters and problems, and each kind's part of a split job.

use std::path::Path;

use super::{load, parse};
use crate::backend::api::ApiParams;
use crate::backend::local::LocalParams;
use crate::job::{ChunkSizesSet, ChunkingConfig, Job, Shard};
use crate::sink::parquet::ParquetOutput;
use crate::sink::pgvector::{PgvectorOutput, VectorIndex};
use crate::source::{FilesParams, OnInvalid};

fn parquet(job: &Job) -> &ParquetOutput {
    job.output
        .get::<ParquetOutput>()
        .expect("not a Parquet output")
}

const MINIMAL: &str = r#"
    [source]
    kind = "files"
    paths = ["docs"]
    [backend]
    kind = "local"
    [output]
    path = "out/docs.parquet"
"#;

#[test]
fn defaults_fill_the_rest() {
    let job = parse(MINIMAL, "docs", &[]).unwrap();
    assert_eq!(job.name, "docs");
    assert_eq!(job.chunking, ChunkingConfig::default());
    assert_eq!(
        job.backend.shared.concurrency,
        crate::job::Concurrency::Auto
    );
    assert!(parquet(&job).include_text);
}

#[test]
fn overrides_take_toml_or_plain_strings() {
    let job = parse(
        MINIMAL,
        "docs",
        &[
            "chunking.max_tokens=128".into(),
            "chunking.overlap_tokens=0".into(),
            "output.include_text=false".into(),
            "backend.model=my-model".into(),
            "source.paths=[\"a\", \"b\"]".into(),
        ],
    )
    .unwrap();
    assert_eq!(job.chunking.max_tokens, 128);
    assert!(!parquet(&job).include_text);
    assert_eq!(job.backend.shared.model.as_deref(), Some("my-model"));
    assert_eq!(
        job.source.get::<FilesParams>(),
        Some(&FilesParams {
            paths: vec!["a".into(), "b".into()],
            ..FilesParams::default()
        })
    );
}

#[test]
fn every_problem_is_reported_together() {
    let text = r#"
        name = "x"
        colour = "blue"
        [source]
        kind = "files"
        paths = ["docs"]
        glob = "*.md"
        [chunking]
        max_tokens = "many"
        [backend]
        kind = "local"
        concurrency = 0
        speed = 3
        [output]
        path = "out.parquet"
    "#;
    let problems = parse(text, "x", &["backend.typo=1".into()]).unwrap_err();
    let all = problems.join("\n");
    for needle in [
        "`colour`",
        "`source.glob`",
        "`chunking.max_tokens`",
        "`backend.speed`",
        "`backend.typo`",
    ] {
        assert!(all.contains(needle), "{needle} missing from:\n{all}");
    }
}

#[test]
fn semantic_problems_are_reported_together() {
    let problems = parse(
        MINIMAL,
        "docs",
        &[
            "chunking.overlap_tokens=600".into(),
            "backend.concurrency=0".into(),
            "backend.model=svc-embed-1".into(),
            "backend.dimensions=3072".into(),
            "source.path=x.jsonl".into(),
        ],
    )
    .unwrap_err();
    assert_eq!(problems.len(), 4, "{problems:#?}");
}

#[test]
fn local_settings_are_checked_and_kept_to_local() {
    let job = parse(
        MINIMAL,
        "docs",
        &["backend.threads=2".into(), "backend.batch_size=16".into()],
    )
    .unwrap();
    let local = job.backend.get::<LocalParams>().unwrap();
    assert_eq!(local.threads, Some(2));
    assert_eq!(local.batch_size, Some(16));
    let defaults = parse(MINIMAL, "docs", &[]).unwrap();
    let local = defaults.backend.get::<LocalParams>().unwrap();
    assert_eq!((local.threads, local.batch_size), (None, None));

    let problems = parse(
        MINIMAL,
        "docs",
        &["backend.threads=0".into(), "backend.batch_size=0".into()],
    )
    .unwrap_err();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("`backend.threads`"), "{problems:?}");
    assert!(problems[1].contains("`backend.batch_size`"), "{problems:?}");

    let problems = parse(
        MINIMAL,
        "docs",
        &[
            "backend.kind=api".into(),
            "backend.base_url=http://127.0.0.1:9".into(),
            "backend.model=svc-embed-1".into(),
            "backend.api_key_env=PATH".into(),
            "backend.model_dir=models/m".into(),
            "backend.threads=2".into(),
            "backend.batch_size=8".into(),
        ],
    )
    .unwrap_err();
    for key in ["model_dir", "threads", "batch_size"] {
        let needle = format!("`backend.{key}` does not apply to kind \"api\"");
        assert!(
            problems.contains(&needle),
            "{needle} missing from {problems:#?}"
        );
    }
    assert_eq!(problems.len(), 3, "{problems:#?}");
}

const PGVECTOR: &str = r#"
    name = "docs index"
    [source]
    kind = "files"
    paths = ["docs"]
    [backend]
    kind = "local"
    [output]
    kind = "pgvector"
    url = "postgresql://embedjob@127.0.0.1:5432/search"
    table = "docs_chunks"
"#;

#[test]
fn a_shard_writes_its_own_file_keeps_its_own_state_and_takes_its_part_of_the_limits() {
    let api = [
        "backend.kind=api".to_string(),
        "backend.base_url=http://127.0.0.1:9".to_string(),
        "backend.model=m".to_string(),
        "backend.api_key_env=PATH".to_string(),
        "backend.requests_per_minute=40".to_string(),
        "backend.tokens_per_minute=100000".to_string(),
        "budget.max_cost=2.0".to_string(),
    ];
    let mut job = parse(MINIMAL, "docs", &api).unwrap();
    job.split(Shard::new(1, 4).unwrap()).unwrap();
    assert_eq!(
        parquet(&job).path,
        Path::new("out/docs.parquet/part-00001-of-00004.parquet")
    );
    assert_eq!(
        job.state_stem(),
        Path::new("out/docs.parquet.embedjob/part-00001-of-00004.parquet")
    );
    let api_params = job.backend.get::<ApiParams>().unwrap();
    assert_eq!(api_params.requests_per_minute, 10);
    assert_eq!(api_params.tokens_per_minute, 25_000);
    assert_eq!(job.budget.max_cost, Some(0.5));

    let mut job = parse(MINIMAL, "docs", &api).unwrap();
    let problems = job.split(Shard::new(0, 41).unwrap()).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("`backend.requests_per_minute` is 40"));

    let mut job = parse(PGVECTOR, "docs", &[]).unwrap();
    job.split(Shard::new(2, 4).unwrap()).unwrap();
    assert_eq!(
        job.state_stem(),
        Path::new(".embedjob/docs_index.docs_chunks.part-00002-of-00004")
    );
}

#[test]
fn a_pgvector_output_takes_its_keys_and_names_its_state_after_job_and_table() {
    let job = parse(PGVECTOR, "docs", &["output.index=hnsw".into()]).unwrap();
    let Some(pg) = job.output.get::<PgvectorOutput>() else {
        panic!("not a pgvector output");
    };
    assert_eq!(pg.index, VectorIndex::Hnsw);
    assert_eq!(pg.password_env, None);
    assert_eq!(
        job.output.state_stem(&job.name),
        Path::new(".embedjob/docs_index.docs_chunks")
    );
    let problems = parse(PGVECTOR, "docs", &["output.path=x".into()]).unwrap_err();
    assert_eq!(
        problems,
        ["`output.path` does not apply to kind \"pgvector\""],
        "{problems:#?}"
    );
    let problems = parse(PGVECTOR, "docs", &["output.index=ivf".into()]).unwrap_err();
    assert!(problems[0].contains("`output.index`"), "{problems:#?}");
}

#[test]
fn a_pgvector_url_with_a_password_is_refused_without_quoting_it() {
    for url in [
        "postgresql://embedjob:hunter2secret@127.0.0.1/search",
        "postgresql://embedjob@127.0.0.1/search?password=hunter2secret",
    ] {
        let problems = parse(PGVECTOR, "docs", &[format!("output.url=\"{url}\"")]).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].contains("holds a password (not shown)"));
        assert!(!problems[0].contains("hunter2secret"));
    }
    let problems = parse(
        PGVECTOR,
        "docs",
        &[
            "output.url=\"mysql://h/db\"".into(),
            "output.table=\"Docs-Chunks\"".into(),
            "output.password_env=EMBEDJOB_SURELY_UNSET_VARIABLE".into(),
        ],
    )
    .unwrap_err();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    let long = format!("output.table={}", "t".repeat(55));
    let problems = parse(PGVECTOR, "docs", &[long]).unwrap_err();
    assert!(problems[0].contains("too long"), "{problems:#?}");
    assert!(parse(PGVECTOR, "docs", &["output.table=search.docs_2".into()]).is_ok());
}

#[test]
fn chunk_sizes_left_out_fit_the_window_and_the_request() {
    let job = parse(MINIMAL, "docs", &[]).unwrap();
    assert_eq!(job.chunk_sizes_set, ChunkSizesSet::default());
    let sizes = |job: &Job, window| {
        let c = job.chunking_for(window);
        (c.max_tokens, c.overlap_tokens)
    };
    assert_eq!(sizes(&job, None), (512, 50));
    assert_eq!(sizes(&job, Some(8192)), (512, 50));
    assert_eq!(sizes(&job, Some(254)), (254, 25));
    assert_eq!(sizes(&job, Some(128)), (128, 13));
    assert_eq!(sizes(&job, Some(1)), (1, 0));
    let capped = parse(
        MINIMAL,
        "docs",
        &["backend.max_tokens_per_request=300".into()],
    )
    .unwrap();
    assert_eq!(sizes(&capped, Some(8192)), (300, 29));
    // Sizes the job sets are kept, whatever the window (the run then refuses them).
    let set = parse(MINIMAL, "docs", &["chunking.max_tokens=400".into()]).unwrap();
    assert_eq!(sizes(&set, Some(254)), (400, 39));
    let overlap = parse(MINIMAL, "docs", &["chunking.overlap_tokens=10".into()]).unwrap();
    assert_eq!(sizes(&overlap, Some(254)), (254, 10));
    // Only a chunk size the job sets must fit the request limit at parse time.
    assert!(parse(
        MINIMAL,
        "docs",
        &["backend.max_tokens_per_request=300".into()]
    )
    .is_ok());
    assert!(parse(
        MINIMAL,
        "docs",
        &[
            "backend.max_tokens_per_request=300".into(),
            "chunking.max_tokens=400".into()
        ]
    )
    .is_err());
}

#[test]
fn a_tokenizer_file_is_taken_from_the_job_files_directory_and_a_name_stays_a_name() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    let path = jobs.join("t.toml");
    let job_text = |tokenizer: &str| {
        format!(
            "[source]\nkind = \"files\"\npaths = [\"docs\"]\n[chunking]\ntokenizer = \"{tokenizer}\"\n\
             [backend]\nkind = \"api\"\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\n\
             api_key_env = \"PATH\"\n[output]\npath = \"out.parquet\"\n"
        )
    };
    std::fs::write(&path, job_text("../tok/tokenizer.json")).unwrap();
    let job = load(&path, &[]).unwrap();
    assert_eq!(
        job.chunking.tokenizer.as_deref().map(Path::new),
        Some(dir.path().join("tok/tokenizer.json").as_path())
    );
    for named in ["o200k_base", "bert-base-uncased"] {
        std::fs::write(&path, job_text(named)).unwrap();
        let job = load(&path, &[]).unwrap();
        assert_eq!(job.chunking.tokenizer.as_deref(), Some(named));
        assert_eq!(job.fingerprint_fields()["chunking.tokenizer"], named);
    }
}

#[test]
fn relative_paths_are_taken_from_the_job_files_directory() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    let path = jobs.join("docs.toml");
    std::fs::write(
        &path,
        "[source]\nkind = \"files\"\npaths = [\"../docs/**/*.md\", \"/abs/notes\"]\n\
         [backend]\nkind = \"local\"\nmodel_dir = \"models/m\"\n[output]\npath = \"out/docs.parquet\"\n",
    )
    .unwrap();
    let job = load(&path, &["output.path=../shared/x.parquet".into()]).unwrap();
    let Some(files) = job.source.get::<FilesParams>() else {
        panic!("{:?}", job.source);
    };
    assert_eq!(
        files.paths,
        [
            format!("{}/docs/**/*.md", dir.path().display()),
            "/abs/notes".to_string()
        ]
    );
    assert_eq!(
        job.output.state_stem(&job.name),
        dir.path().join("shared/x.parquet")
    );
    assert_eq!(
        job.backend
            .get::<LocalParams>()
            .unwrap()
            .model_dir
            .as_deref(),
        Some(jobs.join("models/m").as_path())
    );
    // Stdin stays stdin.
    std::fs::write(
        &path,
        "[source]\nkind = \"jsonl\"\npath = \"-\"\ntext_field = \"t\"\n[backend]\nkind = \"local\"\n\
         [output]\npath = \"o.parquet\"\n",
    )
    .unwrap();
    let job = load(&path, &[]).unwrap();
    assert!(job.source.is_stdin());
    assert_eq!(job.source.describe(), "<stdin>");
}

#[test]
fn source_keys_of_the_new_kinds_are_checked() {
    let records = "[source]\nkind = \"jsonl\"\npath = \"x.jsonl\"\ntext_field = \"text\"\n\
                   [backend]\nkind = \"local\"\n[output]\npath = \"o.parquet\"\n";
    let problems = parse(
        records,
        "x",
        &["source.metadata_fields=[\"url\", \"meta..x\", \"embedding\", \"a.b\", \"a_b\"]".into()],
    )
    .unwrap_err();
    let all = problems.join("\n");
    assert_eq!(problems.len(), 3, "{all}");
    assert!(all.contains("\"meta..x\" is not a field name"), "{all}");
    assert!(
        all.contains("column \"embedding\", which the output already has"),
        "{all}"
    );
    assert!(
        all.contains("\"a.b\" and \"a_b\" would both be written as column \"a_b\""),
        "{all}"
    );
    let problems = parse(records, "x", &["source.include=[\"*.md\"]".into()]).unwrap_err();
    assert_eq!(
        problems,
        ["`source.include` does not apply to kind \"jsonl\""]
    );
    let problems = parse(MINIMAL, "x", &["source.on_invalid=ignore".into()]).unwrap_err();
    assert!(
        problems[0].contains("`source.on_invalid`") && problems[0].contains("`skip` or `error`"),
        "{problems:?}"
    );
    let problems = parse(MINIMAL, "x", &["source.include=[\"[\"]".into()]).unwrap_err();
    assert!(problems[0].contains("not a valid glob"), "{problems:?}");
    let job = parse(MINIMAL, "x", &["source.on_invalid=error".into()]).unwrap();
    let Some(files) = job.source.get::<FilesParams>() else {
        panic!()
    };
    assert_eq!(files.on_invalid, OnInvalid::Error);
}

#[test]
fn missing_sections_and_bad_toml() {
    let problems = parse("name = \"x\"", "x", &[]).unwrap_err();
    assert!(problems.iter().any(|p| p.contains("[source]")));
    assert!(problems.iter().any(|p| p.contains("[output]")));
    let problems = parse("name = ", "x", &[]).unwrap_err();
    assert!(problems[0].starts_with("not valid TOML"), "{problems:?}");
    let problems = parse(MINIMAL, "x", &["novalue".into()]).unwrap_err();
    assert!(problems[0].contains("KEY=VALUE"));
}

#[test]
fn a_kind_not_registered_is_refused_with_the_kinds_there_are() {
    let problems = parse(
        MINIMAL,
        "x",
        &[
            "source.kind=foo".into(),
            "backend.kind=3".into(),
            "output.kind=files".into(),
        ],
    )
    .unwrap_err();
    assert_eq!(
        problems,
        [
            "`source.kind`: unknown variant `foo`, expected one of `files`, `jsonl`, `csv`, `parquet`",
            "`backend.kind`: invalid type: unit variant, expected string only",
            "`output.kind`: unknown variant `files`, expected `parquet` or `pgvector`",
        ]
    );
}

/// A section's kinds as the registries list them: name and keys.
type Listed = Vec<(&'static str, &'static [&'static str])>;

#[test]
fn every_registered_kind_has_a_name_of_its_own_and_keys_apart_from_kind() {
    let all = super::all();
    let sections: [(&str, Listed); 3] = [
        (
            "source",
            all.source.iter().map(|k| (k.name(), k.keys())).collect(),
        ),
        (
            "backend",
            all.backend.iter().map(|k| (k.name(), k.keys())).collect(),
        ),
        (
            "output",
            all.output.iter().map(|k| (k.name(), k.keys())).collect(),
        ),
    ];
    for (section, kinds) in sections {
        let mut names: Vec<&str> = kinds.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), kinds.len(), "[{section}] names a kind twice");
        for (name, keys) in kinds {
            assert!(
                !keys.contains(&"kind"),
                "[{section}] kind {name} takes `kind`"
            );
        }
    }
}

/// A kind's name and its keys; a section's kinds; a shared section's keys.
type KindKeys = (&'static str, Vec<String>);
type SectionKinds = (&'static str, Vec<KindKeys>);

/// A two-key inline table is of the wrong type for every key there is:
/// string, number, boolean, list, path and one-word choice alike.
const WRONG: &str = "{ a = 1, b = 2 }";

/// A job file whose every key is of the wrong type: `section` read by
/// `kind` (with `kind = kind_value`), the other kinded sections by their
/// first kind. With the problem each key must give.
fn every_key_wrong(
    section: &str,
    (_, keys): &KindKeys,
    kind_value: &str,
    kinded: &[SectionKinds],
    shared: &[(&str, Vec<String>)],
) -> (String, Vec<String>) {
    let mut text = format!("name = {WRONG}\n");
    let mut expected = vec!["`name`".to_string()];
    for (name, keys) in shared {
        text.push_str(&format!("[{name}]\n"));
        for key in keys {
            text.push_str(&format!("{key} = {WRONG}\n"));
            expected.push(format!("`{name}.{key}`:"));
        }
    }
    for (name, kinds) in kinded {
        let (value, keys) = if *name == section {
            (kind_value.to_string(), keys)
        } else {
            (format!("{:?}", kinds[0].0), &kinds[0].1)
        };
        text.push_str(&format!("[{name}]\nkind = {value}\n"));
        for key in keys {
            text.push_str(&format!("{key} = {WRONG}\n"));
            expected.push(format!("`{name}.{key}`:"));
        }
    }
    (text, expected)
}

/// A job file whose every key has the wrong type named some of them only:
/// the keys of a section whose `kind` was itself refused went unread.
#[test]
fn regression_a_refused_kind_hid_the_wrong_types_of_its_sections_other_keys() {
    use crate::job::{BudgetConfig, PipelineConfig};
    let keys_of = |value: serde_json::Value| -> Vec<String> {
        value.as_object().unwrap().keys().cloned().collect()
    };
    let shared = [
        (
            "chunking",
            keys_of(serde_json::to_value(ChunkingConfig::default()).unwrap()),
        ),
        (
            "pipeline",
            keys_of(serde_json::to_value(PipelineConfig::default()).unwrap()),
        ),
        (
            "budget",
            keys_of(serde_json::to_value(BudgetConfig::default()).unwrap()),
        ),
    ];
    // The `[backend]` keys every kind shares (`BackendShared`).
    let backend_shared = [
        "model",
        "dimensions",
        "max_inputs_per_request",
        "max_tokens_per_request",
        "concurrency",
        "max_concurrency",
        "timeout_seconds",
    ];
    let kinds = super::all();
    let names = |keys: &[&str]| keys.iter().map(|k| (*k).to_string()).collect::<Vec<_>>();
    let kinded: Vec<SectionKinds> = vec![
        (
            "source",
            kinds
                .source
                .iter()
                .map(|k| (k.name(), names(k.keys())))
                .collect(),
        ),
        (
            "backend",
            kinds
                .backend
                .iter()
                .map(|k| (k.name(), [names(k.keys()), names(&backend_shared)].concat()))
                .collect(),
        ),
        (
            "output",
            kinds
                .output
                .iter()
                .map(|k| (k.name(), names(k.keys())))
                .collect(),
        ),
    ];
    // Each kind of each section, with its `kind` right, of the wrong type,
    // and a kind there is not.
    for (section, section_kinds) in &kinded {
        for kind in section_kinds {
            for kind_value in [
                format!("{:?}", kind.0),
                WRONG.to_string(),
                "\"none-such\"".into(),
            ] {
                let (text, expected) =
                    every_key_wrong(section, kind, &kind_value, &kinded, &shared);
                let problems = parse(&text, "x", &[]).unwrap_err().join("\n");
                for needle in &expected {
                    // Each key once, however many kinds share it.
                    assert_eq!(
                        problems.matches(needle.as_str()).count(),
                        1,
                        "{needle} not named once for `{section}.kind = {kind_value}`:\n{problems}\n\nin:\n{text}"
                    );
                }
            }
        }
    }
}

/// A job file's `source.metadata_fields` may not name a field that differs
/// from an output column, or from another field, only in case: DuckDB's
/// column names are case-insensitive, so `Embedding` shadowed `embedding`.
#[test]
fn regression_a_job_files_metadata_field_shadowed_a_column_but_for_case() {
    for (fields, named) in [
        (r#"["Embedding"]"#, vec!["\"Embedding\"", "\"embedding\""]),
        (r#"["lang", "ID"]"#, vec!["\"ID\"", "\"id\""]),
        (r#"["Lang", "lang"]"#, vec!["\"Lang\" and \"lang\""]),
    ] {
        let text = format!(
            "[source]\nkind = \"jsonl\"\npath = \"in.jsonl\"\ntext_field = \"body\"\n\
             metadata_fields = {fields}\n[backend]\nkind = \"local\"\n\
             [output]\npath = \"out.parquet\"\n"
        );
        let problems = parse(&text, "x", &[]).unwrap_err().join("\n");
        assert!(problems.contains("`source.metadata_fields`"), "{problems}");
        for needle in named {
            assert!(
                problems.contains(needle),
                "{needle} missing from {problems}"
            );
        }
    }
}

#[test]
fn a_quota_window_is_a_length_in_seconds_within_a_day_and_only_for_a_service() {
    let api = |window: &str| {
        vec![
            "backend.kind=api".to_string(),
            "backend.base_url=http://127.0.0.1:9".to_string(),
            "backend.model=m".to_string(),
            "backend.api_key_env=PATH".to_string(),
            format!("backend.quota_window_seconds={window}"),
        ]
    };
    for (given, seconds) in [("60", 60.0), ("0.5", 0.5), ("86400", 86_400.0)] {
        let job = parse(MINIMAL, "docs", &api(given)).unwrap();
        let params = job.backend.get::<ApiParams>().unwrap();
        assert_eq!(params.quota_window_seconds, Some(seconds), "{given}");
    }
    let defaults = parse(MINIMAL, "docs", &api("60")[..4]).unwrap();
    let params = defaults.backend.get::<ApiParams>().unwrap();
    assert_eq!(params.quota_window_seconds, None);
    for wrong in ["0", "-1", "86401", "nan", "inf"] {
        let problems = parse(MINIMAL, "docs", &api(wrong)).unwrap_err();
        assert_eq!(problems.len(), 1, "{wrong}: {problems:#?}");
        assert!(
            problems[0].contains("`backend.quota_window_seconds` must be between 0.001 and 86400"),
            "{wrong}: {problems:?}"
        );
    }
    let problems = parse(MINIMAL, "docs", &["backend.quota_window_seconds=60".into()]).unwrap_err();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`backend.quota_window_seconds` does not apply to kind \"local\"")),
        "{problems:#?}"
    );
}
