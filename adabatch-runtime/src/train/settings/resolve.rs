//! How each concern of the run's settings is resolved from the policy, the
//! dataset and the command line: sources and their weights, the schedule (and
//! Megatron's ramp flags), length-aware batching, the built-in mixer, precision.

use crate::adapt::lr::LrSchedule;
use crate::adapt::ramp::Ramp;
use crate::adapt::schedule::{Schedule, ScheduleSpec};
use crate::config::args::TrainingArgs;
use crate::config::policy::{MixSpec, TrainerPolicy};
use crate::data::length::{LengthBatching, LengthOptions};
use crate::data::source_spec::SourceSpec;
use crate::error::{DataError, Error, Result, SettingsError};
use crate::optim::precision::{LossScaler, Precision};
use crate::user::data::Dataset;

/// `Ok` when `ok`, else the typed error naming the setting.
pub(super) fn require(
    ok: bool,
    name: &'static str,
    value: impl ToString,
    expected: &'static str,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Settings(SettingsError::InvalidSetting {
            name,
            value: value.to_string(),
            expected,
        }))
    }
}

/// The dataset's sources, with the weights of `mix = fixed(..)`, then of
/// `--mix-weights name=w,..`, in place of its own.
pub(super) fn run_sources<D: Dataset + ?Sized>(
    dataset: &D,
    mix: &MixSpec,
    args: &TrainingArgs,
) -> Result<Option<SourceSpec>> {
    let Some(mut spec) = dataset.sources() else {
        if !args.mix_weights.is_empty() {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "mix_weights",
                value: args.mix_weights.join(","),
                expected: "a dataset of several sources (adabatch::Sources)",
            }));
        }
        if let Some(stopping) = args.stopping_strategy {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "stopping_strategy",
                value: format!("{stopping:?}"),
                expected: "a dataset of several sources (adabatch::Sources)",
            }));
        }
        if *mix != MixSpec::Dataset {
            return Err(Error::Data(DataError::MixerWithoutSources));
        }
        return Ok(None);
    };
    if let Some(stopping) = args.stopping_strategy {
        spec.stopping = stopping;
    }
    if let MixSpec::Fixed(pairs) = mix {
        let named: Vec<(String, f64)> = pairs.iter().map(|(n, w)| (n.to_string(), *w)).collect();
        spec = spec.reweighted(&named)?;
    }
    if args.mix_weights.is_empty() {
        return Ok(Some(spec));
    }
    let weights = args
        .mix_weights
        .iter()
        .map(|pair| {
            let parsed = pair.split_once('=').and_then(|(name, w)| {
                Some((name.trim().to_string(), w.trim().parse::<f64>().ok()?))
            });
            parsed.ok_or_else(|| {
                Error::Settings(SettingsError::InvalidSetting {
                    name: "mix_weights",
                    value: pair.clone(),
                    expected: "source=weight pairs, e.g. new=0.75,replay=0.25",
                })
            })
        })
        .collect::<Result<Vec<_>>>()?;
    spec.reweighted(&weights).map(Some)
}

/// The run's schedule: the trainer's, unless `--global-batch-size` (with or without
/// `--rampup-batch-size`) replaces it with a global-batch ramp.
pub(super) fn run_schedule(policy: &TrainerPolicy, args: &TrainingArgs) -> Result<ScheduleSpec> {
    if args.rampup_in_tokens && args.rampup_batch_size.is_none() {
        return Err(Error::Settings(SettingsError::InvalidSetting {
            name: "rampup_in_tokens",
            value: "true".into(),
            expected: "together with --rampup-batch-size START INCR TOKENS",
        }));
    }
    match (&args.rampup_batch_size, args.global_batch_size) {
        (None, None) => Ok(policy.schedule),
        (None, Some(global)) => Ok(ScheduleSpec::Ramp(Ramp::constant(global))),
        (Some(values), Some(global)) => match values.as_slice() {
            &[start, increment, samples] => {
                let ramp = Ramp {
                    start,
                    increment,
                    samples,
                    global,
                };
                Ok(if args.rampup_in_tokens {
                    ScheduleSpec::TokenRamp(ramp)
                } else {
                    ScheduleSpec::Ramp(ramp)
                })
            }
            other => Err(Error::Settings(SettingsError::InvalidSetting {
                name: "rampup_batch_size",
                value: format!("{other:?}"),
                expected: "three values: START INCR SAMPLES",
            })),
        },
        (Some(values), None) => Err(Error::Settings(SettingsError::InvalidSetting {
            name: "rampup_batch_size",
            value: values
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            expected: "together with --global-batch-size G (the size the ramp ends at)",
        })),
    }
}

pub(super) fn describe_ramp(ramp: Option<Ramp>, in_tokens: bool) -> String {
    let over = if in_tokens { "tokens" } else { "samples" };
    match ramp {
        Some(r) if r.is_constant() => format!("a global batch of {}", r.global),
        Some(r) => format!(
            "ramp(start = {}, increment = {}, {over} = {}, global = {})",
            r.start, r.increment, r.samples, r.global
        ),
        None => "none".into(),
    }
}

/// Length-aware batching from the schedule (`schedule = memory(..)`) or the run's
/// `--max-tokens-per-batch`.
pub(super) fn length_batching(
    policy: &TrainerPolicy,
    schedule: &ScheduleSpec,
    args: &TrainingArgs,
    initial_per_device: usize,
    world_size: usize,
) -> Result<Option<(LengthBatching, LengthOptions)>> {
    let baseline_size = initial_per_device * world_size;
    if args.packed_token_budget && args.max_tokens_per_batch.is_none() {
        return Err(Error::Settings(SettingsError::InvalidSetting {
            name: "packed_token_budget",
            value: "true".into(),
            expected: "together with --max-tokens-per-batch N",
        }));
    }
    let batching = match (*schedule, args.max_tokens_per_batch) {
        (ScheduleSpec::Memory { .. }, Some(_)) => {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "--max-tokens-per-batch",
                second: "schedule = memory(..)",
                reason: "both size the batches: choose one",
            }))
        }
        (
            ScheduleSpec::Memory {
                threshold,
                max_range,
            },
            None,
        ) => LengthBatching::Memory {
            baseline_size,
            threshold,
            // `max_batch` caps the per-device size, so the global batch too.
            max_range: match policy.max_batch {
                Some(max) => max_range.min((max * world_size) as f64 / baseline_size as f64),
                None => max_range,
            },
        },
        (_, Some(0)) => {
            return Err(Error::Settings(SettingsError::ZeroBatchSize {
                what: "max_tokens_per_batch",
            }))
        }
        (_, Some(max_tokens)) if args.packed_token_budget => {
            LengthBatching::PackedTokens { max_tokens }
        }
        (_, Some(max_tokens)) => LengthBatching::TokenBudget { max_tokens },
        (_, None) => return Ok(None),
    };
    if let Some(growth) = args.max_batch_growth {
        require(
            growth.is_finite() && growth > 0.0,
            "max_batch_growth",
            growth,
            "a positive fraction",
        )?;
    }
    let options = LengthOptions {
        friendly_sizes: args.friendly_batch_sizes,
        even_sizes: args.even_batch_sizes,
        max_growth: args.max_batch_growth,
        keep_first: args.keep_first_batches,
        shuffle: policy.shuffle,
    };
    Ok(Some((batching, options)))
}

/// The mixer `mix = ..` asks the engine for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BuiltinMixer {
    /// `mix = online(temperature, floor, smoothing)`.
    Online(f64, f64, f64),
    /// `mix = custom(path)`.
    Custom(crate::adapt::mixer::MixFn),
}

impl BuiltinMixer {
    /// The engine's own mixer the policy's `mix` asks for, if any.
    pub(super) fn of(mix: &MixSpec) -> Option<Self> {
        match *mix {
            MixSpec::Online {
                temperature,
                floor,
                smoothing,
            } => Some(BuiltinMixer::Online(temperature, floor, smoothing)),
            MixSpec::Custom(f) => Some(BuiltinMixer::Custom(f)),
            MixSpec::Dataset | MixSpec::Fixed(_) => None,
        }
    }

    pub(crate) fn build(self) -> Box<dyn crate::adapt::mixer::Mixer> {
        match self {
            BuiltinMixer::Online(t, f, s) => {
                Box::new(crate::adapt::mixer::OnlineMixer::new(t, f, s))
            }
            BuiltinMixer::Custom(f) => Box::new(crate::adapt::mixer::FnMixer(f)),
        }
    }

    /// The key that asked for it, for messages.
    pub(crate) fn key(self) -> &'static str {
        match self {
            BuiltinMixer::Online(..) => "mix = online(..)",
            BuiltinMixer::Custom(_) => "mix = custom(..)",
        }
    }
}

/// `--bf16` / `--fp16` (clap refuses both on a command line; a `TrainingArgs`
/// built in code is checked here).
pub(super) fn precision(args: &TrainingArgs) -> Result<Precision> {
    match (args.bf16, args.fp16) {
        (true, true) => Err(Error::Settings(SettingsError::ConflictingSettings {
            first: "--bf16",
            second: "--fp16",
            reason: "a run computes in one half-precision type: pick one",
        })),
        (true, false) => Ok(Precision::Bf16),
        (false, true) => Ok(Precision::F16),
        (false, false) => Ok(Precision::F32),
    }
}

/// What the run says at its start about flags another setting overrides.
pub(super) fn start_warnings(
    policy: &TrainerPolicy,
    schedule: &ScheduleSpec,
    args: &TrainingArgs,
    initial_per_device: usize,
) -> Vec<String> {
    let ramp = schedule.ramp();
    let mut warnings = Vec::new();
    if *schedule != policy.schedule {
        warnings.push(format!(
            "the trainer's schedule is overridden by --global-batch-size / --rampup-batch-size: {}",
            describe_ramp(ramp, schedule.ramp_counts_tokens())
        ));
    }
    if ramp.is_some() {
        if initial_per_device != args.per_device_train_batch_size {
            warnings.push(format!(
                "--per-device-train-batch-size {} is not used: the ramp sets the global batch ({} on the first step)",
                args.per_device_train_batch_size,
                ramp.map_or(0, |r| r.global_batch(0))
            ));
        }
    } else if initial_per_device != args.per_device_train_batch_size {
        warnings.push(format!(
            "--per-device-train-batch-size {} is overridden: the trainer's schedule (with its min_batch/max_batch) starts at {} per device",
            args.per_device_train_batch_size, initial_per_device
        ));
    }
    warnings
}

/// `--fp16`'s loss scaling, as it starts.
pub(super) fn loss_scaler(args: &TrainingArgs) -> Result<Option<LossScaler>> {
    args.fp16
        .then(|| LossScaler::new(args.fp16_initial_scale_power, LossScaler::GROWTH_INTERVAL))
        .transpose()
}

/// The learning-rate schedule as it starts (its horizon is set once the planner
/// can count the run: `RunSettings::set_lr_horizon`).
pub(super) fn lr_schedule(
    args: &TrainingArgs,
    policy: &TrainerPolicy,
    num_examples: usize,
    initial_global_batch: usize,
) -> LrSchedule {
    // The first global batch is the reference unless one is given: a fixed batch
    // then trains at `--learning-rate` whatever the scaling.
    LrSchedule {
        base: args.learning_rate,
        kind: args.lr_scheduler_type,
        warmup_examples: 0.0,
        total_examples: (args.num_train_epochs.max(1) * num_examples) as f64,
        in_tokens: args.max_train_tokens.is_some(),
        scaling: policy.lr_scaling,
        reference_global_batch: args.lr_reference_batch.unwrap_or(initial_global_batch),
    }
}
