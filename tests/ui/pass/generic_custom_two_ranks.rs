// A generic trainer (model and optimizer are type parameters), a `custom` schedule,
// a renamed facade (`crate = ...`), launched on two CPU ranks.
#![deny(warnings)]

use adabatch::prelude::*;
use adabatch::{ScheduleSpec, TrainOptimizer};
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

mod framework {
    pub use adabatch as training;
}

/// Doubles after every second step.
fn doubling(step: usize, current: usize) -> usize {
    if step % 2 == 0 {
        current * 2
    } else {
        current
    }
}

#[framework::training::adaptive_trainer(
    crate = "framework::training",
    schedule = custom(self::doubling),
    max_batch = 4,
)]
struct Trainer<M, O>
where
    M: TrainModel,
    O: TrainOptimizer,
{
    #[model]
    model: M,
    #[optimizer]
    opt: O,
}

fn main() -> adabatch::Result<()> {
    assert!(matches!(
        Trainer::<tiny::Tiny, SGD>::POLICY.schedule,
        ScheduleSpec::Custom(_)
    ));
    let args = {
        let mut a = tiny::args();
        a.launch.nproc_per_node = 2;
        a.batch.per_device_train_batch_size = 1;
        a
    };
    let trained = Trainer::launch(
        &tiny::dataset(),
        &tiny::collate,
        &args,
        |ctx: &RankContext| {
            let params = ctx.parameters();
            let model = tiny::Tiny::new(params.clone(), ctx.device())?;
            let opt = SGD::new(params.all_vars(), 0.1)?;
            Ok(Trainer::new(model, opt))
        },
    )?;
    // Rank 0's trainer comes back with the summary.
    let Trained { trainer, summary } = trained;
    let _: Trainer<tiny::Tiny, SGD> = trainer;
    assert_eq!(summary.world_size, 2);
    assert_eq!(summary.global_step, 3);
    assert_eq!(summary.final_per_device_batch_size, 2);
    Ok(())
}
