//! Step planning: the sampler driven by the schedule, epoch by epoch.
//!
//! This is the whole batch-size logic of the engine without the model, so property
//! tests can run it over many configurations.

use crate::adapt::ramp::Ramp;
use crate::adapt::schedule::{BatchLimits, Schedule};
use crate::config::policy::GradAccum;
use crate::data::length::LengthAwareEpoch;
use crate::data::sampler::{GlobalBatch, GlobalBatchSampler, PlannedRemainder};
use crate::data::source_spec::{SourcesState, StoppingStrategy};
use crate::error::{DataError, Error, Result};

/// How long a run lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    /// This many passes over the data.
    Epochs(usize),
    /// This many optimisation steps.
    Steps(usize),
    /// Until this many tokens are trained: the step that reaches it is the last
    /// (epochs go on as long as it takes).
    Tokens(u64),
}

/// The micro-batches of one optimisation step (one, without gradient accumulation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepBatches {
    /// Global micro-batches, in order; gradients of all of them make one update.
    pub micro: Vec<GlobalBatch>,
}

impl StepBatches {
    /// Examples of the whole step (the effective global batch).
    pub fn global_size(&self) -> usize {
        self.micro.iter().map(GlobalBatch::global_size).sum()
    }
    /// Each rank's examples over all micro-batches.
    pub fn local_sizes(&self) -> Vec<usize> {
        let mut sizes = vec![0; self.micro.first().map_or(0, |m| m.splits.len())];
        for m in &self.micro {
            sizes
                .iter_mut()
                .zip(m.local_sizes())
                .for_each(|(s, l)| *s += l);
        }
        sizes
    }
    /// Each rank's indices over all micro-batches.
    pub fn per_rank_indices(&self) -> Vec<Vec<usize>> {
        let mut all = vec![Vec::new(); self.micro.first().map_or(0, |m| m.splits.len())];
        for m in &self.micro {
            all.iter_mut()
                .enumerate()
                .for_each(|(rank, v)| v.extend_from_slice(m.local(rank)));
        }
        all
    }
    /// All indices of the step, in order.
    pub fn indices(&self) -> Vec<usize> {
        self.micro
            .iter()
            .flat_map(|m| m.indices.iter().copied())
            .collect()
    }
    /// The largest single-rank slice of any micro-batch.
    pub fn max_local(&self) -> usize {
        self.micro
            .iter()
            .flat_map(GlobalBatch::local_sizes)
            .max()
            .unwrap_or(0)
    }
}

/// Where a planner stands: everything its future batches depend on (a checkpoint
/// stores it; resuming restores it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlannerState {
    /// Optimisation steps taken.
    pub global_step: usize,
    /// Current epoch (0-based).
    pub epoch_index: usize,
    /// Examples used in the current epoch.
    pub position: usize,
    /// Examples used in total.
    pub examples_seen: usize,
    /// Per-device size of the next step.
    pub per_device: usize,
    /// Lower clamp in force (an OOM `halve` may have lowered it).
    pub min_batch: usize,
    /// Upper clamp in force (an OOM `halve` may have set it).
    pub max_batch: Option<usize>,
    /// The global-batch ramp in force, if the schedule is in global units (its
    /// position is `examples_seen`). A resumed run keeps the checkpoint's ramp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<Ramp>,
    /// The next global batch, when the engine sets it (`noise_scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_global: Option<usize>,
    /// The micro-batches of the next steps, when the engine sets them (`goodput`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_micro_batches: Option<usize>,
    /// The next step is split into two micro-batches, as a controller asked (the
    /// noise scale's measurement; see [`StepPlanner::split_in_two`]; the name is
    /// the checkpoints').
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measure_split: bool,
    /// The unfinished length-aware epoch (its order and remaining batches), when
    /// the checkpoint was written in the middle of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_epoch: Option<PlannedRemainder>,
    /// Every source's position and the mixing allocator, with several sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<SourcesState>,
    /// The ramp counts tokens consumed (`ScheduleSpec::TokenRamp`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ramp_in_tokens: bool,
    /// Tokens trained in total (kept under a token ramp; 0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_seen: u64,
    /// A mixed run's global batch in tokens (an OOM `halve` may have lowered it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_token_budget: Option<usize>,
    /// The steps a mixer added after the run's planned end (its closing), when
    /// it asked for any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closing: Option<ClosingSteps>,
}

/// Steps a mixer asked for after the run's planned end ([`crate::Mixer::close`]),
/// in rounds: each round trains at the learning rates of the planned run's last
/// `round` steps again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClosingSteps {
    /// The planned run's last step (its steps, from 1).
    pub from_step: usize,
    /// Tokens counted at that step (0 where the planner does not count them).
    pub from_tokens: u64,
    /// The step the closing ends after, so far.
    pub until: usize,
    /// The steps of the round in progress.
    pub round: usize,
}

impl ClosingSteps {
    /// Steps added so far.
    pub fn steps(&self) -> usize {
        self.until - self.from_step
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Yields each step's global batch, applying the schedule after every step.
#[derive(Debug, Clone)]
pub struct StepPlanner<S> {
    sampler: GlobalBatchSampler,
    schedule: S,
    limits: BatchLimits,
    per_device: usize,
    step: usize,
    length: RunLength,
    /// The ranks per-device sizes count: a global batch is `per_device *
    /// units_world`. The run's world size, unless it resumed a checkpoint written on
    /// another number of ranks (it then keeps that run's global batches).
    units_world: usize,
    drop_last: bool,
    accum: GradAccum,
    planned_epoch: Option<usize>,
    /// A schedule in global units (see [`Schedule::ramp`]).
    ramp: Option<Ramp>,
    /// A global batch set from outside (see [`StepPlanner::set_global_batch`]).
    set_global: Option<usize>,
    /// Micro-batches per step set from outside (see
    /// [`StepPlanner::set_micro_batches`]).
    set_micro: Option<usize>,
    /// The next step has at least two micro-batches, for a noise measurement.
    measure_split: bool,
    /// The ramp's position is `tokens_seen`, not examples seen.
    ramp_in_tokens: bool,
    tokens_seen: u64,
    /// Every example's length in tokens, under a token ramp.
    lengths: Option<std::sync::Arc<[usize]>>,
    /// A mixed run's global batch in tokens summed (see
    /// [`StepPlanner::with_mixed_token_budget`]).
    mixed_token_budget: Option<usize>,
    /// The steps a mixer added after the planned end ([`StepPlanner::close_with`]).
    closing: Option<ClosingSteps>,
}

impl<S: Schedule> StepPlanner<S> {
    /// A planner at step 0; `initial_per_device` is the (already clamped) first size,
    /// counted over `units_world` ranks (see [`StepPlanner::global_batch`]).
    pub fn new(
        sampler: GlobalBatchSampler,
        schedule: S,
        limits: BatchLimits,
        initial_per_device: usize,
        length: RunLength,
        units_world: usize,
        drop_last: bool,
    ) -> Result<Self> {
        let ramp = schedule.ramp();
        let ramp_in_tokens = ramp.is_some() && schedule.ramp_counts_tokens();
        let mut planner = Self {
            sampler,
            schedule,
            limits,
            per_device: initial_per_device,
            step: 0,
            length,
            units_world,
            drop_last,
            accum: GradAccum::Fixed(1),
            planned_epoch: None,
            ramp,
            set_global: None,
            set_micro: None,
            measure_split: false,
            ramp_in_tokens,
            tokens_seen: 0,
            lengths: None,
            mixed_token_budget: None,
            closing: None,
        };
        planner.check_fits(None)?;
        if let Some(sources) = planner.sampler.sources() {
            planner.check_primary_weight(0, sources.weights())?;
        }
        Ok(planner)
    }

    /// A run measured in epochs needs the sources that end an epoch to move: the
    /// primary (`primary`), every source (`all_exhausted`). With such a weight at 0
    /// the epoch would never end (HF datasets' stall, issue #7147).
    /// A closing round is counted in steps: its weights may pause any source.
    fn check_primary_weight(&self, step: usize, weights: &[f64]) -> Result<()> {
        let (RunLength::Epochs(_), Some(sources), None) =
            (self.length, self.sampler.sources(), self.closing)
        else {
            return Ok(());
        };
        let spec = sources.spec();
        let stalled = match spec.stopping {
            StoppingStrategy::Primary => weights.first().filter(|&&w| w == 0.0).map(|_| 0),
            StoppingStrategy::AllExhausted => weights.iter().position(|&w| w == 0.0),
            StoppingStrategy::FirstExhausted => None,
        };
        if let Some(s) = stalled {
            return Err(Error::Data(DataError::InvalidMixWeights {
                step,
                reason: format!(
                    "source `{}` has weight 0, so the epoch (ended by {:?}) would never end and the run never stop: give it a positive weight, or bound the run with --max-steps",
                    spec.names[s], spec.stopping
                ),
            }));
        }
        Ok(())
    }

    /// Every example's length in tokens, which a ramp over tokens counts (needed
    /// with `ScheduleSpec::TokenRamp`; one length per example of the sampler).
    pub fn with_lengths(mut self, lengths: std::sync::Arc<[usize]>) -> Self {
        self.lengths = Some(lengths);
        self
    }

    /// A run of several sources whose every global batch holds as many examples
    /// as fit in `max_tokens` tokens summed (`--max-tokens-per-batch N
    /// --packed-token-budget`), instead of a count: every mixer then trains the
    /// same tokens a step. Needs [`StepPlanner::with_lengths`].
    pub fn with_mixed_token_budget(mut self, max_tokens: usize) -> Self {
        self.mixed_token_budget = Some(max_tokens);
        self
    }

    /// Tokens of the examples in `batches`.
    fn tokens_of(&self, batches: &StepBatches) -> u64 {
        // Without lengths every example counts one token (`Dataset::example_len`'s default).
        let Some(lengths) = &self.lengths else {
            return batches.global_size() as u64;
        };
        batches
            .micro
            .iter()
            .flat_map(|m| &m.indices)
            .map(|&i| lengths[i] as u64)
            .sum()
    }

    /// Where the ramp stands: tokens or examples consumed so far.
    fn ramp_position(&self) -> usize {
        if self.ramp_in_tokens {
            usize::try_from(self.tokens_seen).unwrap_or(usize::MAX)
        } else {
            self.sampler.examples_seen()
        }
    }

    /// Tokens trained so far (counted under a token ramp or a run length in
    /// tokens only).
    pub fn tokens_seen(&self) -> u64 {
        self.tokens_seen
    }

    /// Whether tokens are counted: a ramp over tokens, or a run length in tokens.
    fn counts_tokens(&self) -> bool {
        self.ramp_in_tokens || matches!(self.length, RunLength::Tokens(_))
    }

    /// Tokens of the examples in `batches` (examples count one token each
    /// without lengths).
    pub fn step_tokens(&self, batches: &StepBatches) -> u64 {
        self.tokens_of(batches)
    }

    /// With `drop_last`, the next global batch must fit in the dataset; a ramp's
    /// per-device size follows its global batch.
    fn check_fits(&mut self, after_step: Option<usize>) -> Result<()> {
        if self.global_units() {
            let global_batch = self.global_batch();
            self.per_device = global_batch.div_ceil(self.units_world);
            let examples = self.sampler.num_examples();
            if self.drop_last && global_batch > examples {
                return Err(Error::Data(DataError::GlobalBatchTooLarge {
                    global_batch,
                    per_device: self.per_device,
                    world_size: self.units_world,
                    examples,
                    after_step,
                }));
            }
            return Ok(());
        }
        check_fits(
            self.drop_last,
            self.per_device,
            self.units_world,
            self.sampler.num_examples(),
            after_step,
        )
    }

    /// The sizes of the next step's global micro-batches: `n` of `global_batch()`
    /// each; under a ramp, the ramp's global batch split into `n` near-equal parts.
    fn micro_sizes(&self) -> Vec<usize> {
        let wanted = self.micro_batches_per_step();
        let global = self.global_batch();
        if !self.global_units() {
            return vec![global; wanted];
        }
        let parts = wanted.min(global).max(1);
        (0..parts)
            .map(|k| global / parts + usize::from(k < global % parts))
            .collect()
    }

    /// Accumulates gradients over several global micro-batches per step. A step
    /// never spans two epochs: its last micro-batch may be the epoch's tail.
    pub fn with_grad_accum(mut self, accum: GradAccum) -> Self {
        self.accum = accum;
        self
    }

    fn micro_batches_per_step(&self) -> usize {
        let planned = self.planned_micro_batches();
        if self.measure_split {
            planned.max(2)
        } else {
            planned
        }
    }

    /// Micro-batches per step as accumulation (or goodput) plans them.
    fn planned_micro_batches(&self) -> usize {
        if let Some(n) = self.set_micro {
            return n.max(1);
        }
        match self.accum {
            GradAccum::Fixed(n) => n.max(1),
            GradAccum::Target { global } => global.div_ceil(self.global_batch()).max(1),
        }
    }

    /// The next step's micro-batches, or `None` when the run is over.
    pub fn next_step(&mut self) -> Option<StepBatches> {
        self.next_step_with(|_| Ok(None)).unwrap_or(None)
    }

    /// Like [`StepPlanner::next_step`]; before an epoch's first step,
    /// `plan_epoch(epoch)` may return a length-aware plan for it.
    pub fn next_step_with(
        &mut self,
        mut plan_epoch: impl FnMut(usize) -> Result<Option<LengthAwareEpoch>>,
    ) -> Result<Option<StepBatches>> {
        loop {
            if self.sampler.position() == 0
                && self.planned_epoch != Some(self.sampler.epoch_index())
            {
                let epoch = self.sampler.epoch_index();
                self.planned_epoch = Some(epoch);
                let within_length = self.closing_left()
                    || match self.length {
                        RunLength::Epochs(epochs) => epoch < epochs,
                        RunLength::Steps(max) => self.step < max,
                        RunLength::Tokens(max) => self.tokens_seen < max,
                    };
                if within_length {
                    if let Some(plan) = plan_epoch(epoch)? {
                        self.sampler
                            .start_planned_epoch(plan.order, &plan.sizes, &plan.predicted);
                    }
                }
            }
            let over = match self.length {
                RunLength::Steps(max) => self.step >= max,
                RunLength::Tokens(max) => self.tokens_seen >= max,
                RunLength::Epochs(epochs) => self.sampler.epoch_index() >= epochs,
            };
            if (over || self.closing.is_some()) && !self.closing_left() {
                return Ok(None);
            }
            let micro: Vec<GlobalBatch> = match (self.mixed_token_budget, self.lengths.clone()) {
                (Some(max_tokens), Some(lengths)) => self
                    .sampler
                    .next_global_tokens(max_tokens, &lengths)
                    .into_iter()
                    .collect(),
                _ => self
                    .micro_sizes()
                    .iter()
                    .map_while(|&size| self.sampler.next_global(size))
                    .collect(),
            };
            if !micro.is_empty() {
                self.step += 1;
                let batches = StepBatches { micro };
                if self.counts_tokens() {
                    self.tokens_seen += self.tokens_of(&batches);
                }
                return Ok(Some(batches));
            }
            if self.length == RunLength::Epochs(self.sampler.epoch_index() + 1)
                && !self.closing_left()
            {
                // The last epoch is used up: no permutation to draw for the next.
                return Ok(None);
            }
            self.sampler.start_next_epoch();
        }
    }

    /// Asks the schedule for the next size after the step just taken.
    pub fn finish_step(&mut self) -> Result<()> {
        if !self.global_units() {
            let raw = self.schedule.next(self.step, self.per_device);
            self.per_device = self.limits.apply(self.step, raw)?;
        }
        self.check_fits(Some(self.step))
    }

    /// Puts a step's examples back, to be drawn again (after an OOM).
    pub fn rewind(&mut self, batches: &StepBatches) {
        self.sampler.rewind(batches.global_size());
        if self.counts_tokens() {
            self.tokens_seen -= self.tokens_of(batches);
        }
        self.step -= 1;
    }

    /// Halves the per-device size and caps later growth there (HF
    /// `auto_find_batch_size`); `false` when it is already 1.
    pub fn halve(&mut self) -> bool {
        if let Some(max_tokens) = self.mixed_token_budget {
            // A batch in tokens: halve the budget (kept from then on).
            if max_tokens <= 1 {
                return false;
            }
            self.mixed_token_budget = Some(max_tokens / 2);
            return true;
        }
        if self.sampler.is_planned() {
            // Length-aware epochs: split the failed batch itself.
            return self.sampler.split_next_planned();
        }
        if self.global_units() {
            // Halve the ramp's current size; the cap then bounds the ramp.
            self.per_device = self.global_batch().div_ceil(self.units_world);
        }
        if self.per_device <= 1 {
            return false;
        }
        self.per_device /= 2;
        self.limits.max = Some(
            self.limits
                .max
                .map_or(self.per_device, |m| m.min(self.per_device)),
        );
        self.limits.min = self.limits.min.min(self.per_device);
        true
    }

    /// Forgets the step just drawn without training it: its examples stay consumed.
    pub fn skip_step(&mut self) {
        self.step -= 1;
    }

    /// Where the planner stands now.
    pub fn state(&self) -> PlannerState {
        PlannerState {
            global_step: self.step,
            epoch_index: self.sampler.epoch_index(),
            position: self.sampler.position(),
            examples_seen: self.sampler.examples_seen(),
            per_device: self.per_device,
            min_batch: self.limits.min,
            max_batch: self.limits.max,
            ramp: self.ramp,
            set_global: self.set_global,
            set_micro_batches: self.set_micro,
            measure_split: self.measure_split,
            ramp_in_tokens: self.ramp_in_tokens,
            tokens_seen: self.tokens_seen,
            planned_epoch: self.sampler.planned_remainder(),
            sources: self.sampler.sources_state(),
            mixed_token_budget: self.mixed_token_budget,
            closing: self.closing,
        }
    }

    /// Continues from a saved [`PlannerState`].
    pub fn restore(&mut self, state: &PlannerState) {
        self.sampler
            .restore(state.epoch_index, state.position, state.examples_seen);
        self.step = state.global_step;
        self.per_device = state.per_device;
        self.limits = BatchLimits {
            min: state.min_batch,
            max: state.max_batch,
        };
        self.planned_epoch = None;
        if let Some(sources) = &state.sources {
            self.sampler.restore_sources(sources);
        }
        if let Some(remainder) = &state.planned_epoch {
            // The epoch is planned already: continue its plan instead of making one.
            self.sampler.resume_planned_epoch(remainder);
            self.planned_epoch = Some(state.epoch_index);
        }
        if state.ramp.is_some() {
            self.ramp = state.ramp;
            self.ramp_in_tokens = state.ramp_in_tokens;
        }
        self.tokens_seen = state.tokens_seen;
        if state.set_global.is_some() {
            self.set_global = state.set_global;
        }
        if state.set_micro_batches.is_some() {
            self.set_micro = state.set_micro_batches;
        }
        self.measure_split = state.measure_split;
        if state.mixed_token_budget.is_some() {
            self.mixed_token_budget = state.mixed_token_budget;
        }
        self.closing = state.closing;
    }

    /// Adds `steps` steps after the planned end (called once the planner says the
    /// run is over: [`StepPlanner::next_step`] returned `None`), a round of the
    /// closing a mixer asked for. The run is over again after them.
    pub fn close_with(&mut self, steps: usize) {
        let closing = self.closing.get_or_insert(ClosingSteps {
            from_step: self.step,
            from_tokens: self.tokens_seen,
            until: self.step,
            round: 0,
        });
        closing.until = self.step + steps;
        closing.round = steps;
    }

    /// The steps added after the planned end, if any.
    pub fn closing(&self) -> Option<ClosingSteps> {
        self.closing
    }

    /// Where the step just drawn stands in the closing round in progress: `(k,
    /// n)`, its k-th step (from 0) of n; `None` for a planned step.
    pub fn closing_position(&self) -> Option<(usize, usize)> {
        let closing = self.closing?;
        let round_start = closing.until - closing.round;
        (self.step > round_start).then(|| (self.step - 1 - round_start, closing.round))
    }

    /// Whether a closing round still has steps to draw.
    fn closing_left(&self) -> bool {
        self.closing.is_some_and(|c| self.step < c.until)
    }

    /// The clamps in force.
    #[cfg(feature = "internals")]
    pub fn limits(&self) -> BatchLimits {
        self.limits
    }

    /// Steps taken so far.
    pub fn step(&self) -> usize {
        self.step
    }
    /// The next step's global (micro-)batch: the one place where a per-device size
    /// becomes a global one. A schedule in global units (a ramp) gives the whole
    /// step's global batch itself, from the examples consumed so far, capped by
    /// `max_batch × ranks` (an OOM `halve` sets that cap).
    pub fn global_batch(&self) -> usize {
        let given = self.set_global.or_else(|| {
            self.ramp
                .map(|ramp| ramp.global_batch(self.ramp_position()))
        });
        match given {
            Some(global) => self.limits.max.map_or(global, |max| {
                global.min(max.saturating_mul(self.units_world))
            }),
            None => self.per_device.saturating_mul(self.units_world),
        }
    }

    /// Whether the global batch is given directly (a ramp, or set from outside).
    fn global_units(&self) -> bool {
        self.ramp.is_some() || self.set_global.is_some()
    }

    /// Sets the global batch of the next steps (a schedule in global units that
    /// the engine drives, such as `noise_scale`); split like a ramp's.
    pub fn set_global_batch(&mut self, global: usize) {
        self.set_global = Some(global.max(1));
        self.per_device = self.global_batch().div_ceil(self.units_world);
    }
    /// Sets the micro-batches of the next steps (a schedule that chooses the
    /// accumulation, such as `goodput`): the global batch is split into `n` parts.
    pub fn set_micro_batches(&mut self, n: usize) {
        self.set_micro = Some(n.max(1));
    }

    /// Whether splitting the next step in two changes its micro-batches and not
    /// its examples: a batch in global units, of two examples or more, planned
    /// as one micro-batch.
    pub fn can_split_in_two(&self) -> bool {
        self.global_units() && self.planned_micro_batches() == 1 && self.global_batch() >= 2
    }

    /// Splits the next steps into two micro-batches (at least) while `split`:
    /// the same examples, one more pass.
    pub fn split_in_two(&mut self, split: bool) {
        self.measure_split = split;
    }

    /// Whether the next step is split in two.
    pub fn splits_in_two(&self) -> bool {
        self.measure_split
    }

    /// The number of ranks the global batch is shared by.
    pub fn world_size(&self) -> usize {
        self.sampler.world_size()
    }

    /// Micro-batches of the next step.
    #[cfg(feature = "internals")]
    pub fn micro_batches(&self) -> usize {
        self.micro_batches_per_step()
    }

    /// The global-batch ramp in force, if any.
    #[cfg(feature = "internals")]
    pub fn ramp(&self) -> Option<Ramp> {
        self.ramp
    }
    /// Per-device size of the next step.
    pub fn per_device(&self) -> usize {
        self.per_device
    }
    /// The mixing weights of the next steps (a mixer's, after step `step`); a
    /// typed error for weights that cannot divide a batch.
    pub fn set_mix_weights(&mut self, step: usize, weights: &[f64]) -> Result<()> {
        self.check_primary_weight(step, weights)?;
        match self.sampler.sources_mut() {
            Some(sources) => sources.set_weights(step, weights),
            None => Err(Error::Data(DataError::MixerWithoutSources)),
        }
    }

    /// Coverage and epoch accounting.
    pub fn sampler(&self) -> &GlobalBatchSampler {
        &self.sampler
    }
    /// Whether the current epoch is over: nothing left to draw from it at the next
    /// step's size (its examples used up, or a tail that `drop_last` drops). Called
    /// after [`StepPlanner::finish_step`].
    pub fn epoch_complete(&self) -> bool {
        !self.sampler.can_draw(self.micro_sizes()[0])
    }

    /// Whether the step just taken is the run's last: the `max_steps`-th, or the
    /// end of the last epoch (its examples used up, or a remainder that
    /// `drop_last` will drop). Called before [`StepPlanner::finish_step`].
    pub fn is_last_step(&self) -> bool
    where
        S: Clone,
    {
        if let Some(closing) = self.closing {
            return self.step >= closing.until;
        }
        match self.length {
            RunLength::Steps(max) => self.step >= max,
            RunLength::Tokens(max) => self.tokens_seen >= max,
            RunLength::Epochs(epochs) => {
                if self.sampler.epoch_index() + 1 < epochs {
                    return false;
                }
                let remaining = self.sampler.num_examples() - self.sampler.position();
                if remaining == 0 {
                    return true;
                }
                if !self.drop_last || self.sampler.is_planned() {
                    return false;
                }
                if self.global_units() {
                    // The ramp's next size is known already: it follows the examples seen.
                    return remaining < self.micro_sizes()[0];
                }
                // The size the schedule will pick next decides whether the rest is dropped.
                let raw = self.schedule.clone().next(self.step, self.per_device);
                let next = self.limits.apply(self.step, raw).unwrap_or(self.per_device);
                remaining < next * self.units_world
            }
        }
    }
}

/// With `drop_last`, a global batch larger than the dataset could never be used.
pub fn check_fits(
    drop_last: bool,
    per_device: usize,
    world_size: usize,
    examples: usize,
    after_step: Option<usize>,
) -> Result<()> {
    let global_batch = per_device.saturating_mul(world_size);
    if drop_last && global_batch > examples {
        return Err(Error::Data(DataError::GlobalBatchTooLarge {
            global_batch,
            per_device,
            world_size,
            examples,
            after_step,
        }));
    }
    Ok(())
}
