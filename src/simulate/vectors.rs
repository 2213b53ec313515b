//! Deterministic vectors, token counts, and the embeddings response body.

use sha2::{Digest, Sha256};

/// The vector the simulator returns for `text` from a model with `dimensions` values.
///
/// Values come from a splitmix64 generator seeded with the first 8 bytes of
/// SHA-256(`text`) (little-endian), drawn uniform in [-1, 1), L2-normalised, then
/// rounded to a multiple of 2^-16. The rounding makes every value exactly
/// representable, so its shortest decimal text parses back, even through an
/// `f64`, to the identical `f32`: a client can compare vectors bit for bit.
pub fn embedding_vector(dimensions: usize, text: &str) -> Vec<f32> {
    vector_from_digest(dimensions, &text_digest(text))
}

/// cl100k_base token count of `text`, special-token text counted as ordinary text.
/// The tokenizer is loaded once and shared.
pub fn count_tokens(text: &str) -> u32 {
    let tokens = tiktoken_rs::cl100k_base_singleton()
        .encode_ordinary(text)
        .len();
    u32::try_from(tokens).unwrap_or(u32::MAX)
}

pub(crate) fn text_digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// The vector for `text` from a model of `model_dimensions` values asked for
/// `dimensions` of them: the model's vector cut to that length,
/// L2-normalised again and rounded as [`embedding_vector`] rounds, as
/// Matryoshka models shorten their vectors.
pub fn embedding_vector_shortened(
    model_dimensions: usize,
    dimensions: usize,
    text: &str,
) -> Vec<f32> {
    shortened_from_digest(model_dimensions, dimensions, &text_digest(text))
}

pub(crate) fn shortened_from_digest(
    model_dimensions: usize,
    dimensions: usize,
    digest: &[u8; 32],
) -> Vec<f32> {
    let full = vector_from_digest(model_dimensions, digest);
    if dimensions >= full.len() {
        return full;
    }
    let head = &full[..dimensions];
    let norm = head
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    #[allow(clippy::cast_possible_truncation)]
    head.iter()
        .map(|&v| {
            let v = if norm > 0.0 { f64::from(v) / norm } else { 0.0 };
            ((v * 65536.0).round() / 65536.0) as f32
        })
        .collect()
}

pub(crate) fn vector_from_digest(dimensions: usize, digest: &[u8; 32]) -> Vec<f32> {
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&digest[..8]);
    let mut state = u64::from_le_bytes(seed);
    let mut values: Vec<f64> = (0..dimensions)
        .map(|_| {
            // 53 random bits give a uniform f64 in [0, 1).
            #[allow(clippy::cast_precision_loss)]
            let unit = (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
            unit * 2.0 - 1.0
        })
        .collect();
    let norm = values.iter().map(|v| v * v).sum::<f64>().sqrt();
    if norm > 0.0 {
        for v in &mut values {
            *v /= norm;
        }
    }
    #[allow(clippy::cast_possible_truncation)]
    values
        .into_iter()
        .map(|v| ((v * 65536.0).round() / 65536.0) as f32)
        .collect()
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How one item of an embeddings response is damaged, for the invalid-response faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Damage {
    None,
    /// The vector is written one element short.
    Short,
    /// The value at this position is written as the bare token `NaN`.
    Nan(usize),
}

/// One item of an embeddings response, in the order it is written.
pub(crate) struct Item {
    pub index: usize,
    pub digest: [u8; 32],
    pub damage: Damage,
}

/// The body the simulator sends for a fault-free embeddings request of
/// `texts` to a model of `dimensions` values: the same bytes, so that a
/// program can decode real response bodies without a server.
pub fn embeddings_response_body(model: &str, dimensions: usize, texts: &[&str]) -> Vec<u8> {
    let items: Vec<Item> = texts
        .iter()
        .enumerate()
        .map(|(index, text)| Item {
            index,
            digest: text_digest(text),
            damage: Damage::None,
        })
        .collect();
    let tokens = texts.iter().map(|text| u64::from(count_tokens(text))).sum();
    let shape = Shape {
        model,
        model_dimensions: dimensions,
        dimensions,
        base64: false,
    };
    embeddings_body(&shape, &items, tokens)
}

/// The same body with its vectors in base64, as a service sends them for
/// `encoding_format: "base64"`.
pub fn embeddings_response_body_base64(model: &str, dimensions: usize, texts: &[&str]) -> Vec<u8> {
    let items: Vec<Item> = texts
        .iter()
        .enumerate()
        .map(|(index, text)| Item {
            index,
            digest: text_digest(text),
            damage: Damage::None,
        })
        .collect();
    let tokens = texts.iter().map(|text| u64::from(count_tokens(text))).sum();
    let shape = Shape {
        model,
        model_dimensions: dimensions,
        dimensions,
        base64: true,
    };
    embeddings_body(&shape, &items, tokens)
}

/// How the vectors of an answer are made and written.
pub(crate) struct Shape<'a> {
    pub model: &'a str,
    /// The model's own vector length.
    pub model_dimensions: usize,
    /// The length sent: the model's, or shorter when asked for.
    pub dimensions: usize,
    /// Little-endian `f32`s in base64 rather than JSON numbers.
    pub base64: bool,
}

/// Writes an embeddings response body straight into bytes, without building a
/// JSON tree: this is the simulator's hot path.
pub(crate) fn embeddings_body(shape: &Shape<'_>, items: &[Item], prompt_tokens: u64) -> Vec<u8> {
    // About 12 bytes per value ("-0.012345678,") plus the item's framing.
    let per_value = if shape.base64 { 6 } else { 12 };
    let mut body = Vec::with_capacity(128 + items.len() * (64 + shape.dimensions * per_value));
    body.extend_from_slice(br#"{"object":"list","data":["#);
    for (position, item) in items.iter().enumerate() {
        if position > 0 {
            body.push(b',');
        }
        body.extend_from_slice(br#"{"object":"embedding","index":"#);
        body.extend_from_slice(item.index.to_string().as_bytes());
        body.extend_from_slice(br#","embedding":"#);
        let mut vector = if shape.dimensions == shape.model_dimensions {
            vector_from_digest(shape.dimensions, &item.digest)
        } else {
            shortened_from_digest(shape.model_dimensions, shape.dimensions, &item.digest)
        };
        let nan_at = match item.damage {
            Damage::None => None,
            Damage::Short => {
                vector.pop();
                None
            }
            Damage::Nan(at) => Some(at),
        };
        if shape.base64 {
            write_base64(&mut body, &vector, nan_at);
        } else {
            write_values(&mut body, &vector, nan_at);
        }
        body.push(b'}');
    }
    body.extend_from_slice(br#"],"model":"#);
    write_json(&mut body, shape.model);
    body.extend_from_slice(br#","usage":{"prompt_tokens":"#);
    body.extend_from_slice(prompt_tokens.to_string().as_bytes());
    body.extend_from_slice(br#","total_tokens":"#);
    body.extend_from_slice(prompt_tokens.to_string().as_bytes());
    body.extend_from_slice(b"}}");
    body
}

/// `[v, v, ...]`, the value at `nan_at` written as the bare token `NaN`, as
/// Python's `json` writes it.
fn write_values(body: &mut Vec<u8>, values: &[f32], nan_at: Option<usize>) {
    body.push(b'[');
    for (i, &value) in values.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if nan_at == Some(i) {
            body.extend_from_slice(b"NaN");
        } else {
            write_value(body, value);
        }
    }
    body.push(b']');
}

/// The vector as a base64 string of little-endian `f32`s; the value at
/// `nan_at` is a NaN.
fn write_base64(body: &mut Vec<u8>, values: &[f32], nan_at: Option<usize>) {
    use base64::Engine as _;
    let bytes: Vec<u8> = values
        .iter()
        .enumerate()
        .flat_map(|(i, &v)| {
            let v = if nan_at == Some(i) { f32::NAN } else { v };
            v.to_le_bytes()
        })
        .collect();
    body.push(b'"');
    body.extend_from_slice(
        base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .as_bytes(),
    );
    body.push(b'"');
}

/// Writes a vector value as `serde_json` would. Every value the simulator
/// makes is k/65536 for k in -65536..=65536, so their texts are formatted
/// once and copied: formatting floats was most of the simulator's work.
fn write_value(body: &mut Vec<u8>, value: f32) {
    static TEXTS: std::sync::OnceLock<(Vec<u8>, Vec<usize>)> = std::sync::OnceLock::new();
    let (texts, ends) = TEXTS.get_or_init(|| {
        let mut texts = Vec::with_capacity(2 * 65536 * 12);
        let mut ends = vec![0];
        for k in -65536..=65536 {
            write_json(&mut texts, &(k as f32 / 65536.0));
            ends.push(texts.len());
        }
        (texts, ends)
    });
    // Saturates far outside the table, and is checked below.
    #[allow(clippy::cast_possible_truncation)]
    let k = (value * 65536.0) as i32;
    let at = usize::try_from(i64::from(k) + 65536).unwrap_or(usize::MAX);
    if at < ends.len() - 1 && (k as f32 / 65536.0).to_bits() == value.to_bits() {
        body.extend_from_slice(&texts[ends[at]..ends[at + 1]]);
    } else {
        // -0.0, or a value of some other making.
        write_json(body, &value);
    }
}

fn write_json<T: serde::Serialize + ?Sized>(body: &mut Vec<u8>, value: &T) {
    // Writing finite floats and strings into a Vec cannot fail.
    serde_json::to_writer(body, value).expect("serialising into memory");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        let mut values: Vec<f32> = (0..64)
            .flat_map(|i| embedding_vector(256, &i.to_string()))
            .collect();
        values.extend([
            0.0,
            -0.0,
            1.0,
            -1.0,
            1.0 / 65536.0,
            -1.0 / 65536.0,
            0.1,
            1e-7,
            3.5e9,
        ]);
        for value in values {
            let mut ours = Vec::new();
            write_value(&mut ours, value);
            assert_eq!(ours, serde_json::to_vec(&value).unwrap(), "{value:?}");
        }
    }

    #[test]
    fn bodies_are_the_json_of_the_vectors() {
        let texts = ["a", "b"];
        let body = embeddings_response_body("svc-embed-1", 64, &texts);
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        for (i, text) in texts.iter().enumerate() {
            let written = serde_json::to_string(&value["data"][i]["embedding"]).unwrap();
            assert_eq!(
                written,
                serde_json::to_string(&embedding_vector(64, text)).unwrap()
            );
        }
    }
}
