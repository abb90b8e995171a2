//! Checkpoints and output directories: finding, reading and resuming them.

use std::path::PathBuf;

use super::Cause;

/// Checkpoints and output directories: finding, reading and resuming them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// `--resume-from-checkpoint` names a directory that does not exist.
    #[error("no checkpoint at {}: the directory does not exist (`--resume-from-checkpoint latest` takes the newest in --output-dir)", path.display())]
    NoSuchCheckpoint {
        /// The path given.
        path: PathBuf,
    },
    /// A flag that names a directory was given a file.
    #[error("{flag} {}: this is a file, not a directory ({})", path.display(), match *flag { "--resume-from-checkpoint" => "give a checkpoint-N directory, or `latest` for the newest in --output-dir", _ => "give a directory for the run's checkpoints and logs" })]
    NotADirectory {
        /// The flag.
        flag: &'static str,
        /// The path given.
        path: PathBuf,
    },
    /// A controller's entry of a checkpoint (`controllers.<name>`) is of a version
    /// this adabatch does not read, or does not parse (the JSON error is then the
    /// source).
    #[error("checkpoint: the `{name}` controller's state {detail}")]
    ControllerState {
        /// The entry's name (`oom`, `mixer`, ...).
        name: String,
        /// What is wrong with it.
        detail: String,
        /// The underlying error.
        #[source]
        source: Option<Cause>,
    },
    /// A checkpoint cannot be read (missing or unparsable files); the error that
    /// found it (I/O, JSON, safetensors), if any, is the source.
    #[error("checkpoint {}: {detail}", path.display())]
    CorruptCheckpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What is wrong, or what could not be done.
        detail: String,
        /// The underlying error.
        #[source]
        source: Option<Cause>,
    },
    /// A checkpoint does not belong to this run.
    #[error("checkpoint {path}: written with {what} = {checkpoint}, this run has {run}")]
    CheckpointMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// What differs (a setting, or a parameter's name or shape).
        what: String,
        /// The checkpoint's value.
        checkpoint: String,
        /// This run's value.
        run: String,
    },
    /// `--resume-from-checkpoint latest` found no complete checkpoint.
    #[error("no complete checkpoint in {output_dir} to resume from")]
    NoCheckpoint {
        /// Where it looked.
        output_dir: PathBuf,
    },
    /// A length-aware run's checkpoint from the middle of an epoch, written before
    /// checkpoints held the epoch's plan.
    #[error("checkpoint {path} is from the middle of a length-aware epoch but does not hold the epoch's plan (an older checkpoint); resume from one written at an epoch boundary")]
    MidEpochLengthAwareCheckpoint {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// The optimizer cannot restore a saved state (it cannot export one either).
    #[error("this optimizer cannot restore the checkpoint's `{kind}` state: use a checkpointable optimizer (adabatch::AdamW or Sgd), or pass --ignore-optimizer-state to resume with fresh optimizer state")]
    OptimizerStateUnsupported {
        /// Who wrote the state.
        kind: String,
    },
    /// The checkpoint's optimizer state does not fit this run's optimizer.
    #[error("the checkpoint's optimizer state does not fit this optimizer: {detail}")]
    OptimizerStateMismatch {
        /// What differs.
        detail: String,
    },
    /// The checkpoint has no optimizer state and the run did not opt in to fresh state.
    #[error("checkpoint {path} has no optimizer state (its optimizer could not save one): pass --ignore-optimizer-state to resume with fresh optimizer state")]
    OptimizerStateMissing {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// Another run holds the output directory.
    #[error("another run is using the output directory {} ({holder}): two runs in one directory replace each other's checkpoints; give this run its own --output-dir, or wait for the other to end", path.display())]
    OutputDirBusy {
        /// The directory.
        path: PathBuf,
        /// What the lock file says of its holder.
        holder: String,
    },
}

impl CheckpointError {
    /// A corrupt checkpoint file or directory: `detail` says what is wrong.
    pub(crate) fn corrupt(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        Self::CorruptCheckpoint {
            path: path.into(),
            detail: detail.into(),
            source: None,
        }
    }

    /// A checkpoint file that `detail` could not be done to, for `source`.
    pub(crate) fn unreadable(
        path: impl Into<PathBuf>,
        detail: impl Into<String>,
        source: impl Into<Cause>,
    ) -> Self {
        Self::CorruptCheckpoint {
            path: path.into(),
            detail: detail.into(),
            source: Some(source.into()),
        }
    }
}
