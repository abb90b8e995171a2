//! The adaptive global-batch sampler and its coverage accounting.
//!
//! Each epoch has one permutation of `0..N` keyed by `(seed, epoch)`, the same on
//! every rank. A step takes the next `per_device * world_size` positions and splits
//! them over ranks as evenly as possible (rank `r` gets `take / W + (r < take % W)`,
//! contiguous slices in rank order). Every rank computes the same plan, so every
//! rank runs the same number of steps.
//!
//! # Cost at scale
//!
//! The permutation is a [`Permutation`]: a keyed Feistel bijection with
//! cycle-walking, evaluated position by position. No epoch's order is ever
//! materialised, so a sampler holds O(1) memory whatever `N` is, and its state is
//! just `(epoch, position, examples seen)` (that is all a resume needs).
//!
//! - [`GlobalBatchSampler::next_step`] computes the whole global batch:
//!   O(global batch) time and memory per step.
//! - [`GlobalBatchSampler::next_local`] computes only one rank's slice of it:
//!   O(local batch) time and memory per step, O(1) for the split itself. Every
//!   rank can plan its own share independently and they agree by construction.
//! - Length-aware epochs ([`GlobalBatchSampler::start_planned_epoch`]) are the
//!   exception: their order follows the data sorted by length, so every rank holds
//!   the epoch's order (8 bytes per example, plus the length index: the data
//!   sorted once per run, O(N log N)) and plans each epoch in O(N).
//!
//! Without shuffle the permutation is the identity.

use std::collections::VecDeque;
use std::ops::Range;

use crate::data::permutation::Permutation;
use crate::data::source_spec::{MixedSources, SourceSpec, SourcesState, StoppingStrategy};
use crate::error::{DataError, Error, Result, SettingsError};

/// The source key of the single-source sampler's permutations (a mixture keys
/// each source's permutations by its own number).
pub const PRIMARY_SOURCE: u64 = 0;

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
    #[cfg(feature = "internals")]
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
    (0..world_size)
        .map(|rank| split_of(take, world_size, rank))
        .collect()
}

/// Rank `rank`'s slice of a global batch of `take` examples split over
/// `world_size` ranks (one element of [`split_evenly`], in O(1)).
pub fn split_of(take: usize, world_size: usize, rank: usize) -> Range<usize> {
    if world_size == 0 {
        return 0..0;
    }
    let (base, extra) = (take / world_size, take % world_size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// One rank's share of one global batch, computed without the other ranks' shares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg(any(test, feature = "internals"))]
pub struct LocalBatch {
    /// The rank this share belongs to.
    pub rank: usize,
    /// Ranks the global batch is split over.
    pub world_size: usize,
    /// Position in the epoch's permutation of the global batch's first example.
    pub start: usize,
    /// Examples in the global batch.
    pub global_size: usize,
    /// This rank's slice of the global batch ([`split_of`]).
    pub split: Range<usize>,
    /// Dataset indices this rank trains on (possibly none).
    pub indices: Vec<usize>,
}

#[cfg(any(test, feature = "internals"))]
impl LocalBatch {
    /// Local batch size of every rank (O(W)).
    pub fn local_sizes(&self) -> Vec<usize> {
        (0..self.world_size)
            .map(|r| split_of(self.global_size, self.world_size, r).len())
            .collect()
    }
}

/// Where an epoch's order comes from.
/// A length-aware epoch left unfinished by a checkpoint: what resuming it needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlannedRemainder {
    /// The epoch's order (dataset indices).
    pub order: Vec<usize>,
    /// Sizes of the batches still to draw, with their predicted memory relative to
    /// the epoch's first batch (where there was a prediction).
    pub batches: Vec<(usize, Option<f64>)>,
}

impl PlannedRemainder {
    /// Whether it can continue an epoch of `num_examples` at `position`: the order
    /// a permutation of the dataset, the remaining batches covering the rest.
    pub fn check(&self, num_examples: usize, position: usize) -> std::result::Result<(), String> {
        let mut seen = vec![false; num_examples];
        let permutation = self.order.len() == num_examples
            && self
                .order
                .iter()
                .all(|&i| i < num_examples && !std::mem::replace(&mut seen[i], true));
        if !permutation {
            return Err(format!(
                "the planned epoch's order is not a permutation of the {num_examples} examples"
            ));
        }
        let rest: usize = self.batches.iter().map(|b| b.0).sum();
        if position > num_examples
            || rest != num_examples - position
            || self.batches.iter().any(|b| b.0 == 0)
        {
            return Err(format!(
                "the planned epoch's remaining batches hold {rest} examples; {} are left after position {position}",
                num_examples.saturating_sub(position)
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Order {
    /// The keyed permutation (or the identity): O(1) memory.
    Keyed(Permutation),
    /// A length-aware plan's order, held whole (shared: a planner is copied to
    /// look ahead for prefetching).
    Planned(std::sync::Arc<[usize]>),
}

impl Order {
    #[inline]
    #[cfg(any(test, feature = "internals"))]
    fn at(&self, position: usize) -> usize {
        match self {
            Order::Keyed(p) => p.at(position),
            Order::Planned(order) => order[position],
        }
    }

    fn range(&self, positions: Range<usize>) -> Vec<usize> {
        match self {
            Order::Keyed(p) => p.range(positions).collect(),
            Order::Planned(order) => order[positions].to_vec(),
        }
    }
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
    order: Order,
    position: usize,
    examples_seen: usize,
    /// Length-aware epochs: the remaining global batch sizes (and predicted memory)
    /// of the current epoch, which replace `per_device * world_size`.
    planned: Option<VecDeque<(usize, f64)>>,
    last_predicted: Option<f64>,
    /// Several sources: `num_examples` is the primary source's size, and draws
    /// come from here. With the state before each recent draw, for `rewind`.
    mixed: Option<MixedSources>,
    mixed_history: VecDeque<(MixedSources, usize)>,
}

/// Draws a rewind can undo: more than the micro-batches of any one step.
const MIXED_HISTORY: usize = 256;

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
            return Err(Error::Data(DataError::EmptyDataset));
        }
        if world_size == 0 {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "world_size",
                value: "0".into(),
                expected: "a sampler needs at least one rank",
            }));
        }
        let mut sampler = Self {
            num_examples,
            world_size,
            seed,
            shuffle,
            drop_last,
            epoch: 0,
            order: Order::Keyed(Permutation::identity(num_examples)),
            position: 0,
            examples_seen: 0,
            planned: None,
            last_predicted: None,
            mixed: None,
            mixed_history: VecDeque::new(),
        };
        sampler.order = Order::Keyed(sampler.permutation(0));
        Ok(sampler)
    }

    /// A sampler over several sources: epochs are passes over the first (primary)
    /// source; each global batch is divided between the sources by their weights
    /// (see [`crate::data::source_spec`]). Indices are the dataset's (sources in order).
    pub fn over_sources(
        spec: &SourceSpec,
        world_size: usize,
        seed: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> Result<Self> {
        let mixed = MixedSources::new(spec, seed, shuffle)?;
        let mut sampler = Self::new(spec.sizes[0], world_size, seed, shuffle, drop_last)?;
        sampler.mixed = Some(mixed);
        Ok(sampler)
    }

    /// The sources, when there are several.
    pub fn sources(&self) -> Option<&MixedSources> {
        self.mixed.as_ref()
    }

    /// The sources, to change their weights.
    pub fn sources_mut(&mut self) -> Option<&mut MixedSources> {
        self.mixed.as_mut()
    }

    /// The sources' state, for a checkpoint.
    pub fn sources_state(&self) -> Option<SourcesState> {
        self.mixed.as_ref().map(MixedSources::state)
    }

    /// Continues the sources from a checkpoint's state (checked beforehand).
    pub fn restore_sources(&mut self, state: &SourcesState) {
        if let Some(mixed) = &mut self.mixed {
            mixed.restore(state);
            self.mixed_history.clear();
        }
    }

    /// The permutation of epoch `epoch` (identity without shuffle), in O(1) memory.
    pub fn permutation(&self, epoch: usize) -> Permutation {
        if self.shuffle {
            Permutation::new(self.num_examples, self.seed, PRIMARY_SOURCE, epoch as u64)
        } else {
            Permutation::identity(self.num_examples)
        }
    }

    /// The permutation of epoch `epoch` as a vector: O(N) time and memory, for
    /// tests and small data sets; the sampler itself never builds it.
    #[cfg(any(test, feature = "internals"))]
    pub fn permutation_of(&self, epoch: usize) -> Vec<usize> {
        self.permutation(epoch).to_vec()
    }

    /// The dataset index at `position` of the current epoch's order.
    #[cfg(any(test, feature = "internals"))]
    pub fn index_at(&self, position: usize) -> usize {
        self.order.at(position)
    }

    /// The next global batch of `per_device` examples per rank in the current epoch,
    /// or `None` when the epoch is used up (or cut by `drop_last`).
    /// O(global batch) time and memory.
    #[cfg(any(test, feature = "internals"))]
    pub fn next_step(&mut self, per_device: usize) -> Option<GlobalBatch> {
        self.next_global(per_device.saturating_mul(self.world_size))
    }

    /// The next global batch of `wanted` examples (split over this sampler's ranks
    /// as evenly as possible), or `None` when the epoch is used up (or cut by
    /// `drop_last`). A run resumed on another number of ranks keeps its global
    /// sizes this way.
    pub fn next_global(&mut self, wanted: usize) -> Option<GlobalBatch> {
        if self.mixed.is_some() {
            // The weights were checked when the sources were made or restored.
            return self
                .next_mixed(|mixed, drop_last| mixed.draw(wanted, drop_last).ok().flatten());
        }
        let take = self.next_take(wanted)?;
        let indices = self.order.range(self.position..self.position + take);
        self.advance(take);
        Some(GlobalBatch {
            indices,
            splits: split_evenly(take, self.world_size),
        })
    }

    /// The next global batch of a mixed run sized in tokens: as many examples as
    /// fit in `max_tokens` tokens summed (see [`MixedSources::draw_tokens`]);
    /// `None` when the epoch is used up or the sampler has one source.
    pub fn next_global_tokens(
        &mut self,
        max_tokens: usize,
        lengths: &[usize],
    ) -> Option<GlobalBatch> {
        self.mixed.as_ref()?;
        self.next_mixed(|mixed, drop_last| {
            mixed
                .draw_tokens(max_tokens, lengths, drop_last)
                .ok()
                .flatten()
        })
    }

    /// A mixed draw (`draw` on the sources), remembered for [`Self::rewind`].
    fn next_mixed(
        &mut self,
        draw: impl FnOnce(&mut MixedSources, bool) -> Option<Vec<usize>>,
    ) -> Option<GlobalBatch> {
        let mixed = self.mixed.as_mut()?;
        let before = mixed.clone();
        let indices = draw(mixed, self.drop_last)?;
        let take = indices.len();
        if self.mixed_history.len() == MIXED_HISTORY {
            self.mixed_history.pop_front();
        }
        self.mixed_history.push_back((before, take));
        self.position = mixed.epoch_position(self.num_examples);
        self.examples_seen += take;
        Some(GlobalBatch {
            indices,
            splits: split_evenly(take, self.world_size),
        })
    }

    /// Like [`GlobalBatchSampler::next_step`] (the sampler advances by the whole
    /// global batch), but computes only rank `rank`'s share of it: O(local batch)
    /// time and memory. Every rank calling this with the same sizes gets the
    /// contiguous slices, in rank order, of the global batch `next_step` would give.
    /// One source only: with several, use [`GlobalBatchSampler::next_global`].
    #[cfg(any(test, feature = "internals"))]
    pub fn next_local(&mut self, per_device: usize, rank: usize) -> Option<LocalBatch> {
        debug_assert!(rank < self.world_size, "rank out of range");
        debug_assert!(self.mixed.is_none(), "next_local draws from one source");
        let take = self.next_take(per_device.saturating_mul(self.world_size))?;
        let start = self.position;
        let split = split_of(take, self.world_size, rank);
        let indices = self.order.range(start + split.start..start + split.end);
        self.advance(take);
        Some(LocalBatch {
            rank,
            world_size: self.world_size,
            start,
            global_size: take,
            split,
            indices,
        })
    }

    /// Size of the next global batch of `wanted` examples (or the next planned
    /// size), `None` at the end of the epoch.
    /// Whether the current epoch has a global batch of `wanted` examples left to
    /// give (what [`GlobalBatchSampler::next_global`] would draw, without drawing).
    pub fn can_draw(&self, wanted: usize) -> bool {
        if let Some(mixed) = &self.mixed {
            return matches!(mixed.clone().draw(wanted, self.drop_last), Ok(Some(_)));
        }
        let remaining = self.num_examples - self.position;
        match &self.planned {
            Some(planned) => remaining > 0 && !planned.is_empty(),
            None => remaining > 0 && wanted > 0 && !(self.drop_last && remaining < wanted),
        }
    }

    fn next_take(&mut self, wanted: usize) -> Option<usize> {
        let remaining = self.num_examples - self.position;
        let take = if let Some(planned) = &mut self.planned {
            let (take, predicted) = planned.pop_front()?;
            self.last_predicted = predicted.is_finite().then_some(predicted);
            take.min(remaining)
        } else {
            if remaining == 0 || wanted == 0 || (self.drop_last && remaining < wanted) {
                return None;
            }
            wanted.min(remaining)
        };
        (take > 0).then_some(take)
    }

    fn advance(&mut self, take: usize) {
        self.position += take;
        self.examples_seen += take;
    }

    /// Returns the last `examples` drawn in this epoch to the sampler.
    pub fn rewind(&mut self, examples: usize) {
        if self.mixed.is_some() {
            let mut left = examples;
            while left > 0 {
                let Some((before, take)) = self.mixed_history.pop_back() else {
                    break;
                };
                self.examples_seen -= take;
                left = left.saturating_sub(take);
                self.position = before.epoch_position(self.num_examples);
                self.mixed = Some(before);
            }
            return;
        }
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
        self.order = Order::Planned(order.into());
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
        self.order = Order::Keyed(self.permutation(epoch));
        self.position = position.min(self.num_examples);
        self.examples_seen = examples_seen;
        self.planned = None;
        self.last_predicted = None;
    }

    /// The unfinished part of a length-aware epoch, to checkpoint: its whole order
    /// and the sizes (with predicted memory) of its remaining batches. `None` when
    /// the epoch is not planned, or has not started, or is used up.
    pub fn planned_remainder(&self) -> Option<PlannedRemainder> {
        let (Order::Planned(order), Some(planned)) = (&self.order, &self.planned) else {
            return None;
        };
        (self.position > 0 && self.position < self.num_examples).then(|| PlannedRemainder {
            order: order.to_vec(),
            batches: planned
                .iter()
                .map(|&(size, predicted)| (size, predicted.is_finite().then_some(predicted)))
                .collect(),
        })
    }

    /// Continues a length-aware epoch from a checkpoint's [`PlannedRemainder`]
    /// (after [`GlobalBatchSampler::restore`] has set the position; the remainder
    /// passed [`PlannedRemainder::check`]).
    pub fn resume_planned_epoch(&mut self, remainder: &PlannedRemainder) {
        debug_assert!(remainder.check(self.num_examples, self.position).is_ok());
        self.order = Order::Planned(remainder.order.as_slice().into());
        self.planned = Some(
            remainder
                .batches
                .iter()
                .map(|&(size, predicted)| (size, predicted.unwrap_or(f64::NAN)))
                .collect(),
        );
    }

    /// Starts the next epoch with its own permutation.
    pub fn start_next_epoch(&mut self) {
        if let Some(mixed) = &mut self.mixed {
            mixed.start_next_epoch();
        }
        self.epoch += 1;
        self.position = 0;
        self.planned = None;
        self.last_predicted = None;
        self.order = Order::Keyed(self.permutation(self.epoch));
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
    /// Examples used in total / N (with several sources: the primary source's
    /// examples used / its size; under `first_exhausted` / `all_exhausted`, epochs
    /// done plus the current one's progress).
    pub fn epoch(&self) -> f64 {
        match &self.mixed {
            Some(mixed) if mixed.spec().stopping == StoppingStrategy::Primary => {
                mixed.cursors()[0].seen as f64 / self.num_examples as f64
            }
            Some(mixed) => self.epoch as f64 + mixed.epoch_progress(),
            None => self.examples_seen as f64 / self.num_examples as f64,
        }
    }
    /// Examples used in total.
    pub fn examples_seen(&self) -> usize {
        self.examples_seen
    }
    /// N.
    pub fn num_examples(&self) -> usize {
        self.num_examples
    }

    /// The ranks the batches are split over.
    pub fn world_size(&self) -> usize {
        self.world_size
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
        assert!(split_evenly(6, 0).is_empty());
        for (take, world) in [(0, 3), (7, 3), (4096, 4096), (5000, 4096), (3, 4096)] {
            let splits = split_evenly(take, world);
            assert_eq!(splits.first().map(|r| r.start), Some(0));
            assert_eq!(splits.last().map(|r| r.end), Some(take));
            assert!(splits.windows(2).all(|w| w[0].end == w[1].start));
        }
    }

    #[test]
    fn local_slices_are_the_global_batch_in_rank_order() {
        let mut global = GlobalBatchSampler::new(23, 4, 9, true, false).unwrap();
        let mut ranks: Vec<_> = (0..4)
            .map(|_| GlobalBatchSampler::new(23, 4, 9, true, false).unwrap())
            .collect();
        for per_device in [1, 3, 2, 5, 5] {
            let batch = global.next_step(per_device);
            let locals: Vec<_> = ranks
                .iter_mut()
                .enumerate()
                .map(|(rank, s)| s.next_local(per_device, rank))
                .collect();
            let Some(batch) = batch else {
                assert!(locals.iter().all(Option::is_none));
                break;
            };
            let locals: Vec<LocalBatch> = locals.into_iter().map(Option::unwrap).collect();
            assert_eq!(locals[0].local_sizes(), batch.local_sizes());
            let joined: Vec<usize> = locals.iter().flat_map(|l| l.indices.clone()).collect();
            assert_eq!(joined, batch.indices);
        }
        assert_eq!(global.position(), 23);
        assert!(ranks.iter().all(|s| s.position() == 23));
    }

    #[test]
    fn rewind_draws_the_same_positions_again() {
        let mut s = GlobalBatchSampler::new(100, 2, 5, true, false).unwrap();
        s.next_step(3).unwrap();
        let first = s.next_local(4, 0).unwrap();
        assert_eq!(
            (first.start, first.global_size, first.split.clone()),
            (6, 8, 0..4)
        );
        s.rewind(first.global_size);
        assert_eq!(s.position(), 6);
        let again = s.next_local(2, 0).unwrap();
        assert_eq!(again.start, first.start);
        assert_eq!(again.indices, first.indices[..2]);
        assert_eq!(s.index_at(again.start + 2), first.indices[2]);
    }

    #[test]
    fn without_shuffle_the_order_is_the_identity() {
        let mut s = GlobalBatchSampler::new(9, 2, 5, false, false).unwrap();
        assert_eq!(s.next_step(2).unwrap().indices, vec![0, 1, 2, 3]);
        s.start_next_epoch();
        assert_eq!(s.next_local(2, 1).unwrap().indices, vec![2, 3]);
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
