//! Scenario files (TOML): serde types mirroring what a user's FSDP / DeepSpeed / training
//! config says, defaults, and validation with errors that name the file and the field.

pub mod error;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use error::ScenarioError;

use crate::hardware::{self, Cluster};
use crate::memory::{AllocatorKind, AllocatorSettings, EmptyCacheAt};
use crate::model::{Attention, Dtype, Family, ModelConfig, Workload};
use crate::plan::{
    BackwardPrefetch, Checkpointing, Framework, ModelParallel, OptimizerImpl, OptimizerKind, ParallelConfig,
    PipelineSchedule, Precision, Sharding, TrainingConfig,
};

/// PyTorch's CUDA context with lazy module loading (the default since CUDA 11.7 / PyTorch
/// 2.0) holds about 300-500 MB outside the caching allocator (pytorch/pytorch#107667,
/// #109888); we take 512 MiB.
pub const DEFAULT_CUDA_CONTEXT: u64 = 512 << 20;

// ---------------------------------------------------------------- file types

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
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
    #[serde(default)]
    pub allocator: AllocatorSection,
    /// Per-rank compute jitter and stragglers (off when absent).
    pub jitter: Option<JitterSection>,
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
    pub cpu_memory: Option<i64>,
    /// NVMe capacity per node, bytes (default 30.72 TB, a DGX H100's eight 3.84 TB drives).
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

/// The most ranks `[jitter]` simulates one by one (data-parallel ranks x pipeline stages).
pub const MAX_JITTER_RANKS: u64 = 256;

/// Default host memory of a node: 2 TB (DGX A100 and DGX H100 datasheets).
pub const DEFAULT_CPU_MEMORY: u64 = 2_000_000_000_000;
/// DeepSpeedCPUAdam's rate per GPU process: an assumption (no measured step time was found;
/// the ZeRO-Offload paper reports only a 5-7x speed-up over PyTorch's CPU Adam).
pub const DEFAULT_CPU_ADAM_PARAMS_PER_S: f64 = 1e9;
/// PyTorch's own Adam on CPU tensors (FSDP's CPU offload): DeepSpeed's tutorial puts
/// DeepSpeedCPUAdam at 5-7x its speed; 6x is assumed.
pub const DEFAULT_TORCH_CPU_ADAM_PARAMS_PER_S: f64 = DEFAULT_CPU_ADAM_PARAMS_PER_S / 6.0;
/// Default NVMe of a node: a DGX H100's eight 3.84 TB U.2 drives (datasheet).
pub const DEFAULT_NVME_CAPACITY: u64 = 30_720_000_000_000;
/// Default NVMe bandwidth of a node, bytes/s: DeepNVMe's measured 10 GB/s read and 5 GB/s
/// write over 4 SSDs in RAID-0 (DeepSpeed blog `deepspeed-gds`).
pub const DEFAULT_NVME_READ_BYTES_PER_S: f64 = 10e9;
pub const DEFAULT_NVME_WRITE_BYTES_PER_S: f64 = 5e9;

/// Measured pinned-memory copy rates per GPU (nvbandwidth / bandwidthTest figures in
/// docs/research/issue8-sources.md): PCIe Gen4 ~25 GB/s each way (A100), Gen5 ~35 GB/s
/// host-to-device and ~53 GB/s device-to-host (H100); Gen3 taken as half of Gen4.
pub fn pcie_bytes_per_s(gen: u8) -> (f64, f64) {
    match gen {
        0..=3 => (12.5e9, 12.5e9),
        4 => (25e9, 25e9),
        _ => (35e9, 53e9),
    }
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
    pub family: String,
    pub n_layers: i64,
    pub hidden: i64,
    pub n_heads: i64,
    pub n_kv_heads: Option<i64>,
    pub ffn_hidden: Option<i64>,
    pub vocab: i64,
    pub max_seq_len: Option<i64>,
    pub tie_embeddings: Option<bool>,
    pub dropout: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareSection {
    pub gpu: String,
    pub gpus: i64,
    pub gpus_per_node: Option<i64>,
    /// Overrides the catalog's device memory, bytes.
    pub memory_capacity: Option<i64>,
    /// Memory outside PyTorch's allocator (CUDA context, libraries), bytes.
    pub cuda_context: Option<i64>,
    /// Node preset (default: the GPU's usual node, e.g. "dgx-h100").
    pub node: Option<String>,
    /// Overrides of the node preset: compute NICs per node and each NIC's Gb/s.
    pub nics_per_node: Option<i64>,
    pub nic_gbps: Option<f64>,
    /// Override of the GPU's intra-node link (NVLink / xGMI), GB/s per direction.
    pub nvlink_gb_per_s: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelSection {
    pub sharding: Option<String>,
    pub framework: Option<String>,
    pub wrap: Option<String>,
    pub reshard_after_forward: Option<bool>,
    pub backward_prefetch: Option<String>,
    pub forward_prefetch: Option<bool>,
    pub limit_all_gathers: Option<bool>,
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
    /// "gpipe" | "1f1b" | "interleaved-1f1b".
    pub schedule: Option<String>,
    /// Transformer blocks per pipeline stage, first to last (uneven splits).
    pub stage_layers: Option<Vec<i64>>,
    /// Megatron-Core `--overlap-p2p-communication`: pipeline sends and receives run beside
    /// compute instead of blocking it.
    pub overlap_p2p_communication: Option<bool>,
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
    /// cuBLAS workspaces, bytes (default 0).
    pub cublas_workspace: Option<i64>,
    /// NCCL communicator buffers, bytes (default 0).
    pub nccl_buffers: Option<i64>,
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
}

// ---------------------------------------------------------------- validated scenario

/// A scenario that passed validation: everything downstream can trust it.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub source: PathBuf,
    pub model: ModelConfig,
    pub workload: Workload,
    pub cluster: Cluster,
    pub parallel: ParallelConfig,
    /// For an inference job, a stand-in (pure 16-bit, one step of batch x prompt_len) that
    /// only the layer DAG's shape reads; [`Scenario::inference`] holds the job.
    pub training: TrainingConfig,
    pub allocator: AllocatorSettings,
    pub jitter: Option<crate::schedule::jitter::JitterConfig>,
    pub job: JobKind,
    pub inference: Option<crate::infer::InferenceConfig>,
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let src = std::fs::read_to_string(path)
            .map_err(|e| ScenarioError::new(path, "", format!("cannot read the scenario file: {e}")))?;
        Scenario::from_toml(path, &src)
    }

    /// Parses and validates scenario text; `path` names it in errors.
    pub fn from_toml(path: &Path, src: &str) -> Result<Scenario, ScenarioError> {
        let file: ScenarioFile = toml::from_str(src).map_err(|e| error::from_toml(path, src, &e))?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scenario".into());
        validate(path, &stem, file)
    }

    /// Validates a scenario given as a TOML value tree (a table with `[model]`, `[hardware]`,
    /// ...), as sweeps build them; `path` names it in errors and gives the default name.
    /// Validation and messages are those of [`Scenario::from_toml`]; a type error names its
    /// dotted field (there are no lines to cite).
    pub fn from_value(path: &Path, value: toml::Value) -> Result<Scenario, ScenarioError> {
        let file = ScenarioFile::deserialize(value).map_err(|e| value_error(path, &e))?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scenario".into());
        validate(path, &stem, file)
    }

    /// Bytes the allocator may reserve: device memory less the CUDA context and the
    /// reservations of `[allocator]` (cuBLAS workspaces, NCCL buffers).
    pub fn allocator_capacity(&self) -> u64 {
        self.cluster.capacity_bytes().saturating_sub(self.allocator.outside_bytes())
    }

    /// Data-parallel replicas: gpus / (tensor x pipeline).
    pub fn dp_degree(&self) -> u64 {
        self.parallel.model_parallel.data_parallel(u64::from(self.cluster.gpus))
    }

    /// The ranks `[jitter]` simulates one by one: every data-parallel rank of every
    /// pipeline stage.
    pub fn jitter_ranks(&self) -> u64 {
        self.dp_degree() * self.parallel.model_parallel.pipeline
    }

    /// Tokens one optimizer step consumes across all ranks.
    pub fn tokens_per_step(&self) -> u64 {
        self.training.micro_batch * self.training.seq_len * self.training.grad_accum * self.dp_degree()
    }
}

struct V<'a> {
    path: &'a Path,
}

impl V<'_> {
    fn err(&self, field: &str, msg: impl Into<String>) -> ScenarioError {
        ScenarioError::new(self.path, field, msg)
    }
    fn positive(&self, field: &str, v: i64) -> Result<u64, ScenarioError> {
        if v <= 0 {
            return Err(self.err(field, format!("must be a positive integer, got {v}")));
        }
        Ok(v as u64)
    }
    fn choice<'s>(&self, field: &str, v: &'s str, allowed: &[&str]) -> Result<&'s str, ScenarioError> {
        if allowed.contains(&v) {
            Ok(v)
        } else {
            Err(self.err(
                field,
                format!(
                    "unknown value \"{v}\"; allowed: {}",
                    allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
                ),
            ))
        }
    }
    fn dtype(&self, field: &str, v: &str) -> Result<Dtype, ScenarioError> {
        Dtype::parse(v)
            .ok_or_else(|| self.err(field, format!("unknown dtype \"{v}\"; allowed: \"fp32\", \"bf16\", \"fp16\"")))
    }
}

fn validate(path: &Path, stem: &str, f: ScenarioFile) -> Result<Scenario, ScenarioError> {
    let v = V { path };
    // --- model
    let m = &f.model;
    let family = match v.choice("model.family", &m.family, &["gpt", "llama"])? {
        "gpt" => Family::Gpt,
        _ => Family::Llama,
    };
    let n_layers = v.positive("model.n_layers", m.n_layers)?;
    let hidden = v.positive("model.hidden", m.hidden)?;
    let n_heads = v.positive("model.n_heads", m.n_heads)?;
    if hidden % n_heads != 0 {
        return Err(v.err("model.n_heads", format!("must divide model.hidden ({hidden}); {n_heads} does not")));
    }
    if (hidden / n_heads) % 2 != 0 && family == Family::Llama {
        return Err(v.err(
            "model.n_heads",
            format!("rotary embeddings need an even head dimension; hidden / n_heads = {}", hidden / n_heads),
        ));
    }
    let n_kv_heads = match m.n_kv_heads {
        None => n_heads,
        Some(k) => {
            let k = v.positive("model.n_kv_heads", k)?;
            if family == Family::Gpt && k != n_heads {
                return Err(v.err("model.n_kv_heads", format!("the gpt family has multi-head attention: n_kv_heads must equal n_heads ({n_heads}) or be left out")));
            }
            if n_heads % k != 0 {
                return Err(v.err("model.n_kv_heads", format!("must divide model.n_heads ({n_heads}); {k} does not")));
            }
            k
        }
    };
    let ffn_hidden = match m.ffn_hidden {
        Some(x) => v.positive("model.ffn_hidden", x)?,
        None => match family {
            Family::Gpt => 4 * hidden,
            // Llama's rule: 2/3 of 4h, rounded up to a multiple of 256.
            Family::Llama => (8 * hidden / 3).div_ceil(256) * 256,
        },
    };
    let vocab = v.positive("model.vocab", m.vocab)?;
    let job = job_kind(&v, &f)?;
    let (inf, standin) = match (job, &f.inference) {
        (JobKind::Inference, Some(i)) => {
            let (batch, prompt, gen) = inference_lengths(&v, i)?;
            (Some((i, (prompt + gen) as u64)), inference_standin(batch, prompt))
        }
        _ => (None, TrainingSection::default()),
    };
    let t = f.training.as_ref().unwrap_or(&standin);
    let micro_batch = v.positive("training.micro_batch", t.micro_batch)?;
    let seq_len = v.positive("training.seq_len", t.seq_len)?;
    let max_seq_len = match m.max_seq_len {
        Some(x) => v.positive("model.max_seq_len", x)?,
        None => inf.map_or(seq_len, |(_, ctx)| ctx),
    };
    if let Some((_, ctx)) = inf {
        if ctx > max_seq_len {
            return Err(v.err(
                "inference.gen_len",
                format!("prompt_len + gen_len = {ctx} tokens exceeds model.max_seq_len ({max_seq_len})"),
            ));
        }
    } else if seq_len > max_seq_len {
        return Err(v.err("training.seq_len", format!("{seq_len} exceeds model.max_seq_len ({max_seq_len})")));
    }
    let dropout = m.dropout.unwrap_or(0.0);
    if !(0.0..1.0).contains(&dropout) {
        return Err(v.err("model.dropout", format!("must be in [0, 1), got {dropout}")));
    }
    let model = ModelConfig {
        family,
        n_layers,
        hidden,
        n_heads,
        n_kv_heads,
        ffn_hidden,
        vocab,
        max_seq_len,
        tie_embeddings: m.tie_embeddings.unwrap_or(family == Family::Gpt),
        dropout,
    };

    // --- hardware
    let h = &f.hardware;
    let gpu = hardware::lookup(&h.gpu).ok_or_else(|| {
        v.err("hardware.gpu", format!("unknown GPU \"{}\"; the catalog has: {}", h.gpu, hardware::names().join(", ")))
    })?;
    let gpus = v.positive("hardware.gpus", h.gpus)?;
    let node_name = h.node.as_deref().unwrap_or(gpu.default_node);
    let node = hardware::node(node_name).ok_or_else(|| {
        v.err(
            "hardware.node",
            format!("unknown node preset \"{node_name}\"; the presets are: {}", hardware::node_names().join(", ")),
        )
    })?;
    let gpus_per_node = match h.gpus_per_node {
        Some(x) => v.positive("hardware.gpus_per_node", x)?,
        None => gpus.min(u64::from(node.gpus_per_node)),
    };
    let nics_per_node = match h.nics_per_node {
        Some(x) => v.positive("hardware.nics_per_node", x)? as u32,
        None => node.nics_per_node,
    };
    let nic_bytes_per_s = match h.nic_gbps {
        Some(x) if !(x > 0.0 && x.is_finite()) => {
            return Err(v.err("hardware.nic_gbps", format!("must be a positive number of Gb/s, got {x}")))
        }
        Some(x) => x * 1e9 / 8.0,
        None => node.nic_bytes_per_s,
    };
    let mut gpu = gpu.clone();
    if let Some(x) = h.nvlink_gb_per_s {
        if !(x > 0.0 && x.is_finite()) {
            return Err(v.err("hardware.nvlink_gb_per_s", format!("must be a positive number of GB/s, got {x}")));
        }
        gpu.nvlink_bytes_per_s = x * 1e9;
    }
    if gpus_per_node > gpus {
        return Err(v.err(
            "hardware.gpus_per_node",
            format!("{gpus_per_node} GPUs per node is more than hardware.gpus ({gpus})"),
        ));
    }
    if gpus % gpus_per_node != 0 {
        return Err(
            v.err("hardware.gpus_per_node", format!("must divide hardware.gpus ({gpus}); {gpus_per_node} does not"))
        );
    }
    if gpus > u64::from(u32::MAX) {
        return Err(v.err("hardware.gpus", "too many GPUs"));
    }
    let memory_bytes = match h.memory_capacity {
        Some(x) => v.positive("hardware.memory_capacity", x)?,
        None => gpu.memory_bytes,
    };
    let cuda_context_bytes = match h.cuda_context {
        Some(x) if x < 0 => return Err(v.err("hardware.cuda_context", format!("must be >= 0 bytes, got {x}"))),
        Some(x) => x as u64,
        None => DEFAULT_CUDA_CONTEXT,
    };
    if cuda_context_bytes >= memory_bytes {
        return Err(v.err(
            "hardware.cuda_context",
            format!("{cuda_context_bytes} bytes leaves nothing of the {memory_bytes}-byte device"),
        ));
    }
    let cluster = Cluster {
        gpu,
        gpus: gpus as u32,
        gpus_per_node: gpus_per_node as u32,
        node: node.name.to_string(),
        nics_per_node,
        nic_bytes_per_s,
        memory_bytes,
        cuda_context_bytes,
    };

    // --- parallel
    let p = &f.parallel;
    let sharding = match v.choice(
        "parallel.sharding",
        p.sharding.as_deref().unwrap_or("none"),
        &["none", "zero1", "zero2", "shard_grad_op", "zero3", "full_shard", "hybrid_shard"],
    )? {
        "none" => Sharding::None,
        "zero1" => Sharding::Zero1,
        "zero2" | "shard_grad_op" => Sharding::Zero2,
        "zero3" | "full_shard" => Sharding::Zero3,
        _ => Sharding::HybridShard,
    };
    let framework =
        match v.choice("parallel.framework", p.framework.as_deref().unwrap_or("fsdp"), &["fsdp", "deepspeed"])? {
            "fsdp" => Framework::Fsdp,
            _ => Framework::Deepspeed,
        };
    v.choice("parallel.wrap", p.wrap.as_deref().unwrap_or("block"), &["block"])?;
    if sharding == Sharding::Zero2 && p.reshard_after_forward == Some(true) {
        return Err(v.err("parallel.reshard_after_forward", "SHARD_GRAD_OP / zero2 keeps parameters gathered between forward and backward; use sharding = \"full_shard\" to reshard after forward"));
    }
    let backward_prefetch = match v.choice(
        "parallel.backward_prefetch",
        p.backward_prefetch.as_deref().unwrap_or("pre"),
        &["pre", "post", "none"],
    )? {
        "pre" => BackwardPrefetch::Pre,
        "post" => BackwardPrefetch::Post,
        _ => BackwardPrefetch::None,
    };
    let bucket_cap_mb = p.bucket_cap_mb.unwrap_or(25.0);
    if !(bucket_cap_mb > 0.0 && bucket_cap_mb.is_finite()) {
        return Err(v.err("parallel.bucket_cap_mb", format!("must be a positive number of MB, got {bucket_cap_mb}")));
    }
    // Defaults: PyTorch 2.x FSDP1 `FullyShardedDataParallel` (reshard_after_forward is
    // implied by FULL_SHARD, backward_prefetch=BACKWARD_PRE, forward_prefetch=False,
    // limit_all_gathers=True) and DDP (`bucket_cap_mb=25`, `gradient_as_bucket_view=False`).
    let parallel = ParallelConfig {
        sharding,
        framework,
        reshard_after_forward: p.reshard_after_forward.unwrap_or(true),
        backward_prefetch,
        forward_prefetch: p.forward_prefetch.unwrap_or(false),
        limit_all_gathers: p.limit_all_gathers.unwrap_or(true),
        gradient_as_bucket_view: p.gradient_as_bucket_view.unwrap_or(false),
        bucket_bytes: (bucket_cap_mb * 1e6).round() as u64,
        model_parallel: validate_model_parallel(&v, p, &model, gpus, u64::from(cluster.gpus_per_node), sharding)?,
        offload: None,
    };
    let mut parallel = parallel;
    if parallel.model_parallel.pipeline > 1 {
        if framework == Framework::Deepspeed && matches!(sharding, Sharding::Zero2 | Sharding::Zero3) {
            return Err(v.err(
                "parallel.sharding",
                "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only (PipelineEngine asserts zero_optimization_stage < 2); use sharding = \"zero1\" or \"none\", or parallel.framework = \"fsdp\" (FSDP over each stage's data-parallel ranks, as torchtitan does)",
            ));
        }
        // torchtitan's reshard_after_forward policy "default": with pipeline parallelism
        // parameters stay gathered across the stage's micro-batches rather than being
        // all-gathered again for each one.
        if p.reshard_after_forward.is_none() && matches!(sharding, Sharding::Zero3) {
            parallel.reshard_after_forward = false;
        }
    }
    if let Some(o) = &f.offload {
        parallel.offload = validate_offload(&v, o, &parallel, &cluster)?;
    }

    // --- training
    let grad_accum = match t.grad_accum {
        Some(x) => v.positive("training.grad_accum", x)?,
        None => 1,
    };
    let steps = match t.steps {
        Some(x) => v.positive("training.steps", x)?,
        None => 2,
    };
    if steps > 100 {
        return Err(v.err("training.steps", format!("at most 100 steps are simulated, got {steps}")));
    }
    let optimizer =
        match v.choice("training.optimizer", t.optimizer.as_deref().unwrap_or("adamw"), &["adamw", "adam", "sgd"])? {
            "adamw" => OptimizerKind::AdamW,
            "adam" => OptimizerKind::Adam,
            _ => OptimizerKind::Sgd,
        };
    if t.momentum.is_some() && optimizer != OptimizerKind::Sgd {
        return Err(v.err("training.momentum", "only applies to optimizer = \"sgd\" (Adam always keeps two moments)"));
    }
    let default_impl = if framework == Framework::Deepspeed { "fused" } else { "foreach" };
    let optimizer_impl = match v.choice(
        "training.optimizer_impl",
        t.optimizer_impl.as_deref().unwrap_or(default_impl),
        &["foreach", "fused", "for-loop"],
    )? {
        "foreach" => OptimizerImpl::Foreach,
        "fused" => OptimizerImpl::Fused,
        _ => OptimizerImpl::ForLoop,
    };
    let lora_job = job == JobKind::FinetuneLora;
    let preset = t.precision.as_deref().unwrap_or(if lora_job { "fsdp-bf16-mixed" } else { "bf16-mixed-adam" });
    let mut precision = Precision::preset(preset).ok_or_else(|| {
        v.err(
            "training.precision",
            format!(
                "unknown preset \"{preset}\"; allowed: {}",
                Precision::preset_names().iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    if let Some(d) = &t.param_dtype {
        precision.param = v.dtype("training.param_dtype", d)?;
    }
    if let Some(d) = &t.compute_dtype {
        precision.compute = v.dtype("training.compute_dtype", d)?;
    }
    if let Some(d) = &t.grad_dtype {
        precision.grad = v.dtype("training.grad_dtype", d)?;
    }
    if let Some(d) = &t.master_dtype {
        precision.master = if d == "none" {
            None
        } else {
            Some(v.dtype("training.master_dtype", d).map_err(|_| {
                v.err(
                    "training.master_dtype",
                    format!("unknown dtype \"{d}\"; allowed: \"none\", \"fp32\", \"bf16\", \"fp16\""),
                )
            })?)
        };
    }
    if let Some(d) = &t.optimizer_state_dtype {
        precision.optimizer_state = v.dtype("training.optimizer_state_dtype", d)?;
    }
    if precision.compute == Dtype::Bf16 && cluster.gpu.bf16_flops.is_none() {
        let field = if t.compute_dtype.is_some() { "training.compute_dtype" } else { "training.precision" };
        return Err(v.err(
            field,
            format!(
                "{} has no BF16 tensor cores; compute in \"fp16\" (compute_dtype = \"fp16\") or \"fp32\"",
                cluster.gpu.name
            ),
        ));
    }
    let checkpointing = match v.choice(
        "training.activation_checkpointing",
        t.activation_checkpointing.as_deref().unwrap_or("none"),
        &["none", "full", "selective"],
    )? {
        "none" => Checkpointing::None,
        "full" => Checkpointing::Full,
        _ => Checkpointing::Selective,
    };
    let attention =
        match v.choice("training.attention", t.attention.as_deref().unwrap_or("flash"), &["flash", "math"])? {
            "flash" => Attention::Flash,
            _ => Attention::Math,
        };
    let mp = &parallel.model_parallel;
    if mp.sequence_parallel && seq_len % mp.tensor != 0 {
        return Err(v.err(
            "training.seq_len",
            format!("sequence parallelism splits the sequence over {} ranks: {seq_len} is not divisible", mp.tensor),
        ));
    }
    if mp.schedule == PipelineSchedule::Interleaved && grad_accum % mp.pipeline != 0 {
        return Err(v.err(
            "training.grad_accum",
            format!(
                "the interleaved schedule needs the micro-batches per step ({grad_accum}) to be a multiple of parallel.pipeline ({}), as Megatron-LM requires",
                mp.pipeline
            ),
        ));
    }
    let training = TrainingConfig {
        micro_batch,
        seq_len,
        grad_accum,
        steps: steps as u32,
        optimizer,
        momentum: t.momentum.unwrap_or(true),
        optimizer_impl,
        precision: precision.clone(),
        checkpointing,
        clip_grad_norm: t.clip_grad_norm.unwrap_or(true),
    };
    let workload = Workload {
        micro_batch,
        seq_len,
        compute_dtype: precision.compute,
        attention,
        logits_fp32: t.logits_fp32.unwrap_or(true),
        split: crate::model::TensorSplit {
            tensor: parallel.model_parallel.tensor,
            sequence_parallel: parallel.model_parallel.sequence_parallel,
        },
        lora: None,
    };
    let mut workload = workload;
    if let Some(l) = &f.lora {
        if parallel.offload.as_ref().is_some_and(|o| o.parameters.is_some()) {
            return Err(v.err("offload.parameters", "parameter offload with LoRA is not simulated yet (the frozen base would stay on the GPU); offload the optimizer only"));
        }
        if t.precision.is_none() {
            // PEFT upcasts the adapters to FP32 (autocast_adapter_dtype=True) and the step
            // runs under BF16 autocast: FP32 adapters, gradients and Adam moments.
            precision.preset = "peft-lora (fp32 adapters, bf16 autocast)".into();
        }
        workload.lora = Some(validate_lora(&v, l, &model, &parallel)?);
    }
    let training = TrainingConfig { precision: precision.clone(), ..training };
    let allocator = validate_allocator(&v, &f.allocator, &cluster)?;
    let jitter = match &f.jitter {
        None => None,
        Some(j) => {
            if j.seed < 0 {
                return Err(v.err("jitter.seed", format!("must be a non-negative integer, got {}", j.seed)));
            }
            // Jitter simulates every data-parallel rank of every pipeline stage (a program
            // and an allocator each).
            let dp = parallel.model_parallel.data_parallel(gpus);
            let pp = parallel.model_parallel.pipeline;
            let ranks = dp * pp;
            if ranks > MAX_JITTER_RANKS {
                let what = if pp > 1 {
                    format!("{ranks} (data-parallel {dp} x pipeline {pp})")
                } else {
                    format!("{dp} (hardware.gpus / parallel.tensor)")
                };
                return Err(v.err(
                    "jitter",
                    format!("jitter simulates every data-parallel rank of every pipeline stage: at most {MAX_JITTER_RANKS}, got {what}; try the same per-rank noise on fewer GPUs"),
                ));
            }
            let cv = j.compute_cv.unwrap_or(0.0);
            if !(0.0..=1.0).contains(&cv) {
                return Err(v.err("jitter.compute_cv", format!("must be a fraction in [0, 1], got {cv}")));
            }
            let stragglers = match j.stragglers {
                Some(x) if x < 0 || x as u64 > ranks => {
                    return Err(v.err(
                        "jitter.stragglers",
                        format!(
                            "must be between 0 and the simulated ranks ({ranks}: data-parallel x pipeline), got {x}"
                        ),
                    ))
                }
                Some(x) => x as u64,
                None => 0,
            };
            let slow = j.straggler_slowdown.unwrap_or(0.0);
            if !(0.0..=10.0).contains(&slow) {
                return Err(v.err("jitter.straggler_slowdown", format!("must be a fraction in [0, 10], got {slow}")));
            }
            if stragglers > 0 && slow == 0.0 {
                return Err(v.err("jitter.straggler_slowdown", "stragglers need a slowdown > 0 (0.1 = 10% slower)"));
            }
            Some(crate::schedule::jitter::JitterConfig {
                seed: j.seed as u64,
                compute_cv: cv,
                stragglers,
                straggler_slowdown: slow,
            })
        }
    };
    let inference = match inf {
        Some((i, _)) => {
            if f.offload.is_some() {
                return Err(v.err(
                    "offload",
                    "optimizer offload applies to training jobs; remove [offload] for an inference job",
                ));
            }
            if f.allocator.empty_cache.is_some() {
                return Err(v.err("allocator.empty_cache", "the empty_cache() points are a training step's (after_forward, after_backward, ...); remove it for an inference job"));
            }
            Some(validate_inference(&v, i, &cluster, &parallel, f.jitter.is_some())?)
        }
        None => None,
    };
    let (training, workload) = match &inference {
        // The stand-in's dtypes are the job's: weights not quantized and activations in the
        // compute dtype; no dropout in eval mode (the DAG is built without it).
        Some(i) => {
            let mut tr = training;
            tr.precision = Precision::preset("bf16").unwrap_or(tr.precision);
            tr.precision.param = i.compute_dtype;
            tr.precision.compute = i.compute_dtype;
            tr.precision.grad = i.compute_dtype;
            tr.precision.optimizer_state = i.compute_dtype;
            tr.steps = 1;
            let mut w = workload;
            w.compute_dtype = i.compute_dtype;
            w.logits_fp32 = false;
            (tr, w)
        }
        None => (training, workload),
    };
    let name = f.name.clone().unwrap_or_else(|| stem.to_string());
    if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(
            v.err("name", format!("\"{name}\" cannot name an output folder; use letters, digits, '-', '_' or '.'"))
        );
    }
    Ok(Scenario {
        name,
        description: f.description.clone().unwrap_or_default(),
        source: path.to_path_buf(),
        model,
        workload,
        cluster,
        parallel,
        training,
        allocator,
        jitter,
        job,
        inference,
    })
}

fn validate_offload(
    v: &V,
    o: &OffloadSection,
    parallel: &ParallelConfig,
    cluster: &Cluster,
) -> Result<Option<crate::plan::OffloadConfig>, ScenarioError> {
    use crate::plan::OffloadDevice;
    let device = |field: &str, x: Option<&str>, default: &str| -> Result<Option<OffloadDevice>, ScenarioError> {
        Ok(match v.choice(field, x.unwrap_or(default), &["cpu", "nvme", "none"])? {
            "cpu" => Some(OffloadDevice::Cpu),
            "nvme" => Some(OffloadDevice::Nvme),
            _ => None,
        })
    };
    let fsdp = parallel.framework == Framework::Fsdp;
    let parameters = device("offload.parameters", o.parameters.as_deref(), "none")?;
    // FSDP offloads the optimizer with the parameters; DeepSpeed's default is the optimizer.
    let optimizer = device("offload.optimizer", o.optimizer.as_deref(), if fsdp { "none" } else { "cpu" })?;
    if fsdp {
        if o.optimizer.is_some() && optimizer.is_some() {
            return Err(v.err("offload.optimizer", "FSDP has no optimizer-only offload: CPUOffload(offload_params=True) moves parameters, gradients and the optimizer step to the CPU; set offload.parameters = \"cpu\" and leave offload.optimizer out (or use parallel.framework = \"deepspeed\")"));
        }
        match parameters {
            None => return Ok(None),
            Some(OffloadDevice::Nvme) => {
                return Err(v.err("offload.parameters", "FSDP's CPUOffload offloads to \"cpu\" only; NVMe offload is DeepSpeed's ZeRO-Infinity (parallel.framework = \"deepspeed\")"))
            }
            Some(OffloadDevice::Cpu) => {}
        }
        if parallel.sharding != Sharding::Zero3 {
            return Err(v.err(
                "offload.parameters",
                format!(
                    "FSDP CPU offload is simulated with parallel.sharding = \"full_shard\", got {}",
                    parallel.sharding.display()
                ),
            ));
        }
    } else {
        let Some(_) = optimizer else {
            if parameters.is_some() {
                return Err(v.err("offload.optimizer", "parameter offload is simulated together with optimizer offload (ZeRO-Infinity: offload_optimizer and offload_param); set offload.optimizer = \"cpu\" or \"nvme\""));
            }
            return Ok(None);
        };
        if !matches!(parallel.sharding, Sharding::Zero2 | Sharding::Zero3) {
            return Err(v.err(
                "offload.optimizer",
                format!(
                    "simulated with ZeRO stage 2 or 3 (parallel.sharding = \"zero2\" | \"zero3\"), got {}",
                    parallel.sharding.display()
                ),
            ));
        }
        if parameters.is_some() && parallel.sharding != Sharding::Zero3 {
            return Err(v.err(
                "offload.parameters",
                format!(
                    "DeepSpeed offloads parameters with ZeRO stage 3 only (parallel.sharding = \"zero3\"), got {}",
                    parallel.sharding.display()
                ),
            ));
        }
    }
    if parallel.model_parallel.pipeline > 1 && !fsdp {
        return Err(v.err("offload", "DeepSpeed offload with pipeline parallelism is not simulated: its pipeline engine runs ZeRO stage 0 or 1 only, and offload is simulated with ZeRO-2/3; use parallel.framework = \"fsdp\" with sharding = \"full_shard\" and offload.parameters = \"cpu\" (FSDP CPU offload on each stage)"));
    }
    // The defaults, then what the section sets, each checked.
    let mut c = default_offload(cluster, parallel.framework, optimizer.unwrap_or(OffloadDevice::Cpu), parameters);
    let rate = |field: &str, x: f64| {
        if x > 0.0 && x.is_finite() {
            Ok(x)
        } else {
            Err(v.err(field, format!("must be a positive number, got {x}")))
        }
    };
    // NVMe bandwidth is the node's, shared by its GPUs.
    let per_gpu = 1e9 / f64::from(cluster.gpus_per_node);
    if let Some(x) = o.cpu_memory {
        c.cpu_memory_bytes = v.positive("offload.cpu_memory", x)?;
    }
    if let Some(x) = o.nvme_capacity {
        c.nvme_capacity_bytes = v.positive("offload.nvme_capacity", x)?;
    }
    if let Some(x) = o.h2d_gb_per_s {
        c.h2d_bytes_per_s = rate("offload.h2d_gb_per_s", x)? * 1e9;
    }
    if let Some(x) = o.d2h_gb_per_s {
        c.d2h_bytes_per_s = rate("offload.d2h_gb_per_s", x)? * 1e9;
    }
    if let Some(x) = o.nvme_read_gb_per_s {
        c.nvme_read_bytes_per_s = rate("offload.nvme_read_gb_per_s", x)? * per_gpu;
    }
    if let Some(x) = o.nvme_write_gb_per_s {
        c.nvme_write_bytes_per_s = rate("offload.nvme_write_gb_per_s", x)? * per_gpu;
    }
    if let Some(x) = o.cpu_adam_params_per_s {
        c.cpu_adam_params_per_s = rate("offload.cpu_adam_params_per_s", x)?;
    }
    Ok(Some(c))
}

/// Offload with every `[offload]` default: a DGX node's host memory and NVMe, pinned copies
/// at the GPU's PCIe generation, the node's NVMe bandwidth shared by its GPUs, and the CPU
/// optimizer of the framework (DeepSpeedCPUAdam, or PyTorch's Adam on CPU tensors).
pub fn default_offload(
    cluster: &Cluster,
    framework: Framework,
    optimizer: crate::plan::OffloadDevice,
    parameters: Option<crate::plan::OffloadDevice>,
) -> crate::plan::OffloadConfig {
    let (h2d, d2h) = pcie_bytes_per_s(cluster.gpu.pcie_gen);
    let per_gpu = f64::from(cluster.gpus_per_node);
    crate::plan::OffloadConfig {
        optimizer,
        parameters,
        cpu_memory_bytes: DEFAULT_CPU_MEMORY,
        nvme_capacity_bytes: DEFAULT_NVME_CAPACITY,
        h2d_bytes_per_s: h2d,
        d2h_bytes_per_s: d2h,
        nvme_read_bytes_per_s: DEFAULT_NVME_READ_BYTES_PER_S / per_gpu,
        nvme_write_bytes_per_s: DEFAULT_NVME_WRITE_BYTES_PER_S / per_gpu,
        cpu_adam_params_per_s: match framework {
            Framework::Fsdp => DEFAULT_TORCH_CPU_ADAM_PARAMS_PER_S,
            Framework::Deepspeed => DEFAULT_CPU_ADAM_PARAMS_PER_S,
        },
    }
}

fn validate_lora(
    v: &V,
    l: &LoraSection,
    model: &ModelConfig,
    parallel: &ParallelConfig,
) -> Result<crate::model::LoraConfig, ScenarioError> {
    use crate::model::lora::{default_targets, module_names};
    use crate::model::WeightFormat;
    let mp = &parallel.model_parallel;
    if mp.pipeline > 1 || mp.tensor > 1 {
        let field = if mp.pipeline > 1 { "parallel.pipeline" } else { "parallel.tensor" };
        return Err(v.err(field, "LoRA with Megatron tensor / pipeline parallelism is not simulated yet; use data parallelism (DDP or FSDP sharding)"));
    }
    let rank = v.positive("lora.rank", l.rank.unwrap_or(8))?;
    if rank > model.hidden {
        return Err(v.err("lora.rank", format!("{rank} is more than model.hidden ({}): not a low rank", model.hidden)));
    }
    let alpha = l.alpha.unwrap_or(8.0);
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(v.err("lora.alpha", format!("must be a positive number, got {alpha}")));
    }
    let dropout = l.dropout.unwrap_or(0.0);
    if !(0.0..1.0).contains(&dropout) {
        return Err(v.err("lora.dropout", format!("must be in [0, 1), got {dropout}")));
    }
    let names = module_names(model.family);
    let targets = l.target_modules.clone().unwrap_or_else(|| default_targets(model.family));
    if targets.is_empty() {
        return Err(v.err("lora.target_modules", "must name at least one module"));
    }
    for t in &targets {
        if t != "all-linear" && !names.iter().any(|(n, _)| n == t) {
            let allowed: Vec<String> =
                names.iter().map(|(n, _)| format!("\"{n}\"")).chain(["\"all-linear\"".to_string()]).collect();
            return Err(v.err(
                "lora.target_modules",
                format!(
                    "unknown module \"{t}\" for the {} family; allowed: {}",
                    format!("{:?}", model.family).to_lowercase(),
                    allowed.join(", ")
                ),
            ));
        }
    }
    let base = match v.choice("lora.base_weights", l.base_weights.as_deref().unwrap_or("bf16"), &["bf16", "nf4"])? {
        "nf4" => WeightFormat::Nf4 { double_quant: l.double_quant.unwrap_or(false) },
        _ => {
            if l.double_quant.is_some() {
                return Err(v.err("lora.double_quant", "only applies to base_weights = \"nf4\" (QLoRA)"));
            }
            WeightFormat::Half
        }
    };
    Ok(crate::model::LoraConfig { rank, alpha, targets, dropout, base })
}

/// `[job] kind`, and the sections it requires and rules out.
fn job_kind(v: &V, f: &ScenarioFile) -> Result<JobKind, ScenarioError> {
    let kind = f.job.as_ref().and_then(|j| j.kind.as_deref()).unwrap_or("train");
    let job = match v.choice("job.kind", kind, &["train", "inference", "finetune-lora"])? {
        "train" => JobKind::Train,
        "inference" => JobKind::Inference,
        _ => JobKind::FinetuneLora,
    };
    match (job, f.lora.is_some()) {
        (JobKind::FinetuneLora, false) => {
            return Err(v.err("lora", "missing section [lora] (job.kind = \"finetune-lora\" needs the adapters' rank and target_modules, or their defaults: write [lora] with no keys)"))
        }
        (JobKind::Train | JobKind::Inference, true) => {
            return Err(v.err("lora", "[lora] applies to LoRA fine-tuning: add [job] kind = \"finetune-lora\" or remove it"))
        }
        _ => {}
    }
    let job_train = if job == JobKind::FinetuneLora { JobKind::Train } else { job };
    match (job_train, f.training.is_some(), f.inference.is_some()) {
        (JobKind::Train, _, true) => Err(v.err(
            "inference",
            "[inference] applies to inference jobs: add [job] kind = \"inference\" (and drop [training]) or remove it",
        )),
        (JobKind::Train, false, false) => {
            Err(v.err("training", "missing section [training] (a training job needs micro_batch and seq_len)"))
        }
        (JobKind::FinetuneLora, _, _) => Ok(job),
        (JobKind::Inference, true, _) => Err(v.err(
            "training",
            "[training] does not apply to job.kind = \"inference\": the batch and lengths go in [inference]",
        )),
        (JobKind::Inference, false, false) => Err(v.err(
            "inference",
            "missing section [inference] (job.kind = \"inference\" needs batch, prompt_len and gen_len)",
        )),
        _ => Ok(job),
    }
}

fn inference_lengths(v: &V, i: &InferenceSection) -> Result<(i64, i64, i64), ScenarioError> {
    let batch = v.positive("inference.batch", i.batch)?;
    let prompt = v.positive("inference.prompt_len", i.prompt_len)?;
    let gen = v.positive("inference.gen_len", i.gen_len)?;
    const MAX: u64 = 1 << 22;
    for (field, x) in [("inference.batch", batch), ("inference.prompt_len", prompt), ("inference.gen_len", gen)] {
        if x > MAX {
            return Err(v.err(field, format!("at most {MAX} is simulated, got {x}")));
        }
    }
    Ok((batch as i64, prompt as i64, gen as i64))
}

/// The training section an inference job stands for: one step of batch x prompt_len.
fn inference_standin(batch: i64, prompt_len: i64) -> TrainingSection {
    // Its dtypes are replaced by the job's once [inference] is validated (FP16: every GPU has it).
    TrainingSection {
        micro_batch: batch,
        seq_len: prompt_len,
        precision: Some("bf16".into()),
        compute_dtype: Some("fp16".into()),
        ..Default::default()
    }
}

fn validate_inference(
    v: &V,
    i: &InferenceSection,
    cluster: &Cluster,
    parallel: &ParallelConfig,
    jitter: bool,
) -> Result<crate::infer::InferenceConfig, ScenarioError> {
    use crate::infer::{InferenceConfig, KvCacheKind};
    use crate::model::{KvDtype, WeightFormat};
    let (batch, prompt_len, gen_len) = inference_lengths(v, i)?;
    if parallel.sharding != Sharding::None {
        return Err(v.err("parallel.sharding", "inference keeps whole (or tensor-parallel) weights on every GPU: sharding (FSDP / ZeRO) applies to training; use \"none\" with parallel.tensor for tensor parallelism"));
    }
    let mp = &parallel.model_parallel;
    if mp.pipeline > 1 {
        return Err(v.err("parallel.pipeline", "pipeline-parallel inference is not simulated yet; use parallel.tensor"));
    }
    if mp.sequence_parallel {
        return Err(v.err("parallel.sequence_parallel", "sequence parallelism applies to training; remove it"));
    }
    if jitter {
        return Err(v.err("jitter", "per-rank jitter is simulated for training steps only; remove [jitter]"));
    }
    let weights = i.weights.as_deref().unwrap_or("bf16");
    let weights = v.choice("inference.weights", weights, &["bf16", "fp16", "int8", "int4", "nf4"])?;
    if i.group_size.is_some() && weights != "int4" {
        return Err(v.err("inference.group_size", "only applies to weights = \"int4\" (GPTQ / AWQ groups)"));
    }
    if i.double_quant.is_some() && weights != "nf4" {
        return Err(v.err("inference.double_quant", "only applies to weights = \"nf4\" (bitsandbytes)"));
    }
    let format = match weights {
        "int8" => WeightFormat::Int8,
        "int4" => WeightFormat::Int4 { group: v.positive("inference.group_size", i.group_size.unwrap_or(128))? },
        "nf4" => WeightFormat::Nf4 { double_quant: i.double_quant.unwrap_or(false) },
        _ => WeightFormat::Half,
    };
    let default_compute = if weights == "fp16" { "fp16" } else { "bf16" };
    let compute_name = i.compute_dtype.as_deref().unwrap_or(default_compute);
    let compute = match v.choice("inference.compute_dtype", compute_name, &["bf16", "fp16"])? {
        "fp16" => Dtype::Fp16,
        _ => Dtype::Bf16,
    };
    if matches!(weights, "bf16" | "fp16") && weights != compute_name {
        return Err(v.err(
            "inference.compute_dtype",
            format!("{weights} weights compute in {weights}; set compute_dtype = \"{weights}\" or leave it out"),
        ));
    }
    if compute == Dtype::Bf16 && cluster.gpu.bf16_flops.is_none() {
        let field = if i.compute_dtype.is_some() { "inference.compute_dtype" } else { "inference.weights" };
        return Err(
            v.err(field, format!("{} has no BF16 tensor cores; use compute_dtype = \"fp16\"", cluster.gpu.name))
        );
    }
    let kv_name = i.kv_cache_dtype.as_deref().unwrap_or(compute.name());
    let kv_dtype = if kv_name == "fp8" {
        KvDtype::Fp8
    } else if kv_name == compute.name() {
        KvDtype::Half
    } else {
        return Err(v.err(
            "inference.kv_cache_dtype",
            format!(
                "unknown or mismatched dtype \"{kv_name}\"; allowed: \"{}\" (the compute dtype), \"fp8\"",
                compute.name()
            ),
        ));
    };
    let kv_cache =
        match v.choice("inference.kv_cache", i.kv_cache.as_deref().unwrap_or("static"), &["static", "dynamic"])? {
            "dynamic" => KvCacheKind::Dynamic,
            _ => KvCacheKind::Static,
        };
    if kv_cache == KvCacheKind::Dynamic && kv_dtype == KvDtype::Fp8 {
        return Err(v.err(
            "inference.kv_cache_dtype",
            "an FP8 KV cache is preallocated (vLLM, TensorRT-LLM): use kv_cache = \"static\"",
        ));
    }
    let cuda_graphs = i.cuda_graphs.unwrap_or(kv_cache == KvCacheKind::Static);
    if cuda_graphs && kv_cache == KvCacheKind::Dynamic {
        return Err(v.err("inference.cuda_graphs", "a CUDA graph replays fixed shapes; a dynamic cache grows every step: use kv_cache = \"static\" or cuda_graphs = false"));
    }
    Ok(InferenceConfig {
        batch: batch as u64,
        prompt_len: prompt_len as u64,
        gen_len: gen_len as u64,
        weights: format,
        compute_dtype: compute,
        kv_dtype,
        kv_cache,
        cuda_graphs,
    })
}

/// `[parallel]`'s Megatron-LM degrees: they must divide the GPUs, the heads (and KV heads),
/// the vocabulary-parallel split and the layers, as Megatron's own argument checks demand.
fn validate_model_parallel(
    v: &V,
    p: &ParallelSection,
    model: &ModelConfig,
    gpus: u64,
    gpus_per_node: u64,
    sharding: Sharding,
) -> Result<ModelParallel, ScenarioError> {
    let tensor = match p.tensor {
        Some(x) => v.positive("parallel.tensor", x)?,
        None => 1,
    };
    let pipeline = match p.pipeline {
        Some(x) => v.positive("parallel.pipeline", x)?,
        None => 1,
    };
    if gpus % (tensor * pipeline) != 0 {
        return Err(v.err(
            "parallel.tensor",
            format!(
                "tensor ({tensor}) x pipeline ({pipeline}) = {} must divide hardware.gpus ({gpus}); the data-parallel degree is gpus / (tensor x pipeline)",
                tensor * pipeline
            ),
        ));
    }
    if tensor > gpus_per_node {
        return Err(v.err(
            "parallel.tensor",
            format!(
                "tensor parallelism runs inside a node: at most hardware.gpus_per_node ({gpus_per_node}), got {tensor}"
            ),
        ));
    }
    if model.n_heads % tensor != 0 || model.n_kv_heads % tensor != 0 {
        return Err(v.err(
            "parallel.tensor",
            format!(
                "must divide model.n_heads ({}) and the KV heads ({}), got {tensor}",
                model.n_heads, model.n_kv_heads
            ),
        ));
    }
    if model.ffn_hidden % tensor != 0 || model.vocab % tensor != 0 {
        return Err(v.err(
            "parallel.tensor",
            format!(
                "must divide model.ffn_hidden ({}) and model.vocab ({}) (pad the vocabulary as Megatron's --make-vocab-size-divisible-by does), got {tensor}",
                model.ffn_hidden, model.vocab
            ),
        ));
    }
    let sequence_parallel = p.sequence_parallel.unwrap_or(false);
    if sequence_parallel && tensor == 1 {
        return Err(v.err("parallel.sequence_parallel", "needs tensor parallelism (parallel.tensor > 1)"));
    }
    let schedule = match v.choice(
        "parallel.schedule",
        p.schedule.as_deref().unwrap_or(if p.virtual_stages.unwrap_or(1) > 1 { "interleaved-1f1b" } else { "1f1b" }),
        &["gpipe", "1f1b", "interleaved-1f1b"],
    )? {
        "gpipe" => PipelineSchedule::Gpipe,
        "1f1b" => PipelineSchedule::OneFOneB,
        _ => PipelineSchedule::Interleaved,
    };
    let virtual_stages = match p.virtual_stages {
        Some(x) => v.positive("parallel.virtual_stages", x)?,
        None => 1,
    };
    if virtual_stages > 1 && schedule != PipelineSchedule::Interleaved {
        return Err(v.err("parallel.virtual_stages", "model chunks per stage need schedule = \"interleaved-1f1b\""));
    }
    if schedule == PipelineSchedule::Interleaved && (virtual_stages < 2 || pipeline < 2) {
        return Err(v.err(
            "parallel.virtual_stages",
            "interleaved-1f1b needs parallel.pipeline >= 2 and parallel.virtual_stages >= 2 (model chunks per stage)",
        ));
    }
    let layers = model.n_layers;
    let stage_layers = match &p.stage_layers {
        None => Vec::new(),
        Some(list) => {
            if virtual_stages > 1 {
                return Err(v.err(
                    "parallel.stage_layers",
                    "an explicit split is per stage; it cannot be combined with virtual_stages",
                ));
            }
            if list.len() as u64 != pipeline {
                return Err(v.err(
                    "parallel.stage_layers",
                    format!("needs one entry per pipeline stage ({pipeline}), got {}", list.len()),
                ));
            }
            let mut out = Vec::new();
            for &x in list {
                if x < 1 {
                    return Err(
                        v.err("parallel.stage_layers", format!("every stage needs at least one layer, got {x}"))
                    );
                }
                out.push(x as u64);
            }
            let sum: u64 = out.iter().sum();
            if sum != layers {
                return Err(v.err(
                    "parallel.stage_layers",
                    format!("the stages' layers add up to {sum}, but model.n_layers is {layers}"),
                ));
            }
            out
        }
    };
    if stage_layers.is_empty() && layers < pipeline * virtual_stages {
        return Err(v.err(
            "parallel.pipeline",
            format!(
                "{} pipeline stages x {virtual_stages} chunks need at least as many layers, model.n_layers is {layers}",
                pipeline
            ),
        ));
    }
    if stage_layers.is_empty() && schedule == PipelineSchedule::Interleaved && layers % (pipeline * virtual_stages) != 0
    {
        return Err(v.err(
            "parallel.virtual_stages",
            format!(
                "interleaving needs model.n_layers ({layers}) divisible by pipeline x virtual_stages ({})",
                pipeline * virtual_stages
            ),
        ));
    }
    if pipeline > 1 && sharding == Sharding::HybridShard {
        return Err(v.err(
            "parallel.sharding",
            "hybrid_shard with pipeline parallelism is not simulated yet; use \"full_shard\" or \"shard_grad_op\" (FSDP over each stage's data-parallel ranks, as torchtitan does), \"zero1\" or \"none\"",
        ));
    }
    if tensor > 1 && sharding == Sharding::HybridShard {
        return Err(v.err(
            "parallel.sharding",
            "hybrid_shard with tensor parallelism is not modelled; use \"full_shard\" over the data-parallel ranks",
        ));
    }
    let overlap_p2p = p.overlap_p2p_communication.unwrap_or(false);
    if p.overlap_p2p_communication.is_some() && pipeline < 2 {
        return Err(v.err(
            "parallel.overlap_p2p_communication",
            "only applies to pipeline parallelism (parallel.pipeline > 1)",
        ));
    }
    Ok(ModelParallel { tensor, sequence_parallel, pipeline, virtual_stages, schedule, stage_layers, overlap_p2p })
}

/// `[allocator]`: option values as `PYTORCH_CUDA_ALLOC_CONF` accepts them
/// (`AllocatorConfig::parseArgs` in c10/core/AllocatorConfig.cpp).
fn validate_allocator(v: &V, a: &AllocatorSection, cluster: &Cluster) -> Result<AllocatorSettings, ScenarioError> {
    let mut out = AllocatorSettings::default();
    if let Some(k) = &a.kind {
        out.kind = match v.choice("allocator.kind", k, &["caching", "exact"])? {
            "caching" => AllocatorKind::Caching,
            _ => AllocatorKind::Exact,
        };
    }
    let caching_only =
        |field: &str| v.err(field, "only applies to allocator.kind = \"caching\" (the exact model has no segments)");
    if let Some(e) = a.expandable_segments {
        if out.kind == AllocatorKind::Exact {
            return Err(caching_only("allocator.expandable_segments"));
        }
        out.expandable_segments = e;
    }
    if let Some(m) = a.max_split_size_mb {
        if out.kind == AllocatorKind::Exact {
            return Err(caching_only("allocator.max_split_size_mb"));
        }
        // "CachingAllocator option max_split_size_mb too small, must be >= 20" (kLargeBuffer).
        if m < 20 {
            return Err(
                v.err("allocator.max_split_size_mb", format!("must be >= 20 (MiB), as PyTorch requires; got {m}"))
            );
        }
        out.max_split_size_mb = Some(m as u64);
    }
    if let Some(d) = a.roundup_power2_divisions {
        if out.kind == AllocatorKind::Exact {
            return Err(caching_only("allocator.roundup_power2_divisions"));
        }
        if d < 0 || (d > 0 && !(d as u64).is_power_of_two()) {
            return Err(v.err(
                "allocator.roundup_power2_divisions",
                format!("must be 0 (off) or a power of 2, as PyTorch requires; got {d}"),
            ));
        }
        out.roundup_power2_divisions = d as u64;
    }
    if let Some(points) = &a.empty_cache {
        for p in points {
            let at = EmptyCacheAt::parse(p).ok_or_else(|| {
                v.err(
                    "allocator.empty_cache",
                    format!(
                        "unknown point \"{p}\"; allowed: {}",
                        EmptyCacheAt::NAMES.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
            if !out.empty_cache.contains(&at) {
                out.empty_cache.push(at);
            }
        }
        out.empty_cache.sort();
    }
    for (field, val, slot) in [
        ("allocator.cublas_workspace", a.cublas_workspace, &mut out.cublas_workspace),
        ("allocator.nccl_buffers", a.nccl_buffers, &mut out.nccl_buffers),
    ] {
        if let Some(x) = val {
            if x < 0 {
                return Err(v.err(field, format!("must be >= 0 bytes, got {x}")));
            }
            *slot = x as u64;
        }
    }
    if out.outside_bytes() >= cluster.capacity_bytes() {
        return Err(v.err(
            "allocator.nccl_buffers",
            format!(
                "cuBLAS workspace + NCCL buffers ({} bytes) leave nothing of the {} bytes the CUDA context leaves",
                out.outside_bytes(),
                cluster.capacity_bytes()
            ),
        ));
    }
    Ok(out)
}

/// Turns an error from deserializing a `toml::Value` tree (no spans) into one that names the
/// dotted field: toml appends "in `a.b`" (the table or key) to its message; an unknown or
/// missing field adds its own name.
fn value_error(file: &Path, err: &toml::de::Error) -> ScenarioError {
    let msg = err.message().to_string();
    let full = err.to_string();
    let mut field = full
        .lines()
        .filter_map(|l| l.trim().strip_prefix("in `").and_then(|r| r.strip_suffix('`')))
        .next_back()
        .unwrap_or("")
        .to_string();
    for prefix in ["unknown field `", "missing field `"] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            let key = rest.split('`').next().unwrap_or("");
            if field.rsplit('.').next() != Some(key) {
                field = if field.is_empty() { key.to_string() } else { format!("{field}.{key}") };
            }
        }
    }
    ScenarioError::new(file, field, msg.replace('\n', " "))
}
