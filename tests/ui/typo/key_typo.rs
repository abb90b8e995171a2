// A misspelt key gets a suggestion.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(dorp_last = true)]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
