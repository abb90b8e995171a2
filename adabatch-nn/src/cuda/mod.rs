//! The CUDA side of the fused ops: what an op's kernel is ([`kernel`], plain data
//! in every build, so the CPU tests check each op's choice) and, with the `cuda`
//! feature, the fatbins of `kernels/` and the one launcher of the row kernels.

pub(crate) mod kernel;
#[cfg(feature = "cuda")]
mod launch;

#[cfg(feature = "cuda")]
pub(crate) use launch::*;
