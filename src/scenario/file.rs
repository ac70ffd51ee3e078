//! The file types: serde mirrors of a scenario file's sections, as a user writes them
//! (every field optional where stepsim has a default). Validation turns them into a
//! [`super::Scenario`].

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// `extends = "base.toml"`: resolved when a file is loaded ([`super::extends`]); one
    /// that reaches validation (scenario text or a value tree given directly) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<toml::Value>,
    /// Defaults to the file stem.
    pub name: Option<String>,
    pub description: Option<String>,
    pub model: ModelSection,
    pub hardware: HardwareSection,
    #[serde(default)]
    pub parallel: ParallelSection,
    /// What is simulated (default: a training step).
    pub job: Option<JobSection>,
    /// Required for `job.kind = "train"`.
    pub training: Option<TrainingSection>,
    /// Required for `job.kind = "inference"`.
    pub inference: Option<InferenceSection>,
    /// `job.kind = "finetune-lora"`: the adapters (PEFT `LoraConfig`) and the frozen base.
    pub lora: Option<LoraSection>,
    /// DeepSpeed ZeRO-Offload of the optimizer to CPU memory.
    pub offload: Option<OffloadSection>,
    /// DeepSpeed's `zero_optimization` bucket knobs (with `parallel.framework = "deepspeed"`).
    pub deepspeed: Option<DeepspeedSection>,
    /// Megatron-Core's overlap options (with `parallel.framework = "megatron"`).
    pub megatron: Option<MegatronSection>,
    #[serde(default)]
    pub allocator: AllocatorSection,
    /// The NCCL build's connection and memory settings (PyTorch 2.15's defaults when absent).
    pub nccl: Option<NcclSection>,
    /// Per-rank compute jitter and stragglers (off when absent).
    pub jitter: Option<JitterSection>,
    /// How a mixture of experts' router spreads tokens (uniform when absent).
    pub moe: Option<RoutingSection>,
    /// FP8 training of the transformer blocks' linears (off when absent).
    pub fp8: Option<Fp8Section>,
}

/// `[fp8]`: FP8 training, by the library that does it.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Fp8Section {
    /// "delayed" (Transformer Engine under Megatron-Core) | "tensorwise" | "rowwise"
    /// (torchao float8 under FSDP).
    pub recipe: Option<String>,
    /// delayed: weight-gradient GEMMs in FP8 (`--fp8-wgrad`, default true).
    pub wgrad: Option<bool>,
    /// delayed: `--fp8-amax-history-len` (Megatron's default 1).
    pub amax_history_len: Option<i64>,
    /// tensorwise under FSDP with sharded parameters: all-gather the float8 linears'
    /// weights in FP8 (torchtitan `float8.enable_fsdp_float8_all_gather`, default false).
    pub fsdp_all_gather: Option<bool>,
}

/// `[moe]`: how the router spreads token copies over the experts.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingSection {
    /// "uniform" (default) | "zipf" | "measured".
    pub routing: Option<String>,
    /// zipf: expert j of a seeded order gets a share proportional to 1 / (j + 1)^exponent
    /// (default 1.0).
    pub zipf_exponent: Option<f64>,
    /// zipf: the seed of the experts' order (default 0).
    pub seed: Option<i64>,
    /// measured: tokens (any scale) each expert received, in expert order.
    pub tokens_per_expert: Option<Vec<f64>>,
    /// Megatron-Core `--moe-expert-capacity-factor`: drop what a rank sends an expert beyond
    /// ceil(tokens x top_k / experts x factor) copies (default: dropless).
    pub capacity_factor: Option<f64>,
    /// `--moe-pad-expert-input-to-capacity`: every expert computes exactly its capacity.
    pub pad_to_capacity: Option<bool>,
    /// The router's auxiliary load-balancing loss: "none", or Megatron-Core's
    /// `--moe-router-load-balancing-type` with a coefficient above 0 ("aux_loss",
    /// "seq_aux_loss", "global_aux_loss", one or a list), or under Hugging Face model code
    /// "aux_loss" (`output_router_logits = true`).
    pub aux_loss: Option<Names>,
    /// "alltoall" (default: `--moe-token-dispatcher-type alltoall`) | "deepep" (`flex` with
    /// `--moe-flex-dispatcher-backend deepep`).
    pub dispatcher: Option<String>,
    /// `--moe-flex-dispatcher-num-sms` (default 20): the SMs DeepEP's kernels hold.
    pub deepep_sms: Option<i64>,
}

/// `[job]`: what the GPUs do.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// "train" (default) | "inference" | "finetune-lora" (not simulated yet).
    pub kind: Option<String>,
}

/// `[inference]`: a `generate()` call, in Hugging Face / gpt-fast / vLLM terms.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InferenceSection {
    /// Sequences generated together.
    pub batch: i64,
    /// Prompt tokens per sequence.
    pub prompt_len: i64,
    /// Tokens generated per sequence (`max_new_tokens`).
    pub gen_len: i64,
    /// "bf16" | "fp16" | "int8" | "int4" (GPTQ/AWQ) | "nf4" (bitsandbytes).
    pub weights: Option<String>,
    /// int4: input features per quantization group (default 128).
    pub group_size: Option<i64>,
    /// nf4: `bnb_4bit_use_double_quant` (default false).
    pub double_quant: Option<bool>,
    /// "bf16" | "fp16" (default bf16; fp16 weights compute in fp16).
    pub compute_dtype: Option<String>,
    /// The compute dtype (default) or "fp8".
    pub kv_cache_dtype: Option<String>,
    /// "static" (preallocated, default) | "dynamic" (HF DynamicCache, grown by torch.cat).
    pub kv_cache: Option<String>,
    /// Decode replayed as a CUDA graph (default: true with a static cache).
    pub cuda_graphs: Option<bool>,
}

/// `[offload]`: DeepSpeed `zero_optimization.offload_optimizer` / `offload_param`, or FSDP's
/// `CPUOffload(offload_params=True)`, and the host and NVMe they use.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OffloadSection {
    /// "cpu" | "nvme" (DeepSpeed `offload_optimizer.device`) | "none".
    pub optimizer: Option<String>,
    /// "cpu" | "nvme" (DeepSpeed `offload_param.device`, ZeRO-3; FSDP: "cpu" is
    /// `CPUOffload(offload_params=True)`) | "none" (default).
    pub parameters: Option<String>,
    /// Host memory per node, bytes (default 2 TB, a DGX A100 / H100).
    #[serde(default, deserialize_with = "super::byte_size::opt")]
    pub cpu_memory: Option<i64>,
    /// NVMe capacity per node, bytes (default 30.72 TB, a DGX H100's eight 3.84 TB drives).
    #[serde(default, deserialize_with = "super::byte_size::opt")]
    pub nvme_capacity: Option<i64>,
    /// Pinned copy bandwidth per GPU, GB/s (default from the GPU's PCIe generation).
    pub h2d_gb_per_s: Option<f64>,
    pub d2h_gb_per_s: Option<f64>,
    /// NVMe bandwidth of the whole node, GB/s, shared by its GPUs (default 10 read, 5 write).
    pub nvme_read_gb_per_s: Option<f64>,
    pub nvme_write_gb_per_s: Option<f64>,
    /// CPU optimizer throughput per GPU's partition, parameters/s (default 1e9 for
    /// DeepSpeedCPUAdam, 1e9 / 6 for torch.optim on CPU; assumed).
    pub cpu_adam_params_per_s: Option<f64>,
}

/// `[lora]`: PEFT's `LoraConfig`, and how the frozen base is stored (QLoRA: NF4).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSection {
    /// `r` (default 8, PEFT's).
    pub rank: Option<i64>,
    /// `lora_alpha` (default 8): scales the update; no effect on memory or time.
    pub alpha: Option<f64>,
    /// `target_modules` by their Hugging Face names, or ["all-linear"].
    pub target_modules: Option<Vec<String>>,
    /// `lora_dropout` (default 0).
    pub dropout: Option<f64>,
    /// Frozen base linears: "bf16" (LoRA, default) | "nf4" (QLoRA, bitsandbytes).
    pub base_weights: Option<String>,
    /// nf4: `bnb_4bit_use_double_quant` (default false).
    pub double_quant: Option<bool>,
    /// nf4: whether PEFT's `prepare_model_for_kbit_training` ran: the embeddings, norms and
    /// head upcast to FP32, and with them the residual stream. Default: true where the
    /// parameters are held whole (one GPU, DDP, ZeRO-1/2), false where they are sharded
    /// (FSDP, ZeRO-3), where TRL's trainers skip it.
    pub prepare_kbit_training: Option<bool>,
}

/// What a scenario simulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobKind {
    Train,
    FinetuneLora,
    Inference,
}

/// `[jitter]`: rank-to-rank variation of compute time, drawn from `seed`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JitterSection {
    pub seed: i64,
    /// Coefficient of variation of each op's compute time across ranks (0.02 = 2%).
    pub compute_cv: Option<f64>,
    /// Ranks that are persistently slow, and by how much (0.1 = 10% slower).
    pub stragglers: Option<i64>,
    pub straggler_slowdown: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A model of the zoo (`stepsim models`), e.g. "llama-3.1-8b": its `config.json`.
    pub name: Option<String>,
    /// A Hugging Face `config.json` (relative to the scenario file); the other fields
    /// override what it says.
    pub hf_config: Option<String>,
    pub family: Option<String>,
    pub n_layers: Option<i64>,
    pub hidden: Option<i64>,
    pub n_heads: Option<i64>,
    pub n_kv_heads: Option<i64>,
    pub ffn_hidden: Option<i64>,
    pub vocab: Option<i64>,
    /// Width of one attention head when not hidden / n_heads (llama family).
    pub head_dim: Option<i64>,
    /// Biases on q, k, v (Qwen2); RMSNorm of each q and k head (Qwen3). Llama family.
    pub qkv_bias: Option<bool>,
    pub qk_norm: Option<bool>,
    pub max_seq_len: Option<i64>,
    pub tie_embeddings: Option<bool>,
    pub dropout: Option<f64>,
    /// A LayerNorm right after the word embeddings (BLOOM's `word_embeddings_layernorm`,
    /// Megatron-DeepSpeed `--embed-layernorm`).
    pub embedding_norm: Option<bool>,
    /// Mixture-of-experts MLPs (llama family); a MoE `config.json` fills it in.
    pub moe: Option<MoeSection>,
    /// DeepSeek's multi-head latent attention (llama family); a DeepSeek `config.json` fills
    /// it in.
    pub mla: Option<MlaSection>,
    /// DeepSeek-V3's multi-token prediction modules (Megatron-Core `--mtp-num-layers`).
    pub mtp: Option<MtpSection>,
}

/// `[model.mtp]`: multi-token prediction, by Megatron-Core's flag names.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MtpSection {
    /// `--mtp-num-layers` (Hugging Face `num_nextn_predict_layers`): the prediction depth.
    pub layers: Option<i64>,
    /// `--mtp-loss-scaling-factor` (default 0.1).
    pub loss_scale: Option<f64>,
}

/// `[model.mla]`: multi-head latent attention, by Hugging Face's names.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MlaSection {
    /// 0: a direct query projection (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<i64>,
    pub kv_lora_rank: Option<i64>,
    pub qk_nope_head_dim: Option<i64>,
    pub qk_rope_head_dim: Option<i64>,
    pub v_head_dim: Option<i64>,
}

/// `[model.moe]`: a mixture-of-experts MLP, by Megatron-Core's and Hugging Face's names.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSection {
    /// `--num-experts` (HF `num_local_experts` / `num_experts`).
    pub num_experts: Option<i64>,
    /// `--moe-router-topk` (HF `num_experts_per_tok`).
    pub top_k: Option<i64>,
    /// `--moe-ffn-hidden-size` (HF `moe_intermediate_size`).
    pub expert_ffn_hidden: Option<i64>,
    /// `--moe-shared-expert-intermediate-size`: the shared experts' width together (0: none).
    pub shared_expert_ffn_hidden: Option<i64>,
    /// Qwen2-MoE's sigmoid gate on the shared experts.
    pub shared_expert_gate: Option<bool>,
    /// Leading blocks with a dense MLP of `model.ffn_hidden` (DeepSeek
    /// `first_k_dense_replace`).
    pub first_dense_layers: Option<i64>,
    /// Past them, block l is a mixture of experts when l % every == offset (Megatron
    /// `--moe-layer-freq N`: every = N, offset 0; Qwen-MoE / Llama 4 step s: every = s,
    /// offset = s - 1).
    pub every: Option<i64>,
    pub offset: Option<i64>,
    /// Blocks with a dense MLP whatever the pattern (Qwen-MoE `mlp_only_layers`).
    pub dense_layers: Option<Vec<i64>>,
    /// Group-limited routing: `--moe-router-num-groups` / `--moe-router-group-topk`
    /// (DeepSeek `n_group` / `topk_group`).
    pub router_groups: Option<i64>,
    pub router_group_topk: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareSection {
    pub gpu: String,
    pub gpus: i64,
    pub gpus_per_node: Option<i64>,
    /// Overrides the catalog's device memory, bytes.
    #[serde(default, deserialize_with = "super::byte_size::opt")]
    pub memory_capacity: Option<i64>,
    /// Memory outside PyTorch's allocator (CUDA context, libraries), bytes.
    #[serde(default, deserialize_with = "super::byte_size::opt")]
    pub cuda_context: Option<i64>,
    /// `CUDA_MODULE_LOADING`: "lazy" (the default since CUDA 11.7 / PyTorch 2.0) or "eager"
    /// (older stacks): picks the CUDA context's default size.
    pub cuda_module_loading: Option<String>,
    /// Node preset (default: the GPU's usual node, e.g. "dgx-h100").
    pub node: Option<String>,
    /// Overrides of the node preset: compute NICs per node and each NIC's Gb/s.
    pub nics_per_node: Option<i64>,
    pub nic_gbps: Option<f64>,
    /// Override of the GPU's intra-node link (NVLink / xGMI), GB/s per direction.
    pub nvlink_gb_per_s: Option<f64>,
    /// `[hardware.custom]`: the GPU of `gpu = "custom"`, a part the catalog lacks.
    pub custom: Option<CustomGpuSection>,
}

/// `[hardware.custom]`: a GPU described in the scenario (with `hardware.gpu = "custom"`), in
/// the catalog's terms (`crate::hardware::GpuSpec`): dense peaks, no sparsity.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CustomGpuSection {
    /// Shown in reports and errors (default "custom"); not a catalog key.
    pub name: Option<String>,
    /// Device memory as `nvidia-smi` / `rocm-smi` reports it (`memory.total`), bytes (or
    /// with a unit: "24564MiB").
    #[serde(deserialize_with = "super::byte_size::required")]
    pub memory: i64,
    /// Dense BF16 tensor peak, TFLOP/s (absent: no BF16 tensor cores).
    pub bf16_tflops: Option<f64>,
    /// Dense FP16 tensor peak, TFLOP/s (default: bf16_tflops).
    pub fp16_tflops: Option<f64>,
    /// Dense TF32 tensor peak, TFLOP/s (absent: no TF32).
    pub tf32_tflops: Option<f64>,
    /// FP32 peak without tensor cores, TFLOP/s.
    pub fp32_tflops: f64,
    /// Dense FP8 tensor peak, TFLOP/s (absent: no FP8 tensor cores).
    pub fp8_tflops: Option<f64>,
    /// Device memory bandwidth, GB/s.
    pub hbm_gb_per_s: f64,
    /// Intra-node GPU-to-GPU link, GB/s per direction (NVLink / xGMI, or PCIe x16).
    pub nvlink_gb_per_s: f64,
    /// PCIe generation of the host link (default 4).
    pub pcie_gen: Option<i64>,
    /// Streaming multiprocessors / compute units (absent: no waves or split-K in the GEMM model).
    pub sms: Option<i64>,
    /// Best measured dense matmul throughput as a fraction of the BF16/FP16 peak (default 0.8).
    pub max_matmul_fraction: Option<f64>,
    /// The architecture the libraries key their defaults on (default "hopper").
    pub arch: Option<String>,
}

/// A setting that is a switch or a size (FSDP2's `reshard_after_forward: bool | int`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum BoolOrInt {
    Bool(bool),
    Int(i64),
}

impl<'de> Deserialize<'de> for BoolOrInt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = BoolOrInt;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or an integer")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<BoolOrInt, E> {
                Ok(BoolOrInt::Bool(b))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<BoolOrInt, E> {
                Ok(BoolOrInt::Int(n))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<BoolOrInt, E> {
                i64::try_from(n).map(BoolOrInt::Int).map_err(|_| E::custom(format!("{n} is out of range")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A setting that is one name or a list of them (Megatron's `nargs='+'` arguments).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Names(pub Vec<String>);

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Names;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Names, E> {
                Ok(Names(vec![s.to_string()]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Names, A::Error> {
                let mut v = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    v.push(s);
                }
                Ok(Names(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelSection {
    pub sharding: Option<String>,
    pub framework: Option<String>,
    /// "block" | "peft" (LoRA: PEFT's `fsdp_auto_wrap_policy`, each adapter its own unit).
    pub wrap: Option<String>,
    /// FSDP1 `FullyShardedDataParallel(use_orig_params=...)`.
    pub use_orig_params: Option<bool>,
    pub reshard_after_forward: Option<BoolOrInt>,
    pub backward_prefetch: Option<String>,
    pub forward_prefetch: Option<bool>,
    pub limit_all_gathers: Option<bool>,
    /// FSDP: accumulate unsharded gradients over the micro-batches and reduce-scatter them in
    /// the last (FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False)).
    pub no_sync: Option<bool>,
    /// HYBRID_SHARD: ranks per shard group (FSDP2 HSDP mesh; default one node's GPUs).
    pub hsdp_shard_size: Option<i64>,
    /// FSDP + tensor parallelism: torchtitan's async TP (enable_async_tensor_parallel).
    pub async_tp: Option<bool>,
    pub gradient_as_bucket_view: Option<bool>,
    pub bucket_cap_mb: Option<f64>,
    /// Megatron-LM `--tensor-model-parallel-size`.
    pub tensor: Option<i64>,
    /// Megatron-LM `--sequence-parallel`.
    pub sequence_parallel: Option<bool>,
    /// Megatron-LM `--pipeline-model-parallel-size`.
    pub pipeline: Option<i64>,
    /// Model chunks per pipeline stage (interleaved 1F1B).
    pub virtual_stages: Option<i64>,
    /// "gpipe" | "1f1b" | "interleaved-1f1b" | "dualpipe" | "dualpipev".
    pub schedule: Option<String>,
    /// Transformer blocks per pipeline stage (per virtual stage with virtual_stages), first to
    /// last (uneven splits); the first may be 0 (the embedding alone), the last too (the head
    /// and loss alone).
    pub stage_layers: Option<Vec<i64>>,
    /// Megatron-Core `--overlap-p2p-communication`: pipeline sends and receives run beside
    /// compute instead of blocking it.
    pub overlap_p2p_communication: Option<bool>,
    /// Megatron-Core `--expert-model-parallel-size`: ranks the experts are spread over.
    pub expert: Option<i64>,
    /// Megatron-Core `--expert-tensor-parallel-size`: ranks each expert's weights are split
    /// over (default: `tensor`, as Megatron's).
    pub expert_tensor: Option<i64>,
    /// Megatron-Core `--context-parallel-size`: ranks each sequence is split over.
    pub context: Option<i64>,
    /// Context parallelism under FSDP: "allgather" (torchtitan's default
    /// context_parallel_rotate_method) | "alltoall" (blocks passed around a ring).
    pub context_rotate: Option<String>,
    /// Context parallelism under Megatron: "p2p" (Transformer Engine's ring, default) |
    /// "a2a" (Ulysses all-to-all), Megatron-Core's --cp-comm-type.
    pub context_comm: Option<String>,
}

/// `[deepspeed]`: the `zero_optimization` settings of a `ds_config.json` that size
/// DeepSpeed's own buffers, by DeepSpeed's names.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeepspeedSection {
    /// Elements (DeepSpeed writes 5e8).
    pub reduce_bucket_size: Option<f64>,
    pub allgather_bucket_size: Option<f64>,
    pub contiguous_gradients: Option<bool>,
    pub overlap_comm: Option<bool>,
    /// Elements (ZeRO-3's optimizer sub-groups; DeepSpeed writes 1e9).
    pub sub_group_size: Option<f64>,
    /// The DeepSpeed release, "MAJOR.MINOR" or "MAJOR.MINOR.PATCH".
    pub version: Option<String>,
    /// ZeRO-3's fetch knobs, in elements (DeepSpeed writes 5e7, 1e9, 1e9, 1e5).
    pub stage3_prefetch_bucket_size: Option<f64>,
    pub stage3_max_live_parameters: Option<f64>,
    pub stage3_max_reuse_distance: Option<f64>,
    pub stage3_param_persistence_threshold: Option<f64>,
}

/// `[megatron]`: Megatron-LM's communication-overlap flags, by their command-line names
/// without the dashes.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MegatronSection {
    pub overlap_grad_reduce: Option<bool>,
    pub overlap_param_gather: Option<bool>,
    pub tp_comm_overlap: Option<bool>,
    /// `--overlap-moe-expert-parallel-comm`: the combined 1F1B schedule.
    pub overlap_moe_expert_parallel_comm: Option<bool>,
    /// `--ddp-bucket-size`, elements.
    pub ddp_bucket_size: Option<f64>,
    /// `--use-precision-aware-optimizer` (Transformer Engine's FusedAdam keeps the master and
    /// the moments in the dtypes below).
    pub use_precision_aware_optimizer: Option<bool>,
    /// `--main-grads-dtype`: "fp32" | "bf16".
    pub main_grads_dtype: Option<String>,
    /// `--main-params-dtype`: "fp32" | "fp16".
    pub main_params_dtype: Option<String>,
    /// `--exp-avg-dtype`: "fp32" | "fp16" | "bf16" | "fp8".
    pub exp_avg_dtype: Option<String>,
    /// `--exp-avg-sq-dtype`: "fp32" | "fp16" | "bf16" | "fp8".
    pub exp_avg_sq_dtype: Option<String>,
    /// `OptimizerConfig.store_param_remainders` (default true; false before TE 2.1).
    pub store_param_remainders: Option<bool>,
    /// `--fine-grained-activation-offloading --offload-modules ...`: "attn_norm",
    /// "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act".
    pub offload_modules: Option<Vec<String>>,
    /// `--min-offloaded-tensor-size`, elements (default 1,048,576).
    pub min_offloaded_tensor_size: Option<i64>,
    /// `--activation-offload-fraction`, 0 to 1 (default 1).
    pub activation_offload_fraction: Option<f64>,
    /// `--activation-func-fp8-input-store`: the fused SwiGLU saves its input in FP8.
    pub activation_func_fp8_input_store: Option<bool>,
}

/// `[allocator]`: the allocator model, its `PYTORCH_CUDA_ALLOC_CONF` options, where the
/// program calls `torch.cuda.empty_cache()`, and memory held outside the allocator.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatorSection {
    /// "caching" (PyTorch's CUDA caching allocator, the default) | "exact" (live bytes only).
    pub kind: Option<String>,
    pub expandable_segments: Option<bool>,
    pub max_split_size_mb: Option<i64>,
    pub roundup_power2_divisions: Option<i64>,
    /// Any of "after_init", "after_forward", "after_backward", "after_optimizer", "after_step".
    pub empty_cache: Option<Vec<String>>,
    /// Bytes of one cuBLAS workspace (default: PyTorch's for the GPU).
    #[serde(default, deserialize_with = "super::byte_size::opt")]
    pub cublas_workspace: Option<i64>,
    /// NCCL communicator buffers per GPU, bytes (default: estimated from the communicators).
    #[serde(default, deserialize_with = "super::byte_size::opt")]
    pub nccl_buffers: Option<i64>,
}

/// `[nccl]`: environment settings of the NCCL build that decide its device memory.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NcclSection {
    /// `NCCL_RUNTIME_CONNECT` (NCCL >= 2.22; false before).
    pub runtime_connect: Option<bool>,
    /// `NCCL_CUMEM_ENABLE` (on by default since 2.19.1).
    pub cumem: Option<bool>,
    /// `NCCL_NVLS_ENABLE`.
    pub nvls: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSection {
    pub micro_batch: i64,
    pub seq_len: i64,
    pub grad_accum: Option<i64>,
    pub steps: Option<i64>,
    pub optimizer: Option<String>,
    pub momentum: Option<bool>,
    pub optimizer_impl: Option<String>,
    pub precision: Option<String>,
    pub param_dtype: Option<String>,
    pub compute_dtype: Option<String>,
    pub grad_dtype: Option<String>,
    pub master_dtype: Option<String>,
    pub optimizer_state_dtype: Option<String>,
    pub activation_checkpointing: Option<String>,
    pub attention: Option<String>,
    pub logits_fp32: Option<bool>,
    pub clip_grad_norm: Option<bool>,
    /// The PyTorch release the job runs ("2.0"), where its memory behaviour changed.
    pub torch_version: Option<String>,
    /// "eager" | "vocab-parallel" | "fused-linear" (default: Megatron's vocab-parallel
    /// cross-entropy under framework = "megatron", eager otherwise).
    pub loss: Option<String>,
    /// "eager" | "compiled" | "fused": the kernels of the memory-bound ops (default: fused
    /// under framework = "megatron", eager otherwise).
    pub kernels: Option<String>,
    /// Grouped-query keys and values copied to every query head before attention (default:
    /// with kernels "eager" and "compiled").
    pub repeat_kv: Option<bool>,
    /// With activation_checkpointing = "full": checkpoint every n-th block only (torchtitan's
    /// `selective_ac_option = "n"`).
    pub checkpoint_every: Option<i64>,
    /// With activation_checkpointing = "full": Megatron's `--recompute-method` ("uniform" |
    /// "block") and `--recompute-num-layers`.
    pub recompute_method: Option<String>,
    pub recompute_num_layers: Option<i64>,
    /// "none" | "overlapped" (Megatron --cpu-offloading: Transformer Engine's offload
    /// handler) | "synchronous" (PyTorch offload_wrapper / save_on_cpu).
    pub activation_offload: Option<String>,
    /// The first n blocks offload (Megatron --cpu-offloading-num-layers).
    pub activation_offload_layers: Option<i64>,
    /// With activation_checkpointing = "selective" under Megatron: --recompute-modules.
    pub recompute_modules: Option<Vec<String>>,
}
