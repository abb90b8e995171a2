// One field cannot be both model and optimizer.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer {
    #[model]
    #[optimizer]
    model: tiny::Tiny,
}

fn main() {}
