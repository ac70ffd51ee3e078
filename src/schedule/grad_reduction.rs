//! Gradient reduction over the data-parallel ranks where parameters are replicated: DDP's
//! bucketed all-reduce in backward (`torch/nn/parallel/distributed.py`, `reducer.cpp`: buckets
//! of `bucket_cap_mb`, all-reduced as they fill, only in the last micro-batch under
//! `no_sync()`), ZeRO-1's reduce-scatter once accumulation is done, hybrid sharding's
//! all-reduce of the shard across nodes, and the pipeline's reduction after its last backward
//! (Megatron-LM `finalize_model_grads`: DDP all-reduce, or the distributed optimizer's
//! reduce-scatter).

use super::backward::Bwd;
use super::{Builder, Category, Collective, Phase, TaskKind, TaskLabel, NCCL};
use crate::model::Op;
use crate::plan::Sharding;

impl Builder<'_> {
    /// A backward all-reduce of `bytes` (of which routed experts') on the NCCL queue after
    /// task `after`, over all data-parallel ranks (the experts' over their
    /// expert-data-parallel group) or (`replica`) the cross-node replicas of hybrid sharding;
    /// the optimizer step waits for it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn all_reduce_after(
        &mut self,
        step: u32,
        mb: u32,
        u: usize,
        after: u32,
        replica: bool,
        bytes: (u64, u64),
        what: String,
    ) {
        let (bytes, expert) = bytes;
        let secs = if replica {
            self.cost.collective_s(&self.cost.replica_group, Collective::AllReduce, bytes)
        } else {
            self.cost.dp_collective_s(Collective::AllReduce, bytes, expert)
        };
        let label = TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::AllReduce, Some(u)).with_work(0.0, bytes);
        let ar = self.task(NCCL, secs, [after], [], label);
        self.step_comm.push(ar);
    }

    /// A replicated parameter's `.grad` (DDP, ZeRO-1: kept for the whole step), created by the first backward that produces it. A tied head accumulates into
    /// the embedding's gradient.
    pub(super) fn replicated_grad(&mut self, op: &Op, i: usize, alloc: &mut Vec<u32>) {
        if self.is_megatron() {
            // `main_grad` is a view into the gradient buffer allocated at init.
            return;
        }
        let owner = if op.shared_params > 0 { 0 } else { i };
        if self.op_grad_bufs[owner].is_none() {
            let el = op.params.max(op.shared_params);
            let dtype = self.replicated_grad_dtype();
            let b = self.buffer(
                el * dtype.bytes(),
                Category::Gradients,
                text!(self.names, "{} .grad ({})", self.dag.ops[owner].name, dtype.name()),
            );
            self.op_grad_bufs[owner] = Some(b);
            alloc.push(b);
        }
    }

    /// DDP: all-reduce a bucket once it is full (only on the last micro-batch: the earlier
    /// ones run under no_sync()).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ddp_bucket_after(
        &mut self,
        st: &mut Bwd,
        op: &Op,
        i: usize,
        lo: usize,
        u: usize,
        t: u32,
        last_mb: bool,
    ) {
        let plan = self.plan;
        if plan.ddp_reducer() && last_mb {
            let bytes = op.params * self.pr().grad.bytes();
            st.ddp_bucket.0 += bytes;
            if op.expert {
                st.ddp_bucket.1 += bytes;
            }
            if st.ddp_bucket.0 >= plan.parallel.bucket_bytes || i == lo {
                let what = text!(self.names, "all-reduce DDP bucket ending at {}", op.name);
                self.all_reduce_after(st.step, st.mb, u, t, false, st.ddp_bucket, what);
                st.ddp_bucket = (0, 0);
            }
        }
    }

    /// ZeRO-1: reduce the full gradients once accumulation is done (the last micro-batch).
    pub(super) fn zero1_reduce_scatter(&mut self, st: &Bwd) {
        let plan = self.plan;
        if plan.parallel.sharding != Sharding::Zero1 || !plan.grads_reduced() {
            return;
        }
        let g = self.pr().grad.bytes();
        let (bytes, expert) = (plan.total_params() * g, plan.expert_params() * g);
        let secs = self.cost.dp_collective_s(Collective::ReduceScatter, bytes, expert);
        let t = self.task(
            NCCL,
            secs,
            [st.last_bwd_task],
            [],
            TaskLabel::new(
                st.step,
                Phase::Backward,
                st.mb,
                text!(self.names, "reduce-scatter gradients (ZeRO-1)"),
                TaskKind::ReduceScatter,
                None,
            )
            .with_work(0.0, bytes),
        );
        self.step_comm.push(t);
    }
}
