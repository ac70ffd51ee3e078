//! Memory categories. Every allocation carries one, so timelines and OOM reports can say
//! what the bytes were for.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Persistent parameters (the local shard under FSDP/ZeRO-3).
    Parameters,
    /// Unsharded parameter copies: FSDP all-gather outputs, autocast weight casts.
    GatheredParameters,
    /// A separate FP32 master copy of the parameters.
    MasterWeights,
    /// Gradients held for the optimizer (sharded under ZeRO-2/3).
    Gradients,
    /// A unit's full gradients between its backward and its reduce-scatter.
    UnshardedGradients,
    /// Optimizer moments / momentum.
    OptimizerState,
    /// Temporaries of `optimizer.step()` (e.g. foreach sqrt of the second moments).
    OptimizerTemp,
    /// Activations saved for backward.
    Activations,
    /// Activations recomputed in backward under activation checkpointing.
    Recomputed,
    /// Forward intermediates that are not saved, and kernel scratch.
    Transient,
    /// Gradients with respect to activations, live during backward.
    ActivationGradients,
    /// Collective buffers: DDP buckets, reduce-scatter outputs.
    CommBuffers,
    /// Constant module buffers (rotary tables).
    Buffers,
    /// Token ids and targets.
    Inputs,
    /// Keys and values an inference job keeps for every token of context.
    KvCache,
    /// FSDP2's flat all-gather output, from the all-gather's issue until the unit's
    /// parameters are copied out of it (and in forward, the next unit's copy-out).
    AllGatherBuffers,
    /// FSDP2's flat reduce-scatter input (`reduce_dtype`), kept until the next unit's
    /// post-backward.
    ReduceScatterBuffers,
    /// cuBLAS workspaces PyTorch takes from its caching allocator, one per (handle, stream),
    /// kept for the life of the process.
    BlasWorkspaces,
    /// FSDP2's post-forward shards (`reshard_after_forward = n`): 1/n of a unit's gathered
    /// parameters, kept from its forward to its backward's all-gather.
    PostForwardShards,
}

impl Category {
    pub const ALL: [Category; 19] = [
        Category::Parameters,
        Category::GatheredParameters,
        Category::MasterWeights,
        Category::Gradients,
        Category::UnshardedGradients,
        Category::OptimizerState,
        Category::OptimizerTemp,
        Category::Activations,
        Category::Recomputed,
        Category::Transient,
        Category::ActivationGradients,
        Category::CommBuffers,
        Category::Buffers,
        Category::Inputs,
        Category::KvCache,
        Category::AllGatherBuffers,
        Category::ReduceScatterBuffers,
        Category::BlasWorkspaces,
        Category::PostForwardShards,
    ];
    pub const COUNT: usize = Self::ALL.len();

    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable machine name (CSV, JSON).
    pub fn key(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::GatheredParameters => "gathered_parameters",
            Category::MasterWeights => "master_weights",
            Category::Gradients => "gradients",
            Category::UnshardedGradients => "unsharded_gradients",
            Category::OptimizerState => "optimizer_state",
            Category::OptimizerTemp => "optimizer_temp",
            Category::Activations => "activations",
            Category::Recomputed => "recomputed_activations",
            Category::Transient => "transient",
            Category::ActivationGradients => "activation_gradients",
            Category::CommBuffers => "comm_buffers",
            Category::Buffers => "buffers",
            Category::Inputs => "inputs",
            Category::KvCache => "kv_cache",
            Category::AllGatherBuffers => "all_gather_buffers",
            Category::ReduceScatterBuffers => "reduce_scatter_buffers",
            Category::BlasWorkspaces => "cublas_workspaces",
            Category::PostForwardShards => "post_forward_shards",
        }
    }

    /// What a person reads in the report and the plot legend.
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::GatheredParameters => "parameters (gathered / cast copies)",
            Category::MasterWeights => "master weights",
            Category::Gradients => "gradients",
            Category::UnshardedGradients => "gradients (unsharded, awaiting reduce)",
            Category::OptimizerState => "optimizer state",
            Category::OptimizerTemp => "optimizer step temporaries",
            Category::Activations => "activations (saved)",
            Category::Recomputed => "activations (recomputed)",
            Category::Transient => "activations (transient)",
            Category::ActivationGradients => "activation gradients",
            Category::CommBuffers => "communication buffers",
            Category::Buffers => "module buffers",
            Category::Inputs => "inputs (token ids)",
            Category::KvCache => "KV cache",
            Category::AllGatherBuffers => "all-gather outputs (flat, before copy-out)",
            Category::ReduceScatterBuffers => "reduce-scatter inputs (flat)",
            Category::BlasWorkspaces => "cuBLAS workspaces",
            Category::PostForwardShards => "parameters (resharded after forward)",
        }
    }

    /// The category PyTorch's `MemTracker` / `FSDPMemTracker` would file these bytes under,
    /// for comparison with the measured references. `FSDPMemTracker` keeps the unsharded
    /// parameters, all-gather outputs and reduce-scatter inputs apart; it files the gradients
    /// autograd computes for the unsharded parameters as temporaries (they are outputs of
    /// backward ops, not a registered `.grad`), and FSDP2's post-forward shards as activations
    /// (forward creates them).
    pub fn tracker_category(self) -> &'static str {
        match self {
            Category::Parameters | Category::MasterWeights => "Parameter",
            Category::GatheredParameters => "Unsharded Param",
            Category::Gradients => "Gradient",
            Category::OptimizerState | Category::OptimizerTemp => "Optstate",
            Category::Activations | Category::Recomputed | Category::Transient | Category::PostForwardShards => {
                "Activation"
            }
            Category::ActivationGradients | Category::CommBuffers | Category::UnshardedGradients => "Temp",
            Category::AllGatherBuffers => "All Gather",
            Category::ReduceScatterBuffers => "Reduce Scatter",
            Category::Buffers => "Buffer",
            Category::Inputs | Category::KvCache | Category::BlasWorkspaces => "Other",
        }
    }
}
