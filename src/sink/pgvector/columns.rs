//! The table's columns as SQL: the output contract's columns
//! ([`crate::contract::COLUMNS`]) and its metadata columns, their SQL types,
//! the statements that create, fill and bring a table up to date, and
//! metadata values in PostgreSQL's binary form.
//!
//! A metadata column takes the SQL type nearest its Parquet type: `text`,
//! `boolean`, `smallint`/`integer`/`bigint` (unsigned integers one size up,
//! `uint64` as `numeric(20,0)`), `real`, `double precision`, `date`, and
//! `timestamp` (with time zone when the column has one), to the microsecond.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;

use arrow::datatypes::{DataType, TimeUnit};
use bytes::{BufMut, BytesMut};
use serde_json::Value;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

use super::db::{quote, standard_sql, Extension};
use crate::contract::{self, ColumnType, ShapeError, COLUMNS, ID};
use crate::types::{EmbeddedBatch, MetaValue, MetadataSchema};

/// PostgreSQL truncates longer identifiers.
const MAX_IDENTIFIER_BYTES: usize = 63;
/// Days from 1970-01-01 (Arrow's dates) to 2000-01-01 (PostgreSQL's).
const EPOCH_DAYS: i64 = 10_957;
/// Microseconds from 1970-01-01 to 2000-01-01.
const EPOCH_MICROS: i64 = EPOCH_DAYS * 86_400_000_000;
/// The dates PostgreSQL holds, in days from 2000-01-01 (4714-11-24 BC to 5874897 AD).
const DATE_RANGE: std::ops::Range<i64> = -2_451_545..2_145_031_949;
/// The timestamps PostgreSQL holds, in microseconds from 2000-01-01.
const TIMESTAMP_RANGE: std::ops::Range<i64> = -211_813_488_000_000_000..9_223_371_331_200_000_000;

/// A metadata column of a table: its name and SQL type, as PostgreSQL's
/// `format_type` spells it. Recorded as `[name, type]` under
/// [`contract::METADATA_COLUMNS_KEY`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct PgColumn(pub String, pub String);

impl PgColumn {
    pub fn name(&self) -> &str {
        &self.0
    }

    pub fn sql(&self) -> &str {
        &self.1
    }
}

/// The SQL type of a metadata column of Arrow type `data_type`, or `None`
/// when a table cannot hold it.
pub(crate) fn metadata_sql(data_type: &DataType) -> Option<&'static str> {
    Some(match data_type {
        DataType::Utf8 => "text",
        DataType::Boolean => "boolean",
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint",
        DataType::Int32 | DataType::UInt16 => "integer",
        DataType::Int64 | DataType::UInt32 => "bigint",
        DataType::UInt64 => "numeric(20,0)",
        DataType::Float16 | DataType::Float32 => "real",
        DataType::Float64 => "double precision",
        DataType::Date32 | DataType::Date64 => "date",
        DataType::Timestamp(_, None) => "timestamp without time zone",
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone",
        _ => return None,
    })
}

/// The type of a metadata column's values, for `COPY` and for reading.
pub(crate) fn pg_type(sql: &str) -> Option<Type> {
    Some(match sql {
        "text" => Type::TEXT,
        "boolean" => Type::BOOL,
        "smallint" => Type::INT2,
        "integer" => Type::INT4,
        "bigint" => Type::INT8,
        "numeric(20,0)" => Type::NUMERIC,
        "real" => Type::FLOAT4,
        "double precision" => Type::FLOAT8,
        "date" => Type::DATE,
        "timestamp without time zone" => Type::TIMESTAMP,
        "timestamp with time zone" => Type::TIMESTAMPTZ,
        _ => return None,
    })
}

/// The table's metadata columns for `schema`; `Err` names a column a table
/// cannot hold.
pub(crate) fn metadata_columns(schema: &MetadataSchema) -> Result<Vec<PgColumn>, String> {
    schema
        .fields
        .iter()
        .map(|field| {
            if field.column.len() > MAX_IDENTIFIER_BYTES || field.column.contains('\0') {
                return Err(format!(
                    "`source.metadata_fields`: column {:?} is not a PostgreSQL column name \
                     (at most {MAX_IDENTIFIER_BYTES} bytes, no NUL)",
                    field.column
                ));
            }
            let sql = metadata_sql(&field.data_type).ok_or_else(|| {
                format!(
                    "`source.metadata_fields`: column {:?} is {}, which a table cannot hold",
                    field.column, field.data_type
                )
            })?;
            Ok(PgColumn(field.column.clone(), sql.to_string()))
        })
        .collect()
}

/// The record of a table's metadata columns, as stored.
pub(crate) fn record(columns: &[PgColumn]) -> String {
    serde_json::to_string(columns).unwrap_or_default()
}

/// A stored record; one that cannot be read counts as none.
pub(crate) fn parse_record(value: Option<&String>) -> Vec<PgColumn> {
    value
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// Every column, quoted, for `INSERT`, `COPY` and `SELECT`.
pub(crate) fn column_list(metadata: &[PgColumn]) -> String {
    COLUMNS
        .iter()
        .map(|c| c.name.to_string())
        .chain(metadata.iter().map(|c| quote(c.name())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `CREATE TABLE` of the output's layout, `id` its primary key.
pub(crate) fn create_table(
    name: &str,
    ext: &Extension,
    dimensions: usize,
    temporary: bool,
    metadata: &[PgColumn],
) -> String {
    let columns: Vec<String> = COLUMNS
        .iter()
        .map(|column| match column.column_type {
            _ if column.name == ID && temporary => "id text NOT NULL".to_string(),
            _ if column.name == ID => "id text PRIMARY KEY".to_string(),
            ColumnType::Vector => format!("{} {} NOT NULL", column.name, ext.vector(dimensions)),
            other => format!("{} {}", column.name, standard_sql(other)),
        })
        .chain(
            metadata
                .iter()
                .map(|c| format!("{} {}", quote(c.name()), c.sql())),
        )
        .collect();
    let kind = if temporary {
        "TEMPORARY TABLE"
    } else {
        "TABLE"
    };
    format!(
        "CREATE {kind} IF NOT EXISTS {name} ({})",
        columns.join(", ")
    )
}

/// The statement that moves the staged rows into the table, replacing rows
/// of the same id.
pub(crate) fn upsert(table: &str, staging: &str, metadata: &[PgColumn]) -> String {
    let columns = column_list(metadata);
    let updates: Vec<String> = COLUMNS
        .iter()
        .filter(|c| c.name != ID)
        .map(|c| c.name.to_string())
        .chain(metadata.iter().map(|c| quote(c.name())))
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .collect();
    format!(
        "INSERT INTO {table} ({columns}) SELECT {columns} FROM {staging} \
         ON CONFLICT (id) DO UPDATE SET {}",
        updates.join(", ")
    )
}

/// The statements that give a table (whose columns and types are `found`)
/// the metadata columns `wanted`: those missing are added, those of another
/// type made again, and those an earlier run made (`made`) that no run's
/// rows hold any more (`kept` are those other runs' rows hold) dropped. A
/// column embedjob did not make is never dropped: one of another type is
/// refused.
pub(crate) fn reconcile(
    table: &str,
    found: &BTreeMap<String, String>,
    wanted: &[PgColumn],
    made: &BTreeSet<String>,
    kept: &BTreeSet<String>,
) -> Result<Vec<String>, String> {
    let mut statements = Vec::new();
    for column in wanted {
        let name = quote(column.name());
        match found.get(column.name()) {
            Some(sql) if sql == column.sql() => {}
            Some(_) if made.contains(column.name()) => {
                statements.push(format!("ALTER TABLE {table} DROP COLUMN {name}"));
                statements.push(format!(
                    "ALTER TABLE {table} ADD COLUMN {name} {}",
                    column.sql()
                ));
            }
            Some(sql) => {
                return Err(format!(
                    "column {:?} is {sql}, not {} as `source.metadata_fields` writes it; \
                     rename or drop the column, or leave the field out",
                    column.name(),
                    column.sql()
                ))
            }
            None => statements.push(format!(
                "ALTER TABLE {table} ADD COLUMN {name} {}",
                column.sql()
            )),
        }
    }
    for gone in made {
        let still = wanted.iter().any(|c| c.name() == gone) || kept.contains(gone);
        if !still && !contract::is_standard_column(gone) && found.contains_key(gone) {
            statements.push(format!("ALTER TABLE {table} DROP COLUMN {}", quote(gone)));
        }
    }
    Ok(statements)
}

// ----------------------------------------------------------------- values

/// What PostgreSQL cannot store of a batch that passed the output's check
/// (a NUL character in text, an offset beyond `bigint`, a date beyond its
/// range); else its chunks' metadata values as the table takes them.
pub(crate) fn row_values(batch: &EmbeddedBatch) -> Result<Vec<Vec<PgValue>>, ShapeError> {
    let mut rows = Vec::with_capacity(batch.chunks.len());
    for chunk in &batch.chunks {
        let refuse = |message: String| ShapeError::Metadata {
            id: chunk.id.clone(),
            message,
        };
        let fields = [&chunk.id, &*chunk.doc_id, &*chunk.source, &chunk.text];
        if fields.iter().any(|f| f.contains('\0')) {
            return Err(refuse(
                "holds a NUL character, which PostgreSQL text cannot store".to_string(),
            ));
        }
        if i64::try_from(chunk.byte_end).is_err() {
            return Err(refuse(format!(
                "byte offset {} is out of range",
                chunk.byte_end
            )));
        }
        let values = match &chunk.metadata {
            Some(metadata) => metadata
                .schema
                .fields
                .iter()
                .zip(metadata.values.iter())
                .map(|(field, value)| {
                    to_pg(value, &field.data_type)
                        .map_err(|message| refuse(format!("column {:?}: {message}", field.column)))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        rows.push(values);
    }
    Ok(rows)
}

/// A metadata value in the form its column takes in PostgreSQL.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PgValue {
    Null,
    Bool(bool),
    Int2(i16),
    Int4(i32),
    Int8(i64),
    Numeric(u64),
    Float4(f32),
    Float8(f64),
    /// Days from 2000-01-01.
    Date(i32),
    /// Microseconds from 2000-01-01; with a time zone or without.
    Timestamp(i64, bool),
    Text(String),
}

/// `value`, of a column of Arrow type `data_type`, as its table column
/// holds it; `Err` says why it cannot.
pub(crate) fn to_pg(value: &MetaValue, data_type: &DataType) -> Result<PgValue, String> {
    let range = || format!("{value:?} is out of the range of a {data_type} column in PostgreSQL");
    let int = |value: &MetaValue| match value {
        MetaValue::Int(v) => Some(*v),
        MetaValue::UInt(v) => i64::try_from(*v).ok(),
        _ => None,
    };
    Ok(match (value, data_type) {
        (MetaValue::Null, _) => PgValue::Null,
        (MetaValue::Text(s), DataType::Utf8) => {
            if s.contains('\0') {
                return Err("holds a NUL character, which PostgreSQL text cannot store".into());
            }
            PgValue::Text(s.to_string())
        }
        (MetaValue::Bool(b), DataType::Boolean) => PgValue::Bool(*b),
        (MetaValue::UInt(v), DataType::UInt64) => PgValue::Numeric(*v),
        #[allow(clippy::cast_possible_truncation)]
        (MetaValue::Float(v), DataType::Float16 | DataType::Float32) => PgValue::Float4(*v as f32),
        (MetaValue::Float(v), DataType::Float64) => PgValue::Float8(*v),
        (v, DataType::Date32 | DataType::Date64) => {
            let v = int(v).ok_or_else(range)?;
            let days = if *data_type == DataType::Date64 {
                v.div_euclid(86_400_000)
            } else {
                v
            };
            let days = days
                .checked_sub(EPOCH_DAYS)
                .filter(|d| DATE_RANGE.contains(d));
            PgValue::Date(days.and_then(|d| i32::try_from(d).ok()).ok_or_else(range)?)
        }
        (v, DataType::Timestamp(unit, zone)) => {
            let v = int(v).ok_or_else(range)?;
            let micros = match unit {
                TimeUnit::Second => v.checked_mul(1_000_000),
                TimeUnit::Millisecond => v.checked_mul(1_000),
                TimeUnit::Microsecond => Some(v),
                TimeUnit::Nanosecond => Some(v.div_euclid(1_000)),
            };
            let micros = micros
                .and_then(|m| m.checked_sub(EPOCH_MICROS))
                .filter(|m| TIMESTAMP_RANGE.contains(m))
                .ok_or_else(range)?;
            PgValue::Timestamp(micros, zone.is_some())
        }
        (v, t) => match (int(v), metadata_sql(t)) {
            (Some(v), Some("smallint")) => PgValue::Int2(i16::try_from(v).map_err(|_| range())?),
            (Some(v), Some("integer")) => PgValue::Int4(i32::try_from(v).map_err(|_| range())?),
            (Some(v), Some("bigint")) => PgValue::Int8(v),
            _ => return Err(format!("{value:?} does not fit a {data_type} column")),
        },
    })
}

impl PgValue {
    /// The value as `query --json` shows it: as a Parquet output's
    /// [`contract::json_value`] shows the same value.
    pub fn to_json(&self) -> Value {
        let shown =
            |value: MetaValue, data_type: DataType| contract::json_value(&value, &data_type);
        match self {
            PgValue::Null => Value::Null,
            PgValue::Bool(b) => Value::Bool(*b),
            PgValue::Int2(v) => Value::from(*v),
            PgValue::Int4(v) => Value::from(*v),
            PgValue::Int8(v) => Value::from(*v),
            PgValue::Numeric(v) => Value::from(*v),
            PgValue::Float4(v) => shown(MetaValue::Float(f64::from(*v)), DataType::Float32),
            PgValue::Float8(v) => shown(MetaValue::Float(*v), DataType::Float64),
            PgValue::Date(days) => shown(
                MetaValue::Int(i64::from(*days) + EPOCH_DAYS),
                DataType::Date32,
            ),
            PgValue::Timestamp(micros, zone) => shown(
                MetaValue::Int(micros.saturating_add(EPOCH_MICROS)),
                DataType::Timestamp(TimeUnit::Microsecond, zone.then(|| "UTC".into())),
            ),
            PgValue::Text(s) => Value::String(s.clone()),
        }
    }
}

fn accepted(ty: &Type) -> bool {
    [
        Type::BOOL,
        Type::INT2,
        Type::INT4,
        Type::INT8,
        Type::NUMERIC,
        Type::FLOAT4,
        Type::FLOAT8,
        Type::DATE,
        Type::TIMESTAMP,
        Type::TIMESTAMPTZ,
        Type::TEXT,
    ]
    .contains(ty)
}

impl ToSql for PgValue {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match self {
            PgValue::Null => return Ok(IsNull::Yes),
            PgValue::Bool(b) => out.put_u8(u8::from(*b)),
            PgValue::Int2(v) => out.put_i16(*v),
            PgValue::Int4(v) | PgValue::Date(v) => out.put_i32(*v),
            PgValue::Int8(v) | PgValue::Timestamp(v, _) => out.put_i64(*v),
            PgValue::Numeric(v) => encode_numeric(*v, out),
            PgValue::Float4(v) => out.put_f32(*v),
            PgValue::Float8(v) => out.put_f64(*v),
            PgValue::Text(s) => out.put_slice(s.as_bytes()),
        }
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        accepted(ty)
    }

    to_sql_checked!();
}

impl<'a> FromSql<'a> for PgValue {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<PgValue, Box<dyn Error + Sync + Send>> {
        Ok(match *ty {
            Type::BOOL => PgValue::Bool(bool::from_sql(ty, raw)?),
            Type::INT2 => PgValue::Int2(i16::from_sql(ty, raw)?),
            Type::INT4 => PgValue::Int4(i32::from_sql(ty, raw)?),
            Type::INT8 => PgValue::Int8(i64::from_sql(ty, raw)?),
            Type::NUMERIC => PgValue::Numeric(decode_numeric(raw)?),
            Type::FLOAT4 => PgValue::Float4(f32::from_sql(ty, raw)?),
            Type::FLOAT8 => PgValue::Float8(f64::from_sql(ty, raw)?),
            Type::DATE => PgValue::Date(i32::from_sql(&Type::INT4, raw)?),
            Type::TIMESTAMP => PgValue::Timestamp(i64::from_sql(&Type::INT8, raw)?, false),
            Type::TIMESTAMPTZ => PgValue::Timestamp(i64::from_sql(&Type::INT8, raw)?, true),
            _ => PgValue::Text(String::from_sql(&Type::TEXT, raw)?),
        })
    }

    fn from_sql_null(_: &Type) -> Result<PgValue, Box<dyn Error + Sync + Send>> {
        Ok(PgValue::Null)
    }

    fn accepts(ty: &Type) -> bool {
        accepted(ty)
    }
}

/// A whole number in PostgreSQL's binary `numeric`: base-10000 digits,
/// most significant first, after the count, weight, sign and scale.
fn encode_numeric(value: u64, out: &mut BytesMut) {
    let mut digits = Vec::new();
    let mut rest = value;
    while rest > 0 {
        // Below 10000: fits.
        digits.push(i16::try_from(rest % 10_000).unwrap_or(0));
        rest /= 10_000;
    }
    let weight = i16::try_from(digits.len()).unwrap_or(1) - 1;
    digits.reverse();
    while digits.last() == Some(&0) {
        digits.pop();
    }
    out.put_i16(i16::try_from(digits.len()).unwrap_or(0));
    out.put_i16(weight.max(0));
    out.put_u16(0);
    out.put_u16(0);
    for digit in digits {
        out.put_i16(digit);
    }
}

/// A `numeric` that holds a whole number from 0 to `u64::MAX`.
fn decode_numeric(raw: &[u8]) -> Result<u64, Box<dyn Error + Sync + Send>> {
    let word = |i: usize| -> Result<i16, String> {
        raw.get(i * 2..i * 2 + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "numeric value cut short".to_string())
    };
    let (count, weight, sign) = (word(0)?, word(1)?, word(2)?);
    if sign != 0 {
        return Err("numeric value is negative or not a number".into());
    }
    let mut value: u64 = 0;
    for i in 0..usize::try_from(count).unwrap_or(0) {
        let digit = u64::try_from(word(4 + i)?).map_err(|_| "numeric digit out of range")?;
        if digit == 0 {
            continue;
        }
        let place = i64::from(weight) - i64::try_from(i).unwrap_or(i64::MAX);
        if place < 0 {
            if digit != 0 {
                return Err("numeric value is not a whole number".into());
            }
            continue;
        }
        let scale = 10_000u64
            .checked_pow(u32::try_from(place).unwrap_or(u32::MAX))
            .and_then(|s| s.checked_mul(digit))
            .ok_or("numeric value beyond uint64")?;
        value = value
            .checked_add(scale)
            .ok_or("numeric value beyond uint64")?;
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::types::MetadataField;

    fn column(name: &str, sql: &str) -> PgColumn {
        PgColumn(name.to_string(), sql.to_string())
    }

    fn extension() -> Extension {
        Extension {
            schema: "\"public\"".to_string(),
            version: "0.8.0".to_string(),
        }
    }

    fn schema(fields: &[(&str, DataType)]) -> MetadataSchema {
        MetadataSchema {
            fields: fields
                .iter()
                .map(|(column, data_type)| MetadataField {
                    field: (*column).to_string(),
                    column: (*column).to_string(),
                    data_type: data_type.clone(),
                })
                .collect(),
        }
    }

    #[test]
    fn every_type_a_metadata_column_takes_has_its_sql_type_and_back() {
        let utc = Some(Arc::from("UTC"));
        let cases = [
            (DataType::Utf8, "text", Type::TEXT),
            (DataType::Boolean, "boolean", Type::BOOL),
            (DataType::Int8, "smallint", Type::INT2),
            (DataType::UInt8, "smallint", Type::INT2),
            (DataType::Int16, "smallint", Type::INT2),
            (DataType::UInt16, "integer", Type::INT4),
            (DataType::Int32, "integer", Type::INT4),
            (DataType::UInt32, "bigint", Type::INT8),
            (DataType::Int64, "bigint", Type::INT8),
            (DataType::UInt64, "numeric(20,0)", Type::NUMERIC),
            (DataType::Float32, "real", Type::FLOAT4),
            (DataType::Float64, "double precision", Type::FLOAT8),
            (DataType::Date32, "date", Type::DATE),
            (DataType::Date64, "date", Type::DATE),
            (
                DataType::Timestamp(TimeUnit::Millisecond, None),
                "timestamp without time zone",
                Type::TIMESTAMP,
            ),
            (
                DataType::Timestamp(TimeUnit::Nanosecond, utc),
                "timestamp with time zone",
                Type::TIMESTAMPTZ,
            ),
        ];
        for (data_type, sql, pg) in cases {
            assert_eq!(metadata_sql(&data_type), Some(sql), "{data_type}");
            assert_eq!(pg_type(sql), Some(pg), "{sql}");
        }
        assert_eq!(metadata_sql(&DataType::Binary), None);
        assert_eq!(pg_type("vector"), None);
        // The standard columns keep the layout tables already have.
        let standard: Vec<&str> = COLUMNS
            .iter()
            .map(|c| standard_sql(c.column_type))
            .collect();
        assert_eq!(
            standard,
            [
                "text", "text", "bigint", "text", "bigint", "bigint", "text", "text", "bigint",
                "vector"
            ]
        );
    }

    #[test]
    fn a_column_a_table_cannot_name_or_hold_is_refused_by_name() {
        let long = "x".repeat(64);
        let error = metadata_columns(&schema(&[(&long, DataType::Utf8)])).unwrap_err();
        assert!(
            error.contains(&long) && error.contains("63 bytes"),
            "{error}"
        );
        let error = metadata_columns(&schema(&[("blob", DataType::Binary)])).unwrap_err();
        assert!(error.contains("\"blob\""), "{error}");
        let ok = metadata_columns(&schema(&[
            ("lang", DataType::Utf8),
            ("Year", DataType::Int32),
        ]));
        assert_eq!(
            ok.unwrap(),
            [column("lang", "text"), column("Year", "integer")]
        );
    }

    #[test]
    fn statements_list_the_standard_columns_then_the_metadata_quoted() {
        let metadata = [column("lang", "text"), column("Year \"x\"", "integer")];
        assert_eq!(
            column_list(&metadata),
            "id, doc_id, chunk_index, source, byte_start, byte_end, text, content_hash, \
             token_count, embedding, \"lang\", \"Year \"\"x\"\"\""
        );
        assert_eq!(
            create_table("\"t\"", &extension(), 3, false, &metadata),
            "CREATE TABLE IF NOT EXISTS \"t\" (id text PRIMARY KEY, doc_id text, chunk_index \
             bigint, source text, byte_start bigint, byte_end bigint, text text, content_hash \
             text, token_count bigint, embedding \"public\".vector(3) NOT NULL, \"lang\" text, \
             \"Year \"\"x\"\"\" integer)"
        );
        assert!(create_table("s", &extension(), 3, true, &[])
            .starts_with("CREATE TEMPORARY TABLE IF NOT EXISTS s (id text NOT NULL, "));
        let upsert = upsert("\"t\"", "pg_temp.s", &metadata[..1]);
        assert!(
            upsert.starts_with(
                "INSERT INTO \"t\" (id, doc_id, chunk_index, source, byte_start, byte_end, text, \
                 content_hash, token_count, embedding, \"lang\") SELECT id, "
            ),
            "{upsert}"
        );
        assert!(
            upsert.ends_with(
                "ON CONFLICT (id) DO UPDATE SET doc_id = EXCLUDED.doc_id, chunk_index = \
                 EXCLUDED.chunk_index, source = EXCLUDED.source, byte_start = \
                 EXCLUDED.byte_start, byte_end = EXCLUDED.byte_end, text = EXCLUDED.text, \
                 content_hash = EXCLUDED.content_hash, token_count = EXCLUDED.token_count, \
                 embedding = EXCLUDED.embedding, \"lang\" = EXCLUDED.\"lang\""
            ),
            "{upsert}"
        );
    }

    #[test]
    fn the_record_of_columns_reads_back_and_a_damaged_one_counts_as_none() {
        let columns = [column("lang", "text"), column("n", "bigint")];
        let stored = record(&columns);
        assert_eq!(stored, r#"[["lang","text"],["n","bigint"]]"#);
        assert_eq!(parse_record(Some(&stored)), columns);
        assert_eq!(parse_record(Some(&"{".to_string())), []);
        assert_eq!(parse_record(None), []);
    }

    #[test]
    fn reconciling_adds_remakes_and_drops_only_what_embedjob_made() {
        let found: BTreeMap<String, String> = [
            ("id", "text"),
            ("lang", "text"),
            ("year", "integer"),
            ("old", "text"),
            ("shared", "text"),
            ("users_own", "tsvector"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        let set = |names: &[&str]| -> BTreeSet<String> {
            names.iter().map(|n| (*n).to_string()).collect()
        };
        let wanted = [
            column("lang", "text"),
            column("year", "bigint"),
            column("new", "date"),
        ];
        let made = set(&["lang", "year", "old", "shared"]);
        let statements = reconcile("t", &found, &wanted, &made, &set(&["shared"])).unwrap();
        assert_eq!(
            statements,
            [
                "ALTER TABLE t DROP COLUMN \"year\"",
                "ALTER TABLE t ADD COLUMN \"year\" bigint",
                "ALTER TABLE t ADD COLUMN \"new\" date",
                "ALTER TABLE t DROP COLUMN \"old\"",
            ]
        );
        // Nothing to do when the table has the columns.
        let same = [column("lang", "text"), column("year", "integer")];
        assert!(
            reconcile("t", &found, &same, &set(&["lang", "year"]), &set(&[]))
                .unwrap()
                .is_empty()
        );
        // A column of the user's own, of another type, is refused, not dropped.
        let error =
            reconcile("t", &found, &[column("users_own", "text")], &made, &made).unwrap_err();
        assert!(
            error.contains("\"users_own\" is tsvector, not text"),
            "{error}"
        );
    }

    #[test]
    fn values_take_their_columns_binary_form_or_say_why_not() {
        let utc = Some(Arc::from("UTC"));
        let ok = |value: MetaValue, data_type: DataType| to_pg(&value, &data_type).unwrap();
        assert_eq!(ok(MetaValue::Null, DataType::Int32), PgValue::Null);
        assert_eq!(ok(MetaValue::Int(-3), DataType::Int8), PgValue::Int2(-3));
        assert_eq!(
            ok(MetaValue::UInt(65_535), DataType::UInt16),
            PgValue::Int4(65_535)
        );
        assert_eq!(
            ok(MetaValue::UInt(u64::from(u32::MAX)), DataType::UInt32),
            PgValue::Int8(i64::from(u32::MAX))
        );
        assert_eq!(
            ok(MetaValue::UInt(u64::MAX), DataType::UInt64),
            PgValue::Numeric(u64::MAX)
        );
        assert_eq!(
            ok(MetaValue::Float(0.5), DataType::Float32),
            PgValue::Float4(0.5)
        );
        // 2000-01-02, from days and from milliseconds since 1970.
        assert_eq!(
            ok(MetaValue::Int(10_958), DataType::Date32),
            PgValue::Date(1)
        );
        assert_eq!(
            ok(MetaValue::Int(10_958 * 86_400_000), DataType::Date64),
            PgValue::Date(1)
        );
        // 2000-01-01T00:00:01 in every unit.
        let second = 946_684_801_i64;
        for (unit, value) in [
            (TimeUnit::Second, second),
            (TimeUnit::Millisecond, second * 1_000),
            (TimeUnit::Microsecond, second * 1_000_000),
            (TimeUnit::Nanosecond, second * 1_000_000_000),
        ] {
            assert_eq!(
                ok(
                    MetaValue::Int(value),
                    DataType::Timestamp(unit, utc.clone())
                ),
                PgValue::Timestamp(1_000_000, true)
            );
        }
        let fails = |value: MetaValue, data_type: DataType| to_pg(&value, &data_type).unwrap_err();
        assert!(fails(MetaValue::Int(40_000), DataType::Int16).contains("out of the range"));
        assert!(fails(
            MetaValue::Int(i64::MAX),
            DataType::Timestamp(TimeUnit::Second, None)
        )
        .contains("out of the range"));
        assert!(fails(MetaValue::Int(i64::MAX), DataType::Date32).contains("out of the range"));
        assert!(fails(MetaValue::Text("a\0b".into()), DataType::Utf8).contains("NUL"));
        assert!(fails(MetaValue::Text("x".into()), DataType::Int64).contains("does not fit"));
    }

    #[test]
    fn a_batch_is_refused_for_what_postgresql_cannot_store_naming_the_chunk() {
        use crate::testing::batch;
        use crate::types::Metadata;
        let columns = Arc::new(schema(&[("n", DataType::Int16), ("lang", DataType::Utf8)]));
        let with = |n: i64, lang: &str| {
            let mut b = batch("a", 0, 2, 2);
            for chunk in &mut b.chunks {
                chunk.metadata = Some(Arc::new(Metadata {
                    schema: Arc::clone(&columns),
                    values: vec![MetaValue::Int(n), MetaValue::Text(lang.into())].into(),
                }));
            }
            b
        };
        assert_eq!(
            row_values(&with(5, "en")).unwrap(),
            vec![vec![PgValue::Int2(5), PgValue::Text("en".into())]; 2]
        );
        assert_eq!(
            row_values(&batch("a", 0, 2, 2)).unwrap(),
            vec![Vec::new(); 2]
        );
        let message = |b: &EmbeddedBatch| row_values(b).unwrap_err().to_string();
        assert!(message(&with(70_000, "en")).starts_with("chunk a#0: column \"n\": "));
        assert!(message(&with(1, "e\0n")).contains("column \"lang\": holds a NUL"));
        let mut nul = batch("a", 0, 2, 2);
        nul.chunks[1].text.push('\0');
        assert!(message(&nul).starts_with("chunk a#1: holds a NUL character"));
        let mut far = batch("a", 0, 1, 2);
        far.chunks[0].byte_end = u64::MAX;
        assert!(message(&far).contains("byte offset 18446744073709551615 is out of range"));
    }

    #[test]
    fn numerics_round_trip_every_width_of_uint64() {
        for value in [
            0,
            1,
            9_999,
            10_000,
            10_001,
            100_000_000,
            123_456_789,
            u64::MAX,
        ] {
            let mut out = BytesMut::new();
            encode_numeric(value, &mut out);
            assert_eq!(decode_numeric(&out).unwrap(), value, "{value}");
        }
        // 10000 is one digit of weight 1, the trailing zero group left out.
        let mut out = BytesMut::new();
        encode_numeric(10_000, &mut out);
        assert_eq!(&out[..], &[0, 1, 0, 1, 0, 0, 0, 0, 0, 1]);
        // Negative, fractional, too large or cut short: refused.
        assert!(decode_numeric(&[0, 1, 0, 0, 0x40, 0, 0, 0, 0, 5]).is_err());
        assert!(decode_numeric(&[0, 1, 0xff, 0xff, 0, 0, 0, 1, 0, 5]).is_err());
        assert!(decode_numeric(&[0, 1, 0, 5, 0, 0, 0, 0, 0, 99]).is_err());
        assert!(decode_numeric(&[0, 2, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn values_read_back_show_as_a_parquet_outputs_do() {
        let utc = Some(Arc::from("UTC"));
        let parquet =
            |value: MetaValue, data_type: DataType| contract::json_value(&value, &data_type);
        let cases = [
            (MetaValue::Float(0.1_f32.into()), DataType::Float32),
            (MetaValue::Float(2.5), DataType::Float64),
            (MetaValue::Int(19_000), DataType::Date32),
            (
                MetaValue::Int(1_700_000_000_123),
                DataType::Timestamp(TimeUnit::Millisecond, utc),
            ),
            (
                MetaValue::Int(1_700_000_000),
                DataType::Timestamp(TimeUnit::Second, None),
            ),
            (MetaValue::UInt(u64::MAX), DataType::UInt64),
            (MetaValue::Int(-7), DataType::Int16),
            (MetaValue::Bool(true), DataType::Boolean),
            (MetaValue::Text("en".into()), DataType::Utf8),
            (MetaValue::Null, DataType::Date32),
        ];
        for (value, data_type) in cases {
            let stored = to_pg(&value, &data_type).unwrap();
            assert_eq!(
                stored.to_json(),
                parquet(value, data_type.clone()),
                "{data_type}"
            );
        }
        assert_eq!(
            PgValue::Timestamp(1_000_123, true).to_json(),
            Value::String("2000-01-01T00:00:01.000123Z".into())
        );
        assert_eq!(
            PgValue::Date(0).to_json(),
            Value::String("2000-01-01".into())
        );
        assert_eq!(PgValue::Float4(0.1).to_json(), serde_json::json!(0.1));
    }
}
