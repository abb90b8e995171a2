// `noise_scale(..)`: the next global batch from the gradient noise scale, by
// doubling by default, continuously with `factor = 1`, measured on the modeled
// cadence by default (`every = model`), the timed one (`every = auto`) or every `n`
// steps.
#![deny(warnings)]

use adabatch::prelude::*;
use adabatch::{GradAccum, MeasureEvery, NoiseScalePolicy, ScheduleSpec};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = noise_scale(fraction = 0.5, min = 32, max = 4096), grad_accum = fixed(2))]
struct Adaptive {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(min = 8, max = 64))]
struct Defaults {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(
    schedule = noise_scale(min = 8, max = 64, factor = 1, hysteresis = 0.0, shrink = true)
)]
struct Continuous {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(min = 8, max = 64, every = 4))]
struct Every4 {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(min = 8, max = 64, every = auto))]
struct EveryAuto {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

#[adaptive_trainer(schedule = noise_scale(min = 8, max = 64, every = model))]
struct EveryModel {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: candle_nn::SGD,
}

fn main() {
    assert_eq!(
        Every4::POLICY.schedule,
        ScheduleSpec::NoiseScale(NoiseScalePolicy {
            every: MeasureEvery::Steps(4),
            ..NoiseScalePolicy::doubling(1.0, 8, 64)
        })
    );
    assert_eq!(EveryModel::POLICY.schedule, Defaults::POLICY.schedule);
    assert_eq!(
        EveryAuto::POLICY.schedule,
        ScheduleSpec::NoiseScale(NoiseScalePolicy {
            every: MeasureEvery::Auto,
            ..NoiseScalePolicy::doubling(1.0, 8, 64)
        })
    );
    assert_eq!(
        Adaptive::POLICY.schedule,
        ScheduleSpec::NoiseScale(NoiseScalePolicy::doubling(0.5, 32, 4096))
    );
    assert_eq!(Adaptive::POLICY.grad_accum, GradAccum::Fixed(2));
    assert_eq!(
        Defaults::POLICY.schedule,
        ScheduleSpec::NoiseScale(NoiseScalePolicy::doubling(1.0, 8, 64))
    );
    assert_eq!(
        Continuous::POLICY.schedule,
        ScheduleSpec::NoiseScale(NoiseScalePolicy {
            factor: 1,
            hysteresis: 0.0,
            shrink: true,
            ..NoiseScalePolicy::doubling(1.0, 8, 64)
        })
    );
}
