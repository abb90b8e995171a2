//! `mix = pike(every, zeta, temperature, floor, smoothing)` and its fair variant's
//! `tilt`: PiKE (Li et al. 2025, arXiv 2502.06244), weights from each source's
//! gradient norm and variance measured every `every` steps.

use crate::{count, non_negative, positive, within, Check};

/// Steps between two measurements of the sources' gradients (a measuring step
/// splits its examples by source).
pub const EVERY: usize = 10;
/// `ζ`: how much a source's gradient variance per batch, `σ_k² / b`, takes off
/// its gain `|g_k|²` (the second-order term of the one-step bound, `L·η` and the
/// sources' count folded into one number).
pub const ZETA: f64 = 1.0;
/// The softmax's temperature, relative to the sources' mean `|g_k|²`.
pub const TEMPERATURE: f64 = 1.0;
/// Every source's least weight before renormalising (so that every source keeps
/// examples to measure).
pub const FLOOR: f64 = 0.05;
/// The statistics' moving-average decay per measurement: 0, each measurement
/// alone (the weights follow the statistics of the step that measured them).
pub const SMOOTHING: f64 = 0.0;
/// The fair variant's tilt `τ` on the sources' losses (0: the average loss).
pub const TILT: f64 = 1.0;

/// `every` counts.
pub fn every(n: usize) -> Check {
    count("every", n)
}

/// `zeta` at least 0.
pub fn zeta(z: f64) -> Check {
    non_negative("zeta", z)
}

/// `temperature` positive.
pub fn temperature(t: f64) -> Check {
    positive("temperature", t)
}

/// `floor` in `[0, 1]`.
pub fn floor(f: f64) -> Check {
    within("floor", f, (0.0, 1.0, false))
}

/// `smoothing` in `[0, 1)`.
pub fn smoothing(s: f64) -> Check {
    within("smoothing", s, (0.0, 1.0, true))
}

/// `tilt` at least 0.
pub fn tilt(t: f64) -> Check {
    non_negative("tilt", t)
}

/// The whole setting: `(every, zeta, temperature, floor, smoothing)` and the tilt.
pub fn check(every_steps: usize, numbers: (f64, f64, f64, f64), tilted: f64) -> Check {
    let (z, t, f, s) = numbers;
    every(every_steps)?;
    zeta(z)?;
    temperature(t)?;
    floor(f)?;
    smoothing(s)?;
    tilt(tilted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_argument_is_named() {
        let defaults = (ZETA, TEMPERATURE, FLOOR, SMOOTHING);
        assert!(check(EVERY, defaults, TILT).is_ok());
        assert_eq!(check(0, defaults, TILT).unwrap_err().arg, "every");
        assert_eq!(
            check(1, (-1.0, 1.0, 0.0, 0.0), 0.0).unwrap_err().arg,
            "zeta"
        );
        assert_eq!(
            check(1, (1.0, 0.0, 0.0, 0.0), 0.0).unwrap_err().arg,
            "temperature"
        );
        assert_eq!(
            check(1, (1.0, 1.0, 2.0, 0.0), 0.0).unwrap_err().arg,
            "floor"
        );
        assert_eq!(
            check(1, (1.0, 1.0, 0.0, 1.0), 0.0).unwrap_err().arg,
            "smoothing"
        );
        assert_eq!(
            check(1, (1.0, 1.0, 0.0, 0.0), f64::NAN).unwrap_err().arg,
            "tilt"
        );
    }
}
