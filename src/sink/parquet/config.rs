//! `kind = "parquet"` (the default): its parameters, their checks, its
//! part of a split job (a directory of the shards' files), how it opens
//! and how its files are searched.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use serde::Deserialize;

use super::ParquetSink;
use crate::exit::Failure;
use crate::job::{KindTable, OutputParams, Shard};
use crate::query::{self, Found};
use crate::sink::{params_of, query_failure, Sink, SinkError, SinkKind};

/// `kind = "parquet"` (the default): one Parquet file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ParquetOutput {
    pub path: PathBuf,
    #[serde(default = "default_true")]
    pub include_text: bool,
    /// A row group is flushed once its buffered vectors and text reach this size.
    #[serde(default = "default_row_group_bytes")]
    pub row_group_bytes: u64,
}

fn default_true() -> bool {
    true
}

fn default_row_group_bytes() -> u64 {
    16 * 1024 * 1024
}

pub struct Kind;

impl crate::job::Kind<dyn OutputParams> for Kind {
    fn name(&self) -> &'static str {
        "parquet"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["path", "include_text", "row_group_bytes"]
    }

    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn OutputParams>> {
        let params: ParquetOutput = table.deserialize()?;
        Some(Box::new(params))
    }
}

impl SinkKind for Kind {
    fn open<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        shard: Option<Shard>,
    ) -> BoxFuture<'a, Result<Box<dyn Sink>, SinkError>> {
        Box::pin(async move {
            let params: &ParquetOutput = params_of(params)?;
            Ok(Box::new(ParquetSink::new(params, shard)) as Box<dyn Sink>)
        })
    }

    fn search<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        vector: Vec<f32>,
        model: &'a str,
        k: usize,
    ) -> BoxFuture<'a, Result<Found, Failure>> {
        Box::pin(async move {
            let params: &ParquetOutput =
                params_of(params).map_err(|e| Failure::found(e.is_found_before_work(), e))?;
            search(params.path.clone(), vector, model.to_string(), k).await
        })
    }
}

/// The nearest rows of the output's file, or of a split job's files, off
/// the async runtime.
async fn search(
    path: PathBuf,
    vector: Vec<f32>,
    model: String,
    k: usize,
) -> Result<Found, Failure> {
    tokio::task::spawn_blocking(move || {
        // A split job's output is a directory of its shards' files.
        let files = if path.is_dir() {
            crate::parquet_io::list_parquet_files(&path)?
        } else {
            vec![path.clone()]
        };
        if files.is_empty() {
            return Err(query::QueryError::NoOutput { path });
        }
        for file in &files {
            let metadata = query::parquet_metadata(file, vector.len())?;
            query::check_model(&file.display().to_string(), &metadata, &model, vector.len())?;
        }
        query::search_parquet(&files, &vector, k)
    })
    .await
    .map_err(|e| Failure::failed(anyhow::anyhow!("the search stopped unexpectedly: {e}")))?
    .map_err(query_failure)
}

impl OutputParams for ParquetOutput {
    fn kind(&self) -> &'static str {
        "parquet"
    }

    fn clone_box(&self) -> Box<dyn OutputParams> {
        Box::new(self.clone())
    }

    fn resolve_paths(&mut self, base: &Path) {
        self.path = crate::job::paths::relative_to(base, &self.path);
    }

    fn problems(&self, p: &mut Vec<String>) {
        if self.path.as_os_str().is_empty() {
            p.push("`output.path` must not be empty".to_string());
        }
        if !(1024..=crate::job::MAX_ROW_GROUP_BYTES).contains(&self.row_group_bytes) {
            p.push(format!(
                "`output.row_group_bytes` must be between 1024 and {}, not {}",
                crate::job::MAX_ROW_GROUP_BYTES,
                self.row_group_bytes
            ));
        }
    }

    /// The output's own path; a shard's state sits beside the output
    /// directory, under the shard's file name.
    fn state_stem(&self, _job_name: &str, shard: Option<Shard>) -> PathBuf {
        match shard {
            None => self.path.clone(),
            Some(shard) => {
                let dir = crate::fsio::parent_dir(&self.path);
                Shard::state_dir(dir).join(shard.file_name())
            }
        }
    }

    /// `path` names a directory, where the shard writes its own file.
    fn split(&mut self, shard: Shard, problems: &mut Vec<String>) {
        let dir = self.path.clone();
        if dir.is_file() {
            problems.push(format!(
                "`output.path` {} is a file; with --shard it names a directory, where \
                 each shard writes its own part-IIIII-of-NNNNN.parquet",
                dir.display()
            ));
        }
        match shard.foreign_files(&dir) {
            Ok(foreign) if foreign.is_empty() => {}
            Ok(foreign) => problems.push(format!(
                "`output.path` {} holds files of the job split into another number of \
                 shards than {}: {}; they hold this shard's documents too: remove them \
                 (and their state in {}), or give the job another `output.path`",
                dir.display(),
                shard.count,
                foreign
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                Shard::state_dir(&dir).display()
            )),
            Err(e) => problems.push(format!("`output.path` {}: cannot list: {e}", dir.display())),
        }
        self.path = dir.join(shard.file_name());
    }

    fn output_file(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn row_group_bytes(&self) -> Option<u64> {
        Some(self.row_group_bytes)
    }

    /// A directory at `path` holds the files of a split job's shards, or is
    /// not an output.
    fn shards_held(&self) -> Result<Option<u32>, String> {
        if !self.path.is_dir() {
            return Ok(None);
        }
        match Shard::count_in(&self.path)? {
            Some(count) => Ok(Some(count)),
            None => Err(format!(
                "`output.path` {} is a directory, not a Parquet file",
                self.path.display()
            )),
        }
    }
}
