//! Writing files in the output's layout: one row per chunk, its vector in a
//! fixed-size list. The Parquet sink writes the output with it, and the
//! checkpoint its parts.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, FixedSizeListArray, Float32Array, Float64Builder, Int64Builder,
    RecordBatch, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow::datatypes::{DataType, FieldRef, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::ZstdLevel;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::checksum::Checksum;
use super::FileError;
use crate::contract::{
    check_batch, item_field, output_schema_with, standard_pairs, CHECKSUM_KEY, COST_KEY,
};
use crate::fsio::{FsError, TempFile, Writeback};
use crate::types::{EmbeddedBatch, MetaValue, MetadataSchema, OutputMetadata};

const ZSTD_LEVEL: i32 = 3;

/// Fixed per-row cost counted towards a row group besides the strings and the
/// vector: `chunk_index`, `byte_start`, `byte_end`, `token_count` and the hex
/// `content_hash`.
const FIXED_ROW_BYTES: u64 = 4 + 8 + 8 + 4 + 64;

/// A row group is encoded in this many slices as its rows arrive, and not all
/// at once when it is full: the writing stage then never stops for the time a
/// whole row group takes to compress (at 16 MiB, a tenth of a second or more,
/// while the answers that arrive meanwhile wait for it).
const GROUP_SLICES: u64 = 16;

fn writer_properties(
    compression: Compression,
) -> Result<WriterProperties, parquet::errors::ParquetError> {
    let dictionary = |name: &str| ColumnPath::from(name);
    let embedding = ColumnPath::new(vec!["embedding".into(), "list".into(), "item".into()]);
    let compression = match compression {
        Compression::Zstd => parquet::basic::Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?),
        Compression::None => parquet::basic::Compression::UNCOMPRESSED,
    };
    Ok(WriterProperties::builder()
        .set_compression(compression)
        // Row groups are cut by this sink, by size, not by row count.
        .set_max_row_group_row_count(None)
        .set_max_row_group_bytes(None)
        // Most columns are unique per row (ids, offsets, hashes, text, floats):
        // dictionaries would only be built to be abandoned.
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(dictionary("doc_id"), true)
        .set_column_dictionary_enabled(dictionary("source"), true)
        // Min/max over every vector value helps no query and bloats the footer.
        .set_column_statistics_enabled(embedding, EnabledStatistics::None)
        .build())
}

/// How a [`VectorFile`] is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOptions {
    /// Whether the `text` column is written.
    pub include_text: bool,
    /// A row group is cut once its buffered rows reach this size.
    pub row_group_bytes: u64,
    pub compression: Compression,
}

/// The compression of a [`VectorFile`]'s pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// zstd: for files that are kept.
    Zstd,
    /// None: for files written while a run goes, where speed matters and
    /// vectors gain little from compression.
    None,
}

/// What a finished [`VectorFile`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub rows: u64,
    pub row_groups: u64,
    /// The size of the file.
    pub bytes: u64,
    pub path: PathBuf,
}

/// Writes embedded chunks to a Parquet file, complete or not at all.
///
/// Rows are buffered in Arrow builders, encoded a sixteenth of a row group at
/// a time, and the row group is closed once its size (4 bytes per vector
/// value, plus the strings and the fixed columns) reaches `row_group_bytes`,
/// so memory is bounded by that size and not by the number of rows. The file
/// is written under a temporary name (`.{name}.tmp-{pid}`) in the output's
/// directory and renamed over the output only by [`VectorFile::finish`];
/// [`VectorFile::abort`], or dropping it, removes it and leaves any earlier
/// output untouched.
///
/// ```
/// use std::fs::File;
/// use std::sync::Arc;
///
/// use arrow::array::{AsArray, RecordBatch};
/// use arrow::datatypes::{DataType, Float32Type};
/// use embedjob::parquet_io::{Compression, FileOptions, VectorFile};
/// use embedjob::types::{Chunk, EmbeddedBatch, OutputMetadata, Usage, Vectors};
/// use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("out/docs.parquet");
/// let chunk = |i: u32, text: &str| Chunk {
///     id: format!("a.md#{i}"),
///     doc_id: Arc::from("a.md"),
///     source: Arc::from("docs/a.md"),
///     chunk_index: i,
///     byte_start: 0,
///     byte_end: text.len() as u64,
///     text: text.to_string(),
///     content_hash: [0; 32],
///     token_count: 1,
///     metadata: None,
/// };
/// let vectors = |values: Vec<f32>| Vectors { dimensions: 2, values, usage: Usage::default(), discarded: Usage::default() };
///
/// let options = FileOptions { include_text: true, row_group_bytes: 1 << 20, compression: Compression::Zstd };
/// let mut sink = VectorFile::create(&path, 2, options)?;
/// sink.write(&EmbeddedBatch { chunks: vec![chunk(0, "hello")], vectors: vectors(vec![1.0, 2.0]) })?;
/// sink.write(&EmbeddedBatch {
///     chunks: vec![chunk(1, "big"), chunk(2, "world")],
///     vectors: vectors(vec![3.0, 4.0, 5.0, 6.0]),
/// })?;
/// let metadata = OutputMetadata {
///     model: "svc-embed-1".into(),
///     dimensions: 2,
///     backend: "api".into(),
///     ..OutputMetadata::default()
/// };
/// let report = sink.finish(&metadata)?;
/// assert_eq!(report.rows, 3);
///
/// let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path)?)?.build()?;
/// let batches = reader.collect::<Result<Vec<RecordBatch>, _>>()?;
/// let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
///
/// let text = batch.column_by_name("text").unwrap().as_string::<i32>();
/// assert_eq!(text.iter().collect::<Vec<_>>(), [Some("hello"), Some("big"), Some("world")]);
///
/// let embedding = batch.column_by_name("embedding").unwrap();
/// assert!(matches!(embedding.data_type(), DataType::FixedSizeList(_, 2)));
/// let values = embedding.as_fixed_size_list().values().as_primitive::<Float32Type>();
/// assert_eq!(values.values(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// # Ok(()) }
/// ```
pub struct VectorFile {
    // Declared before `temp` so that the file is closed before it is removed.
    writer: ArrowWriter<File>,
    /// The temporary file, kept to fsync it once the writer is closed.
    file: File,
    /// Syncs the row groups written so far, once there are two.
    writeback: Option<Writeback>,
    temp: TempFile,
    schema: SchemaRef,
    item: FieldRef,
    dimensions: usize,
    /// The metadata columns every row carries.
    metadata: Option<Arc<MetadataSchema>>,
    row_group_bytes: u64,
    /// The rows not yet encoded.
    buffer: RowBuffer,
    /// The size of the rows encoded into the row group being written.
    group_bytes: u64,
    rows: u64,
    checksum: Checksum,
}

impl std::fmt::Debug for VectorFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VectorFile")
            .field("path", &self.temp.final_path())
            .field("dimensions", &self.dimensions)
            .field("row_group_bytes", &self.row_group_bytes)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl VectorFile {
    /// Starts writing `path` (created with its parent directory if missing)
    /// for vectors of `dimensions` values.
    pub fn create(path: &Path, dimensions: usize, options: FileOptions) -> Result<Self, FileError> {
        Self::create_with_metadata(path, dimensions, options, None)
    }

    /// Like [`VectorFile::create`], for rows that carry the `metadata`
    /// columns (see [`output_schema_with`]).
    pub fn create_with_metadata(
        path: &Path,
        dimensions: usize,
        options: FileOptions,
        metadata: Option<Arc<MetadataSchema>>,
    ) -> Result<Self, FileError> {
        if dimensions == 0 || i32::try_from(dimensions).is_err() {
            return Err(FileError::UnsupportedDimensions {
                path: path.to_path_buf(),
                dimensions,
            });
        }
        let parquet_error = |source| FileError::Parquet {
            path: path.to_path_buf(),
            source,
        };
        let props = writer_properties(options.compression).map_err(parquet_error)?;
        let (temp, file) = TempFile::create(path)?;
        let writer_file = file.try_clone().map_err(FsError::io(
            temp.temp_path(),
            "cannot reopen the temporary file",
        ))?;
        let schema = output_schema_with(dimensions, options.include_text, metadata.as_deref());
        let writer = ArrowWriter::try_new(writer_file, schema.clone(), Some(props))
            .map_err(parquet_error)?;
        Ok(VectorFile {
            writer,
            file,
            writeback: None,
            temp,
            schema,
            item: item_field(),
            dimensions,
            buffer: RowBuffer::new(options.include_text, metadata.as_deref()),
            metadata,
            row_group_bytes: options.row_group_bytes,
            group_bytes: 0,
            rows: 0,
            checksum: Checksum::new(),
        })
    }

    /// The vector length every row must have.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    pub fn path(&self) -> &Path {
        self.temp.final_path()
    }

    /// The buffered size at which rows are encoded into the row group.
    fn slice_bytes(&self) -> u64 {
        (self.row_group_bytes / GROUP_SLICES).max(1)
    }

    fn path_buf(&self) -> PathBuf {
        self.temp.final_path().to_path_buf()
    }

    fn check(&self, batch: &EmbeddedBatch) -> Result<(), FileError> {
        check_batch(batch, self.dimensions, self.metadata.as_ref())
            .map_err(|e| FileError::shape(self.temp.final_path(), e))
    }

    /// Encodes the buffered rows into the row group being written.
    fn encode_buffer(&mut self) -> Result<(), FileError> {
        if self.buffer.rows == 0 {
            return Ok(());
        }
        self.group_bytes = self.group_bytes.saturating_add(self.buffer.bytes);
        let batch = self
            .buffer
            .take_batch(
                &self.schema,
                &self.item,
                self.dimensions,
                self.metadata.as_deref(),
            )
            .map_err(|source| FileError::Arrow {
                path: self.path_buf(),
                source,
            })?;
        self.writer
            .write(&batch)
            .map_err(|source| FileError::Parquet {
                path: self.temp.final_path().to_path_buf(),
                source,
            })
    }

    /// Encodes what is buffered and closes the row group.
    fn close_row_group(&mut self) -> Result<(), FileError> {
        self.encode_buffer()?;
        if self.group_bytes == 0 {
            return Ok(());
        }
        self.group_bytes = 0;
        self.writer.flush().map_err(|source| FileError::Parquet {
            path: self.temp.final_path().to_path_buf(),
            source,
        })
    }

    /// Closes a full row group and, from the second on, has what the file
    /// holds so far synced in the background: a file of one row group (a
    /// checkpoint part) is left to its commit.
    fn next_row_group(&mut self) -> Result<(), FileError> {
        self.close_row_group()?;
        if self.writer.flushed_row_groups().len() < 2 {
            return Ok(());
        }
        let writeback = match self.writeback.take() {
            Some(writeback) => writeback,
            None => Writeback::start(&self.file, self.temp.temp_path())?,
        };
        writeback.request();
        self.writeback = Some(writeback);
        Ok(())
    }

    fn key_values(&self, metadata: &OutputMetadata) -> Result<Vec<(String, String)>, FileError> {
        let fail = |message: String| FileError::Metadata {
            path: self.path_buf(),
            message,
        };
        if metadata.dimensions != self.dimensions {
            return Err(fail(format!(
                "the run reports {}-dimensional vectors, the output holds {}",
                metadata.dimensions, self.dimensions
            )));
        }
        let mut pairs = standard_pairs(metadata, metadata.dimensions);
        pairs.push((CHECKSUM_KEY.to_string(), self.checksum.value()));
        if let Some(cost) = metadata.cost {
            if !cost.is_finite() || cost < 0.0 {
                return Err(fail(format!("cost {cost} is not a finite amount")));
            }
            pairs.push((COST_KEY.to_string(), cost.to_string()));
        }
        for (key, value) in &metadata.extra {
            if pairs.iter().any(|(k, _)| k == key) {
                return Err(fail(format!("extra key {key:?} repeats a standard key")));
            }
            pairs.push((key.clone(), value.clone()));
        }
        Ok(pairs)
    }
}

impl VectorFile {
    /// Buffers or writes one batch. A batch that does not fit the file
    /// (vector length, row count, non-finite values) is rejected whole.
    pub fn write(&mut self, batch: &EmbeddedBatch) -> Result<(), FileError> {
        self.check(batch)?;
        let dimensions = self.dimensions;
        for (chunk, vector) in batch
            .chunks
            .iter()
            .zip(batch.vectors.values.chunks_exact(dimensions))
        {
            self.buffer.push(chunk, vector);
            self.checksum.row(&chunk.content_hash, vector);
            self.rows += 1;
            if self.group_bytes.saturating_add(self.buffer.bytes) >= self.row_group_bytes {
                self.next_row_group()?;
            } else if self.buffer.bytes >= self.slice_bytes() {
                self.encode_buffer()?;
            }
        }
        Ok(())
    }

    /// Writes what is buffered and `metadata`, and moves the file into place.
    pub fn finish(mut self, metadata: &OutputMetadata) -> Result<WrittenFile, FileError> {
        let key_values = self.key_values(metadata)?;
        self.close_row_group()?;
        let path = self.path_buf();
        let VectorFile {
            mut writer,
            file,
            writeback,
            temp,
            rows,
            ..
        } = self;
        for (key, value) in key_values {
            writer.append_key_value_metadata(KeyValue::new(key, value));
        }
        let parquet_error = |source| FileError::Parquet {
            path: path.clone(),
            source,
        };
        let written = writer.close().map_err(parquet_error)?;
        let row_groups = written.num_row_groups() as u64;
        let written_rows = written
            .row_groups()
            .iter()
            .map(|g| u64::try_from(g.num_rows()).unwrap_or(0))
            .sum::<u64>();
        if written_rows != rows {
            return Err(FileError::Metadata {
                path,
                message: format!("{rows} rows were given but {written_rows} were written"),
            });
        }
        if let Some(writeback) = writeback {
            writeback.finish()?;
        }
        let bytes = file
            .metadata()
            .map_err(FsError::io(
                temp.temp_path(),
                "cannot read the temporary file's size",
            ))?
            .len();
        temp.commit(file)?;
        Ok(WrittenFile {
            rows,
            row_groups,
            bytes,
            path,
        })
    }

    /// Drops the partial file; an earlier file at the path stays as it was.
    pub fn abort(self) {
        // Dropping closes the writer without a footer and removes the temporary file.
        drop(self);
    }
}

/// Rows waiting for the next row group, kept in Arrow builders so that a
/// flush turns them into arrays without copying.
struct RowBuffer {
    id: StringBuilder,
    doc_id: StringBuilder,
    chunk_index: UInt32Builder,
    source: StringBuilder,
    byte_start: UInt64Builder,
    byte_end: UInt64Builder,
    text: Option<StringBuilder>,
    content_hash: StringBuilder,
    token_count: UInt32Builder,
    /// One per metadata column.
    metadata: Vec<MetaBuilder>,
    /// Every vector, row after row.
    values: Vec<f32>,
    rows: usize,
    bytes: u64,
}

impl RowBuffer {
    fn new(include_text: bool, metadata: Option<&MetadataSchema>) -> Self {
        RowBuffer {
            metadata: metadata
                .iter()
                .flat_map(|m| &m.fields)
                .map(|f| MetaBuilder::new(&f.data_type))
                .collect(),
            id: StringBuilder::new(),
            doc_id: StringBuilder::new(),
            chunk_index: UInt32Builder::new(),
            source: StringBuilder::new(),
            byte_start: UInt64Builder::new(),
            byte_end: UInt64Builder::new(),
            text: include_text.then(StringBuilder::new),
            content_hash: StringBuilder::new(),
            token_count: UInt32Builder::new(),
            values: Vec::new(),
            rows: 0,
            bytes: 0,
        }
    }

    fn push(&mut self, chunk: &crate::types::Chunk, vector: &[f32]) {
        let mut hex_digits = [0u8; 64];
        // 32 bytes always encode into 64 ASCII hex digits.
        let hash = match hex::encode_to_slice(chunk.content_hash, &mut hex_digits) {
            Ok(()) => std::str::from_utf8(&hex_digits).unwrap_or_default(),
            Err(_) => "",
        };
        self.id.append_value(&chunk.id);
        self.doc_id.append_value(&chunk.doc_id);
        self.chunk_index.append_value(chunk.chunk_index);
        self.source.append_value(&chunk.source);
        self.byte_start.append_value(chunk.byte_start);
        self.byte_end.append_value(chunk.byte_end);
        let mut text_bytes = 0;
        if let Some(text) = &mut self.text {
            text.append_value(&chunk.text);
            text_bytes = chunk.text.len();
        }
        self.content_hash.append_value(hash);
        self.token_count.append_value(chunk.token_count);
        let mut metadata_bytes = 0;
        if let Some(metadata) = &chunk.metadata {
            for (builder, value) in self.metadata.iter_mut().zip(metadata.values.iter()) {
                metadata_bytes += builder.append(value);
            }
        }
        self.values.extend_from_slice(vector);
        self.rows += 1;
        let strings =
            chunk.id.len() + chunk.doc_id.len() + chunk.source.len() + text_bytes + metadata_bytes;
        self.bytes += FIXED_ROW_BYTES
            + u64::try_from(strings + std::mem::size_of_val(vector)).unwrap_or(u64::MAX);
    }

    /// Empties the buffer into a record batch.
    fn take_batch(
        &mut self,
        schema: &SchemaRef,
        item: &FieldRef,
        dimensions: usize,
        metadata: Option<&MetadataSchema>,
    ) -> Result<RecordBatch, arrow::error::ArrowError> {
        // The next row group is likely the size of this one: allocate once.
        let capacity = self.values.len();
        let values = std::mem::replace(&mut self.values, Vec::with_capacity(capacity));
        let size = i32::try_from(dimensions)
            .map_err(|_| arrow::error::ArrowError::InvalidArgumentError(dimensions.to_string()))?;
        let embedding = FixedSizeListArray::try_new(
            item.clone(),
            size,
            Arc::new(Float32Array::from(values)),
            None,
        )?;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.id.finish()),
            Arc::new(self.doc_id.finish()),
            Arc::new(self.chunk_index.finish()),
            Arc::new(self.source.finish()),
            Arc::new(self.byte_start.finish()),
            Arc::new(self.byte_end.finish()),
        ];
        if let Some(text) = &mut self.text {
            columns.push(Arc::new(text.finish()));
        }
        columns.push(Arc::new(self.content_hash.finish()));
        columns.push(Arc::new(self.token_count.finish()));
        for (builder, field) in self
            .metadata
            .iter_mut()
            .zip(metadata.iter().flat_map(|m| &m.fields))
        {
            columns.push(builder.finish(&field.data_type)?);
        }
        columns.push(Arc::new(embedding));
        self.rows = 0;
        self.bytes = 0;
        RecordBatch::try_new(schema.clone(), columns)
    }
}

/// A metadata column being built, in the kind its values are read as; on
/// [`MetaBuilder::finish`] it takes the column's own type.
enum MetaBuilder {
    Text(StringBuilder),
    Bool(BooleanBuilder),
    Int(Int64Builder),
    UInt(UInt64Builder),
    Float(Float64Builder),
}

impl MetaBuilder {
    fn new(data_type: &DataType) -> MetaBuilder {
        match data_type {
            DataType::Utf8 => MetaBuilder::Text(StringBuilder::new()),
            DataType::Boolean => MetaBuilder::Bool(BooleanBuilder::new()),
            t if t.is_unsigned_integer() => MetaBuilder::UInt(UInt64Builder::new()),
            t if t.is_floating() => MetaBuilder::Float(Float64Builder::new()),
            _ => MetaBuilder::Int(Int64Builder::new()),
        }
    }

    /// Appends `value` (checked to fit by [`value_fits`](crate::contract::value_fits)); returns
    /// the bytes it adds.
    fn append(&mut self, value: &MetaValue) -> usize {
        match (self, value) {
            (MetaBuilder::Text(b), MetaValue::Text(v)) => {
                b.append_value(v);
                return v.len();
            }
            (MetaBuilder::Bool(b), MetaValue::Bool(v)) => b.append_value(*v),
            (MetaBuilder::Int(b), MetaValue::Int(v)) => b.append_value(*v),
            (MetaBuilder::UInt(b), MetaValue::UInt(v)) => b.append_value(*v),
            (MetaBuilder::Float(b), MetaValue::Float(v)) => b.append_value(*v),
            (MetaBuilder::Text(b), _) => b.append_null(),
            (MetaBuilder::Bool(b), _) => b.append_null(),
            (MetaBuilder::Int(b), _) => b.append_null(),
            (MetaBuilder::UInt(b), _) => b.append_null(),
            (MetaBuilder::Float(b), _) => b.append_null(),
        }
        8
    }

    /// The values so far, as a column of `data_type`.
    fn finish(&mut self, data_type: &DataType) -> Result<ArrayRef, arrow::error::ArrowError> {
        let array: ArrayRef = match self {
            MetaBuilder::Text(b) => Arc::new(b.finish()),
            MetaBuilder::Bool(b) => Arc::new(b.finish()),
            MetaBuilder::Int(b) => Arc::new(b.finish()),
            MetaBuilder::UInt(b) => Arc::new(b.finish()),
            MetaBuilder::Float(b) => Arc::new(b.finish()),
        };
        if array.data_type() == data_type {
            return Ok(array);
        }
        // Days become a date through their own integer width.
        let array = if *data_type == DataType::Date32 {
            arrow::compute::cast(&array, &DataType::Int32)?
        } else {
            array
        };
        arrow::compute::cast(&array, data_type)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Float32Type, UInt32Type, UInt64Type};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;
    use arrow::datatypes::Field;

    use crate::contract::output_schema;
    use crate::parquet_io::read_key_values as read_metadata;
    use crate::testing::{batch, chunk, names, value};
    use crate::types::Usage;

    fn options(include_text: bool, row_group_bytes: u64) -> FileOptions {
        FileOptions {
            include_text,
            row_group_bytes,
            compression: Compression::Zstd,
        }
    }

    fn metadata(dimensions: usize, cost: Option<f64>) -> OutputMetadata {
        OutputMetadata {
            model: "svc-embed-1".into(),
            dimensions,
            backend: "api".into(),
            usage: Usage {
                prompt_tokens: 123,
                completion_tokens: 0,
                total_tokens: 456,
            },
            requests: 7,
            cost,
            extra: BTreeMap::new(),
        }
    }

    /// Every row of the file, and the number of row groups it holds.
    fn read_all(path: &Path) -> (RecordBatch, usize) {
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
        let row_groups = builder.metadata().num_row_groups();
        let schema = builder.schema().clone();
        let batches: Vec<RecordBatch> = builder.build().unwrap().map(Result::unwrap).collect();
        (
            arrow::compute::concat_batches(&schema, &batches).unwrap(),
            row_groups,
        )
    }

    fn write_output(path: &Path, dimensions: usize, docs: &[(&str, u32)]) -> WrittenFile {
        let mut sink = VectorFile::create(path, dimensions, options(true, 1 << 20)).unwrap();
        for (doc, len) in docs {
            sink.write(&batch(doc, 0, *len, dimensions)).unwrap();
        }
        sink.finish(&metadata(dimensions, None)).unwrap()
    }

    #[test]
    fn round_trip_keeps_every_column_across_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.parquet");
        let dims = 3;
        // A row here counts roughly 150 bytes: a few rows per row group.
        let mut sink = VectorFile::create(&path, dims, options(true, 400)).unwrap();
        sink.write(&batch("a.md", 0, 2, dims)).unwrap();
        sink.write(&batch("a.md", 2, 3, dims)).unwrap();
        sink.write(&batch("b.md", 0, 4, dims)).unwrap();
        let report = sink.finish(&metadata(dims, Some(0.0125))).unwrap();

        assert_eq!(report.rows, 9);
        assert!(report.row_groups > 1, "{report:?}");
        assert_eq!(report.path, path);
        assert_eq!(report.bytes, std::fs::metadata(&path).unwrap().len());
        assert_eq!(names(dir.path()), ["docs.parquet"]);

        let (rows, row_groups) = read_all(&path);
        assert_eq!(row_groups as u64, report.row_groups);
        assert_eq!(rows.num_rows(), 9);
        assert_eq!(rows.schema().fields(), output_schema(dims, true).fields());
        assert_eq!(
            rows.schema()
                .field_with_name("embedding")
                .unwrap()
                .data_type(),
            &DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 3)
        );

        let expected: Vec<_> = (0..5)
            .map(|i| chunk("a.md", i))
            .chain((0..4).map(|i| chunk("b.md", i)))
            .collect();
        let strings = |name: &str| -> Vec<String> {
            let column = rows.column_by_name(name).unwrap().as_string::<i32>();
            assert_eq!(column.null_count(), 0, "{name}");
            column.iter().map(|v| v.unwrap().to_string()).collect()
        };
        let field = |f: fn(&crate::types::Chunk) -> String| -> Vec<String> {
            expected.iter().map(f).collect()
        };
        assert_eq!(strings("id"), field(|c| c.id.clone()));
        assert_eq!(strings("doc_id"), field(|c| c.doc_id.to_string()));
        assert_eq!(strings("source"), field(|c| c.source.to_string()));
        assert_eq!(strings("text"), field(|c| c.text.clone()));
        assert_eq!(
            strings("content_hash"),
            field(crate::types::Chunk::content_hash_hex)
        );

        let u32s = |name: &str| -> Vec<u32> {
            let column = rows.column_by_name(name).unwrap();
            column.as_primitive::<UInt32Type>().values().to_vec()
        };
        let u64s = |name: &str| -> Vec<u64> {
            let column = rows.column_by_name(name).unwrap();
            column.as_primitive::<UInt64Type>().values().to_vec()
        };
        let map =
            |f: fn(&crate::types::Chunk) -> u64| -> Vec<u64> { expected.iter().map(f).collect() };
        assert_eq!(
            u32s("chunk_index"),
            expected.iter().map(|c| c.chunk_index).collect::<Vec<_>>()
        );
        assert_eq!(
            u32s("token_count"),
            expected.iter().map(|c| c.token_count).collect::<Vec<_>>()
        );
        assert_eq!(u64s("byte_start"), map(|c| c.byte_start));
        assert_eq!(u64s("byte_end"), map(|c| c.byte_end));

        let embedding = rows
            .column_by_name("embedding")
            .unwrap()
            .as_fixed_size_list();
        assert_eq!(embedding.null_count(), 0);
        let row_numbers = (0..5).chain(0..4);
        let expected_values: Vec<f32> = row_numbers
            .flat_map(|i| (0..dims).map(move |j| value(i, j)))
            .collect();
        let values = embedding.values().as_primitive::<Float32Type>();
        assert_eq!(values.values().to_vec(), expected_values);

        let kv = read_metadata(&path).unwrap();
        let get = |key: &str| kv.get(key).map(String::as_str);
        assert_eq!(get("embedjob.schema_version"), Some("1"));
        assert_eq!(get("embedjob.version"), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(get("embedjob.model"), Some("svc-embed-1"));
        assert_eq!(get("embedjob.dimensions"), Some("3"));
        assert_eq!(get("embedjob.backend"), Some("api"));
        assert_eq!(get("embedjob.usage.prompt_tokens"), Some("123"));
        assert_eq!(get("embedjob.usage.total_tokens"), Some("456"));
        assert_eq!(get("embedjob.requests"), Some("7"));
        assert_eq!(get("embedjob.cost"), Some("0.0125"));
    }

    #[test]
    fn metadata_columns_are_written_with_their_types_before_the_embedding() {
        use crate::types::{MetaValue, Metadata, MetadataField};
        use arrow::datatypes::TimeUnit;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let field = |column: &str, data_type: DataType| MetadataField {
            field: column.replace('_', "."),
            column: column.to_string(),
            data_type,
        };
        let schema = Arc::new(MetadataSchema {
            fields: vec![
                field("url", DataType::Utf8),
                field("year", DataType::Int32),
                field("day", DataType::Date32),
                field(
                    "at",
                    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                ),
                field("draft", DataType::Boolean),
                field("score", DataType::Float32),
                field("meta_rank", DataType::UInt16),
            ],
        });
        let values = |row: i64| -> Box<[MetaValue]> {
            if row == 1 {
                return vec![MetaValue::Null; 7].into_boxed_slice();
            }
            vec![
                MetaValue::Text(format!("https://x/{row}").into()),
                MetaValue::Int(2000 + row),
                MetaValue::Int(19_000 + row),
                MetaValue::Int(1_700_000_000_000 + row),
                MetaValue::Bool(row % 2 == 0),
                MetaValue::Float(0.5 + row as f64),
                MetaValue::UInt(7),
            ]
            .into_boxed_slice()
        };
        let mut written = batch("a", 0, 3, 2);
        for (row, chunk) in written.chunks.iter_mut().enumerate() {
            chunk.metadata = Some(Arc::new(Metadata {
                schema: Arc::clone(&schema),
                values: values(row as i64),
            }));
        }
        let mut sink = VectorFile::create_with_metadata(
            &path,
            2,
            options(false, 1 << 20),
            Some(Arc::clone(&schema)),
        )
        .unwrap();
        sink.write(&written).unwrap();
        // A chunk without the metadata does not fit the file.
        let error = sink.write(&batch("b", 0, 1, 2)).unwrap_err();
        assert!(error.to_string().contains("chunk b#0"), "{error}");
        sink.finish(&metadata(2, None)).unwrap();

        let (rows, _) = read_all(&path);
        let names: Vec<&str> = rows
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(
            &names[names.len() - 8..],
            [
                "url",
                "year",
                "day",
                "at",
                "draft",
                "score",
                "meta_rank",
                "embedding"
            ]
        );
        let expected = output_schema_with(2, false, Some(&schema));
        assert_eq!(rows.schema_ref().fields(), expected.fields());
        let at = rows.column_by_name("at").unwrap();
        let at = arrow::compute::cast(at, &DataType::Int64).unwrap();
        let at = at.as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(at.value(0), 1_700_000_000_000);
        assert!(at.is_null(1));
        assert_eq!(at.value(2), 1_700_000_000_002);
        let day = rows.column_by_name("day").unwrap();
        assert_eq!(
            day.as_primitive::<arrow::datatypes::Date32Type>().value(2),
            19_002
        );
        let url = rows.column_by_name("url").unwrap().as_string::<i32>();
        assert_eq!(url.value(2), "https://x/2");
        let score = rows.column_by_name("score").unwrap();
        assert_eq!(
            score.as_primitive::<Float32Type>().value(0),
            0.5,
            "{score:?}"
        );
    }

    #[test]
    fn row_groups_follow_the_byte_budget_not_the_batches() {
        let dir = tempfile::tempdir().unwrap();
        let dims = 256;
        // 1 KiB of vector per row: a 10 KiB budget cuts a row group every 10 rows.
        let budget = 10 * 1024;
        let path = dir.path().join("out.parquet");
        let mut sink = VectorFile::create(&path, dims, options(false, budget)).unwrap();
        for first in (0..95).step_by(19) {
            sink.write(&batch("a", first, 19, dims)).unwrap();
        }
        let report = sink.finish(&metadata(dims, None)).unwrap();
        assert_eq!(report.rows, 95);
        assert_eq!(report.row_groups, 10);

        let file = File::open(&path).unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let sizes: Vec<i64> = builder
            .metadata()
            .row_groups()
            .iter()
            .map(parquet::file::metadata::RowGroupMetaData::num_rows)
            .collect();
        assert_eq!(sizes, [10, 10, 10, 10, 10, 10, 10, 10, 10, 5]);

        let one_group = dir.path().join("one.parquet");
        let report = write_output(&one_group, dims, &[("a", 40), ("b", 40)]);
        assert_eq!((report.rows, report.row_groups), (80, 1));
    }

    #[test]
    fn without_text_the_column_is_absent_and_cost_unknown_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let mut sink = VectorFile::create(&path, 2, options(false, 1 << 20)).unwrap();
        sink.write(&batch("a", 0, 3, 2)).unwrap();
        sink.finish(&metadata(2, None)).unwrap();

        let (rows, _) = read_all(&path);
        assert_eq!(rows.num_rows(), 3);
        assert!(rows.column_by_name("text").is_none());
        let names: Vec<&str> = rows
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(
            names,
            [
                "id",
                "doc_id",
                "chunk_index",
                "source",
                "byte_start",
                "byte_end",
                "content_hash",
                "token_count",
                "embedding"
            ]
        );
        let kv = read_metadata(&path).unwrap();
        assert!(!kv.contains_key("embedjob.cost"), "{kv:?}");
        assert_eq!(kv.get("embedjob.requests").map(String::as_str), Some("7"));
    }

    #[test]
    fn a_batch_that_does_not_fit_is_rejected_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let mut sink = VectorFile::create(&path, 3, options(true, 1)).unwrap();

        let error = sink.write(&batch("a", 0, 2, 4)).unwrap_err();
        assert!(
            matches!(
                error,
                FileError::Dimensions {
                    expected: 3,
                    got: 4,
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("out.parquet"), "{error}");

        let mut short = batch("b", 0, 2, 3);
        short.vectors.values.truncate(5);
        let error = sink.write(&short).unwrap_err();
        assert!(
            matches!(
                error,
                FileError::RowCount {
                    chunks: 2,
                    values: 5,
                    ..
                }
            ),
            "{error}"
        );

        let mut extra = batch("c", 0, 2, 3);
        extra.chunks.pop();
        let error = sink.write(&extra).unwrap_err();
        assert!(
            matches!(
                error,
                FileError::RowCount {
                    chunks: 1,
                    values: 6,
                    ..
                }
            ),
            "{error}"
        );

        let mut nan = batch("d", 0, 2, 3);
        nan.vectors.values[4] = f32::NAN;
        let error = sink.write(&nan).unwrap_err();
        assert!(
            matches!(&error, FileError::NonFinite { id, position: 1, .. } if id == "d#1"),
            "{error}"
        );

        sink.write(&batch("e", 0, 2, 3)).unwrap();
        let report = sink.finish(&metadata(3, None)).unwrap();
        assert_eq!(report.rows, 2);
        let (rows, _) = read_all(&path);
        let ids = rows.column_by_name("id").unwrap().as_string::<i32>();
        assert_eq!(ids.iter().flatten().collect::<Vec<_>>(), ["e#0", "e#1"]);
    }

    #[test]
    fn unsupported_dimensions_are_rejected_before_any_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let error = VectorFile::create(&path, 0, options(true, 1)).unwrap_err();
        assert!(matches!(
            error,
            FileError::UnsupportedDimensions { dimensions: 0, .. }
        ));
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn abort_and_drop_leave_no_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");

        let mut sink = VectorFile::create(&path, 2, options(true, 1)).unwrap();
        sink.write(&batch("a", 0, 3, 2)).unwrap();
        assert_eq!(
            names(dir.path()).len(),
            1,
            "the temporary file exists while writing"
        );
        assert!(!path.exists());
        sink.abort();
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));

        let mut sink = VectorFile::create(&path, 2, options(true, 1)).unwrap();
        sink.write(&batch("a", 0, 3, 2)).unwrap();
        drop(sink);
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[test]
    fn a_failed_finish_leaves_no_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let mut sink = VectorFile::create(&path, 2, options(true, 1 << 20)).unwrap();
        sink.write(&batch("a", 0, 3, 2)).unwrap();
        let error = sink.finish(&metadata(3, None)).unwrap_err();
        assert!(matches!(error, FileError::Metadata { .. }), "{error}");
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));

        let sink = VectorFile::create(&path, 2, options(true, 1 << 20)).unwrap();
        let mut repeated = metadata(2, None);
        repeated
            .extra
            .insert("embedjob.model".into(), "other".into());
        let error = sink.finish(&repeated).unwrap_err();
        assert!(error.to_string().contains("embedjob.model"), "{error}");
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[test]
    fn extra_metadata_is_written_as_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let sink = VectorFile::create(&path, 2, options(true, 1 << 20)).unwrap();
        let mut with_extra = metadata(2, None);
        with_extra
            .extra
            .insert("embedjob.job".into(), "docs-index".into());
        let report = sink.finish(&with_extra).unwrap();
        assert_eq!((report.rows, report.row_groups), (0, 0));
        let kv = read_metadata(&path).unwrap();
        assert_eq!(
            kv.get("embedjob.job").map(String::as_str),
            Some("docs-index")
        );
        assert_eq!(read_all(&path).0.num_rows(), 0);
    }

    #[test]
    fn an_earlier_output_stays_readable_until_the_new_one_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        write_output(&path, 2, &[("old", 4)]);
        let old = std::fs::read(&path).unwrap();

        let mut sink = VectorFile::create(&path, 2, options(true, 1)).unwrap();
        sink.write(&batch("new", 0, 6, 2)).unwrap();
        assert_eq!(read_all(&path).0.num_rows(), 4, "old output while writing");
        sink.abort();
        assert_eq!(std::fs::read(&path).unwrap(), old);
        assert_eq!(names(dir.path()), ["out.parquet"]);

        let mut sink = VectorFile::create(&path, 2, options(true, 1)).unwrap();
        sink.write(&batch("new", 0, 6, 2)).unwrap();
        assert_eq!(read_all(&path).0.num_rows(), 4, "old output until finish");
        sink.finish(&metadata(2, None)).unwrap();
        let (rows, _) = read_all(&path);
        assert_eq!(rows.num_rows(), 6);
        let ids = rows.column_by_name("id").unwrap().as_string::<i32>();
        assert_eq!(ids.value(0), "new#0");
        assert_eq!(names(dir.path()), ["out.parquet"]);
    }

    #[test]
    fn the_output_directory_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/out.parquet");
        let report = write_output(&path, 2, &[("a", 1)]);
        assert_eq!(report.rows, 1);
        assert_eq!(names(&dir.path().join("a/b")), ["out.parquet"]);
    }

    #[test]
    fn read_metadata_names_a_file_that_is_not_parquet() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not.parquet");
        std::fs::write(&path, b"not parquet at all").unwrap();
        let error = read_metadata(&path).unwrap_err();
        assert!(matches!(error, FileError::Parquet { .. }), "{error}");
        assert!(error.to_string().contains("not.parquet"), "{error}");
        let missing = read_metadata(&dir.path().join("missing.parquet")).unwrap_err();
        assert!(
            matches!(missing, FileError::Fs(FsError::Io { .. })),
            "{missing}"
        );
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let mut sink = VectorFile::create(&path, 2, options(true, 1 << 20)).unwrap();
        sink.write(&EmbeddedBatch {
            chunks: Vec::new(),
            vectors: crate::types::Vectors {
                dimensions: 2,
                values: Vec::new(),
                usage: Usage::default(),
                discarded: Usage::default(),
            },
        })
        .unwrap();
        assert_eq!(sink.finish(&metadata(2, None)).unwrap().rows, 0);
    }
}
