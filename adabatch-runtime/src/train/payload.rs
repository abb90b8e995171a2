//! What every rank puts into a step's one all-reduce besides its gradients, and
//! what it reads back: the step's scalars, laid out by one [`PayloadLayout`] on the
//! writing and on the reading side, so that the two cannot disagree.

use crate::error::{Error, Result, TrainingError};

/// How long each variable part of the step's scalars is: the same on every rank
/// of a step (a failed rank included), so that the sums line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PayloadLayout {
    /// The step's probes' slots (`crate::train::probe`).
    pub(crate) probes: usize,
    /// One gradient-coverage flag per parameter on the step that checks
    /// coverage (the first), else 0.
    pub(crate) coverage: usize,
}

/// One rank's scalars of a step; once summed over the ranks, the flags count
/// ranks.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StepScalars {
    /// Summed (reweighted) loss.
    pub(crate) loss: f64,
    /// Tokens that carry loss.
    pub(crate) tokens: f64,
    /// 1 where the step failed other than by running out of memory.
    pub(crate) failed: f64,
    /// 1 where the step ran out of memory.
    pub(crate) out_of_memory: f64,
    /// 1 where a signal arrived: the run stops after this step.
    pub(crate) interrupt: f64,
    /// The probes' values, `layout.probes` of them.
    pub(crate) probed: Vec<f64>,
    /// 1 per parameter with a gradient here, `layout.coverage` of them.
    pub(crate) covered: Vec<f64>,
}

impl PayloadLayout {
    /// The scalars every step carries before the variable parts.
    const FIXED: usize = 5;

    /// How many scalars the all-reduce carries.
    pub(crate) fn len(&self) -> usize {
        Self::FIXED + self.probes + self.coverage
    }

    /// `scalars` in the all-reduce's order: the fixed ones, the probes', the
    /// coverage flags. A part left empty (a rank whose
    /// step failed has none) is sent as zeros.
    pub(crate) fn write(&self, scalars: &StepScalars) -> Vec<f64> {
        let mut flat = Vec::with_capacity(self.len());
        flat.extend([
            scalars.loss,
            scalars.tokens,
            scalars.failed,
            scalars.out_of_memory,
            scalars.interrupt,
        ]);
        // `check` refused a part of another length before; an empty one is zeros.
        for (part, len) in [
            (&scalars.probed, self.probes),
            (&scalars.covered, self.coverage),
        ] {
            flat.extend(part.iter().copied().chain(std::iter::repeat(0.0)).take(len));
        }
        flat
    }

    /// A rank's variable parts against the layout: each empty (sent as zeros) or
    /// of its length; otherwise a typed error, which the rank sends as a failed
    /// step so that no value is summed out of place.
    pub(crate) fn check(&self, probed: &[f64], covered: Option<&[bool]>) -> Result<()> {
        let covered = covered.map_or(0, <[bool]>::len);
        for (part, len, expected) in [
            ("probes", probed.len(), self.probes),
            ("coverage flags", covered, self.coverage),
        ] {
            if len != 0 && len != expected {
                return Err(Error::Training(TrainingError::StepPayloadMismatch {
                    part,
                    len,
                    expected,
                }));
            }
        }
        Ok(())
    }

    /// The scalars [`write`](Self::write) laid out (summed over the ranks).
    pub(crate) fn read(&self, flat: &[f64]) -> StepScalars {
        debug_assert_eq!(flat.len(), self.len(), "the step's payload");
        let (fixed, rest) = flat.split_at(Self::FIXED.min(flat.len()));
        let fixed = |i: usize| fixed.get(i).copied().unwrap_or(0.0);
        let (probed, covered) = rest.split_at(self.probes.min(rest.len()));
        StepScalars {
            loss: fixed(0),
            tokens: fixed(1),
            failed: fixed(2),
            out_of_memory: fixed(3),
            interrupt: fixed(4),
            probed: probed.to_vec(),
            covered: covered.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back_and_empty_parts_are_zeros() {
        let layout = PayloadLayout {
            probes: 8,
            coverage: 3,
        };
        let scalars = StepScalars {
            loss: 1.5,
            tokens: 40.0,
            failed: 0.0,
            out_of_memory: 0.0,
            interrupt: 1.0,
            probed: (0..8).map(f64::from).collect(),
            covered: vec![1.0, 0.0, 1.0],
        };
        let flat = layout.write(&scalars);
        assert_eq!(flat.len(), layout.len());
        assert_eq!(layout.read(&flat), scalars);
        let failed = StepScalars {
            failed: 1.0,
            ..StepScalars::default()
        };
        let flat = layout.write(&failed);
        assert_eq!(flat.len(), 16);
        // A part of another length is refused, not padded or cut.
        assert!(layout.check(&[1.0; 8], Some(&[true; 3])).is_ok());
        assert!(layout.check(&[], None).is_ok());
        let err = layout.check(&[1.0; 7], None).unwrap_err();
        assert!(
            err.to_string()
                .contains("probes held 7 values where the step's layout has 8"),
            "{err}"
        );
        assert!(layout.check(&[], Some(&[true; 4])).is_err());
        let read = layout.read(&flat);
        assert_eq!(
            (read.failed, read.probed, read.covered),
            (1.0, vec![0.0; 8], vec![0.0; 3])
        );
    }
}
