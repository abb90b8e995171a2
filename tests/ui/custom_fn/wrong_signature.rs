// A custom schedule must be `fn(usize, usize) -> usize`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

fn grow(step: u32) -> u32 {
    step
}

#[adaptive_trainer(schedule = custom(grow))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
