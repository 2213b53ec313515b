//! Token-aware chunking.
//!
//! [`TokenChunker`] splits a document along its structure (paragraphs,
//! sentences, words; markdown sections for markdown) into chunks of at most
//! `max_tokens` tokens, counted by the same tokenizer that sizes requests.
//! Chunk ids, offsets and hashes depend only on the document and the config,
//! so a re-run produces the same chunks.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use text_splitter::{ChunkConfig, ChunkSizer, MarkdownSplitter, TextSplitter};
use tiktoken_rs::CoreBPE;

use crate::bounded::{self, BoundedError, MAX_TOKENIZER_BYTES};
use crate::job::ChunkingConfig;
use crate::types::{content_hash, Chunk, Document};

pub(crate) mod wordpiece;

/// Splits documents into chunks.
pub trait Chunker: Send + Sync {
    fn chunk(&self, document: &Document) -> Vec<Chunk>;
    fn count_tokens(&self, text: &str) -> usize;

    /// The chunks of `document`, in order, handed to `each` as they are
    /// cut, until it returns `false`: a run sends the first chunks of a long
    /// document while the rest are still to cut. The same chunks as
    /// [`Chunker::chunk`].
    fn chunk_each(&self, document: &Document, each: &mut dyn FnMut(Chunk) -> bool) {
        for chunk in self.chunk(document) {
            if !each(chunk) {
                return;
            }
        }
    }

    /// A chunker that counts as this one, for chunks of at most
    /// `max_tokens`, when it can make one: a chunk the model refused as
    /// over its window is cut again with it.
    fn narrower(&self, _max_tokens: usize) -> Option<Box<dyn Chunker>> {
        None
    }
}

/// A chunker that cannot be built from its config.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("`chunking.max_tokens` must be at least 1")]
    ZeroMaxTokens,
    #[error(
        "`chunking.overlap_tokens` ({overlap_tokens}) must be less than `chunking.max_tokens` ({max_tokens})"
    )]
    OverlapTooLarge {
        overlap_tokens: usize,
        max_tokens: usize,
    },
    #[error("cannot load the {name} tokenizer: {message}")]
    Tokenizer { name: String, message: String },
}

/// A `tokenizer.json` read only up to [`MAX_TOKENIZER_BYTES`], so a path
/// such as `/dev/zero` is an error rather than exhausted memory. `named_by`
/// is the key or flag that names it, for the error.
pub(crate) fn read_tokenizer(
    path: &str,
    named_by: &str,
) -> Result<tokenizers::Tokenizer, ChunkError> {
    let fail = |message: String| ChunkError::Tokenizer {
        name: path.to_string(),
        message: format!("{named_by}: {message}"),
    };
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let bytes = bounded::read_to_end(file, MAX_TOKENIZER_BYTES).map_err(|e| match e {
        BoundedError::TooLarge { limit } => fail(format!(
            "more than {}, the most a tokenizer file may hold",
            bounded::describe(limit)
        )),
        BoundedError::Io(e) => fail(e.to_string()),
    })?;
    tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| fail(e.to_string()))
}

/// The job key that names a tokenizer file.
const TOKENIZER_KEY: &str = "`chunking.tokenizer`";

/// Tokens the model adds to every text (`[CLS]` and `[SEP]` for a BERT
/// model), as the tokenizer `config.tokenizer` names says (its
/// `tokenizer.json`, or `bert-base-uncased`'s); none for an encoding.
///
/// # Errors
/// A tokenizer that cannot be read.
pub fn special_tokens(config: &ChunkingConfig) -> Result<u64, ChunkError> {
    match config.tokenizer.as_deref() {
        Some(BERT_WORDPIECE) => Ok(added(bert_wordpiece()?)),
        Some(path) if !named_encoding(path) => Ok(added(&read_tokenizer(path, TOKENIZER_KEY)?)),
        _ => Ok(0),
    }
}

/// The tokens `tokenizer`'s post-processor adds to every text.
fn added(tokenizer: &tokenizers::Tokenizer) -> u64 {
    tokenizer.get_post_processor().map_or(0, |p| {
        tokenizers::PostProcessor::added_tokens(p, false) as u64
    })
}

/// `bert-base-uncased`'s tokenizer, built in ([`wordpiece`]).
fn bert_wordpiece() -> Result<&'static tokenizers::Tokenizer, ChunkError> {
    wordpiece::tokenizer().ok_or_else(|| ChunkError::Tokenizer {
        name: BERT_WORDPIECE.into(),
        message: "its built-in vocabulary could not be read".into(),
    })
}

/// The `cl100k_base` encoding, loaded once per process: building it takes
/// longer than chunking a typical document.
fn cl100k_base() -> Result<&'static CoreBPE, ChunkError> {
    static CL100K: OnceLock<Result<CoreBPE, String>> = OnceLock::new();
    CL100K
        .get_or_init(|| tiktoken_rs::cl100k_base().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|message| ChunkError::Tokenizer {
            name: "cl100k_base".into(),
            message: message.clone(),
        })
}

/// The `o200k_base` encoding (OpenAI's newer models), loaded once per process.
fn o200k_base() -> Result<&'static CoreBPE, ChunkError> {
    static O200K: OnceLock<Result<CoreBPE, String>> = OnceLock::new();
    O200K
        .get_or_init(|| tiktoken_rs::o200k_base().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|message| ChunkError::Tokenizer {
            name: "o200k_base".into(),
            message: message.clone(),
        })
}

pub use crate::job::{named_encoding, BERT_WORDPIECE};

/// What counts tokens.
enum Counter {
    Bpe(&'static CoreBPE, &'static str),
    HuggingFace(Box<tokenizers::Tokenizer>),
}

#[cfg(test)]
thread_local! {
    /// Bytes this thread has counted tokens of: the work chunking does.
    static COUNTED_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Counter {
    fn count(&self, text: &str) -> usize {
        #[cfg(test)]
        COUNTED_BYTES.with(|n| n.set(n.get() + text.len()));
        match self {
            Counter::Bpe(bpe, _) => bpe.encode_ordinary(text).len(),
            // A tokenizer that cannot encode a text (a word-level model
            // without an unknown token, say) has no count for it; one token
            // per byte keeps such chunks small rather than failing the job.
            Counter::HuggingFace(tokenizer) => tokenizer
                .encode_fast(text, false)
                .map_or(text.len(), |encoding| encoding.len()),
        }
    }
}

thread_local! {
    /// Token counts the splitter computed while choosing the current chunk,
    /// keyed by the address and length of the slice of the document they
    /// counted. The splitter has always counted the chunk it returns, so
    /// looking the count up here saves encoding every chunk a second time.
    static COUNTED: RefCell<CountLog> = RefCell::new(CountLog::default());
}

#[derive(Default)]
struct CountLog {
    active: bool,
    counts: HashMap<(usize, usize), usize>,
}

fn slice_key(text: &str) -> (usize, usize) {
    (text.as_ptr().addr(), text.len())
}

/// Keeps the count log on for one document and clears it afterwards, also on
/// unwinding.
///
/// A document chunked while another's chunks are handed on (a chunk cut
/// again narrower) has a session of its own; the other's goes on after it.
struct CountLogSession {
    /// Whether a session was on when this one started.
    outer: bool,
}

impl CountLogSession {
    fn start() -> Self {
        let outer = COUNTED.with_borrow_mut(|log| {
            log.counts.clear();
            std::mem::replace(&mut log.active, true)
        });
        CountLogSession { outer }
    }

    /// The count recorded for `text`, a slice of the document being chunked,
    /// then forgets everything recorded so far: the next chunk starts afresh.
    fn take(&self, text: &str) -> Option<usize> {
        COUNTED.with_borrow_mut(|log| {
            let count = log.counts.get(&slice_key(text)).copied();
            log.counts.clear();
            count
        })
    }
}

impl Drop for CountLogSession {
    fn drop(&mut self) {
        COUNTED.with_borrow_mut(|log| {
            log.active = self.outer;
            log.counts.clear();
        });
    }
}

/// The splitters' sizer: counts tokens and records the counts while a
/// document is being chunked; where chunks must also fit a number of word
/// pieces, a text over them is over the tokens too ([`Fit`]).
#[derive(Clone)]
struct Sizer {
    counter: Arc<Counter>,
    fit: Option<Fit>,
}

impl ChunkSizer for Sizer {
    fn size(&self, chunk: &str) -> usize {
        let count = self.counter.count(chunk);
        COUNTED.with_borrow_mut(|log| {
            if log.active {
                log.counts.insert(slice_key(chunk), count);
            }
        });
        self.fit.map_or(count, |fit| fit.size(chunk, count))
    }
}

/// Chunks of at most `tokens` of the job's count that must also hold at
/// most `pieces` word pieces (`bert-base-uncased`'s count,
/// [`ChunkingConfig::wordpieces`]): the window a self-hosted server reads,
/// found on the input's densest text. A chunk of text denser than that
/// (tables, identifiers, rules of dashes) fits the job's count and not the
/// server's; it is cut where its pieces fit.
#[derive(Debug, Clone, Copy)]
struct Fit {
    tokens: usize,
    pieces: usize,
}

impl Fit {
    /// The size the splitter sees of `text`, of `count` tokens: its count,
    /// or, where it holds more pieces than fit, its pieces scaled to the
    /// tokens (more than fit by as much). Pieces are counted only for a
    /// text within the tokens.
    fn size(self, text: &str, count: usize) -> usize {
        if count > self.tokens {
            return count;
        }
        let pieces = wordpiece::server_pieces(text);
        if pieces <= self.pieces {
            return count;
        }
        count.max(
            pieces
                .saturating_mul(self.tokens)
                .div_ceil(self.pieces.max(1)),
        )
    }
}

/// The splitters that cut a chunk over the word pieces ([`Fit`]).
struct Fitted {
    fit: Fit,
    text: TextSplitter<Sizer>,
    markdown: MarkdownSplitter<Sizer>,
}

/// Splits documents into chunks of at most `max_tokens` tokens, with
/// `overlap_tokens` of overlap between neighbours.
///
/// Chunks are trimmed of surrounding whitespace, and `text` is always
/// `document.text[byte_start..byte_end]`. A chunk can only exceed `max_tokens`
/// if a single character encodes to more tokens than that. Where the config
/// sets `wordpieces`, a chunk holds no more of them either ([`Fit`]).
pub struct TokenChunker {
    counter: Arc<Counter>,
    fitted: Option<Fitted>,
    text: TextSplitter<Sizer>,
    markdown: MarkdownSplitter<Sizer>,
    markdown_mode: Option<bool>,
    max_tokens: usize,
    overlap_tokens: usize,
}

impl fmt::Debug for TokenChunker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tokenizer = match *self.counter {
            Counter::Bpe(_, name) => name,
            Counter::HuggingFace(_) => "huggingface",
        };
        f.debug_struct("TokenChunker")
            .field("tokenizer", &tokenizer)
            .field("max_tokens", &self.max_tokens)
            .field("wordpieces", &self.fitted.as_ref().map(|f| f.fit.pieces))
            .field("overlap_tokens", &self.overlap_tokens)
            .field("markdown", &self.markdown_mode)
            .finish_non_exhaustive()
    }
}

impl TokenChunker {
    /// The tokens the model adds to every text, as the tokenizer this
    /// chunker counts with says ([`special_tokens`]); none for an encoding.
    pub fn special_tokens(&self) -> u64 {
        match &*self.counter {
            Counter::Bpe(..) => 0,
            Counter::HuggingFace(tokenizer) => added(tokenizer),
        }
    }

    /// A chunker that counts with tiktoken's `cl100k_base`, the encoding the
    /// hosted models use. The encoding is loaded once and shared.
    ///
    /// # Errors
    ///
    /// A `max_tokens` of 0, an overlap of `max_tokens` or more, or an
    /// encoding that cannot be loaded.
    pub fn cl100k(config: &ChunkingConfig) -> Result<Self, ChunkError> {
        Self::new(config, Counter::Bpe(cl100k_base()?, "cl100k_base"))
    }

    /// A chunker that counts with what `config.tokenizer` names:
    /// `cl100k_base` (also when absent), `o200k_base`, `bert-base-uncased`,
    /// or the path of a Hugging Face `tokenizer.json`.
    ///
    /// # Errors
    ///
    /// As [`TokenChunker::cl100k`], or a tokenizer file that cannot be read.
    pub fn for_config(config: &ChunkingConfig) -> Result<Self, ChunkError> {
        match config.tokenizer.as_deref() {
            None | Some("cl100k_base") => Self::cl100k(config),
            Some("o200k_base") => Self::new(config, Counter::Bpe(o200k_base()?, "o200k_base")),
            Some(BERT_WORDPIECE) => Self::with_tokenizer(config, bert_wordpiece()?.clone()),
            Some(path) => {
                let tokenizer = read_tokenizer(path, TOKENIZER_KEY)?;
                Self::with_tokenizer(config, tokenizer)
            }
        }
    }

    /// A chunker that counts with a Hugging Face tokenizer, such as a local
    /// model's own. Truncation and padding are turned off on a copy, and
    /// special tokens are not counted, so counts are those of the text alone.
    ///
    /// # Errors
    ///
    /// A `max_tokens` of 0, an overlap of `max_tokens` or more, or a
    /// tokenizer whose truncation cannot be turned off.
    pub fn with_tokenizer(
        config: &ChunkingConfig,
        mut tokenizer: tokenizers::Tokenizer,
    ) -> Result<Self, ChunkError> {
        tokenizer
            .with_truncation(None)
            .map_err(|e| ChunkError::Tokenizer {
                name: "huggingface".into(),
                message: format!("cannot turn off truncation: {e}"),
            })?;
        tokenizer.with_padding(None);
        Self::new(config, Counter::HuggingFace(Box::new(tokenizer)))
    }

    fn new(config: &ChunkingConfig, counter: Counter) -> Result<Self, ChunkError> {
        Self::counting_with(config, Arc::new(counter))
    }

    fn counting_with(config: &ChunkingConfig, counter: Arc<Counter>) -> Result<Self, ChunkError> {
        let ChunkingConfig {
            max_tokens,
            overlap_tokens,
            markdown,
            wordpieces,
            ..
        } = *config;
        if max_tokens == 0 {
            return Err(ChunkError::ZeroMaxTokens);
        }
        let overlap_error = || ChunkError::OverlapTooLarge {
            overlap_tokens,
            max_tokens,
        };
        if overlap_tokens >= max_tokens {
            return Err(overlap_error());
        }
        let chunk_config = |fit: Option<Fit>| {
            ChunkConfig::new(max_tokens)
                .with_sizer(Sizer {
                    counter: Arc::clone(&counter),
                    fit,
                })
                .with_trim(true)
                .with_overlap(overlap_tokens)
                .map_err(|_| overlap_error())
        };
        let fitted = match wordpieces {
            Some(pieces) => {
                let fit = Fit {
                    tokens: max_tokens,
                    pieces: pieces.max(1),
                };
                Some(Fitted {
                    fit,
                    text: TextSplitter::new(chunk_config(Some(fit))?),
                    markdown: MarkdownSplitter::new(chunk_config(Some(fit))?),
                })
            }
            None => None,
        };
        Ok(TokenChunker {
            text: TextSplitter::new(chunk_config(None)?),
            markdown: MarkdownSplitter::new(chunk_config(None)?),
            counter,
            fitted,
            markdown_mode: markdown,
            max_tokens,
            overlap_tokens,
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn overlap_tokens(&self) -> usize {
        self.overlap_tokens
    }

    /// Whether `document` is split along markdown structure: as configured,
    /// or by its source's extension when the config leaves it open.
    pub fn is_markdown(&self, document: &Document) -> bool {
        self.markdown_mode
            .unwrap_or_else(|| has_markdown_extension(&document.source))
    }

    fn emit<'text>(
        &self,
        document: &'text Document,
        pieces: impl Iterator<Item = (usize, &'text str)>,
        log: &CountLogSession,
        each: &mut dyn FnMut(Chunk) -> bool,
    ) {
        let doc_id: Arc<str> = Arc::from(document.doc_id.as_str());
        for (index, (offset, text)) in pieces.enumerate() {
            let tokens = log.take(text).unwrap_or_else(|| self.counter.count(text));
            let chunk_index = u32::try_from(index).unwrap_or(u32::MAX);
            let chunk = Chunk {
                id: format!("{doc_id}#{chunk_index}"),
                doc_id: Arc::clone(&doc_id),
                source: Arc::clone(&document.source),
                chunk_index,
                byte_start: offset as u64,
                byte_end: (offset + text.len()) as u64,
                text: text.to_owned(),
                content_hash: content_hash(text),
                token_count: u32::try_from(tokens).unwrap_or(u32::MAX),
                metadata: document.metadata.clone(),
            };
            if !each(chunk) {
                return;
            }
        }
    }
}

fn has_markdown_extension(source: &str) -> bool {
    // A compressed file is judged by the name it has once decompressed.
    let source = source
        .strip_suffix(".gz")
        .or_else(|| source.strip_suffix(".zst"))
        .unwrap_or(source);
    let Some((_, extension)) = source.rsplit_once('.') else {
        return false;
    };
    extension.eq_ignore_ascii_case("md") || extension.eq_ignore_ascii_case("markdown")
}

impl TokenChunker {
    /// A plain-text document that fits whole is one chunk, its trimmed text:
    /// what the splitter makes of it, with one count instead of the
    /// splitter's several and no search for sentence boundaries.
    fn whole(&self, document: &Document) -> Option<Chunk> {
        let text = document.text.as_str();
        let trimmed = text.trim();
        // Counting a long document only to find it does not fit would be waste:
        // past 16 bytes a token on average, leave it to the splitter.
        if self.is_markdown(document) || trimmed.len() / 16 > self.max_tokens {
            return None;
        }
        let tokens = self.counter.count(trimmed);
        if tokens > self.max_tokens || self.over_pieces(trimmed) {
            return None;
        }
        let offset = trimmed.as_ptr().addr() - text.as_ptr().addr();
        let doc_id: Arc<str> = Arc::from(document.doc_id.as_str());
        Some(Chunk {
            id: format!("{doc_id}#0"),
            doc_id,
            source: Arc::clone(&document.source),
            chunk_index: 0,
            byte_start: offset as u64,
            byte_end: (offset + trimmed.len()) as u64,
            text: trimmed.to_owned(),
            content_hash: content_hash(trimmed),
            token_count: u32::try_from(tokens).unwrap_or(u32::MAX),
            metadata: document.metadata.clone(),
        })
    }

    /// Splits the document one window at a time (see [`windows`]), so that
    /// the time taken grows with its length and not with its square. A
    /// document that could fit one chunk (see [`TokenChunker::whole`]) is
    /// never cut into windows.
    fn split(&self, document: &Document, each: &mut dyn FnMut(Chunk) -> bool) {
        let text = document.text.as_str();
        let log = CountLogSession::start();
        let markdown = self.is_markdown(document);
        let size = if text.trim().len() > self.window_bytes() {
            self.window_bytes()
        } else {
            text.len()
        };
        let pieces = windows(text, size).flat_map(|(start, window)| {
            let chunks: Box<dyn Iterator<Item = (usize, &str)>> = if markdown {
                Box::new(self.markdown.chunk_indices(window))
            } else {
                Box::new(self.text.chunk_indices(window))
            };
            chunks.flat_map(move |(offset, piece)| self.fit_pieces(start + offset, piece, markdown))
        });
        self.emit(document, pieces, &log, each);
    }

    /// Whether `text` holds more word pieces than the chunks may ([`Fit`]).
    fn over_pieces(&self, text: &str) -> bool {
        self.fitted
            .as_ref()
            .is_some_and(|fitted| wordpiece::server_pieces(text) > fitted.fit.pieces)
    }

    /// A chunk at `offset` of the document, or, where it holds more word
    /// pieces than the chunks may, the chunks the fitted splitters cut it
    /// into: the pieces are counted once a chunk, and only a chunk over
    /// them is sized by them (counted at every size the splitter tries,
    /// chunking took three times as long).
    fn fit_pieces<'text>(
        &'text self,
        offset: usize,
        chunk: &'text str,
        markdown: bool,
    ) -> Box<dyn Iterator<Item = (usize, &'text str)> + 'text> {
        match self.fitted.as_ref().filter(|_| self.over_pieces(chunk)) {
            Some(fitted) => {
                let pieces: Box<dyn Iterator<Item = (usize, &str)>> = if markdown {
                    Box::new(fitted.markdown.chunk_indices(chunk))
                } else {
                    Box::new(fitted.text.chunk_indices(chunk))
                };
                Box::new(pieces.map(move |(at, piece)| (offset + at, piece)))
            }
            None => Box::new(std::iter::once((offset, chunk))),
        }
    }

    /// The longest text the splitter is given at once: room for a few
    /// chunks of ordinary text (about 4 bytes a token), and for any text
    /// [`TokenChunker::whole`] could take as one chunk.
    fn window_bytes(&self) -> usize {
        self.max_tokens
            .saturating_mul(WINDOW_BYTES_PER_TOKEN)
            .max(MIN_WINDOW_BYTES)
    }
}

/// A window holds this many bytes per token of `max_tokens` (the 16 bytes a
/// token past which [`TokenChunker::whole`] gives up)...
const WINDOW_BYTES_PER_TOKEN: usize = 16;
/// ...and at least this many.
const MIN_WINDOW_BYTES: usize = 2048;

/// `text` cut into windows of at most `size` bytes (each with its offset),
/// each ending where the text breaks best in its second half: a blank line,
/// else a line end, a sentence end, a space, or any character boundary.
///
/// The splitter looks ahead to the end of the text for the next break of
/// each kind, and sizes the whole of a section that has no break: on a long
/// line, or text without spaces, every chunk costs time in the length of the
/// rest of the text. Given windows, no chunk looks further than one. A chunk
/// never spans two windows, and there is no overlap across their boundary.
fn windows(text: &str, size: usize) -> impl Iterator<Item = (usize, &str)> {
    let size = size.max(8);
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let rest = &text[start..];
        let end = if rest.len() <= size {
            rest.len()
        } else {
            best_break(rest, size)
        };
        let window = (start, &rest[..end]);
        start += end;
        Some(window)
    })
}

/// Where to end a window of at most `size` bytes of `text` (longer than that).
fn best_break(text: &str, size: usize) -> usize {
    let mut limit = size;
    while !text.is_char_boundary(limit) {
        limit -= 1;
    }
    let half = limit / 2;
    let searched = &text.as_bytes()[half..limit];
    let after =
        |needle: &[u8]| memchr::memmem::rfind(searched, needle).map(|at| half + at + needle.len());
    let sentence_end = || {
        searched
            .windows(2)
            .rposition(|w| matches!(w[0], b'.' | b'!' | b'?') && w[1].is_ascii_whitespace())
            .map(|at| half + at + 2)
    };
    let space = || {
        searched
            .iter()
            .rposition(u8::is_ascii_whitespace)
            .map(|at| half + at + 1)
    };
    after(b"\n\n")
        .or_else(|| after(b"\n"))
        .or_else(sentence_end)
        .or_else(space)
        .filter(|&at| at > 0 && text.is_char_boundary(at))
        .unwrap_or(limit)
}

impl Chunker for TokenChunker {
    fn chunk(&self, document: &Document) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        self.chunk_each(document, &mut |chunk| {
            chunks.push(chunk);
            true
        });
        chunks
    }

    fn chunk_each(&self, document: &Document, each: &mut dyn FnMut(Chunk) -> bool) {
        if document.text.trim().is_empty() {
            return;
        }
        match self.whole(document) {
            Some(chunk) => {
                each(chunk);
            }
            None => self.split(document, each),
        }
    }

    fn count_tokens(&self, text: &str) -> usize {
        self.counter.count(text)
    }

    /// The overlap shrinks with the chunks.
    fn narrower(&self, max_tokens: usize) -> Option<Box<dyn Chunker>> {
        let max_tokens = max_tokens.max(1);
        let config = ChunkingConfig {
            tokenizer: None,
            max_tokens,
            overlap_tokens: (self.overlap_tokens * max_tokens / self.max_tokens.max(1))
                .min(max_tokens - 1),
            markdown: self.markdown_mode,
            wordpieces: self.fitted.as_ref().map(|fitted| fitted.fit.pieces),
        };
        let chunker = TokenChunker::counting_with(&config, Arc::clone(&self.counter)).ok()?;
        Some(Box::new(chunker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(max_tokens: usize, overlap_tokens: usize, markdown: Option<bool>) -> ChunkingConfig {
        ChunkingConfig {
            tokenizer: None,
            max_tokens,
            overlap_tokens,
            markdown,
            wordpieces: None,
        }
    }

    #[test]
    fn regression_a_tokenizer_file_without_end_was_read_until_memory_ran_out() {
        let dir = tempfile::tempdir().unwrap();
        // A sparse file one byte over the limit costs no disk to make.
        let sparse = dir.path().join("tokenizer.json");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(MAX_TOKENIZER_BYTES + 1)
            .unwrap();
        for path in ["/dev/zero", sparse.to_str().unwrap()] {
            let config = ChunkingConfig {
                tokenizer: Some(path.to_string()),
                ..config(100, 0, None)
            };
            let error = TokenChunker::for_config(&config).unwrap_err().to_string();
            assert!(error.contains(path), "{error}");
            assert!(error.contains("more than 64 MiB"), "{error}");
        }
    }

    fn document(doc_id: &str, source: &str, text: &str) -> Document {
        Document {
            doc_id: doc_id.into(),
            source: Arc::from(source),
            text: text.into(),
            metadata: None,
        }
    }

    #[test]
    fn chunks_handed_on_as_cut_are_the_chunks_and_stop_when_asked() {
        let config = ChunkingConfig {
            max_tokens: 16,
            overlap_tokens: 4,
            ..ChunkingConfig::default()
        };
        let chunker = TokenChunker::cl100k(&config).unwrap();
        let text = "The river rose in spring. Farmers moved their herds uphill. ".repeat(40);
        let doc = document("d", "d.txt", &text);
        let whole = chunker.chunk(&doc);
        assert!(whole.len() > 10, "{}", whole.len());

        // Another document chunked between two chunks of this one (a chunk
        // cut again narrower) changes none of them.
        let narrower = TokenChunker::cl100k(&ChunkingConfig {
            max_tokens: 4,
            overlap_tokens: 0,
            ..ChunkingConfig::default()
        })
        .unwrap();
        let mut handed = Vec::new();
        chunker.chunk_each(&doc, &mut |chunk| {
            assert!(!narrower
                .chunk(&document("e", "e.txt", &chunk.text))
                .is_empty());
            handed.push(chunk);
            true
        });
        assert_eq!(handed, whole);

        let mut first = Vec::new();
        chunker.chunk_each(&doc, &mut |chunk| {
            first.push(chunk);
            first.len() < 3
        });
        assert_eq!(first, whole[..3]);
    }

    /// A word-level tokenizer over a tiny vocabulary, with truncation,
    /// padding and `[CLS]`/`[SEP]` special tokens that must not affect counts.
    fn word_level_tokenizer() -> tokenizers::Tokenizer {
        let json = r#"{
          "version": "1.0",
          "truncation": {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0},
          "padding": {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": null,
                      "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
          "added_tokens": [
            {"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
          ],
          "normalizer": null,
          "pre_tokenizer": {"type": "Whitespace"},
          "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
          "decoder": null,
          "model": {"type": "WordLevel", "unk_token": "[UNK]",
                    "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
                              "the": 4, "cat": 5, "sat": 6, "on": 7, "mat": 8}}
        }"#;
        json.parse().expect("test tokenizer")
    }

    #[test]
    fn chunks_that_must_fit_word_pieces_too_hold_no_more_of_them() {
        // Prose, and lines of hexadecimal ids, which `bert-base-uncased`
        // splits into a quarter more pieces than `cl100k_base` counts
        // tokens (139 against 113 for twelve lines; the prose counts 12
        // against 13).
        let mut text = String::new();
        for paragraph in 0..6 {
            text.push_str("the river levels rose slowly after the storm and then fell. ");
            text.push_str("\n\n");
            for row in 0..12 {
                text.push_str(&format!(
                    "0x{:08x}{:08x}\n",
                    paragraph * 977 + row,
                    row * 7919
                ));
            }
            text.push('\n');
        }
        let doc = document("ids.txt", "ids.txt", &text);
        let pieces = |chunk: &Chunk| wordpiece::server_pieces(&chunk.text);
        let plain = TokenChunker::cl100k(&config(120, 0, Some(false))).unwrap();
        let chunks = plain.chunk(&doc);
        assert!(chunks.iter().any(|c| pieces(c) > 100), "{chunks:#?}");
        // Within 100 pieces too: every chunk holds no more, and still no
        // more than 120 tokens, each counted as `cl100k_base` counts it.
        let config = ChunkingConfig {
            wordpieces: Some(100),
            ..config(120, 0, Some(false))
        };
        let fitted = TokenChunker::cl100k(&config).unwrap();
        let chunks = fitted.chunk(&doc);
        for chunk in &chunks {
            assert!(
                pieces(chunk) <= 100,
                "{} pieces: {}",
                pieces(chunk),
                chunk.text
            );
            assert!(chunk.token_count <= 120, "{chunk:?}");
            assert_eq!(chunk.token_count as usize, plain.count_tokens(&chunk.text));
            assert_eq!(
                chunk.text,
                &text[chunk.byte_start as usize..chunk.byte_end as usize]
            );
        }
        // Only the chunks over the pieces are cut again: the others are as
        // the job's count alone cuts them.
        let span = |c: &Chunk| (c.byte_start, c.byte_end);
        let plain_chunks = plain.chunk(&doc);
        let kept: Vec<_> = plain_chunks
            .iter()
            .filter(|c| pieces(c) <= 100)
            .map(span)
            .collect();
        let spans: Vec<_> = chunks.iter().map(span).collect();
        assert!(!kept.is_empty() && chunks.len() > plain_chunks.len());
        assert!(kept.iter().all(|s| spans.contains(s)), "{kept:?} {spans:?}");
        // A document within the tokens but over the pieces is not one chunk.
        let short: String = text.lines().take(12).collect::<Vec<_>>().join("\n");
        let doc = document("short.txt", "short.txt", &short);
        assert!(plain.count_tokens(&short) <= 120 && wordpiece::server_pieces(&short) > 100);
        assert!(fitted.chunk(&doc).len() > 1);
        // A chunker cut narrower for a refused chunk keeps the pieces.
        let narrower = fitted.narrower(60).unwrap();
        let chunks = narrower.chunk(&document("ids.txt", "ids.txt", &text));
        assert!(chunks
            .iter()
            .all(|c| pieces(c) <= 100 && c.token_count <= 60));
    }

    #[test]
    fn a_short_document_is_one_chunk_with_its_hash() {
        let chunker = TokenChunker::cl100k(&config(16, 0, None)).unwrap();
        let chunks = chunker.chunk(&document("notes/a.txt", "notes/a.txt", "Hello, world.\n"));
        assert_eq!(chunks.len(), 1);
        let chunk = &chunks[0];
        assert_eq!(chunk.id, "notes/a.txt#0");
        assert_eq!(chunk.chunk_index, 0);
        assert_eq!(chunk.text, "Hello, world.");
        assert_eq!((chunk.byte_start, chunk.byte_end), (0, 13));
        assert_eq!(chunk.token_count, 4);
        // printf 'Hello, world.' | sha256sum
        assert_eq!(
            chunk.content_hash_hex(),
            "f8c3bf62a9aa3e6fc1619c250e48abe7519373d3edf41be62eb5dc45199af2ef"
        );
        assert_eq!(
            hex::encode(content_hash("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn whitespace_only_documents_give_no_chunks() {
        let chunker = TokenChunker::cl100k(&config(16, 4, None)).unwrap();
        for text in ["", " ", "\n\n\t  \r\n", "\u{3000}\u{a0}"] {
            assert!(
                chunker.chunk(&document("d", "d.md", text)).is_empty(),
                "{text:?}"
            );
            assert!(
                chunker.chunk(&document("d", "d.txt", text)).is_empty(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn markdown_keeps_a_heading_with_its_section() {
        let text = "# Alpha\n\nThe alpha section talks about the first letter of the alphabet.\n\n\
                    # Beta\n\nThe beta section talks about the second letter of the alphabet.\n";
        let chunker = TokenChunker::cl100k(&config(20, 0, None)).unwrap();
        let whole = chunker.count_tokens(text.trim());
        assert!(
            whole > 20,
            "the sections must not fit together ({whole} tokens)"
        );

        let chunks = chunker.chunk(&document("letters.md", "docs/letters.MD", text));
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "# Alpha\n\nThe alpha section talks about the first letter of the alphabet.",
                "# Beta\n\nThe beta section talks about the second letter of the alphabet.",
            ]
        );
    }

    #[test]
    fn markdown_is_chosen_by_config_or_extension() {
        let chunker = |markdown| TokenChunker::cl100k(&config(32, 0, markdown)).unwrap();
        let doc = |source: &str| document("d", source, "text");
        assert!(chunker(None).is_markdown(&doc("a/b.md")));
        assert!(chunker(None).is_markdown(&doc("a/b.Markdown")));
        assert!(!chunker(None).is_markdown(&doc("a/b.txt")));
        assert!(!chunker(None).is_markdown(&doc("a/md")));
        assert!(chunker(Some(true)).is_markdown(&doc("a/b.txt")));
        assert!(!chunker(Some(false)).is_markdown(&doc("a/b.md")));
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(matches!(
            TokenChunker::cl100k(&config(0, 0, None)),
            Err(ChunkError::ZeroMaxTokens)
        ));
        assert!(matches!(
            TokenChunker::cl100k(&config(10, 10, None)),
            Err(ChunkError::OverlapTooLarge {
                overlap_tokens: 10,
                max_tokens: 10
            })
        ));
    }

    #[test]
    fn a_hugging_face_tokenizer_counts_without_truncation_padding_or_special_tokens() {
        let chunker =
            TokenChunker::with_tokenizer(&config(4, 0, Some(false)), word_level_tokenizer())
                .unwrap();
        assert_eq!(chunker.count_tokens("the cat sat on the mat"), 6);
        assert_eq!(chunker.count_tokens("the dog 日本"), 3);
        assert_eq!(chunker.count_tokens(""), 0);

        let chunks = chunker.chunk(&document("d", "d.txt", "the cat sat on the mat"));
        assert!(chunks.len() >= 2, "{chunks:?}");
        for chunk in &chunks {
            assert!(chunk.token_count <= 4, "{chunk:?}");
            assert_eq!(
                chunk.token_count as usize,
                chunker.count_tokens(&chunk.text)
            );
        }
        let total: u32 = chunks.iter().map(|c| c.token_count).sum();
        assert_eq!(total, 6);
    }

    #[test]
    fn bert_base_uncased_is_built_in_with_its_two_special_tokens() {
        let named = ChunkingConfig {
            tokenizer: Some(BERT_WORDPIECE.to_string()),
            ..config(8, 0, Some(false))
        };
        let chunker = TokenChunker::for_config(&named).unwrap();
        // As all-MiniLM-L6-v2's tokenizer.json counts them.
        assert_eq!(chunker.count_tokens("Hello, world!"), 4);
        assert_eq!(chunker.count_tokens("getentropy"), 4);
        assert_eq!(special_tokens(&named).unwrap(), 2);
        assert_eq!(chunker.special_tokens(), 2);
        let plain = config(8, 0, Some(false));
        assert_eq!(special_tokens(&plain).unwrap(), 0);
        assert_eq!(
            TokenChunker::for_config(&plain).unwrap().special_tokens(),
            0
        );
    }

    const FRAGMENTS: &[&str] = &[
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "é",
        "café",
        "naïve",
        "日本",
        "日本語のテキスト",
        "🦀",
        "👨\u{200d}👩\u{200d}👧",
        "e\u{301}",
        ".",
        ",",
        "!",
        "?",
        " ",
        " ",
        " ",
        "   ",
        "\t",
        "\n",
        "\n",
        "\n\n",
        "\r\n",
        "# ",
        "## ",
        "### ",
        "- ",
        "* ",
        "1. ",
        "> ",
        "```",
        "`code`",
        "**bold**",
        "[link](http://x.y)",
        "|a|b|",
        "\u{a0}",
        "supercalifragilisticexpialidocious",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "0123456789012345678901234567890123456789",
    ];

    fn document_text() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(FRAGMENTS), 0..250).prop_map(|f| f.concat())
    }

    fn chunking() -> impl Strategy<Value = ChunkingConfig> {
        (8usize..200)
            .prop_flat_map(|max| (Just(max), 0..max.div_ceil(2)))
            .prop_flat_map(|(max, overlap)| {
                (
                    Just(max),
                    prop_oneof![Just(0), Just(overlap)],
                    prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
                )
            })
            .prop_map(|(max_tokens, overlap_tokens, markdown)| ChunkingConfig {
                tokenizer: None,
                max_tokens,
                overlap_tokens,
                markdown,
                wordpieces: None,
            })
    }

    fn check_invariants(
        chunker: &TokenChunker,
        config: &ChunkingConfig,
        doc: &Document,
    ) -> Result<(), TestCaseError> {
        let text = doc.text.as_str();
        let chunks = chunker.chunk(doc);
        let mut covered = vec![false; text.len()];
        let mut previous: Option<&Chunk> = None;
        for (i, chunk) in chunks.iter().enumerate() {
            let (start, end) = (chunk.byte_start as usize, chunk.byte_end as usize);
            prop_assert!(start < end && end <= text.len(), "{chunk:?}");
            prop_assert!(text.is_char_boundary(start) && text.is_char_boundary(end));
            prop_assert_eq!(&text[start..end], chunk.text.as_str());
            prop_assert_eq!(chunk.chunk_index as usize, i);
            prop_assert_eq!(&chunk.id, &format!("{}#{}", doc.doc_id, i));
            prop_assert_eq!(&*chunk.doc_id, doc.doc_id.as_str());
            prop_assert_eq!(&chunk.source, &doc.source);
            prop_assert_eq!(chunk.content_hash, content_hash(&chunk.text));
            prop_assert!(chunk.token_count as usize <= config.max_tokens, "{chunk:?}");
            prop_assert_eq!(
                chunk.token_count as usize,
                chunker.count_tokens(&chunk.text)
            );
            if let Some(previous) = previous {
                prop_assert!(previous.byte_start <= chunk.byte_start);
                if config.overlap_tokens == 0 {
                    prop_assert!(
                        previous.byte_end <= chunk.byte_start,
                        "{previous:?} {chunk:?}"
                    );
                }
            }
            covered[start..end].fill(true);
            previous = Some(chunk);
        }
        for (i, c) in text.char_indices() {
            prop_assert!(
                c.is_whitespace() || covered[i],
                "byte {i} ({c:?}) is in no chunk"
            );
        }
        prop_assert_eq!(
            &chunks,
            &chunker.chunk(doc),
            "chunking is not deterministic"
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn cl100k_chunks_keep_their_invariants(
            text in document_text(),
            config in chunking(),
            source in prop::sample::select(&["a.md", "b.txt", "C.MARKDOWN", "rows.jsonl"][..]),
        ) {
            let doc = document("doc", source, &text);
            let chunker = TokenChunker::cl100k(&config).unwrap();
            check_invariants(&chunker, &config, &doc)?;
            // A second chunker built from the same config agrees.
            let again = TokenChunker::cl100k(&config).unwrap();
            prop_assert_eq!(chunker.chunk(&doc), again.chunk(&doc));
        }

        #[test]
        fn a_document_that_fits_is_chunked_as_the_splitter_chunks_it(
            text in prop_oneof![
                document_text(),
                prop::collection::vec(prop::sample::select(FRAGMENTS), 0..12).prop_map(|f| f.concat()),
            ],
            config in chunking(),
            hugging_face in any::<bool>(),
        ) {
            let doc = document("doc", "b.txt", &text);
            let chunker = if hugging_face {
                TokenChunker::with_tokenizer(&config, word_level_tokenizer()).unwrap()
            } else {
                TokenChunker::cl100k(&config).unwrap()
            };
            prop_assume!(!text.trim().is_empty());
            if let Some(whole) = chunker.whole(&doc) {
                let mut split = Vec::new();
                chunker.split(&doc, &mut |chunk| {
                    split.push(chunk);
                    true
                });
                prop_assert_eq!(vec![whole], split);
            }
        }

        #[test]
        fn hugging_face_chunks_keep_their_invariants(
            text in document_text(),
            config in chunking(),
        ) {
            let doc = document("doc", "a.md", &text);
            let chunker = TokenChunker::with_tokenizer(&config, word_level_tokenizer()).unwrap();
            check_invariants(&chunker, &config, &doc)?;
        }
    }

    /// Texts of one shape, `bytes` long: words with a line end every so
    /// often (the baseline), words on one line, letters without a space, and
    /// a DNA-like run of four letters.
    fn shaped(shape: &str, bytes: usize) -> String {
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let words = [
            "vector",
            "index",
            "token",
            "batch",
            "embedding",
            "service",
            "chunk",
        ];
        let mut text = String::with_capacity(bytes + 16);
        let mut n = 0;
        while text.len() < bytes {
            match shape {
                "lines" | "one line" => {
                    text.push_str(words[next(words.len() as u64) as usize]);
                    n += 1;
                    text.push_str(if shape == "lines" && n % 12 == 0 {
                        ".\n"
                    } else {
                        " "
                    });
                }
                "no space" => text.push(char::from(b'a' + next(26) as u8)),
                _ => text.push(char::from(b"ACGT"[next(4) as usize])),
            }
        }
        text
    }

    /// Bytes whose tokens were counted to chunk `text`, per byte of it.
    fn work_per_byte(chunker: &TokenChunker, text: &str) -> f64 {
        COUNTED_BYTES.with(|n| n.set(0));
        let chunks = chunker.chunk(&document("d", "d.txt", text));
        assert!(!chunks.is_empty());
        COUNTED_BYTES.with(std::cell::Cell::get) as f64 / text.len() as f64
    }

    /// Chunking a long line, or text without a space, sized the whole rest
    /// of the document for every chunk: 4 MB on one line took 82 s, 1 MB
    /// without a space 138 s. The work per byte (bytes tokenized to place
    /// the chunks, not time) must not grow with the length of a line.
    #[test]
    fn regression_chunking_work_grew_with_the_length_of_a_line() {
        let chunker = TokenChunker::cl100k(&config(64, 8, Some(false))).unwrap();
        let baseline = work_per_byte(&chunker, &shaped("lines", 128 << 10));
        for shape in ["lines", "one line", "no space", "dna"] {
            let short = work_per_byte(&chunker, &shaped(shape, 32 << 10));
            let long = work_per_byte(&chunker, &shaped(shape, 128 << 10));
            eprintln!("{shape}: {short:.1} bytes sized per byte at 32 KiB, {long:.1} at 128 KiB");
            assert!(
                long <= short * 1.25,
                "{shape}: {long:.1} bytes sized per byte at 128 KiB, {short:.1} at 32 KiB"
            );
            assert!(
                long <= baseline * 10.0,
                "{shape}: {long:.1} bytes sized per byte, text with lines {baseline:.1}"
            );
        }
    }

    #[test]
    fn windows_cover_the_text_in_order_and_end_at_breaks() {
        let text = "First paragraph here.\n\nSecond one, longer. It goes on.\nA line.\n\nThird.";
        for size in [8, 13, 20, 40, 1000] {
            let windows: Vec<(usize, &str)> = windows(text, size).collect();
            let mut at = 0;
            for (start, window) in &windows {
                assert_eq!(*start, at, "size {size}");
                assert!(window.len() <= size.max(8), "size {size}: {window:?}");
                at += window.len();
            }
            assert_eq!(at, text.len(), "size {size}");
        }
        let cut: Vec<&str> = windows(text, 40).map(|(_, w)| w).collect();
        assert_eq!(
            cut[0], "First paragraph here.\n\n",
            "a blank line is the best break"
        );
        let accents = "é".repeat(100);
        assert!(windows(&accents, 9).all(|(_, w)| w.chars().count() == 4));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]

        /// Documents longer than a window keep every invariant across its cuts.
        #[test]
        fn long_documents_keep_their_invariants_across_windows(
            shape in prop::sample::select(&["lines", "one line", "no space", "dna"][..]),
            bytes in 17_000usize..40_000,
            overlap in prop_oneof![Just(0usize), Just(8)],
        ) {
            let config = config(64, overlap, Some(false));
            let chunker = TokenChunker::cl100k(&config).unwrap();
            let doc = document("doc", "long.txt", &shaped(shape, bytes));
            prop_assert!(doc.text.len() > chunker.window_bytes());
            check_invariants(&chunker, &config, &doc)?;
        }
    }

    /// Deterministic mixed markdown and plain text, about `bytes` long.
    fn corpus(bytes: usize) -> Vec<Document> {
        const WORDS: &[&str] = &[
            "the",
            "embedding",
            "service",
            "returns",
            "vectors",
            "for",
            "each",
            "chunk",
            "of",
            "text",
            "and",
            "a",
            "job",
            "writes",
            "them",
            "to",
            "parquet",
            "café",
            "日本語",
            "tokens",
            "request",
            "model",
            "index",
            "batch",
            "retry",
            "cost",
            "estimate",
            "🦀",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut docs = Vec::new();
        let mut total = 0;
        while total < bytes {
            let markdown = docs.len() % 2 == 0;
            let mut text = String::new();
            while text.len() < 20_000 {
                if markdown && next(6) == 0 {
                    text.push_str(["# ", "## ", "### "][next(3)]);
                    text.push_str("Section heading\n\n");
                }
                let sentences = 1 + next(6);
                for _ in 0..sentences {
                    if markdown && next(5) == 0 {
                        text.push_str("- ");
                    }
                    for w in 0..4 + next(14) {
                        if w > 0 {
                            text.push(' ');
                        }
                        text.push_str(WORDS[next(WORDS.len())]);
                    }
                    text.push('.');
                    text.push_str(if next(3) == 0 { "\n" } else { " " });
                }
                text.push_str("\n\n");
            }
            total += text.len();
            let name = format!("doc{}.{}", docs.len(), if markdown { "md" } else { "txt" });
            docs.push(document(&name, &name, &text));
        }
        docs
    }

    /// Chunking throughput; run with
    /// `cargo test --release --lib chunk::tests::throughput -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn throughput() {
        let docs = corpus(5_000_000);
        let bytes: usize = docs.iter().map(|d| d.text.len()).sum();
        let chunker = TokenChunker::cl100k(&ChunkingConfig::default()).unwrap();
        chunker.count_tokens("load the encoding before timing");

        let started = std::time::Instant::now();
        let chunks: Vec<Chunk> = docs.iter().flat_map(|d| chunker.chunk(d)).collect();
        let elapsed = started.elapsed().as_secs_f64();

        let started = std::time::Instant::now();
        let recount: usize = chunks.iter().map(|c| chunker.count_tokens(&c.text)).sum();
        let recount_elapsed = started.elapsed().as_secs_f64();
        assert_eq!(
            recount,
            chunks.iter().map(|c| c.token_count as usize).sum::<usize>()
        );

        println!(
            "{} documents, {:.1} MB, {} chunks in {:.2} s: {:.0} chunks/s, {:.2} MB/s \
             (encoding every chunk again would add {:.2} s)",
            docs.len(),
            bytes as f64 / 1e6,
            chunks.len(),
            elapsed,
            chunks.len() as f64 / elapsed,
            bytes as f64 / 1e6 / elapsed,
            recount_elapsed,
        );
    }
}
