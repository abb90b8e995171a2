//! The packed attention's CUDA bodies (to come: `kernels/attention.cu`).

use candle_core::cuda_backend::CudaStorage;
use candle_core::{bail, Layout, Result, Tensor};

use super::attention_layout::Geometry;

/// The forward on CUDA: the output and the rows' log-sum-exp.
pub(super) fn forward(
    _geo: &Geometry,
    _inputs: [(&CudaStorage, &Layout); 3],
    _ids: Option<&Tensor>,
) -> Result<(CudaStorage, Tensor)> {
    bail!("packed_attention: no CUDA body yet")
}

/// The backward on CUDA: `[dq | dk | dv]`.
pub(super) fn backward(
    _geo: &Geometry,
    _inputs: [(&CudaStorage, &Layout); 3],
    _saved: [&Tensor; 3],
    _ids: Option<&Tensor>,
) -> Result<CudaStorage> {
    bail!("packed_attention: no CUDA body yet")
}
