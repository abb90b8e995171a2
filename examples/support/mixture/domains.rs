//! The domains: prepared folders, or corpus files tokenized into `--tokens-dir`.

use std::path::{Path, PathBuf};

use adabatch::Domains;

use super::args::MixtureArgs;
use super::decoder;

/// The domains: opened where every path is a prepared folder (it has
/// `tokens.json`), else tokenized into
/// `--tokens-dir` first (reused when prepared from the same files and settings).
pub fn open_domains(cli: &MixtureArgs) -> adabatch::Result<Domains> {
    let domains: Vec<(String, PathBuf)> = cli
        .domain
        .iter()
        .map(|(n, p)| (n.clone(), decoder::in_repository(p.clone())))
        .collect();
    let prepared = |p: &Path| p.join("tokens.json").is_file();
    if domains.iter().all(|(_, p)| prepared(p)) {
        return Domains::open_split(&domains, cli.tokens.max_document_tokens);
    }
    // Otherwise every path is a corpus: a file, or a folder of corpus files
    // (shards), as `adabatch tokenize` reads them.
    use adabatch::tokenize::{PrepareOptions, TokenizerSource};
    let options = PrepareOptions {
        tokenizer: TokenizerSource::TrainBpe {
            vocab_size: cli.tokens.vocab_size,
        },
        validation_fraction: cli.tokens.validation_fraction,
        ..PrepareOptions::default()
    };
    let existing = adabatch::DomainsInfo::read(&cli.tokens_dir);
    let current = existing
        .as_ref()
        .is_ok_and(|info| info.prepared_from(&domains, &options));
    if !current {
        adabatch::tokenize::may_prepare(&cli.tokens_dir, cli.tokens.retokenize, || {
            match &existing {
            Ok(info) => format!(
                "it holds the domains {:?} prepared from other files or settings; this run asks for {:?}",
                info.names, domains
            ),
            Err(_) => "it holds other files than prepared domains (no readable domains.json)".into(),
        }
        })?;
        let (_, infos) = adabatch::prepare_domains(&domains, &cli.tokens_dir, &options)?;
        for ((name, _), info) in domains.iter().zip(&infos) {
            println!(
                "tokenized `{name}`: {} training documents ({} tokens), {} validation documents ({} tokens)",
                info.train_documents, info.train_tokens, info.validation_documents, info.validation_tokens
            );
        }
    }
    let dirs = Domains::prepared_dirs(&cli.tokens_dir)?;
    Domains::open_split(&dirs, cli.tokens.max_document_tokens)
}
