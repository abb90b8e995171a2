//! `gpu_check oom`: real CUDA out-of-memory errors (a ballast tensor leaves
//! `--headroom-gib` free) recovered by `oom = halve` and by `oom = split_retry`.

use std::path::PathBuf;

use adabatch::OomPolicy;
use candle_core::{DType, Tensor};
use clap::Args;
use serde_json::json;

use super::transformer::{self, fixed_trainer, quiet_args, FixedTrainer};
use super::{emit, parse_device, AnyResult};

#[derive(Args)]
pub struct OomOpts {
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

pub fn run(opts: &OomOpts) -> AnyResult<bool> {
    let device = parse_device(&opts.device)?;
    let info = adabatch::memory::device_memory::memory_info(&device)
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
        let mut a = quiet_args(&opts.model, &opts.device, opts.batch, 0);
        a.length.max_steps = Some(opts.steps);
        a.step.oom = Some(policy);
        let result =
            FixedTrainer::launch(&data, &transformer::collate, &a, fixed_trainer(opts.model))
                .map(|t| t.summary);
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
