//! RMS norm and layer norm over the last dimension, with a backward.

use candle_core::{Module, Result, Tensor};

/// `x / sqrt(mean(x²) + eps) * alpha` over the last dimension; candle-nn's
/// `ops::rms_norm` with a backward.
pub fn rms_norm(x: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    candle_nn::ops::rms_norm_slow(x, alpha, eps)
}

/// `(x - mean) / sqrt(var + eps) * alpha + beta` over the last dimension;
/// candle-nn's `ops::layer_norm` with a backward.
pub fn layer_norm(x: &Tensor, alpha: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
    candle_nn::ops::layer_norm_slow(x, alpha, beta, eps)
}

/// candle-nn's `RmsNorm`, trainable.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// A norm with this `weight` (shape `[hidden]`).
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps }
    }

    /// A `weight` of `size` ones under `vb` (candle-nn's `rms_norm`).
    pub fn load(size: usize, eps: f64, vb: candle_nn::VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.))?;
        Ok(Self::new(weight, eps))
    }

    /// The scale, `[hidden]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon added to the variance.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm(x, &self.weight, self.eps as f32)
    }
}

/// candle-nn's `LayerNorm` (weight and optional bias), trainable.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Option<Tensor>,
    eps: f64,
}

impl LayerNorm {
    /// A norm with this `weight` and `bias` (shape `[hidden]` each).
    pub fn new(weight: Tensor, bias: Tensor, eps: f64) -> Self {
        Self {
            weight,
            bias: Some(bias),
            eps,
        }
    }

    /// A norm with a `weight` and no bias.
    pub fn new_no_bias(weight: Tensor, eps: f64) -> Self {
        Self {
            weight,
            bias: None,
            eps,
        }
    }

    /// `weight` (ones) and `bias` (zeros) of `size` under `vb` (candle-nn's
    /// `layer_norm` with `LayerNormConfig::default()`'s affine layout).
    pub fn load(size: usize, eps: f64, vb: candle_nn::VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.))?;
        let bias = vb.get_with_hints(size, "bias", candle_nn::Init::Const(0.))?;
        Ok(Self::new(weight, bias, eps))
    }

    /// The scale, `[hidden]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The shift, `[hidden]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The epsilon added to the variance.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(bias) => layer_norm(x, &self.weight, bias, self.eps as f32),
            None => {
                let zeros = self.weight.zeros_like()?;
                layer_norm(x, &self.weight, &zeros, self.eps as f32)
            }
        }
    }
}
