//! A trainable Llama-family decoder: the Llama, Mistral and Qwen2 shapes from one
//! [`LlamaConfig`] (Hugging Face's `config.json`), grouped-query attention, rotary
//! positions (`rope_theta`, transformers' half-split layout), a SwiGLU MLP, RMS
//! norms, tied or untied embeddings, optional biases.
//!
//! ```
//! # use adabatch_nn as adabatch;
//! use adabatch::models::llama::{Llama, LlamaConfig, ModelType};
//! use adabatch::Parameters;
//! use candle_core::{DType, Device, Tensor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // vocabulary 256, hidden 64, MLP 128, 2 layers, 4 heads sharing 2 key/value heads
//! let config = LlamaConfig::new(ModelType::Llama, 256, 64, 128, 2, 4, 2);
//! let params = Parameters::new(42); // seeded weights, initialised as transformers does
//! let model = Llama::new(&config, params.var_builder(DType::F32, &Device::Cpu))?;
//! let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu)?;
//! assert_eq!(model.forward(&ids)?.dims(), [1, 4, 256]);
//! // Two documents packed in one row: positions restart, attention stays inside each.
//! let documents = Tensor::new(&[[0u32, 0, 1, 1]], &Device::Cpu)?;
//! let packed = model.forward_packed(&ids, None, Some(&documents))?;
//! // config.json, for transformers and candle-transformers
//! config.save(std::env::temp_dir().join("adabatch-llama-doc"))?;
//! # Ok(()) }
//! ```
//!
//! The weights are the `Parameters` store's variables: hand
//! `params.all_vars()` to the optimizer and return `params.named_parameters()` (or
//! [`Llama::named_parameters`]) from `TrainModel::named_parameters`.
//! [`Llama::named_tensors`] lists them under their Hugging Face names, for
//! `candle_core::safetensors::save`; a directory with that `model.safetensors` and
//! the `config.json` loads into transformers' `LlamaForCausalLM` (and its Mistral
//! and Qwen2 classes) and candle-transformers' models.
//!
//! Files, from the bottom up: `config` (the configuration and its checks),
//! `linear` (layers initialised as transformers does), `rms_norm`, `mlp`, `attention`, `layer` (one decoder layer), `decoder` ([`Llama`]), `generate`
//! (greedy and temperature sampling). The rotary angles and the causal,
//! sliding-window and document masks are [`crate`]'s (`adabatch::nn`), public for models of
//! your own.

mod attention;
mod config;
mod decoder;
mod generate;
mod layer;
mod linear;
mod mlp;
mod rms_norm;
#[cfg(test)]
mod tests;

pub use config::{ConfigError, LlamaConfig, ModelType, TokenIds};
pub use decoder::Llama;
pub use generate::{Sampling, generate};
