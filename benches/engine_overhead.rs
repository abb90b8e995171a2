//! Engine overhead: one epoch through `adabatch::train` against the same epoch
//! written as a plain candle loop.
//!
//! Both sides train the same seeded MLP (64 → 256 → 256 → 10, ReLU) on the same
//! synthetic data with AdamW, drawing identical global batches from
//! [`GlobalBatchSampler`]. Before timing anything the bench checks that both sides
//! produce the same step losses and the same final weights, so the timed work is
//! the same work.
//!
//! ```text
//! cargo bench -p adabatch-benches --bench engine_overhead
//! ```
//!
//! After criterion's groups, a paired run (hand and engine epochs interleaved,
//! order alternating) prints the engine/hand ratio per batch size, in wall time
//! and in CPU time of the bench thread; `ENGINE_OVERHEAD_PAIRS=N` sets its rounds
//! (default 10, 0 skips it). candle runs single-threaded unless
//! `RAYON_NUM_THREADS` is set. `ENGINE_OVERHEAD_ONLY=engine:8:20` (or `hand:…`, `fused:…`)
//! runs only those epochs, for `perf stat` / `perf record`.
//!
//! The engine keeps freed host memory between steps (`memory::host`); the bench
//! does the same before any epoch, so hand-written loops run on the same heap.
//! `ENGINE_OVERHEAD_RELEASE_FREED=1` runs every side on glibc's default heap.

use std::hint::black_box;
use std::time::{Duration, Instant};

use adabatch::{AdaptiveTrainer, TrainerPolicy};
use candle_core::{Device, Tensor};
use criterion::{BatchSize, Criterion, SamplingMode};

#[path = "support/cpu_time.rs"]
mod cpu_time;
#[path = "support/engine_mlp.rs"]
mod engine_mlp;
use engine_mlp::*;

const FEATURES: usize = 64;
const HIDDEN: usize = 256;
const CLASSES: usize = 10;
const EXAMPLES: usize = 4096;
const SEED: u64 = 1234;
const LEARNING_RATE: f64 = 1e-3;
const BATCH_SIZES: [usize; 2] = [64, 8];

fn bench_batch_size(c: &mut Criterion, data: &[Example], batch_size: usize) {
    let mut group = c.benchmark_group(format!("engine_overhead_bs{batch_size}"));
    // About 20 epochs per function: an epoch takes ~0.1 s at batch 64 and ~0.5 s at
    // batch 8 on an idle core; criterion runs longer (and says so) when it must.
    let seconds = if batch_size >= 64 { 4 } else { 12 };
    group
        .sample_size(20)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(seconds));
    group.bench_function("hand_loop", |b| {
        b.iter_batched(
            fresh_trainer,
            |mut trainer| {
                let losses = hand_epoch(&mut trainer, data, batch_size).expect("hand epoch");
                black_box((losses, trainer))
            },
            BatchSize::PerIteration,
        )
    });
    let args = engine_args(batch_size);
    group.bench_function("engine", |b| {
        b.iter_batched(
            fresh_trainer,
            |trainer| black_box(engine_epoch(trainer, data, &args).expect("engine epoch")),
            BatchSize::PerIteration,
        )
    });
    group.finish();
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

/// CPU time of the calling thread.
fn thread_cpu_time() -> Option<f64> {
    cpu_time::cpu_time(cpu_time::THREAD)
}

/// Wall and thread-CPU seconds of `f`.
fn timed(f: impl FnOnce()) -> (f64, Option<f64>) {
    let (cpu, wall) = (thread_cpu_time(), Instant::now());
    f();
    let wall = wall.elapsed().as_secs_f64();
    (
        wall,
        thread_cpu_time().zip(cpu).map(|(end, start)| end - start),
    )
}

/// Medians and the ratio engine/hand of paired samples.
fn summarise(label: &str, hand: &mut [f64], engine: &mut [f64]) -> String {
    let mut ratios: Vec<f64> = engine.iter().zip(hand.iter()).map(|(e, h)| e / h).collect();
    let (lo, hi) = (
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(0.0, f64::max),
    );
    let (h, e) = (median(hand), median(engine));
    format!(
        "{label}: hand {:.1} ms, engine {:.1} ms, engine/hand {:.4} \
         (per-round ratios: median {:.4}, range {lo:.4}..{hi:.4})",
        h * 1e3,
        e * 1e3,
        e / h,
        median(&mut ratios)
    )
}

/// Hand and engine epochs interleaved (order alternating between rounds, so drift
/// and background load hit both sides alike); prints medians and the ratio, in wall
/// time and in CPU time of the bench thread.
fn paired_ratio(data: &[Example], batch_size: usize, rounds: usize) {
    let args = engine_args(batch_size);
    let time_hand = || {
        let mut trainer = fresh_trainer();
        timed(|| {
            black_box(hand_epoch(&mut trainer, data, batch_size).expect("hand epoch"));
        })
    };
    let time_engine = || {
        let trainer = fresh_trainer();
        timed(|| {
            black_box(engine_epoch(trainer, data, &args).expect("engine epoch"));
        })
    };
    let mut samples = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds {
        let (h, e) = if round % 2 == 0 {
            let h = time_hand();
            (h, time_engine())
        } else {
            let e = time_engine();
            (time_hand(), e)
        };
        samples[0].push(h.0);
        samples[1].push(e.0);
        if let (Some(h), Some(e)) = (h.1, e.1) {
            samples[2].push(h);
            samples[3].push(e);
        }
    }
    let [wall_hand, wall_engine, cpu_hand, cpu_engine] = &mut samples;
    println!("paired, batch size {batch_size}, {rounds} rounds (target engine/hand <= 1.01):");
    println!("  {}", summarise("wall", wall_hand, wall_engine));
    if !cpu_hand.is_empty() {
        println!("  {}", summarise("cpu ", cpu_hand, cpu_engine));
    }
}

/// `ENGINE_OVERHEAD_ONLY=<hand|engine|fused>:<batch size>:<epochs>`: runs just those
/// epochs (`fused`: the engine with adabatch's AdamW) (no checks, no criterion), for `perf stat` / `perf record`.
fn profile_only(data: &[Example], spec: &str) {
    let usage = "ENGINE_OVERHEAD_ONLY=<hand|engine|fused>:<batch size>:<epochs>";
    let parts: Vec<&str> = spec.split(':').collect();
    let [side, batch_size, epochs] = parts[..] else {
        panic!("{usage}, got `{spec}`");
    };
    let batch_size: usize = batch_size.parse().expect(usage);
    let epochs: usize = epochs.parse().expect(usage);
    let args = engine_args(batch_size);
    let (wall, cpu) = timed(|| {
        for _ in 0..epochs {
            match side {
                "hand" => {
                    let mut trainer = fresh_trainer();
                    black_box(hand_epoch(&mut trainer, data, batch_size).expect("hand epoch"));
                }
                "engine" => {
                    black_box(engine_epoch(fresh_trainer(), data, &args).expect("engine epoch"));
                }
                "fused" => {
                    let mut trainer = fresh_fused_trainer();
                    black_box(
                        adabatch::Run::new(data, &collate, &args)
                            .train(&mut trainer)
                            .expect("epoch"),
                    );
                }
                _ => panic!("{usage}, got `{spec}`"),
            }
        }
    });
    println!(
        "{side}, batch size {batch_size}, {epochs} epochs: wall {:.1} ms/epoch, cpu {:.1} ms/epoch",
        wall * 1e3 / epochs as f64,
        cpu.unwrap_or(f64::NAN) * 1e3 / epochs as f64
    );
}

/// The same trainer with adabatch's checkpointable AdamW (fused in place on CPU).
struct FusedTrainer {
    model: Mlp,
    opt: adabatch::optim::AdamW,
}

impl AdaptiveTrainer for FusedTrainer {
    type Model = Mlp;
    type Optimizer = adabatch::optim::AdamW;
    const POLICY: TrainerPolicy = MlpTrainer::POLICY;
    fn parts(&mut self) -> (&mut Mlp, &mut adabatch::optim::AdamW) {
        (&mut self.model, &mut self.opt)
    }
}

fn fresh_fused_trainer() -> FusedTrainer {
    let model = Mlp::new(&Device::Cpu).expect("build the MLP");
    let opt = adabatch::optim::AdamW::new(
        model.params.all_vars(),
        adabatch::optim::ParamsAdamW {
            lr: LEARNING_RATE,
            ..Default::default()
        },
    )
    .expect("build AdamW");
    FusedTrainer { model, opt }
}

/// `ENGINE_OVERHEAD_EXPORT=<dir>`: what `benches/compare/torch_adamw.py` needs to
/// train the same epoch in PyTorch: the data and the initial weights
/// (`mlp.safetensors`), each batch size's batches in order (`batches_<b>.json`),
/// and the weights after adabatch's epoch with its fused AdamW
/// (`final_<b>.safetensors`, with the last loss in `final_<b>.json`).
fn export_for_torch(data: &[Example], dir: &std::path::Path) {
    use std::collections::HashMap;
    std::fs::create_dir_all(dir).expect("create the export directory");
    let device = Device::Cpu;
    let features: Vec<f32> = data.iter().flat_map(|e| e.features).collect();
    let labels: Vec<i64> = data.iter().map(|e| i64::from(e.label)).collect();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    tensors.insert(
        "features".into(),
        Tensor::from_vec(features, (data.len(), FEATURES), &device).expect("features"),
    );
    tensors.insert(
        "labels".into(),
        Tensor::from_vec(labels, data.len(), &device).expect("labels"),
    );
    for (name, var) in fresh_fused_trainer().model.params.named_parameters() {
        tensors.insert(name, var.as_tensor().clone());
    }
    candle_core::safetensors::save(&tensors, dir.join("mlp.safetensors")).expect("save");
    for batch_size in BATCH_SIZES {
        let mut sampler =
            adabatch::data::sampler::GlobalBatchSampler::new(data.len(), 1, SEED, true, false)
                .expect("non-empty data");
        let mut batches = Vec::new();
        while let Some(step) = sampler.next_step(batch_size) {
            batches.push(step.indices);
        }
        let json = serde_json::to_string(&batches).expect("plain JSON");
        std::fs::write(dir.join(format!("batches_{batch_size}.json")), json).expect("write");
        let mut trainer = fresh_fused_trainer();
        let summary = adabatch::Run::new(data, &collate, &engine_args(batch_size))
            .train(&mut trainer)
            .expect("epoch");
        let finals: HashMap<String, Tensor> = trainer
            .model
            .params
            .named_parameters()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(
            &finals,
            dir.join(format!("final_{batch_size}.safetensors")),
        )
        .expect("save");
        let last = serde_json::json!({ "last_loss": summary.step_losses.last() });
        std::fs::write(
            dir.join(format!("final_{batch_size}.json")),
            last.to_string(),
        )
        .expect("write");
    }
    println!("exported to {}", dir.display());
}

/// `ENGINE_OVERHEAD_OPTIMIZER=<rounds>`: engine epochs with candle's AdamW and with
/// adabatch's fused AdamW interleaved, same model, data and batches; prints medians
/// and the ratio candle/adabatch (speed-up), after checking both end alike.
///
/// `ENGINE_OVERHEAD_BATCH_SIZE=<b>` runs one batch size only: glibc's default heap
/// adapts its thresholds to the largest blocks freed so far, so a batch size's
/// times on it depend on what ran before in the process.
fn optimizer_comparison(data: &[Example], rounds: usize) {
    let batch_sizes: Vec<usize> = match std::env::var("ENGINE_OVERHEAD_BATCH_SIZE") {
        Ok(b) => vec![b.parse().expect("ENGINE_OVERHEAD_BATCH_SIZE=<batch size>")],
        Err(_) => BATCH_SIZES.to_vec(),
    };
    for batch_size in batch_sizes {
        let args = engine_args(batch_size);
        let mut fused = fresh_fused_trainer();
        let fused_params = fused.model.params.clone();
        let a = adabatch::Run::new(data, &collate, &args)
            .train(&mut fused)
            .expect("fused epoch");
        let candle = fresh_trainer();
        let candle_params = candle.model.params.clone();
        let b = engine_epoch(candle, data, &args).expect("candle epoch");
        let diff = weights(&fused_params)
            .iter()
            .zip(weights(&candle_params))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        println!(
            "batch size {batch_size}: final loss adabatch {:.6} / candle {:.6}, max weight difference {diff:.2e}",
            a.step_losses.last().unwrap_or(&f64::NAN),
            b.step_losses.last().unwrap_or(&f64::NAN)
        );
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let time_fused = || {
                let mut t = fresh_fused_trainer();
                timed(|| {
                    black_box(
                        adabatch::Run::new(data, &collate, &args)
                            .train(&mut t)
                            .expect("epoch"),
                    );
                })
                .0
            };
            let time_candle = || {
                let t = fresh_trainer();
                timed(|| {
                    black_box(engine_epoch(t, data, &args).expect("epoch"));
                })
                .0
            };
            if round % 2 == 0 {
                ours.push(time_fused());
                theirs.push(time_candle());
            } else {
                theirs.push(time_candle());
                ours.push(time_fused());
            }
        }
        let (o, t) = (median(&mut ours), median(&mut theirs));
        println!(
            "batch size {batch_size}, {rounds} rounds: engine epoch with adabatch AdamW {:.1} ms, with candle AdamW {:.1} ms, speed-up {:.2}x",
            o * 1e3,
            t * 1e3,
            t / o
        );
    }
}

fn main() {
    // candle's CPU kernels run on one thread unless RAYON_NUM_THREADS says otherwise:
    // the engine's overhead is serial bookkeeping, and a multi-threaded gemm on these
    // small matrices mostly measures scheduler contention on a shared machine. It
    // also makes the thread-CPU-time figures cover all the work.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    if std::env::var_os("ENGINE_OVERHEAD_RELEASE_FREED").is_none() {
        adabatch::memory::host::keep_freed_memory();
    }
    let data = dataset();
    if let Some(dir) = std::env::var_os("ENGINE_OVERHEAD_EXPORT") {
        export_for_torch(&data, std::path::Path::new(&dir));
        return;
    }
    if let Some(rounds) = std::env::var("ENGINE_OVERHEAD_OPTIMIZER")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        optimizer_comparison(&data, rounds);
        return;
    }
    if let Some(spec) = std::env::var_os("ENGINE_OVERHEAD_ONLY") {
        profile_only(&data, &spec.to_string_lossy());
        return;
    }
    for batch_size in BATCH_SIZES {
        check_equivalence(&data, batch_size);
    }

    let mut criterion = Criterion::default().configure_from_args();
    for batch_size in BATCH_SIZES {
        bench_batch_size(&mut criterion, &data, batch_size);
    }
    criterion.final_summary();

    // Only when actually benchmarking (`cargo bench`), not under `cargo test --benches`
    // or `--list`.
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let benchmarking = has("--bench") && !has("--test") && !has("--list");
    let rounds = std::env::var("ENGINE_OVERHEAD_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    if benchmarking && rounds > 0 {
        for batch_size in BATCH_SIZES {
            paired_ratio(&data, batch_size, rounds);
        }
    }
}
