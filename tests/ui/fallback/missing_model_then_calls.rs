// `#[model]` is missing: that is the only error; the program's calls still
// type-check against stand-ins (there is no model to build the trait impl from).
use adabatch::prelude::*;
use candle_core::Device;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = interval(5, +1))]
struct Trainer {
    model: tiny::Tiny,
    #[optimizer]
    opt: SGD,
}

fn main() -> adabatch::Result<()> {
    let params = Parameters::new(42);
    let model = tiny::Tiny::new(params.clone(), &Device::Cpu)?;
    let opt = SGD::new(params.all_vars(), 0.1)?;
    let summary =
        Trainer::new(model, opt).train(&tiny::dataset(), &tiny::collate, &tiny::args())?;
    println!("{}", summary.global_step);
    let trained = Trainer::launch(&tiny::dataset(), &tiny::collate, &tiny::args(), |ctx| {
        let params = ctx.parameters();
        Ok(Trainer::new(
            tiny::Tiny::new(params.clone(), ctx.device())?,
            SGD::new(params.all_vars(), 0.1)?,
        ))
    })?;
    println!("{:?}", trained.summary);
    Ok(())
}
