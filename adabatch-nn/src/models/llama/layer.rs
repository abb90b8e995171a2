//! One pre-norm decoder layer.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::attention::{Attention, Frame};
use super::config::LlamaConfig;
use super::mlp::Mlp;
use super::rms_norm::Norm;

/// `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Clone, Debug)]
pub(crate) struct DecoderLayer {
    pub(crate) input_layernorm: Norm,
    pub(crate) self_attn: Attention,
    pub(crate) post_attention_layernorm: Norm,
    pub(crate) mlp: Mlp,
}

impl DecoderLayer {
    /// Layer `layer` under `vb` (`model.layers.{layer}`).
    pub(crate) fn new(cfg: &LlamaConfig, layer: usize, vb: VarBuilder) -> Result<Self> {
        let (hidden, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            input_layernorm: Norm::load(hidden, eps, vb.pp("input_layernorm"))?,
            self_attn: Attention::new(cfg, layer, vb.pp("self_attn"))?,
            post_attention_layernorm: Norm::load(hidden, eps, vb.pp("post_attention_layernorm"))?,
            mlp: Mlp::new(cfg, vb.pp("mlp"))?,
        })
    }

    /// `x` `[b, t, hidden]` → `[b, t, hidden]`.
    pub(crate) fn forward(&self, x: &Tensor, frame: &Frame) -> Result<Tensor> {
        let attended = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, frame)?;
        let x = (x + attended)?;
        let fed = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?;
        x + fed
    }

    /// Appends the layer's tensors under `prefix` (`model.layers.{i}`).
    pub(crate) fn push_named(&self, out: &mut Vec<(String, Tensor)>, prefix: &str) {
        for (name, norm) in [
            ("input_layernorm", &self.input_layernorm),
            ("post_attention_layernorm", &self.post_attention_layernorm),
        ] {
            out.push((format!("{prefix}.{name}.weight"), norm.weight().clone()));
        }
        self.self_attn
            .push_named(out, &format!("{prefix}.self_attn"));
        self.mlp.push_named(out, &format!("{prefix}.mlp"));
    }
}
