//! A corpus as users have it, read as a stream of documents in a stable order: text
//! (a document per line) and JSON lines (`.jsonl`, the text in a column), plain,
//! gzipped or zstd-compressed; with the `parquet` feature the Hugging Face Hub's
//! Parquet shards and `datasets`' Arrow files (`save_to_disk` folders, the cache).
//! A folder is its corpus files in name order.
//!
//! Nothing is held whole: a reader yields a batch of texts at a time (a record
//! batch, or a thousand lines). Nulls and empty or whitespace-only texts are
//! skipped and counted ([`Skipped`]); a text is kept as it is, untrimmed. Each
//! shard is opened and checked (its text column there and of a text type, its
//! footer or schema readable) by [`Corpus::open`], before a document is read.

mod format;
mod lines;

#[cfg(feature = "parquet")]
mod columnar;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use self::format::Format;
use self::lines::LineReader;
use crate::error::{DataError, Error, Result};

/// A reader of one corpus file: its texts a batch at a time, `None` for a null.
pub(crate) trait BatchReader: Send {
    fn next_batch(&mut self) -> Result<Option<Vec<Option<String>>>>;
}

/// What a read skipped: null texts, and empty or whitespace-only ones (blank
/// lines of a text file among them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// Null texts (JSON `null`, Parquet and Arrow nulls).
    pub null: u64,
    /// Empty or whitespace-only texts.
    pub empty: u64,
}

/// The corpus files of a user's inputs, each checked, in reading order.
#[derive(Debug, Clone)]
pub struct Corpus {
    shards: Vec<(PathBuf, Format)>,
    text_column: String,
}

impl Corpus {
    /// The corpus of `inputs` (files, and folders of corpus files, in order), the
    /// text in `text_column` for JSON lines, Parquet and Arrow. Every shard is
    /// opened and checked here: a missing input, a folder without corpus files, a
    /// damaged footer or schema, a missing or non-text column, and a format this
    /// build cannot read are errors naming the file.
    pub fn open(inputs: &[PathBuf], text_column: &str) -> Result<Self> {
        if inputs.is_empty() {
            return Err(Error::Data(DataError::InvalidTokenSetting {
                name: "corpus",
                value: "none".into(),
                expected: "at least one corpus file or folder".into(),
            }));
        }
        let corpus = Self {
            shards: format::shards(inputs)?,
            text_column: text_column.to_string(),
        };
        for (path, format) in &corpus.shards {
            corpus.reader(path, *format)?;
        }
        Ok(corpus)
    }

    /// The corpus files, in reading order.
    pub fn files(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|(path, _)| path.clone()).collect()
    }

    /// Reads every document in order, a batch at a time: `f` takes each batch of
    /// kept texts (with the index of its first document) and may stop the read
    /// early. Returns what was skipped.
    pub fn read(
        &self,
        mut f: impl FnMut(usize, Vec<String>) -> Result<ControlFlow<()>>,
    ) -> Result<Skipped> {
        let mut skipped = Skipped::default();
        let mut next_index = 0;
        for (path, format) in &self.shards {
            let mut reader = self.reader(path, *format)?;
            while let Some(batch) = reader.next_batch()? {
                let mut kept = Vec::with_capacity(batch.len());
                for text in batch {
                    match text {
                        None => skipped.null += 1,
                        Some(text) if text.trim().is_empty() => skipped.empty += 1,
                        Some(text) => kept.push(text),
                    }
                }
                let first = next_index;
                next_index += kept.len();
                if f(first, kept)?.is_break() {
                    return Ok(skipped);
                }
            }
        }
        Ok(skipped)
    }

    /// Every document, in memory (small corpora and tests).
    pub fn documents(&self) -> Result<Vec<String>> {
        let mut all = Vec::new();
        self.read(|_, batch| {
            all.extend(batch);
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(all)
    }

    fn reader(&self, path: &Path, format: Format) -> Result<Box<dyn BatchReader>> {
        let column = self.text_column.as_str();
        match format {
            Format::Text(compression) => Ok(Box::new(LineReader::open(path, compression, None)?)),
            Format::JsonLines(compression) => {
                Ok(Box::new(LineReader::open(path, compression, Some(column))?))
            }
            #[cfg(feature = "parquet")]
            Format::Parquet => Ok(Box::new(columnar::ParquetReader::open(path, column)?)),
            #[cfg(feature = "parquet")]
            Format::Arrow => Ok(Box::new(columnar::ArrowReader::open(path, column)?)),
            #[cfg(not(feature = "parquet"))]
            Format::Parquet | Format::Arrow => Err(needs_feature(path, format)),
        }
    }
}

/// The corpus files of `inputs` (a folder's in name order), not opened.
pub(crate) fn shard_files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    Ok(format::shards(inputs)?
        .into_iter()
        .map(|(path, _)| path)
        .collect())
}

#[cfg(not(feature = "parquet"))]
fn needs_feature(path: &Path, format: Format) -> Error {
    Error::Data(DataError::CorpusFormatNeedsFeature {
        path: path.to_path_buf(),
        format: format.name(),
        feature: format.feature().unwrap_or("parquet"),
    })
}

#[cfg(test)]
mod tests;
