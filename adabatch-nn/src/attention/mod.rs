//! Attention over packed rows as one differentiable op:
//! `softmax(q·kᵀ·scale + bias)·v`, the bias that of [`attention_bias`] (query `i`
//! attends key `j` iff `j ≤ i`, `i − j < window`, and both lie in one document),
//! without the `t × t` scores in memory. [`packed_attention`] says its layout,
//! arithmetic and bodies.

use std::sync::Mutex;

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{
    CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Storage, Tensor, WithDType, bail,
};

use self::cpu::{self as attention_cpu, Documents};
use self::layout::Geometry;
use crate::ops::cpu::Acc;
use crate::ops::rows::{self, CpuBody, CpuInputs};
use crate::ops::softmax_last_dim;

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "kernels-on-cpu")]
mod harness;
pub(crate) mod layout;
mod packing;

pub use packing::{attention_bias, positions_in_documents};

const NAME: &str = "adabatch-packed-attention";

/// `softmax(q·kᵀ·scale + attention_bias(t, document_ids, window))·v` over packed
/// rows, differentiable in `q`, `k` and `v`: queries `[kv, b, g·t, d]`, keys and
/// values `[kv, b, t, d]`, `document_ids` `[b, t]` of any integer dtype (as
/// [`attention_bias`] takes them), `window` the sliding window (`None`: full
/// causal attention). Returns `[kv, b, g·t, d]`, of `q`'s dtype.
///
/// Errors: shapes that do not fit together, dtypes that differ or are not floats,
/// document ids of another shape or not integers, a window of 0 (no key at all),
/// and on CUDA heads wider than 256.
///
/// Layout, heads first: queries `[kv, b, g·t, d]`, keys and values `[kv, b, t, d]`,
/// output like the queries. The `g` query heads that share a key/value head are
/// stacked along time (query head `h = kv_head·g + i` of row `r` is
/// `q[kv_head, r, i·t..(i + 1)·t]`), so grouped-query attention reads each key and
/// value once, and neither repeats them `g` times nor sums their gradients back.
/// It is the layout of the [`Llama`](crate::models::llama::Llama)'s attention (whose
/// ropes want heads first, so that batch and time are adjacent: one table row per
/// token), which calls this op without a copy. Multi-head attention is `g = 1`:
/// from `[b, h, t, d]`, pass `x.transpose(0, 1)` (one copy) and transpose back.
///
/// Arithmetic: FlashAttention-2's. The forward keeps each query row's log-sum-exp
/// of its scores (in the op, beside the output: recomputing it in the backward
/// would cost a third pass over every score); the backward recomputes the
/// probabilities `P = exp(s − lse)` from it, with `D = Σ dO·O` per query row,
/// `dS = P∘(dO·vᵀ − D)`, `dq = scale·dS·K`, `dk = scale·dSᵀ·Q`, `dv = Pᵀ·dO`; a key's
/// gradients sum its queries (of all `g` heads) in one fixed order, without
/// atomics, so that a step's gradients are the same from run to run. bf16 and f16
/// inputs are computed in f32 (scores, softmax, sums), f64 in f64, f32 in f32.
///
/// Bodies: on CPU, loops over (pair, head, query row) on candle's thread pool
/// (`attention/cpu.rs`, the reference twin). With the `cuda` feature, kernels that
/// tile queries and keys through shared memory with an online softmax
/// (`kernels/attention.cu`), used only while
/// [`cuda_bodies_enabled`](crate::cuda_bodies_enabled) holds, like the other fused
/// ops' CUDA bodies; otherwise (and on other devices) the composite of candle ops
/// (matmul, [`attention_bias`], [`softmax_last_dim`], matmul), which candle
/// differentiates. The Llama uses this op where it runs fused on CUDA. On
/// CPU it keeps the composite: the fused body was faster at the example decoder's
/// packed rows (documents of about 35 of 128 positions: it skips the masked keys),
/// but slower on full causal rows of 64 (`benches/llama_compare.rs`'s models), where
/// candle's gemm beats its per-row loops (BENCHMARKS.md).
///
/// ```
/// # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
/// use adabatch::nn::packed_attention;
/// use candle_core::{Device, Tensor};
///
/// # fn main() -> candle_core::Result<()> {
/// // 2 key/value heads shared by 3 query heads each, 1 row of 5 tokens, heads of 8.
/// let (kv, b, g, t, d) = (2, 1, 3, 5, 8);
/// let q = Tensor::randn(0f32, 1.0, (kv, b, g * t, d), &Device::Cpu)?;
/// let k = Tensor::randn(0f32, 1.0, (kv, b, t, d), &Device::Cpu)?;
/// let v = Tensor::randn(0f32, 1.0, (kv, b, t, d), &Device::Cpu)?;
/// // Two documents packed in the row.
/// let documents = Tensor::new(&[[0u32, 0, 0, 1, 1]], &Device::Cpu)?;
/// let y = packed_attention(&q, &k, &v, Some(&documents), None, (d as f64).powf(-0.5))?;
/// assert_eq!(y.dims(), q.dims());
/// # Ok(()) }
/// ```
pub fn packed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    document_ids: Option<&Tensor>,
    window: Option<usize>,
    scale: f64,
) -> Result<Tensor> {
    let geo = geometry(q, k, v, document_ids, window, scale)?;
    if !runs_fused(q.device()) {
        let bias_dtype = match q.dtype() {
            DType::BF16 | DType::F16 => DType::F32,
            dtype => dtype,
        };
        let bias = attention_bias(geo.t, document_ids, window, bias_dtype, q.device())?;
        return composite(q, k, v, &tiled(&bias, geo.g)?, scale);
    }
    let ids = document_ids
        .map(|ids| ids.to_dtype(DType::I64)?.contiguous())
        .transpose()?;
    let op = AttentionOp {
        geo,
        ids,
        lse: Mutex::new(None),
    };
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// Whether [`packed_attention`] runs fused on `device`.
pub(crate) fn runs_fused(device: &Device) -> bool {
    rows::fused_on(device, true)
}

/// The composite: `softmax(q·kᵀ·scale + bias)·v` with `bias` `[1, b or 1, g·t, t]`
/// (each row's bias repeated for the `g` heads, [`tiled`]); the softmax in the
/// bias's dtype.
pub(crate) fn composite(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let mut scores = q.matmul(&k.t()?)?;
    if scale != 1.0 {
        scores = (scores * scale)?;
    }
    let scores = scores.to_dtype(bias.dtype())?.broadcast_add(bias)?;
    softmax_last_dim(&scores)?.to_dtype(v.dtype())?.matmul(v)
}

/// [`attention_bias`]'s `[b or 1, t, t]` as the composite adds it to scores of `g`
/// stacked heads: `[1, b or 1, g·t, t]`.
pub(crate) fn tiled(bias: &Tensor, g: usize) -> Result<Tensor> {
    let (rows, t, _) = bias.dims3()?;
    let tiled = bias.unsqueeze(1)?.broadcast_as((rows, g, t, t))?;
    tiled.reshape((1, rows, g * t, t))
}

/// The checks of [`packed_attention`]'s inputs, and their geometry.
fn geometry(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ids: Option<&Tensor>,
    window: Option<usize>,
    scale: f64,
) -> Result<Geometry> {
    let mismatch = || -> Result<Geometry> {
        bail!(
            "packed_attention: queries must be [kv, b, g·t, d] and keys and values [kv, b, t, d]; \
             got q {:?}, k {:?}, v {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    };
    let (Ok((kv, b, gt, d)), Ok((k_kv, k_b, t, k_d))) = (q.dims4(), k.dims4()) else {
        return mismatch();
    };
    let g = gt.checked_div(t).unwrap_or(0);
    if k.dims() != v.dims() || (k_kv, k_b, k_d) != (kv, b, d) || g * t != gt {
        return mismatch();
    }
    let dtype = q.dtype();
    if !dtype.is_float() || k.dtype() != dtype || v.dtype() != dtype {
        bail!(
            "packed_attention: q, k and v must share a float dtype; got {:?}, {:?}, {:?}",
            dtype,
            k.dtype(),
            v.dtype()
        )
    }
    if !q.device().same_device(k.device()) || !q.device().same_device(v.device()) {
        bail!("packed_attention: q, k and v must be on one device")
    }
    if let Some(ids) = ids {
        if ids.dims() != [b, t] || !ids.dtype().is_int() || !ids.device().same_device(q.device()) {
            bail!(
                "packed_attention: document ids must be integers [b, t] = [{b}, {t}] on the \
                 queries' device; got {:?} {:?}",
                ids.dtype(),
                ids.dims()
            )
        }
    }
    if window == Some(0) {
        bail!("packed_attention: a window of 0 leaves a query no key (the smallest is 1)")
    }
    Ok(Geometry {
        kv,
        b,
        g,
        t,
        d,
        window: window.map_or(t, |w| w.min(t)),
        scale,
    })
}

/// The fused forward: `q`, `k`, `v` -> the output; it keeps the rows'
/// log-sum-exp for its backward.
struct AttentionOp {
    geo: Geometry,
    /// `[b, t]` i64, contiguous.
    ids: Option<Tensor>,
    /// `[kv, b, g·t]` in the type the body computes in (f32, or f64), once the
    /// forward ran.
    lse: Mutex<Option<Tensor>>,
}

impl CustomOp3 for AttentionOp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ids = self.ids.as_ref().map(|ids| ids.storage_and_layout());
        let body = Forward {
            geo: &self.geo,
            inputs: &[(s1, l1), (s2, l2), (s3, l3)],
            docs: documents(&self.geo, ids.as_ref().map(|(s, l)| (&**s, *l)))?,
        };
        let (out, lse) = rows::on_cpu(NAME, s1, &body)?;
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(lse);
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let inputs = [(s1, l1), (s2, l2), (s3, l3)];
        let (out, lse) = self::cuda::forward(&self.geo, inputs, self.ids.as_ref())?;
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(lse);
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let lse = self.lse.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(lse) = lse else {
            bail!("{NAME}: the backward ran before the forward")
        };
        let op = AttentionBwd {
            geo: self.geo,
            ids: self.ids.clone(),
            out: out.contiguous()?,
            grad: grad.contiguous()?,
            lse,
        };
        let grads = q.apply_op3_no_bwd(k, v, &op)?;
        let (q_len, kv_len) = (self.geo.q_len(), self.geo.kv_len());
        let dq = grads.narrow(0, 0, q_len)?.reshape(q.shape())?;
        let dk = grads.narrow(0, q_len, kv_len)?.reshape(k.shape())?;
        let dv = grads
            .narrow(0, q_len + kv_len, kv_len)?
            .reshape(v.shape())?;
        let [dq, dk, dv] = rows::where_tracked([q, k, v], [dq, dk, dv]);
        Ok((dq, dk, dv))
    }
}

/// The forward's CPU body: the output's storage and the log-sum-exp.
struct Forward<'a> {
    geo: &'a Geometry,
    inputs: &'a [(&'a CpuStorage, &'a Layout)],
    docs: Documents<'a>,
}

impl CpuBody for Forward<'_> {
    type Output = (CpuStorage, Tensor);

    fn run<T: WithDType, A: Acc + WithDType>(&self) -> Result<Self::Output> {
        let floats = CpuInputs::<T>::new(NAME, self.inputs).floats::<3>()?;
        #[cfg(feature = "kernels-on-cpu")]
        let (y, lse) = if crate::cuda::harness::kernels_on_cpu() {
            harness::forward::<T, A>(self.geo, floats, self.docs.ids)?
        } else {
            attention_cpu::forward::<T, A>(self.geo, floats, self.docs)
        };
        #[cfg(not(feature = "kernels-on-cpu"))]
        let (y, lse) = attention_cpu::forward::<T, A>(self.geo, floats, self.docs);
        let geo = self.geo;
        let lse = Tensor::from_vec(lse, (geo.kv, geo.b, geo.g * geo.t), &Device::Cpu)?;
        Ok((T::to_cpu_storage_owned(y), lse))
    }
}

/// The fused backward: `q`, `k`, `v` (with the forward's output, its log-sum-exp
/// and the output's gradient) -> `[dq | dk | dv]`, flat.
struct AttentionBwd {
    geo: Geometry,
    ids: Option<Tensor>,
    out: Tensor,
    grad: Tensor,
    lse: Tensor,
}

impl CustomOp3 for AttentionBwd {
    fn name(&self) -> &'static str {
        "adabatch-packed-attention-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((out, out_l), (grad, grad_l)) = (
            self.out.storage_and_layout(),
            self.grad.storage_and_layout(),
        );
        let (lse, lse_l) = self.lse.storage_and_layout();
        let ids = self.ids.as_ref().map(|ids| ids.storage_and_layout());
        let body = Backward {
            geo: &self.geo,
            inputs: &[
                (s1, l1),
                (s2, l2),
                (s3, l3),
                (on_cpu(&out)?, out_l),
                (on_cpu(&grad)?, grad_l),
            ],
            lse: (on_cpu(&lse)?, lse_l),
            docs: documents(&self.geo, ids.as_ref().map(|(s, l)| (&**s, *l)))?,
        };
        let grads = rows::on_cpu(self.name(), s1, &body)?;
        let len = self.geo.q_len() + 2 * self.geo.kv_len();
        Ok((grads, Shape::from(len)))
    }

    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let inputs = [(s1, l1), (s2, l2), (s3, l3)];
        let saved = [&self.out, &self.grad, &self.lse];
        let grads = self::cuda::backward(&self.geo, inputs, saved, self.ids.as_ref())?;
        let len = self.geo.q_len() + 2 * self.geo.kv_len();
        Ok((grads, Shape::from(len)))
    }
}

/// The backward's CPU body: `[dq | dk | dv]`.
struct Backward<'a> {
    geo: &'a Geometry,
    /// q, k, v, the output and its gradient.
    inputs: &'a [(&'a CpuStorage, &'a Layout)],
    lse: (&'a CpuStorage, &'a Layout),
    docs: Documents<'a>,
}

impl CpuBody for Backward<'_> {
    type Output = CpuStorage;

    fn run<T: WithDType, A: Acc + WithDType>(&self) -> Result<CpuStorage> {
        let floats = CpuInputs::<T>::new(NAME, self.inputs).floats::<5>()?;
        let (lse, layout) = self.lse;
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("{NAME}: the kept log-sum-exp is not contiguous")
        };
        let lse = &A::cpu_storage_as_slice(lse)?[start..end];
        #[cfg(feature = "kernels-on-cpu")]
        let grads = if crate::cuda::harness::kernels_on_cpu() {
            harness::backward::<T, A>(self.geo, floats, lse, self.docs.ids)?
        } else {
            attention_cpu::backward::<T, A>(self.geo, floats, lse, self.docs)
        };
        #[cfg(not(feature = "kernels-on-cpu"))]
        let grads = attention_cpu::backward::<T, A>(self.geo, floats, lse, self.docs);
        Ok(T::to_cpu_storage_owned(grads))
    }
}

/// A kept tensor's CPU storage.
fn on_cpu(storage: &Storage) -> Result<&CpuStorage> {
    match storage {
        Storage::Cpu(storage) => Ok(storage),
        _ => bail!("{NAME}: a tensor its backward keeps is not on the CPU"),
    }
}

/// The document ids (contiguous i64 on the CPU), if any, as the CPU bodies read
/// them.
fn documents<'a>(geo: &Geometry, ids: Option<(&'a Storage, &Layout)>) -> Result<Documents<'a>> {
    let ids = match ids {
        None => None,
        Some((Storage::Cpu(CpuStorage::I64(ids)), layout)) => match layout.contiguous_offsets() {
            Some((start, end)) => Some(&ids[start..end]),
            None => bail!("{NAME}: the document ids are not contiguous"),
        },
        Some(_) => bail!("{NAME}: the document ids are not i64 on the CPU"),
    };
    Ok(Documents { ids, t: geo.t })
}

#[cfg(test)]
mod tests {
    use super::layout::{KERNELS, MAX_HEAD_DIM};
    use super::*;
    use crate::testing::{assert_close, grads, randn, values};
    use crate::{GradCheckOptions, check_gradients};
    use candle_core::Var;

    /// `(kv, b, g, t, d)`, each row's document ids (`None`: no documents), the
    /// window.
    type Case = (
        (usize, usize, usize, usize, usize),
        Option<Vec<Vec<u32>>>,
        Option<usize>,
    );

    /// Odd shapes: a single position; documents of one token; `t` a multiple of no
    /// tile (16, 32, 64); heads wider than a warp; `g = 1` and `g > 1`; windows;
    /// an id that comes back later in its row; rows long enough for the pool.
    fn cases() -> Vec<Case> {
        let runs = |lens: &[usize]| -> Vec<u32> {
            let ids = lens.iter().enumerate();
            ids.flat_map(|(id, &n)| std::iter::repeat_n(id as u32, n))
                .collect()
        };
        vec![
            ((1, 1, 1, 1, 3), None, None),
            (
                (2, 2, 1, 7, 5),
                Some(vec![vec![0, 0, 1, 1, 1, 2, 3], vec![5; 7]]),
                None,
            ),
            (
                (1, 2, 3, 9, 4),
                Some(vec![
                    vec![1, 1, 1, 2, 2, 2, 2, 3, 4],
                    vec![7, 8, 8, 8, 8, 8, 8, 8, 9],
                ]),
                Some(3),
            ),
            ((2, 1, 2, 37, 33), None, Some(10)),
            (
                (1, 2, 2, 70, 16),
                Some(vec![
                    runs(&[1, 30, 1, 38]),
                    (0..70).map(|i| (i % 3 == 0) as u32).collect(),
                ]),
                None,
            ),
        ]
    }

    fn ids_of(case: &Case) -> Option<Tensor> {
        let ((_, b, _, t, _), docs, _) = case;
        let docs = docs.as_ref()?;
        Some(Tensor::from_vec(docs.concat(), (*b, *t), &Device::Cpu).unwrap())
    }

    fn inputs(case: &Case, dtype: DType, seed: u64) -> Vec<Tensor> {
        let ((kv, b, g, t, d), _, _) = *case;
        vec![
            randn(&[kv, b, g * t, d], dtype, seed),
            randn(&[kv, b, t, d], dtype, seed + 1),
            randn(&[kv, b, t, d], dtype, seed + 2),
        ]
    }

    fn scale(case: &Case) -> f64 {
        (case.0.4 as f64).powf(-0.5)
    }

    /// The composite, in f64 (or f32 for the half types' inputs, upcast).
    fn reference(case: &Case, x: &[Tensor]) -> Result<Tensor> {
        let ((_, _, g, t, _), _, window) = case;
        let ids = ids_of(case);
        let bias = attention_bias(*t, ids.as_ref(), *window, x[0].dtype(), &Device::Cpu)?;
        composite(&x[0], &x[1], &x[2], &tiled(&bias, *g)?, scale(case))
    }

    fn fused(case: &Case, x: &[Tensor]) -> Result<Tensor> {
        let ids = ids_of(case);
        packed_attention(&x[0], &x[1], &x[2], ids.as_ref(), case.2, scale(case))
    }

    /// Relative tolerances of the output and of the gradients per dtype: the half
    /// types against the f32 composite of the same (rounded) inputs.
    fn tolerances(dtype: DType) -> (f64, f64) {
        match dtype {
            DType::F64 => (1e-14, 1e-13),
            DType::F32 => (1e-6, 4e-6),
            DType::F16 => (1e-3, 2e-3),
            _ => (6e-3, 1.2e-2),
        }
    }

    #[test]
    fn values_and_gradients_equal_the_composite() -> Result<()> {
        for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16] {
            let (tol_y, tol_grad) = tolerances(dtype);
            let wide = match dtype {
                DType::F64 => DType::F64,
                _ => DType::F32,
            };
            for (i, case) in cases().iter().enumerate() {
                let what = format!("{dtype:?} case {i} {:?}", case.0);
                let x = inputs(case, dtype, 10 * i as u64);
                let x_wide = x
                    .iter()
                    .map(|x| x.to_dtype(wide))
                    .collect::<Result<Vec<_>>>()?;
                let y = fused(case, &x)?;
                assert_eq!(y.dtype(), dtype, "{what}");
                assert_close(&y, &reference(case, &x_wide)?, tol_y, &what);
                let got = grads(&|x| fused(case, x), &x, 5)?;
                let want = grads(&|x| reference(case, x), &x_wide, 5)?;
                for (name, (got, want)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                    assert_eq!(got.dtype(), dtype, "{what} {name}");
                    // One key per query (the first case): dq and dk are zeros.
                    if values(want).iter().all(|w| *w == 0.) {
                        assert!(values(got).iter().all(|g| *g == 0.), "{what} {name}");
                        continue;
                    }
                    assert_close(got, want, tol_grad, &format!("{what} {name}"));
                }
            }
        }
        Ok(())
    }

    /// Every entry point the CUDA launcher names is defined in every dtype and
    /// for every head width up to the widest: a misspelt name would fail only on
    /// a GPU.
    #[test]
    fn every_cuda_kernel_is_defined() {
        let source = include_str!("../../kernels/attention.cu");
        let mut needles: Vec<String> = KERNELS
            .iter()
            .map(|kernel| format!("ATTENTION_WIDTHS({kernel}, SUFFIX, T)"))
            .collect();
        let widths = (1..=MAX_HEAD_DIM).map(|d| Geometry { d, ..geo() }.chunks());
        let widths: std::collections::BTreeSet<usize> = widths.collect();
        assert_eq!(widths.iter().copied().collect::<Vec<_>>(), [1, 2, 4, 8]);
        needles.extend(
            widths
                .iter()
                .map(|c| format!("ATTENTION_ENTRY(NAME, {c}, SUFFIX, T)")),
        );
        needles.extend(rows::DTYPE_INSTANCES.map(|i| format!("ATTENTION_KERNELS{i}")));
        rows::assert_defines("attention.cu", source, &needles);
    }

    fn geo() -> Geometry {
        Geometry {
            kv: 1,
            b: 1,
            g: 1,
            t: 1,
            d: 1,
            window: 1,
            scale: 1.0,
        }
    }

    #[test]
    fn gradients_equal_finite_differences() -> Result<()> {
        let case: Case = ((1, 1, 2, 5, 3), Some(vec![vec![0, 0, 1, 1, 1]]), Some(2));
        let x = inputs(&case, DType::F64, 3);
        let vars: Vec<(String, Var)> = ["q", "k", "v"]
            .iter()
            .zip(&x)
            .map(|(name, x)| Ok((name.to_string(), Var::from_tensor(x)?)))
            .collect::<Result<_>>()?;
        let w = randn(x[0].dims(), DType::F64, 4);
        let loss = || {
            let x: Vec<Tensor> = vars.iter().map(|(_, v)| v.as_tensor().clone()).collect();
            (fused(&case, &x)? * &w)?.sum_all()
        };
        let report = check_gradients(&vars, loss, &GradCheckOptions::default())?;
        assert!(report.passed(), "{report}");
        Ok(())
    }

    #[test]
    fn only_the_inputs_that_need_one_get_a_gradient() -> Result<()> {
        let case: Case = ((1, 1, 1, 4, 2), None, None);
        let x = inputs(&case, DType::F32, 1);
        let q = Var::from_tensor(&x[0])?;
        let y = packed_attention(q.as_tensor(), &x[1], &x[2], None, None, 1.0)?;
        let grads = y.sum_all()?.backward()?;
        assert!(grads.get(q.as_tensor()).is_some());
        assert!(grads.get(&x[1]).is_none() && grads.get(&x[2]).is_none());
        Ok(())
    }

    #[test]
    fn inputs_that_do_not_fit_are_errors() {
        let t = |dims: &[usize], dtype: DType| Tensor::zeros(dims, dtype, &Device::Cpu).unwrap();
        let f32s = |dims: &[usize]| t(dims, DType::F32);
        let (q, kv) = (f32s(&[2, 1, 6, 4]), f32s(&[2, 1, 3, 4]));
        let err = |q: &Tensor, k: &Tensor, v: &Tensor, ids: Option<&Tensor>, w: Option<usize>| {
            packed_attention(q, k, v, ids, w, 1.0)
                .unwrap_err()
                .to_string()
        };
        let shapes = "queries must be [kv, b, g·t, d]";
        assert!(err(&q, &kv, &f32s(&[2, 1, 4, 4]), None, None).contains(shapes));
        assert!(err(&f32s(&[2, 1, 7, 4]), &kv, &kv, None, None).contains(shapes));
        assert!(err(&f32s(&[2, 1, 6, 5]), &kv, &kv, None, None).contains(shapes));
        assert!(err(&f32s(&[1, 1, 6, 4]), &kv, &kv, None, None).contains(shapes));
        assert!(err(&f32s(&[6, 4]), &kv, &kv, None, None).contains(shapes));
        let f64_kv = t(&[2, 1, 3, 4], DType::F64);
        assert!(err(&q, &f64_kv, &kv, None, None).contains("share a float dtype"));
        let ids = t(&[1, 4], DType::U32);
        assert!(err(&q, &kv, &kv, Some(&ids), None).contains("document ids"));
        let ids = t(&[1, 3], DType::F32);
        assert!(err(&q, &kv, &kv, Some(&ids), None).contains("document ids"));
        assert!(err(&q, &kv, &kv, None, Some(0)).contains("window of 0"));
        assert!(
            packed_attention(&q, &kv, &kv, Some(&t(&[1, 3], DType::I64)), Some(1), 1.0).is_ok()
        );
    }
}
