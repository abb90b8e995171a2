//! Each source's gradient statistics in a step, for a mixer that asked
//! ([`crate::Mixer::wants_source_gradients`]): `|g_k|²` and `σ_k²` of PiKE
//! (arXiv 2502.06244) from two halves of the source's examples in the step.
//!
//! The halves are the source's examples of the step in the step's order, its
//! first half then its second ([`groups`]), so they are the same on any number
//! of ranks; the step keeps each half's gradient apart and sums it over the
//! ranks in its one all-reduce, and its own gradient is still the sum of them
//! all. The sources are interleaved evenly over a step (so its examples' order
//! is the draws', not the sources'), so each rank's contiguous slice holds
//! mostly one half of each source: about one piece per source on a rank, not
//! two, each a forward and backward of its own. With the halves' mean
//! gradients `ĝ_a`, `ĝ_b` (sizes `n_a`, `n_b`), independent draws of the source:
//! `E⟨ĝ_a, ĝ_b⟩ = |g_k|²` and `E|ĝ_a − ĝ_b|² = σ_k²(1/n_a + 1/n_b)`,
//! two unbiased estimates that need no gradient per example (the paper does not
//! say how it estimates them).

use candle_core::{DType, Tensor};

use crate::adapt::mixer::SourceGradient;
use crate::data::planner::StepBatches;
use crate::data::source_spec::SourceSpec;
use crate::dist::communicator::flatten;
use crate::error::Result;
use crate::train::probe::{ChunkLosses, GroupGradients, Groups};

/// The halves of `spec`'s sources: two per source.
pub(crate) fn halves(spec: &SourceSpec) -> usize {
    2 * spec.names.len()
}

/// Each example of the step in its source's half: of source `k`'s `n` examples
/// of the step (in [`StepBatches::indices`]' order) the first `⌈n/2⌉` are in
/// half `2k`, the others in half `2k + 1`.
pub(crate) fn groups(spec: &SourceSpec, batches: &StepBatches) -> Groups {
    let sources: Vec<usize> = (batches.indices().into_iter())
        .map(|index| spec.locate(index).0)
        .collect();
    let mut first_half = vec![0usize; spec.names.len()];
    for &source in &sources {
        first_half[source] += 1;
    }
    first_half.iter_mut().for_each(|n| *n = n.div_ceil(2));
    let mut seen = vec![0usize; spec.names.len()];
    let of = (sources.into_iter())
        .map(|source| {
            seen[source] += 1;
            2 * source + usize::from(seen[source] > first_half[source])
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
    grads: GroupGradients<'_>,
    loss: &[f64],
    per_token: bool,
) -> Result<Vec<SourceGradient>> {
    let (examples, tokens) = halves.split_at(halves.len() / 2);
    let sizes = match per_token && tokens.iter().sum::<f64>() > 0.0 {
        true => tokens,
        false => examples,
    };
    let half = |h: usize| grads.sums.get(h).map(|g| (&g[..], sizes[h]));
    (0..sizes.len() / 2)
        .map(|k| {
            let (grad_sq, grad_var) = match (half(2 * k), half(2 * k + 1)) {
                (Some(a), Some(b)) if a.1 > 0.0 && b.1 > 0.0 => {
                    halves_estimates(a, b, grads.scale)?
                }
                _ => (f64::NAN, f64::NAN),
            };
            Ok(SourceGradient {
                grad_sq,
                grad_var,
                size: sizes[2 * k] + sizes[2 * k + 1],
                loss: loss.get(k).copied().unwrap_or(f64::NAN),
            })
        })
        .collect()
}

/// `(⟨ĝ_a, ĝ_b⟩, |ĝ_a − ĝ_b|² / (1/n_a + 1/n_b))` of two halves' summed
/// gradients (times `scale`) and sizes, accumulated in f64 (a parameter
/// without a gradient in a half is 0).
fn halves_estimates(
    (a, n_a): (&[Option<Tensor>], f64),
    (b, n_b): (&[Option<Tensor>], f64),
    scale: f64,
) -> Result<(f64, f64)> {
    let (to_a, to_b) = (scale / n_a, scale / n_b);
    let (mut dot, mut diff) = (0.0, 0.0);
    for (ga, gb) in a.iter().zip(b) {
        let (d, s) = match (ga, gb) {
            (Some(x), Some(y)) => dot_and_diff((x, to_a), Some((y, to_b)))?,
            (Some(x), None) => dot_and_diff((x, to_a), None)?,
            (None, Some(y)) => dot_and_diff((y, to_b), None)?,
            (None, None) => (0.0, 0.0),
        };
        dot += d;
        diff += s;
    }
    Ok((dot, diff / (1.0 / n_a + 1.0 / n_b)))
}

/// `(⟨x·s_x, y·s_y⟩, |x·s_x − y·s_y|²)` in f64 (`y` absent: 0). In host memory
/// the values are read once, exactly whatever their dtype (as the all-reduce
/// reads them), into one loop: tensor ops made an f64 copy of each half and a
/// temporary per op, which made the statistics cost as much as the step's
/// backward passes on a CPU. On a device they stay there (f64 ops), so that no
/// half is copied to the host.
fn dot_and_diff((x, sx): (&Tensor, f64), y: Option<(&Tensor, f64)>) -> Result<(f64, f64)> {
    if !x.device().is_cpu() {
        return dot_and_diff_on_device((x, sx), y);
    }
    let values = |g: &Tensor| flatten(std::slice::from_ref(g));
    let xs = values(x)?;
    Ok(match y {
        Some((y, sy)) => {
            let (mut dot, mut diff) = (0.0, 0.0);
            for (&x, &y) in xs.iter().zip(&values(y)?) {
                let (x, y) = (x * sx, y * sy);
                dot += x * y;
                diff += (x - y) * (x - y);
            }
            (dot, diff)
        }
        None => (0.0, xs.iter().map(|&v| (v * sx).powi(2)).sum()),
    })
}

/// [`dot_and_diff`] with tensor ops on `x`'s device.
fn dot_and_diff_on_device(
    (x, sx): (&Tensor, f64),
    y: Option<(&Tensor, f64)>,
) -> Result<(f64, f64)> {
    let scaled = |g: &Tensor, s: f64| -> Result<Tensor> { Ok((g.to_dtype(DType::F64)? * s)?) };
    let total = |t: &Tensor| -> Result<f64> { Ok(t.sum_all()?.to_scalar::<f64>()?) };
    let x = scaled(x, sx)?;
    match y {
        Some((y, sy)) => {
            let y = scaled(y, sy)?;
            Ok((total(&x.mul(&y)?)?, total(&(x - y)?.sqr()?)?))
        }
        None => Ok((0.0, total(&x.sqr()?)?)),
    }
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

    /// Each source's first half of the step's order, then its second, across
    /// micro-batches and whatever the ranks' split (the larger half first).
    #[test]
    fn each_sources_first_examples_are_its_first_half() {
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
        assert_eq!(groups.of, [0, 2, 0, 2, 1, 3]);
        assert_eq!(groups.count, 4);
    }

    /// The host loop and the device ops give the same sums (run here on the
    /// CPU, where both can): `x = (1, -2, 3)·½ = (0.5, −1, 1.5)`,
    /// `y = (2, 0.5, -1)·2 = (4, 1, −2)`: ⟨x, y⟩ = 2 − 1 − 3 = −2,
    /// |x − y|² = 12.25 + 4 + 12.25 = 28.5; |x|² = 3.5.
    #[test]
    fn the_host_loop_and_the_device_ops_agree() {
        let x = Tensor::new(&[1f32, -2.0, 3.0], &Device::Cpu).unwrap();
        let y = Tensor::new(&[2f32, 0.5, -1.0], &Device::Cpu).unwrap();
        let host = dot_and_diff((&x, 0.5), Some((&y, 2.0))).unwrap();
        let device = dot_and_diff_on_device((&x, 0.5), Some((&y, 2.0))).unwrap();
        assert_eq!(host, (-2.0, 28.5));
        assert_eq!(device, host);
        let alone = dot_and_diff((&x, 0.5), None).unwrap();
        assert_eq!(alone, (0.0, 3.5));
        assert_eq!(dot_and_diff_on_device((&x, 0.5), None).unwrap(), alone);
        // An f64 gradient is read as f64 (1 + 1e-12 is no f32).
        let fine = Tensor::new(&[1.0 + 1e-12f64], &Device::Cpu).unwrap();
        let one = Tensor::new(&[1.0f64], &Device::Cpu).unwrap();
        let (_, diff) = dot_and_diff((&fine, 1.0), Some((&one, 1.0))).unwrap();
        assert!(diff > 0.0, "{diff}");
    }

    /// One parameter of two coordinates: half a's examples have mean gradient
    /// (3, 1) over 2 examples, half b's (1, 1) over 2: ⟨ĝ_a, ĝ_b⟩ = 4,
    /// |ĝ_a − ĝ_b|² = 4 over (1/2 + 1/2): σ² = 4 (the sums held at twice
    /// their value, with a scale of ½).
    #[test]
    fn the_halves_give_the_norm_and_the_variance_by_hand() {
        let sum = |g: [f64; 2], n: f64| {
            Some(Tensor::new(&[2.0 * g[0] * n, 2.0 * g[1] * n], &Device::Cpu).unwrap())
        };
        let grads = vec![
            vec![sum([3.0, 1.0], 2.0)],
            vec![sum([1.0, 1.0], 2.0)],
            vec![None],
            vec![None],
        ];
        let halves = [2.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let groups = GroupGradients {
            sums: &grads,
            scale: 0.5,
        };
        let stats = statistics(&halves, groups, &[0.5, 0.25], false).unwrap();
        assert_eq!((stats[0].grad_sq, stats[0].grad_var), (4.0, 4.0));
        assert_eq!((stats[0].size, stats[0].loss), (4.0, 0.5));
        assert!(
            stats[1].grad_sq.is_nan() && stats[1].size == 1.0,
            "one example: no estimate"
        );
    }
}
