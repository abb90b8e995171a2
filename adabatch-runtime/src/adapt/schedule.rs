//! Batch-size schedules.
//!
//! A schedule is called after every optimisation step with the step number (1-based,
//! already incremented) and the current per-device batch size, and returns the next
//! per-device batch size. The new size applies from the next step.
//!
//! Units: every schedule here counts **per-device** examples (the planner multiplies
//! by the ranks), except [`ScheduleSpec::Ramp`], which states the **global** batch
//! directly (see [`crate::adapt::ramp`]).

pub use crate::adapt::goodput::GoodputSpec;
pub use crate::adapt::noise_scale::NoiseScalePolicy;
pub use crate::adapt::ramp::Ramp;
use crate::error::{Error, Result, SettingsError, TrainingError};

/// How `interval` changes the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Growth {
    /// Add `k` (negative shrinks).
    Add(i64),
    /// Multiply by `k`.
    Mul(usize),
}

/// A `fn(step, current) -> next` schedule written by the user.
pub type ScheduleFn = fn(usize, usize) -> usize;

/// The schedules of the DSL, as plain data.
#[derive(Debug, Clone, Copy)]
pub enum ScheduleSpec {
    /// A fixed size; `None` keeps the run's initial size.
    Constant(Option<usize>),
    /// After every `every` steps, apply `growth`.
    Interval {
        /// Steps between changes (≥ 1).
        every: usize,
        /// The change.
        growth: Growth,
    },
    /// From `from` at step 0 to `to` at step `over`, linearly, then `to`.
    Linear {
        /// Size at step 0.
        from: usize,
        /// Size from step `over` on.
        to: usize,
        /// Steps of the ramp (≥ 1).
        over: usize,
    },
    /// Piecewise constant: `(threshold, size)` pairs, thresholds strictly increasing;
    /// from step `threshold` on the size is `size`.
    Steps(&'static [(usize, usize)]),
    /// A user function `(step, current) -> next`.
    Custom(ScheduleFn),
    /// Megatron's global-batch ramp over examples consumed (global units).
    Ramp(Ramp),
    /// The same staircase over **tokens** consumed (the dataset's
    /// `Dataset::example_len`, summed over the examples trained), as in the batch
    /// warm-up of DeepSeek-V2/V3: the ramp's `samples` counts tokens. The global
    /// batch still counts examples.
    TokenRamp(Ramp),
    /// The global batch follows `fraction` times the gradient noise scale
    /// B_simple, by integer factors with hysteresis, within `[min, max]` (global
    /// units; starts at `min`); see [`NoiseScalePolicy`].
    NoiseScale(NoiseScalePolicy),
    /// The global batch and micro-batches of the highest goodput (Pollux), from
    /// the noise scale and the step times; see [`GoodputSpec`](crate::GoodputSpec).
    Goodput(GoodputSpec),
    /// Grow while the memory model predicts room (needs the memory model).
    Memory {
        /// Fraction of the baseline batch's peak memory that may be used.
        threshold: f64,
        /// Largest growth factor over the initial size.
        max_range: f64,
    },
}

impl PartialEq for ScheduleSpec {
    fn eq(&self, other: &Self) -> bool {
        use ScheduleSpec::*;
        match (self, other) {
            (Constant(a), Constant(b)) => a == b,
            (
                Interval {
                    every: a,
                    growth: g,
                },
                Interval {
                    every: b,
                    growth: h,
                },
            ) => a == b && g == h,
            (
                Linear {
                    from: a,
                    to: b,
                    over: c,
                },
                Linear {
                    from: d,
                    to: e,
                    over: f,
                },
            ) => (a, b, c) == (d, e, f),
            (Steps(a), Steps(b)) => a == b,
            (Ramp(a), Ramp(b)) | (TokenRamp(a), TokenRamp(b)) => a == b,
            (NoiseScale(a), NoiseScale(b)) => a == b,
            (Goodput(a), Goodput(b)) => a == b,
            // Two paths to one function may still compare unequal: fine for inspection.
            (Custom(a), Custom(b)) => std::ptr::fn_addr_eq(*a, *b),
            (
                Memory {
                    threshold: a,
                    max_range: b,
                },
                Memory {
                    threshold: c,
                    max_range: d,
                },
            ) => (a, b) == (c, d),
            _ => false,
        }
    }
}

/// How the step planner asks a schedule for sizes. Implemented by [`ScheduleSpec`],
/// the schedules of the DSL; a schedule of your own reaches a trainer as
/// `schedule = custom(path::to::fn)` (a `fn(step, current) -> next`), not through
/// this trait, which is internal to the planner.
pub trait Schedule: Send {
    /// The per-device size of step 1, given the run's configured initial size.
    fn initial(&self, configured: usize) -> usize {
        configured
    }
    /// The per-device size after step `step` (1-based), given the current size.
    fn next(&mut self, step: usize, current: usize) -> usize;
    /// A schedule in global units: the ramp the planner takes the global batch
    /// from, instead of `per_device × ranks`.
    fn ramp(&self) -> Option<Ramp> {
        None
    }
    /// Whether the ramp's position is tokens consumed rather than examples.
    fn ramp_counts_tokens(&self) -> bool {
        false
    }
}

impl ScheduleSpec {
    /// Whether the engine sizes the batch from the gradient noise scale
    /// (`noise_scale(..)`, `goodput(..)`), which the run must then measure.
    pub fn follows_noise_scale(&self) -> bool {
        matches!(self, ScheduleSpec::NoiseScale(_) | ScheduleSpec::Goodput(_))
    }
}

impl Schedule for ScheduleSpec {
    fn initial(&self, configured: usize) -> usize {
        match *self {
            ScheduleSpec::Constant(Some(n)) => n,
            ScheduleSpec::Linear { from, .. } => from,
            ScheduleSpec::Steps(table) => step_table_size(table, 0).unwrap_or(configured),
            _ => configured,
        }
    }

    fn ramp(&self) -> Option<Ramp> {
        match *self {
            ScheduleSpec::Ramp(r) | ScheduleSpec::TokenRamp(r) => Some(r),
            _ => None,
        }
    }

    fn ramp_counts_tokens(&self) -> bool {
        matches!(self, ScheduleSpec::TokenRamp(_))
    }

    fn next(&mut self, step: usize, current: usize) -> usize {
        match *self {
            ScheduleSpec::Constant(size) => size.unwrap_or(current),
            ScheduleSpec::Interval { every, growth } => {
                if every == 0 || step % every != 0 {
                    return current;
                }
                match growth {
                    Growth::Add(k) => {
                        let next = current as i128 + k as i128;
                        next.clamp(0, usize::MAX as i128) as usize
                    }
                    Growth::Mul(k) => current.saturating_mul(k),
                }
            }
            ScheduleSpec::Linear { from, to, over } => {
                let t = step.min(over) as f64 / over.max(1) as f64;
                (from as f64 + (to as f64 - from as f64) * t).round() as usize
            }
            ScheduleSpec::Steps(table) => step_table_size(table, step).unwrap_or(current),
            ScheduleSpec::Custom(f) => f(step, current),
            // The planner takes the global batch from the ramp itself.
            ScheduleSpec::Ramp(_) | ScheduleSpec::TokenRamp(_) => current,
            // The engine sets the global batch from the estimate.
            ScheduleSpec::NoiseScale(_) | ScheduleSpec::Goodput(_) => current,
            // Without the memory model the size stays put; policies with this schedule
            // are refused by `TrainerPolicy::assert_supported`.
            ScheduleSpec::Memory { .. } => current,
        }
    }
}

fn step_table_size(table: &[(usize, usize)], step: usize) -> Option<usize> {
    table
        .iter()
        .take_while(|(threshold, _)| *threshold <= step)
        .last()
        .map(|&(_, size)| size)
}

/// Lower and upper bounds applied to every schedule's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Smallest per-device size (≥ 1).
    pub min: usize,
    /// Largest per-device size.
    pub max: Option<usize>,
}

impl BatchLimits {
    /// Checks the bounds themselves.
    pub fn new(min: usize, max: Option<usize>) -> Result<Self> {
        if min == 0 {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "min_batch",
                value: "0".into(),
                expected: "at least 1",
            }));
        }
        if let Some(max) = max {
            if max < min {
                return Err(Error::Settings(SettingsError::BatchLimitsCrossed {
                    min,
                    max,
                }));
            }
        }
        Ok(Self { min, max })
    }

    /// Clamps a schedule's raw answer; a raw 0 is an error naming the step, because
    /// silently clamping it would hide a broken schedule.
    pub fn apply(&self, step: usize, raw: usize) -> Result<usize> {
        if raw == 0 {
            return Err(Error::Training(TrainingError::ScheduleReturnedZero {
                step,
            }));
        }
        let clamped = raw.max(self.min);
        Ok(self.max.map_or(clamped, |max| clamped.min(max)))
    }
}

/// Checks a schedule's own arguments (the macro checks the same at compile time;
/// this catches specs built by hand).
pub fn validate_spec(spec: &ScheduleSpec) -> Result<()> {
    use adabatch_rules::{memory, schedule as rule};
    let (schedule, verdict) = match *spec {
        ScheduleSpec::Constant(Some(n)) => ("constant", rule::size(n)),
        ScheduleSpec::Interval { every, growth } => (
            "interval",
            rule::every(every).and_then(|()| match growth {
                Growth::Add(k) => rule::step(k),
                Growth::Mul(k) => rule::factor(k as u64),
            }),
        ),
        ScheduleSpec::Linear { from, to, over } => ("linear", rule::linear(from, to, over)),
        ScheduleSpec::Steps(table) => ("steps", rule::steps(table)),
        ScheduleSpec::Ramp(r) | ScheduleSpec::TokenRamp(r) => return r.validate(),
        ScheduleSpec::NoiseScale(policy) => return policy.validate(),
        ScheduleSpec::Goodput(spec) => return spec.validate(),
        ScheduleSpec::Memory {
            threshold,
            max_range,
        } => ("memory", memory::check(threshold, max_range)),
        _ => return Ok(()),
    };
    verdict.map_err(|broken| SettingsError::schedule_rule(schedule, broken).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_grows_after_every_nth_step() {
        let mut s = ScheduleSpec::Interval {
            every: 5,
            growth: Growth::Add(1),
        };
        let sizes: Vec<usize> = (1..=10)
            .scan(1, |cur, step| {
                *cur = s.next(step, *cur);
                Some(*cur)
            })
            .collect();
        assert_eq!(sizes, vec![1, 1, 1, 1, 2, 2, 2, 2, 2, 3]);
    }

    #[test]
    fn interval_multiplies() {
        let mut s = ScheduleSpec::Interval {
            every: 2,
            growth: Growth::Mul(2),
        };
        assert_eq!(s.next(1, 4), 4);
        assert_eq!(s.next(2, 4), 8);
    }

    #[test]
    fn linear_ramps_then_holds() {
        let mut s = ScheduleSpec::Linear {
            from: 2,
            to: 10,
            over: 4,
        };
        assert_eq!(s.initial(7), 2);
        assert_eq!(s.next(1, 2), 4);
        assert_eq!(s.next(2, 4), 6);
        assert_eq!(s.next(4, 8), 10);
        assert_eq!(s.next(100, 10), 10);
    }

    #[test]
    fn steps_table_picks_last_threshold_reached() {
        static TABLE: [(usize, usize); 3] = [(0, 8), (100, 16), (200, 32)];
        let mut s = ScheduleSpec::Steps(&TABLE);
        assert_eq!(s.initial(1), 8);
        assert_eq!(s.next(99, 8), 8);
        assert_eq!(s.next(100, 8), 16);
        assert_eq!(s.next(250, 16), 32);
    }

    #[test]
    fn limits_clamp_and_reject_zero() {
        let limits = BatchLimits::new(2, Some(6)).unwrap();
        assert_eq!(limits.apply(3, 1).unwrap(), 2);
        assert_eq!(limits.apply(3, 9).unwrap(), 6);
        assert!(matches!(
            limits.apply(7, 0),
            Err(Error::Training(TrainingError::ScheduleReturnedZero {
                step: 7
            }))
        ));
        assert!(BatchLimits::new(0, None).is_err());
        assert!(BatchLimits::new(5, Some(4)).is_err());
    }

    #[test]
    fn spec_validation_rejects_bad_arguments() {
        assert!(validate_spec(&ScheduleSpec::Interval {
            every: 0,
            growth: Growth::Add(1)
        })
        .is_err());
        assert!(validate_spec(&ScheduleSpec::Interval {
            every: 1,
            growth: Growth::Mul(1)
        })
        .is_err());
        static BAD: [(usize, usize); 2] = [(5, 1), (5, 2)];
        assert!(validate_spec(&ScheduleSpec::Steps(&BAD)).is_err());
        assert!(validate_spec(&ScheduleSpec::Constant(None)).is_ok());
    }
}
