//! Several named sources in one run (`user::sources::Sources`): each step's global
//! batch divided into per-source counts by the deficit allocator of
//! [`crate::data::mixture`], each source drawn from its own permutation per
//! *source epoch*, keyed by `(seed, source, epoch)`.
//!
//! The first source is the primary: the run's epochs are passes over it, and its
//! epoch end shortens the last global batch (or, with `drop_last`, drops the tail).
//! Every other source starts its next epoch when it runs out, within a step if need
//! be, so a small replay memory cycles. Every rank computes the same draws from the
//! same state; the state is a few numbers per source, checkpointed whole.

pub use crate::adapt::mixer::MixUnit;
pub use crate::config::policy::StoppingStrategy;
use crate::data::mixture::Mixture;
use crate::data::permutation::Permutation;
use crate::error::{DataError, Error, Result};

/// Keys of the sources' permutations start here (the single-source sampler's is 0).
const SOURCE_KEY_BASE: u64 = 1 << 32;

/// What a dataset of several sources declares: names, sizes and mixing weights, in
/// source order (the first is the primary), and when its epochs end.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSpec {
    /// Source names, unique.
    pub names: Vec<String>,
    /// Examples per source (each at least 1); a source's examples follow the
    /// previous source's in the dataset's indices.
    pub sizes: Vec<usize>,
    /// Mixing weights (finite, >= 0, not all 0; normalised when used).
    pub weights: Vec<f64>,
    /// When an epoch ends.
    pub stopping: StoppingStrategy,
    /// What the weights are shares of: examples, or tokens.
    pub unit: MixUnit,
    /// Each source's tokens (the sum of its examples' `Dataset::example_len`).
    pub tokens: Vec<u64>,
}

impl SourceSpec {
    /// The weights of the deficit allocator, which counts examples: `weights`
    /// (in [`SourceSpec::unit`]) over each source's mean example length under
    /// [`MixUnit::Tokens`].
    pub fn example_weights(&self, weights: &[f64]) -> Vec<f64> {
        match self.unit {
            MixUnit::Examples => weights.to_vec(),
            MixUnit::Tokens => weights
                .iter()
                .zip(self.sizes.iter().zip(&self.tokens))
                .map(|(w, (&size, &tokens))| w * size as f64 / tokens.max(1) as f64)
                .collect(),
        }
    }

    /// The source of dataset index `index`, and its index within the source.
    pub fn locate(&self, index: usize) -> (usize, usize) {
        let mut start = 0;
        for (s, &size) in self.sizes.iter().enumerate() {
            if index < start + size {
                return (s, index - start);
            }
            start += size;
        }
        (self.sizes.len(), index - start)
    }

    /// The dataset index of source `source`'s example `local`.
    pub fn offset(&self, source: usize) -> usize {
        self.sizes[..source].iter().sum()
    }

    /// The same sources with other weights, by name (`name = w`); sources left out
    /// get 0.
    pub fn reweighted(&self, weights: &[(String, f64)]) -> Result<Self> {
        let mut out = vec![0.0; self.names.len()];
        for (name, w) in weights {
            let Some(s) = self.names.iter().position(|n| n == name) else {
                return Err(Error::Data(DataError::UnknownSource {
                    name: name.clone(),
                    known: self.names.clone(),
                }));
            };
            out[s] = *w;
        }
        check_weights(0, &out)?;
        Ok(Self {
            weights: out,
            ..self.clone()
        })
    }
}

/// Finite, >= 0, not all 0.
pub(crate) fn check_weights(step: usize, weights: &[f64]) -> Result<()> {
    match weights_problem(weights) {
        Some(reason) => Err(Error::Data(DataError::InvalidMixWeights { step, reason })),
        None => Ok(()),
    }
}

/// What makes `weights` unusable as a mixture, if anything (the rule of
/// `adabatch_rules::mixer::weights`).
fn weights_problem(weights: &[f64]) -> Option<String> {
    adabatch_rules::mixer::weights(weights)
        .err()
        .map(|broken| broken.message)
}

/// The sources' draws merged so that each is spread evenly over the batch: the
/// `k`-th of `c` examples of a source sits at `(k + ½) / c` (ties to the lower
/// source). A contiguous slice of the batch (a rank's share) then holds each
/// source in proportion, within one example, instead of one source's documents
/// (all short, or all long) landing on one rank. The order depends on the draws
/// alone, not on the number of ranks.
fn interleave(per_source: &[Vec<usize>]) -> Vec<usize> {
    let mut keyed: Vec<(f64, usize, usize)> = per_source
        .iter()
        .enumerate()
        .flat_map(|(s, items)| {
            let c = items.len() as f64;
            items
                .iter()
                .enumerate()
                .map(move |(k, &index)| ((k as f64 + 0.5) / c, s, index))
        })
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, _, index)| index).collect()
}

/// Where one source stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceCursor {
    /// The source's epoch (passes started over it, from 0).
    pub epoch: usize,
    /// Examples used in its current epoch.
    pub position: usize,
    /// Examples taken from it in total.
    pub seen: usize,
}

/// The checkpointed state of the sources: every cursor and the allocator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SourcesState {
    /// One per source, in source order.
    pub cursors: Vec<SourceCursor>,
    /// The deficit allocator's targets and counts.
    pub mixture: Mixture,
    /// The weights in force.
    pub weights: Vec<f64>,
    /// `all_exhausted`: the sources that finished a pass in the current epoch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exhausted: Vec<bool>,
    /// When the run's epochs end (absent in older checkpoints: `primary`).
    #[serde(default)]
    pub stopping: StoppingStrategy,
}

/// The draws of a run of several sources.
#[derive(Debug, Clone)]
pub struct MixedSources {
    spec: SourceSpec,
    offsets: Vec<usize>,
    seed: u64,
    shuffle: bool,
    weights: Vec<f64>,
    mixture: Mixture,
    cursors: Vec<SourceCursor>,
    perms: Vec<Permutation>,
    draws: usize,
    /// `all_exhausted`: sources that finished a pass in the current epoch.
    exhausted: Vec<bool>,
}

impl MixedSources {
    /// The sources of `spec`, nothing drawn.
    pub fn new(spec: &SourceSpec, seed: u64, shuffle: bool) -> Result<Self> {
        if spec.names.is_empty() || spec.names.len() != spec.sizes.len() {
            return Err(Error::Data(DataError::NoSources));
        }
        if let Some(s) = spec.sizes.iter().position(|&n| n == 0) {
            return Err(Error::Data(DataError::EmptySource {
                name: spec.names[s].clone(),
            }));
        }
        check_weights(0, &spec.weights)?;
        let offsets = (0..spec.sizes.len()).map(|s| spec.offset(s)).collect();
        let cursors = vec![
            SourceCursor {
                epoch: 0,
                position: 0,
                seen: 0
            };
            spec.sizes.len()
        ];
        let mut mixed = Self {
            spec: spec.clone(),
            offsets,
            seed,
            shuffle,
            weights: spec.weights.clone(),
            mixture: Mixture::new(spec.sizes.len()),
            cursors,
            perms: Vec::new(),
            draws: 0,
            exhausted: vec![false; spec.sizes.len()],
        };
        mixed.perms = (0..spec.sizes.len())
            .map(|s| mixed.permutation(s, 0))
            .collect();
        Ok(mixed)
    }

    fn permutation(&self, source: usize, epoch: usize) -> Permutation {
        let len = self.spec.sizes[source];
        if self.shuffle {
            Permutation::new(
                len,
                self.seed,
                SOURCE_KEY_BASE + source as u64,
                epoch as u64,
            )
        } else {
            Permutation::identity(len)
        }
    }

    /// The sources' names, sizes and configured weights.
    pub fn spec(&self) -> &SourceSpec {
        &self.spec
    }

    /// Every source's cursor.
    pub fn cursors(&self) -> &[SourceCursor] {
        &self.cursors
    }

    /// The weights in force (as given, not normalised).
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Sets the weights of the next draws (a mixer's, after step `step`).
    pub fn set_weights(&mut self, step: usize, weights: &[f64]) -> Result<()> {
        if weights.len() != self.weights.len() {
            return Err(Error::Data(DataError::InvalidMixWeights {
                step,
                reason: format!(
                    "{} weights for {} sources",
                    weights.len(),
                    self.weights.len()
                ),
            }));
        }
        check_weights(step, weights)?;
        self.weights = weights.to_vec();
        Ok(())
    }

    /// Examples left in the primary source's current epoch.
    pub fn primary_remaining(&self) -> usize {
        self.spec.sizes[0] - self.cursors[0].position
    }

    fn remaining(&self, source: usize) -> usize {
        self.spec.sizes[source] - self.cursors[source].position
    }

    /// Which sources end the epoch in this draw of `counts`, each capped at what
    /// it has left: `None` when the epoch is already over.
    fn epoch_ends(&self, counts: &[usize]) -> Option<Vec<bool>> {
        let n = counts.len();
        let over = |s: usize| counts[s] >= self.remaining(s);
        match self.spec.stopping {
            StoppingStrategy::Primary => {
                (self.remaining(0) > 0).then(|| (0..n).map(|s| s == 0 && over(0)).collect())
            }
            StoppingStrategy::FirstExhausted => (0..n)
                .all(|s| self.remaining(s) > 0)
                .then(|| (0..n).map(over).collect()),
            StoppingStrategy::AllExhausted => {
                if self.exhausted.iter().all(|&e| e) {
                    return None;
                }
                // Only the draw that finishes the last unfinished sources ends it;
                // before that, a finishing source cycles.
                let last = (0..n).all(|s| self.exhausted[s] || over(s));
                Some(
                    (0..n)
                        .map(|s| last && !self.exhausted[s] && over(s))
                        .collect(),
                )
            }
        }
    }

    /// A global batch of `wanted` examples as dataset indices, the sources
    /// interleaved in proportion ([`interleave`]: every rank's contiguous slice
    /// holds each source's share, so ranks get alike numbers of tokens); `None` when
    /// the epoch is over (see [`StoppingStrategy`]; with `drop_last`, also when the
    /// batch that ends it would be short).
    pub fn draw(&mut self, wanted: usize, drop_last: bool) -> Result<Option<Vec<usize>>> {
        if wanted == 0 {
            return Ok(None);
        }
        let saved = self.mixture.clone();
        let weights = self.spec.example_weights(&self.weights);
        let mut counts = self.mixture.allocate(self.draws + 1, wanted, &weights)?;
        let Some(ending) = self.epoch_ends(&counts) else {
            self.mixture = saved;
            return Ok(None);
        };
        let short = (0..counts.len()).any(|s| ending[s] && counts[s] > self.remaining(s));
        if short && drop_last {
            self.mixture = saved;
            if self.spec.stopping != StoppingStrategy::Primary {
                // The short sources' tails are dropped: they restart next epoch.
                for s in (0..counts.len()).filter(|&s| ending[s]) {
                    self.cursors[s].position = self.spec.sizes[s];
                }
                self.exhausted.iter_mut().for_each(|e| *e = true);
            }
            return Ok(None);
        }
        for s in (0..counts.len()).filter(|&s| ending[s]) {
            // The epoch end shortens the batch; the source's target keeps the rest.
            let left = self.remaining(s);
            if counts[s] > left {
                self.mixture.give_back(s, counts[s] - left);
                counts[s] = left;
            }
        }
        self.draws += 1;
        let mut per_source = Vec::with_capacity(counts.len());
        for (s, &count) in counts.iter().enumerate() {
            let mut indices = Vec::with_capacity(count);
            let mut left = count;
            while left > 0 {
                let cursor = &mut self.cursors[s];
                if cursor.position == self.spec.sizes[s] {
                    // Sources that do not end the epoch cycle.
                    self.exhausted[s] = true;
                    cursor.epoch += 1;
                    cursor.position = 0;
                    let epoch = cursor.epoch;
                    self.perms[s] = self.permutation(s, epoch);
                    continue;
                }
                let cursor = &mut self.cursors[s];
                let take = left.min(self.spec.sizes[s] - cursor.position);
                let start = cursor.position;
                let offset = self.offsets[s];
                indices.extend(self.perms[s].range(start..start + take).map(|i| offset + i));
                cursor.position += take;
                cursor.seen += take;
                left -= take;
                if cursor.position == self.spec.sizes[s] {
                    self.exhausted[s] = true;
                }
            }
            per_source.push(indices);
        }
        Ok(Some(interleave(&per_source)))
    }

    /// A global batch of as many examples as fit in `max_tokens` tokens summed
    /// (`lengths`: every dataset index's length), drawn one example at a time as
    /// [`MixedSources::draw`] draws a batch of one (the source furthest behind its
    /// target next), until the next would not fit; then interleaved as `draw`
    /// interleaves. The sources' passes, epoch ends and allocator are `draw`'s, so
    /// every source still gives each of its examples once per source epoch, and a
    /// batch stops at the epoch's end (no batch is short of a count, so `drop_last`
    /// drops nothing). A first example longer than the budget is a batch of its
    /// own; `None` when the epoch is over.
    pub fn draw_tokens(
        &mut self,
        max_tokens: usize,
        lengths: &[usize],
        drop_last: bool,
    ) -> Result<Option<Vec<usize>>> {
        let draws = self.draws;
        let (mut taken, mut tokens) = (Vec::new(), 0usize);
        // Empty examples would let a batch grow without end: at most `max_tokens`.
        while tokens < max_tokens && taken.len() < max_tokens.max(1) {
            let mut trial = self.clone();
            let Some(next) = trial.draw(1, drop_last)? else {
                break;
            };
            let length: usize = next.iter().map(|&i| lengths[i]).sum();
            if !taken.is_empty() && tokens + length > max_tokens {
                break;
            }
            *self = trial;
            tokens += length;
            taken.extend(next);
        }
        if taken.is_empty() {
            return Ok(None);
        }
        self.draws = draws + 1;
        let mut per_source = vec![Vec::new(); self.spec.sizes.len()];
        for index in taken {
            per_source[self.spec.locate(index).0].push(index);
        }
        Ok(Some(interleave(&per_source)))
    }

    /// Starts the next epoch: the primary source (`primary`), or every used-up
    /// source (`first_exhausted`, `all_exhausted`) starts its next pass; the
    /// others go on with their own.
    pub fn start_next_epoch(&mut self) {
        let restart: Vec<usize> = match self.spec.stopping {
            StoppingStrategy::Primary => vec![0],
            _ => (0..self.cursors.len())
                .filter(|&s| self.remaining(s) == 0)
                .collect(),
        };
        for s in restart {
            let cursor = &mut self.cursors[s];
            cursor.epoch += 1;
            cursor.position = 0;
            let epoch = cursor.epoch;
            self.perms[s] = self.permutation(s, epoch);
        }
        self.exhausted.iter_mut().for_each(|e| *e = false);
    }

    /// The epoch's progress in units of `primary_size` (the sampler's position):
    /// exactly the primary's position under `primary`.
    pub fn epoch_position(&self, primary_size: usize) -> usize {
        match self.spec.stopping {
            StoppingStrategy::Primary => primary_size - self.primary_remaining(),
            _ => (self.epoch_progress() * primary_size as f64).round() as usize,
        }
    }

    /// How far the current epoch is, in `[0, 1]`: the primary's share used
    /// (`primary`), the furthest source's (`first_exhausted`), the least advanced
    /// unfinished source's (`all_exhausted`).
    pub fn epoch_progress(&self) -> f64 {
        let share = |s: usize| self.cursors[s].position as f64 / self.spec.sizes[s] as f64;
        let n = self.cursors.len();
        match self.spec.stopping {
            StoppingStrategy::Primary => share(0),
            StoppingStrategy::FirstExhausted => (0..n).map(share).fold(0.0, f64::max),
            StoppingStrategy::AllExhausted => (0..n)
                .map(|s| if self.exhausted[s] { 1.0 } else { share(s) })
                .fold(1.0, f64::min),
        }
    }

    /// What a checkpoint keeps.
    pub fn state(&self) -> SourcesState {
        SourcesState {
            cursors: self.cursors.clone(),
            mixture: self.mixture.clone(),
            weights: self.weights.clone(),
            exhausted: match self.spec.stopping {
                StoppingStrategy::AllExhausted => self.exhausted.clone(),
                _ => Vec::new(),
            },
            stopping: self.spec.stopping,
        }
    }

    /// Continues from a checkpoint's state (checked by [`MixedSources::check`]).
    pub fn restore(&mut self, state: &SourcesState) {
        self.cursors = state.cursors.clone();
        self.mixture = state.mixture.clone();
        self.weights = state.weights.clone();
        self.exhausted = if state.exhausted.len() == self.cursors.len() {
            state.exhausted.clone()
        } else {
            vec![false; self.cursors.len()]
        };
        self.perms = (0..self.cursors.len())
            .map(|s| self.permutation(s, self.cursors[s].epoch))
            .collect();
    }

    /// Whether `state` fits these sources.
    pub fn check(&self, state: &SourcesState) -> std::result::Result<(), String> {
        let n = self.spec.sizes.len();
        if state.cursors.len() != n || state.weights.len() != n || state.mixture.seen().len() != n {
            return Err(format!(
                "the checkpoint has {} sources; the dataset has {n}",
                state.cursors.len()
            ));
        }
        if let Some((s, c)) = state
            .cursors
            .iter()
            .enumerate()
            .find(|(s, c)| c.position > self.spec.sizes[*s])
        {
            return Err(format!(
                "source `{}` is at position {} of {}",
                self.spec.names[s], c.position, self.spec.sizes[s]
            ));
        }
        if state.stopping != self.spec.stopping {
            return Err(format!(
                "the checkpoint's epochs end by {:?}, this run's by {:?} (--stopping-strategy)",
                state.stopping, self.spec.stopping
            ));
        }
        match weights_problem(&state.weights) {
            Some(reason) => Err(format!("its mixing weights: {reason}")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_spreads_each_source_over_the_batch() {
        // 6 of `a` (0..6), 2 of `b` (10, 11), 1 of `c` (20).
        let merged = interleave(&[(0..6).collect(), vec![10, 11], vec![20]]);
        assert_eq!(merged, [0, 1, 10, 2, 20, 3, 4, 11, 5]);
        // Each half (a rank's slice on 2 ranks) holds its share within one.
        let (first, second) = merged.split_at(merged.len().div_ceil(2));
        for half in [first, second] {
            let a = half.iter().filter(|&&i| i < 6).count();
            assert!(
                (a as f64 - 6.0 * half.len() as f64 / 9.0).abs() <= 1.0,
                "{half:?}"
            );
        }
        assert!(interleave(&[vec![], vec![3]]) == [3]);
    }
}
