//! Continual pretraining's replay budget: any mixer steering the old domains and
//! the new, with the old domains' share of every step capped.

use super::mixer::{Mixer, SourceStats};
use crate::error::{Error, Result, SettingsError};

/// A mixer whose old domains (every source not named new) together take at most
/// `budget` of each step's batch: when the inner mixer gives them more, their
/// weights are scaled down to the budget and the new sources' up, each keeping its
/// share within its side. Weights within the budget pass unchanged (normalised).
///
/// With weights as shares of tokens (`MixUnit::Tokens`) the cap bounds the old
/// domains' tokens of every step, and so of the run, up to the rounding of a step
/// into whole documents. Its state is the inner mixer's.
#[derive(Debug)]
pub struct ReplayBudget<M> {
    inner: M,
    new_sources: Vec<String>,
    budget: f64,
}

impl<M: Mixer> ReplayBudget<M> {
    /// `inner` over all sources, the old ones (all but `new_sources`) capped at
    /// `budget` (in `0..=1`) of each step together. A typed error for a budget
    /// outside `0..=1` or no new source.
    pub fn new<S: Into<String>>(
        inner: M,
        new_sources: impl IntoIterator<Item = S>,
        budget: f64,
    ) -> Result<Self> {
        let invalid = |value: String, expected| {
            Error::Settings(SettingsError::InvalidSetting {
                name: "replay_budget",
                value,
                expected,
            })
        };
        if !(0.0..=1.0).contains(&budget) {
            return Err(invalid(budget.to_string(), "a share of each step, from 0 to 1"));
        }
        let new_sources: Vec<String> = new_sources.into_iter().map(Into::into).collect();
        if new_sources.is_empty() {
            return Err(invalid("no new sources".into(), "at least one new source, which it does not cap"));
        }
        Ok(Self {
            inner,
            new_sources,
            budget,
        })
    }
}

impl<M: Mixer> Mixer for ReplayBudget<M> {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let weights = self.inner.weights(stats);
        let is_new: Vec<bool> = stats
            .names
            .iter()
            .map(|name| self.new_sources.contains(name))
            .collect();
        capped(&weights, &is_new, self.budget)
    }

    fn state(&self) -> Option<serde_json::Value> {
        self.inner.state()
    }

    fn restore(&mut self, state: &serde_json::Value) -> std::result::Result<(), String> {
        self.inner.restore(state)
    }
}

/// `weights` normalised, the old sources' (`!is_new`) share at most `budget`.
/// Weights that do not sum to a positive finite number pass unchanged: the engine
/// refuses them with its own error.
fn capped(weights: &[f64], is_new: &[bool], budget: f64) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    if !(total.is_finite() && total > 0.0) || weights.len() != is_new.len() {
        return weights.to_vec();
    }
    let shares: Vec<f64> = weights.iter().map(|w| w / total).collect();
    let old: f64 = shares.iter().zip(is_new).filter(|(_, &n)| !n).map(|(s, _)| s).sum();
    if old <= budget {
        return shares;
    }
    let new = 1.0 - old;
    let new_count = is_new.iter().filter(|&&n| n).count();
    shares
        .iter()
        .zip(is_new)
        .map(|(&share, &is_new)| match is_new {
            false => share * budget / old,
            // The new sources had nothing: they split their side evenly.
            true if new <= 0.0 => (1.0 - budget) / new_count as f64,
            true => share * (1.0 - budget) / new,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::source_spec::MixUnit;
    use proptest::prelude::*;

    /// A mixer that always answers `weights`.
    struct Fixed(Vec<f64>);

    impl Mixer for Fixed {
        fn weights(&mut self, _: &SourceStats<'_>) -> Vec<f64> {
            self.0.clone()
        }
    }

    fn stats(names: &[String]) -> SourceStats<'_> {
        SourceStats {
            step: 1,
            names,
            loss: &[],
            tokens: &[],
            source_tokens: &[],
            unit: MixUnit::Tokens,
            seen: &[],
            positions: &[],
            sizes: &[],
            weights: &[],
            last_eval: None,
        }
    }

    #[test]
    fn old_domains_over_the_budget_are_scaled_to_it() {
        let names: Vec<String> = ["python", "en", "kjv"].map(String::from).to_vec();
        let mut mixer = ReplayBudget::new(Fixed(vec![0.5, 0.3, 0.2]), ["python"], 0.1).unwrap();
        // The old domains had 0.5: scaled by 0.1/0.5; python by 0.9/0.5.
        let w = mixer.weights(&stats(&names));
        for (got, want) in w.iter().zip([0.9, 0.06, 0.04]) {
            assert!((got - want).abs() < 1e-15, "{w:?}");
        }
        // Within the budget: unchanged, normalised.
        let mut within = ReplayBudget::new(Fixed(vec![19.0, 0.5, 0.5]), ["python"], 0.1).unwrap();
        assert_eq!(within.weights(&stats(&names)), [0.95, 0.025, 0.025]);
        // All weight on the old domains: python takes the rest.
        let mut all_old = ReplayBudget::new(Fixed(vec![0.0, 1.0, 1.0]), ["python"], 0.1).unwrap();
        let w = all_old.weights(&stats(&names));
        assert!((w[0] - 0.9).abs() < 1e-15 && (w[1] - 0.05).abs() < 1e-15, "{w:?}");
    }

    #[test]
    fn bad_budgets_are_errors() {
        let refused = |result: Result<ReplayBudget<Fixed>>| {
            matches!(
                result,
                Err(Error::Settings(SettingsError::InvalidSetting {
                    name: "replay_budget",
                    ..
                }))
            )
        };
        assert!(refused(ReplayBudget::new(Fixed(vec![]), ["python"], 1.5)));
        assert!(refused(ReplayBudget::new(Fixed(vec![]), ["python"], f64::NAN)));
        assert!(refused(ReplayBudget::new(Fixed(vec![]), Vec::<String>::new(), 0.1)));
    }

    proptest! {
        #[test]
        fn the_budget_is_never_exceeded(
            weights in prop::collection::vec(0.0f64..10.0, 2..6),
            new_mask in prop::collection::vec(any::<bool>(), 6),
            budget in 0.0f64..=1.0,
        ) {
            let is_new: Vec<bool> = weights.iter().enumerate().map(|(i, _)| i == 0 || new_mask[i]).collect();
            prop_assume!(weights.iter().sum::<f64>() > 1e-9);
            let w = capped(&weights, &is_new, budget);
            let total: f64 = w.iter().sum();
            prop_assert!((total - 1.0).abs() < 1e-9, "{w:?}");
            let old: f64 = w.iter().zip(&is_new).filter(|(_, &n)| !n).map(|(w, _)| w).sum();
            prop_assert!(old <= budget + 1e-12, "old {old} over {budget}: {w:?}");
            prop_assert!(w.iter().all(|&x| x >= 0.0));
            // Within each side, the inner mixer's proportions are kept.
            let sum: f64 = weights.iter().sum();
            let old_before: f64 = weights.iter().zip(&is_new).filter(|(_, &n)| !n).map(|(w, _)| w / sum).sum();
            if old_before <= budget {
                for (got, w) in w.iter().zip(&weights) {
                    prop_assert!((got - w / sum).abs() < 1e-12);
                }
            }
        }
    }
}
