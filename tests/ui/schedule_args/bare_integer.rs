// A bare size: the hint says `constant(8)`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = 8)]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
