//! Checkpoints of a run: its state written where the planner stands, and a
//! resumed run checked against the checkpoint it continues. The files themselves
//! are in [`format`].
//!
//! The optimizer's state is saved through [`TrainOptimizer`] (`optimizer.safetensors`):
//! adabatch's `AdamW` and `Sgd` resume exactly; candle's `AdamW` cannot export its
//! moments, so its checkpoints warn and resuming them needs `--ignore-optimizer-state`.

pub(crate) mod format;
mod lock;
mod manifest;
mod validate;

use std::path::{Path, PathBuf};

use candle_core::{Device, Var};

use crate::adapt::schedule::{Schedule, ScheduleSpec};
use crate::config::args::TrainingArgs;
use crate::data::planner::StepPlanner;
use crate::dist::communicator::Communicator;
use crate::dist::parameters::synchronise_parameters;
use crate::error::{CheckpointError, Error, Result};
use crate::optim::{OptimizerState, TrainOptimizer};
use crate::report::logging::Logger;
use crate::report::record::EvalLog;
use crate::train::control::states::{ControllerStates, MIXER};
use crate::train::settings::{BestCheckpoint, Interval, ResumePoint, RunSettings, SaveRules};
use crate::user::weights;

#[cfg(feature = "internals")]
pub use format::complete_checkpoints;
pub use format::{
    checkpoint_dir, latest, load_state, load_weights, prune, save, CheckpointState, PolicyRecord,
};
use format::{state_file, HfTrainerState, OPTIMIZER};
pub(crate) use lock::OutputLock;

impl PolicyRecord {
    pub(crate) fn of(settings: &RunSettings) -> Self {
        Self {
            // A function's address differs between processes: name the kind only.
            schedule: match settings.schedule {
                ScheduleSpec::Custom(_) => "Custom(fn)".into(),
                other => format!("{other:?}"),
            },
            min_batch: settings.limits.min,
            max_batch: settings.limits.max,
            drop_last: settings.drop_last,
            reweight: format!("{:?}", settings.step.reweight),
            grad_accum: format!("{:?}", settings.grad_accum),
            lr_scaling: settings.lr_rule(),
            shuffle: settings.shuffle,
        }
    }
}

impl CheckpointState {
    /// The state of this run where the planner stands: the planner's state, the
    /// controllers' and the best checkpoint so far.
    pub(crate) fn of<S: Schedule>(
        settings: &RunSettings,
        planner: &StepPlanner<S>,
        controllers: ControllerStates,
        best: Option<BestCheckpoint>,
        unlogged_losses: &[f64],
        (evaluations, log_history): (&[EvalLog], &[serde_json::Value]),
    ) -> Self {
        Self {
            planner: planner.state(),
            seed: settings.seed,
            world_size: settings.units_world,
            num_examples: settings.num_examples,
            policy: Some(PolicyRecord::of(settings)),
            format_version: Some(manifest::FORMAT_VERSION),
            unlogged_losses: unlogged_losses.to_vec(),
            evaluations: evaluations.to_vec(),
            log_history: log_history.to_vec(),
            controllers,
            legacy_controllers: Default::default(),
            best,
        }
    }
}

impl CheckpointState {
    /// HF's `log_history` a resumed run continues: the checkpoint's, or in an
    /// older checkpoint, which kept none, its evaluations' entries.
    pub(crate) fn history(&self) -> Vec<serde_json::Value> {
        match self.log_history.is_empty() {
            true => self.evaluations.iter().map(EvalLog::hf_log_entry).collect(),
            false => self.log_history.clone(),
        }
    }
}

impl HfTrainerState {
    /// `transformers`' view of `state`, a checkpoint of the run of `settings`.
    pub(crate) fn of(state: &CheckpointState, settings: &RunSettings) -> Self {
        let steps_of = |interval: &Interval| match interval {
            Interval::Steps(n) => *n,
            Interval::Never | Interval::Epoch => 0,
        };
        let planner = &state.planner;
        let expected = settings.expected_steps().unwrap_or(0);
        let num_train_epochs = match settings.length {
            crate::data::planner::RunLength::Epochs(epochs) => epochs,
            _ => {
                // Steps an epoch takes at the first global batch (all ranks').
                let global = settings.initial_per_device * settings.units_world;
                let per_epoch = settings.num_examples.div_ceil(global.max(1));
                expected.div_ceil(per_epoch.max(1))
            }
        };
        let best = state.best.filter(|_| settings.saves.best_model.is_some());
        Self {
            epoch: planner.examples_seen as f64 / state.num_examples.max(1) as f64,
            global_step: planner.global_step,
            max_steps: expected,
            logging_steps: settings.logs.every,
            eval_steps: steps_of(&settings.eval.every),
            save_steps: steps_of(&settings.saves.every),
            train_batch_size: settings.initial_per_device,
            num_train_epochs,
            num_input_tokens_seen: 0,
            total_flos: 0.0,
            log_history: state.log_history.clone(),
            best_metric: best.map(|b| b.metric),
            best_model_checkpoint: best.map(|b| {
                best_checkpoint_dir(&settings.saves, b.step)
                    .display()
                    .to_string()
            }),
            is_local_process_zero: true,
            is_world_process_zero: true,
            is_hyper_param_search: false,
            trial_name: None,
            trial_params: None,
            stateful_callbacks: Default::default(),
        }
    }
}

/// Writes rank 0's checkpoint of the run as it stands.
pub(crate) fn save_checkpoint(
    settings: &RunSettings,
    state: &CheckpointState,
    params: &[(String, Var)],
    config: Option<&str>,
    optimizer: &impl TrainOptimizer,
    logger: Option<&Logger>,
) -> Result<()> {
    let rules = &settings.saves;
    let optimizer_state = optimizer.export_state(params)?;
    let hf_state = HfTrainerState::of(state, settings);
    let dir = save(
        &rules.output_dir,
        params,
        config,
        optimizer_state.as_ref(),
        (state, &hf_state),
    )?;
    if let Some(keep) = rules.total_limit {
        let best = state.best.filter(|_| rules.best_model.is_some());
        prune(&rules.output_dir, keep, best.map(|b| b.step))?;
    }
    if let Some(logger) = logger {
        logger.event(&format!(
            "step {}: saved {}",
            state.planner.global_step,
            dir.display()
        ));
        if optimizer_state.is_none() {
            logger.event(
                "warning: the optimizer cannot save its state (e.g. candle's AdamW): resuming this checkpoint restarts it and needs --ignore-optimizer-state; adabatch::AdamW resumes exactly",
            );
        }
    }
    Ok(())
}

/// Rewrites a checkpoint's manifest over the files it now holds: for a tool that
/// edits a checkpoint on purpose (a resume then trusts the edit).
#[cfg(feature = "internals")]
pub fn write_manifest(dir: &std::path::Path) -> Result<()> {
    manifest::write(dir)
}

/// Every file of the checkpoint against its manifest (required from the format
/// that writes one).
fn verify_files(dir: &std::path::Path, state: &CheckpointState) -> Result<()> {
    let required = state.format_version.unwrap_or(1) >= manifest::FORMAT_VERSION;
    manifest::verify(dir, required)
}

/// `--init-from`: loads the weights a fresh run starts from (rank 0 reports what a
/// non-strict load skipped). A resumed run restores its checkpoint's weights
/// instead.
pub(crate) fn init_weights(
    rules: &SaveRules,
    params: &[(String, Var)],
    resuming: bool,
    logger: Option<&Logger>,
) -> Result<()> {
    let Some((path, strict)) = &rules.init_from else {
        return Ok(());
    };
    if resuming {
        if let Some(logger) = logger {
            logger.event("--init-from is not used: resuming restores the checkpoint's weights");
        }
        return Ok(());
    }
    // A checkpoint (or a file of one) is verified against its manifest first: an
    // init never starts from a checkpoint being written or damaged since.
    let dir = if path.is_dir() {
        Some(path.as_path())
    } else {
        path.parent()
    };
    if let Some(dir) = dir.filter(|d| d.join(manifest::MANIFEST).is_file()) {
        manifest::verify(dir, true)?;
    }
    let report = weights::load_weights(params, path, *strict)?;
    if let Some(logger) = logger {
        logger.event(&format!("--init-from {}: {report}", path.display()));
    }
    Ok(())
}

/// Loads a checkpoint's weights and optimizer state and checks that it belongs to
/// this run.
pub(crate) fn resume_checkpoint(
    dir: &std::path::Path,
    settings: &RunSettings,
    params: &[(String, Var)],
    optimizer: &mut impl TrainOptimizer,
    device: &Device,
) -> Result<CheckpointState> {
    // Its files and state were verified once for the process, by `resume_point`.
    let state = load_state(dir)?;
    check_belongs(dir, &state, settings)?;
    check_sources(dir, &state, settings)?;
    check_planned_epoch(dir, &state, settings)?;
    load_weights(dir, params, device)?;
    let optimizer_file = dir.join(OPTIMIZER);
    if optimizer_file.is_file() {
        let saved = OptimizerState::load(&optimizer_file, device)?;
        match optimizer.import_state(params, &saved) {
            // Started afresh, as asked: an optimizer that cannot read the state,
            // or one whose settings differ from those the state was built under.
            Err(Error::Checkpoint(
                CheckpointError::OptimizerStateUnsupported { .. }
                | CheckpointError::OptimizerStateMismatch { .. },
            )) if settings.saves.ignore_optimizer_state => {}
            other => other?,
        }
    } else if !settings.saves.ignore_optimizer_state {
        return Err(Error::Checkpoint(CheckpointError::OptimizerStateMissing {
            path: dir.to_path_buf(),
        }));
    }
    Ok(state)
}

fn mismatch(dir: &std::path::Path, what: &str, theirs: String, ours: String) -> Error {
    Error::Checkpoint(CheckpointError::CheckpointMismatch {
        path: dir.to_path_buf(),
        what: what.into(),
        checkpoint: theirs,
        run: ours,
    })
}

/// The same dataset size, seed and policy: a resumed run never silently takes
/// the checkpoint's policy, nor the other way.
fn check_belongs(
    dir: &std::path::Path,
    state: &CheckpointState,
    settings: &RunSettings,
) -> Result<()> {
    if state.num_examples != settings.num_examples {
        let (theirs, ours) = (state.num_examples, settings.num_examples);
        return Err(mismatch(
            dir,
            "num_examples",
            theirs.to_string(),
            ours.to_string(),
        ));
    }
    if state.seed != settings.seed {
        let (theirs, ours) = (state.seed, settings.seed);
        return Err(mismatch(dir, "seed", theirs.to_string(), ours.to_string()));
    }
    if let Some(written) = &state.policy {
        if let Some((key, theirs, ours)) = written.first_difference(&PolicyRecord::of(settings)) {
            return Err(mismatch(dir, &format!("policy key `{key}`"), theirs, ours));
        }
    }
    Ok(())
}

/// The same sources; their weights too, unless a mixer changes them.
fn check_sources(
    dir: &std::path::Path,
    state: &CheckpointState,
    settings: &RunSettings,
) -> Result<()> {
    match (&settings.sources, &state.planner.sources) {
        (None, None) => Ok(()),
        (Some(spec), Some(sources)) => {
            let fresh =
                crate::data::source_spec::MixedSources::new(spec, settings.seed, settings.shuffle)?;
            if let Err(detail) = fresh.check(sources) {
                return Err(Error::Checkpoint(CheckpointError::corrupt(
                    state_file(dir),
                    detail,
                )));
            }
            // A mixer's weights change while training: the checkpoint's continue.
            if !state.controllers.contains(MIXER) && sources.weights != spec.weights {
                let (theirs, ours) = (&sources.weights, &spec.weights);
                return Err(mismatch(
                    dir,
                    "mixing weights",
                    format!("{theirs:?}"),
                    format!("{ours:?}"),
                ));
            }
            Ok(())
        }
        (Some(spec), None) => Err(mismatch(
            dir,
            "sources",
            "one".into(),
            format!("{:?}", spec.names),
        )),
        (None, Some(sources)) => {
            let theirs = format!("{}", sources.cursors.len());
            Err(mismatch(dir, "sources", theirs, "one".into()))
        }
    }
}

/// Mid-epoch, a length-aware run continues the epoch's plan, which the
/// checkpoint holds; an older checkpoint without it can only resume at a
/// boundary (which includes one written after an epoch's last step).
fn check_planned_epoch(
    dir: &std::path::Path,
    state: &CheckpointState,
    settings: &RunSettings,
) -> Result<()> {
    let position = state.planner.position;
    match &state.planner.planned_epoch {
        Some(remainder) => remainder
            .check(settings.num_examples, position)
            .map_err(|detail| Error::Checkpoint(CheckpointError::corrupt(state_file(dir), detail))),
        None if settings.batching.is_some() && position > 0 && position < settings.num_examples => {
            Err(Error::Checkpoint(
                CheckpointError::MidEpochLengthAwareCheckpoint {
                    path: dir.to_path_buf(),
                },
            ))
        }
        None => Ok(()),
    }
}

/// At the end of a run: the best checkpoint's weights, loaded on rank 0 (the
/// only rank sure to see `--output-dir`) and broadcast to every rank.
pub(crate) fn load_best(
    comm: &impl Communicator,
    rules: &SaveRules,
    params: &[(String, Var)],
    best: BestCheckpoint,
    device: &Device,
    logger: Option<&Logger>,
) -> Result<()> {
    let dir = best_checkpoint_dir(rules, best.step);
    if comm.rank() == 0 {
        verify_files(&dir, &load_state(&dir)?)?;
        load_weights(&dir, params, device)?;
    }
    synchronise_parameters(comm, params)?;
    if let (Some(logger), Some(rule)) = (logger, &rules.best_model) {
        logger.event(&format!(
            "loaded the best model: {} ({} = {})",
            dir.display(),
            rule.metric,
            best.metric
        ));
    }
    Ok(())
}

/// Where the best checkpoint, of `step`, lies: in `--output-dir`, or, when it
/// was written before the checkpoint this run resumed from and this run writes
/// elsewhere, beside that checkpoint.
pub(crate) fn best_checkpoint_dir(rules: &SaveRules, step: usize) -> PathBuf {
    let here = checkpoint_dir(&rules.output_dir, step);
    let resumed_from = rules.resume.as_deref().and_then(Path::parent);
    match resumed_from {
        Some(earlier) if !here.exists() && checkpoint_dir(earlier, step).exists() => {
            checkpoint_dir(earlier, step)
        }
        _ => here,
    }
}

/// Where `args` resume (`latest` resolved to the newest complete checkpoint of
/// `--output-dir`, its files and trainer state verified), and the ranks the
/// checkpoint's sizes count (this run's `world_size` when it starts fresh).
pub(crate) fn resume_point(args: &TrainingArgs, world_size: usize) -> Result<ResumePoint> {
    let dir = match &args.save.resume_from_checkpoint {
        Some(dir) if dir.as_os_str() == "latest" => {
            lock::check_not_busy(&args.save.output_dir)?;
            Some(latest(&args.save.output_dir)?)
        }
        Some(dir) => {
            if let Some(output_dir) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                lock::check_not_busy(output_dir)?;
            }
            Some(dir.clone())
        }
        None => None,
    };
    let units_world = match &dir {
        Some(dir) => {
            if dir.exists() && !dir.is_dir() {
                return Err(Error::Checkpoint(CheckpointError::NotADirectory {
                    flag: "--resume-from-checkpoint",
                    path: dir.clone(),
                }));
            }
            if !dir.is_dir() {
                return Err(Error::Checkpoint(CheckpointError::NoSuchCheckpoint {
                    path: dir.clone(),
                }));
            }
            // Once per process, before any rank starts: the checksums read every
            // byte of the weights.
            let state = load_state(dir)?;
            verify_files(dir, &state)?;
            validate::check_state(dir, &state)?;
            state.world_size
        }
        None => world_size,
    };
    Ok(ResumePoint { dir, units_world })
}
