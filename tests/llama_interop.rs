//! Weights trained by `adabatch::models::llama` load into candle-transformers'
//! models with the same logits: a few AdamW steps on a tiny model, then its
//! `model.safetensors` (candle's `safetensors::save` of the named tensors) and
//! `config.json` (written by `LlamaConfig::save`) are read by candle-transformers'
//! `llama` (MHA untied; grouped-query tied), `qwen2` (q/k/v biases) and `mistral`
//! (a head width apart from hidden / heads). Its own binary: candle-transformers is
//! a build of its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use adabatch::candle_core::{safetensors, DType, Device, IndexOp, Result, Tensor};
use adabatch::candle_nn::{Optimizer, VarBuilder};
use adabatch::models::llama::{Llama, LlamaConfig, ModelType};
use adabatch::{AdamW, Parameters, ParamsAdamW};
use candle_transformers::models::{llama, mistral, qwen2};

const VOCAB: usize = 64;
const STEPS: usize = 4;

fn tokens() -> Result<Tensor> {
    let rows: Vec<u32> = (0..3 * 9).map(|i| (i * 37 + 11) % VOCAB as u32).collect();
    Tensor::from_vec(rows, (3, 9), &Device::Cpu)
}

/// `STEPS` AdamW steps of next-token cross-entropy on `tokens()`.
fn trained(config: &LlamaConfig) -> Result<Llama> {
    let params = Parameters::new(17);
    let model = Llama::new(config, params.var_builder(DType::F32, &Device::Cpu))?;
    let hyper = ParamsAdamW {
        lr: 1e-2,
        ..ParamsAdamW::default()
    };
    let mut opt = AdamW::new(params.all_vars(), hyper).map_err(|e| candle_core_msg(&e))?;
    let ids = tokens()?;
    let (b, t) = ids.dims2()?;
    for _ in 0..STEPS {
        let logits = model.forward(&ids)?.narrow(1, 0, t - 1)?;
        let targets = ids.narrow(1, 1, t - 1)?.flatten_all()?;
        let loss = adabatch::candle_nn::loss::cross_entropy(
            &logits.reshape((b * (t - 1), VOCAB))?,
            &targets,
        )?;
        opt.step(&loss.backward()?)?;
    }
    Ok(model)
}

fn candle_core_msg(e: &adabatch::Error) -> adabatch::candle_core::Error {
    adabatch::candle_core::Error::Msg(e.to_string())
}

/// `model.safetensors` + `config.json` in a fresh directory.
fn export(model: &Llama, name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("adabatch-interop-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tensors: HashMap<String, Tensor> = model.named_tensors().into_iter().collect();
    safetensors::save(&tensors, dir.join("model.safetensors"))?;
    model.config().save(&dir)?;
    Ok(dir)
}

/// The `config.json` we wrote (each test parses it as candle-transformers' own
/// config type).
fn config_text(dir: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(dir.join("config.json"))?)
}

fn json_error(e: serde_json::Error) -> adabatch::candle_core::Error {
    adabatch::candle_core::Error::Msg(e.to_string())
}

fn weights(dir: &Path) -> Result<VarBuilder<'static>> {
    // SAFETY: the file was written above and nothing modifies it while mapped.
    unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
    }
}

/// Our logits at the last position, `[b, vocab]`.
fn last_logits(model: &Llama) -> Result<Tensor> {
    let logits = model.forward(&tokens()?)?;
    let t = logits.dim(1)?;
    logits.i((.., t - 1, ..))?.contiguous()
}

fn assert_close(ours: &Tensor, theirs: &Tensor, what: &str) -> Result<()> {
    let theirs = theirs.reshape(ours.shape())?;
    let diff = (ours - theirs)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let scale = ours.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    println!("{what}: max |adabatch - candle-transformers| = {diff:.2e} (logits up to {scale:.2})");
    assert!(diff < 1e-5, "{what}: logits differ by {diff}");
    Ok(())
}

fn check_llama(config: &LlamaConfig, name: &str) -> Result<()> {
    let model = trained(config)?;
    let dir = export(&model, name)?;
    let theirs_config: llama::LlamaConfig =
        serde_json::from_str(&config_text(&dir)?).map_err(json_error)?;
    let theirs_config = theirs_config.into_config(false);
    let theirs = llama::Llama::load(weights(&dir)?, &theirs_config)?;
    let mut cache = llama::Cache::new(false, DType::F32, &theirs_config, &Device::Cpu)?;
    let logits = theirs.forward(&tokens()?, 0, &mut cache)?;
    assert_close(&last_logits(&model)?, &logits, name)?;
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

#[test]
fn llama_multi_head_untied_loads_into_candle_transformers() -> Result<()> {
    check_llama(
        &LlamaConfig::new(ModelType::Llama, VOCAB, 32, 48, 2, 4, 4),
        "llama-mha",
    )
}

#[test]
fn llama_grouped_query_tied_loads_into_candle_transformers() -> Result<()> {
    let mut config = LlamaConfig::new(ModelType::Llama, VOCAB, 32, 48, 2, 4, 2);
    config.tie_word_embeddings = true;
    config.rope_theta = 500_000.0;
    check_llama(&config, "llama-gqa-tied")
}

#[test]
fn qwen2_with_biases_loads_into_candle_transformers() -> Result<()> {
    let mut config = LlamaConfig::new(ModelType::Qwen2, VOCAB, 32, 48, 2, 4, 2);
    config.tie_word_embeddings = true;
    let model = trained(&config)?;
    let dir = export(&model, "qwen2")?;
    let theirs_config: qwen2::Config =
        serde_json::from_str(&config_text(&dir)?).map_err(json_error)?;
    let mut theirs = qwen2::ModelForCausalLM::new(&theirs_config, weights(&dir)?)?;
    let logits = theirs.forward(&tokens()?, 0)?;
    assert_close(&last_logits(&model)?, &logits, "qwen2")?;
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

#[test]
fn mistral_with_its_own_head_width_loads_into_candle_transformers() -> Result<()> {
    let mut config = LlamaConfig::new(ModelType::Mistral, VOCAB, 32, 48, 2, 4, 2);
    // Heads of 16 (not 32 / 4): q_proj is [64, 32], o_proj [32, 64].
    config.head_dim = 16;
    // candle-transformers' window admits one key more than transformers'
    // (`j + w < i` masked vs `i - j < w` kept): leave it out of this comparison.
    config.sliding_window = None;
    let model = trained(&config)?;
    let dir = export(&model, "mistral")?;
    let theirs_config: mistral::Config =
        serde_json::from_str(&config_text(&dir)?).map_err(json_error)?;
    let mut theirs = mistral::Model::new(&theirs_config, weights(&dir)?)?;
    let logits = theirs.forward(&tokens()?, 0)?;
    assert_close(&last_logits(&model)?, &logits, "mistral")?;
    std::fs::remove_dir_all(dir)?;
    Ok(())
}
