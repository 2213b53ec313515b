//! A window nobody lists: servers that read only the start of a long input,
//! or refuse it in OpenAI's, TEI's, vLLM's or llama.cpp's words, and list
//! no window. A
//! job with the default chunking finds the window and cuts its chunks to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use embedjob::simulate::{self, Ledger, ServerWindow, SimConfig, Simulator};
use serde_json::Value;

use crate::support::{no_key, read_output, run_job, simulator, text, text_hash, Rows, KEY};

/// The window every model of these servers keeps, in the server's tokens.
const WINDOW: u64 = 256;

/// A server as infinity is run: routes at the root, no model route, a
/// listing without a window; and a window of [`WINDOW`] tokens.
pub(crate) fn unlisted(over: &str) -> SimConfig {
    SimConfig {
        url_prefix: String::new(),
        model_route: false,
        bare_listing: true,
        window: Some(ServerWindow::parse(&format!("{WINDOW}:{over}")).unwrap()),
        ..SimConfig::default()
    }
}

/// Prose of ordinary words and punctuation, documents of several default
/// (512-token) chunks each.
pub(crate) fn prose(dir: &Path) -> PathBuf {
    const WORDS: &[&str] = &[
        "river",
        "levels",
        "rose",
        "after",
        "the",
        "storm",
        "and",
        "engineers",
        "checked",
        "bridges",
        "along",
        "valley",
        "roads",
        "while",
        "farmers",
        "moved",
        "cattle",
        "to",
        "higher",
        "fields",
        "near",
        "old",
        "stone",
        "walls",
        "that",
        "had",
        "stood",
        "for",
        "centuries",
        "without",
        "serious",
        "damage",
        "from",
        "floods",
        "or",
        "frost",
    ];
    let root = dir.join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for doc in 0..6 {
        let mut body = String::new();
        for sentence in 0..(60 + doc * 15) {
            let length = 8 + (sentence * 7 + doc) % 11;
            let words: Vec<&str> = (0..length)
                .map(|w| WORDS[(sentence * 13 + w * 5 + doc * 3) % WORDS.len()])
                .collect();
            body.push_str(&words.join(" "));
            body.push_str(if sentence % 4 == 3 {
                ".\n\n"
            } else {
                ", then "
            });
        }
        std::fs::write(root.join(format!("report{doc}.txt")), body).unwrap();
    }
    root
}

/// A job over `root` with the default chunking.
fn job(dir: &Path, sim: &Simulator, root: &Path, extra: &str) -> PathBuf {
    let source = format!("kind = \"files\"\npaths = [\"{}\"]", root.display());
    job_reading(dir, sim, &source, extra)
}

/// A job whose `[source]` is `source`, with the default chunking.
fn job_reading(dir: &Path, sim: &Simulator, source: &str, extra: &str) -> PathBuf {
    let job = format!(
        r#"name = "window"
[source]
{source}
[backend]
kind = "api"
base_url = "{base_url}"
api_path = ""
model = "svc-embed-1"
concurrency = 4
max_retries = 3
timeout_seconds = 10
{extra}
[output]
path = "{out}"
"#,
        base_url = sim.base_url(),
        out = dir.join("out/result.parquet").display()
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, job).unwrap();
    path
}

/// Each row's text and vector by its id: rows are written as their answers
/// come, and a run that sends packs its chunks by length, so the order of
/// the rows is not the input's.
fn by_id(rows: &Rows) -> BTreeMap<&str, (&str, &[f32])> {
    let rows = rows.ids.iter().zip(&rows.texts).zip(&rows.vectors);
    rows.map(|((id, text), vector)| (id.as_str(), (text.as_str(), vector.as_slice())))
        .collect()
}

fn summary_of(output: &std::process::Output) -> Value {
    let (stdout, stderr) = no_key(output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}\n{stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// Every chunk of the output was read whole by the model: within its
/// window by the server's own count, never billed as read only in part,
/// and its vector that of its whole text.
fn assert_read_whole(rows: &Rows, ledger: &Ledger) {
    assert!(rows.texts.len() > 6, "several chunks a document");
    for (text, vector) in rows.texts.iter().zip(&rows.vectors) {
        let tokens = simulate::server_tokens(text);
        assert!(
            tokens <= WINDOW,
            "a chunk of {tokens} server tokens: {text}"
        );
        assert!(!ledger.partly_read.contains_key(&text_hash(text)), "{text}");
        assert_eq!(vector, &simulate::embedding_vector(1024, text));
    }
}

/// Runs the job twice: the first run finds the window and cuts every chunk
/// to it; the second resumes with nothing sent again.
async fn learns_the_window(over: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(unlisted(over)).await;
    let job = job(dir.path(), &sim, &root, "");
    let output = run_job(&job, &["--json"]).await;
    let summary = summary_of(&output);
    assert_eq!(summary["quarantined"], 0, "{over}: {summary}");
    let window = summary["learned_limits"]["context_window"].clone();
    assert!(
        window["tokens"].as_u64().unwrap() < 512,
        "{over}: {summary}"
    );
    assert_eq!(summary["tokenizer"], "cl100k_base");
    let rows = read_output(&dir.path().join("out/result.parquet"));
    let ledger = sim.ledger();
    assert_read_whole(&rows, &ledger);
    // What the probe was billed and what the chunks were make the whole bill.
    let probe = summary["learned_limits"]["window_probe"].clone();
    // The probe's vectors are dropped: they count as discarded, and no more.
    assert_eq!(summary["discarded_tokens"], probe["tokens"], "{summary}");
    assert_eq!(
        summary["usage"]["prompt_tokens"].as_u64().unwrap(),
        ledger.prompt_tokens,
        "{over}: {summary}"
    );
    let stderr = text(&output.stderr);
    assert!(stderr.contains("lists no context window"), "{stderr}");
    assert!(stderr.contains("cl100k_base tokens"), "{stderr}");
    // Counted in an encoding, the run says how to count as the model does.
    assert!(
        stderr.contains("set `chunking.tokenizer` to the model's own (\"bert-base-uncased\""),
        "{stderr}"
    );

    let metadata = &rows.metadata["embedjob.context_window"];
    assert!(
        metadata.contains("\"tokenizer\":\"cl100k_base\""),
        "{metadata}"
    );

    // The estimate and the second run cut the same chunks from the start,
    // to the window the output records: nothing is probed or sent again.
    let estimate = crate::support::json(
        &crate::support::embedjob(&["estimate", crate::support::path_arg(&job), "--json"]).await,
    );
    assert_eq!(estimate["context_window"], window["tokens"], "{estimate}");
    assert_eq!(estimate["chunks"], rows.ids.len() as u64, "{estimate}");
    assert_eq!(estimate["tokens"], 0, "{estimate}");
    let billed = sim.ledger().prompt_tokens;
    let requests = sim.ledger().embedding_requests;
    let again = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(again["embedded"], 0, "{over}: {again}");
    assert_eq!(again["unchanged"], rows.ids.len() as u64, "{again}");
    assert_eq!(again["learned_limits"]["context_window"], window);
    assert_eq!(again["learned_limits"]["window_probe"], Value::Null);
    let ledger = sim.ledger();
    assert_eq!(
        (ledger.prompt_tokens, ledger.embedding_requests),
        (billed, requests)
    );
    for text in &rows.texts {
        assert_eq!(ledger.texts.get(&text_hash(text)), Some(&1), "{text}");
    }
    let mut summary = summary;
    summary["probe"] = probe;
    summary
}

#[tokio::test]
async fn a_window_refused_in_openais_words_is_learned() {
    let summary = learns_the_window("openai").await;
    let window = &summary["learned_limits"]["context_window"];
    assert_eq!(window["server_tokens"], WINDOW, "{summary}");
    assert_eq!(window["from"], "refusal");
    // One request, refused, so not billed.
    assert_eq!(summary["probe"]["requests"], 1, "{summary}");
    assert_eq!(summary["probe"]["tokens"], 0, "{summary}");
}

#[tokio::test]
async fn a_window_refused_in_teis_words_is_learned() {
    let summary = learns_the_window("tei").await;
    assert_eq!(
        summary["learned_limits"]["context_window"]["server_tokens"],
        WINDOW
    );
    assert_eq!(summary["probe"]["requests"], 1, "{summary}");
}

#[tokio::test]
async fn a_window_refused_in_vllms_words_is_learned() {
    let summary = learns_the_window("vllm").await;
    assert_eq!(
        summary["learned_limits"]["context_window"]["server_tokens"],
        WINDOW
    );
    assert_eq!(summary["probe"]["requests"], 1, "{summary}");
}

/// llama.cpp's server refuses an input longer than its physical batch with
/// a 500, which no retry clears: before it was read as a refusal, the probe
/// and then every request were retried until their attempts ran out, and
/// the run exited 1 with nothing written.
#[tokio::test]
async fn a_window_refused_in_llama_cpps_words_is_learned_and_not_retried() {
    for over in ["llamacpp", "llamacpp-context"] {
        let summary = learns_the_window(over).await;
        let window = &summary["learned_limits"]["context_window"];
        assert_eq!(window["server_tokens"], WINDOW, "{over}: {summary}");
        assert_eq!(window["from"], "refusal");
        assert_eq!(summary["probe"]["requests"], 1, "{over}: {summary}");
        assert_eq!(summary["retries"], 0, "{over}: {summary}");
    }
}

/// The probe text is the shortest prefix of the job's prose that holds
/// 5/4 of the 512-token default chunk, 640 cl100k tokens: at most 642 (a
/// word of the prose, with its mark, is at most 3 tokens), in 214 ≤ n ≤ 640
/// words. A window found by the search over its n − 1 shorter prefixes
/// took one request; then two for each of at most two windows guessed
/// (`texts_guessed` of them billed, `requests_guessed` requests), which
/// this server, counting otherwise than a WordPiece model, does not keep;
/// then the binary search, which stops within ⌊n / 32⌋ of them, at most
/// ⌈log2(213 / 6)⌉ = 6, one text each. As many texts as the first request
/// billed and those, of at most 642 tokens, were billed, as the simulator
/// bills cl100k.
fn assert_searched(summary: &Value, from: &str, billed: u64, guessed: (u64, u64)) {
    let window = &summary["learned_limits"]["context_window"];
    assert_eq!(window["from"], from, "{summary}");
    assert_eq!(window["server_tokens"], Value::Null);
    let (texts_guessed, requests_guessed) = guessed;
    let requests = summary["probe"]["requests"].as_u64().unwrap();
    assert!(
        (2..=1 + requests_guessed + 6).contains(&requests),
        "{summary}"
    );
    let tokens = summary["probe"]["tokens"].as_u64().unwrap();
    let texts = billed + texts_guessed + 6;
    assert!(tokens > 0 && tokens <= texts * 642, "{summary}");
}

/// Older builds of llama.cpp's server refuse without saying the window: the
/// probe finds it as it finds where a truncating server stops reading, by a
/// binary search over the long text's prefixes, a prefix refused being past it.
#[tokio::test]
async fn a_window_refused_without_its_size_is_found_by_a_few_requests() {
    let summary = learns_the_window("llamacpp-bare").await;
    // Only the prefixes taken are billed, each in a request of its own, up
    // to the first refused.
    assert_searched(&summary, "refusal", 0, (4, 4));
    assert_eq!(summary["retries"], 0, "{summary}");
}

#[tokio::test]
async fn a_window_that_truncates_silently_is_found_by_a_few_requests() {
    let summary = learns_the_window("truncate").await;
    // The first request holds the text twice, each guess two prefixes.
    assert_searched(&summary, "truncation", 2, (4, 2));
}

#[tokio::test]
async fn a_server_that_reads_everything_costs_one_probe_request() {
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(SimConfig {
        window: None,
        ..unlisted("truncate")
    })
    .await;
    let job = job(dir.path(), &sim, &root, "");
    let output = run_job(&job, &["--json"]).await;
    let summary = summary_of(&output);
    assert_eq!(summary["learned_limits"]["context_window"], Value::Null);
    assert_eq!(summary["learned_limits"]["window_probe"]["requests"], 1);
    let stderr = text(&output.stderr);
    assert!(stderr.contains("is unknown"), "{stderr}");
    assert!(stderr.contains("reads a text longer"), "{stderr}");
    let recorded = &read_output(&dir.path().join("out/result.parquet")).metadata;
    let window: Value = serde_json::from_str(&recorded["embedjob.context_window"]).unwrap();
    let read = window["read_whole"].as_u64().unwrap();
    // The probe's text is the chunks' 512 tokens and a quarter.
    assert_eq!(read, 640, "{window}");
    assert_eq!(summary["learned_limits"]["read_whole"], 640, "{summary}");

    // The output records what the probe found: a later run, its chunks no
    // longer than that, does not probe again, nor warn, and keeps the record.
    std::fs::write(root.join("added.txt"), "A new report, short and plain.").unwrap();
    let before = sim.ledger().embedding_requests;
    let output = run_job(&job, &["--json"]).await;
    let again = summary_of(&output);
    assert_eq!(
        again["learned_limits"]["window_probe"],
        Value::Null,
        "{again}"
    );
    assert_eq!(again["embedded"], 1, "{again}");
    // The summary says so from the record.
    assert_eq!(again["learned_limits"]["read_whole"], 640, "{again}");
    assert_eq!(
        sim.ledger().embedding_requests - before,
        again["requests"].as_u64().unwrap()
    );
    let stderr = text(&output.stderr);
    assert!(!stderr.contains("is unknown"), "{stderr}");
    let recorded = &read_output(&dir.path().join("out/result.parquet")).metadata;
    assert_eq!(recorded["embedjob.context_window"], window.to_string());
    // Chunks longer than the text read whole are probed for again.
    let longer = self::job(dir.path(), &sim, &root, "[chunking]\nmax_tokens = 700");
    let summary = summary_of(&run_job(&longer, &["--json", "--fresh"]).await);
    assert_eq!(summary["learned_limits"]["window_probe"]["requests"], 1);

    // Told not to probe, it sends nothing before the run.
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let before = sim.ledger().embedding_requests;
    let job = self::job(dir.path(), &sim, &root, "probe_window = false");
    let summary = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(summary["learned_limits"]["window_probe"], Value::Null);
    assert_eq!(summary["learned_limits"]["read_whole"], Value::Null);
    assert_eq!(
        sim.ledger().embedding_requests - before,
        summary["requests"].as_u64().unwrap()
    );
}

/// A run that finds another run of the job holding its lock stops before
/// it asks the service anything: the window probe it would send is paid
/// for. Before, it looked the model up and probed, then found the lock.
#[tokio::test]
async fn a_run_that_overlaps_another_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(unlisted("truncate")).await;
    let job = job(dir.path(), &sim, &root, "");
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    let held =
        embedjob::state::JobLock::acquire(&dir.path().join("out/result.parquet.lock")).unwrap();
    let output = run_job(&job, &["--json"]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("another run of this job"), "{stderr}");
    let ledger = sim.ledger();
    assert_eq!(
        (ledger.requests, ledger.prompt_tokens),
        (0, 0),
        "nothing asked, nothing billed"
    );
    // Let go, the run probes for the window as any first run does.
    drop(held);
    let summary = summary_of(&run_job(&job, &["--json"]).await);
    let probe = &summary["learned_limits"]["window_probe"];
    assert!(
        probe["requests"].as_u64().is_some_and(|n| n > 1),
        "{summary}"
    );
}

/// Told not to probe, a run learns the window from the first refusals and
/// cuts each refused chunk to fit instead of quarantining it.
#[tokio::test]
async fn a_chunk_refused_during_the_run_is_cut_to_the_window_it_states() {
    for over in ["openai", "tei", "vllm", "llamacpp", "llamacpp-context"] {
        let dir = tempfile::tempdir().unwrap();
        let root = prose(dir.path());
        let sim = simulator(unlisted(over)).await;
        let job = job(dir.path(), &sim, &root, "probe_window = false");
        let output = run_job(&job, &["--json"]).await;
        let summary = summary_of(&output);
        assert_eq!(summary["quarantined"], 0, "{over}: {summary}");
        let window = &summary["learned_limits"]["context_window"];
        assert_eq!(window["server_tokens"], WINDOW, "{over}: {summary}");
        assert_eq!(window["from"], "refusal");
        assert_eq!(summary["learned_limits"]["window_probe"], Value::Null);
        let rows = read_output(&dir.path().join("out/result.parquet"));
        assert_read_whole(&rows, &sim.ledger());
        // Pieces of a refused chunk are named after it.
        assert!(
            rows.ids.iter().any(|id| id.ends_with("#0.1")),
            "{over}: {:?}",
            rows.ids
        );
    }
}

/// A window taught mid-run: the refused chunks were cut into pieces and
/// paid for. The next run over the same input, and its estimate, chunk as
/// the first run did and cut the chunks it holds no vector for into the same
/// pieces before sending anything: nothing is sent again, not even a
/// request the server refuses, and the output is the same.
#[tokio::test]
async fn pieces_cut_during_a_run_are_not_sent_again_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(unlisted("vllm")).await;
    let job = job(dir.path(), &sim, &root, "probe_window = false");
    let first = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(first["quarantined"], 0, "{first}");
    let out = dir.path().join("out/result.parquet");
    let rows = read_output(&out);
    assert!(
        rows.ids.iter().any(|id| id.ends_with("#0.1")),
        "{:?}",
        rows.ids
    );
    let ledger = sim.ledger();

    second_run_sends_nothing(&job, &sim, (&ledger, &first), &rows).await;
    let same = read_output(&out);
    assert_eq!(by_id(&same), by_id(&rows));
    assert_eq!(
        same.metadata["embedjob.context_window"],
        rows.metadata["embedjob.context_window"]
    );
}

/// Documents of long common words: one cl100k token each, two or three of
/// the simulated server's (a piece per 6 letters), after one of short
/// words, one of each: the probe measures the first, so that the dense
/// chunks cut to the probed window are refused. (The probe's text is the
/// input's densest pieces first, by words and marks over the local count:
/// a word is one however long, so these tie, and go in the input's order.)
fn dense(dir: &Path) -> PathBuf {
    const WORDS: &[&str] = &[
        "government",
        "development",
        "information",
        "community",
        "important",
        "everything",
        "different",
        "available",
        "education",
        "experience",
        "management",
        "performance",
        "environment",
        "technology",
        "particular",
        "especially",
    ];
    let root = dir.join("dense");
    std::fs::create_dir_all(&root).unwrap();
    // Words drawn by a linear congruential generator: no two chunks alike,
    // so no chunk repeats one refused before it.
    let mut state: u64 = 12345;
    for doc in 0..3 {
        let words: Vec<&str> = (0..(700 + doc * 200))
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                WORDS[(state >> 33) as usize % WORDS.len()]
            })
            .collect();
        std::fs::write(root.join(format!("dense{doc}.txt")), words.join(" ")).unwrap();
    }
    // Read first, plain words: the probe measures the server's count on
    // them, and the dense documents count more.
    let plain: Vec<&str> = (0..900).map(|w| ["the", "river", "rose"][w % 3]).collect();
    std::fs::write(root.join("a-plain.txt"), plain.join(" ")).unwrap();
    root
}

/// The probe finds a window, and chunks cut to it still count more of the
/// server's tokens than the probe text did: they are refused and cut during
/// the run. The next run chunks to the probed window and cuts those chunks
/// into the same pieces before sending: nothing is sent again.
#[tokio::test]
async fn pieces_cut_after_the_probe_are_not_sent_again_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = dense(dir.path());
    let sim = simulator(unlisted("tei")).await;
    let job = job(dir.path(), &sim, &root, "");
    let first = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(first["quarantined"], 0, "{first}");
    assert_eq!(first["learned_limits"]["window_probe"]["requests"], 1);
    let out = dir.path().join("out/result.parquet");
    let rows = read_output(&out);
    assert_read_whole(&rows, &sim.ledger());
    assert!(
        rows.ids.iter().any(|id| id.ends_with("#0.1")),
        "{:?}",
        rows.ids
    );
    let ledger = sim.ledger();

    second_run_sends_nothing(&job, &sim, (&ledger, &first), &rows).await;
    let same = read_output(&out);
    assert_eq!(by_id(&same), by_id(&rows));
    // The output records both windows: the probe's, and the pieces'.
    let recorded = &rows.metadata["embedjob.context_window"];
    assert!(recorded.contains("\"pieces\""), "{recorded}");
    assert_eq!(&same.metadata["embedjob.context_window"], recorded);
}

/// A second run over the same input, and its estimate, send nothing: every
/// chunk is held unchanged, the window is the first run's, and the ledger
/// bills nothing more.
async fn second_run_sends_nothing(
    job: &Path,
    sim: &Simulator,
    (ledger, first): (&Ledger, &Value),
    rows: &Rows,
) {
    let estimate = crate::support::json(
        &crate::support::embedjob(&["estimate", crate::support::path_arg(job), "--json"]).await,
    );
    assert_eq!(estimate["chunks"], rows.ids.len() as u64, "{estimate}");
    assert_eq!(estimate["chunks_to_send"], 0, "{estimate}");
    assert_eq!(estimate["tokens"], 0, "{estimate}");

    let again = summary_of(&run_job(job, &["--json"]).await);
    assert_eq!(again["embedded"], 0, "{again}");
    assert_eq!(again["requests"], 0, "{again}");
    assert_eq!(again["unchanged"], rows.ids.len() as u64, "{again}");
    assert_eq!(
        again["learned_limits"]["context_window"],
        first["learned_limits"]["context_window"]
    );
    let after = sim.ledger();
    assert_eq!(
        (after.embedding_requests, after.prompt_tokens, &after.texts),
        (
            ledger.embedding_requests,
            ledger.prompt_tokens,
            &ledger.texts
        ),
        "nothing was sent, and no text billed again"
    );
}

/// With `chunking.tokenizer` a model's `tokenizer.json`, a window of 256
/// holds the chunk and the `[CLS]` and `[SEP]` the model adds to it; and
/// `bert-base-uncased`, built in, cuts the same chunks as all-MiniLM's own
/// `tokenizer.json`.
#[tokio::test]
async fn a_tokenizer_json_leaves_room_for_the_models_special_tokens() {
    let model_dir = std::env::var("EMBEDJOB_MODEL_DIR").map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/models/all-MiniLM-L6-v2"),
        PathBuf::from,
    );
    let tokenizer_path = model_dir.join("tokenizer.json");
    assert!(
        tokenizer_path.exists(),
        "{} is missing: run scripts/setup-local",
        tokenizer_path.display()
    );
    let mut tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).unwrap();
    tokenizer.with_padding(None);
    tokenizer.with_truncation(None).unwrap();
    let sim = simulator(SimConfig::default()).await;
    let mut chunks = Vec::new();
    for named in [
        tokenizer_path.display().to_string(),
        "bert-base-uncased".to_string(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        // Words without a sentence's end: the chunker fills each chunk to its size.
        let root = dir.path().join("docs");
        std::fs::create_dir_all(&root).unwrap();
        let words: Vec<String> = (0..3000).map(|i| format!("word{}", i % 97)).collect();
        std::fs::write(root.join("words.txt"), words.join(" ")).unwrap();
        let extra = format!("context_window = 256\n[chunking]\ntokenizer = \"{named}\"");
        let job = job(dir.path(), &sim, &root, &extra);
        let summary =
            summary_of(&run_job(&job, &["--json", "--set", "backend.api_path=/v1"]).await);
        assert_eq!(summary["tokenizer"], named.as_str());
        let rows = read_output(&dir.path().join("out/result.parquet"));
        let longest = rows
            .texts
            .iter()
            .map(|text| tokenizer.encode_fast(text.as_str(), true).unwrap().len())
            .max()
            .unwrap();
        // The chunker fills chunks to the size it is given: the longest is at the window.
        assert!(
            (250..=256).contains(&longest),
            "{named}: the longest chunk with [CLS] and [SEP]: {longest}"
        );
        chunks.push(rows.texts);
    }
    assert_eq!(chunks[0], chunks[1], "the same chunks, counted the same");
}

/// A window the listing gives is the model's own count: chunks counted in
/// cl100k may overflow it, and the run says so.
#[tokio::test]
async fn a_listed_window_counted_in_another_tokenizer_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(SimConfig {
        models: vec![simulate::ModelSpec {
            context_window: 256,
            ..simulate::ModelSpec::embedding("svc-embed-1", 1024)
        }],
        ..SimConfig::default()
    })
    .await;
    // Told not to probe (the probe would check the window: below).
    let job = job(dir.path(), &sim, &root, "probe_window = false");
    let output = run_job(&job, &["--json", "--set", "backend.api_path=/v1"]).await;
    let summary = summary_of(&output);
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("lists a context window of 256 tokens, counted by its own tokenizer"),
        "{stderr}"
    );
    assert!(
        summary["warnings"][0].as_str().unwrap().contains(
            "chunks are counted in cl100k_base tokens, which may be fewer for the same \
                       text: set `chunking.tokenizer` to the model's own (\"bert-base-uncased\""
        ),
        "{summary}"
    );
    assert_eq!(summary["tokenizer"], "cl100k_base");
    assert_eq!(summary["learned_limits"]["window_probe"], Value::Null);
}

/// A run of the prose job against a server that truncates silently and
/// lists no window, billing `factor` times the bytes over four (about as
/// many times the local count), with `max_inputs` chunks a request, stopped
/// by a budget of `max_cost` at 0.1 per 1000 tokens after the probe found
/// the window: the job, the simulator, and the stopped run's summary.
async fn stopped_after_the_probe(
    dir: &Path,
    factor: f64,
    max_inputs: u64,
    max_cost: &str,
) -> (PathBuf, Simulator, Value) {
    let root = prose(dir);
    let billing = embedjob::simulate::Billing {
        count: embedjob::simulate::TokenCount::Bytes,
        factor,
    };
    let sim = simulator(SimConfig {
        billing,
        ..unlisted("truncate")
    })
    .await;
    let extra = format!("input_per_1k = 0.1\nmax_inputs_per_request = {max_inputs}");
    let job = job(dir, &sim, &root, &extra);
    let output = run_job(&job, &["--json", "--max-cost", max_cost]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(4), "{stdout}\n{stderr}");
    let stopped: Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        stopped["stopped"].as_str().unwrap().contains("budget"),
        "{stopped}"
    );
    assert_eq!(
        stopped["learned_limits"]["context_window"]["from"], "truncation",
        "{stopped}"
    );
    assert!(stopped["learned_limits"]["window_probe"]["requests"].as_u64() > Some(0));
    assert!(!dir.join("out/result.parquet").exists());
    (job, sim, stopped)
}

/// The run after [`stopped_after_the_probe`]: it probes nothing, cuts the
/// chunks to the stopped run's window, and every chunk is read whole and
/// embedded once; every request it made embedded chunks. Its summary.
async fn the_next_run_probes_nothing(
    dir: &Path,
    job: &Path,
    sim: &Simulator,
    stopped: &Value,
) -> Value {
    let requests = sim.ledger().embedding_requests;
    let output = run_job(job, &["--json"]).await;
    let again = summary_of(&output);
    assert_eq!(
        again["learned_limits"]["window_probe"],
        Value::Null,
        "{again}"
    );
    assert_eq!(
        again["learned_limits"]["context_window"],
        stopped["learned_limits"]["context_window"]
    );
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("the window an earlier run learned"),
        "{stderr}"
    );
    let rows = read_output(&dir.join("out/result.parquet"));
    let ledger = sim.ledger();
    assert_read_whole(&rows, &ledger);
    assert_eq!(
        ledger.embedding_requests - requests,
        again["requests"].as_u64().unwrap(),
        "{again}"
    );
    for text in &rows.texts {
        assert_eq!(ledger.texts.get(&text_hash(text)), Some(&1), "{text}");
    }
    again
}

/// A run stopped before its end leaves no output, where the learned window
/// is kept: the next run takes it from the checkpoint's parts, probes
/// nothing, and cuts the chunks as the stopped run did. Probing again
/// against infinity was billed again, and a window found anew at another
/// size would change the chunks and so the fingerprint the checkpoint was
/// made under.
#[tokio::test]
async fn a_run_after_a_stop_takes_the_window_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // Enough for what the probe may send (8,112 tokens) and a part of the
    // job (about 8,700 more): 9,000 tokens at 0.1 per 1000.
    let (job, sim, stopped) = stopped_after_the_probe(dir.path(), 1.0, 8, "0.9").await;
    assert!(stopped["embedded"].as_u64() > Some(0), "{stopped}");
    let again = the_next_run_probes_nothing(dir.path(), &job, &sim, &stopped).await;
    assert!(again["resumed"].as_u64() > Some(0), "{again}");
}

/// A job file changed since an earlier run is refused before the run asks
/// the service anything. The window the earlier run learned is counted in
/// its tokenizer, so a run with another would probe anew, pay for it, and
/// then be refused for the change: before, 9 requests, of which 6 probed,
/// billed 3,456 tokens. The checkpoint of a stopped run is named, else the
/// finished output.
#[tokio::test]
async fn a_changed_job_file_is_refused_before_the_service_is_asked_anything() {
    let dir = tempfile::tempdir().unwrap();
    let (job, sim, _) = stopped_after_the_probe(dir.path(), 1.0, 8, "0.9").await;
    let changed = dir.path().join("changed.toml");
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &changed,
        text.replace(
            "[output]",
            "[chunking]\ntokenizer = \"o200k_base\"\n[output]",
        ),
    )
    .unwrap();
    let refused = |made: &str| {
        let (sim, changed, made) = (&sim, &changed, made.to_string());
        async move {
            let before = sim.ledger().requests;
            let output = run_job(changed, &["--json"]).await;
            let (stdout, stderr) = no_key(&output, KEY);
            assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
            assert!(
                stderr.contains(&format!("{made} was made with a different configuration")),
                "{stderr}"
            );
            assert!(
                stderr.contains("chunking.tokenizer: (unset) → o200k_base"),
                "{stderr}"
            );
            assert_eq!(sim.ledger().requests - before, 0, "nothing asked");
        }
    };
    let output = dir.path().join("out/result.parquet");
    let location = embedjob::state::StateLocation::beside(&output);
    refused(&location.checkpoint().display().to_string()).await;
    // Restored, the job finishes; changed again, its output is named.
    let summary = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(summary["exit_code"], 0, "{summary}");
    refused(&output.display().to_string()).await;
    // With --fresh, the changed job runs, and probes for the window in its tokenizer.
    let fresh = summary_of(&run_job(&changed, &["--json", "--fresh"]).await);
    assert_eq!(fresh["tokenizer"], "o200k_base", "{fresh}");
    assert!(
        fresh["learned_limits"]["window_probe"]["requests"].as_u64() > Some(0),
        "{fresh}"
    );
}

/// A run stopped before it kept any vector of its own keeps what the probe
/// was billed in a checkpoint part, of the probe's vectors' width, with the
/// window: the next run probes nothing, and the output's usage counts every
/// token billed, the probe's included. Here the service bills about three
/// times the local count: the probe, which fits the budget by the job's
/// count, is billed more than it, and the run stops at its first request.
#[tokio::test]
async fn a_run_stopped_after_a_billed_probe_keeps_its_bill_and_window_in_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // The probe may send up to 12 texts of 676 tokens (8,112 tokens by the
    // job's count, 0.8112 at 0.1 per 1000); it sends about 3,600, billed
    // about three times that.
    let (job, sim, stopped) = stopped_after_the_probe(dir.path(), 3.0, 64, "0.9").await;
    assert_eq!(stopped["embedded"], 0, "{stopped}");
    let probe = stopped["learned_limits"]["window_probe"].clone();
    assert_eq!(
        sim.ledger().embedding_requests,
        probe["requests"].as_u64().unwrap()
    );
    assert!(dir.path().join("out/result.parquet.checkpoint").exists());
    the_next_run_probes_nothing(dir.path(), &job, &sim, &stopped).await;
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_eq!(
        rows.metadata["embedjob.usage.prompt_tokens"],
        sim.ledger().prompt_tokens.to_string(),
        "every token billed is in the output's usage, the probe's {} included",
        probe["tokens"]
    );
}

/// With neither output nor checkpoint (a run stopped before it kept
/// anything, or a checkpoint removed by hand), the next run takes the
/// window from the summary the stopped run wrote, and probes nothing.
#[tokio::test]
async fn with_nothing_kept_the_next_run_takes_the_window_from_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let (job, sim, stopped) = stopped_after_the_probe(dir.path(), 3.0, 64, "0.9").await;
    std::fs::remove_dir_all(dir.path().join("out/result.parquet.checkpoint")).unwrap();
    the_next_run_probes_nothing(dir.path(), &job, &sim, &stopped).await;
}

/// A budget smaller than what the probe may send keeps it from being sent,
/// and stops the run before its first request: the probe was billed in full
/// before the budget's first request, and skipping it instead would store
/// vectors of chunks the server read only in part.
#[tokio::test]
async fn a_probe_that_could_cost_more_than_the_budget_is_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(unlisted("truncate")).await;
    let job = job(dir.path(), &sim, &root, "input_per_1k = 0.1");
    // The probe may send 8,112 tokens, 0.8112 at 0.1 per 1000 (it sends
    // about 3,600).
    let output = run_job(&job, &["--json", "--max-cost", "0.3"]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(4), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    let stopped = summary["stopped"].as_str().unwrap();
    assert!(
        stopped.starts_with("stopped at the budget of 0.3: the probe for model svc-embed-1's"),
        "{stopped}"
    );
    assert!(stopped.contains("`backend.context_window`"), "{stopped}");
    assert_eq!(summary["learned_limits"]["window_probe"], Value::Null);
    assert_eq!(sim.ledger().embedding_requests, 0, "nothing was sent");
    assert!(!dir.path().join("out/result.parquet").exists());
    assert!(!dir.path().join("out/result.parquet.checkpoint").exists());

    // With a budget that covers it, the probe goes, and every chunk is read whole.
    let output = run_job(&job, &["--json", "--max-cost", "10"]).await;
    let again = summary_of(&output);
    assert!(again["learned_limits"]["window_probe"]["requests"].as_u64() > Some(0));
    assert_read_whole(
        &read_output(&dir.path().join("out/result.parquet")),
        &sim.ledger(),
    );
}

/// A summary's window is taken only where nothing was kept: it may be the
/// window chunks refused mid-run were cut to, and an output's chunks cut
/// anew to it would not be reused. Here an output made without a window,
/// and a summary (as a later run stopped before it kept anything would
/// leave) naming one: the next run reuses every vector and sends nothing.
#[tokio::test]
async fn a_summarys_window_does_not_cut_anew_what_an_output_holds() {
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(unlisted("truncate")).await;
    let job = job(dir.path(), &sim, &root, "probe_window = false");
    let first = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(first["learned_limits"]["context_window"], Value::Null);
    let chunks = first["chunks"].as_u64().unwrap();
    let requests = sim.ledger().embedding_requests;

    let mut stopped = first.clone();
    stopped["learned_limits"]["context_window"] =
        serde_json::json!({"tokens": 100, "server_tokens": 256, "from": "refusal"});
    stopped["exit_code"] = 4.into();
    std::fs::write(
        dir.path().join("out/result.parquet.summary.json"),
        stopped.to_string(),
    )
    .unwrap();

    let again = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(again["learned_limits"]["context_window"], Value::Null);
    assert_eq!(again["chunks"].as_u64(), Some(chunks), "{again}");
    assert_eq!(again["reused"].as_u64(), Some(chunks), "{again}");
    assert_eq!(sim.ledger().embedding_requests, requests, "nothing sent");
}

/// A window the listing gives in the model's own tokens, where chunks are
/// counted in another tokenizer, may hold fewer of the job's tokens than the
/// chunks: a server that lists 512 and truncates there read 512-token
/// `cl100k_base` chunks only in part, with no warning (the warning was for
/// a listed window smaller than the chunks). The probe checks it, and the
/// chunks are cut to what the server reads.
#[tokio::test]
async fn a_listed_window_in_another_tokenizer_is_checked_by_the_probe() {
    const LISTED: u32 = 512;
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let sim = simulator(SimConfig {
        models: vec![simulate::ModelSpec {
            context_window: LISTED,
            ..simulate::ModelSpec::embedding("svc-embed-1", 1024)
        }],
        window: Some(ServerWindow::parse(&format!("{LISTED}:truncate")).unwrap()),
        ..SimConfig::default()
    })
    .await;
    let job = job(dir.path(), &sim, &root, "");
    let output = run_job(&job, &["--json", "--set", "backend.api_path=/v1"]).await;
    let summary = summary_of(&output);
    let rows = read_output(&dir.path().join("out/result.parquet"));
    let ledger = sim.ledger();
    let over: Vec<u64> = rows
        .texts
        .iter()
        .map(|text| simulate::server_tokens(text))
        .filter(|&n| n > u64::from(LISTED))
        .collect();
    assert!(over.is_empty(), "chunks over the window: {over:?}");
    // Only the probe's texts were read in part.
    for text in &rows.texts {
        assert!(!ledger.partly_read.contains_key(&text_hash(text)), "{text}");
    }
    let window = &summary["learned_limits"]["context_window"];
    assert_eq!(window["from"], "truncation", "{summary}");
    assert!(window["tokens"].as_u64().unwrap() < 512, "{summary}");
    assert_eq!(
        summary["usage"]["prompt_tokens"].as_u64().unwrap(),
        ledger.prompt_tokens,
        "{summary}"
    );

    // An output cut under the listed window, unchecked (told not to probe),
    // is not cut anew by a run that may probe: that would refuse the output
    // as made under another configuration. It says the window is unchecked.
    let dir = tempfile::tempdir().unwrap();
    let root = prose(dir.path());
    let job = self::job(dir.path(), &sim, &root, "probe_window = false");
    let set = ["--json", "--set", "backend.api_path=/v1"];
    let first = summary_of(&run_job(&job, &set).await);
    let job = self::job(dir.path(), &sim, &root, "");
    let output = run_job(&job, &set).await;
    let again = summary_of(&output);
    assert_eq!(again["embedded"], 0, "{again}");
    assert_eq!(again["unchanged"], first["chunks"], "{again}");
    assert_eq!(again["learned_limits"]["window_probe"], Value::Null);
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("lists a context window of 512 tokens, counted by its own tokenizer"),
        "{stderr}"
    );
}

/// reStructuredText: each title underlined with `=`, a token a character
/// for the simulated server (as for a WordPiece model) and a few for
/// `cl100k_base`. Measured on a fixed list of plain words, the window was
/// too wide for such chunks (45 of 60 read only in part in a corpus like
/// this one). Measured on the job's own text, every chunk is read whole.
#[tokio::test]
async fn the_window_is_measured_on_the_jobs_own_text() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for doc in 0..4 {
        std::fs::write(root.join(format!("doc{doc}.rst")), titled(doc)).unwrap();
    }
    read_whole_by_a_truncating_server(dir.path(), &root).await;
}

/// A job over `root` against a server that truncates at [`WINDOW`] and
/// lists no window: the probe finds it, and every chunk is read whole.
async fn read_whole_by_a_truncating_server(dir: &Path, root: &Path) {
    let sim = simulator(unlisted("truncate")).await;
    let job = job(dir, &sim, root, "");
    let summary = summary_of(&run_job(&job, &["--json"]).await);
    assert_eq!(
        summary["learned_limits"]["context_window"]["from"],
        "truncation"
    );
    let rows = read_output(&dir.join("out/result.parquet"));
    assert_read_whole(&rows, &sim.ledger());
}

/// A reStructuredText document of 80 sections, each title underlined with
/// `=`s: dense for the simulated server (a mark is a token) and light for
/// `cl100k_base`.
fn titled(doc: usize) -> String {
    const WORDS: &[&str] = &["river", "levels", "rose", "after", "the", "storm", "and"];
    let mut body = String::new();
    for section in 0..80 {
        let word = |i: usize| WORDS[(doc * 7 + section * 5 + i * 3) % WORDS.len()];
        let title: Vec<&str> = (0..5).map(word).collect();
        let title = title.join(" ");
        let text: Vec<&str> = (5..17).map(word).collect();
        body.push_str(&format!(
            "{title}\n{}\n\n{}.\n\n",
            "=".repeat(title.len()),
            text.join(" ")
        ));
    }
    body
}

/// The probe's text is taken from the whole input, its densest pieces
/// first: plain prose at the start of the input (16 KiB, more than the 10
/// KiB the probe's text was read from), and the reStructuredText after it.
/// Measured on the input's first documents, the window fitted the prose,
/// and chunks of the titled sections were read in part.
#[tokio::test]
async fn the_window_is_measured_on_the_densest_of_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    let words = [
        "the", "river", "rose", "slowly", "after", "a", "storm", "upstream",
    ];
    let prose: Vec<&str> = (0..3000).map(|i| words[i * 5 % words.len()]).collect();
    std::fs::write(root.join("a-notes.txt"), prose.join(" ")).unwrap();
    std::fs::write(root.join("b-guide.rst"), titled(0)).unwrap();
    read_whole_by_a_truncating_server(dir.path(), &root).await;
}

/// A server that counts as all-MiniLM does (`bert-base-uncased`'s WordPiece,
/// `[CLS]` and `[SEP]` in its window of 256) and truncates silently, as
/// infinity does. Counted in `cl100k_base`, the window the probe finds is
/// what the densest text (tables of identifiers and addresses) takes, and
/// the prose's chunks are cut as short; a chunk denser than the text the
/// probe measured is cut to the word pieces the server read as well, so
/// every chunk is read whole either way. Counted as the model counts, the
/// chunks are fewer and longer.
#[tokio::test]
async fn counted_as_the_model_counts_chunks_fit_a_wordpiece_server_whatever_the_text() {
    let (window, sim) = wordpiece_server().await;
    let mut chunks = Vec::new();
    for tokenizer in ["cl100k_base", "bert-base-uncased"] {
        let dir = tempfile::tempdir().unwrap();
        let root = readmes(dir.path());
        let extra = format!("[chunking]\ntokenizer = \"{tokenizer}\"");
        let job = job(dir.path(), &sim, &root, &extra);
        let summary = summary_of(&run_job(&job, &["--json"]).await);
        assert_eq!(summary["quarantined"], 0, "{summary}");
        let learned = &summary["learned_limits"]["context_window"];
        assert_eq!(learned["from"], "truncation", "{summary}");
        let rows = read_output(&dir.path().join("out/result.parquet"));
        let ledger = sim.ledger();
        let longest = rows.texts.iter().map(|t| window.count(t)).max().unwrap();
        for text in &rows.texts {
            assert!(!ledger.partly_read.contains_key(&text_hash(text)), "{text}");
        }
        assert!(longest <= WINDOW, "{tokenizer}: {longest}: {summary}");
        if tokenizer == "cl100k_base" {
            // What the server read, less the 10% margin: at most its 254
            // pieces of text, 229 once the margin is taken.
            let pieces = learned["wordpieces"].as_u64().unwrap();
            assert!((1..=229).contains(&pieces), "{summary}");
        } else {
            assert_eq!(learned.get("wordpieces"), None, "{summary}");
            // The server reads 254 tokens of text, found to within a 32nd
            // of the probe's 640 (at least 234), less the 10% margin.
            let tokens = learned["tokens"].as_u64().unwrap();
            assert!((210..=228).contains(&tokens), "{summary}");
        }
        chunks.push((rows.texts.len(), longest));
    }
    // The prose counts about the same either way, and its chunks are cut
    // to the densest text's window in `cl100k_base`'s count.
    assert!(
        chunks[1].0 < chunks[0].0,
        "fewer chunks counted as the model counts: {chunks:?}"
    );
}

/// A server that counts as all-MiniLM does, with the window of 512 that
/// llama.cpp's and TEI's servers keep for it, silent or refusing without
/// saying it. The probe's text is the shortest prefix of the prose with
/// 640 cl100k tokens (about as many word pieces: a word, or a mark, is one
/// of either): past the window. Then the probe tests the prefixes either
/// side of 512: the last whose pieces leave one to spare with `[CLS]` and
/// `[SEP]`, at most 509 and at least 508 (a word and its mark are at most
/// two pieces), read whole; and the first with 512, past it. A truncating
/// server is asked for both in one request, a refusing one for each. The
/// binary search that finds the window without them took 6 requests after
/// the first, and stopped within a 32nd of the text, 20 words.
#[tokio::test]
async fn a_wordpiece_window_is_found_where_it_is_likeliest_in_a_request_or_two() {
    for (over, requests) in [("truncate", 2), ("llamacpp-bare", 3)] {
        let dir = tempfile::tempdir().unwrap();
        let root = prose(dir.path());
        let window = ServerWindow::parse(&format!("512:{over}:wordpiece")).unwrap();
        let sim = simulator(SimConfig {
            window: Some(window.clone()),
            ..unlisted(over)
        })
        .await;
        let job = job(dir.path(), &sim, &root, "");
        let summary = summary_of(&run_job(&job, &["--json"]).await);
        let probe = &summary["learned_limits"]["window_probe"];
        assert_eq!(probe["requests"], requests, "{over}: {summary}");
        let learned = &summary["learned_limits"]["context_window"];
        let pieces = learned["wordpieces"].as_u64().unwrap();
        let read = [508, 509].map(embedjob::backend::with_margin);
        assert!((read[0]..=read[1]).contains(&pieces), "{over}: {summary}");
        let rows = read_output(&dir.path().join("out/result.parquet"));
        let ledger = sim.ledger();
        for text in &rows.texts {
            assert!(!ledger.partly_read.contains_key(&text_hash(text)), "{text}");
            assert!(window.count(text) <= 512, "{over}: {text}");
        }
    }
}

/// A server whose model counts as `tests/fixtures/word-tokenizer.json` does
/// (a token a word, marks and all, and `<s>` before every text), with a window of
/// 512 and the job counting with the same `tokenizer.json`. Every other word
/// of the prose carries a comma: `bert-base-uncased` counts about three
/// pieces for every two of the model's tokens, so a guess counted as a
/// WordPiece model counts (at 512 pieces, about 340 words) is read whole
/// and the binary search does the rest. Counted as the job counts, the
/// guess is the model's own: the prefix of 510 words (511 tokens with
/// `<s>`) read whole, the one of 513 past the window; a truncating server
/// is asked for both in one request, a refusing one for each.
#[tokio::test]
async fn a_window_is_guessed_in_the_models_own_count_when_the_job_counts_with_it() {
    for (over, requests) in [("truncate", 2), ("llamacpp-bare", 3)] {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/word-tokenizer.json");
        let root = dir.path().join("docs");
        std::fs::create_dir_all(&root).unwrap();
        for doc in 0..3 {
            let words: Vec<String> = (0..1500)
                .map(|i| {
                    let word = prose_paragraph(doc, i / 30)
                        .split_whitespace()
                        .nth(i % 30)
                        .unwrap_or("river")
                        .trim_end_matches('.')
                        .to_string();
                    if i % 2 == 0 {
                        word + ","
                    } else {
                        word
                    }
                })
                .collect();
            std::fs::write(root.join(format!("d{doc}.txt")), words.join(" ")).unwrap();
        }
        let spec = format!("512:{over}:tokenizer={}", tokenizer.display());
        let window = ServerWindow::parse(&spec).unwrap();
        let sim = simulator(SimConfig {
            window: Some(window.clone()),
            ..unlisted(over)
        })
        .await;
        let extra = format!("[chunking]\ntokenizer = \"{}\"", tokenizer.display());
        let job = job(dir.path(), &sim, &root, &extra);
        let summary = summary_of(&run_job(&job, &["--json"]).await);
        let probe = &summary["learned_limits"]["window_probe"];
        assert_eq!(probe["requests"], requests, "{over}: {summary}");
        let learned = &summary["learned_limits"]["context_window"];
        assert_eq!(
            learned["tokens"],
            embedjob::backend::with_margin(510),
            "{over}: {summary}"
        );
        assert_eq!(learned.get("wordpieces"), None, "{over}: {summary}");
        let rows = read_output(&dir.path().join("out/result.parquet"));
        assert!(!rows.texts.is_empty());
        let ledger = sim.ledger();
        for text in &rows.texts {
            assert!(!ledger.partly_read.contains_key(&text_hash(text)), "{text}");
            assert!(window.count(text) <= 512, "{over}: {text}");
        }
    }
}

/// A server that counts as all-MiniLM does (`bert-base-uncased`'s WordPiece,
/// `[CLS]` and `[SEP]` in its window of [`WINDOW`]), reads only the start of
/// a longer input, and lists no window; and that window.
async fn wordpiece_server() -> (ServerWindow, Simulator) {
    let window = ServerWindow::parse(&format!("{WINDOW}:truncate:wordpiece")).unwrap();
    let sim = simulator(SimConfig {
        window: Some(window.clone()),
        ..unlisted("truncate")
    })
    .await;
    (window, sim)
}

/// Documents as a crate's README is: prose, and tables of identifiers and
/// addresses under a rule of dashes, which `bert-base-uncased` counts far
/// more densely than `cl100k_base` (a dash a token, against one for
/// sixteen).
fn readmes(dir: &Path) -> PathBuf {
    let root = dir.join("readmes");
    std::fs::create_dir_all(&root).unwrap();
    for doc in 0..4 {
        let mut text = String::new();
        for paragraph in 0..40 {
            text.push_str(&prose_paragraph(doc, paragraph));
            if paragraph % 10 == 9 {
                let rule = "-".repeat(48);
                text.push_str(&format!("| crate | link |\n|{rule}|{rule}|\n"));
                for row in 0..3 {
                    text.push_str(&format!(
                        "| `getentropy_{doc}{row}` | https://docs.rs/crypto-{row}/0.{doc}/ |\n"
                    ));
                }
                text.push('\n');
            }
        }
        std::fs::write(root.join(format!("r{doc}.md")), text).unwrap();
    }
    root
}

/// Paragraph `paragraph` of document `doc`: 30 plain words and a full stop,
/// then a blank line.
fn prose_paragraph(doc: usize, paragraph: usize) -> String {
    const WORDS: &[&str] = &[
        "the", "river", "levels", "rose", "after", "storm", "and", "slowly",
    ];
    let words: Vec<&str> = (0..30)
        .map(|i| WORDS[(doc * 5 + paragraph * 3 + i * 7) % WORDS.len()])
        .collect();
    format!("{}.\n\n", words.join(" "))
}

/// Records piped in (`path = "-"`, read once): the probe has none of the
/// input to measure on and measures plain words, light for a WordPiece
/// server. Records of prose with blocks of hexadecimal ids, which it counts
/// a quarter more densely than `cl100k_base` does (the plain words a little
/// less densely), make chunks that fit the
/// window in `cl100k_base`'s count and not in the server's; they are cut to
/// the word pieces the server read of the probe's text as well, and every
/// chunk is read whole. Cut to the window in `cl100k_base` tokens alone,
/// chunks of these records were read in part.
#[tokio::test]
async fn records_denser_than_the_probes_text_are_cut_to_the_word_pieces_the_server_read() {
    let (window, sim) = wordpiece_server().await;
    let dir = tempfile::tempdir().unwrap();
    let source = "kind = \"jsonl\"\npath = \"-\"\ntext_field = \"text\"\nid_field = \"id\"";
    let job = job_reading(dir.path(), &sim, source, "");
    let run = || async {
        let mut command = crate::support::bin();
        command.env("EMBEDJOB_API_KEY", KEY).args([
            "run",
            crate::support::path_arg(&job),
            "--json",
        ]);
        crate::support::run_with_stdin(command, hex_records().into_bytes()).await
    };
    let output = run().await;
    let summary = summary_of(&output);
    assert_eq!(summary["quarantined"], 0, "{summary}");
    let learned = &summary["learned_limits"]["context_window"];
    assert_eq!(learned["from"], "truncation", "{summary}");
    let stderr = text(&output.stderr);
    let said = format!(
        "and {} word pieces as bert-base-uncased counts",
        learned["wordpieces"]
    );
    assert!(stderr.contains(&said), "{stderr}");
    // The server read at most its 254 pieces of text: 229 less the margin.
    let pieces = learned["wordpieces"].as_u64().unwrap();
    assert!((1..=229).contains(&pieces), "{summary}");
    let rows = read_output(&dir.path().join("out/result.parquet"));
    let ledger = sim.ledger();
    for text in &rows.texts {
        assert!(!ledger.partly_read.contains_key(&text_hash(text)), "{text}");
        assert!(window.count(text) <= WINDOW, "{text}");
    }
    // The output records the pieces with the window: the next run cuts the
    // same chunks, and sends nothing.
    let again = summary_of(&run().await);
    assert_eq!(again["requests"], 0, "{again}");
    assert_eq!(again["unchanged"], rows.ids.len() as u64, "{again}");
    assert_eq!(
        again["learned_limits"]["context_window"], *learned,
        "{again}"
    );
}

/// Eight records of prose paragraphs, each followed by a block of
/// hexadecimal ids (a line each), as JSON Lines.
fn hex_records() -> String {
    let mut lines = String::new();
    for record in 0..8 {
        let mut text = String::new();
        for paragraph in 0..12 {
            text.push_str(&prose_paragraph(record, paragraph));
            for row in 0..16 {
                let (a, b) = (record * 977 + row * 31 + paragraph, row * 7919 + record);
                text.push_str(&format!("0x{a:08x}{b:08x}\n"));
            }
            text.push('\n');
        }
        let line = serde_json::json!({"id": format!("r{record}"), "text": text});
        lines.push_str(&format!("{line}\n"));
    }
    lines
}
