//! Prefetch: examples/s of a collate-heavy epoch with and without
//! `--dataloader-num-workers`, side by side in one run.
//!
//! Workload: the English corpus of `data/` (15,000 real sentences), tokenised in the
//! collate: lower-cased words cut into sub-words by byte-pair encoding as GPT-2
//! applies it (no cache), with 4,096 symbols learnt from the corpus, then a dense
//! bag of sub-words per sentence. Model: bag → `HIDDEN` →
//! ReLU → 8 classes (the sentence's length bucket), AdamW, constant batch 64.
//!
//! ```text
//! cargo bench -p adabatch-benches --bench prefetch
//! ```
//!
//! A baseline epoch trains on sentences tokenised beforehand (the same bags, a
//! light collate), so the printout says how much of a plain epoch tokenising is
//! and what perfect overlap would give; then the tokenising collate runs with 0,
//! 1 and 2 workers. `PREFETCH_ROUNDS` (default 3) rounds of the four, order
//! rotating, medians reported; every run must train the same losses. candle computes on one thread unless
//! `RAYON_NUM_THREADS` is set: compute on one core and collate on another is the
//! shape of a GPU run. `PREFETCH_HIDDEN` sets the hidden width (default 24, where
//! tokenising is about half of a plain epoch), which moves the compute's share.

use std::collections::HashMap;

#[path = "support/corpus.rs"]
mod corpus;

use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Linear, Module};

const VOCAB: usize = 4096;
const LEARN_WORDS: usize = 3000;
const CLASSES: usize = 8;
const BATCH: usize = 64;

/// Byte-pair encoding as GPT-2 applies it, without a cache: a word starts as its
/// characters, and the adjacent pair of lowest merge rank is merged until none is
/// left. Merges are learnt from the corpus's most frequent words.
struct Tokenizer {
    /// Symbol ids of single characters.
    chars: HashMap<char, u32>,
    /// `(left, right)` → (rank, merged symbol id).
    merges: HashMap<(u32, u32), (u32, u32)>,
}

impl Tokenizer {
    /// Characters first, then `VOCAB - characters` merges, each the most frequent
    /// adjacent pair over the `LEARN_WORDS` most frequent words (weighted by
    /// count), ties broken by the pair.
    fn learn(sentences: &[String]) -> Self {
        let mut word_counts: HashMap<String, usize> = HashMap::new();
        for sentence in sentences {
            for word in sentence.to_lowercase().split_whitespace() {
                *word_counts.entry(word.to_owned()).or_default() += 1;
            }
        }
        let mut chars: Vec<char> = word_counts.keys().flat_map(|w| w.chars()).collect();
        chars.sort_unstable();
        chars.dedup();
        let chars: HashMap<char, u32> = chars.into_iter().zip(0..).collect();
        let mut frequent: Vec<(String, usize)> = word_counts.into_iter().collect();
        frequent.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        frequent.truncate(LEARN_WORDS);
        let mut words: Vec<(Vec<u32>, usize)> = frequent
            .iter()
            .map(|(w, n)| (w.chars().map(|c| chars[&c]).collect(), *n))
            .collect();
        let mut merges = HashMap::new();
        let mut next_id = chars.len() as u32;
        while (next_id as usize) < VOCAB {
            let mut pairs: HashMap<(u32, u32), usize> = HashMap::new();
            for (symbols, n) in &words {
                for pair in symbols.windows(2) {
                    *pairs.entry((pair[0], pair[1])).or_default() += n;
                }
            }
            let Some((&best, _)) = pairs
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            else {
                break;
            };
            merges.insert(best, (next_id - chars.len() as u32, next_id));
            for (symbols, _) in &mut words {
                merge_pair(symbols, best, next_id);
            }
            next_id += 1;
        }
        Self { chars, merges }
    }

    /// The symbol ids of a sentence (ids of unseen characters are 0).
    fn encode(&self, sentence: &str, ids: &mut Vec<u32>) {
        for word in sentence.to_lowercase().split_whitespace() {
            let mut symbols: Vec<u32> = word
                .chars()
                .map(|c| self.chars.get(&c).copied().unwrap_or(0))
                .collect();
            while let Some((pair, merged)) = symbols
                .windows(2)
                .filter_map(|p| self.merges.get(&(p[0], p[1])).map(|&m| ((p[0], p[1]), m)))
                .min_by_key(|(_, (rank, _))| *rank)
                .map(|(pair, (_, merged))| (pair, merged))
            {
                merge_pair(&mut symbols, pair, merged);
            }
            ids.extend(symbols);
        }
    }
}

/// Replaces every occurrence of `pair` in `symbols`, left to right, by `merged`.
fn merge_pair(symbols: &mut Vec<u32>, pair: (u32, u32), merged: u32) {
    let mut out = Vec::with_capacity(symbols.len());
    let mut i = 0;
    while i < symbols.len() {
        if i + 1 < symbols.len() && (symbols[i], symbols[i + 1]) == pair {
            out.push(merged);
            i += 2;
        } else {
            out.push(symbols[i]);
            i += 1;
        }
    }
    *symbols = out;
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

/// The batch of sentences already cut into symbol ids.
fn bags(rows: &[(&[u32], u32)], device: &Device) -> candle_core::Result<Bags> {
    let mut bag = vec![0f32; rows.len() * VOCAB];
    for (row, (ids, _)) in rows.iter().enumerate() {
        let weight = 1.0 / (ids.len().max(1) as f32).sqrt();
        for &id in *ids {
            bag[row * VOCAB + id as usize] += weight;
        }
    }
    let labels: Vec<u32> = rows.iter().map(|(_, label)| *label).collect();
    Ok(Bags {
        bag: Tensor::from_vec(bag, (rows.len(), VOCAB), device)?,
        labels: Tensor::new(labels, device)?,
    })
}

/// The collate under test: tokenises every sentence, then builds the bags.
fn tokenising_collate(
    tokenizer: &Tokenizer,
) -> impl Fn(&[(String, u32)], &Device) -> candle_core::Result<Bags> + Sync + '_ {
    move |items, device| {
        let ids: Vec<Vec<u32>> = items
            .iter()
            .map(|(text, _)| {
                let mut ids = Vec::new();
                tokenizer.encode(text, &mut ids);
                ids
            })
            .collect();
        let rows: Vec<(&[u32], u32)> = ids
            .iter()
            .zip(items)
            .map(|(ids, (_, label))| (ids.as_slice(), *label))
            .collect();
        bags(&rows, device)
    }
}

/// The baseline's collate: the same bags from sentences tokenised beforehand.
fn pretokenised_collate(
    items: &[(std::sync::Arc<[u32]>, u32)],
    device: &Device,
) -> candle_core::Result<Bags> {
    let rows: Vec<(&[u32], u32)> = items.iter().map(|(ids, l)| (&ids[..], *l)).collect();
    bags(&rows, device)
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
    let hidden = env_or("PREFETCH_HIDDEN", 24);
    let rounds = env_or("PREFETCH_ROUNDS", 3);
    let text = corpus::english_sentences();
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
    let collate = tokenising_collate(&tokenizer);
    let pretokenised: Vec<(std::sync::Arc<[u32]>, u32)> = data
        .iter()
        .map(|(text, label)| {
            let mut ids = Vec::new();
            tokenizer.encode(text, &mut ids);
            (ids.into(), *label)
        })
        .collect();

    let args = |workers: usize| {
        let mut args = TrainingArgs::default();
        args.batch.per_device_train_batch_size = BATCH;
        args.length.num_train_epochs = 1;
        args.data.dataloader_num_workers = workers;
        args.data.seed = Some(7);
        args.logging.quiet = true;
        args
    };
    // Run 0: tokenised beforehand (compute and a light collate); runs 1-3:
    // tokenising in the collate with 0, 1, 2 workers.
    let run = |config: usize| {
        let summary = if config == 0 {
            PrefetchTrainer::launch(
                &pretokenised,
                &pretokenised_collate,
                &args(0),
                factory(hidden),
            )
        } else {
            PrefetchTrainer::launch(&data, &collate, &args(config - 1), factory(hidden))
        }
        .expect("train")
        .summary;
        (summary.train_runtime, summary.step_losses)
    };
    let configs = 4;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs];
    let mut reference: Option<Vec<f64>> = None;
    for round in 0..rounds {
        for k in 0..configs {
            let which = (k + round) % configs;
            let (seconds, losses) = run(which);
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
    let (compute, plain) = (medians[0], medians[1]);
    println!(
        "prefetch bench: {} examples, batch {BATCH}, hidden {hidden}, {rounds} rounds (median), RAYON_NUM_THREADS={}, host heap: {:?}",
        data.len(),
        std::env::var("RAYON_NUM_THREADS").unwrap_or_default(),
        adabatch::memory::host::host_heap()
    );
    println!(
        "pre-tokenised: {compute:.3} s per epoch, {:.0} examples/s: tokenising is {:.0} % of the plain epoch; perfect overlap would give {:.2}x",
        examples / compute,
        100.0 * (plain - compute) / plain,
        plain / compute.max(plain - compute)
    );
    for (workers, seconds) in (0..3).zip(&medians[1..]) {
        println!(
            "tokenising, workers {workers}: {seconds:.3} s per epoch, {:.0} examples/s, {:.2}x of 0 workers",
            examples / seconds,
            plain / seconds
        );
    }
    println!("losses identical across all runs: yes");
}
