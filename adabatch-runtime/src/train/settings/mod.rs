//! The settings of one run, checked once before any rank starts; how each
//! concern is resolved from the policy, the dataset and the flags is in
//! [`resolve`].

mod resolve;
pub(crate) mod strategy;

use crate::adapt::lr::{LrSchedule, LrSchedulerType};
use crate::adapt::schedule::{validate_spec, BatchLimits, Schedule, ScheduleSpec};
use crate::config::args::TrainingArgs;
use crate::config::policy::{GradAccum, MixSpec, OomPolicy, Reweight, TrainerPolicy};
use crate::data::length::{LengthBatching, LengthOptions};
use crate::data::planner::{RunLength, StepPlanner};
use crate::data::sampler::GlobalBatchSampler;
use crate::data::sources::SourceSpec;
use crate::dist::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::optim::precision::{LossScaler, Precision};
use crate::report::logging::Logger;
use crate::train::oom::FaultInjector;
use crate::user::data::Dataset;
pub(crate) use resolve::BuiltinMixer;
use resolve::{describe_ramp, length_batching, precision, require, run_schedule, run_sources};
pub use strategy::BestCheckpoint;
pub(crate) use strategy::{BestModel, Interval};

/// Settings of one run, checked once before any rank starts.
#[derive(Debug, Clone)]
pub(crate) struct RunSettings {
    pub(crate) num_examples: usize,
    pub(crate) world_size: usize,
    /// Ranks the per-device sizes count (see `StepPlanner::global_batch`).
    pub(crate) units_world: usize,
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
    /// `--logging-first-step`.
    pub(crate) logging_first_step: bool,
    /// `--eval-on-start`.
    pub(crate) eval_on_start: bool,
    /// When to evaluate (with an eval dataset; always at the end too).
    pub(crate) eval_every: Interval,
    pub(crate) eval_batch_size: usize,
    pub(crate) batching: Option<(LengthBatching, LengthOptions)>,
    pub(crate) memory_margin: f64,
    pub(crate) output_dir: std::path::PathBuf,
    /// When to save (a run that saves also saves at its end).
    pub(crate) save_every: Interval,
    /// `--load-best-model-at-end`.
    pub(crate) best_model: Option<BestModel>,
    pub(crate) resume: Option<std::path::PathBuf>,
    pub(crate) save_total_limit: Option<usize>,
    pub(crate) ignore_optimizer_state: bool,
    pub(crate) device: DeviceSpec,
    /// The moving averages' factor of the gradient noise scale, when measured.
    pub(crate) noise_scale_beta: Option<f64>,
    /// Said once at the start of the run (settings that another one overrides).
    pub(crate) warnings: Vec<String>,
    /// Every example's length, for a ramp over tokens.
    pub(crate) token_lengths: Option<std::sync::Arc<[usize]>>,
    /// The dataset's sources, when it mixes several (weights after `mix = fixed(..)`
    /// and `--mix-weights`).
    pub(crate) sources: Option<SourceSpec>,
    /// `mix = online(..)`: temperature, floor, smoothing of the engine's mixer.
    pub(crate) builtin_mixer: Option<BuiltinMixer>,
    /// Collate threads per rank (`--dataloader-num-workers`).
    pub(crate) prefetch_workers: usize,
    /// `--release-freed-memory`: leave the host allocator as it is.
    pub(crate) release_freed_memory: bool,
    /// `--bf16` / `--fp16`.
    pub(crate) precision: Precision,
    /// `--fp16`'s loss scaling, as it starts.
    pub(crate) loss_scaler: Option<LossScaler>,
}

/// Smoothing of the gradient noise scale's moving averages.
pub(crate) const NOISE_SCALE_BETA: f64 = 0.95;

impl RunSettings {
    pub(crate) fn new<D: Dataset + ?Sized>(
        policy: &TrainerPolicy,
        dataset: &D,
        args: &TrainingArgs,
        world_size: usize,
    ) -> Result<Self> {
        let num_examples = dataset.len();
        require(world_size > 0, "nproc_per_node", world_size, "at least 1")?;
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
        require(args.max_steps != Some(0), "max_steps", 0, "at least 1")?;
        if args.num_train_epochs == 0 && args.max_steps.is_none() {
            return Err(Error::ZeroEpochs);
        }
        require(args.logging_steps > 0, "logging_steps", 0, "at least 1")?;
        require(args.eval_steps != Some(0), "eval_steps", 0, "at least 1")?;
        if args.per_device_eval_batch_size == 0 {
            return Err(Error::ZeroBatchSize {
                what: "per_device_eval_batch_size",
            });
        }
        require(
            args.save_total_limit != Some(0),
            "save_total_limit",
            0,
            "at least 1 (or unset to keep every checkpoint)",
        )?;
        let eval_every = Interval::of_eval(args)?;
        let save_every = Interval::of_save(args)?;
        let best_model = BestModel::of(args, eval_every, save_every)?;
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
        // `--gradient-accumulation-steps` (HF) replaces the policy's `grad_accum`.
        let grad_accum = match args.gradient_accumulation_steps {
            Some(0) => {
                return Err(Error::InvalidSetting {
                    name: "gradient_accumulation_steps",
                    value: "0".into(),
                    expected: "at least 1 micro-batch per step",
                })
            }
            Some(n) => GradAccum::Fixed(n),
            None => policy.grad_accum,
        };
        let policy = &TrainerPolicy {
            grad_accum,
            ..*policy
        };
        if let Some(reason) = policy.unsupported() {
            return Err(Error::UnsupportedPolicy { reason });
        }
        let schedule = run_schedule(policy, args)?;
        validate_spec(&schedule)?;
        let ramp = schedule.ramp();
        let noise_schedule = matches!(schedule, ScheduleSpec::NoiseScale { .. });
        // The first global batch of a schedule in global units.
        let first_global = match schedule {
            ScheduleSpec::NoiseScale { min, .. } => Some(min),
            _ => ramp.map(|r| r.global_batch(0)),
        };
        if first_global.is_some() && matches!(policy.grad_accum, GradAccum::Target { .. }) {
            return Err(Error::ConflictingSettings {
                first: "a schedule in global units (ramp, noise_scale)",
                second: "grad_accum = target(..)",
                reason: "the schedule sets each step's global batch itself: use grad_accum = fixed(n) to split it into n micro-batches",
            });
        }
        if first_global.is_some() && args.max_tokens_per_batch.is_some() {
            return Err(Error::ConflictingSettings {
                first: "a schedule in global units (ramp, noise_scale)",
                second: "--max-tokens-per-batch",
                reason: "both size the batches: choose one",
            });
        }
        let micro_batches = match policy.grad_accum {
            GradAccum::Fixed(0) | GradAccum::Target { global: 0 } => {
                return Err(Error::InvalidSetting {
                    name: "grad_accum",
                    value: "0".into(),
                    expected: "at least one micro-batch / example",
                })
            }
            GradAccum::Fixed(n) => n,
            GradAccum::Target { global } => {
                global.div_ceil(args.per_device_train_batch_size * world_size)
            }
        };
        let resume = match &args.resume_from_checkpoint {
            Some(dir) if dir.as_os_str() == "latest" => {
                Some(crate::train::checkpoint::format::latest(&args.output_dir)?)
            }
            other => other.clone(),
        };
        // Per-device sizes count the ranks of the run that wrote the checkpoint: a
        // run resumed on another number of ranks keeps its global batches.
        let units_world = match &resume {
            Some(dir) => crate::train::checkpoint::format::load_state(dir)?.world_size,
            None => world_size,
        };
        let limits = BatchLimits::new(policy.min_batch, policy.max_batch)?;
        let drop_last = args.dataloader_drop_last.unwrap_or(policy.drop_last);
        let initial_per_device = match first_global {
            Some(global) => global.div_ceil(units_world),
            None => limits.apply(0, schedule.initial(args.per_device_train_batch_size))?,
        };
        let batching = length_batching(policy, &schedule, args, initial_per_device, units_world)?;
        if batching.is_some() && policy.grad_accum != GradAccum::Fixed(1) {
            return Err(Error::ConflictingSettings {
                first: "length-aware batching",
                second: "grad_accum",
                reason: "length-aware batching sizes each global batch itself: use grad_accum = fixed(1)",
            });
        }
        let sources = run_sources(dataset, &policy.mix, args)?;
        let builtin_mixer = match policy.mix {
            MixSpec::Online {
                temperature,
                floor,
                smoothing,
            } => Some(BuiltinMixer::Online(temperature, floor, smoothing)),
            MixSpec::Custom(f) => Some(BuiltinMixer::Custom(f)),
            MixSpec::Dataset | MixSpec::Fixed(_) => None,
        };
        if sources.is_some() && batching.is_some() {
            return Err(Error::ConflictingSettings {
                first: "several sources",
                second: "length-aware batching",
                reason: "a mixed global batch is divided by weights, a length-aware one by lengths: use one",
            });
        }
        let mut warnings = Vec::new();
        if schedule != policy.schedule {
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
        let length = args
            .max_steps
            .map_or(RunLength::Epochs(args.num_train_epochs), RunLength::Steps);
        let seed = args.seed.unwrap_or(policy.seed);
        let micro_batches = match policy.grad_accum {
            GradAccum::Target { .. } => micro_batches.div_ceil(initial_per_device * units_world),
            GradAccum::Fixed(_) => micro_batches,
        };
        if args.log_gradient_noise_scale || noise_schedule {
            if policy.reweight != Reweight::SampleCount {
                return Err(Error::ConflictingSettings {
                    first: "--log-gradient-noise-scale",
                    second: "reweight other than sample_count",
                    reason: "the estimator needs each small batch's mean gradient",
                });
            }
            if world_size == 1 && policy.grad_accum == GradAccum::Fixed(1) {
                return Err(Error::NoiseScaleNeedsSmallBatches { small_batches: 1 });
            }
        }
        let mut settings = Self {
            num_examples,
            world_size,
            units_world,
            seed,
            drop_last,
            shuffle: policy.shuffle,
            schedule,
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
                warmup_examples: 0.0,
                total_examples: (args.num_train_epochs.max(1) * num_examples) as f64,
                scaling: policy.lr_scaling,
                initial_global_batch: match first_global {
                    Some(global) => global,
                    None => initial_per_device * units_world * micro_batches,
                }
                .min(num_examples),
            },
            max_grad_norm: args.max_grad_norm,
            logging_steps: args.logging_steps,
            logging_first_step: args.logging_first_step,
            eval_on_start: args.eval_on_start,
            eval_every,
            eval_batch_size: args.per_device_eval_batch_size,
            batching,
            memory_margin: args.memory_margin,
            output_dir: args.output_dir.clone(),
            save_every,
            best_model,
            resume,
            save_total_limit: args.save_total_limit,
            ignore_optimizer_state: args.ignore_optimizer_state,
            device: DeviceSpec::parse(&args.device)?,
            noise_scale_beta: (args.log_gradient_noise_scale || noise_schedule)
                .then_some(NOISE_SCALE_BETA),
            warnings,
            sources,
            builtin_mixer,
            prefetch_workers: args.dataloader_num_workers,
            release_freed_memory: args.release_freed_memory,
            precision: precision(args)?,
            loss_scaler: args
                .fp16
                .then(|| {
                    LossScaler::new(args.fp16_initial_scale_power, LossScaler::GROWTH_INTERVAL)
                })
                .transpose()?,
            token_lengths: matches!(schedule, ScheduleSpec::TokenRamp(_))
                .then(|| (0..num_examples).map(|i| dataset.example_len(i)).collect()),
        };
        settings.set_lr_horizon(args)?;
        Ok(settings)
    }

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
            return Err(Error::EvalSetTooSmall {
                world_size,
                examples,
            });
        }
        if self.best_model.is_some() && eval_len.is_none() {
            return Err(Error::ConflictingSettings {
                first: "--load-best-model-at-end",
                second: "a run without an eval dataset",
                reason: "the best checkpoint is the one whose evaluation scored best: train with an eval dataset (launch_with_eval)",
            });
        }
        if self.eval_on_start && eval_len.is_none() {
            return Err(Error::ConflictingSettings {
                first: "--eval-on-start",
                second: "a run without an eval dataset",
                reason:
                    "there is nothing to evaluate: train with an eval dataset (launch_with_eval)",
            });
        }
        if let (Interval::Steps(_) | Interval::Epoch, None, Some(logger)) =
            (self.eval_every, eval_len, logger)
        {
            logger.event(
                "warning: evaluations are asked for (--eval-steps / --eval-strategy) but the run has no eval dataset: nothing is evaluated (launch_with_eval adds one)",
            );
        }
        if trainer_has_mixer && self.sources.is_none() {
            return Err(Error::MixerWithoutSources);
        }
        // `mix = online(..)` / `custom(..)`: the engine's own mixer, unless the
        // trainer has one.
        if let (Some(asked), true) = (self.builtin_mixer, trainer_has_mixer) {
            return Err(Error::ConflictingSettings {
                first: asked.key(),
                second: "#[mixer]",
                reason: "two mixers would decide the same weights: keep one",
            });
        }
        Ok(())
    }

    /// The learning-rate horizon: what the run will consume. Exact for
    /// deterministic sizes (a dry run of the planner, so `max_steps` and
    /// `drop_last` count and a linear decay reaches 0 at the end, as in HF); an
    /// estimate, said at the start, for length-aware batches.
    fn set_lr_horizon(&mut self, args: &TrainingArgs) -> Result<()> {
        let needs_horizon = args.lr_scheduler_type != LrSchedulerType::Constant
            || args.warmup_ratio > 0.0
            || args.warmup_steps > 0;
        if !needs_horizon {
            return Ok(());
        }
        if matches!(self.schedule, ScheduleSpec::NoiseScale { .. }) {
            self.warnings.push(
                "noise_scale sizes the batches while training: the learning-rate horizon assumes the first global batch throughout".into(),
            );
        }
        // Examples of the first `--warmup-steps` steps, when asked for.
        let mut warmup = None;
        let total = if self.batching.is_none() {
            let mut planner = self.step_planner(0, false)?;
            let mut total = 0;
            while let Some(batches) = planner.next_step() {
                total += batches.global_size();
                if args.warmup_steps == planner.step() {
                    warmup = Some(total);
                }
                planner.finish_step()?;
            }
            total
        } else {
            let first = self.initial_per_device * self.units_world;
            if args.warmup_steps > 0 {
                warmup = Some(args.warmup_steps * first);
                self.warnings.push(format!(
                    "length-aware batches are sized while training: --warmup-steps {} is taken as {} examples (that many steps of the first global batch, {first})",
                    args.warmup_steps,
                    args.warmup_steps * first
                ));
            }
            let epochs = args.num_train_epochs.max(1) * self.num_examples;
            let estimate = match self.length {
                RunLength::Epochs(e) => e * self.num_examples,
                RunLength::Steps(steps) => {
                    (steps * self.initial_per_device * self.units_world).min(epochs)
                }
            };
            self.warnings.push(format!(
                "length-aware batches are sized while training: the learning-rate horizon is an estimate of {estimate} examples"
            ));
            estimate
        };
        self.lr.total_examples = total as f64;
        self.lr.warmup_examples = match (args.warmup_steps, warmup) {
            (0, _) => args.warmup_ratio * total as f64,
            // More warm-up steps than the run has: it warms up throughout.
            (_, warm) => warm.unwrap_or(total).min(total) as f64,
        };
        Ok(())
    }

    /// The step planner of this run (its sampler seeded with `seed`, shuffled or
    /// not): the one place the engine, the dry run and the LR horizon build it.
    pub(crate) fn step_planner(
        &self,
        seed: u64,
        shuffle: bool,
    ) -> Result<StepPlanner<ScheduleSpec>> {
        let sampler = match &self.sources {
            Some(spec) => GlobalBatchSampler::over_sources(
                spec,
                self.world_size,
                seed,
                shuffle,
                self.drop_last,
            )?,
            None => GlobalBatchSampler::new(
                self.num_examples,
                self.world_size,
                seed,
                shuffle,
                self.drop_last,
            )?,
        };
        let mut planner = StepPlanner::new(
            sampler,
            self.schedule,
            self.limits,
            self.initial_per_device,
            self.length,
            self.units_world,
            self.drop_last,
        )?
        .with_grad_accum(self.grad_accum);
        if let Some(lengths) = &self.token_lengths {
            planner = planner.with_lengths(lengths.clone());
        }
        if let ScheduleSpec::NoiseScale { min, .. } = self.schedule {
            planner.set_global_batch(min);
        }
        Ok(planner)
    }

    pub(crate) fn logger(&self, args: &TrainingArgs) -> Result<Logger> {
        let total = match (self.length, &self.sources) {
            (RunLength::Epochs(e), None) => Some((e * self.num_examples) as u64),
            // Epochs are passes over the primary source, a share of each batch.
            (RunLength::Epochs(e), Some(spec)) => {
                let share = spec.weights[0] / spec.weights.iter().sum::<f64>();
                (share > 0.0).then(|| (e as f64 * spec.sizes[0] as f64 / share).round() as u64)
            }
            (RunLength::Steps(_), _) => None,
        };
        let bar = if args.quiet || args.disable_tqdm {
            None
        } else {
            total
        };
        let logger = Logger::new(
            args.log_jsonl.as_deref(),
            bar,
            !args.quiet,
            args.log_indices,
            self.resume.is_some(),
        )?
        .with_outputs(args)?;
        for warning in &self.warnings {
            logger.event(&format!("warning: {warning}"));
        }
        Ok(logger)
    }
}
