use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    new_null_array, ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use super::*;
use crate::contract::{output_schema, FINGERPRINT_KEY, JOB_KEY, SCHEMA_VERSION, SHARD_KEY};
use crate::state::StateLocation;

/// An output file to write: the output's columns, rows that pass every
/// check, and the keys a run records, each of which a test may spoil.
struct Output {
    fields: Vec<Field>,
    ids: Vec<Option<String>>,
    vectors: Vec<Option<Vec<Option<f32>>>>,
    keys: BTreeMap<String, String>,
}

impl Output {
    fn new(rows: usize, dimensions: usize) -> Output {
        let schema = output_schema(dimensions, false);
        let keys = [
            ("embedjob.schema_version", SCHEMA_VERSION.to_string()),
            ("embedjob.version", "0.0.0".to_string()),
            ("embedjob.model", "test-embed".to_string()),
            ("embedjob.dimensions", dimensions.to_string()),
            ("embedjob.backend", "api".to_string()),
            ("embedjob.usage.prompt_tokens", (rows * 10).to_string()),
            ("embedjob.usage.total_tokens", (rows * 10).to_string()),
            ("embedjob.requests", "2".to_string()),
            ("embedjob.cost", "0.25".to_string()),
            (JOB_KEY, "docs".to_string()),
            (FINGERPRINT_KEY, "abc".to_string()),
        ];
        Output {
            fields: schema.fields().iter().map(|f| f.as_ref().clone()).collect(),
            ids: (0..rows).map(|i| Some(format!("doc#{i}"))).collect(),
            vectors: (0..rows)
                .map(|i| {
                    Some(
                        (0..dimensions)
                            .map(|j| Some(i as f32 + j as f32 * 0.5 + 0.25))
                            .collect(),
                    )
                })
                .collect(),
            keys: keys.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    fn key(mut self, key: &str, value: &str) -> Output {
        self.keys.insert(key.to_string(), value.to_string());
        self
    }

    fn without_key(mut self, key: &str) -> Output {
        self.keys.remove(key);
        self
    }

    fn ids(mut self, ids: &[&str]) -> Output {
        self.ids = ids.iter().map(|id| Some((*id).to_string())).collect();
        self
    }

    fn nullable(mut self, column: &str) -> Output {
        for field in &mut self.fields {
            if field.name() == column {
                *field = field.clone().with_nullable(true);
            }
        }
        self
    }

    fn column_type(mut self, column: &str, data_type: DataType) -> Output {
        for field in &mut self.fields {
            if field.name() == column {
                *field = Field::new(column, data_type.clone(), true);
            }
        }
        self
    }

    fn column(&self, field: &Field) -> ArrayRef {
        let rows = self.ids.len();
        match (field.name().as_str(), field.data_type()) {
            ("id", DataType::Utf8) => Arc::new(StringArray::from(self.ids.clone())),
            ("embedding", DataType::FixedSizeList(item, size)) => {
                let length = usize::try_from(*size).unwrap();
                let values: Float32Array = self
                    .vectors
                    .iter()
                    .flat_map(|v| v.clone().unwrap_or_else(|| vec![Some(0.0); length]))
                    .collect();
                let valid = NullBuffer::from(
                    self.vectors
                        .iter()
                        .map(Option::is_some)
                        .collect::<Vec<bool>>(),
                );
                Arc::new(
                    FixedSizeListArray::try_new(
                        item.clone(),
                        *size,
                        Arc::new(values),
                        Some(valid).filter(|n| n.null_count() > 0),
                    )
                    .unwrap(),
                )
            }
            (_, data_type) => new_null_array(data_type, rows),
        }
    }

    fn write(&self, path: &Path) {
        let schema = Arc::new(Schema::new(self.fields.clone()));
        let columns = self.fields.iter().map(|f| self.column(f)).collect();
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let keys = self
            .keys
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        let properties = WriterProperties::builder()
            .set_key_value_metadata(Some(keys))
            .build();
        let mut writer =
            ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
}

/// The report on `path`, with every problem of its files in one list.
fn inspected(path: &Path) -> (Report, Vec<Problem>) {
    let report = inspect(path).unwrap();
    let mut problems = report.problems.clone();
    for file in &report.files {
        problems.extend(file.problems.iter().cloned());
    }
    (report, problems)
}

/// The only problem found, which must be of `check`.
fn only_problem(path: &Path, check: Check) -> Problem {
    let (report, problems) = inspected(path);
    assert!(!report.ok);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].check, check, "{problems:#?}");
    problems[0].clone()
}

#[test]
fn a_sound_file_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    Output::new(3, 4).write(&path);
    let (report, problems) = inspected(&path);
    assert!(report.ok, "{problems:#?}");
    assert!(problems.is_empty());
    let file = &report.files[0];
    assert_eq!(file.rows, 3);
    assert_eq!(file.row_groups, 1);
    assert_eq!(file.model.as_deref(), Some("test-embed"));
    assert_eq!(file.dimensions, Some(4));
    assert_eq!(file.job.as_deref(), Some("docs"));
    assert_eq!(file.prompt_tokens, Some(30));
    assert_eq!(file.cost, Some(0.25));
    assert!(!file.include_text);
    assert!(file.metadata_columns.is_empty());
    assert_eq!(report.datasets.len(), 1);
    assert_eq!(report.totals.rows, 3);
    assert_eq!(first_problem(&report), None);
}

#[test]
fn a_file_that_is_not_parquet_is_unreadable_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    std::fs::write(&path, b"these bytes are not a Parquet file").unwrap();
    let problem = only_problem(&path, Check::Readable);
    assert!(
        problem.message.contains(&path.display().to_string()),
        "{problem:?}"
    );
    let report = inspect(&path).unwrap();
    assert_eq!(report.files[0].rows, 0);
    let first = first_problem(&report).unwrap();
    assert!(
        first.starts_with(&format!("{}: readable: ", path.display())),
        "{first}"
    );
}

#[test]
fn missing_and_malformed_keys_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    Output::new(2, 4).without_key("embedjob.model").write(&path);
    let problem = only_problem(&path, Check::Metadata);
    assert_eq!(problem.message, "missing metadata keys: embedjob.model");

    Output::new(2, 4)
        .key("embedjob.requests", "many")
        .write(&path);
    let problem = only_problem(&path, Check::Metadata);
    assert_eq!(
        problem.message,
        "embedjob.requests is \"many\", not a whole number"
    );

    Output::new(2, 4).key("embedjob.cost", "-1").write(&path);
    let problem = only_problem(&path, Check::Metadata);
    assert_eq!(problem.message, "embedjob.cost is \"-1\", not an amount");

    Output::new(2, 4).key(SHARD_KEY, "5/4").write(&path);
    let problem = only_problem(&path, Check::Metadata);
    assert!(problem.message.starts_with(SHARD_KEY), "{problem:?}");

    Output::new(2, 4)
        .key("embedjob.schema_version", "99")
        .write(&path);
    let problem = only_problem(&path, Check::Metadata);
    assert!(
        problem
            .message
            .starts_with("embedjob.schema_version is \"99\""),
        "{problem:?}"
    );
}

#[test]
fn columns_of_another_type_or_missing_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    Output::new(2, 4)
        .column_type("chunk_index", DataType::Utf8)
        .write(&path);
    let problem = only_problem(&path, Check::Schema);
    assert_eq!(
        problem.message,
        "column \"chunk_index\" is Utf8, not UInt32"
    );

    let mut output = Output::new(2, 4);
    output.fields.retain(|f| f.name() != "source");
    output.write(&path);
    let problem = only_problem(&path, Check::Schema);
    assert_eq!(problem.message, "no column \"source\"");

    // A column the output does not know is a metadata column, not a problem.
    let mut output = Output::new(2, 4);
    output
        .fields
        .insert(1, Field::new("lang", DataType::Utf8, true));
    output.write(&path);
    let (report, problems) = inspected(&path);
    assert!(report.ok, "{problems:#?}");
    assert_eq!(report.files[0].metadata_columns, ["lang (Utf8)"]);
}

#[test]
fn vectors_of_another_length_than_declared_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    Output::new(2, 4)
        .key("embedjob.dimensions", "8")
        .write(&path);
    let problem = only_problem(&path, Check::Dimensions);
    assert_eq!(
        problem.message,
        "embedjob.dimensions is 8 but the embedding column holds 4-dimensional vectors"
    );

    Output::new(2, 4)
        .key("embedjob.model", "svc-embed-1")
        .write(&path);
    let problem = only_problem(&path, Check::Dimensions);
    assert_eq!(
        problem.message,
        "model svc-embed-1 makes 1024-dimensional vectors, the file holds 4"
    );
}

#[test]
fn a_repeated_id_names_its_row_and_where_it_was_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    Output::new(3, 2).ids(&["a", "b", "a"]).write(&path);
    let problem = only_problem(&path, Check::UniqueIds);
    assert_eq!(problem.row, Some(3));
    assert_eq!(problem.id.as_deref(), Some("a"));
    assert_eq!(
        problem.message,
        "id \"a\" repeats (first seen earlier in this file)"
    );
    let first = first_problem(&inspect(&path).unwrap()).unwrap();
    assert_eq!(
        first,
        format!(
            "{} row 3: unique_ids: id \"a\" repeats (first seen earlier in this file)",
            path.display()
        )
    );

    // Across the files of a directory, the other file is named.
    let dir = tempfile::tempdir().unwrap();
    let first_file = dir.path().join("a.parquet");
    Output::new(2, 2).ids(&["x", "y"]).write(&first_file);
    Output::new(2, 2)
        .ids(&["z", "y"])
        .write(&dir.path().join("b.parquet"));
    let problem = only_problem(dir.path(), Check::UniqueIds);
    assert_eq!(problem.row, Some(2));
    assert_eq!(
        problem.message,
        format!("id \"y\" repeats (first seen in {})", first_file.display())
    );
}

#[test]
fn a_null_id_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    let mut output = Output::new(2, 2).nullable("id");
    output.ids[1] = None;
    output.write(&path);
    let problem = only_problem(&path, Check::UniqueIds);
    assert_eq!(problem.row, Some(2));
    assert_eq!(problem.message, "the id is null");
}

#[test]
fn unusable_vectors_name_their_row_and_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    let mut output = Output::new(4, 3).nullable("embedding");
    output.vectors[0] = Some(vec![Some(0.5), Some(f32::NAN), Some(1.0)]);
    output.vectors[1] = Some(vec![Some(0.0); 3]);
    output.vectors[2] = None;
    output.vectors[3] = Some(vec![Some(1.0), Some(2.0), None]);
    output.write(&path);
    let (report, problems) = inspected(&path);
    assert!(!report.ok);
    let found: Vec<(Check, Option<u64>, Option<&str>, &str)> = problems
        .iter()
        .map(|p| (p.check, p.row, p.id.as_deref(), p.message.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (
                Check::Finite,
                Some(1),
                Some("doc#0"),
                "value 1 of the vector is NaN"
            ),
            (
                Check::NotAllZero,
                Some(2),
                Some("doc#1"),
                "the vector is all zeros"
            ),
            (
                Check::VectorLength,
                Some(3),
                Some("doc#2"),
                "the embedding is null"
            ),
            (
                Check::VectorLength,
                Some(4),
                Some("doc#3"),
                "value 2 of the vector is null"
            ),
        ]
    );
    let text = text(&report);
    assert!(
        text.contains("    - finite (row 1, id \"doc#0\"): value 1 of the vector is NaN\n"),
        "{text}"
    );
    assert!(text.contains("  checks      4 problems\n"), "{text}");
}

#[test]
fn problems_past_the_listed_ones_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    let rows = LISTED_PER_CHECK as usize + 5;
    let mut output = Output::new(rows, 2);
    output.vectors = vec![Some(vec![Some(0.0); 2]); rows];
    output.write(&path);
    let report = inspect(&path).unwrap();
    let file = &report.files[0];
    assert_eq!(file.problem_count, rows as u64);
    assert_eq!(file.problems.len() as u64, LISTED_PER_CHECK);
    assert_eq!(report.totals.problem_count, rows as u64);
    assert!(text(&report).contains("    … and 5 more\n"));
}

#[test]
fn a_directory_sums_rows_usage_and_cost_over_its_files() {
    let dir = tempfile::tempdir().unwrap();
    Output::new(2, 2)
        .ids(&["a", "b"])
        .write(&dir.path().join("1.parquet"));
    Output::new(3, 2)
        .ids(&["c", "d", "e"])
        .key("embedjob.cost", "0.5")
        .write(&dir.path().join("2.parquet"));
    let (report, problems) = inspected(dir.path());
    assert!(report.ok, "{problems:#?}");
    let t = &report.totals;
    assert_eq!(t.files, 2);
    assert_eq!(t.rows, 5);
    assert_eq!(t.prompt_tokens, 50);
    assert_eq!(t.total_tokens, 50);
    assert_eq!(t.requests, 4);
    assert_eq!(t.cost, Some(0.75));
    assert!(text(&report).ends_with(
        "total: 2 files, 5 rows, 50 prompt tokens, 4 requests, cost 0.750000; all checks passed\n"
    ));

    // A file without a cost leaves the sum unknown.
    Output::new(1, 2)
        .ids(&["f"])
        .without_key("embedjob.cost")
        .write(&dir.path().join("3.parquet"));
    let report = inspect(dir.path()).unwrap();
    assert!(report.ok);
    assert_eq!(report.totals.rows, 6);
    assert_eq!(report.totals.cost, None);
}

#[test]
fn a_directory_of_two_configurations_is_not_one_dataset() {
    let dir = tempfile::tempdir().unwrap();
    Output::new(1, 2)
        .ids(&["a"])
        .write(&dir.path().join("old.parquet"));
    // The same id under another configuration is another dataset's row.
    Output::new(1, 2)
        .ids(&["a"])
        .key(FINGERPRINT_KEY, "other")
        .write(&dir.path().join("new.parquet"));
    let problem = only_problem(dir.path(), Check::OneDataset);
    assert!(
        problem.message.starts_with(&format!(
            "{} mixes 2 datasets, made by different jobs or configurations: ",
            dir.path().display()
        )),
        "{problem:?}"
    );
    assert!(problem.message.contains("new.parquet"), "{problem:?}");
    assert!(problem.message.contains("old.parquet"), "{problem:?}");
    let report = inspect(dir.path()).unwrap();
    assert_eq!(report.datasets.len(), 2);
    assert!(first_problem(&report).unwrap().starts_with("one_dataset: "));
}

#[test]
fn a_summary_beside_the_file_must_count_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    Output::new(3, 2).write(&path);
    let summary = StateLocation::beside(&path).summary();
    std::fs::write(&summary, r#"{"written": 3}"#).unwrap();
    let (report, problems) = inspected(&path);
    assert!(report.ok, "{problems:#?}");

    std::fs::write(&summary, r#"{"written": 5}"#).unwrap();
    let problem = only_problem(&path, Check::RowCount);
    assert_eq!(
        problem.message,
        format!(
            "3 rows in the file but the run's summary ({}) says 5 were written",
            summary.display()
        )
    );
}

fn shard_file(dir: &Path, index: u32, count: u32, id: &str) {
    let shard = Shard { index, count };
    Output::new(1, 2)
        .ids(&[id])
        .key(SHARD_KEY, &shard.to_string())
        .write(&dir.join(shard.file_name()));
}

#[test]
fn every_shard_once_is_one_dataset() {
    let dir = tempfile::tempdir().unwrap();
    shard_file(dir.path(), 0, 2, "a");
    shard_file(dir.path(), 1, 2, "b");
    let (report, problems) = inspected(dir.path());
    assert!(report.ok, "{problems:#?}");
    assert_eq!(report.files[0].shard, Some(Shard { index: 0, count: 2 }));
    assert!(text(&report).contains("  job         docs, shard 1/2\n"));
}

#[test]
fn a_missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    shard_file(dir.path(), 0, 3, "a");
    shard_file(dir.path(), 2, 3, "c");
    let problem = only_problem(dir.path(), Check::Shards);
    let missing = Shard { index: 1, count: 3 }.file_name();
    assert!(
        problem
            .message
            .starts_with(&format!("1 of 3 shards is missing: {missing}")),
        "{problem:?}"
    );
}

#[test]
fn shards_split_two_ways_are_named() {
    let dir = tempfile::tempdir().unwrap();
    shard_file(dir.path(), 0, 1, "a");
    shard_file(dir.path(), 0, 2, "b");
    shard_file(dir.path(), 1, 2, "c");
    let problem = only_problem(dir.path(), Check::Shards);
    assert!(
        problem
            .message
            .starts_with("the files were split different ways"),
        "{problem:?}"
    );
    assert!(
        problem
            .message
            .contains(&Shard { index: 0, count: 1 }.file_name()),
        "{problem:?}"
    );
}

#[test]
fn a_path_that_cannot_be_inspected_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing.parquet");
    let error = inspect(&missing).unwrap_err();
    assert!(matches!(error, InspectError::NotFound { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        format!("{}: no such file or directory", missing.display())
    );
    assert_eq!(error.exit(), Exit::Usage);

    let error = inspect(dir.path()).unwrap_err();
    assert!(matches!(error, InspectError::NoFiles { .. }), "{error}");
    assert_eq!(error.exit(), Exit::Usage);
}

#[test]
fn the_human_form_shows_what_the_footer_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    Output::new(2, 4).write(&path);
    let text = text(&inspect(&path).unwrap());
    let bytes = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        text,
        format!(
            "{}\n  rows        2 (1 row group, {bytes} bytes)\n  job         docs\n  \
             model       test-embed (api backend), 4 dimensions\n  \
             schema      version {SCHEMA_VERSION}, text not included, written by embedjob 0.0.0\n  \
             usage       20 prompt tokens, 20 total, 2 requests\n  cost        0.250000\n  \
             checks      all checks passed\n",
            path.display()
        )
    );
}
