//! Parallelism and policies: who holds which bytes of model state, in which dtype, and when
//! it is created. Everything the scheduler allocates for parameters, gradients and optimizer
//! state is sized here, so the report's model-state table and the simulation agree.

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

/// Whose semantics apply where FSDP and DeepSpeed differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    Fsdp,
    Deepspeed,
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
    pub backward_prefetch: BackwardPrefetch,
    pub forward_prefetch: bool,
    pub limit_all_gathers: bool,
    /// DDP `gradient_as_bucket_view`: when false (the default) DDP's buckets are a second
    /// copy of every gradient.
    pub gradient_as_bucket_view: bool,
    /// DDP `bucket_cap_mb` (25 MB default), bytes.
    pub bucket_bytes: u64,
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
}

impl Precision {
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
}

impl TrainingConfig {
    /// Optimizer state tensors per parameter.
    pub fn states_per_param(&self) -> u64 {
        match self.optimizer {
            OptimizerKind::Adam | OptimizerKind::AdamW => 2,
            OptimizerKind::Sgd => u64::from(self.momentum),
        }
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
}

/// Who holds what: the plan every allocation of model state is sized from.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub parallel: ParallelConfig,
    pub training: TrainingConfig,
    pub gpus: u64,
    pub gpus_per_node: u64,
    /// Ranks a sharded tensor is split over (all GPUs, or one node for hybrid sharding).
    pub shard_group: u64,
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

impl Plan {
    pub fn new(
        dag: &LayerDag,
        parallel: ParallelConfig,
        training: TrainingConfig,
        gpus: u64,
        gpus_per_node: u64,
    ) -> Plan {
        let sh = parallel.sharding;
        let shard_group = match sh {
            Sharding::None => 1,
            Sharding::HybridShard => gpus_per_node.min(gpus),
            _ => gpus,
        };
        let params_sharded = matches!(sh, Sharding::Zero3 | Sharding::HybridShard)
            || (sh == Sharding::Zero2 && parallel.framework == Framework::Fsdp);
        let grads_sharded = matches!(sh, Sharding::Zero2 | Sharding::Zero3 | Sharding::HybridShard);
        let optimizer_sharded = sh != Sharding::None;
        // SHARD_GRAD_OP keeps the gathered parameters from forward to backward.
        let reshard_after_forward = params_sharded && sh != Sharding::Zero2 && parallel.reshard_after_forward;
        let mut units = Vec::new();
        let root = [Region::Embed, Region::Head];
        // One pass over the ops: parameters per unit (root first, then one per block).
        let mut per_unit = vec![0u64; dag.config.n_layers as usize + 1];
        for op in &dag.ops {
            let u = match op.region {
                Region::Embed | Region::Head => 0,
                Region::Block(l) => l as usize + 1,
            };
            per_unit[u] += op.params;
        }
        let rp = per_unit[0];
        units.push(Unit {
            name: "root (embeddings, final norm, head)".into(),
            regions: root.to_vec(),
            params: rp,
            shard_params: rp.div_ceil(shard_group),
        });
        for l in 0..dag.config.n_layers {
            let p = per_unit[l as usize + 1];
            units.push(Unit {
                name: format!("layers.{l}"),
                regions: vec![Region::Block(l)],
                params: p,
                shard_params: p.div_ceil(shard_group),
            });
        }
        Plan {
            parallel,
            training,
            gpus,
            gpus_per_node,
            shard_group,
            units,
            params_sharded,
            grads_sharded,
            optimizer_sharded,
            reshard_after_forward,
        }
    }

    /// Unit index holding a region's ops.
    pub fn unit_of(&self, r: Region) -> usize {
        match r {
            Region::Embed | Region::Head => 0,
            Region::Block(l) => l as usize + 1,
        }
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

    pub fn total_params(&self) -> u64 {
        self.units.iter().map(|u| u.params).sum()
    }

    /// Elements of all units this rank holds for a piece of state.
    pub fn local_total(&self, sharded: bool) -> u64 {
        (0..self.units.len()).map(|i| self.local(i, sharded)).sum()
    }

    /// Model-state bytes per GPU at rest in steady state (gradients counted as held at the
    /// end of backward): the ZeRO paper's Table 1 quantity.
    pub fn model_state(&self) -> ModelState {
        let pr = &self.training.precision;
        let opt_el = self.local_total(self.optimizer_sharded);
        ModelState {
            parameters: self.local_total(self.params_sharded) * pr.param.bytes(),
            master_weights: pr.master.map_or(0, |m| opt_el * m.bytes()),
            gradients: self.local_total(self.grads_sharded) * pr.grad.bytes(),
            optimizer_state: opt_el * self.training.states_per_param() * pr.optimizer_state.bytes(),
        }
    }
}
