//! Attention over packed rows: which tokens a token may attend to (earlier tokens,
//! within a sliding window if any, of its own document) and the positions that
//! restart at every document of a row.
//!
//! A packed batch puts several documents in one row. A causal mask built once for
//! `t` tokens lets a document attend to the end of the one before it, and positions
//! `0..t` give its tokens the wrong rotary angles: the model then trains on
//! something other than each document alone, without any error. Build both per
//! batch from the document ids ([`attention_bias`], [`positions_in_documents`]),
//! as [`Llama`](crate::models::llama::Llama) does.
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::{attention_bias, positions_in_documents};
//! use candle_core::{DType, Device, Tensor};
//!
//! # fn main() -> candle_core::Result<()> {
//! // One row holding a document of 3 tokens, then one of 2.
//! let documents = Tensor::new(&[[7u32, 7, 7, 2, 2]], &Device::Cpu)?;
//! let positions = positions_in_documents(&documents)?;
//! assert_eq!(positions.to_vec2::<u32>()?, [[0, 1, 2, 0, 1]]);
//! let bias = attention_bias(5, Some(&documents), None, DType::F32, &Device::Cpu)?;
//! let allowed = bias.squeeze(0)?.to_vec2::<f32>()?;
//! assert_eq!(allowed[3], [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
//! assert_eq!(allowed[2], [0.0, 0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
//! # Ok(()) }
//! ```

use candle_core::{DType, Device, Result, Tensor};

/// Positions `[b, t]` (u32) that count from 0 in every document of each row:
/// a document is a run of equal ids in `document_ids` `[b, t]` (any integer dtype).
/// `[[7, 7, 7, 2, 2]]` gives `[[0, 1, 2, 0, 1]]`, what running each document alone
/// would give.
pub fn positions_in_documents(document_ids: &Tensor) -> Result<Tensor> {
    let (b, t) = document_ids.dims2()?;
    let rows = document_ids.to_dtype(DType::I64)?.to_vec2::<i64>()?;
    let mut positions = Vec::with_capacity(b * t);
    for row in &rows {
        let mut position = 0u32;
        for (i, id) in row.iter().enumerate() {
            position = if i > 0 && row[i - 1] == *id {
                position + 1
            } else {
                0
            };
            positions.push(position);
        }
    }
    Tensor::from_vec(positions, (b, t), document_ids.device())
}

/// The additive attention bias of a forward, `[b, t, t]` with `document_ids`
/// `[b, t]`, else `[1, t, t]`: 0 where query `i` may attend key `j`, −∞ elsewhere.
/// Allowed: `j ≤ i`, `i − j < window` (Hugging Face's sliding window), and with
/// `document_ids`, `j` in `i`'s document (equal ids, as transformers' packed
/// sequences). The diagonal is always allowed, so no row is all −∞.
///
/// Add it to the scores `q·kᵀ/√d` (`[b, heads, t, t]`: unsqueeze the heads axis)
/// before the softmax. It is a plain tensor: no gradient flows into it.
pub fn attention_bias(
    t: usize,
    document_ids: Option<&Tensor>,
    window: Option<usize>,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let window = window.unwrap_or(usize::MAX);
    let allowed: Vec<u8> = (0..t)
        .flat_map(|i| (0..t).map(move |j| u8::from(j <= i && i - j < window)))
        .collect();
    let allowed = Tensor::from_vec(allowed, (1, t, t), device)?;
    let allowed = match document_ids {
        None => allowed,
        Some(ids) => {
            let same = ids.unsqueeze(2)?.broadcast_eq(&ids.unsqueeze(1)?)?;
            same.broadcast_mul(&allowed)?
        }
    };
    let zero = Tensor::zeros((), dtype, device)?.broadcast_as(allowed.shape())?;
    let blocked = Tensor::new(f32::NEG_INFINITY, device)?
        .to_dtype(dtype)?
        .broadcast_as(allowed.shape())?;
    allowed.where_cond(&zero, &blocked)
}
