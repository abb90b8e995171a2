//! One configuration for the Llama, Mistral and Qwen2 shapes, read from and written
//! as a Hugging Face `config.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The architecture family, Hugging Face's `model_type`. The three differ only in
/// their biases and sliding windows (see [`LlamaConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    /// `llama`: biases as `attention_bias` / `mlp_bias` say, no sliding window.
    Llama,
    /// `mistral`: no biases; `sliding_window` (if set) on every layer.
    Mistral,
    /// `qwen2`: q/k/v biases always, none on `o_proj` or the MLP; a sliding window
    /// on some layers only with `use_sliding_window`.
    Qwen2,
}

impl ModelType {
    /// Hugging Face's class for this family (the `architectures` entry).
    pub fn architecture(self) -> &'static str {
        match self {
            ModelType::Llama => "LlamaForCausalLM",
            ModelType::Mistral => "MistralForCausalLM",
            ModelType::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// `max_position_embeddings` when a `config.json` leaves it out (Hugging
    /// Face's defaults).
    fn default_max_positions(self) -> usize {
        match self {
            ModelType::Llama => 2048,
            ModelType::Mistral => 4096 * 32,
            ModelType::Qwen2 => 32768,
        }
    }
}

/// `eos_token_id`: one id or several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// A single id.
    One(u32),
    /// Several ids (Llama 3 lists more than one end token).
    Many(Vec<u32>),
}

/// Why a configuration cannot build a model, or could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field's value is out of range or contradicts another.
    #[error("invalid model config{}: {field}: {reason}", path_note(path))]
    Invalid {
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// The `config.json` key.
        field: &'static str,
        /// What is wrong, with the values involved.
        reason: String,
    },
    /// The JSON does not parse, or lacks a required key (the JSON error is the
    /// source).
    #[error("model config{} is not a valid config.json", path_note(path))]
    Json {
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// The cause.
        source: serde_json::Error,
    },
    /// Reading or writing the file failed (the I/O error is the source).
    #[error("model config {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

fn path_note(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

/// candle's error shows what it wraps but has no `source()`: the error goes in
/// whole, displayed with its causes.
impl From<ConfigError> for candle_core::Error {
    fn from(e: ConfigError) -> Self {
        candle_core::Error::wrap(WithCauses(e))
    }
}

/// An error displayed as its message and its causes, joined by `": "`.
struct WithCauses(ConfigError);

impl std::fmt::Display for WithCauses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = std::error::Error::source(&self.0);
        while let Some(source) = cause {
            write!(f, ": {source}")?;
            cause = source.source();
        }
        Ok(())
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        path: None,
        field,
        reason: reason.into(),
    }
}

/// A Llama-family decoder's shape, under Hugging Face's `config.json` names.
///
/// Read one with [`LlamaConfig::from_file`] / [`LlamaConfig::from_json_str`] (keys
/// Hugging Face leaves out take its defaults; `rope_parameters` of transformers 5
/// is read as well as `rope_theta`), write one with [`LlamaConfig::save`]. Keys
/// this model does not use are kept in [`LlamaConfig::extra`] and written back.
/// [`LlamaConfig::validate`] checks the shape; `Llama::new` calls it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(remote = "Self")]
pub struct LlamaConfig {
    /// The family: `llama`, `mistral` or `qwen2`.
    pub model_type: ModelType,
    /// Hugging Face's class names, e.g. `["LlamaForCausalLM"]`.
    pub architectures: Vec<String>,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Width of one head (`hidden_size / num_attention_heads` unless given).
    pub head_dim: usize,
    /// Epsilon of the RMS norms.
    pub rms_norm_eps: f64,
    /// Base of the rotary frequencies.
    pub rope_theta: f64,
    /// Longest sequence the model was made for (not enforced: rope has no table).
    pub max_position_embeddings: usize,
    /// `lm_head` shares the token embedding (no `lm_head.weight` then).
    pub tie_word_embeddings: bool,
    /// Llama: biases on q/k/v/o. Qwen2: always true, biases on q/k/v only.
    /// Mistral: always false.
    pub attention_bias: bool,
    /// Llama: biases on the MLP's projections. Mistral and Qwen2: always false.
    pub mlp_bias: bool,
    /// The MLP's activation; only `silu` (SwiGLU) is supported.
    pub hidden_act: String,
    /// Standard deviation of the initial linear and embedding weights.
    pub initializer_range: f64,
    /// Beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token(s).
    pub eos_token_id: Option<TokenIds>,
    /// The dtype the weights were saved in, e.g. `"float32"` (informative).
    pub torch_dtype: Option<String>,
    /// Mistral: the window of every layer. Qwen2: the window of its sliding layers.
    /// `None` is written as `null` for both (a missing key means 4096 to
    /// transformers), and left out for Llama.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// Qwen2: whether layers from `max_window_layers` on use the sliding window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    /// Qwen2: the first layer that may use the sliding window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_window_layers: Option<usize>,
    /// Qwen2 in transformers 5: `full_attention` or `sliding_attention` per layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Every other key of the file, written back unchanged.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Serialize for LlamaConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut value = LlamaConfig::serialize(self, serde_json::value::Serializer)
            .map_err(serde::ser::Error::custom)?;
        if self.model_type != ModelType::Llama && self.sliding_window.is_none() {
            if let Some(map) = value.as_object_mut() {
                map.insert("sliding_window".to_string(), Value::Null);
            }
        }
        value.serialize(s)
    }
}

/// Through `RawConfig`: Hugging Face's defaults, then [`LlamaConfig::validate`].
impl<'de> Deserialize<'de> for LlamaConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawConfig::deserialize(d)?;
        LlamaConfig::try_from(raw).map_err(serde::de::Error::custom)
    }
}

impl LlamaConfig {
    /// A configuration of this family and shape with Hugging Face's defaults for
    /// everything else (no biases but Qwen2's, untied embeddings, `rope_theta`
    /// 10000, `rms_norm_eps` 1e-6, `initializer_range` 0.02, float32).
    pub fn new(
        model_type: ModelType,
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> Self {
        let qwen2 = model_type == ModelType::Qwen2;
        Self {
            model_type,
            architectures: vec![model_type.architecture().to_string()],
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size / num_attention_heads.max(1),
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: model_type.default_max_positions(),
            tie_word_embeddings: false,
            attention_bias: qwen2,
            mlp_bias: false,
            hidden_act: "silu".to_string(),
            initializer_range: 0.02,
            bos_token_id: None,
            eos_token_id: None,
            torch_dtype: Some("float32".to_string()),
            // Qwen2's keys are written out: candle-transformers' qwen2 requires them.
            sliding_window: qwen2.then_some(4096),
            use_sliding_window: qwen2.then_some(false),
            max_window_layers: qwen2.then_some(28),
            layer_types: None,
            extra: BTreeMap::new(),
        }
    }

    /// Parses and validates a `config.json`'s text.
    pub fn from_json_str(json: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_json::from_str(json)
            .map_err(|source| ConfigError::Json { path: None, source })?;
        Self::try_from(raw)
    }

    /// Reads and validates a `config.json` file; an error names the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let named = Some(path.to_path_buf());
        Self::from_json_str(&text).map_err(|e| match e {
            ConfigError::Json { source, .. } => ConfigError::Json {
                path: named,
                source,
            },
            ConfigError::Invalid { field, reason, .. } => ConfigError::Invalid {
                path: named,
                field,
                reason,
            },
            other => other,
        })
    }

    /// The configuration as pretty-printed `config.json` text.
    pub fn to_json_string(&self) -> Result<String, ConfigError> {
        serde_json::to_string_pretty(self)
            .map_err(|source| ConfigError::Json { path: None, source })
    }

    /// Writes `config.json` into `dir` (created if missing) and returns its path.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<PathBuf, ConfigError> {
        let dir = dir.as_ref();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ConfigError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join("config.json");
        std::fs::write(&path, self.to_json_string()? + "\n").map_err(io(&path))?;
        Ok(path)
    }

    /// Whether q/k/v projections carry biases.
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias
    }

    /// Whether `o_proj` carries a bias (Llama with `attention_bias` only).
    pub fn o_bias(&self) -> bool {
        self.attention_bias && self.model_type == ModelType::Llama
    }

    /// Query heads sharing one key/value head.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// The sliding window of layer `layer`, or `None` for full causal attention.
    pub fn sliding_window_of_layer(&self, layer: usize) -> Option<usize> {
        match self.model_type {
            ModelType::Llama => None,
            ModelType::Mistral => self.sliding_window,
            ModelType::Qwen2 => {
                let sliding = match &self.layer_types {
                    Some(types) => types.get(layer).map(String::as_str) == Some(SLIDING),
                    None => {
                        self.use_sliding_window == Some(true)
                            && layer >= self.max_window_layers.unwrap_or(0)
                    }
                };
                self.sliding_window.filter(|_| sliding)
            }
        }
    }

    /// Checks that the shape builds a model: sizes non-zero, heads dividing the
    /// hidden size, key/value heads dividing the heads, an even head width, the
    /// biases and windows the family allows.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_sizes()?;
        self.validate_heads()?;
        self.validate_numbers()?;
        self.validate_family()
    }

    fn validate_sizes(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be at least 1, got 0"));
            }
        }
        Ok(())
    }

    fn validate_heads(&self) -> Result<(), ConfigError> {
        let (heads, kv, hidden) = (
            self.num_attention_heads,
            self.num_key_value_heads,
            self.hidden_size,
        );
        if heads == 0 || hidden % heads != 0 {
            return Err(invalid(
                "num_attention_heads",
                format!("{heads} heads do not divide hidden_size {hidden}"),
            ));
        }
        if kv == 0 || heads % kv != 0 {
            return Err(invalid(
                "num_key_value_heads",
                format!("{kv} key/value heads do not divide the {heads} attention heads"),
            ));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return Err(invalid(
                "head_dim",
                format!(
                    "{} is not a positive even number: rope rotates pairs",
                    self.head_dim
                ),
            ));
        }
        Ok(())
    }

    fn validate_numbers(&self) -> Result<(), ConfigError> {
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.rms_norm_eps) {
            return Err(invalid(
                "rms_norm_eps",
                format!("{} is not positive", self.rms_norm_eps),
            ));
        }
        if !positive(self.rope_theta) {
            return Err(invalid(
                "rope_theta",
                format!("{} is not positive", self.rope_theta),
            ));
        }
        if !(self.initializer_range.is_finite() && self.initializer_range >= 0.0) {
            return Err(invalid(
                "initializer_range",
                format!("{} is not a standard deviation", self.initializer_range),
            ));
        }
        if self.hidden_act != "silu" {
            return Err(invalid(
                "hidden_act",
                format!(
                    "`{}` is not supported: the MLP is SwiGLU (`silu`)",
                    self.hidden_act
                ),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(invalid(
                "sliding_window",
                "a window of 0 tokens attends to nothing",
            ));
        }
        Ok(())
    }

    fn validate_family(&self) -> Result<(), ConfigError> {
        match self.model_type {
            ModelType::Llama => Ok(()),
            ModelType::Mistral if self.attention_bias || self.mlp_bias => Err(invalid(
                if self.attention_bias {
                    "attention_bias"
                } else {
                    "mlp_bias"
                },
                "Mistral has no biases",
            )),
            ModelType::Mistral => Ok(()),
            ModelType::Qwen2 if !self.attention_bias => Err(invalid(
                "attention_bias",
                "Qwen2's q/k/v projections always have biases",
            )),
            ModelType::Qwen2 if self.mlp_bias => {
                Err(invalid("mlp_bias", "Qwen2's MLP has no biases"))
            }
            ModelType::Qwen2 => self.validate_layer_types(),
        }
    }

    fn validate_layer_types(&self) -> Result<(), ConfigError> {
        let Some(types) = &self.layer_types else {
            return Ok(());
        };
        if types.len() != self.num_hidden_layers {
            return Err(invalid(
                "layer_types",
                format!(
                    "{} entries for {} layers",
                    types.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        match types.iter().find(|t| *t != SLIDING && *t != FULL) {
            Some(other) => Err(invalid(
                "layer_types",
                format!("`{other}` is neither `{FULL}` nor `{SLIDING}`"),
            )),
            None => Ok(()),
        }
    }
}

const SLIDING: &str = "sliding_attention";
const FULL: &str = "full_attention";

/// `config.json` as written, before defaults are resolved.
#[derive(Deserialize)]
struct RawConfig {
    model_type: ModelType,
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    #[serde(default = "default_hidden_act")]
    hidden_act: String,
    #[serde(default = "default_initializer_range")]
    initializer_range: f64,
    bos_token_id: Option<u32>,
    eos_token_id: Option<TokenIds>,
    #[serde(alias = "dtype")]
    torch_dtype: Option<String>,
    /// Missing (Hugging Face's default window) is not `null` (no window).
    #[serde(default, deserialize_with = "present")]
    sliding_window: Option<Option<usize>>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

fn default_hidden_act() -> String {
    "silu".to_string()
}

fn default_initializer_range() -> f64 {
    0.02
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<usize>>, D::Error> {
    Option::<usize>::deserialize(d).map(Some)
}

/// The rope base from `rope_theta` or transformers 5's `rope_parameters`; only the
/// default (unscaled) rope is implemented.
fn rope_theta(raw: &RawConfig) -> Result<f64, ConfigError> {
    for (field, value) in [
        ("rope_scaling", &raw.rope_scaling),
        ("rope_parameters", &raw.rope_parameters),
    ] {
        let Some(value) = value.as_ref().filter(|v| !v.is_null()) else {
            continue;
        };
        let kind = value
            .get("rope_type")
            .or_else(|| value.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" {
            return Err(invalid(
                field,
                format!("rope type `{kind}` is not supported (only the default rope)"),
            ));
        }
    }
    let nested = raw
        .rope_parameters
        .as_ref()
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64);
    Ok(raw.rope_theta.or(nested).unwrap_or(10_000.0))
}

/// `attention_bias` and `mlp_bias` where the file leaves them out: Qwen2's q/k/v
/// biases are part of the family; [`LlamaConfig::validate`] refuses a family's
/// impossible biases rather than silently dropping them.
fn biases(raw: &RawConfig) -> (bool, bool) {
    let qwen2 = raw.model_type == ModelType::Qwen2;
    (
        raw.attention_bias.unwrap_or(qwen2),
        raw.mlp_bias.unwrap_or(false),
    )
}

impl TryFrom<RawConfig> for LlamaConfig {
    type Error = ConfigError;

    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let theta = rope_theta(&raw)?;
        let (attention_bias, mlp_bias) = biases(&raw);
        let heads = raw.num_attention_heads;
        let mut extra = raw.extra;
        for (key, value) in [
            ("rope_scaling", raw.rope_scaling),
            ("rope_parameters", raw.rope_parameters),
        ] {
            if let Some(value) = value {
                extra.insert(key.to_string(), value);
            }
        }
        let sliding_window = match (raw.model_type, raw.sliding_window) {
            (_, Some(given)) => given,
            (ModelType::Llama, None) => None,
            (ModelType::Mistral | ModelType::Qwen2, None) => Some(4096),
        };
        let architectures = if raw.architectures.is_empty() {
            vec![raw.model_type.architecture().to_string()]
        } else {
            raw.architectures
        };
        let config = Self {
            model_type: raw.model_type,
            architectures,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(heads),
            head_dim: raw.head_dim.unwrap_or(raw.hidden_size / heads.max(1)),
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta: theta,
            max_position_embeddings: raw
                .max_position_embeddings
                .unwrap_or(raw.model_type.default_max_positions()),
            tie_word_embeddings: raw.tie_word_embeddings,
            attention_bias,
            mlp_bias,
            hidden_act: raw.hidden_act,
            initializer_range: raw.initializer_range,
            bos_token_id: raw.bos_token_id,
            eos_token_id: raw.eos_token_id,
            torch_dtype: raw.torch_dtype,
            sliding_window,
            use_sliding_window: raw.use_sliding_window,
            max_window_layers: raw.max_window_layers,
            layer_types: raw.layer_types,
            extra,
        };
        config.validate()?;
        Ok(config)
    }
}
