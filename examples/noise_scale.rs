//! The gradient noise scale sizing the batch: an MLP on the UCI 8×8 handwritten
//! digits (1,797 images, 64 pixels 0–16, label 0–9; one image per CSV row, the
//! label last) with `schedule = noise_scale(..)`. Every step logs the estimate
//! B_simple = tr(Σ)/|G|² and the next global batch is half of it, between 16 and
//! 512. The digits come from scikit-learn (`sklearn/datasets/data/digits.csv.gz`);
//! decompress the file and pass its path:
//!
//! ```text
//! gunzip -k digits.csv.gz
//! cargo run --release --example noise_scale -- --digits digits.csv --nproc-per-node 2
//! ```
//!
//! With `--num-train-epochs 5 --learning-rate 0.003 --log-jsonl log.jsonl`, the
//! logged `gradient_noise_scale` grows as the loss falls (about 40 at step 10, 85
//! at step 70, 400 by step 130 on 2 ranks), and the global batch with it: the
//! paper's observation that the useful batch size grows during training.

use adabatch::candle_core::{self, DType, Device, Tensor, Var};
use adabatch::candle_nn::{linear, Linear, Module};
use adabatch::clap::{self, Parser};
use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;

const PIXELS: usize = 64;
const HIDDEN: usize = 64;
const CLASSES: usize = 10;

#[derive(Parser)]
#[command(about = "digits with schedule = noise_scale(..)")]
struct Cli {
    /// The digits as CSV: 64 pixel values then the label, one image per line.
    #[arg(long)]
    digits: std::path::PathBuf,
    #[command(flatten)]
    train: TrainingArgs,
}

#[derive(Clone)]
struct Digit {
    pixels: [f32; PIXELS],
    label: u32,
}

fn read_digits(path: &std::path::Path) -> Result<Vec<Digit>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let values: Vec<f32> = line
                .split(',')
                .map(|v| v.trim().parse::<f32>())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("line {}: {e}", i + 1))?;
            let [pixels @ .., label] = values.as_slice() else {
                return Err(format!("line {}: empty", i + 1));
            };
            let pixels: [f32; PIXELS] = pixels
                .iter()
                .map(|p| p / 16.0)
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| format!("line {}: expected {} values", i + 1, PIXELS + 1))?;
            Ok(Digit {
                pixels,
                label: *label as u32,
            })
        })
        .collect()
}

struct Images {
    pixels: Tensor,
    labels: Tensor,
}

impl Batch for Images {
    fn num_examples(&self) -> usize {
        self.labels.dims()[0]
    }
}

fn collate(items: &[Digit], device: &Device) -> candle_core::Result<Images> {
    let pixels: Vec<f32> = items.iter().flat_map(|d| d.pixels).collect();
    let labels: Vec<u32> = items.iter().map(|d| d.label).collect();
    Ok(Images {
        pixels: Tensor::from_vec(pixels, (items.len(), PIXELS), device)?,
        labels: Tensor::from_vec(labels, items.len(), device)?,
    })
}

struct Mlp {
    hidden: Linear,
    out: Linear,
    params: Parameters,
}

impl TrainModel for Mlp {
    type Batch = Images;

    fn per_example_loss(&self, batch: &Images) -> candle_core::Result<Tensor> {
        let logits = self
            .out
            .forward(&self.hidden.forward(&batch.pixels)?.relu()?)?;
        per_example_cross_entropy(&logits, &batch.labels)
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

/// Half the estimated noise scale, between 16 and 512 examples per step, over
/// two micro-batches (so one rank has two small batches to estimate from).
#[adaptive_trainer(
    schedule = noise_scale(fraction = 0.5, min = 16, max = 512),
    grad_accum = fixed(2)
)]
struct Digits {
    #[model]
    model: Mlp,
    #[optimizer]
    opt: AdamW,
}

fn main() -> adabatch::Result<()> {
    let cli = Cli::parse();
    let data = read_digits(&cli.digits).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    let args = cli.train;
    let factory = |ctx: &RankContext| -> adabatch::Result<Digits> {
        let params = ctx.parameters(); // same weights on every rank
        let vb = params.var_builder(DType::F32, ctx.device());
        let model = Mlp {
            hidden: linear(PIXELS, HIDDEN, vb.pp("hidden"))?,
            out: linear(HIDDEN, CLASSES, vb.pp("out"))?,
            params,
        };
        let opt = AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr: args.learning_rate,
                ..Default::default()
            },
        )?;
        Ok(Digits::new(model, opt))
    };
    let Trained { summary, .. } = Digits::launch(&data, &collate, &args, factory)?;
    println!("{summary}");
    Ok(())
}
