//! The Batch API, as OpenAI serves it: files uploaded for `purpose=batch`,
//! batches of `/v1/embeddings` requests run on a compressed clock, and their
//! output and error files, with the faults a client of it must survive.
//!
//! Files live in a temporary directory, never whole in memory: an upload is
//! written as it arrives, a batch reads its input a line at a time, and a
//! file's content is sent in chunks as it is read.

mod files;
mod lifecycle;
mod lines;
mod multipart;
mod routes;
mod validate;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub(crate) use routes::{
    cancel_batch, create_batch, delete_file, file_content, get_batch, get_file, list_batches,
    upload_file,
};

use crate::simulate::handlers::Shared;
use files::StoredFile;
use lifecycle::Batch;

/// The largest file the Batch API takes: 200 MB.
pub const MAX_BATCH_FILE_BYTES: u64 = 200 * 1_000_000;
/// The most lines of a batch's input file.
pub const MAX_BATCH_LINES: usize = 50_000;
/// The most embedding inputs across all lines of one batch.
pub const MAX_BATCH_INPUTS: u64 = 50_000;

/// How the Batch API behaves: its clock, limits and faults.
///
/// Faults that name "the first N batches" count batches in the order they
/// were created since the simulator started, dropped creations included.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchConfig {
    /// How long a batch takes from creation to `completed`: a tenth
    /// validating, eight tenths in progress (its lines done evenly over that
    /// time), a tenth finalizing.
    pub duration: Duration,
    /// The enqueued-token quota of each model: a batch whose tokens, with
    /// those of the model's batches not yet finished, would pass it fails
    /// with `token_limit_exceeded`.
    pub enqueued_tokens: Option<u64>,
    /// The first N batches fail validation.
    pub fail_validation: u64,
    /// Probability that a line fails with a 500 (not billed), drawn from `--seed`.
    pub line_failures: f64,
    /// A batch expires this long after its creation: the lines done by
    /// then in its output file, the rest `batch_expired` in its error file.
    pub expire_after: Option<Duration>,
    /// Only the first N batches expire; `None`: every batch.
    pub expire_first: Option<u64>,
    /// The first N batches stay `in_progress`, half their lines done, until cancelled.
    pub stuck: u64,
    /// Output lines in the input's order; otherwise shuffled, as OpenAI
    /// promises no order.
    pub in_order: bool,
    /// The first N `POST /v1/batches` create the batch, then drop the connection unanswered.
    pub create_drop: u64,
    /// The largest file accepted.
    pub max_file_bytes: u64,
    /// The most lines of one batch.
    pub max_lines: usize,
    /// The most embedding inputs of one batch.
    pub max_inputs: u64,
    /// The most bytes of files kept at once; an upload beyond it is refused.
    pub max_stored_bytes: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            duration: Duration::from_secs(1),
            enqueued_tokens: None,
            fail_validation: 0,
            line_failures: 0.0,
            expire_after: None,
            expire_first: None,
            stuck: 0,
            in_order: false,
            create_drop: 0,
            max_file_bytes: MAX_BATCH_FILE_BYTES,
            max_lines: MAX_BATCH_LINES,
            max_inputs: MAX_BATCH_INPUTS,
            max_stored_bytes: 10 * 1024 * 1024 * 1024,
        }
    }
}

impl BatchConfig {
    pub(crate) fn problems(&self, problems: &mut Vec<String>) {
        if !(0.0..=1.0).contains(&self.line_failures) {
            problems.push(format!(
                "batch_line_failures must be between 0 and 1, got {}",
                self.line_failures
            ));
        }
        if self.max_lines == 0 || self.max_inputs == 0 || self.max_file_bytes == 0 {
            problems.push("the batch limits must be at least 1".to_string());
        }
    }

    /// Whether the batch created `seq`-th (from 0) expires.
    fn expires(&self, seq: u64) -> Option<Duration> {
        self.expire_after
            .filter(|_| self.expire_first.is_none_or(|first| seq < first))
    }
}

/// The files and batches of the Batch API, the state of its routes.
#[derive(Debug)]
pub(crate) struct Batches {
    shared: Arc<Shared>,
    config: BatchConfig,
    state: Mutex<State>,
    /// The directory files are kept in, made on the first upload.
    dir: PathBuf,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<String, Arc<StoredFile>>,
    /// Batches in the order of creation: the listing reads it backwards.
    batches: Vec<Batch>,
    /// Bytes of the files in `files`.
    stored_bytes: u64,
    /// Creations answered by dropping the connection so far.
    dropped_creates: u64,
}

impl Batches {
    pub fn new(shared: Arc<Shared>) -> Self {
        let config = shared.config.batches.clone();
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "embedjob-simulate-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::SeqCst)
        ));
        Batches {
            shared,
            config,
            state: Mutex::new(State::default()),
            dir,
            next_id: AtomicU64::new(1),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new id with `prefix`, unique in this simulator and unlike another run's.
    fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::SeqCst);
        format!("{prefix}{:08x}{n:016x}", std::process::id())
    }

    fn batch_mut<'a>(state: &'a mut State, id: &str) -> Option<&'a mut Batch> {
        state.batches.iter_mut().find(|batch| batch.id == id)
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        // The files are the simulator's alone; nothing else writes there.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Seconds since the Unix epoch, as the API's timestamps count.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
