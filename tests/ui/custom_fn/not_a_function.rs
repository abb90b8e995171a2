// A custom schedule that is a constant, not a function.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

const GROW: usize = 2;

#[adaptive_trainer(schedule = custom(GROW))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
