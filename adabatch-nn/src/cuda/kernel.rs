//! What an op's CUDA body is: the kernel of `kernels/rows.cu` it launches and how.
//! Plain data, in every build; `launch.rs` (feature `cuda`) launches it, and the
//! CPU harness (feature `kernels-on-cpu`) runs the same launch ([`RowLaunch`]).

use candle_core::Result;

use super::limits::{COLUMN_THREADS, ROW_THREADS_MAX};

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

/// The scalar arguments of every row kernel: `RowArgs` of `kernels/rows.cu`, the
/// same layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowArgs {
    pub(crate) rows: i32,
    pub(crate) n: i32,
    pub(crate) eps: f32,
    pub(crate) has_ignore: i32,
    pub(crate) ignore: i64,
    pub(crate) h: i32,
    pub(crate) t: i32,
    pub(crate) flags: i32,
    pub(crate) x_rows: i32,
}

/// One launch of a kernel: its entry point, blocks and threads per block.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(
    not(any(feature = "cuda", feature = "kernels-on-cpu")),
    allow(dead_code)
)]
pub(crate) struct Pass {
    pub(crate) entry: String,
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: (u32, u32, u32),
}

/// A row op's launches over its first input's rows: the arguments, the passes in
/// order (the rows, then the column sums), and the per-row statistics between them.
#[derive(Clone, Debug)]
#[cfg_attr(
    not(any(feature = "cuda", feature = "kernels-on-cpu")),
    allow(dead_code)
)]
pub(crate) struct RowLaunch {
    pub(crate) args: RowArgs,
    pub(crate) passes: Vec<Pass>,
    /// Elements of the statistics buffer (at least one).
    pub(crate) stats_len: usize,
}

#[cfg_attr(
    not(any(feature = "cuda", feature = "kernels-on-cpu")),
    allow(dead_code)
)]
impl CudaKernel {
    /// The launches of this kernel in the dtype `suffix` over the first input's
    /// `rows` of `n`; `None` when there is nothing to run (no rows, rows of
    /// nothing), where the output is zeros.
    pub(crate) fn launch(&self, x_rows: (usize, usize), suffix: &str) -> Result<Option<RowLaunch>> {
        let (rows, n) = self.grid.unwrap_or(x_rows);
        if rows == 0 || n == 0 {
            return Ok(None);
        }
        let args = RowArgs {
            rows: to_i32(rows)?,
            n: to_i32(n)?,
            eps: self.eps,
            has_ignore: i32::from(self.ignore.is_some()),
            ignore: self.ignore.unwrap_or(0),
            h: to_i32(self.rope.heads)?,
            t: to_i32(self.rope.positions)?,
            flags: self.rope.flags,
            x_rows: to_i32(x_rows.0)?,
        };
        let mut passes = vec![Pass {
            entry: format!("adabatch_{}_{suffix}", self.name),
            grid: (args.rows as u32, 1, 1),
            block: (threads_for(n), 1, 1),
        }];
        if self.column_pass {
            passes.push(Pass {
                entry: format!("adabatch_{}_cols_{suffix}", self.name),
                grid: ((n as u32).div_ceil(COLUMN_THREADS), 1, 1),
                block: (COLUMN_THREADS, 1, 1),
            });
        }
        Ok(Some(RowLaunch {
            args,
            passes,
            stats_len: (rows * self.stats_per_row).max(1),
        }))
    }
}

/// A block of whole warps, one thread per element up to [`ROW_THREADS_MAX`].
fn threads_for(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, ROW_THREADS_MAX as usize) as u32
}

/// `value` as a kernel's `int`, or an error.
pub(crate) fn to_i32(value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| {
        candle_core::Error::Msg(format!(
            "{value} rows or columns exceed a CUDA kernel's i32"
        ))
    })
}
