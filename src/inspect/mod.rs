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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

mod dataset;
mod file;
mod footer;
mod human;
mod rows;
mod shards;
#[cfg(test)]
mod tests;

pub use dataset::Dataset;
pub use human::{first_problem, text};

use crate::exit::Exit;
use crate::job::Shard;
use crate::parquet_io::{list_parquet_files, FileError};
use dataset::datasets;
use file::inspect_file;
use rows::Ids;

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
    /// Batch mode: the price per 1000 tokens `cost` is at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_input_per_1k: Option<f64>,
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
    /// What a shard's run read of the whole input (`embedjob.input`).
    #[serde(skip)]
    pub input: Option<String>,
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
