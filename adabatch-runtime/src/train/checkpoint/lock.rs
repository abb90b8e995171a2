//! One run per output directory.
//!
//! Two runs sharing `--output-dir` replace each other's checkpoints (a
//! `checkpoint-N` with one run's weights and the other's trainer state, which
//! then resumes). Rank 0 of a run that writes there holds an advisory lock on
//! `<output_dir>/.adabatch.lock` from its start to its end; a second run is
//! refused before it trains. The operating system releases the lock when the
//! process ends, however it ends, so a killed run never leaves the directory
//! locked.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use fs4::fs_std::FileExt;

use super::format::remove_partial_saves;
use crate::error::{CheckpointError, Error, FileOp, Result};

const LOCK_FILE: &str = ".adabatch.lock";

/// The output directory's lock, released when dropped.
#[derive(Debug)]
pub(crate) struct OutputLock {
    file: File,
}

impl OutputLock {
    /// Creates `output_dir` if needed (so an unwritable or non-directory path is
    /// an error now, not at the first save), locks it, and removes the hidden
    /// `.checkpoint-N.partial` directories a killed run left (nobody else can be
    /// writing them while the lock is held).
    pub(crate) fn acquire(output_dir: &Path) -> Result<Self> {
        if output_dir.exists() && !output_dir.is_dir() {
            return Err(Error::Checkpoint(CheckpointError::NotADirectory {
                flag: "--output-dir",
                path: output_dir.to_path_buf(),
            }));
        }
        std::fs::create_dir_all(output_dir).map_err(Error::io(FileOp::CreateDir, output_dir))?;
        let path = output_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(Error::io(FileOp::Write, &path))?;
        if !FileExt::try_lock_exclusive(&file).map_err(Error::io(FileOp::Lock, &path))? {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(Error::Checkpoint(CheckpointError::OutputDirBusy {
                path: output_dir.to_path_buf(),
                holder: holder.trim().to_string(),
            }));
        }
        // Who holds it, for the message a second run shows.
        file.set_len(0).map_err(Error::io(FileOp::Write, &path))?;
        file.rewind().map_err(Error::io(FileOp::Write, &path))?;
        write!(file, "process {}", std::process::id()).map_err(Error::io(FileOp::Write, &path))?;
        remove_partial_saves(output_dir)?;
        Ok(Self { file })
    }
}

/// Refuses to read checkpoints of `output_dir` while another run holds it: a
/// live run may be writing the checkpoint a reader would take (`latest`), which
/// would then look corrupt or be half-read. A shared lock for the moment of the
/// check: it conflicts with a live run's exclusive one only.
pub(crate) fn check_not_busy(output_dir: &Path) -> Result<()> {
    let path = output_dir.join(LOCK_FILE);
    let Ok(mut file) = OpenOptions::new().read(true).open(&path) else {
        // No lock file: no run has ever saved here, or it cannot be read at all
        // (the checkpoint's own reads will say why).
        return Ok(());
    };
    match FileExt::try_lock_shared(&file) {
        Ok(true) => {
            let _ = FileExt::unlock(&file);
            Ok(())
        }
        Ok(false) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            Err(Error::Checkpoint(CheckpointError::OutputDirBusy {
                path: output_dir.to_path_buf(),
                holder: holder.trim().to_string(),
            }))
        }
        Err(source) => Err(Error::Io {
            op: FileOp::Lock,
            path,
            source,
        }),
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        let _ = FileExt::unlock(&self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_is_dropped() {
        let dir = std::env::temp_dir().join(format!("adabatch-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(".checkpoint-4.partial")).unwrap();
        let first = OutputLock::acquire(&dir).unwrap();
        assert!(
            !dir.join(".checkpoint-4.partial").exists(),
            "stale partial save removed"
        );
        let err = OutputLock::acquire(&dir).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("another run is using"), "{text}");
        assert!(
            text.contains(&format!("process {}", std::process::id())),
            "{text}"
        );
        drop(first);
        OutputLock::acquire(&dir).unwrap();
        // A file where the directory should be: refused at once.
        let file = dir.join("a-file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            OutputLock::acquire(&file),
            Err(Error::Checkpoint(CheckpointError::NotADirectory { .. }))
        ));
    }
}
