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
//!
//! `lr_scaling = adamscale` is AdaptDL's AdamScale (Pollux's rule for Adam):
//! `scale = r^½` with the gain `r = M(φ + M₀) / (M₀(φ + M))`, `M₀ = B_ref`, where
//! φ is the gradient noise scale of the gradients *preconditioned by Adam's
//! second moment* (each component divided by `√v̂ + ε`), which the engine then
//! measures. Where `M ≪ φ` the gain is `M/M₀` and the rate follows `sqrt`; where
//! `M ≫ φ` it stops growing at `√((φ + M₀)/M₀)`: a batch past the noise scale
//! buys no faster progress, so it gets no faster rate. Until φ is measured (and
//! warmed up) the rule is `sqrt`.
//!
//! # Warm-up, stable, decay
//!
//! `warmup_stable_decay` (HF's `get_wsd_schedule`; Hägele et al. 2024) holds the
//! peak after the warm-up and decays only over the last `--lr-decay-ratio` of
//! the run, by a cosine to `--min-lr-ratio` of the peak. With `--lr-stable-ratio
//! R < 1` the rate first falls, by a cosine over `--lr-cooldown-ratio` of the run
//! after the warm-up, to `R` of the peak and stays there: the *infinite* schedule
//! of Ibrahim et al. 2024 ("Simple and scalable strategies to continually
//! pre-train large language models"), whose stable phase a later run continues
//! from without re-warming, and whose final decay is only for the model one keeps.

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
    /// Warm-up, a stable phase, and a cosine decay over the end of the run (see the
    /// module documentation).
    #[value(name = "warmup_stable_decay", alias = "wsd")]
    WarmupStableDecay,
}

/// The phases of `warmup_stable_decay`, as fractions of the run (the warm-up is
/// the schedule's own) and of the peak.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StableDecay {
    /// Fraction of the run in the final decay.
    pub decay: f64,
    /// The rate at the end, as a fraction of the peak.
    pub min: f64,
    /// The stable phase's rate as a fraction of the peak.
    pub stable: f64,
    /// Fraction of the run, after the warm-up, over which the rate falls from the
    /// peak to the stable rate.
    pub cooldown: f64,
}

impl Default for StableDecay {
    /// The last 20 % of the run decays to 0 from the peak.
    fn default() -> Self {
        Self {
            decay: 0.2,
            min: 0.0,
            stable: 1.0,
            cooldown: 0.0,
        }
    }
}

impl StableDecay {
    /// The shape (a fraction of the peak) at `x` of `total`, after a warm-up that
    /// ended at `warmup`.
    fn shape(&self, x: f64, warmup: f64, total: f64) -> f64 {
        let cosine = |from: f64, to: f64, progress: f64| {
            to + (from - to) * 0.5 * (1.0 + (std::f64::consts::PI * progress.clamp(0.0, 1.0)).cos())
        };
        let cooled = warmup + self.cooldown * total;
        let decay_from = (total - self.decay * total).max(cooled);
        if x < cooled {
            cosine(1.0, self.stable, (x - warmup) / (cooled - warmup))
        } else if x < decay_from {
            self.stable
        } else {
            cosine(
                self.stable,
                self.min,
                (x - decay_from) / (total - decay_from).max(1.0),
            )
        }
    }
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
    /// `lr * gain^½`, AdaptDL's AdamScale (see the module docs): needs the
    /// gradient noise scale (`noise_scale` or `goodput`) and `adabatch::AdamW`.
    #[value(name = "adamscale")]
    #[serde(rename = "adamscale")]
    AdamScale,
}

/// AdaScale's gain of a global batch `m` over `m0` at the noise scale `phi`: the
/// progress one step of `m` makes in steps of `m0`,
/// `r = m(φ + m0) / (m0(φ + m))` (AdaptDL's `gain`, with `var/sqr = φ/m0`).
pub fn adam_scale_gain(phi: f64, m0: usize, m: usize) -> f64 {
    let (phi, m0, m) = (phi.max(0.0), m0.max(1) as f64, m as f64);
    m * (phi + m0) / (m0 * (phi + m))
}

/// The learning-rate schedule of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub base: f64,
    /// Shape after warm-up.
    pub kind: LrSchedulerType,
    /// The phases of `warmup_stable_decay` (unused by the other kinds).
    pub stable_decay: StableDecay,
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
        self.at_noise_scale(consumed, global_batch, None)
    }

    /// [`LrSchedule::at`] where the scaling may depend on the measured noise
    /// scale `phi` (`adamscale`; `None`: not measured yet).
    pub fn at_noise_scale(&self, consumed: usize, global_batch: usize, phi: Option<f64>) -> f64 {
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
                LrSchedulerType::WarmupStableDecay => {
                    self.stable_decay
                        .shape(x, self.warmup_examples, self.total_examples)
                }
            }
        };
        self.base * shape * self.batch_scale_at(global_batch, phi)
    }

    /// The factor a global batch of `global_batch` multiplies the rate by at the
    /// noise scale `phi` (used by `adamscale` only; `None` only before the first
    /// warm estimate, which then takes the √ rule: once there is one, the run
    /// holds the last positive estimate rather than go back to `None`).
    pub fn batch_scale_at(&self, global_batch: usize, phi: Option<f64>) -> f64 {
        let ratio = global_batch as f64 / self.reference_global_batch.max(1) as f64;
        match (self.scaling, phi.filter(|p| p.is_finite())) {
            (LrScaling::Off, _) => 1.0,
            (LrScaling::Linear, _) => ratio,
            (LrScaling::Sqrt, _) | (LrScaling::AdamScale, None) => ratio.sqrt(),
            (LrScaling::AdamScale, Some(phi)) => {
                adam_scale_gain(phi, self.reference_global_batch, global_batch).sqrt()
            }
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
            stable_decay: StableDecay::default(),
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

    /// AdamScale against hand-computed values: M₀ = 4, φ = 12. At M = 16 the gain
    /// is 16·16/(4·28) = 16/7 and the rate × √(16/7) = 1.5119 (√ rule: 2); at
    /// M = 4 it is 1; at M = 1000 it tends to (φ + M₀)/M₀ = 4 (3.9526: 1000·16/
    /// (4·1012)), the rate × 1.9881, where the √ rule gives 15.81. Unmeasured,
    /// it is the √ rule.
    #[test]
    fn adam_scale_gain_and_rate_in_closed_form() {
        let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-4, "{got} != {want}");
        close(adam_scale_gain(12.0, 4, 16), 16.0 / 7.0);
        close(adam_scale_gain(12.0, 4, 4), 1.0);
        close(adam_scale_gain(12.0, 4, 1000), 3.9526);
        close(adam_scale_gain(0.0, 4, 16), 1.0);
        let s = schedule(LrSchedulerType::Constant, LrScaling::AdamScale);
        close(s.at_noise_scale(20, 16, Some(12.0)), 1.5119);
        close(s.at_noise_scale(20, 4, Some(12.0)), 1.0);
        close(s.at_noise_scale(20, 1000, Some(12.0)), 1.9881);
        close(s.at_noise_scale(20, 16, None), 2.0);
        close(s.at_noise_scale(20, 16, Some(f64::NAN)), 2.0);
        close(s.at(20, 16), 2.0);
    }

    /// Warm-up over 10 of 110, stable to 88 (the last 20 % decays), a cosine to
    /// 0.1 of the peak at 110; then the infinite schedule: a cooldown over 22
    /// examples after the warm-up to 0.5, stable, the same decay from 0.5.
    #[test]
    fn warmup_stable_decay_and_the_infinite_schedule_in_closed_form() {
        let mut s = schedule(LrSchedulerType::WarmupStableDecay, LrScaling::Off);
        s.stable_decay.min = 0.1;
        let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-12, "{got} != {want}");
        close(s.at(5, 4), 0.5);
        close(s.at(10, 4), 1.0);
        close(s.at(88, 4), 1.0);
        close(s.at(99, 4), 0.1 + 0.9 * 0.5);
        close(s.at(110, 4), 0.1);
        close(s.at(500, 4), 0.1);
        s.stable_decay.stable = 0.5;
        s.stable_decay.cooldown = 0.2;
        close(s.at(10, 4), 1.0);
        close(s.at(21, 4), 0.75);
        close(s.at(32, 4), 0.5);
        close(s.at(60, 4), 0.5);
        close(s.at(99, 4), 0.1 + 0.4 * 0.5);
        close(s.at(110, 4), 0.1);
    }
}
