//! PiKE (Li, Deng, Zhong, Razaviyayn, Mirrokni, "PiKE: Adaptive Data Mixing for
//! Large-Scale Multi-Task Learning Under Low Gradient Conflicts", arXiv
//! 2502.06244, NeurIPS 2025): mixing weights from each source's gradient norm
//! `|g_k|²` and gradient variance `σ_k²`, measured on a step's own examples.
//!
//! The paper's argument, as implemented here. One step of SGD on a mixed batch
//! of `b` examples, `w_k·b` of them from source `k`, moves the average loss
//! `L = (1/K) Σ_k L_k` by at most (L-smoothness, with the step's gradient
//! estimate unbiased for `Σ_k w_k g_k` and of variance `Σ_k w_k σ_k² / b`):
//!
//! `E[ΔL] ≤ −η ⟨∇L, Σ_k w_k g_k⟩ + (Lη²/2)(|Σ_k w_k g_k|² + Σ_k w_k σ_k² / b)`.
//!
//! Under low gradient conflicts (`⟨g_j, g_k⟩ ≥ 0`, the paper's observation of
//! large-scale pretraining) the first term is at most `−(η/K) Σ_k w_k |g_k|²`,
//! so the bound is a sum over the sources and each unit of weight on source `k`
//! gains `|g_k|² − ζ·σ_k²/b` ([`gains`]; `ζ` folds `K·L·η/2`). PiKE gives the
//! weight to the sources that gain most, softened by an entropy term so that no
//! source is starved: `w ∝ exp(gain_k / (T·mean_j |g_j|²))` ([`softmax`]).
//!
//! The fair variant minimises the tilted loss `(1/τ) log Σ_k exp(τ L_k)`, whose
//! gradient weighs source `k` by `p_k = softmax(τ L)_k`: the gain of source `k`
//! becomes `K·p_k |g_k|² − ζ·σ_k²/b`, so sources behind in loss gain more
//! (`τ = 0`: the average loss again).
//!
//! What the paper leaves to the implementation, chosen here: how `|g_k|²` and
//! `σ_k²` are estimated from a batch (the engine splits a source's examples of
//! the step into two halves `a`, `b`: `⟨ĝ_a, ĝ_b⟩` is unbiased for `|g_k|²`, and
//! `|ĝ_a − ĝ_b|² / (1/n_a + 1/n_b)` for `σ_k²`, with no per-example gradient);
//! the temperature's scale (relative to the mean `|g_k|²`, because gradient
//! norms fall by orders of magnitude over a run and a fixed temperature would
//! freeze the weights late); a floor on every weight (a source needs examples in
//! a measuring step to be measured again); a negative `|g_k|²` estimate (noise)
//! counts as 0.

use super::mixer::{numbers, Diagnostic, Mixer, SourceGradient, SourceStats};
use adabatch_rules::pike as rules;

/// PiKE as a [`Mixer`]: the average-loss variant ([`PikeMixer::default`]) or the
/// fair one ([`PikeMixer::fair`]). It asks the engine for the sources' gradient
/// statistics every `every` steps (steps 1, 1 + every, ...: a cadence of steps,
/// so a run is reproducible) and holds its weights in between.
#[derive(Debug, Clone)]
pub struct PikeMixer {
    every: usize,
    zeta: f64,
    temperature: f64,
    floor: f64,
    smoothing: f64,
    /// The fair variant's tilt `τ` (`None`: the average loss).
    tilt: Option<f64>,
    /// Measurements seen.
    measurements: usize,
    /// Smoothed `|g_k|²`, `σ_k²`, losses and the step's size `b` (NaN: never
    /// measured).
    grad_sq: Vec<f64>,
    grad_var: Vec<f64>,
    loss: Vec<f64>,
    batch: f64,
    /// The weights last given.
    weights: Vec<f64>,
}

impl Default for PikeMixer {
    /// The average-loss PiKE with the defaults of [`adabatch_rules::pike`].
    fn default() -> Self {
        Self {
            every: rules::EVERY,
            zeta: rules::ZETA,
            temperature: rules::TEMPERATURE,
            floor: rules::FLOOR,
            smoothing: rules::SMOOTHING,
            tilt: None,
            measurements: 0,
            grad_sq: Vec::new(),
            grad_var: Vec::new(),
            loss: Vec::new(),
            batch: f64::NAN,
            weights: Vec::new(),
        }
    }
}

/// A rule of [`adabatch_rules::pike`] broken, as the engine's typed error.
fn checked(broken: adabatch_rules::Check) -> crate::error::Result<()> {
    broken.map_err(|b| crate::error::SettingsError::mixer_rule("pike", b).into())
}

impl PikeMixer {
    /// The fair variant's default tilt ([`adabatch_rules::pike::TILT`]).
    pub const DEFAULT_TILT: f64 = rules::TILT;

    /// The fair variant at tilt `τ >= 0` (0: the average loss).
    pub fn fair(tilt: f64) -> crate::error::Result<Self> {
        checked(rules::tilt(tilt))?;
        Ok(Self {
            tilt: Some(tilt),
            ..Self::default()
        })
    }

    /// From values that passed [`adabatch_rules::pike::check`]: `every`, then
    /// `ζ`, the temperature, the floor and the smoothing, and the fair
    /// variant's tilt.
    pub(crate) fn checked(
        every: usize,
        [zeta, temperature, floor, smoothing]: [f64; 4],
        tilt: Option<f64>,
    ) -> Self {
        Self {
            every,
            zeta,
            temperature,
            floor,
            smoothing,
            tilt,
            ..Self::default()
        }
    }

    /// Measures every `every >= 1` steps.
    pub fn with_every(self, every: usize) -> crate::error::Result<Self> {
        checked(rules::every(every))?;
        Ok(Self { every, ..self })
    }

    /// The variance's weight `ζ >= 0`.
    pub fn with_zeta(self, zeta: f64) -> crate::error::Result<Self> {
        checked(rules::zeta(zeta))?;
        Ok(Self { zeta, ..self })
    }

    /// The softmax's temperature `T > 0`, relative to the mean `|g_k|²`.
    pub fn with_temperature(self, temperature: f64) -> crate::error::Result<Self> {
        checked(rules::temperature(temperature))?;
        Ok(Self {
            temperature,
            ..self
        })
    }

    /// Every source's least weight, `floor` in `[0, 1]`, shared out before
    /// the softmax's.
    pub fn with_floor(self, floor: f64) -> crate::error::Result<Self> {
        checked(rules::floor(floor))?;
        Ok(Self { floor, ..self })
    }

    /// The statistics' moving-average decay per measurement, in `[0, 1)` (0:
    /// each measurement alone, as the paper).
    pub fn with_smoothing(self, smoothing: f64) -> crate::error::Result<Self> {
        checked(rules::smoothing(smoothing))?;
        Ok(Self { smoothing, ..self })
    }

    /// The steps between two measurements.
    pub fn every(&self) -> usize {
        self.every
    }

    /// Whether it is the fair variant.
    pub fn is_fair(&self) -> bool {
        self.tilt.is_some()
    }

    /// A measurement folded into the smoothed statistics (a source with too
    /// few examples to be measured keeps what it had).
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
        for (i, m) in measured.iter().enumerate() {
            fold(&mut self.grad_sq[i], m.grad_sq);
            fold(&mut self.grad_var[i], m.grad_var);
            fold(&mut self.loss[i], m.loss);
        }
        let b: f64 = measured
            .iter()
            .map(|m| m.size)
            .filter(|s| s.is_finite())
            .sum();
        if b > 0.0 {
            self.batch = b;
        }
        self.measurements += 1;
    }

    /// The weights from the smoothed statistics, or `None` while no source has
    /// a positive `|g_k|²` (nothing to tell the sources apart by).
    fn decide(&self) -> Option<Vec<f64>> {
        let p = self.tilt.map(|tau| softmax(&self.loss, tau));
        let gain = gains(
            (&self.grad_sq, &self.grad_var),
            self.zeta,
            self.batch,
            p.as_deref(),
        );
        let positive: Vec<f64> = (self.grad_sq.iter())
            .filter(|g| g.is_finite())
            .map(|g| g.max(0.0))
            .collect();
        let scale = positive.iter().sum::<f64>() / positive.len().max(1) as f64;
        if !(scale.is_finite() && scale > 0.0) {
            return None;
        }
        let shares = softmax(&gain, 1.0 / (self.temperature * scale));
        let k = shares.len() as f64;
        Some(
            shares
                .iter()
                .map(|s| (1.0 - self.floor) * s + self.floor / k)
                .collect(),
        )
    }
}

/// Each source's gain per unit of weight in the one-step bound (see the module):
/// `c_k = |g_k|² − ζ·σ_k²/b`, or with the fair variant's `p` (the tilted loss's
/// source weights) `c_k = K·p_k·|g_k|² − ζ·σ_k²/b`; a negative `|g_k|²` counts
/// as 0. A source never measured (NaN) gets the mean of the others' gains.
pub(crate) fn gains(
    (grad_sq, grad_var): (&[f64], &[f64]),
    zeta: f64,
    batch: f64,
    fair: Option<&[f64]>,
) -> Vec<f64> {
    let k = grad_sq.len() as f64;
    let gain: Vec<f64> = (0..grad_sq.len())
        .map(|i| {
            let tilted = fair.map_or(1.0, |p| k * p[i]);
            tilted * grad_sq[i].max(0.0) - zeta * grad_var[i] / batch
        })
        .collect();
    let known: Vec<f64> = gain.iter().copied().filter(|c| c.is_finite()).collect();
    let mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
    gain.into_iter()
        .map(|c| if c.is_finite() { c } else { mean })
        .collect()
}

/// `softmax(scale · x)`; a NaN entry counts as the mean of the others (a source
/// not yet measured is neither favoured nor starved).
pub(crate) fn softmax(x: &[f64], scale: f64) -> Vec<f64> {
    let known: Vec<f64> = x.iter().copied().filter(|v| v.is_finite()).collect();
    let mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
    let z: Vec<f64> = (x.iter())
        .map(|&v| scale * if v.is_finite() { v } else { mean })
        .collect();
    let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - top).exp()).collect();
    let total: f64 = e.iter().sum();
    e.iter().map(|v| v / total).collect()
}

impl Mixer for PikeMixer {
    /// Equal weights until the first measurement (step 1's); after a measuring
    /// step, the weights of its statistics; held in between.
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let k = stats.names.len();
        if let Some(measured) = stats.source_gradients.filter(|m| m.len() == k) {
            self.absorb(measured);
            if let Some(weights) = self.decide() {
                self.weights = weights;
            }
        }
        if self.weights.len() != k {
            self.weights = vec![1.0 / k.max(1) as f64; k];
        }
        self.weights.clone()
    }

    /// Steps 1, 1 + every, 1 + 2·every, ...
    fn wants_source_gradients(&self, step: usize) -> bool {
        step >= 1 && (step - 1) % self.every == 0
    }

    /// From the first measurement on: each source's `grad_sq` (`|g_k|²`) and
    /// `grad_var` (`σ_k²`) as the weights in force read them (the last
    /// measurement's, smoothed when `smoothing > 0`), and those `weights`. Not
    /// only on the measuring steps: a logged step shows what its weights rest on.
    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        if self.measurements == 0 {
            return Vec::new();
        }
        vec![
            ("grad_sq", Diagnostic::PerSource(self.grad_sq.clone())),
            ("grad_var", Diagnostic::PerSource(self.grad_var.clone())),
            ("weights", Diagnostic::PerSource(self.weights.clone())),
        ]
    }

    /// The measurements seen, the smoothed statistics and the weights in force.
    fn state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "measurements": self.measurements,
            "grad_sq": self.grad_sq,
            "grad_var": self.grad_var,
            "loss": self.loss,
            "batch": self.batch,
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
        if [grad_sq.len(), grad_var.len(), loss.len()] != [k; 3] {
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
        let batch = numbers(&serde_json::json!([field("batch")?]))?[0];
        self.measurements = measurements as usize;
        (self.grad_sq, self.grad_var, self.loss) = (grad_sq, grad_var, loss);
        (self.batch, self.weights) = (batch, weights);
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
            step,
            names: &names,
            loss: &[f64::NAN; 2],
            tokens: &[],
            source_tokens: &[10, 10],
            unit: MixUnit::Examples,
            seen: &[0, 0],
            positions: &[0, 0],
            sizes: &[10, 10],
            weights: &[1.0, 1.0],
            last_eval: None,
            held_out: None,
            source_gradients: gradients,
        })
    }

    /// The module's gain `|g_k|² − ζσ_k²/b` and the softmax at temperature
    /// `T·mean|g|²`, by hand: |g|² = (3, 1), σ² = (16, 0), b = 8, ζ = 1 give
    /// gains (1, 1): equal weights, the variance cancelling the larger gradient;
    /// without the variance (ζ = 0) gains (3, 1) over mean 2: softmax(1.5, 0.5).
    #[test]
    fn the_weights_follow_the_bounds_gains_by_hand() {
        let stats = [measured(3.0, 16.0, 4.0, 1.0), measured(1.0, 0.0, 4.0, 1.0)];
        let mut pike = PikeMixer::default().with_floor(0.0).unwrap();
        assert_eq!(after(&mut pike, 0, None), [0.5, 0.5], "equal before any");
        let w = after(&mut pike, 1, Some(&stats));
        assert!((w[0] - 0.5).abs() < 1e-12, "{w:?}");
        let mut plain = PikeMixer::default().with_floor(0.0).unwrap();
        plain = plain.with_zeta(0.0).unwrap();
        let w = after(&mut plain, 1, Some(&stats));
        let e = 1f64.exp();
        assert!((w[0] - e / (e + 1.0)).abs() < 1e-12, "{w:?}");
        // Held until the next measurement, with the floor shared out.
        assert_eq!(after(&mut plain, 2, None), w);
        let mut floored = PikeMixer::default().with_zeta(0.0).unwrap();
        let w = after(&mut floored, 1, Some(&stats));
        let want = 0.95 * e / (e + 1.0) + 0.025;
        assert!((w[0] - want).abs() < 1e-12, "{w:?}");
    }

    /// The fair variant's gain `K·p_k|g_k|² − ζσ_k²/b` with `p = softmax(τL)`:
    /// equal gradients, losses (ln 3, 0) at τ = 1 give p = (3/4, 1/4), gains
    /// (1.5, 0.5)·|g|², so the source behind gets softmax(1.5, 0.5).
    #[test]
    fn the_fair_variant_favours_the_source_behind() {
        let stats = [
            measured(2.0, 0.0, 4.0, 3f64.ln()),
            measured(2.0, 0.0, 4.0, 0.0),
        ];
        let mut fair = PikeMixer::fair(1.0).unwrap().with_floor(0.0).unwrap();
        let w = after(&mut fair, 1, Some(&stats));
        let e = 1f64.exp();
        assert!((w[0] - e / (e + 1.0)).abs() < 1e-12, "{w:?}");
        let mut average = PikeMixer::default();
        assert_eq!(after(&mut average, 1, Some(&stats)), [0.5, 0.5]);
    }

    #[test]
    fn it_measures_on_a_cadence_of_steps() {
        let pike = PikeMixer::default().with_every(3).unwrap();
        let asked: Vec<usize> = (0..10)
            .filter(|&s| pike.wants_source_gradients(s))
            .collect();
        assert_eq!(asked, [1, 4, 7]);
        assert!(PikeMixer::default().with_every(0).is_err());
        assert!(PikeMixer::fair(-1.0).is_err());
    }

    #[test]
    fn its_state_resumes_and_damage_is_refused() {
        let stats = [measured(3.0, 1.0, 4.0, 2.0), measured(1.0, 2.0, 4.0, 1.0)];
        let mut pike = PikeMixer::default().with_smoothing(0.5).unwrap();
        after(&mut pike, 1, Some(&stats));
        assert!(PikeMixer::default().diagnostics().is_empty(), "none before");
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
