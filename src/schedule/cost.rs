//! How long a task takes: a roofline per op and the ring cost per collective.
//!
//! One global calibration, no per-scenario constants: a training step's GEMMs reach
//! [`MATMUL_EFFICIENCY`] of the GPU's best achievable matmul throughput
//! (`GpuSpec::max_matmul_fraction` x peak, measured with large square GEMMs), flash attention
//! [`ATTENTION_EFFICIENCY`] of it, and memory-bound ops move bytes at [`HBM_EFFICIENCY`] of
//! HBM bandwidth. FP32 compute has no such measurement: FP32 matmuls use the same fractions of
//! the FP32 peak. The constants were set once against torchtitan's FSDP2 runs on A100
//! (tests/fidelity_throughput.rs), not per scenario.

use crate::hardware::Cluster;
use crate::model::{Dtype, Op, OpKind};
use crate::net::{Collective, Group};

pub const MATMUL_EFFICIENCY: f64 = 0.78;
pub const ATTENTION_EFFICIENCY: f64 = 0.6;
pub const HBM_EFFICIENCY: f64 = 0.8;
/// Launch and framework overhead per op, seconds.
pub const OP_OVERHEAD_S: f64 = 4e-6;

#[derive(Debug, Clone)]
pub struct Cost {
    pub peak_flops: f64,
    /// Best achievable matmul fraction of the peak (the GPU's measured ceiling).
    pub matmul_ceiling: f64,
    pub hbm: f64,
    pub compute_bytes: u64,
    /// The data-parallel (or shard) group collectives of model state run over.
    pub shard_group: Group,
    /// All data-parallel ranks (DDP, ZeRO-1/2 groups; replica all-reduce for hybrid).
    pub dp_group: Group,
    /// The cross-node replica group of hybrid sharding (one rank per node).
    pub replica_group: Group,
}

impl Cost {
    pub fn new(cluster: &Cluster, compute: Dtype, shard_group: u64) -> Cost {
        let g = &cluster.gpu;
        let peak_flops = cluster.peak_flops(compute);
        let network = cluster.network_bytes_per_s();
        let per_node = u64::from(cluster.gpus_per_node);
        let group = |ranks: u64, per_node: u64| Group {
            ranks,
            ranks_per_node: per_node,
            nvlink_bytes_per_s: g.nvlink_bytes_per_s,
            network_bytes_per_s: network,
        };
        let gpus = u64::from(cluster.gpus);
        Cost {
            peak_flops,
            matmul_ceiling: g.max_matmul_fraction,
            hbm: g.hbm_bytes_per_s,
            compute_bytes: compute.bytes(),
            shard_group: group(shard_group, per_node),
            dp_group: group(gpus, per_node),
            replica_group: group(gpus.div_ceil(per_node), 1),
        }
    }

    fn roofline(&self, flops: f64, bytes: f64, eff: f64) -> f64 {
        let t_compute = if eff > 0.0 { flops / (self.peak_flops * eff) } else { 0.0 };
        let t_mem = bytes / (self.hbm * HBM_EFFICIENCY);
        OP_OVERHEAD_S + t_compute.max(t_mem)
    }

    fn eff(&self, kind: OpKind) -> f64 {
        match kind {
            OpKind::Linear => MATMUL_EFFICIENCY * self.matmul_ceiling,
            OpKind::AttentionCore => ATTENTION_EFFICIENCY * self.matmul_ceiling,
            // Element-wise ops and norms are memory-bound: their FLOPs never dominate.
            _ => 1.0,
        }
    }

    fn weight_bytes(&self, op: &Op) -> f64 {
        ((op.params + op.shared_params) * self.compute_bytes) as f64
    }

    pub fn forward_s(&self, op: &Op) -> f64 {
        self.roofline(op.fwd_flops, op.fwd_bytes + self.weight_bytes(op), self.eff(op.kind))
    }

    pub fn backward_s(&self, op: &Op) -> f64 {
        self.roofline(op.bwd_flops, 2.0 * op.fwd_bytes + 2.0 * self.weight_bytes(op), self.eff(op.kind))
    }

    /// The optimizer step is memory-bound: every local element's parameter, gradient, master
    /// and states are read and written once.
    pub fn optimizer_s(&self, elements: u64, bytes_per_element: u64) -> f64 {
        OP_OVERHEAD_S + (elements * bytes_per_element) as f64 / (self.hbm * HBM_EFFICIENCY)
    }

    pub fn collective_s(&self, group: &Group, op: Collective, bytes: u64) -> f64 {
        group.time_s(op, bytes)
    }
}

pub fn ns(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}
