// A custom schedule that does not exist.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

mod schedules {}

#[adaptive_trainer(schedule = custom(schedules::warmup))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
