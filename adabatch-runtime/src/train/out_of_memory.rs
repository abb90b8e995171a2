//! Out-of-memory handling: recognising OOM errors, and a fault-injection hook that
//! produces them on CPU for tests and demos.

use std::collections::BTreeSet;

use crate::error::{DistributedError, Error, Result, TrainingError};

/// Whether an error is the device running out of memory (candle surfaces CUDA's
/// `CUDA_ERROR_OUT_OF_MEMORY` and allocator failures as messages).
pub fn is_out_of_memory(error: &Error) -> bool {
    match error {
        Error::Training(TrainingError::OutOfMemory { .. }) => true,
        Error::Candle(e) => names_out_of_memory(&e.to_string()),
        Error::OnRank { source, .. } => is_out_of_memory(source),
        // Packing buffers of a collective can run out too.
        Error::Distributed(DistributedError::Library { detail, source, .. }) => {
            names_out_of_memory(detail)
                || source
                    .as_ref()
                    .is_some_and(|cause| names_out_of_memory(&cause.to_string()))
        }
        Error::Distributed(DistributedError::CollectiveInput { detail }) => {
            names_out_of_memory(detail)
        }
        _ => false,
    }
}

/// CUDA's, cuBLAS's and cuRAND's ways of saying so.
fn names_out_of_memory(message: &str) -> bool {
    let msg = message.to_lowercase();
    [
        "out of memory",
        "out_of_memory",
        "alloc_failed",
        "allocation_failed",
    ]
    .iter()
    .any(|needle| msg.contains(needle))
}

/// Injects out-of-memory errors into forward passes, so every OOM policy can be
/// exercised without a GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultInjector {
    at_steps: BTreeSet<usize>,
    above_local_batch: Option<usize>,
}

impl FaultInjector {
    /// No faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// The first attempt of each listed step runs out of memory on exactly one
    /// rank: rank `step % k`, where `k` is the number of ranks that have examples in
    /// that step (ranks `0..k`, as the even split fills the lowest ranks first). So
    /// every listed step that the run reaches fires exactly once, even at an epoch's
    /// short tail, and the other ranks must agree through the communicator before
    /// anyone steps.
    pub fn at_steps(steps: impl IntoIterator<Item = usize>) -> Self {
        Self {
            at_steps: steps.into_iter().collect(),
            above_local_batch: None,
        }
    }

    /// Every forward pass over more than `examples` examples on one rank runs out of
    /// memory, with the error candle returns on CUDA: a simple memory law for
    /// `halve` and `split_retry`.
    #[cfg(any(test, feature = "internals"))]
    pub fn above_local_batch(mut self, examples: usize) -> Self {
        self.above_local_batch = Some(examples);
        self
    }

    /// Also fails the first attempt of each of `steps`.
    pub fn and_steps(mut self, steps: impl IntoIterator<Item = usize>) -> Self {
        self.at_steps.extend(steps);
        self
    }

    /// The listed steps not yet fired.
    pub fn steps(&self) -> impl Iterator<Item = usize> + '_ {
        self.at_steps.iter().copied()
    }

    /// Whether nothing will ever be injected.
    #[cfg(feature = "internals")]
    pub fn is_empty(&self) -> bool {
        self.at_steps.is_empty() && self.above_local_batch.is_none()
    }

    /// Called before each forward pass of `examples` examples; `active_ranks` is the
    /// number of ranks with examples in this step.
    pub(crate) fn check(
        &mut self,
        step: usize,
        rank: usize,
        active_ranks: usize,
        examples: usize,
    ) -> Result<(), Error> {
        if step % active_ranks.max(1) == rank && self.at_steps.remove(&step) {
            return Err(Error::Training(TrainingError::OutOfMemory {
                step,
                detail: format!("injected on rank {rank}"),
                source: None,
            }));
        }
        match self.above_local_batch {
            // What candle returns when a CUDA allocation fails, so that the memory
            // law takes the path a real device's OOM takes.
            Some(limit) if examples > limit => {
                Err(Error::Candle(candle_core::Error::Msg(format!(
                    "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\") (injected: \
                     {examples} examples exceed the limit of {limit} on rank {rank})"
                ))))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_steps_fire_once_on_one_rank() {
        let mut rank0 = FaultInjector::at_steps([2, 3]);
        let mut rank1 = rank0.clone();
        assert!(rank0.check(2, 0, 2, 4).is_err());
        assert!(rank0.check(2, 0, 2, 4).is_ok(), "fires once");
        assert!(rank1.check(2, 1, 2, 4).is_ok(), "step 2 belongs to rank 0");
        assert!(rank1.check(3, 1, 2, 4).is_err());
    }

    #[test]
    fn listed_steps_hit_a_rank_that_has_examples() {
        // Step 3 of a short epoch tail where only rank 0 has examples: 3 % 1 == 0.
        let mut rank0 = FaultInjector::at_steps([3]);
        assert!(rank0.check(3, 0, 1, 1).is_err());
        // With three active ranks of four, step 5 hits rank 5 % 3 == 2.
        let mut rank2 = FaultInjector::at_steps([5]);
        let mut rank1 = rank2.clone();
        assert!(rank1.check(5, 1, 3, 2).is_ok());
        assert!(rank2.check(5, 2, 3, 2).is_err());
    }

    #[test]
    fn memory_law_fires_above_the_limit() {
        let mut f = FaultInjector::none().above_local_batch(3);
        assert!(f.check(1, 0, 1, 3).is_ok());
        assert!(is_out_of_memory(&f.check(1, 0, 1, 4).unwrap_err()));
        let cuda = Error::Candle(candle_core::Error::Msg(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
        ));
        assert!(is_out_of_memory(&cuda));
        let on_rank = Error::OnRank {
            rank: 1,
            step: 2,
            source: Box::new(cuda),
        };
        assert!(is_out_of_memory(&on_rank));
        for text in [
            "CUBLAS_STATUS_ALLOC_FAILED",
            "CURAND_STATUS_ALLOCATION_FAILED",
        ] {
            assert!(is_out_of_memory(&Error::Candle(candle_core::Error::Msg(
                text.into()
            ))));
        }
        assert!(is_out_of_memory(&Error::Distributed(
            DistributedError::Library {
                library: "CUDA",
                call: "packing".into(),
                detail: "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
                source: None,
            }
        )));
        assert!(!is_out_of_memory(&Error::Distributed(
            DistributedError::PeersTimedOut {
                collective: "all_reduce".into(),
                rank: 0,
                waited: std::time::Duration::from_secs(1),
            }
        )));
    }
}
