//! One run per output directory, and checkpoints re-saved without a moment in
//! which none is complete.

use crate::common;

use std::sync::{Arc, Barrier};

use adabatch::prelude::*;
use adabatch::{AdamW, Callback, Error, ParamsAdamW};
use common::*;

hand_trainer!(Saving, AdamW, adabatch::TrainerPolicy::DEFAULT);

fn train(a: &TrainingArgs) -> adabatch::Result<TrainSummary> {
    adabatch::launch(&dataset(20, 4), &collate, a, |ctx: &RankContext| {
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
    a.save_steps = 2;
    a.output_dir = out.clone();
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
    other.seed = Some(99);
    let err = train(&other).unwrap_err();
    barrier.wait();
    assert!(matches!(err, Error::OutputDirBusy { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("another run is using the output directory"),
        "{err}"
    );
    first.join().unwrap().unwrap();
    // Once the first has ended, the directory is free again.
    other.resume_from_checkpoint = Some("latest".into());
    other.seed = a.seed;
    train(&other).unwrap();
}

#[test]
fn resaves_replace_a_checkpoint_whole_and_a_finished_run_is_not_rewritten() {
    let out = temp_log("resave").with_extension("");
    let mut a = args(1, 2, 1);
    a.save_steps = 4;
    a.output_dir = out.clone();
    train(&a).unwrap();
    let last = out.join("checkpoint-10");
    let written = |p: &std::path::Path| {
        std::fs::metadata(p.join("trainer_state.json"))
            .unwrap()
            .modified()
            .unwrap()
    };
    let before = written(&last);
    // Resuming a finished run trains nothing and leaves its checkpoint alone.
    let mut resume = a.clone();
    resume.resume_from_checkpoint = Some("latest".into());
    assert_eq!(train(&resume).unwrap().global_step, 10);
    assert_eq!(written(&last), before);
    // Resuming an older checkpoint writes checkpoint-8 and -10 again, in place.
    let weights = std::fs::read(last.join("model.safetensors")).unwrap();
    std::fs::create_dir_all(out.join(".checkpoint-3.partial")).unwrap();
    resume.resume_from_checkpoint = Some(out.join("checkpoint-4"));
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
