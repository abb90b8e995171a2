//! `--mixer`'s mixers with their settings, `--replay-budget` around them, and the
//! steps a run is expected to take (which the warm-ups and replays count in).

use adabatch::prelude::*;
use adabatch::tokenize::CorpusInfo;
use adabatch::{AioliMixer, Exp3Mixer, Mixer, OnlineMixer, PikeMixer, ReplayBudget};

use super::args::{AioliArgs, MixerChoice, MixtureArgs, OnlineArgs, PikeArgs};

/// `--mixer uniform`'s equal weights (refused with `--mix-weights`), else none:
/// the dataset keeps its own.
pub fn uniform_weights(
    cli: &MixtureArgs,
    names: &[String],
) -> adabatch::Result<Option<Vec<(String, f64)>>> {
    if cli.mixer != MixerChoice::Uniform {
        return Ok(None);
    }
    if !cli.train.data.mix_weights.is_empty() {
        return Err(adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
            first: "--mix-weights",
            second: "--mixer uniform",
            reason: "uniform gives every domain an equal share: drop one of them (stratified with --mix-weights trains at fixed shares)",
        }));
    }
    Ok(Some(names.iter().map(|n| (n.clone(), 1.0)).collect()))
}

/// `--mixer online`, `odm`, `aioli`, `pike` or `pike-fair` (`online` for the
/// others, which no mixer decides), within `--replay-budget` if given.
pub fn chosen_mixer(cli: &MixtureArgs, online: OnlineMixer) -> adabatch::Result<Box<dyn Mixer>> {
    let pike = pike_mixer(cli.mixer, &cli.pike)?;
    let mixer: Box<dyn Mixer> = match (cli.mixer, pike) {
        (_, Some(pike)) => Box::new(pike),
        (MixerChoice::Odm, _) => Box::new(Exp3Mixer::default()),
        (MixerChoice::Aioli, _) => Box::new(aioli_mixer(&cli.aioli)?),
        _ => Box::new(online),
    };
    Ok(match cli.replay.replay_budget {
        Some(budget) => Box::new(ReplayBudget::new(
            mixer,
            cli.new_domain.iter().cloned(),
            budget,
        )?),
        None => mixer,
    })
}

/// `--mixer pike` or `pike-fair` with its flags (`None` for another mixer, which
/// refuses them: it would ignore them); checked before the first step too.
pub fn pike_mixer(mixer: MixerChoice, flags: &PikeArgs) -> adabatch::Result<Option<PikeMixer>> {
    let fair = match mixer {
        MixerChoice::Pike => false,
        MixerChoice::PikeFair => true,
        _ => {
            let tuned = flags.pike_t0.is_some()
                || flags.pike_zeta1.is_some()
                || flags.pike_zeta2.is_some()
                || flags.pike_floor.is_some()
                || flags.pike_smoothing.is_some()
                || flags.pike_tau.is_some();
            return match tuned {
                true => Err(conflict(
                    "--pike-*",
                    "they are PiKE's settings: use --mixer pike or pike-fair",
                )),
                false => Ok(None),
            };
        }
    };
    if flags.pike_tau.is_some() && !fair {
        return Err(conflict(
            "--pike-tau",
            "τ is Balanced-PiKE's: use --mixer pike-fair",
        ));
    }
    let mut pike = match fair {
        true => PikeMixer::fair(flags.pike_tau.unwrap_or(PikeMixer::DEFAULT_TAU))?,
        false => PikeMixer::default(),
    };
    if let Some(t0) = flags.pike_t0 {
        pike = pike.with_t0(t0)?;
    }
    if let Some(zeta1) = flags.pike_zeta1 {
        pike = pike.with_zeta1(zeta1)?;
    }
    if let Some(zeta2) = flags.pike_zeta2 {
        pike = pike.with_zeta2(zeta2)?;
    }
    if let Some(floor) = flags.pike_floor {
        pike = pike.with_floor(floor)?;
    }
    if let Some(smoothing) = flags.pike_smoothing {
        pike = pike.with_smoothing(smoothing)?;
    }
    Ok(Some(pike))
}

/// `--mixer`'s flags given for a mixer that does not read them.
fn conflict(first: &'static str, reason: &'static str) -> adabatch::Error {
    adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
        first,
        second: "--mixer",
        reason,
    })
}

/// `--mixer aioli` with its flags.
fn aioli_mixer(flags: &AioliArgs) -> adabatch::Result<AioliMixer> {
    let mut aioli = AioliMixer::new(flags.aioli_round, 4, 0.6, flags.aioli_eta)?;
    if let Some(s) = flags.aioli_smoothing {
        aioli = aioli.with_smoothing(s);
    }
    if let Some(temperature) = flags.aioli_worst_temperature {
        aioli = aioli.with_worst_focus(temperature)?;
    }
    if flags.aioli_held_out {
        aioli = aioli.with_held_out();
    }
    Ok(aioli)
}

/// `--replay-bound` alone decides the replay share; `--replay-budget` steers a mixer
/// (online, odm or aioli) over domains that exist, with a share from 0 to 1: said
/// before the first step.
pub fn check_replay(cli: &MixtureArgs, names: &[String]) -> adabatch::Result<()> {
    let replay = &cli.replay;
    let replay_decided_twice = replay.replay_budget.is_some()
        || replay.replay_ramp.is_some()
        || replay.replay_steps.is_some()
        || !cli.train.data.mix_weights.is_empty();
    if replay.bound.replay_bound.is_some() && replay_decided_twice {
        return Err(adabatch::Error::Settings(
            adabatch::SettingsError::ConflictingSettings {
                first: "--replay-bound",
                second: "--replay-budget / --replay-ramp / --replay-steps / --mix-weights",
                reason: "the bound decides the replay share itself",
            },
        ));
    }
    let Some(budget) = replay.replay_budget else {
        return Ok(());
    };
    if matches!(cli.mixer, MixerChoice::Stratified | MixerChoice::Uniform) {
        return Err(adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
            first: "--replay-budget",
            second: "--mixer stratified / uniform",
            reason: "the budget caps what a mixer chooses: use --mixer online, odm, aioli, pike or pike-fair (fixed shares: --mix-weights)",
        }));
    }
    if let Some(unknown) = cli.new_domain.iter().find(|d| !names.contains(d)) {
        return Err(adabatch::Error::msg(format!(
            "--new-domain {unknown}: the domains are {names:?}"
        )));
    }
    // The budget's own checks, before the first step.
    ReplayBudget::new(
        OnlineMixer::default(),
        cli.new_domain.iter().cloned(),
        budget,
    )
    .map(|_| ())
}

/// `--mixer online`, with `--online-temperature` and its warm-up (refused with
/// another mixer, which would ignore them).
pub fn online_mixer(
    mixer: MixerChoice,
    flags: &OnlineArgs,
    args: &TrainingArgs,
    infos: &[CorpusInfo],
) -> adabatch::Result<OnlineMixer> {
    let tuned = flags.online_temperature.is_some()
        || flags.online_warmup_steps.is_some()
        || flags.online_warmup.is_some();
    if tuned && mixer != MixerChoice::Online {
        return Err(adabatch::Error::Settings(
            adabatch::SettingsError::ConflictingSettings {
                first: "--online-temperature / --online-warmup / --online-warmup-steps",
                second: "--mixer",
                reason: "they are the online mixer's settings: use --mixer online",
            },
        ));
    }
    // The library's defaults (temperature, warm-up share) unless a flag says.
    let mut online = OnlineMixer::default();
    if let Some(temperature) = flags.online_temperature {
        online = online.with_temperature(temperature)?;
    }
    if let Some(steps) = flags.online_warmup_steps {
        return Ok(online.with_warmup(steps));
    }
    let fraction = (flags.online_warmup).unwrap_or(OnlineMixer::DEFAULT_WARMUP_FRACTION);
    // The example knows its steps better than the engine's estimate does: the
    // domains' mean document lengths at equal shares, or the packed token budget.
    Ok(match expected_steps(args, infos) {
        Some(n) => online.with_warmup((fraction * n as f64).round() as usize),
        None => online.with_warmup_fraction(fraction)?,
    })
}

/// The optimizer steps the run is expected to take: `--max-steps`, else
/// `--max-train-tokens` over the tokens a step (the budget of a packed token
/// batch, else the global batch at the domains' mean tokens a document).
pub fn expected_steps(args: &TrainingArgs, infos: &[CorpusInfo]) -> Option<usize> {
    if let Some(steps) = args.length.max_steps {
        return Some(steps);
    }
    let tokens = args.length.max_train_tokens? as f64;
    let per_step = match args.length_aware.max_tokens_per_batch {
        Some(budget) if args.length_aware.packed_token_budget => budget as f64,
        _ => {
            let per_document = infos
                .iter()
                .map(|i| i.train_tokens as f64 / i.train_documents.max(1) as f64)
                .sum::<f64>()
                / infos.len().max(1) as f64;
            args.batch.global_batch_size.unwrap_or(32) as f64 * per_document
        }
    };
    Some((tokens / per_step.max(1.0)).ceil() as usize)
}
