//! What an op's CUDA body is: the kernel of `kernels/rows.cu` it launches and how.
//! Plain data, in every build; `cuda.rs` (feature `cuda`) launches it.

/// An op's CUDA body in `kernels/rows.cu`: one block per row, then (for the
/// backward ops that sum their parameters' gradients over rows) a pass per column.
#[derive(Clone, Copy, Debug)]
// Read by the CUDA launcher (`cuda.rs`), which only the `cuda` feature builds.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct CudaKernel {
    /// The kernel's name without `adabatch_` and the dtype suffix.
    pub(crate) name: &'static str,
    /// The op's epsilon (0 where it has none).
    pub(crate) eps: f32,
    /// Statistics each row leaves for the column pass.
    pub(crate) stats_per_row: usize,
    /// Whether `<name>_cols` sums the parameters' gradients after the rows.
    pub(crate) column_pass: bool,
    /// The target index whose rows are left out (the cross-entropy's).
    pub(crate) ignore: Option<i64>,
}

impl CudaKernel {
    /// A kernel of one pass over the rows.
    pub(crate) fn rows(name: &'static str, eps: f32) -> Self {
        Self {
            name,
            eps,
            stats_per_row: 0,
            column_pass: false,
            ignore: None,
        }
    }

    /// The same kernel, leaving out the rows whose target is `ignore`.
    pub(crate) fn ignoring(self, ignore: Option<i64>) -> Self {
        Self { ignore, ..self }
    }

    /// A backward kernel whose rows leave `stats_per_row` statistics for the
    /// column pass that sums the parameters' gradients.
    pub(crate) fn rows_then_columns(name: &'static str, eps: f32, stats_per_row: usize) -> Self {
        Self {
            name,
            eps,
            stats_per_row,
            column_pass: true,
            ignore: None,
        }
    }
}
