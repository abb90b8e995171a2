//! Seeded, named parameter storage.
//!
//! candle's CPU initialisers draw from a thread RNG that cannot be seeded, so two
//! runs (or two ranks) would start from different weights. [`Parameters`] is a
//! [`VarMap`] whose initial values come from a ChaCha stream keyed by `(seed, name)`:
//! the same seed gives the same weights on every rank, in every run, whatever order
//! the model creates them in.

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::init::{Init, NormalOrUniform};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{VarBuilder, VarMap};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal, Uniform};

/// A seeded [`VarMap`]: build a model through [`Parameters::var_builder`], hand
/// [`Parameters::all_vars`] to the optimizer, return
/// [`Parameters::named_parameters`] from `TrainModel::named_parameters`.
#[derive(Clone)]
pub struct Parameters {
    vars: VarMap,
    seed: u64,
}

impl std::fmt::Debug for Parameters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parameters")
            .field("seed", &self.seed)
            .field("len", &self.named_parameters().len())
            .finish()
    }
}

impl Parameters {
    /// An empty store whose initial values derive from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            vars: VarMap::new(),
            seed,
        }
    }

    /// A `VarBuilder` creating seeded variables in this store.
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), dtype, device.clone())
    }

    /// Variables sorted by name (a stable order for optimizers and all-reduces).
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        let data = self.vars.data().lock().unwrap_or_else(|e| e.into_inner());
        let mut named: Vec<_> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }

    /// Variables in name order, for an optimizer's constructor.
    pub fn all_vars(&self) -> Vec<Var> {
        self.named_parameters()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// The underlying `VarMap`. To load pretrained weights use
    /// `adabatch::LoadPretrained::load_pretrained` (candle's `VarMap::load` needs
    /// `&mut`); to save, `adabatch::save_pretrained`.
    pub fn var_map(&self) -> &VarMap {
        &self.vars
    }

    fn seeded_init(
        &self,
        shape: &Shape,
        name: &str,
        init: Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Var> {
        let n = shape.elem_count();
        let mut rng = ChaCha8Rng::seed_from_u64(name_seed(self.seed, name));
        let values: Vec<f32> = match init {
            Init::Const(c) => return Var::from_tensor(&(Tensor::ones(shape, dtype, device)? * c)?),
            Init::Randn { mean, stdev } => sample(&mut rng, n, normal(mean, stdev)?),
            Init::Uniform { lo, up } => sample(&mut rng, n, uniform(lo, up)?),
            Init::Kaiming {
                dist,
                fan,
                non_linearity,
            } => {
                let std = non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt();
                match dist {
                    NormalOrUniform::Normal => sample(&mut rng, n, normal(0.0, std)?),
                    NormalOrUniform::Uniform => {
                        let bound = 3f64.sqrt() * std;
                        sample(&mut rng, n, uniform(-bound, bound)?)
                    }
                }
            }
        };
        Var::from_tensor(&Tensor::from_vec(values, shape, device)?.to_dtype(dtype)?)
    }
}

/// FNV-1a of the seed and the name: stable across runs, platforms and Rust releases
/// (std's hasher promises none of that).
fn name_seed(seed: u64, name: &str) -> u64 {
    seed.to_le_bytes()
        .iter()
        .chain(name.as_bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

fn normal(mean: f64, std: f64) -> candle_core::Result<Normal<f64>> {
    Normal::new(mean, std).map_err(|e| candle_core::Error::wrap(e).context("normal init"))
}

fn uniform(lo: f64, up: f64) -> candle_core::Result<Uniform<f64>> {
    Uniform::new(lo, up).map_err(|e| candle_core::Error::wrap(e).context("uniform init"))
}

fn sample(rng: &mut ChaCha8Rng, n: usize, dist: impl Distribution<f64>) -> Vec<f32> {
    (0..n).map(|_| dist.sample(rng) as f32).collect()
}

impl SimpleBackend for Parameters {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        init: Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut data = self.vars.data().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = data.get(name) {
            if existing.shape() != &shape {
                candle_core::bail!(
                    "parameter `{name}` exists with shape {:?}, requested {:?}",
                    existing.shape(),
                    shape
                );
            }
            return Ok(existing.as_tensor().clone());
        }
        let var = self.seeded_init(&shape, name, init, dtype, device)?;
        let tensor = var.as_tensor().clone();
        data.insert(name.to_string(), var);
        Ok(tensor)
    }

    fn get_unchecked(
        &self,
        name: &str,
        _dtype: DType,
        _device: &Device,
    ) -> candle_core::Result<Tensor> {
        let data = self.vars.data().lock().unwrap_or_else(|e| e.into_inner());
        match data.get(name) {
            Some(var) => Ok(var.as_tensor().clone()),
            None => candle_core::bail!(
                "parameter `{name}` does not exist and has no shape to create it with"
            ),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.vars
            .data()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_weights_regardless_of_creation_order() {
        let dev = Device::Cpu;
        let a = Parameters::new(7);
        let vb = a.var_builder(DType::F32, &dev);
        candle_nn::linear(4, 3, vb.pp("x")).unwrap();
        candle_nn::linear(3, 2, vb.pp("y")).unwrap();
        let b = Parameters::new(7);
        let vb = b.var_builder(DType::F32, &dev);
        candle_nn::linear(3, 2, vb.pp("y")).unwrap();
        candle_nn::linear(4, 3, vb.pp("x")).unwrap();
        let (na, nb) = (a.named_parameters(), b.named_parameters());
        assert_eq!(na.len(), 4);
        for ((ka, va), (kb, vb)) in na.iter().zip(&nb) {
            assert_eq!(ka, kb);
            let diff = (va.as_tensor() - vb.as_tensor())
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap();
            assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
        }
        let c = Parameters::new(8);
        candle_nn::linear(4, 3, c.var_builder(DType::F32, &dev).pp("x")).unwrap();
        let w = |p: &Parameters| {
            p.named_parameters()[1]
                .1
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        assert_ne!(w(&a)[..4], w(&c)[..4]);
    }
}
