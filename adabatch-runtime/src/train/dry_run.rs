//! Dry runs (`--dry-run`): the whole run planned without training.
//!
//! A dry run drives the same [`StepPlanner`] the engine drives, built from the
//! same `RunSettings`, and asks the same learning-rate schedule for each step,
//! so its steps are the steps the real run takes: the same indices on every rank,
//! sizes, coverage, epoch and learning rate. What it cannot know is left out: the
//! loss (`null` in the JSONL log), gradient norms, throughput, and out-of-memory
//! events (injected or real).
//!
//! Memory-aware batches (`schedule = memory(..)`) are planned with the memory model
//! as it stands before training: the `#[regressor]` as the factory built it, or
//! the built-in online model before any measurement. The real run refits the
//! model from measured peaks, so from its second epoch on its batches may differ;
//! the dry run says so. Token-budget batches (`--max-tokens-per-batch`) do not
//! depend on a model and are planned exactly.
//!
//! The entry points [`Run::train`](crate::Run::train),
//! [`Run::launch`](crate::Run::launch) and [`Run::group`](crate::Run::group)
//! (and the methods the attribute generates, which call them) do a dry run instead of training when
//! `args.launch.dry_run` is set: they print the plan (unless `--quiet`), write the
//! planned steps to `--log-jsonl`, TensorBoard and `--plot` as a run would, and
//! return the plan's [`TrainSummary`] (no losses; [`TrainSummary::is_dry_run`]).
//! `Run::launch` calls the factory once, for rank 0, and returns that untrained trainer.
//! [`dry_run`] returns the whole plan as a value.

use std::fmt;

use candle_core::Device;

use crate::adapt::lr::LrScaling;
use crate::adapt::schedule::ScheduleSpec;
use crate::config::args::TrainingArgs;
use crate::data::length::LengthBatching;
use crate::data::planner::{StepBatches, StepPlanner};
use crate::error::Result;
use crate::memory::memory_model::{MemoryModel, OnlineMemoryModel};
use crate::report::logging::Logger;
use crate::report::record::StepLog;
use crate::report::summary::{TrainSummary, Trained};
use crate::train::checkpoint::resume_point;
use crate::train::settings::RunSettings;
use crate::user::data::Dataset;
use crate::user::trainer::{AdaptiveTrainer, RankContext};

/// A run planned without training: every step as the real run will log it, with
/// NaN where only training can tell (`loss`, `grad_norm`, `examples_per_s`).
#[derive(Debug, Clone, PartialEq)]
pub struct DryRun {
    /// Every planned step, in order (all of them, whatever `--logging-steps`).
    pub steps: Vec<StepLog>,
    /// The per-device size the schedule had set for each step.
    pub per_device: Vec<usize>,
    /// Examples used in each epoch (fewer than N where `drop_last` cuts the tail).
    pub examples_per_epoch: Vec<usize>,
    /// Training examples N.
    pub num_examples: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// The per-device size after the last step.
    pub final_per_device: usize,
    /// How the batches were sized, when the plan rests on a memory model (the
    /// model as it stands before training) or on token budgets.
    pub batching: Option<String>,
    /// What the plan could not take into account.
    pub notes: Vec<String>,
    /// The run's decisions that read the wall clock (empty: reproducible).
    pub timed_decisions: Vec<String>,
    /// The optimizer the flags name (`--optim`, `--weight-decay`, `--adam-*`).
    pub optimizer: String,
}

impl DryRun {
    /// The plan's line on the batch size: constant, or its first changes.
    fn batch_changes(&self) -> String {
        let changes = self.size_changes();
        let unit = if self.batching.is_some() {
            "global"
        } else {
            "per device"
        };
        if changes.is_empty() {
            return format!("batch size ({unit}): constant");
        }
        const SHOWN: usize = 12;
        let listed: Vec<String> = changes
            .iter()
            .take(SHOWN)
            .map(|(step, from, to)| format!("step {step}: {from} -> {to}"))
            .collect();
        let more = match changes.len().saturating_sub(SHOWN) {
            0 => String::new(),
            more => format!(", and {more} more"),
        };
        format!("batch size changes ({unit}): {}{more}", listed.join(", "))
    }

    /// Examples the run consumes.
    pub fn examples(&self) -> usize {
        self.steps.iter().map(|s| s.global_batch).sum()
    }

    /// Steps where the batch changes size as planned by the schedule (or the
    /// memory model): `(step, size before, size from this step on)`, per device
    /// for schedules, global for length-aware batches. Epoch tails (a last, smaller
    /// batch) are not changes of the schedule and are not listed.
    pub fn size_changes(&self) -> Vec<(usize, usize, usize)> {
        let sizes: Vec<usize> = if self.batching.is_some() {
            self.steps.iter().map(|s| s.global_batch).collect()
        } else {
            self.per_device.clone()
        };
        sizes
            .windows(2)
            .zip(&self.steps[1.min(self.steps.len())..])
            .filter(|(w, _)| w[0] != w[1])
            .map(|(w, s)| (s.step, w[0], w[1]))
            .collect()
    }

    /// The summary a run returns, without losses or timings.
    pub fn summary(&self) -> TrainSummary {
        let last = self.steps.last();
        TrainSummary {
            global_step: self.steps.len(),
            epoch: last.map_or(0.0, |s| s.epoch),
            examples_seen: self.examples(),
            train_loss: f64::NAN,
            step_losses: Vec::new(),
            oom_events: 0,
            final_per_device_batch_size: self.final_per_device,
            world_size: self.world_size,
            train_runtime: 0.0,
            train_samples_per_second: 0.0,
            resumed_from_step: None,
            evaluations: Vec::new(),
            prefetched_steps: 0,
            prefetch_discarded: 0,
            skipped_steps: 0,
            noise_scale_held_steps: 0,
            held_out: None,
            source_gradients: None,
            closing: None,
            best_model_checkpoint: None,
            best_metric: None,
            timed_decisions: self.timed_decisions.clone(),
        }
    }
}

impl fmt::Display for DryRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (Some(first), Some(last)) = (self.steps.first(), self.steps.last()) else {
            return writeln!(f, "dry run: the run would take no step");
        };
        writeln!(
            f,
            "dry run: {} steps on {} rank(s), {} examples of N = {} (epoch {:.2})",
            self.steps.len(),
            self.world_size,
            self.examples(),
            self.num_examples,
            last.epoch
        )?;
        let per_epoch = &self.examples_per_epoch;
        if per_epoch.iter().all(|&e| e == per_epoch[0]) {
            writeln!(
                f,
                "  examples per epoch: {} x {} epoch(s)",
                per_epoch[0],
                per_epoch.len()
            )?;
        } else {
            writeln!(f, "  examples per epoch: {per_epoch:?}")?;
        }
        let min = self.steps.iter().map(|s| s.global_batch).min();
        let max = self.steps.iter().map(|s| s.global_batch).max();
        writeln!(
            f,
            "  global batch: {} to {} (first {}, last {})",
            min.unwrap_or(0),
            max.unwrap_or(0),
            first.global_batch,
            last.global_batch
        )?;
        writeln!(
            f,
            "  learning rate: {:.3e} at step 1, {:.3e} at step {}",
            first.learning_rate, last.learning_rate, last.step
        )?;
        writeln!(f, "  {}", self.batch_changes())?;
        if let Some(batching) = &self.batching {
            writeln!(f, "  {batching}")?;
        }
        writeln!(f, "  optimizer (as the flags name it): {}", self.optimizer)?;
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        if self.timed_decisions.is_empty() {
            writeln!(f, "  reproducible: no decision reads the clock")?;
        }
        for timed in &self.timed_decisions {
            writeln!(f, "  reads the clock (not reproducible): {timed}")?;
        }
        Ok(())
    }
}

/// Plans the run `args` describes for trainer type `T` on `dataset`, on
/// `args.launch.nproc_per_node` ranks, without training. Memory-aware batches use the
/// built-in online model before any measurement; to plan with a `#[regressor]`,
/// use `launch` or `train` with `args.launch.dry_run`, which plan with the trainer's own.
pub fn dry_run<T, D>(dataset: &D, args: &TrainingArgs) -> Result<DryRun>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
{
    let resume = resume_point(args, args.launch.nproc_per_node)?;
    let settings = RunSettings::new(
        &T::POLICY,
        dataset,
        args,
        args.launch.nproc_per_node,
        resume,
    )?;
    plan(&settings, dataset, None)
}

/// The plan of a run with checked `settings`; `regressor` is the trainer's
/// `#[regressor]`, if it has one.
pub(crate) fn plan<D: Dataset + ?Sized>(
    settings: &RunSettings,
    dataset: &D,
    mut regressor: Option<&mut dyn MemoryModel>,
) -> Result<DryRun> {
    // The planner exactly as the engine builds it.
    let mut planner = settings.step_planner(settings.seed, settings.shuffle)?;
    let length_index = settings.length_index(dataset);
    // Before any measurement every rank's online model is this one, so the most
    // conservative of them is too.
    let prior = OnlineMemoryModel::new(settings.memory_margin);
    let has_regressor = regressor.is_some();
    let mut steps = Vec::new();
    let mut per_device = Vec::new();
    let mut examples_per_epoch: Vec<usize> = Vec::new();
    loop {
        let size_now = planner.per_device();
        let next = planner.next_step_with(|epoch| {
            let (Some((batching, options)), Some(index)) = (settings.batching, &length_index)
            else {
                return Ok(None);
            };
            let model: &dyn MemoryModel = match regressor.as_deref_mut() {
                Some(user) => user,
                None => &prior,
            };
            Ok(Some(index.plan_epoch(
                batching,
                &options,
                model,
                settings.seed,
                epoch,
            )))
        })?;
        let Some(batches) = next else { break };
        let epoch_index = planner.sampler().epoch_index();
        if examples_per_epoch.len() <= epoch_index {
            examples_per_epoch.resize(epoch_index + 1, 0);
        }
        examples_per_epoch[epoch_index] += batches.global_size();
        steps.push(planned_step(&planner, &batches, settings));
        per_device.push(size_now);
        planner.finish_step()?;
    }
    let batching = match (settings.batching, settings.mixed_token_budget) {
        (Some((batching, _)), _) => Some(describe_batching(batching, has_regressor)),
        (None, Some(max_tokens)) => Some(format!(
            "mixed batches of at most {max_tokens} tokens summed, each source's documents drawn by the mixing weights"
        )),
        (None, None) => None,
    };
    // Length-aware batches are sized per step: the last step's, as a run says.
    let sized_per_step = settings.batching.is_some() || settings.mixed_token_budget.is_some();
    let final_per_device = match (sized_per_step, steps.last()) {
        (true, Some(last)) => last.global_batch.div_ceil(settings.world_size.max(1)),
        _ => planner.per_device(),
    };
    Ok(DryRun {
        steps,
        per_device,
        examples_per_epoch,
        num_examples: settings.num_examples,
        world_size: settings.world_size,
        final_per_device,
        batching,
        notes: plan_notes(settings),
        timed_decisions: settings.timed_decisions(),
        optimizer: settings.optimizer.clone(),
    })
}

/// A planned step as the run would log it, without what only training tells
/// (loss, gradient norm, throughput).
fn planned_step(
    planner: &StepPlanner<ScheduleSpec>,
    batches: &StepBatches,
    settings: &RunSettings,
) -> StepLog {
    let sampler = planner.sampler();
    let consumed_before = settings.lr_position(planner, batches);
    StepLog {
        learning_rate: settings.lr.at(consumed_before, batches.global_size()),
        predicted_memory: sampler.last_predicted(),
        ..StepLog::planned(planner.step(), sampler, batches)
    }
}

/// How a length-aware plan was sized, and how far the real run may differ.
fn describe_batching(batching: LengthBatching, has_regressor: bool) -> String {
    match batching {
        LengthBatching::Memory { .. } => format!(
            "memory-aware batches planned with the prior memory model ({}): the real run refits it from measured peaks, so batches from its second epoch on may differ",
            if has_regressor {
                "the #[regressor] as built, before any observation"
            } else {
                "the built-in online model before any measurement"
            }
        ),
        LengthBatching::TokenBudget { max_tokens } => {
            format!("token-budget batches of at most {max_tokens} padded tokens, sorted by length")
        }
        LengthBatching::PackedTokens { max_tokens, .. } => {
            format!("packed token-budget batches of at most {max_tokens} tokens summed, in a random order")
        }
    }
}

/// What the plan does not simulate.
fn plan_notes(settings: &RunSettings) -> Vec<String> {
    let mut notes = Vec::new();
    if settings.step.faults.steps().next().is_some() {
        notes.push("injected out-of-memory faults are not simulated".into());
    }
    if settings.saves.resume.is_some() {
        notes.push("planned from the start: --resume-from-checkpoint is not applied".into());
    }
    if matches!(settings.schedule, ScheduleSpec::Custom(_)) {
        notes.push("a custom schedule is assumed to depend only on (step, size)".into());
    }
    if settings.lr.scaling == LrScaling::AdamScale {
        notes.push(
            "lr_scaling = adamscale follows the measured noise scale: the rates are planned with the sqrt rule".into(),
        );
    }
    notes
}

/// Prints the plan (unless `--quiet`) and writes the steps a run logs (every
/// `--logging-steps`, and the last of `--max-steps`) to every output a run writes
/// to (`--log-jsonl`, TensorBoard, `--plot`).
pub(crate) fn report(plan: &DryRun, args: &TrainingArgs) -> Result<()> {
    if !args.logging.quiet {
        print!("{plan}");
    }
    let mut logger = Logger::new(args.logging.log_jsonl.as_deref(), None, false, false, false)?
        .with_outputs(args)?;
    for entry in &plan.steps {
        if entry.step % args.logging.logging_steps.max(1) == 0
            || args.length.max_steps == Some(entry.step)
        {
            logger.log(entry)?;
        }
    }
    logger.write_plot()?;
    Ok(())
}

/// `train` with `--dry-run`: plans with the trainer's `#[regressor]` if it has one.
pub(crate) fn dry_run_trainer<T, D>(
    trainer: &mut T,
    dataset: &D,
    args: &TrainingArgs,
    settings: &RunSettings,
) -> Result<TrainSummary>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
{
    let plan = plan(settings, dataset, trainer.regressor())?;
    report(&plan, args)?;
    Ok(plan.summary())
}

/// `launch` with `--dry-run`: builds rank `rank`'s trainer (for its `#[regressor]`,
/// and to return it) and plans; only rank 0 reports.
pub(crate) fn dry_run_launch<T, D, F>(
    dataset: &D,
    args: &TrainingArgs,
    settings: &RunSettings,
    (rank, device): (usize, Device),
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    F: Fn(&RankContext) -> Result<T>,
{
    let mut trainer = factory(&RankContext::new(
        rank,
        settings.world_size,
        device,
        settings.seed,
    ))?;
    let plan = plan(settings, dataset, trainer.regressor())?;
    if rank == 0 {
        report(&plan, args)?;
    }
    Ok(Trained {
        trainer,
        summary: plan.summary(),
    })
}
