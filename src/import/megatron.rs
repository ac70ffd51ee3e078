//! A Megatron-LM job as a scenario, from its arguments in either form people have them: the
//! command line (`--num-layers 32 --hidden-size 4096 ... --bf16`, line continuations allowed)
//! or the block Megatron prints at start-up (`num_layers ...................... 32`, the
//! `arguments` section of every training log). Names and defaults are `megatron/training/
//! arguments.py`'s:
//! - the architecture: `num_layers`, `hidden_size`, `ffn_hidden_size` (default 4 x hidden;
//!   with `--swiglu` 4 x hidden x 2/3 rounded up to a multiple of 64),
//!   `num_attention_heads`, `group_query_attention` with `num_query_groups`, `kv_channels`,
//!   `max_position_embeddings`, the vocabulary (`padded_vocab_size` from the log, or
//!   `--vocab-size` padded to a multiple of `make_vocab_size_divisible_by` x the tensor size);
//!   GPT-style (LayerNorm, GELU, learned positions, biases) or Llama-style
//!   (`--normalization RMSNorm --swiglu --position-embedding-type rope
//!   --disable-bias-linear`), anything in between refused with the key that breaks it;
//!   `multi_latent_attention` with `q_lora_rank`, `kv_lora_rank`, `qk_head_dim`,
//!   `qk_pos_emb_head_dim`, `v_head_dim`; `qk_layernorm`; `attention_backend` (unfused and
//!   local: math attention); `cross_entropy_loss_fusion`;
//! - the layout: `tensor_model_parallel_size`, `pipeline_model_parallel_size`,
//!   `num_virtual_stages_per_pipeline_rank` or `num_layers_per_virtual_pipeline_stage`,
//!   `sequence_parallel`, `context_parallel_size`,
//!   `expert_model_parallel_size`, `expert_tensor_parallel_size` (default: the tensor size),
//!   `use_distributed_optimizer` (ZeRO-1), the overlap flags; the data-parallel size is the
//!   world size over the model-parallel size;
//! - the step: `micro_batch_size`, `global_batch_size` (accumulation = global / (micro x
//!   data-parallel size)), `seq_length`, `bf16` / `fp16`,
//!   `accumulate_allreduce_grads_in_fp32`, recomputation, `clip_grad`, FP8,
//!   `use_precision_aware_optimizer` with `main_grads_dtype`, `main_params_dtype`,
//!   `exp_avg_dtype` and `exp_avg_sq_dtype`;
//! - multi-token prediction: `mtp_num_layers`, `mtp_loss_scaling_factor` (`[model.mtp]`).

use std::collections::BTreeMap;

use super::{Import, ImportError};

/// What the command line adds to the arguments.
#[derive(Debug, Clone)]
pub struct MegatronArgs {
    pub gpu: String,
    /// The world size (the log's `world_size` is used when this is absent).
    pub gpus: Option<u64>,
    pub gpus_per_node: Option<u64>,
    /// The padded vocabulary, where the arguments do not give one.
    pub vocab: Option<u64>,
}

/// Arguments read and ignored: no effect on memory or time.
const NO_EFFECT: &[&str] = &[
    "lr",
    "min_lr",
    "lr_decay_style",
    "lr_decay_iters",
    "lr_warmup_iters",
    "lr_warmup_fraction",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_eps",
    "init_method_std",
    "seed",
    "train_iters",
    "train_samples",
    "log_interval",
    "save_interval",
    "eval_interval",
    "eval_iters",
    "save",
    "load",
    "data_path",
    "split",
    "tokenizer_type",
    "vocab_file",
    "merge_file",
    "tokenizer_model",
    "tensorboard_dir",
    "wandb_project",
    "exit_interval",
    "distributed_backend",
    "log_throughput",
    "log_timers_to_tensorboard",
    "no_load_optim",
    "no_load_rng",
    "norm_epsilon",
    "layernorm_epsilon",
    "rotary_base",
    "rotary_percent",
    "attention_softmax_in_fp32",
    "use_flash_attn",
    "use_mcore_models",
    "transformer_impl",
    "rank",
    "local_rank",
    "data_parallel_size",
    "master_addr",
    "master_port",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "log_memory_to_tensorboard",
    "log_num_zeros_in_grad",
    "log_params_norm",
    "log_validation_ppl_to_tensorboard",
    "log_world_size_to_tensorboard",
    "logging_level",
    "mock_data",
    "data_cache_path",
    "async_save",
    "use_persistent_ckpt_worker",
    "ckpt_format",
    "dist_ckpt_strictness",
    "exit_duration_in_mins",
    "distributed_timeout_minutes",
    "no_check_for_nan_in_loss_and_grad",
    "null_tokenizer_eod_id",
    "mscale",
    "mscale_all_dim",
    "rotary_scaling_factor",
    "moe_router_score_function",
    "moe_router_pre_softmax",
    "moe_router_topk_scaling_factor",
    "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate",
    "moe_z_loss_coeff",
    "mtp_loss_scaling_factor",
    "manual_gc",
    "manual_gc_interval",
];

/// Arguments that change memory or time and that stepsim does not read, with what they do:
/// listed when a log shows them set (a log prints every argument, most at their defaults).
const WATCH: &[(&str, &str)] = &[
    ("cpu_offloading", "activation and weight offload to the CPU"),
    ("fp8_param_gather", "FP8 parameters gathered by the distributed optimizer"),
    ("enable_cuda_graph", "CUDA graphs"),
    ("defer_embedding_wgrad_compute", "the embedding's weight gradient deferred"),
    ("decoder_first_pipeline_num_layers", "an uneven first pipeline stage"),
    ("decoder_last_pipeline_num_layers", "an uneven last pipeline stage"),
    ("account_for_embedding_in_pipeline_split", "the embedding counted as a layer in the pipeline split"),
    ("account_for_loss_in_pipeline_split", "the loss counted as a layer in the pipeline split"),
    ("distribute_saved_activations", "checkpointed activations split over the tensor-parallel group"),
    ("use_torch_fsdp2", "PyTorch FSDP2 in place of Megatron's DDP"),
    ("use_custom_fsdp", "Megatron's FSDP"),
    ("fp16_lm_cross_entropy", "the loss in 16 bits"),
    ("apply_residual_connection_post_layernorm", "a post-norm residual"),
    ("rampup_batch_size", "the batch-size ramp-up (the full global batch is simulated)"),
];

/// The arguments as a map from Megatron's underscored names to their text ("true" for a
/// flag given without a value).
pub fn parse_args(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut m = BTreeMap::new();
    let log = text.lines().any(|l| l.contains(" ....") || l.contains(" ...."));
    if log {
        for l in text.lines() {
            // `  num_layers ...................................... 32`
            let l = l.trim();
            let Some((k, rest)) = l.split_once(' ') else { continue };
            let rest = rest.trim_start();
            if !rest.starts_with("..") || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let v = rest.trim_start_matches('.').trim();
            m.insert(k.to_string(), v.to_string());
        }
        return Ok(m);
    }
    // Comments dropped, line continuations and a bash array's parentheses are no words.
    let words: Vec<&str> = text
        .lines()
        .flat_map(|l| l.split('#').next().unwrap_or("").split_whitespace())
        .filter(|w| !["\\", "(", ")"].contains(w))
        .collect();
    // The training script after the launcher's flags is no flag's value.
    let is_value = |w: &str| !w.starts_with("--") && !w.ends_with(".py");
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        let Some(name) = w.strip_prefix("--") else {
            i += 1;
            continue; // the launcher and script before the first flag
        };
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(unquote(v).to_string())),
            None => (name, None),
        };
        let key = name.replace('-', "_");
        let value = match inline {
            Some(v) => v,
            None => {
                // A flag's values run to the next flag (`--recompute-modules core_attn mlp`).
                let mut vals = Vec::new();
                while i + 1 < words.len() && is_value(words[i + 1]) {
                    i += 1;
                    vals.push(unquote(words[i]));
                }
                if vals.is_empty() {
                    "true".to_string()
                } else {
                    vals.join(" ")
                }
            }
        };
        if m.insert(key.clone(), value).is_some() {
            return Err(format!("--{name} is given twice"));
        }
        i += 1;
    }
    Ok(m)
}

/// A list flag's names (`core_attn mlp`, or a log's Python list `['core_attn', 'mlp']`) as
/// TOML strings.
fn toml_names(list: &str) -> Vec<String> {
    names(list).into_iter().map(|s| format!("\"{s}\"")).collect()
}

/// A list flag's words, the log's Python list brackets, commas and quotes dropped.
fn names(list: &str) -> Vec<&str> {
    list.trim_matches(|c| c == '[' || c == ']')
        .split([' ', ','])
        .map(|s| s.trim_matches('\'').trim_matches('"'))
        .filter(|s| !s.is_empty())
        .collect()
}

/// The auxiliary losses Megatron-Core's router computes (`router.py` `get_aux_loss_coeff`):
/// each `--moe-router-load-balancing-type` (default aux_loss; a list pairs with a list of
/// `--moe-aux-loss-coeff`, default 0) whose coefficient is above 0. Returns the losses and
/// what the import says of them.
fn aux_losses(types: Option<&str>, coeffs: Option<&str>) -> Result<(Vec<String>, String), (&'static str, String)> {
    let types = types.map_or(vec!["aux_loss"], names);
    let coeffs = coeffs.map_or(Ok(vec![0.0]), |c| {
        names(c)
            .into_iter()
            .map(|x| x.parse::<f64>().ok().filter(|f| f.is_finite() && *f >= 0.0).ok_or(x))
            .collect::<Result<Vec<f64>, &str>>()
            .map_err(|x| ("moe_aux_loss_coeff", format!("must be numbers >= 0, got \"{x}\"")))
    })?;
    if types.len() != coeffs.len() {
        return Err((
            "moe_aux_loss_coeff",
            format!(
                "gives {} coefficients for {} load-balancing types ({}): one each",
                coeffs.len(),
                types.len(),
                types.join(", ")
            ),
        ));
    }
    let losses: Vec<String> = types
        .iter()
        .zip(&coeffs)
        .filter(|(t, c)| **c > 0.0 && crate::model::AuxLoss::MEGATRON_TYPES.contains(t))
        .map(|(t, _)| t.to_string())
        .collect();
    let said = types.iter().zip(&coeffs).map(|(t, c)| format!("{t} {c}")).collect::<Vec<_>>().join(", ");
    Ok((losses, said))
}

/// A word without the shell's quotes around it (`'([0]*1+[1]*15)'`, or a quoted value's
/// first and last words).
fn unquote(w: &str) -> &str {
    w.trim_matches(|c| c == '\'' || c == '"')
}

pub fn import(file: &str, text: &str, a: &MegatronArgs) -> Result<Import, ImportError> {
    let err = |key: &str, msg: String| ImportError { file: file.to_string(), key: key.to_string(), message: msg };
    let m = parse_args(text).map_err(|e| err("", e))?;
    let from_log = text.lines().any(|l| l.contains(" ...."));
    if m.is_empty() {
        return Err(err(
            "",
            "no Megatron arguments found (give the command line, or the `arguments` block of a training log)".into(),
        ));
    }
    let mut im = Import::default();
    let mut used: Vec<&str> = Vec::new();
    let mut get = |k: &'static str| -> Option<String> {
        used.push(k);
        m.get(k).filter(|v| !unset(v)).cloned()
    };
    let flag = |v: Option<String>| v.as_deref().is_some_and(is_true);
    let num = |k: &str, v: Option<String>| -> Result<Option<u64>, ImportError> {
        v.map(|v| {
            v.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| err(k, format!("must be a positive whole number, got \"{v}\"")))
        })
        .transpose()
    };
    let req = |k: &str, v: Option<u64>| v.ok_or_else(|| err(k, "is required".into()));
    // --- the architecture
    let layers = req("num_layers", num("num_layers", get("num_layers"))?)?;
    let hidden = req("hidden_size", num("hidden_size", get("hidden_size"))?)?;
    let heads = req("num_attention_heads", num("num_attention_heads", get("num_attention_heads"))?)?;
    let swiglu = flag(get("swiglu"));
    let norm = get("normalization").unwrap_or_else(|| "LayerNorm".into());
    let pos = get("position_embedding_type").unwrap_or_else(|| "learned_absolute".into());
    let no_bias = flag(get("disable_bias_linear")) || get("add_bias_linear").is_some_and(|v| v == "False");
    let untie = flag(get("untie_embeddings_and_output_weights"));
    let llama = norm == "RMSNorm" && swiglu && pos == "rope" && no_bias;
    let gpt = norm == "LayerNorm" && !swiglu && pos == "learned_absolute" && !no_bias;
    if !llama && !gpt {
        return Err(err(
            "normalization",
            format!("normalization {norm}, swiglu {swiglu}, position_embedding_type {pos}, biases {}: stepsim's blocks are GPT-style (LayerNorm, GELU, learned_absolute, biases) or Llama-style (RMSNorm, --swiglu, rope, --disable-bias-linear)", !no_bias),
        ));
    }
    let family = if llama { "llama" } else { "gpt" };
    im.mapped.push(format!(
        "architecture: {family} family ({norm}, {}, {pos}, {})",
        if swiglu { "SwiGLU" } else { "GELU" },
        if no_bias { "no linear biases" } else { "linear biases" }
    ));
    let ffn = match num("ffn_hidden_size", get("ffn_hidden_size"))? {
        Some(f) => f,
        // arguments.py: 4h, and with --swiglu int(4h x 2/3) rounded up to a multiple of 64.
        None if swiglu => u64::try_from((4 * hidden as u128 * 2 / 3).div_ceil(64) * 64).unwrap_or(u64::MAX),
        None => hidden.saturating_mul(4),
    };
    let kv = if flag(get("group_query_attention")) {
        num("num_query_groups", get("num_query_groups"))?.unwrap_or(1)
    } else {
        heads
    };
    // MLA's head widths are its own flags (--qk-head-dim, --v-head-dim).
    let head_dim = num("kv_channels", get("kv_channels"))?
        .filter(|&d| d as u128 * heads as u128 != hidden as u128 && !flag(m.get("multi_latent_attention").cloned()));
    if let (Some(d), false) = (head_dim, llama) {
        return Err(err(
            "kv_channels",
            format!("{d}: stepsim's GPT-style blocks have heads of hidden_size / num_attention_heads = {} (the scenario's model.head_dim is for Llama-style blocks); leave --kv-channels out or at that width", hidden / heads),
        ));
    }
    // `--vocab-size` is the tokenizer's (NullTokenizer's, TikTokenizer's); Megatron pads it to
    // a multiple of --make-vocab-size-divisible-by x the tensor-parallel size
    // (`vocab_size_with_padding`, megatron/core/tokenizers/utils/build_tokenizer.py).
    let tp = num("tensor_model_parallel_size", get("tensor_model_parallel_size"))?.unwrap_or(1);
    let divisible = num("make_vocab_size_divisible_by", get("make_vocab_size_divisible_by"))?.unwrap_or(128);
    let vocab = match (
        a.vocab,
        num("padded_vocab_size", get("padded_vocab_size"))?,
        num("vocab_size", get("vocab_size"))?,
    ) {
        (Some(v), _, _) | (None, Some(v), _) => v,
        (None, None, Some(v)) => {
            let multiple = divisible.saturating_mul(tp);
            let padded = v.div_ceil(multiple).saturating_mul(multiple);
            if padded != v {
                im.mapped.push(format!(
                        "vocabulary: --vocab-size {v} padded to {padded}, a multiple of {divisible} x tensor {tp} (Megatron's vocab_size_with_padding)"
                    ));
            }
            padded
        }
        (None, None, None) => {
            return Err(err(
                "padded_vocab_size",
                "the vocabulary comes from the tokenizer: give --vocab (the padded size Megatron prints)".into(),
            ))
        }
    };
    let seq = req("seq_length", num("seq_length", get("seq_length"))?)?;
    let max_pos = num("max_position_embeddings", get("max_position_embeddings"))?.unwrap_or(seq);
    let dropout = get("hidden_dropout").and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.1);
    // One dropout rate serves both; attention's matters only where the scores are
    // materialised (--attention-backend unfused).
    let attention_dropout = get("attention_dropout").and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.1);
    if attention_dropout != dropout {
        im.not_expressed.push(format!(
            "--attention-dropout {attention_dropout}: simulated at --hidden-dropout's {dropout} (one rate for both)"
        ));
    }
    let mut model = format!("family = \"{family}\"\nn_layers = {layers}\nhidden = {hidden}\nn_heads = {heads}\nffn_hidden = {ffn}\nvocab = {vocab}\nmax_seq_len = {max_pos}\ntie_embeddings = {}\ndropout = {dropout}\n", !untie);
    if kv != heads {
        model.push_str(&format!("n_kv_heads = {kv}\n"));
    }
    if let Some(d) = head_dim {
        model.push_str(&format!("head_dim = {d}\n"));
    }
    if flag(get("add_qkv_bias")) {
        model.push_str("qkv_bias = true\n");
    }
    let qk_layernorm = flag(get("qk_layernorm"));
    // Multi-head latent attention, at arguments.py's defaults where a flag is absent
    // (--q-lora-rank None: a direct query projection; --kv-lora-rank 32).
    let mut mla = String::new();
    if flag(get("multi_latent_attention")) {
        if !llama {
            return Err(err("multi_latent_attention", "multi-head latent attention is simulated in Llama-style blocks (RMSNorm, --swiglu, rope, --disable-bias-linear)".into()));
        }
        let q = num("q_lora_rank", get("q_lora_rank"))?.unwrap_or(0);
        let kv = num("kv_lora_rank", get("kv_lora_rank"))?.unwrap_or(32);
        let nope = num("qk_head_dim", get("qk_head_dim"))?.unwrap_or(128);
        let rope = num("qk_pos_emb_head_dim", get("qk_pos_emb_head_dim"))?.unwrap_or(64);
        let v = num("v_head_dim", get("v_head_dim"))?.unwrap_or(128);
        mla = format!("\n[model.mla]\nq_lora_rank = {q}\nkv_lora_rank = {kv}\nqk_nope_head_dim = {nope}\nqk_rope_head_dim = {rope}\nv_head_dim = {v}\n");
        im.mapped.push(format!(
            "multi-head latent attention: query rank {}, key-value rank {kv}, head dims {nope} + {rope} rotary, values {v}",
            if q == 0 { "none (a direct projection)".to_string() } else { q.to_string() }
        ));
        if !qk_layernorm {
            im.not_expressed.push("multi-head latent attention without --qk-layernorm: simulated with the latents' RMSNorms (DeepSeek's q_a_layernorm / kv_a_layernorm)".into());
        }
    } else if qk_layernorm {
        model.push_str("qk_norm = true\n");
        im.mapped.push("--qk-layernorm: query and key heads normalised".into());
    }
    im.mapped.push(format!("model: {layers} layers, hidden {hidden}, {heads} heads ({kv} query groups), ffn {ffn}, vocab {vocab}, positions {max_pos}, dropout {dropout}"));
    model.push_str(&mla);
    let mut routing = String::new();
    if let Some(e) = num("num_experts", get("num_experts"))? {
        if !llama {
            return Err(err(
                "num_experts",
                format!("{e}: stepsim's experts are SwiGLU MLPs in Llama-style blocks (--normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear); GPT-style (GELU) experts are not simulated"),
            ));
        }
        let k = num("moe_router_topk", get("moe_router_topk"))?.unwrap_or(2);
        let f = num("moe_ffn_hidden_size", get("moe_ffn_hidden_size"))?.unwrap_or(ffn);
        model.push_str(&format!("\n[model.moe]\nnum_experts = {e}\ntop_k = {k}\nexpert_ffn_hidden = {f}\n"));
        im.mapped.push(format!("MoE: {e} experts, top {k}, expert ffn {f}"));
        if let Some(sh) = num("moe_shared_expert_intermediate_size", get("moe_shared_expert_intermediate_size"))? {
            model.push_str(&format!("shared_expert_ffn_hidden = {sh}\n"));
            im.mapped.push(format!("shared experts of ffn {sh}"));
        }
        // What stepsim's experts are: grouped GEMMs (TEGroupedMLP) and an FP32 router.
        if flag(get("moe_grouped_gemm")) {
            im.mapped.push("--moe-grouped-gemm: the experts' GEMMs grouped (as simulated)".into());
        } else {
            im.not_expressed.push(
                "the experts as Megatron's SequentialMLP (no --moe-grouped-gemm): simulated as grouped GEMMs".into(),
            );
        }
        if flag(get("moe_permute_fusion")) {
            im.mapped.push(
                "--moe-permute-fusion: Transformer Engine's fused permutation, one pass over the copies that saves only its map (as simulated)"
                    .into(),
            );
        }
        if let Some(d) = get("moe_router_dtype") {
            if d == "fp32" {
                im.mapped.push("--moe-router-dtype fp32: the router's scores in FP32 (as simulated)".into());
            } else {
                im.not_expressed.push(format!("--moe-router-dtype {d}: the router simulated in FP32"));
            }
        }
        if let Some(freq) = get("moe_layer_freq") {
            let pattern = moe_layer_pattern(&freq, layers).map_err(|e| err("moe_layer_freq", e))?;
            let lines = pattern_fields(&pattern, &freq);
            if !lines.is_empty() {
                model.push_str(&lines);
                im.mapped.push(format!("MoE layer pattern {freq}"));
            }
        }
        let groups = num("moe_router_num_groups", get("moe_router_num_groups"))?;
        let group_topk = num("moe_router_group_topk", get("moe_router_group_topk"))?;
        if let Some(g) = groups {
            model.push_str(&format!("router_groups = {g}\n"));
            if let Some(gk) = group_topk {
                model.push_str(&format!("router_group_topk = {gk}\n"));
            }
            im.mapped.push(format!("group-limited routing: {} of {g} groups", group_topk.unwrap_or(g)));
        }
        // The flex dispatcher on DeepEP (`--moe-flex-dispatcher-backend deepep`, or the older
        // `--moe-enable-deepep`).
        let flex = get("moe_token_dispatcher_type").as_deref() == Some("flex");
        let backend = get("moe_flex_dispatcher_backend");
        if flex && (backend.as_deref() == Some("deepep") || flag(get("moe_enable_deepep"))) {
            routing.push_str("dispatcher = \"deepep\"\n");
            let sms = get("moe_flex_dispatcher_num_sms").or_else(|| get("moe_deepep_num_sms"));
            if let Some(n) = num("moe_flex_dispatcher_num_sms", sms)? {
                routing.push_str(&format!("deepep_sms = {n}\n"));
            }
            im.mapped.push("--moe-token-dispatcher-type flex on DeepEP".into());
        } else if flex {
            im.not_expressed.push(format!(
                "--moe-token-dispatcher-type flex on {}: simulated as the all-to-all dispatcher (DeepEP is the flex backend stepsim models)",
                backend.as_deref().unwrap_or("its default backend")
            ));
        }
        let (losses, said) =
            aux_losses(get("moe_router_load_balancing_type").as_deref(), get("moe_aux_loss_coeff").as_deref())
                .map_err(|(k, m)| err(k, m))?;
        if losses.is_empty() {
            im.mapped.push(format!("load balancing {said}: no auxiliary loss computed"));
        } else {
            let list = losses.iter().map(|l| format!("\"{l}\"")).collect::<Vec<_>>().join(", ");
            routing.push_str(&format!("aux_loss = [{list}]\n"));
            im.mapped.push(format!("auxiliary load-balancing loss ({said}): its FP32 scores saved and its counts all-reduced per MoE block"));
        }
        if let Some(c) = get("moe_expert_capacity_factor") {
            let c: f64 =
                c.parse().ok().filter(|x: &f64| x.is_finite() && *x > 0.0).ok_or_else(|| {
                    err("moe_expert_capacity_factor", format!("must be a positive number, got \"{c}\""))
                })?;
            routing.push_str(&format!("capacity_factor = {c}\n"));
            im.mapped.push(format!("capacity factor {c} (token dropping)"));
            if flag(get("moe_pad_expert_input_to_capacity")) {
                routing.push_str("pad_to_capacity = true\n");
                im.mapped.push("experts padded to their capacity".into());
            }
        }
    }
    // Multi-token prediction (`--mtp-num-layers`, `--mtp-loss-scaling-factor`, whose
    // default 0.1 every log prints; read only with modules to scale).
    let mtp_scale = get("mtp_loss_scaling_factor");
    if let Some(d) = num("mtp_num_layers", get("mtp_num_layers"))? {
        model.push_str(&format!("\n[model.mtp]\nlayers = {d}\n"));
        let scale = match mtp_scale {
            Some(x) => {
                let f: f64 =
                    x.parse().ok().filter(|f: &f64| f.is_finite() && *f > 0.0).ok_or_else(|| {
                        err("mtp_loss_scaling_factor", format!("must be a positive number, got \"{x}\""))
                    })?;
                model.push_str(&format!("loss_scale = {f}\n"));
                f
            }
            None => 0.1,
        };
        im.mapped.push(format!("multi-token prediction: {d} module(s), loss scale {scale}"));
    }
    // --- the layout
    let pp = num("pipeline_model_parallel_size", get("pipeline_model_parallel_size"))?.unwrap_or(1);
    let cp = num("context_parallel_size", get("context_parallel_size"))?.unwrap_or(1);
    let ep = num("expert_model_parallel_size", get("expert_model_parallel_size"))?.unwrap_or(1);
    // `--expert-tensor-parallel-size`, whose default is the tensor-parallel size
    // (`arguments.py` `validate_args`), as the scenario's `expert_tensor` defaults.
    let etp = num("expert_tensor_parallel_size", get("expert_tensor_parallel_size"))?;
    let moe = m.get("num_experts").is_some_and(|v| !unset(v));
    // torchrun's --nproc_per_node x --nnodes, where the command line has the launcher.
    let launched = match (num("nproc_per_node", get("nproc_per_node"))?, num("nnodes", get("nnodes"))?) {
        (Some(p), n) => Some(p.saturating_mul(n.unwrap_or(1))),
        _ => None,
    };
    let gpus = match (a.gpus, num("world_size", get("world_size"))?.or(launched)) {
        (Some(g), Some(w)) if g != w => {
            return Err(err("world_size", format!("the arguments give {w} GPUs, --gpus {g}")))
        }
        (Some(g), _) | (None, Some(g)) => g,
        (None, None) => {
            return Err(err(
                "world_size",
                "not in the arguments (no log world_size, no torchrun --nproc_per_node): give --gpus".into(),
            ))
        }
    };
    if gpus == 0 {
        return Err(err("world_size", "a job needs at least one GPU: give --gpus 1 or more".into()));
    }
    let mp = (tp as u128 * pp as u128).saturating_mul(cp as u128);
    if gpus as u128 % mp != 0 {
        // The key at which the product stops dividing the GPUs.
        return Err(err(
            if gpus % tp != 0 {
                "tensor_model_parallel_size"
            } else if gpus as u128 % (tp as u128 * pp as u128) != 0 {
                "pipeline_model_parallel_size"
            } else {
                "context_parallel_size"
            },
            format!("tensor {tp} x pipeline {pp} x context {cp} = {mp} does not divide {gpus} GPUs"),
        ));
    }
    let dp = (gpus as u128 / mp) as u64;
    let zero1 = flag(get("use_distributed_optimizer"));
    let mut par = format!("framework = \"megatron\"\nsharding = \"{}\"\n", if zero1 { "zero1" } else { "none" });
    if tp > 1 {
        par.push_str(&format!("tensor = {tp}\n"));
    }
    if flag(get("sequence_parallel")) {
        par.push_str("sequence_parallel = true\n");
    }
    let layout = get("pipeline_model_parallel_layout");
    if pp > 1 {
        // Model chunks per pipeline rank: --num-virtual-stages-per-pipeline-rank, or the
        // older --num-layers-per-virtual-pipeline-stage (layers / pp / it), or the layout's.
        let per_stage = num("num_layers_per_virtual_pipeline_stage", get("num_layers_per_virtual_pipeline_stage"))?;
        let mut chunks = match num("num_virtual_stages_per_pipeline_rank", get("num_virtual_stages_per_pipeline_rank"))?
        {
            Some(v) => Some(v),
            None => per_stage.map(|v| layers / pp / v),
        };
        let mut stage_layers = String::new();
        if let Some(l) = &layout {
            let mtp = m.get("mtp_num_layers").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let split = pipeline_layout(l, pp, layers, mtp).map_err(|e| err("pipeline_model_parallel_layout", e))?;
            chunks = Some(split.len() as u64 / pp);
            let list: Vec<String> = split.iter().map(u64::to_string).collect();
            stage_layers = format!("stage_layers = [{}]\n", list.join(", "));
            im.mapped.push(format!(
                "--pipeline-model-parallel-layout {l}: decoder layers per virtual stage {}",
                list.join(", ")
            ));
        }
        match chunks.filter(|&c| c > 1) {
            Some(chunks) => {
                par.push_str(&format!("pipeline = {pp}\nschedule = \"interleaved-1f1b\"\nvirtual_stages = {chunks}\n"))
            }
            None => par.push_str(&format!("pipeline = {pp}\nschedule = \"1f1b\"\n")),
        }
        par.push_str(&stage_layers);
    } else if let Some(l) = &layout {
        im.ignored.push(format!("pipeline_model_parallel_layout {l} (no pipeline)"));
    }
    if cp > 1 {
        par.push_str(&format!("context = {cp}\n"));
    }
    if ep > 1 {
        par.push_str(&format!("expert = {ep}\n"));
    }
    let etp = match etp {
        Some(e) if moe => {
            if e != tp {
                par.push_str(&format!("expert_tensor = {e}\n"));
            }
            e
        }
        Some(_) => {
            // Without experts the flag splits nothing (a log prints it at the tensor size).
            im.ignored.push("expert_tensor_parallel_size".into());
            1
        }
        None if moe => tp,
        None => 1,
    };
    im.mapped.push(format!(
        "layout: tensor {tp} x pipeline {pp} x context {cp} x data {dp} = {gpus} GPUs{}{}{}",
        if ep > 1 { format!(", expert {ep}") } else { String::new() },
        if etp > 1 { format!(", expert tensor {etp}") } else { String::new() },
        if zero1 { ", distributed optimizer (ZeRO-1)" } else { "" }
    ));
    let mut mg = String::new();
    for k in ["overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "overlap_moe_expert_parallel_comm"] {
        if flag(get(k)) {
            mg.push_str(&format!("{k} = true\n"));
            im.mapped.push(format!("--{}", k.replace('_', "-")));
        }
    }
    // --fine-grained-activation-offloading with --offload-modules (a list, or a log's Python
    // list) and --min-offloaded-tensor-size.
    if flag(get("fine_grained_activation_offloading")) {
        let list = toml_names(&get("offload_modules").unwrap_or_default());
        mg.push_str(&format!("offload_modules = [{}]\n", list.join(", ")));
        im.mapped.push(format!(
            "--fine-grained-activation-offloading --offload-modules {}",
            list.join(" ").replace('"', "")
        ));
        if let Some(n) = num("min_offloaded_tensor_size", get("min_offloaded_tensor_size"))? {
            mg.push_str(&format!("min_offloaded_tensor_size = {n}\n"));
        }
        if let Some(f) = get("activation_offload_fraction").filter(|f| f.parse::<f64>().ok() != Some(1.0)) {
            let x: f64 = f.parse().map_err(|_| {
                err("activation_offload_fraction", format!("must be a number from 0 to 1, got \"{f}\""))
            })?;
            mg.push_str(&format!("activation_offload_fraction = {x}\n"));
            im.mapped.push(format!("--activation-offload-fraction {x}"));
        }
        if let Some(d) = get("delta_offload_bytes_across_pp_ranks").filter(|d| d != "0") {
            im.not_expressed.push(format!(
                "--delta-offload-bytes-across-pp-ranks {d}: every pipeline rank simulated as offloading alike"
            ));
        }
    } else {
        for k in [
            "offload_modules",
            "min_offloaded_tensor_size",
            "activation_offload_fraction",
            "delta_offload_bytes_across_pp_ranks",
        ] {
            if get(k).is_some() {
                im.ignored.push(format!("{k} (without --fine-grained-activation-offloading)"));
            }
        }
    }
    // --use-precision-aware-optimizer and its dtypes ("bf16" on the command line,
    // "torch.bfloat16" in a log; FP8 states are torch.uint8 there).
    let aware = flag(get("use_precision_aware_optimizer"));
    if aware {
        mg.push_str("use_precision_aware_optimizer = true\n");
        im.mapped.push("--use-precision-aware-optimizer".into());
    }
    if flag(get("activation_func_fp8_input_store")) {
        mg.push_str("activation_func_fp8_input_store = true\n");
        im.mapped.push("--activation-func-fp8-input-store: each fused SwiGLU saves its input in FP8".into());
    }
    let mut main_grads_bf16 = false;
    for k in ["main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"] {
        let Some(d) = get(k) else { continue };
        let d = match d.trim_start_matches("torch.") {
            "float32" | "fp32" => "fp32",
            "bfloat16" | "bf16" => "bf16",
            "float16" | "fp16" => "fp16",
            "uint8" | "fp8" => "fp8",
            other => return Err(err(k, format!("unknown dtype \"{other}\"; allowed: fp32, bf16, fp16, fp8"))),
        };
        main_grads_bf16 |= k == "main_grads_dtype" && d == "bf16";
        if aware && d != "fp32" {
            mg.push_str(&format!("{k} = \"{d}\"\n"));
            im.mapped.push(format!("--{} {d}", k.replace('_', "-")));
        }
    }
    // --- the step
    let micro = num("micro_batch_size", get("micro_batch_size"))?.unwrap_or(1);
    let per_step = micro as u128 * dp as u128;
    let global = num("global_batch_size", get("global_batch_size"))?.unwrap_or(micro.saturating_mul(dp));
    if global as u128 % per_step != 0 {
        return Err(err(
            "global_batch_size",
            format!("{global} is not a multiple of micro_batch_size {micro} x data-parallel size {dp}"),
        ));
    }
    let accum = (global as u128 / per_step) as u64;
    im.mapped.push(format!("batch: micro {micro} x {accum} micro-batches x data-parallel {dp} = global {global}"));
    let (bf16, fp16) = (flag(get("bf16")), flag(get("fp16")));
    // `validate_args` (since 2021, arguments.py): with --bf16, gradients accumulate and are
    // all-reduced in FP32 unless --grad-reduce-in-bf16 (or a bf16 --main-grads-dtype) says
    // otherwise. A log prints the value after that rule; a command line leaves it to it.
    let printed_acc = flag(get("accumulate_allreduce_grads_in_fp32"));
    let grad_reduce_in_bf16 = flag(get("grad_reduce_in_bf16"));
    let implied = bf16 && !from_log && !grad_reduce_in_bf16 && !main_grads_bf16;
    let fp32_acc = printed_acc || implied;
    let (preset, extra) = match (bf16, fp16) {
        (true, true) => return Err(err("fp16", "bf16 and fp16 together".into())),
        (true, false) if fp32_acc => ("bf16-mixed-adam-fp32-grads", ""),
        (true, false) => ("bf16-mixed-adam", ""),
        (false, true) => {
            ("bf16-mixed-adam", "param_dtype = \"fp16\"\ncompute_dtype = \"fp16\"\ngrad_dtype = \"fp16\"\n")
        }
        (false, false) => ("fp32", ""),
    };
    im.mapped.push(format!(
        "precision: {}{}: preset {preset}",
        if bf16 {
            "--bf16"
        } else if fp16 {
            "--fp16"
        } else {
            "FP32"
        },
        if printed_acc {
            " --accumulate-allreduce-grads-in-fp32"
        } else if implied {
            " (Megatron accumulates and all-reduces gradients in FP32 for --bf16 unless --grad-reduce-in-bf16)"
        } else {
            ""
        }
    ));
    let mut training =
        format!("micro_batch = {micro}\nseq_len = {seq}\ngrad_accum = {accum}\nprecision = \"{preset}\"\n{extra}");
    // Older Megatron's names: --checkpoint-activations (full) and --recompute-activations
    // (selective).
    let granularity = get("recompute_granularity").or_else(|| {
        if flag(get("checkpoint_activations")) {
            Some("full".into())
        } else if flag(get("recompute_activations")) {
            Some("selective".into())
        } else {
            None
        }
    });
    match granularity.as_deref() {
        None => training.push_str("activation_checkpointing = \"none\"\n"),
        Some("full") => {
            training.push_str("activation_checkpointing = \"full\"\n");
            if let Some(method) = get("recompute_method") {
                training.push_str(&format!("recompute_method = \"{method}\"\n"));
            }
            if let Some(n) = num("recompute_num_layers", get("recompute_num_layers"))? {
                training.push_str(&format!("recompute_num_layers = {n}\n"));
            }
            im.mapped.push("--recompute-granularity full".into());
        }
        Some("selective") => {
            training.push_str("activation_checkpointing = \"selective\"\n");
            if let Some(mods) = get("recompute_modules") {
                let list = toml_names(&mods);
                training.push_str(&format!("recompute_modules = [{}]\n", list.join(", ")));
            }
            im.mapped.push("--recompute-granularity selective".into());
        }
        Some(x) => return Err(err("recompute_granularity", format!("must be full or selective, got \"{x}\""))),
    }
    let clip = get("clip_grad").and_then(|v| v.parse::<f64>().ok()).unwrap_or(1.0);
    training.push_str(&format!("clip_grad_norm = {}\n", clip > 0.0));
    match get("optimizer").as_deref() {
        None | Some("adam") => training.push_str("optimizer = \"adamw\"\n"),
        Some("sgd") => training.push_str("optimizer = \"sgd\"\n"),
        Some(x) => im.not_expressed.push(format!("optimizer {x}: AdamW simulated")),
    }
    let mut fp8 = String::new();
    if let Some(f) = get("fp8_format").or_else(|| get("fp8")) {
        if f != "false" && f != "False" {
            // --fp8-recipe (Megatron's default "delayed"); its "tensorwise" is Transformer
            // Engine's per-tensor current scaling, simulated as delayed scaling's GEMMs and
            // saves without the history.
            let recipe = get("fp8_recipe").unwrap_or_else(|| "delayed".into());
            let (name, what) = match recipe.as_str() {
                "delayed" => ("delayed", "delayed scaling"),
                "blockwise" => ("blockwise", "block scaling (Float8BlockScaling)"),
                "mxfp8" => ("mxfp8", "MXFP8 (MXFP8BlockScaling)"),
                "tensorwise" => {
                    im.not_expressed.push(
                        "--fp8-recipe tensorwise (Transformer Engine's per-tensor current scaling): simulated as delayed scaling".into(),
                    );
                    ("delayed", "per-tensor current scaling, as delayed scaling")
                }
                other => {
                    return Err(err(
                        "fp8_recipe",
                        format!("must be delayed, tensorwise, blockwise or mxfp8 (a custom recipe is not simulated), got \"{other}\""),
                    ))
                }
            };
            fp8.push_str(&format!("recipe = \"{name}\"\n"));
            if name == "delayed" {
                if let Some(h) = num("fp8_amax_history_len", get("fp8_amax_history_len"))? {
                    fp8.push_str(&format!("amax_history_len = {h}\n"));
                }
            }
            if flag(get("no_fp8_wgrad")) {
                fp8.push_str("wgrad = false\n");
            }
            im.mapped.push(format!("FP8 ({f}): Transformer Engine {what}"));
        }
    }
    // --cross-entropy-loss-fusion: fused_vocab_parallel_cross_entropy saves the same FP32
    // exponentiated logits as the unfused vocab_parallel_cross_entropy (fusions/
    // fused_cross_entropy.py), which is the loss a Megatron scenario simulates.
    if flag(get("cross_entropy_loss_fusion")) {
        match get("cross_entropy_fusion_impl").as_deref() {
            None | Some("native") => im.mapped.push("--cross-entropy-loss-fusion: Megatron-Core's fused vocab-parallel cross-entropy (the FP32 exponentiated logits saved, as unfused)".into()),
            Some(x) => im.not_expressed.push(format!("--cross-entropy-fusion-impl {x}: simulated as Megatron-Core's native fused vocab-parallel cross-entropy")),
        }
    }
    // --attention-backend (AttnBackend): unfused and local are Megatron's own
    // DotProductAttention, which materialises and saves the softmax of the scores.
    let attention = match get("attention_backend").as_deref() {
        None => {
            im.assumed.push("attention: flash (Megatron-Core's fused attention, --attention-backend auto)".into());
            "flash"
        }
        Some("auto" | "flash" | "fused" | "AttnBackend.auto" | "AttnBackend.flash" | "AttnBackend.fused") => {
            im.mapped.push("--attention-backend: a fused (flash) attention kernel".into());
            "flash"
        }
        Some("unfused" | "local" | "AttnBackend.unfused" | "AttnBackend.local") => {
            im.mapped
                .push("--attention-backend unfused: Megatron's DotProductAttention, its scores' softmax saved".into());
            "math"
        }
        Some(x) => {
            return Err(err("attention_backend", format!("must be auto, flash, fused, unfused or local, got \"{x}\"")))
        }
    };
    // --- what is left
    for (k, v) in &m {
        if used.contains(&k.as_str()) || NO_EFFECT.contains(&k.as_str()) {
            if NO_EFFECT.contains(&k.as_str()) && !used.contains(&k.as_str()) {
                im.ignored.push(k.clone());
            }
            continue;
        }
        if unset(v) || v == "False" || v == "false" || v == "0" {
            continue;
        }
        match WATCH.iter().find(|w| w.0 == k) {
            Some((_, what)) => im.not_expressed.push(format!("{k} = {v}: {what}")),
            // A log prints every argument at its value, defaults included: only the watched
            // ones are named; a command line names what the user set.
            None if !from_log => im.not_expressed.push(format!("--{} {v}: not read by stepsim", k.replace('_', "-"))),
            None => {}
        }
    }
    record_origins(&mut im, &m, a);
    let mut s = format!(
        "description = {}\n\n[model]\n{model}\n[hardware]\ngpu = {}\ngpus = {gpus}\n",
        super::quote(&format!("Megatron-LM job imported from {file}")),
        super::quote(&a.gpu)
    );
    if let Some(n) = a.gpus_per_node {
        s.push_str(&format!("gpus_per_node = {n}\n"));
    }
    s.push_str(&format!("\n[parallel]\n{par}\n[training]\n{training}attention = \"{attention}\"\n"));
    if !mg.is_empty() {
        s.push_str(&format!("\n[megatron]\n{mg}"));
    }
    if !fp8.is_empty() {
        s.push_str(&format!("\n[fp8]\n{fp8}"));
    }
    if !routing.is_empty() {
        s.push_str(&format!("\n[moe]\n{routing}"));
    }
    im.toml = s;
    Ok(im)
}

/// `--pipeline-model-parallel-layout` as Megatron-Core parses it (`PipelineParallelLayerLayout.
/// parse_str_to_list` and `validate_layer_layout`, megatron/core/transformer/
/// pipeline_parallel_layer_layout.py): commas dropped, `(...)*n` then `x*n` unrolled, `|`
/// between virtual stages in model order, `E` embedding, `t` a decoder layer, `m` an MTP
/// layer, `L` the loss. Returns the decoder layers per virtual stage; the embedding must open
/// the first and the loss close the last, and the MTP layers must sit with the loss (where
/// stepsim runs them).
pub fn pipeline_layout(layout: &str, pp: u64, layers: u64, mtp: u64) -> Result<Vec<u64>, String> {
    let mut s: String = layout.chars().filter(|&c| c != ',' && !c.is_whitespace()).collect();
    // `(...)*n`: each group to the first `)` after its `(`.
    while let Some(open) = s.find('(') {
        let close = s[open..].find(')').map(|c| open + c).ok_or_else(|| format!("`(` without `)` in {layout}"))?;
        let rest = &s[close + 1..];
        let digits: String =
            rest.strip_prefix('*').map(|r| r.chars().take_while(char::is_ascii_digit).collect()).unwrap_or_default();
        let n: usize = digits.parse().map_err(|_| format!("`(...)` must be followed by `*n` in {layout}"))?;
        let body = s[open + 1..close].to_string();
        s = format!("{}{}{}", &s[..open], body.repeat(n), &rest[1 + digits.len()..]);
    }
    // `x*n`.
    let mut out = String::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if chars.get(i + 1) == Some(&'*') {
            let digits: String = chars[i + 2..].iter().take_while(|d| d.is_ascii_digit()).collect();
            let n: usize = digits.parse().map_err(|_| format!("`{c}*` must be followed by a count in {layout}"))?;
            out.extend(std::iter::repeat_n(c, n));
            i += 2 + digits.len();
        } else {
            out.push(c);
            i += 1;
        }
    }
    let stages: Vec<&str> = out.split('|').collect();
    if let Some(bad) = out.chars().find(|c| !"ELtm|".contains(*c)) {
        return Err(format!("`{bad}` is not a layer (E, t, m, L) in {layout}"));
    }
    if stages.len() as u64 % pp != 0 {
        return Err(format!("{} stages in {layout}, not a multiple of pipeline {pp}", stages.len()));
    }
    let count = |c: char| out.chars().filter(|&x| x == c).count() as u64;
    if !out.starts_with('E') || count('E') != 1 || !out.ends_with('L') || count('L') != 1 {
        return Err(format!("the embedding must open the layout and the loss close it, once each: {layout}"));
    }
    if count('t') != layers {
        return Err(format!("{} decoder layers in {layout}, --num-layers {layers}", count('t')));
    }
    let last = stages[stages.len() - 1];
    if count('m') != mtp || last.chars().filter(|&c| c == 'm').count() as u64 != mtp {
        return Err(format!("{layout} places {} MTP layers ({mtp} in --mtp-num-layers); stepsim runs them in the last stage, with the loss", count('m')));
    }
    Ok(stages.iter().map(|st| st.chars().filter(|&c| c == 't').count() as u64).collect())
}

/// `--moe-layer-freq` as Megatron-Core reads it (`moe_layer_freq` in
/// `megatron/core/transformer/transformer_config.py`): an int N puts a mixture of experts in
/// blocks 0, N, 2N, ...; a Python list expression (`[1,0,1,0]`, `([0]*3+[1]*58)`) gives each
/// block's 1 (MoE) or 0 (dense) and must have one entry per block.
fn moe_layer_pattern(text: &str, layers: u64) -> Result<Vec<bool>, String> {
    if let Ok(n) = text.trim().parse::<u64>() {
        if n == 0 {
            return Err("must be a positive whole number or a list expression, got 0".into());
        }
        return Ok((0..layers).map(|l| l % n == 0).collect());
    }
    let t = text.trim();
    let t = t.strip_prefix('(').and_then(|x| x.strip_suffix(')')).unwrap_or(t);
    let mut out = Vec::new();
    for term in t.split('+') {
        let term = term.trim();
        let (list, times) = match term.split_once('*') {
            Some((l, n)) => (
                l.trim(),
                n.trim().parse::<u64>().map_err(|_| format!("`{term}`: the repeat count must be a whole number"))?,
            ),
            None => (term, 1),
        };
        let inner = list
            .strip_prefix('[')
            .and_then(|x| x.strip_suffix(']'))
            .ok_or_else(|| format!("`{term}` is not a list such as [1,0] or [0]*3"))?;
        let items: Vec<bool> = inner
            .split(',')
            .map(|x| match x.trim() {
                "1" => Ok(true),
                "0" => Ok(false),
                o => Err(format!("`{o}` in `{term}`: each entry is 1 (MoE) or 0 (dense)")),
            })
            .collect::<Result<_, _>>()?;
        if times > 1_000_000 {
            return Err(format!("`{term}`: a repeat count past any model's layers"));
        }
        for _ in 0..times {
            out.extend_from_slice(&items);
        }
    }
    if out.len() as u64 != layers {
        return Err(format!("\"{text}\" gives {} blocks, the model has {layers} (--num-layers)", out.len()));
    }
    if !out.contains(&true) {
        return Err(format!("\"{text}\" makes no block a mixture of experts"));
    }
    Ok(out)
}

/// `[model.moe]` lines for a per-block pattern: `every` for Megatron's int form (blocks 0, N,
/// 2N, ...), else the leading dense blocks and any other dense block listed; nothing when every
/// block is a mixture of experts.
fn pattern_fields(pattern: &[bool], text: &str) -> String {
    if let Ok(n) = text.trim().parse::<u64>() {
        return if n > 1 { format!("every = {n}\n") } else { String::new() };
    }
    let first = pattern.iter().take_while(|&&x| !x).count();
    let rest: Vec<String> =
        pattern.iter().enumerate().skip(first).filter(|(_, &x)| !x).map(|(l, _)| l.to_string()).collect();
    let mut s = String::new();
    if first > 0 {
        s.push_str(&format!("first_dense_layers = {first}\n"));
    }
    if !rest.is_empty() {
        s.push_str(&format!("dense_layers = [{}]\n", rest.join(", ")));
    }
    s
}

/// An argument without a value: a log's `None`, or an empty one.
fn unset(v: &str) -> bool {
    v.is_empty() || v == "None"
}

/// A switch that is on: a command line's bare flag or a log's `True`.
fn is_true(v: &str) -> bool {
    v == "true" || v == "True"
}

/// Where each scenario field took its value (`Import::origins`): the argument by Megatron's
/// own name, or the flag, or the argument a default is derived from.
fn record_origins(im: &mut Import, m: &BTreeMap<String, String>, a: &MegatronArgs) {
    let given = |k: &str| m.get(k).is_some_and(|v| !unset(v));
    for (field, key) in [
        ("model.family", "normalization"),
        ("model.n_layers", "num_layers"),
        ("model.hidden", "hidden_size"),
        ("model.n_heads", "num_attention_heads"),
        ("model.dropout", "hidden_dropout"),
        ("model.tie_embeddings", "untie_embeddings_and_output_weights"),
        ("model.n_kv_heads", "num_query_groups"),
        ("model.head_dim", "kv_channels"),
        ("model.qkv_bias", "add_qkv_bias"),
        ("model.qk_norm", "qk_layernorm"),
        ("model.mla.q_lora_rank", "q_lora_rank"),
        ("model.mla.kv_lora_rank", "kv_lora_rank"),
        ("model.mla.qk_nope_head_dim", "qk_head_dim"),
        ("model.mla.qk_rope_head_dim", "qk_pos_emb_head_dim"),
        ("model.mla.v_head_dim", "v_head_dim"),
        ("model.moe", "num_experts"),
        ("model.moe.num_experts", "num_experts"),
        ("model.moe.top_k", "moe_router_topk"),
        ("model.moe.shared_expert_ffn_hidden", "moe_shared_expert_intermediate_size"),
        ("model.moe.every", "moe_layer_freq"),
        ("model.moe.first_dense_layers", "moe_layer_freq"),
        ("model.moe.dense_layers", "moe_layer_freq"),
        ("model.moe.router_groups", "moe_router_num_groups"),
        ("model.moe.router_group_topk", "moe_router_group_topk"),
        ("model.mtp.layers", "mtp_num_layers"),
        ("model.mtp.loss_scale", "mtp_loss_scaling_factor"),
        ("moe.dispatcher", "moe_token_dispatcher_type"),
        ("moe.deepep_sms", "moe_flex_dispatcher_num_sms"),
        ("moe.aux_loss", "moe_router_load_balancing_type"),
        ("moe.capacity_factor", "moe_expert_capacity_factor"),
        ("moe.pad_to_capacity", "moe_pad_expert_input_to_capacity"),
        ("parallel.sharding", "use_distributed_optimizer"),
        ("parallel.tensor", "tensor_model_parallel_size"),
        ("parallel.sequence_parallel", "sequence_parallel"),
        ("parallel.pipeline", "pipeline_model_parallel_size"),
        ("parallel.schedule", "num_virtual_stages_per_pipeline_rank"),
        ("parallel.virtual_stages", "num_virtual_stages_per_pipeline_rank"),
        ("parallel.stage_layers", "pipeline_model_parallel_layout"),
        ("parallel.context", "context_parallel_size"),
        ("parallel.expert", "expert_model_parallel_size"),
        ("parallel.expert_tensor", "expert_tensor_parallel_size"),
        ("megatron.overlap_grad_reduce", "overlap_grad_reduce"),
        ("megatron.overlap_param_gather", "overlap_param_gather"),
        ("megatron.tp_comm_overlap", "tp_comm_overlap"),
        ("megatron.overlap_moe_expert_parallel_comm", "overlap_moe_expert_parallel_comm"),
        ("megatron.offload_modules", "offload_modules"),
        ("megatron.min_offloaded_tensor_size", "min_offloaded_tensor_size"),
        ("megatron.activation_offload_fraction", "activation_offload_fraction"),
        ("megatron.use_precision_aware_optimizer", "use_precision_aware_optimizer"),
        ("megatron.activation_func_fp8_input_store", "activation_func_fp8_input_store"),
        ("megatron.main_grads_dtype", "main_grads_dtype"),
        ("megatron.main_params_dtype", "main_params_dtype"),
        ("megatron.exp_avg_dtype", "exp_avg_dtype"),
        ("megatron.exp_avg_sq_dtype", "exp_avg_sq_dtype"),
        ("training.micro_batch", "micro_batch_size"),
        ("training.seq_len", "seq_length"),
        ("training.grad_accum", "global_batch_size"),
        ("training.param_dtype", "fp16"),
        ("training.compute_dtype", "fp16"),
        ("training.grad_dtype", "fp16"),
        ("training.activation_checkpointing", "recompute_granularity"),
        ("training.recompute_method", "recompute_method"),
        ("training.recompute_num_layers", "recompute_num_layers"),
        ("training.recompute_modules", "recompute_modules"),
        ("training.clip_grad_norm", "clip_grad"),
        ("training.optimizer", "optimizer"),
        ("training.attention", "attention_backend"),
        ("fp8.recipe", "fp8_recipe"),
        ("fp8.amax_history_len", "fp8_amax_history_len"),
        ("fp8.wgrad", "no_fp8_wgrad"),
    ] {
        im.from_key(field, key);
    }
    // Values a default derives from another argument, or a flag gives.
    let on = |k: &str| m.get(k).is_some_and(|v| is_true(v));
    match (on("bf16"), on("fp16")) {
        (_, true) => im.from_key("training.precision", "fp16"),
        (true, false) => im.from_key("training.precision", "bf16"),
        (false, false) => im.from_text("training.precision", "neither `bf16` nor `fp16` given (FP32)".into()),
    }
    if !given("ffn_hidden_size") {
        im.from_text("model.ffn_hidden", "key `hidden_size` (ffn_hidden_size's default derives from it)".into());
    } else {
        im.from_key("model.ffn_hidden", "ffn_hidden_size");
    }
    if given("moe_ffn_hidden_size") {
        im.from_key("model.moe.expert_ffn_hidden", "moe_ffn_hidden_size");
    } else {
        im.from_text("model.moe.expert_ffn_hidden", "key `ffn_hidden_size` (moe_ffn_hidden_size's default)".into());
    }
    match (a.vocab.is_some(), given("padded_vocab_size")) {
        (true, _) => im.from_flag("model.vocab", "--vocab"),
        (false, true) => im.from_key("model.vocab", "padded_vocab_size"),
        (false, false) => im.from_key("model.vocab", "vocab_size"),
    }
    im.from_key(
        "model.max_seq_len",
        if given("max_position_embeddings") { "max_position_embeddings" } else { "seq_length" },
    );
    match (a.gpus.is_some(), given("world_size")) {
        (true, _) => im.from_flag("hardware.gpus", "--gpus"),
        (false, true) => im.from_key("hardware.gpus", "world_size"),
        (false, false) => im.from_text("hardware.gpus", "keys `nproc_per_node` x `nnodes` (torchrun's)".into()),
    }
    super::flag_origins(im, None);
}
