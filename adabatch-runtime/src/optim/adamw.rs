//! AdamW with decoupled weight decay and bias correction: candle's update, fused
//! and in place (one pass over each parameter: `adabatch_nn::AdamWStep` on CPU,
//! and on CUDA when the CUDA bodies are on), with exportable state.

use std::sync::Mutex;

use adabatch_nn::AdamWStep;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Layout, Tensor, Var};

use super::groups::{HeldParameters, ParamGroups};
use super::{name_of, OptimizerState, TrainOptimizer};
use crate::error::Result;

const KIND: &str = "adabatch::AdamW";

/// Updates before the noise scale's preconditioner leaves the identity (AdaptDL
/// waits 5 too): `v̂` of fewer gradients is mostly the last one.
pub const PRECONDITION_AFTER: u64 = 5;

/// AdamW's hyper-parameters (the defaults of candle and PyTorch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamsAdamW {
    /// Learning rate (the engine sets it every step).
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for ParamsAdamW {
    fn default() -> Self {
        Self {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl ParamsAdamW {
    /// The settings the run's flags name (`--learning-rate`, `--weight-decay`,
    /// `--adam-beta1`, `--adam-beta2`, `--adam-epsilon`: HF's), checked: betas in
    /// `[0, 1)`, epsilon finite and > 0, weight decay finite and >= 0. The rate is
    /// the peak the engine schedules from.
    pub fn from_args(args: &crate::config::args::TrainingArgs) -> Result<Self> {
        let o = &args.optim;
        let require = |ok: bool, name, value: f64, expected| match ok {
            true => Ok(()),
            false => Err(crate::error::SettingsError::invalid(name, value, expected)),
        };
        let beta = |b: f64| (0.0..1.0).contains(&b);
        require(beta(o.adam_beta1), "adam_beta1", o.adam_beta1, "in [0, 1)")?;
        require(beta(o.adam_beta2), "adam_beta2", o.adam_beta2, "in [0, 1)")?;
        let eps_ok = o.adam_epsilon.is_finite() && o.adam_epsilon > 0.0;
        require(eps_ok, "adam_epsilon", o.adam_epsilon, "finite and > 0")?;
        let decay_ok = o.weight_decay.is_finite() && o.weight_decay >= 0.0;
        require(decay_ok, "weight_decay", o.weight_decay, "finite and >= 0")?;
        Ok(Self {
            lr: args.lr.learning_rate,
            beta1: o.adam_beta1,
            beta2: o.adam_beta2,
            eps: o.adam_epsilon,
            weight_decay: o.weight_decay,
        })
    }
}

/// One parameter and its moments.
#[derive(Debug)]
struct Slot {
    var: Var,
    moments: Moments,
    /// Weight decay applies (not for biases and norms under [`ParamGroups`]).
    decay: bool,
}

impl Slot {
    fn new(var: Var, decay: bool) -> Result<Self> {
        let f32 = var.dtype() == DType::F32;
        let moments = match var.device() {
            candle_core::Device::Cpu if f32 => {
                let n = var.elem_count();
                Moments::Host(Mutex::new((vec![0.0; n], vec![0.0; n])))
            }
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(device) if f32 && adabatch_nn::cuda_bodies_enabled() => {
                let moments = adabatch_nn::CudaMoments::zeros(device, var.elem_count())?;
                Moments::Cuda(Mutex::new(moments))
            }
            _ => Moments::Device {
                m: Var::zeros(var.shape(), var.dtype(), var.device())?,
                v: Var::zeros(var.shape(), var.dtype(), var.device())?,
            },
        };
        Ok(Slot {
            var,
            moments,
            decay,
        })
    }
}

/// f32 CPU parameters keep their moments as plain buffers, updated by the fused
/// step; f32 CUDA parameters (with the CUDA bodies on) as device buffers, updated
/// by its kernel; other parameters as tensors, updated with tensor ops.
#[derive(Debug)]
enum Moments {
    Host(Mutex<(Vec<f32>, Vec<f32>)>),
    #[cfg(feature = "cuda")]
    Cuda(Mutex<adabatch_nn::CudaMoments>),
    Device {
        m: Var,
        v: Var,
    },
}

/// Checkpointable AdamW (the update of `candle_nn::AdamW`).
#[derive(Debug)]
pub struct AdamW {
    slots: Vec<Slot>,
    params: ParamsAdamW,
    step: u64,
    /// Built with [`AdamW::with_groups`]: the groups, saved with the state.
    groups: Option<ParamGroups>,
}

/// The constants of one update for `slot`: no decay (`keep` = 1, an exact no-op)
/// for slots without weight decay.
fn step_for(step: AdamWStep, slot: &Slot) -> AdamWStep {
    if slot.decay {
        step
    } else {
        step.without_decay()
    }
}

impl Slot {
    /// The moments `(m, v)` as tensors of the parameter's shape and device.
    fn moment_tensors(&self) -> Result<(Tensor, Tensor)> {
        Ok(match &self.moments {
            Moments::Host(moments) => {
                let guard = moments.lock().unwrap_or_else(|p| p.into_inner());
                let (shape, device) = (self.var.shape(), self.var.device());
                (
                    Tensor::from_slice(&guard.0, shape, device)?,
                    Tensor::from_slice(&guard.1, shape, device)?,
                )
            }
            #[cfg(feature = "cuda")]
            Moments::Cuda(moments) => moments
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .to_tensors(self.var.shape())?,
            Moments::Device { m, v } => (m.as_tensor().copy()?, v.as_tensor().copy()?),
        })
    }

    /// The second moment `v` alone, as a tensor of the parameter's shape and
    /// device (the preconditioner reads nothing else).
    fn second_moment(&self) -> Result<Tensor> {
        match &self.moments {
            Moments::Host(moments) => {
                let guard = moments.lock().unwrap_or_else(|p| p.into_inner());
                Ok(Tensor::from_slice(
                    &guard.1,
                    self.var.shape(),
                    self.var.device(),
                )?)
            }
            #[cfg(feature = "cuda")]
            Moments::Cuda(_) => Ok(self.moment_tensors()?.1),
            Moments::Device { v, .. } => Ok(v.as_tensor().clone()),
        }
    }

    fn weight_decay(&self, p: ParamsAdamW) -> f64 {
        if self.decay {
            p.weight_decay
        } else {
            0.0
        }
    }
}

/// The fused step: `theta`, `m`, `v` updated in one pass from `g`.
struct FusedStep<'a> {
    update: AdamWStep,
    moments: &'a Moments,
}

impl candle_core::InplaceOp2 for FusedStep<'_> {
    fn name(&self) -> &'static str {
        "adabatch-adamw"
    }

    fn cpu_fwd(
        &self,
        theta: &mut CpuStorage,
        theta_layout: &Layout,
        grad: &CpuStorage,
        grad_layout: &Layout,
    ) -> candle_core::Result<()> {
        let (CpuStorage::F32(theta), CpuStorage::F32(grad)) = (theta, grad) else {
            candle_core::bail!("adabatch AdamW: the fused step needs f32 parameters and gradients")
        };
        let (Some((t0, t1)), Some((g0, g1))) = (
            theta_layout.contiguous_offsets(),
            grad_layout.contiguous_offsets(),
        ) else {
            candle_core::bail!("adabatch AdamW: the fused step needs contiguous tensors")
        };
        let Moments::Host(moments) = self.moments else {
            candle_core::bail!("adabatch AdamW: a CPU parameter's moments are not on the CPU")
        };
        let mut guard = moments.lock().unwrap_or_else(|p| p.into_inner());
        let (m, v) = &mut *guard;
        self.update.apply(&mut theta[t0..t1], &grad[g0..g1], m, v)?;
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        theta: &mut candle_core::CudaStorage,
        theta_layout: &Layout,
        grad: &candle_core::CudaStorage,
        grad_layout: &Layout,
    ) -> candle_core::Result<()> {
        let Moments::Cuda(moments) = self.moments else {
            candle_core::bail!("adabatch AdamW: a CUDA parameter's moments are not on its device")
        };
        let mut moments = moments.lock().unwrap_or_else(|p| p.into_inner());
        moments.update(theta, theta_layout, grad, grad_layout, self.update)
    }
}

impl AdamW {
    /// AdamW over `vars` (non-float variables are skipped, as candle does), all
    /// with weight decay.
    pub fn new(vars: Vec<Var>, params: ParamsAdamW) -> Result<Self> {
        let slots = vars
            .into_iter()
            .filter(|var| var.dtype().is_float())
            .map(|var| Slot::new(var, true))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            slots,
            params,
            step: 0,
            groups: None,
        })
    }

    /// AdamW over the trainable parameters of `named` (the model's), without
    /// weight decay where `groups` says so (by default biases and norms, as in
    /// Hugging Face's Trainer). The groups are saved with the state and restored
    /// on resume.
    pub fn with_groups(
        named: &[(String, Var)],
        groups: &ParamGroups,
        params: ParamsAdamW,
    ) -> Result<Self> {
        let slots = groups
            .trainable(named)
            .into_iter()
            .filter(|(_, var, _)| var.dtype().is_float())
            .map(|(_, var, decay)| Slot::new(var, decay))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            slots,
            params,
            step: 0,
            groups: Some(groups.clone()),
        })
    }

    /// The hyper-parameters.
    pub fn params(&self) -> ParamsAdamW {
        self.params
    }

    /// Updates taken.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    fn update(&self) -> (AdamWStep, f64, f64) {
        let p = self.params;
        let scale_m = 1.0 / (1.0 - p.beta1.powi(self.step as i32));
        let scale_v = 1.0 / (1.0 - p.beta2.powi(self.step as i32));
        let u = AdamWStep {
            lr: p.lr as f32,
            beta1: p.beta1 as f32,
            beta2: p.beta2 as f32,
            one_minus_beta1: (1.0 - p.beta1) as f32,
            one_minus_beta2: (1.0 - p.beta2) as f32,
            keep: (1.0 - p.lr * p.weight_decay) as f32,
            eps: p.eps as f32,
            scale_m: scale_m as f32,
            scale_v: scale_v as f32,
        };
        (u, scale_m, scale_v)
    }
}

impl AdamW {
    /// The groups of a checkpoint: its frozen parameters must be this run's (the
    /// optimizer holds other variables otherwise); its no-decay set is restored,
    /// as PyTorch's `load_state_dict` restores each group's weight decay.
    fn restore_groups(
        &mut self,
        params: &[(String, Var)],
        saved: Option<&ParamGroups>,
    ) -> Result<()> {
        let Some(saved) = saved else {
            return Ok(());
        };
        let frozen = |g: Option<&ParamGroups>| -> Vec<String> {
            g.map(|g| g.frozen().map(String::from).collect())
                .unwrap_or_default()
        };
        let (was, now) = (frozen(Some(saved)), frozen(self.groups.as_ref()));
        if was != now {
            return Err(crate::error::Error::Checkpoint(
                crate::error::CheckpointError::OptimizerStateMismatch {
                    detail: format!(
                        "the checkpoint's optimizer froze {was:?}, this run's freezes {now:?}"
                    ),
                },
            ));
        }
        for slot in &mut self.slots {
            if let Some(name) = name_of(params, &slot.var) {
                slot.decay = !saved.is_no_decay(name);
            }
        }
        self.groups = Some(saved.clone());
        Ok(())
    }
}

impl candle_nn::Optimizer for AdamW {
    type Config = ParamsAdamW;

    fn new(vars: Vec<Var>, config: ParamsAdamW) -> candle_core::Result<Self> {
        AdamW::new(vars, config).map_err(candle_core::Error::wrap)
    }

    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        self.step += 1;
        let (update, scale_m, scale_v) = self.update();
        let p = self.params;
        for slot in &self.slots {
            let Some(grad) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            match &slot.moments {
                // The fewest tensor ops of the same update (candle's).
                Moments::Device { m, v } => {
                    let next_m = ((m.as_tensor() * p.beta1)? + (grad * (1.0 - p.beta1))?)?;
                    let next_v = ((v.as_tensor() * p.beta2)? + (grad.sqr()? * (1.0 - p.beta2))?)?;
                    let adjusted =
                        ((&next_m * scale_m)? / ((&next_v * scale_v)?.sqrt()? + p.eps)?)?;
                    let theta = slot.var.as_tensor();
                    let next_theta =
                        ((theta * (1.0 - p.lr * slot.weight_decay(p)))? - (adjusted * p.lr)?)?;
                    m.set(&next_m)?;
                    v.set(&next_v)?;
                    slot.var.set(&next_theta)?;
                }
                // One fused pass (on the CPU, or one kernel on CUDA).
                fused => {
                    let grad = grad.contiguous()?;
                    let step = FusedStep {
                        update: step_for(update, slot),
                        moments: fused,
                    };
                    slot.var.as_tensor().inplace_op2(&grad, &step)?;
                }
            }
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr;
    }
}

impl TrainOptimizer for AdamW {
    fn held_parameters(&self) -> Option<HeldParameters> {
        Some(HeldParameters {
            vars: self.slots.iter().map(|s| s.var.clone()).collect(),
            frozen: (self.groups.iter())
                .flat_map(|g| g.frozen().map(String::from))
                .collect(),
        })
    }

    /// `1 / (√v̂ + ε)` with `v̂ = v / (1 − β₂ᵗ)`, as AdaptDL's
    /// `AdamGradientNoiseScale` divides each gradient component by `√v̂ + ε`;
    /// the identity for the first 5 updates (`PRECONDITION_AFTER`), while `v̂`
    /// rests on too few gradients, and for a parameter this optimizer does not
    /// hold.
    fn preconditioner(&self, params: &[(String, Var)]) -> Result<Option<Vec<Option<Tensor>>>> {
        if self.step < PRECONDITION_AFTER {
            return Ok(Some(vec![None; params.len()]));
        }
        let p = self.params;
        let correction = (1.0 - p.beta2.powi(self.step as i32)).sqrt();
        let slots: std::collections::HashMap<_, &Slot> = (self.slots.iter())
            .map(|s| (s.var.as_tensor().id(), s))
            .collect();
        let mut out = Vec::with_capacity(params.len());
        for (_, var) in params {
            out.push(match slots.get(&var.as_tensor().id()) {
                Some(slot) => {
                    let v = slot.second_moment()?.to_dtype(DType::F32)?;
                    Some(((v.sqrt()? / correction)? + p.eps)?.recip()?)
                }
                None => None,
            });
        }
        Ok(Some(out))
    }

    fn export_state(&self, params: &[(String, Var)]) -> Result<Option<OptimizerState>> {
        let mut state = OptimizerState::new(KIND, self.step);
        state.groups = self.groups.clone();
        let p = self.params;
        for (key, value) in [
            ("lr", p.lr),
            ("beta1", p.beta1),
            ("beta2", p.beta2),
            ("eps", p.eps),
            ("weight_decay", p.weight_decay),
        ] {
            state.hyper.insert(key.into(), value);
        }
        for slot in &self.slots {
            // Moments are keyed by the model's parameter names, never by position.
            let Some(name) = name_of(params, &slot.var) else {
                continue;
            };
            let (m, v) = slot.moment_tensors()?;
            state.tensors.insert(format!("{name}.m"), m);
            state.tensors.insert(format!("{name}.v"), v);
        }
        Ok(Some(state))
    }

    fn import_state(&mut self, params: &[(String, Var)], state: &OptimizerState) -> Result<()> {
        state.expect_kind(KIND)?;
        // The moments were accumulated under these: a run that asks for others
        // would silently continue under the checkpoint's (the rate is the
        // engine's to set every step, and may differ).
        let ours = self.params;
        for (key, asked) in [
            ("beta1", ours.beta1),
            ("beta2", ours.beta2),
            ("eps", ours.eps),
            ("weight_decay", ours.weight_decay),
        ] {
            let saved = state.hyper(key)?;
            if saved.to_bits() != asked.to_bits() {
                return Err(crate::error::Error::Checkpoint(
                    crate::error::CheckpointError::OptimizerStateMismatch {
                        detail: format!(
                            "the checkpoint's AdamW has {key} = {saved}, this run's {asked}: resume with the optimizer's settings unchanged, or start its state afresh with --ignore-optimizer-state"
                        ),
                    },
                ));
            }
        }
        self.restore_groups(params, state.groups.as_ref())?;
        self.params = ParamsAdamW {
            lr: state.hyper("lr")?,
            ..ours
        };
        for slot in &self.slots {
            let Some(name) = name_of(params, &slot.var) else {
                continue;
            };
            let shape = slot.var.shape();
            let load = |key: &str| -> Result<Tensor> {
                let t = state.tensor(name, key)?;
                if t.shape() != shape {
                    return Err(crate::error::Error::Checkpoint(
                        crate::error::CheckpointError::OptimizerStateMismatch {
                            detail: format!(
                                "`{name}.{key}` has shape {:?}, the parameter {:?}",
                                t.shape(),
                                shape
                            ),
                        },
                    ));
                }
                Ok(t.to_dtype(slot.var.dtype())?.to_device(slot.var.device())?)
            };
            let (m, v) = (load("m")?, load("v")?);
            match &slot.moments {
                Moments::Host(moments) => {
                    let mut guard = moments.lock().unwrap_or_else(|p| p.into_inner());
                    guard.0 = m.flatten_all()?.to_vec1::<f32>()?;
                    guard.1 = v.flatten_all()?.to_vec1::<f32>()?;
                }
                #[cfg(feature = "cuda")]
                Moments::Cuda(moments) => {
                    let mut moments = moments.lock().unwrap_or_else(|p| p.into_inner());
                    moments.set(&m, &v)?;
                }
                Moments::Device { m: dm, v: dv } => {
                    dm.set(&m)?;
                    dv.set(&v)?;
                }
            }
        }
        self.step = state.step;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};
    use candle_nn::Optimizer;

    /// With a constant gradient `g`, `v_t = (1 − β₂ᵗ) g²`, so `v̂ = g²` and the
    /// preconditioner is `1 / (|g| + ε)`: the identity for the first 4 updates,
    /// then `[1/3, 1/4]` for `g = [3, −4]`; a variable it does not hold gets none.
    #[test]
    fn the_preconditioner_is_one_over_the_root_of_v_hat() -> Result<()> {
        let device = Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[1.0f32, -2.0], &device)?)?;
        let other = Var::from_tensor(&Tensor::new(&[0.0f32], &device)?)?;
        let params = vec![
            ("other".to_string(), other.clone()),
            ("w".to_string(), w.clone()),
        ];
        let mut opt = AdamW::new(
            vec![w.clone()],
            ParamsAdamW {
                eps: 1e-3,
                ..Default::default()
            },
        )?;
        let c = Tensor::new(&[3.0f32, -4.0], &device)?;
        for step in 1..=6 {
            let pre = opt.preconditioner(&params)?.expect("AdamW has one");
            assert_eq!(pre.len(), 2);
            assert!(pre[0].is_none(), "not held");
            if step <= PRECONDITION_AFTER {
                assert!(
                    pre[1].is_none(),
                    "identity before {PRECONDITION_AFTER} updates"
                );
            } else {
                let got = pre[1].as_ref().unwrap().to_vec1::<f32>()?;
                for (got, g) in got.iter().zip([3.0f32, 4.0]) {
                    assert!((got - 1.0 / (g + 1e-3)).abs() < 1e-5, "{got} vs 1/{g}");
                }
            }
            opt.step(&(w.as_tensor() * &c)?.sum_all()?.backward()?)?;
        }
        Ok(())
    }

    /// Three steps of ours and of candle's AdamW on the same variables and
    /// gradients, then a save/restore round trip that continues identically.
    #[test]
    fn matches_candle_and_round_trips_its_state() -> Result<()> {
        let device = Device::Cpu;
        let init = Tensor::new(&[[0.5f32, -1.0, 2.0], [0.25, 0.0, -3.0]], &device)?;
        let ours_var = Var::from_tensor(&init)?;
        let theirs_var = Var::from_tensor(&init)?;
        let params = ParamsAdamW {
            lr: 0.1,
            weight_decay: 0.05,
            ..Default::default()
        };
        let mut ours = AdamW::new(vec![ours_var.clone()], params)?;
        let mut theirs = candle_nn::AdamW::new(
            vec![theirs_var.clone()],
            candle_nn::ParamsAdamW {
                lr: 0.1,
                weight_decay: 0.05,
                ..Default::default()
            },
        )?;
        let grads_for = |var: &Var, scale: f64| -> Result<GradStore> {
            let loss =
                ((var.as_tensor() * scale)?.sqr()?.sum_all()? + var.as_tensor().sum_all()?)?;
            Ok(loss.backward()?)
        };
        for step in 1..=3 {
            ours.step(&grads_for(&ours_var, step as f64)?)?;
            theirs.step(&grads_for(&theirs_var, step as f64)?)?;
        }
        let diff = (ours_var.as_tensor() - theirs_var.as_tensor())?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        // The same f32 operations in the same order: bit for bit.
        assert_eq!(diff, 0.0, "differs from candle's AdamW by {diff}");

        let named = vec![("w".to_string(), ours_var.clone())];
        let state = ours.export_state(&named)?.expect("AdamW exports its state");
        let dir = std::env::temp_dir().join(format!("adabatch-adamw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(crate::error::Error::io(
            crate::error::FileOp::CreateDir,
            dir.clone(),
        ))?;
        let file = dir.join("optimizer.safetensors");
        state.save(&file)?;
        let loaded = OptimizerState::load(&file, &device)?;
        assert_eq!((loaded.kind.as_str(), loaded.step), (KIND, 3));

        // A fresh optimizer on a copy of the weights, restored, steps like the original.
        let copy = Var::from_tensor(&ours_var.as_tensor().copy()?)?;
        // Built under other settings, it refuses the state (its moments were
        // accumulated under the saved ones); under the same, it restores.
        let mut other = AdamW::new(vec![copy.clone()], ParamsAdamW::default())?;
        let refused = other.import_state(&[("w".to_string(), copy.clone())], &loaded);
        assert!(refused.is_err_and(|e| e.to_string().contains("weight_decay = 0.05")));
        let mut restored = AdamW::new(vec![copy.clone()], ParamsAdamW { lr: 1.0, ..params })?;
        restored.import_state(&[("w".to_string(), copy.clone())], &loaded)?;
        ours.step(&grads_for(&ours_var, 4.0)?)?;
        restored.step(&grads_for(&copy, 4.0)?)?;
        let same = (ours_var.as_tensor() - copy.as_tensor())?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(same, 0.0, "a restored AdamW continues bit for bit");
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
