//! A setting or a combination of settings that cannot run, found before the first step.

/// A setting or a combination of settings that cannot run, found before the first step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
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
    /// A run-time setting is out of its range.
    #[error("{name} = {value}: {expected}")]
    InvalidSetting {
        /// The setting (the `TrainingArgs` field or DSL key).
        name: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// `grad_accum` accumulates no micro-batch (the attribute's rule, for a
    /// policy built by hand).
    #[error("grad_accum: {reason}")]
    InvalidGradAccum {
        /// What is wrong, with the value.
        reason: String,
    },
    /// `min_batch` is above `max_batch`.
    #[error("min_batch ({min}) is larger than max_batch ({max})")]
    BatchLimitsCrossed {
        /// The lower clamp.
        min: usize,
        /// The upper clamp.
        max: usize,
    },
    /// A schedule's own arguments are invalid (a spec built by hand).
    #[error("schedule {schedule}: {reason}")]
    InvalidSchedule {
        /// The schedule's form, e.g. `interval`.
        schedule: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// This runtime cannot run the trainer's policy.
    #[error("unsupported policy: {reason}")]
    UnsupportedPolicy {
        /// Why.
        reason: &'static str,
    },
    /// Two settings that decide the same thing were both given.
    #[error("{first} and {second} cannot be combined: {reason}")]
    ConflictingSettings {
        /// One setting.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// Why not.
        reason: &'static str,
    },
    /// The gradient noise scale was asked for without two small batches per step.
    #[error("the gradient noise scale needs at least two small batches per step (each rank's share, or each micro-batch's), found {small_batches}: on one rank, accumulate at least 2 micro-batches (grad_accum = fixed(2)), run on 2 or more ranks, or use a schedule in global units (noise_scale, goodput, a ramp or --global-batch-size), whose measuring steps the engine splits in two")]
    NoiseScaleNeedsSmallBatches {
        /// Small batches (smaller than the step's global batch) per step.
        small_batches: usize,
    },
    /// `train` runs one rank; more were asked for.
    #[error("nproc_per_node = {nproc_per_node} needs one trainer per rank: use `launch` with a factory instead of `train`")]
    TrainNeedsOneRank {
        /// The requested number of ranks.
        nproc_per_node: usize,
    },
    /// `Run::group` was given no rank to run in this process.
    #[error("Run::group needs at least one rank in this process")]
    EmptyGroup,
    /// A mixer's own arguments are invalid (`mix = online(..)`, or one built by
    /// hand).
    #[error("mixer {mixer}: {reason}")]
    InvalidMixer {
        /// The mixer, e.g. `online`.
        mixer: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The mixer does not fit the run's sources (a source it names is not one of
    /// them), found before the first step.
    #[error("the mixer does not fit the run's sources ({}): {reason}", sources.join(", "))]
    MixerSources {
        /// The run's sources.
        sources: Vec<String>,
        /// What the mixer found wrong.
        reason: String,
    },
    /// An evaluation was asked of a run that has no eval set.
    #[error("{what} needs an eval set: give one with Run::with_eval (HF's eval_dataset)")]
    NoEvalSet {
        /// What asked for it.
        what: &'static str,
    },
    /// The held-out set a mixer asks losses of (`--mixer-eval-examples`) cannot
    /// be built from the eval set, or the mixer asked and the run has none.
    #[error("the mixer's held-out set: {reason}")]
    HeldOutSet {
        /// What is wrong, and how to give one.
        reason: String,
    },
    /// An arguments file (`prog args.json`, HF's `parse_json_file`) holds a key
    /// or a value the run cannot take.
    #[error("{}: {detail}", path.display())]
    ArgumentsFile {
        /// The file.
        path: std::path::PathBuf,
        /// The key and what is wrong with it.
        detail: String,
    },
}

impl SettingsError {
    /// `name` = `value` is out of its range, which is `expected`.
    pub(crate) fn invalid(
        name: &'static str,
        value: impl ToString,
        expected: &'static str,
    ) -> Self {
        Self::InvalidSetting {
            name,
            value: value.to_string(),
            expected,
        }
    }

    /// `mixer`'s arguments broke one of the rules the attribute checks too.
    pub(crate) fn mixer_rule(mixer: &'static str, broken: adabatch_rules::Broken) -> Self {
        Self::InvalidMixer {
            mixer,
            reason: broken.message,
        }
    }

    /// `schedule`'s arguments broke one of the rules the attribute checks too.
    pub(crate) fn schedule_rule(schedule: &'static str, broken: adabatch_rules::Broken) -> Self {
        Self::InvalidSchedule {
            schedule,
            reason: broken.message,
        }
    }
}
