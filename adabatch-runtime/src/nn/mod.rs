//! Differentiable building blocks candle-nn lacks.
//!
//! In candle-nn 0.11.1, `ops::rms_norm`, `ops::layer_norm`, `ops::softmax_last_dim`
//! and the three `rotary_emb` ropes are fused ops built with `apply_op*_no_bwd`: a
//! model built on them trains only the parameters that lie past them (the engine's
//! gradient-coverage guard stops such a run after its first step). The functions
//! here have the same signatures and the same forward values, and a backward.

mod cpu;
mod norm;
mod rope;
mod softmax;
#[cfg(test)]
mod testing;

pub use norm::{layer_norm, rms_norm, LayerNorm, RmsNorm};
pub use rope::{rope, rope_i, rope_thd};
pub use softmax::softmax_last_dim;
