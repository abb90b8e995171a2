//! `--replay-bound`: the least replay that keeps each old domain's loss within a
//! bound of its reference, by `--replay-rule`.

use adabatch::prelude::*;
use adabatch::tokenize::CorpusInfo;
use adabatch::BoundedReplay;

use super::args::{BoundArgs, ReplayRule, REPLAY_EVAL_STEPS};
use super::mixers::expected_steps;

/// `--replay-bound` with its reference, the replay share of the new domains' run
/// (its own checks, and the sources' in the run's setup, before the first step).
pub fn bounded_replay(
    flags: &BoundArgs,
    new_domains: &[String],
    args: &TrainingArgs,
    infos: &[CorpusInfo],
) -> adabatch::Result<Option<BoundedReplay>> {
    let Some(bound) = flags.replay_bound else {
        return Ok(None);
    };
    let reference = (flags.replay_reference.clone()).map(|l| l.0).ok_or_else(|| {
        adabatch::Error::msg("--replay-bound needs the old domains' losses before the new data: --replay-reference or --replay-reference-model")
    })?;
    let bounded = BoundedReplay::new(
        new_domains.iter().cloned(),
        reference,
        bound,
        flags.replay_max,
    )?;
    let mut bounded = with_rule(bounded, flags)?;
    if args.eval.mixer_eval_examples.is_some() {
        bounded = bounded.with_held_out(flags.replay_every.unwrap_or(REPLAY_EVAL_STEPS))?;
    }
    if flags.replay_close_cap.is_some() || flags.replay_close_round.is_some() {
        bounded = bounded.with_closing(
            flags.replay_close_cap.unwrap_or(BoundedReplay::CLOSING_CAP),
            flags
                .replay_close_round
                .unwrap_or(BoundedReplay::CLOSING_ROUND),
        )?;
    }
    if flags.replay_start.is_some() || flags.replay_finish.is_some() {
        let steps = expected_steps(args, infos).ok_or_else(|| {
            adabatch::Error::msg(
                "--replay-start's and --replay-finish's fractions are of the run's expected steps: give --max-steps or --max-train-tokens",
            )
        })?;
        let at = |fraction: f64| (fraction * steps as f64).round() as usize;
        if let Some((share, fraction)) = flags.replay_start {
            bounded = bounded.with_start(share, at(fraction))?;
        }
        if let Some((share, fraction)) = flags.replay_finish {
            // The step at FRACTION of the run, counted from 1.
            bounded = bounded.with_finish(share, at(fraction) + 1)?;
        }
    }
    Ok(Some(bounded))
}

/// `--replay-rule` with its own flags (`--replay-gain` for `hold` and `follow`,
/// `--replay-integral` and `--replay-margin` for `hold`, `--replay-lower-at` for
/// `doubling`; another rule's refused). The library's default start (20 % for a
/// tenth of the run, at most `--replay-max`) holds under `hold` and `follow`,
/// none under `doubling`, unless `--replay-start`.
fn with_rule(bounded: BoundedReplay, flags: &BoundArgs) -> adabatch::Result<BoundedReplay> {
    let refuse = |other: &'static str| {
        adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
            first: "--replay-rule",
            second: other,
            reason: "--replay-gain is the hold and follow rules', --replay-integral and --replay-margin the hold rule's, --replay-lower-at the doubling's",
        })
    };
    let rule = flags.replay_rule;
    if rule != ReplayRule::Doubling && flags.replay_lower_at.is_some() {
        return Err(refuse("--replay-lower-at"));
    }
    if rule == ReplayRule::Doubling && flags.replay_gain.is_some() {
        return Err(refuse("--replay-gain"));
    }
    if rule != ReplayRule::Hold
        && (flags.replay_integral.is_some() || flags.replay_margin.is_some())
    {
        return Err(refuse("--replay-integral or --replay-margin"));
    }
    let gain = flags.replay_gain.unwrap_or(BoundedReplay::HOLD_GAIN);
    match rule {
        ReplayRule::Hold => bounded.with_hold(
            gain,
            flags
                .replay_integral
                .unwrap_or(BoundedReplay::HOLD_INTEGRAL),
            flags.replay_margin.unwrap_or(BoundedReplay::HOLD_MARGIN),
        ),
        ReplayRule::Follow => bounded.with_gain(gain),
        ReplayRule::Doubling => match flags.replay_lower_at {
            Some(fraction) => bounded.with_doubling().with_lower_at(fraction),
            None => Ok(bounded.with_doubling()),
        },
    }
}

/// The bound's flags and rules: what a user mistypes is refused with a message
/// that names it.
#[cfg(test)]
mod tests {
    use super::super::args::{three_domains, MixtureArgs, BOUND};
    use super::*;
    use adabatch::{MixUnit, Mixer};

    /// `cli`'s bound over a run of 50 steps, told so as the engine tells it.
    fn bound_of(cli: &MixtureArgs) -> adabatch::Result<Option<BoundedReplay>> {
        let mut args = cli.train.clone();
        args.length.max_steps = Some(50);
        let mut bounded = bounded_replay(&cli.replay.bound, &cli.new_domain, &args, &[])?;
        if let Some(bounded) = bounded.as_mut() {
            assert_eq!(bounded.plan_run(Some(50)), None);
        }
        Ok(bounded)
    }

    /// The replay shares of `--replay-bound`'s mixer over `[python, en, kjv]`
    /// after `step`, with en 6 % above its reference at an evaluation after step 0.
    fn bounded_shares(flags: &[&str], step: usize) -> adabatch::Result<Vec<f64>> {
        let cli = three_domains(&[BOUND, flags].concat())
            .map_err(|e| adabatch::Error::msg(e.to_string()))?;
        let mut mixer = bound_of(&cli)?.unwrap();
        let names = ["python", "en", "kjv"].map(String::from);
        let metrics = [
            ("eval_en_loss".to_string(), 4.24),
            ("eval_kjv_loss".to_string(), 3.0),
        ]
        .into();
        let stats = adabatch::SourceStats {
            step,
            names: &names,
            loss: &[f64::NAN; 3],
            tokens: &[],
            source_tokens: &[1, 1, 1],
            unit: MixUnit::Tokens,
            seen: &[0; 3],
            positions: &[0; 3],
            sizes: &[1; 3],
            weights: &[1.0; 3],
            last_eval: Some(adabatch::LastEval {
                step: 0,
                eval_loss: 0.0,
                metrics: &metrics,
            }),
            held_out: None,
            source_gradients: None,
        };
        Ok(mixer.weights(&stats))
    }

    #[test]
    fn the_bound_holds_the_drift_after_a_start_unless_told_otherwise() {
        // Hold (the default): 20 % for the first 5 of 50 steps, then 6 % × 6 / 5
        // and the integral, 1.5 % × (6 − 4.9) / 5.
        assert_eq!(bounded_shares(&[], 0).unwrap(), [0.8, 0.1, 0.1]);
        let w = bounded_shares(&[], 5).unwrap();
        let held = 0.06 * 0.06 / 0.05 + 0.015 * 0.011 / 0.05;
        assert!((w[1] - held).abs() < 1e-12 && w[2] == 0.0, "{w:?}");
        let flags = ["--replay-integral", "0.12", "--replay-margin", "0.2"];
        let w = bounded_shares(&flags, 5).unwrap();
        let held = 0.06 * 0.06 / 0.05 + 0.12 * 0.02 / 0.05;
        assert!((w[1] - held).abs() < 1e-12, "{w:?}");
        // Follow: the drift alone.
        let w = bounded_shares(&["--replay-rule", "follow"], 5).unwrap();
        assert!((w[1] - 0.06 * 0.06 / 0.05).abs() < 1e-12, "{w:?}");
        let flags = [
            "--replay-rule",
            "follow",
            "--replay-gain",
            "0.03",
            "--replay-start",
            "0:0",
        ];
        let w = bounded_shares(&flags, 0).unwrap();
        assert!((w[1] - 0.03 * 0.06 / 0.05).abs() < 1e-12, "{w:?}");
        // A start share over --replay-max is cut to it when no flag set it.
        assert_eq!(
            bounded_shares(&["--replay-max", "0.1"], 0).unwrap(),
            [0.9, 0.05, 0.05]
        );
        // Doubling: from 2 % to 4 % past the bound, en weighing 1 + 6 / 5.
        let w = bounded_shares(&["--replay-rule", "doubling"], 0).unwrap();
        assert!(
            (w[0] - 0.96).abs() < 1e-12 && (w[1] / w[2] - 2.2).abs() < 1e-9,
            "{w:?}"
        );
        for (flags, says) in [
            (
                &["--replay-rule", "doubling", "--replay-gain", "0.06"][..],
                "--replay-gain",
            ),
            (&["--replay-lower-at", "1"][..], "--replay-lower-at"),
            (
                &["--replay-rule", "follow", "--replay-integral", "0.1"][..],
                "--replay-integral",
            ),
            (&["--replay-gain", "0"][..], "gain"),
            (&["--replay-margin", "1"][..], "margin"),
            (&["--replay-close-cap", "2"][..], "closing cap"),
            (&["--replay-close-round", "0"][..], "closing round"),
        ] {
            let err = bounded_shares(flags, 0).unwrap_err().to_string();
            assert!(err.contains(says), "{flags:?}: {err}");
        }
    }

    /// The closing's cap is a fifth of the 50 planned steps unless told, off at 0.
    #[test]
    fn the_closing_is_on_by_default_and_off_at_a_cap_of_0() {
        let cli = |flags: &[&str]| three_domains(&[BOUND, flags].concat()).unwrap();
        let mut default = bound_of(&cli(&[])).unwrap().unwrap();
        assert_eq!(default.plan_run(Some(50)), None);
        assert!(default.closes());
        let mut off = bound_of(&cli(&["--replay-close-cap", "0"]))
            .unwrap()
            .unwrap();
        off.plan_run(Some(50));
        assert!(!off.closes());
    }

    #[test]
    fn the_bounds_flags_need_the_bound() {
        let with = |extra: &[&str]| three_domains(&[BOUND, extra].concat());
        assert!(with(&[
            "--replay-gain",
            "0.06",
            "--replay-start",
            "0.2:0.2",
            "--replay-finish",
            "0:0.8"
        ])
        .is_ok());
        for flags in [
            &["--replay-gain", "0.06"][..],
            &["--replay-start", "0.2:0.2"],
            &["--replay-finish", "0:0.8"],
            &["--replay-rule", "doubling"],
            &["--replay-lower-at", "1"],
            &["--replay-integral", "0.1"],
            &["--replay-margin", "0.1"],
            &["--replay-close-cap", "0"],
            &["--replay-close-round", "5"],
            &["--replay-reference-model", "phase1"],
        ] {
            assert!(three_domains(flags).is_err(), "{flags:?} needs the bound");
        }
        // Read on a held-out set every 5 steps: it needs that set.
        assert!(with(&["--replay-every", "5"]).is_err());
        let held_out = ["--mixer-eval-examples", "100", "--replay-every", "5"];
        let c = with(&held_out).unwrap();
        assert!(bound_of(&c).unwrap().unwrap().wants_held_out(5));
        // One reference or the other, and one is needed.
        let model = ["--replay-reference-model", "phase1"];
        assert!(with(&model).is_err(), "both references");
        let bound_alone = ["--new-domain", "python", "--replay-bound", "0.05"];
        let c = three_domains(&bound_alone).unwrap();
        let err = bounded_replay(&c.replay.bound, &c.new_domain, &c.train, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--replay-reference-model"), "{err}");
        assert!(three_domains(&[&bound_alone[..], &model].concat()).is_ok());
    }
}
