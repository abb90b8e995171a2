// A tuple struct: one error on its fields; `new` takes them in order and the
// program's calls do not cascade.
use adabatch::prelude::*;
use candle_core::Device;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer]
struct Trainer(tiny::Tiny, SGD);

fn main() -> adabatch::Result<()> {
    let params = Parameters::new(Trainer::POLICY.seed);
    let model = tiny::Tiny::new(params.clone(), &Device::Cpu)?;
    let opt = SGD::new(params.all_vars(), 0.1)?;
    let mut trainer = Trainer::new(model, opt);
    let summary = trainer.train(&tiny::dataset(), &tiny::collate, &tiny::args())?;
    println!("{}", summary.global_step);
    Ok(())
}
