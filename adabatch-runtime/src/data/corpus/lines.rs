//! Corpus files of lines: text (a document per line) and JSON lines (the text in a
//! column), plain, gzipped or zstd-compressed, read a batch of lines at a time.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::format::Compression;
use super::BatchReader;
use crate::error::{Cause, DataError, Error, FileOp, Result};

/// Lines per batch.
const BATCH_LINES: usize = 1024;

/// A file of lines, each a document (text) or a JSON object holding one.
pub(crate) struct LineReader {
    lines: std::io::Lines<BufReader<Box<dyn Read + Send>>>,
    path: PathBuf,
    /// The JSON field of the text; `None` for text files.
    column: Option<String>,
    number: usize,
}

impl LineReader {
    /// Opens `path`, decompressing as `compression` says; `column` is the JSON
    /// field of a JSON-lines file, `None` for text.
    pub(crate) fn open(
        path: &Path,
        compression: Compression,
        column: Option<&str>,
    ) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(Error::io(FileOp::Read, path))?;
        let reader: Box<dyn Read + Send> = match compression {
            Compression::None => Box::new(file),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
            Compression::Zstd => zstd(file, path)?,
        };
        Ok(Self {
            lines: BufReader::with_capacity(1 << 16, reader).lines(),
            path: path.to_path_buf(),
            column: column.map(str::to_string),
            number: 0,
        })
    }

    /// The text of JSON line `self.number`: `None` for a null.
    fn json_text(&self, line: &str) -> Result<Option<String>> {
        let column = self.column.as_deref().unwrap_or("text");
        let mut value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| failed(&self.path, format!("line {} is not JSON", self.number), e))?;
        match value.get_mut(column).map(serde_json::Value::take) {
            Some(serde_json::Value::String(text)) => Ok(Some(text)),
            Some(serde_json::Value::Null) => Ok(None),
            Some(other) => Err(data_error(
                &self.path,
                format!(
                    "line {}: the field {column:?} is {}, not a string",
                    self.number,
                    kind_of(&other)
                ),
            )),
            None => Err(data_error(
                &self.path,
                format!("line {}: no string field {column:?}", self.number),
            )),
        }
    }
}

impl BatchReader for LineReader {
    fn next_batch(&mut self) -> Result<Option<Vec<Option<String>>>> {
        let mut batch = Vec::new();
        while batch.len() < BATCH_LINES {
            let Some(line) = self.lines.next() else {
                break;
            };
            self.number += 1;
            let line = line.map_err(Error::io(FileOp::Read, self.path.clone()))?;
            if self.column.is_none() {
                batch.push(Some(line));
            } else if line.trim().is_empty() {
                // A blank line between JSON objects is no document at all.
                batch.push(Some(line));
            } else {
                batch.push(self.json_text(&line)?);
            }
        }
        Ok((!batch.is_empty()).then_some(batch))
    }
}

#[cfg(feature = "parquet")]
fn zstd(file: std::fs::File, path: &Path) -> Result<Box<dyn Read + Send>> {
    use ruzstd::decoding::{FrameDecoder, StreamingDecoder};
    let decoder = StreamingDecoder::new_with_decoder(BufReader::new(file), FrameDecoder::new())
        .map_err(|e| failed(path, "is not zstd-compressed", e))?;
    Ok(Box::new(ZstdFrames(Some(decoder))))
}

/// A zstd stream of one frame after another (`zstd` writes several for large or
/// concatenated inputs; ruzstd's decoder reads one).
#[cfg(feature = "parquet")]
struct ZstdFrames(
    Option<
        ruzstd::decoding::StreamingDecoder<
            BufReader<std::fs::File>,
            ruzstd::decoding::FrameDecoder,
        >,
    >,
);

#[cfg(feature = "parquet")]
impl Read for ZstdFrames {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(decoder) = self.0.as_mut() else {
                return Ok(0);
            };
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // The frame is done: the next one, if the file goes on.
            let (mut source, frames) = self.0.take().map(|d| d.into_parts()).expect("a decoder");
            if source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            let next = ruzstd::decoding::StreamingDecoder::new_with_decoder(source, frames)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            self.0 = Some(next);
        }
    }
}

#[cfg(not(feature = "parquet"))]
fn zstd(_file: std::fs::File, path: &Path) -> Result<Box<dyn Read + Send>> {
    Err(Error::Data(DataError::CorpusFormatNeedsFeature {
        path: path.to_path_buf(),
        format: "zstd-compressed",
        feature: "parquet",
    }))
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
        _ => "not text",
    }
}

pub(crate) fn data_error(path: &Path, detail: impl Into<String>) -> Error {
    Error::Data(DataError::Tokenizer {
        path: path.to_path_buf(),
        detail: detail.into(),
        source: None,
    })
}

pub(crate) fn failed(path: &Path, detail: impl Into<String>, source: impl Into<Cause>) -> Error {
    Error::Data(DataError::Tokenizer {
        path: path.to_path_buf(),
        detail: detail.into(),
        source: Some(source.into()),
    })
}
