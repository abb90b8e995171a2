//! The replay-dataloader model, shared by `replay_dataloader` and `gpu_check`: a
//! text classifier (mean of hashed byte 1- to 3-gram embeddings, then a linear head)
//! and its trainer, `interval(5, +1)`.

use adabatch::prelude::*;
use candle_core::{DType, Device, Tensor, Var};
// adabatch's AdamW: candle's update, checkpointable (resumes exactly).
use adabatch::{AdamW, ParamsAdamW};
use candle_nn::{Embedding, Linear};
use rand::{Rng, SeedableRng};

/// Hash buckets of the byte n-gram embedding bag.
pub const BUCKETS: usize = 4096;
pub const DIM: usize = 32;
pub const CLASSES: usize = 2;

/// A text classifier: mean of hashed byte 1- to 3-gram embeddings, then a linear head.
pub struct Classifier {
    embedding: Embedding,
    head: Linear,
    pub params: Parameters,
}

impl Classifier {
    pub fn new(params: Parameters, device: &Device) -> candle_core::Result<Self> {
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
pub struct TextBatch {
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

pub fn collate(items: &[(String, u32)], device: &Device) -> candle_core::Result<TextBatch> {
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

    /// `autocast`: under `--bf16` / `--fp16` the embedding bag and the head compute
    /// in half precision (in f32 runs the casts return their input).
    fn per_example_loss(&self, batch: &TextBatch) -> candle_core::Result<Tensor> {
        let table = adabatch::autocast(self.embedding.embeddings())?;
        let vectors = table.index_select(&batch.ids, 0)?;
        let pooled = adabatch::autocast(&batch.bag)?.matmul(&vectors)?;
        per_example_cross_entropy(
            &adabatch::autocast_linear(&self.head, &pooled)?,
            &batch.labels,
        )
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

/// The trainer: the attribute fixes the policy at compile time and generates the
/// glue (`ReplayTrainer::new`, `::launch`, `::train`, `::POLICY`).
#[adaptive_trainer(schedule = interval(5, +1), drop_last = false, reweight = sample_count)]
pub struct ReplayTrainer {
    #[model]
    model: Classifier,
    #[optimizer]
    opt: AdamW,
}

/// `n` examples `"Sample text {i}"` with seeded random binary labels.
pub fn dataset(n: usize, seed: u64) -> Vec<(String, u32)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| (format!("Sample text {i}"), rng.random_range(0..2)))
        .collect()
}

/// Builds each rank's trainer: seeded parameters, AdamW of `hyper`.
pub fn factory(
    hyper: ParamsAdamW,
) -> impl Fn(&RankContext) -> adabatch::Result<ReplayTrainer> + Sync {
    move |ctx: &RankContext| {
        let model = Classifier::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(model.params.all_vars(), hyper)?;
        Ok(ReplayTrainer::new(model, opt))
    }
}
