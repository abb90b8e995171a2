//! A rank's examples turned into a batch, and a rank's work guarded: the pieces
//! the step and the prefetch threads share.

use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::Device;

use crate::error::{DataError, DistributedError, Error, Result};
use crate::user::data::{Collate, Dataset};
use crate::user::train_model::Batch;

/// Runs `f`, turning a panic into this rank's error.
pub(crate) fn guarded<R>(rank: usize, f: impl FnOnce() -> Result<R>) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::Distributed(DistributedError::RankPanicked {
            rank,
            message: panic_message(&*p),
        }))
    })
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// The examples at `indices`, collated onto `device`.
pub(crate) fn collate_indices<D, C>(
    dataset: &D,
    collate: &C,
    device: &Device,
    indices: &[usize],
) -> Result<C::Batch>
where
    D: Dataset + ?Sized,
    C: Collate<D::Item>,
{
    let items: Vec<D::Item> = indices.iter().map(|&i| dataset.get(i)).collect();
    let batch = collate.collate(&items, device)?;
    if batch.num_examples() != items.len() {
        return Err(Error::Data(DataError::CollateSize {
            returned: batch.num_examples(),
            items: items.len(),
        }));
    }
    Ok(batch)
}
