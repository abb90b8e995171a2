// `noise_scale` needs `min` and `max` (1 <= min <= max) and a positive fraction;
// `every` is `model`, `auto` or a number of steps >= 1.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = noise_scale(fraction = 1.0, min = 32))]
struct Missing {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(fraction = 0.0, min = 0, max = 8))]
struct Zero {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(min = 64, max = 32))]
struct Crossed {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(min = 8, max = 32, every = 0))]
struct NeverMeasured {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(min = 8, max = 32, every = sometimes))]
struct Vague {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
