//! The batch schedules' own arguments: `constant(n)`, `interval(every, ±k | *k)`,
//! `linear(from, to, over = n)`, `steps(t => n, ..)` and `ramp(start, increment,
//! samples, global)`.

use crate::{broken, count, Check};

/// A batch size: at least 1.
pub fn size(n: usize) -> Check {
    if n == 0 {
        return broken("size", "a batch size must be at least 1".into());
    }
    Ok(())
}

/// `interval`'s `every`: at least 1.
pub fn every(n: usize) -> Check {
    if n == 0 {
        return broken(
            "every",
            "`every` must be at least 1 (the size changes after every `every` steps)".into(),
        );
    }
    Ok(())
}

/// `interval`'s `+k` or `-k`: not zero.
pub fn step(k: i64) -> Check {
    if k == 0 {
        return broken(
            "growth",
            "the step must not be zero; use `constant` for a fixed size".into(),
        );
    }
    Ok(())
}

/// `interval`'s `*k`: at least 2.
pub fn factor(k: u64) -> Check {
    if k < 2 {
        return broken("growth", format!("the factor `*{k}` must be at least 2"));
    }
    Ok(())
}

/// `linear(from, to, over = n)`: each at least 1.
pub fn linear(from: usize, to: usize, over: usize) -> Check {
    count("from", from)?;
    count("to", to)?;
    count("over", over)
}

/// One entry of `steps(..)` after the entry of threshold `previous`: a size of
/// at least 1, thresholds strictly increasing.
pub fn steps_entry(previous: Option<usize>, threshold: usize, batch: usize) -> Check {
    size(batch)?;
    match previous {
        Some(p) if threshold <= p => broken(
            "threshold",
            format!("thresholds must be strictly increasing: `{threshold}` comes after `{p}`"),
        ),
        _ => Ok(()),
    }
}

/// The whole `steps(..)` table.
pub fn steps(table: &[(usize, usize)]) -> Check {
    if table.is_empty() {
        return broken(
            "steps",
            "needs at least one `threshold => size` pair".into(),
        );
    }
    let mut previous = None;
    for &(threshold, batch) in table {
        steps_entry(previous, threshold, batch)?;
        previous = Some(threshold);
    }
    Ok(())
}

/// `ramp`'s stairs: `start`, `increment` and the climb's length count, and
/// stairs of `increment` from `start` reach `global` exactly (`start = global`
/// is a ramp that does not climb: a constant global batch).
pub fn ramp(start: usize, increment: usize, samples: usize, global: usize) -> Check {
    count("start", start)?;
    count("increment", increment)?;
    count("samples", samples)?;
    count("global", global)?;
    if start > global {
        return broken(
            "start",
            format!("`start = {start}` is larger than `global = {global}`"),
        );
    }
    if (global - start) % increment != 0 {
        return broken(
            "increment",
            format!(
                "`global - start` = {} is not a multiple of `increment = {increment}`",
                global - start
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_schedule_names_the_argument_at_fault() {
        assert_eq!(size(0).unwrap_err().arg, "size");
        assert_eq!(every(0).unwrap_err().arg, "every");
        assert!(step(-1).is_ok() && step(0).is_err());
        assert!(factor(2).is_ok() && factor(1).is_err());
        assert_eq!(linear(8, 16, 0).unwrap_err().arg, "over");
        assert!(steps(&[(0, 8), (100, 16)]).is_ok());
        assert_eq!(steps(&[]).unwrap_err().arg, "steps");
        assert_eq!(steps(&[(0, 8), (0, 16)]).unwrap_err().arg, "threshold");
        assert_eq!(steps(&[(0, 0)]).unwrap_err().arg, "size");
        assert!(ramp(16, 16, 1000, 256).is_ok());
        assert!(
            ramp(256, 16, 1000, 256).is_ok(),
            "a ramp that does not climb"
        );
        assert_eq!(ramp(300, 16, 1000, 256).unwrap_err().arg, "start");
        assert_eq!(ramp(16, 17, 1000, 256).unwrap_err().arg, "increment");
        assert_eq!(ramp(16, 16, 0, 256).unwrap_err().arg, "samples");
    }
}
