// The forms of `interval`, `linear` and `constant`, and an accumulation target.
#![deny(warnings)]

use adabatch::prelude::*;
use adabatch::{GradAccum, Growth, ScheduleSpec};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = interval(3, -1), min_batch = 2)]
struct Shrinking {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = interval(10, *2))]
struct Doubling {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::AdamW,
}

#[adaptive_trainer(schedule = linear(2, 32, over = 100), grad_accum = target(global = 64))]
struct Ramp {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = constant(16), reweight = token_count, lr_scaling = linear)]
struct Fixed {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {
    assert_eq!(
        Shrinking::POLICY.schedule,
        ScheduleSpec::Interval {
            every: 3,
            growth: Growth::Add(-1)
        }
    );
    assert_eq!(Shrinking::POLICY.min_batch, 2);
    assert_eq!(
        Doubling::POLICY.schedule,
        ScheduleSpec::Interval {
            every: 10,
            growth: Growth::Mul(2)
        }
    );
    assert_eq!(
        Ramp::POLICY.schedule,
        ScheduleSpec::Linear {
            from: 2,
            to: 32,
            over: 100
        }
    );
    assert_eq!(Ramp::POLICY.grad_accum, GradAccum::Target { global: 64 });
    assert_eq!(Fixed::POLICY.schedule, ScheduleSpec::Constant(Some(16)));
}
