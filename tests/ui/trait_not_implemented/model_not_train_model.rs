// The `#[model]` field's type does not implement `TrainModel`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

struct NotAModel;

#[adaptive_trainer]
struct Trainer {
    #[model]
    model: NotAModel,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {}
