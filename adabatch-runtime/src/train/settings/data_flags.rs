//! The data flags (`DataArgs`) check and resolve themselves: the sources of a
//! mixed dataset and their weights.

use crate::config::args::DataArgs;
use crate::config::policy::MixSpec;
use crate::data::source_spec::SourceSpec;
use crate::error::{DataError, Error, Result, SettingsError};
use crate::user::data::Dataset;

impl DataArgs {
    /// `--mix-weights`: `source=weight` pairs, each source once.
    pub(super) fn check(&self) -> Result<()> {
        let mut names: Vec<String> = self.mix_weights()?.into_iter().map(|(n, _)| n).collect();
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "mix_weights",
                value: format!("{} given twice", twice[0]),
                expected: "each source named once",
            }));
        }
        Ok(())
    }

    /// `--mix-weights`, parsed.
    fn mix_weights(&self) -> Result<Vec<(String, f64)>> {
        (self.mix_weights.iter())
            .map(|pair| {
                let parsed = pair.split_once('=').and_then(|(name, w)| {
                    Some((name.trim().to_string(), w.trim().parse::<f64>().ok()?))
                });
                parsed.ok_or_else(|| {
                    Error::Settings(SettingsError::InvalidSetting {
                        name: "mix_weights",
                        value: pair.clone(),
                        expected: "source=weight pairs, e.g. new=0.75,replay=0.25",
                    })
                })
            })
            .collect()
    }

    /// The dataset's sources, with the weights of `mix = fixed(..)`, then of
    /// `--mix-weights name=w,..`, in place of its own; `None` for a dataset of one
    /// source, which the mixing flags and keys then cannot apply to.
    pub(super) fn sources<D: Dataset + ?Sized>(
        &self,
        dataset: &D,
        mix: &MixSpec,
    ) -> Result<Option<SourceSpec>> {
        let Some(mut spec) = dataset.sources() else {
            if !self.mix_weights.is_empty() {
                return Err(Error::Settings(SettingsError::InvalidSetting {
                    name: "mix_weights",
                    value: self.mix_weights.join(","),
                    expected: "a dataset of several sources (adabatch::Sources)",
                }));
            }
            if let Some(stopping) = self.stopping_strategy {
                return Err(Error::Settings(SettingsError::InvalidSetting {
                    name: "stopping_strategy",
                    value: format!("{stopping:?}"),
                    expected: "a dataset of several sources (adabatch::Sources)",
                }));
            }
            if *mix != MixSpec::Dataset {
                return Err(Error::Data(DataError::MixerWithoutSources));
            }
            return Ok(None);
        };
        if let Some(stopping) = self.stopping_strategy {
            spec.stopping = stopping;
        }
        if let MixSpec::Fixed(pairs) = mix {
            let named: Vec<(String, f64)> =
                pairs.iter().map(|(n, w)| (n.to_string(), *w)).collect();
            spec = spec.reweighted(&named)?;
        }
        if self.mix_weights.is_empty() {
            return Ok(Some(spec));
        }
        spec.reweighted(&self.mix_weights()?).map(Some)
    }
}
