//! What the rank loop does around a step: evaluation, callbacks, the mixer's
//! weights and checkpoints, each the same on every rank.

use candle_core::{Device, Var};

use crate::adapt::mixer::{LastEval, Mixer, SourceStats};
use crate::adapt::schedule::Schedule;
use crate::data::planner::StepPlanner;
use crate::dist::communicator::Communicator;
use crate::error::Result;
use crate::report::logging::{EvalLog, Logger};
use crate::train::adaptation::Adaptation;
use crate::train::best::BestCheckpoint;
use crate::train::checkpoint::save_checkpoint;
use crate::train::eval::evaluate;
use crate::train::settings::RunSettings;
use crate::user::callback::{TrainerControl, TrainerState};
use crate::user::data::Dataset;
use crate::user::trainer::{AdaptiveTrainer, CollateFor};

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

/// Evaluates on `data.eval` (if any) where the planner stands, logs it on rank 0,
/// keeps it, and runs the callback's `on_evaluate`: returns what the callback asked
/// (combined over the ranks). `last`: the last step's global batch, loss and
/// learning rate.
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate_and_report<T, D, C, S>(
    trainer: &mut T,
    comm: &impl Communicator,
    data: RunData<'_, D, C>,
    settings: &RunSettings,
    device: &Device,
    (planner, last): (&StepPlanner<S>, (usize, f64, f64)),
    logger: Option<&mut Logger>,
    evaluations: &mut Vec<EvalLog>,
) -> Result<TrainerControl>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    S: Schedule,
{
    let Some(eval) = data.eval else {
        return Ok(TrainerControl::default());
    };
    let (step, epoch) = (planner.step(), planner.sampler().epoch());
    let entry = evaluate(
        trainer,
        comm,
        eval,
        data.collate,
        device,
        settings.eval_batch_size,
        (settings.reweight, settings.precision),
        step,
        epoch,
    )?;
    if let Some(logger) = logger {
        logger.log_eval(&entry)?;
    }
    evaluations.push(entry);
    let mut asked = TrainerControl::default();
    if let (Some(callback), Some(metrics)) = (trainer.callback(), evaluations.last()) {
        let state = trainer_state(comm, planner, last, evaluations);
        callback.on_evaluate(&state, metrics, &mut asked);
        asked = agree(comm, asked)?;
    }
    Ok(asked)
}

/// A mixer's weights for the step after `step`, from its per-source losses and the
/// sources' counts (the same on every rank).
pub(crate) fn next_mix_weights<S: Schedule>(
    mixer: &mut dyn Mixer,
    planner: &StepPlanner<S>,
    step: usize,
    losses: &[f64],
    last_eval: Option<&EvalLog>,
) -> Vec<f64> {
    let Some(sources) = planner.sampler().sources() else {
        return Vec::new();
    };
    let seen: Vec<usize> = sources.cursors().iter().map(|c| c.seen).collect();
    let positions: Vec<usize> = sources.cursors().iter().map(|c| c.position).collect();
    let spec = sources.spec();
    mixer.weights(&SourceStats {
        step,
        names: &spec.names,
        loss: losses,
        seen: &seen,
        positions: &positions,
        sizes: &spec.sizes,
        weights: sources.weights(),
        last_eval: last_eval.map(|e| LastEval {
            step: e.step,
            eval_loss: e.eval_loss,
            metrics: &e.metrics,
        }),
    })
}

/// What callbacks see after a step: `last` is its global batch, loss and
/// learning rate.
pub(crate) fn trainer_state<S: Schedule>(
    comm: &impl Communicator,
    planner: &StepPlanner<S>,
    (global_batch, loss, learning_rate): (usize, f64, f64),
    evaluations: &[EvalLog],
) -> TrainerState {
    TrainerState {
        rank: comm.rank(),
        world_size: comm.world_size(),
        global_step: planner.step(),
        epoch: planner.sampler().epoch(),
        examples_seen: planner.sampler().examples_seen(),
        global_batch,
        loss,
        learning_rate,
        evaluations: evaluations.to_vec(),
    }
}

/// The ranks' callback requests combined (any rank asking is enough), so every
/// rank acts alike even if a callback decided differently somewhere.
pub(crate) fn agree(comm: &impl Communicator, control: TrainerControl) -> Result<TrainerControl> {
    if comm.world_size() == 1 {
        return Ok(control);
    }
    let mut flags = control.as_flags();
    comm.all_reduce_sum(&mut [], &mut flags)?;
    Ok(TrainerControl::from_flags(flags))
}

/// What a checkpoint needs from the loop besides the trainer: the weights, the
/// adaptive state, OOM events so far, the evaluations, and the best checkpoint so
/// far (`--load-best-model-at-end`), which this save may become.
pub(crate) struct SaveInputs<'a> {
    pub(crate) params: &'a [(String, Var)],
    pub(crate) adaptation: &'a mut Adaptation,
    pub(crate) oom_events: usize,
    pub(crate) evaluations: &'a [EvalLog],
    pub(crate) best: &'a mut Option<BestCheckpoint>,
}

/// A checkpoint of the run where the planner stands. Every rank calls it at the
/// same step (memory-aware runs gather every rank's model; every rank keeps the
/// same best checkpoint); rank 0 writes it.
pub(crate) fn save_now<T: AdaptiveTrainer, S: Schedule>(
    trainer: &mut T,
    comm: &impl Communicator,
    settings: &RunSettings,
    planner: &StepPlanner<S>,
    inputs: SaveInputs<'_>,
    logger: Option<&Logger>,
) -> Result<()> {
    if let Some(rule) = &settings.best_model {
        *inputs.best = rule.consider(*inputs.best, planner.step(), inputs.evaluations)?;
    }
    let mut extras = inputs.adaptation.extras(trainer, comm, inputs.oom_events)?;
    extras.best = *inputs.best;
    if comm.rank() != 0 {
        return Ok(());
    }
    save_checkpoint(
        settings,
        planner,
        inputs.params,
        &*trainer.parts().1,
        extras,
        logger,
    )
}
