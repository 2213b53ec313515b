//! A model's context window as self-hosted servers keep it, counted in the
//! server's own tokens: it reads only the first tokens of a longer input
//! (infinity, TEI with `truncate`, Ollama), or refuses the input in the
//! words of OpenAI, TEI, vLLM or llama.cpp's server.
//!
//! The server's tokens are word pieces, not cl100k's: a run of letters or
//! digits is one piece per [`PIECE_CHARS`] characters (rounded up), any
//! other character but white space is a piece of its own. So the client's
//! count and the server's differ, as they do against a real WordPiece model.
//! Or it counts as a model does: `bert-base-uncased`'s WordPiece (all-MiniLM,
//! BGE, E5), or a model's own `tokenizer.json`, with the special tokens the
//! model adds.

use std::sync::Arc;

use axum::http::StatusCode;

use super::error::ApiError;
use super::vectors::text_digest;
use crate::chunk::wordpiece;

/// Characters of a word one server token holds.
pub const PIECE_CHARS: usize = 6;

/// What the server does with an input longer than its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverWindow {
    /// Embeds the first tokens only, silently.
    Truncate,
    /// 400 `context_length_exceeded`, as OpenAI answers.
    OpenAi,
    /// 422 "Input validation error", as TEI answers.
    Tei,
    /// 400 "maximum context length", as vLLM answers.
    Vllm,
    /// 500 "too large to process. increase the physical batch size", as
    /// llama.cpp's server answers for an embedding model (the whole input
    /// must fit one physical batch, 512 tokens by default).
    LlamaCpp,
    /// 400 `exceed_context_size_error`, as llama.cpp's server answers an
    /// input longer than a slot's context.
    LlamaCppContext,
    /// As [`OverWindow::LlamaCpp`], without the numbers, as older builds of
    /// llama.cpp's server word it: the refusal does not say the window.
    LlamaCppBare,
}

/// The modes of `--window`, as typed.
const MODES: &str = "truncate|openai|tei|vllm|llamacpp|llamacpp-context|llamacpp-bare";

/// How the server counts its tokens.
#[derive(Clone, Debug)]
pub enum Counting {
    /// The word pieces of [`server_tokens`].
    Pieces,
    /// As `bert-base-uncased`'s WordPiece tokenizer counts, as all-MiniLM,
    /// BGE and E5 servers do, the window holding the `[CLS]` and `[SEP]`
    /// the model adds (`TOKENS:MODE:wordpiece`).
    WordPiece,
    /// As the model's own `tokenizer.json` at `path` counts, the window
    /// holding the `special` tokens its post-processor adds
    /// (`TOKENS:MODE:tokenizer=PATH`).
    Tokenizer {
        path: String,
        tokenizer: Arc<tokenizers::Tokenizer>,
        special: u32,
    },
}

impl PartialEq for Counting {
    fn eq(&self, other: &Counting) -> bool {
        match (self, other) {
            (Counting::Pieces, Counting::Pieces) | (Counting::WordPiece, Counting::WordPiece) => {
                true
            }
            (Counting::Tokenizer { path: a, .. }, Counting::Tokenizer { path: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl Eq for Counting {}

impl Counting {
    /// The tokens the model adds to every text.
    fn special(&self) -> u32 {
        match self {
            Counting::Pieces => 0,
            Counting::WordPiece => SPECIAL_TOKENS,
            Counting::Tokenizer { special, .. } => *special,
        }
    }

    /// Where each token of `text` ends, in bytes, the special tokens left
    /// out; `None` if the tokenizer cannot encode it.
    fn ends(&self, text: &str) -> Option<Vec<usize>> {
        match self {
            Counting::Pieces => Some(piece_ends(text).collect()),
            Counting::WordPiece => wordpiece::ends(text),
            Counting::Tokenizer { tokenizer, .. } => {
                let encoding = tokenizer.encode(text, false).ok()?;
                Some(encoding.get_offsets().iter().map(|&(_, end)| end).collect())
            }
        }
    }

    /// The tokens of `text`, the special ones left out.
    fn count(&self, text: &str) -> u64 {
        let counted = match self {
            Counting::Pieces => None,
            Counting::WordPiece => wordpiece::count(text),
            Counting::Tokenizer { tokenizer, .. } => {
                tokenizer.encode_fast(text, false).ok().map(|e| e.len())
            }
        };
        counted.map_or_else(|| server_tokens(text), |n| n as u64)
    }
}

/// A window every embedding model of the simulator keeps, in server tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerWindow {
    pub tokens: u32,
    pub over: OverWindow,
    /// How the server counts them.
    pub counting: Counting,
}

/// What follows `--window TOKENS:MODE`, as typed.
const COUNTINGS: &str = "[:wordpiece|:tokenizer=PATH]";

impl ServerWindow {
    /// Reads `--window TOKENS:MODE[:wordpiece|:tokenizer=PATH]`, a mode of
    /// [`MODES`]; `PATH` is a model's `tokenizer.json`.
    ///
    /// # Errors
    /// A message naming the flag.
    pub fn parse(spec: &str) -> Result<ServerWindow, String> {
        let (window_spec, counting) = if let Some(rest) = spec.strip_suffix(":wordpiece") {
            (rest, Counting::WordPiece)
        } else if let Some((rest, path)) = spec.split_once(":tokenizer=") {
            (rest, tokenizer_counting(spec, path)?)
        } else {
            (spec, Counting::Pieces)
        };
        let (tokens, over) = window_spec
            .split_once(':')
            .ok_or_else(|| format!("--window {spec}: expected TOKENS:{MODES}{COUNTINGS}"))?;
        let tokens: u32 = tokens
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("--window {spec}: '{tokens}' is not a number of tokens"))?;
        let over = match over.trim() {
            "truncate" => OverWindow::Truncate,
            "openai" => OverWindow::OpenAi,
            "tei" => OverWindow::Tei,
            "vllm" => OverWindow::Vllm,
            "llamacpp" => OverWindow::LlamaCpp,
            "llamacpp-context" => OverWindow::LlamaCppContext,
            "llamacpp-bare" => OverWindow::LlamaCppBare,
            other => return Err(format!("--window {spec}: '{other}' is not one of {MODES}")),
        };
        let special = counting.special();
        if special > 0 && tokens <= special {
            let noun = if special == 1 { "token" } else { "tokens" };
            return Err(format!(
                "--window {spec}: the model adds {special} special {noun} to every text, and \
                 its window must hold more"
            ));
        }
        Ok(ServerWindow {
            tokens,
            over,
            counting,
        })
    }

    /// Refuses the first input over the window, when the server refuses.
    pub(crate) fn check<'a>(&self, texts: impl Iterator<Item = &'a str>) -> Result<(), ApiError> {
        if self.over == OverWindow::Truncate {
            return Ok(());
        }
        for text in texts {
            let given = self.count(text);
            if given > u64::from(self.tokens) {
                return Err(refusal(self.over, self.tokens, given));
            }
        }
        Ok(())
    }

    /// The part of `text` the model reads, when it is not all of it.
    pub fn read_part<'a>(&self, text: &'a str) -> Option<&'a str> {
        if self.over != OverWindow::Truncate {
            return None;
        }
        let room = (self.tokens - self.counting.special()) as usize;
        // On a character's boundary, whatever the tokenizer's offsets.
        let end = crate::secret::floor_char(text, *self.counting.ends(text)?.get(room - 1)?);
        (end < text.len() && !text[end..].trim().is_empty()).then(|| &text[..end])
    }

    /// The server's count of `text`, the special tokens it adds included.
    pub fn count(&self, text: &str) -> u64 {
        self.counting.count(text) + u64::from(self.counting.special())
    }
}

/// Counting as the `tokenizer.json` at `path` does, for `--window {spec}`:
/// truncation and padding off, the special tokens its post-processor adds.
fn tokenizer_counting(spec: &str, path: &str) -> Result<Counting, String> {
    let fail = |e: &dyn std::fmt::Display| format!("--window {spec}: {e}");
    let mut tokenizer = crate::chunk::read_tokenizer(path, &format!("--window {spec}"))
        .map_err(|e| e.to_string())?;
    tokenizer.with_truncation(None).map_err(|e| fail(&e))?;
    tokenizer.with_padding(None);
    let special = tokenizer
        .get_post_processor()
        .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
    Ok(Counting::Tokenizer {
        path: path.to_string(),
        tokenizer: Arc::new(tokenizer),
        special: u32::try_from(special).map_err(|e| fail(&e))?,
    })
}

/// The `[CLS]` and `[SEP]` a WordPiece model adds to every text.
const SPECIAL_TOKENS: u32 = 2;

/// What the model reads of a request's inputs.
pub(crate) struct Read {
    /// The digest each vector is made from: the whole text's, or that of
    /// the part a truncating window reads.
    pub digests: Vec<[u8; 32]>,
    /// Hex SHA-256 of each whole text, as the ledger keys texts.
    pub whole: Vec<String>,
    /// Of `whole`, those of the texts read only in part.
    pub partly_read: Vec<String>,
}

pub(crate) fn read<'a>(
    window: Option<&ServerWindow>,
    texts: impl Iterator<Item = &'a str>,
) -> Read {
    let mut read = Read {
        digests: Vec::new(),
        whole: Vec::new(),
        partly_read: Vec::new(),
    };
    for text in texts {
        let whole = hex::encode(text_digest(text));
        match window.and_then(|w| w.read_part(text)) {
            Some(part) => {
                read.digests.push(text_digest(part));
                read.partly_read.push(whole.clone());
            }
            None => read.digests.push(text_digest(text)),
        }
        read.whole.push(whole);
    }
    read
}

/// The server's count of `text`.
pub fn server_tokens(text: &str) -> u64 {
    piece_ends(text).count() as u64
}

/// The byte offset where each server token of `text` ends, in order.
fn piece_ends(text: &str) -> impl Iterator<Item = usize> + '_ {
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || loop {
        let (at, c) = chars.next()?;
        if c.is_whitespace() {
            continue;
        }
        if !c.is_alphanumeric() {
            return Some(at + c.len_utf8());
        }
        let mut end = at + c.len_utf8();
        let mut length = 1;
        while length < PIECE_CHARS {
            match chars.next_if(|&(_, c)| c.is_alphanumeric()) {
                Some((at, c)) => {
                    end = at + c.len_utf8();
                    length += 1;
                }
                None => break,
            }
        }
        return Some(end);
    })
}

/// The refusal of an input of `given` tokens over a window of `limit`, in
/// the server's own words and status.
fn refusal(over: OverWindow, limit: u32, given: u64) -> ApiError {
    let (status, body) = match over {
        OverWindow::OpenAi | OverWindow::Truncate => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": {
                "message": format!(
                    "This model's maximum context length is {limit} tokens, however you \
                     requested {given} tokens ({given} in your prompt; 0 for the completion). \
                     Please reduce your prompt; or completion length."
                ),
                "type": "invalid_request_error",
                "param": null,
                "code": "context_length_exceeded",
            }}),
        ),
        OverWindow::Tei => (
            StatusCode::UNPROCESSABLE_ENTITY,
            serde_json::json!({
                "error": format!(
                    "Input validation error: `inputs` must have less than {limit} tokens. \
                     Given: {given}"
                ),
                "error_type": "Validation",
            }),
        ),
        OverWindow::Vllm => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({
                "object": "error",
                "message": format!(
                    "This model's maximum context length is {limit} tokens. However, you \
                     requested {given} tokens in the input for embedding generation. Please \
                     reduce the length of the input."
                ),
                "type": "BadRequestError",
                "param": null,
                "code": 400,
            }),
        ),
        OverWindow::LlamaCpp => (
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"error": {
                "code": 500,
                "message": format!(
                    "input ({given} tokens) is too large to process. increase the physical \
                     batch size (current batch size: {limit})"
                ),
                "type": "server_error",
            }}),
        ),
        OverWindow::LlamaCppBare => (
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"error": {
                "code": 500,
                "message": "input is too large to process. increase the physical batch size",
                "type": "server_error",
            }}),
        ),
        OverWindow::LlamaCppContext => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": {
                "code": 400,
                "message": format!(
                    "request ({given} tokens) exceeds the available context size ({limit} \
                     tokens), try increasing it"
                ),
                "type": "exceed_context_size_error",
                "n_prompt_tokens": given,
                "n_ctx": limit,
            }}),
        ),
    };
    ApiError::new(status, "invalid_request_error", "over the context window")
        .answered_with("too_large", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_pieces_of_six_characters_and_marks_are_their_own() {
        assert_eq!(server_tokens(""), 0);
        assert_eq!(server_tokens("the model"), 2);
        assert_eq!(server_tokens("embeddings, too."), 5);
        assert_eq!(server_tokens("é ü"), 2);
    }

    #[test]
    fn a_truncating_window_reads_its_first_tokens_only() {
        let window = ServerWindow::parse("2:truncate").unwrap();
        assert_eq!(window.read_part("one two three"), Some("one two"));
        assert_eq!(window.read_part("one two"), None);
        assert_eq!(window.read_part("one two  "), None);
        assert!(window.check(["a b c d"].into_iter()).is_ok());
    }

    #[test]
    fn a_refusing_window_refuses_in_the_servers_words() {
        for (over, status) in [
            ("openai", 400),
            ("tei", 422),
            ("vllm", 400),
            ("llamacpp", 500),
            ("llamacpp-context", 400),
        ] {
            let window = ServerWindow::parse(&format!("2:{over}")).unwrap();
            assert!(window.check(["a b"].into_iter()).is_ok());
            let refused = window.check(["a b c"].into_iter()).unwrap_err();
            assert_eq!(refused.status.as_u16(), status, "{over}");
            assert!(refused.body.unwrap().to_string().contains('3'), "{over}");
        }
        let bare = ServerWindow::parse("2:llamacpp-bare").unwrap();
        let refused = bare.check(["a b c"].into_iter()).unwrap_err();
        assert_eq!(refused.status.as_u16(), 500);
        let body = refused.body.unwrap().to_string();
        assert!(
            body.contains("physical batch size") && !body.contains('3'),
            "{body}"
        );
    }

    #[test]
    fn a_wordpiece_window_counts_as_bert_base_uncased_with_its_special_tokens() {
        let window = ServerWindow::parse("5:truncate:wordpiece").unwrap();
        assert_eq!(window.counting, Counting::WordPiece);
        // [CLS] get ##ent ##rop [SEP]: three pieces of text are read.
        assert_eq!(window.count("getentropy"), 6);
        assert_eq!(window.read_part("getentropy now"), Some("getentrop"));
        assert_eq!(window.read_part("get it"), None);
        let refusing = ServerWindow::parse("5:tei:wordpiece").unwrap();
        assert!(refusing.check(["get it now"].into_iter()).is_ok());
        assert!(refusing.check(["getentropy"].into_iter()).is_err());
        assert!(ServerWindow::parse("2:truncate:wordpiece").is_err());
        // Text the normalizer changes the length of is cut as a prefix.
        for tokens in 3..12 {
            let window = ServerWindow::parse(&format!("{tokens}:truncate:wordpiece")).unwrap();
            for text in ["İstanbul ﬁle Straße ÉTÉ 漢字 \u{7}bell", "ǅ ŉ ΐ ﬃ ẞ"] {
                if let Some(part) = window.read_part(text) {
                    assert!(text.starts_with(part), "{part:?}");
                }
            }
        }
    }

    #[test]
    fn a_tokenizer_window_counts_as_the_models_own_tokenizer_with_its_special_tokens() {
        // A token a word, marks and all, and `<s>` before every text.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/word-tokenizer.json");
        let spec = |window: &str| format!("{window}:tokenizer={}", path.display());
        let window = ServerWindow::parse(&spec("3:truncate")).unwrap();
        // <s> getentropy, now.
        assert_eq!(window.count("getentropy, now."), 3);
        assert_eq!(
            window.read_part("getentropy, now. again"),
            Some("getentropy, now.")
        );
        assert_eq!(window.read_part("one two"), None);
        let refusing = ServerWindow::parse(&spec("3:tei")).unwrap();
        assert!(refusing.check(["one two"].into_iter()).is_ok());
        assert!(refusing.check(["one two three"].into_iter()).is_err());
        // The window holds the special token and more.
        let small = ServerWindow::parse(&spec("1:truncate")).unwrap_err();
        assert!(small.contains("adds 1 special token to"), "{small}");
        let missing =
            ServerWindow::parse("3:truncate:tokenizer=/nonexistent/tokenizer.json").unwrap_err();
        assert!(
            missing.contains("--window 3:truncate:tokenizer=/nonexistent/tokenizer.json"),
            "{missing}"
        );
    }

    #[test]
    fn a_window_spec_is_checked() {
        for bad in [
            "",
            "12",
            "0:tei",
            "x:tei",
            "12:cut",
            "99999999999:tei",
            "12:llama",
        ] {
            assert!(ServerWindow::parse(bad).is_err(), "{bad}");
        }
    }
}
