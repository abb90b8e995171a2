// Sizes and `over` of `linear` must be at least 1.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = linear(0, 8, over = 0))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
