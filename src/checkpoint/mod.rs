//! Never paying twice: what a job has already embedded, kept durably and
//! found again by content.
//!
//! While a job runs, every vector it pays for is committed to a part file in
//! `<output>.checkpoint/` as soon as the response is in (see [`PartWriter`]).
//! A run that is killed, stopped or fails therefore loses at most the
//! requests that were in flight. The next run of the same job opens a
//! [`Store`] over those parts and over the previous complete output, and
//! sends only chunks whose content hash is in neither. When the output is
//! complete the checkpoint is removed.
//!
//! Vectors are only reused under the same [`Fingerprint`] (backend, model,
//! dimensions, chunking): a checkpoint or an output made under another one is
//! refused rather than mixed in, unless the run is told to start afresh.
//!
//! ```text
//! out/docs.parquet                   the complete output of the last finished run
//! out/docs.parquet.lock              held while a run works on this output
//! out/docs.parquet.checkpoint/
//!     manifest.json                  the fingerprint the parts were made under
//!     part-000001.parquet            vectors paid for and committed, in the output's
//!     part-000002.parquet            columns without `text`; usage in the metadata
//! ```

mod lock;
mod parts;
mod store;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::BackendInfo;
use crate::client::Usage;
use crate::job::Job;
use crate::sink::{self, with_suffix, SinkError};

pub use self::lock::{lock_path, JobLock};
pub use self::parts::PartWriter;
pub use self::store::{hash_key, id_key, Location, Origin, Store};

/// The metadata key holding a file's fingerprint, as JSON.
pub const FINGERPRINT_KEY: &str = "embedjob.fingerprint";

/// `<output>.checkpoint`.
pub fn checkpoint_dir(output: &Path) -> PathBuf {
    with_suffix(output, ".checkpoint")
}

/// A problem with the saved state of a job. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "{path}: another run of this job is working on its output ({holder}); \
         wait for it to finish or stop it"
    )]
    Locked { path: PathBuf, holder: String },
    #[error(
        "{path} was made with a different configuration ({}); run with --fresh to \
         discard it and embed everything again, or restore the configuration",
        .differences.join("; ")
    )]
    Changed {
        path: PathBuf,
        differences: Vec<String>,
    },
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a readable checkpoint or output: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Sink(#[from] SinkError),
}

impl CheckpointError {
    /// A changed configuration is found before any work starts.
    pub fn is_found_before_work(&self) -> bool {
        matches!(self, CheckpointError::Changed { .. })
    }
}

/// What decides whether a stored vector may stand for a chunk: the same text
/// (its content hash) embedded by the same model at the same size, chunked the
/// same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint(BTreeMap<String, String>);

impl Fingerprint {
    /// The fingerprint of `job` run on a backend described by `info`.
    pub fn new(job: &Job, info: &BackendInfo) -> Fingerprint {
        let mut fields: BTreeMap<String, String> = job
            .fingerprint_fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        fields.insert("backend.model".into(), info.model.clone());
        if let Some(dimensions) = info.dimensions {
            fields.insert("backend.dimensions".into(), dimensions.to_string());
        }
        Fingerprint(fields)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Option<Fingerprint> {
        serde_json::from_str(text).ok().map(Fingerprint)
    }

    /// `key: old → new` for every field that differs from `earlier`.
    pub fn differences(&self, earlier: &Fingerprint) -> Vec<String> {
        let keys: std::collections::BTreeSet<&String> =
            self.0.keys().chain(earlier.0.keys()).collect();
        let show = |v: Option<&String>| match v.map(String::as_str) {
            None | Some("") => "(unset)".to_string(),
            Some(v) => v.to_string(),
        };
        keys.into_iter()
            .filter(|k| self.0.get(*k) != earlier.0.get(*k))
            .map(|k| format!("{k}: {} → {}", show(earlier.0.get(k)), show(self.0.get(k))))
            .collect()
    }
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    /// The layout of the checkpoint directory.
    checkpoint_version: u32,
    job: String,
    fingerprint: Fingerprint,
}

const CHECKPOINT_VERSION: u32 = 1;
const MANIFEST: &str = "manifest.json";

/// Usage and requests recorded in parts committed by earlier attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Earlier {
    pub parts: u64,
    pub rows: u64,
    pub usage: Usage,
    pub requests: u64,
}

/// The checkpoint directory of one output, opened by a run holding its lock.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    job: String,
    fingerprint: Fingerprint,
    /// Parts committed before this run, in order.
    parts: Vec<PathBuf>,
}

impl Checkpoint {
    /// Opens (or creates) the checkpoint of `output` for a run under
    /// `fingerprint`, removing what killed runs left half-written.
    ///
    /// A checkpoint made under another fingerprint is refused, unless
    /// `fresh`, which discards it.
    pub fn open(
        job_name: &str,
        output: &Path,
        fingerprint: &Fingerprint,
        fresh: bool,
    ) -> Result<Checkpoint, CheckpointError> {
        let dir = checkpoint_dir(output);
        remove_stale_temporaries(output)?;
        if fresh && dir.exists() {
            fs::remove_dir_all(&dir).map_err(|source| CheckpointError::Io {
                path: dir.clone(),
                action: "cannot remove the old checkpoint",
                source,
            })?;
        }
        if dir.exists() {
            remove_stale_temporaries_in(&dir)?;
        }
        Checkpoint::read(job_name, output, fingerprint)
    }

    /// [`Checkpoint::open`] without changing anything on disk, for a look at
    /// what a run would find; no lock is needed.
    pub fn read(
        job_name: &str,
        output: &Path,
        fingerprint: &Fingerprint,
    ) -> Result<Checkpoint, CheckpointError> {
        let dir = checkpoint_dir(output);
        let manifest_path = dir.join(MANIFEST);
        match fs::read(&manifest_path) {
            Ok(bytes) => {
                let manifest: Manifest =
                    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Corrupt {
                        path: manifest_path.clone(),
                        message: e.to_string(),
                    })?;
                if manifest.checkpoint_version != CHECKPOINT_VERSION {
                    return Err(CheckpointError::Changed {
                        path: dir,
                        differences: vec![format!(
                            "checkpoint layout {} → {CHECKPOINT_VERSION}",
                            manifest.checkpoint_version
                        )],
                    });
                }
                let differences = fingerprint.differences(&manifest.fingerprint);
                if !differences.is_empty() {
                    return Err(CheckpointError::Changed {
                        path: dir,
                        differences,
                    });
                }
            }
            // Created with the first part, so that a run that pays for nothing leaves nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: manifest_path,
                    action: "cannot read",
                    source,
                })
            }
        }
        let parts = if dir.exists() {
            list_parts(&dir)?
        } else {
            Vec::new()
        };
        Ok(Checkpoint {
            dir,
            job: job_name.to_string(),
            fingerprint: fingerprint.clone(),
            parts,
        })
    }

    /// Creates the directory and its manifest, if missing.
    pub(super) fn create(&self) -> Result<(), CheckpointError> {
        let manifest_path = self.dir.join(MANIFEST);
        if manifest_path.exists() {
            return Ok(());
        }
        fs::create_dir_all(&self.dir).map_err(|source| CheckpointError::Io {
            path: self.dir.clone(),
            action: "cannot create the checkpoint",
            source,
        })?;
        let manifest = Manifest {
            checkpoint_version: CHECKPOINT_VERSION,
            job: self.job.clone(),
            fingerprint: self.fingerprint.clone(),
        };
        let value = serde_json::to_value(&manifest).map_err(|e| CheckpointError::Corrupt {
            path: manifest_path.clone(),
            message: e.to_string(),
        })?;
        sink::write_json_atomically(&manifest_path, &value)?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Whether an earlier run under this fingerprint committed work here.
    pub fn is_started(&self) -> bool {
        self.dir.join(MANIFEST).exists()
    }

    /// Parts committed by earlier runs.
    pub fn parts(&self) -> &[PathBuf] {
        &self.parts
    }

    /// Removes the checkpoint once the output holds everything in it.
    pub fn remove(self) -> Result<(), CheckpointError> {
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CheckpointError::Io {
                path: self.dir,
                action: "cannot remove the checkpoint",
                source,
            }),
        }
    }
}

/// Checks that a previous output was made under `fingerprint`, so that its
/// vectors may be reused.
pub fn check_previous_output(
    output: &Path,
    fingerprint: &Fingerprint,
) -> Result<(), CheckpointError> {
    let metadata = sink::read_metadata(output).map_err(|e| CheckpointError::Corrupt {
        path: output.to_path_buf(),
        message: e.to_string(),
    })?;
    let differences = match metadata
        .get(FINGERPRINT_KEY)
        .map(|t| Fingerprint::from_json(t))
    {
        Some(Some(earlier)) => fingerprint.differences(&earlier),
        Some(None) => vec![format!("its {FINGERPRINT_KEY} metadata cannot be read")],
        None => vec![format!(
            "it has no {FINGERPRINT_KEY} metadata, so its vectors cannot be matched to this job"
        )],
    };
    if differences.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::Changed {
            path: output.to_path_buf(),
            differences,
        })
    }
}

/// The vectors a run of `output` under `fingerprint` may reuse: those of the
/// checkpoint's parts and of the previous output, with the ids of the
/// previous output's chunks. Reads every stored hash: call it off the async
/// runtime.
///
/// A previous output made under another fingerprint is refused, unless
/// `fresh` (it is then ignored) or the checkpoint shows a fresh start under
/// this fingerprint has begun (it is being replaced, not reused).
pub fn load_store(
    output: &Path,
    checkpoint: &Checkpoint,
    fresh: bool,
) -> Result<(Store, std::collections::HashSet<u64>), CheckpointError> {
    let mut store = Store::new();
    let mut ids = std::collections::HashSet::new();
    if !fresh && output.exists() {
        match check_previous_output(output, &checkpoint.fingerprint) {
            Ok(()) => store.add(output, Origin::Previous, Some(&mut ids))?,
            Err(CheckpointError::Changed { .. }) if checkpoint.is_started() => {}
            Err(e) => return Err(e),
        }
    }
    for part in &checkpoint.parts {
        store.add(part, Origin::Checkpoint, None)?;
    }
    Ok((store, ids))
}

fn list_parts(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let entries = fs::read_dir(dir).map_err(|source| CheckpointError::Io {
        path: dir.to_path_buf(),
        action: "cannot list",
        source,
    })?;
    let mut parts: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| parts::part_number(p).is_some())
        .collect();
    parts.sort();
    Ok(parts)
}

/// Removes the temporary files runs killed mid-write left next to the output
/// (`.docs.parquet.tmp-1234`, `.docs.parquet.summary.json.tmp-1234`, …).
/// Only the holder of the job's lock may call this: no other run is writing.
fn remove_stale_temporaries(output: &Path) -> Result<(), CheckpointError> {
    let Some(name) = output.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    let dir = crate::sink::parent_dir(output);
    let prefix = format!(".{name}.");
    remove_matching(dir, |file| {
        file.starts_with(&prefix) && file.contains(".tmp-")
    })
}

fn remove_stale_temporaries_in(dir: &Path) -> Result<(), CheckpointError> {
    remove_matching(dir, |file| file.starts_with('.') && file.contains(".tmp-"))
}

fn remove_matching(dir: &Path, stale: impl Fn(&str) -> bool) -> Result<(), CheckpointError> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        if name.to_str().is_some_and(&stale) {
            let path = entry.path();
            fs::remove_file(&path).map_err(|source| CheckpointError::Io {
                path,
                action: "cannot remove a stale temporary file",
                source,
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(model: &str) -> Fingerprint {
        Fingerprint(
            [
                ("backend.model".to_string(), model.to_string()),
                ("chunking.max_tokens".to_string(), "512".to_string()),
            ]
            .into_iter()
            .collect(),
        )
    }

    #[test]
    fn differences_name_each_changed_key() {
        let a = fingerprint("svc-embed-1");
        let b = fingerprint("svc-embed-1-l");
        assert!(a.differences(&a).is_empty());
        assert_eq!(
            b.differences(&a),
            ["backend.model: svc-embed-1 → svc-embed-1-l"]
        );
        assert_eq!(Fingerprint::from_json(&a.to_json()), Some(a));
    }

    #[test]
    fn a_checkpoint_of_another_configuration_is_refused_unless_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("docs.parquet");
        let first = Checkpoint::open("docs", &output, &fingerprint("svc-embed-1"), false).unwrap();
        assert!(
            !first.dir().exists(),
            "nothing is written before the first part"
        );
        first.create().unwrap();
        assert!(first.dir().join(MANIFEST).exists());
        fs::write(first.dir().join("part-000001.parquet"), b"x").unwrap();
        fs::write(first.dir().join(".part-000002.parquet.tmp-77"), b"x").unwrap();
        fs::write(dir.path().join(".docs.parquet.tmp-77"), b"x").unwrap();

        let same = Checkpoint::open("docs", &output, &fingerprint("svc-embed-1"), false).unwrap();
        assert_eq!(same.parts(), [same.dir().join("part-000001.parquet")]);
        assert!(!same.dir().join(".part-000002.parquet.tmp-77").exists());
        assert!(!dir.path().join(".docs.parquet.tmp-77").exists());

        let err =
            Checkpoint::open("docs", &output, &fingerprint("svc-embed-1-l"), false).unwrap_err();
        assert!(err.is_found_before_work());
        let message = err.to_string();
        assert!(message.contains("svc-embed-1 → svc-embed-1-l"), "{message}");
        assert!(message.contains("--fresh"), "{message}");

        let fresh = Checkpoint::open("docs", &output, &fingerprint("svc-embed-1-l"), true).unwrap();
        assert!(fresh.parts().is_empty());
        fresh.remove().unwrap();
        assert!(!checkpoint_dir(&output).exists());
    }
}
