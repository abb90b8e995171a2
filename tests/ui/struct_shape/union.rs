// The attribute on a union.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
union Trainer {
    a: u32,
    b: f32,
}

fn main() {}
