//! One binary for the checks and benchmarks that need a GPU (feature `cuda`; the
//! `nccl` subcommand needs `nccl`). Build it with `scripts/build-gpu-check.sh`;
//! how to run it on a GPU machine is in `docs/GPU.md`.
//!
//! ```text
//! gpu_check replay                 # CUDA vs CPU: same steps, sizes, coverage; losses within tolerance
//! gpu_check nccl                   # NCCL communicator at world size 1: values, flags, broadcast
//! gpu_check memory --data FILE     # free/total device memory, per-step memory of growing batches
//! gpu_check bench --data FILE      # transformer classifier under adabatch: samples/s as JSON
//! gpu_check breakdown --data FILE  # per-step time: host, forward, backward, all-reduce, optimizer
//! gpu_check batching --data FILE   # memory(..) vs largest safe fixed batch vs token budget
//! gpu_check oom --data FILE        # real CUDA OOMs recovered by halve and split_retry
//! ```
//!
//! Every subcommand prints one JSON object per result line on stdout (progress goes
//! to stderr) and exits 0 when its checks pass, 1 when one fails, 2 on an error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use adabatch::memory::device::PeakSampler;
use adabatch::prelude::*;
use adabatch::Communicator;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Embedding, Linear, Module, Optimizer, ParamsAdamW};
use clap::{Args, Parser, Subcommand};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser)]
#[command(about = "adabatch GPU checks and benchmarks (feature `cuda`)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train the replay-dataloader model on CUDA and on CPU with the same seed and
    /// compare the per-step traces.
    Replay(ReplayOpts),
    /// Check the NCCL communicator at world size 1 (feature `nccl`).
    Nccl(NcclOpts),
    /// Device memory: free/total, and per-step memory of growing batches.
    Memory(MemoryOpts),
    /// Benchmark: a transformer classifier trained by adabatch, samples/s as JSON.
    Bench(BenchOpts),
    /// Time split of a step: host, forward, backward, all-reduce, optimizer.
    Breakdown(BenchOpts),
    /// Memory-aware batches vs the largest safe fixed batch vs token budget:
    /// tokens/s, peak memory, OOMs.
    Batching(memory_bench::BatchingOpts),
    /// Real CUDA OOMs (a ballast tensor fills the device) recovered by `halve` and
    /// by `split_retry`.
    Oom(memory_bench::OomOpts),
}

fn dispatch(cli: Cli) -> AnyResult<bool> {
    match cli.cmd {
        Cmd::Replay(o) => replay::run(&o),
        Cmd::Nccl(o) => nccl_check::run(&o),
        Cmd::Memory(o) => memory::run(&o),
        Cmd::Bench(o) => bench::run(&o),
        Cmd::Breakdown(o) => bench::breakdown(&o),
        Cmd::Batching(o) => memory_bench::batching(&o),
        Cmd::Oom(o) => memory_bench::oom(&o),
    }
}

/// Parses a command line (`["gpu_check", "replay", ...]`) and runs it: `Ok(true)`
/// when every check passed. Used by `tests/gpu.rs`, which compiles this file as a
/// module (the binary itself does not call it).
#[allow(dead_code)]
pub(crate) fn run_args(args: &[&str]) -> AnyResult<bool> {
    dispatch(Cli::try_parse_from(args)?)
}

fn main() -> ExitCode {
    match dispatch(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("gpu_check: a check FAILED (see the JSON lines above)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("gpu_check: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn emit(value: &Value) {
    println!("{value}");
}

/// `cpu`, `cuda` (GPU 0) or `cuda:N`.
fn parse_device(spec: &str) -> AnyResult<Device> {
    match spec {
        "cpu" => Ok(Device::Cpu),
        "cuda" => cuda_device(0),
        _ => match spec.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => cuda_device(n),
            _ => Err(format!("--device {spec}: expected cpu, cuda or cuda:N").into()),
        },
    }
}

fn cuda_device(ordinal: usize) -> AnyResult<Device> {
    Device::new_cuda(ordinal).map_err(|e| {
        format!("no CUDA device {ordinal}: {e} (is the driver's libcuda.so.1 on the library path?)")
            .into()
    })
}

/// `a` and `b` agree within `rtol` (relative) or `atol` (absolute).
fn close(a: f64, b: f64, rtol: f64, atol: f64) -> bool {
    (a - b).abs() <= atol + rtol * a.abs().max(b.abs())
}

// ---------------------------------------------------------------------------
// The replay-dataloader model (a copy of examples/replay_dataloader.rs's model).

#[path = "support/replay_model.rs"]
pub(crate) mod replay_model;

// ---------------------------------------------------------------------------
// replay: CUDA vs CPU.

#[derive(Args)]
pub(crate) struct ReplayOpts {
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

pub(crate) mod replay {
    use super::replay_model::{collate, dataset, factory};
    use super::*;

    pub fn trace(opts: &ReplayOpts, device: &str) -> AnyResult<(TrainSummary, Vec<Value>)> {
        let path = std::env::temp_dir().join(format!(
            "gpu_check_replay_{}_{}.jsonl",
            std::process::id(),
            device.replace(':', "_")
        ));
        let args = TrainingArgs {
            device: device.into(),
            seed: Some(opts.seed),
            num_train_epochs: opts.num_train_epochs,
            per_device_train_batch_size: 1,
            learning_rate: opts.learning_rate,
            dataloader_drop_last: Some(false),
            logging_steps: 1,
            log_jsonl: Some(path.clone()),
            log_indices: true,
            quiet: true,
            ..TrainingArgs::default()
        };
        let data = dataset(opts.num_train_examples, opts.seed);
        let summary =
            adabatch::launch(&data, &collate, &args, factory(opts.learning_rate))?.summary;
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
                    max_rel =
                        max_rel.max((a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE));
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
}

// ---------------------------------------------------------------------------
// nccl: the communicator at world size 1.

#[derive(Args)]
pub(crate) struct NcclOpts {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Elements of the all-reduce timing buffer (default: the bench model's size).
    #[arg(long, default_value_t = 1_711_874)]
    timing_elems: usize,
    /// All-reduce calls timed.
    #[arg(long, default_value_t = 50)]
    timing_iters: usize,
}

#[cfg(not(feature = "nccl"))]
pub(crate) mod nccl_check {
    use super::*;
    pub fn run(_: &NcclOpts) -> AnyResult<bool> {
        Err("this binary was built without the `nccl` feature".into())
    }
}

#[cfg(feature = "nccl")]
pub(crate) mod nccl_check {
    use super::replay_model::{collate, dataset, factory};
    use super::*;
    use adabatch::Nccl;

    fn values(t: &Tensor) -> AnyResult<Vec<f64>> {
        Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
    }

    /// The checks on one rank of a world-1 group; returns (name, ok, detail) rows.
    pub fn checks(comm: &Nccl, device: &Device) -> AnyResult<Vec<(String, bool, String)>> {
        let mut rows = Vec::new();
        let mut row =
            |name: &str, ok: bool, detail: String| rows.push((name.to_string(), ok, detail));
        row(
            "rank_world",
            comm.rank() == 0 && comm.world_size() == 1,
            format!("rank {} of {}", comm.rank(), comm.world_size()),
        );

        // all-reduce: f32 matrix, bf16 vector, f64 vector, scalars.
        let a = Tensor::arange(0f32, 6.0, device)?.reshape((2, 3))?;
        let b = Tensor::new(&[1.5f32, -2.25, 3.0, 1024.0], device)?.to_dtype(DType::BF16)?;
        let c = Tensor::new(&[1e-12f64, 123456789.125], device)?;
        let originals = [a.clone(), b.clone(), c.clone()];
        let mut tensors = originals.to_vec();
        let mut scalars = [0.5, 7.0, -3.25];
        comm.all_reduce_sum(&mut tensors, &mut scalars)?;
        let mut same = true;
        let mut detail = String::new();
        for (i, (t, o)) in tensors.iter().zip(&originals).enumerate() {
            let kept = t.dims() == o.dims()
                && t.dtype() == o.dtype()
                && t.device().location() == o.device().location();
            let equal = values(t)? == values(o)?;
            if !(kept && equal) {
                same = false;
                detail.push_str(&format!(
                    "tensor {i}: shape/dtype/device kept {kept}, values equal {equal}; "
                ));
            }
        }
        let scalars_ok = scalars == [0.5, 7.0, -3.25];
        if !scalars_ok {
            detail.push_str(&format!("scalars {scalars:?}; "));
        }
        row("all_reduce_sum_identity", same && scalars_ok, detail);

        // The result is usable by later kernels on the same stream.
        let doubled = values(&(&tensors[0] * 2.0)?)?;
        row(
            "result_usable",
            doubled == vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0],
            format!("{doubled:?}"),
        );

        // Flags and barrier.
        let t = comm.any(true)?;
        let f = comm.any(false)?;
        row("any", t && !f, format!("any(true) = {t}, any(false) = {f}"));
        row("barrier", comm.barrier().is_ok(), String::new());

        // Broadcast from rank 0 keeps the values; a bad root is an error.
        let mut weights = vec![
            Tensor::randn(0f32, 1.0, (64, 32), device)?,
            Tensor::randn(0f32, 1.0, 32, device)?,
        ];
        let before: Vec<Vec<f64>> = weights.iter().map(values).collect::<AnyResult<_>>()?;
        comm.broadcast(&mut weights, 0)?;
        let after: Vec<Vec<f64>> = weights.iter().map(values).collect::<AnyResult<_>>()?;
        row("broadcast_root0", before == after, String::new());
        let bad_root = comm.broadcast(&mut weights, 1);
        row(
            "broadcast_bad_root_is_error",
            matches!(bad_root, Err(adabatch::Error::Comm(_))),
            format!("{bad_root:?}"),
        );

        // A CPU tensor is refused with a typed error.
        let mut cpu = [Tensor::new(&[1f32], &Device::Cpu)?];
        let refused = comm.all_reduce_sum(&mut cpu, &mut []);
        row(
            "cpu_tensor_refused",
            matches!(refused, Err(adabatch::Error::Comm(_))),
            format!("{refused:?}"),
        );
        Ok(rows)
    }

    pub fn run(opts: &NcclOpts) -> AnyResult<bool> {
        let mut ok = true;
        let mut report = |name: &str, pass: bool, detail: &str| {
            ok &= pass;
            emit(&json!({"check": format!("nccl.{name}"), "ok": pass, "detail": detail}));
        };
        eprintln!("nccl: creating a world-1 communicator on cuda:{}", opts.gpu);
        let mut members = Nccl::group_on(&[opts.gpu])?;
        let (comm, device) = members.remove(0);
        for (name, pass, detail) in checks(&comm, &device)? {
            report(&name, pass, &detail);
        }

        // Timing of one all-reduce of `timing_elems` f32 (pack + NCCL + unpack).
        let mut grads = vec![Tensor::ones(opts.timing_elems, DType::F32, &device)?];
        let mut scalars = [1.0, 2.0, 0.0, 0.0];
        comm.all_reduce_sum(&mut grads, &mut scalars)?;
        let started = Instant::now();
        for _ in 0..opts.timing_iters {
            comm.all_reduce_sum(&mut grads, &mut scalars)?;
        }
        device.synchronize()?;
        let per_call = started.elapsed().as_secs_f64() / opts.timing_iters.max(1) as f64;
        emit(&json!({
            "check": "nccl.timing",
            "ok": true,
            "elems": opts.timing_elems,
            "bytes": opts.timing_elems * 4,
            "us_per_all_reduce_world1": per_call * 1e6,
            "note": "world size 1: measures flatten/cat, NCCL launch, scalar read-back; no inter-GPU traffic",
        }));

        // Training through launch_group with the NCCL member (the factory's
        // agreement all-reduce runs through NCCL) equals the plain CUDA run.
        let data = dataset(10, 42);
        let args = TrainingArgs {
            seed: Some(42),
            num_train_epochs: 5,
            per_device_train_batch_size: 1,
            learning_rate: 0.01,
            quiet: true,
            device: format!("cuda:{}", opts.gpu),
            ..TrainingArgs::default()
        };
        let plain = adabatch::launch(&data, &collate, &args, factory(0.01))?.summary;
        let via_nccl = adabatch::launch_group(
            vec![(comm, device.clone())],
            &data,
            &collate,
            &args,
            factory(0.01),
        )?
        .summary;
        let same =
            plain.step_losses == via_nccl.step_losses && plain.global_step == via_nccl.global_step;
        report(
            "launch_group_world1",
            same,
            &format!("{} steps, losses identical: {same}", via_nccl.global_step),
        );

        // Informational (does not fail the run; the engine gives NCCL ranks their
        // own stream): does NCCL accept candle's per-thread default stream?
        let per_thread = cuda_device(opts.gpu)?;
        let (works, detail) = match Nccl::group(std::slice::from_ref(&per_thread)) {
            Ok(mut g) => {
                let comm = g.remove(0);
                let mut t = [Tensor::new(&[1f32, 2.0], &per_thread)?];
                let r = comm.all_reduce_sum(&mut t, &mut [1.0]);
                (
                    r.is_ok() && values(&t[0])? == vec![1.0, 2.0],
                    format!("{r:?}"),
                )
            }
            Err(e) => (false, e.to_string()),
        };
        emit(&json!({
            "check": "nccl.per_thread_stream_device",
            "ok": true,
            "informational": true,
            "works": works,
            "detail": detail,
        }));
        Ok(ok)
    }
}

// ---------------------------------------------------------------------------
// The benchmark model: a small transformer classifier over bytes.

pub(crate) mod transformer {
    use super::*;

    pub const PAD: u32 = 256;
    pub const VOCAB: usize = 257;
    pub const CLASSES: usize = 2;

    #[derive(Debug, Clone, Copy, Args)]
    pub struct Config {
        /// Model width.
        #[arg(long, default_value_t = 256)]
        pub d_model: usize,
        /// Transformer blocks.
        #[arg(long, default_value_t = 2)]
        pub layers: usize,
        /// Attention heads.
        #[arg(long, default_value_t = 4)]
        pub heads: usize,
        /// Longest input in bytes (longer sentences are truncated).
        #[arg(long, default_value_t = 256)]
        pub max_len: usize,
    }

    /// One example: bytes of a sentence and whether it contains a comma.
    #[derive(Debug, Clone)]
    pub struct Example {
        pub index: usize,
        pub tokens: Vec<u8>,
        pub label: u32,
    }

    pub fn load(path: &Path, max_len: usize) -> AnyResult<Vec<Example>> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let examples: Vec<Example> = text
            .lines()
            // Blank lines (ASCII whitespace only) are skipped, as in the PyTorch script.
            .filter(|l| !l.bytes().all(|b| b.is_ascii_whitespace()))
            .enumerate()
            .map(|(index, line)| {
                let bytes = line.as_bytes();
                Example {
                    index,
                    tokens: bytes[..bytes.len().min(max_len)].to_vec(),
                    label: u32::from(bytes.contains(&b',')),
                }
            })
            .collect();
        if examples.is_empty() {
            return Err(format!("{}: no sentences", path.display()).into());
        }
        Ok(examples)
    }

    pub struct TokenBatch {
        pub ids: Tensor,
        pub positions: Tensor,
        /// `[batch, 1, 1, len]`: 0 for real tokens, -1e9 for padding.
        pub attn_bias: Tensor,
        /// `[batch, len, 1]`: 1 for real tokens.
        pub mask: Tensor,
        pub labels: Tensor,
        pub tokens: usize,
    }

    impl Batch for TokenBatch {
        fn num_examples(&self) -> usize {
            self.labels.dims()[0]
        }
        fn num_tokens(&self) -> usize {
            self.tokens
        }
    }

    pub fn collate(items: &[Example], device: &Device) -> candle_core::Result<TokenBatch> {
        let b = items.len();
        let t = items
            .iter()
            .map(|e| e.tokens.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut ids = vec![PAD; b * t];
        let mut mask = vec![0f32; b * t];
        for (row, e) in items.iter().enumerate() {
            for (col, &byte) in e.tokens.iter().enumerate() {
                ids[row * t + col] = u32::from(byte);
                mask[row * t + col] = 1.0;
            }
        }
        let bias: Vec<f32> = mask
            .iter()
            .map(|&m| if m > 0.0 { 0.0 } else { -1e9 })
            .collect();
        Ok(TokenBatch {
            ids: Tensor::from_vec(ids, (b, t), device)?,
            positions: Tensor::arange(0u32, t as u32, device)?,
            attn_bias: Tensor::from_vec(bias, (b, 1, 1, t), device)?,
            mask: Tensor::from_vec(mask, (b, t, 1), device)?,
            labels: Tensor::new(items.iter().map(|e| e.label).collect::<Vec<_>>(), device)?,
            tokens: items.iter().map(|e| e.tokens.len()).sum(),
        })
    }

    /// LayerNorm from differentiable ops (candle-nn's fused layer-norm kernel has
    /// no backward pass).
    struct Norm {
        weight: Tensor,
        bias: Tensor,
    }

    impl Norm {
        fn new(d: usize, vb: candle_nn::VarBuilder) -> candle_core::Result<Self> {
            Ok(Self {
                weight: vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
                bias: vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
            })
        }
        fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
            candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, 1e-5)
        }
    }

    struct Block {
        ln1: Norm,
        qkv: Linear,
        proj: Linear,
        ln2: Norm,
        fc1: Linear,
        fc2: Linear,
    }

    pub struct Transformer {
        cfg: Config,
        tok: Embedding,
        pos: Embedding,
        blocks: Vec<Block>,
        ln_f: Norm,
        head: Linear,
        pub params: Parameters,
    }

    impl Transformer {
        pub fn new(cfg: Config, params: Parameters, device: &Device) -> candle_core::Result<Self> {
            if cfg.heads == 0 || cfg.d_model % cfg.heads != 0 {
                candle_core::bail!(
                    "d_model {} is not a multiple of heads {}",
                    cfg.d_model,
                    cfg.heads
                );
            }
            let vb = params.var_builder(DType::F32, device);
            let d = cfg.d_model;
            let blocks = (0..cfg.layers)
                .map(|i| {
                    let vb = vb.pp(format!("block{i}"));
                    Ok(Block {
                        ln1: Norm::new(d, vb.pp("ln1"))?,
                        qkv: candle_nn::linear(d, 3 * d, vb.pp("qkv"))?,
                        proj: candle_nn::linear(d, d, vb.pp("proj"))?,
                        ln2: Norm::new(d, vb.pp("ln2"))?,
                        fc1: candle_nn::linear(d, 4 * d, vb.pp("fc1"))?,
                        fc2: candle_nn::linear(4 * d, d, vb.pp("fc2"))?,
                    })
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Ok(Self {
                cfg,
                tok: candle_nn::embedding(VOCAB, d, vb.pp("tok"))?,
                pos: candle_nn::embedding(cfg.max_len, d, vb.pp("pos"))?,
                blocks,
                ln_f: Norm::new(d, vb.pp("ln_f"))?,
                head: candle_nn::linear(d, CLASSES, vb.pp("head"))?,
                params,
            })
        }

        pub fn num_params(&self) -> usize {
            self.params
                .named_parameters()
                .iter()
                .map(|(_, v)| v.elem_count())
                .sum()
        }

        fn attention(
            &self,
            block: &Block,
            x: &Tensor,
            bias: &Tensor,
        ) -> candle_core::Result<Tensor> {
            let (b, t, d) = x.dims3()?;
            let h = self.cfg.heads;
            let dh = d / h;
            let qkv = block
                .qkv
                .forward(x)?
                .reshape((b, t, 3, h, dh))?
                .permute((2, 0, 3, 1, 4))?;
            let q = qkv.get(0)?.contiguous()?;
            let k = qkv.get(1)?.contiguous()?;
            let v = qkv.get(2)?.contiguous()?;
            let scores = (q.matmul(&k.t()?)? * (1.0 / (dh as f64).sqrt()))?.broadcast_add(bias)?;
            let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
            let out = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
            block.proj.forward(&out)
        }

        /// Logits `[batch, classes]`.
        pub fn logits(&self, batch: &TokenBatch) -> candle_core::Result<Tensor> {
            let mut x = self
                .tok
                .forward(&batch.ids)?
                .broadcast_add(&self.pos.forward(&batch.positions)?)?;
            for block in &self.blocks {
                x = (&x + self.attention(block, &block.ln1.forward(&x)?, &batch.attn_bias)?)?;
                let y = block
                    .fc2
                    .forward(&block.fc1.forward(&block.ln2.forward(&x)?)?.gelu()?)?;
                x = (x + y)?;
            }
            let x = self.ln_f.forward(&x)?;
            let summed = x.broadcast_mul(&batch.mask)?.sum(1)?;
            let counts = batch.mask.sum(1)?;
            self.head.forward(&summed.broadcast_div(&counts)?)
        }
    }

    impl TrainModel for Transformer {
        type Batch = TokenBatch;
        fn per_example_loss(&self, batch: &TokenBatch) -> candle_core::Result<Tensor> {
            let log_probs = candle_nn::ops::log_softmax(&self.logits(batch)?, D::Minus1)?;
            log_probs
                .gather(&batch.labels.unsqueeze(1)?, 1)?
                .squeeze(1)?
                .neg()
        }
        fn named_parameters(&self) -> Vec<(String, Var)> {
            self.params.named_parameters()
        }
    }

    /// The benchmark's schedule: start at `per_device_train_batch_size`, +16 every
    /// 20 steps, at most 256 per device (mirrored by benches/compare/torch_transformer.py).
    pub const EVERY: usize = 20;
    pub const GROW: usize = 16;
    pub const MAX_BATCH: usize = 256;

    pub struct BenchTrainer {
        pub model: Transformer,
        pub opt: AdamW,
    }

    impl AdaptiveTrainer for BenchTrainer {
        type Model = Transformer;
        type Optimizer = AdamW;
        const POLICY: adabatch::TrainerPolicy = adabatch::TrainerPolicy {
            schedule: adabatch::ScheduleSpec::Interval {
                every: EVERY,
                growth: adabatch::Growth::Add(GROW as i64),
            },
            max_batch: Some(MAX_BATCH),
            drop_last: false,
            reweight: adabatch::Reweight::SampleCount,
            ..adabatch::TrainerPolicy::DEFAULT
        };
        fn parts(&mut self) -> (&mut Transformer, &mut AdamW) {
            (&mut self.model, &mut self.opt)
        }
    }

    pub fn optimizer(model: &Transformer, lr: f64) -> candle_core::Result<AdamW> {
        AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr,
                weight_decay: 0.01,
                ..Default::default()
            },
        )
    }
}

// ---------------------------------------------------------------------------
// bench and breakdown.

#[derive(Args, Clone)]
pub(crate) struct BenchOpts {
    /// The corpus: one sentence per line.
    #[arg(long)]
    data: PathBuf,
    #[command(flatten)]
    model: transformer::Config,
    /// `cuda`, `cuda:N` or `cpu`.
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Ranks (GPUs) on this node; > 1 uses NCCL when built with `nccl`.
    #[arg(long, default_value_t = 1)]
    nproc_per_node: usize,
    /// Timed optimisation steps.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Untimed steps first (kernel loading, allocator warm-up).
    #[arg(long, default_value_t = 20)]
    warmup_steps: usize,
    /// Initial per-device batch size (then +16 every 20 steps, at most 256).
    #[arg(long, default_value_t = 32)]
    per_device_train_batch_size: usize,
    #[arg(long, default_value_t = 3e-4)]
    learning_rate: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Allow TF32 in f32 matmuls (PyTorch: `--tf32`).
    #[arg(long)]
    tf32: bool,
    /// Write the timed run's batches (dataset indices, one list per step) here, for
    /// `benches/compare/torch_transformer.py --plan` (one rank only).
    #[arg(long)]
    plan_out: Option<PathBuf>,
}

#[path = "support/memory_bench.rs"]
pub(crate) mod memory_bench;

pub(crate) mod bench {
    use super::transformer::{self, BenchTrainer, Example, Transformer};
    use super::*;

    fn set_tf32(on: bool) {
        #[cfg(feature = "cuda")]
        candle_core::cuda::set_gemm_reduced_precision_f32(on);
        let _ = on;
    }

    fn args(opts: &BenchOpts, steps: usize) -> TrainingArgs {
        TrainingArgs {
            device: opts.device.clone(),
            nproc_per_node: opts.nproc_per_node,
            seed: Some(opts.seed),
            max_steps: Some(steps),
            per_device_train_batch_size: opts.per_device_train_batch_size,
            learning_rate: opts.learning_rate,
            logging_steps: steps.max(1),
            quiet: true,
            ..TrainingArgs::default()
        }
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
            adabatch::launch(
                &data,
                &transformer::collate,
                &args(opts, opts.warmup_steps),
                factory(opts),
            )?
            .summary;
        }
        let plan: Mutex<Vec<Vec<usize>>> = Mutex::new(Vec::new());
        let recording = |items: &[Example], device: &Device| {
            plan.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(items.iter().map(|e| e.index).collect());
            transformer::collate(items, device)
        };
        eprintln!("bench: {} timed steps ...", opts.steps);
        let summary =
            adabatch::launch(&data, &recording, &args(opts, opts.steps), factory(opts))?.summary;
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

    /// Mean seconds per section.
    #[derive(Default)]
    struct Split {
        host: f64,
        forward: f64,
        backward: f64,
        all_reduce: f64,
        optimizer: f64,
    }

    pub fn breakdown(opts: &BenchOpts) -> AnyResult<bool> {
        set_tf32(opts.tf32);
        let data = transformer::load(&opts.data, opts.model.max_len)?;
        let device = parse_device(&opts.device)?;
        #[cfg(feature = "nccl")]
        let (comm, device): (Box<dyn Communicator>, Device) = if device.is_cuda() {
            let ordinal = match device.location() {
                candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
                _ => 0,
            };
            let (comm, dev) = adabatch::Nccl::group_on(&[ordinal])?.remove(0);
            (Box::new(comm), dev)
        } else {
            (Box::new(adabatch::Single), device)
        };
        #[cfg(not(feature = "nccl"))]
        let comm: Box<dyn Communicator> = Box::new(adabatch::Single);
        let comm_name = if comm.world_size() == 1 && device.is_cuda() && cfg!(feature = "nccl") {
            "nccl (world 1)"
        } else {
            "single (no-op)"
        };
        let model = Transformer::new(opts.model, Parameters::new(opts.seed), &device)?;
        let mut opt = transformer::optimizer(&model, opts.learning_rate)?;
        let params = model.named_parameters();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed);
        let mut order: Vec<usize> = (0..data.len()).collect();
        let mut cursor = data.len();
        let mut split = Split::default();
        let mut examples = 0usize;
        let total = opts.warmup_steps + opts.steps;
        let sync = || device.synchronize();
        let mut timed_wall = 0.0;
        for step in 1..=total {
            let size = (opts.per_device_train_batch_size
                + transformer::GROW * ((step - 1) / transformer::EVERY))
                .min(transformer::MAX_BATCH);
            let timed = step > opts.warmup_steps;
            sync()?;
            let t0 = Instant::now();
            // host: pick examples, collate, copy to the device.
            if cursor + size > order.len() {
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                cursor = 0;
            }
            let items: Vec<Example> = order[cursor..cursor + size.min(order.len())]
                .iter()
                .map(|&i| data[i].clone())
                .collect();
            cursor += items.len();
            let batch = transformer::collate(&items, &device)?;
            sync()?;
            let t1 = Instant::now();
            let losses = model.per_example_loss(&batch)?;
            let loss = (losses.sum_all()? / items.len() as f64)?;
            let loss_value = loss.to_scalar::<f32>()?;
            sync()?;
            let t2 = Instant::now();
            let grads = loss.backward()?;
            sync()?;
            let t3 = Instant::now();
            let mut tensors: Vec<Tensor> = params
                .iter()
                .map(|(_, v)| {
                    grads
                        .get(v.as_tensor())
                        .cloned()
                        .map_or_else(|| v.as_tensor().zeros_like(), Ok)
                })
                .collect::<candle_core::Result<_>>()?;
            let mut scalars = [f64::from(loss_value), items.len() as f64, 0.0, 0.0];
            comm.all_reduce_sum(&mut tensors, &mut scalars)?;
            sync()?;
            let t4 = Instant::now();
            let mut store = GradStore::default();
            for ((_, var), g) in params.iter().zip(tensors) {
                store.insert(var.as_tensor(), g);
            }
            opt.step(&store)?;
            sync()?;
            let t5 = Instant::now();
            if timed {
                split.host += (t1 - t0).as_secs_f64();
                split.forward += (t2 - t1).as_secs_f64();
                split.backward += (t3 - t2).as_secs_f64();
                split.all_reduce += (t4 - t3).as_secs_f64();
                split.optimizer += (t5 - t4).as_secs_f64();
                timed_wall += (t5 - t0).as_secs_f64();
                examples += items.len();
            }
            if !loss_value.is_finite() {
                return Err(format!("loss is {loss_value} at step {step}").into());
            }
        }
        let n = opts.steps.max(1) as f64;
        let ms = |s: f64| s / n * 1e3;
        let frac = |s: f64| s / timed_wall.max(f64::MIN_POSITIVE);
        emit(&json!({
            "breakdown": "transformer_classifier",
            "device": opts.device,
            "communicator": comm_name,
            "steps": opts.steps,
            "samples_per_s_with_syncs": examples as f64 / timed_wall.max(f64::MIN_POSITIVE),
            "ms_per_step": {
                "host_collate_and_copy": ms(split.host),
                "forward": ms(split.forward),
                "backward": ms(split.backward),
                "all_reduce": ms(split.all_reduce),
                "optimizer": ms(split.optimizer),
                "total": ms(timed_wall),
            },
            "fraction": {
                "host_collate_and_copy": frac(split.host),
                "forward": frac(split.forward),
                "backward": frac(split.backward),
                "all_reduce": frac(split.all_reduce),
                "optimizer": frac(split.optimizer),
            },
            "note": "device synchronised between sections (so the sum exceeds an unsynchronised step); forward includes reading the loss back",
        }));
        Ok(true)
    }
}

// ---------------------------------------------------------------------------
// memory: free/total and per-step figures.

#[derive(Args)]
pub(crate) struct MemoryOpts {
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

pub(crate) mod memory {
    use super::transformer::{self, Example, Transformer};
    use super::*;

    pub fn run(opts: &MemoryOpts) -> AnyResult<bool> {
        let device = parse_device(&opts.device)?;
        let info = adabatch::memory::device::memory_info(&device);
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
}
