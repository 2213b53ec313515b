//! The memory `Client::file_lines` takes to read a batch's output file: a
//! 200 MB body of output lines (eight 1024-dimension vectors in base64 each)
//! served from 127.0.0.1, read line by line with every line's vectors
//! decoded, against the same process reading a 2 MB body the same way (the
//! baseline) and the 200 MB body read whole (what streaming avoids); and
//! the memory `Client::upload_batch_file` takes to send a file of that size.
//!
//! ```text
//! cargo run --release --example batch_lines_memory -- [MEGABYTES]
//! ```
//!
//! Prints one JSON object: the bytes and lines read and the process's peak
//! resident memory (`VmHWM`) after each step, in MiB, and the ratio of the
//! streamed read's peak to the baseline's.

use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine as _;
use embedjob::client::{embeddings_from_body, ApiKey, Client, ClientConfig};
use futures::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const MIB: f64 = 1024.0 * 1024.0;
/// The longest line the reader takes: each line here is about 44 KB.
const MAX_LINE_BYTES: usize = 1 << 20;

/// One output line, padded to the same length for every `n`.
fn line(n: usize, vector_base64: &str) -> Vec<u8> {
    let data: Vec<_> = (0..8)
        .map(|i| json!({"object": "embedding", "index": i, "embedding": vector_base64}))
        .collect();
    let body = json!({"object": "list", "data": data, "model": "svc-embed-1",
                      "usage": {"prompt_tokens": 80, "total_tokens": 80}});
    let mut text = json!({"id": format!("batch_req_{n:012}"), "custom_id": format!("p0-{n:012}"),
        "response": {"status_code": 200, "request_id": format!("req_{n:012}"), "body": body},
        "error": null})
    .to_string();
    text.push('\n');
    text.into_bytes()
}

/// What the server does with one connection.
enum Answer {
    /// Sends this many output lines.
    Lines(usize),
    /// Reads an upload to its end, keeping nothing, and answers with a file.
    Upload,
}

/// Serves each of `answers` to one connection, in order, then stops.
async fn serve(listener: TcpListener, answers: Vec<Answer>, vector: String) -> anyhow::Result<()> {
    for answer in answers {
        let (mut socket, _) = listener.accept().await?;
        // The request's head, up to its blank line, within 64 KiB.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if socket.read(&mut byte).await? == 0 || head.len() > 64 * 1024 {
                bail!("a bad request head");
            }
            head.push(byte[0]);
        }
        let lines = match answer {
            Answer::Lines(lines) => lines,
            Answer::Upload => {
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let length: u64 = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .context("an upload without a length")?
                    .trim()
                    .parse()?;
                tokio::io::copy(&mut (&mut socket).take(length), &mut tokio::io::sink()).await?;
                let file = json!({"id": "file-up", "object": "file", "bytes": length,
                                  "filename": "up.jsonl", "purpose": "batch"})
                .to_string();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{file}",
                    file.len()
                );
                socket.write_all(response.as_bytes()).await?;
                socket.shutdown().await?;
                continue;
            }
        };
        let length: usize = (0..lines).map(|n| line(n, &vector).len()).sum();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
             content-length: {length}\r\nconnection: close\r\n\r\n"
        );
        socket.write_all(response.as_bytes()).await?;
        let mut buffer = Vec::with_capacity(256 * 1024);
        for n in 0..lines {
            buffer.extend_from_slice(&line(n, &vector));
            if buffer.len() >= 192 * 1024 {
                socket.write_all(&buffer).await?;
                buffer.clear();
            }
        }
        socket.write_all(&buffer).await?;
        socket.shutdown().await?;
    }
    Ok(())
}

/// The process's peak resident memory so far, in MiB.
fn peak_mib() -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("no VmHWM in /proc/self/status")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb * 1024.0 / MIB)
}

/// Streams file `id`'s lines, decoding each line's vectors: (bytes, lines).
async fn stream(client: &Client) -> anyhow::Result<(usize, usize)> {
    let mut lines = Box::pin(client.file_lines("file-bench", MAX_LINE_BYTES).await?);
    let (mut values, mut count) = (0, 0);
    while let Some(line) = lines.next().await {
        let line = line?;
        let body = line.response.context("a line without a response")?.body;
        values += embeddings_from_body(&body)?.values.len();
        count += 1;
    }
    Ok((values * 4, count))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let megabytes: usize = std::env::args()
        .nth(1)
        .map_or(Ok(200), |a| a.parse())
        .context("MEGABYTES must be a whole number")?;
    let vector: Vec<u8> = (0..1024u32)
        .flat_map(|i| (i as f32 / 1024.0).to_le_bytes())
        .collect();
    let vector = base64::engine::general_purpose::STANDARD.encode(vector);
    let per_line = line(0, &vector).len();
    let lines_for = |mb: usize| (mb * 1_000_000).div_ceil(per_line);
    let (small, large) = (lines_for(2), lines_for(megabytes));

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let answers = vec![
        Answer::Lines(small),
        Answer::Lines(large),
        Answer::Upload,
        Answer::Lines(large),
    ];
    let server = tokio::spawn(serve(listener, answers, vector.clone()));
    let mut config = ClientConfig::new(format!("http://{addr}"), ApiKey::new("sk-bench"));
    config.timeout = Duration::from_secs(60);
    let client = Client::new(config)?;

    let (_, baseline_lines) = stream(&client).await?;
    let baseline = peak_mib()?;
    let (decoded, streamed_lines) = stream(&client).await?;
    let streamed = peak_mib()?;
    let dir = tempfile::tempdir()?;
    let upload = dir.path().join("requests.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&upload)?);
    for n in 0..large {
        std::io::Write::write_all(&mut file, &line(n, &vector))?;
    }
    std::io::Write::flush(&mut file)?;
    drop(file);
    let uploaded = client.upload_batch_file(&upload, "up.jsonl").await?.bytes;
    let after_upload = peak_mib()?;
    let whole = reqwest::get(format!("http://{addr}/v1/files/file-bench/content"))
        .await?
        .bytes()
        .await?;
    let whole_len = whole.len();
    drop(whole);
    let read_whole = peak_mib()?;
    server.await??;

    println!(
        "{}",
        json!({
            "body_bytes": large * per_line,
            "lines": streamed_lines,
            "baseline_lines": baseline_lines,
            "vector_bytes_decoded": decoded,
            "peak_mib_after_2mb_streamed": baseline,
            "peak_mib_after_large_streamed": streamed,
            "upload_request_bytes": uploaded,
            "peak_mib_after_large_uploaded": after_upload,
            "peak_mib_after_large_read_whole": read_whole,
            "whole_body_bytes": whole_len,
            "streamed_over_baseline": streamed / baseline,
        })
    );
    Ok(())
}
