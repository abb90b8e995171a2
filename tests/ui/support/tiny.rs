//! A tiny regression model shared by the ui cases: `y = w·x + b` over two f32
//! features, trained on per-example squared errors.
#![allow(dead_code)]

use adabatch::{Batch, Parameters, TrainModel, TrainingArgs};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Module;

/// A collated batch: features `[n, 2]`, targets `[n]`.
pub struct Xy {
    pub x: Tensor,
    pub y: Tensor,
    pub n: usize,
}

impl Batch for Xy {
    fn num_examples(&self) -> usize {
        self.n
    }
}

/// One linear layer.
pub struct Tiny {
    pub linear: candle_nn::Linear,
    pub params: Parameters,
}

impl Tiny {
    pub fn new(params: Parameters, device: &Device) -> candle_core::Result<Self> {
        let linear = candle_nn::linear(2, 1, params.var_builder(DType::F32, device).pp("linear"))?;
        Ok(Self { linear, params })
    }
}

impl TrainModel for Tiny {
    type Batch = Xy;

    fn per_example_loss(&self, batch: &Xy) -> candle_core::Result<Tensor> {
        let pred = self.linear.forward(&batch.x)?.squeeze(1)?;
        (pred - &batch.y)?.sqr()
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

pub type Example = ([f32; 2], f32);

pub fn dataset() -> Vec<Example> {
    (0..16)
        .map(|i| {
            let a = i as f32 / 16.0;
            ([a, 1.0 - a], 2.0 * a - 0.5)
        })
        .collect()
}

pub fn collate(items: &[Example], device: &Device) -> candle_core::Result<Xy> {
    let xs: Vec<f32> = items.iter().flat_map(|(x, _)| *x).collect();
    let ys: Vec<f32> = items.iter().map(|(_, y)| *y).collect();
    Ok(Xy {
        x: Tensor::from_vec(xs, (items.len(), 2), device)?,
        y: Tensor::from_vec(ys, items.len(), device)?,
        n: items.len(),
    })
}

/// Three steps, quiet.
pub fn args() -> TrainingArgs {
    {
        let mut args = TrainingArgs::default();
        args.length.max_steps = Some(3);
        args.logging.quiet = true;
        args.batch.per_device_train_batch_size = 2;
        args
    }
}
