//! Evaluation on held-out data (HF's `eval_dataset`): every eval example is
//! evaluated exactly once across the ranks, and the sums meet in one all-reduce.

use candle_core::{DType, Device, Tensor};

use crate::config::policy::Reweight;
use crate::data::source_spec::SourceSpec;
use crate::dist::communicator::Communicator;
use crate::error::{Error, ModelError, Result, SettingsError};
use crate::optim::precision::{loss_in_f32, AutocastScope, Precision};
use crate::report::record::EvalLog;
use crate::train::settings::RunSettings;
use crate::train::source_sums;
use crate::user::data::Dataset;
use crate::user::train_model::{Batch, TrainModel};
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
        return Err(Error::Model(ModelError::EvalMetric {
            detail: format!(
                "{what} has shape {:?}; expected one value per example, [{n}]",
                values.dims()
            ),
        }));
    }
    Ok(values.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?)
}

/// A chunk's per-example `losses` (of the dataset indices `chunk` of the sources
/// `spec`) added to the per-source `sums`, with the batch's tokens per example.
fn add_source_losses<B: Batch>(
    sums: &mut [f64],
    (spec, chunk): (&SourceSpec, &[usize]),
    losses: &Tensor,
    batch: &B,
) -> Result<()> {
    let values = losses.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let tokens = batch.example_tokens();
    source_sums::add(sums, spec, chunk, &values, tokens.as_deref());
    Ok(())
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

/// What evaluation reads: the eval set, the collate, the device, the chunk size
/// (`--per-device-eval-batch-size`), how losses are weighted, and the precision.
pub(crate) struct EvalInput<'a, D: ?Sized, C> {
    pub(crate) eval: &'a D,
    pub(crate) collate: &'a C,
    pub(crate) device: &'a Device,
    pub(crate) batch_size: usize,
    pub(crate) reweight: Reweight,
    pub(crate) precision: Precision,
}

impl<'a, D: ?Sized, C> EvalInput<'a, D, C> {
    /// How a run of `settings` evaluates `eval` on `device`.
    pub(crate) fn of(
        (eval, collate): (&'a D, &'a C),
        device: &'a Device,
        settings: &RunSettings,
    ) -> Self {
        Self {
            eval,
            collate,
            device,
            batch_size: settings.eval.batch_size,
            reweight: settings.step.reweight,
            precision: settings.step.precision,
        }
    }
}

/// This rank's sums over its share of the eval set.
struct EvalSums {
    loss: f64,
    weight: f64,
    examples: f64,
    names: Vec<&'static str>,
    metrics: Vec<f64>,
    /// Per source: loss sums, example counts and tokens (empty with one source).
    sources: Vec<f64>,
}

impl EvalSums {
    /// One chunk's losses and metrics added.
    fn add_chunk<M: TrainModel>(
        &mut self,
        model: &M,
        batch: &M::Batch,
        chunk: &[usize],
        (reweight, precision): (Reweight, Precision),
        sources: Option<&SourceSpec>,
    ) -> Result<()> {
        let n = batch.num_examples();
        // Under `--bf16` / `--fp16` the model evaluates as it trains (HF's autocast
        // around `prediction_step`).
        let autocast = AutocastScope::enter(precision);
        let losses = loss_in_f32(model.per_example_loss(batch)?)?.detach();
        let metrics = model.eval_metrics(batch)?;
        drop(autocast);
        self.loss += per_example_sum(&losses, n, "the per-example loss")?;
        if let Some(spec) = sources {
            add_source_losses(&mut self.sources, (spec, chunk), &losses, batch)?;
        }
        self.weight += match reweight {
            Reweight::TokenCount => batch.num_tokens(),
            _ => n,
        } as f64;
        self.examples += n as f64;
        if self.names.is_empty() && self.metrics.is_empty() {
            self.names = metrics.iter().map(|(name, _)| *name).collect();
            self.metrics = vec![0.0; self.names.len()];
        }
        if metrics.len() != self.names.len()
            || metrics.iter().zip(&self.names).any(|(m, n)| m.0 != *n)
        {
            return Err(Error::Model(ModelError::EvalMetric {
                detail: "eval_metrics returned different names for different batches".into(),
            }));
        }
        for ((name, values), sum) in metrics.iter().zip(&mut self.metrics) {
            *sum += per_example_sum(values, n, name)?;
        }
        Ok(())
    }
}

/// Evaluates `trainer`'s model on this rank's share of the eval set, in chunks of
/// `batch_size`, and sums over the ranks. Every rank returns the same metrics.
pub(crate) fn evaluate<T, D, C>(
    trainer: &mut T,
    comm: &impl Communicator,
    input: &EvalInput<'_, D, C>,
    step: usize,
    epoch: f64,
) -> Result<EvalLog>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
{
    let (model, _) = trainer.parts();
    let eval = input.eval;
    // An eval set of several sources also reports each source's loss.
    let sources = eval.sources();
    let mut local = EvalSums {
        loss: 0.0,
        weight: 0.0,
        examples: 0.0,
        names: Vec::new(),
        metrics: Vec::new(),
        sources: source_sums::zeroed(sources.as_ref().map_or(0, |s| s.names.len())),
    };
    let indices: Vec<usize> = eval_share(eval.len(), comm.rank(), comm.world_size()).collect();
    for chunk in indices.chunks(input.batch_size.max(1)) {
        let items: Vec<D::Item> = chunk.iter().map(|&i| eval.get(i)).collect();
        let batch = input.collate.collate(&items, input.device)?;
        let rules = (input.reweight, input.precision);
        local.add_chunk(&*model, &batch, chunk, rules, sources.as_ref())?;
    }
    check_metric_names(comm, &local.names)?;
    let mut sums = vec![local.loss, local.weight, local.examples];
    sums.extend(&local.metrics);
    sums.extend(&local.sources);
    comm.all_reduce_sum(&mut [], &mut sums)?;
    let source_sums = sums.split_off(3 + local.metrics.len());
    let total = sums[2];
    let mut metrics: std::collections::BTreeMap<String, f64> = local
        .names
        .iter()
        .zip(&sums[3..])
        .map(|(name, sum)| (format!("eval_{name}"), sum / total))
        .collect();
    // Per token under `token_count`, as `eval_loss` beside it.
    let per_token = input.reweight == Reweight::TokenCount;
    if let (Some(spec), Some(means)) = (&sources, source_sums::means(&source_sums, per_token)) {
        for (name, loss) in spec.names.iter().zip(means) {
            metrics.insert(format!("eval_{name}_loss"), loss);
            if per_token && loss.is_finite() {
                metrics.insert(format!("eval_{name}_perplexity"), loss.exp());
            }
        }
    }
    Ok(EvalLog {
        event: "eval".into(),
        step,
        epoch,
        eval_loss: sums[0] / sums[1],
        eval_examples: total as usize,
        train_seconds: None,
        metrics,
    })
}

/// The held-out set a mixer asks losses of (`--mixer-eval-examples`): the first
/// `per_source` examples of each source of the eval set that the mixer `reads`
/// (all of a smaller one), as eval-set indices. The eval set must hold the
/// training sources, by name and in order.
pub(crate) fn held_out_set(
    eval_sources: Option<&SourceSpec>,
    train_sources: Option<&SourceSpec>,
    per_source: usize,
    reads: impl Fn(&str) -> bool,
) -> Result<Vec<usize>> {
    let refuse = |reason: String| Err(Error::Settings(SettingsError::HeldOutSet { reason }));
    let (Some(eval), Some(train)) = (eval_sources, train_sources) else {
        return refuse(
            "--mixer-eval-examples needs a run of several sources and an eval set of the same sources (their validation splits)".into(),
        );
    };
    if eval.names != train.names {
        return refuse(format!(
            "the eval set's sources ({}) are not the training sources ({})",
            eval.names.join(", "),
            train.names.join(", ")
        ));
    }
    let mut indices = Vec::new();
    let mut start = 0;
    for (name, &size) in eval.names.iter().zip(&eval.sizes) {
        if reads(name) {
            indices.extend(start..start + size.min(per_source));
        }
        start += size;
    }
    Ok(indices)
}

/// Each source's loss on the held-out set, and what evaluating it cost.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeldOut {
    /// Per source, in the unit of the step's per-source losses (per token under
    /// `reweight = token_count` where the batches count tokens).
    pub(crate) losses: Vec<f64>,
    /// Tokens evaluated over every rank.
    pub(crate) tokens: f64,
    /// Seconds it took (logged only: no decision reads them).
    pub(crate) seconds: f64,
}

/// Evaluates `trainer`'s model on this rank's share of the held-out `set`
/// (eval-set indices of the sources `spec`), every example once across the
/// ranks; every rank returns the same losses.
pub(crate) fn held_out_losses<T, D, C>(
    trainer: &mut T,
    comm: &impl Communicator,
    input: &EvalInput<'_, D, C>,
    (set, spec): (&[usize], &SourceSpec),
) -> Result<HeldOut>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
{
    let started = std::time::Instant::now();
    let (model, _) = trainer.parts();
    let mut sums = source_sums::zeroed(spec.names.len());
    let mut tokens = 0.0;
    let share = &set[eval_share(set.len(), comm.rank(), comm.world_size())];
    for chunk in share.chunks(input.batch_size.max(1)) {
        let items: Vec<D::Item> = chunk.iter().map(|&i| input.eval.get(i)).collect();
        let batch = input.collate.collate(&items, input.device)?;
        let autocast = AutocastScope::enter(input.precision);
        let losses = loss_in_f32(model.per_example_loss(&batch)?)?.detach();
        drop(autocast);
        if losses.dims() != [chunk.len()] {
            return Err(Error::Model(ModelError::LossShape {
                shape: losses.dims().to_vec(),
                examples: chunk.len(),
            }));
        }
        add_source_losses(&mut sums, (spec, chunk), &losses, &batch)?;
        tokens += batch.num_tokens() as f64;
    }
    sums.push(tokens);
    comm.all_reduce_sum(&mut [], &mut sums)?;
    let tokens = sums.pop().unwrap_or_default();
    let per_token = input.reweight == Reweight::TokenCount;
    Ok(HeldOut {
        losses: source_sums::means(&sums, per_token).unwrap_or_default(),
        tokens,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Every rank must report the same metrics (their sums are added by position).
fn check_metric_names(comm: &impl Communicator, names: &[&str]) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let mut agreement = [names.len() as f64, names_fingerprint(names)];
    comm.all_reduce_sum(&mut [], &mut agreement)?;
    let world = comm.world_size() as f64;
    if agreement != [names.len() as f64 * world, names_fingerprint(names) * world] {
        return Err(Error::Model(ModelError::EvalMetric {
            detail: format!("rank {} reports other metrics than its peers", comm.rank()),
        }));
    }
    Ok(())
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

    /// The first `per_source` examples of each source the mixer reads (all of a
    /// smaller one), none of the others; another eval set is refused.
    #[test]
    fn the_held_out_set_holds_the_first_examples_of_the_sources_read() {
        use crate::user::data::Dataset;
        let sources = crate::Sources::new([
            ("a", vec![0u8; 4]),
            ("b", vec![0u8; 2]),
            ("c", vec![0u8; 5]),
        ]);
        let spec = sources.unwrap().sources();
        let set =
            |reads: &dyn Fn(&str) -> bool| held_out_set(spec.as_ref(), spec.as_ref(), 3, reads);
        assert_eq!(set(&|_| true).unwrap(), [0, 1, 2, 4, 5, 6, 7, 8]);
        assert_eq!(set(&|name| name != "b").unwrap(), [0, 1, 2, 6, 7, 8]);
        let other = crate::Sources::new([("a", vec![0u8; 4])])
            .unwrap()
            .sources();
        assert!(held_out_set(other.as_ref(), spec.as_ref(), 3, |_| true).is_err());
    }
}
