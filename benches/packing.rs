//! Packing's effect on the English corpus (`data/en_sentences_15k.txt.gz`, tokenized
//! as `examples/language_model.rs` does: a byte-level BPE of 4,096 ids).
//!
//! One epoch of global batches of 64 documents (a seeded permutation), split over
//! two ranks of 32 as the example's `--nproc-per-node 2 --global-batch-size 64`
//! does, each rank's documents collated by `PackedCollate` into rows of 128:
//!
//! - packed (the default): documents share rows, padding only at row ends;
//! - unpacked (`with_packing(false)`): a row per document, padded to the rank's
//!   longest (transformers' `DataCollatorWithPadding`).
//!
//! It counts the padding positions per step of both over the whole epoch, then
//! times training steps (forward, backward, AdamW) of the example's decoder on one
//! thread, each step's 64 documents collated as one rank's: tokens/s counts real
//! (target) tokens only, over the thread's CPU time.
//!
//! ```text
//! RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1 cargo bench -p adabatch-benches --bench packing
//! ```
//!
//! `PACKING_TIMED_STEPS` sets how many steps are timed per mode (default 20).

#[path = "support/cpu_time.rs"]
mod cpu_time;
#[allow(dead_code)]
#[path = "../examples/support/decoder.rs"]
mod decoder;

use adabatch::candle_core::{DType, Device};
use adabatch::candle_nn::Optimizer;
use adabatch::prelude::*;
use adabatch::tokenize::{prepare_corpus, PrepareOptions};
use adabatch::{PackedBatch, PackedCollate, PackedRows, TokenDocuments};
use rand::seq::SliceRandom;
use rand::SeedableRng;

const GLOBAL: usize = 64;
const RANKS: usize = 2;
const SEQ_LEN: usize = 128;

/// Per step: (target tokens, positions), both ranks together.
fn step_positions(collate: &PackedCollate, docs: &[Vec<u32>]) -> (usize, usize) {
    let mut out = (0, 0);
    for share in docs.chunks(docs.len().div_ceil(RANKS)) {
        let rows = collate.pack(share).expect("pack");
        out.0 += rows.input_ids.len() - padding(&rows);
        out.1 += rows.input_ids.len();
    }
    out
}

fn padding(rows: &PackedRows) -> usize {
    let documents = rows.num_documents as u32;
    rows.token_document_index
        .iter()
        .filter(|&&d| d == documents)
        .count()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// CPU seconds per training step and target tokens per step, over `batches`.
fn time_steps(model: &decoder::Decoder, batches: &[PackedBatch]) -> (f64, f64) {
    let mut opt = decoder::optimizer(model, decoder::llama_adamw(1e-3)).expect("AdamW");
    let (mut seconds, mut tokens) = (Vec::new(), Vec::new());
    for (i, batch) in batches.iter().enumerate() {
        let start = cpu_time::cpu_time(cpu_time::THREAD).unwrap_or(f64::NAN);
        let losses = model.per_example_loss(batch).expect("forward");
        let loss = (losses.sum_all().expect("sum") / batch.num_tokens() as f64).expect("mean");
        opt.backward_step(&loss).expect("step");
        let end = cpu_time::cpu_time(cpu_time::THREAD).unwrap_or(f64::NAN);
        // The first step warms allocations up.
        if i > 0 {
            seconds.push(end - start);
            tokens.push(batch.num_tokens() as f64);
        }
    }
    (mean(&seconds), mean(&tokens))
}

fn main() -> adabatch::Result<()> {
    // As the engine does: freed host memory kept for the next step.
    adabatch::memory::host::keep_freed_memory();
    let dir = std::env::temp_dir().join(format!("adabatch-packing-{}", std::process::id()));
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/en_sentences_15k.txt.gz");
    let info = prepare_corpus(&[corpus], &dir, &PrepareOptions::default())?;
    let file = adabatch::TokenFile::open(dir.join("train.bin"), info.width()?, info.vocab_size)?;
    let train = TokenDocuments::new(file, info.eos_id)?;
    let mut order: Vec<usize> = (0..train.len()).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(7));
    let steps: Vec<Vec<Vec<u32>>> = order
        .chunks(GLOBAL)
        .map(|c| c.iter().map(|&i| train.document(i)).collect())
        .collect();

    let packed = PackedCollate::new(SEQ_LEN, info.eos_id);
    let unpacked = packed.with_packing(false);
    println!(
        "one epoch: {} documents, {} steps of {GLOBAL} over {RANKS} ranks, rows of {SEQ_LEN}",
        train.len(),
        steps.len()
    );
    for (name, collate) in [("packed", packed), ("unpacked", unpacked)] {
        let per_step: Vec<(usize, usize)> =
            steps.iter().map(|d| step_positions(&collate, d)).collect();
        let tokens = mean(&per_step.iter().map(|p| p.0 as f64).collect::<Vec<_>>());
        let positions = mean(&per_step.iter().map(|p| p.1 as f64).collect::<Vec<_>>());
        println!(
            "{name:>9}: {tokens:.0} tokens and {:.0} padding positions per step ({:.1}% of positions)",
            positions - tokens,
            100.0 * (positions - tokens) / positions
        );
    }

    let timed: usize = std::env::var("PACKING_TIMED_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let args = decoder::ModelArgs {
        seq_len: SEQ_LEN,
        hidden_size: 128,
        intermediate_size: 384,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
    };
    let config = decoder::llama_config(&args, &info);
    let mut results = Vec::new();
    for (name, collate) in [("packed", packed), ("unpacked", unpacked)] {
        // The same seeded weights for both.
        let params = Parameters::new(11);
        let llama = adabatch::models::llama::Llama::new(
            &config,
            params.var_builder(DType::F32, &Device::Cpu),
        )?;
        let model = decoder::Decoder { llama, params };
        let batches: Vec<PackedBatch> = steps[..timed + 1]
            .iter()
            .map(|d| PackedBatch::from_rows(&collate.pack(d).expect("pack"), &Device::Cpu))
            .collect::<adabatch::candle_core::Result<_>>()?;
        let (seconds, tokens) = time_steps(&model, &batches);
        println!(
            "{name:>9}: {:.3} s CPU per step of {tokens:.0} tokens: {:.0} tokens/s",
            seconds,
            tokens / seconds
        );
        results.push(tokens / seconds);
    }
    println!(
        "packed / unpacked tokens/s: {:.2}x",
        results[0] / results[1]
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
