//! What the fused CPU kernels share: the dtype dispatch, the type they compute in,
//! and a row-parallel loop on candle's CPU thread pool.

use std::ops::{Add, AddAssign, Div, Mul, Range, Sub};
use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Layout, Result, WithDType};

/// Below this many elements touched, a kernel runs on the calling thread: waking
/// the pool costs more than it saves.
const PAR_MIN_ELEMS: usize = 16 * 1024;

/// The type a kernel computes in: `f32` for bf16, f16 and f32 tensors (as
/// candle-nn's kernels do), `f64` for f64 tensors.
pub(super) trait Acc:
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

/// A fused CPU kernel, generic over the tensor type `T` and the type `A` it
/// computes in.
pub(super) trait Kernel {
    /// The output, from the contiguous inputs (all of one dtype) and the dims of
    /// the first.
    fn run<T: WithDType, A: Acc>(&self, inputs: &[&[T]], dims: &[usize]) -> Result<Vec<T>>;
}

/// Runs `kernel` on `inputs` after checking that they share one float dtype and are
/// contiguous; `name` prefixes the errors.
pub(super) fn dispatch<K: Kernel>(
    kernel: &K,
    name: &str,
    inputs: &[(&CpuStorage, &Layout)],
) -> Result<CpuStorage> {
    let (first, _) = inputs[0];
    match first {
        CpuStorage::BF16(s) => run::<_, f32, K>(kernel, name, s, inputs),
        CpuStorage::F16(s) => run::<_, f32, K>(kernel, name, s, inputs),
        CpuStorage::F32(s) => run::<_, f32, K>(kernel, name, s, inputs),
        CpuStorage::F64(s) => run::<_, f64, K>(kernel, name, s, inputs),
        other => bail!("{name}: unsupported dtype {:?}", other.dtype()),
    }
}

/// [`dispatch`] once `T` is known (`_first` only names it).
fn run<T: WithDType, A: Acc, K: Kernel>(
    kernel: &K,
    name: &str,
    _first: &[T],
    inputs: &[(&CpuStorage, &Layout)],
) -> Result<CpuStorage> {
    let mut slices = Vec::with_capacity(inputs.len());
    for (i, (storage, layout)) in inputs.iter().enumerate() {
        if storage.dtype() != T::DTYPE {
            bail!(
                "{name}: input {i} is {:?}, input 0 is {:?}",
                storage.dtype(),
                T::DTYPE
            )
        }
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("{name}: input {i} has to be contiguous")
        };
        slices.push(&T::cpu_storage_as_slice(storage)?[start..end]);
    }
    let dims = inputs[0].1.dims();
    Ok(T::to_cpu_storage_owned(kernel.run::<T, A>(&slices, dims)?))
}

/// Splits `n_rows` rows in blocks, one per thread of candle's CPU pool, and calls
/// `f(rows, dst_rows, acc)` on each, where `dst_rows` is the part of `dst` (an equal
/// share per row, possibly empty) those rows own and `acc` a fresh `init()` per
/// block. Returns the blocks' accumulators, in no particular order.
pub(super) fn reduce_rows<T: Send, S: Send>(
    dst: &mut [T],
    n_rows: usize,
    work: usize,
    init: impl Fn() -> S,
    f: impl Fn(Range<usize>, &mut [T], &mut S) + Sync,
) -> Vec<S> {
    let pool = candle_core::utils::barrier_pool();
    let blocks = if work < PAR_MIN_ELEMS {
        1
    } else {
        (pool.n_workers() + 1).min(n_rows)
    };
    if blocks <= 1 {
        let mut acc = init();
        f(0..n_rows, dst, &mut acc);
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
            f(rows.clone(), dst, acc);
        }
    });
    cells
        .into_iter()
        .map(|cell| cell.into_inner().unwrap_or_else(|e| e.into_inner()).2)
        .collect()
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

/// [`reduce_rows`] without accumulators.
pub(super) fn for_rows<T: Send>(
    dst: &mut [T],
    n_rows: usize,
    work: usize,
    f: impl Fn(Range<usize>, &mut [T]) + Sync,
) {
    reduce_rows(dst, n_rows, work, || (), |rows, dst, _| f(rows, dst));
}

/// `Σ term(a[i], b[i], c[i])` in eight interleaved partial sums, which the compiler
/// vectorises; one running sum (candle-nn's order, which the forward kernels keep
/// so that their values are candle-nn's) cannot be. For the backward kernels; pass
/// a slice twice where a term needs fewer than three.
#[inline(always)]
pub(super) fn sum8<T: WithDType, A: Acc>(
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
pub(super) fn sum_accs<T: WithDType, A: Acc>(accs: &[Vec<A>], len: usize) -> Vec<T> {
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
    use candle_core::{Device, Storage, Tensor};

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
            |rows, dst, seen| {
                for (row, d) in rows.zip(dst) {
                    *d = row as u64;
                    seen.push(row);
                }
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
