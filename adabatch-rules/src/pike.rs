//! `mix = pike(t0, zeta1, zeta2, floor, smoothing, tau)`: PiKE (Li et al. 2025,
//! arXiv 2502.06244, Algorithm 1), the mixing weights moved every `T₀` steps by
//! a mirror-descent step on each source's gradient norm and variance; with `τ`,
//! Balanced-PiKE (its §3.3, the tilted loss of its equation (11)).
//!
//! `T₀`, `ζ₁`, `ζ₂` and `τ` are the paper's names. The paper's text leaves their
//! values to its appendix (read: its main text only): `ζ₁ = ζ₂ = 1` are the
//! mirror step `αηβ` and `αLη²` of its §3.2 folded into order-one numbers, to
//! tune; `τ = 3` is the value its experiments found the best trade-off (§4.2:
//! "τ = 3 offers the best trade-off"). `floor` and `smoothing` are this crate's
//! (0: the paper's algorithm as written).

use crate::{count, non_negative, within, Check};

/// `T₀`: steps between two measurements (Algorithm 1, line 4).
pub const T0: usize = 10;
/// `ζ₁`: the weight of a source's squared gradient norm in the update (line 6).
pub const ZETA1: f64 = 1.0;
/// `ζ₂`: the weight of its gradient variance over twice the batch (line 6).
pub const ZETA2: f64 = 1.0;
/// Every source's least share, together, mixed into the weights given (the
/// mirror step's own weights are kept apart); 0: none, as the paper.
pub const FLOOR: f64 = 0.0;
/// The statistics' moving-average decay per measurement; 0: each measurement
/// alone, as the paper.
pub const SMOOTHING: f64 = 0.0;
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
