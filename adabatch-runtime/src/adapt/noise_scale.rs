//! The gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018,
//! "An Empirical Model of Large-Batch Training", appendix A), from the unbiased
//! two-batch-size estimator.
//!
//! For a gradient averaged over `b` examples, E|G_b|² = |G|² + tr(Σ)/b. One step
//! gives several *small* batches (each rank's share, or each micro-batch's) of sizes
//! `b_k` with squared norms `S_k`, and the *big* batch (the all-reduced gradient of
//! all `B` examples) with squared norm `S_B`. Each small batch gives unbiased
//! estimates
//!
//! ```text
//! |G|²_k  = (B·S_B − b_k·S_k) / (B − b_k)
//! tr(Σ)_k = (S_k − S_B) / (1/b_k − 1/B)
//! ```
//!
//! averaged over the small batches (for equal `b_k`, exactly the paper's formulas
//! with |G_small|² the mean of the `S_k`). Each is smoothed as a bias-corrected
//! exponential moving average, and B_simple is the ratio of the two averages (the
//! ratio of noisy estimates is biased; the ratio of averages much less so).
//!
//! The small batches enter through two sums, [`SmallBatchSums`]. Each rank sends its
//! small batches' sizes and squared norms in the step's existing all-reduce, so the
//! sums can use the big batch's size, which with `reweight = token_count` (sizes in
//! target tokens) is known only after it.

use crate::error::{Error, Result, SettingsError};

/// `schedule = noise_scale(..)`: the global batch follows the critical batch,
/// estimated as `fraction · B_simple`, without overshooting it.
///
/// With `factor = k ≥ 2` (2 by default) the batch `B` changes only by that
/// factor, one change per step at most, and only once the estimator's averages
/// span their horizon: it grows to `k·B` when the target `fraction · B_simple`
/// reaches `k·B·(1 + hysteresis)`, and (with `shrink`) falls to `B/k` when the
/// target is below `B/k` by the same margin. Between the two it stays: a noisy
/// estimate crossing a boundary back and forth does not move it. Changes by
/// integer factors keep the learning-rate rule's steps few (OLMo-core's batch
/// warm-up doubles; its rate follows by √2). `factor = 1` follows the target
/// continuously (rounded), still with the margin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoiseScalePolicy {
    /// The safety fraction of the estimated B_simple the batch tracks.
    pub fraction: f64,
    /// Smallest global batch, and the first one.
    pub min: usize,
    /// Largest global batch.
    pub max: usize,
    /// Integer factor of every change (1: continuous).
    pub factor: usize,
    /// Relative margin the target must clear before a change.
    pub hysteresis: f64,
    /// Whether the batch may shrink when the target falls.
    pub shrink: bool,
    /// How often a step measures the noise scale (see [`MeasureEvery`]).
    pub every: MeasureEvery,
}

/// How often the gradient noise scale is measured. A measuring step needs small
/// batches: on fewer than four ranks without accumulation the engine splits that
/// step into two micro-batches (the same examples, the same summed gradient),
/// which on a launch-bound GPU costs nearly a second pass; the other steps run as
/// one. Where a step has its small batches anyway (four ranks, accumulation),
/// measuring costs a norm per small batch and `model` and `auto` measure every
/// step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeasureEvery {
    /// The default: every `k`-th step, `k` from a fixed model of what a split
    /// costs on the run's device ([`SplitCostModel`](crate::SplitCostModel)), at
    /// most 5 % of the run's time and never more often than every 4th step.
    /// Reads no clock: the same seed and settings give the same steps.
    Modeled,
    /// From the *measured* cost of a split against a plain step, at most 5 % of
    /// the run's time. It reads the wall clock, so which steps measure (hence
    /// the estimates and the batches) depends on the machine's load: runs with
    /// the same seed are not reproducible. Opt-in.
    Auto,
    /// Every `k`-th step (1: every step).
    Steps(usize),
}

/// The share of the run's time the cadence spends on measuring.
pub const MEASURE_BUDGET: f64 = 0.05;

/// The modeled cadence measures at most every this many steps where a step must
/// be split: a quarter of the steps at most, whatever the model says.
pub const MIN_MODELED_INTERVAL: usize = 4;

impl Default for MeasureEvery {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl MeasureEvery {
    /// The default, [`adabatch_rules::noise_scale::EVERY_DEFAULT`] (a test holds
    /// them equal): a `const` for the policies built at compile time.
    pub const DEFAULT: Self = Self::Modeled;

    /// Whether the steps that measure depend on measured step times.
    pub fn reads_the_clock(&self) -> bool {
        matches!(self, Self::Auto)
    }
}

impl std::fmt::Display for MeasureEvery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Modeled => f.write_str(adabatch_rules::noise_scale::EVERY_MODEL),
            Self::Auto => f.write_str(adabatch_rules::noise_scale::EVERY_AUTO),
            Self::Steps(k) => write!(f, "{k}"),
        }
    }
}

/// As the flag spells it (`"model"`, `"auto"`, `"4"`), in the arguments a run
/// records.
impl serde::Serialize for MeasureEvery {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::str::FromStr for MeasureEvery {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        use adabatch_rules::noise_scale::{EVERY_AUTO, EVERY_MODEL};
        match s {
            EVERY_MODEL => return Ok(Self::Modeled),
            EVERY_AUTO => return Ok(Self::Auto),
            _ => {}
        }
        match s.parse::<usize>() {
            Ok(k) if k >= 1 => Ok(Self::Steps(k)),
            _ => Err(format!(
                "`{s}`: expected {}",
                adabatch_rules::noise_scale::EVERY_FORMS
            )),
        }
    }
}

impl NoiseScalePolicy {
    /// The DSL's defaults for `fraction`, `min` and `max` given: doubling, a 10 %
    /// margin, never shrinking.
    pub const fn doubling(fraction: f64, min: usize, max: usize) -> Self {
        Self {
            fraction,
            min,
            max,
            factor: adabatch_rules::noise_scale::FACTOR,
            hysteresis: adabatch_rules::noise_scale::HYSTERESIS,
            shrink: adabatch_rules::noise_scale::SHRINK,
            every: MeasureEvery::DEFAULT,
        }
    }

    /// The checks the values must pass (the macro checks them at compile time).
    pub fn validate(&self) -> Result<()> {
        let every = match self.every {
            MeasureEvery::Steps(k) => adabatch_rules::noise_scale::every(k),
            MeasureEvery::Modeled | MeasureEvery::Auto => Ok(()),
        };
        every
            .and_then(|()| {
                adabatch_rules::noise_scale::check(
                    self.fraction,
                    self.min,
                    self.max,
                    self.factor,
                    self.hysteresis,
                )
            })
            .map_err(|broken| SettingsError::schedule_rule("noise_scale", broken).into())
    }

    /// The next global batch after one of `current`, given the estimate
    /// B_simple (`None` while unknown) and whether the estimator has warmed up.
    pub fn next(&self, current: usize, estimate: Option<f64>, warmed_up: bool) -> usize {
        let Some(target) = estimate.map(|b| self.fraction * b).filter(|t| !t.is_nan()) else {
            return current;
        };
        let margin = 1.0 + self.hysteresis;
        if self.factor == 1 {
            let wanted = (target.round().max(self.min as f64).min(self.max as f64)) as usize;
            // Until the averages span their horizon the estimate rests on a few
            // noisy measurements: the batch at most doubles per step then.
            let wanted = if warmed_up {
                wanted
            } else {
                wanted.min(2 * current)
            };
            let grow = wanted as f64 > current as f64 * margin;
            let shrink = self.shrink && wanted as f64 * margin < current as f64;
            return if grow || shrink { wanted } else { current };
        }
        if !warmed_up {
            return current;
        }
        let up = current.saturating_mul(self.factor).min(self.max);
        if up > current && target >= up as f64 * margin {
            return up;
        }
        let down = (current / self.factor).max(self.min);
        if self.shrink && down < current && target * margin <= down as f64 {
            return down;
        }
        current
    }
}

/// The two sums over small batches the estimator needs from each step:
/// `Σ_k S_k / (1/b_k − 1/B)` and `Σ_k b_k·S_k / (B − b_k)`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SmallBatchSums {
    /// `Σ_k S_k / (1/b_k − 1/B)`.
    pub trace: f64,
    /// `Σ_k b_k·S_k / (B − b_k)`.
    pub norm: f64,
}

impl SmallBatchSums {
    /// Adds one small batch of `small` examples whose mean gradient has squared norm
    /// `squared_norm`, out of a big batch of `big` examples. A small batch as big
    /// as the big one carries no information and is left out.
    pub fn add(&mut self, small: usize, big: usize, squared_norm: f64) {
        if small == 0 || small >= big {
            return;
        }
        let (b, bb) = (small as f64, big as f64);
        self.trace += squared_norm / (1.0 / b - 1.0 / bb);
        self.norm += b * squared_norm / (bb - b);
    }
}

/// One step's own measurement of the noise scale, in the logs: the unbiased
/// estimates that step's small batches gave, before the moving averages (whose
/// ratio is B_simple). With them a log can be replayed offline at another
/// cadence or horizon (`benches/compare/lm_frontier/horizon.py`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NoiseMeasurement {
    /// The estimate of |G|², the true gradient's squared norm.
    pub squared_norm: f64,
    /// The estimate of tr Σ, the per-example gradient variance (in examples).
    pub trace: f64,
}

/// The fewest measurements before the estimate is followed, however far apart
/// they are: one measurement's estimate can be 20× the settled value, so a
/// cadence that measures rarely waits longer (in steps) before its first decision.
pub const MIN_MEASUREMENTS: u64 = 8;

/// The fewest measurements the averages span, however far apart they are: a
/// measurement weighs at most `1/HORIZON_MEASUREMENTS`. Fewer than
/// [`MIN_MEASUREMENTS`]: at the default cadence's 13 steps on two CPU ranks, a
/// horizon of 8 measurements spans about 100 steps, and the estimate trailed a
/// rising noise scale by about 20 % (BENCHMARKS, "The horizon of the averages");
/// 4 keep the averages' noise where it was and the lag near the timed cadence's.
pub const HORIZON_MEASUREMENTS: u64 = 4;

/// Estimator state: the two moving averages (a checkpoint stores it).
///
/// The averages run over *measurements*, each weighted by the steps since the one
/// before: a measurement `g` steps after the last decays the averages by `beta^g`,
/// so their horizon stays `1/(1 − beta)` steps (20 at 0.95: the same examples
/// whatever the cadence), but never fewer than [`HORIZON_MEASUREMENTS`]
/// measurements.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NoiseScaleEstimator {
    /// Smoothing factor of the moving averages per step, in [0, 1).
    pub beta: f64,
    /// Biased moving average of |G|².
    pub ema_norm: f64,
    /// Biased moving average of tr(Σ).
    pub ema_trace: f64,
    /// Measurements observed.
    pub steps: u64,
    /// Steps the measurements span (`None`: one each, as checkpoints written
    /// before the cadence hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spanned: Option<u64>,
    /// The product of every decay so far, for the bias correction (`None`:
    /// `beta^steps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decayed: Option<f64>,
}

impl NoiseScaleEstimator {
    /// A fresh estimator.
    pub fn new(beta: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&beta) {
            return Err(Error::Settings(SettingsError::InvalidSchedule {
                schedule: "noise_scale",
                reason: format!("beta = {beta} must be in [0, 1)"),
            }));
        }
        Ok(Self {
            beta,
            ema_norm: 0.0,
            ema_trace: 0.0,
            steps: 0,
            spanned: Some(0),
            decayed: Some(1.0),
        })
    }

    /// The per-step estimates (|G|², tr Σ) from the small batches' `sizes` (every
    /// one of the step), their `sums`, and the big batch of `big` examples whose
    /// gradient has squared norm `big_squared_norm`.
    ///
    /// At least two small batches are needed: one rank without accumulation has
    /// only the big batch, a typed error saying so.
    pub fn step_estimates(
        sizes: &[usize],
        big: usize,
        sums: SmallBatchSums,
        big_squared_norm: f64,
    ) -> Result<(f64, f64)> {
        let used: Vec<f64> = sizes
            .iter()
            .filter(|&&b| b > 0 && b < big)
            .map(|&b| b as f64)
            .collect();
        if used.len() < 2 {
            return Err(Error::Settings(
                SettingsError::NoiseScaleNeedsSmallBatches {
                    small_batches: used.len(),
                },
            ));
        }
        let bb = big as f64;
        let k = used.len() as f64;
        let trace_weight: f64 = used.iter().map(|b| 1.0 / (1.0 / b - 1.0 / bb)).sum();
        let norm_weight: f64 = used.iter().map(|b| bb / (bb - b)).sum();
        let trace = (sums.trace - big_squared_norm * trace_weight) / k;
        let norm = (big_squared_norm * norm_weight - sums.norm) / k;
        Ok((norm, trace))
    }

    /// Folds one step's estimates in; returns B_simple from the bias-corrected
    /// averages (`None` while the |G|² average is not positive).
    #[cfg(test)]
    pub fn observe(&mut self, norm: f64, trace: f64) -> Option<f64> {
        self.observe_after(norm, trace, 1)
    }

    /// Folds in a measurement taken `steps` steps (at least 1) after the previous
    /// one: the averages decay by `beta^steps`, but by no less than keeps
    /// [`HORIZON_MEASUREMENTS`] in their horizon. A measurement that is not finite
    /// is refused (averaged in, it would leave no estimate for good): the state
    /// stays as it was.
    pub fn observe_after(&mut self, norm: f64, trace: f64, steps: u64) -> Option<f64> {
        if !(norm.is_finite() && trace.is_finite()) {
            return self.estimate();
        }
        let steps = steps.max(1);
        let per_step = self.beta.powi(steps.min(i32::MAX as u64) as i32);
        let floor = 1.0 - 1.0 / HORIZON_MEASUREMENTS as f64;
        let decay = per_step.max(floor.min(self.beta));
        self.decayed = Some(self.decay_product() * decay);
        self.spanned = Some(self.spanned_steps() + steps);
        self.steps += 1;
        self.ema_norm = decay * self.ema_norm + (1.0 - decay) * norm;
        self.ema_trace = decay * self.ema_trace + (1.0 - decay) * trace;
        self.estimate()
    }

    fn decay_product(&self) -> f64 {
        self.decayed
            .unwrap_or_else(|| self.beta.powi(self.steps.min(i32::MAX as u64) as i32))
    }

    fn spanned_steps(&self) -> u64 {
        self.spanned.unwrap_or(self.steps)
    }

    /// Whether the averages span their horizon: `1/(1 − beta)` steps (20 at
    /// beta = 0.95) and as many measurements, or [`MIN_MEASUREMENTS`] when they
    /// are further apart. Before that the estimate rests on a few noisy
    /// measurements (one step's can be 20× the settled value), so a schedule
    /// should not follow it yet.
    pub fn warmed_up(&self) -> bool {
        let horizon = (1.0 / (1.0 - self.beta)).ceil() as u64;
        let measurements = horizon.min(
            MIN_MEASUREMENTS
                .max(horizon.div_ceil((self.spanned_steps() / self.steps.max(1)).max(1))),
        );
        self.spanned_steps() >= horizon && self.steps >= measurements
    }

    /// B_simple = tr(Σ)/|G|² from the bias-corrected averages.
    pub fn estimate(&self) -> Option<f64> {
        if self.steps == 0 {
            return None;
        }
        // The same correction divides both averages: it cancels in the ratio, but
        // the corrected values are the ones worth reading.
        let correction = 1.0 - self.decay_product();
        let norm = self.ema_norm / correction;
        let trace = self.ema_trace / correction;
        (norm > 0.0 && trace.is_finite()).then(|| trace / norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `every`'s default has one home, the rules' `EVERY_DEFAULT`: the runtime's
    /// `const` is the word it names, and its words parse back.
    #[test]
    fn the_cadence_default_is_the_rules() {
        use adabatch_rules::noise_scale::{EVERY_AUTO, EVERY_DEFAULT, EVERY_FORMS};
        assert_eq!(MeasureEvery::DEFAULT.to_string(), EVERY_DEFAULT);
        assert_eq!(MeasureEvery::default(), MeasureEvery::DEFAULT);
        assert_eq!(EVERY_DEFAULT.parse(), Ok(MeasureEvery::DEFAULT));
        assert_eq!(EVERY_AUTO.parse(), Ok(MeasureEvery::Auto));
        let err = "often".parse::<MeasureEvery>().unwrap_err();
        assert!(err.contains(EVERY_FORMS), "{err}");
    }

    #[test]
    fn warmed_up_after_the_horizon_of_the_averages() {
        let mut e = NoiseScaleEstimator::new(0.95).unwrap();
        for _ in 0..19 {
            e.observe(1.0, 10.0);
            assert!(!e.warmed_up());
        }
        e.observe(1.0, 10.0);
        assert!(e.warmed_up(), "20 steps = 1 / (1 - 0.95)");
        assert!(NoiseScaleEstimator::new(0.0)
            .unwrap()
            .observe(1.0, 1.0)
            .is_some());
    }

    /// Measurements further apart keep the horizon in steps (20 at 0.95), but
    /// never fewer than HORIZON_MEASUREMENTS of them; the estimate is followed
    /// after MIN_MEASUREMENTS.
    #[test]
    fn the_horizon_counts_steps_and_at_least_four_measurements() {
        let warm_after = |gap: u64| {
            let mut e = NoiseScaleEstimator::new(0.95).unwrap();
            (1..=100)
                .find(|_| {
                    e.observe_after(1.0, 10.0, gap);
                    e.warmed_up()
                })
                .unwrap()
        };
        assert_eq!(warm_after(1), 20);
        assert_eq!(warm_after(2), 10, "20 steps");
        assert_eq!(warm_after(4), 8, "32 steps: at least 8 measurements");
        assert_eq!(warm_after(19), 8);
        // A decay of 0.95^2 per measurement two steps apart, 0.95^5 = 0.774 five
        // apart; 0.75 = 1 - 1/4 at most for those further apart.
        let mut e = NoiseScaleEstimator::new(0.95).unwrap();
        e.observe_after(1.0, 10.0, 1);
        e.observe_after(3.0, 10.0, 2);
        let mut expected = 0.9025 * 0.05 + 0.0975 * 3.0;
        assert!((e.ema_norm - expected).abs() < 1e-12);
        e.observe_after(4.0, 10.0, 5);
        let d5 = 0.95f64.powi(5);
        expected = d5 * expected + (1.0 - d5) * 4.0;
        assert!((e.ema_norm - expected).abs() < 1e-12);
        e.observe_after(5.0, 10.0, 19);
        expected = 0.75 * expected + 0.25 * 5.0;
        assert!((e.ema_norm - expected).abs() < 1e-12);
        // The bias correction divides by 1 minus the product of the decays.
        let corrected_norm = e.ema_norm / (1.0 - 0.95 * 0.9025 * d5 * 0.75);
        assert!((e.estimate().unwrap() - 10.0 / corrected_norm).abs() < 1e-9);
    }

    /// A measurement that is not finite leaves the averages as they were.
    #[test]
    fn a_measurement_that_is_not_finite_is_refused() {
        let mut e = NoiseScaleEstimator::new(0.95).unwrap();
        e.observe_after(2.0, 40.0, 4);
        let before = e;
        for (norm, trace) in [
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
            (f64::NEG_INFINITY, 1.0),
        ] {
            assert_eq!(e.observe_after(norm, trace, 4), before.estimate());
            assert_eq!(e, before);
        }
        assert!((e.observe_after(2.0, 40.0, 4).unwrap() - 20.0).abs() < 1e-9);
    }

    /// A checkpoint written before the cadence (no `spanned`, no `decayed`) reads
    /// as one measurement per step.
    #[test]
    fn an_older_state_reads_as_one_measurement_per_step() {
        let old: NoiseScaleEstimator = serde_json::from_str(
            r#"{"beta": 0.9, "ema_norm": 0.19, "ema_trace": 3.8, "steps": 2}"#,
        )
        .unwrap();
        let mut fresh = NoiseScaleEstimator::new(0.9).unwrap();
        fresh.observe(1.0, 20.0);
        fresh.observe(1.0, 20.0);
        assert!((old.estimate().unwrap() - fresh.estimate().unwrap()).abs() < 1e-9);
        assert!((old.estimate().unwrap() - 20.0).abs() < 1e-9);
    }

    /// Draws from the exact model E|G_b|² = g2 + tr/b with no noise: the estimator
    /// must return g2 and tr exactly (up to rounding), for uneven sizes too.
    #[test]
    fn exact_on_noiseless_norms() {
        let (g2, tr) = (0.25, 40.0);
        let sizes = [3usize, 3, 2, 5];
        let big: usize = sizes.iter().sum();
        let mut sums = SmallBatchSums::default();
        for &b in &sizes {
            sums.add(b, big, g2 + tr / b as f64);
        }
        let (n, t) =
            NoiseScaleEstimator::step_estimates(&sizes, big, sums, g2 + tr / big as f64).unwrap();
        assert!((n - g2).abs() < 1e-12, "{n}");
        assert!((t - tr).abs() < 1e-9, "{t}");
        let mut e = NoiseScaleEstimator::new(0.9).unwrap();
        let b = e.observe(n, t).unwrap();
        assert!(
            (b - tr / g2).abs() < 1e-6,
            "bias-corrected from the first step: {b}"
        );
    }

    #[test]
    fn one_small_batch_is_a_typed_error() {
        let err = NoiseScaleEstimator::step_estimates(&[8], 8, SmallBatchSums::default(), 1.0)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::Settings(SettingsError::NoiseScaleNeedsSmallBatches { small_batches: 0 })
        ));
        assert!(err.to_string().contains("accumulate"), "{err}");
        assert!(NoiseScaleEstimator::new(1.0).is_err());
    }

    /// A noisy B_simple that grows 30 → ~600 over 600 steps, then falls back.
    fn trace(step: usize) -> f64 {
        let t = step as f64;
        let level = if step < 600 {
            30.0 * (t / 200.0).exp()
        } else {
            600.0 * (-(t - 600.0) / 100.0).exp()
        };
        // ±30 % noise, deterministic.
        level * (1.0 + 0.3 * (t * 1.7).sin())
    }

    #[test]
    fn doubling_tracks_the_target_without_overshooting_and_holds_on_noise() {
        let policy = NoiseScalePolicy::doubling(0.5, 8, 256);
        policy.validate().unwrap();
        let mut batch = policy.min;
        let mut changes = Vec::new();
        for step in 1..=600 {
            let estimate = trace(step);
            let next = policy.next(batch, Some(estimate), step >= 20);
            if next != batch {
                let target = 0.5 * estimate;
                assert_eq!(next, 2 * batch, "doubling only, step {step}");
                assert!(step >= 20, "no change before the averages warm up");
                assert!(
                    target >= next as f64 * 1.1,
                    "step {step}: {target} < 1.1·{next}"
                );
                changes.push((step, next));
            }
            batch = next;
        }
        // 8 → 256 is five doublings, and the noise adds none back and forth.
        assert_eq!(changes.len(), 5, "{changes:?}");
        assert_eq!(batch, 256);
        // Never shrinking unless asked: the falling half leaves it at the top.
        for step in 601..=1000 {
            batch = policy.next(batch, Some(trace(step)), true);
        }
        assert_eq!(batch, 256);
        let shrinking = NoiseScalePolicy {
            shrink: true,
            ..policy
        };
        let mut batch = 256;
        for step in 601..=1000 {
            let next = shrinking.next(batch, Some(trace(step)), true);
            if next < batch {
                assert_eq!(next, batch / 2);
                assert!(0.5 * trace(step) * 1.1 <= next as f64);
            }
            batch = next;
        }
        assert_eq!(batch, 8, "the trace falls to ~7: back at the minimum");
    }

    #[test]
    fn continuous_follows_the_rounded_target_within_the_clamps() {
        let policy = NoiseScalePolicy {
            factor: 1,
            hysteresis: 0.0,
            shrink: true,
            ..NoiseScalePolicy::doubling(0.5, 8, 256)
        };
        assert_eq!(policy.next(8, Some(100.0), true), 50);
        assert_eq!(policy.next(50, Some(20.0), true), 10);
        assert_eq!(policy.next(50, Some(2.0), true), 8);
        assert_eq!(policy.next(50, Some(1e9), true), 256);
        assert_eq!(
            policy.next(8, Some(1e9), false),
            16,
            "at most doubling while warming up"
        );
        assert_eq!(policy.next(8, None, true), 8);
        let held = NoiseScalePolicy {
            hysteresis: 0.2,
            ..policy
        };
        assert_eq!(
            held.next(50, Some(110.0), true),
            50,
            "55 is within 20 % of 50"
        );
        assert_eq!(held.next(50, Some(130.0), true), 65);
        assert!(NoiseScalePolicy {
            factor: 0,
            ..policy
        }
        .validate()
        .is_err());
        assert!(NoiseScalePolicy {
            hysteresis: f64::NAN,
            ..policy
        }
        .validate()
        .is_err());
    }
}
