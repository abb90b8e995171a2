//! `gpu_check bench`: the transformer classifier trained by adabatch (batch
//! `--per-device-train-batch-size`, then +16 every 20 steps, at most 256), samples/s
//! and tokens/s as JSON, comparable with benches/compare/torch_transformer.py.

use std::path::PathBuf;
use std::sync::Mutex;

use adabatch::{Parameters, RankContext, TrainingArgs};
use candle_core::Device;
use clap::Args;
use serde_json::json;

use super::transformer::{self, BenchTrainer, Example, Transformer};
use super::{emit, parse_device, AnyResult};

#[derive(Args, Clone)]
pub struct BenchOpts {
    /// The corpus: one sentence per line.
    #[arg(long)]
    pub data: PathBuf,
    #[command(flatten)]
    pub model: transformer::Config,
    /// `cuda`, `cuda:N` or `cpu`.
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// Ranks (GPUs) on this node; > 1 uses NCCL when built with `nccl`.
    #[arg(long, default_value_t = 1)]
    pub nproc_per_node: usize,
    /// Timed optimisation steps.
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// Untimed steps first (kernel loading, allocator warm-up).
    #[arg(long, default_value_t = 20)]
    pub warmup_steps: usize,
    /// Initial per-device batch size (then +16 every 20 steps, at most 256).
    #[arg(long, default_value_t = 32)]
    pub per_device_train_batch_size: usize,
    #[arg(long, default_value_t = 3e-4)]
    pub learning_rate: f64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Allow TF32 in f32 matmuls (PyTorch: `--tf32`).
    #[arg(long)]
    pub tf32: bool,
    /// Write the timed run's batches (dataset indices, one list per step) here, for
    /// `benches/compare/torch_transformer.py --plan` (one rank only).
    #[arg(long)]
    pub plan_out: Option<PathBuf>,
}

/// TF32 in f32 matmuls on or off (a no-op without CUDA).
pub fn set_tf32(on: bool) {
    #[cfg(feature = "cuda")]
    candle_core::cuda::set_gemm_reduced_precision_f32(on);
    let _ = on;
}

fn args(opts: &BenchOpts, steps: usize) -> TrainingArgs {
    let mut args = {
        let mut args = TrainingArgs::default();
        args.launch.device = opts.device.clone();
        args.launch.nproc_per_node = opts.nproc_per_node;
        args.data.seed = Some(opts.seed);
        args.length.max_steps = Some(steps);
        args.batch.per_device_train_batch_size = opts.per_device_train_batch_size;
        args.lr.learning_rate = opts.learning_rate;
        args.logging.logging_steps = steps.max(1);
        args.logging.quiet = true;
        args
    };
    opts.model.set_precision(&mut args);
    args
}

fn factory(
    opts: &BenchOpts,
) -> impl Fn(&RankContext) -> adabatch::Result<BenchTrainer> + Sync + '_ {
    move |ctx: &RankContext| {
        let model = Transformer::new(opts.model, ctx.parameters(), ctx.device())?;
        let opt = transformer::optimizer(&model, opts.learning_rate)?;
        Ok(BenchTrainer { model, opt })
    }
}

pub fn run(opts: &BenchOpts) -> AnyResult<bool> {
    set_tf32(opts.tf32);
    let data = transformer::load(&opts.data, opts.model.max_len)?;
    // Keeps the CUDA context alive between the warm-up and the timed run.
    let _keep = parse_device(&opts.device)?;
    let params =
        Transformer::new(opts.model, Parameters::new(opts.seed), &Device::Cpu)?.num_params();
    if opts.warmup_steps > 0 {
        eprintln!("bench: {} warm-up steps ...", opts.warmup_steps);
        adabatch::Run::new(&data, &transformer::collate, &args(opts, opts.warmup_steps))
            .launch(factory(opts))?;
    }
    let plan: Mutex<Vec<Vec<usize>>> = Mutex::new(Vec::new());
    let recording = |items: &[Example], device: &Device| {
        plan.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(items.iter().map(|e| e.index).collect());
        transformer::collate(items, device)
    };
    eprintln!("bench: {} timed steps ...", opts.steps);
    let summary = adabatch::Run::new(&data, &recording, &args(opts, opts.steps))
        .launch(factory(opts))?
        .summary;
    let plan = plan.into_inner().unwrap_or_else(|e| e.into_inner());
    let tokens: usize = plan.iter().flatten().map(|&i| data[i].tokens.len()).sum();
    let padded: usize = plan
        .iter()
        .map(|b| b.len() * b.iter().map(|&i| data[i].tokens.len()).max().unwrap_or(0))
        .sum();
    if let Some(path) = &opts.plan_out {
        if opts.nproc_per_node == 1 {
            std::fs::write(path, serde_json::to_string(&json!({"steps": plan}))?)?;
        } else {
            eprintln!("bench: --plan-out is written for one rank only; skipped");
        }
    }
    emit(&json!({
        "bench": "transformer_classifier",
        "impl": "adabatch (candle)",
        "device": opts.device,
        "world_size": summary.world_size,
        "params": params,
        "config": {"d_model": opts.model.d_model, "layers": opts.model.layers, "heads": opts.model.heads, "max_len": opts.model.max_len},
        "schedule": format!("interval: {} per device, +{} every {} steps, max {}", opts.per_device_train_batch_size, transformer::GROW, transformer::EVERY, transformer::MAX_BATCH),
        "tf32": opts.tf32,
        "steps": summary.global_step,
        "warmup_steps": opts.warmup_steps,
        "examples": summary.examples_seen,
        "final_per_device_batch": summary.final_per_device_batch_size,
        "train_runtime_s": summary.train_runtime,
        "samples_per_s": summary.train_samples_per_second,
        "tokens_per_s": tokens as f64 / summary.train_runtime,
        "padded_tokens_per_s": padded as f64 / summary.train_runtime,
        "train_loss": summary.train_loss,
        "last_loss": summary.step_losses.last(),
    }));
    Ok(summary.train_loss.is_finite())
}
