//! Softmax over the last dimension, with a backward.
//!
//! On CPU: one fused op with candle-nn's arithmetic, whose backward
//! (`y · (g − Σ g·y)` per row) is a second fused op. On other devices: candle-nn's
//! composite `ops::softmax`, which candle differentiates.
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::softmax_last_dim;
//! use candle_core::{Device, Tensor, Var};
//!
//! # fn main() -> candle_core::Result<()> {
//! let x = Var::new(&[[0f32, 3f32.ln()]], &Device::Cpu)?;
//! let y = softmax_last_dim(&x)?;
//! let p = y.squeeze(0)?.to_vec1::<f32>()?;
//! assert!((p[0] - 0.25).abs() < 1e-6 && (p[1] - 0.75).abs() < 1e-6);
//! // The gradient of y₀ is y₀·(e₀ − y): (3/16, −3/16).
//! let first = Tensor::new(&[[1f32, 0.0]], &Device::Cpu)?;
//! let grads = (y * first)?.sum_all()?.backward()?;
//! let dx = grads.get(&x).expect("x has a gradient").squeeze(0)?.to_vec1::<f32>()?;
//! assert!((dx[0] - 0.1875).abs() < 1e-6 && (dx[1] + 0.1875).abs() < 1e-6);
//! # Ok(()) }
//! ```

use candle_core::{D, Result, Tensor, WithDType};

use super::cpu::{self, Acc};
use super::rows::{self, Apply, CpuInputs, CudaKernel, RowOp};

/// candle-nn's `ops::softmax_last_dim` with a backward.
///
/// On CPU: one fused op, equal to candle-nn's (bf16, f16, f32, f64; like
/// candle-nn's, it sums a bf16 or f16 row in that type). Elsewhere: candle-nn's
/// composite `ops::softmax(x, D::Minus1)`.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if !rows::runs_fused(&SoftmaxOp, x.device()) {
        return candle_nn::ops::softmax(x, D::Minus1);
    }
    // The last dim must exist (candle-nn fails on a scalar the same way).
    x.dim(D::Minus1)?;
    SoftmaxOp.apply([x])
}

/// The fused softmax: `x` -> `y`.
#[derive(Clone, Copy, Debug)]
struct SoftmaxOp;

impl RowOp<1> for SoftmaxOp {
    fn name(&self) -> &'static str {
        "adabatch-softmax-last-dim"
    }

    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("softmax", 0.0))
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [x] = inputs.floats()?;
        let (rows, n) = inputs.rows();
        let mut y = vec![T::zero(); x.len()];
        cpu::for_rows(&mut y, rows, x.len(), |row, y| {
            let x = cpu::row(x, row, n);
            let mut max = x[0];
            // SAFETY: `x` holds `n` > 0 elements (`rows` counts no empty ones) and
            // `max` is a valid slot. candle's own reductions, so that the values
            // are candle-nn's.
            unsafe { T::vec_reduce_max(x.as_ptr(), &mut max, n) };
            for (y, &x) in y.iter_mut().zip(x) {
                *y = A::of(x - max).exp().to();
            }
            let mut sum = T::zero();
            // SAFETY: as above, for `y`.
            unsafe { T::vec_reduce_sum(y.as_ptr(), &mut sum, n) };
            for y in y.iter_mut() {
                *y /= sum;
            }
        });
        Ok(y)
    }

    fn backward(&self, _x: [&Tensor; 1], y: &Tensor, grad: &Tensor) -> Result<[Option<Tensor>; 1]> {
        Ok([Some(SoftmaxBwd.apply_no_bwd([grad, y])?)])
    }
}

/// The softmax's backward: `grad`, `y` -> `dx`.
#[derive(Clone, Copy, Debug)]
struct SoftmaxBwd;

impl RowOp<2> for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "adabatch-softmax-last-dim-bwd"
    }

    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("softmax_bwd", 0.0))
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [g, y] = inputs.floats()?;
        let (rows, n) = inputs.rows();
        let mut dx = vec![T::zero(); g.len()];
        cpu::for_rows(&mut dx, rows, 2 * g.len(), |row, dx| {
            let (g, y) = (cpu::row(g, row, n), cpu::row(y, row, n));
            let dot = cpu::sum8(g, y, y, |g, y, _| A::of(g) * A::of(y));
            for ((dx, &g), &y) in dx.iter_mut().zip(g).zip(y) {
                *dx = (A::of(y) * (A::of(g) - dot)).to();
            }
        });
        Ok(dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{
        assert_close, assert_finite_differences, assert_grads_match, assert_same, randn,
    };
    use candle_core::{DType, Device, Var};

    /// Odd sizes, rows of one, and (the last) one big enough to run on the pool.
    const SHAPES: &[&[usize]] = &[
        &[7],
        &[3, 5, 17],
        &[2, 3, 1],
        &[2, 2, 9, 40],
        &[8, 8, 16, 33],
    ];

    /// Logits with a spread, so that the softmax is not flat.
    fn x_of(dims: &[usize], dtype: DType, seed: u64) -> Tensor {
        (randn(dims, DType::F64, seed) * 3.)
            .and_then(|x| x.to_dtype(dtype))
            .unwrap()
    }

    #[test]
    fn every_cuda_body_names_a_kernel_and_has_a_backward() {
        for kernel in [SoftmaxOp.cuda(), SoftmaxBwd.cuda()] {
            rows::assert_kernel_exists(kernel.expect("a CUDA body"));
        }
    }

    #[test]
    fn forward_equals_candle_nn_bit_for_bit() -> Result<()> {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for (i, dims) in SHAPES.iter().enumerate() {
                let x = x_of(dims, dtype, i as u64);
                let want = candle_nn::ops::softmax_last_dim(&x)?;
                assert_same(
                    &softmax_last_dim(&x)?,
                    &want,
                    &format!("{dtype:?} {dims:?}"),
                );
            }
        }
        Ok(())
    }

    #[test]
    fn non_contiguous_input() -> Result<()> {
        let x = Var::from_tensor(&x_of(&[4, 6, 5], DType::F64, 3))?;
        let xt = x.transpose(1, 2)?;
        assert!(!xt.is_contiguous());
        let want = candle_nn::ops::softmax_last_dim(&xt.contiguous()?)?;
        assert_same(&softmax_last_dim(&xt)?, &want, "forward");
        assert_grads_match(
            &|t| softmax_last_dim(&t[0].transpose(1, 2)?),
            &|t| candle_nn::ops::softmax(&t[0].transpose(1, 2)?, D::Minus1),
            &[x.as_tensor().clone()],
            1e-12,
            "backward",
        )
    }

    #[test]
    fn backward_equals_the_composite() -> Result<()> {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            // Rows of one have a zero gradient: nothing to compare.
            for (i, dims) in SHAPES
                .iter()
                .enumerate()
                .filter(|(_, d)| d[d.len() - 1] > 1)
            {
                assert_grads_match(
                    &|t| softmax_last_dim(&t[0]),
                    &|t| candle_nn::ops::softmax(&t[0], D::Minus1),
                    &[x_of(dims, dtype, 10 + i as u64)],
                    tol,
                    &format!("{dtype:?} {dims:?}"),
                )?;
            }
        }
        Ok(())
    }

    #[test]
    fn bf16_backward_is_close_to_the_composite() -> Result<()> {
        assert_grads_match(
            &|t| softmax_last_dim(&t[0]),
            &|t| candle_nn::ops::softmax(&t[0], D::Minus1),
            &[x_of(&[3, 4, 24], DType::BF16, 4)],
            2e-2,
            "bf16",
        )
    }

    #[test]
    fn backward_equals_finite_differences() -> Result<()> {
        let f = |t: &[Tensor]| softmax_last_dim(&t[0]);
        assert_finite_differences(&f, &[x_of(&[3, 5], DType::F64, 5)], "[3, 5]")?;
        assert_finite_differences(&f, &[x_of(&[2, 2, 4], DType::F64, 6)], "[2, 2, 4]")
    }

    #[test]
    fn rows_of_one_have_a_zero_gradient() -> Result<()> {
        let x = Var::from_tensor(&x_of(&[3, 1], DType::F32, 8))?;
        let y = softmax_last_dim(&x)?;
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![1.; 3]);
        let loss = (y * randn(&[3, 1], DType::F32, 1))?.sum_all()?;
        let grad = loss.backward()?.get(&x).expect("a gradient").clone();
        assert_close(
            &(grad + 1.)?,
            &Tensor::ones((3, 1), DType::F32, &Device::Cpu)?,
            0.,
            "",
        );
        Ok(())
    }

    /// The problem this module solves, so that the tests above mean something.
    #[test]
    fn candle_nn_fused_softmax_stops_gradients() -> Result<()> {
        let x = Var::from_tensor(&x_of(&[2, 4], DType::F32, 1))?;
        let w = randn(&[2, 4], DType::F32, 2);
        let loss = |y: Tensor| (y * &w)?.sum_all();
        let grads = loss(candle_nn::ops::softmax_last_dim(&x)?)?.backward()?;
        assert!(grads.get(&x).is_none());
        assert!(loss(softmax_last_dim(&x)?)?.backward()?.get(&x).is_some());
        Ok(())
    }

    #[test]
    fn bad_inputs_are_errors() {
        let scalar = Tensor::new(1f32, &Device::Cpu).unwrap();
        assert!(softmax_last_dim(&scalar).is_err());
        let ints = Tensor::zeros((2, 3), DType::U32, &Device::Cpu).unwrap();
        let err = softmax_last_dim(&ints).unwrap_err().to_string();
        assert!(err.contains("unsupported dtype"), "{err}");
    }
}
