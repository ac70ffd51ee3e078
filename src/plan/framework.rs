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
    /// PyTorch's DDP / ZeroRedundancyOptimizer / FSDP as stepsim has modelled them since its
    /// first release: FSDP-like units whose gathered parameters are one buffer, gradients in
    /// the policy's gradient dtype, no framework-owned collective buffers.
    Fsdp,
    /// PyTorch FSDP1 (`FullyShardedDataParallel`, `use_orig_params=False`,
    /// `torch/distributed/fsdp/_runtime_utils.py` and `_flat_param.py`, PyTorch 2.15):
    /// everything [`Framework::Fsdp`] does, plus FSDP1's own buffers
    /// ([`Framework::fsdp1_buffers`]).
    Fsdp1,
    /// PyTorch FSDP2 (`fully_shard`, `torch/distributed/fsdp/_fully_shard/`, PyTorch 2.15):
    /// everything [`Framework::Fsdp`] does, plus FSDP2's own buffers ([`Framework::fsdp2_buffers`]).
    Fsdp2,
    Deepspeed,
    /// Megatron-LM / Megatron-Core: its `DistributedDataParallel` (contiguous gradient
    /// buffer, bucketed gradient reduction) and `DistributedOptimizer` (`sharding = "zero1"`).
    Megatron,
}

impl Framework {
    /// PyTorch's own data parallelism (DDP, FSDP, FSDP2), as opposed to DeepSpeed's engine or
    /// Megatron's: the torchtitan-side options and PyTorch's offload apply.
    pub fn is_pytorch(self) -> bool {
        matches!(self, Framework::Fsdp | Framework::Fsdp1 | Framework::Fsdp2)
    }

    /// FSDP1's FlatParameter buffers and dtypes (`FullyShardedDataParallel` with
    /// `use_orig_params=False`, PyTorch 2.15 `torch/distributed/fsdp/`):
    /// - with a low-precision `param_dtype`, each unshard first casts the FP32 local shard
    ///   into `_mp_shard` (one shard in `param_dtype`, `_use_low_precision_shard`), all-gathers
    ///   it into `_full_param_padded`, and frees it (`_free_low_precision_sharded_param`,
    ///   recorded on the unshard stream, so it lives until the all-gather ends);
    /// - the module's parameters are views of the unsharded FlatParameter, so autograd
    ///   computes their gradients in `param_dtype` and `SplitWithSizesBackward` concatenates
    ///   them into one flat gradient of the whole unit when the unit's last gradient exists,
    ///   freeing the per-parameter ones;
    /// - the post-backward hook (`_post_backward_hook`) reshards the unit, then on the
    ///   post-backward stream casts the flat gradient to `reduce_dtype` (a second flat copy)
    ///   and reduce-scatters it into a new sharded gradient (`_reduce_grad`); the
    ///   `param_dtype` flat gradient is recorded on that stream
    ///   (`_no_dispatch_record_stream(autograd_computed_grad, ...)`), so both flat copies
    ///   live until the reduce-scatter ends.
    pub fn fsdp1_buffers(self) -> bool {
        self == Framework::Fsdp1
    }

    /// FSDP1's NO_SHARD strategy (`sharding = "none"` under `framework = "fsdp1"`): no
    /// collective gathers parameters, but with a low-precision `param_dtype` each unit's
    /// pre-forward and pre-backward cast the whole FP32 flat parameter into `_mp_shard`, which
    /// is then the unsharded parameter, freed at every reshard (post-forward, root included,
    /// and post-backward: `FlatParamHandle.post_reshard`); the unit's flat gradient is cast to
    /// `reduce_dtype` and all-reduced in place (`_reduce_grad_no_shard`), and that copy stays
    /// as the gradient.
    pub fn fsdp1_no_shard(self, sharding: Sharding) -> bool {
        self == Framework::Fsdp1 && sharding == Sharding::None
    }

    /// Autograd computes unsharded gradients in the parameter dtype the module runs in
    /// (FSDP1's flat views, FSDP2's unsharded parameters) rather than the policy's gradient
    /// dtype.
    pub fn grads_in_param_dtype(self) -> bool {
        matches!(self, Framework::Fsdp1 | Framework::Fsdp2)
    }

    /// FSDP2's collective buffers and dtypes (`_fsdp_param_group.py`, `_fsdp_collectives.py`,
    /// PyTorch 2.15):
    /// - an all-gather writes one flat output (`foreach_all_gather`), allocated on the
    ///   all-gather copy-in stream when it is issued, which the unit's pre-forward /
    ///   pre-backward copies out into the unsharded parameters (`foreach_all_gather_copy_out`):
    ///   both exist during the copy. In forward the next unit's all-gather is issued after
    ///   this copy-out (implicit prefetch, one unit ahead); in backward the pre-backward
    ///   prefetches the next unit after its own copy-out;
    /// - autograd computes the unsharded gradients in the parameter dtype (`param_dtype`);
    ///   the post-backward copies them into one flat reduce-scatter input in `reduce_dtype`
    ///   (`foreach_reduce_scatter_copy_in`) and frees them; that input is kept until the next
    ///   unit's post-backward (`ReduceScatterState`, `reduce_scatter_max_input_buffers = 1`),
    ///   whose compute stream first waits for the reduce-scatter, or the end of backward
    ///   (`_end_backward_iteration`).
    pub fn fsdp2_buffers(self) -> bool {
        self == Framework::Fsdp2
    }

    /// Adam's state exists from initialisation (DeepSpeed's engine allocates its optimizer
    /// partitions in `DeepSpeedZeroOptimizer.__init__` / `initialize_optimizer_states`), not
    /// from the first `optimizer.step()` (PyTorch's optimizers create state lazily).
    pub fn optimizer_state_at_init(self) -> bool {
        self == Framework::Deepspeed
    }

    /// `zero2` shards the parameters too: FSDP's SHARD_GRAD_OP does (gathered from forward to
    /// backward); DeepSpeed's ZeRO-2 keeps them replicated.
    pub fn zero2_shards_parameters(self) -> bool {
        self.is_pytorch()
    }

    /// Offloaded parameters live on the host as the FP32 master shard and are cast on the GPU
    /// into the low-precision `_mp_shard` (FSDP `CPUOffload(offload_params=True)`,
    /// `_FlatParamHandle.pre_unshard`); DeepSpeed keeps a 16-bit partition on the host and
    /// copies it as is.
    pub fn offloads_master_parameters(self) -> bool {
        self.is_pytorch()
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
            Framework::Fsdp | Framework::Fsdp1 | Framework::Fsdp2 => "optimizer.step() on the CPU",
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
            (Framework::Fsdp1, _) => "PyTorch FSDP1 (FullyShardedDataParallel)",
            (Framework::Fsdp2, _) => "PyTorch FSDP2 (fully_shard)",
            (Framework::Deepspeed, _) => "DeepSpeed",
            (Framework::Megatron, Sharding::Zero1) => "Megatron-LM (distributed optimizer)",
            (Framework::Megatron, _) => "Megatron-LM (DDP)",
        }
    }

    /// The report's statement of when model state is created.
    pub fn state_creation(self) -> &'static str {
        match self {
            Framework::Fsdp => "state creation (PyTorch FSDP): parameters (and master copy) at init, gradients in the first backward, optimizer state at the first optimizer.step()",
            Framework::Fsdp1 => "state creation (PyTorch FSDP1): sharded FlatParameters at wrap time, sharded gradients at the first reduce-scatter, optimizer state at the first optimizer.step()",
            Framework::Fsdp2 => "state creation (PyTorch FSDP2): sharded parameters at fully_shard(), sharded gradients at the first reduce-scatter, optimizer state at the first optimizer.step()",
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
    /// `--overlap-moe-expert-parallel-comm`: Megatron-Core's combined 1F1B schedule
    /// (`pipeline_parallel/combined_1f1b.py`, `TransformerLayerSchedulePlan.run`): each
    /// steady-state forward runs layer by layer beside another micro-batch's backward, so one
    /// pass's all-to-alls overlap the other's compute.
    pub overlap_moe_expert_parallel_comm: bool,
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
    /// A second IPG bucket so reduction overlaps backward (ZeRO-1/2).
    pub overlap_comm: bool,
    /// ZeRO-3: the optimizer steps its flat FP32 master in sub-groups of at most this many
    /// partition elements, and keeps an FP32 gradient buffer as large as the largest.
    pub sub_group_size: u64,
    /// ZeRO-3's parameter fetching (`DeepSpeedZeroConfig`, runtime/zero/config.py; see
    /// `schedule/zero3_fetch.rs`): elements prefetched ahead of the trace
    /// (`stage3_prefetch_bucket_size`, default 5e7), the cap on gathered elements
    /// (`stage3_max_live_parameters`, 1e9), how far ahead in the trace a parameter's next use
    /// keeps it gathered (`stage3_max_reuse_distance`, 1e9 elements), and the size at or below
    /// which a parameter is never partitioned (`stage3_param_persistence_threshold`, 1e5).
    pub stage3_prefetch_bucket_size: u64,
    pub stage3_max_live_parameters: u64,
    pub stage3_max_reuse_distance: u64,
    pub stage3_param_persistence_threshold: u64,
    /// The DeepSpeed release (major, minor, patch) whose initialisation is modelled
    /// ([`Self::empties_cache_after_moving_params`], [`Self::moments_at_init`]).
    #[serde(serialize_with = "version_string")]
    pub version: (u16, u16, u16),
}

fn version_string<S: serde::Serializer>(v: &(u16, u16, u16), s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&version_text(*v))
}

/// A release as DeepSpeed writes it, "0.16.5".
fn version_text((a, b, c): (u16, u16, u16)) -> String {
    format!("{a}.{b}.{c}")
}

/// The DeepSpeed release stepsim follows unless `[deepspeed] version` says otherwise
/// (0.16.5, commit 38327e0).
pub const DEEPSPEED_DEFAULT_VERSION: (u16, u16, u16) = (0, 16, 5);

impl Default for DeepspeedConfig {
    fn default() -> Self {
        DeepspeedConfig {
            reduce_bucket_size: 500_000_000,
            allgather_bucket_size: 500_000_000,
            contiguous_gradients: true,
            overlap_comm: false,
            sub_group_size: 1_000_000_000,
            version: DEEPSPEED_DEFAULT_VERSION,
            stage3_prefetch_bucket_size: 50_000_000,
            stage3_max_live_parameters: 1_000_000_000,
            stage3_max_reuse_distance: 1_000_000_000,
            stage3_param_persistence_threshold: 100_000,
        }
    }
}

impl DeepspeedConfig {
    /// DeepSpeedZeroOptimizer calls `empty_cache()` once it has moved the parameters to the
    /// CPU, so their freed GPU blocks go back to the driver (stage_1_and_2.py, since
    /// d0dbc95a9, "call empty_cache to really free up GPU memory", v0.8.0). Before, they
    /// stayed in PyTorch's cache, where later allocations of their sizes found them.
    pub fn empties_cache_after_moving_params(&self) -> bool {
        self.version >= (0, 8, 0)
    }

    /// ZeRO-1/2/3 and BF16_Optimizer made Adam's moments at initialisation by stepping the
    /// optimizer on zero gradients (`initialize_optimizer_states`) until 18179807f ("Remove
    /// optimizer step on initialization", v0.13.2); since then the optimizer makes them at
    /// its first `step()`. FP16_Optimizer still steps at initialisation.
    pub fn moments_at_init(&self) -> bool {
        self.version < (0, 13, 2)
    }

    /// How the report writes the version.
    pub fn version_name(&self) -> String {
        version_text(self.version)
    }

    /// The IPG buckets' bytes: `torch.empty(reduce_bucket_size, dtype=model dtype)`, two of
    /// them with `overlap_comm` (`DeepSpeedZeroOptimizer.backward`, stage_1_and_2.py); none
    /// without `contiguous_gradients`.
    pub fn ipg_bytes(&self, dtype: Dtype) -> u64 {
        self.ipg_buckets() * self.reduce_bucket_size.saturating_mul(dtype.bytes())
    }

    /// ZeRO-3's IPG bucket bytes: one bucket whatever `overlap_comm` says (stage3.py keeps one
    /// per communication dtype), none without `contiguous_gradients`.
    pub fn stage3_ipg_bytes(&self, dtype: Dtype) -> u64 {
        if self.contiguous_gradients {
            self.reduce_bucket_size.saturating_mul(dtype.bytes())
        } else {
            0
        }
    }

    /// ZeRO-3's FP32 sub-group gradient, in elements, for a rank's `partition` elements: the
    /// largest optimizer sub-group (`initialize_optimizer_states`: sub-groups hold at most
    /// `sub_group_size` partition elements).
    pub fn stage3_sub_group_elements(&self, partition: u64) -> u64 {
        partition.min(self.sub_group_size)
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
    /// `DeepSpeedZeroOptimizer_Stage3` (stage3.py), ZeRO stage 3. When it initialises:
    /// - the gradient partitions (`grad_partitions_flat_buffer`, zeros in
    ///   `gradient_accumulation_dtype`, the model dtype unless `grad_accum_dtype` says
    ///   otherwise);
    /// - the IPG bucket (`torch.empty(reduce_bucket_size)` in the model dtype, with
    ///   `contiguous_gradients`, one per communication dtype; `overlap_comm` adds none), into
    ///   which every gradient is copied as autograd produces it
    ///   (`__add_grad_to_ipg_bucket`: the parameter's own gradient is freed);
    /// - the FP32 gradient of the optimizer's flat master of the largest sub-group
    ///   (`initialize_optimizer_states`: `gradient_buffer` of the largest sub-group's partition
    ///   elements, at most about `sub_group_size`), kept as that master's `.grad`.
    ///
    /// All three live for the whole run.
    ZeroStage3,
    /// `FP16_Optimizer` (fp16/fused_optimizer.py): FP16 without ZeRO (stage 0) and a fused
    /// optimizer. The FP32 master is one flat copy of every local parameter
    /// (`fp32_groups_flat`, not partitioned) and the moments are made when it initialises
    /// (`initialize_optimizer_states`); the FP16 `.grad`s are all-reduced by the engine at the
    /// accumulation boundary in flattened buckets (`buffered_allreduce_fallback`); `step()`
    /// casts every `.grad` to FP32 in a list and flattens the list into the master's
    /// gradient (`_flatten_dense_tensors([p.grad.to(fp32) ...])`), then frees the FP16
    /// `.grad`s.
    Fp16Optimizer,
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
            Sharding::Zero3 => Some(DeepspeedOptimizer::ZeroStage3),
            // `_do_optimizer_sanity_check`: FP16 without ZeRO is FP16_Optimizer (BF16 without
            // ZeRO, BF16_Optimizer, is refused at validation in favour of its equivalent
            // zero1 + FP32 gradients).
            Sharding::None if pr.param == Dtype::Fp16 && pr.master.is_some() => Some(DeepspeedOptimizer::Fp16Optimizer),
            _ => None,
        }
    }

    /// The wrapper's flat 16-bit parameter buffer, by its attribute name.
    pub fn flat_params_name(self) -> &'static str {
        match self {
            DeepspeedOptimizer::Bf16Optimizer => "bf16_groups_flat",
            DeepspeedOptimizer::Fp16Optimizer => "fp16_groups_flat",
            DeepspeedOptimizer::ZeroStage12 => "bit16_groups_flat",
            DeepspeedOptimizer::ZeroStage3 => "fp16_partitioned_groups_flat",
        }
    }

    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            DeepspeedOptimizer::ZeroStage12 => "DeepSpeedZeroOptimizer (stage_1_and_2.py)",
            DeepspeedOptimizer::Bf16Optimizer => "BF16_Optimizer (bf16_optimizer.py)",
            DeepspeedOptimizer::ZeroStage3 => "DeepSpeedZeroOptimizer_Stage3 (stage3.py)",
            DeepspeedOptimizer::Fp16Optimizer => "FP16_Optimizer (fp16/fused_optimizer.py)",
        }
    }
}

/// `MEMORY_OPT_ALLREDUCE_SIZE` (engine.py): elements per bucket of the engine's
/// `buffered_allreduce_fallback`, which flattens each bucket into a new tensor.
pub const DEEPSPEED_ALLREDUCE_BUCKET: u64 = 500_000_000;
