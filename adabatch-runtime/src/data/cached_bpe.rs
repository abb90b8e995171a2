//! GPT-2's tokenizer layout (no normalizer, the byte-level pre-tokenizer, a BPE
//! without dropout) encoded with a word cache: the same ids as `tokenizers`'
//! `encode`, for a third of the work on natural text.
//!
//! `tokenizers` builds, for every text, a `NormalizedString` with an alignment per
//! byte, maps every byte of every word to its byte-level character, and gives every
//! token a `String` and offsets in an `Encoding`; a corpus tokenized once needs
//! only the ids. Words repeat, so a word's ids are looked up here, and the
//! tokenizer's own pieces (its regex engine and pattern, its BPE) run only for a
//! word not seen before. Written here because `tokenizers` has no ids-only path;
//! anything this layout does not cover (a normalizer, another pre-tokenizer,
//! dropout, padding, truncation, a text holding an added token) goes through
//! `tokenizers` itself.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use aho_corasick::AhoCorasick;
use rayon::prelude::*;
use tokenizers::models::bpe::BPE;
use tokenizers::models::ModelWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::utils::SysRegex;
use tokenizers::{Model, Tokenizer};

/// The byte-level pre-tokenizer's split, as `tokenizers` writes it (GPT-2's).
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Words a cache holds before it starts over (a few MB).
const CACHE_WORDS: usize = 1 << 16;

/// Words seen, with their ids.
type WordCache = HashMap<Box<str>, Box<[u32]>>;

/// How documents are encoded: with the word cache when the tokenizer's layout is
/// GPT-2's, else by `tokenizers` (and why).
pub(crate) enum DocumentEncoder<'a> {
    /// GPT-2's layout, with a word cache.
    Cached(CachedBpe<'a>),
    /// Any other layout, through `tokenizers`' `encode_batch_fast`.
    Pipeline {
        /// The tokenizer.
        tokenizer: &'a Tokenizer,
        /// What keeps the cache out, said in the summary.
        reason: &'static str,
    },
}

impl<'a> DocumentEncoder<'a> {
    /// The cached encoder when `tokenizer`'s layout allows it.
    pub(crate) fn new(tokenizer: &'a Tokenizer) -> Self {
        match CachedBpe::new(tokenizer) {
            Ok(cached) => Self::Cached(cached),
            Err(reason) => Self::Pipeline { tokenizer, reason },
        }
    }

    /// How the documents are encoded, in words.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Cached(_) => "byte-level BPE with a word cache".into(),
            Self::Pipeline { reason, .. } => format!("tokenizers' pipeline ({reason})"),
        }
    }

    /// Each document's ids, in order, on every core; the ids do not depend on how
    /// many.
    pub(crate) fn encode<S: AsRef<str> + Sync>(
        &self,
        documents: &[S],
    ) -> tokenizers::Result<Vec<Vec<u32>>> {
        match self {
            Self::Cached(cached) => cached.encode(documents),
            Self::Pipeline { tokenizer, .. } => {
                let texts: Vec<&str> = documents.iter().map(AsRef::as_ref).collect();
                let encodings = tokenizer.encode_batch_fast(texts, false)?;
                Ok(encodings
                    .into_iter()
                    .map(|e| e.get_ids().to_vec())
                    .collect())
            }
        }
    }
}

/// A tokenizer of GPT-2's layout, and a word cache per worker thread.
pub(crate) struct CachedBpe<'a> {
    tokenizer: &'a Tokenizer,
    bpe: &'a BPE,
    add_prefix_space: bool,
    split: Option<SysRegex>,
    /// The added tokens' texts: a document holding one goes through `tokenizers`,
    /// which splits them out.
    added: Option<AhoCorasick>,
    byte_chars: Box<[char; 256]>,
    caches: Vec<Mutex<WordCache>>,
}

impl<'a> CachedBpe<'a> {
    /// `tokenizer`'s pieces, or why its layout is not GPT-2's.
    fn new(tokenizer: &'a Tokenizer) -> Result<Self, &'static str> {
        if tokenizer.get_normalizer().is_some() {
            return Err("a normalizer");
        }
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return Err("truncation or padding");
        }
        // Without special tokens asked for, these keep the ids as the model gives them.
        match tokenizer.get_post_processor() {
            None
            | Some(PostProcessorWrapper::ByteLevel(_))
            | Some(PostProcessorWrapper::Template(_))
            | Some(PostProcessorWrapper::Bert(_))
            | Some(PostProcessorWrapper::Roberta(_)) => {}
            Some(_) => return Err("a sequence of post-processors"),
        }
        let Some(PreTokenizerWrapper::ByteLevel(byte_level)) = tokenizer.get_pre_tokenizer() else {
            return Err("a pre-tokenizer other than the byte-level one");
        };
        let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
            return Err("a model other than BPE");
        };
        if bpe.dropout.is_some_and(|p| p != 0.0) {
            return Err("BPE dropout");
        }
        let split = match byte_level.use_regex {
            true => Some(SysRegex::new(GPT2_SPLIT).map_err(|_| "the split pattern")?),
            false => None,
        };
        let added: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .map(|token| token.content)
            .filter(|content| !content.is_empty())
            .collect();
        let added = match added.is_empty() {
            true => None,
            false => Some(AhoCorasick::new(&added).map_err(|_| "its added tokens")?),
        };
        let workers = rayon::current_num_threads().max(1);
        Ok(Self {
            tokenizer,
            bpe,
            add_prefix_space: byte_level.add_prefix_space,
            split,
            added,
            byte_chars: Box::new(byte_level_chars()),
            caches: (0..workers).map(|_| Mutex::default()).collect(),
        })
    }

    /// The documents' ids: contiguous parts, one per worker and its cache.
    fn encode<S: AsRef<str> + Sync>(&self, documents: &[S]) -> tokenizers::Result<Vec<Vec<u32>>> {
        let part = documents.len().div_ceil(self.caches.len()).max(1);
        let parts: Vec<Vec<Vec<u32>>> = documents
            .par_chunks(part)
            .zip(self.caches.par_iter())
            .map(|(documents, cache)| {
                let mut cache = cache
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                documents
                    .iter()
                    .map(|text| self.encode_text(text.as_ref(), &mut cache))
                    .collect()
            })
            .collect::<tokenizers::Result<_>>()?;
        Ok(parts.into_iter().flatten().collect())
    }

    /// One text's ids: `tokenizers`' pre-tokenization and BPE, word by word.
    fn encode_text(&self, text: &str, cache: &mut WordCache) -> tokenizers::Result<Vec<u32>> {
        if self
            .added
            .as_ref()
            .is_some_and(|added| added.is_match(text))
        {
            return Ok(self.tokenizer.encode_fast(text, false)?.get_ids().to_vec());
        }
        let text = match self.add_prefix_space && !text.starts_with(' ') {
            true => Cow::Owned(format!(" {text}")),
            false => Cow::Borrowed(text),
        };
        let mut ids = Vec::with_capacity(text.len() / 3);
        for word in self.words(&text) {
            if let Some(hit) = cache.get(word) {
                ids.extend_from_slice(hit);
                continue;
            }
            let mapped: String = word.bytes().map(|b| self.byte_chars[b as usize]).collect();
            let word_ids: Box<[u32]> = self.bpe.tokenize(&mapped)?.iter().map(|t| t.id).collect();
            ids.extend_from_slice(&word_ids);
            if cache.len() >= CACHE_WORDS {
                cache.clear();
            }
            cache.insert(word.into(), word_ids);
        }
        Ok(ids)
    }

    /// The text's words as the byte-level pre-tokenizer splits it (isolated
    /// matches and the text between them), empty ones left out.
    fn words<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let Some(split) = &self.split else {
            return vec![text].into_iter().filter(|w| !w.is_empty()).collect();
        };
        let mut words = Vec::new();
        let mut previous = 0;
        for (start, end) in split.find_iter(text) {
            if previous != start {
                words.push(&text[previous..start]);
            }
            words.push(&text[start..end]);
            previous = end;
        }
        if previous != text.len() {
            words.push(&text[previous..]);
        }
        words.retain(|w| !w.is_empty());
        words
    }
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`): printable bytes stand for
/// themselves, the others for the characters from U+0100 on, in byte order.
fn byte_level_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[b as usize] = match printable(b) {
            true => char::from(b),
            false => {
                next += 1;
                char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            }
        };
    }
    chars
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tokenize::train_byte_level_bpe;
    use proptest::prelude::*;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn trained() -> Tokenizer {
        let documents = [
            "The quick brown fox jumps over the lazy dog.",
            "In the beginning God created the heaven and the earth.",
            "def add(a, b):\n    return a + b  # sum",
            "naïve café — 東京 🚀 it's we'll they'd   spaces\ttabs",
        ];
        train_byte_level_bpe(&documents, 400, "<|endoftext|>").unwrap()
    }

    fn pipeline(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
        tokenizer
            .encode_fast(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    }

    #[test]
    fn the_byte_table_is_the_pre_tokenizers() {
        // Every byte valid UTF-8 can hold: ASCII, continuation bytes and lead bytes.
        let mut text: String = (0u8..0x80).map(char::from).collect();
        text.extend([
            '\u{80}',
            '\u{7FF}',
            '\u{800}',
            '\u{FFFF}',
            '\u{10000}',
            '\u{10FFFF}',
        ]);
        text.extend((0x80u32..0x800).step_by(7).filter_map(char::from_u32));
        text.extend((0x800u32..0x10000).step_by(61).filter_map(char::from_u32));
        text.extend(
            (0x10000u32..0x110000)
                .step_by(4099)
                .filter_map(char::from_u32),
        );
        let mut pre = PreTokenizedString::from(text.as_str());
        ByteLevel::new(false, false, false)
            .pre_tokenize(&mut pre)
            .unwrap();
        let library: String = pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece)
            .collect();
        let table = byte_level_chars();
        let ours: String = text.bytes().map(|b| table[b as usize]).collect();
        assert_eq!(ours, library);
    }

    #[test]
    fn a_trained_tokenizer_is_cached_and_encodes_as_the_pipeline() {
        let tokenizer = trained();
        let encoder = DocumentEncoder::new(&tokenizer);
        assert!(
            matches!(encoder, DocumentEncoder::Cached(_)),
            "{}",
            encoder.describe()
        );
        let texts = [
            "The quick brown fox, again and again: the quick brown fox.",
            "  leading spaces and trailing   ",
            "it's we'll they'd 12345 ١٢٣ naïve",
            "holds <|endoftext|> inside",
            "\n\n\t mixed \r\n whitespace",
        ];
        let ids = encoder.encode(&texts).unwrap();
        for (text, ids) in texts.iter().zip(&ids) {
            assert_eq!(ids, &pipeline(&tokenizer, text), "{text:?}");
        }
    }

    #[test]
    fn other_layouts_go_through_the_pipeline_and_say_why() {
        let mut tokenizer = trained();
        tokenizer
            .with_normalizer(Some(tokenizers::normalizers::Lowercase))
            .unwrap();
        let encoder = DocumentEncoder::new(&tokenizer);
        assert_eq!(encoder.describe(), "tokenizers' pipeline (a normalizer)");
        let text = "Upper Case";
        assert_eq!(
            encoder.encode(&[text]).unwrap()[0],
            pipeline(&tokenizer, text)
        );
    }

    #[test]
    fn a_prefix_space_and_no_regex_encode_as_the_pipeline() {
        let mut tokenizer = trained();
        for (prefix, regex) in [(true, true), (true, false), (false, false)] {
            tokenizer.with_pre_tokenizer(Some(ByteLevel::new(prefix, true, regex)));
            let encoder = DocumentEncoder::new(&tokenizer);
            for text in ["word and words", " spaced first", "x"] {
                assert_eq!(
                    encoder.encode(&[text]).unwrap()[0],
                    pipeline(&tokenizer, text)
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any text, twice over (the second time from the cache), as the pipeline.
        #[test]
        fn any_text_encodes_as_the_pipeline(
            texts in prop::collection::vec("(\\PC|\\s|'s|'ll| ){0,40}", 1..8)
        ) {
            let tokenizer = trained();
            let encoder = DocumentEncoder::new(&tokenizer);
            let twice: Vec<&String> = texts.iter().chain(&texts).collect();
            let ids = encoder.encode(&twice).unwrap();
            for (text, ids) in twice.iter().zip(&ids) {
                prop_assert_eq!(ids, &pipeline(&tokenizer, text));
            }
        }
    }
}
