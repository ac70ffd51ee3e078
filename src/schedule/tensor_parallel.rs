//! Tensor-parallel collectives (Megatron-LM `megatron/core/tensor_parallel/mappings.py` and
//! `layers.py`): the all-reduces (all-gathers / reduce-scatters with sequence parallelism)
//! of column- and row-parallel linears, on their own stream over the tensor-parallel group;
//! and the MoE token dispatcher's all-to-alls, collectives between ops of the same kind, on
//! theirs over the expert-parallel group; its all-gather and reduce-scatter around the
//! experts over the expert-tensor-parallel group, on the tensor-parallel stream.

use super::backward::Bwd;
use super::forward::FwdPass;
use super::{Builder, Category, Collective, Phase, TaskKind, TaskLabel};
use crate::model::{CommGroup, Op, TpComm};

impl Builder<'_> {
    /// A model-parallel collective's time and stream, by the group its op names.
    fn tp_time(&self, group: Option<CommGroup>, coll: Collective, bytes: u64) -> (f64, u16) {
        match group {
            // The token dispatcher's all-to-alls: NCCL's, or DeepEP's kernels.
            Some(CommGroup::Expert) if coll == Collective::AllToAll => (self.cost.ep_a2a_s(bytes), self.ep_stream),
            Some(CommGroup::Expert) => (self.cost.collective_s(&self.cost.ep_group, coll, bytes), self.ep_stream),
            Some(CommGroup::ExpertTensor) => {
                (self.cost.collective_s(&self.cost.etp_group, coll, bytes), self.tp_stream)
            }
            // The auxiliary losses' counts: a few hundred bytes, latency-bound, blocking the
            // next kernel like the other collectives of the forward.
            Some(CommGroup::TensorContext) => {
                (self.cost.collective_s(&self.cost.tp_cp_group, coll, bytes), self.aux_stream)
            }
            Some(CommGroup::Stage) => (self.cost.collective_s(&self.cost.stage_group, coll, bytes), self.aux_stream),
            _ => (self.cost.collective_s(&self.cost.tp_group, coll, bytes), self.tp_stream),
        }
    }

    /// A tensor-parallel collective of op `i` on the TP stream after task `after` (the
    /// forward's, or with `phase` backward and not `recompute`, the backward's); under
    /// `--tp-comm-overlap` it costs what it adds beside the GEMM it is pipelined with.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tp_task(
        &mut self,
        step: u32,
        phase: Phase,
        mb: u32,
        i: usize,
        coll: Collective,
        after: u32,
        alloc: Vec<u32>,
        recompute: bool,
    ) -> u32 {
        let op = &self.dag.ops[i];
        let forward = recompute || phase != Phase::Backward;
        let bytes = op.comm.map_or(0, |c| if forward { c.forward_bytes.unwrap_or(c.bytes) } else { c.bytes });
        let group = op.comm.map(|c| c.group);
        let key = (group, coll, bytes);
        let (mut secs, stream) = match self.tp_times.iter().find(|(k, _)| *k == key) {
            Some(&(_, hit)) => hit,
            None => {
                let t = self.tp_time(group, coll, bytes);
                self.tp_times.push((key, t));
                t
            }
        };
        if let Some(gemm) = self.tp_overlap_gemm_s(i, forward) {
            secs = self.tp_overlapped_s(secs, gemm);
        }
        let kind = match coll {
            Collective::AllGather => TaskKind::AllGather,
            Collective::ReduceScatter => TaskKind::ReduceScatter,
            Collective::AllReduce => TaskKind::AllReduce,
            Collective::AllToAll => TaskKind::AllToAll,
        };
        let what = match (recompute, phase) {
            (true, _) => text!(self.names, "{} (recompute)", op.name),
            (false, Phase::Backward) => text!(self.names, "{} (backward)", op.name),
            _ => text!(self.names, "{}", op.name),
        };
        let u = self.plan.unit_of(op.region);
        let label = TaskLabel::new(step, phase, mb, what, kind, Some(u)).with_region(op.region).with_work(0.0, bytes);
        self.use_compute_pool(&alloc);
        let t = self.task(stream, secs, [after], &alloc, label);
        self.give_back(alloc);
        t
    }

    /// The backward of a tensor-parallel op: its collective on the gradient, after the
    /// input-gradient GEMM it reduces (or, re-gathering a sequence-parallel input, beside
    /// the GEMMs, for the weight-gradient GEMM alone).
    pub(super) fn tp_backward(&mut self, st: &mut Bwd, op: &Op, i: usize, comm: TpComm) {
        let Some(coll) = comm.backward else { return };
        let (step, mb) = (st.step, st.mb);
        let mut alloc = self.spare();
        self.input_grads(op, mb, &mut st.grad_buf, &mut alloc);
        if comm.backward_buffer > 0 {
            let b = self.buffer(
                comm.backward_buffer,
                Category::CommBuffers,
                text!(self.names, "{} buffer (micro-batch {mb})", op.name),
            );
            alloc.push(b);
            st.free_bwd.push(comm.backward_buffer_until.unwrap_or(i), b);
        }
        let regathers = comm.backward_buffer > 0;
        // The input-gradient collective starts after the input-gradient GEMM.
        let after = if regathers { None } else { st.dgrad.take() };
        let after = after.or(st.pending.take()).unwrap_or(st.last_bwd_task);
        let t = self.tp_task(step, Phase::Backward, mb, i, coll, after, alloc, false);
        let mut f = self.spare();
        st.free_bwd.take_into(i, &mut f);
        f.extend(op.outputs.iter().filter_map(|&o| st.grad_buf[o]));
        self.free_at(t, &f);
        self.give_back(f);
        if regathers {
            // Only the weight-gradient GEMMs need the re-gathered input.
            st.regather = Some(t);
        } else {
            st.pending = Some(t);
        }
    }

    /// Megatron's column-parallel backward: the input-gradient GEMM first, then its
    /// all-reduce (reduce-scatter) runs while the weight-gradient GEMM computes; with
    /// sequence parallelism the input's all-gather overlaps the first GEMM. Returns the
    /// weight-gradient GEMM.
    pub(super) fn column_parallel_backward(
        &mut self,
        st: &mut Bwd,
        (i, op): (usize, &Op),
        u: usize,
        deps: Vec<u32>,
        alloc: Vec<u32>,
        n_input_grads: usize,
    ) -> u32 {
        let wdeps = st.regather.take().into_iter().collect();
        let (d, t) = self.split_backward((st.step, st.mb), (i, op), u, deps, alloc, n_input_grads, wdeps);
        st.dgrad = Some(d);
        t
    }

    /// The forward of a tensor-parallel op: its collective on the TP stream, after the op
    /// before it, into its output buffers.
    pub(super) fn tp_forward(&mut self, st: &mut FwdPass, op: &Op, i: usize, comm: TpComm) {
        let Some(coll) = comm.forward else { return };
        let dag = self.dag;
        let mb = st.mb;
        let mut alloc = Vec::new();
        for &t in &op.outputs {
            let tp = self.ck.tensors[t];
            let b = self.buffer(
                dag.tensors[t].bytes,
                Category::Transient,
                text!(self.names, "{} (micro-batch {mb})", dag.tensors[t].name),
            );
            alloc.push(b);
            if tp.kept {
                self.keep_for_backward(st, t, b, i);
            } else {
                st.free_fwd.push(tp.last_consumer.unwrap_or(i).max(i), b);
            }
        }
        let t = self.tp_task(st.step, Phase::Forward, mb, i, coll, st.last, alloc, false);
        let mut f = self.spare();
        st.free_fwd.take_into(i, &mut f);
        self.free_at(t, &f);
        self.give_back(f);
        st.pending = Some(t);
    }
}
