//! Closed-form checks of the update: reweighting with empty ranks, token weights,
//! gradient clipping, and the learning-rate schedule over examples consumed. Every
//! expected value is computed by hand (in f64) from the examples the log says each
//! rank trained on.

use crate::common;

use std::sync::Mutex;

use adabatch::prelude::*;
use adabatch::{LrSchedulerType, Reweight, StepLog, TrainerPolicy};
use candle_nn::{Optimizer, SGD};
use common::*;

hand_trainer!(
    SgdTokenTrainer,
    SGD,
    TrainerPolicy {
        shuffle: false,
        reweight: Reweight::TokenCount,
        ..TrainerPolicy::DEFAULT
    }
);

const LR: f64 = 0.1;

/// Parameters `[w0..w3, b]` as f64.
type Theta = [f64; FEATURES + 1];

/// Trains with SGD from zero weights; returns rank 0's final weights and the log.
fn sgd_run<T: AdaptiveTrainer<Model = Regression> + Send>(
    data: &[Example],
    a: &TrainingArgs,
    token_sum: bool,
    wrap: fn(Regression, SGD) -> T,
) -> (Theta, Vec<StepLog>) {
    let log = temp_log("numerics");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    a.lr.learning_rate = LR;
    let rank0 = Mutex::new(None);
    adabatch::Run::new(data, &collate, &a)
        .launch(|ctx: &RankContext| {
            let params = ctx.parameters();
            let mut model = Regression::new(params.clone(), ctx.device())?;
            model.token_sum = token_sum;
            for (_, var) in params.named_parameters() {
                var.set(&var.as_tensor().zeros_like()?)?;
            }
            if ctx.rank() == 0 {
                *rank0.lock().unwrap() = Some(params.clone());
            }
            Ok(wrap(model, SGD::new(params.all_vars(), LR)?))
        })
        .unwrap();
    let params = rank0.into_inner().unwrap().unwrap();
    let named = params.named_parameters();
    let value = |name: &str| -> Vec<f64> {
        let var = &named.iter().find(|(n, _)| n == name).unwrap().1;
        let v = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>();
        v.unwrap().into_iter().map(f64::from).collect()
    };
    let mut theta = [0.0; FEATURES + 1];
    theta[..FEATURES].copy_from_slice(&value("linear.weight"));
    theta[FEATURES] = value("linear.bias")[0];
    (theta, read_log(&log))
}

/// Gradient of `(θ·[x, 1] − y)²` at θ.
fn grad(theta: &Theta, e: &Example) -> Theta {
    let input: Vec<f64> = e.x.iter().map(|&v| f64::from(v)).chain([1.0]).collect();
    let pred: f64 = theta.iter().zip(&input).map(|(t, v)| t * v).sum();
    let residual = pred - f64::from(e.y);
    std::array::from_fn(|k| 2.0 * residual * input[k])
}

fn weighted_mean(parts: &[(f64, Theta)]) -> Theta {
    let total: f64 = parts.iter().map(|(w, _)| w).sum();
    std::array::from_fn(|k| parts.iter().map(|(w, g)| w * g[k]).sum::<f64>() / total)
}

fn sgd(theta: &Theta, g: &Theta, lr: f64) -> Theta {
    std::array::from_fn(|k| theta[k] - lr * g[k])
}

fn norm(g: &Theta) -> f64 {
    g.iter().map(|v| v * v).sum::<f64>().sqrt()
}

fn assert_close(got: &Theta, expected: &Theta) {
    for (g, e) in got.iter().zip(expected) {
        assert!(
            (g - e).abs() <= 1e-5 * e.abs().max(1.0),
            "got {got:?}\nexpected {expected:?}"
        );
    }
}

/// Gradient of one rank's slice: the mean over its examples.
fn rank_mean(theta: &Theta, data: &[Example], ids: &[usize]) -> Theta {
    let parts: Vec<(f64, Theta)> = ids.iter().map(|&i| (1.0, grad(theta, &data[i]))).collect();
    weighted_mean(&parts)
}

/// The hand-computed SGD trajectory over the logged steps, with `step_grad` giving
/// each step's update direction from the ranks' index slices.
fn replay(logs: &[StepLog], step_grad: impl Fn(&Theta, &[Vec<usize>]) -> Theta) -> Theta {
    logs.iter().fold([0.0; FEATURES + 1], |theta, l| {
        sgd(&theta, &step_grad(&theta, &l.indices), l.learning_rate)
    })
}

#[test]
fn empty_ranks_join_with_zero_weight() {
    // N = 5 on 4 ranks of 1: step 1 is [1, 1, 1, 1], step 2 is [1, 0, 0, 0].
    let data = dataset(5, 9);
    let mut a = args(4, 1, 1);
    a.length.max_steps = Some(2);
    let sample_mean = |theta: &Theta, slices: &[Vec<usize>]| {
        let all: Vec<usize> = slices.concat();
        rank_mean(theta, &data, &all)
    };
    let (got, logs) = sgd_run(&data, &a, false, |model, opt| SgdTrainer { model, opt });
    let sizes: Vec<Vec<usize>> = logs.iter().map(|l| l.local_batch_sizes.clone()).collect();
    assert_eq!(sizes, vec![vec![1, 1, 1, 1], vec![1, 0, 0, 0]]);
    assert!(logs.iter().all(|l| l.learning_rate == LR));
    assert_close(&got, &replay(&logs, sample_mean));
    // DDP's mean of rank means counts only ranks with examples: at step 2 the
    // update is example 4's own gradient, not a quarter of it.
    let mean_of_active_rank_means = |theta: &Theta, slices: &[Vec<usize>]| {
        let parts: Vec<(f64, Theta)> = slices
            .iter()
            .filter(|ids| !ids.is_empty())
            .map(|ids| (1.0, rank_mean(theta, &data, ids)))
            .collect();
        weighted_mean(&parts)
    };
    let (got, logs) = sgd_run(&data, &a, false, |model, opt| SgdRankMeanTrainer {
        model,
        opt,
    });
    assert_eq!(logs[1].local_batch_sizes, vec![1, 0, 0, 0]);
    assert_close(&got, &replay(&logs, mean_of_active_rank_means));
}

#[test]
fn uneven_slices_sample_count_versus_rank_mean() {
    // N = 5 on 4 ranks of 2: one step of [2, 1, 1, 1].
    let data = dataset(5, 4);
    let mut a = args(4, 2, 1);
    a.length.max_steps = Some(1);
    let (got, logs) = sgd_run(&data, &a, false, |model, opt| SgdTrainer { model, opt });
    assert_eq!(logs[0].local_batch_sizes, vec![2, 1, 1, 1]);
    // Global mean over the 5 examples.
    let expected = sgd(
        &[0.0; 5],
        &rank_mean(&[0.0; 5], &data, &[0, 1, 2, 3, 4]),
        LR,
    );
    assert_close(&got, &expected);
    // Mean over the 4 ranks of each rank's mean: the pair counts as one rank.
    let (got, logs) = sgd_run(&data, &a, false, |model, opt| SgdRankMeanTrainer {
        model,
        opt,
    });
    let zero = [0.0; 5];
    let parts: Vec<(f64, Theta)> = logs[0]
        .indices
        .iter()
        .map(|ids| (1.0, rank_mean(&zero, &data, ids)))
        .collect();
    assert_eq!(logs[0].indices[0].len(), 2);
    assert_close(&got, &sgd(&zero, &weighted_mean(&parts), LR));
    // The two rules differ here, so the test tells them apart.
    let global = rank_mean(&zero, &data, &[0, 1, 2, 3, 4]);
    assert!(
        norm(&std::array::from_fn(
            |k| global[k] - weighted_mean(&parts)[k]
        )) > 1e-3
    );
}

#[test]
fn token_count_update_is_the_token_weighted_mean() {
    // Two ranks, 3 examples with 1, 6 and 2 tokens: one step of [2, 1]. The loss of
    // an example is its squared error summed over its tokens (error × tokens).
    let mut data = dataset(3, 12);
    for (e, t) in data.iter_mut().zip([1, 6, 2]) {
        e.tokens = t;
    }
    let mut a = args(2, 2, 1);
    a.length.max_steps = Some(1);
    let (got, logs) = sgd_run(&data, &a, true, |model, opt| SgdTokenTrainer { model, opt });
    assert_eq!(logs[0].local_batch_sizes, vec![2, 1]);
    let zero = [0.0; 5];
    // Σ tokens_i ∇err_i / Σ tokens_i.
    let parts: Vec<(f64, Theta)> = data
        .iter()
        .map(|e| (e.tokens as f64, grad(&zero, e)))
        .collect();
    assert_close(&got, &sgd(&zero, &weighted_mean(&parts), LR));
    // The logged loss is the token-weighted mean too.
    let loss: f64 = data
        .iter()
        .map(|e| e.tokens as f64 * f64::from(e.y).powi(2))
        .sum::<f64>()
        / 9.0;
    assert!(
        (logs[0].loss - loss).abs() <= 1e-5 * loss,
        "{}",
        logs[0].loss
    );
}

#[test]
fn max_grad_norm_clips_to_the_given_norm() {
    let data = dataset(4, 2);
    let zero = [0.0; 5];
    let g = rank_mean(&zero, &data, &[0, 1, 2, 3]);
    let full = norm(&g);
    assert!(full > 1.0, "the test needs a gradient to clip: {full}");
    for (world, per_device) in [(1, 4), (2, 2)] {
        let mut a = args(world, per_device, 1);
        a.length.max_steps = Some(1);
        // Clipped: the update is the gradient rescaled to norm `clip`.
        let clip = full / 4.0;
        a.step.max_grad_norm = clip;
        let (got, logs) = sgd_run(&data, &a, false, |model, opt| SgdTrainer { model, opt });
        let factor = clip / (full + 1e-6);
        let clipped: Theta = std::array::from_fn(|k| g[k] * factor);
        assert!((norm(&clipped) - clip).abs() < 1e-5 * clip);
        assert_close(&got, &sgd(&zero, &clipped, LR));
        // The logged norm is the norm before clipping (as in HF).
        assert!((logs[0].grad_norm - full).abs() < 1e-5 * full);
        // A bound above the norm leaves the update alone.
        a.step.max_grad_norm = full * 2.0;
        let (got, _) = sgd_run(&data, &a, false, |model, opt| SgdTrainer { model, opt });
        assert_close(&got, &sgd(&zero, &g, LR));
    }
}

// ---------------------------------------------------------------------------
// Learning-rate schedules over examples consumed.

/// The closed form: linear warm-up over `warmup` examples, then linear or cosine
/// decay to 0 at `total` examples.
fn closed_form(kind: LrSchedulerType, base: f64, consumed: f64, warmup: f64, total: f64) -> f64 {
    if consumed < warmup {
        return base * consumed / warmup;
    }
    let progress = ((consumed - warmup) / (total - warmup)).clamp(0.0, 1.0);
    base * match kind {
        LrSchedulerType::Constant => 1.0,
        LrSchedulerType::Linear => 1.0 - progress,
        LrSchedulerType::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        LrSchedulerType::WarmupStableDecay => unreachable!("its closed form is infinite_schedule"),
    }
}

/// Ibrahim et al.'s infinite schedule, written out by phases: the warm-up, a
/// cosine from 1 to `stable` over `cooldown` examples, `stable` until `decay`
/// examples before the end, then a cosine from `stable` to `min`.
fn infinite_schedule(consumed: f64, warmup: f64, total: f64, phases: [f64; 4]) -> f64 {
    let [stable, cooldown, decay, min] = phases;
    let half_cosine = |t: f64| 0.5 * (1.0 + (std::f64::consts::PI * t.min(1.0)).cos());
    if consumed < warmup {
        consumed / warmup
    } else if consumed < warmup + cooldown {
        stable + (1.0 - stable) * half_cosine((consumed - warmup) / cooldown)
    } else if consumed < total - decay {
        stable
    } else {
        min + (stable - min) * half_cosine((consumed - (total - decay)) / decay)
    }
}

fn lr_run(a: &TrainingArgs, n: usize) -> Vec<StepLog> {
    let log = temp_log("lr");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    adabatch::Run::new(&dataset(n, 8), &collate, &a)
        .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
        .unwrap();
    read_log(&log)
}

fn assert_lr(logs: &[StepLog], kind: LrSchedulerType, base: f64, warmup_ratio: f64, total: f64) {
    let warmup = warmup_ratio * total;
    let mut consumed = 0;
    for l in logs {
        let expected = closed_form(kind, base, consumed as f64, warmup, total);
        assert!(
            (l.learning_rate - expected).abs() <= 1e-12 * base,
            "step {}: lr {} vs {expected} ({kind:?}, consumed {consumed} of {total})",
            l.step,
            l.learning_rate
        );
        consumed += l.global_batch;
    }
}

#[test]
fn linear_and_cosine_with_warmup_follow_examples_consumed() {
    // interval(5, +1): the global batch grows, so steps and examples differ.
    for kind in [LrSchedulerType::Linear, LrSchedulerType::Cosine] {
        for world in [1, 2] {
            let mut a = args(world, 1, 4);
            a.lr.lr_scheduler_type = kind;
            a.lr.warmup_ratio = 0.2;
            a.lr.learning_rate = 0.01;
            let logs = lr_run(&a, 10);
            // The horizon is the whole planned run: 4 epochs of 10 examples.
            let total: usize = logs.iter().map(|l| l.global_batch).sum();
            assert_eq!(total, 40);
            assert!(logs.iter().any(|l| l.global_batch > world));
            assert_eq!(logs[0].learning_rate, 0.0, "warm-up starts at 0");
            assert_lr(&logs, kind, 0.01, 0.2, 40.0);
        }
    }
}

/// `warmup_stable_decay` on a growing batch, on 1 and 2 ranks: the logged rates
/// follow the infinite schedule's phases over the 40 examples (warm-up 4, cooldown
/// 8 to 0.4, stable, the last 10 decaying to 0.1); a phase flag without the kind,
/// or phases longer than the run, are typed errors before the first step.
#[test]
fn warmup_stable_decay_follows_its_phases_over_examples_consumed() {
    for world in [1, 2] {
        let mut a = args(world, 1, 4);
        a.lr.lr_scheduler_type = LrSchedulerType::WarmupStableDecay;
        (a.lr.warmup_ratio, a.lr.learning_rate) = (0.1, 0.01);
        a.lr.lr_stable_ratio = Some(0.4);
        a.lr.lr_cooldown_ratio = Some(0.2);
        a.lr.lr_decay_ratio = Some(0.25);
        a.lr.min_lr_ratio = Some(0.1);
        let logs = lr_run(&a, 10);
        let mut consumed = 0;
        for l in &logs {
            let want = 0.01 * infinite_schedule(consumed as f64, 4.0, 40.0, [0.4, 8.0, 10.0, 0.1]);
            assert!(
                (l.learning_rate - want).abs() < 1e-12,
                "step {}: {} vs {want}",
                l.step,
                l.learning_rate
            );
            consumed += l.global_batch;
        }
        assert_eq!(consumed, 40);
        assert!(
            logs.iter().any(|l| (l.learning_rate - 0.004).abs() < 1e-12),
            "a stable phase"
        );
    }
    let refused = |edit: fn(&mut TrainingArgs)| {
        let mut a = args(1, 1, 4);
        edit(&mut a);
        let launched = adabatch::Run::new(&dataset(10, 8), &collate, &a)
            .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }));
        let Err(err) = launched else {
            panic!("the settings were taken")
        };
        assert!(matches!(err, adabatch::Error::Settings(_)), "{err}");
        err.to_string()
    };
    let message = refused(|a| a.lr.lr_decay_ratio = Some(0.2));
    assert!(message.contains("warmup_stable_decay"), "{message}");
    refused(|a| {
        a.lr.lr_scheduler_type = LrSchedulerType::WarmupStableDecay;
        (a.lr.warmup_ratio, a.lr.lr_cooldown_ratio) = (0.5, Some(0.4));
    });
    refused(|a| {
        a.lr.lr_scheduler_type = LrSchedulerType::WarmupStableDecay;
        (a.lr.lr_stable_ratio, a.lr.min_lr_ratio) = (Some(0.2), Some(0.3));
    });
}

#[test]
fn warmup_steps_warm_up_over_the_examples_of_the_first_steps() {
    // interval(5, +1): the warm-up ends after the examples of the first 6 steps,
    // and `--warmup-steps` overrides `--warmup-ratio` (HF).
    for kind in [LrSchedulerType::Linear, LrSchedulerType::Constant] {
        for world in [1, 2] {
            let mut a = args(world, 1, 4);
            a.lr.lr_scheduler_type = kind;
            a.lr.warmup_steps = 6;
            a.lr.warmup_ratio = 0.5;
            a.lr.learning_rate = 0.01;
            let logs = lr_run(&a, 10);
            let warm: usize = logs[..6].iter().map(|l| l.global_batch).sum();
            assert!(logs[..6].iter().any(|l| l.global_batch > world));
            assert_lr(&logs, kind, 0.01, warm as f64 / 40.0, 40.0);
            assert!(logs[5].learning_rate < 0.01 && logs[6].learning_rate > logs[5].learning_rate);
        }
    }
    // A constant batch: HF's step-wise ramp, 0, 1/4, 2/4, 3/4 of the peak, then
    // the peak.
    hand_trainer!(Constant, candle_nn::AdamW, TrainerPolicy::DEFAULT);
    let log = temp_log("lr-warmup-steps");
    let mut a = args(1, 2, 1);
    a.lr.warmup_steps = 4;
    a.lr.learning_rate = 0.5;
    a.logging.log_jsonl = Some(log.clone());
    adabatch::Run::new(&dataset(20, 8), &collate, &a)
        .launch(adamw_factory(|model, opt| Constant { model, opt }))
        .unwrap();
    let lrs: Vec<f64> = read_log(&log).iter().map(|l| l.learning_rate).collect();
    assert_eq!(lrs, [0.0, 0.125, 0.25, 0.375, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]);
}

#[test]
fn linear_schedule_with_max_steps_reaches_a_tenth_at_step_ten() {
    // A constant batch of 2 for 10 steps.
    hand_trainer!(Constant, candle_nn::AdamW, TrainerPolicy::DEFAULT);
    let log = temp_log("lr-max-steps");
    let mut a = args(1, 2, 5);
    a.length.max_steps = Some(10);
    a.lr.lr_scheduler_type = LrSchedulerType::Linear;
    a.lr.learning_rate = 0.5;
    a.logging.log_jsonl = Some(log.clone());
    adabatch::Run::new(&dataset(50, 8), &collate, &a)
        .launch(adamw_factory(|model, opt| Constant { model, opt }))
        .unwrap();
    let logs = read_log(&log);
    assert_eq!(logs.len(), 10);
    // The horizon is the 20 examples the 10 steps take, not 5 epochs of 50.
    assert_eq!(logs[0].learning_rate, 0.5);
    assert!(
        (logs[9].learning_rate - 0.05).abs() < 1e-12,
        "{}",
        logs[9].learning_rate
    );
    assert_lr(&logs, LrSchedulerType::Linear, 0.5, 0.0, 20.0);
}

#[test]
fn drop_last_horizon_excludes_dropped_examples() {
    hand_trainer!(Constant, candle_nn::AdamW, TrainerPolicy::DEFAULT);
    // N = 10, batches of 3, drop_last: 3 steps (9 examples) per epoch, 2 epochs.
    let log = temp_log("lr-drop-last");
    let mut a = args(1, 3, 2);
    a.data.dataloader_drop_last = Some(true);
    a.lr.lr_scheduler_type = LrSchedulerType::Linear;
    a.lr.learning_rate = 0.6;
    a.logging.log_jsonl = Some(log.clone());
    adabatch::Run::new(&dataset(10, 8), &collate, &a)
        .launch(adamw_factory(|model, opt| Constant { model, opt }))
        .unwrap();
    let logs = read_log(&log);
    assert_eq!(logs.len(), 6);
    assert!(logs.iter().all(|l| l.global_batch == 3));
    // Horizon 18, not 20: step 6 starts at 15 consumed, lr = 0.6 · 3/18.
    assert!(
        (logs[5].learning_rate - 0.1).abs() < 1e-12,
        "{}",
        logs[5].learning_rate
    );
    assert_lr(&logs, LrSchedulerType::Linear, 0.6, 0.0, 18.0);
}
