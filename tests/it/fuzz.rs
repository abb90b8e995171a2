//! Readers of untrusted bytes never panic: a checkpoint's files (trainer state,
//! manifest, weights, optimizer state), a token directory's files (`tokens.json`,
//! the token files, `tokenizer.json`) and a weights file given to `--init-from`,
//! each damaged at random (bytes flipped, cut short, bytes inserted, a chunk
//! repeated) or replaced by arbitrary bytes, give a result or a typed error.
//!
//! A checkpoint's manifest would refuse any edit by its checksum, so the damaged
//! checkpoints get their manifest rewritten (as a tool that edits one on purpose
//! does): the readers behind it then see the damage. Each property runs a few
//! dozen cases here; `scripts/fuzz-readers.sh` runs thousands
//! (`ADABATCH_FUZZ_CASES`). What they found is kept as a test of its own below.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use adabatch::prelude::*;
use adabatch::tokenize::{prepare_corpus, CorpusInfo, PrepareOptions, TokenizerSource};
use adabatch::{DistributedError, Error, TrainerPolicy};
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

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        // The files are fresh each case; nothing to persist but the inputs.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_damaged_trainer_state_never_panics(contents in contents()) {
        train_from_damaged("trainer_state.json", &contents, Start::Resume)?;
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
