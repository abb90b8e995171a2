//! The adaptive global-batch sampler and its coverage accounting.
//!
//! Each epoch draws one permutation of `0..N` from `(seed, epoch)`, the same on
//! every rank. A step takes the next `per_device * world_size` indices and splits
//! them over ranks as evenly as possible (rank `r` gets `take / W + (r < take % W)`).
//! Every rank computes the same plan, so every rank runs the same number of steps.

use std::collections::VecDeque;
use std::ops::Range;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// One optimisation step's global batch and its split over ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalBatch {
    /// Dataset indices of the global batch, in permutation order.
    pub indices: Vec<usize>,
    /// Each rank's slice of `indices`.
    pub splits: Vec<Range<usize>>,
}

impl GlobalBatch {
    /// Indices that rank `rank` trains on (possibly none).
    pub fn local(&self, rank: usize) -> &[usize] {
        &self.indices[self.splits[rank].clone()]
    }
    /// Local batch size of every rank.
    pub fn local_sizes(&self) -> Vec<usize> {
        self.splits.iter().map(|r| r.len()).collect()
    }
    /// Indices of every rank.
    pub fn per_rank_indices(&self) -> Vec<Vec<usize>> {
        (0..self.splits.len())
            .map(|r| self.local(r).to_vec())
            .collect()
    }
    /// Examples in the global batch.
    pub fn global_size(&self) -> usize {
        self.indices.len()
    }
    /// Ranks that received at least one example.
    pub fn active_ranks(&self) -> usize {
        self.splits.iter().filter(|r| !r.is_empty()).count()
    }
}

/// Splits `take` examples over `world_size` ranks: the first `take % W` ranks get one more.
/// No ranks, no slices.
pub fn split_evenly(take: usize, world_size: usize) -> Vec<Range<usize>> {
    if world_size == 0 {
        return Vec::new();
    }
    let (base, extra) = (take / world_size, take % world_size);
    let mut start = 0;
    (0..world_size)
        .map(|rank| {
            let len = base + usize::from(rank < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// Draws global batches epoch by epoch and tracks coverage.
#[derive(Debug, Clone)]
pub struct GlobalBatchSampler {
    num_examples: usize,
    world_size: usize,
    seed: u64,
    shuffle: bool,
    drop_last: bool,
    epoch: usize,
    permutation: Vec<usize>,
    position: usize,
    examples_seen: usize,
    /// Length-aware epochs: the remaining global batch sizes (and predicted memory)
    /// of the current epoch, which replace `per_device * world_size`.
    planned: Option<VecDeque<(usize, f64)>>,
    last_predicted: Option<f64>,
}

impl GlobalBatchSampler {
    /// A sampler positioned at the start of epoch 0; an empty dataset or zero ranks
    /// is a typed error.
    pub fn new(
        num_examples: usize,
        world_size: usize,
        seed: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> Result<Self> {
        if num_examples == 0 {
            return Err(Error::EmptyDataset);
        }
        if world_size == 0 {
            return Err(Error::InvalidSetting {
                name: "world_size",
                value: "0".into(),
                expected: "a sampler needs at least one rank",
            });
        }
        let mut sampler = Self {
            num_examples,
            world_size,
            seed,
            shuffle,
            drop_last,
            epoch: 0,
            permutation: Vec::new(),
            position: 0,
            examples_seen: 0,
            planned: None,
            last_predicted: None,
        };
        sampler.permutation = sampler.permutation_of(0);
        Ok(sampler)
    }

    /// The permutation of epoch `epoch` (identity without shuffle).
    pub fn permutation_of(&self, epoch: usize) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..self.num_examples).collect();
        if self.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
            rng.set_stream(epoch as u64);
            perm.shuffle(&mut rng);
        }
        perm
    }

    /// The next global batch of `per_device` examples per rank in the current epoch,
    /// or `None` when the epoch is used up (or cut by `drop_last`).
    pub fn next_step(&mut self, per_device: usize) -> Option<GlobalBatch> {
        let remaining = self.num_examples - self.position;
        if let Some(planned) = &mut self.planned {
            let (take, predicted) = planned.pop_front()?;
            let take = take.min(remaining);
            self.last_predicted = predicted.is_finite().then_some(predicted);
            return self.take(take);
        }
        let wanted = per_device.saturating_mul(self.world_size);
        if remaining == 0 || wanted == 0 || (self.drop_last && remaining < wanted) {
            return None;
        }
        self.take(wanted.min(remaining))
    }

    fn take(&mut self, take: usize) -> Option<GlobalBatch> {
        if take == 0 {
            return None;
        }
        let indices = self.permutation[self.position..self.position + take].to_vec();
        self.position += take;
        self.examples_seen += take;
        Some(GlobalBatch {
            indices,
            splits: split_evenly(take, self.world_size),
        })
    }

    /// Returns the last `examples` drawn in this epoch to the sampler.
    pub fn rewind(&mut self, examples: usize) {
        let examples = examples.min(self.position);
        self.position -= examples;
        self.examples_seen -= examples;
        if let Some(planned) = &mut self.planned {
            planned.push_front((examples, self.last_predicted.unwrap_or(f64::NAN)));
        }
    }

    /// Replaces the current epoch (not yet started) with a length-aware plan:
    /// `order` is a permutation of `0..N`, `sizes` the global batch sizes.
    pub fn start_planned_epoch(&mut self, order: Vec<usize>, sizes: &[usize], predicted: &[f64]) {
        debug_assert_eq!(self.position, 0);
        debug_assert_eq!(order.len(), self.num_examples);
        self.permutation = order;
        let predicted = predicted.iter().copied().chain(std::iter::repeat(f64::NAN));
        self.planned = Some(sizes.iter().copied().zip(predicted).collect());
    }

    /// Whether the current epoch follows a length-aware plan.
    pub fn is_planned(&self) -> bool {
        self.planned.is_some()
    }

    /// Splits the next planned batch in two (for `oom = halve`); `false` when it
    /// holds a single example.
    pub fn split_next_planned(&mut self) -> bool {
        let Some(planned) = &mut self.planned else {
            return false;
        };
        match planned.pop_front() {
            Some((size, predicted)) if size >= 2 => {
                planned.push_front((size / 2, predicted / 2.0));
                planned.push_front((size - size / 2, predicted / 2.0));
                true
            }
            Some(front) => {
                planned.push_front(front);
                false
            }
            None => false,
        }
    }

    /// Predicted memory of the last planned batch, relative to the epoch's first.
    pub fn last_predicted(&self) -> Option<f64> {
        self.last_predicted
    }

    /// Moves to `position` examples into epoch `epoch` (for resuming a checkpoint).
    pub fn restore(&mut self, epoch: usize, position: usize, examples_seen: usize) {
        self.epoch = epoch;
        self.permutation = self.permutation_of(epoch);
        self.position = position.min(self.num_examples);
        self.examples_seen = examples_seen;
        self.planned = None;
        self.last_predicted = None;
    }

    /// Starts the next epoch with its own permutation.
    pub fn start_next_epoch(&mut self) {
        self.epoch += 1;
        self.position = 0;
        self.planned = None;
        self.last_predicted = None;
        self.permutation = self.permutation_of(self.epoch);
    }

    /// Current epoch (0-based).
    pub fn epoch_index(&self) -> usize {
        self.epoch
    }
    /// Examples used in the current epoch.
    pub fn position(&self) -> usize {
        self.position
    }
    /// Examples used in the current epoch / N.
    pub fn train_coverage(&self) -> f64 {
        self.position as f64 / self.num_examples as f64
    }
    /// Examples used in total / N.
    pub fn epoch(&self) -> f64 {
        self.examples_seen as f64 / self.num_examples as f64
    }
    /// Examples used in total.
    pub fn examples_seen(&self) -> usize {
        self.examples_seen
    }
    /// N.
    pub fn num_examples(&self) -> usize {
        self.num_examples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_gives_extra_to_first_ranks() {
        assert_eq!(split_evenly(5, 2), vec![0..3, 3..5]);
        assert_eq!(split_evenly(1, 3), vec![0..1, 1..1, 1..1]);
        assert_eq!(split_evenly(6, 3), vec![0..2, 2..4, 4..6]);
    }

    #[test]
    fn permutation_depends_on_seed_and_epoch_only() {
        let a = GlobalBatchSampler::new(50, 2, 1, true, false).unwrap();
        let b = GlobalBatchSampler::new(50, 4, 1, true, true).unwrap();
        assert_eq!(a.permutation_of(3), b.permutation_of(3));
        assert_ne!(a.permutation_of(0), a.permutation_of(1));
        let c = GlobalBatchSampler::new(50, 2, 2, true, false).unwrap();
        assert_ne!(a.permutation_of(0), c.permutation_of(0));
        let mut sorted = a.permutation_of(0);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn drop_last_cuts_short_tail() {
        let mut s = GlobalBatchSampler::new(10, 2, 0, false, true).unwrap();
        assert_eq!(s.next_step(2).unwrap().global_size(), 4);
        assert_eq!(s.next_step(2).unwrap().global_size(), 4);
        assert!(s.next_step(2).is_none());
        assert_eq!(s.position(), 8);
        assert!((s.epoch() - 0.8).abs() < 1e-12);
    }

    #[test]
    fn keep_last_uses_short_tail() {
        let mut s = GlobalBatchSampler::new(5, 2, 0, false, false).unwrap();
        s.next_step(2).unwrap();
        let tail = s.next_step(2).unwrap();
        assert_eq!(tail.local_sizes(), vec![1, 0]);
        assert_eq!(tail.indices, vec![4]);
        assert!(s.next_step(2).is_none());
        assert_eq!(s.train_coverage(), 1.0);
    }
}
