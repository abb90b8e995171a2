//! The packed attention's CPU bodies, the reference twins of
//! `kernels/attention.cu`: the same arithmetic (FlashAttention-2's, with the
//! per-row log-sum-exp kept from the forward) as plain loops over pairs, query
//! heads and query rows, on candle's CPU pool.

use candle_core::WithDType;

use super::layout::Geometry;
use crate::ops::cpu::{self, Acc};

/// The document ids `[b, t]` of a packed batch, if any.
#[derive(Clone, Copy, Debug)]
pub(super) struct Documents<'a> {
    pub(super) ids: Option<&'a [i64]>,
    pub(super) t: usize,
}

impl Documents<'_> {
    /// Whether positions `i` and `j` of row `row` lie in the same document.
    fn same(&self, row: usize, i: usize, j: usize) -> bool {
        self.ids
            .is_none_or(|ids| ids[row * self.t + i] == ids[row * self.t + j])
    }
}

/// The keys query `i` of row `row` attends, in order.
fn attended<'a>(
    geo: &Geometry,
    docs: Documents<'a>,
    row: usize,
    i: usize,
) -> impl Iterator<Item = usize> + 'a {
    geo.keys_of(i).filter(move |&j| docs.same(row, i, j))
}

#[inline(always)]
fn dot<T: WithDType, A: Acc>(a: &[T], b: &[T]) -> A {
    cpu::sum8(a, b, b, |a, b, _| A::of(a) * A::of(b))
}

/// `acc += c·x`.
#[inline(always)]
fn add_scaled<T: WithDType, A: Acc>(acc: &mut [A], c: A, x: &[T]) {
    for (acc, &x) in acc.iter_mut().zip(x) {
        *acc += c * A::of(x);
    }
}

/// The forward: the output `[kv, b, g·t, d]` and the log-sum-exp of each query
/// row's scores (`[kv, b, g·t]`), which the backward reads.
pub(super) fn forward<T: WithDType, A: Acc + WithDType>(
    geo: &Geometry,
    [q, k, v]: [&[T]; 3],
    docs: Documents<'_>,
) -> (Vec<T>, Vec<A>) {
    let Geometry { b, g, t, d, .. } = *geo;
    let scale = <A as WithDType>::from_f64(geo.scale);
    let rows = geo.pairs() * g * t;
    // Each row's output, then its log-sum-exp.
    let mut out = vec![A::ZERO; rows * (d + 1)];
    cpu::reduce_rows(
        &mut out,
        rows,
        rows * t * d,
        Vec::new,
        |row, out, scores| {
            let pair = row / (g * t);
            let (keys, values) = (cpu::row(k, pair, t * d), cpu::row(v, pair, t * d));
            let q = cpu::row(q, row, d);
            scores.clear();
            for j in attended(geo, docs, pair % b, row % t) {
                scores.push((j, scale * dot::<T, A>(q, cpu::row(keys, j, d))));
            }
            // The diagonal is always attended: the row has a score.
            let max = scores.iter().fold(scores[0].1, |m, &(_, s)| match s > m {
                true => s,
                false => m,
            });
            let (o, lse) = out.split_at_mut(d);
            let mut sum = A::ZERO;
            for &(j, s) in scores.iter() {
                let p = (s - max).exp();
                sum += p;
                add_scaled(o, p, cpu::row(values, j, d));
            }
            let inv = sum.recip();
            o.iter_mut().for_each(|o| *o *= inv);
            lse[0] = max + sum.ln();
        },
    );
    let y = out
        .chunks_exact(d + 1)
        .flat_map(|row| row[..d].iter().map(|o| o.to::<T>()))
        .collect();
    let lse = out.chunks_exact(d + 1).map(|row| row[d]).collect();
    (y, lse)
}

/// The backward: `[dq | dk | dv]`, each in its input's layout, from the inputs,
/// the forward's output `o` and log-sum-exp, and the output's gradient.
///
/// FlashAttention-2's arithmetic: `P = exp(s − lse)`, `D = Σ dO·O` per query row,
/// `dS = P∘(dO·vᵀ − D)`, `dq = scale·dS·K`, `dk = scale·dSᵀ·Q`, `dv = Pᵀ·dO`. One
/// pair per task: its query rows in order (head by head), so that every key's
/// gradient sums its queries in one fixed order.
pub(super) fn backward<T: WithDType, A: Acc + WithDType>(
    geo: &Geometry,
    [q, k, v, o, grad]: [&[T]; 5],
    lse: &[A],
    docs: Documents<'_>,
) -> Vec<T> {
    let Geometry { b, g, t, d, .. } = *geo;
    let (q_block, kv_block) = (g * t * d, t * d);
    let block = q_block + 2 * kv_block;
    let pairs = geo.pairs();
    let scale = <A as WithDType>::from_f64(geo.scale);
    // Per pair: dq, dk and dv, unscaled.
    let mut grads = vec![A::ZERO; pairs * block];
    let work = pairs * g * t * t * d;
    cpu::for_rows(&mut grads, pairs, work, |pair, grads| {
        let (dq, rest) = grads.split_at_mut(q_block);
        let (dk, dv) = rest.split_at_mut(kv_block);
        let (keys, values) = (cpu::row(k, pair, kv_block), cpu::row(v, pair, kv_block));
        for head_row in 0..g * t {
            let row = pair * g * t + head_row;
            let (q_i, do_i) = (cpu::row(q, row, d), cpu::row(grad, row, d));
            let delta: A = dot(do_i, cpu::row(o, row, d));
            let dq_i = &mut dq[head_row * d..][..d];
            for j in attended(geo, docs, pair % b, head_row % t) {
                let (k_j, v_j) = (cpu::row(keys, j, d), cpu::row(values, j, d));
                let p = (scale * dot::<T, A>(q_i, k_j) - lse[row]).exp();
                let ds = p * (dot::<T, A>(do_i, v_j) - delta);
                add_scaled(dq_i, ds, k_j);
                add_scaled(&mut dk[j * d..][..d], ds, q_i);
                add_scaled(&mut dv[j * d..][..d], p, do_i);
            }
        }
    });
    // Gathered per input: [dq of every pair | dk ... | dv ...].
    let parts = [
        (0, q_block, scale),
        (q_block, kv_block, scale),
        (q_block + kv_block, kv_block, A::from_f32(1.)),
    ];
    let mut out = Vec::with_capacity(geo.q_len() + 2 * geo.kv_len());
    for (start, len, factor) in parts {
        for pair in grads.chunks_exact(block.max(1)).take(pairs) {
            out.extend(pair[start..][..len].iter().map(|&x| (factor * x).to::<T>()));
        }
    }
    out
}
