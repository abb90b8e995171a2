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

use crate::data::mixture::Mixture;
use crate::data::permutation::Permutation;
use crate::error::{Error, Result};

/// Keys of the sources' permutations start here (the single-source sampler's is 0).
const SOURCE_KEY_BASE: u64 = 1 << 32;

/// What a dataset of several sources declares: names, sizes and mixing weights, in
/// source order (the first is the primary).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSpec {
    /// Source names, unique.
    pub names: Vec<String>,
    /// Examples per source (each at least 1); a source's examples follow the
    /// previous source's in the dataset's indices.
    pub sizes: Vec<usize>,
    /// Mixing weights (finite, >= 0, not all 0; normalised when used).
    pub weights: Vec<f64>,
}

impl SourceSpec {
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
                return Err(Error::UnknownSource {
                    name: name.clone(),
                    known: self.names.clone(),
                });
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
    let bad = |reason: String| Err(Error::InvalidMixWeights { step, reason });
    if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
        return bad(format!("weight {w} is not a finite number >= 0"));
    }
    if weights.iter().sum::<f64>() <= 0.0 {
        return bad("all weights are 0".into());
    }
    Ok(())
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
}

impl MixedSources {
    /// The sources of `spec`, nothing drawn.
    pub fn new(spec: &SourceSpec, seed: u64, shuffle: bool) -> Result<Self> {
        if spec.names.is_empty() || spec.names.len() != spec.sizes.len() {
            return Err(Error::NoSources);
        }
        if let Some(s) = spec.sizes.iter().position(|&n| n == 0) {
            return Err(Error::EmptySource {
                name: spec.names[s].clone(),
            });
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
            return Err(Error::InvalidMixWeights {
                step,
                reason: format!(
                    "{} weights for {} sources",
                    weights.len(),
                    self.weights.len()
                ),
            });
        }
        check_weights(step, weights)?;
        self.weights = weights.to_vec();
        Ok(())
    }

    /// Examples left in the primary source's current epoch.
    pub fn primary_remaining(&self) -> usize {
        self.spec.sizes[0] - self.cursors[0].position
    }

    /// A global batch of `wanted` examples as dataset indices, grouped by source in
    /// source order; `None` when the primary source's epoch is over (used up, or,
    /// with `drop_last`, too short for its share).
    pub fn draw(&mut self, wanted: usize, drop_last: bool) -> Result<Option<Vec<usize>>> {
        let remaining = self.primary_remaining();
        if remaining == 0 || wanted == 0 {
            return Ok(None);
        }
        let saved = self.mixture.clone();
        let mut counts = self
            .mixture
            .allocate(self.draws + 1, wanted, &self.weights)?;
        if counts[0] > remaining {
            if drop_last {
                self.mixture = saved;
                return Ok(None);
            }
            // The primary's epoch end shortens the batch; its target keeps the rest.
            self.mixture.give_back(0, counts[0] - remaining);
            counts[0] = remaining;
        }
        self.draws += 1;
        let mut indices = Vec::with_capacity(counts.iter().sum());
        for (s, &count) in counts.iter().enumerate() {
            let mut left = count;
            while left > 0 {
                let cursor = &mut self.cursors[s];
                if cursor.position == self.spec.sizes[s] {
                    // Only other sources get here: they cycle.
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
            }
        }
        Ok(Some(indices))
    }

    /// Starts the primary source's next epoch (the others keep their own).
    pub fn start_next_primary_epoch(&mut self) {
        let cursor = &mut self.cursors[0];
        cursor.epoch += 1;
        cursor.position = 0;
        let epoch = cursor.epoch;
        self.perms[0] = self.permutation(0, epoch);
    }

    /// What a checkpoint keeps.
    pub fn state(&self) -> SourcesState {
        SourcesState {
            cursors: self.cursors.clone(),
            mixture: self.mixture.clone(),
            weights: self.weights.clone(),
        }
    }

    /// Continues from a checkpoint's state (checked by [`MixedSources::check`]).
    pub fn restore(&mut self, state: &SourcesState) {
        self.cursors = state.cursors.clone();
        self.mixture = state.mixture.clone();
        self.weights = state.weights.clone();
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
        check_weights(0, &state.weights).map_err(|e| e.to_string())
    }
}
