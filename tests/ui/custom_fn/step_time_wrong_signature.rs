// A goodput step-time model must be `fn(StepShape) -> f64`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

fn step_time(examples: usize) -> f64 {
    examples as f64
}

#[adaptive_trainer(schedule = goodput(min = 8, max = 64, step_time = step_time))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
