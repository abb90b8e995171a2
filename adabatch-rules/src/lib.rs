//! The rules and defaults of adabatch's settings, in one place.
//!
//! The attribute (`adabatch-macros`) checks a struct's settings when it compiles;
//! the engine (`adabatch-runtime`) checks the same settings when a program builds
//! them at run time (from flags, a config, by hand). Both call these functions and
//! read these constants, so a rule or a default is written once. A broken rule
//! names the argument at fault ([`Broken::arg`]): the attribute points its error
//! at that argument, the engine names the schedule or mixer around it.
//!
//! Each setting has one function per argument (so that the attribute reports
//! every bad argument of a call, not only the first) and a `check` of the whole
//! setting, which the engine calls.
//!
//! No dependencies: the attribute builds this crate at compile time.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod goodput;
pub mod grad_accum;
pub mod memory;
pub mod mixer;
pub mod noise_scale;
pub mod pike;
pub mod schedule;

/// A broken rule: the argument at fault and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The argument as the attribute spells it (`threshold`, `max`).
    pub arg: &'static str,
    /// What is wrong, with the value: ``"`threshold = 1.5` must be in (0, 1]"``.
    pub message: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A rule's verdict.
pub type Check = Result<(), Broken>;

fn broken(arg: &'static str, message: String) -> Check {
    Err(Broken { arg, message })
}

/// An argument that counts (a batch, a number of steps): at least 1.
pub fn count(arg: &'static str, n: usize) -> Check {
    if n == 0 {
        return broken(arg, format!("`{arg}` must be at least 1"));
    }
    Ok(())
}

/// A finite number above 0.
pub fn positive(arg: &'static str, x: f64) -> Check {
    if !(x.is_finite() && x > 0.0) {
        return broken(arg, format!("`{arg} = {x}` must be positive"));
    }
    Ok(())
}

/// A finite number of at least 0.
pub fn non_negative(arg: &'static str, x: f64) -> Check {
    if !(x.is_finite() && x >= 0.0) {
        return broken(arg, format!("`{arg} = {x}` must be at least 0"));
    }
    Ok(())
}

/// A number in `[low, high]`, or `[low, high)` where `high_open`.
fn within(arg: &'static str, x: f64, (low, high, high_open): (f64, f64, bool)) -> Check {
    let inside = x >= low && if high_open { x < high } else { x <= high };
    if !inside {
        let close = if high_open { ')' } else { ']' };
        return broken(
            arg,
            format!("`{arg} = {x}` must be in [{low}, {high}{close}"),
        );
    }
    Ok(())
}

/// `min` and `max` both count, and `min <= max`: a range of global batches.
pub fn batch_range(min: usize, max: usize) -> Check {
    count("min", min)?;
    count("max", max)?;
    if max < min {
        return broken(
            "max",
            format!("`max = {max}` is smaller than `min = {min}`"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_general_rules_name_their_argument_and_value() {
        assert_eq!(
            count("min", 0).unwrap_err().message,
            "`min` must be at least 1"
        );
        assert!(count("min", 1).is_ok());
        assert_eq!(
            positive("fraction", 0.0).unwrap_err().to_string(),
            "`fraction = 0` must be positive"
        );
        assert!(positive("fraction", f64::INFINITY).is_err());
        assert!(non_negative("hysteresis", 0.0).is_ok());
        assert!(non_negative("hysteresis", f64::NAN).is_err());
        let err = batch_range(8, 4).unwrap_err();
        assert_eq!(
            (err.arg, err.message.as_str()),
            ("max", "`max = 4` is smaller than `min = 8`")
        );
        assert_eq!(batch_range(0, 4).unwrap_err().arg, "min");
        assert!(within("floor", 1.0, (0.0, 1.0, false)).is_ok());
        assert_eq!(
            within("smoothing", 1.0, (0.0, 1.0, true))
                .unwrap_err()
                .message,
            "`smoothing = 1` must be in [0, 1)"
        );
    }
}
