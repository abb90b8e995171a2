//! The data a user provides: a dataset of examples and a collate function that turns
//! examples into a model's batch.

use candle_core::Device;

use crate::data::source_spec::SourceSpec;
use crate::error::{DataError, Error, Result};
use crate::user::train_model::Batch;

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
    /// The named sources this dataset mixes, when it is a [`crate::Sources`]
    /// (a dataset of one source answers `None`, the default).
    fn sources(&self) -> Option<SourceSpec> {
        None
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
    pub fn new(inner: D, lengths: Vec<usize>) -> Result<Self> {
        if lengths.len() != inner.len() {
            return Err(Error::Data(DataError::LengthsMismatch {
                lengths: lengths.len(),
                examples: inner.len(),
            }));
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
    fn sources(&self) -> Option<SourceSpec> {
        self.inner.sources()
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

    /// Whether an example's loss is the same whatever its batch-mates (no
    /// attention across the examples of a batch), so that a batch's summed
    /// loss is its parts' collated apart. A step that measures each source's
    /// gradients for a mixer ([`crate::Mixer::wants_source_gradients`])
    /// collates each source's halves apart and needs it: the engine refuses
    /// such a step where this is `false`. Default `true`.
    fn examples_independent(&self) -> bool {
        true
    }
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
