//! `source.metadata_fields`: input fields carried into the output as
//! columns of their own, with the types the input gives them.
//!
//! - Parquet columns keep their type: booleans, integers, floats, dates and
//!   timestamps (unit and time zone included) as they are; every string
//!   type, dictionaries included, as `utf8`; half floats as `float32`.
//! - CSV cells are strings; an empty cell is null.
//! - JSON fields, named by their key or by a dotted path into nested
//!   objects (`meta.lang`), are typed by the values the input holds: `bool`,
//!   `int64` (`uint64` above its range), `float64` when any is fractional,
//!   else `utf8`. Objects and arrays, and fields whose values disagree
//!   (a string here, a number there), are written as their JSON text.

use std::sync::Arc;

use arrow::datatypes::DataType;
use serde_json::{Map, Value};

use crate::contract::metadata_column;
pub(super) use crate::contract::{arrow_value, readable};
use crate::types::{MetaValue, Metadata, MetadataField, MetadataSchema};

/// A schema whose fields are `fields`, of the types `types`.
pub(super) fn schema(fields: &[String], types: Vec<DataType>) -> Arc<MetadataSchema> {
    Arc::new(MetadataSchema {
        fields: fields
            .iter()
            .zip(types)
            .map(|(field, data_type)| MetadataField {
                field: field.clone(),
                column: metadata_column(field),
                data_type,
            })
            .collect(),
    })
}

/// One record's metadata.
pub(super) fn record(schema: &Arc<MetadataSchema>, values: Vec<MetaValue>) -> Arc<Metadata> {
    Arc::new(Metadata {
        schema: Arc::clone(schema),
        values: values.into_boxed_slice(),
    })
}

// ------------------------------------------------------------------ JSON

/// The value of `field` in `object`: the key itself, or else a dotted path
/// through nested objects.
pub(super) fn lookup<'a>(object: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    if let Some(value) = object.get(field) {
        return Some(value);
    }
    let mut segments = field.split('.');
    let mut current = object.get(segments.next()?)?;
    for segment in segments {
        current = current.as_object()?.get(segment)?;
    }
    Some(current)
}

/// The kinds of JSON value a field held across the records seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Seen {
    boolean: bool,
    /// Integers within `i64`.
    int: bool,
    /// Integers above `i64::MAX`.
    big: bool,
    negative: bool,
    float: bool,
    string: bool,
    nested: bool,
}

impl Seen {
    pub(super) fn note(&mut self, value: Option<&Value>) {
        match value {
            None | Some(Value::Null) => {}
            Some(Value::Bool(_)) => self.boolean = true,
            Some(Value::Number(n)) => {
                if n.is_i64() {
                    self.int = true;
                    self.negative |= n.as_i64().is_some_and(|v| v < 0);
                } else if n.is_u64() {
                    self.big = true;
                } else {
                    self.float = true;
                }
            }
            Some(Value::String(_)) => self.string = true,
            Some(Value::Array(_) | Value::Object(_)) => self.nested = true,
        }
    }

    /// The column type for the values seen.
    pub(super) fn data_type(self) -> DataType {
        let number = self.int || self.big || self.float;
        let kinds = [self.boolean, number, self.string, self.nested]
            .iter()
            .filter(|k| **k)
            .count();
        if kinds != 1 {
            return DataType::Utf8;
        }
        if self.boolean {
            DataType::Boolean
        } else if self.float || (self.big && self.negative) {
            DataType::Float64
        } else if self.big {
            DataType::UInt64
        } else if self.int {
            DataType::Int64
        } else {
            DataType::Utf8
        }
    }
}

/// A JSON value as a value of a column of `data_type`; `Err` names what the
/// value is when the column cannot hold it.
pub(super) fn json_value(value: Option<&Value>, data_type: &DataType) -> Result<MetaValue, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(MetaValue::Null);
    };
    let found = || match value {
        Value::Bool(_) => "a boolean".to_string(),
        Value::Number(n) if n.is_f64() => "a fractional number".to_string(),
        Value::Number(_) => "an integer".to_string(),
        Value::String(_) => "a string".to_string(),
        _ => "an object or array".to_string(),
    };
    Ok(match (data_type, value) {
        (DataType::Utf8, Value::String(s)) => MetaValue::Text(s.as_str().into()),
        (DataType::Utf8, other) => MetaValue::Text(other.to_string().into()),
        (DataType::Boolean, Value::Bool(b)) => MetaValue::Bool(*b),
        (DataType::Int64, Value::Number(n)) if n.is_i64() => {
            MetaValue::Int(n.as_i64().ok_or_else(found)?)
        }
        (DataType::UInt64, Value::Number(n)) if n.is_u64() => {
            MetaValue::UInt(n.as_u64().ok_or_else(found)?)
        }
        (DataType::Float64, Value::Number(n)) => MetaValue::Float(n.as_f64().ok_or_else(found)?),
        _ => return Err(found()),
    })
}

/// How a column's type reads in messages.
pub(super) fn type_name(data_type: &DataType) -> &'static str {
    match data_type {
        DataType::Boolean => "a boolean",
        DataType::Int64 | DataType::UInt64 => "an integer",
        DataType::Float64 => "a float",
        _ => "a string",
    }
}

// ----------------------------------------------------------------- Arrow

/// The output type of an input column of `input`, or `None` when a
/// metadata column cannot carry it.
pub(super) fn output_type(input: &DataType) -> Option<DataType> {
    Some(match input {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Dictionary(_, values) => {
            return matches!(
                **values,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            )
            .then_some(DataType::Utf8)
        }
        DataType::Float16 => DataType::Float32,
        t if t.is_integer()
            || t.is_floating()
            || matches!(
                t,
                DataType::Boolean | DataType::Date32 | DataType::Date64 | DataType::Timestamp(_, _)
            ) =>
        {
            t.clone()
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::ArrayRef;

    use super::*;
    use serde_json::json;

    fn seen(values: &[Value]) -> DataType {
        let mut seen = Seen::default();
        for value in values {
            seen.note(Some(value));
        }
        seen.note(None);
        seen.data_type()
    }

    #[test]
    fn json_fields_are_typed_by_their_values() {
        assert_eq!(seen(&[json!(1), json!(-2)]), DataType::Int64);
        assert_eq!(seen(&[json!(1), json!(2.5)]), DataType::Float64);
        assert_eq!(seen(&[json!(u64::MAX)]), DataType::UInt64);
        assert_eq!(seen(&[json!(u64::MAX), json!(-1)]), DataType::Float64);
        assert_eq!(seen(&[json!(true), Value::Null]), DataType::Boolean);
        assert_eq!(seen(&[json!("en")]), DataType::Utf8);
        assert_eq!(seen(&[json!("5"), json!(5)]), DataType::Utf8);
        assert_eq!(seen(&[json!({"a": 1})]), DataType::Utf8);
        assert_eq!(seen(&[]), DataType::Utf8);
    }

    #[test]
    fn dotted_paths_reach_into_objects_and_plain_keys_win() {
        let object = json!({"meta": {"lang": "en", "n": {"deep": 3}}, "a.b": 1, "a": {"b": 2}});
        let object = object.as_object().unwrap();
        assert_eq!(lookup(object, "meta.lang"), Some(&json!("en")));
        assert_eq!(lookup(object, "meta.n.deep"), Some(&json!(3)));
        assert_eq!(lookup(object, "a.b"), Some(&json!(1)));
        assert_eq!(lookup(object, "meta.missing"), None);
        assert_eq!(lookup(object, "meta.lang.x"), None);
    }

    #[test]
    fn values_that_do_not_fit_their_column_say_what_they_are() {
        assert_eq!(
            json_value(Some(&json!(3)), &DataType::Int64),
            Ok(MetaValue::Int(3))
        );
        assert_eq!(
            json_value(Some(&json!(3)), &DataType::Float64),
            Ok(MetaValue::Float(3.0))
        );
        assert_eq!(
            json_value(Some(&json!([1, 2])), &DataType::Utf8),
            Ok(MetaValue::Text("[1,2]".into()))
        );
        assert_eq!(json_value(None, &DataType::Int64), Ok(MetaValue::Null));
        assert_eq!(
            json_value(Some(&json!(2.5)), &DataType::Int64),
            Err("a fractional number".to_string())
        );
        assert_eq!(
            json_value(Some(&json!("x")), &DataType::Boolean),
            Err("a string".to_string())
        );
    }

    #[test]
    fn every_supported_arrow_type_reads_back_its_values() {
        use arrow::array::{
            BooleanArray, Date32Array, Date64Array, DictionaryArray, Float32Array, Int16Array,
            LargeStringArray, TimestampMillisecondArray, UInt8Array,
        };
        use arrow::datatypes::Int8Type;
        let columns: Vec<(ArrayRef, MetaValue)> = vec![
            (
                Arc::new(BooleanArray::from(vec![Some(true), None])),
                MetaValue::Bool(true),
            ),
            (
                Arc::new(Int16Array::from(vec![Some(-7), None])),
                MetaValue::Int(-7),
            ),
            (
                Arc::new(UInt8Array::from(vec![Some(200), None])),
                MetaValue::UInt(200),
            ),
            (
                Arc::new(Float32Array::from(vec![Some(1.5), None])),
                MetaValue::Float(1.5),
            ),
            (
                arrow::compute::cast(
                    &(Arc::new(Float32Array::from(vec![Some(0.5), None])) as ArrayRef),
                    &DataType::Float16,
                )
                .unwrap(),
                MetaValue::Float(0.5),
            ),
            (
                Arc::new(Date32Array::from(vec![Some(19_000), None])),
                MetaValue::Int(19_000),
            ),
            (
                Arc::new(Date64Array::from(vec![Some(86_400_000), None])),
                MetaValue::Int(86_400_000),
            ),
            (
                Arc::new(
                    TimestampMillisecondArray::from(vec![Some(1_700_000_000_000), None])
                        .with_timezone("UTC"),
                ),
                MetaValue::Int(1_700_000_000_000),
            ),
            (
                Arc::new(LargeStringArray::from(vec![Some("x"), None])),
                MetaValue::Text("x".into()),
            ),
            (
                Arc::new(DictionaryArray::<Int8Type>::from_iter([Some("k"), None])),
                MetaValue::Text("k".into()),
            ),
        ];
        for (array, expected) in columns {
            let output = output_type(array.data_type()).unwrap();
            let read = readable(&array, &output).unwrap();
            assert_eq!(arrow_value(&read, 0), expected, "{}", array.data_type());
            assert_eq!(
                arrow_value(&read, 1),
                MetaValue::Null,
                "{}",
                array.data_type()
            );
        }
        assert_eq!(output_type(&DataType::Binary), None);
        assert_eq!(
            output_type(&DataType::List(Arc::new(arrow::datatypes::Field::new(
                "item",
                DataType::Int32,
                true
            )))),
            None
        );
    }
}
