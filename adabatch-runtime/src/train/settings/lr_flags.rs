//! The learning-rate flags (`LrArgs`) check and resolve themselves into the
//! schedule as it starts; its horizon is set once the planner can count the run
//! (`RunSettings::set_lr_horizon`).

use crate::adapt::lr::{LrScaling, LrSchedule, LrSchedulerType, StableDecay};
use crate::config::args::LrArgs;
use crate::error::{Error, Result, SettingsError};

use super::require;

impl LrArgs {
    /// A rate that is a number, a warm-up fraction, a reference batch of at least
    /// one example.
    pub(super) fn check(&self) -> Result<()> {
        require(
            self.learning_rate.is_finite() && self.learning_rate >= 0.0,
            "learning_rate",
            self.learning_rate,
            "finite and >= 0",
        )?;
        require(
            (0.0..=1.0).contains(&self.warmup_ratio),
            "warmup_ratio",
            self.warmup_ratio,
            "in [0, 1]",
        )?;
        require(
            self.lr_reference_batch != Some(0),
            "lr_reference_batch",
            0,
            "a global batch of at least 1 example",
        )?;
        self.check_stable_decay()
    }

    /// The phases of `warmup_stable_decay`: given only with it, fractions in
    /// `[0, 1]`, the end no higher than the stable rate, and the warm-up, the
    /// cooldown and the decay within the run.
    fn check_stable_decay(&self) -> Result<()> {
        let given = [
            self.lr_decay_ratio,
            self.min_lr_ratio,
            self.lr_stable_ratio,
            self.lr_cooldown_ratio,
        ];
        if self.lr_scheduler_type != LrSchedulerType::WarmupStableDecay {
            if given.iter().any(Option::is_some) {
                return Err(Error::Settings(SettingsError::ConflictingSettings {
                    first: "--lr-decay-ratio / --min-lr-ratio / --lr-stable-ratio / --lr-cooldown-ratio",
                    second: "--lr-scheduler-type",
                    reason: "they shape `warmup_stable_decay` only: add --lr-scheduler-type warmup_stable_decay",
                }));
            }
            return Ok(());
        }
        let phases = self.stable_decay();
        for (name, value) in [
            ("lr_decay_ratio", phases.decay),
            ("min_lr_ratio", phases.min),
            ("lr_stable_ratio", phases.stable),
            ("lr_cooldown_ratio", phases.cooldown),
        ] {
            require((0.0..=1.0).contains(&value), name, value, "in [0, 1]")?;
        }
        require(
            phases.min <= phases.stable,
            "min_lr_ratio",
            phases.min,
            "at most --lr-stable-ratio: the decay ends below the stable rate",
        )?;
        let used = self.warmup_ratio + phases.cooldown + phases.decay;
        require(
            used <= 1.0 + 1e-12,
            "lr_cooldown_ratio",
            phases.cooldown,
            "with --warmup-ratio and --lr-decay-ratio, at most the whole run",
        )
    }

    /// `warmup_stable_decay`'s phases, defaults where not given.
    fn stable_decay(&self) -> StableDecay {
        let default = StableDecay::default();
        StableDecay {
            decay: self.lr_decay_ratio.unwrap_or(default.decay),
            min: self.min_lr_ratio.unwrap_or(default.min),
            stable: self.lr_stable_ratio.unwrap_or(default.stable),
            cooldown: self.lr_cooldown_ratio.unwrap_or(default.cooldown),
        }
    }

    /// `--lr-scaling` replaces the trainer's `lr_scaling`.
    pub(super) fn scaling(&self, trainer: LrScaling) -> LrScaling {
        self.lr_scaling.unwrap_or(trainer)
    }

    /// Whether the rate changes over the run, so that it needs a horizon.
    pub(super) fn needs_horizon(&self) -> bool {
        self.lr_scheduler_type != LrSchedulerType::Constant
            || self.warmup_ratio > 0.0
            || self.warmup_steps > 0
    }

    /// The schedule as it starts, over `examples` (its horizon until the planner
    /// counts the run) or over tokens. The first global batch is the reference
    /// unless one is given: a fixed batch then trains at `--learning-rate`
    /// whatever the scaling.
    pub(super) fn schedule(
        &self,
        scaling: LrScaling,
        examples: usize,
        in_tokens: bool,
        initial_global_batch: usize,
    ) -> LrSchedule {
        LrSchedule {
            base: self.learning_rate,
            kind: self.lr_scheduler_type,
            stable_decay: self.stable_decay(),
            warmup_examples: 0.0,
            total_examples: examples as f64,
            in_tokens,
            scaling,
            reference_global_batch: self.lr_reference_batch.unwrap_or(initial_global_batch),
        }
    }
}
