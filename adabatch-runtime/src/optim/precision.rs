//! Mixed precision (HF's `--bf16` / `--fp16`): the model computes in half
//! precision wherever it casts with [`autocast`](adabatch_nn::autocast); the variables the optimizer
//! updates (master weights), its state, and the gradients that are all-reduced
//! stay f32. f16's narrow range needs loss scaling: [`LossScaler`], PyTorch's
//! `GradScaler` (the loss is multiplied by the scale before the backward pass;
//! a step whose gradients overflow is skipped and the scale halved; after
//! `growth_interval` clean steps it doubles).
//!
//! candle has no autocast of its own, so a model opts in where it computes, with
//! `adabatch::autocast` / `adabatch::autocast_linear` (crate `adabatch-nn`); the
//! engine enters their scope for each step's forward passes.

use candle_core::{DType, Tensor};

use crate::error::{Error, ModelError, Result, SettingsError, TrainingError};

/// The dtype a run's model computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything f32 (the default).
    #[default]
    F32,
    /// `--bf16`: bfloat16 compute, f32 master weights; no loss scaling needed.
    Bf16,
    /// `--fp16`: float16 compute, f32 master weights, dynamic loss scaling.
    F16,
}

impl Precision {
    /// The dtype [`autocast`](adabatch_nn::autocast) casts to, `None` for f32 runs.
    pub fn compute_dtype(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::F16 => Some(DType::F16),
        }
    }

    /// The flag that selects it.
    pub fn flag(self) -> &'static str {
        match self {
            Precision::F32 => "(f32)",
            Precision::Bf16 => "--bf16",
            Precision::F16 => "--fp16",
        }
    }
}

/// The forward passes of one step on this rank run inside it; dropping it
/// restores f32.
pub(crate) struct AutocastScope {
    scope: adabatch_nn::AutocastScope,
}

impl AutocastScope {
    pub(crate) fn enter(precision: Precision) -> Self {
        Self {
            scope: adabatch_nn::AutocastScope::enter(precision.compute_dtype()),
        }
    }

    /// A half-precision run whose model never cast anything trains in f32
    /// while the user believes otherwise: a typed error instead.
    pub(crate) fn check_used(&self, precision: Precision) -> Result<()> {
        if self.scope.dtype().is_some() && self.scope.casts() == 0 {
            return Err(Error::Model(ModelError::AutocastUnused {
                flag: precision.flag(),
            }));
        }
        Ok(())
    }
}

/// A per-example loss in f32 (a half-precision model's losses are summed and
/// weighted in f32, like PyTorch's autocast does for reductions).
pub(crate) fn loss_in_f32(losses: Tensor) -> candle_core::Result<Tensor> {
    match losses.dtype() {
        DType::BF16 | DType::F16 => losses.to_dtype(DType::F32),
        _ => Ok(losses),
    }
}

/// Dynamic loss scaling for `--fp16` (PyTorch's `GradScaler` defaults: 2¹⁶ to
/// start, ×2 after 2000 clean steps, ×½ and the step skipped on overflow).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossScaler {
    /// The factor the loss is multiplied by before the backward pass.
    pub scale: f64,
    /// Clean steps since the scale last changed.
    pub good_steps: usize,
    /// Clean steps after which the scale doubles.
    pub growth_interval: usize,
    /// Steps skipped for overflow so far.
    pub skipped_steps: usize,
}

/// Below this the scale cannot rescue anything: gradients are not finite at any
/// scale (f16's smallest subnormal is 2⁻²⁴).
const SMALLEST_SCALE: f64 = 1.0 / (1u64 << 24) as f64;

impl LossScaler {
    /// PyTorch's default growth interval.
    pub const GROWTH_INTERVAL: usize = 2000;

    /// A scaler starting at 2^`initial_power`.
    pub fn new(initial_power: i32, growth_interval: usize) -> Result<Self> {
        if !(-24..=120).contains(&initial_power) || growth_interval == 0 {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "fp16_initial_scale_power",
                value: format!("{initial_power} (growth interval {growth_interval})"),
                expected:
                    "a power of two between 2^-24 and 2^120, and a growth interval of at least 1",
            }));
        }
        Ok(Self {
            scale: 2f64.powi(initial_power),
            good_steps: 0,
            growth_interval,
            skipped_steps: 0,
        })
    }

    /// Records a step: `true` when its gradients were finite (it was applied).
    /// An overflow at the smallest useful scale is a typed error.
    pub fn update(&mut self, finite: bool, step: usize) -> Result<()> {
        if finite {
            self.good_steps += 1;
            if self.good_steps == self.growth_interval {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
            return Ok(());
        }
        self.skipped_steps += 1;
        self.good_steps = 0;
        self.scale *= 0.5;
        if self.scale < SMALLEST_SCALE {
            return Err(Error::Training(TrainingError::LossScaleUnderflow { step }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use adabatch_nn::{autocast, autocast_linear};
    use candle_core::{Device, Var};

    #[test]
    fn autocast_casts_only_inside_a_half_precision_scope() -> Result<()> {
        let x = Tensor::ones(3, DType::F32, &Device::Cpu)?;
        assert_eq!(autocast(&x)?.dtype(), DType::F32);
        {
            let scope = AutocastScope::enter(Precision::Bf16);
            assert!(scope.check_used(Precision::Bf16).is_err());
            assert_eq!(autocast(&x)?.dtype(), DType::BF16);
            let ids = Tensor::new(&[1u32, 2], &Device::Cpu)?;
            assert_eq!(autocast(&ids)?.dtype(), DType::U32);
            scope.check_used(Precision::Bf16)?;
        }
        assert_eq!(autocast(&x)?.dtype(), DType::F32);
        let scope = AutocastScope::enter(Precision::F32);
        scope.check_used(Precision::F32)?;
        Ok(())
    }

    #[test]
    fn gradients_reach_the_f32_master_weights() -> Result<()> {
        let w = Var::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu)?;
        let layer = candle_nn::Linear::new(w.as_tensor().clone(), None);
        let x = Tensor::new(&[[1f32, 1.0]], &Device::Cpu)?;
        let _scope = AutocastScope::enter(Precision::F16);
        let y = autocast_linear(&layer, &x)?;
        assert_eq!(y.dtype(), DType::F16);
        let loss = loss_in_f32(y.sum_all()?)?;
        let grads = loss.backward()?;
        let g = grads.get(w.as_tensor()).expect("a gradient");
        assert_eq!(g.dtype(), DType::F32);
        assert_eq!(g.to_vec2::<f32>()?, vec![vec![1.0, 1.0], vec![1.0, 1.0]]);
        Ok(())
    }

    #[test]
    fn the_scale_backs_off_grows_and_gives_up() -> Result<()> {
        let mut scaler = LossScaler::new(16, 3)?;
        scaler.update(false, 1)?;
        assert_eq!((scaler.scale, scaler.skipped_steps), (32768.0, 1));
        for step in 2..5 {
            scaler.update(true, step)?;
        }
        assert_eq!((scaler.scale, scaler.good_steps), (65536.0, 0));
        assert!(LossScaler::new(200, 3).is_err());
        let mut tiny = LossScaler::new(-24, 3)?;
        assert!(matches!(
            tiny.update(false, 9),
            Err(Error::Training(TrainingError::LossScaleUnderflow {
                step: 9
            }))
        ));
        Ok(())
    }
}
