//! The model, its parameters, its optimizer and the weights it loads.

use std::path::PathBuf;

use super::Cause;

/// The model, its parameters, its optimizer and the weights it loads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A model configuration (`config.json`) that cannot build the model, or
    /// cannot be read or written.
    #[error(transparent)]
    Config(#[from] adabatch_nn::models::llama::ConfigError),
    /// `--bf16` / `--fp16` was given but the model never cast anything with
    /// `adabatch::autocast`: it would train in f32 unknowingly.
    #[error("{flag} was given, but the model's per_example_loss never called `adabatch::autocast` (or `autocast_linear`): it computes in f32. Cast its weights and inputs with them, or drop {flag}")]
    AutocastUnused {
        /// The flag given.
        flag: &'static str,
    },
    /// `named_parameters` returned a name twice.
    #[error("parameter name `{name}` appears twice in named_parameters")]
    DuplicateParameter {
        /// The repeated name.
        name: String,
    },
    /// The model returned losses of the wrong shape.
    #[error("per_example_loss returned shape {shape:?} for a batch of {examples} examples; expected [{examples}]")]
    LossShape {
        /// Returned shape.
        shape: Vec<usize>,
        /// Examples in the batch.
        examples: usize,
    },
    /// The model has no trainable parameters.
    #[error("the model has no trainable parameters: `named_parameters` returned nothing")]
    NoParameters,
    /// The optimizer's first update changed none of the model's parameters: it
    /// holds other variables (e.g. built from `params.all_vars()` before the model
    /// created its own).
    #[error("the optimizer's first update changed none of the model's {parameters} parameters with a gradient: build it from the model's variables after the model (e.g. `AdamW::new(params.all_vars(), ..)` after `Model::new(params.var_builder(..))`)")]
    OptimizerUpdatesNothing {
        /// Parameters that had a gradient.
        parameters: usize,
    },
    /// The optimizer's first update left some parameters with a gradient unchanged.
    #[error("the optimizer does not update these parameters, though they have gradients: {names:?} (build the optimizer from all of the model's variables)")]
    ParametersNotUpdated {
        /// Their names.
        names: Vec<String>,
    },
    /// After the first step (or the first after a resume), parameters the model
    /// names received no gradient on any rank: their gradient path is cut (a
    /// candle-nn fused op without a backward, a detached tensor, an unused layer).
    #[error("{} of the model's parameters received no gradient on any rank in the first step: {}. Their gradient path is cut: candle-nn's fused `ops::rms_norm`, `ops::layer_norm`, `ops::softmax_last_dim` and `rotary_emb::rope*` (and the `RmsNorm`/`LayerNorm` modules built on them) have no backward; use `adabatch::nn`'s versions (docs/porting.md). Parameters frozen on purpose are declared with `ParamGroups::freeze`", names.len(), names.join(", "))]
    ParametersWithoutGradient {
        /// Their names.
        names: Vec<String>,
    },
    /// The optimizer holds variables the model does not name.
    #[error("the optimizer holds {count} variable(s) the model's `named_parameters` does not name (shapes {shapes:?}): add them to `named_parameters`, or build the optimizer from the model's parameters only")]
    OptimizerParameterNotNamed {
        /// How many.
        count: usize,
        /// Their shapes.
        shapes: Vec<Vec<usize>>,
    },
    /// The model names parameters the optimizer neither holds nor was told are
    /// frozen.
    #[error("the optimizer does not hold these parameters of the model and they are not declared frozen: {}; build the optimizer from all of them, or freeze them with `ParamGroups::freeze`", names.join(", "))]
    ParametersNotInOptimizer {
        /// Their names.
        names: Vec<String>,
    },
    /// A parameter-group pattern is not a valid regular expression (the regex
    /// error is the source), or matches no parameter.
    #[error("parameter pattern `{pattern}` ({what}): {detail}")]
    ParameterPattern {
        /// The pattern.
        pattern: String,
        /// What it was for (`freeze`, `no_decay`, ...).
        what: &'static str,
        /// What is wrong.
        detail: String,
        /// The underlying error.
        #[source]
        source: Option<Cause>,
    },
    /// A weights file could not be read or written; the error that stopped it
    /// (I/O, JSON, safetensors, candle), if any, is the source.
    #[error("weights {}: {detail}", path.display())]
    WeightsFile {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong, or what could not be done.
        detail: String,
        /// The underlying error.
        #[source]
        source: Option<Cause>,
    },
    /// Weights that come in (`--init-from`, `load_pretrained`) hold NaN or
    /// infinite values: training from them would diverge at once.
    #[error("weights {}: {} tensor(s) hold NaN or infinite values ({}); nothing was loaded", path.display(), tensors.len(), tensors.join(", "))]
    NonFiniteInitWeights {
        /// The file or directory.
        path: PathBuf,
        /// Each offending tensor with its count of non-finite values.
        tensors: Vec<String>,
    },
    /// A strict load of weights found names that do not fit the model.
    #[error("weights {} do not fit the model: {}", path.display(), mismatch_text(missing, unexpected, shapes))]
    WeightsMismatch {
        /// The file.
        path: PathBuf,
        /// Parameters of the model the file lacks.
        missing: Vec<String>,
        /// Tensors of the file the model does not have.
        unexpected: Vec<String>,
        /// `(name, file shape, model shape)` of the tensors whose shapes differ.
        shapes: Vec<(String, Vec<usize>, Vec<usize>)>,
    },
    /// `TrainModel::eval_metrics` answered something the engine cannot average.
    #[error("eval metrics: {detail}")]
    EvalMetric {
        /// What is wrong.
        detail: String,
    },
}

/// What a strict load found wrong, one clause per kind.
fn mismatch_text(
    missing: &[String],
    unexpected: &[String],
    shapes: &[(String, Vec<usize>, Vec<usize>)],
) -> String {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing {}", missing.join(", ")));
    }
    if !unexpected.is_empty() {
        parts.push(format!("unexpected {}", unexpected.join(", ")));
    }
    for (name, file, model) in shapes {
        parts.push(format!(
            "`{name}` is {file:?} in the file, {model:?} in the model"
        ));
    }
    parts.push("(load non-strictly to skip what does not fit)".into());
    parts.join("; ")
}
