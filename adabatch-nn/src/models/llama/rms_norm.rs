//! The model's RMS norms.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use crate::RmsNorm;

/// An RMS norm of the model: adabatch's differentiable [`RmsNorm`]. candle-nn's
/// fused norm has no backward, so a model built on it would leave its norm
/// weights untrained; the tests swap it in to show exactly that.
#[derive(Clone, Debug)]
pub(crate) enum Norm {
    /// What the model uses.
    Trainable(RmsNorm),
    /// candle-nn's `RmsNorm` (fused op, no backward); only the tests build it.
    #[cfg(test)]
    CandleNn(candle_nn::RmsNorm),
}

impl Norm {
    /// A `weight` of ones under `vb` (Hugging Face's initialisation).
    pub(crate) fn load(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self::Trainable(RmsNorm::load(size, eps, vb)?))
    }

    /// The scale, `[hidden]`.
    pub(crate) fn weight(&self) -> &Tensor {
        match self {
            Norm::Trainable(norm) => norm.weight(),
            #[cfg(test)]
            Norm::CandleNn(norm) => norm.weight(),
        }
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Trainable(norm) => norm.forward(x),
            #[cfg(test)]
            Norm::CandleNn(norm) => norm.forward(x),
        }
    }
}
