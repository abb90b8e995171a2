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
//! A corpus is what [`Corpus`] reads: text (a document per line), JSON lines, and
//! with the `parquet` feature Parquet shards and Arrow files, in files or folders;
//! nulls and empty texts are skipped and counted. It is streamed: documents flow a
//! batch at a time from the reader through the tokenizer (on every core) into the
//! token files, so memory does not grow with the corpus, and the bytes written do
//! not depend on the number of threads. The held-out documents are spread evenly
//! through the corpus (document `i` is held out when `⌊(i+1)·f⌋ > ⌊i·f⌋` for the
//! fraction `f`), and a trained tokenizer sees only training documents: the first
//! ones, up to [`PrepareOptions::bpe_sample_bytes`] of text.

use std::io::{BufWriter, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
/// Hugging Face's tokenizer (to decode sampled ids, or encode prompts).
pub use tokenizers::Tokenizer;
use tokenizers::{AddedToken, TokenizerBuilder};

use super::cached_bpe::DocumentEncoder;
pub use super::corpus::{Corpus, Skipped};
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
    /// The column that holds the text in JSON lines, Parquet and Arrow files.
    pub text_column: String,
    /// Text a trained tokenizer learns from: the first training documents, up to
    /// this many bytes (said in `tokens.json`).
    pub bpe_sample_bytes: u64,
    /// Show a progress bar on standard error (documents, bytes, tokens per second).
    pub progress: bool,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        Self {
            tokenizer: TokenizerSource::TrainBpe { vocab_size: 4096 },
            eos_token: "<|endoftext|>".into(),
            validation_fraction: 0.05,
            text_column: "text".into(),
            bpe_sample_bytes: 256 << 20,
            progress: false,
        }
    }
}

/// What [`prepare_corpus`] wrote: `tokens.json`, read back by [`CorpusInfo::read`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Null and empty texts the corpus held, skipped (absent in older directories).
    #[serde(default)]
    pub skipped: Skipped,
    /// What a trained tokenizer learnt from (none for a loaded one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpe_sample: Option<BpeSample>,
    /// How the documents were encoded: a byte-level BPE (GPT-2's layout) with a word
    /// cache, or `tokenizers`' own pipeline and what kept the cache out; the ids are
    /// the same either way (absent in older directories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder: Option<String>,
}

/// The documents a trained tokenizer learnt from: the first training documents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BpeSample {
    /// Training documents in the sample.
    pub documents: usize,
    /// Their bytes of text.
    pub bytes: u64,
    /// The limit asked for ([`PrepareOptions::bpe_sample_bytes`]).
    pub limit_bytes: u64,
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
    /// The text column read.
    #[serde(default = "default_text_column")]
    pub text_column: String,
}

fn default_text_column() -> String {
    "text".into()
}

impl CorpusSource {
    /// The source `options` would prepare `corpus` from (the files' current sizes;
    /// a folder's corpus files).
    pub fn of(corpus: &[PathBuf], options: &PrepareOptions) -> Result<Self> {
        let files = super::corpus::shard_files(corpus)?
            .iter()
            .map(|path| {
                let meta =
                    std::fs::metadata(path).map_err(Error::io(FileOp::Read, path.clone()))?;
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
            text_column: options.text_column.clone(),
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
    let text =
        std::fs::read_to_string(path).map_err(Error::io(FileOp::Read, path.to_path_buf()))?;
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
    let loaded =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| text.parse::<Tokenizer>()));
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

/// The documents of a corpus file (or folder), in memory: one per line, or the
/// `"text"` of each JSON line of a `.jsonl` file, and so on ([`Corpus`]); null and
/// empty texts skipped. For small corpora: [`prepare_corpus`] streams.
pub fn read_documents(path: &Path) -> Result<Vec<String>> {
    let documents = Corpus::open(&[path.to_path_buf()], "text")?.documents()?;
    if documents.is_empty() {
        return Err(tokenizer_error(path, "the corpus holds no document"));
    }
    Ok(documents)
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
        TokenizerSource::File(path) => load_tokenizer(path),
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
    let mut writer = TokenWriter::create(path, width, eos_id)?;
    let encoder = DocumentEncoder::new(tokenizer);
    let written = documents.chunks(4096).try_for_each(|chunk| {
        let encoded = encoder
            .encode(chunk)
            .map_err(|e| tokenizer_failed(path, "cannot encode the documents", e))?;
        encoded.iter().try_for_each(|ids| writer.write(ids))
    });
    match written {
        Ok(()) => writer.finish().map(|(tokens, _)| tokens),
        Err(e) => {
            writer.abandon();
            Err(e)
        }
    }
}

/// A token file being written: documents' ids, each followed by the EOS id, as
/// little-endian integers of `width`, into `<path>.partial`, renamed into place by
/// [`TokenWriter::finish`]: a reader never maps a half-written file, and a file
/// another process has mapped is replaced, not truncated under it.
struct TokenWriter {
    out: BufWriter<std::fs::File>,
    partial: PathBuf,
    path: PathBuf,
    width: TokenWidth,
    eos_id: u32,
    tokens: u64,
    documents: usize,
    bytes: Vec<u8>,
}

impl TokenWriter {
    fn create(path: &Path, width: TokenWidth, eos_id: u32) -> Result<Self> {
        let partial = partial_path(path);
        let file = std::fs::File::create(&partial).map_err(Error::io(FileOp::Write, path))?;
        Ok(Self {
            out: BufWriter::with_capacity(1 << 20, file),
            partial,
            path: path.to_path_buf(),
            width,
            eos_id,
            tokens: 0,
            documents: 0,
            bytes: Vec::new(),
        })
    }

    /// One document's ids, and the EOS id after them. An id that does not fit the
    /// width is an error, not a wrapped id.
    fn write(&mut self, ids: &[u32]) -> Result<()> {
        self.bytes.clear();
        for &id in ids.iter().chain([&self.eos_id]) {
            match self.width {
                TokenWidth::U16 => {
                    let narrow = u16::try_from(id).map_err(|_| {
                        tokenizer_error(&self.path, format!("id {id} does not fit in u16 tokens"))
                    })?;
                    self.bytes.extend_from_slice(&narrow.to_le_bytes());
                }
                TokenWidth::U32 => self.bytes.extend_from_slice(&id.to_le_bytes()),
            }
        }
        self.out
            .write_all(&self.bytes)
            .map_err(Error::io(FileOp::Write, self.path.clone()))?;
        self.tokens += ids.len() as u64 + 1;
        self.documents += 1;
        Ok(())
    }

    /// Flushed, synced and renamed into place: the tokens and documents written.
    fn finish(self) -> Result<(u64, usize)> {
        let io = Error::io(FileOp::Write, self.path.clone());
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all()
            .map_err(Error::io(FileOp::Write, self.path.clone()))?;
        drop(file);
        std::fs::rename(&self.partial, &self.path)
            .map_err(Error::io(FileOp::Rename, self.path.clone()))?;
        Ok((self.tokens, self.documents))
    }

    /// Removes what was written: nothing is left at the path.
    fn abandon(self) {
        drop(self.out);
        std::fs::remove_file(&self.partial).ok();
    }
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

/// Tokenizes a corpus (files and folders, as [`Corpus`] reads them) into `dir`
/// (see the module's layout), streaming, and returns what it wrote. Every shard is
/// checked before anything is written; each file is written whole or not at all,
/// and `tokens.json` is removed first and written last: a directory with a
/// `tokens.json` holds one complete preparation.
pub fn prepare_corpus(
    corpus: &[PathBuf],
    dir: &Path,
    options: &PrepareOptions,
) -> Result<CorpusInfo> {
    check_fraction(options)?;
    let opened = Corpus::open(corpus, &options.text_column)?;
    let source = CorpusSource::of(corpus, options)?;
    let (tokenizer, sample) = tokenizer_for(options, std::slice::from_ref(&opened))?;
    write_corpus(dir, &tokenizer, &opened, source, options, sample)
}

/// The held-out share must lie in `[0, 1)`.
pub(crate) fn check_fraction(options: &PrepareOptions) -> Result<()> {
    if (0.0..1.0).contains(&options.validation_fraction) {
        return Ok(());
    }
    Err(Error::Data(DataError::InvalidTokenSetting {
        name: "validation fraction",
        value: options.validation_fraction.to_string(),
        expected: "in [0, 1)".into(),
    }))
}

/// The tokenizer of `options` for `corpora`: loaded, or a byte-level BPE trained on
/// the first training documents of each corpus, up to an equal share of
/// [`PrepareOptions::bpe_sample_bytes`] each (what it learnt from returned).
pub(crate) fn tokenizer_for(
    options: &PrepareOptions,
    corpora: &[Corpus],
) -> Result<(Tokenizer, Option<BpeSample>)> {
    let vocab_size = match &options.tokenizer {
        TokenizerSource::File(path) => return Ok((load_tokenizer(path)?, None)),
        TokenizerSource::TrainBpe { vocab_size } => *vocab_size,
    };
    let limit = options.bpe_sample_bytes;
    let share = limit / corpora.len().max(1) as u64;
    let mut sample: Vec<String> = Vec::new();
    let mut bytes = 0u64;
    for corpus in corpora {
        let mut taken = 0u64;
        corpus.read(|first, batch| {
            for (i, text) in batch.into_iter().enumerate() {
                if taken >= share {
                    return Ok(ControlFlow::Break(()));
                }
                if !is_held_out(first + i, options.validation_fraction) {
                    taken += text.len() as u64;
                    sample.push(text);
                }
            }
            Ok(ControlFlow::Continue(()))
        })?;
        bytes += taken;
    }
    if sample.is_empty() {
        let first = corpora
            .iter()
            .flat_map(Corpus::files)
            .next()
            .unwrap_or_default();
        return Err(tokenizer_error(
            &first,
            "the corpus holds no document to learn a tokenizer from (every text is null, \
             empty or held out)",
        ));
    }
    let texts: Vec<&str> = sample.iter().map(String::as_str).collect();
    let tokenizer = train_byte_level_bpe(&texts, vocab_size, &options.eos_token)?;
    let sample = BpeSample {
        documents: sample.len(),
        bytes,
        limit_bytes: limit,
    };
    Ok((tokenizer, Some(sample)))
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

/// The start of a prepared directory: `tokens.json` removed, `tokenizer.json`
/// written; the EOS id, the token width and the tokenizer's CRC-32C.
fn start_prepared(
    dir: &Path,
    tokenizer: &Tokenizer,
    options: &PrepareOptions,
) -> Result<(u32, TokenWidth, u32)> {
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
    remove_if_present(&dir.join("tokens.json"))?;
    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer_text = tokenizer
        .to_string(false)
        .map_err(|e| tokenizer_failed(&tokenizer_path, "cannot write the tokenizer as JSON", e))?;
    write_whole(&tokenizer_path, tokenizer_text.as_bytes())?;
    Ok((eos_id, width, crc32c::crc32c(tokenizer_text.as_bytes())))
}

/// `tokens.json`, written last.
fn finish_prepared(dir: &Path, info: &CorpusInfo) -> Result<()> {
    let text = serde_json::to_string_pretty(info).expect("plain data serialises");
    write_whole(&dir.join("tokens.json"), text.as_bytes())
}

/// Streams `corpus` through `tokenizer` into a prepared directory (the module's
/// layout). A corpus with no document is an error, and leaves no token file.
pub(crate) fn write_corpus(
    dir: &Path,
    tokenizer: &Tokenizer,
    corpus: &Corpus,
    source: CorpusSource,
    options: &PrepareOptions,
    bpe_sample: Option<BpeSample>,
) -> Result<CorpusInfo> {
    let (eos_id, width, crc) = start_prepared(dir, tokenizer, options)?;
    let train_path = dir.join("train.bin");
    let mut train = TokenWriter::create(&train_path, width, eos_id)?;
    let mut validation = match TokenWriter::create(&dir.join("validation.bin"), width, eos_id) {
        Ok(writer) => writer,
        Err(e) => {
            train.abandon();
            return Err(e);
        }
    };
    let progress = Progress::new(options.progress, dir);
    let fraction = options.validation_fraction;
    let encoder = DocumentEncoder::new(tokenizer);
    let into = Encoder {
        encoder: &encoder,
        path: &train_path,
        fraction,
        progress: &progress,
    };
    let streamed = into.stream(corpus, [&mut train, &mut validation]);
    progress.finish();
    let skipped = match streamed {
        Ok(skipped) if train.documents + validation.documents > 0 => skipped,
        outcome => {
            train.abandon();
            validation.abandon();
            outcome?;
            return Err(tokenizer_error(
                &corpus.files().into_iter().next().unwrap_or_default(),
                "the corpus holds no document (every text is null, empty or whitespace)",
            ));
        }
    };
    let (train_tokens, train_documents) = train.finish()?;
    let (validation_tokens, validation_documents) = validation.finish()?;
    let info = CorpusInfo {
        width_bytes: width.bytes(),
        vocab_size: tokenizer.get_vocab_size(true) as u32,
        eos_id,
        eos_token: options.eos_token.clone(),
        train_documents,
        train_tokens,
        validation_documents,
        validation_tokens,
        source,
        tokenizer_crc32c: Some(crc),
        skipped,
        bpe_sample,
        encoder: Some(encoder.describe()),
    };
    finish_prepared(dir, &info)?;
    Ok(info)
}

/// Text encoded in one call: enough for every core to stay busy between calls, and
/// no more (an encoding holds about 100 bytes a token).
const ENCODE_BYTES: usize = 1 << 20;

/// A corpus's documents into token files: each to the training file or, when held
/// out, the validation one.
struct Encoder<'a> {
    encoder: &'a DocumentEncoder<'a>,
    /// Named by encoding errors.
    path: &'a Path,
    fraction: f64,
    progress: &'a Progress,
}

impl Encoder<'_> {
    /// Reads `corpus` on a thread of its own, a few batches ahead, while this one
    /// encodes chunks of about [`ENCODE_BYTES`] and writes them in order to
    /// `writers` (training, held out). What the read skipped.
    fn stream(&self, corpus: &Corpus, mut writers: [&mut TokenWriter; 2]) -> Result<Skipped> {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<(usize, Vec<String>)>(4);
        std::thread::scope(|scope| {
            let reader = scope.spawn(move || {
                corpus.read(|first, batch| match sender.send((first, batch)) {
                    Ok(()) => Ok(ControlFlow::Continue(())),
                    // The encoder stopped (on an error of its own, returned below).
                    Err(_) => Ok(ControlFlow::Break(())),
                })
            });
            let written = self.chunks(receiver.iter(), &mut writers);
            // A reader waiting to send sees the channel closed and stops.
            drop(receiver);
            let read = reader
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            written.and(read)
        })
    }

    /// The batches gathered into chunks of about [`ENCODE_BYTES`], each encoded and
    /// written.
    fn chunks(
        &self,
        batches: impl Iterator<Item = (usize, Vec<String>)>,
        writers: &mut [&mut TokenWriter; 2],
    ) -> Result<()> {
        let (mut pending, mut first, mut bytes) = (Vec::new(), 0, 0);
        for (start, batch) in batches {
            if pending.is_empty() {
                first = start;
            }
            bytes += batch.iter().map(String::len).sum::<usize>();
            pending.extend(batch);
            if bytes >= ENCODE_BYTES {
                self.write(first, &pending, writers)?;
                (pending, bytes) = (Vec::new(), 0);
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        self.write(first, &pending, writers)
    }

    /// Documents `first..` encoded and written.
    fn write(
        &self,
        first: usize,
        documents: &[String],
        [train, validation]: &mut [&mut TokenWriter; 2],
    ) -> Result<()> {
        let encoded = self
            .encoder
            .encode(documents)
            .map_err(|e| tokenizer_failed(self.path, "cannot encode the documents", e))?;
        let mut tokens = 0;
        for (i, ids) in encoded.iter().enumerate() {
            let writer = match is_held_out(first + i, self.fraction) {
                true => &mut **validation,
                false => &mut **train,
            };
            writer.write(ids)?;
            tokens += ids.len() as u64 + 1;
        }
        self.progress.add(documents, tokens);
        Ok(())
    }
}

/// Writes a prepared directory (the module's layout) of `train` and `validation`
/// documents held in memory under `tokenizer`.
pub fn write_prepared(
    dir: &Path,
    tokenizer: &Tokenizer,
    (train, validation): (&[&str], &[&str]),
    source: CorpusSource,
    options: &PrepareOptions,
) -> Result<CorpusInfo> {
    let (eos_id, width, crc) = start_prepared(dir, tokenizer, options)?;
    let info = CorpusInfo {
        width_bytes: width.bytes(),
        vocab_size: tokenizer.get_vocab_size(true) as u32,
        eos_id,
        eos_token: options.eos_token.clone(),
        train_documents: train.len(),
        train_tokens: write_token_file(tokenizer, train, eos_id, width, &dir.join("train.bin"))?,
        validation_documents: validation.len(),
        validation_tokens: write_token_file(
            tokenizer,
            validation,
            eos_id,
            width,
            &dir.join("validation.bin"),
        )?,
        source,
        tokenizer_crc32c: Some(crc),
        skipped: Skipped::default(),
        bpe_sample: None,
        encoder: Some(DocumentEncoder::new(tokenizer).describe()),
    };
    finish_prepared(dir, &info)?;
    Ok(info)
}

/// A progress bar on standard error while a corpus streams (hidden unless asked
/// for): documents, bytes of text, tokens and tokens per second.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    started: std::time::Instant,
    counts: std::cell::Cell<(u64, u64, u64)>,
}

impl Progress {
    fn new(show: bool, dir: &Path) -> Self {
        let bar = show.then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_prefix(dir.display().to_string());
            bar
        });
        Self {
            bar,
            started: std::time::Instant::now(),
            counts: std::cell::Cell::new((0, 0, 0)),
        }
    }

    fn add(&self, batch: &[String], tokens: u64) {
        let (documents, bytes, all) = self.counts.get();
        let bytes = bytes + batch.iter().map(|t| t.len() as u64).sum::<u64>();
        let counts = (documents + batch.len() as u64, bytes, all + tokens);
        self.counts.set(counts);
        if let Some(bar) = &self.bar {
            // The rate is shown, never acted on.
            let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "{}: {} documents, {:.1} MB, {} tokens, {:.0} tokens/s",
                bar.prefix(),
                counts.0,
                counts.1 as f64 / 1e6,
                counts.2,
                counts.2 as f64 / seconds
            ));
            bar.tick();
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
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

    /// The ids a file of `width` holds.
    fn ids_in(path: &Path) -> Vec<u32> {
        let bytes = std::fs::read(path).unwrap();
        bytes
            .chunks(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
            .collect()
    }

    /// Streamed token files hold each kept text encoded as it is, then the EOS id,
    /// split by `is_held_out`, the same bytes in pools of 1 and 3 threads; nulls and
    /// empty texts are counted in `tokens.json`.
    #[test]
    fn streamed_files_are_each_text_encoded_then_eos_whatever_the_threads() {
        let dir = std::env::temp_dir().join(format!("adabatch-stream-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        let texts: Vec<Option<String>> = (0..3000)
            .map(|i| match i % 97 {
                5 => None,
                6 => Some("  ".into()),
                _ => Some(format!(" the {i}th cat sat on the {} mat. ", i % 13)),
            })
            .collect();
        let lines: Vec<String> = texts
            .iter()
            .map(|t| serde_json::json!({ "body": t }).to_string())
            .collect();
        let corpus = dir.join("c.jsonl");
        std::fs::write(&corpus, lines.join("\n")).unwrap();
        let kept: Vec<&str> = texts
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|t| !t.trim().is_empty())
            .collect();
        let tokenizer = train_byte_level_bpe(&kept[..200], 400, "<|endoftext|>").unwrap();
        std::fs::write(dir.join("tok.json"), tokenizer.to_string(false).unwrap()).unwrap();
        let options = PrepareOptions {
            tokenizer: TokenizerSource::File(dir.join("tok.json")),
            text_column: "body".into(),
            validation_fraction: 0.1,
            ..PrepareOptions::default()
        };
        let mut outputs = Vec::new();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let out = dir.join(format!("out{threads}"));
            let info = pool
                .install(|| prepare_corpus(std::slice::from_ref(&corpus), &out, &options))
                .unwrap();
            assert_eq!(
                info.skipped,
                Skipped {
                    null: 31,
                    empty: 31
                }
            );
            assert_eq!(CorpusInfo::read(&out).unwrap(), info);
            outputs.push((
                ids_in(&out.join("train.bin")),
                ids_in(&out.join("validation.bin")),
            ));
        }
        assert_eq!(outputs[0], outputs[1], "the same bytes in 1 and 3 threads");
        let (mut train, mut validation) = (Vec::new(), Vec::new());
        for (i, text) in kept.iter().enumerate() {
            let ids = tokenizer.encode(*text, false).unwrap().get_ids().to_vec();
            let into = if is_held_out(i, 0.1) {
                &mut validation
            } else {
                &mut train
            };
            into.extend(ids);
            into.push(0);
        }
        assert_eq!(outputs[0], (train, validation));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn too_small_a_vocabulary_is_a_typed_error() {
        let err = train_byte_level_bpe(&["abc"], 100, "<eos>").unwrap_err();
        assert!(err.to_string().contains("at least 257"), "{err}");
    }
}
