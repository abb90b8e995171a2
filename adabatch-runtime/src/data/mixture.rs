//! Per-source counts of a mixed global batch: a deterministic deficit allocator
//! (as Megatron-LM's blended datasets, no random draw decides the source).
//!
//! With weights `w` (normalised to sum 1) each source accumulates a target
//! `target_s += w_s × B` per step; the step's counts are the largest-remainder
//! rounding of the deficits `target_s − seen_s`, clamped at zero (a source ahead of
//! its target, e.g. after its weight dropped, pauses until the target catches up)
//! and rescaled to `B`. A zero-weight source gets nothing. Every rank computes the
//! same counts from the same state.
//!
//! **The guarantee and its condition.** Every source's cumulative count stays
//! within one example of its cumulative target `Σ_t w_s(t)·B_t` at every step while
//! every weight is positive, whatever the batch sizes and however the weights move
//! (a count can never run more than one example ahead of its target, and with `S`
//! sources never more than `S − 1` behind, since the deficits sum to zero; 300
//! seeded runs of randomly swinging weights stay within one). What does drift is
//! the count against the weights *now*: after the weights swing, a source's share of
//! all examples so far moves to its new weight only as new steps outweigh the old,
//! so `seen_s` can be far from `w_s · Σ B` (the mixer's weights hold per step, not
//! retroactively). A zero weight pauses a source: it keeps its count while the
//! others move on. `the_drift_after_the_weights_move_is_bounded` shows both.

use crate::error::{DataError, Error, Result};

/// The allocator's state: what each source was promised and what it got.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Mixture {
    targets: Vec<f64>,
    seen: Vec<usize>,
}

impl Mixture {
    /// A mixture of `sources` sources, nothing taken yet.
    pub fn new(sources: usize) -> Self {
        Self {
            targets: vec![0.0; sources],
            seen: vec![0; sources],
        }
    }

    /// Examples taken from each source so far.
    pub fn seen(&self) -> &[usize] {
        &self.seen
    }

    /// Each source's cumulative target so far.
    pub fn targets(&self) -> &[f64] {
        &self.targets
    }

    /// Returns `n` examples of `source`'s last count (a step cut short): its target
    /// keeps them, so it catches up later.
    pub fn give_back(&mut self, source: usize, n: usize) {
        self.seen[source] -= n.min(self.seen[source]);
    }

    /// The counts of step `step`'s global batch of `global` examples under
    /// `weights` (one per source, finite, ≥ 0, not all 0; normalised here).
    pub fn allocate(&mut self, step: usize, global: usize, weights: &[f64]) -> Result<Vec<usize>> {
        let weights = normalised(step, weights, self.targets.len())?;
        for (target, w) in self.targets.iter_mut().zip(&weights) {
            *target += w * global as f64;
        }
        // Deficits of the sources that may take examples (weight > 0).
        let deficits: Vec<f64> = self
            .targets
            .iter()
            .zip(&self.seen)
            .zip(&weights)
            .map(|((t, &s), &w)| {
                if w > 0.0 {
                    (t - s as f64).max(0.0)
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = deficits.iter().sum();
        // Scale the deficits to exactly `global` (they sum to `global` while the
        // weights hold; more after a source paused, less never by more than rounding).
        let shares: Vec<f64> = if total > 0.0 {
            deficits.iter().map(|d| d * global as f64 / total).collect()
        } else {
            weights.iter().map(|w| w * global as f64).collect()
        };
        let counts = largest_remainder(&shares, global);
        for (seen, c) in self.seen.iter_mut().zip(&counts) {
            *seen += c;
        }
        Ok(counts)
    }
}

/// Checks and normalises the weights of step `step`.
fn normalised(step: usize, weights: &[f64], sources: usize) -> Result<Vec<f64>> {
    let bad = |reason: String| Error::Data(DataError::InvalidMixWeights { step, reason });
    if weights.len() != sources {
        return Err(bad(format!(
            "{} weights for {sources} sources",
            weights.len()
        )));
    }
    if let Some((i, w)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| adabatch_rules::mixer::weight(**w).is_err())
    {
        return Err(bad(format!(
            "weight {w} of source {i} is not a finite number >= 0"
        )));
    }
    adabatch_rules::mixer::weights(weights).map_err(|broken| bad(broken.message))?;
    let sum: f64 = weights.iter().sum();
    Ok(weights.iter().map(|w| w / sum).collect())
}

/// Integer counts summing to `total`: the floors, then one more for the largest
/// remainders (ties to the lower index, so every rank agrees).
fn largest_remainder(shares: &[f64], total: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = shares.iter().map(|s| s.floor() as usize).collect();
    let assigned: usize = counts.iter().sum();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (shares[a] - shares[a].floor(), shares[b] - shares[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(total.saturating_sub(assigned)) {
        counts[i] += 1;
    }
    // Rounding can only overshoot by float error; take it back from the largest.
    let mut over = counts.iter().sum::<usize>().saturating_sub(total);
    while over > 0 {
        let i = (0..counts.len()).max_by_key(|&i| counts[i]).unwrap_or(0);
        counts[i] -= 1;
        over -= 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_quarters_and_a_quarter() {
        let mut mix = Mixture::new(2);
        let counts: Vec<Vec<usize>> = (1..=4)
            .map(|step| mix.allocate(step, 2, &[0.75, 0.25]).unwrap())
            .collect();
        // Targets 1.5/0.5, 3/1, 4.5/1.5, 6/2: within one example at every step.
        assert_eq!(counts, vec![vec![2, 0], vec![1, 1], vec![2, 0], vec![1, 1]]);
        assert_eq!(mix.seen(), &[6, 2]);
    }

    #[test]
    fn a_zero_weight_source_gets_nothing_and_never_stalls() {
        let mut mix = Mixture::new(2);
        mix.allocate(1, 10, &[0.5, 0.5]).unwrap();
        assert_eq!(mix.allocate(2, 10, &[1.0, 0.0]).unwrap(), vec![10, 0]);
        assert_eq!(mix.allocate(3, 3, &[1.0, 0.0]).unwrap(), vec![3, 0]);
    }

    /// Random batch sizes and weight changes (seeded, so it cannot flake): counts
    /// sum to the batch, and while weights hold every cumulative count stays within
    /// one example of its target.
    #[test]
    fn counts_sum_to_the_batch_and_track_the_targets() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for _ in 0..200 {
            let sources = rng.random_range(1..5);
            let mut mix = Mixture::new(sources);
            let mut weights: Vec<f64> = (0..sources).map(|_| rng.random_range(0.05..1.0)).collect();
            let mut held = 0;
            for step in 1..60 {
                if rng.random_bool(0.1) {
                    weights = (0..sources).map(|_| rng.random_range(0.05..1.0)).collect();
                    held = 0;
                }
                let global = rng.random_range(1..40);
                let counts = mix.allocate(step, global, &weights).unwrap();
                assert_eq!(counts.iter().sum::<usize>(), global);
                held += 1;
                if held > 1 {
                    for (t, &s) in mix.targets().iter().zip(mix.seen()) {
                        assert!((t - s as f64).abs() <= 1.0 + 1e-9, "target {t}, seen {s}");
                    }
                }
            }
        }
    }

    /// Weights that swing at random (positive, so every source takes part): every
    /// count stays within one example of its cumulative target, while against the
    /// weights in force the drift exceeds one example after a swing.
    #[test]
    fn the_drift_after_the_weights_move_is_bounded() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut drift_from_current = 0.0f64;
        for _ in 0..300 {
            let sources = rng.random_range(2..6);
            let mut mix = Mixture::new(sources);
            let mut total = 0usize;
            for step in 1..80 {
                let weights: Vec<f64> = if rng.random_bool(0.3) {
                    (0..sources).map(|_| rng.random_range(0.01..1.0)).collect()
                } else {
                    vec![1.0; sources]
                };
                let global = rng.random_range(1..12);
                total += global;
                mix.allocate(step, global, &weights).unwrap();
                let sum: f64 = weights.iter().sum();
                for ((t, &s), w) in mix.targets().iter().zip(mix.seen()).zip(&weights) {
                    let lag = t - s as f64;
                    assert!(lag.abs() < 1.0 + 1e-9, "{lag} off the cumulative target");
                    let now = w / sum * total as f64 - s as f64;
                    drift_from_current = drift_from_current.max(now.abs());
                }
            }
        }
        assert!(drift_from_current > 1.0, "{drift_from_current}");
    }

    #[test]
    fn bad_weights_name_the_step() {
        let mut mix = Mixture::new(2);
        for weights in [[f64::NAN, 1.0], [-0.5, 1.0], [0.0, 0.0]] {
            assert!(matches!(
                mix.allocate(7, 4, &weights),
                Err(Error::Data(DataError::InvalidMixWeights { step: 7, .. }))
            ));
        }
        assert!(mix.allocate(1, 4, &[1.0]).is_err(), "one weight per source");
    }
}
