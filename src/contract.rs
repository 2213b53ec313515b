//! The output contract, in one place: the columns every output has (and
//! the metadata columns `source.metadata_fields` add), the `embedjob.*`
//! keys it records, the schema version, and the one check a batch passes
//! before any sink writes it. Parquet files, pgvector tables, `inspect`
//! and the job checks all read it from here.
//!
//! It depends on `types` and external crates only, so that every layer can
//! use it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, Field, FieldRef, Float64Type, Int64Type, Schema, SchemaRef, TimeUnit, UInt64Type,
};
use serde_json::Value;

use crate::types::{Chunk, EmbeddedBatch, MetaValue, MetadataSchema, OutputMetadata};

/// The version of the output's layout, stored as `embedjob.schema_version`.
/// Bump it when a column is added, removed or changes type.
pub const SCHEMA_VERSION: &str = "1";

pub const SCHEMA_VERSION_KEY: &str = "embedjob.schema_version";
/// The embedjob that wrote the output.
pub const VERSION_KEY: &str = "embedjob.version";
pub const MODEL_KEY: &str = "embedjob.model";
pub const DIMENSIONS_KEY: &str = "embedjob.dimensions";
/// `api` or `local`.
pub const BACKEND_KEY: &str = "embedjob.backend";
pub const PROMPT_TOKENS_KEY: &str = "embedjob.usage.prompt_tokens";
pub const TOTAL_TOKENS_KEY: &str = "embedjob.usage.total_tokens";
pub const REQUESTS_KEY: &str = "embedjob.requests";
/// Only when the model's price is known.
pub const COST_KEY: &str = "embedjob.cost";
/// Batch mode: the price per 1000 input tokens the batches were billed at
/// (`embedjob.cost` is at this price).
pub const BATCH_PRICE_KEY: &str = "embedjob.batch.input_per_1k";
/// A checkpoint part's: the batch of the Batch API its rows came from (its
/// usage was billed at the batch price).
pub const BATCH_ID_KEY: &str = "embedjob.batch_id";
/// Of `embedjob.usage.prompt_tokens`, the tokens that paid for vectors that
/// failed a check and were discarded.
pub const DISCARDED_TOKENS_KEY: &str = "embedjob.usage.discarded_tokens";
/// The local token count of the chunks whose vectors were paid for.
pub const LOCAL_TOKENS_KEY: &str = "embedjob.usage.local_tokens";
/// Billed tokens (those discarded left out) over the local count of the same
/// chunks, for the next estimate of the job.
pub const TOKEN_RATIO_KEY: &str = "embedjob.billed_token_ratio";
/// The context window a run learned for a model that lists none (JSON:
/// `tokens`, counted in `tokenizer`; `server_tokens`, `from`), which the
/// next run and `estimate` cut chunks to from the start.
pub const CONTEXT_WINDOW_KEY: &str = "embedjob.context_window";
/// The configuration the vectors were made under (JSON).
pub const FINGERPRINT_KEY: &str = "embedjob.fingerprint";
/// The job that wrote the output.
pub const JOB_KEY: &str = "embedjob.job";
/// The shard of a split job the file holds (`1/4`).
pub const SHARD_KEY: &str = "embedjob.shard";
/// What a shard's run read of the whole input: its document ids' count and
/// digest (`12 documents, ids 0123456789abcdef`). Shards that read different
/// inputs may hold one renamed document twice.
pub const INPUT_KEY: &str = "embedjob.input";
/// The XXH3 hash of a file's rows.
pub const CHECKSUM_KEY: &str = "embedjob.checksum";
/// A table's count of the runs that finished on it.
pub const GENERATION_KEY: &str = "embedjob.generation";
/// A table's metadata columns, as the run that wrote its rows made them.
pub const METADATA_COLUMNS_KEY: &str = "embedjob.metadata_columns";

/// The `embedjob.*` keys every output records, whatever holds it: schema
/// and program version, model, `dimensions`, backend, usage and requests.
pub fn standard_pairs(metadata: &OutputMetadata, dimensions: usize) -> Vec<(String, String)> {
    [
        (SCHEMA_VERSION_KEY, SCHEMA_VERSION.to_string()),
        (VERSION_KEY, env!("CARGO_PKG_VERSION").to_string()),
        (MODEL_KEY, metadata.model.clone()),
        (DIMENSIONS_KEY, dimensions.to_string()),
        (BACKEND_KEY, metadata.backend.clone()),
        (PROMPT_TOKENS_KEY, metadata.usage.prompt_tokens.to_string()),
        (TOTAL_TOKENS_KEY, metadata.usage.total_tokens.to_string()),
        (REQUESTS_KEY, metadata.requests.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

// --------------------------------------------------------------- columns

/// What a standard column holds; each sink maps it to a type of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Utf8,
    UInt32,
    UInt64,
    /// The vector: `dimensions` float32 values.
    Vector,
}

/// A column every output has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub column_type: ColumnType,
    /// Declared not null (`id`, `embedding`); the others never hold a null
    /// but are declared nullable.
    pub required: bool,
}

const fn column(name: &'static str, column_type: ColumnType, required: bool) -> Column {
    Column {
        name,
        column_type,
        required,
    }
}

pub const ID: &str = "id";
pub const TEXT: &str = "text";
pub const EMBEDDING: &str = "embedding";

/// The columns every output has, in order. `text` is left out of a Parquet
/// file when the text is not included; metadata columns go just before
/// `embedding`.
pub const COLUMNS: &[Column] = &[
    column(ID, ColumnType::Utf8, true),
    column("doc_id", ColumnType::Utf8, false),
    column("chunk_index", ColumnType::UInt32, false),
    column("source", ColumnType::Utf8, false),
    column("byte_start", ColumnType::UInt64, false),
    column("byte_end", ColumnType::UInt64, false),
    column(TEXT, ColumnType::Utf8, false),
    column("content_hash", ColumnType::Utf8, false),
    column("token_count", ColumnType::UInt32, false),
    column(EMBEDDING, ColumnType::Vector, true),
];

/// Whether `name` is one of [`COLUMNS`].
pub fn is_standard_column(name: &str) -> bool {
    COLUMNS.iter().any(|c| c.name == name)
}

/// The output column a metadata field is written to: its name, with the
/// dots of a JSON path made underscores (`meta.lang` → `meta_lang`), so that
/// SQL can name it without quotes.
pub fn metadata_column(field: &str) -> String {
    field.replace('.', "_")
}

/// Problems with a `source.metadata_fields` list: names that are not field
/// names or paths, or whose columns would clash with the output's or each
/// other's. Names are compared without regard to case: DuckDB's column
/// names are case-insensitive, so `Embedding` would shadow `embedding`.
pub fn metadata_problems(fields: &[String], p: &mut Vec<String>) {
    let mut columns: Vec<(String, &str)> = Vec::new();
    for field in fields {
        if field.is_empty() || field.split('.').any(str::is_empty) {
            p.push(format!(
                "`source.metadata_fields`: {field:?} is not a field name or a dotted path"
            ));
            continue;
        }
        let column = metadata_column(field);
        let lowered = column.to_lowercase();
        let same = |other: &str| other.to_lowercase() == lowered;
        if let Some(standard) = COLUMNS.iter().find(|c| same(c.name)) {
            p.push(format!(
                "`source.metadata_fields`: {field:?} would be written as column {column:?}, \
                 which the output already has as {:?} (column names are compared without regard to case)",
                standard.name
            ));
        } else if let Some((_, other)) = columns.iter().find(|(c, _)| same(c)) {
            p.push(format!(
                "`source.metadata_fields`: {other:?} and {field:?} would both be written as column {column:?} \
                 (column names are compared without regard to case)"
            ));
        } else {
            columns.push((column, field));
        }
    }
}

/// The Arrow schema of the output.
///
/// - `id` and `embedding` are declared not null, as the product's contract
///   says; the other columns are declared nullable but never hold a null.
/// - `text` is absent, not null-filled, when the text is not included, so that
///   readers see no column rather than a column of nulls.
/// - `embedding` is `FixedSizeList<Float32>[dimensions]` whose child field is
///   `item`, nullable: the layout pyarrow's `pa.list_(pa.float32(), n)`
///   produces and `LanceDB` expects for a vector column. No value is ever null.
pub fn output_schema(dimensions: usize, include_text: bool) -> SchemaRef {
    output_schema_with(dimensions, include_text, None)
}

/// [`output_schema`]'s columns with the `metadata` columns
/// (`source.metadata_fields`), nullable and typed as in the input, just
/// before `embedding`.
pub fn output_schema_with(
    dimensions: usize,
    include_text: bool,
    metadata: Option<&MetadataSchema>,
) -> SchemaRef {
    let size = i32::try_from(dimensions).unwrap_or(i32::MAX);
    let mut fields = Vec::with_capacity(COLUMNS.len());
    for column in COLUMNS {
        let data_type = match column.column_type {
            ColumnType::Utf8 => DataType::Utf8,
            ColumnType::UInt32 => DataType::UInt32,
            ColumnType::UInt64 => DataType::UInt64,
            ColumnType::Vector => {
                for field in metadata.iter().flat_map(|m| &m.fields) {
                    fields.push(Field::new(&field.column, field.data_type.clone(), true));
                }
                DataType::FixedSizeList(item_field(), size)
            }
        };
        if column.name == TEXT && !include_text {
            continue;
        }
        fields.push(Field::new(column.name, data_type, !column.required));
    }
    Arc::new(Schema::new(fields))
}

/// The child field of the `embedding` list.
pub fn item_field() -> FieldRef {
    Arc::new(Field::new("item", DataType::Float32, true))
}

// ------------------------------------------------------- metadata values

/// The type a metadata column of output type `output` is read as: one of
/// the [`MetaValue`] kinds (dates and timestamps as integers in their own
/// unit).
pub fn reading_type(output: &DataType) -> DataType {
    match output {
        DataType::Utf8 => DataType::Utf8,
        DataType::Boolean => DataType::Boolean,
        t if t.is_unsigned_integer() => DataType::UInt64,
        t if t.is_floating() => DataType::Float64,
        _ => DataType::Int64,
    }
}

/// Whether a column of `data_type` holds `value`.
pub fn value_fits(data_type: &DataType, value: &MetaValue) -> bool {
    matches!(
        (reading_type(data_type), value),
        (_, MetaValue::Null)
            | (DataType::Utf8, MetaValue::Text(_))
            | (DataType::Boolean, MetaValue::Bool(_))
            | (DataType::Int64, MetaValue::Int(_))
            | (DataType::UInt64, MetaValue::UInt(_))
            | (DataType::Float64, MetaValue::Float(_))
    )
}

/// `array` (a column of output type `output`) cast to the type its values
/// are read as.
pub fn readable(array: &ArrayRef, output: &DataType) -> Result<ArrayRef, String> {
    let to = reading_type(output);
    let cast = |array: &ArrayRef, to: &DataType| {
        arrow::compute::cast(array, to).map_err(|e| e.to_string())
    };
    match array.data_type() {
        // Dates are counted in their own integer width first.
        DataType::Date32 => cast(&cast(array, &DataType::Int32)?, &to),
        _ => cast(array, &to),
    }
}

/// Row `index` of a [`readable`] array.
pub fn arrow_value(array: &ArrayRef, index: usize) -> MetaValue {
    if array.is_null(index) {
        return MetaValue::Null;
    }
    match array.data_type() {
        DataType::Utf8 => MetaValue::Text(array.as_string::<i32>().value(index).into()),
        DataType::Boolean => MetaValue::Bool(array.as_boolean().value(index)),
        DataType::UInt64 => MetaValue::UInt(array.as_primitive::<UInt64Type>().value(index)),
        DataType::Float64 => MetaValue::Float(array.as_primitive::<Float64Type>().value(index)),
        DataType::Int64 => MetaValue::Int(array.as_primitive::<Int64Type>().value(index)),
        _ => MetaValue::Null,
    }
}

/// A metadata value as `query --json` shows it, the same whatever holds the
/// output: numbers and booleans as such, dates as `YYYY-MM-DD`, timestamps
/// in ISO 8601 (in UTC, with a `Z`, when the column has a time zone).
pub fn json_value(value: &MetaValue, data_type: &DataType) -> Value {
    use arrow::temporal_conversions as t;
    let instant = |v: i64, unit: &TimeUnit| match unit {
        TimeUnit::Second => t::timestamp_s_to_datetime(v),
        TimeUnit::Millisecond => t::timestamp_ms_to_datetime(v),
        TimeUnit::Microsecond => t::timestamp_us_to_datetime(v),
        TimeUnit::Nanosecond => t::timestamp_ns_to_datetime(v),
    };
    match (value, data_type) {
        (MetaValue::Null, _) => Value::Null,
        (MetaValue::Bool(b), _) => Value::Bool(*b),
        (MetaValue::Text(s), _) => Value::String(s.to_string()),
        (MetaValue::UInt(v), _) => Value::from(*v),
        // A float32 shown as its shortest decimal, not as the float64 it widens to.
        #[allow(clippy::cast_possible_truncation)]
        (MetaValue::Float(v), DataType::Float32 | DataType::Float16) => (*v as f32)
            .to_string()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        (MetaValue::Float(v), _) => {
            serde_json::Number::from_f64(*v).map_or(Value::Null, Value::Number)
        }
        (MetaValue::Int(v), DataType::Date32) => i32::try_from(*v)
            .ok()
            .and_then(t::date32_to_datetime)
            .map_or(Value::Null, |d| Value::String(d.date().to_string())),
        (MetaValue::Int(v), DataType::Date64) => {
            t::date64_to_datetime(*v).map_or(Value::Null, |d| Value::String(d.date().to_string()))
        }
        (MetaValue::Int(v), DataType::Timestamp(unit, zone)) => {
            let zone = if zone.is_some() { "Z" } else { "" };
            instant(*v, unit).map_or(Value::Null, |d| {
                Value::String(format!("{}{zone}", d.format("%Y-%m-%dT%H:%M:%S%.f")))
            })
        }
        (MetaValue::Int(v), _) => Value::from(*v),
    }
}

// ----------------------------------------------------------- the check

/// Why a batch does not fit an output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    #[error("a batch has {got}-dimensional vectors, the output holds {expected}")]
    Dimensions { expected: usize, got: usize },
    #[error("a batch has {chunks} chunks but {values} vector values ({dimensions} per row)")]
    RowCount {
        chunks: usize,
        values: usize,
        dimensions: usize,
    },
    #[error("chunk {id}: vector value {value} at position {position} is not finite")]
    NonFinite {
        id: String,
        position: usize,
        value: f32,
    },
    #[error("chunk {id}: {message}")]
    Metadata { id: String, message: String },
}

/// The check every batch passes before a sink writes it: vectors of
/// `dimensions` values (not 0), one per chunk, every value finite, and
/// every chunk carrying the output's `metadata` columns (or none when it
/// has none), each value of its column's kind.
pub fn check_batch(
    batch: &EmbeddedBatch,
    dimensions: usize,
    metadata: Option<&Arc<MetadataSchema>>,
) -> Result<(), ShapeError> {
    let vectors = &batch.vectors;
    if vectors.dimensions != dimensions {
        return Err(ShapeError::Dimensions {
            expected: dimensions,
            got: vectors.dimensions,
        });
    }
    let expected_values = batch.chunks.len().checked_mul(dimensions);
    if dimensions == 0 || Some(vectors.values.len()) != expected_values {
        return Err(ShapeError::RowCount {
            chunks: batch.chunks.len(),
            values: vectors.values.len(),
            dimensions,
        });
    }
    if let Some(at) = vectors.values.iter().position(|v| !v.is_finite()) {
        return Err(ShapeError::NonFinite {
            id: batch.chunks[at / dimensions].id.clone(),
            position: at % dimensions,
            value: vectors.values[at],
        });
    }
    for chunk in &batch.chunks {
        check_metadata(chunk, metadata).map_err(|message| ShapeError::Metadata {
            id: chunk.id.clone(),
            message,
        })?;
    }
    Ok(())
}

fn check_metadata(chunk: &Chunk, columns: Option<&Arc<MetadataSchema>>) -> Result<(), String> {
    let (schema, metadata) = match (columns, &chunk.metadata) {
        (None, None) => return Ok(()),
        (Some(schema), Some(metadata)) => (schema, metadata),
        (None, Some(_)) => return Err("carries metadata the output has no columns for".into()),
        (Some(_), None) => return Err("carries none of the output's metadata columns".into()),
    };
    if !Arc::ptr_eq(schema, &metadata.schema) && **schema != *metadata.schema {
        return Err("carries other metadata columns than the output's".into());
    }
    for (field, value) in schema.fields.iter().zip(metadata.values.iter()) {
        if !value_fits(&field.data_type, value) {
            return Err(format!(
                "value {value:?} does not fit column {:?} ({})",
                field.column, field.data_type
            ));
        }
    }
    if schema.fields.len() != metadata.values.len() {
        return Err(format!(
            "{} metadata values for {} columns",
            metadata.values.len(),
            schema.fields.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::batch;
    use crate::types::{Metadata, MetadataField};

    #[test]
    fn metadata_columns_go_before_the_embedding_and_text_may_be_left_out() {
        let metadata = MetadataSchema {
            fields: vec![MetadataField {
                field: "meta.lang".into(),
                column: metadata_column("meta.lang"),
                data_type: DataType::Utf8,
            }],
        };
        let schema = output_schema_with(4, false, Some(&metadata));
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
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
                "meta_lang",
                "embedding"
            ]
        );
        assert!(!schema.field(0).is_nullable());
        assert!(!schema.field(9).is_nullable());
        assert!(schema.field(8).is_nullable());
        assert_eq!(output_schema(4, true).fields().len(), COLUMNS.len());
    }

    #[test]
    fn a_metadata_field_may_not_take_a_standard_column_or_another_fields() {
        let mut problems = Vec::new();
        let fields = ["lang", "embedding", "a.b", "a_b", "", "x..y"].map(String::from);
        metadata_problems(&fields, &mut problems);
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].contains("\"embedding\""), "{}", problems[0]);
        assert!(
            problems[1].contains("\"a.b\" and \"a_b\""),
            "{}",
            problems[1]
        );
        assert!(is_standard_column("token_count") && !is_standard_column("lang"));
    }

    /// A field `Embedding` was let through beside the `embedding` column,
    /// which it shadows in DuckDB, where column names are case-insensitive.
    #[test]
    fn regression_a_metadata_field_differing_in_case_from_a_column_was_let_through() {
        // Every standard column, in other cases, and as a dotted path.
        for column in COLUMNS {
            let upper = column.name.to_uppercase();
            let mut title = column.name.to_string();
            title[..1].make_ascii_uppercase();
            for field in [upper, title] {
                let mut problems = Vec::new();
                metadata_problems(std::slice::from_ref(&field), &mut problems);
                assert_eq!(problems.len(), 1, "{field}: {problems:#?}");
                assert!(
                    problems[0].contains(&format!("{field:?}")),
                    "{}",
                    problems[0]
                );
                assert!(
                    problems[0].contains(&format!("{:?}", column.name)),
                    "{}",
                    problems[0]
                );
            }
        }
        let mut problems = Vec::new();
        metadata_problems(&["Token.Count".to_string()], &mut problems);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        // And with each other.
        let mut problems = Vec::new();
        let fields = ["Lang", "lang", "META.year", "meta_Year", "Été", "été"].map(String::from);
        metadata_problems(&fields, &mut problems);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].contains("\"Lang\" and \"lang\""),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].contains("\"META.year\" and \"meta_Year\""),
            "{}",
            problems[1]
        );
        assert!(
            problems[2].contains("\"Été\" and \"été\""),
            "{}",
            problems[2]
        );
    }

    #[test]
    fn the_batch_check_says_which_check_failed() {
        let ok = batch("a", 0, 2, 3);
        assert_eq!(check_batch(&ok, 3, None), Ok(()));
        assert_eq!(
            check_batch(&ok, 4, None),
            Err(ShapeError::Dimensions {
                expected: 4,
                got: 3
            })
        );
        let mut short = batch("a", 0, 2, 3);
        short.vectors.values.pop();
        assert!(matches!(
            check_batch(&short, 3, None),
            Err(ShapeError::RowCount {
                chunks: 2,
                values: 5,
                ..
            })
        ));
        let mut empty = batch("a", 0, 1, 0);
        empty.vectors.values.clear();
        assert!(matches!(
            check_batch(&empty, 0, None),
            Err(ShapeError::RowCount { .. })
        ));
        let mut nan = batch("a", 0, 2, 3);
        nan.vectors.values[4] = f32::INFINITY;
        assert!(matches!(
            check_batch(&nan, 3, None),
            Err(ShapeError::NonFinite { ref id, position: 1, .. }) if id == "a#1"
        ));
    }

    #[test]
    fn the_batch_check_holds_chunks_to_the_outputs_metadata_columns() {
        let schema = Arc::new(MetadataSchema {
            fields: vec![MetadataField {
                field: "n".into(),
                column: "n".into(),
                data_type: DataType::Int32,
            }],
        });
        let with = |value: MetaValue| {
            let mut b = batch("a", 0, 1, 2);
            b.chunks[0].metadata = Some(Arc::new(Metadata {
                schema: Arc::clone(&schema),
                values: vec![value].into_boxed_slice(),
            }));
            b
        };
        assert_eq!(
            check_batch(&with(MetaValue::Int(3)), 2, Some(&schema)),
            Ok(())
        );
        assert_eq!(
            check_batch(&with(MetaValue::Null), 2, Some(&schema)),
            Ok(())
        );
        let message = |b: &EmbeddedBatch, s: Option<&Arc<MetadataSchema>>| {
            check_batch(b, 2, s).unwrap_err().to_string()
        };
        assert!(message(&with(MetaValue::Text("x".into())), Some(&schema))
            .contains("does not fit column \"n\""));
        assert!(message(&with(MetaValue::Int(3)), None).starts_with("chunk a#0: carries metadata"));
        assert!(message(&batch("a", 0, 1, 2), Some(&schema)).contains("none of the output's"));
    }

    #[test]
    fn values_show_in_json_by_their_columns_type() {
        let utc = Some(Arc::from("+02:00"));
        let show = |v: MetaValue, t: DataType| json_value(&v, &t);
        assert_eq!(show(MetaValue::Int(19_000), DataType::Date32), "2022-01-08");
        assert_eq!(
            show(MetaValue::Int(86_400_000), DataType::Date64),
            "1970-01-02"
        );
        assert_eq!(
            show(
                MetaValue::Int(1_700_000_000_500),
                DataType::Timestamp(TimeUnit::Millisecond, utc)
            ),
            "2023-11-14T22:13:20.500Z"
        );
        assert_eq!(
            show(
                MetaValue::Int(0),
                DataType::Timestamp(TimeUnit::Second, None)
            ),
            "1970-01-01T00:00:00"
        );
        assert_eq!(
            show(MetaValue::Float(0.1_f32.into()), DataType::Float32),
            0.1
        );
        assert_eq!(
            show(MetaValue::Float(f64::NAN), DataType::Float64),
            Value::Null
        );
        assert_eq!(show(MetaValue::UInt(u64::MAX), DataType::UInt64), u64::MAX);
        assert_eq!(show(MetaValue::Int(-1), DataType::Int8), -1);
        assert_eq!(show(MetaValue::Null, DataType::Utf8), Value::Null);
    }
}
