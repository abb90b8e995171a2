//! Text from a trained decoder: greedy or temperature sampling, one token at a time.
//!
//! Each new token runs the whole context again (no key/value cache: the model is
//! built for training, and the few lines an example prints do not need one). The
//! context is cut to the model's `max_position_embeddings` last tokens.

use candle_core::{D, DType, IndexOp, Result, Tensor};
use rand::SeedableRng;
use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use rand_chacha::ChaCha8Rng;

use super::decoder::Llama;

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token.
    Greedy,
    /// A draw from `softmax(logits / temperature)`, seeded.
    Temperature {
        /// Above 0; below 1 sharpens the distribution, above 1 flattens it.
        temperature: f64,
        /// Seed of the draws (the same seed gives the same text).
        seed: u64,
    },
}

/// Up to `max_new_tokens` tokens following `prompt`, stopping after `stop` when it is
/// drawn (the stop token is returned too).
pub fn generate(
    model: &Llama,
    prompt: &[u32],
    max_new_tokens: usize,
    sampling: Sampling,
    stop: Option<u32>,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        candle_core::bail!("generate: the prompt needs at least one token");
    }
    if let Sampling::Temperature { temperature, .. } = sampling {
        if !(temperature > 0.0 && temperature.is_finite()) {
            candle_core::bail!("generate: temperature {temperature} must be above 0");
        }
    }
    let device = model.device().clone();
    let window = model.config().max_position_embeddings.max(1);
    let mut rng = match sampling {
        Sampling::Temperature { seed, .. } => Some(ChaCha8Rng::seed_from_u64(seed)),
        Sampling::Greedy => None,
    };
    let mut context = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..max_new_tokens {
        let start = context.len().saturating_sub(window);
        let ids = Tensor::new(&context[start..], &device)?.unsqueeze(0)?;
        let logits = model.forward(&ids)?;
        let last = logits
            .i((0, context.len() - start - 1))?
            .to_dtype(DType::F64)?;
        let next = match (sampling, rng.as_mut()) {
            (Sampling::Temperature { temperature, .. }, Some(rng)) => {
                draw(&(last / temperature)?, rng)?
            }
            _ => last.argmax(D::Minus1)?.to_scalar::<u32>()?,
        };
        out.push(next);
        context.push(next);
        if Some(next) == stop {
            break;
        }
    }
    Ok(out)
}

/// A draw from the softmax of `logits` (1-D).
fn draw(logits: &Tensor, rng: &mut ChaCha8Rng) -> Result<u32> {
    let probs = candle_nn::ops::softmax_last_dim(&logits.to_dtype(DType::F32)?)?;
    let weights = probs.to_vec1::<f32>()?;
    let index = WeightedIndex::new(&weights)
        .map_err(|e| candle_core::Error::wrap(e).context("generate: sampling a token"))?;
    Ok(index.sample(rng) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Parameters;
    use crate::models::llama::{LlamaConfig, ModelType};
    use candle_core::Device;

    fn model() -> Llama {
        let config = LlamaConfig::new(ModelType::Llama, 32, 16, 32, 1, 2, 2);
        Llama::new(
            &config,
            Parameters::new(3).var_builder(DType::F32, &Device::Cpu),
        )
        .unwrap()
    }

    #[test]
    fn greedy_follows_the_argmax_of_the_full_forward() {
        let model = model();
        let prompt = [1u32, 5, 7];
        let out = generate(&model, &prompt, 4, Sampling::Greedy, None).unwrap();
        assert_eq!(out.len(), 4);
        // Each token is the argmax of the logits of the context before it.
        let mut context = prompt.to_vec();
        for &token in &out {
            let ids = Tensor::new(context.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let logits = model
                .forward(&ids)
                .unwrap()
                .i((0, context.len() - 1))
                .unwrap();
            assert_eq!(logits.argmax(0).unwrap().to_scalar::<u32>().unwrap(), token);
            context.push(token);
        }
    }

    #[test]
    fn sampling_is_seeded_and_stops_at_the_stop_token() {
        let model = model();
        let sampling = |seed| Sampling::Temperature {
            temperature: 1.5,
            seed,
        };
        let a = generate(&model, &[2], 30, sampling(1), None).unwrap();
        assert_eq!(a, generate(&model, &[2], 30, sampling(1), None).unwrap());
        assert_ne!(a, generate(&model, &[2], 30, sampling(2), None).unwrap());
        let stop = a[3];
        let cut = generate(&model, &[2], 30, sampling(1), Some(stop)).unwrap();
        let first = a.iter().position(|&t| t == stop).unwrap();
        assert_eq!(cut, a[..=first]);
    }

    #[test]
    fn bad_prompts_and_temperatures_are_errors() {
        let model = model();
        assert!(generate(&model, &[], 3, Sampling::Greedy, None).is_err());
        let zero = Sampling::Temperature {
            temperature: 0.0,
            seed: 0,
        };
        assert!(generate(&model, &[1], 3, zero, None).is_err());
    }
}
