//! Quickstart: a two-layer MLP on a generated table, trained with a batch size that
//! grows from 8 to 64 over the first 100 steps, then scored on held-out rows.
//! `adabatch` is the only dependency: candle and clap come re-exported from it.
//!
//! ```text
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --nproc-per-node 2 --num-train-epochs 40
//! ```

use adabatch::candle_core::{self, DType, Device, Tensor, Var, D};
use adabatch::candle_nn::{linear, Linear, Module};
use adabatch::clap::{CommandFactory, FromArgMatches};
use adabatch::prelude::*;
use adabatch::{AdamW, ParamsAdamW}; // checkpointable: resumes exactly

const FEATURES: usize = 4;
const HIDDEN: usize = 32;
const CLASSES: usize = 3;

/// One row of the table: four features (two of them noise) and a class.
#[derive(Clone)]
struct Row {
    features: [f32; FEATURES],
    class: u32,
}

/// `n` seeded rows: class 0 inside a disc, otherwise 1 or 2 by the sign of `x·y`.
fn table(n: usize, mut seed: u64) -> Vec<Row> {
    let mut uniform = move || {
        // splitmix64, mapped to [-1, 1)
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    (0..n)
        .map(|_| {
            let features = [uniform(), uniform(), uniform(), uniform()];
            let [x, y, ..] = features;
            let class = match (x * x + y * y < 0.35, x * y > 0.0) {
                (true, _) => 0,
                (false, true) => 1,
                (false, false) => 2,
            };
            Row { features, class }
        })
        .collect()
}

/// A collated batch: features `[batch, FEATURES]`, classes `[batch]`.
struct Rows {
    features: Tensor,
    classes: Tensor,
}

impl Batch for Rows {
    fn num_examples(&self) -> usize {
        self.classes.dims()[0]
    }
}

struct Mlp {
    hidden: Linear,
    out: Linear,
    params: Parameters,
}

impl Mlp {
    fn new(params: Parameters, device: &Device) -> candle_core::Result<Self> {
        let vb = params.var_builder(DType::F32, device);
        Ok(Self {
            hidden: linear(FEATURES, HIDDEN, vb.pp("hidden"))?,
            out: linear(HIDDEN, CLASSES, vb.pp("out"))?,
            params,
        })
    }

    fn logits(&self, features: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&self.hidden.forward(features)?.relu()?)
    }

    fn device(&self) -> &Device {
        self.out.weight().device()
    }

    /// Share of the batch's rows whose most likely class is the true one.
    fn accuracy(&self, batch: &Rows) -> candle_core::Result<f32> {
        let predicted = self.logits(&batch.features)?.argmax(D::Minus1)?;
        predicted
            .eq(&batch.classes)?
            .to_dtype(DType::F32)?
            .mean_all()?
            .to_scalar::<f32>()
    }
}

/// The one trait a model implements: a loss per example (shape `[batch]`; the
/// engine weights and averages them across ranks) and its variables by name.
impl TrainModel for Mlp {
    type Batch = Rows;

    fn per_example_loss(&self, batch: &Rows) -> candle_core::Result<Tensor> {
        per_example_cross_entropy(&self.logits(&batch.features)?, &batch.classes)
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

/// The policy is fixed at compile time: the per-device batch goes from 8 to 64,
/// linearly over the first 100 steps.
#[adaptive_trainer(schedule = linear(8, 64, over = 100))]
struct Quickstart {
    #[model]
    model: Mlp,
    #[optimizer]
    opt: AdamW,
}

// Errors print as messages (`error: ...`) with a failing exit code.
fn main() -> std::process::ExitCode {
    adabatch::exit_code(run())
}

fn run() -> adabatch::Result<()> {
    // Every `TrainingArgs` flag (`--help`; HF's spellings too), with defaults for a quick run.
    let command = TrainingArgs::command()
        .mut_arg("num_train_epochs", |a| a.default_value("30"))
        .mut_arg("learning_rate", |a| a.default_value("0.01"))
        .mut_arg("logging_steps", |a| a.default_value("50"))
        .mut_arg("weight_decay", |a| a.default_value("0.01"));
    let args =
        TrainingArgs::from_arg_matches(&adabatch::hf_matches(command)).unwrap_or_else(|e| e.exit());

    let mut train_rows = table(600, 7);
    let test_rows = train_rows.split_off(480);

    // Two `Result`s meet here. Tensor code returns candle's `candle_core::Result`:
    // the collate below and `per_example_loss` above. The factory (run once per rank,
    // on the rank's device), `launch` and `run` return `adabatch::Result`, and `?`
    // turns a candle error into an adabatch one (`adabatch::Error::Candle`).
    let collate = |items: &[Row], device: &Device| -> candle_core::Result<Rows> {
        let features: Vec<f32> = items.iter().flat_map(|r| r.features).collect();
        let classes: Vec<u32> = items.iter().map(|r| r.class).collect();
        Ok(Rows {
            features: Tensor::from_vec(features, (items.len(), FEATURES), device)?,
            classes: Tensor::from_vec(classes, items.len(), device)?,
        })
    };
    let factory = |ctx: &RankContext| -> adabatch::Result<Quickstart> {
        let model = Mlp::new(ctx.parameters(), ctx.device())?; // same weights on every rank
        let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::from_args(&args)?)?;
        Ok(Quickstart::new(model, opt))
    };

    // `args.launch.nproc_per_node` ranks (threads on CPU); rank 0's trained trainer comes back.
    let Trained { trainer, summary } = Quickstart::launch(&train_rows, &collate, &args, factory)?;
    println!("{summary}");

    let test = collate(&test_rows, trainer.model.device())?;
    let accuracy = trainer.model.accuracy(&test)?;
    println!(
        "held-out accuracy: {:.1}% of {} rows",
        100.0 * accuracy,
        test_rows.len()
    );
    Ok(())
}
