//! Which steps measure the gradient noise scale.
//!
//! A measurement needs small batches in a step. Where a step has enough anyway
//! (four ranks, accumulation) measuring costs a norm per small batch, and every
//! step measures. Otherwise the engine splits a measuring step into two
//! micro-batches (`StepPlanner::split_in_two`): the same examples and
//! the same summed gradient, but on a launch-bound GPU nearly a second pass. The
//! cadence then measures every `k`-th step: with a split step `1 + c` times a
//! plain one, measuring every `k` steps spends `c / (k + c)` of the run's time, at
//! most [`MEASURE_BUDGET`] for `k ≥ c · (1/budget − 1)`. `c` comes from a fixed
//! model of the device ([`MeasureEvery::Modeled`], the default: [`SplitCostModel`])
//! or from measured step times ([`MeasureEvery::Auto`]: opt-in, since it makes
//! the run depend on the machine's load); or `k` is given
//! ([`MeasureEvery::Steps`]).

use super::noise_scale::{MeasureEvery, MEASURE_BUDGET, MIN_MODELED_INTERVAL};

/// The longest automatic interval: a split dearer than about three plain steps
/// still measures every 64 steps.
pub const MAX_INTERVAL: usize = 64;

/// The automatic interval while the cost of a split at the current batch is not
/// yet known: alternating split and plain steps measures both times.
const PROBING_INTERVAL: usize = 2;

/// What splitting a step in two costs, as a share `c` of a plain step, on a kind
/// of device: the modeled cadence's one input. A pass costs a fixed part (graph
/// building, kernel launches, small-tensor ops) plus a part per example; a split
/// adds one fixed part, so with `b` examples per rank `c = f / (f + b)`, `f` the
/// fixed part in examples' worth of work. Fixed per device kind, so that which
/// steps measure is a function of the settings alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitCostModel {
    /// A pass's fixed cost in examples per rank (infinite: every split costs a
    /// whole step, as on a launch-bound GPU).
    pub fixed_examples: f64,
}

impl SplitCostModel {
    /// On CPU, measured on the language-model example's decoder (1 rank, 2
    /// cores): a split step cost 1.34, 1.30, 1.16 and 1.02 plain steps at 8, 16,
    /// 32 and 64 documents; `f = 8` bounds them all (0.5, 0.33, 0.2, 0.11;
    /// BENCHMARKS, "Reproducible adapting").
    pub const CPU: Self = Self {
        fixed_examples: 8.0,
    };
    /// On a GPU the schedules' first batches are launch-bound: a second pass
    /// costs about a whole step (the timed cadence measured 1–3× on one H200,
    /// hence intervals of 15–54), so `c = 1` whatever the batch.
    pub const CUDA: Self = Self {
        fixed_examples: f64::INFINITY,
    };

    /// The model of a run on CUDA devices (`cuda`) or the CPU.
    pub fn for_device(cuda: bool) -> Self {
        if cuda {
            Self::CUDA
        } else {
            Self::CPU
        }
    }

    /// A split's extra cost `c` at `per_rank` examples per rank.
    pub fn extra(&self, per_rank: usize) -> f64 {
        if self.fixed_examples.is_infinite() {
            return 1.0;
        }
        self.fixed_examples / (self.fixed_examples + per_rank as f64)
    }

    /// The interval that spends at most 5 % of the run's time (`MEASURE_BUDGET`)
    /// at `per_rank` examples per rank, and never measures more often than every
    /// 4th step (`MIN_MODELED_INTERVAL`).
    pub fn interval(&self, per_rank: usize) -> usize {
        interval_for(self.extra(per_rank), MEASURE_BUDGET).max(MIN_MODELED_INTERVAL)
    }
}

/// Whether a step ran as one pass or split in two for a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StepKind {
    /// As planned.
    Plain,
    /// Split into two micro-batches to measure the noise scale.
    Split,
}

/// Measured step times at one global batch: moving averages of plain and of
/// split steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitCost {
    /// The global batch the times belong to.
    pub global: usize,
    /// Seconds of a plain step.
    pub plain: Option<f64>,
    /// Seconds of a split step.
    pub split: Option<f64>,
}

impl SplitCost {
    /// Adds a step of `kind` at global batch `global` that took `seconds`; a
    /// time at another batch starts over (a step's cost grows with its batch).
    fn record(&mut self, kind: StepKind, global: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        if global != self.global {
            *self = Self {
                global,
                ..Self::default()
            };
        }
        let slot = match kind {
            StepKind::Plain => &mut self.plain,
            StepKind::Split => &mut self.split,
        };
        // A step time varies by tens of percent from step to step (seen on CPU):
        // a quarter-weight average keeps the interval from following each one.
        *slot = Some(slot.map_or(seconds, |old| 0.75 * old + 0.25 * seconds));
    }

    /// A split's extra time as a share of a plain step, once both are measured.
    pub fn extra(&self) -> Option<f64> {
        match (self.plain, self.split) {
            (Some(plain), Some(split)) => Some((split / plain - 1.0).max(0.0)),
            _ => None,
        }
    }
}

/// The interval that keeps measuring within `budget` of the run's time when a
/// split step costs `1 + extra` plain steps.
pub fn interval_for(extra: f64, budget: f64) -> usize {
    let k = (extra * (1.0 / budget - 1.0)).ceil();
    if k.is_nan() {
        return 1;
    }
    (k as usize).clamp(1, MAX_INTERVAL)
}

/// A step's time as the cadence learns it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepSeconds {
    /// Measured: each step reports the time of the step before it (`None`: no
    /// rank timed one).
    Previous(Option<f64>),
    /// Given by a step-time model (goodput's `step_time`) for this step: runs
    /// repeat their cadence.
    This(f64),
}

/// The cadence's state (a checkpoint stores it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CadenceState {
    /// Steps since the last measuring step (0: the last step measured; `None`:
    /// none yet).
    pub since: Option<usize>,
    /// Measure every `interval` steps.
    pub interval: usize,
    /// The last step's kind and global batch, whose time the next step reports.
    pub last: Option<(StepKind, usize)>,
    /// The measured cost of a split (automatic cadence).
    pub cost: SplitCost,
}

/// Decides which steps measure the noise scale.
#[derive(Debug, Clone, PartialEq)]
pub struct NoiseCadence {
    every: MeasureEvery,
    model: SplitCostModel,
    state: CadenceState,
    /// Whether this process has seen a step time: the first one it sees carries
    /// one-time costs (kernels loaded, buffers allocated) and is left out.
    timed: bool,
}

impl NoiseCadence {
    /// A fresh cadence on a device whose splits cost as `model` says: the first
    /// step measures.
    pub fn new(every: MeasureEvery, model: SplitCostModel) -> Self {
        let interval = match every {
            MeasureEvery::Steps(k) => k.max(1),
            // `choose` sets it for the batch after the first step, which measures.
            MeasureEvery::Modeled => model.interval(1),
            MeasureEvery::Auto => PROBING_INTERVAL,
        };
        Self {
            every,
            model,
            state: CadenceState {
                since: None,
                interval,
                last: None,
                cost: SplitCost::default(),
            },
            timed: false,
        }
    }

    /// Whether the next step measures.
    pub fn measures_next(&self) -> bool {
        self.state
            .since
            .is_none_or(|since| since + 1 >= self.state.interval)
    }

    /// The interval in force.
    pub fn interval(&self) -> usize {
        self.state.interval
    }

    /// After a step of global batch `global` that `measured` (split in two when
    /// `split`), with its time or the time of the step before it. Returns the
    /// steps the measurement spans (since the previous one) when it measured.
    ///
    /// A step planned to measure that yielded no measurement (no finite
    /// estimate) is passed with `measured = false`: the span goes on, and the
    /// next step measures. Only the timed cadence keeps the times.
    pub fn after_step(
        &mut self,
        measured: bool,
        split: bool,
        global: usize,
        seconds: StepSeconds,
    ) -> Option<u64> {
        let kind = if split {
            StepKind::Split
        } else {
            StepKind::Plain
        };
        if self.every.reads_the_clock() {
            self.learn_time(kind, global, seconds);
        }
        let spans = self.state.since.map_or(1, |since| since as u64 + 1);
        if measured {
            self.state.since = Some(0);
            Some(spans)
        } else {
            self.state.since = Some(self.state.since.map_or(1, |since| since + 1));
            None
        }
    }

    /// The timed cadence learns what a step of `kind` at `global` costs.
    fn learn_time(&mut self, kind: StepKind, global: usize, seconds: StepSeconds) {
        match seconds {
            StepSeconds::Previous(Some(seconds)) => {
                if let (true, Some((kind, at))) = (self.timed, self.state.last) {
                    self.state.cost.record(kind, at, seconds);
                }
                self.timed = true;
            }
            StepSeconds::Previous(None) => {}
            StepSeconds::This(seconds) => self.state.cost.record(kind, global, seconds),
        }
        self.state.last = Some((kind, global));
    }

    /// Sets the interval for the next steps: `split_needed` when a measuring step
    /// of the next global batch, `global` (`per_rank` examples per rank), must be
    /// split (fewer than four ranks without accumulation). Where a measurement
    /// needs no split, the modeled and the automatic cadence measure every step.
    pub fn choose(&mut self, split_needed: bool, global: usize, per_rank: usize) {
        match self.every {
            MeasureEvery::Steps(_) => return,
            MeasureEvery::Modeled => {
                self.state.interval = if split_needed {
                    self.model.interval(per_rank)
                } else {
                    1
                };
                return;
            }
            MeasureEvery::Auto => {}
        }
        let cost = self.state.cost;
        self.state.interval = match (split_needed, cost.extra()) {
            (false, _) => 1,
            // At least every other step stays plain: its time keeps the cost
            // current (one noisy early pair must not lock in splitting every step).
            (true, Some(extra)) if cost.global == global => {
                interval_for(extra, MEASURE_BUDGET).max(PROBING_INTERVAL)
            }
            (true, _) => PROBING_INTERVAL,
        };
    }

    /// Its state, for a checkpoint.
    pub fn state(&self) -> &CadenceState {
        &self.state
    }

    /// Continues from a checkpoint's state.
    pub fn restore(&mut self, state: CadenceState) {
        self.state = state;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `steps` steps at a fixed batch, with a step time model: returns
    /// which steps measured.
    fn run(cadence: &mut NoiseCadence, steps: usize, seconds: impl Fn(bool) -> f64) -> Vec<usize> {
        let mut measured = Vec::new();
        let mut previous = None;
        for step in 1..=steps {
            let measures = cadence.measures_next();
            if measures {
                measured.push(step);
            }
            cadence.after_step(measures, measures, 64, StepSeconds::Previous(previous));
            cadence.choose(true, 64, 64);
            previous = Some(seconds(measures));
        }
        measured
    }

    #[test]
    fn fixed_interval_measures_every_kth_step_from_the_first() {
        let mut cadence = NoiseCadence::new(MeasureEvery::Steps(5), SplitCostModel::CPU);
        let measured = run(&mut cadence, 21, |_| 1.0);
        assert_eq!(measured, vec![1, 6, 11, 16, 21]);
        let mut every = NoiseCadence::new(MeasureEvery::Steps(1), SplitCostModel::CPU);
        assert_eq!(run(&mut every, 4, |_| 1.0), vec![1, 2, 3, 4]);
    }

    /// A split step twice a plain one (a launch-bound GPU): c = 1, so the
    /// interval is ⌈1 · (1/0.05 − 1)⌉ = 19 once both times are known.
    #[test]
    fn automatic_interval_matches_the_hand_computed_one() {
        let mut cadence = NoiseCadence::new(MeasureEvery::Auto, SplitCostModel::CPU);
        let measured = run(&mut cadence, 80, |split| if split { 0.02 } else { 0.01 });
        assert_eq!(cadence.interval(), 19);
        // Probing alternates (the first time is left out): 1 split (not timed),
        // 2 plain, 3 split; step 4 reports step 3's time: every 19th from step 3.
        assert_eq!(measured, vec![1, 3, 22, 41, 60, 79]);
        let spent: f64 = (1..=80)
            .map(|s| if measured.contains(&s) { 0.02 } else { 0.01 })
            .sum();
        assert!(spent / 0.8 - 1.0 < 0.08, "probing and measuring: {spent}");
        // A split 1.25× a plain step: ⌈0.25 · 19⌉ = 5; a free split: every step,
        // but the cadence keeps every other step plain to keep its cost current.
        assert_eq!(interval_for(0.25, MEASURE_BUDGET), 5);
        assert_eq!(interval_for(0.0, MEASURE_BUDGET), 1);
        let mut cheap = NoiseCadence::new(MeasureEvery::Auto, SplitCostModel::CPU);
        run(&mut cheap, 10, |split| if split { 0.009 } else { 0.01 });
        assert_eq!(cheap.interval(), PROBING_INTERVAL);
        assert_eq!(interval_for(100.0, MEASURE_BUDGET), MAX_INTERVAL);
    }

    #[test]
    fn a_new_batch_probes_again_and_free_measurements_run_every_step() {
        let mut cadence = NoiseCadence::new(MeasureEvery::Auto, SplitCostModel::CPU);
        run(&mut cadence, 10, |split| if split { 0.02 } else { 0.01 });
        assert_eq!(cadence.interval(), 19);
        cadence.choose(true, 128, 128);
        assert_eq!(cadence.interval(), PROBING_INTERVAL, "no times at 128 yet");
        cadence.choose(false, 128, 128);
        assert_eq!(cadence.interval(), 1, "several ranks: measuring is free");
        assert!(cadence.measures_next());
    }

    /// goodput's step-time model in the tests: 40 ms + 2 ms an example + 5 ms a
    /// micro-batch. At 2 examples a plain step is 47 ms and a split one 52 ms: c =
    /// 5/47, and ⌈19 · 5/47⌉ = 3, the same on every run.
    #[test]
    fn a_given_step_time_chooses_a_repeatable_interval() {
        let mut cadence = NoiseCadence::new(MeasureEvery::Auto, SplitCostModel::CPU);
        for _ in 0..4 {
            let split = cadence.measures_next();
            let seconds = 0.04 + 0.002 + 0.005 * if split { 2.0 } else { 1.0 };
            cadence.after_step(split, split, 2, StepSeconds::This(seconds));
            cadence.choose(true, 2, 2);
        }
        assert_eq!(cadence.interval(), 3);
    }

    /// The modeled cadence reads no time: any step times give the same steps,
    /// every 4th on CPU at 64 per rank (the floor), every 19th on CUDA (c = 1 at
    /// 5 %), every step where measuring needs no split.
    #[test]
    fn the_modeled_cadence_is_the_same_whatever_the_step_times() {
        let steps = |model: SplitCostModel, seconds: fn(bool) -> f64| {
            let mut cadence = NoiseCadence::new(MeasureEvery::Modeled, model);
            let measured = run(&mut cadence, 60, seconds);
            (measured, cadence.state().clone())
        };
        let (cpu, state) = steps(SplitCostModel::CPU, |split| if split { 0.02 } else { 0.01 });
        assert_eq!(cpu, (1..=60).step_by(4).collect::<Vec<_>>());
        let (noisy, noisy_state) =
            steps(SplitCostModel::CPU, |split| if split { 9.0 } else { 0.001 });
        assert_eq!(
            (cpu, state),
            (noisy, noisy_state),
            "times change nothing, the state too"
        );
        let (cuda, _) = steps(SplitCostModel::CUDA, |_| 1.0);
        assert_eq!(cuda, vec![1, 20, 39, 58]);
        assert_eq!(SplitCostModel::CUDA.interval(1), 19);
        assert_eq!(SplitCostModel::CUDA.interval(4096), 19);
        let mut free = NoiseCadence::new(MeasureEvery::Modeled, SplitCostModel::CUDA);
        free.choose(false, 64, 64);
        assert_eq!(free.interval(), 1, "several ranks: measuring is free");
        free.choose(true, 64, 64);
        assert_eq!(free.interval(), 19);
    }

    /// The CPU model against hand-computed values: `c = 8 / (8 + b)`, `k =
    /// max(4, ⌈19 c⌉)`: 10 at 8 examples per rank (c = 1/2, 9.5), 7 at 16
    /// (6.33), 4 at 32 (3.8) and 64 (2.11).
    #[test]
    fn the_cpu_model_measures_less_often_at_small_batches() {
        let cpu = SplitCostModel::CPU;
        assert!((cpu.extra(8) - 0.5).abs() < 1e-12);
        let intervals: Vec<usize> = [8, 16, 32, 64].iter().map(|&b| cpu.interval(b)).collect();
        assert_eq!(intervals, vec![10, 7, 4, 4]);
        for b in [8, 16, 32, 64, 1000] {
            assert!(
                cpu.extra(b) / cpu.interval(b) as f64 <= 0.0526,
                "at most 5 % at {b}"
            );
        }
    }

    /// A step planned to measure that yielded nothing keeps the span: the next
    /// step measures, and its measurement spans both.
    #[test]
    fn a_measurement_that_yields_nothing_keeps_the_span() {
        let mut cadence = NoiseCadence::new(MeasureEvery::Steps(3), SplitCostModel::CPU);
        let none = StepSeconds::Previous(None);
        assert_eq!(cadence.after_step(true, true, 8, none), Some(1));
        for _ in 0..2 {
            assert!(!cadence.measures_next());
            assert_eq!(cadence.after_step(false, false, 8, none), None);
        }
        assert!(cadence.measures_next());
        // Planned, but no finite estimate came of it.
        assert_eq!(cadence.after_step(false, true, 8, none), None);
        assert!(cadence.measures_next(), "measures again");
        assert_eq!(cadence.after_step(true, true, 8, none), Some(4));
    }

    #[test]
    fn measurements_report_the_steps_they_span() {
        let mut cadence = NoiseCadence::new(MeasureEvery::Steps(3), SplitCostModel::CPU);
        let mut spans = Vec::new();
        for _ in 0..9 {
            let measures = cadence.measures_next();
            if let Some(s) = cadence.after_step(measures, true, 8, StepSeconds::Previous(None)) {
                spans.push(s);
            }
        }
        assert_eq!(spans, vec![1, 3, 3], "steps 1, 4 and 7");
    }
}
