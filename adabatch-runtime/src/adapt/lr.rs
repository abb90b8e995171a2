//! Learning rate over the run, driven by examples consumed (with adaptive batches the
//! number of steps is not known in advance), and scaled with the global batch.
//!
//! # The rule
//!
//! `--learning-rate` is the peak rate **at a reference global batch** `B_ref`
//! (`--lr-reference-batch`, by default the run's first global batch). A step whose
//! global batch is `B` trains at
//!
//! ```text
//! lr(step) = learning_rate · shape(examples consumed) · scale(B / B_ref)
//! ```
//!
//! with `scale` the identity's square root for `lr_scaling = sqrt` (Adam's rule:
//! OLMo-core multiplies the rate by √(new/old) at each batch change, and
//! Malladi et al. 2022 derive it for adaptive optimizers), `B / B_ref` for
//! `linear` (SGD's rule, Goyal et al. 2017) and `1` for `none`. Every schedule
//! (ramps, `noise_scale`, `goodput`, a fixed batch) goes through this one rule, so
//! fixed batches at their own rates and an adaptive policy are compared fairly, and
//! the rate is rescaled at every batch change (logged per step as
//! `learning_rate`). The reference is part of a checkpoint's policy: a resume on
//! any number of ranks continues with the same rates.

use clap::ValueEnum;

/// How the learning rate evolves over the run, measured in examples consumed
/// (the number of steps is not known in advance with adaptive batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedulerType {
    /// Constant after warm-up.
    Constant,
    /// Linear decay to 0 at the end of the run.
    Linear,
    /// Cosine decay to 0 at the end of the run.
    Cosine,
}

/// How the learning rate follows the global batch size (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LrScaling {
    /// The learning rate ignores the batch size (DSL `none`).
    #[value(name = "none")]
    #[serde(rename = "none")]
    Off,
    /// `lr * global / reference`.
    Linear,
    /// `lr * sqrt(global / reference)`.
    Sqrt,
}

/// The learning-rate schedule of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub base: f64,
    /// Shape after warm-up.
    pub kind: LrSchedulerType,
    /// Examples (tokens, with `in_tokens`) of linear warm-up from 0.
    pub warmup_examples: f64,
    /// Examples (tokens, with `in_tokens`) of the whole run (the decay reaches 0
    /// there).
    pub total_examples: f64,
    /// The schedule runs over tokens trained, not examples (a run length in
    /// tokens: `--max-train-tokens`).
    pub in_tokens: bool,
    /// Scaling with the global batch.
    pub scaling: LrScaling,
    /// The global batch at which the rate is `base` (by default the run's first).
    pub reference_global_batch: usize,
}

impl LrSchedule {
    /// The learning rate for a step that starts after `consumed` examples and whose
    /// global batch is `global_batch`.
    pub fn at(&self, consumed: usize, global_batch: usize) -> f64 {
        let x = consumed as f64;
        let shape = if x < self.warmup_examples {
            x / self.warmup_examples
        } else {
            let span = (self.total_examples - self.warmup_examples).max(1.0);
            let progress = ((x - self.warmup_examples) / span).clamp(0.0, 1.0);
            match self.kind {
                LrSchedulerType::Constant => 1.0,
                LrSchedulerType::Linear => 1.0 - progress,
                LrSchedulerType::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            }
        };
        self.base * shape * self.batch_scale(global_batch)
    }

    /// The factor a global batch of `global_batch` multiplies the rate by.
    pub fn batch_scale(&self, global_batch: usize) -> f64 {
        let ratio = global_batch as f64 / self.reference_global_batch.max(1) as f64;
        match self.scaling {
            LrScaling::Off => 1.0,
            LrScaling::Linear => ratio,
            LrScaling::Sqrt => ratio.sqrt(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(kind: LrSchedulerType, scaling: LrScaling) -> LrSchedule {
        LrSchedule {
            base: 1.0,
            kind,
            warmup_examples: 10.0,
            total_examples: 110.0,
            in_tokens: false,
            scaling,
            reference_global_batch: 4,
        }
    }

    #[test]
    fn warmup_then_linear_decay_in_examples() {
        let s = schedule(LrSchedulerType::Linear, LrScaling::Off);
        assert_eq!(s.at(0, 4), 0.0);
        assert_eq!(s.at(5, 4), 0.5);
        assert_eq!(s.at(10, 4), 1.0);
        assert!((s.at(60, 4) - 0.5).abs() < 1e-12);
        assert_eq!(s.at(500, 4), 0.0);
    }

    #[test]
    fn cosine_and_scaling() {
        let s = schedule(LrSchedulerType::Cosine, LrScaling::Sqrt);
        assert!((s.at(60, 16) - 0.5 * 2.0).abs() < 1e-12);
        let s = schedule(LrSchedulerType::Constant, LrScaling::Linear);
        assert_eq!(s.at(20, 8), 2.0);
    }
}
