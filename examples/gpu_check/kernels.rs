//! `gpu_check kernels`: every fused op with a CUDA body (`adabatch-nn/kernels/`)
//! against its CPU twin, the reference: forward values and the gradients of every
//! input, in each dtype, on odd shapes (rows of one element, rows longer than a
//! block of threads, a single row; for the attention, rows that no tile size
//! divides, documents of one token, windows, grouped heads and heads of up to
//! 256); then, after a warm-up, forward + backward times of the fused CUDA body
//! against the composite of candle ops it replaces.

use std::time::Instant;

use adabatch::nn::{
    cross_entropy_rows, layer_norm, packed_attention, rms_norm, rope, rope_i, rope_thd,
    set_cuda_bodies, softmax_last_dim,
};
use adabatch::{AdamW, ParamsAdamW, TrainOptimizer};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Optimizer;
use clap::Args;
use serde_json::json;

use super::{emit, parse_device, AnyResult};

#[derive(Args)]
pub struct KernelsOpts {
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Timed rounds of each op, after one warm-up round.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
}

/// The checked shapes: the last dim is the row.
const SHAPES: &[&[usize]] = &[
    &[1, 1],
    &[7],
    &[3, 5, 17],
    &[2, 9, 1000],
    &[4, 4097],
    &[64, 33],
];

/// `(rows, classes)` of the cross-entropy's checks: one class, a vocabulary longer
/// than a block, the language model's.
const CROSS_ENTROPY_SHAPES: &[(usize, usize)] = &[(1, 1), (9, 17), (5, 5000), (256, 4096)];

/// `(b, h, t, d)` of the ropes' checks: odd sizes, one position, pairs of one, the
/// decoder's heads.
const ROPE_SIZES: &[(usize, usize, usize, usize)] =
    &[(2, 3, 5, 8), (1, 2, 1, 6), (3, 1, 7, 2), (2, 8, 40, 64)];

/// `(kv, b, g, t, d, documents, window)` of the attention's checks: one position;
/// `t` and `d` that no tile divides; several key tiles with grouped heads and a
/// window; rows of 300 and 512; heads of 128, 200 and 256.
type AttentionCase = (usize, usize, usize, usize, usize, bool, Option<usize>);
const ATTENTION_CASES: &[AttentionCase] = &[
    (1, 1, 1, 1, 8, false, None),
    (2, 2, 1, 37, 33, true, None),
    (2, 3, 3, 129, 64, true, Some(17)),
    (1, 2, 2, 300, 128, true, None),
    (2, 1, 4, 70, 200, false, Some(31)),
    (1, 2, 1, 512, 96, true, Some(64)),
    (1, 1, 2, 65, 256, true, None),
];

/// An op under test: its name, how many `[n]` parameters it takes, and itself.
struct Op {
    name: &'static str,
    params: usize,
    run: fn(&Tensor, &[Tensor]) -> candle_core::Result<Tensor>,
}

const OPS: &[Op] = &[
    Op {
        name: "rms_norm",
        params: 1,
        run: |x, p| rms_norm(x, &p[0], 1e-5),
    },
    Op {
        name: "layer_norm",
        params: 2,
        run: |x, p| layer_norm(x, &p[0], &p[1], 1e-5),
    },
    Op {
        name: "softmax_last_dim",
        params: 0,
        run: |x, _| softmax_last_dim(x),
    },
];

pub fn run(opts: &KernelsOpts) -> AnyResult<bool> {
    let device = parse_device(&opts.device)?;
    set_cuda_bodies(true);
    let mut ok = true;
    for op in OPS {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for (seed, dims) in SHAPES.iter().enumerate() {
                ok &= check(op, dims, dtype, seed as u64, &device)?;
            }
        }
    }
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for (seed, &(rows, classes)) in CROSS_ENTROPY_SHAPES.iter().enumerate() {
            ok &= check_cross_entropy(rows, classes, dtype, seed as u64, &device)?;
        }
    }
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        for (seed, &size) in ROPE_SIZES.iter().enumerate() {
            for batched in [false, true] {
                ok &= check_ropes(size, batched, dtype, seed as u64, &device)?;
            }
        }
    }
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        for (seed, case) in ATTENTION_CASES.iter().enumerate() {
            ok &= check_attention(case, dtype, seed as u64, &device)?;
        }
    }
    ok &= check_adamw(&device)?;
    for op in OPS {
        time(op, opts.rounds, &device)?;
    }
    for dtype in [DType::F32, DType::BF16] {
        time_attention(dtype, opts.rounds, &device)?;
    }
    Ok(ok)
}

/// Relative tolerance of a dtype: a few units in the last place of the output,
/// and of the gradients summed over rows.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-4,
        DType::F16 => 1e-2,
        _ => 4e-2,
    }
}

/// The op's output and input gradients (of `Σ y·w`) on `device`, as f64 on CPU.
fn outputs(
    op: &Op,
    inputs: &[Tensor],
    w: &Tensor,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Vec<Tensor>> {
    let vars = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_dtype(dtype)?.to_device(device)?))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let params: Vec<Tensor> = vars[1..].iter().map(|v| v.as_tensor().clone()).collect();
    let y = (op.run)(vars[0].as_tensor(), &params)?;
    let loss = (y.to_dtype(DType::F64)? * w.to_device(device)?)?.sum_all()?;
    let grads = loss.backward()?;
    let mut all = vec![y];
    for var in &vars {
        match grads.get(var.as_tensor()) {
            Some(g) => all.push(g.clone()),
            None => candle_core::bail!("{}: no gradient for an input", op.name),
        }
    }
    all.iter()
        .map(|t| t.to_dtype(DType::F64)?.to_device(&Device::Cpu))
        .collect()
}

/// One case: CUDA's output and gradients against the CPU twin's.
fn check(op: &Op, dims: &[usize], dtype: DType, seed: u64, device: &Device) -> AnyResult<bool> {
    let n = *dims.last().unwrap_or(&1);
    let cpu = Device::Cpu;
    let spread = 1.0 + seed as f64;
    let mut inputs = vec![(Tensor::randn(0f64, spread, dims, &cpu)? + 0.5)?];
    for _ in 0..op.params {
        inputs.push((Tensor::randn(0f64, 1.0, n, &cpu)? + 1.0)?);
    }
    let w = Tensor::randn(0f64, 1.0, dims, &cpu)?;
    // candle-nn's CPU softmax, which the twin follows, sums in f16 and bf16
    // themselves; the kernel sums in f32 (as candle's CUDA softmax): its reference
    // there is the twin in f32 on the same rounded inputs (the CPU harness measured
    // 9e-3 of the largest value between them on rows of 1,500 in f16).
    let half = matches!(dtype, DType::F16 | DType::BF16);
    let want = if op.name == "softmax_last_dim" && half {
        let rounded = inputs
            .iter()
            .map(|x| x.to_dtype(dtype)?.to_dtype(DType::F64))
            .collect::<candle_core::Result<Vec<_>>>()?;
        outputs(op, &rounded, &w, DType::F32, &cpu)?
    } else {
        outputs(op, &inputs, &w, dtype, &cpu)?
    };
    let got = outputs(op, &inputs, &w, dtype, device)?;
    let names = ["y", "dx", "dparam0", "dparam1"];
    let mut ok = true;
    for (name, (want, got)) in names.iter().zip(want.iter().zip(&got)) {
        ok &= compare(
            &format!("kernels.{}.{name}", op.name),
            dtype,
            dims,
            want,
            got,
        )?;
    }
    Ok(ok)
}

/// CUDA's `got` against the CPU twin's `want` (both f64 on CPU), within the
/// dtype's tolerance relative to the largest value; one JSON line.
fn compare(
    check: &str,
    dtype: DType,
    dims: &[usize],
    want: &Tensor,
    got: &Tensor,
) -> AnyResult<bool> {
    let scale = want.abs()?.max_all()?.to_scalar::<f64>()?.max(1e-30);
    let diff = (want - got)?.abs()?.max_all()?.to_scalar::<f64>()?;
    let relative = diff / scale;
    let passed = relative <= tolerance(dtype) && relative.is_finite();
    emit(&json!({
        "check": check,
        "ok": passed,
        "dtype": format!("{dtype:?}"),
        "dims": dims,
        "max_abs_diff": diff,
        "relative": relative,
        "tolerance": tolerance(dtype),
    }));
    Ok(passed)
}

/// Forward + backward, fused CUDA body against the composite, f32, the shapes of
/// `benches/nn_ops.rs`.
fn time(op: &Op, rounds: usize, device: &Device) -> AnyResult<()> {
    let dims: &[usize] = match op.name {
        "softmax_last_dim" => &[8, 8, 256, 256],
        _ => &[8, 256, 512],
    };
    let n = dims[dims.len() - 1];
    let x = Var::randn(0f32, 1.0, dims, device)?;
    let params = (0..op.params)
        .map(|_| Var::randn(0f32, 1.0, n, device))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let tensors: Vec<Tensor> = params.iter().map(|v| v.as_tensor().clone()).collect();
    let seconds = |fused: bool| -> AnyResult<f64> {
        set_cuda_bodies(fused);
        let step = || -> candle_core::Result<()> {
            let y = (op.run)(x.as_tensor(), &tensors)?;
            y.sum_all()?.backward()?;
            Ok(())
        };
        step()?;
        device.synchronize()?;
        let started = Instant::now();
        for _ in 0..rounds {
            step()?;
        }
        device.synchronize()?;
        Ok(started.elapsed().as_secs_f64() / rounds.max(1) as f64)
    };
    let composite = seconds(false)?;
    let fused = seconds(true)?;
    emit(&json!({
        "timing": format!("kernels.{}", op.name),
        "dims": dims,
        "fused_ms": fused * 1e3,
        "composite_ms": composite * 1e3,
        "composite_over_fused": composite / fused,
    }));
    Ok(())
}

/// `cross_entropy_rows` on CUDA against its CPU twin: losses and `d logits` (of
/// `Σ loss·w`), with every fourth row's target the ignored index.
fn check_cross_entropy(
    rows: usize,
    classes: usize,
    dtype: DType,
    seed: u64,
    device: &Device,
) -> AnyResult<bool> {
    let cpu = Device::Cpu;
    let logits =
        (Tensor::randn(0f64, 2.0 + seed as f64, (rows, classes), &cpu)?).to_dtype(dtype)?;
    let targets: Vec<i64> = (0..rows)
        .map(|i| {
            if i % 4 == 3 {
                -100
            } else {
                ((i * 7 + 3) % classes) as i64
            }
        })
        .collect();
    let targets = Tensor::new(targets, &cpu)?;
    let w = Tensor::randn(0f64, 1.0, rows, &cpu)?;
    let run = |on: &Device| -> candle_core::Result<[Tensor; 2]> {
        let x = Var::from_tensor(&logits.to_device(on)?)?;
        let loss = cross_entropy_rows(x.as_tensor(), &targets.to_device(on)?, Some(-100))?;
        let total = (loss.to_dtype(DType::F64)? * w.to_device(on)?)?.sum_all()?;
        let grads = total.backward()?;
        let Some(dx) = grads.get(x.as_tensor()) else {
            candle_core::bail!("cross_entropy_rows: no gradient for the logits")
        };
        Ok([
            loss.to_dtype(DType::F64)?.to_device(&cpu)?,
            dx.to_dtype(DType::F64)?.to_device(&cpu)?,
        ])
    };
    let (want, got) = (run(&cpu)?, run(device)?);
    let mut ok = true;
    for (name, (want, got)) in ["loss", "dlogits"].iter().zip(want.iter().zip(&got)) {
        let check = format!("kernels.cross_entropy_rows.{name}");
        ok &= compare(&check, dtype, &[rows, classes], want, got)?;
    }
    Ok(ok)
}

type RopeFn = fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor>;

/// The three ropes on CUDA against their CPU twins: `y` and the gradients of x
/// and of both tables (per sequence when `batched`).
fn check_ropes(
    (b, h, t, d): (usize, usize, usize, usize),
    batched: bool,
    dtype: DType,
    seed: u64,
    device: &Device,
) -> AnyResult<bool> {
    let cpu = Device::Cpu;
    let table: Vec<usize> = if batched {
        vec![b, t, d / 2]
    } else {
        vec![t, d / 2]
    };
    let angles = (Tensor::randn(0f64, 1.0 + seed as f64, table.as_slice(), &cpu))?;
    let tables = [angles.cos()?, angles.sin()?];
    let ropes: [(&str, RopeFn, [usize; 4]); 3] = [
        ("rope", rope, [b, h, t, d]),
        ("rope_i", rope_i, [b, h, t, d]),
        ("rope_thd", rope_thd, [b, t, h, d]),
    ];
    let mut ok = true;
    for (name, op, dims) in ropes {
        let x = Tensor::randn(0f64, 1.0, &dims, &cpu)?;
        let w = Tensor::randn(0f64, 1.0, &dims, &cpu)?;
        let run = |on: &Device| -> candle_core::Result<Vec<Tensor>> {
            let vars = [&x, &tables[0], &tables[1]]
                .iter()
                .map(|t| Var::from_tensor(&t.to_dtype(dtype)?.to_device(on)?))
                .collect::<candle_core::Result<Vec<_>>>()?;
            let y = op(
                vars[0].as_tensor(),
                vars[1].as_tensor(),
                vars[2].as_tensor(),
            )?;
            let grads = (y.to_dtype(DType::F64)? * w.to_device(on)?)?
                .sum_all()?
                .backward()?;
            let mut all = vec![y];
            for var in &vars {
                match grads.get(var.as_tensor()) {
                    Some(g) => all.push(g.clone()),
                    None => candle_core::bail!("{name}: no gradient for an input"),
                }
            }
            all.iter()
                .map(|t| t.to_dtype(DType::F64)?.to_device(&cpu))
                .collect()
        };
        let (want, got) = (run(&cpu)?, run(device)?);
        for (part, (want, got)) in ["y", "dx", "dcos", "dsin"]
            .iter()
            .zip(want.iter().zip(&got))
        {
            let check = format!(
                "kernels.{name}.{part}{}",
                if batched { ".batched" } else { "" }
            );
            ok &= compare(&check, dtype, &dims, want, got)?;
        }
    }
    Ok(ok)
}

/// adabatch's AdamW on CUDA (one kernel per parameter) against the same on CPU:
/// 5 steps of the same gradients give the same bits; then its state, exported
/// and imported into a fresh optimizer, continues as the uninterrupted one.
fn check_adamw(device: &Device) -> AnyResult<bool> {
    let cpu = Device::Cpu;
    let shapes: [&[usize]; 3] = [&[1], &[7, 33], &[300, 257]];
    let init: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::randn(0f32, 1.0, *s, &cpu))
        .collect::<candle_core::Result<_>>()?;
    let grads: Vec<Vec<Tensor>> = (0..6)
        .map(|_| {
            shapes
                .iter()
                .map(|s| Tensor::randn(0f32, 1.0, *s, &cpu))
                .collect()
        })
        .collect::<candle_core::Result<_>>()?;
    let params = ParamsAdamW {
        lr: 1e-2,
        weight_decay: 0.1,
        ..ParamsAdamW::default()
    };
    let run = |on: &Device, steps: std::ops::Range<usize>, from: Option<(&[Tensor], &AdamW)>| {
        let start = from.map_or(init.as_slice(), |(values, _)| values);
        let vars = start
            .iter()
            .map(|t| Var::from_tensor(&t.to_device(on)?))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let named: Vec<(String, Var)> = vars
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("p{i}"), v.clone()))
            .collect();
        let mut opt = AdamW::new(vars.clone(), params)?;
        if let Some((_, earlier)) = from {
            let state = earlier
                .export_state(&named)?
                .expect("AdamW exports its state");
            opt.import_state(&named, &state)?;
        }
        for step in steps {
            // Σ var·grad: the gradient of each variable is its `grad`, exactly.
            let mut loss = Tensor::zeros((), DType::F32, on)?;
            for (var, grad) in vars.iter().zip(&grads[step]) {
                loss = (loss + (var.as_tensor() * grad.to_device(on)?)?.sum_all()?)?;
            }
            opt.step(&loss.backward()?)?;
        }
        let values = vars
            .iter()
            .map(|v| v.as_tensor().to_device(&cpu))
            .collect::<candle_core::Result<Vec<_>>>()?;
        AnyResult::Ok((values, opt))
    };
    let (want, _) = run(&cpu, 0..6, None)?;
    let (got, _) = run(device, 0..6, None)?;
    let (half, first) = run(device, 0..3, None)?;
    let (resumed, _) = run(device, 3..6, Some((&half, &first)))?;
    let mut ok = true;
    for (check, values) in [
        ("kernels.adamw.cpu_bits", &got),
        ("kernels.adamw.resumed_bits", &resumed),
    ] {
        let mut max = 0f64;
        for (want, got) in want.iter().zip(values) {
            let diff = (want - got)?.abs()?.max_all()?.to_scalar::<f32>()?;
            max = max.max(f64::from(diff));
        }
        let passed = max == 0.0;
        ok &= passed;
        emit(&json!({"check": check, "ok": passed, "max_abs_diff": max, "steps": 6}));
    }
    Ok(ok)
}

/// Document ids `[b, t]` of `case`: runs of 1, 5, 23, 1 and 40 tokens over and
/// over, shifted per row (documents of one token included), or none.
fn attention_documents(b: usize, t: usize, with: bool) -> candle_core::Result<Option<Tensor>> {
    if !with {
        return Ok(None);
    }
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
    Tensor::from_vec(ids, (b, t), &Device::Cpu).map(Some)
}

/// `packed_attention` on CUDA against its CPU twin: the output and the gradients
/// of q, k and v (of `Σ y·w`).
fn check_attention(
    &(kv, b, g, t, d, documents, window): &AttentionCase,
    dtype: DType,
    seed: u64,
    device: &Device,
) -> AnyResult<bool> {
    let cpu = Device::Cpu;
    let dims = [[kv, b, g * t, d], [kv, b, t, d], [kv, b, t, d]];
    // A wider spread for later cases: sharper softmaxes.
    let spread = 1.0 + 0.25 * seed as f64;
    let inputs = dims
        .iter()
        .map(|dims| Tensor::randn(0f64, spread, dims, &cpu))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let w = Tensor::randn(0f64, 1.0, &dims[0], &cpu)?;
    let ids = attention_documents(b, t, documents)?;
    let scale = (d as f64).powf(-0.5);
    let run = |on: &Device| -> candle_core::Result<Vec<Tensor>> {
        let vars = inputs
            .iter()
            .map(|x| Var::from_tensor(&x.to_dtype(dtype)?.to_device(on)?))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let ids = ids.as_ref().map(|ids| ids.to_device(on)).transpose()?;
        let [q, k, v] = [0, 1, 2].map(|i| vars[i].as_tensor());
        let y = packed_attention(q, k, v, ids.as_ref(), window, scale)?;
        let grads = (y.to_dtype(DType::F64)? * w.to_device(on)?)?
            .sum_all()?
            .backward()?;
        let mut all = vec![y];
        for var in &vars {
            match grads.get(var.as_tensor()) {
                Some(grad) => all.push(grad.clone()),
                None => candle_core::bail!("packed_attention: no gradient for an input"),
            }
        }
        all.iter()
            .map(|t| t.to_dtype(DType::F64)?.to_device(&cpu))
            .collect()
    };
    let (want, got) = (run(&cpu)?, run(device)?);
    let mut ok = true;
    let name = format!(
        "kernels.packed_attention{}{}",
        if documents { ".documents" } else { "" },
        window.map_or(String::new(), |w| format!(".window{w}"))
    );
    let y_scale = want[0].abs()?.max_all()?.to_scalar::<f64>()?.max(1e-30);
    for (part, (want, got)) in ["y", "dq", "dk", "dv"].iter().zip(want.iter().zip(&got)) {
        // One position: dq and dk are zero in exact arithmetic (dS = P∘(dO·v − D)
        // with O = v), but the kernel sums dO·v and D = dO·O in different orders,
        // so they are zero within the dtype's tolerance of the output's scale (the
        // CPU harness, scripts/kernels-on-cpu.sh, showed -8.9e-8 in f32).
        if t == 1 && (*part == "dq" || *part == "dk") {
            let largest = got.abs()?.max_all()?.to_scalar::<f64>()?;
            let zero = largest <= tolerance(dtype) * y_scale;
            ok &= zero;
            emit(
                &json!({"check": format!("{name}.{part}"), "ok": zero, "dtype": format!("{dtype:?}"), "dims": [kv, b, g, t, d], "max_abs": largest}),
            );
            continue;
        }
        ok &= compare(
            &format!("{name}.{part}"),
            dtype,
            &[kv, b, g, t, d],
            want,
            got,
        )?;
    }
    Ok(ok)
}

/// Forward + backward of `packed_attention`, fused CUDA body against the composite
/// (matmul, mask, softmax, matmul), at a decoder's shapes: 8 rows of 512 packing
/// documents, 8 heads of 64; 2 key/value heads shared by 8 heads of 128.
fn time_attention(dtype: DType, rounds: usize, device: &Device) -> AnyResult<()> {
    for (kv, b, g, t, d) in [(8, 8, 1, 512, 64), (2, 8, 4, 256, 128)] {
        let var = |dims: &[usize]| -> candle_core::Result<Var> {
            Var::from_tensor(&Tensor::randn(0f32, 1.0, dims, device)?.to_dtype(dtype)?)
        };
        let (q, k, v) = (
            var(&[kv, b, g * t, d])?,
            var(&[kv, b, t, d])?,
            var(&[kv, b, t, d])?,
        );
        let ids = attention_documents(b, t, true)?
            .map(|ids| ids.to_device(device))
            .transpose()?;
        let scale = (d as f64).powf(-0.5);
        let seconds = |fused: bool| -> AnyResult<f64> {
            set_cuda_bodies(fused);
            let step = || -> candle_core::Result<()> {
                let y = packed_attention(&q, &k, &v, ids.as_ref(), None, scale)?;
                y.to_dtype(DType::F32)?.sum_all()?.backward()?;
                Ok(())
            };
            step()?;
            device.synchronize()?;
            let started = Instant::now();
            for _ in 0..rounds {
                step()?;
            }
            device.synchronize()?;
            Ok(started.elapsed().as_secs_f64() / rounds.max(1) as f64)
        };
        let composite = seconds(false)?;
        let fused = seconds(true)?;
        emit(&json!({
            "timing": "kernels.packed_attention",
            "dtype": format!("{dtype:?}"),
            "dims": [kv, b, g, t, d],
            "fused_ms": fused * 1e3,
            "composite_ms": composite * 1e3,
            "composite_over_fused": composite / fused,
        }));
    }
    Ok(())
}
