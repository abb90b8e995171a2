// The `#[optimizer]` field's type is not a candle optimizer.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: Vec<f32>,
}

fn main() {}
