//! The language-model path end to end, small: a corpus tokenized by a BPE trained
//! with `adabatch::tokenize`, packed documents, the example's Llama decoder
//! trained on 2 ranks with the batch ramped over tokens, the saved directory, and
//! text sampled from it; and the preparation step's errors.

use adabatch::models::llama::{generate, Sampling};
use adabatch::prelude::*;
use adabatch::tokenize::{prepare_corpus, CorpusInfo, PrepareOptions, TokenizerSource};
use adabatch::{DataError, Error, PackedCollate};

use crate::common::{read_log, temp_log};

use crate::decoder;

/// Sentences from a few templates: enough structure for a small model to learn.
fn write_corpus(dir: &std::path::Path, lines: usize) -> std::path::PathBuf {
    let subjects = ["the cat", "a dog", "the bird", "my friend", "the teacher"];
    let verbs = ["sees", "likes", "finds", "follows"];
    let objects = ["the ball", "a red house", "the old tree", "some water"];
    let text: String = (0..lines)
        .map(|i| {
            let s = subjects[i % subjects.len()];
            let v = verbs[(i / 5) % verbs.len()];
            let o = objects[(i / 3) % objects.len()];
            format!("{s} {v} {o}.\n")
        })
        .collect();
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("corpus.txt");
    std::fs::write(&path, text).unwrap();
    path
}

fn small_model() -> decoder::ModelArgs {
    decoder::ModelArgs {
        seq_len: 16,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
    }
}

#[test]
fn a_tokenized_corpus_trains_the_decoder_and_saves_a_loadable_model() {
    let dir = temp_log("lm").with_extension("");
    let corpus = write_corpus(&dir, 400);
    let tokens = dir.join("tokens");
    let prepare = |vocab: usize, retokenize: bool| {
        decoder::corpus(
            std::slice::from_ref(&corpus),
            &tokens,
            (vocab, 0.05),
            retokenize,
        )
    };
    let (info, train, validation) = prepare(300, false).unwrap();
    assert_eq!(CorpusInfo::read(&tokens).unwrap(), info);
    assert_eq!((info.train_documents, info.validation_documents), (380, 20));
    assert_eq!((train.len(), validation.len()), (380, 20));
    // A second call reuses the files; no partial file is left.
    assert_eq!(prepare(300, false).unwrap().0, info);
    let names: Vec<String> = std::fs::read_dir(&tokens)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".partial")), "{names:?}");
    // A changed corpus (or vocabulary) is refused, the user's files untouched,
    // unless asked to tokenize again.
    let bytes = std::fs::read(tokens.join("train.bin")).unwrap();
    let grown = dir.join("grown.txt");
    std::fs::write(
        &grown,
        std::fs::read_to_string(&corpus).unwrap() + "a new sentence.\n",
    )
    .unwrap();
    std::fs::copy(&grown, &corpus).unwrap();
    for vocab in [300, 320] {
        let err = prepare(vocab, false).unwrap_err();
        assert!(
            matches!(err, Error::Data(DataError::TokenDirMismatch { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("--retokenize"), "{err}");
    }
    assert_eq!(std::fs::read(tokens.join("train.bin")).unwrap(), bytes);
    let redone = prepare(300, true).unwrap().0;
    assert_eq!(redone.train_documents + redone.validation_documents, 401);
    assert_eq!(prepare(320, true).unwrap().0.vocab_size, 320);
    let (info, train, validation) = prepare(300, true).unwrap();
    assert_eq!(info.vocab_size, 300);

    let config = decoder::llama_config(&small_model(), &info);
    let log = temp_log("lm-run");
    let out = dir.join("out");
    let args = {
        let mut args = TrainingArgs::default();
        args.launch.nproc_per_node = 2;
        args.batch.rampup_batch_size = Some(vec![4, 4, 600]);
        args.batch.rampup_in_tokens = true;
        args.batch.global_batch_size = Some(16);
        args.lr.learning_rate = 1e-2;
        args.length.num_train_epochs = 2;
        args.eval.eval_steps = Some(20);
        args.save.save_steps = 1000;
        args.save.output_dir = out.clone();
        args.logging.log_jsonl = Some(log.clone());
        args.logging.log_indices = true;
        args.logging.quiet = true;
        args
    };
    let collate = PackedCollate::new(16, info.eos_id);
    let trained = decoder::RampTrainer::launch_with_eval(
        &train,
        &validation,
        &collate,
        &args,
        |ctx: &RankContext| {
            let model = decoder::Decoder::new(&config, ctx)?;
            let opt = decoder::optimizer(&model, decoder::llama_adamw(1e-2))?;
            Ok(decoder::RampTrainer::new(model, opt))
        },
    )
    .unwrap();
    let logs = read_log(&log);
    // The batch grew with the tokens; every document once per epoch.
    assert_eq!(logs[0].global_batch, 4);
    assert_eq!(logs.iter().map(|l| l.global_batch).max(), Some(16));
    let seen: Vec<usize> = logs.iter().flat_map(|l| l.indices.concat()).collect();
    for epoch in seen.chunks(train.len()) {
        let mut epoch = epoch.to_vec();
        epoch.sort_unstable();
        assert_eq!(epoch, (0..train.len()).collect::<Vec<_>>());
    }
    // Well below the unigram baseline on held-out sentences.
    let unigram = decoder::unigram_loss(&train, &validation, info.vocab_size as usize);
    let last = trained.summary.final_eval().unwrap().eval_loss;
    assert!(
        last < 0.5 * unigram,
        "validation loss {last} vs unigram {unigram}"
    );
    // The saved directory loads back into the same model.
    for file in ["model.safetensors", "config.json"] {
        assert!(out.join(file).exists(), "{file}");
    }
    let loaded_config =
        adabatch::models::llama::LlamaConfig::from_file(out.join("config.json")).unwrap();
    assert_eq!(loaded_config.vocab_size, info.vocab_size as usize);
    // Greedy text from the first words of a sentence ends with the EOS.
    let llama = &trained.trainer.model.llama;
    let prompt: Vec<u32> = validation.document(0).into_iter().take(2).collect();
    let text = generate(llama, &prompt, 20, Sampling::Greedy, Some(info.eos_id)).unwrap();
    assert_eq!(text.last(), Some(&info.eos_id), "{text:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn preparation_errors_are_typed() {
    let dir = temp_log("lm-errors").with_extension("");
    std::fs::create_dir_all(&dir).unwrap();
    let options = PrepareOptions {
        tokenizer: TokenizerSource::TrainBpe { vocab_size: 300 },
        ..PrepareOptions::default()
    };
    let blank = dir.join("blank.txt");
    std::fs::write(&blank, "\n  \n").unwrap();
    let err = prepare_corpus(&[blank], &dir.join("a"), &options).unwrap_err();
    assert!(
        matches!(err, Error::Data(DataError::Tokenizer { .. }))
            && err.to_string().contains("no document"),
        "{err}"
    );

    let jsonl = dir.join("bad.jsonl");
    std::fs::write(&jsonl, "{\"text\": \"fine\"}\n{\"title\": \"no text\"}\n").unwrap();
    let err = prepare_corpus(&[jsonl], &dir.join("b"), &options).unwrap_err();
    assert!(err.to_string().contains("line 2"), "{err}");

    let corpus = write_corpus(&dir, 50);
    let missing = dir.join("missing.json");
    let from_file = PrepareOptions {
        tokenizer: TokenizerSource::File(missing.clone()),
        ..options.clone()
    };
    let err =
        prepare_corpus(std::slice::from_ref(&corpus), &dir.join("c"), &from_file).unwrap_err();
    // A tokenizer file that is not there: an I/O error naming it.
    assert!(
        matches!(&err, Error::Io { op: adabatch::FileOp::Read, path, .. } if *path == missing),
        "{err}"
    );

    // A loaded tokenizer without the EOS token.
    let prepared = prepare_corpus(std::slice::from_ref(&corpus), &dir.join("d"), &options).unwrap();
    assert_eq!(prepared.eos_id, 0);
    let other_eos = PrepareOptions {
        tokenizer: TokenizerSource::File(dir.join("d/tokenizer.json")),
        eos_token: "</s>".into(),
        ..options.clone()
    };
    let err =
        prepare_corpus(std::slice::from_ref(&corpus), &dir.join("e"), &other_eos).unwrap_err();
    assert!(err.to_string().contains("</s>"), "{err}");

    let bad_fraction = PrepareOptions {
        validation_fraction: 1.0,
        ..options
    };
    let err = prepare_corpus(&[corpus], &dir.join("f"), &bad_fraction).unwrap_err();
    assert!(err.to_string().contains("[0, 1)"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Token files that do not match their `tokens.json` are refused, naming the file:
/// a `train.bin` cut short, an edited EOS id, an edited vocabulary size.
#[test]
fn damaged_token_files_are_refused_naming_the_file() {
    let dir = temp_log("lm-damaged").with_extension("");
    let corpus = write_corpus(&dir, 200);
    let options = PrepareOptions {
        tokenizer: TokenizerSource::TrainBpe { vocab_size: 300 },
        ..PrepareOptions::default()
    };
    let fresh = |name: &str| {
        let to = dir.join(name);
        let info = prepare_corpus(std::slice::from_ref(&corpus), &to, &options).unwrap();
        assert!(info.open_documents(&to).is_ok());
        (to, info)
    };
    // Cut to half.
    let (cut, info) = fresh("cut");
    let bytes = std::fs::read(cut.join("train.bin")).unwrap();
    std::fs::write(cut.join("train.bin"), &bytes[..bytes.len() / 2]).unwrap();
    let err = info.open_documents(&cut).unwrap_err();
    assert!(
        matches!(&err, Error::Data(DataError::TokenFileMismatch { path, .. }) if path.ends_with("train.bin")),
        "{err}"
    );
    // The EOS id, or the vocabulary, edited in tokens.json.
    for edit in ["eos", "vocab"] {
        let (to, mut info) = fresh(edit);
        if edit == "eos" {
            info.eos_id = 5;
        } else {
            info.vocab_size += 100;
        }
        let err = info.open_documents(&to).unwrap_err();
        assert!(
            matches!(&err, Error::Data(DataError::TokenFileMismatch { path, .. }) if path.ends_with("tokens.json")),
            "{edit}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// One document of 3 M tokens (a 10 MB line's worth) beside short ones: split at
/// 512 tokens, a micro-batch of 8 examples packs into at most 8 · ⌈512 / 128⌉ = 32
/// rows whatever it draws, and the decoder trains on it.
#[test]
fn a_huge_document_trains_within_the_stated_bound() {
    let dir = temp_log("lm-huge").with_extension("");
    std::fs::create_dir_all(&dir).unwrap();
    let (vocab, eos) = (64u32, 0u32);
    let mut tokens: Vec<u16> = (0..3_000_000u32).map(|i| (1 + i % 63) as u16).collect();
    tokens.push(eos as u16);
    for i in 0..50u16 {
        tokens.extend([1 + i % 63, 2 + i % 60, eos as u16]);
    }
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let path = dir.join("train.bin");
    std::fs::write(&path, bytes).unwrap();
    let open = || {
        let file = adabatch::TokenFile::open(&path, adabatch::TokenWidth::U16, vocab).unwrap();
        adabatch::TokenDocuments::new(file, eos).unwrap()
    };
    assert_eq!(open().max_document_len(), 3_000_001);
    let docs = open().with_max_len(512).unwrap();
    assert_eq!(docs.max_document_len(), 512);
    let collate = PackedCollate::new(128, eos);
    let longest: Vec<Vec<u32>> = (0..8).map(|i| docs.document(i)).collect();
    assert!(longest.iter().all(|d| d.len() == 512));
    assert_eq!(collate.pack(&longest).unwrap().rows, 32);
    let info = adabatch::tokenize::CorpusInfo {
        width_bytes: 2,
        vocab_size: vocab,
        eos_id: eos,
        eos_token: "<eos>".into(),
        train_documents: docs.len(),
        train_tokens: tokens.len() as u64,
        validation_documents: 0,
        validation_tokens: 0,
        ..Default::default()
    };
    let mut model = small_model();
    model.seq_len = 128;
    let config = decoder::llama_config(&model, &info);
    let args = {
        let mut args = TrainingArgs::default();
        args.batch.global_batch_size = Some(8);
        args.length.max_steps = Some(3);
        args.save.save_steps = 0;
        args.save.output_dir = dir.join("out");
        args.logging.quiet = true;
        args
    };
    let trained = decoder::RampTrainer::launch(&docs, &collate, &args, |ctx: &RankContext| {
        let model = decoder::Decoder::new(&config, ctx)?;
        let opt = decoder::optimizer(&model, decoder::llama_adamw(1e-2))?;
        Ok(decoder::RampTrainer::new(model, opt))
    })
    .unwrap();
    assert_eq!(trained.summary.global_step, 3);
    std::fs::remove_dir_all(&dir).ok();
}

/// `--init-from DIR` takes the model's shape from `DIR/config.json`, as
/// `from_pretrained` does: a shape flag left out takes the file's, one given that
/// disagrees is an error naming both values, a damaged file is an error naming
/// `config.json` itself, and a folder without one leaves the flags' shape.
#[test]
fn init_from_reads_the_model_shape_from_config_json() {
    let dir = temp_log("init-config").with_extension("");
    std::fs::create_dir_all(&dir).unwrap();
    let info = CorpusInfo {
        vocab_size: 300,
        eos_id: 0,
        ..Default::default()
    };
    let flags = small_model();
    let mut saved = decoder::llama_config(&flags, &info);
    saved.hidden_size = 48;
    saved.max_position_embeddings = 32;
    saved.save(&dir).unwrap();
    let nothing_given = |_: &str| false;
    let config = decoder::model_config(&flags, &info, Some(&dir), &nothing_given).unwrap();
    assert_eq!((config.hidden_size, config.num_hidden_layers), (48, 1));
    let hidden_given = |id: &str| id == "hidden_size";
    let err = decoder::model_config(&flags, &info, Some(&dir), &hidden_given).unwrap_err();
    let file = dir.join("config.json").display().to_string();
    assert!(
        err.to_string().contains("--hidden-size 32") && err.to_string().contains(&file),
        "{err}"
    );
    let other_tokenizer = CorpusInfo {
        vocab_size: 301,
        ..info.clone()
    };
    let err =
        decoder::model_config(&flags, &other_tokenizer, Some(&dir), &nothing_given).unwrap_err();
    assert!(err.to_string().contains("vocab_size = 300"), "{err}");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), &text[..text.len() / 2]).unwrap();
    let err = decoder::model_config(&flags, &info, Some(&dir), &nothing_given).unwrap_err();
    assert!(err.report().contains(&file), "{}", err.report());
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let config = decoder::model_config(&flags, &info, Some(&dir), &nothing_given).unwrap();
    assert_eq!(config.hidden_size, 32, "no config.json: the flags' shape");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Nothing moves for a run given none of the optimizer flags: the language-model
/// examples' defaults (`llama_optimizer_defaults`) build the AdamW they built
/// before the flags existed (β2 0.95, weight decay 0.1, HF's β1 and ε), and the
/// library's are HF's.
#[test]
fn the_optimizer_flags_defaults_are_the_runs_before_them() {
    use adabatch::clap::{CommandFactory, FromArgMatches};
    let command = decoder::llama_optimizer_defaults(TrainingArgs::command())
        .mut_arg("learning_rate", |a| a.default_value("3e-3"));
    let args = TrainingArgs::from_arg_matches(&command.get_matches_from(["lm"])).unwrap();
    let built = adabatch::ParamsAdamW::from_args(&args).unwrap();
    assert_eq!(built, decoder::llama_adamw(3e-3));
    let hf = adabatch::ParamsAdamW::from_args(&TrainingArgs::default()).unwrap();
    assert_eq!(
        (hf.beta1, hf.beta2, hf.eps, hf.weight_decay),
        (0.9, 0.999, 1e-8, 0.0)
    );
}
