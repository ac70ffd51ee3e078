//! Megatron-LM's own communication schedule, as Megatron-Core 0.8 (commit f2e5db402c, the
//! version behind the README's H100 table) issues it:
//!
//! - **Gradient buckets** (`megatron/core/distributed/param_and_grad_buffer.py`): the
//!   parameters of a model chunk are laid out in one contiguous buffer in backward order and
//!   cut into buckets of [`crate::plan::MegatronConfig::bucket_elements`]. With
//!   `--overlap-grad-reduce` a bucket's collective (all-reduce, or the distributed
//!   optimizer's reduce-scatter) is launched by the backward hook of the bucket's last
//!   parameter in the step's last micro-batch (earlier ones run under `no_sync`), so it runs
//!   during the rest of the backward. Without it there is one bucket, reduced by
//!   `finalize_model_grads` once the backward is over.
//! - **Parameter all-gather** (`megatron/core/optimizer/distrib_optimizer.py`): after the
//!   distributed optimizer's step the updated shards are all-gathered bucket by bucket. With
//!   `--overlap-param-gather` the first bucket's all-gather is dispatched by `zero_grad` and
//!   each further one by the forward pre-hook that waits for the one before it
//!   (`_finish_param_sync_helper`: one bucket in flight, so communication kernels do not
//!   head-of-line block compute under `CUDA_DEVICE_MAX_CONNECTIONS=1`); the first forward of
//!   the next step waits for each bucket at its first module.
//! - **The gradient buffer** (`_ParamAndGradBuffer.__init__`): every local parameter's
//!   `main_grad` is a view into one contiguous buffer in the gradient dtype (FP32 under
//!   `--bf16`), allocated with `torch.zeros` when the model is wrapped and zeroed in place by
//!   `zero_grad_buffer()` at each step's start, never freed; the distributed optimizer's
//!   gradient shard is a view into it.
//! - **`--tp-comm-overlap`** (Transformer Engine userbuffers): a sequence-parallel
//!   all-gather or reduce-scatter is split into one chunk per tensor-parallel rank and
//!   pipelined with the GEMM that consumes (or produces) it, so the pair takes
//!   max(GEMM, comm) + min(GEMM, comm) / tp instead of GEMM + comm. The backward's
//!   re-gather and input-gradient reduce-scatter already run beside the other GEMM
//!   (TE's bulk overlap), as without the flag.

use super::backward::Bwd;
use super::forward::FwdPass;
use super::{Builder, Category, Collective, Phase, TaskKind, TaskLabel, COMPUTE, NCCL};
use crate::model::{Op, OpKind};
use crate::plan::{Framework, Sharding};

/// The gradient buckets of a stage: which bucket each op's parameters are in, each bucket's
/// elements and the op that opens it in forward order (the lowest index).
#[derive(Debug, Clone, Default)]
pub(super) struct Buckets {
    pub of_op: Vec<Option<u32>>,
    pub elements: Vec<u64>,
    /// Of each bucket's elements, routed experts' (reduced over the expert-data-parallel
    /// group).
    pub expert_elements: Vec<u64>,
    pub first_op: Vec<usize>,
}

impl Buckets {
    /// Cuts each chunk's parameters, walked in backward order, into buckets of at least
    /// `limit(chunk)` elements (None: the chunk is one bucket). Bucket numbers run chunk by
    /// chunk, each chunk's in forward order (the order the all-gathers are dispatched).
    pub fn new(ops: &[Op], chunks: &[(usize, usize)], limit: impl Fn(usize) -> Option<u64>) -> Buckets {
        let mut b = Buckets { of_op: vec![None; ops.len()], ..Default::default() };
        for (c, &(lo, hi)) in chunks.iter().enumerate() {
            let cap = limit(c).unwrap_or(u64::MAX);
            // Buckets of this chunk, from the head down, as (elements, ops).
            let mut cut: Vec<(u64, Vec<usize>)> = Vec::new();
            let mut open = (0u64, Vec::new());
            for i in (lo..hi).rev() {
                if ops[i].params == 0 {
                    continue;
                }
                open.0 += ops[i].params;
                open.1.push(i);
                if open.0 >= cap {
                    cut.push(std::mem::take(&mut open));
                }
            }
            if !open.1.is_empty() {
                cut.push(open);
            }
            for (el, members) in cut.into_iter().rev() {
                let k = b.elements.len() as u32;
                for &i in &members {
                    b.of_op[i] = Some(k);
                }
                b.elements.push(el);
                b.expert_elements.push(members.iter().filter(|&&i| ops[i].expert).map(|&i| ops[i].params).sum());
                b.first_op.push(members.iter().copied().min().unwrap_or(lo));
            }
        }
        b
    }
}

/// Parameters of `plan`'s stage whose gradients are partial over the tensor-parallel group
/// ([`crate::model::Op::tp_partial_grad`]): what `finalize_model_grads` all-reduces there.
pub fn partial_grad_params(dag: &crate::model::LayerDag, plan: &crate::plan::Plan) -> u64 {
    dag.ops.iter().filter(|o| o.tp_partial_grad && plan.unit_of(o.region) != usize::MAX).map(|o| o.params).sum()
}

impl Builder<'_> {
    /// Megatron's `finalize_model_grads` all-reduces, over the tensor-parallel group, the
    /// gradients of weights duplicated there and run on sequence shards (Transformer Engine's
    /// `TELinear(parallel_mode="duplicated")` sets `sequence_parallel` on them: MLA's down
    /// projections, [`crate::model::Op::tp_partial_grad`]) after the data-parallel reduction
    /// and before the optimizer step. The norms' weights, which it reduces with them, are not
    /// counted (small).
    pub(super) fn megatron_partial_grads_all_reduce(&mut self, step: u32) {
        let params = partial_grad_params(self.dag, self.plan);
        if !self.is_megatron() || params == 0 {
            return;
        }
        let bytes = params * self.pr().grad.bytes();
        let secs = self.cost.collective_s(&self.cost.tp_group, Collective::AllReduce, bytes);
        let label = TaskLabel::new(
            step,
            Phase::Backward,
            0,
            text!(self.names, "all-reduce duplicated weights' gradients over tensor parallelism (MLA down projections, finalize_model_grads)"),
            TaskKind::AllReduce,
            None,
        );
        let deps: Vec<u32> = self.step_comm.last().copied().into_iter().collect();
        let t = self.task(NCCL, secs, deps, [], label.with_work(0.0, bytes));
        self.step_comm.push(t);
    }

    pub(super) fn is_megatron(&self) -> bool {
        self.plan.parallel.framework == Framework::Megatron
    }

    /// Initialisation: the contiguous gradient buffer of every local parameter.
    pub(super) fn megatron_init(&mut self) {
        if !self.is_megatron() {
            return;
        }
        let dtype = self.pr().grad;
        let b = self.buffer(
            self.plan.local_total(false) * dtype.bytes(),
            Category::Gradients,
            text!(self.names, "Megatron DDP gradient buffer (main_grad of every local parameter, {})", dtype.name()),
        );
        let label =
            TaskLabel::new(0, Phase::Init, 0, text!(self.names, "Megatron DDP gradient buffer"), TaskKind::Init, None);
        self.task(COMPUTE, 0.0, [], [b], label);
    }

    /// Megatron reduces this backward's gradients bucket by bucket as it goes: the last
    /// micro-batch without a pipeline; with one, a chunk's last backward of the step under
    /// `--overlap-grad-reduce` (without it, `finalize_model_grads` reduces after the
    /// schedule, see `pipeline`).
    pub(super) fn megatron_reduces_in_backward(&self, last_mb: bool, sync_grads: bool) -> bool {
        if !self.is_megatron() || !self.plan.grads_reduced() {
            return false;
        }
        if self.plan.pipeline() > 1 {
            sync_grads && self.plan.parallel.megatron.overlap_grad_reduce
        } else {
            last_mb
        }
    }

    /// After op `i`'s backward (task `t`): once the op that opens a bucket is done, every
    /// gradient of the bucket is ready and its collective is launched on the NCCL queue.
    pub(super) fn megatron_bucket_after(&mut self, st: &Bwd, i: usize, t: u32, last_mb: bool) {
        if !self.megatron_reduces_in_backward(last_mb, st.sync_grads) {
            return;
        }
        let Some(k) = self.mg_buckets.of_op[i] else { return };
        if self.mg_buckets.first_op[k as usize] != i {
            return;
        }
        // A zero-bubble backward (DualPipe) deferred some of the bucket's weight gradients:
        // the bucket is ready when the last of them, the lowest op's, has run in its W pass
        // (as Megatron-Core's hooks fire after Transformer Engine's delayed wgrad).
        let deferred = self.wgrad.cache.iter_mut().rev().find(|w| self.mg_buckets.of_op[w.op] == Some(k));
        if let Some(w) = deferred {
            w.bucket = Some((st.step, st.mb));
            return;
        }
        self.megatron_bucket_reduce(st.step, st.mb, k as usize, t);
    }

    /// Bucket `k`'s reduction (micro-batch `mb` of `step`), once task `t` has made its
    /// gradients ready.
    pub(super) fn megatron_bucket_reduce(&mut self, step: u32, mb: u32, k: usize, t: u32) {
        let g = self.pr().grad.bytes();
        let (bytes, expert) = (self.mg_buckets.elements[k] * g, self.mg_buckets.expert_elements[k] * g);
        let (coll, kind, what) = match self.plan.parallel.sharding {
            Sharding::Zero1 => (Collective::ReduceScatter, TaskKind::ReduceScatter, "reduce-scatter"),
            _ => (Collective::AllReduce, TaskKind::AllReduce, "all-reduce"),
        };
        let secs = self.cost.dp_collective_s(coll, bytes, expert);
        let label = TaskLabel::new(
            step,
            Phase::Backward,
            mb,
            text!(self.names, "{what} gradient bucket {k} ({} elements, Megatron DDP)", self.mg_buckets.elements[k]),
            kind,
            None,
        );
        let r = self.task(NCCL, secs, [t], [], label.with_work(0.0, bytes));
        self.step_comm.push(r);
    }

    /// `--overlap-param-gather`: the optimizer leaves the all-gather of updated parameters to
    /// the next step's first forward.
    pub(super) fn megatron_defers_param_gather(&self) -> bool {
        self.is_megatron() && self.plan.parallel.megatron.overlap_param_gather
    }

    /// The all-gather of bucket `k`'s updated parameters (labelled with the step whose
    /// forward waits for it), after `deps`.
    fn megatron_param_gather(&mut self, step: u32, k: usize, deps: Vec<u32>) -> u32 {
        let pb = self.pr().param.bytes();
        let (bytes, expert) = (self.mg_buckets.elements[k] * pb, self.mg_buckets.expert_elements[k] * pb);
        let secs = self.cost.dp_collective_s(Collective::AllGather, bytes, expert);
        let label = TaskLabel::new(
            step,
            Phase::Forward,
            0,
            text!(self.names, "all-gather updated parameters, bucket {k} (--overlap-param-gather)"),
            TaskKind::AllGather,
            None,
        );
        self.task(NCCL, secs, deps, [], label.with_work(0.0, bytes))
    }

    /// At the start of a step after the first: `zero_grad` dispatches the first bucket's
    /// all-gather of the previous step's update.
    pub(super) fn megatron_step_start(&mut self, step: u32) {
        self.mg_param_ag.iter_mut().for_each(|a| *a = None);
        if step == 1
            || !self.megatron_defers_param_gather()
            || !self.plan.grads_reduced()
            || self.mg_buckets.elements.is_empty()
        {
            return;
        }
        let deps = self.last_task_of_prev_step.into_iter().collect();
        self.mg_param_ag[0] = Some(self.megatron_param_gather(step, 0, deps));
    }

    /// Before op `i`'s forward: the forward pre-hook of a bucket's first module waits for its
    /// all-gather and dispatches the next bucket's.
    pub(super) fn megatron_pre_forward(&mut self, st: &FwdPass, i: usize, deps: &mut Vec<u32>) {
        let Some(k) = self.mg_buckets.of_op[i] else { return };
        let k = k as usize;
        let Some(ag) = self.mg_param_ag[k].take() else { return };
        deps.push(ag);
        if k + 1 < self.mg_buckets.elements.len() && self.mg_param_ag[k + 1].is_none() {
            // Enqueued when the CPU reaches this module: after the compute issued before it.
            let mut d = vec![ag];
            d.extend(deps.iter().copied().filter(|&x| x != ag));
            self.mg_param_ag[k + 1] = Some(self.megatron_param_gather(st.step, k + 1, d));
        }
    }

    /// What a tensor-parallel collective of `comm_s` adds beside its GEMM of `gemm_s` under
    /// `--tp-comm-overlap` ([`pipelined_extra_s`]).
    pub(super) fn tp_overlapped_s(&self, comm_s: f64, gemm_s: f64) -> f64 {
        pipelined_extra_s(comm_s, gemm_s, self.plan.parallel.model_parallel.tensor)
    }

    /// The GEMM time a sequence-parallel collective of op `i` is pipelined with, if
    /// `--tp-comm-overlap` is on: forward all-gather with the column-parallel linears that
    /// read its output, forward reduce-scatter with the row-parallel linear that produced its
    /// input, and that reduce-scatter's backward all-gather with the linear's input-gradient
    /// GEMM.
    pub(super) fn tp_overlap_gemm_s(&self, i: usize, forward: bool) -> Option<f64> {
        let p = &self.plan.parallel;
        if !((self.is_megatron() && p.megatron.tp_comm_overlap) || p.async_tp) {
            return None;
        }
        let dag = self.dag;
        let op = &dag.ops[i];
        let comm = op.comm?;
        // Transformer Engine's userbuffers pipeline the tensor-parallel linears' collectives;
        // the token dispatcher's expert-tensor-parallel ones are plain NCCL calls (and
        // `TELinear.__init__` turns userbuffers off for expert linears: `if is_expert:
        // extra_kwargs["ub_overlap_ag"] = False`).
        if comm.group != crate::model::CommGroup::Tensor {
            return None;
        }
        let coll = if forward { comm.forward? } else { comm.backward? };
        match (forward, coll) {
            (true, Collective::AllGather) => {
                let out = *op.outputs.first()?;
                let s: f64 = dag.ops[i + 1..]
                    .iter()
                    .take_while(|o| o.region == op.region && o.comm.is_none())
                    .filter(|o| o.kind == OpKind::Linear && o.inputs.contains(&out))
                    .map(|o| self.cost.forward_s(o))
                    .sum();
                Some(s)
            }
            (true, Collective::ReduceScatter) => {
                let p = dag.tensors[*op.inputs.first()?].producer?;
                Some(self.cost.forward_s(&dag.ops[p]))
            }
            (false, Collective::AllGather) if comm.backward_buffer == 0 => {
                let p = dag.tensors[*op.inputs.first()?].producer?;
                let (secs, share) = self.cost.backward_split(&dag.ops[p]);
                Some(secs * share)
            }
            _ => None,
        }
    }
}

/// Seconds a collective of `comm_s` adds to a GEMM of `gemm_s` when both are split into `tp`
/// chunks and pipelined (chunk i's GEMM beside chunk i + 1's transfer): the pair takes
/// max + min / tp, of which the GEMM's own time is already counted.
pub(super) fn pipelined_extra_s(comm_s: f64, gemm_s: f64, tp: u64) -> f64 {
    let pair = comm_s.max(gemm_s) + comm_s.min(gemm_s) / tp.max(1) as f64;
    (pair - gemm_s).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Op, OpKind, Region};

    fn op(params: u64) -> Op {
        Op::new(String::new(), OpKind::Linear, Region::Embed, params)
    }

    #[test]
    fn buckets_are_cut_walking_backward_and_numbered_forward() {
        // Ops 0..5 with parameters 5, 0, 3, 3, 3: walking back from op 4, buckets close once
        // they reach 5 elements: {4, 3} (6), {2, 0} (8, the remainder).
        let ops: Vec<Op> = [5, 0, 3, 3, 3].into_iter().map(op).collect();
        let b = Buckets::new(&ops, &[(0, 5)], |_| Some(5));
        assert_eq!(b.elements, vec![8, 6]);
        assert_eq!(b.of_op, vec![Some(0), None, Some(0), Some(1), Some(1)]);
        assert_eq!(b.first_op, vec![0, 3]);
        // No limit: the chunk is one bucket; a second chunk continues the numbering.
        let b = Buckets::new(&ops, &[(0, 2), (2, 5)], |c| if c == 0 { None } else { Some(1) });
        assert_eq!(b.elements, vec![5, 3, 3, 3]);
        assert_eq!(b.first_op, vec![0, 2, 3, 4]);
    }

    #[test]
    fn a_pipelined_collective_costs_one_chunk_when_its_gemm_is_longer() {
        // 8 ms GEMM, 4 ms transfer over 8 ranks: 8 + 4/8 = 8.5 ms for the pair.
        assert!((pipelined_extra_s(4e-3, 8e-3, 8) - 0.5e-3).abs() < 1e-12);
        // Transfer-bound: 10 + 2/8 ms, 8.25 ms beyond the 2 ms GEMM.
        assert!((pipelined_extra_s(10e-3, 2e-3, 8) - 8.25e-3).abs() < 1e-12);
        // No GEMM to hide behind: the whole transfer.
        assert_eq!(pipelined_extra_s(3e-3, 0.0, 8), 3e-3);
    }
}
