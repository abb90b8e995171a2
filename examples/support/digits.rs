//! The UCI 8×8 handwritten digits (`data/digits_8x8.csv.gz`, 1,797 images, 64
//! pixels 0–16 then the label, one image per CSV row), a seeded train/test split,
//! and an MLP that reports its accuracy as an eval metric.

use std::io::Read;
use std::path::{Path, PathBuf};

use adabatch::candle_core::{self, Device, Tensor, Var};
use adabatch::candle_nn::{linear, Linear, VarBuilder};
use adabatch::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;

pub const PIXELS: usize = 64;
pub const CLASSES: usize = 10;

/// The data set shipped with the repository, found from the building package's
/// folder up (the examples' package is the repository's root, the tests' one lies
/// below it).
pub fn default_path() -> PathBuf {
    let file = "data/digits_8x8.csv.gz";
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join(file))
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from(file))
}

#[derive(Clone)]
pub struct Digit {
    /// Pixels scaled to [0, 1].
    pub pixels: [f32; PIXELS],
    pub label: u32,
}

/// A line of the digits file that is not 64 pixels and a label.
#[derive(Debug)]
pub struct BadDigitsLine {
    path: PathBuf,
    line: usize,
    what: String,
    source: Option<std::num::ParseFloatError>,
}

impl std::fmt::Display for BadDigitsLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} line {}: {}",
            self.path.display(),
            self.line,
            self.what
        )
    }
}

impl std::error::Error for BadDigitsLine {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

/// Reads the digits from a CSV file, gzipped when its name ends in `.gz`.
pub fn read_digits(path: &Path) -> adabatch::Result<Vec<Digit>> {
    let read = || adabatch::Error::io(adabatch::FileOp::Read, path);
    let bytes = std::fs::read(path).map_err(read())?;
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut text)
            .map_err(read())?;
        text
    } else {
        String::from_utf8(bytes)
            .map_err(|e| read()(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?
    };
    let bad = |line: usize, what: String, source| {
        adabatch::Error::user(BadDigitsLine {
            path: path.to_path_buf(),
            line,
            what,
            source,
        })
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let values: Vec<f32> = line
                .split(',')
                .map(|v| v.trim().parse::<f32>())
                .collect::<Result<_, _>>()
                .map_err(|e| bad(i + 1, "a value is not a number".into(), Some(e)))?;
            let [pixels @ .., label] = values.as_slice() else {
                return Err(bad(i + 1, "empty".into(), None));
            };
            let pixels: [f32; PIXELS] = pixels
                .iter()
                .map(|p| p / 16.0)
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| bad(i + 1, format!("expected {} values", PIXELS + 1), None))?;
            if !(0.0..CLASSES as f32).contains(label) {
                return Err(bad(i + 1, format!("label {label}"), None));
            }
            Ok(Digit {
                pixels,
                label: *label as u32,
            })
        })
        .collect()
}

/// A seeded split: `train_fraction` of the examples (shuffled) for training, the
/// rest for testing.
pub fn split(mut digits: Vec<Digit>, train_fraction: f64, seed: u64) -> (Vec<Digit>, Vec<Digit>) {
    digits.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    let test = digits.split_off((digits.len() as f64 * train_fraction).round() as usize);
    (digits, test)
}

pub struct Images {
    pub pixels: Tensor,
    pub labels: Tensor,
}

impl Batch for Images {
    fn num_examples(&self) -> usize {
        self.labels.dims()[0]
    }
}

pub fn collate(items: &[Digit], device: &Device) -> candle_core::Result<Images> {
    let pixels: Vec<f32> = items.iter().flat_map(|d| d.pixels).collect();
    let labels: Vec<u32> = items.iter().map(|d| d.label).collect();
    Ok(Images {
        pixels: Tensor::from_vec(pixels, (items.len(), PIXELS), device)?,
        labels: Tensor::from_vec(labels, items.len(), device)?,
    })
}

/// A 64-`hidden`-10 MLP with ReLU.
pub struct Mlp {
    hidden: Linear,
    out: Linear,
    pub params: Parameters,
}

impl Mlp {
    pub fn new(params: Parameters, hidden: usize, device: &Device) -> candle_core::Result<Self> {
        let vb: VarBuilder = params.var_builder(candle_core::DType::F32, device);
        Ok(Self {
            hidden: linear(PIXELS, hidden, vb.pp("hidden"))?,
            out: linear(hidden, CLASSES, vb.pp("out"))?,
            params,
        })
    }

    /// Under `--bf16` / `--fp16` the layers compute in half precision (the casts
    /// return their input otherwise).
    fn logits(&self, pixels: &Tensor) -> candle_core::Result<Tensor> {
        let hidden = adabatch::autocast_linear(&self.hidden, pixels)?.relu()?;
        adabatch::autocast_linear(&self.out, &hidden)
    }
}

impl TrainModel for Mlp {
    type Batch = Images;

    fn per_example_loss(&self, batch: &Images) -> candle_core::Result<Tensor> {
        per_example_cross_entropy(&self.logits(&batch.pixels)?, &batch.labels)
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }

    /// `accuracy`: 1 where the most likely class is the label.
    fn eval_metrics(&self, batch: &Images) -> candle_core::Result<Vec<(&'static str, Tensor)>> {
        let predicted = self.logits(&batch.pixels)?.argmax(1)?;
        let correct = predicted
            .eq(&batch.labels)?
            .to_dtype(candle_core::DType::F32)?;
        Ok(vec![("accuracy", correct)])
    }
}
