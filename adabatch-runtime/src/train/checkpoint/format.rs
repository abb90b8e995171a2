//! The checkpoint on disk: `checkpoint-N/` with the weights (safetensors), the
//! optimizer's state and the trainer state; writing it crash-safe, finding,
//! pruning and reading checkpoints.

use std::path::{Path, PathBuf};

use candle_core::{Device, Var};

use crate::data::planner::PlannerState;
use crate::error::{CheckpointError, Error, FileOp, Result};
use crate::optim::OptimizerState;
use crate::report::record::EvalLog;
use crate::train::control::states::{ControllerStates, LegacyControllerStates};
use crate::train::settings::strategy::BestCheckpoint;
use crate::user::weights::save_pretrained;

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
    /// Each controller's part, by name (`controllers.oom`, `.mixer`, ...):
    /// typed, versioned entries.
    #[serde(default, skip_serializing_if = "ControllerStates::is_empty")]
    pub controllers: ControllerStates,
    /// The parts as flat keys, as checkpoints before the named entries wrote
    /// them: read only, moved into `controllers` when the checkpoint is loaded.
    #[serde(flatten, default, skip_serializing)]
    pub legacy_controllers: LegacyControllerStates,
    /// `--load-best-model-at-end`: the checkpoint that scored best so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestCheckpoint>,
    /// The trainer's policy the run was written with (absent in older checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRecord>,
    /// The losses of the steps since the last logged step: the first log after
    /// a resume averages the same steps as the uninterrupted run's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unlogged_losses: Vec<f64>,
    /// Every evaluation so far (the eval entries of HF's `log_history`): a
    /// resumed run's `TrainerState::evaluations`, its summary and the best-model
    /// rule see the whole run, as the uninterrupted one's do. Absent in older
    /// checkpoints: such a run resumes with the evaluations after its resume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evaluations: Vec<EvalLog>,
    /// HF's `log_history` so far (each logged step's and evaluation's entry), which
    /// `trainer_state.json` exports and a resumed run continues. Absent in older
    /// checkpoints: such a run continues from their evaluations' entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_history: Vec<serde_json::Value>,
    /// The checkpoint layout (absent: 1, before manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format_version: Option<u32>,
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
    /// The first key that differs: (key, checkpoint's value, this run's value).
    pub(crate) fn first_difference(&self, run: &Self) -> Option<(&'static str, String, String)> {
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
/// adabatch's own resume state ([`CheckpointState`]).
pub(crate) const STATE: &str = "adabatch_state.json";
/// `transformers`' `TrainerState` ([`HfTrainerState`]); adabatch's resume state in
/// checkpoints written before it had a file of its own.
pub(crate) const HF_STATE: &str = "trainer_state.json";

/// The file of a checkpoint's resume state: `adabatch_state.json`, or, in a
/// checkpoint written before it existed, its `trainer_state.json`.
pub(crate) fn state_file(dir: &Path) -> PathBuf {
    let own = dir.join(STATE);
    match own.is_file() || !dir.join(HF_STATE).is_file() {
        true => own,
        false => dir.join(HF_STATE),
    }
}

/// `trainer_state.json` as `transformers` writes it and its
/// `TrainerState.load_from_json` reads it back: the fields of its dataclass and
/// no other (an extra key is an error there), so that HF's tools read a
/// checkpoint's `log_history`. Written from adabatch's state; never read back.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfTrainerState {
    /// Examples seen / N.
    pub epoch: f64,
    /// Optimisation steps taken.
    pub global_step: usize,
    /// The steps the run is expected to take (0 when not known ahead).
    pub max_steps: usize,
    /// `--logging-steps`.
    pub logging_steps: usize,
    /// `--eval-steps` (0 without evaluations by steps).
    pub eval_steps: usize,
    /// `--save-steps` (0 without saves by steps).
    pub save_steps: usize,
    /// The per-device batch size the run started with.
    pub train_batch_size: usize,
    /// `--num-train-epochs`, or the epochs the steps are expected to take.
    pub num_train_epochs: usize,
    /// Not counted (0).
    pub num_input_tokens_seen: u64,
    /// Not counted (0).
    pub total_flos: f64,
    /// Each logged step's entry (`loss`, `grad_norm`, `learning_rate`, `epoch`,
    /// `step`) and each evaluation's (`eval_loss`, its metrics, `epoch`, `step`).
    pub log_history: Vec<serde_json::Value>,
    /// The best checkpoint's metric (`--load-best-model-at-end`).
    pub best_metric: Option<f64>,
    /// The best checkpoint's directory.
    pub best_model_checkpoint: Option<String>,
    /// Rank 0 writes it: true.
    pub is_local_process_zero: bool,
    /// Rank 0 writes it: true.
    pub is_world_process_zero: bool,
    /// No hyper-parameter search: false.
    pub is_hyper_param_search: bool,
    /// None.
    pub trial_name: Option<String>,
    /// None.
    pub trial_params: Option<serde_json::Value>,
    /// No HF callback state: empty.
    pub stateful_callbacks: std::collections::BTreeMap<String, serde_json::Value>,
}

pub(crate) const OPTIMIZER: &str = "optimizer.safetensors";

/// Forces a file (or directory) to disk.
fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(FileOp::Write, path))
}

/// The directory of the checkpoint of `step`: `output_dir/checkpoint-{step}`.
pub fn checkpoint_dir(output_dir: &Path, step: usize) -> PathBuf {
    output_dir.join(format!("checkpoint-{step}"))
}

/// Writes `output_dir/checkpoint-{step}/`: weights, the optimizer's state when it
/// has one, the model's `config.json` when it gives one, and the trainer state;
/// returns its path. Crash-safe: everything goes to
/// a hidden temporary directory, is synced to disk, and only then renamed into
/// place, so a kill at any moment leaves the previous checkpoints usable.
pub fn save(
    output_dir: &Path,
    params: &[(String, Var)],
    config: Option<&str>,
    optimizer: Option<&OptimizerState>,
    (state, hf_state): (&CheckpointState, &HfTrainerState),
) -> Result<PathBuf> {
    let step = state.planner.global_step;
    let dir = checkpoint_dir(output_dir, step);
    let partial = output_dir.join(format!(".checkpoint-{step}.partial"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(Error::io(FileOp::Remove, &partial))?;
    }
    std::fs::create_dir_all(&partial).map_err(Error::io(FileOp::CreateDir, &partial))?;
    // The weights and config.json as a saved model: transformers and
    // candle-transformers load a checkpoint directory directly.
    save_pretrained(params, config, &partial)?;
    if let Some(optimizer) = optimizer {
        let path = partial.join(OPTIMIZER);
        optimizer.save(&path)?;
        sync(&path)?;
    }
    // HF's state, then adabatch's last: a directory without it is incomplete.
    write_json(&partial.join(HF_STATE), hf_state)?;
    write_json(&partial.join(STATE), state)?;
    // The manifest last: it covers every other file.
    super::manifest::write(&partial)?;
    sync(&partial)?;
    if dir.exists() {
        // Re-saving `checkpoint-N` (a resume from an older checkpoint): the new
        // directory takes the old one's place in one step, and the old one, now
        // hidden under the partial name, is removed after. A kill at any moment
        // leaves a complete `checkpoint-N`; the lock's holder removes stale
        // partial directories at its start.
        exchange(&partial, &dir).map_err(Error::io(FileOp::Rename, &dir))?;
        sync(output_dir)?;
        std::fs::remove_dir_all(&partial).map_err(Error::io(FileOp::Remove, &partial))?;
    } else {
        std::fs::rename(&partial, &dir).map_err(Error::io(FileOp::Rename, &dir))?;
    }
    sync(output_dir)?;
    Ok(dir)
}

/// `value` as pretty JSON at `path`, synced.
fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let json = serde_json::to_vec_pretty(value).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, json).map_err(Error::io(FileOp::Write, path))?;
    sync(path)
}

/// Swaps two directories atomically (Linux `renameat2(RENAME_EXCHANGE)`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths, relative to the working directory.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        // A file system without the exchange: the three renames below.
        Some(libc::EINVAL) | Some(libc::ENOSYS) => exchange_by_renames(a, b),
        _ => Err(error),
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    exchange_by_renames(a, b)
}

/// `b` aside, `a` into its place, the old `b` to `a`'s name. Not atomic: a kill
/// between the first two renames leaves `b` only under the aside name, which
/// [`latest`] then does not see (the previous checkpoints still do).
fn exchange_by_renames(a: &Path, b: &Path) -> std::io::Result<()> {
    let mut aside = b.as_os_str().to_owned();
    aside.push(".old");
    let aside = PathBuf::from(aside);
    std::fs::rename(b, &aside)?;
    std::fs::rename(a, b)?;
    std::fs::rename(&aside, a)
}

/// The complete checkpoints (`checkpoint-N` with a trainer state) in `output_dir`,
/// oldest first.
pub fn complete_checkpoints(output_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let entries = match std::fs::read_dir(output_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(FileOp::List, output_dir)(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(Error::io(FileOp::List, output_dir))?.path();
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("checkpoint-"))
            .and_then(|n| n.parse::<usize>().ok());
        if let (Some(step), true) = (step, state_file(&path).is_file()) {
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
        .ok_or_else(|| {
            Error::Checkpoint(CheckpointError::NoCheckpoint {
                output_dir: output_dir.to_path_buf(),
            })
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
    for (step, path) in &others[..excess] {
        // Hidden first, in one rename, then removed: a kill during the removal
        // leaves a hidden partial directory, never a half-deleted checkpoint.
        let hidden = output_dir.join(format!(".checkpoint-{step}.partial"));
        std::fs::rename(path, &hidden).map_err(Error::io(FileOp::Rename, path))?;
        std::fs::remove_dir_all(&hidden).map_err(Error::io(FileOp::Remove, &hidden))?;
    }
    remove_partial_saves(output_dir)
}

/// Removes the hidden directories of saves (and removals) that never completed.
/// Only the holder of the output directory's lock calls it: nobody else can be
/// writing one.
pub(crate) fn remove_partial_saves(output_dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(output_dir).map_err(Error::io(FileOp::List, output_dir))?;
    let stale: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(".checkpoint-") && name.ends_with(".partial") && p.is_dir()
        })
        .collect();
    for dir in stale {
        std::fs::remove_dir_all(&dir).map_err(Error::io(FileOp::Remove, &dir))?;
    }
    Ok(())
}

/// Reads a checkpoint's state.
pub fn load_state(dir: &Path) -> Result<CheckpointState> {
    let path = state_file(dir);
    let name = path
        .file_name()
        .map_or(STATE.into(), |n| n.to_string_lossy());
    let bytes = std::fs::read(&path).map_err(|e| {
        Error::Checkpoint(CheckpointError::unreadable(
            dir,
            format!("cannot read {name}"),
            e,
        ))
    })?;
    let mut state: CheckpointState = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Checkpoint(CheckpointError::unreadable(
            dir,
            format!("{name} is not a trainer state"),
            e,
        ))
    })?;
    if state.controllers.is_empty() {
        state.controllers = std::mem::take(&mut state.legacy_controllers).into_states();
    }
    Ok(state)
}

/// Loads a checkpoint's weights into `params` (every name must be present with the
/// same shape).
pub fn load_weights(dir: &Path, params: &[(String, Var)], device: &Device) -> Result<()> {
    let path = dir.join(WEIGHTS);
    let tensors = candle_core::safetensors::load(&path, device).map_err(|e| {
        Error::Checkpoint(CheckpointError::unreadable(
            dir,
            format!("cannot load {WEIGHTS}"),
            e,
        ))
    })?;
    for (name, var) in params {
        let tensor = tensors.get(name).ok_or_else(|| {
            Error::Checkpoint(CheckpointError::CheckpointMismatch {
                path: dir.to_path_buf(),
                what: format!("parameter `{name}`"),
                checkpoint: "absent".into(),
                run: format!("{:?}", var.shape()),
            })
        })?;
        if tensor.shape() != var.shape() {
            return Err(Error::Checkpoint(CheckpointError::CheckpointMismatch {
                path: dir.to_path_buf(),
                what: format!("the shape of `{name}`"),
                checkpoint: format!("{:?}", tensor.shape()),
                run: format!("{:?}", var.shape()),
            }));
        }
        var.set(&tensor.to_dtype(var.dtype())?)?;
    }
    Ok(())
}
