//! Rotary position embeddings in Hugging Face's layout: angles from position ids
//! (any positions, one table per row, so packed rows work), applied with
//! [`rope`](super::rope) to the first `rotary_dim` features of each head (all of
//! them, or a part as in Phi's `partial_rotary_factor`).
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::{positions_in_documents, RotaryEmbedding};
//! use candle_core::{DType, Device, Tensor};
//!
//! # fn main() -> candle_core::Result<()> {
//! let (b, heads, t, head_dim) = (1, 2, 5, 8);
//! // Phi's partial rotary: the first half of each head rotates, the rest passes.
//! let rotary = RotaryEmbedding::new(head_dim / 2, 10_000.0, &Device::Cpu)?;
//! let q = Tensor::randn(0f32, 1.0, (b, heads, t, head_dim), &Device::Cpu)?;
//! let documents = Tensor::new(&[[0u32, 0, 0, 1, 1]], &Device::Cpu)?;
//! let positions = positions_in_documents(&documents)?; // [[0, 1, 2, 0, 1]]
//! let rotated = rotary.apply(&q, &positions)?;
//! assert_eq!(rotated.dims(), q.dims());
//! // Position 0 is not rotated; the second document starts at position 0 again.
//! let first = |x: &Tensor, i: usize| x.narrow(2, i, 1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
//! assert_eq!(first(&rotated, 3), first(&q, 3));
//! # Ok(()) }
//! ```

use candle_core::{DType, Device, Result, Tensor};

/// The rotary frequencies of `rotary_dim` features, `1 / theta^(2i / rotary_dim)`,
/// computed in f32 as transformers and candle-transformers do, so that the angles
/// round alike.
///
/// No cos/sin table of `max_position_embeddings` rows is kept: the angles of a
/// forward's positions are computed from the frequencies (a few thousand products),
/// so any position ids work, packed rows included. Like every table of a model it
/// is a plain tensor, never a `VarBuilder` variable (which would be trained).
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    /// `[1, rotary_dim / 2]`, f32.
    inv_freq: Tensor,
    rotary_dim: usize,
}

impl RotaryEmbedding {
    /// Frequencies for the first `rotary_dim` features of a head (`head_dim` for
    /// Llama; `partial_rotary_factor · head_dim` for Phi), base `theta`
    /// (`rope_theta`). `rotary_dim` must be even and positive.
    pub fn new(rotary_dim: usize, theta: f64, device: &Device) -> Result<Self> {
        if rotary_dim == 0 || rotary_dim % 2 != 0 {
            candle_core::bail!(
                "RotaryEmbedding: rotary_dim {rotary_dim} is not a positive even number (rope rotates pairs)"
            );
        }
        let theta = theta as f32;
        let inv_freq: Vec<f32> = (0..rotary_dim)
            .step_by(2)
            .map(|i| 1.0 / theta.powf(i as f32 / rotary_dim as f32))
            .collect();
        let half = inv_freq.len();
        Ok(Self {
            inv_freq: Tensor::from_vec(inv_freq, (1, half), device)?,
            rotary_dim,
        })
    }

    /// How many features of a head rotate.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// cos and sin `[n, rotary_dim / 2]` of the angles `position · inv_freq` of
    /// `positions` `[n]` (any integer dtype), in `dtype`. The product is taken in
    /// f32, as transformers does before casting.
    pub fn cos_sin(&self, positions: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
        let angles = positions
            .to_dtype(DType::F32)?
            .unsqueeze(1)?
            .broadcast_mul(&self.inv_freq)?;
        Ok((
            angles.cos()?.to_dtype(dtype)?,
            angles.sin()?.to_dtype(dtype)?,
        ))
    }

    /// Rotates `x` `[b, heads, t, head_dim]` at `positions` `[b, t]` (each row its
    /// own positions, e.g. [`positions_in_documents`](crate::positions_in_documents)
    /// of a packed batch), in the half-split layout of transformers'
    /// `rotate_half`: the first `rotary_dim` features rotate, the others pass
    /// unchanged. Differentiable in `x` (through [`rope`](super::rope)).
    pub fn apply(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let (b, _heads, t, head_dim) = x.dims4()?;
        if positions.dims() != [b, t] {
            candle_core::bail!(
                "RotaryEmbedding::apply: x is {:?} but positions are {:?} (expected [{b}, {t}])",
                x.dims(),
                positions.dims()
            );
        }
        if self.rotary_dim > head_dim {
            candle_core::bail!(
                "RotaryEmbedding::apply: rotary_dim {} exceeds the head width {head_dim}",
                self.rotary_dim
            );
        }
        let (cos, sin) = self.cos_sin(&positions.flatten_all()?, x.dtype())?;
        let half = self.rotary_dim / 2;
        let (cos, sin) = (cos.reshape((b, t, half))?, sin.reshape((b, t, half))?);
        if self.rotary_dim == head_dim {
            return super::rope(&x.contiguous()?, &cos, &sin);
        }
        let rotated = x.narrow(3, 0, self.rotary_dim)?.contiguous()?;
        let rotated = super::rope(&rotated, &cos, &sin)?;
        let passed = x.narrow(3, self.rotary_dim, head_dim - self.rotary_dim)?;
        Tensor::cat(&[rotated, passed], 3)
    }
}

/// Rotates `x` `[heads, b, t, head_dim]` by `cos`/`sin` `[b·t, head_dim / 2]` (one
/// row per token of the batch). Heads lead so that the batch and time dimensions
/// are adjacent: `x` is then `[1, heads, b·t, head_dim]` for `rope`, whose tables are
/// per time step, and every row of the batch gets its own positions. (The Llama's
/// layout; [`RotaryEmbedding::apply`] is the one for `[b, heads, t, head_dim]`.)
pub(crate) fn rotate_heads_first(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (heads, b, t, d) = x.dims4()?;
    super::rope(&x.reshape((1, heads, b * t, d))?, cos, sin)?.reshape((heads, b, t, d))
}
