//! The differentiable fused ops, one file each, on one frame ([`rows`]): each
//! file reads as its arithmetic, forward and backward; [`cpu`] holds the CPU
//! bodies' plumbing (rows over candle's thread pool, the accumulation types).

pub(crate) mod cpu;
mod cross_entropy;
mod norm;
mod rope;
pub(crate) mod rotary_embedding;
pub(crate) mod rows;
mod softmax;

pub use cross_entropy::cross_entropy_rows;
#[cfg(all(test, feature = "kernels-on-cpu"))]
pub(crate) use cross_entropy::cross_entropy_rows_unwidened;
pub use norm::{LayerNorm, RmsNorm, layer_norm, rms_norm};
pub use rope::{rope, rope_i, rope_thd};
pub use rotary_embedding::RotaryEmbedding;
pub use rows::{cuda_bodies_enabled, set_cuda_bodies};
pub use softmax::softmax_last_dim;
