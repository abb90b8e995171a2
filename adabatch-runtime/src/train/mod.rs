//! The loop, on top of everything: entry points, the rank loop, one step, OOM
//! recovery, checkpoints and the run's checked settings.

pub(crate) mod adaptation;
pub mod best;
pub mod checkpoint;
pub mod dry_run;
pub(crate) mod engine;
pub(crate) mod eval;
pub(crate) mod hooks;
pub mod launch;
pub mod oom;
pub(crate) mod prefetch;
pub(crate) mod progress;
pub(crate) mod settings;
pub(crate) mod start;
pub(crate) mod step;
