//! Validating a batch's input file, as OpenAI does before it runs any
//! line: every line a request to the batch's endpoint for one model, each
//! `custom_id` once, within the batch's limits.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde_json::{json, Map, Value};

use super::BatchConfig;
use crate::simulate::vectors::count_tokens;

/// Stops collecting errors after this many: the first ones tell the story.
const MAX_ERRORS: usize = 20;

/// One entry of a failed batch's `errors.data`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LineError {
    pub code: &'static str,
    pub message: String,
    /// The line, counted from 1.
    pub line: Option<u64>,
    pub param: Option<&'static str>,
}

impl LineError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        LineError {
            code,
            message: message.into(),
            line: None,
            param: None,
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "object": "error",
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "line": self.line,
        })
    }
}

/// Where a line of the input file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub offset: u64,
    pub len: u32,
}

/// A valid input file: its lines, its one model, and its size in tokens and inputs.
#[derive(Debug)]
pub(crate) struct Valid {
    pub lines: Vec<Span>,
    pub model: String,
    pub tokens: u64,
}

/// Reads the file a line at a time: its lines or every problem found (up to [`MAX_ERRORS`]).
pub(crate) fn validate(
    path: &Path,
    endpoint: &str,
    config: &BatchConfig,
) -> Result<Valid, Vec<LineError>> {
    let file = File::open(path).map_err(|error| {
        vec![LineError::new(
            "file_not_found",
            format!("The input file could not be read: {error}."),
        )]
    })?;
    let mut reader = BufReader::new(file);
    let mut errors = Vec::new();
    let mut spans = Vec::new();
    let mut ids = HashSet::new();
    let mut model: Option<String> = None;
    let (mut tokens, mut inputs) = (0u64, 0u64);
    let mut offset = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(n) => n,
            Err(error) => {
                errors.push(LineError::new(
                    "file_not_found",
                    format!("The input file could not be read: {error}."),
                ));
                break;
            }
        };
        let number = spans.len() as u64 + 1;
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        spans.push(Span {
            offset,
            len: u32::try_from(text.len()).unwrap_or(u32::MAX),
        });
        offset += read as u64;
        if spans.len() > config.max_lines {
            errors.push(LineError::new(
                "too_many_tasks",
                format!(
                    "The batch has more than {} requests; split it into smaller batches.",
                    config.max_lines
                ),
            ));
            return Err(errors);
        }
        let count = config.enqueued_tokens.is_some();
        match check_line(text, endpoint, &mut ids, &mut model, count) {
            Ok((n, t)) => {
                inputs += n;
                tokens += t;
            }
            Err(mut error) => {
                error.line = Some(number);
                errors.push(error);
                if errors.len() >= MAX_ERRORS {
                    break;
                }
            }
        }
    }
    if spans.is_empty() && errors.is_empty() {
        errors.push(LineError::new("empty_file", "The input file is empty."));
    }
    if inputs > config.max_inputs {
        errors.push(LineError::new(
            "too_many_tasks",
            format!(
                "The batch has {inputs} embedding inputs, more than the {} a batch may hold; \
                 split it into smaller batches.",
                config.max_inputs
            ),
        ));
    }
    match model {
        Some(model) if errors.is_empty() => Ok(Valid {
            lines: spans,
            model,
            tokens,
        }),
        _ => Err(errors),
    }
}

/// One line's problem, or its inputs and tokens.
fn check_line(
    text: &[u8],
    endpoint: &str,
    ids: &mut HashSet<String>,
    model: &mut Option<String>,
    count_tokens: bool,
) -> Result<(u64, u64), LineError> {
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(text) else {
        return Err(LineError::new(
            "invalid_json_line",
            "This line is not parseable as valid JSON.",
        ));
    };
    let string = |name: &'static str| match request.get(name) {
        Some(Value::String(value)) if !value.is_empty() => Ok(value.as_str()),
        _ => Err(LineError {
            param: Some(name),
            ..LineError::new(
                "missing_required_parameter",
                format!("The request is missing the string parameter '{name}'."),
            )
        }),
    };
    let custom_id = string("custom_id")?;
    if string("method")? != "POST" {
        return Err(LineError {
            param: Some("method"),
            ..LineError::new("invalid_method", "The request's method must be POST.")
        });
    }
    let url = string("url")?;
    if url != endpoint {
        return Err(LineError {
            param: Some("url"),
            ..LineError::new(
                "url_mismatch",
                format!("The URL provided for this request ({url}) does not match the batch endpoint {endpoint}."),
            )
        });
    }
    let Some(Value::Object(body)) = request.get("body") else {
        return Err(LineError {
            param: Some("body"),
            ..LineError::new(
                "missing_required_parameter",
                "The request is missing its 'body' object.",
            )
        });
    };
    let Some(Value::String(line_model)) = body.get("model") else {
        return Err(LineError {
            param: Some("body.model"),
            ..LineError::new(
                "missing_required_parameter",
                "The request body is missing 'model'.",
            )
        });
    };
    match model {
        Some(first) if first != line_model => {
            return Err(LineError {
                param: Some("body.model"),
                ..LineError::new(
                    "model_mismatch",
                    format!("The model of this request ({line_model}) differs from the batch's ({first}); a batch is for one model."),
                )
            })
        }
        Some(_) => {}
        None => *model = Some(line_model.clone()),
    }
    if !ids.insert(custom_id.to_string()) {
        return Err(LineError {
            param: Some("custom_id"),
            ..LineError::new(
                "duplicate_custom_id",
                format!("The custom_id '{custom_id}' appears more than once in the batch."),
            )
        });
    }
    Ok(size(body, count_tokens))
}

/// The inputs and cl100k tokens of a body's `input`, for the batch's limits
/// and the enqueued-token quota; whether it is valid is the line's to say.
/// Texts are counted only for a quota (`count`): tokenizing is most of the work.
fn size(body: &Map<String, Value>, count: bool) -> (u64, u64) {
    let ids = |items: &[Value]| items.len() as u64;
    let count_tokens = |text: &str| if count { count_tokens(text) } else { 0 };
    match body.get("input") {
        Some(Value::String(text)) => (1, u64::from(count_tokens(text))),
        Some(Value::Array(items)) if items.first().is_some_and(Value::is_number) => (1, ids(items)),
        Some(Value::Array(items)) => items.iter().fold((0, 0), |(n, t), item| match item {
            Value::String(text) => (n + 1, t + u64::from(count_tokens(text))),
            Value::Array(inner) => (n + 1, t + ids(inner)),
            _ => (n + 1, t),
        }),
        _ => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(content: &str, config: &BatchConfig) -> Result<Valid, Vec<LineError>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, content).unwrap();
        validate(&path, "/v1/embeddings", config)
    }

    fn line(id: &str, model: &str, input: &str) -> String {
        format!(
            "{}\n",
            json!({"custom_id": id, "method": "POST", "url": "/v1/embeddings",
                   "body": {"model": model, "input": [input, "two words"]}})
        )
    }

    #[test]
    fn a_valid_file_gives_its_lines_model_and_size() {
        let content = line("a", "m", "hello") + &line("b", "m", "x");
        let quota = BatchConfig {
            enqueued_tokens: Some(100),
            ..BatchConfig::default()
        };
        let valid = run(&content, &quota).unwrap();
        assert_eq!(valid.model, "m");
        // "hello" 1 + "two words" 2, then "x" 1 + 2.
        assert_eq!(valid.tokens, 6);
        assert_eq!(valid.lines.len(), 2);
        assert_eq!(valid.lines[1].offset, line("a", "m", "hello").len() as u64);
    }

    #[test]
    fn each_problem_names_its_line_and_code() {
        let content = line("a", "m", "x")
            + "{not json\n"
            + &line("a", "m", "y")
            + &line("c", "other", "z")
            + &line("d", "m", "w").replace("/v1/embeddings", "/v1/chat/completions");
        let errors = run(&content, &BatchConfig::default()).unwrap_err();
        let got: Vec<(&str, Option<u64>)> = errors.iter().map(|e| (e.code, e.line)).collect();
        assert_eq!(
            got,
            [
                ("invalid_json_line", Some(2)),
                ("duplicate_custom_id", Some(3)),
                ("model_mismatch", Some(4)),
                ("url_mismatch", Some(5)),
            ]
        );
        let empty = run("", &BatchConfig::default()).unwrap_err();
        assert_eq!(empty[0].code, "empty_file");
    }

    #[test]
    fn limits_on_lines_and_inputs_fail_the_batch() {
        let content = line("a", "m", "x") + &line("b", "m", "y");
        let lines = BatchConfig {
            max_lines: 1,
            ..BatchConfig::default()
        };
        assert_eq!(run(&content, &lines).unwrap_err()[0].code, "too_many_tasks");
        // Two lines of two inputs each: four inputs, one more than allowed.
        let inputs = BatchConfig {
            max_inputs: 3,
            ..BatchConfig::default()
        };
        let errors = run(&content, &inputs).unwrap_err();
        assert_eq!(errors[0].code, "too_many_tasks");
        assert!(run(
            &content,
            &BatchConfig {
                max_inputs: 4,
                ..BatchConfig::default()
            }
        )
        .is_ok());
    }
}
