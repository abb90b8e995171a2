//! The learning-rate flags (`LrArgs`) check and resolve themselves into the
//! schedule as it starts; its horizon is set once the planner can count the run
//! (`RunSettings::set_lr_horizon`).

use crate::adapt::lr::{LrScaling, LrSchedule, LrSchedulerType};
use crate::config::args::LrArgs;
use crate::error::Result;

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
        )
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
            warmup_examples: 0.0,
            total_examples: examples as f64,
            in_tokens,
            scaling,
            reference_global_batch: self.lr_reference_batch.unwrap_or(initial_global_batch),
        }
    }
}
