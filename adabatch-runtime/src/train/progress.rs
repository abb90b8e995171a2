//! A rank's running account of the loop: losses and throughput since the last
//! logged step, OOM events, and the run's summary at the end.

use std::time::Instant;

use crate::data::planner::{PlannerState, StepBatches, StepPlanner};
use crate::data::sampler::GlobalBatchSampler;
use crate::report::record::{EvalLog, StepLog};
use crate::report::summary::TrainSummary;
use crate::train::prefetch::PrefetchStats;
use crate::train::settings::RunSettings;

/// What the loop gathered besides its account: the evaluations, prefetch counts,
/// f16's skipped steps, the OOM events and the best checkpoint (its directory and
/// metric).
pub(crate) struct RunOutcome {
    pub(crate) evaluations: Vec<EvalLog>,
    pub(crate) prefetch: PrefetchStats,
    pub(crate) skipped_steps: usize,
    pub(crate) noise_scale_held_steps: usize,
    pub(crate) oom_events: usize,
    pub(crate) best: Option<(std::path::PathBuf, f64)>,
    pub(crate) held_out: Option<crate::report::record::HeldOutCost>,
    pub(crate) source_gradients: Option<crate::report::record::SourceGradientCost>,
    /// The mixer's closing ended short of its condition.
    pub(crate) closing_capped: bool,
}

/// A rank's account of the steps it trained: losses and examples since the last
/// logged step, every step's loss, and the clock.
pub(crate) struct Progress {
    losses_since_log: Vec<f64>,
    examples_since_log: usize,
    last_log: Instant,
    started: Instant,
    /// Evaluations and checkpoints, left out of the training time.
    paused: std::time::Duration,
    step_losses: Vec<f64>,
    /// The last trained step's global batch (0 before one).
    last_global: usize,
}

impl Progress {
    /// From now.
    pub(crate) fn new() -> Self {
        let started = Instant::now();
        Self {
            losses_since_log: Vec::new(),
            examples_since_log: 0,
            last_log: started,
            started,
            paused: std::time::Duration::ZERO,
            step_losses: Vec::new(),
            last_global: 0,
        }
    }

    /// A step trained: its loss and global batch.
    pub(crate) fn trained(&mut self, loss: f64, examples: usize) {
        self.step_losses.push(loss);
        self.losses_since_log.push(loss);
        self.examples_since_log += examples;
        self.last_global = examples;
    }

    /// Leaves `spent` (an evaluation, a save) out of the throughput of the next
    /// log.
    pub(crate) fn pause(&mut self, spent: std::time::Duration) {
        self.last_log += spent;
        self.paused += spent;
    }

    /// Seconds spent training since the start, pauses left out.
    pub(crate) fn train_seconds(&self) -> f64 {
        self.started
            .elapsed()
            .saturating_sub(self.paused)
            .as_secs_f64()
    }

    /// The losses of the steps since the last log (a checkpoint keeps them, so
    /// that the first log after a resume averages the same steps).
    pub(crate) fn unlogged_losses(&self) -> &[f64] {
        &self.losses_since_log
    }

    /// From now; a resumed run continues its checkpoint's logging window.
    pub(crate) fn resumed(unlogged_losses: Option<&[f64]>) -> Self {
        Self {
            losses_since_log: unlogged_losses.unwrap_or_default().to_vec(),
            ..Self::new()
        }
    }

    /// The per-device size the run ended at. The planner counts per-device sizes
    /// on the checkpoint's ranks; the summary on this run's (a 1-rank checkpoint
    /// of 32 resumed on 2: 16). Length-aware batches (memory, token budgets) are
    /// sized per step: their last step's global batch over the ranks.
    fn final_per_device<S: crate::adapt::schedule::Schedule>(
        &self,
        planner: &StepPlanner<S>,
        settings: &RunSettings,
    ) -> usize {
        let world = settings.world_size.max(1);
        if settings.batching.is_some() && self.last_global > 0 {
            return self.last_global.div_ceil(world);
        }
        (planner.per_device() * settings.units_world).div_ceil(world)
    }

    /// The log record of a logged step: the loss is the mean since the last
    /// logged step, the throughput over the same span.
    pub(crate) fn step_log(
        &mut self,
        sampler: &GlobalBatchSampler,
        step: usize,
        batches: &StepBatches,
        grad_norm: f64,
        lr: f64,
    ) -> StepLog {
        let elapsed = self.last_log.elapsed().as_secs_f64();
        let losses = std::mem::take(&mut self.losses_since_log);
        let entry = StepLog {
            loss: losses.iter().sum::<f64>() / losses.len().max(1) as f64,
            grad_norm,
            learning_rate: lr,
            examples_per_s: self.examples_since_log as f64 / elapsed.max(f64::MIN_POSITIVE),
            ..StepLog::planned(step, sampler, batches)
        };
        self.examples_since_log = 0;
        self.last_log = Instant::now();
        entry
    }

    /// What the run reports. Throughput and loss count this run only: a resumed
    /// run starts where `resumed` stood.
    pub(crate) fn summary<S: crate::adapt::schedule::Schedule>(
        self,
        planner: &crate::data::planner::StepPlanner<S>,
        settings: &RunSettings,
        resumed: Option<&PlannerState>,
        outcome: RunOutcome,
    ) -> TrainSummary {
        let RunOutcome {
            evaluations,
            prefetch,
            skipped_steps,
            noise_scale_held_steps,
            oom_events,
            best,
            held_out,
            source_gradients,
            closing_capped,
        } = outcome;
        let runtime = self.started.elapsed().as_secs_f64();
        let sampler = planner.sampler();
        let trained_here = sampler.examples_seen() - resumed.map_or(0, |s| s.examples_seen);
        let train_loss = if self.step_losses.is_empty() {
            f64::NAN
        } else {
            self.step_losses.iter().sum::<f64>() / self.step_losses.len() as f64
        };
        let final_per_device = self.final_per_device(planner, settings);
        TrainSummary {
            global_step: planner.step(),
            epoch: sampler.epoch(),
            examples_seen: sampler.examples_seen(),
            train_loss,
            step_losses: self.step_losses,
            oom_events,
            final_per_device_batch_size: final_per_device,
            world_size: settings.world_size,
            train_runtime: runtime,
            train_samples_per_second: trained_here as f64 / runtime.max(f64::MIN_POSITIVE),
            resumed_from_step: resumed.map(|s| s.global_step),
            evaluations,
            prefetched_steps: prefetch.used,
            prefetch_discarded: prefetch.discarded,
            skipped_steps,
            noise_scale_held_steps,
            best_model_checkpoint: best.as_ref().map(|(dir, _)| dir.clone()),
            best_metric: best.map(|(_, metric)| metric),
            timed_decisions: settings.timed_decisions(),
            held_out,
            source_gradients,
            closing: closing_summary(planner, closing_capped),
        }
    }
}

/// The closing's steps and tokens from the planner, and whether it was capped.
fn closing_summary<S: crate::adapt::schedule::Schedule>(
    planner: &crate::data::planner::StepPlanner<S>,
    capped: bool,
) -> Option<crate::report::summary::ClosingSummary> {
    let closing = planner.closing();
    (closing.is_some() || capped).then(|| crate::report::summary::ClosingSummary {
        steps: closing.map_or(0, |c| c.steps()),
        tokens: closing.map_or(0, |c| planner.tokens_seen() - c.from_tokens),
        capped,
    })
}
