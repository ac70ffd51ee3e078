//! Hugging Face `config.json` as a model source: the architecture fields of the decoder
//! families whose parameters stepsim's llama-style block (dense or mixture-of-experts) expresses
//! exactly, read by `model_type` as `transformers` reads them (its `configuration_<type>.py`
//! defaults where a key is absent). A key that would change the parameter count, memory or
//! FLOPs in a way the block cannot express is an error naming the key, never a guess.
//!
//! | `model_type` | what differs from Llama | transformers class |
//! |---|---|---|
//! | llama | (Llama 1 to 3.3) | `LlamaConfig` |
//! | gpt2 | stepsim's gpt family: LayerNorm, GELU MLP of `n_inner` (4 x `n_embd`), biases everywhere, a learned position table of `n_positions` (1024) rows, tied embeddings; `n_embd` (768), `n_layer` (12), `n_head` (12), `vocab_size` (50257); dropout `resid_pdrop` (0.1) | `GPT2Config` |
//! | gpt_neox | the gpt block with rotary positions on `rotary_pct` (0.25; `partial_rotary_factor` in newer files) of each head instead of a table, the MLP beside attention (`use_parallel_residual`, true), untied embeddings; `hidden_dropout` (0); GPT-NeoX-20B's sizes by default; `attention_bias` true only | `GPTNeoXConfig` |
//! | mistral | sliding-window attention in every block when `sliding_window` is set | `MistralConfig` |
//! | olmo | norms without weights or biases (`OlmoLayerNorm`); `clip_qkv`'s in-place clamps are not charged | `OlmoConfig` |
//! | olmo2 | RMSNorms after attention and the MLP inside the residual (none before); `q_norm` / `k_norm` over all heads together | `Olmo2Config` |
//! | gemma2 | `head_dim` (256); four RMSNorms per block; `attn_logit_softcapping` (50) and `final_logit_softcapping` (30), null turns them off; `sliding_window` (4096) in every even block | `Gemma2Config` |
//! | gemma3_text | Gemma 2's block with q/k head norms and no soft-capping by default; `sliding_window` (4096) in all blocks but every `sliding_window_pattern`th (6) | `Gemma3TextConfig` |
//! | qwen2 | biases on q, k and v | `Qwen2Config` |
//! | qwen3 | `head_dim`; RMSNorm of each q and k head (`q_norm`, `k_norm`) | `Qwen3Config` |
//! | gemma | `head_dim` (256); tied embeddings; GeGLU (same parameters as SwiGLU) | `GemmaConfig` |
//! | phi3 | fused qkv and gate/up projections (same parameters, split here) | `Phi3Config` |
//! | mixtral | every MLP a mixture of `num_local_experts` (8) experts of `intermediate_size`, top `num_experts_per_tok` (2); sliding window as mistral | `MixtralConfig` |
//! | qwen2_moe | qwen2's q, k, v biases (`qkv_bias`, true); every MLP `num_experts` (60) experts of `moe_intermediate_size` (1408), top `num_experts_per_tok` (4), plus a shared expert of `shared_expert_intermediate_size` (5632) behind a sigmoid gate (one h -> 1 linear); the MLP of block l sparse when (l + 1) % `decoder_sparse_step` (1) == 0 and l is not in `mlp_only_layers`, dense of `intermediate_size` otherwise | `Qwen2MoeConfig` |
//! | qwen3_moe | qwen3's `head_dim` and q/k head norms; every MLP `num_experts` (128) experts of `moe_intermediate_size` (768), top `num_experts_per_tok` (8), no shared expert; `decoder_sparse_step` and `mlp_only_layers` as qwen2_moe | `Qwen3MoeConfig` |
//! | deepseek_v3 | multi-head latent attention in place of q, k, v: `q_lora_rank` (1536; null: a direct q projection), `kv_lora_rank` (512), per head `qk_nope_head_dim` (128) + `qk_rope_head_dim` (64) query/key and `v_head_dim` (128) value, `num_key_value_heads` = `num_attention_heads` only; the first `first_k_dense_replace` (3) MLPs dense of `intermediate_size`, the rest `n_routed_experts` (256) experts of `moe_intermediate_size` (2048), top `num_experts_per_tok` (8), plus `n_shared_experts` (1) x `moe_intermediate_size` of shared expert, ungated; past the dense blocks, block l sparse when l % `moe_layer_freq` (1) == 0, as DeepSeek's own modelling code reads it | `DeepseekV3Config` |
//! | gpt_oss | `head_dim` (64); `attention_bias` (true: q, k, v and o); one attention-sink logit per head; every MLP `num_local_experts` (128) experts of `intermediate_size` (2880) with biases on the router and the experts, top `num_experts_per_tok` (4; `experts_per_token` alike); `sliding_window` (128) in every even block; `swiglu_limit`'s clamps and YaRN change no parameter | `GptOssConfig` |
//! | llama4_text | (the language model of a `llama4` config: its `text_config`) `head_dim` (128); MoE blocks of `num_local_experts` (16) experts of `intermediate_size` (8192), top `num_experts_per_tok` (1), plus one shared expert of the same width, every `interleave_moe_layer_step`th block (1) or the `moe_layers` listed, the other blocks dense of `intermediate_size_mlp` (16384); chunked attention over `attention_chunk_size` (8192; null: none) in the rotary blocks, global in the NoPE ones (`no_rope_layers`, default every `no_rope_layer_interval`th, 4); `use_qk_norm`'s L2 norm and the attention temperature have no parameters | `Llama4TextConfig` |
//! | deepseek_v2 | as deepseek_v3, with its own defaults: `first_k_dense_replace` (0), `n_routed_experts` (64), `moe_intermediate_size` (1407), `n_shared_experts` (2); `num_experts_per_tok` required (no default) | `DeepseekV2Config` |
//!
//! An explicit `layer_types` list (newer transformers write one) decides which blocks are local
//! where it is given; Qwen2/3 with `use_sliding_window` are local from `max_window_layers` (28).
//!
//! Defaults in parentheses are transformers' where the key is absent. `norm_topk_prob`,
//! `router_aux_loss_coef` and `router_jitter_noise` change neither parameters nor FLOPs and
//! are not read. `output_router_logits` (false) is read for mixtral, qwen2_moe, qwen3_moe and
//! gpt_oss, whose `*ForCausalLM` then computes the load-balancing loss after the language
//! model's: it is the default of `[moe] aux_loss` under Hugging Face model code
//! (`HfModel::output_router_logits`). Not read are DeepSeek's scoring settings
//! (`scoring_func`, `routed_scaling_factor`, `aux_loss_alpha`, `seq_aux`) or its YaRN
//! `rope_scaling` (no parameters). Its group-limited routing is read (`n_group`,
//! `topk_group`: V3 always, V2 with `topk_method = "group_limited_greedy"`): it decides which
//! nodes a token's copies reach ([`super::MoeConfig::router_groups`]).
//!
//! DeepSeek counts: the count is of transformers' `DeepseekV3ForCausalLM` (and V2's), which
//! builds no multi-token-prediction module for `num_nextn_predict_layers`, so the count
//! excludes MTP (DeepSeek-V3's released checkpoint, 685B, adds its 14B MTP module to the
//! 671B). The key is read (`HfModel::nextn_predict_layers`) and reported, not trained:
//! training the modules is Megatron-Core's `--mtp-num-layers`, off unless given, which a
//! scenario asks for with `[model.mtp] layers`. The router's `e_score_correction_bias` (one float per routed expert in each MoE
//! block, 256 for DeepSeek-V3) is a buffer updated by DeepSeek's balancing rule, not by
//! gradients, and is not counted.

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
    /// Sliding-window attention, where the config turns it on, and in which blocks.
    pub sliding_window: Option<super::SlidingWindow>,
    /// Where the block departs from its family's (GPT-NeoX, OLMo, OLMo 2, Gemma 2/3).
    pub style: super::BlockStyle,
    /// Mixture-of-experts MLPs, for the MoE model types.
    pub moe: Option<super::MoeConfig>,
    /// Multi-head latent attention, for the DeepSeek types.
    pub mla: Option<super::MlaConfig>,
    /// Dropout in training (GPT-2's `resid_pdrop`; 0 for the types whose configs set none).
    pub dropout: f64,
    /// DeepSeek-V3's `num_nextn_predict_layers` (0 where the key is absent, and for other
    /// types): the multi-token prediction modules its checkpoint holds. Reported, not
    /// trained: transformers builds no module for it, and Megatron-Core trains them only under
    /// `--mtp-num-layers` (`[model.mtp] layers`).
    pub nextn_predict_layers: u64,
    /// `output_router_logits` of the MoE types whose `*ForCausalLM` then adds the
    /// load-balancing loss (`load_balancing_loss_func`: mixtral, qwen2_moe, qwen3_moe, gpt_oss;
    /// their configs default to false): the training default of `[moe] aux_loss` for Hugging
    /// Face model code ([`super::AuxLoss::AllBlocks`]). False for every other type.
    pub output_router_logits: bool,
}

impl HfModel {
    /// The position table's rows a config fixes, where they are parameters (GPT-2's
    /// `n_positions`; rotary models have no table): the model's `max_seq_len` unless the
    /// scenario sets one.
    pub fn position_table(&self) -> Option<u64> {
        (self.family == Family::Gpt && self.style.rotary_dims.is_none())
            .then_some(self.max_position_embeddings)
            .flatten()
    }

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
            dropout: self.dropout,
            embedding_norm: false,
            head_dim_override: self.head_dim,
            qkv_bias: self.qkv_bias,
            qk_norm: self.qk_norm,
            moe: self.moe.clone(),
            mla: self.mla.clone(),
            style: self.style.clone(),
            sliding_window: self.sliding_window.clone(),
            // The config's MTP modules are not trained by default (see `nextn_predict_layers`).
            mtp: None,
        }
    }
}

/// The model types this module reads.
pub const SUPPORTED: &[&str] = &[
    "gpt2",
    "gpt_neox",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo",
    "olmo2",
    "phi3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "llama4_text",
];

/// The mixture-of-experts model types (the rest are dense).
const MOE_TYPES: &[&str] =
    &["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4_text"];

/// The types whose `attention_bias` puts biases on q, k, v and o (their attention classes
/// build all four projections with `bias=config.attention_bias`).
const FOUR_BIASES: &[&str] =
    &["llama", "qwen3", "qwen3_moe", "olmo", "olmo2", "gemma", "gemma2", "gemma3_text", "gpt_oss"];

/// The model types with DeepSeek's multi-head latent attention (and its MoE keys).
const DEEPSEEK_TYPES: &[&str] = &["deepseek_v2", "deepseek_v3"];

/// Model types people ask for that are not read, with what the block cannot express.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("gemma3", "a multimodal wrapper (a SigLIP vision tower beside the language model): give its text_config as a config.json of its own (model_type gemma3_text)"),
    ("llama4", "a multimodal wrapper (a vision encoder beside the language model): give its text_config as a config.json of its own (model_type llama4_text)"),
    ("dbrx", "DBRX's clipped fused qkv and ffn_config experts are not read yet"),
    ("jamba", "Mamba (state-space) blocks are not modelled"),
    ("qwen3_next", "gated DeltaNet linear attention and gated attention are not modelled"),
];

/// Keys of the dense types that describe mixture-of-experts layers (the MoE types read them).
const MOE_KEYS: &[&str] = &["num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size"];

/// Keys that describe something the llama-style block cannot express, with why.
const REFUSED: &[(&str, &str)] = &[
    ("n_routed_experts", "DeepSeek-style routed experts are read in deepseek_v2 and deepseek_v3 configs only"),
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
    match model_type.as_str() {
        "gpt2" => return gpt2(&o),
        "gpt_neox" => return gpt_neox(&o),
        _ => {}
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
    let deepseek = DEEPSEEK_TYPES.contains(&model_type.as_str());
    for (key, why) in REFUSED {
        if deepseek && *key == "n_routed_experts" {
            continue;
        }
        if o.get(*key).is_some_and(|x| !x.is_null()) {
            return Err(format!("key `{key}`: {why}"));
        }
    }
    let hidden = count(&o, "hidden_size")?;
    let n_heads = count(&o, "num_attention_heads")?;
    let n_kv_heads = opt_count(&o, "num_key_value_heads")?.unwrap_or(n_heads);
    if deepseek && n_kv_heads != n_heads {
        return Err(format!(
            "key `num_key_value_heads`: {n_kv_heads} differs from num_attention_heads ({n_heads}); multi-head latent attention has a key and a value per query head, so only {n_heads}"
        ));
    }
    // DeepSeek's widths are in the MLA keys (transformers sets its `head_dim` to
    // `qk_rope_head_dim`, whatever the file says).
    let head_dim = if deepseek { None } else { opt_count(&o, "head_dim")? };
    let gemma = model_type.starts_with("gemma");
    // Gemma2Config and Gemma3TextConfig default head_dim to 256; GemmaConfig's released files
    // all give it.
    let head_dim = match model_type.as_str() {
        "gemma2" | "gemma3_text" => Some(head_dim.unwrap_or(256)),
        "gpt_oss" => Some(head_dim.unwrap_or(64)),
        "llama4_text" => Some(head_dim.unwrap_or(128)),
        _ => head_dim,
    };
    if gemma && head_dim.is_none() {
        return Err("key `head_dim` is missing (Gemma's heads are not hidden_size / num_attention_heads wide)".into());
    }
    if flag(&o, "use_bidirectional_attention")?.unwrap_or(false) {
        return Err("key `use_bidirectional_attention`: true (an encoder's attention, EmbeddingGemma) is not modelled; only false (causal)".into());
    }
    let tie_default = gemma;
    // GptOssConfig's default is true; the others' false.
    let attention_bias = flag(&o, "attention_bias")?.unwrap_or(model_type == "gpt_oss");
    if attention_bias && deepseek {
        return Err(format!(
            "key `attention_bias`: true (biases on q_a_proj, kv_a_proj_with_mqa and o_proj of {model_type}) is not modelled; only false"
        ));
    }
    let four_biases = attention_bias && FOUR_BIASES.contains(&model_type.as_str());
    if attention_bias && !four_biases && model_type != "qwen2" {
        return Err(format!(
            "key `attention_bias`: true (biases on the attention projections of {model_type}) is not modelled; only false"
        ));
    }
    if flag(&o, "mlp_bias")?.unwrap_or(false) {
        return Err("key `mlp_bias`: true (biases on the MLP projections) is not modelled; only false".into());
    }
    let n_layers = count(&o, "num_hidden_layers")?;
    let sliding_window = sliding_window(&o, &model_type, n_layers)?;
    let qkv_bias = match model_type.as_str() {
        "qwen2" => true,
        // Qwen2MoeConfig's `qkv_bias` (default true; older transformers always had the biases).
        "qwen2_moe" => flag(&o, "qkv_bias")?.unwrap_or(true),
        _ => four_biases,
    };
    let moe = if is_moe { Some(moe_config(&o, &model_type, n_layers)?) } else { None };
    let mla = if deepseek { Some(mla_config(&o)?) } else { None };
    Ok(HfModel {
        family: Family::Llama,
        n_layers,
        hidden,
        n_heads,
        n_kv_heads,
        // Llama 4's dense blocks use `intermediate_size_mlp`; its experts `intermediate_size`.
        ffn_hidden: if model_type == "llama4_text" {
            opt_count(&o, "intermediate_size_mlp")?.unwrap_or(16384)
        } else {
            count(&o, "intermediate_size")?
        },
        vocab: count(&o, "vocab_size")?,
        tie_embeddings: flag(&o, "tie_word_embeddings")?.unwrap_or(tie_default),
        head_dim: head_dim.filter(|&d| d * n_heads != hidden),
        qkv_bias,
        qk_norm: matches!(model_type.as_str(), "qwen3" | "qwen3_moe" | "gemma3_text" | "olmo2"),
        max_position_embeddings: opt_count(&o, "max_position_embeddings")?,
        sliding_window,
        style: super::BlockStyle { o_bias: four_biases, ..block_style(&o, &model_type)? },
        moe,
        mla,
        nextn_predict_layers: match model_type.as_str() {
            // DeepSeek-V3's own config.json gives 1; V2's have no such key.
            "deepseek_v3" => match o.get("num_nextn_predict_layers") {
                None | Some(Value::Null) => 0,
                Some(v) => v.as_u64().ok_or_else(|| {
                    format!("key `num_nextn_predict_layers`: must be a whole number of modules, got {v}")
                })?,
            },
            _ => 0,
        },
        output_router_logits: match model_type.as_str() {
            "mixtral" | "qwen2_moe" | "qwen3_moe" | "gpt_oss" => flag(&o, "output_router_logits")?.unwrap_or(false),
            _ => false,
        },
        model_type,
        dropout: 0.0,
    })
}

/// GPT-2 (`GPT2Config`, transformers' defaults where a key is absent): stepsim's gpt family
/// is GPT-2's block, so every key maps one to one.
fn gpt2(o: &Map<String, Value>) -> Result<HfModel, String> {
    if flag(o, "add_cross_attention")?.unwrap_or(false) {
        return Err(
            "key `add_cross_attention`: true (an encoder-decoder's cross-attention) is not modelled; only false".into(),
        );
    }
    let hidden = opt_count(o, "n_embd")?.unwrap_or(768);
    let n_heads = opt_count(o, "n_head")?.unwrap_or(12);
    let pdrop = match o.get("resid_pdrop") {
        None | Some(Value::Null) => 0.1,
        Some(Value::Number(n)) if n.as_f64().is_some_and(|p| (0.0..1.0).contains(&p)) => n.as_f64().unwrap_or(0.1),
        Some(v) => return Err(format!("key `resid_pdrop`: must be a probability in [0, 1), got {v}")),
    };
    Ok(HfModel {
        model_type: "gpt2".into(),
        family: Family::Gpt,
        n_layers: opt_count(o, "n_layer")?.unwrap_or(12),
        hidden,
        n_heads,
        n_kv_heads: n_heads,
        ffn_hidden: opt_count(o, "n_inner")?.unwrap_or(4 * hidden),
        vocab: opt_count(o, "vocab_size")?.unwrap_or(50257),
        tie_embeddings: flag(o, "tie_word_embeddings")?.unwrap_or(true),
        head_dim: None,
        qkv_bias: false,
        qk_norm: false,
        max_position_embeddings: Some(opt_count(o, "n_positions")?.unwrap_or(1024)),
        sliding_window: None,
        style: super::BlockStyle::default(),
        moe: None,
        mla: None,
        dropout: pdrop,
        nextn_predict_layers: 0,
        output_router_logits: false,
    })
}

/// GPT-NeoX (`GPTNeoXConfig`, transformers' defaults where a key is absent, which are
/// GPT-NeoX-20B's): stepsim's gpt block (LayerNorms, biased fused qkv and dense, a biased GELU
/// MLP) with partial rotary positions in place of the position table, the MLP beside attention
/// (`use_parallel_residual`, true) and untied embeddings (`embed_in`, `embed_out`).
fn gpt_neox(o: &Map<String, Value>) -> Result<HfModel, String> {
    if flag(o, "attention_bias")? == Some(false) {
        return Err(
            "key `attention_bias`: false (GPT-NeoX without its q, k, v and dense biases) is not modelled; only true"
                .into(),
        );
    }
    let hidden = opt_count(o, "hidden_size")?.unwrap_or(6144);
    let n_heads = opt_count(o, "num_attention_heads")?.unwrap_or(64);
    if hidden % n_heads != 0 {
        return Err(format!("key `num_attention_heads`: {n_heads} does not divide hidden_size ({hidden})"));
    }
    // `rotary_pct` (0.25), or `partial_rotary_factor` where newer transformers write it (at the
    // top level or in `rope_parameters`); transformers turns int(head_size x share) dimensions.
    let nested = match o.get("rope_parameters") {
        Some(Value::Object(r)) => fraction(r, "partial_rotary_factor")?,
        _ => None,
    };
    let share = match (fraction(o, "rotary_pct")?, fraction(o, "partial_rotary_factor")?, nested) {
        (Some(a), _, _) | (None, Some(a), _) | (None, None, Some(a)) => a,
        (None, None, None) => 0.25,
    };
    let head = hidden / n_heads;
    let rotary_dims = (head as f64 * share).floor() as u64;
    if rotary_dims == 0 || rotary_dims % 2 != 0 {
        return Err(format!(
            "key `rotary_pct`: {share} of a {head}-wide head turns {rotary_dims} dimensions; rotary embeddings need an even, positive number"
        ));
    }
    let hidden_dropout = fraction_or_zero(o, "hidden_dropout")?;
    let attention_dropout = fraction_or_zero(o, "attention_dropout")?;
    if hidden_dropout != attention_dropout {
        return Err(format!(
            "keys `hidden_dropout` ({hidden_dropout}) and `attention_dropout` ({attention_dropout}): different rates are not modelled (one dropout rate); make them equal"
        ));
    }
    Ok(HfModel {
        model_type: "gpt_neox".into(),
        family: Family::Gpt,
        n_layers: opt_count(o, "num_hidden_layers")?.unwrap_or(44),
        hidden,
        n_heads,
        n_kv_heads: n_heads,
        ffn_hidden: opt_count(o, "intermediate_size")?.unwrap_or(24576),
        vocab: opt_count(o, "vocab_size")?.unwrap_or(50432),
        tie_embeddings: flag(o, "tie_word_embeddings")?.unwrap_or(false),
        head_dim: None,
        qkv_bias: false,
        qk_norm: false,
        max_position_embeddings: Some(opt_count(o, "max_position_embeddings")?.unwrap_or(2048)),
        sliding_window: None,
        style: super::BlockStyle {
            rotary_dims: Some(rotary_dims),
            parallel_residual: flag(o, "use_parallel_residual")?.unwrap_or(true),
            ..Default::default()
        },
        moe: None,
        mla: None,
        dropout: hidden_dropout,
        nextn_predict_layers: 0,
        output_router_logits: false,
    })
}

/// How the block of a llama-style type departs from Llama's, as transformers builds it.
fn block_style(o: &Map<String, Value>, model_type: &str) -> Result<super::BlockStyle, String> {
    use super::NormPlacement;
    // A softcap is on when its key is a number (null: off), with the type's default if absent.
    let cap = |key: &str, default: bool| -> Result<bool, String> {
        match o.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(false),
            Some(Value::Number(n)) if n.as_f64().is_some_and(|x| x > 0.0) => Ok(true),
            Some(v) => Err(format!("key `{key}`: must be a positive number or null, got {v}")),
        }
    };
    Ok(match model_type {
        // OlmoLayerNorm: F.layer_norm with no weight or bias.
        "olmo" => super::BlockStyle { weightless_norms: true, ..Default::default() },
        // Olmo2DecoderLayer: post_attention_layernorm and post_feedforward_layernorm on the
        // sublayers' outputs; q_norm over heads x head_dim, k_norm over kv_heads x head_dim.
        "olmo2" => super::BlockStyle { norms: NormPlacement::Post, qk_norm_full_width: true, ..Default::default() },
        // Gemma2DecoderLayer: input, post-attention, pre- and post-feedforward RMSNorms;
        // Gemma2Config caps attention scores at 50 and the final logits at 30 by default.
        "gemma2" => super::BlockStyle {
            norms: NormPlacement::Sandwich,
            attn_logit_softcap: cap("attn_logit_softcapping", true)?,
            final_logit_softcap: cap("final_logit_softcapping", true)?,
            ..Default::default()
        },
        // Gemma3TextConfig: the same four norms, no softcaps by default.
        "gemma3_text" => super::BlockStyle {
            norms: NormPlacement::Sandwich,
            attn_logit_softcap: cap("attn_logit_softcapping", false)?,
            final_logit_softcap: cap("final_logit_softcapping", false)?,
            ..Default::default()
        },
        // GptOssAttention: one sink logit per head.
        "gpt_oss" => super::BlockStyle { attention_sinks: true, ..Default::default() },
        _ => super::BlockStyle::default(),
    })
}

/// Which blocks attend through a sliding window, as transformers decides it: Mistral, Phi-3 and
/// Mixtral every block whenever `sliding_window` is set; Qwen2/3 (and their MoE) only with
/// `use_sliding_window`, from block `max_window_layers` (28) on; Gemma 2 every even block,
/// Gemma 3 all but every `sliding_window_pattern`th (6); an explicit `layer_types` list (newer
/// transformers write one) decides it where given.
fn sliding_window(
    o: &Map<String, Value>,
    model_type: &str,
    n_layers: u64,
) -> Result<Option<super::SlidingWindow>, String> {
    use super::WindowPattern;
    let window = match (model_type, o.get("sliding_window")) {
        // Gemma2Config's and Gemma3TextConfig's default window, GptOssConfig's; null turns it
        // off.
        ("gemma2" | "gemma3_text", None) => Some(4096),
        ("gpt_oss", None) => Some(128),
        _ => opt_count(o, "sliding_window")?,
    };
    let rule = match model_type {
        "mistral" | "phi3" | "mixtral" => Some(WindowPattern::All),
        "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" if flag(o, "use_sliding_window")?.unwrap_or(false) => {
            Some(WindowPattern::From(opt_whole(o, "max_window_layers")?.unwrap_or(28)))
        }
        "gemma2" => Some(WindowPattern::GlobalEvery(2)),
        "gemma3_text" => Some(WindowPattern::GlobalEvery(opt_count(o, "sliding_window_pattern")?.unwrap_or(6))),
        // GptOssConfig: even blocks local.
        "gpt_oss" => Some(WindowPattern::GlobalEvery(2)),
        _ => None,
    };
    if model_type == "llama4_text" {
        return llama4_chunks(o, n_layers);
    }
    let pattern = match o.get("layer_types") {
        None | Some(Value::Null) => rule,
        Some(list) => layer_types(list, "sliding_attention", n_layers)?,
    };
    match (window, pattern) {
        (Some(window), Some(pattern)) => Ok(Some(super::SlidingWindow { window, pattern, chunked: false })),
        (None, Some(_)) if o.get("layer_types").is_some_and(|x| !x.is_null()) => {
            Err("key `layer_types`: names sliding_attention blocks but `sliding_window` is not set".into())
        }
        _ => Ok(None),
    }
}

/// Llama 4's chunked attention (`Llama4TextAttention`): blocks with rotary positions attend
/// within chunks of `attention_chunk_size` (8192; null: none), the NoPE blocks globally; the
/// NoPE blocks are where `no_rope_layers` says 0 (default every `no_rope_layer_interval`th, 4),
/// or the `full_attention` entries of `layer_types` where given.
fn llama4_chunks(o: &Map<String, Value>, n_layers: u64) -> Result<Option<super::SlidingWindow>, String> {
    let chunk = match o.get("attention_chunk_size") {
        Some(Value::Null) => return Ok(None),
        None => 8192,
        Some(_) => count(o, "attention_chunk_size")?,
    };
    let pattern = match (o.get("layer_types"), o.get("no_rope_layers")) {
        (Some(list), _) if !list.is_null() => layer_types(list, "chunked_attention", n_layers)?,
        (_, Some(Value::Array(a))) if !a.is_empty() => {
            let local: Vec<bool> = a
                .iter()
                .map(|x| match x.as_u64() {
                    Some(0) => Ok(false),
                    Some(1) => Ok(true),
                    _ => Err(format!(
                        "key `no_rope_layers`: each entry is 1 (rotary, chunked) or 0 (NoPE, global), got {x}"
                    )),
                })
                .collect::<Result<_, _>>()?;
            local_pattern(&local, "no_rope_layers", n_layers)?
        }
        _ => Some(super::WindowPattern::GlobalEvery(opt_count(o, "no_rope_layer_interval")?.unwrap_or(4))),
    };
    Ok(pattern.map(|pattern| super::SlidingWindow { window: chunk, pattern, chunked: true }))
}

/// `layer_types` as one of the patterns stepsim's blocks express: None when every block
/// attends globally.
fn layer_types(list: &Value, local_name: &str, n_layers: u64) -> Result<Option<super::WindowPattern>, String> {
    let Value::Array(items) = list else {
        return Err(format!("key `layer_types`: must be a list of \"full_attention\" / \"{local_name}\", got {list}"));
    };
    let mut local = Vec::with_capacity(items.len());
    for item in items {
        match item.as_str() {
            Some("full_attention") => local.push(false),
            Some(x) if x == local_name => local.push(true),
            _ => {
                return Err(format!(
                    "key `layer_types`: {item} is not modelled; allowed: \"full_attention\", \"{local_name}\""
                ))
            }
        }
    }
    local_pattern(&local, "layer_types", n_layers)
}

/// Which blocks attend locally (`local[l]`, one entry per block of `n_layers`, read from
/// `key`) as one of the patterns stepsim's blocks express: None when every block attends
/// globally.
fn local_pattern(local: &[bool], key: &str, n_layers: u64) -> Result<Option<super::WindowPattern>, String> {
    use super::WindowPattern;
    let n = local.len() as u64;
    if n != n_layers {
        return Err(format!("key `{key}`: {n} entries for num_hidden_layers ({n_layers}) blocks"));
    }
    if !local.contains(&true) {
        return Ok(None);
    }
    let matches = |p: WindowPattern| {
        let sw = super::SlidingWindow { window: 1, pattern: p, chunked: false };
        (0..n).all(|l| sw.window_of(l).is_some() == local[l as usize])
    };
    let first_local = local.iter().position(|&x| x).unwrap_or(0) as u64;
    let candidates = [WindowPattern::All, WindowPattern::From(first_local)]
        .into_iter()
        .chain((2..=n.max(2)).map(WindowPattern::GlobalEvery));
    for p in candidates {
        if matches(p) {
            return Ok(Some(p));
        }
    }
    Err(format!("key `{key}`: this mix of local and global blocks is not one stepsim expresses (every block local, local from one block on, or every nth block global)"))
}

/// A number in [0, 1], where given.
fn fraction(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)) => Ok(n.as_f64()),
        Some(v) => Err(format!("key `{key}`: must be a number in [0, 1], got {v}")),
    }
}

/// A dropout rate in [0, 1); 0 when absent.
fn fraction_or_zero(o: &Map<String, Value>, key: &str) -> Result<f64, String> {
    match fraction(o, key)? {
        Some(p) if p >= 1.0 => Err(format!("key `{key}`: must be a probability in [0, 1), got {p}")),
        p => Ok(p.unwrap_or(0.0)),
    }
}

/// DeepSeek's multi-head latent attention, with transformers' defaults (the same in
/// `DeepseekV2Config` and `DeepseekV3Config`).
fn mla_config(o: &Map<String, Value>) -> Result<super::MlaConfig, String> {
    // Absent: the default rank; null: no query compression (`q_proj`, DeepSeek-V2-Lite).
    let q_lora_rank = match o.get("q_lora_rank") {
        None => 1536,
        Some(Value::Null) => 0,
        Some(_) => count(o, "q_lora_rank")?,
    };
    let qk_rope_head_dim = opt_count(o, "qk_rope_head_dim")?.unwrap_or(64);
    if qk_rope_head_dim % 2 != 0 {
        return Err(format!("key `qk_rope_head_dim`: rotary embeddings need an even width, got {qk_rope_head_dim}"));
    }
    Ok(super::MlaConfig {
        q_lora_rank,
        kv_lora_rank: opt_count(o, "kv_lora_rank")?.unwrap_or(512),
        qk_nope_head_dim: opt_count(o, "qk_nope_head_dim")?.unwrap_or(128),
        qk_rope_head_dim,
        v_head_dim: opt_count(o, "v_head_dim")?.unwrap_or(128),
    })
}

/// The mixture-of-experts MLP of a MoE model type, with transformers' defaults.
fn moe_config(o: &Map<String, Value>, model_type: &str, n_layers: u64) -> Result<super::MoeConfig, String> {
    if DEEPSEEK_TYPES.contains(&model_type) {
        return deepseek_moe(o, model_type, n_layers);
    }
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
        // GptOssConfig: `num_local_experts` (128) experts of `intermediate_size` (2880), top
        // `num_experts_per_tok` (4; the released files repeat it as `experts_per_token`).
        "gpt_oss" => (
            aliased(o, "num_local_experts", "num_experts")?.unwrap_or(128),
            aliased(o, "num_experts_per_tok", "experts_per_token")?.unwrap_or(4),
            opt_count(o, "intermediate_size")?.unwrap_or(2880),
            0,
        ),
        // Llama4TextConfig: `num_local_experts` (16) experts of `intermediate_size` (8192), top
        // `num_experts_per_tok` (1), and one shared expert of the same width in every MoE block.
        "llama4_text" => {
            let f = opt_count(o, "intermediate_size")?.unwrap_or(8192);
            (
                aliased(o, "num_local_experts", "num_experts")?.unwrap_or(16),
                opt_count(o, "num_experts_per_tok")?.unwrap_or(1),
                f,
                f,
            )
        }
        _ => unreachable!("moe_config of a dense model type"),
    };
    if top_k > num_experts {
        return Err(format!(
            "key `num_experts_per_tok`: {top_k} experts per token is more than the {num_experts} experts there are"
        ));
    }
    // Qwen-MoE: block l's MLP is sparse when l is not in `mlp_only_layers` and
    // (l + 1) % decoder_sparse_step == 0.
    let (every, dense_layers) = if model_type == "mixtral" || model_type == "gpt_oss" {
        (1, Vec::new())
    } else if model_type == "llama4_text" {
        llama4_moe_layers(o, n_layers)?
    } else {
        let step = opt_count(o, "decoder_sparse_step")?.unwrap_or(1);
        let dense = match o.get("mlp_only_layers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => {
                a.iter().map(|x| x.as_u64().filter(|&l| l < n_layers)).collect::<Option<Vec<u64>>>().ok_or_else(
                    || {
                        format!(
                        "key `mlp_only_layers`: must list block indices below num_hidden_layers ({n_layers}), got {}",
                        Value::Array(a.clone())
                    )
                    },
                )?
            }
            Some(v) => return Err(format!("key `mlp_only_layers`: must be a list of block indices, got {v}")),
        };
        (step, dense)
    };
    let mut dense_layers = dense_layers;
    dense_layers.sort_unstable();
    dense_layers.dedup();
    let moe = super::MoeConfig {
        num_experts,
        top_k,
        expert_ffn_hidden,
        shared_expert_ffn_hidden: shared,
        shared_expert_gate: model_type == "qwen2_moe",
        first_dense_layers: 0,
        every,
        offset: every - 1,
        dense_layers,
        biases: model_type == "gpt_oss",
        router_groups: 1,
        router_group_topk: 1,
    };
    if !(0..n_layers).any(|l| moe.is_moe_layer(l)) {
        return Err(format!(
            "keys `decoder_sparse_step` and `mlp_only_layers`: leave no mixture-of-experts block among the {n_layers}"
        ));
    }
    Ok(moe)
}

/// Llama 4's MoE blocks (`Llama4TextConfig.moe_layers`): an explicit `moe_layers` list, else
/// every `interleave_moe_layer_step`th block (1: all), i.e. blocks s - 1, 2s - 1, ...; as
/// (every, the blocks listed dense).
fn llama4_moe_layers(o: &Map<String, Value>, n_layers: u64) -> Result<(u64, Vec<u64>), String> {
    match o.get("moe_layers") {
        None | Some(Value::Null) => Ok((opt_count(o, "interleave_moe_layer_step")?.unwrap_or(1), Vec::new())),
        Some(Value::Array(a)) => {
            let moe = a.iter().map(|x| x.as_u64().filter(|&l| l < n_layers)).collect::<Option<Vec<u64>>>().ok_or_else(
                || format!("key `moe_layers`: must list block indices below num_hidden_layers ({n_layers})"),
            )?;
            Ok((1, (0..n_layers).filter(|l| !moe.contains(l)).collect()))
        }
        Some(v) => Err(format!("key `moe_layers`: must be a list of block indices, got {v}")),
    }
}

/// DeepSeek's MoE MLPs (`DeepseekV2Moe`, `DeepseekV3MoE`): the first `first_k_dense_replace`
/// blocks dense of `intermediate_size`, the rest `n_routed_experts` experts and
/// `n_shared_experts` x `moe_intermediate_size` of ungated shared expert.
fn deepseek_moe(o: &Map<String, Value>, model_type: &str, n_layers: u64) -> Result<super::MoeConfig, String> {
    let v3 = model_type == "deepseek_v3";
    if o.get("n_routed_experts").is_some_and(Value::is_null) {
        return Err(
            "key `n_routed_experts`: null (every MLP dense, as DeepSeek's own modelling code reads it) is not read; give the number of routed experts".into(),
        );
    }
    // transformers' attribute_map: V3 aliases `num_local_experts`, V2 `num_experts`.
    let alias = if v3 { "num_local_experts" } else { "num_experts" };
    let num_experts = aliased(o, "n_routed_experts", alias)?.unwrap_or(if v3 { 256 } else { 64 });
    let top_k = match opt_count(o, "num_experts_per_tok")? {
        Some(k) => k,
        None if v3 => 8,
        None => {
            return Err(
                "key `num_experts_per_tok` is missing (DeepseekV2Config has no default: the experts each token is routed to)".into(),
            )
        }
    };
    if top_k > num_experts {
        return Err(format!(
            "key `num_experts_per_tok`: {top_k} experts per token is more than the {num_experts} experts there are"
        ));
    }
    let expert_ffn_hidden = opt_count(o, "moe_intermediate_size")?.unwrap_or(if v3 { 2048 } else { 1407 });
    // null: no shared experts (DeepSeek's modelling code builds none).
    let n_shared = match o.get("n_shared_experts") {
        Some(Value::Null) => 0,
        _ => opt_whole(o, "n_shared_experts")?.unwrap_or(if v3 { 1 } else { 2 }),
    };
    let first_dense_layers = opt_whole(o, "first_k_dense_replace")?.unwrap_or(if v3 { 3 } else { 0 });
    if first_dense_layers >= n_layers {
        return Err(format!(
            "key `first_k_dense_replace`: {first_dense_layers} dense blocks of num_hidden_layers ({n_layers}) leaves no mixture-of-experts block; at most {}",
            n_layers - 1
        ));
    }
    // DeepSeek's modelling code (modeling_deepseek.py, DeepseekV3DecoderLayer): block l's MLP
    // is sparse when l >= first_k_dense_replace and l % moe_layer_freq == 0. (transformers'
    // DeepseekV3 classes read no such key; every released DeepSeek config says 1.)
    let every = opt_count(o, "moe_layer_freq")?.unwrap_or(1);
    // Group-limited routing: V3's router always picks its experts from the best `topk_group`
    // of `n_group` groups (DeepseekV3TopkRouter: defaults 8 and 4); V2's only with
    // `topk_method = "group_limited_greedy"` (its default "greedy" ignores the groups).
    let limited = v3 || o.get("topk_method").and_then(Value::as_str) == Some("group_limited_greedy");
    let (router_groups, router_group_topk) = if limited {
        let g = opt_count(o, "n_group")?.unwrap_or(if v3 { 8 } else { 1 });
        let gk = opt_count(o, "topk_group")?.unwrap_or(if v3 { 4 } else { 1 });
        if num_experts % g != 0 || gk > g || top_k > gk * (num_experts / g) {
            return Err(format!(
                "keys `n_group` ({g}) and `topk_group` ({gk}): the {num_experts} experts must split into n_group groups and num_experts_per_tok ({top_k}) fit in topk_group of them"
            ));
        }
        (g, gk)
    } else {
        (1, 1)
    };
    let moe = super::MoeConfig {
        num_experts,
        top_k,
        expert_ffn_hidden,
        shared_expert_ffn_hidden: n_shared * expert_ffn_hidden,
        shared_expert_gate: false,
        first_dense_layers,
        every,
        offset: 0,
        dense_layers: Vec::new(),
        biases: false,
        router_groups,
        router_group_topk,
    };
    if !(0..n_layers).any(|l| moe.is_moe_layer(l)) {
        return Err(format!(
            "key `moe_layer_freq`: {every} with first_k_dense_replace ({first_dense_layers}) leaves no mixture-of-experts block among the {n_layers}"
        ));
    }
    Ok(moe)
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

/// The largest count a config.json may give: 2^24, the largest of the scenario's stated limits
/// on a model's sizes (vocabulary and positions, `scenario::limits`). Counts reach places
/// the scenario's own bounds do not (an expert count, a head width, a latent rank), where
/// their products must stay inside stepsim's 64-bit counts; the scenario then bounds each
/// size it takes more tightly, by its own field.
pub const MAX_COUNT: u64 = 1 << 24;

fn opt_count(o: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match o.get(key) {
        Some(v) if !v.is_null() && v.as_u64().is_none_or(|n| n == 0) => {
            Err(format!("key `{key}`: must be a positive whole number, got {v}"))
        }
        _ => opt_whole(o, key),
    }
}

/// A whole number that may be 0.
fn opt_whole(o: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > MAX_COUNT => Err(format!(
                "key `{key}`: must be at most {MAX_COUNT}, got {n} (stepsim's stated limit on a config.json size; see docs/scenario-format.md)"
            )),
            Some(n) => Ok(Some(n)),
            None => Err(format!("key `{key}`: must be a whole number (0 or more), got {v}")),
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
    ($($name:literal => $repo:literal $(; $note:literal)?),* $(,)?) => {
        &[$(ZooModel {
            name: $name,
            source: concat!("https://huggingface.co/", $repo, "/blob/main/config.json" $(, $note)?),
            config: include_str!(concat!("../../models/", $name, ".json")),
        }),*]
    };
}

/// The shipped model zoo (`models/`): the released `config.json` of each model.
pub const ZOO: &[ZooModel] = zoo! {
    // The released config.json less its `quantization_config` (FP8 e4m3, 128 x 128 blocks):
    // that describes how the released weights are stored, not the architecture, and a user's
    // config.json with one is refused (quantized weights are a scenario setting).
    "deepseek-v3" => "deepseek-ai/DeepSeek-V3";
        " less its quantization_config (the released weights' FP8 storage, not the architecture)",
    "gemma-7b" => "google/gemma-7b",
    "gemma-2-9b" => "google/gemma-2-9b",
    "gemma-2-27b" => "google/gemma-2-27b",
    "gemma-3-1b" => "google/gemma-3-1b-pt",
    "gpt-neox-20b" => "EleutherAI/gpt-neox-20b",
    "gpt-oss-20b" => "openai/gpt-oss-20b";
        " less its quantization_config (the released experts' MXFP4 storage, not the architecture)",
    "gpt-oss-120b" => "openai/gpt-oss-120b";
        " less its quantization_config (the released experts' MXFP4 storage, not the architecture)",
    "gpt2" => "openai-community/gpt2",
    "gpt2-xl" => "openai-community/gpt2-xl",
    "llama-3.1-8b" => "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b" => "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b" => "meta-llama/Llama-3.1-405B",
    "llama-4-maverick" => "meta-llama/Llama-4-Maverick-17B-128E";
        ": its text_config (the language model; the vision encoder beside it is not modelled)",
    "llama-4-scout" => "meta-llama/Llama-4-Scout-17B-16E";
        ": its text_config (the language model; the vision encoder beside it is not modelled)",
    "mistral-7b-v0.1" => "mistralai/Mistral-7B-v0.1",
    "mistral-nemo-12b" => "mistralai/Mistral-Nemo-Base-2407",
    "mixtral-8x7b" => "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b" => "mistralai/Mixtral-8x22B-v0.1",
    "olmo-7b" => "allenai/OLMo-7B-hf",
    "olmo-2-7b" => "allenai/OLMo-2-1124-7B",
    "pythia-6.9b" => "EleutherAI/pythia-6.9b",
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
    fn gpt2_reads_its_own_keys_with_transformers_defaults() {
        let h = parse(r#"{"model_type": "gpt2"}"#).unwrap();
        assert_eq!(
            (h.family, h.n_layers, h.hidden, h.n_heads, h.ffn_hidden, h.vocab),
            (Family::Gpt, 12, 768, 12, 3072, 50257)
        );
        assert_eq!((h.position_table(), h.tie_embeddings, h.dropout), (Some(1024), true, 0.1));
        let h =
            parse(r#"{"model_type": "gpt2", "n_embd": 64, "n_inner": 100, "n_positions": 2048, "resid_pdrop": 0.0}"#)
                .unwrap();
        assert_eq!((h.hidden, h.ffn_hidden, h.position_table(), h.dropout), (64, 100, Some(2048), 0.0));
        assert_eq!(h.model_config(2048).param_count(), h.model_config(1).param_count() + 2047 * 64);
        let e = parse(r#"{"model_type": "gpt2", "add_cross_attention": true}"#).unwrap_err();
        assert!(e.contains("add_cross_attention"), "{e}");
        let e = parse(r#"{"model_type": "gpt2", "n_layer": 0}"#).unwrap_err();
        assert!(e.contains("n_layer"), "{e}");
        let e = parse(r#"{"model_type": "gpt2", "resid_pdrop": 1.5}"#).unwrap_err();
        assert!(e.contains("resid_pdrop"), "{e}");
        // Llama-style configs have no position table among their parameters.
        let l = parse(include_str!("../../models/llama-3.1-8b.json")).unwrap();
        assert_eq!(l.position_table(), None);
    }

    #[test]
    fn refusals_name_the_key() {
        let base = r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100"#;
        let with = |extra: &str| parse(&format!("{base}{extra}}}"));
        assert!(with("").is_ok());
        let e = with(r#", "num_local_experts": 8"#).unwrap_err();
        assert!(e.contains("`num_local_experts`") && e.contains("mixture-of-experts"), "{e}");
        // Llama's attention_bias: q, k, v and o (LlamaAttention's bias=config.attention_bias).
        let b = with(r#", "attention_bias": true"#).unwrap();
        assert!(b.qkv_bias && b.style.o_bias);
        let e = parse(&format!(r#"{}, "attention_bias": true}}"#, base.replace("llama", "mistral"))).unwrap_err();
        assert!(e.contains("`attention_bias`") && e.contains("mistral"), "{e}");
        let e = with(r#", "hidden_size": 64.5"#).unwrap_err();
        assert!(e.contains("`hidden_size`") && e.contains("whole number"), "{e}");
        let e = parse(r#"{"model_type": "gpt_bigcode"}"#).unwrap_err();
        assert!(e.contains("gpt_bigcode") && e.contains("qwen2"), "{e}");
        let e = parse(r#"{"model_type": "llama", "hidden_size": 64}"#).unwrap_err();
        assert!(e.contains("`num_attention_heads` is missing"), "{e}");
        assert!(parse("[1, 2]").unwrap_err().contains("JSON object"));
        // A count past 2^24 is refused by its key (the import fuzz's mixtral with
        // num_local_experts = 2^53 + 1 read, then overflowed the parameter count).
        let e = with(r#", "head_dim": 9007199254740993"#).unwrap_err();
        assert!(e.contains("`head_dim`") && e.contains("at most 16777216"), "{e}");
        let e = with(r#", "num_key_value_heads": 16777217"#).unwrap_err();
        assert!(e.contains("`num_key_value_heads`") && e.contains("at most 16777216"), "{e}");
        assert!(with(r#", "max_position_embeddings": 16777216"#).is_ok());
    }

    #[test]
    fn gpt_neox_reads_partial_rotary_and_the_parallel_residual() {
        let h = parse(r#"{"model_type": "gpt_neox"}"#).unwrap();
        assert_eq!(
            (h.family, h.n_layers, h.hidden, h.n_heads, h.ffn_hidden, h.vocab),
            (Family::Gpt, 44, 6144, 64, 24576, 50432)
        );
        assert_eq!((h.style.rotary_dims, h.style.parallel_residual, h.tie_embeddings), (Some(24), true, false));
        assert_eq!(h.position_table(), None);
        let with = |extra: &str| {
            parse(&format!(r#"{{"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8{extra}}}"#))
        };
        assert_eq!(with(r#", "rotary_pct": 0.5"#).unwrap().style.rotary_dims, Some(32));
        assert_eq!(with(r#", "partial_rotary_factor": 1.0"#).unwrap().style.rotary_dims, Some(64));
        let nested = with(r#", "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}"#).unwrap();
        assert_eq!(nested.style.rotary_dims, Some(16));
        assert!(!with(r#", "use_parallel_residual": false"#).unwrap().style.parallel_residual);
        assert_eq!(with(r#", "hidden_dropout": 0.1, "attention_dropout": 0.1"#).unwrap().dropout, 0.1);
        for (extra, key) in [
            (r#", "attention_bias": false"#, "`attention_bias`"),
            (r#", "rotary_pct": 0.01"#, "`rotary_pct`"),
            (r#", "rotary_pct": 2"#, "`rotary_pct`"),
            (r#", "hidden_dropout": 0.1"#, "`hidden_dropout`"),
            (r#", "num_attention_heads": 7"#, "`num_attention_heads`"),
        ] {
            let e = with(extra).unwrap_err();
            assert!(e.contains(key), "{extra}: {e}");
        }
    }

    #[test]
    fn gpt_oss_reads_biased_experts_sinks_and_alternating_windows_with_transformers_defaults() {
        let h = parse(&format!(r#"{{"model_type": "gpt_oss", {MOE_BASE}}}"#)).unwrap();
        let m = h.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.expert_ffn_hidden, m.biases), (128, 4, 128, true));
        assert_eq!((h.head_dim, h.qkv_bias, h.style.o_bias, h.style.attention_sinks), (Some(64), true, true, true));
        let sw = h.sliding_window.unwrap();
        assert_eq!((sw.window, sw.pattern), (128, crate::model::WindowPattern::GlobalEvery(2)));
        let h = parse(&format!(
            r#"{{"model_type": "gpt_oss", {MOE_BASE}, "num_local_experts": 32, "experts_per_token": 2, "attention_bias": false}}"#
        ))
        .unwrap();
        assert_eq!((h.moe.unwrap().num_experts, h.qkv_bias, h.style.o_bias), (32, false, false));
        let e = parse(&format!(
            r#"{{"model_type": "gpt_oss", {MOE_BASE}, "num_experts_per_tok": 4, "experts_per_token": 2}}"#
        ))
        .unwrap_err();
        assert!(e.contains("`experts_per_token`"), "{e}");
    }

    #[test]
    fn llama4_reads_interleaved_experts_and_chunked_attention_with_transformers_defaults() {
        use crate::model::WindowPattern;
        let with = |extra: &str| parse(&format!(r#"{{"model_type": "llama4_text", {MOE_BASE}{extra}}}"#));
        let h = with(r#", "intermediate_size_mlp": 256"#).unwrap();
        let m = h.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.expert_ffn_hidden, m.shared_expert_ffn_hidden), (16, 1, 128, 128));
        assert_eq!((h.ffn_hidden, h.head_dim, m.every), (256, Some(128), 1));
        let sw = h.sliding_window.unwrap();
        assert_eq!((sw.window, sw.pattern, sw.chunked), (8192, WindowPattern::GlobalEvery(4), true));
        let m = with(r#", "interleave_moe_layer_step": 2"#).unwrap().moe.unwrap();
        assert_eq!((m.is_moe_layer(0), m.is_moe_layer(1)), (false, true));
        let m = with(r#", "moe_layers": [0]"#).unwrap().moe.unwrap();
        assert_eq!(m.dense_layers, [1]);
        let sw = with(r#", "no_rope_layers": [1, 0]"#).unwrap().sliding_window.unwrap();
        assert_eq!((sw.window_of(0), sw.window_of(1)), (Some(8192), None));
        assert!(with(r#", "attention_chunk_size": null"#).unwrap().sliding_window.is_none());
        let e = with(r#", "moe_layers": [2]"#).unwrap_err();
        assert!(e.contains("`moe_layers`"), "{e}");
        let e = with(r#", "no_rope_layers": [1, 2]"#).unwrap_err();
        assert!(e.contains("`no_rope_layers`"), "{e}");
        let e = with(r#", "no_rope_layers": [1, 0, 1]"#).unwrap_err();
        assert!(e.contains("key `no_rope_layers`: 3 entries for num_hidden_layers (2)"), "{e}");
        let e = parse(r#"{"model_type": "llama4", "text_config": {}}"#).unwrap_err();
        assert!(e.contains("llama4_text") && e.contains("text_config"), "{e}");
    }

    #[test]
    fn layer_types_and_window_rules_become_patterns() {
        use crate::model::WindowPattern;
        let base = r#""hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 6,
            "intermediate_size": 128, "vocab_size": 100"#;
        let with = |t: &str, extra: &str| parse(&format!(r#"{{"model_type": "{t}", {base}{extra}}}"#));
        let pattern = |t: &str, extra: &str| with(t, extra).unwrap().sliding_window.map(|w| (w.window, w.pattern));
        assert_eq!(pattern("mistral", r#", "sliding_window": 16"#), Some((16, WindowPattern::All)));
        assert_eq!(pattern("mistral", ""), None);
        assert_eq!(pattern("gemma2", ""), Some((4096, WindowPattern::GlobalEvery(2))));
        assert_eq!(pattern("gemma2", r#", "sliding_window": null"#), None);
        assert_eq!(
            pattern("gemma3_text", r#", "sliding_window_pattern": 3"#),
            Some((4096, WindowPattern::GlobalEvery(3)))
        );
        assert_eq!(pattern("qwen2", r#", "sliding_window": 32, "use_sliding_window": false"#), None);
        assert_eq!(
            pattern("qwen2", r#", "sliding_window": 32, "use_sliding_window": true, "max_window_layers": 2"#),
            Some((32, WindowPattern::From(2)))
        );
        let types = |list: &str| format!(r#", "sliding_window": 8, "layer_types": [{list}]"#);
        let (s, f) = (r#""sliding_attention""#, r#""full_attention""#);
        assert_eq!(pattern("qwen3", &types(&[f, f, s, s, s, s].join(","))), Some((8, WindowPattern::From(2))));
        assert_eq!(
            pattern("gemma3_text", &types(&[s, s, f, s, s, f].join(","))),
            Some((8, WindowPattern::GlobalEvery(3)))
        );
        assert_eq!(pattern("gemma2", &types(&[f, f, f, f, f, f].join(","))), None);
        let e = with("qwen3", &types(&[s, f, f, s, f, f].join(","))).unwrap_err();
        assert!(e.contains("`layer_types`") && e.contains("not one stepsim expresses"), "{e}");
        let c = r#""chunked_attention""#;
        let e = with("qwen3", &types(&[c, f, f, f, f, f].join(","))).unwrap_err();
        assert!(e.contains("`layer_types`") && e.contains("chunked_attention"), "{e}");
        let e = with("qwen3", &types(&[s, f].join(","))).unwrap_err();
        assert!(e.contains("`layer_types`") && e.contains("2 entries for num_hidden_layers (6)"), "{e}");
        let e = with("qwen3", &format!(r#", "layer_types": [{}]"#, [f, s, s, s, s, s].join(","))).unwrap_err();
        assert!(e.contains("`sliding_window` is not set"), "{e}");
    }

    #[test]
    fn olmo_gemma2_and_gemma3_styles() {
        use crate::model::NormPlacement;
        let base = r#""hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 6,
            "intermediate_size": 128, "vocab_size": 100"#;
        let with = |t: &str, extra: &str| parse(&format!(r#"{{"model_type": "{t}", {base}{extra}}}"#));
        assert!(with("olmo", "").unwrap().style.weightless_norms);
        let o2 = with("olmo2", "").unwrap();
        assert!(o2.qk_norm && o2.style.qk_norm_full_width && o2.style.norms == NormPlacement::Post);
        let g2 = with("gemma2", "").unwrap();
        assert_eq!((g2.head_dim, g2.tie_embeddings, g2.style.norms), (Some(256), true, NormPlacement::Sandwich));
        assert!(g2.style.attn_logit_softcap && g2.style.final_logit_softcap && !g2.qk_norm);
        let off = with("gemma2", r#", "attn_logit_softcapping": null, "final_logit_softcapping": null"#).unwrap();
        assert!(!off.style.attn_logit_softcap && !off.style.final_logit_softcap);
        let e = with("gemma2", r#", "final_logit_softcapping": "30""#).unwrap_err();
        assert!(e.contains("`final_logit_softcapping`"), "{e}");
        let g3 = with("gemma3_text", "").unwrap();
        assert!(g3.qk_norm && !g3.style.qk_norm_full_width && !g3.style.final_logit_softcap);
        let e = with("gemma3_text", r#", "use_bidirectional_attention": true"#).unwrap_err();
        assert!(e.contains("`use_bidirectional_attention`"), "{e}");
        let e = parse(r#"{"model_type": "gemma3", "text_config": {}}"#).unwrap_err();
        assert!(e.contains("gemma3_text") && e.contains("text_config"), "{e}");
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
        let sw = with("mixtral", r#", "sliding_window": 4096"#).unwrap().sliding_window.unwrap();
        assert_eq!((sw.window, sw.pattern), (4096, crate::model::WindowPattern::All));
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
            // Qwen-MoE's (l + 1) % decoder_sparse_step == 0: blocks 1, 3, ... of 2.
            let m = with(t, r#", "decoder_sparse_step": 2"#).unwrap().moe.unwrap();
            assert_eq!((m.every, m.offset, m.is_moe_layer(0), m.is_moe_layer(1)), (2, 1, false, true));
            assert!(with(t, r#", "decoder_sparse_step": 1, "mlp_only_layers": []"#).is_ok());
            let m = with(t, r#", "mlp_only_layers": [1, 1]"#).unwrap().moe.unwrap();
            assert_eq!((m.dense_layers.clone(), m.is_moe_layer(0), m.is_moe_layer(1)), (vec![1], true, false));
            let e = with(t, r#", "mlp_only_layers": [0, 5]"#).unwrap_err();
            assert!(e.contains("`mlp_only_layers`") && e.contains("below num_hidden_layers (2)"), "{e}");
            let e = with(t, r#", "mlp_only_layers": [0, 1]"#).unwrap_err();
            assert!(e.contains("leave no mixture-of-experts block"), "{e}");
            let e = with(t, r#", "decoder_sparse_step": 3"#).unwrap_err();
            assert!(e.contains("`decoder_sparse_step`"), "{e}");
        }
        let e = with("mixtral", r#", "num_experts_per_tok": 9"#).unwrap_err();
        assert!(e.contains("`num_experts_per_tok`"), "{e}");
        let e = with("mixtral", r#", "attention_bias": true"#).unwrap_err();
        assert!(e.contains("`attention_bias`"), "{e}");
        // Dense types still refuse expert keys.
        let e = with("qwen3", r#", "num_experts": 8"#).unwrap_err();
        assert!(e.contains("`num_experts`") && e.contains("mixture-of-experts"), "{e}");
        // DeepSeek's routed experts are read by the DeepSeek types only.
        let e = with("qwen3_moe", r#", "n_routed_experts": 8"#).unwrap_err();
        assert!(e.contains("`n_routed_experts`") && e.contains("deepseek_v3"), "{e}");
        for t in ["dbrx", "jamba", "gemma3"] {
            let e = with(t, "").unwrap_err();
            assert!(e.contains(t) && e.contains("not supported"), "{e}");
        }
    }

    #[test]
    fn deepseek_types_read_latent_attention_and_experts_with_transformers_defaults() {
        let with = |t: &str, extra: &str| parse(&format!(r#"{{"model_type": "{t}", {MOE_BASE}{extra}}}"#));
        // DeepseekV3Config's defaults: DeepSeek-V3's MLA and experts (3 dense blocks of 4).
        let h = with("deepseek_v3", r#", "num_hidden_layers": 4"#).unwrap();
        let a = h.mla.clone().unwrap();
        assert_eq!(
            (a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim),
            (1536, 512, 128, 64, 128)
        );
        let m = h.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.expert_ffn_hidden, m.shared_expert_ffn_hidden), (256, 8, 2048, 2048));
        assert_eq!((m.first_dense_layers, m.shared_expert_gate), (3, false));
        assert_eq!((h.n_kv_heads, h.head_dim, h.qkv_bias, h.qk_norm, h.ffn_hidden), (4, None, false, false, 128));
        // DeepseekV2Config's: 64 experts of 1407, two shared, no dense blocks; top-k required.
        let e = with("deepseek_v2", "").unwrap_err();
        assert!(e.contains("`num_experts_per_tok` is missing"), "{e}");
        let h = with("deepseek_v2", r#", "num_experts_per_tok": 6, "q_lora_rank": null, "head_dim": 7"#).unwrap();
        let m = h.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.expert_ffn_hidden, m.shared_expert_ffn_hidden), (64, 6, 1407, 2814));
        assert_eq!(m.first_dense_layers, 0);
        // null q_lora_rank: a direct query projection; head_dim is not read.
        assert_eq!((h.mla.unwrap().q_lora_rank, h.head_dim), (0, None));
        // The alias transformers maps to n_routed_experts, and no shared experts.
        let h = with("deepseek_v3", r#", "num_local_experts": 16, "n_shared_experts": 0, "first_k_dense_replace": 0"#);
        let m = h.unwrap().moe.unwrap();
        assert_eq!((m.num_experts, m.shared_expert_ffn_hidden, m.first_dense_layers), (16, 0, 0));
        // Routing settings, YaRN and the MTP layer count change no parameter.
        assert!(with(
            "deepseek_v3",
            r#", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
            "topk_method": "noaux_tc", "norm_topk_prob": true, "aux_loss_alpha": 0.001, "num_nextn_predict_layers": 1,
            "rope_scaling": {"type": "yarn", "factor": 40}, "first_k_dense_replace": 1"#
        )
        .is_ok());
    }

    /// `num_nextn_predict_layers` is read (0 when absent, a whole number otherwise) and
    /// changes no count: transformers builds no module for it.
    #[test]
    fn deepseek_v3_reads_its_mtp_module_count_without_counting_it() {
        let with = |extra: &str| parse(&format!(r#"{{"model_type": "deepseek_v3", {MOE_BASE}{extra}}}"#));
        let base = r#", "num_hidden_layers": 4"#;
        let absent = with(base).unwrap();
        let one = with(&format!(r#"{base}, "num_nextn_predict_layers": 1"#)).unwrap();
        assert_eq!((absent.nextn_predict_layers, one.nextn_predict_layers), (0, 1));
        assert_eq!(one.model_config(4096).param_count(), absent.model_config(4096).param_count());
        assert!(one.model_config(4096).mtp.is_none());
        let e = with(&format!(r#"{base}, "num_nextn_predict_layers": -1"#)).unwrap_err();
        assert!(e.contains("`num_nextn_predict_layers`"), "{e}");
    }

    #[test]
    fn deepseek_refusals_name_the_key() {
        let with = |t: &str, extra: &str| parse(&format!(r#"{{"model_type": "{t}", {MOE_BASE}{extra}}}"#));
        for t in ["deepseek_v3", "deepseek_v2"] {
            let k = r#", "num_experts_per_tok": 2, "first_k_dense_replace": 1"#;
            assert!(with(t, k).is_ok(), "{t}");
            // DeepSeek's own l >= first_k_dense_replace and l % moe_layer_freq == 0.
            let four = r#", "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_hidden_layers": 4"#;
            let m = with(t, &format!(r#"{four}, "moe_layer_freq": 2"#)).unwrap().moe.unwrap();
            let moe: Vec<bool> = (0..4).map(|l| m.is_moe_layer(l)).collect();
            assert_eq!(moe, [false, false, true, false]);
            let e = with(t, &format!(r#"{k}, "moe_layer_freq": 2"#)).unwrap_err();
            assert!(e.contains("`moe_layer_freq`") && e.contains("leaves no mixture-of-experts block"), "{e}");
            assert!(with(t, &format!(r#"{k}, "moe_layer_freq": 1"#)).is_ok());
            let e = with(t, &format!(r#"{k}, "attention_bias": true"#)).unwrap_err();
            assert!(e.contains("`attention_bias`") && e.contains(t), "{e}");
            let e = with(t, &format!(r#"{k}, "num_key_value_heads": 2"#)).unwrap_err();
            assert!(e.contains("`num_key_value_heads`"), "{e}");
            assert!(with(t, &format!(r#"{k}, "num_key_value_heads": 4"#)).is_ok());
            let e = with(t, &format!(r#"{k}, "quantization_config": {{"quant_method": "fp8"}}"#)).unwrap_err();
            assert!(e.contains("`quantization_config`"), "{e}");
            let e = with(t, r#", "num_experts_per_tok": 2, "first_k_dense_replace": 2"#).unwrap_err();
            assert!(e.contains("`first_k_dense_replace`"), "{e}");
            let e = with(t, &format!(r#"{k}, "n_routed_experts": 1"#)).unwrap_err();
            assert!(e.contains("`num_experts_per_tok`"), "{e}");
            let e = with(t, &format!(r#"{k}, "qk_rope_head_dim": 63"#)).unwrap_err();
            assert!(e.contains("`qk_rope_head_dim`"), "{e}");
            let e = with(t, &format!(r#"{k}, "mlp_bias": true"#)).unwrap_err();
            assert!(e.contains("`mlp_bias`"), "{e}");
        }
    }
}
