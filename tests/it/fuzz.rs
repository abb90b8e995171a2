//! Readers of untrusted bytes never panic: a checkpoint's files (trainer state,
//! manifest, weights, optimizer state), a token directory's files (`tokens.json`,
//! the token files, `tokenizer.json`), a weights file given to `--init-from`, a
//! corpus to tokenize (text and JSON lines, plain and gzipped), a run's JSONL log
//! as `adabatch plot` reads and draws it, a sharded model's
//! `model.safetensors.index.json` and a Llama `config.json`, each damaged at random
//! (bytes flipped, cut short, bytes inserted, a chunk repeated) or replaced by
//! arbitrary bytes, give a result or a typed error (for the last four, one that
//! names the damaged file).
//!
//! A checkpoint's manifest would refuse any edit by its checksum, so the damaged
//! checkpoints get their manifest rewritten (as a tool that edits one on purpose
//! does): the readers behind it then see the damage. Each property runs a few
//! dozen cases here; `scripts/fuzz-readers.sh` runs thousands
//! (`ADABATCH_FUZZ_CASES`), with the unit properties of the rendezvous's hello
//! (`adabatch-runtime`, `dist::rendezvous`) and of Parquet and Arrow corpora
//! (`data::corpus`, feature `parquet`). What they found is kept as a test of its
//! own below.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use adabatch::models::llama::{LlamaConfig, ModelType, TokenIds};
use adabatch::prelude::*;
use adabatch::tokenize::{prepare_corpus, CorpusInfo, PrepareOptions, TokenizerSource};
use adabatch::{DistributedError, Error, RunLog, TrainerPolicy};
use candle_core::{DType, Device, Tensor, Var};
use common::*;
use proptest::prelude::*;

hand_trainer!(AdamTrainer, adabatch::AdamW, TrainerPolicy::DEFAULT);

/// Cases per property: a few in the test command, more from the script.
fn cases() -> u32 {
    std::env::var("ADABATCH_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

/// One damage to a file's bytes.
#[derive(Debug, Clone)]
enum Damage {
    /// XOR the byte at (position mod length) with a non-zero mask.
    Flip(usize, u8),
    /// Cut the file at (position mod length + 1).
    Cut(usize),
    /// Insert bytes at (position mod length + 1).
    Insert(usize, Vec<u8>),
    /// Repeat `len` bytes from (position mod length) in place.
    Repeat(usize, usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Damage::Flip(at, mask)),
        1 => any::<usize>().prop_map(Damage::Cut),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Damage::Insert(at, bytes)),
        1 => (any::<usize>(), 1..64usize).prop_map(|(at, len)| Damage::Repeat(at, len)),
    ]
}

/// A file's new contents: the original damaged a few times, or arbitrary bytes.
#[derive(Debug, Clone)]
enum Contents {
    Damaged(Vec<Damage>),
    Arbitrary(Vec<u8>),
}

fn contents() -> impl Strategy<Value = Contents> {
    prop_oneof![
        4 => prop::collection::vec(damage(), 1..6).prop_map(Contents::Damaged),
        1 => prop::collection::vec(any::<u8>(), 0..512).prop_map(Contents::Arbitrary),
    ]
}

fn apply(original: &[u8], contents: &Contents) -> Vec<u8> {
    let damages = match contents {
        Contents::Arbitrary(bytes) => return bytes.clone(),
        Contents::Damaged(damages) => damages,
    };
    let mut bytes = original.to_vec();
    for damage in damages {
        if bytes.is_empty() {
            break;
        }
        let len = bytes.len();
        match damage {
            Damage::Flip(at, mask) => bytes[at % len] ^= mask,
            Damage::Cut(at) => bytes.truncate(at % len + 1),
            Damage::Insert(at, new) => {
                let at = at % len + 1;
                bytes.splice(at..at, new.iter().copied());
            }
            Damage::Repeat(at, n) => {
                let at = at % len;
                let chunk: Vec<u8> = bytes[at..(at + n).min(len)].to_vec();
                bytes.splice(at..at, chunk);
            }
        }
    }
    bytes
}

/// A fresh copy of `seed` (a folder of files) with `file` replaced.
fn damaged_copy(seed: &Path, file: &str, contents: &Contents) -> PathBuf {
    let dir = temp_log("fuzz").with_extension("");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(seed).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let original = std::fs::read(seed.join(file)).unwrap();
    std::fs::write(dir.join(file), apply(&original, contents)).unwrap();
    dir
}

fn args_from(output_dir: &Path) -> TrainingArgs {
    let mut a = args(1, 4, 2);
    a.save.save_steps = 3;
    a.save.output_dir = output_dir.to_path_buf();
    a
}

fn train(a: &TrainingArgs) -> adabatch::Result<TrainSummary> {
    adabatch::Run::new(&dataset(24, 3), &collate, a)
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = resumable_adam(&model)?;
            Ok(AdamTrainer { model, opt })
        })
        .map(|trained| trained.summary)
}

/// A checkpoint of a short run (state, manifest, weights, optimizer state).
fn checkpoint_seed() -> &'static Path {
    static SEED: OnceLock<PathBuf> = OnceLock::new();
    SEED.get_or_init(|| {
        let out = temp_log("fuzz-seed").with_extension("");
        train(&args_from(&out)).unwrap();
        out.join("checkpoint-3")
    })
}

/// A token directory prepared from a few sentences.
fn token_seed() -> &'static Path {
    static SEED: OnceLock<PathBuf> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = temp_log("fuzz-tokens").with_extension("");
        std::fs::create_dir_all(&dir).unwrap();
        let corpus = dir.with_extension("txt");
        let text: String = (0..60)
            .map(|i| {
                format!(
                    "sentence {i} says that {} cats sat on {} mats.\n",
                    i % 7,
                    i % 5
                )
            })
            .collect();
        std::fs::write(&corpus, text).unwrap();
        let options = PrepareOptions {
            tokenizer: TokenizerSource::TrainBpe { vocab_size: 300 },
            validation_fraction: 0.2,
            ..PrepareOptions::default()
        };
        prepare_corpus(&[corpus], &dir, &options).unwrap();
        dir
    })
}

/// The run's result is fine either way, but a panic in a rank's thread (which
/// the engine turns into an error) is a reader that panicked.
fn no_panic(result: adabatch::Result<TrainSummary>) -> Result<(), TestCaseError> {
    if let Err(e) = &result {
        let panicked = matches!(e, Error::Distributed(DistributedError::RankPanicked { .. }))
            || e.report().contains("panicked");
        prop_assert!(!panicked, "{}", e.report());
        prop_assert!(!e.to_string().is_empty());
    }
    Ok(())
}

/// How a run starts from the damaged checkpoint.
enum Start {
    /// Resumed from it, its manifest rewritten over the damage (but for a damaged
    /// manifest).
    Resume,
    /// From its weights file (`--init-from`).
    InitFrom,
}

/// Trains from the seed checkpoint with `file` damaged.
fn train_from_damaged(file: &str, contents: &Contents, start: Start) -> Result<(), TestCaseError> {
    let dir = damaged_copy(checkpoint_seed(), file, contents);
    let out = temp_log("fuzz-out").with_extension("");
    let mut a = args_from(&out);
    a.save.save_steps = 0;
    match start {
        Start::Resume => {
            if file != "manifest.json" {
                adabatch::train::checkpoint::write_manifest(&dir).unwrap();
            }
            a.save.resume_from_checkpoint = Some(dir.clone());
        }
        Start::InitFrom => a.save.init_from = Some(dir.join(file)),
    }
    let result = train(&a);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&out);
    // Arbitrary bytes are never a valid file: the damage reaches a reader.
    if matches!(contents, Contents::Arbitrary(_)) {
        prop_assert!(result.is_err(), "{file}: arbitrary bytes were accepted");
    }
    no_panic(result)
}

/// Opens `seed`'s token directory with `file` damaged and reads every document.
fn open_damaged_tokens(file: &str, contents: &Contents) -> Result<(), TestCaseError> {
    let dir = damaged_copy(token_seed(), file, contents);
    let opened = CorpusInfo::read(&dir).and_then(|info| info.open_documents(&dir));
    if let Ok((train, validation)) = &opened {
        for documents in [train, validation] {
            for i in 0..documents.len() {
                let _ = documents.document(i);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    match opened {
        Err(e) => prop_assert!(!e.to_string().is_empty()),
        // Arbitrary bytes are never a valid file: the damage reaches a reader.
        Ok(_) => prop_assert!(
            !matches!(contents, Contents::Arbitrary(_)),
            "{file}: arbitrary bytes were accepted"
        ),
    }
    Ok(())
}

/// The same documents as text, JSON lines (a null and a blank line among them),
/// and both gzipped.
fn corpus_seed() -> &'static Path {
    static SEED: OnceLock<PathBuf> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = temp_log("fuzz-corpus").with_extension("");
        std::fs::create_dir_all(&dir).unwrap();
        let documents: Vec<String> = (0..40)
            .map(|i| format!("document {i}: {} dogs ran past {} trees", i % 3, i % 4))
            .collect();
        let text = documents.join("\n") + "\n";
        let mut jsonl: String = documents
            .iter()
            .enumerate()
            .map(|(i, d)| serde_json::json!({ "id": i, "text": d }).to_string() + "\n")
            .collect();
        jsonl.push_str("{\"id\": 40, \"text\": null}\n\n");
        std::fs::write(dir.join("corpus.txt"), &text).unwrap();
        std::fs::write(dir.join("corpus.jsonl"), &jsonl).unwrap();
        for (name, plain) in [("corpus.txt.gz", &text), ("corpus.jsonl.gz", &jsonl)] {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(plain.as_bytes()).unwrap();
            std::fs::write(dir.join(name), gz.finish().unwrap()).unwrap();
        }
        dir
    })
}

/// Tokenizes the seed corpus's `file`, damaged, with the seed token directory's
/// tokenizer (loaded: a case trains no BPE). An error names the damaged file and
/// leaves no token file and no `tokens.json`; a success is a directory whose
/// `tokens.json` says what was returned, and that opens when both its files hold a
/// document (a corpus cut to a few documents may hold none out, which the command
/// warns about).
fn prepare_damaged(file: &str, contents: &Contents) -> Result<(), TestCaseError> {
    let dir = damaged_copy(corpus_seed(), file, contents);
    let corpus = dir.join(file);
    let out = dir.join("tokens");
    let options = PrepareOptions {
        tokenizer: TokenizerSource::File(token_seed().join("tokenizer.json")),
        validation_fraction: 0.2,
        ..PrepareOptions::default()
    };
    let prepared = prepare_corpus(std::slice::from_ref(&corpus), &out, &options);
    let left: Vec<String> = std::fs::read_dir(&out)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    let reread = CorpusInfo::read(&out);
    let reopened = reread
        .as_ref()
        .ok()
        .map(|info| info.open_documents(&out).err());
    let bytes = std::fs::read(&corpus).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    match prepared {
        Err(e) => {
            let named = e.to_string().contains(&corpus.display().to_string());
            prop_assert!(named, "{file}: the error does not name it: {}", e.report());
            // Only the tokenizer is written before the corpus is read through: a
            // token file, its `.partial` or `tokens.json` would be half a result.
            let half_written = left.iter().any(|name| name != "tokenizer.json");
            prop_assert!(!half_written, "{file}: {} left {left:?}", e.report());
        }
        Ok(info) => {
            prop_assert_eq!(reread.ok(), Some(info.clone()), "{}", file);
            if info.train_documents > 0 && info.validation_documents > 0 {
                prop_assert!(matches!(reopened, Some(None)), "{file}: {reopened:?}");
            }
            let plain = !file.ends_with(".gz");
            // Lines are text: a plain file that is not UTF-8 is refused.
            let utf8 = std::str::from_utf8(&bytes).is_ok();
            prop_assert!(utf8 || !plain, "{file}: invalid UTF-8 was accepted");
            // Any UTF-8 is a text corpus, but arbitrary bytes are neither JSON
            // lines nor gzip.
            let certain = file != "corpus.txt";
            prop_assert!(
                !(certain && matches!(contents, Contents::Arbitrary(_))),
                "{file}: arbitrary bytes were accepted"
            );
        }
    }
    Ok(())
}

/// The JSONL log of a short run that evaluates (step and eval lines).
fn log_seed() -> &'static Path {
    static SEED: OnceLock<PathBuf> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = temp_log("fuzz-log").with_extension("");
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = args(1, 4, 2);
        a.logging.log_jsonl = Some(dir.join("run.jsonl"));
        a.eval.eval_steps = Some(4);
        let eval = dataset(8, 4);
        adabatch::Run::new(&dataset(24, 3), &collate, &a)
            .with_eval(&eval)
            .launch(|ctx: &RankContext| {
                let model = Regression::new(ctx.parameters(), ctx.device())?;
                let opt = resumable_adam(&model)?;
                Ok(AdamTrainer { model, opt })
            })
            .unwrap();
        dir
    })
}

/// `adabatch plot` on the seed log, damaged: read (an error names the log), then
/// drawn when it holds a step (an error names the image).
fn plot_damaged_log(contents: &Contents) -> Result<(), TestCaseError> {
    let dir = damaged_copy(log_seed(), "run.jsonl", contents);
    let log = dir.join("run.jsonl");
    let bytes = std::fs::read(&log).unwrap();
    let read = RunLog::read(&log);
    let drawn = match &read {
        Ok(run) if !run.steps.is_empty() => {
            let image = dir.join("plot.svg");
            let drawn = adabatch::plot_runs(std::slice::from_ref(run), &image);
            Some((image.exists(), drawn.map_err(|e| (e.to_string(), image))))
        }
        _ => None,
    };
    let _ = std::fs::remove_dir_all(&dir);
    match read {
        Err(e) => {
            let named = e.to_string().contains(&log.display().to_string());
            prop_assert!(named, "the error does not name the log: {}", e.report());
        }
        Ok(run) => {
            prop_assert!(
                std::str::from_utf8(&bytes).is_ok(),
                "invalid UTF-8 was read"
            );
            // Arbitrary bytes hold no step record: the command has nothing to draw.
            prop_assert!(
                run.steps.is_empty() || !matches!(contents, Contents::Arbitrary(_)),
                "steps read from arbitrary bytes"
            );
        }
    }
    match drawn {
        Some((written, Ok(()))) => prop_assert!(written, "no image written"),
        Some((_, Err((message, image)))) => {
            let named = message.contains(&image.display().to_string());
            prop_assert!(named, "the error does not name the image: {message}");
        }
        None => {}
    }
    Ok(())
}

/// Two layers' parameters, every value `fill`.
fn shard_params(fill: f32) -> Vec<(String, Var)> {
    let var = |dims: &[usize]| {
        let values = Tensor::ones(dims, DType::F32, &Device::Cpu).unwrap() * f64::from(fill);
        Var::from_tensor(&values.unwrap()).unwrap()
    };
    vec![
        ("a.weight".into(), var(&[2, 3])),
        ("a.bias".into(), var(&[2])),
        ("b.weight".into(), var(&[3, 2])),
        ("b.bias".into(), var(&[3])),
    ]
}

/// A model saved the way transformers shards one: two shards (layer `a`, layer `b`)
/// and the `model.safetensors.index.json` that lists them.
fn shards_seed() -> &'static Path {
    static SEED: OnceLock<PathBuf> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = temp_log("fuzz-shards").with_extension("");
        std::fs::create_dir_all(&dir).unwrap();
        let params = shard_params(3.0);
        let mut weight_map = serde_json::Map::new();
        for (i, layer) in params.chunks(2).enumerate() {
            let scratch = dir.with_extension(format!("shard{i}"));
            adabatch::save_pretrained(layer, None, &scratch).unwrap();
            let shard = format!("model-0000{}-of-00002.safetensors", i + 1);
            std::fs::rename(scratch.join("model.safetensors"), dir.join(&shard)).unwrap();
            std::fs::remove_dir_all(&scratch).unwrap();
            for (name, _) in layer {
                weight_map.insert(name.clone(), shard.clone().into());
            }
        }
        let bytes: usize = params.iter().map(|(_, v)| v.elem_count() * 4).sum();
        let metadata = serde_json::json!({ "total_size": bytes });
        let index = serde_json::json!({ "metadata": metadata, "weight_map": weight_map });
        let text = serde_json::to_string_pretty(&index).unwrap();
        std::fs::write(dir.join("model.safetensors.index.json"), text).unwrap();
        dir
    })
}

/// Loads the seed shards, strictly, through their damaged index.
fn load_damaged_index(contents: &Contents) -> Result<(), TestCaseError> {
    let dir = damaged_copy(shards_seed(), "model.safetensors.index.json", contents);
    let index = dir.join("model.safetensors.index.json");
    let target = shard_params(0.0);
    let loaded = adabatch::load_weights(&target, &dir, true);
    let _ = std::fs::remove_dir_all(&dir);
    match loaded {
        Err(e) => {
            let named = e.to_string().contains(&index.display().to_string());
            prop_assert!(named, "the error does not name the index: {}", e.report());
        }
        Ok(report) => {
            prop_assert!(
                !matches!(contents, Contents::Arbitrary(_)),
                "arbitrary bytes were accepted"
            );
            prop_assert!(report.is_exact(), "{report}");
            let values = flat(target.into_iter().map(|(_, v)| v));
            prop_assert!(values.iter().all(|&v| v == 3.0), "{values:?}");
        }
    }
    Ok(())
}

/// A Qwen2 `config.json` (the family with the most keys: biases, windows, layer
/// types), with both token-id forms.
fn config_seed() -> &'static Path {
    static SEED: OnceLock<PathBuf> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = temp_log("fuzz-config").with_extension("");
        let mut config = LlamaConfig::new(ModelType::Qwen2, 64, 16, 24, 2, 4, 2);
        config.layer_types = Some(vec!["full_attention".into(), "sliding_attention".into()]);
        config.bos_token_id = Some(0);
        config.eos_token_id = Some(TokenIds::Many(vec![1, 2]));
        config.save(&dir).unwrap();
        dir
    })
}

/// Reads the seed `config.json`, damaged.
fn read_damaged_config(contents: &Contents) -> Result<(), TestCaseError> {
    let dir = damaged_copy(config_seed(), "config.json", contents);
    let path = dir.join("config.json");
    let read = LlamaConfig::from_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
    match read {
        Err(e) => {
            let named = e.to_string().contains(&path.display().to_string());
            prop_assert!(named, "the error does not name the file: {e}");
        }
        Ok(config) => {
            prop_assert!(
                !matches!(contents, Contents::Arbitrary(_)),
                "arbitrary bytes were accepted"
            );
            // What is read was validated: it builds a model.
            prop_assert!(config.validate().is_ok());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        // The files are fresh each case; nothing to persist but the inputs.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_damaged_trainer_state_never_panics(contents in contents()) {
        train_from_damaged("adabatch_state.json", &contents, Start::Resume)?;
    }

    #[test]
    fn a_damaged_manifest_never_panics(contents in contents()) {
        train_from_damaged("manifest.json", &contents, Start::Resume)?;
    }

    #[test]
    fn damaged_checkpoint_weights_never_panic(contents in contents()) {
        train_from_damaged("model.safetensors", &contents, Start::Resume)?;
    }

    #[test]
    fn a_damaged_optimizer_state_never_panics(contents in contents()) {
        train_from_damaged("optimizer.safetensors", &contents, Start::Resume)?;
    }

    #[test]
    fn damaged_init_weights_never_panic(contents in contents()) {
        train_from_damaged("model.safetensors", &contents, Start::InitFrom)?;
    }

    #[test]
    fn a_damaged_tokens_json_never_panics(contents in contents()) {
        open_damaged_tokens("tokens.json", &contents)?;
    }

    #[test]
    fn a_damaged_token_file_never_panics(contents in contents()) {
        open_damaged_tokens("train.bin", &contents)?;
    }

    #[test]
    fn a_damaged_tokenizer_file_never_panics(contents in contents()) {
        open_damaged_tokens("tokenizer.json", &contents)?;
    }

    #[test]
    fn a_damaged_text_corpus_never_panics(contents in contents()) {
        prepare_damaged("corpus.txt", &contents)?;
    }

    #[test]
    fn a_damaged_json_lines_corpus_never_panics(contents in contents()) {
        prepare_damaged("corpus.jsonl", &contents)?;
    }

    #[test]
    fn a_damaged_gzipped_text_corpus_never_panics(contents in contents()) {
        prepare_damaged("corpus.txt.gz", &contents)?;
    }

    #[test]
    fn a_damaged_gzipped_json_lines_corpus_never_panics(contents in contents()) {
        prepare_damaged("corpus.jsonl.gz", &contents)?;
    }

    #[test]
    fn a_damaged_run_log_never_panics(contents in contents()) {
        plot_damaged_log(&contents)?;
    }

    #[test]
    fn a_damaged_weights_index_never_panics(contents in contents()) {
        load_damaged_index(&contents)?;
    }

    #[test]
    fn a_damaged_model_config_never_panics(contents in contents()) {
        read_damaged_config(&contents)?;
    }
}

/// Found by `a_damaged_tokenizer_file_never_panics`: a file cut inside its
/// decoder made the tokenizers crate panic (`expect("Helper")` in the decoders'
/// deserializer); it is refused with a typed error naming the file.
#[test]
fn a_tokenizer_cut_inside_its_decoder_is_refused() {
    let dir = damaged_copy(token_seed(), "tokens.json", &Contents::Damaged(Vec::new()));
    let path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let decoder = text.find("\"decoder\"").expect("a decoder");
    std::fs::write(&path, &text[..decoder + 20]).unwrap();
    let err = adabatch::tokenize::load_tokenizer(&path).unwrap_err();
    assert!(
        matches!(&err, Error::Data(adabatch::DataError::Tokenizer { path: p, .. }) if *p == path),
        "{err}"
    );
    assert!(err.to_string().contains("is not JSON"), "{err}");
    let opened = CorpusInfo::read(&dir).and_then(|info| info.open_documents(&dir));
    assert!(opened.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Found by `a_damaged_weights_index_never_panics`: an index flipped out of JSON
/// (`:` to `;`) was reported against its directory; it, a shard name it lists
/// that is not there and a tensor no shard holds are errors naming the index.
#[test]
fn a_damaged_weights_index_is_named_in_its_error() {
    let dir = damaged_copy(
        shards_seed(),
        "model.safetensors.index.json",
        &Contents::Damaged(Vec::new()),
    );
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let target = shard_params(0.0);
    for (damaged, expected) in [
        (text.replacen("\": ", "\"; ", 1), "is not a weights index"),
        (
            text.replace("model-00002-", "model-00003-"),
            "which is not a file of its directory",
        ),
        (text.replace("\"b.bias\"", "\"b.biaz\""), "`b.biaz`"),
    ] {
        std::fs::write(&index, damaged).unwrap();
        let err = adabatch::load_weights(&target, &dir, true).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(&index.display().to_string()), "{message}");
        assert!(message.contains(expected), "{message}");
    }
    assert!(flat(target.into_iter().map(|(_, v)| v))
        .iter()
        .all(|&v| v == 0.0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Found by `a_damaged_model_config_never_panics`: a field made invalid by one
/// flipped bit (`full_attention` to `gull_attention`) was an error that did not
/// name the file.
#[test]
fn an_invalid_config_field_names_the_file() {
    let dir = damaged_copy(config_seed(), "config.json", &Contents::Damaged(Vec::new()));
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen("\"full_attention\"", "\"gull_attention\"", 1),
    )
    .unwrap();
    let err = LlamaConfig::from_file(&path).unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("layer_types: `gull_attention`"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
