//! Malformed scenarios through the real binary: every bad input exits 2 with one line on
//! stderr that names the file, the dotted field and what is allowed, never panics, and writes
//! nothing. (Each case is one mistake; a file with several lists them all: tests/all_errors.rs.)
//!
//! Each case starts from a copy of scenarios/gpt-1.3b-1gpu.toml (comments removed, see BASE)
//! and changes one thing.

mod common;
use common::{stepsim, text};
use std::path::{Path, PathBuf};
use std::process::Output;

/// scenarios/gpt-1.3b-1gpu.toml without its comments. Line numbers matter: some cases assert
/// the line an error reports.
const BASE: &str = r#"description = "1.3B GPT on 1 x A100 80GB, bf16 mixed-precision Adam: fits"

[model]
family = "gpt"
n_layers = 24
hidden = 2048
n_heads = 16
vocab = 50257
max_seq_len = 2048

[hardware]
gpu = "a100-80gb"
gpus = 1

[training]
micro_batch = 4
seq_len = 2048
grad_accum = 2
optimizer = "adamw"
precision = "bf16-mixed-adam"
activation_checkpointing = "none"
"#;

// ---------------------------------------------------------------- running the binary

// ---------------------------------------------------------------- editing the base scenario

/// A scenario as lines, edited by section (`""` is the top level, before any header).
#[derive(Clone)]
struct Doc(Vec<String>);

impl Doc {
    fn base() -> Doc {
        Doc(BASE.lines().map(str::to_string).collect())
    }

    fn header_line(&self, section: &str) -> Option<usize> {
        let header = format!("[{section}]");
        self.0.iter().position(|l| l.split('#').next().unwrap().trim() == header)
    }

    /// Body lines `[start, end)` of a section, or None if it has no header.
    fn body(&self, section: &str) -> Option<(usize, usize)> {
        let start = if section.is_empty() { 0 } else { self.header_line(section)? + 1 };
        let end =
            self.0[start..].iter().position(|l| l.trim_start().starts_with('[')).map_or(self.0.len(), |i| start + i);
        Some((start, end))
    }

    fn key_line(&self, section: &str, key: &str) -> Option<usize> {
        let (start, end) = self.body(section)?;
        (start..end).find(|&i| self.0[i].split_once('=').is_some_and(|(k, _)| k.trim() == key))
    }

    /// Sets `key = value` in `section`: replaces the key's line, or adds it at the top of the
    /// section (creating the section at the end of the file if there is none).
    fn set(mut self, section: &str, key: &str, value: &str) -> Doc {
        let line = format!("{key} = {value}");
        if let Some(i) = self.key_line(section, key) {
            self.0[i] = line;
        } else if let Some((start, _)) = self.body(section) {
            self.0.insert(start, line);
        } else {
            self.0.push(String::new());
            self.0.push(format!("[{section}]"));
            self.0.push(line);
        }
        self
    }

    fn rename(mut self, section: &str, key: &str, new_key: &str) -> Doc {
        let i = self.key_line(section, key).unwrap_or_else(|| panic!("base has no {section}.{key}"));
        let (_, value) = self.0[i].split_once('=').unwrap();
        self.0[i] = format!("{new_key} ={value}");
        self
    }

    fn remove(mut self, section: &str, key: &str) -> Doc {
        let i = self.key_line(section, key).unwrap_or_else(|| panic!("base has no {section}.{key}"));
        self.0.remove(i);
        self
    }

    fn remove_section(mut self, section: &str) -> Doc {
        let (start, end) = self.body(section).unwrap_or_else(|| panic!("base has no [{section}]"));
        // The top level has no header line to remove.
        let first = if section.is_empty() { start } else { start - 1 };
        self.0.drain(first..end);
        self
    }

    /// Replaces the one line equal to `from` (trimmed) with `to`.
    fn replace_line(mut self, from: &str, to: &str) -> Doc {
        let hits: Vec<usize> = (0..self.0.len()).filter(|&i| self.0[i].trim() == from).collect();
        assert_eq!(hits.len(), 1, "base has {} lines `{from}`", hits.len());
        self.0[hits[0]] = to.to_string();
        self
    }

    fn prepend(mut self, line: &str) -> Doc {
        self.0.insert(0, line.to_string());
        self
    }

    fn text(&self) -> String {
        let mut s = self.0.join("\n");
        s.push('\n');
        s
    }
}

// ---------------------------------------------------------------- the cases

struct Case {
    name: &'static str,
    toml: String,
    /// The dotted field stderr must name.
    field: &'static str,
    /// Substrings of the message: what is wrong and what is allowed.
    hints: &'static [&'static str],
    /// The line the message must report, for errors found while parsing.
    line: Option<usize>,
}

fn case(name: &'static str, doc: Doc, field: &'static str, hints: &'static [&'static str]) -> Case {
    Case { name, toml: doc.text(), field, hints, line: None }
}

impl Case {
    fn at_line(mut self, line: usize) -> Case {
        self.line = Some(line);
        self
    }
}

fn cases() -> Vec<Case> {
    let b = Doc::base;
    // The base as a LoRA fine-tune with PEFT's defaults.
    let lora = || b().set("job", "kind", "\"finetune-lora\"").set("lora", "alpha", "16.0");
    // The base as an inference job: 1 x (16 + 48) tokens.
    let inf = || {
        b().remove_section("training")
            .set("job", "kind", "\"inference\"")
            .set("inference", "batch", "1")
            .set("inference", "prompt_len", "16")
            .set("inference", "gen_len", "48")
    };
    // The base as a small llama with 8 experts of 2048, top-2.
    let moe = || {
        b().set("model", "family", "\"llama\"").set("model.moe", "num_experts", "8").set("model.moe", "top_k", "2").set(
            "model.moe",
            "expert_ffn_hidden",
            "2048",
        )
    };
    // The base on a user-defined GPU: an RTX 4090's figures, no FP8.
    let custom = || {
        b().set("hardware", "gpu", "\"custom\"")
            .set("hardware.custom", "memory", "25757220864")
            .set("hardware.custom", "bf16_tflops", "165.2")
            .set("hardware.custom", "fp32_tflops", "82.6")
            .set("hardware.custom", "hbm_gb_per_s", "1008.0")
            .set("hardware.custom", "nvlink_gb_per_s", "31.0")
    };
    // The base on an H100 (FP8 tensor cores).
    let h100 = || b().set("hardware", "gpu", "\"h100-sxm\"");
    // The base as a llama with DeepSeek-style latent attention.
    let mla = || {
        b().set("model", "family", "\"llama\"")
            .set("model.mla", "kv_lora_rank", "128")
            .set("model.mla", "qk_nope_head_dim", "64")
            .set("model.mla", "qk_rope_head_dim", "32")
            .set("model.mla", "v_head_dim", "64")
    };
    vec![
        case(
            "parallel.pipeline so large that tensor x pipeline overflows",
            b().set("parallel", "tensor", "4").set("parallel", "pipeline", "9223372036854775807"),
            "parallel.tensor",
            &["must divide hardware.gpus", "36893488147419103228"],
        ),
        // --- Hugging Face configs and the model zoo
        case(
            "unknown zoo model",
            b().remove_section("model").set("model", "name", "\"llama-9\""),
            "model.name",
            &["unknown model \"llama-9\"", "llama-3.1-8b", "stepsim models"],
        ),
        case(
            "zoo model and hf_config together",
            b().remove_section("model").set("model", "name", "\"llama-3.1-8b\"").set(
                "model",
                "hf_config",
                "\"config.json\"",
            ),
            "model.hf_config",
            &["not both"],
        ),
        case(
            "hf_config that does not exist",
            b().remove_section("model").set("model", "hf_config", "\"no/such/config.json\""),
            "model.hf_config",
            &["cannot read", "no/such/config.json"],
        ),
        case(
            "zoo model with a family",
            b().remove_section("model").set("model", "name", "\"qwen2.5-7b\"").set("model", "family", "\"gpt\""),
            "model.family",
            &["model_type (\"qwen2\")", "remove model.family"],
        ),
        case(
            "context parallelism over a sliding window shorter than the sequence",
            b().remove_section("model")
                .set("model", "name", "\"phi-3-mini-4k\"")
                .set("training", "seq_len", "4096")
                .set("hardware", "gpus", "2")
                .set("parallel", "context", "2"),
            "parallel.context",
            &["sliding-window", "2047", "parallel.context = 1"],
        ),
        case(
            "inference past a sliding window",
            inf()
                .remove_section("model")
                .set("model", "name", "\"mistral-7b-v0.1\"")
                .set("inference", "prompt_len", "4096")
                .set("inference", "gen_len", "100"),
            "model.name",
            &["sliding-window", "4096", "KV cache", "simulate training"],
        ),
        case(
            "full-width QK-norm under tensor parallelism",
            b().remove_section("model")
                .set("model", "name", "\"olmo-2-7b\"")
                .set("hardware", "gpus", "2")
                .set("parallel", "tensor", "2"),
            "parallel.tensor",
            &["span every head", "parallel.tensor = 1"],
        ),
        case(
            "head_dim on the gpt family",
            b().set("model", "head_dim", "64"),
            "model.head_dim",
            &["llama family only"],
        ),
        case(
            "odd head_dim",
            b().set("model", "family", "\"llama\"").set("model", "head_dim", "63"),
            "model.head_dim",
            &["even head dimension", "is 63"],
        ),
        // --- mixture of experts
        case("[model.moe] on the gpt family", moe().set("model", "family", "\"gpt\""), "model.moe", &["llama family"]),
        case(
            "[model.moe] without expert_ffn_hidden",
            moe().remove("model.moe", "expert_ffn_hidden"),
            "model.moe.expert_ffn_hidden",
            &["is required"],
        ),
        case(
            "top_k above num_experts",
            moe().set("model.moe", "top_k", "9"),
            "model.moe.top_k",
            &["at most 8", "got 9"],
        ),
        case(
            "first_dense_layers covering every block",
            moe().set("model.moe", "first_dense_layers", "24"),
            "model.moe.first_dense_layers",
            &["between 0 and model.n_layers - 1 (23)"],
        ),
        case(
            "MoE offset not below every",
            moe().set("model.moe", "every", "2").set("model.moe", "offset", "2"),
            "model.moe.offset",
            &["between 0 and 1", "got 2"],
        ),
        case(
            "MoE dense layer past the model",
            moe().set("model.moe", "dense_layers", "[3, 24]"),
            "model.moe.dense_layers",
            &["between 0 and model.n_layers - 1 (23)", "got 24"],
        ),
        case(
            "MoE pattern with no MoE block",
            moe().set("model.moe", "first_dense_layers", "1").set("model.moe", "every", "30"),
            "model.moe.every",
            &["none of the 24 blocks"],
        ),
        case(
            "unknown [model.moe] key",
            moe().set("model.moe", "capacity_factor", "1.0"),
            "model.moe.capacity_factor",
            &["unknown field", "num_experts"],
        ),
        case(
            "parallel.expert on a dense model",
            b().set("parallel", "expert", "2"),
            "parallel.expert",
            &["mixture-of-experts model"],
        ),
        case(
            "parallel.expert not dividing the experts",
            moe().set("parallel", "expert", "3"),
            "parallel.expert",
            &["must divide model.moe.num_experts (8)"],
        ),
        case(
            "parallel.expert beyond the tensor x data ranks",
            moe().set("parallel", "expert", "8"),
            "parallel.expert",
            &["tensor x data-parallel ranks (1 x 1 = 1)"],
        ),
        case(
            "parallel.expert_tensor on a dense model",
            b().set("hardware", "gpus", "2").set("parallel", "expert_tensor", "2"),
            "parallel.expert_tensor",
            &["expert tensor parallelism", "mixture-of-experts model"],
        ),
        case(
            "parallel.expert_tensor of zero",
            moe().set("parallel", "expert_tensor", "0"),
            "parallel.expert_tensor",
            &["must be a positive integer, got 0"],
        ),
        case(
            "parallel.expert_tensor x expert beyond the tensor x data ranks",
            moe().set("hardware", "gpus", "8").set("parallel", "expert", "4").set("parallel", "expert_tensor", "4"),
            "parallel.expert_tensor",
            &["(4 x 4 = 16)", "tensor x data-parallel ranks (1 x 8 = 8)", "must divide them"],
        ),
        case(
            "parallel.expert_tensor whose product with expert overflows 64 bits",
            moe().set("hardware", "gpus", "8").set("parallel", "expert", "4").set(
                "parallel",
                "expert_tensor",
                "9223372036854775807",
            ),
            "parallel.expert_tensor",
            &["(9223372036854775807 x 4 = 36893488147419103228)", "must divide them"],
        ),
        case(
            "expert_tensor defaulting to tensor, beyond the ranks with expert",
            moe()
                .set("hardware", "gpus", "8")
                .set("model", "vocab", "50304")
                .set("parallel", "tensor", "2")
                .set("parallel", "sequence_parallel", "true")
                .set("parallel", "expert", "8"),
            "parallel.expert",
            &["(2 x 8 = 16)", "defaults to parallel.tensor", "parallel.expert_tensor = 1"],
        ),
        case(
            "parallel.expert_tensor not dividing the expert width",
            moe().set("hardware", "gpus", "3").set("parallel", "expert_tensor", "3"),
            "parallel.expert_tensor",
            &["model.moe.expert_ffn_hidden (2048) is not divisible by 3"],
        ),
        case(
            "expert parallelism with FSDP",
            moe().set("hardware", "gpus", "8").set("parallel", "expert", "8").set(
                "parallel",
                "sharding",
                "\"full_shard\"",
            ),
            "parallel.sharding",
            &["\"none\"", "\"zero1\"", "framework = \"fsdp2\""],
        ),
        case(
            "MoE with tensor parallelism but no sequence parallelism",
            moe().set("hardware", "gpus", "2").set("parallel", "tensor", "2").set("model", "vocab", "50304"),
            "parallel.sequence_parallel",
            &["sequence_parallel = true"],
        ),
        case(
            "[jitter] with expert parallelism",
            moe().set("hardware", "gpus", "2").set("parallel", "expert", "2").set("jitter", "seed", "1"),
            "jitter",
            &["expert parallelism"],
        ),
        case(
            "inference of a MoE model",
            inf()
                .set("model", "family", "\"llama\"")
                .set("model.moe", "num_experts", "8")
                .set("model.moe", "top_k", "2")
                .set("model.moe", "expert_ffn_hidden", "2048"),
            "job.kind",
            &["mixture-of-experts", "not simulated yet"],
        ),
        case(
            "[moe] routing on a dense model",
            b().set("moe", "routing", "\"zipf\""),
            "moe",
            &["mixture-of-experts model"],
        ),
        case(
            "unknown moe.routing",
            moe().set("moe", "routing", "\"hot\""),
            "moe.routing",
            &["\"uniform\"", "\"zipf\"", "\"measured\""],
        ),
        case(
            "moe.zipf_exponent with uniform routing",
            moe().set("moe", "zipf_exponent", "1.0"),
            "moe.zipf_exponent",
            &["moe.routing = \"zipf\" only"],
        ),
        case(
            "moe.zipf_exponent out of range",
            moe().set("moe", "routing", "\"zipf\"").set("moe", "zipf_exponent", "11.0"),
            "moe.zipf_exponent",
            &["[0, 10]", "got 11"],
        ),
        case(
            "measured routing without counts",
            moe().set("moe", "routing", "\"measured\""),
            "moe.tokens_per_expert",
            &["is required", "one count per expert"],
        ),
        case(
            "measured routing with the wrong number of experts",
            moe().set("moe", "routing", "\"measured\"").set("moe", "tokens_per_expert", "[1.0, 2.0]"),
            "moe.tokens_per_expert",
            &["one entry per expert", "num_experts = 8", "got 2"],
        ),
        case(
            "measured routing with a negative count",
            moe().set("moe", "routing", "\"measured\"").set(
                "moe",
                "tokens_per_expert",
                "[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0]",
            ),
            "moe.tokens_per_expert",
            &["finite and >= 0", "-1"],
        ),
        case(
            "[model.mla] on the gpt family",
            b().set("model.mla", "kv_lora_rank", "128")
                .set("model.mla", "qk_nope_head_dim", "64")
                .set("model.mla", "qk_rope_head_dim", "32")
                .set("model.mla", "v_head_dim", "64"),
            "model.mla",
            &["llama family"],
        ),
        case(
            "[model.mla] without kv_lora_rank",
            mla().remove("model.mla", "kv_lora_rank"),
            "model.mla.kv_lora_rank",
            &["is required"],
        ),
        case(
            "odd rope width",
            mla().set("model.mla", "qk_rope_head_dim", "33"),
            "model.mla.qk_rope_head_dim",
            &["even width", "33"],
        ),
        case(
            "head_dim with MLA",
            mla().set("model", "head_dim", "64"),
            "model.head_dim",
            &["multi-head latent attention"],
        ),
        case(
            "MLA with tensor parallelism",
            mla()
                .set("hardware", "gpus", "2")
                .set("parallel", "tensor", "2")
                .set("parallel", "sequence_parallel", "true")
                .set("model", "vocab", "50304"),
            "parallel.tensor",
            &["multi-head latent attention", "parallel.tensor = 1"],
        ),
        case(
            "moe.capacity_factor of zero",
            moe().set("hardware", "gpus", "2").set("parallel", "expert", "2").set("moe", "capacity_factor", "0.0"),
            "moe.capacity_factor",
            &["(0, 1000]", "got 0"],
        ),
        case(
            "moe.capacity_factor without expert parallelism",
            moe().set("moe", "capacity_factor", "1.0"),
            "moe.capacity_factor",
            &["parallel.expert > 1"],
        ),
        case(
            "moe.pad_to_capacity without a capacity factor",
            moe().set("moe", "pad_to_capacity", "true"),
            "moe.pad_to_capacity",
            &["moe.capacity_factor"],
        ),
        case(
            "moe.aux_loss of an unknown balancing type",
            moe().set("moe", "aux_loss", "\"sinkhorn\""),
            "moe.aux_loss",
            &["\"sinkhorn\"", "\"seq_aux_loss\""],
        ),
        case(
            "moe.aux_loss under torchtitan",
            moe().set("parallel", "framework", "\"fsdp2\"").set("parallel", "sharding", "\"full_shard\"").set(
                "moe",
                "aux_loss",
                "\"aux_loss\"",
            ),
            "moe.aux_loss",
            &["load_balance_coeff", "\"none\""],
        ),
        // --- FSDP2
        case(
            "FSDP2 without parameter sharding",
            b().set("hardware", "gpus", "8")
                .set("parallel", "framework", "\"fsdp2\"")
                .set("parallel", "sharding", "\"none\""),
            "parallel.sharding",
            &["fully_shard", "\"full_shard\"", "framework = \"fsdp\""],
        ),
        case(
            "FSDP1 with optimizer-only sharding",
            b().set("hardware", "gpus", "8").set("parallel", "framework", "\"fsdp1\"").set(
                "parallel",
                "sharding",
                "\"zero1\"",
            ),
            "parallel.sharding",
            &["NO_SHARD", "\"full_shard\"", "framework = \"fsdp\""],
        ),
        case(
            "FSDP2 CPU offload without FULL_SHARD",
            b().set("hardware", "gpus", "8")
                .set("parallel", "framework", "\"fsdp2\"")
                .set("parallel", "sharding", "\"shard_grad_op\"")
                .set("offload", "parameters", "\"cpu\""),
            "offload.parameters",
            &["CPU offload", "\"full_shard\""],
        ),
        case(
            "FSDP2 post-forward mesh that does not divide the shard group",
            b().set("hardware", "gpus", "8")
                .set("parallel", "framework", "\"fsdp2\"")
                .set("parallel", "sharding", "\"full_shard\"")
                .set("parallel", "reshard_after_forward", "3"),
            "parallel.reshard_after_forward",
            &["must divide the 8 ranks"],
        ),
        // --- NCCL and PyTorch release settings
        case(
            "a string for [nccl] nvls",
            b().set("nccl", "nvls", "\"yes\""),
            "nccl.nvls",
            &["invalid type", "expected a boolean"],
        ),
        case("NVLS on an A100", b().set("nccl", "nvls", "true"), "nccl.nvls", &["NVSwitch multicast"]),
        case("an unknown [nccl] field", b().set("nccl", "buffsize", "4194304"), "nccl.buffsize", &["unknown field"]),
        case(
            "a number for training.torch_version",
            b().set("training", "torch_version", "2.0"),
            "training.torch_version",
            &["invalid type", "expected a string"],
        ),
        case(
            "an unmodelled PyTorch release",
            b().set("training", "torch_version", "\"1.8\""),
            "training.torch_version",
            &["\"1.10\" to \"2.15\""],
        ),
        // --- Megatron-LM's overlap flags
        case(
            "[megatron] without the Megatron framework",
            b().set("megatron", "overlap_grad_reduce", "true"),
            "megatron",
            &["parallel.framework = \"megatron\""],
        ),
        case(
            "Megatron with parameter sharding",
            b().set("parallel", "framework", "\"megatron\"").set("parallel", "sharding", "\"full_shard\""),
            "parallel.sharding",
            &["\"none\"", "\"zero1\"", "--use-distributed-optimizer"],
        ),
        case(
            "megatron.overlap_param_gather without the distributed optimizer",
            b().set("parallel", "framework", "\"megatron\"").set("megatron", "overlap_grad_reduce", "true").set(
                "megatron",
                "overlap_param_gather",
                "true",
            ),
            "megatron.overlap_param_gather",
            &["distributed optimizer", "zero1"],
        ),
        case(
            "megatron.overlap_param_gather without overlap_grad_reduce",
            b().set("hardware", "gpus", "8")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "sharding", "\"zero1\"")
                .set("megatron", "overlap_param_gather", "true"),
            "megatron.overlap_param_gather",
            &["overlap_grad_reduce = true"],
        ),
        case(
            "megatron.tp_comm_overlap without sequence parallelism",
            b().set("parallel", "framework", "\"megatron\"").set("megatron", "tp_comm_overlap", "true"),
            "megatron.tp_comm_overlap",
            &["sequence_parallel = true", "parallel.tensor > 1"],
        ),
        case(
            "megatron.overlap_moe_expert_parallel_comm on a dense model",
            b().set("parallel", "framework", "\"megatron\"").set(
                "megatron",
                "overlap_moe_expert_parallel_comm",
                "true",
            ),
            "megatron.overlap_moe_expert_parallel_comm",
            &["expert model parallelism", "parallel.expert > 1"],
        ),
        case(
            "megatron.activation_func_fp8_input_store on a GELU model",
            b().set("parallel", "framework", "\"megatron\"").set("megatron", "activation_func_fp8_input_store", "true"),
            "megatron.activation_func_fp8_input_store",
            &["supported only for SwiGLU", "GELU"],
        ),
        case(
            "megatron.ddp_bucket_size zero",
            b().set("parallel", "framework", "\"megatron\"").set("megatron", "overlap_grad_reduce", "true").set(
                "megatron",
                "ddp_bucket_size",
                "0",
            ),
            "megatron.ddp_bucket_size",
            &["whole number of elements", "2^40"],
        ),
        case(
            "megatron.ddp_bucket_size fractional",
            b().set("parallel", "framework", "\"megatron\"").set("megatron", "overlap_grad_reduce", "true").set(
                "megatron",
                "ddp_bucket_size",
                "2.5",
            ),
            "megatron.ddp_bucket_size",
            &["whole number of elements"],
        ),
        case(
            "megatron.ddp_bucket_size without overlap_grad_reduce",
            b().set("parallel", "framework", "\"megatron\"").set("megatron", "ddp_bucket_size", "1e7"),
            "megatron.ddp_bucket_size",
            &["overlap_grad_reduce = true"],
        ),
        case(
            "megatron unknown flag",
            b().set("parallel", "framework", "\"megatron\"").set("megatron", "overlap_everything", "true"),
            "megatron.overlap_everything",
            &["unknown field", "overlap_grad_reduce", "tp_comm_overlap"],
        ),
        case(
            "Megatron with offload",
            b().set("parallel", "framework", "\"megatron\"").set("offload", "optimizer", "\"cpu\""),
            "offload",
            &["Megatron", "\"deepspeed\""],
        ),
        // --- DeepSpeed's bucket knobs and the CUDA module loading
        case(
            "[deepspeed] without the DeepSpeed framework",
            b().set("deepspeed", "reduce_bucket_size", "2e8"),
            "deepspeed",
            &["parallel.framework = \"deepspeed\""],
        ),
        case(
            "deepspeed.reduce_bucket_size zero",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero2\"").set(
                "deepspeed",
                "reduce_bucket_size",
                "0",
            ),
            "deepspeed.reduce_bucket_size",
            &["whole number of elements", "5e8"],
        ),
        case(
            "deepspeed.allgather_bucket_size fractional",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero2\"").set(
                "deepspeed",
                "allgather_bucket_size",
                "1.5",
            ),
            "deepspeed.allgather_bucket_size",
            &["whole number of elements"],
        ),
        case(
            "deepspeed.version unknown",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero1\"").set(
                "deepspeed",
                "version",
                "\"0.17.1\"",
            ),
            "deepspeed.version",
            &["from 0.5 to 0.16", "MAJOR.MINOR", "0.16.5"],
        ),
        case(
            "deepspeed.version not a version",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero1\"").set(
                "deepspeed",
                "version",
                "\"0.+6\"",
            ),
            "deepspeed.version",
            &["MAJOR.MINOR.PATCH"],
        ),
        case(
            "deepspeed.stage3_max_live_parameters fractional",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero3\"").set(
                "deepspeed",
                "stage3_max_live_parameters",
                "2.5",
            ),
            "deepspeed.stage3_max_live_parameters",
            &["whole number of elements from 0", "1e9"],
        ),
        case(
            "deepspeed.sub_group_size negative",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero2\"").set(
                "deepspeed",
                "sub_group_size",
                "-1",
            ),
            "deepspeed.sub_group_size",
            &["whole number of elements", "1e9"],
        ),
        case(
            "deepspeed.reduce_bucket_size beyond 2^40",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero2\"").set(
                "deepspeed",
                "reduce_bucket_size",
                "1e300",
            ),
            "deepspeed.reduce_bucket_size",
            &["2^40"],
        ),
        case(
            "hardware.cuda_module_loading unknown",
            b().set("hardware", "cuda_module_loading", "\"sometimes\""),
            "hardware.cuda_module_loading",
            &["\"lazy\"", "\"eager\""],
        ),
        case(
            "hardware.cuda_module_loading with cuda_context",
            b().set("hardware", "cuda_module_loading", "\"eager\"").set("hardware", "cuda_context", "1000000000"),
            "hardware.cuda_module_loading",
            &["not both"],
        ),
        // --- unknown and misspelled fields
        case(
            "unknown top-level field",
            b().prepend("colour = \"blue\""),
            "colour",
            &["unknown field `colour`", "expected one of", "`hardware`"],
        )
        .at_line(1),
        case(
            "misspelled model.n_layers",
            b().rename("model", "n_layers", "n_layer"),
            "model.n_layer",
            &["unknown field `n_layer`", "`n_layers`"],
        )
        .at_line(5),
        case(
            "misspelled hardware.gpus",
            b().rename("hardware", "gpus", "gpu_count"),
            "hardware.gpu_count",
            &["unknown field `gpu_count`", "`gpus`", "`gpus_per_node`"],
        )
        .at_line(13),
        case(
            "misspelled parallel.sharding",
            b().set("parallel", "shard", "\"full_shard\""),
            "parallel.shard",
            &["unknown field `shard`", "`sharding`"],
        )
        .at_line(24),
        case(
            "misspelled training.micro_batch",
            b().rename("training", "micro_batch", "microbatch"),
            "training.microbatch",
            &["unknown field `microbatch`", "`micro_batch`"],
        )
        .at_line(16),
        case(
            "misspelled field under a header with a comment",
            b().replace_line("[model]", "[model]  # GPT-3 XL").rename("model", "n_layers", "n_layer"),
            "model.n_layer",
            &["unknown field `n_layer`", "`n_layers`"],
        )
        .at_line(5),
        case(
            "unknown sub-table",
            b().set("model.extra", "x", "1"),
            "model.extra",
            &["unknown field `extra`", "`n_heads`"],
        ),
        // --- wrong types
        case(
            "string for an integer",
            b().set("model", "n_layers", "\"eighty\""),
            "model.n_layers",
            &["invalid type", "\"eighty\"", "expected i64"],
        )
        .at_line(5),
        case(
            "float for an integer",
            b().set("hardware", "gpus", "8.5"),
            "hardware.gpus",
            &["invalid type", "8.5", "expected i64"],
        )
        .at_line(13),
        case(
            "string for a boolean",
            b().set("parallel", "limit_all_gathers", "\"yes\""),
            "parallel.limit_all_gathers",
            &["invalid type", "\"yes\"", "expected a boolean"],
        )
        .at_line(24),
        case(
            "string for a boolean or an integer",
            b().set("parallel", "reshard_after_forward", "\"yes\""),
            "parallel.reshard_after_forward",
            &["invalid type", "\"yes\"", "expected true, false or an integer"],
        )
        .at_line(24),
        case(
            "value for a section",
            b().remove_section("hardware").prepend("hardware = 5"),
            "hardware",
            &["invalid type", "expected struct"],
        )
        .at_line(1),
        // --- sizes
        case("zero hidden", b().set("model", "hidden", "0"), "model.hidden", &["must be a positive integer", "got 0"]),
        case(
            "negative micro_batch",
            b().set("training", "micro_batch", "-1"),
            "training.micro_batch",
            &["must be a positive integer", "got -1"],
        ),
        case("zero vocab", b().set("model", "vocab", "0"), "model.vocab", &["must be a positive integer", "got 0"]),
        case(
            "zero seq_len",
            b().set("training", "seq_len", "0"),
            "training.seq_len",
            &["must be a positive integer", "got 0"],
        ),
        case(
            "negative cuda_context",
            b().set("hardware", "cuda_context", "-1"),
            "hardware.cuda_context",
            &["must be >= 0 bytes", "got -1"],
        ),
        case(
            "cuda_context larger than the device",
            b().set("hardware", "memory_capacity", "1000000"),
            "hardware.cuda_context",
            &["leaves nothing", "1000000-byte device"],
        ),
        case(
            "a size in bits",
            b().set("hardware", "memory_capacity", "\"80Gb\""),
            "hardware.memory_capacity",
            &["\"80Gb\": unknown unit", "lowercase b is bits", "\"80GiB\" (2^30)"],
        ),
        case(
            "a size that is not a whole number of bytes",
            b().set("allocator", "nccl_buffers", "\"0.5B\""),
            "allocator.nccl_buffers",
            &["\"0.5B\" is not a whole number of bytes"],
        ),
        case(
            "a fractional float size",
            b().set("hardware", "cuda_context", "5.5e-1"),
            "hardware.cuda_context",
            &["0.55 is not a whole number of bytes"],
        ),
        case(
            "a size past i64",
            b().set("offload", "cpu_memory", "\"9e9TiB\""),
            "offload.cpu_memory",
            &["is more than 9223372036854775807 bytes"],
        ),
        case(
            "too many steps",
            b().set("training", "steps", "1000"),
            "training.steps",
            &["at most 100 steps", "got 1000"],
        ),
        // --- model parallelism (Megatron-LM degrees)
        case(
            "tensor x pipeline not dividing the GPUs",
            b().set("parallel", "tensor", "3"),
            "parallel.tensor",
            &["tensor (3) x pipeline (1) = 3 must divide hardware.gpus (1)"],
        ),
        case(
            "tensor not dividing the heads",
            b().set("hardware", "gpus", "24").set("parallel", "tensor", "3"),
            "parallel.tensor",
            &["must divide model.n_heads (16)", "got 3"],
        ),
        case(
            "sequence parallel without tensor parallel",
            b().set("parallel", "sequence_parallel", "true"),
            "parallel.sequence_parallel",
            &["needs tensor parallelism"],
        ),
        case(
            "DeepSpeed ZeRO-3 with a pipeline",
            b().set("hardware", "gpus", "4")
                .set("parallel", "pipeline", "2")
                .set("parallel", "sharding", "\"zero3\"")
                .set("parallel", "framework", "\"deepspeed\""),
            "parallel.sharding",
            &["PipelineEngine", "zero1", "fsdp"],
        ),
        case(
            "hybrid sharding with a pipeline",
            b().set("hardware", "gpus", "4").set("parallel", "pipeline", "2").set(
                "parallel",
                "sharding",
                "\"hybrid_shard\"",
            ),
            "parallel.sharding",
            &["not simulated yet", "full_shard"],
        ),
        case(
            "unknown pipeline schedule",
            b().set("hardware", "gpus", "2").set("parallel", "pipeline", "2").set("parallel", "schedule", "\"zb-v\""),
            "parallel.schedule",
            &["\"zb-v\"", "\"interleaved-1f1b\""],
        ),
        case(
            "virtual stages without interleaving",
            b().set("hardware", "gpus", "2")
                .set("parallel", "pipeline", "2")
                .set("parallel", "virtual_stages", "2")
                .set("parallel", "schedule", "\"1f1b\""),
            "parallel.virtual_stages",
            &["interleaved-1f1b"],
        ),
        case(
            "stage_layers with the wrong number of stages",
            b().set("hardware", "gpus", "2").set("parallel", "pipeline", "2").set("parallel", "stage_layers", "[24]"),
            "parallel.stage_layers",
            &["one entry per pipeline stage (2), got 1"],
        ),
        case(
            "stage_layers not adding up to the layers",
            b().set("hardware", "gpus", "2").set("parallel", "pipeline", "2").set(
                "parallel",
                "stage_layers",
                "[10, 10]",
            ),
            "parallel.stage_layers",
            &["add up to 20", "model.n_layers is 24"],
        ),
        case(
            "zero bucket_cap_mb",
            b().set("parallel", "bucket_cap_mb", "0.0"),
            "parallel.bucket_cap_mb",
            &["must be a positive number of MiB", "got 0"],
        ),
        // --- shapes
        case(
            "heads not dividing hidden",
            b().set("model", "n_heads", "15"),
            "model.n_heads",
            &["must divide model.hidden (2048)", "15 does not"],
        ),
        case(
            "llama: n_kv_heads not dividing n_heads",
            b().set("model", "family", "\"llama\"").set("model", "n_kv_heads", "3"),
            "model.n_kv_heads",
            &["must divide model.n_heads (16)", "3 does not"],
        ),
        case(
            "gpt-neox partial rotary: n_kv_heads != n_heads",
            b().remove_section("model").set("model", "name", "\"pythia-6.9b\"").set("model", "n_kv_heads", "4"),
            "model.n_kv_heads",
            &["partial rotary", "multi-head attention", "must equal n_heads (32)"],
        ),
        case(
            "llama: odd head dimension",
            b().set("model", "family", "\"llama\"").set("model", "n_heads", "2048"),
            "model.n_heads",
            &["even head dimension", "is 1"],
        ),
        case(
            "seq_len over max_seq_len",
            b().set("training", "seq_len", "4096"),
            "training.seq_len",
            &["4096 exceeds model.max_seq_len (2048)"],
        ),
        case("dropout of 1.5", b().set("model", "dropout", "1.5"), "model.dropout", &["must be in [0, 1)", "1.5"]),
        case(
            "unknown node preset",
            b().set("hardware", "node", "\"dgx-z\""),
            "hardware.node",
            &["dgx-z", "dgx-h100", "aws-p5"],
        ),
        case("zero NICs", b().set("hardware", "nics_per_node", "0"), "hardware.nics_per_node", &["positive integer"]),
        case(
            "negative NIC speed",
            b().set("hardware", "nic_gbps", "-400.0"),
            "hardware.nic_gbps",
            &["positive number of Gb/s"],
        ),
        case(
            "zero NVLink",
            b().set("hardware", "nvlink_gb_per_s", "0.0"),
            "hardware.nvlink_gb_per_s",
            &["positive number of GB/s"],
        ),
        case(
            "negative jitter CV",
            b().set("jitter", "seed", "1").set("jitter", "compute_cv", "-0.1"),
            "jitter.compute_cv",
            &["fraction in [0, 1]"],
        ),
        case(
            "jitter over too many ranks",
            b().set("hardware", "gpus", "2048").set("jitter", "seed", "1"),
            "jitter",
            &["every data-parallel rank", "at most 1024", "2048"],
        ),
        case(
            "stragglers without slowdown",
            b().set("jitter", "seed", "1").set("jitter", "stragglers", "1"),
            "jitter.straggler_slowdown",
            &["slowdown > 0"],
        ),
        case(
            "bf16 on a V100",
            b().set("hardware", "gpu", "\"v100-32gb\""),
            "training.precision",
            &["no BF16 tensor cores", "fp16"],
        ),
        // --- cluster
        case(
            "more GPUs per node than GPUs",
            b().set("hardware", "gpus_per_node", "8"),
            "hardware.gpus_per_node",
            &["8 GPUs per node is more than hardware.gpus (1)"],
        ),
        case(
            "gpus_per_node not dividing gpus",
            b().set("hardware", "gpus", "12").set("hardware", "gpus_per_node", "8"),
            "hardware.gpus_per_node",
            &["must divide hardware.gpus (12)", "8 does not"],
        ),
        case(
            "unknown GPU",
            b().set("hardware", "gpu", "\"h100\""),
            "hardware.gpu",
            &["unknown GPU \"h100\"", "the catalog has", "h100-sxm", "a100-80gb", "rtx-4090", "gpu = \"custom\""],
        ),
        // --- a user-defined GPU: [hardware.custom]
        case(
            "custom GPU without [hardware.custom]",
            b().set("hardware", "gpu", "\"custom\""),
            "hardware.gpu",
            &["[hardware.custom]", "memory", "fp32_tflops"],
        ),
        case(
            "[hardware.custom] beside a catalog GPU",
            custom().set("hardware", "gpu", "\"a100-80gb\""),
            "hardware.custom",
            &["hardware.gpu is \"a100-80gb\"", "gpu = \"custom\""],
        ),
        case(
            "custom GPU without memory",
            custom().remove("hardware.custom", "memory"),
            "hardware.custom.memory",
            &["missing field `memory`"],
        ),
        case(
            "custom GPU memory in bits",
            custom().set("hardware.custom", "memory", "\"24Gb\""),
            "hardware.custom.memory",
            &["unknown unit", "lowercase b is bits"],
        ),
        case(
            "custom GPU of zero memory",
            custom().set("hardware.custom", "memory", "0"),
            "hardware.custom.memory",
            &["positive integer"],
        ),
        case(
            "custom GPU memory past the limit",
            custom().set("hardware.custom", "memory", "35184372088832"),
            "hardware.custom.memory",
            &["at most 17592186044416"],
        ),
        case(
            "custom GPU without BF16 or FP16 peak",
            custom().remove("hardware.custom", "bf16_tflops"),
            "hardware.custom.bf16_tflops",
            &["fp16_tflops"],
        ),
        case(
            "custom GPU negative BF16 peak",
            custom().set("hardware.custom", "bf16_tflops", "-165.2"),
            "hardware.custom.bf16_tflops",
            &["positive number of TFLOP/s", "-165.2"],
        ),
        case(
            "custom GPU NaN FP32 peak",
            custom().set("hardware.custom", "fp32_tflops", "nan"),
            "hardware.custom.fp32_tflops",
            &["positive number of TFLOP/s"],
        ),
        case(
            "custom GPU FP8 peak past the limit",
            custom().set("hardware.custom", "fp8_tflops", "1e7"),
            "hardware.custom.fp8_tflops",
            &["at most 1000000 TFLOP/s"],
        ),
        case(
            "custom GPU zero TF32 peak",
            custom().set("hardware.custom", "tf32_tflops", "0.0"),
            "hardware.custom.tf32_tflops",
            &["positive number of TFLOP/s"],
        ),
        case(
            "custom GPU without FP32 peak",
            custom().remove("hardware.custom", "fp32_tflops"),
            "hardware.custom.fp32_tflops",
            &["missing field `fp32_tflops`"],
        ),
        case(
            "custom GPU zero memory bandwidth",
            custom().set("hardware.custom", "hbm_gb_per_s", "0.0"),
            "hardware.custom.hbm_gb_per_s",
            &["positive number of GB/s"],
        ),
        case(
            "custom GPU infinite link",
            custom().set("hardware.custom", "nvlink_gb_per_s", "inf"),
            "hardware.custom.nvlink_gb_per_s",
            &["positive number of GB/s"],
        ),
        case(
            "custom GPU link past the limit",
            custom().set("hardware.custom", "nvlink_gb_per_s", "2e6"),
            "hardware.custom.nvlink_gb_per_s",
            &["at most 1000000 GB/s"],
        ),
        case(
            "custom GPU PCIe 7",
            custom().set("hardware.custom", "pcie_gen", "7"),
            "hardware.custom.pcie_gen",
            &["3, 4, 5 or 6", "got 7"],
        ),
        case(
            "custom GPU of zero SMs",
            custom().set("hardware.custom", "sms", "0"),
            "hardware.custom.sms",
            &["positive integer"],
        ),
        case(
            "custom GPU SMs past the limit",
            custom().set("hardware.custom", "sms", "100000"),
            "hardware.custom.sms",
            &["at most 65536"],
        ),
        case(
            "custom GPU matmul fraction above 1.1",
            custom().set("hardware.custom", "max_matmul_fraction", "1.5"),
            "hardware.custom.max_matmul_fraction",
            &["(0, 1.1]", "1.5"],
        ),
        case(
            "custom GPU unknown arch",
            custom().set("hardware.custom", "arch", "\"turing\""),
            "hardware.custom.arch",
            &["unknown value \"turing\"", "\"ada\"", "\"hopper\"", "\"cdna3\""],
        ),
        case(
            "custom GPU FP8 on an arch without it",
            custom().set("hardware.custom", "arch", "\"ampere\"").set("hardware.custom", "fp8_tflops", "624.0"),
            "hardware.custom.fp8_tflops",
            &["\"ampere\" has no FP8 tensor cores"],
        ),
        case(
            "custom GPU named like a catalog GPU",
            custom().set("hardware.custom", "name", "\"h100-sxm\""),
            "hardware.custom.name",
            &["\"h100-sxm\" is a catalog GPU", "gpu = \"h100-sxm\""],
        ),
        case(
            "custom GPU name with a slash",
            custom().set("hardware.custom", "name", "\"a/b\""),
            "hardware.custom.name",
            &["1 to 64 characters"],
        ),
        case(
            "custom GPU unknown field",
            custom().set("hardware.custom", "tflops", "100.0"),
            "hardware.custom.tflops",
            &["unknown field `tflops`", "bf16_tflops"],
        ),
        case(
            "custom GPU with memory_capacity",
            custom().set("hardware", "memory_capacity", "25000000000"),
            "hardware.memory_capacity",
            &["[hardware.custom] memory"],
        ),
        case(
            "custom GPU with the link override",
            custom().set("hardware", "nvlink_gb_per_s", "31.0"),
            "hardware.nvlink_gb_per_s",
            &["[hardware.custom] nvlink_gb_per_s"],
        ),
        case(
            "custom GPU without FP8 training FP8",
            custom().set("fp8", "recipe", "\"tensorwise\""),
            "fp8",
            &["custom"],
        ),
        // --- unknown enum values
        case(
            "unknown model.family",
            b().set("model", "family", "\"bert\""),
            "model.family",
            &["unknown value \"bert\"", "\"gpt\"", "\"llama\""],
        ),
        case(
            "unknown parallel.sharding",
            b().set("parallel", "sharding", "\"full\""),
            "parallel.sharding",
            &["unknown value \"full\"", "\"full_shard\"", "\"zero3\"", "\"none\""],
        ),
        case(
            "unknown parallel.backward_prefetch",
            b().set("parallel", "backward_prefetch", "\"backward_pre\""),
            "parallel.backward_prefetch",
            &["unknown value \"backward_pre\"", "\"pre\"", "\"post\""],
        ),
        case(
            "unknown parallel.framework",
            b().set("parallel", "framework", "\"colossalai\""),
            "parallel.framework",
            &["unknown value \"colossalai\"", "\"fsdp\"", "\"deepspeed\"", "\"megatron\""],
        ),
        case(
            "unknown parallel.wrap",
            b().set("parallel", "wrap", "\"layer\""),
            "parallel.wrap",
            &["unknown value \"layer\"", "\"block\""],
        ),
        case(
            "unknown training.optimizer",
            b().set("training", "optimizer", "\"lion\""),
            "training.optimizer",
            &["unknown value \"lion\"", "\"adamw\"", "\"sgd\""],
        ),
        case(
            "unknown training.optimizer_impl",
            b().set("training", "optimizer_impl", "\"apex\""),
            "training.optimizer_impl",
            &["unknown value \"apex\"", "\"foreach\"", "\"fused\""],
        ),
        case(
            "overlap_p2p_communication without a pipeline",
            b().set("parallel", "overlap_p2p_communication", "true"),
            "parallel.overlap_p2p_communication",
            &["only applies to pipeline parallelism"],
        ),
        case(
            "training.clip_grad_norm not a boolean",
            b().set("training", "clip_grad_norm", "\"yes\""),
            "training.clip_grad_norm",
            &["expected a boolean"],
        ),
        case(
            "unknown training.precision",
            b().set("training", "precision", "\"fp8\""),
            "training.precision",
            &["unknown preset \"fp8\"", "\"bf16-mixed-adam\"", "\"fp32\""],
        ),
        case(
            "unknown training.activation_checkpointing",
            b().set("training", "activation_checkpointing", "\"partial\""),
            "training.activation_checkpointing",
            &["unknown value \"partial\"", "\"full\"", "\"selective\""],
        ),
        case(
            "training.checkpoint_every without full checkpointing",
            b().set("training", "checkpoint_every", "2"),
            "training.checkpoint_every",
            &["activation_checkpointing = \"full\""],
        ),
        case(
            "training.checkpoint_every of zero",
            b().set("training", "activation_checkpointing", "\"full\"").set("training", "checkpoint_every", "0"),
            "training.checkpoint_every",
            &["0"],
        ),
        case(
            "training.checkpoint_every under Megatron",
            b().set("parallel", "framework", "\"megatron\"")
                .set("training", "activation_checkpointing", "\"full\"")
                .set("training", "checkpoint_every", "2"),
            "training.checkpoint_every",
            &["recompute_method"],
        ),
        case(
            "unknown training.recompute_method",
            b().set("parallel", "framework", "\"megatron\"")
                .set("training", "activation_checkpointing", "\"full\"")
                .set("training", "recompute_method", "\"ring\""),
            "training.recompute_method",
            &["unknown value \"ring\"", "\"uniform\"", "\"block\""],
        ),
        case(
            "training.recompute_num_layers without a method",
            b().set("parallel", "framework", "\"megatron\"")
                .set("training", "activation_checkpointing", "\"full\"")
                .set("training", "recompute_num_layers", "2"),
            "training.recompute_num_layers",
            &["recompute_method"],
        ),
        case(
            "uniform recomputation of groups of blocks",
            b().set("parallel", "framework", "\"megatron\"")
                .set("training", "activation_checkpointing", "\"full\"")
                .set("training", "recompute_method", "\"uniform\"")
                .set("training", "recompute_num_layers", "2"),
            "training.recompute_num_layers",
            &["not simulated", "\"block\""],
        ),
        case(
            "training.recompute_method under PyTorch",
            b().set("training", "activation_checkpointing", "\"full\"").set(
                "training",
                "recompute_method",
                "\"block\"",
            ),
            "training.recompute_method",
            &["checkpoint_every"],
        ),
        case(
            "unknown training.activation_offload",
            b().set("training", "activation_offload", "\"cpu\""),
            "training.activation_offload",
            &["unknown value \"cpu\"", "\"overlapped\"", "\"synchronous\""],
        ),
        case(
            "overlapped activation offload under PyTorch",
            b().set("training", "activation_offload", "\"overlapped\""),
            "training.activation_offload",
            &["--cpu-offloading", "\"synchronous\""],
        ),
        case(
            "synchronous activation offload under Megatron",
            b().set("parallel", "framework", "\"megatron\"").set("training", "activation_offload", "\"synchronous\""),
            "training.activation_offload",
            &["\"overlapped\""],
        ),
        case(
            "activation offload with checkpointing",
            b().set("training", "activation_checkpointing", "\"full\"").set(
                "training",
                "activation_offload",
                "\"synchronous\"",
            ),
            "training.activation_offload",
            &["activation_checkpointing = \"none\""],
        ),
        case(
            "activation offload of every layer under Megatron",
            b().set("parallel", "framework", "\"megatron\"")
                .set("training", "activation_offload", "\"overlapped\"")
                .set("training", "activation_offload_layers", "24"),
            "training.activation_offload_layers",
            &["from 1 to 23"],
        ),
        case(
            "activation_offload_layers without offload",
            b().set("training", "activation_offload_layers", "2"),
            "training.activation_offload_layers",
            &["\"overlapped\" or \"synchronous\""],
        ),
        case(
            "training.recompute_modules without Megatron's selective recomputation",
            b().set("training", "recompute_modules", "[\"mlp\"]"),
            "training.recompute_modules",
            &["--recompute-modules", "\"selective\""],
        ),
        case(
            "unknown training.recompute_modules entry",
            b().set("parallel", "framework", "\"megatron\"")
                .set("training", "activation_checkpointing", "\"selective\"")
                .set("training", "recompute_modules", "[\"attention\"]"),
            "training.recompute_modules",
            &["unknown value \"attention\"", "\"core_attn\"", "\"moe_act\""],
        ),
        case(
            "MoE recompute module on a dense model",
            b().set("parallel", "framework", "\"megatron\"")
                .set("training", "activation_checkpointing", "\"selective\"")
                .set("training", "recompute_modules", "[\"moe_act\"]"),
            "training.recompute_modules",
            &["mixture-of-experts"],
        ),
        case(
            "parallel.no_sync without sharded gradients",
            b().set("parallel", "no_sync", "true"),
            "parallel.no_sync",
            &["shard_grad_op", "full_shard"],
        ),
        case(
            "parallel.no_sync under DeepSpeed",
            b().set("parallel", "framework", "\"deepspeed\"")
                .set("parallel", "sharding", "\"zero2\"")
                .set("parallel", "no_sync", "true"),
            "parallel.no_sync",
            &["FSDP"],
        ),
        case(
            "parallel.use_orig_params outside FSDP1",
            b().set("parallel", "sharding", "\"full_shard\"").set("parallel", "use_orig_params", "true"),
            "parallel.use_orig_params",
            &["fsdp1"],
        ),
        case(
            "parallel.wrap = \"peft\" without LoRA",
            b().set("parallel", "sharding", "\"full_shard\"").set("parallel", "wrap", "\"peft\""),
            "parallel.wrap",
            &["[lora]", "\"block\""],
        ),
        case(
            "parallel.hsdp_shard_size without hybrid_shard",
            b().set("parallel", "sharding", "\"full_shard\"").set("parallel", "hsdp_shard_size", "2"),
            "parallel.hsdp_shard_size",
            &["hybrid_shard"],
        ),
        case(
            "parallel.hsdp_shard_size not dividing the data-parallel ranks",
            b().set("hardware", "gpus", "8").set("parallel", "sharding", "\"hybrid_shard\"").set(
                "parallel",
                "hsdp_shard_size",
                "3",
            ),
            "parallel.hsdp_shard_size",
            &["must divide the 8 data-parallel ranks"],
        ),
        case(
            "parallel.async_tp without tensor parallelism",
            b().set("parallel", "sharding", "\"full_shard\"").set("parallel", "async_tp", "true"),
            "parallel.async_tp",
            &["parallel.tensor > 1", "sequence_parallel"],
        ),
        case(
            "parallel.async_tp under Megatron",
            b().set("parallel", "framework", "\"megatron\"").set("parallel", "async_tp", "true"),
            "parallel.async_tp",
            &["tp_comm_overlap"],
        ),
        case(
            "per-op selective checkpointing under Megatron",
            b().set("parallel", "framework", "\"megatron\"").set(
                "training",
                "activation_checkpointing",
                "\"selective-op\"",
            ),
            "training.activation_checkpointing",
            &["torchtitan", "\"selective\""],
        ),
        case(
            "unknown training.attention",
            b().set("training", "attention", "\"xformers\""),
            "training.attention",
            &[
                "unknown value \"xformers\"",
                "\"flash\"",
                "\"math\"",
                "\"eager\"",
                "\"sdpa\"",
                "\"flash_attention_3\"",
                "\"cudnn\"",
            ],
        ),
        case(
            "Hugging Face's eager attention under Megatron",
            b().set("parallel", "framework", "\"megatron\"").set("training", "attention", "\"eager\""),
            "training.attention",
            &["eager_attention_forward", "CoreAttention", "\"math\""],
        ),
        case(
            "PyTorch's SDPA under Megatron",
            b().set("parallel", "framework", "\"megatron\"").set("training", "attention", "\"sdpa\""),
            "training.attention",
            &["scaled_dot_product_attention", "\"flash\""],
        ),
        case(
            "FlashAttention-3 off Hopper",
            b().set("training", "attention", "\"flash_attention_3\""),
            "training.attention",
            &["Hopper GPUs only", "this GPU is ampere", "\"flash_attention_2\""],
        ),
        case(
            "cuDNN attention without a measurement for the GPU",
            b().set("training", "attention", "\"cudnn\""),
            "training.attention",
            &["cuDNN attention's measured rates for Hopper", "this GPU is ampere"],
        ),
        case(
            "unknown training.param_dtype",
            b().set("training", "param_dtype", "\"int8\""),
            "training.param_dtype",
            &["unknown dtype \"int8\"", "\"bf16\"", "\"fp32\""],
        ),
        case(
            "unknown training.master_dtype",
            b().set("training", "master_dtype", "\"fp8\""),
            "training.master_dtype",
            &["unknown dtype \"fp8\"", "\"none\"", "\"fp32\""],
        ),
        // --- missing sections and fields
        case("missing [hardware]", b().remove_section("hardware"), "hardware", &["missing field `hardware`"]),
        case(
            "missing [hardware], file starting with [model]",
            b().remove_section("").remove_section("hardware"),
            "hardware",
            &["missing field `hardware`"],
        ),
        case(
            "missing [training], file starting with a comment",
            b().prepend("# 16 B/param x 1.3B = 21 GB").remove_section("training"),
            "training",
            &["missing section [training]", "micro_batch and seq_len"],
        ),
        // --- optimizer offload
        case(
            "offload with FSDP",
            b().set("parallel", "sharding", "\"zero3\"").set("offload", "optimizer", "\"cpu\""),
            "offload.optimizer",
            &["framework = \"deepspeed\""],
        ),
        case(
            "offload with ZeRO-1",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero1\"").set(
                "offload",
                "optimizer",
                "\"cpu\"",
            ),
            "offload.optimizer",
            &["stage 2 or 3"],
        ),
        case(
            "offload to a GPU",
            b().set("offload", "optimizer", "\"gpu\""),
            "offload.optimizer",
            &["\"cpu\"", "\"nvme\"", "\"none\""],
        ),
        case(
            "FSDP CPU offload to NVMe",
            b().set("parallel", "sharding", "\"full_shard\"").set("offload", "parameters", "\"nvme\""),
            "offload.parameters",
            &["\"cpu\" only", "ZeRO-Infinity"],
        ),
        case(
            "FSDP CPU offload with SHARD_GRAD_OP",
            b().set("parallel", "sharding", "\"shard_grad_op\"").set("offload", "parameters", "\"cpu\""),
            "offload.parameters",
            &["\"full_shard\""],
        ),
        case(
            "DeepSpeed parameter offload without optimizer offload",
            b().set("parallel", "framework", "\"deepspeed\"")
                .set("parallel", "sharding", "\"zero3\"")
                .set("offload", "optimizer", "\"none\"")
                .set("offload", "parameters", "\"cpu\""),
            "offload.optimizer",
            &["offload_param", "\"nvme\""],
        ),
        case(
            "DeepSpeed parameter offload with ZeRO-2",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero2\"").set(
                "offload",
                "parameters",
                "\"nvme\"",
            ),
            "offload.parameters",
            &["stage 3", "\"zero3\""],
        ),
        case(
            "offload with negative NVMe bandwidth",
            b().set("parallel", "framework", "\"deepspeed\"")
                .set("parallel", "sharding", "\"zero3\"")
                .set("offload", "optimizer", "\"nvme\"")
                .set("offload", "nvme_write_gb_per_s", "-5.0"),
            "offload.nvme_write_gb_per_s",
            &["positive number"],
        ),
        case(
            "offload with zero NVMe capacity",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero3\"").set(
                "offload",
                "nvme_capacity",
                "0",
            ),
            "offload.nvme_capacity",
            &["positive"],
        ),
        case(
            "offload with zero PCIe bandwidth",
            b().set("parallel", "framework", "\"deepspeed\"").set("parallel", "sharding", "\"zero2\"").set(
                "offload",
                "h2d_gb_per_s",
                "0.0",
            ),
            "offload.h2d_gb_per_s",
            &["positive number"],
        ),
        // --- inference jobs
        case("unknown job kind", b().set("job", "kind", "\"serve\""), "job.kind", &["\"serve\"", "\"inference\""]),
        case(
            "finetune-lora without [lora]",
            b().set("job", "kind", "\"finetune-lora\""),
            "lora",
            &["missing section [lora]"],
        ),
        case("[lora] on a full training job", b().set("lora", "rank", "8"), "lora", &["finetune-lora"]),
        case(
            "LoRA on an unknown module",
            lora().set("lora", "target_modules", "[\"q_proj\"]"),
            "lora.target_modules",
            &["unknown module \"q_proj\" for the gpt family", "\"c_attn\"", "\"all-linear\""],
        ),
        case("LoRA rank 0", lora().set("lora", "rank", "0"), "lora.rank", &["positive integer"]),
        case(
            "LoRA double_quant on a BF16 base",
            lora().set("lora", "double_quant", "true"),
            "lora.double_quant",
            &["base_weights = \"nf4\""],
        ),
        case(
            "LoRA prepare_kbit_training on a BF16 base",
            lora().set("lora", "prepare_kbit_training", "true"),
            "lora.prepare_kbit_training",
            &["base_weights = \"nf4\""],
        ),
        case(
            "QLoRA's FP32 stream on the gpt family",
            lora().set("lora", "base_weights", "\"nf4\"").set("model", "family", "\"gpt\""),
            "lora.prepare_kbit_training",
            &["llama family only", "prepare_kbit_training = false"],
        ),
        case(
            "QLoRA's FP32 norms in FSDP1's flat units",
            lora()
                .set("lora", "base_weights", "\"nf4\"")
                .set("lora", "prepare_kbit_training", "true")
                .set("hardware", "gpus", "8")
                .set("parallel", "sharding", "\"full_shard\""),
            "lora.prepare_kbit_training",
            &["uniform dtype", "fsdp2"],
        ),
        case(
            "LoRA unknown base",
            lora().set("lora", "base_weights", "\"int4\""),
            "lora.base_weights",
            &["\"bf16\"", "\"nf4\""],
        ),
        case(
            "LoRA with tensor parallelism",
            lora().set("model", "vocab", "50304").set("hardware", "gpus", "2").set("parallel", "tensor", "2"),
            "parallel.tensor",
            &["not simulated yet"],
        ),
        case("LoRA dropout 1", lora().set("lora", "dropout", "1.0"), "lora.dropout", &["[0, 1)"]),
        case(
            "inference without [inference]",
            b().remove_section("training").set("job", "kind", "\"inference\""),
            "inference",
            &["missing section [inference]", "prompt_len"],
        ),
        case(
            "inference with [training]",
            inf().set("training", "micro_batch", "1").set("training", "seq_len", "8"),
            "training",
            &["does not apply", "[inference]"],
        ),
        case(
            "[inference] on a training job",
            b().set("inference", "batch", "1").set("inference", "prompt_len", "8").set("inference", "gen_len", "8"),
            "inference",
            &["[job] kind = \"inference\""],
        ),
        case("zero gen_len", inf().set("inference", "gen_len", "0"), "inference.gen_len", &["positive integer"]),
        case(
            "context over max_seq_len",
            inf().set("inference", "prompt_len", "2001"),
            "inference.gen_len",
            &["2049 tokens exceeds model.max_seq_len (2048)"],
        ),
        case(
            "unknown weights",
            inf().set("inference", "weights", "\"int3\""),
            "inference.weights",
            &["\"int3\"", "\"nf4\""],
        ),
        case(
            "group_size without int4",
            inf().set("inference", "group_size", "64"),
            "inference.group_size",
            &["only applies to weights = \"int4\""],
        ),
        case(
            "double_quant without nf4",
            inf().set("inference", "weights", "\"int4\"").set("inference", "double_quant", "true"),
            "inference.double_quant",
            &["nf4"],
        ),
        case(
            "bf16 weights computing in fp16",
            inf().set("inference", "compute_dtype", "\"fp16\""),
            "inference.compute_dtype",
            &["bf16 weights compute in bf16"],
        ),
        case(
            "fp8 dynamic cache",
            inf().set("inference", "kv_cache", "\"dynamic\"").set("inference", "kv_cache_dtype", "\"fp8\""),
            "inference.kv_cache_dtype",
            &["kv_cache = \"static\""],
        ),
        case(
            "kv cache dtype unknown",
            inf().set("inference", "kv_cache_dtype", "\"int8\""),
            "inference.kv_cache_dtype",
            &["\"bf16\"", "\"fp8\""],
        ),
        case(
            "CUDA graphs with a dynamic cache",
            inf().set("inference", "kv_cache", "\"dynamic\"").set("inference", "cuda_graphs", "true"),
            "inference.cuda_graphs",
            &["fixed shapes"],
        ),
        case(
            "FSDP sharding for inference",
            inf().set("parallel", "sharding", "\"full_shard\""),
            "parallel.sharding",
            &["applies to training"],
        ),
        case(
            "bf16 inference on a V100",
            inf().set("hardware", "gpu", "\"v100-32gb\""),
            "inference.weights",
            &["no BF16 tensor cores", "fp16"],
        ),
        case(
            "missing model.hidden",
            b().remove("model", "hidden"),
            "model.hidden",
            &["is required", "model.hf_config"],
        ),
        case(
            "missing model.hidden, inline table",
            b().remove_section("model")
                .prepend("model = { family = \"gpt\", n_layers = 24, n_heads = 16, vocab = 50257 }"),
            "model.hidden",
            &["is required", "model.name"],
        ),
        case("empty file", Doc(Vec::new()), "model", &["missing field `model`"]),
        // --- combinations that make no sense
        case(
            "momentum with adamw",
            b().set("training", "momentum", "true"),
            "training.momentum",
            &["only applies to optimizer = \"sgd\""],
        ),
        case(
            "reshard_after_forward with shard_grad_op",
            b().set("parallel", "sharding", "\"shard_grad_op\"").set("parallel", "reshard_after_forward", "true"),
            "parallel.reshard_after_forward",
            &["SHARD_GRAD_OP", "use sharding = \"full_shard\""],
        ),
        // --- training.kernels
        case(
            "unknown kernel stack",
            b().set("training", "kernels", "\"jit\""),
            "training.kernels",
            &["unknown value \"jit\"", "\"eager\"", "\"compiled\"", "\"fused\""],
        ),
        // --- training.loss
        case(
            "unknown loss",
            b().set("training", "loss", "\"chunked\""),
            "training.loss",
            &["unknown value \"chunked\"", "\"fused-linear\""],
        ),
        case(
            "logits_fp32 with a fused loss",
            b().set("training", "loss", "\"fused-linear\"").set("training", "logits_fp32", "true"),
            "training.logits_fp32",
            &["applies to loss = \"eager\" only"],
        ),
        case(
            "fused-linear loss with tensor parallelism",
            b().set("hardware", "gpus", "2").set("model", "vocab", "50304").set("parallel", "tensor", "2").set(
                "training",
                "loss",
                "\"fused-linear\"",
            ),
            "training.loss",
            &["whole vocabulary", "\"vocab-parallel\""],
        ),
        case(
            "compiled loss with tensor parallelism",
            b().set("hardware", "gpus", "2").set("model", "vocab", "50304").set("parallel", "tensor", "2").set(
                "training",
                "loss",
                "\"compiled\"",
            ),
            "training.loss",
            &["torch.compile's fused cross-entropy", "parallel.tensor = 1"],
        ),
        case(
            "fused-linear loss with LoRA",
            lora().set("training", "loss", "\"fused-linear\""),
            "training.loss",
            &["LoRA is not simulated yet"],
        ),
        // --- [parallel] context
        case("context 0", h100().set("parallel", "context", "0"), "parallel.context", &["must be a positive integer"]),
        case(
            "Ulysses with heads not divisible by the degree",
            h100()
                .set("hardware", "gpus", "32")
                .set("parallel", "framework", "\"deepspeed\"")
                .set("parallel", "sharding", "\"zero2\"")
                .set("parallel", "context", "32"),
            "parallel.context",
            &["Ulysses", "not divisible by 32"],
        ),
        case(
            "unknown parallel.context_rotate",
            h100().set("hardware", "gpus", "2").set("parallel", "context", "2").set(
                "parallel",
                "context_rotate",
                "\"ring\"",
            ),
            "parallel.context_rotate",
            &["unknown value \"ring\"", "\"allgather\"", "\"alltoall\""],
        ),
        case(
            "parallel.context_rotate without context parallelism",
            h100().set("parallel", "context_rotate", "\"alltoall\""),
            "parallel.context_rotate",
            &["parallel.context > 1"],
        ),
        case(
            "unknown parallel.context_comm",
            h100()
                .set("hardware", "gpus", "2")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "context", "2")
                .set("parallel", "context_comm", "\"ring\""),
            "parallel.context_comm",
            &["unknown value \"ring\"", "\"p2p\"", "\"a2a\""],
        ),
        case(
            "parallel.context_comm under FSDP",
            h100().set("hardware", "gpus", "2").set("parallel", "context", "2").set(
                "parallel",
                "context_comm",
                "\"a2a\"",
            ),
            "parallel.context_comm",
            &["--cp-comm-type", "context_rotate"],
        ),
        case(
            "parallel.context_rotate under Megatron",
            h100()
                .set("hardware", "gpus", "2")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "context", "2")
                .set("parallel", "context_rotate", "\"allgather\""),
            "parallel.context_rotate",
            &["framework = \"fsdp\"", "context_comm"],
        ),
        case(
            "context not dividing the GPUs",
            h100()
                .set("hardware", "gpus", "4")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "context", "3"),
            "parallel.context",
            &["x context (3) = 3 must divide hardware.gpus (4)"],
        ),
        case(
            "context with math attention",
            h100()
                .set("hardware", "gpus", "2")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "context", "2")
                .set("training", "attention", "\"math\""),
            "parallel.context",
            &["flash"],
        ),
        case(
            "context with a sequence not split in 2 x context chunks",
            h100()
                .set("hardware", "gpus", "3")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "context", "3"),
            "training.seq_len",
            &["2 x 3 load-balanced chunks", "not divisible by 6"],
        ),
        case(
            "context with a mixture of experts under FSDP",
            moe()
                .set("hardware", "gpu", "\"h100-sxm\"")
                .set("hardware", "gpus", "2")
                .set("parallel", "framework", "\"fsdp\"")
                .set("parallel", "context", "2"),
            "parallel.context",
            &["mixture of experts", "framework = \"megatron\"", "torchtitan"],
        ),
        case(
            "context with a mixture of experts under DeepSpeed",
            moe()
                .set("hardware", "gpu", "\"h100-sxm\"")
                .set("hardware", "gpus", "2")
                .set("parallel", "framework", "\"deepspeed\"")
                .set("parallel", "sharding", "\"zero1\"")
                .set("parallel", "context", "2"),
            "parallel.context",
            &["mixture of experts", "framework = \"megatron\"", "DeepSpeed"],
        ),
        case(
            "context with multi-head latent attention outside Megatron",
            mla()
                .set("hardware", "gpu", "\"h100-sxm\"")
                .set("hardware", "gpus", "2")
                .set("parallel", "framework", "\"fsdp\"")
                .set("parallel", "context", "2"),
            "parallel.context",
            &["multi-head latent attention", "parallel.context = 1"],
        ),
        case(
            "expert x expert_tensor not dividing tensor x context x data",
            moe()
                .set("hardware", "gpu", "\"h100-sxm\"")
                .set("hardware", "gpus", "4")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "context", "2")
                .set("parallel", "expert", "4")
                .set("parallel", "expert_tensor", "2"),
            "parallel.expert_tensor",
            &["(2 x 4 = 8)", "tensor x context x data-parallel ranks (1 x 2 x 2 = 4)"],
        ),
        case(
            "context with jitter",
            h100()
                .set("hardware", "gpus", "2")
                .set("parallel", "framework", "\"megatron\"")
                .set("parallel", "context", "2")
                .set("jitter", "seed", "1"),
            "jitter",
            &["context parallelism is not simulated yet"],
        ),
        // --- [fp8]
        case(
            "[fp8] on an A100",
            b().set("fp8", "recipe", "\"tensorwise\""),
            "fp8",
            &["a100-80gb has no FP8 tensor cores"],
        ),
        case(
            "[fp8] without a recipe",
            h100().set("fp8", "wgrad", "true"),
            "fp8.recipe",
            &["is required", "\"delayed\""],
        ),
        case(
            "[fp8] unknown recipe",
            h100().set("fp8", "recipe", "\"nvfp4\""),
            "fp8.recipe",
            &["unknown value \"nvfp4\"", "\"blockwise\"", "\"mxfp8\""],
        ),
        case(
            "[fp8] mxfp8 on Hopper",
            h100().set("fp8", "recipe", "\"mxfp8\""),
            "fp8.recipe",
            &["not supported on h100-sxm", "compute capability 10.x"],
        ),
        case(
            "[fp8] delayed under FSDP",
            h100().set("fp8", "recipe", "\"delayed\""),
            "fp8.recipe",
            &["Transformer Engine", "framework = \"megatron\""],
        ),
        case(
            "[fp8] tensorwise under Megatron",
            h100().set("parallel", "framework", "\"megatron\"").set("fp8", "recipe", "\"tensorwise\""),
            "fp8.recipe",
            &["torchao", "use \"delayed\""],
        ),
        case(
            "[fp8] wgrad with a torchao recipe",
            h100().set("fp8", "recipe", "\"rowwise\"").set("fp8", "wgrad", "false"),
            "fp8.wgrad",
            &["Transformer Engine's recipes", "torchao's run every GEMM in FP8"],
        ),
        case(
            "[fp8] FP8 all-gather with rowwise scaling",
            h100().set("parallel", "sharding", "\"full_shard\"").set("fp8", "recipe", "\"rowwise\"").set(
                "fp8",
                "fsdp_all_gather",
                "true",
            ),
            "fp8.fsdp_all_gather",
            &["\"tensorwise\" only"],
        ),
        case(
            "[fp8] FP8 all-gather without sharded parameters",
            h100().set("fp8", "recipe", "\"tensorwise\"").set("fp8", "fsdp_all_gather", "true"),
            "fp8.fsdp_all_gather",
            &["full_shard"],
        ),
        case(
            "[fp8] amax history of 0 rows",
            h100().set("parallel", "framework", "\"megatron\"").set("fp8", "recipe", "\"delayed\"").set(
                "fp8",
                "amax_history_len",
                "0",
            ),
            "fp8.amax_history_len",
            &["from 1 to 2^20", "got 0"],
        ),
        case(
            "[fp8] with fp32 compute",
            h100().set("training", "precision", "\"fp32\"").set("fp8", "recipe", "\"tensorwise\""),
            "fp8",
            &["bf16 or fp16 preset"],
        ),
        case(
            "[fp8] on a LoRA job",
            lora().set("hardware", "gpu", "\"h100-sxm\"").set("fp8", "recipe", "\"tensorwise\""),
            "fp8",
            &["training jobs only"],
        ),
        case(
            "[fp8] unknown field",
            h100().set("fp8", "recipe", "\"tensorwise\"").set("fp8", "all_gather", "true"),
            "fp8.all_gather",
            &["unknown field `all_gather`"],
        ),
        case("name that is a path", b().prepend("name = \"a/b\""), "name", &["\"a/b\" cannot name an output folder"]),
        // --- TOML syntax
        case("value missing", b().replace_line("hidden = 2048", "hidden = "), "model.hidden", &["invalid string"])
            .at_line(6),
        case(
            "unterminated table header",
            b().replace_line("[hardware]", "[hardware"),
            "hardware",
            &["invalid table header", "expected"],
        )
        .at_line(11),
        case("key without `=`", b().replace_line("vocab = 50257", "vocab 50257"), "model", &["expected", "`=`"])
            .at_line(8),
        case(
            "duplicate key",
            b().replace_line("vocab = 50257", "vocab = 50257\nvocab = 32000"),
            "model.vocab",
            &["duplicate key `vocab`"],
        )
        .at_line(9),
    ]
}

/// Checks one failed invocation: exit 2, nothing on stdout, one line on stderr of the form
/// `error: <file>: field `<field>`: <message>` (or `error: <file>: <message>` without a
/// field), no panic.
fn check_rejected(what: &str, out: &Output, file: &Path, field: &str) -> Result<String, String> {
    let stderr = text(&out.stderr);
    let fail = |why: String| Err(format!("{what}: {why}\n  stderr: {stderr}"));
    if out.status.code() != Some(2) {
        return fail(format!("exit status {:?}, want 2", out.status.code()));
    }
    if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
        return fail("panicked".into());
    }
    if !out.stdout.is_empty() {
        return fail(format!("stdout not empty: {}", text(&out.stdout)));
    }
    let prefix = if field.is_empty() {
        format!("error: {}: ", file.display())
    } else {
        format!("error: {}: field `{field}`: ", file.display())
    };
    if !stderr.starts_with(&prefix) {
        return fail(format!("stderr does not start with `{prefix}`"));
    }
    if stderr.trim_end().lines().count() != 1 {
        return fail("stderr is not one line".into());
    }
    Ok(stderr)
}

fn run_case(c: &Case) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scenario.toml");
    std::fs::write(&file, &c.toml).unwrap();
    let out_dir = dir.path().join("out");
    let f = file.to_str().unwrap();
    let o = out_dir.to_str().unwrap();

    let run = stepsim(&["run", f, "--out", o], dir.path());
    let stderr = check_rejected(c.name, &run, &file, c.field)?;
    for h in c.hints {
        if !stderr.contains(h) {
            return Err(format!("{}: stderr lacks `{h}`\n  stderr: {stderr}", c.name));
        }
    }
    if let Some(line) = c.line {
        let want = format!("(line {line})");
        if !stderr.contains(&want) {
            return Err(format!("{}: stderr lacks `{want}`\n  stderr: {stderr}", c.name));
        }
    }
    if out_dir.exists() {
        return Err(format!("{}: {} was created", c.name, out_dir.display()));
    }
    if dir.path().join("output").exists() {
        return Err(format!("{}: output/ was created", c.name));
    }

    // `check` rejects it the same way.
    let check = stepsim(&["check", f], dir.path());
    let check_stderr = check_rejected(&format!("{} (check)", c.name), &check, &file, c.field)?;
    if check_stderr != stderr {
        return Err(format!("{}: `check` and `run` disagree\n  run:   {stderr}\n  check: {check_stderr}", c.name));
    }
    Ok(())
}

#[test]
fn base_scenario_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scenario.toml");
    std::fs::write(&file, Doc::base().text()).unwrap();
    let out = stepsim(&["check", file.to_str().unwrap()], dir.path());
    assert_eq!(out.status.code(), Some(0), "the base scenario must pass `check`: {}", text(&out.stderr));
}

#[test]
fn malformed_scenarios_are_rejected() {
    let cases = cases();
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "duplicate case name {}", c.name);
        assert_ne!(c.toml, Doc::base().text(), "{}: did not change the base", c.name);
    }
    let failures: Vec<String> = cases.iter().filter_map(|c| run_case(c).err()).collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n\n{}", failures.len(), cases.len(), failures.join("\n\n"));
}

#[test]
fn unreadable_scenario_paths_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-scenario.toml");
    let not_utf8 = dir.path().join("latin1.toml");
    std::fs::write(&not_utf8, b"description = \"caf\xe9\"\n").unwrap();
    let a_dir = dir.path().join("a-directory.toml");
    std::fs::create_dir(&a_dir).unwrap();
    let cases: [(&str, PathBuf); 3] = [
        ("path that does not exist", missing),
        ("file that is not UTF-8", not_utf8),
        ("path that is a directory", a_dir),
    ];

    let mut failures = Vec::new();
    for (what, path) in &cases {
        let out_dir = dir.path().join(format!("out-{}", what.replace(' ', "-")));
        let run = stepsim(&["run", path.to_str().unwrap(), "--out", out_dir.to_str().unwrap()], dir.path());
        match check_rejected(what, &run, path, "") {
            Ok(stderr) if !stderr.contains("cannot read the scenario file") => {
                failures.push(format!("{what}: stderr does not say it cannot read the file: {stderr}"))
            }
            Ok(_) => {}
            Err(e) => failures.push(e),
        }
        if out_dir.exists() {
            failures.push(format!("{what}: {} was created", out_dir.display()));
        }
        let check = stepsim(&["check", path.to_str().unwrap()], dir.path());
        if let Err(e) = check_rejected(&format!("{what} (check)"), &check, path, "") {
            failures.push(e);
        }
    }
    assert!(!dir.path().join("output").exists(), "output/ was created");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn bad_command_lines_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-1.3b-1gpu.toml");
    let good = good.to_str().unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("no arguments", &[]),
        ("run without a scenario", &["run"]),
        ("check without a scenario", &["check"]),
        ("unknown subcommand", &["frobnicate"]),
        ("unknown flag", &["run", good, "--bogus"]),
        ("unknown flag on check", &["check", good, "--bogus"]),
        ("--out without a value", &["run", good, "--out"]),
        ("two scenarios", &["run", good, good]),
        ("flag value given to --json", &["run", good, "--json=yes"]),
    ];
    let mut failures = Vec::new();
    for (what, args) in cases {
        let out = stepsim(args, dir.path());
        let stderr = text(&out.stderr);
        if out.status.code() != Some(2) {
            failures.push(format!("{what}: exit {:?}, want 2; stderr: {stderr}", out.status.code()));
        }
        if stderr.contains("panicked") {
            failures.push(format!("{what}: panicked: {stderr}"));
        }
        if stderr.trim().is_empty() {
            failures.push(format!("{what}: nothing on stderr"));
        }
        if !out.stdout.is_empty() {
            failures.push(format!("{what}: stdout not empty: {}", text(&out.stdout)));
        }
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "bad command lines wrote files: {left:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 22: values past stepsim's stated limits are refused with the field and the limit,
/// never wrapped (`vocab = 2^63 - 1` once reported 104,128 parameters and "FITS"), and a
/// simulation too large to hold is refused before it is built, saying what to reduce.
#[test]
fn sizes_past_the_stated_limits_are_refused() {
    let base =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-1.3b-1gpu.toml")).unwrap();
    let with = |key: &str, value: &str| {
        let text: String = base
            .lines()
            .map(|l| if l.starts_with(&format!("{key} =")) { format!("{key} = {value}") } else { l.to_string() })
            .collect::<Vec<_>>()
            .join("\n");
        stepsim::scenario::Scenario::from_toml(Path::new("limits.toml"), &text).map(|_| ()).unwrap_err().to_string()
    };
    for (key, value, field, want) in [
        ("vocab", "9223372036854775807", "model.vocab", "at most 16777216"),
        ("hidden", "4294967296", "model.hidden", "at most 1048576"),
        ("n_layers", "2147483648", "model.n_layers", "at most 1024"),
        ("max_seq_len", "1000000000000000", "model.max_seq_len", "at most 16777216"),
        ("micro_batch", "10000000", "training.micro_batch", "at most 1048576"),
        ("grad_accum", "1000000000000000000", "training.grad_accum", "at most 65536"),
        ("grad_accum", "65536", "training.grad_accum", "would simulate about"),
    ] {
        let e = with(key, value);
        assert!(e.contains(&format!("field `{field}`")) && e.contains(want), "{key} = {value}: {e}");
    }
    // Each size within its limit, their product not: 2^22 experts of width 2^22 over a hidden
    // state of 2^20 overflowed the parameter count (a panic, exit 3) before the model's
    // parameters were bounded.
    let text = base.replace("family = \"gpt\"", "family = \"llama\"").replace("hidden = 2048", "hidden = 1048576")
        + "\n[model.moe]\nnum_experts = 4194304\ntop_k = 2\nexpert_ffn_hidden = 4194304\n";
    let e =
        stepsim::scenario::Scenario::from_toml(Path::new("limits.toml"), &text).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("field `model.moe.num_experts`") && e.contains("parameters") && e.contains("2^50"), "{e}");
    // `bucket_cap_mb = 2^53` saturated DDP's bucket bytes to 2^64 - 1 and ran.
    let text = format!("{base}\n[parallel]\nbucket_cap_mb = 9007199254740992\n");
    let e =
        stepsim::scenario::Scenario::from_toml(Path::new("limits.toml"), &text).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("field `parallel.bucket_cap_mb`") && e.contains("up to 2^24"), "{e}");
}

/// Issue 22: a control character (even in a comment) and bytes that are not UTF-8 get an
/// error with their line and column (the TOML parser's own message for them was empty).
#[test]
fn control_characters_and_invalid_utf8_are_placed() {
    let base =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-1.3b-1gpu.toml")).unwrap();
    let lines = base.lines().count() + 1;
    for (tail, what) in [("# a \u{0} b\n", "U+0000"), ("# a \r b\n", "U+000D"), ("x = 1\u{1b}\n", "U+001B")] {
        let e = stepsim::scenario::Scenario::from_toml(Path::new("ctl.toml"), &format!("{base}{tail}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("line {lines}, column")) && e.contains(what), "{e}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("latin1.toml");
    let mut bytes = base.into_bytes();
    bytes.extend_from_slice(b"# caf\xe9\n");
    std::fs::write(&p, bytes).unwrap();
    let e = stepsim::scenario::Scenario::load(&p).unwrap_err().to_string();
    assert!(e.contains(&format!("line {lines}, column 6")) && e.contains("not UTF-8"), "{e}");
}
