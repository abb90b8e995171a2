//! What the fused ops' CPU bodies compute with: the type they compute in, row loops
//! on candle's CPU thread pool, and sums.

use std::ops::{Add, AddAssign, Div, Mul, Range, Sub};
use std::sync::Mutex;

use candle_core::{DType, WithDType};

/// Below this many elements touched, a kernel runs on the calling thread: waking
/// the pool costs more than it saves.
const PAR_MIN_ELEMS: usize = 16 * 1024;

/// The type a kernel computes in: `f32` for bf16, f16 and f32 tensors (as
/// candle-nn's kernels do), `f64` for f64 tensors.
pub(crate) trait Acc:
    Copy
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + AddAssign
{
    /// Zero.
    const ZERO: Self;
    /// `v`, exactly (every supported `T` widens without loss).
    fn of<T: WithDType>(v: T) -> Self;
    /// `self` rounded to `T` as candle-nn rounds it (`T::from_f32` for `f32`).
    fn to<T: WithDType>(self) -> T;
    /// `v` widened.
    fn from_f32(v: f32) -> Self;
    /// `n` as a float.
    fn from_usize(n: usize) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// `1 / self`.
    fn recip(self) -> Self;
    /// `e^self`.
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
}

impl Acc for f32 {
    const ZERO: Self = 0.;
    fn of<T: WithDType>(v: T) -> Self {
        v.to_f64() as f32
    }
    fn to<T: WithDType>(self) -> T {
        // half's f64 -> bf16/f16 conversion reads only the top 32 bits of the f64,
        // that is 20 of an f32's 23 mantissa bits; folding the last three into a
        // sticky bit makes it round as `from_f32` (candle-nn's conversion) does.
        if matches!(T::DTYPE, DType::BF16 | DType::F16) && self.to_bits() & 7 != 0 {
            return T::from_f64(f32::from_bits(self.to_bits() | 8) as f64);
        }
        T::from_f64(self as f64)
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn from_usize(n: usize) -> Self {
        n as f32
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn recip(self) -> Self {
        f32::recip(self)
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
}

impl Acc for f64 {
    const ZERO: Self = 0.;
    fn of<T: WithDType>(v: T) -> Self {
        v.to_f64()
    }
    fn to<T: WithDType>(self) -> T {
        T::from_f64(self)
    }
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    fn from_usize(n: usize) -> Self {
        n as f64
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn recip(self) -> Self {
        f64::recip(self)
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
}

/// Splits `n_rows` rows in blocks, one per thread of candle's CPU pool, and calls
/// `f(row, dst_row, acc)` on each row, where `dst_row` is the row's equal share of
/// `dst` (possibly empty) and `acc` a fresh `init()` per block. Returns the blocks'
/// accumulators, in no particular order.
pub(crate) fn reduce_rows<T: Send, S: Send>(
    dst: &mut [T],
    n_rows: usize,
    work: usize,
    init: impl Fn() -> S,
    f: impl Fn(usize, &mut [T], &mut S) + Sync,
) -> Vec<S> {
    let pool = candle_core::utils::barrier_pool();
    let blocks = if work < PAR_MIN_ELEMS {
        1
    } else {
        (pool.n_workers() + 1).min(n_rows)
    };
    if blocks <= 1 {
        let mut acc = init();
        each_row(0..n_rows, dst, &mut acc, &f);
        return vec![acc];
    }
    let cells: Vec<_> = split_rows(dst, n_rows, blocks)
        .into_iter()
        .map(|(rows, dst)| Mutex::new((rows, dst, init())))
        .collect();
    // Each block is taken by exactly one thread, so its lock is never contended;
    // the pool's own chunking is what makes a slow thread's share go to others.
    pool.execute_chunked(cells.len(), |range| {
        for cell in &cells[range] {
            let mut guard = cell.lock().unwrap_or_else(|e| e.into_inner());
            let (rows, dst, acc) = &mut *guard;
            each_row(rows.clone(), dst, acc, &f);
        }
    });
    cells
        .into_iter()
        .map(|cell| cell.into_inner().unwrap_or_else(|e| e.into_inner()).2)
        .collect()
}

/// `f(row, dst_row, acc)` for each row of a block, `dst` being the block's share.
fn each_row<T, S>(
    rows: Range<usize>,
    dst: &mut [T],
    acc: &mut S,
    f: &impl Fn(usize, &mut [T], &mut S),
) {
    // Indexed rather than `chunks_exact_mut`, which refuses rows of length 0.
    let row_len = dst.len().checked_div(rows.len()).unwrap_or(0);
    for (i, row) in rows.enumerate() {
        f(row, &mut dst[i * row_len..][..row_len], acc);
    }
}

/// `dst` (an equal share per row of `n_rows`, possibly empty) cut into at most
/// `blocks` runs of whole rows, each with its row range.
fn split_rows<T>(dst: &mut [T], n_rows: usize, blocks: usize) -> Vec<(Range<usize>, &mut [T])> {
    let row_len = dst.len().checked_div(n_rows).unwrap_or(0);
    let per_block = n_rows.div_ceil(blocks.max(1)).max(1);
    let mut parts = Vec::with_capacity(blocks);
    let (mut rest, mut start) = (dst, 0);
    while start < n_rows {
        let end = (start + per_block).min(n_rows);
        let (head, tail) = rest.split_at_mut((end - start) * row_len);
        parts.push((start..end, head));
        (rest, start) = (tail, end);
    }
    parts
}

/// [`reduce_rows`] without accumulators: `f(row, dst_row)` on each row.
pub(crate) fn for_rows<T: Send>(
    dst: &mut [T],
    n_rows: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    reduce_rows(dst, n_rows, work, || (), |row, dst, _| f(row, dst));
}

/// Row `row` of `values`, rows of `len`.
#[inline(always)]
pub(crate) fn row<T>(values: &[T], row: usize, len: usize) -> &[T] {
    &values[row * len..][..len]
}

/// A backward's output: `n_rows` rows of `row_len` (the per-row gradient), each
/// written by `f(row, dst_row, sums)`, then `sums_len` values that `f` adds to (the
/// parameters' gradients), summed over the blocks of rows and rounded to `T` once.
pub(crate) fn rows_then_sums<T: WithDType, A: Acc>(
    n_rows: usize,
    row_len: usize,
    sums_len: usize,
    work: usize,
    f: impl Fn(usize, &mut [T], &mut [A]) + Sync,
) -> Vec<T> {
    let mut out = vec![T::zero(); n_rows * row_len + sums_len];
    let (rows, sums) = out.split_at_mut(n_rows * row_len);
    let accs = reduce_rows(
        rows,
        n_rows,
        work,
        || vec![A::ZERO; sums_len],
        |row, dst, acc| f(row, dst, acc),
    );
    sums.copy_from_slice(&sum_accs::<T, A>(&accs, sums_len));
    out
}

/// `Σ term(a[i], b[i], c[i])` in eight interleaved partial sums, which the compiler
/// vectorises; one running sum (candle-nn's order, which the forward kernels keep
/// so that their values are candle-nn's) cannot be. For the backward kernels; pass
/// a slice twice where a term needs fewer than three.
#[inline(always)]
pub(crate) fn sum8<T: WithDType, A: Acc>(
    a: &[T],
    b: &[T],
    c: &[T],
    term: impl Fn(T, T, T) -> A,
) -> A {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
    let mut lanes = [A::ZERO; 8];
    let chunks = a
        .chunks_exact(8)
        .zip(b.chunks_exact(8))
        .zip(c.chunks_exact(8));
    for ((a, b), c) in chunks {
        for (lane, ((&a, &b), &c)) in lanes.iter_mut().zip(a.iter().zip(b).zip(c)) {
            *lane += term(a, b, c);
        }
    }
    let body = n - n % 8;
    let mut tail = A::ZERO;
    for ((&a, &b), &c) in a[body..].iter().zip(&b[body..]).zip(&c[body..]) {
        tail += term(a, b, c);
    }
    let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) + tail
}

/// The element-wise sum of `accs` (each `len` long), rounded to `T`.
fn sum_accs<T: WithDType, A: Acc>(accs: &[Vec<A>], len: usize) -> Vec<T> {
    (0..len)
        .map(|i| {
            let mut sum = A::ZERO;
            for acc in accs {
                sum += acc[i];
            }
            sum.to::<T>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{CpuStorage, Device, Result, Storage, Tensor};

    /// `values` rounded to the dtype of `like` by `Acc::to`, as f64.
    fn through_acc(like: &Tensor, values: &[f32]) -> Vec<f64> {
        fn conv<T: WithDType>(_: &[T], values: &[f32]) -> Vec<f64> {
            values.iter().map(|v| v.to::<T>().to_f64()).collect()
        }
        let (storage, _) = like.storage_and_layout();
        match &*storage {
            Storage::Cpu(CpuStorage::BF16(s)) => conv(s, values),
            Storage::Cpu(CpuStorage::F16(s)) => conv(s, values),
            _ => unreachable!("a bf16 or f16 tensor"),
        }
    }

    #[test]
    fn rows_split_into_whole_blocks() {
        let mut dst: Vec<u32> = (0..20).collect();
        let parts = split_rows(&mut dst, 10, 3);
        let ranges: Vec<_> = parts.iter().map(|(r, _)| r.clone()).collect();
        assert_eq!(ranges, [0..4, 4..8, 8..10]);
        assert_eq!(parts[2].1, &[16, 17, 18, 19]);
        let parts = split_rows(&mut [] as &mut [u32], 5, 2);
        let ranges: Vec<_> = parts.iter().map(|(r, d)| (r.clone(), d.len())).collect();
        assert_eq!(ranges, [(0..3, 0), (3..5, 0)]);
        assert!(split_rows(&mut dst, 0, 2).is_empty());
        assert_eq!(split_rows(&mut dst, 2, 7).len(), 2);
    }

    /// A reduction split over blocks sums what one block would.
    #[test]
    fn reduce_rows_covers_every_row_once() {
        let n_rows = 40_000;
        let mut dst = vec![0u64; n_rows];
        let accs = reduce_rows(
            &mut dst,
            n_rows,
            PAR_MIN_ELEMS,
            Vec::new,
            |row, dst, seen| {
                dst[0] = row as u64;
                seen.push(row);
            },
        );
        assert!(dst.iter().enumerate().all(|(i, d)| *d == i as u64));
        let mut seen: Vec<usize> = accs.into_iter().flatten().collect();
        seen.sort_unstable();
        assert!(seen.into_iter().eq(0..n_rows));
    }

    /// `Acc::to` must round as candle (`from_f32`) does, including the near-ties
    /// that half's f64 path rounds the other way without the sticky bit.
    #[test]
    fn f32_to_half_types_rounds_as_candle() -> Result<()> {
        let mut values = Vec::new();
        // Every pattern of the low 16 mantissa bits (all bf16 and f16 near-ties)
        // at a few exponents, then a sweep over all bit patterns.
        for high in [
            0x3f80_0000u32,
            0x4000_0000,
            0x3a00_0000,
            0x0000_0000,
            0x8080_0000,
        ] {
            for low in 0..0x1_0000u32 {
                values.push(f32::from_bits(high | low));
            }
        }
        for bits in (0..u32::MAX).step_by(9973) {
            values.push(f32::from_bits(bits));
        }
        values.retain(|v| !v.is_nan());
        let t = Tensor::new(values.as_slice(), &Device::Cpu)?;
        for dtype in [DType::BF16, DType::F16] {
            let rounded = t.to_dtype(dtype)?;
            let want = rounded.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            let got = through_acc(&rounded, &values);
            let bad = want
                .iter()
                .zip(&got)
                .filter(|(w, g)| w.to_bits() != g.to_bits());
            assert_eq!(bad.count(), 0, "{dtype:?}");
        }
        Ok(())
    }
}
