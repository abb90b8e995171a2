//! Grouped-query self-attention with rotary positions: one fused op
//! ([`packed_attention`]) where it runs fused on CUDA, else written out (matmul,
//! additive mask, softmax, matmul) as transformers' eager attention.

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{Linear, VarBuilder};

use super::config::LlamaConfig;
use super::linear::{linear, push_linear};
use crate::attention::{self, composite, tiled};
use crate::ops::rotary_embedding::rotate_heads_first as rotate;
use crate::{RotaryEmbedding, attention_bias, packed_attention};
use crate::{autocast, autocast_linear};

/// Whether the layers' attention is the fused [`packed_attention`] on `device`:
/// on CUDA where its body runs (`cuda_bodies_enabled`). Not on CPU: there the
/// fused body, faster on the example decoder's packed rows, was slower than the
/// composite's matrix products (candle's gemm) on full causal rows of 64, which
/// `benches/llama_compare.rs` times (BENCHMARKS.md).
fn fused_attention(device: &Device) -> bool {
    #[cfg(test)]
    if device.is_cpu() && super::tests::FUSED_ON_CPU.get() {
        return true;
    }
    !device.is_cpu() && attention::runs_fused(device)
}

/// What every layer's attention needs of a forward's tokens, computed once.
///
/// The query heads that share a key/value head are stacked along the time axis
/// (see [`Attention::forward`]), so the queries' tables and the masks repeat per
/// group: `g` below is `num_attention_heads / num_key_value_heads`.
#[derive(Debug)]
pub(crate) struct Frame {
    /// `[b·t, head_dim / 2]`: the rotary tables of every token of the batch, for
    /// the keys.
    cos: Tensor,
    /// `[b·t, head_dim / 2]`.
    sin: Tensor,
    /// `[b·g·t, head_dim / 2]`: the tables for the queries, times `1/√head_dim`:
    /// rotating a query then scales it too, and the scores, `t/head_dim` times
    /// larger than the queries, need no pass of their own (forward and backward).
    q_cos: Tensor,
    /// `sin · 1/√head_dim`, `[b·g·t, head_dim / 2]`.
    q_sin: Tensor,
    /// The additive bias `[1, b or 1, g·t, t]` of each sliding window in use
    /// (`None`: full causal attention), for the composite attention.
    biases: Vec<(Option<usize>, Tensor)>,
    /// The fused attention's document ids `[b, t]`, when it runs fused (`None`
    /// without documents); `None` otherwise.
    fused: Option<Option<Tensor>>,
}

impl Frame {
    /// The tables and masks of a forward: `positions` `[b, t]`, `document_ids`
    /// `[b, t]` if the rows are packed, weights of `dtype`.
    pub(crate) fn new(
        cfg: &LlamaConfig,
        rotary: &RotaryEmbedding,
        positions: &Tensor,
        document_ids: Option<&Tensor>,
        dtype: DType,
    ) -> Result<Self> {
        let (b, t) = positions.dims2()?;
        let g = cfg.kv_groups();
        let (cos, sin) = rotary.cos_sin(&positions.flatten_all()?, dtype)?;
        let scale = (cfg.head_dim as f64).powf(-0.5);
        let per_group = |table: &Tensor| -> Result<Tensor> {
            let half = table.dim(1)?;
            let tiled = table
                .reshape((b, 1, t, half))?
                .broadcast_as((b, g, t, half))?;
            tiled.reshape((b * g * t, half))? * scale
        };
        let (q_cos, q_sin) = (per_group(&cos)?, per_group(&sin)?);
        let fused = fused_attention(positions.device()).then(|| document_ids.cloned());
        let mut biases: Vec<(Option<usize>, Tensor)> = Vec::new();
        let windows = (0..cfg.num_hidden_layers).map(|i| cfg.sliding_window_of_layer(i));
        for window in windows.filter(|_| fused.is_none()) {
            if biases.iter().all(|(w, _)| *w != window) {
                let bias = attention_bias(t, document_ids, window, dtype, positions.device())?;
                biases.push((window, tiled(&bias, g)?));
            }
        }
        Ok(Self {
            cos,
            sin,
            q_cos,
            q_sin,
            biases,
            fused,
        })
    }

    fn bias(&self, window: Option<usize>) -> Result<&Tensor> {
        match self.biases.iter().find(|(w, _)| *w == window) {
            Some((_, bias)) => Ok(bias),
            None => candle_core::bail!("no attention mask was built for window {window:?}"),
        }
    }
}

/// `q_proj`, `k_proj`, `v_proj`, `o_proj` and the head layout of one layer.
#[derive(Clone, Debug)]
pub(crate) struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// This layer's sliding window, if any.
    window: Option<usize>,
}

impl Attention {
    /// Layer `layer`'s projections under `vb` (its `self_attn`).
    pub(crate) fn new(cfg: &LlamaConfig, layer: usize, vb: VarBuilder) -> Result<Self> {
        let (hidden, d, std) = (cfg.hidden_size, cfg.head_dim, cfg.initializer_range);
        let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        let qkv_bias = cfg.qkv_bias();
        Ok(Self {
            q_proj: linear(hidden, q, qkv_bias, std, vb.pp("q_proj"))?,
            k_proj: linear(hidden, kv, qkv_bias, std, vb.pp("k_proj"))?,
            v_proj: linear(hidden, kv, qkv_bias, std, vb.pp("v_proj"))?,
            o_proj: linear(q, hidden, cfg.o_bias(), std, vb.pp("o_proj"))?,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: d,
            window: cfg.sliding_window_of_layer(layer),
        })
    }

    /// Appends the projections' tensors under `prefix` (e.g.
    /// `model.layers.0.self_attn`).
    pub(crate) fn push_named(&self, out: &mut Vec<(String, Tensor)>, prefix: &str) {
        for (name, layer) in [
            ("q_proj", &self.q_proj),
            ("k_proj", &self.k_proj),
            ("v_proj", &self.v_proj),
            ("o_proj", &self.o_proj),
        ] {
            push_linear(out, &format!("{prefix}.{name}"), layer);
        }
    }

    /// `x` `[b, t, hidden]` → `[b, t, hidden]`.
    ///
    /// Heads lead (transformers uses `[b, heads, t, head_dim]`), and the `g` query
    /// heads that share a key/value head are stacked along the time axis: queries
    /// `[kv_heads, b, g·t, head_dim]` against keys and values `[kv_heads, b, t,
    /// head_dim]`. The scores are the same products as transformers' with
    /// `repeat_kv`, without copying keys and values `g` times (nor summing their
    /// gradients back), in `kv_heads·b` products of `g·t` rows instead of
    /// `heads·b` of `t`. `rope` takes one table row per query row (see `nn::rotary_embedding::rotate_heads_first`).
    ///
    /// Under `--bf16` / `--fp16` ([`autocast`]) the projections, ropes and the two
    /// attention products compute in half precision, the mask and softmax in f32
    /// (as transformers' eager attention under torch's autocast; the fused op
    /// takes half-precision q, k, v and computes its scores and softmax in f32),
    /// and the output returns in `x`'s dtype for the residual stream.
    pub(crate) fn forward(&self, x: &Tensor, frame: &Frame) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (kv, d) = (self.kv_heads, self.head_dim);
        let g = self.heads / kv;
        let q = autocast_linear(&self.q_proj, x)?
            .reshape((b, t, kv, g, d))?
            .permute((2, 0, 3, 1, 4))?
            .contiguous()?
            .reshape((kv, b, g * t, d))?;
        let k = self.heads_first(&autocast_linear(&self.k_proj, x)?)?;
        let v = self.heads_first(&autocast_linear(&self.v_proj, x)?)?;
        let q = rotate(&q, &autocast(&frame.q_cos)?, &autocast(&frame.q_sin)?)?;
        let k = rotate(&k, &autocast(&frame.cos)?, &autocast(&frame.sin)?)?;
        // The queries' tables carry 1/√head_dim: the scale is 1.
        let y = match &frame.fused {
            Some(documents) => packed_attention(&q, &k, &v, documents.as_ref(), self.window, 1.0)?,
            None => composite(&q, &k, &v, frame.bias(self.window)?, 1.0)?,
        };
        let y = y
            .reshape((kv, b, g, t, d))?
            .permute((1, 3, 0, 2, 4))?
            .reshape((b, t, self.heads * d))?;
        autocast_linear(&self.o_proj, &y)?.to_dtype(x.dtype())
    }

    /// Keys or values `[b, t, kv_heads·head_dim]` → `[kv_heads, b, t, head_dim]`,
    /// contiguous.
    fn heads_first(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        x.reshape((b, t, self.kv_heads, self.head_dim))?
            .permute((2, 0, 1, 3))?
            .contiguous()
    }
}
