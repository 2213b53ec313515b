//! A window nobody lists, found before any chunking: a long text (pieces
//! of the job's own input, the densest first) is sent, and a refusal says
//! the window (OpenAI, TEI, vLLM and llama.cpp's server state it); a text
//! the server accepts is checked for silent truncation by embedding its
//! prefixes: a prefix with the whole text's vector shows where the server
//! stopped reading. The prefixes either side of the likeliest window go
//! first ([`guess`]), then a binary search over what is left.
//!
//! A refusal that does not say the window (older builds of llama.cpp's
//! server: "input is too large to process. increase the physical batch
//! size") is searched the same way: a prefix refused is past the window.
//!
//! Cost: one request with the whole text and the text less its last cut,
//! then, only when those two vectors are the same (or the request was
//! refused without the window said), one for each window guessed (two
//! against a server that refuses), at most [`GUESSES`], and
//! ⌈log2((n − 1) / ⌊n / 32⌋)⌉ requests of one prefix each
//! (at most 6), for a text cut in n prefixes: the search stops within a
//! 32nd of the text, well inside the 10% the window is cut by, since each
//! request is a round trip before the run starts. The text holds 5/4 of the
//! chunk size the job would use, so the search ends within that. Against a
//! WordPiece model whose window is the one guessed (all-MiniLM, BGE, E5 and
//! GTE models keep 512 or 256), the guess finds it to the word, and the
//! search has nothing left to do; so it does against any model whose own
//! `tokenizer.json` the job counts with ([`ModelCount`]).

use super::ApiBackend;
use crate::backend::{
    with_margin, BackendError, HeldProbe, LearnedWindow, ProbeCost, WindowSource,
    WINDOW_MARGIN_PERCENT,
};
use crate::chunk::wordpiece::server_pieces;
use crate::client::window_refusal;
use crate::job::{ChunkingConfig, BERT_WORDPIECE};
use crate::types::Vectors;

/// The binary search stops when the prefixes it has left to tell apart
/// are this part of the text or fewer: the window found is at most this
/// much short, against the 10% it is cut by.
const RESOLUTION: usize = 32;

/// Vectors closer than this (one less their cosine) are the same: a
/// server's arithmetic varies a little with the batch, a missing word does
/// more.
const SAME_VECTOR: f64 = 1e-5;

/// Plain words of varied lengths: the probe's text where the job's own is
/// too short, or cannot be read twice (stdin).
const WORDS: &[&str] = &[
    "the",
    "report",
    "describes",
    "how",
    "a",
    "small",
    "team",
    "measured",
    "water",
    "quality",
    "along",
    "northern",
    "rivers",
    "during",
    "several",
    "seasons",
    "and",
    "compared",
    "their",
    "results",
    "with",
    "earlier",
    "surveys",
    "from",
    "regional",
    "laboratories",
    "which",
    "used",
    "different",
    "methods",
    "for",
    "sampling",
    "sediment",
    "temperature",
    "oxygen",
    "levels",
    "in",
    "shallow",
    "streams",
    "near",
    "farms",
    "towns",
    "forests",
    "while",
    "volunteers",
    "recorded",
    "weather",
    "observations",
    "every",
    "morning",
    "before",
    "breakfast",
];

/// Characters a prefix of the probe's text grows by at most within a
/// word: text without spaces (CJK, minified data) is cut within its runs.
const CUT_CHARS: usize = 16;

/// Bytes of each piece of the job's input the probe's text is made of, for
/// chunks of `chunk_tokens`: half a chunk of prose (4 bytes a token), from
/// 256 bytes to 4 KiB, enough to tell how densely a piece counts and few
/// enough to count them all (256 pieces of 4 KiB at most).
pub(super) fn piece_bytes(chunk_tokens: usize) -> usize {
    chunk_tokens.saturating_mul(2).clamp(256, 4096)
}

/// The local tokens the probe's text holds, for chunks of `chunk_tokens`:
/// 5/4 of a chunk, so that the search ends within it.
fn probe_tokens(chunk_tokens: usize) -> usize {
    chunk_tokens.saturating_add(chunk_tokens / 4).max(2)
}

/// Where the prefixes of `text` may end: after each word, and every
/// [`CUT_CHARS`] characters within a longer one.
fn cuts(text: &str) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut run = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c.is_whitespace() {
            run = 0;
            continue;
        }
        run += 1;
        let ends_word = chars.peek().is_none_or(|(_, next)| next.is_whitespace());
        if ends_word || run % CUT_CHARS == 0 {
            cuts.push(at + c.len_utf8());
        }
    }
    cuts
}

/// How the model behind the server is taken to count, for the guess: its
/// tokens of a text, and the special tokens it adds to every text. A job
/// that counts with the model's own tokenizer (`chunking.tokenizer`, a
/// `tokenizer.json` or `bert-base-uncased`) tells it; one that counts in an
/// encoding is taken to face a WordPiece model, as most servers that list no
/// window run.
#[derive(Clone, Copy)]
pub(super) struct ModelCount<'a> {
    pub tokens: &'a (dyn Fn(&str) -> usize + Sync),
    pub special: usize,
}

impl<'a> ModelCount<'a> {
    /// `bert-base-uncased`'s WordPiece, with its `[CLS]` and `[SEP]`.
    pub(super) fn wordpiece() -> ModelCount<'static> {
        ModelCount {
            tokens: &server_pieces,
            special: 2,
        }
    }

    /// As a job whose `chunking` counts by `count` tells it: the job's own
    /// count, and the `special` tokens its tokenizer adds, where it counts
    /// with the model's tokenizer; else WordPiece.
    pub(super) fn of_job(
        chunking: &ChunkingConfig,
        count: &'a (dyn Fn(&str) -> usize + Sync),
        special: u64,
    ) -> ModelCount<'a> {
        if crate::job::named_encoding(tokenizer_name(chunking)) {
            return ModelCount::wordpiece();
        }
        ModelCount {
            tokens: count,
            special: usize::try_from(special).unwrap_or(usize::MAX),
        }
    }
}

/// The job's count of a text, and the model's as the guess takes it.
pub(super) type Counts<'a> = (&'a (dyn Fn(&str) -> usize + Sync), ModelCount<'a>);

/// The probe's text, and where its prefixes end.
struct ProbeText {
    text: String,
    cuts: Vec<usize>,
}

impl ProbeText {
    /// The job's own text (`pieces` of its input, see `source::sample`),
    /// so that the server's count is measured against the local one on
    /// text like the chunks', then plain words if it is too short, up to
    /// the shortest prefix that holds `tokens` local tokens by `count`.
    ///
    /// The pieces go densest first, as the `model` counts over the local
    /// count: the window is found where the server stops reading the text
    /// that counts the most tokens for it, the input's densest of the
    /// pieces sampled, so that chunks of lighter text fit it too. Only the
    /// first piece or two are read within a window, and a piece's start
    /// may be lighter than the whole of it: a chunk denser than those can
    /// still be read in part, and a job that counts as the model does
    /// (`chunking.tokenizer`) has none. A fixed list of plain
    /// words measured a window into which a reStructuredText corpus's
    /// chunks did not fit (its underlines count a token a character for a
    /// WordPiece model, and few for `cl100k_base`), and so did the input's
    /// first documents, where they were plain prose before such text.
    fn new(pieces: &[String], (count, model): Counts, tokens: usize) -> Self {
        let mut dense: Vec<(f64, usize, &str)> = pieces
            .iter()
            .map(|piece| {
                let piece = piece.trim();
                let local = count(piece);
                #[allow(clippy::cast_precision_loss)]
                let density = (model.tokens)(piece) as f64 / local.max(1) as f64;
                (density, local, piece)
            })
            .filter(|(_, _, piece)| !piece.is_empty())
            .collect();
        dense.sort_by(|a, b| b.0.total_cmp(&a.0));
        // Pieces until their counts add up to the tokens; the text's own
        // count is checked below.
        let (mut text, mut held) = (String::new(), 0);
        for (_, local, piece) in dense {
            if held >= tokens {
                break;
            }
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(piece);
            held += local;
        }
        while count(&text) < tokens || cuts(&text).len() < 2 {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&WORDS.join(" "));
        }
        let mut cuts = cuts(&text);
        // The first prefix that holds the tokens, by binary search.
        let holds = cuts.partition_point(|&end| count(&text[..end]) < tokens);
        cuts.truncate((holds + 1).clamp(2, cuts.len()));
        text.truncate(cuts.last().copied().unwrap_or(text.len()));
        ProbeText { text, cuts }
    }

    /// Prefixes there are, the whole text the last.
    fn len(&self) -> usize {
        self.cuts.len()
    }

    /// The text up to its `k`th cut; empty for 0.
    fn prefix(&self, k: usize) -> &str {
        k.checked_sub(1)
            .and_then(|i| self.cuts.get(i))
            .map_or("", |&end| &self.text[..end])
    }
}

/// Row `i` of `vectors`; empty when there is none.
fn row(vectors: &Vectors, i: usize) -> &[f32] {
    let d = vectors.dimensions.max(1);
    vectors.values.get(i * d..(i + 1) * d).unwrap_or_default()
}

/// Whether `x` and `y` are the same vector.
fn same(x: &[f32], y: &[f32]) -> bool {
    if x.is_empty() || x.len() != y.len() {
        return false;
    }
    let dot: f64 = x
        .iter()
        .zip(y)
        .map(|(p, q)| f64::from(*p) * f64::from(*q))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>().sqrt();
    let cosine = dot / (norm(x) * norm(y));
    cosine.is_finite() && 1.0 - cosine <= SAME_VECTOR
}

/// How the probe's binary search tells a prefix past the window.
enum Search {
    /// The server reads the start of a longer text only: a prefix with
    /// this vector, the whole text's, is past where it stops.
    Truncation(Vec<f32>),
    /// The server refuses a text over its window without saying the window.
    Refusal,
}

impl Search {
    fn source(&self) -> WindowSource {
        match self {
            Search::Truncation(_) => WindowSource::Truncation,
            Search::Refusal => WindowSource::Refusal,
        }
    }
}

/// What the probe found.
pub(super) struct Probed {
    pub window: Option<LearnedWindow>,
    pub cost: ProbeCost,
    /// Why it found nothing, when it could not finish.
    pub failed: Option<String>,
    /// The tokens of its text, when the server read it whole.
    pub read_whole: Option<u64>,
    /// What it could have cost, when that was more than the budget and it
    /// was not sent.
    pub over_budget: Option<HeldProbe>,
}

/// The most the probe sends, in texts as long as its longest: two in its
/// first request, two for each of at most [`GUESSES`] windows it guesses,
/// then one for each step of a binary search to a [`RESOLUTION`]th of the
/// text: at most six steps, since what is left to search, at most the n
/// prefixes, over the ⌊n / 32⌋ it stops within (at least one, and more
/// than n / 64 for n ≥ 32), is below 64.
const PROBE_TEXTS: u64 = 2 + 2 * GUESSES as u64 + 6;

/// The most windows the probe guesses: 512 and then 256, for a job's
/// default chunks, the windows of all-MiniLM, BGE, E5 and GTE models.
const GUESSES: usize = 2;

/// Windows are powers of two (512 for all-MiniLM, BGE, E5 and GTE models,
/// 256, 8192): the smallest the probe guesses.
const SMALLEST_GUESS: usize = 64;

/// The prefixes of `probe` either side of the likeliest window past its
/// prefix `lo` and short of its prefix `hi`, counted as the `model` counts:
/// the largest power of two in between. Below it, the last prefix whose
/// tokens, with the special tokens the model adds, leave one to spare
/// (read whole, whatever a server adds); above it, the first two tokens
/// past it (for a WordPiece model, with `[CLS]` and `[SEP]`, as many pieces
/// as the window). Against a server that counts otherwise, the guess is a
/// step of the search like any other.
fn guess(probe: &ProbeText, lo: usize, hi: usize, model: ModelCount) -> Option<(usize, usize)> {
    // The first prefix after `lo` and before `hi` whose tokens, with the
    // special ones, are `over`, by binary search (tokens grow with the
    // prefix); `hi` when there is none. Prefix `k` ends at cut `k - 1`.
    let first = |over: &dyn Fn(usize) -> bool| {
        let between = probe.cuts.get(lo..hi.saturating_sub(1)).unwrap_or_default();
        let counted = |end: usize| (model.tokens)(&probe.text[..end]).saturating_add(model.special);
        lo + 1 + between.partition_point(|&end| !over(counted(end)))
    };
    let whole = (model.tokens)(probe.prefix(hi)).saturating_add(model.special);
    let mut window = 1_usize << whole.max(1).ilog2();
    while window >= SMALLEST_GUESS {
        let below = first(&|t| t >= window).saturating_sub(1);
        let above = first(&|t| t >= window + 2);
        if lo < below && below < above && above < hi {
            return Some((below, above));
        }
        window /= 2;
    }
    None
}

impl ApiBackend {
    /// Where the server stops reading, tested at the prefixes `ks` of the
    /// probe's text, shortest first: the place in `ks` of the first past
    /// it, or `None` when it read them all. A server that truncates is sent
    /// them all in one request, its vectors telling; one that refuses, one
    /// a request up to the first refused.
    async fn first_past(
        &self,
        search: &Search,
        probe: &ProbeText,
        ks: &[usize],
        count: &(dyn Fn(&str) -> usize + Sync),
        cost: &mut ProbeCost,
    ) -> Result<Option<usize>, BackendError> {
        let texts: Vec<&str> = ks.iter().map(|&k| probe.prefix(k)).collect();
        let tokens = |texts: &[&str]| texts.iter().map(|text| count(text) as u64).sum();
        match search {
            Search::Truncation(whole) => {
                cost.requests += 1;
                let vectors = self.embed_all(&texts, tokens(&texts)).await?;
                Ok((0..texts.len()).position(|i| same(whole, row(&vectors, i))))
            }
            Search::Refusal => {
                for (i, &text) in texts.iter().enumerate() {
                    cost.requests += 1;
                    match self.embed_all(&[text], tokens(&[text])).await {
                        Ok(_) => {}
                        Err(BackendError::TooLarge { .. }) => return Ok(Some(i)),
                        Err(error) => return Err(error),
                    }
                }
                Ok(None)
            }
        }
    }

    /// Where the server stops reading the probe's text, short of its
    /// prefix `past`: the longest prefix found read whole (0 for none) and
    /// the shortest found past it. The prefixes either side of the
    /// likeliest window go first, while there is one, then one in the
    /// middle of what is left at a time.
    async fn search(
        &self,
        search: &Search,
        probe: &ProbeText,
        past: usize,
        (count, model): Counts<'_>,
        cost: &mut ProbeCost,
    ) -> Result<(usize, usize), BackendError> {
        let (mut lo, mut hi) = (0, past);
        let close = (probe.len() / RESOLUTION).max(1);
        // Windows left to guess; a range with no window to guess in holds
        // none as it narrows.
        let mut guesses = GUESSES;
        loop {
            let guessed = (guesses > 0).then(|| guess(probe, lo, hi, model)).flatten();
            guesses = if guessed.is_some() { guesses - 1 } else { 0 };
            let next = match guessed {
                Some((below, above)) => vec![below, above],
                None if hi - lo > close => vec![lo + (hi - lo) / 2],
                None => return Ok((lo, hi)),
            };
            let first = self.first_past(search, probe, &next, count, cost).await?;
            // Those before the first past were read whole.
            let read = first.unwrap_or(next.len());
            if let Some(&k) = read.checked_sub(1).and_then(|i| next.get(i)) {
                lo = k;
            }
            if let Some(&k) = first.and_then(|i| next.get(i)) {
                hi = k;
            }
        }
    }

    /// Looks for the window of a model that lists none, for chunks of
    /// `chunk_tokens` counted by `count` (the job's tokenizer), guessing it
    /// as the `model` counts ([`ModelCount`]). Sends
    /// nothing when what it may send, priced at the job's count, could cost
    /// more than `max_cost` (`budget.max_cost`): the probe is paid for
    /// before the budget's first request, and a budget smaller than it had
    /// it billed in full and the run stop before embedding anything. The
    /// run then stops at its first request, as over the budget: skipping
    /// the probe instead would store vectors of chunks a server that
    /// truncates silently read in part.
    pub(super) async fn probe_window(
        &self,
        (count, model): Counts<'_>,
        (chunk_tokens, pieces): (usize, &[String]),
        max_cost: Option<f64>,
    ) -> Probed {
        let probe = ProbeText::new(pieces, (count, model), probe_tokens(chunk_tokens));
        let prefix = |k: usize| probe.prefix(k);
        let tokens = |text: &str| count(text) as u64;
        let billed_before = self.billed.get().prompt_tokens;
        let mut probed = Probed {
            window: None,
            cost: ProbeCost::default(),
            failed: None,
            read_whole: None,
            over_budget: None,
        };
        let n = probe.len();
        let (whole, shorter) = (prefix(n), prefix(n - 1));
        let most = tokens(whole).saturating_mul(PROBE_TEXTS);
        #[allow(clippy::cast_precision_loss)]
        // The probe's requests are synchronous, at the synchronous price in
        // batch mode too.
        let price = self
            .batch
            .as_ref()
            .map_or(self.info.input_per_1k, |batch| batch.sync_input_per_1k);
        let could_cost = price.map(|price| most as f64 / 1000.0 * price);
        if let Some((cost, _)) = could_cost.zip(max_cost).filter(|(c, m)| c > m) {
            probed.over_budget = Some(HeldProbe { tokens: most, cost });
            return probed;
        }
        probed.cost.requests += 1;
        let first = self
            .embed_all(&[whole, shorter], tokens(whole) + tokens(shorter))
            .await;
        if let Ok(vectors) = &first {
            probed.cost.dimensions = Some(vectors.dimensions);
        }
        // The longest prefix the server reads whole lies below the first
        // that shows it stopped reading: found by binary search, to within a
        // `RESOLUTION`th of the text.
        let search = match first {
            Err(BackendError::TooLarge { message, .. }) => match window_refusal(&message) {
                Some(refusal) => {
                    probed.window = Some(LearnedWindow::from_refusal(
                        refusal.limit,
                        refusal.given,
                        tokens(whole),
                    ));
                    None
                }
                // Refused without the window said (older builds of
                // llama.cpp's server): a prefix refused is past it.
                None => Some((Search::Refusal, n)),
            },
            Err(error) => {
                probed.failed = Some(error.to_string());
                None
            }
            Ok(vectors) if !same(row(&vectors, 0), row(&vectors, 1)) => {
                probed.read_whole = Some(tokens(whole));
                None
            }
            // The server stopped reading within the last word: a prefix
            // with the whole text's vector is past where it stops.
            Ok(vectors) => Some((Search::Truncation(row(&vectors, 0).to_vec()), n - 1)),
        };
        if let Some((search, past)) = search {
            match self
                .search(&search, &probe, past, (count, model), &mut probed.cost)
                .await
            {
                Ok((lo, _)) if tokens(prefix(lo)) > 0 => {
                    let read = prefix(lo);
                    probed.window = Some(LearnedWindow {
                        server_tokens: None,
                        tokens: with_margin(tokens(read)),
                        from: search.source(),
                        // What was read, counted as a WordPiece model counts:
                        // chunks of text denser than this are cut to it too.
                        wordpieces: Some(with_margin(server_pieces(read) as u64)),
                    });
                }
                Ok((_, hi)) => {
                    probed.failed = Some(format!(
                        "the server refused every prefix of a long text, down to {} tokens",
                        tokens(prefix(hi))
                    ));
                }
                Err(error) => probed.failed = Some(error.to_string()),
            }
        }
        probed.cost.tokens = self
            .billed
            .get()
            .prompt_tokens
            .saturating_sub(billed_before);
        probed
    }
}

/// How a message tells a job that counts in an encoding to count as a
/// self-hosted model does, so that chunks fit its window whatever the text.
pub(super) const OWN_TOKENIZER: &str = "`chunking.tokenizer` to the model's own \
     (\"bert-base-uncased\" for all-MiniLM, BGE, E5 and GTE models, or its tokenizer.json) \
     to cut chunks as it counts, ";

/// The tokenizer chunks are counted in, as messages name it.
pub fn tokenizer_name(chunking: &ChunkingConfig) -> &str {
    chunking.tokenizer.as_deref().unwrap_or("cl100k_base")
}

/// What a message says of the word pieces chunks hold at most, if any.
fn word_pieces(window: LearnedWindow) -> String {
    window.wordpieces.map_or(String::new(), |pieces| {
        format!(" and {pieces} word pieces as {BERT_WORDPIECE} counts")
    })
}

/// What the service lists of `model`'s window: none, or `listed` tokens in
/// the model's own count, which the job's may not be.
pub(super) fn lists(model: &str, listed: Option<u64>) -> String {
    match listed {
        Some(listed) => format!(
            "model {model} lists a context window of {listed} tokens, counted by its own tokenizer"
        ),
        None => format!("model {model} lists no context window"),
    }
}

impl ApiBackend {
    /// Takes the window an earlier run learned, as its output, the
    /// checkpoint or the last summary records it; `listed` is the window
    /// the service lists in the model's own count, if any.
    pub(super) fn remember_window(
        &mut self,
        window: LearnedWindow,
        chunking: &ChunkingConfig,
        listed: Option<u64>,
    ) {
        self.info.context_window = Some(window.tokens);
        self.learned_window = Some(window);
        self.warn(format!(
            "{}: chunks are cut to {} {} tokens{}, the window an earlier run learned (its \
             output, checkpoint or summary records it); set `backend.context_window` to choose \
             another",
            lists(&self.info.model, listed),
            window.tokens,
            tokenizer_name(chunking),
            word_pieces(window)
        ));
    }

    /// Takes the window an earlier run cut the chunks the model refused
    /// to, as its output records it: chunks are cut as the job says, and
    /// those over the window into the same pieces, before they are sent.
    pub(super) fn remember_pieces(
        &mut self,
        window: LearnedWindow,
        chunking: &ChunkingConfig,
        listed: Option<u64>,
    ) {
        self.warn(format!(
            "{}: chunks over {} {} tokens are cut to that before they are sent, as an earlier \
             run cut those it refused (the output records it); set `backend.context_window` to \
             choose the window",
            lists(&self.info.model, listed),
            window.tokens,
            tokenizer_name(chunking)
        ));
    }

    /// The most word pieces a chunk may hold besides the job's tokens, as
    /// the window learned says ([`LearnedWindow::wordpieces`]).
    pub(super) fn wordpieces(&self) -> Option<usize> {
        let pieces = self.learned_window?.wordpieces?;
        usize::try_from(pieces).ok()
    }

    /// Takes the length of a text an earlier run's probe found the server
    /// reads whole, for the output to record again: the chunks are no
    /// longer, and nothing is probed.
    pub(super) fn remember_read_whole(&mut self, read_whole: Option<u64>) {
        self.read_whole = read_whole;
    }

    /// Takes what the probe found: the window chunks are cut to, and a
    /// warning that says it, in which tokens, and how to choose another;
    /// `unknown` says the window is unknown, or not known in the job's
    /// tokens, when the probe found none. `listed` is the window the probe
    /// checked, as the service lists it in the model's own count: a probe
    /// that finds the server reads a text longer than the chunks whole
    /// leaves the chunks as that window cuts them, and says nothing. With no
    /// window listed, that text's length is kept for the output to record.
    pub(super) fn learn_window(
        &mut self,
        probed: Probed,
        chunking: &ChunkingConfig,
        unknown: &str,
        listed: Option<u64>,
    ) {
        let model = self.info.model.clone();
        let lists = lists(&model, listed);
        let tokenizer = tokenizer_name(chunking);
        let own = if crate::job::named_encoding(tokenizer) {
            OWN_TOKENIZER
        } else {
            ""
        };
        let choose = format!(
            "set {own}`backend.context_window` to choose the window, or \
             `backend.probe_window = false` not to probe"
        );
        if let Some(held) = probed.over_budget {
            // Nothing was sent: the run stops at its first request.
            self.probe_held = Some(held);
            return;
        }
        self.probe_cost = Some(probed.cost);
        let warning = match (probed.window, probed.failed) {
            (Some(mut window), _) => {
                // A job that counts as the model does needs no other count.
                if !crate::job::named_encoding(tokenizer) {
                    window.wordpieces = None;
                }
                self.info.context_window = Some(window.tokens);
                self.learned_window = Some(window);
                let tokens = window.tokens;
                let pieces = word_pieces(window);
                match (window.server_tokens, window.from) {
                    (None, WindowSource::Refusal) => format!(
                        "{lists}, and refused a long text as too long without saying its \
                         window: chunks are cut to {tokens} {tokenizer} tokens{pieces} \
                         ({WINDOW_MARGIN_PERCENT}% less than the longest of its prefixes it \
                         took); {choose}"
                    ),
                    (Some(limit), _) => format!(
                        "{lists}, and refused a long text as over its window of {limit} of its \
                         own tokens: chunks are cut to {tokens} {tokenizer} tokens (its window \
                         scaled by its count over ours, less {WINDOW_MARGIN_PERCENT}%); {choose}"
                    ),
                    (None, WindowSource::Truncation) => format!(
                        "{lists}, and reads only the start of a long text (its prefixes got the \
                         same vector): chunks are cut to {tokens} {tokenizer} tokens{pieces} \
                         ({WINDOW_MARGIN_PERCENT}% less than it read); {choose}"
                    ),
                }
            }
            (None, Some(failed)) => format!("{unknown}; probing for it failed: {failed}"),
            // The chunks fit the window as listed.
            (None, None) if listed.is_some() => return,
            (None, None) => {
                self.read_whole = probed.read_whole;
                format!(
                    "{unknown}; a probe found it reads a text longer than the {} {tokenizer} \
                     tokens chunks are cut to whole (the output records it: later runs with \
                     chunks no longer do not probe again)",
                    chunking.max_tokens
                )
            }
        };
        self.warn(warning);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RecordedWindow;

    #[test]
    fn the_margin_is_a_tenth_and_leaves_at_least_one_token() {
        assert_eq!(with_margin(500), 450);
        assert_eq!(with_margin(255), 230);
        assert_eq!(with_margin(1), 1);
        assert_eq!(with_margin(u64::MAX), u64::MAX - u64::MAX / 10);
    }

    #[test]
    fn a_recorded_window_is_read_back_only_in_its_tokenizer() {
        let window = LearnedWindow::from_refusal(256, Some(300), 280);
        let pieces = LearnedWindow {
            tokens: 200,
            ..window
        };
        for recorded in [
            RecordedWindow {
                chunks: Some(window),
                ..RecordedWindow::default()
            },
            RecordedWindow {
                pieces: Some(pieces),
                ..RecordedWindow::default()
            },
            RecordedWindow {
                chunks: Some(window),
                pieces: Some(pieces),
                read_whole: None,
            },
            RecordedWindow {
                pieces: Some(pieces),
                read_whole: Some(640),
                ..RecordedWindow::default()
            },
            RecordedWindow {
                read_whole: Some(640),
                ..RecordedWindow::default()
            },
            RecordedWindow {
                chunks: Some(LearnedWindow {
                    server_tokens: None,
                    tokens: 180,
                    from: WindowSource::Truncation,
                    wordpieces: Some(226),
                }),
                ..RecordedWindow::default()
            },
        ] {
            let json = recorded.to_json("cl100k_base").unwrap();
            assert_eq!(RecordedWindow::from_json(&json, "cl100k_base"), recorded);
            assert_eq!(
                RecordedWindow::from_json(&json, "o200k_base"),
                RecordedWindow::default()
            );
        }
        assert_eq!(RecordedWindow::default().to_json("cl100k_base"), None);
        for hostile in [
            "",
            "{",
            "[]",
            r#"{"tokens":0,"tokenizer":"cl100k_base","from":"refusal"}"#,
            r#"{"tokens":-3,"tokenizer":"cl100k_base","from":"refusal"}"#,
            r#"{"tokens":1e400,"tokenizer":"cl100k_base","from":"refusal"}"#,
            r#"{"tokens":99999999999999999999999,"tokenizer":"cl100k_base","from":"refusal"}"#,
            r#"{"tokens":5,"tokenizer":"cl100k_base","from":"guess"}"#,
            r#"{"tokens":5,"from":"refusal"}"#,
            r#"{"tokenizer":"cl100k_base","pieces":{"tokens":0,"from":"refusal"}}"#,
            r#"{"tokenizer":"cl100k_base","pieces":[5]}"#,
            r#"{"tokenizer":"cl100k_base","read_whole":0}"#,
            r#"{"tokenizer":"cl100k_base","read_whole":-640}"#,
            r#"{"tokenizer":"cl100k_base","read_whole":"640"}"#,
            r#"{"tokenizer":"cl100k_base","read_whole":1e400}"#,
        ] {
            assert_eq!(
                RecordedWindow::from_json(hostile, "cl100k_base"),
                RecordedWindow::default(),
                "{hostile}"
            );
        }
        // Word pieces that are no count are none; the window stands.
        for hostile in [
            r#"{"tokens":180,"tokenizer":"cl100k_base","from":"truncation","wordpieces":0}"#,
            r#"{"tokens":180,"tokenizer":"cl100k_base","from":"truncation","wordpieces":-1}"#,
            r#"{"tokens":180,"tokenizer":"cl100k_base","from":"truncation","wordpieces":"226"}"#,
        ] {
            let read = RecordedWindow::from_json(hostile, "cl100k_base").chunks;
            assert_eq!(
                read.map(|w| (w.tokens, w.wordpieces)),
                Some((180, None)),
                "{hostile}"
            );
        }
    }

    #[test]
    fn a_text_read_whole_covers_chunks_no_longer() {
        let read = RecordedWindow {
            read_whole: Some(640),
            ..RecordedWindow::default()
        };
        assert!(read.read_whole_covers(512));
        assert!(read.read_whole_covers(640));
        assert!(
            !read.read_whole_covers(641),
            "longer chunks are probed for again"
        );
        assert!(!RecordedWindow::default().read_whole_covers(1));
    }

    #[test]
    fn the_probe_text_is_the_jobs_own_as_far_as_it_goes() {
        let count = |text: &str| text.split_whitespace().count();
        let pieces = |texts: &[&str]| texts.iter().map(ToString::to_string).collect::<Vec<_>>();
        // No sample: plain words, the shortest prefix that holds the tokens.
        let plain = ProbeText::new(&[], (&count, ModelCount::wordpiece()), 640);
        assert_eq!(count(plain.prefix(plain.len())), 640);
        assert_eq!(count(plain.prefix(plain.len() - 1)), 639);
        assert_eq!(plain.prefix(0), "");
        // A sample long enough is the text, cut after each word.
        let sample = pieces(&["one two three four five six seven eight"]);
        let own = ProbeText::new(&sample, (&count, ModelCount::wordpiece()), 5);
        assert_eq!(own.prefix(own.len()), "one two three four five");
        assert_eq!(own.prefix(1), "one");
        // A short one is followed by plain words.
        let short = ProbeText::new(
            &pieces(&["  one two "]),
            (&count, ModelCount::wordpiece()),
            5,
        );
        assert!(short.prefix(short.len()).starts_with("one two the report"));
        // Text without spaces is cut every few characters.
        let dense = "汉".repeat(100);
        let chars = |text: &str| text.chars().count();
        let cut = ProbeText::new(&[dense], (&chars, ModelCount::wordpiece()), 40);
        assert_eq!(cut.prefix(1).chars().count(), CUT_CHARS);
        assert_eq!(chars(cut.prefix(cut.len())), 48);
        assert!(cut.prefix(cut.len()).chars().all(|c| c == '汉'));
        // At least two prefixes, however few tokens are asked for.
        let one = ProbeText::new(&pieces(&["word"]), (&count, ModelCount::wordpiece()), 1);
        assert!(one.len() >= 2, "{}", one.len());
    }

    #[test]
    fn the_guess_brackets_the_largest_power_of_two_in_the_range() {
        let count = |text: &str| text.split_whitespace().count();
        let probe = ProbeText::new(&[], (&count, ModelCount::wordpiece()), 800);
        let pieces = |k: usize| server_pieces(probe.prefix(k));
        let hi = probe.len() - 1;
        assert!(pieces(hi) > 600, "{}", pieces(hi));
        // Read whole with a piece to spare, and the next is not; past 512.
        let bracket = |window: usize, (below, above): (usize, usize)| {
            assert!(pieces(below) + 3 <= window && pieces(below + 1) + 3 > window);
            assert!(pieces(above) >= window && pieces(above - 1) < window);
        };
        let (below, above) = guess(&probe, 0, hi, ModelCount::wordpiece()).unwrap();
        bracket(512, (below, above));
        // Past the first prefix, the window is below it: half of it next.
        let (low, high) = guess(&probe, 0, below, ModelCount::wordpiece()).unwrap();
        bracket(256, (low, high));
        // Read past the second, no window of the kind is left in between.
        assert_eq!(guess(&probe, above, hi, ModelCount::wordpiece()), None);
        assert_eq!(guess(&probe, below, above, ModelCount::wordpiece()), None);
        // Nor below the smallest guessed.
        let small = (1..hi).find(|&k| pieces(k) >= 2 * SMALLEST_GUESS).unwrap();
        let (low, _) = guess(&probe, 0, small, ModelCount::wordpiece()).unwrap();
        assert_eq!(guess(&probe, 0, low, ModelCount::wordpiece()), None);
    }

    #[test]
    fn the_guess_counts_as_the_models_own_tokenizer_when_the_job_does() {
        // A model that counts a token a word, marks and all, and adds one
        // special token: the job's own count, as with its tokenizer.json.
        let count = |text: &str| text.split_whitespace().count();
        let own = ModelCount {
            tokens: &count,
            special: 1,
        };
        // Every word with a mark: two word pieces for `bert-base-uncased`.
        let marked: Vec<String> = (0..900).map(|i| format!("w{}, ", i % 7)).collect();
        let probe = ProbeText::new(&[marked.concat()], (&count, own), 800);
        let hi = probe.len() - 1;
        let tokens = |k: usize| count(probe.prefix(k)) + 1;
        // Read whole with a token to spare; two past the window.
        let (below, above) = guess(&probe, 0, hi, own).unwrap();
        assert_eq!((tokens(below), tokens(above)), (511, 514));
        // Counted as a WordPiece model, the same prefixes are a guess at
        // 1,024 pieces: past what this model reads, both of them.
        let (wp_below, wp_above) = guess(&probe, 0, hi, ModelCount::wordpiece()).unwrap();
        assert!(tokens(wp_below) > 512 && tokens(wp_above) > 512);
    }

    #[test]
    fn the_densest_pieces_of_the_input_go_first() {
        // Counted as `cl100k_base` would, about: a run of `=`s is one token.
        let count = |text: &str| {
            text.split(|c: char| c.is_whitespace())
                .filter(|w| !w.is_empty())
                .map(|w| {
                    if w.chars().all(|c| c == '=') {
                        1
                    } else {
                        w.len().div_ceil(8)
                    }
                })
                .sum::<usize>()
        };
        let prose = "the river rose after the storm".to_string();
        let titled = "Rivers\n======\nthe river rose".to_string();
        let probe = ProbeText::new(
            &[prose.clone(), titled, prose],
            (&count, ModelCount::wordpiece()),
            8,
        );
        assert!(
            probe
                .prefix(probe.len())
                .starts_with("Rivers\n======\nthe river rose\nthe river"),
            "{:?}",
            probe.prefix(probe.len())
        );
    }
}
