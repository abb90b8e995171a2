//! Checkpoints: a resumed run continues mid-epoch with the same batches, and with a
//! stateless optimizer the same updates, as the run it was saved from.

use crate::common;

use std::sync::Mutex;

use adabatch::prelude::*;
use adabatch::{CheckpointError, Error, Growth, ScheduleSpec, StepLog, TrainerPolicy};
use candle_nn::{Optimizer, SGD};
use common::*;

hand_trainer!(
    SgdGrowing,
    SGD,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 3,
            growth: Growth::Add(1)
        },
        ..TrainerPolicy::DEFAULT
    }
);

type Run = (adabatch::Result<TrainSummary>, Vec<StepLog>, Vec<f32>);

fn run(a: &TrainingArgs) -> Run {
    run_on(&dataset(20, 6), a)
}

fn run_on<D: Dataset<Item = Example> + ?Sized>(data: &D, a: &TrainingArgs) -> Run {
    let log = temp_log("checkpoint");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let rank0 = Mutex::new(None);
    let result = adabatch::Run::new(data, &collate, &a)
        .launch(|ctx: &RankContext| {
            let params = ctx.parameters();
            let model = Regression::new(params.clone(), ctx.device())?;
            if ctx.rank() == 0 {
                *rank0.lock().unwrap() = Some(params.clone());
            }
            Ok(SgdGrowing {
                model,
                opt: SGD::new(params.all_vars(), 0.05)?,
            })
        })
        .map(|trained| trained.summary);
    let weights = rank0
        .into_inner()
        .unwrap()
        .map_or_else(Vec::new, |p: adabatch::Parameters| flat(p.all_vars()));
    let logs = if log.exists() {
        read_log(&log)
    } else {
        Vec::new()
    };
    (result, logs, weights)
}

#[test]
fn resume_continues_with_the_same_batches_and_updates() {
    let out = temp_log("ckpt-dir").with_extension("");
    let mut a = args(2, 1, 10);
    a.length.max_steps = Some(12);
    a.save.save_steps = 5;
    a.save.output_dir = out.clone();
    let (full, full_logs, full_weights) = run(&a);
    assert_eq!(full.unwrap().global_step, 12);
    for step in [5, 10, 12] {
        assert!(
            out.join(format!("checkpoint-{step}/model.safetensors"))
                .exists(),
            "checkpoint-{step}"
        );
        assert!(out
            .join(format!("checkpoint-{step}/trainer_state.json"))
            .exists());
    }
    let state = adabatch::train::checkpoint::load_state(&out.join("checkpoint-5"))
        .unwrap()
        .planner;
    assert_eq!(
        (state.global_step, state.epoch_index, state.position),
        (5, 0, 14)
    );

    let mut resumed_args = args(2, 1, 10);
    resumed_args.length.max_steps = Some(12);
    resumed_args.save.resume_from_checkpoint = Some(out.join("checkpoint-5"));
    let (resumed, resumed_logs, resumed_weights) = run(&resumed_args);
    assert_eq!(resumed.unwrap().global_step, 12);
    assert_eq!(resumed_logs.len(), 7);
    for (r, f) in resumed_logs.iter().zip(&full_logs[5..]) {
        assert_eq!(r.step, f.step);
        assert_eq!(r.indices, f.indices, "step {}", r.step);
        assert_eq!((r.epoch, r.train_coverage), (f.epoch, f.train_coverage));
        assert!(
            (r.loss - f.loss).abs() < 1e-6,
            "step {}: {} vs {}",
            r.step,
            r.loss,
            f.loss
        );
    }
    let diff = full_weights
        .iter()
        .zip(&resumed_weights)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-6, "{diff}");
}

#[test]
fn resume_refuses_a_checkpoint_of_another_run() {
    let out = temp_log("ckpt-other").with_extension("");
    let mut a = args(2, 1, 1);
    a.length.max_steps = Some(3);
    a.save.save_steps = 3;
    a.save.output_dir = out.clone();
    run(&a).0.unwrap();
    // Another number of ranks is fine (tests/it/resume.rs); another seed is not.
    let mut other = args(1, 1, 1);
    other.data.seed = Some(4);
    other.save.resume_from_checkpoint = Some(out.join("checkpoint-3"));
    let err = run(&other).0.unwrap_err();
    assert!(
        matches!(err, Error::Checkpoint(CheckpointError::CheckpointMismatch { ref what, .. }) if what == "seed"),
        "{err}"
    );
    other.save.resume_from_checkpoint = Some(out.join("checkpoint-99"));
    assert!(matches!(
        run(&other).0.unwrap_err(),
        Error::Checkpoint(CheckpointError::NoSuchCheckpoint { .. })
    ));
}

/// Length-aware batches (a token budget): a checkpoint in the middle of an epoch
/// holds the epoch's plan, and the resumed run, on the same or another number of
/// ranks, continues it with the same batches and, on the same ranks, the same
/// weights bit for bit.
#[test]
fn length_aware_runs_resume_mid_epoch() {
    let data =
        WithLengths::new(dataset(40, 6), (0..40).map(|i| 3 + (i * 7) % 11).collect()).unwrap();
    let out = temp_log("ckpt-length").with_extension("");
    let mut a = args(2, 1, 2);
    a.length_aware.max_tokens_per_batch = Some(60);
    a.save.save_steps = 3;
    a.save.output_dir = out.clone();
    let (full, full_logs, full_weights) = run_on(&data, &a);
    let steps = full.unwrap().global_step;
    let first_epoch = full_logs.iter().filter(|l| l.epoch <= 1.0).count();
    assert!(
        first_epoch > 3,
        "checkpoint-3 must be mid-epoch ({first_epoch} steps)"
    );
    let state = std::fs::read_to_string(out.join("checkpoint-3/trainer_state.json")).unwrap();
    assert!(state.contains("planned_epoch"), "{state}");

    let mut resumed = a.clone();
    resumed.save.save_steps = 0;
    resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-3"));
    let (summary, logs, weights) = run_on(&data, &resumed);
    assert_eq!(summary.unwrap().global_step, steps);
    assert_eq!(logs.len(), full_logs.len() - 3);
    for (r, s) in logs.iter().zip(&full_logs[3..]) {
        assert_eq!((r.step, &r.indices), (s.step, &s.indices));
        assert_eq!(r.loss.to_bits(), s.loss.to_bits(), "step {}", r.step);
    }
    assert_eq!(weights, full_weights);

    // On one rank: the same global batches.
    let one = {
        let mut args = resumed.clone();
        args.launch.nproc_per_node = 1;
        args
    };
    let (_, one_logs, _) = run_on(&data, &one);
    let global = |l: &StepLog| l.indices.concat();
    assert_eq!(
        one_logs.iter().map(global).collect::<Vec<_>>(),
        full_logs[3..].iter().map(global).collect::<Vec<_>>()
    );

    // A plan that does not cover the rest of the epoch is a corrupt checkpoint.
    let path = out.join("checkpoint-3/trainer_state.json");
    let mut json: serde_json::Value = serde_json::from_str(&state).unwrap();
    json["planned_epoch"]["batches"]
        .as_array_mut()
        .unwrap()
        .pop();
    std::fs::write(&path, json.to_string()).unwrap();
    // The manifest sees the edit first, and names the file.
    let (err, _, _) = run_on(&data, &resumed);
    let err = err.unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::CorruptCheckpoint { path: p, .. }) if *p == path),
        "{err}"
    );
    assert!(
        err.to_string().contains("changed after it was saved"),
        "{err}"
    );
    // An edit made on purpose (the manifest rewritten) meets the plan's own check.
    adabatch::train::checkpoint::write_manifest(&out.join("checkpoint-3")).unwrap();
    let (err, _, _) = run_on(&data, &resumed);
    let err = err.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Checkpoint(CheckpointError::CorruptCheckpoint { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("remaining batches"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}
