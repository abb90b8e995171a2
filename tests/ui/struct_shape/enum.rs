// The attribute on an enum.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
enum Trainer {
    Model(tiny::Tiny),
    Optimizer(candle_nn::SGD),
}

fn main() {}
