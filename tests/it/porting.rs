//! Porting a model, verified: a Phi-like decoder layer (partial rotary embedding:
//! half of each head rotates, as `partial_rotary_factor = 0.5`) written with the
//! public pieces of `adabatch::nn`, the way the porting guide says.
//!
//! With candle-nn's fused rope (no backward) on the rotated half, `q_proj`, `k_proj`
//! and the embedding still get a gradient through the unrotated half: the engine's coverage
//! guard sees every parameter with a gradient, and training would run on wrong
//! gradients. `check_gradients` catches it; with `adabatch::nn`'s rope it passes.
//! The packed-attention pieces give each document of a packed row what it
//! computes alone.

use adabatch::candle_core::{DType, Device, Result, Tensor, D};
use adabatch::candle_nn::{self, linear_no_bias, Embedding, Linear, Module, VarBuilder};
use adabatch::nn::{
    attention_bias, check_gradients, positions_in_documents, softmax_last_dim, GradCheckOptions,
    LayerNorm, RotaryEmbedding,
};
use adabatch::Parameters;

const VOCAB: usize = 13;
const HIDDEN: usize = 8;
const HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
/// `partial_rotary_factor = 0.5`: the first half of each head rotates.
const ROTARY_DIM: usize = HEAD_DIM / 2;

/// Which rope rotates the rotary half.
#[derive(Clone, Copy, PartialEq)]
enum Rope {
    /// `candle_nn::rotary_emb::rope`: right values, no backward.
    CandleNn,
    /// `adabatch::nn::RotaryEmbedding::apply`: the same values with a backward.
    Ported,
}

struct PhiLike {
    embed: Embedding,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    dense: Linear,
    norm: LayerNorm,
    lm_head: Linear,
    rotary: RotaryEmbedding,
    rope: Rope,
}

impl PhiLike {
    fn new(vb: VarBuilder, rope: Rope) -> Result<Self> {
        Ok(Self {
            embed: candle_nn::embedding(VOCAB, HIDDEN, vb.pp("embed_tokens"))?,
            q_proj: linear_no_bias(HIDDEN, HIDDEN, vb.pp("q_proj"))?,
            k_proj: linear_no_bias(HIDDEN, HIDDEN, vb.pp("k_proj"))?,
            v_proj: linear_no_bias(HIDDEN, HIDDEN, vb.pp("v_proj"))?,
            dense: linear_no_bias(HIDDEN, HIDDEN, vb.pp("dense"))?,
            norm: LayerNorm::load(HIDDEN, 1e-5, vb.pp("final_layernorm"))?,
            lm_head: linear_no_bias(HIDDEN, VOCAB, vb.pp("lm_head"))?,
            rotary: RotaryEmbedding::new(ROTARY_DIM, 10_000.0, vb.device())?,
            rope,
        })
    }

    /// `[b, t, hidden]` → `[b, heads, t, head_dim]`.
    fn heads(x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        x.reshape((b, t, HEADS, HEAD_DIM))?
            .transpose(1, 2)?
            .contiguous()
    }

    fn rotate(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        match self.rope {
            Rope::Ported => self.rotary.apply(x, positions),
            Rope::CandleNn => {
                let (b, _, t, _) = x.dims4()?;
                let (cos, sin) = self.rotary.cos_sin(&positions.flatten_all()?, x.dtype())?;
                let (cos, sin) = (
                    cos.reshape((b, t, ROTARY_DIM / 2))?,
                    sin.reshape((b, t, ROTARY_DIM / 2))?,
                );
                let rotated = x.narrow(3, 0, ROTARY_DIM)?.contiguous()?;
                let rotated = candle_nn::rotary_emb::rope(&rotated, &cos, &sin)?;
                let passed = x.narrow(3, ROTARY_DIM, HEAD_DIM - ROTARY_DIM)?;
                Tensor::cat(&[rotated, passed], 3)
            }
        }
    }

    /// Logits `[b, t, vocab]` of `ids` `[b, t]`; `documents` `[b, t]` for packed rows.
    fn forward(&self, ids: &Tensor, documents: Option<&Tensor>) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let positions = match documents {
            Some(documents) => positions_in_documents(documents)?,
            None => Tensor::arange(0u32, t as u32, ids.device())?
                .unsqueeze(0)?
                .broadcast_as((b, t))?
                .contiguous()?,
        };
        let x = self.embed.forward(ids)?;
        let q = self.rotate(&Self::heads(&self.q_proj.forward(&x)?)?, &positions)?;
        let k = self.rotate(&Self::heads(&self.k_proj.forward(&x)?)?, &positions)?;
        let v = Self::heads(&self.v_proj.forward(&x)?)?;
        let bias = attention_bias(t, documents, None, x.dtype(), x.device())?.unsqueeze(1)?;
        let scores = (q.matmul(&k.t()?)? * (HEAD_DIM as f64).powf(-0.5))?.broadcast_add(&bias)?;
        let y = softmax_last_dim(&scores)?.matmul(&v)?;
        let y = y.transpose(1, 2)?.reshape((b, t, HIDDEN))?;
        let x = (x + self.dense.forward(&y)?)?;
        self.lm_head.forward(&self.norm.forward(&x)?)
    }

    /// Summed next-token cross-entropy of `ids`.
    fn loss(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dim(1)?;
        let logits = self.forward(&ids.narrow(1, 0, t - 1)?, None)?;
        let targets = ids.narrow(1, 1, t - 1)?.flatten_all()?;
        let log_probs = candle_nn::ops::log_softmax(&logits.flatten_to(1)?, D::Minus1)?;
        log_probs
            .gather(&targets.unsqueeze(1)?, 1)?
            .neg()?
            .sum_all()
    }
}

fn model(rope: Rope) -> Result<(PhiLike, Parameters)> {
    let params = Parameters::new(7);
    let model = PhiLike::new(params.var_builder(DType::F64, &Device::Cpu), rope)?;
    Ok((model, params))
}

fn batch() -> Result<Tensor> {
    Tensor::new(&[[1u32, 5, 9, 2, 11, 3], [4, 4, 8, 12, 0, 6]], &Device::Cpu)
}

#[test]
fn the_gradient_check_catches_candle_nns_rope_in_a_partial_rotary_model() -> Result<()> {
    let (model, params) = model(Rope::CandleNn)?;
    let ids = batch()?;
    // What the coverage guard sees: every parameter has a gradient.
    let grads = model.loss(&ids)?.backward()?;
    for (name, var) in params.named_parameters() {
        assert!(grads.get(&var).is_some(), "{name} has no gradient at all");
    }
    let report = check_gradients(
        &params.named_parameters(),
        || model.loss(&ids),
        &GradCheckOptions::default(),
    )?;
    let mut failed: Vec<&str> = report.failures().map(|p| p.name.as_str()).collect();
    failed.sort();
    // Every parameter before the rope: the projections it rotates, and the
    // embedding beneath them (which also reaches the loss through `v_proj` and the
    // residual, so it too has a gradient, a wrong one).
    assert_eq!(
        failed,
        ["embed_tokens.weight", "k_proj.weight", "q_proj.weight"],
        "{report}"
    );
    assert!(
        report.to_string().contains("3 of 8 parameters disagree"),
        "{report}"
    );
    Ok(())
}

#[test]
fn the_ported_partial_rotary_model_passes_the_gradient_check() -> Result<()> {
    let (model, params) = model(Rope::Ported)?;
    let ids = batch()?;
    let report = check_gradients(
        &params.named_parameters(),
        || model.loss(&ids),
        &GradCheckOptions::default(),
    )?;
    assert!(report.passed(), "{report}");
    assert_eq!(report.params.len(), 8);
    // The two ropes compute the same values: only the backward differs.
    let candle_nn_model =
        PhiLike::new(params.var_builder(DType::F64, &Device::Cpu), Rope::CandleNn)?;
    let same = (model.forward(&ids, None)? - candle_nn_model.forward(&ids, None)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f64>()?;
    assert_eq!(same, 0.0);
    Ok(())
}

#[test]
fn a_packed_row_computes_what_its_documents_compute_alone() -> Result<()> {
    let (model, _) = model(Rope::Ported)?;
    let first = Tensor::new(&[[1u32, 5, 9, 2]], &Device::Cpu)?;
    let second = Tensor::new(&[[11u32, 3, 7]], &Device::Cpu)?;
    let packed = Tensor::cat(&[&first, &second], 1)?;
    let documents = Tensor::new(&[[0u32, 0, 0, 0, 1, 1, 1]], &Device::Cpu)?;
    let together = model.forward(&packed, Some(&documents))?;
    let alone = Tensor::cat(
        &[model.forward(&first, None)?, model.forward(&second, None)?],
        1,
    )?;
    let gap = (together - &alone)?.abs()?.max_all()?.to_scalar::<f64>()?;
    assert!(gap < 1e-12, "packed and alone differ by {gap}");
    // A mask built once for the row (causal only, positions 0..t) is not that.
    let unpacked = model.forward(&packed, None)?;
    let gap = (unpacked - alone)?.abs()?.max_all()?.to_scalar::<f64>()?;
    assert!(gap > 1e-3, "the causal mask alone should mix the documents");
    Ok(())
}
