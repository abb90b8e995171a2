//! The run while it trains: divergence, out of memory, schedules and controllers, signals.

use std::path::PathBuf;

/// The exit code of a run stopped by a signal after saving (BSD's `EX_TEMPFAIL`:
/// a temporary failure, run it again to go on): [`crate::exit_code`] gives it to
/// [`TrainingError::Interrupted`].
pub const INTERRUPTED_EXIT_CODE: u8 = 75;

/// The run while it trains: divergence, out of memory, schedules and controllers, signals.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainingError {
    /// A part of a step's all-reduced scalars had another length than the step's
    /// layout: every rank stops the step rather than sum misaligned values.
    #[error("a step's {part} held {len} values where the step's layout has {expected}: the values would be summed out of place, so the step stops on every rank (an inconsistency of adabatch's probes; please report it)")]
    StepPayloadMismatch {
        /// `probes` or `coverage flags`.
        part: &'static str,
        /// Values this rank had.
        len: usize,
        /// Values the layout carries.
        expected: usize,
    },
    /// The schedule answered 0 after a step.
    #[error("the batch-size schedule returned 0 after step {step}: a batch size must be at least 1 (set `min_batch`, or fix the schedule)")]
    ScheduleReturnedZero {
        /// The step after which the schedule was called.
        step: usize,
    },
    /// The loss became NaN or infinite: the run diverged.
    #[error("the loss is not finite ({loss}) at step {step}: the run diverged (a lower --learning-rate, --max-grad-norm or a warm-up may help){}", last_finite(last_checkpoint))]
    NonFiniteLoss {
        /// The step (1-based).
        step: usize,
        /// The loss value.
        loss: f64,
        /// The newest checkpoint of this run, all of whose weights are finite.
        last_checkpoint: Option<PathBuf>,
    },
    /// Weights became NaN or infinite: no checkpoint holds them.
    #[error("{} parameter(s) are not finite after step {step} ({}): the run diverged and this checkpoint is not written{}", names.len(), names.join(", "), last_finite(last_checkpoint))]
    NonFiniteWeights {
        /// The step.
        step: usize,
        /// The parameters with a NaN or infinite value.
        names: Vec<String>,
        /// The newest checkpoint of this run, all of whose weights are finite.
        last_checkpoint: Option<PathBuf>,
    },
    /// Under `--fp16` the gradients overflowed even at the smallest loss scale.
    #[error("step {step}: the gradients are not finite even at loss scale 2^-24 under --fp16; the model's values exceed float16's range: train with --bf16 or in f32")]
    LossScaleUnderflow {
        /// The step (1-based).
        step: usize,
    },
    /// `schedule = goodput(..)` cannot rank batch sizes: the step times it
    /// needs are not positive numbers (a broken `step_time` function, or a clock
    /// that measured nothing).
    #[error("goodput cannot measure step times: {detail}")]
    GoodputStepTime {
        /// What was measured or given, and for which step shape.
        detail: String,
    },
    /// A `#[regressor]` planned different batches on different ranks.
    #[error("the #[regressor] planned different batches on different ranks (epoch {epoch}): it must be deterministic")]
    RegressorDisagrees {
        /// The epoch being planned.
        epoch: usize,
    },
    /// The device ran out of memory and the OOM policy is `fail`; the device's
    /// error, on the rank that ran out, is the source.
    #[error("out of memory at step {step} ({detail})")]
    OutOfMemory {
        /// The step.
        step: usize,
        /// Where: this rank, other ranks, or an injected failure.
        detail: String,
        /// The device's error.
        #[source]
        source: Option<super::Cause>,
    },
    /// A signal (SIGTERM, SIGINT, SIGUSR1) stopped the run after a step, which was
    /// saved: run it again with `--resume-from-checkpoint` to go on. Exit code
    /// [`INTERRUPTED_EXIT_CODE`] (75).
    #[error("stopped by {signal} after step {step}; the run is saved in {}: run again with --resume-from-checkpoint {} (or latest) to go on", checkpoint.display(), checkpoint.display())]
    Interrupted {
        /// The signal's name.
        signal: String,
        /// The last step trained.
        step: usize,
        /// The checkpoint written at it.
        checkpoint: PathBuf,
    },
}

/// Where a diverged run can resume from.
fn last_finite(checkpoint: &Option<PathBuf>) -> String {
    match checkpoint {
        Some(dir) => format!(
            "; the last checkpoint with finite weights is {}",
            dir.display()
        ),
        None => String::new(),
    }
}
