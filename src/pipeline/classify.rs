//! What to do with each chunk: send it, reuse a vector already paid for, or
//! let it share the vector of an earlier chunk with the same text. `run`
//! and `estimate` sort chunks with this one [`Classifier`], so an estimate
//! counts exactly what a run sends.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;

use super::rechunk::Rechunker;
use crate::store::{hash_key, hash_prefix, HeldIds, Location, Origin, Store};
use crate::types::{id_key, Chunk};

/// Where a chunk's vector comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A sink that keeps its rows already holds this chunk, unchanged:
    /// nothing to write.
    Kept,
    /// Its vector is stored (by the sink, or in the checkpoint): read it back.
    Stored(Location),
    /// An earlier chunk of this run has the same text: it gets that vector.
    Repeat,
    /// It must be embedded.
    Send,
}

/// What the chunks of a run were sorted into. Compared with what the sink
/// held (by chunk id), chunks are `added`, `changed` or `unchanged`; of the
/// chunks not sent, `reused` came from the sink, `resumed` from the
/// checkpoint and `deduplicated` repeat another chunk's text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub chunks: u64,
    pub to_send: u64,
    /// Local token count of the chunks to send.
    pub sent_tokens: u64,
    pub reused: u64,
    pub resumed: u64,
    pub deduplicated: u64,
    pub added: u64,
    pub changed: u64,
    pub unchanged: u64,
    /// Held rows whose id no chunk of this run has.
    pub removed: u64,
    /// Local token count of the chunks not sent because a vector was at hand.
    pub tokens_saved: u64,
}

/// Sorts chunks, one at a time, in input order.
pub struct Classifier {
    store: Store,
    /// Held rows whose id has not been seen yet in this run.
    held_ids: HeldIds,
    /// Whether the sink keeps its rows between runs (see `Sink::keeps_rows`).
    keeps_rows: bool,
    /// The first 128 bits of the content hashes sent in this run: 16 bytes
    /// a chunk, and no two texts of any real input share them, so that a
    /// text is never taken for a repeat of another.
    scheduled: HashSet<u128>,
    counts: Counts,
    /// Cuts the chunks over the window refusals taught, before they are sent.
    rechunk: Option<Arc<Rechunker>>,
}

impl Classifier {
    pub fn new(store: Store, held_ids: HeldIds, keeps_rows: bool) -> Classifier {
        Classifier {
            store,
            held_ids,
            keeps_rows,
            scheduled: HashSet::new(),
            counts: Counts::default(),
            rechunk: None,
        }
    }

    /// A classifier that cuts, with `rechunk`, the chunks over the window
    /// refusals taught (see [`Classifier::fit`]).
    #[must_use]
    pub fn cutting(mut self, rechunk: Arc<Rechunker>) -> Classifier {
        self.rechunk = Some(rechunk);
        self
    }

    /// `chunk`, or, when no vector of its text is at hand and it is over
    /// the window refusals taught, the pieces a refusal would cut it into:
    /// the pieces an earlier run paid for are then reused, as the chunks
    /// the server took whole are. A repeat of a text sent whole in this run
    /// stays whole, to share its vector (or its fate). Classify what it returns.
    pub fn fit(&self, chunk: Chunk) -> Vec<Chunk> {
        let hash = &chunk.content_hash;
        let pieces = match &self.rechunk {
            Some(rechunk)
                if self.store.locate(hash).is_none()
                    && !self.scheduled.contains(&hash_key(hash)) =>
            {
                rechunk.cut(&chunk)
            }
            _ => None,
        };
        pieces.unwrap_or_else(|| vec![chunk])
    }

    /// A classifier with nothing stored: every distinct text is sent.
    pub fn fresh() -> Classifier {
        Classifier::new(Store::new(), HeldIds::new(), false)
    }

    pub fn classify(&mut self, chunk: &Chunk) -> Class {
        let c = &mut self.counts;
        c.chunks += 1;
        let tokens = u64::from(chunk.token_count);
        let held_hash = self.held_ids.remove(&id_key(&chunk.id));
        let located = self.store.locate(&chunk.content_hash);
        match located {
            Some((_, Origin::Previous)) => {
                c.unchanged += 1;
                c.reused += 1;
            }
            _ if held_hash.is_some() => c.changed += 1,
            _ => c.added += 1,
        }
        if let Some((location, origin)) = located {
            if origin == Origin::Checkpoint {
                c.resumed += 1;
            }
            c.tokens_saved += tokens;
            if self.keeps_rows && held_hash == Some(hash_prefix(&chunk.content_hash)) {
                return Class::Kept;
            }
            return Class::Stored(location);
        }
        if !self.scheduled.insert(hash_key(&chunk.content_hash)) {
            c.deduplicated += 1;
            c.tokens_saved += tokens;
            return Class::Repeat;
        }
        c.to_send += 1;
        c.sent_tokens += tokens;
        Class::Send
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The store the vectors of [`Class::Stored`] chunks are read from.
    pub fn store(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Once every chunk is classified: counts the held rows no chunk had,
    /// and returns them (by id key) for a sink that keeps rows to remove.
    pub fn finish(&mut self) -> HeldIds {
        let gone = std::mem::take(&mut self.held_ids);
        self.counts.removed = gone.len() as u64;
        gone
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::parquet_io::{Compression, FileOptions, ParquetRows, VectorFile};
    use crate::types::{content_hash, EmbeddedBatch, OutputMetadata, Usage, Vectors};

    fn chunk(doc: &str, i: u32, text: &str) -> Chunk {
        Chunk {
            id: format!("{doc}#{i}"),
            doc_id: Arc::from(doc),
            source: Arc::from(doc),
            chunk_index: i,
            byte_start: 0,
            byte_end: text.len() as u64,
            text: text.to_string(),
            content_hash: content_hash(text),
            token_count: 2,
            metadata: None,
        }
    }

    /// A store holding `held` as the sink's previous rows.
    fn held(dir: &std::path::Path, held: &[Chunk]) -> (Store, HeldIds) {
        let path = dir.join("held.parquet");
        let options = FileOptions {
            include_text: false,
            row_group_bytes: 1 << 20,
            compression: Compression::None,
        };
        let mut file = VectorFile::create(&path, 1, options).unwrap();
        file.write(&EmbeddedBatch {
            chunks: held.to_vec(),
            vectors: Vectors {
                dimensions: 1,
                values: vec![1.0; held.len()],
                usage: Usage::default(),
                discarded: Usage::default(),
            },
        })
        .unwrap();
        file.finish(&OutputMetadata {
            dimensions: 1,
            ..OutputMetadata::default()
        })
        .unwrap();
        let mut store = Store::new();
        let mut ids = HeldIds::new();
        let rows = Box::new(ParquetRows::open(&path).unwrap());
        store.add(rows, Origin::Previous, Some(&mut ids)).unwrap();
        (store, ids)
    }

    #[test]
    fn chunks_are_sent_reused_or_repeated_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = held(
            dir.path(),
            &[
                chunk("a", 0, "same"),
                chunk("a", 1, "old"),
                chunk("gone", 0, "x"),
            ],
        );
        let mut classifier = Classifier::new(store, ids, false);
        let classes: Vec<Class> = [
            chunk("a", 0, "same"),
            chunk("a", 1, "new"),
            chunk("b", 0, "new"),
            chunk("b", 1, "fresh"),
        ]
        .iter()
        .map(|c| classifier.classify(c))
        .collect();
        assert!(matches!(classes[0], Class::Stored(_)));
        assert_eq!(classes[1..], [Class::Send, Class::Repeat, Class::Send]);
        assert_eq!(classifier.finish().len(), 1, "gone#0 is gone");
        let c = classifier.counts();
        assert_eq!((c.chunks, c.to_send, c.sent_tokens), (4, 2, 4));
        assert_eq!((c.reused, c.resumed, c.deduplicated), (1, 0, 1));
        assert_eq!((c.added, c.changed, c.unchanged, c.removed), (2, 1, 1, 1));
        assert_eq!(c.tokens_saved, 4);
    }

    #[test]
    fn a_sink_that_keeps_rows_is_not_sent_what_it_holds_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = held(dir.path(), &[chunk("a", 0, "same"), chunk("a", 1, "moved")]);
        let mut classifier = Classifier::new(store, ids, true);
        assert_eq!(classifier.classify(&chunk("a", 0, "same")), Class::Kept);
        // The same text under another id is read back and written there.
        assert!(matches!(
            classifier.classify(&chunk("b", 0, "moved")),
            Class::Stored(_)
        ));
        let gone = classifier.finish();
        assert!(gone.contains_key(&id_key("a#1")));
    }

    #[test]
    fn a_chunk_over_the_taught_window_is_cut_unless_its_vector_is_at_hand() {
        use crate::chunk::{Chunker, TokenChunker};
        let config = crate::job::ChunkingConfig {
            tokenizer: None,
            max_tokens: 1000,
            overlap_tokens: 0,
            markdown: Some(false),
            wordpieces: None,
        };
        let chunker: Arc<dyn Chunker> = Arc::new(TokenChunker::cl100k(&config).unwrap());
        // Distinct words, so that no two pieces are alike.
        let words: Vec<String> = (0..150).map(|i| format!("item{i}")).collect();
        let long = |doc: &str| {
            let document = crate::types::Document {
                doc_id: doc.to_string(),
                source: Arc::from(doc),
                text: words.join(" "),
                metadata: None,
            };
            chunker.chunk(&document).pop().unwrap()
        };
        let window = crate::backend::LearnedWindow {
            tokens: 40,
            server_tokens: Some(100),
            from: crate::backend::WindowSource::Refusal,
            wordpieces: None,
        };
        let rechunk = Arc::new(Rechunker::new(Arc::clone(&chunker), Some(window)));
        // A text held whole by the output is reused whole.
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = held(dir.path(), &[long("held")]);
        let classifier = Classifier::new(store, ids, false).cutting(Arc::clone(&rechunk));
        assert_eq!(classifier.fit(long("held")), vec![long("held")]);
        // Another is cut into the pieces a refusal cuts, ids `{id}.{n}`.
        let mut classifier = Classifier::fresh().cutting(rechunk);
        let pieces = classifier.fit(long("a"));
        assert!(pieces.len() >= 4, "{}", pieces.len());
        assert!(pieces.iter().all(|p| p.token_count <= 40));
        assert_eq!(pieces[1].id, format!("{}.1", long("a").id));
        // A repeat of a text already sent whole in this run stays whole.
        let mut sent = long("b");
        sent.text.push('!');
        sent.content_hash = content_hash(&sent.text);
        assert_eq!(classifier.classify(&sent), Class::Send);
        assert_eq!(classifier.fit(sent.clone()), vec![sent]);
        for piece in &pieces {
            assert_eq!(classifier.classify(piece), Class::Send);
        }
    }
}
