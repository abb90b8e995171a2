//! Models to train with adabatch, built on its differentiable ops (this crate's root, `adabatch::nn`) so
//! that every weight gets a gradient, under the weight names Hugging Face and
//! candle-transformers use.
//!
//! - [`llama`]: a Llama-family decoder (Llama, Mistral,
//!   Qwen2 shapes) for causal language modelling, with packed documents.

pub mod llama;
