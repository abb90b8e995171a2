//! The batch flags: `BatchArgs` (sizes, Megatron-LM's ramp, accumulation) and
//! `LengthAwareArgs` (batches sized by the examples' lengths) check and resolve
//! themselves.

use crate::adapt::ramp::Ramp;
use crate::adapt::schedule::{Schedule, ScheduleSpec};
use crate::config::args::{BatchArgs, LengthAwareArgs};
use crate::config::policy::{GradAccum, TrainerPolicy};
use crate::data::length::{LengthBatching, LengthOptions};
use crate::error::{Error, Result, SettingsError};

use super::require;

impl BatchArgs {
    /// Sizes of at least one, and a ramp given whole.
    pub(super) fn check(&self) -> Result<()> {
        if self.per_device_train_batch_size == 0 {
            return Err(Error::Settings(SettingsError::ZeroBatchSize {
                what: "per_device_train_batch_size",
            }));
        }
        if self.global_batch_size == Some(0) {
            return Err(Error::Settings(SettingsError::ZeroBatchSize {
                what: "global_batch_size",
            }));
        }
        require(
            self.gradient_accumulation_steps != Some(0),
            "gradient_accumulation_steps",
            0,
            "at least 1 micro-batch per step",
        )?;
        if self.rampup_in_tokens && self.rampup_batch_size.is_none() {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "rampup_in_tokens",
                value: "true".into(),
                expected: "together with --rampup-batch-size START INCR TOKENS",
            }));
        }
        match (&self.rampup_batch_size, self.global_batch_size) {
            (Some(values), _) if values.len() != 3 => {
                Err(Error::Settings(SettingsError::InvalidSetting {
                    name: "rampup_batch_size",
                    value: format!("{values:?}"),
                    expected: "three values: START INCR SAMPLES",
                }))
            }
            (Some(values), None) => Err(Error::Settings(SettingsError::InvalidSetting {
                name: "rampup_batch_size",
                value: values
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
                expected: "together with --global-batch-size G (the size the ramp ends at)",
            })),
            _ => Ok(()),
        }
    }

    /// The run's schedule: the trainer's, unless `--global-batch-size` (with or
    /// without `--rampup-batch-size`) replaces it with a global-batch ramp.
    pub(super) fn schedule(&self, trainer: ScheduleSpec) -> ScheduleSpec {
        let Some(global) = self.global_batch_size else {
            return trainer;
        };
        match self.rampup_batch_size.as_deref() {
            Some(&[start, increment, samples]) => {
                let ramp = Ramp {
                    start,
                    increment,
                    samples,
                    global,
                };
                if self.rampup_in_tokens {
                    ScheduleSpec::TokenRamp(ramp)
                } else {
                    ScheduleSpec::Ramp(ramp)
                }
            }
            _ => ScheduleSpec::Ramp(Ramp::constant(global)),
        }
    }

    /// `--gradient-accumulation-steps` (HF's name) replaces the trainer's
    /// `grad_accum`.
    pub(super) fn grad_accum(&self, trainer: GradAccum) -> GradAccum {
        self.gradient_accumulation_steps
            .map_or(trainer, GradAccum::Fixed)
    }

    /// What the run says at its start about flags another setting overrides.
    pub(super) fn start_warnings(
        &self,
        trainer: &ScheduleSpec,
        schedule: &ScheduleSpec,
        initial_per_device: usize,
    ) -> Vec<String> {
        let ramp = schedule.ramp();
        let asked = self.per_device_train_batch_size;
        let mut warnings = Vec::new();
        if schedule != trainer {
            warnings.push(format!(
                "the trainer's schedule is overridden by --global-batch-size / --rampup-batch-size: {}",
                describe_ramp(ramp, schedule.ramp_counts_tokens())
            ));
        }
        if ramp.is_some() {
            if initial_per_device != asked {
                warnings.push(format!(
                    "--per-device-train-batch-size {asked} is not used: the ramp sets the global batch ({} on the first step)",
                    ramp.map_or(0, |r| r.global_batch(0))
                ));
            }
        } else if initial_per_device != asked {
            warnings.push(format!(
                "--per-device-train-batch-size {asked} is overridden: the trainer's schedule (with its min_batch/max_batch) starts at {initial_per_device} per device",
            ));
        }
        warnings
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

impl LengthAwareArgs {
    /// A token budget of at least one, options that need it given with it, and
    /// margins that are numbers.
    pub(super) fn check(&self) -> Result<()> {
        if self.max_tokens_per_batch == Some(0) {
            return Err(Error::Settings(SettingsError::ZeroBatchSize {
                what: "max_tokens_per_batch",
            }));
        }
        if self.packed_token_budget && self.max_tokens_per_batch.is_none() {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "packed_token_budget",
                value: "true".into(),
                expected: "together with --max-tokens-per-batch N",
            }));
        }
        if let Some(growth) = self.max_batch_growth {
            require(
                growth.is_finite() && growth > 0.0,
                "max_batch_growth",
                growth,
                "a positive fraction",
            )?;
        }
        require(
            self.memory_margin.is_finite() && self.memory_margin >= 0.0,
            "memory_margin",
            self.memory_margin,
            "finite and >= 0",
        )
    }

    /// Length-aware batching from the schedule (`schedule = memory(..)`) or
    /// `--max-tokens-per-batch`; `None` without either.
    pub(super) fn batching(
        &self,
        policy: &TrainerPolicy,
        schedule: &ScheduleSpec,
        initial_per_device: usize,
        world_size: usize,
    ) -> Result<Option<(LengthBatching, LengthOptions)>> {
        let baseline_size = initial_per_device * world_size;
        let batching = match (*schedule, self.max_tokens_per_batch) {
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
            (_, Some(max_tokens)) if self.packed_token_budget => {
                LengthBatching::PackedTokens { max_tokens }
            }
            (_, Some(max_tokens)) => LengthBatching::TokenBudget { max_tokens },
            (_, None) => return Ok(None),
        };
        let options = LengthOptions {
            friendly_sizes: self.friendly_batch_sizes,
            even_sizes: self.even_batch_sizes,
            max_growth: self.max_batch_growth,
            keep_first: self.keep_first_batches,
            shuffle: policy.shuffle,
        };
        Ok(Some((batching, options)))
    }
}
