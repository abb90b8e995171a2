//! How each step trains: the step flags (`StepArgs`) check and resolve themselves
//! into `StepRules`.

use crate::adapt::lr::LrScaling;
use crate::adapt::noise_scale::MeasureEvery;
use crate::adapt::schedule::ScheduleSpec;
use crate::config::args::StepArgs;
use crate::config::policy::{OomPolicy, Reweight, TrainerPolicy};
use crate::error::{Error, Result, SettingsError};
use crate::optim::precision::{LossScaler, Precision};
use crate::train::out_of_memory::FaultInjector;

use super::require;

/// Smoothing of the gradient noise scale's moving averages.
pub(crate) const NOISE_SCALE_BETA: f64 = 0.95;

/// How each step trains, the same on every rank.
#[derive(Debug, Clone)]
pub(crate) struct StepRules {
    pub(crate) reweight: Reweight,
    pub(crate) oom: OomPolicy,
    pub(crate) faults: FaultInjector,
    /// `--max-grad-norm` (0: no clipping).
    pub(crate) max_grad_norm: f64,
    /// The moving averages' factor of the gradient noise scale, when measured.
    pub(crate) noise_scale_beta: Option<f64>,
    /// Which steps measure it (`--noise-scale-every`, else the schedule's).
    pub(crate) noise_every: MeasureEvery,
    /// Measure it on the gradients preconditioned by Adam's second moment
    /// (`lr_scaling = adamscale`).
    pub(crate) precondition_noise: bool,
    /// `--bf16` / `--fp16`.
    pub(crate) precision: Precision,
    /// `--fp16`'s loss scaling, as it starts.
    pub(crate) loss_scaler: Option<LossScaler>,
}

impl StepArgs {
    /// One half-precision type, a clipping norm that is a number, a loss scale
    /// that is one, fault steps counted from 1.
    pub(super) fn check(&self) -> Result<()> {
        // clap refuses both on a command line; `TrainingArgs` built in code is
        // checked here.
        if self.bf16 && self.fp16 {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "--bf16",
                second: "--fp16",
                reason: "a run computes in one half-precision type: pick one",
            }));
        }
        require(
            self.max_grad_norm.is_finite() && self.max_grad_norm >= 0.0,
            "max_grad_norm",
            self.max_grad_norm,
            "finite and >= 0 (0 = no clipping)",
        )?;
        self.loss_scaler()?;
        for &step in &self.inject_oom_at_steps {
            require(
                step > 0,
                "inject_oom_at_steps",
                step,
                "steps counted from 1",
            )?;
        }
        Ok(())
    }

    /// The step's rules under `policy`; `noise_measured` when the gradient noise
    /// scale is measured (logged or scheduling).
    pub(super) fn rules(&self, policy: &TrainerPolicy, noise_measured: bool) -> Result<StepRules> {
        Ok(StepRules {
            reweight: policy.reweight,
            oom: self.oom.unwrap_or(policy.oom),
            faults: FaultInjector::at_steps(self.inject_oom_at_steps.iter().copied()),
            max_grad_norm: self.max_grad_norm,
            noise_scale_beta: noise_measured.then_some(NOISE_SCALE_BETA),
            noise_every: self.noise_scale_every.unwrap_or(match policy.schedule {
                ScheduleSpec::NoiseScale(noise) => noise.every,
                _ => MeasureEvery::DEFAULT,
            }),
            precondition_noise: policy.lr_scaling == LrScaling::AdamScale,
            precision: match (self.bf16, self.fp16) {
                (true, _) => Precision::Bf16,
                (false, true) => Precision::F16,
                (false, false) => Precision::F32,
            },
            loss_scaler: self.loss_scaler()?,
        })
    }

    /// `--fp16`'s loss scaling, as it starts.
    fn loss_scaler(&self) -> Result<Option<LossScaler>> {
        self.fp16
            .then(|| LossScaler::new(self.fp16_initial_scale_power, LossScaler::GROWTH_INTERVAL))
            .transpose()
    }
}
