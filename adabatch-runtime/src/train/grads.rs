//! Arithmetic on a step's gradients, aligned with the trained parameters (`None`
//! where a parameter got none).

use candle_core::{DType, Tensor};

use crate::error::Result;

/// `g` added into `slot` (the first gradient is kept as it is).
pub(crate) fn add_into(slot: &mut Option<Tensor>, g: &Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        Some(acc) => (acc + g)?,
        None => g.clone(),
    });
    Ok(())
}

/// Every gradient multiplied by `factor`.
pub(crate) fn scale_grads(grads: Vec<Option<Tensor>>, factor: f64) -> Result<Vec<Option<Tensor>>> {
    Ok(grads
        .into_iter()
        .map(|g| g.map(|g| g * factor).transpose())
        .collect::<candle_core::Result<Vec<_>>>()?)
}

/// The gradients' global norm, each first multiplied by its `preconditioner`
/// where one is given; in f64.
pub(crate) fn global_norm(
    grads: &[Option<Tensor>],
    preconditioner: Option<&[Option<Tensor>]>,
) -> Result<f64> {
    let mut sum = 0.0;
    for (i, g) in grads.iter().enumerate() {
        let Some(g) = g else { continue };
        let g = g.to_dtype(DType::F64)?;
        let g = match preconditioner
            .and_then(|p| p.get(i))
            .and_then(Option::as_ref)
        {
            Some(p) => g.mul(&p.to_dtype(DType::F64)?)?,
            None => g,
        };
        sum += g.sqr()?.sum_all()?.to_scalar::<f64>()?;
    }
    Ok(sum.sqrt())
}
