//! `gpu_check memory`: free/total device memory, and the memory of one step at
//! growing batch sizes (the longest sentences first).

use std::path::PathBuf;

use adabatch::memory::device_memory::PeakSampler;
use adabatch::{Parameters, TrainModel};
use candle_core::Device;
use candle_nn::Optimizer;
use clap::Args;
use serde_json::json;

use super::transformer::{self, Example, Transformer};
use super::{emit, parse_device, AnyResult};

#[derive(Args)]
pub struct MemoryOpts {
    /// The corpus: one sentence per line.
    #[arg(long)]
    data: PathBuf,
    #[command(flatten)]
    model: transformer::Config,
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Batch sizes, one step each.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128,256")]
    batches: Vec<usize>,
}

pub fn run(opts: &MemoryOpts) -> AnyResult<bool> {
    let device = parse_device(&opts.device)?;
    let info = adabatch::memory::device_memory::memory_info(&device);
    let info_ok = match (&device, info) {
        (Device::Cpu, None) => true,
        (_, Some(m)) => m.total_bytes > 0 && m.free_bytes <= m.total_bytes,
        _ => false,
    };
    emit(&json!({"check": "memory.info", "ok": info_ok, "device": opts.device, "info": info}));
    let mut data = transformer::load(&opts.data, opts.model.max_len)?;
    // The longest sentences first: every step pads to about max_len.
    data.sort_by_key(|e| std::cmp::Reverse(e.tokens.len()));
    let model = Transformer::new(opts.model, Parameters::new(0), &device)?;
    let mut opt = transformer::optimizer(&model, 1e-4)?;
    let mut peaks = Vec::new();
    for (step, &size) in opts.batches.iter().enumerate() {
        let items: Vec<Example> = data.iter().take(size).cloned().collect();
        let sampler = PeakSampler::start(&device);
        let batch = transformer::collate(&items, &device)?;
        let loss = (model.per_example_loss(&batch)?.sum_all()? / items.len() as f64)?;
        opt.backward_step(&loss)?;
        let mem = sampler.finish();
        peaks.push(mem.pool_peak);
        emit(&json!({
            "memory_step": step + 1,
            "batch": items.len(),
            "max_len": items.iter().map(|e| e.tokens.len()).max(),
            "used_before": mem.used_before,
            "used_after": mem.used_after,
            "pool_peak": mem.pool_peak,
            "pool_current": mem.pool_current,
        }));
    }
    let grows = device.is_cpu()
        || (peaks.iter().all(Option::is_some) && peaks.windows(2).all(|w| w[0] <= w[1]));
    emit(&json!({
        "check": "memory.pool_peak_grows_with_batch",
        "ok": grows,
        "peaks": peaks,
        "measured": "pool_peak = high-water mark of the CUDA memory pool candle allocates from (tensors only); used_* = total - free from cuMemGetInfo (whole device)",
    }));
    Ok(info_ok && grows)
}
