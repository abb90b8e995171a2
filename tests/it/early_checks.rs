//! What can be checked before the first step is: a run that would fail late
//! (after training up to a save, or drawing its plot after training) fails at
//! its start instead, with a typed error.

use crate::common;

use adabatch::clap::Parser;
use adabatch::prelude::*;
use adabatch::{CheckpointError, Error, SettingsError};
use common::*;

fn start(a: &TrainingArgs) -> adabatch::Result<TrainSummary> {
    adabatch::Run::new(&dataset(12, 1), &collate, a)
        .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
        .map(|t| t.summary)
}

fn invalid(err: Error, setting: &str) {
    assert!(
        matches!(&err, Error::Settings(SettingsError::InvalidSetting { name, .. }) if *name == setting),
        "{setting}: {err}"
    );
}

#[test]
fn outputs_and_steps_are_checked_before_training() {
    let mut a = args(1, 2, 1);
    a.logging.plot = Some(temp_log("plot").with_extension("jpg"));
    invalid(start(&a).unwrap_err(), "plot");
    let mut a = args(1, 2, 1);
    a.step.inject_oom_at_steps = vec![0];
    invalid(start(&a).unwrap_err(), "inject_oom_at_steps");
    a.step.inject_oom_at_steps = vec![9];
    a.length.max_steps = Some(3);
    invalid(start(&a).unwrap_err(), "inject_oom_at_steps");
    let mut a = args(1, 2, 1);
    a.data.mix_weights = vec!["new=0.5".into(), "new=0.5".into()];
    invalid(start(&a).unwrap_err(), "mix_weights");
    // An output directory that is a file fails at the start, not at the first save,
    // named as a file.
    let file = temp_log("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let mut a = args(1, 2, 1);
    a.save.output_dir = file.clone();
    a.save.save_steps = 1000;
    let err = start(&a).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::NotADirectory { flag: "--output-dir", path }) if *path == file),
        "{err}"
    );
}

#[test]
fn negative_numbers_parse_without_an_equals_sign() {
    let a = TrainingArgs::try_parse_from(["run", "--learning-rate", "-0.01"]).unwrap();
    assert_eq!(a.lr.learning_rate, -0.01);
    // ... and are then refused by the run's own check, with its message.
    let mut a = {
        let mut args = a;
        args.logging.quiet = true;
        args
    };
    a.batch.per_device_train_batch_size = 2;
    invalid(start(&a).unwrap_err(), "learning_rate");
    let a = TrainingArgs::try_parse_from(["run", "--max-grad-norm", "-1"]).unwrap();
    assert_eq!(a.step.max_grad_norm, -1.0);
}
