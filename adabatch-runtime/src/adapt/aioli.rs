//! Aioli (Chen et al. 2024, "Aioli: A unified optimization framework for language
//! model data mixing", arXiv 2411.05735): a mixer that estimates, while training
//! runs, what training on each domain does to the loss of every domain, and moves
//! the mixture towards the domains that lower the total.
//!
//! **The mixing law.** Aioli's linear dynamic law: over a short stretch trained on
//! mixture `p`, domain `i`'s loss falls by `ΔL_i = Σ_j A_ij p_j`. `A_ij` is what
//! domain `j`'s data does to domain `i` (its own loss on the diagonal, transfer
//! off it).
//!
//! **LearnParams, online.** Each round of `round_steps` steps starts with one probe
//! per domain: `probe_steps` steps on mixture `e_k` (the probed domain `k` at share
//! `one_hot`, the others `(1 − one_hot) / (m − 1)` each). A probe's decrease of
//! each domain's loss is the least-squares slope of that domain's per-step
//! training loss over the probe (from its first step to the step after its last,
//! each step's loss being measured before its update), times its steps; it fills
//! column `k` of `G`. With `W` the matrix of the mixtures the probes trained on
//! (column `k` probe `k`'s), `G = A·W` and `A` solves it (Gaussian elimination).
//! As proposed, `W = c·I + d·11ᵀ` with `d = (1 − one_hot)/(m − 1)` and `c =
//! one_hot − d`, invertible for `one_hot > 1/2`; under a
//! [`ReplayBudget`](crate::ReplayBudget) the probes train on the capped
//! mixtures, and `W` is those ([`SourceStats::weights`]), so the law is that of
//! the data actually trained. When the proposed probes would give the old domains
//! more than the budget, they are replaced by probes inside it (the old domains
//! probed among themselves at the budget's share, each new one at half of it; see
//! `probe_within`), so that the cap does not make them alike and `W` stays
//! invertible. A round whose `W` is singular (two probes trained on the same
//! mixture) or whose losses are not finite leaves `p` as it was, and is counted
//! in the diagnostics' `skipped_rounds`. The probes run in turn without rolling
//! the model back (as the authors' online variant in their mixtera
//! implementation), their order rotated each round so that no domain is always
//! probed at the round's start.
//!
//! **The update.** `A` is normalised as the authors' `aioli_normalize_A`: shifted
//! by its smallest entry when that is negative, then divided by its sum (so `η`
//! does not depend on the loss's scale). Then `p_j ← p_j · exp(η Σ_i A_ij)`,
//! normalised: exponentiated gradient on the total loss. Between the probes of
//! one round and the next the run trains on `p` (uniform before the first
//! update). With [`AioliMixer::with_smoothing`] (the `ema` option of the mixtera
//! implementation) the normalised laws are averaged over rounds, `Ā ← s·Ā + (1 −
//! s)·A`, and `p_j ∝ exp(η Σ_i Ā_ij)` from uniform instead: one round's noisy
//! estimate then moves the mixture less, and errors do not compound.
//!
//! **A soft worst domain.** The paper's objective is the average loss, so the step
//! favours the domains whose data lowers the total most, which are often not the
//! worst. [`AioliMixer::with_worst_focus`] descends `Σ_i v_i L_i` instead, the
//! law's rows weighted by `v = m·softmax(L̄/τ)`, `L̄` each domain's mean training
//! loss over the round's probes (the group-DRO weights of DoReMi, Xie et al. 2023,
//! on the losses themselves): `p_j ← p_j · exp(η Σ_i v_i A_ij)`. As `τ → ∞` it
//! is the paper's step; a small `τ` follows the worst domain alone.
//!
//! **On held-out losses.** With [`AioliMixer::with_held_out`] a probe's decrease
//! of each domain's loss is read as the paper reads it: the domain's loss on the
//! run's held-out set (`--mixer-eval-examples` examples of each, the same every
//! time) before the probe minus after it, asked of the engine
//! ([`Mixer::wants_held_out`]) before a round's first probe and after each
//! probe: `m + 1` evaluations a round. A fixed set's loss moves only by what
//! training did, where the step's training losses move by 0.1–0.3 nats from
//! step to step on their own. The first step trains on `p` so that the first
//! probe has a loss before it (the engine evaluates after steps, not before the
//! first); the rounds follow one step later. `L̄` of the worst focus is then the
//! probes' held-out losses.
//!
//! **Counted in tokens, resumed exactly.** Its position is the step, which the
//! engine gives it; its state is `p`, the columns measured this round, the probe's
//! losses so far and the last `A`, all in the checkpoint. Every rank sees the same
//! all-reduced losses, so every rank decides alike, on any number of ranks.

use super::mixer::{field, numbers, trained_shares, Diagnostic, Mixer, SourceStats};
use crate::error::{Error, Result, SettingsError};

/// The Aioli mixer (see the module documentation).
#[derive(Debug, Clone)]
pub struct AioliMixer {
    round_steps: usize,
    probe_steps: usize,
    one_hot: f64,
    eta: f64,
    /// The mixture between probes, `p`.
    mixture: Vec<f64>,
    /// `G`, row-major: `G[i][k]` the decrease of domain `i`'s loss over the probe
    /// of `k`, this round.
    measured: Vec<f64>,
    /// Per-step losses (one per domain) of the probe being measured.
    window: Vec<Vec<f64>>,
    /// The last estimate of `A`, row-major (empty before the first).
    law: Vec<f64>,
    /// The average of the normalised laws, `Ā` (with smoothing; empty before the
    /// first).
    smoothed: Vec<f64>,
    /// `s`, the weight of the past in `Ā` (`None`: the paper's compounding step).
    smoothing: Option<f64>,
    /// `τ` of the loss-weighted rows (`None`: the paper's average).
    worst_focus: Option<f64>,
    /// Each domain's summed per-probe mean training loss this round.
    round_loss: Vec<f64>,
    /// `W`, row-major: `W[j][k]` domain `j`'s share in the mixture probe `k`
    /// trained on, this round (empty: the proposed probe mixtures).
    probes: Vec<f64>,
    /// Whether probes are read on held-out losses ([`AioliMixer::with_held_out`]).
    held_out: bool,
    /// With held-out losses: the last ones read (before the next probe).
    before: Vec<f64>,
    /// A replay budget's cap: the new sources, and the old ones' greatest share.
    cap: Option<(Vec<String>, f64)>,
    /// Under a cap, which domains are new (set from the first step's names).
    is_new: Vec<bool>,
    /// Rounds whose `W` was singular or whose losses were not finite: `p` kept.
    skipped_rounds: usize,
}

impl AioliMixer {
    /// Rounds of `round_steps` steps, each opening with one probe of
    /// `probe_steps` steps (≥ 2) per domain at share `one_hot` (in `(1/2, 1]`:
    /// `W` must be invertible for any number of domains), step size `eta` (finite,
    /// ≥ 0). A round too short for its probes is lengthened to hold them and one
    /// step on `p`. A typed error names a setting out of range.
    pub fn new(round_steps: usize, probe_steps: usize, one_hot: f64, eta: f64) -> Result<Self> {
        let invalid = |name, value: String, expected| {
            Err(Error::Settings(SettingsError::InvalidSetting {
                name,
                value,
                expected,
            }))
        };
        if probe_steps < 2 {
            return invalid(
                "aioli probe_steps",
                probe_steps.to_string(),
                "at least 2 steps (a slope)",
            );
        }
        if !(one_hot > 0.5 && one_hot <= 1.0) {
            return invalid(
                "aioli one_hot",
                one_hot.to_string(),
                "a share above 1/2, at most 1",
            );
        }
        if !(eta.is_finite() && eta >= 0.0) {
            return invalid("aioli eta", eta.to_string(), "a finite step size >= 0");
        }
        Ok(Self {
            round_steps,
            probe_steps,
            one_hot,
            eta,
            mixture: Vec::new(),
            measured: Vec::new(),
            window: Vec::new(),
            law: Vec::new(),
            smoothed: Vec::new(),
            smoothing: None,
            worst_focus: None,
            round_loss: Vec::new(),
            probes: Vec::new(),
            held_out: false,
            before: Vec::new(),
            cap: None,
            is_new: Vec::new(),
            skipped_rounds: 0,
        })
    }

    /// The same mixer with the normalised laws averaged over rounds (weight `s` of
    /// the past, in `[0, 1)`; clamped) and `p` computed from uniform by the
    /// average (see the module documentation).
    pub fn with_smoothing(mut self, s: f64) -> Self {
        self.smoothing = Some(if s.is_finite() {
            s.clamp(0.0, 0.999)
        } else {
            0.0
        });
        self
    }

    /// The same mixer descending a soft worst domain: the law's rows weighted by
    /// `m·softmax(L̄/τ)` of the domains' mean training losses over the round's
    /// probes, at temperature `temperature` (in nats; see the module
    /// documentation). A typed error for a temperature not finite and > 0.
    pub fn with_worst_focus(mut self, temperature: f64) -> Result<Self> {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "aioli worst_focus",
                value: temperature.to_string(),
                expected: "a temperature in nats, finite and > 0",
            }));
        }
        self.worst_focus = Some(temperature);
        Ok(self)
    }

    /// The same mixer reading each probe on held-out losses, before it and
    /// after it, as the paper does (see the module documentation): the run needs
    /// a held-out set (`--mixer-eval-examples`).
    pub fn with_held_out(mut self) -> Self {
        self.held_out = true;
        self
    }

    /// The mixture `p` trained between probes.
    pub fn mixture(&self) -> &[f64] {
        &self.mixture
    }

    /// The last estimate of the mixing law `A`, row-major (`A[i][j]`: the fall of
    /// domain `i`'s loss per unit share of domain `j` over a probe), before its
    /// normalisation; empty before the first round ends.
    pub fn mixing_law(&self) -> &[f64] {
        &self.law
    }

    /// Steps of a round for `m` domains.
    fn round_of(&self, m: usize) -> usize {
        self.round_steps.max(m * self.probe_steps + 1)
    }

    /// The probe that step `step` (from 1) belongs to, `(probe in the round,
    /// domain probed)`, or `None` on `p`. On held-out losses the rounds start
    /// one step later.
    fn probe_at(&self, step: usize, m: usize) -> Option<(usize, usize)> {
        let lead = usize::from(self.held_out);
        if step <= lead {
            return None;
        }
        let round = self.round_of(m);
        let (r, q) = ((step - 1 - lead) / round, (step - 1 - lead) % round);
        let probe = q / self.probe_steps;
        (probe < m).then_some((probe, (probe + r) % m))
    }

    /// The probe mixture of domain `k`: within a replay budget's cap when the
    /// proposed probes exceed it.
    fn probe_mixture(&self, k: usize, m: usize) -> Vec<f64> {
        if let Some(budget) = self.binding_cap(m) {
            return self.probe_within(k, budget);
        }
        let other = (1.0 - self.one_hot) / (m - 1).max(1) as f64;
        (0..m)
            .map(|j| if j == k { self.one_hot } else { other })
            .collect()
    }

    /// The cap on the old domains' share, when some proposed probe exceeds it
    /// and there are old and new domains to probe apart.
    fn binding_cap(&self, m: usize) -> Option<f64> {
        let (_, budget) = self.cap.as_ref()?;
        let new = self.is_new.iter().filter(|&&n| n).count();
        let old = m - new;
        if self.is_new.len() != m || new == 0 || old == 0 {
            return None;
        }
        // The most old share a proposed probe asks: probing an old domain.
        let other = (1.0 - self.one_hot) / (m - 1) as f64;
        (self.one_hot + (old - 1) as f64 * other > *budget).then_some(*budget)
    }

    /// A probe inside the cap: probing an old domain, the old side takes all of
    /// `budget`; probing a new one, half of it. Within the probed side the
    /// probed domain takes `one_hot` of the side's share and the others split
    /// the rest; the other side splits its share evenly. These `m` mixtures are
    /// linearly independent for any `budget` in `(0, 1)`, so `W` is invertible.
    fn probe_within(&self, k: usize, budget: f64) -> Vec<f64> {
        let old_share = if self.is_new[k] { budget / 2.0 } else { budget };
        let side_share = |new: bool| if new { 1.0 - old_share } else { old_share };
        let side_count = |new: bool| self.is_new.iter().filter(|&&n| n == new).count() as f64;
        (0..self.is_new.len())
            .map(|j| {
                let (side, count) = (self.is_new[j], side_count(self.is_new[j]));
                match (j == k, side == self.is_new[k]) {
                    (true, _) if count == 1.0 => side_share(side),
                    (true, _) => side_share(side) * self.one_hot,
                    (false, true) => side_share(side) * (1.0 - self.one_hot) / (count - 1.0),
                    (false, false) => side_share(side) / count,
                }
            })
            .collect()
    }

    /// `W` as proposed: column `k` the probe mixture of domain `k`.
    fn proposed_probes(&self, m: usize) -> Vec<f64> {
        (0..m * m)
            .map(|jk| self.probe_mixture(jk % m, m)[jk / m])
            .collect()
    }

    /// Whether held-out losses are read after step `step`: before a probe, and
    /// after each.
    fn reads_held_out_after(&self, step: usize, m: usize) -> bool {
        let (now, next) = (self.probe_at(step, m), self.probe_at(step + 1, m));
        self.held_out && m >= 2 && step >= 1 && now != next && (now.is_some() || next.is_some())
    }

    /// Notes the shares a probe step trained on (`W`'s column).
    fn note_probe_shares(&mut self, step: usize, weights: &[f64]) {
        let m = self.mixture.len();
        if let Some((_, k)) = self.probe_at(step, m) {
            if self.probes.len() != m * m {
                self.probes = self.proposed_probes(m);
            }
            let trained = trained_shares(weights, &self.probe_mixture(k, m));
            for (j, share) in trained.into_iter().enumerate() {
                self.probes[j * m + k] = share;
            }
        }
    }

    /// On held-out losses: after step `step`, `held_out` (when given) closes
    /// the probe that ended with it (column `k` of `G`: the losses before it
    /// minus these) and is the loss before the next. A probe closed without
    /// them, or without losses before it, measures nothing: its round leaves `p`
    /// as it was.
    fn observe_held_out(&mut self, step: usize, held_out: Option<&[f64]>, weights: &[f64]) {
        let m = self.mixture.len();
        self.note_probe_shares(step, weights);
        if !self.reads_held_out_after(step, m) {
            return;
        }
        let after = held_out.filter(|h| h.len() == m).map(<[f64]>::to_vec);
        if let Some((probe, k)) = self.probe_at(step, m) {
            for i in 0..m {
                let (before, now) = (self.before.get(i), after.as_ref().map(|a| a[i]));
                self.measured[i * m + k] = match (before, now) {
                    (Some(b), Some(a)) => b - a,
                    _ => f64::NAN,
                };
                self.round_loss[i] += now.unwrap_or(f64::NAN);
            }
            if probe + 1 == m {
                self.update();
            }
        }
        self.before = after.unwrap_or_default();
    }

    /// Takes in the losses of step `step`, trained on `weights`, closing a probe
    /// when its window is complete (and a round's LearnParams after its last
    /// probe).
    fn observe(&mut self, step: usize, loss: &[f64], weights: &[f64]) {
        let m = self.mixture.len();
        self.note_probe_shares(step, weights);
        let closing = (step > 1)
            .then(|| self.probe_at(step - 1, m))
            .flatten()
            .filter(|_| self.probe_at(step, m) != self.probe_at(step - 1, m));
        if let Some((probe, k)) = closing {
            self.window.push(loss.to_vec());
            let span = (self.window.len() - 1) as f64;
            for i in 0..m {
                let series: Vec<f64> = self.window.iter().map(|l| l[i]).collect();
                self.measured[i * m + k] = -slope(&series) * span;
                self.round_loss[i] += mean_finite(&series);
            }
            self.window.clear();
            if probe + 1 == m {
                self.update();
            }
        }
        if self.probe_at(step, m).is_some() {
            self.window.push(loss.to_vec());
        }
    }

    /// `A` from `G = A·W`, normalised, and the exponentiated-gradient step on
    /// `p`; a singular `W` skips the step.
    fn update(&mut self) {
        let m = self.mixture.len();
        let probes = match self.probes.len() == m * m {
            true => std::mem::take(&mut self.probes),
            false => self.proposed_probes(m),
        };
        let measured = self.measured.iter().all(|g| g.is_finite());
        let Some(law) = solve_law(&self.measured, &probes, m).filter(|_| measured) else {
            self.skipped_rounds += 1;
            self.measured.iter_mut().for_each(|g| *g = 0.0);
            self.round_loss.iter_mut().for_each(|l| *l = 0.0);
            return;
        };
        self.law = law;
        let mut normalised = normalise(&self.law);
        if let Some(s) = self.smoothing {
            if self.smoothed.len() == normalised.len() {
                for (mean, a) in self.smoothed.iter_mut().zip(&normalised) {
                    *mean = s * *mean + (1.0 - s) * a;
                }
            } else {
                self.smoothed = normalised;
            }
            normalised = self.smoothed.clone();
            self.mixture.iter_mut().for_each(|p| *p = 1.0);
        }
        let rows = self.row_weights();
        for (j, p) in self.mixture.iter_mut().enumerate() {
            let gain: f64 = (0..m).map(|i| rows[i] * normalised[i * m + j]).sum();
            *p *= (self.eta * gain).exp();
        }
        let total: f64 = self.mixture.iter().sum();
        self.mixture.iter_mut().for_each(|p| *p /= total);
        self.measured.iter_mut().for_each(|g| *g = 0.0);
        self.round_loss.iter_mut().for_each(|l| *l = 0.0);
    }

    /// `v`: 1 for every domain (the paper's average), or `m·softmax(L̄/τ)` with
    /// a worst focus. A domain with no finite loss this round weighs as the
    /// lightest (no evidence that it is the worst).
    fn row_weights(&self) -> Vec<f64> {
        let m = self.mixture.len();
        let Some(tau) = self.worst_focus else {
            return vec![1.0; m];
        };
        let finite: Vec<f64> = self
            .round_loss
            .iter()
            .copied()
            .filter(|l| l.is_finite())
            .collect();
        if finite.is_empty() {
            return vec![1.0; m];
        }
        let low = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let high = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        // The sums hold one mean per probe: m of them.
        let exps: Vec<f64> = self
            .round_loss
            .iter()
            .map(|&l| if l.is_finite() { l } else { low })
            .map(|l| ((l - high) / (m as f64 * tau)).exp())
            .collect();
        let total: f64 = exps.iter().sum();
        exps.iter().map(|e| m as f64 * e / total).collect()
    }
}

/// `A` (row-major) with `A·W = G`, `W` and `G` row-major `m × m`: each row `a` of
/// `A` solves `Wᵀ·aᵀ = gᵀ`, by Gaussian elimination with partial pivoting on
/// `Wᵀ` (`m` is the number of domains: a handful). `None` when `W` is singular.
fn solve_law(g: &[f64], w: &[f64], m: usize) -> Option<Vec<f64>> {
    // Augmented [Wᵀ | Gᵀ]: row r holds W[.][r] then G[.][r].
    let mut rows: Vec<Vec<f64>> = (0..m)
        .map(|r| {
            (0..m)
                .map(|c| w[c * m + r])
                .chain((0..m).map(|i| g[i * m + r]))
                .collect()
        })
        .collect();
    for col in 0..m {
        let pivot = (col..m).max_by(|&a, &b| rows[a][col].abs().total_cmp(&rows[b][col].abs()))?;
        // Shares are finite; a NaN one (a damaged checkpoint) counts as singular.
        if rows[pivot][col].abs().is_nan() || rows[pivot][col].abs() <= 1e-12 {
            return None;
        }
        rows.swap(col, pivot);
        let head = rows[col].clone();
        for (_, row) in rows.iter_mut().enumerate().filter(|(r, _)| *r != col) {
            let factor = row[col] / head[col];
            row.iter_mut()
                .zip(&head)
                .for_each(|(x, h)| *x -= factor * h);
        }
    }
    // Row r of the reduced system: W-part diagonal, Gᵀ-part column i: A[i][r].
    let mut law = vec![0.0; m * m];
    for (r, row) in rows.iter().enumerate() {
        for i in 0..m {
            law[i * m + r] = row[m + i] / row[r];
        }
    }
    Some(law)
}

/// Aioli's `aioli_normalize_A`: shifted by the smallest entry when negative,
/// then scaled to sum 1 (unchanged when all are 0).
fn normalise(law: &[f64]) -> Vec<f64> {
    let min = law.iter().copied().fold(f64::INFINITY, f64::min);
    let shifted: Vec<f64> = law.iter().map(|a| a - min.min(0.0)).collect();
    let total: f64 = shifted.iter().sum();
    if total > 0.0 && total.is_finite() {
        shifted.iter().map(|a| a / total).collect()
    } else {
        vec![0.0; law.len()]
    }
}

/// The mean of the finite points of `series` (NaN with none).
fn mean_finite(series: &[f64]) -> f64 {
    let finite: Vec<f64> = series.iter().copied().filter(|y| y.is_finite()).collect();
    finite.iter().sum::<f64>() / finite.len() as f64
}

/// The least-squares slope of `series` against its index, over its finite
/// points (0 with fewer than two).
fn slope(series: &[f64]) -> f64 {
    let points: Vec<(f64, f64)> = series
        .iter()
        .enumerate()
        .filter(|(_, y)| y.is_finite())
        .map(|(x, &y)| (x as f64, y))
        .collect();
    if points.len() < 2 {
        return 0.0;
    }
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    sxy / sxx
}

impl Default for AioliMixer {
    /// Rounds of 50 steps, probes of 4 steps at share 0.6, `η` = 2.
    fn default() -> Self {
        Self::new(50, 4, 0.6, 2.0).expect("the defaults are in range")
    }
}

impl Mixer for AioliMixer {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let m = stats.names.len();
        // Also after a restore, which brings the mixture but not the names.
        if let Some((new_sources, _)) = self.cap.as_ref().filter(|_| self.is_new.len() != m) {
            self.is_new = stats
                .names
                .iter()
                .map(|n| new_sources.contains(n))
                .collect();
        }
        if self.mixture.len() != m {
            self.mixture = vec![1.0 / m as f64; m];
            self.measured = vec![0.0; m * m];
            self.round_loss = vec![0.0; m];
            self.probes.clear();
            self.window.clear();
        }
        if m < 2 {
            return self.mixture.clone();
        }
        if stats.step > 0 && self.held_out {
            self.observe_held_out(stats.step, stats.held_out, stats.weights);
        } else if stats.step > 0 {
            self.observe(stats.step, stats.loss, stats.weights);
        }
        match self.probe_at(stats.step + 1, m) {
            Some((_, k)) => self.probe_mixture(k, m),
            None => self.mixture.clone(),
        }
    }

    fn wants_held_out(&self, step: usize) -> bool {
        self.reads_held_out_after(step, self.mixture.len())
    }

    /// Under a budget of 0 the old domains never train: no probe can measure them.
    fn check_sources(&self, _names: &[String]) -> std::result::Result<(), String> {
        match &self.cap {
            Some((_, budget)) if *budget <= 0.0 => Err(
                "aioli cannot measure the old sources under a replay budget of 0 (they never \
                 train): give a budget above 0, or use another mixer"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    fn keep_old_share_within(&mut self, new_sources: &[String], budget: f64) {
        self.cap = Some((new_sources.to_vec(), budget));
    }

    /// The mixture `p` between probes, the last law `A` (empty before the first
    /// round ends), this round's mean losses over the probes so far, and on
    /// held-out losses the last ones read.
    fn diagnostics(&self) -> Vec<(&'static str, Diagnostic)> {
        let mut out = vec![("mixture", Diagnostic::PerSource(self.mixture.clone()))];
        if !self.law.is_empty() {
            out.push(("law", Diagnostic::PerPair(self.law.clone())));
        }
        if !self.before.is_empty() {
            out.push(("held_out", Diagnostic::PerSource(self.before.clone())));
        }
        out.push(("round_loss", Diagnostic::PerSource(self.round_loss.clone())));
        if self.skipped_rounds > 0 {
            out.push((
                "skipped_rounds",
                Diagnostic::Scalar(self.skipped_rounds as f64),
            ));
        }
        out
    }

    fn state(&self) -> Option<serde_json::Value> {
        let nan_free = |v: &[f64]| -> Vec<Option<f64>> {
            v.iter().map(|x| x.is_finite().then_some(*x)).collect()
        };
        Some(serde_json::json!({
            "mixture": self.mixture,
            "measured": self.measured,
            "window": self.window.iter().map(|l| nan_free(l)).collect::<Vec<_>>(),
            "law": self.law,
            "smoothed": self.smoothed,
            "round_loss": nan_free(&self.round_loss),
            "probes": self.probes,
            "before": nan_free(&self.before),
            "skipped_rounds": self.skipped_rounds,
        }))
    }

    fn restore(&mut self, state: &serde_json::Value) -> std::result::Result<(), String> {
        let mixture = numbers(field(state, "mixture")?)?;
        let measured = numbers(field(state, "measured")?)?;
        let law = numbers(field(state, "law")?)?;
        let optional = |name| match state.get(name) {
            Some(value) => numbers(value),
            None => Ok(Vec::new()),
        };
        let smoothed = optional("smoothed")?;
        let probes = optional("probes")?;
        let before = optional("before")?;
        let mut round_loss = optional("round_loss")?;
        let window = field(state, "window")?
            .as_array()
            .ok_or("`window` is not a list")?
            .iter()
            .map(numbers)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let m = mixture.len();
        if round_loss.is_empty() {
            round_loss = vec![0.0; m];
        }
        let square = |v: &[f64]| v.is_empty() || v.len() == m * m;
        if measured.len() != m * m
            || !square(&law)
            || !square(&smoothed)
            || !square(&probes)
            || window.iter().any(|l| l.len() != m)
            || round_loss.len() != m
            || !(before.is_empty() || before.len() == m)
        {
            return Err(format!("does not hold {m} domains' numbers throughout"));
        }
        (self.mixture, self.measured, self.window) = (mixture, measured, window);
        (self.law, self.smoothed, self.round_loss) = (law, smoothed, round_loss);
        (self.probes, self.before) = (probes, before);
        self.skipped_rounds = match state.get("skipped_rounds") {
            None => 0,
            Some(count) => count.as_u64().ok_or("`skipped_rounds` is not a count")? as usize,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt::mixer::MixUnit;

    fn stats<'a>(step: usize, names: &'a [String], loss: &'a [f64]) -> SourceStats<'a> {
        SourceStats {
            loss,
            source_tokens: &[10, 10, 10],
            seen: &[0, 0, 0],
            positions: &[0, 0, 0],
            sizes: &[10, 10, 10],
            weights: &[1.0, 1.0, 1.0],
            ..SourceStats::blank(step, names, MixUnit::Tokens)
        }
    }

    #[test]
    fn slope_is_least_squares_over_finite_points() {
        assert!((slope(&[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        // y = 1, 3, 2 at x = 0, 1, 2: slope 0.5.
        assert!((slope(&[1.0, 3.0, 2.0]) - 0.5).abs() < 1e-12);
        assert_eq!(slope(&[f64::NAN, 2.0]), 0.0);
        assert!((slope(&[4.0, f64::NAN, 2.0]) + 1.0).abs() < 1e-12);
    }

    /// Two domains, probes of 2 steps at share 0.75 (`W = [[.75, .25], [.25,
    /// .75]]`), rounds of 5 steps: steps 1–2 probe domain 0, 3–4 domain 1, 5 on
    /// `p`. The losses fall as a known `A` says, so LearnParams must recover it;
    /// then `p` moves by Aioli's exponentiated gradient, by hand.
    #[test]
    fn recovers_a_known_mixing_law_and_takes_the_papers_step() {
        let names = vec!["a".to_string(), "b".to_string()];
        let truth = [[0.4, 0.1], [0.0, 0.2]];
        let mut mixer = AioliMixer::new(5, 2, 0.75, 1.0).unwrap();
        let mut loss = [5.0, 6.0];
        let mut given = vec![mixer.weights(&stats(0, &names, &[f64::NAN; 2]))];
        for step in 1..=5 {
            // Step `step` trained on the mixture given before it; its loss was
            // measured before its update.
            let observed = loss;
            let p = given.last().unwrap().clone();
            for (i, row) in truth.iter().enumerate() {
                loss[i] -= row[0] * p[0] + row[1] * p[1];
            }
            given.push(mixer.weights(&stats(step, &names, &observed)));
        }
        assert_eq!(given[0], [0.75, 0.25]);
        assert_eq!(given[2], [0.25, 0.75]);
        assert_eq!(given[4], [0.5, 0.5], "step 5 trains on p");
        // Each probe lasts 2 steps: the law is per 2 steps.
        let law = mixer.mixing_law();
        for (got, want) in law.iter().zip(truth.iter().flatten()) {
            assert!((got - 2.0 * want).abs() < 1e-9, "{law:?}");
        }
        // Normalised A = [.8, .2, 0, .4] / 1.4; column sums 0.8/1.4 and 0.6/1.4.
        let (g0, g1): (f64, f64) = (0.8 / 1.4, 0.6 / 1.4);
        let (w0, w1) = (g0.exp(), g1.exp());
        let p = mixer.mixture();
        assert!((p[0] - w0 / (w0 + w1)).abs() < 1e-12, "{p:?}");
        // Round 2 probes in the rotated order: domain 1 first.
        assert_eq!(given[5], [0.25, 0.75]);
        // Its diagnostics show the law and the mixture it decided from.
        let diagnostics = mixer.diagnostics();
        assert!(diagnostics.contains(&("law", Diagnostic::PerPair(law.to_vec()))));
        assert!(diagnostics.contains(&("mixture", Diagnostic::PerSource(p.to_vec()))));
    }

    /// Three domains: the closed-form `W⁻¹` against solving `G = A·W` by hand,
    /// and a shifted normalisation when `A` has a negative entry.
    #[test]
    fn three_domains_invert_the_probe_mixtures() {
        let mut mixer = AioliMixer::new(20, 2, 0.6, 0.5).unwrap();
        mixer.mixture = vec![0.2, 0.3, 0.5];
        // A = [[1, 0, 0], [0, 2, -1], [0, 0, 3]] and W (0.6 / 0.2): G = A·W.
        let a = [[1.0, 0.0, 0.0], [0.0, 2.0, -1.0], [0.0, 0.0, 3.0]];
        let w = |j: usize, k: usize| if j == k { 0.6 } else { 0.2 };
        mixer.measured = (0..9)
            .map(|ik| (0..3).map(|j| a[ik / 3][j] * w(j, ik % 3)).sum())
            .collect();
        mixer.update();
        for (got, want) in mixer.mixing_law().iter().zip(a.iter().flatten()) {
            assert!((got - want).abs() < 1e-12);
        }
        // Shifted by 1: [[2, 1, 1], [1, 3, 0], [1, 1, 4]], sum 14, column sums
        // (4, 5, 5) / 14.
        let raw: Vec<f64> = [0.2, 0.3, 0.5]
            .iter()
            .zip([4.0, 5.0, 5.0])
            .map(|(p, g): (&f64, f64)| p * (0.5 * g / 14.0).exp())
            .collect();
        let total: f64 = raw.iter().sum();
        for (got, want) in mixer.mixture().iter().zip(&raw) {
            assert!((got - want / total).abs() < 1e-12);
        }
        assert!(
            mixer.measured.iter().all(|g| *g == 0.0),
            "a new round starts"
        );
    }

    /// With smoothing: the first round's normalised law is the average, the second
    /// mixes in at `1 − s`, and `p` comes from uniform each time.
    #[test]
    fn smoothing_averages_the_laws_and_starts_from_uniform() {
        let mut mixer = AioliMixer::new(5, 2, 0.75, 1.0)
            .unwrap()
            .with_smoothing(0.5);
        mixer.mixture = vec![0.9, 0.1];
        // G = A·W with A = [[1, 0], [0, 1]]: the identity, normalised to 0.5 each.
        let w = [[0.75, 0.25], [0.25, 0.75]];
        mixer.measured = vec![w[0][0], w[0][1], w[1][0], w[1][1]];
        mixer.update();
        assert_eq!(mixer.mixture(), [0.5, 0.5], "equal gains from uniform");
        // A = [[1, 0], [1, 0]]: normalised [[.5, 0], [.5, 0]]; averaged with the
        // identity's [[.5, 0], [0, .5]] at 0.5: [[.5, 0], [.25, .25]].
        mixer.measured = vec![w[0][0], w[0][1], w[0][0], w[0][1]];
        mixer.update();
        let (g0, g1): (f64, f64) = (0.75, 0.25);
        let p0 = g0.exp() / (g0.exp() + g1.exp());
        assert!(
            (mixer.mixture()[0] - p0).abs() < 1e-12,
            "{:?}",
            mixer.mixture()
        );
    }

    /// The soft worst domain: with `A` the identity (normalised to 0.5 on the
    /// diagonal), domain 0's mean loss 6 and domain 1's 5 over the round's two
    /// probes, `τ = 1`: `v = 2·softmax(6, 5)`, and `p_j ∝ exp(η·0.5·v_j)` from
    /// uniform, by hand. A huge `τ` is the paper's step.
    #[test]
    fn worst_focus_weights_the_laws_rows_by_a_softmax_of_the_losses() {
        let w = [0.75, 0.25, 0.25, 0.75];
        let focused = |tau: f64| {
            let mut mixer = AioliMixer::new(5, 2, 0.75, 1.0)
                .unwrap()
                .with_worst_focus(tau)
                .unwrap();
            mixer.mixture = vec![0.5, 0.5];
            mixer.measured = w.to_vec();
            mixer.round_loss = vec![2.0 * 6.0, 2.0 * 5.0];
            mixer.update();
            assert_eq!(mixer.round_loss, [0.0, 0.0], "a new round starts");
            mixer.mixture
        };
        let e = 1f64.exp();
        let v = [2.0 * e / (e + 1.0), 2.0 / (e + 1.0)];
        let (w0, w1) = ((0.5 * v[0]).exp(), (0.5 * v[1]).exp());
        let p = focused(1.0);
        assert!((p[0] - w0 / (w0 + w1)).abs() < 1e-12, "{p:?}");
        let paper = focused(1e12);
        assert!(
            (paper[0] - 0.5).abs() < 1e-9,
            "equal gains, as without a focus: {paper:?}"
        );
        // Through the probes: the round's losses are the means over each probe.
        let names = vec!["a".to_string(), "b".to_string()];
        let mut mixer = AioliMixer::new(5, 2, 0.75, 1.0)
            .unwrap()
            .with_worst_focus(1.0)
            .unwrap();
        mixer.weights(&stats(0, &names, &[f64::NAN; 2]));
        for (step, loss) in [[7.0, 5.0], [6.0, 5.0], [5.0, 5.5], [5.0, 5.0]]
            .iter()
            .enumerate()
        {
            mixer.weights(&stats(step + 1, &names, loss));
        }
        // Probe 1's window is steps 1–3 (closed by step 3's loss); probe 2's is open.
        let want = [(7.0 + 6.0 + 5.0) / 3.0, (5.0 + 5.0 + 5.5) / 3.0];
        for (got, want) in mixer.round_loss.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{:?}", mixer.round_loss);
        }
    }

    /// Two domains, probes of 2 steps at 75 %: `W = [[0.75, 0.25], [0.25, 0.75]]`.
    /// Held-out losses that fall by `G = A·W` over each probe, for
    /// `A = [[0.4, 0.1], [0.05, 0.3]]`: `G = [[0.325, 0.175], [0.1125, 0.2375]]`
    /// by hand. The mixer asks after step 1 (before the first probe) and after
    /// each probe (steps 3 and 5), recovers `A`, and asks nothing in between.
    #[test]
    fn held_out_losses_before_and_after_each_probe_give_the_law() {
        let names = vec!["a".to_string(), "b".to_string()];
        let mut mixer = AioliMixer::new(5, 2, 0.75, 1.0).unwrap().with_held_out();
        let g = [[0.325, 0.175], [0.1125, 0.2375]];
        let first = mixer.weights(&stats(0, &names, &[f64::NAN, f64::NAN]));
        assert_eq!(first, vec![0.5, 0.5], "the first step trains on p");
        let mut held = [5.0, 4.0];
        let mut trained = first;
        let mut asked = Vec::new();
        for step in 1..=6 {
            if mixer.wants_held_out(step) {
                asked.push(step);
            }
            // After each probe, the losses fall by its column of G.
            if let Some(k) = [(3, 0), (5, 1)]
                .iter()
                .find(|(s, _)| *s == step)
                .map(|p| p.1)
            {
                held = [held[0] - g[0][k], held[1] - g[1][k]];
            }
            let mut s = stats(step, &names, &[1.0, 1.0]);
            s.weights = &trained;
            let h = held;
            s.held_out = asked.contains(&step).then_some(&h[..]);
            trained = mixer.weights(&s);
            if step == 1 {
                assert_eq!(trained, vec![0.75, 0.25], "step 2 probes domain a");
            }
        }
        assert_eq!(asked, vec![1, 3, 5, 6]);
        let law = mixer.mixing_law();
        for (got, want) in law.iter().zip([0.4, 0.1, 0.05, 0.3]) {
            assert!((got - want).abs() < 1e-12, "{law:?}");
        }
        let restored = {
            let mut m = AioliMixer::new(5, 2, 0.75, 1.0).unwrap().with_held_out();
            m.restore(&mixer.state().unwrap()).unwrap();
            m
        };
        assert_eq!(restored.before, mixer.before);
    }

    /// A probe closed without held-out losses measures nothing: the round keeps
    /// `p`.
    #[test]
    fn a_probe_without_held_out_losses_leaves_the_mixture() {
        let names = vec!["a".to_string(), "b".to_string()];
        let mut mixer = AioliMixer::new(5, 2, 0.75, 1.0).unwrap().with_held_out();
        let mut trained = mixer.weights(&stats(0, &names, &[f64::NAN, f64::NAN]));
        for step in 1..=6 {
            let mut s = stats(step, &names, &[1.0, 1.0]);
            s.weights = &trained;
            trained = mixer.weights(&s);
        }
        assert!(mixer.mixing_law().is_empty());
        assert_eq!(mixer.mixture(), &[0.5, 0.5]);
    }

    #[test]
    fn state_round_trips_and_bad_settings_are_typed() {
        let names = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let mut mixer = AioliMixer::default()
            .with_smoothing(0.5)
            .with_worst_focus(0.5)
            .unwrap();
        mixer.weights(&stats(0, &names, &[f64::NAN; 3]));
        for step in 1..=7 {
            mixer.weights(&stats(
                step,
                &names,
                &[5.0 - step as f64 * 0.1, f64::NAN, 4.0],
            ));
        }
        let state = serde_json::from_str(&mixer.state().unwrap().to_string()).unwrap();
        let mut other = AioliMixer::default()
            .with_smoothing(0.5)
            .with_worst_focus(0.5)
            .unwrap();
        other.restore(&state).unwrap();
        for step in 8..=60 {
            let loss = [5.0 - step as f64 * 0.1, 3.0, 4.0 - step as f64 * 0.01];
            let (a, b) = (
                mixer.weights(&stats(step, &names, &loss)),
                other.weights(&stats(step, &names, &loss)),
            );
            assert_eq!(a, b, "step {step}");
        }
        assert!(other
            .restore(&serde_json::json!({"mixture": [0.5, 0.5]}))
            .is_err());
        for bad in [
            AioliMixer::new(50, 1, 0.6, 1.0),
            AioliMixer::new(50, 4, 0.5, 1.0),
            AioliMixer::new(50, 4, 0.6, f64::NAN),
            AioliMixer::default().with_worst_focus(0.0),
            AioliMixer::default().with_worst_focus(f64::INFINITY),
        ] {
            assert!(matches!(
                bad,
                Err(Error::Settings(SettingsError::InvalidSetting { .. }))
            ));
        }
    }
}
