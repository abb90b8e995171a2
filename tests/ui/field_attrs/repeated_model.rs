// Two `#[model]` fields.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[model]
    teacher: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
