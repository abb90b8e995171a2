//! Pretrain a small Llama decoder on several text domains mixed in every global
//! batch, the shares decided by a mixer (`--mixer`): by default English sentences,
//! King James verses and Python functions (`data/`), one byte-level BPE trained on
//! the training documents of all of them, each domain's validation loss (nats per
//! token) measured apart.
//!
//! ```text
//! cargo run --release --example mixture -- --mixer odm --nproc-per-node 2
//! cargo run --release --example mixture -- --domain en=data/en_sentences_15k.txt.gz \
//!     --domain code=my_functions.jsonl --mixer stratified --max-train-tokens 1000000
//! ```
//!
//! Every logged step carries `mix_weights`, `source_loss` (per token) and
//! `source_tokens`; every evaluation `eval_<domain>_loss`. `--help` lists each
//! mixer and each replay for continual pretraining (`--new-domain`, `--replay-*`)
//! with its defaults; docs/guide/mixing.md says how they work and what the
//! experiments behind the defaults measured.

use adabatch::MixUnit;
use clap::Parser;

#[path = "support/mixture/mod.rs"]
mod mixture;

#[derive(Parser)]
#[command(about = "Pretrain a small Llama decoder on several domains, mixed by a mixer")]
struct Cli {
    #[command(flatten)]
    mixture: mixture::MixtureArgs,
}

fn main() -> std::process::ExitCode {
    adabatch::exit_code(run())
}

fn run() -> adabatch::Result<()> {
    let (cli, matches) = mixture::parse::<Cli>();
    mixture::run(cli.mixture, &matches, MixUnit::Tokens)?.report();
    Ok(())
}
