//! Checkpoints: model weights (safetensors) and the trainer state needed to resume
//! mid-epoch with the same batches the run would have had.
//!
//! The optimizer's state is not saved: candle's optimizers do not expose it, so
//! stateless optimizers (SGD) resume exactly and AdamW restarts its moments.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};

use crate::error::{Error, Result};

/// Where the run stood when the checkpoint was written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrainerState {
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
    let dir = output_dir.join(format!("checkpoint-{}", state.global_step));
    // Write next to the target and rename, so a crash never leaves half a checkpoint.
    let partial = output_dir.join(format!(".checkpoint-{}.partial", state.global_step));
    std::fs::create_dir_all(&partial).map_err(io(&partial))?;
    let tensors: HashMap<String, Tensor> = params
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&tensors, partial.join(WEIGHTS))?;
    let json = serde_json::to_vec_pretty(state).map_err(|e| io(&partial)(e.into()))?;
    std::fs::write(partial.join(STATE), json).map_err(io(&partial))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    std::fs::rename(&partial, &dir).map_err(io(&dir))?;
    Ok(dir)
}

/// Reads a checkpoint's state.
pub fn load_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE);
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::InvalidConfig(format!("{}: {e}", path.display())))
}

/// Loads a checkpoint's weights into `params` (every name must be present with the
/// same shape).
pub fn load_weights(dir: &Path, params: &[(String, Var)], device: &Device) -> Result<()> {
    let path = dir.join(WEIGHTS);
    if !path.exists() {
        return Err(Error::Io {
            path,
            source: std::io::ErrorKind::NotFound.into(),
        });
    }
    let tensors = candle_core::safetensors::load(&path, device)?;
    for (name, var) in params {
        let tensor = tensors.get(name).ok_or_else(|| {
            Error::InvalidConfig(format!("{}: no parameter `{name}`", path.display()))
        })?;
        if tensor.shape() != var.shape() {
            return Err(Error::InvalidConfig(format!(
                "{}: `{name}` has shape {:?}, the model {:?}",
                path.display(),
                tensor.shape(),
                var.shape()
            )));
        }
        var.set(&tensor.to_dtype(var.dtype())?)?;
    }
    Ok(())
}
