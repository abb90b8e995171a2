//! The fused differentiable ops of `adabatch::nn` against the composite candle
//! graphs they replace, forward and backward, on CPU at LLM-ish shapes (f32):
//! `rms_norm` and `layer_norm` over `[8, 256, 512]`, `softmax_last_dim` over
//! `[8, 8, 256, 256]`, and the three ropes over `[8, 8, 256, 64]` with `[256, 32]`
//! tables that are plain tensors (x needs a gradient, the tables do not).
//!
//! ```text
//! cargo bench -p adabatch-benches --bench nn_ops
//! ```
//!
//! Before timing anything the bench checks, untimed, that each fused op and its
//! composite give the same forward values and gradients (relative error at most
//! 1e-4 in f32), and panics otherwise. Criterion then times, per op: fused and
//! composite forward + backward (`y.backward()`, which seeds a dense gradient of
//! ones), fused and composite forward alone, and candle-nn's fused forward (which
//! has no backward). The check differentiates `sum(y · w)` for random `w`; the
//! timed backward starts from `y.backward()`, so that both sides time only the op.
//! Last, a paired run (fused and composite interleaved, order
//! alternating, `NN_OPS_ROUNDS` rounds, default 7, 0 skips it) prints the median
//! times and composite/fused ratios as a Markdown table. candle (and so both sides)
//! runs on one thread unless `RAYON_NUM_THREADS` is set. Like the
//! engine, the bench keeps freed host memory for reuse
//! (`memory::host::keep_freed_memory`); `NN_OPS_RELEASE_FREED=1` leaves glibc's
//! malloc as it is.

use std::hint::black_box;
use std::time::{Duration, Instant};

use adabatch::candle_core::{Device, Result, Tensor, Var, D};
use adabatch::candle_nn;
use adabatch::nn;
use criterion::Criterion;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// An op on its inputs (the first is `x`).
type Op = fn(&[Tensor]) -> Result<Tensor>;

/// One op at one shape: ours, the composite it replaces, and candle-nn's fused op.
struct Case {
    name: &'static str,
    shape: &'static str,
    /// Inputs, and whether each needs a gradient.
    inputs: Vec<(Tensor, bool)>,
    fused: Op,
    composite: Op,
    candle_fused: Op,
}

fn uniform(dims: &[usize], lo: f32, hi: f32, seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
    Tensor::from_vec(values, dims, &Device::Cpu).expect("a tensor")
}

/// `[t, d/2]` cos and sin tables of positions `0..t`.
fn tables(t: usize, half: usize) -> (Tensor, Tensor) {
    let angles: Vec<f32> = (0..t)
        .flat_map(|p| (0..half).map(move |i| p as f32 / 10_000f32.powf(i as f32 / half as f32)))
        .collect();
    let angles = Tensor::from_vec(angles, (t, half), &Device::Cpu).expect("angles");
    (angles.cos().expect("cos"), angles.sin().expect("sin"))
}

/// candle-nn's `rope_slow` on the `[b, t, h, d]` layout.
fn rope_thd_slow(t: &[Tensor]) -> Result<Tensor> {
    let x = t[0].transpose(1, 2)?.contiguous()?;
    candle_nn::rotary_emb::rope_slow(&x, &t[1], &t[2])?
        .transpose(1, 2)?
        .contiguous()
}

fn cases() -> Vec<Case> {
    let norm_x = uniform(&[8, 256, 512], -2., 3., 1);
    let (alpha, beta) = (uniform(&[512], 0.5, 1.5, 2), uniform(&[512], -0.5, 0.5, 3));
    let logits = uniform(&[8, 8, 256, 256], -6., 6., 4);
    let (cos, sin) = tables(256, 32);
    let rope_input = |dims: &[usize]| {
        let x = uniform(dims, -1., 1., 5);
        vec![(x, true), (cos.clone(), false), (sin.clone(), false)]
    };
    let (norm_shape, rope_shape) = ("[8, 256, 512]", "[8, 8, 256, 64]");
    vec![
        Case {
            name: "rms_norm",
            shape: norm_shape,
            inputs: vec![(norm_x.clone(), true), (alpha.clone(), true)],
            fused: |t| nn::rms_norm(&t[0], &t[1], 1e-5),
            composite: |t| candle_nn::ops::rms_norm_slow(&t[0], &t[1], 1e-5),
            candle_fused: |t| candle_nn::ops::rms_norm(&t[0], &t[1], 1e-5),
        },
        Case {
            name: "layer_norm",
            shape: norm_shape,
            inputs: vec![(norm_x, true), (alpha, true), (beta, true)],
            fused: |t| nn::layer_norm(&t[0], &t[1], &t[2], 1e-5),
            composite: |t| candle_nn::ops::layer_norm_slow(&t[0], &t[1], &t[2], 1e-5),
            candle_fused: |t| candle_nn::ops::layer_norm(&t[0], &t[1], &t[2], 1e-5),
        },
        Case {
            name: "softmax_last_dim",
            shape: "[8, 8, 256, 256]",
            inputs: vec![(logits, true)],
            fused: |t| nn::softmax_last_dim(&t[0]),
            composite: |t| candle_nn::ops::softmax(&t[0], D::Minus1),
            candle_fused: |t| candle_nn::ops::softmax_last_dim(&t[0]),
        },
        Case {
            name: "rope",
            shape: rope_shape,
            inputs: rope_input(&[8, 8, 256, 64]),
            fused: |t| nn::rope(&t[0], &t[1], &t[2]),
            composite: |t| candle_nn::rotary_emb::rope_slow(&t[0], &t[1], &t[2]),
            candle_fused: |t| candle_nn::rotary_emb::rope(&t[0], &t[1], &t[2]),
        },
        Case {
            name: "rope_i",
            shape: rope_shape,
            inputs: rope_input(&[8, 8, 256, 64]),
            fused: |t| nn::rope_i(&t[0], &t[1], &t[2]),
            composite: |t| candle_nn::rotary_emb::rope_i_slow(&t[0], &t[1], &t[2]),
            candle_fused: |t| candle_nn::rotary_emb::rope_i(&t[0], &t[1], &t[2]),
        },
        Case {
            name: "rope_thd",
            shape: "[8, 256, 8, 64]",
            inputs: rope_input(&[8, 256, 8, 64]),
            fused: |t| nn::rope_thd(&t[0], &t[1], &t[2]),
            composite: rope_thd_slow,
            candle_fused: |t| candle_nn::rotary_emb::rope_thd(&t[0], &t[1], &t[2]),
        },
    ]
}

impl Case {
    /// The inputs, those that need a gradient as fresh variables.
    fn tensors(&self) -> Vec<Tensor> {
        let tensor = |(t, grad): &(Tensor, bool)| match grad {
            true => Var::from_tensor(t).expect("a variable").as_tensor().clone(),
            false => t.clone(),
        };
        self.inputs.iter().map(tensor).collect()
    }

    /// Forward and backward of `sum(y · weights)`, or of `y` (a gradient of ones)
    /// without weights; returns the output and the gradients of the inputs that
    /// need one.
    fn run(&self, op: Op, inputs: &[Tensor], weights: Option<&Tensor>) -> (Tensor, Vec<Tensor>) {
        let y = op(inputs).expect("forward");
        let grads = match weights {
            Some(w) => (&y * w).and_then(|l| l.sum_all()),
            None => Ok(y.clone()),
        };
        let grads = grads.and_then(|l| l.backward()).expect("backward");
        let wanted = inputs.iter().zip(&self.inputs).filter(|(_, (_, g))| *g);
        let grads = wanted
            .map(|(t, _)| grads.get(t).expect("a gradient").clone())
            .collect();
        (y, grads)
    }

    /// Panics unless fused and composite agree, forward and backward.
    fn check(&self) {
        let inputs = self.tensors();
        // Random weights: a softmax's gradient for a gradient of ones is zero.
        let w = uniform(inputs[0].dims(), -1., 1., 6);
        let (y, grads) = self.run(self.fused, &inputs, Some(&w));
        let (y_ref, grads_ref) = self.run(self.composite, &inputs, Some(&w));
        let rel_err = |a: &Tensor, b: &Tensor| -> f32 {
            let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            let scale = b.abs().unwrap().max_all().unwrap();
            (diff / scale.to_scalar::<f32>().unwrap().max(1e-30) as f64)
                .unwrap()
                .to_scalar()
                .unwrap()
        };
        let candle = (self.candle_fused)(&inputs).expect("candle-nn forward");
        assert!(
            rel_err(&y, &candle) == 0.,
            "{}: forward vs candle-nn",
            self.name
        );
        assert!(rel_err(&y, &y_ref) <= 1e-5, "{}: forward", self.name);
        for (i, (g, g_ref)) in grads.iter().zip(&grads_ref).enumerate() {
            let err = rel_err(g, g_ref);
            assert!(err <= 1e-4, "{}: gradient {i}: {err:e}", self.name);
        }
    }

    fn bench(&self, c: &mut Criterion) {
        let mut group = c.benchmark_group(format!("nn_ops/{}", self.name));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));
        let inputs = self.tensors();
        let sides = [("fused", self.fused), ("composite", self.composite)];
        for (side, op) in sides {
            group.bench_function(format!("{side} fwd+bwd"), |b| {
                b.iter(|| black_box(self.run(op, &inputs, None)))
            });
        }
        for (side, op) in [sides[0], sides[1], ("candle-nn fused", self.candle_fused)] {
            group.bench_function(format!("{side} fwd"), |b| {
                b.iter(|| black_box(op(&inputs).expect("forward")))
            });
        }
        group.finish();
    }

    /// Median seconds of fused and composite forward + backward over `rounds`
    /// interleaved rounds.
    fn paired(&self, rounds: usize) -> (f64, f64) {
        let inputs = self.tensors();
        let time = |op: Op| {
            let start = Instant::now();
            black_box(self.run(op, &inputs, None));
            start.elapsed().as_secs_f64()
        };
        let (mut fused, mut composite) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            if round % 2 == 0 {
                fused.push(time(self.fused));
                composite.push(time(self.composite));
            } else {
                composite.push(time(self.composite));
                fused.push(time(self.fused));
            }
        }
        (median(&mut fused), median(&mut composite))
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // One thread, as the other benches: on a shared 2-core machine the pool's
    // hand-offs wait on descheduled threads and swamp what is measured.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    // As the engine does when it trains: freed host memory is kept for the next
    // step, so that the timings are the ops' and not page faults'.
    if std::env::var_os("NN_OPS_RELEASE_FREED").is_none() {
        adabatch::memory::host::keep_freed_memory();
    }
    let cases = cases();
    for case in &cases {
        case.check();
    }
    let mut criterion = Criterion::default().configure_from_args();
    for case in &cases {
        case.bench(&mut criterion);
    }
    criterion.final_summary();

    // Only when benchmarking (`cargo bench`), not under `cargo test --benches`.
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let rounds = std::env::var("NN_OPS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    if !has("--bench") || has("--test") || has("--list") || rounds == 0 {
        return;
    }
    println!(
        "\npaired forward + backward, f32, {} threads, median of {rounds} rounds:\n",
        adabatch::candle_core::utils::get_num_threads()
    );
    println!("| op | shape | fused | composite | composite / fused |");
    println!("|---|---|---:|---:|---:|");
    for case in &cases {
        let (fused, composite) = case.paired(rounds);
        println!(
            "| `{}` | {} | {:.2} ms | {:.2} ms | {:.1}× |",
            case.name,
            case.shape,
            fused * 1e3,
            composite * 1e3,
            composite / fused
        );
    }
}
