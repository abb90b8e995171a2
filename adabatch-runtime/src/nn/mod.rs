//! Differentiable building blocks candle-nn lacks.
//!
//! In candle-nn 0.11.1, `ops::rms_norm`, `ops::layer_norm`, `ops::softmax_last_dim`
//! and the three `rotary_emb` ropes are fused ops built with `apply_op*_no_bwd`: a
//! model built on them trains only the parameters that lie past them (the engine's
//! gradient-coverage guard stops such a run after its first step). The functions
//! here have the same signatures and the same forward values, and a backward.
//!
//! On CPU each is a fused candle custom op whose forward follows candle-nn's kernel
//! step for step (the same values, bit for bit, in every dtype candle-nn's kernel
//! takes: bf16, f16, f32, and f64 for the softmax and ropes; the norms take f64
//! too, which candle-nn's kernels refuse) and whose backward is a second fused op;
//! rows are split over candle's CPU thread pool. On other devices (CUDA, Metal)
//! each falls back to a composite of candle ops, which candle differentiates:
//! correct, but not fused. Gradients are first-order: the backward ops have no
//! backward of their own.
//!
//! The porting guide, `docs/porting.md` at the root of the adabatch repository,
//! says how to make a candle-transformers model file trainable with these: which
//! calls to swap, why rope tables and masks must be plain tensors, how to write
//! attention without `sdpa`, and where a KV cache goes.

mod cpu;
mod cross_entropy;
mod norm;
mod rope;
mod softmax;
#[cfg(test)]
mod testing;

pub use cross_entropy::cross_entropy_rows;
pub use norm::{layer_norm, rms_norm, LayerNorm, RmsNorm};
pub use rope::{rope, rope_i, rope_thd};
pub use softmax::softmax_last_dim;
