//! `schedule = goodput(..)` as part of the noise-scale controller: after every
//! step it folds the step's time into the step-time model and sets the global
//! batch and micro-batches of the highest goodput (`crate::adapt::goodput`).
//!
//! Times travel one step late: a rank knows its step's duration only after the
//! update, so it sends it in the next step's all-reduce, and every rank fits the
//! same mean. With `step_time = f` the function's value for the step's shape
//! replaces the measurement, and the batches are reproducible.

use crate::adapt::goodput::{
    decide_within, GoodputDecision, GoodputLog, GoodputReason, GoodputSpec, GoodputState,
    StepShape, StepTime,
};
use crate::error::{Error, Result, TrainingError};
use crate::report::record::StepLog;

use super::controller::{Steer, StepReport};

/// The goodput policy's state on one rank (the same on every rank).
pub(crate) struct GoodputControl {
    spec: GoodputSpec,
    world: usize,
    /// Within [`crate::adapt::goodput::noise_cap`]: the √ rate rule (not under
    /// AdamScale).
    capped: bool,
    state: GoodputState,
    /// Seconds of the step the model last learned from, for the log.
    last_seconds: Option<f64>,
    /// Whether this process has had its first step's time, which is left out:
    /// it pays one-time costs (CUDA modules and cuBLAS handles loaded, the
    /// allocator grown; 4x a later step on a GPU) that would read as a cost of
    /// its batch size.
    first_time_seen: bool,
}

impl GoodputControl {
    /// Goodput over `world` ranks; `adam_scale` under `lr_scaling = adamscale`.
    pub(crate) fn new(spec: GoodputSpec, world: usize, adam_scale: bool) -> Self {
        Self {
            spec,
            world,
            capped: !adam_scale,
            state: GoodputState::default(),
            last_seconds: None,
            first_time_seen: false,
        }
    }

    /// After a step that ran: learn the previous step's time (the mean over
    /// ranks, when some rank measured one), then choose the next shape from the
    /// noise scale `phi`.
    pub(crate) fn adapt(
        &mut self,
        report: &StepReport<'_>,
        (phi, previous_step_seconds): (Option<f64>, Option<f64>),
        steer: &mut Steer<'_>,
    ) -> Result<()> {
        let step_shape = StepShape {
            global: report.batches.global_size(),
            micro_batches: report.batches.micro.len(),
            world: self.world,
        };
        self.learn(step_shape, previous_step_seconds)?;
        let current = match self.state.decision {
            Some(d) => d.shape,
            None => self.spec.first_shape(self.world)?,
        };
        let time = match self.spec.step_time {
            Some(f) => StepTime::Given(f),
            None => StepTime::Measured(&self.state.times),
        };
        let decision = decide_within(&self.spec, phi, current, &time, self.capped)?;
        steer.planner.set_global_batch(decision.shape.global);
        steer
            .planner
            .set_micro_batches(decision.shape.micro_batches);
        self.state.decision = Some(decision);
        Ok(())
    }

    /// This step's time under `step_time = f` (`None` where times are measured).
    pub(crate) fn given_seconds(&self, report: &StepReport<'_>) -> Option<f64> {
        let f = self.spec.step_time?;
        Some(f(StepShape {
            global: report.batches.global_size(),
            micro_batches: report.batches.micro.len(),
            world: self.world,
        }))
    }

    /// Folds in the time of the step before this one (measured runs), or this
    /// step's given time.
    fn learn(&mut self, step_shape: StepShape, measured: Option<f64>) -> Result<()> {
        if let Some(f) = self.spec.step_time {
            self.last_seconds = Some(f(step_shape));
            return Ok(());
        }
        let timed = self.state.timed_shape.replace(step_shape);
        let (Some(shape), Some(seconds)) = (timed, measured) else {
            return Ok(());
        };
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(Error::Training(TrainingError::GoodputStepTime {
                detail: format!(
                    "a step of {} examples in {} micro-batch(es) measured {seconds} s",
                    shape.global, shape.micro_batches
                ),
            }));
        }
        self.last_seconds = Some(seconds);
        if std::mem::replace(&mut self.first_time_seen, true) {
            self.state.times.observe(shape, seconds);
        }
        Ok(())
    }

    pub(crate) fn record(&self, entry: &mut StepLog) {
        let Some(GoodputDecision {
            shape,
            reason,
            goodput,
            efficiency,
        }) = self.state.decision
        else {
            return;
        };
        entry.goodput = Some(GoodputLog {
            next_global_batch: shape.global,
            next_micro_batches: shape.micro_batches,
            reason,
            goodput,
            efficiency,
            step_seconds: self.last_seconds,
            fit: self
                .state
                .times
                .fit()
                .filter(|_| self.spec.step_time.is_none()),
        });
    }

    pub(crate) fn state(&self) -> GoodputState {
        self.state.clone()
    }

    /// Continues from a checkpoint: the same observations and decision. The
    /// step timed last before the save has its time in a step that never ran,
    /// so it is forgotten.
    pub(crate) fn restore(&mut self, saved: &GoodputState) {
        self.state = GoodputState {
            timed_shape: None,
            ..saved.clone()
        };
        if let Some(decision) = &mut self.state.decision {
            // On another number of ranks the same global batch is split anew.
            if decision.shape.world != self.world {
                if let Some(shape) = self.spec.shape_for(decision.shape.global, self.world) {
                    decision.shape = shape;
                    decision.reason = GoodputReason::Kept;
                }
            }
        }
    }
}
