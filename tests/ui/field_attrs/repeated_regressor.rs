// Two `#[regressor]` fields.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

struct Mem;

#[adaptive_trainer(schedule = memory)]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
    #[regressor]
    a: Mem,
    #[regressor]
    b: Mem,
}

fn main() {}
