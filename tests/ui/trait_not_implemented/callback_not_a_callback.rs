// The `#[callback]` field's type is not a `Callback`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

struct NotACallback;

#[adaptive_trainer]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
    #[callback]
    stop: NotACallback,
}

fn main() {}
