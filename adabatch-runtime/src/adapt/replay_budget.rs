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
            return Err(invalid(
                budget.to_string(),
                "a share of each step, from 0 to 1",
            ));
        }
        let new_sources: Vec<String> = new_sources.into_iter().map(Into::into).collect();
        if new_sources.is_empty() {
            return Err(invalid(
                "no new sources".into(),
                "at least one new source, which it does not cap",
            ));
        }
        let mut inner = inner;
        inner.keep_old_share_within(&new_sources, budget);
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

    /// Every new source must be one of the run's: a name that matches none would
    /// leave every source old and cap the whole mixture at the budget.
    fn check_sources(&self, names: &[String]) -> std::result::Result<(), String> {
        let unknown: Vec<&str> = (self.new_sources.iter())
            .filter(|new| !names.contains(new))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(format!(
                "the replay budget's new source(s) {} are not among them",
                unknown.join(", ")
            ));
        }
        self.inner.check_sources(names)
    }

    fn wants_held_out(&self, step: usize) -> bool {
        self.inner.wants_held_out(step)
    }
    fn reads_held_out_of(&self, source: &str) -> bool {
        self.inner.reads_held_out_of(source)
    }
    /// The inner mixer's: its statistics are of the step's own examples,
    /// whatever the cap made of its weights.
    fn wants_source_gradients(&self, step: usize) -> bool {
        self.inner.wants_source_gradients(step)
    }

    fn state(&self) -> Option<serde_json::Value> {
        self.inner.state()
    }

    /// The inner mixer's.
    fn diagnostics(&self) -> Vec<(&'static str, super::mixer::Diagnostic)> {
        self.inner.diagnostics()
    }

    fn restore(&mut self, state: &serde_json::Value) -> std::result::Result<(), String> {
        self.inner.restore(state)
    }

    fn plan_run(&mut self, expected_steps: Option<usize>) -> Option<String> {
        self.inner.plan_run(expected_steps)
    }

    /// The inner mixer's closing, its weights capped as every step's.
    fn closes(&self) -> bool {
        self.inner.closes()
    }
    fn close(&mut self, stats: &SourceStats<'_>) -> super::mixer::Closing {
        self.inner.close(stats)
    }

    /// The tighter of the two caps reaches the inner mixer when both name the
    /// same new sources; otherwise this one's stands.
    fn keep_old_share_within(&mut self, new_sources: &[String], budget: f64) {
        if new_sources == self.new_sources.as_slice() && budget < self.budget {
            self.inner.keep_old_share_within(new_sources, budget);
        }
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
    let old: f64 = shares
        .iter()
        .zip(is_new)
        .filter(|(_, &n)| !n)
        .map(|(s, _)| s)
        .sum();
    let new_count = is_new.iter().filter(|&&n| n).count();
    // No new source takes what the cap moves (`check_sources` refuses such a run
    // before it starts): the mixture is left as it is.
    if old <= budget || new_count == 0 {
        return shares;
    }
    let new = 1.0 - old;
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
        SourceStats::blank(1, names, MixUnit::Tokens)
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
        assert!(
            (w[0] - 0.9).abs() < 1e-15 && (w[1] - 0.05).abs() < 1e-15,
            "{w:?}"
        );
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
        assert!(refused(ReplayBudget::new(
            Fixed(vec![]),
            ["python"],
            f64::NAN
        )));
        assert!(refused(ReplayBudget::new(
            Fixed(vec![]),
            Vec::<String>::new(),
            0.1
        )));
    }

    #[test]
    fn new_sources_must_be_among_the_runs() {
        let names: Vec<String> = ["python", "en", "kjv"].map(String::from).to_vec();
        let budget =
            |new: &[&str]| ReplayBudget::new(Fixed(vec![1.0; 3]), new.to_vec(), 0.1).unwrap();
        assert!(budget(&["python"]).check_sources(&names).is_ok());
        let err = budget(&["pyhton", "en"]).check_sources(&names).unwrap_err();
        assert!(err.contains("pyhton") && !err.contains("en,"), "{err}");
    }

    /// Exp3 under a budget: its reward divides a source's loss by the share the
    /// step trained on (the capped one), not by the share it proposed.
    #[test]
    fn exp3_under_a_budget_learns_from_the_shares_trained() {
        use crate::adapt::mixer::Exp3Mixer;
        let names: Vec<String> = ["new", "old"].map(String::from).to_vec();
        let mut mixer = ReplayBudget::new(Exp3Mixer::new(0.5), ["new"], 0.1).unwrap();
        let no_loss = [f64::NAN; 2];
        let mut first = stats(&names);
        (first.step, first.loss) = (0, &no_loss);
        let given = mixer.weights(&first);
        // Exp3 proposed (0.5, 0.5); the budget trained (0.9, 0.1).
        assert!(
            (given[0] - 0.9).abs() < 1e-15 && (given[1] - 0.1).abs() < 1e-15,
            "{given:?}"
        );
        let loss = [2.0, 3.0];
        let mut after = stats(&names);
        after.loss = &loss;
        after.weights = &given;
        mixer.weights(&after);
        let rewards = mixer.inner.rewards();
        for (got, want) in rewards.iter().zip([0.5 * 2.0 / 0.9, 0.5 * 3.0 / 0.1]) {
            assert!((got - want).abs() < 1e-12, "{rewards:?}");
        }
    }

    /// Aioli under a budget: its probes stay inside the cap (the old domains
    /// probed among themselves at the budget, the new one apart), so the law it
    /// solves for is recovered exactly from losses that fall as a known `A` says
    /// on the mixtures trained, however tight the budget, and the mixture moves.
    /// (With the proposed probes capped, a budget of 0.3 or less trained every
    /// probe on the same new share: `W` was singular and the mixture stayed
    /// uniform for the whole run.)
    #[test]
    fn aioli_under_a_budget_recovers_the_law_of_the_mixtures_trained() {
        use crate::adapt::aioli::AioliMixer;
        let names: Vec<String> = ["new", "en", "kjv"].map(String::from).to_vec();
        let truth = [[0.4, 0.1, 0.0], [0.05, 0.3, 0.1], [0.0, 0.1, 0.2]];
        let run = |budget: f64| {
            let aioli = AioliMixer::new(10, 2, 0.6, 1.0).unwrap();
            let mut mixer = ReplayBudget::new(aioli, ["new"], budget).unwrap();
            let mut loss = [5.0, 6.0, 7.0];
            let no_loss = [f64::NAN; 3];
            let mut first = stats(&names);
            (first.step, first.loss) = (0, &no_loss);
            let mut given = vec![mixer.weights(&first)];
            for step in 1..=7 {
                // Step `step` trained on the last weights given; its loss was
                // measured before its update.
                let (observed, trained) = (loss, given.last().unwrap().clone());
                for (i, row) in truth.iter().enumerate() {
                    loss[i] -= (0..3).map(|j| row[j] * trained[j]).sum::<f64>();
                }
                let mut after = stats(&names);
                (after.step, after.loss, after.weights) = (step, &observed, &trained);
                given.push(mixer.weights(&after));
            }
            (
                mixer.inner.mixing_law().to_vec(),
                mixer.inner.mixture().to_vec(),
                given,
            )
        };
        for budget in [0.5, 0.3, 0.1] {
            let (law, mixture, given) = run(budget);
            let probes = &given[..6];
            assert!(
                probes.iter().all(|w| w[1] + w[2] <= budget + 1e-12),
                "{given:?}"
            );
            // Probing `en` at 0.6 of the old side's budget, `kjv` the rest of it.
            assert!((given[2][1] - 0.6 * budget).abs() < 1e-12, "{given:?}");
            assert_eq!(law.len(), 9, "the round closed at {budget}");
            for (got, want) in law.iter().zip(truth.iter().flatten()) {
                assert!((got - 2.0 * want).abs() < 1e-9, "{budget}: {law:?}");
            }
            assert!(
                mixture.iter().any(|p| (p - 1.0 / 3.0).abs() > 1e-3),
                "{mixture:?}"
            );
        }
    }

    /// Under a budget of 0 the old domains never train, so Aioli cannot measure
    /// them: the run is refused before its first step.
    #[test]
    fn aioli_under_a_budget_of_zero_is_refused() {
        use crate::adapt::aioli::AioliMixer;
        let names: Vec<String> = ["new", "en"].map(String::from).to_vec();
        let mixer = ReplayBudget::new(AioliMixer::default(), ["new"], 0.0).unwrap();
        let refused = mixer.check_sources(&names).unwrap_err();
        assert!(refused.contains("replay budget of 0"), "{refused}");
        let within = ReplayBudget::new(AioliMixer::default(), ["new"], 0.05).unwrap();
        assert_eq!(within.check_sources(&names), Ok(()));
    }

    proptest! {
        #[test]
        fn the_budget_is_never_exceeded(
            weights in prop::collection::vec(0.0f64..10.0, 2..6),
            new_mask in prop::collection::vec(any::<bool>(), 6),
            budget in 0.0f64..=1.0,
        ) {
            // Any source may be new, or none (the mixture then passes unchanged).
            let is_new = new_mask[..weights.len()].to_vec();
            prop_assume!(weights.iter().sum::<f64>() > 1e-9);
            let w = capped(&weights, &is_new, budget);
            let total: f64 = w.iter().sum();
            prop_assert!((total - 1.0).abs() < 1e-9, "{w:?}");
            let old: f64 = w.iter().zip(&is_new).filter(|(_, &n)| !n).map(|(w, _)| w).sum();
            if is_new.iter().any(|&n| n) {
                prop_assert!(old <= budget + 1e-12, "old {old} over {budget}: {w:?}");
            } else {
                let sum: f64 = weights.iter().sum();
                for (got, w) in w.iter().zip(&weights) {
                    prop_assert!((got - w / sum).abs() < 1e-12);
                }
            }
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
