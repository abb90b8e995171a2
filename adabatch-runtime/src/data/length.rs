//! Length-aware batching: examples sorted longest first and cut into batches that
//! grow on shorter inputs, either while a memory model predicts room
//! (`schedule = memory(threshold, max_range)`, the approach of the dynabatch
//! package) or under a padded-token budget.
//!
//! The first batch holds the longest examples at the baseline size: it is the
//! hardest, so an OOM shows at once. Batch order is shuffled per epoch except for
//! the first `keep_first` batches.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::memory::memory_model::{BatchFeatures, MemoryModel};

/// How a length-aware epoch is cut into global batches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthBatching {
    /// Grow from `baseline_size` while `model.predict(batch, baseline) <= threshold`,
    /// up to `baseline_size * max_range`.
    Memory {
        /// Examples in the first (longest) batch: the memory baseline.
        baseline_size: usize,
        /// Largest predicted memory relative to the baseline.
        threshold: f64,
        /// Largest size as a multiple of `baseline_size`.
        max_range: f64,
    },
    /// As many examples as fit in `max_tokens` padded tokens (at least one).
    TokenBudget {
        /// Padded tokens per global batch.
        max_tokens: usize,
    },
    /// Packed documents: the examples in a random order every epoch (not sorted by
    /// length), each global batch as many consecutive examples as fit in
    /// `max_tokens` tokens *summed* (packed rows carry no padding between
    /// documents); an example longer than the budget is a batch of its own. The
    /// plan does not depend on the number of ranks (so that W ranks train what one
    /// does): a batch of fewer documents than ranks leaves some ranks without one
    /// for that step, so a budget should hold many documents.
    PackedTokens {
        /// Tokens (summed example lengths) per global batch.
        max_tokens: usize,
    },
}

/// Rounding and ordering options of length-aware batching.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LengthOptions {
    /// Round sizes down to `2^n` or `3·2^n` (hardware-friendly shapes).
    pub friendly_sizes: bool,
    /// Round sizes down to even numbers.
    pub even_sizes: bool,
    /// Largest growth from one batch to the next, as a fraction of the first
    /// batch's size (`None`: unlimited).
    pub max_growth: Option<f64>,
    /// Batches kept first, in order, when the batch order is shuffled.
    pub keep_first: usize,
    /// Shuffle batch order (and examples within a batch) per epoch.
    pub shuffle: bool,
}

impl Default for LengthOptions {
    fn default() -> Self {
        Self {
            friendly_sizes: false,
            even_sizes: false,
            max_growth: None,
            keep_first: 1,
            shuffle: true,
        }
    }
}

/// One epoch of length-aware batches: the order of examples and the size of each
/// global batch (sizes sum to the number of examples).
#[derive(Debug, Clone, PartialEq)]
pub struct LengthAwareEpoch {
    /// Example indices in the order they are drawn.
    pub order: Vec<usize>,
    /// Global batch sizes, in order.
    pub sizes: Vec<usize>,
    /// Predicted memory of each batch relative to the first (memory mode only).
    pub predicted: Vec<f64>,
}

/// Sorted lengths and prefix sums, computed once per data set.
#[derive(Debug, Clone)]
pub struct LengthIndex {
    sorted: Vec<usize>,
    lengths: Vec<usize>,
    prefix: Vec<usize>,
    /// Lengths by example index (for the unsorted, packed-token epochs).
    by_index: Vec<usize>,
}

impl LengthIndex {
    /// Sorts examples longest first (ties by index, so the result is deterministic).
    pub fn new(lengths: &[usize]) -> Self {
        let mut sorted: Vec<usize> = (0..lengths.len()).collect();
        sorted.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
        let sorted_lengths: Vec<usize> = sorted.iter().map(|&i| lengths[i]).collect();
        let mut prefix = Vec::with_capacity(sorted.len() + 1);
        prefix.push(0);
        let mut total = 0;
        for &len in &sorted_lengths {
            total += len;
            prefix.push(total);
        }
        Self {
            sorted,
            lengths: sorted_lengths,
            prefix,
            by_index: lengths.to_vec(),
        }
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are none.
    #[cfg(feature = "internals")]
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// Features of the sorted examples `start..start + size`.
    pub fn features(&self, start: usize, size: usize) -> BatchFeatures {
        let end = (start + size).min(self.len());
        let max_len = self.lengths.get(start).copied().unwrap_or(0);
        let size = end - start;
        BatchFeatures {
            batch_size: size,
            max_len,
            token_sum: self.prefix[end] - self.prefix[start],
            padded_tokens: size * max_len,
        }
    }

    /// Cuts the sorted examples into batch sizes. `model` is only used in memory mode.
    pub fn batch_sizes(
        &self,
        batching: LengthBatching,
        options: &LengthOptions,
        model: &dyn MemoryModel,
    ) -> (Vec<usize>, Vec<f64>) {
        let n = self.len();
        let mut sizes = Vec::new();
        let mut predicted = Vec::new();
        let mut start = 0;
        let first = match batching {
            LengthBatching::Memory { baseline_size, .. } => baseline_size.max(1),
            LengthBatching::TokenBudget { max_tokens }
            | LengthBatching::PackedTokens { max_tokens } => {
                (max_tokens / self.lengths.first().copied().unwrap_or(1).max(1)).max(1)
            }
        };
        let baseline = self.features(0, first);
        let growth_cap = options
            .max_growth
            .map(|g| ((g * first as f64).ceil() as usize).max(1));
        while start < n {
            let remaining = n - start;
            let mut size = match batching {
                LengthBatching::Memory {
                    baseline_size,
                    threshold,
                    max_range,
                } => {
                    let lo = baseline_size.max(1);
                    let hi = ((lo as f64 * max_range).floor() as usize).max(lo);
                    if start == 0 {
                        lo
                    } else {
                        self.largest_fitting(start, lo, hi, |f| {
                            model.predict(&f, &baseline) <= threshold
                        })
                    }
                }
                LengthBatching::TokenBudget { max_tokens } => {
                    (max_tokens / self.lengths[start].max(1)).max(1)
                }
                LengthBatching::PackedTokens { max_tokens } => {
                    self.largest_fitting(start, 1, n, |f| f.token_sum <= max_tokens)
                }
            };
            if let (Some(cap), Some(&prev)) = (growth_cap, sizes.last()) {
                size = size.min(prev + cap);
            }
            size = round_size(size, options);
            size = size.min(remaining);
            if let LengthBatching::Memory { .. } = batching {
                predicted.push(model.predict(&self.features(start, size), &baseline));
            }
            sizes.push(size);
            start += size;
        }
        (sizes, predicted)
    }

    /// The largest size in `lo..=hi` at `start` that `fits` (assumed monotone:
    /// a batch that fits still fits with fewer examples); `lo` when none does.
    fn largest_fitting(
        &self,
        start: usize,
        lo: usize,
        hi: usize,
        fits: impl Fn(BatchFeatures) -> bool,
    ) -> usize {
        let hi = hi.min(self.len() - start).max(lo);
        if !fits(self.features(start, lo)) {
            return lo;
        }
        let (mut good, mut bad) = (lo, hi + 1);
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if fits(self.features(start, mid)) {
                good = mid;
            } else {
                bad = mid;
            }
        }
        good
    }

    /// One epoch's plan: batch sizes from `batching`, batch order shuffled with
    /// `(seed, epoch)` except the first `keep_first` batches, examples shuffled within
    /// each batch so every rank's slice has a mix of lengths.
    pub fn plan_epoch(
        &self,
        batching: LengthBatching,
        options: &LengthOptions,
        model: &dyn MemoryModel,
        seed: u64,
        epoch: usize,
    ) -> LengthAwareEpoch {
        if let LengthBatching::PackedTokens { max_tokens } = batching {
            return self.packed_token_epoch(max_tokens, options.shuffle, seed, epoch);
        }
        let (sizes, predicted) = self.batch_sizes(batching, options, model);
        let mut batches: Vec<(Vec<usize>, f64)> = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for (k, &size) in sizes.iter().enumerate() {
            batches.push((
                self.sorted[start..start + size].to_vec(),
                predicted.get(k).copied().unwrap_or(f64::NAN),
            ));
            start += size;
        }
        if options.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6c65_6e67_7468);
            rng.set_stream(epoch as u64);
            for (batch, _) in &mut batches {
                batch.shuffle(&mut rng);
            }
            let keep = options.keep_first.min(batches.len());
            batches[keep..].shuffle(&mut rng);
        }
        LengthAwareEpoch {
            sizes: batches.iter().map(|(b, _)| b.len()).collect(),
            predicted: if predicted.is_empty() {
                Vec::new()
            } else {
                batches.iter().map(|(_, p)| *p).collect()
            },
            order: batches.into_iter().flat_map(|(b, _)| b).collect(),
        }
    }
}

impl LengthIndex {
    /// [`LengthBatching::PackedTokens`]' epoch: the examples shuffled with
    /// `(seed, epoch)` (in index order without shuffling), cut where the next
    /// example would take the batch's token sum over `max_tokens`.
    fn packed_token_epoch(
        &self,
        max_tokens: usize,
        shuffle: bool,
        seed: u64,
        epoch: usize,
    ) -> LengthAwareEpoch {
        let mut order: Vec<usize> = (0..self.by_index.len()).collect();
        if shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7061_636b_6564);
            rng.set_stream(epoch as u64);
            order.shuffle(&mut rng);
        }
        let mut sizes = Vec::new();
        let (mut size, mut tokens) = (0usize, 0usize);
        for &i in &order {
            let len = self.by_index[i];
            if size > 0 && tokens + len > max_tokens {
                sizes.push(size);
                (size, tokens) = (0, 0);
            }
            size += 1;
            tokens += len;
        }
        if size > 0 {
            sizes.push(size);
        }
        LengthAwareEpoch {
            order,
            sizes,
            predicted: Vec::new(),
        }
    }
}

/// Largest `2^n` or `3·2^n` not above `size` (at least 1).
pub fn hardware_friendly(size: usize) -> usize {
    if size <= 1 {
        return 1;
    }
    let pow2 = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let three = if size >= 3 {
        3 * (1usize << (usize::BITS - 1 - (size / 3).leading_zeros()))
    } else {
        0
    };
    pow2.max(three)
}

fn round_size(size: usize, options: &LengthOptions) -> usize {
    let mut size = size.max(1);
    if options.friendly_sizes {
        size = hardware_friendly(size);
    }
    if options.even_sizes && size > 1 {
        size -= size % 2;
    }
    size
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::memory_model::PaddedTokens;

    #[test]
    fn friendly_sizes() {
        let got: Vec<usize> = [1, 2, 3, 5, 7, 11, 13, 24, 25, 100]
            .iter()
            .map(|&s| hardware_friendly(s))
            .collect();
        assert_eq!(got, vec![1, 2, 3, 4, 6, 8, 12, 24, 24, 96]);
    }

    #[test]
    fn memory_batches_grow_on_shorter_inputs() {
        // 4 examples of 100 tokens, then 40 of 25: padded tokens allow 4x the size.
        let lengths: Vec<usize> = [100; 4].into_iter().chain([25; 40]).collect();
        let index = LengthIndex::new(&lengths);
        let batching = LengthBatching::Memory {
            baseline_size: 4,
            threshold: 1.0,
            max_range: 8.0,
        };
        let (sizes, predicted) =
            index.batch_sizes(batching, &LengthOptions::default(), &PaddedTokens);
        assert_eq!(sizes, vec![4, 16, 16, 8]);
        assert!(predicted.iter().all(|&p| p <= 1.0));
        let capped = LengthBatching::Memory {
            baseline_size: 4,
            threshold: 1.0,
            max_range: 2.0,
        };
        assert_eq!(
            index
                .batch_sizes(capped, &LengthOptions::default(), &PaddedTokens)
                .0[1],
            8
        );
    }

    #[test]
    fn token_budget_and_rounding() {
        let lengths = vec![10, 9, 5, 5, 5, 5, 5, 3, 3, 3, 3, 3, 3, 3];
        let index = LengthIndex::new(&lengths);
        let (sizes, _) = index.batch_sizes(
            LengthBatching::TokenBudget { max_tokens: 20 },
            &LengthOptions::default(),
            &PaddedTokens,
        );
        assert_eq!(sizes, vec![2, 4, 4, 4]);
        let even = LengthOptions {
            even_sizes: true,
            ..LengthOptions::default()
        };
        let (sizes, _) = index.batch_sizes(
            LengthBatching::TokenBudget { max_tokens: 20 },
            &even,
            &PaddedTokens,
        );
        assert!(sizes[..sizes.len() - 1]
            .iter()
            .all(|s| s % 2 == 0 || *s == 1));
        assert_eq!(sizes.iter().sum::<usize>(), lengths.len());
    }

    #[test]
    fn epoch_plan_keeps_the_hardest_batch_first_and_covers_everything() {
        let lengths: Vec<usize> = (0..200).map(|i| 1 + (i * 37) % 120).collect();
        let index = LengthIndex::new(&lengths);
        let batching = LengthBatching::Memory {
            baseline_size: 8,
            threshold: 0.9,
            max_range: 4.0,
        };
        let plan = index.plan_epoch(batching, &LengthOptions::default(), &PaddedTokens, 1, 0);
        let mut order = plan.order.clone();
        order.sort_unstable();
        assert_eq!(order, (0..200).collect::<Vec<_>>());
        assert_eq!(plan.sizes.iter().sum::<usize>(), 200);
        assert_eq!(plan.sizes[0], 8);
        assert!(plan.order[..8].iter().all(|&i| lengths[i] >= 110));
        let other = index.plan_epoch(batching, &LengthOptions::default(), &PaddedTokens, 1, 1);
        assert_ne!(plan.order, other.order);
        assert_eq!(
            plan.order[..8]
                .iter()
                .collect::<std::collections::BTreeSet<_>>(),
            other.order[..8].iter().collect()
        );
    }

    #[test]
    fn packed_token_epochs_cover_everything_in_a_new_order_within_the_budget() {
        let lengths: Vec<usize> = (0..200).map(|i| 1 + (i * 37) % 50).collect();
        let index = LengthIndex::new(&lengths);
        let batching = LengthBatching::PackedTokens { max_tokens: 120 };
        let options = LengthOptions::default();
        let plan = |epoch| index.plan_epoch(batching, &options, &PaddedTokens, 5, epoch);
        let (a, b) = (plan(0), plan(1));
        for e in [&a, &b] {
            let mut seen = e.order.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..200).collect::<Vec<_>>());
            assert_eq!(e.sizes.iter().sum::<usize>(), 200);
            let mut at = 0;
            for (k, &size) in e.sizes.iter().enumerate() {
                let tokens: usize = e.order[at..at + size].iter().map(|&i| lengths[i]).sum();
                assert!(tokens <= 120, "batch {k}: {tokens} tokens");
                // Full: the next example would not have fitted.
                if let Some(&next) = e.order.get(at + size) {
                    assert!(tokens + lengths[next] > 120);
                }
                at += size;
            }
        }
        assert_ne!(a.order, b.order, "a new order every epoch");
        assert_eq!(a, plan(0), "deterministic");
        // Not sorted by length.
        assert!(a.order.windows(2).any(|w| lengths[w[0]] < lengths[w[1]]));
        // An example over the budget is a batch of its own.
        let big = LengthIndex::new(&[5, 300, 5]);
        let e = big.plan_epoch(
            batching,
            &LengthOptions {
                shuffle: false,
                ..options
            },
            &PaddedTokens,
            0,
            0,
        );
        assert_eq!((e.order, e.sizes), (vec![0, 1, 2], vec![1, 1, 1]));
    }
}
