//! Framework semantics: where PyTorch (DDP, ZeroRedundancyOptimizer, FSDP) and DeepSpeed
//! (ZeRO, ZeRO-Offload / Infinity) do the same job differently. Each difference is one
//! method here, with the framework code it follows; the plan, the lowering steps
//! (`src/schedule`) and the report ask these methods rather than testing the framework
//! themselves, so a new framework (FSDP2, Megatron's distributed optimizer) is a variant
//! and its answers.

use serde::Serialize;

use super::{Precision, Sharding};
use crate::model::Dtype;

/// Whose semantics apply where FSDP and DeepSpeed differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    Fsdp,
    Deepspeed,
    /// Megatron-LM / Megatron-Core: its `DistributedDataParallel` (contiguous gradient
    /// buffer, bucketed gradient reduction) and `DistributedOptimizer` (`sharding = "zero1"`).
    Megatron,
}

impl Framework {
    /// Adam's state exists from initialisation (DeepSpeed's engine allocates its optimizer
    /// partitions in `DeepSpeedZeroOptimizer.__init__` / `initialize_optimizer_states`), not
    /// from the first `optimizer.step()` (PyTorch's optimizers create state lazily).
    pub fn optimizer_state_at_init(self) -> bool {
        self == Framework::Deepspeed
    }

    /// `zero2` shards the parameters too: FSDP's SHARD_GRAD_OP does (gathered from forward to
    /// backward); DeepSpeed's ZeRO-2 keeps them replicated.
    pub fn zero2_shards_parameters(self) -> bool {
        self == Framework::Fsdp
    }

    /// Offloaded parameters live on the host as the FP32 master shard and are cast on the GPU
    /// into the low-precision `_mp_shard` (FSDP `CPUOffload(offload_params=True)`,
    /// `_FlatParamHandle.pre_unshard`); DeepSpeed keeps a 16-bit partition on the host and
    /// copies it as is.
    pub fn offloads_master_parameters(self) -> bool {
        self == Framework::Fsdp
    }

    /// A pipeline stage keeps each micro-batch's output after sending it, until that
    /// micro-batch's backward: DeepSpeed's `PipelineEngine` stores it in
    /// `pipe_buffers['outputs'][buffer_id]` (`_exec_forward_pass`) and drops it at the end of
    /// `_exec_backward_pass` (pipe/engine.py); Megatron-LM frees the data once sent
    /// (`deallocate_output_tensor`), as do PyTorch's pipelining schedules.
    pub fn keeps_pipeline_outputs(self) -> bool {
        self == Framework::Deepspeed
    }

    /// The host optimizer step under offload, as the framework's log names it.
    pub fn host_optimizer_step(self) -> &'static str {
        match self {
            Framework::Fsdp => "optimizer.step() on the CPU",
            Framework::Deepspeed => "DeepSpeedCPUAdam step on the host",
            // Offload is refused for Megatron at validation; named for completeness.
            Framework::Megatron => "optimizer.step() on the CPU (Megatron --optimizer-cpu-offload)",
        }
    }

    /// What the user runs, by the sharding asked for.
    pub fn display(self, sharding: Sharding, gpus: u64) -> &'static str {
        match (self, sharding) {
            (_, Sharding::None) if gpus == 1 => "single-GPU PyTorch",
            (Framework::Fsdp, Sharding::None) => "PyTorch DDP",
            (Framework::Fsdp, Sharding::Zero1) => "PyTorch ZeroRedundancyOptimizer",
            (Framework::Fsdp, _) => "PyTorch FSDP",
            (Framework::Deepspeed, _) => "DeepSpeed",
            (Framework::Megatron, Sharding::Zero1) => "Megatron-LM (distributed optimizer)",
            (Framework::Megatron, _) => "Megatron-LM (DDP)",
        }
    }

    /// The report's statement of when model state is created.
    pub fn state_creation(self) -> &'static str {
        match self {
            Framework::Fsdp => "state creation (PyTorch FSDP): parameters (and master copy) at init, gradients in the first backward, optimizer state at the first optimizer.step()",
            Framework::Deepspeed => "state creation (DeepSpeed ZeRO): parameters, FP32 master partitions and optimizer state when the engine initialises",
            Framework::Megatron => "state creation (Megatron-LM): parameters, FP32 main parameters and the contiguous gradient buffer (zeroed in place each step, never freed) at init, optimizer state at the first optimizer.step()",
        }
    }
}

/// Megatron-Core's overlap options, by their command-line names (`megatron/training/
/// arguments.py`, `DistributedDataParallelConfig` in `megatron/core/distributed/
/// distributed_data_parallel_config.py`), all off by default as in Megatron.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct MegatronConfig {
    /// `--overlap-grad-reduce`: each gradient bucket is reduced (all-reduce, or the
    /// distributed optimizer's reduce-scatter) as soon as the last micro-batch's backward
    /// has produced all of its gradients, during the rest of the backward.
    pub overlap_grad_reduce: bool,
    /// `--overlap-param-gather`: the distributed optimizer's all-gather of updated parameters
    /// runs bucket by bucket during the next step's first forward.
    pub overlap_param_gather: bool,
    /// `--tp-comm-overlap`: Transformer Engine's userbuffers split each sequence-parallel
    /// all-gather / reduce-scatter into chunks pipelined with the GEMM beside it.
    pub tp_comm_overlap: bool,
    /// `--ddp-bucket-size` in elements (None: Megatron's default, see [`Self::bucket_elements`]).
    pub bucket_size: Option<u64>,
}

impl MegatronConfig {
    /// Elements per gradient (and parameter all-gather) bucket on a rank of pipeline stage
    /// `stage` with `dp` data-parallel ranks: `--ddp-bucket-size`, or
    /// `max(40000000, 1000000 * dp)`; one bucket (None) without `--overlap-grad-reduce`,
    /// and on every stage but the first, whose reduction is off the critical path
    /// (`DistributedDataParallel.__init__`, Megatron-Core 0.8, commit f2e5db402c).
    pub fn bucket_elements(&self, dp: u64, stage: u64) -> Option<u64> {
        if !self.overlap_grad_reduce || stage > 0 {
            return None;
        }
        Some(self.bucket_size.unwrap_or_else(|| 40_000_000u64.max(1_000_000u64.saturating_mul(dp))))
    }
}

/// DeepSpeed's `zero_optimization` knobs that size its own buffers, by DeepSpeed's names and
/// with its defaults (`deepspeed/runtime/zero/config.py`, `DeepSpeedZeroConfig`, DeepSpeed
/// 0.16, commit 38327e0): `reduce_bucket_size = 5e8`, `allgather_bucket_size = 5e8`,
/// `contiguous_gradients = true`, `overlap_comm = false` for stages 1 and 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeepspeedConfig {
    /// Elements of one IPG (independent partition gradient) bucket.
    pub reduce_bucket_size: u64,
    /// Elements per all-gather of the updated 16-bit partitions after the step.
    pub allgather_bucket_size: u64,
    /// Gradients are copied into the IPG bucket as they are reduced (the bucket exists).
    pub contiguous_gradients: bool,
    /// A second IPG bucket so reduction overlaps backward.
    pub overlap_comm: bool,
}

impl Default for DeepspeedConfig {
    fn default() -> Self {
        DeepspeedConfig {
            reduce_bucket_size: 500_000_000,
            allgather_bucket_size: 500_000_000,
            contiguous_gradients: true,
            overlap_comm: false,
        }
    }
}

impl DeepspeedConfig {
    /// The IPG buckets' bytes: `torch.empty(reduce_bucket_size, dtype=model dtype)`, two of
    /// them with `overlap_comm` (`DeepSpeedZeroOptimizer.backward`, stage_1_and_2.py); none
    /// without `contiguous_gradients`.
    pub fn ipg_bytes(&self, dtype: Dtype) -> u64 {
        self.ipg_buckets() * self.reduce_bucket_size.saturating_mul(dtype.bytes())
    }

    /// How many IPG buckets exist: none without `contiguous_gradients`, two with `overlap_comm`.
    pub fn ipg_buckets(&self) -> u64 {
        match (self.contiguous_gradients, self.overlap_comm) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        }
    }
}

/// The DeepSpeed optimizer wrapper that owns gradients and the step, as DeepSpeed's engine
/// picks it (`DeepSpeedEngine._do_optimizer_sanity_check`, engine.py).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeepspeedOptimizer {
    /// `DeepSpeedZeroOptimizer` (stage_1_and_2.py), ZeRO stages 1 and 2: 16-bit gradients
    /// reduced through the IPG bucket into the rank's partition, flattened and cast to FP32
    /// for the step (`single_grad_partition`).
    ZeroStage12,
    /// `BF16_Optimizer` (bf16_optimizer.py): BF16 weights with FP32 gradient accumulation,
    /// chosen for ZeRO stage 1 with `grad_accum_dtype = fp32` and for stage 0 with bf16 (its
    /// own ZeRO-1: FP32 master and moments partitioned over data parallelism). An FP32
    /// gradient buffer of every local parameter (`fp32_groups_gradients_flat`, not
    /// partitioned) from initialisation, the 16-bit `.grad`s kept beside it, and gradients
    /// all-reduced in FP32 buckets (`buffered_allreduce_fallback`).
    Bf16Optimizer,
}

impl DeepspeedOptimizer {
    pub fn for_plan(framework: Framework, sharding: Sharding, pr: &Precision, offload: bool) -> Option<Self> {
        if framework != Framework::Deepspeed || offload {
            return None;
        }
        match sharding {
            Sharding::Zero1 if pr.param == Dtype::Bf16 && pr.grad == Dtype::Fp32 => {
                Some(DeepspeedOptimizer::Bf16Optimizer)
            }
            Sharding::Zero1 | Sharding::Zero2 => Some(DeepspeedOptimizer::ZeroStage12),
            _ => None,
        }
    }

    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            DeepspeedOptimizer::ZeroStage12 => "DeepSpeedZeroOptimizer (stage_1_and_2.py)",
            DeepspeedOptimizer::Bf16Optimizer => "BF16_Optimizer (bf16_optimizer.py)",
        }
    }
}

/// `MEMORY_OPT_ALLREDUCE_SIZE` (engine.py): elements per bucket of the engine's
/// `buffered_allreduce_fallback`, which flattens each bucket into a new tensor.
pub const DEEPSPEED_ALLREDUCE_BUCKET: u64 = 500_000_000;
