// A custom mix must be `fn(&SourceStats) -> Vec<f64>`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

fn halves(step: usize) -> Vec<f64> {
    vec![0.5, 0.5 + step as f64 * 0.0]
}

#[adaptive_trainer(mix = custom(halves))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
