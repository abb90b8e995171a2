//! One test per public setting of `TrainingArgs` (and the public entry points and
//! memory-model combinators) that had none elsewhere.
//!
//! | flag / API                         | test                                                   |
//! |------------------------------------|--------------------------------------------------------|
//! | every flag, CLI names and defaults | `cli_parses_every_flag`, `cli_defaults_and_bad_values`  |
//! | `--logging-steps` > 1              | `logging_steps_logs_every_kth_step_and_the_last`,      |
//! |                                    | `logging_steps_logs_the_last_step_of_an_epoch_run` (ignored: bug) |
//! | `--max-tokens-per-batch`           | `token_budget_sizes_follow_the_budget` (+ memory.rs)    |
//! | `--packed-token-budget`            | tokens.rs `a_packed_token_budget_trains_every_...`, `cli_parses_every_flag` |
//! | `--friendly-batch-sizes`           | `friendly_batch_sizes_round_down_to_2n_or_3x2n`         |
//! | `--even-batch-sizes`               | `even_batch_sizes_round_down_to_even`                   |
//! | `--max-batch-growth`               | `max_batch_growth_caps_growth_between_batches`          |
//! | `--keep-first-batches` > 1         | `keep_first_batches_keeps_the_hardest_batches_first`    |
//! | `--memory-margin`                  | `memory_margin_scales_the_unfitted_predictions`         |
//! | `launch_group`                     | `launch_group_with_local_members_matches_launch`,       |
//! |                                    | properties.rs `every_rank_runs_the_same_steps`          |
//! | `memory::memory_model::MostConservative`  | `most_conservative_takes_the_largest_prediction`        |
//! | `MemoryModel::observe` (regressor) | `a_user_regressor_observes_every_ranks_batches`,        |
//! |                                    | `empty_slices_are_not_observed` (ignored: bug)          |
//! | `--max-grad-norm`                  | numerics.rs `max_grad_norm_clips_to_the_given_norm`     |
//! | `--lr-scheduler-type`, `--warmup-ratio` | numerics.rs `linear_and_cosine_with_warmup_...`    |
//! | `--warmup-steps`                   | numerics.rs `warmup_steps_warm_up_over_...`             |
//! | `--max-steps`                      | numerics.rs `linear_schedule_with_max_steps_...`, engine.rs |
//! | `--dataloader-drop-last`           | numerics.rs `drop_last_horizon_...`, properties.rs      |
//! | `--nproc-per-node`, `--seed`       | engine.rs, properties.rs                                |
//! | `--oom`, `--inject-oom-at-steps`   | oom.rs                                                  |
//! | `--save-steps`, `--output-dir`, `--resume-from-checkpoint` | checkpoint.rs                   |
//! | `--device`                         | errors.rs (`Device`), tests/gpu.rs                      |
//! | `--rampup-in-tokens`, `ramp(.., tokens = n, ..)` | token_ramp.rs                   |
//! | `--mix-weights`, `Sources`, `#[mixer]` | mixing.rs                                     |
//! | `--stopping-strategy`              | mixing.rs `the_stopping_strategy_flag`                 |
//! | `--eval-steps`, `--per-device-eval-batch-size`, `launch_with_eval` | eval.rs          |
//! | `--eval-strategy`, `--save-strategy`, `--load-best-model-at-end`, `--metric-for-best-model`, `--greater-is-better` | best_model.rs, train::best unit tests |
//! | `--dataloader-num-workers`         | prefetch.rs                                             |
//! | `--release-freed-memory`           | tests/host_heap.rs (a binary of its own)                |
//! | `--gradient-accumulation-steps`    | `gradient_accumulation_steps_replaces_grad_accum`       |
//! | `--bf16`, `--fp16`, `--fp16-initial-scale-power` | precision.rs                              |
//! | `--log-jsonl`                      | every file reading logs; errors.rs (`Io`)               |
//! | `--log-indices`, `--quiet`, `--disable-tqdm` | `console_flags_do_not_change_the_run`         |
//! | `--logging-first-step`             | `logging_first_step_logs_step_one_too`                  |
//! | `--eval-on-start`                  | eval.rs `eval_on_start_evaluates_the_untrained_model`   |
//! | `--max-train-tokens`               | `max_train_tokens_parses_and_excludes_max_steps`, domains.rs, mixing.rs |
//!
//! File names are modules of this binary (`tests/it/`) unless a path says otherwise.
//! The error variants and their tests are tabled in tests/it/errors.rs.

use crate::common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use adabatch::memory::memory_model::{cpu_memory_proxy, MostConservative};
use adabatch::prelude::*;
use adabatch::{
    BatchFeatures, LrSchedulerType, MemoryModel, OnlineMemoryModel, OomPolicy, ScheduleSpec,
    StepLog, TrainerPolicy,
};
use candle_core::Device;
use candle_nn::AdamW;
use clap::{CommandFactory, Parser};
use common::*;

// ---------------------------------------------------------------------------
// CLI

#[test]
fn max_train_tokens_parses_and_excludes_max_steps() {
    let a = TrainingArgs::try_parse_from(["train", "--max-train-tokens", "1000"]).unwrap();
    assert_eq!(a.length.max_train_tokens, Some(1000));
    let both = ["train", "--max-train-tokens", "1000", "--max-steps", "3"];
    assert!(TrainingArgs::try_parse_from(both).is_err());
}

#[test]
fn cli_parses_every_flag() {
    let a = TrainingArgs::try_parse_from([
        "train",
        "--num-train-epochs",
        "7",
        "--max-steps",
        "11",
        "--per-device-train-batch-size",
        "3",
        "--learning-rate",
        "0.25",
        "--lr-scheduler-type",
        "cosine",
        "--warmup-ratio",
        "0.1",
        "--seed",
        "99",
        "--dataloader-drop-last",
        "true",
        "--nproc-per-node",
        "4",
        "--device",
        "cuda:1",
        "--logging-steps",
        "5",
        "--log-jsonl",
        "run.jsonl",
        "--output-dir",
        "out",
        "--save-steps",
        "6",
        "--resume-from-checkpoint",
        "out/checkpoint-6",
        "--log-indices",
        "--quiet",
        "--disable-tqdm",
        "--max-tokens-per-batch",
        "512",
        "--packed-token-budget",
        "--friendly-batch-sizes",
        "--even-batch-sizes",
        "--keep-first-batches",
        "2",
        "--max-batch-growth",
        "0.5",
        "--memory-margin",
        "0.2",
        "--oom",
        "split-retry",
        "--inject-oom-at-steps",
        "3,7",
        "--max-grad-norm",
        "1.5",
        "--eval-steps",
        "9",
        "--per-device-eval-batch-size",
        "64",
        "--dataloader-num-workers",
        "2",
        "--release-freed-memory",
        "--gradient-accumulation-steps",
        "4",
        "--warmup-steps",
        "7",
        "--eval-strategy",
        "epoch",
        "--save-strategy",
        "epoch",
        "--load-best-model-at-end",
        "--metric-for-best-model",
        "accuracy",
        "--greater-is-better",
        "true",
        "--logging-first-step",
        "--eval-on-start",
        "--fp16",
        "--fp16-initial-scale-power",
        "-3",
        "--stopping-strategy",
        "all_exhausted",
    ])
    .unwrap();
    assert_eq!(a.length.num_train_epochs, 7);
    assert_eq!(a.length.max_steps, Some(11));
    assert_eq!(a.batch.per_device_train_batch_size, 3);
    assert_eq!(a.lr.learning_rate, 0.25);
    assert_eq!(a.lr.lr_scheduler_type, LrSchedulerType::Cosine);
    assert_eq!(a.lr.warmup_ratio, 0.1);
    assert_eq!(a.data.seed, Some(99));
    assert_eq!(a.data.dataloader_drop_last, Some(true));
    assert_eq!(a.launch.nproc_per_node, 4);
    assert_eq!(a.launch.device, "cuda:1");
    assert_eq!(a.logging.logging_steps, 5);
    assert_eq!(a.logging.log_jsonl, Some(PathBuf::from("run.jsonl")));
    assert_eq!(a.save.output_dir, PathBuf::from("out"));
    assert_eq!(a.save.save_steps, 6);
    assert_eq!(
        a.save.resume_from_checkpoint,
        Some(PathBuf::from("out/checkpoint-6"))
    );
    assert!(a.logging.log_indices && a.logging.quiet && a.logging.disable_tqdm);
    assert_eq!(a.length_aware.max_tokens_per_batch, Some(512));
    assert!(a.length_aware.friendly_batch_sizes && a.length_aware.even_batch_sizes);
    assert_eq!(a.length_aware.keep_first_batches, 2);
    assert_eq!(a.length_aware.max_batch_growth, Some(0.5));
    assert_eq!(a.length_aware.memory_margin, 0.2);
    assert_eq!(a.step.oom, Some(OomPolicy::SplitRetry));
    assert_eq!(a.step.inject_oom_at_steps, vec![3, 7]);
    assert_eq!(a.step.max_grad_norm, 1.5);
    assert_eq!(a.eval.eval_steps, Some(9));
    assert_eq!(a.eval.per_device_eval_batch_size, 64);
    assert_eq!(a.data.dataloader_num_workers, 2);
    assert!(a.data.release_freed_memory);
    assert_eq!(a.batch.gradient_accumulation_steps, Some(4));
    assert_eq!(a.lr.warmup_steps, 7);
    assert_eq!(
        a.eval.eval_strategy,
        Some(adabatch::IntervalStrategy::Epoch)
    );
    assert_eq!(
        a.save.save_strategy,
        Some(adabatch::IntervalStrategy::Epoch)
    );
    assert!(a.save.load_best_model_at_end);
    assert_eq!(a.save.metric_for_best_model.as_deref(), Some("accuracy"));
    assert_eq!(a.save.greater_is_better, Some(true));
    assert!(a.logging.logging_first_step && a.eval.eval_on_start);
    assert!(a.length_aware.packed_token_budget);
    assert!(a.step.fp16 && !a.step.bf16);
    assert_eq!(a.step.fp16_initial_scale_power, -3);
    assert_eq!(
        a.data.stopping_strategy,
        Some(adabatch::StoppingStrategy::AllExhausted)
    );
    let a =
        TrainingArgs::try_parse_from(["train", "--stopping-strategy", "first-exhausted"]).unwrap();
    assert_eq!(
        a.data.stopping_strategy,
        Some(adabatch::StoppingStrategy::FirstExhausted)
    );
    assert!(
        TrainingArgs::try_parse_from(["train", "--bf16"])
            .unwrap()
            .step
            .bf16
    );
    // One half-precision type per run.
    assert!(TrainingArgs::try_parse_from(["train", "--bf16", "--fp16"]).is_err());
    // The DSL spelling of the OOM policy is accepted too.
    let a = TrainingArgs::try_parse_from(["train", "--oom", "split_retry"]).unwrap();
    assert_eq!(a.step.oom, Some(OomPolicy::SplitRetry));
    for (value, policy) in [
        ("fail", OomPolicy::Fail),
        ("halve", OomPolicy::Halve),
        ("skip", OomPolicy::Skip),
    ] {
        let a = TrainingArgs::try_parse_from(["train", "--oom", value]).unwrap();
        assert_eq!(a.step.oom, Some(policy));
    }
    let a = TrainingArgs::try_parse_from(["train", "--lr-scheduler-type", "linear"]).unwrap();
    assert_eq!(a.lr.lr_scheduler_type, LrSchedulerType::Linear);
    // HF's name, its phases as fractions.
    let a = TrainingArgs::try_parse_from([
        "train",
        "--lr-scheduler-type",
        "warmup_stable_decay",
        "--lr-decay-ratio",
        "0.1",
        "--min-lr-ratio",
        "0.01",
        "--lr-stable-ratio",
        "0.3",
        "--lr-cooldown-ratio",
        "0.2",
    ])
    .unwrap();
    assert_eq!(a.lr.lr_scheduler_type, LrSchedulerType::WarmupStableDecay);
    assert_eq!(
        (
            a.lr.lr_decay_ratio,
            a.lr.min_lr_ratio,
            a.lr.lr_stable_ratio,
            a.lr.lr_cooldown_ratio
        ),
        (Some(0.1), Some(0.01), Some(0.3), Some(0.2))
    );
    let a = TrainingArgs::try_parse_from(["train", "--dataloader-drop-last", "false"]).unwrap();
    assert_eq!(a.data.dataloader_drop_last, Some(false));
}

#[test]
fn cli_defaults_and_bad_values() {
    let a = TrainingArgs::try_parse_from(["train"]).unwrap();
    assert_eq!(a.length.num_train_epochs, 3);
    assert_eq!(a.length.max_steps, None);
    assert_eq!(a.batch.per_device_train_batch_size, 8);
    assert_eq!(a.lr.learning_rate, 5e-5);
    assert_eq!(a.lr.lr_scheduler_type, LrSchedulerType::Constant);
    assert_eq!(a.lr.warmup_ratio, 0.0);
    assert_eq!(a.data.seed, None);
    assert_eq!(a.data.dataloader_drop_last, None);
    assert_eq!(a.launch.nproc_per_node, 1);
    assert_eq!(a.launch.device, "cpu");
    assert_eq!(a.logging.logging_steps, 1);
    assert_eq!(a.logging.log_jsonl, None);
    assert_eq!(a.save.output_dir, PathBuf::from("adabatch_output"));
    assert_eq!(a.save.save_steps, 0);
    assert_eq!(a.save.resume_from_checkpoint, None);
    assert!(!a.logging.log_indices && !a.logging.quiet && !a.logging.disable_tqdm);
    assert_eq!(a.length_aware.max_tokens_per_batch, None);
    assert!(!a.length_aware.friendly_batch_sizes && !a.length_aware.even_batch_sizes);
    assert_eq!(a.length_aware.keep_first_batches, 1);
    assert_eq!(a.length_aware.max_batch_growth, None);
    assert_eq!(a.length_aware.memory_margin, 0.05);
    assert_eq!(a.step.oom, None);
    assert!(a.step.inject_oom_at_steps.is_empty());
    assert_eq!(a.step.max_grad_norm, 0.0);
    assert_eq!(a.data.dataloader_num_workers, 0);
    assert!(!a.data.release_freed_memory);
    assert_eq!(a.batch.gradient_accumulation_steps, None);
    assert_eq!(a.lr.warmup_steps, 0);
    assert_eq!((a.eval.eval_strategy, a.save.save_strategy), (None, None));
    assert!(!a.save.load_best_model_at_end);
    assert!(!a.logging.logging_first_step && !a.eval.eval_on_start);
    assert_eq!(
        (
            a.save.metric_for_best_model.as_deref(),
            a.save.greater_is_better
        ),
        (None, None)
    );
    assert!(!a.step.bf16 && !a.step.fp16);
    assert_eq!(a.step.fp16_initial_scale_power, 16);
    // `Default` is the parse of no arguments.
    let d = TrainingArgs::default();
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        serde_json::to_value(&a).unwrap()
    );
    for bad in [
        &["train", "--oom", "explode"][..],
        &["train", "--lr-scheduler-type", "step"],
        &["train", "--dataloader-drop-last", "maybe"],
        &["train", "--per-device-train-batch-size", "-1"],
        &["train", "--inject-oom-at-steps", "3,x"],
        &["train", "--no-such-flag"],
    ] {
        assert!(TrainingArgs::try_parse_from(bad).is_err(), "{bad:?}");
    }
}

// ---------------------------------------------------------------------------
// Logging

fn logged_run(a: &TrainingArgs, n: usize) -> (TrainSummary, Vec<StepLog>) {
    let log = temp_log("flags");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let summary = adabatch::Run::new(&dataset(n, 3), &collate, &a)
        .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
        .unwrap()
        .summary;
    (summary, read_log(&log))
}

/// Logged steps, and each logged loss against the mean of the step losses since
/// the previous log.
fn check_logging(a: &TrainingArgs, expected_steps: &[usize]) {
    let (summary, logs) = logged_run(a, 20);
    // 20 examples, 2 ranks, interval(5, +1): 5 steps of 2, 2 of 4, then the 2 left.
    assert_eq!(summary.global_step, 8);
    let steps: Vec<usize> = logs.iter().map(|l| l.step).collect();
    assert_eq!(steps, expected_steps);
    let mut from = 0;
    for l in &logs {
        let window = &summary.step_losses[from..l.step];
        let mean = window.iter().sum::<f64>() / window.len() as f64;
        assert!(
            (l.loss - mean).abs() <= 1e-12 * mean.abs().max(1.0),
            "step {}",
            l.step
        );
        assert!(l.grad_norm.is_finite());
        from = l.step;
    }
    // The same run logged at every step has the same losses, and each entry
    // describes its own step.
    let mut every = a.clone();
    every.logging.logging_steps = 1;
    let (all, all_logs) = logged_run(&every, 20);
    assert_eq!(all.step_losses, summary.step_losses);
    assert_eq!(all_logs.len(), 8);
    for l in &logs {
        let same = &all_logs[l.step - 1];
        assert_eq!(l.indices, same.indices);
        assert_eq!(l.learning_rate, same.learning_rate);
        assert_eq!(l.epoch, same.epoch);
        assert_eq!(l.grad_norm, same.grad_norm);
    }
}

#[test]
fn logging_steps_logs_every_kth_step_and_the_last() {
    let mut a = args(2, 1, 1);
    a.logging.logging_steps = 4;
    check_logging(&a, &[4, 8]);
    // A run that ends by max_steps logs its last step too.
    a.logging.logging_steps = 3;
    a.length.max_steps = Some(8);
    a.length.num_train_epochs = 5;
    check_logging(&a, &[3, 6, 8]);
}

#[test]
fn logging_first_step_logs_step_one_too() {
    let mut a = args(2, 1, 1);
    a.logging.logging_steps = 3;
    a.logging.logging_first_step = true;
    check_logging(&a, &[1, 3, 6, 8]);
}

#[test]
fn logging_steps_logs_the_last_step_of_an_epoch_run() {
    let mut a = args(2, 1, 1);
    a.logging.logging_steps = 3;
    check_logging(&a, &[3, 6, 8]);
}

#[test]
fn console_flags_do_not_change_the_run() {
    let (quiet, _) = logged_run(&args(2, 1, 2), 12);
    let mut a = args(2, 1, 2);
    a.logging.quiet = false;
    a.logging.disable_tqdm = true;
    a.logging.log_indices = true;
    let (loud, _) = logged_run(&a, 12);
    assert_eq!(quiet.step_losses, loud.step_losses);
}

/// A short run on 2 ranks, in the dashed flags.
const DASHED_RUN: [&str; 15] = [
    "run",
    "--max-steps",
    "6",
    "--per-device-train-batch-size",
    "2",
    "--nproc-per-node",
    "2",
    "--learning-rate",
    "0.05",
    "--seed",
    "3",
    "--dataloader-drop-last",
    "true",
    "--logging-first-step",
    "--quiet",
];

/// A command pasted from a `transformers` run script: HF's spellings
/// (`--max_steps`, `--learning_rate=..`) and booleans given a value (`--fp16
/// False`, `--dataloader_drop_last True`) are the same run as the dashed flags,
/// step for step; a boolean flag's `False` leaves it off.
#[test]
fn hf_spellings_are_the_same_run_as_the_dashed_flags() {
    let parse = |argv: &[&str]| {
        let argv = adabatch::hf_argv(&TrainingArgs::command(), argv.iter().copied()).unwrap();
        TrainingArgs::try_parse_from(argv).unwrap()
    };
    let dashed = parse(&DASHED_RUN);
    let hf = parse(&[
        "run",
        "--max_steps",
        "6",
        "--per_device_train_batch_size=2",
        "--nproc_per_node",
        "2",
        "--learning_rate=0.05",
        "--seed",
        "3",
        "--dataloader_drop_last",
        "True",
        "--logging_first_step",
        "True",
        "--quiet=1",
        "--fp16",
        "False",
        "--log_indices=false",
    ]);
    assert!(!hf.step.fp16 && !hf.logging.log_indices && hf.logging.quiet);
    let (a, a_logs) = logged_run(&dashed, 20);
    let (b, b_logs) = logged_run(&hf, 20);
    assert_eq!((a.global_step, b.global_step), (6, 6));
    assert_eq!(a.step_losses, b.step_losses);
    assert_eq!(a_logs.len(), b_logs.len());
    for (x, y) in a_logs.iter().zip(&b_logs) {
        assert_eq!(
            (x.step, &x.indices, x.loss.to_bits()),
            (y.step, &y.indices, y.loss.to_bits())
        );
    }
}

/// HF's own dump of its defaults (`TrainingArguments(output_dir=..,
/// logging_dir=..).to_json_string()`, transformers 4.46.3, 131 keys) loads as an
/// arguments file: the keys adabatch has flags for set them (`num_train_epochs`
/// 3.0 as 3, `max_steps` -1 as unset), the others are HF's defaults.
#[test]
fn hf_s_own_arguments_dump_loads() {
    let dir = temp_log("args-file").with_extension("");
    std::fs::create_dir_all(&dir).unwrap();
    let dump = include_str!("../fixtures/hf_training_args_4.46.3.json")
        .replace("OUTPUT_DIR", &dir.join("out").display().to_string());
    let file = dir.join("args.json");
    std::fs::write(&file, dump).unwrap();
    let argv = adabatch::hf_argv(
        &TrainingArgs::command(),
        ["run".into(), file.into_os_string()],
    )
    .unwrap();
    let args = TrainingArgs::try_parse_from(argv).unwrap();
    assert_eq!(args.lr.learning_rate, 5e-5);
    assert_eq!(args.batch.per_device_train_batch_size, 8);
    assert_eq!(
        (args.length.num_train_epochs, args.length.max_steps),
        (3, None)
    );
    assert_eq!(
        (
            args.data.seed,
            args.logging.logging_steps,
            args.save.save_steps
        ),
        (Some(42), 500, 500)
    );
    assert_eq!(args.save.output_dir, dir.join("out"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An arguments file is the same run as its flags; a flag on the command line
/// wins over the file's; a setting HF has and adabatch does not act on is refused
/// away from HF's default, a key neither knows is refused, each naming the file
/// and the key (exit 1 through `error: …` in a program).
#[test]
fn an_arguments_file_is_the_same_run_as_its_flags_and_flags_win() {
    let dir = temp_log("args-file-run").with_extension("");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let parse = |argv: Vec<std::ffi::OsString>| {
        adabatch::hf_argv(&TrainingArgs::command(), argv)
            .and_then(|argv| TrainingArgs::try_parse_from(argv).map_err(adabatch::Error::msg))
    };
    let file = write(
        "run.json",
        r#"{"max_steps": 6, "per_device_train_batch_size": 2, "nproc_per_node": 2,
            "learning_rate": 0.5, "seed": 3, "dataloader_drop_last": true, "quiet": true,
            "logging_first_step": true, "fp16": false, "gradient_checkpointing": false}"#,
    );
    let from_file = parse(vec![
        "run".into(),
        file.into(),
        "--learning_rate".into(),
        "0.05".into(),
    ])
    .unwrap();
    let flags = DASHED_RUN;
    let from_flags = TrainingArgs::try_parse_from(flags).unwrap();
    assert_eq!(from_file.lr.learning_rate, 0.05, "the command line wins");
    let (a, a_logs) = logged_run(&from_file, 20);
    let (b, b_logs) = logged_run(&from_flags, 20);
    assert_eq!((a.step_losses.len(), a.step_losses), (6, b.step_losses));
    assert_eq!(a_logs.len(), b_logs.len());
    for (x, y) in a_logs.iter().zip(&b_logs) {
        assert_eq!(
            (&x.indices, x.loss.to_bits()),
            (&y.indices, y.loss.to_bits())
        );
    }
    for (name, text, says) in [
        (
            "inert.json",
            r#"{"gradient_checkpointing": true}"#,
            "`gradient_checkpointing` = true",
        ),
        (
            "unknown.json",
            r#"{"max_stepz": 3}"#,
            "`max_stepz`: neither a flag",
        ),
        ("broken.json", r#"{"max_steps": "#, "not a JSON object"),
        (
            "typed.json",
            r#"{"quiet": "yes"}"#,
            "expected true or false",
        ),
    ] {
        let path = write(name, text);
        let err = parse(vec!["run".into(), path.clone().into()]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&path.display().to_string()) && message.contains(says),
            "{message}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

hand_trainer!(
    AccumulatingTrainer,
    AdamW,
    TrainerPolicy {
        grad_accum: adabatch::GradAccum::Fixed(3),
        ..INTERVAL_POLICY
    }
);

/// `--gradient-accumulation-steps 3` runs exactly as a policy with
/// `grad_accum = fixed(3)`; 0 is refused.
#[test]
fn gradient_accumulation_steps_replaces_grad_accum() {
    let mut a = args(2, 2, 2);
    let log = temp_log("accum-flag");
    a.logging.log_jsonl = Some(log.clone());
    a.batch.gradient_accumulation_steps = Some(3);
    let data = dataset(40, 3);
    let flagged = adabatch::Run::new(&data, &collate, &a)
        .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
        .unwrap()
        .summary;
    let logs = read_log(&log);
    // Three micro-batches per step; fewer only where an epoch's tail ends a step.
    assert_eq!(logs[0].micro_batches, 3);
    assert!(logs.iter().all(|l| (1..=3).contains(&l.micro_batches)));
    a.batch.gradient_accumulation_steps = None;
    a.logging.log_jsonl = None;
    let keyed = adabatch::Run::new(&data, &collate, &a)
        .launch(adamw_factory(|model, opt| AccumulatingTrainer {
            model,
            opt,
        }))
        .unwrap()
        .summary;
    assert_eq!(flagged.step_losses, keyed.step_losses);
    assert_eq!(flagged.global_step, keyed.global_step);
    a.batch.gradient_accumulation_steps = Some(0);
    let err = adabatch::Run::new(&data, &collate, &a)
        .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
        .unwrap_err();
    assert!(
        matches!(
            err,
            adabatch::Error::Settings(adabatch::SettingsError::InvalidSetting {
                name: "gradient_accumulation_steps",
                ..
            })
        ),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// Length-aware batching options (token budget: sizes are a pure function of the
// lengths and the options, recomputed here from their documented rules).

hand_trainer!(
    OrderedPlain,
    AdamW,
    TrainerPolicy {
        shuffle: false,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(ShuffledPlain, AdamW, TrainerPolicy::DEFAULT);

const N: usize = 60;
const BUDGET: usize = 600;

fn lengths() -> Vec<usize> {
    (0..N).map(|i| 8 + (i * 53) % 120).collect()
}

fn length_data() -> WithLengths<Vec<Example>> {
    WithLengths::new(dataset(N, 21), lengths()).unwrap()
}

/// Examples longest first, ties by index.
fn sorted_by_length() -> Vec<usize> {
    let l = lengths();
    let mut order: Vec<usize> = (0..N).collect();
    order.sort_by(|&a, &b| l[b].cmp(&l[a]).then(a.cmp(&b)));
    order
}

fn largest_friendly(size: usize) -> usize {
    (0..usize::BITS)
        .flat_map(|k| [1usize << k, 3 << k])
        .filter(|&s| s <= size.max(1))
        .max()
        .unwrap()
}

/// The token-budget cut: `budget / length of the batch's longest example`, capped
/// by `growth` (a fraction of the first batch's size) over the previous batch,
/// rounded, and at most what is left.
fn expected_sizes(friendly: bool, even: bool, growth: Option<f64>) -> Vec<usize> {
    let l = lengths();
    let order = sorted_by_length();
    let first = (BUDGET / l[order[0]]).max(1);
    let cap = growth.map(|g| ((g * first as f64).ceil() as usize).max(1));
    let mut sizes: Vec<usize> = Vec::new();
    let mut start = 0;
    while start < N {
        let mut size = (BUDGET / l[order[start]]).max(1);
        if let (Some(cap), Some(&prev)) = (cap, sizes.last()) {
            size = size.min(prev + cap);
        }
        if friendly {
            size = largest_friendly(size);
        }
        if even && size > 1 {
            size -= size % 2;
        }
        size = size.min(N - start);
        sizes.push(size);
        start += size;
    }
    sizes
}

fn budget_run<T>(
    options: impl FnOnce(&mut TrainingArgs),
    epochs: usize,
    wrap: fn(Regression, AdamW) -> T,
) -> Vec<StepLog>
where
    T: AdaptiveTrainer<Model = Regression> + Send,
{
    let log = temp_log("budget");
    let mut a = args(1, 2, epochs);
    a.length_aware.max_tokens_per_batch = Some(BUDGET);
    a.logging.log_jsonl = Some(log.clone());
    options(&mut a);
    adabatch::Run::new(&length_data(), &collate, &a)
        .launch(adamw_factory(wrap))
        .unwrap();
    read_log(&log)
}

/// Without shuffling, steps are the sorted examples cut at the expected sizes.
fn assert_cut(logs: &[StepLog], sizes: &[usize]) {
    let got: Vec<usize> = logs.iter().map(|l| l.global_batch).collect();
    assert_eq!(got, sizes);
    let order = sorted_by_length();
    let mut start = 0;
    for l in logs {
        assert_eq!(l.indices.concat(), order[start..start + l.global_batch]);
        start += l.global_batch;
    }
}

#[test]
fn token_budget_sizes_follow_the_budget() {
    let logs = budget_run(|_| {}, 1, |model, opt| OrderedPlain { model, opt });
    let sizes = expected_sizes(false, false, None);
    assert!(sizes
        .iter()
        .any(|s| s % 2 == 1 && *s != largest_friendly(*s)));
    assert_cut(&logs, &sizes);
}

#[test]
fn friendly_batch_sizes_round_down_to_2n_or_3x2n() {
    let logs = budget_run(
        |a| a.length_aware.friendly_batch_sizes = true,
        1,
        |model, opt| OrderedPlain { model, opt },
    );
    let sizes = expected_sizes(true, false, None);
    assert_ne!(sizes, expected_sizes(false, false, None));
    // All but the epoch's last (what is left) are 2^n or 3·2^n.
    for &s in &sizes[..sizes.len() - 1] {
        assert_eq!(s, largest_friendly(s), "{sizes:?}");
    }
    assert_cut(&logs, &sizes);
}

#[test]
fn even_batch_sizes_round_down_to_even() {
    let logs = budget_run(
        |a| a.length_aware.even_batch_sizes = true,
        1,
        |model, opt| OrderedPlain { model, opt },
    );
    let sizes = expected_sizes(false, true, None);
    assert_ne!(sizes, expected_sizes(false, false, None));
    for &s in &sizes[..sizes.len() - 1] {
        assert!(s % 2 == 0 || s == 1, "{sizes:?}");
    }
    assert_cut(&logs, &sizes);
}

#[test]
fn max_batch_growth_caps_growth_between_batches() {
    let logs = budget_run(
        |a| a.length_aware.max_batch_growth = Some(0.5),
        1,
        |model, opt| OrderedPlain { model, opt },
    );
    let sizes = expected_sizes(false, false, Some(0.5));
    assert_ne!(sizes, expected_sizes(false, false, None));
    // First batch 600 / 127 = 4: each batch at most 2 larger than the previous.
    assert_eq!(sizes[0], 4);
    assert!(sizes.windows(2).all(|w| w[1] <= w[0] + 2), "{sizes:?}");
    assert_cut(&logs, &sizes);
}

#[test]
fn keep_first_batches_keeps_the_hardest_batches_first() {
    let sizes = expected_sizes(false, false, None);
    let order = sorted_by_length();
    let batch_sets: Vec<Vec<usize>> = sizes
        .iter()
        .scan(0, |start, &s| {
            let mut b = order[*start..*start + s].to_vec();
            b.sort_unstable();
            *start += s;
            Some(b)
        })
        .collect();
    let steps_per_epoch = sizes.len();
    let first_sets = |logs: &[StepLog], epoch: usize, k: usize| -> Vec<Vec<usize>> {
        logs[epoch * steps_per_epoch..epoch * steps_per_epoch + k]
            .iter()
            .map(|l| {
                let mut b = l.indices.concat();
                b.sort_unstable();
                b
            })
            .collect()
    };
    let kept = budget_run(
        |a| a.length_aware.keep_first_batches = 3,
        3,
        |model, opt| ShuffledPlain { model, opt },
    );
    assert_eq!(kept.len(), 3 * steps_per_epoch);
    for epoch in 0..3 {
        assert_eq!(
            first_sets(&kept, epoch, 3),
            batch_sets[..3],
            "epoch {epoch}"
        );
    }
    // With the default (1) only the first batch is pinned: the next two are
    // shuffled away from their sorted place in some epoch.
    let default = budget_run(|_| {}, 3, |model, opt| ShuffledPlain { model, opt });
    for epoch in 0..3 {
        assert_eq!(first_sets(&default, epoch, 1), batch_sets[..1]);
    }
    assert!(
        (0..3).any(|e| first_sets(&default, e, 3) != batch_sets[..3]),
        "batch order is shuffled after the kept batches"
    );
}

// ---------------------------------------------------------------------------
// Memory models

const MEMORY_POLICY: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Memory {
        threshold: 0.9,
        max_range: 4.0,
    },
    ..TrainerPolicy::DEFAULT
};
hand_trainer!(MemoryTrainer, AdamW, MEMORY_POLICY);

fn padded(indices: &[usize], l: &[usize]) -> f64 {
    (indices.len() * indices.iter().map(|&i| l[i]).max().unwrap()) as f64
}

#[test]
fn memory_margin_scales_the_unfitted_predictions() {
    // The first epoch is planned before any measurement: the online model answers
    // padded tokens relative to the baseline (the 2 longest examples), times
    // 1 + margin.
    let l = lengths();
    let order = sorted_by_length();
    let baseline = padded(&order[..2], &l);
    for margin in [0.0, 0.2, 0.5] {
        let log = temp_log("margin");
        let mut a = args(1, 2, 1);
        a.length_aware.memory_margin = margin;
        a.logging.log_jsonl = Some(log.clone());
        adabatch::Run::new(&length_data(), &collate, &a)
            .launch(adamw_factory(|model, opt| MemoryTrainer { model, opt }))
            .unwrap();
        let logs = read_log(&log);
        assert_eq!(logs[0].predicted_memory, Some(1.0 + margin));
        for s in &logs {
            let expected = (1.0 + margin) * padded(&s.indices.concat(), &l) / baseline;
            let got = s.predicted_memory.unwrap();
            assert!(
                (got - expected).abs() < 1e-12,
                "step {}: {got} vs {expected}",
                s.step
            );
        }
    }
}

#[test]
fn most_conservative_takes_the_largest_prediction() {
    let law = |f: &BatchFeatures, scale: f64| {
        (scale
            * (1.0e5
                + 300.0 * f.padded_tokens as f64
                + 2.0 * (f.batch_size * f.max_len * f.max_len) as f64)) as u64
    };
    let mut small = OnlineMemoryModel::new(0.05);
    let mut large = OnlineMemoryModel::new(0.05);
    for (size, len) in [(2, 100), (4, 60), (8, 30), (16, 12), (3, 80)] {
        let f = BatchFeatures::of_lengths(vec![len; size]);
        small.observe(&f, law(&f, 1.0));
        large.observe(&f, law(&f, 1.5) + 400_000);
    }
    let unfitted = OnlineMemoryModel::new(0.0);
    let models = vec![small.clone(), large.clone(), unfitted.clone()];
    let combined = MostConservative(models.clone());
    let baseline = BatchFeatures::of_lengths([100, 100]);
    let mut winners = std::collections::BTreeSet::new();
    for (size, len) in [(2, 100), (4, 50), (10, 20), (30, 8), (1, 200)] {
        let c = BatchFeatures::of_lengths(vec![len; size]);
        let each: Vec<f64> = models.iter().map(|m| m.predict(&c, &baseline)).collect();
        let max = each.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(combined.predict(&c, &baseline), max);
        winners.insert(each.iter().position(|&p| p == max).unwrap());
    }
    // The cases exercise more than one model as the most conservative.
    assert!(winners.len() > 1, "{winners:?}");
    // What ranks exchange (snapshots) predicts the same as the models.
    let c = BatchFeatures::of_lengths([40; 6]);
    for m in &models {
        let again = OnlineMemoryModel::from_snapshot(m.snapshot());
        assert_eq!(again.predict(&c, &baseline), m.predict(&c, &baseline));
    }
    // One model is itself.
    let one = MostConservative(vec![small.clone()]);
    assert_eq!(one.predict(&c, &baseline), small.predict(&c, &baseline));
}

/// A regressor that answers like padded tokens and records what it observes.
struct Recorder {
    rank: usize,
    seen: Arc<Mutex<Vec<(usize, BatchFeatures, u64)>>>,
}
impl MemoryModel for Recorder {
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64 {
        candidate.padded_tokens as f64 / baseline.padded_tokens as f64
    }
    fn observe(&mut self, features: &BatchFeatures, peak_bytes: u64) {
        self.seen
            .lock()
            .unwrap()
            .push((self.rank, *features, peak_bytes));
    }
}
struct RecorderTrainer(Regression, AdamW, Recorder);
impl AdaptiveTrainer for RecorderTrainer {
    type Model = Regression;
    type Optimizer = AdamW;
    const POLICY: TrainerPolicy = MEMORY_POLICY;
    fn parts(&mut self) -> (&mut Regression, &mut AdamW) {
        (&mut self.0, &mut self.1)
    }
    fn regressor(&mut self) -> Option<&mut dyn MemoryModel> {
        Some(&mut self.2)
    }
}

fn regressor_run(world: usize, n: usize) -> (Vec<StepLog>, Vec<(usize, BatchFeatures, u64)>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = temp_log("observe");
    let mut a = args(world, 2, 2);
    a.logging.log_jsonl = Some(log.clone());
    let data = WithLengths::new(dataset(n, 21), lengths()[..n].to_vec()).unwrap();
    adabatch::Run::new(&data, &collate, &a)
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = adamw(&model, 0.05)?;
            let rec = Recorder {
                rank: ctx.rank(),
                seen: Arc::clone(&seen),
            };
            Ok(RecorderTrainer(model, opt, rec))
        })
        .unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (read_log(&log), seen)
}

#[test]
fn a_user_regressor_observes_every_ranks_batches() {
    let l = lengths();
    let (logs, seen) = regressor_run(2, N);
    // Once per step on every rank, with that rank's own slice and (on CPU) the
    // documented memory proxy of it.
    assert_eq!(seen.len(), 2 * logs.len());
    for rank in 0..2 {
        let observed: Vec<(BatchFeatures, u64)> = seen
            .iter()
            .filter(|(r, _, _)| *r == rank)
            .map(|(_, f, b)| (*f, *b))
            .collect();
        let expected: Vec<(BatchFeatures, u64)> = logs
            .iter()
            .map(|s| {
                let f = BatchFeatures::of_lengths(s.indices[rank].iter().map(|&i| l[i]));
                (f, cpu_memory_proxy(&f))
            })
            .collect();
        assert_eq!(observed, expected, "rank {rank}");
    }
    // Rank 0's measurement is what the log reports.
    assert_eq!(logs.len(), seen.iter().filter(|(r, _, _)| *r == 0).count());
    for (s, (_, f, bytes)) in logs.iter().zip(seen.iter().filter(|(r, _, _)| *r == 0)) {
        assert_eq!(s.measured_memory, Some(*bytes), "step {}: {f:?}", s.step);
    }
}

#[test]
fn empty_slices_are_not_observed() {
    // An empty rank has nothing to measure; observing a 0-byte empty batch (weight
    // 1/max(y,1)² = 1 in the fit, against ~1e-12 for real ones) drags the online
    // model's fixed cost to 0.
    // 8 examples on 3 ranks of 2: a first batch of 6, then 2 left for 3 ranks.
    let (logs, seen) = regressor_run(3, 8);
    assert!(
        logs.iter().any(|s| s.local_batch_sizes.contains(&0)),
        "the run has a step with an empty rank"
    );
    for (rank, f, bytes) in &seen {
        assert!(
            f.batch_size > 0,
            "rank {rank} observed an empty batch ({bytes} bytes)"
        );
    }
}

// ---------------------------------------------------------------------------
// launch_group

#[test]
fn launch_group_with_local_members_matches_launch() {
    let data = dataset(23, 4);
    for world in [1, 2, 3] {
        let via_launch = adabatch::Run::new(&data, &collate, &args(world, 2, 2))
            .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
            .unwrap()
            .summary;
        // `nproc_per_node` is ignored: the members decide the world.
        let members: Vec<(adabatch::Local, Device)> = adabatch::Local::group(world)
            .into_iter()
            .map(|c| (c, Device::Cpu))
            .collect();
        let via_group = adabatch::Run::new(&data, &collate, &args(1, 2, 2))
            .group(
                members,
                adamw_factory(|model, opt| IntervalTrainer { model, opt }),
            )
            .unwrap()
            .summary;
        assert_eq!(via_group.world_size, world);
        assert_eq!(via_group.global_step, via_launch.global_step);
        assert_eq!(via_group.examples_seen, via_launch.examples_seen);
        assert_eq!(
            via_group.step_losses, via_launch.step_losses,
            "world {world}"
        );
    }
}

// ---------------------------------------------------------------------------
// The optimizer's flags

hand_trainer!(FlaggedAdam, adabatch::AdamW, TrainerPolicy::DEFAULT);

/// A run whose AdamW is built from the flags (`ParamsAdamW::from_args`): its
/// step losses, or the run's error.
fn flagged_run(a: &TrainingArgs) -> adabatch::Result<Vec<f64>> {
    let hyper = adabatch::ParamsAdamW::from_args(a)?;
    let trained =
        adabatch::Run::new(&dataset(16, 3), &collate, a).launch(move |ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = adabatch::AdamW::new(model.params.all_vars(), hyper)?;
            Ok(FlaggedAdam { model, opt })
        })?;
    Ok(trained.summary.step_losses)
}

/// `--weight-decay`, `--adam-beta1`, `--adam-beta2` and `--adam-epsilon` (HF's
/// names and defaults) each reach the optimizer and change the run; a value out
/// of range is refused before the first step, whether or not the factory reads
/// the flags; `--optim` takes HF's AdamW names and lists them for another.
#[test]
fn each_optimizer_flag_changes_the_run_and_bad_values_are_refused() {
    let parse = |extra: &[&str]| {
        let argv = [
            "run",
            "--nproc-per-node",
            "1",
            "--per-device-train-batch-size",
            "4",
            "--learning-rate",
            "0.05",
            "--quiet",
            "--seed",
            "3",
        ];
        let argv: Vec<&str> = argv.iter().chain(extra).copied().collect();
        TrainingArgs::try_parse_from(adabatch::hf_argv(&TrainingArgs::command(), argv).unwrap())
            .unwrap()
    };
    let base = flagged_run(&parse(&[])).unwrap();
    assert_eq!(base.len(), 12);
    for flag in [
        ["--weight_decay", "0.5"],
        ["--adam_beta1", "0.5"],
        ["--adam_beta2", "0.9"],
        ["--adam_epsilon", "0.01"],
    ] {
        let changed = flagged_run(&parse(&flag)).unwrap();
        assert_ne!(changed, base, "{flag:?} changed nothing");
    }
    assert_eq!(
        flagged_run(&parse(&["--optim", "adamw_torch_fused"])).unwrap(),
        base
    );
    for (flag, name) in [
        ("--adam-beta2=1", "adam_beta2"),
        ("--adam-epsilon=0", "adam_epsilon"),
        ("--weight-decay=-0.1", "weight_decay"),
    ] {
        // Refused by the run itself, before a step, not only by `from_args`.
        let a = parse(&[flag]);
        let err = adabatch::Run::new(&dataset(16, 3), &collate, &a)
            .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
    let err = TrainingArgs::try_parse_from(["run", "--optim", "sgd"]).unwrap_err();
    assert!(
        err.to_string().contains("adamw_torch, adamw_torch_fused"),
        "{err}"
    );
}

/// A resume whose optimizer flags differ from the checkpoint's AdamW is refused
/// naming the setting (the moments were accumulated under the saved ones); the
/// same flags resume.
#[test]
fn a_resume_that_changes_the_optimizer_settings_is_refused() {
    let out = temp_log("optim-resume").with_extension("");
    let mut a = args(1, 4, 1);
    a.save.output_dir = out.clone();
    a.save.save_steps = 2;
    flagged_run(&a).unwrap();
    let mut resume = a.clone();
    resume.save.resume_from_checkpoint = Some(out.join("checkpoint-2"));
    resume.save.save_steps = 0;
    let mut changed = resume.clone();
    changed.optim.adam_beta2 = 0.95;
    let err = flagged_run(&changed).unwrap_err();
    assert!(err.report().contains("beta2 = 0.999"), "{}", err.report());
    assert_eq!(flagged_run(&resume).unwrap().len(), 2);
    // Asked to start the optimizer afresh, the changed settings resume.
    changed.save.ignore_optimizer_state = true;
    assert_eq!(flagged_run(&changed).unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&out);
}
