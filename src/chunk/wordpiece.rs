//! `bert-base-uncased`'s WordPiece tokenizer, built in: `chunking.tokenizer
//! = "bert-base-uncased"` counts chunks as the models that share it do, and
//! the window probe finds the input's densest text for a self-hosted
//! server by it.
//!
//! The vocabulary is `bert-base-uncased`'s (Apache-2.0; 30,522 tokens,
//! `bert-uncased-vocab.txt`, a token a line), the one that all-MiniLM,
//! BGE, E5, GTE and most embedding models self-hosted servers run share.
//! Against another model it still counts what such vocabularies split: a
//! word the vocabulary lacks is several pieces, every punctuation mark and
//! CJK ideograph one of its own. `cl100k_base`, with a vocabulary three
//! times larger, keeps more words whole, so a text of URLs, identifiers
//! or rare words is denser for the server than its local count says.

use std::sync::OnceLock;

use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::Tokenizer;

/// `bert-base-uncased`'s vocabulary, a token a line, its id the line's.
const VOCAB: &[u8] = include_bytes!("bert-uncased-vocab.txt");

/// The tokenizer, built once, with the `[CLS]` and `[SEP]` a model adds to
/// every text; `None` if the vocabulary could not be read.
pub(crate) fn tokenizer() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let vocab = WordPiece::read_bytes(VOCAB).ok()?;
            let model = WordPiece::builder()
                .vocab(vocab)
                .unk_token("[UNK]".to_string())
                .continuing_subword_prefix("##".to_string())
                .max_input_chars_per_word(100)
                .build()
                .ok()?;
            let mut tokenizer = Tokenizer::new(model);
            // Lower case, accents stripped, CJK ideographs split apart.
            tokenizer
                .with_normalizer(Some(BertNormalizer::new(true, true, None, true)))
                .ok()?;
            tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
            let token = |name: &str| Some((name.to_string(), tokenizer.token_to_id(name)?));
            let (sep, cls) = (token("[SEP]")?, token("[CLS]")?);
            tokenizer.with_post_processor(Some(BertProcessing::new(sep, cls)));
            Some(tokenizer)
        })
        .as_ref()
}

/// The word pieces of `text`, without the special tokens a model adds;
/// `None` if it cannot be counted.
pub(crate) fn count(text: &str) -> Option<usize> {
    tokenizer()?.encode_fast(text, false).ok().map(|e| e.len())
}

/// Where each word piece of `text` ends, in bytes, in order, without the
/// special tokens; `None` if it cannot be counted.
pub(crate) fn ends(text: &str) -> Option<Vec<usize>> {
    let encoding = tokenizer()?.encode(text, false).ok()?;
    Some(encoding.get_offsets().iter().map(|&(_, end)| end).collect())
}

/// The tokens a WordPiece model makes of `text` ([`count`]);
/// should its vocabulary not load, the fewest it could make: the words and
/// marks a BERT-style pre-tokenizer splits `text` into, each run of letters
/// and digits one, and every other character but a space (a punctuation
/// mark, a symbol, a CJK ideograph) one on its own. Either counts more than
/// `cl100k_base` for a title's underline of `=`s (one or two tokens).
pub(crate) fn server_pieces(text: &str) -> usize {
    count(text).unwrap_or_else(|| units(text))
}

/// The words and marks, as [`server_pieces`] says.
fn units(text: &str) -> usize {
    let mut units = 0;
    let mut in_word = false;
    for c in text.chars() {
        if c.is_alphanumeric() && !is_cjk_ideograph(c) {
            units += usize::from(!in_word);
            in_word = true;
        } else {
            in_word = false;
            units += usize::from(!c.is_whitespace());
        }
    }
    units
}

/// A CJK ideograph, which a BERT-style pre-tokenizer splits off on its own.
fn is_cjk_ideograph(c: char) -> bool {
    matches!(u32::from(c),
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x2_0000..=0x2_A6DF
        | 0x2_A700..=0x2_CEAF
        | 0xF900..=0xFAFF
        | 0x2_F800..=0x2_FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_counted_as_bert_base_uncased_counts_it() {
        // Each counted by all-MiniLM-L6-v2's own tokenizer.json.
        assert_eq!(count("Hello, world!"), Some(4));
        assert_eq!(count(""), Some(0));
        assert_eq!(count("the quick brown fox"), Some(4));
        // A word the vocabulary lacks is several pieces.
        assert_eq!(count("getentropy"), Some(4));
        // Every ideograph is one.
        assert_eq!(count("漢字テスト"), Some(5));
        assert_eq!(count("======"), Some(6));
        // With the two special tokens a model adds.
        let with_specials = tokenizer().unwrap().encode("Hello, world!", true).unwrap();
        assert_eq!(with_specials.get_ids(), [101, 7592, 1010, 2088, 999, 102]);
        // Where the pieces end, in bytes of the text.
        assert_eq!(ends("é getentropy"), Some(vec![2, 6, 9, 12, 13]));
    }

    #[test]
    fn pieces_are_counted_and_without_the_vocabulary_words_and_marks() {
        // Word pieces, and without the vocabulary words and marks, as a
        // BERT-style pre-tokenizer splits them.
        assert_eq!(server_pieces("Storm levels rose."), 4);
        assert_eq!(server_pieces("getentropy(2)"), 7);
        assert_eq!(units("getentropy(2)"), 4);
        assert_eq!(units("Storm levels rose."), 4);
        assert_eq!(units("Title\n====="), 6);
        assert_eq!(units("fn main() { x.y(); }"), 12);
        assert_eq!(units("汉字 kana"), 3);
        assert_eq!(units(""), 0);
    }
}
