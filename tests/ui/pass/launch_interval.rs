// `launch` with a factory: the README's shape, run for three steps.
use adabatch::prelude::*;
use adabatch::{Growth, ScheduleSpec};
use candle_core::DType;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = interval(5, +1), drop_last = false, reweight = sample_count)]
struct ReplayTrainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: SGD,
}

fn main() -> adabatch::Result<()> {
    assert_eq!(
        ReplayTrainer::POLICY.schedule,
        ScheduleSpec::Interval {
            every: 5,
            growth: Growth::Add(1)
        }
    );
    const { assert!(!ReplayTrainer::POLICY.drop_last) };

    let data = tiny::dataset();
    let trained =
        ReplayTrainer::launch(&data, &tiny::collate, &tiny::args(), |ctx: &RankContext| {
            let params = ctx.parameters();
            let model = tiny::Tiny::new(params.clone(), ctx.device())?;
            let opt = SGD::new(params.all_vars(), 0.1)?;
            let _ = DType::F32;
            Ok(ReplayTrainer::new(model, opt))
        })?;
    println!("{:?}", trained.summary);
    Ok(())
}
