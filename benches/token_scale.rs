//! A 10^9-token file on 4 ranks: a flat `u16` token stream of 10^9 ids (a sparse
//! file of 2 GB with a block of real ids every 64 MiB, so that the scan sees data
//! and holes), opened as windows of 1,024 + 1 tokens and trained on by the engine
//! on 4 CPU ranks (threads) for 40 steps of a growing global batch (a ramp from 8
//! to 64 windows), with a small bigram model.
//!
//! It reports the time to open and scan the file, the windows, and the process's
//! memory after opening and at the end: `RssAnon` (its own memory: heap, stacks)
//! and `RssFile` (pages of the mapped file in the page cache, shared and dropped
//! by the kernel under pressure), and `VmHWM`, the peak of both together.
//!
//! ```text
//! cargo bench -p adabatch-benches --bench token_scale          # TOKEN_SCALE_DIR=... to place the file
//! TOKEN_SCALE_TOKENS=100000000 cargo bench -p adabatch-benches --bench token_scale   # another size
//! ```

use std::io::{Seek, SeekFrom, Write};
use std::time::Instant;

use adabatch::candle_core::{DType, Tensor, Var};
use adabatch::candle_nn::{Embedding, Linear, Module};
use adabatch::optim::Sgd;
use adabatch::prelude::*;
use adabatch::{TokenFile, TokenWidth, TokenWindows, WindowBatch, WindowCollate};

const VOCAB: u32 = 64;
const SEQ_LEN: usize = 1024;

/// Fields of `/proc/self/status`, in MB.
fn memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map_or("?".to_string(), |kb| format!("{:.1} MB", kb / 1024.0))
    };
    format!(
        "RssAnon {}, RssFile {}, VmHWM {}",
        field("RssAnon:"),
        field("RssFile:"),
        field("VmHWM:")
    )
}

/// The sparse file of `tokens` u16 ids: 64 KiB of cycling ids every 64 MiB.
fn write_file(path: &std::path::Path, tokens: u64) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.set_len(tokens * 2)?;
    let block: Vec<u8> = (0..32_768u32)
        .flat_map(|i| ((i % VOCAB) as u16).to_le_bytes())
        .collect();
    let mut at = 0u64;
    while at + block.len() as u64 <= tokens * 2 {
        file.seek(SeekFrom::Start(at))?;
        file.write_all(&block)?;
        at += 64 << 20;
    }
    file.sync_all()
}

struct Bigram {
    embedding: Embedding,
    head: Linear,
    params: Parameters,
}

impl TrainModel for Bigram {
    type Batch = WindowBatch;
    fn per_example_loss(&self, batch: &WindowBatch) -> adabatch::candle_core::Result<Tensor> {
        let logits = self
            .head
            .forward(&self.embedding.forward(&batch.input_ids)?)?;
        let (b, t, v) = logits.dims3()?;
        let per_token = adabatch::per_example_token_cross_entropy(
            &logits.reshape((b * t, 1, v))?,
            &batch.targets.reshape((b * t, 1))?,
            None,
            adabatch::TokenReduction::Sum,
        )?;
        per_token.reshape((b, t))?.sum(1)
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

#[adaptive_trainer(reweight = token_count)]
struct ScaleTrainer {
    #[model]
    model: Bigram,
    #[optimizer]
    opt: Sgd,
}

fn main() -> adabatch::Result<()> {
    let dir = std::env::var_os("TOKEN_SCALE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let tokens: u64 = std::env::var("TOKEN_SCALE_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000_000);
    let path = dir.join(format!("adabatch-tokens-{}.bin", std::process::id()));
    write_file(&path, tokens).map_err(adabatch::Error::io(adabatch::FileOp::Write, &path))?;
    println!("start: {}", memory());
    let start = Instant::now();
    let windows = TokenWindows::new(TokenFile::open(&path, TokenWidth::U16, VOCAB)?, SEQ_LEN)?;
    println!(
        "opened and scanned {tokens} tokens in {:.2} s: {} windows of {SEQ_LEN} + 1; {}",
        start.elapsed().as_secs_f64(),
        windows.len(),
        memory()
    );
    let args = {
        let mut args = TrainingArgs::default();
        args.launch.nproc_per_node = 4;
        args.batch.rampup_batch_size = Some(vec![8, 8, 800]);
        args.batch.global_batch_size = Some(64);
        args.length.max_steps = Some(40);
        args.lr.learning_rate = 0.1;
        args.logging.log_indices = true;
        args.logging.quiet = true;
        args
    };
    let start = Instant::now();
    let trained = ScaleTrainer::launch(&windows, &WindowCollate, &args, |ctx: &RankContext| {
        let params = ctx.parameters();
        let vb = params.var_builder(DType::F32, ctx.device());
        let model = Bigram {
            embedding: adabatch::candle_nn::embedding(VOCAB as usize, 16, vb.pp("embed"))?,
            head: adabatch::candle_nn::linear(16, VOCAB as usize, vb.pp("head"))?,
            params: params.clone(),
        };
        let opt = Sgd::new(params.all_vars(), 0.1);
        Ok(ScaleTrainer::new(model, opt))
    })?;
    let s = &trained.summary;
    println!(
        "4 ranks: {} steps, {} windows ({} tokens) in {:.1} s, loss {:.3} -> {:.3}; {}",
        s.global_step,
        s.examples_seen,
        s.examples_seen * SEQ_LEN,
        start.elapsed().as_secs_f64(),
        s.step_losses.first().copied().unwrap_or(f64::NAN),
        s.step_losses.last().copied().unwrap_or(f64::NAN),
        memory()
    );
    drop(windows);
    std::fs::remove_file(&path).ok();
    Ok(())
}
