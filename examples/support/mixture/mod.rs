//! The mixture example's run, shared by `examples/mixture.rs` and the experiments'
//! driver (`benches/compare/lm_mixing/driver.rs`): the flags (`args`), the domains
//! (`domains`), the mixers (`mixers`), the continual-pretraining replays
//! (`curriculum`, `bound`, and `reference` for a saved model's losses), the run
//! (`run`) and what it returns (`outcome`).

// The language-model example's parts; this one uses the model and optimizer.
#[allow(dead_code)]
#[path = "../decoder.rs"]
mod decoder;

mod args;
mod bound;
mod curriculum;
mod domains;
mod mixers;
pub mod outcome;
mod reference;
mod run;

pub use args::{parse, MixtureArgs};
pub use run::run;
