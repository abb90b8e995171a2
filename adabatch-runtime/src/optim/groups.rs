//! Parameter groups: which parameters train, and which decay.
//!
//! Hugging Face users freeze parameters (`requires_grad = False` on the embeddings,
//! or on all but the head) and exempt biases and norm weights from weight decay
//! (`Trainer.get_decay_parameter_names`). [`ParamGroups`] says both by name, with
//! the same regular-expression search on lower-cased names; an optimizer built
//! from it ([`AdamW::with_groups`](super::AdamW::with_groups),
//! [`Sgd::with_groups`](super::Sgd::with_groups)) holds only the trainable
//! parameters, saves the groups with its state and restores them on resume, and
//! the engine neither all-reduces nor checks the gradients of frozen ones.

use std::collections::{BTreeSet, HashSet};

use candle_core::Var;
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ModelError, Result};

/// Hugging Face's `forbidden_name_patterns` (biases and norms), plus `ln` layers
/// (`ln_1`, `ln_f`, `ln1`), which HF recognises by their `nn.LayerNorm` type and a
/// name cannot.
pub const NO_DECAY_PATTERNS: [&str; 6] = [
    r"bias",
    r"layernorm",
    r"rmsnorm",
    r"(?:^|\.)norm(?:$|\.)",
    r"_norm(?:$|\.)",
    r"(?:^|\.)ln(?:_?[a-z0-9]+)?\.",
];

/// The trainable and the frozen parameters of a model, and which trainable ones
/// decay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamGroups {
    /// Every parameter the model names, sorted.
    names: BTreeSet<String>,
    /// Names of parameters that do not train.
    frozen: BTreeSet<String>,
    /// Names of trainable parameters without weight decay.
    no_decay: BTreeSet<String>,
}

/// Compiles `pattern` for names lower-cased first, as HF matches them.
fn compile(pattern: &str, what: &'static str) -> Result<Regex> {
    Regex::new(pattern).map_err(|e| {
        Error::Model(ModelError::ParameterPattern {
            pattern: pattern.into(),
            what,
            detail: "not a regular expression".into(),
            source: Some(e.into()),
        })
    })
}

impl ParamGroups {
    /// Every parameter of `named` trains; biases and norm weights
    /// (`NO_DECAY_PATTERNS`: biases and norm weights) do not decay, as in Hugging Face's Trainer.
    pub fn new(named: &[(String, Var)]) -> Self {
        let names: BTreeSet<String> = named.iter().map(|(n, _)| n.clone()).collect();
        let patterns: Vec<Regex> = NO_DECAY_PATTERNS
            .iter()
            .map(|p| Regex::new(p).expect("the default patterns compile"))
            .collect();
        let no_decay = names
            .iter()
            .filter(|n| patterns.iter().any(|p| p.is_match(&n.to_lowercase())))
            .cloned()
            .collect();
        Self {
            names,
            frozen: BTreeSet::new(),
            no_decay,
        }
    }

    /// Every parameter trains and decays (PyTorch's single group).
    pub fn decay_all(mut self) -> Self {
        self.no_decay.clear();
        self
    }

    /// The names `pattern` finds (a regular expression searched in each
    /// lower-cased name); an error when it finds none.
    fn matching(&self, pattern: &str, what: &'static str) -> Result<Vec<String>> {
        let regex = compile(pattern, what)?;
        let found: Vec<String> = (self.names.iter())
            .filter(|n| regex.is_match(&n.to_lowercase()))
            .cloned()
            .collect();
        if found.is_empty() {
            return Err(Error::Model(ModelError::ParameterPattern {
                pattern: pattern.into(),
                what,
                detail: format!(
                    "matches none of the model's {} parameters (e.g. {})",
                    self.names.len(),
                    self.names
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                source: None,
            }));
        }
        Ok(found)
    }

    /// Freezes the parameters whose names `pattern` finds (e.g.
    /// `^model\.embed_tokens\.`); an error when it finds none.
    pub fn freeze(mut self, pattern: &str) -> Result<Self> {
        for name in self.matching(pattern, "freeze")? {
            self.no_decay.remove(&name);
            self.frozen.insert(name);
        }
        Ok(self)
    }

    /// Freezes every parameter except those `pattern` finds (e.g. `^lm_head\.`:
    /// train only the head).
    pub fn train_only(mut self, pattern: &str) -> Result<Self> {
        let keep: BTreeSet<String> = self.matching(pattern, "train_only")?.into_iter().collect();
        let frozen: Vec<String> = self.names.difference(&keep).cloned().collect();
        for name in frozen {
            self.no_decay.remove(&name);
            self.frozen.insert(name);
        }
        Ok(self)
    }

    /// No weight decay for the trainable parameters `pattern` finds.
    pub fn no_decay(mut self, pattern: &str) -> Result<Self> {
        for name in self.matching(pattern, "no_decay")? {
            if !self.frozen.contains(&name) {
                self.no_decay.insert(name);
            }
        }
        Ok(self)
    }

    /// Weight decay again for the parameters `pattern` finds.
    pub fn decay(mut self, pattern: &str) -> Result<Self> {
        for name in self.matching(pattern, "decay")? {
            self.no_decay.remove(&name);
        }
        Ok(self)
    }

    /// Whether `name` is frozen.
    pub fn is_frozen(&self, name: &str) -> bool {
        self.frozen.contains(name)
    }

    /// Whether `name` trains without weight decay.
    pub fn is_no_decay(&self, name: &str) -> bool {
        self.no_decay.contains(name)
    }

    /// The frozen names, sorted.
    pub fn frozen(&self) -> impl Iterator<Item = &str> {
        self.frozen.iter().map(String::as_str)
    }

    /// The trainable names without weight decay, sorted.
    pub fn no_decay_names(&self) -> impl Iterator<Item = &str> {
        self.no_decay.iter().map(String::as_str)
    }

    /// The trainable parameters of `named` with whether each decays.
    pub fn trainable(&self, named: &[(String, Var)]) -> Vec<(String, Var, bool)> {
        named
            .iter()
            .filter(|(n, _)| !self.frozen.contains(n))
            .map(|(n, v)| (n.clone(), v.clone(), !self.no_decay.contains(n)))
            .collect()
    }
}

/// What an optimizer holds, for the engine's checks before the first step.
#[derive(Debug, Clone)]
pub struct HeldParameters {
    /// The variables it updates.
    pub vars: Vec<Var>,
    /// Names declared frozen (the model names them; the optimizer skips them).
    pub frozen: Vec<String>,
}

impl HeldParameters {
    /// The parameters of `params` (the model's) that train: an error when the
    /// optimizer holds a variable the model does not name, or when a parameter
    /// the model names is neither held nor declared frozen (non-float variables,
    /// which no optimizer updates, aside).
    pub fn trainable(&self, params: &[(String, Var)]) -> Result<Vec<(String, Var)>> {
        let named: HashSet<_> = params.iter().map(|(_, v)| v.as_tensor().id()).collect();
        let strangers: Vec<Vec<usize>> = (self.vars.iter())
            .filter(|v| !named.contains(&v.as_tensor().id()))
            .map(|v| v.dims().to_vec())
            .collect();
        if !strangers.is_empty() {
            return Err(Error::Model(ModelError::OptimizerParameterNotNamed {
                count: strangers.len(),
                shapes: strangers,
            }));
        }
        let held: HashSet<_> = self.vars.iter().map(|v| v.as_tensor().id()).collect();
        let frozen: BTreeSet<&str> = self.frozen.iter().map(String::as_str).collect();
        let mut trainable = Vec::new();
        let mut orphans = Vec::new();
        for (name, var) in params {
            if held.contains(&var.as_tensor().id()) {
                trainable.push((name.clone(), var.clone()));
            } else if !frozen.contains(name.as_str()) && var.dtype().is_float() {
                orphans.push(name.clone());
            }
        }
        if !orphans.is_empty() {
            return Err(Error::Model(ModelError::ParametersNotInOptimizer {
                names: orphans,
            }));
        }
        Ok(trainable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn named(names: &[&str]) -> Vec<(String, Var)> {
        names
            .iter()
            .map(|n| {
                let v = Var::zeros(2, DType::F32, &Device::Cpu).unwrap();
                (n.to_string(), v)
            })
            .collect()
    }

    const LLAMA: [&str; 8] = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.q_proj.weight",
        "model.norm.weight",
        "model.layers.0.mlp.down_proj.weight",
    ];

    #[test]
    fn hugging_face_no_decay_names() {
        let groups = ParamGroups::new(&named(&LLAMA));
        let no_decay: Vec<&str> = groups.no_decay_names().collect();
        assert_eq!(
            no_decay,
            [
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.post_attention_layernorm.weight",
                "model.layers.0.self_attn.q_proj.bias",
                "model.norm.weight",
            ]
        );
        // GPT-2 style names and a name that only looks alike.
        let gpt = ParamGroups::new(&named(&["h.0.ln_1.weight", "ln_f.weight", "linear.weight"]));
        let no_decay: Vec<&str> = gpt.no_decay_names().collect();
        assert_eq!(no_decay, ["h.0.ln_1.weight", "ln_f.weight"]);
        assert!(ParamGroups::new(&named(&LLAMA))
            .decay_all()
            .no_decay_names()
            .next()
            .is_none());
    }

    #[test]
    fn freeze_and_train_only() -> Result<()> {
        let params = named(&LLAMA);
        let groups = ParamGroups::new(&params).freeze(r"^model\.embed_tokens\.")?;
        assert!(groups.is_frozen("model.embed_tokens.weight"));
        assert_eq!(groups.trainable(&params).len(), LLAMA.len() - 1);
        let head = ParamGroups::new(&params).train_only(r"^lm_head\.")?;
        let trainable: Vec<String> = head.trainable(&params).into_iter().map(|t| t.0).collect();
        assert_eq!(trainable, ["lm_head.weight"]);
        // A frozen norm is not also listed as a no-decay trainable one.
        assert!(!head.is_no_decay("model.norm.weight"));
        Ok(())
    }

    #[test]
    fn held_parameters_must_be_the_models() -> Result<()> {
        let params = named(&LLAMA);
        let groups = ParamGroups::new(&params).freeze("embed")?;
        let held = HeldParameters {
            vars: groups.trainable(&params).into_iter().map(|t| t.1).collect(),
            frozen: groups.frozen().map(String::from).collect(),
        };
        assert_eq!(held.trainable(&params)?.len(), LLAMA.len() - 1);
        // Not declared frozen: the optimizer simply lacks it.
        let undeclared = HeldParameters {
            frozen: Vec::new(),
            ..held.clone()
        };
        let err = undeclared.trainable(&params).unwrap_err();
        assert!(
            matches!(&err, Error::Model(ModelError::ParametersNotInOptimizer { names }) if names == &["model.embed_tokens.weight"]),
            "{err}"
        );
        // A variable the model does not name.
        let mut stranger = held.clone();
        stranger
            .vars
            .push(Var::zeros((3, 4), DType::F32, &Device::Cpu)?);
        let err = stranger.trainable(&params).unwrap_err();
        assert!(err.to_string().contains("holds 1 variable(s) the model's `named_parameters` does not name (shapes [[3, 4]])"), "{err}");
        Ok(())
    }

    #[test]
    fn a_pattern_that_matches_nothing_or_does_not_parse_is_an_error() {
        let groups = ParamGroups::new(&named(&LLAMA));
        let err = groups.clone().freeze("^encoder\\.").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("`^encoder\\.` (freeze): matches none of the model's 8 parameters"),
            "{text}"
        );
        let err = groups.no_decay("(").unwrap_err();
        assert!(
            err.to_string().contains("not a regular expression"),
            "{err}"
        );
    }
}
