//! The checks of a run's configuration that no single flag group can make: the
//! dataset against the ranks, the policy as the flags change it, and the
//! combinations of policy keys and flags that cannot work together (checked once,
//! on what the groups resolved); and, at a rank's start, what needs the eval set
//! or the trainer. Each flag group checks its own values (`*_flags.rs`); the
//! macro checks the attribute's syntax and shape; the value rules of schedules
//! are `const fn`s the generated code evaluates (`adapt::schedule`).

use crate::adapt::lr::LrScaling;
use crate::adapt::schedule::ScheduleSpec;
use crate::config::args::TrainingArgs;
use crate::config::policy::{GradAccum, Reweight, TrainerPolicy};
use crate::error::{DataError, Error, Result, SettingsError};
use crate::report::logging::Logger;

use super::require;
use super::strategy::Interval;
use super::RunSettings;

impl TrainingArgs {
    /// Every flag group's own values, then the few that span two groups: before
    /// anything is built.
    pub(super) fn check(&self) -> Result<()> {
        self.batch.check()?;
        self.length.check()?;
        self.logging.check()?;
        self.eval.check()?;
        self.save.check()?;
        self.step.check()?;
        self.data.check()?;
        self.lr.check()?;
        // The optimizer's flags, whether or not the factory builds from them.
        crate::optim::ParamsAdamW::from_args(self)?;
        self.length_aware.check()?;
        if let Some(max) = self.length.max_steps {
            for &step in &self.step.inject_oom_at_steps {
                require(
                    step <= max,
                    "inject_oom_at_steps",
                    step,
                    "steps the run takes (at most --max-steps)",
                )?;
            }
        }
        Ok(())
    }
}

/// The dataset against the ranks.
pub(super) fn check_ranks(num_examples: usize, world_size: usize) -> Result<()> {
    require(world_size > 0, "nproc_per_node", world_size, "at least 1")?;
    if num_examples == 0 {
        return Err(Error::Data(DataError::EmptyDataset));
    }
    if world_size > num_examples {
        return Err(Error::Data(DataError::MoreRanksThanExamples {
            world_size,
            examples: num_examples,
        }));
    }
    Ok(())
}

/// The trainer's policy as the flags change it (`--gradient-accumulation-steps`,
/// `--lr-scaling`), checked for what the engine supports.
pub(super) fn effective_policy(
    policy: &TrainerPolicy,
    args: &TrainingArgs,
) -> Result<TrainerPolicy> {
    let policy = TrainerPolicy {
        grad_accum: args.batch.grad_accum(policy.grad_accum),
        lr_scaling: args.lr.scaling(policy.lr_scaling),
        ..*policy
    };
    if let Some(reason) = policy.unsupported() {
        return Err(Error::Settings(SettingsError::UnsupportedPolicy { reason }));
    }
    let accumulation = match policy.grad_accum {
        GradAccum::Fixed(n) => adabatch_rules::grad_accum::fixed(n),
        GradAccum::Target { global } => adabatch_rules::grad_accum::target(global),
    };
    if let Err(broken) = accumulation {
        return Err(Error::Settings(SettingsError::InvalidGradAccum {
            reason: broken.message,
        }));
    }
    Ok(policy)
}

/// What the groups resolved, as the combination checks see it.
pub(super) struct Resolved<'a> {
    pub(super) policy: &'a TrainerPolicy,
    pub(super) schedule: &'a ScheduleSpec,
    /// The first global batch of a schedule in global units.
    pub(super) first_global: Option<usize>,
    /// `--gradient-accumulation-steps` was given.
    pub(super) accumulation_flag: bool,
    pub(super) token_budget: bool,
    pub(super) length_aware: bool,
    pub(super) mixed: bool,
    /// Several sources, each step's batch sized in tokens summed.
    pub(super) mixed_in_tokens: bool,
    /// The gradient noise scale is measured (logged or scheduling).
    pub(super) noise_measured: bool,
    pub(super) world_size: usize,
}

impl Resolved<'_> {
    /// The combinations that cannot work together, each said once.
    pub(super) fn check(&self) -> Result<()> {
        let conflict = |first, second, reason| {
            Err(Error::Settings(SettingsError::ConflictingSettings {
                first,
                second,
                reason,
            }))
        };
        let goodput = matches!(self.schedule, ScheduleSpec::Goodput(_));
        if goodput && (self.policy.grad_accum != GradAccum::Fixed(1) || self.accumulation_flag) {
            return conflict(
                "schedule = goodput(..)",
                "grad_accum / --gradient-accumulation-steps",
                "goodput chooses each step's micro-batches itself (bound them with max_local and max_micro_batches)",
            );
        }
        if self.first_global.is_some() {
            if matches!(self.policy.grad_accum, GradAccum::Target { .. }) {
                return conflict(
                    "a schedule in global units (ramp, noise_scale)",
                    "grad_accum = target(..)",
                    "the schedule sets each step's global batch itself: use grad_accum = fixed(n) to split it into n micro-batches",
                );
            }
            if self.token_budget {
                return conflict(
                    "a schedule in global units (ramp, noise_scale)",
                    "--max-tokens-per-batch",
                    "both size the batches: choose one",
                );
            }
        }
        if self.length_aware && self.policy.grad_accum != GradAccum::Fixed(1) {
            return conflict(
                "length-aware batching",
                "grad_accum",
                "length-aware batching sizes each global batch itself: use grad_accum = fixed(1)",
            );
        }
        if self.mixed && self.length_aware && !self.mixed_in_tokens {
            return conflict(
                "several sources",
                "length-aware batching",
                "a mixed global batch is divided by weights, a length-aware one by lengths: size a mixed batch in tokens with --max-tokens-per-batch N --packed-token-budget",
            );
        }
        // Goodput chooses two micro-batches or more on one rank itself.
        self.check_noise_scale(self.world_size.max(1 + usize::from(goodput)))
    }

    /// The gradient noise scale (logged or scheduling) needs each small batch's
    /// mean gradient (over examples, or over tokens with `token_count`), and at
    /// least two small batches in a measuring step.
    fn check_noise_scale(&self, world_size: usize) -> Result<()> {
        if self.policy.lr_scaling == LrScaling::AdamScale && !self.noise_measured {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "lr_scaling = adamscale",
                second: "a schedule that does not measure the noise scale",
                reason: "AdamScale's rate follows the measured gradient noise scale: use schedule = noise_scale(..) or goodput(..), or --log-gradient-noise-scale",
            }));
        }
        if !self.noise_measured {
            return Ok(());
        }
        // A mean of per-rank means has no small batch of a known size.
        if self.policy.reweight == Reweight::RankMean {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "--log-gradient-noise-scale",
                second: "reweight = none",
                reason:
                    "the estimator needs each small batch's mean gradient over examples or tokens",
            }));
        }
        // A schedule in global units splits a measuring step into two
        // micro-batches itself; a per-device size cannot split without changing
        // the step's examples.
        let splits = self.first_global.is_some();
        if world_size == 1 && self.policy.grad_accum == GradAccum::Fixed(1) && !splits {
            return Err(Error::Settings(
                SettingsError::NoiseScaleNeedsSmallBatches { small_batches: 1 },
            ));
        }
        Ok(())
    }
}

impl RunSettings {
    /// The checks that need what only a rank has at its start: the eval set's
    /// size, whether the trainer has a `#[mixer]`, the number of ranks. Said
    /// before any weight is touched.
    pub(crate) fn check_run(
        &self,
        eval_len: Option<usize>,
        trainer_has_mixer: bool,
        world_size: usize,
        logger: Option<&Logger>,
    ) -> Result<()> {
        if let Some(examples) = eval_len.filter(|&n| n < world_size) {
            return Err(Error::Data(DataError::EvalSetTooSmall {
                world_size,
                examples,
            }));
        }
        if self.saves.best_model.is_some() && eval_len.is_none() {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "--load-best-model-at-end",
                second: "a run without an eval dataset",
                reason: "the best checkpoint is the one whose evaluation scored best: train with an eval dataset (launch_with_eval)",
            }));
        }
        if self.eval.on_start && eval_len.is_none() {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "--eval-on-start",
                second: "a run without an eval dataset",
                reason:
                    "there is nothing to evaluate: train with an eval dataset (launch_with_eval)",
            }));
        }
        if let (Interval::Steps(_) | Interval::Epoch, None, Some(logger)) =
            (self.eval.every, eval_len, logger)
        {
            logger.event(
                "warning: evaluations are asked for (--eval-steps / --eval-strategy) but the run has no eval dataset: nothing is evaluated (Run::with_eval or the trainer's launch_with_eval adds one)",
            );
        }
        if trainer_has_mixer && self.sources.is_none() {
            return Err(Error::Data(DataError::MixerWithoutSources));
        }
        if self.mix_weights_given && (trainer_has_mixer || self.builtin_mixer.is_some()) {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "--mix-weights",
                second: "a mixer (#[mixer], mix = online(..) or custom(..))",
                reason: "the mixer decides every step's weights, so these would be ignored: drop --mix-weights, or train without the mixer",
            }));
        }
        // `mix = online(..)` / `custom(..)`: the engine's own mixer, unless the
        // trainer has one.
        if let (Some(asked), true) = (self.builtin_mixer, trainer_has_mixer) {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: asked.key(),
                second: "#[mixer]",
                reason: "two mixers would decide the same weights: keep one",
            }));
        }
        Ok(())
    }
}
