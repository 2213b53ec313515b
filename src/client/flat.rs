//! The embeddings response decoded straight into one flat buffer of `f32`.
//!
//! Decoding into [`EmbeddingResponse`] builds a `Vec<f32>` per item, which
//! `validate` then copies row by row into the buffer the sink takes.
//! [`RawVectors`] instead appends every value, in the order the items
//! arrive, to one buffer sized ahead, and keeps each item's `index` and
//! length beside it: `serde_json` reads the body, and a seed for each
//! `embedding` appends to that buffer. It accepts exactly the JSON that
//! [`EmbeddingResponse`] accepts (the same fields, the same leniency, the
//! same errors), and [`validate::check`](crate::validate::check_flat) runs
//! the same checks on it; a response in order needs no copy at all.
//!
//! A vector may come as numbers or, when asked for with
//! `encoding_format: "base64"`, as one base64 string of little-endian
//! `f32`s, as OpenAI sends it. Non-finite values are read as what they stand
//! for, so that the check names the vector at fault and the rest of the
//! answer is kept: a bare `NaN`, `Infinity` or `-Infinity` (as Python's
//! `json` writes them), their quoted forms, and `null` (as `orjson` writes a
//! NaN).

use std::borrow::Cow;
use std::fmt;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::wire::EmbeddingResponse;
use crate::types::{RawItem, RawVectors, Usage};

/// Decodes an embeddings body; `capacity` values are reserved up front (the
/// inputs times the dimensions, when known).
///
/// # Errors
/// Whatever `serde_json::from_slice::<EmbeddingResponse>` would reject.
pub fn decode(body: &[u8], capacity: usize) -> serde_json::Result<RawVectors> {
    // Bare non-finite tokens are not JSON: only a body that fails is searched for them.
    decode_with_serde(body, capacity).or_else(|e| match with_non_finite_quoted(body) {
        Cow::Owned(quoted) => decode_with_serde(&quoted, capacity),
        Cow::Borrowed(_) => Err(e),
    })
}

/// Decodes an embeddings body already parsed as JSON (a line of a batch's
/// output file), as [`decode`] decodes its bytes.
///
/// # Errors
/// Whatever [`decode`] would reject in the same body.
pub fn decode_value(body: &serde_json::Value) -> serde_json::Result<RawVectors> {
    ResponseSeed { capacity: 0 }.deserialize(body)
}

/// The body with every bare `NaN`, `Infinity` and `-Infinity` outside a
/// string quoted, so that `serde_json` reads it; borrowed when there is none.
pub fn with_non_finite_quoted(body: &[u8]) -> Cow<'_, [u8]> {
    let delimiter = |at: Option<usize>| {
        at.and_then(|at| body.get(at)).is_none_or(|b| {
            matches!(b, b'[' | b']' | b',' | b':' | b'{' | b'}') || b.is_ascii_whitespace()
        })
    };
    let mut out: Option<Vec<u8>> = None;
    let (mut at, mut copied) = (0, 0);
    while let Some(found) = memchr::memchr3(b'"', b'N', b'I', &body[at..]) {
        at += found;
        if body[at] == b'"' {
            at = string_end(body, at + 1);
            continue;
        }
        let token: &[u8] = if body[at] == b'N' {
            b"NaN"
        } else {
            b"Infinity"
        };
        let start = if body[at] == b'I' && at > 0 && body[at - 1] == b'-' {
            at - 1
        } else {
            at
        };
        let end = at + token.len();
        if !(body[at..].starts_with(token)
            && delimiter(start.checked_sub(1))
            && delimiter(Some(end)))
        {
            at += 1;
            continue;
        }
        let out = out.get_or_insert_with(|| Vec::with_capacity(body.len() + 16));
        out.extend_from_slice(&body[copied..start]);
        out.push(b'"');
        out.extend_from_slice(&body[start..end]);
        out.push(b'"');
        (at, copied) = (end, end);
    }
    match out {
        Some(mut out) => {
            out.extend_from_slice(&body[copied..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(body),
    }
}

/// Where a string whose text starts at `from` ends: past its closing quote,
/// or at the end of the body.
fn string_end(body: &[u8], mut from: usize) -> usize {
    while let Some(found) = memchr::memchr2(b'"', b'\\', &body[from..]) {
        let at = from + found;
        if body[at] == b'"' {
            return at + 1;
        }
        // A backslash and the byte it escapes.
        from = (at + 2).min(body.len());
    }
    body.len()
}

/// Standard base64, with or without padding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Appends the little-endian `f32`s a base64 string holds to `values`,
/// decoding through `scratch`.
fn push_base64(
    text: &[u8],
    values: &mut Vec<f32>,
    scratch: &mut Vec<u8>,
) -> Result<(), &'static str> {
    scratch.clear();
    BASE64
        .decode_vec(text, scratch)
        .map_err(|_| "an embedding string that is not base64")?;
    if !scratch.len().is_multiple_of(4) {
        return Err("a base64 embedding that is not a whole number of 32-bit floats");
    }
    values.extend(
        scratch
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    Ok(())
}

/// A non-finite value written as a string, as `with_non_finite_quoted` leaves it.
fn non_finite(text: &str) -> Option<f32> {
    match text {
        "NaN" | "nan" => Some(f32::NAN),
        "Infinity" | "+Infinity" | "inf" => Some(f32::INFINITY),
        "-Infinity" | "-inf" => Some(f32::NEG_INFINITY),
        _ => None,
    }
}

/// `embedding` as `EmbeddingItem` reads it: numbers, or one base64 string.
pub(super) fn vector<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<f32>, D::Error> {
    let mut flat = Flat::default();
    VectorSeed(&mut flat).deserialize(deserializer)?;
    Ok(flat.values)
}

/// One body through `serde_json`, with the seeds below.
fn decode_with_serde(body: &[u8], capacity: usize) -> serde_json::Result<RawVectors> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let flat = ResponseSeed { capacity }.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(flat)
}

impl From<EmbeddingResponse> for RawVectors {
    fn from(response: EmbeddingResponse) -> Self {
        let total = response.data.iter().map(|item| item.embedding.len()).sum();
        let mut values = Vec::with_capacity(total);
        let items = response
            .data
            .into_iter()
            .map(|item| {
                let start = values.len();
                values.extend_from_slice(&item.embedding);
                RawItem {
                    index: item.index,
                    start,
                    len: item.embedding.len(),
                }
            })
            .collect();
        RawVectors {
            items,
            values,
            usage: response.usage,
            model: response.model,
        }
    }
}

// The visitors below mirror what `#[derive(Deserialize)]` generates for
// `EmbeddingResponse` and `EmbeddingItem` (maps or sequences, unknown keys
// ignored, duplicate and missing fields refused), with the vectors written
// into the shared buffer instead of a `Vec` each.

const RESPONSE_FIELDS: &[&str] = &["data", "usage", "model"];
const ITEM_FIELDS: &[&str] = &["index", "embedding"];

struct ResponseSeed {
    capacity: usize,
}

impl<'de> DeserializeSeed<'de> for ResponseSeed {
    type Value = RawVectors;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_struct("EmbeddingResponse", RESPONSE_FIELDS, self)
    }
}

#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum ResponseField {
    Data,
    Usage,
    Model,
    #[serde(other)]
    Other,
}

#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum ItemField {
    Index,
    Embedding,
    #[serde(other)]
    Other,
}

impl<'de> Visitor<'de> for ResponseSeed {
    type Value = RawVectors;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("struct EmbeddingResponse")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut data = None;
        let mut usage: Option<Option<Usage>> = None;
        let mut model: Option<Option<String>> = None;
        while let Some(field) = map.next_key::<ResponseField>()? {
            match field {
                ResponseField::Data => {
                    if data.is_some() {
                        return Err(de::Error::duplicate_field("data"));
                    }
                    data = Some(map.next_value_seed(DataSeed {
                        capacity: self.capacity,
                    })?);
                }
                ResponseField::Usage => {
                    if usage.is_some() {
                        return Err(de::Error::duplicate_field("usage"));
                    }
                    usage = Some(map.next_value()?);
                }
                ResponseField::Model => {
                    if model.is_some() {
                        return Err(de::Error::duplicate_field("model"));
                    }
                    model = Some(map.next_value()?);
                }
                ResponseField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let (items, values) = data.ok_or_else(|| de::Error::missing_field("data"))?;
        Ok(RawVectors {
            items,
            values,
            usage: usage.unwrap_or_default(),
            model: model.unwrap_or_default(),
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let expected = "struct EmbeddingResponse with 3 elements";
        let (items, values) = seq
            .next_element_seed(DataSeed {
                capacity: self.capacity,
            })?
            .ok_or_else(|| de::Error::invalid_length(0, &expected))?;
        let usage = seq.next_element()?.unwrap_or_default();
        let model = seq.next_element()?.unwrap_or_default();
        Ok(RawVectors {
            items,
            values,
            usage,
            model,
        })
    }
}

/// The `data` array.
struct DataSeed {
    capacity: usize,
}

impl<'de> DeserializeSeed<'de> for DataSeed {
    type Value = (Vec<RawItem>, Vec<f32>);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for DataSeed {
    type Value = (Vec<RawItem>, Vec<f32>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        let mut flat = Flat {
            values: Vec::with_capacity(self.capacity),
            scratch: Vec::new(),
        };
        while let Some(item) = seq.next_element_seed(ItemSeed(&mut flat))? {
            items.push(item);
        }
        Ok((items, flat.values))
    }
}

/// Every vector of a response, one after the other, and the bytes a base64
/// vector is decoded through.
#[derive(Default)]
struct Flat {
    values: Vec<f32>,
    scratch: Vec<u8>,
}

/// One item of `data`; its vector goes to the end of the values.
struct ItemSeed<'a>(&'a mut Flat);

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = RawItem;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_struct("EmbeddingItem", ITEM_FIELDS, self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = RawItem;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("struct EmbeddingItem")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut index = None;
        let mut vector = None;
        while let Some(field) = map.next_key::<ItemField>()? {
            match field {
                ItemField::Index => {
                    if index.is_some() {
                        return Err(de::Error::duplicate_field("index"));
                    }
                    index = Some(map.next_value::<i64>()?);
                }
                ItemField::Embedding => {
                    if vector.is_some() {
                        return Err(de::Error::duplicate_field("embedding"));
                    }
                    let start = self.0.values.len();
                    map.next_value_seed(VectorSeed(&mut *self.0))?;
                    vector = Some((start, self.0.values.len() - start));
                }
                ItemField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let index = index.ok_or_else(|| de::Error::missing_field("index"))?;
        let (start, len) = vector.ok_or_else(|| de::Error::missing_field("embedding"))?;
        Ok(RawItem { index, start, len })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let expected = "struct EmbeddingItem with 2 elements";
        let index = seq
            .next_element::<i64>()?
            .ok_or_else(|| de::Error::invalid_length(0, &expected))?;
        let start = self.0.values.len();
        seq.next_element_seed(VectorSeed(&mut *self.0))?
            .ok_or_else(|| de::Error::invalid_length(1, &expected))?;
        let len = self.0.values.len() - start;
        Ok(RawItem { index, start, len })
    }
}

/// One `embedding`, appended to the values.
struct VectorSeed<'a>(&'a mut Flat);

impl<'de> DeserializeSeed<'de> for VectorSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for VectorSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence of numbers or a base64 string")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(Element(value)) = seq.next_element::<Element>()? {
            self.0.values.push(value);
        }
        Ok(())
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<(), E> {
        let Flat { values, scratch } = self.0;
        push_base64(text.as_bytes(), values, scratch).map_err(E::custom)
    }
}

/// One value of a vector: a number, `null` (NaN), or a non-finite value's name.
struct Element(f32);

impl<'de> de::Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ElementVisitor)
    }
}

struct ElementVisitor;

impl Visitor<'_> for ElementVisitor {
    type Value = Element;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("f32")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Element, E> {
        #[allow(clippy::cast_possible_truncation)]
        Ok(Element(v as f32))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Element, E> {
        #[allow(clippy::cast_precision_loss)]
        Ok(Element(v as f32))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Element, E> {
        #[allow(clippy::cast_precision_loss)]
        Ok(Element(v as f32))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Element, E> {
        Ok(Element(f32::NAN))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Element, E> {
        non_finite(text)
            .map(Element)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::client::decode_embeddings;
    use crate::types::Vectors;
    use crate::validate::{self, ValidationError};

    /// What the decoder this one replaces made of a body: the parse error's
    /// text, or the checked vectors.
    fn old_way(
        body: &[u8],
        inputs: usize,
        dims: Option<usize>,
    ) -> Result<Result<Vectors, ValidationError>, String> {
        serde_json::from_slice::<EmbeddingResponse>(body)
            .or_else(|e| match with_non_finite_quoted(body) {
                Cow::Owned(quoted) => serde_json::from_slice::<EmbeddingResponse>(&quoted),
                Cow::Borrowed(_) => Err(e),
            })
            .map(|response| validate::check(response, inputs, dims))
            .map_err(|e| e.to_string())
    }

    fn new_way(
        body: &[u8],
        inputs: usize,
        dims: Option<usize>,
    ) -> Result<Result<Vectors, ValidationError>, String> {
        decode(body, inputs * dims.unwrap_or(0))
            .map(|flat| validate::check(flat, inputs, dims))
            .map_err(|e| e.to_string())
    }

    fn bits(result: &Result<Result<Vectors, ValidationError>, String>) -> Option<Vec<u32>> {
        match result {
            Ok(Ok(v)) => Some(v.values.iter().map(|x| x.to_bits()).collect()),
            _ => None,
        }
    }

    fn assert_same(body: &[u8], inputs: usize, dims: Option<usize>) {
        let old = old_way(body, inputs, dims);
        let new = new_way(body, inputs, dims);
        let text = String::from_utf8_lossy(body);
        // Debug text, as a NaN in an error is not equal to itself.
        assert_eq!(format!("{old:?}"), format!("{new:?}"), "{text}");
        // PartialEq on f32 says nothing of -0.0 against 0.0: compare the bits.
        assert_eq!(bits(&old), bits(&new), "{text}");
    }

    fn body(items: &[(i64, &[f32])]) -> String {
        let data: Vec<String> = items
            .iter()
            .map(|(index, values)| {
                let values: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
                format!(
                    r#"{{"object":"embedding","index":{index},"embedding":[{}]}}"#,
                    values.join(",")
                )
            })
            .collect();
        format!(
            r#"{{"object":"list","data":[{}],"model":"m","usage":{{"prompt_tokens":4,"total_tokens":4}}}}"#,
            data.join(",")
        )
    }

    #[test]
    fn an_ordered_response_is_kept_without_a_copy() {
        let text = body(&[(0, &[0.5, -1.0]), (1, &[0.25, 2.0])]);
        let flat = decode(text.as_bytes(), 4).unwrap();
        let at = flat.values.as_ptr();
        let vectors = validate::check(flat, 2, Some(2)).unwrap();
        assert_eq!(vectors.values, [0.5, -1.0, 0.25, 2.0]);
        assert_eq!(vectors.values.as_ptr(), at);
        assert_eq!(vectors.usage.prompt_tokens, 4);
    }

    #[test]
    fn shuffled_items_are_placed_by_index() {
        let text = body(&[(2, &[2.0]), (0, &[0.5]), (1, &[1.0])]);
        let vectors =
            validate::check(decode_embeddings(text.as_bytes(), 3).unwrap(), 3, Some(1)).unwrap();
        assert_eq!(vectors.values, [0.5, 1.0, 2.0]);
        assert_same(text.as_bytes(), 3, Some(1));
        assert_same(text.as_bytes(), 3, None);
    }

    #[test]
    fn each_fault_is_reported_as_before() {
        let cases: [(String, usize, Option<usize>, &str); 8] = [
            (
                body(&[(0, &[1.0]), (0, &[2.0])]),
                2,
                Some(1),
                "index uniqueness",
            ),
            (body(&[(0, &[1.0])]), 2, Some(1), "item count"),
            (body(&[(0, &[1.0]), (2, &[2.0])]), 2, Some(1), "index range"),
            (body(&[(-1, &[1.0])]), 1, Some(1), "index range"),
            (
                body(&[(0, &[1.0]), (1, &[2.0, 3.0])]),
                2,
                None,
                "vector length",
            ),
            (body(&[(0, &[1.0, 2.0])]), 1, Some(3), "vector length"),
            (body(&[(0, &[])]), 1, None, "vector length"),
            (
                r#"{"data":[{"index":0,"embedding":[1.0,1e39]}]}"#.to_string(),
                1,
                Some(2),
                "finite values",
            ),
        ];
        for (text, inputs, dims, check) in cases {
            let flat = decode_embeddings(text.as_bytes(), 0).unwrap();
            let err = validate::check(flat, inputs, dims).unwrap_err();
            assert!(
                err.to_string().starts_with(check),
                "{err} should name {check}"
            );
            assert_same(text.as_bytes(), inputs, dims);
        }
    }

    #[test]
    fn non_finite_values_are_read_for_the_check_to_name() {
        for text in [
            r#"{"data":[{"index":0,"embedding":[0.5,NaN]}]}"#,
            r#"{"data":[{"index":0,"embedding":[0.5,null]}]}"#,
            r#"{"data":[{"index":0,"embedding":[0.5,-Infinity]}]}"#,
            r#"{"data":[{"embedding":[0.5, Infinity], "index":0, "x":"NaN"}]}"#,
            r#"{"data":[{"index":0,"embedding":[0.5,"NaN"]}],"extra":1}"#,
        ] {
            let flat = decode_embeddings(text.as_bytes(), 2).unwrap();
            let err = validate::check(flat, 1, Some(2)).unwrap_err();
            assert!(
                err.to_string().starts_with("finite values"),
                "{text}: {err}"
            );
            assert_same(text.as_bytes(), 1, Some(2));
        }
        let quoted =
            with_non_finite_quoted(br#"{"a":"NaN in a string","b":[NaN,Infinity],"c":NaNo}"#);
        assert_eq!(
            &*quoted,
            &br#"{"a":"NaN in a string","b":["NaN","Infinity"],"c":NaNo}"#[..]
        );
        for (body, expected) in [
            (
                r#"[-Infinity,x-Infinity,--Infinity,-Inf,NaN]"#,
                r#"["-Infinity",x-Infinity,--Infinity,-Inf,"NaN"]"#,
            ),
            (
                r#"{"e\"NaN":NaN,"f\\":Infinity}"#,
                r#"{"e\"NaN":"NaN","f\\":"Infinity"}"#,
            ),
            ("NaN", "\"NaN\""),
            (" Infinity\n", " \"Infinity\"\n"),
            (r#"["NaN"#, r#"["NaN"#),
            (r#"["a\"#, r#"["a\"#),
            ("INaN NaNI IN", "INaN NaNI IN"),
        ] {
            let quoted = with_non_finite_quoted(body.as_bytes());
            assert_eq!(String::from_utf8_lossy(&quoted), expected, "{body}");
        }
    }

    fn base64_of(values: &[f32]) -> String {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        BASE64.encode(bytes)
    }

    #[test]
    fn base64_vectors_decode_to_the_same_floats() {
        let a = [0.5f32, -1.25, 3.0e-7, f32::MIN_POSITIVE];
        let b = [1.0f32, 2.0, -0.0, 7.5];
        let text = format!(
            r#"{{"object":"list","data":[{{"object":"embedding","index":1,"embedding":"{}"}},{{"object":"embedding","index":0,"embedding":"{}"}}],"model":"m","usage":{{"prompt_tokens":2,"total_tokens":2}}}}"#,
            base64_of(&b),
            base64_of(&a)
        );
        assert_same(text.as_bytes(), 2, Some(4));
        let vectors =
            validate::check(decode_embeddings(text.as_bytes(), 8).unwrap(), 2, Some(4)).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(vectors.row(0)), bits(&a));
        assert_eq!(bits(vectors.row(1)), bits(&b));
        // An escaped slash in the base64 text reads the same.
        let escaped = text.replacen('/', "\\/", 1);
        assert_same(escaped.as_bytes(), 2, Some(4));
        for bad in ["\"AAAA\"", "\"AAA\"", "\"!!!!\""] {
            let text = format!(r#"{{"data":[{{"index":0,"embedding":{bad}}}]}}"#);
            let err = decode_embeddings(text.as_bytes(), 0).unwrap_err();
            assert!(err.is_transient(), "{bad}: {err}");
            assert_same(text.as_bytes(), 1, None);
        }
    }

    #[test]
    fn a_truncated_body_is_reported_as_cut_off() {
        let text = body(&[(0, &[0.5, 0.25]), (1, &[1.0, 2.0])]);
        for end in 1..text.len() {
            let err = decode_embeddings(&text.as_bytes()[..end], 4).unwrap_err();
            assert!(err.is_transient());
            assert!(err.message.contains("cut off"), "{end}: {err}");
            assert_same(&text.as_bytes()[..end], 2, Some(2));
        }
    }

    #[test]
    fn lenient_shapes_are_accepted_as_before() {
        let bodies = [
            // Keys in any order, unknown keys, no usage, a null usage.
            r#"{"data":[{"embedding":[1,2],"x":{"y":[1]},"index":0}],"usage":null}"#,
            r#"{"model":"m","data":[{"index":0,"embedding":[1.5,-2e-3]}]}"#,
            // Structs written as arrays, as serde accepts them.
            r#"[[[0,[1.0,2.0]]],{"prompt_tokens":3}]"#,
            r#"{"data":[[0,[1.0,2.0]]]}"#,
            // Refused: a missing, repeated or wrongly typed field; trailing text.
            r#"{"usage":{}}"#,
            r#"{"data":[],"data":[]}"#,
            r#"{"data":[{"index":0,"index":0,"embedding":[1]}]}"#,
            r#"{"data":[{"index":0,"embedding":[1],"embedding":[1]}]}"#,
            r#"{"data":[{"embedding":[1]}]}"#,
            r#"{"data":[{"index":0}]}"#,
            r#"{"data":[{"index":"0","embedding":[1]}]}"#,
            r#"{"data":[{"index":0,"embedding":[true]}]}"#,
            r#"{"data":[{"index":0,"embedding":null}]}"#,
            r#"{"data":[],"model":7}"#,
            r#"{"data":[]} x"#,
            r#"[[[0]]]"#,
            r#"[]"#,
            r#"null"#,
        ];
        for text in bodies {
            assert_same(text.as_bytes(), 1, Some(2));
            assert_same(text.as_bytes(), 1, None);
        }
    }

    /// One number as a service might write it.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => any::<f32>().prop_filter("finite", |v| v.is_finite()).prop_map(|v| format!("{v:?}")),
            2 => (-65536i32..=65536).prop_map(|k| format!("{}", f64::from(k) / 65536.0)),
            1 => any::<i64>().prop_map(|v| v.to_string()),
            1 => (1u8..60, any::<bool>()).prop_map(|(e, neg)| format!("{}1.5e{}", if neg { "-" } else { "" }, e)),
            1 => prop::sample::select(vec!["-0.0", "-0", "0", "0e0", "1E+2", "2.5e-3", "-7e1"])
                .prop_map(String::from),
            2 => (any::<i32>(), 0i32..12, -25i32..25)
                .prop_map(|(m, d, e)| format!("{}e{e}", f64::from(m) / 10f64.powi(d))),
        ]
    }

    /// A number as services write them: at most 19 significant digits and a
    /// small decimal exponent.
    fn plain_number() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => (-65536i32..=65536).prop_map(|k| format!("{}", f64::from(k) / 65536.0)),
            1 => any::<i64>().prop_map(|v| v.to_string()),
            2 => (any::<i32>(), 0i32..4, -5i32..=5, any::<bool>())
                .prop_map(|(m, d, e, big)| format!("{}{}{e}", f64::from(m) / 10f64.powi(d), if big { "E" } else { "e" })),
            1 => prop::sample::select(vec!["-0.0", "-0", "0", "0e0", "1E+2", "2.5e-3", "-7e1", "0.5"])
                .prop_map(String::from),
        ]
    }

    /// An item: its index, its values, and how it is written.
    fn item() -> impl Strategy<Value = String> {
        (-1i64..5, prop::collection::vec(number(), 0..6), 0u8..4).prop_map(
            |(index, values, shape)| {
                let embedding = format!("[{}]", values.join(","));
                match shape {
                    0 => format!(r#"{{"index":{index},"embedding":{embedding}}}"#),
                    1 => format!(
                        r#"{{"embedding":{embedding},"object":"embedding","index":{index}}}"#
                    ),
                    2 => format!(r#"[{index},{embedding}]"#),
                    _ => format!(
                        r#"{{"index":{index}, "embedding" : {embedding} , "extra":[{{}}]}}"#
                    ),
                }
            },
        )
    }

    fn response() -> impl Strategy<Value = String> {
        (prop::collection::vec(item(), 0..5), 0u8..4).prop_map(|(items, shape)| {
            let data = format!("[{}]", items.join(","));
            match shape {
                0 => format!(r#"{{"data":{data},"usage":{{"prompt_tokens":1,"total_tokens":2}}}}"#),
                1 => format!(r#"{{"object":"list","model":"m","data":{data}}}"#),
                2 => format!(r#"[{data},null,"m"]"#),
                _ => format!(r#"{{"usage":null,"data":{data},"model":null}}"#),
            }
        })
    }

    #[cfg(feature = "simulator")]
    #[test]
    fn the_simulators_bodies_decode_to_its_vectors() {
        let texts = ["one", "two", "three"];
        for dims in [8, 1024] {
            for body in [
                crate::simulate::embeddings_response_body("svc-embed-1", dims, &texts),
                crate::simulate::embeddings_response_body_base64("svc-embed-1", dims, &texts),
            ] {
                assert_same(&body, 3, Some(dims));
                let flat = decode(&body, 0).unwrap();
                let vectors = validate::check(flat, 3, Some(dims)).unwrap();
                for (row, text) in vectors.rows().zip(texts) {
                    assert_eq!(row, crate::simulate::embedding_vector(dims, text));
                }
            }
        }
    }

    #[test]
    fn unusual_numbers_and_keys_decode_as_before() {
        for text in [
            r#"{"data":[{"index":0,"embedding":[1e400]}]}"#,
            r#"{"data":[{"index":0,"embedding":[1e-30]}]}"#,
            r#"{"data":[{"index":0,"embedding":[123456789012345678901234]}]}"#,
            r#"{"data":[{"index":0,"embedding":[0.1234567890123456789012]}]}"#,
            r#"{"data":[{"index":0,"embedding":[1]}],"extra":1}"#,
            r#"{"d\u0061ta":[]}"#,
            "{\"data\":[],\"model\":\"caf\u{e9}\"}",
            r#"{"data":[{"index":-0,"embedding":[1]}]}"#,
            r#"{"data":[{"index":0,"embedding":[01]}]}"#,
        ] {
            assert_same(text.as_bytes(), 1, None);
        }
    }

    /// A number in an embedding reads as `serde_json` reads an `f32`.
    fn assert_number_agrees(text: &str) {
        let Ok(expected) = serde_json::from_str::<f32>(text) else {
            return;
        };
        let body = format!(r#"{{"data":[{{"index":0,"embedding":[{text}]}}]}}"#);
        let flat = decode(body.as_bytes(), 1).unwrap();
        assert_eq!(flat.values.len(), 1, "{text}");
        assert_eq!(flat.values[0].to_bits(), expected.to_bits(), "{text}");
    }

    proptest! {
        #[test]
        fn numbers_read_as_serde_json_reads_them(
            text in prop_oneof![number(), plain_number(), "-?[0-9]{1,22}(\\.[0-9]{1,22})?([eE][+-]?[0-9]{1,3})?"],
        ) {
            assert_number_agrees(&text);
        }

        #[test]
        fn spaced_bodies_decode_to_the_bit(
            items in prop::collection::vec((-2i64..4, prop::collection::vec(plain_number(), 0..8)), 0..4),
            spaced in any::<bool>(),
        ) {
            let data: Vec<String> = items.iter().map(|(index, values)| {
                format!(r#"{{"object":"embedding","index":{index},"embedding":[{}]}}"#, values.join(","))
            }).collect();
            let mut text = format!(
                r#"{{"object":"list","data":[{}],"model":"m","usage":{{"prompt_tokens":1,"total_tokens":1}}}}"#,
                data.join(",")
            );
            if spaced {
                text = text.replace(',', " ,\n ").replace(':', ": ");
            }
            assert_same(text.as_bytes(), items.len(), None);
            let derived = RawVectors::from(serde_json::from_slice::<EmbeddingResponse>(text.as_bytes()).unwrap());
            let flat = decode(text.as_bytes(), 0).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(&flat, &derived);
            prop_assert_eq!(bits(&flat.values), bits(&derived.values));
        }

        #[test]
        fn decodes_exactly_as_the_derived_response_does(
            text in response(),
            inputs in 0usize..5,
            dims in prop::option::of(0usize..6),
        ) {
            assert_same(text.as_bytes(), inputs, dims);
        }

        #[test]
        fn damaged_bodies_fail_exactly_as_before(
            text in response(),
            cut in any::<prop::sample::Index>(),
            damage in prop::sample::select(vec!["", "NaN", "]", "}", ",", "\"", "1e400"]),
        ) {
            let at = cut.index(text.len() + 1);
            let damaged = format!("{}{damage}{}", &text[..at], if damage.is_empty() { "" } else { &text[at..] });
            assert_same(damaged.as_bytes(), 2, Some(2));
            assert_same(damaged.as_bytes(), 2, None);
        }
    }
}
