//! Framework semantics: where PyTorch (DDP, ZeroRedundancyOptimizer, FSDP) and DeepSpeed
//! (ZeRO, ZeRO-Offload / Infinity) do the same job differently. Each difference is one
//! method here, with the framework code it follows; the plan, the lowering steps
//! (`src/schedule`) and the report ask these methods rather than testing the framework
//! themselves, so a new framework (FSDP2, Megatron's distributed optimizer) is a variant
//! and its answers.

use serde::Serialize;

use super::Sharding;

/// Whose semantics apply where FSDP and DeepSpeed differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    Fsdp,
    Deepspeed,
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

    /// The host optimizer step under offload, as the framework's log names it.
    pub fn host_optimizer_step(self) -> &'static str {
        match self {
            Framework::Fsdp => "optimizer.step() on the CPU",
            Framework::Deepspeed => "DeepSpeedCPUAdam step on the host",
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
        }
    }

    /// The report's statement of when model state is created.
    pub fn state_creation(self) -> &'static str {
        match self {
            Framework::Fsdp => "state creation (PyTorch FSDP): parameters (and master copy) at init, gradients in the first backward, optimizer state at the first optimizer.step()",
            Framework::Deepspeed => "state creation (DeepSpeed ZeRO): parameters, FP32 master partitions and optimizer state when the engine initialises",
        }
    }
}
