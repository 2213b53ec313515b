//! Chunking time per MB by the shape of the text, as ratios measured in one
//! run: each shape against text with a line end every 12 words (the
//! baseline), and each shape's time per MB at the largest size against the
//! smallest. A ratio that grows with the size would mean chunking is not
//! linear in the length of a line.
//!
//! ```text
//! cargo run --release --example chunk_shapes [MB...]    (default: 0.25 1 4)
//! ```

use std::sync::Arc;
use std::time::Instant;

use embedjob::chunk::{Chunker, TokenChunker};
use embedjob::job::ChunkingConfig;
use embedjob::types::Document;

/// Text of one shape, `bytes` long.
fn shaped(shape: &str, bytes: usize) -> String {
    const WORDS: &[&str] = &[
        "vector",
        "index",
        "token",
        "batch",
        "embedding",
        "service",
        "parquet",
        "chunk",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        usize::try_from(state % n as u64).unwrap_or(0)
    };
    let mut text = String::with_capacity(bytes + 16);
    let mut words = 0;
    while text.len() < bytes {
        match shape {
            "lines" | "one line" => {
                text.push_str(WORDS[next(WORDS.len())]);
                words += 1;
                let end = shape == "lines" && words % 12 == 0;
                text.push_str(if end { ".\n" } else { " " });
            }
            "no space" => text.push(char::from(b"abcdefghijklmnopqrstuvwxyz"[next(26)])),
            _ => text.push(char::from(b"ACGT"[next(4)])),
        }
    }
    text
}

/// Seconds per MB to chunk `text`.
fn seconds_per_mb(chunker: &TokenChunker, text: String) -> f64 {
    let megabytes = text.len() as f64 / 1e6;
    let document = Document {
        doc_id: "d".into(),
        source: Arc::from("d.txt"),
        text,
        metadata: None,
    };
    let started = Instant::now();
    let chunks = chunker.chunk(&document);
    assert!(!chunks.is_empty());
    started.elapsed().as_secs_f64() / megabytes
}

fn main() {
    let mut sizes: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = vec![0.25, 1.0, 4.0];
    }
    let chunker = TokenChunker::cl100k(&ChunkingConfig::default()).expect("the chunker builds");
    chunker.count_tokens("load the encoding before timing");
    let shapes = ["lines", "one line", "no space", "dna"];
    println!(
        "{:<10} {:>8} {:>8} {:>12}",
        "shape", "MB", "s/MB", "vs lines"
    );
    let mut first: Vec<f64> = Vec::new();
    let mut last: Vec<f64> = Vec::new();
    for &mb in &sizes {
        let bytes = (mb * 1e6) as usize;
        let baseline = seconds_per_mb(&chunker, shaped("lines", bytes));
        for (i, shape) in shapes.iter().enumerate() {
            let per_mb = if i == 0 {
                baseline
            } else {
                seconds_per_mb(&chunker, shaped(shape, bytes))
            };
            println!(
                "{shape:<10} {mb:>8.2} {per_mb:>8.3} {:>11.2}x",
                per_mb / baseline
            );
            if first.len() < shapes.len() {
                first.push(per_mb);
            }
            if last.len() == shapes.len() {
                last[i] = per_mb;
            } else {
                last.push(per_mb);
            }
        }
    }
    println!(
        "\ntime per MB at {} MB over time per MB at {} MB:",
        sizes[sizes.len() - 1],
        sizes[0]
    );
    for (i, shape) in shapes.iter().enumerate() {
        println!("{shape:<10} {:>8.2}x", last[i] / first[i]);
    }
}
