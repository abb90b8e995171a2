//! Several text domains under one tokenizer, as sources of token documents.
//!
//! [`prepare_domains`] reads named corpora, holds out each domain's validation
//! documents, trains one tokenizer on the training documents of all domains (never
//! on held-out ones), and writes a prepared directory per domain:
//!
//! ```text
//! DIR/domains.json         the domains, in order, and what they were prepared from
//! DIR/tokenizer.json       the shared tokenizer
//! DIR/<name>/              a prepared corpus (see `tokenize`): train.bin,
//!                          validation.bin, tokenizer.json, tokens.json
//! ```
//!
//! [`Domains::open`] opens prepared domain directories (these, or directories
//! prepared apart with one `tokenizer.json`) as [`Sources`] of documents whose
//! weights are shares of tokens ([`MixUnit::Tokens`]); directories of different
//! tokenizers, a domain without validation documents, or an unknown layout are
//! typed errors before anything trains.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::source_spec::MixUnit;
use crate::data::token_files::TokenDocuments;
use crate::data::tokenize::{
    check_fraction, read_json, remove_if_present, tokenizer_for, write_corpus, write_whole, Corpus,
    CorpusInfo, CorpusSource, PrepareOptions,
};
use crate::error::{DataError, Error, Result};
use crate::user::sources::Sources;

/// What [`prepare_domains`] wrote: `domains.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainsInfo {
    /// The domains' names, in order (each a folder of the directory).
    pub names: Vec<String>,
    /// What each was prepared from (its corpus files and sizes, the tokenizer, the
    /// held-out share), in the same order.
    pub sources: Vec<CorpusSource>,
}

impl DomainsInfo {
    /// The `domains.json` of a prepared directory.
    pub fn read(dir: &Path) -> Result<Self> {
        read_json(&dir.join("domains.json"))
    }

    /// Whether the directory holds `domains` prepared with `options` (the same
    /// names and files, of the same sizes, and settings).
    pub fn prepared_from(&self, domains: &[(String, PathBuf)], options: &PrepareOptions) -> bool {
        let names: Vec<&String> = domains.iter().map(|(n, _)| n).collect();
        names == self.names.iter().collect::<Vec<_>>()
            && domains
                .iter()
                .zip(&self.sources)
                .all(|((_, path), source)| {
                    CorpusSource::of(std::slice::from_ref(path), options)
                        .is_ok_and(|s| &s == source)
                })
    }
}

/// A domain's name: letters, digits, `_` and `-` (it names a folder and log keys).
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::Data(DataError::InvalidTokenSetting {
            name: "domain name",
            value: format!("{name:?}"),
            expected: "letters, digits, `_` and `-` (it names a folder and the logs' keys)".into(),
        }))
    }
}

/// Checks names: well formed and unique.
fn check_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<()> {
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        check_name(name)?;
        if seen.contains(&name) {
            return Err(Error::Data(DataError::DuplicateSource {
                name: name.into(),
            }));
        }
        seen.push(name);
    }
    if seen.is_empty() {
        return Err(Error::Data(DataError::NoSources));
    }
    Ok(())
}

/// Tokenizes named corpora (`(name, file or folder)`) into `dir` (the module's
/// layout), streaming: one tokenizer trained on the first training documents of
/// every domain (an equal share of the sample each), each domain's held-out share
/// spread evenly through it. A domain whose corpus is empty, or that has no
/// validation document (with a held-out share above 0), is a typed error, and
/// the directory is then not marked complete.
pub fn prepare_domains(
    domains: &[(String, PathBuf)],
    dir: &Path,
    options: &PrepareOptions,
) -> Result<(DomainsInfo, Vec<CorpusInfo>)> {
    check_names(domains.iter().map(|(n, _)| n.as_str()))?;
    check_fraction(options)?;
    let corpora = domains
        .iter()
        .map(|(_, path)| Corpus::open(std::slice::from_ref(path), &options.text_column))
        .collect::<Result<Vec<_>>>()?;
    let (tokenizer, sample) = tokenizer_for(options, &corpora)?;
    // `domains.json` marks a complete preparation: it goes first, comes back last.
    remove_if_present(&dir.join("domains.json"))?;
    let mut infos = Vec::with_capacity(domains.len());
    let mut sources = Vec::with_capacity(domains.len());
    for ((name, path), corpus) in domains.iter().zip(&corpora) {
        let source = CorpusSource::of(std::slice::from_ref(path), options)?;
        let info = write_corpus(
            &dir.join(name),
            &tokenizer,
            corpus,
            source.clone(),
            options,
            sample,
        )?;
        // Streamed, the held-out count is known at the end: the directory is not
        // marked complete (no domains.json) when a domain has none.
        if options.validation_fraction > 0.0 && info.validation_documents == 0 {
            return Err(Error::Data(DataError::NoValidationDocuments {
                domain: name.clone(),
            }));
        }
        infos.push(info);
        sources.push(source);
    }
    let text = tokenizer.to_string(false).map_err(|e| {
        Error::Data(DataError::Tokenizer {
            path: dir.join("tokenizer.json"),
            detail: "cannot write the tokenizer as JSON".into(),
            source: Some(e),
        })
    })?;
    write_whole(&dir.join("tokenizer.json"), text.as_bytes())?;
    let info = DomainsInfo {
        names: domains.iter().map(|(n, _)| n.clone()).collect(),
        sources,
    };
    let json = serde_json::to_string_pretty(&info).expect("plain data serialises");
    write_whole(&dir.join("domains.json"), json.as_bytes())?;
    Ok((info, infos))
}

/// Domains opened for training: each domain's training and validation documents
/// as sources (weights in tokens), with the shared tokenizer's figures.
#[derive(Debug)]
pub struct Domains {
    /// The first domain's `tokens.json` (every domain shares its vocabulary,
    /// EOS id and width).
    pub info: CorpusInfo,
    /// Each domain's `tokens.json`, in order.
    pub infos: Vec<CorpusInfo>,
    /// Training documents, one source per domain, weights in tokens (the
    /// domains' token counts until set otherwise: stratified).
    pub train: Sources<TokenDocuments>,
    /// Validation documents, one source per domain (`eval_<domain>_loss`).
    pub validation: Sources<TokenDocuments>,
}

impl Domains {
    /// Opens prepared domain directories (`(name, dir)`, each holding
    /// `tokens.json`, `train.bin` and `validation.bin`). All must share one
    /// tokenizer (vocabulary, EOS id, width and `tokenizer.json`'s checksum), and
    /// each needs validation documents.
    pub fn open(domains: &[(String, PathBuf)]) -> Result<Self> {
        Self::open_all(domains, None)
    }

    /// [`Domains::open`], every document longer than `max_len` tokens split into
    /// examples of at most `max_len` ([`TokenDocuments::with_max_len`]: memory per
    /// step bounded whatever a corpus holds).
    pub fn open_split(domains: &[(String, PathBuf)], max_len: usize) -> Result<Self> {
        Self::open_all(domains, Some(max_len))
    }

    fn open_all(domains: &[(String, PathBuf)], max_len: Option<usize>) -> Result<Self> {
        check_names(domains.iter().map(|(n, _)| n.as_str()))?;
        let infos: Vec<CorpusInfo> = domains
            .iter()
            .map(|(_, dir)| CorpusInfo::read(dir))
            .collect::<Result<_>>()?;
        let first = &infos[0];
        for ((name, _), info) in domains.iter().zip(&infos).skip(1) {
            if let Some(detail) = tokenizer_difference(first, info) {
                return Err(Error::Data(DataError::MixedTokenizers {
                    first: domains[0].0.clone(),
                    other: name.clone(),
                    detail,
                }));
            }
        }
        let mut train = Vec::with_capacity(domains.len());
        let mut validation = Vec::with_capacity(domains.len());
        for ((name, dir), info) in domains.iter().zip(&infos) {
            if info.validation_documents == 0 {
                return Err(Error::Data(DataError::NoValidationDocuments {
                    domain: name.clone(),
                }));
            }
            let (mut t, mut v) = info.open_documents(dir)?;
            if let Some(max) = max_len {
                (t, v) = (t.with_max_len(max)?, v.with_max_len(max)?);
            }
            train.push((name.clone(), t));
            validation.push((name.clone(), v));
        }
        Ok(Self {
            info: first.clone(),
            train: Sources::new(train)?.with_unit(MixUnit::Tokens),
            validation: Sources::new(validation)?.with_unit(MixUnit::Tokens),
            infos,
        })
    }

    /// The domains [`prepare_domains`] wrote into `dir`, in order.
    pub fn open_prepared(dir: &Path) -> Result<Self> {
        Self::open(&Self::prepared_dirs(dir)?)
    }

    /// The `(name, folder)` of each domain [`prepare_domains`] wrote into `dir`.
    pub fn prepared_dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
        let info = DomainsInfo::read(dir)?;
        Ok(info
            .names
            .iter()
            .map(|n| (n.clone(), dir.join(n)))
            .collect())
    }
}

/// How two prepared directories' tokenizers differ, if they do.
fn tokenizer_difference(a: &CorpusInfo, b: &CorpusInfo) -> Option<String> {
    if a.vocab_size != b.vocab_size {
        return Some(format!(
            "vocabularies of {} and {} ids",
            a.vocab_size, b.vocab_size
        ));
    }
    if a.eos_id != b.eos_id {
        return Some(format!("EOS ids {} and {}", a.eos_id, b.eos_id));
    }
    if a.width_bytes != b.width_bytes {
        return Some(format!("{}- and {}-byte ids", a.width_bytes, b.width_bytes));
    }
    match (a.tokenizer_crc32c, b.tokenizer_crc32c) {
        (Some(x), Some(y)) if x != y => Some(format!(
            "tokenizer.json files with checksums {x:08x} and {y:08x}"
        )),
        (Some(_), None) | (None, Some(_)) => Some(
            "one directory records its tokenizer's checksum and the other does not (prepared by an older version: prepare both again)".into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_names(["en", "py_3", "kjv-1611"]).is_ok());
        for bad in [vec!["a b"], vec![""], vec!["a/b"]] {
            assert!(matches!(
                check_names(bad),
                Err(Error::Data(DataError::InvalidTokenSetting { .. }))
            ));
        }
        assert!(matches!(
            check_names(["a", "a"]),
            Err(Error::Data(DataError::DuplicateSource { .. }))
        ));
        assert!(matches!(
            check_names([]),
            Err(Error::Data(DataError::NoSources))
        ));
    }
}
