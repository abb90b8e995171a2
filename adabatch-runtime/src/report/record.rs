//! What a run records: one logged optimisation step ([`StepLog`]), its per-source
//! part ([`SourceLog`]) and one evaluation ([`EvalLog`]). Plain data, apart from the
//! sinks that write them (console and JSONL in `logging`, TensorBoard, plots).

use std::collections::BTreeMap;

use crate::adapt::goodput::GoodputLog;
use crate::adapt::noise_scale::NoiseMeasurement;
use crate::data::planner::StepBatches;
use crate::data::sampler::GlobalBatchSampler;
use crate::data::source_spec::MixedSources;

/// One logged optimisation step.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepLog {
    /// Optimisation step (1-based).
    pub step: usize,
    /// Examples seen in total / N.
    pub epoch: f64,
    /// Examples seen in total (the run's own count; absent in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples_seen: Option<usize>,
    /// Examples seen in the current epoch / N.
    pub train_coverage: f64,
    /// Each rank's batch size at this step.
    pub local_batch_sizes: Vec<usize>,
    /// Examples in the global batch.
    pub global_batch: usize,
    /// Each rank's dataset indices at this step.
    pub indices: Vec<Vec<usize>>,
    /// Mean training loss over the steps since the previous log (HF semantics).
    /// NaN when there is none (a dry run plans steps without training them):
    /// written as `null`, and `null` or an absent key reads back as NaN.
    #[serde(default = "nan", deserialize_with = "null_as_nan")]
    pub loss: f64,
    /// Global gradient norm of this step (before clipping); NaN (`null`) when
    /// unknown.
    #[serde(default = "nan", deserialize_with = "null_as_nan")]
    pub grad_norm: f64,
    /// Learning rate used at this step.
    pub learning_rate: f64,
    /// Examples per second since the previous log; NaN (`null`) in a dry run.
    #[serde(default = "nan", deserialize_with = "null_as_nan")]
    pub examples_per_s: f64,
    /// Global micro-batches accumulated into this step's update.
    #[serde(default = "one")]
    pub micro_batches: usize,
    /// Out-of-memory events handled since the previous log.
    #[serde(default)]
    pub oom_events: usize,
    /// Memory of this step's batch predicted by the memory model, relative to the
    /// epoch's first batch (`schedule = memory(..)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_memory: Option<f64>,
    /// Peak memory measured for rank 0's batch, bytes (on CPU the documented proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_memory: Option<u64>,
    /// The gradient noise scale B_simple = tr(Σ)/|G|², from the bias-corrected
    /// moving averages up to this step (`--log-gradient-noise-scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_noise_scale: Option<f64>,
    /// This step's own measurement of the noise scale, when it measured one
    /// and the averages took it in (`--log-gradient-noise-scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_measurement: Option<NoiseMeasurement>,
    /// Every how many steps the noise scale is measured, as the cadence stands
    /// after this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_scale_interval: Option<usize>,
    /// Noise-scale measurements since the previous logged step that were not
    /// finite and were left out of the averages (each time the next step
    /// measures again).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub noise_scale_refused: usize,
    /// Steps since the previous logged step (this one included) whose noise
    /// scale was not positive once warm, so that the rate (`lr_scaling =
    /// adamscale`) and goodput ran on the last positive estimate, held.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub noise_scale_held: usize,
    /// `schedule = goodput(..)`: the decision after this step and what it rests on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<GoodputLog>,
    /// `--fp16`: the loss scale of this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// What the held-out losses a mixer asked for have cost so far (the whole
    /// run, a resumed one included); absent when it asked for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOutCost>,
    /// `--fp16`: steps skipped since the previous log because their gradients
    /// overflowed (this one included).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: usize,
    /// With several sources: what each contributed (absent otherwise).
    #[serde(flatten)]
    pub sources: SourceLog,
}

/// The per-source fields of a step of several sources, keyed by source name.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SourceLog {
    /// Examples from each source in this step's global batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_counts: Option<BTreeMap<String, usize>>,
    /// Each source's own indices in this step's global batch, in batch order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_indices: Option<BTreeMap<String, Vec<usize>>>,
    /// Examples used in each source's current epoch / its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_coverage: Option<BTreeMap<String, f64>>,
    /// Examples taken from each source in total / its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_epoch: Option<BTreeMap<String, f64>>,
    /// The mixing weights in force, normalised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_weights: Option<BTreeMap<String, f64>>,
    /// Each source's mean loss in this step, over all ranks: per token under
    /// `reweight = token_count` when the batches count tokens (packed documents),
    /// as `loss` and `eval_loss`; else per example (`null` for a source without
    /// examples in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_loss: Option<BTreeMap<String, Option<f64>>>,
    /// Each source's tokens (targets) in this step, when the batches count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_tokens: Option<BTreeMap<String, f64>>,
    /// What the mixer based the next step's weights on ([`Mixer::diagnostics`]):
    /// `{"name": {"source": x, ...}}` per source, `{"name": {"source": {"other":
    /// x}}}` per pair, `{"name": x}` for one number (`null` for NaN).
    ///
    /// [`Mixer::diagnostics`]: crate::Mixer::diagnostics
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixer: Option<serde_json::Value>,
}

/// One evaluation on the eval dataset: a JSONL line
/// `{"event": "eval", "step": N, "epoch": e, "eval_loss": l, "eval_examples": n,
/// "eval_<metric>": m, ...}` (step lines have no `event` key).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalLog {
    /// Always `"eval"`.
    pub event: String,
    /// The optimisation step after which the model was evaluated.
    pub step: usize,
    /// Examples seen in total / N at that point.
    pub epoch: f64,
    /// Mean per-example (per-token with `reweight = token_count`) loss over the
    /// whole eval set.
    #[serde(deserialize_with = "null_as_nan")]
    pub eval_loss: f64,
    /// Eval examples evaluated (each once, over all ranks).
    pub eval_examples: usize,
    /// Seconds since the run (or its resumption) started, earlier evaluations and
    /// checkpoints left out: the training time this evaluation's loss cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_seconds: Option<f64>,
    /// `eval_<name>`: the mean over the eval set of each of the model's
    /// `TrainModel::eval_metrics`.
    #[serde(flatten)]
    pub metrics: std::collections::BTreeMap<String, f64>,
}

impl EvalLog {
    /// A metric by its logged name (`eval_accuracy`), or `eval_loss`.
    pub fn get(&self, name: &str) -> Option<f64> {
        match name {
            "eval_loss" => Some(self.eval_loss),
            _ => self.metrics.get(name).copied(),
        }
    }

    /// The entry `transformers`' `TrainerState.log_history` holds for it.
    pub fn hf_log_entry(&self) -> serde_json::Value {
        let mut entry = serde_json::Map::new();
        entry.insert("eval_loss".into(), serde_json::json!(self.eval_loss));
        for (name, value) in &self.metrics {
            entry.insert(name.clone(), serde_json::json!(value));
        }
        entry.insert("epoch".into(), serde_json::json!(self.epoch));
        entry.insert("step".into(), serde_json::json!(self.step));
        serde_json::Value::Object(entry)
    }

    /// The HF `Trainer` console form: `{'eval_loss': 0.31, 'eval_accuracy': 0.93, 'epoch': 2.0}`.
    pub fn hf_dict(&self) -> String {
        let mut parts = vec![format!("'eval_loss': {:.4}", self.eval_loss)];
        parts.extend(self.metrics.iter().map(|(k, v)| format!("'{k}': {v:.4}")));
        parts.push(format!("'epoch': {:.2}", self.epoch));
        parts.push(format!("'step': {}", self.step));
        format!("{{{}}}", parts.join(", "))
    }
}

impl SourceLog {
    /// The fields of a step whose global batch holds `indices` (dataset indices),
    /// after it was drawn from `mixed`.
    pub fn of(
        mixed: &MixedSources,
        indices: impl IntoIterator<Item = usize>,
        (source_loss, source_tokens): (Option<&[f64]>, Option<&[f64]>),
    ) -> Self {
        let spec = mixed.spec();
        let mut per_source: Vec<Vec<usize>> = vec![Vec::new(); spec.names.len()];
        for index in indices {
            let (s, local) = spec.locate(index);
            per_source[s].push(local);
        }
        let by_name = |values: Vec<f64>| -> BTreeMap<String, f64> {
            spec.names.iter().cloned().zip(values).collect()
        };
        let total: f64 = mixed.weights().iter().sum();
        let cursors = mixed.cursors();
        Self {
            source_counts: Some(
                spec.names
                    .iter()
                    .cloned()
                    .zip(per_source.iter().map(Vec::len))
                    .collect(),
            ),
            source_indices: Some(spec.names.iter().cloned().zip(per_source).collect()),
            source_coverage: Some(by_name(
                cursors
                    .iter()
                    .zip(&spec.sizes)
                    .map(|(c, &n)| c.position as f64 / n as f64)
                    .collect(),
            )),
            source_epoch: Some(by_name(
                cursors
                    .iter()
                    .zip(&spec.sizes)
                    .map(|(c, &n)| c.seen as f64 / n as f64)
                    .collect(),
            )),
            mix_weights: Some(by_name(mixed.weights().iter().map(|w| w / total).collect())),
            source_loss: source_loss.map(|losses| {
                spec.names
                    .iter()
                    .cloned()
                    .zip(losses.iter().map(|l| l.is_finite().then_some(*l)))
                    .collect()
            }),
            source_tokens: source_tokens.map(|tokens| by_name(tokens.to_vec())),
            // The mixer's controller fills it in.
            mixer: None,
        }
    }
}

fn one() -> usize {
    1
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn nan() -> f64 {
    f64::NAN
}

/// JSON has no NaN: serde_json writes it as `null`, and this reads `null` back.
fn null_as_nan<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    use serde::Deserialize;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl StepLog {
    /// The record of step `step` of `batches`, drawn from `sampler`, before what
    /// only training tells: loss, gradient norm, learning rate and throughput are
    /// NaN, the controllers' fields empty. The one place a record is built; the run
    /// and the dry run fill in what each knows.
    pub(crate) fn planned(
        step: usize,
        sampler: &GlobalBatchSampler,
        batches: &StepBatches,
    ) -> Self {
        Self {
            step,
            epoch: sampler.epoch(),
            examples_seen: Some(sampler.examples_seen()),
            train_coverage: sampler.train_coverage(),
            local_batch_sizes: batches.local_sizes(),
            global_batch: batches.global_size(),
            indices: batches.per_rank_indices(),
            loss: f64::NAN,
            grad_norm: f64::NAN,
            learning_rate: f64::NAN,
            examples_per_s: f64::NAN,
            micro_batches: batches.micro.len(),
            oom_events: 0,
            predicted_memory: None,
            measured_memory: None,
            gradient_noise_scale: None,
            noise_measurement: None,
            noise_scale_interval: None,
            noise_scale_refused: 0,
            noise_scale_held: 0,
            goodput: None,
            loss_scale: None,
            held_out: None,
            skipped_steps: 0,
            sources: SourceLog::default(),
        }
    }

    /// The entry `transformers`' `TrainerState.log_history` holds for a logged step.
    pub fn hf_log_entry(&self) -> serde_json::Value {
        serde_json::json!({
            "loss": self.loss,
            "grad_norm": self.grad_norm,
            "learning_rate": self.learning_rate,
            "epoch": self.epoch,
            "step": self.step,
        })
    }

    /// The HF `Trainer` console form: `{'loss': 0.6931, 'grad_norm': …, …}`.
    pub fn hf_dict(&self) -> String {
        format!(
            "{{'loss': {:.4}, 'grad_norm': {:.4}, 'learning_rate': {:e}, 'epoch': {:.2}, 'train_coverage': {:.2}, 'step': {}, 'global_batch': {}, 'examples_per_s': {:.1}}}",
            self.loss,
            self.grad_norm,
            self.learning_rate,
            self.epoch,
            self.train_coverage,
            self.step,
            self.global_batch,
            self.examples_per_s
        )
    }
}

/// What measuring the sources' gradients for a mixer has cost
/// (`Mixer::wants_source_gradients`): the measuring steps and their seconds
/// (the whole steps', the measurement's share of them not told apart).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SourceGradientCost {
    /// Steps that measured.
    pub steps: usize,
    /// Those steps' seconds (read from the clock; nothing decides on them).
    pub seconds: f64,
}

/// What evaluating the held-out set for a mixer has cost (`Mixer::wants_held_out`):
/// the evaluations, the tokens (targets) they read, their seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HeldOutCost {
    /// Requests answered.
    pub evaluations: usize,
    /// Tokens evaluated in all (examples, where the batches count no tokens).
    pub tokens: f64,
    /// Seconds spent evaluating (read from the clock; nothing decides on them).
    pub seconds: f64,
}
