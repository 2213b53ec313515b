//! A directory's files sorted into datasets by the job and configuration
//! their footers record.

use std::path::PathBuf;

use serde::Serialize;

use crate::contract::{DIMENSIONS_KEY, FINGERPRINT_KEY, JOB_KEY, MODEL_KEY};
use crate::parquet_io::{key_values, open_reader as parquet_reader};

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
    pub(super) fn describe(&self) -> String {
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
pub(super) fn datasets(files: &[PathBuf]) -> (Vec<Dataset>, Vec<usize>) {
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
