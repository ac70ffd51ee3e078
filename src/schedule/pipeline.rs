//! Pipeline parallelism: one program per pipeline stage, in the order its schedule (GPipe,
//! 1F1B, interleaved 1F1B) runs forwards and backwards, run together as one multi-device
//! program whose stages wait for each other's sends. The bubble and each stage's peak come
//! out of the engine, not a formula.
//!
//! Orders follow Megatron-LM `megatron/core/pipeline_parallel/schedules.py`: 1F1B runs
//! `p - k - 1` warm-up forwards on stage k, then alternates forward and backward, then drains
//! the remaining backwards; the interleaved schedule warms up with `2 (p - k - 1) + (v - 1) p`
//! forwards over its `v` model chunks, where forward number i runs chunk `(i mod pv) / p` on
//! micro-batch `(i / pv) p + i mod p` and backward number i the chunks in reverse.

use std::collections::HashMap;

use super::backward::Bwd;
use super::forward::FwdPass;
use super::{ep_overlap, Builder, Category, Cost, Phase, Port, Schedule, TaskKind, TaskLabel};
use crate::engine::PartLink;
use crate::hardware::Cluster;
use crate::model::LayerDag;
use crate::net::Collective;
use crate::plan::{PipelineSchedule, Plan, Sharding};

/// One stage's plan and program (task indices local to the stage).
#[derive(Debug, Clone)]
pub struct Stage {
    pub plan: std::sync::Arc<Plan>,
    pub schedule: Schedule,
}

/// Every stage, and the dependencies between them (parts are stages: a receive waits for
/// the matching send, the tied-embedding all-reduce for its partner).
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub stages: Vec<Stage>,
    pub links: Vec<PartLink>,
}

/// Where a stage's step stands in its schedule: the passes still to build
/// ([`Builder::passes_until`]), so that every stage can be built up to the same slot and
/// carried on later.
struct Passes {
    step: u32,
    order: Vec<(bool, u32, usize)>,
    last_bwd: Vec<Option<usize>>,
    /// Forwards whose backward is not built yet.
    pending: HashMap<(u32, usize), super::Fwd>,
    /// The next slot of `order`.
    next: usize,
}

/// (forward?, micro-batch, chunk) in the order stage `k` of `p` runs them.
pub fn order(kind: PipelineSchedule, p: u64, k: u64, m: u64, v: u64) -> Vec<(bool, u32, usize)> {
    order_with(kind, p, k, m, v, false)
}

/// [`order`]; under `--overlap-moe-expert-parallel-comm` (`ep_overlap`) the interleaved
/// schedule warms up one forward more, so each steady-state forward and the backward
/// beside it are independent (`get_pp_rank_microbatches`, schedules.py).
pub fn order_with(kind: PipelineSchedule, p: u64, k: u64, m: u64, v: u64, ep_overlap: bool) -> Vec<(bool, u32, usize)> {
    let mut out = Vec::new();
    match kind {
        PipelineSchedule::Gpipe => {
            out.extend((0..m).map(|i| (true, i as u32, 0)));
            out.extend((0..m).map(|i| (false, i as u32, 0)));
        }
        PipelineSchedule::DualPipe | PipelineSchedule::DualPipeV => {
            // Its forwards and backwards in order (an overlapped pair forward first), without
            // the deferred weight-gradient passes.
            use super::dualpipe::Slot;
            let slots = if kind == PipelineSchedule::DualPipe {
                super::dualpipe::order(p, k, m)
            } else {
                super::dualpipe::order_v(p, k, m)
            };
            for s in slots {
                match s {
                    Slot::F(c, mb) => out.push((true, mb, c)),
                    Slot::B(c, mb, _) => out.push((false, mb, c)),
                    Slot::FB((fc, fmb), (bc, bmb)) => out.extend([(true, fmb, fc), (false, bmb, bc)]),
                    Slot::W => {}
                }
            }
        }
        PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved => {
            let v = if kind == PipelineSchedule::OneFOneB { 1 } else { v };
            let total = m * v;
            let warm = if v == 1 {
                (p - k - 1).min(m)
            } else {
                ((p - k - 1) * 2 + (v - 1) * p + u64::from(ep_overlap)).min(total)
            };
            let id = |i: u64, fwd: bool| {
                let group = p * v;
                let c = (i % group) / p;
                let chunk = if fwd { c } else { v - 1 - c };
                let mb = (i / group) * p + i % p;
                (fwd, mb as u32, chunk as usize)
            };
            out.extend((0..warm).map(|i| id(i, true)));
            for i in 0..total - warm {
                out.push(id(warm + i, true));
                out.push(id(i, false));
            }
            out.extend((total - warm..total).map(|i| id(i, false)));
        }
    }
    out
}

impl Builder<'_> {
    /// One pipeline point-to-point transfer (send or receive side) of `bytes`.
    /// The previous send, posted with this chunk's receive: the compute task the receive is
    /// posted after, and what the chunk's first compute waits for (the send).
    pub(super) fn take_prior_send(&mut self) -> (Option<u32>, Vec<u32>) {
        let prior = self.pending_send.take();
        (prior.map(|p| p.1), prior.map(|p| p.0).into_iter().collect())
    }

    /// A send blocks the stage's next compute (and is posted with its next receive) unless
    /// p2p communication overlaps compute.
    pub(super) fn block_on_send(&mut self, send: u32, after: u32) {
        if !self.plan.parallel.model_parallel.overlap_p2p {
            self.pending_send = Some((send, after));
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn p2p_task(
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
        self.use_compute_pool(&alloc);
        self.task(stream, secs, deps, alloc, TaskLabel::new(step, phase, mb, what, kind, None).with_work(0.0, bytes))
    }

    /// Start of a chunk's backward: the gradient of its output arrives from the next stage.
    pub(super) fn recv_gradient(&mut self, st: &mut Bwd, c: usize, recv_after: Option<u32>) {
        let Some(y) = self.chunk_out[c] else { return };
        let (step, mb) = (st.step, st.mb);
        let vs = self.chunk_vs[c];
        if self.local_peer(vs + 1) {
            // DualPipeV's turn: the next chunk's input gradient, on this rank.
            st.grad_buf[y] = self.handoff.remove(&mb);
            return;
        }
        let dag = self.dag;
        let b = self.buffer(
            dag.tensors[y].bytes,
            Category::ActivationGradients,
            text!(self.names, "grad of {} received (micro-batch {mb})", dag.tensors[y].name),
        );
        st.grad_buf[y] = Some(b);
        let mut alloc = vec![b];
        if self.deepspeed_partitions_outputs() {
            // _exec_backward_pass rebuilds the full output from its partition
            // (`PartitionedTensor.full()`) for autograd, and drops it when the backward ends.
            let full = self.buffer(
                dag.tensors[y].bytes,
                Category::Activations,
                text!(self.names, "stage output rebuilt for backward (PartitionedTensor.full(), micro-batch {mb})"),
            );
            alloc.push(full);
            let lo = self.chunk_ops[c].0;
            st.free_bwd.push(lo, full);
        }
        let what = text!(self.names, "recv gradient from {} (micro-batch {mb})", self.peer(vs + 1));
        let deps = recv_after.into_iter().collect();
        let t = self.p2p_task(self.recv_stream, step, Phase::Backward, mb, deps, alloc, what);
        self.ext_deps.push((t, Port { step, mb, virtual_stage: vs + 1, forward: false }));
        st.pending = Some(t);
    }

    /// End of a chunk's backward: its first op's input gradient goes back to the previous
    /// stage.
    pub(super) fn send_gradient(&mut self, st: &mut Bwd, c: usize) {
        let Some(x) = self.chunk_in[c] else { return };
        let (step, mb) = (st.step, st.mb);
        let vs = self.chunk_vs[c];
        if self.local_peer(vs - 1) {
            // DualPipeV's turn: the gradient stays on this rank for the chunk before.
            if let Some(g) = st.grad_buf[x] {
                self.handoff.insert(mb, g);
            }
            return;
        }
        let what = text!(self.names, "send gradient to {} (micro-batch {mb})", self.peer(vs - 1));
        let t = self.p2p_task(self.send_stream, step, Phase::Backward, mb, vec![st.last_bwd_task], vec![], what);
        if let Some(g) = st.grad_buf[x] {
            self.free_at(t, &[g]);
        }
        self.block_on_send(t, st.last_bwd_task);
    }

    /// Start of a chunk's forward on a later stage: its input activation arrives from the
    /// previous one.
    pub(super) fn recv_activation(&mut self, st: &mut FwdPass, c: usize, recv_after: Option<u32>) {
        let Some(x) = self.chunk_in[c] else { return };
        let (step, mb) = (st.step, st.mb);
        let (lo, _) = self.chunk_ops[c];
        let vs = self.chunk_vs[c];
        if self.local_peer(vs - 1) {
            // DualPipeV's turn: the chunk before ran on this rank, and its output (kept until
            // that chunk's backward, `send_activation`) is this one's input.
            return;
        }
        let dag = self.dag;
        let tp = self.ck.tensors[x];
        let b = self.buffer(
            dag.tensors[x].bytes,
            Category::Activations,
            text!(self.names, "{} received (micro-batch {mb})", dag.tensors[x].name),
        );
        if tp.kept {
            st.free_bwd.push(tp.last_saver.unwrap_or(lo), b);
        } else {
            st.free_fwd.push(tp.last_consumer.unwrap_or(lo), b);
        }
        let what = text!(self.names, "recv activation from {} (micro-batch {mb})", self.peer(vs - 1));
        let deps: Vec<u32> = st.step_dep.into_iter().chain(recv_after).collect();
        let t = self.p2p_task(self.recv_stream, step, Phase::Forward, mb, deps, vec![b], what);
        self.ext_deps.push((t, Port { step, mb, virtual_stage: vs - 1, forward: true }));
        st.pending = Some(t);
    }

    /// End of a chunk's forward: its output goes to the next stage, then is freed.
    pub(super) fn send_activation(&mut self, st: &mut FwdPass, c: usize) {
        let Some(b) = st.out_buf else { return };
        let mb = st.mb;
        let vs = self.chunk_vs[c];
        if self.local_peer(vs + 1) {
            // DualPipeV's turn (`input_chunks[1].append(output.detach().requires_grad_())`):
            // the next chunk runs on this rank and reads the output where it is; the output
            // lives until this chunk's backward.
            let lo = self.chunk_ops[c].0;
            st.free_bwd.push(lo, b);
            return;
        }
        let mut last = st.last;
        let mut b = b;
        if self.deepspeed_partitions_outputs() {
            // PipelineEngine._exec_forward_pass: the output is split over the tensor-parallel
            // group (`PartitionedTensor`, a clone of this rank's 1/TP) and its full data freed
            // (`first_output.data = torch.zeros(1)`) before the send; the partition is what
            // `pipe_buffers['outputs']` keeps until the backward.
            let bytes = self.tables.buffers[b as usize].bytes.div_ceil(self.plan.parallel.model_parallel.tensor);
            let part = self.buffer(
                bytes,
                Category::Activations,
                text!(self.names, "stage output partition kept for backward (PartitionedTensor, micro-batch {mb})"),
            );
            let what = text!(self.names, "partition the stage output over tensor parallelism (micro-batch {mb})");
            let label = super::TaskLabel::new(st.step, Phase::Forward, mb, what, super::TaskKind::Forward, None);
            last = self.task(super::COMPUTE, 0.0, [st.last], [part], label);
            self.free_at(last, &[b]);
            b = part;
        }
        let what = text!(self.names, "send activation to {} (micro-batch {mb})", self.peer(vs + 1));
        let t = self.p2p_task(self.send_stream, st.step, Phase::Forward, mb, vec![last], vec![], what);
        if self.plan.parallel.framework.keeps_pipeline_outputs() {
            // Held until this micro-batch's backward of the chunk is done.
            let lo = self.chunk_ops[c].0;
            st.free_bwd.push(lo, b);
        } else {
            self.free_at(t, &[b]);
        }
        self.block_on_send(t, last);
    }

    /// Virtual stage `vs` runs on this rank too: DualPipeV's turn at the last rank, where
    /// chunk 0's output is chunk 1's input and chunk 1's input gradient chunk 0's output
    /// gradient, with no transfer.
    fn local_peer(&self, vs: u64) -> bool {
        let mp = &self.plan.parallel.model_parallel;
        mp.schedule == PipelineSchedule::DualPipeV && mp.rank_of_virtual_stage(vs) == self.plan.stage
    }

    /// The other end of a transfer, as a task name says it.
    fn peer(&self, vs: u64) -> Peer {
        let mp = &self.plan.parallel.model_parallel;
        Peer { vs, pipeline: mp.pipeline, schedule: mp.schedule }
    }

    /// DeepSpeed's pipeline engine with tensor parallelism partitions each stage output it
    /// keeps over the tensor-parallel group (`is_pipe_partitioned = is_model_parallel`,
    /// pipe/engine.py).
    fn deepspeed_partitions_outputs(&self) -> bool {
        self.plan.parallel.framework.keeps_pipeline_outputs() && self.plan.parallel.model_parallel.tensor > 1
    }

    /// One step of a pipeline stage: its forwards and backwards in schedule order, then the
    /// data-parallel gradient reduction (Megatron reduces after the last backward), the
    /// optimizer and `zero_grad`.
    fn pipeline_step(&mut self, step: u32) {
        let mut passes = self.begin_pipeline_step(step);
        self.end_pipeline_step(&mut passes);
    }

    /// The rest of a step `passes` began: its remaining passes and its end.
    fn end_pipeline_step(&mut self, passes: &mut Passes) {
        self.passes_until(passes, usize::MAX);
        self.step_end(passes.step);
    }

    /// A step's start: what comes before its first pass, and where its passes stand (none
    /// built yet).
    fn begin_pipeline_step(&mut self, step: u32) -> Passes {
        self.begin_step();
        self.megatron_step_start(step);
        let mp = &self.plan.parallel.model_parallel;
        let overlap = self.plan.parallel.megatron.overlap_moe_expert_parallel_comm;
        let order = if mp.schedule.is_dualpipe() {
            Vec::new()
        } else {
            order_with(
                mp.schedule,
                mp.pipeline,
                self.plan.stage,
                self.plan.training.grad_accum,
                mp.virtual_stages,
                overlap,
            )
        };
        // Each chunk's last backward of the step: where FSDP reduces its gradients.
        let last_bwd: Vec<Option<usize>> =
            (0..self.chunk_ops.len()).map(|c| order.iter().rposition(|&(f, _, ch)| !f && ch == c)).collect();
        Passes { step, order, last_bwd, pending: HashMap::new(), next: 0 }
    }

    /// The step's passes in the order of a GPipe, 1F1B or interleaved schedule, from where
    /// `passes` stands up to slot `until` (a slot: one forward or backward of one chunk, or
    /// a forward and the backward combined with it), or all of DualPipe's at once.
    fn passes_until(&mut self, passes: &mut Passes, until: usize) {
        let step = passes.step;
        if self.plan.parallel.model_parallel.schedule.is_dualpipe() {
            if passes.next == 0 {
                self.dualpipe_passes(step);
                passes.next = usize::MAX;
            }
            return;
        }
        let overlap = self.plan.parallel.megatron.overlap_moe_expert_parallel_comm;
        let Passes { order, last_bwd, pending, next: k, .. } = passes;
        while *k < order.len().min(until) {
            let (fwd, mb, c) = order[*k];
            self.mark_period();
            // A steady-state forward and the backward after it run as one combined step.
            let paired =
                order.get(*k + 1).filter(|&&(f, bmb, bc)| overlap && fwd && !f && pending.contains_key(&(bmb, bc)));
            if let Some(&(_, bmb, bc)) = paired {
                let b = ep_overlap::PairedBackward {
                    mb: bmb,
                    chunk: bc,
                    fwd: pending.remove(&(bmb, bc)).expect("checked above"),
                    last_mb: false,
                    sync_grads: last_bwd[bc] == Some(*k + 1),
                };
                let f = self.forward_backward(step, mb, c, b);
                pending.insert((mb, c), f);
                *k += 2;
                continue;
            }
            if fwd {
                let f = self.forward(step, mb, c);
                pending.insert((mb, c), f);
            } else if let Some(f) = pending.remove(&(mb, c)) {
                self.backward(step, mb, c, f, false, last_bwd[c] == Some(*k));
            }
            *k += 1;
        }
    }

    /// After a step's passes: the data-parallel gradient reduction (Megatron reduces after
    /// the last backward), the optimizer and `zero_grad`.
    fn step_end(&mut self, step: u32) {
        // The schedule returns once its last send has completed.
        self.step_comm.extend(self.pending_send.take().map(|p| p.0));
        let plan = self.plan;
        // Sharded gradients (FSDP) were reduce-scattered unit by unit after the last backward.
        let last: Vec<u32> = self.step_comm.last().copied().into_iter().collect();
        let by_deepspeed = self.deepspeed_boundary_reduce(step, last.clone());
        let by_megatron = self.megatron_reduces_in_backward(false, true);
        if !by_deepspeed && !by_megatron && plan.grads_reduced() && !plan.grads_sharded {
            let g = self.pr().grad.bytes();
            let (bytes, expert) = (plan.total_params() * g, plan.expert_params() * g);
            let (coll, kind, what) = match plan.parallel.sharding {
                Sharding::Zero1 => (
                    Collective::ReduceScatter,
                    super::TaskKind::ReduceScatter,
                    "reduce-scatter gradients (distributed optimizer)",
                ),
                _ => (Collective::AllReduce, super::TaskKind::AllReduce, "all-reduce gradients (data parallel)"),
            };
            let secs = self.cost.dp_collective_s(coll, bytes, expert);
            let label = TaskLabel::new(step, super::Phase::Backward, 0, text!(self.names, "{what}"), kind, None);
            let t = self.task(super::NCCL, secs, last, [], label.with_work(0.0, bytes));
            self.step_comm.push(t);
        }
        self.megatron_partial_grads_all_reduce(step);
        self.tied_embedding_all_reduce(step);
        self.optimizer(step);
    }

    /// Tied word embeddings (or multi-token prediction's lookups): the first stage's
    /// embedding and the last stage's copy for the LM head get gradients from both uses, so Megatron-LM all-reduces them between the two
    /// stages (`_allreduce_embedding_grads`, over its embedding group, after the
    /// data-parallel reduction) before the optimizer step. Each side's collective starts
    /// once both stages have finished their backwards and reduced over data parallelism.
    fn tied_embedding_all_reduce(&mut self, step: u32) {
        let p = self.plan.pipeline();
        let k = self.plan.stage;
        let tied = self.dag.embedding_copy_params();
        // DualPipe's end ranks hold the embedding and the head themselves; the two copies
        // of each are reduced with the rest of their stage's gradients.
        let dualpipe = self.plan.parallel.model_parallel.schedule.is_dualpipe();
        if p < 2 || tied == 0 || (k != 0 && k != p - 1) || dualpipe {
            return;
        }
        let other = if k == 0 { p - 1 } else { 0 };
        let port = |vs| Port { step, mb: EMBEDDING_GROUP_MB, virtual_stage: vs, forward: false };
        let mine = self.step_comm.last().copied().or(self.last_task_of_prev_step);
        if let Some(t) = mine {
            self.ready.insert(port(k), t);
        }
        let bytes = tied * self.pr().grad.bytes();
        // Megatron's rank order (tensor fastest, then data, then pipeline): the two stages
        // share a node only when the whole pipeline of one replica fits in it.
        let span = (p - 1) * self.plan.parallel.model_parallel.tensor * self.plan.dp;
        let same_node = span < self.plan.gpus_per_node;
        let group = crate::net::Group { ranks: 2, ranks_per_node: if same_node { 2 } else { 1 }, ..self.cost.tp_group };
        let secs = self.cost.collective_s(&group, Collective::AllReduce, bytes);
        let label = TaskLabel::new(
            step,
            super::Phase::Backward,
            0,
            text!(self.names, "all-reduce tied embedding gradients (first and last stage)"),
            super::TaskKind::AllReduce,
            None,
        );
        let t = self.task(super::NCCL, secs, mine.as_slice(), [], label.with_work(0.0, bytes));
        self.ext_deps.push((t, port(other)));
        self.step_comm.push(t);
    }
}

/// A pipeline transfer's peer: "virtual stage 5", or under DualPipe the rank and which
/// direction's stage it runs ("pipeline rank 2 (stage 1, reverse direction)").
struct Peer {
    vs: u64,
    pipeline: u64,
    schedule: PipelineSchedule,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (p, vs) = (self.pipeline, self.vs);
        // Under DualPipe and DualPipeV virtual stages run to 2p - 1.
        let rank = if vs >= p { (2 * p - 1).saturating_sub(vs) } else { vs };
        match self.schedule {
            PipelineSchedule::DualPipe if vs < p => write!(f, "pipeline rank {rank} (stage {vs}, forward direction)"),
            PipelineSchedule::DualPipe => write!(f, "pipeline rank {rank} (stage {}, reverse direction)", vs - p),
            PipelineSchedule::DualPipeV => write!(f, "pipeline rank {rank} (virtual stage {vs})"),
            _ => write!(f, "virtual stage {vs}"),
        }
    }
}

/// The micro-batch number of the embedding group's port: no micro-batch uses it.
const EMBEDDING_GROUP_MB: u32 = u32::MAX;

/// Builds every stage's program, the first `steps` steps of it ([`super::build_lean_prefix`]
/// says why a prefix runs as the whole does), and the links between them.
pub fn build(dag: &LayerDag, plan: &Plan, cluster: &Cluster, names: bool, steps: u32) -> Pipeline {
    let plans = stage_plans(dag, plan);
    let costs = stage_costs(&plans, cluster);
    fresh(dag, &plans, &costs, names, steps)
}

/// A pipeline built so far, handed out at a [`super::Stage`]: every stage's program as far
/// as it goes, with the tasks that must not start.
pub struct Prefix {
    pub stage: super::Stage,
    pub pipeline: Pipeline,
    /// (stage, task): tasks that run only once work not in the prefix has: the slot built
    /// past a [`super::Stage::Slots`] cut, and transfers whose other side is not built yet.
    /// A run of the prefix stops when one of them could start ([`crate::engine::RunOptions::held`]);
    /// an allocation that fails before then fails in the whole program too (a task may be listed twice).
    pub held: Vec<(usize, u32)>,
    /// Per stage: where the held slot begins (the whole program so far at a step's end).
    pub cut: Vec<u32>,
}

/// The slots of step 1 a sweep's [`super::Stage::Slots`] prefix covers: the first stage's
/// warm-up, its first backward and the slot after it. There the first stage holds the most
/// micro-batches' activations it ever holds, beside the first gradients; most pipelines that
/// run out of memory in step 1's passes do so by then.
pub fn fill_slots(parallel: &crate::plan::ParallelConfig, micro_batches: u64) -> u32 {
    let mp = &parallel.model_parallel;
    let overlap = parallel.megatron.overlap_moe_expert_parallel_comm;
    let order = order_with(mp.schedule, mp.pipeline, 0, micro_batches, mp.virtual_stages, overlap);
    order.iter().position(|x| !x.0).map_or(order.len(), |b| b + 2) as u32
}

/// Every stage's program for all the plan's steps, built in lockstep and handed to `probe` at
/// each of `stages` it reaches (in build order: [`super::Stage::Steps`]`(0)`,
/// [`super::Stage::Slots`], `Steps(1)`, ...); the first answer ends the build, and where none
/// answers the whole pipeline is the same builders carried on ([`super::build_lean_staged`]
/// does the same for an unpipelined rank). Where nothing past initialisation is tried, the
/// initialisation is built apart and each stage whole on its own task ([`fresh`]): builders
/// of every stage alive at once cost fresh pages of memory.
///
/// Why a prefix cut within a step answers for the whole program: every stage is cut after
/// the same number of slots of step 1's schedule and the slot after that is built and held.
/// A task built later depends (directly, across a link, or through its stream) on one built
/// past the cut (tests/pipeline_prefix.rs checks this of every slot of the programs it builds),
/// so no task outside the prefix starts before a held one could; until then, the prefix's
/// run is the whole program's, event for event.
pub fn build_staged<R>(
    dag: &LayerDag,
    plan: &Plan,
    cluster: &Cluster,
    stages: &[super::Stage],
    mut probe: impl FnMut(Prefix) -> Option<R>,
) -> super::Staged<R, Pipeline> {
    use super::Stage;
    let steps = plan.training.steps;
    let plans = stage_plans(dag, plan);
    let costs = stage_costs(&plans, cluster);
    let tried = |k: u32| k < steps && stages.contains(&Stage::Steps(k));
    // DualPipe's passes are built whole ([`Builder::passes_until`]): no slot to cut at.
    let slots = stages.iter().find_map(|s| match s {
        Stage::Slots(n) if steps > 0 && !plan.parallel.model_parallel.schedule.is_dualpipe() => Some(*n as usize),
        _ => None,
    });
    if slots.is_none() && !(1..steps).any(tried) {
        // Initialisation alone, if at all: it is cheap to build twice, and the whole program
        // is built stage by stage.
        if tried(0) {
            let mut bs = builders(dag, &plans, &costs, false, 0);
            if let Some(r) = ask(&mut probe, dag, &plans, &mut bs, Stage::Steps(0), None, 0) {
                return super::Staged::Answered(r);
            }
        }
        return super::Staged::Whole(Box::new(fresh(dag, &plans, &costs, false, steps)));
    }
    let mut bs = builders(dag, &plans, &costs, false, steps);
    let mut answer = None;
    if tried(0) {
        answer = ask(&mut probe, dag, &plans, &mut bs, Stage::Steps(0), None, 0);
    }
    // Step 1 begun on every stage, where a cut within it was tried.
    let mut begun: Option<Vec<Passes>> = None;
    // The cut tried and what was built there, checked against the whole program in debug
    // builds.
    let mut checked: Option<(Vec<u32>, Vec<u32>)> = None;
    if let (None, Some(n)) = (&answer, slots) {
        use rayon::prelude::*;
        let mut passes: Vec<Passes> = bs.iter_mut().map(|b| b.begin_pipeline_step(1)).collect();
        let step_to = |bs: &mut [Builder], passes: &mut [Passes], until: &(dyn Fn(&Passes) -> usize + Sync)| {
            bs.par_iter_mut().zip(passes.par_iter_mut()).for_each(|(b, ps)| {
                let to = until(ps);
                b.passes_until(ps, to)
            });
        };
        step_to(&mut bs, &mut passes, &|_| n);
        // The held slot must exist on every stage: a cut at the step's last slot would leave
        // the step's end unbuilt behind nothing held.
        if passes.iter().all(|ps| ps.next < ps.order.len()) {
            let cut: Vec<u32> = bs.iter().map(|b| b.prog.tasks.len() as u32).collect();
            step_to(&mut bs, &mut passes, &|ps| ps.next + 1);
            let built = bs.iter().map(|b| b.prog.tasks.len() as u32).collect();
            answer = ask(&mut probe, dag, &plans, &mut bs, Stage::Slots(n as u32), Some(cut.clone()), 1);
            checked = Some((cut, built));
        }
        begun = Some(passes);
    }
    // Steps up to the last whose prefix is tried are built in lockstep; the rest stage by
    // stage.
    let last = (1..steps).filter(|&k| tried(k)).max().unwrap_or(0);
    let mut step = 1;
    while answer.is_none() && step <= last {
        match begun.take() {
            Some(mut passes) => {
                use rayon::prelude::*;
                bs.par_iter_mut().zip(passes.par_iter_mut()).for_each(|(b, ps)| b.end_pipeline_step(ps));
            }
            None => each(&mut bs, |b| b.pipeline_step(step)),
        }
        if tried(step) {
            answer = ask(&mut probe, dag, &plans, &mut bs, Stage::Steps(step), None, step);
        }
        step += 1;
    }
    match answer {
        Some(r) => super::Staged::Answered(r),
        None => {
            let pipe = whole(dag, &plans, bs, begun, step, steps);
            if let Some((cut, built)) = checked.filter(|_| cfg!(debug_assertions)) {
                cut_is_closed(&pipe, &cut, &built).unwrap_or_else(|e| panic!("a cut within step 1 does not hold: {e}"));
            }
            super::Staged::Whole(Box::new(pipe))
        }
    }
}

/// Whether a cut of `whole` answers for it: every task past what was built (`built`, per
/// stage) waits, directly, across a link or behind its stream, for a task at or past the cut
/// (`cut`, per stage: where the held slot begins). Then no task outside the prefix starts
/// before a held one could ([`build_staged`]). Err names the first task that could.
pub fn cut_is_closed(whole: &Pipeline, cut: &[u32], built: &[u32]) -> Result<(), String> {
    let mut links: HashMap<(usize, u32), Vec<(usize, u32)>> = HashMap::new();
    for l in &whole.links {
        links.entry((l.part, l.task)).or_default().push((l.dep_part, l.dep));
    }
    for (k, st) in whole.stages.iter().enumerate() {
        let w = &st.schedule.program;
        let mut last_on_stream = vec![None; w.streams.len()];
        for t in 0..w.tasks.len() as u32 {
            let stream = w.tasks[t as usize].stream as usize;
            if t >= built[k] {
                let own = w.deps.of(t as usize).iter().any(|&d| d >= cut[k]);
                let behind = last_on_stream[stream].is_some_and(|s| s >= cut[k]);
                let across = links.get(&(k, t)).is_some_and(|ds| ds.iter().any(|&(j, d)| d >= cut[j]));
                if !(own || behind || across) {
                    return Err(format!("stage {k} task {t} could start before the held slot (cut at {})", cut[k]));
                }
            }
            last_on_stream[stream] = Some(t);
        }
    }
    Ok(())
}

/// Each stage's own plan ([`Plan::stage`]).
fn stage_plans(dag: &LayerDag, plan: &Plan) -> Vec<std::sync::Arc<Plan>> {
    use rayon::prelude::*;
    (0..plan.pipeline()).into_par_iter().map(|k| std::sync::Arc::new(plan.stage(dag, k))).collect()
}

fn stage_costs(plans: &[std::sync::Arc<Plan>], cluster: &Cluster) -> Vec<Cost> {
    plans.iter().map(|sp| Cost::for_plan(cluster, sp)).collect()
}

/// One builder per stage, its initialisation built. Stages are built independently (in
/// parallel: a large pipeline's stages are most of a run's set-up), each by its own builder,
/// so the result does not depend on threads.
fn builders<'a>(
    dag: &'a LayerDag,
    plans: &'a [std::sync::Arc<Plan>],
    costs: &'a [Cost],
    names: bool,
    steps: u32,
) -> Vec<Builder<'a>> {
    use rayon::prelude::*;
    plans.par_iter().zip(costs).map(|(sp, cost)| initialised(dag, sp, cost, names, steps)).collect()
}

/// A stage's builder with room for `steps` steps and its initialisation built.
fn initialised<'a>(dag: &'a LayerDag, sp: &'a Plan, cost: &'a Cost, names: bool, steps: u32) -> Builder<'a> {
    let mut b = Builder::new(dag, sp, cost, names);
    b.reserve(steps);
    b.init();
    b
}

/// `f` on every stage's builder, in parallel.
fn each(bs: &mut [Builder], f: impl Fn(&mut Builder) + Send + Sync) {
    use rayon::prelude::*;
    bs.par_iter_mut().for_each(f);
}

/// Model FLOPs of one step of a stage's program.
fn stage_model_flops(dag: &LayerDag, sp: &Plan) -> f64 {
    3.0 * dag.model_forward_flops() * sp.training.grad_accum as f64
        / (sp.pipeline() * sp.parallel.model_parallel.tensor) as f64
}

/// The links of each stage's transfers (`ext`: task and what it waits for) to the tasks the
/// other side `ready`, and the transfers whose other side is not built.
fn resolve<'b>(
    plan: &Plan,
    stages: impl Iterator<Item = (&'b HashMap<Port, u32>, &'b [(u32, Port)])> + Clone,
    mut link: impl FnMut(PartLink),
    mut missing: impl FnMut(usize, u32),
) {
    let ready: Vec<&HashMap<Port, u32>> = stages.clone().map(|s| s.0).collect();
    for (k, (_, ext)) in stages.enumerate() {
        for &(t, port) in ext {
            let target = plan.parallel.model_parallel.rank_of_virtual_stage(port.virtual_stage) as usize;
            match ready[target].get(&port) {
                Some(&r) => link(PartLink { part: k, task: t, dep_part: target, dep: r }),
                None => missing(k, t),
            }
        }
    }
}

/// `probe`'s answer on the pipeline as the builders have it ([`prefix`]), each builder's
/// labels lent to it rather than copied.
fn ask<R>(
    probe: &mut impl FnMut(Prefix) -> Option<R>,
    dag: &LayerDag,
    plans: &[std::sync::Arc<Plan>],
    bs: &mut [Builder],
    stage: super::Stage,
    cut: Option<Vec<u32>>,
    steps: u32,
) -> Option<R> {
    let labels: Vec<_> = bs.iter_mut().map(|b| b.lend_labels()).collect();
    let answer = probe(prefix(dag, plans, bs, &labels, stage, cut, steps));
    for (b, l) in bs.iter_mut().zip(labels) {
        b.take_back_labels(l);
    }
    answer
}

/// The pipeline as the builders have it, `steps` steps of it begun, with each stage's
/// `labels`: a copy of each program so far, the links between the tasks built, and what must
/// be held ([`Prefix::held`]): the tasks from `cut` on, if given, and transfers whose other
/// side is not built.
fn prefix(
    dag: &LayerDag,
    plans: &[std::sync::Arc<Plan>],
    bs: &[Builder],
    labels: &[std::sync::Arc<Vec<super::TaskLabel>>],
    stage: super::Stage,
    cut: Option<Vec<u32>>,
    steps: u32,
) -> Prefix {
    let cut = cut.unwrap_or_else(|| bs.iter().map(|b| b.prog.tasks.len() as u32).collect());
    let mut held: Vec<(usize, u32)> = Vec::new();
    for (k, b) in bs.iter().enumerate() {
        held.extend((cut[k]..b.prog.tasks.len() as u32).map(|t| (k, t)));
    }
    let mut links = Vec::new();
    let stages = bs.iter().map(|b| (&b.ready, b.ext_deps.as_slice()));
    resolve(&plans[0], stages, |l| links.push(l), |k, t| held.push((k, t)));
    let stages = bs
        .iter()
        .zip(plans)
        .zip(labels)
        .map(|((b, sp), labels)| Stage {
            plan: sp.clone(),
            schedule: Schedule {
                program: b.program_so_far(),
                labels: labels.clone(),
                model_flops_per_step: stage_model_flops(dag, sp),
                hardware_flops_per_step: b.hw_flops / steps.max(1) as f64,
            },
        })
        .collect();
    Prefix { stage, pipeline: Pipeline { stages, links }, held, cut }
}

/// Every stage's whole program of `steps` steps, each stage built from start to end on one
/// task: its builder's working lists are freed before the next stage's builder on that
/// thread needs its own.
fn fresh(dag: &LayerDag, plans: &[std::sync::Arc<Plan>], costs: &[Cost], names: bool, steps: u32) -> Pipeline {
    use rayon::prelude::*;
    let built = plans
        .par_iter()
        .zip(costs)
        .map(|(sp, cost)| finish_stage(dag, sp, initialised(dag, sp, cost, names, steps), None, 1, steps))
        .collect();
    assemble(plans, built)
}

/// The finished pipeline of `steps` steps, each stage's builder carried on from step `from`
/// (the step `begun` if given) in parallel, alone: what it no longer needs is freed before the
/// next stage is built on its thread.
fn whole(
    dag: &LayerDag,
    plans: &[std::sync::Arc<Plan>],
    bs: Vec<Builder>,
    begun: Option<Vec<Passes>>,
    from: u32,
    steps: u32,
) -> Pipeline {
    use rayon::prelude::*;
    let n = bs.len();
    let begun: Vec<Option<Passes>> = match begun {
        Some(ps) => ps.into_iter().map(Some).collect(),
        None => (0..n).map(|_| None).collect(),
    };
    let built = bs
        .into_par_iter()
        .zip(begun)
        .zip(plans)
        .map(|((b, passes), sp)| finish_stage(dag, sp, b, passes, from, steps))
        .collect();
    assemble(plans, built)
}

/// A finished stage, the ports its tasks offer the other stages and its transfers that wait
/// for theirs.
type Finished = (Stage, HashMap<Port, u32>, Vec<(u32, Port)>);

/// A stage's program carried on to the end of step `steps`: the step `passes` began, if
/// given, then steps `from` on; with what its transfers wait for and offer the other stages.
fn finish_stage(
    dag: &LayerDag,
    sp: &std::sync::Arc<Plan>,
    mut b: Builder,
    passes: Option<Passes>,
    mut from: u32,
    steps: u32,
) -> Finished {
    if let Some(mut ps) = passes {
        b.end_pipeline_step(&mut ps);
        from = ps.step + 1;
    }
    (from..=steps).for_each(|step| b.pipeline_step(step));
    let (ready, ext) = (std::mem::take(&mut b.ready), std::mem::take(&mut b.ext_deps));
    let stage = Stage { plan: sp.clone(), schedule: b.into_schedule(stage_model_flops(dag, sp), steps) };
    (stage, ready, ext)
}

/// Finished stages and the links between them.
fn assemble(plans: &[std::sync::Arc<Plan>], built: Vec<Finished>) -> Pipeline {
    let mut links = Vec::new();
    resolve(&plans[0], built.iter().map(|x| (&x.1, x.2.as_slice())), |l| links.push(l), |_, _| {});
    Pipeline { stages: built.into_iter().map(|x| x.0).collect(), links }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_warms_up_p_minus_k_minus_1_forwards() {
        let o = order(PipelineSchedule::OneFOneB, 4, 1, 6, 1);
        let s: String = o.iter().map(|&(f, mb, _)| format!("{}{mb} ", if f { 'F' } else { 'B' })).collect();
        assert_eq!(s.trim(), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
        // The last stage alternates from the start.
        let o = order(PipelineSchedule::OneFOneB, 4, 3, 3, 1);
        assert_eq!(o, vec![(true, 0, 0), (false, 0, 0), (true, 1, 0), (false, 1, 0), (true, 2, 0), (false, 2, 0)]);
    }

    #[test]
    fn interleaved_runs_chunks_in_groups_of_p_micro_batches() {
        // p = 2, v = 2, m = 4 on stage 0: warm-up 2 (p - 1) + (v - 1) p = 4 forwards.
        let o = order(PipelineSchedule::Interleaved, 2, 0, 4, 2);
        let s: Vec<String> = o.iter().map(|&(f, mb, c)| format!("{}{mb}.{c}", if f { 'F' } else { 'B' })).collect();
        assert_eq!(s[..4], ["F0.0", "F1.0", "F0.1", "F1.1"]);
        assert_eq!(s[4..6], ["F2.0", "B0.1"]);
        assert_eq!(o.len(), 16);
        assert_eq!(o.iter().filter(|x| x.0).count(), 8);
    }

    #[test]
    fn gpipe_runs_every_forward_first() {
        let o = order(PipelineSchedule::Gpipe, 4, 0, 3, 1);
        assert!(o[..3].iter().all(|x| x.0) && o[3..].iter().all(|x| !x.0));
    }
}
