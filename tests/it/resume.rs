//! Exact resume: N steps straight equal N/2 + save + resume + N/2, bit for bit on
//! the same number of CPU ranks, with adabatch's checkpointable AdamW and Sgd, a
//! growing schedule, an OOM halve and gradient accumulation inside the span.

use crate::common;

use adabatch::optim::{AdamW, Sgd};
use adabatch::prelude::*;
use adabatch::{
    CheckpointError, Error, GradAccum, Growth, OomPolicy, ScheduleSpec, StepLog, TrainerPolicy,
    TrainingError,
};
use common::*;

const GROWING: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Interval {
        every: 3,
        growth: Growth::Add(1),
    },
    oom: OomPolicy::Halve,
    ..TrainerPolicy::DEFAULT
};

hand_trainer!(AdamGrowing, AdamW, GROWING);
hand_trainer!(SgdGrowing, Sgd, GROWING);
hand_trainer!(
    AdamAccum,
    AdamW,
    TrainerPolicy {
        grad_accum: GradAccum::Fixed(2),
        ..GROWING
    }
);
hand_trainer!(CandleAdam, candle_nn::AdamW, GROWING);

/// Runs and returns the summary, the step logs and rank 0's final weights.
fn run<T>(
    a: &TrainingArgs,
    build: impl Fn(Regression) -> adabatch::Result<T> + Sync,
) -> adabatch::Result<(TrainSummary, Vec<StepLog>, Vec<f32>)>
where
    T: AdaptiveTrainer<Model = Regression> + Send,
{
    let log = temp_log("resume");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let trained = adabatch::Run::new(&dataset(23, 5), &collate, &a)
        .launch(|ctx: &RankContext| build(Regression::new(ctx.parameters(), ctx.device())?))?;
    let mut trainer = trained.trainer;
    let named = trainer.parts().0.params.named_parameters();
    let weights = flat(named.into_iter().map(|(_, v)| v));
    Ok((trained.summary, read_log(&log), weights))
}

/// Straight vs interrupted at `save_at`, on `world` ranks; asserts bitwise equality.
fn straight_equals_interrupted<T>(
    world: usize,
    save_at: usize,
    build: impl Fn(Regression) -> adabatch::Result<T> + Sync + Copy,
) where
    T: AdaptiveTrainer<Model = Regression> + Send,
{
    let out = temp_log("resume-dir").with_extension("");
    let mut a = args(world, 2, 10);
    a.length.max_steps = Some(2 * save_at);
    a.step.inject_oom_at_steps = vec![save_at - 1];
    let (straight, straight_logs, straight_w) = run(&a, build).unwrap();
    assert_eq!(straight.oom_events, 1, "the halve happens inside the span");

    let mut first = a.clone();
    first.length.max_steps = Some(save_at);
    first.save.save_steps = save_at;
    first.save.output_dir = out.clone();
    run(&first, build).unwrap();

    let mut second = a.clone();
    second.step.inject_oom_at_steps.clear();
    second.save.output_dir = out.clone();
    second.save.resume_from_checkpoint = Some("latest".into());
    let (resumed, resumed_logs, resumed_w) = run(&second, build).unwrap();
    assert_eq!(resumed.global_step, straight.global_step);
    assert_eq!(resumed.resumed_from_step, Some(save_at));
    assert_eq!(resumed_logs.len(), straight_logs.len() - save_at);
    for (r, s) in resumed_logs.iter().zip(&straight_logs[save_at..]) {
        assert_eq!(r.step, s.step);
        assert_eq!(r.indices, s.indices, "step {}", r.step);
        assert_eq!(
            r.loss.to_bits(),
            s.loss.to_bits(),
            "loss of step {}",
            r.step
        );
    }
    assert_eq!(resumed_w, straight_w, "final weights bit for bit");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn adamw_resumes_bit_for_bit() {
    straight_equals_interrupted(2, 6, |m| {
        let opt = resumable_adam(&m)?;
        Ok(AdamGrowing { model: m, opt })
    });
}

#[test]
fn sgd_resumes_bit_for_bit() {
    straight_equals_interrupted(1, 5, |m| {
        let opt = Sgd::new(m.params.all_vars(), 0.05);
        Ok(SgdGrowing { model: m, opt })
    });
}

#[test]
fn adamw_with_accumulation_resumes_bit_for_bit() {
    straight_equals_interrupted(3, 4, |m| {
        let opt = resumable_adam(&m)?;
        Ok(AdamAccum { model: m, opt })
    });
}

#[test]
fn candle_adamw_needs_the_opt_in() {
    let out = temp_log("resume-candle").with_extension("");
    let mut a = args(1, 2, 10);
    a.length.max_steps = Some(4);
    a.save.save_steps = 2;
    a.save.output_dir = out.clone();
    let build = |m: Regression| {
        let opt = adamw(&m, 0.05)?;
        Ok(CandleAdam { model: m, opt })
    };
    run(&a, build).unwrap();
    assert!(!out.join("checkpoint-2/optimizer.safetensors").exists());
    let mut resume = a.clone();
    resume.length.max_steps = Some(6);
    resume.save.resume_from_checkpoint = Some(out.join("checkpoint-4"));
    assert!(matches!(
        run(&resume, build).unwrap_err(),
        Error::Checkpoint(CheckpointError::OptimizerStateMissing { .. })
    ));
    resume.save.ignore_optimizer_state = true;
    let (summary, _, _) = run(&resume, build).unwrap();
    assert_eq!(summary.global_step, 6);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn save_total_limit_keeps_the_newest_and_latest_finds_it() {
    let out = temp_log("resume-limit").with_extension("");
    let mut a = args(1, 1, 10);
    a.length.max_steps = Some(7);
    a.save.save_steps = 2;
    a.save.save_total_limit = Some(2);
    a.save.output_dir = out.clone();
    run(&a, |m| {
        let opt = Sgd::new(m.params.all_vars(), 0.05);
        Ok(SgdGrowing { model: m, opt })
    })
    .unwrap();
    let kept: Vec<usize> = adabatch::train::checkpoint::complete_checkpoints(&out)
        .unwrap()
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(kept, vec![6, 7]);
    assert_eq!(
        adabatch::train::checkpoint::latest(&out).unwrap(),
        out.join("checkpoint-7")
    );
    let _ = std::fs::remove_dir_all(&out);
    assert!(matches!(
        adabatch::train::checkpoint::latest(&out).unwrap_err(),
        Error::Checkpoint(CheckpointError::NoCheckpoint { .. })
    ));
}

#[test]
fn a_resumed_finished_run_says_so() {
    let out = temp_log("resume-done").with_extension("");
    let mut a = args(1, 2, 1);
    a.save.save_steps = 100;
    a.save.output_dir = out.clone();
    let build = |m: Regression| {
        let opt = Sgd::new(m.params.all_vars(), 0.05);
        Ok(SgdGrowing { model: m, opt })
    };
    let (done, _, _) = run(&a, build).unwrap();
    a.save.resume_from_checkpoint = Some("latest".into());
    let (again, logs, _) = run(&a, build).unwrap();
    assert!(again.trained_nothing() && logs.is_empty());
    assert_eq!(again.global_step, done.global_step);
    let said = again.to_string();
    assert!(said.starts_with("nothing left to train"), "{said}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The run the kill test's child performs (and the parent re-runs to compare).
fn kill_test_args(out: &std::path::Path) -> TrainingArgs {
    let mut a = args(2, 2, 10);
    a.length.max_steps = Some(40);
    a.save.save_steps = 1;
    a.save.save_total_limit = Some(3);
    a.save.output_dir = out.to_path_buf();
    a
}

fn kill_test_trainer(m: Regression) -> adabatch::Result<AdamGrowing> {
    let opt = resumable_adam(&m)?;
    Ok(AdamGrowing { model: m, opt })
}

/// Not a test on its own: the child process of `a_killed_run_resumes_exactly`,
/// which re-runs this test binary with `ADABATCH_KILL_TEST_DIR` set.
#[test]
fn kill_test_child() {
    if let Some(out) = std::env::var_os("ADABATCH_KILL_TEST_DIR") {
        let mut a = kill_test_args(std::path::Path::new(&out));
        a.save.resume_from_checkpoint = Some("latest".into());
        if adabatch::train::checkpoint::complete_checkpoints(&a.save.output_dir)
            .unwrap()
            .is_empty()
        {
            a.save.resume_from_checkpoint = None;
        }
        run(&a, kill_test_trainer).unwrap();
    }
}

/// A child training with `--save-steps 1` is killed with SIGKILL at 20 moments;
/// each time the newest complete checkpoint loads, and resuming from it ends with
/// the weights of the uninterrupted run.
#[test]
fn a_killed_run_resumes_exactly() {
    use rand::{Rng, SeedableRng};
    let clean_dir = temp_log("kill-clean").with_extension("");
    let (_, _, clean) = run(&kill_test_args(&clean_dir), kill_test_trainer).unwrap();
    let _ = std::fs::remove_dir_all(&clean_dir);
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for trial in 0..20 {
        let out = temp_log(&format!("kill-{trial}")).with_extension("");
        // Let the child start, train and checkpoint for a while, then kill it.
        let mut child = std::process::Command::new(&exe)
            .args([
                "resume::kill_test_child",
                "--exact",
                "--test-threads",
                "1",
                "-q",
            ])
            .env("ADABATCH_KILL_TEST_DIR", &out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(rng.random_range(20..400)));
        let _ = child.kill();
        child.wait().unwrap();
        let mut a = kill_test_args(&out);
        if let Ok(latest) = adabatch::train::checkpoint::latest(&out) {
            // The newest complete checkpoint is readable, whatever the moment.
            adabatch::train::checkpoint::load_state(&latest).unwrap();
            a.save.resume_from_checkpoint = Some(latest);
        }
        let (_, _, resumed) = run(&a, kill_test_trainer).unwrap();
        assert_eq!(resumed, clean, "trial {trial}: resumed weights differ");
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// A 2-rank mid-epoch checkpoint resumed on 1, 2 and 3 ranks: the same global
/// batches (split over the new ranks), losses within 1e-5 relative of the
/// uninterrupted 2-rank run.
#[test]
fn resumes_on_another_number_of_ranks() {
    let build = |m: Regression| {
        let opt = resumable_adam(&m)?;
        Ok(AdamGrowing { model: m, opt })
    };
    let out = temp_log("resume-ranks").with_extension("");
    let mut a = args(2, 2, 10);
    a.length.max_steps = Some(14);
    let (straight, straight_logs, _) = run(&a, build).unwrap();
    let mut first = a.clone();
    first.length.max_steps = Some(5);
    first.save.save_steps = 5;
    first.save.output_dir = out.clone();
    run(&first, build).unwrap();
    let state = adabatch::train::checkpoint::load_state(&out.join("checkpoint-5")).unwrap();
    assert!(state.planner.position > 0, "the checkpoint is mid-epoch");
    for world in [1, 2, 3] {
        let mut resumed = a.clone();
        resumed.launch.nproc_per_node = world;
        resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-5"));
        let (summary, logs, _) = run(&resumed, build).unwrap();
        assert_eq!(summary.global_step, 14, "{world} ranks");
        // The summary's per-device size is this run's: the same global batch
        // split over its own ranks.
        let global = straight.final_per_device_batch_size * 2;
        assert_eq!(
            summary.final_per_device_batch_size,
            global.div_ceil(world),
            "{world} ranks"
        );
        assert_eq!(logs.len(), 9);
        for (r, s) in logs.iter().zip(&straight_logs[5..]) {
            assert_eq!(r.step, s.step);
            assert_eq!(r.local_batch_sizes.len(), world);
            assert_eq!(
                r.indices.concat(),
                s.indices.concat(),
                "{world} ranks, step {}: the same global batch",
                r.step
            );
            let relative = (r.loss - s.loss).abs() / s.loss.abs().max(1e-12);
            assert!(
                relative < 1e-5,
                "{world} ranks, step {}: loss {} vs {}",
                r.step,
                r.loss,
                s.loss
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The run the signal test's child performs: 2 ranks, long enough to be stopped
/// mid-run, no checkpoint of its own (`--save-steps 0`).
fn signal_test_args(out: &std::path::Path) -> TrainingArgs {
    let mut a = args(2, 2, 1);
    a.length.max_steps = Some(3000);
    a.save.save_steps = 0;
    a.logging.logging_steps = 1;
    a.logging.log_indices = true;
    a.save.output_dir = out.to_path_buf();
    a
}

/// Not a test on its own: the child process of `a_signal_stops_every_rank_with_a_checkpoint`
/// (`ADABATCH_SIGNAL_TEST_DIR` set), which exits as `adabatch::exit_code` would.
#[test]
fn signal_test_child() {
    if let Some(out) = std::env::var_os("ADABATCH_SIGNAL_TEST_DIR") {
        let out = std::path::PathBuf::from(out);
        let mut a = signal_test_args(&out);
        a.logging.log_jsonl = Some(out.join("log.jsonl"));
        let result =
            adabatch::Run::new(&dataset(23, 5), &collate, &a).launch(|ctx: &RankContext| {
                kill_test_trainer(Regression::new(ctx.parameters(), ctx.device())?)
            });
        match result {
            Err(e @ Error::Training(TrainingError::Interrupted { .. })) => {
                eprintln!("{e}");
                std::process::exit(i32::from(adabatch::INTERRUPTED_EXIT_CODE));
            }
            Err(e) => panic!("{e}"),
            Ok(_) => std::process::exit(0),
        }
    }
}

/// SIGTERM mid-run on 2 ranks: both ranks stop after the same step, a checkpoint
/// of that step is written, the process exits with code 75 saying how to resume,
/// and the resumed run's batches, losses and weights equal the uninterrupted run's.
#[cfg(unix)]
#[test]
fn a_signal_stops_every_rank_with_a_checkpoint() {
    let clean_dir = temp_log("signal-clean").with_extension("");
    let (_, clean_logs, clean) = run(&signal_test_args(&clean_dir), kill_test_trainer).unwrap();
    let _ = std::fs::remove_dir_all(&clean_dir);
    let out = temp_log("signal").with_extension("");
    std::fs::create_dir_all(&out).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "resume::signal_test_child",
            "--exact",
            "--test-threads",
            "1",
            "-q",
            "--nocapture",
        ])
        .env("ADABATCH_SIGNAL_TEST_DIR", &out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once it has trained a few steps, as a scheduler would.
    let log = out.join("log.jsonl");
    let lines = || std::fs::read_to_string(&log).map_or(0, |t| t.lines().count());
    while lines() < 10 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child ended before the signal"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(75), "{said}");
    assert!(said.contains("stopped by SIGTERM after step"), "{said}");
    let saved = adabatch::train::checkpoint::complete_checkpoints(&out).unwrap();
    assert_eq!(saved.len(), 1, "one checkpoint: the signal's");
    let (step, dir) = saved[0].clone();
    assert!(said.contains(&dir.display().to_string()), "{said}");
    assert!(
        (10..3000).contains(&step),
        "stopped mid-run, at step {step}"
    );
    let logged = read_log(&log);
    assert_eq!(
        logged.last().map(|l| l.step),
        Some(step),
        "stopped after the logged step"
    );
    let mut a = signal_test_args(&out);
    a.save.resume_from_checkpoint = Some(dir);
    let (_, resumed_logs, resumed) = run(&a, kill_test_trainer).unwrap();
    assert_eq!(
        resumed, clean,
        "the resumed weights equal the uninterrupted run's"
    );
    let tail: Vec<&StepLog> = clean_logs.iter().filter(|l| l.step > step).collect();
    assert_eq!(resumed_logs.len(), tail.len());
    for (r, c) in resumed_logs.iter().zip(tail) {
        assert_eq!((r.step, &r.indices), (c.step, &c.indices));
        assert_eq!(r.loss.to_bits(), c.loss.to_bits(), "step {}", r.step);
    }
    let _ = std::fs::remove_dir_all(&out);
}
