//! RMS norm and layer norm over the last dimension, with a backward.
//!
//! On CPU each norm is one fused op with candle-nn's arithmetic, and its backward
//! is a second fused op that computes the gradients of `x`, `alpha` (and `beta`) in
//! one pass over the rows. On other devices they are candle-nn's composite
//! `rms_norm_slow` and `layer_norm_slow`, which candle differentiates.
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::rms_norm;
//! use candle_core::{Device, Var};
//!
//! # fn main() -> candle_core::Result<()> {
//! let x = Var::new(&[[3f32, 4.0]], &Device::Cpu)?;
//! let alpha = Var::new(&[1f32, 2.0], &Device::Cpu)?;
//! // mean(x²) = 12.5: each value over its root, times alpha.
//! let y = rms_norm(&x, &alpha, 0.0)?;
//! let rms = 12.5f32.sqrt();
//! let values = y.squeeze(0)?.to_vec1::<f32>()?;
//! assert!((values[0] - 3.0 / rms).abs() < 1e-6 && (values[1] - 8.0 / rms).abs() < 1e-6);
//! // candle-nn's fused `rms_norm` has no backward; this one does: ∂Σy/∂alpha = x / rms.
//! let grads = y.sum_all()?.backward()?;
//! let d_alpha = grads.get(&alpha).expect("alpha has a gradient").to_vec1::<f32>()?;
//! assert!((d_alpha[0] - 3.0 / rms).abs() < 1e-6 && (d_alpha[1] - 4.0 / rms).abs() < 1e-6);
//! # Ok(()) }
//! ```

use candle_core::{D, Module, Result, Shape, Tensor, WithDType, bail};

use super::cpu::{self, Acc};
use super::rows::{self, Apply, CpuInputs, CudaKernel, RowOp};

/// `x / sqrt(mean(x²) + eps) * alpha` over the last dimension; candle-nn's
/// `ops::rms_norm` with a backward (for `x` and `alpha`).
///
/// On CPU: one fused op, equal to candle-nn's (which supports bf16, f16 and f32;
/// this also takes f64). Elsewhere: candle-nn's composite `rms_norm_slow`.
pub fn rms_norm(x: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    check_params("rms-norm", x, &[("alpha", alpha)])?;
    let op = RmsNormOp { eps };
    if !rows::runs_fused(&op, x.device()) {
        return candle_nn::ops::rms_norm_slow(x, alpha, eps);
    }
    op.apply([x, alpha])
}

/// `(x - mean) / sqrt(var + eps) * alpha + beta` over the last dimension;
/// candle-nn's `ops::layer_norm` with a backward (for `x`, `alpha` and `beta`).
///
/// On CPU: one fused op, equal to candle-nn's (which supports bf16, f16 and f32;
/// this also takes f64). Elsewhere: candle-nn's composite `layer_norm_slow`.
pub fn layer_norm(x: &Tensor, alpha: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
    check_params("layer-norm", x, &[("alpha", alpha), ("beta", beta)])?;
    let op = LayerNormOp { eps };
    if !rows::runs_fused(&op, x.device()) {
        return candle_nn::ops::layer_norm_slow(x, alpha, beta, eps);
    }
    op.apply([x, alpha, beta])
}

/// Each parameter must be `[hidden]` (the last dim of `x`) and of `x`'s dtype.
fn check_params(op: &str, x: &Tensor, params: &[(&str, &Tensor)]) -> Result<()> {
    let hidden = x.dim(D::Minus1)?;
    for (name, p) in params {
        if p.dims() != [hidden] {
            bail!(
                "shape mismatch in {op}: x {:?}, {name} {:?} (expected [{hidden}])",
                x.shape(),
                p.shape()
            )
        }
        if p.dtype() != x.dtype() {
            bail!(
                "dtype mismatch in {op}: x is {:?}, {name} is {:?}",
                x.dtype(),
                p.dtype()
            )
        }
    }
    Ok(())
}

/// `sqrt(mean(x²) + eps)` of one row, summed in order as candle-nn does.
fn rms<T: WithDType, A: Acc>(x: &[T], eps: A) -> A {
    let mut sum2 = A::ZERO;
    for &v in x {
        let v = A::of(v);
        sum2 += v * v;
    }
    (sum2 / A::from_usize(x.len()) + eps).sqrt()
}

/// Mean and `1 / sqrt(var + eps)` of one row, with candle-nn's one-pass variance.
fn moments<T: WithDType, A: Acc>(x: &[T], eps: A) -> (A, A) {
    let (mut sum, mut sum2) = (A::ZERO, A::ZERO);
    for &v in x {
        let v = A::of(v);
        sum += v;
        sum2 += v * v;
    }
    let n = A::from_usize(x.len());
    let mean = sum / n;
    let var = sum2 / n - mean * mean;
    (mean, (var + eps).sqrt().recip())
}

/// Mean and `1 / sqrt(var + eps)` of one row, the variance from the deviations
/// (for the backward: more accurate than [`moments`] when the mean is large, and
/// vectorised).
fn moments_two_pass<T: WithDType, A: Acc>(x: &[T], eps: A) -> (A, A) {
    let n = A::from_usize(x.len());
    let mean = cpu::sum8(x, x, x, |x, _, _| A::of(x)) / n;
    let sum2 = cpu::sum8(x, x, x, |x, _, _| (A::of(x) - mean) * (A::of(x) - mean));
    (mean, (sum2 / n + eps).sqrt().recip())
}

/// The fused RMS norm: `x`, `alpha` -> `y`.
#[derive(Clone, Copy, Debug)]
struct RmsNormOp {
    eps: f32,
}

impl RowOp<2> for RmsNormOp {
    fn name(&self) -> &'static str {
        "adabatch-rms-norm"
    }

    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("rms_norm", self.eps))
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [x, alpha] = inputs.floats()?;
        let (rows, n) = inputs.rows();
        let eps = A::from_f32(self.eps);
        let mut y = vec![T::zero(); x.len()];
        cpu::for_rows(&mut y, rows, x.len(), |row, y| {
            let x = cpu::row(x, row, n);
            // Rounded to T before dividing, as candle-nn does.
            let m: T = rms::<T, A>(x, eps).to();
            for ((y, &x), &a) in y.iter_mut().zip(x).zip(alpha) {
                *y = x / m * a;
            }
        });
        Ok(y)
    }

    fn backward(
        &self,
        [x, alpha]: [&Tensor; 2],
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<[Option<Tensor>; 2]> {
        let grads = RmsNormBwd { eps: self.eps }.apply_no_bwd([grad, x, alpha])?;
        Ok(rows::where_tracked(
            [x, alpha],
            rows::split_grads(&grads, x)?,
        ))
    }
}

/// The RMS norm's backward: `grad`, `x`, `alpha` -> `[rows + 1, n]`, the rows of
/// `dx` then `dalpha`.
#[derive(Clone, Copy, Debug)]
struct RmsNormBwd {
    eps: f32,
}

impl RowOp<3> for RmsNormBwd {
    fn name(&self) -> &'static str {
        "adabatch-rms-norm-bwd"
    }

    /// Each row's `1/rms` is left for the column pass that sums `dalpha`.
    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows_then_columns("rms_norm_bwd", self.eps, 1))
    }

    fn shape(&self, dims: &[usize]) -> Shape {
        rows::grads_shape(dims, 1)
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [g, x, alpha] = inputs.floats()?;
        let (rows, n) = inputs.rows();
        let eps = A::from_f32(self.eps);
        let dx_and_dalpha =
            cpu::rows_then_sums::<T, A>(rows, n, n, 2 * x.len(), |row, dx, dalpha| {
                let (g, x) = (cpu::row(g, row, n), cpu::row(x, row, n));
                // Sums vectorised (`sum8`): the backward needs no particular order.
                let sum2 = cpu::sum8(x, x, x, |x, _, _| A::of(x) * A::of(x));
                let r = (sum2 / A::from_usize(n) + eps).sqrt().recip();
                let dot = cpu::sum8(g, x, alpha, |g, x, a| A::of(g) * A::of(a) * A::of(x));
                // d/dx_j of x_j·r·a_j summed against g: r·g_j·a_j − x_j·r³·dot/n.
                let c = r * r * dot / A::from_usize(n);
                let terms = g.iter().zip(x).zip(alpha).zip(dalpha.iter_mut());
                for (dx, (((&g, &x), &a), da)) in dx.iter_mut().zip(terms) {
                    let (g, x) = (A::of(g), A::of(x));
                    *dx = (r * (g * A::of(a) - x * c)).to();
                    *da += g * x * r;
                }
            });
        Ok(dx_and_dalpha)
    }
}

/// The fused layer norm: `x`, `alpha`, `beta` -> `y`.
#[derive(Clone, Copy, Debug)]
struct LayerNormOp {
    eps: f32,
}

impl RowOp<3> for LayerNormOp {
    fn name(&self) -> &'static str {
        "adabatch-layer-norm"
    }

    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("layer_norm", self.eps))
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [x, alpha, beta] = inputs.floats()?;
        let (rows, n) = inputs.rows();
        let eps = A::from_f32(self.eps);
        let mut y = vec![T::zero(); x.len()];
        cpu::for_rows(&mut y, rows, x.len(), |row, y| {
            let x = cpu::row(x, row, n);
            let (mean, inv_std) = moments::<T, A>(x, eps);
            for ((y, &x), (&a, &b)) in y.iter_mut().zip(x).zip(alpha.iter().zip(beta)) {
                *y = ((A::of(x) - mean) * inv_std * A::of(a) + A::of(b)).to();
            }
        });
        Ok(y)
    }

    fn backward(
        &self,
        [x, alpha, beta]: [&Tensor; 3],
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<[Option<Tensor>; 3]> {
        let grads = LayerNormBwd { eps: self.eps }.apply_no_bwd([grad, x, alpha])?;
        Ok(rows::where_tracked(
            [x, alpha, beta],
            rows::split_grads(&grads, x)?,
        ))
    }
}

/// The layer norm's backward: `grad`, `x`, `alpha` -> `[rows + 2, n]`, the rows of
/// `dx`, then `dalpha`, then `dbeta`.
#[derive(Clone, Copy, Debug)]
struct LayerNormBwd {
    eps: f32,
}

impl RowOp<3> for LayerNormBwd {
    fn name(&self) -> &'static str {
        "adabatch-layer-norm-bwd"
    }

    /// Each row's mean and `1/std` are left for the column pass that sums
    /// `dalpha` and `dbeta`.
    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows_then_columns("layer_norm_bwd", self.eps, 2))
    }

    fn shape(&self, dims: &[usize]) -> Shape {
        rows::grads_shape(dims, 2)
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [g, x, alpha] = inputs.floats()?;
        let (rows, n) = inputs.rows();
        let eps = A::from_f32(self.eps);
        let grads = cpu::rows_then_sums::<T, A>(rows, n, 2 * n, 2 * x.len(), |row, dx, dparams| {
            let (dalpha, dbeta) = dparams.split_at_mut(n);
            let (g, x) = (cpu::row(g, row, n), cpu::row(x, row, n));
            let (mean, inv_std) = moments_two_pass::<T, A>(x, eps);
            let sum_ga = cpu::sum8(g, alpha, alpha, |g, a, _| A::of(g) * A::of(a));
            let sum_gax = cpu::sum8(g, x, alpha, |g, x, a| {
                A::of(g) * A::of(a) * (A::of(x) - mean) * inv_std
            });
            let n_a = A::from_usize(n);
            let (mean_ga, mean_gax) = (sum_ga / n_a, sum_gax / n_a);
            let terms = g
                .iter()
                .zip(x)
                .zip(alpha)
                .zip(dalpha.iter_mut().zip(dbeta.iter_mut()));
            for (dx, (((&g, &x), &a), (da, db))) in dx.iter_mut().zip(terms) {
                let (g, xhat) = (A::of(g), (A::of(x) - mean) * inv_std);
                *dx = (inv_std * (g * A::of(a) - mean_ga - xhat * mean_gax)).to();
                *da += g * xhat;
                *db += g;
            }
        });
        Ok(grads)
    }
}

/// candle-nn's `RmsNorm`, trainable.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// A norm with this `weight` (shape `[hidden]`).
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps }
    }

    /// A `weight` of `size` ones under `vb` (candle-nn's `rms_norm`).
    pub fn load(size: usize, eps: f64, vb: candle_nn::VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.))?;
        Ok(Self::new(weight, eps))
    }

    /// The scale, `[hidden]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon added to the variance.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm(x, &self.weight, self.eps as f32)
    }
}

/// candle-nn's `LayerNorm` (weight and optional bias), trainable.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Option<Tensor>,
    eps: f64,
}

impl LayerNorm {
    /// A norm with this `weight` and `bias` (shape `[hidden]` each).
    pub fn new(weight: Tensor, bias: Tensor, eps: f64) -> Self {
        Self {
            weight,
            bias: Some(bias),
            eps,
        }
    }

    /// A norm with a `weight` and no bias.
    pub fn new_no_bias(weight: Tensor, eps: f64) -> Self {
        Self {
            weight,
            bias: None,
            eps,
        }
    }

    /// `weight` (ones) and `bias` (zeros) of `size` under `vb` (candle-nn's
    /// `layer_norm` with `LayerNormConfig::default()`'s affine layout).
    pub fn load(size: usize, eps: f64, vb: candle_nn::VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.))?;
        let bias = vb.get_with_hints(size, "bias", candle_nn::Init::Const(0.))?;
        Ok(Self::new(weight, bias, eps))
    }

    /// The scale, `[hidden]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The shift, `[hidden]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The epsilon added to the variance.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(bias) => layer_norm(x, &self.weight, bias, self.eps as f32),
            None => {
                let zeros = self.weight.zeros_like()?;
                layer_norm(x, &self.weight, &zeros, self.eps as f32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{
        assert_close, assert_finite_differences, assert_grads_match, assert_same, grads, randn,
        rel_err,
    };
    use candle_core::{DType, Device, Var};

    /// Odd sizes, a single row, rows of one and two, and (the last) one big enough
    /// to run on the pool.
    const SHAPES: &[&[usize]] = &[
        &[1, 7],
        &[3, 5, 17],
        &[2, 33, 64],
        &[4, 1, 1],
        &[3, 2],
        &[8, 64, 96],
    ];

    /// Inputs whose rows have a non-zero mean, as activations do.
    fn x_of(dims: &[usize], dtype: DType, seed: u64) -> Tensor {
        (randn(dims, DType::F64, seed) + 0.5)
            .and_then(|x| x.to_dtype(dtype))
            .unwrap()
    }

    fn params(n: usize, dtype: DType) -> (Tensor, Tensor) {
        (randn(&[n], dtype, 11), randn(&[n], dtype, 12))
    }

    #[test]
    fn every_cuda_body_names_a_kernel_and_has_a_backward() {
        let eps = 1e-5;
        for kernel in [
            RmsNormOp { eps }.cuda(),
            RmsNormBwd { eps }.cuda(),
            LayerNormOp { eps }.cuda(),
            LayerNormBwd { eps }.cuda(),
        ] {
            rows::assert_kernel_exists(kernel.expect("a CUDA body"));
        }
    }

    #[test]
    fn forward_equals_candle_nn_bit_for_bit() -> Result<()> {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (i, dims) in SHAPES.iter().enumerate() {
                let x = x_of(dims, dtype, i as u64);
                let (alpha, beta) = params(*dims.last().unwrap(), dtype);
                let what = format!("{dtype:?} {dims:?}");
                let want = candle_nn::ops::rms_norm(&x, &alpha, 1e-5)?;
                assert_same(&rms_norm(&x, &alpha, 1e-5)?, &want, &format!("rms {what}"));
                let want = candle_nn::ops::layer_norm(&x, &alpha, &beta, 1e-5)?;
                let got = layer_norm(&x, &alpha, &beta, 1e-5)?;
                assert_same(&got, &want, &format!("layer {what}"));
            }
        }
        Ok(())
    }

    /// candle-nn's fused norms have no f64 kernel: hold f64 to the composites.
    #[test]
    fn f64_forward_equals_the_composites() -> Result<()> {
        for (i, dims) in SHAPES.iter().enumerate() {
            let x = x_of(dims, DType::F64, i as u64);
            let (alpha, beta) = params(*dims.last().unwrap(), DType::F64);
            let want = candle_nn::ops::rms_norm_slow(&x, &alpha, 1e-5)?;
            assert_close(&rms_norm(&x, &alpha, 1e-5)?, &want, 1e-14, "rms");
            let want = candle_nn::ops::layer_norm_slow(&x, &alpha, &beta, 1e-5)?;
            assert_close(&layer_norm(&x, &alpha, &beta, 1e-5)?, &want, 1e-13, "layer");
        }
        Ok(())
    }

    #[test]
    fn non_contiguous_input() -> Result<()> {
        let x = x_of(&[6, 16, 5], DType::F32, 3).transpose(1, 2)?;
        assert!(!x.is_contiguous());
        let (alpha, beta) = params(16, DType::F32);
        let want = candle_nn::ops::rms_norm(&x.contiguous()?, &alpha, 1e-6)?;
        assert_same(&rms_norm(&x, &alpha, 1e-6)?, &want, "rms");
        let want = candle_nn::ops::layer_norm(&x.contiguous()?, &alpha, &beta, 1e-6)?;
        assert_same(&layer_norm(&x, &alpha, &beta, 1e-6)?, &want, "layer");
        Ok(())
    }

    #[test]
    fn backward_equals_the_composites() -> Result<()> {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            // Rows of one or two: f32 has no 1e-5 to give (`ill_conditioned_rows`).
            for (i, dims) in SHAPES
                .iter()
                .enumerate()
                .filter(|(_, d)| d[d.len() - 1] > 2)
            {
                let x = x_of(dims, dtype, 20 + i as u64);
                let (alpha, beta) = params(*dims.last().unwrap(), dtype);
                let what = format!("{dtype:?} {dims:?}");
                assert_grads_match(
                    &|t| rms_norm(&t[0], &t[1], 1e-5),
                    &|t| candle_nn::ops::rms_norm_slow(&t[0], &t[1], 1e-5),
                    &[x.clone(), alpha.clone()],
                    tol,
                    &format!("rms {what}"),
                )?;
                assert_grads_match(
                    &|t| layer_norm(&t[0], &t[1], &t[2], 1e-5),
                    &|t| candle_nn::ops::layer_norm_slow(&t[0], &t[1], &t[2], 1e-5),
                    &[x, alpha, beta],
                    tol,
                    &format!("layer {what}"),
                )?;
            }
        }
        Ok(())
    }

    /// Rows of one or two elements: the gradients are differences of terms up to 10⁵
    /// times larger. In f64 the two implementations agree; in f32 ours is about as
    /// far from the f64 gradient as the composite's.
    #[test]
    fn ill_conditioned_rows() -> Result<()> {
        type Norm = fn(&[Tensor]) -> Result<Tensor>;
        let cases: [(&[usize], Norm, Norm); 3] = [
            (
                &[4, 1, 1],
                |t| rms_norm(&t[0], &t[1], 1e-5),
                |t| candle_nn::ops::rms_norm_slow(&t[0], &t[1], 1e-5),
            ),
            (
                &[3, 2],
                |t| rms_norm(&t[0], &t[1], 1e-5),
                |t| candle_nn::ops::rms_norm_slow(&t[0], &t[1], 1e-5),
            ),
            (
                &[3, 2],
                |t| layer_norm(&t[0], &t[1], &t[2], 1e-5),
                |t| candle_nn::ops::layer_norm_slow(&t[0], &t[1], &t[2], 1e-5),
            ),
        ];
        for (i, (dims, ours, composite)) in cases.into_iter().enumerate() {
            let x = x_of(dims, DType::F64, 24);
            let (alpha, beta) = params(*dims.last().unwrap(), DType::F64);
            let inputs = [vec![x, alpha], if i == 2 { vec![beta] } else { vec![] }].concat();
            assert_grads_match(&ours, &composite, &inputs, 1e-9, &format!("f64 {dims:?}"))?;
            let truth = grads(&ours, &inputs, 99)?;
            let f32s: Vec<Tensor> = inputs
                .iter()
                .map(|t| t.to_dtype(DType::F32))
                .collect::<Result<_>>()?;
            let (got, reference) = (grads(&ours, &f32s, 99)?, grads(&composite, &f32s, 99)?);
            for (j, truth) in truth.iter().enumerate() {
                let what = format!("f32 {dims:?} input {j}");
                let err = rel_err(&got[j], truth, &what);
                let reference_err = rel_err(&reference[j], truth, &what);
                assert!(
                    err <= 4. * reference_err + 1e-6,
                    "{what}: {err:e} vs {reference_err:e}"
                );
            }
        }
        Ok(())
    }

    /// bf16 gradients are computed in f32 and rounded once: close to the composite's.
    #[test]
    fn bf16_backward_is_close_to_the_composites() -> Result<()> {
        let x = x_of(&[4, 9, 48], DType::BF16, 5);
        let (alpha, beta) = params(48, DType::BF16);
        assert_grads_match(
            &|t| rms_norm(&t[0], &t[1], 1e-5),
            &|t| candle_nn::ops::rms_norm_slow(&t[0], &t[1], 1e-5),
            &[x.clone(), alpha.clone()],
            2e-2,
            "rms",
        )?;
        assert_grads_match(
            &|t| layer_norm(&t[0], &t[1], &t[2], 1e-5),
            &|t| candle_nn::ops::layer_norm_slow(&t[0], &t[1], &t[2], 1e-5),
            &[x, alpha, beta],
            2e-2,
            "layer",
        )
    }

    #[test]
    fn backward_equals_finite_differences() -> Result<()> {
        for dims in [&[3, 5][..], &[2, 2, 7]] {
            let x = x_of(dims, DType::F64, 31);
            let (alpha, beta) = params(*dims.last().unwrap(), DType::F64);
            // A large eps keeps the curvature, and so the finite-difference error, small.
            let f = |t: &[Tensor]| rms_norm(&t[0], &t[1], 0.1);
            assert_finite_differences(&f, &[x.clone(), alpha.clone()], "rms")?;
            let f = |t: &[Tensor]| layer_norm(&t[0], &t[1], &t[2], 0.1);
            assert_finite_differences(&f, &[x, alpha, beta], "layer")?;
        }
        Ok(())
    }

    /// `sum(y)` hands the backward a broadcast (stride 0) gradient.
    #[test]
    fn backward_takes_a_broadcast_gradient() -> Result<()> {
        let x = Var::from_tensor(&x_of(&[3, 8], DType::F64, 41))?;
        let alpha = Var::from_tensor(&params(8, DType::F64).0)?;
        let got = rms_norm(&x, &alpha, 1e-5)?.sum_all()?.backward()?;
        let want = candle_nn::ops::rms_norm_slow(&x, &alpha, 1e-5)?
            .sum_all()?
            .backward()?;
        for t in [x.as_tensor(), alpha.as_tensor()] {
            assert_close(got.get(t).unwrap(), want.get(t).unwrap(), 1e-12, "sum");
        }
        Ok(())
    }

    /// The problem this module solves, so that the tests above mean something.
    #[test]
    fn candle_nn_fused_norms_stop_gradients() -> Result<()> {
        let x = Var::from_tensor(&x_of(&[2, 4], DType::F32, 1))?;
        let alpha = Var::from_tensor(&params(4, DType::F32).0)?;
        let grads = candle_nn::ops::rms_norm(&x, &alpha, 1e-5)?
            .sum_all()?
            .backward()?;
        assert!(grads.get(&alpha).is_none() && grads.get(&x).is_none());
        let grads = rms_norm(&x, &alpha, 1e-5)?.sum_all()?.backward()?;
        assert!(grads.get(&alpha).is_some() && grads.get(&x).is_some());
        Ok(())
    }

    #[test]
    fn mismatched_inputs_are_errors() {
        let x = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
        let a4 = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
        let a5 = Tensor::ones(5, DType::F32, &Device::Cpu).unwrap();
        let a44 = Tensor::ones((4, 4), DType::F32, &Device::Cpu).unwrap();
        let f64s = Tensor::ones(4, DType::F64, &Device::Cpu).unwrap();
        let message = |r: Result<Tensor>| r.unwrap_err().to_string();
        assert!(message(rms_norm(&x, &a5, 1e-5)).contains("shape mismatch in rms-norm"));
        assert!(message(rms_norm(&x, &a44, 1e-5)).contains("shape mismatch in rms-norm"));
        assert!(message(rms_norm(&x, &f64s, 1e-5)).contains("dtype mismatch in rms-norm"));
        let err = message(layer_norm(&x, &a4, &a5, 1e-5));
        assert!(err.contains("shape mismatch in layer-norm") && err.contains("beta"));
        let ints = Tensor::zeros((2, 4), DType::U32, &Device::Cpu).unwrap();
        let int_alpha = Tensor::ones(4, DType::U32, &Device::Cpu).unwrap();
        assert!(message(rms_norm(&ints, &int_alpha, 1e-5)).contains("unsupported dtype"));
    }

    #[test]
    fn empty_rows() -> Result<()> {
        let x = Var::from_tensor(&Tensor::zeros((0, 6), DType::F32, &Device::Cpu)?)?;
        let alpha = Var::from_tensor(&params(6, DType::F32).0)?;
        let y = rms_norm(&x, &alpha, 1e-5)?;
        assert_eq!(y.dims(), &[0, 6]);
        let grads = y.sum_all()?.backward()?;
        assert_eq!(grads.get(&alpha).unwrap().to_vec1::<f32>()?, vec![0f32; 6]);
        Ok(())
    }

    /// The modules run the functions, and their parameters get gradients.
    #[test]
    fn modules_train_their_parameters() -> Result<()> {
        let varmap = candle_nn::VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let rms = RmsNorm::load(8, 1e-6, vb.pp("rms"))?;
        let ln = LayerNorm::load(8, 1e-5, vb.pp("ln"))?;
        let no_bias = LayerNorm::new_no_bias(rms.weight().clone(), 1e-5);
        let x = x_of(&[3, 8], DType::F32, 9);
        let want = rms_norm(&x, rms.weight(), 1e-6)?;
        assert_same(&rms.forward(&x)?, &want, "RmsNorm");
        let zeros = Tensor::zeros(8, DType::F32, &Device::Cpu)?;
        let want = layer_norm(&x, no_bias.weight(), &zeros, 1e-5)?;
        assert_same(&no_bias.forward(&x)?, &want, "LayerNorm without bias");
        let y = ln.forward(&rms.forward(&x)?)?;
        let grads = (y * randn(&[3, 8], DType::F32, 2))?.sum_all()?.backward()?;
        for var in varmap.all_vars() {
            let grad = grads.get(var.as_tensor()).expect("a gradient");
            assert!(grad.abs()?.sum_all()?.to_scalar::<f32>()? > 0.);
        }
        assert_eq!(varmap.all_vars().len(), 3);
        Ok(())
    }
}
