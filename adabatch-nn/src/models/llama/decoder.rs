//! The decoder: token embedding, decoder layers, final norm, language-model head.

use candle_core::{DType, Module, Result, Tensor, Var};
use candle_nn::{Embedding, Linear, VarBuilder};

use super::attention::Frame;
use super::config::LlamaConfig;
use super::layer::DecoderLayer;
use super::linear::{embedding, linear, push_linear};
use super::rms_norm::Norm;
use crate::{RotaryEmbedding, positions_in_documents};

/// A trainable Llama-family decoder (Llama, Mistral, Qwen2 shapes) for causal
/// language modelling: token ids `[b, t]` → logits `[b, t, vocab]`.
///
/// Built through a [`VarBuilder`] under Hugging Face's weight names
/// (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ...,
/// `model.norm.weight`, `lm_head.weight` unless tied): from an
/// `adabatch::Parameters` store it creates seeded weights
/// initialised as transformers does, from saved safetensors it loads them. Its
/// norms, softmax and ropes are adabatch's differentiable ops, so every weight gets
/// a gradient. The rotary tables and the masks are computed in each forward, never
/// requested from the `VarBuilder` (a `Parameters` store would make them
/// trainable).
#[derive(Clone, Debug)]
pub struct Llama {
    config: LlamaConfig,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: Norm,
    /// Over the embedding's own weight when the embeddings are tied.
    lm_head: Linear,
    rotary: RotaryEmbedding,
}

impl Llama {
    /// Validates `config` and builds the model under `vb` (the root: names start
    /// with `model.` and `lm_head.`). Weights take `vb`'s dtype and device.
    pub fn new(config: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        let (hidden, vocab, std) = (
            config.hidden_size,
            config.vocab_size,
            config.initializer_range,
        );
        let m = vb.pp("model");
        let embed_tokens = embedding(vocab, hidden, std, m.pp("embed_tokens"))?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::new(config, i, m.pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        let norm = Norm::load(hidden, config.rms_norm_eps, m.pp("norm"))?;
        let lm_head = if config.tie_word_embeddings {
            Linear::new(embed_tokens.embeddings().clone(), None)
        } else {
            linear(hidden, vocab, false, std, vb.pp("lm_head"))?
        };
        let rotary = RotaryEmbedding::new(config.head_dim, config.rope_theta, vb.device())?;
        Ok(Self {
            config: config.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
            rotary,
        })
    }

    /// The device the weights are on.
    pub fn device(&self) -> &candle_core::Device {
        self.embed_tokens.embeddings().device()
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Logits `[b, t, vocab]` (f32) of `input_ids` `[b, t]` (u32 or i64): positions
    /// `0..t` in every row, each token attending to itself and the tokens before
    /// it.
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.forward_packed(input_ids, None, None)
    }

    /// Logits `[b, t, vocab]` (f32) of rows that pack several documents.
    ///
    /// - `document_ids` `[b, t]` (any integer dtype): a token attends only to
    ///   tokens of its own document (equal ids) at or before it — the
    ///   block-diagonal causal mask of packing.
    /// - `position_ids` `[b, t]` (u32 or i64): the rotary positions. Left out,
    ///   they restart at 0 in every document of `document_ids`
    ///   ([`positions_in_documents`]), or run `0..t` without documents.
    ///
    /// With both, each document computes what it computes alone. (transformers
    /// infers the documents from restarting `position_ids`; here they are
    /// explicit.)
    pub fn forward_packed(
        &self,
        input_ids: &Tensor,
        position_ids: Option<&Tensor>,
        document_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        let frame = self.frame(input_ids, position_ids, document_ids)?;
        let mut x = self.embed_tokens.forward(input_ids)?;
        for layer in &self.layers {
            x = layer.forward(&x, &frame)?;
        }
        let x = self.norm.forward(&x)?;
        crate::autocast_linear(&self.lm_head, &x)?.to_dtype(DType::F32)
    }

    /// The rotary tables and masks every layer shares, after checking the shapes
    /// of the position and document ids.
    fn frame(
        &self,
        input_ids: &Tensor,
        position_ids: Option<&Tensor>,
        document_ids: Option<&Tensor>,
    ) -> Result<Frame> {
        let (b, t) = input_ids.dims2()?;
        for (name, given) in [
            ("position_ids", position_ids),
            ("document_ids", document_ids),
        ] {
            if let Some(given) = given {
                if given.dims() != [b, t] {
                    candle_core::bail!(
                        "Llama: input_ids are [{b}, {t}] but {name} is {:?}",
                        given.dims()
                    );
                }
            }
        }
        let device = input_ids.device();
        let positions = match (position_ids, document_ids) {
            (Some(positions), _) => positions.clone(),
            (None, Some(documents)) => positions_in_documents(documents)?,
            (None, None) => Tensor::arange(0u32, t as u32, device)?
                .unsqueeze(0)?
                .broadcast_as((b, t))?,
        };
        let dtype = self.embed_tokens.embeddings().dtype();
        Frame::new(&self.config, &self.rotary, &positions, document_ids, dtype)
    }

    /// Every weight under its Hugging Face name, in the model's order
    /// (`lm_head.weight` only when untied): what a `model.safetensors` holds.
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![(
            "model.embed_tokens.weight".to_string(),
            self.embed_tokens.embeddings().clone(),
        )];
        for (i, layer) in self.layers.iter().enumerate() {
            layer.push_named(&mut out, &format!("model.layers.{i}"));
        }
        out.push(("model.norm.weight".to_string(), self.norm.weight().clone()));
        if !self.config.tie_word_embeddings {
            push_linear(&mut out, "lm_head", &self.lm_head);
        }
        out
    }

    /// The weights that are trainable variables (all of them when built from a
    /// `adabatch::Parameters` store (or a `VarMap`); none when loaded from
    /// safetensors), under their Hugging Face names. They are the store's own
    /// variables: `Parameters::named_parameters` lists the same ones, sorted.
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        self.named_tensors()
            .into_iter()
            .filter(|(_, tensor)| tensor.is_variable())
            .filter_map(|(name, tensor)| Var::from_tensor(&tensor).ok().map(|v| (name, v)))
            .collect()
    }
}

#[cfg(test)]
impl Llama {
    /// The same model with candle-nn's fused `RmsNorm` in place of adabatch's:
    /// what a model built on candle-nn's ops trains.
    pub(crate) fn with_candle_nn_norms(mut self) -> Self {
        let eps = self.config.rms_norm_eps;
        let swap =
            |norm: &Norm| Norm::CandleNn(candle_nn::RmsNorm::new(norm.weight().clone(), eps));
        for layer in &mut self.layers {
            layer.input_layernorm = swap(&layer.input_layernorm);
            layer.post_attention_layernorm = swap(&layer.post_attention_layernorm);
        }
        self.norm = swap(&self.norm);
        self
    }
}
