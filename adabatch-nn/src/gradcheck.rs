//! Checking a model's gradients against finite differences, as
//! `torch.autograd.gradcheck` does: the gradient that backpropagation computes for
//! each parameter against central differences of the loss, in f64.
//!
//! The engine's coverage guard stops a run in which a parameter gets *no*
//! gradient. A gradient that is only *partly* cut passes it: a parameter reached by
//! two paths, one of them through a fused op without a backward (candle-nn's ropes
//! in a Phi-style partial rotary embedding: `q_proj` still gets a gradient through
//! the unrotated half), trains on with wrong gradients, silently. Only a
//! comparison with the loss itself sees that.
//!
//! Per parameter `p` the check draws seeded random unit directions `v` (the
//! "fast mode" of `gradcheck`: two forwards per direction, not two per element) and
//! compares the analytic directional derivative `⟨∇p L, v⟩` with
//! `(L(p + εv) − L(p − εv)) / 2ε`.
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::{check_gradients, GradCheckOptions};
//! use candle_core::{DType, Device, Tensor, Var};
//!
//! # fn main() -> candle_core::Result<()> {
//! let w = Var::randn(0f64, 1.0, (3, 2), &Device::Cpu)?;
//! let x = Tensor::randn(0f64, 1.0, (4, 3), &Device::Cpu)?;
//! let params = vec![("w".to_string(), w.clone())];
//! let report = check_gradients(&params, || x.matmul(w.as_tensor())?.tanh()?.sum_all(), &GradCheckOptions::default())?;
//! assert!(report.passed(), "{report}");
//! # Ok(()) }
//! ```

use std::fmt;

use candle_core::{DType, Result, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Settings of [`check_gradients`]. The defaults suit a tiny model in f64.
#[derive(Clone, Debug, PartialEq)]
pub struct GradCheckOptions {
    /// Step of the central difference along a unit direction (default `1e-6`).
    pub eps: f64,
    /// Relative tolerance (default `1e-4`): a direction passes when
    /// `|analytic − numeric| ≤ atol + rtol · max(|analytic|, |numeric|)`.
    pub rtol: f64,
    /// Absolute tolerance (default `1e-6`), for derivatives near zero.
    pub atol: f64,
    /// Random directions per parameter (default 2).
    pub directions: usize,
    /// Seed of the directions (default 0).
    pub seed: u64,
}

impl Default for GradCheckOptions {
    fn default() -> Self {
        Self {
            eps: 1e-6,
            rtol: 1e-4,
            atol: 1e-6,
            directions: 2,
            seed: 0,
        }
    }
}

/// One parameter's outcome: its worst direction.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamCheck {
    /// The parameter's name.
    pub name: String,
    /// Whether backpropagation gave it a gradient at all (without one, the
    /// analytic derivative is taken as 0).
    pub has_gradient: bool,
    /// `⟨∇L, v⟩` from backpropagation, on the worst direction.
    pub analytic: f64,
    /// The central difference on the same direction.
    pub numeric: f64,
    /// Whether every direction agreed within the tolerances.
    pub passed: bool,
}

impl ParamCheck {
    /// `|analytic − numeric| / max(|analytic|, |numeric|)` (0 when both are 0).
    pub fn relative_error(&self) -> f64 {
        relative_error(self.analytic, self.numeric)
    }
}

/// The outcome of [`check_gradients`], one entry per parameter in the order given.
/// Its `Display` names the parameters that fail, with their derivatives.
#[derive(Clone, Debug, PartialEq)]
pub struct GradCheck {
    /// Every parameter's outcome.
    pub params: Vec<ParamCheck>,
}

impl GradCheck {
    /// Whether every parameter passed.
    pub fn passed(&self) -> bool {
        self.params.iter().all(|p| p.passed)
    }

    /// The parameters whose gradients disagree with the finite differences.
    pub fn failures(&self) -> impl Iterator<Item = &ParamCheck> {
        self.params.iter().filter(|p| !p.passed)
    }
}

impl fmt::Display for GradCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed: Vec<&ParamCheck> = self.failures().collect();
        if failed.is_empty() {
            return write!(
                f,
                "gradient check: all {} parameters agree with finite differences",
                self.params.len()
            );
        }
        write!(
            f,
            "gradient check: {} of {} parameters disagree with finite differences:",
            failed.len(),
            self.params.len()
        )?;
        for p in failed {
            let note = if p.has_gradient { "" } else { " (no gradient)" };
            write!(
                f,
                "\n  {}{note}: backprop {:.6e}, finite differences {:.6e} (relative error {:.2e})",
                p.name,
                p.analytic,
                p.numeric,
                p.relative_error()
            )?;
        }
        Ok(())
    }
}

/// Compares the gradient of `loss` (a closure computing a scalar from the current
/// parameter values, e.g. `|| model.per_example_loss(&batch)?.sum_all()`) with
/// respect to each of `params` against central finite differences.
///
/// The parameters must be f64 (build the model with `DType::F64`: in f32 the
/// differences drown in rounding) and `loss` must be deterministic (no dropout).
/// The parameters hold their values again when it returns, whatever the outcome.
/// Errors: a parameter that is not f64, a loss that is not a scalar, or a failing
/// forward; a disagreement is not an error but a failed [`GradCheck`].
pub fn check_gradients<F>(
    params: &[(String, Var)],
    loss: F,
    options: &GradCheckOptions,
) -> Result<GradCheck>
where
    F: Fn() -> Result<Tensor>,
{
    for (name, var) in params {
        if var.dtype() != DType::F64 {
            candle_core::bail!(
                "check_gradients: parameter `{name}` is {:?}; the check needs f64 parameters (build the model with DType::F64)",
                var.dtype()
            );
        }
    }
    let value = |loss: &Tensor| -> Result<f64> {
        if loss.rank() != 0 {
            candle_core::bail!(
                "check_gradients: the loss has shape {:?}, not a scalar (sum or average it)",
                loss.dims()
            );
        }
        loss.to_dtype(DType::F64)?.to_scalar::<f64>()
    };
    let at_start = loss()?;
    value(&at_start)?;
    let grads = at_start.backward()?;
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
    let mut checks = Vec::with_capacity(params.len());
    for (name, var) in params {
        let grad = grads.get(var.as_tensor());
        let mut worst: Option<(f64, f64, bool)> = None;
        for _ in 0..options.directions.max(1) {
            let direction = unit_direction(var, &mut rng)?;
            let analytic = match grad {
                Some(g) => (g.to_dtype(DType::F64)? * &direction)?
                    .sum_all()?
                    .to_scalar::<f64>()?,
                None => 0.0,
            };
            let numeric = central_difference(var, &direction, options.eps, || value(&loss()?))?;
            let passed = (analytic - numeric).abs()
                <= options.atol + options.rtol * analytic.abs().max(numeric.abs());
            let error = relative_error(analytic, numeric);
            if worst.is_none_or(|(a, n, _)| error > relative_error(a, n)) {
                worst = Some((analytic, numeric, passed));
            }
            if !passed {
                worst = Some((analytic, numeric, false));
                break;
            }
        }
        let (analytic, numeric, passed) = worst.unwrap_or((0.0, 0.0, true));
        checks.push(ParamCheck {
            name: name.clone(),
            has_gradient: grad.is_some(),
            analytic,
            numeric,
            passed,
        });
    }
    Ok(GradCheck { params: checks })
}

/// A seeded standard-normal direction of `var`'s shape, scaled to unit norm.
fn unit_direction(var: &Var, rng: &mut ChaCha8Rng) -> Result<Tensor> {
    let n = var.elem_count();
    let values: Vec<f64> = (0..n).map(|_| StandardNormal.sample(rng)).collect();
    let norm = values
        .iter()
        .map(|v| v * v)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    let values: Vec<f64> = values.into_iter().map(|v| v / norm).collect();
    Tensor::from_vec(values, var.shape(), var.device())
}

/// `(L(p + εv) − L(p − εv)) / 2ε`, restoring `p` afterwards (also on error).
fn central_difference(
    var: &Var,
    direction: &Tensor,
    eps: f64,
    loss: impl Fn() -> Result<f64>,
) -> Result<f64> {
    let original = var.as_tensor().copy()?;
    let at = |sign: f64| -> Result<f64> {
        var.set(&(&original + (direction * (sign * eps))?)?)?;
        loss()
    };
    let outcome = at(1.0).and_then(|plus| Ok((plus - at(-1.0)?) / (2.0 * eps)));
    var.set(&original)?;
    outcome
}

fn relative_error(a: f64, b: f64) -> f64 {
    let scale = a.abs().max(b.abs());
    if scale == 0.0 {
        0.0
    } else {
        (a - b).abs() / scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn setup() -> Result<(Var, Var, Tensor)> {
        let w = Var::randn(0f64, 1.0, (3, 2), &Device::Cpu)?;
        let b = Var::randn(0f64, 1.0, 2, &Device::Cpu)?;
        let x = Tensor::randn(0f64, 1.0, (5, 3), &Device::Cpu)?;
        Ok((w, b, x))
    }

    #[test]
    fn a_differentiable_loss_passes_and_parameters_are_restored() -> Result<()> {
        let (w, b, x) = setup()?;
        let before = w.as_tensor().to_vec2::<f64>()?;
        let params = vec![("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
        let loss = || {
            x.matmul(w.as_tensor())?
                .broadcast_add(b.as_tensor())?
                .tanh()?
                .sqr()?
                .sum_all()
        };
        let report = check_gradients(&params, loss, &GradCheckOptions::default())?;
        assert!(report.passed(), "{report}");
        assert!(
            report
                .params
                .iter()
                .all(|p| p.analytic != 0.0 && p.relative_error() < 1e-6)
        );
        assert_eq!(w.as_tensor().to_vec2::<f64>()?, before);
        Ok(())
    }

    /// A path through a detached copy is a partly cut gradient: `w` still gets
    /// one through the other path, but not the whole.
    #[test]
    fn a_partly_cut_gradient_fails_naming_the_parameter() -> Result<()> {
        let (w, b, x) = setup()?;
        let params = vec![("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
        let loss = || {
            let whole = x.matmul(w.as_tensor())?;
            let cut = x.matmul(&w.as_tensor().detach())?.sqr()?;
            (whole + cut)?
                .broadcast_add(b.as_tensor())?
                .tanh()?
                .sum_all()
        };
        let report = check_gradients(&params, loss, &GradCheckOptions::default())?;
        let failed: Vec<&str> = report.failures().map(|p| p.name.as_str()).collect();
        assert_eq!(failed, ["w"], "{report}");
        assert!(report.to_string().contains("1 of 2 parameters disagree"));
        Ok(())
    }

    #[test]
    fn a_parameter_without_a_gradient_fails_and_f32_is_refused() -> Result<()> {
        let (w, b, x) = setup()?;
        let params = vec![("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
        let loss = || {
            (x.matmul(&w.as_tensor().detach())?
                .broadcast_add(b.as_tensor()))?
            .sum_all()
        };
        let report = check_gradients(&params, loss, &GradCheckOptions::default())?;
        assert!(report.to_string().contains("w (no gradient)"), "{report}");
        let w32 = Var::zeros((2, 2), DType::F32, &Device::Cpu)?;
        let err = check_gradients(
            &[("w32".into(), w32.clone())],
            || w32.sum_all(),
            &GradCheckOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("`w32` is F32"), "{err}");
        let err = check_gradients(
            &[("w".into(), w.clone())],
            || Ok(w.as_tensor().clone()),
            &GradCheckOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("not a scalar"), "{err}");
        Ok(())
    }
}
