//! The settings of one run, checked once before any rank starts. Each flag group
//! of [`TrainingArgs`] checks its own values and resolves itself into its rules
//! (`*_flags.rs`); [`RunSettings::new`] composes them once, then checks the
//! combinations no group can see alone ([`check`]).

use std::path::PathBuf;

mod batch_flags;
mod builtin_mixer;
mod check;
mod data_flags;
mod lr_flags;
mod output_flags;
mod run_flags;
mod step_flags;
pub(crate) mod strategy;

use crate::adapt::lr::{LrScaling, LrSchedule};
use crate::adapt::schedule::{validate_spec, BatchLimits, Schedule, ScheduleSpec};
use crate::config::args::TrainingArgs;
use crate::config::policy::{GradAccum, TrainerPolicy};
use crate::data::length::{LengthBatching, LengthIndex, LengthOptions};
use crate::data::planner::{RunLength, StepBatches, StepPlanner};
use crate::data::sampler::GlobalBatchSampler;
use crate::data::source_spec::SourceSpec;
use crate::dist::device_spec::DeviceSpec;
use crate::error::{Error, Result, SettingsError};
use crate::report::logging::Logger;
use crate::user::data::Dataset;
pub(crate) use builtin_mixer::BuiltinMixer;
use check::{check_ranks, effective_policy, Resolved};
pub(crate) use output_flags::{EvalRules, LogRules, SaveRules};
pub(crate) use step_flags::StepRules;
pub use strategy::BestCheckpoint;
pub(crate) use strategy::Interval;

/// `Ok` when `ok`, else the typed error naming the setting.
fn require(
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
    /// The optimizer the flags name, in words (the trainer's factory builds it).
    pub(crate) optimizer: String,
    /// Every example's length, for a ramp over tokens, a run in tokens or a
    /// mixed batch in tokens.
    pub(crate) token_lengths: Option<std::sync::Arc<[usize]>>,
    /// `--max-tokens-per-batch N --packed-token-budget` over several sources: each
    /// step's examples fill `N` tokens summed, drawn by the mixing weights.
    pub(crate) mixed_token_budget: Option<usize>,
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

/// Every example's length, when tokens are counted (a ramp over tokens, a run
/// length in tokens, a mixed batch in tokens).
fn token_lengths<D: Dataset + ?Sized>(
    dataset: &D,
    schedule: &ScheduleSpec,
    length: RunLength,
    mixed_in_tokens: bool,
) -> Option<std::sync::Arc<[usize]>> {
    let counted = mixed_in_tokens
        || matches!(schedule, ScheduleSpec::TokenRamp(_))
        || matches!(length, RunLength::Tokens(_));
    counted.then(|| (0..dataset.len()).map(|i| dataset.example_len(i)).collect())
}

/// The checkpoint a run resumes, if any, and the ranks its per-device sizes count:
/// those of the run that wrote the checkpoint, so that a run resumed on another
/// number of ranks keeps its global batches (see `checkpoint::resume_point`).
#[derive(Debug, Clone)]
pub(crate) struct ResumePoint {
    pub(crate) dir: Option<PathBuf>,
    pub(crate) units_world: usize,
}

/// The first global batch of a schedule in global units (a ramp, `noise_scale`,
/// `goodput`; `None` for one in per-device units).
fn first_global_batch(schedule: &ScheduleSpec, world_size: usize) -> Result<Option<usize>> {
    Ok(match schedule {
        ScheduleSpec::NoiseScale(noise) => Some(noise.min),
        // Its first shape must fit `max_local`.
        ScheduleSpec::Goodput(spec) => {
            spec.first_shape(world_size)?;
            Some(spec.min)
        }
        _ => schedule.ramp().map(|r| r.global_batch(0)),
    })
}

impl RunSettings {
    /// The settings of a run of `dataset` on `world_size` ranks under the
    /// trainer's `policy`, the flags in `args`, resuming `resume`: the groups'
    /// own checks, their rules, then the checks of their combinations.
    pub(crate) fn new<D: Dataset + ?Sized>(
        policy: &TrainerPolicy,
        dataset: &D,
        args: &TrainingArgs,
        world_size: usize,
        resume: ResumePoint,
    ) -> Result<Self> {
        let num_examples = dataset.len();
        check_ranks(num_examples, world_size)?;
        args.check()?;
        let policy = &effective_policy(policy, args)?;
        let schedule = args.batch.schedule(policy.schedule);
        validate_spec(&schedule)?;
        let first_global = first_global_batch(&schedule, world_size)?;
        let units_world = resume.units_world;
        let limits = BatchLimits::new(policy.min_batch, policy.max_batch)?;
        let initial_per_device = match first_global {
            Some(global) => global.div_ceil(units_world),
            None => limits.apply(0, schedule.initial(args.batch.per_device_train_batch_size))?,
        };
        let batching =
            (args.length_aware).batching(policy, &schedule, initial_per_device, units_world)?;
        let sources = args.data.sources(dataset, &policy.mix)?;
        // A mixed run in tokens sizes every step as it draws it (no epoch plan).
        let (batching, mixed_token_budget) = match (batching, &sources) {
            (Some((LengthBatching::PackedTokens { max_tokens }, _)), Some(_)) => {
                (None, Some(max_tokens))
            }
            (batching, _) => (batching, None),
        };
        let noise_measured = args.step.log_gradient_noise_scale || schedule.follows_noise_scale();
        Resolved {
            policy,
            schedule: &schedule,
            first_global,
            accumulation_flag: args.batch.gradient_accumulation_steps.is_some(),
            token_budget: args.length_aware.max_tokens_per_batch.is_some(),
            length_aware: batching.is_some() || mixed_token_budget.is_some(),
            mixed: sources.is_some(),
            mixed_in_tokens: mixed_token_budget.is_some(),
            noise_measured,
            world_size,
        }
        .check()?;
        let length = args.length.run_length();
        let eval = args.eval.rules(args.logging.logging_steps);
        let mut settings = Self {
            num_examples,
            world_size,
            units_world,
            seed: args.data.seed.unwrap_or(policy.seed),
            drop_last: args.data.dataloader_drop_last.unwrap_or(policy.drop_last),
            shuffle: policy.shuffle,
            schedule,
            limits,
            initial_per_device,
            length,
            grad_accum: policy.grad_accum,
            lr: Self::first_lr(
                args,
                policy,
                num_examples,
                first_global,
                initial_per_device * units_world,
                world_size,
            ),
            lr_reference: args.lr.lr_reference_batch,
            batching,
            memory_margin: args.length_aware.memory_margin,
            device: args.launch.device()?,
            warnings: (args.batch).start_warnings(&policy.schedule, &schedule, initial_per_device),
            optimizer: args.optim.describe(),
            sources,
            builtin_mixer: BuiltinMixer::of(&policy.mix)?,
            mix_weights_given: !args.data.mix_weights.is_empty(),
            prefetch_workers: args.data.dataloader_num_workers,
            release_freed_memory: args.data.release_freed_memory,
            token_lengths: token_lengths(dataset, &schedule, length, mixed_token_budget.is_some()),
            mixed_token_budget,
            step: args.step.rules(policy, noise_measured)?,
            logs: args.logging.rules(),
            saves: args.save.rules(eval.every, resume.dir)?,
            eval,
        };
        settings.set_lr_horizon(args)?;
        Ok(settings)
    }

    /// The learning-rate schedule as it starts: its reference the first global
    /// batch (`first_global`, else `per_device_global` examples in as many
    /// micro-batches as the policy accumulates).
    fn first_lr(
        args: &TrainingArgs,
        policy: &TrainerPolicy,
        num_examples: usize,
        first_global: Option<usize>,
        per_device_global: usize,
        world_size: usize,
    ) -> LrSchedule {
        let micro_batches = match policy.grad_accum {
            GradAccum::Fixed(n) => n,
            // Micro-batches of the initial per-device size that reach the target.
            GradAccum::Target { global } => global
                .div_ceil(args.batch.per_device_train_batch_size * world_size)
                .div_ceil(per_device_global),
        };
        let initial_global = first_global
            .unwrap_or(per_device_global * micro_batches)
            .min(num_examples);
        let examples = args.length.num_train_epochs.max(1) * num_examples;
        let in_tokens = args.length.max_train_tokens.is_some();
        (args.lr).schedule(policy.lr_scaling, examples, in_tokens, initial_global)
    }

    /// The learning-rate horizon: what the run will consume. Exact for
    /// deterministic sizes (a dry run of the planner, so `max_steps` and
    /// `drop_last` count and a linear decay reaches 0 at the end, as in HF); an
    /// estimate, said at the start, for length-aware batches.
    fn set_lr_horizon(&mut self, args: &TrainingArgs) -> Result<()> {
        if !args.lr.needs_horizon() {
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
                if args.lr.warmup_steps == planner.step() {
                    warmup = Some(total);
                }
                planner.finish_step()?;
            }
            total
        } else {
            let first = self.initial_per_device * self.units_world;
            if args.lr.warmup_steps > 0 {
                warmup = Some(args.lr.warmup_steps * first);
                self.warnings.push(format!(
                    "length-aware batches are sized while training: --warmup-steps {} is taken as {} examples (that many steps of the first global batch, {first})",
                    args.lr.warmup_steps,
                    args.lr.warmup_steps * first
                ));
            }
            let epochs = args.length.num_train_epochs.max(1) * self.num_examples;
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
        self.lr.warmup_examples = match (args.lr.warmup_steps, warmup) {
            (0, _) => args.lr.warmup_ratio * total as f64,
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
        self.lr.warmup_examples = if args.lr.warmup_steps > 0 {
            let lengths = self.token_lengths.as_deref().unwrap_or(&[]);
            let mean = lengths.iter().sum::<usize>() as f64 / lengths.len().max(1) as f64;
            let first = (self.initial_per_device * self.units_world) as f64;
            (args.lr.warmup_steps as f64 * first * mean).min(total)
        } else {
            args.lr.warmup_ratio * total
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
        if let Some(position) = self.closing_lr_position(planner) {
            return position;
        }
        if self.lr.in_tokens {
            let before = planner.tokens_seen() - planner.step_tokens(batches);
            usize::try_from(before).unwrap_or(usize::MAX)
        } else {
            planner.sampler().examples_seen() - batches.global_size()
        }
    }

    /// In a closing round of n steps after the planned run's S, the k-th step
    /// (from 0) trains at the rate of the planned run's (S − n + k)-th: where the
    /// schedule stood n − k steps before its horizon, at the planned run's mean
    /// step. `None` for a planned step, or a schedule without a horizon (its
    /// rate then continues from where it stands).
    fn closing_lr_position(&self, planner: &StepPlanner<ScheduleSpec>) -> Option<usize> {
        let (k, n) = planner.closing_position()?;
        let planned = planner.closing()?.from_step.max(1) as f64;
        let horizon = self.lr.total_examples;
        let back = ((n - k) as f64 / planned).min(1.0);
        (horizon.is_finite() && horizon > 0.0).then_some((horizon * (1.0 - back)) as usize)
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

    /// The optimizer steps the run is expected to take: `--max-steps`, else its
    /// length in tokens, else its learning-rate horizon in examples, over the
    /// first global batch (in tokens: a mixed run's token budget, else the first
    /// global batch at the mean example length). An estimate where the batch adapts; `None` when
    /// there is no horizon to divide.
    pub(crate) fn expected_steps(&self) -> Option<usize> {
        if let RunLength::Steps(steps) = self.length {
            return Some(steps);
        }
        let mut per_step = (self.initial_per_device * self.units_world) as f64;
        if let (true, Some(budget)) = (self.lr.in_tokens, self.mixed_token_budget) {
            per_step = budget as f64;
        } else if self.lr.in_tokens {
            let lengths = self.token_lengths.as_deref()?;
            per_step *= lengths.iter().sum::<usize>() as f64 / lengths.len().max(1) as f64;
        }
        // A run in tokens is its tokens whatever the schedule (a constant rate
        // has no horizon in tokens: its `total_examples` counts examples).
        let total = match self.length {
            RunLength::Tokens(tokens) => tokens as f64,
            _ => self.lr.total_examples,
        };
        (total.is_finite() && total > 0.0 && per_step > 0.0)
            .then(|| (total / per_step).ceil() as usize)
    }

    /// The decisions of this run that read the wall clock, each as a sentence:
    /// with any, two runs of the same seed and settings can differ. Empty: the
    /// run is a function of its data, seed and settings.
    pub(crate) fn timed_decisions(&self) -> Vec<String> {
        let mut timed = Vec::new();
        if let ScheduleSpec::Goodput(spec) = &self.schedule {
            if spec.step_time.is_none() {
                timed
                    .push("goodput: the batch and micro-batches follow measured step times".into());
            }
        }
        if self.step.noise_scale_beta.is_some() && self.step.noise_every.reads_the_clock() {
            timed.push(
                "the noise scale's cadence (`every = auto`): measured step times choose which steps measure".into(),
            );
        }
        timed
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
        if let Some(max_tokens) = self.mixed_token_budget {
            planner = planner.with_mixed_token_budget(max_tokens);
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
        let bar = if args.logging.quiet || args.logging.disable_tqdm {
            None
        } else {
            total
        };
        let logger = Logger::new(
            args.logging.log_jsonl.as_deref(),
            bar,
            !args.logging.quiet,
            args.logging.log_indices,
            self.saves.resume.is_some(),
        )?
        .with_outputs(args)?;
        for warning in &self.warnings {
            logger.event(&format!("warning: {warning}"));
        }
        Ok(logger)
    }
}
