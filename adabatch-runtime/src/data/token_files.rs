//! Token files, memory-mapped: a flat stream of little-endian `u16` or `u32` token
//! ids (the `.bin` files of llama2.c and nanoGPT), and two views of it as examples:
//!
//! - [`TokenWindows`]: non-overlapping windows of `seq_len + 1` tokens (inputs and
//!   their next-token targets); the last partial window is dropped;
//! - [`TokenDocuments`]: documents delimited by an EOS id, each with its closing EOS
//!   (so that a model learns where documents end); empty documents (an EOS at the
//!   start, two in a row) are skipped.
//!
//! **Memory.** The file is mapped, never read into memory: the operating system pages
//! in what is used and may drop it again. Opening a view makes *one* sequential pass
//! over the file, in constant memory besides what the view keeps: it checks every id
//! against the vocabulary size (so that serving an example later cannot fail), and
//! [`TokenDocuments`] records each document's span, 16 bytes per document (a
//! `Vec<(u64, u64)>` of offsets; a 10^9-token file of 1,000-token documents needs
//! 16 MB), never a copy of the tokens. The pass reads the file once, at disk or page-
//! cache speed. Measured (release build, one thread of a shared 2-core machine, the
//! file in the page cache): 10^9 `u16` tokens in 998,354 documents indexed in 0.77 s
//! (1.3·10^9 tokens/s), 15 MB of heap; the 2 GB of mapped pages are the kernel's
//! page cache, counted in the resident size while cached but never copied.
//!
//! A mapped file must not be truncated or rewritten while it is open: token files are
//! written once, then read (as numpy's `memmap` readers assume too).

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{DataError, Error, FileOp, Result};

/// How a token file stores each id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenWidth {
    /// Two bytes, little-endian (vocabularies up to 65,536 ids: GPT-2, llama2.c).
    U16,
    /// Four bytes, little-endian.
    U32,
}

impl TokenWidth {
    /// Bytes per token.
    pub fn bytes(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }
}

/// A memory-mapped file of token ids with its vocabulary size.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    map: Mmap,
    width: TokenWidth,
    vocab_size: u32,
}

impl TokenFile {
    /// Maps `path`, a stream of `width` ids below `vocab_size`. Checks its size only
    /// (constant time); the ids are checked by the view opened on it.
    pub fn open(path: impl AsRef<Path>, width: TokenWidth, vocab_size: u32) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if vocab_size == 0 {
            return Err(Error::Data(DataError::InvalidTokenSetting {
                name: "vocab_size",
                value: "0".into(),
                expected: "at least 1".into(),
            }));
        }
        let io = |source| Error::Io {
            op: FileOp::Read,
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let bytes = file.metadata().map_err(io)?.len();
        if bytes % width.bytes() as u64 != 0 {
            return Err(Error::Data(DataError::TokenFileSize {
                path,
                bytes,
                width: width.bytes(),
            }));
        }
        if bytes == 0 {
            return Err(Error::Data(DataError::TokenFileTooShort {
                path,
                tokens: 0,
                need: "one token".into(),
            }));
        }
        // SAFETY: the map is read-only and lives as long as `self`; the module's
        // contract is that a token file is not modified while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Ok(Self {
            path,
            map,
            width,
            vocab_size,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its id width.
    pub fn width(&self) -> TokenWidth {
        self.width
    }

    /// The vocabulary size every id is below.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.map.len() / self.width.bytes()
    }

    /// Whether there is none (never, for an opened file).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids in `range` (token positions), decoded; panics if it is out of bounds.
    pub fn tokens(&self, range: Range<usize>) -> Vec<u32> {
        let w = self.width.bytes();
        let bytes = &self.map[range.start * w..range.end * w];
        match self.width {
            TokenWidth::U16 => bytes.chunks_exact(2).map(decode_u16).collect(),
            TokenWidth::U32 => bytes.chunks_exact(4).map(decode_u32).collect(),
        }
    }

    /// Calls `visit(position, id)` for every token in order, in one sequential pass
    /// and constant memory, and stops at the first id outside the vocabulary.
    pub fn scan(&self, visit: impl FnMut(u64, u32)) -> Result<()> {
        // One loop per width, so that the decoding is not a branch per token.
        let bad = match self.width {
            TokenWidth::U16 => scan_as(&self.map, 2, decode_u16, self.vocab_size, visit),
            TokenWidth::U32 => scan_as(&self.map, 4, decode_u32, self.vocab_size, visit),
        };
        match bad {
            None => Ok(()),
            Some((position, token)) => Err(Error::Data(DataError::TokenOutOfVocab {
                path: self.path.clone(),
                position,
                token,
                vocab_size: self.vocab_size,
            })),
        }
    }
}

fn decode_u16(bytes: &[u8]) -> u32 {
    u32::from(u16::from_le_bytes([bytes[0], bytes[1]]))
}

fn decode_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// The first (position, id) at or above `vocab`, visiting the ids before it.
#[inline(always)]
fn scan_as(
    bytes: &[u8],
    width: usize,
    decode: fn(&[u8]) -> u32,
    vocab: u32,
    mut visit: impl FnMut(u64, u32),
) -> Option<(u64, u32)> {
    for (position, chunk) in bytes.chunks_exact(width).enumerate() {
        let token = decode(chunk);
        if token >= vocab {
            return Some((position as u64, token));
        }
        visit(position as u64, token);
    }
    None
}

/// Non-overlapping windows of `seq_len + 1` tokens of a token file: a window's first
/// `seq_len` ids are a model's inputs, its last `seq_len` the targets. The last
/// partial window is dropped.
#[derive(Debug)]
pub struct TokenWindows {
    file: TokenFile,
    seq_len: usize,
    windows: usize,
}

impl TokenWindows {
    /// Windows of `seq_len + 1` tokens of `file`; checks every id against the
    /// vocabulary in one pass.
    pub fn new(file: TokenFile, seq_len: usize) -> Result<Self> {
        if seq_len == 0 {
            return Err(Error::Data(DataError::InvalidTokenSetting {
                name: "seq_len",
                value: "0".into(),
                expected: "at least 1".into(),
            }));
        }
        let span = seq_len + 1;
        let windows = file.len() / span;
        if windows == 0 {
            return Err(Error::Data(DataError::TokenFileTooShort {
                path: file.path.clone(),
                tokens: file.len() as u64,
                need: format!("one window of seq_len + 1 = {span} tokens"),
            }));
        }
        file.scan(|_, _| {})?;
        Ok(Self {
            file,
            seq_len,
            windows,
        })
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        self.windows
    }

    /// Whether there is none (never, for an opened view).
    pub fn is_empty(&self) -> bool {
        self.windows == 0
    }

    /// Input tokens per window (a window holds one more).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Window `index` (`< len()`): `seq_len + 1` ids.
    pub fn window(&self, index: usize) -> Vec<u32> {
        let span = self.seq_len + 1;
        self.file.tokens(index * span..(index + 1) * span)
    }

    /// The underlying file.
    pub fn file(&self) -> &TokenFile {
        &self.file
    }
}

/// The documents of a token file, delimited by an EOS id. A document is a maximal
/// run of other ids followed by its EOS (when the file has one after it: the last
/// document may end without). An EOS with no id before it (at the start of the
/// file, or right after another) closes an empty document, which is skipped.
#[derive(Debug)]
pub struct TokenDocuments {
    file: TokenFile,
    eos_id: u32,
    /// Each document's token span `[start, end)`, EOS included.
    spans: Vec<(u64, u64)>,
}

impl TokenDocuments {
    /// Indexes the documents of `file` in one streaming pass (which also checks
    /// every id against the vocabulary); keeps 16 bytes per document.
    pub fn new(file: TokenFile, eos_id: u32) -> Result<Self> {
        if eos_id >= file.vocab_size {
            return Err(Error::Data(DataError::InvalidTokenSetting {
                name: "eos_id",
                value: eos_id.to_string(),
                expected: format!("an id inside the vocabulary of {} ids", file.vocab_size),
            }));
        }
        let mut spans = Vec::new();
        let mut start = 0u64;
        file.scan(|position, token| {
            if token == eos_id {
                if position > start {
                    spans.push((start, position + 1));
                }
                start = position + 1;
            }
        })?;
        let end = file.len() as u64;
        if end > start {
            spans.push((start, end));
        }
        if spans.is_empty() {
            return Err(Error::Data(DataError::TokenFileTooShort {
                path: file.path.clone(),
                tokens: end,
                need: format!("one document (an id other than the EOS id {eos_id})"),
            }));
        }
        spans.shrink_to_fit();
        Ok(Self {
            file,
            eos_id,
            spans,
        })
    }

    /// The same documents with every one longer than `max_len` tokens split into
    /// consecutive examples of `max_len` tokens and a shorter rest (the rest keeps
    /// the EOS). Packing puts all pieces of one example into one micro-batch, so
    /// this bounds a micro-batch of `b` examples at `b · ⌈max_len / seq_len⌉`
    /// packed rows whatever the corpus holds (one 10 MB line included). Each split
    /// costs one target: a piece's last token no longer predicts the next piece's
    /// first. Every token is still used exactly once per epoch. `max_len` below 2
    /// is a typed error.
    pub fn with_max_len(mut self, max_len: usize) -> Result<Self> {
        if max_len < 2 {
            return Err(Error::Data(DataError::InvalidTokenSetting {
                name: "maximum document length",
                value: format!("{max_len} tokens"),
                expected: "at least 2 (a token and its target)".into(),
            }));
        }
        let max = max_len as u64;
        let mut spans = Vec::with_capacity(self.spans.len());
        for &(start, end) in &self.spans {
            let mut from = start;
            while end - from > max {
                spans.push((from, from + max));
                from += max;
            }
            spans.push((from, end));
        }
        spans.shrink_to_fit();
        self.spans = spans;
        Ok(self)
    }

    /// The longest document, in tokens (its EOS included).
    pub fn max_document_len(&self) -> usize {
        self.spans
            .iter()
            .map(|(s, e)| (e - s) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Number of (non-empty) documents.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there is none (never, for an opened view).
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The EOS id that delimits documents.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// Tokens of document `index` (`< len()`), its EOS included.
    pub fn document_len(&self, index: usize) -> usize {
        let (start, end) = self.spans[index];
        (end - start) as usize
    }

    /// Document `index` (`< len()`): its ids, its closing EOS included.
    pub fn document(&self, index: usize) -> Vec<u32> {
        let (start, end) = self.spans[index];
        self.file.tokens(start as usize..end as usize)
    }

    /// The underlying file.
    pub fn file(&self) -> &TokenFile {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh file in the temp dir holding `bytes`.
    fn temp_file(bytes: &[u8]) -> PathBuf {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("adabatch-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.bin", NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn encode(tokens: &[u32], width: TokenWidth) -> Vec<u8> {
        match width {
            TokenWidth::U16 => tokens
                .iter()
                .flat_map(|&t| u16::try_from(t).unwrap().to_le_bytes())
                .collect(),
            TokenWidth::U32 => tokens.iter().flat_map(|&t| t.to_le_bytes()).collect(),
        }
    }

    fn file(tokens: &[u32], width: TokenWidth, vocab: u32) -> Result<TokenFile> {
        TokenFile::open(temp_file(&encode(tokens, width)), width, vocab)
    }

    const WIDTHS: [TokenWidth; 2] = [TokenWidth::U16, TokenWidth::U32];

    #[test]
    fn windows_are_consecutive_and_drop_the_partial_tail() {
        for width in WIDTHS {
            let tokens: Vec<u32> = (0..11).map(|t| t * 997 % 1000).collect();
            let w = TokenWindows::new(file(&tokens, width, 1000).unwrap(), 2).unwrap();
            assert_eq!((w.len(), w.seq_len()), (3, 2));
            for i in 0..3 {
                assert_eq!(w.window(i), tokens[i * 3..i * 3 + 3], "{width:?}");
            }
        }
    }

    #[test]
    fn long_documents_split_into_bounded_examples_that_cover_them() {
        // A 1,000-token document between two short ones; EOS id 0.
        let long: Vec<u32> = (0..1000).map(|i| 1 + i % 50).collect();
        let tokens: Vec<u32> = [vec![7, 8, 0], long.clone(), vec![0, 9, 0]].concat();
        let docs = TokenDocuments::new(file(&tokens, TokenWidth::U16, 60).unwrap(), 0)
            .unwrap()
            .with_max_len(300)
            .unwrap();
        assert_eq!(docs.max_document_len(), 300);
        let lens: Vec<usize> = (0..docs.len()).map(|i| docs.document_len(i)).collect();
        assert_eq!(lens, [3, 300, 300, 300, 101, 2]);
        // The pieces are the document, in order, its EOS at the end.
        let joined: Vec<u32> = (1..5).flat_map(|i| docs.document(i)).collect();
        assert_eq!(joined, [long, vec![0]].concat());
        assert!(matches!(
            TokenDocuments::new(file(&tokens, TokenWidth::U16, 60).unwrap(), 0)
                .unwrap()
                .with_max_len(1),
            Err(Error::Data(DataError::InvalidTokenSetting { .. }))
        ));
    }

    #[test]
    fn u32_ids_above_u16_read_back() {
        let tokens = [70_000, 1, 65_536, 4_000_000_000];
        let f = file(&tokens, TokenWidth::U32, u32::MAX).unwrap();
        assert_eq!(f.tokens(0..4), tokens);
        assert_eq!(TokenWindows::new(f, 3).unwrap().window(0), tokens);
    }

    #[test]
    fn a_file_too_short_for_one_window_is_an_error() {
        let f = file(&[1, 2, 3], TokenWidth::U16, 10).unwrap();
        let err = TokenWindows::new(f, 3).unwrap_err();
        assert!(
            matches!(err, Error::Data(DataError::TokenFileTooShort { tokens: 3, ref need, .. }) if need.contains("4 tokens")),
            "{err}"
        );
        // Exactly one window is enough.
        let f = file(&[1, 2, 3, 4], TokenWidth::U16, 10).unwrap();
        assert_eq!(TokenWindows::new(f, 3).unwrap().len(), 1);
    }

    #[test]
    fn an_empty_file_is_an_error() {
        let err = TokenFile::open(temp_file(&[]), TokenWidth::U16, 10).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Data(DataError::TokenFileTooShort { tokens: 0, .. })
            ),
            "{err}"
        );
    }

    #[test]
    fn a_byte_count_not_a_multiple_of_the_width_is_an_error() {
        let path = temp_file(&[0; 6]);
        let err = TokenFile::open(&path, TokenWidth::U32, 10).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Data(DataError::TokenFileSize {
                    bytes: 6,
                    width: 4,
                    ..
                })
            ),
            "{err}"
        );
        // The same bytes are three u16 tokens.
        assert_eq!(
            TokenFile::open(&path, TokenWidth::U16, 10).unwrap().len(),
            3
        );
        let err = TokenFile::open(temp_file(&[0; 3]), TokenWidth::U16, 10).unwrap_err();
        assert!(matches!(
            err,
            Error::Data(DataError::TokenFileSize {
                bytes: 3,
                width: 2,
                ..
            })
        ));
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_an_error_in_both_views() {
        for width in WIDTHS {
            // The bad id sits in the dropped tail of the windows: still checked.
            let tokens = [1, 2, 3, 0, 9, 10];
            let err = TokenWindows::new(file(&tokens, width, 10).unwrap(), 2).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Data(DataError::TokenOutOfVocab {
                        position: 5,
                        token: 10,
                        vocab_size: 10,
                        ..
                    })
                ),
                "{err}"
            );
            let err = TokenDocuments::new(file(&tokens, width, 10).unwrap(), 0).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Data(DataError::TokenOutOfVocab { position: 5, .. })
                ),
                "{err}"
            );
            let ok = [1, 2, 3, 0, 9, 9];
            assert!(TokenDocuments::new(file(&ok, width, 10).unwrap(), 0).is_ok());
        }
    }

    #[test]
    fn a_missing_file_is_an_io_error_naming_it() {
        let path = temp_file(&[]).with_file_name("absent.bin");
        let err = TokenFile::open(&path, TokenWidth::U16, 10).unwrap_err();
        assert!(
            matches!(err, Error::Io { path: ref p, .. } if *p == path),
            "{err}"
        );
    }

    #[test]
    fn settings_that_cannot_work_are_errors() {
        let err = TokenFile::open(temp_file(&[0, 0]), TokenWidth::U16, 0).unwrap_err();
        assert!(
            matches!(err, Error::Data(DataError::InvalidTokenSetting { .. })),
            "{err}"
        );
        let f = file(&[1, 2, 3], TokenWidth::U16, 10).unwrap();
        assert!(matches!(
            TokenWindows::new(f, 0),
            Err(Error::Data(DataError::InvalidTokenSetting { .. }))
        ));
        let f = file(&[1, 2, 3], TokenWidth::U16, 10).unwrap();
        assert!(matches!(
            TokenDocuments::new(f, 10),
            Err(Error::Data(DataError::InvalidTokenSetting { .. }))
        ));
    }

    fn documents(tokens: &[u32], width: TokenWidth) -> Vec<Vec<u32>> {
        let docs = TokenDocuments::new(file(tokens, width, 100).unwrap(), 0).unwrap();
        (0..docs.len())
            .map(|i| {
                assert_eq!(docs.document_len(i), docs.document(i).len());
                docs.document(i)
            })
            .collect()
    }

    #[test]
    fn documents_keep_their_eos_and_skip_empty_ones() {
        for width in WIDTHS {
            // EOS at the start, two in a row, a last document without EOS.
            let docs = documents(&[0, 5, 6, 0, 0, 7, 0, 8, 9], width);
            assert_eq!(docs, vec![vec![5, 6, 0], vec![7, 0], vec![8, 9]]);
            // EOS at the end: no empty document after it.
            let docs = documents(&[5, 0, 0, 6, 7, 0], width);
            assert_eq!(docs, vec![vec![5, 0], vec![6, 7, 0]]);
            // No EOS at all: one document.
            assert_eq!(documents(&[3, 4], width), vec![vec![3, 4]]);
        }
    }

    #[test]
    fn a_file_of_only_eos_has_no_document() {
        let err =
            TokenDocuments::new(file(&[0, 0, 0], TokenWidth::U16, 10).unwrap(), 0).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Data(DataError::TokenFileTooShort { tokens: 3, .. })
            ),
            "{err}"
        );
    }
}
