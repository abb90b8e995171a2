//! The benchmark model: a small transformer classifier over bytes (does a sentence
//! contain a comma?), its corpus loader and collate, and the trainers over it.

use std::path::Path;

use adabatch::prelude::*;
use adabatch::{autocast, autocast_linear};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Embedding, Linear, Module, Optimizer, ParamsAdamW};
use clap::Args;

use super::AnyResult;

pub const PAD: u32 = 256;
pub const VOCAB: usize = 257;
pub const CLASSES: usize = 2;

#[derive(Debug, Clone, Copy, Args)]
pub struct Config {
    /// Model width.
    #[arg(long, default_value_t = 256)]
    pub d_model: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Longest input in bytes (longer sentences are truncated).
    #[arg(long, default_value_t = 256)]
    pub max_len: usize,
    /// Mixed precision in bfloat16: the linear layers and attention matmuls cast
    /// with `adabatch::autocast`; norms, softmax and the residual stream stay f32.
    #[arg(long, conflicts_with = "fp16")]
    pub bf16: bool,
    /// Mixed precision in float16 with dynamic loss scaling.
    #[arg(long)]
    pub fp16: bool,
}

impl Config {
    /// The run's mixed-precision flags from `--bf16` / `--fp16`.
    pub fn set_precision(&self, args: &mut TrainingArgs) {
        args.step.bf16 = self.bf16;
        args.step.fp16 = self.fp16;
    }
}

/// One example: bytes of a sentence and whether it contains a comma.
#[derive(Debug, Clone)]
pub struct Example {
    pub index: usize,
    pub tokens: Vec<u8>,
    pub label: u32,
}

pub fn load(path: &Path, max_len: usize) -> AnyResult<Vec<Example>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let examples: Vec<Example> = text
        .lines()
        // Blank lines (ASCII whitespace only) are skipped, as in the PyTorch script.
        .filter(|l| !l.bytes().all(|b| b.is_ascii_whitespace()))
        .enumerate()
        .map(|(index, line)| {
            let bytes = line.as_bytes();
            Example {
                index,
                tokens: bytes[..bytes.len().min(max_len)].to_vec(),
                label: u32::from(bytes.contains(&b',')),
            }
        })
        .collect();
    if examples.is_empty() {
        return Err(format!("{}: no sentences", path.display()).into());
    }
    Ok(examples)
}

pub struct TokenBatch {
    pub ids: Tensor,
    pub positions: Tensor,
    /// `[batch, 1, 1, len]`: 0 for real tokens, -1e9 for padding.
    pub attn_bias: Tensor,
    /// `[batch, len, 1]`: 1 for real tokens.
    pub mask: Tensor,
    pub labels: Tensor,
    pub tokens: usize,
}

impl Batch for TokenBatch {
    fn num_examples(&self) -> usize {
        self.labels.dims()[0]
    }
    fn num_tokens(&self) -> usize {
        self.tokens
    }
}

pub fn collate(items: &[Example], device: &Device) -> candle_core::Result<TokenBatch> {
    let b = items.len();
    let t = items
        .iter()
        .map(|e| e.tokens.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut ids = vec![PAD; b * t];
    let mut mask = vec![0f32; b * t];
    for (row, e) in items.iter().enumerate() {
        for (col, &byte) in e.tokens.iter().enumerate() {
            ids[row * t + col] = u32::from(byte);
            mask[row * t + col] = 1.0;
        }
    }
    let bias: Vec<f32> = mask
        .iter()
        .map(|&m| if m > 0.0 { 0.0 } else { -1e9 })
        .collect();
    Ok(TokenBatch {
        ids: Tensor::from_vec(ids, (b, t), device)?,
        positions: Tensor::arange(0u32, t as u32, device)?,
        attn_bias: Tensor::from_vec(bias, (b, 1, 1, t), device)?,
        mask: Tensor::from_vec(mask, (b, t, 1), device)?,
        labels: Tensor::new(items.iter().map(|e| e.label).collect::<Vec<_>>(), device)?,
        tokens: items.iter().map(|e| e.tokens.len()).sum(),
    })
}

/// LayerNorm from differentiable ops (candle-nn's fused layer-norm kernel has
/// no backward pass).
struct Norm {
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn new(d: usize, vb: candle_nn::VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            weight: vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
            bias: vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
        })
    }
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, 1e-5)
    }
}

struct Block {
    ln1: Norm,
    qkv: Linear,
    proj: Linear,
    ln2: Norm,
    fc1: Linear,
    fc2: Linear,
}

pub struct Transformer {
    cfg: Config,
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: Linear,
    pub params: Parameters,
}

impl Transformer {
    pub fn new(cfg: Config, params: Parameters, device: &Device) -> candle_core::Result<Self> {
        if cfg.heads == 0 || cfg.d_model % cfg.heads != 0 {
            candle_core::bail!(
                "d_model {} is not a multiple of heads {}",
                cfg.d_model,
                cfg.heads
            );
        }
        let vb = params.var_builder(DType::F32, device);
        let d = cfg.d_model;
        let blocks = (0..cfg.layers)
            .map(|i| {
                let vb = vb.pp(format!("block{i}"));
                Ok(Block {
                    ln1: Norm::new(d, vb.pp("ln1"))?,
                    qkv: candle_nn::linear(d, 3 * d, vb.pp("qkv"))?,
                    proj: candle_nn::linear(d, d, vb.pp("proj"))?,
                    ln2: Norm::new(d, vb.pp("ln2"))?,
                    fc1: candle_nn::linear(d, 4 * d, vb.pp("fc1"))?,
                    fc2: candle_nn::linear(4 * d, d, vb.pp("fc2"))?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            cfg,
            tok: candle_nn::embedding(VOCAB, d, vb.pp("tok"))?,
            pos: candle_nn::embedding(cfg.max_len, d, vb.pp("pos"))?,
            blocks,
            ln_f: Norm::new(d, vb.pp("ln_f"))?,
            head: candle_nn::linear(d, CLASSES, vb.pp("head"))?,
            params,
        })
    }

    pub fn num_params(&self) -> usize {
        self.params
            .named_parameters()
            .iter()
            .map(|(_, v)| v.elem_count())
            .sum()
    }

    fn attention(&self, block: &Block, x: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let h = self.cfg.heads;
        let dh = d / h;
        // Under --bf16 / --fp16 the matmuls run in half precision and the softmax
        // in f32 (as PyTorch's autocast does); in f32 runs every cast is a no-op.
        let qkv = autocast_linear(&block.qkv, x)?
            .reshape((b, t, 3, h, dh))?
            .permute((2, 0, 3, 1, 4))?;
        let q = qkv.get(0)?.contiguous()?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (dh as f64).sqrt()))?
            .to_dtype(DType::F32)?
            .broadcast_add(bias)?;
        let probs = autocast(&candle_nn::ops::softmax(&scores, D::Minus1)?)?;
        let out = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
        autocast_linear(&block.proj, &out)?.to_dtype(x.dtype())
    }

    /// Logits `[batch, classes]`.
    pub fn logits(&self, batch: &TokenBatch) -> candle_core::Result<Tensor> {
        let mut x = self
            .tok
            .forward(&batch.ids)?
            .broadcast_add(&self.pos.forward(&batch.positions)?)?;
        for block in &self.blocks {
            x = (&x + self.attention(block, &block.ln1.forward(&x)?, &batch.attn_bias)?)?;
            let hidden = autocast_linear(&block.fc1, &block.ln2.forward(&x)?)?.gelu()?;
            let y = autocast_linear(&block.fc2, &hidden)?.to_dtype(x.dtype())?;
            x = (x + y)?;
        }
        let x = self.ln_f.forward(&x)?;
        let summed = x.broadcast_mul(&batch.mask)?.sum(1)?;
        let counts = batch.mask.sum(1)?;
        // Half-precision logits: the per-example cross-entropy normalises in f32.
        autocast_linear(&self.head, &summed.broadcast_div(&counts)?)
    }
}

impl TrainModel for Transformer {
    type Batch = TokenBatch;
    fn per_example_loss(&self, batch: &TokenBatch) -> candle_core::Result<Tensor> {
        per_example_cross_entropy(&self.logits(batch)?, &batch.labels)
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

/// The benchmark's schedule: start at `per_device_train_batch_size`, +16 every
/// 20 steps, at most 256 per device (mirrored by benches/compare/torch_transformer.py).
pub const EVERY: usize = 20;
pub const GROW: usize = 16;
pub const MAX_BATCH: usize = 256;

pub struct BenchTrainer {
    pub model: Transformer,
    pub opt: AdamW,
}

impl AdaptiveTrainer for BenchTrainer {
    type Model = Transformer;
    type Optimizer = AdamW;
    const POLICY: adabatch::TrainerPolicy = adabatch::TrainerPolicy {
        schedule: adabatch::ScheduleSpec::Interval {
            every: EVERY,
            growth: adabatch::Growth::Add(GROW as i64),
        },
        max_batch: Some(MAX_BATCH),
        drop_last: false,
        reweight: adabatch::Reweight::SampleCount,
        ..adabatch::TrainerPolicy::DEFAULT
    };
    fn parts(&mut self) -> (&mut Transformer, &mut AdamW) {
        (&mut self.model, &mut self.opt)
    }
}

pub fn optimizer(model: &Transformer, lr: f64) -> candle_core::Result<AdamW> {
    AdamW::new(
        model.params.all_vars(),
        ParamsAdamW {
            lr,
            weight_decay: 0.01,
            ..Default::default()
        },
    )
}

/// A fixed batch (`oom`, and the baselines of `batching`): the schedule keeps
/// `per_device_train_batch_size`.
#[adaptive_trainer(schedule = constant)]
pub struct FixedTrainer {
    #[model]
    model: Transformer,
    #[optimizer]
    opt: AdamW,
}

/// Builds each rank's [`FixedTrainer`]: the model of `cfg`, AdamW at 3e-4.
pub fn fixed_trainer(
    cfg: Config,
) -> impl Fn(&RankContext) -> adabatch::Result<FixedTrainer> + Sync {
    move |ctx: &RankContext| {
        let model = Transformer::new(cfg, ctx.parameters(), ctx.device())?;
        let opt = optimizer(&model, 3e-4)?;
        Ok(FixedTrainer::new(model, opt))
    }
}

/// Settings of the memory runs: no logs, learning rate 3e-4, the model's
/// precision.
pub fn quiet_args(cfg: &Config, device: &str, per_device: usize, seed: u64) -> TrainingArgs {
    let mut args = {
        let mut args = TrainingArgs::default();
        args.launch.device = device.to_string();
        args.data.seed = Some(seed);
        args.batch.per_device_train_batch_size = per_device;
        args.lr.learning_rate = 3e-4;
        args.logging.logging_steps = usize::MAX;
        args.logging.quiet = true;
        args
    };
    cfg.set_precision(&mut args);
    args
}
