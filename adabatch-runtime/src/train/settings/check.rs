//! Every check of a run's configuration in one place: the flags' values, the
//! combinations of policy keys and flags that cannot work together, and (at a
//! rank's start) what needs the eval set or the trainer. The macro checks the
//! attribute's syntax and shape; the value rules of schedules are `const fn`s the
//! generated code evaluates (`adapt::schedule`).

use crate::adapt::goodput::GoodputSpec;
use crate::config::args::TrainingArgs;
use crate::config::policy::{GradAccum, Reweight, TrainerPolicy};
use crate::error::{DataError, Error, Result, SettingsError};
use crate::report::logging::Logger;

use super::resolve::require;
use super::strategy::Interval;
use super::RunSettings;

/// Paths and steps that would otherwise fail only late: `--plot`'s format (it is
/// drawn after training), fault injection at steps that never run.
fn check_outputs(args: &TrainingArgs) -> Result<()> {
    if let Some(plot) = &args.plot {
        let extension = plot.extension().and_then(|e| e.to_str());
        require(
            matches!(extension, Some("svg" | "png")),
            "plot",
            plot.display(),
            "a path ending in .svg or .png",
        )?;
    }
    for &step in &args.inject_oom_at_steps {
        require(
            step > 0,
            "inject_oom_at_steps",
            step,
            "steps counted from 1",
        )?;
        require(
            args.max_steps.is_none_or(|max| step <= max),
            "inject_oom_at_steps",
            step,
            "steps the run takes (at most --max-steps)",
        )?;
    }
    let mut names: Vec<&str> = (args.mix_weights.iter())
        .filter_map(|pair| pair.split_once('=').map(|(name, _)| name.trim()))
        .collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::Settings(SettingsError::InvalidSetting {
            name: "mix_weights",
            value: format!("{} given twice", twice[0]),
            expected: "each source named once",
        }));
    }
    Ok(())
}

/// The flags' values, and the dataset against the ranks: before anything is built.
pub(super) fn check_args(
    args: &TrainingArgs,
    num_examples: usize,
    world_size: usize,
) -> Result<()> {
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
    if args.per_device_train_batch_size == 0 {
        return Err(Error::Settings(SettingsError::ZeroBatchSize {
            what: "per_device_train_batch_size",
        }));
    }
    require(args.max_steps != Some(0), "max_steps", 0, "at least 1")?;
    require(
        args.max_train_tokens != Some(0),
        "max_train_tokens",
        0,
        "at least 1",
    )?;
    if args.max_steps.is_some() && args.max_train_tokens.is_some() {
        return Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "--max-steps",
            second: "--max-train-tokens",
            reason: "a run ends after a number of steps or of tokens: keep one",
        }));
    }
    if args.num_train_epochs == 0 && args.max_steps.is_none() && args.max_train_tokens.is_none() {
        return Err(Error::Settings(SettingsError::ZeroEpochs));
    }
    require(args.logging_steps > 0, "logging_steps", 0, "at least 1")?;
    require(args.eval_steps != Some(0), "eval_steps", 0, "at least 1")?;
    if args.per_device_eval_batch_size == 0 {
        return Err(Error::Settings(SettingsError::ZeroBatchSize {
            what: "per_device_eval_batch_size",
        }));
    }
    require(
        args.save_total_limit != Some(0),
        "save_total_limit",
        0,
        "at least 1 (or unset to keep every checkpoint)",
    )?;
    check_outputs(args)?;
    let finite_non_negative = |x: f64| x.is_finite() && x >= 0.0;
    require(
        finite_non_negative(args.learning_rate),
        "learning_rate",
        args.learning_rate,
        "finite and >= 0",
    )?;
    require(
        (0.0..=1.0).contains(&args.warmup_ratio),
        "warmup_ratio",
        args.warmup_ratio,
        "in [0, 1]",
    )?;
    require(
        finite_non_negative(args.max_grad_norm),
        "max_grad_norm",
        args.max_grad_norm,
        "finite and >= 0 (0 = no clipping)",
    )?;
    require(
        finite_non_negative(args.memory_margin),
        "memory_margin",
        args.memory_margin,
        "finite and >= 0",
    )?;
    Ok(())
}

/// The policy as the flags change it (`--gradient-accumulation-steps`, HF's name,
/// replaces the policy's `grad_accum`), checked for what the engine supports.
pub(super) fn effective_policy(
    policy: &TrainerPolicy,
    args: &TrainingArgs,
) -> Result<TrainerPolicy> {
    let grad_accum = match args.gradient_accumulation_steps {
        Some(0) => {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "gradient_accumulation_steps",
                value: "0".into(),
                expected: "at least 1 micro-batch per step",
            }))
        }
        Some(n) => GradAccum::Fixed(n),
        None => policy.grad_accum,
    };
    let policy = TrainerPolicy {
        grad_accum,
        lr_scaling: args.lr_scaling.unwrap_or(policy.lr_scaling),
        ..*policy
    };
    if args.lr_reference_batch == Some(0) {
        return Err(Error::Settings(SettingsError::InvalidSetting {
            name: "lr_reference_batch",
            value: "0".into(),
            expected: "a global batch of at least 1 example",
        }));
    }
    if let Some(reason) = policy.unsupported() {
        return Err(Error::Settings(SettingsError::UnsupportedPolicy { reason }));
    }
    if let GradAccum::Fixed(0) | GradAccum::Target { global: 0 } = policy.grad_accum {
        return Err(Error::Settings(SettingsError::InvalidSetting {
            name: "grad_accum",
            value: "0".into(),
            expected: "at least one micro-batch / example",
        }));
    }
    Ok(policy)
}

/// A schedule in global units (a ramp, `noise_scale`) sets each step's global
/// batch itself: nothing else may size it.
pub(super) fn check_global_schedule(
    first_global: Option<usize>,
    policy: &TrainerPolicy,
    args: &TrainingArgs,
) -> Result<()> {
    if first_global.is_some() && matches!(policy.grad_accum, GradAccum::Target { .. }) {
        return Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "a schedule in global units (ramp, noise_scale)",
            second: "grad_accum = target(..)",
            reason: "the schedule sets each step's global batch itself: use grad_accum = fixed(n) to split it into n micro-batches",
        }));
    }
    if first_global.is_some() && args.max_tokens_per_batch.is_some() {
        return Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "a schedule in global units (ramp, noise_scale)",
            second: "--max-tokens-per-batch",
            reason: "both size the batches: choose one",
        }));
    }
    Ok(())
}

/// Length-aware batching sizes each global batch itself: no accumulation, no
/// mixing.
pub(super) fn check_batching(
    policy: &TrainerPolicy,
    length_aware: bool,
    mixed: bool,
) -> Result<()> {
    if length_aware && policy.grad_accum != GradAccum::Fixed(1) {
        return Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "length-aware batching",
            second: "grad_accum",
            reason:
                "length-aware batching sizes each global batch itself: use grad_accum = fixed(1)",
        }));
    }
    if mixed && length_aware {
        return Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "several sources",
            second: "length-aware batching",
            reason:
                "a mixed global batch is divided by weights, a length-aware one by lengths: use one",
        }));
    }
    Ok(())
}

/// `schedule = goodput(..)` chooses the micro-batches itself, and its first
/// shape must fit `max_local`.
pub(super) fn check_goodput(
    policy: &TrainerPolicy,
    args: &TrainingArgs,
    spec: &GoodputSpec,
    world_size: usize,
) -> Result<()> {
    if policy.grad_accum != GradAccum::Fixed(1) || args.gradient_accumulation_steps.is_some() {
        return Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "schedule = goodput(..)",
            second: "grad_accum / --gradient-accumulation-steps",
            reason: "goodput chooses each step's micro-batches itself (bound them with max_local and max_micro_batches)",
        }));
    }
    spec.first_shape(world_size).map(|_| ())
}

/// The gradient noise scale (logged or scheduling) needs each small batch's mean
/// gradient (over examples, or over tokens with `token_count`), and at least two
/// small batches per step.
pub(super) fn check_noise_scale(
    policy: &TrainerPolicy,
    measured: bool,
    world_size: usize,
) -> Result<()> {
    if !measured {
        return Ok(());
    }
    // A mean of per-rank means has no small batch of a known size.
    if policy.reweight == Reweight::RankMean {
        return Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "--log-gradient-noise-scale",
            second: "reweight = none",
            reason: "the estimator needs each small batch's mean gradient over examples or tokens",
        }));
    }
    if world_size == 1 && policy.grad_accum == GradAccum::Fixed(1) {
        return Err(Error::Settings(
            SettingsError::NoiseScaleNeedsSmallBatches { small_batches: 1 },
        ));
    }
    Ok(())
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
