//! The training loop, written once and monomorphised per trainer.

use std::time::Instant;

use candle_core::{Device, Tensor, Var};

use crate::config::policy::OomPolicy;
use crate::data::length::LengthIndex;
use crate::data::planner::StepBatches;
use crate::data::sampler::GlobalBatchSampler;
use crate::dist::communicator::Communicator;
use crate::error::{Error, Result};
use crate::memory::device::PeakSampler;
use crate::memory::host::keep_freed_memory;
use crate::report::logging::SourceLog;
use crate::report::logging::{Logger, StepLog};
use crate::report::summary::TrainSummary;
use crate::train::adaptation::{length_aware_epoch, Adaptation};
use crate::train::checkpoint::resume_checkpoint;
use crate::train::hooks::{
    agree, evaluate_and_report, next_mix_weights, save_on_rank_zero, trainer_state, RunData,
};
use crate::train::oom::OomRecovery;
use crate::train::prefetch::{PrefetchStats, Prefetcher};
use crate::train::settings::RunSettings;
use crate::train::step::{train_step, StepInput, StepOutcome};
use crate::user::callback::TrainerControl;
use crate::user::data::Dataset;
use crate::user::model::TrainModel;
use crate::user::trainer::{AdaptiveTrainer, CollateFor};

/// The model's parameters sorted by name, checked for duplicates.
fn sorted_parameters<M: TrainModel>(model: &M) -> Result<Vec<(String, Var)>> {
    let mut params = model.named_parameters();
    if params.is_empty() {
        return Err(Error::NoParameters);
    }
    params.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = params.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::DuplicateParameter {
            name: w[0].0.clone(),
        });
    }
    Ok(params)
}

/// Makes every rank start from rank 0's weights, after checking they agree on the
/// parameter set.
fn synchronise_parameters(comm: &impl Communicator, params: &[(String, Var)]) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let elems: usize = params.iter().map(|(_, v)| v.elem_count()).sum();
    let mut totals = [params.len() as f64, elems as f64];
    comm.all_reduce_sum(&mut [], &mut totals)?;
    let world = comm.world_size() as f64;
    if totals != [params.len() as f64 * world, elems as f64 * world] {
        return Err(Error::ParameterMismatch {
            rank: comm.rank(),
            detail: format!(
                "this rank has {} tensors / {elems} values; the group disagrees",
                params.len()
            ),
        });
    }
    let mut tensors: Vec<Tensor> = params.iter().map(|(_, v)| v.as_tensor().clone()).collect();
    comm.broadcast(&mut tensors, 0)?;
    for ((_, var), value) in params.iter().zip(&tensors) {
        var.set(value)?;
    }
    Ok(())
}

/// Per-rank mutable state of the loop.
struct Progress {
    losses_since_log: Vec<f64>,
    examples_since_log: usize,
    oom_events_since_log: usize,
    oom_events: usize,
    skipped_since_log: usize,
    last_log: Instant,
    step_losses: Vec<f64>,
}

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
    if !settings.release_freed_memory {
        keep_freed_memory();
    }
    if let Some(eval) = data.eval.filter(|e| e.len() < comm.world_size()) {
        return Err(Error::EvalSetTooSmall {
            world_size: comm.world_size(),
            examples: eval.len(),
        });
    }
    if trainer.mixer().is_some() && settings.sources.is_none() {
        return Err(Error::MixerWithoutSources);
    }
    // `mix = online(..)` / `custom(..)`: the engine's own mixer, unless the trainer
    // has one.
    if let (Some(asked), Some(_)) = (settings.builtin_mixer, trainer.mixer()) {
        return Err(Error::ConflictingSettings {
            first: asked.key(),
            second: "#[mixer]",
            reason: "two mixers would decide the same weights: keep one",
        });
    }
    let mut evaluations = Vec::new();
    let (model, _) = trainer.parts();
    let params = sorted_parameters(&*model)?;
    let resumed = match &settings.resume {
        Some(dir) => {
            let (_, optimizer) = trainer.parts();
            Some(resume_checkpoint(
                dir, settings, &params, optimizer, device,
            )?)
        }
        None => None,
    };
    synchronise_parameters(comm, &params)?;
    if let (Some(state), Some(dir), Some(logger)) =
        (&resumed, &settings.resume, logger.as_deref_mut())
    {
        logger.mark_resume(dir, state.planner.global_step)?;
    }
    let mut adaptation = Adaptation::new(settings, resumed.as_ref(), comm.rank())?;
    let mut planner = settings.step_planner(settings.seed, settings.shuffle)?;
    if let Some(state) = &resumed {
        planner.restore(&state.planner);
        if let (Some(saved), Some(mixer)) = (&state.mixer, adaptation.mixer(trainer)) {
            mixer.restore(saved);
        }
    } else if let (Some(spec), Some(mixer)) = (&settings.sources, adaptation.mixer(trainer)) {
        // A mixer decides the first step's weights too, from no loss yet.
        let no_loss = vec![f64::NAN; spec.names.len()];
        let weights = next_mix_weights(mixer, &planner, 0, &no_loss, None);
        planner.set_mix_weights(0, &weights)?;
    }
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
    let started = Instant::now();
    let mut progress = Progress {
        losses_since_log: Vec::new(),
        examples_since_log: 0,
        oom_events_since_log: 0,
        oom_events: resumed.as_ref().map_or(0, |s| s.oom_events),
        skipped_since_log: 0,
        last_log: started,
        step_losses: Vec::new(),
    };
    let mut recovery = OomRecovery::new(settings.oom);
    let (mut last_evaluated, mut last_saved) = (None, None);
    // The last trained step's global batch, loss and learning rate.
    let mut last_step = (0, f64::NAN, 0.0);
    let mut prefetch = PrefetchStats::default();
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
            let log_now =
                logger.is_some() && (step % settings.logging_steps == 0 || planner.is_last_step());
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
                if log_now {
                    let mut entry = step_log(
                        &mut progress,
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
                    logger.log(&entry)?;
                }
            }
            if let (Some(losses), Some(mixer)) =
                (step_source_loss.as_deref(), adaptation.mixer(trainer))
            {
                let weights = next_mix_weights(mixer, &planner, step, losses, evaluations.last());
                planner.set_mix_weights(step, &weights)?;
            }
            planner.finish_step()?;
            let mut control = TrainerControl {
                should_training_stop: false,
                should_save: settings.save_steps > 0 && step % settings.save_steps == 0,
                should_evaluate: settings.eval_steps.is_some_and(|k| step % k == 0),
            };
            let last = (batches.global_size(), loss, lr);
            if let Some(callback) = trainer.callback() {
                let state = trainer_state(comm, &planner, last, &evaluations);
                callback.on_step_end(&state, &mut control);
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
                let extra = adaptation.extras(trainer, comm, progress.oom_events)?;
                save_on_rank_zero(
                    comm,
                    settings,
                    &planner,
                    &params,
                    trainer,
                    extra,
                    logger.as_deref(),
                )?;
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
    if settings.save_steps > 0 && last_saved != Some(planner.step()) {
        let extra = adaptation.extras(trainer, comm, progress.oom_events)?;
        save_on_rank_zero(
            comm,
            settings,
            &planner,
            &params,
            trainer,
            extra,
            logger.as_deref(),
        )?;
    }
    if let Some(callback) = trainer.callback() {
        callback.on_train_end(&trainer_state(comm, &planner, last_step, &evaluations));
    }
    if let Some(logger) = logger {
        logger.finish();
    }
    let runtime = started.elapsed().as_secs_f64();
    let sampler = planner.sampler();
    let resumed_at = resumed.as_ref().map(|s| s.planner.examples_seen);
    // Throughput and loss of this run only (a resumed run starts mid-way).
    let trained_here = sampler.examples_seen() - resumed_at.unwrap_or(0);
    let train_loss = if progress.step_losses.is_empty() {
        f64::NAN
    } else {
        progress.step_losses.iter().sum::<f64>() / progress.step_losses.len() as f64
    };
    Ok(TrainSummary {
        global_step: planner.step(),
        epoch: sampler.epoch(),
        examples_seen: sampler.examples_seen(),
        train_loss,
        step_losses: progress.step_losses,
        oom_events: progress.oom_events,
        final_per_device_batch_size: planner.per_device(),
        world_size: settings.world_size,
        train_runtime: runtime,
        train_samples_per_second: trained_here as f64 / runtime.max(f64::MIN_POSITIVE),
        resumed_from_step: resumed.as_ref().map(|s| s.planner.global_step),
        evaluations,
        prefetched_steps: prefetch.used,
        prefetch_discarded: prefetch.discarded,
        skipped_steps: adaptation.loss_scaler.map_or(0, |s| s.skipped_steps),
    })
}

fn step_log(
    progress: &mut Progress,
    sampler: &GlobalBatchSampler,
    step: usize,
    batches: &StepBatches,
    grad_norm: f64,
    lr: f64,
) -> StepLog {
    let elapsed = progress.last_log.elapsed().as_secs_f64();
    let losses = std::mem::take(&mut progress.losses_since_log);
    let entry = StepLog {
        step,
        epoch: sampler.epoch(),
        train_coverage: sampler.train_coverage(),
        local_batch_sizes: batches.local_sizes(),
        global_batch: batches.global_size(),
        indices: batches.per_rank_indices(),
        loss: losses.iter().sum::<f64>() / losses.len().max(1) as f64,
        grad_norm,
        learning_rate: lr,
        examples_per_s: progress.examples_since_log as f64 / elapsed.max(f64::MIN_POSITIVE),
        micro_batches: batches.micro.len(),
        oom_events: std::mem::take(&mut progress.oom_events_since_log),
        predicted_memory: None,
        measured_memory: None,
        gradient_noise_scale: None,
        loss_scale: None,
        skipped_steps: 0,
        sources: Default::default(),
    };
    progress.examples_since_log = 0;
    progress.last_log = Instant::now();
    entry
}
