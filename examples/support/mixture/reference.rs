//! `--replay-reference-model`: the old domains' losses under a saved model, the
//! reference `--replay-bound` reads its drift against.

use std::path::Path;

use adabatch::{LoadPretrained, PackedCollate};

/// Each old domain's validation loss (nats per token, as the engine's
/// `eval_<domain>_loss`) under the model saved in `dir`: over its first
/// `held_out` validation documents when given (the engine's held-out set), else
/// over all of them. On the CPU, before the run's first step.
pub fn model_losses<D: adabatch::Dataset<Item = Vec<u32>>>(
    dir: &Path,
    config: &adabatch::models::llama::LlamaConfig,
    (validation, held_out): (&adabatch::Sources<D>, Option<usize>),
    new_domains: &[String],
    collate: &PackedCollate,
) -> adabatch::Result<Vec<(String, f64)>> {
    let device = candle_core::Device::Cpu;
    let params = adabatch::Parameters::new(0);
    let llama = adabatch::models::llama::Llama::new(
        config,
        params.var_builder(candle_core::DType::F32, &device),
    )?;
    params.load_pretrained(dir, true)?;
    let spec = adabatch::Dataset::sources(validation).ok_or_else(|| {
        adabatch::Error::msg("--replay-reference-model needs the domains' validation documents")
    })?;
    let mut losses = Vec::new();
    let mut first = 0;
    for (name, &size) in spec.names.iter().zip(&spec.sizes) {
        let count = held_out.map_or(size, |n| n.min(size));
        if !new_domains.contains(name) && count > 0 {
            let documents: Vec<Vec<u32>> = (first..first + count)
                .map(|i| adabatch::Dataset::get(validation, i))
                .collect();
            let (mut sum, mut tokens) = (0.0, 0);
            for chunk in documents.chunks(64) {
                let batch = adabatch::Collate::collate(collate, chunk, &device)?;
                let logits = llama.forward_packed(
                    &batch.input_ids,
                    Some(&batch.position_ids),
                    Some(&batch.document_ids),
                )?;
                let per_document = batch.per_document_cross_entropy(&logits)?;
                sum += per_document
                    .to_dtype(candle_core::DType::F64)?
                    .sum_all()?
                    .to_scalar::<f64>()?;
                tokens += adabatch::Batch::num_tokens(&batch);
            }
            losses.push((name.clone(), sum / tokens.max(1) as f64));
        }
        first += size;
    }
    let shown: Vec<String> = losses.iter().map(|(n, l)| format!("{n}={l:.4}")).collect();
    println!(
        "--replay-reference-model {}: {}",
        dir.display(),
        shown.join(",")
    );
    Ok(losses)
}

/// The reference losses against losses computed document by document.
#[cfg(test)]
mod tests {
    use super::*;

    /// The reference losses of a saved model: each old domain's mean loss per
    /// target over its first documents, computed as if each document ran
    /// alone (unpacked, its own log-softmax), the new domain left out.
    #[test]
    fn a_saved_models_reference_losses_are_each_old_domains_loss_per_token() {
        use adabatch::models::llama::{Llama, LlamaConfig, ModelType};
        use candle_core::{DType, Device, Tensor};
        let device = Device::Cpu;
        let mut config = LlamaConfig::new(ModelType::Llama, 16, 8, 16, 1, 2, 1);
        config.tie_word_embeddings = true;
        config.max_position_embeddings = 8;
        let params = adabatch::Parameters::new(7);
        let llama = Llama::new(&config, params.var_builder(DType::F32, &device)).unwrap();
        let dir = std::env::temp_dir().join(format!("mixture-model-losses-{}", std::process::id()));
        let saved = params.named_parameters();
        adabatch::save_pretrained(&saved, None, &dir).unwrap();
        // Documents end with the EOS id (0), as the token files' do.
        let domain = |docs: &[&[u32]]| docs.iter().map(|d| d.to_vec()).collect::<Vec<_>>();
        let en = domain(&[&[3, 4, 5, 0], &[6, 7, 0], &[8, 9, 10, 11, 0]]);
        let python = domain(&[&[12, 13, 0]]);
        let kjv = domain(&[&[1, 2, 0], &[14, 15, 3, 0]]);
        let validation =
            adabatch::Sources::new([("en", en.clone()), ("python", python), ("kjv", kjv.clone())])
                .unwrap();
        // Alone: the summed loss of each next token, over the targets.
        let alone = |docs: &[Vec<u32>]| {
            let (mut sum, mut targets) = (0.0, 0);
            for doc in docs {
                let ids = Tensor::new(&doc[..doc.len() - 1], &device)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let logits = llama.forward(&ids).unwrap().squeeze(0).unwrap();
                let log_p = candle_nn::ops::log_softmax(&logits, 1)
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap();
                for (row, &next) in log_p.iter().zip(&doc[1..]) {
                    sum -= f64::from(row[next as usize]);
                    targets += 1;
                }
            }
            sum / targets as f64
        };
        let collate = PackedCollate::new(8, 0);
        let new = ["python".to_string()];
        let losses = |held_out| {
            model_losses(&dir, &config, (&validation, held_out), &new, &collate).unwrap()
        };
        let check = |got: Vec<(String, f64)>, want: [(&str, f64); 2]| {
            assert_eq!(got.len(), 2, "{got:?}");
            for ((name, loss), (want_name, want_loss)) in got.iter().zip(want) {
                assert_eq!(name, want_name);
                assert!(
                    (loss - want_loss).abs() < 1e-6 * want_loss,
                    "{name}: {loss} against {want_loss}"
                );
            }
        };
        check(losses(None), [("en", alone(&en)), ("kjv", alone(&kjv))]);
        // The held-out set: the first two documents of each domain.
        check(
            losses(Some(2)),
            [("en", alone(&en[..2])), ("kjv", alone(&kjv[..2]))],
        );
        assert_ne!(alone(&en[..2]), alone(&en));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
