//! The model a user trains: per-example losses and named parameters.

use candle_core::{Tensor, Var};

/// A model the engine can train: per-example losses on a collated batch, and its
/// trainable parameters by name (like PyTorch's `named_parameters()`).
///
/// Every parameter named here must receive a gradient in the first step (on some
/// rank), or the run stops naming those that did not: a gradient path cut by a
/// candle-nn fused op without a backward would otherwise train nothing before
/// it, silently. Use [`adabatch::nn`](crate::nn)'s ops (docs/porting.md), and
/// declare parameters frozen on purpose with [`ParamGroups`](crate::ParamGroups).
///
/// **Models with per-call state.** `per_example_loss` takes `&self`: the same
/// model serves the step and the evaluation, on worker threads too. A model whose
/// forward wants `&mut` state (candle-transformers' llama takes `&mut Cache`)
/// builds that state inside the call — training needs no key-value cache, so a
/// fresh `Cache::new(false, ..)` per batch is free — or keeps it behind a
/// `Mutex` (a `RefCell` is not `Sync`). Rope tables and masks are plain tensors
/// computed by the model, never requested through the `VarBuilder`: a
/// [`Parameters`](crate::Parameters) store creates whatever it is asked for, as a
/// trainable parameter.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be trained by adabatch: it does not implement `adabatch::TrainModel`",
    label = "the `#[model]` field must implement `adabatch::TrainModel`",
    note = "implement `TrainModel for {Self}`: `type Batch`, `fn per_example_loss(&self, &Self::Batch) -> candle_core::Result<Tensor>` and `fn named_parameters(&self) -> Vec<(String, Var)>`"
)]
pub trait TrainModel {
    /// The collated batch the model consumes.
    type Batch: Batch;

    /// Loss of every example of `batch`, shape `[batch.num_examples()]`.
    ///
    /// With `reweight = token_count` each entry is the *sum* of that example's token
    /// losses; otherwise it is the example's (mean) loss.
    fn per_example_loss(&self, batch: &Self::Batch) -> candle_core::Result<Tensor>;

    /// Trainable variables with unique, stable names: the same names and shapes on
    /// every rank (the engine sorts them by name for the all-reduce).
    fn named_parameters(&self) -> Vec<(String, Var)>;

    /// The model's Hugging Face `config.json` text, written beside
    /// `model.safetensors` in every checkpoint and in the saved model, so that
    /// transformers' `from_pretrained` and candle-transformers load them. None by
    /// default (the weights alone are saved).
    fn pretrained_config(&self) -> Option<String> {
        None
    }

    /// Per-example metrics reported beside the eval loss, by name: e.g.
    /// `("accuracy", correct)` with `correct[i]` 1.0 when example `i` is predicted
    /// right. The engine averages each over the whole eval set and logs it as
    /// `eval_<name>` (HF's `compute_metrics`). None by default.
    fn eval_metrics(
        &self,
        batch: &Self::Batch,
    ) -> candle_core::Result<Vec<(&'static str, Tensor)>> {
        let _ = batch;
        Ok(Vec::new())
    }
}

/// A collated batch. `Send`: with `--dataloader-num-workers` it is collated on a
/// worker thread.
pub trait Batch: Send {
    /// Number of examples.
    fn num_examples(&self) -> usize;
    /// Number of tokens that carry loss, for `reweight = token_count`.
    fn num_tokens(&self) -> usize {
        self.num_examples()
    }
    /// Tokens that carry loss in each example, in order, when the batch knows
    /// them: with several sources and `reweight = token_count`, each source's
    /// loss is then its summed loss over its tokens (nats per token, the unit of
    /// `eval_loss`), and mixers see each source's tokens. `None` (the default):
    /// per example.
    fn example_tokens(&self) -> Option<Vec<usize>> {
        None
    }
}
