// A valid `#[regressor]` does not make an unsupported combination runnable.
use adabatch::prelude::*;

#[path = "../support/tiny.rs"]
mod tiny;

use adabatch::{BatchFeatures, MemoryModel};

struct Padded;

impl MemoryModel for Padded {
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64 {
        candidate.padded_tokens as f64 / baseline.padded_tokens.max(1) as f64
    }
}

#[adaptive_trainer(schedule = memory(max_range = 4.0), grad_accum = fixed(4))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
    #[regressor]
    memory: Padded,
}

fn main() {}
