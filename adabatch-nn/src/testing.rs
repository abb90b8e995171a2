//! Helpers for the tests of the fused ops: seeded tensors, comparisons, gradients of
//! a weighted sum, central finite differences.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// A seeded standard-normal tensor, drawn in f64 and rounded to `dtype`.
pub(super) fn randn(dims: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = dims.iter().product();
    let values: Vec<f64> = (0..n).map(|_| StandardNormal.sample(&mut rng)).collect();
    Tensor::from_vec(values, dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .expect("a seeded tensor")
}

/// The values of `t` as f64 (exact for every float dtype).
pub(super) fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1())
        .expect("float values")
}

/// `got` and `want` have the same shape and dtype and the same values, bit for bit
/// (NaNs aside, which must be at the same places).
pub(super) fn assert_same(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (got, want) = (values(got), values(want));
    let differ = |(g, w): &(&f64, &f64)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan());
    let bad: Vec<_> = got
        .iter()
        .zip(&want)
        .enumerate()
        .filter(|(_, p)| differ(p))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} values differ, first at {:?}",
        bad.len(),
        got.len(),
        bad.first()
    );
}

/// `max |got − want| / max |want|`, after checking the shapes match and that
/// `want` is not all zeros (a comparison with zeros would prove nothing).
pub(super) fn rel_err(got: &Tensor, want: &Tensor, what: &str) -> f64 {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (got, want) = (values(got), values(want));
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    assert!(scale > 0., "{what}: the reference is all zeros");
    let diff = got
        .iter()
        .zip(&want)
        .fold(0f64, |m, (g, w)| m.max((g - w).abs()));
    diff / scale
}

/// `rel_err(got, want) <= tol`.
pub(super) fn assert_close(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    let err = rel_err(got, want, what);
    assert!(err <= tol, "{what}: relative error {err:e} > {tol:e}");
}

/// `sum(f(inputs) · w)` for seeded weights `w` of the output's shape and dtype.
pub(super) fn weighted_loss(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    seed: u64,
) -> Result<Tensor> {
    let y = f(inputs)?;
    let w = randn(y.dims(), y.dtype(), seed);
    (y * w)?.sum_all()
}

/// The gradient of [`weighted_loss`] for every input (each made a variable); panics
/// if one has none.
pub(super) fn grads(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    seed: u64,
) -> Result<Vec<Tensor>> {
    let vars = inputs
        .iter()
        .map(Var::from_tensor)
        .collect::<Result<Vec<_>>>()?;
    let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let store = weighted_loss(f, &tensors, seed)?.backward()?;
    let grads = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let grad = store.get(t);
            grad.unwrap_or_else(|| panic!("input {i} has no gradient"))
                .clone()
        })
        .collect();
    Ok(grads)
}

/// The gradients of `f` and of `reference` agree within `tol` for every input.
pub(super) fn assert_grads_match(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    reference: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    tol: f64,
    what: &str,
) -> Result<()> {
    let (got, want) = (grads(f, inputs, 99)?, grads(reference, inputs, 99)?);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(got.dtype(), inputs[i].dtype(), "{what}: input {i}: dtype");
        assert_close(got, want, tol, &format!("{what}: gradient of input {i}"));
    }
    Ok(())
}

/// The gradients of `f` (f64 inputs) agree with central finite differences of
/// [`weighted_loss`] at every element of every input.
pub(super) fn assert_finite_differences(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    what: &str,
) -> Result<()> {
    let analytic = grads(f, inputs, 7)?;
    let loss = |inputs: &[Tensor]| -> Result<f64> { weighted_loss(f, inputs, 7)?.to_scalar() };
    for (i, input) in inputs.iter().enumerate() {
        assert_eq!(
            input.dtype(),
            DType::F64,
            "{what}: finite differences need f64"
        );
        let (base, analytic) = (values(input), values(&analytic[i]));
        assert!(
            analytic.iter().any(|g| *g != 0.),
            "{what}: input {i}: all-zero gradient"
        );
        for (j, &ana) in analytic.iter().enumerate() {
            let h = 1e-6 * base[j].abs().max(1.);
            let shifted = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[j] += delta;
                let mut args = inputs.to_vec();
                args[i] = Tensor::from_vec(v, input.dims(), &Device::Cpu)?;
                loss(&args)
            };
            let numeric = (shifted(h)? - shifted(-h)?) / (2. * h);
            let err = (numeric - ana).abs() / (1. + ana.abs());
            assert!(
                err < 1e-6,
                "{what}: input {i} element {j}: analytic {ana}, numeric {numeric}"
            );
        }
    }
    Ok(())
}
