//! Activation recomputation in backward (PyTorch `torch.utils.checkpoint`, Megatron-LM
//! `--recompute-granularity full | selective`): under full checkpointing a block's forward
//! runs again before its backward, re-creating the tensors its backward needs (and the
//! transients between them, and its tensor-parallel collectives); under selective
//! checkpointing only the attention core's s x s scores are recomputed, just before its
//! backward; under torchtitan's per-op policy a block reruns only the ops that write what
//! its backward needs and the policy did not save. Which tensors are dropped, and which ops
//! rerun, is decided once per program, in [`super::checkpoint::plan`].

use super::backward::Bwd;
use super::{Builder, Category, Checkpointing, Phase, TaskKind, TaskLabel, COMPUTE};
use crate::model::{Op, OpKind};

impl Builder<'_> {
    /// Full checkpointing: block `l`'s forward again, before its first backward kernel
    /// (the first recompute task waits for `deps`, as that kernel does).
    pub(super) fn recompute_block(&mut self, st: &mut Bwd, l: usize, u: usize, deps: &[u32]) {
        let dag = self.dag;
        let (step, mb) = (st.step, st.mb);
        let cb = self.pr().compute.bytes();
        let casts = self.pr().autocast_casts(self.plan.params_sharded);
        let ck = self.ck.clone();
        let rops = &ck.recompute_ops[l];
        let mut rpending: Option<u32> = None;
        // (op after which to free, buffer): the recompute transients of one op.
        let mut frees: Vec<(usize, u32)> = Vec::new();
        for (k, &ri) in rops.iter().enumerate() {
            let rop = &dag.ops[ri];
            if rop.comm.is_some_and(|c| c.forward.is_none()) {
                continue;
            }
            let mut alloc = self.spare();
            frees.clear();
            for &t in &rop.outputs {
                let tp = self.ck.tensors[t];
                if tp.recomputed {
                    let b = self.buffer(
                        dag.tensors[t].bytes,
                        Category::Recomputed,
                        text!(self.names, "{} (recomputed, micro-batch {mb})", dag.tensors[t].name),
                    );
                    alloc.push(b);
                    st.free_bwd.push(tp.last_saver.unwrap_or(ri), b);
                } else if !tp.kept {
                    // Needed only by later recomputed ops.
                    let b = self.buffer(
                        dag.tensors[t].bytes,
                        Category::Transient,
                        text!(self.names, "{} (recompute transient)", dag.tensors[t].name),
                    );
                    alloc.push(b);
                    // Freed after its last consumer if that is recomputed too, else right
                    // away (nothing recomputed reads it).
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
            alloc.extend(self.blas_workspace(rop, 1));
            if casts && rop.kind == OpKind::Linear {
                let b = self.buffer(
                    (rop.params + rop.shared_params) * cb,
                    Category::GatheredParameters,
                    text!(self.names, "{} weight cast (recompute)", rop.name),
                );
                alloc.push(b);
                st.free_bwd.push(ri, b);
            }
            let t = if let Some(coll) = rop.comm.and_then(|c| c.forward) {
                // Recomputing the forward repeats its tensor-parallel collectives.
                let after = (self.prog.tasks.len() - 1) as u32;
                let t = self.tp_task(step, Phase::Backward, mb, ri, coll, after, alloc, true);
                rpending = Some(t);
                t
            } else {
                let secs = self.forward_secs(ri);
                self.hw_flops += rop.fwd_flops;
                let mut d = self.spare();
                if k == 0 {
                    d.extend_from_slice(deps);
                }
                d.extend(rpending.take());
                let fetched = self.zero3_fetch(ri, (step, mb, Phase::Backward), self.last_task(), &mut d);
                let t = self.task(
                    COMPUTE,
                    secs,
                    &d,
                    &alloc,
                    TaskLabel::new(
                        step,
                        Phase::Backward,
                        mb,
                        text!(self.names, "recompute {}", rop.name),
                        TaskKind::Recompute,
                        Some(u),
                    )
                    .with_region(rop.region)
                    .with_work(rop.fwd_flops, self.cost.forward_bytes(rop)),
                );
                self.give_back(d);
                self.give_back(alloc);
                self.zero3_release(ri, fetched, t);
                t
            };
            // Pending transient frees: attach now to this task if their consumer is this
            // op, else remember them for the consumer's recompute task.
            for &(at, b) in &frees {
                if at == ri {
                    self.free_at(t, &[b]);
                } else {
                    st.free_fwd.push(at, b);
                }
            }
            let mut pending = self.spare();
            st.free_fwd.take_into(ri, &mut pending);
            self.free_at(t, &pending);
            self.give_back(pending);
        }
        // Anything still pending: free at the end of the recompute. Only ops of the
        // recompute set can hold pending frees here (the forward pass consumed all of its
        // own, and a recompute transient's consumer is in the set), so the ops beyond it
        // need no visit.
        if !rops.is_empty() {
            let lt = (self.prog.tasks.len() - 1) as u32;
            let mut pend = self.spare();
            for &x in rops {
                st.free_fwd.take_into(x, &mut pend);
            }
            self.free_at(lt, &pend);
            self.give_back(pend);
        }
    }

    /// Selective checkpointing: recompute the attention core's scores just before its
    /// backward; the recompute takes over what the backward kernel would have waited for.
    pub(super) fn recompute_scores(&mut self, st: &mut Bwd, op: &Op, i: usize, u: usize, deps: &mut Vec<u32>) {
        let t = &self.plan.training;
        let scores = t.checkpointing == Checkpointing::Selective
            && t.recompute_modules.contains(&crate::plan::RecomputeModule::CoreAttn);
        if !scores || op.kind != OpKind::AttentionCore {
            return;
        }
        let dag = self.dag;
        let mb = st.mb;
        let mut alloc = Vec::new();
        for &t in &op.outputs {
            if self.ck.tensors[t].recomputed {
                let b = self.buffer(
                    dag.tensors[t].bytes,
                    Category::Recomputed,
                    text!(self.names, "{} (recomputed, micro-batch {mb})", dag.tensors[t].name),
                );
                alloc.push(b);
                st.free_bwd.push(i, b);
            }
        }
        if !alloc.is_empty() {
            let secs = self.forward_secs(i);
            self.hw_flops += op.fwd_flops;
            self.task(
                COMPUTE,
                secs,
                std::mem::take(deps),
                alloc,
                TaskLabel::new(
                    st.step,
                    Phase::Backward,
                    mb,
                    text!(self.names, "recompute {}", op.name),
                    TaskKind::Recompute,
                    Some(u),
                )
                .with_region(op.region)
                .with_work(op.fwd_flops, self.cost.forward_bytes(op)),
            );
        }
    }
}
