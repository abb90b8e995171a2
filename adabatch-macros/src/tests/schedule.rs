//! `schedule = ...`: every form, and the checks of its arguments.

use syn::parse_quote;

use super::{assert_error, schedule};
use crate::spec::{Every, Growth, Schedule};

#[test]
fn schedule_constant_forms() {
    assert_eq!(
        schedule(parse_quote!(schedule = constant)),
        Schedule::Constant(None)
    );
    assert_eq!(
        schedule(parse_quote!(schedule = constant())),
        Schedule::Constant(None)
    );
    assert_eq!(
        schedule(parse_quote!(schedule = constant(8))),
        Schedule::Constant(Some(8))
    );
}

#[test]
fn schedule_interval_forms() {
    assert_eq!(
        schedule(parse_quote!(schedule = interval(5, +1))),
        Schedule::Interval {
            every: 5,
            growth: Growth::Add(1)
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = interval(3, -2))),
        Schedule::Interval {
            every: 3,
            growth: Growth::Add(-2)
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = interval(10, *2))),
        Schedule::Interval {
            every: 10,
            growth: Growth::Mul(2)
        }
    );
}

#[test]
fn schedule_linear_steps_custom_memory() {
    assert_eq!(
        schedule(parse_quote!(schedule = linear(2, 32, over = 100))),
        Schedule::Linear {
            from: 2,
            to: 32,
            over: 100
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = steps(0 => 8, 100 => 16, 200 => 32,))),
        Schedule::Steps(vec![(0, 8), (100, 16), (200, 32)])
    );
    assert_eq!(
        schedule(parse_quote!(schedule = custom(crate::schedules::warmup))),
        Schedule::Custom(parse_quote!(crate::schedules::warmup))
    );
    assert_eq!(
        schedule(parse_quote!(
            schedule = memory(threshold = 0.8, max_range = 3)
        )),
        Schedule::Memory {
            threshold: 0.8,
            max_range: 3.0
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = memory(max_range = 1.5))),
        Schedule::Memory {
            threshold: 0.9,
            max_range: 1.5
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = memory)),
        Schedule::Memory {
            threshold: 0.9,
            max_range: 2.0
        }
    );
}

#[test]
fn schedule_argument_checks() {
    assert_error(
        parse_quote!(schedule = constant(0)),
        "`constant(0)`: a batch size must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = constant(1, 2)),
        "`constant` takes 1 argument, found 2",
    );
    assert_error(
        parse_quote!(schedule = interval(0, +1)),
        "`every` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = interval(5, +0)),
        "the step must not be zero",
    );
    assert_error(
        parse_quote!(schedule = interval(5, -0)),
        "the step must not be zero",
    );
    assert_error(
        parse_quote!(schedule = interval(5, *1)),
        "the factor `*1` must be at least 2",
    );
    assert_error(
        parse_quote!(schedule = interval(5, 1)),
        "write `+1` to grow by 1",
    );
    assert_error(
        parse_quote!(schedule = interval(5)),
        "`interval` takes 2 arguments, found 1",
    );
    assert_error(
        parse_quote!(schedule = interval),
        "`interval` needs arguments: `interval(every, +k)`",
    );
    assert_error(
        parse_quote!(schedule = linear(0, 8, over = 10)),
        "`linear`: `from` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 0, over = 10)),
        "`to` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 8, over = 0)),
        "`over` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 8)),
        "`linear` needs the length of the ramp",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 8, 10)),
        "write the length of the ramp as `over = n`",
    );
    assert_error(
        parse_quote!(schedule = steps()),
        "`steps` needs at least one `threshold => size` pair",
    );
    assert_error(
        parse_quote!(schedule = steps(0 => 8, 0 => 16)),
        "thresholds must be strictly increasing: `0` comes after `0`",
    );
    assert_error(
        parse_quote!(schedule = steps(10 => 8, 5 => 16)),
        "thresholds must be strictly increasing",
    );
    assert_error(
        parse_quote!(schedule = steps(0 => 0)),
        "`steps`: a batch size must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = steps(0, 8)),
        "expected `threshold => size`",
    );
    assert_error(
        parse_quote!(schedule = custom(1)),
        "expected the path of a `fn(step: usize, current: usize) -> usize`",
    );
    assert_error(
        parse_quote!(schedule = custom(a, b)),
        "`custom` takes 1 argument, found 2",
    );
    assert_error(
        parse_quote!(schedule = memory(threshold = 0.0)),
        "`threshold = 0` must be in (0, 1]",
    );
    assert_error(
        parse_quote!(schedule = memory(threshold = 1.5)),
        "must be in (0, 1]",
    );
    assert_error(
        parse_quote!(schedule = memory(max_range = 0.5)),
        "`max_range = 0.5` must be at least 1.0",
    );
    assert_error(
        parse_quote!(schedule = memory(0.9)),
        "`memory` takes named arguments",
    );
    assert_error(
        parse_quote!(schedule = memory(threshold = 0.5, threshold = 0.6)),
        "duplicate argument `threshold`",
    );
}

#[test]
fn schedule_ramp_over_samples_or_tokens() {
    let ramp = |in_tokens| Schedule::Ramp {
        start: 16,
        increment: 16,
        samples: 1000,
        global: 64,
        in_tokens,
    };
    assert_eq!(
        schedule(parse_quote!(schedule = ramp(16, 16, 1000, 64))),
        ramp(false)
    );
    assert_eq!(
        schedule(parse_quote!(
            schedule = ramp(start = 16, increment = 16, samples = 1000, global = 64)
        )),
        ramp(false)
    );
    assert_eq!(
        schedule(parse_quote!(
            schedule = ramp(start = 16, increment = 16, tokens = 1000, global = 64)
        )),
        ramp(true)
    );
    assert_error(
        parse_quote!(
            schedule = ramp(
                start = 16,
                increment = 16,
                samples = 10,
                tokens = 1000,
                global = 64
            )
        ),
        "not both",
    );
    assert_error(
        parse_quote!(schedule = ramp(start = 16, increment = 16, global = 64)),
        "`ramp` needs `samples`",
    );
}

#[test]
fn noise_scale_defaults_to_doubling_and_takes_its_tracking_keys() {
    assert_eq!(
        schedule(parse_quote!(schedule = noise_scale(min = 8, max = 256))),
        Schedule::NoiseScale {
            fraction: 1.0,
            min: 8,
            max: 256,
            factor: 2,
            hysteresis: 0.1,
            shrink: false,
            every: Every::Modeled,
        }
    );
    assert_eq!(
        schedule(parse_quote!(
            schedule = noise_scale(
                fraction = 0.5,
                min = 8,
                max = 256,
                factor = 1,
                hysteresis = 0,
                shrink = true,
                every = 4
            )
        )),
        Schedule::NoiseScale {
            fraction: 0.5,
            min: 8,
            max: 256,
            factor: 1,
            hysteresis: 0.0,
            shrink: true,
            every: Every::Steps(4),
        }
    );
    assert_eq!(
        schedule(parse_quote!(
            schedule = noise_scale(min = 8, max = 256, every = model)
        )),
        schedule(parse_quote!(schedule = noise_scale(min = 8, max = 256))),
    );
    assert!(matches!(
        schedule(parse_quote!(
            schedule = noise_scale(min = 8, max = 256, every = auto)
        )),
        Schedule::NoiseScale {
            every: Every::Auto,
            ..
        }
    ));
    assert_error(
        parse_quote!(schedule = noise_scale(min = 8, max = 256, every = 0)),
        "`noise_scale`: `every` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = noise_scale(min = 8, max = 256, every = often)),
        "`noise_scale`: `every` takes `model` (the default), `auto` or a number of steps >= 1, found `often`",
    );
    assert_error(
        parse_quote!(schedule = noise_scale(min = 8, max = 256, factor = 0)),
        "`noise_scale`: `factor` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = noise_scale(min = 8, max = 256, hysteresis = -0.5)),
        "`noise_scale`: `hysteresis = -0.5` must be at least 0",
    );
    assert_error(
        parse_quote!(schedule = noise_scale(min = 8, max = 256, shrink = 1)),
        "expected `true` or `false` for `shrink`",
    );
}

#[test]
fn goodput_forms_and_defaults() {
    assert_eq!(
        schedule(parse_quote!(schedule = goodput(min = 8, max = 1024))),
        Schedule::Goodput {
            min: 8,
            max: 1024,
            max_local: 0,
            max_micro_batches: 8,
            hysteresis: 0.05,
            step_time: None,
        }
    );
    let with_fn = schedule(parse_quote!(
        schedule = goodput(
            min = 4,
            max = 64,
            max_local = 16,
            max_micro_batches = 2,
            hysteresis = 0.0,
            step_time = my::time
        )
    ));
    let Schedule::Goodput {
        max_local: 16,
        max_micro_batches: 2,
        step_time: Some(path),
        ..
    } = with_fn
    else {
        panic!("{with_fn:?}");
    };
    assert_eq!(crate::parse::path_to_string(&path), "my::time");
}

#[test]
fn goodput_argument_errors() {
    assert_error(
        parse_quote!(schedule = goodput(min = 8)),
        "`goodput` needs `max`: `goodput(min = 8, max = 1024)`",
    );
    assert_error(
        parse_quote!(schedule = goodput(min = 64, max = 8)),
        "`goodput`: `max = 8` is smaller than `min = 64`",
    );
    assert_error(
        parse_quote!(schedule = goodput(min = 0, max = 8)),
        "`goodput`: `min` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = goodput(min = 1, max = 8, step_time = 3)),
        "`step_time` takes the path of a `fn(StepShape) -> f64`",
    );
    assert_error(
        parse_quote!(schedule = goodput(min = 1, max = 8, max_locals = 3)),
        "max_local",
    );
    assert_error(
        parse_quote!(schedule = goodput),
        "`goodput` needs arguments",
    );
}
