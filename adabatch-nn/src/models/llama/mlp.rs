//! The SwiGLU feed-forward block.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};

use super::config::LlamaConfig;
use super::linear::{linear, push_linear};
use crate::autocast_linear;

/// `down_proj(silu(gate_proj(x)) · up_proj(x))`.
#[derive(Clone, Debug)]
pub(crate) struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// `gate_proj`, `up_proj`, `down_proj` under `vb` (the layer's `mlp`).
    pub(crate) fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let (h, i, bias, std) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.mlp_bias,
            cfg.initializer_range,
        );
        Ok(Self {
            gate_proj: linear(h, i, bias, std, vb.pp("gate_proj"))?,
            up_proj: linear(h, i, bias, std, vb.pp("up_proj"))?,
            down_proj: linear(i, h, bias, std, vb.pp("down_proj"))?,
        })
    }

    /// Appends the block's tensors under `prefix` (e.g. `model.layers.0.mlp`).
    pub(crate) fn push_named(&self, out: &mut Vec<(String, Tensor)>, prefix: &str) {
        push_linear(out, &format!("{prefix}.gate_proj"), &self.gate_proj);
        push_linear(out, &format!("{prefix}.up_proj"), &self.up_proj);
        push_linear(out, &format!("{prefix}.down_proj"), &self.down_proj);
    }
}

impl Module for Mlp {
    /// Under [`autocast`](crate::autocast()) in half precision, the output back in
    /// `x`'s dtype.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = autocast_linear(&self.gate_proj, x)?.silu()?;
        let hidden = (gate * autocast_linear(&self.up_proj, x)?)?;
        autocast_linear(&self.down_proj, &hidden)?.to_dtype(x.dtype())
    }
}
