//! Hugging Face `config.json` as a model source: the architecture fields of the decoder
//! families whose parameters stepsim's llama-style block (dense or mixture-of-experts) expresses
//! exactly, read by `model_type` as `transformers` reads them (its `configuration_<type>.py`
//! defaults where a key is absent). A key that would change the parameter count, memory or
//! FLOPs in a way the block cannot express is an error naming the key, never a guess.
//!
//! | `model_type` | what differs from Llama | transformers class |
//! |---|---|---|
//! | llama | (Llama 1 to 3.3) | `LlamaConfig` |
//! | mistral | sliding-window attention when `sliding_window` is set | `MistralConfig` |
//! | qwen2 | biases on q, k and v | `Qwen2Config` |
//! | qwen3 | `head_dim`; RMSNorm of each q and k head (`q_norm`, `k_norm`) | `Qwen3Config` |
//! | gemma | `head_dim` (256); tied embeddings; GeGLU (same parameters as SwiGLU) | `GemmaConfig` |
//! | phi3 | fused qkv and gate/up projections (same parameters, split here) | `Phi3Config` |
//! | mixtral | every MLP a mixture of `num_local_experts` (8) experts of `intermediate_size`, top `num_experts_per_tok` (2); sliding window as mistral | `MixtralConfig` |
//! | qwen2_moe | qwen2's q, k, v biases (`qkv_bias`, true); every MLP `num_experts` (60) experts of `moe_intermediate_size` (1408), top `num_experts_per_tok` (4), plus a shared expert of `shared_expert_intermediate_size` (5632) behind a sigmoid gate (one h -> 1 linear); `decoder_sparse_step` 1 and empty `mlp_only_layers` only | `Qwen2MoeConfig` |
//! | qwen3_moe | qwen3's `head_dim` and q/k head norms; every MLP `num_experts` (128) experts of `moe_intermediate_size` (768), top `num_experts_per_tok` (8), no shared expert; `decoder_sparse_step` 1 and empty `mlp_only_layers` only | `Qwen3MoeConfig` |
//!
//! Defaults in parentheses are transformers' where the key is absent. `norm_topk_prob`,
//! `router_aux_loss_coef`, `router_jitter_noise` and `output_router_logits` change neither
//! parameters nor FLOPs and are not read.

use serde_json::{Map, Value};

use super::Family;

/// The architecture a `config.json` describes, in stepsim's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct HfModel {
    pub model_type: String,
    pub family: Family,
    pub n_layers: u64,
    pub hidden: u64,
    pub n_heads: u64,
    pub n_kv_heads: u64,
    pub ffn_hidden: u64,
    pub vocab: u64,
    pub tie_embeddings: bool,
    /// `head_dim` when the config gives one that is not hidden / heads.
    pub head_dim: Option<u64>,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// The context the model was trained for (`max_position_embeddings`).
    pub max_position_embeddings: Option<u64>,
    /// Sliding-window attention's window, where the config turns it on.
    pub sliding_window: Option<u64>,
    /// Mixture-of-experts MLPs, for the MoE model types.
    pub moe: Option<super::MoeConfig>,
}

impl HfModel {
    /// The config as stepsim's model, with no field overridden.
    pub fn model_config(&self, max_seq_len: u64) -> super::ModelConfig {
        super::ModelConfig {
            family: self.family,
            n_layers: self.n_layers,
            hidden: self.hidden,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            ffn_hidden: self.ffn_hidden,
            vocab: self.vocab,
            max_seq_len,
            tie_embeddings: self.tie_embeddings,
            dropout: 0.0,
            embedding_norm: false,
            head_dim_override: self.head_dim,
            qkv_bias: self.qkv_bias,
            qk_norm: self.qk_norm,
            moe: self.moe.clone(),
        }
    }
}

/// The model types this module reads.
pub const SUPPORTED: &[&str] =
    &["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "mixtral", "qwen2_moe", "qwen3_moe"];

/// The mixture-of-experts model types (the rest are dense).
const MOE_TYPES: &[&str] = &["mixtral", "qwen2_moe", "qwen3_moe"];

/// Model types people ask for that are not read, with what the block cannot express.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("deepseek_v2", "multi-head latent attention (DeepSeek's low-rank compressed q and kv) is not modelled yet"),
    ("deepseek_v3", "multi-head latent attention (DeepSeek's low-rank compressed q and kv) is not modelled yet"),
    ("gpt_oss", "attention sinks, alternating sliding-window blocks and biased experts are not modelled yet"),
    ("llama4", "a multimodal wrapper with interleaved dense and MoE blocks and chunked attention is not modelled yet"),
    ("llama4_text", "interleaved dense and MoE blocks and chunked attention are not modelled yet"),
    ("dbrx", "DBRX's clipped fused qkv and ffn_config experts are not read yet"),
    ("jamba", "Mamba (state-space) blocks are not modelled"),
    ("qwen3_next", "gated DeltaNet linear attention and gated attention are not modelled"),
];

/// Keys of the dense types that describe mixture-of-experts layers (the MoE types read them).
const MOE_KEYS: &[&str] = &["num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size"];

/// Keys that describe something the llama-style block cannot express, with why.
const REFUSED: &[(&str, &str)] = &[
    ("n_routed_experts", "DeepSeek-style routed experts are not read (a DeepSeek config is not supported)"),
    ("text_config", "a multimodal wrapper: give the language model's own config.json"),
    (
        "quantization_config",
        "a quantized checkpoint: give the unquantized config (quantized weights are a scenario setting)",
    ),
];

/// Reads a `config.json`'s text. Errors name the key and say what is allowed.
pub fn parse(text: &str) -> Result<HfModel, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(o) = v else { return Err("not a JSON object (a config.json is one)".into()) };
    let model_type = match o.get("model_type") {
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err("key `model_type`: must be a string".into()),
        None => return Err(format!("key `model_type` is missing (one of {})", SUPPORTED.join(", "))),
    };
    if let Some((_, why)) = UNSUPPORTED.iter().find(|(t, _)| *t == model_type) {
        return Err(format!(
            "key `model_type`: \"{model_type}\" is not supported: {why}; supported: {}",
            SUPPORTED.join(", ")
        ));
    }
    if !SUPPORTED.contains(&model_type.as_str()) {
        return Err(format!(
            "key `model_type`: \"{model_type}\" is not supported; supported: {}",
            SUPPORTED.join(", ")
        ));
    }
    let is_moe = MOE_TYPES.contains(&model_type.as_str());
    if !is_moe {
        for key in MOE_KEYS {
            if o.get(*key).is_some_and(|x| !x.is_null()) {
                return Err(format!(
                    "key `{key}`: mixture-of-experts layers in a {model_type} config are not modelled (the MoE model types are {})",
                    MOE_TYPES.join(", ")
                ));
            }
        }
    }
    for (key, why) in REFUSED {
        if o.get(*key).is_some_and(|x| !x.is_null()) {
            return Err(format!("key `{key}`: {why}"));
        }
    }
    let hidden = count(&o, "hidden_size")?;
    let n_heads = count(&o, "num_attention_heads")?;
    let n_kv_heads = opt_count(&o, "num_key_value_heads")?.unwrap_or(n_heads);
    let head_dim = opt_count(&o, "head_dim")?;
    let gemma = model_type == "gemma";
    if gemma && head_dim.is_none() {
        return Err("key `head_dim` is missing (Gemma's heads are not hidden_size / num_attention_heads wide)".into());
    }
    let tie_default = gemma;
    let attention_bias = flag(&o, "attention_bias")?.unwrap_or(false);
    if attention_bias && model_type != "qwen2" {
        return Err(format!(
            "key `attention_bias`: true (biases on q, k, v and o of {model_type}) is not modelled; only false"
        ));
    }
    if flag(&o, "mlp_bias")?.unwrap_or(false) {
        return Err("key `mlp_bias`: true (biases on the MLP projections) is not modelled; only false".into());
    }
    // Sliding-window attention: Mistral's is on whenever `sliding_window` is set; Qwen2's
    // only with `use_sliding_window` (off in every released Qwen2/2.5 config).
    let window = opt_count(&o, "sliding_window")?;
    let sliding_window = match model_type.as_str() {
        "mistral" | "phi3" | "mixtral" => window,
        "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" if flag(&o, "use_sliding_window")?.unwrap_or(false) => window,
        _ => None,
    };
    let qkv_bias = match model_type.as_str() {
        "qwen2" => true,
        // Qwen2MoeConfig's `qkv_bias` (default true; older transformers always had the biases).
        "qwen2_moe" => flag(&o, "qkv_bias")?.unwrap_or(true),
        _ => false,
    };
    let moe = if is_moe { Some(moe_config(&o, &model_type)?) } else { None };
    Ok(HfModel {
        family: Family::Llama,
        n_layers: count(&o, "num_hidden_layers")?,
        hidden,
        n_heads,
        n_kv_heads,
        ffn_hidden: count(&o, "intermediate_size")?,
        vocab: count(&o, "vocab_size")?,
        tie_embeddings: flag(&o, "tie_word_embeddings")?.unwrap_or(tie_default),
        head_dim: head_dim.filter(|&d| d * n_heads != hidden),
        qkv_bias,
        qk_norm: model_type == "qwen3" || model_type == "qwen3_moe",
        max_position_embeddings: opt_count(&o, "max_position_embeddings")?,
        sliding_window,
        moe,
        model_type,
    })
}

/// The mixture-of-experts MLP of a MoE model type, with transformers' defaults.
fn moe_config(o: &Map<String, Value>, model_type: &str) -> Result<super::MoeConfig, String> {
    let (num_experts, top_k, expert_ffn_hidden, shared) = match model_type {
        // MixtralConfig: `num_experts` is an alias of `num_local_experts` (attribute_map).
        "mixtral" => (
            aliased(o, "num_local_experts", "num_experts")?.unwrap_or(8),
            opt_count(o, "num_experts_per_tok")?.unwrap_or(2),
            count(o, "intermediate_size")?,
            0,
        ),
        "qwen2_moe" => (
            opt_count(o, "num_experts")?.unwrap_or(60),
            opt_count(o, "num_experts_per_tok")?.unwrap_or(4),
            opt_count(o, "moe_intermediate_size")?.unwrap_or(1408),
            opt_count(o, "shared_expert_intermediate_size")?.unwrap_or(5632),
        ),
        // Qwen3MoeConfig: recent transformers alias `num_experts` to `num_local_experts`.
        "qwen3_moe" => (
            aliased(o, "num_experts", "num_local_experts")?.unwrap_or(128),
            opt_count(o, "num_experts_per_tok")?.unwrap_or(8),
            opt_count(o, "moe_intermediate_size")?.unwrap_or(768),
            0,
        ),
        _ => unreachable!("moe_config of a dense model type"),
    };
    if top_k > num_experts {
        return Err(format!(
            "key `num_experts_per_tok`: {top_k} experts per token is more than the {num_experts} experts there are"
        ));
    }
    if model_type != "mixtral" {
        // Qwen-MoE: block l's MLP is sparse when l is not in `mlp_only_layers` and
        // (l + 1) % decoder_sparse_step == 0; stepsim's blocks are all alike.
        let step = opt_count(o, "decoder_sparse_step")?.unwrap_or(1);
        if step != 1 {
            return Err(format!(
                "key `decoder_sparse_step`: {step} (a mixture-of-experts MLP only every {step}th block, dense MLPs between) is not modelled; only 1"
            ));
        }
        match o.get("mlp_only_layers") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(Value::Array(_)) => {
                return Err(
                    "key `mlp_only_layers`: dense MLPs in the listed blocks are not modelled; only [] (every block a mixture of experts)".into(),
                )
            }
            Some(v) => return Err(format!("key `mlp_only_layers`: must be a list of block indices, got {v}")),
        }
    }
    Ok(super::MoeConfig {
        num_experts,
        top_k,
        expert_ffn_hidden,
        shared_expert_ffn_hidden: shared,
        shared_expert_gate: model_type == "qwen2_moe",
        first_dense_layers: 0,
    })
}

/// A count under either of two names transformers treats as one (`attribute_map`).
fn aliased(o: &Map<String, Value>, key: &str, alias: &str) -> Result<Option<u64>, String> {
    match (opt_count(o, key)?, opt_count(o, alias)?) {
        (Some(a), Some(b)) if a != b => {
            Err(format!("keys `{key}` ({a}) and `{alias}` ({b}) name the same setting and disagree"))
        }
        (a, b) => Ok(a.or(b)),
    }
}

fn opt_count(o: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("key `{key}`: must be a positive whole number, got {v}")),
        },
    }
}

fn count(o: &Map<String, Value>, key: &str) -> Result<u64, String> {
    opt_count(o, key)?.ok_or_else(|| format!("key `{key}` is missing (a positive whole number)"))
}

fn flag(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(format!("key `{key}`: must be true or false, got {v}")),
    }
}

/// A model of the zoo: its name, where its `config.json` comes from, and the file.
pub struct ZooModel {
    pub name: &'static str,
    pub source: &'static str,
    pub config: &'static str,
}

macro_rules! zoo {
    ($($name:literal => $repo:literal),* $(,)?) => {
        &[$(ZooModel {
            name: $name,
            source: concat!("https://huggingface.co/", $repo, "/blob/main/config.json"),
            config: include_str!(concat!("../../models/", $name, ".json")),
        }),*]
    };
}

/// The shipped model zoo (`models/`): the released `config.json` of each model.
pub const ZOO: &[ZooModel] = zoo! {
    "gemma-7b" => "google/gemma-7b",
    "llama-3.1-8b" => "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b" => "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b" => "meta-llama/Llama-3.1-405B",
    "mistral-7b-v0.1" => "mistralai/Mistral-7B-v0.1",
    "mistral-nemo-12b" => "mistralai/Mistral-Nemo-Base-2407",
    "mixtral-8x7b" => "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b" => "mistralai/Mixtral-8x22B-v0.1",
    "phi-3-mini-4k" => "microsoft/Phi-3-mini-4k-instruct",
    "qwen1.5-moe-a2.7b" => "Qwen/Qwen1.5-MoE-A2.7B",
    "qwen2.5-7b" => "Qwen/Qwen2.5-7B",
    "qwen2.5-72b" => "Qwen/Qwen2.5-72B",
    "qwen3-8b" => "Qwen/Qwen3-8B",
    "qwen3-30b-a3b" => "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b" => "Qwen/Qwen3-235B-A22B",
};

pub fn zoo(name: &str) -> Option<&'static ZooModel> {
    ZOO.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_zoo_config_parses() {
        for m in ZOO {
            let h = parse(m.config).unwrap_or_else(|e| panic!("{}: {e}", m.name));
            assert!(h.n_layers > 0 && h.hidden > 0, "{}", m.name);
        }
    }

    #[test]
    fn refusals_name_the_key() {
        let base = r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100"#;
        let with = |extra: &str| parse(&format!("{base}{extra}}}"));
        assert!(with("").is_ok());
        let e = with(r#", "num_local_experts": 8"#).unwrap_err();
        assert!(e.contains("`num_local_experts`") && e.contains("mixture-of-experts"), "{e}");
        let e = with(r#", "attention_bias": true"#).unwrap_err();
        assert!(e.contains("`attention_bias`"), "{e}");
        let e = with(r#", "hidden_size": 64.5"#).unwrap_err();
        assert!(e.contains("`hidden_size`") && e.contains("whole number"), "{e}");
        let e = parse(r#"{"model_type": "gpt_bigcode"}"#).unwrap_err();
        assert!(e.contains("gpt_bigcode") && e.contains("qwen2"), "{e}");
        let e = parse(r#"{"model_type": "llama", "hidden_size": 64}"#).unwrap_err();
        assert!(e.contains("`num_attention_heads` is missing"), "{e}");
        assert!(parse("[1, 2]").unwrap_err().contains("JSON object"));
    }

    const MOE_BASE: &str = r#""hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 128, "vocab_size": 100"#;

    #[test]
    fn moe_types_read_their_experts_with_transformers_defaults() {
        let with = |t: &str, extra: &str| parse(&format!(r#"{{"model_type": "{t}", {MOE_BASE}{extra}}}"#));
        // Mixtral: 8 experts of intermediate_size, top 2, no shared expert.
        let m = with("mixtral", "").unwrap().moe.unwrap();
        assert_eq!((m.num_experts, m.top_k, m.expert_ffn_hidden, m.shared_expert_ffn_hidden), (8, 2, 128, 0));
        assert_eq!(with("mixtral", r#", "num_experts": 4"#).unwrap().moe.unwrap().num_experts, 4);
        let e = with("mixtral", r#", "num_experts": 4, "num_local_experts": 8"#).unwrap_err();
        assert!(e.contains("`num_local_experts`") && e.contains("`num_experts`"), "{e}");
        // Mixtral's window is on when set, as Mistral's.
        assert_eq!(with("mixtral", r#", "sliding_window": 4096"#).unwrap().sliding_window, Some(4096));
        // Qwen2-MoE: 60 experts of 1408, top 4, a gated 5632-wide shared expert, q/k/v biases.
        let h = with("qwen2_moe", "").unwrap();
        let m = h.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.expert_ffn_hidden), (60, 4, 1408));
        assert_eq!((m.shared_expert_ffn_hidden, m.shared_expert_gate), (5632, true));
        assert!(h.qkv_bias && !h.qk_norm);
        assert!(!with("qwen2_moe", r#", "qkv_bias": false"#).unwrap().qkv_bias);
        // Qwen3-MoE: 128 experts of 768, top 8, no shared expert, q/k head norms.
        let h = with("qwen3_moe", r#", "head_dim": 32"#).unwrap();
        let m = h.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.expert_ffn_hidden, m.shared_expert_ffn_hidden), (128, 8, 768, 0));
        assert!(h.qk_norm && !h.qkv_bias && !m.shared_expert_gate && h.head_dim == Some(32));
        // norm_topk_prob changes no parameter: read as nothing.
        assert!(with("qwen3_moe", r#", "norm_topk_prob": true"#).is_ok());
        // Dense types have no experts.
        assert!(parse(&format!(r#"{{"model_type": "qwen3", {MOE_BASE}}}"#)).unwrap().moe.is_none());
    }

    #[test]
    fn moe_refusals_name_the_key() {
        let with = |t: &str, extra: &str| parse(&format!(r#"{{"model_type": "{t}", {MOE_BASE}{extra}}}"#));
        for t in ["qwen2_moe", "qwen3_moe"] {
            let e = with(t, r#", "decoder_sparse_step": 2"#).unwrap_err();
            assert!(e.contains("`decoder_sparse_step`") && e.contains("only 1"), "{e}");
            assert!(with(t, r#", "decoder_sparse_step": 1, "mlp_only_layers": []"#).is_ok());
            let e = with(t, r#", "mlp_only_layers": [0, 5]"#).unwrap_err();
            assert!(e.contains("`mlp_only_layers`"), "{e}");
        }
        let e = with("mixtral", r#", "num_experts_per_tok": 9"#).unwrap_err();
        assert!(e.contains("`num_experts_per_tok`"), "{e}");
        let e = with("qwen3_moe", r#", "attention_bias": true"#).unwrap_err();
        assert!(e.contains("`attention_bias`"), "{e}");
        // Dense types still refuse expert keys.
        let e = with("qwen3", r#", "num_experts": 8"#).unwrap_err();
        assert!(e.contains("`num_experts`") && e.contains("mixture-of-experts"), "{e}");
        // DeepSeek's attention is refused by name.
        for t in ["deepseek_v3", "deepseek_v2"] {
            let e = with(t, "").unwrap_err();
            assert!(e.contains(t) && e.contains("multi-head latent attention"), "{e}");
        }
        for t in ["gpt_oss", "llama4", "dbrx", "jamba"] {
            let e = with(t, "").unwrap_err();
            assert!(e.contains(t) && e.contains("not supported"), "{e}");
        }
    }
}
