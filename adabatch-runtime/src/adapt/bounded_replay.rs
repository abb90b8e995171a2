//! Continual pretraining with the least replay that keeps the old domains within a
//! bound: the old domains' held-out losses, read at each evaluation (or on a small
//! held-out set the mixer asks for), against their values before the new data
//! (phase 1's), and the replay share moved by that.

use super::mixer::{field, numbers, Diagnostic, Mixer, SourceStats};
use crate::error::{Error, Result, SettingsError};

/// A mixer for continual pretraining: the new sources take `1 − r` of each step,
/// the old ones (every source not named new) the replay share `r`. After each
/// evaluation it reads every old domain's held-out loss (`eval_<source>_loss`)
/// against the value it had before the new data (`reference`, phase 1's):
///
/// - when one has risen by more than `bound` (0.05: 5 %), `r` doubles (from 0 to
///   [`Self::FIRST_REPLAY`]), up to `max_replay`;
/// - when all are within half the bound, `r` halves (below half of
///   [`Self::FIRST_REPLAY`] it is 0): the least replay that keeps them within it
///   ([`Self::with_lower_at`] moves that threshold);
/// - in between it stays, so a loss hovering at the bound does not flip it.
///
/// It moves once per evaluation (evaluations are its measurements), so the bound
/// holds as well as evaluations are frequent: a drift is caught at the next one.
/// It needs an eval set of the same sources (`eval_<source>_loss`): an evaluation
/// that lacks an old domain's loss can raise the share but never lowers it, and
/// a run without evaluations keeps the first share.
/// Within the replay share, an old domain past the bound gets more: its weight is
/// `1 + max(0, drift) / bound`, others 1. Its state (the share, the last
/// evaluation read, the drifts) is checkpointed.
///
/// [`Self::with_gain`] replaces the doubling by a share that follows the drift:
/// each old domain replays `gain × drift / bound` of the step. Doubling at each
/// evaluation overshoots when replay takes several evaluations to bring a drift
/// down (it kept doubling to `max_replay` while the first increases were still
/// acting, and stayed there through the final decay). With it, the measured
/// recipe (BENCHMARKS.md, "Continual pretraining: a replay that follows the
/// drift") adds [`Self::with_start`]; [`Self::with_start`] and
/// [`Self::with_finish`] fix the share over the first and the last steps,
/// whatever the rule. [`Self::with_held_out`] reads a small held-out set instead
/// of the evaluations.
#[derive(Debug, Clone)]
pub struct BoundedReplay {
    new_sources: Vec<String>,
    reference: Vec<(String, f64)>,
    bound: f64,
    max_replay: f64,
    /// The fraction of the bound under which every old domain must be for `r` to halve.
    lower_at: f64,
    replay: f64,
    /// The step of the evaluation last read.
    read: Option<usize>,
    /// Each source's relative rise at that evaluation (NaN for new ones).
    drift: Vec<f64>,
    /// `Some(gain)`: the proportional rule of [`Self::with_gain`].
    gain: Option<f64>,
    /// Under the proportional rule, each source's share of the step (0 for new
    /// ones), kept where an evaluation lacks its loss.
    shares: Vec<f64>,
    /// [`Self::with_start`]: the replay share of the first steps, and how many.
    start: Option<(f64, usize)>,
    /// [`Self::with_finish`]: the replay share of the last steps, and the first of them.
    finish: Option<(f64, usize)>,
    /// The fixed share of the last weights, where a start or a finish set them.
    fixed_now: Option<f64>,
    /// [`Self::with_held_out`]: read the held-out set every so many steps, not
    /// the evaluations.
    held_out_every: Option<usize>,
}

impl BoundedReplay {
    /// Where the replay share starts, and the least it is raised to from none.
    pub const FIRST_REPLAY: f64 = 0.02;

    /// `new_sources` take what replay leaves; every other source must have its
    /// held-out loss before the new data in `reference`; `bound` is the relative
    /// rise allowed (positive), `max_replay` the most replay (in `(0, 1)`). A
    /// typed error for a bound or a share out of range, no new source, or a
    /// reference that is not a positive finite loss.
    pub fn new<S: Into<String>>(
        new_sources: impl IntoIterator<Item = S>,
        reference: impl IntoIterator<Item = (String, f64)>,
        bound: f64,
        max_replay: f64,
    ) -> Result<Self> {
        let invalid = |name, value: String, expected| {
            Error::Settings(SettingsError::invalid(name, value, expected))
        };
        if !(bound.is_finite() && bound > 0.0) {
            return Err(invalid(
                "bound",
                bound.to_string(),
                "a positive relative rise, e.g. 0.05",
            ));
        }
        if !(max_replay > 0.0 && max_replay < 1.0) {
            return Err(invalid(
                "max_replay",
                max_replay.to_string(),
                "a share of each step in (0, 1)",
            ));
        }
        let new_sources: Vec<String> = new_sources.into_iter().map(Into::into).collect();
        if new_sources.is_empty() {
            return Err(invalid(
                "new_sources",
                "none".into(),
                "at least one new source",
            ));
        }
        let reference: Vec<(String, f64)> = reference.into_iter().collect();
        if let Some((name, loss)) = reference.iter().find(|(_, l)| !(l.is_finite() && *l > 0.0)) {
            return Err(invalid(
                "reference",
                format!("{name} = {loss}"),
                "a positive finite held-out loss",
            ));
        }
        Ok(Self {
            new_sources,
            reference,
            bound,
            max_replay,
            lower_at: 0.5,
            replay: Self::FIRST_REPLAY.min(max_replay),
            read: None,
            drift: Vec::new(),
            gain: None,
            shares: Vec::new(),
            start: None,
            finish: None,
            fixed_now: None,
            held_out_every: None,
        })
    }

    /// Replay `share` of each step in all, split evenly among the old domains,
    /// for the run's first `steps` steps; the rule decides from then on (the
    /// evaluations of the first steps are read all the same). Before a drift
    /// shows the rule replays nothing, and replay in the first steps cost the new
    /// domain nothing where it was measured (it ended slightly better; BENCHMARKS.md,
    /// "Continual pretraining: a replay that follows the drift"). A typed error
    /// for a share outside `[0, max_replay]`.
    pub fn with_start(mut self, share: f64, steps: usize) -> Result<Self> {
        self.start = Some((self.fixed(share, "start share")?, steps));
        Ok(self)
    }

    /// Replay `share` of each step in all, split evenly among the old domains,
    /// from step `from` (counted from 1) to the end; the rule decided before: for
    /// a final decay that should train the new data alone, or a fixed replay
    /// there. Where it was measured, none in the decay (the last 20 % of the
    /// steps) left the old domains 0.6–0.7 points further from their reference
    /// than the rule's replay there (BENCHMARKS.md, "Continual pretraining: a
    /// replay that follows the drift"). A typed error for a share outside
    /// `[0, max_replay]`.
    pub fn with_finish(mut self, share: f64, from: usize) -> Result<Self> {
        self.finish = Some((self.fixed(share, "finish share")?, from));
        Ok(self)
    }

    /// A fixed share in `[0, max_replay]`, else a typed error naming it.
    fn fixed(&self, share: f64, name: &'static str) -> Result<f64> {
        if !(0.0..=self.max_replay).contains(&share) {
            return Err(Error::Settings(SettingsError::invalid(
                name,
                share,
                "a replay share of each step from 0 to max_replay",
            )));
        }
        Ok(share)
    }

    /// The start's or the finish's share of the step after `step`, if it is theirs.
    fn fixed_share(&self, step: usize) -> Option<f64> {
        let start = self.start.filter(|&(_, steps)| step < steps);
        let finish = self.finish.filter(|&(_, from)| step + 1 >= from);
        start.or(finish).map(|(share, _)| share)
    }

    /// The proportional rule: after each evaluation every old domain replays
    /// `gain × max(0, drift) / bound` of the step (`gain` at the bound, twice it at
    /// twice the bound, none while its loss is at or below its reference), their
    /// total scaled down to `max_replay` when above it. The share starts at 0 and
    /// moves with the drift in both directions, so it neither overshoots nor stays
    /// high once the drift falls; a domain whose loss an evaluation lacks keeps
    /// its share. A typed error unless `gain` is positive and finite.
    pub fn with_gain(mut self, gain: f64) -> Result<Self> {
        if !(gain.is_finite() && gain > 0.0) {
            return Err(Error::Settings(SettingsError::invalid(
                "gain",
                gain,
                "a positive share of the step at the bound, e.g. 0.04",
            )));
        }
        (self.gain, self.replay) = (Some(gain), 0.0);
        Ok(self)
    }

    /// Read the old domains' losses on the run's held-out set after every
    /// `every` steps (it asks for them: [`Mixer::wants_held_out`], the first
    /// `--mixer-eval-examples` examples of each old source of the eval set)
    /// instead of the evaluations, which it then ignores. A held-out set of a
    /// hundred documents a domain costs a fraction of an evaluation of the whole
    /// validation set (and holds none of the new sources'). `reference` must
    /// then be each old domain's loss on that same held-out set before the new
    /// data: a subset's loss differs from the whole set's by more than a bound
    /// of a few percent. A typed error for `every` = 0.
    pub fn with_held_out(mut self, every: usize) -> Result<Self> {
        if every == 0 {
            return Err(Error::Settings(SettingsError::invalid(
                "held_out_every",
                every,
                "a number of steps from 1",
            )));
        }
        self.held_out_every = Some(every);
        Ok(self)
    }

    /// Halve the share once every old domain is within `fraction` of the bound
    /// (in `(0, 1]`; default 0.5). At 1 the share falls as soon as they are back
    /// within the bound and may rise again at the next evaluation: less replay,
    /// a bound held more narrowly. A typed error outside `(0, 1]`.
    pub fn with_lower_at(mut self, fraction: f64) -> Result<Self> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::Settings(SettingsError::invalid(
                "lower_at",
                fraction,
                "a fraction of the bound in (0, 1]",
            )));
        }
        self.lower_at = fraction;
        Ok(self)
    }

    /// The replay share of the next steps (the start's or the finish's in theirs).
    pub fn replay(&self) -> f64 {
        self.fixed_now.unwrap_or(self.replay)
    }

    /// The losses of a reading not read yet, by source (NaN where it lacks
    /// one), and its step: the held-out set's after this step under
    /// [`Self::with_held_out`], else the last evaluation's.
    fn unread_losses(&self, stats: &SourceStats<'_>) -> Option<(usize, Vec<f64>)> {
        if self.held_out_every.is_some() {
            let held_out = stats.held_out.filter(|h| h.len() == stats.names.len());
            return held_out.map(|losses| (stats.step, losses.to_vec()));
        }
        let eval = stats
            .last_eval
            .as_ref()
            .filter(|e| Some(e.step) != self.read)?;
        let losses = (stats.names.iter())
            .map(|name| eval.get(&format!("eval_{name}_loss")).unwrap_or(f64::NAN))
            .collect();
        Some((eval.step, losses))
    }

    /// Reads losses not read yet: each old source's drift, then the share.
    fn read_evaluation(&mut self, stats: &SourceStats<'_>) {
        let Some((step, losses)) = self.unread_losses(stats) else {
            return;
        };
        self.read = Some(step);
        self.drift = (stats.names.iter().zip(losses))
            .map(|(name, now)| {
                let reference = self.reference.iter().find(|(n, _)| n == name);
                match reference {
                    Some(&(_, before)) if !self.new_sources.contains(name) => now / before - 1.0,
                    _ => f64::NAN,
                }
            })
            .collect();
        if let Some(gain) = self.gain {
            return self.follow_drift(gain);
        }
        let old =
            (stats.names.iter().zip(&self.drift)).filter(|(n, _)| !self.new_sources.contains(n));
        let (mut worst, mut unread) = (f64::NEG_INFINITY, false);
        for (_, &drift) in old {
            unread |= drift.is_nan();
            worst = worst.max(drift);
        }
        if worst > self.bound {
            self.replay = (2.0 * self.replay)
                .max(Self::FIRST_REPLAY)
                .min(self.max_replay);
        } else if worst < self.bound * self.lower_at && !unread {
            // An evaluation without some old domain's loss (an eval set of one
            // source) shows no drift there: it must not lower the replay.
            self.replay /= 2.0;
            if self.replay < Self::FIRST_REPLAY / 2.0 {
                self.replay = 0.0;
            }
        }
    }

    /// The proportional rule's shares from the drifts just read (NaN for new
    /// sources and for old ones the evaluation lacks, which keep theirs).
    fn follow_drift(&mut self, gain: f64) {
        self.shares.resize(self.drift.len(), 0.0);
        for (share, &drift) in self.shares.iter_mut().zip(&self.drift) {
            if !drift.is_nan() {
                *share = gain * drift.max(0.0) / self.bound;
            }
        }
        let total: f64 = self.shares.iter().sum();
        if total > self.max_replay {
            self.shares
                .iter_mut()
                .for_each(|s| *s *= self.max_replay / total);
        }
        self.replay = total.min(self.max_replay);
    }
}

impl Mixer for BoundedReplay {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        self.read_evaluation(stats);
        let is_new: Vec<bool> = stats
            .names
            .iter()
            .map(|n| self.new_sources.contains(n))
            .collect();
        let new_count = is_new.iter().filter(|&&n| n).count() as f64;
        let old_count = is_new.len() as f64 - new_count;
        self.fixed_now = self.fixed_share(stats.step).filter(|_| old_count > 0.0);
        if let Some(share) = self.fixed_now {
            return (is_new.iter())
                .map(|&new| {
                    if new {
                        (1.0 - share) / new_count
                    } else {
                        share / old_count
                    }
                })
                .collect();
        }
        if self.gain.is_some() {
            let share = |i: usize| self.shares.get(i).copied().unwrap_or(0.0);
            return (0..is_new.len())
                .map(|i| {
                    if is_new[i] {
                        (1.0 - self.replay) / new_count
                    } else {
                        share(i)
                    }
                })
                .collect();
        }
        let pull = |i: usize| {
            1.0 + self
                .drift
                .get(i)
                .copied()
                .filter(|d| *d > 0.0)
                .unwrap_or(0.0)
                / self.bound
        };
        let old_total: f64 = (0..is_new.len()).filter(|&i| !is_new[i]).map(pull).sum();
        // Without an old source the new ones take everything.
        let replay = if old_total > 0.0 { self.replay } else { 0.0 };
        (0..is_new.len())
            .map(|i| match is_new[i] {
                true => (1.0 - replay) / new_count,
                false => replay * pull(i) / old_total,
            })
            .collect()
    }

    /// Every new source must be one of the run's, and every old one needs its
    /// loss before the new data.
    fn check_sources(&self, names: &[String]) -> std::result::Result<(), String> {
        let unknown: Vec<&str> = (self.new_sources.iter())
            .filter(|n| !names.contains(n))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(format!(
                "the bounded replay's new source(s) {} are not among them",
                unknown.join(", ")
            ));
        }
        let unreferenced: Vec<&str> = (names.iter())
            .filter(|n| {
                !self.new_sources.contains(n) && !self.reference.iter().any(|(r, _)| r == *n)
            })
            .map(String::as_str)
            .collect();
        if !unreferenced.is_empty() {
            return Err(format!(
                "the bounded replay has no loss before the new data for the old source(s) {}",
                unreferenced.join(", ")
            ));
        }
        let strangers: Vec<&str> = (self.reference.iter())
            .map(|(name, _)| name.as_str())
            .filter(|name| !names.iter().any(|n| n == name))
            .collect();
        if !strangers.is_empty() {
            return Err(format!(
                "the bounded replay's reference names source(s) {} that are not among them",
                strangers.join(", ")
            ));
        }
        Ok(())
    }

    fn wants_held_out(&self, step: usize) -> bool {
        self.held_out_every.is_some_and(|every| step % every == 0)
    }

    /// The old sources' alone: the new ones' losses are never read.
    fn reads_held_out_of(&self, source: &str) -> bool {
        !self.new_sources.iter().any(|n| n == source)
    }

    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        vec![
            ("replay", Diagnostic::Scalar(self.replay())),
            ("drift", Diagnostic::PerSource(self.drift.clone())),
        ]
    }

    fn state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "replay": self.replay,
            "read": self.read,
            "drift": self.drift,
            "shares": self.shares,
        }))
    }

    fn restore(&mut self, state: &serde_json::Value) -> std::result::Result<(), String> {
        let replay = field(state, "replay")?
            .as_f64()
            .ok_or("`replay` is not a number")?;
        if !(0.0..=self.max_replay).contains(&replay) {
            return Err(format!(
                "`replay` = {replay} is outside 0..={}",
                self.max_replay
            ));
        }
        let read = match field(state, "read")? {
            serde_json::Value::Null => None,
            v => Some(v.as_u64().ok_or("`read` is not a step")? as usize),
        };
        self.drift = numbers(field(state, "drift")?)?;
        // Checkpoints from before the proportional rule have no `shares`.
        let shares = state
            .get("shares")
            .map(numbers)
            .transpose()?
            .unwrap_or_default();
        if shares.iter().any(|s| !(0.0..=self.max_replay).contains(s)) {
            return Err(format!(
                "`shares` {shares:?} are not all within 0..={}",
                self.max_replay
            ));
        }
        if self.gain.is_some() && (shares.iter().sum::<f64>() - replay).abs() > 1e-9 {
            return Err(format!(
                "`shares` {shares:?} do not sum to `replay` = {replay}"
            ));
        }
        (self.replay, self.read, self.shares) = (replay, read, shares);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::adapt::mixer::LastEval;
    use crate::data::source_spec::MixUnit;

    fn names() -> Vec<String> {
        ["en", "kjv", "code"].map(String::from).to_vec()
    }

    fn mixer() -> BoundedReplay {
        let reference = [("en".to_string(), 4.0), ("kjv".to_string(), 3.0)];
        BoundedReplay::new(["code"], reference, 0.05, 0.5).unwrap()
    }

    /// The statistics of step `step` over `names` (no training loss), with the
    /// last evaluation and the held-out losses given.
    fn stats<'a>(
        step: usize,
        names: &'a [String],
        last_eval: Option<LastEval<'a>>,
        held_out: Option<&'a [f64]>,
    ) -> SourceStats<'a> {
        SourceStats {
            step,
            names,
            loss: &[f64::NAN; 3],
            tokens: &[],
            source_tokens: &[1, 1, 1],
            unit: MixUnit::Tokens,
            seen: &[0, 0, 0],
            positions: &[0, 0, 0],
            sizes: &[1, 1, 1],
            weights: &[1.0, 1.0, 1.0],
            last_eval,
            held_out,
        }
    }

    /// The weights after step `step`, the last evaluation after `eval.0` with
    /// the losses `eval.1` of en and kjv.
    fn after(m: &mut BoundedReplay, step: usize, eval: Option<(usize, [f64; 2])>) -> Vec<f64> {
        let names = names();
        let metrics: BTreeMap<String, f64> = eval
            .map(|(_, [en, kjv])| {
                [
                    ("eval_en_loss".to_string(), en),
                    ("eval_kjv_loss".to_string(), kjv),
                ]
                .into()
            })
            .unwrap_or_default();
        let last_eval = eval.map(|(step, _)| LastEval {
            step,
            eval_loss: 0.0,
            metrics: &metrics,
        });
        m.weights(&stats(step, &names, last_eval, None))
    }

    #[test]
    fn replay_doubles_past_the_bound_once_per_evaluation_and_halves_back_within_it() {
        let mut m = mixer();
        let w = after(&mut m, 0, None);
        assert_eq!(w, [0.01, 0.01, 0.98], "the first share, split evenly");
        // en 6 % above its reference: past the 5 % bound.
        let drifted = Some((10, [4.24, 3.0]));
        let w = after(&mut m, 10, drifted);
        assert!((m.replay() - 0.04).abs() < 1e-12);
        // en is 1 + 0.06 / 0.05 = 2.2 times kjv's weight.
        assert!((w[0] / w[1] - 2.2).abs() < 1e-9, "{w:?}");
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // The same evaluation again moves nothing.
        after(&mut m, 11, drifted);
        assert!((m.replay() - 0.04).abs() < 1e-12);
        for step in [20, 30, 40, 50] {
            after(&mut m, step, Some((step, [4.3, 3.0])));
        }
        assert_eq!(m.replay(), 0.5, "capped at max_replay");
        // Between half the bound and the bound it stays.
        after(&mut m, 60, Some((60, [4.15, 3.0])));
        assert_eq!(m.replay(), 0.5);
        // Within half the bound it halves, down to none.
        for step in [70, 80, 90, 100, 110, 120] {
            after(&mut m, step, Some((step, [4.05, 3.0])));
        }
        assert_eq!(m.replay(), 0.0);
        assert_eq!(
            after(&mut m, 121, Some((120, [4.05, 3.0]))),
            [0.0, 0.0, 1.0]
        );
    }

    /// An evaluation that lacks an old domain's loss (here NaN for kjv) reads no
    /// drift there: it never lowers the share, and a drift seen elsewhere still
    /// raises it.
    #[test]
    fn an_evaluation_without_an_old_domains_loss_never_lowers_the_share() {
        let mut m = mixer();
        after(&mut m, 10, Some((10, [4.0, f64::NAN])));
        assert_eq!(m.replay(), BoundedReplay::FIRST_REPLAY);
        after(&mut m, 20, Some((20, [4.4, f64::NAN])));
        assert_eq!(m.replay(), 2.0 * BoundedReplay::FIRST_REPLAY);
    }

    #[test]
    fn lowered_at_the_bound_the_share_halves_as_soon_as_the_drift_is_back_within_it() {
        let mut m = mixer().with_lower_at(1.0).unwrap();
        after(&mut m, 10, Some((10, [4.3, 3.0])));
        assert_eq!(m.replay(), 0.04);
        // en 4 % above: within the bound, not within half of it.
        after(&mut m, 20, Some((20, [4.16, 3.0])));
        assert_eq!(m.replay(), 0.02, "halved within the bound");
        let mut default = mixer();
        after(&mut default, 10, Some((10, [4.3, 3.0])));
        after(&mut default, 20, Some((20, [4.16, 3.0])));
        assert_eq!(
            default.replay(),
            0.04,
            "the default waits for half the bound"
        );
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(mixer().with_lower_at(bad).is_err(), "{bad}");
        }
    }

    /// The proportional rule: each old domain's share is `gain × drift / bound`
    /// at each evaluation, up and down; a lacking loss keeps its share; the
    /// total is scaled to `max_replay`.
    #[test]
    fn under_a_gain_each_share_follows_its_domains_drift() {
        let mut m = mixer().with_gain(0.04).unwrap();
        assert_eq!(
            after(&mut m, 0, None),
            [0.0, 0.0, 1.0],
            "no replay before a drift is read"
        );
        // en 6 % above its reference, kjv 1.5 % below it.
        let w = after(&mut m, 10, Some((10, [4.24, 2.955])));
        let en = 0.04 * 0.06 / 0.05;
        assert!((w[0] - en).abs() < 1e-12 && w[1] == 0.0, "{w:?}");
        assert!((w[2] - (1.0 - en)).abs() < 1e-12 && (m.replay() - en).abs() < 1e-12);
        // en back to 2 % above, kjv at 3 %: both follow, down and up.
        let w = after(&mut m, 20, Some((20, [4.08, 3.09])));
        let (en, kjv) = (0.04 * 0.02 / 0.05, 0.04 * 0.03 / 0.05);
        assert!(
            (w[0] - en).abs() < 1e-12 && (w[1] - kjv).abs() < 1e-12,
            "{w:?}"
        );
        // An evaluation without kjv's loss keeps kjv's share.
        let w = after(&mut m, 30, Some((30, [4.0, f64::NAN])));
        assert!(w[0] == 0.0 && (w[1] - kjv).abs() < 1e-12, "{w:?}");
        // Far past the bound the total is scaled down to max_replay (0.5).
        let w = after(&mut m, 40, Some((40, [8.0, 6.0])));
        assert!(
            (w[0] + w[1] - 0.5).abs() < 1e-12 && (w[0] / w[1] - 1.0).abs() < 1e-12,
            "{w:?}"
        );
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        for bad in [0.0, -0.04, f64::NAN, f64::INFINITY] {
            assert!(mixer().with_gain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn under_a_gain_its_state_round_trips_and_shares_that_disagree_are_refused() {
        let mut m = mixer().with_gain(0.04).unwrap();
        let w = after(&mut m, 10, Some((10, [4.24, 3.09])));
        let state = m.state().unwrap();
        let mut back = mixer().with_gain(0.04).unwrap();
        back.restore(&state).unwrap();
        assert_eq!(
            after(&mut back, 11, Some((10, [4.24, 3.09]))),
            w,
            "the same weights after the resume"
        );
        let mut damaged = state.clone();
        damaged["shares"] = serde_json::json!([0.3, 0.0, 0.0]);
        assert!(mixer().with_gain(0.04).unwrap().restore(&damaged).is_err());
        damaged["shares"] = serde_json::json!([0.9, 0.0, 0.0]);
        assert!(mixer().with_gain(0.04).unwrap().restore(&damaged).is_err());
    }

    /// The start's share for the first steps, split evenly, whatever the
    /// drift; then the rule's, which read the evaluations all along.
    #[test]
    fn the_start_share_holds_for_the_first_steps_then_the_rule_decides() {
        let mut m = mixer().with_gain(0.04).unwrap().with_start(0.2, 3).unwrap();
        assert_eq!(after(&mut m, 0, None), [0.1, 0.1, 0.8]);
        assert_eq!(m.replay(), 0.2);
        let w = after(&mut m, 2, Some((2, [4.24, 3.0])));
        assert_eq!(w, [0.1, 0.1, 0.8], "the start holds past the bound");
        let w = after(&mut m, 3, Some((2, [4.24, 3.0])));
        let en = 0.04 * 0.06 / 0.05;
        assert!(
            (w[0] - en).abs() < 1e-12 && w[1] == 0.0,
            "the rule read step 2's evaluation: {w:?}"
        );
        assert!((m.replay() - en).abs() < 1e-12);
        let mut doubling = mixer().with_start(0.2, 3).unwrap();
        after(&mut doubling, 2, Some((2, [4.24, 3.0])));
        let w = after(&mut doubling, 3, None);
        assert!(
            (w[2] - 0.96).abs() < 1e-12 && m.replay() > 0.0,
            "doubled from its first share: {w:?}"
        );
        assert!((doubling.replay() - 0.04).abs() < 1e-12);
        for bad in [-0.1, 0.6, f64::NAN] {
            assert!(mixer().with_start(bad, 3).is_err(), "{bad}");
            assert!(mixer().with_finish(bad, 3).is_err(), "{bad}");
        }
    }

    /// The finish's share from its first step on, whatever the drift.
    #[test]
    fn the_finish_share_holds_from_its_first_step_to_the_end() {
        let mut m = mixer()
            .with_gain(0.04)
            .unwrap()
            .with_finish(0.0, 12)
            .unwrap();
        let w = after(&mut m, 10, Some((10, [4.24, 3.0])));
        assert!(w[0] > 0.0, "the rule decides step 11: {w:?}");
        assert_eq!(
            after(&mut m, 11, Some((10, [4.24, 3.0]))),
            [0.0, 0.0, 1.0],
            "step 12 is the finish's"
        );
        assert_eq!(m.replay(), 0.0);
        assert_eq!(after(&mut m, 40, Some((40, [4.4, 3.3]))), [0.0, 0.0, 1.0]);
        assert!(
            (m.state().unwrap()["replay"].as_f64().unwrap() - 0.04 * (0.1 + 0.1) / 0.05).abs()
                < 1e-12,
            "the rule still reads the drift"
        );
    }

    /// Under `with_held_out(5)` it asks for the held-out set after steps 5, 10,
    /// ..., reads the losses given with that step's statistics (here en 6 %
    /// past its reference: 6 % × 0.06 / 0.05) and ignores evaluations.
    #[test]
    fn on_a_held_out_set_it_asks_every_few_steps_and_reads_only_that() {
        let mut m = mixer().with_gain(0.05).unwrap().with_held_out(5).unwrap();
        assert!(mixer().with_held_out(0).is_err());
        // It needs the old sources' held-out losses alone.
        assert!(m.reads_held_out_of("en") && !m.reads_held_out_of("code"));
        let asked: Vec<usize> = (1..=12).filter(|&s| m.wants_held_out(s)).collect();
        assert_eq!(asked, [5, 10]);
        // An evaluation far past the bound is not read.
        after(&mut m, 4, Some((4, [8.0, 6.0])));
        assert_eq!(m.replay(), 0.0);
        let names = names();
        let held_out = [4.24, 3.0, 9.0];
        let w = m.weights(&stats(5, &names, None, Some(&held_out)));
        assert!((w[0] - 0.06 * 0.05 / 0.05).abs() < 1e-12, "{w:?}");
        assert_eq!(w[1], 0.0);
        assert!((m.replay() - 0.06).abs() < 1e-12);
    }

    #[test]
    fn bad_settings_and_sources_are_refused() {
        let reference = || [("en".to_string(), 4.0)];
        assert!(BoundedReplay::new(["code"], reference(), 0.0, 0.5).is_err());
        assert!(BoundedReplay::new(["code"], reference(), 0.05, 1.0).is_err());
        assert!(BoundedReplay::new(Vec::<String>::new(), reference(), 0.05, 0.5).is_err());
        assert!(BoundedReplay::new(["code"], [("en".to_string(), f64::NAN)], 0.05, 0.5).is_err());
        let m = BoundedReplay::new(["code"], reference(), 0.05, 0.5).unwrap();
        let err = m.check_sources(&names()).unwrap_err();
        assert!(err.contains("kjv"), "{err}");
        let typo = BoundedReplay::new(["cod"], reference(), 0.05, 0.5).unwrap();
        assert!(typo.check_sources(&names()).unwrap_err().contains("cod"));
        let stranger = [("en", 4.0), ("kjv", 3.0), ("eng", 4.0)].map(|(n, l)| (n.to_string(), l));
        let err = BoundedReplay::new(["code"], stranger, 0.05, 0.5)
            .unwrap()
            .check_sources(&names());
        assert!(err.unwrap_err().contains("eng"));
        assert!(mixer().check_sources(&names()).is_ok());
    }

    #[test]
    fn its_state_round_trips_and_damage_is_refused() {
        let mut m = mixer();
        after(&mut m, 10, Some((10, [4.24, 3.0])));
        let state = m.state().unwrap();
        let mut back = mixer();
        back.restore(&state).unwrap();
        assert_eq!((back.replay, back.read), (m.replay, m.read));
        assert_eq!(format!("{:?}", back.drift), format!("{:?}", m.drift));
        let mut damaged = state.clone();
        damaged["replay"] = serde_json::json!(2.0);
        assert!(mixer().restore(&damaged).is_err());
        assert!(mixer().restore(&serde_json::json!({})).is_err());
    }
}
