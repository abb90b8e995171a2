// `ramp` takes four values (all by name, or all by position), each at least 1,
// reaching `global` in whole increments.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = ramp(start = 16, increment = 16, samples = 10000))]
struct Missing {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = ramp(16, 16, 10000))]
struct Positional {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = ramp(start = 16, increment = 0, samples = 0, global = 256))]
struct Zero {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = ramp(start = 16, increment = 100, samples = 10000, global = 256))]
struct NotWhole {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
