//! Memory-aware batching: the online memory model, `schedule = memory(..)` and
//! token-budget batching end to end on `Local` ranks.

use crate::common;

use adabatch::prelude::*;
use adabatch::{
    BatchFeatures, MemoryModel, OnlineMemoryModel, ScheduleSpec, StepLog, TrainerPolicy,
    WithLengths,
};
use candle_nn::AdamW;
use common::*;
use rand::{Rng, SeedableRng};

/// A synthetic device: a fixed cost, activations per padded token, attention
/// quadratic in length, and ±2 % deterministic noise.
fn synthetic_bytes(f: &BatchFeatures, noise: f64) -> u64 {
    let law = 2.0e6
        + 5_000.0 * f.padded_tokens as f64
        + 30.0 * f.batch_size as f64 * (f.max_len as f64).powi(2);
    (law * (1.0 + noise)) as u64
}

fn random_batch(rng: &mut impl Rng) -> BatchFeatures {
    let n = rng.random_range(1..64);
    BatchFeatures::of_lengths((0..n).map(|_| rng.random_range(4..400)))
}

#[test]
fn online_model_converges_and_stays_above_measurements() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut model = OnlineMemoryModel::new(0.05);
    for _ in 0..200 {
        let f = random_batch(&mut rng);
        model.observe(&f, synthetic_bytes(&f, rng.random_range(-0.02..0.02)));
    }
    let [c0, c1, c2] = model.coefficients().expect("fitted");
    assert!((c1 / 5_000.0 - 1.0).abs() < 0.05, "c1 = {c1}");
    assert!((c2 / 30.0 - 1.0).abs() < 0.05, "c2 = {c2}");
    assert!(c0.abs() < 1.0e7, "c0 = {c0}");
    // Fresh batches: never below the measurement (the margin covers the noise),
    // and not wildly above it (small batches carry the fixed cost's fit error).
    for _ in 0..500 {
        let f = random_batch(&mut rng);
        let measured = synthetic_bytes(&f, rng.random_range(-0.02..0.02)) as f64;
        let predicted = model.predict_bytes(&f).unwrap();
        assert!(predicted >= measured, "{predicted} < {measured} for {f:?}");
        assert!(
            predicted <= measured * 1.2,
            "{predicted} >> {measured} for {f:?}"
        );
    }
    // Relative predictions order batches like the law does.
    let long = BatchFeatures::of_lengths([300; 8]);
    let short = BatchFeatures::of_lengths([30; 8]);
    assert!(model.predict(&short, &long) < 0.5);
}

#[test]
fn online_model_before_any_fit_is_conservative() {
    let model = OnlineMemoryModel::new(0.1);
    let base = BatchFeatures::of_lengths([100; 4]);
    let same_tokens = BatchFeatures::of_lengths([50; 8]);
    assert!((model.predict(&same_tokens, &base) - 1.1).abs() < 1e-12);
}

const MEMORY_POLICY: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Memory {
        threshold: 0.9,
        max_range: 4.0,
    },
    ..TrainerPolicy::DEFAULT
};
hand_trainer!(MemoryTrainer, AdamW, MEMORY_POLICY);
hand_trainer!(PlainTrainer, AdamW, TrainerPolicy::DEFAULT);

fn varied_lengths(n: usize) -> WithLengths<Vec<Example>> {
    let data = dataset(n, 21);
    let lengths = (0..n).map(|i| 8 + (i * 53) % 120).collect();
    WithLengths::new(data, lengths).unwrap()
}

fn run_memory(
    world: usize,
    epochs: usize,
    a: impl FnOnce(&mut TrainingArgs),
) -> (TrainSummary, Vec<StepLog>) {
    let data = varied_lengths(90);
    let log = temp_log(&format!("memory-{world}-{epochs}"));
    let mut args = args(world, 2, epochs);
    args.logging.log_jsonl = Some(log.clone());
    a(&mut args);
    let summary = adabatch::Run::new(&data, &collate, &args)
        .launch(adamw_factory(|model, opt| MemoryTrainer { model, opt }))
        .map(|trained| trained.summary)
        .unwrap();
    (summary, read_log(&log))
}

fn assert_each_epoch_exactly_once(logs: &[StepLog], n: usize, epochs: usize) {
    let trained: Vec<usize> = logs.iter().flat_map(|l| l.indices.concat()).collect();
    assert_eq!(trained.len(), n * epochs);
    for chunk in trained.chunks(n) {
        let mut sorted = chunk.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn memory_schedule_grows_batches_on_shorter_inputs() {
    for world in [1, 3] {
        let (summary, logs) = run_memory(world, 2, |_| {});
        assert_each_epoch_exactly_once(&logs, 90, 2);
        let baseline = 2 * world;
        // Each epoch opens with the hardest batch at the baseline size.
        assert_eq!(logs[0].global_batch, baseline);
        assert!(
            logs.iter().any(|l| l.global_batch > 2 * baseline),
            "batches grew"
        );
        assert!(
            logs.iter().all(|l| l.global_batch <= 4 * baseline),
            "max_range respected"
        );
        for l in &logs {
            let predicted = l.predicted_memory.expect("memory mode logs predictions");
            // A batch grows only while the prediction stays under the threshold
            // (0.9); only a batch at the baseline size may be predicted above it.
            assert!(
                predicted <= 0.9 || l.global_batch <= baseline,
                "step {}: {predicted}",
                l.step
            );
            assert!(l.measured_memory.is_some());
        }
        assert!(summary.global_step < 2 * 90 / baseline);
    }
}

#[test]
fn token_budget_batching_respects_the_budget() {
    let data = varied_lengths(90);
    let index_lengths: Vec<usize> = (0..90).map(|i| data.example_len(i)).collect();
    let log = temp_log("token-budget");
    let mut a = args(2, 2, 1);
    a.length_aware.max_tokens_per_batch = Some(600);
    a.logging.log_jsonl = Some(log.clone());
    adabatch::Run::new(&data, &collate, &a)
        .launch(adamw_factory(|model, opt| PlainTrainer { model, opt }))
        .map(|trained| trained.summary)
        .unwrap();
    let logs = read_log(&log);
    assert_each_epoch_exactly_once(&logs, 90, 1);
    for l in &logs {
        let indices = l.indices.concat();
        let max_len = indices.iter().map(|&i| index_lengths[i]).max().unwrap();
        assert!(
            indices.len() * max_len <= 600 || indices.len() == 1,
            "step {}",
            l.step
        );
    }
}

/// A deterministic user model: twice as cautious as padded tokens.
struct Cautious;
impl MemoryModel for Cautious {
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64 {
        2.0 * candidate.padded_tokens as f64 / baseline.padded_tokens as f64
    }
}

struct RegressorTrainer {
    model: Regression,
    opt: AdamW,
    regressor: Cautious,
}
impl AdaptiveTrainer for RegressorTrainer {
    type Model = Regression;
    type Optimizer = AdamW;
    const POLICY: TrainerPolicy = MEMORY_POLICY;
    fn parts(&mut self) -> (&mut Regression, &mut AdamW) {
        (&mut self.model, &mut self.opt)
    }
    fn regressor(&mut self) -> Option<&mut dyn MemoryModel> {
        Some(&mut self.regressor)
    }
}

#[test]
fn a_user_regressor_drives_the_plan() {
    let data = varied_lengths(90);
    let log = temp_log("regressor");
    let mut a = args(2, 2, 1);
    a.logging.log_jsonl = Some(log.clone());
    adabatch::Run::new(&data, &collate, &a)
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = adamw(&model, 0.05)?;
            Ok(RegressorTrainer {
                model,
                opt,
                regressor: Cautious,
            })
        })
        .map(|trained| trained.summary)
        .unwrap();
    let cautious = read_log(&log);
    assert_each_epoch_exactly_once(&cautious, 90, 1);
    // Twice as cautious as the built-in model: smaller batches, more steps, and
    // every grown batch within the threshold of the user's own predictions.
    let (_, default) = run_memory(2, 1, |_| {});
    assert!(
        cautious.len() > default.len(),
        "{} vs {} steps",
        cautious.len(),
        default.len()
    );
    for l in cautious.iter().filter(|l| l.global_batch > 4) {
        assert!(l.predicted_memory.unwrap() <= 0.9, "step {}", l.step);
    }
}

#[test]
fn memory_schedule_with_halve_splits_the_failed_batch() {
    let (summary, logs) = run_memory(2, 1, |a| {
        a.step.oom = Some(adabatch::OomPolicy::Halve);
        a.step.inject_oom_at_steps = vec![1, 4];
    });
    assert_eq!(summary.oom_events, 2);
    assert_each_epoch_exactly_once(&logs, 90, 1);
}

/// A memory-aware run resumed from a checkpoint in its second epoch plans every
/// later epoch as the uninterrupted run does: the checkpoint holds the online
/// model whole (observations and sums), not only its last fit, and on several
/// ranks every rank's (each fits its own measurements).
#[test]
fn a_resumed_memory_run_plans_later_epochs_alike() {
    for world in [1, 2, 3] {
        resumed_memory_run_plans_alike(world);
    }
}

fn resumed_memory_run_plans_alike(world: usize) {
    let out = temp_log("memory-resume").with_extension("");
    let (_, straight) = run_memory(world, 4, |a| {
        a.save.save_steps = 1;
        a.save.output_dir = out.clone();
    });
    let first_epoch = straight.iter().filter(|l| l.epoch <= 1.0).count();
    let cut = first_epoch + 2;
    let (_, resumed) = run_memory(world, 4, |a| {
        a.save.resume_from_checkpoint = Some(out.join(format!("checkpoint-{cut}")));
        // candle's AdamW cannot save its moments: the batches are what is compared.
        a.save.ignore_optimizer_state = true;
        a.save.output_dir = out.clone();
    });
    assert_eq!(resumed.len(), straight.len() - cut);
    for (r, s) in resumed.iter().zip(&straight[cut..]) {
        assert_eq!(r.indices, s.indices, "{world} ranks, step {}", r.step);
        assert_eq!(
            r.predicted_memory, s.predicted_memory,
            "{world} ranks, step {}",
            r.step
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}
