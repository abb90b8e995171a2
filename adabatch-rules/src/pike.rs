//! `mix = pike(t0, zeta1, zeta2, floor, smoothing, tau)`: PiKE (Li et al. 2025,
//! arXiv 2502.06244, Algorithm 1), the mixing weights moved every `T₀` steps by
//! a mirror-descent step on each source's gradient norm and variance; with `τ`,
//! Balanced-PiKE (its §3.3, the tilted loss of its equation (11)).
//!
//! `T₀`, `ζ₁`, `ζ₂` and `τ` are the paper's names; their values are ours. The
//! paper leaves them to its appendix, which we could not consult; its main text
//! gives `τ = 3` (§4.2: "τ = 3 offers the best trade-off"). The engine takes
//! the exponents in units of the sources' mean `|∇L_k|²`, so `ζ₁` and `ζ₂` are
//! the mirror step's size (the paper's `αηβ` and `αLη²` over that scale).
//! `ζ₁ = ζ₂ = 0.03`, `T₀ = 10`, `floor = 0.1` and `smoothing = 0.8` were chosen
//! on seeds 1 and 2 of the three-domain mixing benchmark (BENCHMARKS.md,
//! "PiKE"): at `ζ = 1`, `0.3` or `0.1` without the floor and the smoothing, a
//! few noisy measurements of a small batch moved a domain to a few percent of
//! it for the rest of the run. `floor = 0` and `smoothing = 0` are the paper's
//! algorithm as written.

use crate::{count, non_negative, within, Check};

/// `T₀`: steps between two measurements (Algorithm 1, line 4).
pub const T0: usize = 10;
/// `ζ₁`: the weight of a source's squared gradient norm in the update (line 6),
/// in units of the sources' mean.
pub const ZETA1: f64 = 0.03;
/// `ζ₂`: the weight of its gradient variance over twice the batch (line 6), in
/// the same units.
pub const ZETA2: f64 = 0.03;
/// Every source's least share, together, mixed into the weights given (the
/// mirror step's own weights are kept apart); 0: none, as the paper. A tenth
/// keeps every source measurable in a small batch.
pub const FLOOR: f64 = 0.1;
/// The statistics' moving-average decay per measurement (the variance's in log
/// space, so one outlying measurement moves it little); 0: each measurement
/// alone, as the paper.
pub const SMOOTHING: f64 = 0.8;
/// Balanced-PiKE's `τ` (when asked for): the paper's best trade-off.
pub const TAU: f64 = 3.0;

/// `t0` counts.
pub fn t0(n: usize) -> Check {
    count("t0", n)
}

/// `zeta1` at least 0.
pub fn zeta1(z: f64) -> Check {
    non_negative("zeta1", z)
}

/// `zeta2` at least 0.
pub fn zeta2(z: f64) -> Check {
    non_negative("zeta2", z)
}

/// `floor` in `[0, 1]`.
pub fn floor(f: f64) -> Check {
    within("floor", f, (0.0, 1.0, false))
}

/// `smoothing` in `[0, 1)`.
pub fn smoothing(s: f64) -> Check {
    within("smoothing", s, (0.0, 1.0, true))
}

/// `tau` at least 0.
pub fn tau(t: f64) -> Check {
    non_negative("tau", t)
}

/// The whole setting: `t0`, then `(zeta1, zeta2, floor, smoothing)`, and `tau`
/// (pass 0 without it).
pub fn check(t0_steps: usize, numbers: (f64, f64, f64, f64), tilt: f64) -> Check {
    let (z1, z2, f, s) = numbers;
    t0(t0_steps)?;
    zeta1(z1)?;
    zeta2(z2)?;
    floor(f)?;
    smoothing(s)?;
    tau(tilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_argument_is_named() {
        let defaults = (ZETA1, ZETA2, FLOOR, SMOOTHING);
        assert!(check(T0, defaults, TAU).is_ok());
        assert_eq!(check(0, defaults, TAU).unwrap_err().arg, "t0");
        assert_eq!(
            check(1, (-1.0, 1.0, 0.0, 0.0), 0.0).unwrap_err().arg,
            "zeta1"
        );
        assert_eq!(
            check(1, (1.0, f64::NAN, 0.0, 0.0), 0.0).unwrap_err().arg,
            "zeta2"
        );
        assert_eq!(
            check(1, (1.0, 1.0, 2.0, 0.0), 0.0).unwrap_err().arg,
            "floor"
        );
        assert_eq!(
            check(1, (1.0, 1.0, 0.0, 1.0), 0.0).unwrap_err().arg,
            "smoothing"
        );
        assert_eq!(check(1, (1.0, 1.0, 0.0, 0.0), -1.0).unwrap_err().arg, "tau");
    }
}
