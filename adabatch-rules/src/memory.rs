//! `schedule = memory(threshold, max_range)`: grow the batch while the peak memory
//! stays under a share of the baseline's.

use crate::{broken, Check};

/// The share of the baseline batch's peak memory a grown batch may reach.
pub const THRESHOLD: f64 = 0.9;
/// The largest growth over the initial batch.
pub const MAX_RANGE: f64 = 2.0;

/// `threshold` in `(0, 1]`.
pub fn threshold(t: f64) -> Check {
    if !(t > 0.0 && t <= 1.0) {
        return broken(
            "threshold",
            format!("`threshold = {t}` must be in (0, 1]: a fraction of the baseline batch's peak memory"),
        );
    }
    Ok(())
}

/// `max_range` of at least 1.
pub fn max_range(r: f64) -> Check {
    if !(r.is_finite() && r >= 1.0) {
        return broken(
            "max_range",
            format!("`max_range = {r}` must be at least 1.0: the largest growth factor over the initial size"),
        );
    }
    Ok(())
}

/// The whole setting.
pub fn check(t: f64, r: f64) -> Check {
    threshold(t)?;
    max_range(r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_defaults_pass_and_the_bounds_hold() {
        assert!(super::check(super::THRESHOLD, super::MAX_RANGE).is_ok());
        assert!(super::check(1.0, 1.0).is_ok());
        assert_eq!(super::check(0.0, 2.0).unwrap_err().arg, "threshold");
        assert_eq!(super::check(0.5, 0.5).unwrap_err().arg, "max_range");
        assert_eq!(super::check(f64::NAN, 2.0).unwrap_err().arg, "threshold");
    }
}
