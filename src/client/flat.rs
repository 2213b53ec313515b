//! The embeddings response decoded straight into one flat buffer of `f32`.
//!
//! Decoding into [`EmbeddingResponse`] builds a `Vec<f32>` per item, which
//! `validate` then copies row by row into the buffer the sink takes.
//! [`FlatEmbeddings`] instead appends every value, in the order the items
//! arrive, to one buffer sized ahead, and keeps each item's `index` and
//! length beside it. It accepts exactly the JSON that [`EmbeddingResponse`]
//! accepts (the same fields, the same leniency, the same errors), and
//! [`validate::check_flat`](crate::validate::check_flat) runs the same
//! checks on it; a response in order needs no copy at all.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::wire::{EmbeddingResponse, Usage};

/// An embeddings response whose vectors sit one after another in `values`,
/// in the order the service sent them. Nothing in it is checked yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlatEmbeddings {
    /// One per item of `data`, in the order sent.
    pub items: Vec<FlatItem>,
    /// Every item's vector, in the order sent.
    pub values: Vec<f32>,
    pub usage: Option<Usage>,
    pub model: Option<String>,
}

/// Where one item's vector sits in [`FlatEmbeddings::values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlatItem {
    /// As sent; signed so that a negative index is reported as such.
    pub index: i64,
    pub start: usize,
    pub len: usize,
}

impl FlatEmbeddings {
    /// Decodes a response body; `capacity` values are reserved up front (the
    /// inputs times the dimensions, when known).
    ///
    /// # Errors
    /// Whatever `serde_json::from_slice::<EmbeddingResponse>` would reject.
    pub fn from_slice(body: &[u8], capacity: usize) -> serde_json::Result<Self> {
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let flat = ResponseSeed { capacity }.deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(flat)
    }

    /// Item `i`'s vector.
    pub fn vector(&self, i: usize) -> &[f32] {
        let item = self.items[i];
        &self.values[item.start..item.start + item.len]
    }
}

impl From<EmbeddingResponse> for FlatEmbeddings {
    fn from(response: EmbeddingResponse) -> Self {
        let total = response.data.iter().map(|item| item.embedding.len()).sum();
        let mut values = Vec::with_capacity(total);
        let items = response
            .data
            .into_iter()
            .map(|item| {
                let start = values.len();
                values.extend_from_slice(&item.embedding);
                FlatItem {
                    index: item.index,
                    start,
                    len: item.embedding.len(),
                }
            })
            .collect();
        FlatEmbeddings {
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
    type Value = FlatEmbeddings;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_struct("EmbeddingResponse", RESPONSE_FIELDS, self)
    }
}

enum ResponseField {
    Data,
    Usage,
    Model,
    Other,
}

impl<'de> de::Deserialize<'de> for ResponseField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(FieldVisitor(|name: &str| match name {
            "data" => ResponseField::Data,
            "usage" => ResponseField::Usage,
            "model" => ResponseField::Model,
            _ => ResponseField::Other,
        }))
    }
}

enum ItemField {
    Index,
    Embedding,
    Other,
}

impl<'de> de::Deserialize<'de> for ItemField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(FieldVisitor(|name: &str| match name {
            "index" => ItemField::Index,
            "embedding" => ItemField::Embedding,
            _ => ItemField::Other,
        }))
    }
}

/// A field name, as text or bytes, as the derived field visitors take it.
struct FieldVisitor<F>(F);

impl<'de, T, F: FnOnce(&str) -> T> Visitor<'de> for FieldVisitor<F> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("field identifier")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<T, E> {
        Ok((self.0)(name))
    }

    fn visit_bytes<E: de::Error>(self, name: &[u8]) -> Result<T, E> {
        // A name that is not UTF-8 matches no field, and is ignored.
        Ok((self.0)(std::str::from_utf8(name).unwrap_or("")))
    }
}

impl<'de> Visitor<'de> for ResponseSeed {
    type Value = FlatEmbeddings;

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
        Ok(FlatEmbeddings {
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
        Ok(FlatEmbeddings {
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
    type Value = (Vec<FlatItem>, Vec<f32>);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for DataSeed {
    type Value = (Vec<FlatItem>, Vec<f32>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        let mut values = Vec::with_capacity(self.capacity);
        while let Some(item) = seq.next_element_seed(ItemSeed {
            values: &mut values,
        })? {
            items.push(item);
        }
        Ok((items, values))
    }
}

/// One item of `data`; its vector goes to the end of `values`.
struct ItemSeed<'a> {
    values: &'a mut Vec<f32>,
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = FlatItem;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_struct("EmbeddingItem", ITEM_FIELDS, self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = FlatItem;

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
                    let start = self.values.len();
                    map.next_value_seed(VectorSeed {
                        values: &mut *self.values,
                    })?;
                    vector = Some((start, self.values.len() - start));
                }
                ItemField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let index = index.ok_or_else(|| de::Error::missing_field("index"))?;
        let (start, len) = vector.ok_or_else(|| de::Error::missing_field("embedding"))?;
        Ok(FlatItem { index, start, len })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let expected = "struct EmbeddingItem with 2 elements";
        let index = seq
            .next_element::<i64>()?
            .ok_or_else(|| de::Error::invalid_length(0, &expected))?;
        let start = self.values.len();
        seq.next_element_seed(VectorSeed {
            values: &mut *self.values,
        })?
        .ok_or_else(|| de::Error::invalid_length(1, &expected))?;
        let len = self.values.len() - start;
        Ok(FlatItem { index, start, len })
    }
}

/// One `embedding` array, appended to `values`.
struct VectorSeed<'a> {
    values: &'a mut Vec<f32>,
}

impl<'de> DeserializeSeed<'de> for VectorSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for VectorSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(value) = seq.next_element::<f32>()? {
            self.values.push(value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::client::decode_embeddings;
    use crate::validate::{self, ValidationError, Vectors};

    /// What the decoder this one replaces made of a body: the parse error's
    /// text, or the checked vectors.
    fn old_way(
        body: &[u8],
        inputs: usize,
        dims: Option<usize>,
    ) -> Result<Result<Vectors, ValidationError>, String> {
        serde_json::from_slice::<EmbeddingResponse>(body)
            .map(|response| validate::check(response, inputs, dims))
            .map_err(|e| e.to_string())
    }

    fn new_way(
        body: &[u8],
        inputs: usize,
        dims: Option<usize>,
    ) -> Result<Result<Vectors, ValidationError>, String> {
        FlatEmbeddings::from_slice(body, inputs * dims.unwrap_or(0))
            .map(|flat| validate::check_flat(flat, inputs, dims))
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
        assert_eq!(old, new, "{text}");
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
        let flat = FlatEmbeddings::from_slice(text.as_bytes(), 4).unwrap();
        let at = flat.values.as_ptr();
        let vectors = validate::check_flat(flat, 2, Some(2)).unwrap();
        assert_eq!(vectors.values, [0.5, -1.0, 0.25, 2.0]);
        assert_eq!(vectors.values.as_ptr(), at);
        assert_eq!(vectors.usage.prompt_tokens, 4);
    }

    #[test]
    fn shuffled_items_are_placed_by_index() {
        let text = body(&[(2, &[2.0]), (0, &[0.0]), (1, &[1.0])]);
        let vectors =
            validate::check_flat(decode_embeddings(text.as_bytes(), 3).unwrap(), 3, Some(1))
                .unwrap();
        assert_eq!(vectors.values, [0.0, 1.0, 2.0]);
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
            let err = validate::check_flat(flat, inputs, dims).unwrap_err();
            assert!(
                err.to_string().starts_with(check),
                "{err} should name {check}"
            );
            assert_same(text.as_bytes(), inputs, dims);
        }
    }

    #[test]
    fn a_bare_nan_is_reported_as_a_non_finite_value() {
        let text = r#"{"data":[{"index":0,"embedding":[0.5,NaN]}]}"#;
        let err = decode_embeddings(text.as_bytes(), 2).unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(err.message.contains("non-finite value"), "{err}");
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
            1 => Just("-0.0".to_string()),
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

    proptest! {
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
