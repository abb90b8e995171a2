//! Sampling at scale: memory per rank and time per step of planning global batches,
//! with the keyed constant-memory permutation against the former per-epoch
//! `Vec<usize>` permutation (kept below as `VecSampler` for comparison).
//!
//! ```text
//! cargo bench -p adabatch-benches --bench sampling                 # N = 1e6, 1e8, 1e9; 1 and 4096 ranks
//! SAMPLING_BENCH_VEC_1E9=1 cargo bench -p adabatch-benches --bench sampling   # also the 8 GB Vec case
//! cargo bench -p adabatch-benches --bench sampling -- --quick      # N = 1e6 only
//! ```
//!
//! Every configuration runs in a child process of its own (this binary, re-run with
//! `--child`), so its peak resident set (`VmHWM` of `/proc/self/status`) and its peak
//! heap (a counting global allocator) belong to that configuration alone. A child
//! simulates **one rank** of a `world`-rank run with 32 examples per rank and step:
//!
//! - `keyed` — `GlobalBatchSampler::next_local`: the rank computes only its own
//!   slice of each global batch (the mode the sampler now offers every rank);
//! - `keyed-global` — `GlobalBatchSampler::next_step`: the rank computes the whole
//!   global batch (what the engine asks for, as the logs record every rank's share);
//! - `vec` — the former sampler: a shuffled `Vec<usize>` of `0..N` per epoch, the
//!   global batch copied out of it each step.
//!
//! "epoch start" is the time to set up an epoch (building the sampler, which for
//! `vec` shuffles the whole permutation). "first step" times the first step alone,
//! "per step" is the mean over the timed steps. An epoch is timed whole when it has
//! at most `MAX_TIMED_STEPS` steps; longer epochs time that many steps and
//! extrapolate: epoch = epoch start + steps per epoch × per step (marked `*`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ops::Range;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use adabatch::data::sampler::{split_evenly, GlobalBatchSampler};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Counts live heap bytes and their peak.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const PER_DEVICE: usize = 32;
const SEED: u64 = 42;
const MAX_TIMED_STEPS: usize = 200_000;

/// The sampler as it was before the keyed permutation: one shuffled `Vec` per epoch.
struct VecSampler {
    num_examples: usize,
    world_size: usize,
    seed: u64,
    permutation: Vec<usize>,
    position: usize,
}

impl VecSampler {
    fn new(num_examples: usize, world_size: usize, seed: u64) -> Self {
        let mut s = Self {
            num_examples,
            world_size,
            seed,
            permutation: Vec::new(),
            position: 0,
        };
        s.permutation = s.permutation_of(0);
        s
    }

    fn permutation_of(&self, epoch: usize) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..self.num_examples).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(epoch as u64);
        perm.shuffle(&mut rng);
        perm
    }

    fn next_step(&mut self, per_device: usize) -> Option<(Vec<usize>, Vec<Range<usize>>)> {
        let remaining = self.num_examples - self.position;
        let wanted = per_device * self.world_size;
        if remaining == 0 {
            return None;
        }
        let take = wanted.min(remaining);
        let indices = self.permutation[self.position..self.position + take].to_vec();
        self.position += take;
        Some((indices, split_evenly(take, self.world_size)))
    }
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// One configuration, in this (child) process; prints one `RESULT` line.
fn child(kind: &str, n: usize, world: usize) {
    let rank = world / 2;
    let steps_per_epoch = n.div_ceil(PER_DEVICE * world);
    let timed = steps_per_epoch.min(MAX_TIMED_STEPS);
    let heap_before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(heap_before, Ordering::Relaxed);
    let mut step: Box<dyn FnMut() -> usize>;
    let t = Instant::now();
    match kind {
        "keyed" => {
            let mut s = GlobalBatchSampler::new(n, world, SEED, true, false).unwrap();
            step = Box::new(move || {
                let l = s.next_local(PER_DEVICE, rank).unwrap();
                black_box(&l.indices);
                l.indices.len()
            });
        }
        "keyed-global" => {
            let mut s = GlobalBatchSampler::new(n, world, SEED, true, false).unwrap();
            step = Box::new(move || {
                let g = s.next_step(PER_DEVICE).unwrap();
                black_box(g.local(rank)).len()
            });
        }
        "vec" => {
            let mut s = VecSampler::new(n, world, SEED);
            step = Box::new(move || {
                let (indices, splits) = s.next_step(PER_DEVICE).unwrap();
                black_box(&indices[splits[rank].clone()]).len()
            });
        }
        other => panic!("unknown sampler {other}"),
    }
    let start_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut drawn = step();
    let first_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 1..timed {
        drawn += step();
    }
    let rest_s = t.elapsed().as_secs_f64();
    black_box(drawn);
    let per_step_s = (first_s + rest_s) / timed as f64;
    let epoch_s = if timed == steps_per_epoch {
        start_s + first_s + rest_s
    } else {
        start_s + per_step_s * steps_per_epoch as f64
    };
    let heap_peak = PEAK.load(Ordering::Relaxed) - heap_before;
    println!(
        "RESULT {kind} {n} {world} {heap_peak} {} {start_s} {first_s} {per_step_s} {steps_per_epoch} {timed} {epoch_s}",
        vm_hwm_kib()
    );
}

fn human_bytes(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}

fn human_secs(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.2} s"),
        s if s >= 1e-3 => format!("{:.2} ms", s * 1e3),
        s if s >= 1e-6 => format!("{:.2} µs", s * 1e6),
        s => format!("{:.0} ns", s * 1e9),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let n = args[i + 2].parse().unwrap();
        let world = args[i + 3].parse().unwrap();
        child(&args[i + 1], n, world);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let vec_1e9 = std::env::var_os("SAMPLING_BENCH_VEC_1E9").is_some();
    let sizes: &[usize] = if quick {
        &[1_000_000]
    } else {
        &[1_000_000, 100_000_000, 1_000_000_000]
    };
    let exe = std::env::current_exe().unwrap();
    println!(
        "one rank simulated per row, {PER_DEVICE} examples per rank and step; * = epoch extrapolated from {MAX_TIMED_STEPS} timed steps"
    );
    println!("| sampler | N | ranks | peak heap / rank | VmHWM / rank | epoch start | first step | per step | steps / epoch | epoch |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in sizes {
        for world in [1usize, 4096] {
            for kind in ["keyed", "keyed-global", "vec"] {
                if kind == "keyed-global" && world == 1 {
                    continue; // the same as `keyed` on one rank
                }
                if kind == "vec" && n >= 1_000_000_000 && !vec_1e9 {
                    println!("| vec | {n} | {world} | (8 GB: set SAMPLING_BENCH_VEC_1E9=1) | | | | | | |");
                    continue;
                }
                let out = Command::new(&exe)
                    .args(["--child", kind, &n.to_string(), &world.to_string()])
                    .output()
                    .expect("child runs");
                let stdout = String::from_utf8_lossy(&out.stdout);
                let Some(line) = stdout.lines().find(|l| l.starts_with("RESULT ")) else {
                    println!(
                        "| {kind} | {n} | {world} | failed: {} |",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    continue;
                };
                let f: Vec<&str> = line.split_whitespace().collect();
                let num = |i: usize| f[i].parse::<f64>().unwrap();
                let (steps, timed) = (num(9), num(10));
                println!(
                    "| {kind} | {n:.0e} | {world} | {} | {} | {} | {} | {} | {steps:.0} | {}{} |",
                    human_bytes(num(4)),
                    human_bytes(num(5) * 1024.0),
                    human_secs(num(6)),
                    human_secs(num(7)),
                    human_secs(num(8)),
                    human_secs(num(11)),
                    if timed < steps { " *" } else { "" },
                );
            }
        }
    }
}
