//! Every key of `#[adaptive_trainer]` on a real variable-length task: a byte-level
//! language model (three bytes of context, an MLP, next-byte prediction) trained with
//! memory-aware batches that grow on shorter sentences, token-count reweighting and
//! OOM recovery by split-and-retry.
//!
//! ```text
//! cargo run --release --example all_keys -- --nproc-per-node 2 --num-train-epochs 1
//! cargo run --release --example all_keys -- --data sentences.txt --max-sentences 2000 \
//!     --inject-oom-at-steps 3 --log-jsonl lm.jsonl
//! ```

use std::path::PathBuf;

use adabatch::prelude::*;
use adabatch::{per_example_token_cross_entropy_sum, OnlineMemoryModel};
use candle_core::{DType, Device, Tensor, Var, D};
// adabatch's AdamW: candle's update, checkpointable (resumes exactly).
use candle_nn::{Embedding, Linear, Module};
use clap::{CommandFactory, FromArgMatches, Parser};
use rand::{Rng, SeedableRng};

const VOCAB: usize = 256;
const CONTEXT: usize = 3;
const EMBED: usize = 24;
const HIDDEN: usize = 128;

/// Predicts each byte from the three before it.
struct ByteLm {
    embedding: Embedding,
    hidden: Linear,
    out: Linear,
    params: Parameters,
}

impl ByteLm {
    fn new(params: Parameters, device: &Device) -> candle_core::Result<Self> {
        let vb = params.var_builder(DType::F32, device);
        Ok(Self {
            embedding: candle_nn::embedding(VOCAB, EMBED, vb.pp("embedding"))?,
            hidden: candle_nn::linear(CONTEXT * EMBED, HIDDEN, vb.pp("hidden"))?,
            out: candle_nn::linear(HIDDEN, VOCAB, vb.pp("out"))?,
            params,
        })
    }
}

/// Padded sentences: `contexts[k]` is the input shifted by `k + 1` bytes.
struct Bytes {
    contexts: Vec<Tensor>,
    targets: Tensor,
    mask: Tensor,
    tokens: usize,
}

impl Batch for Bytes {
    fn num_examples(&self) -> usize {
        self.targets.dims()[0]
    }
    fn num_tokens(&self) -> usize {
        self.tokens
    }
}

fn collate(items: &[String], device: &Device) -> candle_core::Result<Bytes> {
    let len = items.iter().map(String::len).max().unwrap_or(1).max(1);
    let (b, mut targets, mut mask) = (
        items.len(),
        vec![0u32; items.len() * len],
        vec![0f32; items.len() * len],
    );
    let mut contexts = vec![vec![0u32; b * len]; CONTEXT];
    for (row, text) in items.iter().enumerate() {
        let bytes = text.as_bytes();
        for (t, &byte) in bytes.iter().enumerate() {
            targets[row * len + t] = u32::from(byte);
            mask[row * len + t] = 1.0;
            for (k, context) in contexts.iter_mut().enumerate() {
                if t > k {
                    context[row * len + t] = u32::from(bytes[t - k - 1]);
                }
            }
        }
    }
    Ok(Bytes {
        contexts: contexts
            .into_iter()
            .map(|c| Tensor::from_vec(c, (b, len), device))
            .collect::<candle_core::Result<_>>()?,
        targets: Tensor::from_vec(targets, (b, len), device)?,
        mask: Tensor::from_vec(mask, (b, len), device)?,
        tokens: items.iter().map(String::len).sum(),
    })
}

impl TrainModel for ByteLm {
    type Batch = Bytes;

    /// With `reweight = token_count`, each example's loss is the *sum* of its
    /// tokens' losses.
    fn per_example_loss(&self, batch: &Bytes) -> candle_core::Result<Tensor> {
        let embedded = batch
            .contexts
            .iter()
            .map(|c| self.embedding.forward(c))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let hidden = self
            .hidden
            .forward(&Tensor::cat(&embedded, D::Minus1)?)?
            .relu()?;
        per_example_token_cross_entropy_sum(
            &self.out.forward(&hidden)?,
            &batch.targets,
            &batch.mask,
        )
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

/// Every key, with the value this task wants.
#[adaptive_trainer(
    schedule = memory(threshold = 0.9, max_range = 4.0),
    min_batch = 1,
    max_batch = 64,
    drop_last = false,
    reweight = token_count,
    oom = split_retry,
    grad_accum = fixed(1),
    lr_scaling = sqrt,
    shuffle = true,
    seed = 7,
    crate = "::adabatch",
)]
struct LmTrainer {
    #[model]
    model: ByteLm,
    #[optimizer]
    opt: AdamW,
    #[regressor]
    memory: OnlineMemoryModel,
}

#[derive(Parser)]
#[command(about = "adabatch: every attribute key on a byte-level language model")]
struct Cli {
    #[command(flatten)]
    train: TrainingArgs,
    /// One sentence per line (default: generated sentences).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Use at most this many sentences.
    #[arg(long, default_value_t = 1500)]
    max_sentences: usize,
}

/// Seeded sentences of 2 to 30 words, when no corpus is given.
fn generated_sentences(n: usize, seed: u64) -> Vec<String> {
    const WORDS: [&str; 16] = [
        "the",
        "batch",
        "grows",
        "while",
        "memory",
        "allows",
        "short",
        "sentences",
        "train",
        "faster",
        "on",
        "every",
        "rank",
        "and",
        "epoch",
        "ends",
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let words = rng.random_range(2..30);
            let mut s: Vec<&str> = (0..words)
                .map(|_| WORDS[rng.random_range(0..WORDS.len())])
                .collect();
            s.push(".");
            s.join(" ")
        })
        .collect()
}

fn main() -> std::process::ExitCode {
    adabatch::exit_code(run())
}

fn run() -> adabatch::Result<()> {
    let command = Cli::command()
        .mut_arg("per_device_train_batch_size", |a| a.default_value("8"))
        .mut_arg("num_train_epochs", |a| a.default_value("2"))
        .mut_arg("learning_rate", |a| a.default_value("0.003"))
        .mut_arg("logging_steps", |a| a.default_value("10"))
        .mut_arg("weight_decay", |a| a.default_value("0.01"));
    let cli = Cli::from_arg_matches(&adabatch::hf_matches(command)).unwrap_or_else(|e| e.exit());
    let seed = cli.train.data.seed.unwrap_or(LmTrainer::POLICY.seed);
    let mut sentences: Vec<String> = match &cli.data {
        Some(path) => std::fs::read_to_string(path)
            .map_err(adabatch::Error::io(adabatch::FileOp::Read, path.clone()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.chars().take(256).collect())
            .collect(),
        None => generated_sentences(cli.max_sentences, seed),
    };
    sentences.truncate(cli.max_sentences);
    let lengths = sentences.iter().map(String::len).collect();
    let dataset = WithLengths::new(sentences, lengths)?;
    let hyper = ParamsAdamW::from_args(&cli.train)?;
    let summary = LmTrainer::launch(&dataset, &collate, &cli.train, |ctx: &RankContext| {
        let model = ByteLm::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(model.params.all_vars(), hyper)?;
        Ok(LmTrainer::new(model, opt, OnlineMemoryModel::new(0.1)))
    })?
    .summary;
    println!("{summary}");
    Ok(())
}
