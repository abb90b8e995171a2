//! The settings of one run, checked once before any rank starts.

use crate::adapt::lr::LrSchedule;
use crate::adapt::schedule::{validate_spec, BatchLimits, Schedule, ScheduleSpec};
use crate::config::args::TrainingArgs;
use crate::config::policy::{GradAccum, OomPolicy, Reweight, TrainerPolicy};
use crate::data::length::{LengthBatching, LengthOptions};
use crate::data::planner::RunLength;
use crate::dist::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::report::logging::Logger;
use crate::train::oom::FaultInjector;

/// Settings of one run, checked once before any rank starts.
#[derive(Debug, Clone)]
pub(crate) struct RunSettings {
    pub(crate) num_examples: usize,
    pub(crate) world_size: usize,
    pub(crate) seed: u64,
    pub(crate) drop_last: bool,
    pub(crate) shuffle: bool,
    pub(crate) schedule: ScheduleSpec,
    pub(crate) limits: BatchLimits,
    pub(crate) initial_per_device: usize,
    pub(crate) length: RunLength,
    pub(crate) reweight: Reweight,
    pub(crate) oom: OomPolicy,
    pub(crate) grad_accum: GradAccum,
    pub(crate) faults: FaultInjector,
    pub(crate) lr: LrSchedule,
    pub(crate) max_grad_norm: f64,
    pub(crate) logging_steps: usize,
    pub(crate) batching: Option<(LengthBatching, LengthOptions)>,
    pub(crate) memory_margin: f64,
    pub(crate) output_dir: std::path::PathBuf,
    pub(crate) save_steps: usize,
    pub(crate) resume: Option<std::path::PathBuf>,
    pub(crate) device: DeviceSpec,
}

impl RunSettings {
    pub(crate) fn new(
        policy: &TrainerPolicy,
        num_examples: usize,
        args: &TrainingArgs,
        world_size: usize,
    ) -> Result<Self> {
        if world_size == 0 {
            return Err(Error::InvalidConfig(
                "nproc_per_node must be at least 1".into(),
            ));
        }
        if num_examples == 0 {
            return Err(Error::EmptyDataset);
        }
        if world_size > num_examples {
            return Err(Error::MoreRanksThanExamples {
                world_size,
                examples: num_examples,
            });
        }
        if args.per_device_train_batch_size == 0 {
            return Err(Error::ZeroBatchSize {
                what: "per_device_train_batch_size",
            });
        }
        if args.max_steps == Some(0) {
            return Err(Error::InvalidConfig("max_steps must be at least 1".into()));
        }
        if args.num_train_epochs == 0 && args.max_steps.is_none() {
            return Err(Error::ZeroEpochs);
        }
        if args.logging_steps == 0 {
            return Err(Error::InvalidConfig(
                "logging_steps must be at least 1".into(),
            ));
        }
        if !(args.learning_rate.is_finite() && args.learning_rate >= 0.0) {
            return Err(Error::InvalidConfig(format!(
                "learning_rate {} must be finite and >= 0",
                args.learning_rate
            )));
        }
        if !(0.0..=1.0).contains(&args.warmup_ratio) {
            return Err(Error::InvalidConfig(format!(
                "warmup_ratio {} must be in [0, 1]",
                args.warmup_ratio
            )));
        }
        if !(args.max_grad_norm.is_finite() && args.max_grad_norm >= 0.0) {
            return Err(Error::InvalidConfig(format!(
                "max_grad_norm {} must be finite and >= 0",
                args.max_grad_norm
            )));
        }
        if let Some(reason) = policy.unsupported() {
            return Err(Error::InvalidConfig(reason.into()));
        }
        validate_spec(&policy.schedule)?;
        let micro_batches = match policy.grad_accum {
            GradAccum::Fixed(0) | GradAccum::Target { global: 0 } => {
                return Err(Error::InvalidConfig(
                    "grad_accum needs at least one micro-batch / example".into(),
                ))
            }
            GradAccum::Fixed(n) => n,
            GradAccum::Target { global } => {
                global.div_ceil(args.per_device_train_batch_size * world_size)
            }
        };
        let limits = BatchLimits::new(policy.min_batch, policy.max_batch)?;
        let drop_last = args.dataloader_drop_last.unwrap_or(policy.drop_last);
        let initial_per_device =
            limits.apply(0, policy.schedule.initial(args.per_device_train_batch_size))?;
        let batching = length_batching(policy, args, initial_per_device, world_size)?;
        if batching.is_some() && policy.grad_accum != GradAccum::Fixed(1) {
            return Err(Error::InvalidConfig(
                "length-aware batching sizes each global batch itself: use grad_accum = fixed(1)"
                    .into(),
            ));
        }
        if !(args.memory_margin.is_finite() && args.memory_margin >= 0.0) {
            return Err(Error::InvalidConfig(format!(
                "memory_margin {} must be finite and >= 0",
                args.memory_margin
            )));
        }
        let length = args
            .max_steps
            .map_or(RunLength::Epochs(args.num_train_epochs), RunLength::Steps);
        let total_examples = (args.num_train_epochs.max(1) * num_examples) as f64;
        Ok(Self {
            num_examples,
            world_size,
            seed: args.seed.unwrap_or(policy.seed),
            drop_last,
            shuffle: policy.shuffle,
            schedule: policy.schedule,
            limits,
            initial_per_device,
            length,
            reweight: policy.reweight,
            oom: args.oom.unwrap_or(policy.oom),
            grad_accum: policy.grad_accum,
            faults: FaultInjector::at_steps(args.inject_oom_at_steps.iter().copied()),
            lr: LrSchedule {
                base: args.learning_rate,
                kind: args.lr_scheduler_type,
                warmup_examples: args.warmup_ratio * total_examples,
                total_examples,
                scaling: policy.lr_scaling,
                initial_global_batch: (initial_per_device * world_size * micro_batches)
                    .min(num_examples),
            },
            max_grad_norm: args.max_grad_norm,
            logging_steps: args.logging_steps,
            batching,
            memory_margin: args.memory_margin,
            output_dir: args.output_dir.clone(),
            save_steps: args.save_steps,
            resume: args.resume_from_checkpoint.clone(),
            device: DeviceSpec::parse(&args.device)?,
        })
    }

    pub(crate) fn logger(&self, args: &TrainingArgs) -> Result<Logger> {
        let total = match self.length {
            RunLength::Epochs(e) => Some((e * self.num_examples) as u64),
            RunLength::Steps(_) => None,
        };
        let bar = if args.quiet || args.disable_tqdm {
            None
        } else {
            total
        };
        Logger::new(
            args.log_jsonl.as_deref(),
            bar,
            !args.quiet,
            args.log_indices,
        )
    }
}

/// Length-aware batching from the policy (`schedule = memory(..)`) or the run's
/// `--max-tokens-per-batch`.
fn length_batching(
    policy: &TrainerPolicy,
    args: &TrainingArgs,
    initial_per_device: usize,
    world_size: usize,
) -> Result<Option<(LengthBatching, LengthOptions)>> {
    let baseline_size = initial_per_device * world_size;
    let batching = match (policy.schedule, args.max_tokens_per_batch) {
        (ScheduleSpec::Memory { .. }, Some(_)) => return Err(Error::InvalidConfig(
            "--max-tokens-per-batch and schedule = memory(..) both size the batches: choose one"
                .into(),
        )),
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
            return Err(Error::ZeroBatchSize {
                what: "max_tokens_per_batch",
            })
        }
        (_, Some(max_tokens)) => LengthBatching::TokenBudget { max_tokens },
        (_, None) => return Ok(None),
    };
    if args
        .max_batch_growth
        .is_some_and(|g| !(g.is_finite() && g > 0.0))
    {
        return Err(Error::InvalidConfig(
            "max_batch_growth must be a positive fraction".into(),
        ));
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
