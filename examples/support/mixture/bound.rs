//! `--replay-bound`: the least replay that keeps each old domain's loss within a
//! bound of its reference, by `--replay-rule`.

use adabatch::prelude::*;
use adabatch::tokenize::CorpusInfo;
use adabatch::BoundedReplay;

use super::args::{BoundArgs, ReplayRule, REPLAY_EVAL_STEPS};
use super::mixers::expected_steps;

/// `--replay-rule follow`'s gain and start when no flag sets them (how they were
/// chosen: docs/guide/mixing.md, "Replay that follows the drift").
const REPLAY_GAIN: f64 = 0.06;
const REPLAY_START: (f64, f64) = (0.2, 0.1);

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
    let (mut bounded, start) = with_rule(bounded, flags)?;
    if args.eval.mixer_eval_examples.is_some() {
        bounded = bounded.with_held_out(flags.replay_every.unwrap_or(REPLAY_EVAL_STEPS))?;
    }
    if start.is_some() || flags.replay_finish.is_some() {
        let steps = expected_steps(args, infos).ok_or_else(|| {
            adabatch::Error::msg(
                "--replay-start's and --replay-finish's fractions are of the run's expected steps: give --max-steps or --max-train-tokens",
            )
        })?;
        let at = |fraction: f64| (fraction * steps as f64).round() as usize;
        if let Some((share, fraction)) = start {
            bounded = bounded.with_start(share, at(fraction))?;
        }
        if let Some((share, fraction)) = flags.replay_finish {
            // The step at FRACTION of the run, counted from 1.
            bounded = bounded.with_finish(share, at(fraction) + 1)?;
        }
    }
    Ok(Some(bounded))
}

/// `--replay-rule` with its own flag (`--replay-gain` or `--replay-lower-at`, the
/// other refused), and the start it takes: `--replay-start`, by default 20 % for
/// a tenth of the run under `follow` (at most `--replay-max`), none under
/// `doubling`.
fn with_rule(
    mut bounded: BoundedReplay,
    flags: &BoundArgs,
) -> adabatch::Result<(BoundedReplay, Option<(f64, f64)>)> {
    let rule = |other: &'static str| {
        adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
            first: "--replay-rule",
            second: other,
            reason: "--replay-gain is the follow rule's, --replay-lower-at the doubling's",
        })
    };
    let start = match flags.replay_rule {
        ReplayRule::Follow if flags.replay_lower_at.is_some() => {
            return Err(rule("--replay-lower-at"))
        }
        ReplayRule::Doubling if flags.replay_gain.is_some() => return Err(rule("--replay-gain")),
        ReplayRule::Follow => {
            bounded = bounded.with_gain(flags.replay_gain.unwrap_or(REPLAY_GAIN))?;
            let (share, fraction) = REPLAY_START;
            Some(
                flags
                    .replay_start
                    .unwrap_or((share.min(flags.replay_max), fraction)),
            )
        }
        ReplayRule::Doubling => {
            if let Some(fraction) = flags.replay_lower_at {
                bounded = bounded.with_lower_at(fraction)?;
            }
            flags.replay_start
        }
    };
    Ok((bounded, start))
}

/// The bound's flags and rules: what a user mistypes is refused with a message
/// that names it.
#[cfg(test)]
mod tests {
    use super::super::args::{three_domains, MixtureArgs, BOUND};
    use super::*;
    use adabatch::{MixUnit, Mixer};

    /// `cli`'s bound over a run of 50 steps.
    fn bound_of(cli: &MixtureArgs) -> adabatch::Result<Option<BoundedReplay>> {
        let mut args = cli.train.clone();
        args.length.max_steps = Some(50);
        bounded_replay(&cli.replay.bound, &cli.new_domain, &args, &[])
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
        };
        Ok(mixer.weights(&stats))
    }

    #[test]
    fn the_bound_follows_the_drift_after_a_start_unless_told_otherwise() {
        // Follow (the default): 20 % for the first 5 of 50 steps, then 6 % × 6 / 5.
        assert_eq!(bounded_shares(&[], 0).unwrap(), [0.8, 0.1, 0.1]);
        let w = bounded_shares(&[], 5).unwrap();
        assert!(
            (w[1] - 0.06 * 0.06 / 0.05).abs() < 1e-12 && w[2] == 0.0,
            "{w:?}"
        );
        let w = bounded_shares(&["--replay-gain", "0.03", "--replay-start", "0:0"], 0).unwrap();
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
            (&["--replay-gain", "0"][..], "gain"),
        ] {
            let err = bounded_shares(flags, 0).unwrap_err().to_string();
            assert!(err.contains(says), "{flags:?}: {err}");
        }
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
