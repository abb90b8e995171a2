//! The controller interface: what a controller reads after a step
//! ([`StepReport`]), what it may change ([`Steer`]), and what it does
//! ([`Controller`]): adapt, write its log fields, save and restore its state.

use crate::adapt::mixer::Mixer;
use crate::adapt::schedule::ScheduleSpec;
use crate::data::planner::{StepBatches, StepPlanner};
use crate::dist::communicator::Communicator;
use crate::error::Result;
use crate::memory::memory_model::{BatchFeatures, MemoryModel};
use crate::report::logging::Logger;
use crate::report::record::{EvalLog, StepLog};
use crate::train::control::states::ControllerStates;
use crate::train::eval::HeldOut;
use crate::train::probe::StepProbe;
use crate::train::step::{StepOutcome, TrainedStep};
use crate::user::callback::Callback;
use crate::user::trainer::AdaptiveTrainer;

/// What every rank agrees on after a step: its number, its batches, how it ended,
/// and (memory-aware runs) this rank's measured chunk.
pub(crate) struct StepReport<'a> {
    pub(crate) step: usize,
    pub(crate) batches: &'a StepBatches,
    pub(crate) outcome: &'a StepOutcome,
    /// The features and peak bytes of this rank's (first) chunk of the step.
    pub(crate) memory: Option<(BatchFeatures, u64)>,
    /// The latest evaluation, for mixers that follow it.
    pub(crate) last_eval: Option<&'a EvalLog>,
    /// The held-out losses a controller asked for after this step
    /// ([`Controller::wants_held_out`]).
    pub(crate) held_out: Option<&'a HeldOut>,
}

impl StepReport<'_> {
    /// Whether the step ran (possibly skipping its update under `--fp16`), as
    /// opposed to running out of memory on some rank.
    pub(crate) fn trained(&self) -> bool {
        self.outcome.trained().is_some()
    }

    /// The step, when it ran.
    pub(crate) fn trained_step(&self) -> Option<&TrainedStep> {
        self.outcome.trained()
    }

    /// A probe's reading of the step, when it ran and the probe gave one.
    pub(crate) fn reading<R: std::any::Any>(&self) -> Option<&R> {
        self.outcome.trained()?.readings.get::<R>()
    }
}

/// The trainer's own controllers (`#[mixer]`, `#[regressor]`), reachable without
/// the trainer's generic types.
pub(crate) trait UserControllers {
    fn mixer(&mut self) -> Option<&mut dyn Mixer>;
    fn regressor(&mut self) -> Option<&mut dyn MemoryModel>;
    fn callback(&mut self) -> Option<&mut dyn Callback>;
}

impl<T: AdaptiveTrainer> UserControllers for T {
    fn mixer(&mut self) -> Option<&mut dyn Mixer> {
        AdaptiveTrainer::mixer(self)
    }
    fn regressor(&mut self) -> Option<&mut dyn MemoryModel> {
        AdaptiveTrainer::regressor(self)
    }
    fn callback(&mut self) -> Option<&mut dyn Callback> {
        AdaptiveTrainer::callback(self)
    }
}

/// What a controller may change: the planner (the next step's sizes, weights and
/// position) and the trainer's own controllers; and where it says what it did.
pub(crate) struct Steer<'a> {
    pub(crate) planner: &'a mut StepPlanner<ScheduleSpec>,
    pub(crate) trainer: &'a mut dyn UserControllers,
    pub(crate) logger: Option<&'a Logger>,
}

/// What a controller saves into: the checkpoint's entries, with the ranks'
/// communicator (a part may gather from every rank) and the trainer's own parts.
pub(crate) struct Save<'a> {
    pub(crate) comm: &'a dyn Communicator,
    pub(crate) trainer: &'a mut dyn UserControllers,
    pub(crate) into: &'a mut ControllerStates,
}

/// What a controller restores from: the checkpoint's entries, on `rank`, with
/// the trainer's own parts (its mixer, its callback).
pub(crate) struct Restore<'a> {
    pub(crate) from: &'a ControllerStates,
    pub(crate) rank: usize,
    pub(crate) trainer: &'a mut dyn UserControllers,
}

/// One thing that adapts the run after a step. Every method runs on every rank
/// with the same inputs, so every rank adapts alike.
pub(crate) trait Controller {
    /// Before the first step of a fresh run (a resumed run restores instead).
    fn begin(&mut self, _steer: &mut Steer<'_>) -> Result<()> {
        Ok(())
    }
    /// What it measures inside the next step (its scalars in the step's
    /// all-reduce, read back in [`StepReport::reading`]).
    fn probe(&self) -> Option<Box<dyn StepProbe + '_>> {
        None
    }
    /// The wall-clock seconds of the step that just ran (0 after an OOM). A
    /// controller that keeps them makes decisions that depend on the machine's
    /// load, and says so.
    fn step_time(&mut self, _seconds: f64) {}
    /// Whether it wants the held-out losses after step `step` (the engine
    /// evaluates them before [`Controller::adapt`], which finds them in
    /// [`StepReport::held_out`]).
    fn wants_held_out(&mut self, _step: usize, _trainer: &mut dyn UserControllers) -> bool {
        false
    }
    /// After a step, in the order of `Controllers::in_order`.
    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()>;
    /// Its fields of a logged step's record.
    fn record(&mut self, _entry: &mut StepLog) {}
    /// Its part of a checkpoint. Every rank calls it at the same step (a part may
    /// gather from every rank); rank 0 writes the result.
    fn save(&mut self, _at: &mut Save<'_>) -> Result<()> {
        Ok(())
    }
    /// Continues from its entry of a checkpoint; an entry it cannot read is an
    /// error.
    fn restore(&mut self, _at: &mut Restore<'_>) -> Result<()> {
        Ok(())
    }
}
