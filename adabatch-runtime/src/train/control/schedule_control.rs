//! The schedule or ramp as a controller: after a step that ran, the planner asks
//! it for the next size (clamped by `min_batch` / `max_batch`). Its state is the
//! planner's.

use crate::error::Result;

use super::controller::{Controller, Steer, StepReport};

/// The trainer's schedule (it lives in the planner, whose state a checkpoint
/// holds).
pub(crate) struct ScheduleControl;

impl Controller for ScheduleControl {
    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        if report.trained() {
            steer.planner.finish_step()?;
        }
        Ok(())
    }
}
