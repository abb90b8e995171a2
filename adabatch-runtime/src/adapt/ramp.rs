//! Megatron-LM's batch-size ramp (`--rampup-batch-size START INCR SAMPLES` with
//! `--global-batch-size G`): a schedule in **global** units, driven by the examples
//! consumed rather than by steps.
//!
//! With `per_increment = samples / ((G − start) / increment)` (a float, as in
//! Megatron), the global batch of a step that starts after `consumed` examples is
//! `start + ⌊consumed / per_increment⌋ · increment` while `consumed ≤ samples`, and
//! `G` after. The arithmetic is Megatron's own (`f64` division, truncation), so the
//! staircase matches it step for step, boundaries included.

use crate::error::{Result, SettingsError};

/// A global-batch ramp; see the module docs. `start == global` is a constant global
/// batch (`--global-batch-size` alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Ramp {
    /// Global batch of the first step.
    pub start: usize,
    /// Growth of the global batch per stair.
    pub increment: usize,
    /// Examples over which the ramp climbs from `start` to `global`.
    pub samples: usize,
    /// Global batch once the ramp is over.
    pub global: usize,
}

impl Ramp {
    /// A constant global batch of `global` examples.
    pub const fn constant(global: usize) -> Self {
        Self {
            start: global,
            increment: 1,
            samples: 0,
            global,
        }
    }

    /// Whether the ramp never changes the size.
    pub const fn is_constant(&self) -> bool {
        self.start == self.global
    }

    /// Megatron's checks: every value at least 1, `start < global` (or a constant),
    /// `global − start` a multiple of `increment`.
    pub fn validate(&self) -> Result<()> {
        let Ramp {
            start,
            increment,
            samples,
            global,
        } = *self;
        adabatch_rules::schedule::ramp(start, increment, samples, global).or_else(|broken| {
            match self.is_constant() && global > 0 {
                // A ramp that does not climb needs no stairs.
                true => Ok(()),
                false => Err(SettingsError::schedule_rule("ramp", broken).into()),
            }
        })
    }

    /// The global batch of a step taken after `consumed` examples.
    pub fn global_batch(&self, consumed: usize) -> usize {
        if self.is_constant() || consumed > self.samples {
            return self.global;
        }
        let increments = (self.global - self.start) / self.increment;
        let per_increment = self.samples as f64 / increments as f64;
        let stairs = (consumed as f64 / per_increment) as usize;
        (self.start + stairs * self.increment).min(self.global)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staircase_of_the_megatron_docs() {
        // --rampup-batch-size 16 16 10000 --global-batch-size 256: 15 stairs of
        // 666.67 examples each.
        let r = Ramp {
            start: 16,
            increment: 16,
            samples: 10_000,
            global: 256,
        };
        r.validate().unwrap();
        assert_eq!(r.global_batch(0), 16);
        assert_eq!(r.global_batch(666), 16);
        assert_eq!(r.global_batch(667), 32);
        assert_eq!(r.global_batch(10_000), 256);
        assert_eq!(r.global_batch(9_999), 240);
        assert_eq!(r.global_batch(1 << 40), 256);
    }

    #[test]
    fn validation() {
        let ok = Ramp {
            start: 4,
            increment: 2,
            samples: 10,
            global: 8,
        };
        assert!(ok.validate().is_ok());
        assert!(Ramp { increment: 3, ..ok }.validate().is_err());
        assert!(Ramp { start: 0, ..ok }.validate().is_err());
        assert!(Ramp { samples: 0, ..ok }.validate().is_err());
        assert!(Ramp { start: 10, ..ok }.validate().is_err());
        assert!(Ramp::constant(0).validate().is_err());
        assert!(Ramp::constant(7).validate().is_ok());
        assert_eq!(Ramp::constant(7).global_batch(0), 7);
    }
}
