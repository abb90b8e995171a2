//! Goodput (Pollux, Qiao et al., OSDI'21): the training progress per second of a
//! global batch `M` split into `s` micro-batches per step,
//!
//! ```text
//! goodput(M, s) = throughput(M, s) · efficiency(M)
//! throughput    = M / T(M, s)                       examples per second
//! efficiency    = (φ + M₀) / (φ + M)                progress per example, relative to M₀
//! ```
//!
//! where φ is the gradient noise scale B_simple (McCandlish et al. 2018: an
//! example in a batch of `M` makes `1 / (1 + M/φ)` of the progress it would make
//! alone; against the smallest batch `M₀` that is the efficiency above) and `T` the
//! step time, from a model fitted to this run's measured steps:
//!
//! ```text
//! T(M, s) = fixed + per_micro_batch · s + per_example · ⌈M / W⌉
//! ```
//!
//! (`fixed`: the optimizer update and the all-reduce; `per_micro_batch`: a
//! forward/backward's own overhead; `per_example`: the work per example on the
//! busiest of the `W` ranks). Without accumulation the optimum has a closed form,
//! `M* = √(fixed · φ / per_example)` (a larger φ or a costlier step favours larger
//! batches), which the tests check the search against.
//!
//! Measured times differ from run to run, so a goodput run's batches are
//! reproducible only through its checkpoint (which holds the fitted
//! observations) or with a step-time model given as a function
//! (`goodput(.., step_time = path::to::fn)`), which replaces the measurements.

use crate::error::{Error, Result, SettingsError, TrainingError};

/// What a step's time depends on: its global batch, the micro-batches it is split
/// into on every rank, and the number of ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct StepShape {
    /// Examples of the step over all ranks.
    pub global: usize,
    /// Micro-batches per rank (gradient accumulation).
    pub micro_batches: usize,
    /// Ranks.
    pub world: usize,
}

impl StepShape {
    /// Examples the busiest rank trains in the step.
    pub fn per_rank(&self) -> usize {
        self.global.div_ceil(self.world.max(1))
    }

    /// Examples of the busiest rank's largest micro-batch (what memory bounds):
    /// the global batch is split into `micro_batches` global micro-batches, each
    /// over the ranks.
    pub fn local(&self) -> usize {
        self.global
            .div_ceil(self.micro_batches.max(1))
            .div_ceil(self.world.max(1))
    }
}

/// A step-time model given as a function: seconds of a step of this shape. It
/// replaces the measured times (tests, or a known machine).
pub type StepTimeFn = fn(StepShape) -> f64;

/// `schedule = goodput(..)`: the global batch and micro-batches of the highest
/// goodput, chosen after every step.
#[derive(Clone, Copy)]
pub struct GoodputSpec {
    /// Smallest global batch, the first one, and `M₀` of the efficiency.
    pub min: usize,
    /// Largest global batch.
    pub max: usize,
    /// Largest micro-batch per rank (memory); 0: no limit.
    pub max_local: usize,
    /// Most micro-batches per step.
    pub max_micro_batches: usize,
    /// Keep the current shape unless another's goodput is this fraction higher.
    pub hysteresis: f64,
    /// The step-time model as a function instead of measured times.
    pub step_time: Option<StepTimeFn>,
}

/// A function's address differs between processes: a checkpoint's record of the
/// policy names the step-time model's presence only.
impl std::fmt::Debug for GoodputSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoodputSpec")
            .field("min", &self.min)
            .field("max", &self.max)
            .field("max_local", &self.max_local)
            .field("max_micro_batches", &self.max_micro_batches)
            .field("hysteresis", &self.hysteresis)
            .field("step_time", &self.step_time.map(|_| "fn"))
            .finish()
    }
}

impl PartialEq for GoodputSpec {
    fn eq(&self, other: &Self) -> bool {
        let same_fn = match (self.step_time, other.step_time) {
            (Some(a), Some(b)) => std::ptr::fn_addr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        (self.min, self.max, self.max_local, self.max_micro_batches)
            == (
                other.min,
                other.max,
                other.max_local,
                other.max_micro_batches,
            )
            && self.hysteresis == other.hysteresis
            && same_fn
    }
}

impl GoodputSpec {
    /// The checks `goodput(..)`'s values must pass.
    pub fn validate(&self) -> Result<()> {
        adabatch_rules::goodput::check(
            self.min,
            self.max,
            self.max_local,
            self.max_micro_batches,
            self.hysteresis,
        )
        .map_err(|broken| SettingsError::schedule_rule("goodput", broken).into())
    }

    /// The shapes goodput may choose on `world` ranks: every global batch in
    /// `[min, max]` with the fewest micro-batches that keep each under
    /// `max_local` (the noise scale's cadence splits the steps that measure it).
    /// A batch no split allows is left out.
    fn shapes(&self, world: usize) -> impl Iterator<Item = StepShape> + '_ {
        (self.min..=self.max).filter_map(move |global| self.shape_for(global, world))
    }

    /// The shape a run starts with: the smallest batch, split as it must be.
    pub fn first_shape(&self, world: usize) -> Result<StepShape> {
        self.shape_for(self.min, world).ok_or_else(|| Error::Settings(SettingsError::InvalidSchedule {
            schedule: "goodput",
            reason: format!(
                "the first global batch, min = {}, does not fit max_local = {} in at most {} micro-batches on {world} rank(s)",
                self.min, self.max_local, self.max_micro_batches
            ),
        }))
    }

    /// The shape of `global` with the fewest micro-batches that fit.
    pub fn shape_for(&self, global: usize, world: usize) -> Option<StepShape> {
        let per_rank = global.div_ceil(world.max(1));
        // One micro-batch even on one rank: the noise scale's cadence splits the
        // steps that measure it (each split shows in the step times it fits).
        (1..=self.max_micro_batches.min(per_rank).max(1))
            .map(|micro_batches| StepShape {
                global,
                micro_batches,
                world,
            })
            .find(|shape| self.max_local == 0 || shape.local() <= self.max_local)
    }
}

/// The fitted step time `fixed + per_micro_batch · s + per_example · n`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepTimeFit {
    /// Seconds of every step.
    pub fixed: f64,
    /// Seconds per micro-batch.
    pub per_micro_batch: f64,
    /// Seconds per example of the busiest rank.
    pub per_example: f64,
}

impl StepTimeFit {
    /// Predicted seconds of a step of `shape`.
    pub fn predict(&self, shape: StepShape) -> f64 {
        self.fixed
            + self.per_micro_batch * shape.micro_batches as f64
            + self.per_example * shape.per_rank() as f64
    }
}

/// The measured steps, one mean per distinct (micro-batches, examples per rank):
/// bounded by the shapes the run can take, and what a checkpoint keeps.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepTimes {
    /// `(micro_batches, per_rank, steps, mean seconds)`.
    pub buckets: Vec<(usize, usize, u64, f64)>,
}

impl StepTimes {
    /// Folds in one step of `shape` that took `seconds`.
    pub fn observe(&mut self, shape: StepShape, seconds: f64) {
        let key = (shape.micro_batches, shape.per_rank());
        match self.buckets.iter_mut().find(|b| (b.0, b.1) == key) {
            Some(bucket) => {
                bucket.2 += 1;
                bucket.3 += (seconds - bucket.3) / bucket.2 as f64;
            }
            None => self.buckets.push((key.0, key.1, 1, seconds)),
        }
    }

    /// Distinct examples-per-rank sizes measured.
    pub fn distinct_sizes(&self) -> usize {
        let mut sizes: Vec<usize> = self.buckets.iter().map(|b| b.1).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes.len()
    }

    /// Weighted least squares over the buckets (weights: steps). `None` until two
    /// sizes per rank were measured. A coefficient the data cannot tell (one
    /// micro-batch count) or that comes out negative is left out and the rest
    /// refitted, down to time proportional to the examples: a few noisy early
    /// measurements where time falls with the batch then read as the
    /// conservative proportional model, never as "a larger batch is free".
    pub fn fit(&self) -> Option<StepTimeFit> {
        if self.distinct_sizes() < 2 {
            return None;
        }
        self.fit_with(self.affine_masks())
            .or_else(|| self.fit_with(&[[false, false, true]]))
    }

    /// Whether the time measured so far grows with the examples enough to fit a
    /// per-example cost with a fixed cost beside it: until it does (time flat
    /// or falling across the sizes measured, as on a GPU far from its limits),
    /// the fit is only the proportional fallback and a larger size is worth
    /// measuring.
    pub(crate) fn growth_measured(&self) -> bool {
        self.distinct_sizes() >= 2 && self.fit_with(self.affine_masks()).is_some()
    }

    /// Whether the mean time at the largest size measured is below half the
    /// growth that time proportional to the examples would show over the
    /// smallest: flat or falling, not proportional with some noise.
    pub(crate) fn time_flat(&self) -> bool {
        let (Some(small), Some(large)) = (
            self.buckets.iter().min_by_key(|b| b.1),
            self.buckets.iter().max_by_key(|b| b.1),
        ) else {
            return false;
        };
        let proportional = large.1 as f64 / small.1 as f64;
        large.1 > small.1 && large.3 < small.3 * (1.0 + 0.5 * (proportional - 1.0))
    }

    /// The largest examples per rank measured.
    pub(crate) fn largest_per_rank(&self) -> Option<usize> {
        self.buckets.iter().map(|b| b.1).max()
    }

    fn affine_masks(&self) -> &'static [[bool; 3]] {
        let micro_vary = self.buckets.iter().any(|b| b.0 != self.buckets[0].0);
        if micro_vary {
            &[[true, true, true], [true, false, true]]
        } else {
            &[[true, false, true]]
        }
    }

    fn fit_with(&self, masks: &[[bool; 3]]) -> Option<StepTimeFit> {
        let rows: Vec<([f64; 3], f64, f64)> = self
            .buckets
            .iter()
            .map(|&(s, n, w, t)| ([1.0, s as f64, n as f64], t, w as f64))
            .collect();
        masks.iter().find_map(|mask| {
            let c = least_squares(&rows, *mask)?;
            (c.iter().all(|&x| x >= 0.0) && c[2] > 0.0).then_some(StepTimeFit {
                fixed: c[0],
                per_micro_batch: c[1],
                per_example: c[2],
            })
        })
    }
}

/// Weighted least squares on the features `mask` keeps (the others 0).
fn least_squares(rows: &[([f64; 3], f64, f64)], mask: [bool; 3]) -> Option<[f64; 3]> {
    let used: Vec<usize> = (0..3).filter(|&i| mask[i]).collect();
    let k = used.len();
    let mut a = vec![vec![0.0f64; k + 1]; k];
    for (x, t, w) in rows {
        for (r, &i) in used.iter().enumerate() {
            for (c, &j) in used.iter().enumerate() {
                a[r][c] += w * x[i] * x[j];
            }
            a[r][k] += w * x[i] * t;
        }
    }
    // Gauss-Jordan elimination with partial pivoting on normal equations of at
    // most 3 unknowns: a linear-algebra crate would be a large dependency for it.
    for col in 0..k {
        let pivot = (col..k).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 * (1.0 + a[col][col].abs()) {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; 3];
    for (r, &i) in used.iter().enumerate() {
        out[i] = a[r][k] / a[r][r];
    }
    out.iter().all(|x| x.is_finite()).then_some(out)
}

/// Why goodput chose a step's shape (logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GoodputReason {
    /// The noise scale is not measured yet: the smallest batch.
    Warmup,
    /// Too few sizes measured to fit a step time that grows with the batch: the
    /// next larger size is measured.
    Explore,
    /// The highest predicted goodput.
    Best,
    /// Another shape was better by less than the hysteresis: kept.
    Kept,
}

/// One decision: the shape of the next steps, and what it rests on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GoodputDecision {
    /// The shape chosen.
    pub shape: StepShape,
    /// Why.
    pub reason: GoodputReason,
    /// Its predicted goodput (examples of `M₀`-batch progress per second), when
    /// a step-time model exists.
    pub goodput: Option<f64>,
    /// Its statistical efficiency `(φ + M₀)/(φ + M)`, when φ is known.
    pub efficiency: Option<f64>,
}

/// What a checkpoint keeps of a goodput run: the measured step times, the shape
/// of the step whose time arrives with the next step, and the last decision.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GoodputState {
    /// Measured step times (empty with a given step-time function).
    pub times: StepTimes,
    /// The last trained step's shape: its time rides in the next step's
    /// all-reduce.
    pub timed_shape: Option<StepShape>,
    /// The shape of the next steps.
    pub decision: Option<GoodputDecision>,
}

/// What a logged step says of goodput: the decision taken after it, the step
/// time it rested on and the fitted model.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GoodputLog {
    /// The next steps' global batch.
    pub next_global_batch: usize,
    /// The next steps' micro-batches per rank.
    pub next_micro_batches: usize,
    /// Why.
    pub reason: GoodputReason,
    /// Predicted goodput of the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<f64>,
    /// Statistical efficiency of the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
    /// Seconds of the step the model last learned from (measured or given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seconds: Option<f64>,
    /// The fitted step-time model (measured runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<StepTimeFit>,
}

/// Statistical efficiency of a global batch `m` against `m0` at noise scale `phi`.
pub fn efficiency(phi: f64, m0: usize, m: usize) -> f64 {
    let phi = phi.max(0.0);
    (phi + m0 as f64) / (phi + m as f64)
}

/// The goodput of `shape` under `time` at noise scale `phi`.
pub fn goodput(spec: &GoodputSpec, phi: f64, shape: StepShape, seconds: f64) -> f64 {
    shape.global as f64 / seconds * efficiency(phi, spec.min, shape.global)
}

/// The step-time oracle of one decision: the given function, or the fit.
pub enum StepTime<'a> {
    /// `goodput(.., step_time = f)`.
    Given(StepTimeFn),
    /// The run's measured steps.
    Measured(&'a StepTimes),
}

impl StepTime<'_> {
    fn predictor(&self) -> Option<Box<dyn Fn(StepShape) -> f64 + '_>> {
        match self {
            StepTime::Given(f) => Some(Box::new(*f)),
            StepTime::Measured(times) => {
                let fit = times.fit()?;
                Some(Box::new(move |s| fit.predict(s)))
            }
        }
    }
}

/// Time that does not grow across the sizes measured tells no per-example cost
/// yet: the global batch to measure next (twice the largest), before the
/// proportional fallback is trusted; `None` once growth is measured, at the
/// largest size, or with a given step time.
fn past_flat_time(spec: &GoodputSpec, time: &StepTime<'_>, world: usize) -> Option<usize> {
    let StepTime::Measured(times) = time else {
        return None;
    };
    let largest = times.largest_per_rank()? * world;
    let next = (largest * 2).min(spec.max);
    let flat = !times.growth_measured() && times.time_flat();
    (flat && next > largest)
        .then(|| spec.shape_for(next, world))
        .flatten()
        .map(|shape| shape.global)
}

/// The shape of the highest `score` among those of at most `cap` examples.
fn best_shape(
    spec: &GoodputSpec,
    world: usize,
    cap: usize,
    score: &dyn Fn(StepShape) -> Result<f64>,
) -> Result<(StepShape, f64)> {
    let mut best: Option<(StepShape, f64)> = None;
    for shape in spec.shapes(world).filter(|s| s.global <= cap) {
        let g = score(shape)?;
        if best.is_none_or(|(_, b)| g > b) {
            best = Some((shape, g));
        }
    }
    best.ok_or_else(|| {
        Error::Settings(SettingsError::InvalidSchedule {
            schedule: "goodput",
            reason: format!(
                "no global batch in [{}, {}] fits max_local = {} with at most {} micro-batches on {world} rank(s)",
                spec.min, spec.max, spec.max_local, spec.max_micro_batches
            ),
        })
    })
}

/// The largest global batch goodput chooses, in noise scales: at `B = B_noise` a
/// step already needs twice the examples of the smallest batches for the same
/// progress (McCandlish et al. 2018, E = E_min (1 + B_noise / B) turned around);
/// beyond it Pollux's efficiency `(φ + M₀)/(φ + M)` under the √ rate rule
/// overrates progress (measured: on one H200, goodput chose 126 and 247 at φ ≈ 31
/// and ended at fixed 128's loss, worse than fixed 64's in more time). Under
/// `lr_scaling = adamscale` the rate follows the gain instead of √M, the
/// overrating this cap patches is gone, and there is no cap.
pub const MAX_NOISE_SCALES: f64 = 1.0;

/// The largest global batch goodput may choose at noise scale `phi`: one noise
/// scale, never below the smallest batch.
pub fn noise_cap(spec: &GoodputSpec, phi: f64) -> usize {
    let cap = (phi.max(0.0) * MAX_NOISE_SCALES).floor();
    if cap.is_nan() {
        return spec.min;
    }
    (cap as usize).clamp(spec.min, spec.max)
}

/// [`decide_within`] with the cap of the √ rate rule (the tests' shorthand).
#[cfg(test)]
pub fn decide(
    spec: &GoodputSpec,
    phi: Option<f64>,
    current: StepShape,
    time: &StepTime<'_>,
) -> Result<GoodputDecision> {
    decide_within(spec, phi, current, time, true)
}

/// The next shape after a step of `current`, given the noise scale `phi`
/// (`None` before it is measured) and the step times: the chosen and explored
/// global batches stay within [`noise_cap`] when `capped` (the √ rate rule),
/// else within `[min, max]` (AdamScale).
///
/// Errors when the given step-time function returns a time that is not a
/// positive number: the run cannot rank shapes without one.
pub fn decide_within(
    spec: &GoodputSpec,
    phi: Option<f64>,
    current: StepShape,
    time: &StepTime<'_>,
    capped: bool,
) -> Result<GoodputDecision> {
    let world = current.world;
    let Some(phi) = phi.filter(|p| p.is_finite()) else {
        return Ok(GoodputDecision {
            shape: current,
            reason: GoodputReason::Warmup,
            goodput: None,
            efficiency: None,
        });
    };
    let efficiency_of = |m: usize| Some(efficiency(phi, spec.min, m));
    let cap = if capped {
        noise_cap(spec, phi)
    } else {
        spec.max
    };
    let explore = |global: usize| {
        let shape = spec.shape_for(global.min(cap), world).unwrap_or(current);
        GoodputDecision {
            shape,
            reason: GoodputReason::Explore,
            goodput: None,
            efficiency: efficiency_of(shape.global),
        }
    };
    let Some(predict) = time.predictor() else {
        // One size measured: try the next larger one (or the smaller, at the top).
        let bigger = (current.global * 2).min(spec.max);
        return Ok(explore(if bigger > current.global {
            bigger
        } else {
            spec.min
        }));
    };
    if let Some(global) = past_flat_time(spec, time, world) {
        return Ok(explore(global));
    }
    let score = |shape: StepShape| -> Result<f64> {
        let seconds = predict(shape);
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(Error::Training(TrainingError::GoodputStepTime {
                detail: format!(
                    "the step-time model gives {seconds} s for a global batch of {} in {} micro-batch(es) on {} rank(s): a step time must be a positive number of seconds",
                    shape.global, shape.micro_batches, shape.world
                ),
            }));
        }
        Ok(goodput(spec, phi, shape, seconds))
    };
    let (best, best_goodput) = best_shape(spec, world, cap, &score)?;
    // A batch past the cap (the noise scale fell) leaves whatever it scores.
    let current_goodput = if current.global <= cap {
        score(current)?
    } else {
        0.0
    };
    let (shape, reason, g) = if best_goodput > current_goodput * (1.0 + spec.hysteresis) {
        (best, GoodputReason::Best, best_goodput)
    } else if best == current {
        (current, GoodputReason::Best, current_goodput)
    } else {
        (current, GoodputReason::Kept, current_goodput)
    };
    Ok(GoodputDecision {
        shape,
        reason,
        goodput: Some(g),
        efficiency: efficiency_of(shape.global),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_local: usize) -> GoodputSpec {
        GoodputSpec {
            min: 4,
            max: 1024,
            max_local,
            max_micro_batches: 8,
            hysteresis: 0.0,
            step_time: None,
        }
    }

    /// T = 0.5 + 0.01·n seconds for n examples per rank (no per-micro-batch cost).
    fn affine(shape: StepShape) -> f64 {
        0.5 + 0.01 * shape.per_rank() as f64
    }

    #[test]
    fn the_noise_scale_caps_the_choice() {
        // A flat step time (a GPU far from its limits) makes every larger batch
        // look faster: uncapped the search would take the largest, 1024.
        fn flat(_: StepShape) -> f64 {
            0.03
        }
        let s = spec(0);
        let start = s.shape_for(4, 1).unwrap();
        let d = decide(&s, Some(31.0), start, &StepTime::Given(flat)).unwrap();
        assert_eq!(d.shape.global, 31, "one noise scale: {:?}", d.shape);
        assert_eq!(noise_cap(&s, 31.9), 31);
        assert_eq!(noise_cap(&s, 1.0), 4, "never below min");
        assert_eq!(noise_cap(&s, f64::NAN), 4);
        // A batch past the cap (the noise scale fell) comes back under it, even
        // where the hysteresis would keep a nearly as good one.
        let held = GoodputSpec {
            hysteresis: 10.0,
            ..s
        };
        let above = s.shape_for(128, 1).unwrap();
        let d = decide(&held, Some(31.0), above, &StepTime::Given(flat)).unwrap();
        assert_eq!(d.shape.global, 31);
        // With the noise scale far above the optimum, the cap does not bind.
        let d = decide(&s, Some(5_000.0), start, &StepTime::Given(affine)).unwrap();
        assert!(d.shape.global > 31, "{:?}", d.shape);
    }

    #[test]
    fn the_search_finds_the_closed_form_optimum() {
        let s = spec(0);
        let start = s.shape_for(4, 2).unwrap();
        let d = decide(&s, Some(200.0), start, &StepTime::Given(affine)).unwrap();
        // Per rank n = M/2: goodput ∝ M / ((0.5 + 0.005 M)(200 + M)), maximal at
        // M² = 0.5·200/0.005 = 20,000: M* = 141.42, so 141 or 142.
        assert_eq!(d.reason, GoodputReason::Best);
        assert!((141..=142).contains(&d.shape.global), "{:?}", d.shape);
        assert_eq!(d.shape.micro_batches, 1);
        let exact = |m: usize| m as f64 / ((0.5 + 0.005 * m as f64) * (200.0 + m as f64));
        assert!(exact(d.shape.global) >= exact(140).max(exact(143)));
    }

    #[test]
    fn one_rank_runs_one_micro_batch_and_memory_splits_more() {
        let s = spec(16);
        let shape = s.shape_for(100, 1).unwrap();
        assert_eq!(shape.micro_batches, 7, "⌈100/7⌉ = 15 <= 16 < ⌈100/6⌉ = 17");
        assert_eq!(s.shape_for(3, 1).map(|s| s.micro_batches), Some(1));
        assert_eq!(spec(0).shape_for(100, 1).unwrap().micro_batches, 1);
        // 8 micro-batches of at most 16 hold 128 examples: 200 does not fit.
        assert_eq!(s.shape_for(200, 1), None);
    }

    #[test]
    fn hysteresis_keeps_a_nearly_as_good_shape() {
        let s = GoodputSpec {
            hysteresis: 0.5,
            ..spec(0)
        };
        let near = s.shape_for(120, 2).unwrap();
        let d = decide(&s, Some(200.0), near, &StepTime::Given(affine)).unwrap();
        assert_eq!((d.shape, d.reason), (near, GoodputReason::Kept));
    }

    #[test]
    fn without_a_fit_it_explores_then_fits() {
        let s = spec(0);
        let mut times = StepTimes::default();
        let first = s.shape_for(4, 2).unwrap();
        times.observe(first, affine(first));
        let d = decide(&s, Some(200.0), first, &StepTime::Measured(&times)).unwrap();
        assert_eq!((d.reason, d.shape.global), (GoodputReason::Explore, 8));
        times.observe(d.shape, affine(d.shape));
        let fit = times.fit().unwrap();
        assert!((fit.fixed - 0.5).abs() < 1e-9 && (fit.per_example - 0.01).abs() < 1e-12);
        let d = decide(&s, Some(200.0), d.shape, &StepTime::Measured(&times)).unwrap();
        assert!((141..=142).contains(&d.shape.global), "{d:?}");
        let warm = decide(&s, None, first, &StepTime::Measured(&times)).unwrap();
        assert_eq!((warm.shape, warm.reason), (first, GoodputReason::Warmup));
    }

    #[test]
    fn the_fit_recovers_the_costs_and_falls_back_to_proportional_time() {
        let mut times = StepTimes::default();
        let truth = StepTimeFit {
            fixed: 0.2,
            per_micro_batch: 0.05,
            per_example: 0.003,
        };
        for (global, micro_batches) in [(8, 1), (16, 2), (64, 2), (64, 4), (128, 1)] {
            let shape = StepShape {
                global,
                micro_batches,
                world: 2,
            };
            times.observe(shape, truth.predict(shape));
            times.observe(shape, truth.predict(shape));
        }
        let fit = times.fit().unwrap();
        assert!((fit.fixed - 0.2).abs() < 1e-9, "{fit:?}");
        assert!((fit.per_micro_batch - 0.05).abs() < 1e-9, "{fit:?}");
        assert!((fit.per_example - 0.003).abs() < 1e-12, "{fit:?}");
        // Time that falls with the batch (noise in a few measurements): time
        // proportional to the examples, not a free larger batch.
        let mut falling = StepTimes::default();
        let at = |global| StepShape {
            global,
            micro_batches: 1,
            world: 1,
        };
        falling.observe(at(8), 2.0);
        assert_eq!(falling.fit(), None, "one size: nothing to fit");
        falling.observe(at(16), 1.0);
        let through = falling.fit().unwrap();
        assert_eq!((through.fixed, through.per_micro_batch), (0.0, 0.0));
        // Σ t·n / Σ n² = (16 + 16) / (64 + 256).
        assert!((through.per_example - 0.1).abs() < 1e-12, "{through:?}");
        // Proportional times with a negative intercept: through the origin too.
        let mut proportional = StepTimes::default();
        proportional.observe(at(10), 0.9);
        proportional.observe(at(20), 2.0);
        let through = proportional.fit().unwrap();
        assert_eq!(through.fixed, 0.0);
        assert!(through.per_example > 0.0);
    }

    #[test]
    fn flat_times_explore_larger_sizes_until_the_time_grows() {
        let s = spec(0);
        let at = |global| s.shape_for(global, 1).unwrap();
        // A GPU far from its limits: 30 ms whatever the size up to 64 examples,
        // then 0.5 ms an example more.
        let gpu = |shape: StepShape| 0.03 + 0.0005 * shape.per_rank().saturating_sub(64) as f64;
        let mut times = StepTimes::default();
        for global in [4, 8] {
            times.observe(at(global), gpu(at(global)));
        }
        let mut current = at(8);
        let mut explored = Vec::new();
        loop {
            let d = decide(&s, Some(200.0), current, &StepTime::Measured(&times)).unwrap();
            if d.reason != GoodputReason::Explore {
                current = d.shape;
                break;
            }
            explored.push(d.shape.global);
            times.observe(d.shape, gpu(d.shape));
            current = d.shape;
        }
        assert_eq!(explored, [16, 32, 64, 128], "until the time grows");
        assert!(times.growth_measured());
        // The fit now sees the fixed cost, and goodput leaves the smallest batch.
        assert!(current.global > 64, "{current:?}");
        // Time proportional to the examples, noise and all, is not flat: the
        // fallback decides without exploring.
        let mut cpu = StepTimes::default();
        cpu.observe(at(8), 0.08);
        cpu.observe(at(16), 0.17);
        assert!(!cpu.growth_measured() && !cpu.time_flat());
        let d = decide(&s, Some(200.0), at(16), &StepTime::Measured(&cpu)).unwrap();
        assert_ne!(d.reason, GoodputReason::Explore);
    }

    #[test]
    fn a_step_time_that_is_not_positive_is_a_typed_error() {
        fn broken(_: StepShape) -> f64 {
            f64::NAN
        }
        let s = spec(0);
        let err = decide(
            &s,
            Some(10.0),
            s.shape_for(4, 2).unwrap(),
            &StepTime::Given(broken),
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::Training(TrainingError::GoodputStepTime { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("positive"), "{err}");
        assert!(GoodputSpec { min: 0, ..s }.validate().is_err());
        assert!(GoodputSpec { max: 2, ..s }.validate().is_err());
        assert!(GoodputSpec {
            hysteresis: -1.0,
            ..s
        }
        .validate()
        .is_err());
    }
}
