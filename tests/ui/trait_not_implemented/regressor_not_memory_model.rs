// The `#[regressor]` field's type is not a `MemoryModel`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

struct NotAMemoryModel;

#[adaptive_trainer(schedule = memory(threshold = 0.9, max_range = 2.0))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
    #[regressor]
    memory: NotAMemoryModel,
}

fn main() {}
