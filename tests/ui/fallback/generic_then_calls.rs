// A generic trainer with a mistake in a field attribute and one in the attribute:
// two errors, and the generic uses of the trainer do not add any.
use adabatch::prelude::*;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

#[adaptive_trainer(schedule = constant(0))]
struct Trainer<M, O>
where
    M: TrainModel,
    O: Optimizer,
{
    #[model(frozen)]
    model: M,
    #[optimizer]
    opt: O,
}

fn main() -> adabatch::Result<()> {
    let args = {
        let mut a = tiny::args();
        a.launch.nproc_per_node = 2;
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
    let Trained { trainer, summary } = trained;
    let _: Trainer<tiny::Tiny, SGD> = trainer;
    println!("{}", summary.global_step);
    Ok(())
}
