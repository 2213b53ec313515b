//! The service's JSON shapes, as sent and as received.
//!
//! Responses are parsed leniently (unknown fields ignored, optional fields
//! optional) because the service's spec leaves shapes open; everything that
//! matters is checked afterwards by `validate`.

use serde::{Deserialize, Serialize};

use crate::types::Usage;

/// `input` of an embeddings request: one text or a list of texts.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum EmbeddingInput<'a> {
    One(&'a str),
    Many(Vec<&'a str>),
}

impl EmbeddingInput<'_> {
    pub fn len(&self) -> usize {
        match self {
            EmbeddingInput::One(_) => 1,
            EmbeddingInput::Many(texts) => texts.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Serialize)]
pub struct EmbeddingRequest<'a> {
    pub model: &'a str,
    pub input: EmbeddingInput<'a>,
    /// `"base64"` asks for little-endian `f32` arrays in base64; absent, the
    /// service's default (floats).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<&'a str>,
    /// The vector length asked for, for models that can shorten their vectors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<usize>,
}

impl<'a> EmbeddingRequest<'a> {
    /// A request with the service's defaults: floats, the model's own length.
    pub fn new(model: &'a str, input: EmbeddingInput<'a>) -> Self {
        EmbeddingRequest {
            model,
            input,
            encoding_format: None,
            dimensions: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingResponse {
    pub data: Vec<EmbeddingItem>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingItem {
    /// Kept signed so that a negative index is reported as such, not as a parse error.
    pub index: i64,
    /// Numbers (a `null`, `"NaN"` or `"Infinity"` read as the non-finite
    /// value it stands for), or one base64 string of little-endian `f32`s.
    #[serde(deserialize_with = "super::flat::vector")]
    pub embedding: Vec<f32>,
}

/// A model as the service describes it. Servers name the same facts
/// differently, so a listing entry is read leniently (see [`Model::from_json`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub struct Model {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    #[serde(default)]
    pub modalities: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pricing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_per_1k: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_per_1k: Option<f64>,
    /// The Batch API's price per 1000 input tokens, when listed
    /// (`pricing.batch_input_per_1k`, LiteLLM's `input_cost_per_token_batches`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_input_per_1k: Option<f64>,
}

/// Where servers put a model's context window, in the order they are trusted:
/// the service's own name, vLLM's, LiteLLM's, and others seen in listings.
const WINDOW_KEYS: [&str; 9] = [
    "context_window",
    "max_model_len",
    "max_input_tokens",
    "context_length",
    "max_context_length",
    "max_input_length",
    "max_seq_len",
    "max_sequence_length",
    "n_ctx_train",
];

/// Objects inside a model entry where some servers keep its details.
const DETAIL_KEYS: [&str; 4] = ["model_info", "meta", "info", "limits"];

impl TryFrom<serde_json::Value> for Model {
    type Error = String;

    fn try_from(value: serde_json::Value) -> Result<Self, Self::Error> {
        Model::from_json(&value)
            .ok_or_else(|| "a model must be an object with a string `id`".into())
    }
}

impl Model {
    /// Reads one model entry: its `id`, a context window under any of the
    /// names servers use (also inside `model_info`, `meta`, …), and the price
    /// per 1000 input tokens as `pricing.input_per_1k`, LiteLLM's
    /// `input_cost_per_token` or a per-token `pricing.prompt`.
    pub fn from_json(value: &serde_json::Value) -> Option<Model> {
        let object = value.as_object()?;
        let id = object.get("id")?.as_str()?.to_string();
        let places: Vec<&serde_json::Map<String, serde_json::Value>> = std::iter::once(object)
            .chain(
                DETAIL_KEYS
                    .iter()
                    .filter_map(|key| object.get(*key).and_then(serde_json::Value::as_object)),
            )
            .collect();
        let find = |key: &str| places.iter().find_map(|place| place.get(key));
        let context_window = WINDOW_KEYS
            .iter()
            .find_map(|key| find(key).and_then(positive_integer));
        let modalities = object
            .get("modalities")
            .and_then(serde_json::Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|m| m.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let pricing = object.get("pricing").and_then(serde_json::Value::as_object);
        let price = |per_1k: &str, per_token: &str, per_token_in_pricing: &str| {
            let per_1k = pricing.and_then(|p| p.get(per_1k)).and_then(amount);
            per_1k
                .or_else(|| find(per_token).and_then(amount).map(|p| p * 1000.0))
                .or_else(|| {
                    pricing
                        .and_then(|p| p.get(per_token_in_pricing))
                        .and_then(amount)
                        .map(|p| p * 1000.0)
                })
        };
        let input_per_1k = price("input_per_1k", "input_cost_per_token", "prompt");
        let output_per_1k = price("output_per_1k", "output_cost_per_token", "completion");
        let batch_input_per_1k = price(
            "batch_input_per_1k",
            "input_cost_per_token_batches",
            "input_cost_per_token_batches",
        );
        let pricing = (input_per_1k.is_some() || output_per_1k.is_some()).then_some(Pricing {
            input_per_1k,
            output_per_1k,
            batch_input_per_1k,
        });
        Some(Model {
            id,
            context_window,
            modalities,
            pricing,
        })
    }
}

/// A count written as a number or a numeric string.
fn positive_integer(value: &serde_json::Value) -> Option<u64> {
    match value {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|&n| n > 0)
}

/// A price written as a number or a numeric string; never negative or infinite.
fn amount(value: &serde_json::Value) -> Option<f64> {
    match value {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|p| p.is_finite() && *p >= 0.0)
}

/// `GET /v1/models`: entries without a string `id` are skipped rather than
/// failing the listing.
#[derive(Debug, Deserialize)]
pub(crate) struct ModelList {
    pub data: Vec<serde_json::Value>,
}

impl ModelList {
    pub(crate) fn models(&self) -> Vec<Model> {
        self.data.iter().filter_map(Model::from_json).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

/// A streamed chat request that asks for the usage in a last chunk.
#[derive(Debug, Serialize)]
pub(crate) struct StreamedChat<'a> {
    #[serde(flatten)]
    pub request: &'a ChatRequest,
    pub stream_options: StreamOptions,
}

#[derive(Debug, Serialize)]
pub(crate) struct StreamOptions {
    pub include_usage: bool,
}

impl<'a> StreamedChat<'a> {
    pub(crate) fn with_usage(request: &'a ChatRequest) -> Self {
        StreamedChat {
            request,
            stream_options: StreamOptions {
                include_usage: true,
            },
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatResponse {
    #[serde(default)]
    pub choices: Vec<ChatChoice>,
    #[serde(default, deserialize_with = "lenient_usage")]
    pub usage: Option<Usage>,
}

/// A reply's `usage`, when it reads as one: a server's odd usage object
/// (counts as `null`, say) costs the count, never the reply.
fn lenient_usage<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Usage>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatChoice {
    #[serde(default)]
    pub message: Option<ChatReplyMessage>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatReplyMessage {
    #[serde(default)]
    pub content: Option<String>,
}

/// One `data:` event of a chat stream.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatChunk {
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    /// Some services report a failure inside the stream instead of by status.
    #[serde(default)]
    pub error: Option<serde_json::Value>,
    /// The last chunk's, when asked for; `null` in the others.
    #[serde(default, deserialize_with = "lenient_usage")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChunkChoice {
    #[serde(default)]
    pub delta: Option<Delta>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Delta {
    #[serde(default)]
    pub content: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_batch_price_is_read_with_the_input_price() {
        let listed = serde_json::json!({
            "id": "m", "pricing": {"input_per_1k": 0.0002, "batch_input_per_1k": 0.0001}
        });
        let pricing = Model::from_json(&listed).unwrap().pricing.unwrap();
        assert_eq!(pricing.batch_input_per_1k, Some(0.0001));
        let litellm = serde_json::json!({
            "id": "m", "input_cost_per_token": 2e-7, "input_cost_per_token_batches": 1e-7
        });
        let pricing = Model::from_json(&litellm).unwrap().pricing.unwrap();
        assert!((pricing.batch_input_per_1k.unwrap() - 1e-4).abs() < 1e-15);
    }
}
