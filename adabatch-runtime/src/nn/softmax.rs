//! Softmax over the last dimension, with a backward.

use candle_core::{Result, Tensor, D};

/// candle-nn's `ops::softmax_last_dim` with a backward.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    candle_nn::ops::softmax(x, D::Minus1)
}
