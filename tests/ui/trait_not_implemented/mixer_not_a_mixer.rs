// The `#[mixer]` field's type is not a `Mixer`.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

struct NotAMixer;

#[adaptive_trainer]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
    #[mixer]
    mix: NotAMixer,
}

fn main() {}
