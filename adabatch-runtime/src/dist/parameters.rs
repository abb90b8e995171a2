//! The model's parameters made the same on every rank.

use candle_core::{Tensor, Var};

use crate::dist::communicator::Communicator;
use crate::error::{DistributedError, Error, Result};

/// Makes every rank start from rank 0's weights, after checking they agree on the
/// parameter set.
pub(crate) fn synchronise_parameters(
    comm: &impl Communicator,
    params: &[(String, Var)],
) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let elems: usize = params.iter().map(|(_, v)| v.elem_count()).sum();
    let mut totals = [params.len() as f64, elems as f64];
    comm.all_reduce_sum(&mut [], &mut totals)?;
    let world = comm.world_size() as f64;
    if totals != [params.len() as f64 * world, elems as f64 * world] {
        return Err(Error::Distributed(DistributedError::ParameterMismatch {
            rank: comm.rank(),
            detail: format!(
                "this rank has {} tensors / {elems} values; the group disagrees",
                params.len()
            ),
        }));
    }
    let mut tensors: Vec<Tensor> = params.iter().map(|(_, v)| v.as_tensor().clone()).collect();
    comm.broadcast(&mut tensors, 0)?;
    for ((_, var), value) in params.iter().zip(&tensors) {
        var.set(value)?;
    }
    Ok(())
}
