//! Pretrain a small Llama decoder on several text domains mixed in every global
//! batch, the mixture decided by a mixer: English sentences, King James verses and
//! Python functions (`data/`) by default, one byte-level BPE trained on the
//! training documents of all of them, each domain's validation loss (nats per
//! token) measured apart.
//!
//! ```text
//! cargo run --release --example mixture -- --mixer odm --nproc-per-node 2
//! cargo run --release --example mixture -- --domain en=data/en_sentences_15k.txt.gz \
//!     --domain code=my_functions.jsonl --mixer stratified --max-train-tokens 1000000
//! ```
//!
//! `--domain NAME=PATH` (repeat it): a corpus file or folder as `adabatch tokenize`
//! reads them (a document per line, JSON lines with "text", gzipped or not; Parquet
//! and Arrow with the `parquet` feature), tokenized into `--tokens-dir` on first run; or a
//! folder `adabatch tokenize --domain ...` prepared (folders of different
//! tokenizers are refused). `--mixer`:
//!
//! - `stratified`: each domain's share of the tokens is its share of the training
//!   tokens (sampling in proportion to size: the baseline to beat);
//!   `--mix-weights en=0.5,code=0.5` replaces it with fixed shares;
//! - `uniform`: an equal share of the tokens each;
//! - `online` (the default): `adabatch::OnlineMixer`, a softmax of each domain's
//!   smoothed training loss per token at a temperature of 1.5 nats, with a 5 %
//!   floor, after equal shares for the first 40 % of the run's steps (the losses
//!   averaged meanwhile; `--online-temperature`, `--online-warmup`): the
//!   library's defaults. Measured against uniform on 6 seeds of the three
//!   domains and of four: a lower worst domain on every seed, with a mean within
//!   0.01 of uniform's on those seeds (which chose the temperature) and on 2 of 3
//!   seeds at another budget (BENCHMARKS.md, "The online mixer with a warm-up");
//! - `odm`: Online Data Mixing (Albalak et al. 2023), `adabatch::Exp3Mixer`: an
//!   Exp3 bandit rewarded by each domain's training loss, α = 0.9;
//! - `aioli`: Aioli (Chen et al. 2024), `adabatch::AioliMixer::default()`: every
//!   50 steps a probe of 4 steps per domain estimates what each domain's data does
//!   to every domain's loss, then an exponentiated-gradient step on the total
//!   (`--aioli-worst-temperature T`: on a soft worst domain instead;
//!   `--aioli-held-out --mixer-eval-examples N`: each probe read on the domains'
//!   held-out losses before and after it, as the paper does).
//!
//! Shares are of tokens (`--mix-unit documents`: of documents). The run lasts
//! `--max-train-tokens` (default 600,000; the learning rate's warm-up and cosine run
//! over them), at a fixed global batch of 32 documents (`--global-batch-size`) or of
//! N tokens (`--max-tokens-per-batch N --packed-token-budget`: as many documents as
//! fit, so that every mixer trains the same tokens a step),
//! AdamW at 3e-3 (betas 0.9, 0.95). Every logged step carries `mix_weights`,
//! `source_loss` (per token) and `source_tokens`; every evaluation
//! `eval_<domain>_loss`. `--summary-json` writes the per-domain losses, and
//! `--init-from DIR` continues from a saved model (continual pretraining: train on
//! some domains, then on a new one with a replay share of the old, e.g.
//! `--mix-weights new=0.9,en=0.05,kjv=0.05`; a replay share that changes over the
//! run, `--new-domain new --replay-ramp 0.2,0` or `--replay-steps
//! 0:0.06,0.4:0.14,0.8:0.04`, split among the old domains by `--replay-split`; or
//! a replay that keeps each old domain within 5 % of its loss before,
//! `--new-domain new --replay-bound 0.05 --replay-reference en=5.18,kjv=3.96`,
//! read at an evaluation every 10 steps: 20 % replayed for the first tenth of the
//! steps, then each old domain's share following its drift, 6 % of the step at
//! the bound (`--replay-start`, `--replay-gain`), which held that bound on six
//! seeds of six with the new domain level with a fixed 10 % replay; BENCHMARKS.md,
//! "Continual pretraining: a replay that follows the drift"; `--replay-rule
//! doubling`: the library's default rule). Cheaper: `--mixer-eval-examples 100
//! --replay-reference-model PHASE1_DIR` reads the first 100 validation documents
//! of each domain every 10 steps (`--replay-every`) against phase 1's model's
//! losses on them.

use std::path::{Path, PathBuf};

use adabatch::prelude::*;
use adabatch::{
    AioliMixer, BoundedReplay, CurriculumMixer, Domains, Exp3Mixer, MixUnit, Mixer, OnlineMixer,
    PackedCollate, ReplayBudget,
};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

// The language-model example's parts; this one uses the model and optimizer.
#[allow(dead_code)]
#[path = "support/decoder.rs"]
mod decoder;

use decoder::{Decoder, ModelArgs};

#[derive(Parser)]
#[command(about = "Pretrain a small Llama decoder on several domains, mixed by a mixer")]
struct Cli {
    #[command(flatten)]
    train: TrainingArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// A domain, `NAME=PATH`: a corpus file or folder (as `adabatch tokenize` reads
    /// them), or a folder `adabatch tokenize --domain` prepared. Repeat it; the
    /// default is the three domains of `data/`.
    #[arg(long, value_parser = parse_domain)]
    domain: Vec<(String, PathBuf)>,
    /// How the domains are mixed. The default, `online` (1.5 nats, equal shares
    /// for the first 40 % of the run), lowered the worst domain's validation loss
    /// below uniform's on every seed measured (three and four domains at 1,600
    /// tokens a step, seeds 1-6; three at 800, seeds 1-3); its mean was within
    /// 0.01 of uniform's on those six seeds, which chose its temperature, and on 2
    /// of 3 at 800 tokens a step (+0.0103 on the third) (BENCHMARKS.md, "The
    /// online mixer with a warm-up").
    #[arg(long, value_enum, default_value_t = MixerChoice::Online)]
    mixer: MixerChoice,
    /// What the shares are of.
    #[arg(long, value_enum, default_value_t = Unit::Tokens)]
    mix_unit: Unit,
    /// Where corpus files are tokenized: reused when prepared from the same files
    /// and settings; a directory prepared from anything else is refused.
    #[arg(long, default_value = "adabatch_output/mixture-tokens")]
    tokens_dir: PathBuf,
    #[command(flatten)]
    tokens: decoder::TokenArgs,
    /// Write the run's figures (per-domain losses, steps, tokens) here as JSON.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Continual pretraining under `--mixer online`, `odm` or `aioli`: the domains being
    /// learnt now (repeat it); the others are replayed, within --replay-budget.
    #[arg(long)]
    new_domain: Vec<String>,
    /// The replayed (old) domains' largest share of each step, together (0 to 1),
    /// with --new-domain: `adabatch::ReplayBudget` around the mixer.
    #[arg(long, requires = "new_domain")]
    replay_budget: Option<f64>,
    /// With --new-domain and --max-train-tokens: the old domains' share of the
    /// tokens at the start and at the end of the run, `FROM,TO` (e.g. `0,0.2`:
    /// 10 % in all, most of it late), linear in between and split evenly (or by
    /// --replay-split) among
    /// them: `adabatch::CurriculumMixer` over the documents the run is expected to
    /// take. `FROM,TO,UNTIL`: TO is reached at the fraction UNTIL of the run and
    /// kept (e.g. `0.4,0,0.5`: 10 % in all, within the first half).
    #[arg(long, requires = "new_domain", value_parser = parse_ramp)]
    replay_ramp: Option<(f64, f64, f64)>,
    /// With --new-domain and --max-train-tokens: the old domains' share of the
    /// tokens in steps, `FRACTION:SHARE,...` from the fraction 0 of the run's
    /// tokens on (e.g. `0:0,0.5:0.25,0.8:0.05`: none in the first half, a quarter
    /// until 80 %, then 5 %), split among them as --replay-ramp's.
    #[arg(long, requires = "new_domain", conflicts_with = "replay_ramp", value_parser = parse_replay_steps)]
    replay_steps: Option<ReplaySteps>,
    /// With --replay-ramp or --replay-steps: how the replay share is split among
    /// the old domains, relative weights `en=2,kjv=1` (default: evenly).
    #[arg(long, value_parser = parse_per_domain)]
    replay_split: Option<PerDomain>,
    /// With --new-domain and --replay-reference: a replay that keeps every old
    /// domain's validation loss within this relative rise (0.05: 5 %) of its
    /// reference, read at each evaluation (`adabatch::BoundedReplay`; every 10
    /// steps unless --eval-steps says otherwise), by --replay-rule.
    #[arg(long, requires = "new_domain")]
    replay_bound: Option<f64>,
    /// --replay-bound's rule: `follow` (each old domain's share follows its drift,
    /// --replay-gain, after --replay-start; the best measured) or `doubling` (the
    /// share doubles past the bound and halves back within it, --replay-lower-at).
    #[arg(long, value_enum, default_value_t = ReplayRule::Follow, requires = "replay_bound")]
    replay_rule: ReplayRule,
    /// The old domains' validation losses before the new data, `en=5.18,kjv=3.96`
    /// (phase 1's), for --replay-bound; with --mixer-eval-examples, their losses
    /// on that held-out set (--replay-reference-model computes them).
    #[arg(long, value_parser = parse_per_domain, requires = "replay_bound")]
    replay_reference: Option<PerDomain>,
    /// Instead of --replay-reference: the old domains' losses of the model saved
    /// in DIR (phase 1's), computed before the first step on what --replay-bound
    /// reads (the validation documents, or the held-out set of
    /// --mixer-eval-examples).
    #[arg(long, requires = "replay_bound", conflicts_with = "replay_reference")]
    replay_reference_model: Option<PathBuf>,
    /// With --mixer-eval-examples N, --replay-bound reads the first N validation
    /// documents of each domain after every this many steps
    /// (`BoundedReplay::with_held_out`) instead of the evaluations (default 10).
    #[arg(long, requires_all = ["replay_bound", "mixer_eval_examples"])]
    replay_every: Option<usize>,
    /// --replay-bound's largest replay share.
    #[arg(long, default_value_t = 0.5)]
    replay_max: f64,
    /// `--replay-rule doubling` halves the share once every old domain is within
    /// this fraction of the bound (`BoundedReplay::with_lower_at`; default 0.5; 1:
    /// as soon as they are back within it).
    #[arg(long, requires = "replay_bound")]
    replay_lower_at: Option<f64>,
    /// `--replay-rule follow`: each old domain replays GAIN × its drift / the
    /// bound of each step (`BoundedReplay::with_gain`; default 0.06: 6 % at the
    /// bound).
    #[arg(long, requires = "replay_bound")]
    replay_gain: Option<f64>,
    /// --replay-bound replays SHARE of each step, evenly, for the first FRACTION
    /// of the run's expected steps, before its rule decides
    /// (`BoundedReplay::with_start`; default 0.2:0.1 under `follow`, none under
    /// `doubling`; 0:0: none).
    #[arg(long, requires = "replay_bound", value_parser = parse_share_at)]
    replay_start: Option<(f64, f64)>,
    /// --replay-bound replays SHARE of each step, evenly, from FRACTION of the
    /// run's expected steps to the end, its rule deciding before
    /// (`BoundedReplay::with_finish`; e.g. 0:0.8: none in the last fifth).
    #[arg(long, requires = "replay_bound", value_parser = parse_share_at)]
    replay_finish: Option<(f64, f64)>,
    /// `--mixer aioli`'s step size η (`adabatch::AioliMixer::new(ROUND, 4, 0.6, η)`).
    #[arg(long, default_value_t = 2.0)]
    aioli_eta: f64,
    /// `--mixer aioli`'s round: steps from one LearnParams to the next.
    #[arg(long, default_value_t = 50)]
    aioli_round: usize,
    /// `--mixer aioli`: average the laws over rounds with this weight of the past
    /// (`AioliMixer::with_smoothing`); without it, the paper's compounding step.
    #[arg(long)]
    aioli_smoothing: Option<f64>,
    /// `--mixer aioli`: descend a soft worst domain, the law's rows weighted by a
    /// softmax of the domains' losses at this temperature in nats
    /// (`AioliMixer::with_worst_focus`); without it, the paper's average loss.
    #[arg(long)]
    aioli_worst_temperature: Option<f64>,
    /// `--mixer aioli`: read each probe on the domains' held-out losses before
    /// and after it, as the paper does (`AioliMixer::with_held_out`), from the
    /// first --mixer-eval-examples N validation documents of each domain.
    #[arg(long, requires = "mixer_eval_examples")]
    aioli_held_out: bool,
    /// `--mixer online`'s temperature in nats (`OnlineMixer::with_temperature`;
    /// default the library's, 1.5): higher is nearer uniform.
    #[arg(long)]
    online_temperature: Option<f64>,
    /// `--mixer online`: equal shares for the first N steps, then the softmax
    /// (`OnlineMixer::with_warmup`; the losses are averaged from the start).
    #[arg(long, conflicts_with = "online_warmup")]
    online_warmup_steps: Option<usize>,
    /// `--mixer online`: the warm-up as a fraction of the steps the run is
    /// expected to take (from --max-steps, else --max-train-tokens over the tokens
    /// a step); default the library's, 0.4 (`OnlineMixer::DEFAULT_WARMUP_FRACTION`).
    #[arg(long, value_parser = parse_fraction)]
    online_warmup: Option<f64>,
}

/// How `--replay-bound` moves the replay share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ReplayRule {
    /// Each old domain's share follows its drift (`BoundedReplay::with_gain`).
    Follow,
    /// The share doubles past the bound, halves back within it.
    Doubling,
}

/// `--replay-rule follow`'s gain and start when no flag sets them: they held the
/// bound on six seeds of six with the new domain level with a fixed 10 % replay
/// (BENCHMARKS.md, "Continual pretraining: a replay that follows the drift").
const REPLAY_GAIN: f64 = 0.06;
const REPLAY_START: (f64, f64) = (0.2, 0.1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum MixerChoice {
    /// Shares in proportion to each domain's size (or `--mix-weights`).
    Stratified,
    /// Equal shares.
    Uniform,
    /// A softmax of the smoothed per-token training losses (1.5 nats), 5 %
    /// floor, after equal shares for 40 % of the run.
    Online,
    /// Online Data Mixing: Exp3 rewarded by the training loss.
    Odm,
    /// Aioli: the mixing law estimated from short probes of each domain, then an
    /// exponentiated-gradient step on the total loss.
    Aioli,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Unit {
    /// Shares of the tokens.
    Tokens,
    /// Shares of the documents.
    Documents,
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
struct ReplaySteps(Vec<(f64, f64)>);

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
    fn knots(&self) -> Vec<(f64, f64)> {
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
struct PerDomain(Vec<(String, f64)>);

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

/// A fixed global batch (`--global-batch-size`, 32 by default; or a batch in
/// tokens, `--max-tokens-per-batch N --packed-token-budget`) and the dataset's
/// weights: stratified, uniform or `--mix-weights`.
#[adaptive_trainer(
    lr_scaling = sqrt,
    reweight = token_count,
    drop_last = false,
    seed = 1234
)]
struct FixedMixTrainer {
    #[model]
    model: Decoder,
    #[optimizer]
    opt: adabatch::optim::AdamW,
}

/// The same, the weights of every step decided by a mixer.
#[adaptive_trainer(
    lr_scaling = sqrt,
    reweight = token_count,
    drop_last = false,
    seed = 1234
)]
struct MixerTrainer {
    #[model]
    model: Decoder,
    #[optimizer]
    opt: adabatch::optim::AdamW,
    #[mixer]
    mixer: Box<dyn Mixer>,
}

fn parse_cli() -> (Cli, clap::ArgMatches) {
    let matches = adabatch::hf_matches(command());
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    (cli, matches)
}

/// The example's command: the trainer's flags with this example's defaults.
fn command() -> clap::Command {
    decoder::llama_optimizer_defaults(Cli::command())
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

fn main() -> std::process::ExitCode {
    adabatch::exit_code(run())
}

/// The training arguments with this example's defaults: the three domains of
/// `data/` when none is given; a batch in tokens alone when one is given; an
/// evaluation every 10 steps for `--replay-bound`; the per-device batch from the
/// global one.
fn training_args(cli: &mut Cli, matches: &clap::ArgMatches) -> TrainingArgs {
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
    if cli.replay_bound.is_some() && args.eval.mixer_eval_examples.is_none() && !given("eval_steps")
    {
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

fn run() -> adabatch::Result<()> {
    let (mut cli, matches) = parse_cli();
    let mut args = training_args(&mut cli, &matches);
    decoder::log_into_output_dir(&mut args);
    let domains = open_domains(&cli)?;
    let names = domains.train.names().to_vec();
    let unit = match cli.mix_unit {
        Unit::Tokens => MixUnit::Tokens,
        Unit::Documents => MixUnit::Examples,
    };
    let mut train = domains.train.with_unit(unit);
    if cli.mixer == MixerChoice::Uniform {
        if !args.data.mix_weights.is_empty() {
            return Err(adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
                first: "--mix-weights",
                second: "--mixer uniform",
                reason: "uniform gives every domain an equal share: drop one of them (stratified with --mix-weights trains at fixed shares)",
            }));
        }
        let equal: Vec<(String, f64)> = names.iter().map(|n| (n.clone(), 1.0)).collect();
        train = train.with_weights(&equal)?;
    }
    check_replay(&cli, &names)?;
    // Its flags are checked whatever the mixer.
    let online = online_mixer(&cli, &args, &domains.infos)?;
    let curriculum = replay_curriculum(&cli, &names, &domains.infos, &args)?;
    let info = domains.info;
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    let config = decoder::model_config(&cli.model, &info, args.save.init_from.as_deref(), &given)?;
    config.validate()?;
    let collate = PackedCollate::new(cli.model.seq_len, info.eos_id);
    let validation = domains.validation;
    if let Some(dir) = &cli.replay_reference_model {
        if args.launch.device == "cpu" {
            // Its CPU kernels must not size candle's pools for one rank alone.
            adabatch::share_cpu_cores(args.launch.nproc_per_node);
        }
        let held_out = args.eval.mixer_eval_examples;
        let reference = model_losses(
            dir,
            &config,
            (&validation, held_out),
            &cli.new_domain,
            &collate,
        )?;
        cli.replay_reference = Some(PerDomain(reference));
    }
    let bounded = bounded_replay(&cli, &args, &domains.infos)?;
    let hyper = adabatch::optim::ParamsAdamW::from_args(&args)?;
    let summary = if curriculum.is_none()
        && cli.replay_bound.is_none()
        && matches!(cli.mixer, MixerChoice::Stratified | MixerChoice::Uniform)
    {
        let factory = |ctx: &RankContext| -> adabatch::Result<FixedMixTrainer> {
            let model = Decoder::new(&config, ctx)?;
            let opt = decoder::optimizer(&model, hyper)?;
            Ok(FixedMixTrainer::new(model, opt))
        };
        adabatch::Run::new(&train, &collate, &args)
            .with_eval(&validation)
            .launch(factory)?
            .summary
    } else {
        let factory = |ctx: &RankContext| -> adabatch::Result<MixerTrainer> {
            let model = Decoder::new(&config, ctx)?;
            let opt = decoder::optimizer(&model, hyper)?;
            Ok(MixerTrainer::new(
                model,
                opt,
                mixer_of(&cli, curriculum.clone(), bounded.clone(), online.clone())?,
            ))
        };
        adabatch::Run::new(&train, &collate, &args)
            .with_eval(&validation)
            .launch(factory)?
            .summary
    };
    report(&cli, &names, &summary)
}

/// The `#[mixer]` of a run whose weights a mixer decides: `--replay-ramp`'s or
/// `--replay-steps`' curriculum, `--replay-bound`'s mixer, else `--mixer`, within
/// `--replay-budget` if given.
fn mixer_of(
    cli: &Cli,
    curriculum: Option<CurriculumMixer>,
    bounded: Option<BoundedReplay>,
    online: OnlineMixer,
) -> adabatch::Result<Box<dyn Mixer>> {
    if let Some(curriculum) = curriculum {
        return Ok(Box::new(curriculum));
    }
    if let Some(bounded) = bounded {
        return Ok(Box::new(bounded));
    }
    let mixer: Box<dyn Mixer> = match cli.mixer {
        MixerChoice::Odm => Box::new(Exp3Mixer::default()),
        MixerChoice::Aioli => {
            let mut aioli = AioliMixer::new(cli.aioli_round, 4, 0.6, cli.aioli_eta)?;
            if let Some(s) = cli.aioli_smoothing {
                aioli = aioli.with_smoothing(s);
            }
            if let Some(temperature) = cli.aioli_worst_temperature {
                aioli = aioli.with_worst_focus(temperature)?;
            }
            if cli.aioli_held_out {
                aioli = aioli.with_held_out();
            }
            Box::new(aioli)
        }
        _ => Box::new(online),
    };
    Ok(match cli.replay_budget {
        Some(budget) => Box::new(ReplayBudget::new(
            mixer,
            cli.new_domain.iter().cloned(),
            budget,
        )?),
        None => mixer,
    })
}

/// `--replay-ramp FROM,TO[,UNTIL]` or `--replay-steps` as a curriculum over
/// documents: the new domains share `1 − r`, the old ones `r` (by
/// `--replay-split`, else evenly); for the
/// ramp `r` is linear from FROM at the first document to TO at the fraction UNTIL
/// (default 1) of those the run is expected to take, then TO. A fraction of the
/// tokens becomes documents by each stretch's mean document length under its
/// mean shares.
fn replay_curriculum(
    cli: &Cli,
    names: &[String],
    infos: &[adabatch::tokenize::CorpusInfo],
    args: &TrainingArgs,
) -> adabatch::Result<Option<CurriculumMixer>> {
    let knots = match (cli.replay_ramp, &cli.replay_steps) {
        (Some((from, to, until)), _) => vec![(0.0, from), (until, to)],
        (None, Some(steps)) => steps.knots(),
        (None, None) if cli.replay_split.is_some() => {
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
        || cli.replay_budget.is_some()
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
    let (n_new, n_old) = (
        new.iter().filter(|&&b| b).count(),
        new.iter().filter(|&&b| !b).count(),
    );
    if n_new == 0 || n_old == 0 {
        return Err(adabatch::Error::msg(format!(
            "--replay-ramp / --replay-steps need new and old domains: --new-domain {:?} of {names:?}",
            cli.new_domain
        )));
    }
    let split = replay_split(cli, names, &new)?;
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
    // Documents per token over each stretch: at its mean shares (linear in them).
    let per_token = |r: f64| -> f64 {
        (shares(r).iter().zip(infos))
            .map(|(w, info)| w * info.train_documents as f64 / info.train_tokens.max(1) as f64)
            .sum()
    };
    let mut points = vec![(0, shares(knots[0].1))];
    let mut documents = 0.0;
    for pair in knots.windows(2) {
        let ((at, before), (next, after)) = (pair[0], pair[1]);
        documents += tokens as f64 * (next - at) * per_token((before + after) / 2.0);
        // A step is two points one document apart.
        let document = (documents.round() as usize).max(points[points.len() - 1].0 + 1);
        points.push((document, shares(after)));
    }
    CurriculumMixer::new(points).map(Some)
}

/// Each old domain's part of the replay share (summing to 1; 0 for new ones):
/// `--replay-split`'s weights over old domains, every one of them named with a
/// positive weight, else evenly.
fn replay_split(cli: &Cli, names: &[String], new: &[bool]) -> adabatch::Result<Vec<f64>> {
    let old = || {
        (names.iter().zip(new))
            .filter(|(_, &is_new)| !is_new)
            .map(|(n, _)| n)
    };
    let weight = |name: &String| match &cli.replay_split {
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
    let named: Vec<&String> = cli
        .replay_split
        .iter()
        .flat_map(|s| &s.0)
        .map(|(n, _)| n)
        .collect();
    if let Some(twice) = (named.iter().enumerate()).find(|(i, n)| named[..*i].contains(n)) {
        return Err(adabatch::Error::msg(format!(
            "--replay-split names {} twice",
            twice.1
        )));
    }
    if let Some(stranger) =
        (cli.replay_split.iter().flat_map(|s| &s.0)).find(|(n, _)| !old().any(|o| o == n))
    {
        return Err(adabatch::Error::msg(format!(
            "--replay-split names {}, which is not an old domain: they are {:?}",
            stranger.0,
            old().collect::<Vec<_>>()
        )));
    }
    let weights: Vec<f64> = (names.iter().zip(new))
        .map(|(name, &is_new)| if is_new { Ok(0.0) } else { weight(name) })
        .collect::<adabatch::Result<_>>()?;
    let total: f64 = weights.iter().sum();
    Ok(weights.iter().map(|w| w / total).collect())
}

/// `--replay-bound` with its reference, the replay share of the new domains' run
/// (its own checks, and the sources' in the run's setup, before the first step).
fn bounded_replay(
    cli: &Cli,
    args: &TrainingArgs,
    infos: &[adabatch::tokenize::CorpusInfo],
) -> adabatch::Result<Option<BoundedReplay>> {
    let Some(bound) = cli.replay_bound else {
        return Ok(None);
    };
    let reference = (cli.replay_reference.clone()).map(|l| l.0).ok_or_else(|| {
        adabatch::Error::msg("--replay-bound needs the old domains' losses before the new data: --replay-reference or --replay-reference-model")
    })?;
    let mut bounded = BoundedReplay::new(
        cli.new_domain.iter().cloned(),
        reference,
        bound,
        cli.replay_max,
    )?;
    let rule = |other: &'static str| {
        adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
            first: "--replay-rule",
            second: other,
            reason: "--replay-gain is the follow rule's, --replay-lower-at the doubling's",
        })
    };
    let start = match cli.replay_rule {
        ReplayRule::Follow if cli.replay_lower_at.is_some() => {
            return Err(rule("--replay-lower-at"))
        }
        ReplayRule::Doubling if cli.replay_gain.is_some() => return Err(rule("--replay-gain")),
        ReplayRule::Follow => {
            bounded = bounded.with_gain(cli.replay_gain.unwrap_or(REPLAY_GAIN))?;
            let (share, fraction) = REPLAY_START;
            Some(
                cli.replay_start
                    .unwrap_or((share.min(cli.replay_max), fraction)),
            )
        }
        ReplayRule::Doubling => {
            if let Some(fraction) = cli.replay_lower_at {
                bounded = bounded.with_lower_at(fraction)?;
            }
            cli.replay_start
        }
    };
    if args.eval.mixer_eval_examples.is_some() {
        bounded = bounded.with_held_out(cli.replay_every.unwrap_or(REPLAY_EVAL_STEPS))?;
    }
    if start.is_some() || cli.replay_finish.is_some() {
        let steps = expected_steps(args, infos).ok_or_else(|| {
            adabatch::Error::msg(
                "--replay-start's and --replay-finish's fractions are of the run's expected steps: give --max-steps or --max-train-tokens",
            )
        })?;
        let at = |fraction: f64| (fraction * steps as f64).round() as usize;
        if let Some((share, fraction)) = start {
            bounded = bounded.with_start(share, at(fraction))?;
        }
        if let Some((share, fraction)) = cli.replay_finish {
            // The step at FRACTION of the run, counted from 1.
            bounded = bounded.with_finish(share, at(fraction) + 1)?;
        }
    }
    Ok(Some(bounded))
}

/// Each old domain's validation loss (nats per token, as the engine's
/// `eval_<domain>_loss`) under the model saved in `dir`: over its first
/// `held_out` validation documents when given (the engine's held-out set), else
/// over all of them. On the CPU, before the run's first step.
fn model_losses<D: adabatch::Dataset<Item = Vec<u32>>>(
    dir: &Path,
    config: &adabatch::models::llama::LlamaConfig,
    (validation, held_out): (&adabatch::Sources<D>, Option<usize>),
    new_domains: &[String],
    collate: &PackedCollate,
) -> adabatch::Result<Vec<(String, f64)>> {
    let device = candle_core::Device::Cpu;
    let params = adabatch::Parameters::new(0);
    let llama = adabatch::models::llama::Llama::new(
        config,
        params.var_builder(candle_core::DType::F32, &device),
    )?;
    params.load_pretrained(dir, true)?;
    let spec = adabatch::Dataset::sources(validation).ok_or_else(|| {
        adabatch::Error::msg("--replay-reference-model needs the domains' validation documents")
    })?;
    let mut losses = Vec::new();
    let mut first = 0;
    for (name, &size) in spec.names.iter().zip(&spec.sizes) {
        let count = held_out.map_or(size, |n| n.min(size));
        if !new_domains.contains(name) && count > 0 {
            let documents: Vec<Vec<u32>> = (first..first + count)
                .map(|i| adabatch::Dataset::get(validation, i))
                .collect();
            let (mut sum, mut tokens) = (0.0, 0);
            for chunk in documents.chunks(64) {
                let batch = adabatch::Collate::collate(collate, chunk, &device)?;
                let logits = llama.forward_packed(
                    &batch.input_ids,
                    Some(&batch.position_ids),
                    Some(&batch.document_ids),
                )?;
                let per_document = batch.per_document_cross_entropy(&logits)?;
                sum += per_document
                    .to_dtype(candle_core::DType::F64)?
                    .sum_all()?
                    .to_scalar::<f64>()?;
                tokens += adabatch::Batch::num_tokens(&batch);
            }
            losses.push((name.clone(), sum / tokens.max(1) as f64));
        }
        first += size;
    }
    let shown: Vec<String> = losses.iter().map(|(n, l)| format!("{n}={l:.4}")).collect();
    println!(
        "--replay-reference-model {}: {}",
        dir.display(),
        shown.join(",")
    );
    Ok(losses)
}

/// `--replay-bound` alone decides the replay share; `--replay-budget` steers a mixer
/// (online, odm or aioli) over domains that exist, with a share from 0 to 1: said
/// before the first step.
fn check_replay(cli: &Cli, names: &[String]) -> adabatch::Result<()> {
    let replay_decided_twice = cli.replay_budget.is_some()
        || cli.replay_ramp.is_some()
        || cli.replay_steps.is_some()
        || !cli.train.data.mix_weights.is_empty();
    if cli.replay_bound.is_some() && replay_decided_twice {
        return Err(adabatch::Error::Settings(
            adabatch::SettingsError::ConflictingSettings {
                first: "--replay-bound",
                second: "--replay-budget / --replay-ramp / --replay-steps / --mix-weights",
                reason: "the bound decides the replay share itself",
            },
        ));
    }
    let Some(budget) = cli.replay_budget else {
        return Ok(());
    };
    if matches!(cli.mixer, MixerChoice::Stratified | MixerChoice::Uniform) {
        return Err(adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
            first: "--replay-budget",
            second: "--mixer stratified / uniform",
            reason: "the budget caps what a mixer chooses: use --mixer online, odm or aioli (fixed shares: --mix-weights)",
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

/// `--replay-bound`'s evaluations when `--eval-steps` is not given: every 10
/// steps held the bound on six seeds of six as every 5 did, in half the
/// evaluations; every 25 came after the drift (BENCHMARKS.md, "Continual
/// pretraining: a replay that follows the drift").
const REPLAY_EVAL_STEPS: usize = 10;

/// `--mixer online`, with `--online-temperature` and its warm-up (refused with
/// another mixer, which would ignore them).
fn online_mixer(
    cli: &Cli,
    args: &TrainingArgs,
    infos: &[adabatch::tokenize::CorpusInfo],
) -> adabatch::Result<OnlineMixer> {
    let tuned = cli.online_temperature.is_some()
        || cli.online_warmup_steps.is_some()
        || cli.online_warmup.is_some();
    if tuned && cli.mixer != MixerChoice::Online {
        return Err(adabatch::Error::Settings(
            adabatch::SettingsError::ConflictingSettings {
                first: "--online-temperature / --online-warmup / --online-warmup-steps",
                second: "--mixer",
                reason: "they are the online mixer's settings: use --mixer online",
            },
        ));
    }
    // The library's defaults (temperature, warm-up share) unless a flag says.
    let mut mixer = OnlineMixer::default();
    if let Some(temperature) = cli.online_temperature {
        mixer = mixer.with_temperature(temperature)?;
    }
    if let Some(steps) = cli.online_warmup_steps {
        return Ok(mixer.with_warmup(steps));
    }
    let fraction = cli
        .online_warmup
        .unwrap_or(OnlineMixer::DEFAULT_WARMUP_FRACTION);
    // The example knows its steps better than the engine's estimate does: the
    // domains' mean document lengths at equal shares, or the packed token budget.
    Ok(match expected_steps(args, infos) {
        Some(n) => mixer.with_warmup((fraction * n as f64).round() as usize),
        None => mixer.with_warmup_fraction(fraction)?,
    })
}

/// The optimizer steps the run is expected to take: `--max-steps`, else
/// `--max-train-tokens` over the tokens a step (the budget of a packed token
/// batch, else the global batch at the domains' mean tokens a document).
fn expected_steps(args: &TrainingArgs, infos: &[adabatch::tokenize::CorpusInfo]) -> Option<usize> {
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

/// The domains: opened where every path is a prepared folder (it has
/// `tokens.json`), else tokenized into
/// `--tokens-dir` first (reused when prepared from the same files and settings).
fn open_domains(cli: &Cli) -> adabatch::Result<Domains> {
    let domains: Vec<(String, PathBuf)> = cli
        .domain
        .iter()
        .map(|(n, p)| (n.clone(), decoder::in_repository(p.clone())))
        .collect();
    let prepared = |p: &Path| p.join("tokens.json").is_file();
    if domains.iter().all(|(_, p)| prepared(p)) {
        return Domains::open_split(&domains, cli.tokens.max_document_tokens);
    }
    // Otherwise every path is a corpus: a file, or a folder of corpus files
    // (shards), as `adabatch tokenize` reads them.
    use adabatch::tokenize::{PrepareOptions, TokenizerSource};
    let options = PrepareOptions {
        tokenizer: TokenizerSource::TrainBpe {
            vocab_size: cli.tokens.vocab_size,
        },
        validation_fraction: cli.tokens.validation_fraction,
        ..PrepareOptions::default()
    };
    let existing = adabatch::DomainsInfo::read(&cli.tokens_dir);
    let current = existing
        .as_ref()
        .is_ok_and(|info| info.prepared_from(&domains, &options));
    if !current {
        adabatch::tokenize::may_prepare(&cli.tokens_dir, cli.tokens.retokenize, || {
            match &existing {
            Ok(info) => format!(
                "it holds the domains {:?} prepared from other files or settings; this run asks for {:?}",
                info.names, domains
            ),
            Err(_) => "it holds other files than prepared domains (no readable domains.json)".into(),
        }
        })?;
        let (_, infos) = adabatch::prepare_domains(&domains, &cli.tokens_dir, &options)?;
        for ((name, _), info) in domains.iter().zip(&infos) {
            println!(
                "tokenized `{name}`: {} training documents ({} tokens), {} validation documents ({} tokens)",
                info.train_documents, info.train_tokens, info.validation_documents, info.validation_tokens
            );
        }
    }
    let dirs = Domains::prepared_dirs(&cli.tokens_dir)?;
    Domains::open_split(&dirs, cli.tokens.max_document_tokens)
}

/// Each domain's validation loss and perplexity, their mean and worst, and
/// `--summary-json`.
fn report(cli: &Cli, names: &[String], summary: &adabatch::TrainSummary) -> adabatch::Result<()> {
    println!("{summary}");
    let Some(last) = summary.final_eval() else {
        return Ok(());
    };
    let losses: Vec<f64> = names
        .iter()
        .map(|n| last.get(&format!("eval_{n}_loss")).unwrap_or(f64::NAN))
        .collect();
    for (name, loss) in names.iter().zip(&losses) {
        println!(
            "{name:>12}: validation loss {loss:.4} nats per token, perplexity {:.1}",
            loss.exp()
        );
    }
    let mean = losses.iter().sum::<f64>() / losses.len() as f64;
    let worst = losses.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "mean over the domains {mean:.4}, worst {worst:.4}; all validation tokens {:.4}",
        last.eval_loss
    );
    if let Some(path) = &cli.summary_json {
        let evaluations: Vec<_> = summary
            .evaluations
            .iter()
            .map(|e| {
                let per_domain: serde_json::Map<String, serde_json::Value> = names
                    .iter()
                    .map(|n| (n.clone(), e.get(&format!("eval_{n}_loss")).into()))
                    .collect();
                serde_json::json!({"step": e.step, "eval_loss": e.eval_loss, "domains": per_domain})
            })
            .collect();
        let value = serde_json::json!({
            "mixer": format!("{:?}", cli.mixer).to_lowercase(),
            "steps": summary.global_step,
            "train_runtime": summary.train_runtime,
            "final": names.iter().cloned().zip(losses.iter().copied()).collect::<std::collections::BTreeMap<_, _>>(),
            "mean": mean,
            "worst": worst,
            "eval_loss": last.eval_loss,
            "evaluations": evaluations,
        });
        let text = serde_json::to_string_pretty(&value).expect("plain JSON") + "\n";
        std::fs::write(path, text)
            .map_err(adabatch::Error::io(adabatch::FileOp::Write, path.clone()))?;
    }
    Ok(())
}

/// The replay flags' parsing and checks: what a user mistypes is refused with a
/// message that names it.
#[cfg(test)]
mod tests {
    use super::*;

    fn cli(flags: &[&str]) -> Result<Cli, clap::Error> {
        let args = [
            "mixture",
            "--domain",
            "en=e.txt",
            "--domain",
            "kjv=k.txt",
            "--domain",
            "python=p.txt",
        ];
        let matches = command().try_get_matches_from(args.iter().chain(flags))?;
        Cli::from_arg_matches(&matches)
    }

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

    #[test]
    fn a_replay_split_names_each_old_domain_once_with_a_positive_weight() {
        let names = ["python", "en", "kjv"].map(String::from);
        let new = [true, false, false];
        let split = |text: &str| {
            let cli = cli(&[
                "--new-domain",
                "python",
                "--replay-ramp",
                "0.2,0",
                "--replay-split",
                text,
            ])
            .unwrap();
            replay_split(&cli, &names, &new).map_err(|e| e.to_string())
        };
        let w = split("en=3,kjv=1").unwrap();
        assert_eq!(w, [0.0, 0.75, 0.25]);
        assert!(split("en=3,en=1,kjv=1").unwrap_err().contains("twice"));
        assert!(split("en=3,kjv=1,eng=1").unwrap_err().contains("eng"));
        assert!(split("en=3").unwrap_err().contains("kjv"));
        assert!(split("en=3,kjv=0").unwrap_err().contains("kjv=0"));
    }

    /// A bound of 5 % on en and kjv, python new.
    const BOUND: &[&str] = &[
        "--new-domain",
        "python",
        "--replay-bound",
        "0.05",
        "--replay-reference",
        "en=4.0,kjv=3.0",
    ];

    /// The replay shares of `--replay-bound`'s mixer over `[python, en, kjv]`
    /// after `step`, with en 6 % above its reference at an evaluation after step 0.
    fn bounded_shares(flags: &[&str], step: usize) -> adabatch::Result<Vec<f64>> {
        let cli = cli(&[BOUND, flags].concat()).map_err(|e| adabatch::Error::msg(e.to_string()))?;
        let mut args = cli.train.clone();
        args.length.max_steps = Some(50);
        let mut mixer = bounded_replay(&cli, &args, &[])?.unwrap();
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

    /// The bound reads evaluations: every 10 steps unless --eval-steps is given;
    /// without the bound, or with a held-out set it reads instead, the
    /// example's 100 stays.
    #[test]
    fn the_bound_evaluates_every_10_steps_unless_told() {
        let eval_steps = |flags: &[&str]| {
            let args = ["mixture", "--domain", "en=e.txt"];
            let matches = command()
                .try_get_matches_from(args.iter().chain(flags))
                .unwrap();
            let mut cli = Cli::from_arg_matches(&matches).unwrap();
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

    /// The reference losses of a saved model: each old domain's mean loss per
    /// target over its first documents, computed as if each document ran
    /// alone (unpacked, its own log-softmax), the new domain left out.
    #[test]
    fn a_saved_models_reference_losses_are_each_old_domains_loss_per_token() {
        use adabatch::models::llama::{Llama, LlamaConfig, ModelType};
        use candle_core::{DType, Device, Tensor};
        let device = Device::Cpu;
        let mut config = LlamaConfig::new(ModelType::Llama, 16, 8, 16, 1, 2, 1);
        config.tie_word_embeddings = true;
        config.max_position_embeddings = 8;
        let params = adabatch::Parameters::new(7);
        let llama = Llama::new(&config, params.var_builder(DType::F32, &device)).unwrap();
        let dir = std::env::temp_dir().join(format!("mixture-model-losses-{}", std::process::id()));
        let saved = params.named_parameters();
        adabatch::save_pretrained(&saved, None, &dir).unwrap();
        // Documents end with the EOS id (0), as the token files' do.
        let domain = |docs: &[&[u32]]| docs.iter().map(|d| d.to_vec()).collect::<Vec<_>>();
        let en = domain(&[&[3, 4, 5, 0], &[6, 7, 0], &[8, 9, 10, 11, 0]]);
        let python = domain(&[&[12, 13, 0]]);
        let kjv = domain(&[&[1, 2, 0], &[14, 15, 3, 0]]);
        let validation =
            adabatch::Sources::new([("en", en.clone()), ("python", python), ("kjv", kjv.clone())])
                .unwrap();
        // Alone: the summed loss of each next token, over the targets.
        let alone = |docs: &[Vec<u32>]| {
            let (mut sum, mut targets) = (0.0, 0);
            for doc in docs {
                let ids = Tensor::new(&doc[..doc.len() - 1], &device)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let logits = llama.forward(&ids).unwrap().squeeze(0).unwrap();
                let log_p = candle_nn::ops::log_softmax(&logits, 1)
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap();
                for (row, &next) in log_p.iter().zip(&doc[1..]) {
                    sum -= f64::from(row[next as usize]);
                    targets += 1;
                }
            }
            sum / targets as f64
        };
        let collate = PackedCollate::new(8, 0);
        let new = ["python".to_string()];
        let losses = |held_out| {
            model_losses(&dir, &config, (&validation, held_out), &new, &collate).unwrap()
        };
        let check = |got: Vec<(String, f64)>, want: [(&str, f64); 2]| {
            assert_eq!(got.len(), 2, "{got:?}");
            for ((name, loss), (want_name, want_loss)) in got.iter().zip(want) {
                assert_eq!(name, want_name);
                assert!(
                    (loss - want_loss).abs() < 1e-6 * want_loss,
                    "{name}: {loss} against {want_loss}"
                );
            }
        };
        check(losses(None), [("en", alone(&en)), ("kjv", alone(&kjv))]);
        // The held-out set: the first two documents of each domain.
        check(
            losses(Some(2)),
            [("en", alone(&en[..2])), ("kjv", alone(&kjv[..2]))],
        );
        assert_ne!(alone(&en[..2]), alone(&en));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_bounds_flags_need_the_bound() {
        let with = |extra: &[&str]| cli(&[BOUND, extra].concat());
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
            assert!(cli(flags).is_err(), "{flags:?} needs the bound");
        }
        // Read on a held-out set every 5 steps: it needs that set.
        assert!(with(&["--replay-every", "5"]).is_err());
        let held_out = ["--mixer-eval-examples", "100", "--replay-every", "5"];
        let c = with(&held_out).unwrap();
        let mut args = c.train.clone();
        args.length.max_steps = Some(50);
        assert!(bounded_replay(&c, &args, &[])
            .unwrap()
            .unwrap()
            .wants_held_out(5));
        // One reference or the other, and one is needed.
        let model = ["--replay-reference-model", "phase1"];
        assert!(with(&model).is_err(), "both references");
        let bound_alone = ["--new-domain", "python", "--replay-bound", "0.05"];
        let c = cli(&bound_alone).unwrap();
        let err = bounded_replay(&c, &c.train, &[]).unwrap_err().to_string();
        assert!(err.contains("--replay-reference-model"), "{err}");
        assert!(cli(&[&bound_alone[..], &model].concat()).is_ok());
    }
}
