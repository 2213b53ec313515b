//! Checks an output after the fact: what its metadata says about the run,
//! and whether every row still holds a usable vector.
//!
//! A file is read a record batch at a time, decoding only `id` and
//! `embedding`, so memory is bounded by a batch plus 16 bytes per id (the
//! hashes kept to find repeated ids). A directory's `*.parquet` files are
//! inspected in name order as one dataset, with ids unique across all of
//! them. Files of different jobs or configurations (another model, other
//! chunks) are not one dataset: that is reported once, and ids are then
//! checked within each dataset only.
//!
//! Failed checks are reported, not raised: a damaged file is a finding, and
//! the other files of a directory are still checked. Only a path that cannot
//! be inspected at all is an [`InspectError`].

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, FixedSizeListArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Schema};
use parquet::arrow::ProjectionMask;
use serde::Serialize;

mod shards;

use crate::contract::{
    output_schema, BACKEND_KEY, COST_KEY, DIMENSIONS_KEY, FINGERPRINT_KEY, JOB_KEY, MODEL_KEY,
    PROMPT_TOKENS_KEY, REQUESTS_KEY, SCHEMA_VERSION, SCHEMA_VERSION_KEY, SHARD_KEY,
    TOTAL_TOKENS_KEY, VERSION_KEY,
};
use crate::display::counted;
use crate::exit::Exit;
use crate::job::Shard;
use crate::parquet_io::{
    guard as parquet_guard, key_values, list_parquet_files, open_reader as parquet_reader,
    FileError,
};
use crate::state::StateLocation;
use crate::types::id_key128;
use crate::validate::known_model_dimensions;

/// Rows decoded at a time.
const BATCH_ROWS: usize = 1024;

/// Problems listed per check and file; the rest are counted.
pub const LISTED_PER_CHECK: u64 = 10;

/// A path that cannot be inspected at all.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the directory holds no *.parquet files")]
    NoFiles { path: PathBuf },
    #[error(transparent)]
    File(#[from] FileError),
}

impl InspectError {
    pub fn exit(&self) -> Exit {
        match self {
            InspectError::NotFound { .. } | InspectError::NoFiles { .. } => Exit::Usage,
            InspectError::Io { .. } | InspectError::File(_) => Exit::Failed,
        }
    }
}

/// What each check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The file opens and every record batch decodes.
    Readable,
    /// The `embedjob.*` keys are present and parse.
    Metadata,
    /// The expected columns, with the expected types.
    Schema,
    /// `embedjob.dimensions`, the `embedding` column's length and the model agree.
    Dimensions,
    /// The rows read agree with the footer and with the run's summary.
    RowCount,
    /// Every row has an id, and no id repeats.
    UniqueIds,
    /// Every row has a vector of the right length, without null values.
    VectorLength,
    /// Every value is finite.
    Finite,
    /// No vector is all zeros.
    NotAllZero,
    /// A directory's files are one dataset: one job, one configuration.
    OneDataset,
    /// The shards of a split job are all there, each once, split one way.
    Shards,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::Readable => "readable",
            Check::Metadata => "metadata",
            Check::Schema => "schema",
            Check::Dimensions => "dimensions",
            Check::RowCount => "row_count",
            Check::UniqueIds => "unique_ids",
            Check::VectorLength => "vector_length",
            Check::Finite => "finite",
            Check::NotAllZero => "not_all_zero",
            Check::OneDataset => "one_dataset",
            Check::Shards => "shards",
        }
    }
}

/// One failed check, with where it failed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub check: Check,
    /// 1-based row within the file.
    pub row: Option<u64>,
    pub id: Option<String>,
    pub message: String,
}

/// What one file holds and which checks it failed.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct FileReport {
    pub path: PathBuf,
    pub bytes: u64,
    /// Rows read; the footer's count when the file could not be read through.
    pub rows: u64,
    pub row_groups: u64,
    pub schema_version: Option<String>,
    /// The embedjob version that wrote the file.
    pub written_by: Option<String>,
    pub model: Option<String>,
    pub backend: Option<String>,
    pub dimensions: Option<usize>,
    pub prompt_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
    pub requests: Option<u64>,
    pub cost: Option<f64>,
    pub include_text: bool,
    /// The job that wrote the file (`embedjob.job`), when it says.
    pub job: Option<String>,
    /// The shard of the job the file holds (`embedjob.shard`, `I/N`).
    pub shard: Option<Shard>,
    /// Columns besides the output's own (`source.metadata_fields`), with their types.
    pub metadata_columns: Vec<String>,
    /// Failed checks found, listed or not.
    pub problem_count: u64,
    /// The first [`LISTED_PER_CHECK`] problems of each check.
    pub problems: Vec<Problem>,
    #[serde(skip)]
    listed: BTreeMap<Check, u64>,
}

impl FileReport {
    pub fn ok(&self) -> bool {
        self.problem_count == 0
    }

    fn problem(&mut self, check: Check, row: Option<u64>, id: Option<&str>, message: String) {
        self.problem_count += 1;
        let listed = self.listed.entry(check).or_insert(0);
        if *listed < LISTED_PER_CHECK {
            *listed += 1;
            self.problems.push(Problem {
                check,
                row,
                id: id.map(str::to_string),
                message,
            });
        }
    }
}

/// Sums over the files inspected.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Totals {
    pub files: u64,
    pub rows: u64,
    pub prompt_tokens: u64,
    pub total_tokens: u64,
    pub requests: u64,
    /// The sum of the files' costs, when every file records one.
    pub cost: Option<f64>,
    pub problem_count: u64,
}

/// The inspection of a file or a directory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub path: PathBuf,
    pub ok: bool,
    pub files: Vec<FileReport>,
    /// The datasets the files belong to: one, unless a directory mixes them.
    pub datasets: Vec<Dataset>,
    /// Failed checks across files: a directory that is not one dataset.
    pub problems: Vec<Problem>,
    pub totals: Totals,
}

/// Files written by one job under one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dataset {
    pub job: Option<String>,
    pub model: Option<String>,
    pub dimensions: Option<String>,
    pub files: Vec<PathBuf>,
    /// What makes it one: the job and the fingerprint (or, for files
    /// without one, the model and dimensions).
    #[serde(skip)]
    key: DatasetKey,
}

type DatasetKey = (Option<String>, Option<String>);

impl Dataset {
    fn describe(&self) -> String {
        let job = self
            .job
            .as_ref()
            .map_or_else(|| "job unknown".to_string(), |j| format!("job {j:?}"));
        let files: Vec<String> = self
            .files
            .iter()
            .map(|f| {
                f.file_name().map_or_else(
                    || f.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                )
            })
            .collect();
        format!(
            "{job}, model {}, {} dimensions: {}",
            self.model.as_deref().unwrap_or("?"),
            self.dimensions.as_deref().unwrap_or("?"),
            files.join(", ")
        )
    }
}

/// Sorts `files` into datasets by the job and configuration their footers
/// record. A file whose footer cannot be read joins the first dataset (its
/// reading problem is reported with it).
fn datasets(files: &[PathBuf]) -> (Vec<Dataset>, Vec<usize>) {
    let mut datasets: Vec<Dataset> = Vec::new();
    let mut of_file = Vec::with_capacity(files.len());
    for file in files {
        let Ok(builder) = parquet_reader(file) else {
            of_file.push(usize::MAX);
            continue;
        };
        let kv = key_values(builder.metadata());
        let job = kv.get(JOB_KEY).cloned();
        let model = kv.get(MODEL_KEY).cloned();
        let dimensions = kv.get(DIMENSIONS_KEY).cloned();
        let configuration = kv.get(FINGERPRINT_KEY).cloned().or_else(|| {
            Some(format!(
                "{}/{}",
                model.as_deref().unwrap_or("?"),
                dimensions.as_deref().unwrap_or("?")
            ))
        });
        let key = (job.clone(), configuration);
        let index = match datasets.iter().position(|d| d.key == key) {
            Some(index) => index,
            None => {
                datasets.push(Dataset {
                    job,
                    model,
                    dimensions,
                    files: Vec::new(),
                    key,
                });
                datasets.len() - 1
            }
        };
        datasets[index].files.push(file.clone());
        of_file.push(index);
    }
    if let Some(first) = datasets.first_mut() {
        let unread = files
            .iter()
            .zip(&of_file)
            .filter(|(_, i)| **i == usize::MAX);
        first.files.extend(unread.map(|(file, _)| file.clone()));
    }
    let of_file = of_file
        .into_iter()
        .map(|i| if i == usize::MAX { 0 } else { i })
        .collect();
    (datasets, of_file)
}

/// Inspects an output file, or every `*.parquet` file of a directory (not
/// recursively, in name order). Reading blocks: call it off the async runtime.
///
/// # Errors
///
/// The path does not exist, cannot be listed, or is a directory without
/// Parquet files. Damaged files are findings in the report, not errors.
pub fn inspect(path: &Path) -> Result<Report, InspectError> {
    let files = list_files(path)?;
    let (datasets, of_file) = datasets(&files);
    let mut ids: Vec<Ids> = (0..datasets.len().max(1)).map(|_| Ids::default()).collect();
    let mut reports = Vec::with_capacity(files.len());
    for (index, file) in files.iter().enumerate() {
        reports.push(inspect_file(file, index, &files, &mut ids[of_file[index]]));
    }
    let mut problems = shards::problems(&datasets, &reports);
    if datasets.len() > 1 {
        let each: Vec<String> = datasets.iter().map(Dataset::describe).collect();
        problems.push(Problem {
            check: Check::OneDataset,
            row: None,
            id: None,
            message: format!(
                "{} mixes {} datasets, made by different jobs or configurations: {}; \
                 ids were checked within each; inspect each file on its own, or keep each \
                 job's output in a directory of its own",
                path.display(),
                datasets.len(),
                each.join("; ")
            ),
        });
    }
    let mut totals = Totals {
        files: reports.len() as u64,
        cost: Some(0.0),
        ..Totals::default()
    };
    for r in &reports {
        totals.rows += r.rows;
        totals.prompt_tokens += r.prompt_tokens.unwrap_or(0);
        totals.total_tokens += r.total_tokens.unwrap_or(0);
        totals.requests += r.requests.unwrap_or(0);
        totals.cost = totals.cost.zip(r.cost).map(|(a, b)| a + b);
        totals.problem_count += r.problem_count;
    }
    problems.sort_by_key(|p| p.check == Check::Shards);
    totals.problem_count += problems.len() as u64;
    Ok(Report {
        path: path.to_path_buf(),
        ok: totals.problem_count == 0,
        files: reports,
        datasets,
        problems,
        totals,
    })
}

fn list_files(path: &Path) -> Result<Vec<PathBuf>, InspectError> {
    let metadata = std::fs::metadata(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            InspectError::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            InspectError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    if !metadata.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let files = list_parquet_files(path)?;
    if files.is_empty() {
        return Err(InspectError::NoFiles {
            path: path.to_path_buf(),
        });
    }
    Ok(files)
}

/// Ids seen so far, as 128-bit hashes with the file they were first seen in.
#[derive(Default)]
struct Ids {
    seen: HashMap<u128, u32>,
}

fn inspect_file(path: &Path, index: usize, files: &[PathBuf], ids: &mut Ids) -> FileReport {
    let mut report = FileReport {
        path: path.to_path_buf(),
        bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
        ..FileReport::default()
    };
    let unreadable = |report: &mut FileReport, error: FileError| {
        report.problem(Check::Readable, None, None, error.to_string());
    };
    let builder = match parquet_reader(path) {
        Ok(builder) => builder,
        Err(error) => {
            unreadable(&mut report, error);
            return report;
        }
    };
    let footer_rows = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    report.row_groups = builder.metadata().num_row_groups() as u64;
    let key_values = key_values(builder.metadata());
    read_metadata(&mut report, &key_values);
    let schema = builder.schema().clone();
    let length = check_schema(&mut report, &schema);

    let mut roots = Vec::new();
    let id_column = schema
        .index_of("id")
        .ok()
        .filter(|&i| schema.field(i).data_type() == &DataType::Utf8);
    let embedding_column = schema
        .index_of("embedding")
        .ok()
        .filter(|_| length.is_some());
    roots.extend(id_column);
    roots.extend(embedding_column);
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = match parquet_guard(path, || {
        builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
    }) {
        Ok(Ok(reader)) => reader,
        Ok(Err(error)) => {
            let message = format!("{}: not a readable Parquet file: {error}", path.display());
            report.problem(Check::Readable, None, None, message);
            report.rows = footer_rows;
            return report;
        }
        Err(error) => {
            unreadable(&mut report, error);
            report.rows = footer_rows;
            return report;
        }
    };
    let file_index = u32::try_from(index).unwrap_or(u32::MAX);
    let mut reader = reader;
    let mut rows = 0u64;
    loop {
        let next = match parquet_guard(path, || reader.next()) {
            Ok(next) => next,
            Err(error) => {
                unreadable(&mut report, error);
                report.rows = footer_rows;
                return report;
            }
        };
        let batch = match next {
            None => break,
            Some(Ok(batch)) => batch,
            Some(Err(error)) => {
                let message = format!(
                    "{}: not a readable Parquet file: after row {rows}: {error}",
                    path.display()
                );
                report.problem(Check::Readable, Some(rows + 1), None, message);
                report.rows = footer_rows;
                return report;
            }
        };
        check_rows(&mut report, &batch, rows, length, file_index, files, ids);
        rows += batch.num_rows() as u64;
    }
    report.rows = rows;
    if rows != footer_rows {
        report.problem(
            Check::RowCount,
            None,
            None,
            format!("{rows} rows were read but the footer says {footer_rows}"),
        );
    }
    check_summary(&mut report, path, rows);
    report
}

/// Reads the `embedjob.*` keys; each one missing or malformed is a problem.
fn read_metadata(report: &mut FileReport, kv: &BTreeMap<String, String>) {
    let mut missing = Vec::new();
    let mut text = |key: &str| {
        let value = kv.get(key).cloned();
        if value.is_none() {
            missing.push(key.to_string());
        }
        value
    };
    report.schema_version = text(SCHEMA_VERSION_KEY);
    report.written_by = text(VERSION_KEY);
    report.model = text(MODEL_KEY);
    report.backend = text(BACKEND_KEY);
    report.job = kv.get(JOB_KEY).cloned();
    if let Some(shard) = kv.get(SHARD_KEY) {
        match crate::job::shard::parse(shard, |_| None) {
            Ok(shard) => report.shard = Some(shard),
            Err(_) => report.problem(
                Check::Metadata,
                None,
                None,
                format!("{SHARD_KEY} is {shard:?}, not a shard such as 1/4"),
            ),
        }
    }
    let dimensions = text(DIMENSIONS_KEY);
    let prompt_tokens = text(PROMPT_TOKENS_KEY);
    let total_tokens = text(TOTAL_TOKENS_KEY);
    let requests = text(REQUESTS_KEY);
    if !missing.is_empty() {
        let message = format!("missing metadata keys: {}", missing.join(", "));
        report.problem(Check::Metadata, None, None, message);
    }
    let mut number = |key: &str, value: Option<String>| -> Option<u64> {
        let value = value?;
        match value.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                let message = format!("{key} is {value:?}, not a whole number");
                report.problem(Check::Metadata, None, None, message);
                None
            }
        }
    };
    let dimensions = number(DIMENSIONS_KEY, dimensions);
    let prompt_tokens = number(PROMPT_TOKENS_KEY, prompt_tokens);
    let total_tokens = number(TOTAL_TOKENS_KEY, total_tokens);
    let requests = number(REQUESTS_KEY, requests);
    report.dimensions = dimensions.and_then(|d| usize::try_from(d).ok());
    report.prompt_tokens = prompt_tokens;
    report.total_tokens = total_tokens;
    report.requests = requests;
    if let Some(cost) = kv.get(COST_KEY) {
        match cost.trim().parse::<f64>() {
            Ok(c) if c.is_finite() && c >= 0.0 => report.cost = Some(c),
            _ => report.problem(
                Check::Metadata,
                None,
                None,
                format!("{COST_KEY} is {cost:?}, not an amount"),
            ),
        }
    }
    if let Some(version) = report.schema_version.clone() {
        if version != SCHEMA_VERSION {
            report.problem(
                Check::Metadata,
                None,
                None,
                format!(
                    "{SCHEMA_VERSION_KEY} is {version:?}; this version of embedjob checks {SCHEMA_VERSION:?}"
                ),
            );
        }
    }
}

/// Checks the columns against the output schema; returns the vector length
/// rows are checked against, or `None` when the vectors cannot be checked.
fn check_schema(report: &mut FileReport, schema: &Schema) -> Option<usize> {
    report.include_text = schema.index_of("text").is_ok();
    let embedding = schema.field_with_name("embedding").ok();
    let length = match embedding.map(|f| f.data_type()) {
        Some(DataType::FixedSizeList(item, n)) if item.data_type() == &DataType::Float32 => {
            usize::try_from(*n).ok()
        }
        Some(other) => {
            report.problem(
                Check::Schema,
                None,
                None,
                format!("column \"embedding\" is {other}, not FixedSizeList<Float32>"),
            );
            None
        }
        None => {
            report.problem(
                Check::Schema,
                None,
                None,
                "no column \"embedding\"".to_string(),
            );
            None
        }
    };
    let expected = output_schema(length.unwrap_or(1), report.include_text);
    report.metadata_columns = schema
        .fields()
        .iter()
        .filter(|f| expected.field_with_name(f.name()).is_err())
        .map(|f| format!("{} ({})", f.name(), f.data_type()))
        .collect();
    for field in expected.fields() {
        if field.name() == "embedding" {
            continue;
        }
        match schema.field_with_name(field.name()) {
            Ok(found) if found.data_type() == field.data_type() => {}
            Ok(found) => report.problem(
                Check::Schema,
                None,
                None,
                format!(
                    "column {:?} is {}, not {}",
                    field.name(),
                    found.data_type(),
                    field.data_type()
                ),
            ),
            Err(_) => report.problem(
                Check::Schema,
                None,
                None,
                format!("no column {:?}", field.name()),
            ),
        }
    }
    if let (Some(length), Some(declared)) = (length, report.dimensions) {
        if length != declared {
            report.problem(
                Check::Dimensions,
                None,
                None,
                format!(
                    "{DIMENSIONS_KEY} is {declared} but the embedding column holds {length}-dimensional vectors"
                ),
            );
        }
    }
    if let (Some(length), Some(model)) = (length, report.model.clone()) {
        if let Some(known) = known_model_dimensions(&model) {
            if known != length {
                report.problem(
                    Check::Dimensions,
                    None,
                    None,
                    format!(
                        "model {model} makes {known}-dimensional vectors, the file holds {length}"
                    ),
                );
            }
        }
    }
    length
}

fn check_rows(
    report: &mut FileReport,
    batch: &RecordBatch,
    rows_before: u64,
    length: Option<usize>,
    file_index: u32,
    files: &[PathBuf],
    ids: &mut Ids,
) {
    let id_array = batch
        .column_by_name("id")
        .and_then(|c| c.as_string_opt::<i32>());
    let embeddings: Option<&FixedSizeListArray> = batch
        .column_by_name("embedding")
        .and_then(|c| c.as_fixed_size_list_opt());
    for i in 0..batch.num_rows() {
        let row = rows_before + i as u64 + 1;
        let id = id_array.and_then(|a| a.is_valid(i).then(|| a.value(i)));
        if id_array.is_some() {
            check_id(report, row, id, file_index, files, ids);
        }
        let (Some(list), Some(length)) = (embeddings, length) else {
            continue;
        };
        if list.is_null(i) {
            report.problem(
                Check::VectorLength,
                Some(row),
                id,
                "the embedding is null".to_string(),
            );
            continue;
        }
        let vector = list.value(i);
        let Some(values) = vector.as_primitive_opt::<Float32Type>() else {
            continue;
        };
        if values.len() != length {
            report.problem(
                Check::VectorLength,
                Some(row),
                id,
                format!("the vector has {} values, not {length}", values.len()),
            );
            continue;
        }
        if values.null_count() > 0 {
            let at = (0..values.len()).find(|&p| values.is_null(p)).unwrap_or(0);
            report.problem(
                Check::VectorLength,
                Some(row),
                id,
                format!("value {at} of the vector is null"),
            );
            continue;
        }
        let values = values.values();
        if let Some(at) = values.iter().position(|v| !v.is_finite()) {
            report.problem(
                Check::Finite,
                Some(row),
                id,
                format!("value {at} of the vector is {}", values[at]),
            );
        } else if values.iter().all(|&v| v == 0.0) {
            report.problem(
                Check::NotAllZero,
                Some(row),
                id,
                "the vector is all zeros".to_string(),
            );
        }
    }
}

fn check_id(
    report: &mut FileReport,
    row: u64,
    id: Option<&str>,
    file_index: u32,
    files: &[PathBuf],
    ids: &mut Ids,
) {
    let Some(id) = id else {
        report.problem(
            Check::UniqueIds,
            Some(row),
            None,
            "the id is null".to_string(),
        );
        return;
    };
    match ids.seen.entry(id_key128(id)) {
        Entry::Vacant(slot) => {
            slot.insert(file_index);
        }
        Entry::Occupied(first) => {
            let first = *first.get();
            let place = if first == file_index {
                "earlier in this file".to_string()
            } else {
                files
                    .get(first as usize)
                    .map_or_else(String::new, |f| format!("in {}", f.display()))
            };
            report.problem(
                Check::UniqueIds,
                Some(row),
                Some(id),
                format!("id {id:?} repeats (first seen {place})"),
            );
        }
    }
}

/// The run's summary next to the output, when there is one, must count the
/// same rows.
fn check_summary(report: &mut FileReport, path: &Path, rows: u64) {
    let summary = match (report.shard, path.file_name()) {
        // A shard's state is beside its directory (see `Job::state_stem`).
        (Some(_), Some(name)) => {
            StateLocation::beside(&Shard::state_dir(crate::fsio::parent_dir(path)).join(name))
        }
        _ => StateLocation::beside(path),
    }
    .summary();
    let Ok(text) = std::fs::read_to_string(&summary) else {
        return;
    };
    let written = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("written").and_then(serde_json::Value::as_u64));
    if let Some(written) = written {
        if written != rows {
            report.problem(
                Check::RowCount,
                None,
                None,
                format!(
                    "{rows} rows in the file but the run's summary ({}) says {written} were written",
                    summary.display()
                ),
            );
        }
    }
}

/// The human form of a report.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    for file in &report.files {
        file_text(&mut out, file);
    }
    for p in &report.problems {
        let _ = writeln!(out, "{}: {}", p.check.name(), p.message);
    }
    if report.files.len() > 1 {
        let t = &report.totals;
        let _ = write!(
            out,
            "total: {}, {}, {} prompt tokens, {}",
            counted(t.files, "file"),
            counted(t.rows, "row"),
            t.prompt_tokens,
            counted(t.requests, "request")
        );
        if let Some(cost) = t.cost {
            let _ = write!(out, ", cost {cost:.6}");
        }
        let _ = writeln!(out, "; {}", verdict(t.problem_count));
    }
    out
}

fn verdict(problems: u64) -> String {
    match problems {
        0 => "all checks passed".to_string(),
        n => counted(n, "problem"),
    }
}

fn file_text(out: &mut String, f: &FileReport) {
    let unknown = || "?".to_string();
    let _ = writeln!(out, "{}", f.path.display());
    if f.schema_version.is_none() && f.model.is_none() && f.row_groups == 0 {
        // Nothing could be read: the problems say why.
        let _ = writeln!(out, "  bytes       {}", f.bytes);
        problems_text(out, f);
        return;
    }
    let _ = writeln!(
        out,
        "  rows        {} ({}, {} bytes)",
        f.rows,
        counted(f.row_groups, "row group"),
        f.bytes
    );
    if let Some(job) = &f.job {
        match f.shard {
            Some(shard) => writeln!(out, "  job         {job}, shard {shard}"),
            None => writeln!(out, "  job         {job}"),
        }
        .ok();
    }
    let _ = writeln!(
        out,
        "  model       {} ({} backend), {} dimensions",
        f.model.clone().unwrap_or_else(unknown),
        f.backend.clone().unwrap_or_else(unknown),
        f.dimensions.map_or_else(unknown, |d| d.to_string())
    );
    let _ = writeln!(
        out,
        "  schema      version {}, text {}, written by embedjob {}",
        f.schema_version.clone().unwrap_or_else(unknown),
        if f.include_text {
            "included"
        } else {
            "not included"
        },
        f.written_by.clone().unwrap_or_else(unknown)
    );
    if !f.metadata_columns.is_empty() {
        let _ = writeln!(out, "  metadata    {}", f.metadata_columns.join(", "));
    }
    let number = |n: Option<u64>| n.map_or_else(unknown, |n| n.to_string());
    if f.backend.as_deref() == Some("local") {
        let _ = writeln!(
            out,
            "  usage       {} tokens, {} (the local model bills nothing)",
            number(f.prompt_tokens),
            f.requests
                .map_or_else(|| "? requests".to_string(), |n| counted(n, "request"))
        );
    } else {
        let _ = writeln!(
            out,
            "  usage       {} prompt tokens, {} total, {}",
            number(f.prompt_tokens),
            number(f.total_tokens),
            f.requests
                .map_or_else(|| "? requests".to_string(), |n| counted(n, "request"))
        );
        if let Some(cost) = f.cost {
            let _ = writeln!(out, "  cost        {cost:.6}");
        }
    }
    problems_text(out, f);
}

fn problems_text(out: &mut String, f: &FileReport) {
    let _ = writeln!(out, "  checks      {}", verdict(f.problem_count));
    for p in &f.problems {
        let mut place = String::new();
        if let Some(row) = p.row {
            let _ = write!(place, "row {row}");
        }
        if let Some(id) = &p.id {
            let _ = write!(
                place,
                "{}id {id:?}",
                if place.is_empty() { "" } else { ", " }
            );
        }
        if !place.is_empty() {
            place = format!(" ({place})");
        }
        let _ = writeln!(out, "    - {}{place}: {}", p.check.name(), p.message);
    }
    let listed = f.problems.len() as u64;
    if f.problem_count > listed {
        let _ = writeln!(out, "    … and {} more", f.problem_count - listed);
    }
}

/// One line naming the first problem, for the error that ends a failed inspection.
pub fn first_problem(report: &Report) -> Option<String> {
    if let Some(p) = report.problems.first() {
        return Some(format!("{}: {}", p.check.name(), p.message));
    }
    report.files.iter().find_map(|f| {
        f.problems.first().map(|p| {
            let file = f.path.display().to_string();
            // Messages about reading the file already start with its name.
            let message = p
                .message
                .strip_prefix(&format!("{file}: "))
                .unwrap_or(&p.message);
            match p.row {
                Some(row) => format!("{file} row {row}: {}: {message}", p.check.name()),
                None => format!("{file}: {}: {message}", p.check.name()),
            }
        })
    })
}
