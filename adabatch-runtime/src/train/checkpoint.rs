//! Checkpoints: model weights (safetensors) and the trainer state needed to resume
//! mid-epoch with the same batches the run would have had.
//!
//! The optimizer's state is not saved: candle's optimizers do not expose it, so
//! stateless optimizers (SGD) resume exactly and AdamW restarts its moments.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};

use crate::adapt::schedule::Schedule;
use crate::data::planner::{PlannerState, StepPlanner};
use crate::error::{Error, Result};
use crate::report::logging::Logger;
use crate::train::settings::RunSettings;

/// Where the run stood when the checkpoint was written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrainerState {
    /// The step planner's position, sizes and clamps.
    #[serde(flatten)]
    pub planner: PlannerState,
    /// Seed of the permutations.
    pub seed: u64,
    /// Number of ranks.
    pub world_size: usize,
    /// Dataset size.
    pub num_examples: usize,
    /// OOM events handled so far.
    pub oom_events: usize,
}

const WEIGHTS: &str = "model.safetensors";
const STATE: &str = "trainer_state.json";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `output_dir/checkpoint-{step}/` (weights and state); returns its path.
pub fn save(output_dir: &Path, params: &[(String, Var)], state: &TrainerState) -> Result<PathBuf> {
    let dir = output_dir.join(format!("checkpoint-{}", state.planner.global_step));
    // Write next to the target and rename, so a crash never leaves half a checkpoint.
    let partial = output_dir.join(format!(".checkpoint-{}.partial", state.planner.global_step));
    std::fs::create_dir_all(&partial).map_err(io(&partial))?;
    let tensors: HashMap<String, Tensor> = params
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&tensors, partial.join(WEIGHTS))?;
    let state_path = partial.join(STATE);
    let json = serde_json::to_vec_pretty(state).map_err(|source| Error::Json {
        path: state_path.clone(),
        source,
    })?;
    std::fs::write(&state_path, json).map_err(io(&state_path))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    std::fs::rename(&partial, &dir).map_err(io(&dir))?;
    Ok(dir)
}

/// Reads a checkpoint's state.
pub fn load_state(dir: &Path) -> Result<TrainerState> {
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

/// Writes rank 0's checkpoint of the run as it stands.
pub(crate) fn save_checkpoint<S: Schedule>(
    plan: &RunSettings,
    planner: &StepPlanner<S>,
    params: &[(String, Var)],
    oom_events: usize,
    logger: Option<&Logger>,
) -> Result<()> {
    let state = TrainerState {
        planner: planner.state(),
        seed: plan.seed,
        world_size: plan.world_size,
        num_examples: plan.num_examples,
        oom_events,
    };
    let dir = save(&plan.output_dir, params, &state)?;
    if let Some(logger) = logger {
        logger.event(&format!(
            "step {}: saved {}",
            state.planner.global_step,
            dir.display()
        ));
    }
    Ok(())
}

/// Loads a checkpoint's weights and checks that it belongs to this run.
pub(crate) fn resume_checkpoint(
    dir: &std::path::Path,
    plan: &RunSettings,
    params: &[(String, Var)],
    device: &Device,
) -> Result<TrainerState> {
    let state = load_state(dir)?;
    let mismatch = |what: &str, theirs: String, ours: String| {
        Err(Error::CheckpointMismatch {
            path: dir.to_path_buf(),
            what: what.into(),
            checkpoint: theirs,
            run: ours,
        })
    };
    if state.num_examples != plan.num_examples {
        return mismatch(
            "num_examples",
            state.num_examples.to_string(),
            plan.num_examples.to_string(),
        );
    }
    if state.world_size != plan.world_size {
        return mismatch(
            "world_size",
            state.world_size.to_string(),
            plan.world_size.to_string(),
        );
    }
    if state.seed != plan.seed {
        return mismatch("seed", state.seed.to_string(), plan.seed.to_string());
    }
    // A length-aware epoch is planned from its start: resume at a boundary, which
    // includes a checkpoint written after an epoch's last step (position = N).
    let position = state.planner.position;
    if plan.batching.is_some() && position > 0 && position < plan.num_examples {
        return Err(Error::MidEpochLengthAwareCheckpoint {
            path: dir.to_path_buf(),
        });
    }
    load_weights(dir, params, device)?;
    Ok(state)
}
