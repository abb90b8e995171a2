//! Which reader a corpus file takes, from its name, and the shards of the inputs a
//! user gives: files as they are, folders as their corpus files in name order.

use std::path::{Path, PathBuf};

use crate::error::{DataError, Error, FileOp, Result};

/// How a file's bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

/// A corpus file's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// A document per line (`.txt`, or any name not listed below).
    Text(Compression),
    /// JSON lines, the text in a column (`.jsonl`).
    JsonLines(Compression),
    /// Apache Parquet (`.parquet`), the Hub's format.
    Parquet,
    /// Arrow IPC, stream or file (`.arrow`): `datasets`' `save_to_disk` and cache.
    Arrow,
}

impl Format {
    /// The format of a file named `path`, if its name is a corpus file's.
    pub(crate) fn recognised(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let (stem, compression) = if let Some(stem) = name.strip_suffix(".gz") {
            (stem, Compression::Gzip)
        } else if let Some(stem) = name.strip_suffix(".zst") {
            (stem, Compression::Zstd)
        } else {
            (name.as_str(), Compression::None)
        };
        let plain = compression == Compression::None;
        if stem.ends_with(".jsonl") {
            Some(Format::JsonLines(compression))
        } else if stem.ends_with(".txt") {
            Some(Format::Text(compression))
        } else if stem.ends_with(".parquet") && plain {
            Some(Format::Parquet)
        } else if stem.ends_with(".arrow") && plain {
            Some(Format::Arrow)
        } else {
            None
        }
    }

    /// The format of a file the user named: recognised, or text (as before).
    pub(crate) fn of_named(path: &Path) -> Self {
        Self::recognised(path).unwrap_or_else(|| {
            let gzipped = path.extension().is_some_and(|e| e == "gz");
            Format::Text(if gzipped {
                Compression::Gzip
            } else {
                Compression::None
            })
        })
    }

    /// The cargo feature a build needs to read this format, where it needs one.
    #[cfg_attr(feature = "parquet", allow(dead_code))]
    pub(crate) fn feature(self) -> Option<&'static str> {
        match self {
            Format::Parquet | Format::Arrow => Some("parquet"),
            Format::Text(Compression::Zstd) | Format::JsonLines(Compression::Zstd) => {
                Some("parquet")
            }
            _ => None,
        }
    }

    #[cfg_attr(feature = "parquet", allow(dead_code))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Text(_) => "text",
            Format::JsonLines(_) => "JSON lines",
            Format::Parquet => "Parquet",
            Format::Arrow => "Arrow IPC",
        }
    }
}

/// The corpus files of `inputs` in order: a file as given, a folder as the corpus
/// files it holds (not its subfolders), sorted by name. A folder without one, or
/// an input that is not there, is an error naming it.
pub(crate) fn shards(inputs: &[PathBuf]) -> Result<Vec<(PathBuf, Format)>> {
    let mut shards = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input).map_err(Error::io(FileOp::Read, input.clone()))?;
        if !meta.is_dir() {
            shards.push((input.clone(), Format::of_named(input)));
            continue;
        }
        let entries = std::fs::read_dir(input).map_err(Error::io(FileOp::List, input.clone()))?;
        let mut found = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(Error::io(FileOp::List, input.clone()))?
                .path();
            if let (true, Some(format)) = (path.is_file(), Format::recognised(&path)) {
                found.push((path, format));
            }
        }
        if found.is_empty() {
            return Err(Error::Data(DataError::Tokenizer {
                path: input.clone(),
                detail: "holds no corpus file (.parquet, .arrow, .jsonl or .txt, the last two \
                         also gzipped or zstd-compressed)"
                    .into(),
                source: None,
            }));
        }
        found.sort_by(|a, b| a.0.file_name().cmp(&b.0.file_name()));
        shards.extend(found);
    }
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_the_names() {
        let of = |name: &str| Format::recognised(Path::new(name));
        assert_eq!(of("a/train-00000-of-00002.parquet"), Some(Format::Parquet));
        assert_eq!(of("data-00000-of-00001.arrow"), Some(Format::Arrow));
        assert_eq!(
            of("x.jsonl.zst"),
            Some(Format::JsonLines(Compression::Zstd))
        );
        assert_eq!(of("X.JSONL.GZ"), Some(Format::JsonLines(Compression::Gzip)));
        assert_eq!(of("notes.txt"), Some(Format::Text(Compression::None)));
        assert_eq!(of("dataset_info.json"), None);
        assert_eq!(of("state.json"), None);
        // A file the user names is text unless recognised, as before.
        assert_eq!(
            Format::of_named(Path::new("corpus")),
            Format::Text(Compression::None)
        );
        assert_eq!(
            Format::of_named(Path::new("c.gz")),
            Format::Text(Compression::Gzip)
        );
    }
}
