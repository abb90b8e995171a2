//! `schedule = goodput(min, max, max_local, max_micro_batches, hysteresis,
//! step_time)`: the batch and accumulation of the highest goodput.

use crate::{batch_range, count, non_negative, Check};

/// No limit on the examples per rank and micro-batch.
pub const MAX_LOCAL: usize = 0;
/// The most micro-batches a step is split into.
pub const MAX_MICRO_BATCHES: usize = 8;
/// The relative gain a change must beat.
pub const HYSTERESIS: f64 = 0.05;

/// `max_local = m`, when given: at least 1 (absent: no limit).
pub fn max_local(m: usize) -> Check {
    count("max_local", m)
}

/// `max_micro_batches` at least 1.
pub fn max_micro_batches(k: usize) -> Check {
    count("max_micro_batches", k)
}

/// `hysteresis` at least 0.
pub fn hysteresis(h: f64) -> Check {
    non_negative("hysteresis", h)
}

/// The whole setting (`max_local` 0: no limit).
pub fn check(min: usize, max: usize, local: usize, k: usize, h: f64) -> Check {
    batch_range(min, max)?;
    if local != MAX_LOCAL {
        max_local(local)?;
    }
    max_micro_batches(k)?;
    hysteresis(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_argument_is_named() {
        assert!(check(8, 1024, MAX_LOCAL, MAX_MICRO_BATCHES, HYSTERESIS).is_ok());
        assert_eq!(check(0, 1024, 0, 8, 0.05).unwrap_err().arg, "min");
        assert_eq!(
            check(8, 1024, 0, 0, 0.05).unwrap_err().arg,
            "max_micro_batches"
        );
        assert_eq!(
            check(8, 1024, 0, 8, f64::INFINITY).unwrap_err().arg,
            "hysteresis"
        );
    }
}
