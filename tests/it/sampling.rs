//! Property tests of sampling at scale: the keyed constant-memory permutation is a
//! bijection, places a fixed example uniformly over epochs, and every rank plans
//! its own slice of every global batch on its own, in agreement with the others.

use adabatch::data::permutation::Permutation;
use adabatch::data::sampler::{split_evenly, GlobalBatchSampler, LocalBatch};
use proptest::prelude::*;

/// Sizes that stress the power-of-two domain: tiny, prime, exact powers of two
/// and just above them (where the domain is almost twice the size), and random.
fn lengths() -> impl Strategy<Value = usize> {
    prop_oneof![
        1usize..=3,
        prop::sample::select(vec![
            5usize, 7, 11, 13, 31, 97, 127, 251, 509, 1021, 4093, 8191
        ]),
        (0u32..=14).prop_map(|k| 1usize << k),
        (1u32..=14, 1usize..4).prop_map(|(k, d)| (1usize << k) + d),
        1usize..10_000,
    ]
}

fn assert_bijection(p: &Permutation) -> Result<(), TestCaseError> {
    let mut seen = vec![false; p.len()];
    for (position, index) in p.range(0..p.len()).enumerate() {
        prop_assert!(index < p.len(), "index {} out of 0..{}", index, p.len());
        prop_assert!(!seen[index], "index {} drawn twice", index);
        seen[index] = true;
        prop_assert_eq!(p.position_of(index), position);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn permutation_is_a_bijection(
        n in lengths(),
        seed in any::<u64>(),
        source in 0u64..4,
        epoch in any::<u64>(),
    ) {
        let p = Permutation::new(n, seed, source, epoch);
        prop_assert!(p.domain() >= n as u64 && (n == 1 || p.domain() < 2 * n as u64));
        assert_bijection(&p)?;
    }

    #[test]
    fn large_permutations_invert_at_random_positions(
        n in 1usize..(1usize << 40),
        seed in any::<u64>(),
        epoch in 0u64..1_000,
        positions in prop::collection::vec(any::<u64>(), 1..64),
    ) {
        let p = Permutation::new(n, seed, 0, epoch);
        for position in positions {
            let position = (position % n as u64) as usize;
            let index = p.at(position);
            prop_assert!(index < n);
            prop_assert_eq!(p.position_of(index), position);
        }
    }
}

/// The `1 - alpha` quantile of the chi-square distribution with `df` degrees of
/// freedom (Wilson-Hilferty; within 1 % of the exact value for `df >= 5`).
fn chi_square_quantile(df: f64, z: f64) -> f64 {
    let v = 2.0 / (9.0 * df);
    df * (1.0 - v + z * v.sqrt()).powi(3)
}

/// Standard normal quantile for `alpha = 0.001` (upper tail).
const Z_999: f64 = 3.090_232;

/// Positions of a fixed example over many epochs follow the uniform distribution
/// on `0..N` (bucketed to at most 64 equal bins): Pearson's chi-square
/// goodness-of-fit test at significance level `alpha = 0.001` per case. The seeds
/// are fixed, so the test is deterministic and cannot flake; a failure means the
/// permutation family is biased, not bad luck of this run.
#[test]
fn positions_of_a_fixed_index_are_uniform_over_epochs() {
    const EPOCHS: u64 = 20_000;
    let cases: [(usize, u64); 9] = [
        (2, 1),
        (3, 7),
        (10, 42),
        (17, 3),
        (64, 5),
        (100, 11),
        (1_000, 13),
        (65_537, 17),
        (1_000_003, 19),
    ];
    for (n, seed) in cases {
        let bins = n.min(64);
        let mut widths = vec![0usize; bins];
        (0..n).for_each(|p| widths[p * bins / n] += 1);
        for index in [0, n / 2, n - 1] {
            let mut counts = vec![0u64; bins];
            for epoch in 0..EPOCHS {
                let position = Permutation::new(n, seed, 0, epoch).position_of(index);
                counts[position * bins / n] += 1;
            }
            // Expected count of a bin: epochs × (positions in the bin) / n.
            let chi2: f64 = counts
                .iter()
                .zip(&widths)
                .map(|(&observed, &width)| {
                    let expected = EPOCHS as f64 * width as f64 / n as f64;
                    (observed as f64 - expected).powi(2) / expected
                })
                .sum();
            let df = (bins - 1) as f64;
            let critical = if bins == 2 {
                10.828 // exact 0.999 quantile for one degree of freedom
            } else if bins == 3 {
                13.816 // two degrees of freedom
            } else {
                chi_square_quantile(df, Z_999)
            };
            assert!(
                chi2 < critical,
                "n = {n}, index {index}: chi-square {chi2:.2} >= {critical:.2} (df {df}, alpha 0.001), counts {counts:?}"
            );
        }
    }
}

/// One step of a planning script: the per-device size, and whether the step hits an
/// OOM and is rewound (to be drawn again at the next size).
type Op = (usize, bool);

/// What every rank of one planning run agrees on.
#[derive(Debug, Clone, Copy)]
struct Run {
    n: usize,
    world: usize,
    seed: u64,
    shuffle: bool,
    drop_last: bool,
    epochs: usize,
}

impl Run {
    fn sampler(&self) -> GlobalBatchSampler {
        GlobalBatchSampler::new(self.n, self.world, self.seed, self.shuffle, self.drop_last)
            .unwrap()
    }
}

/// One rank's plan of a run, computed on its own: per epoch, the committed local
/// batches in order.
fn plan_rank(run: &Run, ops: &[Op], rank: usize) -> Vec<Vec<LocalBatch>> {
    let mut sampler = run.sampler();
    let mut ops = ops.iter().cycle();
    let mut plan = Vec::new();
    for _ in 0..run.epochs {
        let mut steps = Vec::new();
        loop {
            let &(per_device, oom) = ops.next().unwrap();
            let Some(local) = sampler.next_local(per_device, rank) else {
                break;
            };
            if oom {
                sampler.rewind(local.global_size);
            } else {
                steps.push(local);
            }
        }
        plan.push(steps);
        sampler.start_next_epoch();
    }
    plan
}

fn worlds() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=8, 9usize..=4096, Just(4096)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Planning only, no training: each rank's slices are computed by its own
    /// sampler; in rank order they are the global batch, and each epoch draws every
    /// index exactly once (without `drop_last`) or a prefix of its permutation.
    #[test]
    fn plans_agree_across_ranks(
        n in 1usize..12_000,
        world in worlds(),
        seed in any::<u64>(),
        shuffle in any::<bool>(),
        drop_last in any::<bool>(),
        epochs in 1usize..3,
        ops in prop::collection::vec((1usize..6, prop::bool::weighted(0.1)), 1..6),
    ) {
        prop_assume!(ops.iter().any(|&(_, oom)| !oom));
        let run = Run { n, world, seed, shuffle, drop_last, epochs };
        let mut global = run.sampler();
        let ranks: Vec<_> = (0..world).map(|rank| plan_rank(&run, &ops, rank)).collect();
        let mut ops_iter = ops.iter().cycle();
        for epoch in 0..epochs {
            let permutation = global.permutation_of(epoch);
            let mut drawn = Vec::new();
            let mut step = 0;
            loop {
                let &(per_device, oom) = ops_iter.next().unwrap();
                let Some(batch) = global.next_step(per_device) else {
                    break;
                };
                if oom {
                    global.rewind(batch.global_size());
                    continue;
                }
                prop_assert_eq!(&batch.splits, &split_evenly(batch.global_size(), world));
                let mut joined = Vec::with_capacity(batch.global_size());
                for (rank, plan) in ranks.iter().enumerate() {
                    let local = &plan[epoch][step];
                    prop_assert_eq!(local.start, drawn.len());
                    prop_assert_eq!(local.global_size, batch.global_size());
                    prop_assert_eq!(&local.split, &batch.splits[rank]);
                    joined.extend_from_slice(&local.indices);
                }
                prop_assert_eq!(&joined, &batch.indices);
                drawn.extend_from_slice(&batch.indices);
                step += 1;
            }
            for plan in &ranks {
                prop_assert_eq!(plan[epoch].len(), step, "every rank takes the same steps");
            }
            prop_assert_eq!(&drawn[..], &permutation[..drawn.len()]);
            if drop_last {
                prop_assert!(n - drawn.len() < 6 * world);
            } else {
                prop_assert_eq!(drawn.len(), n);
                let mut sorted = drawn.clone();
                sorted.sort_unstable();
                prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            }
            prop_assert_eq!(global.train_coverage(), drawn.len() as f64 / n as f64);
            global.start_next_epoch();
        }
    }

    /// A sampler restored from `(epoch, position)` continues with the same batches.
    #[test]
    fn resume_needs_only_epoch_and_position(
        n in 1usize..5_000,
        world in 1usize..64,
        seed in any::<u64>(),
        per_device in 1usize..8,
        cut in 0usize..200,
    ) {
        let mut run = GlobalBatchSampler::new(n, world, seed, true, false).unwrap();
        let mut steps = 0;
        while steps < cut {
            if run.next_step(per_device).is_none() {
                run.start_next_epoch();
            }
            steps += 1;
        }
        let mut resumed = GlobalBatchSampler::new(n, world, seed, true, false).unwrap();
        resumed.restore(run.epoch_index(), run.position(), run.examples_seen());
        for _ in 0..20 {
            let (a, b) = (run.next_step(per_device), resumed.next_step(per_device));
            prop_assert_eq!(&a, &b);
            if a.is_none() {
                run.start_next_epoch();
                resumed.start_next_epoch();
            }
        }
        prop_assert_eq!(run.examples_seen(), resumed.examples_seen());
    }
}
