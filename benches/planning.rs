//! Batch-planning benchmark: times `LengthIndex::new` (sort longest first, prefix
//! sums) plus `plan_epoch` in memory mode on a lengths TSV written by
//! `benches/compare/planning/gen_lengths.py` (header `token\tword\tchar`; only the token
//! column is used), with two memory models: the analytic `PaddedTokens` and an
//! `OnlineMemoryModel` fitted first on a few synthetic observations
//! (`cpu_memory_proxy`). Prints one JSON object per (size, model).
//!
//! ```text
//! cargo bench -p adabatch-benches --bench planning -- \
//!   --lengths benches/compare/planning/lengths.tsv --baseline-size 32 --threshold 0.9 \
//!   --max-range 4.0 --max-growth 0.2 --keep-first 5 --repeat 7
//! ```
//!
//! See `benches/compare/planning/run.sh`, which also times dynabatch on the same lengths.

use std::time::Instant;

use adabatch::data::length::{LengthAwareEpoch, LengthBatching, LengthIndex, LengthOptions};
use adabatch::memory::memory_model::{cpu_memory_proxy, PaddedTokens};
use adabatch::{BatchFeatures, MemoryModel, OnlineMemoryModel};
use clap::Parser;

/// Time adabatch's length-aware batch planning.
#[derive(Parser, Debug)]
struct Args {
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// Lengths TSV (header line, then `token\tword\tchar` per example).
    #[arg(long)]
    lengths: String,
    /// Prefix sizes to time (default: every example in the file).
    #[arg(long, num_args = 1..)]
    n: Vec<usize>,
    /// Timed repetitions per (size, model), after one untimed warm-up; the median is reported.
    #[arg(long, default_value_t = 7)]
    repeat: usize,
    /// Examples in the first (longest) batch: the memory baseline.
    #[arg(long, default_value_t = 32)]
    baseline_size: usize,
    /// Largest predicted memory relative to the first batch.
    #[arg(long, default_value_t = 0.9)]
    threshold: f64,
    /// Largest batch size as a multiple of the baseline size.
    #[arg(long, default_value_t = 4.0)]
    max_range: f64,
    /// Largest growth between consecutive batches, as a fraction of the baseline
    /// size (negative: unlimited). 0.2 mirrors dynabatch's default smoothing.
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    max_growth: f64,
    /// Batches kept first, in order, when shuffling (dynabatch's default is 5).
    #[arg(long, default_value_t = 5)]
    keep_first: usize,
    /// Shuffle seed.
    #[arg(long, default_value_t = 21)]
    seed: u64,
    /// Safety margin of the online memory model.
    #[arg(long, default_value_t = 0.05)]
    margin: f64,
}

fn read_token_lengths(path: &str) -> Vec<usize> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("token"),
        "{path}: expected a `token\\tword\\tchar` header, got {header:?}"
    );
    lines
        .filter(|line| !line.is_empty())
        .map(|line| {
            let token = line.split('\t').next().unwrap_or_default();
            token
                .parse()
                .unwrap_or_else(|e| panic!("{path}: bad token length {token:?}: {e}"))
        })
        .collect()
}

/// An online memory model fitted on a grid of synthetic batch shapes, measured
/// with the deterministic CPU proxy (4 KiB per padded token + 64 B per attention score).
fn fitted_online_model(margin: f64) -> OnlineMemoryModel {
    let mut model = OnlineMemoryModel::new(margin);
    for batch_size in [8, 32, 128] {
        for max_len in [16, 64, 256] {
            let features = BatchFeatures::of_lengths(std::iter::repeat_n(max_len, batch_size));
            model.observe(&features, cpu_memory_proxy(&features));
        }
    }
    assert!(
        model.coefficients().is_some(),
        "the online model did not fit"
    );
    model
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Whether the plan draws every one of `n` examples exactly once.
fn covers_each_once(plan: &LengthAwareEpoch, n: usize) -> bool {
    if plan.order.len() != n || plan.sizes.iter().sum::<usize>() != n {
        return false;
    }
    let mut seen = vec![false; n];
    plan.order
        .iter()
        .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
}

fn main() {
    let args = Args::parse();
    let all = read_token_lengths(&args.lengths);
    let sizes = if args.n.is_empty() {
        vec![all.len()]
    } else {
        args.n.clone()
    };
    let batching = LengthBatching::Memory {
        baseline_size: args.baseline_size,
        threshold: args.threshold,
        max_range: args.max_range,
    };
    let options = LengthOptions {
        friendly_sizes: false,
        even_sizes: false,
        max_growth: (args.max_growth >= 0.0).then_some(args.max_growth),
        keep_first: args.keep_first,
        shuffle: true,
    };
    let online = fitted_online_model(args.margin);
    let models: [(&str, &dyn MemoryModel); 2] = [
        ("PaddedTokens", &PaddedTokens),
        ("OnlineMemoryModel", &online),
    ];

    for &n in &sizes {
        assert!(
            n <= all.len(),
            "{}: {} examples, fewer than {n}",
            args.lengths,
            all.len()
        );
        let lengths = &all[..n];
        for (name, model) in models {
            let (mut index_s, mut plan_s, mut total_s) = (Vec::new(), Vec::new(), Vec::new());
            let mut plan = None;
            for rep in 0..=args.repeat {
                let t0 = Instant::now();
                let index = LengthIndex::new(lengths);
                let t1 = Instant::now();
                let p = index.plan_epoch(batching, &options, model, args.seed, 0);
                let t2 = Instant::now();
                if rep > 0 {
                    index_s.push((t1 - t0).as_secs_f64());
                    plan_s.push((t2 - t1).as_secs_f64());
                    total_s.push((t2 - t0).as_secs_f64());
                }
                plan = Some(p);
            }
            let plan = plan.expect("at least one repetition");
            // Largest prediction after the first (baseline) batch, which is 1.0 by definition.
            let max_predicted = plan.predicted[1..].iter().copied().fold(f64::NAN, f64::max);
            let result = serde_json::json!({
                "side": "adabatch",
                "model": name,
                "n": n,
                "seconds": median(&mut total_s),
                "seconds_min": total_s.first().copied(),
                "index_seconds": median(&mut index_s),
                "plan_seconds": median(&mut plan_s),
                "repeat": args.repeat,
                "batches": plan.sizes.len(),
                "mean_batch_size": n as f64 / plan.sizes.len() as f64,
                "first_batch_size": plan.sizes.first().copied(),
                "max_batch_size": plan.sizes.iter().max().copied(),
                "max_predicted": max_predicted,
                "covers_each_example_once": covers_each_once(&plan, n),
                "baseline_size": args.baseline_size,
                "threshold": args.threshold,
                "max_range": args.max_range,
                "max_growth": options.max_growth,
                "keep_first": args.keep_first,
            });
            println!("{result}");
        }
    }
}
