//! One line of a batch run: its answer, by the synchronous route's own
//! code, written to the output file and billed, or its error written to
//! the error file.

use std::io::{self, Write};

use serde_json::{json, Value};

use crate::simulate::error::ApiError;
use crate::simulate::handlers::{answer_fault_free, Caller, Shared};

/// What became of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered and billed these tokens.
    Completed(u64),
    Failed,
}

/// The ids of a line in the output: its own and its request's.
fn ids(batch_id: &str, index: usize) -> (String, String) {
    let tail = batch_id.trim_start_matches("batch_");
    (
        format!("batch_req_{tail}_{index}"),
        format!("req_{tail}_{index}"),
    )
}

/// The `custom_id` and `body` of a line validation accepted.
fn parts(raw: &[u8]) -> (String, Vec<u8>) {
    let mut value: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let custom_id = value["custom_id"].as_str().unwrap_or_default().to_string();
    let body = serde_json::to_vec(&value["body"].take()).unwrap_or_default();
    (custom_id, body)
}

/// A line run, not yet written nor billed.
pub(crate) struct Ran {
    /// The line of the output file, or of the error file when `answer` is `None`.
    line: Vec<u8>,
    /// What the line bills: its tokens, and its texts read whole and in part.
    answer: Option<(u64, Vec<String>, Vec<String>)>,
}

/// Runs line `index` (its bytes `raw`): a 500 when `fail`, else the
/// synchronous route's answer or its refusal. Nothing is billed yet.
pub(crate) fn run_line(
    shared: &Shared,
    caller: Caller,
    batch_id: &str,
    index: usize,
    raw: &[u8],
    fail: bool,
) -> Ran {
    let (custom_id, body) = parts(raw);
    let (id, request_id) = ids(batch_id, index);
    let answered = if fail {
        Err(ApiError::internal())
    } else {
        answer_fault_free(shared, caller, &body)
    };
    match answered {
        Ok((answer, tokens)) => {
            // The body goes in as the bytes the synchronous route sends.
            let head = json!({"id": id, "custom_id": custom_id}).to_string();
            let mut line = Vec::with_capacity(answer.body.len() + head.len() + 128);
            line.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
            let padding = shared.config.batches.line_padding;
            if padding > 0 {
                // A field the client does not know, making the line as long as asked.
                line.extend_from_slice(br#","padding":""#);
                line.resize(line.len() + padding, b' ');
                line.push(b'"');
            }
            line.extend_from_slice(br#","response":{"status_code":200,"request_id":"#);
            line.extend_from_slice(Value::String(request_id).to_string().as_bytes());
            line.extend_from_slice(br#","body":"#);
            line.extend_from_slice(&answer.body);
            line.extend_from_slice(b"},\"error\":null}\n");
            Ran {
                line,
                answer: Some((tokens, answer.hashes, answer.partly_read)),
            }
        }
        Err(error) => {
            let line = json!({
                "id": id,
                "custom_id": custom_id,
                "response": {
                    "status_code": error.status.as_u16(),
                    "request_id": request_id,
                    "body": error.body_json(),
                },
                "error": null,
            });
            Ran {
                line: format!("{line}\n").into_bytes(),
                answer: None,
            }
        }
    }
}

/// Writes a line run to its file and bills it.
pub(crate) fn record(
    shared: &Shared,
    ran: Ran,
    output: &mut impl Write,
    errors: &mut impl Write,
) -> io::Result<Outcome> {
    match ran.answer {
        Some((tokens, hashes, partly_read)) => {
            output.write_all(&ran.line)?;
            shared.ledger().bill_batch_line(tokens, hashes, partly_read);
            Ok(Outcome::Completed(tokens))
        }
        None => {
            errors.write_all(&ran.line)?;
            shared.ledger().batch_lines_failed += 1;
            Ok(Outcome::Failed)
        }
    }
}

/// Writes line `index` as expired: not run, not billed.
pub(crate) fn expire_line(
    shared: &Shared,
    batch_id: &str,
    index: usize,
    raw: &[u8],
    errors: &mut impl Write,
) -> io::Result<()> {
    let (custom_id, _) = parts(raw);
    let (id, _) = ids(batch_id, index);
    let line = json!({
        "id": id,
        "custom_id": custom_id,
        "response": null,
        "error": {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        },
    });
    writeln!(errors, "{line}")?;
    shared.ledger().batch_lines_expired += 1;
    Ok(())
}
