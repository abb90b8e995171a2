//! Typed errors of the runtime.

use std::path::PathBuf;

/// Everything that can stop a training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor operation failed inside candle.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The dataset has no examples.
    #[error("the training dataset is empty: nothing to train on")]
    EmptyDataset,
    /// More ranks than examples: some rank could never get an example.
    #[error("{world_size} ranks but only {examples} training examples: every rank needs at least one example")]
    MoreRanksThanExamples {
        /// Number of ranks.
        world_size: usize,
        /// Number of examples.
        examples: usize,
    },
    /// A batch size of zero was configured.
    #[error("{what} must be at least 1, got 0")]
    ZeroBatchSize {
        /// Which setting was zero.
        what: &'static str,
    },
    /// `num_train_epochs = 0` and no `max_steps`.
    #[error(
        "num_train_epochs is 0: the run would not train (set it to at least 1, or set max_steps)"
    )]
    ZeroEpochs,
    /// The schedule answered 0 after a step.
    #[error("the batch-size schedule returned 0 after step {step}: a batch size must be at least 1 (set `min_batch`, or fix the schedule)")]
    ScheduleReturnedZero {
        /// The step after which the schedule was called.
        step: usize,
    },
    /// With `drop_last`, the global batch is larger than the whole dataset.
    #[error("global batch of {global_batch} (per-device {per_device} x {world_size} ranks) exceeds the {examples} examples with drop_last = true: every batch would be dropped{}", step_note(*after_step))]
    GlobalBatchTooLarge {
        /// Per-device size times world size.
        global_batch: usize,
        /// Per-device size.
        per_device: usize,
        /// Number of ranks.
        world_size: usize,
        /// Dataset size.
        examples: usize,
        /// The step after which the schedule chose this size (None: the initial size).
        after_step: Option<usize>,
    },
    /// The loss became NaN or infinite.
    #[error("the loss is not finite ({loss}) at step {step}")]
    NonFiniteLoss {
        /// The step (1-based).
        step: usize,
        /// The loss value.
        loss: f64,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The model returned losses of the wrong shape.
    #[error("per_example_loss returned shape {shape:?} for a batch of {examples} examples; expected [{examples}]")]
    LossShape {
        /// Returned shape.
        shape: Vec<usize>,
        /// Examples in the batch.
        examples: usize,
    },
    /// The model has no trainable parameters.
    #[error("the model has no trainable parameters: `named_parameters` returned nothing")]
    NoParameters,
    /// Ranks disagree on the model's parameters.
    #[error("rank {rank} has different parameters than rank 0: {detail}")]
    ParameterMismatch {
        /// The disagreeing rank.
        rank: usize,
        /// What differs.
        detail: String,
    },
    /// The run cannot continue on one rank because another rank failed.
    #[error("rank {rank} stopped because another rank failed")]
    PeerFailed {
        /// The rank reporting.
        rank: usize,
    },
    /// A rank's thread panicked.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The device could not be used.
    #[error("device `{0}`: {1}")]
    Device(String, String),
    /// The device ran out of memory and the OOM policy is `fail`.
    #[error("out of memory at step {step}: {detail}")]
    OutOfMemory {
        /// The step.
        step: usize,
        /// The underlying error.
        detail: String,
    },
    /// Writing a log or checkpoint failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `train` runs one rank; more were asked for.
    #[error("nproc_per_node = {nproc_per_node} needs one trainer per rank: use `launch` with a factory instead of `train`")]
    TrainNeedsOneRank {
        /// The requested number of ranks.
        nproc_per_node: usize,
    },
    /// `launch_group` was given no rank to run in this process.
    #[error("launch_group needs at least one rank in this process")]
    EmptyGroup,
    /// A collective operation failed.
    #[error("communicator: {0}")]
    Comm(String),
}

fn step_note(after_step: Option<usize>) -> String {
    after_step.map_or_else(String::new, |step| {
        format!(" (size chosen by the schedule after step {step})")
    })
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
