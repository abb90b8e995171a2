//! The memory-model hook: predicts a candidate batch's peak memory.

/// Shape features of a batch that drive its memory use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct BatchFeatures {
    /// Examples in the batch.
    pub batch_size: usize,
    /// Longest example, in tokens.
    pub max_len: usize,
    /// Sum of example lengths, in tokens.
    pub token_sum: usize,
    /// Tokens after padding to `max_len` (`batch_size * max_len`).
    pub padded_tokens: usize,
}

/// Predicts peak memory of a candidate batch relative to a baseline batch
/// (`1.0` = the baseline's peak). Attach one with `#[regressor]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a memory model",
    label = "the `#[regressor]` field must implement `adabatch::MemoryModel`",
    note = "implement `adabatch::MemoryModel` (`fn predict(&self, candidate, baseline) -> f64`)"
)]
pub trait MemoryModel {
    /// Predicted peak memory of `candidate` as a multiple of `baseline`'s.
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64;
    /// A measurement to learn from (bytes at peak for `features`).
    fn observe(&mut self, _features: &BatchFeatures, _peak_bytes: u64) {}
}
