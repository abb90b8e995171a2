//! End-to-end tests of the engine: the design's reference trace, world-size
//! invariance, reweighting against hand-computed updates.

use crate::common;

use adabatch::prelude::*;
use std::sync::Mutex;

use candle_core::Device;
use candle_nn::{Optimizer, SGD};
use common::*;

fn interval_factory(ctx: &RankContext) -> adabatch::Result<IntervalTrainer> {
    let model = Regression::new(ctx.parameters(), ctx.device())?;
    let opt = adamw(&model, 0.05)?;
    Ok(IntervalTrainer { model, opt })
}

#[test]
fn reference_trace_of_the_design() {
    // N = 10, 2 ranks, initial size 1, interval(5, +1), drop_last = false.
    let data = dataset(10, 1);
    let log = temp_log("reference_trace");
    let mut a = args(2, 1, 10);
    a.length.max_steps = Some(14);
    a.logging.log_jsonl = Some(log.clone());
    let summary = adabatch::Run::new(&data, &collate, &a)
        .launch(interval_factory)
        .map(|trained| trained.summary)
        .unwrap();
    assert_eq!(summary.global_step, 14);
    let steps = read_log(&log);
    let expected: [(usize, [usize; 2], f64, f64); 14] = [
        (1, [1, 1], 0.2, 0.2),
        (2, [1, 1], 0.4, 0.4),
        (3, [1, 1], 0.6, 0.6),
        (4, [1, 1], 0.8, 0.8),
        (5, [1, 1], 1.0, 1.0),
        (6, [2, 2], 0.4, 1.4),
        (7, [2, 2], 0.8, 1.8),
        (8, [1, 1], 1.0, 2.0),
        (9, [2, 2], 0.4, 2.4),
        (10, [2, 2], 0.8, 2.8),
        (11, [1, 1], 1.0, 3.0),
        (12, [3, 3], 0.6, 3.6),
        (13, [2, 2], 1.0, 4.0),
        (14, [3, 3], 0.6, 4.6),
    ];
    assert_eq!(steps.len(), expected.len());
    for (log, (step, sizes, coverage, epoch)) in steps.iter().zip(expected) {
        assert_eq!(log.step, step);
        assert_eq!(log.local_batch_sizes, sizes.to_vec(), "step {step}");
        assert!(
            (log.train_coverage - coverage).abs() < 1e-9,
            "step {step}: coverage {}",
            log.train_coverage
        );
        assert!(
            (log.epoch - epoch).abs() < 1e-9,
            "step {step}: epoch {}",
            log.epoch
        );
        assert_eq!(
            log.indices.iter().map(Vec::len).collect::<Vec<_>>(),
            sizes.to_vec()
        );
        assert!(log.loss.is_finite() && log.grad_norm.is_finite());
    }
    // Every epoch's indices are a permutation of 0..10.
    let epoch_one: Vec<usize> = steps[..5].iter().flat_map(|s| s.indices.concat()).collect();
    let mut sorted = epoch_one.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
}

fn doubling_run(world: usize, per_device: usize, reweight_tokens: bool) -> adabatch::TrainSummary {
    let data = dataset(37, 5);
    let a = args(world, per_device, 3);
    if reweight_tokens {
        adabatch::Run::new(&data, &collate, &a)
            .launch(|ctx: &RankContext| {
                let mut model = Regression::new(ctx.parameters(), ctx.device())?;
                model.token_sum = true;
                let opt = adamw(&model, 0.05)?;
                Ok(TokenTrainer { model, opt })
            })
            .map(|trained| trained.summary)
            .unwrap()
    } else {
        adabatch::Run::new(&data, &collate, &a)
            .launch(adamw_factory(|model, opt| DoublingTrainer { model, opt }))
            .map(|trained| trained.summary)
            .unwrap()
    }
}

fn assert_same_losses(a: &adabatch::TrainSummary, b: &adabatch::TrainSummary) {
    assert_eq!(a.global_step, b.global_step);
    assert_eq!(a.examples_seen, b.examples_seen);
    for (step, (x, y)) in a.step_losses.iter().zip(&b.step_losses).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * x.abs().max(1.0),
            "step {}: {x} vs {y}",
            step + 1
        );
    }
}

#[test]
fn world_size_invariance_sample_count() {
    // W ranks of b and one rank of W*b see the same global batches; with
    // sample-count reweighting they compute the same losses and updates.
    let single = doubling_run(1, 4, false);
    assert!(single.global_step >= 8, "{}", single.global_step);
    assert_same_losses(&doubling_run(2, 2, false), &single);
    assert_same_losses(&doubling_run(4, 1, false), &single);
}

#[test]
fn world_size_invariance_token_count() {
    let single = doubling_run(1, 3, true);
    assert_same_losses(&doubling_run(3, 1, true), &single);
}

/// Weights (`[w0..w3, b]`) after one SGD step from zero weights, as trained by the
/// engine on `world` ranks.
fn one_sgd_step(world: usize, per_device: usize, rank_mean: bool) -> Vec<f32> {
    let data = dataset(3, 9);
    let mut a = args(world, per_device, 1);
    a.length.max_steps = Some(1);
    // The engine sets the optimizer's rate from the args every step.
    a.lr.learning_rate = 0.1;
    // Vars share storage with their clones: rank 0's store shows the trained weights.
    let rank0 = Mutex::new(None);
    let build = |ctx: &RankContext| -> adabatch::Result<(Regression, SGD)> {
        let params = ctx.parameters();
        let model = Regression::new(params.clone(), ctx.device())?;
        for (_, var) in params.named_parameters() {
            var.set(&var.as_tensor().zeros_like()?)?;
        }
        if ctx.rank() == 0 {
            *rank0.lock().unwrap() = Some(params.clone());
        }
        Ok((model, SGD::new(params.all_vars(), 0.1)?))
    };
    if rank_mean {
        adabatch::Run::new(&data, &collate, &a)
            .launch(|ctx: &RankContext| {
                build(ctx).map(|(model, opt)| SgdRankMeanTrainer { model, opt })
            })
            .map(|trained| trained.summary)
    } else {
        adabatch::Run::new(&data, &collate, &a)
            .launch(|ctx: &RankContext| build(ctx).map(|(model, opt)| SgdTrainer { model, opt }))
            .map(|trained| trained.summary)
    }
    .unwrap();
    let params = rank0.into_inner().unwrap().unwrap();
    let named = params.named_parameters();
    let value = |name: &str| {
        let var = &named.iter().find(|(n, _)| n == name).unwrap().1;
        var.as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let mut weights = value("linear.weight");
    weights.extend(value("linear.bias"));
    weights
}

/// d/dθ of (θ·[x, 1] - y)² at θ = 0 is -2y[x, 1].
fn grad_at_zero(e: &Example) -> Vec<f32> {
    e.x.iter().chain([&1.0]).map(|v| -2.0 * e.y * v).collect()
}

fn sgd_update(grad: &[f32]) -> Vec<f32> {
    grad.iter().map(|g| -0.1 * g).collect()
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

#[test]
fn sample_count_update_matches_hand_computation() {
    let data = dataset(3, 9);
    let grads: Vec<Vec<f32>> = data.iter().map(grad_at_zero).collect();
    let mean: Vec<f32> = (0..=FEATURES)
        .map(|k| grads.iter().map(|g| g[k]).sum::<f32>() / 3.0)
        .collect();
    let expected = sgd_update(&mean);
    // One rank of 3, and two ranks splitting the 3 examples as [2, 1].
    assert_close(&one_sgd_step(1, 3, false), &expected);
    assert_close(&one_sgd_step(2, 2, false), &expected);
}

#[test]
fn rank_mean_update_is_the_mean_of_rank_means() {
    let data = dataset(3, 9);
    let grads: Vec<Vec<f32>> = data.iter().map(grad_at_zero).collect();
    // Ranks get [0, 1] and [2] (no shuffle): DDP averages the two rank means.
    let mean: Vec<f32> = (0..=FEATURES)
        .map(|k| ((grads[0][k] + grads[1][k]) / 2.0 + grads[2][k]) / 2.0)
        .collect();
    assert_close(&one_sgd_step(2, 2, true), &sgd_update(&mean));
}

// Empty ranks, token weights and clipping against hand computations: tests/it/numerics.rs.

#[test]
fn train_on_one_rank_matches_launch() {
    let data = dataset(20, 2);
    let a = args(1, 3, 2);
    let via_launch = adabatch::Run::new(&data, &collate, &a)
        .launch(interval_factory)
        .map(|trained| trained.summary)
        .unwrap();
    let ctx_model = Regression::new(adabatch::Parameters::new(3), &Device::Cpu).unwrap();
    let opt = adamw(&ctx_model, 0.05).unwrap();
    let via_train = adabatch::Run::new(&data, &collate, &a)
        .train(&mut IntervalTrainer {
            model: ctx_model,
            opt,
        })
        .unwrap();
    assert_eq!(via_launch.step_losses, via_train.step_losses);
}
