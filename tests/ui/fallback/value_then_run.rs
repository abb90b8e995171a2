// A bad value, in a program that trains through the `Run` builder and the
// `AdaptiveTrainer` trait: the field roles are valid, so the trait is implemented
// (under the default policy) and nothing cascades.
use adabatch::prelude::*;
use candle_core::Device;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(seed = "7", oom = halve)]
struct Trainer {
    #[model]
    model: tiny::Tiny,
    #[optimizer]
    opt: SGD,
}

fn main() -> adabatch::Result<()> {
    let params = Parameters::new(<Trainer as AdaptiveTrainer>::POLICY.seed);
    let model = tiny::Tiny::new(params.clone(), &Device::Cpu)?;
    let opt = SGD::new(params.all_vars(), 0.1)?;
    let mut trainer = Trainer::new(model, opt);
    let summary = adabatch::Run::new(&tiny::dataset(), &tiny::collate, &tiny::args()).train(&mut trainer)?;
    println!("{}", summary.global_step);
    let trained = adabatch::Run::new(&tiny::dataset(), &tiny::collate, &tiny::args()).launch(|ctx| {
        let params = ctx.parameters();
        Ok(Trainer::new(
            tiny::Tiny::new(params.clone(), ctx.device())?,
            SGD::new(params.all_vars(), 0.1)?,
        ))
    })?;
    println!("{:?}", trained.summary);
    Ok(())
}
