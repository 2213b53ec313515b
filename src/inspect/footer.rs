//! A file's footer: its `embedjob.*` keys, and its columns against the
//! output's schema.

use std::collections::BTreeMap;

use arrow::datatypes::{DataType, Schema};

use super::{Check, FileReport};
use crate::contract::{
    output_schema, BACKEND_KEY, COST_KEY, DIMENSIONS_KEY, INPUT_KEY, JOB_KEY, MODEL_KEY,
    PROMPT_TOKENS_KEY, REQUESTS_KEY, SCHEMA_VERSION, SCHEMA_VERSION_KEY, SHARD_KEY,
    TOTAL_TOKENS_KEY, VERSION_KEY,
};
use crate::validate::known_model_dimensions;

/// Reads the `embedjob.*` keys; each one missing or malformed is a problem.
pub(super) fn read_metadata(report: &mut FileReport, kv: &BTreeMap<String, String>) {
    let mut missing = Vec::new();
    let mut text = |key: &str| {
        let value = kv.get(key).cloned();
        if value.is_none() {
            missing.push(key.to_string());
        }
        value
    };
    report.schema_version = text(SCHEMA_VERSION_KEY);
    report.written_by = text(VERSION_KEY);
    report.model = text(MODEL_KEY);
    report.backend = text(BACKEND_KEY);
    report.job = kv.get(JOB_KEY).cloned();
    report.input = kv.get(INPUT_KEY).cloned();
    if let Some(shard) = kv.get(SHARD_KEY) {
        match crate::job::shard::parse(shard, |_| None) {
            Ok(shard) => report.shard = Some(shard),
            Err(_) => report.problem(
                Check::Metadata,
                None,
                None,
                format!("{SHARD_KEY} is {shard:?}, not a shard such as 1/4"),
            ),
        }
    }
    let dimensions = text(DIMENSIONS_KEY);
    let prompt_tokens = text(PROMPT_TOKENS_KEY);
    let total_tokens = text(TOTAL_TOKENS_KEY);
    let requests = text(REQUESTS_KEY);
    if !missing.is_empty() {
        let message = format!("missing metadata keys: {}", missing.join(", "));
        report.problem(Check::Metadata, None, None, message);
    }
    let mut number = |key: &str, value: Option<String>| -> Option<u64> {
        let value = value?;
        match value.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                let message = format!("{key} is {value:?}, not a whole number");
                report.problem(Check::Metadata, None, None, message);
                None
            }
        }
    };
    let dimensions = number(DIMENSIONS_KEY, dimensions);
    let prompt_tokens = number(PROMPT_TOKENS_KEY, prompt_tokens);
    let total_tokens = number(TOTAL_TOKENS_KEY, total_tokens);
    let requests = number(REQUESTS_KEY, requests);
    report.dimensions = dimensions.and_then(|d| usize::try_from(d).ok());
    report.prompt_tokens = prompt_tokens;
    report.total_tokens = total_tokens;
    report.requests = requests;
    if let Some(cost) = kv.get(COST_KEY) {
        match cost.trim().parse::<f64>() {
            Ok(c) if c.is_finite() && c >= 0.0 => report.cost = Some(c),
            _ => report.problem(
                Check::Metadata,
                None,
                None,
                format!("{COST_KEY} is {cost:?}, not an amount"),
            ),
        }
    }
    report.batch_input_per_1k = kv
        .get(crate::contract::BATCH_PRICE_KEY)
        .and_then(|p| p.trim().parse::<f64>().ok())
        .filter(|p| p.is_finite() && *p >= 0.0);
    if let Some(version) = report.schema_version.clone() {
        if version != SCHEMA_VERSION {
            report.problem(
                Check::Metadata,
                None,
                None,
                format!(
                    "{SCHEMA_VERSION_KEY} is {version:?}; this version of embedjob checks {SCHEMA_VERSION:?}"
                ),
            );
        }
    }
}

/// Checks the columns against the output schema; returns the vector length
/// rows are checked against, or `None` when the vectors cannot be checked.
pub(super) fn check_schema(report: &mut FileReport, schema: &Schema) -> Option<usize> {
    report.include_text = schema.index_of("text").is_ok();
    let embedding = schema.field_with_name("embedding").ok();
    let length = match embedding.map(|f| f.data_type()) {
        Some(DataType::FixedSizeList(item, n)) if item.data_type() == &DataType::Float32 => {
            usize::try_from(*n).ok()
        }
        Some(other) => {
            report.problem(
                Check::Schema,
                None,
                None,
                format!("column \"embedding\" is {other}, not FixedSizeList<Float32>"),
            );
            None
        }
        None => {
            report.problem(
                Check::Schema,
                None,
                None,
                "no column \"embedding\"".to_string(),
            );
            None
        }
    };
    let expected = output_schema(length.unwrap_or(1), report.include_text);
    report.metadata_columns = schema
        .fields()
        .iter()
        .filter(|f| expected.field_with_name(f.name()).is_err())
        .map(|f| format!("{} ({})", f.name(), f.data_type()))
        .collect();
    for field in expected.fields() {
        if field.name() == "embedding" {
            continue;
        }
        match schema.field_with_name(field.name()) {
            Ok(found) if found.data_type() == field.data_type() => {}
            Ok(found) => report.problem(
                Check::Schema,
                None,
                None,
                format!(
                    "column {:?} is {}, not {}",
                    field.name(),
                    found.data_type(),
                    field.data_type()
                ),
            ),
            Err(_) => report.problem(
                Check::Schema,
                None,
                None,
                format!("no column {:?}", field.name()),
            ),
        }
    }
    if let (Some(length), Some(declared)) = (length, report.dimensions) {
        if length != declared {
            report.problem(
                Check::Dimensions,
                None,
                None,
                format!(
                    "{DIMENSIONS_KEY} is {declared} but the embedding column holds {length}-dimensional vectors"
                ),
            );
        }
    }
    if let (Some(length), Some(model)) = (length, report.model.clone()) {
        if let Some(known) = known_model_dimensions(&model) {
            if known != length {
                report.problem(
                    Check::Dimensions,
                    None,
                    None,
                    format!(
                        "model {model} makes {known}-dimensional vectors, the file holds {length}"
                    ),
                );
            }
        }
    }
    length
}
