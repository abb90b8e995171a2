//! Memory models: predict a candidate batch's peak memory relative to a baseline
//! batch, from its shape features.
//!
//! - [`PaddedTokens`]: a conservative prior that needs no measurement.
//! - [`OnlineMemoryModel`]: fitted during the run from measured peaks (on CUDA from
//!   the device's figures, on CPU from [`cpu_memory_proxy`]), with a safety margin.
//! - Your own, attached with `#[regressor]` (the [`MemoryModel`] trait).

/// Shape features of a batch that drive its memory use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct BatchFeatures {
    /// Examples in the batch.
    pub batch_size: usize,
    /// Longest example, in tokens.
    pub max_len: usize,
    /// Sum of example lengths, in tokens.
    pub token_sum: usize,
    /// Tokens after padding to `max_len` (`batch_size * max_len`).
    pub padded_tokens: usize,
}

impl BatchFeatures {
    /// Features of a batch with these example lengths.
    pub fn of_lengths(lengths: impl IntoIterator<Item = usize>) -> Self {
        let (mut batch_size, mut max_len, mut token_sum) = (0, 0, 0);
        for len in lengths {
            batch_size += 1;
            max_len = max_len.max(len);
            token_sum += len;
        }
        Self {
            batch_size,
            max_len,
            token_sum,
            padded_tokens: batch_size * max_len,
        }
    }

    /// Padding tokens (`padded_tokens - token_sum`).
    pub fn padding(&self) -> usize {
        self.padded_tokens - self.token_sum
    }
}

/// Predicts peak memory of a candidate batch relative to a baseline batch
/// (`1.0` = the baseline's peak). Attach one with `#[regressor]`.
///
/// With several ranks every rank must give the same answers (a deterministic
/// model): the engine checks that the ranks' batch plans agree.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a memory model",
    label = "the `#[regressor]` field must implement `adabatch::MemoryModel`",
    note = "implement `adabatch::MemoryModel` (`fn predict(&self, candidate, baseline) -> f64`)"
)]
pub trait MemoryModel {
    /// Predicted peak memory of `candidate` as a multiple of `baseline`'s.
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64;
    /// A measurement to learn from (bytes at peak for `features`).
    fn observe(&mut self, _features: &BatchFeatures, _peak_bytes: u64) {}
}

/// Memory proportional to padded tokens: exact for activations that are linear in
/// the padded batch, and conservative (over-predicting) for shorter batches when
/// part of the memory is quadratic in length (attention). Needs no measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PaddedTokens;

impl MemoryModel for PaddedTokens {
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64 {
        candidate.padded_tokens as f64 / baseline.padded_tokens.max(1) as f64
    }
}

/// The deterministic stand-in for device memory on CPU: 4 KiB per padded token
/// (activations of a small transformer) plus 64 bytes per attention score
/// (`batch_size * max_len²`). Documented so tests of memory-aware batching are
/// reproducible without a GPU.
pub fn cpu_memory_proxy(features: &BatchFeatures) -> u64 {
    let attention = features.batch_size as u64 * (features.max_len as u64).pow(2);
    4096 * features.padded_tokens as u64 + 64 * attention
}

/// Number of fitted coefficients: bytes = c0 + c1·padded_tokens + c2·batch·max_len².
const TERMS: usize = 3;

fn terms(f: &BatchFeatures) -> [f64; TERMS] {
    [
        1.0,
        f.padded_tokens as f64,
        f.batch_size as f64 * (f.max_len as f64).powi(2),
    ]
}

/// A memory model fitted online by (relative-error weighted) least squares on
/// `bytes = c0 + c1·padded_tokens + c2·batch_size·max_len²`, refitted at every
/// observation, with a safety margin: predictions are raised by the configured
/// margin plus the largest relative under-prediction seen so far. Until it has
/// enough observations it answers like the padded-tokens prior.
#[derive(Debug, Clone)]
pub struct OnlineMemoryModel {
    /// What the model is: a checkpoint saves and restores it whole.
    state: OnlineMemoryState,
}

impl OnlineMemoryModel {
    /// A model whose predictions carry `margin` (e.g. `0.05` = 5 %) on top of the fit.
    pub fn new(margin: f64) -> Self {
        Self {
            state: OnlineMemoryState {
                margin: margin.max(0.0),
                xtx: [[0.0; TERMS]; TERMS],
                xty: [0.0; TERMS],
                observations: Vec::new(),
                coefficients: None,
                worst_under: 0.0,
            },
        }
    }

    /// Observations so far.
    pub fn len(&self) -> usize {
        self.state.observations.len()
    }

    /// Whether nothing was observed yet.
    pub fn is_empty(&self) -> bool {
        self.state.observations.is_empty()
    }

    /// Predicted peak bytes of a batch, margin included (None before a fit).
    pub fn predict_bytes(&self, f: &BatchFeatures) -> Option<f64> {
        let c = self.state.coefficients?;
        let fit: f64 = terms(f).iter().zip(c).map(|(x, c)| x * c).sum();
        Some(fit.max(0.0) * (1.0 + self.state.margin + self.state.worst_under))
    }

    /// The fitted coefficients (`c0, c1, c2`), once there are enough observations.
    pub fn coefficients(&self) -> Option<[f64; TERMS]> {
        self.state.coefficients
    }

    /// The total relative margin currently applied.
    pub fn margin(&self) -> f64 {
        self.state.margin + self.state.worst_under
    }

    fn refit(&mut self) {
        // A small relative ridge keeps the system solvable while features are
        // nearly collinear (e.g. all batches of one length).
        let mut a = self.state.xtx;
        for (i, row) in a.iter_mut().enumerate() {
            row[i] *= 1.0 + 1e-9;
        }
        self.state.coefficients = solve(a, self.state.xty);
        if let Some(c) = self.state.coefficients {
            self.state.worst_under = (self.state.observations)
                .iter()
                .map(|(x, y)| {
                    let fit: f64 = x.iter().zip(c).map(|(x, c)| x * c).sum();
                    if *y > 0.0 {
                        ((y - fit) / y).max(0.0)
                    } else {
                        0.0
                    }
                })
                .fold(0.0, f64::max);
        }
    }
}

/// Everything an [`OnlineMemoryModel`] holds, for checkpoints: a restored model
/// continues exactly as the saved one would have (the same refits, the same margin).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OnlineMemoryState {
    margin: f64,
    xtx: [[f64; TERMS]; TERMS],
    xty: [f64; TERMS],
    observations: Vec<([f64; TERMS], f64)>,
    coefficients: Option<[f64; TERMS]>,
    worst_under: f64,
}

impl OnlineMemoryModel {
    /// The whole state, for a checkpoint.
    pub fn state(&self) -> OnlineMemoryState {
        self.state.clone()
    }

    /// The model a checkpoint's [`OnlineMemoryModel::state`] describes.
    pub fn from_state(state: &OnlineMemoryState) -> Self {
        Self {
            state: state.clone(),
        }
    }

    /// The fit as plain numbers (`[has_fit, c0, c1, c2, margin]`), to share with
    /// other ranks.
    pub fn snapshot(&self) -> [f64; 5] {
        match self.state.coefficients {
            Some([c0, c1, c2]) => [1.0, c0, c1, c2, self.margin()],
            None => [0.0, 0.0, 0.0, 0.0, self.state.margin],
        }
    }

    /// A frozen model from [`OnlineMemoryModel::snapshot`].
    pub fn from_snapshot(s: [f64; 5]) -> Self {
        let mut model = Self::new(s[4]);
        if s[0] > 0.0 {
            model.state.coefficients = Some([s[1], s[2], s[3]]);
        }
        model
    }
}

/// Numbers in [`OnlineMemoryState::to_numbers`] before the observations.
const STATE_HEADER: usize = 1 + TERMS * TERMS + TERMS + 1 + TERMS + 1;

impl OnlineMemoryState {
    /// The state as plain numbers, exactly (to gather every rank's over an
    /// all-reduce): margin, sums, fit, worst under-prediction, then the
    /// observations.
    pub(crate) fn to_numbers(&self) -> Vec<f64> {
        let mut numbers = Vec::with_capacity(STATE_HEADER + self.observations.len() * (TERMS + 1));
        numbers.push(self.margin);
        numbers.extend(self.xtx.iter().flatten());
        numbers.extend(self.xty);
        numbers.push(f64::from(u8::from(self.coefficients.is_some())));
        numbers.extend(self.coefficients.unwrap_or([0.0; TERMS]));
        numbers.push(self.worst_under);
        for (x, y) in &self.observations {
            numbers.extend(x);
            numbers.push(*y);
        }
        numbers
    }

    /// The state [`OnlineMemoryState::to_numbers`] wrote; `None` if the numbers
    /// cannot be one.
    pub(crate) fn from_numbers(numbers: &[f64]) -> Option<Self> {
        if numbers.len() < STATE_HEADER || (numbers.len() - STATE_HEADER) % (TERMS + 1) != 0 {
            return None;
        }
        let (header, observations) = numbers.split_at(STATE_HEADER);
        let array = |at: usize| -> [f64; TERMS] { std::array::from_fn(|i| header[at + i]) };
        let fit_at = 1 + TERMS * TERMS + TERMS;
        Some(Self {
            margin: header[0],
            xtx: std::array::from_fn(|i| array(1 + i * TERMS)),
            xty: array(1 + TERMS * TERMS),
            coefficients: (header[fit_at] > 0.0).then(|| array(fit_at + 1)),
            worst_under: header[STATE_HEADER - 1],
            observations: observations
                .chunks(TERMS + 1)
                .map(|o| (std::array::from_fn(|i| o[i]), o[TERMS]))
                .collect(),
        })
    }
}

/// The largest prediction of several models: what every rank agrees on when each
/// fitted its own model to its own measurements.
#[derive(Debug, Clone)]
pub struct MostConservative(pub Vec<OnlineMemoryModel>);

impl MemoryModel for MostConservative {
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64 {
        self.0
            .iter()
            .map(|m| m.predict(candidate, baseline))
            .fold(f64::NEG_INFINITY, f64::max)
    }
}

impl MemoryModel for OnlineMemoryModel {
    fn predict(&self, candidate: &BatchFeatures, baseline: &BatchFeatures) -> f64 {
        match (self.predict_bytes(candidate), self.predict_bytes(baseline)) {
            // The baseline's own margin would cancel out: compare against its fit.
            (Some(c), Some(b)) if b > 0.0 => c / (b / (1.0 + self.margin())),
            _ => PaddedTokens.predict(candidate, baseline) * (1.0 + self.state.margin),
        }
    }

    fn observe(&mut self, features: &BatchFeatures, peak_bytes: u64) {
        let x = terms(features);
        let y = peak_bytes as f64;
        // Weighted by 1/y²: the fit minimises *relative* error, so small batches
        // (where a fixed cost dominates) are predicted as well as large ones.
        let w = 1.0 / y.max(1.0).powi(2);
        for i in 0..TERMS {
            for j in 0..TERMS {
                self.state.xtx[i][j] += w * x[i] * x[j];
            }
            self.state.xty[i] += w * x[i] * y;
        }
        self.state.observations.push((x, y));
        if self.state.observations.len() >= TERMS {
            self.refit();
        }
    }
}

/// Gaussian elimination with partial pivoting on a small dense system.
fn solve(mut a: [[f64; TERMS]; TERMS], mut b: [f64; TERMS]) -> Option<[f64; TERMS]> {
    for col in 0..TERMS {
        let pivot = (col..TERMS).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < f64::MIN_POSITIVE {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..TERMS {
            let factor = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (value, pivot_value) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *value -= factor * pivot_value;
            }
            b[row] -= factor * b[col];
        }
    }
    let mut x = [0.0; TERMS];
    for row in (0..TERMS).rev() {
        let tail: f64 = (row + 1..TERMS).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - tail) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_of_lengths() {
        let f = BatchFeatures::of_lengths([3, 7, 5]);
        assert_eq!(
            f,
            BatchFeatures {
                batch_size: 3,
                max_len: 7,
                token_sum: 15,
                padded_tokens: 21
            }
        );
        assert_eq!(f.padding(), 6);
    }

    #[test]
    fn padded_tokens_is_relative() {
        let base = BatchFeatures::of_lengths([10, 10]);
        assert_eq!(
            PaddedTokens.predict(&BatchFeatures::of_lengths([5, 5, 5, 5]), &base),
            1.0
        );
    }

    #[test]
    fn a_state_survives_its_numbers_exactly() {
        let mut model = OnlineMemoryModel::new(0.05);
        assert_eq!(
            OnlineMemoryState::from_numbers(&model.state().to_numbers()),
            Some(model.state())
        );
        for lengths in [&[3, 9][..], &[4, 4, 4], &[17], &[2, 5, 8, 11]] {
            let f = BatchFeatures::of_lengths(lengths.iter().copied());
            model.observe(&f, cpu_memory_proxy(&f) + 7 * f.token_sum as u64);
        }
        let state = model.state();
        assert!(state.coefficients.is_some() && state.observations.len() == 4);
        assert_eq!(
            OnlineMemoryState::from_numbers(&state.to_numbers()),
            Some(state.clone())
        );
        let numbers = state.to_numbers();
        assert_eq!(OnlineMemoryState::from_numbers(&numbers[1..]), None);
        assert_eq!(OnlineMemoryState::from_numbers(&numbers[..3]), None);
    }

    #[test]
    fn solver_recovers_coefficients() {
        let a = [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]];
        let x = [1.0, -2.0, 0.5];
        let b = [0.0, 1.0, 2.0].map(|i: f64| (0..3).map(|k| a[i as usize][k] * x[k]).sum());
        let got = solve(a, b).unwrap();
        for (g, e) in got.iter().zip(x) {
            assert!((g - e).abs() < 1e-12);
        }
    }
}
