//! What a task is, in the user's terms: step, phase, micro-batch, layer and op.

use serde::Serialize;

use crate::model::Region;

/// Training phases, as the OOM checklist names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Loading weights and creating persistent state before the first step.
    Init,
    Forward,
    /// Backward, including recomputation and gradient reduction.
    Backward,
    /// `optimizer.step()` and `zero_grad()`.
    Optimizer,
    /// Inference: the prompt's forward pass, which fills the KV cache and samples the first
    /// token.
    Prefill,
    /// Inference: one forward pass per generated token after the first, reading the cache.
    Decode,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Init => "init",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    Init,
    Forward,
    Backward,
    Recompute,
    AllGather,
    ReduceScatter,
    AllReduce,
    /// MoE token dispatch and combine over the expert-parallel group.
    AllToAll,
    /// Pipeline point-to-point transfers (activations forward, gradients backward).
    Send,
    Recv,
    Optimizer,
    ZeroGrad,
}

impl TaskKind {
    /// An NCCL collective (not a point-to-point transfer).
    pub fn is_collective(self) -> bool {
        matches!(self, TaskKind::AllGather | TaskKind::ReduceScatter | TaskKind::AllReduce | TaskKind::AllToAll)
    }

    pub fn is_comm(self) -> bool {
        matches!(
            self,
            TaskKind::AllGather
                | TaskKind::ReduceScatter
                | TaskKind::AllReduce
                | TaskKind::AllToAll
                | TaskKind::Send
                | TaskKind::Recv
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TaskLabel {
    /// 0 for initialisation, then 1, 2, ...
    pub step: u32,
    pub phase: Phase,
    pub micro_batch: u32,
    /// Op or collective, e.g. `layers.37.mlp.c_fc` or `all-gather layers.37`.
    pub what: String,
    pub kind: TaskKind,
    /// FSDP unit index (0 = root).
    pub unit: Option<usize>,
    pub region: Option<Region>,
    /// What the cost model charged the task for, shown in trace.json's event args: the
    /// kernel's FLOPs and the HBM bytes of its roofline for compute; the payload for a
    /// collective, a transfer or a copy (0 where nothing was set).
    pub flops: f64,
    pub bytes: u64,
}

impl TaskLabel {
    pub fn new(step: u32, phase: Phase, micro_batch: u32, what: String, kind: TaskKind, unit: Option<usize>) -> Self {
        TaskLabel { step, phase, micro_batch, what, kind, unit, region: None, flops: 0.0, bytes: 0 }
    }
    /// The FLOPs and bytes the task was costed for.
    pub fn with_work(mut self, flops: f64, bytes: u64) -> Self {
        self.flops = flops;
        self.bytes = bytes;
        self
    }
    pub fn with_region(mut self, r: Region) -> Self {
        self.region = Some(r);
        self
    }
    /// The transformer layer this task belongs to, if any.
    pub fn layer(&self) -> Option<u64> {
        match self.region {
            Some(Region::Block(l)) => Some(l),
            _ => self.unit.and_then(|u| u.checked_sub(1)).map(|l| l as u64),
        }
    }
}
