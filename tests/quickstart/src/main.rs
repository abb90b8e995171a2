//! A complete adabatch program: a linear classifier on a generated table, its
//! per-device batch growing from 4 to 32 over the first 50 steps.
//! `cargo run --release --example readme -- --nproc-per-node 2 --learning-rate 0.05`

use adabatch::candle_core::{self, DType, Device, Tensor, Var};
use adabatch::candle_nn::{linear, Linear, Module};
use adabatch::clap::Parser;
use adabatch::prelude::*;
use adabatch::{AdamW, ParamsAdamW};

/// A collated batch: points `[n, 2]`, classes `[n]`.
struct Points {
    xy: Tensor,
    class: Tensor,
}

impl Batch for Points {
    fn num_examples(&self) -> usize {
        self.class.dims()[0]
    }
}

struct Model {
    layer: Linear,
    params: Parameters,
}

impl TrainModel for Model {
    type Batch = Points;
    // One loss per example: the engine weights and averages them across ranks.
    fn per_example_loss(&self, batch: &Points) -> candle_core::Result<Tensor> {
        per_example_cross_entropy(&self.layer.forward(&batch.xy)?, &batch.class)
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

#[adaptive_trainer(schedule = linear(4, 32, over = 50), reweight = sample_count)]
struct Classifier {
    #[model]
    model: Model,
    #[optimizer]
    opt: AdamW,
}

fn main() -> adabatch::Result<()> {
    let args = TrainingArgs::parse(); // every flag of `TrainingArgs`: --help
    let grid = (0..1024).map(|i| [i % 32, i / 32].map(|v| v as f32 / 16.0 - 1.0));
    let data: Vec<[f32; 2]> = grid.collect();
    let collate = |rows: &[[f32; 2]], device: &Device| -> candle_core::Result<Points> {
        let class: Vec<u32> = rows.iter().map(|[x, y]| u32::from(x + y > 0.0)).collect();
        let xy = Tensor::from_vec(rows.concat(), (rows.len(), 2), device)?;
        let class = Tensor::new(class, device)?;
        Ok(Points { xy, class })
    };
    let trained = Classifier::launch(&data, &collate, &args, |ctx: &RankContext| {
        let params = ctx.parameters(); // seeded: the same weights on every rank
        let layer = linear(2, 2, params.var_builder(DType::F32, ctx.device()))?;
        // Its rate is set every step from `--learning-rate` and the LR schedule.
        let opt = AdamW::new(params.all_vars(), ParamsAdamW::default())?;
        Ok(Classifier::new(Model { layer, params }, opt))
    })?;
    println!("{}", trained.summary); // trained.trainer: rank 0's trained model
    Ok(())
}
