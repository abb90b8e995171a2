//! `schedule = noise_scale(fraction, min, max, factor, hysteresis, shrink, every)`:
//! the global batch follows a fraction of the measured gradient noise scale.

use crate::{batch_range, count, non_negative, positive, Check};

/// The share of the estimated noise scale the batch tracks.
pub const FRACTION: f64 = 1.0;
/// The factor of every change (2: doubling).
pub const FACTOR: usize = 2;
/// The margin the target must clear before a change.
pub const HYSTERESIS: f64 = 0.1;
/// Whether the batch may shrink.
pub const SHRINK: bool = false;

/// `every = model`: the cadence from a fixed model of a split's cost (reads no clock).
pub const EVERY_MODEL: &str = "model";
/// `every = auto`: the cadence from measured step times (reads the clock).
pub const EVERY_AUTO: &str = "auto";
/// `every`'s value when absent, in the attribute, the library and the flag alike.
pub const EVERY_DEFAULT: &str = EVERY_MODEL;
/// What `every` takes, for messages.
pub const EVERY_FORMS: &str = "`model` (the default), `auto` or a number of steps >= 1";

/// `fraction` positive.
pub fn fraction(f: f64) -> Check {
    positive("fraction", f)
}

/// `factor` at least 1 (1: continuous).
pub fn factor(k: usize) -> Check {
    count("factor", k)
}

/// `hysteresis` at least 0.
pub fn hysteresis(h: f64) -> Check {
    non_negative("hysteresis", h)
}

/// `every = n`: at least 1.
pub fn every(n: usize) -> Check {
    count("every", n)
}

/// The whole setting (`every` apart: it is not always a number).
pub fn check(f: f64, min: usize, max: usize, k: usize, h: f64) -> Check {
    fraction(f)?;
    batch_range(min, max)?;
    factor(k)?;
    hysteresis(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_argument_is_named() {
        assert!(check(FRACTION, 8, 512, FACTOR, HYSTERESIS).is_ok());
        assert_eq!(check(-1.0, 8, 512, 2, 0.1).unwrap_err().arg, "fraction");
        assert_eq!(check(1.0, 8, 4, 2, 0.1).unwrap_err().arg, "max");
        assert_eq!(check(1.0, 8, 512, 0, 0.1).unwrap_err().arg, "factor");
        assert_eq!(check(1.0, 8, 512, 2, -0.1).unwrap_err().arg, "hysteresis");
        assert_eq!(every(0).unwrap_err().arg, "every");
    }
}
