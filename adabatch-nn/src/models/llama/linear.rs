//! Linear layers and embeddings initialised as Hugging Face initialises them, and
//! the named-tensor list they contribute to.

use candle_core::{Result, Tensor};
use candle_nn::{Embedding, Init, Linear, VarBuilder};

/// `[out, inp]` weights from normal(0, `std`) and zero biases, under `vb`'s
/// `weight` / `bias` (Hugging Face's `_init_weights` for `nn.Linear`). A
/// `VarBuilder` over saved weights ignores the initialisation and loads them.
pub(crate) fn linear(
    inp: usize,
    out: usize,
    bias: bool,
    std: f64,
    vb: VarBuilder,
) -> Result<Linear> {
    let weight = vb.get_with_hints((out, inp), "weight", normal(std))?;
    let bias = if bias {
        Some(vb.get_with_hints(out, "bias", Init::Const(0.0))?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

/// A `[vocab, hidden]` token embedding from normal(0, `std`) (candle-nn's
/// `embedding` draws from normal(0, 1), not what Hugging Face does).
pub(crate) fn embedding(
    vocab: usize,
    hidden: usize,
    std: f64,
    vb: VarBuilder,
) -> Result<Embedding> {
    let weight = vb.get_with_hints((vocab, hidden), "weight", normal(std))?;
    Ok(Embedding::new(weight, hidden))
}

fn normal(stdev: f64) -> Init {
    Init::Randn { mean: 0.0, stdev }
}

/// Appends `prefix.weight` (and `prefix.bias`) of `layer` to `out`.
pub(crate) fn push_linear(out: &mut Vec<(String, Tensor)>, prefix: &str, layer: &Linear) {
    out.push((format!("{prefix}.weight"), layer.weight().clone()));
    if let Some(bias) = layer.bias() {
        out.push((format!("{prefix}.bias"), bias.clone()));
    }
}
