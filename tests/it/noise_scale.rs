//! The gradient noise scale (`--log-gradient-noise-scale`) against its analytic
//! value on linear regression.
//!
//! Model and data: weights `w = 0` (learning rate 0, so they stay there), true
//! weights `t = 1/√D` in every coordinate (|t|² = 1), inputs `x ~ N(0, I_D)`,
//! targets `y = t·x + S·ε` with `ε ~ N(0, 1)`, per-example loss `½(w·x − y)²`.
//! The per-example gradient at `w = 0` is `g = −y·x`, so
//!
//! * `G = E[g] = −E[x xᵀ] t = −t`, hence `|G|² = 1`;
//! * `E|g|² = E[(t·x)² |x|²] + S² E|x|² = (D + 2)|t|² + S²·D` (Gaussian fourth
//!   moments: `E[(t·x)² x_i²] = |t|² + 2 t_i²`);
//! * `tr(Σ) = E|g|² − |G|² = (D + 1) + S²·D`,
//!
//! so `B_simple = tr(Σ)/|G|² = (D + 1) + S²·D`: 17 for D = 8, S = 1.
//!
//! Tolerance. With K small batches of b examples per step and B = K·b, the trace
//! estimate of one step has variance ≈ (2 tr(Σ²) + 4 b GᵀΣG)·κ / K / (1 − b/B)²,
//! where Σ = (1 + S²) I + t tᵀ gives tr(Σ²) = 37 and GᵀΣG = 3, and κ ≈ 2 allows
//! for the non-Gaussian `y·x`: for K = 6, b = 8 about 81, a standard deviation of
//! 9 (of 17) per step; |G|² has about 0.9 (of 1) per step. Averaged over the last
//! 1000 of 1500 steps (the moving averages' window is ~40 steps, so the average
//! covers ~1000 steps' worth of estimates) the ratio's standard deviation is
//! ≈ 17·√((9/17)² + 0.9²)/√1000 ≈ 0.6, 3.4 %; the test allows 15 % (over 4σ),
//! and the finite data set (N = 20 000) moves the target by under 0.2 %.

use adabatch::prelude::*;
use adabatch::{GradAccum, StepLog, TrainerPolicy};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};

const D: usize = 8;
const S: f64 = 1.0;

#[derive(Clone)]
struct Example {
    x: Vec<f32>,
    y: f32,
}

struct XY {
    x: Tensor,
    y: Tensor,
}

impl Batch for XY {
    fn num_examples(&self) -> usize {
        self.y.dims()[0]
    }
    /// Three "tokens" per example, for the `token_count` trainers.
    fn num_tokens(&self) -> usize {
        3 * self.num_examples()
    }
}

fn collate(items: &[Example], device: &Device) -> candle_core::Result<XY> {
    let x: Vec<f32> = items.iter().flat_map(|e| e.x.iter().copied()).collect();
    Ok(XY {
        x: Tensor::from_vec(x, (items.len(), D), device)?,
        y: Tensor::new(items.iter().map(|e| e.y).collect::<Vec<_>>(), device)?,
    })
}

struct Linear {
    w: Var,
    /// Slept in every forward pass: step-time noise the run must not follow.
    delay: std::time::Duration,
}

impl TrainModel for Linear {
    type Batch = XY;
    fn per_example_loss(&self, batch: &XY) -> candle_core::Result<Tensor> {
        std::thread::sleep(self.delay);
        let pred = batch
            .x
            .matmul(&self.w.as_tensor().unsqueeze(1)?)?
            .squeeze(1)?;
        (pred - &batch.y)?.sqr()? * 0.5
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        vec![("w".into(), self.w.clone())]
    }
}

hand_trainer!(
    Trainer,
    Linear,
    candle_nn::SGD,
    TrainerPolicy {
        grad_accum: GradAccum::Fixed(2),
        ..TrainerPolicy::DEFAULT
    }
);

fn normal(rng: &mut impl Rng) -> f64 {
    // Box–Muller.
    let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    let v: f64 = rng.random::<f64>();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

fn data(n: usize) -> Vec<Example> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let t = 1.0 / (D as f64).sqrt();
    (0..n)
        .map(|_| {
            let x: Vec<f64> = (0..D).map(|_| normal(&mut rng)).collect();
            let y = t * x.iter().sum::<f64>() + S * normal(&mut rng);
            Example {
                x: x.into_iter().map(|v| v as f32).collect(),
                y: y as f32,
            }
        })
        .collect()
}

fn run(args: &TrainingArgs, data: &[Example]) -> adabatch::Result<Vec<StepLog>> {
    run_with(args, data, |model, opt| Trainer { model, opt })
}

fn run_with<T: AdaptiveTrainer<Model = Linear, Optimizer = candle_nn::SGD> + Send>(
    args: &TrainingArgs,
    data: &[Example],
    wrap: fn(Linear, candle_nn::SGD) -> T,
) -> adabatch::Result<Vec<StepLog>> {
    run_delayed(args, data, wrap, std::time::Duration::ZERO)
}

/// `run_with`, each forward pass sleeping `delay`.
fn run_delayed<T: AdaptiveTrainer<Model = Linear, Optimizer = candle_nn::SGD> + Send>(
    args: &TrainingArgs,
    data: &[Example],
    wrap: fn(Linear, candle_nn::SGD) -> T,
    delay: std::time::Duration,
) -> adabatch::Result<Vec<StepLog>> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let log = std::env::temp_dir().join(format!(
        "adabatch-noise-scale-{}-{}.jsonl",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let args = {
        let mut a = args.clone();
        a.logging.log_jsonl = Some(log.clone());
        a
    };
    adabatch::Run::new(data, &collate, &args).launch(|ctx: &RankContext| {
        let w = Var::zeros(D, DType::F32, ctx.device())?;
        let opt = candle_nn::Optimizer::new(vec![w.clone()], args.lr.learning_rate)?;
        Ok(wrap(Linear { w, delay }, opt))
    })?;
    let logs = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| !l.contains(r#""event":"resume""#))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let _ = std::fs::remove_file(&log);
    Ok(logs)
}

/// Launches `wrap`'s trainer on `Linear` at zero with SGD at rate 0.
fn launch_at_rest<T: AdaptiveTrainer<Model = Linear, Optimizer = candle_nn::SGD> + Send>(
    data: &[Example],
    args: &TrainingArgs,
    wrap: fn(Linear, candle_nn::SGD) -> T,
) -> adabatch::Result<adabatch::Trained<T>> {
    adabatch::Run::new(data, &collate, args).launch(|ctx: &RankContext| {
        let w = Var::zeros(D, DType::F32, ctx.device())?;
        let opt = candle_nn::Optimizer::new(vec![w.clone()], 0.0)?;
        Ok(wrap(
            Linear {
                w,
                delay: std::time::Duration::ZERO,
            },
            opt,
        ))
    })
}

fn args(ranks: usize, per_device: usize, steps: usize) -> TrainingArgs {
    {
        let mut args = TrainingArgs::default();
        args.launch.nproc_per_node = ranks;
        args.batch.per_device_train_batch_size = per_device;
        args.length.max_steps = Some(steps);
        args.lr.learning_rate = 0.0;
        args.step.log_gradient_noise_scale = true;
        args.logging.quiet = true;
        args.data.seed = Some(1);
        args
    }
}

#[test]
fn matches_the_analytic_value_on_linear_regression() {
    let expected = (D as f64 + 1.0) + S * S * D as f64;
    let data = data(20_000);
    // 3 ranks × 2 micro-batches of 8 per rank: 6 small batches of 8, B = 48.
    let logs = run(&args(3, 8, 1500), &data).unwrap();
    assert_eq!(logs.len(), 1500);
    assert!(logs.iter().all(|l| l.gradient_noise_scale.is_some()));
    let tail: Vec<f64> = logs[500..]
        .iter()
        .map(|l| l.gradient_noise_scale.unwrap())
        .collect();
    let mean = tail.iter().sum::<f64>() / tail.len() as f64;
    eprintln!("B_simple {mean:.3}, analytic {expected}");
    assert!(
        (mean - expected).abs() < 0.15 * expected,
        "B_simple {mean}, analytic {expected}"
    );
}

/// One rank accumulating two micro-batches: the micro-batches are the small batches
/// (K = 2, b = 16, as on two ranks below).
#[test]
fn one_rank_with_accumulation() {
    let expected = (D as f64 + 1.0) + S * S * D as f64;
    let logs = run(&args(1, 16, 3000), &data(20_000)).unwrap();
    assert!(logs
        .iter()
        .all(|l| l.micro_batches == 2 && l.global_batch == 32));
    let tail: Vec<f64> = logs[500..]
        .iter()
        .map(|l| l.gradient_noise_scale.unwrap())
        .collect();
    let mean = tail.iter().sum::<f64>() / tail.len() as f64;
    eprintln!("B_simple {mean:.3} on 1 rank with 2 micro-batches, analytic {expected}");
    assert!(
        (mean - expected).abs() < 0.15 * expected,
        "B_simple {mean}, analytic {expected}"
    );
}

/// Two ranks without accumulation: the two ranks' shares are the small batches
/// (K = 2, b = 16: about 33 per step on the trace, 3.8 % over 2500 steps).
#[test]
fn two_ranks_without_accumulation() {
    let expected = (D as f64 + 1.0) + S * S * D as f64;
    let logs = run_with(&args(2, 16, 3000), &data(20_000), |model, opt| Single {
        model,
        opt,
    })
    .unwrap();
    let tail: Vec<f64> = logs[500..]
        .iter()
        .map(|l| l.gradient_noise_scale.unwrap())
        .collect();
    let mean = tail.iter().sum::<f64>() / tail.len() as f64;
    eprintln!("B_simple {mean:.3} on 2 ranks, analytic {expected}");
    assert!(
        (mean - expected).abs() < 0.15 * expected,
        "B_simple {mean}, analytic {expected}"
    );
}

#[test]
fn one_rank_without_accumulation_is_a_typed_error() {
    let data = data(64);
    // One rank and two micro-batches works ...
    let logs = run(&args(1, 4, 3), &data).unwrap();
    assert!(logs.iter().all(|l| l.gradient_noise_scale.is_some()));
    // ... a policy with one micro-batch on one rank does not.
    let result = launch_at_rest(&data, &args(1, 4, 3), |model, opt| Single { model, opt });
    let Err(err) = result else {
        panic!("one rank without accumulation must be refused")
    };
    assert!(
        matches!(
            err,
            adabatch::Error::Settings(adabatch::SettingsError::NoiseScaleNeedsSmallBatches { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("accumulate at least 2"), "{err}");
}

hand_trainer!(Single, Linear, candle_nn::SGD, TrainerPolicy::DEFAULT);

/// The estimator's moving averages travel in the checkpoint: a resumed run logs
/// the same noise scale as the uninterrupted one.
#[test]
fn resume_keeps_the_estimator() {
    let data = data(2_000);
    let out =
        std::env::temp_dir().join(format!("adabatch-noise-scale-ckpt-{}", std::process::id()));
    let straight = run(&args(3, 4, 20), &data).unwrap();
    let first = {
        let mut a = args(3, 4, 20);
        a.length.max_steps = Some(10);
        a.save.save_steps = 10;
        a.save.output_dir = out.clone();
        a
    };
    run(&first, &data).unwrap();
    let second = {
        let mut a = args(3, 4, 20);
        a.save.output_dir = out.clone();
        a.save.resume_from_checkpoint = Some("latest".into());
        a
    };
    let resumed: Vec<StepLog> = run(&second, &data)
        .unwrap()
        .into_iter()
        .filter(|l| l.step > 10)
        .collect();
    assert_eq!(resumed.len(), 10);
    for (r, s) in resumed.iter().zip(&straight[10..]) {
        assert_eq!(r.step, s.step);
        assert_eq!(
            r.gradient_noise_scale, s.gradient_noise_scale,
            "step {}",
            r.step
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

hand_trainer!(
    Adaptive,
    Linear,
    candle_nn::SGD,
    TrainerPolicy {
        // Continuous, as the test below states: each step's batch is the estimate's.
        schedule: adabatch::ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy {
            factor: 1,
            hysteresis: 0.0,
            shrink: true,
            ..adabatch::NoiseScalePolicy::doubling(2.0, 12, 60)
        }),
        grad_accum: GradAccum::Fixed(2),
        ..TrainerPolicy::DEFAULT
    }
);

/// `schedule = noise_scale(fraction, min, max)`: each step's global batch is the
/// fraction of the previous step's estimate, rounded and clamped, at most double
/// the previous batch for the first 20 steps; the first is `min`. A resumed run
/// continues with the same sizes and estimates.
#[test]
fn noise_scale_schedule_sizes_the_next_global_batch() {
    let data = data(20_000);
    let plain = {
        let mut a = args(3, 4, 120);
        a.step.log_gradient_noise_scale = false;
        a
    };
    let logs = run_with(&plain, &data, |model, opt| Adaptive { model, opt }).unwrap();
    assert_eq!(logs[0].global_batch, 12);
    let mut held_back = 0;
    for w in logs.windows(2) {
        // No estimate while the |G|² average is not positive: the size stays.
        let mut want = w[0].gradient_noise_scale.map_or(w[0].global_batch, |b| {
            (2.0 * b).round().clamp(12.0, 60.0) as usize
        });
        // Before the averages span their horizon (1/(1 − 0.95) = 20 steps), the
        // batch at most doubles per step.
        if w[0].step < 20 && want > 2 * w[0].global_batch {
            want = 2 * w[0].global_batch;
            held_back += 1;
        }
        assert_eq!(w[1].global_batch, want, "step {}", w[1].step);
        assert_eq!(w[1].micro_batches, 2);
    }
    assert!(
        held_back > 0,
        "the early limit never applied: the test would not see it"
    );
    // Around 2 × 17 once the estimate settles.
    let late = logs[60..].iter().map(|l| l.global_batch).sum::<usize>() as f64 / 60.0;
    assert!((late - 34.0).abs() < 8.0, "{late}");

    let out = std::env::temp_dir().join(format!(
        "adabatch-noise-scale-schedule-{}",
        std::process::id()
    ));
    let first = {
        let mut args = plain.clone();
        args.length.max_steps = Some(50);
        args.save.save_steps = 50;
        args.save.output_dir = out.clone();
        args
    };
    run_with(&first, &data, |model, opt| Adaptive { model, opt }).unwrap();
    let second = {
        let mut args = plain.clone();
        args.save.output_dir = out.clone();
        args.save.resume_from_checkpoint = Some("latest".into());
        args
    };
    let resumed: Vec<StepLog> = run_with(&second, &data, |model, opt| Adaptive { model, opt })
        .unwrap()
        .into_iter()
        .filter(|l| l.step > 50)
        .collect();
    assert_eq!(resumed.len(), 70);
    for (r, s) in resumed.iter().zip(&logs[50..]) {
        assert_eq!((r.step, r.global_batch), (s.step, s.global_batch));
        assert_eq!(r.gradient_noise_scale, s.gradient_noise_scale);
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Under `schedule = noise_scale(..)` the sizes change every step, and every epoch
/// still uses every example exactly once (a step never spans two epochs).
#[test]
fn noise_scale_epochs_use_every_example_once() {
    let n = 300;
    let plain = {
        let mut a = args(3, 4, 1);
        a.step.log_gradient_noise_scale = false;
        a.length.max_steps = None;
        a.length.num_train_epochs = 3;
        a
    };
    let logs = run_with(&plain, &data(n), |model, opt| Adaptive { model, opt }).unwrap();
    let sizes: std::collections::BTreeSet<usize> = logs.iter().map(|l| l.global_batch).collect();
    assert!(sizes.len() > 3, "the batch changed size: {sizes:?}");
    let all: Vec<usize> = logs.iter().flat_map(|l| l.indices.concat()).collect();
    assert_eq!(all.len(), 3 * n);
    for epoch in all.chunks(n) {
        let mut sorted = epoch.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    }
}

// `reweight = token_count` (three tokens per example), two micro-batches.
hand_trainer!(
    PerToken,
    Linear,
    candle_nn::SGD,
    TrainerPolicy {
        grad_accum: GradAccum::Fixed(2),
        reweight: adabatch::Reweight::TokenCount,
        ..TrainerPolicy::DEFAULT
    }
);

/// With `token_count` the small batches are sized in target tokens and tr Σ is
/// turned back into examples: with L tokens to every example the per-token mean
/// gradients are the per-example ones over L, tr Σ per token is 1/L of that per
/// example, and B_simple in examples is the same as `sample_count`'s, step by step.
#[test]
fn token_count_measures_the_same_noise_scale_in_examples() {
    let data = data(4_000);
    for ranks in [1, 2] {
        let a = args(ranks, 8, 60);
        let examples = run(&a, &data).unwrap();
        let tokens = run_with(&a, &data, |model, opt| PerToken { model, opt }).unwrap();
        assert_eq!(examples.len(), tokens.len());
        for (e, t) in examples.iter().zip(&tokens) {
            let (e, t) = (
                e.gradient_noise_scale.unwrap(),
                t.gradient_noise_scale.unwrap(),
            );
            assert!(
                (e - t).abs() <= 1e-4 * e.abs(),
                "{ranks} ranks: {e} per example, {t} from tokens"
            );
        }
    }
}

/// `reweight = none` (the mean of per-rank means) has no measurable small batch.
#[test]
fn a_rank_mean_cannot_measure_the_noise_scale() {
    hand_trainer!(
        RankMean,
        Linear,
        candle_nn::SGD,
        TrainerPolicy {
            reweight: adabatch::Reweight::RankMean,
            ..TrainerPolicy::DEFAULT
        }
    );
    let err = run_with(&args(2, 4, 3), &data(64), |model, opt| RankMean {
        model,
        opt,
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("reweight = none"), "{err}");
}

hand_trainer!(
    Cadenced,
    Linear,
    candle_nn::SGD,
    TrainerPolicy {
        // One rank, no accumulation: the engine splits the measuring steps.
        schedule: adabatch::ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy {
            every: adabatch::MeasureEvery::Steps(3),
            ..adabatch::NoiseScalePolicy::doubling(1.0, 8, 64)
        }),
        ..TrainerPolicy::DEFAULT
    }
);

/// `noise_scale(.., every = 3)` on one rank without accumulation: steps 1, 4, 7,
/// … split into two micro-batches and move the estimate; the others run as one
/// pass and leave it. A run resumed between two measurements (at step 5) goes on
/// exactly as the uninterrupted one; resumed on two ranks, it measures at the
/// same steps (split in two there too: four small batches) and still uses every
/// example once an epoch.
#[test]
fn the_cadence_splits_only_measuring_steps_and_resumes_mid_cadence() {
    let data = data(600);
    let cadenced = |ranks: usize, steps: usize| {
        let mut a = args(ranks, 8, steps);
        a.step.log_gradient_noise_scale = false;
        a
    };
    let logs = run_with(&cadenced(1, 30), &data, |model, opt| Cadenced {
        model,
        opt,
    })
    .unwrap();
    assert_eq!(logs.len(), 30);
    let mut previous = None;
    for log in &logs {
        let measuring = log.step % 3 == 1;
        assert_eq!(
            log.micro_batches,
            if measuring { 2 } else { 1 },
            "step {}",
            log.step
        );
        assert_eq!(log.noise_scale_interval, Some(3));
        if !measuring {
            assert_eq!(log.gradient_noise_scale, previous, "step {}", log.step);
        }
        previous = log.gradient_noise_scale;
    }
    assert!(
        logs.iter().any(|l| l.global_batch > 8),
        "the batch never grew"
    );

    let out = std::env::temp_dir().join(format!("adabatch-noise-cadence-{}", std::process::id()));
    let first = {
        let mut a = cadenced(1, 5);
        a.save.save_steps = 5;
        a.save.output_dir = out.clone();
        a
    };
    run_with(&first, &data, |model, opt| Cadenced { model, opt }).unwrap();
    let resume = |ranks: usize| {
        let mut a = cadenced(ranks, 30);
        a.save.output_dir = out.clone();
        a.save.resume_from_checkpoint = Some("latest".into());
        run_with(&a, &data, |model, opt| Cadenced { model, opt })
            .unwrap()
            .into_iter()
            .filter(|l| l.step > 5)
            .collect::<Vec<StepLog>>()
    };
    let resumed = resume(1);
    assert_eq!(resumed.len(), 25);
    for (r, s) in resumed.iter().zip(&logs[5..]) {
        assert_eq!(
            (r.step, r.global_batch, r.micro_batches, &r.indices),
            (s.step, s.global_batch, s.micro_batches, &s.indices)
        );
        assert_eq!(
            r.gradient_noise_scale, s.gradient_noise_scale,
            "step {}",
            r.step
        );
        assert_eq!(r.loss, s.loss, "step {}", r.step);
    }
    let on_two = resume(2);
    assert_eq!(on_two.len(), 25);
    assert_eq!(
        on_two[0].global_batch, logs[5].global_batch,
        "the checkpoint's next batch"
    );
    for r in &on_two {
        // Two ranks' shares are 2 small batches: measuring steps still split in
        // two (4 small batches), the others run as one.
        let measuring = r.step % 3 == 1;
        assert_eq!(
            r.micro_batches,
            if measuring { 2 } else { 1 },
            "step {}",
            r.step
        );
        let moved = r.gradient_noise_scale
            != on_two
                .iter()
                .find(|l| l.step == r.step - 1)
                .map_or(r.gradient_noise_scale, |l| l.gradient_noise_scale);
        if moved {
            assert_eq!(r.step % 3, 1, "only measuring steps move the estimate");
        }
    }
    let seen: Vec<usize> = logs[..5]
        .iter()
        .chain(&on_two)
        .flat_map(|l| l.indices.concat())
        .collect();
    let epoch = &seen[..seen.len().min(data.len())];
    let mut sorted = epoch.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), epoch.len(), "an example twice in one epoch");
    let _ = std::fs::remove_dir_all(&out);
}

hand_trainer!(
    Reproducible,
    Linear,
    candle_nn::SGD,
    TrainerPolicy {
        // The default cadence (`every = model`), one rank: measuring steps split.
        schedule: adabatch::ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy::doubling(
            1.0, 4, 64
        )),
        ..TrainerPolicy::DEFAULT
    }
);

/// The default cadence reads no clock: two runs of the same seed, one of them
/// slowed by a sleep in every forward pass (so that a split step costs far more
/// than a plain one there, and each step far more than in the other run), log
/// the same steps bit for bit: the same measuring steps, estimates, batches,
/// losses and gradient norms. Only the throughput differs.
#[test]
fn the_default_cadence_is_the_same_run_whatever_the_step_times() {
    let data = data(4000);
    let args = {
        let mut a = args(1, 4, 120);
        a.lr.learning_rate = 0.02;
        a.step.log_gradient_noise_scale = false;
        a
    };
    let wrap = |model, opt| Reproducible { model, opt };
    let fast = run_delayed(&args, &data, wrap, std::time::Duration::ZERO).unwrap();
    let slow = run_delayed(&args, &data, wrap, std::time::Duration::from_millis(3)).unwrap();
    let without_timing = |logs: Vec<StepLog>| -> Vec<String> {
        logs.into_iter()
            .map(|mut l| {
                l.examples_per_s = 0.0;
                serde_json::to_string(&l).unwrap()
            })
            .collect()
    };
    let (fast, slow) = (without_timing(fast), without_timing(slow));
    // Whole logs compared: a slow run that stopped early must not pass on the
    // steps it shares with the fast one.
    assert_eq!((fast.len(), slow.len()), (120, 120));
    assert_eq!(fast, slow);
    let logs: Vec<StepLog> = fast
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The interval after each step is the CPU model's at the next step's batch.
    for pair in logs.windows(2) {
        let model = adabatch::SplitCostModel::CPU.interval(pair[1].global_batch);
        assert_eq!(
            pair[0].noise_scale_interval,
            Some(model),
            "step {}",
            pair[0].step
        );
    }
    let split = logs.iter().filter(|l| l.micro_batches == 2).count();
    assert!((8..=30).contains(&split), "{split} of 120 steps split");
    assert!(
        logs.last().unwrap().global_batch > 4,
        "the batch never grew"
    );
}

/// Each measuring step logs its own measurement (|G|², tr Σ); replaying them by
/// hand (moving averages decaying by 0.95 per step, by at most 1 − 1/4 per
/// measurement, bias-corrected) gives the logged noise scale at every step, so
/// a log can be replayed offline at another horizon.
#[test]
fn the_logged_measurements_replay_to_the_logged_noise_scale() {
    let data = data(4000);
    let mut args = args(1, 4, 120);
    args.lr.learning_rate = 0.02;
    let wrap = |model, opt| Reproducible { model, opt };
    let logs = run_delayed(&args, &data, wrap, std::time::Duration::ZERO).unwrap();
    let (mut norm, mut trace, mut decayed) = (0.0, 0.0, 1.0);
    let mut last: Option<usize> = None;
    let mut measured = 0;
    for log in &logs {
        if let Some(m) = log.noise_measurement {
            let gap = last.map_or(1, |l| log.step - l) as i32;
            let decay = 0.95f64.powi(gap).max(0.75);
            norm = decay * norm + (1.0 - decay) * m.squared_norm;
            trace = decay * trace + (1.0 - decay) * m.trace;
            decayed *= decay;
            last = Some(log.step);
            measured += 1;
        }
        let Some(logged) = log.gradient_noise_scale else {
            assert_eq!(measured, 0, "step {}", log.step);
            continue;
        };
        let replayed = (trace / (1.0 - decayed)) / (norm / (1.0 - decayed));
        assert!(
            (replayed - logged).abs() <= 1e-9 * logged.abs(),
            "step {}: {replayed} against {logged}",
            log.step
        );
    }
    let split = logs.iter().filter(|l| l.micro_batches == 2).count();
    assert_eq!(measured, split, "every split step measured, and only those");
}

hand_trainer!(
    AdamScaled,
    Linear,
    adabatch::AdamW,
    TrainerPolicy {
        schedule: adabatch::ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy::doubling(
            1.0, 4, 64
        )),
        lr_scaling: adabatch::LrScaling::AdamScale,
        ..TrainerPolicy::DEFAULT
    }
);

hand_trainer!(
    AdamScaledSgd,
    Linear,
    candle_nn::SGD,
    TrainerPolicy {
        schedule: adabatch::ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy::doubling(
            1.0, 4, 64
        )),
        lr_scaling: adabatch::LrScaling::AdamScale,
        ..TrainerPolicy::DEFAULT
    }
);

hand_trainer!(
    AdamScaledFixed,
    Linear,
    candle_nn::SGD,
    TrainerPolicy {
        lr_scaling: adabatch::LrScaling::AdamScale,
        ..TrainerPolicy::DEFAULT
    }
);

/// `lr_scaling = adamscale`: once the batch leaves the reference (the first
/// global batch, 4), each step's rate is the base rate × the square root of
/// AdaScale's gain at the (preconditioned) noise scale the step before logged.
#[test]
fn adam_scale_sets_the_rate_from_the_gain_at_the_measured_noise_scale() {
    let data = data(4000);
    let base = 0.01;
    let mut args = args(1, 4, 200);
    args.lr.learning_rate = base;
    args.step.log_gradient_noise_scale = false;
    let log = std::env::temp_dir().join(format!("adabatch-adamscale-{}.jsonl", std::process::id()));
    args.logging.log_jsonl = Some(log.clone());
    adabatch::Run::new(&data, &collate, &args)
        .launch(|ctx: &RankContext| {
            let w = Var::zeros(D, DType::F32, ctx.device())?;
            let params = adabatch::ParamsAdamW {
                lr: base,
                ..Default::default()
            };
            Ok(AdamScaled {
                model: Linear {
                    w: w.clone(),
                    delay: std::time::Duration::ZERO,
                },
                opt: adabatch::AdamW::new(vec![w], params)?,
            })
        })
        .unwrap();
    let logs: Vec<StepLog> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let _ = std::fs::remove_file(&log);
    let (mut checked, mut held) = (0, 0);
    let mut last_positive = None;
    for pair in logs.windows(2) {
        let (before, step) = (&pair[0], &pair[1]);
        last_positive = before.gradient_noise_scale.or(last_positive);
        if step.global_batch == 4 {
            assert!(
                (step.learning_rate - base).abs() < 1e-12,
                "step {}",
                step.step
            );
            continue;
        }
        // No estimate (its |G|² average not positive): the last positive one,
        // held (and logged as held), not the √ rule.
        if before.gradient_noise_scale.is_none() {
            assert_eq!(before.noise_scale_held, 1, "step {}", before.step);
            held += 1;
        }
        let phi = last_positive.expect("the batch grew on an estimate");
        let gain = adabatch::adam_scale_gain(phi, 4, step.global_batch);
        let want = base * gain.sqrt();
        assert!(
            (step.learning_rate - want).abs() < 1e-9 * want,
            "step {}: {} vs {want}",
            step.step,
            step.learning_rate
        );
        checked += 1;
    }
    assert!(checked > 0, "the batch never grew");
    // Step 179 of this run (seed and data fixed) has no positive estimate; the
    // rate took the √ rule there before the estimate was held.
    assert!(
        held > 0,
        "no step ran on a held estimate: the check above saw none"
    );
}

/// `adamscale` needs a measured noise scale and an optimizer with Adam's
/// preconditioner: typed errors before the first step otherwise.
#[test]
fn adam_scale_without_its_measurement_or_adam_is_refused() {
    let data = data(64);
    let mut a = args(1, 4, 3);
    a.step.log_gradient_noise_scale = false;
    let sgd = launch_at_rest(&data, &a, |model, opt| AdamScaledSgd { model, opt });
    let Err(err) = sgd else {
        panic!("SGD has no preconditioner")
    };
    assert!(err.to_string().contains("adabatch::AdamW"), "{err}");
    let fixed = launch_at_rest(&data, &a, |model, opt| AdamScaledFixed { model, opt });
    let Err(err) = fixed else {
        panic!("nothing measures the noise scale")
    };
    assert!(
        matches!(
            err,
            adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("noise scale"), "{err}");
}
