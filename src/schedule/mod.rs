//! Plan + DAG -> one rank's [`Program`]: initialisation, then for each step and micro-batch
//! the forward ops, the backward ops (with recomputation under activation checkpointing),
//! FSDP/ZeRO all-gathers and reduce-scatters, DDP bucket all-reduces, the optimizer step and
//! `zero_grad(set_to_none=True)`.
//!
//! Streams: `compute`, and `nccl`: every collective of the data-parallel process group in
//! the order the CPU issues it, because NCCL runs the operations of one communicator in
//! issue order even when PyTorch enqueues them from different CUDA streams (FSDP's unshard
//! and post-backward streams share the process group).
//!
//! Lifetimes follow PyTorch:
//! - a forward output no backward needs is freed after its last forward consumer; a saved
//!   one after the backward of the last op that saved it;
//! - a gradient w.r.t. an activation is allocated by the first consumer's backward and freed
//!   after its producer's backward;
//! - FSDP: a unit's gathered parameters live from its all-gather to the end of its forward
//!   (`reshard_after_forward`, never for the root unit) and again from the backward
//!   all-gather to the end of its backward; its unsharded gradients live until its
//!   reduce-scatter finishes; the sharded gradient is created by the first reduce-scatter of
//!   the step and freed by `zero_grad`;
//! - Adam's moments are created at the first `optimizer.step()` under FSDP (PyTorch creates
//!   optimizer state lazily) and at engine initialisation under DeepSpeed.

pub mod cost;
pub mod jitter;
pub mod label;

use crate::engine::{BufferSpec, Program, Task};
use crate::hardware::Cluster;
use crate::memory::Category;
use crate::model::{LayerDag, OpKind, Region, TensorKind};
use crate::net::Collective;
use crate::plan::{BackwardPrefetch, Checkpointing, Framework, OptimizerImpl, Plan, Sharding};

pub use cost::Cost;
pub use label::{Phase, TaskKind, TaskLabel};

/// A label or buffer name: formatted when the schedule keeps names, empty (no allocation)
/// for [`build_lean`].
macro_rules! text {
    ($names:expr, $($arg:tt)*) => {
        if $names { format!($($arg)*) } else { String::new() }
    };
}

pub mod pipeline;

pub const COMPUTE: u16 = 0;
pub const NCCL: u16 = 1;

/// A point in another stage's program a pipeline transfer waits for: the end of virtual
/// stage `virtual_stage`'s forward (or backward) of micro-batch `mb` in step `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Port {
    pub step: u32,
    pub mb: u32,
    pub virtual_stage: u64,
    pub forward: bool,
}

/// What one micro-batch's forward of one chunk leaves for its backward.
struct Fwd {
    free_fwd: Vec<Vec<u32>>,
    free_bwd: Vec<Vec<u32>>,
    loss_task: u32,
    gathered: Vec<Option<u32>>,
    inputs: Vec<u32>,
}

/// A rank's program with the labels its tasks point to.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub program: Program,
    /// Shared: the ranks of one program under `[jitter]` differ only in their durations.
    pub labels: std::sync::Arc<Vec<TaskLabel>>,
    /// Model FLOPs of one step (forward + backward, no recompute), for MFU.
    pub model_flops_per_step: f64,
    /// FLOPs the hardware executes per step, recompute included, for HFU.
    pub hardware_flops_per_step: f64,
}

/// Per-tensor facts that do not change between micro-batches.
#[derive(Clone, Copy)]
struct TensorPlan {
    /// Kept after forward for backward (not dropped by checkpointing).
    kept: bool,
    /// Op whose backward ends the saved tensor's life (smallest saver index).
    last_saver: Option<usize>,
    /// Last forward consumer (largest consumer index).
    last_consumer: Option<usize>,
    /// Gets a gradient (a floating-point activation produced by an op).
    needs_grad: bool,
    /// Recomputed in backward (full: block-internal saved tensor; selective: s x s scores).
    recomputed: bool,
}

struct Builder<'a> {
    dag: &'a LayerDag,
    plan: &'a Plan,
    cost: &'a Cost,
    /// The program so far; its tasks' frees are in `frees` until [`Builder::finish`].
    prog: Program,
    /// (task, buffer) for every free, in the order the builder decided them: a task's frees
    /// are often known only after later tasks are written.
    frees: Vec<(u32, u32)>,
    labels: Vec<TaskLabel>,
    tensors: Vec<TensorPlan>,
    /// For full checkpointing: per block, the ops (forward order) recomputed in backward.
    recompute_ops: Vec<Vec<usize>>,
    /// Sharded gradient buffers of the current step, per unit (created by the first reduce).
    grad_bufs: Vec<Option<u32>>,
    /// Persistent full gradients of the current step, per op (DDP / ZeRO-1 / ZeRO-2 replicated).
    op_grad_bufs: Vec<Option<u32>>,
    /// Comm tasks of the current step that the optimizer must wait for.
    step_comm: Vec<u32>,
    last_task_of_prev_step: Option<u32>,
    hw_flops: f64,
    /// Whether tasks and buffers get their names (false: [`build_lean`]).
    names: bool,
    /// Per model chunk this stage runs: its op range, the tensor it receives from the
    /// previous stage and the one it sends on, and its virtual stage index.
    chunk_ops: Vec<(usize, usize)>,
    chunk_in: Vec<Option<usize>>,
    chunk_out: Vec<Option<usize>>,
    chunk_vs: Vec<u64>,
    tp_stream: u16,
    /// Offload: host-to-device and device-to-host copies (separate copy engines, so the two
    /// directions overlap), NVMe reads and writes, and the CPU optimizer step.
    h2d_stream: u16,
    d2h_stream: u16,
    nvme_stream: u16,
    cpu_stream: u16,
    send_stream: u16,
    recv_stream: u16,
    /// Bytes of the activation crossing a stage boundary.
    p2p_bytes: u64,
    /// The last pipeline send not yet waited for, and the compute task it follows: Megatron-LM's
    /// schedules (`p2p_communication._communicate`: `batch_isend_irecv(ops)`, `req.wait()`,
    /// then a device synchronize) and DeepSpeed's pipeline engine post a stage's send together
    /// with its next receive after the compute before them, and wait for both, so the two
    /// transfers overlap each other (opposite directions of the link) but not compute.
    pending_send: Option<(u32, u32)>,
    /// Tasks other stages' transfers wait for, and the transfers that wait.
    ready: std::collections::HashMap<Port, u32>,
    ext_deps: Vec<(u32, Port)>,
}

/// Builds the program of one rank (all ranks of a DP group run the same program).
pub fn build(dag: &LayerDag, plan: &Plan, cluster: &Cluster) -> Schedule {
    build_with(dag, plan, cluster, true, plan.training.steps)
}

/// The same program as [`build`] (tasks, durations, dependencies, buffers and their sizes and
/// categories, label steps, phases, kinds, units and regions), without the text: every
/// label's `what` is empty and every buffer points to one empty name. For callers that need
/// the verdict and the numbers, not the story (sweeps); formatting thousands of names is a
/// large part of building a schedule.
pub fn build_lean(dag: &LayerDag, plan: &Plan, cluster: &Cluster) -> Schedule {
    build_with(dag, plan, cluster, false, plan.training.steps)
}

/// The first `steps` steps (0: initialisation only) of [`build_lean`]'s program: the same
/// tasks, in the same order, as far as they go. Every task of step k + 1 waits (directly or
/// through its stream) for the `zero_grad()` that ends step k, so up to the end of step
/// `steps` the prefix runs exactly as the whole program does: an OOM within it is the whole
/// program's OOM.
pub fn build_lean_prefix(dag: &LayerDag, plan: &Plan, cluster: &Cluster, steps: u32) -> Schedule {
    build_with(dag, plan, cluster, false, steps.min(plan.training.steps))
}

/// The first `steps` steps of one rank's program, with (`names`) or without the text of its
/// labels and buffer names.
pub fn build_with(dag: &LayerDag, plan: &Plan, cluster: &Cluster, names: bool, steps: u32) -> Schedule {
    let cost = Cost::for_plan(cluster, plan);
    let mut b = Builder::new(dag, plan, &cost, names);
    b.reserve(steps);
    b.init();
    for step in 1..=steps {
        b.step(step);
    }
    let tp = plan.parallel.model_parallel.tensor as f64;
    let per_mb = match dag.lora {
        // LoRA: what a frozen base really costs (no weight-gradient GEMMs), not 3 x forward.
        Some(_) => dag.ops.iter().map(|o| o.fwd_flops + o.bwd_flops).sum::<f64>(),
        None => 3.0 * dag.model_forward_flops() / tp,
    };
    let model_flops = per_mb * plan.training.grad_accum as f64;
    let hw = b.hw_flops / steps.max(1) as f64;
    Schedule {
        program: b.finish(),
        labels: b.labels.into(),
        model_flops_per_step: model_flops,
        hardware_flops_per_step: hw,
    }
}

impl<'a> Builder<'a> {
    fn new(dag: &'a LayerDag, plan: &'a Plan, cost: &'a Cost, names: bool) -> Self {
        let n = dag.tensors.len();
        let ck = plan.training.checkpointing;
        let mut tensors: Vec<TensorPlan> = (0..n)
            .map(|t| TensorPlan {
                kept: false,
                last_saver: None,
                last_consumer: None,
                needs_grad: dag.tensors[t].kind == TensorKind::Activation && dag.tensors[t].producer.is_some(),
                recomputed: false,
            })
            .collect();
        for (i, op) in dag.ops.iter().enumerate() {
            for &t in &op.inputs {
                let tp = &mut tensors[t];
                tp.last_consumer = Some(tp.last_consumer.map_or(i, |c| c.max(i)));
            }
            for &t in &op.saves {
                let tp = &mut tensors[t];
                tp.last_saver = Some(tp.last_saver.map_or(i, |c| c.min(i)));
            }
        }
        // Which saved tensors survive the forward pass.
        for op in &dag.ops {
            for &t in &op.saves {
                let producer_region = dag.tensors[t].producer.map(|p| dag.ops[p].region);
                let internal = matches!(op.region, Region::Block(_)) && producer_region == Some(op.region);
                let dropped = match ck {
                    Checkpointing::None => false,
                    Checkpointing::Full => internal,
                    Checkpointing::Selective => dag.tensors[t].kind == TensorKind::AttentionScores,
                };
                if dropped {
                    tensors[t].recomputed = true;
                } else {
                    tensors[t].kept = true;
                }
            }
        }
        // A tensor kept by one saver is not recomputed for another.
        for tp in tensors.iter_mut() {
            if tp.kept {
                tp.recomputed = false;
            }
        }
        let mut recompute_ops = vec![Vec::new(); dag.config.n_layers as usize];
        if ck == Checkpointing::Full {
            // Each block's ops in forward order, gathered in one pass over the DAG.
            let mut block_ops: Vec<Vec<usize>> = vec![Vec::new(); dag.config.n_layers as usize];
            for (i, op) in dag.ops.iter().enumerate() {
                if let Region::Block(l) = op.region {
                    if let Some(v) = block_ops.get_mut(l as usize) {
                        v.push(i);
                    }
                }
            }
            for (l, ops) in block_ops.iter_mut().enumerate() {
                let last = ops.iter().rposition(|&i| dag.ops[i].outputs.iter().any(|&t| tensors[t].recomputed));
                if let Some(last) = last {
                    ops.truncate(last + 1);
                    recompute_ops[l] = std::mem::take(ops);
                }
            }
        }
        let nu = plan.units.len();
        // Each stream with the links its transfers occupy (engine::links): offload copies use
        // one PCIe direction each; compute, NVMe and the CPU none.
        let mut prog = Program {
            streams: vec!["compute".into(), "nccl".into()],
            stream_links: vec![0, cost.nccl_links()],
            ..Default::default()
        };
        let mp = &plan.parallel.model_parallel;
        let mut stream = |name: &str, on: bool, links: u8| {
            if on {
                prog.streams.push(name.into());
                prog.stream_links.push(links);
                (prog.streams.len() - 1) as u16
            } else {
                u16::MAX
            }
        };
        use crate::engine::links::{PCIE_D2H, PCIE_H2D};
        let tp_stream = stream("tp", mp.tensor > 1, cost.tp_links());
        let off = plan.parallel.offload.as_ref();
        let offload = off.is_some();
        let h2d_stream = stream("h2d", offload, PCIE_H2D);
        let d2h_stream = stream("d2h", offload, PCIE_D2H);
        let nvme_stream = stream("nvme", off.is_some_and(|o| o.uses_nvme()), 0);
        let cpu_stream = stream("cpu", offload, 0);
        let send_stream = stream("p2p send", mp.pipeline > 1, cost.p2p_links(true));
        let recv_stream = stream("p2p recv", mp.pipeline > 1, cost.p2p_links(false));
        let mut chunk_ops = Vec::new();
        let (mut chunk_in, mut chunk_out, mut chunk_vs) = (Vec::new(), Vec::new(), Vec::new());
        let mut p2p_bytes = 0;
        for ch in &plan.chunks {
            let lo = dag.ops.iter().position(|o| ch.holds(o.region)).unwrap_or(0);
            let hi = dag.ops.iter().rposition(|o| ch.holds(o.region)).map_or(lo, |i| i + 1);
            let x_in = dag.ops[lo..hi]
                .iter()
                .flat_map(|o| o.inputs.iter().copied())
                .find(|&t| dag.tensors[t].producer.is_some_and(|p| p < lo));
            let x_out = (lo..hi)
                .flat_map(|i| dag.ops[i].outputs.iter().copied())
                .find(|&t| tensors[t].last_consumer.is_some_and(|c| c >= hi));
            if let Some(x) = x_in.or(x_out) {
                p2p_bytes = dag.tensors[x].bytes;
            }
            chunk_ops.push((lo, hi));
            chunk_in.push(x_in);
            chunk_out.push(x_out);
            chunk_vs.push(ch.virtual_stage);
        }
        if !names {
            prog.names.push(String::new());
        }
        Builder {
            dag,
            plan,
            cost,
            prog,
            frees: Vec::new(),
            labels: Vec::new(),
            tensors,
            recompute_ops,
            grad_bufs: vec![None; nu],
            op_grad_bufs: vec![None; dag.ops.len()],
            step_comm: Vec::new(),
            last_task_of_prev_step: None,
            hw_flops: 0.0,
            names,
            chunk_ops,
            chunk_in,
            chunk_out,
            chunk_vs,
            tp_stream,
            h2d_stream,
            d2h_stream,
            nvme_stream,
            cpu_stream,
            send_stream,
            recv_stream,
            p2p_bytes,
            pending_send: None,
            ready: Default::default(),
            ext_deps: Vec::new(),
        }
    }

    /// Room for the tasks, labels and buffers of `steps` steps (an estimate: forward,
    /// backward and recompute per op, three collectives per unit, per micro-batch), so the
    /// tables are not copied as they grow.
    fn reserve(&mut self, steps: u32) {
        // A pipeline stage runs only its chunks' ops. (Reserving for all of them would ask
        // for several times the room, so large that the memory allocator maps it fresh, and
        // pays a page fault for each page, at every build.)
        let nops = match self.chunk_ops.as_slice() {
            [] => self.dag.ops.len(),
            chunks => chunks.iter().map(|&(lo, hi)| hi - lo).sum(),
        };
        let nu = self.plan.units.len();
        let mbs = steps as usize * self.plan.training.grad_accum as usize;
        let tasks = 3 * nu + 8 + mbs * (3 * nops + 3 * nu) + 4 * steps as usize;
        self.prog.tasks.reserve(tasks);
        self.labels.reserve(tasks);
        let buffers = 4 * nu + 8 + mbs * (3 * nops + 2 * nu);
        self.prog.deps.reserve(tasks, 2 * tasks);
        self.prog.alloc.reserve(tasks, buffers);
        self.frees.reserve(buffers);
        self.prog.buffers.reserve(buffers);
        if self.names {
            self.prog.names.reserve(buffers);
        }
    }

    fn buffer(&mut self, bytes: u64, category: Category, name: String) -> u32 {
        if self.names {
            self.prog.names.push(name);
        }
        self.prog.buffers.push(BufferSpec { bytes, category, name: (self.prog.names.len() - 1) as u32 });
        (self.prog.buffers.len() - 1) as u32
    }

    /// A backward all-reduce of `bytes` on the NCCL queue after task `after`, over all
    /// data-parallel ranks or (`replica`) the cross-node replicas of hybrid sharding; the
    /// optimizer step waits for it.
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_after(&mut self, step: u32, mb: u32, u: usize, after: u32, replica: bool, bytes: u64, what: String) {
        let group = if replica { &self.cost.replica_group } else { &self.cost.dp_group };
        let secs = self.cost.collective_s(group, Collective::AllReduce, bytes);
        let label = TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::AllReduce, Some(u));
        let ar = self.task(NCCL, secs, vec![after], vec![], label);
        self.step_comm.push(ar);
    }

    fn task(&mut self, stream: u16, seconds: f64, deps: Vec<u32>, alloc: Vec<u32>, label: TaskLabel) -> u32 {
        self.labels.push(label);
        let task = Task { stream, duration_ns: cost::ns(seconds), label: (self.labels.len() - 1) as u32 };
        self.prog.tasks.push(task);
        self.prog.deps.push(&deps);
        self.prog.alloc.push(&alloc);
        (self.prog.tasks.len() - 1) as u32
    }

    /// `task` frees `bufs` when it ends (after the frees given it before).
    fn free_at(&mut self, task: u32, bufs: &[u32]) {
        self.frees.extend(bufs.iter().map(|&b| (task, b)));
    }

    /// The finished program, its frees filed under their tasks.
    fn finish(&mut self) -> Program {
        let mut prog = std::mem::take(&mut self.prog);
        prog.free = crate::engine::TaskLists::from_pairs(prog.tasks.len(), &self.frees);
        prog
    }

    fn pr(&self) -> &crate::plan::Precision {
        &self.plan.training.precision
    }

    /// Initialisation: parameters (loaded unit by unit, so an OOM names the layer), master
    /// weights, module buffers, DDP buckets, and DeepSpeed's optimizer state.
    fn init(&mut self) {
        let plan = self.plan;
        let pbytes = self.pr().param.bytes();
        let lbl = |what: String, unit: Option<usize>| TaskLabel::new(0, Phase::Init, 0, what, TaskKind::Init, unit);
        // Offloaded parameters stay on the host (or NVMe) between uses.
        let on_gpu = !plan.params_offloaded();
        for u in 0..plan.units.len() {
            let el = plan.local(u, plan.params_sharded);
            let name = text!(self.names, "{} parameters ({})", plan.units[u].name, self.pr().param.name());
            let mut alloc = Vec::new();
            if on_gpu {
                alloc.push(self.buffer(el * pbytes, Category::Parameters, name.clone()));
            }
            let un = &plan.units[u];
            let frozen = if plan.params_sharded { un.frozen_shard_bytes } else { un.frozen_bytes };
            if frozen > 0 {
                let what = text!(self.names, "{} frozen base weights", un.name);
                alloc.push(self.buffer(frozen, Category::Parameters, what));
            }
            self.task(COMPUTE, 0.0, vec![], alloc, lbl(text!(self.names, "load {}", plan.units[u].name), Some(u)));
        }
        let offload = plan.parallel.offload.is_some();
        if let Some(m) = self.pr().master.filter(|_| !offload) {
            for u in 0..plan.units.len() {
                let el = plan.local(u, plan.optimizer_sharded);
                let b = self.buffer(
                    el * m.bytes(),
                    Category::MasterWeights,
                    text!(self.names, "{} master weights ({})", plan.units[u].name, m.name()),
                );
                self.task(
                    COMPUTE,
                    0.0,
                    vec![],
                    vec![b],
                    lbl(text!(self.names, "master weights of {}", plan.units[u].name), Some(u)),
                );
            }
        }
        if self.dag.buffer_bytes > 0 {
            let b = self.buffer(
                self.dag.buffer_bytes,
                Category::Buffers,
                text!(self.names, "rotary cos/sin tables (fp32)"),
            );
            self.task(COMPUTE, 0.0, vec![], vec![b], lbl(text!(self.names, "module buffers"), None));
        }
        if plan.parallel.sharding == Sharding::None
            && plan.dp > 1
            && !plan.parallel.gradient_as_bucket_view
            && plan.pipeline() == 1
        {
            let bytes = plan.total_params() * self.pr().grad.bytes();
            let b = self.buffer(
                bytes,
                Category::CommBuffers,
                text!(self.names, "DDP gradient buckets (gradient_as_bucket_view=False)"),
            );
            self.task(COMPUTE, 0.0, vec![], vec![b], lbl(text!(self.names, "DDP reducer buckets"), None));
        }
        if plan.parallel.framework == Framework::Deepspeed && !offload {
            for u in 0..plan.units.len() {
                let b = self.optimizer_state_buffer(u);
                self.task(
                    COMPUTE,
                    0.0,
                    vec![],
                    vec![b],
                    lbl(text!(self.names, "optimizer state of {}", plan.units[u].name), Some(u)),
                );
            }
        }
        self.last_task_of_prev_step = self.prog.tasks.len().checked_sub(1).map(|t| t as u32);
    }

    fn optimizer_state_buffer(&mut self, u: usize) -> u32 {
        let plan = self.plan;
        let el = plan.local(u, plan.optimizer_sharded);
        let tr = &plan.training;
        let bytes = el * tr.states_per_param() * tr.precision.optimizer_state.bytes();
        let name = text!(
            self.names,
            "{} optimizer state ({} x {})",
            plan.units[u].name,
            tr.states_per_param(),
            tr.precision.optimizer_state.name()
        );
        self.buffer(bytes, Category::OptimizerState, name)
    }

    fn step(&mut self, step: u32) {
        self.grad_bufs.iter_mut().for_each(|g| *g = None);
        self.op_grad_bufs.iter_mut().for_each(|g| *g = None);
        self.step_comm.clear();
        for mb in 0..self.plan.training.grad_accum {
            self.micro_batch(step, mb as u32, mb + 1 == self.plan.training.grad_accum);
        }
        self.optimizer(step);
    }

    fn unit_gathered_bytes(&self, u: usize) -> u64 {
        let un = &self.plan.units[u];
        un.shard_params * self.plan.shard_group * self.pr().compute.bytes()
            + un.frozen_shard_bytes * self.plan.shard_group
    }

    fn gather(&mut self, step: u32, mb: u32, phase: Phase, u: usize, deps: Vec<u32>) -> (u32, u32) {
        let bytes = self.unit_gathered_bytes(u);
        let name = text!(
            self.names,
            "{} gathered for {} ({})",
            self.plan.units[u].name,
            phase.name(),
            self.pr().compute.name()
        );
        let (deps, staging) = match &self.plan.parallel.offload {
            Some(off) if off.parameters.is_some() => self.fetch_offloaded(step, mb, phase, u, deps, off),
            _ => (deps, Vec::new()),
        };
        let b = self.buffer(bytes, Category::GatheredParameters, name);
        let secs = self.cost.collective_s(&self.cost.shard_group, Collective::AllGather, bytes);
        let what = text!(self.names, "all-gather {}", self.plan.units[u].name);
        let t =
            self.task(NCCL, secs, deps, vec![b], TaskLabel::new(step, phase, mb, what, TaskKind::AllGather, Some(u)));
        self.free_at(t, &staging);
        (t, b)
    }

    /// Parameter offload: the unit's partition comes to the GPU before its all-gather (from
    /// NVMe through the host first, for ZeRO-Infinity). Returns the all-gather's dependencies
    /// and the GPU buffers it frees.
    ///
    /// DeepSpeed copies its 16-bit partition into a GPU buffer. FSDP's `pre_unshard` copies
    /// the shard in the parameter dtype (FP32) with `non_blocking=True`, so PyTorch's `copy_`
    /// lands it in a temporary of that dtype on the GPU and casts it there into the
    /// low-precision `_mp_shard` (`Copy.cu`: conversions of non-blocking copies happen on the
    /// GPU), which the all-gather then reads.
    fn fetch_offloaded(
        &mut self,
        step: u32,
        mb: u32,
        phase: Phase,
        u: usize,
        mut deps: Vec<u32>,
        off: &crate::plan::OffloadConfig,
    ) -> (Vec<u32>, Vec<u32>) {
        let plan = self.plan;
        let el = plan.units[u].shard_params;
        let (pb, cb) = (self.pr().param.bytes(), self.pr().compute.bytes());
        let name = &plan.units[u].name;
        let label = |what: String, kind| TaskLabel::new(step, phase, mb, what, kind, Some(u));
        if off.parameters == Some(crate::plan::OffloadDevice::Nvme) {
            let what = text!(self.names, "read {name} partition from NVMe");
            deps = vec![self.nvme(true, el * pb, deps, off, label(what, TaskKind::Recv))];
        }
        let copy = self.buffer(
            el * pb,
            Category::CommBuffers,
            text!(self.names, "{name} partition copied to the GPU ({})", self.pr().param.name()),
        );
        // FSDP under mixed precision casts the copy into the _mp_shard the all-gather reads;
        // the FP32 temporary dies with the cast, at the copy's end.
        let cast = plan.parallel.framework == Framework::Fsdp && pb != cb;
        let gathered_from = if cast {
            let name = text!(self.names, "{name} _mp_shard ({})", self.pr().compute.name());
            self.buffer(el * cb, Category::CommBuffers, name)
        } else {
            copy
        };
        let alloc = if cast { vec![copy, gathered_from] } else { vec![copy] };
        let what = text!(self.names, "copy {name} partition to the GPU ({}, H2D)", self.pr().param.name());
        let secs = (el * pb) as f64 / off.h2d_bytes_per_s;
        let h = self.task(self.h2d_stream, secs, deps, alloc, label(what, TaskKind::Recv));
        if cast {
            self.free_at(h, &[copy]);
        }
        (vec![h], vec![gathered_from])
    }

    /// An NVMe transfer of `bytes` (a read, or a write) at this GPU's share of the node's
    /// NVMe bandwidth, after `deps`.
    fn nvme(
        &mut self,
        read: bool,
        bytes: u64,
        deps: Vec<u32>,
        off: &crate::plan::OffloadConfig,
        label: TaskLabel,
    ) -> u32 {
        let rate = if read { off.nvme_read_bytes_per_s } else { off.nvme_write_bytes_per_s };
        self.task(self.nvme_stream, bytes as f64 / rate, deps, vec![], label)
    }

    fn micro_batch(&mut self, step: u32, mb: u32, last_mb: bool) {
        let f = self.forward(step, mb, 0);
        self.backward(step, mb, 0, f, last_mb);
    }

    /// A tensor-parallel collective of op `op` on the TP stream after task `after`.
    #[allow(clippy::too_many_arguments)]
    fn tp_task(
        &mut self,
        step: u32,
        phase: Phase,
        mb: u32,
        op: &crate::model::Op,
        coll: Collective,
        after: u32,
        alloc: Vec<u32>,
        recompute: bool,
    ) -> u32 {
        let bytes = op.comm.map_or(0, |c| c.bytes);
        let secs = self.cost.collective_s(&self.cost.tp_group, coll, bytes);
        let kind = match coll {
            Collective::AllGather => TaskKind::AllGather,
            Collective::ReduceScatter => TaskKind::ReduceScatter,
            Collective::AllReduce => TaskKind::AllReduce,
        };
        let what = match (recompute, phase) {
            (true, _) => text!(self.names, "{} (recompute)", op.name),
            (false, Phase::Backward) => text!(self.names, "{} (backward)", op.name),
            _ => text!(self.names, "{}", op.name),
        };
        let u = self.plan.unit_of(op.region);
        let label = TaskLabel::new(step, phase, mb, what, kind, Some(u)).with_region(op.region);
        self.task(self.tp_stream, secs, vec![after], alloc, label)
    }

    /// One pipeline point-to-point transfer (send or receive side) of `bytes`.
    /// The previous send, posted with this chunk's receive: the compute task the receive is
    /// posted after, and what the chunk's first compute waits for (the send).
    fn take_prior_send(&mut self) -> (Option<u32>, Vec<u32>) {
        let prior = self.pending_send.take();
        (prior.map(|p| p.1), prior.map(|p| p.0).into_iter().collect())
    }

    /// A send blocks the stage's next compute (and is posted with its next receive) unless
    /// p2p communication overlaps compute.
    fn block_on_send(&mut self, send: u32, after: u32) {
        if !self.plan.parallel.model_parallel.overlap_p2p {
            self.pending_send = Some((send, after));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn p2p_task(
        &mut self,
        stream: u16,
        step: u32,
        phase: Phase,
        mb: u32,
        deps: Vec<u32>,
        alloc: Vec<u32>,
        what: String,
    ) -> u32 {
        let tp = self.plan.parallel.model_parallel.tensor;
        let bytes = self.p2p_bytes;
        // Megatron's scatter/gather optimisation (Narayanan et al. 2021, Sec. 4.1): without
        // sequence parallelism each tensor-parallel rank sends 1/t of the (replicated)
        // activation and the receivers all-gather it over NVLink.
        let secs = if tp > 1 && !self.plan.parallel.model_parallel.sequence_parallel {
            self.cost.p2p_s(bytes / tp) + self.cost.collective_s(&self.cost.tp_group, Collective::AllGather, bytes)
        } else {
            self.cost.p2p_s(bytes)
        };
        let kind = if stream == self.send_stream { TaskKind::Send } else { TaskKind::Recv };
        self.task(stream, secs, deps, alloc, TaskLabel::new(step, phase, mb, what, kind, None))
    }

    /// Gradient buffers for the inputs of `op` that need one and have none yet: autograd
    /// creates an activation's gradient at the backward of its first consumer (in backward
    /// order), whether that is a kernel or a tensor-parallel collective.
    fn input_grads(&mut self, op: &crate::model::Op, mb: u32, grad_buf: &mut [Option<u32>]) -> Vec<u32> {
        let mut alloc = Vec::new();
        for &t in &op.inputs {
            if self.tensors[t].needs_grad && grad_buf[t].is_none() {
                let b = self.buffer(
                    self.dag.tensors[t].bytes,
                    Category::ActivationGradients,
                    text!(self.names, "grad of {} (micro-batch {mb})", self.dag.tensors[t].name),
                );
                grad_buf[t] = Some(b);
                alloc.push(b);
            }
        }
        alloc
    }

    fn forward(&mut self, step: u32, mb: u32, c: usize) -> Fwd {
        let dag = self.dag;
        let plan = self.plan;
        let (lo, hi) = self.chunk_ops[c];
        let nops = dag.ops.len();
        let nunits = plan.units.len();
        let cb = self.pr().compute.bytes();
        let casts = !plan.params_sharded && self.pr().param != self.pr().compute;
        let mut free_fwd: Vec<Vec<u32>> = vec![Vec::new(); nops];
        let mut free_bwd: Vec<Vec<u32>> = vec![Vec::new(); nops];
        let mut loss_task = 0u32;
        let mut gathered: Vec<Option<u32>> = vec![None; nunits];
        let mut ag_fwd_task: Vec<Option<u32>> = vec![None; nunits];
        let mut unit_last_fwd: Vec<Option<u32>> = vec![None; nunits];
        let step_dep = self.last_task_of_prev_step;
        // A collective (or receive) the next compute op waits for.
        let mut pending: Option<u32> = None;
        let (recv_after, mut first_deps) = self.take_prior_send();

        // ---- forward
        let wanted: Vec<usize> =
            dag.inputs.iter().copied().filter(|&t| dag.ops[lo..hi].iter().any(|o| o.inputs.contains(&t))).collect();
        let inputs: Vec<u32> = wanted
            .iter()
            .map(|&t| {
                self.buffer(
                    dag.tensors[t].bytes,
                    Category::Inputs,
                    text!(self.names, "{} (micro-batch {mb})", dag.tensors[t].name),
                )
            })
            .collect();
        let vs = self.chunk_vs[c];
        // A later pipeline stage receives its input activation from the previous one.
        if let Some(x) = self.chunk_in[c] {
            let tp = self.tensors[x];
            let b = self.buffer(
                dag.tensors[x].bytes,
                Category::Activations,
                text!(self.names, "{} received (micro-batch {mb})", dag.tensors[x].name),
            );
            if tp.kept {
                free_bwd[tp.last_saver.unwrap_or(lo)].push(b);
            } else {
                free_fwd[tp.last_consumer.unwrap_or(lo)].push(b);
            }
            let what = text!(self.names, "recv activation from virtual stage {} (micro-batch {mb})", vs - 1);
            let deps: Vec<u32> = step_dep.into_iter().chain(recv_after).collect();
            let t = self.p2p_task(self.recv_stream, step, Phase::Forward, mb, deps, vec![b], what);
            self.ext_deps.push((t, Port { step, mb, virtual_stage: vs - 1, forward: true }));
            pending = Some(t);
        }
        let mut out_buf = None;
        let mut prev_region: Option<Region> = None;
        for i in lo..hi {
            let op = &dag.ops[i];
            let u = plan.unit_of(op.region);
            if let Some(comm) = op.comm {
                // Tensor-parallel collective: on the TP stream, after the op before it.
                if let Some(coll) = comm.forward {
                    let mut alloc = Vec::new();
                    for &t in &op.outputs {
                        let tp = self.tensors[t];
                        let b = self.buffer(
                            dag.tensors[t].bytes,
                            Category::Transient,
                            text!(self.names, "{} (micro-batch {mb})", dag.tensors[t].name),
                        );
                        alloc.push(b);
                        if tp.kept {
                            free_bwd[tp.last_saver.unwrap_or(i)].push(b);
                        } else {
                            free_fwd[tp.last_consumer.unwrap_or(i).max(i)].push(b);
                        }
                    }
                    let t = self.tp_task(step, Phase::Forward, mb, op, coll, loss_task, alloc, false);
                    let f = std::mem::take(&mut free_fwd[i]);
                    self.free_at(t, &f);
                    pending = Some(t);
                }
                continue;
            }
            let mut deps = Vec::new();
            let mut alloc = Vec::new();
            deps.extend(pending.take());
            deps.append(&mut first_deps);
            if i == lo {
                alloc.extend_from_slice(&inputs);
                if let Some(d) = step_dep {
                    deps.push(d);
                }
            }
            if prev_region != Some(op.region) && plan.params_sharded && gathered[u].is_none() {
                // FSDP pre-forward: all-gather this unit. With limit_all_gathers the CPU waits
                // until at most one other gathered block is outstanding.
                let mut agdeps: Vec<u32> = step_dep.into_iter().collect();
                if plan.parallel.limit_all_gathers {
                    if let Region::Block(l) = op.region {
                        if l >= 2 {
                            if let Some(t) = unit_last_fwd[u - 2] {
                                agdeps.push(t);
                            }
                        }
                    }
                }
                let (t, b) = self.gather(step, mb, Phase::Forward, u, agdeps);
                gathered[u] = Some(b);
                ag_fwd_task[u] = Some(t);
            }
            if let Some(t) = ag_fwd_task[u] {
                if prev_region != Some(op.region) {
                    deps.push(t);
                }
            }
            prev_region = Some(op.region);
            for &t in &op.outputs {
                let tp = self.tensors[t];
                let cat = if tp.kept { Category::Activations } else { Category::Transient };
                let b = self.buffer(
                    dag.tensors[t].bytes,
                    cat,
                    text!(self.names, "{} (micro-batch {mb})", dag.tensors[t].name),
                );
                alloc.push(b);
                if self.chunk_out[c] == Some(t) {
                    // Sent to the next stage, then freed (Megatron deallocates pipeline outputs).
                    out_buf = Some(b);
                } else if tp.kept {
                    free_bwd[tp.last_saver.unwrap_or(i)].push(b);
                } else {
                    free_fwd[tp.last_consumer.unwrap_or(i).max(i)].push(b);
                }
            }
            let mut frees_now = Vec::new();
            if op.fwd_scratch > 0 {
                let b = self.buffer(op.fwd_scratch, Category::Transient, text!(self.names, "{} scratch", op.name));
                alloc.push(b);
                frees_now.push(b);
            }
            if casts && op.kind == OpKind::Linear {
                // Autocast casts the weight for the matmul, which saves the cast copy.
                let b = self.buffer(
                    (op.params + op.shared_params) * cb,
                    Category::GatheredParameters,
                    text!(self.names, "{} weight cast ({})", op.name, self.pr().compute.name()),
                );
                alloc.push(b);
                if plan.training.checkpointing == Checkpointing::Full && matches!(op.region, Region::Block(_)) {
                    frees_now.push(b);
                } else {
                    free_bwd[i].push(b);
                }
            }
            let secs = self.cost.forward_s(op);
            self.hw_flops += op.fwd_flops;
            let t = self.task(
                COMPUTE,
                secs,
                deps,
                alloc,
                TaskLabel::new(step, Phase::Forward, mb, text!(self.names, "{}", op.name), TaskKind::Forward, Some(u))
                    .with_region(op.region),
            );
            loss_task = t;
            let mut f = std::mem::take(&mut free_fwd[i]);
            f.extend(frees_now);
            self.free_at(t, &f);
            unit_last_fwd[u] = Some(t);
            // End of a block's forward: reshard.
            let region_ends = i + 1 == hi || dag.ops[i + 1].region != op.region;
            if region_ends {
                if let (Region::Block(_), Some(g)) = (op.region, gathered[u]) {
                    // Otherwise (SHARD_GRAD_OP) it stays gathered until its backward ends.
                    if plan.reshard_after_forward {
                        self.free_at(t, &[g]);
                        gathered[u] = None;
                    }
                }
            }
        }
        // The last forward task is the loss (or the chunk's output, sent on).
        if let Some(b) = out_buf {
            let what = text!(self.names, "send activation to virtual stage {} (micro-batch {mb})", vs + 1);
            let t = self.p2p_task(self.send_stream, step, Phase::Forward, mb, vec![loss_task], vec![], what);
            self.free_at(t, &[b]);
            self.block_on_send(t, loss_task);
        }
        self.ready.insert(Port { step, mb, virtual_stage: vs, forward: true }, loss_task);
        Fwd { free_fwd, free_bwd, loss_task, gathered, inputs }
    }

    fn backward(&mut self, step: u32, mb: u32, c: usize, fwd: Fwd, last_mb: bool) {
        let dag = self.dag;
        let plan = self.plan;
        let (lo, hi) = self.chunk_ops[c];
        let nunits = plan.units.len();
        let cb = self.pr().compute.bytes();
        let casts = !plan.params_sharded && self.pr().param != self.pr().compute;
        let Fwd { mut free_fwd, mut free_bwd, loss_task, mut gathered, inputs } = fwd;
        let vs = self.chunk_vs[c];
        let mut pending: Option<u32> = None;
        let (recv_after, mut first_deps) = self.take_prior_send();
        // Column-parallel linears: the last input-gradient GEMM, and the all-gather of a
        // sequence-parallel input the weight-gradient GEMM waits for.
        let mut dgrad: Option<u32> = None;
        let mut regather: Option<u32> = None;
        // ---- backward
        let mut grad_buf: Vec<Option<u32>> = vec![None; dag.tensors.len()];
        if let Some(y) = self.chunk_out[c] {
            // The gradient of this chunk's output arrives from the next stage.
            let b = self.buffer(
                dag.tensors[y].bytes,
                Category::ActivationGradients,
                text!(self.names, "grad of {} received (micro-batch {mb})", dag.tensors[y].name),
            );
            grad_buf[y] = Some(b);
            let what = text!(self.names, "recv gradient from virtual stage {} (micro-batch {mb})", vs + 1);
            let deps = recv_after.into_iter().collect();
            let t = self.p2p_task(self.recv_stream, step, Phase::Backward, mb, deps, vec![b], what);
            self.ext_deps.push((t, Port { step, mb, virtual_stage: vs + 1, forward: false }));
            pending = Some(t);
        }
        let mut unit_grads: Vec<Vec<u32>> = vec![Vec::new(); nunits];
        let mut ag_bwd_task: Vec<Option<u32>> = vec![None; nunits];
        let mut bwd_last_of_unit: Vec<Option<u32>> = vec![None; nunits];
        let mut ddp_bucket = 0u64;
        let mut tied_grad_done = false;
        let nblocks = dag.config.n_layers as usize;
        let resharded = |u: usize| plan.params_sharded && plan.reshard_after_forward && u > 0;
        let prefetch = plan.parallel.backward_prefetch;
        let mut prev_region: Option<Region> = None;
        let mut last_bwd_task = loss_task;
        for i in (lo..hi).rev() {
            let op = &dag.ops[i];
            let u = plan.unit_of(op.region);
            if let Some(comm) = op.comm {
                if let Some(coll) = comm.backward {
                    let mut alloc = self.input_grads(op, mb, &mut grad_buf);
                    if comm.backward_buffer > 0 {
                        let b = self.buffer(
                            comm.backward_buffer,
                            Category::CommBuffers,
                            text!(self.names, "{} buffer (micro-batch {mb})", op.name),
                        );
                        alloc.push(b);
                        free_bwd[comm.backward_buffer_until.unwrap_or(i)].push(b);
                    }
                    let regathers = comm.backward_buffer > 0;
                    // The input-gradient collective starts after the input-gradient GEMM.
                    let after = if regathers { None } else { dgrad.take() };
                    let after = after.or(pending.take()).unwrap_or(last_bwd_task);
                    let t = self.tp_task(step, Phase::Backward, mb, op, coll, after, alloc, false);
                    let mut f = std::mem::take(&mut free_bwd[i]);
                    f.extend(op.outputs.iter().filter_map(|&o| grad_buf[o]));
                    self.free_at(t, &f);
                    if regathers {
                        // Only the weight-gradient GEMMs need the re-gathered input.
                        regather = Some(t);
                    } else {
                        pending = Some(t);
                    }
                }
                continue;
            }
            let mut deps = Vec::new();
            deps.extend(pending.take());
            deps.append(&mut first_deps);
            if prev_region != Some(op.region) {
                if let Region::Block(l) = op.region {
                    let l = l as usize;
                    // Pre-backward of block l: make sure it is gathered, prefetch l-1 (PRE).
                    if resharded(u) && ag_bwd_task[u].is_none() {
                        let (t, b) = self.gather(step, mb, Phase::Backward, u, vec![last_bwd_task]);
                        ag_bwd_task[u] = Some(t);
                        gathered[u] = Some(b);
                    }
                    if prefetch == BackwardPrefetch::Pre && l >= 1 && resharded(u - 1) && ag_bwd_task[u - 1].is_none() {
                        let (t, b) = self.gather(step, mb, Phase::Backward, u - 1, vec![last_bwd_task]);
                        ag_bwd_task[u - 1] = Some(t);
                        gathered[u - 1] = Some(b);
                    }
                    if let Some(t) = ag_bwd_task[u] {
                        deps.push(t);
                    }
                    // Full checkpointing: recompute the block's forward first.
                    let rops = self.recompute_ops[l].clone();
                    let mut rpending: Option<u32> = None;
                    for (k, &ri) in rops.iter().enumerate() {
                        let rop = &dag.ops[ri];
                        if rop.comm.is_some_and(|c| c.forward.is_none()) {
                            continue;
                        }
                        let mut alloc = Vec::new();
                        let mut frees = Vec::new();
                        for &t in &rop.outputs {
                            let tp = self.tensors[t];
                            if tp.recomputed {
                                let b = self.buffer(
                                    dag.tensors[t].bytes,
                                    Category::Recomputed,
                                    text!(self.names, "{} (recomputed, micro-batch {mb})", dag.tensors[t].name),
                                );
                                alloc.push(b);
                                free_bwd[tp.last_saver.unwrap_or(ri)].push(b);
                            } else if !tp.kept {
                                // Needed only by later recomputed ops.
                                let b = self.buffer(
                                    dag.tensors[t].bytes,
                                    Category::Transient,
                                    text!(self.names, "{} (recompute transient)", dag.tensors[t].name),
                                );
                                alloc.push(b);
                                // Freed after its last consumer if that is recomputed too,
                                // else right away (nothing recomputed reads it).
                                let lc = tp.last_consumer.unwrap_or(ri);
                                frees.push((if rops.contains(&lc) { lc } else { ri }, b));
                            }
                        }
                        if rop.fwd_scratch > 0 {
                            let b = self.buffer(
                                rop.fwd_scratch,
                                Category::Transient,
                                text!(self.names, "{} scratch (recompute)", rop.name),
                            );
                            alloc.push(b);
                            frees.push((ri, b));
                        }
                        if casts && rop.kind == OpKind::Linear {
                            let b = self.buffer(
                                (rop.params + rop.shared_params) * cb,
                                Category::GatheredParameters,
                                text!(self.names, "{} weight cast (recompute)", rop.name),
                            );
                            alloc.push(b);
                            free_bwd[ri].push(b);
                        }
                        let t = if let Some(coll) = rop.comm.and_then(|c| c.forward) {
                            // Recomputing the forward repeats its tensor-parallel collectives.
                            let after = (self.prog.tasks.len() - 1) as u32;
                            let t = self.tp_task(step, Phase::Backward, mb, rop, coll, after, alloc, true);
                            rpending = Some(t);
                            t
                        } else {
                            let secs = self.cost.forward_s(rop);
                            self.hw_flops += rop.fwd_flops;
                            let mut d = if k == 0 { deps.clone() } else { vec![] };
                            d.extend(rpending.take());
                            self.task(
                                COMPUTE,
                                secs,
                                d,
                                alloc,
                                TaskLabel::new(
                                    step,
                                    Phase::Backward,
                                    mb,
                                    text!(self.names, "recompute {}", rop.name),
                                    TaskKind::Recompute,
                                    Some(u),
                                )
                                .with_region(rop.region),
                            )
                        };
                        // Pending transient frees: attach now to this task if their consumer is
                        // this op, else remember them for the consumer's recompute task.
                        for (at, b) in frees {
                            if at == ri {
                                self.free_at(t, &[b]);
                            } else {
                                free_fwd[at].push(b);
                            }
                        }
                        let pending = std::mem::take(&mut free_fwd[ri]);
                        self.free_at(t, &pending);
                    }
                    // Anything still pending: free at the end of the recompute. Only ops of
                    // the recompute set can hold pending frees here (the forward pass consumed
                    // all of its own, and a recompute transient's consumer is in the set), so
                    // the ops beyond it need no visit.
                    if !rops.is_empty() {
                        let lt = (self.prog.tasks.len() - 1) as u32;
                        for &x in &rops {
                            let pend = std::mem::take(&mut free_fwd[x]);
                            if !pend.is_empty() {
                                self.free_at(lt, &pend);
                            }
                        }
                    }
                }
            }
            prev_region = Some(op.region);
            // The root module's pre-backward hook fires when the gradient of the model's
            // output (the logits) exists: the loss is computed outside the module, so its
            // backward comes first. Under BACKWARD_PRE that hook prefetches the last block.
            if op.region == Region::Head
                && op.kind == OpKind::Linear
                && nblocks > 0
                && resharded(nblocks)
                && prefetch == BackwardPrefetch::Pre
                && ag_bwd_task[nblocks].is_none()
            {
                let (t, b) = self.gather(step, mb, Phase::Backward, nblocks, vec![last_bwd_task]);
                ag_bwd_task[nblocks] = Some(t);
                gathered[nblocks] = Some(b);
            }
            // Selective checkpointing: recompute the attention core's scores just before its
            // backward.
            if plan.training.checkpointing == Checkpointing::Selective && op.kind == OpKind::AttentionCore {
                let mut alloc = Vec::new();
                for &t in &op.outputs {
                    if self.tensors[t].recomputed {
                        let b = self.buffer(
                            dag.tensors[t].bytes,
                            Category::Recomputed,
                            text!(self.names, "{} (recomputed, micro-batch {mb})", dag.tensors[t].name),
                        );
                        alloc.push(b);
                        free_bwd[i].push(b);
                    }
                }
                if !alloc.is_empty() {
                    let secs = self.cost.forward_s(op);
                    self.hw_flops += op.fwd_flops;
                    self.task(
                        COMPUTE,
                        secs,
                        std::mem::take(&mut deps),
                        alloc,
                        TaskLabel::new(
                            step,
                            Phase::Backward,
                            mb,
                            text!(self.names, "recompute {}", op.name),
                            TaskKind::Recompute,
                            Some(u),
                        )
                        .with_region(op.region),
                    );
                }
            }
            let mut alloc = self.input_grads(op, mb, &mut grad_buf);
            let n_input_grads = alloc.len();
            // Parameter gradients.
            let pel = if op.shared_params > 0 { 0 } else { op.params };
            let grad_owner = if op.shared_params > 0 { 0 } else { i }; // tied head accumulates into the embedding's grad
            let gb = self.pr().grad.bytes();
            if op.params + op.shared_params > 0 {
                if plan.grads_sharded {
                    // Unsharded gradients awaiting this unit's reduce-scatter. A tied head
                    // creates the embedding's gradient; the embedding accumulates into it.
                    let tied_again = op.kind == OpKind::Embedding && i == 0 && tied_grad_done;
                    if !tied_again {
                        let el = if op.shared_params > 0 { op.shared_params } else { pel };
                        let b = self.buffer(
                            el * gb,
                            Category::UnshardedGradients,
                            text!(self.names, "{} weight grad (unsharded, micro-batch {mb})", op.name),
                        );
                        unit_grads[u].push(b);
                        alloc.push(b);
                        tied_grad_done |= op.shared_params > 0;
                    }
                } else {
                    let owner = if op.shared_params > 0 { grad_owner } else { i };
                    if self.op_grad_bufs[owner].is_none() {
                        let el = op.params.max(op.shared_params);
                        let b = self.buffer(
                            el * gb,
                            Category::Gradients,
                            text!(self.names, "{} .grad ({})", dag.ops[owner].name, self.pr().grad.name()),
                        );
                        self.op_grad_bufs[owner] = Some(b);
                        alloc.push(b);
                    }
                }
            }
            let (secs, dgrad_share) = self.cost.backward_split(op);
            self.hw_flops += op.bwd_flops;
            let label = |what: String| {
                TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::Backward, Some(u)).with_region(op.region)
            };
            let t = if op.column_parallel {
                // Megatron's column-parallel backward: the input-gradient GEMM first, then its
                // all-reduce (reduce-scatter) runs while the weight-gradient GEMM computes;
                // with sequence parallelism the input's all-gather overlaps the first GEMM.
                let wgrad_alloc = alloc.split_off(n_input_grads);
                let d = self.task(
                    COMPUTE,
                    secs * dgrad_share,
                    deps,
                    alloc,
                    label(text!(self.names, "{} (input grad)", op.name)),
                );
                dgrad = Some(d);
                let wdeps = regather.take().into_iter().collect();
                self.task(
                    COMPUTE,
                    secs * (1.0 - dgrad_share),
                    wdeps,
                    wgrad_alloc,
                    label(text!(self.names, "{} (weight grad)", op.name)),
                )
            } else {
                self.task(COMPUTE, secs, deps, alloc, label(text!(self.names, "{}", op.name)))
            };
            last_bwd_task = t;
            bwd_last_of_unit[u] = Some(t);
            let mut f = std::mem::take(&mut free_bwd[i]);
            for &o in &op.outputs {
                if let Some(g) = grad_buf[o] {
                    f.push(g);
                }
            }
            if i == lo {
                f.extend_from_slice(&inputs);
            }
            self.free_at(t, &f);
            // DDP: all-reduce a bucket once it is full (only on the last micro-batch: the
            // earlier ones run under no_sync()).
            if plan.parallel.sharding == Sharding::None && plan.dp > 1 && last_mb {
                ddp_bucket += op.params * gb;
                if ddp_bucket >= plan.parallel.bucket_bytes || i == lo {
                    let what = text!(self.names, "all-reduce DDP bucket ending at {}", op.name);
                    self.all_reduce_after(step, mb, u, t, false, ddp_bucket, what);
                    ddp_bucket = 0;
                }
            }
            let region_starts = i == lo || dag.ops[i - 1].region != op.region;
            let unit_done = match op.region {
                Region::Block(_) => region_starts,
                Region::Embed => i == 0,
                Region::Head => false,
            };
            if unit_done {
                // Post-backward: BACKWARD_POST prefetches the next unit before the reduce-scatter.
                if let Region::Block(l) = op.region {
                    if prefetch == BackwardPrefetch::Post && l >= 1 && resharded(u - 1) && ag_bwd_task[u - 1].is_none()
                    {
                        let (at, b) = self.gather(step, mb, Phase::Backward, u - 1, vec![t]);
                        ag_bwd_task[u - 1] = Some(at);
                        gathered[u - 1] = Some(b);
                    }
                }
                if let Some(g) = gathered[u].take() {
                    self.free_at(t, &[g]);
                }
                if plan.grads_sharded {
                    self.reduce_scatter(step, mb, u, t, std::mem::take(&mut unit_grads[u]));
                }
            }
        }
        // ZeRO-1: reduce the full gradients once accumulation is done.
        // The first op's input gradient goes back to the previous stage.
        if let Some(x) = self.chunk_in[c] {
            let what = text!(self.names, "send gradient to virtual stage {} (micro-batch {mb})", vs - 1);
            let t = self.p2p_task(self.send_stream, step, Phase::Backward, mb, vec![last_bwd_task], vec![], what);
            if let Some(g) = grad_buf[x] {
                self.free_at(t, &[g]);
            }
            self.block_on_send(t, last_bwd_task);
        }
        self.ready.insert(Port { step, mb, virtual_stage: vs, forward: false }, last_bwd_task);
        if last_mb && plan.parallel.sharding == Sharding::Zero1 && plan.dp > 1 {
            let bytes = plan.total_params() * self.pr().grad.bytes();
            let secs = self.cost.collective_s(&self.cost.dp_group, Collective::ReduceScatter, bytes);
            let t = self.task(
                NCCL,
                secs,
                vec![last_bwd_task],
                vec![],
                TaskLabel::new(
                    step,
                    Phase::Backward,
                    mb,
                    text!(self.names, "reduce-scatter gradients (ZeRO-1)"),
                    TaskKind::ReduceScatter,
                    None,
                ),
            );
            self.step_comm.push(t);
        }
        self.step_comm.push(last_bwd_task);
    }

    fn reduce_scatter(&mut self, step: u32, mb: u32, u: usize, after: u32, unsharded: Vec<u32>) {
        let plan = self.plan;
        let gb = self.pr().grad.bytes();
        let full_bytes = plan.units[u].shard_params * plan.shard_group * gb;
        let shard_bytes = plan.units[u].shard_params * gb;
        let mut alloc = Vec::new();
        let mut tmp = None;
        if let Some(off) = &plan.parallel.offload {
            // ZeRO-Offload: the reduced partition goes to the host's FP32 gradient buffer.
            let b = self.buffer(
                shard_bytes,
                Category::CommBuffers,
                text!(self.names, "{} reduced gradient partition (to host, micro-batch {mb})", plan.units[u].name),
            );
            let secs = self.cost.collective_s(&self.cost.shard_group, Collective::ReduceScatter, full_bytes);
            let label = |what: String, kind| TaskLabel::new(step, Phase::Backward, mb, what, kind, Some(u));
            let t = self.task(
                NCCL,
                secs,
                vec![after],
                vec![b],
                label(text!(self.names, "reduce-scatter {}", plan.units[u].name), TaskKind::ReduceScatter),
            );
            self.free_at(t, &unsharded);
            let el = plan.units[u].shard_params;
            let secs = (el * crate::plan::OffloadConfig::GRAD_BYTES_PER_PARAM) as f64 / off.d2h_bytes_per_s;
            let what = text!(self.names, "copy {} gradient partition to host (fp32, D2H)", plan.units[u].name);
            let d = self.task(self.d2h_stream, secs, vec![t], vec![], label(what, TaskKind::Send));
            self.free_at(d, &[b]);
            self.step_comm.push(d);
            return;
        }
        if self.grad_bufs[u].is_none() {
            let b = self.buffer(
                shard_bytes,
                Category::Gradients,
                text!(self.names, "{} sharded grad ({})", plan.units[u].name, self.pr().grad.name()),
            );
            self.grad_bufs[u] = Some(b);
            alloc.push(b);
        } else {
            // Later micro-batches reduce into a new shard and accumulate into .grad.
            let b = self.buffer(
                shard_bytes,
                Category::CommBuffers,
                text!(self.names, "{} reduce-scatter output (micro-batch {mb})", plan.units[u].name),
            );
            alloc.push(b);
            tmp = Some(b);
        }
        let secs = self.cost.collective_s(&self.cost.shard_group, Collective::ReduceScatter, full_bytes);
        let t = self.task(
            NCCL,
            secs,
            vec![after],
            alloc,
            TaskLabel::new(
                step,
                Phase::Backward,
                mb,
                text!(self.names, "reduce-scatter {}", plan.units[u].name),
                TaskKind::ReduceScatter,
                Some(u),
            ),
        );
        let mut f = unsharded;
        f.extend(tmp);
        self.free_at(t, &f);
        self.step_comm.push(t);
        if plan.parallel.sharding == Sharding::HybridShard && self.cost.replica_group.ranks > 1 {
            let what = text!(self.names, "all-reduce {} shard across nodes", plan.units[u].name);
            self.all_reduce_after(step, mb, u, t, true, shard_bytes, what);
        }
    }

    /// The offloaded step: the CPU optimizer on the host partition once every gradient
    /// partition has arrived (DeepSpeedCPUAdam, or FSDP's optimizer on CPU tensors), with the
    /// optimizer state read from NVMe before it and written back after it (DeepSpeed's
    /// default `pipeline_read = pipeline_write = false`: one after the other); then the
    /// updated 16-bit partition back to the GPU (and, when parameters are replicated, their
    /// all-gather) unless parameters are offloaded too (written to NVMe when they live
    /// there); then `zero_grad()`.
    fn offloaded_optimizer(&mut self, step: u32, el: u64, off: &crate::plan::OffloadConfig) {
        use crate::plan::OffloadDevice;
        let plan = self.plan;
        let pb = self.pr().param.bytes();
        let state_bytes = plan.optimizer_partition_bytes();
        let lbl = |what: String, kind| TaskLabel::new(step, Phase::Optimizer, 0, what, kind, None);
        let mut deps = self.step_comm.clone();
        if off.optimizer == OffloadDevice::Nvme {
            let what = text!(self.names, "read optimizer state from NVMe (swap in)");
            deps = vec![self.nvme(true, state_bytes, deps, off, lbl(what, TaskKind::Recv))];
        }
        let what = if plan.parallel.framework == Framework::Fsdp {
            text!(self.names, "optimizer.step() on the CPU ({el} parameters)")
        } else {
            text!(self.names, "DeepSpeedCPUAdam step on the host ({el} parameters)")
        };
        let mut last = self.task(
            self.cpu_stream,
            el as f64 / off.cpu_adam_params_per_s,
            deps,
            vec![],
            lbl(what, TaskKind::Optimizer),
        );
        if off.optimizer == OffloadDevice::Nvme {
            let what = text!(self.names, "write optimizer state to NVMe (swap out)");
            last = self.nvme(false, state_bytes, vec![last], off, lbl(what, TaskKind::Send));
        }
        match off.parameters {
            None => {
                let what = text!(self.names, "copy updated parameters to the GPU ({}, H2D)", self.pr().param.name());
                last = self.task(
                    self.h2d_stream,
                    (el * pb) as f64 / off.h2d_bytes_per_s,
                    vec![last],
                    vec![],
                    lbl(what, TaskKind::Recv),
                );
                if !plan.params_sharded && plan.dp > 1 {
                    let bytes = plan.total_params() * pb;
                    let secs = self.cost.collective_s(&self.cost.dp_group, Collective::AllGather, bytes);
                    let what = text!(self.names, "all-gather updated parameters");
                    last = self.task(NCCL, secs, vec![last], vec![], lbl(what, TaskKind::AllGather));
                }
            }
            Some(OffloadDevice::Cpu) => {}
            Some(OffloadDevice::Nvme) => {
                let bytes = plan.local_total(plan.params_sharded) * pb;
                let what = text!(self.names, "write updated parameters to NVMe ({})", self.pr().param.name());
                last = self.nvme(false, bytes, vec![last], off, lbl(what, TaskKind::Send));
            }
        }
        let z = self.task(COMPUTE, 0.0, vec![last], vec![], lbl(text!(self.names, "zero_grad()"), TaskKind::ZeroGrad));
        let grads: Vec<u32> = self.grad_bufs.iter().chain(self.op_grad_bufs.iter()).flatten().copied().collect();
        self.free_at(z, &grads);
        self.last_task_of_prev_step = Some(z);
    }

    fn optimizer(&mut self, step: u32) {
        let plan = self.plan;
        let tr = &plan.training;
        let pr = &tr.precision;
        let el = plan.local_total(plan.optimizer_sharded);
        if let Some(off) = plan.parallel.offload.clone() {
            self.offloaded_optimizer(step, el, &off);
            return;
        }
        let mut alloc = Vec::new();
        let lazy = plan.parallel.framework == Framework::Fsdp && step == 1;
        if lazy && tr.states_per_param() > 0 {
            for u in 0..plan.units.len() {
                alloc.push(self.optimizer_state_buffer(u));
            }
        }
        let sb = pr.optimizer_state.bytes();
        let temp = match tr.optimizer_impl {
            OptimizerImpl::Foreach if tr.states_per_param() == 2 => el * sb,
            OptimizerImpl::ForLoop if tr.states_per_param() == 2 => {
                let largest = self.dag.ops.iter().map(|o| o.params).max().unwrap_or(0);
                let largest = if plan.optimizer_sharded { largest.div_ceil(plan.shard_group) } else { largest };
                2 * largest * sb
            }
            _ => 0,
        };
        let mut frees = Vec::new();
        if temp > 0 {
            let b = self.buffer(
                temp,
                Category::OptimizerTemp,
                text!(self.names, "optimizer.step() temporaries ({:?})", tr.optimizer_impl),
            );
            alloc.push(b);
            frees.push(b);
        }
        let secs = self.cost.optimizer_s(el, tr.optimizer_step_bytes());
        let deps = self.step_comm.clone();
        let t = self.task(
            COMPUTE,
            secs,
            deps,
            alloc,
            TaskLabel::new(step, Phase::Optimizer, 0, text!(self.names, "optimizer.step()"), TaskKind::Optimizer, None),
        );
        self.free_at(t, &frees);
        let mut last = t;
        // Replicated parameters with a sharded optimizer: all-gather the updated shards.
        if !plan.params_sharded && plan.optimizer_sharded && plan.dp > 1 {
            let bytes = plan.total_params() * pr.param.bytes();
            let secs = self.cost.collective_s(&self.cost.dp_group, Collective::AllGather, bytes);
            last = self.task(
                NCCL,
                secs,
                vec![t],
                vec![],
                TaskLabel::new(
                    step,
                    Phase::Optimizer,
                    0,
                    text!(self.names, "all-gather updated parameters"),
                    TaskKind::AllGather,
                    None,
                ),
            );
        }
        let grads: Vec<u32> = self.grad_bufs.iter().chain(self.op_grad_bufs.iter()).flatten().copied().collect();
        let z = self.task(
            COMPUTE,
            0.0,
            vec![last],
            vec![],
            TaskLabel::new(
                step,
                Phase::Optimizer,
                0,
                text!(self.names, "zero_grad(set_to_none=True)"),
                TaskKind::ZeroGrad,
                None,
            ),
        );
        self.free_at(z, &grads);
        self.last_task_of_prev_step = Some(z);
    }
}
