//! Throughput of the local backend on mixed-length text.
//!
//! Builds a corpus of about 2,000 lines from the repository's own prose (doc
//! comments, the reference README and sentences), shuffled with a fixed
//! seed, and writes it to a file so that the Python loop of
//! `tests/reference/local_reference.py --bench` reads the same input. Then it
//! embeds the corpus with the local backend, after one untimed warm-up batch,
//! once per run of `SIZExCONCURRENCY`: requests of SIZE texts (`all`: the
//! whole corpus), CONCURRENCY of them in flight as the pipeline sends them.
//! With one request of `--batch-size` texts at a time nothing can be
//! regrouped (the Python loop's batches); larger requests, and requests that
//! queue up together, are sorted by length into batches of similar texts.
//!
//! ```text
//! scripts/setup-local && scripts/setup-python
//! cargo run --release --example local_bench -- --threads 2
//! .cache/venv/bin/python tests/reference/local_reference.py \
//!     --bench .cache/bench/local_corpus.txt --batch-size 32 --threads 2
//! ```
//!
//! Options: `--corpus FILE` (default `.cache/bench/local_corpus.txt`),
//! `--lines N` (2000), `--batch-size N` (32), `--threads N` (all cores),
//! `--runs SIZExCONCURRENCY,..` (default `32x1,128x1,128x8,allx1`). One JSON
//! object per line on stdout.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use embedjob::backend::local::{LocalBackend, LocalSettings, MAX_LENGTH};
use embedjob::backend::EmbeddingBackend;
use futures::stream::{self, StreamExt, TryStreamExt};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::json;

struct Options {
    corpus: PathBuf,
    lines: usize,
    batch_size: usize,
    threads: Option<usize>,
    /// Request size (`None`: everything at once) and requests in flight.
    runs: Vec<(Option<usize>, usize)>,
}

fn parse_args() -> anyhow::Result<Options> {
    let mut options = Options {
        corpus: PathBuf::from(".cache/bench/local_corpus.txt"),
        lines: 2000,
        batch_size: 32,
        threads: None,
        runs: vec![(Some(32), 1), (Some(128), 1), (Some(128), 8), (None, 1)],
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--corpus" => options.corpus = PathBuf::from(value()?),
            "--lines" => options.lines = value()?.parse()?,
            "--batch-size" => options.batch_size = value()?.parse()?,
            "--threads" => options.threads = Some(value()?.parse()?),
            "--runs" => {
                options.runs = value()?
                    .split(',')
                    .map(parse_run)
                    .collect::<anyhow::Result<_>>()?;
            }
            other => bail!("unknown option {other}"),
        }
    }
    if options.lines == 0 || options.batch_size == 0 {
        bail!("--lines and --batch-size must be at least 1");
    }
    Ok(options)
}

fn parse_run(text: &str) -> anyhow::Result<(Option<usize>, usize)> {
    let (size, concurrency) = text
        .trim()
        .split_once('x')
        .with_context(|| format!("{text:?} is not SIZExCONCURRENCY"))?;
    let size = match size {
        "all" => None,
        n => Some(n.parse()?),
    };
    let concurrency: usize = concurrency.parse()?;
    if size == Some(0) || concurrency == 0 {
        bail!("{text:?}: sizes and concurrency must be at least 1");
    }
    Ok((size, concurrency))
}

/// Paragraphs of the repository's prose: runs of doc-comment lines in the
/// Rust sources, paragraphs of the reference README, and the reference
/// sentences.
fn paragraphs(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut files = Vec::new();
    for dir in ["src", "tests", "examples"] {
        collect_rust_files(&root.join(dir), &mut files)?;
    }
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let mut current = Vec::new();
        for line in text.lines() {
            let line = line.trim_start();
            let doc = line
                .strip_prefix("///")
                .or_else(|| line.strip_prefix("//!"))
                .map(str::trim);
            match doc {
                Some(words) if !words.is_empty() && !words.starts_with("```") => {
                    current.push(words.to_string())
                }
                _ => flush(&mut current, &mut out),
            }
        }
        flush(&mut current, &mut out);
    }
    let readme = std::fs::read_to_string(root.join("tests/reference/README.md"))?;
    for block in readme.split("\n\n") {
        let mut lines: Vec<String> = block.lines().map(str::to_string).collect();
        flush(&mut lines, &mut out);
    }
    let sentences = std::fs::read_to_string(root.join("tests/reference/sentences.txt"))?;
    out.extend(sentences.lines().map(str::to_string));
    Ok(out)
}

fn flush(lines: &mut Vec<String>, out: &mut Vec<String>) {
    let joined = lines
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if joined.len() >= 3 {
        out.push(joined);
    }
    lines.clear();
}

fn collect_rust_files(dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_rust_files(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

fn corpus(root: &Path, lines: usize) -> anyhow::Result<Vec<String>> {
    let source = paragraphs(root)?;
    if source.is_empty() {
        bail!("no prose found under {}", root.display());
    }
    let mut rng = SmallRng::seed_from_u64(2024);
    let mut out = Vec::with_capacity(lines);
    while out.len() < lines {
        let mut round = source.clone();
        round.shuffle(&mut rng);
        out.extend(round.into_iter().take(lines - out.len()));
    }
    Ok(out)
}

/// Tokens fed to the model when `lengths` are cut into batches as given.
fn padded(batches: impl Iterator<Item = Vec<usize>>) -> usize {
    batches
        .map(|b| b.iter().max().copied().unwrap_or(0) * b.len())
        .sum()
}

/// Tokens fed to the model when requests of `size` are sorted by length and
/// cut into batches of `batch`.
fn padded_sorted(lengths: &[usize], size: usize, batch: usize) -> usize {
    padded(lengths.chunks(size).flat_map(|request| {
        let mut request = request.to_vec();
        request.sort_unstable();
        request
            .chunks(batch)
            .map(<[usize]>::to_vec)
            .collect::<Vec<_>>()
    }))
}

fn main() -> anyhow::Result<()> {
    let options = parse_args()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lines = corpus(root, options.lines)?;
    if let Some(parent) = options.corpus.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&options.corpus, lines.join("\n") + "\n")
        .with_context(|| format!("cannot write {}", options.corpus.display()))?;

    let threads = options
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let queue_capacity = options.runs.iter().map(|r| r.1).max().unwrap_or(1);
    let backend = LocalBackend::load(LocalSettings {
        threads: Some(threads),
        batch_size: options.batch_size,
        queue_capacity,
        ..LocalSettings::from_env()
    })?;

    let tokenizer = backend.tokenizer();
    let mut lengths = Vec::with_capacity(lines.len());
    for line in &lines {
        let n = tokenizer
            .encode(line.as_str(), true)
            .map_err(|e| anyhow::anyhow!("cannot tokenize: {e}"))?
            .len();
        lengths.push(n.min(MAX_LENGTH));
    }
    let mut sorted = lengths.clone();
    sorted.sort_unstable();
    let percentile = |p: usize| sorted[(sorted.len() - 1) * p / 100];
    let real: usize = lengths.iter().sum();
    let in_order = padded(lengths.chunks(options.batch_size).map(<[usize]>::to_vec));
    println!(
        "{}",
        json!({
            "corpus": options.corpus.display().to_string(),
            "sentences": lines.len(),
            "tokens": real,
            "tokens_p50_p90_p99_max": [percentile(50), percentile(90), percentile(99), percentile(100)],
            "padded_tokens_in_input_order": in_order,
            "padded_tokens_sorted_per_128": padded_sorted(&lengths, 128, options.batch_size),
            "padded_tokens_sorted_all": padded_sorted(&lengths, lengths.len(), options.batch_size),
            "runtime": backend.runtime_path().display().to_string(),
            "threads": threads,
            "batch_size": options.batch_size,
        })
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let warm: Vec<&str> = lines
            .iter()
            .take(options.batch_size)
            .map(String::as_str)
            .collect();
        backend.embed(&warm, 0).await?;
        for &(request, concurrency) in &options.runs {
            let size = request.unwrap_or(lines.len());
            let start = Instant::now();
            let counts: Vec<usize> = stream::iter(lines.chunks(size))
                .map(|chunk| {
                    let backend = &backend;
                    async move {
                        let texts: Vec<&str> = chunk.iter().map(String::as_str).collect();
                        backend.embed(&texts, 0).await.map(|v| v.len())
                    }
                })
                .buffered(concurrency)
                .try_collect()
                .await?;
            let seconds = start.elapsed().as_secs_f64();
            let count: usize = counts.iter().sum();
            println!(
                "{}",
                json!({
                    "request_size": request.map_or_else(|| "all".to_string(), |n| n.to_string()),
                    "concurrency": concurrency,
                    "sentences": count,
                    "seconds": (seconds * 1e6).round() / 1e6,
                    "sentences_per_second": (count as f64 / seconds * 1e3).round() / 1e3,
                })
            );
        }
        anyhow::Ok(())
    })
}
