//! The gradient noise scale as a controller: each measuring step's estimate feeds
//! the moving averages, and under `schedule = noise_scale(..)` or `goodput(..)`
//! sizes the next global batch; the cadence decides which steps measure, and
//! splits them when they lack two small batches.

use crate::adapt::noise_cadence::{CadenceState, NoiseCadence, SplitCostModel, StepSeconds};
use crate::adapt::noise_scale::{NoiseMeasurement, NoiseScaleEstimator, NoiseScalePolicy};
use crate::adapt::schedule::ScheduleSpec;
use crate::data::planner::StepPlanner;
use crate::error::Result;
use crate::report::record::StepLog;
use crate::train::probe::StepProbe;
use crate::train::settings::StepRules;

use super::controller::{Controller, Restore, Save, Steer, StepReport};
use super::goodput_control::GoodputControl;
use super::noise_probe::{NoiseProbe, NoiseReading};
use super::states;

/// The small batches (one per micro-batch and rank) below which a step that
/// measures the gradient noise scale is split in two: one rank measures from 2
/// halves, two ranks from 4 quarters, as the examples' `grad_accum = fixed(2)`
/// did at every step; from four ranks on, the ranks' shares alone. Fewer small
/// batches make a noisier estimate, whose ratio of averages runs high: on 2 CPU
/// ranks, the ranks' 2 shares alone doubled the language model's batch earlier
/// (539 steps and 0.03 nats worse, against 692 from 4 quarters).
pub const MEASURE_SMALL_BATCHES: usize = 4;

/// Whether the next step must be split in two to measure: it has fewer than
/// [`MEASURE_SMALL_BATCHES`] small batches, and splits without changing its
/// examples (a split adds small batches only to a step of one micro-batch).
fn needs_split(planner: &StepPlanner<ScheduleSpec>) -> bool {
    let ranks = planner.world_size().min(planner.global_batch());
    planner.can_split_in_two() && ranks < MEASURE_SMALL_BATCHES
}

/// The estimator, and what resizes the batch from it.
pub(crate) struct NoiseScaleControl {
    estimator: NoiseScaleEstimator,
    cadence: NoiseCadence,
    resize: Resize,
    /// The ranks a global batch is shared by.
    world: usize,
    /// Measurements refused (not finite) since the last logged step.
    refused: usize,
    /// The last step's measurement, when the averages took one in.
    last_measurement: Option<NoiseMeasurement>,
    /// On gradients preconditioned by the optimizer (`lr_scaling = adamscale`).
    precondition: bool,
    /// This rank's seconds of the last step (0: none yet, or it ran out of
    /// memory), which ride in the next step so that every rank gets their mean.
    last_seconds: f64,
    /// The last positive warm estimate, held while the current one is not.
    held: HeldEstimate,
    /// Steps since the last logged one that ran on the held estimate.
    held_since_log: usize,
}

/// The estimate the rate and the batch follow once warm: the current one, or
/// while its |G|² average is not positive (noise, on a small batch; the ratio
/// then means nothing) the last positive one, held for both, so that
/// `lr_scaling = adamscale` does not switch to the √ rule while goodput keeps
/// its batch. Saved in checkpoints: a resumed run holds what the uninterrupted
/// one held.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HeldEstimate {
    /// The last positive warm estimate (`None` before the first).
    last: Option<f64>,
    /// Steps of the run that ran on it, the current estimate not being positive.
    steps: usize,
}

/// What the estimate drives.
enum Resize {
    /// Nothing: the estimate is only logged (`--log-gradient-noise-scale`).
    LogOnly,
    /// `schedule = noise_scale(..)`.
    NoiseScale(NoiseScalePolicy),
    /// `schedule = goodput(..)`.
    Goodput(GoodputControl),
}

impl NoiseScaleControl {
    /// When the step rules measure the noise scale; `schedule` says whether the
    /// measurements resize the batch, in global batches of `units_world` units;
    /// `split_cost` models a split step on the run's device.
    pub(crate) fn new(
        rules: &StepRules,
        schedule: &ScheduleSpec,
        units_world: usize,
        split_cost: SplitCostModel,
    ) -> Result<Option<Self>> {
        let Some(beta) = rules.noise_scale_beta else {
            return Ok(None);
        };
        Ok(Some(Self {
            estimator: NoiseScaleEstimator::new(beta)?,
            cadence: NoiseCadence::new(rules.noise_every, split_cost),
            resize: match *schedule {
                ScheduleSpec::NoiseScale(policy) => Resize::NoiseScale(policy),
                ScheduleSpec::Goodput(spec) => Resize::Goodput(GoodputControl::new(
                    spec,
                    units_world,
                    rules.precondition_noise,
                )),
                _ => Resize::LogOnly,
            },
            world: units_world.max(1),
            refused: 0,
            last_measurement: None,
            precondition: rules.precondition_noise,
            last_seconds: 0.0,
            held: HeldEstimate::default(),
            held_since_log: 0,
        }))
    }

    /// The estimate once the averages span their horizon (`None` before), or
    /// the last positive one while it is not ([`HeldEstimate`]): what
    /// `lr_scaling = adamscale` scales the rate by and goodput decides on.
    pub(crate) fn warm_estimate(&self) -> Option<f64> {
        self.current_warm().or(self.held.last)
    }

    /// The estimate once warm, `None` while its |G|² average is not positive.
    fn current_warm(&self) -> Option<f64> {
        self.estimator
            .estimate()
            .filter(|_| self.estimator.warmed_up())
    }

    /// Steps of the run that ran on a held estimate.
    pub(crate) fn held_steps(&self) -> usize {
        self.held.steps
    }

    /// After a step's measurement: the estimate to hold, or one more step on it.
    fn note_estimate(&mut self) {
        match (self.current_warm(), self.held.last) {
            (Some(estimate), _) => self.held.last = Some(estimate),
            (None, Some(_)) => {
                self.held.steps += 1;
                self.held_since_log += 1;
            }
            (None, None) => {}
        }
    }

    /// Folds a measurement spanning `spans` steps in (when the step measured)
    /// and resizes the batch: the noise-scale policy after a measurement,
    /// goodput after every step (it learns every step's time).
    fn resize(
        &mut self,
        measurement: Option<((f64, f64), u64)>,
        previous_step_seconds: Option<f64>,
        report: &StepReport<'_>,
        steer: &mut Steer<'_>,
    ) -> Result<()> {
        let estimate = match measurement {
            Some(((norm, trace), spans)) => self.estimator.observe_after(norm, trace, spans),
            None => self.estimator.estimate(),
        };
        let warmed_up = self.estimator.warmed_up();
        self.note_estimate();
        let warm = self.warm_estimate();
        match &mut self.resize {
            Resize::LogOnly => {}
            Resize::NoiseScale(policy) => {
                if measurement.is_some() {
                    let current = steer.planner.global_batch();
                    steer
                        .planner
                        .set_global_batch(policy.next(current, estimate, warmed_up));
                }
            }
            Resize::Goodput(goodput) => {
                goodput.adapt(report, (warm, previous_step_seconds), steer)?;
            }
        }
        Ok(())
    }
}

impl Controller for NoiseScaleControl {
    fn begin(&mut self, steer: &mut Steer<'_>) -> Result<()> {
        // The first step measures: split it when it lacks two small batches.
        let split = needs_split(steer.planner);
        steer.planner.split_in_two(split);
        Ok(())
    }

    fn probe(&self) -> Option<Box<dyn StepProbe + '_>> {
        Some(Box::new(NoiseProbe {
            measures: self.cadence.measures_next(),
            precondition: self.precondition,
            previous_seconds: self.last_seconds,
        }))
    }

    /// The cadence's `auto` and goodput's measured times read it.
    fn step_time(&mut self, seconds: f64) {
        self.last_seconds = seconds;
    }

    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        // A step that read nothing (it did not train) logs no measurement.
        self.last_measurement = None;
        let Some(&NoiseReading {
            measurement: noise,
            previous_step_seconds,
        }) = report.reading::<NoiseReading>()
        else {
            return Ok(());
        };
        // The cadence is as it was when this step was planned. A measurement that
        // is not finite (an overflow, a diverging step) is refused: averaged in,
        // it would leave no estimate for good; refused, the next step measures.
        let planned = self.cadence.measures_next();
        let noise = noise.filter(|_| planned);
        let measurement = noise.filter(|&(norm, trace)| norm.is_finite() && trace.is_finite());
        self.refused += usize::from(noise.is_some() && measurement.is_none());
        let split = steer.planner.splits_in_two();
        let global = report.batches.global_size();
        let seconds = match &self.resize {
            Resize::Goodput(goodput) => goodput.given_seconds(report),
            _ => None,
        }
        .map_or(
            StepSeconds::Previous(previous_step_seconds),
            StepSeconds::This,
        );
        let spans = self
            .cadence
            .after_step(measurement.is_some(), split, global, seconds);
        let folded = measurement.zip(spans);
        self.last_measurement = folded.map(|((squared_norm, trace), _)| NoiseMeasurement {
            squared_norm,
            trace,
        });
        self.resize(folded, previous_step_seconds, report, steer)?;
        // The next step, at its (possibly new) batch.
        let needs_split = needs_split(steer.planner);
        let global = steer.planner.global_batch();
        (self.cadence).choose(needs_split, global, global.div_ceil(self.world));
        let split_next = needs_split && self.cadence.measures_next();
        steer.planner.split_in_two(split_next);
        Ok(())
    }

    fn record(&mut self, entry: &mut StepLog) {
        entry.gradient_noise_scale = self.estimator.estimate();
        entry.noise_measurement = self.last_measurement;
        entry.noise_scale_interval = Some(self.cadence.interval());
        entry.noise_scale_refused = std::mem::take(&mut self.refused);
        entry.noise_scale_held = std::mem::take(&mut self.held_since_log);
        if let Resize::Goodput(goodput) = &self.resize {
            goodput.record(entry);
        }
    }

    fn save(&mut self, at: &mut Save<'_>) -> Result<()> {
        at.into.put(states::NOISE_SCALE, 1, &self.estimator)?;
        at.into
            .put(states::NOISE_CADENCE, 1, self.cadence.state())?;
        at.into.put(states::NOISE_HELD, 1, &self.held)?;
        if let Resize::Goodput(goodput) = &self.resize {
            at.into.put(states::GOODPUT, 1, &goodput.state())?;
        }
        Ok(())
    }

    fn restore(&mut self, at: &mut Restore<'_>) -> Result<()> {
        if let Some(saved) = at.from.get(states::NOISE_SCALE, 1)? {
            self.estimator = saved;
        }
        if let Some(saved) = at.from.get::<CadenceState>(states::NOISE_CADENCE, 1)? {
            self.cadence.restore(saved);
        }
        if let Some(saved) = at.from.get::<HeldEstimate>(states::NOISE_HELD, 1)? {
            if saved
                .last
                .is_some_and(|held| !(held.is_finite() && held > 0.0))
            {
                let detail = format!("holds {:?}: a held noise scale is positive", saved.last);
                return Err(states::entry_error(states::NOISE_HELD, detail));
            }
            self.held = saved;
        }
        if let Resize::Goodput(goodput) = &mut self.resize {
            if let Some(saved) = at.from.get(states::GOODPUT, 1)? {
                goodput.restore(&saved);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt::noise_scale::MeasureEvery;

    fn control() -> NoiseScaleControl {
        NoiseScaleControl {
            estimator: NoiseScaleEstimator::new(0.5).unwrap(),
            cadence: NoiseCadence::new(MeasureEvery::Steps(1), SplitCostModel::for_device(false)),
            resize: Resize::LogOnly,
            world: 1,
            refused: 0,
            last_measurement: None,
            precondition: true,
            last_seconds: 0.0,
            held: HeldEstimate::default(),
            held_since_log: 0,
        }
    }

    fn measure(control: &mut NoiseScaleControl, squared_norm: f64, trace: f64) {
        control.estimator.observe_after(squared_norm, trace, 1);
        control.note_estimate();
    }

    /// Once warm, an |G|² average that turns non-positive leaves the rate and
    /// goodput on the last positive estimate, counted; they did not agree before
    /// (the rate took the √ rule while goodput kept its batch, as in warm-up).
    #[test]
    fn a_non_positive_estimate_holds_the_last_positive_one_and_counts_the_steps() {
        let mut c = control();
        assert_eq!(c.warm_estimate(), None, "not warm before any measurement");
        for _ in 0..20 {
            measure(&mut c, 1.0, 4.0);
        }
        let warm = c.warm_estimate().unwrap();
        assert!((warm - 4.0).abs() < 1e-9, "{warm}");
        assert_eq!(c.held_steps(), 0);
        for _ in 0..3 {
            measure(&mut c, -10.0, 4.0);
        }
        assert_eq!(c.current_warm(), None, "the average is not positive");
        assert_eq!(
            c.warm_estimate(),
            Some(warm),
            "held, for the rate and the batch alike"
        );
        assert_eq!((c.held_steps(), c.held_since_log), (3, 3));
        for _ in 0..20 {
            measure(&mut c, 1.0, 2.0);
        }
        let recovered = c.warm_estimate().unwrap();
        assert!(recovered < warm && recovered > 0.0, "{recovered}");
        // The average took a few measurements to turn positive again: each of
        // those steps ran on the held estimate, and none after.
        let held = c.held_steps();
        assert!(held > 3 && held == c.held_since_log, "{held}");
        measure(&mut c, 1.0, 2.0);
        assert_eq!(c.held_steps(), held, "the count is the run's total");
    }

    /// Before the first positive warm estimate nothing is held: the rate takes
    /// the √ rule and goodput its warm-up batch, as documented.
    #[test]
    fn nothing_is_held_before_a_first_positive_estimate() {
        let mut c = control();
        for _ in 0..20 {
            measure(&mut c, -1.0, 4.0);
        }
        assert_eq!((c.warm_estimate(), c.held_steps()), (None, 0));
    }
}
