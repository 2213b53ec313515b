//! Repeats: chunks whose text an earlier chunk of the same run was sent
//! with. Each gets its first copy's vector as soon as that vector is written,
//! so that a run of a million identical texts holds no more than one of
//! distinct ones.
//!
//! The writer ([`Repeats`]) finds the vector of a repeat's first copy among
//! a few recently repeated vectors or in the parts this run committed (the
//! part being written is committed first when it holds it); a repeat whose
//! first copy is still on its way waits for it. The reader takes a place at the [`RepeatGate`] for each
//! repeat it passes on, and the writer gives it back once the repeat is
//! written, so that the repeats waiting stay few.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::parquet_io::ParquetRows;
use crate::state::PartWriter;
use crate::store::{hash_key, Origin, Store};
use crate::types::{Chunk, EmbeddedBatch};

use super::RunError;

/// Repeats that may wait for their first copy at once.
pub(super) const MAX_WAITING: usize = 4096;

/// Vectors of repeated texts kept at hand.
const KEPT_VECTORS: usize = 256;

/// Places for repeats waiting at the writer.
#[derive(Debug, Default)]
pub(super) struct RepeatGate {
    waiting: Mutex<usize>,
    freed: Condvar,
    closed: AtomicBool,
}

impl RepeatGate {
    pub(super) fn new() -> Arc<RepeatGate> {
        Arc::new(RepeatGate::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place if one is free.
    pub(super) fn try_enter(&self) -> bool {
        let mut waiting = self.lock();
        if *waiting < MAX_WAITING || self.closed.load(Ordering::Relaxed) {
            *waiting += 1;
            return true;
        }
        false
    }

    /// Waits for a place; `false` once the run wants nothing more.
    pub(super) fn enter(&self, halt: &AtomicBool) -> bool {
        let mut waiting = self.lock();
        loop {
            if halt.load(Ordering::Relaxed) || self.closed.load(Ordering::Relaxed) {
                return false;
            }
            if *waiting < MAX_WAITING {
                *waiting += 1;
                return true;
            }
            waiting = self
                .freed
                .wait_timeout(waiting, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Gives back `n` places.
    pub(super) fn leave(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut waiting = self.lock();
        *waiting = waiting.saturating_sub(n);
        drop(waiting);
        self.freed.notify_all();
    }

    /// The writer is gone: nobody waits any more.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.freed.notify_all();
    }
}

/// How a repeat is settled.
pub(super) enum Settled {
    /// Its first copy's vector.
    Vector(Arc<[f32]>),
    /// Its first copy was quarantined, for this reason.
    Quarantined(String, Option<u16>),
}

/// The writer's side: where the first copies' vectors are, and the repeats
/// waiting for theirs.
#[derive(Default)]
pub(super) struct Repeats {
    /// Repeats whose first copy has not been written yet, by content key.
    waiting: HashMap<u128, Vec<Chunk>>,
    /// Vectors of texts that were repeated, a few of them.
    kept: HashMap<u128, Arc<[f32]>>,
    /// Quarantined first copies, by content key.
    quarantined: HashMap<u128, (String, Option<u16>)>,
    /// This run's committed parts, indexed when a repeat needs one.
    store: Store,
    indexed_parts: usize,
}

impl Repeats {
    /// The repeats that waited for the vectors of a batch just written,
    /// each with its vector.
    pub(super) fn written(&mut self, batch: &EmbeddedBatch) -> Vec<(Chunk, Arc<[f32]>)> {
        let mut settled = Vec::new();
        if self.waiting.is_empty() {
            return settled;
        }
        for (chunk, vector) in batch.chunks.iter().zip(batch.vectors.rows()) {
            let key = hash_key(&chunk.content_hash);
            if let Some(chunks) = self.waiting.remove(&key) {
                let vector: Arc<[f32]> = Arc::from(vector);
                self.keep(key, Arc::clone(&vector));
                settled.extend(chunks.into_iter().map(|c| (c, Arc::clone(&vector))));
            }
        }
        settled
    }

    /// Records a quarantined first copy; returns the repeats that waited for it.
    pub(super) fn quarantined(
        &mut self,
        chunk: &Chunk,
        reason: &str,
        status: Option<u16>,
    ) -> Vec<Chunk> {
        let key = hash_key(&chunk.content_hash);
        self.quarantined.insert(key, (reason.to_string(), status));
        self.waiting.remove(&key).unwrap_or_default()
    }

    /// How `chunk` is settled now, if it can be: `None` keeps it waiting
    /// for its first copy. The vector is read back from this run's `parts`.
    pub(super) fn settle(
        &mut self,
        chunk: Chunk,
        parts: &mut PartWriter,
    ) -> Result<Option<(Chunk, Settled)>, RunError> {
        let key = hash_key(&chunk.content_hash);
        if let Some((reason, status)) = self.quarantined.get(&key) {
            let settled = Settled::Quarantined(reason.clone(), *status);
            return Ok(Some((chunk, settled)));
        }
        if let Some(vector) = self.kept.get(&key) {
            return Ok(Some((chunk, Settled::Vector(Arc::clone(vector)))));
        }
        if !self.waiting.contains_key(&key) {
            if parts.holds_uncommitted(key) {
                parts.commit()?;
            }
            if let Some(vector) = self.read_back(&chunk, parts)? {
                self.keep(key, Arc::clone(&vector));
                return Ok(Some((chunk, Settled::Vector(vector))));
            }
        }
        self.waiting.entry(key).or_default().push(chunk);
        Ok(None)
    }

    /// One of the repeats still waiting, if any.
    pub(super) fn any_waiting(&self) -> Option<&Chunk> {
        self.waiting.values().flatten().next()
    }

    fn keep(&mut self, key: u128, vector: Arc<[f32]>) {
        if self.kept.len() >= KEPT_VECTORS && !self.kept.contains_key(&key) {
            self.kept.clear();
        }
        self.kept.insert(key, vector);
    }

    /// The vector of `chunk`'s text in the committed `parts`, checked
    /// against its full content hash.
    fn read_back(
        &mut self,
        chunk: &Chunk,
        parts: &PartWriter,
    ) -> Result<Option<Arc<[f32]>>, RunError> {
        let parts = parts.committed();
        for part in &parts[self.indexed_parts.min(parts.len())..] {
            let rows = ParquetRows::open(part)?;
            self.store.add(Box::new(rows), Origin::Checkpoint, None)?;
        }
        self.indexed_parts = parts.len();
        let Some((location, _)) = self.store.locate(&chunk.content_hash) else {
            return Ok(None);
        };
        let values = self.store.fetch(&[(location, chunk.content_hash)])?;
        Ok(Some(Arc::from(values)))
    }
}
