//! The decoder's contract: every weight trains, candle-nn's fused norm would not,
//! grouped-query and tied shapes, the `config.json` round trip, packed documents.

use std::collections::{BTreeSet, HashMap};

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;

use super::*;
use crate::Parameters;
use crate::positions_in_documents;

const VOCAB: usize = 32;

/// A small config of the family: hidden 16, 4 heads of 4, MLP 24, 2 layers.
fn tiny(model_type: ModelType, kv_heads: usize) -> LlamaConfig {
    LlamaConfig::new(model_type, VOCAB, 16, 24, 2, 4, kv_heads)
}

fn build(config: &LlamaConfig, seed: u64) -> Result<(Llama, Parameters)> {
    let params = Parameters::new(seed);
    let model = Llama::new(config, params.var_builder(DType::F32, &Device::Cpu))?;
    Ok((model, params))
}

fn ids(rows: &[&[u32]]) -> Result<Tensor> {
    let t = rows[0].len();
    let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), t), &Device::Cpu)
}

/// Mean next-token cross-entropy of `logits` `[b, t, vocab]` on `ids` `[b, t]`.
fn next_token_loss(logits: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (b, t, v) = logits.dims3()?;
    let inputs = logits.narrow(1, 0, t - 1)?.reshape((b * (t - 1), v))?;
    let targets = ids.narrow(1, 1, t - 1)?.flatten_all()?;
    candle_nn::loss::cross_entropy(&inputs, &targets)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

/// Names of the store's variables whose gradient is missing or all zero.
fn without_gradient(model: &Llama, params: &Parameters) -> Result<BTreeSet<String>> {
    let batch = ids(&[&[1, 5, 9, 2, 7, 3], &[4, 4, 8, 0, 31, 6]])?;
    let grads = next_token_loss(&model.forward(&batch)?, &batch)?.backward()?;
    let mut missing = BTreeSet::new();
    for (name, var) in params.named_parameters() {
        let reached = match grads.get(var.as_tensor()) {
            Some(g) => g.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0,
            None => false,
        };
        if !reached {
            missing.insert(name);
        }
    }
    Ok(missing)
}

#[test]
fn every_parameter_gets_a_gradient() -> Result<()> {
    let mut with_biases = tiny(ModelType::Llama, 4);
    (with_biases.attention_bias, with_biases.mlp_bias) = (true, true);
    let mut tied_gqa = tiny(ModelType::Llama, 2);
    tied_gqa.tie_word_embeddings = true;
    for config in [with_biases, tied_gqa, tiny(ModelType::Qwen2, 1)] {
        let (model, params) = build(&config, 3)?;
        // Every weight, every layer: 2 layers of 2 norms + 7 projections, plus biases.
        let expected = 2 * (2 + 7) + 1 + usize::from(!config.tie_word_embeddings) + 1;
        let biases = 2 * match config.model_type {
            ModelType::Qwen2 => 3,
            _ if config.attention_bias => 7,
            _ => 0,
        };
        assert_eq!(params.named_parameters().len(), expected + biases);
        let missing = without_gradient(&model, &params)?;
        assert!(
            missing.is_empty(),
            "{:?}: no gradient for {missing:?}",
            config.model_type
        );
    }
    Ok(())
}

#[test]
fn candle_nn_norms_train_only_the_head() -> Result<()> {
    // candle-nn's `RmsNorm` calls the fused `ops::rms_norm`, which has no backward:
    // its output is a constant to backprop. The final `model.norm` sits between the
    // whole residual stream and the head, so nothing before it gets a gradient,
    // not even the norm scales; only `lm_head` trains.
    let (model, params) = build(&tiny(ModelType::Llama, 2), 3)?;
    let missing = without_gradient(&model.with_candle_nn_norms(), &params)?;
    let mut all: BTreeSet<String> = params
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(all.remove("lm_head.weight"));
    assert_eq!(missing, all);
    assert!(missing.contains("model.norm.weight"));
    assert!(missing.contains("model.layers.0.input_layernorm.weight"));
    Ok(())
}

#[test]
fn names_shapes_and_initialisation_follow_transformers() -> Result<()> {
    let mut config = tiny(ModelType::Llama, 2);
    config.initializer_range = 0.5;
    let (model, params) = build(&config, 11)?;
    let names: Vec<String> = model.named_tensors().into_iter().map(|(n, _)| n).collect();
    let mut sorted = names.clone();
    sorted.sort();
    let stored: Vec<String> = params
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(sorted, stored);
    assert_eq!(model.named_parameters().len(), names.len());
    let shapes: HashMap<String, Vec<usize>> = model
        .named_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dims().to_vec()))
        .collect();
    // 4 query heads of 4, 2 key/value heads of 4.
    assert_eq!(shapes["model.layers.1.self_attn.q_proj.weight"], [16, 16]);
    assert_eq!(shapes["model.layers.1.self_attn.k_proj.weight"], [8, 16]);
    assert_eq!(shapes["model.layers.1.self_attn.v_proj.weight"], [8, 16]);
    assert_eq!(shapes["model.layers.0.self_attn.o_proj.weight"], [16, 16]);
    assert_eq!(shapes["model.layers.0.mlp.gate_proj.weight"], [24, 16]);
    assert_eq!(shapes["model.layers.0.mlp.down_proj.weight"], [16, 24]);
    assert_eq!(shapes["lm_head.weight"], [VOCAB, 16]);
    let tensors: HashMap<String, Tensor> = model.named_tensors().into_iter().collect();
    let norm = tensors["model.norm.weight"].to_vec1::<f32>()?;
    assert!(norm.iter().all(|&w| w == 1.0));
    let embed = tensors["model.embed_tokens.weight"]
        .flatten_all()?
        .to_vec1::<f32>()?;
    let std = (embed.iter().map(|w| w * w).sum::<f32>() / embed.len() as f32).sqrt();
    assert!((std - 0.5).abs() < 0.05, "embedding std {std}");
    Ok(())
}

/// A `VarBuilder` over copies of `tensors`, with `rename` applied to each entry.
fn builder_from(
    tensors: Vec<(String, Tensor)>,
    rename: impl Fn(&str, &Tensor) -> Result<Vec<(String, Tensor)>>,
) -> Result<VarBuilder<'static>> {
    let mut map = HashMap::new();
    for (name, tensor) in tensors {
        for (name, tensor) in rename(&name, &tensor.copy()?)? {
            map.insert(name, tensor);
        }
    }
    Ok(VarBuilder::from_tensors(map, DType::F32, &Device::Cpu))
}

#[test]
fn grouped_query_attention_is_attention_with_repeated_key_value_heads() -> Result<()> {
    let gqa = tiny(ModelType::Llama, 2);
    let (model, _) = build(&gqa, 5)?;
    let mha = LlamaConfig {
        num_key_value_heads: 4,
        ..gqa.clone()
    };
    // Key/value head j serves query heads 2j and 2j+1: repeat its rows.
    let vb = builder_from(model.named_tensors(), |name, t| {
        if name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight") {
            let heads = t.reshape((2, 1, 4, 16))?.broadcast_as((2, 2, 4, 16))?;
            return Ok(vec![(name.to_string(), heads.reshape((16, 16))?)]);
        }
        Ok(vec![(name.to_string(), t.clone())])
    })?;
    let repeated = Llama::new(&mha, vb)?;
    let batch = ids(&[&[3, 1, 4, 1, 5, 9, 2], &[6, 5, 3, 5, 8, 9, 7]])?;
    let logits = model.forward(&batch)?;
    assert_eq!(logits.dims(), [2, 7, VOCAB]);
    assert!(max_abs_diff(&logits, &repeated.forward(&batch)?)? < 1e-5);
    Ok(())
}

#[test]
fn tied_embeddings_share_the_token_embedding() -> Result<()> {
    let mut tied = tiny(ModelType::Llama, 2);
    tied.tie_word_embeddings = true;
    let (model, params) = build(&tied, 9)?;
    let names: Vec<String> = params
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(!names.iter().any(|n| n.starts_with("lm_head")), "{names:?}");
    // The same weights untied, with lm_head a copy of the embedding.
    let vb = builder_from(model.named_tensors(), |name, t| {
        let mut out = vec![(name.to_string(), t.clone())];
        if name == "model.embed_tokens.weight" {
            out.push(("lm_head.weight".to_string(), t.clone()));
        }
        Ok(out)
    })?;
    let untied = Llama::new(
        &LlamaConfig {
            tie_word_embeddings: false,
            ..tied
        },
        vb,
    )?;
    let batch = ids(&[&[0, 7, 7, 3, 12]])?;
    assert!(max_abs_diff(&model.forward(&batch)?, &untied.forward(&batch)?)? < 1e-6);
    Ok(())
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("adabatch-llama-{name}-{}", std::process::id()))
}

#[test]
fn config_json_round_trips() -> std::result::Result<(), ConfigError> {
    let mut mistral = tiny(ModelType::Mistral, 2);
    mistral.sliding_window = Some(3);
    mistral.eos_token_id = Some(TokenIds::Many(vec![2, 7]));
    mistral
        .extra
        .insert("use_cache".to_string(), serde_json::json!(true));
    let windowless = LlamaConfig {
        sliding_window: None,
        ..tiny(ModelType::Mistral, 1)
    };
    for config in [
        tiny(ModelType::Llama, 4),
        tiny(ModelType::Qwen2, 2),
        mistral,
        windowless,
    ] {
        let text = config.to_json_string()?;
        assert_eq!(LlamaConfig::from_json_str(&text)?, config, "{text}");
        let dir = temp_dir("round-trip");
        let path = config.save(&dir)?;
        assert_eq!(path, dir.join("config.json"));
        assert_eq!(LlamaConfig::from_file(&path)?, config);
        std::fs::remove_dir_all(&dir).ok();
    }
    Ok(())
}

#[test]
fn config_json_takes_transformers_defaults_and_forms() -> std::result::Result<(), ConfigError> {
    // transformers 5 writes rope_parameters and dtype; head_dim and the key/value
    // heads default from the other sizes; unknown keys are kept.
    let json = r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "dtype": "bfloat16", "eos_token_id": [1, 2], "pad_token_id": null}"#;
    let config = LlamaConfig::from_json_str(json)?;
    assert_eq!(config.num_key_value_heads, 8);
    assert_eq!(config.head_dim, 8);
    assert_eq!(config.rope_theta, 500_000.0);
    assert_eq!(config.architectures, ["LlamaForCausalLM"]);
    assert_eq!(config.torch_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(config.eos_token_id, Some(TokenIds::Many(vec![1, 2])));
    assert!(config.extra.contains_key("pad_token_id"));
    assert_eq!(config.max_position_embeddings, 2048);
    let qwen2 = r#"{"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}"#;
    let qwen2 = LlamaConfig::from_json_str(qwen2)?;
    assert!(qwen2.qkv_bias() && !qwen2.o_bias() && !qwen2.mlp_bias);
    Ok(())
}

#[test]
fn invalid_configs_are_clear_errors() {
    let base = serde_json::to_value(tiny(ModelType::Llama, 2)).expect("serialise");
    let cases = [
        (
            ("num_attention_heads", serde_json::json!(3)),
            "3 heads do not divide hidden_size 16",
        ),
        (
            ("num_key_value_heads", serde_json::json!(3)),
            "3 key/value heads do not divide the 4",
        ),
        (
            ("hidden_act", serde_json::json!("gelu")),
            "`gelu` is not supported",
        ),
        (
            ("head_dim", serde_json::json!(5)),
            "head_dim: 5 is not a positive even number",
        ),
        (
            ("vocab_size", serde_json::json!(0)),
            "vocab_size: must be at least 1",
        ),
        (
            (
                "rope_scaling",
                serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            ),
            "rope type `llama3` is not supported",
        ),
        (
            ("model_type", serde_json::json!("gpt2")),
            "unknown variant `gpt2`",
        ),
    ];
    for ((key, value), message) in cases {
        let mut json = base.clone();
        json[key] = value;
        let err = LlamaConfig::from_json_str(&json.to_string()).unwrap_err();
        // The message, or its source (a JSON error is the source, not repeated).
        let text = match std::error::Error::source(&err) {
            Some(source) => format!("{err}: {source}"),
            None => err.to_string(),
        };
        assert!(text.contains(message), "{key}: {text}");
    }
    let mut qwen2 = tiny(ModelType::Qwen2, 2);
    qwen2.attention_bias = false;
    let err = qwen2.validate().unwrap_err().to_string();
    assert!(
        err.contains("Qwen2's q/k/v projections always have biases"),
        "{err}"
    );
    let mut mistral = tiny(ModelType::Mistral, 2);
    mistral.mlp_bias = true;
    let err = Llama::new(
        &mistral,
        Parameters::new(0).var_builder(DType::F32, &Device::Cpu),
    );
    assert!(
        err.unwrap_err()
            .to_string()
            .contains("mlp_bias: Mistral has no biases")
    );
}

/// Logits of row 0, tokens `range`.
fn slice(logits: &Tensor, range: std::ops::Range<usize>) -> Result<Tensor> {
    logits.get(0)?.narrow(0, range.start, range.len())
}

#[test]
fn packed_documents_do_not_see_each_other() -> Result<()> {
    let (model, _) = build(&tiny(ModelType::Llama, 2), 21)?;
    let documents = ids(&[&[4, 4, 4, 9, 9, 9, 9]])?;
    let packed = |tokens: &[u32]| model.forward_packed(&ids(&[tokens])?, None, Some(&documents));
    let a = packed(&[1, 2, 3, 10, 11, 12, 13])?;
    let b = packed(&[1, 30, 3, 10, 11, 12, 13])?;
    // Changing a token of the first document changes its own later logits ...
    assert!(max_abs_diff(&slice(&a, 1..3)?, &slice(&b, 1..3)?)? > 1e-4);
    // ... and nothing of the second.
    assert_eq!(max_abs_diff(&slice(&a, 3..7)?, &slice(&b, 3..7)?)?, 0.0);
    // Positions restart: the second document computes what it computes alone.
    let alone = model.forward(&ids(&[&[10, 11, 12, 13]])?)?;
    assert!(max_abs_diff(&slice(&a, 3..7)?, &slice(&alone, 0..4)?)? < 1e-5);
    // Without documents the first document leaks into the second.
    let plain = |tokens: &[u32]| model.forward(&ids(&[tokens])?);
    let leak = max_abs_diff(
        &slice(&plain(&[1, 2, 3, 10, 11, 12, 13])?, 3..7)?,
        &slice(&plain(&[1, 30, 3, 10, 11, 12, 13])?, 3..7)?,
    )?;
    assert!(leak > 1e-4);
    Ok(())
}

#[test]
fn explicit_positions_equal_restarting_ones_and_rows_are_independent() -> Result<()> {
    let (model, _) = build(&tiny(ModelType::Qwen2, 2), 8)?;
    let tokens = ids(&[&[5, 6, 7, 8, 9], &[9, 8, 7, 6, 5]])?;
    let documents = ids(&[&[0, 0, 1, 1, 1], &[3, 3, 3, 3, 3]])?;
    let positions = positions_in_documents(&documents)?;
    assert_eq!(
        positions.to_vec2::<u32>()?,
        [[0, 1, 0, 1, 2], [0, 1, 2, 3, 4]]
    );
    let derived = model.forward_packed(&tokens, None, Some(&documents))?;
    let explicit = model.forward_packed(&tokens, Some(&positions), Some(&documents))?;
    assert_eq!(max_abs_diff(&derived, &explicit)?, 0.0);
    // The second row is one document: the plain forward of that row alone.
    let alone = model.forward(&ids(&[&[9, 8, 7, 6, 5]])?)?;
    assert!(max_abs_diff(&derived.get(1)?, &alone.get(0)?)? < 1e-5);
    // Rope encodes relative positions: shifting them all changes nothing, spreading
    // them does.
    let positions = positions.to_dtype(DType::I64)?;
    let shifted = model.forward_packed(&tokens, Some(&(&positions + 3.0)?), Some(&documents))?;
    assert!(max_abs_diff(&derived, &shifted)? < 1e-5);
    let spread = model.forward_packed(&tokens, Some(&(&positions * 2.0)?), Some(&documents))?;
    assert!(max_abs_diff(&derived, &spread)? > 1e-4);
    Ok(())
}

#[test]
fn a_sliding_window_hides_older_tokens() -> Result<()> {
    let mut config = tiny(ModelType::Mistral, 2);
    config.sliding_window = Some(2);
    config.num_hidden_layers = 1;
    let (model, _) = build(&config, 13)?;
    let a = model.forward(&ids(&[&[1, 2, 3, 4, 5]])?)?;
    let b = model.forward(&ids(&[&[7, 2, 3, 4, 5]])?)?;
    // One layer with a window of 2: token 0 reaches positions 0 and 1 only.
    assert!(max_abs_diff(&slice(&a, 1..2)?, &slice(&b, 1..2)?)? > 1e-4);
    assert_eq!(max_abs_diff(&slice(&a, 2..5)?, &slice(&b, 2..5)?)?, 0.0);
    assert_eq!(a.dims(), [1, 5, VOCAB]);
    Ok(())
}

#[test]
fn under_bf16_autocast_the_decoder_follows_f32_and_every_weight_gets_an_f32_gradient() -> Result<()>
{
    let (model, params) = build(&tiny(ModelType::Llama, 2), 5)?;
    let batch = ids(&[&[1, 5, 9, 2, 7, 3], &[4, 4, 8, 0, 31, 6]])?;
    let documents = ids(&[&[0, 0, 0, 1, 1, 1], &[0, 0, 0, 0, 0, 0]])?;
    let full = model.forward_packed(&batch, None, Some(&documents))?;
    let scope = crate::AutocastScope::enter(Some(DType::BF16));
    let half = model.forward_packed(&batch, None, Some(&documents))?;
    assert!(scope.casts() > 0, "the decoder casts");
    let loss = next_token_loss(&half, &batch)?;
    let grads = loss.backward()?;
    drop(scope);
    assert_eq!(half.dtype(), DType::F32);
    // bf16 keeps 8 bits of mantissa: close to f32, but not equal (it did compute in bf16).
    let diff = max_abs_diff(&full, &half)?;
    assert!(diff > 0.0 && diff < 0.05, "{diff}");
    for (name, var) in params.named_parameters() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient"));
        assert_eq!(g.dtype(), DType::F32, "{name}");
        assert!(
            g.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0,
            "{name}: zero gradient"
        );
    }
    // Outside the scope the model computes in f32 again, bit for bit.
    let again = model.forward_packed(&batch, None, Some(&documents))?;
    assert_eq!(max_abs_diff(&full, &again)?, 0.0);
    Ok(())
}

thread_local! {
    /// Runs this test thread's Llama attention as the fused op on CPU too (see
    /// `attention::fused_attention`): the comparison and the measurement below.
    pub(super) static FUSED_ON_CPU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f()` with the attention fused (`true`) or the composite, on CPU.
fn with_attention<R>(fused: bool, f: impl FnOnce() -> R) -> R {
    FUSED_ON_CPU.set(fused);
    let out = f();
    FUSED_ON_CPU.set(false);
    out
}

/// The logits and every weight's gradient (by name) of a packed batch.
fn logits_and_grads(model: &Llama, params: &Parameters) -> Result<(Tensor, Vec<(String, Tensor)>)> {
    let batch = ids(&[&[1, 5, 9, 2, 7, 3, 8], &[4, 4, 8, 0, 31, 6, 2]])?;
    let documents = ids(&[&[0, 0, 0, 1, 2, 2, 2], &[5; 7]])?;
    let logits = model.forward_packed(&batch, None, Some(&documents))?;
    let grads = next_token_loss(&logits, &batch)?.backward()?;
    let grads = params
        .named_parameters()
        .into_iter()
        .map(|(name, var)| {
            let grad = grads.get(var.as_tensor()).expect("a gradient").clone();
            (name, grad)
        })
        .collect();
    Ok((logits, grads))
}

#[test]
fn fused_attention_computes_what_the_composite_does() -> Result<()> {
    let mut windowed = tiny(ModelType::Mistral, 2);
    windowed.sliding_window = Some(3);
    for (i, config) in [
        tiny(ModelType::Llama, 2),
        tiny(ModelType::Llama, 4),
        windowed,
    ]
    .iter()
    .enumerate()
    {
        let (model, params) = build(config, 17 + i as u64)?;
        let (want, want_grads) = with_attention(false, || logits_and_grads(&model, &params))?;
        let (got, got_grads) = with_attention(true, || logits_and_grads(&model, &params))?;
        // Another summation order: close, and not the same bits (the fused op ran).
        let diff = max_abs_diff(&got, &want)?;
        assert!(
            diff > 0.0 && diff < 1e-5,
            "config {i}: logits differ by {diff}"
        );
        for ((name, got), (_, want)) in got_grads.iter().zip(&want_grads) {
            let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
            let diff = max_abs_diff(got, want)?;
            assert!(
                diff <= 1e-4 * scale,
                "config {i}: {name}: {diff} of {scale}"
            );
        }
        // Under bf16 autocast both compute their scores and softmax in f32.
        let half = |fused| {
            with_attention(fused, || {
                let _scope = crate::AutocastScope::enter(Some(DType::BF16));
                logits_and_grads(&model, &params)
            })
        };
        let diff = max_abs_diff(&half(true)?.0, &half(false)?.0)?;
        assert!(diff < 0.05, "config {i}: bf16 logits differ by {diff}");
    }
    Ok(())
}

/// The CPU measurement behind `attention::fused_attention`: forward + backward of
/// one layer's attention alone and a model step (forward, loss, backward), fused
/// and composite, paired medians. Shapes: the example decoder
/// (`examples/language_model.rs`: rows of 128 packing documents of about 35
/// tokens, hidden 128, 4 heads of 32 over 2 key/value heads, 4 layers, MLP 384,
/// 4,096 tokens) at 8 and 32 rows, and `benches/llama_compare.rs`'s two models (8
/// rows of 64, no documents).
///
/// ```text
/// cargo test -p adabatch-nn --release --lib -- --ignored --nocapture cpu_attention_speed
/// ```
#[test]
#[ignore = "a measurement, not a check"]
fn cpu_attention_speed() -> Result<()> {
    let mut example = LlamaConfig::new(ModelType::Llama, 4096, 128, 384, 4, 4, 2);
    example.tie_word_embeddings = true;
    let mha = LlamaConfig::new(ModelType::Llama, 256, 128, 352, 4, 4, 4);
    let mut gqa = LlamaConfig::new(ModelType::Llama, 256, 128, 352, 4, 8, 2);
    gqa.tie_word_embeddings = true;
    let cases = [
        ("example", &example, 8, 128, true),
        ("example", &example, 32, 128, true),
        ("llama_mha", &mha, 8, 64, false),
        ("llama_gqa_tied", &gqa, 8, 64, false),
    ];
    for (name, config, b, t, packed) in cases {
        let documents = packed_documents(b, t)?;
        let documents = packed.then_some(&documents);
        let (model, _) = build(config, 1)?;
        let alone = attention_alone(config, b, t, documents)?;
        let tokens = (0..b * t).map(|i| (i * 37 % config.vocab_size) as u32);
        let tokens = Tensor::from_iter(tokens, &Device::Cpu)?.reshape((b, t))?;
        let step = paired_ms(|fused| {
            with_attention(fused, || -> Result<()> {
                let logits = model.forward_packed(&tokens, None, documents)?;
                next_token_loss(&logits, &tokens)?.backward()?;
                Ok(())
            })
        })?;
        println!(
            "{name} {b}x{t}: attention fwd+bwd composite {:.2} ms, fused {:.2} ms; \
             model step composite {:.2} ms, fused {:.2} ms",
            alone.0, alone.1, step.0, step.1
        );
    }
    Ok(())
}

/// Document ids `[b, t]`: runs of 20 to 50 tokens, as the example's packing gives.
fn packed_documents(b: usize, t: usize) -> Result<Tensor> {
    let mut ids = Vec::with_capacity(b * t);
    for row in 0..b {
        let (mut id, mut left) = (0u32, 0usize);
        for i in 0..t {
            if left == 0 {
                id += 1;
                left = 20 + (row * 7 + i * 13) % 31;
            }
            ids.push(id);
            left -= 1;
        }
    }
    Tensor::from_vec(ids, (b, t), &Device::Cpu)
}

/// One layer's attention of `config` alone, forward + backward of `Σ y·w`, in ms:
/// the composite (its bias built once, outside the timing, as the Llama's frame
/// does) and the fused op.
fn attention_alone(
    config: &LlamaConfig,
    b: usize,
    t: usize,
    documents: Option<&Tensor>,
) -> Result<(f64, f64)> {
    let (kv, d) = (config.num_key_value_heads, config.head_dim);
    let g = config.num_attention_heads / kv;
    let var =
        |dims: (usize, usize, usize, usize)| candle_core::Var::randn(0f32, 1.0, dims, &Device::Cpu);
    let (q, k, v) = (
        var((kv, b, g * t, d))?,
        var((kv, b, t, d))?,
        var((kv, b, t, d))?,
    );
    let w = Tensor::randn(0f32, 1.0, (kv, b, g * t, d), &Device::Cpu)?;
    let bias = crate::attention_bias(t, documents, None, DType::F32, &Device::Cpu)?;
    let bias = crate::attention::tiled(&bias, g)?;
    let scale = (d as f64).powf(-0.5);
    paired_ms(|fused| {
        let y = match fused {
            true => crate::packed_attention(&q, &k, &v, documents, None, scale)?,
            false => crate::attention::composite(&q, &k, &v, &bias, scale)?,
        };
        (y * &w)?.sum_all()?.backward().map(drop)
    })
}

/// The median times of `f(false)` and `f(true)` over 15 rounds each, interleaved
/// (a loaded machine slows both alike), after a warm-up of each, in ms.
fn paired_ms(f: impl Fn(bool) -> Result<()>) -> Result<(f64, f64)> {
    let rounds = 15;
    f(false)?;
    f(true)?;
    let mut times = [Vec::with_capacity(rounds), Vec::with_capacity(rounds)];
    for _ in 0..rounds {
        for fused in [false, true] {
            let started = std::time::Instant::now();
            f(fused)?;
            times[usize::from(fused)].push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let [composite, fused] = times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[rounds / 2]
    });
    Ok((composite, fused))
}
