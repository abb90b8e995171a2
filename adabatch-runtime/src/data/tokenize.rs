//! Text to token files, with Hugging Face's `tokenizers`: a byte-level BPE trained on
//! the corpus (GPT-2's scheme: any text encodes, nothing is unknown) or a
//! `tokenizer.json` loaded as is. [`prepare_corpus`] writes a directory the
//! [`TokenDocuments`](super::token_files::TokenDocuments) views read:
//!
//! ```text
//! DIR/tokenizer.json    the tokenizer (transformers' PreTrainedTokenizerFast loads it)
//! DIR/train.bin         training documents, each followed by the EOS id
//! DIR/validation.bin    held-out documents, the same way
//! DIR/tokens.json       width, vocabulary size, EOS id and counts (CorpusInfo)
//! ```
//!
//! A corpus is text with one document per line, or JSON lines with a `"text"` field
//! (a `.jsonl` file), either gzipped (`.gz`) or not; blank lines are skipped. The held-out documents are spread
//! evenly through the corpus (document `i` is held out when `⌊(i+1)·f⌋ > ⌊i·f⌋` for
//! the fraction `f`), and a trained tokenizer sees only the training documents.

use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
/// Hugging Face's tokenizer (to decode sampled ids, or encode prompts).
pub use tokenizers::Tokenizer;
use tokenizers::{AddedToken, TokenizerBuilder};

use super::token_files::{TokenDocuments, TokenFile, TokenWidth};
use crate::error::{Cause, DataError, Error, FileOp, Result};

/// Where the tokenizer comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizerSource {
    /// Train a byte-level BPE of this many ids (the EOS token included) on the
    /// training documents.
    TrainBpe {
        /// Vocabulary size, at least 257 (the 256 bytes and the EOS token).
        vocab_size: usize,
    },
    /// A `tokenizer.json` (of a Hugging Face model, or written before).
    File(PathBuf),
}

/// How to cut and tokenize a corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepareOptions {
    /// The tokenizer.
    pub tokenizer: TokenizerSource,
    /// The end-of-document token; added to a trained tokenizer as its id 0, and
    /// looked up in a loaded one.
    pub eos_token: String,
    /// Share of documents held out for validation, in `[0, 1)`.
    pub validation_fraction: f64,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        Self {
            tokenizer: TokenizerSource::TrainBpe { vocab_size: 4096 },
            eos_token: "<|endoftext|>".into(),
            validation_fraction: 0.05,
        }
    }
}

/// What [`prepare_corpus`] wrote: `tokens.json`, read back by [`CorpusInfo::read`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorpusInfo {
    /// Bytes per token id in the `.bin` files: 2 (`u16`) or 4 (`u32`).
    pub width_bytes: usize,
    /// The tokenizer's vocabulary size (added tokens included).
    pub vocab_size: u32,
    /// The end-of-document id that closes every document.
    pub eos_id: u32,
    /// The end-of-document token.
    pub eos_token: String,
    /// Documents in `train.bin`.
    pub train_documents: usize,
    /// Tokens in `train.bin`, each document's EOS included.
    pub train_tokens: u64,
    /// Documents in `validation.bin`.
    pub validation_documents: usize,
    /// Tokens in `validation.bin`, each document's EOS included.
    pub validation_tokens: u64,
    /// What the files were prepared from: the corpus files with their sizes, the
    /// tokenizer and the held-out share ([`CorpusInfo::prepared_from`]).
    #[serde(default)]
    pub source: CorpusSource,
    /// CRC-32C of `tokenizer.json`: token files of one tokenizer agree on it, so
    /// that directories prepared apart are not mixed by mistake (absent in older
    /// directories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_crc32c: Option<u32>,
}

/// The inputs of a preparation, to tell whether prepared files are still current.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CorpusSource {
    /// Each corpus file as given, with its size in bytes.
    pub files: Vec<(String, u64)>,
    /// `bpe:<vocab size>` for a trained BPE, or the `tokenizer.json` loaded.
    pub tokenizer: String,
    /// The end-of-document token.
    pub eos_token: String,
    /// Share of documents held out.
    pub validation_fraction: f64,
}

impl CorpusSource {
    /// The source `options` would prepare `corpus` from (the files' current sizes).
    pub fn of(corpus: &[PathBuf], options: &PrepareOptions) -> Result<Self> {
        let files = corpus
            .iter()
            .map(|path| {
                let meta = std::fs::metadata(path).map_err(Error::io(FileOp::Read, path.clone()))?;
                Ok((path.display().to_string(), meta.len()))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            files,
            tokenizer: match &options.tokenizer {
                TokenizerSource::TrainBpe { vocab_size } => format!("bpe:{vocab_size}"),
                TokenizerSource::File(path) => path.display().to_string(),
            },
            eos_token: options.eos_token.clone(),
            validation_fraction: options.validation_fraction,
        })
    }
}

impl CorpusInfo {
    /// The `tokens.json` of a prepared directory.
    pub fn read(dir: &Path) -> Result<Self> {
        read_json(&dir.join("tokens.json"))
    }

    /// Whether these files were prepared from `corpus` with `options` (the same
    /// files, of the same sizes, tokenizer, EOS token and held-out share): a
    /// different corpus or setting needs [`prepare_corpus`] again.
    pub fn prepared_from(&self, corpus: &[PathBuf], options: &PrepareOptions) -> bool {
        CorpusSource::of(corpus, options).is_ok_and(|source| source == self.source)
    }

    /// Opens the directory's training and validation documents, checked against
    /// this `tokens.json` first: each file's token and document counts, its ids
    /// within the vocabulary, and `tokenizer.json`'s own size. A file cut short,
    /// an edited EOS id or vocabulary is a typed error naming the file, before
    /// anything trains on it.
    pub fn open_documents(&self, dir: &Path) -> Result<(TokenDocuments, TokenDocuments)> {
        let tokenizer_path = dir.join("tokenizer.json");
        if tokenizer_path.exists() {
            let tokenizer = load_tokenizer(&tokenizer_path)?;
            let size = tokenizer.get_vocab_size(true) as u32;
            if size != self.vocab_size {
                return Err(mismatch(
                    &dir.join("tokens.json"),
                    format!(
                        "says a vocabulary of {} ids; its tokenizer.json has {size}",
                        self.vocab_size
                    ),
                ));
            }
            let eos = tokenizer.token_to_id(&self.eos_token);
            if eos != Some(self.eos_id) {
                return Err(mismatch(
                    &dir.join("tokens.json"),
                    format!(
                        "says the EOS id is {}; its tokenizer.json has {:?} as {eos:?}",
                        self.eos_id, self.eos_token
                    ),
                ));
            }
        }
        let open = |name: &str, tokens: u64, documents: usize| -> Result<TokenDocuments> {
            let path = dir.join(name);
            let file = TokenFile::open(&path, self.width()?, self.vocab_size)?;
            if file.len() as u64 != tokens {
                return Err(mismatch(
                    &path,
                    format!("holds {} tokens; tokens.json says {tokens}", file.len()),
                ));
            }
            let docs = TokenDocuments::new(file, self.eos_id)?;
            if docs.len() != documents {
                return Err(mismatch(
                    &path,
                    format!(
                        "holds {} documents ended by the EOS id {}; tokens.json says {documents}",
                        docs.len(),
                        self.eos_id
                    ),
                ));
            }
            Ok(docs)
        };
        Ok((
            open("train.bin", self.train_tokens, self.train_documents)?,
            open(
                "validation.bin",
                self.validation_tokens,
                self.validation_documents,
            )?,
        ))
    }

    /// How the `.bin` files store ids.
    pub fn width(&self) -> Result<TokenWidth> {
        match self.width_bytes {
            2 => Ok(TokenWidth::U16),
            4 => Ok(TokenWidth::U32),
            n => Err(Error::Data(DataError::InvalidTokenSetting {
                name: "tokens.json width_bytes",
                value: n.to_string(),
                expected: "2 (u16) or 4 (u32)".into(),
            })),
        }
    }
}

/// A JSON file a preparation wrote (`tokens.json`, `domains.json`), read back.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(Error::io(FileOp::Read, path.to_path_buf()))?;
    serde_json::from_str(&text).map_err(|e| tokenizer_failed(path, "does not parse", e))
}

fn mismatch(path: &Path, detail: String) -> Error {
    Error::Data(DataError::TokenFileMismatch {
        path: path.to_path_buf(),
        detail,
    })
}

fn tokenizer_error(path: &Path, detail: impl Into<String>) -> Error {
    Error::Data(DataError::Tokenizer {
        path: path.to_path_buf(),
        detail: detail.into(),
        source: None,
    })
}

/// Loads a `tokenizer.json` (a file of the user's, or one a preparation wrote).
///
/// The tokenizers crate (0.23) panics on some damaged files instead of returning
/// an error (`expect("Helper")` in its decoders' deserializer, found by
/// `tests/it/fuzz.rs`): the text must be JSON first, which refuses the usual
/// damage (a cut, a flipped byte) as an error, and a panic that remains is caught
/// and refused the same way.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let text = std::fs::read_to_string(path).map_err(Error::io(FileOp::Read, path))?;
    serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| tokenizer_failed(path, "is not JSON", e))?;
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        text.parse::<Tokenizer>()
    }));
    match loaded {
        Ok(parsed) => parsed.map_err(|e| tokenizer_failed(path, "cannot load the tokenizer", e)),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(tokenizer_error(
                path,
                format!("cannot load the tokenizer: the tokenizers crate panicked on it ({why})"),
            ))
        }
    }
}

/// What `source` kept from being done (`detail`) with the file `path`.
fn tokenizer_failed(path: &Path, detail: impl Into<String>, source: impl Into<Cause>) -> Error {
    Error::Data(DataError::Tokenizer {
        path: path.to_path_buf(),
        detail: detail.into(),
        source: Some(source.into()),
    })
}

/// Whether a run may (re)write token files in `dir`: only where it does not exist
/// yet, is empty, or the run was asked to (`retokenize`). Token directories are
/// the user's data: otherwise a [`DataError::TokenDirMismatch`] with `detail` (what
/// the directory holds against what the run asks for), and nothing is written.
pub fn may_prepare(dir: &Path, retokenize: bool, detail: impl FnOnce() -> String) -> Result<()> {
    let empty = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            return Err(Error::Io {
                op: FileOp::List,
                path: dir.to_path_buf(),
                source: e,
            })
        }
    };
    if empty || retokenize {
        Ok(())
    } else {
        Err(Error::Data(DataError::TokenDirMismatch {
            dir: dir.to_path_buf(),
            detail: detail(),
        }))
    }
}

/// The documents of a corpus file: one per line, or the `"text"` of each JSON line
/// of a `.jsonl` file; blank lines and empty texts skipped.
pub fn read_documents(path: &Path) -> Result<Vec<String>> {
    let io = |e| Error::Io {
        op: FileOp::Read,
        path: path.to_path_buf(),
        source: e,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let gzipped = path.extension().is_some_and(|e| e == "gz");
    let reader: Box<dyn std::io::Read> = if gzipped {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let stem = if gzipped {
        path.with_extension("")
    } else {
        path.to_path_buf()
    };
    let jsonl = stem.extension().is_some_and(|e| e == "jsonl");
    let mut documents = Vec::new();
    for (number, line) in std::io::BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let text = if jsonl {
            json_text(&line, path, number + 1)?
        } else {
            line
        };
        if !text.trim().is_empty() {
            documents.push(text);
        }
    }
    if documents.is_empty() {
        return Err(tokenizer_error(path, "the corpus holds no document"));
    }
    Ok(documents)
}

/// The `"text"` of line `number` of the JSON-lines file `path`.
fn json_text(line: &str, path: &Path, number: usize) -> Result<String> {
    let value: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| tokenizer_failed(path, format!("line {number} is not JSON"), e))?;
    match value.get("text") {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        _ => Err(tokenizer_error(
            path,
            format!("line {number}: no string field \"text\""),
        )),
    }
}

/// Whether document `index` is held out, for a fraction `f`: evenly spread, exactly
/// `⌊n·f⌋` of the first `n`.
pub fn is_held_out(index: usize, fraction: f64) -> bool {
    ((index + 1) as f64 * fraction).floor() > (index as f64 * fraction).floor()
}

/// A byte-level BPE of `vocab_size` ids trained on `documents`, `eos_token` its id 0.
pub fn train_byte_level_bpe(
    documents: &[&str],
    vocab_size: usize,
    eos_token: &str,
) -> Result<Tokenizer> {
    let alphabet = ByteLevel::alphabet();
    if vocab_size < alphabet.len() + 1 {
        return Err(Error::Data(DataError::InvalidTokenSetting {
            name: "vocab_size",
            value: vocab_size.to_string(),
            expected: format!(
                "at least {} ids for a byte-level BPE (256 bytes and the EOS token)",
                alphabet.len() + 1
            ),
        }));
    }
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(2)
        .special_tokens(vec![AddedToken::from(eos_token.to_string(), true)])
        .initial_alphabet(alphabet.into_iter().collect())
        .build();
    // No prefix space: a document's first word encodes as it does after a line start.
    let byte_level = ByteLevel::new(false, true, true);
    // GPT-2's layout: byte-level pre-tokenizer, post-processor and decoder, no normalizer.
    let mut tokenizer =
        TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel>::new()
            .with_model(BPE::default())
            .with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(byte_level))
            .with_decoder(Some(byte_level))
            .build()
            .map_err(|source| Error::Data(DataError::TokenizerTraining { source }))?;
    tokenizer
        .train(&mut trainer, documents.iter())
        .map_err(|source| Error::Data(DataError::TokenizerTraining { source }))?;
    Ok(Tokenizer::from(tokenizer))
}

/// The tokenizer of `options`: trained on `documents`, or loaded.
pub fn build_tokenizer(options: &PrepareOptions, documents: &[&str]) -> Result<Tokenizer> {
    match &options.tokenizer {
        TokenizerSource::TrainBpe { vocab_size } => {
            train_byte_level_bpe(documents, *vocab_size, &options.eos_token)
        }
        TokenizerSource::File(path) => {
            load_tokenizer(path)
        }
    }
}

/// Encodes `documents` and writes their ids, each document followed by `eos_id`, as
/// little-endian `width` integers to `path`; returns the tokens written. An id that
/// does not fit `width` is an error, and nothing is then left at `path`.
pub fn write_token_file(
    tokenizer: &Tokenizer,
    documents: &[&str],
    eos_id: u32,
    width: TokenWidth,
    path: &Path,
) -> Result<u64> {
    // Written beside, then renamed: a reader never maps a half-written file, and a
    // file another process has mapped is replaced, not truncated under it.
    let partial = partial_path(path);
    let written =
        encode_into(tokenizer, documents, eos_id, width, (&partial, path)).inspect_err(|_| {
            std::fs::remove_file(&partial).ok();
        })?;
    std::fs::rename(&partial, path).map_err(Error::io(FileOp::Rename, path.to_path_buf()))?;
    Ok(written)
}

/// [`write_token_file`]'s encoding into `files.0`; errors name `files.1`.
fn encode_into(
    tokenizer: &Tokenizer,
    documents: &[&str],
    eos_id: u32,
    width: TokenWidth,
    (file, path): (&Path, &Path),
) -> Result<u64> {
    let io = |e| Error::Io {
        op: FileOp::Write,
        path: path.to_path_buf(),
        source: e,
    };
    let mut out = BufWriter::new(std::fs::File::create(file).map_err(io)?);
    let mut written = 0u64;
    // In chunks: the encodings of a large corpus need not all be in memory at once.
    for chunk in documents.chunks(4096) {
        let encodings = tokenizer
            .encode_batch(chunk.to_vec(), false)
            .map_err(|e| tokenizer_failed(path, "cannot encode the documents", e))?;
        for encoding in encodings {
            for &id in encoding.get_ids().iter().chain([&eos_id]) {
                match width {
                    TokenWidth::U16 => {
                        // An id that does not fit is an error, not a wrapped id.
                        let narrow = u16::try_from(id).map_err(|_| {
                            tokenizer_error(path, format!("id {id} does not fit in u16 tokens"))
                        })?;
                        out.write_all(&narrow.to_le_bytes())
                    }
                    TokenWidth::U32 => out.write_all(&id.to_le_bytes()),
                }
                .map_err(io)?;
            }
            written += encoding.len() as u64 + 1;
        }
    }
    out.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    Ok(written)
}

/// `<path>.partial`, where a file is written before it is renamed into place.
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Removes `path` if it is there: the marker of a complete preparation goes
/// first, so that one cut short is not taken for complete.
pub(crate) fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io {
            op: FileOp::Remove,
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` through a renamed `<path>.partial`.
pub(crate) fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e| Error::Io {
        op: FileOp::Write,
        path: path.to_path_buf(),
        source: e,
    };
    let partial = partial_path(path);
    std::fs::write(&partial, bytes).map_err(io)?;
    std::fs::rename(&partial, path).map_err(io)
}

/// Tokenizes `corpus` files into `dir` (see the module's layout) and returns what it
/// wrote. Each file is written whole or not at all, and `tokens.json` is removed
/// first and written last: a directory with a `tokens.json` holds one complete
/// preparation.
pub fn prepare_corpus(
    corpus: &[PathBuf],
    dir: &Path,
    options: &PrepareOptions,
) -> Result<CorpusInfo> {
    if !(0.0..1.0).contains(&options.validation_fraction) {
        return Err(Error::Data(DataError::InvalidTokenSetting {
            name: "validation fraction",
            value: options.validation_fraction.to_string(),
            expected: "in [0, 1)".into(),
        }));
    }
    if corpus.is_empty() {
        return Err(Error::Data(DataError::InvalidTokenSetting {
            name: "corpus",
            value: "none".into(),
            expected: "at least one corpus file".into(),
        }));
    }
    let source = CorpusSource::of(corpus, options)?;
    let mut documents = Vec::new();
    for path in corpus {
        documents.extend(read_documents(path)?);
    }
    let (train, validation) = split_held_out(&documents, options.validation_fraction);
    let tokenizer = build_tokenizer(options, &train)?;
    write_prepared(dir, &tokenizer, (&train, &validation), source, options)
}

/// The training and held-out documents (see [`is_held_out`]).
pub fn split_held_out(documents: &[String], fraction: f64) -> (Vec<&str>, Vec<&str>) {
    let (mut train, mut validation) = (Vec::new(), Vec::new());
    for (i, doc) in documents.iter().enumerate() {
        if is_held_out(i, fraction) {
            validation.push(doc.as_str());
        } else {
            train.push(doc.as_str());
        }
    }
    (train, validation)
}

/// Writes a prepared directory (the module's layout) of `train` and `validation`
/// documents under `tokenizer`.
pub fn write_prepared(
    dir: &Path,
    tokenizer: &Tokenizer,
    (train, validation): (&[&str], &[&str]),
    source: CorpusSource,
    options: &PrepareOptions,
) -> Result<CorpusInfo> {
    let eos_id = tokenizer.token_to_id(&options.eos_token).ok_or_else(|| {
        Error::Data(DataError::InvalidTokenSetting {
            name: "--eos-token",
            value: format!("{:?}", options.eos_token),
            expected: "a token of the tokenizer, to end documents with".into(),
        })
    })?;
    let vocab_size = tokenizer.get_vocab_size(true) as u32;
    let width = if vocab_size <= 1 << 16 {
        TokenWidth::U16
    } else {
        TokenWidth::U32
    };
    std::fs::create_dir_all(dir).map_err(Error::io(FileOp::CreateDir, dir.to_path_buf()))?;
    let info_path = dir.join("tokens.json");
    remove_if_present(&info_path)?;
    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer_text = tokenizer
        .to_string(false)
        .map_err(|e| tokenizer_failed(&tokenizer_path, "cannot write the tokenizer as JSON", e))?;
    write_whole(&tokenizer_path, tokenizer_text.as_bytes())?;
    let (train, validation) = (train.to_vec(), validation.to_vec());
    let info = CorpusInfo {
        width_bytes: width.bytes(),
        vocab_size,
        eos_id,
        eos_token: options.eos_token.clone(),
        train_documents: train.len(),
        train_tokens: write_token_file(tokenizer, &train, eos_id, width, &dir.join("train.bin"))?,
        validation_documents: validation.len(),
        validation_tokens: write_token_file(
            tokenizer,
            &validation,
            eos_id,
            width,
            &dir.join("validation.bin"),
        )?,
        source,
        tokenizer_crc32c: Some(crc32c::crc32c(tokenizer_text.as_bytes())),
    };
    let text = serde_json::to_string_pretty(&info).expect("plain data serialises");
    write_whole(&info_path, text.as_bytes())?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_out_documents_are_spread_and_counted_exactly() {
        let held: Vec<usize> = (0..100).filter(|&i| is_held_out(i, 0.05)).collect();
        assert_eq!(held, vec![19, 39, 59, 79, 99]);
        assert_eq!((0..1000).filter(|&i| is_held_out(i, 0.0)).count(), 0);
        assert_eq!((0..1000).filter(|&i| is_held_out(i, 0.3)).count(), 300);
    }

    #[test]
    fn a_trained_bpe_round_trips_any_text() {
        let docs = [
            "the cat sat on the mat",
            "the dog sat on the log",
            "a cat and a dog",
        ];
        let tok = train_byte_level_bpe(&docs, 300, "<|endoftext|>").unwrap();
        assert_eq!(tok.token_to_id("<|endoftext|>"), Some(0));
        // Text the corpus never had (bytes beyond ASCII included) encodes and decodes back.
        for text in ["the cat sat", "zebra ñandú 🦓"] {
            let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
        }
        // Merges were learnt: "the" is fewer ids than its three bytes.
        assert!(tok.encode("the", false).unwrap().len() < 3);
    }

    #[test]
    fn ids_beyond_u16_are_an_error_not_wrapped() {
        let tok = train_byte_level_bpe(&["abc abc"], 300, "<eos>").unwrap();
        let path = std::env::temp_dir().join(format!("adabatch-u16-{}.bin", std::process::id()));
        let err = write_token_file(&tok, &["abc"], 70_000, TokenWidth::U16, &path).unwrap_err();
        assert!(err.to_string().contains("does not fit in u16"), "{err}");
        assert!(
            !path.exists() && !partial_path(&path).exists(),
            "nothing left"
        );
    }

    #[test]
    fn too_small_a_vocabulary_is_a_typed_error() {
        let err = train_byte_level_bpe(&["abc"], 100, "<eos>").unwrap_err();
        assert!(err.to_string().contains("at least 257"), "{err}");
    }
}
