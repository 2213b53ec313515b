//! How a run shows its progress, always on stderr and never on stdout.
//!
//! On a terminal, a bar: chunks done (embedded, or reused without a
//! request), tokens per second, requests, retries and, once the whole input
//! has been read and the number of chunks is known, the length of the bar
//! and an ETA. Until then the bar has no length, since any total would be a
//! guess. The ETA comes from the rate of the last half minute ([`Eta`]), so
//! the bursts of a backend that answers a batch at a time do not make it
//! jump. Elsewhere (a pipe, a log file), a line every
//! `pipeline.progress_seconds`. `--quiet` shows neither.
//!
//! The pipeline drives a [`Progress`]: it wraps the chunker with
//! [`Progress::counting`] so that chunks are counted as they are read, calls
//! [`Progress::update`] on every tick of [`Progress::interval`], and
//! [`Progress::finish`] with the last numbers at the end.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::backend::BackendStats;
use crate::chunk::Chunker;
use crate::types::Chunk;
use crate::types::Document;
use crate::types::Usage;

/// How often the bar is refreshed.
const BAR_INTERVAL: Duration = Duration::from_millis(200);

/// How far back the rate behind the ETA looks.
const ETA_WINDOW_SECONDS: f64 = 30.0;
/// The least time the rate is measured over before an ETA is shown.
const ETA_MIN_SPAN_SECONDS: f64 = 2.0;

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// An indicatif bar on stderr, a terminal.
    Bar,
    /// A line on stderr every so often.
    Lines,
    /// Nothing (`--quiet`).
    Off,
}

impl Mode {
    /// `Off` unless `show`; then a bar if stderr is a terminal, else lines.
    pub fn for_stderr(show: bool) -> Mode {
        if !show {
            Mode::Off
        } else if std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Lines
        }
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Chunks embedded so far.
    pub chunks: u64,
    /// Tokens billed so far.
    pub tokens: u64,
    pub requests: u64,
    pub retries: u64,
    /// The input has been read to its end, so every chunk has been counted.
    pub reading_done: bool,
}

impl Snapshot {
    /// `chunks` embedded with `usage` billed so far, the backend's counters,
    /// and whether the input has been read to its end.
    pub fn of(chunks: u64, usage: &Usage, stats: &BackendStats, reading_done: bool) -> Self {
        Snapshot {
            chunks,
            tokens: usage.prompt_tokens,
            requests: stats.requests,
            retries: stats.retries,
            reading_done,
        }
    }
}

/// The progress display of one run.
pub struct Progress {
    mode: Mode,
    every: Duration,
    started: Instant,
    /// Chunks made from the input so far, counted by [`Counting`].
    read: Arc<AtomicU64>,
    bar: Option<ProgressBar>,
    bar_has_length: bool,
    eta: Eta,
    /// What the lines begin with: `embedjob`, or `embedjob shard 1/4`.
    name: String,
}

impl Progress {
    /// A display in `mode`; lines come every `every_seconds`.
    pub fn new(mode: Mode, every_seconds: f64) -> Self {
        let bar = (mode == Mode::Bar).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(unknown_length_style());
            bar
        });
        Progress {
            mode,
            every: Duration::try_from_secs_f64(every_seconds).unwrap_or(Duration::from_secs(5)),
            started: Instant::now(),
            read: Arc::new(AtomicU64::new(0)),
            bar,
            bar_has_length: false,
            eta: Eta::default(),
            name: "embedjob".to_string(),
        }
    }

    /// Lines that name the shard of the job they are about.
    #[must_use]
    pub fn for_shard(mut self, shard: Option<crate::job::Shard>) -> Self {
        if let Some(shard) = shard {
            self.name = format!("embedjob shard {shard}");
        }
        self
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn is_on(&self) -> bool {
        self.mode != Mode::Off
    }

    /// How often to call [`Progress::update`].
    pub fn interval(&self) -> Duration {
        match self.mode {
            Mode::Bar => BAR_INTERVAL,
            Mode::Lines | Mode::Off => self.every,
        }
    }

    /// `chunker`, counting the chunks it makes for this display.
    pub fn counting(&self, chunker: Arc<dyn Chunker>) -> Arc<dyn Chunker> {
        if self.mode == Mode::Off {
            return chunker;
        }
        Arc::new(Counting {
            inner: chunker,
            read: Arc::clone(&self.read),
        })
    }

    /// Shows `now`.
    pub fn update(&mut self, now: &Snapshot) {
        let read = self.read.load(Ordering::Relaxed);
        let elapsed = self.started.elapsed().as_secs_f64();
        #[allow(clippy::cast_precision_loss)]
        let tokens_per_second = if elapsed > 0.0 {
            now.tokens as f64 / elapsed
        } else {
            0.0
        };
        self.eta.observe(elapsed, now.chunks);
        let eta = now
            .reading_done
            .then(|| self.eta.seconds_left(read))
            .flatten()
            .map_or_else(|| "?".to_string(), crate::display::duration);
        match (self.mode, &self.bar) {
            (Mode::Bar, Some(bar)) => {
                let mut message = format!(
                    "{tokens_per_second:.0} tokens/s, {} req, {} retries",
                    now.requests, now.retries
                );
                if now.reading_done && !self.bar_has_length {
                    bar.set_length(read);
                    bar.set_style(known_length_style());
                    self.bar_has_length = true;
                } else if !now.reading_done {
                    message = format!("{read} read, {message}");
                }
                bar.set_message(message);
                bar.set_prefix(eta);
                bar.set_position(now.chunks);
            }
            (Mode::Lines, _) => {
                let (of, eta) = if now.reading_done {
                    (format!(" of {read}"), format!(", ETA {eta}"))
                } else {
                    (String::new(), String::new())
                };
                eprintln!(
                    "{}: {}{of} chunks done, {} ({tokens_per_second:.0}/s), {}, {}, {elapsed:.0}s{eta}",
                    self.name,
                    now.chunks,
                    crate::display::counted(now.tokens, "token"),
                    crate::display::counted(now.requests, "request"),
                    crate::display::count(now.retries, "retry", "retries"),
                );
            }
            _ => {}
        }
    }

    /// Shows `last` and leaves the bar there, on the screen, with the cursor
    /// on the next line so that what follows starts a line of its own.
    pub fn finish(&mut self, last: &Snapshot) {
        self.update(last);
        if let Some(bar) = self.bar.take() {
            // Not `finish`, which would fill the bar whether or not every chunk was embedded.
            bar.abandon();
            eprintln!();
        }
    }
}

/// The time left, from the rate of the last [`ETA_WINDOW_SECONDS`]: chunks
/// done over that window, not over the last tick (which jumps with every
/// burst and every pause) nor since the start (which lags behind a change).
#[derive(Debug, Default)]
pub struct Eta {
    /// (seconds since the start, chunks done), oldest first.
    samples: VecDeque<(f64, u64)>,
}

impl Eta {
    /// Notes that `done` chunks were done at `at` seconds.
    pub fn observe(&mut self, at: f64, done: u64) {
        self.samples.push_back((at, done));
        // Keep one sample at or before the window's start, so the window is whole.
        while self
            .samples
            .get(1)
            .is_some_and(|(t, _)| *t <= at - ETA_WINDOW_SECONDS)
        {
            self.samples.pop_front();
        }
    }

    /// Seconds until `total` chunks are done; `None` until the rate has been
    /// measured over [`ETA_MIN_SPAN_SECONDS`], or while nothing moves.
    pub fn seconds_left(&self, total: u64) -> Option<f64> {
        let (&(t0, d0), &(t1, d1)) = (self.samples.front()?, self.samples.back()?);
        if t1 - t0 < ETA_MIN_SPAN_SECONDS || d1 <= d0 {
            return None;
        }
        #[allow(clippy::cast_precision_loss)]
        let rate = (d1 - d0) as f64 / (t1 - t0);
        #[allow(clippy::cast_precision_loss)]
        Some(total.saturating_sub(d1) as f64 / rate)
    }
}

fn unknown_length_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{elapsed}] {pos} chunks done ({msg})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

fn known_length_style() -> ProgressStyle {
    ProgressStyle::with_template("[{elapsed}] {wide_bar} {pos}/{len} chunks, ETA {prefix} ({msg})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// A chunker that counts the chunks it makes.
struct Counting {
    inner: Arc<dyn Chunker>,
    read: Arc<AtomicU64>,
}

impl Chunker for Counting {
    fn chunk(&self, document: &Document) -> Vec<Chunk> {
        let chunks = self.inner.chunk(document);
        self.read.fetch_add(chunks.len() as u64, Ordering::Relaxed);
        chunks
    }

    fn chunk_each(&self, document: &Document, each: &mut dyn FnMut(Chunk) -> bool) {
        self.inner.chunk_each(document, &mut |chunk| {
            self.read.fetch_add(1, Ordering::Relaxed);
            each(chunk)
        });
    }

    fn count_tokens(&self, text: &str) -> usize {
        self.inner.count_tokens(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::TokenChunker;
    use crate::job::ChunkingConfig;

    #[test]
    fn quiet_is_off_whatever_stderr_is() {
        assert_eq!(Mode::for_stderr(false), Mode::Off);
        let progress = Progress::new(Mode::Off, 5.0);
        assert!(!progress.is_on());
    }

    #[test]
    fn lines_come_every_progress_seconds_and_the_bar_more_often() {
        assert_eq!(
            Progress::new(Mode::Lines, 2.5).interval(),
            Duration::from_millis(2500)
        );
        assert_eq!(Progress::new(Mode::Bar, 2.5).interval(), BAR_INTERVAL);
    }

    /// Regression: a backend that answers in bursts (a batch of the local
    /// model every few seconds) made the ETA jump from seconds to hours
    /// between two bursts.
    #[test]
    fn regression_the_eta_holds_steady_through_bursts_and_pauses() {
        let mut eta = Eta::default();
        let total = 3_000;
        let mut estimates = Vec::new();
        // 128 chunks every 4 s, seen every 0.2 s: a steady 32 chunks/s in bursts.
        for tick in 0..400u32 {
            let at = f64::from(tick) * 0.2;
            let done = u64::from(tick / 20) * 128;
            eta.observe(at, done.min(total));
            if let Some(left) = eta.seconds_left(total) {
                estimates.push((at, left));
            }
        }
        let late: Vec<f64> = estimates
            .iter()
            .filter(|(at, _)| *at >= 30.0)
            .map(|(at, left)| at + left)
            .collect();
        assert!(!late.is_empty());
        // Once the window is full, the predicted end stays within 15% of the real one (94 s).
        for end in &late {
            assert!(
                (80.0..=110.0).contains(end),
                "predicted end {end}: {late:?}"
            );
        }
        // No estimate before the rate is measured, and none while nothing moves.
        let mut fresh = Eta::default();
        fresh.observe(0.0, 0);
        fresh.observe(1.0, 10);
        assert_eq!(fresh.seconds_left(100), None);
        let mut stalled = Eta::default();
        stalled.observe(0.0, 50);
        stalled.observe(40.0, 50);
        assert_eq!(stalled.seconds_left(100), None);
    }

    #[test]
    fn the_counting_chunker_counts_what_it_makes() {
        let progress = Progress::new(Mode::Lines, 5.0);
        let inner: Arc<dyn Chunker> =
            Arc::new(TokenChunker::cl100k(&ChunkingConfig::default()).unwrap());
        let chunker = progress.counting(inner);
        let document = Document {
            doc_id: "a".into(),
            source: Arc::from("a.txt"),
            text: "One. Two. Three.".into(),
            metadata: None,
        };
        let made = chunker.chunk(&document).len() as u64;
        assert!(made > 0);
        assert_eq!(progress.read.load(Ordering::Relaxed), made);
    }
}
