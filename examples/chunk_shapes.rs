//! Chunking time per MB for text of different shapes.
use std::sync::Arc;
use std::time::Instant;

use embedjob::chunk::{Chunker, TokenChunker};
use embedjob::job::ChunkingConfig;
use embedjob::types::Document;

fn words(bytes: usize, newline_every: Option<usize>) -> String {
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
    let mut text = String::with_capacity(bytes + 16);
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut n = 0;
    while text.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
        n += 1;
        match newline_every {
            Some(k) if n % k == 0 => text.push_str(".\n"),
            _ => text.push(' '),
        }
    }
    text
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let bytes = (mb * 1e6) as usize;
    let chunker = TokenChunker::cl100k(&ChunkingConfig::default()).unwrap();
    chunker.count_tokens("warm up");
    let shapes: Vec<(&str, String)> = vec![
        ("words, a line every 12 words", words(bytes, Some(12))),
        ("words, one line", words(bytes, None)),
        ("no whitespace", "abcdefghij".repeat(bytes / 10)),
        ("dna", {
            let mut s = String::new();
            let b = b"ACGT";
            let mut x: u64 = 7;
            while s.len() < bytes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.push(b[(x % 4) as usize] as char);
            }
            s
        }),
    ];
    for (name, text) in shapes {
        let doc = Document {
            doc_id: "d".into(),
            source: Arc::from("d.txt"),
            text,
        };
        let started = Instant::now();
        let chunks = chunker.chunk(&doc);
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{name:32} {:.2} MB {:>6} chunks {:8.2} s  {:8.2} s/MB",
            doc.text.len() as f64 / 1e6,
            chunks.len(),
            secs,
            secs / (doc.text.len() as f64 / 1e6)
        );
    }
}
