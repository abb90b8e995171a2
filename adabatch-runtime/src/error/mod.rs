//! Typed errors of the runtime, by area: [`Error`] holds one enum per area
//! (settings, data, checkpoints, the model, the training run, the distributed
//! setup) through `#[from]`, beside the errors every area meets (candle, files,
//! JSON) and the user's own.

mod checkpoint;
mod data;
mod distributed;
mod model;
mod settings;
mod training;

pub use checkpoint::CheckpointError;
pub use data::DataError;
pub use distributed::{DistributedError, RendezvousError};
pub use model::ModelError;
pub use settings::SettingsError;
pub use training::{TrainingError, INTERRUPTED_EXIT_CODE};

use std::path::PathBuf;

/// An underlying error kept as it is (io, serde, safetensors, candle, tokenizers,
/// a user's), so that `source()` returns it and a caller can downcast it.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An [`Error`] shared by the parts of a run that report it (the log, the
/// error that ends the run), as another error's source.
#[derive(Debug, Clone)]
pub(crate) struct SharedError(pub(crate) std::sync::Arc<Error>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// What was being done to a file when an [`Error::Io`] happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileOp {
    /// Opening or reading it.
    Read,
    /// Creating or writing it.
    Write,
    /// Creating a directory.
    CreateDir,
    /// Listing a directory.
    List,
    /// Moving a finished file into place.
    Rename,
    /// Removing it.
    Remove,
    /// Locking it.
    Lock,
    /// Copying a file to it.
    CopyTo,
}

impl std::fmt::Display for FileOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::CreateDir => "create the directory",
            Self::List => "list the directory",
            Self::Rename => "move into place",
            Self::Remove => "remove",
            Self::Lock => "lock",
            Self::CopyTo => "copy to",
        })
    }
}

/// Everything that can stop a training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor operation failed inside candle (the candle error is the source).
    #[error("a tensor operation failed (candle)")]
    Candle(#[from] candle_core::Error),
    /// The user's own code (a factory, a callback) failed, with a message.
    #[error("{0}")]
    Message(String),
    /// The user's own code failed with an error of its own type: it is the
    /// source, so `error.source()` downcasts back to it.
    #[error("the program's own code failed")]
    User(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A rank's share of a step failed (its collate or its model); what failed is
    /// the source.
    #[error("rank {rank} failed at step {step}")]
    OnRank {
        /// The rank.
        rank: usize,
        /// The step (1-based).
        step: usize,
        /// What failed.
        source: Box<Error>,
    },
    /// Reading or writing a file (a log, a checkpoint) failed; the I/O error is
    /// the source.
    #[error("could not {op} {}", path.display())]
    Io {
        /// What was being done to the file.
        op: FileOp,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A plot that cannot be drawn as asked: no run to draw, or a file that is
    /// neither `.svg` nor `.png`.
    #[error("plot {}: {detail}", path.display())]
    PlotRequest {
        /// The image asked for.
        path: PathBuf,
        /// What is wrong with the request.
        detail: String,
    },
    /// Drawing a run's plot failed; the drawing library's error is the source.
    #[error("could not draw the plot {}", path.display())]
    Plot {
        /// The image being drawn.
        path: PathBuf,
        /// The cause.
        source: Cause,
    },
    /// Writing JSON (a checkpoint's state, a log record) failed; the JSON error
    /// is the source. (JSON read back is checked where it is read: a corrupt
    /// checkpoint, a token directory's `tokens.json`.)
    #[error("could not write the JSON of {}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// A setting or a combination of settings that cannot run, found before the first step.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The data: the dataset, its sources, batches, token files and tokenizers.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Checkpoints and output directories: finding, reading and resuming them.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The model, its parameters, its optimizer and the weights it loads.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The run while it trains: divergence, out of memory, schedules and controllers, signals.
    #[error(transparent)]
    Training(#[from] TrainingError),
    /// Ranks, devices and communicators.
    #[error(transparent)]
    Distributed(#[from] DistributedError),
}

/// The end of a `main`: `Ok` exits 0; an error prints as `error: <message>` and
/// its causes (`caused by: ...`, one per line) on stderr, not a Debug dump, and
/// exits 1. `fn main() -> ExitCode { adabatch::exit_code(run()) }`.
pub fn exit_code(result: Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{}", error.report());
            match error {
                // Saved and stopped: a scheduler may run it again.
                Error::Training(TrainingError::Interrupted { .. }) => {
                    std::process::ExitCode::from(training::INTERRUPTED_EXIT_CODE)
                }
                _ => std::process::ExitCode::FAILURE,
            }
        }
    }
}

impl Error {
    /// `error: <message>`, then `caused by: <source>` for each underlying cause,
    /// one per line. Every variant either shows its cause or returns it from
    /// `source()`, never both, so each cause is named once (as in an `anyhow` or
    /// `eyre` report of the same error).
    pub fn report(&self) -> String {
        let mut text = format!("error: {self}");
        let mut cause = std::error::Error::source(self);
        while let Some(source) = cause {
            text.push_str(&format!("\ncaused by: {source}"));
            cause = source.source();
        }
        text
    }

    /// What a failed `op` on the file `path` becomes: for `map_err`.
    pub fn io(op: FileOp, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { op, path, source }
    }

    /// An error of the user's own code, with its message.
    pub fn msg(message: impl std::fmt::Display) -> Self {
        Self::Message(message.to_string())
    }

    /// An error of the user's own code, of its own type: it comes back from
    /// [`source()`](std::error::Error::source) (`downcast_ref` it there).
    pub fn user(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self::User(error.into())
    }
}

impl From<RendezvousError> for Error {
    fn from(error: RendezvousError) -> Self {
        Self::Distributed(DistributedError::Rendezvous(error))
    }
}

impl From<adabatch_nn::models::llama::ConfigError> for Error {
    fn from(error: adabatch_nn::models::llama::ConfigError) -> Self {
        Self::Model(ModelError::Config(error))
    }
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_names_each_cause_once() {
        let io =
            Error::io(FileOp::Rename, "out/checkpoint-3")(std::io::Error::other("Not a directory"));
        assert_eq!(
            io.report(),
            "error: could not move into place out/checkpoint-3\ncaused by: Not a directory"
        );
        let json = Error::Json {
            path: PathBuf::from("trainer_state.json"),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        assert_eq!(json.report().lines().count(), 2, "{}", json.report());
    }

    #[test]
    fn a_bad_model_config_stays_typed_as_a_model_error() {
        use adabatch_nn::models::llama::{ConfigError, LlamaConfig};
        let config = LlamaConfig::from_json_str("{\"hidden_size\": 0}").unwrap_err();
        let error = Error::from(config);
        assert!(
            matches!(
                &error,
                Error::Model(ModelError::Config(ConfigError::Json { path: None, .. }))
            ),
            "{error}"
        );
    }
}
