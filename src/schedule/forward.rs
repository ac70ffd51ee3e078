//! The forward pass of one micro-batch over one model chunk, in op order. This file is the
//! skeleton: the ops' kernels, their outputs' lifetimes (freed after the last forward
//! consumer, or kept for the backward of the op that saved them) and autocast's weight
//! casts. What a parallelism or framework adds happens at named points, each a method of the
//! module that models it:
//!
//! | point | what | module |
//! |---|---|---|
//! | start of the chunk | receive the input activation from the previous stage | `pipeline` |
//! | a tensor-parallel op | its forward collective | `tensor_parallel` |
//! | first op of a unit | pre-forward all-gather (with `limit_all_gathers`) | `sharding` |
//! | first op of a bucket | wait for its parameter all-gather, dispatch the next | `megatron` |
//! | last op of a block | reshard after forward | `sharding` |
//! | last op of a block | its saved activations to host memory | `activation_offload` |
//! | end of the chunk | send the output activation to the next stage | `pipeline` |

use super::{Builder, Category, Fwd, Phase, Port, TaskKind, TaskLabel, COMPUTE};
use crate::model::{OpKind, Region};

/// What the forward of one chunk carries from op to op.
pub(super) struct FwdPass {
    pub step: u32,
    pub mb: u32,
    /// The task that ends the previous step (the next step's work waits for it).
    pub step_dep: Option<u32>,
    pub free_fwd: super::free_lists::FreeLists,
    pub free_bwd: super::free_lists::FreeLists,
    /// Each unit's all-gather in this pass.
    pub ag_fwd_task: Vec<Option<u32>>,
    /// Each unit's last forward kernel so far.
    pub unit_last_fwd: Vec<Option<u32>>,
    /// A collective (or receive) the next compute op waits for.
    pub pending: Option<u32>,
    /// What the chunk's first compute waits for (the previous send).
    pub first_deps: Vec<u32>,
    /// The last forward kernel so far (at the end: the loss, or the chunk's output).
    pub last: u32,
    /// The chunk's output activation, sent to the next stage.
    pub out_buf: Option<u32>,
    /// Per block, the tensors activation offload takes to the host.
    pub offload: Vec<super::activation_offload::BlockOffload>,
    pub offload_count: usize,
    /// The unit of the chunk's last block (the last one a forward gathers).
    pub last_block_unit: Option<usize>,
    /// The chunk this pass runs.
    pub chunk: usize,
    /// The micro-batch's input buffers (token ids), allocated by the chunk's first op.
    pub inputs: Vec<u32>,
    /// The region of the op before (a unit's pre-forward runs where the region changes).
    pub prev_region: Option<Region>,
}

impl Builder<'_> {
    pub(super) fn forward(&mut self, step: u32, mb: u32, c: usize) -> Fwd {
        let mut st = self.forward_begin(step, mb, c);
        let (lo, hi) = self.chunk_ops[c];
        for i in lo..hi {
            self.forward_op(&mut st, i);
        }
        self.forward_end(st)
    }

    /// The chunk's inputs and its receive: what comes before its first op.
    pub(super) fn forward_begin(&mut self, step: u32, mb: u32, c: usize) -> FwdPass {
        let dag = self.dag;
        let plan = self.plan;
        let (lo, hi) = self.chunk_ops[c];
        let nunits = plan.units.len();
        let (recv_after, first_deps) = self.take_prior_send();
        self.zero3_start_pass();
        let mut st = FwdPass {
            step,
            mb,
            chunk: c,
            step_dep: self.last_task_of_prev_step,
            free_fwd: super::free_lists::FreeLists::new(lo, hi),
            free_bwd: super::free_lists::FreeLists::new(lo, hi),
            ag_fwd_task: vec![None; nunits],
            unit_last_fwd: vec![None; nunits],
            pending: None,
            first_deps,
            last: 0,
            out_buf: None,
            offload: if self.offload_of.is_empty() {
                Vec::new()
            } else {
                // Per block, or per group under fine-grained offloading.
                vec![Default::default(); self.fine.as_ref().map_or(dag.blocks() as usize, |f| f.block.len())]
            },
            offload_count: 0,
            last_block_unit: dag.ops[lo..hi]
                .iter()
                .rev()
                .find(|o| matches!(o.region, Region::Block(_)))
                .map(|o| plan.unit_of(o.region)),
            inputs: Vec::new(),
            prev_region: None,
        };
        let wanted: Vec<usize> =
            dag.inputs.iter().copied().filter(|&t| dag.ops[lo..hi].iter().any(|o| o.inputs.contains(&t))).collect();
        st.inputs = wanted
            .iter()
            .map(|&t| {
                self.buffer(
                    dag.tensors[t].bytes,
                    Category::Inputs,
                    text!(self.names, "{} (micro-batch {mb})", dag.tensors[t].name),
                )
            })
            .collect();
        self.recv_activation(&mut st, c, recv_after);
        st
    }

    /// Op `i`'s forward (ops are taken in order).
    pub(super) fn forward_op(&mut self, st: &mut FwdPass, i: usize) {
        let dag = self.dag;
        let plan = self.plan;
        let (step, mb, c) = (st.step, st.mb, st.chunk);
        let (lo, hi) = self.chunk_ops[c];
        let cb = self.pr().compute.bytes();
        let casts = self.pr().autocast_casts(plan.params_sharded);
        let op = &dag.ops[i];
        let u = plan.unit_of(op.region);
        if let Some(comm) = op.comm {
            self.tp_forward(st, op, i, comm);
            // A group whose last reader is a collective commits after it.
            let after = st.pending.unwrap_or(st.last);
            self.commit_groups(st, i, after);
            return;
        }
        let mut deps = self.spare();
        let mut alloc = self.spare();
        deps.extend(st.pending.take());
        deps.append(&mut st.first_deps);
        if i == lo {
            alloc.extend_from_slice(&st.inputs);
            if let Some(d) = st.step_dep {
                deps.push(d);
            }
        }
        if st.prev_region != Some(op.region) {
            if matches!(op.region, Region::Block(_)) {
                self.mark_layer();
            }
            self.pre_forward_unit(st, op.region, u, &mut deps);
        }
        self.megatron_pre_forward(st, i, &mut deps);
        let fetched = self.zero3_fetch(i, (step, mb, Phase::Forward), self.last_task(), &mut deps);
        st.prev_region = Some(op.region);
        for &t in &op.outputs {
            let tp = self.ck.tensors[t];
            let cat = if tp.kept { Category::Activations } else { Category::Transient };
            let b =
                self.buffer(dag.tensors[t].bytes, cat, text!(self.names, "{} (micro-batch {mb})", dag.tensors[t].name));
            alloc.push(b);
            if self.chunk_out[c] == Some(t) {
                // Sent to the next stage, then freed (Megatron deallocates pipeline outputs).
                st.out_buf = Some(b);
            } else if tp.kept {
                self.keep_for_backward(st, t, b, i);
            } else {
                st.free_fwd.push(tp.last_consumer.unwrap_or(i).max(i), b);
            }
        }
        alloc.extend(self.blas_workspace(op, 0));
        alloc.extend(self.te_workspaces(op));
        let mut frees_now = self.spare();
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
            // A checkpointed block's casts are recomputed with it (full), or as the
            // per-op policy's unsaved `_to_copy`s (only the rerun linears' are counted).
            if matches!(op.region, Region::Block(l) if self.ck.checkpointed[l as usize]) {
                frees_now.push(b);
            } else {
                st.free_bwd.push(i, b);
            }
        }
        let secs = self.forward_secs(i);
        self.hw_flops += op.fwd_flops;
        let t = self.task_of(
            COMPUTE,
            secs,
            &deps,
            &alloc,
            TaskLabel::new(step, Phase::Forward, mb, text!(self.names, "{}", op.name), TaskKind::Forward, Some(u))
                .with_region(op.region)
                .with_work(op.fwd_flops, self.cost.forward_bytes(op)),
        );
        self.give_back(deps);
        self.give_back(alloc);
        st.last = t;
        self.zero3_release(i, fetched, t);
        let mut f = self.spare();
        st.free_fwd.take_into(i, &mut f);
        self.free_at(t, &f);
        self.free_at(t, &frees_now);
        self.give_back(f);
        self.give_back(frees_now);
        self.commit_groups(st, i, t);
        st.unit_last_fwd[u] = Some(t);
        if i + 1 == hi || dag.ops[i + 1].region != op.region {
            self.post_forward_unit(step, mb, op.region, u, t);
            if let Region::Block(l) = op.region {
                self.offload_block(st, l as usize, t);
            }
        }
    }

    /// After the chunk's last op: its output to the next stage.
    pub(super) fn forward_end(&mut self, mut st: FwdPass) -> Fwd {
        let c = st.chunk;
        self.keep_uncommitted(&mut st);
        self.fsdp2_end_forward(st.last);
        self.send_activation(&mut st, c);
        let vs = self.chunk_vs[c];
        self.ready.insert(Port { step: st.step, mb: st.mb, virtual_stage: vs, forward: true }, st.last);
        Fwd {
            free_fwd: st.free_fwd,
            free_bwd: st.free_bwd,
            offload: st.offload,
            offload_count: st.offload_count,
            loss_task: st.last,
            inputs: st.inputs,
        }
    }
}
