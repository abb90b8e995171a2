//! What a checkpoint holds, verified before it is used.
//!
//! `manifest.json`, written last into every checkpoint, lists each file with its
//! size and CRC-32C, and the adabatch and format versions. A resume (and the best
//! model at the end) checks every listed file first: a flipped bit in a weight or
//! a hand-edited trainer state is a typed error naming the file, not a run that
//! silently continues from other weights.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use crate::error::{CheckpointError, Error, FileOp, Result};

/// The manifest's file name.
pub(crate) const MANIFEST: &str = "manifest.json";
/// The checkpoint layout this adabatch writes: 2 adds the manifest (1 had none).
pub(crate) const FORMAT_VERSION: u32 = 2;

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Manifest {
    format_version: u32,
    adabatch_version: String,
    files: BTreeMap<String, FileRecord>,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct FileRecord {
    size: u64,
    crc32c: String,
}

fn corrupt(path: &Path, detail: impl Into<String>) -> Error {
    Error::Checkpoint(CheckpointError::corrupt(path, detail))
}

/// Size and CRC-32C of a file, read in blocks (weights can be gigabytes).
fn record(path: &Path) -> Result<FileRecord> {
    let io = |source| Error::Io {
        op: FileOp::Read,
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut buffer = vec![0u8; 1 << 20];
    let (mut crc, mut size) = (0u32, 0u64);
    loop {
        let n = file.read(&mut buffer).map_err(io)?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buffer[..n]);
        size += n as u64;
    }
    Ok(FileRecord {
        size,
        crc32c: format!("{crc:08x}"),
    })
}

/// Writes `dir/manifest.json` over every other file in `dir`, synced.
pub(crate) fn write(dir: &Path) -> Result<()> {
    let mut files = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(Error::io(FileOp::List, dir.to_path_buf()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != MANIFEST && entry.path().is_file() {
            files.insert(name, record(&entry.path())?);
        }
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        adabatch_version: env!("CARGO_PKG_VERSION").to_string(),
        files,
    };
    let path = dir.join(MANIFEST);
    let json = serde_json::to_vec_pretty(&manifest).map_err(|source| Error::Json {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, json)
        .and_then(|()| std::fs::File::open(&path)?.sync_all())
        .map_err(Error::io(FileOp::Write, path))
}

/// Checks every file the manifest lists. A checkpoint of format 1 (before
/// manifests) has none to check: `required` says whether this one must.
pub(crate) fn verify(dir: &Path, required: bool) -> Result<()> {
    let path = dir.join(MANIFEST);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(()),
        Err(e) => {
            return Err(Error::Checkpoint(CheckpointError::unreadable(
                path,
                "cannot read the manifest",
                e,
            )))
        }
    };
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| {
        Error::Checkpoint(CheckpointError::unreadable(
            &path,
            "not a checkpoint manifest",
            e,
        ))
    })?;
    if manifest.format_version > FORMAT_VERSION {
        return Err(corrupt(
            &path,
            format!(
                "checkpoint format {} (adabatch {}); this adabatch reads up to {FORMAT_VERSION}",
                manifest.format_version, manifest.adabatch_version
            ),
        ));
    }
    for (name, want) in &manifest.files {
        let file = dir.join(name);
        if !file.is_file() {
            return Err(corrupt(&file, "listed in the manifest but missing"));
        }
        let got = record(&file)?;
        if got.size != want.size {
            return Err(corrupt(
                &file,
                format!(
                    "{} bytes, the manifest says {} (the file changed after it was saved)",
                    got.size, want.size
                ),
            ));
        }
        if got.crc32c != want.crc32c {
            return Err(corrupt(
                &file,
                format!(
                    "checksum {} differs from the manifest's {} (the file changed after it was saved)",
                    got.crc32c, want.crc32c
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_names_its_file() {
        let dir = std::env::temp_dir().join(format!("adabatch-manifest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.bin"), [1u8, 2, 3, 4]).unwrap();
        std::fs::write(dir.join("b.json"), b"{}").unwrap();
        assert!(matches!(
            verify(&dir, true),
            Err(Error::Checkpoint(CheckpointError::CorruptCheckpoint { .. }))
        ));
        verify(&dir, false).unwrap();
        write(&dir).unwrap();
        verify(&dir, true).unwrap();
        // One flipped bit.
        std::fs::write(dir.join("a.bin"), [1u8, 2, 3, 5]).unwrap();
        let err = verify(&dir, true).unwrap_err().to_string();
        assert!(err.contains("a.bin") && err.contains("checksum"), "{err}");
        // A truncated file.
        std::fs::write(dir.join("a.bin"), [1u8, 2]).unwrap();
        let err = verify(&dir, true).unwrap_err().to_string();
        assert!(err.contains("2 bytes, the manifest says 4"), "{err}");
        std::fs::remove_file(dir.join("a.bin")).unwrap();
        let err = verify(&dir, true).unwrap_err().to_string();
        assert!(err.contains("listed in the manifest but missing"), "{err}");
        std::fs::write(dir.join(MANIFEST), b"{ nope").unwrap();
        let err = verify(&dir, true).unwrap_err().to_string();
        assert!(err.contains("not a checkpoint manifest"), "{err}");
    }
}
