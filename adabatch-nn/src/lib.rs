//! adabatch's building blocks, apart from its engine: differentiable fused ops
//! candle-nn lacks, mixed precision's casts, and models built on them
//! ([`models::llama`]). It depends on candle alone; the `adabatch` crate re-exports
//! it as `adabatch::nn` and `adabatch::models`, so a model written against those
//! paths does not change.
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
//! rows are split over candle's CPU thread pool. With the `cuda` feature every op
//! here also has a CUDA body, forward and backward, in bf16, f16, f32 and f64
//! (`kernels/rows.cu`, shipped as SASS for the build's GPU beside PTX); they run
//! only when switched on ([`set_cuda_bodies`], or `ADABATCH_CUDA_KERNELS=1`)
//! until a GPU has checked them against these CPU twins (`gpu_check kernels`).
//! Before any GPU, each of them runs on the CPU against its twin through the
//! project's harness of the CUDA programming model (`scripts/kernels-on-cpu.sh`).
//! Elsewhere (CUDA without them, Metal) each op falls back to a composite of
//! candle ops, which candle differentiates: correct, but not fused. Gradients
//! are first-order: the backward ops have no backward of their own.
//!
//! For models of your own, and candle-transformers' ported to training:
//! - [`attention_bias`] and
//!   [`positions_in_documents`]: the block-diagonal causal
//!   mask and the restarting positions of packed rows (a mask built once for `t`
//!   tokens is wrong for packed batches);
//! - [`RotaryEmbedding`]: rotary angles from per-row positions, full or partial
//!   (Phi's `partial_rotary_factor`);
//! - [`check_gradients`]: analytic gradients against central finite differences,
//!   per parameter, in f64 (as `torch.autograd.gradcheck`). The engine's
//!   coverage guard sees a parameter with *no* gradient; only this check sees one
//!   whose gradient is partly cut (a fused op without a backward on one of two
//!   paths).
//!
//! The porting guide (`adabatch::guide::porting`, `docs/porting.md` in the
//! repository) says how to make a candle-transformers model file trainable with
//! these: which calls to swap, why rope tables and masks must be plain tensors,
//! packing and positions, configs, attention without `sdpa`, and the check.

#![warn(missing_docs)]

mod attention;
mod cuda;
mod gradcheck;
#[cfg(all(test, feature = "kernels-on-cpu"))]
mod kernels_on_cpu;
pub mod models;
mod ops;
mod optim;
mod params;
mod precision;
#[cfg(test)]
mod testing;

pub use attention::{attention_bias, packed_attention, positions_in_documents};
/// The CUDA bodies on the CPU (feature `kernels-on-cpu`, test code: see
/// `scripts/kernels-on-cpu.sh`).
#[cfg(feature = "kernels-on-cpu")]
#[doc(hidden)]
pub use cuda::harness::{kernel_names, with_kernels_on_cpu};
pub use gradcheck::{GradCheck, GradCheckOptions, ParamCheck, check_gradients};
pub use ops::{
    LayerNorm, RmsNorm, RotaryEmbedding, cross_entropy_rows, cuda_bodies_enabled, layer_norm,
    rms_norm, rope, rope_i, rope_thd, set_cuda_bodies, softmax_last_dim,
};
pub use optim::AdamWStep;
#[cfg(feature = "cuda")]
pub use optim::CudaMoments;
pub use params::Parameters;
pub use precision::{AutocastScope, autocast, autocast_linear};
