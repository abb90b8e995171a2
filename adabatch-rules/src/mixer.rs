//! `mix = online(temperature, floor, smoothing, warmup)`: weights from a softmax
//! of each source's smoothed loss, equal for the first `warmup` steps (a count)
//! or share of the run's expected steps (a fraction, the default).
//!
//! The defaults are the measured best of the mixing benchmarks (BENCHMARKS.md,
//! "The online mixer with a warm-up"): at temperature 1 with no warm-up the tilt
//! cost the mean loss more than 0.01 nats on 6 runs of 12; at 1.5 after equal
//! shares for 40 % of the run the online mixer met the bar against uniform.

use crate::{positive, within, Check};

/// The softmax's temperature, in nats.
pub const TEMPERATURE: f64 = 1.5;
/// Every source's least weight before renormalising.
pub const FLOOR: f64 = 0.05;
/// The losses' moving-average decay.
pub const SMOOTHING: f64 = 0.9;
/// The share of the run's expected steps at equal shares before the softmax
/// decides (a count of steps instead is any count).
pub const WARMUP_FRACTION: f64 = 0.4;

/// `temperature` positive.
pub fn temperature(t: f64) -> Check {
    positive("temperature", t)
}

/// `floor` in `[0, 1]`.
pub fn floor(f: f64) -> Check {
    within("floor", f, (0.0, 1.0, false))
}

/// A warm-up given as a share of the run, in `[0, 1]`.
pub fn warmup_fraction(f: f64) -> Check {
    within("warmup", f, (0.0, 1.0, false))
}

/// `smoothing` in `[0, 1)`.
pub fn smoothing(s: f64) -> Check {
    within("smoothing", s, (0.0, 1.0, true))
}

/// A mixing weight (`fixed(..)`'s, a curriculum point's, a mixer's proposal): a
/// finite number >= 0.
pub fn weight(w: f64) -> Check {
    if w.is_finite() && w >= 0.0 {
        return Ok(());
    }
    crate::broken("fixed", format!("weight {w} is not a finite number >= 0"))
}

/// Mixing weights together: each a [`weight`], and not all 0 (weights are
/// normalised when used, so some source must have a share).
pub fn weights(ws: &[f64]) -> Check {
    ws.iter().try_for_each(|w| weight(*w))?;
    if ws.iter().sum::<f64>() > 0.0 {
        return Ok(());
    }
    crate::broken(
        "fixed",
        "all weights are 0: some source must have a positive weight".into(),
    )
}

/// The whole setting.
pub fn check(t: f64, f: f64, s: f64) -> Check {
    temperature(t)?;
    floor(f)?;
    smoothing(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_argument_is_named() {
        assert!(check(TEMPERATURE, FLOOR, SMOOTHING).is_ok());
        assert_eq!(check(0.0, 0.05, 0.9).unwrap_err().arg, "temperature");
        assert_eq!(check(1.0, 1.5, 0.9).unwrap_err().arg, "floor");
        assert_eq!(check(1.0, 0.05, 1.0).unwrap_err().arg, "smoothing");
        assert_eq!(check(1.0, f64::NAN, 0.9).unwrap_err().arg, "floor");
    }

    #[test]
    fn weights_are_finite_non_negative_and_not_all_zero() {
        assert!(weights(&[0.75, 0.25]).is_ok());
        assert!(weights(&[0.0, 1.0]).is_ok());
        assert!(weights(&[0.0, 0.0])
            .unwrap_err()
            .message
            .contains("all weights are 0"));
        assert!(weights(&[]).is_err());
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            assert!(
                weight(bad).is_err() && weights(&[1.0, bad]).is_err(),
                "{bad}"
            );
        }
    }
}
