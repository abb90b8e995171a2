//! Prefetch: examples/s of a collate-heavy epoch with and without
//! `--dataloader-num-workers`, side by side in one run.
//!
//! Workload: the shared English corpus (15,000 real sentences), tokenised in the
//! collate: lower-cased words cut into sub-words by greedy longest match (as
//! WordPiece does) against a vocabulary of the corpus's 4,096 most frequent word
//! pieces, then a dense bag of sub-words per sentence. Model: bag → `HIDDEN` →
//! ReLU → 8 classes (the sentence's length bucket), AdamW, constant batch 64.
//!
//! ```text
//! cargo bench --bench prefetch
//! ```
//!
//! It first times the collate of one epoch's batches alone, so the printout says
//! how much of a step the collate is; then runs `PREFETCH_ROUNDS` (default 3)
//! rounds of one epoch per worker count (0, 1, 2), order rotating, and checks that
//! every run trains the same losses. candle computes on one thread unless
//! `RAYON_NUM_THREADS` is set: compute on one core and collate on another is the
//! shape of a GPU run. `PREFETCH_HIDDEN` sets the hidden width (default 192),
//! which moves the compute's share.

use std::collections::HashMap;
use std::time::Instant;

use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Linear, Module};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/data/en_sentences_15k.txt"
);
const VOCAB: usize = 4096;
const LONGEST_PIECE: usize = 8;
const CLASSES: usize = 8;
const BATCH: usize = 64;

/// Sub-word pieces by id; greedy longest match over them.
struct Tokenizer {
    pieces: HashMap<String, u32>,
}

impl Tokenizer {
    /// The `VOCAB` most frequent pieces of 2..=8 characters in the corpus's words,
    /// after every single character seen (so every word can be cut).
    fn learn(sentences: &[String]) -> Self {
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut chars: Vec<char> = Vec::new();
        for sentence in sentences {
            for word in sentence.to_lowercase().split_whitespace() {
                let w: Vec<char> = word.chars().collect();
                chars.extend(&w);
                for start in 0..w.len() {
                    for len in 2..=LONGEST_PIECE.min(w.len() - start) {
                        let piece: String = w[start..start + len].iter().collect();
                        *counts.entry(piece).or_default() += 1;
                    }
                }
            }
        }
        chars.sort_unstable();
        chars.dedup();
        let mut pieces: HashMap<String, u32> = chars
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), i as u32))
            .collect();
        let mut frequent: Vec<(String, usize)> = counts.into_iter().collect();
        frequent.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (piece, _) in frequent {
            if pieces.len() >= VOCAB {
                break;
            }
            let id = pieces.len() as u32;
            pieces.insert(piece, id);
        }
        Self { pieces }
    }

    /// Greedy longest-match ids of a sentence.
    fn encode(&self, sentence: &str, ids: &mut Vec<u32>) {
        for word in sentence.to_lowercase().split_whitespace() {
            let w: Vec<char> = word.chars().collect();
            let mut start = 0;
            while start < w.len() {
                let mut piece = String::new();
                let mut best = None;
                for (len, c) in w[start..].iter().take(LONGEST_PIECE).enumerate() {
                    piece.push(*c);
                    if let Some(&id) = self.pieces.get(&piece) {
                        best = Some((len + 1, id));
                    }
                }
                let (len, id) = best.unwrap_or((1, 0));
                ids.push(id);
                start += len;
            }
        }
    }
}

struct Bags {
    bag: Tensor,
    labels: Tensor,
}

impl Batch for Bags {
    fn num_examples(&self) -> usize {
        self.labels.dims()[0]
    }
}

fn collate(
    tokenizer: &Tokenizer,
) -> impl Fn(&[(String, u32)], &Device) -> candle_core::Result<Bags> + Sync + '_ {
    move |items, device| {
        let mut bag = vec![0f32; items.len() * VOCAB];
        let mut ids = Vec::new();
        for (row, (text, _)) in items.iter().enumerate() {
            ids.clear();
            tokenizer.encode(text, &mut ids);
            let weight = 1.0 / (ids.len().max(1) as f32).sqrt();
            for &id in &ids {
                bag[row * VOCAB + id as usize] += weight;
            }
        }
        let labels: Vec<u32> = items.iter().map(|(_, label)| *label).collect();
        Ok(Bags {
            bag: Tensor::from_vec(bag, (items.len(), VOCAB), device)?,
            labels: Tensor::new(labels, device)?,
        })
    }
}

struct BagClassifier {
    hidden: Linear,
    head: Linear,
    params: Parameters,
}

impl TrainModel for BagClassifier {
    type Batch = Bags;
    fn per_example_loss(&self, batch: &Bags) -> candle_core::Result<Tensor> {
        let h = self.hidden.forward(&batch.bag)?.relu()?;
        per_example_cross_entropy(&self.head.forward(&h)?, &batch.labels)
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

#[adaptive_trainer(schedule = constant, drop_last = false)]
struct PrefetchTrainer {
    #[model]
    model: BagClassifier,
    #[optimizer]
    opt: AdamW,
}

fn factory(hidden: usize) -> impl Fn(&RankContext) -> adabatch::Result<PrefetchTrainer> + Sync {
    move |ctx| {
        let params = ctx.parameters();
        let vb = params.var_builder(DType::F32, ctx.device());
        let model = BagClassifier {
            hidden: candle_nn::linear(VOCAB, hidden, vb.pp("hidden"))?,
            head: candle_nn::linear(hidden, CLASSES, vb.pp("head"))?,
            params,
        };
        let opt = AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr: 1e-3,
                ..Default::default()
            },
        )?;
        Ok(PrefetchTrainer::new(model, opt))
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let hidden = env_or("PREFETCH_HIDDEN", 192);
    let rounds = env_or("PREFETCH_ROUNDS", 3);
    let text = std::fs::read_to_string(CORPUS).expect("the shared English corpus");
    let sentences: Vec<String> = text.lines().map(str::to_owned).collect();
    // Labels: length buckets of 8 equal shares of the corpus.
    let mut words: Vec<usize> = sentences
        .iter()
        .map(|s| s.split_whitespace().count())
        .collect();
    words.sort_unstable();
    let cut: Vec<usize> = (1..CLASSES)
        .map(|k| words[k * words.len() / CLASSES])
        .collect();
    let data: Vec<(String, u32)> = sentences
        .iter()
        .map(|s| {
            let n = s.split_whitespace().count();
            (s.clone(), cut.iter().filter(|&&c| n >= c).count() as u32)
        })
        .collect();
    let tokenizer = Tokenizer::learn(&sentences);
    let collate = collate(&tokenizer);

    let started = Instant::now();
    for chunk in data.chunks(BATCH) {
        std::hint::black_box(collate(chunk, &Device::Cpu).expect("collate"));
    }
    let collate_s = started.elapsed().as_secs_f64();

    let run = |workers: usize| {
        let args = TrainingArgs {
            per_device_train_batch_size: BATCH,
            num_train_epochs: 1,
            dataloader_num_workers: workers,
            seed: Some(7),
            quiet: true,
            ..TrainingArgs::default()
        };
        let summary = PrefetchTrainer::launch(&data, &collate, &args, factory(hidden))
            .expect("train")
            .summary;
        (summary.train_runtime, summary.step_losses)
    };
    let worker_counts = [0usize, 1, 2];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); worker_counts.len()];
    let mut reference: Option<Vec<f64>> = None;
    for round in 0..rounds {
        for k in 0..worker_counts.len() {
            let which = (k + round) % worker_counts.len();
            let (seconds, losses) = run(worker_counts[which]);
            match &reference {
                Some(r) => assert_eq!(r, &losses, "prefetch changed the losses"),
                None => reference = Some(losses),
            }
            times[which].push(seconds);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = times.iter_mut().map(median).collect();
    let examples = data.len() as f64;
    println!(
        "prefetch bench: {} examples, batch {BATCH}, hidden {hidden}, {rounds} rounds, RAYON_NUM_THREADS={}",
        data.len(),
        std::env::var("RAYON_NUM_THREADS").unwrap_or_default()
    );
    println!(
        "collate alone: {:.3} s per epoch = {:.0} % of the epoch without prefetch",
        collate_s,
        100.0 * collate_s / medians[0]
    );
    for (workers, seconds) in worker_counts.iter().zip(&medians) {
        println!(
            "workers {workers}: {:.3} s per epoch, {:.0} examples/s, {:.2}x of 0 workers",
            seconds,
            examples / seconds,
            medians[0] / seconds
        );
    }
    println!("losses identical across all runs: yes");
}
