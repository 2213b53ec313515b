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
        keys.into_iter()
            .filter(|k| self.0.get(*k) != earlier.0.get(*k))
            .map(|k| changed(k, earlier.0.get(k), self.0.get(k)))
            .collect()
    }
}

/// `key: old → new`, an unset or empty value shown as such.
fn changed(key: &str, earlier: Option<&String>, now: Option<&String>) -> String {
    let show = |v: Option<&String>| match v.map(String::as_str) {
        None | Some("") => "(unset)".to_string(),
        Some(v) => v.to_string(),
    };
    format!("{key}: {} → {}", show(earlier), show(now))
}

/// The fields of a job's fingerprint that its file alone decides, each
/// as [`Fingerprint::new`] records it (or its absence): the backend's kind,
/// the Markdown switch, the tokenizer, and the chunk sizes the job sets.
/// The rest (the model's name and vectors as the service gives them, chunk
/// sizes fitted to its window) is known only once the service is asked, so
/// a changed job file can be refused before anything is paid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled(BTreeMap<&'static str, Option<String>>);

impl Settled {
    pub fn of(job: &Job) -> Settled {
        let fields = job.fingerprint_fields();
        let mut keys = vec!["backend.kind", "chunking.markdown", "chunking.tokenizer"];
        if job.chunk_sizes_set.max_tokens {
            keys.push("chunking.max_tokens");
        }
        if job.chunk_sizes_set.overlap_tokens {
            keys.push("chunking.overlap_tokens");
        }
        Settled(
            keys.into_iter()
                .map(|key| (key, fields.get(key).cloned()))
                .collect(),
        )
    }

    /// `key: old → new` for every field settled here that differs from
    /// `earlier`, as [`Fingerprint::differences`] says it.
    pub fn differences(&self, earlier: &Fingerprint) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, now)| earlier.0.get(**key) != now.as_ref())
            .map(|(key, now)| changed(key, earlier.0.get(*key), now.as_ref()))
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

    fn job(chunking: &str) -> Job {
        let text = format!(
            "[source]\nkind = \"files\"\npaths = [\"unused\"]\n\
             [chunking]\n{chunking}\n\
             [backend]\nkind = \"local\"\n\
             [output]\npath = \"out.parquet\"\n"
        );
        crate::kinds::parse(&text, "job", &[]).unwrap()
    }

    #[test]
    fn what_the_job_file_settles_is_checked_and_what_the_service_tells_is_not() {
        // Made with chunks fitted to a window of 256 and a model the service named.
        let made = Fingerprint::new(&job(""), "served-model", Some(384), Some(256));
        let settled = Settled::of(&job(""));
        assert!(settled.differences(&made).is_empty(), "{settled:?}");
        assert_eq!(
            Settled::of(&job("tokenizer = \"o200k_base\"")).differences(&made),
            ["chunking.tokenizer: (unset) → o200k_base"]
        );
        assert_eq!(
            Settled::of(&job("markdown = true")).differences(&made),
            ["chunking.markdown: None → Some(true)"]
        );
        // Chunk sizes count only where the job sets them.
        assert_eq!(
            Settled::of(&job("max_tokens = 300")).differences(&made),
            ["chunking.max_tokens: 256 → 300"]
        );
        assert!(Settled::of(&job("max_tokens = 256"))
            .differences(&made)
            .is_empty());
        // Back to the default tokenizer from another: the key is gone.
        let other = Fingerprint::new(&job("tokenizer = \"o200k_base\""), "m", None, None);
        assert_eq!(
            settled.differences(&other),
            ["chunking.tokenizer: o200k_base → (unset)"]
        );
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
