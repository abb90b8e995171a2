//! The CUDA side of the fused ops: what an op's kernel is and how it is launched
//! ([`kernel`], [`limits`]: plain data in every build, so the CPU tests check each
//! op's choice), with the `cuda` feature the fatbins of `kernels/` and their one
//! launcher, and with `kernels-on-cpu` the harness that runs the same launches
//! on the CPU ([`harness`]).

#[cfg(feature = "kernels-on-cpu")]
pub(crate) mod harness;
pub(crate) mod kernel;
#[cfg(feature = "cuda")]
mod launch;
pub(crate) mod limits;

#[cfg(feature = "cuda")]
pub(crate) use launch::*;
