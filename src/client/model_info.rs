//! LiteLLM's `GET /v1/model/info`: where its proxy serves the prices (and
//! windows) configured for its models, which its listing leaves out.
//!
//! The shape: `{"data": [{"model_name", "litellm_params": {…}, "model_info":
//! {"input_cost_per_token", "output_cost_per_token", "max_input_tokens",
//! "mode", …}}]}`, one entry per deployment, matched by `model_name`. Prices
//! are per token. A value that is not a sane one (negative, a string, more
//! than [`MAX_PRICE_PER_TOKEN`]) is left out with a warning; a body that is
//! not such JSON, or too long, leaves nothing learnt, with a warning. A server
//! without the route (most) says nothing.

use reqwest::Method;
use serde_json::{Map, Value};

use super::{body, Client};

/// The most a token may cost to be taken as a price: 1.0 a token (1000 per
/// 1000 tokens), thousands of times what any listed model costs, so only
/// a value that is no price at all (1e300, a misplaced total) is refused.
const MAX_PRICE_PER_TOKEN: f64 = 1.0;

/// What one entry of the model info gives.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Info {
    pub input_per_1k: Option<f64>,
    pub output_per_1k: Option<f64>,
    /// `input_cost_per_token_batches`: the Batch API's price.
    pub batch_input_per_1k: Option<f64>,
    pub context_window: Option<u64>,
    pub warnings: Vec<String>,
}

/// Asks `GET {api_path}/model/info` once (no retries: it is extra) for
/// what it says of `model`.
pub(super) async fn fetch(client: &Client, model: &str) -> Info {
    let endpoint = endpoint(client);
    let path = format!("{}/model/info", client.api_path());
    let response = match client.send(Method::GET, &path, None::<&()>, true).await {
        Ok(response) => response,
        // Most servers have no such route, or keep it to an admin key.
        Err(_) => return Info::default(),
    };
    let warning = |what: String| Info {
        warnings: vec![format!("{endpoint}: {what}; its prices were not read")],
        ..Info::default()
    };
    match body::read(response, body::OTHER_BODY_BYTES).await {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(value) => read(&value, model, &endpoint),
            Err(e) => warning(format!("the body is not JSON ({e})")),
        },
        Err(body::BodyError::TooLarge { limit }) => {
            warning(format!("the body is longer than {limit} bytes"))
        }
        Err(body::BodyError::Transport(_)) => Info::default(),
    }
}

/// The request [`fetch`] makes, as the price's source is named.
pub(super) fn endpoint(client: &Client) -> String {
    format!("GET {}/model/info", client.api_path())
}

/// Reads the entries named `model` of a model info body: the first price
/// and window found among them.
pub(super) fn read(value: &Value, model: &str, endpoint: &str) -> Info {
    let mut warnings = Vec::new();
    let mut warn = |what: String| warnings.push(format!("{endpoint}: model {model}: {what}"));
    let (mut input, mut output, mut context_window) = (None, None, None);
    let mut batch = None;
    let entries = value
        .get("data")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let named = entries
        .iter()
        .filter_map(Value::as_object)
        .filter(|entry| entry.get("model_name").and_then(Value::as_str) == Some(model));
    for entry in named {
        // Prices configured for the deployment: in `model_info`, else as
        // `litellm_params` gave them.
        let places: Vec<&Map<String, Value>> = ["model_info", "litellm_params"]
            .iter()
            .filter_map(|key| entry.get(*key).and_then(Value::as_object))
            .collect();
        let find = |key: &str| {
            places
                .iter()
                .find_map(|place| place.get(key).filter(|v| !v.is_null()))
        };
        if input.is_none() {
            input = find("input_cost_per_token")
                .and_then(|v| per_1k(v, "input_cost_per_token", &mut warn));
            if input.is_some() {
                output = find("output_cost_per_token")
                    .and_then(|v| per_1k(v, "output_cost_per_token", &mut warn));
                batch = find("input_cost_per_token_batches")
                    .and_then(|v| per_1k(v, "input_cost_per_token_batches", &mut warn));
            }
        }
        if context_window.is_none() {
            context_window = find("max_input_tokens").and_then(|v| window(v, &mut warn));
        }
    }
    Info {
        input_per_1k: input,
        output_per_1k: output,
        batch_input_per_1k: batch,
        context_window,
        warnings,
    }
}

/// A price per token as a price per 1000 tokens, if it is one.
fn per_1k(value: &Value, key: &str, warn: &mut impl FnMut(String)) -> Option<f64> {
    let price = value
        .as_f64()
        .filter(|p| p.is_finite() && (0.0..=MAX_PRICE_PER_TOKEN).contains(p));
    if price.is_none() {
        warn(format!(
            "`{key}` {} is not a price per token (a number from 0 to {MAX_PRICE_PER_TOKEN}); \
             it was left out",
            shown(value)
        ));
    }
    price.map(|p| p * 1000.0)
}

/// A context window, if it is a count of tokens.
fn window(value: &Value, warn: &mut impl FnMut(String)) -> Option<u64> {
    let tokens = value
        .as_u64()
        .filter(|&n| n > 0 && n <= u64::from(u32::MAX));
    if tokens.is_none() {
        warn(format!(
            "`max_input_tokens` {} is not a number of tokens; it was left out",
            shown(value)
        ));
    }
    tokens
}

/// A value as a warning may quote it: short.
fn shown(value: &Value) -> String {
    let mut text = value.to_string();
    crate::secret::truncate_chars(&mut text, 40);
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn entry(model_info: Value) -> Value {
        json!({"data": [
            {"model_name": "other", "model_info": {"input_cost_per_token": 5e-6}},
            {"model_name": "m", "litellm_params": {"model": "openai/m"}, "model_info": model_info},
        ]})
    }

    #[test]
    fn the_batch_price_is_read_beside_the_input_price() {
        let info = read(
            &entry(json!({
                "input_cost_per_token": 1e-7, "input_cost_per_token_batches": 5e-8
            })),
            "m",
            "GET /v1/model/info",
        );
        assert!((info.batch_input_per_1k.unwrap() - 5e-5).abs() < 1e-15);
        let none = read(&entry(json!({"input_cost_per_token": 1e-7})), "m", "x");
        assert_eq!(none.batch_input_per_1k, None);
    }

    #[test]
    fn prices_per_token_become_prices_per_1000_tokens() {
        let info = read(
            &entry(json!({
                "input_cost_per_token": 1e-7, "output_cost_per_token": 0.0,
                "max_input_tokens": 256, "max_tokens": 256, "mode": "embedding"
            })),
            "m",
            "GET /v1/model/info",
        );
        assert!(
            (info.input_per_1k.unwrap() - 1e-4).abs() < 1e-15,
            "{info:?}"
        );
        assert_eq!(info.output_per_1k, Some(0.0));
        assert_eq!(info.context_window, Some(256));
        assert!(info.warnings.is_empty(), "{info:?}");
    }

    #[test]
    fn a_price_in_litellm_params_counts_and_null_is_no_price() {
        let body = json!({"data": [{"model_name": "m",
            "litellm_params": {"input_cost_per_token": 2e-7},
            "model_info": {"input_cost_per_token": null, "max_input_tokens": null}}]});
        let info = read(&body, "m", "GET /model/info");
        assert!((info.input_per_1k.unwrap() - 2e-4).abs() < 1e-15);
        assert_eq!(info.context_window, None);
        assert!(info.warnings.is_empty(), "{info:?}");
    }

    #[test]
    fn hostile_values_are_left_out_with_a_warning() {
        for bad in [
            json!(-1e-7),
            json!("1e-7"),
            json!(1e300),
            json!(true),
            json!({"x": 1}),
        ] {
            let info = read(
                &entry(json!({"input_cost_per_token": bad, "max_input_tokens": bad})),
                "m",
                "GET /v1/model/info",
            );
            assert_eq!(info.input_per_1k, None, "{bad}");
            assert_eq!(info.context_window, None, "{bad}");
            assert_eq!(info.warnings.len(), 2, "{bad}: {info:?}");
            assert!(
                info.warnings[0].contains("input_cost_per_token"),
                "{info:?}"
            );
        }
        for shape in [
            json!([]),
            json!({"data": "x"}),
            json!({"data": [1, null, {"model_name": 3}]}),
        ] {
            assert_eq!(read(&shape, "m", "GET /v1/model/info"), Info::default());
        }
    }
}
