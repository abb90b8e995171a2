//! One binary for the checks and benchmarks that need a GPU (feature `cuda`; the
//! `nccl` subcommand needs `nccl`). Build it with `scripts/build-gpu-check.sh`;
//! how to run it on a GPU machine is in `docs/guide/gpu.md`.
//!
//! ```text
//! gpu_check kernels                # adabatch-nn's CUDA bodies against their CPU twins; fused vs composite ms
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
//! One module per subcommand; `transformer` is the model of all but `replay` and
//! `nccl`, which train the replay-dataloader model (`examples/support/`).

use std::process::ExitCode;

use candle_core::Device;
use clap::{Parser, Subcommand};
use serde_json::Value;

mod batching;
mod bench;
mod breakdown;
mod kernels;
mod memory;
mod nccl;
mod oom;
mod replay;
mod transformer;

/// The replay-dataloader model, shared with `examples/replay_dataloader.rs`.
#[path = "../support/replay_model.rs"]
mod replay_model;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser)]
#[command(about = "adabatch GPU checks and benchmarks (feature `cuda`)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// adabatch-nn's CUDA bodies (norms, softmax) against their CPU twins: values
    /// and gradients in each dtype; then fused against composite times.
    Kernels(kernels::KernelsOpts),
    /// Train the replay-dataloader model on CUDA and on CPU with the same seed and
    /// compare the per-step traces.
    Replay(replay::ReplayOpts),
    /// Check the NCCL communicator at world size 1 (feature `nccl`).
    Nccl(nccl::NcclOpts),
    /// Device memory: free/total, and per-step memory of growing batches.
    Memory(memory::MemoryOpts),
    /// Benchmark: a transformer classifier trained by adabatch, samples/s as JSON.
    Bench(bench::BenchOpts),
    /// Time split of a step: host, forward, backward, all-reduce, optimizer.
    Breakdown(bench::BenchOpts),
    /// Memory-aware batches vs the largest safe fixed batch vs token budget:
    /// tokens/s, peak memory, OOMs.
    Batching(batching::BatchingOpts),
    /// Real CUDA OOMs (a ballast tensor fills the device) recovered by `halve` and
    /// by `split_retry`.
    Oom(oom::OomOpts),
}

fn dispatch(cli: Cli) -> AnyResult<bool> {
    match cli.cmd {
        Cmd::Kernels(o) => kernels::run(&o),
        Cmd::Replay(o) => replay::run(&o),
        Cmd::Nccl(o) => nccl::run(&o),
        Cmd::Memory(o) => memory::run(&o),
        Cmd::Bench(o) => bench::run(&o),
        Cmd::Breakdown(o) => breakdown::run(&o),
        Cmd::Batching(o) => batching::run(&o),
        Cmd::Oom(o) => oom::run(&o),
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

/// One result line on stdout.
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
