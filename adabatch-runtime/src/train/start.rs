//! A rank's run before its first step: the checks that need the trainer, the
//! parameters in name order and the same on every rank, the checkpoint resumed,
//! and the planner and adaptive state where the run (or the checkpoint) starts.

use candle_core::{Device, Tensor, Var};

use crate::adapt::schedule::ScheduleSpec;
use crate::data::planner::StepPlanner;
use crate::dist::communicator::Communicator;
use crate::error::{Error, Result};
use crate::memory::host::keep_freed_memory;
use crate::report::logging::Logger;
use crate::train::adaptation::Adaptation;
use crate::train::best::Interval;
use crate::train::checkpoint::{resume_checkpoint, CheckpointState};
use crate::train::hooks::next_mix_weights;
use crate::train::settings::RunSettings;
use crate::user::data::Dataset;
use crate::user::model::TrainModel;
use crate::user::trainer::AdaptiveTrainer;

/// Where a rank's run starts.
pub(crate) struct RunStart {
    /// The model's parameters, sorted by name.
    pub(crate) params: Vec<(String, Var)>,
    /// The checkpoint resumed from, if any.
    pub(crate) resumed: Option<CheckpointState>,
    pub(crate) adaptation: Adaptation,
    pub(crate) planner: StepPlanner<ScheduleSpec>,
}

/// Checks the trainer against the settings, resumes the checkpoint if one is
/// asked for, and gives every rank rank 0's weights.
pub(crate) fn start_run<T: AdaptiveTrainer, E: Dataset + ?Sized>(
    trainer: &mut T,
    comm: &impl Communicator,
    eval: Option<&E>,
    settings: &RunSettings,
    device: &Device,
    logger: Option<&mut Logger>,
) -> Result<RunStart> {
    if !settings.release_freed_memory {
        keep_freed_memory();
    }
    if let Some(eval) = eval.filter(|e| e.len() < comm.world_size()) {
        return Err(Error::EvalSetTooSmall {
            world_size: comm.world_size(),
            examples: eval.len(),
        });
    }
    if settings.best_model.is_some() && eval.is_none() {
        return Err(Error::ConflictingSettings {
            first: "--load-best-model-at-end",
            second: "a run without an eval dataset",
            reason: "the best checkpoint is the one whose evaluation scored best: train with an eval dataset (launch_with_eval)",
        });
    }
    if settings.eval_on_start && eval.is_none() {
        return Err(Error::ConflictingSettings {
            first: "--eval-on-start",
            second: "a run without an eval dataset",
            reason: "there is nothing to evaluate: train with an eval dataset (launch_with_eval)",
        });
    }
    if let (Interval::Steps(_) | Interval::Epoch, None, Some(logger)) =
        (settings.eval_every, eval, logger.as_deref())
    {
        logger.event(
            "warning: evaluations are asked for (--eval-steps / --eval-strategy) but the run has no eval dataset: nothing is evaluated (launch_with_eval adds one)",
        );
    }
    if trainer.mixer().is_some() && settings.sources.is_none() {
        return Err(Error::MixerWithoutSources);
    }
    // `mix = online(..)` / `custom(..)`: the engine's own mixer, unless the trainer
    // has one.
    if let (Some(asked), Some(_)) = (settings.builtin_mixer, trainer.mixer()) {
        return Err(Error::ConflictingSettings {
            first: asked.key(),
            second: "#[mixer]",
            reason: "two mixers would decide the same weights: keep one",
        });
    }
    let (model, _) = trainer.parts();
    let params = sorted_parameters(&*model)?;
    let resumed = match &settings.resume {
        Some(dir) => {
            let (_, optimizer) = trainer.parts();
            Some(resume_checkpoint(
                dir, settings, &params, optimizer, device,
            )?)
        }
        None => None,
    };
    synchronise_parameters(comm, &params)?;
    if let (Some(state), Some(dir), Some(logger)) = (&resumed, &settings.resume, logger) {
        logger.mark_resume(dir, state.planner.global_step)?;
    }
    let mut adaptation = Adaptation::new(settings, resumed.as_ref(), comm.rank())?;
    let mut planner = settings.step_planner(settings.seed, settings.shuffle)?;
    if let Some(state) = &resumed {
        planner.restore(&state.planner);
        if let (Some(saved), Some(mixer)) = (&state.mixer, adaptation.mixer(trainer)) {
            mixer.restore(saved);
        }
    } else if let (Some(spec), Some(mixer)) = (&settings.sources, adaptation.mixer(trainer)) {
        // A mixer decides the first step's weights too, from no loss yet.
        let no_loss = vec![f64::NAN; spec.names.len()];
        let weights = next_mix_weights(mixer, &planner, 0, &no_loss, None);
        planner.set_mix_weights(0, &weights)?;
    }
    Ok(RunStart {
        params,
        resumed,
        adaptation,
        planner,
    })
}

/// The model's parameters sorted by name, checked for duplicates.
fn sorted_parameters<M: TrainModel>(model: &M) -> Result<Vec<(String, Var)>> {
    let mut params = model.named_parameters();
    if params.is_empty() {
        return Err(Error::NoParameters);
    }
    params.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = params.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::DuplicateParameter {
            name: w[0].0.clone(),
        });
    }
    Ok(params)
}

/// Makes every rank start from rank 0's weights, after checking they agree on the
/// parameter set.
pub(crate) fn synchronise_parameters(
    comm: &impl Communicator,
    params: &[(String, Var)],
) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let elems: usize = params.iter().map(|(_, v)| v.elem_count()).sum();
    let mut totals = [params.len() as f64, elems as f64];
    comm.all_reduce_sum(&mut [], &mut totals)?;
    let world = comm.world_size() as f64;
    if totals != [params.len() as f64 * world, elems as f64 * world] {
        return Err(Error::ParameterMismatch {
            rank: comm.rank(),
            detail: format!(
                "this rank has {} tensors / {elems} values; the group disagrees",
                params.len()
            ),
        });
    }
    let mut tensors: Vec<Tensor> = params.iter().map(|(_, v)| v.as_tensor().clone()).collect();
    comm.broadcast(&mut tensors, 0)?;
    for ((_, var), value) in params.iter().zip(&tensors) {
        var.set(value)?;
    }
    Ok(())
}
