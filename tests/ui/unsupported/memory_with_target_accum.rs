// `memory` with an accumulation target: refused by the runtime, whatever the order of the keys.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(grad_accum = target(global = 64), seed = 1, schedule = memory)]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
