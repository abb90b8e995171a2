//! The gradient noise scale sizing the batch (`schedule = noise_scale(..)`), on two
//! tasks:
//!
//! * `--task digits` (default): an MLP on the UCI 8×8 handwritten digits shipped in
//!   `data/` (a seeded 70/30 split). Every step logs the estimate
//!   B_simple = tr(Σ)/|G|² and the next global batch is half of it, between 16 and
//!   512; the test split is evaluated every `--eval-steps` (default 5) steps. The
//!   run says when test accuracy first reached `--target-accuracy`. With
//!   `--global-batch-size G` the same program trains with a fixed global batch: the
//!   baseline of the comparison in BENCHMARKS.md.
//! * `--task linreg --dim D --noise-std S`: the validation task. A linear model
//!   without bias, weights 0, true weights 1/√D, standard-normal inputs, targets
//!   true·x + S·noise, loss ½(w·x − y)². With `--learning-rate 0` the weights stay
//!   put and the mean estimate can be held against its analytic value
//!   (D + 1) + S²·D (derived in tests/it/noise_scale.rs).
//!
//! ```text
//! cargo run --release --example noise_scale -- --nproc-per-node 2 --num-train-epochs 10 \
//!     --learning-rate 0.003 --log-jsonl noise.jsonl
//! cargo run --release --example noise_scale -- --nproc-per-node 2 --num-train-epochs 10 \
//!     --learning-rate 0.003 --global-batch-size 32 --log-jsonl fixed.jsonl
//! cargo run --release --example noise_scale -- --task linreg --dim 8 --noise-std 1 \
//!     --learning-rate 0 --max-steps 1500 --nproc-per-node 3
//! ```

#[path = "support/digits.rs"]
mod digits;

use std::path::PathBuf;

use adabatch::candle_core::{self, DType, Device, Tensor, Var};
use adabatch::clap::{self, CommandFactory, FromArgMatches, Parser, ValueEnum};
use adabatch::prelude::*;
use adabatch::{AdamW, ParamsAdamW, Sgd};
use digits::{collate, read_digits, split, Digit, Mlp};
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, ValueEnum)]
enum Task {
    Digits,
    Linreg,
}

#[derive(Parser)]
#[command(about = "schedule = noise_scale(..) on the digits, or validated on linear regression")]
struct Cli {
    #[arg(long, value_enum, default_value = "digits")]
    task: Task,
    /// digits: the data set (CSV, or gzipped CSV); default: the repository's copy.
    #[arg(long)]
    digits: Option<PathBuf>,
    /// digits: say when test accuracy first reaches this.
    #[arg(long, default_value_t = 0.95)]
    target_accuracy: f64,
    /// linreg: input dimension D.
    #[arg(long, default_value_t = 8)]
    dim: usize,
    /// linreg: standard deviation S of the target noise.
    #[arg(long, default_value_t = 1.0)]
    noise_std: f64,
    /// linreg: examples in the data set.
    #[arg(long, default_value_t = 20_000)]
    examples: usize,
    /// Write the run's results here as JSON.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    #[command(flatten)]
    train: TrainingArgs,
}

/// Half the estimated noise scale, followed continuously (`factor = 1`, as
/// BENCHMARKS.md's digits rows were measured), between 16 and 512 examples per
/// step, over two micro-batches (so one rank has two small batches to estimate
/// from).
#[adaptive_trainer(
    schedule = noise_scale(fraction = 0.5, min = 16, max = 512, factor = 1, hysteresis = 0.0, shrink = true),
    grad_accum = fixed(2)
)]
struct Digits {
    #[model]
    model: Mlp,
    #[optimizer]
    opt: AdamW,
}

fn main() -> std::process::ExitCode {
    // The digits' AdamW keeps candle's weight decay of 0.01 unless a flag says.
    let command = Cli::command().mut_arg("weight_decay", |a| a.default_value("0.01"));
    let matches = adabatch::hf_matches(command);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sgd_refuses = match cli.task {
        Task::Linreg => adabatch::OptimArgs::given(&matches),
        Task::Digits => Vec::new(),
    };
    if !sgd_refuses.is_empty() {
        return adabatch::exit_code(Err(adabatch::Error::msg(format!(
            "--task linreg trains with SGD at --learning-rate: {} apply to the digits' AdamW only",
            sgd_refuses.join(", ")
        ))));
    }
    adabatch::exit_code(run(cli))
}

fn run(cli: Cli) -> adabatch::Result<()> {
    let results = match cli.task {
        Task::Digits => run_digits(&cli)?,
        Task::Linreg => run_linreg(&cli)?,
    };
    if let Some(path) = &cli.summary_json {
        let text = serde_json::to_string_pretty(&results).expect("plain JSON");
        std::fs::write(path, text + "\n")
            .map_err(adabatch::Error::io(adabatch::FileOp::Write, path))?;
    }
    Ok(())
}

fn run_digits(cli: &Cli) -> adabatch::Result<serde_json::Value> {
    let path = cli.digits.clone().unwrap_or_else(digits::default_path);
    let mut args = cli.train.clone();
    args.eval.eval_steps = args.eval.eval_steps.or(Some(5));
    let seed = args.data.seed.unwrap_or(0);
    let (train, test): (Vec<Digit>, Vec<Digit>) = split(read_digits(&path)?, 0.7, seed);
    let factory = |ctx: &RankContext| -> adabatch::Result<Digits> {
        let model = Mlp::new(ctx.parameters(), 64, ctx.device())?;
        let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::from_args(&args)?)?;
        Ok(Digits::new(model, opt))
    };
    let Trained { summary, .. } =
        Digits::launch_with_eval(&train, &test, &collate, &args, factory)?;
    println!("{summary}");
    let accuracy = |e: &adabatch::EvalLog| e.get("eval_accuracy").unwrap_or(f64::NAN);
    let reached = summary
        .evaluations
        .iter()
        .find(|e| accuracy(e) >= cli.target_accuracy);
    let examples_at = |epoch: f64| (epoch * train.len() as f64).round() as usize;
    match reached {
        Some(e) => println!(
            "test accuracy {:.4} >= {} first at step {} after {} examples",
            accuracy(e),
            cli.target_accuracy,
            e.step,
            examples_at(e.epoch)
        ),
        None => println!("test accuracy never reached {}", cli.target_accuracy),
    }
    let last = summary
        .final_eval()
        .ok_or_else(|| adabatch::Error::msg("no evaluation"))?;
    Ok(serde_json::json!({
        "task": "digits",
        "train_examples": train.len(),
        "test_examples": test.len(),
        "target_accuracy": cli.target_accuracy,
        "reached_at_step": reached.map(|e| e.step),
        "reached_after_examples": reached.map(|e| examples_at(e.epoch)),
        "final_test_accuracy": accuracy(last),
        "global_step": summary.global_step,
        "examples_seen": summary.examples_seen,
    }))
}

/// `w·x` without bias; the per-example loss is ½(w·x − y)².
struct Linear {
    w: Var,
}

struct Xy {
    x: Tensor,
    y: Tensor,
}

impl Batch for Xy {
    fn num_examples(&self) -> usize {
        self.y.dims()[0]
    }
}

impl TrainModel for Linear {
    type Batch = Xy;
    fn per_example_loss(&self, batch: &Xy) -> candle_core::Result<Tensor> {
        let pred = batch
            .x
            .matmul(&self.w.as_tensor().unsqueeze(1)?)?
            .squeeze(1)?;
        (pred - &batch.y)?.sqr()? * 0.5
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        vec![("w".into(), self.w.clone())]
    }
}

/// A constant batch over two micro-batches: the estimate is only logged.
#[adaptive_trainer(schedule = constant, grad_accum = fixed(2))]
struct LinReg {
    #[model]
    model: Linear,
    #[optimizer]
    opt: Sgd,
}

type Example = (Vec<f32>, f32);

fn normal(rng: &mut impl Rng) -> f64 {
    // Box–Muller.
    let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    let v: f64 = rng.random::<f64>();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

fn run_linreg(cli: &Cli) -> adabatch::Result<serde_json::Value> {
    let (dim, noise) = (cli.dim, cli.noise_std);
    if dim == 0 {
        return Err(adabatch::Error::msg("--dim must be at least 1"));
    }
    let mut args = cli.train.clone();
    args.step.log_gradient_noise_scale = true;
    let log = args.logging.log_jsonl.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("adabatch-linreg-{}.jsonl", std::process::id()))
    });
    let keep_log = args.logging.log_jsonl.is_some();
    args.logging.log_jsonl = Some(log.clone());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.data.seed.unwrap_or(0));
    let truth = 1.0 / (dim as f64).sqrt();
    let data: Vec<Example> = (0..cli.examples)
        .map(|_| {
            let x: Vec<f64> = (0..dim).map(|_| normal(&mut rng)).collect();
            let y = truth * x.iter().sum::<f64>() + noise * normal(&mut rng);
            (x.into_iter().map(|v| v as f32).collect(), y as f32)
        })
        .collect();
    let collate = |items: &[Example], device: &Device| -> candle_core::Result<Xy> {
        let x: Vec<f32> = items.iter().flat_map(|(x, _)| x.iter().copied()).collect();
        Ok(Xy {
            x: Tensor::from_vec(x, (items.len(), dim), device)?,
            y: Tensor::new(items.iter().map(|(_, y)| *y).collect::<Vec<_>>(), device)?,
        })
    };
    let factory = |ctx: &RankContext| -> adabatch::Result<LinReg> {
        let w = Var::zeros(dim, DType::F32, ctx.device())?;
        let opt = Sgd::new(vec![w.clone()], args.lr.learning_rate);
        Ok(LinReg::new(Linear { w }, opt))
    };
    let Trained { summary, .. } = LinReg::launch(&data, &collate, &args, factory)?;
    println!("{summary}");
    let text =
        std::fs::read_to_string(&log).map_err(adabatch::Error::io(adabatch::FileOp::Read, &log))?;
    if !keep_log {
        let _ = std::fs::remove_file(&log);
    }
    let estimates: Vec<f64> = text
        .lines()
        .filter(|l| !l.contains(r#""event":"#))
        .filter_map(|l| serde_json::from_str::<adabatch::StepLog>(l).ok())
        .filter_map(|s| s.gradient_noise_scale)
        .collect();
    // The first third is the moving averages' warm-up.
    let tail = &estimates[estimates.len() / 3..];
    if tail.is_empty() {
        return Err(adabatch::Error::msg(
            "too few steps to average the estimate (use --max-steps 300 or more)",
        ));
    }
    let mean = tail.iter().sum::<f64>() / tail.len() as f64;
    let analytic = (dim as f64 + 1.0) + noise * noise * dim as f64;
    println!(
        "gradient noise scale: mean {mean:.3} over the last {} steps; analytic (D + 1) + S²·D = {analytic} ({:+.1} %)",
        tail.len(),
        100.0 * (mean / analytic - 1.0)
    );
    if cli.train.lr.learning_rate != 0.0 {
        println!("(the analytic value holds at w = 0: run with --learning-rate 0 to compare)");
    }
    Ok(serde_json::json!({
        "task": "linreg",
        "dim": dim,
        "noise_std": noise,
        "steps_averaged": tail.len(),
        "mean_gradient_noise_scale": mean,
        "analytic": analytic,
    }))
}
