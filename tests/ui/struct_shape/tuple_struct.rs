// The attribute on a tuple struct: its field attributes are still removed.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer(#[model] tiny::Tiny, #[optimizer] candle_nn::SGD);

fn main() {}
