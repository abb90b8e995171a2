//! Checkpoints: model weights (safetensors) and the trainer state needed to resume
//! mid-epoch with the same batches the run would have had.
//!
//! The optimizer's state is saved through [`TrainOptimizer`] (`optimizer.safetensors`):
//! adabatch's `AdamW` and `Sgd` resume exactly; candle's `AdamW` cannot export its
//! moments, so its checkpoints warn and resuming them needs `--ignore-optimizer-state`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};

use crate::adapt::schedule::{Schedule, ScheduleSpec};
use crate::data::planner::{PlannerState, StepPlanner};
use crate::error::{Error, Result};
use crate::optim::{OptimizerState, TrainOptimizer};
use crate::report::logging::Logger;
use crate::train::settings::RunSettings;

/// Where the run stood when the checkpoint was written.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointState {
    /// The step planner's position, sizes and clamps.
    #[serde(flatten)]
    pub planner: PlannerState,
    /// Seed of the permutations.
    pub seed: u64,
    /// Ranks the per-device sizes count (the global batch is `per_device *
    /// world_size`); a run resumed on another number of ranks keeps these global
    /// batches and splits them over its own ranks.
    pub world_size: usize,
    /// Dataset size.
    pub num_examples: usize,
    /// OOM events handled so far.
    pub oom_events: usize,
    /// The online memory model's fit (memory-aware runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_fit: Option<[f64; 5]>,
    /// Rank 0's online memory model whole, as checkpoints written before
    /// `memory_models` held it (read only when `memory_models` is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_model: Option<crate::memory::model::OnlineMemoryState>,
    /// Every rank's online memory model whole (observations and sums), by rank:
    /// each rank fits its own measurements, and a resumed run refits as the
    /// uninterrupted one would. On another number of ranks, rank `r` continues
    /// rank `r % world_size`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_models: Option<Vec<crate::memory::model::OnlineMemoryState>>,
    /// The gradient noise scale estimator's moving averages, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_scale: Option<crate::adapt::noise_scale::NoiseScaleEstimator>,
    /// The `#[mixer]`'s state, when the trainer has one (its weights are in the
    /// planner's sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixer: Option<Vec<f64>>,
    /// `--fp16`'s loss scale and its count of clean steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<crate::optim::precision::LossScaler>,
    /// `--load-best-model-at-end`: the checkpoint that scored best so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<crate::train::best::BestCheckpoint>,
    /// The trainer's policy the run was written with (absent in older checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRecord>,
}

/// The policy keys a resumed run must share with the checkpoint, as text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyRecord {
    /// `schedule`.
    pub schedule: String,
    /// `min_batch`.
    pub min_batch: usize,
    /// `max_batch`.
    pub max_batch: Option<usize>,
    /// `drop_last` (after `--dataloader-drop-last`).
    pub drop_last: bool,
    /// `reweight`.
    pub reweight: String,
    /// `grad_accum`.
    pub grad_accum: String,
    /// `lr_scaling`.
    pub lr_scaling: String,
    /// `shuffle`.
    pub shuffle: bool,
}

impl PolicyRecord {
    fn of(settings: &RunSettings) -> Self {
        Self {
            // A function's address differs between processes: name the kind only.
            schedule: match settings.schedule {
                ScheduleSpec::Custom(_) => "Custom(fn)".into(),
                other => format!("{other:?}"),
            },
            min_batch: settings.limits.min,
            max_batch: settings.limits.max,
            drop_last: settings.drop_last,
            reweight: format!("{:?}", settings.reweight),
            grad_accum: format!("{:?}", settings.grad_accum),
            lr_scaling: format!("{:?}", settings.lr.scaling),
            shuffle: settings.shuffle,
        }
    }

    /// The first key that differs: (key, checkpoint's value, this run's value).
    fn first_difference(&self, run: &Self) -> Option<(&'static str, String, String)> {
        let pairs = [
            ("schedule", self.schedule.clone(), run.schedule.clone()),
            (
                "min_batch",
                self.min_batch.to_string(),
                run.min_batch.to_string(),
            ),
            (
                "max_batch",
                format!("{:?}", self.max_batch),
                format!("{:?}", run.max_batch),
            ),
            (
                "drop_last",
                self.drop_last.to_string(),
                run.drop_last.to_string(),
            ),
            ("reweight", self.reweight.clone(), run.reweight.clone()),
            (
                "grad_accum",
                self.grad_accum.clone(),
                run.grad_accum.clone(),
            ),
            (
                "lr_scaling",
                self.lr_scaling.clone(),
                run.lr_scaling.clone(),
            ),
            ("shuffle", self.shuffle.to_string(), run.shuffle.to_string()),
        ];
        pairs.into_iter().find(|(_, a, b)| a != b)
    }
}

const WEIGHTS: &str = "model.safetensors";
const STATE: &str = "trainer_state.json";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

const OPTIMIZER: &str = "optimizer.safetensors";

/// Forces a file (or directory) to disk.
fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(path))
}

/// The directory of the checkpoint of `step`: `output_dir/checkpoint-{step}`.
pub fn checkpoint_dir(output_dir: &Path, step: usize) -> PathBuf {
    output_dir.join(format!("checkpoint-{step}"))
}

/// Writes `output_dir/checkpoint-{step}/`: weights, the optimizer's state when it
/// has one, and the trainer state; returns its path. Crash-safe: everything goes to
/// a hidden temporary directory, is synced to disk, and only then renamed into
/// place, so a kill at any moment leaves the previous checkpoints usable.
pub fn save(
    output_dir: &Path,
    params: &[(String, Var)],
    optimizer: Option<&OptimizerState>,
    state: &CheckpointState,
) -> Result<PathBuf> {
    let step = state.planner.global_step;
    let dir = checkpoint_dir(output_dir, step);
    let partial = output_dir.join(format!(".checkpoint-{step}.partial"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(&partial))?;
    }
    std::fs::create_dir_all(&partial).map_err(io(&partial))?;
    let tensors: HashMap<String, Tensor> = params
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().clone()))
        .collect();
    let weights = partial.join(WEIGHTS);
    candle_core::safetensors::save(&tensors, &weights)?;
    sync(&weights)?;
    if let Some(optimizer) = optimizer {
        let path = partial.join(OPTIMIZER);
        optimizer.save(&path)?;
        sync(&path)?;
    }
    // The trainer state is written last: a directory without it is incomplete.
    let state_path = partial.join(STATE);
    let json = serde_json::to_vec_pretty(state).map_err(|source| Error::Json {
        path: state_path.clone(),
        source,
    })?;
    std::fs::write(&state_path, json).map_err(io(&state_path))?;
    sync(&state_path)?;
    sync(&partial)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    std::fs::rename(&partial, &dir).map_err(io(&dir))?;
    sync(output_dir)?;
    Ok(dir)
}

/// The complete checkpoints (`checkpoint-N` with a trainer state) in `output_dir`,
/// oldest first.
pub fn complete_checkpoints(output_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let entries = match std::fs::read_dir(output_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(output_dir)(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(io(output_dir))?.path();
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("checkpoint-"))
            .and_then(|n| n.parse::<usize>().ok());
        if let (Some(step), true) = (step, path.join(STATE).is_file()) {
            found.push((step, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The newest complete checkpoint in `output_dir` (`--resume-from-checkpoint latest`).
pub fn latest(output_dir: &Path) -> Result<PathBuf> {
    complete_checkpoints(output_dir)?
        .pop()
        .map(|(_, path)| path)
        .ok_or_else(|| Error::NoCheckpoint {
            output_dir: output_dir.to_path_buf(),
        })
}

/// Keeps the newest `keep` complete checkpoints (`--save-total-limit`), and the
/// checkpoint of step `protect` besides (the best model's, as HF keeps it: with
/// `keep` = 1 that is the best and the newest).
pub fn prune(output_dir: &Path, keep: usize, protect: Option<usize>) -> Result<()> {
    let all = complete_checkpoints(output_dir)?;
    let newest = all.last().map(|(step, _)| *step);
    let others: Vec<&(usize, PathBuf)> = all.iter().filter(|(s, _)| Some(*s) != protect).collect();
    let keep_others = match protect {
        Some(p) if all.iter().any(|(s, _)| *s == p) => {
            if Some(p) == newest {
                keep.saturating_sub(1)
            } else {
                keep.saturating_sub(1).max(1)
            }
        }
        _ => keep,
    };
    let excess = others.len().saturating_sub(keep_others);
    for (_, path) in &others[..excess] {
        std::fs::remove_dir_all(path).map_err(io(path))?;
    }
    Ok(())
}

/// Reads a checkpoint's state.
pub fn load_state(dir: &Path) -> Result<CheckpointState> {
    let path = dir.join(STATE);
    let bytes = std::fs::read(&path).map_err(|e| Error::CorruptCheckpoint {
        path: dir.to_path_buf(),
        detail: format!("cannot read {STATE}: {e}"),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| Error::CorruptCheckpoint {
        path: dir.to_path_buf(),
        detail: format!("{STATE} is not a trainer state: {e}"),
    })
}

/// Loads a checkpoint's weights into `params` (every name must be present with the
/// same shape).
pub fn load_weights(dir: &Path, params: &[(String, Var)], device: &Device) -> Result<()> {
    let path = dir.join(WEIGHTS);
    let tensors =
        candle_core::safetensors::load(&path, device).map_err(|e| Error::CorruptCheckpoint {
            path: dir.to_path_buf(),
            detail: format!("cannot load {WEIGHTS}: {e}"),
        })?;
    for (name, var) in params {
        let tensor = tensors.get(name).ok_or_else(|| Error::CheckpointMismatch {
            path: dir.to_path_buf(),
            what: format!("parameter `{name}`"),
            checkpoint: "absent".into(),
            run: format!("{:?}", var.shape()),
        })?;
        if tensor.shape() != var.shape() {
            return Err(Error::CheckpointMismatch {
                path: dir.to_path_buf(),
                what: format!("the shape of `{name}`"),
                checkpoint: format!("{:?}", tensor.shape()),
                run: format!("{:?}", var.shape()),
            });
        }
        var.set(&tensor.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// What a checkpoint keeps besides the planner, the weights and the optimizer.
pub(crate) struct RunExtras {
    pub(crate) oom_events: usize,
    pub(crate) memory_fit: Option<[f64; 5]>,
    pub(crate) memory_models: Option<Vec<crate::memory::model::OnlineMemoryState>>,
    pub(crate) noise_scale: Option<crate::adapt::noise_scale::NoiseScaleEstimator>,
    pub(crate) mixer: Option<Vec<f64>>,
    pub(crate) loss_scaler: Option<crate::optim::precision::LossScaler>,
    pub(crate) best: Option<crate::train::best::BestCheckpoint>,
}

/// Writes rank 0's checkpoint of the run as it stands.
pub(crate) fn save_checkpoint<S: Schedule>(
    settings: &RunSettings,
    planner: &StepPlanner<S>,
    params: &[(String, Var)],
    optimizer: &impl TrainOptimizer,
    extras: RunExtras,
    logger: Option<&Logger>,
) -> Result<()> {
    let state = CheckpointState {
        planner: planner.state(),
        seed: settings.seed,
        world_size: settings.units_world,
        num_examples: settings.num_examples,
        oom_events: extras.oom_events,
        policy: Some(PolicyRecord::of(settings)),
        memory_fit: extras.memory_fit,
        memory_model: None,
        memory_models: extras.memory_models,
        noise_scale: extras.noise_scale,
        mixer: extras.mixer,
        loss_scaler: extras.loss_scaler,
        best: extras.best,
    };
    let optimizer_state = optimizer.export_state(params)?;
    let dir = save(
        &settings.output_dir,
        params,
        optimizer_state.as_ref(),
        &state,
    )?;
    if let Some(keep) = settings.save_total_limit {
        let best = extras.best.filter(|_| settings.best_model.is_some());
        prune(&settings.output_dir, keep, best.map(|b| b.step))?;
    }
    if let Some(logger) = logger {
        logger.event(&format!(
            "step {}: saved {}",
            state.planner.global_step,
            dir.display()
        ));
        if optimizer_state.is_none() {
            logger.event(
                "warning: the optimizer cannot save its state (e.g. candle's AdamW): resuming this checkpoint restarts it and needs --ignore-optimizer-state; adabatch::optim::AdamW resumes exactly",
            );
        }
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
    let state = load_state(dir)?;
    let mismatch = |what: &str, theirs: String, ours: String| {
        Err(Error::CheckpointMismatch {
            path: dir.to_path_buf(),
            what: what.into(),
            checkpoint: theirs,
            run: ours,
        })
    };
    if state.num_examples != settings.num_examples {
        return mismatch(
            "num_examples",
            state.num_examples.to_string(),
            settings.num_examples.to_string(),
        );
    }
    if state.seed != settings.seed {
        return mismatch("seed", state.seed.to_string(), settings.seed.to_string());
    }
    // A resumed run never silently takes the checkpoint's policy, nor the other way.
    if let Some(written) = &state.policy {
        if let Some((key, theirs, ours)) = written.first_difference(&PolicyRecord::of(settings)) {
            return mismatch(&format!("policy key `{key}`"), theirs, ours);
        }
    }
    match (&settings.sources, &state.planner.sources) {
        (None, None) => {}
        (Some(spec), Some(sources)) => {
            let fresh =
                crate::data::sources::MixedSources::new(spec, settings.seed, settings.shuffle)?;
            if let Err(detail) = fresh.check(sources) {
                return Err(Error::CorruptCheckpoint {
                    path: dir.join(STATE),
                    detail,
                });
            }
            // A mixer's weights change while training: the checkpoint's continue.
            if state.mixer.is_none() && sources.weights != spec.weights {
                return mismatch(
                    "mixing weights",
                    format!("{:?}", sources.weights),
                    format!("{:?}", spec.weights),
                );
            }
        }
        (Some(spec), None) => {
            return mismatch("sources", "one".into(), format!("{:?}", spec.names));
        }
        (None, Some(sources)) => {
            return mismatch(
                "sources",
                format!("{}", sources.cursors.len()),
                "one".into(),
            );
        }
    }
    // Mid-epoch, a length-aware run continues the epoch's plan, which the
    // checkpoint holds; an older checkpoint without it can only resume at a
    // boundary (which includes one written after an epoch's last step).
    let position = state.planner.position;
    match &state.planner.planned_epoch {
        Some(remainder) => {
            if let Err(detail) = remainder.check(settings.num_examples, position) {
                return Err(Error::CorruptCheckpoint {
                    path: dir.join(STATE),
                    detail,
                });
            }
        }
        None if settings.batching.is_some() && position > 0 && position < settings.num_examples => {
            return Err(Error::MidEpochLengthAwareCheckpoint {
                path: dir.to_path_buf(),
            });
        }
        None => {}
    }
    load_weights(dir, params, device)?;
    let optimizer_file = dir.join(OPTIMIZER);
    if optimizer_file.is_file() {
        let saved = OptimizerState::load(&optimizer_file, device)?;
        match optimizer.import_state(params, &saved) {
            Err(Error::OptimizerStateUnsupported { .. }) if settings.ignore_optimizer_state => {}
            other => other?,
        }
    } else if !settings.ignore_optimizer_state {
        return Err(Error::OptimizerStateMissing {
            path: dir.to_path_buf(),
        });
    }
    Ok(state)
}
