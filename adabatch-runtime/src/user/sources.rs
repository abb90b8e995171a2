//! A dataset of several named sources (e.g. `new` and `replay`), mixed in every
//! global batch by weights (HF `interleave_datasets` with `probabilities`, but
//! deterministic: see [`crate::data::source_spec`]).

use crate::data::source_spec::{check_weights, MixUnit, SourceSpec, StoppingStrategy};
use crate::error::{DataError, Error, Result};
use crate::user::data::Dataset;

/// Named sources of one item type. The first is the primary: a run's epochs are
/// passes over it; the others cycle. Indices run through the sources in order.
#[derive(Debug, Clone)]
pub struct Sources<D> {
    names: Vec<String>,
    parts: Vec<D>,
    offsets: Vec<usize>,
    weights: Vec<f64>,
    /// Whether the weights were given (else they follow the sizes in the unit).
    weights_given: bool,
    stopping: StoppingStrategy,
    unit: MixUnit,
    tokens: Vec<u64>,
}

impl<D: Dataset> Sources<D> {
    /// The sources, weighted by their sizes until [`Sources::with_weights`] says
    /// otherwise. No source, an empty one or a repeated name is a typed error.
    pub fn new<N: Into<String>>(sources: impl IntoIterator<Item = (N, D)>) -> Result<Self> {
        let (names, parts): (Vec<String>, Vec<D>) =
            sources.into_iter().map(|(n, d)| (n.into(), d)).unzip();
        if names.is_empty() {
            return Err(Error::Data(DataError::NoSources));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(Error::Data(DataError::DuplicateSource {
                    name: name.clone(),
                }));
            }
            if parts[i].is_empty() {
                return Err(Error::Data(DataError::EmptySource { name: name.clone() }));
            }
        }
        let mut offsets = Vec::with_capacity(parts.len());
        let mut total = 0;
        for part in &parts {
            offsets.push(total);
            total += part.len();
        }
        let weights = parts.iter().map(|p| p.len() as f64).collect();
        let tokens = parts
            .iter()
            .map(|p| (0..p.len()).map(|i| p.example_len(i) as u64).sum())
            .collect();
        Ok(Self {
            names,
            parts,
            offsets,
            weights,
            weights_given: false,
            stopping: StoppingStrategy::Primary,
            unit: MixUnit::Examples,
            tokens,
        })
    }

    /// Mixing weights by source name (`[("new", 0.75), ("replay", 0.25)]`),
    /// normalised when used; sources left out get 0. An unknown name, a NaN or
    /// negative weight, or all zeros is a typed error.
    pub fn with_weights<N: AsRef<str>>(mut self, weights: &[(N, f64)]) -> Result<Self> {
        let named: Vec<(String, f64)> = weights
            .iter()
            .map(|(n, w)| (n.as_ref().to_string(), *w))
            .collect();
        self.weights = self.spec().reweighted(&named)?.weights;
        check_weights(0, &self.weights)?;
        self.weights_given = true;
        Ok(self)
    }

    /// What the weights are shares of (examples by default). Under
    /// [`MixUnit::Tokens`] the weights not given are the sources' token counts
    /// (stratified sampling), and mixers' weights are shares of tokens.
    pub fn with_unit(mut self, unit: MixUnit) -> Self {
        self.unit = unit;
        if !self.weights_given {
            self.weights = match unit {
                MixUnit::Examples => self.parts.iter().map(|p| p.len() as f64).collect(),
                MixUnit::Tokens => self.tokens.iter().map(|&t| t as f64).collect(),
            };
        }
        self
    }

    /// Each source's tokens: the sum of its examples' [`Dataset::example_len`].
    pub fn tokens(&self) -> &[u64] {
        &self.tokens
    }

    /// When an epoch ends (HF `interleave_datasets(stopping_strategy=..)`): a pass
    /// over the first source (the default), when any source runs out
    /// (`FirstExhausted`), or once every source has finished a pass
    /// (`AllExhausted`). `--stopping-strategy` overrides it at run time.
    pub fn with_stopping_strategy(mut self, stopping: StoppingStrategy) -> Self {
        self.stopping = stopping;
        self
    }

    /// The source names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The source called `name`.
    pub fn source(&self, name: &str) -> Option<&D> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| &self.parts[i])
    }

    /// The source of dataset index `index` and the index within it.
    fn locate(&self, index: usize) -> (usize, usize) {
        let s = self.offsets.partition_point(|&o| o <= index) - 1;
        (s, index - self.offsets[s])
    }

    fn spec(&self) -> SourceSpec {
        SourceSpec {
            names: self.names.clone(),
            sizes: self.parts.iter().map(Dataset::len).collect(),
            weights: self.weights.clone(),
            stopping: self.stopping,
            unit: self.unit,
            tokens: self.tokens.clone(),
        }
    }
}

impl<D: Dataset> Dataset for Sources<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.parts.iter().map(Dataset::len).sum()
    }
    fn get(&self, index: usize) -> D::Item {
        let (s, i) = self.locate(index);
        self.parts[s].get(i)
    }
    fn example_len(&self, index: usize) -> usize {
        let (s, i) = self.locate(index);
        self.parts[s].example_len(i)
    }
    fn sources(&self) -> Option<SourceSpec> {
        Some(self.spec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_run_through_the_sources_in_order() {
        let s = Sources::new([("a", vec![10, 11]), ("b", vec![20, 21, 22])]).unwrap();
        assert_eq!(
            (0..5).map(|i| s.get(i)).collect::<Vec<_>>(),
            [10, 11, 20, 21, 22]
        );
        let spec = s.sources().unwrap();
        assert_eq!(spec.sizes, [2, 3]);
        assert_eq!(spec.weights, [2.0, 3.0]);
        assert_eq!(spec.locate(3), (1, 1));
        let s = s.with_weights(&[("b", 1.0)]).unwrap();
        assert_eq!(s.sources().unwrap().weights, [0.0, 1.0]);
    }

    #[test]
    fn mistakes_are_typed_errors() {
        let none: Vec<(&str, Vec<u8>)> = Vec::new();
        assert!(matches!(
            Sources::new(none),
            Err(Error::Data(DataError::NoSources))
        ));
        assert!(matches!(
            Sources::new([("a", vec![1]), ("a", vec![2])]),
            Err(Error::Data(DataError::DuplicateSource { .. }))
        ));
        assert!(matches!(
            Sources::new([("a", vec![1]), ("b", vec![])]),
            Err(Error::Data(DataError::EmptySource { name })) if name == "b"
        ));
        let s = Sources::new([("a", vec![1]), ("b", vec![2])]).unwrap();
        assert!(matches!(
            s.clone().with_weights(&[("c", 1.0)]),
            Err(Error::Data(DataError::UnknownSource { .. }))
        ));
        for w in [f64::NAN, -1.0, 0.0] {
            assert!(matches!(
                s.clone().with_weights(&[("a", w)]),
                Err(Error::Data(DataError::InvalidMixWeights { step: 0, .. }))
            ));
        }
    }
}
