// Field attributes take no arguments.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer {
    #[model(frozen)]
    model: tiny::Tiny,
    #[optimizer = "sgd"]
    opt: candle_nn::SGD,
}

fn main() {}
