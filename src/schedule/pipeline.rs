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
    pub plan: Plan,
    pub schedule: Schedule,
}

/// Every stage, and the dependencies between them (parts are stages: a receive waits for
/// the matching send, the tied-embedding all-reduce for its partner).
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub stages: Vec<Stage>,
    pub links: Vec<PartLink>,
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
        self.begin_step();
        self.megatron_step_start(step);
        if self.plan.parallel.model_parallel.schedule.is_dualpipe() {
            self.dualpipe_passes(step);
        } else {
            self.scheduled_passes(step);
        }
        self.step_end(step);
    }

    /// One step's forwards and backwards in the order of a GPipe, 1F1B or interleaved
    /// schedule.
    fn scheduled_passes(&mut self, step: u32) {
        let mp = &self.plan.parallel.model_parallel;
        let m = self.plan.training.grad_accum;
        let mut pending = HashMap::new();
        let overlap = self.plan.parallel.megatron.overlap_moe_expert_parallel_comm;
        let order = order_with(mp.schedule, mp.pipeline, self.plan.stage, m, mp.virtual_stages, overlap);
        // Each chunk's last backward of the step: where FSDP reduces its gradients.
        let last_bwd: Vec<Option<usize>> =
            (0..self.chunk_ops.len()).map(|c| order.iter().rposition(|&(f, _, ch)| !f && ch == c)).collect();
        let mut k = 0;
        while k < order.len() {
            let (fwd, mb, c) = order[k];
            self.mark_period();
            // A steady-state forward and the backward after it run as one combined step.
            let paired =
                order.get(k + 1).filter(|&&(f, bmb, bc)| overlap && fwd && !f && pending.contains_key(&(bmb, bc)));
            if let Some(&(_, bmb, bc)) = paired {
                let b = ep_overlap::PairedBackward {
                    mb: bmb,
                    chunk: bc,
                    fwd: pending.remove(&(bmb, bc)).expect("checked above"),
                    last_mb: false,
                    sync_grads: last_bwd[bc] == Some(k + 1),
                };
                let f = self.forward_backward(step, mb, c, b);
                pending.insert((mb, c), f);
                k += 2;
                continue;
            }
            if fwd {
                let f = self.forward(step, mb, c);
                pending.insert((mb, c), f);
            } else if let Some(f) = pending.remove(&(mb, c)) {
                self.backward(step, mb, c, f, false, last_bwd[c] == Some(k));
            }
            k += 1;
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
    use rayon::prelude::*;
    let p = plan.pipeline();
    // Stages are built independently (in parallel: a large pipeline's stages are most of a
    // run's set-up) and collected in stage order, so the result does not depend on threads.
    let built: Vec<_> = (0..p)
        .into_par_iter()
        .map(|k| {
            let sp = plan.stage(dag, k);
            let cost = Cost::for_plan(cluster, &sp);
            let mut b = Builder::new(dag, &sp, &cost, names);
            b.reserve(steps);
            b.init();
            for step in 1..=steps {
                b.pipeline_step(step);
            }
            let (ready, ext) = (std::mem::take(&mut b.ready), std::mem::take(&mut b.ext_deps));
            let model_flops = 3.0 * dag.model_forward_flops() * sp.training.grad_accum as f64
                / (p * sp.parallel.model_parallel.tensor) as f64;
            let schedule = b.into_schedule(model_flops, steps);
            (Stage { plan: sp, schedule }, ready, ext)
        })
        .collect();
    let mut links = Vec::new();
    for (k, (_, _, ext)) in built.iter().enumerate() {
        for &(t, port) in ext {
            let target = plan.parallel.model_parallel.rank_of_virtual_stage(port.virtual_stage) as usize;
            if let Some(&r) = built[target].1.get(&port) {
                links.push(PartLink { part: k, task: t, dep_part: target, dep: r });
            }
        }
    }
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
