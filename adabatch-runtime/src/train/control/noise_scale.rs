//! The gradient noise scale as a controller: each step's estimate feeds the
//! moving averages, and under `schedule = noise_scale(..)` sizes the next global
//! batch.

use crate::adapt::noise_scale::NoiseScaleEstimator;
use crate::adapt::schedule::ScheduleSpec;
use crate::dist::communicator::Communicator;
use crate::error::Result;
use crate::report::record::StepLog;
use crate::train::settings::RunSettings;
use crate::train::step::StepOutcome;

use super::controller::{Controller, Steer, StepReport, UserControllers};
use super::states::ControllerStates;

/// The estimator, and the resizing rule of `schedule = noise_scale(..)`.
pub(crate) struct NoiseScaleControl {
    estimator: NoiseScaleEstimator,
    /// `fraction`, `min`, `max` of `schedule = noise_scale(..)`; `None` when the
    /// estimate is only logged (`--log-gradient-noise-scale`).
    resize: Option<(f64, usize, usize)>,
}

impl NoiseScaleControl {
    /// When the run measures the noise scale.
    pub(crate) fn new(settings: &RunSettings) -> Result<Option<Self>> {
        let Some(beta) = settings.step.noise_scale_beta else {
            return Ok(None);
        };
        Ok(Some(Self {
            estimator: NoiseScaleEstimator::new(beta)?,
            resize: match settings.schedule {
                ScheduleSpec::NoiseScale { fraction, min, max } => Some((fraction, min, max)),
                _ => None,
            },
        }))
    }
}

impl Controller for NoiseScaleControl {
    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        let StepOutcome::Trained {
            noise: Some((norm, trace)),
            ..
        } = *report.outcome
        else {
            return Ok(());
        };
        let estimate = self.estimator.observe(norm, trace);
        if let (Some((fraction, min, max)), Some(b)) = (self.resize, estimate) {
            let mut next = noise_scale_batch(fraction, min, max, b);
            // Until the averages span their horizon the estimate rests on a few
            // noisy measurements: the batch at most doubles per step then.
            if !self.estimator.warmed_up() {
                next = next.min(2 * steer.planner.global_batch());
            }
            steer.planner.set_global_batch(next);
        }
        Ok(())
    }

    fn record(&mut self, entry: &mut StepLog) {
        entry.gradient_noise_scale = self.estimator.estimate();
    }

    fn save(
        &mut self,
        _comm: &dyn Communicator,
        _trainer: &mut dyn UserControllers,
        into: &mut ControllerStates,
    ) -> Result<()> {
        into.noise_scale = Some(self.estimator);
        Ok(())
    }

    fn restore(&mut self, from: &ControllerStates, _rank: usize, _: &mut dyn UserControllers) {
        if let Some(saved) = from.noise_scale {
            self.estimator = saved;
        }
    }
}

/// The next global batch of `schedule = noise_scale(..)`: `fraction` of the
/// estimate B_simple, rounded, clamped to `[min, max]`.
pub(crate) fn noise_scale_batch(fraction: f64, min: usize, max: usize, estimate: f64) -> usize {
    let wanted = (fraction * estimate).round();
    if wanted.is_nan() || wanted < min as f64 {
        min
    } else if wanted > max as f64 {
        max
    } else {
        wanted as usize
    }
}
