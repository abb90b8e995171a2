//! Rotary position embeddings in candle-nn's three layouts, with a backward.
//!
//! Each pair `(x1, x2)` of the last dimension (its two halves for [`rope`] and
//! [`rope_thd`], neighbours for [`rope_i`]) becomes
//! `(x1·cos − x2·sin, x1·sin + x2·cos)`. On CPU that is one fused op with
//! candle-nn's arithmetic; its backward for `x` is the same op with `−sin`, and for
//! `cos` and `sin` (computed only when they need a gradient) a second fused op that
//! sums `g1·x1 + g2·x2` and `g2·x1 − g1·x2` over the heads (and the batch, for 2-D
//! tables). On other devices it is a composite of candle ops, which candle
//! differentiates.
//!
//! `cos` and `sin` are `[t', d/2]`, or `[b, t', d/2]` for one table per sequence,
//! with `t' ≥ t`: the first `t` positions are used, as in candle-nn.
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::rope;
//! use candle_core::{Device, Tensor, Var};
//!
//! # fn main() -> candle_core::Result<()> {
//! // One head, one position, the pair (1, 2) turned by 90°: cos 0, sin 1.
//! let x = Var::new(&[[[[1f32, 2.0]]]], &Device::Cpu)?;
//! let (cos, sin) = (Tensor::new(&[[0f32]], &Device::Cpu)?, Tensor::new(&[[1f32]], &Device::Cpu)?);
//! let y = rope(&x, &cos, &sin)?;
//! assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, [-2.0, 1.0]);
//! // ∂(y₁ + y₂)/∂x = (cos + sin, cos − sin).
//! let grads = y.sum_all()?.backward()?;
//! let dx = grads.get(&x).expect("x has a gradient").flatten_all()?.to_vec1::<f32>()?;
//! assert_eq!(dx, [1.0, -1.0]);
//! # Ok(()) }
//! ```

use candle_core::{Result, Shape, Tensor, WithDType, bail};

use super::cpu::{self, Acc};
use super::rows::{self, Apply, CpuInputs, CudaKernel, RopeArgs, RowOp};

/// Rotates the halves of the last dimension (`x` `[b, h, t, d]`); candle-nn's
/// `rotary_emb::rope` with a backward (for `x`, `cos` and `sin`).
///
/// On CPU: one fused op, equal to candle-nn's. Elsewhere: a composite of candle ops.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    apply(Variant::Halves, x, cos, sin)
}

/// Rotates interleaved pairs (`x` `[b, h, t, d]`); candle-nn's `rotary_emb::rope_i`
/// with a backward (for `x`, `cos` and `sin`).
///
/// On CPU: one fused op, equal to candle-nn's. Elsewhere: a composite of candle ops.
pub fn rope_i(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    apply(Variant::Interleaved, x, cos, sin)
}

/// [`rope`] on the `[b, t, h, d]` layout; candle-nn's `rotary_emb::rope_thd` with a
/// backward (for `x`, `cos` and `sin`).
///
/// On CPU: one fused op, equal to candle-nn's. Elsewhere: a composite of candle ops.
pub fn rope_thd(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    apply(Variant::Thd, x, cos, sin)
}

/// Which elements pair up, and where the positions are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// `[b, h, t, d]`, pairs `(i, i + d/2)`.
    Halves,
    /// `[b, h, t, d]`, pairs `(2i, 2i + 1)`.
    Interleaved,
    /// `[b, t, h, d]`, pairs `(i, i + d/2)`.
    Thd,
}

fn apply(variant: Variant, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let t = check(variant, x, cos, sin)?;
    let (cos, sin) = (first_positions(cos, t)?, first_positions(sin, t)?);
    let op = RopeOp {
        variant,
        negate_sin: false,
    };
    if !rows::runs_fused(&op, x.device()) {
        return composite(variant, x, &cos, &sin);
    }
    op.apply([x, &cos, &sin])
}

/// candle-nn's checks (and that the three share a dtype); returns `t`.
fn check(variant: Variant, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<usize> {
    let (b, t, d) = match (variant, x.dims4()?) {
        (Variant::Thd, (b, t, _h, d)) => (b, t, d),
        (_, (b, _h, t, d)) => (b, t, d),
    };
    let (cos_t, cos_d) = check_table(cos, b)?;
    let (sin_t, sin_d) = check_table(sin, b)?;
    if cos_d * 2 != d || sin_d * 2 != d || t > cos_t || t > sin_t || cos.rank() != sin.rank() {
        bail!(
            "inconsistent sizes in rope: x {:?}, cos {:?}, sin {:?} (cos and sin must both \
             be [t', d/2] or [b, t', d/2] with t' >= t)",
            x.shape(),
            cos.shape(),
            sin.shape()
        )
    }
    if cos.dtype() != x.dtype() || sin.dtype() != x.dtype() {
        bail!(
            "dtype mismatch in rope: x {:?}, cos {:?}, sin {:?}",
            x.dtype(),
            cos.dtype(),
            sin.dtype()
        )
    }
    Ok(t)
}

/// `(t', d/2)` of a `[t', d/2]` or `[b, t', d/2]` table (candle-nn's `rope_check_cs`).
fn check_table(table: &Tensor, b: usize) -> Result<(usize, usize)> {
    match *table.dims() {
        [t, d] => Ok((t, d)),
        [tb, t, d] if tb == b => Ok((t, d)),
        [tb, _, _] => bail!("inconsistent batch size in rope: x has {b}, cos/sin {tb}"),
        _ => bail!(
            "cos/sin have to be 2D or 3D in rope, got {:?}",
            table.shape()
        ),
    }
}

/// The first `t` positions of a table (differentiable: the rest gets a zero gradient).
fn first_positions(table: &Tensor, t: usize) -> Result<Tensor> {
    table.narrow(table.rank() - 2, 0, t)
}

/// The rope as candle ops, for devices without the fused op (and as the reference
/// the tests hold the fused op to). `cos`, `sin`: exactly `t` positions.
fn composite(variant: Variant, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(3)? / 2;
    // Tables as `[b or 1, t, d/2]`, then with axes of size 1 where x has heads (and
    // for rope_i, the pair).
    let batched = |cs: &Tensor| match cs.rank() {
        2 => cs.unsqueeze(0),
        _ => Ok(cs.clone()),
    };
    let (cos, sin) = (batched(cos)?, batched(sin)?);
    let rotate = |x1: &Tensor, x2: &Tensor, cos: &Tensor, sin: &Tensor| -> Result<_> {
        let y1 = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
        let y2 = (x1.broadcast_mul(sin)? + x2.broadcast_mul(cos)?)?;
        Ok([y1, y2])
    };
    match variant {
        Variant::Interleaved => {
            let (b, h, t, _) = x.dims4()?;
            let x = x.reshape((b, h, t, half, 2))?;
            let (x1, x2) = (x.narrow(4, 0, 1)?, x.narrow(4, 1, 1)?);
            let (cos, sin) = (
                cos.unsqueeze(1)?.unsqueeze(4)?,
                sin.unsqueeze(1)?.unsqueeze(4)?,
            );
            Tensor::cat(&rotate(&x1, &x2, &cos, &sin)?, 4)?.flatten_from(3)
        }
        Variant::Halves | Variant::Thd => {
            let axis = if variant == Variant::Thd { 2 } else { 1 };
            let (cos, sin) = (cos.unsqueeze(axis)?, sin.unsqueeze(axis)?);
            let (x1, x2) = (x.narrow(3, 0, half)?, x.narrow(3, half, half)?);
            Tensor::cat(&rotate(&x1, &x2, &cos, &sin)?, 3)
        }
    }
}

/// Where each row (the `d` elements of one position of one head) finds its table row.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    h: usize,
    t: usize,
    d: usize,
    rows: usize,
    /// One table per sequence (`[b, t, d/2]`).
    batched: bool,
    thd: bool,
}

impl Geometry {
    fn new(variant: Variant, dims: &[usize], table_len: usize) -> Result<Self> {
        let [b, a1, a2, d] = *dims else {
            bail!("rope: x has to be 4D, got {dims:?}")
        };
        let thd = variant == Variant::Thd;
        let (h, t) = if thd { (a2, a1) } else { (a1, a2) };
        let batched = match table_len {
            len if len == t * (d / 2) => false,
            len if len == b * t * (d / 2) => true,
            len => bail!("rope: a table of {len} elements does not fit x {dims:?}"),
        };
        let rows = b * h * t;
        Ok(Self {
            h,
            t,
            d,
            rows,
            batched,
            thd,
        })
    }

    /// The kernels' view of it: heads, positions and flags (`negate` added).
    #[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
    fn rope_args(&self, variant: Variant, negate: i32) -> RopeArgs {
        let mut flags = negate;
        if variant == Variant::Interleaved {
            flags |= RopeArgs::INTERLEAVED;
        }
        if self.thd {
            flags |= RopeArgs::THD;
        }
        if self.batched {
            flags |= RopeArgs::BATCHED;
        }
        RopeArgs {
            heads: self.h,
            positions: self.t,
            flags,
        }
    }

    /// The offset of row `row`'s first `cos`/`sin` element.
    fn table_offset(&self, row: usize) -> usize {
        let b_i = row / (self.h * self.t);
        let t_i = if self.thd {
            (row / self.h) % self.t
        } else {
            row % self.t
        };
        let table_row = if self.batched {
            b_i * self.t + t_i
        } else {
            t_i
        };
        table_row * (self.d / 2)
    }
}

/// One row of the rope, with candle-nn's arithmetic (in `T`); `negate_sin` rotates
/// the other way (the backward).
fn rotate_row<T: WithDType>(
    x: &[T],
    y: &mut [T],
    cos: &[T],
    sin: &[T],
    interleaved: bool,
    negate_sin: bool,
) {
    let sin_of = |s: T| if negate_sin { T::zero() - s } else { s };
    if interleaved {
        for (((y, x), &c), &s) in y
            .chunks_exact_mut(2)
            .zip(x.chunks_exact(2))
            .zip(cos)
            .zip(sin)
        {
            let s = sin_of(s);
            y[0] = x[0] * c - x[1] * s;
            y[1] = x[0] * s + x[1] * c;
        }
    } else {
        let half = cos.len();
        let ((x1, x2), (y1, y2)) = (x.split_at(half), y.split_at_mut(half));
        let pairs = x1.iter().zip(x2).zip(y1.iter_mut().zip(y2));
        for (((&x1, &x2), (y1, y2)), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
            let s = sin_of(s);
            *y1 = x1 * c - x2 * s;
            *y2 = x1 * s + x2 * c;
        }
    }
}

/// One row's contribution to the gradients of `cos` and `sin`.
fn table_grad_row<T: WithDType, A: Acc>(
    g: &[T],
    x: &[T],
    dcos: &mut [A],
    dsin: &mut [A],
    interleaved: bool,
) {
    let add = |(g1, g2): (T, T), (x1, x2): (T, T), dc: &mut A, ds: &mut A| {
        let (g1, g2, x1, x2) = (A::of(g1), A::of(g2), A::of(x1), A::of(x2));
        *dc += g1 * x1 + g2 * x2;
        *ds += g2 * x1 - g1 * x2;
    };
    let half = dcos.len();
    let tables = dcos.iter_mut().zip(dsin.iter_mut());
    if interleaved {
        for ((g, x), (dc, ds)) in g.chunks_exact(2).zip(x.chunks_exact(2)).zip(tables) {
            add((g[0], g[1]), (x[0], x[1]), dc, ds);
        }
    } else {
        let ((g1, g2), (x1, x2)) = (g.split_at(half), x.split_at(half));
        let pairs = g1.iter().zip(g2).zip(x1.iter().zip(x2));
        for (((&g1, &g2), (&x1, &x2)), (dc, ds)) in pairs.zip(tables) {
            add((g1, g2), (x1, x2), dc, ds);
        }
    }
}

/// The fused rope: `x`, `cos`, `sin` -> `y` (with `negate_sin`, the backward for `x`).
#[derive(Clone, Copy, Debug)]
struct RopeOp {
    variant: Variant,
    negate_sin: bool,
}

impl RowOp<3> for RopeOp {
    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Halves => "adabatch-rope",
            Variant::Interleaved => "adabatch-rope-i",
            Variant::Thd => "adabatch-rope-thd",
        }
    }

    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("rope", 0.0))
    }

    /// x's heads and positions, the variant, the direction, and whether the
    /// tables are per sequence (from `cos`'s length).
    fn cuda_for(&self, kernel: CudaKernel, dims: &[&[usize]]) -> Result<CudaKernel> {
        let (x, table_len) = match dims {
            [x, cos, ..] => (*x, cos.iter().product()),
            _ => bail!("{}: x, cos and sin are needed", self.name()),
        };
        let geo = Geometry::new(self.variant, x, table_len)?;
        let negate = if self.negate_sin { RopeArgs::NEGATE } else { 0 };
        Ok(kernel.with_rope(geo.rope_args(self.variant, negate)))
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [x, cos, sin] = inputs.floats()?;
        let geo = Geometry::new(self.variant, inputs.dims(), cos.len())?;
        let (d, half) = (geo.d, geo.d / 2);
        let interleaved = self.variant == Variant::Interleaved;
        let mut y = vec![T::zero(); x.len()];
        cpu::for_rows(&mut y, geo.rows, x.len(), |row, y| {
            let at = geo.table_offset(row);
            let (cos, sin) = (&cos[at..][..half], &sin[at..][..half]);
            let x = cpu::row(x, row, d);
            rotate_row(x, y, cos, sin, interleaved, self.negate_sin);
        });
        Ok(y)
    }

    fn backward(
        &self,
        [x, cos, sin]: [&Tensor; 3],
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<[Option<Tensor>; 3]> {
        let dx = if x.track_op() {
            let back = RopeOp {
                negate_sin: !self.negate_sin,
                ..*self
            };
            Some(back.apply_no_bwd([grad, cos, sin])?)
        } else {
            None
        };
        if !cos.track_op() && !sin.track_op() {
            return Ok([dx, None, None]);
        }
        let op = RopeTableBwd {
            variant: self.variant,
            batched: cos.rank() == 3,
        };
        let dtables = op.apply_no_bwd([grad, x])?;
        let dcos = dtables.get(0)?.reshape(cos.shape())?;
        let dsin = dtables.get(1)?.reshape(sin.shape())?;
        let [dcos, dsin] = rows::where_tracked([cos, sin], [dcos, dsin]);
        Ok([dx, dcos, dsin])
    }
}

/// The rope's backward for the tables: `grad`, `x` -> `[2, rows of cos, d/2]`,
/// `dcos` then `dsin`.
#[derive(Clone, Copy, Debug)]
struct RopeTableBwd {
    variant: Variant,
    batched: bool,
}

impl RopeTableBwd {
    /// The rows of a table and their length, `d/2`, for an `x` of `dims`.
    fn table_dims(&self, dims: &[usize]) -> Result<(usize, usize)> {
        let [b, a1, a2, d] = *dims else {
            bail!("rope: x has to be 4D, got {dims:?}")
        };
        let t = if self.variant == Variant::Thd { a1 } else { a2 };
        Ok((if self.batched { b * t } else { t }, d / 2))
    }
}

impl RowOp<2> for RopeTableBwd {
    fn name(&self) -> &'static str {
        "adabatch-rope-table-bwd"
    }

    fn cuda(&self) -> Option<CudaKernel> {
        Some(CudaKernel::rows("rope_table_bwd", 0.0))
    }

    /// A block per table row, each summing over the rows of x that use it.
    fn cuda_for(&self, kernel: CudaKernel, dims: &[&[usize]]) -> Result<CudaKernel> {
        let Some(x) = dims.first() else {
            bail!("{}: the gradient and x are needed", self.name())
        };
        let (table_rows, half) = self.table_dims(x)?;
        let geo = Geometry::new(self.variant, x, table_rows * half)?;
        Ok(kernel
            .with_rope(geo.rope_args(self.variant, 0))
            .over(table_rows, geo.d))
    }

    fn shape(&self, dims: &[usize]) -> Shape {
        // Only asked once `cpu` has taken `dims` as 4-D.
        let (rows, half) = self.table_dims(dims).unwrap_or_default();
        Shape::from((2, rows, half))
    }

    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>> {
        let [g, x] = inputs.floats()?;
        let (table_rows, half) = self.table_dims(inputs.dims())?;
        let table_len = table_rows * half;
        let geo = Geometry::new(self.variant, inputs.dims(), table_len)?;
        let d = geo.d;
        let interleaved = self.variant == Variant::Interleaved;
        let dtables =
            cpu::rows_then_sums::<T, A>(geo.rows, 0, 2 * table_len, 2 * x.len(), |row, _, acc| {
                let (dcos, dsin) = acc.split_at_mut(table_len);
                let at = geo.table_offset(row);
                let (g, x) = (cpu::row(g, row, d), cpu::row(x, row, d));
                let (dcos, dsin) = (&mut dcos[at..][..half], &mut dsin[at..][..half]);
                table_grad_row(g, x, dcos, dsin, interleaved);
            });
        Ok(dtables)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{
        assert_close, assert_finite_differences, assert_grads_match, assert_same, grads, randn,
    };
    use candle_core::{DType, Device, Var};

    type Rope = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;

    /// Ours and candle-nn's fused op, per variant.
    const VARIANTS: [(Variant, Rope, Rope); 3] = [
        (Variant::Halves, rope, candle_nn::rotary_emb::rope),
        (Variant::Interleaved, rope_i, candle_nn::rotary_emb::rope_i),
        (Variant::Thd, rope_thd, candle_nn::rotary_emb::rope_thd),
    ];

    /// `(b, h, t, d)`: odd sizes, one position (candle-nn's decoding path), pairs of
    /// one, and (the last) one big enough to run on the pool.
    const SIZES: &[(usize, usize, usize, usize)] = &[
        (2, 3, 5, 8),
        (1, 2, 1, 6),
        (3, 1, 7, 2),
        (2, 5, 3, 10),
        (2, 8, 40, 64),
    ];

    /// `x` in the variant's layout, and tables of `t_table` positions (one per
    /// sequence when `batched`).
    fn inputs(
        variant: Variant,
        (b, h, t, d): (usize, usize, usize, usize),
        t_table: usize,
        batched: bool,
        dtype: DType,
    ) -> [Tensor; 3] {
        let x_dims = if variant == Variant::Thd {
            [b, t, h, d]
        } else {
            [b, h, t, d]
        };
        let table = if batched {
            vec![b, t_table, d / 2]
        } else {
            vec![t_table, d / 2]
        };
        let angles = randn(&table, DType::F64, 2);
        let cos = angles.cos().and_then(|c| c.to_dtype(dtype)).unwrap();
        let sin = angles.sin().and_then(|s| s.to_dtype(dtype)).unwrap();
        [randn(&x_dims, dtype, 1), cos, sin]
    }

    #[test]
    fn every_cuda_body_names_a_kernel_and_has_a_backward() {
        for variant in [Variant::Halves, Variant::Interleaved, Variant::Thd] {
            let op = RopeOp {
                variant,
                negate_sin: false,
            };
            let tables = RopeTableBwd {
                variant,
                batched: false,
            };
            for kernel in [op.cuda(), tables.cuda()] {
                rows::assert_kernel_exists(kernel.expect("a CUDA body"));
            }
        }
    }

    #[test]
    fn the_cuda_geometry_follows_the_layout() -> Result<()> {
        let op = RopeOp {
            variant: Variant::Thd,
            negate_sin: true,
        };
        let kernel = CudaKernel::rows("rope", 0.0);
        // x [b 2, t 5, h 3, d 8]; tables per sequence: [2, 5, 4].
        let args = op.cuda_for(kernel, &[&[2, 5, 3, 8], &[2, 5, 4]])?.rope;
        assert_eq!((args.heads, args.positions), (3, 5));
        let flags = RopeArgs::THD | RopeArgs::BATCHED | RopeArgs::NEGATE;
        assert_eq!(args.flags, flags);
        let tables = RopeTableBwd {
            variant: Variant::Interleaved,
            batched: false,
        };
        // x [b 2, h 3, t 5, d 8]: a block per table row (5), rows of x of 8.
        let k = tables.cuda_for(kernel, &[&[2, 3, 5, 8], &[2, 3, 5, 8]])?;
        assert_eq!(k.grid, Some((5, 8)));
        assert_eq!((k.rope.heads, k.rope.positions), (3, 5));
        assert_eq!(k.rope.flags, RopeArgs::INTERLEAVED);
        Ok(())
    }

    #[test]
    fn forward_equals_candle_nn_bit_for_bit() -> Result<()> {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for (variant, ours, candle) in VARIANTS {
                for &size in SIZES {
                    // candle-nn reads a longer 2-D table's first rows correctly, but
                    // not a longer 3-D one: its kernel assumes t' = t there.
                    for (t_extra, batched) in [(0, false), (3, false), (0, true)] {
                        let [x, cos, sin] = inputs(variant, size, size.2 + t_extra, batched, dtype);
                        let what = format!("{variant:?} {dtype:?} {size:?} +{t_extra} {batched}");
                        let want = candle(&x, &cos, &sin)?;
                        assert_same(&ours(&x, &cos, &sin)?, &want, &what);
                        let (cos, sin) = (
                            first_positions(&cos, size.2)?,
                            first_positions(&sin, size.2)?,
                        );
                        let composite = composite(variant, &x, &cos, &sin)?;
                        assert_same(&composite, &want, &format!("composite {what}"));
                    }
                }
            }
        }
        Ok(())
    }

    /// A 3-D table longer than `t`, which candle-nn's fused op misreads.
    #[test]
    fn longer_batched_tables() -> Result<()> {
        for (variant, ours, _) in VARIANTS {
            let [x, cos, sin] = inputs(variant, (2, 3, 4, 6), 9, true, DType::F32);
            let (c, s) = (first_positions(&cos, 4)?, first_positions(&sin, 4)?);
            let want = composite(variant, &x, &c, &s)?;
            assert_same(&ours(&x, &cos, &sin)?, &want, &format!("{variant:?}"));
            // The same as the table cut to t by hand.
            assert_same(&ours(&x, &c.contiguous()?, &s.contiguous()?)?, &want, "cut");
        }
        Ok(())
    }

    #[test]
    fn thd_is_rope_on_the_transposed_layout() -> Result<()> {
        let [x, cos, sin] = inputs(Variant::Thd, (2, 3, 5, 8), 5, false, DType::F32);
        let want = rope(&x.transpose(1, 2)?.contiguous()?, &cos, &sin)?.transpose(1, 2)?;
        assert_same(&rope_thd(&x, &cos, &sin)?, &want.contiguous()?, "thd");
        Ok(())
    }

    #[test]
    fn non_contiguous_input() -> Result<()> {
        let [x, cos, sin] = inputs(Variant::Halves, (2, 3, 5, 8), 5, false, DType::F32);
        let x = x.transpose(0, 1)?.contiguous()?.transpose(0, 1)?;
        let cos_t = cos.t()?.contiguous()?.t()?;
        assert!(!x.is_contiguous() && !cos_t.is_contiguous());
        let want = candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)?;
        assert_same(&rope(&x, &cos_t, &sin)?, &want, "forward");
        Ok(())
    }

    #[test]
    fn backward_equals_the_composite() -> Result<()> {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            for (variant, ours, _) in VARIANTS {
                for &size in SIZES {
                    for (t_extra, batched) in [(0, false), (3, false), (0, true), (2, true)] {
                        let inputs = inputs(variant, size, size.2 + t_extra, batched, dtype);
                        let reference = |t: &[Tensor]| {
                            let tt = size.2;
                            let (c, s) = (first_positions(&t[1], tt)?, first_positions(&t[2], tt)?);
                            composite(variant, &t[0], &c, &s)
                        };
                        assert_grads_match(
                            &|t| ours(&t[0], &t[1], &t[2]),
                            &reference,
                            &inputs,
                            tol,
                            &format!("{variant:?} {dtype:?} {size:?} +{t_extra} {batched}"),
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn bf16_backward_is_close_to_the_composite() -> Result<()> {
        for (variant, ours, _) in VARIANTS {
            let inputs = inputs(variant, (2, 3, 6, 16), 6, false, DType::BF16);
            assert_grads_match(
                &|t| ours(&t[0], &t[1], &t[2]),
                &|t| composite(variant, &t[0], &t[1], &t[2]),
                &inputs,
                2e-2,
                &format!("{variant:?}"),
            )?;
        }
        Ok(())
    }

    #[test]
    fn backward_equals_finite_differences() -> Result<()> {
        for (variant, ours, _) in VARIANTS {
            for (t_extra, batched) in [(0, false), (2, false), (1, true)] {
                let inputs = inputs(variant, (2, 2, 3, 4), 3 + t_extra, batched, DType::F64);
                let f = |t: &[Tensor]| ours(&t[0], &t[1], &t[2]);
                let what = format!("{variant:?} +{t_extra} {batched}");
                // Rows of a longer table past t get no gradient; the others must.
                let table_rows = |g: &Tensor| -> Result<Vec<f64>> {
                    let past = g.narrow(g.rank() - 2, 3, t_extra)?;
                    past.flatten_all()?.to_vec1()
                };
                for g in &grads(&f, &inputs, 7)?[1..] {
                    assert!(table_rows(g)?.iter().all(|v| *v == 0.), "{what}");
                }
                if t_extra == 0 {
                    assert_finite_differences(&f, &inputs, &what)?;
                } else {
                    // Only x: the all-zero rows would fail the non-zero check.
                    let f = |t: &[Tensor]| ours(&t[0], &inputs[1], &inputs[2]);
                    assert_finite_differences(&f, &inputs[..1], &what)?;
                }
            }
        }
        Ok(())
    }

    /// Tables that are plain tensors (the usual case) get no gradient and cost none.
    #[test]
    fn constant_tables_get_no_gradient() -> Result<()> {
        let [x, cos, sin] = inputs(Variant::Halves, (2, 3, 5, 8), 5, false, DType::F32);
        let x = Var::from_tensor(&x)?;
        let y = rope(&x, &cos, &sin)?;
        let grads = (y * randn(&[2, 3, 5, 8], DType::F32, 3))?
            .sum_all()?
            .backward()?;
        assert!(grads.get(&x).is_some());
        assert!(grads.get(&cos).is_none() && grads.get(&sin).is_none());
        Ok(())
    }

    /// The problem this module solves, so that the tests above mean something.
    #[test]
    fn candle_nn_fused_rope_stops_gradients() -> Result<()> {
        let [x, cos, sin] = inputs(Variant::Halves, (1, 2, 3, 4), 3, false, DType::F32);
        let x = Var::from_tensor(&x)?;
        let w = randn(&[1, 2, 3, 4], DType::F32, 3);
        let loss = |y: Tensor| (y * &w)?.sum_all();
        let grads = loss(candle_nn::rotary_emb::rope(&x, &cos, &sin)?)?.backward()?;
        assert!(grads.get(&x).is_none());
        let grads = loss(rope(&x, &cos, &sin)?)?.backward()?;
        let dx = grads.get(&x).expect("a gradient");
        // The rotation is orthogonal: dx is w rotated back, and has w's norm.
        let norm = |t: &Tensor| -> Result<f32> { t.sqr()?.sum_all()?.to_scalar() };
        assert!((norm(dx)? - norm(&w)?).abs() < 1e-4 * norm(&w)?);
        Ok(())
    }

    #[test]
    fn mismatched_inputs_are_errors() -> Result<()> {
        let zeros = |dims: &[usize]| Tensor::zeros(dims, DType::F32, &Device::Cpu);
        let x = zeros(&[2, 3, 5, 8])?;
        let message = |r: Result<Tensor>| r.unwrap_err().to_string();
        let sizes = "inconsistent sizes in rope";
        assert!(message(rope(&x, &zeros(&[5, 3])?, &zeros(&[5, 4])?)).contains(sizes));
        assert!(message(rope(&x, &zeros(&[4, 4])?, &zeros(&[4, 4])?)).contains(sizes));
        assert!(message(rope(&x, &zeros(&[5, 4])?, &zeros(&[2, 5, 4])?)).contains(sizes));
        let batch = message(rope_i(&x, &zeros(&[3, 5, 4])?, &zeros(&[3, 5, 4])?));
        assert!(batch.contains("inconsistent batch size"), "{batch}");
        let rank = message(rope_thd(&x, &zeros(&[5, 4, 1, 1])?, &zeros(&[5, 4])?));
        assert!(rank.contains("2D or 3D"), "{rank}");
        assert!(rope(&zeros(&[2, 3, 8])?, &zeros(&[3, 4])?, &zeros(&[3, 4])?).is_err());
        let f64s = Tensor::zeros((5, 4), DType::F64, &Device::Cpu)?;
        assert!(message(rope(&x, &f64s, &f64s)).contains("dtype mismatch in rope"));
        Ok(())
    }

    #[test]
    fn empty_batch() -> Result<()> {
        let [_, cos, sin] = inputs(Variant::Halves, (1, 2, 3, 4), 3, false, DType::F32);
        let x = Var::from_tensor(&Tensor::zeros((0, 2, 3, 4), DType::F32, &Device::Cpu)?)?;
        let cos = Var::from_tensor(&cos)?;
        let y = rope(&x, &cos, &sin)?;
        assert_eq!(y.dims(), &[0, 2, 3, 4]);
        let grads = y.sum_all()?.backward()?;
        let zeros = Tensor::zeros((3, 2), DType::F32, &Device::Cpu)?;
        assert_close(
            &(grads.get(&cos).unwrap() + 1.)?,
            &(zeros + 1.)?,
            0.,
            "dcos",
        );
        Ok(())
    }
}
