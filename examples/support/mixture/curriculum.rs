//! `--replay-ramp` and `--replay-steps`: the old domains' share of the tokens as a
//! curve over the run, split among them by `--replay-split`.

use adabatch::prelude::*;
use adabatch::tokenize::CorpusInfo;
use adabatch::CurriculumMixer;

use super::args::{MixerChoice, MixtureArgs, PerDomain};

/// `--replay-ramp FROM,TO[,UNTIL]` or `--replay-steps` as a curriculum over
/// documents: the new domains share `1 − r`, the old ones `r` (by
/// `--replay-split`, else evenly); for the
/// ramp `r` is linear from FROM at the first document to TO at the fraction UNTIL
/// (default 1) of those the run is expected to take, then TO. A fraction of the
/// tokens becomes documents by each stretch's mean document length under its
/// mean shares.
pub fn replay_curriculum(
    cli: &MixtureArgs,
    names: &[String],
    infos: &[CorpusInfo],
    args: &TrainingArgs,
) -> adabatch::Result<Option<CurriculumMixer>> {
    let replay = &cli.replay;
    let knots = match (replay.replay_ramp, &replay.replay_steps) {
        (Some((from, to, until)), _) => vec![(0.0, from), (until, to)],
        (None, Some(steps)) => steps.knots(),
        (None, None) if replay.replay_split.is_some() => {
            return Err(adabatch::Error::msg(
                "--replay-split splits the share of --replay-ramp or --replay-steps: give one",
            ))
        }
        (None, None) => return Ok(None),
    };
    let conflict = |second, reason| {
        adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
            first: "--replay-ramp / --replay-steps",
            second,
            reason,
        })
    };
    if cli.mixer != MixerChoice::Stratified
        || replay.replay_budget.is_some()
        || !args.data.mix_weights.is_empty()
    {
        return Err(conflict(
            "--mixer / --replay-budget / --mix-weights",
            "the replay's curve decides every domain's share itself",
        ));
    }
    let Some(tokens) = args.length.max_train_tokens else {
        return Err(conflict(
            "a run not counted in tokens",
            "the replay's curve runs over --max-train-tokens",
        ));
    };
    let new: Vec<bool> = names.iter().map(|n| cli.new_domain.contains(n)).collect();
    let n_new = new.iter().filter(|&&b| b).count();
    if n_new == 0 || n_new == new.len() {
        return Err(adabatch::Error::msg(format!(
            "--replay-ramp / --replay-steps need new and old domains: --new-domain {:?} of {names:?}",
            cli.new_domain
        )));
    }
    let split = replay_split(replay.replay_split.as_ref(), names, &new)?;
    let shares = |r: f64| -> Vec<f64> {
        (new.iter().zip(&split))
            .map(|(&is_new, part)| {
                if is_new {
                    (1.0 - r) / n_new as f64
                } else {
                    r * part
                }
            })
            .collect()
    };
    let points = documents_at(&knots, tokens as f64, infos, shares);
    CurriculumMixer::new(points).map(Some)
}

/// The curve's knots (fraction of the tokens, replay share) as points (document,
/// shares): the documents per token over each stretch at its mean shares (linear
/// in them); a step is two points one document apart.
fn documents_at(
    knots: &[(f64, f64)],
    tokens: f64,
    infos: &[CorpusInfo],
    shares: impl Fn(f64) -> Vec<f64>,
) -> Vec<(usize, Vec<f64>)> {
    let per_token = |r: f64| -> f64 {
        (shares(r).iter().zip(infos))
            .map(|(w, info)| w * info.train_documents as f64 / info.train_tokens.max(1) as f64)
            .sum()
    };
    let mut points = vec![(0, shares(knots[0].1))];
    let mut documents = 0.0;
    for pair in knots.windows(2) {
        let ((at, before), (next, after)) = (pair[0], pair[1]);
        documents += tokens * (next - at) * per_token((before + after) / 2.0);
        let document = (documents.round() as usize).max(points[points.len() - 1].0 + 1);
        points.push((document, shares(after)));
    }
    points
}

/// Each old domain's part of the replay share (summing to 1; 0 for new ones):
/// `--replay-split`'s weights over old domains, every one of them named with a
/// positive weight, else evenly.
fn replay_split(
    split: Option<&PerDomain>,
    names: &[String],
    new: &[bool],
) -> adabatch::Result<Vec<f64>> {
    let old = || {
        (names.iter().zip(new))
            .filter(|(_, &is_new)| !is_new)
            .map(|(n, _)| n)
    };
    let weight = |name: &String| match split {
        None => Ok(1.0),
        Some(split) => match split.0.iter().find(|(n, _)| n == name) {
            Some(&(_, w)) if w.is_finite() && w > 0.0 => Ok(w),
            found => Err(adabatch::Error::Settings(
                adabatch::SettingsError::InvalidSetting {
                    name: "--replay-split",
                    value: found
                        .map_or(format!("no weight for {name}"), |(n, w)| format!("{n}={w}")),
                    expected: "a positive weight for every old domain",
                },
            )),
        },
    };
    let named: Vec<&String> = split.iter().flat_map(|s| &s.0).map(|(n, _)| n).collect();
    if let Some(twice) = (named.iter().enumerate()).find(|(i, n)| named[..*i].contains(n)) {
        return Err(adabatch::Error::msg(format!(
            "--replay-split names {} twice",
            twice.1
        )));
    }
    if let Some(stranger) = named.iter().find(|n| !old().any(|o| o == **n)) {
        return Err(adabatch::Error::msg(format!(
            "--replay-split names {stranger}, which is not an old domain: they are {:?}",
            old().collect::<Vec<_>>()
        )));
    }
    let weights: Vec<f64> = (names.iter().zip(new))
        .map(|(name, &is_new)| if is_new { Ok(0.0) } else { weight(name) })
        .collect::<adabatch::Result<_>>()?;
    let total: f64 = weights.iter().sum();
    Ok(weights.iter().map(|w| w / total).collect())
}

/// `--replay-split`'s checks: what a user mistypes is refused with a message that
/// names it.
#[cfg(test)]
mod tests {
    use super::super::args::three_domains;
    use super::*;

    #[test]
    fn a_replay_split_names_each_old_domain_once_with_a_positive_weight() {
        let names = ["python", "en", "kjv"].map(String::from);
        let new = [true, false, false];
        let split = |text: &str| {
            let cli = three_domains(&[
                "--new-domain",
                "python",
                "--replay-ramp",
                "0.2,0",
                "--replay-split",
                text,
            ])
            .unwrap();
            let split = cli.replay.replay_split.as_ref();
            replay_split(split, &names, &new).map_err(|e| e.to_string())
        };
        let w = split("en=3,kjv=1").unwrap();
        assert_eq!(w, [0.0, 0.75, 0.25]);
        assert!(split("en=3,en=1,kjv=1").unwrap_err().contains("twice"));
        assert!(split("en=3,kjv=1,eng=1").unwrap_err().contains("eng"));
        assert!(split("en=3").unwrap_err().contains("kjv"));
        assert!(split("en=3,kjv=0").unwrap_err().contains("kjv=0"));
    }
}
