//! `gpu_check batching` and `gpu_check oom`: memory-aware batching against the
//! largest safe fixed batch and token-budget batching (tokens/s, peak memory,
//! OOMs), and real CUDA OOMs recovered by `halve` and `split_retry`.

use super::transformer::{self, Example, Transformer};
use super::*;
use adabatch::{OomPolicy, WithLengths};

/// A fixed batch: the schedule keeps `per_device_train_batch_size`.
#[adaptive_trainer(schedule = constant)]
pub struct FixedTrainer {
    #[model]
    model: Transformer,
    #[optimizer]
    opt: AdamW,
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

#[derive(Args)]
pub(crate) struct BatchingOpts {
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

#[derive(Args)]
pub(crate) struct OomOpts {
    /// The corpus: one sentence per line.
    #[arg(long)]
    data: PathBuf,
    #[command(flatten)]
    model: transformer::Config,
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Device memory left free by a ballast tensor, GiB: small enough that the
    /// first batch runs out of memory.
    #[arg(long, default_value_t = 2.0)]
    headroom_gib: f64,
    /// Per-device batch of the first step (the longest examples come first).
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    #[arg(long, default_value_t = 10)]
    steps: usize,
}

fn with_lengths(data: Vec<Example>) -> adabatch::Result<WithLengths<Vec<Example>>> {
    let lengths = data.iter().map(|e| e.tokens.len().max(1)).collect();
    WithLengths::new(data, lengths)
}

fn args(device: &str, per_device: usize, seed: u64) -> TrainingArgs {
    TrainingArgs {
        device: device.to_string(),
        seed: Some(seed),
        per_device_train_batch_size: per_device,
        learning_rate: 3e-4,
        logging_steps: usize::MAX,
        quiet: true,
        ..TrainingArgs::default()
    }
}

/// One step on the `size` longest examples: `Ok(false)` on a real OOM.
fn fits(opts: &BatchingOpts, sorted: &[Example], size: usize) -> AnyResult<bool> {
    let data: Vec<Example> = sorted[..size.min(sorted.len())].to_vec();
    let mut a = args(&opts.device, size, opts.seed);
    a.max_steps = Some(1);
    let result = FixedTrainer::launch(&data, &transformer::collate, &a, |ctx: &RankContext| {
        let model = Transformer::new(opts.model, ctx.parameters(), ctx.device())?;
        let opt = transformer::optimizer(&model, 3e-4)?;
        Ok(FixedTrainer::new(model, opt))
    });
    match result {
        Ok(_) => Ok(true),
        Err(e) if adabatch::train::oom::is_out_of_memory(&e) => Ok(false),
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

pub fn batching(opts: &BatchingOpts) -> AnyResult<bool> {
    let device = parse_device(&opts.device)?;
    let data = transformer::load(&opts.data, opts.model.max_len)?;
    let fixed = match opts.fixed_batch {
        Some(size) => size,
        None => largest_safe_fixed(opts, &data)?,
    };
    let dataset = with_lengths(data.clone())?;
    let mut a = args(&opts.device, fixed, opts.seed);
    a.num_train_epochs = opts.epochs;
    let build_fixed = |ctx: &RankContext| {
        let model = Transformer::new(opts.model, ctx.parameters(), ctx.device())?;
        let opt = transformer::optimizer(&model, 3e-4)?;
        Ok(FixedTrainer::new(model, opt))
    };
    let fixed_run = report("fixed", &data, &device, || {
        FixedTrainer::launch(&dataset, &transformer::collate, &a, build_fixed)
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
        },
    )?;
    let mut budget = a.clone();
    budget.max_tokens_per_batch = Some(fixed * opts.model.max_len);
    let budget_run = report("token_budget", &data, &device, || {
        FixedTrainer::launch(&dataset, &transformer::collate, &budget, build_fixed)
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

pub fn oom(opts: &OomOpts) -> AnyResult<bool> {
    let device = parse_device(&opts.device)?;
    let info = adabatch::memory::device::memory_info(&device)
        .ok_or("no device memory figures: needs a CUDA device")?;
    let ballast_bytes = info
        .free_bytes
        .saturating_sub((opts.headroom_gib * (1u64 << 30) as f64) as u64);
    // Fills the device so that a real CUDA allocation fails inside the step.
    let _ballast = Tensor::zeros(((ballast_bytes / 4) as usize,), DType::F32, &device)?;
    emit(&json!({"ballast_bytes": ballast_bytes, "free_before": info.free_bytes}));
    let data = transformer::load(&opts.data, opts.model.max_len)?;
    let mut all_ok = true;
    for policy in [OomPolicy::Halve, OomPolicy::SplitRetry] {
        let mut a = args(&opts.device, opts.batch, 0);
        a.max_steps = Some(opts.steps);
        a.oom = Some(policy);
        let result = FixedTrainer::launch(&data, &transformer::collate, &a, |ctx: &RankContext| {
            let model = Transformer::new(opts.model, ctx.parameters(), ctx.device())?;
            let opt = transformer::optimizer(&model, 3e-4)?;
            Ok(FixedTrainer::new(model, opt))
        });
        let ok = matches!(&result, Ok(s) if s.oom_events > 0 && s.global_step == opts.steps && s.train_loss.is_finite());
        all_ok &= ok;
        emit(&json!({
            "check": format!("oom.{policy:?}"),
            "ok": ok,
            "result": match &result {
                Ok(s) => json!({"steps": s.global_step, "oom_events": s.oom_events, "final_per_device": s.final_per_device_batch_size, "examples": s.examples_seen}),
                Err(e) => json!({"error": e.to_string()}),
            },
        }));
    }
    Ok(all_ok)
}
