//! The mixer as a controller: after each step, the sources' weights of the next
//! from their losses and counts (the trainer's `#[mixer]`, else the engine's own
//! for `mix = online(..)` / `custom(..)`).

use crate::adapt::mixer::{Closing, Diagnostic, LastEval, Mixer, SourceGradient, SourceStats};
use crate::adapt::schedule::ScheduleSpec;
use crate::config::policy::Reweight;
use crate::data::planner::StepPlanner;
use crate::data::source_spec::SourceSpec;
use crate::error::{Error, Result, SettingsError};
use crate::report::record::{EvalLog, HeldOutCost, SourceGradientCost, StepLog};
use crate::train::eval::HeldOut;
use crate::train::probe::StepProbe;
use crate::train::settings::BuiltinMixer;
use crate::train::source_sums::{SourceLosses, SourceProbe};

use super::controller::{Controller, Restore, Save, Steer, StepReport, UserControllers};
use super::states;

/// The engine's own mixer, if the policy asks for one, of a run of `spec`'s
/// sources; each step's per-source losses (its probe) feed the mixer in force.
pub(crate) struct MixingControl {
    builtin: Option<Box<dyn Mixer>>,
    spec: SourceSpec,
    /// Losses per token (`reweight = token_count`) where the batches count them.
    per_token: bool,
    /// The mixer's diagnostics after it last decided, for the next record.
    diagnostics: Option<serde_json::Value>,
    /// What the held-out losses the mixer asked for have cost (`None` before
    /// the first request).
    held_out: Option<HeldOutCost>,
    /// Whether the next step measures the sources' gradients for the mixer.
    measures: bool,
    /// What those measurements have cost (`None` before the first).
    gradients: Option<SourceGradientCost>,
}

impl MixingControl {
    /// A run of several sources mixes them, with the engine's `builtin` mixer
    /// unless the trainer has its own; losses weighted by `reweight`.
    pub(crate) fn new(
        sources: Option<&SourceSpec>,
        builtin: Option<BuiltinMixer>,
        reweight: Reweight,
    ) -> Option<Self> {
        sources.map(|spec| Self {
            builtin: builtin.map(|m| m.build()),
            spec: spec.clone(),
            per_token: reweight == Reweight::TokenCount,
            diagnostics: None,
            held_out: None,
            measures: false,
            gradients: None,
        })
    }

    /// The mixer in force told the run's expected steps.
    pub(crate) fn plan(
        &mut self,
        trainer: &mut dyn UserControllers,
        expected_steps: Option<usize>,
    ) -> Option<String> {
        self.mixer(trainer)?.plan_run(expected_steps)
    }

    /// Whether the mixer in force may ask for steps after the planned end.
    pub(crate) fn closes(&mut self, trainer: &mut dyn UserControllers) -> bool {
        self.mixer(trainer).is_some_and(|m| m.closes())
    }

    /// The mixer in force asked, at `step` (the planned end, or a closing
    /// round's), for more steps from the model's reading there (`last_eval`
    /// taken at `step`, the held-out losses if any); a round's steps are added
    /// to the planner, with the mixer's weights for them.
    pub(crate) fn close(
        &mut self,
        step: usize,
        (last_eval, held_out): (Option<&EvalLog>, Option<&HeldOut>),
        steer: &mut Steer<'_>,
    ) -> Result<Closing> {
        if let Some(held_out) = held_out {
            self.count_held_out(held_out);
        }
        let no_loss = vec![f64::NAN; self.spec.names.len()];
        let readings = (last_eval, held_out.map(|h| &h.losses[..]), None);
        let Some(mixer) = self.mixer(steer.trainer) else {
            return Ok(Closing::End);
        };
        let losses = (&no_loss[..], &[][..]);
        let closing = with_stats(steer.planner, step, losses, readings, |stats| {
            mixer.close(stats)
        });
        let Some(closing @ Closing::Round { steps, .. }) = closing else {
            return Ok(closing.unwrap_or(Closing::End));
        };
        if steps == 0 {
            return Ok(Closing::End);
        }
        steer.planner.close_with(steps);
        let weights = next_mix_weights(mixer, steer.planner, step, losses, readings);
        let names = (steer.planner.sampler().sources()).map(|s| s.spec().names.clone());
        self.diagnostics = diagnostics_json(&mixer.diagnostics(), &names.unwrap_or_default());
        steer.planner.set_mix_weights(step, &weights)?;
        Ok(closing)
    }

    /// A held-out evaluation's cost, counted.
    fn count_held_out(&mut self, held_out: &HeldOut) {
        let cost = self.held_out.get_or_insert_with(HeldOutCost::default);
        cost.evaluations += 1;
        cost.tokens += held_out.tokens;
        cost.seconds += held_out.seconds;
    }

    /// Before step `step`: whether the mixer in force wants the sources'
    /// gradients measured in it.
    pub(crate) fn prepare(&mut self, step: usize, trainer: &mut dyn UserControllers) {
        self.measures = self
            .mixer(trainer)
            .is_some_and(|m| m.wants_source_gradients(step));
    }

    /// What measuring the sources' gradients has cost so far.
    pub(crate) fn source_gradient_cost(&self) -> Option<SourceGradientCost> {
        self.gradients
    }

    /// What the held-out losses the mixer asked for have cost so far.
    pub(crate) fn held_out_cost(&self) -> Option<HeldOutCost> {
        self.held_out
    }

    /// The mixer in force: the trainer's `#[mixer]`, else the engine's.
    fn mixer<'a>(&'a mut self, trainer: &'a mut dyn UserControllers) -> Option<&'a mut dyn Mixer> {
        match trainer.mixer() {
            Some(mixer) => Some(mixer),
            None => match &mut self.builtin {
                Some(mixer) => Some(&mut **mixer),
                None => None,
            },
        }
    }
}

/// The trainer's mixer checks the run's sources ([`Mixer::check_sources`]),
/// before the first step of a fresh or a resumed run.
pub(crate) fn check_mixer_sources(
    sources: Option<&SourceSpec>,
    trainer: &mut dyn UserControllers,
) -> Result<()> {
    let (Some(spec), Some(mixer)) = (sources, trainer.mixer()) else {
        return Ok(());
    };
    mixer.check_sources(&spec.names).map_err(|reason| {
        Error::Settings(SettingsError::MixerSources {
            sources: spec.names.clone(),
            reason,
        })
    })
}

impl Controller for MixingControl {
    /// A mixer decides the first step's weights too, from no loss yet.
    fn begin(&mut self, steer: &mut Steer<'_>) -> Result<()> {
        let no_loss = vec![f64::NAN; self.spec.names.len()];
        let names = (steer.planner.sampler().sources()).map(|s| s.spec().names.clone());
        if let Some(mixer) = self.mixer(steer.trainer) {
            let names = names.unwrap_or_default();
            let weights =
                next_mix_weights(mixer, steer.planner, 0, (&no_loss, &[]), (None, None, None));
            let diagnostics = diagnostics_json(&mixer.diagnostics(), &names);
            steer.planner.set_mix_weights(0, &weights)?;
            self.diagnostics = diagnostics;
        }
        Ok(())
    }

    fn probe(&self) -> Option<Box<dyn StepProbe + '_>> {
        Some(Box::new(SourceProbe {
            spec: &self.spec,
            per_token: self.per_token,
            gradients: self.measures,
        }))
    }

    /// A measuring step's seconds, counted (the clock decides nothing here).
    fn step_time(&mut self, seconds: f64) {
        if self.measures && seconds > 0.0 {
            let cost = self
                .gradients
                .get_or_insert_with(SourceGradientCost::default);
            cost.steps += 1;
            cost.seconds += seconds;
        }
    }

    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        let Some(SourceLosses {
            loss: losses,
            tokens,
            gradients,
        }) = report.reading::<SourceLosses>()
        else {
            return Ok(());
        };
        let tokens = tokens.as_deref().unwrap_or(&[]);
        let gradients = gradients.as_deref();
        if let Some(held_out) = report.held_out {
            self.count_held_out(held_out);
        }
        if let Some(mixer) = self.mixer(steer.trainer) {
            let step = report.step;
            let held_out = report.held_out.map(|h| &h.losses[..]);
            let weights = next_mix_weights(
                mixer,
                steer.planner,
                step,
                (losses, tokens),
                (report.last_eval, held_out, gradients),
            );
            let names = (steer.planner.sampler().sources()).map(|s| s.spec().names.clone());
            let diagnostics = diagnostics_json(&mixer.diagnostics(), &names.unwrap_or_default());
            steer.planner.set_mix_weights(report.step, &weights)?;
            self.diagnostics = diagnostics;
        }
        Ok(())
    }

    fn record(&mut self, entry: &mut StepLog) {
        entry.sources.mixer = self.diagnostics.clone();
        entry.held_out = self.held_out;
    }

    fn wants_held_out(&mut self, step: usize, trainer: &mut dyn UserControllers) -> bool {
        self.mixer(trainer).is_some_and(|m| m.wants_held_out(step))
    }

    fn save(&mut self, at: &mut Save<'_>) -> Result<()> {
        if let Some(cost) = &self.held_out {
            at.into.put(states::HELD_OUT, 1, cost)?;
        }
        if let Some(cost) = &self.gradients {
            at.into.put(states::SOURCE_GRADIENTS, 1, cost)?;
        }
        // A mixer without a state still has its entry (null): the checkpoint then
        // says that the weights it holds are a mixer's, not the run's own.
        if let Some(mixer) = self.mixer(at.trainer) {
            let state = mixer.state().unwrap_or(serde_json::Value::Null);
            at.into.put_value(states::MIXER, 1, state);
        }
        Ok(())
    }

    fn restore(&mut self, at: &mut Restore<'_>) -> Result<()> {
        self.held_out = at.from.get(states::HELD_OUT, 1)?;
        self.gradients = at.from.get(states::SOURCE_GRADIENTS, 1)?;
        let (Some(entry), Some(mixer)) = (at.from.entry(states::MIXER), self.mixer(at.trainer))
        else {
            return Ok(());
        };
        if entry.state.is_null() {
            return Ok(());
        }
        // Version 0: the bare list of numbers of older checkpoints, which the
        // built-in mixers read as well.
        if entry.version > 1 {
            return Err(states::entry_error(
                states::MIXER,
                format!(
                    "is version {}, this adabatch reads versions 0 and 1",
                    entry.version
                ),
            ));
        }
        mixer
            .restore(&entry.state)
            .map_err(|detail| states::entry_error(states::MIXER, detail))
    }
}

/// What a mixer reads besides the step's losses: the last evaluation, the
/// held-out losses and the per-source gradient statistics it asked for.
type Readings<'a> = (
    Option<&'a EvalLog>,
    Option<&'a [f64]>,
    Option<&'a [SourceGradient]>,
);

/// A mixer's weights for the step after `step`, from its per-source losses and
/// tokens and the sources' counts (the same on every rank).
fn next_mix_weights(
    mixer: &mut dyn Mixer,
    planner: &StepPlanner<ScheduleSpec>,
    step: usize,
    losses: (&[f64], &[f64]),
    readings: Readings<'_>,
) -> Vec<f64> {
    with_stats(planner, step, losses, readings, |stats| {
        mixer.weights(stats)
    })
    .unwrap_or_default()
}

/// `then` of what a mixer sees after `step` (`None` for a run without sources).
fn with_stats<R>(
    planner: &StepPlanner<ScheduleSpec>,
    step: usize,
    (losses, tokens): (&[f64], &[f64]),
    (last_eval, held_out, source_gradients): Readings<'_>,
    then: impl FnOnce(&SourceStats<'_>) -> R,
) -> Option<R> {
    let sources = planner.sampler().sources()?;
    let seen: Vec<usize> = sources.cursors().iter().map(|c| c.seen).collect();
    let positions: Vec<usize> = sources.cursors().iter().map(|c| c.position).collect();
    let spec = sources.spec();
    Some(then(&SourceStats {
        step,
        names: &spec.names,
        loss: losses,
        tokens,
        source_tokens: &spec.tokens,
        unit: spec.unit,
        seen: &seen,
        positions: &positions,
        sizes: &spec.sizes,
        weights: sources.weights(),
        last_eval: last_eval.map(|e| LastEval {
            step: e.step,
            eval_loss: e.eval_loss,
            metrics: &e.metrics,
        }),
        held_out,
        source_gradients,
    }))
}

/// A mixer's diagnostics as a step record's `mixer` object, keyed by the
/// sources' `names` (`None` when it has none).
fn diagnostics_json(
    diagnostics: &[(&str, Diagnostic)],
    names: &[String],
) -> Option<serde_json::Value> {
    if diagnostics.is_empty() {
        return None;
    }
    let per_source = |values: &[f64]| -> serde_json::Value {
        (names.iter())
            .zip(values)
            .map(|(name, &x)| (name.clone(), serde_json::json!(x)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let m = names.len().max(1);
    let object = diagnostics
        .iter()
        .map(|(key, value)| {
            let json = match value {
                Diagnostic::PerSource(values) => per_source(values),
                Diagnostic::PerPair(values) => (names.iter())
                    .zip(values.chunks(m))
                    .map(|(name, row)| (name.clone(), per_source(row)))
                    .collect::<serde_json::Map<_, _>>()
                    .into(),
                Diagnostic::Scalar(x) => serde_json::json!(x),
            };
            (key.to_string(), json)
        })
        .collect::<serde_json::Map<_, _>>();
    Some(object.into())
}
