//! An optimizer's state in a checkpoint: `optimizer.safetensors`, tensors keyed by
//! `<parameter name>.<slot>` and metadata (format version, kind, step count,
//! hyper-parameters) in the safetensors header.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};

use super::groups::ParamGroups;
use crate::error::{Cause, CheckpointError, Error, FileOp, Result};

/// Version of the file layout; a checkpoint of another version is refused.
pub const FORMAT_VERSION: &str = "1";

/// Everything an optimizer's future updates depend on.
#[derive(Debug, Clone)]
pub struct OptimizerState {
    /// Which optimizer wrote it (e.g. `adabatch::AdamW`).
    pub kind: String,
    /// Updates taken (bias correction depends on it).
    pub step: u64,
    /// Hyper-parameters, by name.
    pub hyper: BTreeMap<String, f64>,
    /// State tensors, keyed `<parameter name>.<slot>` (e.g. `linear.weight.m`).
    pub tensors: HashMap<String, Tensor>,
    /// The parameter groups the optimizer was built with, if any (absent in
    /// checkpoints written before groups existed).
    pub groups: Option<ParamGroups>,
}

impl OptimizerState {
    /// An empty state of `kind` after `step` updates.
    pub fn new(kind: &str, step: u64) -> Self {
        Self {
            kind: kind.into(),
            step,
            hyper: BTreeMap::new(),
            tensors: HashMap::new(),
            groups: None,
        }
    }

    /// An error unless the state was written by `kind`.
    pub fn expect_kind(&self, kind: &str) -> Result<()> {
        if self.kind == kind {
            Ok(())
        } else {
            Err(Error::Checkpoint(CheckpointError::OptimizerStateMismatch {
                detail: format!("written by `{}`, this run uses `{kind}`", self.kind),
            }))
        }
    }

    /// The tensor of `slot` for parameter `name`.
    pub fn tensor(&self, name: &str, slot: &str) -> Result<&Tensor> {
        self.tensors.get(&format!("{name}.{slot}")).ok_or_else(|| {
            Error::Checkpoint(CheckpointError::OptimizerStateMismatch {
                detail: format!("no `{slot}` state for parameter `{name}`"),
            })
        })
    }

    /// A hyper-parameter.
    pub fn hyper(&self, name: &str) -> Result<f64> {
        self.hyper.get(name).copied().ok_or_else(|| {
            Error::Checkpoint(CheckpointError::OptimizerStateMismatch {
                detail: format!("no hyper-parameter `{name}`"),
            })
        })
    }

    /// Writes `path` (safetensors with the metadata in its header).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut metadata = HashMap::new();
        metadata.insert("format_version".to_string(), FORMAT_VERSION.to_string());
        metadata.insert("kind".to_string(), self.kind.clone());
        metadata.insert("step".to_string(), self.step.to_string());
        metadata.insert(
            "hyper".to_string(),
            serde_json::to_string(&self.hyper).map_err(|source| Error::Json {
                path: path.into(),
                source,
            })?,
        );
        if let Some(groups) = &self.groups {
            let json = serde_json::to_string(groups).map_err(|source| Error::Json {
                path: path.into(),
                source,
            })?;
            metadata.insert("groups".to_string(), json);
        }
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        let views: Vec<(&str, &Tensor)> = names
            .iter()
            .map(|n| (n.as_str(), &self.tensors[*n]))
            .collect();
        safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| {
            Error::Checkpoint(CheckpointError::unreadable(
                path,
                "cannot write the optimizer state",
                e,
            ))
        })
    }

    /// Reads `path` onto `device`.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        let corrupt = |detail: String| Error::Checkpoint(CheckpointError::corrupt(path, detail));
        let unreadable = |detail: &str, source: Cause| {
            Error::Checkpoint(CheckpointError::unreadable(path, detail, source))
        };
        let bytes = std::fs::read(path).map_err(Error::io(FileOp::Read, path))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| unreadable("not a safetensors file", e.into()))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let field = |key: &str| {
            metadata
                .get(key)
                .cloned()
                .ok_or_else(|| corrupt(format!("no `{key}` in the optimizer state's metadata")))
        };
        let version = field("format_version")?;
        if version != FORMAT_VERSION {
            return Err(corrupt(format!(
                "optimizer state format {version}, this adabatch reads {FORMAT_VERSION}"
            )));
        }
        let step = field("step")?
            .parse()
            .map_err(|e: std::num::ParseIntError| {
                unreadable("its step is not a number", e.into())
            })?;
        let hyper = serde_json::from_str(&field("hyper")?)
            .map_err(|e| unreadable("its hyper-parameters do not parse", e.into()))?;
        let groups = match metadata.get("groups") {
            Some(json) => Some(
                serde_json::from_str(json)
                    .map_err(|e| unreadable("its parameter groups do not parse", e.into()))?,
            ),
            None => None,
        };
        let tensors = candle_core::safetensors::load_buffer(&bytes, device)
            .map_err(|e| unreadable("its tensors do not load", e.into()))?;
        Ok(Self {
            kind: field("kind")?,
            step,
            hyper,
            tensors,
            groups,
        })
    }
}
