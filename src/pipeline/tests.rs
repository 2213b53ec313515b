//! The pipeline with fake stages: a source of documents in memory, a
//! chunker by paragraphs, a backend that makes a vector from each text, and
//! a sink that keeps its rows in memory, as a table would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::*;
use crate::backend::BackendKind;
use crate::backend::{BackendInfo, BackendStats};
use crate::contract::FINGERPRINT_KEY;
use crate::sink::SinkReport;
use crate::source::SourceStats;
use crate::state::StateLocation;
use crate::store::{ReadRow, Row, StoredRows};
use crate::types::{
    content_hash, Chunk, Document, EmbeddedBatch, OutputMetadata, RawVectors, Usage, Vectors,
};

struct Documents(std::vec::IntoIter<Document>, SourceStats);

impl Source for Documents {
    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        let next = self.0.next();
        self.1.documents += u64::from(next.is_some());
        Ok(next)
    }

    fn stats(&self) -> SourceStats {
        self.1
    }
}

fn documents(docs: &[(&str, &str)]) -> Box<dyn Source> {
    let docs: Vec<Document> = docs
        .iter()
        .map(|(id, text)| Document {
            doc_id: (*id).to_string(),
            source: Arc::from("memory"),
            text: (*text).to_string(),
            metadata: None,
        })
        .collect();
    Box::new(Documents(docs.into_iter(), SourceStats::default()))
}

/// One chunk per paragraph; a word is a token.
struct Paragraphs;

impl Chunker for Paragraphs {
    fn chunk(&self, document: &Document) -> Vec<Chunk> {
        let mut start = 0;
        let mut chunks = Vec::new();
        for (i, text) in document.text.split("\n\n").enumerate() {
            chunks.push(Chunk {
                id: format!("{}#{i}", document.doc_id),
                doc_id: Arc::from(document.doc_id.as_str()),
                source: Arc::clone(&document.source),
                chunk_index: u32::try_from(i).unwrap(),
                byte_start: start as u64,
                byte_end: (start + text.len()) as u64,
                text: text.to_string(),
                content_hash: content_hash(text),
                token_count: u32::try_from(self.count_tokens(text)).unwrap(),
                metadata: None,
            });
            start += text.len() + 2;
        }
        chunks
    }

    fn count_tokens(&self, text: &str) -> usize {
        text.split_whitespace().count()
    }
}

/// The vector the fake backend makes for a text.
fn vector_of(text: &str) -> [f32; 2] {
    [text.len() as f32, f32::from(text.as_bytes()[0])]
}

/// Makes vectors from texts; refuses requests of more than `max_inputs`,
/// and any request holding `refused`, as too large.
struct Texts {
    info: BackendInfo,
    max_inputs: usize,
    refused: Option<&'static str>,
    sent: Mutex<Vec<Vec<String>>>,
    /// When watched: the run's checkpoint, and what was paid for and not committed.
    exposure: Option<Exposed>,
    /// A request holding this text fails for good.
    failing: Option<&'static str>,
}

/// Texts answered or in flight that the checkpoint did not hold yet, seen
/// as each request is sent: what a kill at that instant would lose.
#[derive(Default)]
struct Exposed {
    checkpoint: std::path::PathBuf,
    in_flight: std::sync::atomic::AtomicU64,
    answered: std::sync::atomic::AtomicU64,
    most: std::sync::atomic::AtomicU64,
}

impl Exposed {
    /// Rows in the checkpoint's committed parts.
    fn committed(&self) -> u64 {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let Ok(entries) = std::fs::read_dir(&self.checkpoint) else {
            return 0;
        };
        entries
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with("part-") && name.ends_with(".parquet")
            })
            .map(|path| {
                let file = std::fs::File::open(path).unwrap();
                let reader = SerializedFileReader::new(file).unwrap();
                u64::try_from(reader.metadata().file_metadata().num_rows()).unwrap()
            })
            .sum()
    }

    fn sending(&self, texts: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let in_flight = self.in_flight.fetch_add(texts, SeqCst) + texts;
        let exposed = self.answered.load(SeqCst) + in_flight - self.committed();
        self.most.fetch_max(exposed, SeqCst);
    }

    fn answered(&self, texts: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.answered.fetch_add(texts, SeqCst);
        self.in_flight.fetch_sub(texts, SeqCst);
    }
}

impl Texts {
    fn new(max_inputs: usize, refused: Option<&'static str>) -> Arc<Texts> {
        Arc::new(Texts {
            info: BackendInfo {
                kind: BackendKind::Local,
                model: "fake".into(),
                dimensions: Some(2),
                context_window: None,
                input_per_1k: None,
                output_per_1k: None,
                other_input_per_1k: None,
                special_tokens: 0,
                max_inputs_per_request: None,
            },
            max_inputs,
            refused,
            sent: Mutex::default(),
            exposure: None,
            failing: None,
        })
    }

    /// A backend on which any request holding `failing` fails for good.
    fn failing(max_inputs: usize, failing: &'static str) -> Arc<Texts> {
        let mut texts = Arc::into_inner(Texts::new(max_inputs, None)).unwrap();
        texts.failing = Some(failing);
        Arc::new(texts)
    }

    /// A backend that watches what the checkpoint at `checkpoint` holds.
    fn watching(max_inputs: usize, checkpoint: std::path::PathBuf) -> Arc<Texts> {
        let mut texts = Arc::into_inner(Texts::new(max_inputs, None)).unwrap();
        texts.exposure = Some(Exposed {
            checkpoint,
            ..Exposed::default()
        });
        Arc::new(texts)
    }

    fn sent(&self) -> Vec<Vec<String>> {
        self.sent.lock().unwrap().clone()
    }
}

impl EmbeddingBackend for Texts {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [&'a str],
        tokens: u64,
    ) -> BoxFuture<'a, Result<Vectors, BackendError>> {
        Box::pin(async move {
            let refused = self.refused.is_some_and(|r| texts.contains(&r));
            if texts.len() > self.max_inputs || refused {
                return Err(BackendError::TooLarge {
                    status: Some(413),
                    message: "too large".into(),
                });
            }
            if self.failing.is_some_and(|f| texts.contains(&f)) {
                return Err(BackendError::Permanent {
                    status: Some(400),
                    message: "refused".into(),
                });
            }
            self.sent
                .lock()
                .unwrap()
                .push(texts.iter().map(|t| (*t).to_string()).collect());
            if let Some(exposure) = &self.exposure {
                exposure.sending(texts.len() as u64);
                // A moment in flight, so that requests overlap.
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                exposure.answered(texts.len() as u64);
            }
            let vectors = texts.iter().map(|t| vector_of(t).to_vec()).collect();
            let usage = Usage {
                prompt_tokens: tokens,
                completion_tokens: 0,
                total_tokens: tokens,
            };
            crate::validate::check(RawVectors::in_order(vectors, usage), texts.len(), Some(2))
                .map_err(|e| BackendError::Permanent {
                    status: None,
                    message: e.to_string(),
                })
        })
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            requests: self.sent.lock().unwrap().len() as u64,
            ..BackendStats::default()
        }
    }
}

/// A table's rows by id: the chunk, its vector, and the fingerprint and
/// calls of the last run.
#[derive(Default)]
struct TableState {
    rows: BTreeMap<String, (Chunk, Vec<f32>)>,
    fingerprint: Option<String>,
    written: Vec<String>,
    removed: Vec<String>,
    /// How long each write takes, as a slow table's would.
    write_delay: std::time::Duration,
}

/// A sink that keeps its rows from one run to the next, as a table does.
#[derive(Clone, Default)]
struct Table(Arc<Mutex<TableState>>);

struct TableSink {
    table: Table,
    pending: Vec<(Chunk, Vec<f32>)>,
    removals: Vec<String>,
}

impl Table {
    fn sink(&self) -> Box<dyn Sink> {
        Box::new(TableSink {
            table: self.clone(),
            pending: Vec::new(),
            removals: Vec::new(),
        })
    }

    fn rows(&self) -> BTreeMap<String, (String, Vec<f32>)> {
        let state = self.0.lock().unwrap();
        state
            .rows
            .iter()
            .map(|(id, (chunk, vector))| (id.clone(), (chunk.text.clone(), vector.clone())))
            .collect()
    }

    fn last_run(&self) -> (Vec<String>, Vec<String>) {
        let state = self.0.lock().unwrap();
        (state.written.clone(), state.removed.clone())
    }
}

impl Sink for TableSink {
    fn target(&self) -> String {
        "table".into()
    }

    fn held(&self) -> Result<Option<Box<dyn StoredRows>>, SinkError> {
        let state = self.table.0.lock().unwrap();
        if state.rows.is_empty() {
            return Ok(None);
        }
        let mut metadata = BTreeMap::new();
        if let Some(fingerprint) = &state.fingerprint {
            metadata.insert(FINGERPRINT_KEY.to_string(), fingerprint.clone());
        }
        Ok(Some(Box::new(HeldRows {
            rows: state.rows.values().cloned().collect(),
            metadata,
        })))
    }

    fn keeps_rows(&self) -> bool {
        true
    }

    fn write(&mut self, batch: &EmbeddedBatch) -> Result<(), SinkError> {
        let delay = self.table.0.lock().unwrap().write_delay;
        std::thread::sleep(delay);
        for (chunk, vector) in batch.chunks.iter().zip(batch.vectors.rows()) {
            self.pending.push((chunk.clone(), vector.to_vec()));
        }
        Ok(())
    }

    fn remove(&mut self, ids: &[String]) -> Result<(), SinkError> {
        self.removals.extend_from_slice(ids);
        Ok(())
    }

    fn finish(self: Box<Self>, metadata: &OutputMetadata) -> Result<SinkReport, SinkError> {
        let mut state = self.table.0.lock().unwrap();
        for id in &self.removals {
            state.rows.remove(id);
        }
        state.written = self.pending.iter().map(|(c, _)| c.id.clone()).collect();
        state.removed.clone_from(&self.removals);
        let rows = self.pending.len() as u64;
        for (chunk, vector) in self.pending {
            state.rows.insert(chunk.id.clone(), (chunk, vector));
        }
        state.fingerprint = metadata.extra.get(FINGERPRINT_KEY).cloned();
        Ok(SinkReport {
            rows,
            warnings: Vec::new(),
        })
    }

    fn abort(self: Box<Self>) {}
}

struct HeldRows {
    rows: Vec<(Chunk, Vec<f32>)>,
    metadata: BTreeMap<String, String>,
}

impl StoredRows for HeldRows {
    fn name(&self) -> String {
        "table".into()
    }

    fn dimensions(&self) -> usize {
        2
    }

    fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    fn scan(&mut self, with_ids: bool, visit: &mut dyn FnMut(Row<'_>)) -> Result<(), StoreError> {
        for (chunk, _) in &self.rows {
            visit(Row {
                content_hash: chunk.content_hash,
                id: with_ids.then_some(chunk.id.as_str()),
            });
        }
        Ok(())
    }

    fn read(&mut self, rows: &[usize], found: &mut ReadRow<'_>) -> Result<(), StoreError> {
        for (k, &row) in rows.iter().enumerate() {
            let (chunk, vector) = &self.rows[row];
            found(k, &chunk.content_hash, vector);
        }
        Ok(())
    }
}

fn job(dir: &std::path::Path) -> Job {
    let text = format!(
        "[source]\nkind = \"files\"\npaths = [\"unused\"]\n\
         [chunking]\nmax_tokens = 64\noverlap_tokens = 0\n\
         [backend]\nkind = \"local\"\nmax_inputs_per_request = 2\nconcurrency = 2\n\
         [output]\npath = \"{}\"\n",
        dir.join("table").display()
    );
    crate::kinds::parse(&text, "fake", &[]).unwrap()
}

async fn run_with(
    job: &Job,
    docs: &[(&str, &str)],
    backend: Arc<Texts>,
    sink: Box<dyn Sink>,
) -> Summary {
    let fingerprint = Fingerprint::new(
        job,
        &backend.info().model,
        backend.info().dimensions,
        backend.info().chunk_window(),
    );
    let state =
        JobState::open(&job.name, StateLocation::for_job(job), &fingerprint, false).unwrap();
    let stages = Stages {
        input_ids: None,
        source: documents(docs),
        chunker: Arc::new(Paragraphs),
        backend,
        sink,
    };
    execute(job, stages, state, RunOptions::default())
        .await
        .unwrap()
}

fn expected(docs: &[(&str, &str)]) -> BTreeMap<String, (String, Vec<f32>)> {
    let mut rows = BTreeMap::new();
    for (id, text) in docs {
        for (i, paragraph) in text.split("\n\n").enumerate() {
            let vector = vector_of(paragraph).to_vec();
            rows.insert(format!("{id}#{i}"), (paragraph.to_string(), vector));
        }
    }
    rows
}

#[tokio::test]
async fn fake_stages_run_end_to_end_and_every_chunk_gets_its_own_vector() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let docs = [
        ("a", "alpha one\n\nalpha two words"),
        ("b", "beta\n\nalpha one"),
        ("c", "gamma ray"),
    ];
    let backend = Texts::new(2, None);
    let table = Table::default();
    let summary = run_with(&job, &docs, Arc::clone(&backend), table.sink()).await;

    assert_eq!(table.rows(), expected(&docs));
    let sent: Vec<String> = backend.sent().into_iter().flatten().collect();
    assert_eq!(
        sent.len(),
        4,
        "the repeated paragraph is sent once: {sent:?}"
    );
    assert!(backend.sent().iter().all(|request| request.len() <= 2));
    assert_eq!(
        (summary.chunks, summary.embedded, summary.deduplicated),
        (5, 4, 1)
    );
    assert_eq!((summary.written, summary.documents), (5, 3));
    assert_eq!(summary.exit(), Exit::Success);
    let location = StateLocation::for_job(&job);
    assert!(
        location.summary().exists(),
        "the summary is in the job's state"
    );
    assert!(!location.checkpoint().exists(), "the checkpoint is gone");
    assert!(!location.lock().exists(), "the lock is released");
}

#[tokio::test]
async fn a_sink_that_keeps_rows_is_sent_only_changes_and_told_what_to_remove() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let table = Table::default();
    let first = [
        ("a", "kept as it was"),
        ("b", "first of b\n\nsecond of b"),
        ("c", "c goes away"),
    ];
    run_with(&job, &first, Texts::new(8, None), table.sink()).await;

    let second = [
        ("a", "kept as it was"),
        ("b", "first of b, edited"),
        ("d", "d is new\n\nc goes away"),
    ];
    let backend = Texts::new(8, None);
    let summary = run_with(&job, &second, Arc::clone(&backend), table.sink()).await;

    assert_eq!(
        table.rows(),
        expected(&second),
        "the table equals a fresh run's"
    );
    // Sorted: a request holds its chunks by length, not in input order.
    let mut sent: Vec<String> = backend.sent().into_iter().flatten().collect();
    sent.sort();
    assert_eq!(sent, ["d is new", "first of b, edited"]);
    let (mut written, mut removed) = table.last_run();
    written.sort();
    removed.sort();
    assert_eq!(written, ["b#0", "d#0", "d#1"], "a#0 is held unchanged");
    assert_eq!(removed, ["b#1", "c#0"]);
    assert_eq!(
        (
            summary.unchanged,
            summary.changed,
            summary.added,
            summary.removed
        ),
        (2, 1, 1, 2)
    );
    assert_eq!(summary.written, 4, "three rows written, one kept");
}

#[tokio::test]
async fn a_request_too_large_is_split_and_a_chunk_refused_alone_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let docs = [
        ("a", "one\n\ntwo\n\npoison\n\nthree"),
        ("b", "four\n\npoison"),
    ];
    let backend = Texts::new(1, Some("poison"));
    let table = Table::default();
    let summary = run_with(&job, &docs, Arc::clone(&backend), table.sink()).await;

    assert!(backend.sent().iter().all(|request| request.len() == 1));
    assert_eq!(summary.quarantined, 2, "the poison and its repeat");
    assert_eq!(summary.exit(), Exit::Quarantined);
    let mut rows = expected(&docs);
    rows.retain(|_, (text, _)| text != "poison");
    assert_eq!(table.rows(), rows);
    let failures = StateLocation::for_job(&job).failures();
    let lines = std::fs::read_to_string(failures).unwrap();
    assert_eq!(lines.lines().count(), 2, "{lines}");
}

#[tokio::test]
async fn a_chunk_quarantined_on_a_rerun_leaves_the_table_as_a_fresh_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let table = Table::default();
    let first = [("a", "one\n\ntwo")];
    run_with(&job, &first, Texts::new(8, None), table.sink()).await;

    let second = [("a", "one\n\npoison")];
    let summary = run_with(&job, &second, Texts::new(8, Some("poison")), table.sink()).await;
    assert_eq!(summary.quarantined, 1);
    let mut rows = expected(&second);
    rows.retain(|_, (text, _)| text != "poison");
    assert_eq!(
        table.rows(),
        rows,
        "the old a#1 is gone, as from a fresh run"
    );
}

/// The writer committed a part only when no message waited (or at 4 MiB),
/// so behind a slow sink the answers of up to a channel's worth of requests
/// were paid for and not committed: a kill lost them all. A request is now
/// sent only while at most concurrency × max inputs texts wait for their
/// commit, so what a kill loses is at most twice that (the requests in
/// flight, and as many answered).
#[tokio::test]
async fn regression_a_slow_sink_let_a_channel_of_answers_wait_uncommitted() {
    for (delay_ms, documents) in [(4, 60), (0, 60), (8, 30)] {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path());
        // From `job`: 2 inputs a request, 2 requests at once.
        let (max_inputs, concurrency) = (2u64, 2u64);
        let checkpoint = StateLocation::for_job(&job).checkpoint();
        let backend = Texts::watching(2, checkpoint);
        let texts: Vec<String> = (0..documents)
            .map(|i| format!("paragraph {i} of a long document"))
            .collect();
        let text = texts.join("\n\n");
        let docs = [("a", text.as_str())];
        let table = Table::default();
        table.0.lock().unwrap().write_delay = std::time::Duration::from_millis(delay_ms);
        let summary = run_with(&job, &docs, Arc::clone(&backend), table.sink()).await;
        assert_eq!(summary.written, documents);
        let exposure = backend.exposure.as_ref().unwrap();
        let most = exposure.most.load(std::sync::atomic::Ordering::SeqCst);
        // In flight: `concurrency` requests of `max_inputs`; answered and not
        // committed: at most as many, or no request would be sent.
        let bound = 2 * concurrency * max_inputs;
        assert!(
            most <= bound,
            "{most} texts paid for and not committed (at most {bound}), sink {delay_ms} ms"
        );
        assert!(most >= max_inputs, "the watch saw the requests: {most}");
    }
}

/// A request split in half (its first half embedded, billed) whose second
/// half then failed for good lost the first half's vectors: the next run
/// paid for them again. They now reach the checkpoint.
#[tokio::test]
async fn regression_a_split_requests_first_half_was_dropped_when_the_second_failed() {
    // The failing text second of two, and last of a request split twice.
    for (text, failing) in [
        ("left\n\nright fails", "right fails"),
        ("one\n\ntwo\n\nthree fails", "three fails"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut job = job(dir.path());
        job.backend.shared.max_inputs_per_request = 4;
        let docs = [("a", text)];
        // Requests of one input at most: the batch is split down to single texts.
        let backend = Texts::failing(1, failing);
        let fingerprint = Fingerprint::new(
            &job,
            &backend.info().model,
            backend.info().dimensions,
            backend.info().chunk_window(),
        );
        let state =
            JobState::open(&job.name, StateLocation::for_job(&job), &fingerprint, false).unwrap();
        let stages = Stages {
            input_ids: None,
            source: documents(&docs),
            chunker: Arc::new(Paragraphs),
            backend: Arc::clone(&backend) as Arc<dyn EmbeddingBackend>,
            sink: Table::default().sink(),
        };
        let failed = execute(&job, stages, state, RunOptions::default()).await;
        assert!(failed.is_err(), "the run fails on {failing:?}");
        let paid: Vec<String> = backend.sent().into_iter().flatten().collect();
        assert!(!paid.is_empty(), "some halves were embedded");

        let again = Texts::new(8, None);
        let summary = run_with(&job, &docs, Arc::clone(&again), Table::default().sink()).await;
        assert_eq!(
            again.sent().concat(),
            [failing],
            "only the failed text is sent again"
        );
        assert_eq!(summary.resumed, paid.len() as u64);
    }
}

/// The writer committed a part each time no message waited, so answers that
/// came one at a time, as a paced run's do, each cost a part: two `fsync`s
/// while the run went, and a file the checkpoint's removal unlinked at its
/// end. Answers that come while it is idle are now committed together, once
/// `COMMIT_EVERY` has passed since the last commit, and still with no
/// further message needed.
#[tokio::test]
async fn answers_that_come_one_at_a_time_are_committed_together() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let info = Texts::new(2, None).info().clone();
    let fingerprint = Fingerprint::new(&job, &info.model, info.dimensions, info.chunk_window());
    let location = StateLocation::for_job(&job);
    let state = JobState::open(&job.name, location.clone(), &fingerprint, false).unwrap();
    // Before the writer exists: its commits count from its start.
    let started = std::time::Instant::now();
    let (committed_tx, mut committed) = tokio::sync::watch::channel(0u64);
    let writing = write::Writing::new(
        Table::default().sink(),
        state.part_writer(&info.model, "api", 1 << 20),
        state.failures(),
        repeats::RepeatGate::new(),
    )
    .with_exposure(committed_tx, u64::MAX);
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let writer = tokio::task::spawn_blocking(move || writing.run(rx));
    let answers = 20u64;
    for i in 0..answers {
        let text = format!("answer {i}");
        let chunk = Chunk {
            id: format!("d#{i}"),
            doc_id: Arc::from("d"),
            source: Arc::from("d"),
            chunk_index: u32::try_from(i).unwrap(),
            byte_start: 0,
            byte_end: 1,
            content_hash: content_hash(&text),
            text,
            token_count: 1,
            metadata: None,
        };
        let batch = EmbeddedBatch {
            chunks: vec![chunk],
            vectors: Vectors {
                dimensions: 2,
                values: vec![1.0, 2.0],
                usage: Usage::default(),
                discarded: Usage::default(),
            },
        };
        tx.send(write::SinkMessage::Embedded(batch)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let sending = started.elapsed();
    // Committed with no further message: the writer waits for one only until a commit is due.
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        committed.wait_for(|&rows| rows == answers),
    )
    .await
    .expect("the answers were committed with no further message")
    .unwrap();
    let parts = std::fs::read_dir(location.checkpoint())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("part-")
        })
        .count();
    // While the answers came, a commit at most every `COMMIT_EVERY` from
    // the writer's start; then the one that commits the last of them.
    let most = (sending.as_secs_f64() / write::COMMIT_EVERY.as_secs_f64()).floor() as usize + 1;
    assert!(
        (1..=most).contains(&parts),
        "{parts} parts for {answers} answers that came over {sending:?} (at most {most})"
    );
    drop(tx);
    writer.await.unwrap().unwrap();
}
