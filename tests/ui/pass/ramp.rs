// `ramp(..)`: Megatron's global-batch ramp, as a policy value, by name or position.
#![deny(warnings)]

use adabatch::prelude::*;
use adabatch::{Ramp, ScheduleSpec};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = ramp(start = 16, increment = 16, samples = 10000, global = 256))]
struct Megatron {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = ramp(32, 32, 500_000, 1024))]
struct Positional {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {
    assert_eq!(
        Positional::POLICY.schedule,
        ScheduleSpec::Ramp(Ramp {
            start: 32,
            increment: 32,
            samples: 500_000,
            global: 1024,
        })
    );
    assert_eq!(
        Megatron::POLICY.schedule,
        ScheduleSpec::Ramp(Ramp {
            start: 16,
            increment: 16,
            samples: 10_000,
            global: 256,
        })
    );
}
