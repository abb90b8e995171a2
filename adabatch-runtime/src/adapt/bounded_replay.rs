//! Continual pretraining with the least replay that keeps the old domains within a
//! bound: the old domains' held-out losses, read at each evaluation (or on a small
//! held-out set the mixer asks for), against their values before the new data
//! (phase 1's), the replay share moved by that, and a closing that does not let
//! the run end with an old domain above its bound.

use super::mixer::{field, numbers, Closing, Diagnostic, Mixer, SourceStats};
use crate::error::{Error, Result, SettingsError};

/// How the replay share moves with the drift it reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    /// [`BoundedReplay::with_doubling`]: the whole share doubles past the bound
    /// and halves within `lower_at` of it.
    Doubling { lower_at: f64 },
    /// Each old domain's share: `gain × max(0, drift) / bound` plus its
    /// integral, which grows by `integral × (drift − target) / bound` at each
    /// reading (from 0, never below it); the target is `(1 − margin) × bound`.
    /// [`BoundedReplay::with_gain`] is this rule without the integral.
    Shares {
        gain: f64,
        integral: f64,
        margin: f64,
    },
}

/// A mixer for continual pretraining: the new sources take `1 − r` of each step,
/// the old ones (every source not named new) the replay share `r`. It reads
/// every old domain's held-out loss (`eval_<source>_loss` of each evaluation,
/// or the held-out set of [`Self::with_held_out`]) against the value it had
/// before the new data (`reference`, phase 1's): its drift, the relative rise.
///
/// **The default rule holds the bound by its integral and its closing.** After
/// each reading every old domain replays `gain × max(0, drift) / bound` of the
/// step (6 % at the bound: [`Self::HOLD_GAIN`]) plus its integral: the replay
/// its drift has called for so far, which grows by `integral × (drift −
/// target) / bound` at each reading ([`Self::HOLD_INTEGRAL`]) and falls back
/// (to 0, not below) while the drift is under the target, a margin inside the
/// bound ([`Self::HOLD_MARGIN`] of it). A proportional rule alone settles where
/// the drift calls for the replay that holds it: at the bound, above it on a
/// run that forgets faster; the integral keeps rising until the drift is at
/// the target. The first tenth of the run's steps replay 20 % evenly
/// ([`Self::with_start`]).
///
/// **The closing**: when the planned steps are done, it reads the model once
/// more (the engine evaluates, or reads the held-out set), and while an old
/// domain is above the bound on that reading the run goes on in rounds of
/// replay alone ([`Self::CLOSING_ROUND`] steps, at the learning rates of the
/// planned run's last steps again: a short anneal), read after each, up to a
/// cap ([`Self::CLOSING_CAP`] of the planned steps). The steps and tokens
/// spent are in the log and the summary; a run that hits the cap ends with a
/// warning. What is guaranteed is on what it reads: the validation set of the
/// evaluations, or the held-out subset, whose drift is an estimate of the whole
/// set's ([`Self::with_closing`] sets the cap and the round; 0 turns it off).
///
/// [`Self::with_gain`] is the proportional rule alone, [`Self::with_doubling`]
/// the first rule (the share doubles past the bound, halves well within it).
/// [`Self::with_start`] and [`Self::with_finish`] fix the share over the first
/// and the last steps, whatever the rule. An evaluation that lacks an old
/// domain's loss reads no drift there. Its state (the shares, the integrals,
/// the last reading, the closing) is checkpointed.
#[derive(Debug, Clone)]
pub struct BoundedReplay {
    new_sources: Vec<String>,
    reference: Vec<(String, f64)>,
    bound: f64,
    max_replay: f64,
    rule: Rule,
    replay: f64,
    /// The step of the reading last read.
    read: Option<usize>,
    /// Each source's relative rise at that reading (NaN for new ones).
    drift: Vec<f64>,
    /// Under [`Rule::Shares`], each source's share of the step (0 for new
    /// ones), kept where a reading lacks its loss.
    shares: Vec<f64>,
    /// Under [`Rule::Shares`], each source's integral.
    integral: Vec<f64>,
    /// [`Self::with_start`]: the replay share of the first steps, and how many.
    start: Option<(f64, usize)>,
    /// The default start, as a share and a fraction of the run's expected
    /// steps, until [`Mixer::plan_run`] resolves it.
    start_fraction: Option<(f64, f64)>,
    /// [`Self::with_finish`]: the replay share of the last steps, and the first of them.
    finish: Option<(f64, usize)>,
    /// The fixed share of the last weights, where a start or a finish set them.
    fixed_now: Option<f64>,
    /// [`Self::with_held_out`]: read the held-out set every so many steps, not
    /// the evaluations.
    held_out_every: Option<usize>,
    /// The closing's cap as a fraction of the planned steps (0: none), and its round.
    closing: (f64, usize),
    /// The cap in steps, once [`Mixer::plan_run`] knows the planned steps.
    closing_cap: Option<usize>,
    /// Closing steps granted so far; `Some` once the closing began.
    closing_spent: Option<usize>,
}

impl BoundedReplay {
    /// Where the doubling's share starts, and the least it is raised to from none.
    pub const FIRST_REPLAY: f64 = 0.02;
    /// The default rule's share of the step for an old domain at the bound.
    pub const HOLD_GAIN: f64 = 0.06;
    /// The default rule's integral: what a reading a whole bound above the
    /// target adds to a domain's share. Chosen on two seeds of the continual
    /// protocol among 0.06, 0.03, 0.015 and none (BENCHMARKS.md, "Continual
    /// pretraining: a bound that holds"): larger ones replayed more than the
    /// least fixed share that held the bound, as the drift's early peak (the
    /// re-warmed rate) filled the integral.
    pub const HOLD_INTEGRAL: f64 = 0.015;
    /// The default rule's target, inside the bound by this fraction of it: 0.1
    /// point at a bound of 5 %, for a reading of the validation set, the set the
    /// bound is judged on. Read on 100 held-out documents a domain, a reading
    /// differed from the validation set's at the same step by 0.04–0.29 point
    /// where it was measured: give such a reading a margin of that size.
    pub const HOLD_MARGIN: f64 = 0.02;
    /// The default start: 20 % replayed for the first tenth of the steps.
    pub const START: (f64, f64) = (0.2, 0.1);
    /// The closing's default cap, a fraction of the planned steps.
    pub const CLOSING_CAP: f64 = 0.2;
    /// The closing's default round, in steps.
    pub const CLOSING_ROUND: usize = 5;

    /// `new_sources` take what replay leaves; every other source must have its
    /// held-out loss before the new data in `reference`; `bound` is the relative
    /// rise allowed (positive), `max_replay` the most replay (in `(0, 1)`). The
    /// default rule, start and closing (see the type). A typed error for a bound
    /// or a share out of range, no new source, or a reference that is not a
    /// positive finite loss.
    pub fn new<S: Into<String>>(
        new_sources: impl IntoIterator<Item = S>,
        reference: impl IntoIterator<Item = (String, f64)>,
        bound: f64,
        max_replay: f64,
    ) -> Result<Self> {
        if !(bound.is_finite() && bound > 0.0) {
            return Err(invalid(
                "bound",
                bound,
                "a positive relative rise, e.g. 0.05",
            ));
        }
        if !(max_replay > 0.0 && max_replay < 1.0) {
            return Err(invalid(
                "max_replay",
                max_replay,
                "a share of each step in (0, 1)",
            ));
        }
        let new_sources: Vec<String> = new_sources.into_iter().map(Into::into).collect();
        if new_sources.is_empty() {
            return Err(invalid("new_sources", "none", "at least one new source"));
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
            rule: Rule::Shares {
                gain: Self::HOLD_GAIN,
                integral: Self::HOLD_INTEGRAL,
                margin: Self::HOLD_MARGIN,
            },
            replay: 0.0,
            read: None,
            drift: Vec::new(),
            shares: Vec::new(),
            integral: Vec::new(),
            start: None,
            start_fraction: Some((Self::START.0.min(max_replay), Self::START.1)),
            finish: None,
            fixed_now: None,
            held_out_every: None,
            closing: (Self::CLOSING_CAP, Self::CLOSING_ROUND),
            closing_cap: None,
            closing_spent: None,
        })
    }

    /// The default rule with other numbers: `gain` (the share at the bound),
    /// `integral` (what a reading a bound above the target adds; 0: none) and
    /// `margin` (the target's distance inside the bound, a fraction of it, in
    /// `[0, 1)`). A typed error for a number out of range.
    pub fn with_hold(mut self, gain: f64, integral: f64, margin: f64) -> Result<Self> {
        if !(integral.is_finite() && integral >= 0.0) {
            return Err(invalid(
                "integral",
                integral,
                "a share of the step from 0, e.g. 0.06",
            ));
        }
        if !(0.0..1.0).contains(&margin) {
            return Err(invalid(
                "margin",
                margin,
                "a fraction of the bound in [0, 1)",
            ));
        }
        self = self.with_gain(gain)?;
        self.rule = Rule::Shares {
            gain,
            integral,
            margin,
        };
        Ok(self)
    }

    /// The proportional rule alone: after each reading every old domain replays
    /// `gain × max(0, drift) / bound` of the step (`gain` at the bound, none
    /// while its loss is at or below its reference), their total scaled down to
    /// `max_replay` when above it. It settles where the drift calls for the
    /// replay that holds it, which on a run that forgets fast is above the
    /// bound. A typed error unless `gain` is positive and finite.
    pub fn with_gain(mut self, gain: f64) -> Result<Self> {
        if !(gain.is_finite() && gain > 0.0) {
            return Err(invalid(
                "gain",
                gain,
                "a positive share of the step at the bound, e.g. 0.06",
            ));
        }
        (self.rule, self.replay) = (
            Rule::Shares {
                gain,
                integral: 0.0,
                margin: 0.0,
            },
            0.0,
        );
        Ok(self)
    }

    /// The first rule: the share starts at [`Self::FIRST_REPLAY`]; when an old
    /// domain has risen past the bound it doubles (from 0 to
    /// [`Self::FIRST_REPLAY`]), up to `max_replay`; when all are within half the
    /// bound it halves (below half of [`Self::FIRST_REPLAY`] it is 0); in
    /// between it stays. An old domain past the bound gets more of the share:
    /// weight `1 + max(0, drift) / bound`, others 1. No start unless given.
    pub fn with_doubling(mut self) -> Self {
        self.rule = Rule::Doubling { lower_at: 0.5 };
        self.replay = Self::FIRST_REPLAY.min(self.max_replay);
        self.start_fraction = None;
        self
    }

    /// Replay `share` of each step in all, split evenly among the old domains,
    /// for the run's first `steps` steps, instead of the default start (20 % for
    /// a tenth of the steps); the rule decides from then on (the readings of
    /// the first steps are read all the same). A typed error for a share outside
    /// `[0, max_replay]`.
    pub fn with_start(mut self, share: f64, steps: usize) -> Result<Self> {
        self.start = Some((self.fixed(share, "start share")?, steps));
        self.start_fraction = None;
        Ok(self)
    }

    /// Replay `share` of each step in all, split evenly among the old domains,
    /// from step `from` (counted from 1) to the planned end; the rule decided
    /// before: for a final decay that should train the new data alone, or a
    /// fixed replay there. A typed error for a share outside `[0, max_replay]`.
    pub fn with_finish(mut self, share: f64, from: usize) -> Result<Self> {
        self.finish = Some((self.fixed(share, "finish share")?, from));
        Ok(self)
    }

    /// The closing's cap, a fraction of the planned steps (`cap` in `[0, 1]`; 0:
    /// no closing), and its round in steps (from 1). A typed error out of range.
    pub fn with_closing(mut self, cap: f64, round: usize) -> Result<Self> {
        if !(0.0..=1.0).contains(&cap) {
            return Err(invalid(
                "closing cap",
                cap,
                "a fraction of the planned steps in [0, 1]",
            ));
        }
        if round == 0 {
            return Err(invalid("closing round", round, "a number of steps from 1"));
        }
        self.closing = (cap, round);
        Ok(self)
    }

    /// A fixed share in `[0, max_replay]`, else a typed error naming it.
    fn fixed(&self, share: f64, name: &'static str) -> Result<f64> {
        if !(0.0..=self.max_replay).contains(&share) {
            return Err(invalid(
                name,
                share,
                "a replay share of each step from 0 to max_replay",
            ));
        }
        Ok(share)
    }

    /// The start's or the finish's share of the step after `step`, if it is theirs.
    fn fixed_share(&self, step: usize) -> Option<f64> {
        let start = self.start.filter(|&(_, steps)| step < steps);
        let finish = self.finish.filter(|&(_, from)| step + 1 >= from);
        start.or(finish).map(|(share, _)| share)
    }

    /// Read the old domains' losses on the run's held-out set after every
    /// `every` steps (it asks for them: [`Mixer::wants_held_out`], the first
    /// `--mixer-eval-examples` examples of each old source of the eval set)
    /// instead of the evaluations, which it then ignores. `reference` must then
    /// be each old domain's loss on that same held-out set before the new data:
    /// a subset's loss differs from the whole set's by more than a bound of a
    /// few percent. A typed error for `every` = 0.
    pub fn with_held_out(mut self, every: usize) -> Result<Self> {
        if every == 0 {
            return Err(invalid("held_out_every", every, "a number of steps from 1"));
        }
        self.held_out_every = Some(every);
        Ok(self)
    }

    /// Under [`Self::with_doubling`], halve the share once every old domain is
    /// within `fraction` of the bound (in `(0, 1]`; default 0.5). A typed error
    /// outside `(0, 1]`, or under another rule.
    pub fn with_lower_at(mut self, fraction: f64) -> Result<Self> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(invalid(
                "lower_at",
                fraction,
                "a fraction of the bound in (0, 1]",
            ));
        }
        let Rule::Doubling { lower_at } = &mut self.rule else {
            return Err(invalid(
                "lower_at",
                fraction,
                "the doubling rule's (with_doubling)",
            ));
        };
        *lower_at = fraction;
        Ok(self)
    }

    /// The replay share of the next steps (the start's or the finish's in
    /// theirs, all of it in a closing round).
    pub fn replay(&self) -> f64 {
        match self.closing_spent {
            Some(_) => 1.0,
            None => self.fixed_now.unwrap_or(self.replay),
        }
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

    /// Reads losses not read yet into each old source's drift; whether there were.
    fn read_drift(&mut self, stats: &SourceStats<'_>) -> bool {
        let Some((step, losses)) = self.unread_losses(stats) else {
            return false;
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
        true
    }

    /// The rule's move on the drift just read.
    fn decide(&mut self, names: &[String]) {
        match self.rule {
            Rule::Shares {
                gain,
                integral,
                margin,
            } => self.follow_drift(gain, integral, margin),
            Rule::Doubling { lower_at } => self.double_or_halve(names, lower_at),
        }
    }

    /// The doubling rule's move.
    fn double_or_halve(&mut self, names: &[String], lower_at: f64) {
        let old = (names.iter().zip(&self.drift)).filter(|(n, _)| !self.new_sources.contains(n));
        let (mut worst, mut unread) = (f64::NEG_INFINITY, false);
        for (_, &drift) in old {
            unread |= drift.is_nan();
            worst = worst.max(drift);
        }
        if worst > self.bound {
            self.replay = (2.0 * self.replay)
                .max(Self::FIRST_REPLAY)
                .min(self.max_replay);
        } else if worst < self.bound * lower_at && !unread {
            // A reading without some old domain's loss (an eval set of one
            // source) shows no drift there: it must not lower the replay.
            self.replay /= 2.0;
            if self.replay < Self::FIRST_REPLAY / 2.0 {
                self.replay = 0.0;
            }
        }
    }

    /// The share rule's move (NaN drifts, for new sources and old ones the
    /// reading lacks, keep their share and integral).
    fn follow_drift(&mut self, gain: f64, integral: f64, margin: f64) {
        let n = self.drift.len();
        self.shares.resize(n, 0.0);
        self.integral.resize(n, 0.0);
        let target = (1.0 - margin) * self.bound;
        for (i, &drift) in self.drift.iter().enumerate() {
            if drift.is_nan() {
                continue;
            }
            let called = self.integral[i] + integral * (drift - target) / self.bound;
            self.integral[i] = called.clamp(0.0, self.max_replay);
            self.shares[i] = gain * drift.max(0.0) / self.bound + self.integral[i];
        }
        let total: f64 = self.shares.iter().sum();
        if total > self.max_replay {
            self.shares
                .iter_mut()
                .for_each(|s| *s *= self.max_replay / total);
        }
        self.replay = total.min(self.max_replay);
    }

    /// The old domains above the bound on the last reading, as `name +x.x %`.
    fn above_bound(&self, names: &[String]) -> Vec<String> {
        (names.iter().zip(&self.drift))
            .filter(|&(_, &d)| d > self.bound)
            .map(|(name, d)| format!("{name} {:+.1} %", 100.0 * d))
            .collect()
    }

    /// Whether each source is new.
    fn is_new(&self, names: &[String]) -> Vec<bool> {
        names.iter().map(|n| self.new_sources.contains(n)).collect()
    }

    /// Every old source's weight `1 + max(0, drift) / bound` (0 for new ones).
    fn pull(&self, i: usize) -> f64 {
        let drift = self.drift.get(i).copied().filter(|d| *d > 0.0);
        1.0 + drift.unwrap_or(0.0) / self.bound
    }

    /// The weights of a step whose replay share is `share`, the old sources
    /// split by `split` (each old source's relative weight).
    fn split(is_new: &[bool], share: f64, split: impl Fn(usize) -> f64) -> Vec<f64> {
        let new_count = is_new.iter().filter(|&&n| n).count() as f64;
        let old_total: f64 = (0..is_new.len()).filter(|&i| !is_new[i]).map(&split).sum();
        // Without an old source the new ones take everything.
        let share = if old_total > 0.0 { share } else { 0.0 };
        (0..is_new.len())
            .map(|i| match is_new[i] {
                true => (1.0 - share) / new_count,
                false => share * split(i) / old_total,
            })
            .collect()
    }
}

/// A settings error naming `name`.
fn invalid(name: &'static str, value: impl ToString, expected: &'static str) -> Error {
    Error::Settings(SettingsError::invalid(name, value.to_string(), expected))
}

impl Mixer for BoundedReplay {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let read = self.read_drift(stats);
        let is_new = self.is_new(stats.names);
        if self.closing_spent.is_some() {
            return Self::split(&is_new, 1.0, |i| self.pull(i));
        }
        if read {
            self.decide(stats.names);
        }
        let has_old = is_new.iter().any(|&n| !n);
        self.fixed_now = self.fixed_share(stats.step).filter(|_| has_old);
        if let Some(share) = self.fixed_now {
            return Self::split(&is_new, share, |_| 1.0);
        }
        match self.rule {
            Rule::Shares { .. } => {
                let share = |i: usize| self.shares.get(i).copied().unwrap_or(0.0);
                let total: f64 = (0..is_new.len()).filter(|&i| !is_new[i]).map(share).sum();
                if total > 0.0 {
                    return Self::split(&is_new, total, share);
                }
                Self::split(&is_new, 0.0, |_| 1.0)
            }
            Rule::Doubling { .. } => Self::split(&is_new, self.replay, |i| self.pull(i)),
        }
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

    /// The default start's steps and the closing's cap, from the planned steps.
    fn plan_run(&mut self, expected_steps: Option<usize>) -> Option<String> {
        let mut unresolved = Vec::new();
        let at = |fraction: f64, steps: usize| (fraction * steps as f64).round() as usize;
        if let Some((share, fraction)) = self.start_fraction {
            match expected_steps {
                Some(steps) => self.start = Some((share, at(fraction, steps))),
                None => unresolved
                    .push("its start (20 % replayed for the first tenth of the steps) is off"),
            }
        }
        let (cap, _) = self.closing;
        if cap > 0.0 {
            match expected_steps {
                Some(steps) => self.closing_cap = Some(at(cap, steps).max(1)),
                None => unresolved.push("its closing (replay after the planned end while an old domain is above the bound) is off"),
            }
        }
        (!unresolved.is_empty()).then(|| {
            format!(
                "the bounded replay does not know the run's length (give a maximum of steps, epochs or tokens): {}",
                unresolved.join("; ")
            )
        })
    }

    fn closes(&self) -> bool {
        self.closing_cap.is_some()
    }

    /// While an old domain is above the bound on the reading at this step, a
    /// round of replay alone, within the cap.
    fn close(&mut self, stats: &SourceStats<'_>) -> Closing {
        self.read_drift(stats);
        let above = self.above_bound(stats.names);
        let Some(cap) = self.closing_cap.filter(|_| !above.is_empty()) else {
            return Closing::End;
        };
        let spent = self.closing_spent.unwrap_or(0);
        let above = above.join(", ");
        let bound = 100.0 * self.bound;
        if spent >= cap {
            return Closing::Capped {
                why: format!(
                    "{above} above the bound of {bound} % after {spent} closing step(s), its cap"
                ),
            };
        }
        let steps = self.closing.1.min(cap - spent);
        self.closing_spent = Some(spent + steps);
        Closing::Round {
            steps,
            why: format!("{above} above the bound of {bound} %: replay alone"),
        }
    }

    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        let mut diagnostics = vec![
            ("replay", Diagnostic::Scalar(self.replay())),
            ("drift", Diagnostic::PerSource(self.drift.clone())),
        ];
        if matches!(self.rule, Rule::Shares { integral, .. } if integral > 0.0) {
            diagnostics.push(("integral", Diagnostic::PerSource(self.integral.clone())));
        }
        if let Some(spent) = self.closing_spent {
            diagnostics.push(("closing_steps", Diagnostic::Scalar(spent as f64)));
        }
        diagnostics
    }

    fn state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "replay": self.replay,
            "read": self.read,
            "drift": self.drift,
            "shares": self.shares,
            "integral": self.integral,
            "closing_spent": self.closing_spent,
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
        let step = |key: &str| match state.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => {
                (v.as_u64().map(|n| Some(n as usize))).ok_or(format!("`{key}` is not a step"))
            }
        };
        let read = step("read")?;
        self.drift = numbers(field(state, "drift")?)?;
        // Checkpoints from before the proportional rule have no `shares`, from
        // before the integral no `integral`.
        let list = |key: &str| state.get(key).map(numbers).transpose();
        let shares = list("shares")?.unwrap_or_default();
        let integral = list("integral")?.unwrap_or_default();
        let within = |values: &[f64]| values.iter().all(|s| (0.0..=self.max_replay).contains(s));
        if !within(&shares) || !within(&integral) {
            return Err(format!(
                "`shares` {shares:?} or `integral` {integral:?} are not all within 0..={}",
                self.max_replay
            ));
        }
        let sums = (shares.iter().sum::<f64>() - replay).abs() <= 1e-9;
        if matches!(self.rule, Rule::Shares { .. }) && !sums {
            return Err(format!(
                "`shares` {shares:?} do not sum to `replay` = {replay}"
            ));
        }
        self.closing_spent = step("closing_spent")?;
        (self.replay, self.read, self.shares, self.integral) = (replay, read, shares, integral);
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
        BoundedReplay::new(["code"], reference, 0.05, 0.5)
            .unwrap()
            .with_doubling()
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
            loss: &[f64::NAN; 3],
            source_tokens: &[1, 1, 1],
            seen: &[0, 0, 0],
            positions: &[0, 0, 0],
            sizes: &[1, 1, 1],
            weights: &[1.0, 1.0, 1.0],
            last_eval,
            held_out,
            ..SourceStats::blank(step, names, MixUnit::Tokens)
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

    /// A scripted run whose drift, at each reading, moves halfway to `0.085 −
    /// 0.25 × the replay since the last`: the proportional rule alone settles
    /// at 5.3 %, above the 5 % bound; with its integral the default rule brings
    /// it under the bound by the 17th reading and on towards the target (98 %
    /// of the bound). Slowly: the closing is what holds the end.
    #[test]
    fn the_integral_holds_a_drift_that_the_proportional_rule_leaves_above_the_bound() {
        let settle = |mut m: BoundedReplay| {
            let (mut drift, mut replay, mut drifts) = (0.0, 0.0, Vec::new());
            for reading in 1..=40 {
                drift += 0.5 * (0.085 - 0.25 * replay - drift);
                let losses = [4.0 * (1.0 + drift), 3.0 * (1.0 + drift)];
                let w = after(&mut m, 10 * reading, Some((10 * reading, losses)));
                replay = w[0] + w[1];
                drifts.push(drift);
            }
            drifts
        };
        let reference = [("en".into(), 4.0), ("kjv".into(), 3.0)];
        let base = BoundedReplay::new(["code"], reference, 0.05, 0.5).unwrap();
        let following = settle(base.clone().with_gain(0.06).unwrap());
        assert!((following[39] - 0.0531).abs() < 1e-3, "{following:?}");
        let holding = settle(base);
        assert!(holding[15] > 0.05, "{holding:?}");
        assert!(holding[16..].iter().all(|&d| d < 0.05), "{holding:?}");
        assert!((holding[39] - 0.049).abs() < 2e-4, "{holding:?}");
    }

    /// Planned for 50 steps the cap is 10 closing steps, in rounds of 5: two
    /// rounds of replay alone while en stays above the bound, then the cap; a
    /// reading within the bound ends it at once. The closing is in the state.
    #[test]
    fn the_closing_replays_alone_in_rounds_until_within_the_bound_within_its_cap() {
        let names = names();
        let read = |m: &mut BoundedReplay, step, en: f64| {
            let held_out = [en, 3.0, f64::NAN];
            m.close(&stats(step, &names, None, Some(&held_out)))
        };
        let mut m = mixer().with_gain(0.06).unwrap().with_held_out(10).unwrap();
        assert!(!m.closes(), "the cap needs the planned steps");
        assert_eq!(m.plan_run(Some(50)), None);
        assert!(m.closes());
        assert_eq!(read(&mut m, 50, 4.1), Closing::End, "within the bound");
        let Closing::Round { steps: 5, why } = read(&mut m, 50, 4.3) else {
            panic!("a round")
        };
        assert!(why.contains("en +7.5 %"), "{why}");
        let w = m.weights(&stats(50, &names, None, Some(&[4.3, 3.0, f64::NAN])));
        assert_eq!(w[2], 0.0, "replay alone: {w:?}");
        assert!(w[0] > w[1] && (w[0] + w[1] - 1.0).abs() < 1e-12, "{w:?}");
        let mut resumed = mixer().with_gain(0.06).unwrap().with_held_out(10).unwrap();
        resumed.plan_run(Some(50));
        resumed.restore(&m.state().unwrap()).unwrap();
        assert!(matches!(
            read(&mut m, 55, 4.25),
            Closing::Round { steps: 5, .. }
        ));
        assert!(matches!(
            read(&mut resumed, 55, 4.25),
            Closing::Round { steps: 5, .. }
        ));
        let Closing::Capped { why } = read(&mut m, 60, 4.22) else {
            panic!("the cap")
        };
        assert!(why.contains("10 closing step(s)"), "{why}");
        assert_eq!(read(&mut resumed, 60, 4.19), Closing::End);
        let mut off = mixer().with_closing(0.0, 5).unwrap();
        assert_eq!(off.plan_run(Some(50)), None);
        assert!(!off.closes());
        assert!(mixer().with_closing(1.5, 5).is_err() && mixer().with_closing(0.2, 0).is_err());
    }

    /// Without the run's length the default start and the closing are off, and
    /// it says so.
    #[test]
    fn without_the_runs_length_it_says_what_is_off() {
        let reference = [("en".to_string(), 4.0), ("kjv".to_string(), 3.0)];
        let mut m = BoundedReplay::new(["code"], reference, 0.05, 0.5).unwrap();
        let said = m.plan_run(None).unwrap();
        assert!(said.contains("start") && said.contains("closing"), "{said}");
        assert!(!m.closes());
        assert_eq!(m.plan_run(Some(100)), None);
        assert_eq!(
            after(&mut m, 9, None),
            [0.1, 0.1, 0.8],
            "the start: 10 steps"
        );
        assert_eq!(after(&mut m, 10, None), [0.0, 0.0, 1.0]);
        assert!(m.closes());
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
