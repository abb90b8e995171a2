//! `--fp16`'s dynamic loss scale as a controller: an overflowed step's update is
//! skipped and the scale halves; it doubles after enough clean steps.

use crate::error::Result;
use crate::optim::precision::LossScaler;
use crate::report::record::StepLog;
use crate::train::step::TrainedStep;

use super::controller::{Controller, Restore, Save, Steer, StepReport};
use super::states;

/// The loss scaler, the scale the last step ran with, and the skipped updates
/// since the last logged step.
pub(crate) struct LossScaleControl {
    scaler: LossScaler,
    used: f64,
    skipped_since_log: usize,
}

impl LossScaleControl {
    pub(crate) fn new(scaler: LossScaler) -> Self {
        Self {
            used: scaler.scale,
            scaler,
            skipped_since_log: 0,
        }
    }

    /// The scale of the next step.
    pub(crate) fn scale(&self) -> f64 {
        self.scaler.scale
    }

    /// Updates skipped over the run.
    pub(crate) fn skipped_steps(&self) -> usize {
        self.scaler.skipped_steps
    }
}

impl Controller for LossScaleControl {
    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        let Some(&TrainedStep { overflowed, .. }) = report.trained_step() else {
            return Ok(());
        };
        let (step, scale) = (report.step, self.scaler.scale);
        self.used = scale;
        self.scaler.update(!overflowed, step)?;
        if overflowed {
            self.skipped_since_log += 1;
            if let Some(logger) = steer.logger {
                logger.event(&format!(
                    "step {step}: the f16 gradients overflowed at loss scale {scale}; update skipped, scale now {}",
                    self.scaler.scale
                ));
            }
        }
        Ok(())
    }

    fn record(&mut self, entry: &mut StepLog) {
        entry.loss_scale = Some(self.used);
        entry.skipped_steps = std::mem::take(&mut self.skipped_since_log);
    }

    fn save(&mut self, at: &mut Save<'_>) -> Result<()> {
        at.into.put(states::LOSS_SCALE, 1, &self.scaler)
    }

    fn restore(&mut self, at: &mut Restore<'_>) -> Result<()> {
        if let Some(saved) = at.from.get(states::LOSS_SCALE, 1)? {
            self.scaler = saved;
        }
        Ok(())
    }
}
