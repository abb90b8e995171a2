//! Rotary position embeddings in Hugging Face's layout: angles from position ids,
//! applied to the two halves of each head with [`crate::nn::rope`].

use candle_core::{DType, Device, Result, Tensor};

/// The rotary frequencies of one head width, `1 / theta^(2i / head_dim)`.
///
/// No cos/sin table is kept: the angles of a forward's positions are computed from
/// them (a few thousand products), so any position ids work, packed rows included,
/// and no buffer of `max_position_embeddings` rows is needed.
#[derive(Clone, Debug)]
pub(crate) struct Rotary {
    /// `[1, head_dim / 2]`, f32.
    inv_freq: Tensor,
}

impl Rotary {
    /// Frequencies computed in f32, as transformers and candle-transformers do,
    /// so that the angles round alike.
    pub(crate) fn new(head_dim: usize, theta: f64, device: &Device) -> Result<Self> {
        let theta = theta as f32;
        let inv_freq: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| 1.0 / theta.powf(i as f32 / head_dim as f32))
            .collect();
        let half = inv_freq.len();
        Ok(Self {
            inv_freq: Tensor::from_vec(inv_freq, (1, half), device)?,
        })
    }

    /// cos and sin `[n, head_dim / 2]` of the angles `position · inv_freq` of
    /// `positions` `[n]` (any integer dtype), in `dtype`. The product is taken in
    /// f32, as transformers does before casting.
    pub(crate) fn cos_sin(&self, positions: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
        let angles = positions
            .to_dtype(DType::F32)?
            .unsqueeze(1)?
            .broadcast_mul(&self.inv_freq)?;
        Ok((
            angles.cos()?.to_dtype(dtype)?,
            angles.sin()?.to_dtype(dtype)?,
        ))
    }
}

/// Rotates `x` `[heads, b, t, head_dim]` by `cos`/`sin` `[b·t, head_dim / 2]` (one
/// row per token of the batch). Heads lead so that the batch and time dimensions
/// are adjacent: `x` is then `[1, heads, b·t, head_dim]` for `rope`, whose tables are
/// per time step, and every row of the batch gets its own positions.
pub(crate) fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (heads, b, t, d) = x.dims4()?;
    crate::nn::rope(&x.reshape((1, heads, b * t, d))?, cos, sin)?.reshape((heads, b, t, d))
}
