//! A trainer state checked against itself before anything trains.
//!
//! `per_device: 0`, `epoch_index: 99` or `position: 5000` of 1,000 examples would
//! otherwise end a resumed run early as "nothing left to train", with exit code 0.
//! Each field that can be checked is: sizes at least 1, the position within the
//! data, the counts consistent with each other, the clamps within the stored
//! policy's, and the policy present in checkpoints that always write it.

use std::path::Path;

use crate::error::{CheckpointError, Error, Result};

use super::format::{state_file, CheckpointState};
use super::manifest::FORMAT_VERSION;

/// An error naming the trainer state file and what is wrong in it.
fn invalid(dir: &Path, detail: String) -> Error {
    Error::Checkpoint(CheckpointError::corrupt(state_file(dir), detail))
}

/// Checks `state` (read from `dir`). A state past this run's end (resumed with
/// fewer epochs or steps) is not corrupt: the run then has nothing left to train.
pub(crate) fn check_state(dir: &Path, state: &CheckpointState) -> Result<()> {
    let p = &state.planner;
    let n = state.num_examples;
    let checks: [(bool, String); 8] = [
        (p.per_device >= 1, format!("`per_device` is {}, at least 1", p.per_device)),
        (state.world_size >= 1, format!("`world_size` is {}, at least 1", state.world_size)),
        (p.min_batch >= 1, format!("`min_batch` is {}, at least 1", p.min_batch)),
        (
            p.max_batch.is_none_or(|max| max >= p.min_batch),
            format!("`max_batch` {:?} is below `min_batch` {}", p.max_batch, p.min_batch),
        ),
        (p.position <= n, format!("`position` {} is beyond the {n} examples", p.position)),
        (
            // With several sources, positions count each source apart.
            p.sources.is_some()
                || (p.examples_seen >= p.position + p.epoch_index
                    && p.examples_seen - p.position <= p.epoch_index * n),
            format!(
                "`examples_seen` {} does not fit `epoch_index` {} and `position` {} of {n} examples",
                p.examples_seen, p.epoch_index, p.position
            ),
        ),
        (
            p.global_step <= p.examples_seen && (p.examples_seen == 0) == (p.global_step == 0),
            format!(
                "`global_step` {} does not fit `examples_seen` {} (every step uses at least one example)",
                p.global_step, p.examples_seen
            ),
        ),
        (
            state.policy.is_some() || state.format_version.unwrap_or(1) < FORMAT_VERSION,
            "the `policy` key is missing".to_string(),
        ),
    ];
    if let Some((_, detail)) = checks.into_iter().find(|(ok, _)| !ok) {
        return Err(invalid(dir, detail));
    }
    check_clamps(dir, state)
}

/// The clamps in force may only be tighter than the stored policy's (an OOM
/// `halve` lowers them), never looser.
fn check_clamps(dir: &Path, state: &CheckpointState) -> Result<()> {
    let (Some(policy), p) = (&state.policy, &state.planner) else {
        return Ok(());
    };
    if let (Some(limit), Some(max)) = (policy.max_batch, p.max_batch) {
        if max > limit {
            return Err(invalid(
                dir,
                format!("`max_batch` {max} exceeds the policy's max_batch {limit}"),
            ));
        }
    }
    if policy.max_batch.is_some() && p.max_batch.is_none() {
        return Err(invalid(
            dir,
            "`max_batch` is missing though the policy has one".to_string(),
        ));
    }
    if p.min_batch > policy.min_batch.max(1) {
        return Err(invalid(
            dir,
            format!(
                "`min_batch` {} exceeds the policy's min_batch {}",
                p.min_batch, policy.min_batch
            ),
        ));
    }
    Ok(())
}
