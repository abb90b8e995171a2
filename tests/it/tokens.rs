//! Language-model data through the engine: a token file of documents, packed per
//! rank and micro-batch, trains a small real model on 1, 2 and 3 ranks; every
//! document is used exactly once per epoch, and with `reweight = token_count` the
//! steps are the same whatever the number of ranks.

use crate::common::{args, flat64, read_log, temp_log};
use proptest::prelude::*;

use std::sync::Mutex;

use adabatch::optim::{AdamW, ParamsAdamW, Sgd};
use adabatch::prelude::*;
use adabatch::{PackedBatch, PackedCollate, TokenDocuments, TokenFile, TokenWidth};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Embedding, Linear, Module};

const VOCAB: u32 = 24;
const EOS: u32 = 0;
const SEQ_LEN: usize = 8;

/// Documents counting up from a start id (wrapping inside the vocabulary), of
/// lengths 1 to 19, so that some are cut into pieces; a bigram model can learn them.
fn token_file() -> (std::path::PathBuf, Vec<usize>) {
    let mut tokens: Vec<u16> = vec![EOS as u16];
    let mut lengths = Vec::new();
    for d in 0..37u32 {
        let len = 1 + (d * 7) % 19;
        tokens.extend((0..len).map(|k| (1 + (d + k) % (VOCAB - 1)) as u16));
        tokens.push(EOS as u16);
        // Every other document is followed by an empty one (a second EOS).
        if d % 2 == 0 {
            tokens.push(EOS as u16);
        }
        lengths.push(len as usize + 1);
    }
    let path = temp_log("tokens").with_extension("bin");
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    (path, lengths)
}

/// Next-token logits from the current token alone: an embedding and a head.
struct Bigram {
    embedding: Embedding,
    head: Linear,
    params: Parameters,
}

impl Bigram {
    fn new(params: Parameters, device: &Device) -> candle_core::Result<Self> {
        Self::with_dtype(params, device, DType::F32)
    }

    fn with_dtype(params: Parameters, device: &Device, dtype: DType) -> candle_core::Result<Self> {
        let vb = params.var_builder(dtype, device);
        Ok(Self {
            embedding: candle_nn::embedding(VOCAB as usize, 16, vb.pp("embed"))?,
            head: candle_nn::linear(16, VOCAB as usize, vb.pp("head"))?,
            params,
        })
    }
}

impl TrainModel for Bigram {
    type Batch = PackedBatch;
    /// Each document's summed token loss: the engine divides by the global count of
    /// target tokens (`reweight = token_count`).
    fn per_example_loss(&self, batch: &PackedBatch) -> candle_core::Result<Tensor> {
        let hidden = self.embedding.forward(&batch.input_ids)?;
        let logits = self.head.forward(&hidden)?;
        batch.per_document_cross_entropy(&logits)
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

#[adaptive_trainer(reweight = token_count)]
struct PackedTrainer {
    #[model]
    model: Bigram,
    #[optimizer]
    opt: AdamW,
}

#[test]
fn a_packed_token_budget_needs_a_budget() {
    let (path, _) = token_file();
    let data =
        TokenDocuments::new(TokenFile::open(&path, TokenWidth::U16, VOCAB).unwrap(), EOS).unwrap();
    let mut a = args(1, 2, 1);
    a.length_aware.packed_token_budget = true;
    let err = PackedTrainer::launch(
        &data,
        &PackedCollate::new(SEQ_LEN, EOS),
        &a,
        |ctx: &RankContext| {
            let model = Bigram::new(ctx.parameters(), ctx.device())?;
            let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
            Ok(PackedTrainer::new(model, opt))
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            adabatch::Error::Settings(adabatch::SettingsError::InvalidSetting {
                name: "packed_token_budget",
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--max-tokens-per-batch"), "{err}");
}

/// Three epochs under a token budget of 60: padded positions of documents sorted by
/// length, or (`packed`) tokens summed over documents in a random order.
fn train(data: &TokenDocuments, world: usize, packed: bool) -> Vec<adabatch::StepLog> {
    let log = temp_log("tokens-run");
    let mut a = args(world, 2, 3);
    a.length_aware.max_tokens_per_batch = Some(60);
    a.length_aware.packed_token_budget = packed;
    a.logging.log_indices = true;
    a.logging.log_jsonl = Some(log.clone());
    let collate = PackedCollate::new(SEQ_LEN, EOS);
    let trained = PackedTrainer::launch(data, &collate, &a, |ctx: &RankContext| {
        let model = Bigram::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr: 0.05,
                ..Default::default()
            },
        )?;
        Ok(PackedTrainer::new(model, opt))
    })
    .unwrap();
    let logs = read_log(&log);
    // Batches sized per step: the summary's final per-device size is the last
    // step's, not the configured 2.
    let last = logs.last().unwrap().global_batch;
    assert_eq!(
        trained.summary.final_per_device_batch_size,
        last.div_ceil(world)
    );
    logs
}

#[test]
fn packed_documents_train_once_per_epoch_on_any_number_of_ranks() {
    check_budget_runs(false);
}

#[test]
fn a_packed_token_budget_trains_every_document_once_on_any_number_of_ranks() {
    check_budget_runs(true);
}

fn check_budget_runs(packed: bool) {
    let (path, lengths) = token_file();
    let data =
        TokenDocuments::new(TokenFile::open(&path, TokenWidth::U16, VOCAB).unwrap(), EOS).unwrap();
    // The empty documents are skipped; each document keeps its EOS.
    assert_eq!(data.len(), lengths.len());
    let got: Vec<usize> = (0..data.len()).map(|i| data.example_len(i)).collect();
    assert_eq!(got, lengths);

    let one = train(&data, 1, packed);
    for world in [1, 2, 3] {
        let logs = if world == 1 {
            one.clone()
        } else {
            train(&data, world, packed)
        };
        let all: Vec<usize> = logs.iter().flat_map(|l| l.indices.concat()).collect();
        assert_eq!(all.len(), 3 * data.len(), "{world} ranks: three epochs");
        for (epoch, seen) in all.chunks(data.len()).enumerate() {
            let mut seen = seen.to_vec();
            seen.sort_unstable();
            assert_eq!(
                seen,
                (0..data.len()).collect::<Vec<_>>(),
                "{world} ranks, epoch {epoch}"
            );
        }
        for l in &logs {
            if packed {
                // Within the budget (no document is longer than it).
                let documents = l.indices.concat();
                let tokens: usize = documents.iter().map(|&i| data.example_len(i)).sum();
                assert!(
                    tokens <= 60,
                    "{world} ranks, step {}: {tokens} tokens",
                    l.step
                );
            }
            assert_eq!(l.indices.len(), world);
            // Every rank has a document whenever the step has one for each.
            let documents = l.indices.iter().map(Vec::len).sum::<usize>();
            assert!(
                documents < world || l.indices.iter().all(|rank| !rank.is_empty()),
                "{world} ranks: {:?}",
                l.indices
            );
        }
        // The same global batches and, the loss being a mean over the global batch's
        // target tokens, the same losses.
        assert_eq!(logs.len(), one.len(), "{world} ranks");
        for (l, o) in logs.iter().zip(&one) {
            let sorted = |l: &adabatch::StepLog| {
                let mut v = l.indices.concat();
                v.sort_unstable();
                v
            };
            assert_eq!(sorted(l), sorted(o), "{world} ranks, step {}", l.step);
            assert!(
                (l.loss - o.loss).abs() < 1e-4 * o.loss.abs().max(1.0),
                "{world} ranks, step {}: {} vs {}",
                l.step,
                l.loss,
                o.loss
            );
        }
    }
    let (first, last) = (one[0].loss, one[one.len() - 1].loss);
    assert!(
        first.is_finite() && last < 0.7 * first,
        "the bigram learns: {first} -> {last}"
    );
}

#[adaptive_trainer(reweight = token_count, drop_last = false)]
struct ExactTrainer {
    #[model]
    model: Bigram,
    #[optimizer]
    opt: Sgd,
}

/// Documents of random ids (1..VOCAB) and lengths (the EOS included, so at least
/// 2), each closed by its EOS.
fn documents_file(lengths: &[usize], seed: u64) -> std::path::PathBuf {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut tokens: Vec<u16> = Vec::new();
    for &len in lengths {
        tokens.extend((1..len).map(|_| rng.random_range(1..VOCAB) as u16));
        tokens.push(EOS as u16);
    }
    let path = temp_log("exact-tokens").with_extension("bin");
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    path
}

#[derive(Debug, Clone)]
struct ExactCase {
    lengths: Vec<usize>,
    seq_len: usize,
    /// `START INCR TOKENS GLOBAL`: a global batch growing with the tokens consumed.
    ramp: (usize, usize, usize, usize),
    world: usize,
    micro_batches: usize,
    seed: u64,
}

fn exact_cases() -> impl Strategy<Value = ExactCase> {
    (
        prop::collection::vec(2usize..30, 8..40),
        2usize..12,
        (1usize..4, 1usize..4, 1usize..400, 0usize..8),
        1usize..=4,
        1usize..=3,
        any::<u64>(),
    )
        .prop_map(
            |(lengths, seq_len, (start, incr, tokens, extra), world, micro_batches, seed)| {
                // The ramp's end is START plus a whole number of increments, and at
                // least one document for each rank's micro-batches.
                let start = start.max(world * micro_batches);
                let global = start + incr * extra;
                ExactCase {
                    lengths,
                    seq_len,
                    ramp: (start, incr, tokens, global),
                    world,
                    micro_batches,
                    seed,
                }
            },
        )
}

/// Two epochs of SGD on an f64 bigram over packed documents on `world` ranks of
/// `micro_batches` micro-batches each: the step logs and rank 0's final weights.
fn exact_run(
    data: &TokenDocuments,
    case: &ExactCase,
    world: usize,
    micro_batches: usize,
) -> (Vec<adabatch::StepLog>, Vec<f64>) {
    let log = temp_log("exact-run");
    let mut a = args(world, 1, 2);
    let (start, incr, tokens, global) = case.ramp;
    a.batch.rampup_batch_size = Some(vec![start, incr, tokens]);
    a.batch.rampup_in_tokens = true;
    a.batch.global_batch_size = Some(global);
    a.batch.gradient_accumulation_steps = Some(micro_batches);
    a.lr.learning_rate = 0.5;
    a.data.seed = Some(case.seed);
    a.logging.log_indices = true;
    a.logging.log_jsonl = Some(log.clone());
    let collate = PackedCollate::new(case.seq_len, EOS);
    let rank0 = Mutex::new(None);
    ExactTrainer::launch(data, &collate, &a, |ctx: &RankContext| {
        let model = Bigram::with_dtype(ctx.parameters(), ctx.device(), DType::F64)?;
        if ctx.rank() == 0 {
            *rank0.lock().unwrap() = Some(model.params.clone());
        }
        let opt = Sgd::new(model.params.all_vars(), 0.5);
        Ok(ExactTrainer::new(model, opt))
    })
    .unwrap();
    let params = rank0.into_inner().unwrap().unwrap();
    (read_log(&log), flat64(params.all_vars()))
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Packed documents under a token ramp, on W ranks of M micro-batches: every
    /// document once per epoch, the same global batches, and — the loss being the
    /// mean over the global batch's target tokens — the same losses and weights as
    /// one rank with one micro-batch, within 1e-6 relative (f64 model).
    #[test]
    fn token_normalised_updates_do_not_depend_on_ranks_or_micro_batches(case in exact_cases()) {
        let path = documents_file(&case.lengths, case.seed);
        let file = TokenFile::open(&path, TokenWidth::U16, VOCAB).unwrap();
        let data = TokenDocuments::new(file, EOS).unwrap();
        prop_assert_eq!(data.len(), case.lengths.len());
        let (one, one_weights) = exact_run(&data, &case, 1, 1);
        let (many, many_weights) = exact_run(&data, &case, case.world, case.micro_batches);
        let all: Vec<usize> = many.iter().flat_map(|l| l.indices.concat()).collect();
        prop_assert_eq!(all.len(), 2 * data.len());
        for seen in all.chunks(data.len()) {
            let mut seen = seen.to_vec();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..data.len()).collect::<Vec<_>>());
        }
        prop_assert_eq!(many.len(), one.len());
        for (m, o) in many.iter().zip(&one) {
            let sorted = |l: &adabatch::StepLog| {
                let mut v = l.indices.concat();
                v.sort_unstable();
                v
            };
            prop_assert_eq!(sorted(m), sorted(o), "step {}", m.step);
            prop_assert!(relative(m.loss, o.loss) < 1e-6, "step {}: {} vs {}", m.step, m.loss, o.loss);
        }
        let scale = one_weights.iter().fold(0f64, |s, w| s.max(w.abs()));
        for (m, o) in many_weights.iter().zip(&one_weights) {
            prop_assert!((m - o).abs() <= 1e-6 * scale, "weights {m} vs {o}");
        }
        std::fs::remove_file(&path).ok();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Packed rows through the Llama decoder: every segment (a document, or a piece
    /// of one) gets the logits it gets alone, so no token sees another document and
    /// positions restart at each.
    #[test]
    fn packed_documents_compute_what_they_compute_alone(
        docs in prop::collection::vec(prop::collection::vec(1u32..VOCAB, 1..10), 1..7),
        seq_len in 3usize..12,
        seed in 0u64..1000,
    ) {
        use adabatch::models::llama::{Llama, LlamaConfig, ModelType};
        let config = LlamaConfig::new(ModelType::Llama, VOCAB as usize, 16, 24, 2, 4, 2);
        let params = Parameters::new(seed);
        let model = Llama::new(&config, params.var_builder(DType::F32, &Device::Cpu)).unwrap();
        let rows = PackedCollate::new(seq_len, EOS).pack(&docs).unwrap();
        let batch = PackedBatch::from_rows(&rows, &Device::Cpu).unwrap();
        let logits = model
            .forward_packed(&batch.input_ids, Some(&batch.position_ids), Some(&batch.document_ids))
            .unwrap();
        let padding = rows.num_documents as u32;
        for r in 0..rows.rows {
            let cell = |c: usize| r * rows.seq_len + c;
            let mut c = 0;
            while c < rows.seq_len && rows.token_document_index[cell(c)] != padding {
                let start = c;
                while c < rows.seq_len && rows.document_ids[cell(c)] == rows.document_ids[cell(start)] {
                    c += 1;
                }
                let tokens = &rows.input_ids[cell(start)..cell(c)];
                let alone = model.forward(&Tensor::new(tokens, &Device::Cpu).unwrap().unsqueeze(0).unwrap()).unwrap();
                let packed = logits.get(r).unwrap().narrow(0, start, c - start).unwrap();
                let diff = (packed - alone.get(0).unwrap()).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                prop_assert!(diff < 1e-5, "row {r}, columns {start}..{c}: {diff}");
            }
        }
    }
}
