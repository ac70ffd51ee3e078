//! `[nccl]` and the default of `allocator.nccl_buffers`: the NCCL communicators each rank
//! holds, by framework, and their device memory ([`crate::net::nccl_memory`]).
//!
//! Communicators per rank (one per process group a collective runs on; PyTorch creates each
//! group's communicator at its first collective):
//! - tensor parallel (all-reduces, or all-gathers and reduce-scatters with sequence
//!   parallelism); data parallel over data x context (gradient all-reduce or reduce-scatter,
//!   parameter all-gathers, and the gradient norm's all-reduce); HSDP's shard and replica
//!   groups; context parallel (ring sends, all-gathers or all-to-alls); expert parallel
//!   (all-to-all: sends to and receives from every peer) and Megatron's expert data parallel;
//! - pipeline: PyTorch's pipelining and Megatron send and receive over the pipeline group
//!   (`batch_isend_irecv`): one peer at the first and last stage, two between; DeepSpeed's
//!   pipeline engine broadcasts within a 2-rank group per neighbouring pair (`pipe/p2p.py`);
//! - Megatron-LM and Megatron-DeepSpeed also all-reduce the gradient norm over the
//!   model-parallel group (`get_model_parallel_group()` in `clip_grad_norm_fp32`), the tied
//!   embedding's gradient between the first and last stage (the embedding group, DeepSpeed's
//!   tied-module group), and run barriers on the world group.
//!
//! Rank order: tensor fastest, then context, expert / data, then pipeline (Megatron-LM and
//! torchtitan's device mesh alike); a group spans nodes when its stride times its size
//! exceeds the node.

use super::*;
use crate::hardware::Arch;
use crate::net::nccl_memory::{Communicator, Fabric, NcclConfig, Traffic, TreePosition};

/// What NCCL holds on each GPU: the rank class with the most, and its communicators.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NcclEstimate {
    pub config: NcclConfig,
    /// The bytes taken off every GPU's capacity: the largest of the rank classes'.
    pub per_gpu: u64,
    /// The rank class that holds them, e.g. "pipeline stage 0" or "every rank".
    pub class: String,
    pub communicators: Vec<(Communicator, u64)>,
    /// False when the GPU runs another collective library (RCCL), whose buffers are not
    /// modelled: the estimate is 0.
    pub modelled: bool,
}

/// The fabric of the cluster's nodes: 24 ring channels inside an 8-GPU NVSwitch node and
/// 16 across nodes; 8 on nodes without NVSwitch (an assumption).
fn fabric(cluster: &Cluster) -> Fabric {
    let (intra, inter) = crate::net::nccl_memory::ring_channels(cluster.nvswitch());
    Fabric {
        ring_channels_intra: intra,
        ring_channels_inter: inter,
        // Two A100s (sm80) over NVLink use P2P read (`ncclTopoCheckP2p`).
        p2p_read: cluster.gpu.arch == Arch::Ampere,
        nvls_capable: cluster.nvls_capable(),
        gpus_per_node: u64::from(cluster.gpus_per_node),
    }
}

pub(super) fn validate_nccl(v: &V, n: Option<&NcclSection>, cluster: &Cluster) -> Result<NcclConfig, ScenarioError> {
    let f = fabric(cluster);
    let mut c = NcclConfig::default_for(f.nvls_capable);
    let Some(n) = n else { return Ok(c) };
    if let Some(x) = n.runtime_connect {
        c.runtime_connect = x;
    }
    if let Some(x) = n.cumem {
        c.cumem = x;
    }
    if let Some(x) = n.nvls {
        if x && !f.nvls_capable {
            return Err(v.err(
                "nccl.nvls",
                format!(
                    "NVLS needs NVSwitch multicast (a data-center Hopper or Blackwell GPU on an NVSwitch node); {} on {} has none",
                    cluster.gpu.name, cluster.node
                ),
            ));
        }
        c.nvls = x;
    }
    Ok(c)
}

/// The communicators of one rank at pipeline position `stage` of `pp`.
fn communicators(s: &Scenario, stage: u64) -> Vec<Communicator> {
    let p = &s.parallel;
    let mp = &p.model_parallel;
    let gpus = u64::from(s.cluster.gpus);
    let gpn = u64::from(s.cluster.gpus_per_node).max(1);
    let (tp, pp, cp, ep) = (mp.tensor, mp.pipeline, mp.context, mp.expert);
    let dp = gpus / (tp * pp).max(1);
    let copies = mp.stage_copies();
    let spans = |stride: u64, size: u64| stride * size > gpn;
    let megatron_like = matches!(p.framework, Framework::Megatron | Framework::Deepspeed);
    let mut out = Vec::new();
    let mut add = |name: String, ranks: u64, spans_nodes: bool, traffic: Traffic| {
        if ranks > 1 {
            out.push(Communicator { name, ranks, spans_nodes, traffic });
        }
    };
    add(
        format!("tensor parallel ({tp} ranks)"),
        tp,
        spans(1, tp),
        Traffic::Collectives { all_reduce: !mp.sequence_parallel },
    );
    // HYBRID_SHARD's shard group: parallel.hsdp_shard_size, or a node.
    let hsdp_shard = (p.sharding == crate::plan::Sharding::HybridShard).then(|| crate::plan::shard_group(p, gpus, gpn));
    match hsdp_shard {
        Some(shard) => {
            add(
                format!("HSDP shard group ({shard} ranks)"),
                shard,
                spans(tp, shard),
                Traffic::Collectives { all_reduce: true },
            );
            add(
                format!("HSDP replica group ({} ranks)", dp / shard),
                dp / shard,
                true,
                Traffic::Collectives { all_reduce: true },
            );
        }
        // DualPipe reduces each stage's gradients over both of its copies' data-parallel
        // ranks, on pipeline ranks k and p - 1 - k.
        _ if copies > 1 => add(
            format!("data parallel, both DualPipe copies of the stage ({} ranks)", dp * copies),
            dp * copies,
            spans(tp, dp) || spans(tp * dp, pp),
            Traffic::Collectives { all_reduce: true },
        ),
        _ => add(
            format!("data parallel ({dp} ranks)"),
            dp,
            spans(tp, dp),
            // The gradient norm's all-reduce at least; DDP's gradients.
            Traffic::Collectives { all_reduce: true },
        ),
    }
    if cp > 1 {
        let traffic = match mp.context_comm {
            crate::model::ContextComm::Ring => Traffic::PointToPoint { send_peers: 1, recv_peers: 1 },
            crate::model::ContextComm::AllGather => Traffic::Collectives { all_reduce: false },
            crate::model::ContextComm::AllToAll => Traffic::PointToPoint { send_peers: cp - 1, recv_peers: cp - 1 },
        };
        add(format!("context parallel ({cp} ranks)"), cp, spans(tp, cp), traffic);
    }
    // Megatron-Core's expert groups (`parallel_state.py`, the expert `RankGenerator`):
    // expert-tensor-parallel ranks consecutive, expert-parallel ones `etp` apart,
    // expert-data-parallel ones `etp` x `ep` apart; each its own communicator.
    let etp = mp.expert_tensor;
    if etp > 1 {
        add(
            format!("expert tensor parallel ({etp} ranks)"),
            etp,
            spans(1, etp),
            Traffic::Collectives { all_reduce: false },
        );
    }
    if ep > 1 {
        add(
            format!("expert parallel ({ep} ranks, all-to-all)"),
            ep,
            spans(etp, ep),
            Traffic::PointToPoint { send_peers: ep - 1, recv_peers: ep - 1 },
        );
    }
    if (ep > 1 || etp > 1) && p.framework == Framework::Megatron {
        let edp = mp.expert_data_parallel(gpus) * copies;
        add(
            format!("expert data parallel ({edp} ranks)"),
            edp,
            spans(etp * ep, edp / copies) || (copies > 1 && spans(tp * dp, pp)),
            Traffic::Collectives { all_reduce: true },
        );
    }
    // torchtitan's efsdp mesh (the sparse mesh's FSDP dimension, `ep` the innermost): FSDP2
    // all-gathers and reduce-scatters the routed experts over it. Under HSDP it lies inside a
    // replica's shard group; the replicas' all-reduce is taken to share the dense mesh's
    // dp_replicate communicator (same ranks).
    if p.fsdp_expert_split() {
        let efsdp = crate::plan::efsdp(p, gpus, gpn);
        add(
            format!("efsdp mesh ({efsdp} ranks, the routed experts' FSDP2 shards)"),
            efsdp,
            spans(ep, efsdp),
            Traffic::Collectives { all_reduce: false },
        );
    }
    if pp > 1 {
        let neighbours = if stage == 0 || stage + 1 == pp { 1 } else { 2 };
        let stride = tp * cp * dp;
        if p.framework == Framework::Deepspeed {
            for k in 0..neighbours {
                let with = if stage == 0 || (k == 1) { stage + 1 } else { stage - 1 };
                add(
                    format!("pipeline pair with stage {with} (2 ranks, broadcasts)"),
                    2,
                    spans(stride, 2),
                    Traffic::Collectives { all_reduce: false },
                );
            }
        } else {
            add(
                format!("pipeline ({pp} ranks, sends to {neighbours} neighbour(s))"),
                pp,
                spans(stride, pp),
                Traffic::PointToPoint { send_peers: neighbours, recv_peers: neighbours },
            );
        }
        // The embedding group all-reduces the word embedding's gradient when the last stage
        // holds a copy: a tied head's, or multi-token prediction's lookups.
        let copy = s.model.tie_embeddings || s.model.mtp.is_some();
        if megatron_like && copy && (stage == 0 || stage + 1 == pp) && !mp.schedule.is_dualpipe() {
            add(
                "embedding group (first and last stage)".into(),
                2,
                spans(stride, pp),
                Traffic::Collectives { all_reduce: true },
            );
        }
    }
    if megatron_like && tp * pp > 1 {
        add(
            format!("model parallel ({} ranks, gradient norm)", tp * pp),
            tp * pp,
            spans(1, tp * pp) || (pp > 1 && spans(tp * dp, pp)),
            Traffic::Collectives { all_reduce: true },
        );
    }
    if megatron_like && gpus > dp.max(tp).max(pp) {
        add(format!("world ({gpus} ranks, barriers)"), gpus, gpus > gpn, Traffic::Collectives { all_reduce: true });
    }
    out
}

/// The estimate for a validated scenario: the rank class (pipeline position) holding the
/// most NCCL memory.
pub fn estimate(s: &Scenario, config: NcclConfig) -> NcclEstimate {
    let modelled = s.cluster.gpu.arch != Arch::Cdna3;
    let f = fabric(&s.cluster);
    let pp = s.parallel.model_parallel.pipeline.max(1);
    let positions: Vec<u64> =
        if pp == 1 { vec![0] } else { (0..pp.min(3)).map(|k| if k == 2 { pp - 1 } else { k }).collect() };
    let mut best: Option<NcclEstimate> = None;
    for stage in positions {
        let comms: Vec<(Communicator, u64)> = if modelled {
            communicators(s, stage)
                .into_iter()
                .map(|c| {
                    let b = c.bytes(&f, &config, TreePosition::Middle);
                    (c, b)
                })
                .collect()
        } else {
            Vec::new()
        };
        let total = comms.iter().map(|c| c.1).sum::<u64>();
        let class = match (pp, stage) {
            (1, _) => "every rank".to_string(),
            (_, 0) => "pipeline stage 0".to_string(),
            (_, k) if k + 1 == pp => format!("pipeline stage {k} (last)"),
            _ => "a middle pipeline stage".to_string(),
        };
        if best.as_ref().is_none_or(|b| total > b.per_gpu) {
            best = Some(NcclEstimate { config, per_gpu: total, class, communicators: comms, modelled });
        }
    }
    best.unwrap_or(NcclEstimate { config, per_gpu: 0, class: String::new(), communicators: Vec::new(), modelled })
}
