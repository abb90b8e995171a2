// Neither `#[model]` nor `#[optimizer]`: both are reported.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer {
    model: tiny::Tiny,
    opt: candle_nn::SGD,
}

fn main() {}
