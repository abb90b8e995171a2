//! The training policy fixed at compile time by `#[adaptive_trainer(...)]`.
//!
//! Every type here is `const`-constructible so the macro can emit the whole policy
//! as an associated const that tests and users can inspect.

use crate::adapt::lr::LrScaling;
use crate::adapt::schedule::ScheduleSpec;

/// How per-rank losses and gradients are combined into one update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reweight {
    /// Global mean over examples: ranks sum per-example losses and all-reduce the
    /// example count, so W ranks of `b` compute exactly what 1 rank of `W*b` does.
    SampleCount,
    /// Global mean over tokens: per-example losses are token *sums*, weighted by the
    /// batch's token count ([`crate::Batch::num_tokens`]).
    TokenCount,
    /// DDP-style mean of per-rank means (DSL `none`): every rank weighs the same,
    /// whatever its batch size; an empty rank contributes zero.
    RankMean,
}

/// What happens when a step runs out of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomPolicy {
    /// Stop the run with `TrainingError::OutOfMemory`.
    Fail,
    /// Halve the per-device size and retry the same examples (HF `auto_find_batch_size`).
    Halve,
    /// Replay the same examples in smaller chunks, accumulating gradients.
    #[value(alias = "split_retry")]
    SplitRetry,
    /// Drop the step and log what was dropped.
    Skip,
}

/// Gradient accumulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GradAccum {
    /// Accumulate this many global micro-batches per optimisation step.
    Fixed(usize),
    /// Accumulate micro-batches until the effective global batch reaches `global`.
    Target {
        /// Effective global batch to reach per optimisation step.
        global: usize,
    },
}

/// The policy of one trainer type: everything `#[adaptive_trainer(...)]` fixes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainerPolicy {
    /// How the per-device batch size evolves.
    pub schedule: ScheduleSpec,
    /// Lower clamp for every schedule (≥ 1).
    pub min_batch: usize,
    /// Upper clamp for every schedule.
    pub max_batch: Option<usize>,
    /// Drop an epoch's final global batch when it is smaller than the current one.
    pub drop_last: bool,
    /// How per-rank gradients are combined.
    pub reweight: Reweight,
    /// What to do on out-of-memory.
    pub oom: OomPolicy,
    /// Gradient accumulation.
    pub grad_accum: GradAccum,
    /// Learning-rate scaling with the global batch.
    pub lr_scaling: LrScaling,
    /// Draw a new permutation each epoch (otherwise `0..N` in order).
    pub shuffle: bool,
    /// Seed of the per-epoch permutations and of seeded parameter initialisation,
    /// unless `TrainingArgs::seed` overrides it.
    pub seed: u64,
    /// How a dataset of several sources is mixed.
    pub mix: MixSpec,
}

/// How a dataset of several sources ([`crate::Sources`]) is mixed (`mix = ...`).
#[derive(Debug, Clone, Copy)]
pub enum MixSpec {
    /// The dataset's own weights (`Sources::with_weights`, else the sizes).
    Dataset,
    /// `mix = fixed(new = 0.75, replay = 0.25)`: weights by source name; sources
    /// left out get 0. Names are checked against the dataset before the first step.
    Fixed(&'static [(&'static str, f64)]),
    /// `mix = online(temperature = 1.5, floor = 0.05, smoothing = 0.9, warmup = 0.4)`:
    /// an [`crate::OnlineMixer`] decides the weights after every step.
    Online {
        /// Softmax temperature (> 0).
        temperature: f64,
        /// Share spread evenly over the sources, in `[0, 1]`.
        floor: f64,
        /// Moving-average factor of the per-source losses, in `[0, 1)`.
        smoothing: f64,
        /// Equal shares before the softmax decides: steps, or a share of the
        /// run's expected steps ([`crate::MixWarmup`]).
        warmup: crate::adapt::mixer::MixWarmup,
    },
    /// `mix = custom(path::to::fn)`: a function of the last step's
    /// [`crate::SourceStats`] decides the next step's weights.
    Custom(crate::adapt::mixer::MixFn),
    /// `mix = pike(t0 = 10, zeta1 = 0.03, zeta2 = 0.03, floor = 0.1, smoothing = 0.8)`,
    /// with `tau = τ` Balanced-PiKE: a [`crate::PikeMixer`] moves the weights
    /// from the sources' gradients measured every `t0` steps.
    Pike {
        /// `T₀`, steps between measurements (>= 1).
        t0: usize,
        /// `ζ₁`, the weight of the squared gradient norms (>= 0).
        zeta1: f64,
        /// `ζ₂`, the weight of the gradient variances over `2b` (>= 0).
        zeta2: f64,
        /// Share spread evenly over the sources, in `[0, 1]`.
        floor: f64,
        /// Moving-average factor of the statistics, in `[0, 1)`.
        smoothing: f64,
        /// Balanced-PiKE's `τ` (>= 0); `None`: the total loss.
        tau: Option<f64>,
    },
}

impl PartialEq for MixSpec {
    fn eq(&self, other: &Self) -> bool {
        use MixSpec::*;
        match (self, other) {
            (Dataset, Dataset) => true,
            (Fixed(a), Fixed(b)) => a == b,
            (
                Online {
                    temperature: a,
                    floor: b,
                    smoothing: c,
                    warmup: w,
                },
                Online {
                    temperature: d,
                    floor: e,
                    smoothing: f,
                    warmup: v,
                },
            ) => (a, b, c, w) == (d, e, f, v),
            // The same function, as far as addresses can tell (a policy compared
            // with itself always is).
            (Custom(a), Custom(b)) => std::ptr::fn_addr_eq(*a, *b),
            (
                Pike {
                    t0: a,
                    zeta1: b,
                    zeta2: c,
                    floor: d,
                    smoothing: e,
                    tau: f,
                },
                Pike {
                    t0: g,
                    zeta1: h,
                    zeta2: i,
                    floor: j,
                    smoothing: k,
                    tau: l,
                },
            ) => (a, b, c, d, e, f) == (g, h, i, j, k, l),
            _ => false,
        }
    }
}

impl TrainerPolicy {
    /// The defaults of the DSL table: constant initial size, no clamps, keep the last
    /// batch, sample-count reweighting, fail on OOM, no accumulation, no LR scaling,
    /// shuffled with seed 42.
    pub const DEFAULT: TrainerPolicy = TrainerPolicy {
        schedule: ScheduleSpec::Constant(None),
        min_batch: 1,
        max_batch: None,
        drop_last: false,
        reweight: Reweight::SampleCount,
        oom: OomPolicy::Fail,
        grad_accum: GradAccum::Fixed(1),
        lr_scaling: LrScaling::Off,
        shuffle: true,
        seed: 42,
        mix: MixSpec::Dataset,
    };

    /// Why this runtime cannot run the policy, if it cannot.
    ///
    /// `const` so generated code can refuse an unsupported policy at compile time.
    pub const fn unsupported(&self) -> Option<&'static str> {
        // Keys whose support lands later return their reason here, and generated
        // code fails to compile.
        match (self.schedule, self.grad_accum) {
            (ScheduleSpec::Memory { .. }, GradAccum::Fixed(1)) => None,
            (ScheduleSpec::Memory { .. }, _) => Some(
                "`schedule = memory(..)` sizes each global batch from the memory model; \
                 combining it with `grad_accum` is not supported by this adabatch runtime yet",
            ),
            _ => None,
        }
    }

    /// Fails compilation (when evaluated in a const) if the runtime cannot run `self`.
    pub const fn assert_supported(&self) {
        if let Some(reason) = self.unsupported() {
            panic!("{}", reason);
        }
    }
}

impl Default for TrainerPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// When an epoch of several sources ends (HF `interleave_datasets`'s
/// `stopping_strategy`, plus adabatch's default).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum StoppingStrategy {
    /// An epoch is a pass over the first (primary) source; the others cycle.
    #[default]
    #[value(name = "primary")]
    Primary,
    /// An epoch ends when any source's pass ends (HF `first_exhausted`): that
    /// source starts its next pass in the next epoch, the others go on.
    #[value(name = "first_exhausted", alias = "first-exhausted")]
    FirstExhausted,
    /// An epoch ends once every source has finished a pass (HF `all_exhausted`,
    /// oversampling): a source that finishes early cycles.
    #[value(name = "all_exhausted", alias = "all-exhausted")]
    AllExhausted,
}
