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
            .join(format!("checkpoint-{step}/adabatch_state.json"))
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
    let state = std::fs::read_to_string(out.join("checkpoint-3/adabatch_state.json")).unwrap();
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
    let path = out.join("checkpoint-3/adabatch_state.json");
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

/// `transformers`' `TrainerState` fields (4.46; 4.57 adds `best_global_step`):
/// `TrainerState.load_from_json` builds the dataclass from every top-level key,
/// so `trainer_state.json` holds these and no other.
const HF_TRAINER_STATE: [&str; 19] = [
    "epoch",
    "global_step",
    "max_steps",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "train_batch_size",
    "num_train_epochs",
    "num_input_tokens_seen",
    "total_flos",
    "log_history",
    "best_metric",
    "best_model_checkpoint",
    "is_local_process_zero",
    "is_world_process_zero",
    "is_hyper_param_search",
    "trial_name",
    "trial_params",
    "stateful_callbacks",
];

fn hf_state(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("trainer_state.json")).unwrap()).unwrap()
}

/// A checkpoint's `trainer_state.json` is `transformers`' `TrainerState`: HF's keys
/// only, `log_history` with each logged step's `loss`, `learning_rate`, `step` and
/// `epoch`; adabatch's resume state is `adabatch_state.json` beside it. A resumed
/// run's history continues the checkpoint's: its last checkpoint's
/// `trainer_state.json` is the uninterrupted run's. A checkpoint of the layout
/// before (adabatch's state in `trainer_state.json`) still resumes.
#[test]
fn trainer_state_json_is_hf_s_and_a_resume_continues_its_history() {
    let out = temp_log("hf-state").with_extension("");
    let mut a = args(2, 1, 10);
    a.length.max_steps = Some(12);
    a.save.save_steps = 4;
    a.logging.logging_steps = 2;
    a.save.output_dir = out.clone();
    assert_eq!(run(&a).0.unwrap().global_step, 12);
    let state = hf_state(&out.join("checkpoint-8"));
    let keys: Vec<&str> = state
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = HF_TRAINER_STATE.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(
        (state["global_step"].as_u64(), state["max_steps"].as_u64()),
        (Some(8), Some(12))
    );
    let history = state["log_history"].as_array().unwrap();
    assert_eq!(history.len(), 4, "steps 2, 4, 6 and 8 logged: {history:?}");
    for (entry, step) in history.iter().zip([2, 4, 6, 8]) {
        assert_eq!(entry["step"].as_u64(), Some(step));
        for key in ["loss", "learning_rate", "epoch", "grad_norm"] {
            assert!(entry[key].is_number(), "{key} of step {step}: {entry}");
        }
    }
    let full_end = hf_state(&out.join("checkpoint-12"));

    // Resumed from step 4 into a folder of its own: the same history at step 12.
    let resumed_out = temp_log("hf-state-resumed").with_extension("");
    let mut resumed = a.clone();
    resumed.save.output_dir = resumed_out.clone();
    resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-4"));
    assert_eq!(run(&resumed).0.unwrap().global_step, 12);
    assert_eq!(hf_state(&resumed_out.join("checkpoint-12")), full_end);

    // The layout before: adabatch's state in trainer_state.json, no file of its own.
    let legacy = out.join("checkpoint-8");
    std::fs::rename(
        legacy.join("adabatch_state.json"),
        legacy.join("trainer_state.json"),
    )
    .unwrap();
    adabatch::train::checkpoint::write_manifest(&legacy).unwrap();
    let mut from_legacy = a.clone();
    from_legacy.save.output_dir = temp_log("hf-state-legacy").with_extension("");
    from_legacy.save.resume_from_checkpoint = Some(legacy);
    assert_eq!(run(&from_legacy).0.unwrap().global_step, 12);
    for dir in [out, resumed_out, from_legacy.save.output_dir] {
        let _ = std::fs::remove_dir_all(dir);
    }
}
