//! The run: the domains opened, the mixer built, the trainer launched.

use adabatch::models::llama::LlamaConfig;
use adabatch::optim::ParamsAdamW;
use adabatch::prelude::*;
use adabatch::{
    BoundedReplay, CurriculumMixer, MixUnit, Mixer, OnlineMixer, PackedCollate, Sources,
    TokenDocuments,
};

use super::args::{training_args, MixerChoice, MixtureArgs, PerDomain};
use super::bound::bounded_replay;
use super::curriculum::replay_curriculum;
use super::decoder::{self, Decoder};
use super::domains::open_domains;
use super::mixers::{check_replay, chosen_mixer, online_mixer, pike_mixer, uniform_weights};
use super::outcome::Outcome;
use super::reference::model_losses;

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

/// The run `cli` asks for (`matches`: what its command line gave), each domain's
/// share counted in `unit`.
pub fn run(
    mut cli: MixtureArgs,
    matches: &clap::ArgMatches,
    unit: MixUnit,
) -> adabatch::Result<Outcome> {
    let mut args = training_args(&mut cli, matches);
    decoder::log_into_output_dir(&mut args);
    let domains = open_domains(&cli)?;
    let names = domains.train.names().to_vec();
    let mut train = domains.train.with_unit(unit);
    if let Some(equal) = uniform_weights(&cli, &names)? {
        train = train.with_weights(&equal)?;
    }
    check_replay(&cli, &names)?;
    pike_mixer(cli.mixer, &cli.pike)?;
    // Its flags are checked whatever the mixer.
    let online = online_mixer(cli.mixer, &cli.online, &args, &domains.infos)?;
    let curriculum = replay_curriculum(&cli, &names, &domains.infos, &args)?;
    let info = domains.info;
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    let config = decoder::model_config(&cli.model, &info, args.save.init_from.as_deref(), &given)?;
    config.validate()?;
    let data = Data {
        train,
        validation: domains.validation,
        collate: PackedCollate::new(cli.model.seq_len, info.eos_id),
    };
    if let Some(dir) = cli.replay.bound.replay_reference_model.clone() {
        if args.launch.device == "cpu" {
            // Its CPU kernels must not size candle's pools for one rank alone.
            adabatch::share_cpu_cores(args.launch.nproc_per_node);
        }
        let held_out = args.eval.mixer_eval_examples;
        let validation = (&data.validation, held_out);
        let reference = model_losses(&dir, &config, validation, &cli.new_domain, &data.collate)?;
        cli.replay.bound.replay_reference = Some(PerDomain(reference));
    }
    let bounded = bounded_replay(&cli.replay.bound, &cli.new_domain, &args, &domains.infos)?;
    let mixing = Mixing {
        cli: &cli,
        curriculum,
        bounded,
        online,
    };
    let summary = launch(&data, &args, &config, &mixing)?;
    Ok(Outcome { summary, names })
}

/// What a run trains and evaluates on: the domains' documents, packed.
struct Data {
    train: Sources<TokenDocuments>,
    validation: Sources<TokenDocuments>,
    collate: PackedCollate,
}

/// What decides the weights of every step: `--replay-ramp`'s or `--replay-steps`'
/// curriculum, `--replay-bound`'s mixer, else `--mixer` (within `--replay-budget`
/// if given); for `stratified` and `uniform` without them, no mixer.
struct Mixing<'a> {
    cli: &'a MixtureArgs,
    curriculum: Option<CurriculumMixer>,
    bounded: Option<BoundedReplay>,
    online: OnlineMixer,
}

impl Mixing<'_> {
    /// The dataset's weights for the whole run: no mixer decides them.
    fn fixed(&self) -> bool {
        self.curriculum.is_none()
            && self.bounded.is_none()
            && matches!(
                self.cli.mixer,
                MixerChoice::Stratified | MixerChoice::Uniform
            )
    }

    /// A rank's mixer.
    fn mixer(&self) -> adabatch::Result<Box<dyn Mixer>> {
        if let Some(curriculum) = &self.curriculum {
            return Ok(Box::new(curriculum.clone()));
        }
        if let Some(bounded) = &self.bounded {
            return Ok(Box::new(bounded.clone()));
        }
        chosen_mixer(self.cli, self.online.clone())
    }
}

/// Trains the decoder of `config` on `data` under `args`, the weights fixed or
/// decided by `mixing`'s mixer.
fn launch(
    data: &Data,
    args: &TrainingArgs,
    config: &LlamaConfig,
    mixing: &Mixing,
) -> adabatch::Result<adabatch::TrainSummary> {
    let hyper = ParamsAdamW::from_args(args)?;
    let run = adabatch::Run::new(&data.train, &data.collate, args).with_eval(&data.validation);
    Ok(if mixing.fixed() {
        let factory = |ctx: &RankContext| -> adabatch::Result<FixedMixTrainer> {
            let model = Decoder::new(config, ctx)?;
            let opt = decoder::optimizer(&model, hyper)?;
            Ok(FixedMixTrainer::new(model, opt))
        };
        run.launch(factory)?.summary
    } else {
        let factory = |ctx: &RankContext| -> adabatch::Result<MixerTrainer> {
            let model = Decoder::new(config, ctx)?;
            let opt = decoder::optimizer(&model, hyper)?;
            Ok(MixerTrainer::new(model, opt, mixing.mixer()?))
        };
        run.launch(factory)?.summary
    })
}
