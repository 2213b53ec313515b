//! The fingerprint of a job: the settings that decide what a chunk's vector
//! is. Vectors are reused only under the same one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::job::Job;

/// What decides whether a stored vector may stand for a chunk: the same text
/// (its content hash) embedded by the same model at the same size, chunked the
/// same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint(pub(super) BTreeMap<String, String>);

impl Fingerprint {
    /// The fingerprint of `job` run on `model`, with vectors of
    /// `dimensions` when known, on a backend whose chunks fit `chunk_window`
    /// (see `BackendInfo::chunk_window`). The state takes these, not the
    /// backend's description, so that it depends on no stage above it.
    pub fn new(
        job: &Job,
        model: &str,
        dimensions: Option<usize>,
        chunk_window: Option<u64>,
    ) -> Fingerprint {
        let mut fields: BTreeMap<String, String> = job
            .fingerprint_fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        // The chunk sizes the run uses, fitted to the model where the job leaves them out.
        let chunking = job.chunking_for(chunk_window);
        fields.insert(
            "chunking.max_tokens".into(),
            chunking.max_tokens.to_string(),
        );
        fields.insert(
            "chunking.overlap_tokens".into(),
            chunking.overlap_tokens.to_string(),
        );
        fields.insert("backend.model".into(), model.to_string());
        if let Some(dimensions) = dimensions {
            fields.insert("backend.dimensions".into(), dimensions.to_string());
        }
        Fingerprint(fields)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Option<Fingerprint> {
        serde_json::from_str(text).ok().map(Fingerprint)
    }

    /// `key: old → new` for every field that differs from `earlier`.
    pub fn differences(&self, earlier: &Fingerprint) -> Vec<String> {
        let keys: std::collections::BTreeSet<&String> =
            self.0.keys().chain(earlier.0.keys()).collect();
        let show = |v: Option<&String>| match v.map(String::as_str) {
            None | Some("") => "(unset)".to_string(),
            Some(v) => v.to_string(),
        };
        keys.into_iter()
            .filter(|k| self.0.get(*k) != earlier.0.get(*k))
            .map(|k| format!("{k}: {} → {}", show(earlier.0.get(k)), show(self.0.get(k))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn fingerprint(model: &str) -> Fingerprint {
        Fingerprint(
            [
                ("backend.model".to_string(), model.to_string()),
                ("chunking.max_tokens".to_string(), "512".to_string()),
            ]
            .into_iter()
            .collect(),
        )
    }

    #[test]
    fn differences_name_each_changed_key() {
        let a = fingerprint("svc-embed-1");
        let b = fingerprint("svc-embed-1-l");
        assert!(a.differences(&a).is_empty());
        assert_eq!(
            b.differences(&a),
            ["backend.model: svc-embed-1 → svc-embed-1-l"]
        );
        assert_eq!(Fingerprint::from_json(&a.to_json()), Some(a));
    }
}
