// Model and optimizer swapped: both field types are reported.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer {
    #[model]
    opt: candle_nn::SGD,
    #[optimizer]
    model: tiny::Tiny,
}

fn main() {}
