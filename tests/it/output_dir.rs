//! One run per output directory, and checkpoints re-saved without a moment in
//! which none is complete.

use crate::common;

use std::sync::{Arc, Barrier};

use adabatch::prelude::*;
use adabatch::{AdamW, Callback, CheckpointError, Error, ParamsAdamW, TrainingError};
use common::*;

hand_trainer!(Saving, AdamW, adabatch::TrainerPolicy::DEFAULT);

fn train(a: &TrainingArgs) -> adabatch::Result<TrainSummary> {
    adabatch::Run::new(&dataset(20, 4), &collate, a)
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
            Ok(Saving { model, opt })
        })
        .map(|t| t.summary)
}

/// A callback that holds the first run inside its training until the second
/// has tried the same directory.
struct Hold(Arc<Barrier>);

impl Callback for Hold {
    fn on_step_end(
        &mut self,
        state: &adabatch::TrainerState,
        _control: &mut adabatch::TrainerControl,
    ) {
        if state.global_step == 1 {
            self.0.wait();
            self.0.wait();
        }
    }
}

#[adaptive_trainer]
struct Held {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[callback]
    hold: Hold,
}

#[test]
fn a_second_run_in_the_same_output_dir_is_refused() {
    let out = temp_log("busy").with_extension("");
    let mut a = args(1, 2, 1);
    a.save.save_steps = 2;
    a.save.output_dir = out.clone();
    let barrier = Arc::new(Barrier::new(2));
    let first = {
        let (a, barrier) = (a.clone(), barrier.clone());
        std::thread::spawn(move || {
            Held::launch(&dataset(20, 4), &collate, &a, |ctx: &RankContext| {
                let model = Regression::new(ctx.parameters(), ctx.device())?;
                let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
                Ok(Held::new(model, opt, Hold(barrier.clone())))
            })
            .map(|t| t.summary)
        })
    };
    barrier.wait();
    let mut other = a.clone();
    other.data.seed = Some(99);
    let err = train(&other).unwrap_err();
    // A run that only reads the directory (it resumes and does not save) is
    // refused too: the live run may be writing the checkpoint it would read.
    let reader = {
        let mut args = other.clone();
        args.save.save_steps = 0;
        args.save.resume_from_checkpoint = Some("latest".into());
        args
    };
    let read_err = train(&reader).unwrap_err();
    barrier.wait();
    assert!(
        matches!(
            read_err,
            Error::Checkpoint(CheckpointError::OutputDirBusy { .. })
        ),
        "{read_err}"
    );
    assert!(
        matches!(
            err,
            Error::Checkpoint(CheckpointError::OutputDirBusy { .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("another run is using the output directory"),
        "{err}"
    );
    first.join().unwrap().unwrap();
    // Once the first has ended, the directory is free again.
    other.save.resume_from_checkpoint = Some("latest".into());
    other.data.seed = a.data.seed;
    train(&other).unwrap();
}

#[test]
fn resaves_replace_a_checkpoint_whole_and_a_finished_run_is_not_rewritten() {
    let out = temp_log("resave").with_extension("");
    let mut a = args(1, 2, 1);
    a.save.save_steps = 4;
    a.save.output_dir = out.clone();
    train(&a).unwrap();
    let last = out.join("checkpoint-10");
    let written = |p: &std::path::Path| {
        std::fs::metadata(p.join("adabatch_state.json"))
            .unwrap()
            .modified()
            .unwrap()
    };
    let before = written(&last);
    // Resuming a finished run trains nothing and leaves its checkpoint alone.
    let mut resume = a.clone();
    resume.save.resume_from_checkpoint = Some("latest".into());
    assert_eq!(train(&resume).unwrap().global_step, 10);
    assert_eq!(written(&last), before);
    // Resuming an older checkpoint writes checkpoint-8 and -10 again, in place.
    let weights = std::fs::read(last.join("model.safetensors")).unwrap();
    std::fs::create_dir_all(out.join(".checkpoint-3.partial")).unwrap();
    resume.save.resume_from_checkpoint = Some(out.join("checkpoint-4"));
    train(&resume).unwrap();
    assert_ne!(written(&last), before);
    assert_eq!(
        std::fs::read(last.join("model.safetensors")).unwrap(),
        weights,
        "same run, same weights"
    );
    let hidden: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".checkpoint"))
        .collect();
    assert!(hidden.is_empty(), "stale partial saves left: {hidden:?}");
}

/// Resumes `checkpoint` after `edit` changed its trainer state (and its manifest
/// was rewritten, as a deliberate edit would): the error.
fn resume_edited(
    out: &std::path::Path,
    a: &TrainingArgs,
    edit: impl Fn(&mut serde_json::Value),
) -> Error {
    let dir = out.join("checkpoint-4");
    let path = dir.join("adabatch_state.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&original).unwrap();
    edit(&mut json);
    std::fs::write(&path, json.to_string()).unwrap();
    adabatch::train::checkpoint::write_manifest(&dir).unwrap();
    let mut resume = a.clone();
    resume.save.resume_from_checkpoint = Some(dir.clone());
    let result = train(&resume);
    std::fs::write(&path, original).unwrap();
    adabatch::train::checkpoint::write_manifest(&dir).unwrap();
    result.expect_err("the edited state resumed")
}

/// A change to a trainer state's JSON.
type Edit = fn(&mut serde_json::Value);

#[test]
fn a_checkpoint_is_verified_before_anything_trains() {
    let out = temp_log("verified").with_extension("");
    let mut a = args(1, 2, 3);
    a.save.save_steps = 4;
    a.save.output_dir = out.clone();
    train(&a).unwrap();
    let edits: [(&str, Edit, &str); 7] = [
        (
            "per_device",
            |j| j["per_device"] = 0.into(),
            "`per_device` is 0",
        ),
        (
            "world_size",
            |j| j["world_size"] = 0.into(),
            "`world_size` is 0",
        ),
        (
            "epoch_index",
            |j| j["epoch_index"] = 99.into(),
            "`examples_seen` 8 does not fit `epoch_index` 99",
        ),
        (
            "position",
            |j| j["position"] = 5000.into(),
            "`position` 5000 is beyond the 20 examples",
        ),
        (
            "global_step",
            |j| j["global_step"] = 50.into(),
            "`global_step` 50 does not fit",
        ),
        (
            "min_batch",
            |j| j["min_batch"] = 5.into(),
            "`min_batch` 5 exceeds the policy's min_batch 1",
        ),
        (
            "policy",
            |j| {
                j.as_object_mut().unwrap().remove("policy");
            },
            "the `policy` key is missing",
        ),
    ];
    for (field, edit, want) in edits {
        let err = resume_edited(&out, &a, edit);
        assert!(
            matches!(
                err,
                Error::Checkpoint(CheckpointError::CorruptCheckpoint { .. })
            ),
            "{field}: {err}"
        );
        assert!(err.to_string().contains(want), "{field}: {err}");
        assert!(
            err.to_string().contains("adabatch_state.json"),
            "{field}: {err}"
        );
    }
    // A consistent state past this run's end (a run of more epochs, resumed with
    // fewer) is not corrupt: there is nothing left to train.
    let dir = out.join("checkpoint-4");
    let path = dir.join("adabatch_state.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&original).unwrap();
    json["epoch_index"] = 3.into();
    json["examples_seen"] = 68.into();
    std::fs::write(&path, json.to_string()).unwrap();
    adabatch::train::checkpoint::write_manifest(&dir).unwrap();
    let mut resume = a.clone();
    resume.save.resume_from_checkpoint = Some(dir.clone());
    assert!(train(&resume).unwrap().trained_nothing());
    std::fs::write(&path, original).unwrap();
    adabatch::train::checkpoint::write_manifest(&dir).unwrap();
    // One flipped bit in a weight: the manifest names the file.
    let weights = out.join("checkpoint-4").join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, &bytes).unwrap();
    let mut resume = a.clone();
    resume.save.resume_from_checkpoint = Some(out.join("checkpoint-4"));
    let err = train(&resume).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::CorruptCheckpoint { path, .. }) if *path == weights),
        "{err}"
    );
    // A missing manifest in a checkpoint of this format.
    std::fs::remove_file(out.join("checkpoint-4").join("manifest.json")).unwrap();
    let err = train(&resume).unwrap_err();
    assert!(
        err.to_string().contains("cannot read the manifest"),
        "{err}"
    );
}

#[test]
fn a_torn_log_line_is_cut_before_the_resume_mark() {
    let out = temp_log("torn").with_extension("");
    let log = out.with_extension("jsonl");
    let mut a = args(1, 2, 1);
    a.save.save_steps = 5;
    a.length.max_steps = Some(5);
    a.save.output_dir = out.clone();
    a.logging.log_jsonl = Some(log.clone());
    train(&a).unwrap();
    // A kill in the middle of a record.
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str(r#"{"step":6,"epoch":0.6,"los"#);
    std::fs::write(&log, &text).unwrap();
    let mut resume = a.clone();
    resume.length.max_steps = Some(8);
    resume.save.resume_from_checkpoint = Some("latest".into());
    train(&resume).unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines[5]["event"], "resume");
    let steps: Vec<u64> = lines.iter().filter_map(|l| l["step"].as_u64()).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 5, 6, 7, 8]);
}

#[test]
fn a_diverging_run_is_logged_and_names_its_last_finite_checkpoint() {
    let out = temp_log("diverge").with_extension("");
    let log = out.with_extension("jsonl");
    let mut a = args(1, 2, 5);
    a.save.save_steps = 2;
    a.lr.learning_rate = 1e6;
    a.save.output_dir = out.clone();
    a.logging.log_jsonl = Some(log.clone());
    let err = adabatch::Run::new(&dataset(20, 4), &collate, &a)
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = <candle_nn::SGD as candle_nn::Optimizer>::new(model.params.all_vars(), 1e6)?;
            Ok(SgdTrainer { model, opt })
        })
        .map(|t| t.summary)
        .unwrap_err();
    let last = match &err {
        Error::Training(TrainingError::NonFiniteLoss {
            last_checkpoint, ..
        })
        | Error::Training(TrainingError::NonFiniteWeights {
            last_checkpoint, ..
        }) => last_checkpoint
            .clone()
            .expect("a checkpoint was written before"),
        other => panic!("expected a divergence, got {other:?}"),
    };
    assert!(
        err.to_string()
            .contains("the last checkpoint with finite weights is"),
        "{err}"
    );
    // It is `latest`, and every weight in it is finite.
    assert_eq!(adabatch::train::checkpoint::latest(&out).unwrap(), last);
    let weights =
        candle_core::safetensors::load(last.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    for (name, t) in weights {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{name}: {v:?}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lastline: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(lastline["event"], "diverged", "{text}");
}

#[test]
fn the_first_log_after_a_resume_averages_the_same_steps() {
    let out = temp_log("window").with_extension("");
    let mut a = args(1, 2, 2);
    a.logging.logging_steps = 3;
    a.save.output_dir = out.clone();
    let log = |name: &str| temp_log(name);
    let mut straight = a.clone();
    straight.logging.log_jsonl = Some(log("window-straight"));
    straight.save.output_dir = out.with_extension("straight");
    train(&straight).unwrap();
    let mut saving = a.clone();
    saving.save.save_steps = 4;
    saving.length.max_steps = Some(8);
    saving.logging.log_jsonl = Some(log("window-saving"));
    train(&saving).unwrap();
    let mut resumed = a.clone();
    resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-4"));
    resumed.logging.log_jsonl = Some(log("window-resumed"));
    train(&resumed).unwrap();
    let want = read_log(straight.logging.log_jsonl.as_ref().unwrap());
    let got = read_log(resumed.logging.log_jsonl.as_ref().unwrap());
    // Step 6 averages steps 4, 5 and 6 in both, though step 4 ran before the resume.
    assert_eq!(got[0].step, 6);
    let same = want.iter().find(|s| s.step == 6).unwrap();
    assert_eq!(got[0].loss.to_bits(), same.loss.to_bits());
}

#[test]
fn a_resave_interrupted_at_each_point_leaves_a_resumable_latest() {
    let out = temp_log("interrupted").with_extension("");
    let mut a = args(1, 2, 1);
    a.save.save_steps = 5;
    a.save.output_dir = out.clone();
    train(&a).unwrap();
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap().flatten() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    };
    let last = out.join("checkpoint-10");
    let partial = out.join(".checkpoint-10.partial");
    // Killed while the new copy was being written: a half-written partial beside
    // the complete checkpoint.
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model.safetensors"), b"half").unwrap();
    let mut resume = a.clone();
    resume.save.resume_from_checkpoint = Some("latest".into());
    assert_eq!(train(&resume).unwrap().global_step, 10);
    assert!(!partial.exists());
    // Killed after the exchange, before the old copy was removed: the old copy
    // under the partial name, the new one in place.
    copy(&last, &partial);
    assert_eq!(adabatch::train::checkpoint::latest(&out).unwrap(), last);
    assert_eq!(train(&resume).unwrap().global_step, 10);
    assert!(!partial.exists());
    // Killed while pruning removed a checkpoint: it was hidden first, so `latest`
    // never sees a half-deleted one.
    std::fs::create_dir_all(out.join(".checkpoint-5.partial")).unwrap();
    std::fs::remove_dir_all(out.join("checkpoint-5")).unwrap();
    assert_eq!(adabatch::train::checkpoint::latest(&out).unwrap(), last);
}

#[test]
fn a_file_where_a_directory_belongs_is_named_as_such() {
    let file = temp_log("not-a-dir");
    std::fs::write(&file, "a file").unwrap();
    let mut a = args(1, 2, 1);
    a.save.save_steps = 2;
    a.save.output_dir = file.clone();
    let err = train(&a).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Checkpoint(CheckpointError::NotADirectory {
                flag: "--output-dir",
                ..
            })
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("is a file, not a directory"),
        "{err}"
    );
    let mut b = args(1, 2, 1);
    b.save.output_dir = temp_log("resume-file").with_extension("");
    b.save.resume_from_checkpoint = Some(file.clone());
    let err = train(&b).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Checkpoint(CheckpointError::NotADirectory {
                flag: "--resume-from-checkpoint",
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("checkpoint-N directory"), "{err}");
    let _ = std::fs::remove_file(&file);
}
