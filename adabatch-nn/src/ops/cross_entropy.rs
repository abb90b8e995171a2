//! Cross-entropy per row of logits, fused, with a backward.
//!
//! A language model's loss runs over `[tokens, vocab]` logits: candle-nn's
//! composite `log_softmax` and a `gather` make about ten passes over them forward
//! and backward, each with a tensor of that size (40 MB for 2,432 tokens of a
//! 4,096-id vocabulary), and took 40 % of a training step of the example decoder
//! on CPU. Here the forward is two passes per row (max, then the sum of
//! exponentials) and the backward one (`softmax − one-hot`, times the row's
//! gradient), on candle's CPU pool. On other devices: the composite.
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::cross_entropy_rows;
//! use candle_core::{Device, Tensor, Var};
//!
//! # fn main() -> candle_core::Result<()> {
//! // Two rows of two classes; the second row's target is ignored (padding).
//! let logits = Var::new(&[[0f32, 0.0], [5.0, 1.0]], &Device::Cpu)?;
//! let targets = Tensor::new(&[1i64, -100], &Device::Cpu)?;
//! let loss = cross_entropy_rows(&logits, &targets, Some(-100))?;
//! let per_row = loss.to_vec1::<f32>()?;
//! assert!((per_row[0] - 2f32.ln()).abs() < 1e-6 && per_row[1] == 0.0);
//! // The gradient is softmax − one-hot on a counted row, zero on an ignored one.
//! let grads = loss.sum_all()?.backward()?;
//! let d = grads.get(&logits).expect("logits have a gradient").to_vec2::<f32>()?;
//! assert_eq!(d, [[0.5, -0.5], [0.0, 0.0]]);
//! # Ok(()) }
//! ```

use candle_core::{D, DType, Result, Shape, Tensor, WithDType, bail};

use super::cpu::{self, Acc};
use super::rows::{self, Apply, CpuInputs, CudaKernel, RowOp};

/// `logsumexp(logits[i]) − logits[i, targets[i]]` for every row `i` of `logits`
/// `[n, classes]`, and 0 where `targets[i]` is `ignore_index`; `targets` `[n]` of
/// any integer dtype. Differentiable in `logits`. Half-precision logits are taken
/// in f32 (as torch's autocast computes the cross-entropy), and the result is f32
/// (f64 for f64 logits). A target outside `0..classes` (other than the ignored
/// one) is an error; on CUDA, with the CUDA bodies on, such a row's loss is NaN
/// instead (the targets stay on the device).
pub fn cross_entropy_rows(
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<i64>,
) -> Result<Tensor> {
    let (n, classes) = logits.dims2()?;
    if targets.dims1()? != n {
        bail!(
            "cross_entropy_rows: {n} rows of logits but targets {:?}",
            targets.dims()
        );
    }
    let logits = match logits.dtype() {
        DType::BF16 | DType::F16 => logits.to_dtype(DType::F32)?,
        _ => logits.clone(),
    };
    let targets = targets.to_dtype(DType::I64)?;
    let op = CrossEntropy {
        ignore_index,
        classes,
    };
    if !rows::runs_fused(&op, logits.device()) {
        return composite(&logits, &targets, ignore_index, classes);
    }
    op.apply([&logits, &targets])
}

/// The fused op on logits of their own dtype. [`cross_entropy_rows`] widens halves
/// to f32 first, so no launcher reaches the f16 and bf16 kernels: the harness's
/// checks run them through this.
#[cfg(all(test, feature = "kernels-on-cpu"))]
pub(crate) fn cross_entropy_rows_unwidened(
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<i64>,
) -> Result<Tensor> {
    let op = CrossEntropy {
        ignore_index,
        classes: logits.dim(1)?,
    };
    op.apply([logits, &targets.to_dtype(DType::I64)?])
}

/// The same with candle ops, which candle differentiates (non-CPU devices, and
/// the tests' reference).
fn composite(
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<i64>,
    classes: usize,
) -> Result<Tensor> {
    let keep = match ignore_index {
        Some(ignore) => targets.ne(ignore)?,
        None => targets.ones_like()?.to_dtype(DType::U8)?,
    };
    let bad = keep
        .where_cond(targets, &targets.zeros_like()?)?
        .to_dtype(DType::F64)?;
    let (low, high) = (bad.min_all()?, bad.max_all()?);
    if low.to_scalar::<f64>()? < 0.0 || high.to_scalar::<f64>()? >= classes as f64 {
        bail!("cross_entropy_rows: a target is outside 0..{classes}");
    }
    let safe = keep.where_cond(targets, &targets.zeros_like()?)?;
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = log_probs.gather(&safe.unsqueeze(1)?, 1)?.squeeze(1)?;
    picked.neg()? * keep.to_dtype(logits.dtype())?
}

/// The fused op: (`logits` `[n, classes]`, `targets` `[n]` i64) -> losses `[n]`.
#[derive(Clone, Copy, Debug)]
struct CrossEntropy {
    ignore_index: Option<i64>,
    classes: usize,
}

impl CrossEntropy {
    /// The targets as row indices, `None` for ignored rows; errors on one out of
    /// range.
    fn rows(&self, targets: &[i64]) -> Result<Vec<Option<usize>>> {
        targets
            .iter()
            .map(|&t| match t {
                t if Some(t) == self.ignore_index => Ok(None),
                t if (0..self.classes as i64).contains(&t) => Ok(Some(t as usize)),
                t => bail!(
                    "cross_entropy_rows: target {t} is outside 0..{}",
                    self.classes
                ),
            })
            .collect()
    }
}

/// `log Σ exp(x)`, from the row's maximum (`x` is not empty).
fn log_sum_exp<T: WithDType, A: Acc>(x: &[T]) -> A {
    let mut max = x[0];
    // SAFETY: `x` holds `x.len()` > 0 elements and `max` is a valid slot; candle's
    // vectorised reduction.
    unsafe { T::vec_reduce_max(x.as_ptr(), &mut max, x.len()) };
    let max = A::of(max);
    let mut sum = A::ZERO;
    for &v in x {
        sum += (A::of(v) - max).exp();
    }
    max + sum.ln()
}

impl RowOp<2> for CrossEntropy {
    fn name(&self) -> &'static str {
        "adabatch-cross-entropy-rows"
    }

    /// On CUDA a target outside `0..classes` gives its row a NaN loss (the
    /// targets are not read back to the host to say which).
    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("cross_entropy", 0.0).ignoring(self.ignore_index))
    }

    /// One loss per row.
    fn shape(&self, dims: &[usize]) -> Shape {
        Shape::from(&dims[..dims.len().saturating_sub(1)])
    }

    /// Per-row losses of the logits (rows of `classes`).
    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [x] = inputs.floats()?;
        let targets = self.rows(inputs.indices(1)?)?;
        let c = self.classes;
        let mut out = vec![T::zero(); targets.len()];
        cpu::for_rows(&mut out, targets.len(), x.len(), |row, out| {
            let Some(target) = targets[row] else { return };
            let x = cpu::row(x, row, c);
            let lse = log_sum_exp::<T, A>(x);
            out[0] = (lse - A::of(x[target])).to();
        });
        Ok(out)
    }

    fn backward(
        &self,
        [logits, targets]: [&Tensor; 2],
        losses: &Tensor,
        grad: &Tensor,
    ) -> Result<[Option<Tensor>; 2]> {
        let losses_and_grads = Tensor::stack(&[losses, &grad.to_dtype(losses.dtype())?], 0)?;
        let dx = CrossEntropyBwd(*self).apply_no_bwd([logits, &losses_and_grads, targets])?;
        Ok([Some(dx), None])
    }
}

/// The backward: (`logits`, `[losses; upstream gradients]` `[2, n]`, `targets`)
/// -> `d logits`.
#[derive(Clone, Copy, Debug)]
struct CrossEntropyBwd(CrossEntropy);

impl RowOp<3> for CrossEntropyBwd {
    fn name(&self) -> &'static str {
        "adabatch-cross-entropy-rows-bwd"
    }

    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("cross_entropy_bwd", 0.0).ignoring(self.0.ignore_index))
    }

    /// `d logits` from the rows' upstream gradients `g` and losses: the softmax
    /// of a row is `exp(x − lse)`, where `lse = loss + x[target]`.
    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [x, losses_and_grads] = inputs.floats()?;
        let targets = self.0.rows(inputs.indices(2)?)?;
        let (losses, g) = losses_and_grads.split_at(targets.len());
        let c = self.0.classes;
        let mut dx = vec![T::zero(); x.len()];
        cpu::for_rows(&mut dx, targets.len(), x.len(), |row, dx| {
            let Some(target) = targets[row] else { return };
            let x = cpu::row(x, row, c);
            let lse = A::of(losses[row]) + A::of(x[target]);
            let g = A::of(g[row]);
            for (dx, &x) in dx.iter_mut().zip(x) {
                *dx = (g * (A::of(x) - lse).exp()).to();
            }
            dx[target] = (A::of(dx[target]) - g).to();
        });
        Ok(dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, assert_finite_differences, assert_grads_match, randn};
    use candle_core::Device;

    /// Logits with a spread, and targets with some rows ignored (-100).
    fn case(n: usize, classes: usize, dtype: DType, seed: u64) -> (Tensor, Tensor) {
        let logits = (randn(&[n, classes], DType::F64, seed) * 3.)
            .and_then(|x| x.to_dtype(dtype))
            .unwrap();
        let targets: Vec<i64> = (0..n)
            .map(|i| {
                if i % 5 == 3 {
                    -100
                } else {
                    ((i * 7 + seed as usize) % classes) as i64
                }
            })
            .collect();
        (logits, Tensor::new(targets, &Device::Cpu).unwrap())
    }

    const SHAPES: &[(usize, usize)] = &[(1, 1), (4, 3), (9, 17), (64, 300), (300, 257)];

    #[test]
    fn every_cuda_body_names_a_kernel_and_has_a_backward() {
        let op = CrossEntropy {
            ignore_index: Some(-100),
            classes: 3,
        };
        for kernel in [op.cuda(), CrossEntropyBwd(op).cuda()] {
            rows::assert_kernel_exists(kernel.expect("a CUDA body"));
        }
    }

    #[test]
    fn forward_equals_the_composite() -> Result<()> {
        for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-13)] {
            for (i, &(n, c)) in SHAPES.iter().enumerate() {
                let (logits, targets) = case(n, c, dtype, i as u64);
                let got = cross_entropy_rows(&logits, &targets, Some(-100))?;
                assert_eq!(got.dtype(), dtype);
                if c == 1 {
                    // One class: certain, a loss of 0.
                    let zero = got.to_dtype(DType::F64)?.abs()?.sum_all()?;
                    assert_eq!(zero.to_scalar::<f64>()?, 0.0);
                    continue;
                }
                let want = composite(&logits, &targets, Some(-100), c)?;
                assert_close(&got, &want, tol, &format!("{dtype:?} [{n}, {c}]"));
            }
        }
        Ok(())
    }

    #[test]
    fn backward_equals_the_composite_and_finite_differences() -> Result<()> {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            for (i, &(n, c)) in SHAPES.iter().enumerate().filter(|(_, s)| s.1 > 1) {
                let (logits, targets) = case(n, c, dtype, 20 + i as u64);
                assert_grads_match(
                    &|t| cross_entropy_rows(&t[0], &targets, Some(-100)),
                    &|t| composite(&t[0], &targets, Some(-100), c),
                    &[logits],
                    tol,
                    &format!("{dtype:?} [{n}, {c}]"),
                )?;
            }
        }
        let (logits, targets) = case(6, 5, DType::F64, 3);
        assert_finite_differences(
            &|t| cross_entropy_rows(&t[0], &targets, Some(-100)),
            &[logits],
            "[6, 5]",
        )
    }

    #[test]
    fn without_an_ignore_index_every_row_counts() -> Result<()> {
        let (logits, _) = case(8, 6, DType::F32, 1);
        let targets = Tensor::new(&[0u32, 1, 2, 3, 4, 5, 0, 1], &Device::Cpu)?;
        let got = cross_entropy_rows(&logits, &targets, None)?;
        let want = composite(&logits, &targets.to_dtype(DType::I64)?, None, 6)?;
        assert_close(&got, &want, 1e-6, "no ignore index");
        assert!(got.to_vec1::<f32>()?.iter().all(|&l| l > 0.0));
        Ok(())
    }

    #[test]
    fn half_logits_give_f32_losses_and_gradients_of_their_dtype() -> Result<()> {
        let (logits, targets) = case(16, 40, DType::BF16, 2);
        let got = cross_entropy_rows(&logits, &targets, Some(-100))?;
        assert_eq!(got.dtype(), DType::F32);
        let want = composite(&logits.to_dtype(DType::F32)?, &targets, Some(-100), 40)?;
        assert_close(&got, &want, 1e-6, "bf16");
        assert_grads_match(
            &|t| cross_entropy_rows(&t[0], &targets, Some(-100)),
            &|t| composite(&t[0].to_dtype(DType::F32)?, &targets, Some(-100), 40),
            &[logits],
            1e-6,
            "bf16",
        )
    }

    #[test]
    fn a_target_out_of_range_is_an_error_not_a_panic() {
        let (logits, _) = case(3, 4, DType::F32, 0);
        for bad in [4i64, -1] {
            let targets = Tensor::new(&[0i64, bad, 1], &Device::Cpu).unwrap();
            let err = cross_entropy_rows(&logits, &targets, Some(-100)).unwrap_err();
            assert!(err.to_string().contains("outside 0..4"), "{err}");
        }
        let short = Tensor::new(&[0i64, 1], &Device::Cpu).unwrap();
        assert!(cross_entropy_rows(&logits, &short, None).is_err());
    }

    #[test]
    fn non_contiguous_logits() -> Result<()> {
        let (logits, targets) = case(7, 9, DType::F64, 4);
        let t = logits.t()?.contiguous()?.t()?;
        assert!(!t.is_contiguous());
        let got = cross_entropy_rows(&t, &targets, Some(-100))?;
        assert_close(
            &got,
            &composite(&logits, &targets, Some(-100), 9)?,
            1e-13,
            "strided",
        );
        Ok(())
    }
}
