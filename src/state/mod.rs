//! Job state: everything a job keeps besides its output, owned here and
//! kept in one place.
//!
//! - the **lock** that lets one run of the job work at a time;
//! - the **checkpoint**: every vector paid for, committed as it arrives, so
//!   that a run that is killed, stopped or fails loses at most the requests
//!   in flight, and the next run sends only what is in neither the
//!   checkpoint nor the output;
//! - the **failures file** of quarantined chunks;
//! - the **summary** of the last run.
//!
//! Their names all derive from one [`StateLocation`], the job's *stem*: for
//! a Parquet output, the output's own path; for a pgvector table,
//! `<output.state_dir>/<job name>.<table>` (`.embedjob/docs.docs_chunks`).
//!
//! ```text
//! out/docs.parquet                   the output (the sink's; the stem)
//! out/docs.parquet.lock              held while a run works on this job
//! out/docs.parquet.checkpoint/       manifest.json and part-NNNNNN.parquet
//! out/docs.parquet.failures.jsonl    quarantined chunks, when there are some
//! out/docs.parquet.summary.json      what the last run did
//! ```
//!
//! Vectors are only reused under the same [`Fingerprint`] (backend, model,
//! dimensions, chunking): a checkpoint or an output made under another one
//! is refused rather than mixed in, unless the run is told to start afresh.

pub mod batches;
mod checkpoint;
mod failures;
mod fingerprint;
mod lock;
mod parts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::contract::FINGERPRINT_KEY;
use crate::fsio::{self, FsError};
use crate::job::Job;
use crate::parquet_io::{FileError, ParquetRows};
use crate::store::{HeldIds, Origin, Store, StoreError, StoredRows};

pub use self::checkpoint::{newest_part_metadata, Checkpoint};
pub use self::failures::{FailuresFile, FailuresReport};
pub use self::fingerprint::{Fingerprint, Settled};
pub use self::lock::JobLock;
pub use self::parts::{Billed, PartWriter};

/// Where a job's state lives: every file named after one stem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLocation {
    stem: PathBuf,
    /// A Parquet output kept apart from the stem (a shard's), whose
    /// temporaries are the job's too.
    output: Option<PathBuf>,
}

impl StateLocation {
    /// The state of `job`: beside a Parquet output, in the `state_dir` of a
    /// table, beside a shard's output directory (see [`Job::state_stem`]).
    pub fn for_job(job: &Job) -> StateLocation {
        let stem = job.state_stem();
        let output = job
            .output
            .params
            .output_file()
            .filter(|path| *path != stem)
            .map(Path::to_path_buf);
        StateLocation { stem, output }
    }

    /// The state of a job whose output is `output`.
    pub fn beside(output: &Path) -> StateLocation {
        StateLocation {
            stem: output.to_path_buf(),
            output: None,
        }
    }

    pub fn stem(&self) -> &Path {
        &self.stem
    }

    /// `<stem>.lock`.
    pub fn lock(&self) -> PathBuf {
        fsio::with_suffix(&self.stem, ".lock")
    }

    /// `<stem>.checkpoint`.
    pub fn checkpoint(&self) -> PathBuf {
        fsio::with_suffix(&self.stem, ".checkpoint")
    }

    /// `<stem>.summary.json`.
    pub fn summary(&self) -> PathBuf {
        fsio::with_suffix(&self.stem, ".summary.json")
    }

    /// `<stem>.failures.jsonl`.
    pub fn failures(&self) -> PathBuf {
        fsio::with_suffix(&self.stem, ".failures.jsonl")
    }

    /// Removes the temporary files runs of this job killed mid-write left
    /// beside the stem (`.docs.parquet.tmp-1234`,
    /// `.docs.parquet.summary.json.tmp-1234`, …): the job's own names only,
    /// and only of processes that are gone, never another job's
    /// (`.docs.parquet.v2.parquet.tmp-1234`). Only the holder of the job's
    /// lock may call this.
    fn remove_stale_temporaries(&self) -> Result<(), StateError> {
        let own: Vec<String> = [self.stem.clone(), self.summary(), self.failures()]
            .iter()
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
            .collect();
        let own: Vec<&str> = own.iter().map(String::as_str).collect();
        checkpoint::remove_matching(fsio::parent_dir(&self.stem), |file| {
            fsio::is_stale_temporary(file, &own)
        })?;
        let Some(output) = &self.output else {
            return Ok(());
        };
        let Some(name) = output.file_name().and_then(|n| n.to_str()) else {
            return Ok(());
        };
        checkpoint::remove_matching(fsio::parent_dir(output), |file| {
            fsio::is_stale_temporary(file, &[name])
        })
    }
}

/// A problem with the saved state of a job. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "{path}: another run of this job is working on its output ({holder}); \
         wait for it to finish or stop it"
    )]
    Locked { path: PathBuf, holder: String },
    #[error(
        "{what} was made with a different configuration ({}); run with --fresh to \
         discard it and embed everything again, or restore the configuration",
        .differences.join("; ")
    )]
    Changed {
        what: String,
        differences: Vec<String>,
    },
    #[error("{path}: not a readable checkpoint: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl StateError {
    /// A changed configuration is found before any work starts.
    pub fn is_found_before_work(&self) -> bool {
        matches!(self, StateError::Changed { .. })
    }
}

/// The vectors a run may reuse, and the ids of the rows its sink held.
#[derive(Debug, Default)]
pub struct Reuse {
    pub store: Store,
    /// The sink's rows from the last finished run, by id key, each with its
    /// content hash's first 64 bits.
    pub held_ids: HeldIds,
    /// What was passed over (a damaged output or checkpoint part), for the
    /// command to print.
    pub warnings: Vec<String>,
}

/// The state of a job, opened by the run that holds its lock.
#[derive(Debug)]
pub struct JobState {
    location: StateLocation,
    lock: JobLock,
    checkpoint: Checkpoint,
    /// What opening found and discarded, for the command to print.
    warnings: Vec<String>,
}

impl JobState {
    /// Takes the job's lock (or fails at once, naming its holder), removes
    /// what killed runs left half-written, and opens the checkpoint under
    /// `fingerprint`: one made under another is refused unless `fresh`,
    /// which discards it.
    pub fn open(
        job_name: &str,
        location: StateLocation,
        fingerprint: &Fingerprint,
        fresh: bool,
    ) -> Result<JobState, StateError> {
        let lock = JobState::lock(&location)?;
        JobState::open_locked(job_name, location, lock, fingerprint, fresh)
    }

    /// Takes the job's lock at `location`, which [`JobState::open_locked`]
    /// opens the state under: a run takes it before it asks the service
    /// anything, so that one that overlaps another sends nothing (a window
    /// probe it sent would be paid for and lost).
    pub fn lock(location: &StateLocation) -> Result<JobLock, StateError> {
        JobLock::acquire(&location.lock())
    }

    /// [`JobState::open`] under a `lock` already taken.
    pub fn open_locked(
        job_name: &str,
        location: StateLocation,
        lock: JobLock,
        fingerprint: &Fingerprint,
        fresh: bool,
    ) -> Result<JobState, StateError> {
        let checkpoint = Checkpoint::open(job_name, &location, fingerprint, fresh)?;
        let warnings = checkpoint
            .discarded()
            .map(str::to_string)
            .into_iter()
            .collect();
        Ok(JobState {
            location,
            lock,
            checkpoint,
            warnings,
        })
    }

    /// What opening found and discarded (a damaged checkpoint).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    pub fn location(&self) -> &StateLocation {
        &self.location
    }

    /// What the lock file said when it was taken over from a run that is gone.
    pub fn taken_over(&self) -> Option<&str> {
        self.lock.taken_over.as_deref()
    }

    /// The vectors this run may reuse: the rows its sink `held` (when made
    /// under the same fingerprint) and the checkpoint's parts. Reads every
    /// stored hash: call it off the async runtime.
    pub fn reuse(
        &self,
        held: Option<Box<dyn StoredRows>>,
        fresh: bool,
    ) -> Result<Reuse, StateError> {
        let mut found = Reuse::default();
        reuse_into(&mut found, &self.checkpoint, held, fresh, true)?;
        Ok(found)
    }

    /// The writer of this run's checkpoint parts.
    pub fn part_writer(&self, model: &str, backend: &str, row_group_bytes: u64) -> PartWriter {
        PartWriter::new(self.checkpoint.clone(), model, backend, row_group_bytes)
    }

    /// The checkpoint directory, created with its manifest, for batch
    /// mode's record and request files.
    pub fn batch_dir(&self) -> Result<PathBuf, StateError> {
        self.checkpoint.create()?;
        Ok(self.checkpoint.dir().to_path_buf())
    }

    /// The checkpoint's committed parts.
    pub fn parts(&self) -> &[PathBuf] {
        self.checkpoint.parts()
    }

    /// Lists the checkpoint's parts again, after this run committed some
    /// before reading what it may reuse (batch mode's collection).
    pub fn relist_parts(&mut self) -> Result<(), StateError> {
        self.checkpoint.relist()
    }

    /// The failures file of this run.
    pub fn failures(&self) -> FailuresFile {
        FailuresFile::new(self.location.failures())
    }

    /// Releases the lock.
    pub fn close(self) {
        drop(self.lock);
    }
}

/// Refuses, before a run asks the service anything, a job file that changed
/// what its checkpoint was started under, or, where none was started, what
/// its previous output was made under (`output`: its name, and the
/// `embedjob.*` keys it recorded): the refusals [`JobState::open`] and
/// [`JobState::reuse`] give once the service has told the rest of the
/// fingerprint, with nothing paid for first (a window probe). A record that
/// cannot be read is left to those.
pub fn check_settled(
    location: &StateLocation,
    settled: &Settled,
    (output, recorded): (&str, &BTreeMap<String, String>),
) -> Result<(), StateError> {
    let (what, earlier) = match checkpoint::started_under(location) {
        Some(started) => (location.checkpoint().display().to_string(), started),
        None => match recorded
            .get(FINGERPRINT_KEY)
            .and_then(|text| Fingerprint::from_json(text))
        {
            Some(made) => (output.to_string(), made),
            None => return Ok(()),
        },
    };
    let differences = settled.differences(&earlier);
    if differences.is_empty() {
        Ok(())
    } else {
        Err(StateError::Changed { what, differences })
    }
}

/// [`JobState::reuse`] without the lock or any change on disk, for a look at
/// what a run would find (`estimate`).
pub fn peek(
    job_name: &str,
    location: &StateLocation,
    fingerprint: &Fingerprint,
    held: Option<Box<dyn StoredRows>>,
    fresh: bool,
) -> Result<Reuse, StateError> {
    let mut found = Reuse::default();
    peek_into(&mut found, job_name, location, fingerprint, held, fresh)?;
    Ok(found)
}

/// [`peek`], adding what it finds to `found`: the state of each shard of a
/// split job, for an estimate of the whole job.
pub fn peek_into(
    found: &mut Reuse,
    job_name: &str,
    location: &StateLocation,
    fingerprint: &Fingerprint,
    held: Option<Box<dyn StoredRows>>,
    fresh: bool,
) -> Result<(), StateError> {
    if fresh {
        return Ok(());
    }
    let checkpoint = Checkpoint::read(job_name, location, fingerprint)?;
    if let Some(reason) = checkpoint.damaged() {
        found.warnings.push(format!(
            "{}: {reason}; a run will discard it and embed its chunks again",
            checkpoint.dir().display()
        ));
    }
    reuse_into(found, &checkpoint, held, fresh, false)
}

/// A previous output made under another fingerprint is refused, unless
/// `fresh` (it is then ignored) or the checkpoint shows a fresh start under
/// this fingerprint has begun (it is being replaced, not reused).
///
/// Nothing damaged is reused: a previous output or a checkpoint part whose
/// vectors fail their checksum, or a part made under another fingerprint, is
/// passed over with a warning naming it, and its chunks are embedded again.
/// With `discard`, such parts are removed.
fn reuse_into(
    reuse: &mut Reuse,
    checkpoint: &Checkpoint,
    held: Option<Box<dyn StoredRows>>,
    fresh: bool,
    discard: bool,
) -> Result<(), StateError> {
    if let (false, Some(mut held)) = (fresh, held) {
        let differences = match held.metadata().get(FINGERPRINT_KEY) {
            Some(text) => match Fingerprint::from_json(text) {
                Some(earlier) => checkpoint.fingerprint().differences(&earlier),
                None => vec![format!("its {} metadata cannot be read", FINGERPRINT_KEY)],
            },
            None => vec![format!(
                "it has no {} metadata, so its vectors cannot be matched to this job",
                FINGERPRINT_KEY
            )],
        };
        if differences.is_empty() {
            match held.verify() {
                Ok(()) => {
                    reuse
                        .store
                        .add(held, Origin::Previous, Some(&mut reuse.held_ids))?;
                }
                Err(e) => reuse.warnings.push(format!(
                    "{e}; its vectors are not reused, and its chunks are embedded again"
                )),
            }
        } else if !checkpoint.is_started() {
            return Err(StateError::Changed {
                what: held.name(),
                differences,
            });
        }
    }
    for part in checkpoint.parts() {
        let added = checked_part(part, checkpoint.fingerprint())
            .and_then(|rows| reuse.store.add(rows, Origin::Checkpoint, None));
        if let Err(e) = added {
            reuse
                .warnings
                .push(discard_part(part, &e.to_string(), discard));
        }
    }
    Ok(())
}

/// A checkpoint part, if it was made under `fingerprint` and its vectors
/// match their checksum.
fn checked_part(part: &Path, fingerprint: &Fingerprint) -> Result<Box<dyn StoredRows>, StoreError> {
    let mut rows = ParquetRows::open(part)?;
    let made_under = rows
        .metadata()
        .get(FINGERPRINT_KEY)
        .and_then(|text| Fingerprint::from_json(text));
    let differences = match &made_under {
        Some(earlier) => fingerprint.differences(earlier),
        None => vec![format!("it records no readable {FINGERPRINT_KEY}")],
    };
    if !differences.is_empty() {
        return Err(StoreError::corrupt(
            part.display().to_string(),
            format!(
                "it was made under another configuration ({})",
                differences.join("; ")
            ),
        ));
    }
    rows.verify()?;
    Ok(Box::new(rows))
}

/// Passes over a damaged part, removing it with `discard`; returns the warning.
fn discard_part(part: &Path, reason: &str, discard: bool) -> String {
    let action = if discard {
        match std::fs::remove_file(part) {
            Ok(()) => "discarded",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "discarded",
            Err(_) => "passed over (it could not be removed)",
        }
    } else {
        "to be discarded"
    };
    format!("checkpoint part {action}, its chunks are embedded again: {reason}")
}

/// Writes `value` as the job's summary, whole or not at all, with no key in
/// it (see [`crate::secret`]).
pub fn write_summary(
    location: &StateLocation,
    value: &serde_json::Value,
) -> Result<(), StateError> {
    let clean = crate::secret::scrub_json(value);
    Ok(fsio::write_json_atomically(&location.summary(), &clean)?)
}

/// The most of a summary file read back: a run's summary is a few
/// kilobytes; a larger file is not one embedjob wrote.
const MAX_SUMMARY_BYTES: u64 = 1 << 20;

/// The summary the job's last run wrote, whatever its end: none when there
/// is none, it cannot be read, or it is larger than [`MAX_SUMMARY_BYTES`].
/// It is read without the lock, as a whole file (summaries are written
/// whole or not at all).
pub fn last_summary(location: &StateLocation) -> Option<serde_json::Value> {
    use std::io::Read as _;
    let file = std::fs::File::open(location.summary()).ok()?;
    let mut text = Vec::new();
    file.take(MAX_SUMMARY_BYTES + 1)
        .read_to_end(&mut text)
        .ok()?;
    if text.len() as u64 > MAX_SUMMARY_BYTES {
        return None;
    }
    serde_json::from_slice(&text).ok()
}

/// [`write_summary`] for a run that did not open the job's state: under the
/// job's lock, taken for the while. Returns `false`, writing nothing, when
/// another run holds the lock: its summary is its own to write.
pub fn write_summary_unlocked(
    location: &StateLocation,
    value: &serde_json::Value,
) -> Result<bool, StateError> {
    let lock = match JobLock::acquire(&location.lock()) {
        Ok(lock) => lock,
        Err(StateError::Locked { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    write_summary(location, value)?;
    drop(lock);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_summary_is_read_back_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let location = StateLocation::beside(&dir.path().join("docs.parquet"));
        assert_eq!(last_summary(&location), None, "none written");
        let summary = serde_json::json!({"model": "m", "learned_limits": {}});
        write_summary(&location, &summary).unwrap();
        assert_eq!(last_summary(&location), Some(summary));
        std::fs::write(location.summary(), b"{\"model\": ").unwrap();
        assert_eq!(last_summary(&location), None, "cut short");
        let large = format!("{{\"padding\": \"{}\"}}", " ".repeat(1 << 20));
        std::fs::write(location.summary(), large).unwrap();
        assert_eq!(last_summary(&location), None, "larger than a summary");
    }

    #[test]
    fn a_changed_job_file_is_checked_against_the_checkpoint_started_else_the_output() {
        let dir = tempfile::tempdir().unwrap();
        let job = |chunking: &str| {
            let text = format!(
                "[source]\nkind = \"files\"\npaths = [\"unused\"]\n\
                 [chunking]\n{chunking}\n[backend]\nkind = \"local\"\n\
                 [output]\npath = \"out.parquet\"\n"
            );
            crate::kinds::parse(&text, "job", &[]).unwrap()
        };
        let location = StateLocation::beside(&dir.path().join("out.parquet"));
        let (plain, markdown) = (job(""), job("markdown = true"));
        let made = |job: &Job| Fingerprint::new(job, "m", Some(8), Some(256));
        let output =
            |job: &Job| BTreeMap::from([(FINGERPRINT_KEY.to_string(), made(job).to_json())]);
        let check = |job: &Job, recorded: &BTreeMap<String, String>| {
            check_settled(&location, &Settled::of(job), ("out.parquet", recorded))
        };
        // No checkpoint: the output's record decides.
        check(&plain, &output(&plain)).unwrap();
        check(&plain, &BTreeMap::new()).unwrap();
        let refused = check(&markdown, &output(&plain)).unwrap_err().to_string();
        assert!(
            refused.starts_with("out.parquet was made with a different configuration"),
            "{refused}"
        );
        // A record that cannot be read is left to the run.
        let unreadable = BTreeMap::from([(FINGERPRINT_KEY.to_string(), "{".to_string())]);
        check(&markdown, &unreadable).unwrap();
        // A checkpoint started under the changed job replaces the output.
        Checkpoint::open("job", &location, &made(&markdown), false)
            .unwrap()
            .create()
            .unwrap();
        check(&markdown, &output(&plain)).unwrap();
        let refused = check(&plain, &output(&plain)).unwrap_err().to_string();
        assert!(
            refused.starts_with(&format!(
                "{} was made with a different configuration",
                location.checkpoint().display()
            )),
            "{refused}"
        );
        assert!(refused.contains("chunking.markdown"), "{refused}");
    }

    #[test]
    fn every_file_of_a_job_is_named_after_its_stem() {
        let location = StateLocation::beside(Path::new("out/docs.parquet"));
        assert_eq!(location.lock(), Path::new("out/docs.parquet.lock"));
        assert_eq!(
            location.checkpoint(),
            Path::new("out/docs.parquet.checkpoint")
        );
        assert_eq!(
            location.summary(),
            Path::new("out/docs.parquet.summary.json")
        );
        assert_eq!(
            location.failures(),
            Path::new("out/docs.parquet.failures.jsonl")
        );
    }
}
