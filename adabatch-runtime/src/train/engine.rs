//! The training loop, written once and monomorphised per trainer.

use candle_core::Device;

use crate::config::policy::OomPolicy;
use crate::data::length::LengthIndex;
use crate::dist::communicator::Communicator;
use crate::error::Result;
use crate::memory::device::PeakSampler;
use crate::report::logging::Logger;
use crate::report::logging::SourceLog;
use crate::report::summary::TrainSummary;
use crate::train::adaptation::length_aware_epoch;
use crate::train::best::{load_best, Interval};
use crate::train::checkpoint::checkpoint_dir;
use crate::train::hooks::{
    agree, evaluate_and_report, next_mix_weights, save_now, trainer_state, RunData, SaveInputs,
};
use crate::train::oom::OomRecovery;
use crate::train::prefetch::{PrefetchStats, Prefetcher};
use crate::train::progress::{Progress, RunOutcome};
use crate::train::settings::RunSettings;
use crate::train::start::{start_run, RunStart};
use crate::train::step::{train_step, StepInput, StepOutcome};
use crate::user::callback::TrainerControl;
use crate::user::data::Dataset;
use crate::user::trainer::{AdaptiveTrainer, CollateFor};

pub(crate) fn rank_loop<T, D, C>(
    trainer: &mut T,
    comm: &impl Communicator,
    data: RunData<'_, D, C>,
    settings: &RunSettings,
    device: &Device,
    mut logger: Option<&mut Logger>,
) -> Result<TrainSummary>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
{
    let (dataset, collate) = (data.train, data.collate);
    let RunStart {
        params,
        resumed,
        mut adaptation,
        mut planner,
    } = start_run(
        trainer,
        comm,
        data.eval,
        settings,
        device,
        logger.as_deref_mut(),
    )?;
    let mut evaluations = Vec::new();
    let mut input = StepInput {
        dataset,
        collate,
        device,
        reweight: settings.reweight,
        max_grad_norm: settings.max_grad_norm,
        faults: settings.faults.clone(),
        verify_update: true,
        noise_scale: settings.noise_scale_beta.is_some(),
        sources: settings.sources.clone(),
        precision: settings.precision,
        loss_scale: 1.0,
    };
    let length_index = settings.batching.map(|_| {
        LengthIndex::new(
            &(0..settings.num_examples)
                .map(|i| dataset.example_len(i))
                .collect::<Vec<_>>(),
        )
    });
    let mut progress = Progress::new(resumed.as_ref().map_or(0, |s| s.oom_events));
    let mut recovery = OomRecovery::new(settings.oom);
    let (mut last_evaluated, mut last_saved) = (None, None);
    // The last trained step's global batch, loss and learning rate.
    let mut last_step = (0, f64::NAN, 0.0);
    let mut prefetch = PrefetchStats::default();
    let has_callback = trainer.callback().is_some();
    let mut best = resumed.as_ref().and_then(|s| s.best);
    if settings.eval_on_start {
        evaluate_and_report(
            trainer,
            comm,
            data,
            settings,
            device,
            (&planner, last_step),
            logger.as_deref_mut(),
            &mut evaluations,
        )?;
        last_evaluated = Some(planner.step());
    }
    // Collate threads live in this scope: they borrow the dataset and the collate.
    std::thread::scope(|scope| -> Result<()> {
        let mut prefetcher = Prefetcher::new(
            scope,
            (dataset, collate, device),
            comm.rank(),
            settings.prefetch_workers,
            settings.batching.is_some(),
        );
        while let Some(batches) = planner.next_step_with(|epoch| {
            length_aware_epoch(
                settings,
                length_index.as_ref(),
                trainer,
                &adaptation.online,
                comm,
                epoch,
            )
        })? {
            let step = planner.step();
            let predicted_memory = planner.sampler().last_predicted();
            let consumed_before = planner.sampler().examples_seen() - batches.global_size();
            let lr = settings.lr.at(consumed_before, batches.global_size());
            // A logged step builds its record for the log and for `Callback::on_log`.
            let log_now = (logger.is_some() || has_callback)
                && (step % settings.logging_steps == 0
                    || planner.is_last_step()
                    || (step == 1 && settings.logging_first_step));
            // Only memory-aware runs need the device's peak (it synchronises the device).
            let peak =
                (adaptation.memory_mode && !device.is_cpu()).then(|| PeakSampler::start(device));
            input.loss_scale = adaptation.loss_scale();
            let ready = prefetcher.take(&batches, recovery.chunks());
            prefetcher.look_ahead(&planner, recovery.chunks());
            let outcome = train_step(
                trainer,
                comm,
                &mut input,
                &params,
                &batches,
                recovery.chunks(),
                lr,
                step,
                log_now,
                ready,
            )?;
            let device_peak = peak.and_then(|p| p.finish().pool_peak);
            let (loss, grad_norm, step_source_loss) = match outcome {
                StepOutcome::Trained {
                    overflowed,
                    loss,
                    grad_norm,
                    noise,
                    source_loss,
                } => {
                    let skipped = adaptation.after_step(
                        &mut planner,
                        settings.schedule,
                        (step, overflowed),
                        noise,
                        logger.as_deref(),
                    )?;
                    progress.skipped_since_log += usize::from(skipped);
                    (loss, grad_norm, source_loss)
                }
                StepOutcome::OutOfMemory { detail } => {
                    progress.oom_events += 1;
                    progress.oom_events_since_log += 1;
                    let action = recovery.recover(&mut planner, &batches, step, &detail)?;
                    if let Some(logger) = logger.as_deref_mut() {
                        logger.event(&format!("step {step}: out of memory ({detail}); {action}"));
                        if settings.oom == OomPolicy::Skip {
                            logger.advance(batches.global_size(), planner.sampler().epoch());
                        }
                    }
                    continue;
                }
            };
            let measured_memory = adaptation.observe_memory(
                trainer,
                dataset,
                device,
                &batches,
                (comm.rank(), recovery.chunks()),
                device_peak,
            );
            recovery.step_trained();
            progress.step_losses.push(loss);
            progress.losses_since_log.push(loss);
            progress.examples_since_log += batches.global_size();
            if let Some(logger) = logger.as_deref_mut() {
                logger.advance(batches.global_size(), planner.sampler().epoch());
            }
            let logged = if log_now {
                let mut entry = progress.step_log(
                    planner.sampler(),
                    step,
                    &batches,
                    grad_norm.unwrap_or(f64::NAN),
                    lr,
                );
                entry.predicted_memory = predicted_memory;
                entry.measured_memory = measured_memory;
                entry.gradient_noise_scale = adaptation.noise_scale.and_then(|e| e.estimate());
                entry.loss_scale = adaptation.loss_scaler.map(|_| input.loss_scale);
                entry.skipped_steps = std::mem::take(&mut progress.skipped_since_log);
                if let Some(mixed) = planner.sampler().sources() {
                    entry.sources = SourceLog::of(
                        mixed,
                        batches.micro.iter().flat_map(|m| m.indices.iter().copied()),
                        step_source_loss.as_deref(),
                    );
                }
                if let Some(logger) = logger.as_deref_mut() {
                    logger.log(&entry)?;
                }
                Some(entry)
            } else {
                None
            };
            if let (Some(losses), Some(mixer)) =
                (step_source_loss.as_deref(), adaptation.mixer(trainer))
            {
                let weights = next_mix_weights(mixer, &planner, step, losses, evaluations.last());
                planner.set_mix_weights(step, &weights)?;
            }
            planner.finish_step()?;
            let mut control = TrainerControl {
                should_training_stop: false,
                should_save: settings.save_every.due(step, planner.epoch_complete()),
                should_evaluate: settings.eval_every.due(step, planner.epoch_complete()),
            };
            let last = (batches.global_size(), loss, lr);
            if let Some(callback) = trainer.callback() {
                let state = trainer_state(comm, &planner, last, &evaluations);
                callback.on_step_end(&state, &mut control);
                if let Some(entry) = &logged {
                    callback.on_log(&state, entry, &mut control);
                }
                if planner.epoch_complete() {
                    callback.on_epoch_end(&state, &mut control);
                }
                control = agree(comm, control)?;
            }
            if control.should_evaluate && data.eval.is_some() {
                let asked = evaluate_and_report(
                    trainer,
                    comm,
                    data,
                    settings,
                    device,
                    (&planner, last),
                    logger.as_deref_mut(),
                    &mut evaluations,
                )?;
                last_evaluated = Some(step);
                control.should_training_stop |= asked.should_training_stop;
                control.should_save |= asked.should_save;
            }
            if control.should_save {
                let inputs = SaveInputs {
                    params: &params,
                    adaptation: &mut adaptation,
                    oom_events: progress.oom_events,
                    evaluations: &evaluations,
                    best: &mut best,
                };
                save_now(trainer, comm, settings, &planner, inputs, logger.as_deref())?;
                last_saved = Some(step);
            }
            last_step = last;
            if control.should_training_stop {
                if let Some(logger) = logger.as_deref() {
                    logger.event(&format!("step {step}: a callback stopped training"));
                }
                break;
            }
        }
        prefetch = prefetcher.stats;
        Ok(())
    })?;
    if let (Some(logger), true) = (logger.as_deref(), settings.prefetch_workers > 0) {
        logger.event(&format!(
            "prefetch: {} steps trained on batches collated ahead; {} predicted steps discarded",
            prefetch.used, prefetch.discarded
        ));
    }
    if last_evaluated != Some(planner.step()) {
        // What a callback asks after the last evaluation has nothing left to act on.
        evaluate_and_report(
            trainer,
            comm,
            data,
            settings,
            device,
            (&planner, last_step),
            logger.as_deref_mut(),
            &mut evaluations,
        )?;
    }
    if settings.save_every != Interval::Never && last_saved != Some(planner.step()) {
        let inputs = SaveInputs {
            params: &params,
            adaptation: &mut adaptation,
            oom_events: progress.oom_events,
            evaluations: &evaluations,
            best: &mut best,
        };
        save_now(trainer, comm, settings, &planner, inputs, logger.as_deref())?;
    }
    if let (Some(_), Some(best)) = (&settings.best_model, best) {
        load_best(comm, settings, &params, best, device, logger.as_deref())?;
    }
    if let Some(callback) = trainer.callback() {
        callback.on_train_end(&trainer_state(comm, &planner, last_step, &evaluations));
    }
    if let Some(logger) = logger {
        logger.finish();
    }
    let outcome = RunOutcome {
        evaluations,
        prefetch,
        skipped_steps: adaptation.loss_scaler.map_or(0, |s| s.skipped_steps),
        best: best
            .filter(|_| settings.best_model.is_some())
            .map(|b| (checkpoint_dir(&settings.output_dir, b.step), b.metric)),
    };
    let resumed_at = resumed.as_ref().map(|s| &s.planner);
    Ok(progress.summary(&planner, settings, resumed_at, outcome))
}
