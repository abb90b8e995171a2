//! What an op's CUDA body is: the kernel of `kernels/rows.cu` it launches and how.
//! Plain data, in every build; `launch.rs` (feature `cuda`) launches it.

/// An op's CUDA body in `kernels/rows.cu`: one block per row, then (for the
/// backward ops that sum their parameters' gradients over rows) a pass per column.
/// Every op states its own in every build (the CPU tests check them); only the
/// CUDA launcher and those tests read the fields.
#[derive(Clone, Copy, Debug)]
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
    /// The ropes' geometry: heads and positions of x, and `ROPE_*` flags.
    pub(crate) rope: RopeArgs,
    /// Blocks and row length of the row pass where they are not the first
    /// input's rows (the rope tables' backward runs a block per table row).
    pub(crate) grid: Option<(usize, usize)>,
}

/// A rope's layout and direction, as `kernels/rows.cu` reads them.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) struct RopeArgs {
    pub(crate) heads: usize,
    pub(crate) positions: usize,
    pub(crate) flags: i32,
}

impl RopeArgs {
    /// Pairs `(2i, 2i + 1)`, else `(i, i + d/2)`.
    pub(crate) const INTERLEAVED: i32 = 1;
    /// x is `[b, t, h, d]`, else `[b, h, t, d]`.
    pub(crate) const THD: i32 = 2;
    /// One table per sequence, `[b, t, d/2]`.
    pub(crate) const BATCHED: i32 = 4;
    /// Rotates the other way (the backward for x).
    pub(crate) const NEGATE: i32 = 8;
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
            rope: RopeArgs::default(),
            grid: None,
        }
    }

    /// The same kernel with a rope's geometry.
    pub(crate) fn with_rope(self, rope: RopeArgs) -> Self {
        Self { rope, ..self }
    }

    /// The same kernel run as `blocks` blocks over rows of `n`.
    pub(crate) fn over(self, blocks: usize, n: usize) -> Self {
        Self {
            grid: Some((blocks, n)),
            ..self
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
            rope: RopeArgs::default(),
            grid: None,
        }
    }
}
