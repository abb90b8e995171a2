//! What a run tells: per-step logs (console, progress bar, JSONL, TensorBoard), the
//! summary, and pictures of runs.

pub mod logging;
pub mod messages;
pub mod plot;
pub mod record;
pub mod summary;
pub mod tensorboard;
