//! Parameter sharding and gathering (FSDP, ZeRO-3) and the sharded gradient's
//! reduce-scatter (FSDP, ZeRO-2/3): what a unit's all-gather allocates and when it is freed,
//! and what a reduce-scatter produces (PyTorch `torch/distributed/fsdp/_runtime_utils.py`:
//! `_unshard`, `_post_backward_hook`, `_reduce_grad`; DeepSpeed `stage3.py`
//! `fetch_sub_module` / `__reduce_and_partition_ipg_grads`, `stage_1_and_2.py`
//! `reduce_independent_p_g_buckets_and_remove_grads`).

use super::backward::Bwd;
use super::forward::FwdPass;
use super::{Builder, Category, Collective, Phase, TaskKind, TaskLabel, NCCL};
use crate::model::{Op, OpKind, Region};
use crate::plan::BackwardPrefetch;
use crate::plan::Sharding;

impl Builder<'_> {
    pub(super) fn unit_gathered_bytes(&self, u: usize) -> u64 {
        let un = &self.plan.units[u];
        let c = self.pr().compute.bytes();
        un.shard_params * self.plan.shard_group * c + un.frozen_shard_bytes * self.plan.shard_group
            - un.fp8_gathered * (c - 1)
    }

    pub(super) fn gather(&mut self, step: u32, mb: u32, phase: Phase, u: usize, deps: Vec<u32>) -> (u32, u32) {
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

    pub(super) fn reduce_scatter(&mut self, step: u32, mb: u32, u: usize, after: u32, unsharded: Vec<u32>) {
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
            self.all_reduce_after(step, mb, u, t, true, (shard_bytes, 0), what);
        }
    }

    /// Whether unit `u`'s parameters are resharded after its forward, so its backward
    /// gathers them again (never the root unit, which FSDP keeps gathered).
    #[inline]
    fn resharded(&self, u: usize) -> bool {
        self.plan.params_sharded && self.plan.reshard_after_forward && u > 0
    }

    /// Whether unit `u` must be all-gathered for this backward: it was resharded after its
    /// forward and is not gathered (or being gathered) already. A pipeline stage keeps a
    /// unit gathered from one micro-batch's backward to the next forward.
    #[inline]
    fn needs_gather(&self, st: &Bwd, u: usize) -> bool {
        self.resharded(u) && st.ag_bwd_task[u].is_none() && self.gathered[u].is_none()
    }

    /// Pre-backward of block `l` (unit `u`): make sure it is gathered, prefetch block l - 1
    /// under BACKWARD_PRE; the block's first backward kernel waits for its all-gather.
    pub(super) fn pre_backward_block(&mut self, st: &mut Bwd, l: usize, u: usize, deps: &mut Vec<u32>) {
        let (step, mb) = (st.step, st.mb);
        if self.needs_gather(st, u) {
            let (t, b) = self.gather(step, mb, Phase::Backward, u, vec![st.last_bwd_task]);
            st.ag_bwd_task[u] = Some(t);
            self.gathered[u] = Some(b);
        }
        let pre = self.plan.parallel.backward_prefetch == BackwardPrefetch::Pre;
        if pre && l >= 1 && self.needs_gather(st, u - 1) {
            let (t, b) = self.gather(step, mb, Phase::Backward, u - 1, vec![st.last_bwd_task]);
            st.ag_bwd_task[u - 1] = Some(t);
            self.gathered[u - 1] = Some(b);
        }
        if let Some(t) = st.ag_bwd_task[u] {
            deps.push(t);
        }
    }

    /// The root module's pre-backward hook fires when the gradient of the model's output
    /// (the logits) exists: the loss is computed outside the module, so its backward comes
    /// first. Under BACKWARD_PRE that hook prefetches the last block.
    pub(super) fn root_pre_backward(&mut self, st: &mut Bwd, op: &Op) {
        let nblocks = self.dag.config.n_layers as usize;
        if op.region == Region::Head
            && op.kind == OpKind::Linear
            && nblocks > 0
            && self.plan.parallel.backward_prefetch == BackwardPrefetch::Pre
            && self.needs_gather(st, nblocks)
        {
            let (t, b) = self.gather(st.step, st.mb, Phase::Backward, nblocks, vec![st.last_bwd_task]);
            st.ag_bwd_task[nblocks] = Some(t);
            self.gathered[nblocks] = Some(b);
        }
    }

    /// An unsharded weight gradient awaiting its unit's reduce-scatter. A tied head creates
    /// the embedding's gradient; the embedding accumulates into it.
    ///
    /// On a pipeline stage gradients are not reduced per micro-batch
    /// (`torch.distributed.pipelining` `PipelineStage.backward_maybe_with_nosync`: FSDP's
    /// `set_requires_gradient_sync(False)` until the stage's last backward): the first
    /// backward of the step creates the unsharded gradient, later ones compute theirs into a
    /// temporary that AccumulateGrad adds in and frees.
    pub(super) fn unsharded_grad(&mut self, st: &mut Bwd, op: &Op, i: usize, u: usize, alloc: &mut Vec<u32>) {
        let tied_again = op.kind == OpKind::Embedding && i == 0 && st.tied_grad_done;
        if tied_again {
            return;
        }
        let el = if op.shared_params > 0 { op.shared_params } else { op.params };
        let bytes = el * self.pr().grad.bytes();
        if self.accumulates_unsharded() && self.acc_grads[i].is_some() {
            let b = self.buffer(
                bytes,
                Category::UnshardedGradients,
                text!(self.names, "{} weight grad (micro-batch {}, accumulated into .grad)", op.name, st.mb),
            );
            alloc.push(b);
            st.free_bwd[i].push(b);
            return;
        }
        let b = self.buffer(
            bytes,
            Category::UnshardedGradients,
            text!(self.names, "{} weight grad (unsharded, micro-batch {})", op.name, st.mb),
        );
        self.unit_grads[u].push(b);
        if self.accumulates_unsharded() {
            self.acc_grads[i] = Some(b);
        }
        alloc.push(b);
        st.tied_grad_done |= op.shared_params > 0;
    }

    /// Whether unsharded gradients accumulate over the step's micro-batches and are reduced
    /// once (a pipeline stage), rather than reduced after every micro-batch's backward (FSDP
    /// without `no_sync()`).
    #[inline]
    pub(super) fn accumulates_unsharded(&self) -> bool {
        self.plan.pipeline() > 1 || self.plan.parallel.no_sync
    }

    /// End of a chunk's last backward of the step on a pipeline stage: every unit it still
    /// holds gathered, or whose gradients still await their reduce-scatter, gets its
    /// post-backward now: `PipelineStage.backward_maybe_with_nosync(last_backward=True)` runs
    /// the whole backward first, then each FSDP state's `post_backward()` (reshard, then
    /// reduce-scatter), in module order (`_state_ctx.all_states`: the root first). Without a
    /// pipeline every unit had its post-backward already.
    pub(super) fn finish_unit_grads(&mut self, st: &mut Bwd) {
        if !st.sync_grads {
            return;
        }
        for u in 0..self.plan.units.len() {
            if self.gathered[u].is_some() || !self.unit_grads[u].is_empty() {
                let t = st.last_bwd_task;
                if let Some(g) = self.gathered[u].take() {
                    self.free_at(t, &[g]);
                }
                if self.plan.grads_sharded && !self.unit_grads[u].is_empty() {
                    let grads = std::mem::take(&mut self.unit_grads[u]);
                    self.reduce_scatter(st.step, st.mb, u, t, grads);
                }
            }
        }
    }

    /// Post-backward of unit `u`, after its last backward kernel `t`: BACKWARD_POST prefetches
    /// the next unit before the reduce-scatter; the unit's gathered parameters are freed; its
    /// unsharded gradients are reduce-scattered.
    pub(super) fn post_backward_unit(&mut self, st: &mut Bwd, region: Region, u: usize, t: u32) {
        if let Region::Block(l) = region {
            let post = self.plan.parallel.backward_prefetch == BackwardPrefetch::Post;
            if post && l >= 1 && self.needs_gather(st, u - 1) {
                let (at, b) = self.gather(st.step, st.mb, Phase::Backward, u - 1, vec![t]);
                st.ag_bwd_task[u - 1] = Some(at);
                self.gathered[u - 1] = Some(b);
            }
        }
        if self.plan.pipeline() > 1 {
            // reshard_after_forward = False and no gradient sync: the stage's post-backward
            // runs for every unit once its last backward is done (`finish_unit_grads`).
            return;
        }
        if let Some(g) = self.gathered[u].take() {
            self.free_at(t, &[g]);
        }
        // Without gradient sync (no_sync) the unsharded gradients stay until the last
        // micro-batch's post-backward reduce-scatters what they accumulated.
        if self.plan.grads_sharded && st.sync_grads {
            let grads = std::mem::take(&mut self.unit_grads[u]);
            self.reduce_scatter(st.step, st.mb, u, t, grads);
        }
    }

    /// FSDP / ZeRO-3 pre-forward of the unit `u` that `region` starts: all-gather it unless
    /// it is gathered already; the unit's first kernel waits for its all-gather. With
    /// `limit_all_gathers` the CPU waits until at most one other gathered block is
    /// outstanding.
    pub(super) fn pre_forward_unit(&mut self, st: &mut FwdPass, region: Region, u: usize, deps: &mut Vec<u32>) {
        let plan = self.plan;
        if plan.params_sharded && self.gathered[u].is_none() {
            let mut agdeps: Vec<u32> = st.step_dep.into_iter().collect();
            if plan.parallel.limit_all_gathers {
                // The block two units back (unit 0 is the root, never waited for; a pipeline
                // stage numbers only its own blocks).
                if let Region::Block(_) = region {
                    if u >= 3 {
                        if let Some(t) = st.unit_last_fwd[u - 2] {
                            agdeps.push(t);
                        }
                    }
                }
            }
            let (t, b) = self.gather(st.step, st.mb, Phase::Forward, u, agdeps);
            self.gathered[u] = Some(b);
            st.ag_fwd_task[u] = Some(t);
        }
        if let Some(t) = st.ag_fwd_task[u] {
            deps.push(t);
        }
    }

    /// End of a unit's forward (kernel `t`): a block is resharded (`reshard_after_forward`);
    /// otherwise (SHARD_GRAD_OP) it stays gathered until its backward ends.
    pub(super) fn post_forward_unit(&mut self, region: Region, u: usize, t: u32) {
        if let (Region::Block(_), Some(g)) = (region, self.gathered[u]) {
            if self.plan.reshard_after_forward {
                self.free_at(t, &[g]);
                self.gathered[u] = None;
            }
        }
    }
}
