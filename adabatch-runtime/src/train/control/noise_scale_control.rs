//! The gradient noise scale as a controller: each step's estimate feeds the
//! moving averages, and under `schedule = noise_scale(..)` or `goodput(..)` sizes
//! the next global batch.

use crate::adapt::noise_scale::{NoiseScaleEstimator, NoiseScalePolicy};
use crate::adapt::schedule::ScheduleSpec;
use crate::error::Result;
use crate::report::record::StepLog;
use crate::train::settings::RunSettings;
use crate::train::step::StepOutcome;

use super::controller::{Controller, Restore, Save, Steer, StepReport};
use super::goodput_control::GoodputControl;
use super::states;

/// The estimator, and what resizes the batch from it.
pub(crate) struct NoiseScaleControl {
    estimator: NoiseScaleEstimator,
    resize: Resize,
}

/// What the estimate drives.
enum Resize {
    /// Nothing: the estimate is only logged (`--log-gradient-noise-scale`).
    LogOnly,
    /// `schedule = noise_scale(..)`.
    NoiseScale(NoiseScalePolicy),
    /// `schedule = goodput(..)`.
    Goodput(GoodputControl),
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
                ScheduleSpec::NoiseScale(policy) => Resize::NoiseScale(policy),
                ScheduleSpec::Goodput(spec) => {
                    Resize::Goodput(GoodputControl::new(spec, settings.units_world))
                }
                _ => Resize::LogOnly,
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
        let warmed_up = self.estimator.warmed_up();
        match &mut self.resize {
            Resize::LogOnly => {}
            Resize::NoiseScale(policy) => {
                let current = steer.planner.global_batch();
                steer
                    .planner
                    .set_global_batch(policy.next(current, estimate, warmed_up));
            }
            Resize::Goodput(goodput) => {
                let phi = estimate.filter(|_| warmed_up);
                goodput.adapt(report, phi, steer)?;
            }
        }
        Ok(())
    }

    fn record(&mut self, entry: &mut StepLog) {
        entry.gradient_noise_scale = self.estimator.estimate();
        if let Resize::Goodput(goodput) = &self.resize {
            goodput.record(entry);
        }
    }

    fn save(&mut self, at: &mut Save<'_>) -> Result<()> {
        at.into.put(states::NOISE_SCALE, 1, &self.estimator)?;
        if let Resize::Goodput(goodput) = &self.resize {
            at.into.put(states::GOODPUT, 1, &goodput.state())?;
        }
        Ok(())
    }

    fn restore(&mut self, at: &mut Restore<'_>) -> Result<()> {
        if let Some(saved) = at.from.get(states::NOISE_SCALE, 1)? {
            self.estimator = saved;
        }
        if let Resize::Goodput(goodput) = &mut self.resize {
            if let Some(saved) = at.from.get(states::GOODPUT, 1)? {
                goodput.restore(&saved);
            }
        }
        Ok(())
    }
}
