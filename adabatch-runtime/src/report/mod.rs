//! What a run tells: per-step logs (console, progress bar, JSONL) and the summary.

pub mod logging;
pub mod summary;
