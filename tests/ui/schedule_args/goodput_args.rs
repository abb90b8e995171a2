// `goodput` needs `min` and `max` (1 <= min <= max); counts are at least 1, the
// hysteresis at least 0, and `step_time` a path.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = goodput(min = 8))]
struct Missing {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = goodput(min = 64, max = 8))]
struct Crossed {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = goodput(min = 8, max = 64, max_micro_batches = 0, hysteresis = -1.0))]
struct Bounds {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = goodput(min = 8, max = 64, step_time = 0.5))]
struct NotAPath {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = goodput(min = 8, max = 64, max_loacl = 16))]
struct Typo {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
