//! The Rust side of `benches/compare/llama/run.sh`: adabatch's Llama against
//! transformers' `LlamaForCausalLM` on the same weights, batches and optimizer.
//!
//! For each of two configs (`llama_mha`: multi-head, untied; `llama_gqa_tied`:
//! grouped-query, tied embeddings) it builds the seeded model, exports its
//! initial weights (`init/model.safetensors` + `init/config.json`), the token
//! batches (`batches.safetensors`, bytes of the English corpus of `data/`) and the
//! initial model's logits on the first batch, then
//!
//! - trains `STEPS` AdamW steps through adabatch's engine (`#[adaptive_trainer]`,
//!   constant batch of `BATCH` rows of `SEQ` byte tokens, no shuffling, the mean
//!   next-token cross-entropy over the step's tokens: `reweight = token_count`)
//!   and writes the step losses (`losses.json`);
//! - replays the same steps in a plain loop (forward, backward, `AdamW::step`),
//!   checks its losses against the engine's, and times every step of it
//!   (`rust_timing.json`): the time of a training step on one thread, wall clock
//!   and the process's CPU time (robust to other processes on a shared machine).
//!
//! Before that it exports tiny trained Llama (with biases), Mistral (own head
//! width, sliding window) and Qwen2 models with their logits, plain and packed
//! (`families/`), which the Python side loads with transformers' Auto classes.
//!
//! AdamW: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on every
//! parameter (PyTorch's `AdamW(model.parameters())` does the same).
//!
//! ```text
//! LLAMA_COMPARE_EXPORT=DIR RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1 \
//!   cargo bench -p adabatch-benches --bench llama_compare
//! ```
//!
//! `LLAMA_COMPARE_EXPORT` is required (run.sh sets it); `LLAMA_COMPARE_TIMED`
//! sets how many timed steps follow the `STEPS` (default 30).

#[path = "support/corpus.rs"]
mod corpus;
#[path = "support/cpu_time.rs"]
mod cpu_time;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use adabatch::candle_core::{safetensors, DType, Device, Result, Tensor, Var};
use adabatch::candle_nn::Optimizer;
use adabatch::models::llama::{Llama, LlamaConfig, ModelType};
use adabatch::per_example_token_cross_entropy_sum;
use adabatch::prelude::*;

const VOCAB: usize = 256;
const SEQ: usize = 64;
const BATCH: usize = 8;
const STEPS: usize = 50;
const SEED: u64 = 2026;
const LR: f64 = 1e-3;

fn hyper() -> ParamsAdamW {
    ParamsAdamW {
        lr: LR,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    }
}

/// The two configurations: 4 layers of width 128, byte vocabulary.
fn cases() -> Vec<(&'static str, LlamaConfig)> {
    let mha = LlamaConfig::new(ModelType::Llama, VOCAB, 128, 352, 4, 4, 4);
    let mut gqa = LlamaConfig::new(ModelType::Llama, VOCAB, 128, 352, 4, 8, 2);
    gqa.tie_word_embeddings = true;
    gqa.rope_theta = 500_000.0;
    gqa.rms_norm_eps = 1e-5;
    vec![("llama_mha", mha), ("llama_gqa_tied", gqa)]
}

/// `STEPS · BATCH` rows of `SEQ` byte tokens: the corpus's lines joined by
/// newlines, cut in consecutive pieces.
fn rows() -> Vec<Vec<u32>> {
    let text = corpus::english_sentences().into_bytes();
    text.chunks_exact(SEQ)
        .take(STEPS * BATCH)
        .map(|row| row.iter().map(|&b| u32::from(b)).collect())
        .collect()
}

/// A batch of rows `[b, SEQ]`: every token but the last predicts the next.
struct Rows {
    ids: Tensor,
}

impl Batch for Rows {
    fn num_examples(&self) -> usize {
        self.ids.dims()[0]
    }
    fn num_tokens(&self) -> usize {
        self.num_examples() * (SEQ - 1)
    }
}

fn collate(items: &[Vec<u32>], device: &Device) -> Result<Rows> {
    let flat: Vec<u32> = items.concat();
    Ok(Rows {
        ids: Tensor::from_vec(flat, (items.len(), SEQ), device)?,
    })
}

/// The model with its parameter store.
struct Lm {
    model: Llama,
    params: Parameters,
}

impl Lm {
    fn new(config: &LlamaConfig) -> Result<Self> {
        let params = Parameters::new(SEED);
        let model = Llama::new(config, params.var_builder(DType::F32, &Device::Cpu))?;
        Ok(Self { model, params })
    }

    /// Next-token cross-entropy summed over each row's `SEQ - 1` targets.
    fn row_losses(&self, ids: &Tensor) -> Result<Tensor> {
        let logits = self.model.forward(&ids.narrow(1, 0, SEQ - 1)?)?;
        let targets = ids.narrow(1, 1, SEQ - 1)?.contiguous()?;
        let mask = Tensor::ones(targets.dims(), DType::F32, ids.device())?;
        per_example_token_cross_entropy_sum(&logits, &targets, &mask)
    }
}

impl TrainModel for Lm {
    type Batch = Rows;

    fn per_example_loss(&self, batch: &Rows) -> Result<Tensor> {
        self.row_losses(&batch.ids)
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

#[adaptive_trainer(schedule = constant, shuffle = false, reweight = token_count, seed = 2026)]
struct LmTrainer {
    #[model]
    model: Lm,
    #[optimizer]
    opt: AdamW,
}

fn fresh(config: &LlamaConfig) -> LmTrainer {
    let model = Lm::new(config).expect("build the model");
    let opt = AdamW::new(model.params.all_vars(), hyper()).expect("build AdamW");
    LmTrainer::new(model, opt)
}

fn save(tensors: Vec<(String, Tensor)>, path: &Path) {
    let map: HashMap<String, Tensor> = tensors.into_iter().collect();
    safetensors::save(&map, path).expect("write safetensors");
}

fn write_json(path: &Path, value: &serde_json::Value) {
    std::fs::write(
        path,
        serde_json::to_string_pretty(value).expect("json") + "\n",
    )
    .expect("write json");
}

/// Initial weights, config, batches and the first batch's initial logits.
fn export_inputs(dir: &Path, config: &LlamaConfig, data: &[Vec<u32>]) -> Result<()> {
    let lm = Lm::new(config)?;
    std::fs::create_dir_all(dir.join("init"))?;
    save(
        lm.model.named_tensors(),
        &dir.join("init/model.safetensors"),
    );
    config.save(dir.join("init")).expect("write config.json");
    let all = Tensor::from_vec(data.concat(), (STEPS, BATCH, SEQ), &Device::Cpu)?;
    let first = all.get(0)?;
    save(
        vec![
            ("batches".to_string(), all.to_dtype(DType::I64)?),
            ("initial_logits".to_string(), lm.model.forward(&first)?),
        ],
        &dir.join("batches.safetensors"),
    );
    Ok(())
}

/// `STEPS` steps through the engine; returns the step losses.
fn engine_losses(config: &LlamaConfig, data: &[Vec<u32>]) -> adabatch::Result<(Vec<f64>, f64)> {
    let args = {
        let mut args = TrainingArgs::default();
        args.length.num_train_epochs = 1;
        args.length.max_steps = Some(STEPS);
        args.batch.per_device_train_batch_size = BATCH;
        args.lr.learning_rate = LR;
        args.logging.quiet = true;
        args.logging.logging_steps = usize::MAX;
        args
    };
    let mut trainer = fresh(config);
    let start = Instant::now();
    let summary = trainer.train(data, &collate, &args)?;
    Ok((summary.step_losses, start.elapsed().as_secs_f64()))
}

/// One plain training step; returns the loss.
fn hand_step(trainer: &mut LmTrainer, ids: &Tensor) -> Result<f32> {
    let (lm, opt) = trainer.parts();
    let tokens = (ids.dims()[0] * (SEQ - 1)) as f64;
    let loss = (lm.row_losses(ids)?.sum_all()? / tokens)?;
    opt.step(&loss.backward()?)?;
    loss.to_scalar::<f32>()
}

/// CPU seconds of this process (every thread); NaN where the clock cannot be read.
fn process_cpu_time() -> f64 {
    cpu_time::cpu_time(cpu_time::PROCESS).unwrap_or(f64::NAN)
}

/// The engine's steps replayed by hand (checked against its losses), then
/// `timed` more steps; returns the wall and CPU seconds of every step after the
/// first.
fn hand_loop(
    config: &LlamaConfig,
    data: &[Vec<u32>],
    engine: &[f64],
    timed: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut trainer = fresh(config);
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for step in 0..STEPS + timed {
        let rows = &data[(step % STEPS) * BATCH..][..BATCH];
        let ids = collate(rows, &Device::Cpu).expect("collate");
        let (start, start_cpu) = (Instant::now(), process_cpu_time());
        let loss = hand_step(&mut trainer, &ids.ids).expect("train step");
        if step > 0 {
            wall.push(start.elapsed().as_secs_f64());
            cpu.push(process_cpu_time() - start_cpu);
        }
        if let Some(&theirs) = engine.get(step) {
            let rel = (f64::from(loss) - theirs).abs() / theirs;
            assert!(
                rel < 1e-5,
                "step {}: hand loop {loss} vs engine {theirs}",
                step + 1
            );
        }
    }
    (wall, cpu)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 0 {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

fn run_case(export: &Path, name: &str, config: &LlamaConfig, data: &[Vec<u32>], timed: usize) {
    let dir = export.join(name);
    export_inputs(&dir, config, data).expect("export the inputs");
    let (losses, engine_seconds) = engine_losses(config, data).expect("train through the engine");
    assert_eq!(losses.len(), STEPS, "the engine ran {} steps", losses.len());
    let p = hyper();
    write_json(
        &dir.join("losses.json"),
        &serde_json::json!({
            "losses": losses,
            "adamw": {"lr": p.lr, "betas": [p.beta1, p.beta2], "eps": p.eps,
                      "weight_decay": p.weight_decay},
            "batch": BATCH, "seq": SEQ, "steps": STEPS,
        }),
    );
    let (mut wall, mut cpu) = hand_loop(config, data, &losses, timed);
    let (step, step_cpu) = (median(&mut wall), median(&mut cpu));
    let parameters: usize = Lm::new(config)
        .expect("model")
        .model
        .named_tensors()
        .iter()
        .map(|(_, t)| t.elem_count())
        .sum();
    write_json(
        &dir.join("rust_timing.json"),
        &serde_json::json!({
            "median_step_s": step, "median_step_cpu_s": step_cpu, "steps_timed": wall.len(),
            "engine_steps_per_s": STEPS as f64 / engine_seconds,
            "parameters": parameters,
        }),
    );
    println!(
        "{name}: {parameters} parameters, loss {:.4} -> {:.4}, step {:.1} ms wall, {:.1} ms CPU \
         (hand loop, median), engine {:.2} steps/s",
        losses[0],
        losses[STEPS - 1],
        step * 1e3,
        step_cpu * 1e3,
        STEPS as f64 / engine_seconds
    );
}

/// Tiny models of the three families with what the timed cases lack (biases, a
/// head width apart from hidden / heads, a sliding window shorter than the rows,
/// Qwen2's q/k/v biases), trained a few steps so that the biases are not zero:
/// their weights and logits, plain and with two packed documents per row, for
/// transformers' Auto classes to reproduce.
fn export_families(export: &Path, data: &[Vec<u32>]) -> Result<()> {
    let mut llama = LlamaConfig::new(ModelType::Llama, VOCAB, 32, 48, 2, 4, 2);
    (llama.attention_bias, llama.mlp_bias) = (true, true);
    let mut mistral = LlamaConfig::new(ModelType::Mistral, VOCAB, 32, 48, 2, 4, 2);
    (mistral.head_dim, mistral.sliding_window) = (16, Some(5));
    let mut qwen2 = LlamaConfig::new(ModelType::Qwen2, VOCAB, 32, 48, 2, 4, 1);
    qwen2.tie_word_embeddings = true;
    let ids = collate(&data[..2], &Device::Cpu)?.ids.narrow(1, 0, 12)?;
    // Row 0: documents of 5 and 7 tokens; row 1: one document.
    let documents: Vec<u32> = [[0; 5].as_slice(), &[1; 7], &[0; 12]].concat();
    let documents = Tensor::from_vec(documents, (2, 12), &Device::Cpu)?;
    for (name, config) in [
        ("llama_bias", llama),
        ("mistral", mistral),
        ("qwen2", qwen2),
    ] {
        let mut trainer = fresh(&config);
        let hyper = ParamsAdamW {
            lr: 1e-2,
            ..hyper()
        };
        trainer.opt = AdamW::new(trainer.model.params.all_vars(), hyper).map_err(candle_error)?;
        for step in 0..3 {
            let rows = collate(&data[step * BATCH..][..BATCH], &Device::Cpu)?;
            hand_step(&mut trainer, &rows.ids)?;
        }
        let model = &trainer.model.model;
        let dir = export.join("families").join(name);
        std::fs::create_dir_all(&dir)?;
        save(model.named_tensors(), &dir.join("model.safetensors"));
        config.save(&dir).expect("write config.json");
        let positions = adabatch::nn::positions_in_documents(&documents)?;
        save(
            vec![
                ("input_ids".to_string(), ids.to_dtype(DType::I64)?),
                ("position_ids".to_string(), positions.to_dtype(DType::I64)?),
                ("logits".to_string(), model.forward(&ids)?),
                (
                    "packed_logits".to_string(),
                    model.forward_packed(&ids, None, Some(&documents))?,
                ),
            ],
            &dir.join("check.safetensors"),
        );
    }
    Ok(())
}

fn candle_error(e: adabatch::Error) -> adabatch::candle_core::Error {
    adabatch::candle_core::Error::Msg(e.to_string())
}

fn main() {
    let Some(export) = std::env::var_os("LLAMA_COMPARE_EXPORT").map(PathBuf::from) else {
        // `cargo bench` runs every bench: this one needs run.sh's directory.
        eprintln!(
            "llama_compare: set LLAMA_COMPARE_EXPORT=DIR (benches/compare/llama/run.sh does)"
        );
        return;
    };
    let timed = std::env::var("LLAMA_COMPARE_TIMED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let data = rows();
    assert_eq!(data.len(), STEPS * BATCH, "corpus too short");
    let names: Vec<&str> = cases().iter().map(|(name, _)| *name).collect();
    write_json(&export.join("cases.json"), &serde_json::json!(names));
    export_families(&export, &data).expect("export the family checks");
    for (name, config) in cases() {
        run_case(&export, name, &config, &data, timed);
    }
}
