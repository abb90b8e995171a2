//! The loop, on top of everything. Files from the bottom up (imports run only
//! downward, between folders too): OOM detection; collating a rank's examples;
//! the run's checked `settings`; prefetching; one optimisation step; evaluation;
//! the controllers that adapt the run after a step (`control`); checkpoints; a
//! rank's account; the rank run as an object (`run`); the dry run; the entry
//! point.

pub mod checkpoint;
pub(crate) mod collate;
pub(crate) mod control;
pub mod dry_run;
pub(crate) mod eval;
pub(crate) mod grads;
pub mod interrupt;
pub mod launch;
pub mod out_of_memory;
pub(crate) mod payload;
pub(crate) mod prefetch;
pub(crate) mod probe;
pub(crate) mod progress;
pub(crate) mod run;
pub(crate) mod settings;
pub(crate) mod source_grads;
pub(crate) mod source_sums;
pub(crate) mod step;
