// The attribute on a function.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
fn trainer() {}

fn main() {}
