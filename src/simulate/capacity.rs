//! A self-hosted server's capacity: `workers` compute at once, each request
//! for `base + per_1k_tokens × tokens / 1000`; requests beyond the workers
//! wait in a queue of at most `queue` (more are shed with a 503), so their
//! latency grows with it. A request is computed, and billed, whether or not
//! its client is still waiting, as llama-cpp-python and infinity do. The
//! workers can change once, after a number of requests: another client
//! arrives and takes some of them, or leaves.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The most workers and the longest queue a simulator takes.
pub const MAX_WORKERS: usize = 4096;

/// The capacity model's settings; `workers: None` turns it off.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityConfig {
    /// Requests computed at once.
    pub workers: Option<usize>,
    /// Time every request takes on a worker.
    pub base: Duration,
    /// Time per 1000 tokens (as billed) of a request, on top of `base`.
    pub per_1k_tokens: Duration,
    /// Count a request's tokens as a server that pads computes them: every
    /// input at the length of the request's longest (infinity, TEI and
    /// sentence-transformers on a CPU).
    pub padded: bool,
    /// Requests waiting for a worker beyond which more are shed (503).
    pub queue: usize,
    /// After this many embeddings requests received, the workers become `then`.
    pub change_after: Option<u64>,
    pub then: usize,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            workers: None,
            base: Duration::from_millis(10),
            per_1k_tokens: Duration::ZERO,
            padded: false,
            queue: 1024,
            change_after: None,
            then: 1,
        }
    }
}

impl CapacityConfig {
    pub(crate) fn problems(&self, problems: &mut Vec<String>) {
        let Some(workers) = self.workers else {
            return;
        };
        if !(1..=MAX_WORKERS).contains(&workers) {
            problems.push(format!(
                "capacity must be between 1 and {MAX_WORKERS}, got {workers}"
            ));
        }
        if self.change_after.is_some() && !(1..=MAX_WORKERS).contains(&self.then) {
            problems.push(format!(
                "capacity_then must be between 1 and {MAX_WORKERS}, got {}",
                self.then
            ));
        }
        if self.queue > 1_000_000 {
            problems.push(format!(
                "queue_limit must be at most 1000000, got {}",
                self.queue
            ));
        }
        let hour = Duration::from_secs(3600);
        if self.base > hour || self.per_1k_tokens > hour {
            problems.push("service times must be at most an hour".to_string());
        }
    }

    /// The time a request of `tokens` takes on a worker.
    #[allow(clippy::cast_precision_loss)]
    pub fn service_time(&self, tokens: u64) -> Duration {
        self.base
            + self
                .per_1k_tokens
                .mul_f64(tokens.min(10_000_000) as f64 / 1000.0)
    }
}

/// What the capacity model saw, for the ledger.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(default)]
pub struct CapacityStats {
    /// The most requests waiting for a worker at once.
    pub longest_queue: u64,
    /// Requests shed with a 503 because the queue was full.
    pub shed: u64,
    /// Milliseconds after the workers changed at which the last request
    /// that had waited longer than its own service time got a worker: how
    /// long the clients took to stop queueing; null before any change.
    pub queue_settled_ms: Option<u64>,
    /// Requests that started on a worker after the workers changed.
    pub after_change: u64,
}

/// The workers and their queue, shared by the requests.
#[derive(Debug)]
pub(crate) struct Capacity {
    config: CapacityConfig,
    workers: Arc<Semaphore>,
    received: AtomicU64,
    waiting: AtomicUsize,
    changed_at: Mutex<Option<Instant>>,
    stats: Mutex<CapacityStats>,
}

/// A request's place in the queue or on a worker; frees it when dropped.
pub(crate) struct Queued {
    capacity: Arc<Capacity>,
    waiting: bool,
    arrived: Instant,
    /// It came once the workers had changed.
    after_change: bool,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.waiting {
            self.capacity.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Capacity {
    pub(crate) fn new(config: CapacityConfig) -> Option<Arc<Capacity>> {
        let workers = config.workers?;
        Some(Arc::new(Capacity {
            workers: Arc::new(Semaphore::new(workers)),
            config,
            received: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            changed_at: Mutex::new(None),
            stats: Mutex::new(CapacityStats::default()),
        }))
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, CapacityStats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn snapshot(&self) -> CapacityStats {
        *self.stats()
    }

    pub(crate) fn reset(&self) {
        *self.stats() = CapacityStats::default();
    }

    /// Takes a place in the queue for a new request, or `None` when the
    /// queue is full; changes the workers when it is the request to.
    pub(crate) fn enqueue(self: &Arc<Self>) -> Option<Queued> {
        let n = self.received.fetch_add(1, Ordering::SeqCst) + 1;
        if self.config.change_after == Some(n) {
            self.change();
        }
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        let queued = Queued {
            capacity: Arc::clone(self),
            waiting: true,
            arrived: Instant::now(),
            after_change: self.config.change_after.is_some_and(|at| n >= at),
        };
        // Those computing hold workers; the rest wait.
        let in_queue = waiting.saturating_sub(self.workers.available_permits());
        if in_queue > self.config.queue {
            self.stats().shed += 1;
            return None;
        }
        let mut stats = self.stats();
        stats.longest_queue = stats.longest_queue.max(in_queue as u64);
        Some(queued)
    }

    /// The other client arrives (takes workers as they free up) or leaves.
    fn change(&self) {
        let before = self.config.workers.unwrap_or(1);
        let after = self.config.then;
        *self
            .changed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.stats().queue_settled_ms = Some(0);
        if after > before {
            self.workers.add_permits(after - before);
        } else if after < before {
            let workers = Arc::clone(&self.workers);
            let taken = u32::try_from(before - after).unwrap_or(u32::MAX);
            tokio::spawn(async move {
                if let Ok(permits) = workers.acquire_many_owned(taken).await {
                    permits.forget();
                }
            });
        }
    }

    /// The tokens a request is computed for: as billed, or `padded`.
    pub(crate) fn work(&self, billed: u64, padded: u64) -> u64 {
        if self.config.padded {
            padded
        } else {
            billed
        }
    }

    /// Waits for a worker, then computes a request of `tokens` for its
    /// service time plus `extra`.
    pub(crate) async fn compute(&self, mut queued: Queued, tokens: u64, extra: Duration) {
        let Ok(_worker) = self.workers.acquire().await else {
            return;
        };
        queued.waiting = false;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let service = self.config.service_time(tokens) + extra;
        let started = Instant::now();
        let changed_at = *self
            .changed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(changed_at) = changed_at.filter(|_| queued.after_change) {
            let mut stats = self.stats();
            stats.after_change += 1;
            if started.duration_since(queued.arrived) > service {
                let since = started.duration_since(changed_at).as_millis();
                stats.queue_settled_ms = Some(u64::try_from(since).unwrap_or(u64::MAX));
            }
        }
        tokio::time::sleep(service).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(workers: usize) -> CapacityConfig {
        CapacityConfig {
            workers: Some(workers),
            base: Duration::from_millis(100),
            per_1k_tokens: Duration::from_millis(10),
            queue: 3,
            ..CapacityConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_workers_wait_and_beyond_the_queue_are_shed() {
        let capacity = Capacity::new(config(2)).unwrap();
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let queued = capacity.enqueue().expect("2 workers and 3 waiting");
            let capacity = Arc::clone(&capacity);
            tasks.push(tokio::spawn(async move {
                capacity.compute(queued, 1000, Duration::ZERO).await;
                Instant::now()
            }));
        }
        tokio::task::yield_now().await;
        assert!(capacity.enqueue().is_none(), "a sixth is shed");
        let mut done = Vec::new();
        for task in tasks {
            done.push(task.await.unwrap().duration_since(start));
        }
        // 110 ms each, two at a time: the fifth finishes after three rounds.
        let round = Duration::from_millis(110);
        assert_eq!(done, [round, round, round * 2, round * 2, round * 3]);
        let stats = capacity.snapshot();
        assert_eq!(stats.shed, 1);
        assert_eq!(stats.longest_queue, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_workers_halve_after_a_number_of_requests() {
        let capacity = Capacity::new(CapacityConfig {
            change_after: Some(3),
            then: 1,
            queue: 10,
            ..config(2)
        })
        .unwrap();
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let queued = capacity.enqueue().unwrap();
            let capacity = Arc::clone(&capacity);
            tasks.push(tokio::spawn(async move {
                capacity.compute(queued, 0, Duration::ZERO).await;
                Instant::now().duration_since(start)
            }));
        }
        let mut done = Vec::new();
        for task in tasks {
            done.push(task.await.unwrap());
        }
        done.sort();
        let one = Duration::from_millis(100);
        // Two at first; once the first two finish, one worker is gone.
        assert_eq!(done, [one, one, one * 2, one * 3]);
        let stats = capacity.snapshot();
        assert_eq!(stats.after_change, 2, "requests 3 and 4");
        assert_eq!(
            stats.queue_settled_ms,
            Some(200),
            "the fourth waited 200 ms"
        );
    }
}
