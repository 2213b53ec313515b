//! Whatever a job file and its `--set` overrides hold (every key of every
//! section and kind, with values of any TOML type: integers at the ends of
//! i64, `inf` and `nan`, empty strings, arrays, tables), reading it gives a
//! job or problems that each say what is wrong, never a panic; and a job
//! read has its numbers in their documented ranges.

use proptest::prelude::*;
use toml::Value;

use super::parse;

const SECTIONS: [(&str, &[&str]); 7] = [
    ("", &["name"]),
    (
        "source",
        &[
            "kind",
            "paths",
            "include",
            "exclude",
            "on_invalid",
            "path",
            "text_field",
            "id_field",
            "metadata_fields",
        ],
    ),
    (
        "chunking",
        &["max_tokens", "overlap_tokens", "tokenizer", "markdown"],
    ),
    (
        "backend",
        &[
            "kind",
            "base_url",
            "api_key_env",
            "model",
            "dimensions",
            "api_path",
            "context_window",
            "probe_window",
            "input_per_1k",
            "encoding_format",
            "max_inputs_per_request",
            "max_tokens_per_request",
            "concurrency",
            "max_concurrency",
            "requests_per_minute",
            "tokens_per_minute",
            "timeout_seconds",
            "max_retries",
            "server_renames_models",
            "stall_timeout_seconds",
            "quota_window_seconds",
            "mode",
            "batch_completion_window",
            "batch_input_per_1k",
            "batch_max_enqueued_tokens",
            "batch_poll_seconds",
            "model_dir",
            "threads",
            "batch_size",
        ],
    ),
    (
        "output",
        &[
            "kind",
            "path",
            "include_text",
            "row_group_bytes",
            "url",
            "table",
        ],
    ),
    ("pipeline", &["channel_capacity", "progress_seconds"]),
    ("budget", &["max_cost"]),
];

/// A TOML value of any type, with the ends of each range.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        3 => (1i64..200).prop_map(Value::Integer),
        2 => (0.01f64..100.0).prop_map(Value::Float),
        1 => any::<i64>().prop_map(Value::Integer),
        1 => prop_oneof![
            Just(0i64),
            Just(-1),
            Just(1),
            Just(i64::MAX),
            Just(i64::MIN),
            Just(65_536),
            Just(65_537)
        ]
        .prop_map(Value::Integer),
        1 => prop_oneof![
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::NAN),
            Just(0.0),
            Just(-0.5),
            Just(1e300),
            Just(0.001)
        ]
        .prop_map(Value::Float),
        1 => any::<bool>().prop_map(Value::Boolean),
        1 => prop_oneof![
            Just(String::new()),
            Just("auto".to_string()),
            Just("api".to_string()),
            Just("local".to_string()),
            Just("files".to_string()),
            Just("jsonl".to_string()),
            Just("parquet".to_string()),
            Just("pgvector".to_string()),
            Just("batch".to_string()),
            Just("24h".to_string()),
            Just("http://127.0.0.1:1".to_string()),
            "[ -~]{0,16}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z]{1,6}", inner), 0..3)
                .prop_map(|kv| Value::Table(kv.into_iter().collect())),
        ]
    })
}

/// A section, the ones with more keys more often.
fn section() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        2 => Just(1),
        4 => Just(2),
        5 => Just(3),
        2 => Just(4),
        2 => Just(5),
        1 => Just(6),
    ]
}

/// A job that reads, for an api backend or the local model.
fn base(api: bool) -> toml::Table {
    let backend = if api {
        // A variable every environment has stands for the key.
        r#"kind = "api"
base_url = "http://127.0.0.1:1"
model = "svc-embed-1"
api_key_env = "PATH""#
    } else {
        r#"kind = "local""#
    };
    let text = format!(
        "[source]\nkind = \"files\"\npaths = [\"docs\"]\n[backend]\n{backend}\n[output]\npath = \"out/x.parquet\"\n"
    );
    toml::from_str(&text).unwrap_or_default()
}

/// A job file: a job that reads, or nothing, with some keys of some
/// sections set to values of any type.
fn job_text() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
        prop::collection::vec((section(), 0usize..32, value()), 0..5),
    )
        .prop_map(|(start, keys)| {
            let mut root = start.map(base).unwrap_or_default();
            for (section, key, value) in keys {
                let (name, keys) = SECTIONS[section];
                let key = keys[key % keys.len()].to_string();
                if name.is_empty() {
                    root.insert(key, value);
                } else if let Value::Table(table) = root
                    .entry(name.to_string())
                    .or_insert_with(|| Value::Table(toml::Table::new()))
                {
                    table.insert(key, value);
                }
            }
            toml::to_string(&root).unwrap_or_default()
        })
}

/// `--set` assignments: a known key or not, a value that is TOML or not.
fn overrides() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        (0..SECTIONS.len(), 0usize..32, "[ -~]{0,12}").prop_map(|(section, key, value)| {
            let (name, keys) = SECTIONS[section];
            let key = keys[key % keys.len()];
            if name.is_empty() {
                format!("{key}={value}")
            } else {
                format!("{name}.{key}={value}")
            }
        }),
        0..3,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn no_job_file_panics_and_every_problem_says_what_is_wrong(
        text in job_text(),
        sets in overrides(),
    ) {
        match parse(&text, "job", &sets) {
            Ok(job) => {
                let chunking = &job.chunking;
                prop_assert!(chunking.max_tokens >= 1, "{text}");
                prop_assert!(chunking.overlap_tokens < chunking.max_tokens, "{text}");
                prop_assert!(job.pipeline.channel_capacity >= 1, "{text}");
                prop_assert!(job.pipeline.progress_seconds.is_finite(), "{text}");
            }
            Err(problems) => {
                prop_assert!(!problems.is_empty(), "{text}");
                for problem in &problems {
                    prop_assert!(problem.len() > 8, "a problem that says little: {problem:?} in {text}");
                }
            }
        }
    }
}
