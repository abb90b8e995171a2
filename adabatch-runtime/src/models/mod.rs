//! Models to train with adabatch, built on its differentiable ops (`crate::nn`) so
//! that every weight gets a gradient, under the weight names Hugging Face and
//! candle-transformers use.
//!
//! - [`llama`](crate::models::llama): a Llama-family decoder (Llama, Mistral,
//!   Qwen2 shapes) for causal language modelling, with packed documents.

pub mod llama;
