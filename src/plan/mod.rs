//! Parallelism and policies: who holds which bytes of model state, in which dtype, and when
//! it is created. Everything the scheduler allocates for parameters, gradients and optimizer
//! state is sized here, so the report's model-state table and the simulation agree.

mod framework;
mod precision_aware;
pub use framework::{DeepspeedConfig, DeepspeedOptimizer, Framework, MegatronConfig, DEEPSPEED_ALLREDUCE_BUCKET};
pub use precision_aware::{PrecisionAware, StateDtype};

use serde::Serialize;

use crate::model::{Dtype, LayerDag, Region};

/// Data-parallel sharding strategy, in PyTorch FSDP and DeepSpeed ZeRO vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// DDP: everything replicated, gradients all-reduced in buckets during backward.
    None,
    /// ZeRO-1: optimizer state (and master weights) sharded.
    Zero1,
    /// ZeRO-2 / FSDP SHARD_GRAD_OP: gradients sharded too.
    Zero2,
    /// ZeRO-3 / FSDP FULL_SHARD: parameters sharded too.
    Zero3,
    /// FSDP HYBRID_SHARD: FULL_SHARD inside a node, replicated across nodes.
    HybridShard,
}

impl Sharding {
    /// The name PyTorch FSDP / DeepSpeed users know.
    pub fn display(self) -> &'static str {
        match self {
            Sharding::None => "NO_SHARD (DDP)",
            Sharding::Zero1 => "ZeRO-1 (optimizer state sharded)",
            Sharding::Zero2 => "SHARD_GRAD_OP / ZeRO-2",
            Sharding::Zero3 => "FULL_SHARD / ZeRO-3",
            Sharding::HybridShard => "HYBRID_SHARD",
        }
    }
}

impl BackwardPrefetch {
    pub fn display(self) -> &'static str {
        match self {
            BackwardPrefetch::Pre => "BACKWARD_PRE",
            BackwardPrefetch::Post => "BACKWARD_POST",
            BackwardPrefetch::None => "None",
        }
    }
}

/// FSDP `BackwardPrefetch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackwardPrefetch {
    /// BACKWARD_PRE: all-gather unit i-1 before computing unit i's gradients.
    Pre,
    /// BACKWARD_POST: all-gather unit i-1 after unit i's gradients, before its reduce-scatter.
    Post,
    /// No prefetch: unit i-1 is gathered when autograd reaches it.
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParallelConfig {
    pub sharding: Sharding,
    pub framework: Framework,
    pub reshard_after_forward: bool,
    /// FSDP2's `reshard_after_forward = n` (an int): after forward a unit keeps 1/n of its
    /// gathered parameters (`_to_sharded_post_forward`), and its backward all-gathers over
    /// those n ranks only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub post_forward_shard: Option<u64>,
    pub backward_prefetch: BackwardPrefetch,
    pub forward_prefetch: bool,
    pub limit_all_gathers: bool,
    /// DDP `gradient_as_bucket_view`: when false (the default) DDP's buckets are a second
    /// copy of every gradient.
    pub gradient_as_bucket_view: bool,
    /// DDP `bucket_cap_mb` (25 MB default), bytes.
    pub bucket_bytes: u64,
    /// Model parallelism (Megatron-LM): tensor, sequence and pipeline parallel degrees.
    pub model_parallel: ModelParallel,
    /// DeepSpeed ZeRO-Offload / ZeRO-Infinity, or FSDP `CPUOffload(offload_params=True)`.
    pub offload: Option<OffloadConfig>,
    /// DeepSpeed's `zero_optimization` knobs (used only when `framework` is DeepSpeed).
    pub deepspeed: DeepspeedConfig,
    /// Megatron-Core's overlap options (all off unless `framework` is Megatron).
    pub megatron: MegatronConfig,
    /// FSDP gradient accumulation without gradient sync (FSDP1 `no_sync()`, FSDP2
    /// `set_requires_gradient_sync(False)`, HF Accelerate's default): unsharded gradients
    /// accumulate over the step's micro-batches and are reduce-scattered in the last.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_sync: bool,
    /// HYBRID_SHARD: the ranks each replica shards over (FSDP2's HSDP mesh shard dimension,
    /// torchtitan `data_parallel_shard_degree`); one node's GPUs when unset (FSDP1's
    /// HYBRID_SHARD default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hsdp_shard: Option<u64>,
    /// torchtitan's async tensor parallelism (`enable_async_tensor_parallel`: torch.compile's
    /// micro-pipelined all-gather-matmul and matmul-reduce-scatter over symmetric memory):
    /// the sequence-parallel collectives pipelined with their GEMMs, as Megatron's
    /// `--tp-comm-overlap` pairs them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub async_tp: bool,
    /// FSDP1 `use_orig_params=True`: the module's parameters are the original tensors,
    /// exposed as views into the FlatParameter; the same bytes, except where a FlatParameter
    /// mixes frozen and trainable parameters (LoRA under `wrap = "block"`,
    /// [`crate::model::LoraConfig::shared_flat`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub use_orig_params: bool,
    /// Megatron-Core's flex token dispatcher on DeepEP (`[moe] dispatcher = "deepep"`): the
    /// MoE dispatch and combine as DeepEP's kernels move tokens; None: NCCL's all-to-all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deepep: Option<crate::net::deepep::DeepEp>,
}

impl ParallelConfig {
    /// Whether parameters are held sharded and gathered for each use: FULL_SHARD, HYBRID_SHARD,
    /// a SHARD_GRAD_OP that shards them (FSDP's), and FSDP1's NO_SHARD (whose unit copies
    /// stand where gathered parameters are). The gathered copies are in the compute dtype
    /// (FSDP's `MixedPrecision(param_dtype=...)`), so autocast casts no weight of such a plan.
    pub fn params_sharded(&self) -> bool {
        let sh = self.sharding;
        matches!(sh, Sharding::Zero3 | Sharding::HybridShard)
            || (sh == Sharding::Zero2 && self.framework.zero2_shards_parameters())
            || self.framework.fsdp1_no_shard(sh)
    }

    /// Whether parameters are sharded in FSDP1's flattened units: one FlatParameter per unit,
    /// of one dtype ("Must flatten tensors with uniform dtype"), so a unit cannot mix FP32 and
    /// 16-bit parameters (PyTorch FSDP, `framework` fsdp or fsdp1, with
    /// [`ParallelConfig::params_sharded`]). FSDP2 shards each parameter on its own.
    pub fn flat_sharded_units(&self) -> bool {
        matches!(self.framework, Framework::Fsdp | Framework::Fsdp1) && self.params_sharded()
    }

    /// torchtitan's FSDP2 with expert parallelism (`framework = "fsdp2"`, `sharding =
    /// "full_shard"` or `"hybrid_shard"`, `expert > 1`): each MoE block's routed experts are
    /// sharded over the `efsdp` mesh, the rest over the `fsdp` (dp_shard x cp) mesh, and the
    /// block's all-gather and reduce-scatter run once per mesh ([`Plan::expert_shard_group`]);
    /// under hybrid_shard both meshes lie inside each replica's shard group.
    pub fn fsdp_expert_split(&self) -> bool {
        self.framework == Framework::Fsdp2
            && matches!(self.sharding, Sharding::Zero3 | Sharding::HybridShard)
            && self.model_parallel.expert > 1
    }

    /// The sharding as the framework's users name it: FSDP1's NO_SHARD is not DDP.
    pub fn sharding_display(&self) -> &'static str {
        if self.framework.fsdp1_no_shard(self.sharding) {
            "NO_SHARD (FSDP1)"
        } else {
            self.sharding.display()
        }
    }
}

/// Where offloaded state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OffloadDevice {
    Cpu,
    Nvme,
}

impl OffloadDevice {
    pub fn name(self) -> &'static str {
        match self {
            OffloadDevice::Cpu => "cpu",
            OffloadDevice::Nvme => "nvme",
        }
    }
}

/// Optimizer (and optionally parameter) offload, as the framework does it
/// (docs/research/issue8-sources.md, sections 1 and 2).
///
/// DeepSpeed (`stage_1_and_2.py`, `stage3.py`): the FP32 master partition and the optimizer
/// state live on the host (`offload_optimizer.device = "cpu"`) or on NVMe (`"nvme"`, swapped
/// through the host for the step); the FP32 gradient partition is on the host, each reduced
/// gradient partition is copied to it during backward; `DeepSpeedCPUAdam` steps on the CPU.
/// Without parameter offload the updated 16-bit partition comes back to the GPU; with
/// `offload_param` (ZeRO-3 only) the 16-bit partition stays on the host (or NVMe) and each
/// all-gather first copies the partition to the GPU.
///
/// FSDP1 `CPUOffload(offload_params=True)`: the sharded FlatParameter (in the parameter
/// dtype, FP32 under `MixedPrecision`) and a pinned sharded gradient live on the host; the
/// shard is copied to the GPU before every all-gather (`pre_unshard`), the sharded gradient
/// to the host after its reduce-scatter, and `optimizer.step()` runs on the CPU on CPU tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OffloadConfig {
    /// Optimizer partition (master + state): always offloaded when offload is on.
    pub optimizer: OffloadDevice,
    /// The parameter partition, when offloaded too.
    pub parameters: Option<OffloadDevice>,
    /// Host memory of one node, bytes.
    pub cpu_memory_bytes: u64,
    /// NVMe capacity of one node, bytes.
    pub nvme_capacity_bytes: u64,
    /// Pinned host-to-device and device-to-host copy bandwidth per GPU, bytes/s.
    pub h2d_bytes_per_s: f64,
    pub d2h_bytes_per_s: f64,
    /// NVMe read and write bandwidth per GPU: the node's aggregate shared by its GPUs.
    pub nvme_read_bytes_per_s: f64,
    pub nvme_write_bytes_per_s: f64,
    /// Parameters the CPU optimizer updates per second for one GPU's partition.
    pub cpu_adam_params_per_s: f64,
}

impl OffloadConfig {
    /// The offloaded gradient partition is FP32 in both frameworks: DeepSpeed casts each
    /// reduced partition to the master dtype before its copy to the host
    /// (`async_inplace_copy_grad_to_fp32_buffer_from_gpu`, stage_1_and_2.py); FSDP's pinned
    /// `_cpu_grad` has the dtype of the FP32 sharded parameter.
    pub const GRAD_BYTES_PER_PARAM: u64 = 4;
    /// DeepSpeed's pinned swap buffers for NVMe parameter offload: `offload_param`'s
    /// defaults `buffer_count = 5` x `buffer_size = 1e8` elements of the 16-bit dtype
    /// (DeepSpeed's configuration reference).
    pub const PARAM_SWAP_BUFFER_ELEMENTS: u64 = 5 * 100_000_000;
    /// DeepSpeed's pinned buffers for NVMe optimizer offload: `buffer_count = 4` (the
    /// `offload_optimizer` default) buffers of the largest sub-group in FP32
    /// (`SwapBufferManager(num_elems=largest_numel, count=buffer_count)` in
    /// swap_tensor/optimizer_utils.py), a sub-group being at most `sub_group_size` (default
    /// 1e9) elements.
    pub const OPTIMIZER_SWAP_BUFFERS: u64 = 4;
    pub const SUB_GROUP_ELEMENTS: u64 = 1_000_000_000;

    /// Whether anything lives on NVMe.
    pub fn uses_nvme(&self) -> bool {
        self.optimizer == OffloadDevice::Nvme || self.parameters == Some(OffloadDevice::Nvme)
    }
}

/// Where a rank's offloaded bytes are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OffloadedBytes {
    /// Host memory (pinned).
    pub host: u64,
    /// NVMe.
    pub nvme: u64,
}

/// One piece of a rank's offloaded state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OffloadedPart {
    pub what: &'static str,
    pub category: crate::memory::Category,
    pub on: OffloadDevice,
    pub bytes: u64,
}

/// Pipeline schedule, as Megatron-LM and `torch.distributed.pipelining` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PipelineSchedule {
    /// All forwards of the step, then all backwards: every micro-batch's activations live.
    Gpipe,
    /// PipeDream-flush / Megatron's non-interleaved schedule: stage k runs p - k - 1 warm-up
    /// forwards, then alternates one forward and one backward.
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Megatron's interleaved 1F1B: each stage holds `virtual_stages` model chunks.
    #[serde(rename = "interleaved-1f1b")]
    Interleaved,
    /// DeepSeek's DualPipe (deepseek-ai/DualPipe `dualpipe.py`, DeepSeek-V3 technical
    /// report Sec. 3.2.1): micro-batches enter from both ends of the pipeline, so stage `k`
    /// holds model stages `k` and `p - 1 - k` (two copies of every stage's parameters), and
    /// in the steady state each forward chunk runs beside the other direction's backward
    /// chunk with their communication under each other's compute ([`crate::schedule`]'s
    /// `dualpipe`).
    #[serde(rename = "dualpipe")]
    DualPipe,
    /// DualPipeV (deepseek-ai/DualPipe `dualpipe/dualpipev.py`, Sea AI Lab's "cut-in-half"
    /// of DualPipe): the model in `2p` virtual stages, rank `k` holding stages `k` and
    /// `2p - 1 - k`, every micro-batch going down the ranks and back up (a V), with
    /// DualPipe's eight phases, overlapped forward-backward pairs and zero-bubble passes; one
    /// copy of the model.
    #[serde(rename = "dualpipev")]
    DualPipeV,
}

impl PipelineSchedule {
    /// DualPipe or DualPipeV: each rank holds two chunks met by micro-batches from two
    /// sides, in the order of `DualPipe.step` ([`crate::schedule::dualpipe`]).
    pub fn is_dualpipe(self) -> bool {
        matches!(self, PipelineSchedule::DualPipe | PipelineSchedule::DualPipeV)
    }

    pub fn name(self) -> &'static str {
        match self {
            PipelineSchedule::Gpipe => "gpipe",
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::Interleaved => "interleaved-1f1b",
            PipelineSchedule::DualPipe => "dualpipe",
            PipelineSchedule::DualPipeV => "dualpipev",
        }
    }
}

/// Megatron-LM's model parallelism: `--tensor-model-parallel-size`, `--sequence-parallel`,
/// `--pipeline-model-parallel-size`, `--num-layers-per-virtual-pipeline-stage` (as a count of
/// chunks per stage), and an explicit per-stage layer split for uneven pipelines.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelParallel {
    pub tensor: u64,
    pub sequence_parallel: bool,
    pub pipeline: u64,
    /// Model chunks per pipeline stage (1 unless interleaved).
    pub virtual_stages: u64,
    pub schedule: PipelineSchedule,
    /// Transformer blocks per pipeline stage, first to last (empty: an even split).
    pub stage_layers: Vec<u64>,
    /// Pipeline transfers overlap compute (Megatron-Core `--overlap-p2p-communication`).
    /// Off, a stage's send and the receive posted with it block its next compute, as in
    /// Megatron-LM 2021-22 and DeepSpeed's pipeline engine.
    pub overlap_p2p: bool,
    /// Expert parallelism (`--expert-model-parallel-size`), folded over the tensor-,
    /// context- and data-parallel ranks of a stage as Megatron-Core's parallel folding does
    /// (`megatron/core/parallel_state.py` `initialize_model_parallel`: the expert
    /// `RankGenerator` orders expert-tensor, expert, expert-data, pipeline): expert-parallel
    /// groups are `expert` ranks `expert_tensor` apart, and each expert slice is replicated
    /// over tensor x context x data / (`expert_tensor` x `expert`) ranks (its
    /// expert-data-parallel group, [`ModelParallel::expert_data_parallel`]).
    #[serde(skip_serializing_if = "is_one")]
    pub expert: u64,
    /// Expert tensor parallelism (`--expert-tensor-parallel-size`; Megatron's default is the
    /// tensor-parallel degree, `arguments.py` `validate_args`): each expert's weights are
    /// split over this many consecutive ranks (FC1 column-, FC2 row-parallel). 1 for a dense
    /// model.
    #[serde(skip_serializing_if = "is_one")]
    pub expert_tensor: u64,
    /// Context parallelism (`--context-parallel-size`): each sequence is split over this many
    /// ranks (tensor-parallel groups `tensor` apart), attention exchanging keys and values
    /// around a ring; parameters are replicated over them, so gradients are reduced (and a
    /// distributed optimizer shards) over data x context ranks, as Megatron-Core's
    /// data-parallel-with-context-parallel group does.
    #[serde(skip_serializing_if = "is_one")]
    pub context: u64,
    /// How context-parallel attention meets the whole sequence: a ring (Megatron's default),
    /// all-gathered keys and values (PyTorch's `context_parallel` under FSDP, torchtitan's
    /// default) or Ulysses all-to-alls (DeepSpeed, Megatron `--cp-comm-type a2a`).
    #[serde(skip_serializing_if = "crate::model::ContextComm::is_ring")]
    pub context_comm: crate::model::ContextComm,
}

impl Default for ModelParallel {
    fn default() -> Self {
        ModelParallel {
            tensor: 1,
            sequence_parallel: false,
            pipeline: 1,
            virtual_stages: 1,
            schedule: PipelineSchedule::OneFOneB,
            stage_layers: Vec::new(),
            overlap_p2p: false,
            expert: 1,
            expert_tensor: 1,
            context: 1,
            context_comm: crate::model::ContextComm::Ring,
        }
    }
}

fn is_all_blocks(x: &CheckpointBlocks) -> bool {
    *x == CheckpointBlocks::All
}

fn is_one(x: &u64) -> bool {
    *x == 1
}

impl ModelParallel {
    /// Data-parallel replicas of `gpus`: gpus / (tensor x pipeline), at least one.
    /// Model replicas that each take their own sequences (the batch's divisor).
    pub fn data_parallel(&self, gpus: u64) -> u64 {
        (gpus / (self.tensor * self.pipeline * self.context.max(1)).max(1)).max(1)
    }

    /// Expert-data-parallel degree of `gpus`: the ranks of a pipeline stage (tensor x context
    /// x data) over the expert-tensor x expert-parallel ranks, as `initialize_model_parallel`
    /// sizes `expert_data_parallel_size` (world size / (expert tensor x expert x pipeline)).
    pub fn expert_data_parallel(&self, gpus: u64) -> u64 {
        let stage = self.tensor * self.context.max(1) * self.data_parallel(gpus);
        (stage / (self.expert_tensor.max(1) * self.expert.max(1))).max(1)
    }

    /// Pipeline ranks holding each model stage: two under DualPipe (stage `k` and stage
    /// `p - 1 - k` on the same rank, one copy per direction), else one. Their gradients are
    /// reduced, and a distributed optimizer shards, over both copies' data-parallel ranks.
    pub fn stage_copies(&self) -> u64 {
        if self.schedule == PipelineSchedule::DualPipe {
            2
        } else {
            1
        }
    }

    /// The pipeline rank that runs virtual stage `vs`: chunk `vs / p` of stage `vs % p`, or,
    /// under DualPipe, stage `vs` of the forward direction on rank `vs` and stage `vs - p` of
    /// the reverse direction on rank `2p - 1 - vs` (under DualPipeV, virtual stage `vs` of
    /// the V on the same ranks).
    pub fn rank_of_virtual_stage(&self, vs: u64) -> u64 {
        let p = self.pipeline;
        if self.schedule.is_dualpipe() && vs >= p {
            2 * p - 1 - vs
        } else {
            vs % p
        }
    }

    /// Blocks held by each virtual stage (chunk), in model order: virtual stage j = chunk
    /// j / p of pipeline stage j % p. An explicit `stage_layers` split gives them, one entry
    /// per virtual stage (the first may be 0: the embedding alone; the last: the head and loss
    /// alone); otherwise layers are
    /// spread evenly, earlier stages taking the remainder.
    pub fn virtual_stage_layers(&self, n_layers: u64) -> Vec<u64> {
        if !self.stage_layers.is_empty() {
            return self.stage_layers.clone();
        }
        let vs = self.pipeline * self.virtual_stages;
        (0..vs).map(|j| n_layers / vs + u64::from(j < n_layers % vs)).collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    Adam,
    AdamW,
    Sgd,
}

/// `torch.optim` implementation, which decides the step's temporaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerImpl {
    /// `foreach=True` (PyTorch's CUDA default): `_foreach_sqrt` of the second moments makes
    /// one temporary the size of all local parameters in the state dtype.
    Foreach,
    /// `fused=True` (and DeepSpeed's FusedAdam): no temporaries.
    Fused,
    /// The per-parameter loop: two temporaries the size of the largest parameter.
    ForLoop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Checkpointing {
    None,
    /// Every transformer block is a checkpoint region: only its input is saved.
    Full,
    /// Keep everything but the attention core's s x s internals, which are recomputed.
    Selective,
    /// torchtitan's per-op selective checkpointing (`selective_ac_option = "op"`,
    /// torchtitan/distributed/activation_checkpoint.py `_apply_op_sac`): every block is a
    /// checkpoint region whose policy saves the outputs of the attention kernel (SDPA), of
    /// every other matmul (`aten.mm`: bias-free linears, the first of a block saved) and of
    /// reduce-scatters; everything else is recomputed in backward, only as far as needed.
    SelectiveOp,
}

impl Checkpointing {
    /// As a scenario spells it (`training.activation_checkpointing`).
    pub fn name(self) -> &'static str {
        match self {
            Checkpointing::None => "none",
            Checkpointing::Full => "full",
            Checkpointing::Selective => "selective",
            Checkpointing::SelectiveOp => "selective-op",
        }
    }
}

/// Megatron-Core's `--recompute-modules` under `--recompute-granularity selective`
/// (TransformerConfig.recompute_modules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeModule {
    /// The attention core, checkpointed (the default): its s x s scores are recomputed.
    CoreAttn,
    /// Output-discarding: the input and pre-MLP layernorms' outputs.
    Layernorm,
    /// Checkpointed: the dense MLP (its input kept).
    Mlp,
    /// Checkpointed: the MoE layer (router, dispatch, experts, shared experts).
    Moe,
    /// Output-discarding: the routed experts' activation function.
    MoeAct,
    /// Checkpointed: the shared experts.
    SharedExperts,
    /// Output-discarding: MLA's query and key-value up projections and the RoPE after them.
    MlaUpProj,
}

impl RecomputeModule {
    pub const ALL: [(&'static str, RecomputeModule); 7] = [
        ("core_attn", RecomputeModule::CoreAttn),
        ("layernorm", RecomputeModule::Layernorm),
        ("mlp", RecomputeModule::Mlp),
        ("moe", RecomputeModule::Moe),
        ("moe_act", RecomputeModule::MoeAct),
        ("shared_experts", RecomputeModule::SharedExperts),
        ("mla_up_proj", RecomputeModule::MlaUpProj),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, m)| *m == self).map_or("", |(n, _)| n)
    }
}

fn is_core_attn_only(x: &[RecomputeModule]) -> bool {
    x == [RecomputeModule::CoreAttn]
}

/// Saved activations copied to pinned host memory after a block's forward and back before
/// its backward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ActivationOffload {
    pub method: ActivationOffloadMethod,
    /// The first `blocks` blocks offload (Megatron `--cpu-offloading-num-layers`).
    pub blocks: u64,
    /// Fine-grained: the modules whose saved inputs go to the host
    /// ([`OffloadModules`]; empty for the other methods).
    pub modules: OffloadModules,
    /// Fine-grained: tensors of fewer elements stay on the GPU (Megatron
    /// `--min-offloaded-tensor-size`, default 1,048,576).
    pub min_elements: u64,
    /// Fine-grained: the share of each model chunk's eligible groups offloaded, the first
    /// in forward order (`--activation-offload-fraction`, default 1).
    pub fraction: f64,
    /// Pinned copy bandwidth per GPU, bytes/s.
    pub h2d_bytes_per_s: f64,
    pub d2h_bytes_per_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationOffloadMethod {
    /// Transformer Engine's offload handler as Megatron-Core drives it (`--cpu-offloading`,
    /// `get_cpu_offload_context`, `AsyncDoubleBufferGroupOffloadHandler`): copies on their
    /// own streams, a block's tensors freed when its copy ends, the reload of block l - 1
    /// started when block l's backward starts (two blocks' worth resident at most).
    Overlapped,
    /// PyTorch's `offload_wrapper` / `torch.autograd.graph.save_on_cpu(pin_memory=True)`:
    /// the pack hook copies each saved tensor on the compute stream, the unpack hook copies
    /// it back when backward needs it; nothing overlaps.
    Synchronous,
    /// Megatron-Core's fine-grained activation offloading (`--fine-grained-activation-
    /// offloading --offload-modules ...`, megatron/core/pipeline_parallel/
    /// fine_grained_activation_offload.py): one group per listed module of each layer, its
    /// saved tensors copied to the host when the module's forward commits and reloaded for
    /// its backward; pipelines and selective recomputation allowed.
    FineGrained,
}

/// The modules Megatron's `--offload-modules` names, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct OffloadModules(pub u8);

impl OffloadModules {
    pub const ATTN_NORM: u8 = 1;
    pub const QKV_LINEAR: u8 = 2;
    pub const CORE_ATTN: u8 = 4;
    pub const ATTN_PROJ: u8 = 8;
    pub const MLP_NORM: u8 = 16;
    pub const EXPERT_FC1: u8 = 32;
    pub const MOE_ACT: u8 = 64;
    /// Megatron's names, in a layer's forward order: each module offloads the tensors saved
    /// inside it (its input among them; `TransformerConfig.offload_modules`).
    pub const ALL: [(&'static str, u8); 7] = [
        ("attn_norm", Self::ATTN_NORM),
        ("qkv_linear", Self::QKV_LINEAR),
        ("core_attn", Self::CORE_ATTN),
        ("attn_proj", Self::ATTN_PROJ),
        ("mlp_norm", Self::MLP_NORM),
        ("expert_fc1", Self::EXPERT_FC1),
        ("moe_act", Self::MOE_ACT),
    ];
    /// Megatron's `--min-offloaded-tensor-size` default, elements (arguments.py).
    pub const MIN_ELEMENTS: u64 = 1 << 20;

    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    /// Megatron's name of one module bit.
    pub fn name(bit: u8) -> &'static str {
        Self::ALL.iter().find(|(_, b)| *b == bit).map_or("", |(n, _)| *n)
    }

    /// The names set, in forward order.
    pub fn names(self) -> Vec<&'static str> {
        Self::ALL.iter().filter(|(_, b)| self.has(*b)).map(|(n, _)| *n).collect()
    }
}

impl ActivationOffloadMethod {
    /// The most blocks that can offload (the default): Transformer Engine's handler needs
    /// fewer groups than layers (Megatron checks `cpu_offloading_num_layers < num_layers`);
    /// PyTorch's wrapper can take every block.
    pub fn most_blocks(self, n_layers: u64) -> u64 {
        match self {
            ActivationOffloadMethod::Overlapped => n_layers.saturating_sub(1),
            ActivationOffloadMethod::Synchronous | ActivationOffloadMethod::FineGrained => n_layers,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ActivationOffloadMethod::Overlapped => "overlapped",
            ActivationOffloadMethod::Synchronous => "synchronous",
            ActivationOffloadMethod::FineGrained => "fine-grained",
        }
    }
}

/// Which blocks a full checkpointing policy wraps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointBlocks {
    /// Every block (torchtitan `mode = "full"`, Megatron `--recompute-method uniform
    /// --recompute-num-layers 1`).
    #[default]
    All,
    /// Every n-th block, counting from the first as 1 (torchtitan `mode = "selective"` with
    /// `selective_ac_option = "n"`: blocks whose 1-based count is a multiple of n).
    EveryNth(u64),
    /// The first n blocks of each model chunk (Megatron `--recompute-method block
    /// --recompute-num-layers n`).
    FirstPerChunk(u64),
}

/// The precision policy: dtype of each piece of model state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Precision {
    pub preset: String,
    /// Persistent (possibly sharded) parameter storage.
    pub param: Dtype,
    /// Dtype kernels compute in: activations and gathered weight copies.
    pub compute: Dtype,
    /// Gradients as accumulated and reduced.
    pub grad: Dtype,
    /// A separate master copy the optimizer updates (None: the parameters are the master).
    pub master: Option<Dtype>,
    pub optimizer_state: Dtype,
    /// Megatron's precision-aware optimizer: how Transformer Engine's FusedAdam stores the
    /// master and the moments (their bytes replace `master`'s and `optimizer_state`'s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aware: Option<PrecisionAware>,
}

impl Precision {
    /// Whether autocast casts the parameters for each matmul (and a LoRA adapter's input with
    /// them, [`crate::model::LoraConfig::input_casts`]): parameters held whole in a dtype other
    /// than the compute dtype. Sharded parameters are gathered in the compute dtype already.
    pub fn autocast_casts(&self, params_sharded: bool) -> bool {
        !params_sharded && self.param != self.compute
    }

    /// Named presets; the doc of each says which framework configuration it mirrors.
    pub fn preset(name: &str) -> Option<Precision> {
        use Dtype::*;
        let p = |param, compute, grad, master, os| Precision {
            preset: name.to_string(),
            param,
            compute,
            grad,
            master,
            optimizer_state: os,
            aware: None,
        };
        Some(match name {
            // Megatron / DeepSpeed bf16: BF16 weights 2 + FP32 master 4 + BF16 grads 2 +
            // FP32 Adam moments 8 = 16 B/param (ZeRO paper's K = 12).
            "bf16-mixed-adam" => p(Bf16, Bf16, Bf16, Some(Fp32), Fp32),
            // The same with FP32 gradient accumulation (Megatron `--accumulate-allreduce-
            // grads-in-fp32`, DeepSpeed `data_types.grad_accum_dtype=fp32`): 18 B/param.
            "bf16-mixed-adam-fp32-grads" => p(Bf16, Bf16, Fp32, Some(Fp32), Fp32),
            // PyTorch FSDP `MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)`: FP32
            // sharded parameters are the master copy, BF16 copies exist only while
            // gathered, FP32 sharded gradients: 4 + 4 + 8 = 16 B/param at rest.
            "fsdp-bf16-mixed" => p(Fp32, Bf16, Fp32, None, Fp32),
            // Everything FP32: 4 + 4 + 8 = 16 B/param, FP32 activations.
            "fp32" => p(Fp32, Fp32, Fp32, None, Fp32),
            // Pure BF16 weights, grads and states (no master): 2 + 2 + 4 = 8 B/param.
            "bf16" => p(Bf16, Bf16, Bf16, None, Bf16),
            _ => return None,
        })
    }
    /// "master M, optimizer state S" for the report and `check`: the precision-aware
    /// optimizer's storage where it is on.
    pub fn state_words(&self, states: u64, no_master: &str) -> String {
        match self.aware {
            Some(pa) => format!(
                "master {}, optimizer state exp_avg {} + exp_avg_sq {} (FusedAdam)",
                if pa.remainders(self.param) {
                    "fp32 as int16 remainders".to_string()
                } else {
                    pa.main_params.name().to_string()
                },
                pa.exp_avg.name(),
                pa.exp_avg_sq.name()
            ),
            None => format!(
                "master {}, optimizer state {} x {}",
                self.master.map_or(no_master, |m| m.name()),
                states,
                self.optimizer_state.name()
            ),
        }
    }

    /// Bytes per (sharded) element of the separate master copy (0 without one).
    pub fn master_bytes(&self) -> u64 {
        match (self.aware, self.master) {
            (Some(pa), Some(_)) => pa.master_bytes(self.param),
            (_, m) => m.map_or(0, |m| m.bytes()),
        }
    }

    /// Bytes per (sharded) element of an optimizer with `states` state tensors per parameter.
    pub fn state_bytes(&self, states: u64) -> u64 {
        match self.aware {
            Some(pa) if states == 2 => pa.state_bytes(),
            _ => states * self.optimizer_state.bytes(),
        }
    }

    /// Bytes per parameter of each part of the model state under the policy, before any
    /// sharding: (parameters, gradients, master weights, optimizer state) with `states`
    /// optimizer state tensors per parameter. Their sum is the policy's bytes per parameter
    /// (16 for mixed-precision Adam).
    pub fn bytes_per_param_by_part(&self, states: u64) -> [u64; 4] {
        [self.param.bytes(), self.grad.bytes(), self.master_bytes(), self.state_bytes(states)]
    }

    pub fn preset_names() -> &'static [&'static str] {
        &["bf16-mixed-adam", "bf16-mixed-adam-fp32-grads", "fsdp-bf16-mixed", "fp32", "bf16"]
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingConfig {
    pub micro_batch: u64,
    pub seq_len: u64,
    pub grad_accum: u64,
    pub steps: u32,
    pub optimizer: OptimizerKind,
    /// SGD momentum buffer on/off (Adam always has two moments).
    pub momentum: bool,
    pub optimizer_impl: OptimizerImpl,
    pub precision: Precision,
    pub checkpointing: Checkpointing,
    /// Under full checkpointing, which blocks are checkpoint regions.
    #[serde(skip_serializing_if = "is_all_blocks")]
    pub checkpoint_blocks: CheckpointBlocks,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation_offload: Option<ActivationOffload>,
    /// Under selective checkpointing, what is recomputed (Megatron `--recompute-modules`;
    /// the attention core alone by default).
    #[serde(skip_serializing_if = "is_core_attn_only")]
    pub recompute_modules: Vec<RecomputeModule>,
    /// Gradient-norm clipping before the step (Megatron-LM `--clip-grad 1.0`, torchtitan
    /// `max_norm = 1.0` and the HF Trainer's `max_grad_norm = 1.0` are on by default).
    pub clip_grad_norm: bool,
    /// Bytes of one cuBLAS workspace (`[allocator] cublas_workspace`, or the GPU's PyTorch
    /// default [`crate::hardware::GpuSpec::blas_workspace_bytes`]). A training step holds
    /// two: PyTorch keys workspaces by (cuBLAS handle, stream) and hands each thread its own
    /// handle (`getCurrentCUDABlasHandle`, a thread-local pool window), and the backward's
    /// matmuls run on autograd's device thread, the forward's on the main thread.
    pub blas_workspace: u64,
    #[serde(skip_serializing_if = "is_zero")]
    /// Transformer Engine's cuBLAS workspace under Megatron-Core (0 elsewhere,
    /// [`crate::hardware::GpuSpec::te_workspace_bytes`]): one at its first GEMM, four more at
    /// its first grouped GEMM (the experts'), kept for the process.
    pub te_workspace: u64,
    /// The PyTorch release (major, minor) whose optimizer code applies: before 2.1 the
    /// foreach Adam / AdamW step kept two intermediates (`torch._foreach_sqrt` and an
    /// out-of-place `torch._foreach_add` for the denominator), from 2.1 one (pytorch#104780,
    /// "[foreach][Adam] Minimize use of intermediates to decrease peak memory").
    pub torch_version: (u16, u16),
}

impl TrainingConfig {
    /// Optimizer state tensors per parameter.
    pub fn states_per_param(&self) -> u64 {
        match self.optimizer {
            OptimizerKind::Adam | OptimizerKind::AdamW => 2,
            OptimizerKind::Sgd => u64::from(self.momentum),
        }
    }

    /// HBM bytes the optimizer step moves per local element: it is memory-bound, so its time
    /// is these bytes over the HBM bandwidth. The passes, as the frameworks run them:
    /// - 16-bit gradients under an FP32 master are first cast up (Megatron-LM's
    ///   `_copy_model_grads_to_main_grads`, DeepSpeed's FP32 gradient partition): read the
    ///   gradient, write it in the master's dtype;
    /// - clipping reads every gradient for the norm (`torch._foreach_norm`, Megatron's
    ///   `multi_tensor_l2norm`) and scales it in place (`torch.nn.utils.clip_grad_norm_`
    ///   always multiplies by the clamped coefficient; Megatron's DDP divides the gradient
    ///   buffer by the data-parallel size, the same read and write);
    /// - the update reads the master (or the parameter), the gradient and every state and
    ///   writes the master and the states (fused / foreach Adam alike);
    /// - a separate master is copied into the 16-bit parameters (read it, write them).
    pub fn optimizer_step_bytes(&self) -> u64 {
        self.optimizer_step_passes().iter().map(|p| p.1).sum()
    }

    /// The passes of [`TrainingConfig::optimizer_step_bytes`] with their bytes per element,
    /// named for the report.
    pub fn optimizer_step_passes(&self) -> Vec<(&'static str, u64)> {
        self.step_passes(false)
    }

    /// The step's passes; `grads_in_master`: a wrapper has already made the gradients in the
    /// master's dtype (DeepSpeed's flattened FP32 partition), so there is no cast-up pass.
    pub fn step_passes(&self, grads_in_master: bool) -> Vec<(&'static str, u64)> {
        let pr = &self.precision;
        if let Some(pa) = pr.aware {
            return self.precision_aware_step_passes(&pa);
        }
        let master = pr.master.unwrap_or(pr.param).bytes();
        let g = pr.grad.bytes();
        let mut passes = Vec::new();
        // The optimizer reads gradients in the master's dtype when there is a master.
        let grad = if pr.master.is_some() && g < master && grads_in_master {
            master
        } else if pr.master.is_some() && g < master {
            passes.push(("gradients cast up to the master dtype", g + master));
            master
        } else {
            g
        };
        if self.clip_grad_norm {
            passes.push(("gradient-norm clipping (norm, then scale in place)", 3 * grad));
        }
        let states = 2 * self.states_per_param() * pr.optimizer_state.bytes();
        passes.push(("update (read weights, gradient, states; write weights, states)", 2 * master + grad + states));
        if pr.master.is_some() {
            passes.push(("master copied into the parameters", master + pr.param.bytes()));
        }
        passes
    }

    /// The step under Megatron's precision-aware optimizer: FusedAdam reads the gradients in
    /// their own dtype (`decoupled_grad`, no cast), unscales each non-FP32 state to FP32 before
    /// its one kernel and writes it back after, and the kernel updates the master (or the
    /// BF16 parameter with its int16 remainder) and writes the 16-bit parameter itself.
    fn precision_aware_step_passes(&self, pa: &PrecisionAware) -> Vec<(&'static str, u64)> {
        let pr = &self.precision;
        let g = pr.grad.bytes();
        let mut passes = Vec::new();
        if self.clip_grad_norm {
            passes.push(("gradient-norm clipping (norm, then scale in place)", 3 * g));
        }
        let scaled = pa.scaled_states();
        let (unscale, rescale) =
            scaled.iter().map(|s| s.unscale_rescale_bytes()).fold((0, 0), |(a, b), (u, r)| (a + u, b + r));
        if unscale > 0 {
            passes.push(("non-FP32 states unscaled to FP32 copies (FusedAdam get_unscaled_state)", unscale));
        }
        // The kernel reads and writes each moment (FP32 copies where unscaled) and the master;
        // with remainders it reads and writes the BF16 parameter and its int16 remainder, else
        // it reads and writes the master (FP32, or its FP32 copy) and writes the parameter.
        let moments: u64 = [pa.exp_avg, pa.exp_avg_sq].iter().map(|s| 2 * s.bytes().max(4)).sum();
        let master = if pa.remainders(pr.param) { 2 * (pr.param.bytes() + 2) } else { 2 * 4 + pr.param.bytes() };
        passes.push(("update (FusedAdam: gradient, moments, master and parameter)", g + moments + master));
        if rescale > 0 {
            passes.push(("states written back from their FP32 copies (FusedAdam _apply_scale)", rescale));
        }
        passes
    }
}

/// An FSDP unit (wrap = "block": one per transformer block, plus the root for the rest).
#[derive(Debug, Clone, Serialize)]
pub struct Unit {
    pub name: String,
    /// Regions whose ops belong to this unit.
    pub regions: Vec<Region>,
    /// Parameter elements of the unit.
    pub params: u64,
    /// Elements this rank holds when sharded (padded so every rank holds the same size,
    /// as FSDP's flat parameters are).
    pub shard_params: u64,
    /// LoRA: bytes of the frozen base weights as stored (BF16 or NF4), whole and per shard.
    pub frozen_bytes: u64,
    pub frozen_shard_bytes: u64,
    /// Of `params`, the frozen base's elements in a FlatParameter shared with LoRA's
    /// adapters ([`crate::model::Op::flat_frozen`]): gradients, no optimizer state.
    #[serde(skip_serializing_if = "is_zero")]
    pub flat_frozen: u64,
    /// Of `params`, this rank's routed experts' weights (its 1/expert_tensor slice of its
    /// experts): replicated over the expert-data-parallel group, so their optimizer shard
    /// is 1/[`Plan::edp`] of them.
    pub expert_params: u64,
    /// Of `params`, those FSDP all-gathers in FP8 (torchao `enable_fsdp_float8_all_gather`:
    /// the float8 linears' weights, cast on the shard before the all-gather): 1 byte each
    /// in the gathered buffer and on the wire.
    pub fp8_gathered: u64,
}

/// Per unit of a DAG (the root, then each block), the sums [`Plan::new`] builds its units
/// from: parameter elements, frozen bytes, frozen elements in a shared FlatParameter,
/// routed-expert elements and elements FSDP gathers in FP8. One pass over every op,
/// computed once per DAG on a thread ([`crate::recent::recall`]): a sweep's configurations
/// share the DAG and differ in what splits these sums.
#[derive(Debug)]
struct UnitSums {
    per_unit: Vec<u64>,
    frozen: Vec<u64>,
    flat_frozen: Vec<u64>,
    expert: Vec<u64>,
    fp8_gathered: Vec<u64>,
}

impl UnitSums {
    fn of(dag: &LayerDag) -> std::sync::Arc<UnitSums> {
        thread_local! {
            static SUMS: std::cell::RefCell<Vec<(u64, std::sync::Arc<UnitSums>)>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SUMS.with(|c| {
            let make = || (dag.id, std::sync::Arc::new(UnitSums::sum(dag)));
            // Room for every DAG a sweep keeps on the thread (`sweep::summary`'s 32).
            crate::recent::recall(&mut c.borrow_mut(), 32, |&k| k == dag.id, make)
        })
    }

    fn sum(dag: &LayerDag) -> UnitSums {
        // (A multi-token prediction module is a block after the model's, with its own unit.)
        let n = dag.blocks() as usize + 1;
        let mut s = UnitSums {
            per_unit: vec![0; n],
            frozen: vec![0; n],
            flat_frozen: vec![0; n],
            expert: vec![0; n],
            fp8_gathered: vec![0; n],
        };
        let fp8_all_gather = dag.workload.fp8.is_some_and(|f| f.fsdp_all_gather);
        for op in &dag.ops {
            let u = match op.region {
                Region::Embed | Region::Head => 0,
                Region::Block(l) => l as usize + 1,
            };
            s.per_unit[u] += op.params;
            s.frozen[u] += op.frozen_bytes;
            s.flat_frozen[u] += op.flat_frozen;
            if op.expert {
                s.expert[u] += op.params;
            }
            if fp8_all_gather && op.fp8.is_some() {
                s.fp8_gathered[u] += op.params;
            }
        }
        s
    }
}

/// A contiguous run of the model on one pipeline stage: a model chunk (virtual stage).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Chunk {
    /// Virtual stage index in model order (chunk c of stage k is c x pipeline + k).
    pub virtual_stage: u64,
    pub first_block: u64,
    /// One past the last block.
    pub end_block: u64,
    pub embed: bool,
    pub head: bool,
    /// Multi-token prediction modules after `end_block` (blocks `end_block..end_block +
    /// mtp`), on the chunk holding the head.
    #[serde(skip_serializing_if = "is_zero")]
    pub mtp: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl Chunk {
    pub fn holds(&self, r: Region) -> bool {
        match r {
            Region::Embed => self.embed,
            Region::Head => self.head,
            Region::Block(l) => (self.first_block..self.end_block + self.mtp).contains(&l),
        }
    }
}

/// Who holds what: the plan every allocation of model state is sized from. With pipeline
/// parallelism, [`Plan::stage`] gives each stage's own plan (its units, its model state).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub parallel: ParallelConfig,
    pub training: TrainingConfig,
    pub gpus: u64,
    pub gpus_per_node: u64,
    /// The group gradients are reduced over: gpus / (tensor x pipeline), the data-parallel
    /// replicas times the context-parallel ranks of each.
    pub dp: u64,
    /// Data-parallel ranks that share a node (Megatron's rank order: tensor-parallel ranks
    /// adjacent, then data-parallel, then pipeline).
    pub dp_per_node: u64,
    /// The pipeline stage this plan describes (0 without pipelining).
    pub stage: u64,
    /// The stage's model chunks, in the order they run forward.
    pub chunks: Vec<Chunk>,
    /// Unit index of each transformer block this stage holds (`usize::MAX`: elsewhere).
    pub block_unit: Vec<usize>,
    /// Ranks a sharded tensor is split over (all GPUs, or one node for hybrid sharding).
    pub shard_group: u64,
    /// Expert-data-parallel degree: the ranks that hold the same expert slices, over which
    /// expert gradients are reduced and (ZeRO-1) their optimizer state is sharded: tensor x
    /// context x data / (expert tensor x expert) (Megatron-Core's parallel folding, the
    /// `expert_data_parallel` group; [`ModelParallel::expert_data_parallel`]).
    pub edp: u64,
    /// Ranks a routed expert's state is split over: [`Plan::shard_group`] without expert,
    /// expert-tensor or tensor parallelism, else [`Plan::edp`] (1 without sharding). Under
    /// torchtitan's FSDP2 with expert parallelism it is the `efsdp` mesh
    /// (`torchtitan/distributed/parallel_dims.py` `build_mesh`: `efsdp = dp_shard * cp * tp
    /// // ep`, the sparse mesh `["pp", "dp_replicate", "efsdp", "ep"]`), over which
    /// `torchtitan/distributed/fsdp.py` `apply_fsdp_to_decoder` shards the routed experts
    /// (`shard_placement_fn` returning the `edp_mesh` for them, `dp_mesh` for the rest of the
    /// block).
    #[serde(skip)]
    pub expert_shard_group: u64,
    /// Root unit first, then one unit per block.
    pub units: Vec<Unit>,
    pub params_sharded: bool,
    pub grads_sharded: bool,
    pub optimizer_sharded: bool,
    /// Gathered parameters are freed after each unit's forward.
    pub reshard_after_forward: bool,
}

/// Bytes of model state one GPU holds at rest, by part, for the report and the ZeRO checks.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ModelState {
    pub parameters: u64,
    pub master_weights: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
}

impl ModelState {
    pub fn total(&self) -> u64 {
        self.parameters + self.master_weights + self.gradients + self.optimizer_state
    }
}

/// torchtitan's efsdp mesh under FSDP2 with expert parallelism: the ranks a routed expert's
/// state is sharded over. The sparse mesh unflattens each replica's dp_shard x cp x tp ranks
/// into efsdp x ep (`parallel_dims.py` `build_mesh`), so it is the stage's ranks over ep, or
/// under HYBRID_SHARD (no tensor parallelism there) one replica's shard group over ep: its
/// dp_shard x cp ranks, the context ranks inside it as in the dense job.
pub fn efsdp(p: &ParallelConfig, gpus: u64, gpus_per_node: u64) -> u64 {
    let mp = &p.model_parallel;
    if p.sharding == Sharding::HybridShard {
        (shard_group(p, gpus, gpus_per_node) / mp.expert.max(1)).max(1)
    } else {
        mp.expert_data_parallel(gpus)
    }
}

/// The ranks a sharded piece of state is split over: all data-parallel (and context-
/// parallel) ranks, a node's under HYBRID_SHARD, none without sharding.
pub fn shard_group(p: &ParallelConfig, gpus: u64, gpus_per_node: u64) -> u64 {
    let mp = &p.model_parallel;
    match p.sharding {
        Sharding::None => 1,
        Sharding::HybridShard => p.hsdp_shard.unwrap_or(gpus_per_node.min(gpus)),
        _ => mp.data_parallel(gpus) * mp.context.max(1) * mp.stage_copies(),
    }
}

impl Plan {
    pub fn new(
        dag: &LayerDag,
        parallel: ParallelConfig,
        training: TrainingConfig,
        gpus: u64,
        gpus_per_node: u64,
    ) -> Plan {
        let sh = parallel.sharding;
        // DeepSpeedZeroOptimizer steps a flat FP32 copy of the rank's partition even when the
        // parameters are FP32 (`single_partition_of_fp32_groups = partition.clone().float()`,
        // stage_1_and_2.py) and copies it back after the step: a master of their dtype.
        let mut training = training;
        let pr = &mut training.precision;
        if parallel.framework == Framework::Deepspeed
            && matches!(sh, Sharding::Zero1 | Sharding::Zero2)
            && parallel.offload.is_none()
            && pr.master.is_none()
            && pr.param == Dtype::Fp32
        {
            pr.master = Some(Dtype::Fp32);
        }
        let mp = &parallel.model_parallel;
        // Context-parallel ranks hold the same parameters: they reduce gradients (and shard a
        // distributed optimizer) with the data-parallel ones.
        let dp = mp.data_parallel(gpus) * mp.context.max(1);
        let dp_per_node = (gpus_per_node / mp.tensor).clamp(1, dp);
        let shard_group = shard_group(&parallel, gpus, gpus_per_node);
        let ep = mp.expert.max(1);
        // DualPipe's two copies of a stage reduce their gradients together.
        // torchtitan's efsdp mesh (inside each replica's shard group under HSDP, whose
        // replicas all-reduce its shards as they do the rest).
        let edp = if parallel.fsdp_expert_split() {
            efsdp(&parallel, gpus, gpus_per_node)
        } else {
            mp.expert_data_parallel(gpus) * mp.stage_copies()
        };
        // Expert state is split over the expert-data-parallel group where other state is
        // split over the shard group; they are one group without expert, expert-tensor or
        // tensor parallelism (validation allows those with ZeRO-1 and DDP, and with
        // torchtitan's FSDP2 full_shard over expert parallelism, whose efsdp mesh is `edp`).
        let expert_shard_group = match sh {
            Sharding::None => 1,
            _ if ep == 1 && mp.tensor == 1 && mp.expert_tensor <= 1 => shard_group,
            _ => edp,
        };
        let shard = |params: u64, expert: u64| {
            Plan::dense_shard(params, expert, shard_group) + Plan::expert_shard(expert, expert_shard_group)
        };
        // FSDP1's NO_SHARD runs FSDP's machinery over a shard group of one rank: each unit's
        // low-precision copy stands where the gathered parameters are, its flat gradient is
        // all-reduced instead of reduce-scattered ([`Framework::fsdp1_no_shard`]).
        let no_shard = parallel.framework.fsdp1_no_shard(sh);
        let params_sharded = parallel.params_sharded();
        let grads_sharded = matches!(sh, Sharding::Zero2 | Sharding::Zero3 | Sharding::HybridShard) || no_shard;
        let optimizer_sharded = sh != Sharding::None;
        // SHARD_GRAD_OP keeps the gathered parameters from forward to backward.
        let reshard_after_forward = params_sharded && sh != Sharding::Zero2 && parallel.reshard_after_forward;
        let mut units = Vec::new();
        let root = [Region::Embed, Region::Head];
        let sums = UnitSums::of(dag);
        let UnitSums { per_unit, frozen, flat_frozen, expert, fp8_gathered } = &*sums;
        let rp = per_unit[0];
        units.push(Unit {
            name: "root (embeddings, final norm, head)".into(),
            regions: root.to_vec(),
            params: rp,
            shard_params: shard(rp, expert[0]),
            frozen_bytes: frozen[0],
            frozen_shard_bytes: frozen[0].div_ceil(shard_group),
            flat_frozen: flat_frozen[0],
            expert_params: expert[0],
            fp8_gathered: fp8_gathered[0],
        });
        let n_layers = dag.config.n_layers;
        for l in 0..dag.blocks() {
            let p = per_unit[l as usize + 1];
            let f = frozen[l as usize + 1];
            units.push(Unit {
                name: if l < n_layers { format!("layers.{l}") } else { format!("mtp.{}", l - n_layers) },
                regions: vec![Region::Block(l)],
                params: p,
                shard_params: shard(p, expert[l as usize + 1]),
                frozen_bytes: f,
                frozen_shard_bytes: f.div_ceil(shard_group),
                flat_frozen: flat_frozen[l as usize + 1],
                expert_params: expert[l as usize + 1],
                fp8_gathered: fp8_gathered[l as usize + 1],
            });
        }
        let mtp = dag.config.mtp_layers();
        let chunks =
            vec![Chunk { virtual_stage: 0, first_block: 0, end_block: n_layers, embed: true, head: true, mtp }];
        Plan {
            parallel,
            training,
            gpus,
            gpus_per_node,
            dp,
            dp_per_node,
            stage: 0,
            chunks,
            block_unit: (1..=dag.blocks() as usize).collect(),
            shard_group,
            edp,
            expert_shard_group,
            units,
            params_sharded,
            grads_sharded,
            optimizer_sharded,
            reshard_after_forward,
        }
    }

    /// A unit's non-expert elements one rank holds: `params - expert` split over `group`.
    fn dense_shard(params: u64, expert: u64, group: u64) -> u64 {
        (params - expert).div_ceil(group)
    }

    /// A unit's routed-expert elements one rank holds: `expert` split over `group`.
    fn expert_shard(expert: u64, group: u64) -> u64 {
        expert.div_ceil(group)
    }

    /// Unit `u`'s parameter shard under torchtitan's FSDP2 with expert parallelism
    /// ([`ParallelConfig::fsdp_expert_split`]), as (non-expert elements of the `fsdp` mesh's
    /// shard, routed-expert elements of the `efsdp` mesh's shard); `None` otherwise, or for a
    /// unit without routed experts (one all-gather over the shard group).
    pub fn expert_split(&self, u: usize) -> Option<(u64, u64)> {
        let un = &self.units[u];
        if !self.parallel.fsdp_expert_split() || un.expert_params == 0 {
            return None;
        }
        Some((
            Plan::dense_shard(un.params, un.expert_params, self.shard_group),
            Plan::expert_shard(un.expert_params, self.expert_shard_group),
        ))
    }

    /// Unit index holding a region's ops.
    pub fn unit_of(&self, r: Region) -> usize {
        match r {
            Region::Embed | Region::Head => 0,
            Region::Block(l) => self.block_unit[l as usize],
        }
    }

    pub fn pipeline(&self) -> u64 {
        self.parallel.model_parallel.pipeline
    }

    /// The model chunks of every pipeline stage: virtual stage j (model order) is chunk
    /// j / p of stage j % p.
    /// The last holds the `mtp` multi-token prediction modules (Megatron-Core places them on
    /// the last pipeline stage, its last virtual stage: `mtp_on_this_rank`).
    pub fn stage_chunks(&self, n_layers: u64, mtp: u64) -> Vec<Vec<Chunk>> {
        let mp = &self.parallel.model_parallel;
        let (p, v) = (mp.pipeline, mp.virtual_stages);
        let sizes = mp.virtual_stage_layers(n_layers);
        let mut out = vec![Vec::new(); p as usize];
        if mp.schedule.is_dualpipe() {
            // Rank k holds two chunks: under DualPipe model stage k of the forward direction
            // (virtual stage k) and stage p - 1 - k of the reverse (virtual stage 2p - 1 - k);
            // under DualPipeV virtual stages k (down the V) and 2p - 1 - k (back up).
            let starts: Vec<u64> = sizes.iter().scan(0, |a, &n| Some(std::mem::replace(a, *a + n))).collect();
            let last = sizes.len() as u64 - 1;
            let chunk = |s: u64, vs: u64| Chunk {
                virtual_stage: vs,
                first_block: starts[s as usize],
                end_block: starts[s as usize] + sizes[s as usize],
                embed: s == 0,
                head: s == last,
                mtp: if s == last { mtp } else { 0 },
            };
            for k in 0..p {
                let back = 2 * p - 1 - k;
                let second = if mp.schedule == PipelineSchedule::DualPipe { p - 1 - k } else { back };
                out[k as usize] = vec![chunk(k, k), chunk(second, back)];
            }
            return out;
        }
        let mut first = 0;
        for (j, &n) in sizes.iter().enumerate() {
            let j = j as u64;
            out[(j % p) as usize].push(Chunk {
                virtual_stage: j,
                first_block: first,
                end_block: first + n,
                embed: j == 0,
                head: j + 1 == p * v,
                mtp: if j + 1 == p * v { mtp } else { 0 },
            });
            first += n;
        }
        out
    }

    /// Stage `k`'s plan: its chunks, its units (a root unit for the embedding and/or the head,
    /// if it holds them, then its blocks) and so its model state. The last stage of a
    /// pipeline with tied embeddings keeps its own copy of the word embeddings for the LM
    /// head, as Megatron-LM does (their gradients are all-reduced with the first stage's).
    pub fn stage(&self, dag: &LayerDag, k: u64) -> Plan {
        let chunks = self.stage_chunks(dag.config.n_layers, dag.config.mtp_layers()).swap_remove(k as usize);
        let mut root = 0u64;
        for op in &dag.ops {
            let on = chunks.iter().any(|c| c.holds(op.region));
            if on && matches!(op.region, Region::Embed | Region::Head) {
                root += op.params;
            }
        }
        // A rank holding the head and not the embedding keeps its own copy (DualPipe's end
        // ranks hold both and share one).
        if self.pipeline() > 1 && chunks.iter().any(|c| c.head) && !chunks.iter().any(|c| c.embed) {
            root += dag.embedding_copy_params();
        }
        let mut units = vec![Unit {
            name: self.units[0].name.clone(),
            regions: [Region::Embed, Region::Head].into_iter().filter(|r| chunks.iter().any(|c| c.holds(*r))).collect(),
            params: root,
            shard_params: root.div_ceil(self.shard_group),
            // Pipelining is not combined with LoRA (validation refuses it).
            frozen_bytes: 0,
            frozen_shard_bytes: 0,
            flat_frozen: 0,
            expert_params: 0,
            // The LM head stays in 16 bits.
            fp8_gathered: 0,
        }];
        let mut block_unit = vec![usize::MAX; dag.blocks() as usize];
        for c in &chunks {
            for l in c.first_block..c.end_block + c.mtp {
                block_unit[l as usize] = units.len();
                units.push(self.units[l as usize + 1].clone());
            }
        }
        Plan { stage: k, chunks, block_unit, units, ..self.clone() }
    }

    /// Elements of a unit this rank holds for a piece of state that is sharded or not.
    pub fn local(&self, unit: usize, sharded: bool) -> u64 {
        let u = &self.units[unit];
        if sharded {
            u.shard_params
        } else {
            u.params
        }
    }

    /// Elements of a unit this rank keeps optimizer state (and a master) for: [`Self::local`]
    /// less the frozen base in a FlatParameter shared with LoRA's adapters, which the
    /// optimizer never receives ([`Unit::flat_frozen`]; sharded, its share of this rank's
    /// shard).
    pub fn optimized(&self, unit: usize, sharded: bool) -> u64 {
        let u = &self.units[unit];
        let frozen = if sharded { u.flat_frozen / self.shard_group } else { u.flat_frozen };
        self.local(unit, sharded).saturating_sub(frozen)
    }

    /// [`Self::optimized`] over all units.
    pub fn optimized_total(&self, sharded: bool) -> u64 {
        (0..self.units.len()).map(|i| self.optimized(i, sharded)).sum()
    }

    /// Offload: where this rank's offloaded bytes live; zero without offload.
    pub fn offloaded_bytes(&self) -> OffloadedBytes {
        let mut out = OffloadedBytes::default();
        for p in self.offloaded_parts() {
            match p.on {
                OffloadDevice::Cpu => out.host += p.bytes,
                OffloadDevice::Nvme => out.nvme += p.bytes,
            }
        }
        out
    }

    /// Offload: this rank's offloaded state piece by piece, each where it lives; the host
    /// pieces are pinned when the engine initialises and held for the whole run.
    ///
    /// Optimizer partition: the FP32 master (DeepSpeed; FSDP's FP32 shard is the parameter
    /// itself) and the optimizer state, on the host or NVMe (then with pinned swap buffers
    /// on the host); the FP32 gradient partition on the host. Parameters: DeepSpeed's 16-bit
    /// partition on the host or NVMe (with pinned swap buffers on the host); FSDP's shard in
    /// the parameter dtype on the host.
    pub fn offloaded_parts(&self) -> Vec<OffloadedPart> {
        use crate::memory::Category;
        let Some(off) = &self.parallel.offload else { return Vec::new() };
        let pr = &self.training.precision;
        let el = self.local_total(self.optimizer_sharded);
        let pel = self.local_total(self.params_sharded);
        let part = |what, category, on, bytes| OffloadedPart { what, category, on, bytes };
        let fsdp = self.parallel.framework.offloads_master_parameters();
        let grads = el * OffloadConfig::GRAD_BYTES_PER_PARAM;
        let mut out = vec![part("FP32 gradient partition", Category::Gradients, OffloadDevice::Cpu, grads)];
        if fsdp {
            out.push(part(
                "sharded parameters (the master copy)",
                Category::Parameters,
                OffloadDevice::Cpu,
                pel * pr.param.bytes(),
            ));
        } else if let Some(m) = pr.master {
            out.push(part("FP32 master partition", Category::MasterWeights, off.optimizer, el * m.bytes()));
        }
        let state = el * self.training.states_per_param() * pr.optimizer_state.bytes();
        if state > 0 {
            out.push(part("optimizer state", Category::OptimizerState, off.optimizer, state));
        }
        if off.optimizer == OffloadDevice::Nvme {
            let bytes = OffloadConfig::OPTIMIZER_SWAP_BUFFERS * el.min(OffloadConfig::SUB_GROUP_ELEMENTS) * 4;
            out.push(part("NVMe optimizer swap buffers", Category::CommBuffers, OffloadDevice::Cpu, bytes));
        }
        match (fsdp, off.parameters) {
            (true, _) | (false, None) => {}
            (false, Some(dev)) => {
                out.push(part("16-bit parameter partition", Category::Parameters, dev, pel * pr.param.bytes()));
                if dev == OffloadDevice::Nvme {
                    let bytes = OffloadConfig::PARAM_SWAP_BUFFER_ELEMENTS.min(pel) * pr.param.bytes();
                    out.push(part("NVMe parameter swap buffers", Category::CommBuffers, OffloadDevice::Cpu, bytes));
                }
            }
        }
        out
    }

    /// Offload: whether a node (`gpus_per_node` ranks) can hold every rank's offloaded state,
    /// in host memory and on NVMe; (true, true) without offload. A node that cannot fails
    /// when the engine pins or creates the state at initialisation.
    pub fn offload_fits(&self, gpus_per_node: u64) -> (bool, bool) {
        let Some(off) = &self.parallel.offload else { return (true, true) };
        let b = self.offloaded_bytes();
        (b.host * gpus_per_node <= off.cpu_memory_bytes, b.nvme * gpus_per_node <= off.nvme_capacity_bytes)
    }

    /// The optimizer partition the CPU step reads and writes, bytes: master plus optimizer
    /// state (what NVMe optimizer offload swaps in and out every step).
    pub fn optimizer_partition_bytes(&self) -> u64 {
        let pr = &self.training.precision;
        let per_param =
            pr.master.map_or(0, |m| m.bytes()) + self.training.states_per_param() * pr.optimizer_state.bytes();
        self.local_total(self.optimizer_sharded) * per_param
    }

    /// Whether unsharded gradients accumulate over the step's micro-batches and are reduced
    /// once (a pipeline stage; FSDP's `no_sync`), rather than reduced after every
    /// micro-batch's backward.
    pub fn accumulates_unsharded(&self) -> bool {
        self.pipeline() > 1 || self.parallel.no_sync
    }

    /// FSDP1's own gradient path: every micro-batch's post-backward reduces its flat gradient,
    /// or under `no_sync()` the flat gradients accumulate in `param_dtype` until the last
    /// micro-batch's reduces them ([`Framework::fsdp1_buffers`]). A pipeline stage keeps the
    /// generic path.
    pub fn fsdp1_grads(&self) -> bool {
        self.parallel.framework.fsdp1_buffers() && self.pipeline() == 1
    }

    /// The dtype autograd computes a sharded-state unit's unsharded gradients in: the
    /// parameters' compute dtype under FSDP1 and FSDP2 (the unsharded parameters are in
    /// `param_dtype`), except that FSDP2 accumulates over micro-batches in `reduce_dtype`
    /// (`FSDPParam.to_accumulated_grad_if_needed`); the policy's gradient dtype otherwise.
    pub fn unsharded_grad_dtype(&self) -> Dtype {
        let pr = &self.training.precision;
        let own = self.parallel.framework.grads_in_param_dtype() && !self.accumulates_unsharded();
        if own || self.fsdp1_grads() {
            pr.compute
        } else {
            pr.grad
        }
    }

    /// Adam's state exists from initialisation rather than from the first `step()`:
    /// DeepSpeed's wrappers step the optimizer on zero gradients when they initialise
    /// (always FP16_Optimizer; the others before v0.13.2,
    /// [`crate::plan::DeepspeedConfig::moments_at_init`]); PyTorch's optimizers, and so
    /// FSDP's and Megatron's, make it lazily.
    pub fn optimizer_state_at_init(&self) -> bool {
        if !self.parallel.framework.optimizer_state_at_init() {
            return false;
        }
        match self.deepspeed_optimizer() {
            Some(DeepspeedOptimizer::Fp16Optimizer) => true,
            _ => self.parallel.deepspeed.moments_at_init(),
        }
    }

    /// The report's statement of when model state is created: the framework's, with
    /// DeepSpeed's moments at the first step where its release makes them there.
    pub fn state_creation(&self) -> String {
        if self.parallel.framework == Framework::Deepspeed && !self.optimizer_state_at_init() {
            return format!(
                "state creation (DeepSpeed ZeRO): parameters and FP32 master partitions when the engine initialises, optimizer state at the first optimizer.step() (DeepSpeed {}: no optimizer step at initialisation since v0.13.2)",
                self.parallel.deepspeed.version_name()
            );
        }
        self.parallel.framework.state_creation().into()
    }

    /// DeepSpeedZeroOptimizer (ZeRO-1/2), BF16_Optimizer and FP16_Optimizer take the model's
    /// parameters as it made them, one tensor each, and move them into one flat 16-bit
    /// buffer beside an FP32 master (mixed precision); the master and the moments are flat
    /// tensors too.
    pub fn deepspeed_flattens(&self) -> bool {
        let flat = matches!(
            self.deepspeed_optimizer(),
            Some(
                DeepspeedOptimizer::ZeroStage12 | DeepspeedOptimizer::Bf16Optimizer | DeepspeedOptimizer::Fp16Optimizer
            )
        );
        flat && self.training.precision.master.is_some() && self.units.iter().all(|u| u.frozen_bytes == 0)
    }

    /// DeepSpeed ZeRO-3 fetches each module's parameters by its hooks (schedule/zero3_fetch.rs)
    /// rather than a block at a time: not with offloaded parameters, experts, frozen (LoRA)
    /// or FP8-gathered weights, or a pipeline, which keep the per-block model.
    pub fn zero3_fetches_modules(&self) -> bool {
        self.parallel.framework == Framework::Deepspeed
            && self.parallel.sharding == Sharding::Zero3
            && !self.params_offloaded()
            && self.pipeline() == 1
            && self.units.iter().all(|u| u.expert_params == 0 && u.frozen_bytes == 0 && u.fp8_gathered == 0)
    }

    /// Which DeepSpeed optimizer wrapper owns the gradients and the step, if any (see
    /// [`DeepspeedOptimizer`]).
    pub fn deepspeed_optimizer(&self) -> Option<DeepspeedOptimizer> {
        DeepspeedOptimizer::for_plan(
            self.parallel.framework,
            self.parallel.sharding,
            &self.training.precision,
            self.parallel.offload.is_some(),
        )
    }

    /// Parameters offloaded: no parameter partition stays on the GPU between uses.
    pub fn params_offloaded(&self) -> bool {
        self.parallel.offload.as_ref().is_some_and(|o| o.parameters.is_some())
    }

    /// LoRA: bytes of frozen base weights this rank holds (sharded with the parameters).
    pub fn frozen_local(&self) -> u64 {
        self.units.iter().map(|u| if self.params_sharded { u.frozen_shard_bytes } else { u.frozen_bytes }).sum()
    }

    pub fn total_params(&self) -> u64 {
        self.units.iter().map(|u| u.params).sum()
    }

    /// Whether replicated gradients are reduced at all: over data parallelism, or for the
    /// experts over their expert-data-parallel group (which tensor parallelism alone makes).
    /// The optimizer step's passes as this plan runs them: DeepSpeed's ZeRO-1/2 and
    /// FP16_Optimizer wrappers cast the gradients to FP32 in their own flatten task
    /// ([`crate::schedule`]'s `deepspeed_flatten_partition`), so the step does not again.
    pub fn optimizer_step_passes(&self) -> Vec<(&'static str, u64)> {
        let wrapper_casts = matches!(
            self.deepspeed_optimizer(),
            Some(DeepspeedOptimizer::ZeroStage12 | DeepspeedOptimizer::Fp16Optimizer)
        );
        self.training.step_passes(wrapper_casts)
    }

    /// Bytes per local element of [`Self::optimizer_step_passes`].
    pub fn optimizer_step_bytes(&self) -> u64 {
        self.optimizer_step_passes().iter().map(|p| p.1).sum()
    }

    /// PyTorch DDP's reducer owns the gradient reduction: no sharding, no Megatron buffers and
    /// no DeepSpeed wrapper (whose engine reduces at the boundary), and something to reduce.
    pub fn ddp_reducer(&self) -> bool {
        self.parallel.sharding == Sharding::None
            && !self.grads_sharded
            && self.parallel.framework != Framework::Megatron
            && self.deepspeed_optimizer().is_none()
            && self.grads_reduced()
    }

    pub fn grads_reduced(&self) -> bool {
        self.dp * self.parallel.model_parallel.stage_copies() > 1 || (self.edp > 1 && self.expert_params() > 0)
    }

    /// This rank's routed-expert parameters (all units).
    pub fn expert_params(&self) -> u64 {
        self.units.iter().map(|u| u.expert_params).sum()
    }

    /// Of `elements` of this rank's gradients or parameters taken in model order, how many
    /// are routed experts' (whose collectives run over the expert-data-parallel group), for
    /// a collective over all of this rank's state: the stage's expert share.
    pub fn expert_share(&self, elements: u64) -> u64 {
        let (e, t) = (self.expert_params(), self.total_params());
        if e == 0 || t == 0 {
            return 0;
        }
        (u128::from(elements) * u128::from(e) / u128::from(t)) as u64
    }

    /// Elements of all units this rank holds for a piece of state.
    pub fn local_total(&self, sharded: bool) -> u64 {
        (0..self.units.len()).map(|i| self.local(i, sharded)).sum()
    }

    /// Model-state bytes per GPU at rest in steady state (gradients counted as held at the
    /// end of backward): the ZeRO paper's Table 1 quantity.
    pub fn model_state(&self) -> ModelState {
        let pr = &self.training.precision;
        let opt_el = self.optimized_total(self.optimizer_sharded);
        if self.parallel.offload.is_some() {
            // Master, moments and the gradient partition are on the host (or NVMe); so are
            // the parameters when they are offloaded too.
            let on_gpu = if self.params_offloaded() { 0 } else { self.local_total(self.params_sharded) };
            return ModelState {
                parameters: on_gpu * pr.param.bytes() + self.frozen_local(),
                master_weights: 0,
                gradients: 0,
                optimizer_state: 0,
            };
        }
        // DeepSpeed's BF16_Optimizer holds each parameter's 16-bit `.grad` after backward (freed
        // only by the next backward's clear_lp_grads) beside its FP32 accumulation buffer.
        let lp_grads = match self.deepspeed_optimizer() {
            Some(DeepspeedOptimizer::Bf16Optimizer) => self.local_total(false) * pr.param.bytes(),
            _ => 0,
        };
        ModelState {
            parameters: self.local_total(self.params_sharded) * pr.param.bytes() + self.frozen_local(),
            master_weights: opt_el * pr.master_bytes(),
            gradients: self.local_total(self.grads_sharded) * pr.grad.bytes() + lp_grads,
            optimizer_state: opt_el * pr.state_bytes(self.training.states_per_param()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn training(preset: &str, clip: bool) -> TrainingConfig {
        TrainingConfig {
            micro_batch: 1,
            seq_len: 2048,
            grad_accum: 1,
            steps: 1,
            optimizer: OptimizerKind::AdamW,
            momentum: true,
            optimizer_impl: OptimizerImpl::Fused,
            precision: Precision::preset(preset).unwrap(),
            checkpointing: Checkpointing::None,
            checkpoint_blocks: CheckpointBlocks::All,
            activation_offload: None,
            recompute_modules: vec![RecomputeModule::CoreAttn],
            clip_grad_norm: clip,
            blas_workspace: 0,
            te_workspace: 0,
            torch_version: (2, 15),
        }
    }

    #[test]
    fn optimizer_step_bytes_count_every_pass_of_the_step() {
        // BF16 grads under an FP32 master: cast up (2 + 4), clip (3 x 4), Adam (master r/w
        // 8 + grad 4 + two moments r/w 16), master into the BF16 weights (4 + 2).
        assert_eq!(training("bf16-mixed-adam", true).optimizer_step_bytes(), 6 + 12 + 28 + 6);
        assert_eq!(training("bf16-mixed-adam", false).optimizer_step_bytes(), 6 + 28 + 6);
        // FP32 main grads (Megatron's --accumulate-allreduce-grads-in-fp32): no cast.
        assert_eq!(training("bf16-mixed-adam-fp32-grads", true).optimizer_step_bytes(), 12 + 28 + 6);
        // FSDP's FP32 sharded parameters are the master: no cast, no copy.
        assert_eq!(training("fsdp-bf16-mixed", true).optimizer_step_bytes(), 12 + 28);
        // Pure BF16: clip 3 x 2, Adam 2 x 2 + 2 + 2 x 2 x 2.
        assert_eq!(training("bf16", true).optimizer_step_bytes(), 6 + 14);
    }
}
