//! A Parquet file in the output's layout as [`StoredRows`]: the previous
//! output and checkpoint parts are read back through it.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::arrow::ProjectionMask;

use super::checksum::Checksum;
use super::{embedding_dimensions, guard, key_values, load_metadata, FileError};
use crate::contract::CHECKSUM_KEY;
use crate::fsio::FsError;
use crate::store::{ReadRow, Row, StoreError, StoredRows};

/// Rows decoded at a time when scanning a file.
const SCAN_BATCH_ROWS: usize = 8192;

/// A Parquet file of chunks and vectors, read by content hash.
pub struct ParquetRows {
    path: PathBuf,
    dimensions: usize,
    key_values: BTreeMap<String, String>,
    /// The footer, while the file is read often (see [`StoredRows::release`]).
    metadata: Option<ArrowReaderMetadata>,
}

impl ParquetRows {
    /// Opens `path`, checking that it holds vectors in the output's layout.
    pub fn open(path: &Path) -> Result<ParquetRows, StoreError> {
        let metadata = load_metadata(path)?;
        let dimensions = embedding_dimensions(metadata.schema())
            .map_err(|m| StoreError::corrupt(path.display().to_string(), m))?;
        Ok(ParquetRows {
            path: path.to_path_buf(),
            dimensions,
            key_values: key_values(metadata.metadata()),
            metadata: None,
        })
    }

    fn corrupt(&self, message: impl std::fmt::Display) -> StoreError {
        StoreError::corrupt(self.path.display().to_string(), message.to_string())
    }

    /// A batch's content hashes and embedding column, and the embedding's values.
    fn vector_columns<'a>(
        &self,
        batch: &'a RecordBatch,
    ) -> Result<
        (
            &'a arrow::array::StringArray,
            &'a arrow::array::FixedSizeListArray,
            &'a arrow::array::Float32Array,
        ),
        StoreError,
    > {
        let hashes = string_column(batch, "content_hash").map_err(|m| self.corrupt(m))?;
        let embedding = batch
            .column_by_name("embedding")
            .and_then(|c| c.as_fixed_size_list_opt())
            .ok_or_else(|| self.corrupt("no fixed-size-list column \"embedding\""))?;
        let floats = embedding
            .values()
            .as_primitive_opt::<Float32Type>()
            .ok_or_else(|| self.corrupt("\"embedding\" does not hold float32 values"))?;
        Ok((hashes, embedding, floats))
    }

    fn footer(&mut self) -> Result<ArrowReaderMetadata, StoreError> {
        if let Some(metadata) = &self.metadata {
            return Ok(metadata.clone());
        }
        let metadata = load_metadata(&self.path)?;
        self.metadata = Some(metadata.clone());
        Ok(metadata)
    }

    fn file(&self) -> Result<File, StoreError> {
        File::open(&self.path)
            .map_err(|e| FileError::from(FsError::io(&self.path, "cannot open")(e)).into())
    }
}

impl StoredRows for ParquetRows {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn metadata(&self) -> &BTreeMap<String, String> {
        &self.key_values
    }

    fn scan(&mut self, with_ids: bool, visit: &mut dyn FnMut(Row<'_>)) -> Result<(), StoreError> {
        let metadata = self.footer()?;
        let mut columns = vec![column(&metadata, "content_hash").map_err(|m| self.corrupt(m))?];
        if with_ids {
            columns.push(column(&metadata, "id").map_err(|m| self.corrupt(m))?);
        }
        let mask = ProjectionMask::roots(metadata.parquet_schema(), columns);
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(self.file()?, metadata)
            .with_projection(mask)
            .with_batch_size(SCAN_BATCH_ROWS)
            .build()
            .map_err(|e| self.corrupt(e))?;
        let mut row: u64 = 0;
        loop {
            let batch = match guard(&self.path, || reader.next())? {
                None => break,
                Some(batch) => batch.map_err(|e| self.corrupt(e))?,
            };
            let hashes = string_column(&batch, "content_hash").map_err(|m| self.corrupt(m))?;
            let ids = if with_ids {
                Some(string_column(&batch, "id").map_err(|m| self.corrupt(m))?)
            } else {
                None
            };
            for i in 0..batch.num_rows() {
                row += 1;
                let content_hash = parse_hash(hashes.value(i)).ok_or_else(|| {
                    self.corrupt(format!("row {row}: content_hash is not a SHA-256"))
                })?;
                visit(Row {
                    content_hash,
                    id: ids.map(|ids| ids.value(i)),
                });
            }
        }
        Ok(())
    }

    fn read(&mut self, rows: &[usize], found: &mut ReadRow<'_>) -> Result<(), StoreError> {
        let metadata = self.footer()?;
        let (groups, selection) = select(&metadata, rows);
        let mask = ProjectionMask::roots(
            metadata.parquet_schema(),
            [
                column(&metadata, "content_hash").map_err(|m| self.corrupt(m))?,
                column(&metadata, "embedding").map_err(|m| self.corrupt(m))?,
            ],
        );
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(self.file()?, metadata)
            .with_projection(mask)
            .with_row_groups(groups)
            .with_row_selection(selection)
            .with_batch_size(rows.len().clamp(1, 4096))
            .build()
            .map_err(|e| self.corrupt(e))?;
        let dimensions = self.dimensions;
        let mut k = 0usize;
        while let Some(batch) = guard(&self.path, || reader.next())? {
            let batch = batch.map_err(|e| self.corrupt(e))?;
            let (hashes, embedding, floats) = self.vector_columns(&batch)?;
            for i in 0..batch.num_rows() {
                let Some(&row) = rows.get(k) else {
                    return Err(self.corrupt("returned more rows than selected"));
                };
                if embedding.is_null(i) {
                    return Err(self.corrupt(format!("row {}: the embedding is null", row + 1)));
                }
                let hash = parse_hash(hashes.value(i)).unwrap_or([0; 32]);
                let start = embedding.value_offset_at(i);
                let vector = floats
                    .values()
                    .get(start..start + dimensions)
                    .ok_or_else(|| {
                        self.corrupt(format!("row {}: the vector is cut short", row + 1))
                    })?;
                found(k, &hash, vector);
                k += 1;
            }
        }
        Ok(())
    }

    fn release(&mut self) {
        self.metadata = None;
    }

    /// Reads every vector once and compares the checksum recorded when the
    /// file was written ([`CHECKSUM_KEY`]).
    fn verify(&mut self) -> Result<(), StoreError> {
        let Some(recorded) = self.key_values.get(CHECKSUM_KEY).cloned() else {
            return Err(self.corrupt(format!(
                "it records no {CHECKSUM_KEY}, so its vectors cannot be checked"
            )));
        };
        let metadata = self.footer()?;
        let mask = ProjectionMask::roots(
            metadata.parquet_schema(),
            [
                column(&metadata, "content_hash").map_err(|m| self.corrupt(m))?,
                column(&metadata, "embedding").map_err(|m| self.corrupt(m))?,
            ],
        );
        // About 4 MiB of vectors at a time, whatever their length.
        let rows = ((4 << 20) / (4 * self.dimensions.max(1))).max(1);
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(self.file()?, metadata)
            .with_projection(mask)
            .with_batch_size(rows)
            .build()
            .map_err(|e| self.corrupt(e))?;
        let mut checksum = Checksum::new();
        let mut row: u64 = 0;
        while let Some(batch) = guard(&self.path, || reader.next())? {
            let batch = batch.map_err(|e| self.corrupt(e))?;
            let (hashes, embedding, floats) = self.vector_columns(&batch)?;
            for i in 0..batch.num_rows() {
                row += 1;
                let hash = parse_hash(hashes.value(i)).ok_or_else(|| {
                    self.corrupt(format!("row {row}: content_hash is not a SHA-256"))
                })?;
                let start = embedding.value_offset_at(i);
                let vector = floats
                    .values()
                    .get(start..start + self.dimensions)
                    .ok_or_else(|| self.corrupt(format!("row {row}: the vector is cut short")))?;
                checksum.row(&hash, vector);
            }
        }
        if checksum.value() == recorded {
            Ok(())
        } else {
            Err(self.corrupt(format!(
                "its rows do not match the {CHECKSUM_KEY} recorded when it was written: \
                 the file was damaged since"
            )))
        }
    }
}

/// The row groups holding `rows`, and within them only the pages holding
/// them (by the offset index), as a row selection over those groups.
fn select(metadata: &ArrowReaderMetadata, rows: &[usize]) -> (Vec<usize>, RowSelection) {
    let mut groups = Vec::new();
    let mut ranges = Vec::with_capacity(rows.len());
    let (mut group_start, mut read_rows) = (0usize, 0usize);
    let mut wanted_rows = rows.iter().peekable();
    for (index, row_group) in metadata.metadata().row_groups().iter().enumerate() {
        let group_rows = usize::try_from(row_group.num_rows()).unwrap_or(0);
        let group_end = group_start + group_rows;
        let mut touched = false;
        while let Some(&&row) = wanted_rows.peek() {
            if row >= group_end {
                break;
            }
            let at = read_rows + (row - group_start);
            ranges.push(at..at + 1);
            touched = true;
            wanted_rows.next();
        }
        if touched {
            groups.push(index);
            read_rows += group_rows;
        }
        group_start = group_end;
    }
    (
        groups,
        RowSelection::from_consecutive_ranges(ranges.into_iter(), read_rows),
    )
}

fn column(metadata: &ArrowReaderMetadata, name: &str) -> Result<usize, String> {
    metadata
        .schema()
        .index_of(name)
        .map_err(|_| format!("no column {name:?}"))
}

fn string_column<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> Result<&'a arrow::array::StringArray, String> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name:?}"))?;
    if column.null_count() > 0 {
        return Err(format!("column {name:?} holds nulls"));
    }
    column
        .as_string_opt::<i32>()
        .ok_or_else(|| format!("column {name:?} is not utf8"))
}

fn parse_hash(hex_text: &str) -> Option<[u8; 32]> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut hash).ok()?;
    Some(hash)
}
