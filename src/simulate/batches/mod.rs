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

pub(crate) use routes::{
    cancel_batch, create_batch, delete_file, file_content, get_batch, get_file, list_batches,
    list_files, upload_file,
};

use crate::simulate::config::BatchConfig;
use crate::simulate::handlers::Shared;
use files::StoredFile;
use lifecycle::Batch;

/// The most bytes of an upload's body: the largest file a batch takes and
/// its form's small fields; the route refuses more as a file too large.
pub(crate) fn upload_body_limit(max_file_bytes: u64) -> usize {
    let limit = max_file_bytes.saturating_add(multipart::FORM_OVERHEAD);
    usize::try_from(limit).unwrap_or(usize::MAX)
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
    /// Uploads answered by dropping the connection so far.
    dropped_uploads: u64,
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

    /// Whether this upload's answer is to be dropped (`--batch-upload-drop`).
    fn drop_upload(&self) -> bool {
        let mut state = self.state();
        let drop = state.dropped_uploads < self.config.upload_drop;
        state.dropped_uploads += u64::from(drop);
        drop
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
