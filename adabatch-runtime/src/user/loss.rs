//! Per-example losses for [`TrainModel::per_example_loss`](crate::TrainModel).
//!
//! candle-nn's `loss::cross_entropy` returns the *batch mean*, one scalar. The engine
//! needs one loss per example (it weights and sums them across ranks itself), so
//! these keep the batch dimension:
//!
//! - [`per_example_cross_entropy`]: classifiers, `[batch, classes]` logits, one
//!   loss per example;
//! - [`per_example_token_cross_entropy_sum`]: language models, `[batch, len, vocab]`
//!   logits and a padding mask, the *sum* of each example's token losses (what
//!   `reweight = token_count` expects);
//! - [`per_example_token_cross_entropy`]: the same with Hugging Face's
//!   `ignore_index` labels (`-100`), each example's sum or mean over its tokens;
//!   [`count_target_tokens`] counts what carries loss, for `Batch::num_tokens`.

use candle_core::{DType, Result, Tensor};

use adabatch_nn::cross_entropy_rows;

/// Cross-entropy of every example: `logits` `[batch, classes]` (unnormalised),
/// `targets` `[batch]` class ids (`u32`, `u8` or `i64`); returns `[batch]`, entry
/// `i` = `-log softmax(logits[i])[targets[i]]`.
///
/// The class dimension is normalised by a log-softmax and then *indexed*, not
/// averaged: the result is the negative log-likelihood of the target class, as in
/// PyTorch's `cross_entropy(..., reduction="none")`.
pub fn per_example_cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (batch, _classes) = logits.dims2()?;
    let target_batch = targets.dims1()?;
    if target_batch != batch {
        candle_core::bail!(
            "per_example_cross_entropy: {batch} rows of logits but {target_batch} targets"
        );
    }
    cross_entropy_rows(logits, targets, None)
}

/// Per-example sum of token cross-entropies, for language models: `logits`
/// `[batch, len, vocab]`, `targets` `[batch, len]` token ids, `mask` `[batch, len]`
/// (1 for tokens that carry loss, 0 for padding; any float dtype); returns
/// `[batch]`, entry `i` = `Σ_t mask[i, t] · -log softmax(logits[i, t])[targets[i, t]]`.
///
/// A sum, not a mean: with `reweight = token_count` the engine divides by the
/// global token count (`Batch::num_tokens`), so every token weighs the same across
/// examples and ranks.
pub fn per_example_token_cross_entropy_sum(
    logits: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
) -> Result<Tensor> {
    let (batch, len, _vocab) = logits.dims3()?;
    for (name, tensor) in [("targets", targets), ("mask", mask)] {
        let dims = tensor.dims2()?;
        if dims != (batch, len) {
            candle_core::bail!(
                "per_example_token_cross_entropy_sum: logits are [{batch}, {len}, _] but {name} is {:?}",
                tensor.dims()
            );
        }
    }
    let nll = token_losses(logits, targets, None)?;
    let mask = mask.to_dtype(nll.dtype())?;
    (nll * mask)?.sum(1)
}

/// How [`per_example_token_cross_entropy`] reduces an example's token losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenReduction {
    /// The sum over its target tokens (for `reweight = token_count`: every token
    /// of the global batch then weighs the same).
    Sum,
    /// The mean over its target tokens (each example weighs the same; 0 for an
    /// example without target tokens).
    Mean,
}

/// Per-example token cross-entropy with an ignore index: `logits`
/// `[batch, len, vocab]`, `targets` `[batch, len]` token ids (`u32` or `i64`);
/// positions whose target is `ignore_index` (Hugging Face's `-100`) carry no loss.
/// Returns `[batch]`, each example's sum or mean over its other tokens.
pub fn per_example_token_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<i64>,
    reduction: TokenReduction,
) -> Result<Tensor> {
    let (batch, len, _vocab) = logits.dims3()?;
    if targets.dims2()? != (batch, len) {
        candle_core::bail!(
            "per_example_token_cross_entropy: logits are [{batch}, {len}, _] but targets are {:?}",
            targets.dims()
        );
    }
    // Ignored positions have a loss of 0.
    let sums = token_losses(logits, targets, ignore_index)?.sum(1)?;
    match reduction {
        TokenReduction::Sum => Ok(sums),
        TokenReduction::Mean => {
            let targets = targets.to_dtype(DType::I64)?;
            let counted = match ignore_index {
                Some(ignore) => targets.ne(ignore)?.to_dtype(sums.dtype())?.sum(1)?,
                None => targets.ones_like()?.to_dtype(sums.dtype())?.sum(1)?,
            };
            sums.div(&counted.maximum(1.0)?)
        }
    }
}

/// Target tokens that carry loss (those not equal to `ignore_index`), for
/// `Batch::num_tokens` with `reweight = token_count`.
pub fn count_target_tokens(targets: &Tensor, ignore_index: Option<i64>) -> Result<usize> {
    let targets = targets.to_dtype(DType::I64)?;
    match ignore_index {
        Some(ignore) => Ok(targets
            .ne(ignore)?
            .to_dtype(DType::U32)?
            .sum_all()?
            .to_scalar::<u32>()? as usize),
        None => Ok(targets.elem_count()),
    }
}

/// Each token's cross-entropy `[batch, len]` of `logits` `[batch, len, vocab]`
/// (fused on CPU: [`cross_entropy_rows`]); 0 at `ignore_index`.
fn token_losses(logits: &Tensor, targets: &Tensor, ignore_index: Option<i64>) -> Result<Tensor> {
    let (batch, len, vocab) = logits.dims3()?;
    let rows = logits.reshape((batch * len, vocab))?;
    cross_entropy_rows(&rows, &targets.flatten_all()?, ignore_index)?.reshape((batch, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// `-log(exp(z[t]) / Σ_k exp(z[k]))`, by hand in f64.
    fn nll(z: &[f64], t: usize) -> f64 {
        z.iter().map(|v| v.exp()).sum::<f64>().ln() - z[t]
    }

    fn close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn classes_matches_hand_computation() -> Result<()> {
        let rows = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-2.0, 5.0, 0.5]];
        let logits = Tensor::new(&rows, &Device::Cpu)?.to_dtype(DType::F32)?;
        let targets = Tensor::new(&[2u32, 1, 0], &Device::Cpu)?;
        let got = per_example_cross_entropy(&logits, &targets)?;
        assert_eq!(got.dims(), &[3]);
        // 0.4076, ln 3 = 1.0986, 7.0185: the target's NLL, not a mean over classes.
        close(
            &got.to_vec1::<f32>()?,
            &[nll(&rows[0], 2), nll(&rows[1], 1), nll(&rows[2], 0)],
        );
        assert!((nll(&rows[1], 1) - 3f64.ln()).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn i64_targets_and_a_single_example() -> Result<()> {
        let logits = Tensor::new(&[[0.5f32, -0.5]], &Device::Cpu)?;
        let targets = Tensor::new(&[1i64], &Device::Cpu)?;
        let got = per_example_cross_entropy(&logits, &targets)?;
        close(&got.to_vec1::<f32>()?, &[nll(&[0.5, -0.5], 1)]);
        Ok(())
    }

    #[test]
    fn gradient_is_softmax_minus_one_hot() -> Result<()> {
        let z = [1.0f64, 2.0, 3.0];
        let logits = Var::new(&[[1.0f32, 2.0, 3.0]], &Device::Cpu)?;
        let targets = Tensor::new(&[0u32], &Device::Cpu)?;
        let loss = per_example_cross_entropy(logits.as_tensor(), &targets)?.sum_all()?;
        let grad = loss.backward()?.get(logits.as_tensor()).cloned().unwrap();
        let total: f64 = z.iter().map(|v| v.exp()).sum();
        let want: Vec<f64> = z
            .iter()
            .enumerate()
            .map(|(k, v)| v.exp() / total - f64::from(u8::from(k == 0)))
            .collect();
        close(&grad.flatten_all()?.to_vec1::<f32>()?, &want);
        Ok(())
    }

    #[test]
    fn shape_mistakes_are_errors() -> Result<()> {
        let logits = Tensor::zeros((2, 3), DType::F32, &Device::Cpu)?;
        let three = Tensor::new(&[0u32, 1, 2], &Device::Cpu)?;
        let err = per_example_cross_entropy(&logits, &three).unwrap_err();
        assert!(
            err.to_string().contains("2 rows of logits but 3 targets"),
            "{err}"
        );
        let flat = Tensor::zeros(6, DType::F32, &Device::Cpu)?;
        assert!(per_example_cross_entropy(&flat, &three).is_err());
        Ok(())
    }

    #[test]
    fn token_sum_skips_padding() -> Result<()> {
        // Two examples of length 2; the second has one real token.
        let z = [[[2.0, 0.0], [0.0, 1.0]], [[-1.0, 1.0], [9.0, -9.0]]];
        let logits = Tensor::new(&z, &Device::Cpu)?.to_dtype(DType::F32)?;
        let targets = Tensor::new(&[[0u32, 1], [1, 1]], &Device::Cpu)?;
        let mask = Tensor::new(&[[1f32, 1.0], [1.0, 0.0]], &Device::Cpu)?;
        let got = per_example_token_cross_entropy_sum(&logits, &targets, &mask)?;
        let want = [nll(&z[0][0], 0) + nll(&z[0][1], 1), nll(&z[1][0], 1)];
        close(&got.to_vec1::<f32>()?, &want);
        // An f64 mask works too.
        let got =
            per_example_token_cross_entropy_sum(&logits, &targets, &mask.to_dtype(DType::F64)?)?;
        close(&got.to_vec1::<f32>()?, &want);
        Ok(())
    }

    #[test]
    fn ignore_index_sum_and_mean_match_hand_computation() -> Result<()> {
        let z = [
            [[2.0, 0.0, 1.0], [0.0, 1.0, 3.0]],
            [[-1.0, 1.0, 0.0], [9.0, -9.0, 0.0]],
        ];
        let logits = Tensor::new(&z, &Device::Cpu)?.to_dtype(DType::F32)?;
        // HF labels: -100 marks positions without loss; the second row has none.
        let targets = Tensor::new(&[[0i64, 2], [-100, -100]], &Device::Cpu)?;
        let sum =
            per_example_token_cross_entropy(&logits, &targets, Some(-100), TokenReduction::Sum)?;
        let first = nll(&z[0][0], 0) + nll(&z[0][1], 2);
        close(&sum.to_vec1::<f32>()?, &[first, 0.0]);
        let mean =
            per_example_token_cross_entropy(&logits, &targets, Some(-100), TokenReduction::Mean)?;
        close(&mean.to_vec1::<f32>()?, &[first / 2.0, 0.0]);
        assert_eq!(count_target_tokens(&targets, Some(-100))?, 2);
        // Without an ignore index, u32 targets: equals the masked sum with a full mask.
        let targets = Tensor::new(&[[0u32, 2], [1, 0]], &Device::Cpu)?;
        let ones = Tensor::ones((2, 2), DType::F32, &Device::Cpu)?;
        let want = per_example_token_cross_entropy_sum(&logits, &targets, &ones)?;
        let got = per_example_token_cross_entropy(&logits, &targets, None, TokenReduction::Sum)?;
        close(
            &got.to_vec1::<f32>()?,
            &want.to_dtype(DType::F64)?.to_vec1::<f64>()?,
        );
        assert_eq!(count_target_tokens(&targets, None)?, 4);
        Ok(())
    }

    #[test]
    fn ignored_positions_get_no_gradient() -> Result<()> {
        let logits = Var::new(&[[[1.0f32, 2.0], [3.0, 4.0]]], &Device::Cpu)?;
        let targets = Tensor::new(&[[1i64, -100]], &Device::Cpu)?;
        let loss = per_example_token_cross_entropy(
            logits.as_tensor(),
            &targets,
            Some(-100),
            TokenReduction::Mean,
        )?;
        let grad = loss
            .sum_all()?
            .backward()?
            .get(logits.as_tensor())
            .cloned()
            .unwrap();
        let rows = grad.squeeze(0)?.to_vec2::<f32>()?;
        assert_eq!(rows[1], [0.0, 0.0]);
        assert!(rows[0][0] > 0.0 && rows[0][1] < 0.0, "{rows:?}");
        Ok(())
    }

    #[test]
    fn token_sum_shape_mistakes_are_errors() -> Result<()> {
        let logits = Tensor::zeros((2, 3, 4), DType::F32, &Device::Cpu)?;
        let targets = Tensor::zeros((2, 3), DType::U32, &Device::Cpu)?;
        let short_mask = Tensor::zeros((2, 2), DType::F32, &Device::Cpu)?;
        let err = per_example_token_cross_entropy_sum(&logits, &targets, &short_mask).unwrap_err();
        assert!(err.to_string().contains("mask is [2, 2]"), "{err}");
        Ok(())
    }
}
