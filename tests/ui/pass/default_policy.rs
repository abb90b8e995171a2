// No arguments: `TrainerPolicy::DEFAULT`; extra fields are kept and go to `new` in
// declaration order. The generated public items are documented (`missing_docs`).
//! A documented crate.
#![deny(warnings, missing_docs)]

use adabatch::prelude::*;
use adabatch::TrainerPolicy;
use candle_core::Device;
use candle_nn::{Optimizer, SGD};

#[path = "../support/tiny.rs"]
mod tiny;

/// A trainer.
#[adaptive_trainer]
pub struct Trainer {
    /// A note kept next to the model.
    pub name: String,
    /// The model.
    #[model]
    pub model: tiny::Tiny,
    /// The optimizer.
    #[optimizer]
    pub opt: SGD,
}

fn main() -> adabatch::Result<()> {
    assert_eq!(Trainer::POLICY, TrainerPolicy::DEFAULT);
    let params = Parameters::new(42);
    let model = tiny::Tiny::new(params.clone(), &Device::Cpu)?;
    let opt = SGD::new(params.all_vars(), 0.1)?;
    let mut trainer = Trainer::new("tiny".to_string(), model, opt);
    assert_eq!(trainer.name, "tiny");
    let summary = trainer.train(&tiny::dataset(), &tiny::collate, &tiny::args())?;
    assert_eq!(summary.global_step, 3);
    // The trainer keeps its trained weights.
    assert_eq!(trainer.name, "tiny");
    Ok(())
}
