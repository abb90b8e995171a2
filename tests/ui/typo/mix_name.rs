// A misspelt mix form is suggested.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

fn my_mix(_: &adabatch::SourceStats) -> Vec<f64> {
    vec![1.0]
}

#[adaptive_trainer(mix = custon(my_mix))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
