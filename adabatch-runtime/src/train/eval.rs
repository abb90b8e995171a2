//! Evaluation on held-out data (HF's `eval_dataset`): every eval example is
//! evaluated exactly once across the ranks, and the sums meet in one all-reduce.

use candle_core::{DType, Device, Tensor};

use crate::config::policy::Reweight;
use crate::dist::communicator::Communicator;
use crate::error::{Error, Result};
use crate::optim::precision::{loss_in_f32, AutocastScope, Precision};
use crate::report::logging::EvalLog;
use crate::user::data::Dataset;
use crate::user::model::{Batch, TrainModel};
use crate::user::trainer::{AdaptiveTrainer, CollateFor};

/// The eval examples of `rank`: a contiguous share of `0..len`, the first
/// `len % world` ranks one longer, so the shares cover every example once.
pub(crate) fn eval_share(len: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    let base = len / world;
    let extra = len % world;
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// The sum of a per-example tensor of `n` entries, in f64.
fn per_example_sum(values: &Tensor, n: usize, what: &str) -> Result<f64> {
    if values.dims() != [n] {
        return Err(Error::EvalMetric {
            detail: format!(
                "{what} has shape {:?}; expected one value per example, [{n}]",
                values.dims()
            ),
        });
    }
    Ok(values.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?)
}

/// A fingerprint of the metric names, so ranks can check they agree.
fn names_fingerprint(names: &[&str]) -> f64 {
    let hash = names
        .iter()
        .flat_map(|n| n.bytes().chain([0]))
        .fold(0u64, |h, b| {
            (h.wrapping_mul(257).wrapping_add(u64::from(b) + 1)) % (1 << 40)
        });
    hash as f64
}

/// Evaluates `trainer`'s model on this rank's share of `eval`, in chunks of
/// `batch_size`, and sums over the ranks. Every rank returns the same metrics.
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate<T, D, C>(
    trainer: &mut T,
    comm: &impl Communicator,
    eval: &D,
    collate: &C,
    device: &Device,
    batch_size: usize,
    (reweight, precision): (Reweight, Precision),
    step: usize,
    epoch: f64,
) -> Result<EvalLog>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
{
    let (model, _) = trainer.parts();
    let share = eval_share(eval.len(), comm.rank(), comm.world_size());
    let mut loss_sum = 0.0;
    let mut weight = 0.0;
    let mut examples = 0.0;
    let mut names: Vec<&'static str> = Vec::new();
    let mut metric_sums: Vec<f64> = Vec::new();
    // An eval set of several sources also reports each source's loss.
    let sources = eval.sources();
    let mut source_sums = vec![0.0; 2 * sources.as_ref().map_or(0, |s| s.names.len())];
    let indices: Vec<usize> = share.collect();
    for chunk in indices.chunks(batch_size.max(1)) {
        let items: Vec<D::Item> = chunk.iter().map(|&i| eval.get(i)).collect();
        let batch = collate.collate(&items, device)?;
        let n = batch.num_examples();
        // Under `--bf16` / `--fp16` the model evaluates as it trains (HF's autocast
        // around `prediction_step`).
        let autocast = AutocastScope::enter(precision);
        let losses = loss_in_f32(model.per_example_loss(&batch)?)?.detach();
        let metrics = model.eval_metrics(&batch)?;
        drop(autocast);
        loss_sum += per_example_sum(&losses, n, "the per-example loss")?;
        if let Some(spec) = &sources {
            let values = losses.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            let count = spec.names.len();
            for (value, &index) in values.iter().zip(chunk) {
                let source = spec.locate(index).0;
                source_sums[source] += value;
                source_sums[count + source] += 1.0;
            }
        }
        weight += match reweight {
            Reweight::TokenCount => batch.num_tokens(),
            _ => n,
        } as f64;
        examples += n as f64;
        if names.is_empty() && metric_sums.is_empty() {
            names = metrics.iter().map(|(name, _)| *name).collect();
            metric_sums = vec![0.0; names.len()];
        }
        if metrics.len() != names.len() || metrics.iter().zip(&names).any(|(m, n)| m.0 != *n) {
            return Err(Error::EvalMetric {
                detail: "eval_metrics returned different names for different batches".into(),
            });
        }
        for ((name, values), sum) in metrics.iter().zip(&mut metric_sums) {
            *sum += per_example_sum(values, n, name)?;
        }
    }
    if comm.world_size() > 1 {
        let mut agreement = [names.len() as f64, names_fingerprint(&names)];
        comm.all_reduce_sum(&mut [], &mut agreement)?;
        let world = comm.world_size() as f64;
        if agreement
            != [
                names.len() as f64 * world,
                names_fingerprint(&names) * world,
            ]
        {
            return Err(Error::EvalMetric {
                detail: format!("rank {} reports other metrics than its peers", comm.rank()),
            });
        }
    }
    let mut sums = vec![loss_sum, weight, examples];
    sums.extend(&metric_sums);
    sums.extend(&source_sums);
    comm.all_reduce_sum(&mut [], &mut sums)?;
    let source_sums = sums.split_off(3 + metric_sums.len());
    let total = sums[2];
    let mut metrics: std::collections::BTreeMap<String, f64> = names
        .iter()
        .zip(&sums[3..])
        .map(|(name, sum)| (format!("eval_{name}"), sum / total))
        .collect();
    if let Some(spec) = &sources {
        let (losses, counts) = source_sums.split_at(spec.names.len());
        for ((name, loss), count) in spec.names.iter().zip(losses).zip(counts) {
            metrics.insert(format!("eval_{name}_loss"), loss / count);
        }
    }
    Ok(EvalLog {
        event: "eval".into(),
        step,
        epoch,
        eval_loss: sums[0] / sums[1],
        eval_examples: total as usize,
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_example_once() {
        for len in 1..40 {
            for world in 1..=len.min(7) {
                let mut seen = Vec::new();
                for rank in 0..world {
                    let share = eval_share(len, rank, world);
                    assert!(!share.is_empty());
                    seen.extend(share);
                }
                assert_eq!(seen, (0..len).collect::<Vec<_>>());
            }
        }
    }
}
