// A typo in the attribute, in a whole program: the typo is the only error; the
// program's uses of `new`, `train`, `launch` and `POLICY` do not cascade.
use adabatch::prelude::*;
use candle_core::Device;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = interval(5, +1), dorp_last = true)]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: SGD,
}

fn build(ctx: &RankContext) -> adabatch::Result<Trainer> {
    let params = ctx.parameters();
    let model = tiny::Tiny::new(params.clone(), ctx.device())?;
    let opt = SGD::new(params.all_vars(), 0.1)?;
    Ok(Trainer::new(model, opt))
}

fn main() -> adabatch::Result<()> {
    let seed = Trainer::POLICY.seed;
    let params = Parameters::new(seed);
    let model = tiny::Tiny::new(params.clone(), &Device::Cpu)?;
    let opt = SGD::new(params.all_vars(), 0.1)?;
    let mut trainer = Trainer::new(model, opt);
    let summary = trainer.train(&tiny::dataset(), &tiny::collate, &tiny::args())?;
    println!("{}", summary.global_step);

    let trained = Trainer::launch(&tiny::dataset(), &tiny::collate, &tiny::args(), |ctx| {
        let params = ctx.parameters();
        let model = tiny::Tiny::new(params.clone(), ctx.device())?;
        let opt = SGD::new(params.all_vars(), 0.1)?;
        Ok(Trainer::new(model, opt))
    })?;
    let Trained { trainer, summary } = trained;
    let _: Trainer = trainer;
    println!("{}", summary.world_size);
    let _ = Trainer::launch(&tiny::dataset(), &tiny::collate, &tiny::args(), build)?;
    Ok(())
}
