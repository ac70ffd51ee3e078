//! The backward pass of one micro-batch over one model chunk, in reverse op order. This
//! file is the skeleton: autograd's order of kernels and the lifetimes of activation
//! gradients. What a parallelism or framework adds happens at named points, each a method
//! of the module that models it:
//!
//! | point | what | module |
//! |---|---|---|
//! | start of the chunk | receive the output's gradient from the next stage | `pipeline` |
//! | a tensor-parallel op | its backward collective | `tensor_parallel` |
//! | first op of a block | pre-backward all-gather and prefetch | `sharding` |
//! | first op of a block | reload of offloaded activations (and the next block's prefetch) | `activation_offload` |
//! | first op of a block | full recomputation of the block's forward | `recompute` |
//! | the LM head | the root's pre-backward prefetch | `sharding` |
//! | the attention core | selective recomputation of its scores | `recompute` |
//! | an op with parameters | its weight gradient's buffer | `sharding` / `grad_reduction` |
//! | a column-parallel linear | input- and weight-gradient GEMMs apart | `tensor_parallel` |
//! | after each op | DDP's bucketed all-reduce, or Megatron's bucket collectives | `grad_reduction` / `megatron` |
//! | a unit's last op | post-backward: reshard, prefetch, reduce-scatter | `sharding` |
//! | end of the chunk | a stage's deferred post-backwards (no gradient sync before) | `sharding` |
//! | end of the chunk | send the input's gradient to the previous stage | `pipeline` |
//! | end of the chunk | ZeRO-1's reduce-scatter | `grad_reduction` |

use super::{Builder, Category, Fwd, Phase, Port, TaskKind, TaskLabel, COMPUTE};
use crate::model::{Op, Region};

/// What the backward of one chunk carries from op to op.
pub(super) struct Bwd {
    pub step: u32,
    pub mb: u32,
    /// Buffers freed at the end of an op's forward (recompute) or backward, by op index.
    pub free_fwd: super::free_lists::FreeLists,
    pub free_bwd: super::free_lists::FreeLists,
    /// Per block, what activation offload took to the host and its reload.
    pub offload: Vec<super::activation_offload::BlockOffload>,
    pub offload_count: usize,
    /// The last reload issued (overlapped activation offload).
    pub last_reload: Option<u32>,
    /// Each activation's gradient buffer, once its first consumer's backward created it.
    pub grad_buf: super::span::Span<Option<u32>>,
    /// Each unit's backward all-gather, once issued.
    pub ag_bwd_task: Vec<Option<u32>>,
    /// Bytes of DDP's bucket being filled.
    /// Bytes in DDP's open bucket, and of them routed experts'.
    pub ddp_bucket: (u64, u64),
    /// A tied head has created the embedding's gradient.
    pub tied_grad_done: bool,
    /// A collective (or receive) the next compute op waits for.
    pub pending: Option<u32>,
    /// What the chunk's first compute waits for (the previous send).
    pub first_deps: Vec<u32>,
    /// Column-parallel linears: the last input-gradient GEMM, and the all-gather of a
    /// sequence-parallel input the weight-gradient GEMM waits for.
    pub dgrad: Option<u32>,
    pub regather: Option<u32>,
    pub last_bwd_task: u32,
    /// This backward reduces the gradients (FSDP's `requires_gradient_sync`): every
    /// micro-batch's without a pipeline, a stage's last of the step with one.
    pub sync_grads: bool,
    /// The chunk this pass runs.
    pub chunk: usize,
    /// The step's last micro-batch (gradients are reduced in or after it).
    pub last_mb: bool,
    /// The micro-batch's input buffers, freed by the chunk's first op's backward.
    pub inputs: Vec<u32>,
    /// The region of the op before (in backward order).
    pub prev_region: Option<Region>,
}

impl Builder<'_> {
    pub(super) fn backward(&mut self, step: u32, mb: u32, c: usize, fwd: Fwd, last_mb: bool, sync_grads: bool) {
        let mut st = self.backward_begin(step, mb, c, fwd, last_mb, sync_grads);
        let (lo, hi) = self.chunk_ops[c];
        for i in (lo..hi).rev() {
            self.backward_op(&mut st, i);
        }
        self.backward_end(st);
    }

    /// The gradient's receive: what comes before the chunk's last op's backward.
    pub(super) fn backward_begin(
        &mut self,
        step: u32,
        mb: u32,
        c: usize,
        fwd: Fwd,
        last_mb: bool,
        sync_grads: bool,
    ) -> Bwd {
        let nunits = self.plan.units.len();
        let Fwd { free_fwd, free_bwd, offload, offload_count, loss_task, inputs } = fwd;
        let (recv_after, first_deps) = self.take_prior_send();
        let mut st = Bwd {
            step,
            mb,
            free_fwd,
            free_bwd,
            offload,
            offload_count,
            last_reload: None,
            grad_buf: super::span::Span::new(self.chunk_tensors[c].0, self.chunk_tensors[c].1),
            ag_bwd_task: vec![None; nunits],
            ddp_bucket: (0, 0),
            tied_grad_done: false,
            pending: None,
            first_deps,
            dgrad: None,
            regather: None,
            last_bwd_task: loss_task,
            sync_grads,
            chunk: c,
            last_mb,
            inputs,
            prev_region: None,
        };
        self.deepspeed_backward_start(step, mb);
        self.recv_gradient(&mut st, c, recv_after);
        self.bf16_clear_lp_grads(step, mb);
        st
    }

    /// Op `i`'s backward (ops are taken in reverse order).
    pub(super) fn backward_op(&mut self, st: &mut Bwd, i: usize) {
        let dag = self.dag;
        let plan = self.plan;
        let (step, mb) = (st.step, st.mb);
        let (lo, _) = self.chunk_ops[st.chunk];
        let op = &dag.ops[i];
        let u = plan.unit_of(op.region);
        if let Some(comm) = op.comm {
            self.tp_backward(st, op, i, comm);
            return;
        }
        let mut deps = self.spare();
        deps.extend(st.pending.take());
        deps.append(&mut st.first_deps);
        if st.prev_region != Some(op.region) {
            if let Region::Block(l) = op.region {
                self.mark_layer();
                self.pre_backward_block(st, l as usize, u, &mut deps);
                self.reload_block(st, l as usize, &mut deps);
                self.recompute_block(st, l as usize, u, &deps);
            }
        }
        st.prev_region = Some(op.region);
        self.root_pre_backward(st, op, &mut deps);
        self.recompute_scores(st, op, i, u, &mut deps);
        let mut alloc = self.spare();
        self.input_grads(op, mb, &mut st.grad_buf, &mut alloc);
        // The thread's cuBLAS workspace goes with the first kernel (a column-parallel
        // linear's input-gradient GEMM).
        alloc.extend(self.blas_workspace(op, 1));
        let n_input_grads = alloc.len();
        let scratch = (op.bwd_scratch > 0).then(|| {
            self.buffer(op.bwd_scratch, Category::Transient, text!(self.names, "{} backward scratch", op.name))
        });
        alloc.extend(scratch);
        let fetched = self.zero3_fetch(i, (step, mb, Phase::Backward), self.last_task(), &mut deps);
        if op.params + op.shared_params > 0 {
            if plan.grads_sharded {
                self.unsharded_grad(st, op, i, u, &mut alloc);
            } else {
                self.replicated_grad(op, i, &mut alloc);
            }
        }
        let defer = self.defers_wgrad(op);
        let t = if op.column_parallel {
            self.column_parallel_backward(st, (i, op), u, deps, alloc, n_input_grads)
        } else if defer {
            self.split_backward((step, mb), (i, op), u, deps, alloc, n_input_grads, Vec::new()).1
        } else {
            let secs = self.backward_secs(i).0;
            self.hw_flops += op.bwd_flops;
            let label = TaskLabel::new(
                step,
                Phase::Backward,
                mb,
                text!(self.names, "{}", op.name),
                TaskKind::Backward,
                Some(u),
            )
            .with_region(op.region)
            .with_work(op.bwd_flops, self.cost.backward_bytes(op));
            let t = self.task_of(COMPUTE, secs, &deps, &alloc, label);
            self.give_back(deps);
            self.give_back(alloc);
            t
        };
        st.last_bwd_task = t;
        self.zero3_release(i, fetched, t);
        if let Some(b) = scratch {
            self.free_at(t, &[b]);
        }
        let mut f = self.spare();
        st.free_bwd.take_into(i, &mut f);
        for &o in &op.outputs {
            if let Some(g) = st.grad_buf[o] {
                f.push(g);
            }
        }
        if i == lo {
            f.extend_from_slice(&st.inputs);
        }
        match self.wgrad.cache.last_mut() {
            // The deferred weight gradient reads the saved input and the output's gradient.
            Some(w) if defer => w.frees = f,
            _ => {
                self.free_at(t, &f);
                self.give_back(f);
            }
        }
        if self.is_megatron() {
            self.megatron_bucket_after(st, i, t, st.last_mb);
        } else {
            self.ddp_bucket_after(st, op, i, lo, u, t, st.last_mb);
        }
        let region_starts = i == lo || dag.ops[i - 1].region != op.region;
        let unit_done = match op.region {
            Region::Block(_) => region_starts,
            Region::Embed => i == 0,
            Region::Head => false,
        };
        if unit_done {
            self.post_backward_unit(st, op.region, u, t);
        }
    }

    /// After the chunk's first op's backward: the input's gradient to the previous stage and
    /// what ends a micro-batch's backward.
    pub(super) fn backward_end(&mut self, mut st: Bwd) {
        let (step, mb, c) = (st.step, st.mb, st.chunk);
        let vs = self.chunk_vs[c];
        self.zero3_end_pass();
        self.finish_unit_grads(&mut st);
        if let Some(w) = self.fsdp2_release_reduce_scatter_input(step, mb, st.last_bwd_task) {
            self.step_comm.push(w);
        }
        if let Some(t) = self.bf16_update_hp_grads(step, mb, st.last_bwd_task) {
            st.last_bwd_task = t;
        }
        self.send_gradient(&mut st, c);
        self.ready.insert(Port { step, mb, virtual_stage: vs, forward: false }, st.last_bwd_task);
        if st.last_mb && !self.is_megatron() && !self.deepspeed_boundary_reduce(step, vec![st.last_bwd_task]) {
            self.zero1_reduce_scatter(&st);
        }
        self.step_comm.push(st.last_bwd_task);
        self.deepspeed_micro_batch_epilogue(step, mb);
    }

    /// A matmul's backward as its two GEMMs, the input gradient's (allocating the first
    /// `n_input_grads` of `alloc`) after `deps`, then the weight gradient's (the rest) after
    /// `wdeps`, or, in a zero-bubble backward, queued for a later `W` pass. Returns the
    /// input-gradient task and the op's last (the weight gradient's, or the input
    /// gradient's when deferred). Megatron's column-parallel linears run their input
    /// gradient's collective between the two ([`Builder::column_parallel_backward`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_backward(
        &mut self,
        (step, mb): (u32, u32),
        (i, op): (usize, &Op),
        u: usize,
        deps: Vec<u32>,
        mut alloc: Vec<u32>,
        n_input_grads: usize,
        wdeps: Vec<u32>,
    ) -> (u32, u32) {
        let (secs, dgrad_share) = self.backward_secs(i);
        self.hw_flops += op.bwd_flops;
        let bytes = self.cost.backward_bytes(op);
        // The two GEMMs do the same FLOPs (dX = dY W and dW = dY^T X); the HBM bytes split
        // by time, as the roofline charged them.
        let label = |what: String, share: f64| {
            TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::Backward, Some(u))
                .with_region(op.region)
                .with_work(op.bwd_flops / 2.0, (bytes as f64 * share) as u64)
        };
        let wgrad_alloc = alloc.split_off(n_input_grads);
        let what = text!(self.names, "{} (input grad)", op.name);
        let d = self.task(COMPUTE, secs * dgrad_share, deps, alloc, label(what, dgrad_share));
        let w_secs = secs * (1.0 - dgrad_share);
        if self.defers_wgrad(op) {
            let what = text!(self.names, "{} (weight grad, deferred)", op.name);
            self.wgrad.cache.push(super::dualpipe::DeferredWgrad {
                op: i,
                bucket: None,
                seconds: w_secs,
                deps: wdeps,
                alloc: wgrad_alloc,
                frees: Vec::new(),
                label: label(what, 1.0 - dgrad_share),
            });
            return (d, d);
        }
        let what = text!(self.names, "{} (weight grad)", op.name);
        (d, self.task(COMPUTE, w_secs, wdeps, wgrad_alloc, label(what, 1.0 - dgrad_share)))
    }

    /// DualPipe's zero-bubble backward defers this op's weight-gradient GEMM to a later `W`
    /// pass ([`super::dualpipe`]): a GEMM with trainable weights, in a backward that defers.
    pub(super) fn defers_wgrad(&self, op: &Op) -> bool {
        self.wgrad.enabled && op.gemm.is_some() && op.params > 0 && op.frozen_params == 0
    }

    /// Gradient buffers for the inputs of `op` that need one and have none yet: autograd
    /// creates an activation's gradient at the backward of its first consumer (in backward
    /// order), whether that is a kernel or a tensor-parallel collective. Appended to `alloc`.
    pub(super) fn input_grads(
        &mut self,
        op: &Op,
        mb: u32,
        grad_buf: &mut super::span::Span<Option<u32>>,
        alloc: &mut Vec<u32>,
    ) {
        for &t in &op.inputs {
            if self.ck.tensors[t].needs_grad && grad_buf[t].is_none() {
                let b = self.buffer(
                    self.dag.tensors[t].bytes,
                    Category::ActivationGradients,
                    text!(self.names, "grad of {} (micro-batch {mb})", self.dag.tensors[t].name),
                );
                grad_buf[t] = Some(b);
                alloc.push(b);
            }
        }
    }
}
