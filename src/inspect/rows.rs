//! Each row: an id seen once, and a vector of the right length, without
//! nulls, finite and not all zeros.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::PathBuf;

use arrow::array::{Array, AsArray, FixedSizeListArray, RecordBatch};
use arrow::datatypes::Float32Type;

use super::{Check, FileReport};
use crate::types::id_key128;

/// Ids seen so far, as 128-bit hashes with the file they were first seen in.
#[derive(Default)]
pub(super) struct Ids {
    pub(super) seen: HashMap<u128, u32>,
}

pub(super) fn check_rows(
    report: &mut FileReport,
    batch: &RecordBatch,
    rows_before: u64,
    length: Option<usize>,
    file_index: u32,
    files: &[PathBuf],
    ids: &mut Ids,
) {
    let id_array = batch
        .column_by_name("id")
        .and_then(|c| c.as_string_opt::<i32>());
    let embeddings: Option<&FixedSizeListArray> = batch
        .column_by_name("embedding")
        .and_then(|c| c.as_fixed_size_list_opt());
    for i in 0..batch.num_rows() {
        let row = rows_before + i as u64 + 1;
        let id = id_array.and_then(|a| a.is_valid(i).then(|| a.value(i)));
        if id_array.is_some() {
            check_id(report, row, id, file_index, files, ids);
        }
        let (Some(list), Some(length)) = (embeddings, length) else {
            continue;
        };
        if list.is_null(i) {
            report.problem(
                Check::VectorLength,
                Some(row),
                id,
                "the embedding is null".to_string(),
            );
            continue;
        }
        let vector = list.value(i);
        let Some(values) = vector.as_primitive_opt::<Float32Type>() else {
            continue;
        };
        if values.len() != length {
            report.problem(
                Check::VectorLength,
                Some(row),
                id,
                format!("the vector has {} values, not {length}", values.len()),
            );
            continue;
        }
        if values.null_count() > 0 {
            let at = (0..values.len()).find(|&p| values.is_null(p)).unwrap_or(0);
            report.problem(
                Check::VectorLength,
                Some(row),
                id,
                format!("value {at} of the vector is null"),
            );
            continue;
        }
        let values = values.values();
        if let Some(at) = values.iter().position(|v| !v.is_finite()) {
            report.problem(
                Check::Finite,
                Some(row),
                id,
                format!("value {at} of the vector is {}", values[at]),
            );
        } else if values.iter().all(|&v| v == 0.0) {
            report.problem(
                Check::NotAllZero,
                Some(row),
                id,
                "the vector is all zeros".to_string(),
            );
        }
    }
}

fn check_id(
    report: &mut FileReport,
    row: u64,
    id: Option<&str>,
    file_index: u32,
    files: &[PathBuf],
    ids: &mut Ids,
) {
    let Some(id) = id else {
        report.problem(
            Check::UniqueIds,
            Some(row),
            None,
            "the id is null".to_string(),
        );
        return;
    };
    match ids.seen.entry(id_key128(id)) {
        Entry::Vacant(slot) => {
            slot.insert(file_index);
        }
        Entry::Occupied(first) => {
            let first = *first.get();
            let place = if first == file_index {
                "earlier in this file".to_string()
            } else {
                files
                    .get(first as usize)
                    .map_or_else(String::new, |f| format!("in {}", f.display()))
            };
            report.problem(
                Check::UniqueIds,
                Some(row),
                Some(id),
                format!("id {id:?} repeats (first seen {place})"),
            );
        }
    }
}
