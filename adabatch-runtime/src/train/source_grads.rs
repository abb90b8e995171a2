//! Each source's gradient statistics in a step, for a mixer that asked
//! ([`crate::Mixer::wants_source_gradients`]): `|g_k|²` and `σ_k²` of PiKE
//! (arXiv 2502.06244) from two halves of the source's examples in the step.
//!
//! The halves are the source's examples of the step taken alternately in the
//! step's order ([`groups`]), so they are the same on any number of ranks; the
//! step keeps each half's gradient apart and sums it over the ranks in its one
//! all-reduce, and its own gradient is still the sum of them all. With the
//! halves' mean gradients `ĝ_a`, `ĝ_b` (sizes `n_a`, `n_b`), independent draws of
//! the source: `E⟨ĝ_a, ĝ_b⟩ = |g_k|²` and `E|ĝ_a − ĝ_b|² = σ_k²(1/n_a + 1/n_b)`,
//! two unbiased estimates that need no gradient per example (the paper does not
//! say how it estimates them).

use candle_core::{DType, Tensor};

use crate::adapt::mixer::SourceGradient;
use crate::data::planner::StepBatches;
use crate::data::source_spec::SourceSpec;
use crate::error::Result;
use crate::train::probe::{ChunkLosses, Groups};

/// The halves of `spec`'s sources: two per source.
pub(crate) fn halves(spec: &SourceSpec) -> usize {
    2 * spec.names.len()
}

/// Each example of the step in its source's half: source `k`'s `j`-th example
/// of the step (in [`StepBatches::indices`]' order) is in half `2k + j mod 2`.
pub(crate) fn groups(spec: &SourceSpec, batches: &StepBatches) -> Groups {
    let mut seen = vec![0usize; spec.names.len()];
    let of = (batches.indices().into_iter())
        .map(|index| {
            let source = spec.locate(index).0;
            seen[source] += 1;
            2 * source + (seen[source] - 1) % 2
        })
        .collect();
    Groups {
        of,
        count: halves(spec),
    }
}

/// A chunk of half `group` counted in `out`: each half's examples, then each
/// half's tokens as the step counts them (the unit `token_count` divides by;
/// a batch need not know each example's).
pub(crate) fn count(out: &mut [f64], group: usize, chunk: &ChunkLosses<'_>) {
    let (examples, tokens) = out.split_at_mut(out.len() / 2);
    examples[group] += chunk.indices.len() as f64;
    tokens[group] += chunk.batch_tokens as f64;
}

/// Each source's statistics from its halves' counts (`halves`: as [`count`]
/// wrote them, summed) and gradients (`grads`: of their summed losses, summed
/// over the ranks), with its mean `loss`; per token where `per_token` and the
/// batches counted tokens.
pub(crate) fn statistics(
    halves: &[f64],
    grads: &[Vec<Option<Tensor>>],
    loss: &[f64],
    per_token: bool,
) -> Result<Vec<SourceGradient>> {
    let (examples, tokens) = halves.split_at(halves.len() / 2);
    let sizes = match per_token && tokens.iter().sum::<f64>() > 0.0 {
        true => tokens,
        false => examples,
    };
    (0..sizes.len() / 2)
        .map(|k| {
            let (n_a, n_b) = (sizes[2 * k], sizes[2 * k + 1]);
            let (grad_sq, grad_var) = match (grads.get(2 * k), grads.get(2 * k + 1)) {
                (Some(a), Some(b)) if n_a > 0.0 && n_b > 0.0 => {
                    halves_estimates((a, n_a), (b, n_b))?
                }
                _ => (f64::NAN, f64::NAN),
            };
            Ok(SourceGradient {
                grad_sq,
                grad_var,
                size: n_a + n_b,
                loss: loss.get(k).copied().unwrap_or(f64::NAN),
            })
        })
        .collect()
}

/// `(⟨ĝ_a, ĝ_b⟩, |ĝ_a − ĝ_b|² / (1/n_a + 1/n_b))` of two halves' summed
/// gradients and sizes, in f64 (a parameter without a gradient in a half is 0).
fn halves_estimates(
    (a, n_a): (&[Option<Tensor>], f64),
    (b, n_b): (&[Option<Tensor>], f64),
) -> Result<(f64, f64)> {
    let (mut dot, mut diff) = (0.0, 0.0);
    for (ga, gb) in a.iter().zip(b) {
        let mean = |g: &Option<Tensor>, n: f64| -> Result<Option<Tensor>> {
            Ok(match g {
                Some(g) => Some((g.to_dtype(DType::F64)? / n)?),
                None => None,
            })
        };
        let sum_sq = |t: &Tensor| -> Result<f64> { Ok(t.sqr()?.sum_all()?.to_scalar::<f64>()?) };
        match (mean(ga, n_a)?, mean(gb, n_b)?) {
            (Some(x), Some(y)) => {
                dot += x.mul(&y)?.sum_all()?.to_scalar::<f64>()?;
                diff += sum_sq(&(x - y)?)?;
            }
            (Some(x), None) | (None, Some(x)) => diff += sum_sq(&x)?,
            (None, None) => {}
        }
    }
    Ok((dot, diff / (1.0 / n_a + 1.0 / n_b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::policy::StoppingStrategy;
    use crate::data::sampler::GlobalBatch;
    use candle_core::Device;

    fn spec() -> SourceSpec {
        SourceSpec {
            names: vec!["a".into(), "b".into()],
            sizes: vec![4, 4],
            weights: vec![1.0, 1.0],
            stopping: StoppingStrategy::Primary,
            unit: crate::data::source_spec::MixUnit::Examples,
            tokens: vec![4, 4],
        }
    }

    /// Halves alternate within each source in the step's order, across
    /// micro-batches and whatever the ranks' split.
    #[test]
    fn each_sources_examples_alternate_between_its_halves() {
        let batches = StepBatches {
            micro: vec![
                GlobalBatch {
                    indices: vec![0, 4, 1],
                    splits: vec![0..2, 2..3],
                },
                GlobalBatch {
                    indices: vec![5, 2, 6],
                    splits: vec![0..3, 3..3],
                },
            ],
        };
        let groups = groups(&spec(), &batches);
        assert_eq!(groups.of, [0, 2, 1, 3, 0, 2]);
        assert_eq!(groups.count, 4);
    }

    /// One parameter of two coordinates: half a's examples have mean gradient
    /// (3, 1) over 2 examples, half b's (1, 1) over 2: ⟨ĝ_a, ĝ_b⟩ = 4,
    /// |ĝ_a − ĝ_b|² = 4 over (1/2 + 1/2): σ² = 4.
    #[test]
    fn the_halves_give_the_norm_and_the_variance_by_hand() {
        let sum =
            |g: [f64; 2], n: f64| Some(Tensor::new(&[g[0] * n, g[1] * n], &Device::Cpu).unwrap());
        let grads = vec![
            vec![sum([3.0, 1.0], 2.0)],
            vec![sum([1.0, 1.0], 2.0)],
            vec![None],
            vec![None],
        ];
        let halves = [2.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let stats = statistics(&halves, &grads, &[0.5, 0.25], false).unwrap();
        assert_eq!((stats[0].grad_sq, stats[0].grad_var), (4.0, 4.0));
        assert_eq!((stats[0].size, stats[0].loss), (4.0, 0.5));
        assert!(
            stats[1].grad_sq.is_nan() && stats[1].size == 1.0,
            "one example: no estimate"
        );
    }
}
