// `mix = custom(..)` takes the path of a function.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(mix = custom(0.5))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
