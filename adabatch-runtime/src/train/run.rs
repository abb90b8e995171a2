//! A rank's run as an object: the loop written once and monomorphised per trainer.
//!
//! Each step reads as the design's contract: the planner draws the step's
//! batches; the rank trains its share ([`RankRun::step`], one all-reduce); the
//! controllers adapt the next step in their fixed order ([`RankRun::adapt`]); the
//! step is logged, the callbacks are asked, and the run evaluates and saves when
//! due ([`RankRun::after_step`]). Every rank does all of it alike.

use candle_core::{Device, Var};

use crate::adapt::mixer::Closing;

use crate::adapt::schedule::ScheduleSpec;
use crate::data::length::LengthIndex;
use crate::data::planner::{PlannerState, StepBatches, StepPlanner};
use crate::data::source_spec::SourceSpec;
use crate::dist::communicator::Communicator;
use crate::dist::parameters::synchronise_parameters;
use crate::error::{Error, ModelError, Result, SettingsError, TrainingError};
use crate::memory::device_memory::PeakSampler;
use crate::memory::host::keep_freed_memory;
use crate::memory::memory_model::BatchFeatures;
use crate::optim::TrainOptimizer;
use crate::report::logging::Logger;
use crate::report::record::{EvalLog, SourceLog, StepLog};
use crate::report::summary::TrainSummary;
use crate::train::checkpoint::{
    best_checkpoint_dir, checkpoint_dir, init_weights, load_best, resume_checkpoint,
    save_checkpoint, CheckpointState, OutputLock,
};
use crate::train::control::mixing::check_mixer_sources;
use crate::train::control::{Controllers, Steer, StepReport};
use crate::train::eval::{evaluate, held_out_losses, held_out_set, EvalInput, HeldOut};
use crate::train::interrupt::Interrupts;
use crate::train::prefetch::{PrefetchStats, Prefetcher};
use crate::train::progress::{Progress, RunOutcome};
use crate::train::settings::{BestCheckpoint, Interval, RunSettings};
use crate::train::source_sums::SourceLosses;
use crate::train::step::{train_step, StepInput, StepOutcome, StepPlan, TrainedStep};
use crate::user::callback::{TrainerControl, TrainerState};
use crate::user::data::Dataset;
use crate::user::train_model::TrainModel;
use crate::user::trainer::{AdaptiveTrainer, BatchOf, CollateFor};
use crate::user::weights::save_pretrained;

/// What the ranks train and evaluate on: the training set, the eval set (the same
/// item type, collated alike) if any, and the collate.
pub(crate) struct RunData<'a, D: ?Sized, C> {
    pub(crate) train: &'a D,
    pub(crate) eval: Option<&'a D>,
    pub(crate) collate: &'a C,
}

impl<D: ?Sized, C> Clone for RunData<'_, D, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: ?Sized, C> Copy for RunData<'_, D, C> {}

/// The last trained step as callbacks see it: its global batch, loss and
/// learning rate.
#[derive(Debug, Clone, Copy)]
struct LastStep {
    global_batch: usize,
    loss: f64,
    learning_rate: f64,
}

impl LastStep {
    /// Before the first step of this process (a resumed run's too).
    const NONE: Self = Self {
        global_batch: 0,
        loss: f64::NAN,
        learning_rate: 0.0,
    };
}

/// The prefetcher of a run's step loop.
type RunPrefetcher<'s, 'e, D, C> = Prefetcher<'s, 'e, D, C, ScheduleSpec>;

/// One rank's run, from its first step to its summary.
pub(crate) struct RankRun<'a, T, D: ?Sized, C, M> {
    trainer: &'a mut T,
    comm: &'a M,
    data: RunData<'a, D, C>,
    settings: &'a RunSettings,
    device: &'a Device,
    logger: Option<&'a mut Logger>,
    /// Rank 0 of a run that saves holds its output directory.
    _output_lock: Option<OutputLock>,
    /// The model's parameters, sorted by name (the same order on every rank):
    /// what checkpoints hold.
    params: Vec<(String, Var)>,
    /// Those that train (frozen ones aside): what steps all-reduce and update.
    trainable: Vec<(String, Var)>,
    planner: StepPlanner<ScheduleSpec>,
    controllers: Controllers,
    input: StepInput<'a, D, C>,
    length_index: Option<LengthIndex>,
    progress: Progress,
    evaluations: Vec<EvalLog>,
    /// HF's `log_history` so far (checkpoints export it in `trainer_state.json`).
    log_history: Vec<serde_json::Value>,
    /// `--load-best-model-at-end`: the checkpoint that scored best so far.
    best: Option<BestCheckpoint>,
    last: LastStep,
    last_evaluated: Option<usize>,
    last_saved: Option<usize>,
    /// Where a resumed run started.
    resumed_at: Option<PlannerState>,
    /// The trainer has a `#[callback]` (asked once: the answer needs `&mut`).
    has_callback: bool,
    /// A signal reached some rank during the last step: the run stops after it.
    interrupted: bool,
    /// `--mixer-eval-examples`: the held-out set (eval-set indices) and the eval
    /// set's sources.
    held_out: Option<(Vec<usize>, SourceSpec)>,
    /// The mixer's closing ended short of its condition ([`Closing::Capped`]).
    closing_capped: bool,
}

impl<'a, T, D, C, M> RankRun<'a, T, D, C, M>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    M: Communicator,
{
    /// Checks the trainer against the settings, resumes the checkpoint if one is
    /// asked for, gives every rank rank 0's weights, and starts the planner and
    /// the controllers where the run (or the checkpoint) starts.
    pub(crate) fn start(
        trainer: &'a mut T,
        comm: &'a M,
        data: RunData<'a, D, C>,
        settings: &'a RunSettings,
        device: &'a Device,
        mut logger: Option<&'a mut Logger>,
    ) -> Result<Self> {
        if !settings.release_freed_memory {
            keep_freed_memory();
        }
        let eval_len = data.eval.map(|e| e.len());
        let has_mixer = trainer.mixer().is_some();
        let has_callback = trainer.callback().is_some();
        settings.check_run(eval_len, has_mixer, comm.world_size(), logger.as_deref())?;
        let held_out = run_held_out_set(settings, data.eval, &mut *trainer)?;
        let output_lock = hold_output_dir(settings, comm.rank())?;
        let params = sorted_parameters(&*trainer.parts().0)?;
        let trainable = trainable_parameters(&*trainer.parts().1, &params)?;
        check_preconditioner(settings, &*trainer.parts().1, &trainable)?;
        check_mixer_sources(settings.sources.as_ref(), &mut *trainer)?;
        let resumed =
            starting_weights(settings, &params, &mut *trainer, comm, device, &mut logger)?;
        let mut planner = settings.step_planner(settings.seed, settings.shuffle)?;
        let mut controllers = Controllers::new(settings)?;
        controllers.oom =
            (controllers.oom).with_examples_independent(data.collate.examples_independent());
        // Fresh or resumed alike, so that a resumed run warms up as the whole one.
        controllers.plan_mixer(&mut *trainer, settings.expected_steps(), logger.as_deref());
        match &resumed {
            Some(state) => {
                planner.restore(&state.planner);
                controllers.restore(&state.controllers, comm.rank(), &mut *trainer)?;
            }
            None => controllers.begin(&mut Steer {
                planner: &mut planner,
                trainer: &mut *trainer,
                logger: logger.as_deref(),
            })?,
        }
        let length_index = settings.length_index(data.train);
        Ok(Self {
            input: StepInput::new(data.train, data.collate, device, &settings.step),
            trainer,
            comm,
            data,
            settings,
            device,
            logger,
            _output_lock: output_lock,
            params,
            trainable,
            planner,
            controllers,
            length_index,
            progress: Progress::resumed(resumed.as_ref().map(|s| &s.unlogged_losses[..])),
            evaluations: resumed
                .as_ref()
                .map(|s| s.evaluations.clone())
                .unwrap_or_default(),
            log_history: resumed
                .as_ref()
                .map_or_else(Vec::new, CheckpointState::history),
            best: resumed.as_ref().and_then(|s| s.best),
            last: LastStep::NONE,
            // A resumed run starts from its checkpoint: one that trains nothing
            // more neither evaluates again nor writes the checkpoint again.
            last_evaluated: resumed.as_ref().map(|s| s.planner.global_step),
            last_saved: resumed.as_ref().map(|s| s.planner.global_step),
            resumed_at: resumed.map(|s| s.planner),
            has_callback,
            interrupted: false,
            held_out,
            closing_capped: false,
        })
    }

    /// Trains until the planner says the run is over (or a callback stops it),
    /// then finishes: the last evaluation and checkpoint, the best model, the
    /// summary.
    pub(crate) fn run(mut self) -> Result<TrainSummary> {
        if self.settings.eval.on_start {
            self.evaluate()?;
        }
        let prefetch = self.steps()?;
        self.finish(prefetch)
    }

    /// The step loop. Collate threads live in its scope: they borrow the dataset
    /// and the collate.
    fn steps(&mut self) -> Result<PrefetchStats> {
        let (dataset, collate, device) = (self.data.train, self.data.collate, self.device);
        let (rank, workers) = (self.comm.rank(), self.settings.prefetch_workers);
        let length_aware = self.settings.batching.is_some();
        std::thread::scope(|scope| {
            let mut prefetcher = Prefetcher::new(
                scope,
                (dataset, collate, device),
                rank,
                workers,
                length_aware,
            );
            loop {
                let Some(batches) = self.next_batches()? else {
                    if self.close_round()? {
                        continue;
                    }
                    break;
                };
                let record = match self.step(&batches, &mut prefetcher)? {
                    StepEnd::Trained { record } => record.map(|r| *r),
                    // The same examples come again.
                    StepEnd::OutOfMemory => continue,
                };
                let control = self.after_step(record)?;
                if self.interrupted {
                    return Err(self.stop_on_signal()?);
                }
                if control.should_training_stop {
                    if let Some(logger) = self.logger.as_deref() {
                        let step = self.planner.step();
                        logger.event(&format!("step {step}: a callback stopped training"));
                    }
                    break;
                }
            }
            Ok(prefetcher.stats)
        })
    }

    /// At the planned end, and after each closing round: the mixer's closing
    /// (when it closes), from the model's reading at this step (an evaluation
    /// unless one ran here, the held-out losses when the run has a held-out
    /// set). Returns whether the run takes more steps.
    fn close_round(&mut self) -> Result<bool> {
        if !self.controllers.closes(&mut *self.trainer) {
            return Ok(false);
        }
        let step = self.planner.step();
        if self.evaluations.last().map(|e| e.step) != Some(step) {
            self.evaluate()?;
        }
        let held_out = match (&self.held_out, self.data.eval) {
            (Some(set), Some(eval)) => {
                let input = self.eval_input(eval);
                Some(held_out_losses(
                    self.trainer,
                    self.comm,
                    &input,
                    (&set.0, &set.1),
                )?)
            }
            _ => None,
        };
        let mut steer = Steer {
            planner: &mut self.planner,
            trainer: &mut *self.trainer,
            logger: self.logger.as_deref(),
        };
        let readings = (self.evaluations.last(), held_out.as_ref());
        let closing = self.controllers.close(step, readings, &mut steer)?;
        let logger = self.logger.as_deref();
        match closing {
            Closing::Round { steps, why } => {
                if let Some(logger) = logger {
                    logger.event(&format!(
                        "step {step}: the mixer's closing: {why}; {steps} more step(s) on its weights, at the learning rates of the planned run's last {steps} step(s)"
                    ));
                }
                Ok(true)
            }
            Closing::Capped { why } => {
                self.closing_capped = true;
                if let Some(logger) = logger {
                    logger.event(&format!(
                        "warning: step {step}: the run ends short of the mixer's closing: {why}"
                    ));
                }
                Ok(false)
            }
            Closing::End => Ok(false),
        }
    }

    /// The next step's batches; before an epoch's first step a length-aware run
    /// plans the epoch from the memory model.
    fn next_batches(&mut self) -> Result<Option<StepBatches>> {
        let comm = self.comm;
        let index = self.length_index.as_ref();
        let memory = &self.controllers.memory;
        let trainer = &mut *self.trainer;
        self.planner
            .next_step_with(|epoch| memory.plan_epoch(index, &mut *trainer, comm, epoch))
    }

    /// Trains one step on this rank and lets the controllers adapt to it.
    fn step<'s>(
        &mut self,
        batches: &StepBatches,
        prefetcher: &mut RunPrefetcher<'s, '_, D, C>,
    ) -> Result<StepEnd>
    where
        BatchOf<T>: 's,
    {
        let step = self.planner.step();
        let predicted_memory = self.planner.sampler().last_predicted();
        let consumed_before = self.settings.lr_position(&self.planner, batches);
        let phi = self.controllers.noise_scale_for_lr();
        let lr = (self.settings.lr).at_noise_scale(consumed_before, batches.global_size(), phi);
        let log_now = self.log_due(step);
        // Only memory-aware runs need the device's peak (it synchronises the device).
        let peak = (self.controllers.memory.memory_mode() && !self.device.is_cpu())
            .then(|| PeakSampler::start(self.device));
        let (outcome, chunks) = self.train((step, lr, log_now), batches, prefetcher)?;
        let device_peak = peak.and_then(|p| p.finish().pool_peak);
        let Some(&TrainedStep {
            loss,
            grad_norm,
            interrupted,
            ref readings,
            ..
        }) = outcome.trained()
        else {
            self.adapt(step, batches, &outcome, (None, None))?;
            return Ok(StepEnd::OutOfMemory);
        };
        let rank_chunks = (self.comm.rank(), chunks);
        // A step that measured the sources' gradients ran its chunks in smaller
        // pieces: its peak is not its chunks', and would teach the model too low.
        let measured = (readings.get::<SourceLosses>()).is_some_and(|s| s.gradients.is_some());
        let memory = (self.controllers.memory).measure(
            self.data.train,
            self.device,
            batches,
            rank_chunks,
            device_peak.filter(|_| !measured),
        );
        self.interrupted = interrupted;
        self.progress.trained(loss, batches.global_size());
        if let Some(logger) = self.logger.as_deref() {
            logger.advance(batches.global_size(), self.planner.sampler().epoch());
        }
        let mut record = log_now.then(|| {
            let grad_norm = grad_norm.unwrap_or(f64::NAN);
            let trained = (step, batches, grad_norm, lr);
            let per_source = readings.get::<SourceLosses>();
            let per_source = (
                per_source.map(|s| &s.loss[..]),
                per_source.and_then(|s| s.tokens.as_deref()),
            );
            self.step_record(trained, predicted_memory, per_source)
        });
        let held_out = self.held_out_if_asked(step)?;
        self.adapt(step, batches, &outcome, (memory, held_out.as_ref()))?;
        if let Some(entry) = record.as_mut() {
            self.controllers.record(entry);
        }
        self.last = LastStep {
            global_batch: batches.global_size(),
            loss,
            learning_rate: lr,
        };
        Ok(StepEnd::Trained {
            record: record.map(Box::new),
        })
    }

    /// Runs the step's passes, all-reduce and update on this rank, in the pieces
    /// the OOM controller asks for, and times it: `(step, lr, want_norm)`.
    fn train<'s>(
        &mut self,
        (step, lr, want_norm): (usize, f64, bool),
        batches: &StepBatches,
        prefetcher: &mut RunPrefetcher<'s, '_, D, C>,
    ) -> Result<(StepOutcome, usize)>
    where
        BatchOf<T>: 's,
    {
        let chunks = self.controllers.oom.chunks();
        let probes = self
            .controllers
            .prepare(&mut self.input, step, &mut *self.trainer);
        // The step's own time (collating, computing, the all-reduce, the update),
        // without evaluation or saving: what goodput's step-time model fits.
        let started = std::time::Instant::now();
        let ready = prefetcher.take(batches, chunks);
        prefetcher.look_ahead(&self.planner, chunks);
        let plan = StepPlan {
            batches,
            step,
            lr,
            chunks,
            want_norm,
            ready,
            probes: &probes,
        };
        let (input, trainable) = (&mut self.input, &self.trainable);
        let outcome = train_step(self.trainer, self.comm, input, trainable, plan);
        drop(probes);
        let outcome = outcome.map_err(|e| self.diverged(e))?;
        self.controllers.step_time(match outcome {
            StepOutcome::Trained(_) => started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE),
            StepOutcome::OutOfMemory { .. } => 0.0,
        });
        Ok((outcome, chunks))
    }

    /// A logged step's record before the controllers add theirs: `(step, batches,
    /// grad_norm, lr)` of the step that trained.
    fn step_record(
        &mut self,
        (step, batches, grad_norm, lr): (usize, &StepBatches, f64, f64),
        predicted_memory: Option<f64>,
        per_source: (Option<&[f64]>, Option<&[f64]>),
    ) -> StepLog {
        let mut entry =
            self.progress
                .step_log(self.planner.sampler(), step, batches, grad_norm, lr);
        entry.predicted_memory = predicted_memory;
        if let Some(mixed) = self.planner.sampler().sources() {
            let indices = batches.micro.iter().flat_map(|m| m.indices.iter().copied());
            entry.sources = SourceLog::of(mixed, indices, per_source);
        }
        entry
    }

    /// Whether this step is logged. A logged step builds its record for the log
    /// and for `Callback::on_log`.
    fn log_due(&self, step: usize) -> bool {
        let settings = self.settings;
        (self.logger.is_some() || self.has_callback)
            && (step % settings.logs.every == 0
                || self.planner.is_last_step()
                || (step == 1 && settings.logs.first_step))
    }

    /// The controllers, in their fixed order, after a step (see [`Controllers`]).
    fn adapt(
        &mut self,
        step: usize,
        batches: &StepBatches,
        outcome: &StepOutcome,
        (memory, held_out): (Option<(BatchFeatures, u64)>, Option<&HeldOut>),
    ) -> Result<()> {
        let report = StepReport {
            step,
            batches,
            outcome,
            memory,
            last_eval: self.evaluations.last(),
            held_out,
        };
        let mut steer = Steer {
            planner: &mut self.planner,
            trainer: &mut *self.trainer,
            logger: self.logger.as_deref(),
        };
        self.controllers.adapt(&report, &mut steer)
    }

    /// After a step that ran: its log line, the callbacks, and the evaluation and
    /// checkpoint when due (or asked for). Returns what the run does next.
    fn after_step(&mut self, record: Option<StepLog>) -> Result<TrainerControl> {
        if let (Some(logger), Some(entry)) = (self.logger.as_deref_mut(), &record) {
            logger.log(entry)?;
        }
        if let Some(entry) = &record {
            self.log_history.push(entry.hf_log_entry());
        }
        let (step, epoch_ended) = (self.planner.step(), self.planner.epoch_complete());
        let mut control = TrainerControl {
            should_training_stop: false,
            should_save: self.settings.saves.every.due(step, epoch_ended),
            should_evaluate: self.settings.eval.every.due(step, epoch_ended),
        };
        self.callbacks(record.as_ref(), &mut control)?;
        // Evaluation and saving time is not training time: the next logged
        // `examples_per_s` leaves it out (HF logs `eval_runtime` apart).
        let paused = std::time::Instant::now();
        if control.should_evaluate && self.data.eval.is_some() {
            let asked = self.evaluate()?;
            control.should_training_stop |= asked.should_training_stop;
            control.should_save |= asked.should_save;
        }
        if control.should_save {
            self.save()?;
        }
        self.progress.pause(paused.elapsed());
        Ok(control)
    }

    /// The callback's step hooks (`on_step_end`, `on_log`, `on_epoch_end`), their
    /// requests combined over the ranks.
    fn callbacks(&mut self, record: Option<&StepLog>, control: &mut TrainerControl) -> Result<()> {
        if self.trainer.callback().is_none() {
            return Ok(());
        }
        let state = self.trainer_state();
        let epoch_ended = self.planner.epoch_complete();
        if let Some(callback) = self.trainer.callback() {
            callback.on_step_end(&state, control);
            if let Some(entry) = record {
                callback.on_log(&state, entry, control);
            }
            if epoch_ended {
                callback.on_epoch_end(&state, control);
            }
        }
        *control = agree(self.comm, *control)?;
        Ok(())
    }

    /// What callbacks see after a step.
    fn trainer_state(&self) -> TrainerState {
        TrainerState {
            rank: self.comm.rank(),
            world_size: self.comm.world_size(),
            global_step: self.planner.step(),
            epoch: self.planner.sampler().epoch(),
            examples_seen: self.planner.sampler().examples_seen(),
            global_batch: self.last.global_batch,
            loss: self.last.loss,
            learning_rate: self.last.learning_rate,
            evaluations: self.evaluations.clone(),
        }
    }

    /// Evaluates on the eval set (if any) where the planner stands, logs it on
    /// rank 0, keeps it, and runs the callback's `on_evaluate`: returns what the
    /// callback asked (combined over the ranks).
    fn evaluate(&mut self) -> Result<TrainerControl> {
        let Some(eval) = self.data.eval else {
            return Ok(TrainerControl::default());
        };
        let input = self.eval_input(eval);
        let (step, epoch) = (self.planner.step(), self.planner.sampler().epoch());
        let train_seconds = self.progress.train_seconds();
        let mut entry = evaluate(self.trainer, self.comm, &input, step, epoch)?;
        entry.train_seconds = Some(train_seconds);
        if let Some(logger) = self.logger.as_deref_mut() {
            logger.log_eval(&entry)?;
        }
        self.log_history.push(entry.hf_log_entry());
        self.evaluations.push(entry);
        self.last_evaluated = Some(step);
        let mut asked = TrainerControl::default();
        if self.trainer.callback().is_some() {
            let state = self.trainer_state();
            if let (Some(callback), Some(metrics)) =
                (self.trainer.callback(), self.evaluations.last())
            {
                callback.on_evaluate(&state, metrics, &mut asked);
            }
            asked = agree(self.comm, asked)?;
        }
        Ok(asked)
    }

    /// How this run evaluates `eval`.
    fn eval_input(&self, eval: &'a D) -> EvalInput<'a, D, C> {
        EvalInput::of((eval, self.data.collate), self.device, self.settings)
    }

    /// The held-out losses after `step`, when a controller asks for them (a
    /// typed error when the run has no held-out set).
    fn held_out_if_asked(&mut self, step: usize) -> Result<Option<HeldOut>> {
        if !self.controllers.wants_held_out(step, &mut *self.trainer) {
            return Ok(None);
        }
        let (Some((set, spec)), Some(eval)) = (&self.held_out, self.data.eval) else {
            return Err(Error::Settings(SettingsError::HeldOutSet {
                reason: format!(
                    "the mixer asked for held-out losses after step {step}, but the run has none: give --mixer-eval-examples N and an eval set of the training sources"
                ),
            }));
        };
        let input = self.eval_input(eval);
        held_out_losses(self.trainer, self.comm, &input, (set, spec)).map(Some)
    }

    /// A checkpoint of the run where the planner stands. Every rank calls it at
    /// the same step (memory-aware runs gather every rank's model; every rank
    /// keeps the same best checkpoint); rank 0 writes it.
    fn save(&mut self) -> Result<()> {
        let step = self.planner.step();
        if let Some(rule) = &self.settings.saves.best_model {
            self.best = rule.consider(self.best, step, &self.evaluations)?;
        }
        // Every rank holds the same weights: all refuse together.
        let not_finite = non_finite(&self.params)?;
        if !not_finite.is_empty() {
            return Err(
                self.diverged(Error::Training(TrainingError::NonFiniteWeights {
                    step,
                    names: not_finite,
                    last_checkpoint: None,
                })),
            );
        }
        let controllers = self.controllers.save(self.comm, &mut *self.trainer)?;
        self.last_saved = Some(step);
        if self.comm.rank() != 0 {
            return Ok(());
        }
        let losses = self.progress.unlogged_losses();
        let state = CheckpointState::of(
            self.settings,
            &self.planner,
            controllers,
            self.best,
            losses,
            (&self.evaluations, &self.log_history),
        );
        let (model, optimizer) = self.trainer.parts();
        let config = model.pretrained_config();
        save_checkpoint(
            self.settings,
            &state,
            &self.params,
            config.as_deref(),
            &*optimizer,
            self.logger.as_deref(),
        )
    }

    /// A signal stopped the run after this step (every rank agreed in the step's
    /// all-reduce): the step's checkpoint (unless just written), then the error
    /// that says where it is.
    fn stop_on_signal(&mut self) -> Result<Error> {
        let step = self.planner.step();
        if self.last_saved != Some(step) {
            self.save()?;
        }
        Interrupts::handled();
        Ok(Error::Training(TrainingError::Interrupted {
            signal: Interrupts::last_signal(),
            step,
            checkpoint: checkpoint_dir(&self.settings.saves.output_dir, step),
        }))
    }

    /// A divergence error with the last checkpoint of this run (its weights were
    /// checked finite when it was written), logged and summed up on rank 0
    /// before the run stops; other errors as they are.
    fn diverged(&mut self, error: Error) -> Error {
        // A run resumed from a checkpoint elsewhere has none of its own yet.
        let last = (self.last_saved)
            .map(|s| checkpoint_dir(&self.settings.saves.output_dir, s))
            .filter(|dir| dir.is_dir());
        let error = match error {
            Error::Training(TrainingError::NonFiniteLoss { step, loss, .. }) => {
                Error::Training(TrainingError::NonFiniteLoss {
                    step,
                    loss,
                    last_checkpoint: last,
                })
            }
            Error::Training(TrainingError::NonFiniteWeights { step, names, .. }) => {
                Error::Training(TrainingError::NonFiniteWeights {
                    step,
                    names,
                    last_checkpoint: last,
                })
            }
            other => return other,
        };
        if let Some(logger) = self.logger.as_deref_mut() {
            let (Error::Training(TrainingError::NonFiniteLoss { step, .. })
            | Error::Training(TrainingError::NonFiniteWeights { step, .. })) = error
            else {
                unreachable!("a divergence error")
            };
            let _ = logger.log_divergence(step, &error.to_string());
            logger.event(&format!(
                "stopped: diverged at step {step}, after {} examples (epoch {:.2}); last logged loss {}",
                self.planner.sampler().examples_seen(),
                self.planner.sampler().epoch(),
                self.last.loss
            ));
        }
        error
    }

    /// A run that saves checkpoints ends by saving its model, as Hugging Face's
    /// `trainer.save_model()`: `model.safetensors` and `config.json` in
    /// `--output-dir` (the best model's weights with `--load-best-model-at-end`).
    fn save_model(&mut self) -> Result<()> {
        if self.settings.saves.every == Interval::Never || self.comm.rank() != 0 {
            return Ok(());
        }
        let dir = &self.settings.saves.output_dir;
        let config = self.trainer.parts().0.pretrained_config();
        save_pretrained(&self.params, config.as_deref(), dir)?;
        if let Some(logger) = self.logger.as_deref() {
            logger.event(&format!("saved the model to {}", dir.display()));
        }
        Ok(())
    }

    /// The end of the run: the last evaluation and checkpoint (unless the last
    /// step had them), the best model's weights, `on_train_end`, the summary.
    fn finish(mut self, prefetch: PrefetchStats) -> Result<TrainSummary> {
        if let (Some(logger), true) = (self.logger.as_deref(), self.settings.prefetch_workers > 0) {
            logger.event(&format!(
                "prefetch: {} steps trained on batches collated ahead; {} predicted steps discarded",
                prefetch.used, prefetch.discarded
            ));
        }
        let step = self.planner.step();
        // What a callback asks after the last evaluation has nothing left to act on.
        if self.last_evaluated != Some(step) {
            self.evaluate()?;
        }
        if self.settings.saves.every != Interval::Never && self.last_saved != Some(step) {
            self.save()?;
        }
        let best = self
            .best
            .filter(|_| self.settings.saves.best_model.is_some());
        if let Some(best) = best {
            let logger = self.logger.as_deref();
            load_best(
                self.comm,
                &self.settings.saves,
                &self.params,
                best,
                self.device,
                logger,
            )?;
        }
        self.save_model()?;
        if self.trainer.callback().is_some() {
            let state = self.trainer_state();
            if let Some(callback) = self.trainer.callback() {
                callback.on_train_end(&state);
            }
        }
        if let Some(logger) = self.logger.as_deref() {
            logger.finish();
        }
        let outcome = RunOutcome {
            evaluations: self.evaluations,
            prefetch,
            skipped_steps: self.controllers.skipped_steps(),
            noise_scale_held_steps: self.controllers.noise_scale_held_steps(),
            oom_events: self.controllers.oom.events(),
            best: best.map(|b| (best_checkpoint_dir(&self.settings.saves, b.step), b.metric)),
            held_out: self.controllers.held_out_cost(),
            source_gradients: self.controllers.source_gradient_cost(),
            closing_capped: self.closing_capped,
        };
        let summary = self.progress.summary(
            &self.planner,
            self.settings,
            self.resumed_at.as_ref(),
            outcome,
        );
        Ok(summary)
    }
}

/// How a step ended on this rank, for the loop.
enum StepEnd {
    /// It trained; `record` is its log record when the step is logged (boxed:
    /// a record is large, and an out-of-memory end carries nothing).
    Trained { record: Option<Box<StepLog>> },
    /// Some rank ran out of memory: nobody stepped.
    OutOfMemory,
}

/// The ranks' callback requests combined (any rank asking is enough), so every
/// rank acts alike even if a callback decided differently somewhere.
fn agree(comm: &impl Communicator, control: TrainerControl) -> Result<TrainerControl> {
    if comm.world_size() == 1 {
        return Ok(control);
    }
    let mut flags = control.as_flags();
    comm.all_reduce_sum(&mut [], &mut flags)?;
    Ok(TrainerControl::from_flags(flags))
}

/// The names of parameters with a NaN or infinite value.
fn non_finite(params: &[(String, Var)]) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for (name, var) in params {
        let largest = var
            .as_tensor()
            .abs()?
            .max_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_scalar::<f64>()?;
        // NaN compares false: `is_finite` catches it and infinities.
        if !largest.is_finite() {
            names.push(name.clone());
        }
    }
    Ok(names)
}

/// The weights the run starts from, the same on every rank: the checkpoint's
/// when resuming (its state returned), else `--init-from`'s or the trainer's own.
fn starting_weights<T: AdaptiveTrainer>(
    settings: &RunSettings,
    params: &[(String, Var)],
    trainer: &mut T,
    comm: &impl Communicator,
    device: &Device,
    logger: &mut Option<&mut Logger>,
) -> Result<Option<CheckpointState>> {
    let resumed = match &settings.saves.resume {
        Some(dir) => Some(resume_checkpoint(
            dir,
            settings,
            params,
            trainer.parts().1,
            device,
        )?),
        None => None,
    };
    init_weights(
        &settings.saves,
        params,
        resumed.is_some(),
        logger.as_deref(),
    )?;
    synchronise_parameters(comm, params)?;
    if let (Some(state), Some(dir), Some(logger)) =
        (&resumed, &settings.saves.resume, logger.as_deref_mut())
    {
        logger.mark_resume(dir, state.planner.global_step)?;
    }
    Ok(resumed)
}

/// `--mixer-eval-examples`: the held-out set (eval-set indices) of the sources
/// the mixer reads, and the eval set's sources.
fn run_held_out_set<T: AdaptiveTrainer, D: Dataset + ?Sized>(
    settings: &RunSettings,
    eval: Option<&D>,
    trainer: &mut T,
) -> Result<Option<(Vec<usize>, SourceSpec)>> {
    let Some(per_source) = settings.eval.held_out else {
        return Ok(None);
    };
    let eval_sources = eval.and_then(|e| e.sources());
    let mixer = trainer.mixer();
    let reads = |source: &str| mixer.as_ref().is_none_or(|m| m.reads_held_out_of(source));
    let set = held_out_set(
        eval_sources.as_ref(),
        settings.sources.as_ref(),
        per_source,
        reads,
    )?;
    Ok(eval_sources.map(|spec| (set, spec)))
}

/// Rank 0 of a run that saves locks its output directory (a run that only
/// resumes reads it, and creates nothing there).
fn hold_output_dir(settings: &RunSettings, rank: usize) -> Result<Option<OutputLock>> {
    let saves = &settings.saves;
    let writes = saves.every != Interval::Never;
    (rank == 0 && writes)
        .then(|| OutputLock::acquire(&saves.output_dir))
        .transpose()
}

/// `lr_scaling = adamscale` measures the noise scale of preconditioned gradients:
/// the optimizer must give a preconditioner (adabatch's AdamW does).
fn check_preconditioner(
    settings: &RunSettings,
    optimizer: &impl TrainOptimizer,
    params: &[(String, Var)],
) -> Result<()> {
    if !settings.step.precondition_noise || optimizer.preconditioner(params)?.is_some() {
        return Ok(());
    }
    Err(Error::Settings(SettingsError::ConflictingSettings {
        first: "lr_scaling = adamscale",
        second: "the trainer's #[optimizer]",
        reason: "AdamScale measures the noise scale of gradients preconditioned by Adam's second moment: use adabatch::AdamW, or lr_scaling = sqrt",
    }))
}

/// The parameters that train: those the optimizer holds (checked against the
/// model's), or all of them when it cannot say.
fn trainable_parameters(
    optimizer: &impl TrainOptimizer,
    params: &[(String, Var)],
) -> Result<Vec<(String, Var)>> {
    match optimizer.held_parameters() {
        Some(held) => held.trainable(params),
        None => Ok(params.to_vec()),
    }
}

/// The model's parameters sorted by name, checked for duplicates.
fn sorted_parameters<M: TrainModel>(model: &M) -> Result<Vec<(String, Var)>> {
    let mut params = model.named_parameters();
    if params.is_empty() {
        return Err(Error::Model(ModelError::NoParameters));
    }
    params.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = params.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::Model(ModelError::DuplicateParameter {
            name: w[0].0.clone(),
        }));
    }
    Ok(params)
}
