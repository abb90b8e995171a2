//! `gpu_check replay`: the replay-dataloader model trained on CUDA and on CPU with
//! the same seed; the per-step traces must agree (sizes, indices, coverage exactly;
//! losses and gradient norms within tolerance).

use adabatch::{TrainSummary, TrainingArgs};
use clap::Args;
use serde_json::{json, Value};

use super::replay_model::{collate, dataset, factory};
use super::{emit, AnyResult};

#[derive(Args)]
pub struct ReplayOpts {
    /// Examples ("Sample text {i}", random labels).
    #[arg(long, default_value_t = 10)]
    num_train_examples: usize,
    #[arg(long, default_value_t = 5)]
    num_train_epochs: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 0.01)]
    learning_rate: f64,
    /// Relative tolerance on losses and gradient norms.
    #[arg(long, default_value_t = 1e-4)]
    rtol: f64,
    /// Absolute tolerance on losses and gradient norms.
    #[arg(long, default_value_t = 1e-6)]
    atol: f64,
    /// CUDA device spec (`cuda` or `cuda:N`).
    #[arg(long, default_value = "cuda")]
    device: String,
}

pub fn trace(opts: &ReplayOpts, device: &str) -> AnyResult<(TrainSummary, Vec<Value>)> {
    let path = std::env::temp_dir().join(format!(
        "gpu_check_replay_{}_{}.jsonl",
        std::process::id(),
        device.replace(':', "_")
    ));
    let args = {
        let mut args = TrainingArgs::default();
        args.launch.device = device.into();
        args.data.seed = Some(opts.seed);
        args.length.num_train_epochs = opts.num_train_epochs;
        args.batch.per_device_train_batch_size = 1;
        args.lr.learning_rate = opts.learning_rate;
        args.data.dataloader_drop_last = Some(false);
        args.logging.logging_steps = 1;
        args.logging.log_jsonl = Some(path.clone());
        args.logging.log_indices = true;
        args.logging.quiet = true;
        args
    };
    let data = dataset(opts.num_train_examples, opts.seed);
    let summary = adabatch::Run::new(&data, &collate, &args)
        .launch(factory(adabatch::ParamsAdamW {
            lr: opts.learning_rate,
            ..Default::default()
        }))?
        .summary;
    let text = std::fs::read_to_string(&path)?;
    let _ = std::fs::remove_file(&path);
    let lines = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?;
    Ok((summary, lines))
}

/// Compares two traces; returns (ok, max loss diff, max relative loss diff, notes).
pub fn compare(
    cpu: &[Value],
    gpu: &[Value],
    rtol: f64,
    atol: f64,
) -> (bool, f64, f64, Vec<String>) {
    let mut notes = Vec::new();
    let (mut max_abs, mut max_rel) = (0f64, 0f64);
    if cpu.len() != gpu.len() {
        notes.push(format!(
            "{} CPU steps vs {} CUDA steps",
            cpu.len(),
            gpu.len()
        ));
    }
    for (c, g) in cpu.iter().zip(gpu) {
        let step = c["step"].as_u64().unwrap_or(0);
        for key in [
            "step",
            "epoch",
            "train_coverage",
            "local_batch_sizes",
            "global_batch",
            "indices",
            "learning_rate",
            "micro_batches",
            "oom_events",
        ] {
            if c.get(key) != g.get(key) {
                notes.push(format!(
                    "step {step}: `{key}` differs: CPU {} vs CUDA {}",
                    c[key], g[key]
                ));
            }
        }
        for key in ["loss", "grad_norm"] {
            let (a, b) = (
                c[key].as_f64().unwrap_or(f64::NAN),
                g[key].as_f64().unwrap_or(f64::NAN),
            );
            if key == "loss" {
                max_abs = max_abs.max((a - b).abs());
                max_rel = max_rel.max((a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE));
            }
            if !close(a, b, rtol, atol) {
                notes.push(format!("step {step}: `{key}` CPU {a} vs CUDA {b}"));
            }
        }
    }
    (notes.is_empty(), max_abs, max_rel, notes)
}

pub fn run(opts: &ReplayOpts) -> AnyResult<bool> {
    eprintln!("replay: training on cpu ...");
    let (cpu_summary, cpu) = trace(opts, "cpu")?;
    eprintln!("replay: training on {} ...", opts.device);
    let (gpu_summary, gpu) = trace(opts, &opts.device)?;
    let (ok, max_abs, max_rel, notes) = compare(&cpu, &gpu, opts.rtol, opts.atol);
    let ok = ok
        && cpu_summary.global_step == gpu_summary.global_step
        && cpu_summary.examples_seen == gpu_summary.examples_seen;
    emit(&json!({
        "check": "replay",
        "ok": ok,
        "steps": gpu.len(),
        "global_step": [cpu_summary.global_step, gpu_summary.global_step],
        "examples_seen": [cpu_summary.examples_seen, gpu_summary.examples_seen],
        "final_batch": [cpu_summary.final_per_device_batch_size, gpu_summary.final_per_device_batch_size],
        "train_loss": [cpu_summary.train_loss, gpu_summary.train_loss],
        "max_abs_loss_diff": max_abs,
        "max_rel_loss_diff": max_rel,
        "tolerance": {"rtol": opts.rtol, "atol": opts.atol},
        "exact_fields": "step, epoch, train_coverage, local_batch_sizes, global_batch, indices, learning_rate",
        "mismatches": notes.iter().take(20).collect::<Vec<_>>(),
    }));
    Ok(ok)
}

/// `a` and `b` agree within `rtol` (relative) or `atol` (absolute).
fn close(a: f64, b: f64, rtol: f64, atol: f64) -> bool {
    (a - b).abs() <= atol + rtol * a.abs().max(b.abs())
}
