//! The shape of one packed attention, which its CPU and CUDA bodies read alike:
//! the heads-first layout and which keys a query may see; and the CUDA kernels'
//! launches (blocks, threads, arguments), which the cudarc launcher and the CPU
//! harness share.

use candle_core::Result;

use crate::cuda::kernel::{Pass, to_i32};
use crate::cuda::limits::ATTENTION_THREADS;

/// Queries `[kv, b, g·t, d]` (the `g` query heads that share a key/value head
/// stacked along time), keys and values `[kv, b, t, d]`, document ids `[b, t]`.
/// A *pair* is one `(kv head, row)`: its `g·t` query rows read its `t` key rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Geometry {
    pub(crate) kv: usize,
    pub(crate) b: usize,
    pub(crate) g: usize,
    pub(crate) t: usize,
    pub(crate) d: usize,
    /// The sliding window; `t` when there is none (then `i − j < t` always holds).
    pub(crate) window: usize,
    pub(crate) scale: f64,
}

#[cfg_attr(
    not(any(feature = "cuda", feature = "kernels-on-cpu", test)),
    allow(dead_code)
)]
/// The CUDA kernels (`adabatch_<kernel>_c<C>_<dtype>` of `kernels/attention.cu`):
/// the forward, then the backward's dq (and `D`), then its dk and dv.
pub(crate) const KERNELS: [&str; 3] = ["attention_fwd", "attention_dq", "attention_dkdv"];

/// The widest head the CUDA kernels take.
#[cfg(any(feature = "cuda", feature = "kernels-on-cpu", test))]
pub(crate) const MAX_HEAD_DIM: usize = 256;

impl Geometry {
    /// `(kv head, row)` pairs, pair `p` being kv head `p / b` of row `p % b`.
    pub(crate) fn pairs(&self) -> usize {
        self.kv * self.b
    }

    /// Query rows: `kv·b·g·t`.
    pub(crate) fn q_rows(&self) -> usize {
        self.pairs() * self.g * self.t
    }

    /// Elements of the queries (and of the output).
    pub(crate) fn q_len(&self) -> usize {
        self.q_rows() * self.d
    }

    /// Elements of the keys (and of the values).
    pub(crate) fn kv_len(&self) -> usize {
        self.pairs() * self.t * self.d
    }

    /// Column chunks of 32 a head takes in the CUDA kernels (`C` of
    /// `kernels/attention.cu`): a power of two, 8 for heads of up to 256.
    #[cfg_attr(
        not(any(feature = "cuda", feature = "kernels-on-cpu", test)),
        allow(dead_code)
    )]
    pub(crate) fn chunks(&self) -> usize {
        self.d.div_ceil(32).next_power_of_two()
    }

    /// The keys query position `i` may see, before documents: `j ≤ i` within the
    /// window.
    pub(crate) fn keys_of(&self, i: usize) -> std::ops::Range<usize> {
        (i + 1).saturating_sub(self.window)..i + 1
    }
}

/// The kernels' scalar arguments: `AttnArgs` of `kernels/attention.cu`, the same
/// layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(
    not(any(feature = "cuda", feature = "kernels-on-cpu")),
    allow(dead_code)
)]
pub(crate) struct AttnArgs {
    pub(crate) scale: f64,
    pub(crate) t: i32,
    pub(crate) d: i32,
    pub(crate) g: i32,
    pub(crate) b: i32,
    pub(crate) pairs: i32,
    pub(crate) window: i32,
    pub(crate) has_docs: i32,
    pub(crate) chunks: i32,
}

#[cfg_attr(
    not(any(feature = "cuda", feature = "kernels-on-cpu")),
    allow(dead_code)
)]
impl Geometry {
    /// The kernels' arguments, with document ids or without; an error where a
    /// size exceeds the kernels' `int`s.
    pub(crate) fn kernel_args(&self, has_docs: bool) -> Result<AttnArgs> {
        // Query heads are a grid dimension of i32 range.
        to_i32(self.pairs() * self.g)?;
        Ok(AttnArgs {
            scale: self.scale,
            t: to_i32(self.t)?,
            d: to_i32(self.d)?,
            g: to_i32(self.g)?,
            b: to_i32(self.b)?,
            pairs: to_i32(self.pairs())?,
            window: to_i32(self.window)?,
            has_docs: i32::from(has_docs),
            chunks: to_i32(self.chunks())?,
        })
    }

    /// The forward's launch, in the dtype `suffix` computing in `acc_bytes`-byte
    /// floats: a block per (query head, tile of query rows).
    pub(crate) fn forward_pass(&self, suffix: &str, acc_bytes: usize) -> Pass {
        let (query_rows, _) = self.rows_per_block(acc_bytes);
        self.pass(KERNELS[0], suffix, self.pairs() * self.g, query_rows)
    }

    /// The backward's launches in order: dq (and `D`) per (query head, tile of
    /// query rows), then dk and dv per (pair, tile of key rows).
    pub(crate) fn backward_passes(&self, suffix: &str, acc_bytes: usize) -> [Pass; 2] {
        let (query_rows, key_rows) = self.rows_per_block(acc_bytes);
        [
            self.pass(KERNELS[1], suffix, self.pairs() * self.g, query_rows),
            self.pass(KERNELS[2], suffix, self.pairs(), key_rows),
        ]
    }

    /// Rows a block owns, as `Tile` of `kernels/attention.cu` sets them: queries of
    /// the forward and dq, keys of dk and dv.
    fn rows_per_block(&self, acc_bytes: usize) -> (usize, usize) {
        let per_thread = if acc_bytes == 8 { 8 } else { 16 };
        let per_warp = (per_thread / self.chunks()).min(8);
        (4 * per_warp, 4 * (per_warp / 2).max(1))
    }

    /// `adabatch_<kernel>_c<C>_<dtype>` over `blocks` along x and tiles of `rows`
    /// along y (each block loops over tiles past the grid's 65,535).
    fn pass(&self, kernel: &str, suffix: &str, blocks: usize, rows: usize) -> Pass {
        let tiles = self.t.div_ceil(rows).clamp(1, 65_535);
        Pass {
            entry: format!("adabatch_{kernel}_c{}_{suffix}", self.chunks()),
            grid: (blocks as u32, tiles as u32, 1),
            block: (ATTENTION_THREADS, 1, 1),
        }
    }
}
