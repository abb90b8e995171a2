//! Rotary position embeddings in candle-nn's three layouts, with a backward.

use candle_core::{Result, Tensor};

/// Rotates the halves of the last dimension (`x` `[b, h, t, d]`, `cos`/`sin`
/// `[t, d/2]`); candle-nn's `rotary_emb::rope` with a backward.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    candle_nn::rotary_emb::rope_slow(x, cos, sin)
}

/// Rotates interleaved pairs (`x` `[b, h, t, d]`); candle-nn's
/// `rotary_emb::rope_i` with a backward.
pub fn rope_i(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    candle_nn::rotary_emb::rope_i_slow(x, cos, sin)
}

/// [`rope`] on the `[b, t, h, d]` layout; candle-nn's `rotary_emb::rope_thd` with a
/// backward.
pub fn rope_thd(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rope(&x.transpose(1, 2)?.contiguous()?, cos, sin)?
        .transpose(1, 2)?
        .contiguous()
}
