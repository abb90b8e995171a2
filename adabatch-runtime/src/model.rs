//! What the user provides: a model that returns per-example losses, a dataset and a
//! collate function.

use candle_core::{Device, Tensor, Var};

/// A model the engine can train: per-example losses on a collated batch, and its
/// trainable parameters by name (like PyTorch's `named_parameters()`).
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
}

/// A collated batch.
pub trait Batch {
    /// Number of examples.
    fn num_examples(&self) -> usize;
    /// Number of tokens that carry loss, for `reweight = token_count`.
    fn num_tokens(&self) -> usize {
        self.num_examples()
    }
}

/// Random-access training examples, shared by every rank.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an adabatch dataset",
    note = "implement `adabatch::Dataset` (`len` and `get`), or pass a `Vec<T>` / slice of cloneable examples"
)]
pub trait Dataset: Sync {
    /// One example.
    type Item;
    /// Number of examples.
    fn len(&self) -> usize;
    /// Whether there is none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The example at `index` (`index < len()`).
    fn get(&self, index: usize) -> Self::Item;
    /// Length of the example at `index` in tokens, for length-aware batching
    /// (`schedule = memory(..)`, `--max-tokens-per-batch`); 1 by default.
    fn example_len(&self, _index: usize) -> usize {
        1
    }
}

/// A dataset with known example lengths, for length-aware batching.
#[derive(Debug, Clone)]
pub struct WithLengths<D> {
    inner: D,
    lengths: Vec<usize>,
}

impl<D: Dataset> WithLengths<D> {
    /// Attaches one length per example.
    pub fn new(inner: D, lengths: Vec<usize>) -> crate::Result<Self> {
        if lengths.len() != inner.len() {
            return Err(crate::Error::InvalidConfig(format!(
                "{} lengths for a dataset of {} examples",
                lengths.len(),
                inner.len()
            )));
        }
        Ok(Self { inner, lengths })
    }
}

impl<D: Dataset> Dataset for WithLengths<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn get(&self, index: usize) -> D::Item {
        self.inner.get(index)
    }
    fn example_len(&self, index: usize) -> usize {
        self.lengths[index]
    }
}

impl<T: Clone + Sync> Dataset for [T] {
    type Item = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn get(&self, index: usize) -> T {
        self[index].clone()
    }
}

impl<T: Clone + Sync> Dataset for Vec<T> {
    type Item = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn get(&self, index: usize) -> T {
        self[index].clone()
    }
}

/// Turns examples into a batch on a device (HF's `data_collator`). Implemented for
/// every `Fn(&[Item], &Device) -> candle_core::Result<Batch>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot collate `{Item}` examples",
    note = "pass a closure `|items: &[Item], device: &Device| -> candle_core::Result<Batch>` or implement `adabatch::Collate`"
)]
pub trait Collate<Item>: Sync {
    /// The batch produced.
    type Batch: Batch;
    /// Collates `items` (never empty) onto `device`.
    fn collate(&self, items: &[Item], device: &Device) -> candle_core::Result<Self::Batch>;
}

impl<Item, B: Batch, F> Collate<Item> for F
where
    F: Fn(&[Item], &Device) -> candle_core::Result<B> + Sync,
{
    type Batch = B;
    fn collate(&self, items: &[Item], device: &Device) -> candle_core::Result<B> {
        self(items, device)
    }
}
