// Every key at once (values this runtime runs), inspected through `POLICY`, then
// trained for three steps with `.train(...)`.
#![deny(warnings)]

use adabatch::prelude::*;
use adabatch::{
    GradAccum, LrScaling, MixSpec, OomPolicy, Reweight, ScheduleSpec, Sources, TrainerPolicy,
};
use candle_core::Device;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(
    schedule = steps(0 => 2, 2 => 3, 3 => 4),
    min_batch = 1,
    max_batch = 4,
    drop_last = true,
    reweight = none,
    oom = halve,
    grad_accum = fixed(2),
    lr_scaling = sqrt,
    shuffle = false,
    seed = 7,
    mix = fixed(all = 1.0),
    crate = "::adabatch",
)]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: SGD,
    steps_requested: usize,
}

const EXPECTED: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Steps(&[(0, 2), (2, 3), (3, 4)]),
    min_batch: 1,
    max_batch: Some(4),
    drop_last: true,
    reweight: Reweight::RankMean,
    oom: OomPolicy::Halve,
    grad_accum: GradAccum::Fixed(2),
    lr_scaling: LrScaling::Sqrt,
    shuffle: false,
    seed: 7,
    mix: MixSpec::Fixed(&[("all", 1.0)]),
};

fn main() -> adabatch::Result<()> {
    assert_eq!(Trainer::POLICY, EXPECTED);
    assert_eq!(<Trainer as AdaptiveTrainer>::POLICY, EXPECTED);

    let device = Device::Cpu;
    let params = Parameters::new(Trainer::POLICY.seed);
    let model = tiny::Tiny::new(params.clone(), &device)?;
    let opt = SGD::new(params.all_vars(), 0.05)?;
    let mut trainer = Trainer::new(model, opt, 3);
    let args = tiny::args();
    assert_eq!(args.length.max_steps, Some(trainer.steps_requested));
    // `mix` needs a dataset of sources: one, here.
    let data = Sources::new([("all", tiny::dataset())])?;
    let summary = trainer.train(&data, &tiny::collate, &args)?;
    assert_eq!(summary.global_step, 3);
    println!("{summary}");
    Ok(())
}
