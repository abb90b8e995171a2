// `goodput(..)`: the global batch and micro-batches of the highest goodput, from
// measured step times or a step-time model of the user's.
#![deny(warnings)]

use adabatch::prelude::*;
use adabatch::{GoodputSpec, ScheduleSpec, StepShape};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = goodput(min = 8, max = 1024))]
struct Measured {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

/// Half a second a step plus 10 ms an example per rank.
fn step_time(shape: StepShape) -> f64 {
    0.5 + 0.01 * shape.per_rank() as f64
}

#[adaptive_trainer(
    schedule = goodput(min = 4, max = 256, max_local = 32, max_micro_batches = 4, hysteresis = 0.0, step_time = step_time),
    reweight = token_count
)]
struct Modelled {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {
    assert_eq!(
        Measured::POLICY.schedule,
        ScheduleSpec::Goodput(GoodputSpec {
            min: 8,
            max: 1024,
            max_local: 0,
            max_micro_batches: 8,
            hysteresis: 0.05,
            step_time: None,
        })
    );
    let ScheduleSpec::Goodput(spec) = Modelled::POLICY.schedule else {
        panic!("goodput")
    };
    assert_eq!(
        (spec.min, spec.max, spec.max_local, spec.max_micro_batches),
        (4, 256, 32, 4)
    );
    let time = spec.step_time.expect("the step-time model");
    let shape = StepShape {
        global: 100,
        micro_batches: 1,
        world: 2,
    };
    assert_eq!(time(shape), 1.0);
}
