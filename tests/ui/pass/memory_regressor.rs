// `schedule = memory(..)` with a user `#[regressor]`, launched for three steps.
#![deny(warnings)]

use adabatch::prelude::*;
use adabatch::{BatchFeatures, MemoryModel, ScheduleSpec};
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

/// Peak memory in proportion to padded tokens.
struct Padded {
    observed: usize,
}

impl MemoryModel for Padded {
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64 {
        candidate.padded_tokens as f64 / baseline.padded_tokens.max(1) as f64
    }
    fn observe(&mut self, _features: &BatchFeatures, _peak_bytes: u64) {
        self.observed += 1;
    }
}

#[adaptive_trainer(schedule = memory(threshold = 0.9, max_range = 2.0))]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: SGD,
    #[regressor]
    memory: Padded,
}

fn main() -> adabatch::Result<()> {
    assert_eq!(
        Trainer::POLICY.schedule,
        ScheduleSpec::Memory {
            threshold: 0.9,
            max_range: 2.0
        }
    );
    let trained = Trainer::launch(
        &tiny::dataset(),
        &tiny::collate,
        &tiny::args(),
        |ctx: &RankContext| {
            let params = ctx.parameters();
            let model = tiny::Tiny::new(params.clone(), ctx.device())?;
            let opt = SGD::new(params.all_vars(), 0.1)?;
            let mut trainer = Trainer::new(model, opt, Padded { observed: 0 });
            assert!(trainer.regressor().is_some());
            assert_eq!(trainer.memory.observed, 0);
            Ok(trainer)
        },
    )?;
    assert_eq!(trained.summary.global_step, 3);
    Ok(())
}
