//! `grad_accum = fixed(n) | target(global = n)`: the micro-batches a step
//! accumulates.

use crate::{broken, Check};

/// `fixed(n)`: at least one micro-batch per step.
pub fn fixed(n: usize) -> Check {
    if n == 0 {
        return broken(
            "fixed",
            "`fixed(0)`: accumulate at least 1 micro-batch per step".into(),
        );
    }
    Ok(())
}

/// `target(global = n)`: an effective global batch of at least one example.
pub fn target(global: usize) -> Check {
    if global == 0 {
        return broken(
            "global",
            "`target(global = 0)`: the effective global batch must be at least 1".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_refused_in_either_form() {
        assert!(fixed(1).is_ok() && target(64).is_ok());
        assert_eq!(fixed(0).unwrap_err().arg, "fixed");
        assert!(target(0).unwrap_err().message.contains("global = 0"));
    }
}
