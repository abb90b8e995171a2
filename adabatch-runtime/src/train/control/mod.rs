//! The controllers: everything that adapts the run after a step, behind one
//! interface ([`Controller`]).
//!
//! After step t's all-reduce every rank holds the same [`StepReport`], and the
//! controllers act on it in one fixed order, written once in
//! [`Controllers::in_order`]:
//!
//! 1. OOM recovery ([`oom_control`]): the cap a failure imposes (halve, split, skip), or
//!    the end of a retry;
//! 2. the loss scaler ([`loss_scale`], `--fp16`): skip or rescale;
//! 3. the gradient noise scale ([`noise_scale_control`]): the estimate, and under
//!    `schedule = noise_scale(..)` the next global batch;
//! 4. the mixer ([`mixing`]): the sources' weights of step t+1;
//! 5. the schedule or ramp ([`schedule_control`]): the next size, clamped by
//!    `min_batch` / `max_batch`;
//! 6. the memory model ([`memory`]): this step's measured peak, from which the
//!    next length-aware epoch is planned.
//!
//! Each reads only what every rank agrees on, may change only the planner and the
//! trainer's own `#[mixer]` / `#[regressor]` (through [`Steer`]), writes its own
//! fields of a logged step's record, and saves and restores its own part of a
//! checkpoint ([`ControllerStates`]): a checkpoint is the planner's state plus the
//! controllers', with no field kept twice.

pub(crate) mod controller;
pub(crate) mod goodput_control;
pub(crate) mod loss_scale;
pub(crate) mod memory;
pub(crate) mod mixing;
pub(crate) mod noise_probe;
pub(crate) mod noise_scale_control;
pub(crate) mod oom_control;
pub(crate) mod schedule_control;
pub(crate) mod states;

use crate::adapt::mixer::Closing;
use crate::adapt::noise_cadence::SplitCostModel;
use crate::dist::communicator::Communicator;
use crate::error::Result;
use crate::report::record::{HeldOutCost, SourceGradientCost, StepLog};
use crate::train::eval::HeldOut;
use crate::train::probe::StepProbe;
use crate::train::settings::RunSettings;
use crate::train::step::StepInput;

pub(crate) use controller::{Controller, Restore, Save, Steer, StepReport, UserControllers};
use loss_scale::LossScaleControl;
use memory::MemoryControl;
use mixing::MixingControl;
use noise_scale_control::NoiseScaleControl;
use oom_control::OomControl;
use schedule_control::ScheduleControl;
pub(crate) use states::ControllerStates;

/// Every controller of a run, each present when the run uses it.
pub(crate) struct Controllers {
    pub(crate) oom: OomControl,
    pub(crate) loss_scale: Option<LossScaleControl>,
    noise_scale: Option<NoiseScaleControl>,
    mixing: Option<MixingControl>,
    schedule: ScheduleControl,
    pub(crate) memory: MemoryControl,
}

impl Controllers {
    /// The gradient noise scale the learning rate may follow (`lr_scaling =
    /// adamscale`): the estimate once warmed up, the same on every rank.
    pub(crate) fn noise_scale_for_lr(&self) -> Option<f64> {
        self.noise_scale.as_ref().and_then(|n| n.warm_estimate())
    }

    /// The controllers the settings ask for, as a fresh run starts them.
    pub(crate) fn new(settings: &RunSettings) -> Result<Self> {
        Ok(Self {
            oom: OomControl::new(settings.step.oom),
            loss_scale: settings.step.loss_scaler.map(LossScaleControl::new),
            noise_scale: NoiseScaleControl::new(
                &settings.step,
                &settings.schedule,
                settings.units_world,
                SplitCostModel::for_device(settings.device.is_cuda()),
            )?,
            mixing: MixingControl::new(
                settings.sources.as_ref(),
                settings.builtin_mixer,
                settings.step.reweight,
            ),
            schedule: ScheduleControl,
            memory: MemoryControl::new(settings.memory_margin, settings.batching, settings.seed),
        })
    }

    /// The order in which the controllers act, the one place it is written.
    fn in_order(&mut self) -> [Option<&mut dyn Controller>; 6] {
        [
            Some(&mut self.oom),
            self.loss_scale.as_mut().map(|c| c as &mut dyn Controller),
            self.noise_scale.as_mut().map(|c| c as &mut dyn Controller),
            self.mixing.as_mut().map(|c| c as &mut dyn Controller),
            Some(&mut self.schedule),
            Some(&mut self.memory),
        ]
    }

    /// A fresh run's start.
    pub(crate) fn begin(&mut self, steer: &mut Steer<'_>) -> Result<()> {
        for controller in self.in_order().into_iter().flatten() {
            controller.begin(steer)?;
        }
        Ok(())
    }

    /// After a step: every controller in order.
    pub(crate) fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        for controller in self.in_order().into_iter().flatten() {
            controller.adapt(report, steer)?;
        }
        Ok(())
    }

    /// A logged step's record gets every controller's fields.
    pub(crate) fn record(&mut self, entry: &mut StepLog) {
        for controller in self.in_order().into_iter().flatten() {
            controller.record(entry);
        }
    }

    /// Their parts of a checkpoint (every rank calls it at the same step).
    pub(crate) fn save(
        &mut self,
        comm: &dyn Communicator,
        trainer: &mut dyn UserControllers,
    ) -> Result<ControllerStates> {
        let mut states = ControllerStates::default();
        let mut at = Save {
            comm,
            trainer,
            into: &mut states,
        };
        for controller in self.in_order().into_iter().flatten() {
            controller.save(&mut at)?;
        }
        let trainer = at.trainer;
        if let Some(state) = trainer.callback().and_then(|c| c.state()) {
            states.put_value(states::CALLBACK, 1, state);
        }
        Ok(states)
    }

    /// Continues from a checkpoint's parts.
    pub(crate) fn restore(
        &mut self,
        from: &ControllerStates,
        rank: usize,
        trainer: &mut dyn UserControllers,
    ) -> Result<()> {
        let mut at = Restore {
            from,
            rank,
            trainer,
        };
        for controller in self.in_order().into_iter().flatten() {
            controller.restore(&mut at)?;
        }
        let trainer = at.trainer;
        let state = from.get::<serde_json::Value>(states::CALLBACK, 1)?;
        if let (Some(state), Some(callback)) = (state, trainer.callback()) {
            callback
                .restore(&state)
                .map_err(|detail| states::entry_error(states::CALLBACK, detail))?;
        }
        Ok(())
    }

    /// What the next step takes from the controllers: its loss scale, and what
    /// they measure inside it (in their order).
    pub(crate) fn prepare<D: ?Sized, C>(
        &mut self,
        input: &mut StepInput<'_, D, C>,
        step: usize,
        trainer: &mut dyn UserControllers,
    ) -> Vec<Box<dyn StepProbe + '_>> {
        input.loss_scale = self.loss_scale();
        if let Some(mixing) = self.mixing.as_mut() {
            mixing.prepare(step, trainer);
        }
        (self.in_order().into_iter().flatten())
            .filter_map(|controller| {
                let controller: &dyn Controller = controller;
                controller.probe()
            })
            .collect()
    }

    /// Whether some controller wants the held-out losses after step `step`.
    pub(crate) fn wants_held_out(
        &mut self,
        step: usize,
        trainer: &mut dyn UserControllers,
    ) -> bool {
        (self.in_order().into_iter().flatten()).any(|c| c.wants_held_out(step, &mut *trainer))
    }

    /// What measuring the sources' gradients has cost the run (`None`: none asked).
    pub(crate) fn source_gradient_cost(&self) -> Option<SourceGradientCost> {
        self.mixing
            .as_ref()
            .and_then(MixingControl::source_gradient_cost)
    }

    /// What the held-out losses asked for have cost the run (`None`: none asked).
    pub(crate) fn held_out_cost(&self) -> Option<HeldOutCost> {
        self.mixing.as_ref().and_then(MixingControl::held_out_cost)
    }

    /// The wall-clock seconds of the step that just ran (0 after an OOM), to the
    /// controllers that time steps.
    pub(crate) fn step_time(&mut self, seconds: f64) {
        for controller in self.in_order().into_iter().flatten() {
            controller.step_time(seconds);
        }
    }

    /// The loss scale of the next step (1 unless `--fp16`).
    pub(crate) fn loss_scale(&self) -> f64 {
        self.loss_scale.as_ref().map_or(1.0, |c| c.scale())
    }

    /// `--fp16`'s updates skipped over the run.
    pub(crate) fn skipped_steps(&self) -> usize {
        self.loss_scale.as_ref().map_or(0, |c| c.skipped_steps())
    }

    /// The mixer in force told the run's expected steps ([`crate::Mixer::plan_run`]);
    /// what it could not resolve is logged as a warning.
    pub(crate) fn plan_mixer(
        &mut self,
        trainer: &mut dyn UserControllers,
        expected_steps: Option<usize>,
        logger: Option<&crate::report::logging::Logger>,
    ) {
        let Some(mixing) = self.mixing.as_mut() else {
            return;
        };
        if let (Some(notice), Some(logger)) = (mixing.plan(trainer, expected_steps), logger) {
            logger.event(&format!("warning: {notice}"));
        }
    }

    /// Whether the mixer in force may add steps after the planned end
    /// ([`crate::Mixer::closes`]).
    pub(crate) fn closes(&mut self, trainer: &mut dyn UserControllers) -> bool {
        (self.mixing.as_mut()).is_some_and(|mixing| mixing.closes(trainer))
    }

    /// The mixer's closing at `step`, from the reading there ([`crate::Mixer::close`]).
    pub(crate) fn close(
        &mut self,
        step: usize,
        readings: (Option<&crate::report::record::EvalLog>, Option<&HeldOut>),
        steer: &mut Steer<'_>,
    ) -> Result<Closing> {
        match self.mixing.as_mut() {
            Some(mixing) => mixing.close(step, readings, steer),
            None => Ok(Closing::End),
        }
    }

    /// Steps that ran on a held noise-scale estimate (see `HeldEstimate`).
    pub(crate) fn noise_scale_held_steps(&self) -> usize {
        self.noise_scale.as_ref().map_or(0, |c| c.held_steps())
    }
}
