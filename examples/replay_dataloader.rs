//! The replay-dataloader demo: a tiny text classifier trained with a batch size that
//! grows by one every five steps, on one or several CPU ranks.
//!
//! ```text
//! cargo run --release --example replay_dataloader -- \
//!   --nproc-per-node 2 --num-train-epochs 10 --per-device-train-batch-size 1 \
//!   --dataloader-drop-last false --num-train-examples 10 --seed 42 \
//!   --logging-steps 1 --log-jsonl run.jsonl
//! ```

use adabatch::prelude::*;
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Embedding, Linear, Module, Optimizer, ParamsAdamW};
use clap::{CommandFactory, FromArgMatches, Parser};
use rand::{Rng, SeedableRng};

/// Hash buckets of the byte n-gram embedding bag.
const BUCKETS: usize = 4096;
const DIM: usize = 32;
const CLASSES: usize = 2;

/// A text classifier: mean of hashed byte 1- to 3-gram embeddings, then a linear head.
struct Classifier {
    embedding: Embedding,
    head: Linear,
    params: Parameters,
}

impl Classifier {
    fn new(params: Parameters, device: &Device) -> candle_core::Result<Self> {
        let vb = params.var_builder(DType::F32, device);
        let embedding = candle_nn::embedding(BUCKETS, DIM, vb.pp("embedding"))?;
        let head = candle_nn::linear(DIM, CLASSES, vb.pp("head"))?;
        Ok(Self {
            embedding,
            head,
            params,
        })
    }
}

/// A collated batch: n-gram bucket ids, a `[batch, ngrams]` averaging matrix, labels.
struct TextBatch {
    ids: Tensor,
    bag: Tensor,
    labels: Tensor,
}

impl Batch for TextBatch {
    fn num_examples(&self) -> usize {
        self.labels.dims()[0]
    }
}

fn ngram_buckets(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    (1..=3)
        .flat_map(|n| bytes.windows(n))
        .map(|gram| {
            let hash = gram.iter().fold(0x811c_9dc5_u32, |h, &b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            hash % BUCKETS as u32
        })
        .collect()
}

fn collate(items: &[(String, u32)], device: &Device) -> candle_core::Result<TextBatch> {
    let grams: Vec<Vec<u32>> = items.iter().map(|(text, _)| ngram_buckets(text)).collect();
    let total: usize = grams.iter().map(Vec::len).sum();
    let mut bag = vec![0f32; items.len() * total];
    let mut offset = 0;
    for (row, g) in grams.iter().enumerate() {
        for col in offset..offset + g.len() {
            bag[row * total + col] = 1.0 / g.len() as f32;
        }
        offset += g.len();
    }
    Ok(TextBatch {
        ids: Tensor::new(grams.concat(), device)?,
        bag: Tensor::from_vec(bag, (items.len(), total), device)?,
        labels: Tensor::new(
            items.iter().map(|(_, label)| *label).collect::<Vec<_>>(),
            device,
        )?,
    })
}

impl TrainModel for Classifier {
    type Batch = TextBatch;

    fn per_example_loss(&self, batch: &TextBatch) -> candle_core::Result<Tensor> {
        let pooled = batch.bag.matmul(&self.embedding.forward(&batch.ids)?)?;
        let log_probs = candle_nn::ops::log_softmax(&self.head.forward(&pooled)?, D::Minus1)?;
        log_probs
            .gather(&batch.labels.unsqueeze(1)?, 1)?
            .squeeze(1)?
            .neg()
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

/// The trainer: the attribute fixes the policy at compile time and generates the
/// glue (`ReplayTrainer::new`, `::launch`, `::train`, `::POLICY`).
#[adaptive_trainer(schedule = interval(5, +1), drop_last = false, reweight = sample_count)]
struct ReplayTrainer {
    #[model]
    model: Classifier,
    #[optimizer]
    opt: AdamW,
}

#[derive(Parser)]
#[command(about = "adabatch replay-dataloader demo: a batch size that grows while training runs")]
struct Cli {
    #[command(flatten)]
    train: TrainingArgs,
    /// Number of "Sample text {i}" examples.
    #[arg(long, default_value_t = 10)]
    num_train_examples: usize,
}

/// The demo's defaults reproduce the design's reference setting (N = 10, initial
/// size 1, `interval(5, +1)`, keep the last batch) on one rank.
fn parse_cli() -> Cli {
    let command = Cli::command()
        .mut_arg("per_device_train_batch_size", |a| a.default_value("1"))
        .mut_arg("num_train_epochs", |a| a.default_value("5"))
        .mut_arg("learning_rate", |a| a.default_value("0.01"));
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> adabatch::Result<()> {
    let cli = parse_cli();
    let mut args = cli.train;
    args.log_indices = true;
    let seed = args.seed.unwrap_or(ReplayTrainer::POLICY.seed);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dataset: Vec<(String, u32)> = (0..cli.num_train_examples)
        .map(|i| (format!("Sample text {i}"), rng.random_range(0..2)))
        .collect();
    let lr = args.learning_rate;
    let summary = ReplayTrainer::launch(&dataset, &collate, &args, |ctx: &RankContext| {
        let model = Classifier::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr,
                ..Default::default()
            },
        )?;
        Ok(ReplayTrainer::new(model, opt))
    })?;
    println!("{summary}");
    Ok(())
}
