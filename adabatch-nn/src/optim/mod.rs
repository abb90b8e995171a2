//! The optimizer's fused update: AdamW's arithmetic ([`AdamWStep`]) and, with the
//! `cuda` feature, its moments and one-kernel update on the device.

mod adamw;
#[cfg(feature = "cuda")]
mod cuda;

pub use adamw::AdamWStep;
#[cfg(feature = "cuda")]
pub use cuda::CudaMoments;
