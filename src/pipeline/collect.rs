//! Batch mode's collection, before the pipeline reads anything: each
//! recorded batch that has ended is read from its output file as it
//! streams, every vector checked as the synchronous path checks it, and
//! committed to the checkpoint's parts with what it was billed, so that the
//! pipeline then finds it stored. Lines that failed are simply not stored,
//! and go again in a later batch; a line refused as bad input is sent again
//! text by text, and a text refused alone is quarantined.
//!
//! A part committed from a batch carries the batch's id and how many of its
//! lines it holds up to: a run killed mid-collection reads those lines again
//! without storing (or billing) them twice.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;

use super::RunError;
use crate::backend::api::BatchService;
use crate::client::{embeddings_from_body, ApiError, BatchLine, BatchObject, BatchStatus};
use crate::contract::BATCH_ID_KEY;
use crate::state::batches::{
    index_by_id, index_path, parse_hash, remove_part_files, BatchRecord, IndexedChunk, PartState,
};
use crate::state::{Billed, PartWriter};
use crate::types::{Chunk, EmbeddedBatch, Usage};

/// How many lines of that batch's files the parts up to this one hold.
pub(super) const BATCH_LINES_KEY: &str = "embedjob.batch_lines";

/// What collection did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Collected {
    /// Batches that ended and were read.
    pub batches: u64,
    /// Texts whose vectors were stored.
    pub vectors: u64,
    /// What the stored lines were billed.
    pub usage: Usage,
    /// Lines that failed or expired: their texts go again.
    pub failed_lines: u64,
    /// Texts refused as bad input when sent alone: quarantined.
    pub refused: u64,
    /// Vectors that failed a check: their texts go again.
    pub rejected: u64,
    /// Batches that failed whole (validation, the enqueued-token quota).
    pub failed_batches: u64,
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// What batch mode did in a run, for its summary.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct BatchSummary {
    /// Price per 1000 input tokens in batch mode, when known.
    pub input_per_1k: Option<f64>,
    /// The synchronous price, for comparison.
    pub sync_input_per_1k: Option<f64>,
    /// Batches that ended and were read in this run.
    pub collected: Collected,
    /// What the collected lines cost at the batch price.
    pub collected_cost: Option<f64>,
    /// Batches created in this run, and adopted (created by a run killed
    /// before it recorded them).
    pub created: u64,
    pub adopted: u64,
    /// Chunks written to new request files in this run.
    pub submitted_chunks: u64,
    /// Chunks left for a later run by the enqueued-token cap or the budget.
    pub held_back_chunks: u64,
    /// Batches (and their chunks) left on the service, or not yet sent.
    pub pending_batches: u64,
    pub pending_chunks: u64,
    /// When the last pending batch's window ends (Unix seconds).
    pub window_ends_at: Option<u64>,
    /// The enqueued-token cap in force.
    pub enqueued_token_cap: Option<u64>,
}

/// Collects every recorded batch that has ended, saving the record after each.
pub(super) async fn collect(
    service: &BatchService,
    dir: &Path,
    record: &mut BatchRecord,
    parts: &mut PartWriter,
    committed: &[PathBuf],
) -> Result<Collected, RunError> {
    let mut collected = Collected::default();
    let mut dimensions = service.expected_dimensions;
    let numbers: Vec<u64> = record
        .parts
        .iter()
        .filter(|p| p.state == PartState::Submitted)
        .map(|p| p.number)
        .collect();
    for number in numbers {
        let Some(id) = record.part_mut(number).and_then(|p| p.batch_id.clone()) else {
            continue;
        };
        let batch = match service.client.batch(&id).await {
            Ok(batch) => batch,
            Err(e) if e.status == Some(404) => {
                // Gone from the service: its texts go again.
                collected
                    .warnings
                    .push(format!("batch {id} is no longer known to the service: {e}"));
                finish_part(service, dir, record, number, None).await?;
                continue;
            }
            Err(e) => {
                collected
                    .warnings
                    .push(format!("cannot ask about batch {id}: {e}"));
                continue;
            }
        };
        if let Some(part) = record.part_mut(number) {
            part.status = Some(batch.status.as_str().to_string());
            part.expires_at = batch.expires_at.or(part.expires_at);
        }
        if !batch.status.is_terminal() {
            continue;
        }
        collected.batches += 1;
        if batch.status == BatchStatus::Failed {
            collected.failed_batches += 1;
            learn_cap(record, number, &batch, &mut collected);
        }
        let reading = Reading {
            index: index_by_id(&index_path(dir, number))?,
            skip: lines_held(committed, &parts_committed(parts), &id),
            line: 0,
        };
        let mut reading = reading;
        parts.set_extra(BATCH_ID_KEY, id.clone());
        for file in [&batch.output_file_id, &batch.error_file_id]
            .into_iter()
            .flatten()
        {
            let max = line_bound(&reading.index, dimensions);
            let mut lines = match service.client.file_lines(file, max).await {
                Ok(lines) => Box::pin(lines),
                Err(e) => return Err(collect_error(&id, &e)),
            };
            while let Some(line) = lines.next().await {
                let line = line.map_err(|e| collect_error(&id, &e))?;
                reading.line += 1;
                parts.set_extra(BATCH_LINES_KEY, reading.line.to_string());
                if reading.line <= reading.skip {
                    continue;
                }
                take_line(
                    &line,
                    &reading,
                    record,
                    parts,
                    &mut dimensions,
                    &mut collected,
                )?;
            }
        }
        parts.commit()?;
        finish_part(service, dir, record, number, Some(&batch)).await?;
    }
    record.save(dir)?;
    Ok(collected)
}

/// The longest line a batch of the part indexed `index` can rightly
/// answer: the synchronous bound on an answer to its largest request (its
/// inputs times a vector written as the widest JSON floats, plus room for
/// the rest, which covers the line's envelope and an error's message).
fn line_bound(index: &HashMap<String, Vec<IndexedChunk>>, dimensions: Option<usize>) -> usize {
    let inputs = index.values().map(Vec::len).max().unwrap_or(1).max(1);
    crate::client::embeddings_limit(inputs, dimensions)
}

/// What is known while reading one batch's files.
struct Reading {
    index: HashMap<String, Vec<IndexedChunk>>,
    /// Lines already in the checkpoint's parts.
    skip: u64,
    /// The line being read, counted from 1 across the output and error files.
    line: u64,
}

/// Stores one line's vectors, or notes why it has none.
fn take_line(
    line: &BatchLine,
    reading: &Reading,
    record: &mut BatchRecord,
    parts: &mut PartWriter,
    dimensions: &mut Option<usize>,
    collected: &mut Collected,
) -> Result<(), RunError> {
    let Some(indexed) = reading.index.get(&line.custom_id) else {
        collected.warnings.push(format!(
            "a batch answered {:?}, which no request of the job carries; passed over",
            line.custom_id
        ));
        return Ok(());
    };
    if let Some(error) = line.api_error() {
        collected.failed_lines += 1;
        if refused_as_bad_input(&error) {
            if let [only] = indexed.as_slice() {
                collected.refused += 1;
                record.refused.insert(only.0.clone(), error.message.clone());
            } else {
                record.alone.extend(indexed.iter().map(|c| c.0.clone()));
            }
        }
        return Ok(());
    }
    let body = line.response.as_ref().map(|r| &r.body);
    let raw = match body.map(embeddings_from_body) {
        Some(Ok(raw)) => raw,
        _ => {
            collected.failed_lines += 1;
            return Ok(());
        }
    };
    let usage = raw.usage.unwrap_or_default();
    let checked = match crate::validate::check_rows(raw, indexed.len(), *dimensions) {
        Ok(checked) => checked,
        Err(e) => {
            // Billed, and of no use: its texts go again.
            collected.rejected += indexed.len() as u64;
            collected.warnings.push(format!(
                "the answer to {} failed a check, its texts go again: {e}",
                line.custom_id
            ));
            collected.usage += usage;
            parts.add_billed(Billed {
                usage,
                requests: 1,
                discarded_tokens: usage.prompt_tokens,
            })?;
            return Ok(());
        }
    };
    let mut vectors = checked.vectors;
    dimensions.get_or_insert(vectors.dimensions);
    let rejected: std::collections::HashSet<usize> =
        checked.rejected.iter().map(|r| r.index).collect();
    let mut chunks = Vec::with_capacity(indexed.len() - rejected.len());
    for (i, chunk) in indexed.iter().enumerate() {
        if rejected.contains(&i) {
            vectors.discarded.prompt_tokens += u64::from(chunk.1);
            continue;
        }
        let Some(hash) = parse_hash(&chunk.0) else {
            return Err(RunError::Internal(format!(
                "the index of {} holds a damaged content hash",
                line.custom_id
            )));
        };
        chunks.push(collected_chunk(&line.custom_id, i, hash, chunk.1));
    }
    collected.rejected += rejected.len() as u64;
    collected.vectors += chunks.len() as u64;
    collected.usage += vectors.usage;
    let batch = EmbeddedBatch { chunks, vectors };
    if batch.chunks.is_empty() {
        parts.add_billed(Billed {
            usage: batch.vectors.usage,
            requests: 1,
            discarded_tokens: batch.vectors.usage.prompt_tokens,
        })?;
    } else {
        parts.append(&batch)?;
    }
    Ok(())
}

/// A row of the checkpoint for a collected vector: the store needs its
/// content hash; the pipeline gives it its chunk's id when it reads it back.
fn collected_chunk(custom_id: &str, i: usize, hash: [u8; 32], tokens: u32) -> Chunk {
    let id: Arc<str> = Arc::from(custom_id);
    Chunk {
        id: format!("{custom_id}#{i}"),
        doc_id: Arc::clone(&id),
        source: id,
        chunk_index: u32::try_from(i).unwrap_or(u32::MAX),
        byte_start: 0,
        byte_end: 0,
        text: String::new(),
        content_hash: hash,
        token_count: tokens,
        metadata: None,
    }
}

/// A refusal of the line itself (400 `invalid_request_error`, an input over
/// the window, a request too large), which sending it again would only
/// repeat: its texts go alone, and a text refused alone is quarantined.
fn refused_as_bad_input(error: &ApiError) -> bool {
    matches!(error.status, Some(400 | 413 | 422)) && !error.is_transient()
}

/// A failed batch whose failure is the enqueued-token quota teaches the cap:
/// what the job had enqueued besides, or half of this batch when nothing.
fn learn_cap(record: &mut BatchRecord, number: u64, batch: &BatchObject, c: &mut Collected) {
    let quota = batch
        .errors
        .iter()
        .any(|e| e.code.as_deref() == Some("token_limit_exceeded"));
    let own = record
        .parts
        .iter()
        .find(|p| p.number == number)
        .map_or(0, |p| p.tokens);
    if quota {
        let others = record.enqueued_tokens().saturating_sub(own);
        let cap = if others > 0 { others } else { (own / 2).max(1) };
        let cap = record.learned_cap.map_or(cap, |known| known.min(cap));
        record.learned_cap = Some(cap);
        c.warnings.push(format!(
            "batch {} was refused for the enqueued-token quota: at most {cap} tokens are \
             enqueued at once from now on; its texts go again",
            batch.id
        ));
    } else {
        let why: Vec<String> = batch.errors.iter().map(|e| e.message.clone()).collect();
        c.warnings.push(format!(
            "batch {} failed ({}); its texts go again",
            batch.id,
            why.join("; ")
        ));
    }
}

/// Marks a part collected, and removes its files, here and on the service.
async fn finish_part(
    service: &BatchService,
    dir: &Path,
    record: &mut BatchRecord,
    number: u64,
    batch: Option<&BatchObject>,
) -> Result<(), RunError> {
    if let Some(part) = record.part_mut(number) {
        part.state = PartState::Collected;
    }
    record.save(dir)?;
    remove_part_files(dir, number)?;
    if let Some(batch) = batch {
        let files = [
            Some(&batch.input_file_id),
            batch.output_file_id.as_ref(),
            batch.error_file_id.as_ref(),
        ];
        for file in files.into_iter().flatten() {
            // Left on the service at worst; it expires them.
            let _ = service.client.delete_file(file).await;
        }
    }
    Ok(())
}

/// Parts this run's writer committed, besides those on disk before it.
fn parts_committed(parts: &PartWriter) -> Vec<PathBuf> {
    parts.committed().to_vec()
}

/// How many lines of batch `id` the checkpoint's parts hold.
fn lines_held(earlier: &[PathBuf], now: &[PathBuf], id: &str) -> u64 {
    earlier
        .iter()
        .chain(now)
        .filter_map(|path| crate::parquet_io::read_key_values(path).ok())
        .filter(|meta| meta.get(BATCH_ID_KEY).map(String::as_str) == Some(id))
        .filter_map(|meta| meta.get(BATCH_LINES_KEY)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

fn collect_error(id: &str, e: &ApiError) -> RunError {
    RunError::Internal(format!(
        "cannot read the results of batch {id}: {e}; the next run reads them again"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_bound_follows_the_largest_request_and_holds_float_answers() {
        let chunk = |n: u32| IndexedChunk(format!("{n:032x}"), 1);
        let index = HashMap::from([
            ("p1-0".to_string(), (0..8).map(chunk).collect::<Vec<_>>()),
            ("p1-1".to_string(), vec![chunk(9)]),
        ]);
        let bound = line_bound(&index, Some(1024));
        // 8 inputs × (1024 × 48 + 256) + 65,536.
        assert_eq!(bound, 460_800);
        // The widest answer to the largest line, floats in JSON, fits.
        let value = -0.001_234_567_8_f32;
        let data: Vec<serde_json::Value> = (0..8)
            .map(|i| serde_json::json!({"object": "embedding", "index": i, "embedding": vec![value; 1024]}))
            .collect();
        let line = serde_json::json!({
            "id": "batch_req_0123456789abcdef",
            "custom_id": "p1-0",
            "response": {"status_code": 200, "request_id": "req_0123456789abcdef", "body": {
                "object": "list", "data": data, "model": "text-embedding-3-large",
                "usage": {"prompt_tokens": 8191, "total_tokens": 8191}
            }},
            "error": null,
        });
        let pretty = serde_json::to_string_pretty(&line).unwrap();
        assert!(pretty.len() < bound, "{} bytes", pretty.len());
    }
}
