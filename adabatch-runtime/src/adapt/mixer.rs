//! Mixing weights decided while training runs: after every step a mixer sees each
//! source's statistics — the step's all-reduced per-source loss, what each source
//! has given so far — and returns the weights of the next step. Every rank runs its
//! own mixer on the same numbers, so every rank divides the next batch alike.
//!
//! [`OnlineMixer`] is a smoothed-loss softmax with an exploration floor: sources
//! whose loss stays high get more of the batch, and no source falls below the
//! floor. [`Exp3Mixer`] is Online Data Mixing (Albalak et al. 2023, arXiv
//! 2312.02406) as its paper states it: an Exp3 bandit rewarded by the training
//! loss.
//!
//! Weights are in the sources' unit ([`SourceStats::unit`]): shares of tokens for
//! `Sources::with_unit(MixUnit::Tokens)`, else of examples. Under
//! `reweight = token_count` with batches that count tokens (packed documents),
//! [`SourceStats::loss`] is nats per token, the unit of `eval_loss`.

use std::collections::BTreeMap;

/// What mixing weights are shares of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixUnit {
    /// Weights are shares of the examples (documents) of each global batch.
    #[default]
    Examples,
    /// Weights are shares of the tokens: a source of weight `w` and mean example
    /// length `L` gets examples in proportion to `w / L`, so that over a source
    /// epoch (a pass in a random order over its examples) its tokens are exactly
    /// its share; within a step, the share holds in expectation.
    Tokens,
}

/// The last evaluation as a mixer sees it.
#[derive(Debug, Clone, Copy)]
pub struct LastEval<'a> {
    /// The step after which it ran.
    pub step: usize,
    /// `eval_loss`.
    pub eval_loss: f64,
    /// `eval_<metric>` and, with an eval set of several sources,
    /// `eval_<source>_loss`.
    pub metrics: &'a BTreeMap<String, f64>,
}

impl LastEval<'_> {
    /// A metric by its logged name, or `eval_loss`.
    pub fn get(&self, name: &str) -> Option<f64> {
        match name {
            "eval_loss" => Some(self.eval_loss),
            _ => self.metrics.get(name).copied(),
        }
    }
}

/// What a mixer sees after a step, one entry per source (in source order). Before
/// the first step (`step` 0) it is asked once with no loss (all NaN), so that it
/// decides the first step's weights too.
#[derive(Debug, Clone)]
pub struct SourceStats<'a> {
    /// The step just taken.
    pub step: usize,
    /// Source names.
    pub names: &'a [String],
    /// Each source's mean loss in the step: per token under `reweight =
    /// token_count` when the batches count tokens (as `eval_loss`), else per
    /// example; NaN where it had no example in it.
    pub loss: &'a [f64],
    /// Each source's tokens (targets) in the step, when the batches count them
    /// (empty otherwise).
    pub tokens: &'a [f64],
    /// Each source's tokens in all (the sum of its examples' lengths).
    pub source_tokens: &'a [u64],
    /// What the weights are shares of.
    pub unit: MixUnit,
    /// Examples taken from each source so far.
    pub seen: &'a [usize],
    /// Examples used in each source's current epoch.
    pub positions: &'a [usize],
    /// Each source's size.
    pub sizes: &'a [usize],
    /// The weights that divided this step's batch (as given, not normalised).
    pub weights: &'a [f64],
    /// The last evaluation, if the run has an eval dataset and evaluated yet
    /// (an eval set of several sources has `eval_<source>_loss`).
    pub last_eval: Option<LastEval<'a>>,
    /// Each source's loss on the run's held-out set, evaluated after this step
    /// because the mixer asked ([`Mixer::wants_held_out`]); in the unit of
    /// [`SourceStats::loss`], NaN for a source it does not read
    /// ([`Mixer::reads_held_out_of`]). `None` on the other steps.
    pub held_out: Option<&'a [f64]>,
    /// Each source's gradient statistics, measured inside this step because the
    /// mixer asked ([`Mixer::wants_source_gradients`]); `None` on the other steps.
    pub source_gradients: Option<&'a [SourceGradient]>,
}

#[cfg(test)]
impl<'a> SourceStats<'a> {
    /// Step `step` of `names` in `unit`, nothing counted or measured: a test's
    /// base, its fields set over it.
    pub(crate) fn blank(step: usize, names: &'a [String], unit: MixUnit) -> Self {
        Self {
            step,
            names,
            loss: &[],
            tokens: &[],
            source_tokens: &[],
            unit,
            seen: &[],
            positions: &[],
            sizes: &[],
            weights: &[],
            last_eval: None,
            held_out: None,
            source_gradients: None,
        }
    }
}

/// One source's gradient statistics in a step, measured on the step's own
/// examples (the engine splits each source's examples of the step into two
/// halves, its first half in the step's order and its second, the same on any
/// number of ranks). In the unit of [`SourceStats::loss`]: per example, or per
/// token under `reweight = token_count`. NaN for a source with fewer than two
/// examples in the step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceGradient {
    /// `|g_k|²`, the squared norm of the source's mean gradient: `⟨ĝ_a, ĝ_b⟩`
    /// of its two halves' mean gradients, unbiased (and so negative at times
    /// when the source's gradient is small against its noise).
    pub grad_sq: f64,
    /// `σ_k²`, the trace of the covariance of one example's (token's) gradient:
    /// `|ĝ_a − ĝ_b|² / (1/n_a + 1/n_b)`, unbiased.
    pub grad_var: f64,
    /// The source's examples (tokens under `token_count`) in the step, `n_k`.
    pub size: f64,
    /// The source's mean loss in the step (as [`SourceStats::loss`]).
    pub loss: f64,
}

/// Decides the mixing weights of the next step. Weights must be finite, >= 0 and
/// not all 0 (else the run stops with a typed error naming the step); they are
/// normalised by the engine. A zero weight pauses a source without stalling the run.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an adabatch mixer",
    label = "the `#[mixer]` field must implement `adabatch::Mixer`",
    note = "implement `adabatch::Mixer for {Self}`: `fn weights(&mut self, stats: &SourceStats) -> Vec<f64>`, or use `adabatch::OnlineMixer`, `adabatch::Exp3Mixer` or `adabatch::CurriculumMixer`"
)]
pub trait Mixer: Send {
    /// The weights of the next step.
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64>;
    /// Checks the run's sources before the first step (a source the mixer names
    /// must be one of them); an error stops the run before it trains
    /// (`SettingsError::MixerSources`). The default accepts any.
    fn check_sources(&self, names: &[String]) -> Result<(), String> {
        let _ = names;
        Ok(())
    }
    /// Whether it wants each source's loss on the run's held-out set after step
    /// `step` (the step just taken, from 1). The engine then evaluates that set
    /// (`--mixer-eval-examples` examples of each source of the eval set, the same
    /// ones at every request), every example once across the ranks, and hands
    /// the losses to this step's [`Mixer::weights`] in [`SourceStats::held_out`];
    /// it counts their tokens and seconds in the logs and the summary. The
    /// default: never.
    fn wants_held_out(&self, step: usize) -> bool {
        let _ = step;
        false
    }
    /// Whether it wants each source's gradient statistics measured inside step
    /// `step` (the step about to be trained, from 1). The engine then splits the
    /// step's examples by source, all-reduces their gradients with the step's
    /// (the update stays the step's own: the same examples, the same weighting),
    /// and hands the statistics to this step's [`Mixer::weights`] in
    /// [`SourceStats::source_gradients`]; it counts the measuring steps and
    /// their seconds in the summary. Ask on a cadence of steps, never the clock:
    /// the run stays reproducible. The default: never.
    fn wants_source_gradients(&self, step: usize) -> bool {
        let _ = step;
        false
    }
    /// Whether its held-out requests need `source`'s loss (asked once per source
    /// before the first step). The engine leaves a source it does not need out
    /// of the held-out set, and hands NaN for its loss. The default: every
    /// source's.
    fn reads_held_out_of(&self, source: &str) -> bool {
        let _ = source;
        true
    }
    /// What the mixer based its last weights on, for the logs (a step's `mixer`
    /// record, TensorBoard's `mixer/...` scalars): named numbers per source, per
    /// pair of sources, or one number. The default: nothing.
    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        Vec::new()
    }
    /// The mixer's state, for checkpoints (its `controllers.mixer` entry); `None`
    /// (the default): nothing.
    fn state(&self) -> Option<serde_json::Value> {
        None
    }
    /// Continues from a checkpoint's [`Mixer::state`]; a state it cannot read is
    /// an error (the run refuses the checkpoint, naming the entry). Checkpoints
    /// of older versions hand the built-in mixers their bare list of numbers.
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        let _ = state;
        Ok(())
    }
    /// Told once, before the first step, that a [`ReplayBudget`](crate::ReplayBudget)
    /// caps the share of every source not in `new_sources` at `budget` of each
    /// step: a mixer that trains on mixtures of its own choosing to measure them
    /// (Aioli's probes) keeps them within it, so that what it measures is not
    /// flattened by the cap. The default: nothing.
    fn keep_old_share_within(&mut self, new_sources: &[String], budget: f64) {
        let _ = (new_sources, budget);
    }
    /// Told once, before the first step of a fresh or a resumed run, how many
    /// optimizer steps the run is expected to take (`--max-steps`, else its
    /// examples or tokens over the first global batch; `None` when its length
    /// is not known ahead). A setting given as a share of the run is resolved
    /// here; when it cannot be, the mixer says what it did instead, and the
    /// engine logs it as a warning. The default: nothing.
    fn plan_run(&mut self, expected_steps: Option<usize>) -> Option<String> {
        let _ = expected_steps;
        None
    }
    /// Whether it may ask for steps after the run's planned end ([`Mixer::close`]).
    /// The engine then reads the model at the planned end for it: an evaluation
    /// of the eval set (unless one ran at that step) and, with a held-out set,
    /// the held-out losses of the sources it reads. The default: it never does.
    fn closes(&self) -> bool {
        false
    }
    /// Asked when the run's planned steps are done, and again after every
    /// closing round it asked for, with the reading at that step in `stats`
    /// (`last_eval` taken at `stats.step`, `held_out` when the run has a
    /// held-out set; no step loss): [`Closing::Round`] adds steps, trained on its
    /// next [`Mixer::weights`] (asked right after, with the same `stats`) at the
    /// learning rates of the planned run's last steps again. Only asked when
    /// [`Mixer::closes`]. The engine sets no cap of its own: the mixer bounds
    /// its rounds (as [`crate::BoundedReplay`] does). The default: the run ends.
    fn close(&mut self, stats: &SourceStats<'_>) -> Closing {
        let _ = stats;
        Closing::End
    }
}

/// What a mixer asks for at the run's planned end ([`Mixer::close`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Closing {
    /// The run ends.
    End,
    /// `steps` more steps (from 1), then the mixer is asked again; `why` is
    /// logged.
    Round {
        /// Steps of the round.
        steps: usize,
        /// What called for them, for the log.
        why: String,
    },
    /// The run ends short of what the mixer wanted (its cap spent): `why` is
    /// logged as a warning and the summary says so.
    Capped {
        /// What it wanted and could not have.
        why: String,
    },
}

/// The shares the step trained on: `weights` (the step's, as given) normalised,
/// or `proposed` when they are not usable (none given, another length, not a
/// positive finite sum).
pub(super) fn trained_shares(weights: &[f64], proposed: &[f64]) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    if weights.len() == proposed.len() && total.is_finite() && total > 0.0 {
        weights.iter().map(|w| w / total).collect()
    } else {
        proposed.to_vec()
    }
}

/// One of a mixer's [`Mixer::diagnostics`].
#[derive(Debug, Clone, PartialEq)]
pub enum Diagnostic {
    /// A number per source, in source order.
    PerSource(Vec<f64>),
    /// A number per pair of sources, row-major: `[i·m + j]` for sources `i`, `j`
    /// (a mixing law's `A[i][j]`: what source `j`'s data does to `i`'s loss).
    PerPair(Vec<f64>),
    /// One number.
    Scalar(f64),
}

/// A list of numbers in a mixer's state (`null` for NaN, as JSON writes it).
pub(super) fn numbers(value: &serde_json::Value) -> Result<Vec<f64>, String> {
    let list = value
        .as_array()
        .ok_or_else(|| format!("expected a list of numbers, found {value}"))?;
    list.iter()
        .map(|v| match v {
            serde_json::Value::Null => Ok(f64::NAN),
            v => v.as_f64().ok_or_else(|| format!("{v} is not a number")),
        })
        .collect()
}

/// `state[key]`, or an error naming the key.
pub(super) fn field<'v>(
    state: &'v serde_json::Value,
    key: &str,
) -> Result<&'v serde_json::Value, String> {
    state.get(key).ok_or_else(|| format!("has no `{key}`"))
}

/// A mixer chosen at run time (`--mixer exp3`) behind one `#[mixer]` field.
impl Mixer for Box<dyn Mixer> {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        (**self).weights(stats)
    }
    fn check_sources(&self, names: &[String]) -> Result<(), String> {
        (**self).check_sources(names)
    }
    fn wants_held_out(&self, step: usize) -> bool {
        (**self).wants_held_out(step)
    }
    fn reads_held_out_of(&self, source: &str) -> bool {
        (**self).reads_held_out_of(source)
    }
    fn wants_source_gradients(&self, step: usize) -> bool {
        (**self).wants_source_gradients(step)
    }
    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        (**self).diagnostics()
    }
    fn state(&self) -> Option<serde_json::Value> {
        (**self).state()
    }
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        (**self).restore(state)
    }
    fn keep_old_share_within(&mut self, new_sources: &[String], budget: f64) {
        (**self).keep_old_share_within(new_sources, budget)
    }
    fn plan_run(&mut self, expected_steps: Option<usize>) -> Option<String> {
        (**self).plan_run(expected_steps)
    }
    fn closes(&self) -> bool {
        (**self).closes()
    }
    fn close(&mut self, stats: &SourceStats<'_>) -> Closing {
        (**self).close(stats)
    }
}

/// A mixer that is a function (`mix = custom(path::to::fn)`): the weights of the
/// next step from the statistics of the last, no state of its own.
pub type MixFn = for<'a> fn(&SourceStats<'a>) -> Vec<f64>;

/// A [`MixFn`] as a [`Mixer`].
#[derive(Debug, Clone, Copy)]
pub struct FnMixer(pub MixFn);

impl Mixer for FnMixer {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        (self.0)(stats)
    }
}

/// Weights ∝ exp(smoothed loss / temperature), mixed with a uniform floor:
/// `w_s = (1 − floor)·softmax(ℓ̄ / T)_s + floor / S`, where `ℓ̄_s` is an
/// exponential moving average (factor `smoothing`) of source `s`'s step losses.
/// A source not yet seen keeps the floor plus an equal share.
///
/// With a warm-up it trains at equal shares for the warm-up's steps, averaging
/// the losses all the while, and tilts after. By default the warm-up is 40 % of
/// the run's expected steps, at temperature 1.5: the measured best
/// ([`adabatch_rules::mixer`]); [`OnlineMixer::with_warmup`] gives it in steps.
#[derive(Debug, Clone)]
pub struct OnlineMixer {
    temperature: f64,
    floor: f64,
    smoothing: f64,
    warmup: MixWarmup,
    /// The warm-up in steps: given, or resolved by [`Mixer::plan_run`].
    warmup_steps: usize,
    smoothed: Vec<f64>,
}

/// How long a mixer trains at equal shares before it tilts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MixWarmup {
    /// This many steps.
    Steps(usize),
    /// This share of the run's expected steps, in `[0, 1]` (resolved before the
    /// first step; a run of unknown length warms up for 0 steps, with a warning).
    Fraction(f64),
}

impl Default for MixWarmup {
    /// [`adabatch_rules::mixer::WARMUP_FRACTION`] of the run.
    fn default() -> Self {
        Self::Fraction(adabatch_rules::mixer::WARMUP_FRACTION)
    }
}

impl OnlineMixer {
    /// The default warm-up's share of the run ([`adabatch_rules::mixer::WARMUP_FRACTION`]).
    pub const DEFAULT_WARMUP_FRACTION: f64 = adabatch_rules::mixer::WARMUP_FRACTION;

    /// `temperature > 0`, `floor` in `[0, 1]`, `smoothing` in `[0, 1)` (the rules
    /// `mix = online(..)` is checked by at compile time); other values are a
    /// [`SettingsError::InvalidMixer`](crate::SettingsError::InvalidMixer).
    pub fn new(temperature: f64, floor: f64, smoothing: f64) -> crate::error::Result<Self> {
        adabatch_rules::mixer::check(temperature, floor, smoothing)
            .map_err(|broken| crate::error::SettingsError::mixer_rule("online", broken))?;
        Ok(Self::checked(temperature, floor, smoothing))
    }

    /// From values that passed [`adabatch_rules::mixer::check`].
    pub(crate) fn checked(temperature: f64, floor: f64, smoothing: f64) -> Self {
        Self {
            temperature,
            floor,
            smoothing,
            warmup: MixWarmup::default(),
            warmup_steps: 0,
            smoothed: Vec::new(),
        }
    }

    /// The same mixer at another temperature, checked as [`OnlineMixer::new`].
    pub fn with_temperature(self, temperature: f64) -> crate::error::Result<Self> {
        adabatch_rules::mixer::temperature(temperature)
            .map_err(|broken| crate::error::SettingsError::mixer_rule("online", broken))?;
        Ok(Self {
            temperature,
            ..self
        })
    }

    /// Equal shares for the first `steps` steps. Early losses fall together and
    /// say little about which domain needs data, and equal weights draw exactly
    /// the batches `uniform` draws, so a run differs from uniform's only by the
    /// tilt that follows (a change of one document early moves a small model's
    /// end by a few hundredths of a nat). No state of its own: the step decides.
    pub fn with_warmup(mut self, steps: usize) -> Self {
        (self.warmup, self.warmup_steps) = (MixWarmup::Steps(steps), steps);
        self
    }

    /// Equal shares for `fraction` of the run's expected steps (the default is
    /// [`adabatch_rules::mixer::WARMUP_FRACTION`]); a typed error outside `[0, 1]`.
    pub fn with_warmup_fraction(mut self, fraction: f64) -> crate::error::Result<Self> {
        adabatch_rules::mixer::warmup_fraction(fraction)
            .map_err(|broken| crate::error::SettingsError::mixer_rule("online", broken))?;
        (self.warmup, self.warmup_steps) = (MixWarmup::Fraction(fraction), 0);
        Ok(self)
    }

    /// The warm-up as given, [`MixWarmup::Steps`] or [`MixWarmup::Fraction`].
    pub fn with_mix_warmup(self, warmup: MixWarmup) -> crate::error::Result<Self> {
        match warmup {
            MixWarmup::Steps(steps) => Ok(self.with_warmup(steps)),
            MixWarmup::Fraction(fraction) => self.with_warmup_fraction(fraction),
        }
    }

    /// The warm-up from a value that passed the rules.
    pub(crate) fn with_checked_warmup(mut self, warmup: MixWarmup) -> Self {
        self.warmup = warmup;
        self.warmup_steps = match warmup {
            MixWarmup::Steps(steps) => steps,
            MixWarmup::Fraction(_) => 0,
        };
        self
    }

    /// The warm-up in steps, as resolved (0 before [`Mixer::plan_run`] for one
    /// given as a share of the run).
    pub fn warmup_steps(&self) -> usize {
        self.warmup_steps
    }

    /// The smoothed losses so far (NaN where a source has not been seen).
    pub fn smoothed_losses(&self) -> &[f64] {
        &self.smoothed
    }
}

impl Default for OnlineMixer {
    /// Temperature 1.5, a 5 % floor, smoothing 0.9, equal shares for the first
    /// 40 % of the run: `mix = online`'s defaults ([`adabatch_rules::mixer`]).
    fn default() -> Self {
        use adabatch_rules::mixer::{FLOOR, SMOOTHING, TEMPERATURE};
        Self::checked(TEMPERATURE, FLOOR, SMOOTHING)
    }
}

impl Mixer for OnlineMixer {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let n = stats.loss.len();
        self.smoothed.resize(n, f64::NAN);
        for (avg, &loss) in self.smoothed.iter_mut().zip(stats.loss) {
            if loss.is_finite() {
                *avg = if avg.is_nan() {
                    loss
                } else {
                    self.smoothing * *avg + (1.0 - self.smoothing) * loss
                };
            }
        }
        // `stats.step` is the step just taken; these weights are the next one's.
        if stats.step < self.warmup_steps {
            return vec![1.0; n];
        }
        let seen: Vec<f64> = self
            .smoothed
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        if seen.is_empty() {
            return vec![1.0; n];
        }
        // Unseen sources count as the mean of the seen ones.
        let mean = seen.iter().sum::<f64>() / seen.len() as f64;
        let scores: Vec<f64> = self
            .smoothed
            .iter()
            .map(|v| if v.is_finite() { *v } else { mean } / self.temperature)
            .collect();
        let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
        let total: f64 = exp.iter().sum();
        exp.iter()
            .map(|e| (1.0 - self.floor) * e / total + self.floor / n as f64)
            .collect()
    }

    /// The smoothed losses.
    fn state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "smoothed": self.smoothed }))
    }

    /// A warm-up given as a share of the run becomes that share of the expected
    /// steps (rounded); with no expected length, 0 steps, said.
    fn plan_run(&mut self, expected_steps: Option<usize>) -> Option<String> {
        let MixWarmup::Fraction(fraction) = self.warmup else {
            return None;
        };
        match expected_steps {
            Some(steps) => {
                self.warmup_steps = (fraction * steps as f64).round() as usize;
                None
            }
            None if fraction == 0.0 => None,
            None => {
                self.warmup_steps = 0;
                Some(format!(
                    "the online mixer's warm-up is {:.0} % of the run, but the run's length is not known ahead: it tilts from the first step (give the warm-up in steps: `OnlineMixer::with_warmup(n)`, `online(warmup = n)`)",
                    fraction * 100.0
                ))
            }
        }
    }

    /// The smoothed losses the softmax read.
    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        vec![(
            "smoothed_loss",
            Diagnostic::PerSource(self.smoothed.clone()),
        )]
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        self.smoothed = match state {
            serde_json::Value::Array(_) => numbers(state)?,
            _ => numbers(field(state, "smoothed")?)?,
        };
        Ok(())
    }
}

/// Online Data Mixing (Albalak, Pan, Raffel and Wang 2023, arXiv 2312.02406,
/// Algorithm 1): each source is an arm of an Exp3 bandit whose reward is the
/// training loss on it. At step `t` (counting from 1) with `K` sources:
///
/// - exploration `ε_t = min(1/K, √(ln K / (K·t)))`;
/// - weights `π_t(s) = (1 − K·ε_t)·softmax(ε_{t−1}·R̂)_s + ε_t`;
/// - after the step, for every source `s` that had examples in it, the
///   importance-weighted reward `R̂_s ← α·R̂_s + (1 − α)·ℓ_s / π_t(s)` (ℓ_s its
///   loss in the step, per token under `token_count`), others unchanged. `π_t`
///   is the share the step trained on ([`SourceStats::weights`], normalised):
///   under a [`ReplayBudget`](crate::ReplayBudget) the capped one, not the
///   bandit's own proposal.
///
/// The paper draws one source per batch and rewards it alone; here every step's
/// batch mixes the sources by `π_t` (the paper's "mixed minibatch" variant) and
/// every source present is rewarded by its own loss, divided by its probability
/// as the paper's estimator is. `α` (the paper's smoothing, 0.9 by default)
/// keeps the reward a moving average, so a source's recent losses count most.
/// `ε_0 = 1/K`: the first step mixes uniformly.
#[derive(Debug, Clone)]
pub struct Exp3Mixer {
    smoothing: f64,
    rewards: Vec<f64>,
    /// Steps whose losses were seen (`t − 1` when deciding step `t`).
    steps: usize,
    /// The weights of the step the next losses come from.
    last: Vec<f64>,
}

impl Exp3Mixer {
    /// Smoothing `α` in `[0, 1)` (clamped into range).
    pub fn new(smoothing: f64) -> Self {
        Self {
            smoothing: if smoothing.is_finite() {
                smoothing.clamp(0.0, 0.999)
            } else {
                0.9
            },
            rewards: Vec::new(),
            steps: 0,
            last: Vec::new(),
        }
    }

    /// `ε_t` for `k` sources (`t = 0`: `1/K`).
    pub fn exploration(k: usize, t: usize) -> f64 {
        let k = k.max(1) as f64;
        if t == 0 || k < 2.0 {
            return 1.0 / k;
        }
        (1.0 / k).min((k.ln() / (k * t as f64)).sqrt())
    }

    /// The smoothed importance-weighted rewards `R̂`.
    pub fn rewards(&self) -> &[f64] {
        &self.rewards
    }

    fn distribution(&self, k: usize) -> Vec<f64> {
        let t = self.steps + 1;
        let (eps, eps_before) = (Self::exploration(k, t), Self::exploration(k, t - 1));
        let scores: Vec<f64> = self.rewards.iter().map(|r| eps_before * r).collect();
        let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
        let total: f64 = exp.iter().sum();
        exp.iter()
            .map(|e| (1.0 - k as f64 * eps) * e / total + eps)
            .collect()
    }
}

impl Default for Exp3Mixer {
    /// `α = 0.9`.
    fn default() -> Self {
        Self::new(0.9)
    }
}

impl Mixer for Exp3Mixer {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let k = stats.loss.len();
        self.rewards.resize(k, 0.0);
        if stats.loss.iter().any(|l| l.is_finite()) && self.last.len() == k {
            let trained = trained_shares(stats.weights, &self.last);
            for ((reward, &loss), &p) in self.rewards.iter_mut().zip(stats.loss).zip(&trained) {
                if loss.is_finite() && p > 0.0 {
                    *reward = self.smoothing * *reward + (1.0 - self.smoothing) * loss / p;
                }
            }
            self.steps += 1;
        }
        self.last = self.distribution(k);
        self.last.clone()
    }

    /// The smoothed importance-weighted rewards and the exploration `ε_t` of
    /// the weights last given.
    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        let k = self.rewards.len();
        vec![
            ("rewards", Diagnostic::PerSource(self.rewards.clone())),
            (
                "exploration",
                Diagnostic::Scalar(Self::exploration(k, self.steps + 1)),
            ),
        ]
    }

    /// The step count, the last weights and the rewards.
    fn state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "steps": self.steps,
            "last": self.last,
            "rewards": self.rewards,
        }))
    }

    /// Also reads the older layout: the step count, the last weights, then the
    /// rewards, in one list.
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        if state.is_array() {
            let all = numbers(state)?;
            let Some((&steps, rest)) = all.split_first() else {
                return Err("is an empty list".into());
            };
            let (last, rewards) = rest.split_at(rest.len() / 2);
            (self.steps, self.last, self.rewards) =
                (steps as usize, last.to_vec(), rewards.to_vec());
            return Ok(());
        }
        let steps = field(state, "steps")?;
        self.steps = steps
            .as_u64()
            .ok_or_else(|| format!("`steps` is {steps}, not a count"))?
            as usize;
        self.last = numbers(field(state, "last")?)?;
        self.rewards = numbers(field(state, "rewards")?)?;
        if self.last.len() != self.rewards.len() {
            return Err(format!(
                "has {} weights for {} rewards",
                self.last.len(),
                self.rewards.len()
            ));
        }
        Ok(())
    }
}

/// Weights scheduled over the examples consumed (a curriculum): linear between
/// `(examples, weights)` points, constant before the first and after the last.
/// It keeps no state of its own (the examples consumed travel in the checkpoint),
/// so a resumed run continues the same curriculum.
#[derive(Debug, Clone)]
pub struct CurriculumMixer {
    points: Vec<(usize, Vec<f64>)>,
}

impl CurriculumMixer {
    /// Points in strictly increasing order of examples, each with one weight per
    /// source (finite, >= 0, not all 0); otherwise a typed error.
    pub fn new(points: Vec<(usize, Vec<f64>)>) -> crate::error::Result<Self> {
        let bad = |reason: String| {
            crate::error::Error::Data(crate::error::DataError::InvalidMixWeights {
                step: 0,
                reason,
            })
        };
        let Some(sources) = points.first().map(|p| p.1.len()) else {
            return Err(bad("a curriculum needs at least one point".into()));
        };
        for (i, (at, weights)) in points.iter().enumerate() {
            if weights.len() != sources {
                return Err(bad(format!(
                    "point {i} has {} weights, point 0 has {sources}",
                    weights.len()
                )));
            }
            if let Err(broken) = adabatch_rules::mixer::weights(weights) {
                return Err(bad(format!("point {i}: weights {weights:?}: {broken}")));
            }
            if i > 0 && *at <= points[i - 1].0 {
                return Err(bad(format!(
                    "point {i} at {at} examples does not come after {}",
                    points[i - 1].0
                )));
            }
        }
        Ok(Self { points })
    }

    /// The weights after `consumed` examples.
    pub fn at(&self, consumed: usize) -> Vec<f64> {
        let after = self.points.partition_point(|(at, _)| *at <= consumed);
        match (after.checked_sub(1), self.points.get(after)) {
            (None, _) => self.points[0].1.clone(),
            (Some(i), None) => self.points[i].1.clone(),
            (Some(i), Some((to_at, to))) => {
                let (from_at, from) = &self.points[i];
                let t = (consumed - from_at) as f64 / (to_at - from_at) as f64;
                from.iter().zip(to).map(|(a, b)| a + (b - a) * t).collect()
            }
        }
    }
}

impl Mixer for CurriculumMixer {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        self.at(stats.seen.iter().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default warm-up is 40 % of the run's expected steps at 1.5 nats (the
    /// measured best); a run of unknown length tilts from the first step and
    /// says so; a warm-up in steps stands as given.
    #[test]
    fn the_default_warm_up_is_a_share_of_the_expected_steps() {
        let mut planned = OnlineMixer::default();
        assert_eq!(planned.plan_run(Some(250)), None);
        assert_eq!((planned.warmup_steps(), planned.temperature), (100, 1.5));
        let mut unknown = OnlineMixer::default();
        let notice = unknown
            .plan_run(None)
            .expect("a run of unknown length is told of");
        assert!(
            notice.contains("40 %") && notice.contains("with_warmup"),
            "{notice}"
        );
        assert_eq!(unknown.warmup_steps(), 0);
        let mut steps = OnlineMixer::default().with_warmup(7);
        assert_eq!((steps.plan_run(Some(250)), steps.warmup_steps()), (None, 7));
        let mut share = OnlineMixer::default().with_warmup_fraction(0.1).unwrap();
        assert_eq!((share.plan_run(Some(25)), share.warmup_steps()), (None, 3));
        assert!(OnlineMixer::default().with_warmup_fraction(1.5).is_err());
        // Equal shares through the warm-up, whatever the losses.
        let names: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let mut stats = stats(&names, &[9.0, 1.0]);
        stats.step = 99;
        assert_eq!(planned.weights(&stats), [1.0, 1.0]);
        stats.step = 100;
        assert!(planned.weights(&stats)[0] > 0.5);
    }

    fn stats<'a>(names: &'a [String], loss: &'a [f64]) -> SourceStats<'a> {
        SourceStats {
            loss,
            source_tokens: &[10, 10],
            seen: &[0, 0],
            positions: &[0, 0],
            sizes: &[10, 10],
            weights: &[1.0, 1.0],
            ..SourceStats::blank(1, names, MixUnit::Examples)
        }
    }

    /// Answers every method with something no default gives.
    struct Distinct;

    impl Mixer for Distinct {
        fn weights(&mut self, _: &SourceStats<'_>) -> Vec<f64> {
            vec![7.0]
        }
        fn check_sources(&self, _: &[String]) -> Result<(), String> {
            Err("checked".into())
        }
        fn wants_held_out(&self, step: usize) -> bool {
            step == 3
        }
        fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
            vec![("d", Diagnostic::Scalar(1.0))]
        }
        fn state(&self) -> Option<serde_json::Value> {
            Some(serde_json::json!(1))
        }
        fn restore(&mut self, _: &serde_json::Value) -> Result<(), String> {
            Err("restored".into())
        }
    }

    /// A mixer chosen at run time answers through its box as itself: every
    /// method is passed on (a default left in the box's impl would answer
    /// instead, silently).
    #[test]
    fn a_boxed_mixer_passes_every_method_on() {
        let mut boxed: Box<dyn Mixer> = Box::new(Distinct);
        let names = vec!["a".to_string(), "b".to_string()];
        assert_eq!(boxed.weights(&stats(&names, &[1.0, 1.0])), vec![7.0]);
        assert_eq!(boxed.check_sources(&names), Err("checked".into()));
        assert!(boxed.wants_held_out(3) && !boxed.wants_held_out(2));
        assert_eq!(boxed.diagnostics().len(), 1);
        assert_eq!(boxed.state(), Some(serde_json::json!(1)));
        assert_eq!(boxed.restore(&serde_json::json!(1)), Err("restored".into()));
    }

    #[test]
    fn exp3_follows_the_papers_update() {
        let names = vec!["a".to_string(), "b".to_string()];
        let mut mixer = Exp3Mixer::new(0.5);
        // Before any loss: ε_0 = 1/K, uniform.
        let first = mixer.weights(&stats(&names, &[f64::NAN, f64::NAN]));
        assert_eq!(first, [0.5, 0.5]);
        // t = 1 seen: R̂ = 0.5·0 + 0.5·ℓ/π = (2, 1); deciding t = 2:
        // ε_2 = min(1/2, √(ln 2 / 4)) = 0.4163, ε_1 = min(1/2, √(ln 2 / 2)) = 0.5.
        let w = mixer.weights(&stats(&names, &[2.0, 1.0]));
        assert_eq!(mixer.rewards(), &[2.0, 1.0]);
        let (e2, e1) = ((2f64.ln() / 4.0).sqrt(), 0.5);
        let soft_a = (e1 * 2.0f64).exp() / ((e1 * 2.0f64).exp() + (e1 * 1.0f64).exp());
        let want_a = (1.0 - 2.0 * e2) * soft_a + e2;
        assert!((w[0] - want_a).abs() < 1e-12, "{w:?} vs {want_a}");
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(w[0] > w[1], "the higher loss earns more");
        // Its state round-trips: a restored mixer decides alike.
        let mut other = Exp3Mixer::new(0.5);
        other.restore(&mixer.state().unwrap()).unwrap();
        let next = stats(&names, &[1.5, f64::NAN]);
        assert_eq!(other.weights(&next), mixer.weights(&next));
        // A source absent from the step keeps its reward.
        assert_eq!(mixer.rewards()[1], 1.0);
    }

    #[test]
    fn exp3_exploration_decays_as_the_paper_says() {
        assert_eq!(Exp3Mixer::exploration(3, 0), 1.0 / 3.0);
        assert_eq!(Exp3Mixer::exploration(3, 1), 1.0 / 3.0);
        let t = 1000;
        let want = (3f64.ln() / (3.0 * t as f64)).sqrt();
        assert!((Exp3Mixer::exploration(3, t) - want).abs() < 1e-15);
    }

    #[test]
    fn the_harder_source_gets_more_and_the_floor_holds() {
        let names = vec!["a".to_string(), "b".to_string()];
        let mut mixer = OnlineMixer::new(1.0, 0.1, 0.0).unwrap();
        let w = mixer.weights(&stats(&names, &[2.0, 0.0]));
        // softmax(2, 0) = (0.881, 0.119); 0.9 of it plus 0.05 each.
        assert!((w[0] - (0.9 * 0.880_797 + 0.05)).abs() < 1e-5, "{w:?}");
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let w = mixer.weights(&stats(&names, &[100.0, 0.0]));
        assert!(w[1] >= 0.05 - 1e-12, "the floor: {w:?}");
    }

    #[test]
    fn a_higher_temperature_is_nearer_uniform() {
        let names = vec!["a".to_string(), "b".to_string()];
        let at = |t: f64| {
            let mut mixer = OnlineMixer::default().with_temperature(t).unwrap();
            mixer.weights(&stats(&names, &[2.0, 0.0]))
        };
        // 0.95 · softmax(2/T, 0) + 0.025: T = 2 gives softmax(1, 0) = 0.731.
        assert!((at(2.0)[0] - (0.95 * 0.731_059 + 0.025)).abs() < 1e-5);
        assert!(at(4.0)[0] < at(2.0)[0] && at(2.0)[0] < at(1.0)[0]);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                OnlineMixer::default().with_temperature(bad).is_err(),
                "{bad}"
            );
        }
        // The other settings stay.
        let warm = OnlineMixer::default().with_warmup(7).with_temperature(2.0);
        assert_eq!(warm.unwrap().warmup_steps, 7);
    }

    #[test]
    fn a_warm_up_keeps_equal_shares_and_learns_meanwhile() {
        let names = vec!["a".to_string(), "b".to_string()];
        let mut warm = OnlineMixer::new(1.0, 0.0, 0.5).unwrap().with_warmup(3);
        let mut cold = OnlineMixer::new(1.0, 0.0, 0.5).unwrap();
        let at = |step, loss: &'static [f64]| SourceStats {
            step,
            ..stats(&names, loss)
        };
        for step in 1..3 {
            assert_eq!(warm.weights(&at(step, &[2.0, 0.0])), [1.0, 1.0], "{step}");
            cold.weights(&at(step, &[2.0, 0.0]));
        }
        // Step 3's weights are step 4's: the warm-up's 3 steps are over, and the
        // losses averaged meanwhile are the cold mixer's.
        assert_eq!(
            warm.weights(&at(3, &[0.0, 0.0])),
            cold.weights(&at(3, &[0.0, 0.0]))
        );
        assert_eq!(warm.smoothed_losses(), cold.smoothed_losses());
    }

    #[test]
    fn a_curriculum_interpolates_between_its_points() {
        let c = CurriculumMixer::new(vec![(100, vec![1.0, 0.0]), (300, vec![0.5, 0.5])]).unwrap();
        assert_eq!(c.at(0), [1.0, 0.0]);
        assert_eq!(c.at(100), [1.0, 0.0]);
        assert_eq!(c.at(200), [0.75, 0.25]);
        assert_eq!(c.at(300), [0.5, 0.5]);
        assert_eq!(c.at(10_000), [0.5, 0.5]);
        for bad in [
            vec![],
            vec![(0, vec![1.0]), (0, vec![1.0])],
            vec![(0, vec![1.0, 0.0]), (5, vec![1.0])],
            vec![(0, vec![0.0, 0.0])],
            vec![(0, vec![f64::NAN, 1.0])],
        ] {
            assert!(CurriculumMixer::new(bad).is_err());
        }
    }

    #[test]
    fn smoothing_and_state_round_trip() {
        let names = vec!["a".to_string(), "b".to_string()];
        let mut mixer = OnlineMixer::new(1.0, 0.0, 0.5).unwrap();
        mixer.weights(&stats(&names, &[1.0, f64::NAN]));
        mixer.weights(&stats(&names, &[3.0, 1.0]));
        assert_eq!(mixer.smoothed_losses(), &[2.0, 1.0]);
        let mut other = OnlineMixer::new(1.0, 0.0, 0.5).unwrap();
        other.restore(&mixer.state().unwrap()).unwrap();
        let next = stats(&names, &[1.0, 1.0]);
        assert_eq!(other.weights(&next), mixer.weights(&next));
    }
}
