//! Hugging Face `config.json` as a model source: the architecture fields of the dense
//! decoder families whose parameters stepsim's llama-style block expresses exactly, read by
//! `model_type` as `transformers` reads them (its `configuration_<type>.py` defaults where a
//! key is absent). A key that would change the parameter count, memory or FLOPs in a way the
//! block cannot express is an error naming the key, never a guess.
//!
//! | `model_type` | what differs from Llama | transformers class |
//! |---|---|---|
//! | llama | (Llama 1 to 3.3) | `LlamaConfig` |
//! | mistral | sliding-window attention when `sliding_window` is set | `MistralConfig` |
//! | qwen2 | biases on q, k and v | `Qwen2Config` |
//! | qwen3 | `head_dim`; RMSNorm of each q and k head (`q_norm`, `k_norm`) | `Qwen3Config` |
//! | gemma | `head_dim` (256); tied embeddings; GeGLU (same parameters as SwiGLU) | `GemmaConfig` |
//! | phi3 | fused qkv and gate/up projections (same parameters, split here) | `Phi3Config` |

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
pub const SUPPORTED: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"];

/// Keys that describe something the llama-style dense block cannot express, with why.
const REFUSED: &[(&str, &str)] = &[
    ("num_local_experts", "mixture-of-experts layers are not modelled yet"),
    ("num_experts", "mixture-of-experts layers are not modelled yet"),
    ("n_routed_experts", "mixture-of-experts layers are not modelled yet"),
    ("moe_intermediate_size", "mixture-of-experts layers are not modelled yet"),
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
    if !SUPPORTED.contains(&model_type.as_str()) {
        return Err(format!(
            "key `model_type`: \"{model_type}\" is not supported; supported: {}",
            SUPPORTED.join(", ")
        ));
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
        "mistral" | "phi3" => window,
        "qwen2" | "qwen3" if flag(&o, "use_sliding_window")?.unwrap_or(false) => window,
        _ => None,
    };
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
        qkv_bias: model_type == "qwen2",
        qk_norm: model_type == "qwen3",
        max_position_embeddings: opt_count(&o, "max_position_embeddings")?,
        sliding_window,
        moe: None,
        model_type,
    })
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
    "phi-3-mini-4k" => "microsoft/Phi-3-mini-4k-instruct",
    "qwen2.5-7b" => "Qwen/Qwen2.5-7B",
    "qwen2.5-72b" => "Qwen/Qwen2.5-72B",
    "qwen3-8b" => "Qwen/Qwen3-8B",
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
}
