//! `gpu_check batching`: memory-aware batches (`memory(threshold = 0.9, max_range =
//! 8.0)`) against the largest fixed batch that fits the longest examples and
//! against token-budget batching: tokens/s, peak memory, OOMs.

use std::path::PathBuf;

use adabatch::memory::device_memory::PeakSampler;
use adabatch::prelude::*;
use candle_core::Device;
use candle_nn::AdamW;
use clap::Args;
use serde_json::{json, Value};

use super::transformer::{self, fixed_trainer, quiet_args, Example, FixedTrainer, Transformer};
use super::{emit, parse_device, AnyResult};

#[derive(Args)]
pub struct BatchingOpts {
    /// The corpus: one sentence per line.
    #[arg(long)]
    data: PathBuf,
    #[command(flatten)]
    model: transformer::Config,
    #[arg(long, default_value = "cuda")]
    device: String,
    /// The largest safe fixed batch; found by probing the longest examples
    /// (doubling until a real OOM) when not given.
    #[arg(long)]
    fixed_batch: Option<usize>,
    /// Largest probe size.
    #[arg(long, default_value_t = 8192)]
    probe_limit: usize,
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// Memory-aware batches: grow on shorter inputs while predicted memory stays under
/// 0.9 × the first (longest) batch's, up to 8× its size.
#[adaptive_trainer(schedule = memory(threshold = 0.9, max_range = 8.0))]
pub struct MemoryTrainer {
    #[model]
    model: Transformer,
    #[optimizer]
    opt: AdamW,
}

fn with_lengths(data: Vec<Example>) -> adabatch::Result<WithLengths<Vec<Example>>> {
    let lengths = data.iter().map(|e| e.tokens.len().max(1)).collect();
    WithLengths::new(data, lengths)
}

/// One step on the `size` longest examples: `Ok(false)` on a real OOM.
fn fits(opts: &BatchingOpts, sorted: &[Example], size: usize) -> AnyResult<bool> {
    let data: Vec<Example> = sorted[..size.min(sorted.len())].to_vec();
    let mut a = quiet_args(&opts.model, &opts.device, size, opts.seed);
    a.length.max_steps = Some(1);
    let result = FixedTrainer::launch(&data, &transformer::collate, &a, fixed_trainer(opts.model));
    match result {
        Ok(_) => Ok(true),
        Err(e) if adabatch::train::out_of_memory::is_out_of_memory(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The largest power of two whose batch of the longest examples fits.
fn largest_safe_fixed(opts: &BatchingOpts, data: &[Example]) -> AnyResult<usize> {
    let mut sorted = data.to_vec();
    sorted.sort_by_key(|e| std::cmp::Reverse(e.tokens.len()));
    let mut safe = 0;
    let mut size = 8;
    while size <= opts.probe_limit.min(sorted.len()) && fits(opts, &sorted, size)? {
        emit(&json!({"probe": size, "fits": true}));
        safe = size;
        size *= 2;
    }
    if safe == 0 {
        return Err("not even 8 of the longest examples fit".into());
    }
    Ok(safe)
}

fn report(
    name: &str,
    data: &[Example],
    device: &Device,
    run: impl FnOnce() -> adabatch::Result<TrainSummary>,
) -> AnyResult<Value> {
    let sampler = PeakSampler::start(device);
    let summary = run()?;
    let memory = sampler.finish();
    let tokens: usize =
        data.iter().map(|e| e.tokens.len()).sum::<usize>() * summary.examples_seen / data.len();
    let value = json!({
        "batching": name,
        "steps": summary.global_step,
        "examples": summary.examples_seen,
        "train_runtime_s": summary.train_runtime,
        "samples_per_s": summary.train_samples_per_second,
        "tokens_per_s": tokens as f64 / summary.train_runtime,
        "peak_pool_bytes": memory.pool_peak,
        "oom_events": summary.oom_events,
        "train_loss": summary.train_loss,
    });
    emit(&value);
    Ok(value)
}

pub fn run(opts: &BatchingOpts) -> AnyResult<bool> {
    let device = parse_device(&opts.device)?;
    let data = transformer::load(&opts.data, opts.model.max_len)?;
    let fixed = match opts.fixed_batch {
        Some(size) => size,
        None => largest_safe_fixed(opts, &data)?,
    };
    let dataset = with_lengths(data.clone())?;
    let mut a = quiet_args(&opts.model, &opts.device, fixed, opts.seed);
    a.length.num_train_epochs = opts.epochs;
    let fixed_run = report("fixed", &data, &device, || {
        FixedTrainer::launch(
            &dataset,
            &transformer::collate,
            &a,
            fixed_trainer(opts.model),
        )
        .map(|t| t.summary)
    })?;
    let memory_run = report(
        "memory(threshold = 0.9, max_range = 8.0)",
        &data,
        &device,
        || {
            MemoryTrainer::launch(&dataset, &transformer::collate, &a, |ctx: &RankContext| {
                let model = Transformer::new(opts.model, ctx.parameters(), ctx.device())?;
                let opt = transformer::optimizer(&model, 3e-4)?;
                Ok(MemoryTrainer::new(model, opt))
            })
            .map(|t| t.summary)
        },
    )?;
    let mut budget = a.clone();
    budget.length_aware.max_tokens_per_batch = Some(fixed * opts.model.max_len);
    let budget_run = report("token_budget", &data, &device, || {
        FixedTrainer::launch(
            &dataset,
            &transformer::collate,
            &budget,
            fixed_trainer(opts.model),
        )
        .map(|t| t.summary)
    })?;
    let speedup = |run: &Value| {
        run["tokens_per_s"].as_f64().unwrap_or(0.0)
            / fixed_run["tokens_per_s"].as_f64().unwrap_or(f64::NAN)
    };
    let ooms: u64 = [&fixed_run, &memory_run, &budget_run]
        .iter()
        .map(|r| r["oom_events"].as_u64().unwrap_or(0))
        .sum();
    emit(&json!({
        "check": "batching",
        "largest_safe_fixed_batch": fixed,
        "memory_over_fixed_tokens_per_s": speedup(&memory_run),
        "token_budget_over_fixed_tokens_per_s": speedup(&budget_run),
        "oom_events": ooms,
        "target": "memory >= 3x fixed, 0 OOM",
    }));
    Ok(ooms == 0)
}
