//! A fuzzer of `stepsim import` (issue 22's contract, for the configs users already have): a
//! DeepSpeed ds_config.json, a Megatron-LM command line or training-log `arguments` block, a
//! torchtitan job TOML and a Hugging Face config.json given as `--model`, each from a fixture
//! with one to three keys set to extreme values, wrong types or values users write, keys
//! removed, unknown or repeated, its bytes damaged, or a flag changed or dropped.
//!
//! Each case runs the real binary within 10 s and 4 GB and must exit 0 or 2 (never a panic's
//! 101). A refused import (exit 2) names the file or flag it refuses and writes nothing. An
//! import that exits 0 has written a scenario that `stepsim check` accepts (src/import says
//! "an import that exits 0 always loads"), byte for byte the same when imported again; one in
//! three is also run, and must exit 0 with a report or, where the job is refused, 2.
//!
//! `cargo test --release --test fuzz_import` runs a short fixed-seed campaign (as CI does);
//! `STEPSIM_FUZZ_IMPORTS=5000 STEPSIM_FUZZ_SEED=7 cargo test --release --test fuzz_import -- --nocapture`
//! runs a long one (`STEPSIM_FUZZ_SHOW=1` prints each case's exit and last line of stderr).

mod common;

use std::path::Path;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use common::fuzzing::{campaign_size, run_bounded};

/// How a config is written.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    Json,
    Toml,
    /// A Megatron command line; one time in three written as the `arguments` block a training
    /// log prints, which the importer also reads.
    Args,
}

/// A config that imports unmutated, with the flags it needs.
struct Base {
    tool: &'static str,
    /// Under the crate's root; for `Hf`, the file given as `--model` (and mutated).
    file: &'static str,
    form: Form,
    flags: &'static [(&'static str, &'static str)],
    /// The mutated file is a Hugging Face config.json passed as `--model` to this base's
    /// config (deepspeed's ZeRO-2 fixture); `file` is then the config.json.
    hf: bool,
}

const DS2: &str = "tests/fixtures/deepspeed/hf_ds_config_zero2.json";
const DS_FLAGS: &[(&str, &str)] = &[
    ("--model", "llama-3.1-8b"),
    ("--gpus", "8"),
    ("--gpu", "h100-sxm"),
    ("--micro-batch", "2"),
    ("--grad-accum", "4"),
    ("--dtype", "bf16"),
];
const FUNCTIONAL_FLAGS: &[(&str, &str)] = &[("--gpu", "h100-sxm"), ("--gpus", "8"), ("--vocab", "50304")];
const TITAN_FLAGS: &[(&str, &str)] = &[("--gpu", "h100-sxm"), ("--gpus", "64")];
/// A sequence of 1,024 tokens, which every zoo model's positions hold (GPT-2's are 1,024).
const HF_FLAGS: &[(&str, &str)] = &[
    ("--gpus", "8"),
    ("--gpu", "h100-sxm"),
    ("--micro-batch", "1"),
    ("--grad-accum", "2"),
    ("--dtype", "bf16"),
    ("--seq-len", "1024"),
];

const BASES: &[Base] = &[
    Base { tool: "deepspeed", file: DS2, form: Form::Json, flags: DS_FLAGS, hf: false },
    Base {
        tool: "deepspeed",
        file: "tests/fixtures/deepspeed/hf_ds_config_zero3.json",
        form: Form::Json,
        flags: &[("--model", "llama-3.1-8b"), ("--gpus", "16"), ("--gpu", "a100-80gb"), ("--micro-batch", "1")],
        hf: false,
    },
    Base {
        tool: "megatron",
        file: "tests/fixtures/megatron/gpt3_175b_command.txt",
        form: Form::Args,
        flags: &[("--gpu", "a100-80gb"), ("--vocab", "51200")],
        hf: false,
    },
    Base {
        tool: "megatron",
        file: "tests/fixtures/megatron_functional/gpt3_7b_tp1_pp4_memory_speed.args",
        form: Form::Args,
        flags: FUNCTIONAL_FLAGS,
        hf: false,
    },
    Base {
        tool: "megatron",
        file: "tests/fixtures/megatron_functional/gpt3_mcore_te_tp2_pp2_cp2.args",
        form: Form::Args,
        flags: FUNCTIONAL_FLAGS,
        hf: false,
    },
    Base {
        tool: "megatron",
        file: "tests/fixtures/megatron_functional/gpt3_mcore_te_tp1_pp4_vp1.args",
        form: Form::Args,
        flags: FUNCTIONAL_FLAGS,
        hf: false,
    },
    Base {
        tool: "megatron",
        file: "tests/fixtures/megatron_functional/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading.args",
        form: Form::Args,
        flags: FUNCTIONAL_FLAGS,
        hf: false,
    },
    Base {
        tool: "torchtitan",
        file: "tests/fixtures/torchtitan/llama3_8b.toml",
        form: Form::Toml,
        flags: TITAN_FLAGS,
        hf: false,
    },
    Base {
        tool: "torchtitan",
        file: "tests/fixtures/torchtitan/llama3_70b.toml",
        form: Form::Toml,
        flags: TITAN_FLAGS,
        hf: false,
    },
    Base { tool: "deepspeed", file: "models/llama-3.1-8b.json", form: Form::Json, flags: HF_FLAGS, hf: true },
    Base { tool: "deepspeed", file: "models/mixtral-8x7b.json", form: Form::Json, flags: HF_FLAGS, hf: true },
    Base { tool: "deepspeed", file: "models/deepseek-v3.json", form: Form::Json, flags: HF_FLAGS, hf: true },
    Base { tool: "deepspeed", file: "models/gemma-3-1b.json", form: Form::Json, flags: HF_FLAGS, hf: true },
    Base { tool: "deepspeed", file: "models/gpt-oss-20b.json", form: Form::Json, flags: HF_FLAGS, hf: true },
    Base { tool: "deepspeed", file: "models/qwen3-30b-a3b.json", form: Form::Json, flags: HF_FLAGS, hf: true },
    Base { tool: "deepspeed", file: "models/gpt2-xl.json", form: Form::Json, flags: HF_FLAGS, hf: true },
];

/// Keys each importer reads (from src/import and src/model/hf.rs), drawn to be set where the
/// base lacks them; a dotted key is nested.
const DS_KEYS: &[&str] = &[
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16.enabled",
    "fp16.enabled",
    "fp16.loss_scale",
    "data_types.grad_accum_dtype",
    "optimizer.type",
    "zero_optimization",
    "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.device",
    "zero_optimization.overlap_comm",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_scatter",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.allgather_partitions",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.sub_group_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.mics_shard_size",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_gradients",
    "zero_optimization.cpu_offload",
    "activation_checkpointing.partition_activations",
    "activation_checkpointing.cpu_checkpointing",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "prescale_gradients",
    "gradient_predivide_factor",
];

const HF_KEYS: &[&str] = &[
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "mlp_only_layers",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_nextn_predict_layers",
    "partial_rotary_factor",
    "rope_scaling",
    "rope_scaling.type",
    "rope_scaling.factor",
    "quantization_config",
    "quantization_config.quant_method",
    "text_config",
    "output_router_logits",
    "n_layer",
    "n_embd",
    "n_head",
    "n_inner",
    "n_positions",
];

const TITAN_KEYS: &[&str] = &[
    "model.name",
    "model.flavor",
    "model.converters",
    "training.batch_size",
    "training.local_batch_size",
    "training.global_batch_size",
    "training.seq_len",
    "training.max_norm",
    "training.compile",
    "training.mixed_precision_param",
    "training.mixed_precision_reduce",
    "parallelism.data_parallel_replicate_degree",
    "parallelism.data_parallel_shard_degree",
    "parallelism.tensor_parallel_degree",
    "parallelism.pipeline_parallel_degree",
    "parallelism.context_parallel_degree",
    "parallelism.enable_async_tensor_parallel",
    "parallelism.fsdp_reshard_after_forward",
    "parallelism.pipeline_parallel_schedule",
    "activation_checkpoint.mode",
    "activation_checkpoint.selective_ac_option",
    "float8.enable_fsdp_float8_all_gather",
    "float8.recipe_name",
    "optimizer.name",
    "optimizer.implementation",
    "compile.enable",
    "compile.components",
    "memory_estimation.enabled",
];

const MEGATRON_KEYS: &[&str] = &[
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "group_query_attention",
    "kv_channels",
    "seq_length",
    "max_position_embeddings",
    "vocab_size",
    "padded_vocab_size",
    "make_vocab_size_divisible_by",
    "micro_batch_size",
    "global_batch_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank",
    "pipeline_model_parallel_layout",
    "sequence_parallel",
    "use_distributed_optimizer",
    "use_precision_aware_optimizer",
    "optimizer",
    "bf16",
    "fp16",
    "fp8",
    "fp8_format",
    "fp8_recipe",
    "accumulate_allreduce_grads_in_fp32",
    "grad_reduce_in_bf16",
    "recompute_activations",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "checkpoint_activations",
    "swiglu",
    "normalization",
    "position_embedding_type",
    "untie_embeddings_and_output_weights",
    "disable_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "attention_backend",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "moe_token_dispatcher_type",
    "moe_grouped_gemm",
    "moe_expert_capacity_factor",
    "moe_pad_expert_input_to_capacity",
    "moe_router_load_balancing_type",
    "moe_aux_loss_coeff",
    "moe_enable_deepep",
    "multi_latent_attention",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "mtp_num_layers",
    "fine_grained_activation_offloading",
    "offload_modules",
    "world_size",
    "nproc_per_node",
    "nnodes",
];

/// Values for a JSON or TOML key: sizes and names users write, then wrong types and extremes
/// (the first 16 are the plausible ones).
const VALUES: &[&str] = &[
    "1",
    "2",
    "4",
    "8",
    "16",
    "64",
    "128",
    "4096",
    "true",
    "false",
    "\"auto\"",
    "\"none\"",
    "\"cpu\"",
    "\"bf16\"",
    "\"selective\"",
    "\"full\"",
    "0",
    "-1",
    "1.5",
    "1e30",
    "1e308",
    "-0.0",
    "0.0001",
    "18446744073709551616",
    "9007199254740993",
    "4294967297",
    "null",
    "\"\"",
    "\"abc\"",
    "\"nvme\"",
    "\"fp8\"",
    "\"1e9\"",
    "\"\\u0000\"",
    "\"\\n[hardware]\"",
    "[]",
    "{}",
    "[1, 2]",
    "[\"float8\"]",
    "{\"a\": 1}",
];

/// Values for a Megatron flag (the words after it): the same spread, as text.
const WORDS: &[&str] = &[
    "1",
    "2",
    "4",
    "8",
    "16",
    "1024",
    "true",
    "false",
    "0",
    "-1",
    "1.5",
    "1e30",
    "18446744073709551616",
    "4294967297",
    "abc",
    "None",
    "''",
    "[1, 2]",
    "core_attn mlp",
    "bf16",
    "selective",
    "full",
    "uniform",
    "block",
    "alltoall",
    "flex",
    "local",
    "transformer_engine",
    "rope",
    "learned_absolute",
    "RMSNorm",
    "LayerNorm",
    "hybrid",
    "e4m3",
    "([1]*3+[0]*1)*3",
    "Et*4|tL",
];

/// Values for a command-line flag of `stepsim import`.
const FLAG_VALUES: &[&str] = &[
    "0",
    "1",
    "3",
    "16",
    "-1",
    "1000000",
    "18446744073709551616",
    "abc",
    "",
    "a100-80gb",
    "h200",
    "b200",
    "nope",
    "full",
    "none",
    "fp32",
    "fp16",
    "0.14.4",
    "99.0",
    "llama-3.1-70b",
    "models/nope.json",
];

/// Flags an import may take that a base may lack.
const OPTIONAL_FLAGS: &[(&str, &[&str])] = &[
    ("--gpus-per-node", &["deepspeed", "megatron", "torchtitan"]),
    ("--gpus", &["megatron", "torchtitan"]),
    ("--seq-len", &["deepspeed"]),
    ("--checkpointing", &["deepspeed"]),
    ("--deepspeed-version", &["deepspeed"]),
    ("--model", &["torchtitan"]),
    ("--vocab", &["megatron"]),
];

/// A JSON value from its text (the table's entries all parse).
fn json(text: &str) -> Value {
    serde_json::from_str(text).expect("a VALUES entry parses")
}

/// Every key path of a JSON tree (objects only; arrays are values).
fn paths(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = v {
        for (k, c) in m {
            prefix.push(k.clone());
            out.push(prefix.clone());
            paths(c, prefix, out);
            prefix.pop();
        }
    }
}

/// Sets (or, with `None`, removes) the value at a path, making objects on the way.
fn set(root: &mut Value, path: &[String], value: Option<Value>) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut v = root;
    for p in parents {
        if !v.is_object() {
            *v = Value::Object(Default::default());
        }
        v = v.as_object_mut().unwrap().entry(p.clone()).or_insert(Value::Object(Default::default()));
    }
    if !v.is_object() {
        *v = Value::Object(Default::default());
    }
    let m = v.as_object_mut().unwrap();
    match value {
        Some(x) => {
            m.insert(last.clone(), x);
        }
        None => {
            m.remove(last);
        }
    }
}

/// A number of the tree halved or doubled, else a table value.
fn draw_value(rng: &mut ChaCha8Rng, old: Option<&Value>) -> Value {
    if let Some(n) = old.and_then(Value::as_u64).filter(|_| rng.random_bool(0.3)) {
        return Value::from(if rng.random_bool(0.5) { n / 2 } else { n.saturating_mul(2) });
    }
    let i = if rng.random_bool(0.5) { rng.random_range(0..16) } else { rng.random_range(0..VALUES.len()) };
    json(VALUES[i])
}

/// One to three mutations of a JSON or TOML tree: a key set (an existing one or one the
/// importer reads), removed, or, for TOML, a null written as the key's removal.
fn mutate_tree(tree: &mut Value, known: &[&str], rng: &mut ChaCha8Rng, what: &mut Vec<String>) {
    for _ in 0..rng.random_range(1..=3) {
        let mut all = Vec::new();
        paths(tree, &mut Vec::new(), &mut all);
        let path: Vec<String> = if all.is_empty() || rng.random_bool(0.4) {
            known[rng.random_range(0..known.len())].split('.').map(String::from).collect()
        } else {
            all[rng.random_range(0..all.len())].clone()
        };
        let old = path.iter().try_fold(&*tree, |v, k| v.get(k));
        if rng.random_range(0..6) == 0 {
            what.push(format!("{} removed", path.join(".")));
            set(tree, &path, None);
        } else {
            let v = draw_value(rng, old);
            what.push(format!("{} = {v}", path.join(".")));
            set(tree, &path, Some(v));
        }
    }
}

/// A JSON tree as TOML, its nulls dropped (TOML has none); None where TOML cannot hold it.
fn to_toml(v: &Value) -> Option<String> {
    fn strip(v: &Value) -> Option<Value> {
        match v {
            Value::Null => None,
            Value::Object(m) => {
                Some(Value::Object(m.iter().filter_map(|(k, c)| Some((k.clone(), strip(c)?))).collect()))
            }
            Value::Array(a) => Some(Value::Array(a.iter().filter_map(strip).collect())),
            x => Some(x.clone()),
        }
    }
    let t: toml::Value = serde_json::from_value(strip(v)?).ok()?;
    toml::to_string(&t).ok()
}

/// A Megatron command line's flags in order, each with its words (none for a bare flag).
fn parse_flags(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for w in text
        .lines()
        .flat_map(|l| l.split('#').next().unwrap_or("").split_whitespace())
        .filter(|w| !["\\", "(", ")"].contains(w))
    {
        match w.strip_prefix("--") {
            Some(name) => out.push((name.to_string(), Vec::new())),
            None if !out.is_empty() => out.last_mut().unwrap().1.push(w.to_string()),
            None => {} // the launcher before the first flag
        }
    }
    out
}

/// One to three mutations of a command line: a flag's words changed, a flag removed, a flag
/// the importer reads added (as `--name value` or `--name=value`), or one repeated.
fn mutate_flags(flags: &mut Vec<(String, Vec<String>)>, rng: &mut ChaCha8Rng, what: &mut Vec<String>) {
    for _ in 0..rng.random_range(1..=3) {
        let w = WORDS[rng.random_range(0..WORDS.len())].to_string();
        match rng.random_range(0..8) {
            0 if !flags.is_empty() => {
                let (n, _) = flags.remove(rng.random_range(0..flags.len()));
                what.push(format!("--{n} removed"));
            }
            1 if !flags.is_empty() => {
                let f = flags[rng.random_range(0..flags.len())].clone();
                what.push(format!("--{} repeated", f.0));
                flags.push(f);
            }
            2..=4 => {
                let k = MEGATRON_KEYS[rng.random_range(0..MEGATRON_KEYS.len())].replace('_', "-");
                let words: Vec<String> = if rng.random_range(0..4) == 0 { Vec::new() } else { vec![w] };
                what.push(format!("--{k} {}", words.join(" ")));
                flags.retain(|(n, _)| *n != k);
                if rng.random_bool(0.2) && !words.is_empty() {
                    flags.push((format!("{k}={}", words[0]), Vec::new()));
                } else {
                    flags.push((k, words));
                }
            }
            _ if !flags.is_empty() => {
                let i = rng.random_range(0..flags.len());
                what.push(format!("--{} {w}", flags[i].0));
                flags[i].1 = vec![w];
            }
            _ => {}
        }
    }
}

/// A command line from its flags, one per line with continuations, or the `arguments` block
/// Megatron's training log prints (a bare flag as `True`, one word as itself, several as the
/// Python list the log prints).
fn render_flags(flags: &[(String, Vec<String>)], log: bool) -> String {
    if !log {
        let lines: Vec<String> = flags
            .iter()
            .map(|(n, w)| if w.is_empty() { format!("--{n}") } else { format!("--{n} {}", w.join(" ")) })
            .collect();
        return format!("torchrun pretrain_gpt.py \\\n    {}\n", lines.join(" \\\n    "));
    }
    let mut o = String::from("------------------------ arguments ------------------------\n");
    for (n, w) in flags {
        let (key, value) = match n.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (
                n.clone(),
                match &w[..] {
                    [] => "True".into(),
                    [one] => one.trim_matches('\'').to_string(),
                    many => format!("[{}]", many.iter().map(|x| format!("'{x}'")).collect::<Vec<_>>().join(", ")),
                },
            ),
        };
        let key = key.replace('-', "_");
        o.push_str(&format!("  {key} {} {value}\n", ".".repeat(50usize.saturating_sub(key.len()).max(3))));
    }
    o.push_str("-------------------- end of arguments ---------------------\n");
    o
}

/// Bytes of the config damaged one way: cut short, a NUL or control character written in,
/// invalid UTF-8, or a byte-order mark before it.
fn damage(bytes: &mut Vec<u8>, rng: &mut ChaCha8Rng) -> &'static str {
    let at = rng.random_range(0..=bytes.len());
    match rng.random_range(0..5) {
        0 => {
            bytes.truncate(at);
            "cut short"
        }
        1 => {
            bytes.insert(at, 0);
            "a NUL"
        }
        2 => {
            bytes.insert(at, 0x01);
            "a control character"
        }
        3 => {
            bytes.splice(at..at, [0xff, 0xfe]);
            "invalid UTF-8"
        }
        _ => {
            bytes.splice(0..0, [0xef, 0xbb, 0xbf]);
            "a byte-order mark"
        }
    }
}

/// The base's flags, one time in four with one changed, dropped or added.
fn draw_flags(base: &Base, rng: &mut ChaCha8Rng, what: &mut Vec<String>) -> Vec<(String, String)> {
    let mut flags: Vec<(String, String)> = base.flags.iter().map(|(f, v)| (f.to_string(), v.to_string())).collect();
    if rng.random_range(0..4) != 0 {
        return flags;
    }
    let value = FLAG_VALUES[rng.random_range(0..FLAG_VALUES.len())].to_string();
    match rng.random_range(0..3) {
        0 => {
            let (f, _) = flags.remove(rng.random_range(0..flags.len()));
            what.push(format!("{f} dropped"));
        }
        1 => {
            let i = rng.random_range(0..flags.len());
            what.push(format!("{} {value:?}", flags[i].0));
            flags[i].1 = value;
        }
        _ => {
            let options: Vec<&str> = OPTIONAL_FLAGS
                .iter()
                .filter(|(f, tools)| tools.contains(&base.tool) && !flags.iter().any(|(g, _)| g == f))
                .map(|(f, _)| *f)
                .collect();
            if let Some(f) = options.get(rng.random_range(0..options.len().max(1))) {
                what.push(format!("{f} {value:?}"));
                flags.push((f.to_string(), value));
            }
        }
    }
    flags
}

/// One case's config bytes, its file name and what was done to it.
fn draw_case(base: &Base, root: &Path, rng: &mut ChaCha8Rng) -> (Vec<u8>, Vec<String>) {
    let text = std::fs::read_to_string(root.join(base.file)).unwrap();
    let mut what = Vec::new();
    let mut bytes = match base.form {
        Form::Json | Form::Toml => {
            let mut tree: Value = if base.form == Form::Json {
                serde_json::from_str(&text).unwrap()
            } else {
                serde_json::to_value(toml::from_str::<toml::Value>(&text).unwrap()).unwrap()
            };
            let known = match (base.hf, base.form) {
                (true, _) => HF_KEYS,
                (false, Form::Toml) => TITAN_KEYS,
                _ => DS_KEYS,
            };
            mutate_tree(&mut tree, known, rng, &mut what);
            match base.form {
                Form::Json => serde_json::to_string_pretty(&tree).unwrap(),
                _ => to_toml(&tree).unwrap_or(text),
            }
            .into_bytes()
        }
        Form::Args => {
            let mut flags = parse_flags(&text);
            mutate_flags(&mut flags, rng, &mut what);
            let log = rng.random_range(0..3) == 0;
            if log {
                what.push("as a log block".into());
            }
            render_flags(&flags, log).into_bytes()
        }
    };
    if rng.random_range(0..12) == 0 {
        what.push(damage(&mut bytes, rng).into());
    }
    (bytes, what)
}

/// The campaign's folder and tally.
struct Campaign {
    dir: tempfile::TempDir,
    cases: usize,
    imported: usize,
    refused: usize,
    ran: usize,
    slowest: (f64, String),
    problems: Vec<String>,
}

impl Campaign {
    fn new() -> Campaign {
        Campaign {
            dir: tempfile::tempdir().unwrap(),
            cases: 0,
            imported: 0,
            refused: 0,
            ran: 0,
            slowest: (0.0, String::new()),
            problems: Vec::new(),
        }
    }

    /// Imports one case; checks the contract; on exit 0 checks, re-imports and (when `run`) runs
    /// the scenario.
    fn case(&mut self, base: &Base, config: &[u8], flags: &[(String, String)], run: bool, case: &str) {
        let i = self.cases;
        let dir = self.dir.path().to_path_buf();
        let ext = match base.form {
            Form::Json => "json",
            Form::Toml => "toml",
            Form::Args => "args",
        };
        let cfg = dir.join(format!("case{i}.{ext}"));
        std::fs::write(&cfg, config).unwrap();
        let out = dir.join(format!("imported{i}.toml"));
        // An HF base's mutated file is the model (its flags hold no --model); the config is
        // deepspeed's unmutated fixture.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let config_arg = if base.hf { root.join(DS2) } else { cfg.clone() };
        let mut args: Vec<String> = vec!["import".into(), base.tool.into(), config_arg.display().to_string()];
        args.extend(flags.iter().flat_map(|(f, v)| [f.clone(), v.clone()]));
        if base.hf {
            args.extend(["--model".to_string(), cfg.display().to_string()]);
        }
        args.extend(["--out".to_string(), out.display().to_string()]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let limit = Duration::from_secs(10);
        let o = run_bounded(&argv, limit);
        self.cases += 1;
        if std::env::var("STEPSIM_FUZZ_SHOW").is_ok() {
            println!("{:?} {case}: {}", o.code, o.stderr.lines().last().unwrap_or(""));
        }
        if o.seconds > self.slowest.0 {
            self.slowest = (o.seconds, case.to_string());
        }
        let name = cfg.file_name().unwrap().to_str().unwrap().to_string();
        let problem = o.problem.clone().or_else(|| match o.code {
            Some(2) => {
                self.refused += 1;
                if out.exists() {
                    Some("exit 2 but the scenario was written".into())
                } else if !o.stderr.contains(&name) && !o.stderr.contains("--") && !o.stderr.contains(DS2) {
                    Some(format!("exit 2 names neither the file nor a flag: {}", o.stderr.trim()))
                } else {
                    None
                }
            }
            _ => {
                self.imported += 1;
                self.imported_case(i, &out, &args, run).err()
            }
        });
        if let Some(p) = problem {
            self.problems.push(format!("{case}: {p}"));
        }
    }

    /// What an import that exited 0 promises: the scenario is written, `check` accepts it, a
    /// second import writes the same bytes, and (when `run`) `run` exits 0 with a report or 2.
    fn imported_case(&mut self, i: usize, out: &Path, args: &[String], run: bool) -> Result<(), String> {
        let dir = self.dir.path();
        let written = std::fs::read(out).map_err(|e| format!("exit 0 without the scenario: {e}"))?;
        let limit = Duration::from_secs(30);
        let o = run_bounded(&["check", out.to_str().unwrap()], limit);
        if o.code != Some(0) {
            return Err(format!("the imported scenario fails `check` (exit {:?}): {}", o.code, o.stderr.trim()));
        }
        let again = dir.join(format!("again{i}.toml"));
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        *a.last_mut().unwrap() = again.to_str().unwrap();
        let o = run_bounded(&a, limit);
        if o.code != Some(0) || std::fs::read(&again).ok().as_deref() != Some(&written[..]) {
            return Err(format!("imported again: exit {:?}, a different scenario", o.code));
        }
        if run {
            self.ran += 1;
            let report = dir.join(format!("run{i}"));
            let o = run_bounded(&["run", out.to_str().unwrap(), "--out", report.to_str().unwrap()], limit);
            let result = match (o.problem, o.code) {
                (Some(p), _) => Err(format!("run: {p}")),
                (None, Some(0)) if !report.join("report.json").exists() => {
                    Err("run: exit 0 without report.json".into())
                }
                (None, Some(2)) if report.join("report.json").exists() => {
                    Err("run: exit 2 but report.json was written".into())
                }
                _ => Ok(()),
            };
            let _ = std::fs::remove_dir_all(&report);
            result?;
        }
        Ok(())
    }
}

#[test]
fn mutated_framework_configs_keep_the_import_contract() {
    let (cases, seed) = campaign_size("STEPSIM_FUZZ_IMPORTS", 150);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1a4b);
    let mut t = Campaign::new();
    for _ in 0..cases {
        let base = &BASES[rng.random_range(0..BASES.len())];
        let (config, mut what) = draw_case(base, root, &mut rng);
        let flags = draw_flags(base, &mut rng, &mut what);
        let run = rng.random_range(0..3) == 0;
        let case = format!("{} {} [{}]", base.tool, base.file, what.join(", "));
        t.case(base, &config, &flags, run, &case);
    }
    println!(
        "import fuzz: seed {seed}, {} cases: {} imported (each checked and imported again; {} run), {} refused (exit 2), {} problems; slowest {:.2} s: {}",
        t.cases,
        t.imported,
        t.ran,
        t.refused,
        t.problems.len(),
        t.slowest.0,
        t.slowest.1
    );
    assert!(t.problems.is_empty(), "{}", t.problems.join("\n"));
}

/// Every base imports and runs as it is, so that the campaign's cases are one change from a
/// config that works.
#[test]
fn every_import_base_imports_unmutated() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut t = Campaign::new();
    for base in BASES {
        let text = std::fs::read(root.join(base.file)).unwrap();
        let flags: Vec<(String, String)> = base.flags.iter().map(|(f, v)| (f.to_string(), v.to_string())).collect();
        t.case(base, &text, &flags, true, base.file);
    }
    assert!(t.problems.is_empty(), "{}", t.problems.join("\n"));
    assert_eq!((t.imported, t.ran), (BASES.len(), BASES.len()));
}
