//! PiKE (Li, Deng, Zhong, Razaviyayn, Mirrokni, "PiKE: Adaptive Data Mixing for
//! Large-Scale Multi-Task Learning Under Low Gradient Conflicts", arXiv
//! 2502.06244, NeurIPS 2025): mixing weights moved by each source's squared
//! gradient norm `|∇L_k|²` and gradient variance `σ_k²`, measured on a step's
//! own examples.
//!
//! The paper, as implemented here. A mixed batch of `b` examples, `b_k` of task
//! `k`, has the gradient `g = Σ_k (b_k/b) ḡ_k` (its equation (2)). Under low
//! gradient conflicts one SGD step lowers the total loss by at least what its
//! Theorem 3.4 bounds (equation (8)), whose minimisation over `w_k = b_k/b` is
//! the program of equation (9), `min Σ_k w_k λ_k + ½ w_k² κ_k` on the simplex
//! with `λ_k = −ηβ|∇L_k|² + (Lη²/2b) σ_k²`. Re-solving it from scratch at every
//! measurement jumps the weights; the paper takes one mirror-descent step on it
//! instead (§3.2) and, with its constants folded into two, Algorithm 1:
//!
//! - line 4: every `T₀` steps,
//! - line 5: estimate `|∇L_k|²` and `σ_k²` for every task,
//! - line 6: `w_k ← w_k · exp(ζ₁ |∇L_k|² − (ζ₂/2b) σ_k²)` (`exponents`),
//! - line 7: `w ← w / |w|₁`,
//! - line 8: `b_k = round(b·w_k)` (the engine's deficit allocator here).
//!
//! Balanced-PiKE (§3.3) minimises the tilted loss `(1/τ) log Σ_k exp(τ L_k)`
//! (equation (11)), which Lemma 3.6 turns into the total loss weighted by
//! `y_k = τ·softmax(τL)_k` (equation (12)); PiKE on that weighted loss scales each
//! task's gradient-norm term by its weight. Here the weights are `K·softmax(τL)_k`
//! (they sum to `K`, as the `K` unit weights of equation (1) do, so `τ → 0` is
//! PiKE again) and `L_k` is the source's mean training loss of the measuring
//! step: our reading of the paper's Appendix D, which we could not consult.
//!
//! What the paper leaves to the implementation, chosen here: how `|∇L_k|²` and
//! `σ_k²` are estimated from a batch (the engine splits a source's examples of
//! the step into two halves `a`, `b`: `⟨ĝ_a, ĝ_b⟩` is unbiased for `|∇L_k|²`, and
//! `|ĝ_a − ĝ_b|² / (1/n_a + 1/n_b)` for `σ_k²`, with no per-example gradient);
//! a negative `|∇L_k|²` estimate (noise) counts as 0; `b` is the measuring
//! step's examples (tokens under `token_count`); the first weights are uniform
//! (the paper's uniform initialisation).
//!
//! Two readings of ours, both measured (BENCHMARKS.md, "PiKE"). The exponents
//! of line 6 are taken in units of the measured sources' mean `|∇L_k|²`: in
//! the paper `ζ₁ = αηβ` and `ζ₂ = αLη²` carry the step's scale, which a
//! default cannot know (a decoder's `|∇L_k|²` is ~3 at its first step and
//! ~0.1 later); with raw statistics and `ζ₁ = ζ₂ = 1` the first measurement
//! alone moved a domain to 6 % of the batch. And a source with fewer than two
//! examples in the measuring step, which cannot be measured, takes the
//! measured ones' mean exponent: it keeps its weight against them rather than
//! losing ground for want of examples (which, as stale statistics, starved a
//! domain to nothing). Options of this crate: a `floor` mixed into the weights
//! given, and a moving average of the statistics (of `σ_k²` in log space: one
//! outlying measurement, which a domain's heavy-tailed documents give at
//! times, moves it little).

use super::mixer::{numbers, Diagnostic, Mixer, SourceGradient, SourceStats};
use adabatch_rules::pike as rules;

/// PiKE as a [`Mixer`]: Algorithm 1 of the paper ([`PikeMixer::default`]) or
/// Balanced-PiKE ([`PikeMixer::fair`]). It asks the engine for the sources'
/// gradient statistics every `T₀` steps (steps 1, 1 + T₀, ...: a cadence of
/// steps, so a run is reproducible) and holds its weights in between.
#[derive(Debug, Clone)]
pub struct PikeMixer {
    t0: usize,
    zeta1: f64,
    zeta2: f64,
    floor: f64,
    smoothing: f64,
    /// Balanced-PiKE's `τ` (`None`: the total loss).
    tau: Option<f64>,
    /// Measurements seen.
    measurements: usize,
    /// Smoothed `|∇L_k|²`, `σ_k²` and losses (NaN: never measured).
    grad_sq: Vec<f64>,
    grad_var: Vec<f64>,
    loss: Vec<f64>,
    /// The mirror-descent iterate `w` (before any floor).
    weights: Vec<f64>,
}

impl Default for PikeMixer {
    /// Algorithm 1 with the defaults of [`adabatch_rules::pike`].
    fn default() -> Self {
        Self {
            t0: rules::T0,
            zeta1: rules::ZETA1,
            zeta2: rules::ZETA2,
            floor: rules::FLOOR,
            smoothing: rules::SMOOTHING,
            tau: None,
            measurements: 0,
            grad_sq: Vec::new(),
            grad_var: Vec::new(),
            loss: Vec::new(),
            weights: Vec::new(),
        }
    }
}

/// A rule of [`adabatch_rules::pike`] broken, as the engine's typed error.
fn checked(broken: adabatch_rules::Check) -> crate::error::Result<()> {
    broken.map_err(|b| crate::error::SettingsError::mixer_rule("pike", b).into())
}

impl PikeMixer {
    /// Balanced-PiKE's default `τ` ([`adabatch_rules::pike::TAU`]).
    pub const DEFAULT_TAU: f64 = rules::TAU;

    /// Balanced-PiKE at `τ >= 0` (0: the total loss again).
    pub fn fair(tau: f64) -> crate::error::Result<Self> {
        checked(rules::tau(tau))?;
        Ok(Self {
            tau: Some(tau),
            ..Self::default()
        })
    }

    /// From values that passed [`adabatch_rules::pike::check`]: `T₀`, then `ζ₁`,
    /// `ζ₂`, the floor and the smoothing, and Balanced-PiKE's `τ`.
    pub(crate) fn checked(
        t0: usize,
        [zeta1, zeta2, floor, smoothing]: [f64; 4],
        tau: Option<f64>,
    ) -> Self {
        Self {
            t0,
            zeta1,
            zeta2,
            floor,
            smoothing,
            tau,
            ..Self::default()
        }
    }

    /// Measures and moves the weights every `T₀ >= 1` steps.
    pub fn with_t0(self, t0: usize) -> crate::error::Result<Self> {
        checked(rules::t0(t0))?;
        Ok(Self { t0, ..self })
    }

    /// `ζ₁ >= 0`, the weight of `|∇L_k|²`.
    pub fn with_zeta1(self, zeta1: f64) -> crate::error::Result<Self> {
        checked(rules::zeta1(zeta1))?;
        Ok(Self { zeta1, ..self })
    }

    /// `ζ₂ >= 0`, the weight of `σ_k² / 2b`.
    pub fn with_zeta2(self, zeta2: f64) -> crate::error::Result<Self> {
        checked(rules::zeta2(zeta2))?;
        Ok(Self { zeta2, ..self })
    }

    /// Every source's least share, `floor` in `[0, 1]` spread evenly over the
    /// weights given (the iterate keeps its own).
    pub fn with_floor(self, floor: f64) -> crate::error::Result<Self> {
        checked(rules::floor(floor))?;
        Ok(Self { floor, ..self })
    }

    /// The statistics' moving-average decay per measurement, in `[0, 1)`.
    pub fn with_smoothing(self, smoothing: f64) -> crate::error::Result<Self> {
        checked(rules::smoothing(smoothing))?;
        Ok(Self { smoothing, ..self })
    }

    /// `T₀`.
    pub fn t0(&self) -> usize {
        self.t0
    }

    /// Whether it is Balanced-PiKE.
    pub fn is_fair(&self) -> bool {
        self.tau.is_some()
    }

    /// A measurement folded into the (smoothed) statistics; a source with too
    /// few examples to be measured keeps what it had. `σ_k²` is averaged in
    /// log space (a geometric moving average): a domain's one heavy-tailed
    /// measurement (45 times its usual `σ_k²`, seen on English) then lifts it
    /// by `45^(1−β)`, about 2 at `β = 0.8`, instead of 9, and cannot push
    /// the domain down for the next several measurements.
    fn absorb(&mut self, measured: &[SourceGradient]) {
        let k = measured.len();
        for v in [&mut self.grad_sq, &mut self.grad_var, &mut self.loss] {
            v.resize(k, f64::NAN);
        }
        let beta = self.smoothing;
        let fold = |old: &mut f64, new: f64| {
            if new.is_finite() {
                *old = if old.is_finite() {
                    beta * *old + (1.0 - beta) * new
                } else {
                    new
                };
            }
        };
        // Linear where either is 0 (two equal halves), which has no log.
        let fold_log = |old: &mut f64, new: f64| match *old > 0.0 && new > 0.0 {
            true => *old = (beta * old.ln() + (1.0 - beta) * new.ln()).exp(),
            false => fold(old, new),
        };
        for (i, m) in measured.iter().enumerate() {
            fold(&mut self.grad_sq[i], m.grad_sq);
            fold_log(&mut self.grad_var[i], m.grad_var);
            fold(&mut self.loss[i], m.loss);
        }
        self.measurements += 1;
    }

    /// Algorithm 1's lines 6 and 7 on the iterate, from the (smoothed)
    /// statistics of the sources this measurement saw, in log space so that a
    /// large exponent does not overflow. The exponents are taken in units of
    /// the measured sources' mean `|∇L_k|²` (see the module: `ζ₁`, `ζ₂` are
    /// then numbers of the mirror step, whatever the gradients' scale); a
    /// source it did not see gets their mean exponent, so it keeps its weight
    /// against them.
    fn step(&mut self, measured: &[SourceGradient]) {
        let b: f64 = (measured.iter())
            .map(|m| m.size)
            .filter(|s| s.is_finite())
            .sum();
        let seen: Vec<bool> = measured.iter().map(|m| m.grad_sq.is_finite()).collect();
        let y = self.tau.map(|tau| tilted(&self.loss, tau));
        let Some(e) = exponents(
            (&self.grad_sq, &self.grad_var),
            (self.zeta1, self.zeta2),
            (b, &seen),
            y.as_deref(),
        ) else {
            return;
        };
        let logs: Vec<f64> = (self.weights.iter().zip(&e))
            .map(|(w, e)| w.ln() + e)
            .collect();
        let top = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !top.is_finite() {
            return;
        }
        let raw: Vec<f64> = logs.iter().map(|l| (l - top).exp()).collect();
        let total: f64 = raw.iter().sum();
        self.weights = raw.iter().map(|w| w / total).collect();
    }

    /// The weights given: the iterate, with the floor spread evenly.
    fn given(&self) -> Vec<f64> {
        let k = self.weights.len().max(1) as f64;
        (self.weights.iter())
            .map(|w| (1.0 - self.floor) * w + self.floor / k)
            .collect()
    }
}

/// Algorithm 1's line 6 exponents, `ζ₁ |∇L_k|² − (ζ₂ / 2b) σ_k²`, with
/// Balanced-PiKE's task weights `y` on the first term (see the module), over
/// the mean `|∇L_k|²` of the sources `seen`; a negative `|∇L_k|²` estimate
/// counts as 0, a source not seen gets the seen ones' mean exponent. `None`
/// where no source was seen or every `|∇L_k|²` was 0: no step.
pub(crate) fn exponents(
    (grad_sq, grad_var): (&[f64], &[f64]),
    (zeta1, zeta2): (f64, f64),
    (b, seen): (f64, &[bool]),
    y: Option<&[f64]>,
) -> Option<Vec<f64>> {
    let seen_k = |k: usize| seen.get(k).copied().unwrap_or(false);
    let measured: Vec<usize> = (0..grad_sq.len()).filter(|&k| seen_k(k)).collect();
    let scale = measured.iter().map(|&k| grad_sq[k].max(0.0)).sum::<f64>() / measured.len() as f64;
    if !(scale.is_finite() && scale > 0.0) {
        return None;
    }
    let own = |k: usize| {
        let weight = y.map_or(1.0, |y| y[k]);
        let e = (zeta1 * weight * grad_sq[k].max(0.0) - zeta2 * grad_var[k] / (2.0 * b)) / scale;
        if e.is_finite() {
            e
        } else {
            0.0
        }
    };
    let mean = measured.iter().map(|&k| own(k)).sum::<f64>() / measured.len() as f64;
    Some(
        (0..grad_sq.len())
            .map(|k| if seen_k(k) { own(k) } else { mean })
            .collect(),
    )
}

/// Balanced-PiKE's task weights, `K·softmax(τL)` (Lemma 3.6's `y*` over `τ`,
/// times `K`); a source without a loss yet counts at the others' mean.
pub(crate) fn tilted(loss: &[f64], tau: f64) -> Vec<f64> {
    let known: Vec<f64> = loss.iter().copied().filter(|v| v.is_finite()).collect();
    let mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
    let z: Vec<f64> = (loss.iter())
        .map(|&v| tau * if v.is_finite() { v } else { mean })
        .collect();
    let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - top).exp()).collect();
    let total: f64 = e.iter().sum();
    let k = loss.len() as f64;
    e.iter().map(|v| k * v / total).collect()
}

impl Mixer for PikeMixer {
    /// Uniform until the first measurement (step 1's); after a measuring step,
    /// the mirror step of its statistics; held in between.
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let k = stats.names.len();
        if self.weights.len() != k {
            self.weights = vec![1.0 / k.max(1) as f64; k];
        }
        if let Some(measured) = stats.source_gradients.filter(|m| m.len() == k) {
            self.absorb(measured);
            self.step(measured);
        }
        self.given()
    }

    /// Steps 1, 1 + T₀, 1 + 2·T₀, ... (Algorithm 1's `t mod T₀ = 0`, from the
    /// first step).
    fn wants_source_gradients(&self, step: usize) -> bool {
        step >= 1 && (step - 1) % self.t0 == 0
    }

    /// From the first measurement on: each source's `grad_sq` (`|∇L_k|²`) and
    /// `grad_var` (`σ_k²`) of the last measurement (smoothed when `smoothing >
    /// 0`), and the `weights` they gave. Not only on the measuring steps: a
    /// logged step shows what its weights rest on.
    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        if self.measurements == 0 {
            return Vec::new();
        }
        vec![
            ("grad_sq", Diagnostic::PerSource(self.grad_sq.clone())),
            ("grad_var", Diagnostic::PerSource(self.grad_var.clone())),
            ("weights", Diagnostic::PerSource(self.given())),
        ]
    }

    /// The measurements seen, the statistics and the iterate.
    fn state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "measurements": self.measurements,
            "grad_sq": self.grad_sq,
            "grad_var": self.grad_var,
            "loss": self.loss,
            "weights": self.weights,
        }))
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        let field = |key| super::mixer::field(state, key);
        let measurements = field("measurements")?;
        let measurements = measurements
            .as_u64()
            .ok_or_else(|| format!("`measurements` is {measurements}, not a count"))?;
        let lists = ["grad_sq", "grad_var", "loss", "weights"]
            .map(|key| numbers(field(key)?).map_err(|e| format!("`{key}`: {e}")));
        let [grad_sq, grad_var, loss, weights] = lists;
        let (grad_sq, grad_var, loss, weights) = (grad_sq?, grad_var?, loss?, weights?);
        let k = weights.len();
        let measured = [grad_sq.len(), grad_var.len(), loss.len()];
        if measured != [k; 3] && measured != [0; 3] {
            return Err(format!(
                "has {} weights for {}, {} and {} statistics",
                k,
                grad_sq.len(),
                grad_var.len(),
                loss.len()
            ));
        }
        if weights.iter().any(|w| !(w.is_finite() && *w >= 0.0)) {
            return Err(format!(
                "has weights that are not finite and >= 0: {weights:?}"
            ));
        }
        self.measurements = measurements as usize;
        (self.grad_sq, self.grad_var, self.loss) = (grad_sq, grad_var, loss);
        self.weights = weights;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt::mixer::MixUnit;

    fn measured(grad_sq: f64, grad_var: f64, size: f64, loss: f64) -> SourceGradient {
        SourceGradient {
            grad_sq,
            grad_var,
            size,
            loss,
        }
    }

    fn after(mixer: &mut PikeMixer, step: usize, gradients: Option<&[SourceGradient]>) -> Vec<f64> {
        let names = ["a".to_string(), "b".to_string()];
        mixer.weights(&SourceStats {
            loss: &[f64::NAN; 2],
            source_tokens: &[10, 10],
            seen: &[0, 0],
            positions: &[0, 0],
            sizes: &[10, 10],
            weights: &[1.0, 1.0],
            source_gradients: gradients,
            ..SourceStats::blank(step, &names, MixUnit::Examples)
        })
    }

    /// Algorithm 1 as written: no floor, no smoothing, `ζ₁ = ζ₂ = 1`.
    fn plain() -> PikeMixer {
        PikeMixer::default()
            .with_floor(0.0)
            .and_then(|p| p.with_smoothing(0.0))
            .and_then(|p| p.with_zeta1(1.0))
            .and_then(|p| p.with_zeta2(1.0))
            .unwrap()
    }

    /// `1 / (1 + e^-d)`: the first of two weights after exponents `d` apart.
    fn first(d: f64) -> f64 {
        1.0 / (1.0 + (-d).exp())
    }

    /// Algorithm 1, lines 6–7, by hand: from w = (½, ½), |∇L|² = (2, 1),
    /// σ² = (8, 0), b = 8, ζ₁ = ζ₂ = 1: exponents (2 − 8/16, 1) = (1.5, 1), in
    /// units of the mean |∇L|² 1.5: (1, ⅔), so w ∝ (e^1, e^⅔); the next
    /// measurement multiplies again.
    #[test]
    fn the_weights_take_algorithm_ones_mirror_step_by_hand() {
        let stats = [measured(2.0, 8.0, 4.0, 1.0), measured(1.0, 0.0, 4.0, 1.0)];
        let mut pike = plain();
        assert_eq!(after(&mut pike, 0, None), [0.5, 0.5], "uniform before any");
        let w = after(&mut pike, 1, Some(&stats));
        assert!((w[0] - first(1.0 / 3.0)).abs() < 1e-12, "{w:?}");
        assert_eq!(after(&mut pike, 2, None), w, "held in between");
        let w = after(&mut pike, 11, Some(&stats));
        assert!((w[0] - first(2.0 / 3.0)).abs() < 1e-12, "{w:?}");
        // Without the variance term (ζ₂ = 0) the larger gradient gains more:
        // (2, 1) / 1.5.
        let mut no_variance = plain().with_zeta2(0.0).unwrap();
        let w = after(&mut no_variance, 1, Some(&stats));
        assert!((w[0] - first(2.0 / 3.0)).abs() < 1e-12, "{w:?}");
        // The floor is spread over the weights given, not the iterate.
        let mut floored = plain().with_floor(0.1).unwrap();
        let w = after(&mut floored, 1, Some(&stats));
        assert!(
            (w[0] - (0.9 * first(1.0 / 3.0) + 0.05)).abs() < 1e-12,
            "{w:?}"
        );
    }

    /// The exponents are in units of the mean |∇L_k|²: statistics a thousand
    /// times larger (a loss summed instead of averaged) give the same weights.
    #[test]
    fn the_weights_do_not_depend_on_the_gradients_scale() {
        let stats = [measured(2.0, 8.0, 4.0, 1.0), measured(1.0, 3.0, 4.0, 1.0)];
        let scaled = stats.map(|m| measured(1e3 * m.grad_sq, 1e3 * m.grad_var, m.size, m.loss));
        let (mut a, mut b) = (plain(), plain());
        let (wa, wb) = (
            after(&mut a, 1, Some(&stats)),
            after(&mut b, 1, Some(&scaled)),
        );
        assert!((wa[0] - wb[0]).abs() < 1e-12, "{wa:?} {wb:?}");
        assert!(wa[0] > 0.5);
    }

    /// Balanced-PiKE: losses (1, 0) at τ = ln 3 give softmax(τL) = (¾, ¼), task
    /// weights K·(¾, ¼) = (1.5, 0.5) on equal |∇L|² = 2: exponents (3, 1) over
    /// the mean 2, so the source behind gets 1/(1 + e⁻¹); plain PiKE keeps ½
    /// each.
    #[test]
    fn balanced_pike_favours_the_source_behind() {
        let stats = [measured(2.0, 0.0, 4.0, 1.0), measured(2.0, 0.0, 4.0, 0.0)];
        let mut fair = PikeMixer {
            tau: Some(3f64.ln()),
            ..plain()
        };
        let w = after(&mut fair, 1, Some(&stats));
        assert!((w[0] - first(1.0)).abs() < 1e-12, "{w:?}");
        let mut average = plain();
        assert_eq!(after(&mut average, 1, Some(&stats)), [0.5, 0.5]);
    }

    /// A source the measurement did not see (one example) takes the seen
    /// sources' mean exponent: it keeps its weight against them, not losing
    /// ground for want of examples.
    #[test]
    fn it_measures_every_t0_steps_and_an_unmeasured_source_keeps_its_weight() {
        let pike = PikeMixer::default().with_t0(3).unwrap();
        let asked: Vec<usize> = (0..10)
            .filter(|&s| pike.wants_source_gradients(s))
            .collect();
        assert_eq!(asked, [1, 4, 7]);
        assert!(PikeMixer::default().with_t0(0).is_err());
        assert!(PikeMixer::fair(-1.0).is_err());
        let mut pike = plain();
        let stats = [
            measured(1.0, 0.0, 2.0, 1.0),
            measured(f64::NAN, f64::NAN, 1.0, 1.0),
        ];
        assert_eq!(after(&mut pike, 1, Some(&stats)), [0.5, 0.5]);
        let nothing = [measured(0.0, 1.0, 2.0, 1.0), measured(-1.0, 1.0, 2.0, 1.0)];
        assert_eq!(
            after(&mut pike, 11, Some(&nothing)),
            [0.5, 0.5],
            "no scale: no step"
        );
    }

    /// The variance is smoothed in log space: at β = 0.8 a measurement 32
    /// times the last moves it by 32^0.2 = 2 (a linear average: by 7.2); the
    /// norm and the loss linearly (0.8·1 + 0.2·6 = 2), and a variance of 0
    /// (two equal halves), which has no log (0.8·1 + 0.2·0).
    #[test]
    fn one_outlying_variance_moves_the_smoothed_one_little() {
        let mut pike = PikeMixer::default();
        after(&mut pike, 1, Some(&[measured(1.0, 1.0, 4.0, 1.0); 2]));
        let outlier = [measured(6.0, 32.0, 4.0, 6.0), measured(1.0, 0.0, 4.0, 1.0)];
        after(&mut pike, 11, Some(&outlier));
        assert!(
            (pike.grad_var[0] - 2.0).abs() < 1e-12,
            "{:?}",
            pike.grad_var
        );
        assert!((pike.grad_sq[0] - 2.0).abs() < 1e-12, "{:?}", pike.grad_sq);
        assert!((pike.loss[0] - 2.0).abs() < 1e-12, "{:?}", pike.loss);
        assert!(
            (pike.grad_var[1] - 0.8).abs() < 1e-12,
            "{:?}",
            pike.grad_var
        );
    }

    #[test]
    fn its_state_resumes_and_damage_is_refused() {
        let stats = [measured(3.0, 1.0, 4.0, 2.0), measured(1.0, 2.0, 4.0, 1.0)];
        let mut pike = PikeMixer::default().with_smoothing(0.5).unwrap();
        assert!(pike.diagnostics().is_empty(), "none before");
        after(&mut pike, 1, Some(&stats));
        after(&mut pike, 2, None);
        let diagnostics = pike.diagnostics();
        assert_eq!(
            diagnostics[0],
            ("grad_sq", Diagnostic::PerSource(vec![3.0, 1.0]))
        );
        let state = pike.state().unwrap();
        let mut resumed = PikeMixer::default().with_smoothing(0.5).unwrap();
        resumed.restore(&state).unwrap();
        let next = [measured(1.0, 1.0, 4.0, 2.0), measured(2.0, 1.0, 4.0, 1.0)];
        assert_eq!(
            after(&mut pike, 11, Some(&next)),
            after(&mut resumed, 11, Some(&next))
        );
        let mut damaged = state.clone();
        damaged["grad_sq"] = serde_json::json!([1.0]);
        let err = resumed.restore(&damaged).unwrap_err();
        assert!(err.contains("2 weights for 1"), "{err}");
        let mut damaged = state;
        damaged["weights"] = serde_json::json!([-1.0, 1.0]);
        assert!(resumed.restore(&damaged).is_err());
        assert!(resumed.restore(&serde_json::json!([1.0])).is_err());
    }
}
