//! Every CUDA body of `kernels/*.cu`, run on the CPU through the kernels' harness,
//! against its CPU twin: the ops' own entry points, once with their CPU bodies and
//! once inside [`with_kernels_on_cpu`], forward values and the gradients of every
//! input, in every dtype a kernel is built for (feature `kernels-on-cpu`;
//! `scripts/kernels-on-cpu.sh` runs them, plain and under the sanitizers).
//!
//! Tolerances: the harness computes with the host's `expf`/`logf`/`sqrtf` and no
//! fused multiply-add, as the twins do, so what differs is the order of the sums
//! (block and warp reductions against the twins' loops) and, in f16 and bf16, the
//! one rounding of each output that such a difference can flip: two units in the
//! last place of the largest value for a forward. A gradient is computed from the
//! forward's own outputs, which differ by those roundings, so in f16 and bf16 it
//! gets eight units (f32 and f64 carry the precision of every check). An output
//! that is zero in the reference (a one-position attention's dq) is measured
//! against the check's largest value. AdamW is `_rn` arithmetic only: bit-equal.

use candle_core::{DType, Device, Result, Tensor};

use crate::cuda::harness::{kernel_names, with_kernels_on_cpu};
use crate::cuda::kernel::Pass;
use crate::ops::cross_entropy_rows_unwidened;
use crate::testing::{grads, randn, values};
use crate::{
    AdamWStep, cross_entropy_rows, layer_norm, packed_attention, rms_norm, rope, rope_i, rope_thd,
    softmax_last_dim,
};

const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The dtypes a check runs in: all four, or with `ADABATCH_KERNELS_DTYPES=wide`
/// (the sanitizer runs, whose findings do not depend on the element type) f32 and
/// f64, which between them take both tile sizes of the attention kernels.
fn dtypes() -> Vec<DType> {
    match std::env::var("ADABATCH_KERNELS_DTYPES").as_deref() {
        Ok("wide") => vec![DType::F32, DType::F64],
        _ => DTYPES.to_vec(),
    }
}

/// Relative to the largest value: the reductions' reordering over rows of up to a
/// few thousand in f32 and f64; units in the last place in f16 and bf16, two for
/// a forward's output, eight for a gradient.
fn tolerance(dtype: DType, gradient: bool) -> f64 {
    let units = if gradient { 8.0 } else { 2.0 };
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => units * 2f64.powi(-10),
        _ => units * 2f64.powi(-7),
    }
}

type Op<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor>;

/// The op's output and the gradients of every input (of a seeded weighted sum).
fn outputs(f: Op<'_>, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut all = vec![f(inputs)?];
    all.extend(grads(f, inputs, 99)?);
    Ok(all)
}

/// The CUDA bodies' outputs and gradients through the harness against the CPU
/// twins'.
fn check(what: &str, f: Op<'_>, inputs: &[Tensor]) -> Result<()> {
    check_against(what, f, inputs, None)
}

/// [`check`], the twins run in `reference` (then rounded to the inputs' dtype)
/// where given.
fn check_against(what: &str, f: Op<'_>, inputs: &[Tensor], reference: Option<DType>) -> Result<()> {
    let want = match reference {
        None => outputs(f, inputs)?,
        Some(dtype) => {
            let wide = inputs
                .iter()
                .map(|x| x.to_dtype(dtype))
                .collect::<Result<Vec<_>>>()?;
            let narrow = inputs[0].dtype();
            outputs(f, &wide)?
                .iter()
                .map(|t| t.to_dtype(narrow))
                .collect::<Result<_>>()?
        }
    };
    let got = with_kernels_on_cpu(|| outputs(f, inputs))?;
    let dtype = inputs[0].dtype();
    let largest = want
        .iter()
        .map(|w| largest(&values(w)))
        .fold(0f64, f64::max);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        let part = if i == 0 {
            "y".into()
        } else {
            format!("d{}", i - 1)
        };
        let tol = tolerance(dtype, i > 0);
        assert_matches(
            got,
            want,
            tol,
            largest,
            &format!("{what} {dtype:?}: {part}"),
        );
    }
    Ok(())
}

/// The largest finite magnitude.
fn largest(values: &[f64]) -> f64 {
    values
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()))
}

/// Same shape and dtype, NaNs at the same places, the rest within `tol` of the
/// largest reference value (of `fallback` where the reference is all zeros).
fn assert_matches(got: &Tensor, want: &Tensor, tol: f64, fallback: f64, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (got, want) = (values(got), values(want));
    let own = largest(&want);
    let scale = if own > 0.0 { own } else { fallback };
    let mut worst = (0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.is_nan(),
            w.is_nan(),
            "{what}: NaN at {i} on one side only ({g} vs {w})"
        );
        if w.is_nan() {
            continue;
        }
        let diff = if g == w { 0.0 } else { (g - w).abs() };
        if diff > worst.0 {
            worst = (diff, i);
        }
    }
    let (diff, at) = worst;
    assert!(
        diff <= tol * scale,
        "{what}: |got − want| = {diff:e} at {at} ({} vs {}), over {tol:e} of the largest value {scale:e}",
        got[at],
        want[at]
    );
}

/// Rows of one element, odd rows, a row longer than a block of 1,024 threads (and
/// columns over several column blocks), many rows.
const ROW_SHAPES: &[&[usize]] = &[&[1, 1], &[7], &[3, 5, 17], &[2, 1500], &[40, 33]];

/// `x` of `dims` (its rows' scale growing with the seed), rows `nan_row` of it NaN.
fn rows_input(dims: &[usize], dtype: DType, seed: u64, nan_row: Option<usize>) -> Result<Tensor> {
    let x = ((randn(dims, DType::F64, seed) * (1.0 + seed as f64))? + 0.5)?;
    let Some(row) = nan_row else {
        return x.to_dtype(dtype);
    };
    let n = *dims.last().unwrap_or(&1);
    let mut flat = values(&x);
    flat[row * n] = f64::NAN;
    Tensor::from_vec(flat, dims, &Device::Cpu)?.to_dtype(dtype)
}

fn params(n: usize, count: usize, dtype: DType, seed: u64) -> Result<Vec<Tensor>> {
    (0..count)
        .map(|i| (randn(&[n], DType::F64, seed * 10 + i as u64) + 1.0)?.to_dtype(dtype))
        .collect()
}

/// The norms and the softmax, every dtype and shape, and a NaN row.
#[test]
fn row_ops_match_their_twins() -> Result<()> {
    type RowOp = fn(&[Tensor]) -> Result<Tensor>;
    let ops: [(&str, usize, RowOp); 3] = [
        ("rms_norm", 1, |x| rms_norm(&x[0], &x[1], 1e-5)),
        ("layer_norm", 2, |x| layer_norm(&x[0], &x[1], &x[2], 1e-5)),
        ("softmax_last_dim", 0, |x| softmax_last_dim(&x[0])),
    ];
    for (name, param_count, op) in ops {
        for dtype in dtypes() {
            for (seed, dims) in ROW_SHAPES.iter().enumerate() {
                let n = *dims.last().unwrap_or(&1);
                let rows = dims.iter().product::<usize>() / n;
                // A NaN row among several: the others stay exact.
                let nan_row = (rows > 2).then_some(1);
                let mut inputs = vec![rows_input(dims, dtype, seed as u64, nan_row)?];
                inputs.extend(params(n, param_count, dtype, seed as u64)?);
                // candle-nn's CPU softmax, which the twin follows bit for bit, sums in
                // f16 and bf16 themselves; the kernel (as candle's CUDA softmax) sums in
                // f32, which is its reference there.
                let half = matches!(dtype, DType::F16 | DType::BF16);
                let reference = (name == "softmax_last_dim" && half).then_some(DType::F32);
                check_against(&format!("{name} {dims:?}"), &op, &inputs, reference)?;
            }
        }
    }
    Ok(())
}

/// Losses and `d logits`: one class, a vocabulary longer than a block, ignored
/// rows, a NaN row; a target outside the classes is NaN through the kernel (the
/// twin refuses it).
#[test]
fn cross_entropy_matches_its_twin() -> Result<()> {
    for dtype in dtypes() {
        for (seed, &(rows, classes)) in [(1, 1), (9, 17), (5, 1500)].iter().enumerate() {
            let nan_row = (rows > 2).then_some(2);
            let logits = rows_input(&[rows, classes], dtype, seed as u64, nan_row)?;
            let targets: Vec<i64> = (0..rows)
                .map(|i| {
                    if i % 4 == 3 {
                        -100
                    } else {
                        ((i * 7 + 3) % classes) as i64
                    }
                })
                .collect();
            let targets = Tensor::new(targets, &Device::Cpu)?;
            let op = |x: &[Tensor]| cross_entropy_rows(&x[0], &targets, Some(-100));
            let what = format!("cross_entropy_rows ({rows}, {classes})");
            check(&what, &op, std::slice::from_ref(&logits))?;
            // The public op widens halves to f32: its f16 and bf16 kernels run here.
            let op = |x: &[Tensor]| cross_entropy_rows_unwidened(&x[0], &targets, Some(-100));
            check(
                &format!("cross-entropy kernel ({rows}, {classes})"),
                &op,
                &[logits],
            )?;
        }
        let logits = rows_input(&[2, 5], dtype, 7, None)?;
        let outside = Tensor::new(&[1i64, 5], &Device::Cpu)?;
        assert!(cross_entropy_rows(&logits, &outside, None).is_err());
        let loss = with_kernels_on_cpu(|| cross_entropy_rows(&logits, &outside, None))?;
        let loss = values(&loss);
        assert!(
            loss[0].is_finite() && loss[1].is_nan(),
            "{dtype:?}: {loss:?}"
        );
    }
    Ok(())
}

/// The three ropes, tables shared or per sequence: y and the gradients of x and
/// of both tables, at odd sizes, one position, pairs of one, heads of 66.
#[test]
fn ropes_match_their_twins() -> Result<()> {
    type Rope = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;
    let ropes: [(&str, Rope, bool); 3] = [
        ("rope", rope, false),
        ("rope_i", rope_i, false),
        ("rope_thd", rope_thd, true),
    ];
    for dtype in dtypes() {
        for (seed, &(b, h, t, d)) in [(2, 3, 5, 8), (1, 2, 1, 6), (3, 1, 7, 2), (2, 2, 3, 66)]
            .iter()
            .enumerate()
        {
            for batched in [false, true] {
                let table: Vec<usize> = if batched {
                    vec![b, t, d / 2]
                } else {
                    vec![t, d / 2]
                };
                let angles = randn(&table, DType::F64, seed as u64 + 40);
                let (cos, sin) = (
                    angles.cos()?.to_dtype(dtype)?,
                    angles.sin()?.to_dtype(dtype)?,
                );
                for (name, op, thd) in ropes {
                    let dims = if thd { [b, t, h, d] } else { [b, h, t, d] };
                    let x = randn(&dims, dtype, seed as u64);
                    let f = |x: &[Tensor]| op(&x[0], &x[1], &x[2]);
                    let what = format!("{name} {dims:?} batched={batched}");
                    check(&what, &f, &[x, cos.clone(), sin.clone()])?;
                }
            }
        }
    }
    Ok(())
}

/// `(kv, b, g, t, d, documents, window)`: one position; `t` and `d` that no tile
/// divides; several key tiles with grouped heads and a window; heads of 128, 200
/// and 256 (every width C of the kernels); documents of one token.
type AttentionCase = (usize, usize, usize, usize, usize, bool, Option<usize>);
const ATTENTION_CASES: &[AttentionCase] = &[
    (1, 1, 1, 1, 8, false, None),
    (2, 2, 1, 37, 33, true, None),
    (1, 2, 3, 70, 64, true, Some(17)),
    (1, 1, 2, 45, 128, true, None),
    (1, 1, 2, 40, 200, false, Some(9)),
    (1, 1, 1, 33, 256, true, None),
];

/// Document ids `[b, t]`: runs of 1, 5, 23, 1 and 40 tokens, shifted per row.
fn documents(b: usize, t: usize) -> Result<Tensor> {
    let lengths = [1, 5, 23, 1, 40];
    let mut ids = Vec::with_capacity(b * t);
    for row in 0..b {
        let (mut id, mut left, mut next) = (0u32, 0usize, row);
        for _ in 0..t {
            if left == 0 {
                (id, left, next) = (id + 1, lengths[next % lengths.len()], next + 1);
            }
            ids.push(id);
            left -= 1;
        }
    }
    Tensor::from_vec(ids, (b, t), &Device::Cpu)
}

/// The forward and the backward's two kernels, every width and dtype.
#[test]
fn packed_attention_matches_its_twin() -> Result<()> {
    for dtype in dtypes() {
        for (seed, &(kv, b, g, t, d, docs, window)) in ATTENTION_CASES.iter().enumerate() {
            let spread = 1.0 + 0.25 * seed as f64;
            let inputs = [[kv, b, g * t, d], [kv, b, t, d], [kv, b, t, d]]
                .iter()
                .enumerate()
                .map(|(i, dims)| {
                    (randn(dims, DType::F64, 10 * seed as u64 + i as u64) * spread)?.to_dtype(dtype)
                })
                .collect::<Result<Vec<_>>>()?;
            let ids = docs.then(|| documents(b, t)).transpose()?;
            let scale = (d as f64).powf(-0.5);
            let f =
                |x: &[Tensor]| packed_attention(&x[0], &x[1], &x[2], ids.as_ref(), window, scale);
            check(
                &format!("packed_attention {:?}", (kv, b, g, t, d, docs, window)),
                &f,
                &inputs,
            )?;
        }
    }
    Ok(())
}

/// A NaN in one query row stays in that row of the output, as in the twin.
/// (Its gradients do not stay: the kernels multiply a masked pair's zero
/// coefficient by the row's NaN inside a tile of 32, as the composite's matmuls
/// do, where the twin skips masked pairs; a NaN loss stops the step either way.)
#[test]
fn packed_attention_keeps_a_nan_query_row_to_itself() -> Result<()> {
    let (kv, b, g, t, d) = (1, 2, 2, 40, 33);
    for dtype in dtypes() {
        let mut q = values(&randn(&[kv, b, g * t, d], DType::F64, 3));
        q[(g * t + 7) * d + 4] = f64::NAN;
        let q = Tensor::from_vec(q, (kv, b, g * t, d), &Device::Cpu)?.to_dtype(dtype)?;
        let k = randn(&[kv, b, t, d], dtype, 4);
        let v = randn(&[kv, b, t, d], dtype, 5);
        let ids = documents(b, t)?;
        let f = || packed_attention(&q, &k, &v, Some(&ids), Some(9), 0.2);
        let (want, got) = (f()?, with_kernels_on_cpu(f)?);
        let what = format!("packed_attention with a NaN query row {dtype:?}");
        assert_matches(&got, &want, tolerance(dtype, false), 1.0, &what);
        let nan_rows = values(&want)
            .chunks(d)
            .filter(|row| row.iter().any(|x| x.is_nan()))
            .count();
        assert_eq!(nan_rows, 1, "{what}");
    }
    Ok(())
}

/// A head wider than the kernels take is an error through the harness, as on a
/// GPU (the CPU twin takes any width).
#[test]
fn packed_attention_refuses_heads_past_256() -> Result<()> {
    let q = randn(&[1, 1, 2, 264], DType::F32, 1);
    assert!(packed_attention(&q, &q, &q, None, None, 0.1).is_ok());
    let err = with_kernels_on_cpu(|| packed_attention(&q, &q, &q, None, None, 0.1));
    assert!(err.is_err_and(|e| e.to_string().contains("exceed")));
    Ok(())
}

/// AdamW's kernel gives the twin's bits, with decay and without, over sizes of
/// one element, a partial block and many blocks, step after step.
#[test]
fn adamw_matches_its_twin_bit_for_bit() -> Result<()> {
    for (seed, n) in [1usize, 7, 300 * 257].into_iter().enumerate() {
        let start = |i: u64| values(&randn(&[n], DType::F32, 100 * seed as u64 + i));
        let mut twin = [start(0), vec![0.0; n], vec![0.0; n]]
            .map(|v| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>());
        let mut kernel = twin.clone();
        for t in 1..=3 {
            let grad: Vec<f32> = start(t).into_iter().map(|x| x as f32).collect();
            let step = step_at(t as i32, 0.01, 0.1);
            let step = if t == 2 { step.without_decay() } else { step };
            let [theta, m, v] = &mut twin;
            step.apply(theta, &grad, m, v)?;
            let [theta, m, v] = &mut kernel;
            with_kernels_on_cpu(|| step.apply(theta, &grad, m, v))?;
            assert_same_bits(&kernel, &twin, &format!("adamw n={n} step {t}"));
        }
    }
    Ok(())
}

/// The kernel's grid-stride loop: fewer blocks than elements (a launch caps its
/// grid at 65,535 blocks) still updates every element once.
#[test]
fn adamw_strides_past_its_grid() -> Result<()> {
    let n = 3 * 256 + 17;
    let start: Vec<f32> = values(&randn(&[n], DType::F32, 5))
        .into_iter()
        .map(|x| x as f32)
        .collect();
    let grad: Vec<f32> = values(&randn(&[n], DType::F32, 6))
        .into_iter()
        .map(|x| x as f32)
        .collect();
    let step = step_at(1, 0.01, 0.1);
    let mut twin = [start.clone(), vec![0.0; n], vec![0.0; n]];
    let [theta, m, v] = &mut twin;
    step.apply(theta, &grad, m, v)?;
    let mut kernel = [start, vec![0.0; n], vec![0.0; n]];
    let pass = Pass {
        grid: (2, 1, 1),
        ..AdamWStep::pass(n)
    };
    let [theta, m, v] = &mut kernel;
    step.apply_through_harness(&pass, theta, &grad, m, v)?;
    assert_same_bits(&kernel, &twin, "adamw over 2 blocks");
    Ok(())
}

/// The parameter and both moments, bit for bit.
fn assert_same_bits(got: &[Vec<f32>; 3], want: &[Vec<f32>; 3], what: &str) {
    for (which, (got, want)) in ["theta", "m", "v"].iter().zip(got.iter().zip(want)) {
        let differ = got
            .iter()
            .zip(want)
            .position(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(differ, None, "{what}: {which} differs");
    }
}

/// AdamW's constants at step `t`, as the engine computes them.
fn step_at(t: i32, lr: f64, decay: f64) -> AdamWStep {
    let (beta1, beta2) = (0.9f64, 0.999f64);
    AdamWStep {
        lr: lr as f32,
        beta1: beta1 as f32,
        beta2: beta2 as f32,
        one_minus_beta1: (1.0 - beta1) as f32,
        one_minus_beta2: (1.0 - beta2) as f32,
        keep: (1.0 - lr * decay) as f32,
        eps: 1e-8,
        scale_m: (1.0 / (1.0 - beta1.powi(t))) as f32,
        scale_v: (1.0 / (1.0 - beta2.powi(t))) as f32,
    }
}

/// Every entry point a launcher names is one the harness compiled: 12 row kernels
/// and 3 attention kernels in four widths, in four dtypes, and AdamW in f32.
#[test]
fn the_harness_holds_every_entry_point_the_launchers_name() {
    let names = kernel_names();
    let mut wanted = vec!["adabatch_adamw_f32".to_string()];
    let rows = [
        "rms_norm",
        "rms_norm_bwd",
        "rms_norm_bwd_cols",
        "layer_norm",
        "layer_norm_bwd",
        "layer_norm_bwd_cols",
        "softmax",
        "softmax_bwd",
        "cross_entropy",
        "cross_entropy_bwd",
        "rope",
        "rope_table_bwd",
    ];
    for dtype in DTYPES.map(|d| d.as_str()) {
        wanted.extend(rows.iter().map(|k| format!("adabatch_{k}_{dtype}")));
        for kernel in crate::attention::layout::KERNELS {
            wanted.extend([1, 2, 4, 8].map(|c| format!("adabatch_{kernel}_c{c}_{dtype}")));
        }
    }
    for name in &wanted {
        assert!(names.contains(name), "the harness has no {name}");
    }
    assert_eq!(names.len(), wanted.len(), "{names:?}");
}
