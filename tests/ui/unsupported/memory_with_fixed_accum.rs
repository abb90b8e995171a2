// Each key alone is supported, the combination is not: the runtime refuses it with its
// reason (`TrainerPolicy::unsupported`), on the attribute, since no single key is at fault.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = memory(threshold = 0.9, max_range = 2.0), grad_accum = fixed(2))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
