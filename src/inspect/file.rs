//! One file read through: its footer, its columns, its rows a batch at a
//! time, and the run's summary beside it.

use std::path::{Path, PathBuf};

use arrow::datatypes::DataType;
use parquet::arrow::ProjectionMask;

use super::footer::{check_schema, read_metadata};
use super::rows::{check_rows, Ids};
use super::{Check, FileReport, BATCH_ROWS};
use crate::job::Shard;
use crate::parquet_io::{
    guard as parquet_guard, key_values, open_reader as parquet_reader, FileError,
};
use crate::state::StateLocation;

pub(super) fn inspect_file(
    path: &Path,
    index: usize,
    files: &[PathBuf],
    ids: &mut Ids,
) -> FileReport {
    let mut report = FileReport {
        path: path.to_path_buf(),
        bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
        ..FileReport::default()
    };
    let unreadable = |report: &mut FileReport, error: FileError| {
        report.problem(Check::Readable, None, None, error.to_string());
    };
    let builder = match parquet_reader(path) {
        Ok(builder) => builder,
        Err(error) => {
            unreadable(&mut report, error);
            return report;
        }
    };
    let footer_rows = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    report.row_groups = builder.metadata().num_row_groups() as u64;
    let key_values = key_values(builder.metadata());
    read_metadata(&mut report, &key_values);
    let schema = builder.schema().clone();
    let length = check_schema(&mut report, &schema);

    let mut roots = Vec::new();
    let id_column = schema
        .index_of("id")
        .ok()
        .filter(|&i| schema.field(i).data_type() == &DataType::Utf8);
    let embedding_column = schema
        .index_of("embedding")
        .ok()
        .filter(|_| length.is_some());
    roots.extend(id_column);
    roots.extend(embedding_column);
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = match parquet_guard(path, || {
        builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
    }) {
        Ok(Ok(reader)) => reader,
        Ok(Err(error)) => {
            let message = format!("{}: not a readable Parquet file: {error}", path.display());
            report.problem(Check::Readable, None, None, message);
            report.rows = footer_rows;
            return report;
        }
        Err(error) => {
            unreadable(&mut report, error);
            report.rows = footer_rows;
            return report;
        }
    };
    let file_index = u32::try_from(index).unwrap_or(u32::MAX);
    let mut reader = reader;
    let mut rows = 0u64;
    loop {
        let next = match parquet_guard(path, || reader.next()) {
            Ok(next) => next,
            Err(error) => {
                unreadable(&mut report, error);
                report.rows = footer_rows;
                return report;
            }
        };
        let batch = match next {
            None => break,
            Some(Ok(batch)) => batch,
            Some(Err(error)) => {
                let message = format!(
                    "{}: not a readable Parquet file: after row {rows}: {error}",
                    path.display()
                );
                report.problem(Check::Readable, Some(rows + 1), None, message);
                report.rows = footer_rows;
                return report;
            }
        };
        check_rows(&mut report, &batch, rows, length, file_index, files, ids);
        rows += batch.num_rows() as u64;
    }
    report.rows = rows;
    if rows != footer_rows {
        report.problem(
            Check::RowCount,
            None,
            None,
            format!("{rows} rows were read but the footer says {footer_rows}"),
        );
    }
    check_summary(&mut report, path, rows);
    report
}

/// The run's summary next to the output, when there is one, must count the
/// same rows.
fn check_summary(report: &mut FileReport, path: &Path, rows: u64) {
    let summary = match (report.shard, path.file_name()) {
        // A shard's state is beside its directory (see `Job::state_stem`).
        (Some(_), Some(name)) => {
            StateLocation::beside(&Shard::state_dir(crate::fsio::parent_dir(path)).join(name))
        }
        _ => StateLocation::beside(path),
    }
    .summary();
    let Ok(text) = std::fs::read_to_string(&summary) else {
        return;
    };
    let written = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("written").and_then(serde_json::Value::as_u64));
    if let Some(written) = written {
        if written != rows {
            report.problem(
                Check::RowCount,
                None,
                None,
                format!(
                    "{rows} rows in the file but the run's summary ({}) says {written} were written",
                    summary.display()
                ),
            );
        }
    }
}
