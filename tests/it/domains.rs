//! Several text domains for a language model, counted in tokens: `prepare_domains`
//! (one tokenizer over every domain's training documents), `Domains` as sources of
//! packed documents with weights in tokens, a mixer seeing per-token losses, a run
//! length in tokens, on 1 to 3 ranks and resumed on another number of ranks; and
//! the typed errors of the path.

use std::path::{Path, PathBuf};

use adabatch::prelude::*;
use adabatch::tokenize::{PrepareOptions, TokenizerSource};
use adabatch::{
    prepare_domains, DataError, Domains, Error, Exp3Mixer, PackedCollate, SettingsError, StepLog,
};

use crate::common::{read_log, temp_log};

use crate::decoder;

/// Three small domains of different document lengths.
fn write_domains(dir: &Path) -> Vec<(String, PathBuf)> {
    std::fs::create_dir_all(dir).unwrap();
    let animals = ["cat", "dog", "bird", "fox"];
    let short: String = (0..60)
        .map(|i| format!("the {} sees a {}.\n", animals[i % 4], animals[(i / 4) % 4]))
        .collect();
    let verses: String = (0..50)
        .map(|i| {
            format!(
                "and it came to pass in the {i} day that the {} went forth into the land.\n",
                animals[i % 4]
            )
        })
        .collect();
    let code: String = (0..40)
        .map(|i| {
            format!(
                "{{\"text\": \"def f_{i}(x):\\n    y = x + {i}\\n    for k in range({}):\\n        y = y * 2\\n    return y\"}}\n",
                i % 5 + 1
            )
        })
        .collect();
    let files = [
        ("en", "en.txt", short),
        ("verse", "verse.txt", verses),
        ("code", "code.jsonl", code),
    ];
    files
        .into_iter()
        .map(|(name, file, text)| {
            let path = dir.join(file);
            std::fs::write(&path, text).unwrap();
            (name.to_string(), path)
        })
        .collect()
}

fn options(vocab_size: usize) -> PrepareOptions {
    PrepareOptions {
        tokenizer: TokenizerSource::TrainBpe { vocab_size },
        validation_fraction: 0.1,
        ..PrepareOptions::default()
    }
}

fn small_model() -> decoder::ModelArgs {
    decoder::ModelArgs {
        seq_len: 32,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
    }
}

/// A fixed global batch (`--global-batch-size`), the weights from Online Data
/// Mixing.
#[adaptive_trainer(
    schedule = ramp(start = 4, increment = 4, tokens = 100_000, global = 8),
    reweight = token_count,
    drop_last = false,
    seed = 7
)]
struct MixedDecoder {
    #[model]
    model: decoder::Decoder,
    #[optimizer]
    opt: adabatch::optim::AdamW,
    #[mixer]
    mixer: Exp3Mixer,
}

/// No schedule of its own: `--max-tokens-per-batch N --packed-token-budget`
/// sizes every step in tokens. Aioli mixes (short rounds: probes of 2 steps).
#[adaptive_trainer(reweight = token_count, drop_last = false, seed = 7)]
struct MixedBudgetDecoder {
    #[model]
    model: decoder::Decoder,
    #[optimizer]
    opt: adabatch::optim::AdamW,
    #[mixer]
    mixer: adabatch::AioliMixer,
}

struct Prepared {
    dir: PathBuf,
    domains: Domains,
    config: adabatch::models::llama::LlamaConfig,
}

fn prepared(name: &str) -> Prepared {
    let dir = temp_log(name).with_extension("");
    let files = write_domains(&dir);
    let tokens = dir.join("tokens");
    let (info, infos) = prepare_domains(&files, &tokens, &options(300)).unwrap();
    assert_eq!(info.names, ["en", "verse", "code"]);
    // Each domain keeps a tenth of its documents for validation.
    let held: Vec<usize> = infos.iter().map(|i| i.validation_documents).collect();
    assert_eq!(held, [6, 5, 4]);
    let domains = Domains::open_prepared(&tokens).unwrap();
    let config = decoder::llama_config(&small_model(), &domains.info);
    Prepared {
        dir,
        domains,
        config,
    }
}

fn args(world: usize, out: &Path, log: &Path, max_tokens: u64) -> TrainingArgs {
    {
        let mut args = TrainingArgs::default();
        args.launch.nproc_per_node = world;
        args.batch.global_batch_size = Some(12);
        args.lr.learning_rate = 1e-2;
        args.length.max_train_tokens = Some(max_tokens);
        args.eval.eval_steps = Some(1000);
        args.save.save_steps = 0;
        args.save.output_dir = out.to_path_buf();
        args.logging.log_jsonl = Some(log.to_path_buf());
        args.logging.log_indices = true;
        args.logging.quiet = true;
        args
    }
}

fn train(p: &Prepared, args: &TrainingArgs) -> adabatch::TrainSummary {
    try_train(p, args).unwrap()
}

fn try_train(p: &Prepared, args: &TrainingArgs) -> adabatch::Result<adabatch::TrainSummary> {
    let collate = PackedCollate::new(32, p.domains.info.eos_id);
    let config = &p.config;
    MixedDecoder::launch_with_eval(
        &p.domains.train,
        &p.domains.validation,
        &collate,
        args,
        |ctx: &RankContext| {
            let model = decoder::Decoder::new(config, ctx)?;
            let opt = decoder::optimizer(&model, decoder::llama_adamw(1e-2))?;
            Ok(MixedDecoder::new(model, opt, Exp3Mixer::default()))
        },
    )
    .map(|trained| trained.summary)
}

/// Each step's dataset indices, in order.
fn indices(logs: &[StepLog]) -> Vec<Vec<usize>> {
    logs.iter().map(|l| l.indices.concat()).collect()
}

#[test]
fn domains_mix_in_tokens_once_per_source_epoch_on_one_to_three_ranks() {
    let p = prepared("domains");
    let train_set = &p.domains.train;
    let lengths: Vec<usize> = (0..train_set.len())
        .map(|i| train_set.example_len(i))
        .collect();
    let total: usize = lengths.iter().sum();
    let budget = (total * 5 / 2) as u64;
    let mut runs = Vec::new();
    for world in [1, 3] {
        let log = temp_log(&format!("domains-{world}"));
        let summary = train(
            &p,
            &args(world, &p.dir.join(format!("out-{world}")), &log, budget),
        );
        runs.push((summary, read_log(&log)));
    }
    let (summary, logs) = &runs[0];
    // W ranks of b: one rank of W·b, batch for batch and mixture for mixture.
    assert_eq!(indices(logs), indices(&runs[1].1));
    // The run stops at the step that reaches the token budget.
    let step_tokens: Vec<usize> = indices(logs)
        .iter()
        .map(|step| step.iter().map(|&i| lengths[i]).sum())
        .collect();
    let trained: usize = step_tokens.iter().sum();
    assert!(trained as u64 >= budget && ((trained - step_tokens.last().unwrap()) as u64) < budget);
    // Every document of every domain once per pass over its domain.
    let spec = train_set.sources().unwrap();
    for (s, name) in spec.names.iter().enumerate() {
        let drawn: Vec<usize> = logs
            .iter()
            .flat_map(|l| l.sources.source_indices.as_ref().unwrap()[name].clone())
            .collect();
        assert!(drawn.len() > spec.sizes[s], "`{name}` cycled at least once");
        for pass in drawn.chunks(spec.sizes[s]) {
            let mut sorted = pass.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), pass.len(), "`{name}` repeats within a pass");
        }
    }
    // Per-source losses are per token: weighted by their tokens they make the loss.
    for l in logs {
        let (losses, tokens) = (
            l.sources.source_loss.as_ref().unwrap(),
            l.sources.source_tokens.as_ref().unwrap(),
        );
        let (mut nats, mut count) = (0.0, 0.0);
        for (name, t) in tokens {
            if let Some(loss) = losses[name] {
                nats += loss * t;
                count += t;
            }
        }
        assert!(
            (nats / count - l.loss).abs() < 1e-4 * l.loss,
            "step {}",
            l.step
        );
    }
    // So are the per-domain validation losses, beside `eval_loss`.
    let last = summary.final_eval().unwrap();
    let validation = &p.domains.validation;
    let vspec = validation.sources().unwrap();
    let (mut nats, mut count) = (0.0, 0.0);
    for (s, name) in vspec.names.iter().enumerate() {
        let offset = vspec.offset(s);
        let targets: usize = (0..vspec.sizes[s])
            .map(|i| validation.example_len(offset + i) - 1)
            .sum();
        nats += last.get(&format!("eval_{name}_loss")).unwrap() * targets as f64;
        count += targets as f64;
    }
    assert!((nats / count - last.eval_loss).abs() < 1e-4 * last.eval_loss);
    // The mixer moved the weights, in shares of tokens.
    let weights: Vec<f64> = logs
        .iter()
        .map(|l| l.sources.mix_weights.as_ref().unwrap()["code"])
        .collect();
    assert!(
        weights.iter().any(|w| (w - weights[0]).abs() > 1e-3),
        "{weights:?}"
    );
    std::fs::remove_dir_all(&p.dir).ok();
}

/// A run resumed after step `from` against the uninterrupted run: the same steps,
/// each with the same documents and mixing weights within `tolerance`; the pairs.
fn resumed_alike<'a>(
    after: &'a [StepLog],
    whole: &'a [StepLog],
    from: usize,
    tolerance: f64,
) -> Vec<(&'a StepLog, &'a StepLog)> {
    let tail: Vec<&StepLog> = whole.iter().filter(|l| l.step > from).collect();
    assert_eq!(after.len(), tail.len());
    for (a, b) in after.iter().zip(&tail) {
        assert_eq!(a.indices.concat(), b.indices.concat(), "step {}", a.step);
        let (wa, wb) = (&a.sources.mix_weights, &b.sources.mix_weights);
        for (name, w) in wa.as_ref().unwrap() {
            let other = wb.as_ref().unwrap()[name];
            assert!((w - other).abs() < tolerance, "step {}", a.step);
        }
    }
    after.iter().zip(tail).collect()
}

#[test]
fn a_mixed_run_resumed_on_another_number_of_ranks_continues_alike() {
    let p = prepared("domains-resume");
    let train_set = &p.domains.train;
    let total: usize = (0..train_set.len()).map(|i| train_set.example_len(i)).sum();
    let budget = (total * 3 / 2) as u64;
    let out = p.dir.join("out");
    let log = temp_log("domains-straight");
    let mut straight = args(2, &out, &log, budget);
    straight.save.save_steps = 5;
    straight.save.save_total_limit = None;
    train(&p, &straight);
    let whole = read_log(&log);
    let resumed_log = temp_log("domains-resumed");
    let mut resumed = args(3, &p.dir.join("out-resumed"), &resumed_log, budget);
    resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-5"));
    train(&p, &resumed);
    let after = read_log(&resumed_log);
    for (a, b) in resumed_alike(&after, &whole, 5, 1e-6) {
        assert!((a.loss - b.loss).abs() < 1e-4 * b.loss, "step {}", a.step);
    }
    std::fs::remove_dir_all(&p.dir).ok();
}

fn train_in_tokens(p: &Prepared, args: &TrainingArgs) -> adabatch::TrainSummary {
    let collate = PackedCollate::new(32, p.domains.info.eos_id);
    let config = &p.config;
    MixedBudgetDecoder::launch_with_eval(
        &p.domains.train,
        &p.domains.validation,
        &collate,
        args,
        |ctx: &RankContext| {
            let model = decoder::Decoder::new(config, ctx)?;
            let opt = decoder::optimizer(&model, decoder::llama_adamw(1e-2))?;
            // The worst focus and the smoothing: all of Aioli's state travels.
            let aioli = adabatch::AioliMixer::new(7, 2, 0.6, 2.0)?
                .with_smoothing(0.5)
                .with_worst_focus(1.0)?;
            Ok(MixedBudgetDecoder::new(model, opt, aioli))
        },
    )
    .unwrap()
    .summary
}

/// A mixed global batch in tokens (`--max-tokens-per-batch N
/// --packed-token-budget`): every step as many documents as fit in N tokens,
/// every document once per pass over its domain, one rank of the budget equal to
/// two, and a run resumed on three ranks equal to the uninterrupted run (Aioli's
/// state included: the checkpoint falls within a probe).
#[test]
fn a_mixed_batch_in_tokens_fills_the_budget_once_per_pass_and_resumes() {
    let p = prepared("domains-in-tokens");
    let train_set = &p.domains.train;
    let lengths: Vec<usize> = (0..train_set.len())
        .map(|i| train_set.example_len(i))
        .collect();
    let total: usize = lengths.iter().sum();
    let max_tokens = 200;
    let in_tokens = |world: usize, out: &str, log: &Path| {
        let mut args = args(world, &p.dir.join(out), log, (total * 3 / 2) as u64);
        args.batch.global_batch_size = None;
        args.length_aware.max_tokens_per_batch = Some(max_tokens);
        args.length_aware.packed_token_budget = true;
        args
    };
    let log = temp_log("domains-in-tokens-2");
    let mut two = in_tokens(2, "out-2", &log);
    two.save.save_steps = 4;
    two.save.save_total_limit = None;
    train_in_tokens(&p, &two);
    let whole = read_log(&log);
    let steps = indices(&whole);
    assert!(steps.len() > 8, "{} steps", steps.len());
    // The steps it expected (what a mixer's share of the run is of, and
    // trainer_state.json's max_steps): the tokens over the budget, not over
    // the per-device batch's documents.
    let state = p.dir.join("out-2/checkpoint-4/trainer_state.json");
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let expected = (total * 3 / 2).div_ceil(max_tokens);
    assert_eq!(
        state["max_steps"],
        expected,
        "{} steps trained",
        steps.len()
    );
    let longest = lengths.iter().copied().max().unwrap();
    let mut not_filled = 0;
    for (k, step) in steps.iter().enumerate() {
        let tokens: usize = step.iter().map(|&i| lengths[i]).sum();
        assert!(
            tokens <= max_tokens || step.len() == 1,
            "step {k}: {tokens} tokens"
        );
        // Filled: no document more would have fitted, but where an epoch ends.
        not_filled += usize::from(tokens + longest <= max_tokens);
    }
    let epochs = whole.last().unwrap().epoch.ceil() as usize;
    assert!(
        not_filled <= epochs,
        "{not_filled} steps were not filled in {epochs} epochs"
    );
    let spec = train_set.sources().unwrap();
    for (s, name) in spec.names.iter().enumerate() {
        let drawn: Vec<usize> = whole
            .iter()
            .flat_map(|l| l.sources.source_indices.as_ref().unwrap()[name].clone())
            .collect();
        for pass in drawn.chunks(spec.sizes[s]) {
            let mut sorted = pass.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), pass.len(), "`{name}` repeats within a pass");
        }
    }
    let one_log = temp_log("domains-in-tokens-1");
    train_in_tokens(&p, &in_tokens(1, "out-1", &one_log));
    assert_eq!(indices(&read_log(&one_log)), steps);
    let resumed_log = temp_log("domains-in-tokens-resumed");
    let mut resumed = in_tokens(3, "out-resumed", &resumed_log);
    resumed.save.resume_from_checkpoint = Some(p.dir.join("out-2").join("checkpoint-4"));
    train_in_tokens(&p, &resumed);
    let after = read_log(&resumed_log);
    // Other ranks sum the losses in another order, and Aioli's law is a
    // difference of losses: the rounding grows in it, not past 1e-4.
    resumed_alike(&after, &whole, 4, 1e-4);
    std::fs::remove_dir_all(&p.dir).ok();
}

#[test]
fn domain_mistakes_are_typed_errors_before_the_first_step() {
    let dir = temp_log("domain-errors").with_extension("");
    let files = write_domains(&dir);
    // Directories of different tokenizers are not mixed.
    let a = dir.join("a");
    let b = dir.join("b");
    prepare_domains(&files[..1], &a, &options(300)).unwrap();
    prepare_domains(&files[1..2], &b, &options(320)).unwrap();
    let err = Domains::open(&[
        ("en".into(), a.join("en")),
        ("verse".into(), b.join("verse")),
    ])
    .unwrap_err();
    assert!(
        matches!(err, Error::Data(DataError::MixedTokenizers { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("`en` and `verse`"), "{err}");
    // The same vocabulary size but another tokenizer (merges learnt on other
    // text): caught by its checksum.
    let (one, other) = (dir.join("one"), dir.join("other"));
    let mut two = files[..1].to_vec();
    prepare_domains(&two, &one, &options(260)).unwrap();
    two[0].1 = files[2].1.clone();
    prepare_domains(&two, &other, &options(260)).unwrap();
    let err = Domains::open(&[
        ("en".into(), one.join("en")),
        ("code".into(), other.join("en")),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("checksums"), "{err}");
    // A domain too small to hold out a validation document.
    let tiny = dir.join("tiny.txt");
    std::fs::write(&tiny, "one line.\nanother line.\n").unwrap();
    let err = prepare_domains(
        &[files[0].clone(), ("tiny".into(), tiny)],
        &dir.join("c"),
        &options(300),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::Data(DataError::NoValidationDocuments { ref domain }) if domain == "tiny"),
        "{err}"
    );
    // An empty corpus, a bad name, a repeated one.
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "\n\n").unwrap();
    let err = prepare_domains(&[("e".into(), empty)], &dir.join("d"), &options(300)).unwrap_err();
    assert!(err.to_string().contains("no document"), "{err}");
    let bad = [("a b".to_string(), files[0].1.clone())];
    assert!(matches!(
        prepare_domains(&bad, &dir.join("e"), &options(300)),
        Err(Error::Data(DataError::InvalidTokenSetting { .. }))
    ));
    let twice = [files[0].clone(), files[0].clone()];
    assert!(matches!(
        prepare_domains(&twice, &dir.join("f"), &options(300)),
        Err(Error::Data(DataError::DuplicateSource { .. }))
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn mix_weights_for_an_unknown_domain_or_a_mixer_and_bad_budgets_are_refused() {
    let p = prepared("domains-refused");
    let log = temp_log("domains-refused");
    let mut given = args(2, &p.dir.join("out"), &log, 500);
    given.data.mix_weights = vec!["code=0.5".into(), "en=0.5".into()];
    let err = try_train(&p, &given).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings {
                first: "--mix-weights",
                ..
            })
        ),
        "{err}"
    );
    given.data.mix_weights = vec!["python=1".into()];
    let err = try_train(&p, &given).err().unwrap();
    assert!(
        matches!(err, Error::Data(DataError::UnknownSource { .. })),
        "{err}"
    );
    // A token budget of 0, or beside --max-steps.
    given.data.mix_weights.clear();
    given.length.max_train_tokens = Some(0);
    let err = try_train(&p, &given).err().unwrap();
    assert!(err.to_string().contains("max_train_tokens"), "{err}");
    given.length.max_train_tokens = Some(500);
    given.length.max_steps = Some(3);
    let err = try_train(&p, &given).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings {
                second: "--max-train-tokens",
                ..
            })
        ),
        "{err}"
    );
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.trim().is_empty(), "nothing trained: {logged}");
    std::fs::remove_dir_all(&p.dir).ok();
}
