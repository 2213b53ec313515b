//! Parquet: a file, or a directory of `*.parquet` files read in name order.
//!
//! Only the text (and id, and metadata) columns are decoded, a record batch
//! at a time, so memory is bounded by one batch whatever the file's size. A
//! batch holds as many rows as fit [`BATCH_BYTES`] by the footer's sizes of
//! each row group, so rows of long texts come a few at a time; a text longer
//! than [`MAX_DOCUMENT_BYTES`] is an error naming its row and column.
//! Every codec Parquet allows is read: snappy, gzip, lz4, zstd and brotli.

mod config;

pub use self::config::KIND;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, LargeStringArray, RecordBatch, StringArray, StringViewArray,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Schema};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::ParquetMetaData;

use super::{io_error, metadata, path_text, Document, Source, SourceError, SourceStats};
use crate::bounded::{describe, MAX_DOCUMENT_BYTES};
use crate::parquet_io::{list_parquet_files, load_metadata, open_reader};
use crate::source::records::RecordsSource;
use crate::types::MetadataSchema;

/// Rows decoded at a time at most: enough to amortise decoding.
const BATCH_ROWS: usize = 1024;

/// The decoded size a batch aims at: fewer rows than [`BATCH_ROWS`] when
/// the footer says a row group's rows are long.
const BATCH_BYTES: u64 = 64 * 1024 * 1024;

/// Rows a batch of a row group holds: as many of its rows as `budget`
/// holds on average (`bytes` decoded in all for `rows` rows), at least one
/// and at most [`BATCH_ROWS`]. A size the footer does not give (negative)
/// leaves the most.
fn batch_rows(bytes: i64, rows: i64, budget: u64) -> usize {
    let (Ok(bytes), Ok(rows)) = (u64::try_from(bytes), u64::try_from(rows)) else {
        return BATCH_ROWS;
    };
    let per_row = bytes.div_ceil(rows.max(1)).max(1);
    usize::try_from(budget / per_row).map_or(BATCH_ROWS, |n| n.clamp(1, BATCH_ROWS))
}

/// Each row group's index with the rows a batch of it holds, given the
/// decoded columns' `roots` (the footer sizes columns by their leaves).
fn row_group_batches(
    metadata: &ParquetMetaData,
    roots: &[usize],
    budget: u64,
) -> Vec<(usize, usize)> {
    let schema = metadata.file_metadata().schema_descr();
    let read: Vec<usize> = (0..schema.num_columns())
        .filter(|&leaf| roots.contains(&schema.get_column_root_idx(leaf)))
        .collect();
    metadata
        .row_groups()
        .iter()
        .enumerate()
        .map(|(index, group)| {
            let mut bytes: i64 = 0;
            for column in read.iter().filter_map(|&leaf| group.columns().get(leaf)) {
                let size = column.uncompressed_size();
                bytes = if size < 0 || bytes < 0 {
                    -1
                } else {
                    bytes.saturating_add(size)
                };
            }
            (index, batch_rows(bytes, group.num_rows(), budget))
        })
        .collect()
}

pub struct ParquetSource {
    files: std::vec::IntoIter<PathBuf>,
    text_field: String,
    id_field: Option<String>,
    metadata: Option<Arc<MetadataSchema>>,
    current: Option<OpenFile>,
    last_row: Option<u64>,
    stats: SourceStats,
    /// [`BATCH_BYTES`], less in tests.
    batch_bytes: u64,
}

/// The file being read and the batch being handed out.
struct OpenFile {
    path: PathBuf,
    source: Arc<str>,
    /// The file and its footer, for a reader of each row group.
    file: std::fs::File,
    metadata: ArrowReaderMetadata,
    mask: ProjectionMask,
    /// The row groups still to read, each with the rows of its batches.
    groups: std::vec::IntoIter<(usize, usize)>,
    /// The reader of the current row group.
    reader: Option<ParquetRecordBatchReader>,
    batch: Option<Batch>,
    /// Rows of this file in the batches before the current one.
    rows_before: u64,
}

struct Batch {
    text: Strings,
    id: Option<Strings>,
    /// The metadata columns, in the types their values are read as.
    metadata: Vec<ArrayRef>,
    len: usize,
    next: usize,
}

impl ParquetSource {
    #[cfg(test)]
    pub fn open(
        path: &Path,
        text_field: &str,
        id_field: Option<&str>,
    ) -> Result<Self, SourceError> {
        Self::open_records(&RecordsSource {
            path: path.to_path_buf(),
            text_field: text_field.to_string(),
            id_field: id_field.map(str::to_string),
            metadata_fields: Vec::new(),
        })
    }

    /// Opens the records a job names; each metadata column keeps its type,
    /// which must be the same in every file.
    pub fn open_records(records: &RecordsSource) -> Result<Self, SourceError> {
        let text_field = records.text_field.as_str();
        let id_field = records.id_field.as_deref();
        let files = list_files(&records.path)?;
        // Every file's footer and columns are checked now, so a bad file late
        // in a directory stops the job before any work.
        let mut types: Vec<(DataType, PathBuf)> = Vec::new();
        for file in &files {
            let builder = builder(file)?;
            check_column(file, builder.schema(), text_field, false)?;
            if let Some(id_field) = id_field {
                check_column(file, builder.schema(), id_field, true)?;
            }
            for (i, field) in records.metadata_fields.iter().enumerate() {
                let found = metadata_type(file, builder.schema(), field)?;
                match types.get(i) {
                    None => types.push((found, file.clone())),
                    Some((first, first_file)) if *first != found => {
                        return Err(SourceError::Column {
                            path: file.clone(),
                            column: field.clone(),
                            message: format!(
                                "is {found} here but {first} in {}; a metadata column has one type",
                                first_file.display()
                            ),
                        })
                    }
                    Some(_) => {}
                }
            }
        }
        let metadata = (!records.metadata_fields.is_empty()).then(|| {
            metadata::schema(
                &records.metadata_fields,
                types.into_iter().map(|(t, _)| t).collect(),
            )
        });
        Ok(ParquetSource {
            files: files.into_iter(),
            text_field: text_field.to_string(),
            id_field: id_field.map(str::to_string),
            metadata,
            current: None,
            last_row: None,
            stats: SourceStats::default(),
            batch_bytes: BATCH_BYTES,
        })
    }

    fn open_next_file(&mut self) -> Result<bool, SourceError> {
        let Some(path) = self.files.next() else {
            return Ok(false);
        };
        let metadata = load_metadata(&path)?;
        let schema = Arc::clone(metadata.schema());
        let mut roots = vec![column_index(&path, &schema, &self.text_field)?];
        if let Some(id_field) = &self.id_field {
            roots.push(column_index(&path, &schema, id_field)?);
        }
        for field in self.metadata.iter().flat_map(|m| &m.fields) {
            roots.push(column_index(&path, &schema, &field.field)?);
        }
        let groups = row_group_batches(metadata.metadata(), &roots, self.batch_bytes);
        let mask = ProjectionMask::roots(metadata.parquet_schema(), roots);
        let file = std::fs::File::open(&path).map_err(|e| io_error(&path, e))?;
        self.current = Some(OpenFile {
            source: Arc::from(path_text(&path)),
            path,
            file,
            metadata,
            mask,
            groups: groups.into_iter(),
            reader: None,
            batch: None,
            rows_before: 0,
        });
        Ok(true)
    }
}

impl Source for ParquetSource {
    fn metadata_schema(&self) -> Option<Arc<MetadataSchema>> {
        self.metadata.clone()
    }

    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        loop {
            let Some(file) = self.current.as_mut() else {
                if self.open_next_file()? {
                    continue;
                }
                return Ok(None);
            };
            let batch = match file.batch.as_mut() {
                Some(batch) if batch.next < batch.len => batch,
                _ => {
                    if let Some(done) = file.batch.take() {
                        file.rows_before += done.len as u64;
                    }
                    let metadata = self.metadata.as_deref();
                    match file.next_batch(&self.text_field, self.id_field.as_deref(), metadata)? {
                        Some(batch) => file.batch.insert(batch),
                        None => {
                            self.current = None;
                            continue;
                        }
                    }
                }
            };
            let index = batch.next;
            batch.next += 1;
            let row = file.rows_before + index as u64 + 1;
            let Some(text) = batch.text.get(index) else {
                self.stats.skipped_null += 1;
                continue;
            };
            if text.len() as u64 > MAX_DOCUMENT_BYTES {
                return Err(SourceError::Row {
                    path: file.path.clone(),
                    row,
                    message: format!(
                        "column {:?}: a text of {} bytes, more than {}, the most a document may hold",
                        self.text_field,
                        text.len(),
                        describe(MAX_DOCUMENT_BYTES)
                    ),
                });
            }
            if text.trim().is_empty() {
                self.stats.skipped_empty += 1;
                continue;
            }
            let text = text.to_string();
            let doc_id = match &batch.id {
                None => row.to_string(),
                Some(ids) => match ids.get(index) {
                    Some(id) if !id.is_empty() => id.to_string(),
                    found => {
                        let what = if found.is_some() { "empty" } else { "null" };
                        return Err(SourceError::Row {
                            path: file.path.clone(),
                            row,
                            message: format!(
                                "id column {:?} is {what}",
                                self.id_field.as_deref().unwrap_or_default()
                            ),
                        });
                    }
                },
            };
            let metadata = self.metadata.as_ref().map(|schema| {
                let values = batch
                    .metadata
                    .iter()
                    .map(|column| metadata::arrow_value(column, index))
                    .collect();
                metadata::record(schema, values)
            });
            self.stats.documents += 1;
            self.last_row = Some(row);
            return Ok(Some(Document {
                doc_id,
                source: Arc::clone(&file.source),
                text,
                metadata,
            }));
        }
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }

    fn last_row(&self) -> Option<u64> {
        self.last_row
    }
}

impl OpenFile {
    /// A reader of the next row group, its batches sized for it; `None`
    /// after the last.
    fn next_reader(&mut self) -> Result<Option<ParquetRecordBatchReader>, SourceError> {
        let Some((group, rows)) = self.groups.next() else {
            return Ok(None);
        };
        let file = self.file.try_clone().map_err(|e| io_error(&self.path, e))?;
        let built = guard(&self.path, || {
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone())
                .with_projection(self.mask.clone())
                .with_row_groups(vec![group])
                .with_batch_size(rows)
                .build()
        })?;
        built.map(Some).map_err(|e| corrupt(&self.path, e))
    }

    /// The next batch of decoded rows, from this row group or the next.
    fn next_decoded(&mut self) -> Result<Option<RecordBatch>, SourceError> {
        loop {
            let reader = match &mut self.reader {
                Some(reader) => reader,
                None => match self.next_reader()? {
                    Some(reader) => self.reader.insert(reader),
                    None => return Ok(None),
                },
            };
            match guard(&self.path, || reader.next())? {
                None => self.reader = None,
                Some(Ok(batch)) => return Ok(Some(batch)),
                Some(Err(e)) => {
                    return Err(SourceError::Corrupt {
                        path: self.path.clone(),
                        message: format!("after row {}: {e}", self.rows_before),
                    })
                }
            }
        }
    }

    fn next_batch(
        &mut self,
        text_field: &str,
        id_field: Option<&str>,
        metadata: Option<&MetadataSchema>,
    ) -> Result<Option<Batch>, SourceError> {
        let batch: RecordBatch = match self.next_decoded()? {
            None => return Ok(None),
            Some(batch) => batch,
        };
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| SourceError::Corrupt {
                    path: self.path.clone(),
                    message: format!("column {name:?} is missing from the decoded rows"),
                })
        };
        let text = Strings::new(&self.path, text_field, &column(text_field)?)?;
        let id = match id_field {
            Some(name) => Some(Strings::new(&self.path, name, &column(name)?)?),
            None => None,
        };
        let mut columns = Vec::new();
        for field in metadata.iter().flat_map(|m| &m.fields) {
            let array = column(&field.field)?;
            columns.push(
                metadata::readable(&array, &field.data_type).map_err(|message| {
                    SourceError::Column {
                        path: self.path.clone(),
                        column: field.field.clone(),
                        message,
                    }
                })?,
            );
        }
        Ok(Some(Batch {
            text,
            id,
            metadata: columns,
            len: batch.num_rows(),
            next: 0,
        }))
    }
}

/// The files a `path` names: itself, or a directory's `*.parquet` files in
/// name order.
fn list_files(path: &Path) -> Result<Vec<PathBuf>, SourceError> {
    let metadata = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    if !metadata.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let files = list_parquet_files(path)?;
    if files.is_empty() {
        return Err(SourceError::NoMatch {
            pattern: path_text(&path.join("*.parquet")),
        });
    }
    Ok(files)
}

fn builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<std::fs::File>, SourceError> {
    Ok(open_reader(path)?)
}

fn guard<T>(path: &Path, step: impl FnOnce() -> T) -> Result<T, SourceError> {
    Ok(crate::parquet_io::guard(path, step)?)
}

fn corrupt(path: &Path, error: impl std::fmt::Display) -> SourceError {
    SourceError::Corrupt {
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}

fn column_index(path: &Path, schema: &Schema, name: &str) -> Result<usize, SourceError> {
    schema.index_of(name).map_err(|_| {
        let available: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| format!("{:?}", f.name()))
            .collect();
        SourceError::Column {
            path: path.to_path_buf(),
            column: name.to_string(),
            message: format!("no such column; the columns are {}", available.join(", ")),
        }
    })
}

/// The output type of metadata column `name`, which must exist with a type
/// a metadata column can carry.
fn metadata_type(path: &Path, schema: &Schema, name: &str) -> Result<DataType, SourceError> {
    let field = schema.field(column_index(path, schema, name)?);
    metadata::output_type(field.data_type()).ok_or_else(|| SourceError::Column {
        path: path.to_path_buf(),
        column: name.to_string(),
        message: format!(
            "has type {}, which a metadata column cannot carry (strings, booleans, integers, \
             floats, dates and timestamps can)",
            field.data_type()
        ),
    })
}

fn is_string(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, values) => {
            matches!(
                **values,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            )
        }
        _ => false,
    }
}

fn check_column(path: &Path, schema: &Schema, name: &str, is_id: bool) -> Result<(), SourceError> {
    let field = schema.field(column_index(path, schema, name)?);
    let data_type = field.data_type();
    if is_string(data_type) || (is_id && data_type.is_integer()) {
        return Ok(());
    }
    let allowed = if is_id {
        "a string or integer type"
    } else {
        "a string type"
    };
    Err(SourceError::Column {
        path: path.to_path_buf(),
        column: name.to_string(),
        message: format!(
            "has type {data_type}, not {allowed} (utf8, large_utf8, utf8_view or a dictionary of them)"
        ),
    })
}

/// A decoded column read as text, whatever its Arrow string type.
enum Strings {
    Utf8(StringArray),
    Large(LargeStringArray),
    View(StringViewArray),
    Dictionary {
        /// Null keys; a null value is checked in `values`.
        nulls: Option<NullBuffer>,
        keys: Vec<usize>,
        values: Box<Strings>,
    },
}

impl Strings {
    fn new(path: &Path, name: &str, array: &ArrayRef) -> Result<Self, SourceError> {
        let unsupported = || SourceError::Column {
            path: path.to_path_buf(),
            column: name.to_string(),
            message: format!("has type {}, not a string type", array.data_type()),
        };
        Ok(match array.data_type() {
            DataType::Utf8 => Strings::Utf8(array.as_string::<i32>().clone()),
            DataType::LargeUtf8 => Strings::Large(array.as_string::<i64>().clone()),
            DataType::Utf8View => Strings::View(array.as_string_view().clone()),
            DataType::Dictionary(_, _) => {
                let dictionary = array.as_any_dictionary_opt().ok_or_else(unsupported)?;
                Strings::Dictionary {
                    nulls: dictionary.keys().logical_nulls(),
                    keys: dictionary.normalized_keys(),
                    values: Box::new(Strings::new(path, name, dictionary.values())?),
                }
            }
            t if t.is_integer() => {
                // Integer ids are rendered as decimal text, once per batch.
                let text =
                    arrow::compute::cast(array, &DataType::Utf8).map_err(|e| corrupt(path, e))?;
                Strings::Utf8(text.as_string::<i32>().clone())
            }
            _ => return Err(unsupported()),
        })
    }

    /// The value at `index`, or `None` when it is null.
    fn get(&self, index: usize) -> Option<&str> {
        match self {
            Strings::Utf8(a) => a.is_valid(index).then(|| a.value(index)),
            Strings::Large(a) => a.is_valid(index).then(|| a.value(index)),
            Strings::View(a) => a.is_valid(index).then(|| a.value(index)),
            Strings::Dictionary {
                nulls,
                keys,
                values,
            } => {
                if nulls.as_ref().is_some_and(|n| n.is_null(index)) {
                    return None;
                }
                values.get(*keys.get(index)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{first_error, ids, read_all};
    use super::*;
    use arrow::array::{
        DictionaryArray, Int32Array, Int64Array, LargeStringArray, StringArray, StringViewArray,
        UInt16Array,
    };
    use arrow::datatypes::{Field, Int8Type, UInt32Type};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;

    fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
        write_with(path, columns, Compression::SNAPPY, None);
    }

    fn write_with(
        path: &Path,
        columns: Vec<(&str, ArrayRef)>,
        compression: Compression,
        row_group_rows: Option<usize>,
    ) {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, array)| Field::new(*name, array.data_type().clone(), true))
            .collect();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap();
        let mut properties = WriterProperties::builder().set_compression(compression);
        if let Some(rows) = row_group_rows {
            properties = properties.set_max_row_group_row_count(Some(rows));
        }
        let file = std::fs::File::create(path).unwrap();
        let mut writer =
            ArrowWriter::try_new(file, batch.schema(), Some(properties.build())).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    fn texts(documents: &[Document]) -> Vec<&str> {
        documents.iter().map(|d| d.text.as_str()).collect()
    }

    fn utf8(values: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(values.to_vec()))
    }

    #[test]
    fn rows_stream_with_ids_texts_and_skips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.parquet");
        write(
            &path,
            vec![
                ("id", utf8(&[Some("a"), Some("b"), Some("c"), Some("d")])),
                ("extra", Arc::new(Int32Array::from(vec![1, 2, 3, 4]))),
                (
                    "text",
                    utf8(&[Some("one"), None, Some(" \n"), Some("four")]),
                ),
            ],
        );
        let mut source = ParquetSource::open(&path, "text", Some("id")).unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["a", "d"]);
        assert_eq!(texts(&documents), ["one", "four"]);
        assert_eq!(&*documents[0].source, path_text(&path));
        assert_eq!(source.last_row(), Some(4));
        assert_eq!(
            source.stats(),
            SourceStats {
                documents: 2,
                skipped_null: 1,
                skipped_empty: 1
            }
        );
    }

    #[test]
    fn a_batch_holds_the_rows_its_budget_holds_by_the_footer() {
        const MIB: i64 = 1024 * 1024;
        // 512 rows of 8 MiB: 64 MiB holds 8 of them.
        assert_eq!(batch_rows(512 * 8 * MIB, 512, 64 << 20), 8);
        // Short rows: the most, 1024, however many the budget would hold.
        assert_eq!(batch_rows(100 * 1024, 1000, 64 << 20), BATCH_ROWS);
        // A row longer than the budget still comes, alone.
        assert_eq!(batch_rows(1024 * MIB, 1, 64 << 20), 1);
        // 3 bytes over 2 rows is 2 a row (rounded up), so 9 bytes hold 4.
        assert_eq!(batch_rows(3, 2, 9), 4);
        // No rows, or sizes the footer does not give: the most.
        assert_eq!(batch_rows(0, 0, 64 << 20), BATCH_ROWS);
        assert_eq!(batch_rows(-1, 10, 64 << 20), BATCH_ROWS);
        assert_eq!(batch_rows(10, -1, 64 << 20), BATCH_ROWS);
    }

    /// Regression: a file of long texts was decoded 1024 rows at a time
    /// whatever their length. Each row group's batches now hold what the
    /// budget holds by the footer's sizes of the columns read.
    #[test]
    fn regression_rows_of_long_texts_are_decoded_a_few_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.parquet");
        let long: Vec<String> = (0..40)
            .map(|i| format!("{i} {}", "x".repeat(64 << 10)))
            .collect();
        let ids: Vec<String> = (0..40).map(|i| format!("id{i}")).collect();
        // Two row groups of 20 rows; the unread column is larger still, and
        // must not count.
        write_with(
            &path,
            vec![
                ("id", Arc::new(StringArray::from(ids)) as ArrayRef),
                ("text", Arc::new(StringArray::from(long.clone()))),
                (
                    "unread",
                    Arc::new(StringArray::from(vec!["y".repeat(1 << 20); 40])),
                ),
            ],
            Compression::ZSTD(Default::default()),
            Some(20),
        );
        let mut source = ParquetSource::open(&path, "text", Some("id")).unwrap();
        // Each row is a little over 64 KiB of text and id (with their
        // lengths and page headers), so 256 KiB holds 3 of them.
        source.batch_bytes = 256 << 10;
        let mut largest = 0;
        let mut documents = Vec::new();
        while let Some(document) = source.next_document().unwrap() {
            let batch = source.current.as_ref().and_then(|f| f.batch.as_ref());
            largest = largest.max(batch.map_or(0, |b| b.len));
            documents.push(document);
        }
        assert_eq!(largest, 3);
        assert_eq!(
            texts(&documents),
            long.iter().map(String::as_str).collect::<Vec<_>>()
        );
        assert_eq!(documents[39].doc_id, "id39");
    }

    /// Regression: a text cell had no limit. One over the documents' limit
    /// is an error naming the file, the row and the column.
    #[test]
    fn regression_a_text_cell_over_the_limit_names_its_row_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.parquet");
        let limit = usize::try_from(MAX_DOCUMENT_BYTES).unwrap();
        write_with(
            &path,
            vec![
                ("id", utf8(&[Some("a"), Some("b")])),
                (
                    "body",
                    Arc::new(StringArray::from(vec![
                        "short".to_string(),
                        "z".repeat(limit + 1),
                    ])),
                ),
            ],
            Compression::ZSTD(Default::default()),
            None,
        );
        let mut source = ParquetSource::open(&path, "body", Some("id")).unwrap();
        assert_eq!(source.next_document().unwrap().unwrap().text, "short");
        let error = first_error(&mut source);
        assert!(matches!(error, SourceError::Row { row: 2, .. }), "{error}");
        let message = error.to_string();
        for needle in [
            "big.parquet",
            "row 2",
            "column \"body\"",
            "more than 64 MiB",
        ] {
            assert!(message.contains(needle), "{needle:?} not in {message}");
        }
    }

    #[test]
    fn row_numbers_count_from_one_across_batches_and_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.parquet");
        let rows = 2 * BATCH_ROWS + 11;
        assert_ne!(rows % 7, 0, "the last row must have text");
        let values: Vec<Option<String>> = (1..=rows)
            .map(|i| (i % 7 != 0).then(|| format!("text {i}")))
            .collect();
        write_with(
            &path,
            vec![("text", Arc::new(StringArray::from(values)) as ArrayRef)],
            Compression::ZSTD(Default::default()),
            Some(700),
        );
        let mut source = ParquetSource::open(&path, "text", None).unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(documents.len(), rows - rows / 7);
        for document in &documents {
            assert_eq!(document.text, format!("text {}", document.doc_id));
        }
        assert_eq!(documents.last().unwrap().doc_id, rows.to_string());
        assert_eq!(source.stats().skipped_null, (rows / 7) as u64);
    }

    #[test]
    fn every_codec_parquet_allows_is_read() {
        use parquet::basic::{BrotliLevel, GzipLevel, ZstdLevel};
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<String> = (0..300).map(|i| format!("text number {i}")).collect();
        for (name, codec) in [
            ("none", Compression::UNCOMPRESSED),
            ("snappy", Compression::SNAPPY),
            ("gzip", Compression::GZIP(GzipLevel::default())),
            ("lz4", Compression::LZ4),
            ("lz4_raw", Compression::LZ4_RAW),
            ("zstd", Compression::ZSTD(ZstdLevel::default())),
            ("brotli", Compression::BROTLI(BrotliLevel::default())),
        ] {
            let path = dir.path().join(format!("{name}.parquet"));
            write_with(
                &path,
                vec![(
                    "text",
                    Arc::new(StringArray::from(values.clone())) as ArrayRef,
                )],
                codec,
                None,
            );
            let documents = read_all(&mut ParquetSource::open(&path, "text", None).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(texts(&documents), values, "{name}");
        }
    }

    fn with_metadata(path: &Path, fields: &[&str]) -> Result<ParquetSource, SourceError> {
        ParquetSource::open_records(&RecordsSource {
            path: path.to_path_buf(),
            text_field: "text".into(),
            id_field: None,
            metadata_fields: fields.iter().map(|f| (*f).to_string()).collect(),
        })
    }

    #[test]
    fn metadata_columns_keep_their_types_and_nulls() {
        use crate::types::MetaValue;
        use arrow::array::{BooleanArray, Float64Array, TimestampMicrosecondArray};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.parquet");
        write(
            &path,
            vec![
                ("text", utf8(&[Some("one"), None, Some("three")])),
                ("url", utf8(&[Some("https://a"), Some("https://b"), None])),
                (
                    "year",
                    Arc::new(Int32Array::from(vec![Some(2020), Some(2021), None])),
                ),
                ("score", Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5]))),
                (
                    "draft",
                    Arc::new(BooleanArray::from(vec![true, false, false])),
                ),
                (
                    "at",
                    Arc::new(
                        TimestampMicrosecondArray::from(vec![1_000_000, 2, 3])
                            .with_timezone("Europe/Paris"),
                    ),
                ),
            ],
        );
        let mut source = with_metadata(&path, &["url", "year", "score", "draft", "at"]).unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["1", "3"]);
        let metadata = documents[0].metadata.as_ref().unwrap();
        let types: Vec<String> = metadata
            .schema
            .fields
            .iter()
            .map(|f| f.data_type.to_string())
            .collect();
        assert_eq!(
            types,
            [
                "Utf8",
                "Int32",
                "Float64",
                "Boolean",
                "Timestamp(µs, \"Europe/Paris\")"
            ]
        );
        assert_eq!(
            &*metadata.values,
            [
                MetaValue::Text("https://a".into()),
                MetaValue::Int(2020),
                MetaValue::Float(0.5),
                MetaValue::Bool(true),
                MetaValue::Int(1_000_000),
            ]
        );
        let last = documents[1].metadata.as_ref().unwrap();
        assert_eq!(last.values[0], MetaValue::Null);
        assert_eq!(last.values[1], MetaValue::Null);
        assert!(
            Arc::ptr_eq(&metadata.schema, &last.schema),
            "one schema, shared"
        );
    }

    #[test]
    fn a_metadata_column_must_exist_carry_a_plain_type_and_agree_across_files() {
        let dir = tempfile::tempdir().unwrap();
        write(
            &dir.path().join("a.parquet"),
            vec![
                ("text", utf8(&[Some("x")])),
                ("n", Arc::new(Int32Array::from(vec![1]))),
                (
                    "blob",
                    Arc::new(arrow::array::BinaryArray::from(vec![&b"\0"[..]])),
                ),
            ],
        );
        for (field, needle) in [("missing", "no such column"), ("blob", "cannot carry")] {
            let Err(error) = with_metadata(&dir.path().join("a.parquet"), &[field]) else {
                panic!("{field} was accepted");
            };
            assert!(error.is_found_at_open(), "{error}");
            assert!(error.to_string().contains(needle), "{error}");
        }
        write(
            &dir.path().join("b.parquet"),
            vec![
                ("text", utf8(&[Some("y")])),
                ("n", Arc::new(Int64Array::from(vec![2]))),
            ],
        );
        let Err(error) = with_metadata(dir.path(), &["n"]) else {
            panic!("two types of one column were accepted");
        };
        let message = error.to_string();
        assert!(message.contains("b.parquet"), "{message}");
        assert!(
            message.contains("Int64") && message.contains("Int32"),
            "{message}"
        );
        assert!(message.contains("a.parquet"), "{message}");
    }

    #[test]
    fn every_arrow_string_type_reads_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let values = [Some("alpha"), None, Some("beta"), Some("alpha"), Some("")];
        // Null keys, null values and an empty value, unlike the
        // dictionaries the writer builds for plain strings.
        let keys = [Some(0i8), Some(1), None, Some(0), Some(2)];
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("utf8", utf8(&values)),
            ("large", Arc::new(LargeStringArray::from(values.to_vec()))),
            ("view", Arc::new(StringViewArray::from(values.to_vec()))),
            (
                "dictionary",
                Arc::new(DictionaryArray::<Int8Type>::from_iter(
                    values.iter().copied(),
                )),
            ),
            (
                "dictionary_large",
                Arc::new(
                    DictionaryArray::<UInt32Type>::try_new(
                        keys.iter()
                            .map(|k| k.map(|k| u32::from(k.unsigned_abs())))
                            .collect(),
                        Arc::new(LargeStringArray::from(vec![Some("alpha"), None, Some("")])),
                    )
                    .unwrap(),
                ),
            ),
            (
                "dictionary_view",
                Arc::new(
                    DictionaryArray::<Int8Type>::try_new(
                        keys.iter().copied().collect(),
                        Arc::new(StringViewArray::from(vec![Some("alpha"), None, Some("")])),
                    )
                    .unwrap(),
                ),
            ),
        ];
        let path = dir.path().join("types.parquet");
        write(&path, columns.clone());
        // The written types come back, so each one is really exercised.
        let file_schema = builder(&path).unwrap().schema().clone();
        for (name, array) in &columns {
            let field = file_schema.field_with_name(name).unwrap();
            assert_eq!(field.data_type(), array.data_type(), "{name}");
        }
        for (name, _) in &columns {
            let mut source = ParquetSource::open(&path, name, None).unwrap();
            let documents = read_all(&mut source).unwrap();
            let expected: &[&str] = match *name {
                "utf8" | "large" | "view" | "dictionary" => &["1", "3", "4"],
                _ => &["1", "4"],
            };
            assert_eq!(ids(&documents), expected, "{name}");
            assert!(
                texts(&documents)
                    .iter()
                    .all(|t| *t == "alpha" || *t == "beta"),
                "{name}"
            );
            let stats = source.stats();
            assert_eq!(stats.skipped_empty, 1, "{name}");
            assert_eq!(
                stats.documents + stats.skipped_null + stats.skipped_empty,
                5,
                "{name}"
            );
        }
    }

    #[test]
    fn integer_and_dictionary_ids_become_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        write(
            &path,
            vec![
                ("text", utf8(&[Some("x"), Some("y")])),
                ("n", Arc::new(Int64Array::from(vec![-5, 9_000_000_000]))),
                ("u", Arc::new(UInt16Array::from(vec![7, 8]))),
                (
                    "d",
                    Arc::new(DictionaryArray::<Int8Type>::from_iter([
                        Some("k1"),
                        Some("k2"),
                    ])),
                ),
            ],
        );
        for (column, expected) in [
            ("n", ["-5", "9000000000"]),
            ("u", ["7", "8"]),
            ("d", ["k1", "k2"]),
        ] {
            let documents =
                read_all(&mut ParquetSource::open(&path, "text", Some(column)).unwrap()).unwrap();
            assert_eq!(ids(&documents), expected, "{column}");
        }
    }

    #[test]
    fn a_null_id_names_the_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.parquet");
        write(
            &path,
            vec![
                ("text", utf8(&[Some("x"), Some("y")])),
                ("id", Arc::new(Int64Array::from(vec![Some(1), None]))),
            ],
        );
        let error = first_error(&mut ParquetSource::open(&path, "text", Some("id")).unwrap());
        assert!(matches!(error, SourceError::Row { row: 2, .. }), "{error}");
        assert!(error.to_string().contains("ids.parquet"), "{error}");
        assert!(error.to_string().contains("\"id\" is null"), "{error}");
    }

    #[test]
    fn a_missing_column_lists_the_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.parquet");
        write(
            &path,
            vec![("body", utf8(&[Some("x")])), ("key", utf8(&[Some("k")]))],
        );
        for (text, id) in [("text", None), ("body", Some("id"))] {
            let Err(error) = ParquetSource::open(&path, text, id) else {
                panic!("opened without the column");
            };
            assert!(matches!(error, SourceError::Column { .. }), "{error}");
            assert!(error.is_found_at_open());
            let message = error.to_string();
            assert!(message.contains("docs.parquet"), "{message}");
            assert!(message.contains("\"body\", \"key\""), "{message}");
        }
    }

    #[test]
    fn a_non_string_column_names_its_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.parquet");
        write(
            &path,
            vec![
                ("text", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
                ("body", utf8(&[Some("x")])),
                (
                    "flag",
                    Arc::new(arrow::array::BooleanArray::from(vec![true])),
                ),
            ],
        );
        let Err(error) = ParquetSource::open(&path, "text", None) else {
            panic!("opened an Int64 text column");
        };
        let message = error.to_string();
        assert!(matches!(error, SourceError::Column { .. }), "{message}");
        assert!(error.is_found_at_open());
        assert!(message.contains("docs.parquet"), "{message}");
        assert!(message.contains("column \"text\""), "{message}");
        assert!(message.contains("Int64"), "{message}");
        let Err(error) = ParquetSource::open(&path, "body", Some("flag")) else {
            panic!("opened a Boolean id column");
        };
        assert!(error.to_string().contains("Boolean"), "{error}");
    }

    #[test]
    fn a_file_that_is_not_parquet_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("noise.parquet");
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&path, noise).unwrap();
        let Err(error) = ParquetSource::open(&path, "text", None) else {
            panic!("opened random bytes");
        };
        assert!(matches!(error, SourceError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("noise.parquet"), "{error}");
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(
            ParquetSource::open(&path, "text", None),
            Err(SourceError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_truncated_file_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.parquet");
        let values: Vec<String> = (0..5000).map(|i| format!("document number {i}")).collect();
        write(
            &path,
            vec![("text", Arc::new(StringArray::from(values)) as ArrayRef)],
        );
        let bytes = std::fs::read(&path).unwrap();
        for keep in [bytes.len() - 1, bytes.len() / 2, 8] {
            std::fs::write(&path, &bytes[..keep]).unwrap();
            let Err(error) = ParquetSource::open(&path, "text", None) else {
                panic!("opened a file cut to {keep} bytes");
            };
            assert!(
                matches!(error, SourceError::Corrupt { .. }),
                "{keep}: {error}"
            );
            assert!(error.to_string().contains("cut.parquet"), "{error}");
        }
    }

    #[test]
    fn damaged_pages_are_an_error_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.parquet");
        let values: Vec<String> = (0..3000).map(|i| format!("document number {i}")).collect();
        write_with(
            &path,
            vec![("text", Arc::new(StringArray::from(values)) as ArrayRef)],
            Compression::UNCOMPRESSED,
            None,
        );
        let bytes = std::fs::read(&path).unwrap();
        // Overwrite bytes in the data pages, leaving the footer intact.
        let mut damaged = bytes.clone();
        for byte in &mut damaged[4..bytes.len() / 2] {
            *byte = byte.wrapping_mul(31).wrapping_add(7);
        }
        std::fs::write(&path, &damaged).unwrap();
        let error = match ParquetSource::open(&path, "text", None) {
            Err(error) => error,
            Ok(mut source) => first_error(&mut source),
        };
        assert!(matches!(error, SourceError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("damaged.parquet"), "{error}");
    }

    #[test]
    fn a_directory_reads_its_parquet_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        write(
            &dir.path().join("b.parquet"),
            vec![("text", utf8(&[Some("b1"), Some("b2")]))],
        );
        write(
            &dir.path().join("a.parquet"),
            vec![("text", utf8(&[Some("a1")]))],
        );
        std::fs::write(dir.path().join("notes.txt"), "not parquet").unwrap();
        let mut source = ParquetSource::open(dir.path(), "text", None).unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(texts(&documents), ["a1", "b1", "b2"]);
        assert_eq!(ids(&documents), ["1", "1", "2"]);
        assert_eq!(
            &*documents[1].source,
            path_text(&dir.path().join("b.parquet"))
        );
    }

    #[test]
    fn a_bad_file_anywhere_in_a_directory_stops_at_open() {
        let dir = tempfile::tempdir().unwrap();
        write(
            &dir.path().join("a.parquet"),
            vec![("text", utf8(&[Some("a1")]))],
        );
        write(
            &dir.path().join("b.parquet"),
            vec![("body", utf8(&[Some("b1")]))],
        );
        let Err(error) = ParquetSource::open(dir.path(), "text", None) else {
            panic!("opened a directory with a file lacking the column");
        };
        assert!(error.to_string().contains("b.parquet"), "{error}");
        assert!(error.is_found_at_open());
    }

    #[test]
    fn a_directory_without_parquet_files_matches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        let Err(error) = ParquetSource::open(dir.path(), "text", None) else {
            panic!("opened a directory without Parquet files");
        };
        assert!(matches!(error, SourceError::NoMatch { .. }), "{error}");
        assert!(error.to_string().contains("*.parquet"), "{error}");
    }

    #[test]
    fn a_file_without_rows_has_no_documents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.parquet");
        write(&path, vec![("text", utf8(&[]))]);
        let mut source = ParquetSource::open(&path, "text", None).unwrap();
        assert!(read_all(&mut source).unwrap().is_empty());
        let config = super::super::testing::config(
            super::super::testing::SourceKind::Parquet,
            &path,
            "text",
            None,
        );
        let mut source = super::super::open(&config).unwrap();
        let error = first_error(source.as_mut());
        assert!(matches!(error, SourceError::Empty { .. }), "{error}");
        assert!(error.to_string().contains("none.parquet"), "{error}");
    }

    #[test]
    fn a_panic_in_the_decoder_becomes_an_error_naming_the_file() {
        let result: Result<(), SourceError> =
            guard(Path::new("x.parquet"), || panic!("index out of bounds"));
        let Err(error) = result else {
            panic!("the panic was not caught");
        };
        assert!(matches!(error, SourceError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("x.parquet"), "{error}");
        assert!(error.to_string().contains("index out of bounds"), "{error}");
    }

    /// Regression: parquet 60 panics on a footer whose column chunk offsets
    /// or row counts are negative ("column start and length should not be
    /// negative", "attempt to add with overflow"). Every one-byte change to
    /// the footer must be read, or reported as corrupt by the layout checks.
    #[test]
    fn regression_damaged_footer_is_reported_not_panicked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("footer.parquet");
        let values: Vec<String> = (0..400).map(|i| format!("document {i}")).collect();
        let names: Vec<String> = (0..400).map(|i| format!("k{}", i % 13)).collect();
        let dictionary: DictionaryArray<Int8Type> = names.iter().map(String::as_str).collect();
        write_with(
            &path,
            vec![
                ("text", Arc::new(StringArray::from(values)) as ArrayRef),
                ("id", Arc::new(dictionary)),
            ],
            Compression::ZSTD(Default::default()),
            Some(200),
        );
        let bytes = std::fs::read(&path).unwrap();
        let footer_len = bytes[bytes.len() - 8..bytes.len() - 4]
            .iter()
            .rev()
            .fold(0usize, |n, b| (n << 8) | usize::from(*b));
        let footer = bytes.len() - 8 - footer_len..bytes.len() - 8;
        let mut damaged = 0;
        for index in footer {
            let mut changed = bytes.clone();
            changed[index] = changed[index].wrapping_add(1);
            std::fs::write(&path, &changed).unwrap();
            let column = if index % 2 == 0 { "text" } else { "id" };
            let result = ParquetSource::open(&path, column, None)
                .and_then(|mut source| read_all(&mut source).map(|_| ()));
            match result {
                Ok(()) => {}
                Err(SourceError::Corrupt { message, .. }) => {
                    assert!(
                        !message.contains("malformed data"),
                        "byte {index}: {message}"
                    );
                    damaged += 1;
                }
                Err(other) if other.is_found_at_open() => {}
                Err(other) => panic!("byte {index}: {other}"),
            }
        }
        assert!(damaged > 0);
    }
}
