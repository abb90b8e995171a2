//! The example's flags, their values' parsers, and the training arguments with the
//! example's defaults.

use std::path::PathBuf;

use adabatch::prelude::*;
use clap::ValueEnum;

use super::decoder::{self, ModelArgs};

/// The example's flags: the trainer's, the model's, the domains', each mixer's and
/// the continual-pretraining replays'.
#[derive(clap::Args)]
pub struct MixtureArgs {
    #[command(flatten)]
    pub train: TrainingArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// A domain, `NAME=PATH`: a corpus file or folder as `adabatch tokenize` reads
    /// them (a document per line, or JSON lines with "text", gzipped or not; Parquet
    /// and Arrow with the `parquet` feature), tokenized into --tokens-dir on first
    /// run, or a folder `adabatch tokenize --domain` prepared (folders of different
    /// tokenizers are refused). Repeat it; the default is the three domains of
    /// `data/`: en, kjv and python.
    #[arg(long, value_parser = parse_domain)]
    pub domain: Vec<(String, PathBuf)>,
    /// How the domains are mixed in every global batch.
    #[arg(long, value_enum, default_value_t = MixerChoice::Online)]
    pub mixer: MixerChoice,
    /// Where corpus files are tokenized: reused when prepared from the same files
    /// and settings; a directory prepared from anything else is refused.
    #[arg(long, default_value = "adabatch_output/mixture-tokens")]
    pub tokens_dir: PathBuf,
    #[command(flatten)]
    pub tokens: decoder::TokenArgs,
    /// Continual pretraining (with --init-from a model trained on the other
    /// domains): the domains being learnt now (repeat it); the others are replayed
    /// by --replay-budget (under `--mixer online`, `odm` or `aioli`),
    /// --replay-ramp, --replay-steps or --replay-bound.
    #[arg(long)]
    pub new_domain: Vec<String>,
    #[command(flatten)]
    pub replay: ReplayArgs,
    #[command(flatten)]
    pub aioli: AioliArgs,
    #[command(flatten)]
    pub online: OnlineArgs,
    #[command(flatten)]
    pub pike: PikeArgs,
}

/// The replay of the old domains while --new-domain is learnt: a budget around
/// the mixer, a curve over the run, or a bound on the old domains' losses.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The replayed (old) domains' largest share of each step, together (0 to 1),
    /// with --new-domain: `adabatch::ReplayBudget` around the mixer.
    #[arg(long, requires = "new_domain")]
    pub replay_budget: Option<f64>,
    /// With --new-domain and --max-train-tokens: the old domains' share of the
    /// tokens at the start and at the end of the run, `FROM,TO` (e.g. `0,0.2`:
    /// 10 % in all, most of it late), linear in between and split evenly (or by
    /// --replay-split) among them: `adabatch::CurriculumMixer` over the documents
    /// the run is expected to take. `FROM,TO,UNTIL`: TO is reached at the fraction
    /// UNTIL of the run and kept (e.g. `0.4,0,0.5`: 10 % in all, within the first
    /// half).
    #[arg(long, requires = "new_domain", value_parser = parse_ramp)]
    pub replay_ramp: Option<(f64, f64, f64)>,
    /// With --new-domain and --max-train-tokens: the old domains' share of the
    /// tokens in steps, `FRACTION:SHARE,...` from the fraction 0 of the run's
    /// tokens on (e.g. `0:0,0.5:0.25,0.8:0.05`: none in the first half, a quarter
    /// until 80 %, then 5 %), split among them as --replay-ramp's.
    #[arg(long, requires = "new_domain", conflicts_with = "replay_ramp", value_parser = parse_replay_steps)]
    pub replay_steps: Option<ReplaySteps>,
    /// With --replay-ramp or --replay-steps: how the replay share is split among
    /// the old domains, relative weights `en=2,kjv=1` (default: evenly).
    #[arg(long, value_parser = parse_per_domain)]
    pub replay_split: Option<PerDomain>,
    #[command(flatten)]
    pub bound: BoundArgs,
}

/// `--replay-bound` and its rule's settings.
#[derive(clap::Args)]
pub struct BoundArgs {
    /// With --new-domain and --replay-reference: a replay that keeps every old
    /// domain's validation loss within this relative rise (0.05: 5 %) of its
    /// reference, read at each evaluation (`adabatch::BoundedReplay`; every 10
    /// steps unless --eval-steps says otherwise), by --replay-rule; at the
    /// planned end, replay alone while an old domain is above it
    /// (--replay-close-cap).
    #[arg(long, requires = "new_domain")]
    pub replay_bound: Option<f64>,
    /// --replay-bound's rule: `hold` (each old domain's share follows its drift
    /// and the integral of its drift above a target inside the bound,
    /// --replay-gain, --replay-integral, --replay-margin, after --replay-start),
    /// `follow` (the drift alone) or `doubling` (the share doubles past the bound
    /// and halves back within it, --replay-lower-at).
    #[arg(long, value_enum, default_value_t = ReplayRule::Hold, requires = "replay_bound")]
    pub replay_rule: ReplayRule,
    /// The old domains' validation losses before the new data, `en=5.18,kjv=3.96`
    /// (phase 1's), for --replay-bound; with --mixer-eval-examples, their losses
    /// on that held-out set (--replay-reference-model computes them).
    #[arg(long, value_parser = parse_per_domain, requires = "replay_bound")]
    pub replay_reference: Option<PerDomain>,
    /// Instead of --replay-reference: the old domains' losses of the model saved
    /// in DIR (phase 1's), computed before the first step on what --replay-bound
    /// reads (the validation documents, or the held-out set of
    /// --mixer-eval-examples).
    #[arg(long, requires = "replay_bound", conflicts_with = "replay_reference")]
    pub replay_reference_model: Option<PathBuf>,
    /// With --mixer-eval-examples N, --replay-bound reads the first N validation
    /// documents of each domain after every this many steps
    /// (`BoundedReplay::with_held_out`) instead of the evaluations (default 10).
    #[arg(long, requires_all = ["replay_bound", "mixer_eval_examples"])]
    pub replay_every: Option<usize>,
    /// --replay-bound's largest replay share.
    #[arg(long, default_value_t = 0.5)]
    pub replay_max: f64,
    /// `--replay-rule doubling` halves the share once every old domain is within
    /// this fraction of the bound (`BoundedReplay::with_lower_at`; default 0.5; 1:
    /// as soon as they are back within it).
    #[arg(long, requires = "replay_bound")]
    pub replay_lower_at: Option<f64>,
    /// `--replay-rule hold` and `follow`: each old domain replays GAIN × its
    /// drift / the bound of each step (`BoundedReplay::with_gain`; default 0.06:
    /// 6 % at the bound), plus under `hold` its integral.
    #[arg(long, requires = "replay_bound")]
    pub replay_gain: Option<f64>,
    /// `--replay-rule hold`: what a reading a whole bound above the target adds to
    /// a domain's integral (`BoundedReplay::with_hold`; default 0.015).
    #[arg(long, requires = "replay_bound")]
    pub replay_integral: Option<f64>,
    /// `--replay-rule hold`: the target's distance inside the bound, a fraction
    /// of it (`BoundedReplay::with_hold`; default 0.02: 4.9 % for a bound of 5 %).
    #[arg(long, requires = "replay_bound")]
    pub replay_margin: Option<f64>,
    /// --replay-bound's closing: at most this fraction of the planned steps of
    /// replay alone after them, while an old domain is above the bound
    /// (`BoundedReplay::with_closing`; default 0.2; 0: none).
    #[arg(long, requires = "replay_bound")]
    pub replay_close_cap: Option<f64>,
    /// --replay-bound's closing rounds, in steps, each read after it (default 5).
    #[arg(long, requires = "replay_bound")]
    pub replay_close_round: Option<usize>,
    /// --replay-bound replays SHARE of each step, evenly, for the first FRACTION
    /// of the run's expected steps, before its rule decides
    /// (`BoundedReplay::with_start`; default 0.2:0.1 under `hold` and `follow`,
    /// none under `doubling`; 0:0: none).
    #[arg(long, requires = "replay_bound", value_parser = parse_share_at)]
    pub replay_start: Option<(f64, f64)>,
    /// --replay-bound replays SHARE of each step, evenly, from FRACTION of the
    /// run's expected steps to the end, its rule deciding before
    /// (`BoundedReplay::with_finish`; e.g. 0:0.8: none in the last fifth).
    #[arg(long, requires = "replay_bound", value_parser = parse_share_at)]
    pub replay_finish: Option<(f64, f64)>,
}

/// `--mixer aioli`'s settings.
#[derive(clap::Args)]
pub struct AioliArgs {
    /// `--mixer aioli`'s step size η (`adabatch::AioliMixer::new(ROUND, 4, 0.6, η)`).
    #[arg(long, default_value_t = 2.0)]
    pub aioli_eta: f64,
    /// `--mixer aioli`'s round: steps from one LearnParams to the next.
    #[arg(long, default_value_t = 50)]
    pub aioli_round: usize,
    /// `--mixer aioli`: average the laws over rounds with this weight of the past
    /// (`AioliMixer::with_smoothing`); without it, the paper's compounding step.
    #[arg(long)]
    pub aioli_smoothing: Option<f64>,
    /// `--mixer aioli`: descend a soft worst domain, the law's rows weighted by a
    /// softmax of the domains' losses at this temperature in nats
    /// (`AioliMixer::with_worst_focus`); without it, the paper's average loss.
    #[arg(long)]
    pub aioli_worst_temperature: Option<f64>,
    /// `--mixer aioli`: read each probe on the domains' held-out losses before
    /// and after it, as the paper does (`AioliMixer::with_held_out`), from the
    /// first --mixer-eval-examples N validation documents of each domain.
    #[arg(long, requires = "mixer_eval_examples")]
    pub aioli_held_out: bool,
}

/// `--mixer online`'s settings.
#[derive(clap::Args)]
pub struct OnlineArgs {
    /// `--mixer online`'s temperature in nats (`OnlineMixer::with_temperature`;
    /// default the library's, 1.5): higher is nearer uniform.
    #[arg(long)]
    pub online_temperature: Option<f64>,
    /// `--mixer online`: equal shares for the first N steps, then the softmax
    /// (`OnlineMixer::with_warmup`; the losses are averaged from the start).
    #[arg(long, conflicts_with = "online_warmup")]
    pub online_warmup_steps: Option<usize>,
    /// `--mixer online`: the warm-up as a fraction of the steps the run is
    /// expected to take (from --max-steps, else --max-train-tokens over the tokens
    /// a step); default the library's, 0.4 (`OnlineMixer::DEFAULT_WARMUP_FRACTION`).
    #[arg(long, value_parser = parse_fraction)]
    pub online_warmup: Option<f64>,
}

/// `--mixer pike` and `pike-fair`'s settings, named as the paper's (default the
/// library's, `adabatch_rules::pike`).
#[derive(clap::Args)]
pub struct PikeArgs {
    /// `--mixer pike`: T₀, measure each domain's gradient norm and variance and
    /// move the shares every N steps (on the step's own documents;
    /// `PikeMixer::with_t0`).
    #[arg(long)]
    pub pike_t0: Option<usize>,
    /// `--mixer pike`: ζ₁, the weight of a domain's squared gradient norm in
    /// the shares' update, in units of the domains' mean (`PikeMixer::with_zeta1`;
    /// default 0.03).
    #[arg(long)]
    pub pike_zeta1: Option<f64>,
    /// `--mixer pike`: ζ₂, the weight of its gradient variance over twice the
    /// batch, in the same units (`PikeMixer::with_zeta2`; default 0.03; 0: the
    /// norm alone).
    #[arg(long)]
    pub pike_zeta2: Option<f64>,
    /// `--mixer pike`: every domain's least share, together (`PikeMixer::with_floor`;
    /// default 0.1; 0: the paper's algorithm).
    #[arg(long, value_parser = parse_fraction)]
    pub pike_floor: Option<f64>,
    /// `--mixer pike`: the statistics' moving-average decay per measurement
    /// (`PikeMixer::with_smoothing`; default 0.8; 0: each measurement alone,
    /// as the paper).
    #[arg(long)]
    pub pike_smoothing: Option<f64>,
    /// `--mixer pike-fair`: τ, Balanced-PiKE's tilt on the domains' losses
    /// (`PikeMixer::fair`; default 3): higher favours the domains behind.
    #[arg(long)]
    pub pike_tau: Option<f64>,
}

/// How `--replay-bound` moves the replay share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReplayRule {
    /// Each old domain's share follows its drift and its drift's integral above
    /// a target inside the bound (`BoundedReplay::new`).
    Hold,
    /// Each old domain's share follows its drift (`BoundedReplay::with_gain`).
    Follow,
    /// The share doubles past the bound, halves back within it.
    Doubling,
}

/// `--mixer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MixerChoice {
    /// Each domain's share of the tokens is its share of the training tokens
    /// (sampling in proportion to size), or --mix-weights' fixed shares.
    Stratified,
    /// An equal share of the tokens each.
    Uniform,
    /// `adabatch::OnlineMixer` with the library's defaults: a softmax of each
    /// domain's smoothed training loss per token at 1.5 nats (--online-temperature),
    /// a 5 % floor, after equal shares for the first 40 % of the run's steps
    /// (--online-warmup).
    Online,
    /// Online Data Mixing (Albalak et al. 2023), `adabatch::Exp3Mixer`: an Exp3
    /// bandit rewarded by each domain's training loss.
    Odm,
    /// Aioli (Chen et al. 2024), `adabatch::AioliMixer`: every --aioli-round steps
    /// a probe of 4 steps per domain estimates what each domain's data does to
    /// every domain's loss, then an exponentiated-gradient step on the total.
    Aioli,
    /// PiKE (Li et al. 2025), `adabatch::PikeMixer`: every --pike-t0 steps
    /// each domain's gradient norm and variance, measured on the step's own
    /// documents, move the shares towards those that most lower the total loss.
    Pike,
    /// Balanced-PiKE, `adabatch::PikeMixer::fair`: the domains' losses tilted by
    /// --pike-tau, so that the domains behind gain more.
    PikeFair,
}

/// `--replay-bound`'s evaluations when `--eval-steps` is not given: every 10
/// steps (the example's 100 is too rare for a bound that reads them).
pub const REPLAY_EVAL_STEPS: usize = 10;

/// The program's flags and their matches (which say what the command line gave),
/// with the example's defaults; HF's spellings and arguments files are read too.
pub fn parse<C: clap::Parser>() -> (C, clap::ArgMatches) {
    let matches = adabatch::hf_matches(with_defaults(C::command()));
    let cli = C::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    (cli, matches)
}

/// The trainer's flags with this example's defaults.
fn with_defaults(command: clap::Command) -> clap::Command {
    decoder::llama_optimizer_defaults(command)
        .mut_arg("learning_rate", |a| a.default_value("3e-3"))
        .mut_arg("lr_reference_batch", |a| a.default_value("32"))
        .mut_arg("global_batch_size", |a| a.default_value("32"))
        .mut_arg("max_train_tokens", |a| a.default_value("600000"))
        .mut_arg("warmup_ratio", |a| a.default_value("0.02"))
        .mut_arg("lr_scheduler_type", |a| a.default_value("cosine"))
        .mut_arg("logging_steps", |a| a.default_value("10"))
        .mut_arg("eval_steps", |a| a.default_value("100"))
        .mut_arg("per_device_eval_batch_size", |a| a.default_value("64"))
        .mut_arg("save_steps", |a| a.default_value("500"))
        .mut_arg("save_total_limit", |a| a.default_value("2"))
        .mut_arg("output_dir", |a| a.default_value("adabatch_output/mixture"))
        .mut_arg("validation_fraction", |a| a.default_value("0.02"))
}

/// The example's flags parsed from `argv` (the program's name first).
#[cfg(test)]
pub fn try_parse_from(argv: &[&str]) -> Result<(MixtureArgs, clap::ArgMatches), clap::Error> {
    use clap::{Args, FromArgMatches};
    let command = with_defaults(MixtureArgs::augment_args(clap::Command::new("mixture")));
    let matches = command.try_get_matches_from(argv)?;
    Ok((MixtureArgs::from_arg_matches(&matches)?, matches))
}

/// The example's flags over the domains en, kjv and python, and `flags`.
#[cfg(test)]
pub fn three_domains(flags: &[&str]) -> Result<MixtureArgs, clap::Error> {
    let domains = [
        "mixture",
        "--domain",
        "en=e.txt",
        "--domain",
        "kjv=k.txt",
        "--domain",
        "python=p.txt",
    ];
    try_parse_from(&[&domains, flags].concat()).map(|(cli, _)| cli)
}

/// A bound of 5 % on en and kjv, python new.
#[cfg(test)]
pub const BOUND: &[&str] = &[
    "--new-domain",
    "python",
    "--replay-bound",
    "0.05",
    "--replay-reference",
    "en=4.0,kjv=3.0",
];

/// The training arguments with this example's defaults: the three domains of
/// `data/` when none is given; a batch in tokens alone when one is given; an
/// evaluation every 10 steps for `--replay-bound`; the per-device batch from the
/// global one.
pub fn training_args(cli: &mut MixtureArgs, matches: &clap::ArgMatches) -> TrainingArgs {
    if cli.domain.is_empty() {
        cli.domain = vec![
            ("en".into(), "data/en_sentences_15k.txt.gz".into()),
            ("kjv".into(), "data/kjv_verses.txt.gz".into()),
            ("python".into(), "data/python_functions.jsonl.gz".into()),
        ];
    }
    let mut args = cli.train.clone();
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if args.length_aware.max_tokens_per_batch.is_some() && !given("global_batch_size") {
        // A batch in tokens (--max-tokens-per-batch N --packed-token-budget): no
        // count of documents besides it.
        args.batch.global_batch_size = None;
    }
    let bound = cli.replay.bound.replay_bound.is_some();
    if bound && args.eval.mixer_eval_examples.is_none() && !given("eval_steps") {
        // The bound reads evaluations: every 100 steps is too rare for it.
        args.eval.eval_steps = Some(REPLAY_EVAL_STEPS);
    }
    if !given("per_device_train_batch_size") {
        // The global batch decides; a per-device size nobody set is not warned about.
        let global = args.batch.global_batch_size.unwrap_or(32);
        args.batch.per_device_train_batch_size = global.div_ceil(args.launch.nproc_per_node.max(1));
    }
    args
}

/// `FROM,TO` or `FROM,TO,UNTIL`: shares from 0 to 1, UNTIL above 0.
fn parse_ramp(text: &str) -> Result<(f64, f64, f64), String> {
    let share = |s: &str| match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share from 0 to 1")),
    };
    match text.split(',').collect::<Vec<_>>()[..] {
        [from, to] => Ok((share(from)?, share(to)?, 1.0)),
        [from, to, until] => match share(until)? {
            0.0 => Err(format!(
                "{text:?}: the ramp must end after the start (UNTIL > 0)"
            )),
            until => Ok((share(from)?, share(to)?, until)),
        },
        _ => Err(format!(
            "{text:?}: give the replay's shares as FROM,TO or FROM,TO,UNTIL"
        )),
    }
}

/// `--replay-steps`: (fraction of the run, replay share from there on).
#[derive(Clone, Debug)]
pub struct ReplaySteps(Vec<(f64, f64)>);

/// `FRACTION:SHARE,...`: fractions rising from 0, below 1; shares from 0 to 1.
fn parse_replay_steps(text: &str) -> Result<ReplaySteps, String> {
    let steps: Vec<(f64, f64)> = (text.split(','))
        .map(|step| {
            let (at, share) = (step.split_once(':'))
                .ok_or_else(|| format!("{step:?}: expected FRACTION:SHARE"))?;
            Ok((parse_fraction(at)?, parse_fraction(share)?))
        })
        .collect::<Result<_, String>>()?;
    if steps.first().map(|s| s.0) != Some(0.0) {
        return Err(format!("{text:?}: the first step starts the run (0:SHARE)"));
    }
    if steps.windows(2).any(|w| w[1].0 <= w[0].0) || steps.iter().any(|s| s.0 >= 1.0) {
        return Err(format!("{text:?}: the fractions must rise, each below 1"));
    }
    Ok(ReplaySteps(steps))
}

impl ReplaySteps {
    /// The share at each fraction where it changes, on both sides of the change:
    /// the corners of a curve linear between them.
    pub fn knots(&self) -> Vec<(f64, f64)> {
        let mut knots = vec![self.0[0]];
        for pair in self.0.windows(2) {
            let ((_, before), (at, share)) = (pair[0], pair[1]);
            knots.extend([(at, before), (at, share)]);
        }
        knots
    }
}

/// `--replay-start` and `--replay-finish`'s `SHARE:FRACTION`.
fn parse_share_at(text: &str) -> Result<(f64, f64), String> {
    let (share, fraction) =
        (text.split_once(':')).ok_or_else(|| format!("{text:?}: expected SHARE:FRACTION"))?;
    Ok((parse_fraction(share)?, parse_fraction(fraction)?))
}

/// A fraction from 0 to 1.
fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{text:?} is not a fraction from 0 to 1")),
    }
}

/// A number by domain, `--replay-reference`'s losses or `--replay-split`'s
/// weights (one value: clap would take a
/// `Vec` for a flag given several times).
#[derive(Clone, Debug)]
pub struct PerDomain(pub Vec<(String, f64)>);

/// `NAME=NUMBER,NAME=NUMBER`.
fn parse_per_domain(text: &str) -> Result<PerDomain, String> {
    (text.split(','))
        .map(|pair| {
            let (name, loss) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?}: expected NAME=NUMBER"))?;
            let loss: f64 =
                (loss.trim().parse()).map_err(|_| format!("{pair:?}: {loss:?} is not a number"))?;
            Ok((name.trim().to_string(), loss))
        })
        .collect::<Result<_, String>>()
        .map(PerDomain)
}

/// `NAME=PATH`.
fn parse_domain(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("{text:?}: give a domain as NAME=PATH")),
    }
}

/// The flags' parsing: what a user mistypes is refused with a message that names
/// it.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_steps_start_at_0_and_rise_below_1() {
        let steps = parse_replay_steps("0:0.06,0.4:0.14,0.8:0.04").unwrap();
        assert_eq!(
            steps.knots(),
            [
                (0.0, 0.06),
                (0.4, 0.06),
                (0.4, 0.14),
                (0.8, 0.14),
                (0.8, 0.04)
            ]
        );
        for (bad, says) in [
            ("0.1:0.1", "starts the run"),
            ("0:0.1,0.5:0.2,0.4:0.1", "must rise"),
            ("0:0.1,1:0.2", "must rise"),
            ("0:1.5", "not a fraction"),
            ("0-0.1", "FRACTION:SHARE"),
        ] {
            let err = parse_replay_steps(bad).err().unwrap_or_default();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn replay_start_and_per_domain_values_parse_or_say_why_not() {
        assert_eq!(parse_share_at("0.2:0.25"), Ok((0.2, 0.25)));
        assert!(parse_share_at("0.2")
            .unwrap_err()
            .contains("SHARE:FRACTION"));
        assert!(parse_share_at("1.5:0.2")
            .unwrap_err()
            .contains("not a fraction"));
        let split = parse_per_domain("en=2, kjv=1").unwrap();
        assert_eq!(split.0, [("en".to_string(), 2.0), ("kjv".to_string(), 1.0)]);
        assert!(parse_per_domain("en").unwrap_err().contains("NAME=NUMBER"));
        assert!(parse_per_domain("en=two")
            .unwrap_err()
            .contains("not a number"));
    }

    /// The bound reads evaluations: every 10 steps unless --eval-steps is given;
    /// without the bound, or with a held-out set it reads instead, the
    /// example's 100 stays.
    #[test]
    fn the_bound_evaluates_every_10_steps_unless_told() {
        let eval_steps = |flags: &[&str]| {
            let argv = [&["mixture", "--domain", "en=e.txt"], flags].concat();
            let (mut cli, matches) = try_parse_from(&argv).unwrap();
            training_args(&mut cli, &matches).eval.eval_steps
        };
        assert_eq!(eval_steps(BOUND), Some(REPLAY_EVAL_STEPS));
        assert_eq!(
            eval_steps(&[BOUND, &["--eval-steps", "5"]].concat()),
            Some(5)
        );
        assert_eq!(eval_steps(&[]), Some(100));
        // On a held-out set it reads no evaluation.
        let held_out = [BOUND, &["--mixer-eval-examples", "100"]].concat();
        assert_eq!(eval_steps(&held_out), Some(100));
    }
}
