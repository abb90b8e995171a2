//! Pretrained weights in and out, by parameter name.
//!
//! A model's [`named_parameters`](crate::TrainModel::named_parameters) use the
//! names of Hugging Face and candle-transformers, so a `model.safetensors` (or a
//! sharded one with its `model.safetensors.index.json`) loads into them, and what a
//! run saves loads back into those libraries: [`save_pretrained`] writes
//! `model.safetensors` with the `{"format": "pt"}` header transformers expects,
//! and the model's `config.json` beside it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use adabatch_nn::Parameters;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{Tensor, Var};

use crate::error::{Cause, Error, ModelError, Result};

/// The weights file of a saved model or checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded save (transformers' layout).
pub const WEIGHTS_INDEX: &str = "model.safetensors.index.json";
/// A Hugging Face model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// What a load did: the parameters it set, and (non-strict) what it skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    /// Parameters set from the file.
    pub loaded: Vec<String>,
    /// Parameters of the model the file lacks (left as they were).
    pub missing: Vec<String>,
    /// Tensors of the file the model does not have.
    pub unexpected: Vec<String>,
    /// `(name, file shape, model shape)`: present in both, shapes differ (left as
    /// they were).
    pub mismatched: Vec<(String, Vec<usize>, Vec<usize>)>,
}

impl LoadReport {
    /// Whether everything fitted.
    pub fn is_exact(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "loaded {} parameters", self.loaded.len())?;
        if !self.missing.is_empty() {
            write!(f, "; missing from the file: {}", self.missing.join(", "))?;
        }
        if !self.unexpected.is_empty() {
            write!(f, "; not in the model: {}", self.unexpected.join(", "))?;
        }
        for (name, file, model) in &self.mismatched {
            write!(
                f,
                "; `{name}` is {file:?} in the file, {model:?} in the model"
            )?;
        }
        Ok(())
    }
}

/// A sharded directory's index: its path, and each tensor it lists with its shard.
type ShardIndex = (PathBuf, BTreeMap<String, String>);

/// The safetensors files of `source`: the file itself, or a directory's
/// `model.safetensors`, or the shards its `model.safetensors.index.json` lists
/// (with that index). What is wrong with the index (not JSON, no shard, a shard
/// that is not there) is an error naming the index itself, not its directory.
pub(crate) fn weight_files(source: &Path) -> Result<(Vec<PathBuf>, Option<ShardIndex>)> {
    let file_error = |path: &Path, detail: String, cause: Option<Cause>| {
        Error::Model(ModelError::WeightsFile {
            path: path.to_path_buf(),
            detail,
            source: cause,
        })
    };
    if source.is_file() {
        return Ok((vec![source.to_path_buf()], None));
    }
    if !source.is_dir() {
        return Err(file_error(source, "no such file or directory".into(), None));
    }
    let single = source.join(WEIGHTS_FILE);
    if single.is_file() {
        return Ok((vec![single], None));
    }
    let index = source.join(WEIGHTS_INDEX);
    if !index.is_file() {
        return Err(file_error(
            source,
            format!("the directory has neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX}"),
            None,
        ));
    }
    let text = std::fs::read_to_string(&index)
        .map_err(|e| file_error(&index, "cannot read".into(), Some(e.into())))?;
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let parsed: Index = serde_json::from_str(&text)
        .map_err(|e| file_error(&index, "is not a weights index".into(), Some(e.into())))?;
    let shards: BTreeSet<&String> = parsed.weight_map.values().collect();
    if shards.is_empty() {
        return Err(file_error(&index, "lists no tensor".into(), None));
    }
    // A shard name is a file of the directory (transformers joins it to the
    // directory): anything else is a damaged or foreign index.
    if let Some(missing) = shards.iter().find(|s| !source.join(s).is_file()) {
        return Err(file_error(
            &index,
            format!("lists the shard {missing:?}, which is not a file of its directory"),
            None,
        ));
    }
    let files = shards.into_iter().map(|s| source.join(s)).collect();
    Ok((files, Some((index, parsed.weight_map))))
}

/// Pretrained weights into a [`Parameters`] store (crate `adabatch-nn` holds the
/// store; loading is the engine's, with its typed errors).
pub trait LoadPretrained {
    /// Sets the parameters created so far from a safetensors file or a saved
    /// model's directory, by name (strict: anything that does not fit is an error
    /// and nothing is set). Build the model first: the store creates parameters as
    /// the model asks for them.
    fn load_pretrained(&self, source: &Path, strict: bool) -> Result<LoadReport>;
}

impl LoadPretrained for Parameters {
    fn load_pretrained(&self, source: &Path, strict: bool) -> Result<LoadReport> {
        load_weights(&self.named_parameters(), source, strict)
    }
}

/// Loads the weights of `source` (a safetensors file, or a directory's
/// `model.safetensors` or the shards its `model.safetensors.index.json` lists)
/// into `params` by name, converting dtypes. `strict`: a parameter the file lacks, a tensor the model
/// does not have, or a shape that differs is an error and nothing is set;
/// otherwise those are skipped and listed in the report.
pub fn load_weights(params: &[(String, Var)], source: &Path, strict: bool) -> Result<LoadReport> {
    let (files, index) = weight_files(source)?;
    // SAFETY: the files are mapped read-only for the duration of this call; a
    // concurrent writer truncating them is outside what any loader can guard.
    let mapped = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
        Error::Model(ModelError::WeightsFile {
            path: source.to_path_buf(),
            detail: "not a safetensors file".into(),
            source: Some(e.into()),
        })
    })?;
    let shapes: HashMap<String, Vec<usize>> = mapped
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.shape().to_vec()))
        .collect();
    // A tensor the index lists that no shard holds: the index is damaged, or
    // belongs to other shards (the strict check below would blame the model).
    if let Some((index, map)) = &index {
        if let Some((name, shard)) = map.iter().find(|(name, _)| !shapes.contains_key(*name)) {
            return Err(Error::Model(ModelError::WeightsFile {
                path: index.clone(),
                detail: format!("lists the tensor `{name}` (in {shard:?}), which no shard holds"),
                source: None,
            }));
        }
    }
    let report = plan_load(params, &shapes);
    if strict && !report.is_exact() {
        return Err(Error::Model(ModelError::WeightsMismatch {
            path: source.to_path_buf(),
            missing: report.missing,
            unexpected: report.unexpected,
            shapes: report.mismatched,
        }));
    }
    // Every tensor is read and checked before any parameter changes: a file with
    // a NaN leaves the model as it was.
    let mut loaded = Vec::new();
    let mut non_finite = Vec::new();
    for (name, var) in params.iter().filter(|(n, _)| report.loaded.contains(n)) {
        let tensor = mapped.load(name, var.device()).map_err(|e| {
            Error::Model(ModelError::WeightsFile {
                path: source.to_path_buf(),
                detail: format!("cannot read `{name}`"),
                source: Some(e.into()),
            })
        })?;
        let bad = count_non_finite(&tensor)?;
        if bad > 0 {
            non_finite.push(format!("`{name}`: {bad} of {}", tensor.elem_count()));
        }
        loaded.push((var, tensor));
    }
    if !non_finite.is_empty() {
        return Err(Error::Model(ModelError::NonFiniteInitWeights {
            path: source.to_path_buf(),
            tensors: non_finite,
        }));
    }
    for (var, tensor) in loaded {
        var.set(&tensor.to_dtype(var.dtype())?)?;
    }
    Ok(report)
}

/// Which parameters a file of these tensor shapes can set.
fn plan_load(params: &[(String, Var)], shapes: &HashMap<String, Vec<usize>>) -> LoadReport {
    let mut report = LoadReport::default();
    for (name, var) in params {
        match shapes.get(name) {
            None => report.missing.push(name.clone()),
            Some(shape) if shape.as_slice() != var.dims() => {
                report
                    .mismatched
                    .push((name.clone(), shape.clone(), var.dims().to_vec()))
            }
            Some(_) => report.loaded.push(name.clone()),
        }
    }
    let named: BTreeSet<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    report.unexpected = shapes
        .keys()
        .filter(|n| !named.contains(n.as_str()))
        .cloned()
        .collect();
    report.unexpected.sort();
    report
}

/// Writes `params` as `dir/model.safetensors` (with the `{"format": "pt"}`
/// header) and, given one, the model's Hugging Face `config.json` beside it. Each
/// file is written under a temporary name, synced and renamed, so a kill leaves
/// the previous file or the new one.
pub fn save_pretrained(params: &[(String, Var)], config: Option<&str>, dir: &Path) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| {
            Error::Model(ModelError::WeightsFile {
                path,
                detail: "cannot write".into(),
                source: Some(e.into()),
            })
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tensors: Vec<(&str, Tensor)> = params
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_tensor().clone()))
        .collect();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let weights = dir.join(WEIGHTS_FILE);
    write_atomically(&weights, |tmp| {
        safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (*n, t)), Some(metadata), tmp)
            .map_err(std::io::Error::other)
    })
    .map_err(io(&weights))?;
    if let Some(config) = config {
        let path = dir.join(CONFIG_FILE);
        write_atomically(&path, |tmp| std::fs::write(tmp, config)).map_err(io(&path))?;
    }
    Ok(())
}

/// `write` to `path.tmp`, sync, rename over `path`.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    write(&tmp)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Values of `tensor` that are NaN or infinite (checked in f64, which every float
/// dtype widens to exactly).
fn count_non_finite(tensor: &candle_core::Tensor) -> Result<usize> {
    if !tensor.dtype().is_float() {
        return Ok(0);
    }
    let values = tensor
        .flatten_all()?
        .to_dtype(candle_core::DType::F64)?
        .to_vec1::<f64>()?;
    Ok(values.iter().filter(|v| !v.is_finite()).count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn var(dims: &[usize], fill: f32) -> Var {
        Var::from_tensor(
            &(Tensor::ones(dims, DType::F32, &Device::Cpu).unwrap() * f64::from(fill)).unwrap(),
        )
        .unwrap()
    }

    fn model(fill: f32) -> Vec<(String, Var)> {
        vec![
            ("a.weight".into(), var(&[2, 3], fill)),
            ("a.bias".into(), var(&[2], fill)),
        ]
    }

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("adabatch-weights-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn values(params: &[(String, Var)]) -> Vec<f32> {
        params
            .iter()
            .flat_map(|(_, v)| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn round_trip_through_a_directory_and_a_file() -> Result<()> {
        let dir = temp("round");
        save_pretrained(&model(2.0), Some("{\"model_type\": \"llama\"}"), &dir)?;
        assert!(dir.join(CONFIG_FILE).is_file());
        let fresh = model(0.0);
        let report = load_weights(&fresh, &dir, true)?;
        assert!(report.is_exact(), "{report}");
        assert_eq!(values(&fresh), vec![2.0; 8]);
        let again = model(0.0);
        load_weights(&again, &dir.join(WEIGHTS_FILE), true)?;
        assert_eq!(values(&again), vec![2.0; 8]);
        // transformers refuses a safetensors file without its format header.
        let bytes = std::fs::read(dir.join(WEIGHTS_FILE)).unwrap();
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(header.metadata().as_ref().unwrap()["format"], "pt");
        Ok(())
    }

    #[test]
    fn strict_names_each_mistake_and_sets_nothing() -> Result<()> {
        let dir = temp("strict");
        let saved = vec![
            ("a.weight".to_string(), var(&[3, 2], 1.0)),
            ("extra".to_string(), var(&[1], 1.0)),
        ];
        save_pretrained(&saved, None, &dir)?;
        let target = model(5.0);
        let err = load_weights(&target, &dir, true).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("missing a.bias"), "{text}");
        assert!(text.contains("unexpected extra"), "{text}");
        assert!(
            text.contains("`a.weight` is [3, 2] in the file, [2, 3] in the model"),
            "{text}"
        );
        assert_eq!(
            values(&target),
            vec![5.0; 8],
            "a failed strict load changes nothing"
        );
        // Non-strict: the same mistakes are reported and skipped.
        let report = load_weights(&target, &dir, false)?;
        assert_eq!(report.missing, ["a.bias"]);
        assert_eq!(report.unexpected, ["extra"]);
        assert_eq!(report.mismatched.len(), 1);
        assert!(report.loaded.is_empty());
        Ok(())
    }

    #[test]
    fn sharded_index_and_bad_sources() -> Result<()> {
        let dir = temp("sharded");
        let parts = model(3.0);
        save_pretrained(&parts[..1], None, &dir.join("s1"))?;
        save_pretrained(&parts[1..], None, &dir.join("s2"))?;
        std::fs::rename(
            dir.join("s1").join(WEIGHTS_FILE),
            dir.join("model-00001-of-00002.safetensors"),
        )
        .unwrap();
        std::fs::rename(
            dir.join("s2").join(WEIGHTS_FILE),
            dir.join("model-00002-of-00002.safetensors"),
        )
        .unwrap();
        let index = r#"{"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "a.bias": "model-00002-of-00002.safetensors"}}"#;
        std::fs::write(dir.join(WEIGHTS_INDEX), index).unwrap();
        let target = model(0.0);
        assert!(load_weights(&target, &dir, true)?.is_exact());
        assert_eq!(values(&target), vec![3.0; 8]);
        let err = load_weights(&target, &dir.join("nowhere"), true).unwrap_err();
        assert!(
            err.to_string().contains("no such file or directory"),
            "{err}"
        );
        let junk = dir.join("junk.safetensors");
        std::fs::write(&junk, b"not weights").unwrap();
        let err = load_weights(&target, &junk, true).unwrap_err();
        assert!(err.to_string().contains("not a safetensors file"), "{err}");
        Ok(())
    }
}
