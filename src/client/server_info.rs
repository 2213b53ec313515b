//! TEI's `GET /info`: what a text-embeddings-inference server says of the
//! one model it serves, having no model routes.
//!
//! The shape: `{"model_id", "max_input_length", "max_client_batch_size",
//! "max_batch_tokens", "auto_truncate", "version", …}` at the server's root,
//! whatever the API path. `max_input_length` is the model's window, in its
//! own tokens; `max_client_batch_size` (32 by default) the most inputs a
//! request may hold, more getting a 422; `max_concurrent_requests` (512 by
//! default) the most requests it takes at once, more getting a 429 ("Model
//! is overloaded"); `max_batch_tokens` (16,384 by default) the most tokens
//! of a batch TEI computes, an input never split between two: a window
//! longer than it is cut to it. A body without the first two is not TEI's
//! and says nothing; a value that is no count is left out with a warning.
//! TEI embeds with its own model whatever a request names, so a
//! `model_id` other than the job's is warned about.

use reqwest::Method;
use serde_json::Value;

use super::{body, Client};

/// The request [`fetch`] makes.
const ENDPOINT: &str = "GET /info";

/// What TEI's `/info` says.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ServerInfo {
    /// The model's window, in its own tokens (`max_input_length`, or
    /// `max_batch_tokens` where that is less).
    pub context_window: Option<u64>,
    /// The most inputs a request may hold (`max_client_batch_size`).
    pub max_inputs: Option<usize>,
    /// The most requests the server takes at once (`max_concurrent_requests`).
    pub max_in_flight: Option<usize>,
    pub warnings: Vec<String>,
}

impl ServerInfo {
    /// Whether the body told anything.
    pub fn is_empty(&self) -> bool {
        self.context_window.is_none() && self.max_inputs.is_none()
    }
}

/// Asks `GET /info` once (no retries: it is extra) for what it says of the
/// model the job names.
pub(super) async fn fetch(client: &Client, model: &str) -> ServerInfo {
    let Ok(response) = client.send(Method::GET, "/info", None::<&()>, true).await else {
        // Most servers have no such route.
        return ServerInfo::default();
    };
    match body::read(response, body::OTHER_BODY_BYTES).await {
        Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
            .map(|value| read(&value, model))
            .unwrap_or_default(),
        Err(_) => ServerInfo::default(),
    }
}

/// Reads TEI's `/info` body, as the module's documentation says.
pub(super) fn read(value: &Value, model: &str) -> ServerInfo {
    let Some(object) = value.as_object() else {
        return ServerInfo::default();
    };
    if !["max_input_length", "max_client_batch_size"]
        .iter()
        .any(|key| object.contains_key(*key))
    {
        return ServerInfo::default();
    }
    let mut warnings = Vec::new();
    let mut count = |key: &str| {
        let value = object.get(key).filter(|v| !v.is_null())?;
        let n = value
            .as_u64()
            .filter(|&n| n > 0 && n <= u64::from(u32::MAX));
        if n.is_none() {
            let mut shown = value.to_string();
            crate::secret::truncate_chars(&mut shown, 40);
            warnings.push(format!(
                "{ENDPOINT}: `{key}` {shown} is not a count (a whole number from 1 to {}); \
                 it was left out",
                u32::MAX
            ));
        }
        n
    };
    let max_inputs = count("max_client_batch_size").and_then(|n| usize::try_from(n).ok());
    let max_in_flight = count("max_concurrent_requests").and_then(|n| usize::try_from(n).ok());
    let mut context_window = count("max_input_length");
    let batch = count("max_batch_tokens");
    // TEI computes an input within one batch of its own: one longer than
    // `max_batch_tokens` is never answered by a build without the fix of
    // its issue 723 (one with it does not start so, or lowers
    // `max_input_length` to the batch with `--auto-truncate`).
    if let Some(batch) = batch {
        if context_window.is_none_or(|window| batch < window) {
            if let Some(window) = context_window {
                warnings.push(format!(
                    "{ENDPOINT}: `max_batch_tokens` ({batch}) is less than `max_input_length` \
                     ({window}), and TEI computes an input within one batch: inputs are kept \
                     within {batch} tokens"
                ));
            }
            context_window = Some(batch);
        }
    }
    if let Some(served) = object.get("model_id").and_then(Value::as_str) {
        if !names_the_same(served, model) {
            let mut served = served.to_string();
            crate::secret::truncate_chars(&mut served, 200);
            warnings.push(format!(
                "{ENDPOINT}: the server embeds with {served:?}, whatever a request names, \
                 and the job names {model:?} (`backend.model`): the output is labelled \
                 {model:?}"
            ));
        }
    }
    ServerInfo {
        context_window,
        max_inputs,
        max_in_flight,
        warnings,
    }
}

/// Whether TEI's `model_id` (a Hugging Face id, `org/name`, or a path) is
/// the model the job names: the same, or the same after the last `/`.
fn names_the_same(served: &str, named: &str) -> bool {
    let tail = |id: &str| {
        id.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string()
    };
    served == named || tail(served).eq_ignore_ascii_case(&tail(named))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// TEI 1.5's answer for a BGE model served with its defaults.
    fn tei(model_id: &str) -> Value {
        json!({
            "model_id": model_id,
            "model_sha": null,
            "model_dtype": "float32",
            "model_type": {"embedding": {"pooling": "cls"}},
            "max_concurrent_requests": 512,
            "max_input_length": 512,
            "max_batch_tokens": 16384,
            "max_batch_requests": null,
            "max_client_batch_size": 32,
            "auto_truncate": false,
            "tokenization_workers": 2,
            "version": "1.5.0",
            "sha": null,
            "docker_label": null
        })
    }

    #[test]
    fn teis_info_gives_the_window_and_the_most_inputs_a_request() {
        let info = read(&tei("BAAI/bge-small-en-v1.5"), "BAAI/bge-small-en-v1.5");
        assert_eq!(
            info,
            ServerInfo {
                context_window: Some(512),
                max_inputs: Some(32),
                max_in_flight: Some(512),
                warnings: Vec::new(),
            }
        );
        // The model's name without its organisation is the same model.
        assert!(read(&tei("BAAI/bge-small-en-v1.5"), "bge-small-en-v1.5")
            .warnings
            .is_empty());
    }

    #[test]
    fn a_batch_of_fewer_tokens_than_the_window_is_the_window() {
        // Served with `--max-batch-tokens 1000` (TEI's issue 723): an input
        // of more than 1,000 tokens was never answered.
        let mut body = tei("Qwen/Qwen3-Embedding-0.6B");
        body["max_input_length"] = json!(32768);
        body["max_batch_tokens"] = json!(1000);
        let info = read(&body, "Qwen/Qwen3-Embedding-0.6B");
        assert_eq!(info.context_window, Some(1000));
        assert_eq!(info.warnings.len(), 1, "{info:?}");
        assert!(
            info.warnings[0].contains("`max_batch_tokens` (1000)")
                && info.warnings[0].contains("`max_input_length` (32768)"),
            "{info:?}"
        );
        // Without a window, the batch is the window, and nothing is said.
        body["max_input_length"] = Value::Null;
        let info = read(&body, "Qwen/Qwen3-Embedding-0.6B");
        assert_eq!((info.context_window, info.warnings.len()), (Some(1000), 0));
        // A batch larger than the window changes nothing.
        let info = read(&tei("BAAI/bge-small-en-v1.5"), "BAAI/bge-small-en-v1.5");
        assert_eq!(info.context_window, Some(512));
    }

    #[test]
    fn another_model_served_is_warned_about() {
        let info = read(&tei("BAAI/bge-large-en-v1.5"), "bge-small-en-v1.5");
        assert_eq!(info.context_window, Some(512));
        assert_eq!(info.warnings.len(), 1, "{info:?}");
        assert!(
            info.warnings[0].contains("\"BAAI/bge-large-en-v1.5\"")
                && info.warnings[0].contains("`backend.model`"),
            "{info:?}"
        );
    }

    #[test]
    fn a_body_that_is_not_teis_says_nothing_and_a_wrong_count_is_left_out() {
        for other in [
            json!({"version": "0.0.1", "status": "ok"}),
            json!(["max_input_length", 512]),
            json!("max_client_batch_size"),
        ] {
            assert_eq!(read(&other, "m"), ServerInfo::default(), "{other}");
        }
        for wrong in [
            json!(0),
            json!(-3),
            json!(2.5),
            json!("32"),
            json!(1u64 << 40),
        ] {
            let info = read(
                &json!({
                    "max_client_batch_size": wrong,
                    "max_input_length": null,
                    "max_concurrent_requests": wrong,
                }),
                "m",
            );
            assert_eq!(info.max_inputs, None, "{wrong}");
            assert_eq!(info.context_window, None, "{wrong}");
            assert_eq!(info.max_in_flight, None, "{wrong}");
            assert!(
                info.warnings.len() == 2
                    && info.warnings[0].contains("`max_client_batch_size`")
                    && info.warnings[1].contains("`max_concurrent_requests`")
                    && info.warnings.iter().all(|w| w.starts_with(ENDPOINT)),
                "{wrong}: {info:?}"
            );
            assert!(info.is_empty());
        }
    }
}
