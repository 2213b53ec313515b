//! The checkpoint: every vector a job pays for, committed as it arrives.
//!
//! ```text
//! <stem>.checkpoint/
//!     manifest.json                  the fingerprint the parts were made under
//!     part-000001.parquet            vectors paid for and committed, in the output's
//!     part-000002.parquet            columns without `text`; usage in the metadata
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{parts, Fingerprint, StateError, StateLocation};
use crate::fsio::{self, FsError};

#[derive(Serialize, Deserialize)]
struct Manifest {
    /// The layout of the checkpoint directory.
    checkpoint_version: u32,
    job: String,
    fingerprint: Fingerprint,
}

const CHECKPOINT_VERSION: u32 = 1;
const MANIFEST: &str = "manifest.json";

/// The checkpoint directory of one job, opened by a run holding its lock.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    job: String,
    fingerprint: Fingerprint,
    /// Parts committed before this run, in order.
    parts: Vec<PathBuf>,
    /// Why the checkpoint on disk cannot be used at all, when it cannot: its
    /// parts are then left out.
    damaged: Option<String>,
    /// The warning that [`Checkpoint::open`] discarded a damaged checkpoint.
    discarded: Option<String>,
}

impl Checkpoint {
    /// Opens (or creates) the checkpoint of `output` for a run under
    /// `fingerprint`, removing what killed runs left half-written.
    ///
    /// A checkpoint made under another fingerprint is refused, unless
    /// `fresh`, which discards it.
    pub fn open(
        job_name: &str,
        location: &StateLocation,
        fingerprint: &Fingerprint,
        fresh: bool,
    ) -> Result<Checkpoint, StateError> {
        let dir = location.checkpoint();
        location.remove_stale_temporaries()?;
        if fresh && dir.exists() {
            fs::remove_dir_all(&dir).map_err(|source| {
                StateError::from(FsError::Io {
                    path: dir.clone(),
                    action: "cannot remove the old checkpoint",
                    source,
                })
            })?;
        }
        if dir.exists() {
            remove_stale_temporaries_in(&dir)?;
        }
        let mut checkpoint = Checkpoint::read(job_name, location, fingerprint)?;
        if let Some(reason) = checkpoint.damaged.take() {
            checkpoint.discarded = Some(format!(
                "{}: discarded, its chunks are embedded again: {reason}",
                dir.display()
            ));
            fs::remove_dir_all(&dir).map_err(|source| {
                StateError::from(FsError::Io {
                    path: dir.clone(),
                    action: "cannot remove the damaged checkpoint",
                    source,
                })
            })?;
        }
        Ok(checkpoint)
    }

    /// [`Checkpoint::open`] without changing anything on disk, for a look at
    /// what a run would find; no lock is needed.
    pub fn read(
        job_name: &str,
        location: &StateLocation,
        fingerprint: &Fingerprint,
    ) -> Result<Checkpoint, StateError> {
        let dir = location.checkpoint();
        let manifest_path = dir.join(MANIFEST);
        let mut damaged = None;
        match read_manifest(&manifest_path) {
            Ok(Err(e)) => damaged = Some(format!("{MANIFEST} cannot be read ({e})")),
            Ok(Ok(manifest)) => check_manifest(&dir, &manifest, fingerprint)?,
            // Created with the first part, so that a run that pays for nothing leaves nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if dir.exists() && !list_parts(&dir)?.is_empty() {
                    damaged = Some(format!(
                        "it holds parts but no {MANIFEST}, so what made them is unknown"
                    ));
                }
            }
            Err(source) => {
                return Err(StateError::from(FsError::Io {
                    path: manifest_path,
                    action: "cannot read",
                    source,
                }))
            }
        }
        let parts = if dir.exists() && damaged.is_none() {
            list_parts(&dir)?
        } else {
            Vec::new()
        };
        Ok(Checkpoint {
            dir,
            job: job_name.to_string(),
            fingerprint: fingerprint.clone(),
            parts,
            damaged,
            discarded: None,
        })
    }

    /// Why the checkpoint cannot be used at all, when it cannot; [`Checkpoint::open`]
    /// discards such a checkpoint.
    pub fn damaged(&self) -> Option<&str> {
        self.damaged.as_deref()
    }

    /// The warning, when [`Checkpoint::open`] discarded a damaged checkpoint.
    pub fn discarded(&self) -> Option<&str> {
        self.discarded.as_deref()
    }
}

/// The fingerprint the checkpoint at `location` was started under, when
/// its manifest can be read: a damaged one is discarded by the run.
pub(super) fn started_under(location: &StateLocation) -> Option<Fingerprint> {
    let manifest = read_manifest(&location.checkpoint().join(MANIFEST)).ok()?;
    manifest.ok().map(|manifest| manifest.fingerprint)
}

/// The manifest at `path`: the file read, then its JSON parsed.
fn read_manifest(path: &Path) -> std::io::Result<serde_json::Result<Manifest>> {
    fs::read(path).map(|bytes| serde_json::from_slice::<Manifest>(&bytes))
}

/// A manifest of another layout or fingerprint is refused.
fn check_manifest(
    dir: &Path,
    manifest: &Manifest,
    fingerprint: &Fingerprint,
) -> Result<(), StateError> {
    if manifest.checkpoint_version != CHECKPOINT_VERSION {
        return Err(StateError::Changed {
            what: dir.display().to_string(),
            differences: vec![format!(
                "checkpoint layout {} → {CHECKPOINT_VERSION}",
                manifest.checkpoint_version
            )],
        });
    }
    let differences = fingerprint.differences(&manifest.fingerprint);
    if differences.is_empty() {
        Ok(())
    } else {
        Err(StateError::Changed {
            what: dir.display().to_string(),
            differences,
        })
    }
}

impl Checkpoint {
    /// Creates the directory and its manifest, if missing.
    pub(super) fn create(&self) -> Result<(), StateError> {
        let manifest_path = self.dir.join(MANIFEST);
        if manifest_path.exists() {
            return Ok(());
        }
        fs::create_dir_all(&self.dir).map_err(|source| {
            StateError::from(FsError::Io {
                path: self.dir.clone(),
                action: "cannot create the checkpoint",
                source,
            })
        })?;
        let manifest = Manifest {
            checkpoint_version: CHECKPOINT_VERSION,
            job: self.job.clone(),
            fingerprint: self.fingerprint.clone(),
        };
        let value = serde_json::to_value(&manifest).map_err(|e| StateError::Corrupt {
            path: manifest_path.clone(),
            message: e.to_string(),
        })?;
        fsio::write_json_atomically(&manifest_path, &value)?;
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

    /// Lists the parts on disk again.
    pub(super) fn relist(&mut self) -> Result<(), StateError> {
        if self.dir.exists() && self.damaged.is_none() {
            self.parts = list_parts(&self.dir)?;
        }
        Ok(())
    }

    /// Parts committed by earlier runs.
    pub fn parts(&self) -> &[PathBuf] {
        &self.parts
    }

    /// Removes the checkpoint once the output holds everything in it.
    pub fn remove(self) -> Result<(), StateError> {
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StateError::from(FsError::Io {
                path: self.dir,
                action: "cannot remove the checkpoint",
                source,
            })),
        }
    }
}

/// The key-value metadata of the newest part of the checkpoint at
/// `location`: what the run that committed it knew (its model, the window it
/// learned). Empty when there is no part or it cannot be read; nothing on
/// disk changes and no lock is needed.
pub fn newest_part_metadata(location: &StateLocation) -> BTreeMap<String, String> {
    list_parts(&location.checkpoint())
        .ok()
        .and_then(|parts| parts.last().cloned())
        .and_then(|part| crate::parquet_io::load_metadata(&part).ok())
        .map(|metadata| crate::parquet_io::key_values(metadata.metadata()))
        .unwrap_or_default()
}

fn list_parts(dir: &Path) -> Result<Vec<PathBuf>, StateError> {
    let entries = fs::read_dir(dir).map_err(|source| {
        StateError::from(FsError::Io {
            path: dir.to_path_buf(),
            action: "cannot list",
            source,
        })
    })?;
    let mut parts: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| parts::part_number(p).is_some())
        .collect();
    parts.sort();
    Ok(parts)
}

/// The checkpoint directory is the job's alone: any temporary of a part or
/// the manifest left by a process that is gone is stale.
fn remove_stale_temporaries_in(dir: &Path) -> Result<(), StateError> {
    remove_matching(dir, |file| {
        let name = file
            .strip_prefix('.')
            .and_then(|rest| rest.rsplit_once(".tmp-"))
            .map_or("", |(name, _)| name);
        let own = name == MANIFEST || parts::part_number(Path::new(name)).is_some();
        own && fsio::is_stale_temporary(file, &[name])
    })
}

pub(super) fn remove_matching(dir: &Path, stale: impl Fn(&str) -> bool) -> Result<(), StateError> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        if name.to_str().is_some_and(&stale) {
            let path = entry.path();
            fs::remove_file(&path)
                .map_err(FsError::io(&path, "cannot remove a stale temporary file"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(model: &str) -> Fingerprint {
        Fingerprint::from_json(&format!(
            r#"{{"backend.model":"{model}","chunking.max_tokens":"512"}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_checkpoint_of_another_configuration_is_refused_unless_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let output = StateLocation::beside(&dir.path().join("docs.parquet"));
        let first = Checkpoint::open("docs", &output, &fingerprint("svc-embed-1"), false).unwrap();
        assert!(
            !first.dir().exists(),
            "nothing is written before the first part"
        );
        first.create().unwrap();
        assert!(first.dir().join(MANIFEST).exists());
        fs::write(first.dir().join("part-000001.parquet"), b"x").unwrap();
        fs::write(first.dir().join(".part-000002.parquet.tmp-999999999"), b"x").unwrap();
        fs::write(dir.path().join(".docs.parquet.tmp-999999999"), b"x").unwrap();

        let same = Checkpoint::open("docs", &output, &fingerprint("svc-embed-1"), false).unwrap();
        assert_eq!(same.parts(), [same.dir().join("part-000001.parquet")]);
        assert!(!same
            .dir()
            .join(".part-000002.parquet.tmp-999999999")
            .exists());
        assert!(!dir.path().join(".docs.parquet.tmp-999999999").exists());

        let err =
            Checkpoint::open("docs", &output, &fingerprint("svc-embed-1-l"), false).unwrap_err();
        assert!(err.is_found_before_work());
        let message = err.to_string();
        assert!(message.contains("svc-embed-1 → svc-embed-1-l"), "{message}");
        assert!(message.contains("--fresh"), "{message}");

        let fresh = Checkpoint::open("docs", &output, &fingerprint("svc-embed-1-l"), true).unwrap();
        assert!(fresh.parts().is_empty());
        fresh.remove().unwrap();
        assert!(!output.checkpoint().exists());
    }
}
