//! The settings of one run, checked once before any rank starts; how each
//! concern is resolved from the policy, the dataset and the flags is in
//! [`resolve`].

use std::path::PathBuf;

mod check;
mod resolve;
pub(crate) mod strategy;

use crate::adapt::lr::{LrScaling, LrSchedule, LrSchedulerType};
use crate::adapt::schedule::{validate_spec, BatchLimits, Schedule, ScheduleSpec};
use crate::config::args::TrainingArgs;
use crate::config::policy::{GradAccum, OomPolicy, Reweight, TrainerPolicy};
use crate::data::length::{LengthBatching, LengthIndex, LengthOptions};
use crate::data::planner::{RunLength, StepBatches, StepPlanner};
use crate::data::sampler::GlobalBatchSampler;
use crate::data::source_spec::SourceSpec;
use crate::dist::device_spec::DeviceSpec;
use crate::error::Result;
use crate::optim::precision::{LossScaler, Precision};
use crate::report::logging::Logger;
use crate::train::out_of_memory::FaultInjector;
use crate::user::data::Dataset;
use check::{
    check_args, check_batching, check_global_schedule, check_goodput, check_noise_scale,
    effective_policy,
};
pub(crate) use resolve::BuiltinMixer;
use resolve::{
    length_batching, loss_scaler, lr_schedule, precision, run_schedule, run_sources, start_warnings,
};
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
    pub(crate) grad_accum: GradAccum,
    pub(crate) lr: LrSchedule,
    /// `--lr-reference-batch`, when given (a checkpoint records it).
    pub(crate) lr_reference: Option<usize>,
    pub(crate) batching: Option<(LengthBatching, LengthOptions)>,
    pub(crate) memory_margin: f64,
    pub(crate) device: DeviceSpec,
    /// Said once at the start of the run (settings that another one overrides).
    pub(crate) warnings: Vec<String>,
    /// Every example's length, for a ramp over tokens.
    pub(crate) token_lengths: Option<std::sync::Arc<[usize]>>,
    /// The dataset's sources, when it mixes several (weights after `mix = fixed(..)`
    /// and `--mix-weights`).
    pub(crate) sources: Option<SourceSpec>,
    /// `mix = online(..)`: temperature, floor, smoothing of the engine's mixer.
    pub(crate) builtin_mixer: Option<BuiltinMixer>,
    /// `--mix-weights` was given (a mixer would ignore it).
    pub(crate) mix_weights_given: bool,
    /// Collate threads per rank (`--dataloader-num-workers`).
    pub(crate) prefetch_workers: usize,
    /// `--release-freed-memory`: leave the host allocator as it is.
    pub(crate) release_freed_memory: bool,
    /// How a step trains: reweighting, OOM policy, clipping, precision.
    pub(crate) step: StepRules,
    /// When a step is logged.
    pub(crate) logs: LogRules,
    /// When and how the run evaluates.
    pub(crate) eval: EvalRules,
    /// Where and when the run saves, and what it resumes.
    pub(crate) saves: SaveRules,
}

/// How long the run lasts: `--max-train-tokens`, else `--max-steps`, else epochs.
fn run_length(args: &TrainingArgs) -> RunLength {
    match (args.max_train_tokens, args.max_steps) {
        (Some(tokens), _) => RunLength::Tokens(tokens),
        (None, Some(steps)) => RunLength::Steps(steps),
        (None, None) => RunLength::Epochs(args.num_train_epochs),
    }
}

/// Every example's length, when tokens are counted (a ramp over tokens, a run
/// length in tokens).
fn token_lengths<D: Dataset + ?Sized>(
    dataset: &D,
    schedule: &ScheduleSpec,
    length: RunLength,
) -> Option<std::sync::Arc<[usize]>> {
    let counted =
        matches!(schedule, ScheduleSpec::TokenRamp(_)) || matches!(length, RunLength::Tokens(_));
    counted.then(|| (0..dataset.len()).map(|i| dataset.example_len(i)).collect())
}

/// How each step trains, the same on every rank.
#[derive(Debug, Clone)]
pub(crate) struct StepRules {
    pub(crate) reweight: Reweight,
    pub(crate) oom: OomPolicy,
    pub(crate) faults: FaultInjector,
    /// `--max-grad-norm` (0: no clipping).
    pub(crate) max_grad_norm: f64,
    /// The moving averages' factor of the gradient noise scale, when measured.
    pub(crate) noise_scale_beta: Option<f64>,
    /// `--bf16` / `--fp16`.
    pub(crate) precision: Precision,
    /// `--fp16`'s loss scaling, as it starts.
    pub(crate) loss_scaler: Option<LossScaler>,
}

/// When a step is logged: every `every` steps (and the last), the first too
/// with `--logging-first-step`.
#[derive(Debug, Clone)]
pub(crate) struct LogRules {
    pub(crate) every: usize,
    pub(crate) first_step: bool,
}

/// When the run evaluates (with an eval dataset; always at the end too): at
/// the start with `--eval-on-start`, every `every`, in chunks of `batch_size`.
#[derive(Debug, Clone)]
pub(crate) struct EvalRules {
    pub(crate) on_start: bool,
    pub(crate) every: Interval,
    pub(crate) batch_size: usize,
}

/// Where checkpoints go and when (a run that saves also saves at its end), how
/// many are kept, the best model's rule, and the checkpoint resumed.
#[derive(Debug, Clone)]
pub(crate) struct SaveRules {
    pub(crate) output_dir: PathBuf,
    pub(crate) every: Interval,
    /// `--load-best-model-at-end`.
    pub(crate) best_model: Option<BestModel>,
    pub(crate) resume: Option<PathBuf>,
    pub(crate) total_limit: Option<usize>,
    pub(crate) ignore_optimizer_state: bool,
    /// `--init-from`: weights to start a fresh run from, and whether strictly.
    pub(crate) init_from: Option<(PathBuf, bool)>,
}

impl StepRules {
    fn of(args: &TrainingArgs, policy: &TrainerPolicy, noise_measured: bool) -> Result<Self> {
        Ok(Self {
            reweight: policy.reweight,
            oom: args.oom.unwrap_or(policy.oom),
            faults: FaultInjector::at_steps(args.inject_oom_at_steps.iter().copied()),
            max_grad_norm: args.max_grad_norm,
            noise_scale_beta: noise_measured.then_some(NOISE_SCALE_BETA),
            precision: precision(args)?,
            loss_scaler: loss_scaler(args)?,
        })
    }
}

impl EvalRules {
    fn of(args: &TrainingArgs) -> Result<Self> {
        Ok(Self {
            on_start: args.eval_on_start,
            every: Interval::of_eval(args)?,
            batch_size: args.per_device_eval_batch_size,
        })
    }
}

impl SaveRules {
    fn of(
        args: &TrainingArgs,
        every: Interval,
        best_model: Option<BestModel>,
        resume: Option<PathBuf>,
    ) -> Self {
        Self {
            output_dir: args.output_dir.clone(),
            every,
            best_model,
            resume,
            total_limit: args.save_total_limit,
            ignore_optimizer_state: args.ignore_optimizer_state,
            init_from: (args.init_from.clone()).map(|path| (path, args.init_from_strict)),
        }
    }
}

/// The checkpoint a run resumes, if any, and the ranks its per-device sizes count:
/// those of the run that wrote the checkpoint, so that a run resumed on another
/// number of ranks keeps its global batches (see `checkpoint::resume_point`).
#[derive(Debug, Clone)]
pub(crate) struct ResumePoint {
    pub(crate) dir: Option<PathBuf>,
    pub(crate) units_world: usize,
}

/// Smoothing of the gradient noise scale's moving averages.
pub(crate) const NOISE_SCALE_BETA: f64 = 0.95;

/// The first global batch of a schedule in global units (a ramp, `noise_scale`,
/// `goodput`), checking what goodput needs.
fn first_global_batch(
    schedule: &ScheduleSpec,
    policy: &TrainerPolicy,
    args: &TrainingArgs,
    world_size: usize,
) -> Result<Option<usize>> {
    Ok(match schedule {
        ScheduleSpec::NoiseScale(noise) => Some(noise.min),
        ScheduleSpec::Goodput(spec) => {
            check_goodput(policy, args, spec, world_size)?;
            Some(spec.min)
        }
        _ => schedule.ramp().map(|r| r.global_batch(0)),
    })
}

impl RunSettings {
    pub(crate) fn new<D: Dataset + ?Sized>(
        policy: &TrainerPolicy,
        dataset: &D,
        args: &TrainingArgs,
        world_size: usize,
        resume: ResumePoint,
    ) -> Result<Self> {
        let num_examples = dataset.len();
        check_args(args, num_examples, world_size)?;
        let eval = EvalRules::of(args)?;
        let save_every = Interval::of_save(args)?;
        let best_model = BestModel::of(args, eval.every, save_every)?;
        let policy = &effective_policy(policy, args)?;
        let schedule = run_schedule(policy, args)?;
        validate_spec(&schedule)?;
        let noise_schedule = schedule.follows_noise_scale();
        let first_global = first_global_batch(&schedule, policy, args, world_size)?;
        check_global_schedule(first_global, policy, args)?;
        let ResumePoint {
            dir: resume,
            units_world,
        } = resume;
        let limits = BatchLimits::new(policy.min_batch, policy.max_batch)?;
        let drop_last = args.dataloader_drop_last.unwrap_or(policy.drop_last);
        let initial_per_device = match first_global {
            Some(global) => global.div_ceil(units_world),
            None => limits.apply(0, schedule.initial(args.per_device_train_batch_size))?,
        };
        let batching = length_batching(policy, &schedule, args, initial_per_device, units_world)?;
        check_batching(policy, batching.is_some(), false)?;
        let sources = run_sources(dataset, &policy.mix, args)?;
        check_batching(policy, batching.is_some(), sources.is_some())?;
        let warnings = start_warnings(policy, &schedule, args, initial_per_device);
        let length = run_length(args);
        let seed = args.seed.unwrap_or(policy.seed);
        let micro_batches = match policy.grad_accum {
            GradAccum::Fixed(n) => n,
            // Micro-batches of the initial per-device size that reach the target.
            GradAccum::Target { global } => global
                .div_ceil(args.per_device_train_batch_size * world_size)
                .div_ceil(initial_per_device * units_world),
        };
        let initial_global = first_global
            .unwrap_or(initial_per_device * units_world * micro_batches)
            .min(num_examples);
        let noise_measured = args.log_gradient_noise_scale || noise_schedule;
        // Goodput chooses two micro-batches or more on one rank itself.
        let goodput = matches!(schedule, ScheduleSpec::Goodput(_));
        check_noise_scale(
            policy,
            noise_measured,
            world_size.max(1 + usize::from(goodput)),
        )?;
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
            grad_accum: policy.grad_accum,
            lr: lr_schedule(args, policy, num_examples, initial_global),
            lr_reference: args.lr_reference_batch,
            batching,
            memory_margin: args.memory_margin,
            device: DeviceSpec::parse(&args.device)?,
            warnings,
            sources,
            builtin_mixer: BuiltinMixer::of(&policy.mix),
            mix_weights_given: !args.mix_weights.is_empty(),
            prefetch_workers: args.dataloader_num_workers,
            release_freed_memory: args.release_freed_memory,
            token_lengths: token_lengths(dataset, &schedule, length),
            step: StepRules::of(args, policy, noise_measured)?,
            logs: LogRules {
                every: args.logging_steps,
                first_step: args.logging_first_step,
            },
            eval,
            saves: SaveRules::of(args, save_every, best_model, resume),
        };
        settings.set_lr_horizon(args)?;
        Ok(settings)
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
        if self.schedule.follows_noise_scale() {
            self.warnings.push(
                "the gradient noise scale sizes the batches while training: the learning-rate horizon assumes the first global batch throughout".into(),
            );
        }
        if let RunLength::Tokens(tokens) = self.length {
            return self.set_lr_horizon_in_tokens(args, tokens);
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
                RunLength::Tokens(_) => unreachable!("a run in tokens has its own horizon"),
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

    /// A run of `tokens` tokens: the schedule runs over tokens, `--warmup-steps`
    /// taken as that many first global batches of the mean example length.
    fn set_lr_horizon_in_tokens(&mut self, args: &TrainingArgs, tokens: u64) -> Result<()> {
        let total = tokens as f64;
        self.lr.total_examples = total;
        self.lr.warmup_examples = if args.warmup_steps > 0 {
            let lengths = self.token_lengths.as_deref().unwrap_or(&[]);
            let mean = lengths.iter().sum::<usize>() as f64 / lengths.len().max(1) as f64;
            let first = (self.initial_per_device * self.units_world) as f64;
            (args.warmup_steps as f64 * first * mean).min(total)
        } else {
            args.warmup_ratio * total
        };
        Ok(())
    }

    /// Where the learning-rate schedule stands before the step of `batches` (just
    /// drawn by `planner`): examples consumed, or tokens under a run in tokens.
    pub(crate) fn lr_position(
        &self,
        planner: &StepPlanner<ScheduleSpec>,
        batches: &StepBatches,
    ) -> usize {
        if self.lr.in_tokens {
            let before = planner.tokens_seen() - planner.step_tokens(batches);
            usize::try_from(before).unwrap_or(usize::MAX)
        } else {
            planner.sampler().examples_seen() - batches.global_size()
        }
    }

    /// The learning-rate rule as a checkpoint records it: the scaling, and the
    /// reference batch when one was given (a default reference is the first global
    /// batch, which the rest of the policy fixes).
    pub(crate) fn lr_rule(&self) -> String {
        match self.lr_reference {
            Some(reference) if self.lr.scaling != LrScaling::Off => {
                format!("{:?} at global batch {reference}", self.lr.scaling)
            }
            _ => format!("{:?}", self.lr.scaling),
        }
    }

    /// The examples' lengths, sorted for length-aware batching (`None` without
    /// it): the one place the engine and the dry run build the index.
    pub(crate) fn length_index<D: Dataset + ?Sized>(&self, dataset: &D) -> Option<LengthIndex> {
        self.batching.map(|_| {
            let lengths: Vec<usize> = (0..self.num_examples)
                .map(|i| dataset.example_len(i))
                .collect();
            LengthIndex::new(&lengths)
        })
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
        match self.schedule {
            ScheduleSpec::NoiseScale(policy) => planner.set_global_batch(policy.min),
            ScheduleSpec::Goodput(spec) => {
                let first = spec.first_shape(self.world_size)?;
                planner.set_global_batch(first.global);
                planner.set_micro_batches(first.micro_batches);
            }
            _ => {}
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
            (RunLength::Steps(_) | RunLength::Tokens(_), _) => None,
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
            self.saves.resume.is_some(),
        )?
        .with_outputs(args)?;
        for warning in &self.warnings {
            logger.event(&format!("warning: {warning}"));
        }
        Ok(logger)
    }
}
