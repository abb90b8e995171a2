//! The loop, on top of everything. Files from the bottom up (imports run only
//! downward): the run's checked `settings`; OOM detection; collating a rank's
//! examples; prefetching them; one optimisation step; evaluation; checkpoints;
//! the controllers that adapt the run after a step (`control`); a rank's
//! account; the rank run as an object (`run`); the dry run; the entry points.

pub mod checkpoint;
pub(crate) mod collate;
pub(crate) mod control;
pub mod dry_run;
pub(crate) mod eval;
pub mod launch;
pub mod oom;
pub(crate) mod prefetch;
pub(crate) mod progress;
pub(crate) mod run;
pub(crate) mod settings;
pub(crate) mod step;
