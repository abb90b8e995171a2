// Two `#[callback]` fields: several callbacks go in one `Vec<Box<dyn Callback>>`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
    #[callback]
    first: adabatch::EarlyStopping,
    #[callback]
    second: adabatch::EarlyStopping,
}

fn main() {}
