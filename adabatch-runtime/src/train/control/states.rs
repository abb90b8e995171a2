//! The controllers' parts of a checkpoint: one typed, versioned entry per
//! controller, keyed by its name (as accelerate's `register_for_checkpointing`),
//! under `controllers` in the trainer state:
//!
//! ```json
//! "controllers": {
//!   "oom": {"version": 1, "state": 0},
//!   "mixer": {"version": 1, "state": {"steps": 12, "last": [...], "rewards": [...]}},
//!   ...
//! }
//! ```
//!
//! Each controller writes and reads its own entry ([`ControllerStates::put`],
//! [`ControllerStates::get`]); an entry of a version it does not know, or whose
//! state does not parse, is a typed error naming the entry. Checkpoints written
//! before the entries held the parts as flat keys of the trainer state
//! ([`LegacyControllerStates`]): they still read, as version-1 entries (the
//! mixer's bare list of numbers as version 0, which the built-in mixers read).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::{CheckpointError, Error, Result};
use crate::memory::memory_model::OnlineMemoryState;

/// The OOM controller's entry: the OOM events handled so far.
pub(crate) const OOM: &str = "oom";
/// The loss scaler's entry (`--fp16`): its scale and count of clean steps.
pub(crate) const LOSS_SCALE: &str = "loss_scale";
/// The gradient noise scale estimator's moving averages.
pub(crate) const NOISE_SCALE: &str = "noise_scale";
/// Which steps measure the gradient noise scale: [`crate::adapt::noise_cadence::CadenceState`].
pub(crate) const NOISE_CADENCE: &str = "noise_cadence";
/// The last positive noise-scale estimate, held while the current one is not.
pub(crate) const NOISE_HELD: &str = "noise_held";
/// `schedule = goodput(..)`: the measured step times and the last decision.
pub(crate) const GOODPUT: &str = "goodput";
/// The memory models (memory-aware runs): [`MemoryEntry`].
pub(crate) const MEMORY: &str = "memory";
/// The trainer's `#[mixer]`: [`crate::Mixer::state`].
pub(crate) const MIXER: &str = "mixer";
/// What the held-out losses a mixer asked for have cost: [`crate::report::record::HeldOutCost`].
pub(crate) const HELD_OUT: &str = "held_out";
/// The trainer's `#[callback]`: [`crate::Callback::state`].
pub(crate) const CALLBACK: &str = "callback";
/// What measuring the sources' gradients for the mixer has cost.
pub(crate) const SOURCE_GRADIENTS: &str = "source_gradients";

/// One controller's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ControllerEntry {
    /// The layout of `state`: a controller refuses a version it does not know.
    pub version: u32,
    /// The controller's own state.
    pub state: Value,
}

/// Every controller's entry, by name.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ControllerStates {
    entries: BTreeMap<String, ControllerEntry>,
}

/// The memory controller's entry: each rank's online memory model whole, by rank
/// (each rank fits its own measurements; on another number of ranks, rank `r`
/// continues rank `r % world_size`'s), and rank 0's fit. Older checkpoints held
/// rank 0's model only (`model`), or only its fit.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct MemoryEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fit: Option<[f64; 5]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<OnlineMemoryState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) models: Option<Vec<OnlineMemoryState>>,
}

impl ControllerStates {
    /// Whether no controller wrote an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The names of the entries.
    #[cfg(any(test, feature = "internals"))]
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Whether `name` has an entry.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// An entry as it is (for states whose layout the controller reads itself).
    pub(crate) fn entry(&self, name: &str) -> Option<&ControllerEntry> {
        self.entries.get(name)
    }

    /// Writes `name`'s entry: `state` in layout `version`.
    pub(crate) fn put<T: Serialize>(&mut self, name: &str, version: u32, state: &T) -> Result<()> {
        let state = serde_json::to_value(state)
            .map_err(|e| entry_unreadable(name, "does not convert to JSON", e))?;
        self.put_value(name, version, state);
        Ok(())
    }

    /// Writes `name`'s entry from a JSON value.
    pub(crate) fn put_value(&mut self, name: &str, version: u32, state: Value) {
        self.entries
            .insert(name.to_string(), ControllerEntry { version, state });
    }

    /// `name`'s state in layout `version`, if the checkpoint has the entry; an
    /// entry of another version, or one that does not parse, is an error.
    pub(crate) fn get<T: DeserializeOwned>(&self, name: &str, version: u32) -> Result<Option<T>> {
        let Some(entry) = self.entries.get(name) else {
            return Ok(None);
        };
        if entry.version != version {
            return Err(entry_error(
                name,
                format!(
                    "is version {}, this adabatch reads version {version}",
                    entry.version
                ),
            ));
        }
        serde_json::from_value(entry.state.clone())
            .map(Some)
            .map_err(|e| entry_unreadable(name, "does not parse", e))
    }
}

/// The typed error of an entry that cannot be read.
pub(crate) fn entry_error(name: &str, detail: String) -> Error {
    Error::Checkpoint(CheckpointError::ControllerState {
        name: name.to_string(),
        detail,
        source: None,
    })
}

/// The typed error of an entry that `error` kept from being read or written.
fn entry_unreadable(name: &str, detail: &str, error: serde_json::Error) -> Error {
    Error::Checkpoint(CheckpointError::ControllerState {
        name: name.to_string(),
        detail: detail.to_string(),
        source: Some(error.into()),
    })
}

/// The controllers' parts as checkpoints before the named entries wrote them:
/// flat keys of the trainer state. Read only, into entries.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct LegacyControllerStates {
    #[serde(default)]
    oom_events: Option<usize>,
    #[serde(default)]
    memory_fit: Option<[f64; 5]>,
    #[serde(default)]
    memory_model: Option<OnlineMemoryState>,
    #[serde(default)]
    memory_models: Option<Vec<OnlineMemoryState>>,
    #[serde(default)]
    noise_scale: Option<Value>,
    #[serde(default)]
    goodput: Option<Value>,
    #[serde(default)]
    mixer: Option<Vec<f64>>,
    #[serde(default)]
    callback: Option<Value>,
    #[serde(default)]
    loss_scaler: Option<Value>,
}

impl LegacyControllerStates {
    /// The same parts as entries: version 1, the mixer's list of numbers
    /// version 0.
    pub(crate) fn into_states(self) -> ControllerStates {
        let mut states = ControllerStates::default();
        if let Some(events) = self.oom_events {
            states.put_value(OOM, 1, events.into());
        }
        let memory = MemoryEntry {
            fit: self.memory_fit,
            model: self.memory_model,
            models: self.memory_models,
        };
        if memory != MemoryEntry::default() {
            if let Ok(value) = serde_json::to_value(&memory) {
                states.put_value(MEMORY, 1, value);
            }
        }
        for (name, value) in [
            (NOISE_SCALE, self.noise_scale),
            (GOODPUT, self.goodput),
            (CALLBACK, self.callback),
            (LOSS_SCALE, self.loss_scaler),
        ] {
            if let Some(value) = value {
                states.put_value(name, 1, value);
            }
        }
        if let Some(numbers) = self.mixer {
            states.put_value(MIXER, 0, numbers.into());
        }
        states
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_refuse_other_versions_and_bad_states() {
        let mut states = ControllerStates::default();
        states.put(OOM, 1, &3usize).unwrap();
        let json = serde_json::to_string(&states).unwrap();
        assert_eq!(json, r#"{"oom":{"version":1,"state":3}}"#);
        let back: ControllerStates = serde_json::from_str(&json).unwrap();
        assert_eq!(back.get::<usize>(OOM, 1).unwrap(), Some(3));
        assert_eq!(back.get::<usize>(MIXER, 1).unwrap(), None);
        let err = back.get::<usize>(OOM, 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "checkpoint: the `oom` controller's state is version 1, this adabatch reads version 2"
        );
        let mut bad = ControllerStates::default();
        bad.put_value(OOM, 1, "three".into());
        let err = bad.get::<usize>(OOM, 1).unwrap_err();
        assert!(matches!(
            &err,
            Error::Checkpoint(CheckpointError::ControllerState { name, .. }) if name == "oom"
        ));
    }

    #[test]
    fn flat_keys_of_older_checkpoints_become_entries() {
        let legacy: LegacyControllerStates = serde_json::from_str(
            r#"{"oom_events": 2, "mixer": [1.0, 0.5], "memory_fit": [1, 2, 3, 4, 5], "callback": {"best": 1.0}}"#,
        )
        .unwrap();
        let states = legacy.into_states();
        assert_eq!(states.get::<usize>(OOM, 1).unwrap(), Some(2));
        assert_eq!(states.entry(MIXER).unwrap().version, 0);
        assert_eq!(
            states.get::<MemoryEntry>(MEMORY, 1).unwrap().unwrap().fit,
            Some([1.0, 2.0, 3.0, 4.0, 5.0])
        );
        assert_eq!(
            states.names().collect::<Vec<_>>(),
            ["callback", "memory", "mixer", "oom"]
        );
    }
}
