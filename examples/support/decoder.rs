//! The language-model example's parts: the corpus as token files, the Llama decoder
//! as a `TrainModel` on packed documents, its two trainers, and text from it.

use std::path::{Path, PathBuf};

use adabatch::models::llama::{generate, Llama, LlamaConfig, ModelType, Sampling, TokenIds};
use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use adabatch::tokenize::{prepare_corpus, CorpusInfo, PrepareOptions, Tokenizer, TokenizerSource};
use adabatch::{PackedBatch, TokenDocuments};
use candle_core::{DType, Tensor, Var};

/// The model's shape (the vocabulary comes from the tokenizer).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Positions per packed row (and the model's context).
    #[arg(long, default_value_t = 128, value_parser = at_least_one)]
    pub seq_len: usize,
    /// Hidden size.
    #[arg(long, default_value_t = 128, value_parser = at_least_one)]
    pub hidden_size: usize,
    /// SwiGLU MLP size.
    #[arg(long, default_value_t = 384, value_parser = at_least_one)]
    pub intermediate_size: usize,
    /// Decoder layers.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than the heads).
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    pub num_key_value_heads: usize,
}

/// A size flag's value: a whole number of at least 1, refused by the flag's name
/// otherwise (not later by the model's configuration field).
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// How text becomes token files and examples (both language-model examples).
#[derive(clap::Args, Clone, Debug)]
pub struct TokenArgs {
    /// Prepare the token files again in `--tokens-dir`, replacing what it holds.
    #[arg(long)]
    pub retokenize: bool,
    /// Documents longer than this many tokens are split into examples of at most
    /// this many (so that a step's memory is bounded whatever a corpus holds).
    #[arg(long, default_value_t = 4096)]
    pub max_document_tokens: usize,
    /// BPE vocabulary size, the end-of-document token included.
    #[arg(long, default_value_t = 4096)]
    pub vocab_size: usize,
    /// Share of the documents (of each domain) held out for validation, spread evenly.
    #[arg(long, default_value_t = 0.05)]
    pub validation_fraction: f64,
}

/// The corpora tokenized into `dir` under one BPE trained on their training
/// documents, and the training and validation documents of all of them. Files
/// prepared from these corpus files (of their current sizes) with this vocabulary
/// are reused, checked against their `tokens.json`; a directory prepared from
/// anything else is refused (it is the user's data) unless `retokenize`.
pub fn corpus(
    corpora: &[PathBuf],
    dir: &Path,
    (vocab_size, validation_fraction): (usize, f64),
    retokenize: bool,
) -> adabatch::Result<(CorpusInfo, TokenDocuments, TokenDocuments)> {
    let options = PrepareOptions {
        tokenizer: TokenizerSource::TrainBpe { vocab_size },
        validation_fraction,
        ..PrepareOptions::default()
    };
    let files = corpora;
    let info = match CorpusInfo::read(dir) {
        Ok(info) if info.prepared_from(files, &options) => info,
        existing => {
            adabatch::tokenize::may_prepare(dir, retokenize, || {
                match existing {
                Ok(info) => format!(
                    "it holds tokens of {:?} ({}, {} held out); this run asks for {:?} (bpe:{vocab_size}, {validation_fraction} held out)",
                    info.source.files, info.source.tokenizer, info.source.validation_fraction, files
                ),
                Err(_) => "it holds other files than prepared tokens (no readable tokens.json)".into(),
            }
            })?;
            let info = prepare_corpus(files, dir, &options)?;
            let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            println!(
                "tokenized {}: a byte-level BPE of {} ids, {} training documents ({} tokens), {} validation documents ({} tokens) in {}",
                names.join(", "),
                info.vocab_size,
                info.train_documents,
                info.train_tokens,
                info.validation_documents,
                info.validation_tokens,
                dir.display()
            );
            info
        }
    };
    let (train, validation) = info.open_documents(dir)?;
    Ok((info, train, validation))
}

/// The Hugging Face Llama configuration of `args` (tied embeddings).
pub fn llama_config(args: &ModelArgs, info: &CorpusInfo) -> LlamaConfig {
    let mut config = LlamaConfig::new(
        ModelType::Llama,
        info.vocab_size as usize,
        args.hidden_size,
        args.intermediate_size,
        args.num_hidden_layers,
        args.num_attention_heads,
        args.num_key_value_heads,
    );
    config.tie_word_embeddings = true;
    config.max_position_embeddings = args.seq_len;
    config.bos_token_id = Some(info.eos_id);
    config.eos_token_id = Some(TokenIds::One(info.eos_id));
    config
}

/// The model's configuration, as `from_pretrained` reads it: `DIR/config.json`
/// when `--init-from DIR` names a folder that has one (the weights' own shape; a
/// damaged file is an error naming it), each shape flag the user `given` checked
/// against it (a disagreement names both values); else the flags' shape, said
/// once when the folder has no `config.json`.
pub fn model_config(
    args: &ModelArgs,
    info: &CorpusInfo,
    init_from: Option<&Path>,
    given: &dyn Fn(&str) -> bool,
) -> adabatch::Result<LlamaConfig> {
    let from_flags = llama_config(args, info);
    let Some(dir) = init_from.filter(|p| p.is_dir()) else {
        return Ok(from_flags);
    };
    let file = dir.join("config.json");
    if !file.exists() {
        adabatch::messages::note(&format!(
            "--init-from {}: no config.json there, so the model's shape comes from the flags",
            dir.display()
        ));
        return Ok(from_flags);
    }
    let saved = LlamaConfig::from_file(&file)?;
    let disagrees = |flag: &str, ours: usize, theirs: usize, key: &str| {
        adabatch::Error::msg(format!(
            "--{flag} {ours} disagrees with {}: {key} = {theirs} (leave the flag out to take the file's)",
            file.display()
        ))
    };
    let shape = [
        ("hidden_size", args.hidden_size, saved.hidden_size),
        (
            "intermediate_size",
            args.intermediate_size,
            saved.intermediate_size,
        ),
        (
            "num_hidden_layers",
            args.num_hidden_layers,
            saved.num_hidden_layers,
        ),
        (
            "num_attention_heads",
            args.num_attention_heads,
            saved.num_attention_heads,
        ),
        (
            "num_key_value_heads",
            args.num_key_value_heads,
            saved.num_key_value_heads,
        ),
    ];
    for (name, ours, theirs) in shape {
        if given(name) && ours != theirs {
            return Err(disagrees(&name.replace('_', "-"), ours, theirs, name));
        }
    }
    if args.seq_len > saved.max_position_embeddings {
        let key = "max_position_embeddings";
        return Err(disagrees(
            "seq-len",
            args.seq_len,
            saved.max_position_embeddings,
            key,
        ));
    }
    if saved.vocab_size != info.vocab_size as usize {
        return Err(adabatch::Error::msg(format!(
            "{}: vocab_size = {}, but the tokenizer has {} ids: the weights belong to another tokenizer",
            file.display(),
            saved.vocab_size,
            info.vocab_size
        )));
    }
    Ok(saved)
}

/// The Llama decoder on packed documents.
pub struct Decoder {
    pub llama: Llama,
    pub params: Parameters,
}

impl Decoder {
    pub fn new(config: &LlamaConfig, ctx: &RankContext) -> adabatch::Result<Self> {
        let params = ctx.parameters();
        let llama = Llama::new(config, params.var_builder(DType::F32, ctx.device()))?;
        Ok(Self { llama, params })
    }
}

impl TrainModel for Decoder {
    type Batch = PackedBatch;

    /// Each document's summed next-token loss (its pieces added up); with
    /// `reweight = token_count` the engine divides by the global batch's targets.
    fn per_example_loss(&self, batch: &PackedBatch) -> candle_core::Result<Tensor> {
        let logits = self.llama.forward_packed(
            &batch.input_ids,
            Some(&batch.position_ids),
            Some(&batch.document_ids),
        )?;
        batch.per_document_cross_entropy(&logits)
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }

    fn pretrained_config(&self) -> Option<String> {
        self.llama.config().to_json_string().ok()
    }
}

/// The batch grows with the tokens consumed: from 8 to 64 documents by 8 over the
/// first 200,000 tokens (`--global-batch-size` / `--rampup-batch-size` override it);
/// the rate follows the batch by √ (`--lr-reference-batch`).
#[adaptive_trainer(
    schedule = ramp(start = 8, increment = 8, tokens = 200_000, global = 64),
    lr_scaling = sqrt,
    reweight = token_count,
    drop_last = false,
    seed = 1234
)]
pub struct RampTrainer {
    #[model]
    pub model: Decoder,
    #[optimizer]
    pub opt: AdamW,
}

/// The batch follows the gradient noise scale: doubled from 8 up to 512
/// documents whenever half of B_simple clears the next size by 10 %, measured on
/// a cadence (on fewer than four ranks a measuring step runs as two micro-batches,
/// the others as one); the rate follows by √2 at each doubling.
#[adaptive_trainer(
    schedule = noise_scale(fraction = 0.5, min = 8, max = 512, factor = 2, hysteresis = 0.1),
    lr_scaling = sqrt,
    reweight = token_count,
    drop_last = false,
    seed = 1234
)]
pub struct NoiseScaleTrainer {
    #[model]
    pub model: Decoder,
    #[optimizer]
    pub opt: AdamW,
}

/// The global batch and micro-batches of the highest goodput (Pollux): the
/// throughput from this run's measured step times, the statistical efficiency from
/// the gradient noise scale, 8 to 512 documents.
#[adaptive_trainer(
    schedule = goodput(min = 8, max = 512),
    lr_scaling = sqrt,
    reweight = token_count,
    drop_last = false,
    seed = 1234
)]
pub struct GoodputTrainer {
    #[model]
    pub model: Decoder,
    #[optimizer]
    pub opt: AdamW,
}

/// No schedule of its own: with `--max-tokens-per-batch` the token budget sizes
/// the batches.
#[adaptive_trainer(lr_scaling = sqrt, reweight = token_count, drop_last = false, seed = 1234)]
pub struct BudgetTrainer {
    #[model]
    pub model: Decoder,
    #[optimizer]
    pub opt: AdamW,
}

/// Trains the decoder of `config` with the trainer `wrap` builds on every rank,
/// evaluating on `data.1`; returns the summary and rank 0's decoder.
pub fn train<T>(
    data: (&TokenDocuments, &TokenDocuments),
    collate: &adabatch::PackedCollate,
    args: &TrainingArgs,
    config: &LlamaConfig,
    wrap: fn(Decoder, AdamW) -> T,
) -> adabatch::Result<(adabatch::TrainSummary, Llama)>
where
    T: AdaptiveTrainer<Model = Decoder, Optimizer = AdamW> + Send,
{
    let hyper = ParamsAdamW::from_args(args)?;
    let factory = |ctx: &RankContext| -> adabatch::Result<T> {
        let model = Decoder::new(config, ctx)?;
        let opt = optimizer(&model, hyper)?;
        Ok(wrap(model, opt))
    };
    let mut trained = adabatch::Run::new(data.0, collate, args)
        .with_eval(data.1)
        .launch(factory)?;
    let llama = trained.trainer.parts().0.llama.clone();
    Ok((trained.summary, llama))
}

/// The optimizer flags' defaults as Llama was pretrained: betas (0.9, 0.95),
/// weight decay 0.1 (on matrices and embeddings; [`optimizer`] exempts norms).
/// (β2 = 0.95 forgets the gradients' scale within about 20 steps; with 0.999 the
/// second moment would still carry the small batches' noise long after the batch
/// has grown.)
pub fn llama_optimizer_defaults(command: clap::Command) -> clap::Command {
    command
        .mut_arg("adam_beta2", |a| a.default_value("0.95"))
        .mut_arg("weight_decay", |a| a.default_value("0.1"))
}

/// The Llama recipe of [`llama_optimizer_defaults`] at rate `lr`, for callers
/// without flags (tests, benchmarks).
#[allow(dead_code)] // Not every program that includes this file calls it.
pub fn llama_adamw(lr: f64) -> ParamsAdamW {
    ParamsAdamW {
        lr,
        beta2: 0.95,
        weight_decay: 0.1,
        ..Default::default()
    }
}

/// AdamW as the flags say (`--weight-decay`, `--adam-beta1`, `--adam-beta2`,
/// `--adam-epsilon`; [`llama_optimizer_defaults`]), no weight decay on norms.
pub fn optimizer(model: &Decoder, hyper: ParamsAdamW) -> adabatch::Result<AdamW> {
    let named = model.params.named_parameters();
    let groups = adabatch::ParamGroups::new(&named);
    AdamW::with_groups(&named, &groups, hyper)
}

/// Cross-entropy per token (nats) of the validation targets under the training
/// tokens' unigram distribution (add-one smoothed): the baseline a model must beat.
pub fn unigram_loss(train: &TokenDocuments, validation: &TokenDocuments, vocab: usize) -> f64 {
    let mut counts = vec![1.0f64; vocab];
    let mut total = vocab as f64;
    for i in 0..train.len() {
        for t in train.document(i) {
            counts[t as usize] += 1.0;
        }
        total += train.document_len(i) as f64;
    }
    let (mut nats, mut n) = (0.0, 0usize);
    for i in 0..validation.len() {
        // A document's targets: every token after its first.
        for t in validation.document(i).into_iter().skip(1) {
            nats -= (counts[t as usize] / total).ln();
            n += 1;
        }
    }
    nats / n.max(1) as f64
}

/// A few lines from the model: each prompt (the first words of a validation
/// document) continued greedily and by sampling at `temperature`.
pub fn print_samples(
    llama: &Llama,
    tokenizer: &Tokenizer,
    prompts: &[Vec<u32>],
    (max_new_tokens, temperature, eos): (usize, f64, u32),
) -> adabatch::Result<()> {
    let decode = |ids: &[u32]| {
        tokenizer
            .decode(ids, true)
            .unwrap_or_else(|e| format!("<cannot decode: {e}>"))
    };
    for (i, prompt) in prompts.iter().enumerate() {
        let greedy = generate(llama, prompt, max_new_tokens, Sampling::Greedy, Some(eos))?;
        let sampling = Sampling::Temperature {
            temperature,
            seed: i as u64,
        };
        let sampled = generate(llama, prompt, max_new_tokens, sampling, Some(eos))?;
        println!("prompt:        {}", decode(prompt));
        println!("  greedy:      {}{}", decode(prompt), decode(&greedy));
        println!(
            "  temperature {temperature}: {}{}",
            decode(prompt),
            decode(&sampled)
        );
    }
    Ok(())
}

/// A run's log and picture in its `--output-dir` (`log.jsonl`, `loss.svg`)
/// unless `--log-jsonl` / `--plot` say otherwise.
pub fn log_into_output_dir(args: &mut TrainingArgs) {
    let out = args.save.output_dir.clone();
    (args.logging.log_jsonl).get_or_insert_with(|| out.join("log.jsonl"));
    (args.logging.plot).get_or_insert_with(|| out.join("loss.svg"));
}

/// `path` relative to the repository when run from elsewhere by `cargo run` (from
/// the building package's folder up).
pub fn in_repository(path: PathBuf) -> PathBuf {
    if path.is_relative() && !path.exists() {
        let found = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|dir| dir.join(&path))
            .find(|repo| repo.exists());
        if let Some(repo) = found {
            return repo;
        }
    }
    path
}
