//! The floor of `embedjob run`: the work no pipeline can avoid, in a tight
//! loop on one thread, with no channels, no tasks and no network.
//!
//! For a job file (the same one `scripts/bench` runs), it reads and chunks the
//! corpus with the job's chunker, packs the chunks into requests with the
//! job's limits, decodes and checks the very body the simulator would send for
//! each request (as the client does), and writes the vectors to Parquet with
//! the job's sink settings. Building each body stands in for the service and
//! is not counted.
//!
//! ```text
//! cargo run --release --example floor -- JOB.toml [--base64] [--set KEY=VALUE]...
//! ```
//!
//! With `--base64` the bodies carry their vectors in base64, as a service sends
//! them for `encoding_format: "base64"`, instead of as JSON numbers.
//!
//! Prints one JSON object: chunks, the seconds spent in each step and their
//! sum, and the bytes of the bodies decoded.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use embedjob::batch::{Batch, Batcher};
use embedjob::chunk::{Chunker, TokenChunker};
use embedjob::client::decode_embeddings;
use embedjob::simulate::{embeddings_response_body, embeddings_response_body_base64};
use embedjob::types::{EmbeddedBatch, OutputMetadata, Vectors};
use embedjob::validate;
use serde_json::json;

#[derive(Default)]
struct Timings {
    chunk: Duration,
    decode: Duration,
    write: Duration,
    respond: Duration,
}

/// The job file, its `--set` overrides, and whether bodies are in base64.
fn arguments() -> anyhow::Result<(PathBuf, Vec<String>, bool)> {
    let mut args = std::env::args().skip(1);
    let job_path = PathBuf::from(
        args.next()
            .context("usage: floor JOB.toml [--base64] [--set KEY=VALUE]...")?,
    );
    let mut overrides = Vec::new();
    let mut base64 = false;
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--set" => overrides.push(args.next().context("--set needs KEY=VALUE")?),
            "--base64" => base64 = true,
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok((job_path, overrides, base64))
}

fn main() -> anyhow::Result<()> {
    let (job_path, overrides, base64) = arguments()?;
    let respond = if base64 {
        embeddings_response_body_base64
    } else {
        embeddings_response_body
    };
    let job = embedjob::kinds::load(&job_path, &overrides)?;
    let model = job.backend.shared.model.clone().unwrap_or_default();
    let Some(dimensions) = job
        .backend
        .shared
        .dimensions
        .or_else(|| validate::known_model_dimensions(&model))
    else {
        bail!("the floor needs the model's dimensions: set `backend.dimensions`");
    };

    let mut times = Timings::default();
    let started = Instant::now();
    let mut source = embedjob::source::open(&job.source)?;
    let chunker = TokenChunker::cl100k(&job.chunking)?;
    let mut batcher = Batcher::for_backend(&job.backend);
    let mut sink = futures::executor::block_on(embedjob::sink::open(&job.output, None))?;
    times.chunk += started.elapsed();

    let mut chunks = 0u64;
    let mut usage = embedjob::types::Usage::default();
    let mut requests = 0u64;
    let mut body_bytes = 0u64;
    let mut embed = |batch: Batch, times: &mut Timings| -> anyhow::Result<()> {
        let t = Instant::now();
        let texts: Vec<&str> = batch.chunks.iter().map(|c| c.text.as_str()).collect();
        let body = respond(&model, dimensions, &texts);
        body_bytes += body.len() as u64;
        let inputs = texts.len();
        drop(texts);
        times.respond += t.elapsed();

        let t = Instant::now();
        let vectors = decode(&body, inputs, dimensions)?;
        drop(body);
        times.decode += t.elapsed();

        let t = Instant::now();
        usage += vectors.usage;
        requests += 1;
        sink.write(&EmbeddedBatch {
            chunks: batch.chunks,
            vectors,
        })?;
        times.write += t.elapsed();
        Ok(())
    };
    loop {
        let t = Instant::now();
        let Some(document) = source.next_document()? else {
            times.chunk += t.elapsed();
            break;
        };
        let mut ready = Vec::new();
        for chunk in chunker.chunk(&document) {
            chunks += 1;
            ready.extend(batcher.push(chunk));
        }
        times.chunk += t.elapsed();
        for batch in ready {
            embed(batch, &mut times)?;
        }
    }
    for batch in batcher.finish() {
        embed(batch, &mut times)?;
    }

    let t = Instant::now();
    let metadata = OutputMetadata {
        model,
        dimensions,
        backend: "api".into(),
        usage,
        requests,
        ..OutputMetadata::default()
    };
    let report = sink.finish(&metadata)?;
    times.write += t.elapsed();

    let seconds = times.chunk + times.decode + times.write;
    println!(
        "{}",
        json!({
            "chunks": chunks,
            "rows": report.rows,
            "seconds": seconds.as_secs_f64(),
            "chunk_seconds": times.chunk.as_secs_f64(),
            "decode_seconds": times.decode.as_secs_f64(),
            "write_seconds": times.write.as_secs_f64(),
            "uncounted_respond_seconds": times.respond.as_secs_f64(),
            "body_bytes": body_bytes,
        })
    );
    Ok(())
}

/// Decodes and checks a response body as the client does.
fn decode(body: &[u8], inputs: usize, dimensions: usize) -> anyhow::Result<Vectors> {
    let response = decode_embeddings(body, inputs * dimensions)?;
    Ok(validate::check(response, inputs, Some(dimensions))?)
}
