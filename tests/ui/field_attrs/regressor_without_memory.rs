// `#[regressor]` only makes sense with `schedule = memory(..)`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

struct Mem;

#[adaptive_trainer(schedule = interval(5, +1))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
    #[regressor]
    memory: Mem,
}

fn main() {}
