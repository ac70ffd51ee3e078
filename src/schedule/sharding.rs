//! Parameter sharding and gathering (FSDP, ZeRO-3) and the sharded gradient's
//! reduce-scatter (FSDP, ZeRO-2/3): what a unit's all-gather allocates and when it is freed,
//! and what a reduce-scatter produces (PyTorch `torch/distributed/fsdp/_runtime_utils.py`:
//! `_unshard`, `_post_backward_hook`, `_reduce_grad`; DeepSpeed `stage3.py`
//! `fetch_sub_module` / `__reduce_and_partition_ipg_grads`, `stage_1_and_2.py`
//! `reduce_independent_p_g_buckets_and_remove_grads`).

use super::backward::Bwd;
use super::forward::FwdPass;
use super::{Builder, Category, Collective, Phase, TaskKind, TaskLabel, COMPUTE, NCCL};
use crate::model::{Op, OpKind, Region};
use crate::plan::BackwardPrefetch;
use crate::plan::Sharding;

impl Builder<'_> {
    pub(super) fn unit_gathered_bytes(&self, u: usize) -> u64 {
        let un = &self.plan.units[u];
        let c = self.pr().compute.bytes();
        if let Some((dense, expert)) = self.plan.expert_split(u) {
            let (d, e) = self.split_gathered_bytes(u, dense, expert, c);
            return d + e;
        }
        un.shard_params * self.plan.shard_group * c + un.frozen_shard_bytes * self.plan.shard_group
            - un.fp8_gathered * (c - 1)
    }

    /// Under torchtitan's FSDP2 with expert parallelism ([`crate::plan::Plan::expert_split`]):
    /// the bytes of unit `u`'s two all-gather outputs (or reduce-scatter inputs) at `c` bytes
    /// an element: the non-expert shards of the `fsdp` mesh's ranks, and the routed-expert
    /// shards of the `efsdp` mesh's (FP8 all-gather, where on, narrows the float8 linears,
    /// which are not the routed experts' grouped GEMMs).
    fn split_gathered_bytes(&self, u: usize, dense: u64, expert: u64, c: u64) -> (u64, u64) {
        let un = &self.plan.units[u];
        let d = dense * self.plan.shard_group * c - un.fp8_gathered * c.saturating_sub(1);
        (d, expert * self.plan.expert_shard_group * c)
    }

    /// The name of unit `u`'s gathered parameters for `phase`, or (`flat`) of FSDP2's flat
    /// all-gather output they are copied out of (explain reads "gathered for").
    fn gathered_name(&self, u: usize, phase: Phase, flat: bool) -> String {
        let (unit, ph, dtype) = (&self.plan.units[u].name, phase.name(), self.pr().compute.name());
        match flat {
            true => text!(self.names, "{unit} all-gather output for {ph} ({dtype}, flat)"),
            false if self.no_shard() => text!(self.names, "{unit} cast for {ph} ({dtype}, NO_SHARD _mp_shard)"),
            false => text!(self.names, "{unit} gathered for {ph} ({dtype})"),
        }
    }

    /// A unit's all-gather: its buffer is the gathered parameters, or under FSDP2 the flat
    /// output that [`Self::fsdp2_copy_out`] later copies them out of.
    pub(super) fn gather(&mut self, step: u32, mb: u32, phase: Phase, u: usize, deps: Vec<u32>) -> (u32, u32) {
        let bytes = self.unit_gathered_bytes(u);
        let fsdp2 = self.plan.parallel.framework.fsdp2_buffers();
        let category = if fsdp2 { Category::AllGatherBuffers } else { Category::GatheredParameters };
        let name = self.gathered_name(u, phase, fsdp2);
        let (deps, staging) = match &self.plan.parallel.offload {
            Some(off) if off.parameters.is_some() => self.fetch_offloaded(step, mb, phase, u, deps, off),
            _ => (deps, Vec::new()),
        };
        let b = self.buffer(bytes, category, name);
        // FSDP1 all-gathers the local shard cast to `param_dtype` (`_mp_shard`), freed once
        // the all-gather ends ([`crate::plan::Framework::fsdp1_buffers`]).
        let mp_shard = self.fsdp1_mp_shard(u, phase);
        // From a post-forward shard the backward all-gather runs over its n ranks.
        let group = match self.post_fwd_shard[u] {
            Some(_) if phase == Phase::Backward => &self.cost.post_forward_group,
            _ => &self.cost.shard_group,
        };
        let split = self.plan.expert_split(u);
        let (secs, what) = if self.no_shard() {
            // NO_SHARD's "unshard" is the cast of the FP32 flat parameter into `_mp_shard`.
            let pb = self.pr().param.bytes();
            (self.cost.copy_s(self.plan.units[u].shard_params * pb + bytes), "cast to param_dtype")
        } else if let Some((dense, expert)) = split {
            // torchtitan's FSDP2 with expert parallelism: one all-gather over the fsdp mesh
            // for the block's other parameters, one over the efsdp mesh for its routed
            // experts, one after the other on the all-gather stream.
            let c = self.pr().compute.bytes();
            let (d, e) = self.split_gathered_bytes(u, dense, expert, c);
            (
                self.cost.collective_s(group, Collective::AllGather, d)
                    + self.cost.collective_s(&self.cost.edp_group, Collective::AllGather, e),
                "all-gather (fsdp, efsdp meshes)",
            )
        } else {
            (self.cost.collective_s(group, Collective::AllGather, bytes), "all-gather")
        };
        let what = match what.split_once(" (") {
            Some((op, meshes)) => text!(self.names, "{op} {} ({meshes}", self.plan.units[u].name),
            None => text!(self.names, "{what} {}", self.plan.units[u].name),
        };
        let label = TaskLabel::new(step, phase, mb, what, TaskKind::AllGather, Some(u)).with_work(0.0, bytes);
        let t = if fsdp2 {
            // `foreach_all_gather`: the flat output is allocated, and the local shard cast into
            // it, on the all-gather copy-in stream when the all-gather is issued; the
            // all-gather stream waits for that copy.
            let local = match split {
                Some(_) => self.plan.units[u].shard_params * self.pr().compute.bytes(),
                None => bytes / self.plan.shard_group,
            };
            let copy = local + self.plan.units[u].shard_params * self.pr().param.bytes();
            let what = text!(self.names, "all-gather copy-in {}", self.plan.units[u].name);
            let kind = if phase == Phase::Forward { TaskKind::Forward } else { TaskKind::Backward };
            let c = self.task(
                self.ag_copy_in_stream,
                self.cost.copy_s(copy),
                deps,
                [b],
                TaskLabel::new(step, phase, mb, what, kind, Some(u)).with_work(0.0, copy),
            );
            self.fsdp2_ag[u] = Some(b);
            // An offloaded shard's copies are freed once copied in (`del param_all_gather_inputs`).
            self.free_at(c, &staging);
            self.task(NCCL, secs, [c], [], label)
        } else {
            let mut alloc = vec![b];
            alloc.extend(mp_shard);
            self.task(NCCL, secs, deps, alloc, label)
        };
        if !fsdp2 {
            self.free_at(t, &staging);
        }
        if let Some(m) = mp_shard {
            self.free_at(t, &[m]);
        }
        (t, b)
    }

    /// FSDP1's `_mp_shard` for unit `u`'s all-gather: this rank's shard in `param_dtype`,
    /// when that differs from the stored parameters' dtype.
    fn fsdp1_mp_shard(&mut self, u: usize, phase: Phase) -> Option<u32> {
        let pr = self.pr();
        if !self.plan.parallel.framework.fsdp1_buffers() || pr.param == pr.compute || self.no_shard() {
            return None;
        }
        let (unit, ph, dtype) = (&self.plan.units[u].name, phase.name(), pr.compute.name());
        let name = text!(self.names, "{unit} _mp_shard for {ph} ({dtype}, this rank's shard)");
        Some(self.buffer(self.plan.units[u].shard_params * pr.compute.bytes(), Category::GatheredParameters, name))
    }

    /// FSDP1's flat gradient of unit `u`: autograd's `SplitWithSizesBackward` concatenates
    /// the unit's `param_dtype` gradients into one flat gradient of the whole unit (on the
    /// compute stream, after the unit's last backward kernel `after`) and frees them, before
    /// the post-backward hook runs. Returns the concatenation's task and the flat gradient.
    fn fsdp1_concat(&mut self, step: u32, mb: u32, u: usize, after: u32, unsharded: &[u32]) -> (u32, u32) {
        let c = self.pr().compute;
        let full = self.plan.units[u].shard_params * self.plan.shard_group;
        let unit = &self.plan.units[u].name;
        let flat = self.buffer(
            full * c.bytes(),
            Category::UnshardedGradients,
            text!(self.names, "{unit} flat gradient ({}, FlatParameter.grad)", c.name()),
        );
        let grad_bytes: u64 = unsharded.iter().map(|&x| self.tables.buffers[x as usize].bytes).sum();
        let what = text!(self.names, "concatenate {unit} gradients (SplitWithSizesBackward)");
        let cat = self.task(
            COMPUTE,
            self.cost.copy_s(grad_bytes + full * c.bytes()),
            [after],
            [flat],
            TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::Backward, Some(u))
                .with_work(0.0, grad_bytes + full * c.bytes()),
        );
        self.free_at(cat, unsharded);
        (cat, flat)
    }

    /// FSDP1's post-backward stream (the NCCL queue here) casts unit `u`'s flat gradient
    /// `flat` to `reduce_dtype` when that differs from `param_dtype`. Returns the task the
    /// reduce-scatter follows and the buffers it frees when it ends: the flat gradient,
    /// recorded on that stream, and the cast copy it reduces.
    fn fsdp1_cast(&mut self, step: u32, mb: u32, u: usize, after: u32, flat: Vec<u32>) -> (u32, Vec<u32>) {
        let (c, g) = (self.pr().compute, self.pr().grad);
        if g == c || self.no_shard() {
            // NO_SHARD's cast is the gradient the all-reduce reduces in place and keeps.
            return (after, flat);
        }
        let full = self.plan.units[u].shard_params * self.plan.shard_group;
        let unit = &self.plan.units[u].name;
        let input = self.buffer(
            full * g.bytes(),
            Category::ReduceScatterBuffers,
            text!(self.names, "{unit} flat gradient cast to {} (reduce-scatter input)", g.name()),
        );
        let what = text!(self.names, "cast {unit} flat gradient to {}", g.name());
        let cast = self.task(
            NCCL,
            self.cost.copy_s(full * (c.bytes() + g.bytes())),
            [after],
            [input],
            TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::Backward, Some(u))
                .with_work(0.0, full * (c.bytes() + g.bytes())),
        );
        let mut bufs = flat;
        bufs.push(input);
        (cast, bufs)
    }

    /// FSDP1's NO_SHARD ([`crate::plan::Framework::fsdp1_no_shard`]).
    #[inline]
    pub(super) fn no_shard(&self) -> bool {
        self.plan.parallel.framework.fsdp1_no_shard(self.plan.parallel.sharding)
    }

    /// Whether units are gathered (or, under NO_SHARD, cast) before they run: not for
    /// NO_SHARD without a low-precision `param_dtype`, which runs on the parameters as they are.
    #[inline]
    pub(super) fn gathers(&self) -> bool {
        self.plan.params_sharded && !(self.no_shard() && self.pr().param == self.pr().compute) && self.zero3.is_none()
    }

    /// FSDP2's `wait_for_unshard` for unit `u`, whose all-gather is task `t`: a copy kernel
    /// on the compute stream writes the unsharded parameters out of the flat all-gather
    /// output (`foreach_all_gather_copy_out`), and the unit's kernels wait for it. Returns
    /// what the unit's first kernel waits for (`t` itself when there is nothing to copy out:
    /// not FSDP2, or copied already).
    ///
    /// The flat output is freed after the copy. In forward FSDP2 keeps its reference until
    /// the next unit's copy-out (`AllGatherState`, so the all-gather streams may reuse the
    /// block), which `memory_allocated()` counts; here the next unit's copy-in waits for this
    /// copy-out instead ([`Self::pre_forward_unit`]): one flat output and one unit's unsharded
    /// parameters at a time either way, the order in which the CPU issues them. The last
    /// block's flat output (`keep_to_end`), which no later copy-out releases, is kept until
    /// the root's post-forward ([`Self::fsdp2_end_forward`]).
    fn fsdp2_copy_out(&mut self, step: u32, mb: u32, phase: Phase, u: usize, t: u32, keep_to_end: bool) -> u32 {
        let Some(flat) = self.fsdp2_ag[u].take() else {
            return t;
        };
        let bytes = self.unit_gathered_bytes(u);
        let name = self.gathered_name(u, phase, false);
        let b = self.buffer(bytes, Category::GatheredParameters, name);
        let kind = if phase == Phase::Forward { TaskKind::Forward } else { TaskKind::Backward };
        let what = text!(self.names, "all-gather copy-out {}", self.plan.units[u].name);
        let c = self.task(
            COMPUTE,
            self.cost.copy_s(2 * bytes),
            [t],
            [b],
            TaskLabel::new(step, phase, mb, what, kind, Some(u)).with_work(0.0, 2 * bytes),
        );
        if keep_to_end {
            self.fsdp2_fwd_tail = Some(flat);
        } else {
            self.free_at(c, &[flat]);
        }
        if phase == Phase::Backward {
            // `_to_unsharded` drops the post-forward shard.
            if let Some(pf) = self.post_fwd_shard[u].take() {
                self.free_at(c, &[pf]);
            }
        }
        self.gathered[u] = Some(b);
        if phase == Phase::Forward {
            self.fsdp2_fwd_copy_out = Some(c);
        }
        c
    }

    /// The root's post-forward releases the flat all-gather output kept for the last block
    /// (`release_all_gather_state_for_comm_reuse`), after the forward's last kernel `t`.
    pub(super) fn fsdp2_end_forward(&mut self, t: u32) {
        if let Some(flat) = self.fsdp2_fwd_tail.take() {
            self.free_at(t, &[flat]);
        }
    }

    /// FSDP2 keeps the last reduce-scatter input until the next post-backward, or the end of
    /// backward (`_end_backward_iteration`): the compute stream waits for that reduce-scatter
    /// (a zero-length kernel after `after`) and the input is freed. Returns the wait.
    pub(super) fn fsdp2_release_reduce_scatter_input(&mut self, step: u32, mb: u32, after: u32) -> Option<u32> {
        let (rs, input) = self.fsdp2_rs.take()?;
        let what = text!(self.names, "wait for the previous reduce-scatter, free its input");
        let w = self.task(
            COMPUTE,
            0.0,
            [after, rs],
            [],
            TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::Backward, None),
        );
        self.free_at(w, &[input]);
        Some(w)
    }

    pub(super) fn reduce_scatter(&mut self, step: u32, mb: u32, u: usize, after: u32, unsharded: Vec<u32>) {
        let plan = self.plan;
        let gb = self.pr().grad.bytes();
        let split = plan.expert_split(u).map(|(dense, expert)| self.split_gathered_bytes(u, dense, expert, gb));
        let full_bytes = match split {
            Some((d, e)) => d + e,
            None => plan.units[u].shard_params * plan.shard_group * gb,
        };
        let shard_bytes = plan.units[u].shard_params * gb;
        let mut alloc = Vec::new();
        let mut tmp = None;
        // FSDP1 casts its flat gradient to reduce_dtype first (CPU offload or not).
        let (after, unsharded) =
            if self.plan.fsdp1_grads() { self.fsdp1_cast(step, mb, u, after, unsharded) } else { (after, unsharded) };
        // FSDP2: the unsharded gradients are copied into one flat input in reduce_dtype and
        // freed; the input outlives the reduce-scatter until the next post-backward.
        let mut after = after;
        let mut unsharded = unsharded;
        let mut fsdp2_input = None;
        if plan.parallel.framework.fsdp2_buffers() {
            if let Some(w) = self.fsdp2_release_reduce_scatter_input(step, mb, after) {
                after = w;
            }
            let input = self.buffer(
                full_bytes,
                Category::ReduceScatterBuffers,
                text!(self.names, "{} reduce-scatter input ({}, flat)", plan.units[u].name, self.pr().grad.name()),
            );
            let grad_bytes: u64 = unsharded.iter().map(|&g| self.tables.buffers[g as usize].bytes).sum();
            let what = text!(self.names, "reduce-scatter copy-in {}", plan.units[u].name);
            let c = self.task(
                COMPUTE,
                self.cost.copy_s(grad_bytes + full_bytes),
                [after],
                [input],
                TaskLabel::new(step, Phase::Backward, mb, what, TaskKind::Backward, Some(u))
                    .with_work(0.0, grad_bytes + full_bytes),
            );
            self.free_at(c, &unsharded);
            unsharded = Vec::new();
            after = c;
            fsdp2_input = Some(input);
        }
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
                [after],
                [b],
                label(text!(self.names, "reduce-scatter {}", plan.units[u].name), TaskKind::ReduceScatter)
                    .with_work(0.0, full_bytes),
            );
            self.free_at(t, &unsharded);
            if let Some(input) = fsdp2_input {
                self.fsdp2_rs = Some((t, input));
            }
            let el = plan.units[u].shard_params;
            let secs = (el * crate::plan::OffloadConfig::GRAD_BYTES_PER_PARAM) as f64 / off.d2h_bytes_per_s;
            let what = text!(self.names, "copy {} gradient partition to host (fp32, D2H)", plan.units[u].name);
            // FSDP2 copies the sharded gradient to the host inside `foreach_reduce`, on the
            // reduce-scatter stream (`.to("cpu", non_blocking=True)` into pinned memory), so the
            // next reduce-scatter waits for it; FSDP1 and DeepSpeed use a copy stream of their own.
            let stream = if plan.parallel.framework.fsdp2_buffers() { NCCL } else { self.d2h_stream };
            let d = self.task(
                stream,
                secs,
                [t],
                [],
                label(what, TaskKind::Send).with_work(0.0, el * crate::plan::OffloadConfig::GRAD_BYTES_PER_PARAM),
            );
            self.free_at(d, &[b]);
            self.step_comm.push(d);
            return;
        }
        if self.ds_stage3() {
            // ZeRO-3 reduces into a new partition and adds it into grad_partitions_flat_buffer,
            // made when the optimizer initialised (`partition_grads`).
            let b = self.buffer(
                shard_bytes,
                Category::CommBuffers,
                text!(self.names, "{} reduce-scatter output (into grad_partitions_flat_buffer)", plan.units[u].name),
            );
            alloc.push(b);
            tmp = Some(b);
        } else if self.grad_bufs[u].is_none() {
            let name = if self.no_shard() {
                text!(self.names, "{} flat grad ({}, all-reduced in place)", plan.units[u].name, self.pr().grad.name())
            } else {
                text!(self.names, "{} sharded grad ({})", plan.units[u].name, self.pr().grad.name())
            };
            let b = self.buffer(shard_bytes, Category::Gradients, name);
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
        let (secs, label) = if self.no_shard() {
            // The post-backward stream casts the flat gradient into the kept copy, then
            // all-reduces it in place.
            let cast = if self.plan.fsdp1_grads() && self.pr().grad != self.pr().compute {
                self.cost.copy_s(plan.units[u].shard_params * (self.pr().compute.bytes() + gb))
            } else {
                0.0
            };
            let what = text!(self.names, "all-reduce {} flat gradient", plan.units[u].name);
            (
                cast + self.cost.collective_s(&self.cost.dp_group, Collective::AllReduce, full_bytes),
                (what, TaskKind::AllReduce),
            )
        } else if let Some((d, e)) = split {
            // torchtitan's FSDP2 with expert parallelism: the block's other gradients are
            // reduce-scattered over the fsdp mesh, its routed experts' over the efsdp mesh.
            let what = text!(self.names, "reduce-scatter {} (fsdp, efsdp meshes)", plan.units[u].name);
            (
                self.cost.collective_s(&self.cost.shard_group, Collective::ReduceScatter, d)
                    + self.cost.collective_s(&self.cost.edp_group, Collective::ReduceScatter, e),
                (what, TaskKind::ReduceScatter),
            )
        } else {
            let what = text!(self.names, "reduce-scatter {}", plan.units[u].name);
            (
                self.cost.collective_s(&self.cost.shard_group, Collective::ReduceScatter, full_bytes),
                (what, TaskKind::ReduceScatter),
            )
        };
        let t = self.task(
            NCCL,
            secs,
            [after],
            alloc,
            TaskLabel::new(step, Phase::Backward, mb, label.0, label.1, Some(u)).with_work(0.0, full_bytes),
        );
        let mut f = unsharded;
        f.extend(tmp);
        self.free_at(t, &f);
        self.step_comm.push(t);
        if let Some(input) = fsdp2_input {
            self.fsdp2_rs = Some((t, input));
        }
        if plan.parallel.sharding == Sharding::HybridShard && self.cost.replica_group.ranks > 1 {
            let what = text!(self.names, "all-reduce {} shard across nodes", plan.units[u].name);
            self.all_reduce_after(step, mb, u, t, true, (shard_bytes, 0), what);
        }
    }

    /// Whether unit `u`'s parameters are resharded after its forward, so its backward
    /// gathers them again (never the root unit, which FSDP keeps gathered).
    #[inline]
    fn resharded(&self, u: usize) -> bool {
        // NO_SHARD frees every unit's low-precision copy at its reshard, the root's too.
        self.gathers() && self.plan.reshard_after_forward && (u > 0 || self.no_shard())
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
        // FSDP2's pre-backward copies the unit out (`wait_for_unshard`) before it prefetches
        // the next (`_backward_prefetch`), so the prefetch is issued after the copy.
        let mut issue = st.last_bwd_task;
        if let Some(t) = st.ag_bwd_task[u] {
            let c = self.fsdp2_copy_out(step, mb, Phase::Backward, u, t, false);
            if c != t {
                issue = c;
            }
            st.ag_bwd_task[u] = Some(c);
        }
        let pre = self.plan.parallel.backward_prefetch == BackwardPrefetch::Pre;
        if pre && l >= 1 && self.needs_gather(st, u - 1) {
            let (t, b) = self.gather(step, mb, Phase::Backward, u - 1, vec![issue]);
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
    pub(super) fn root_pre_backward(&mut self, st: &mut Bwd, op: &Op, deps: &mut Vec<u32>) {
        let nblocks = self.dag.blocks() as usize;
        // NO_SHARD freed the root's low-precision copy after forward: cast it again.
        if op.region == Region::Head && op.kind == OpKind::Linear && self.needs_gather(st, 0) {
            let (t, b) = self.gather(st.step, st.mb, Phase::Backward, 0, vec![st.last_bwd_task]);
            st.ag_bwd_task[0] = Some(t);
            self.gathered[0] = Some(b);
            deps.push(t);
        }
        // (Only where units are numbered by block: a pipeline stage numbers its own.)
        if op.region == Region::Head
            && op.kind == OpKind::Linear
            && nblocks > 0
            && nblocks < self.plan.units.len()
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
        let dtype = self.plan.unsharded_grad_dtype();
        let bytes = el * dtype.bytes();
        // A gradient freed once its kernel has produced it: copied into ZeRO-3's IPG bucket,
        // or added into the `.grad` a previous micro-batch made.
        let ds = self.ds_stage3_copies_grads();
        let into = if ds {
            Some("copied into the IPG bucket")
        } else if self.plan.accumulates_unsharded() && self.acc_grads[i].is_some() {
            Some("accumulated into .grad")
        } else {
            None
        };
        if let Some(into) = into {
            let b = self.buffer(
                bytes,
                Category::UnshardedGradients,
                text!(self.names, "{} weight grad (micro-batch {}, {into})", op.name, st.mb),
            );
            alloc.push(b);
            st.free_bwd.push(i, b);
            st.tied_grad_done |= ds && op.shared_params > 0;
            return;
        }
        let b = self.buffer(
            bytes,
            Category::UnshardedGradients,
            text!(self.names, "{} weight grad (unsharded, micro-batch {})", op.name, st.mb),
        );
        self.unit_grads[u].push(b);
        if self.plan.accumulates_unsharded() {
            self.acc_grads[i] = Some(b);
        }
        alloc.push(b);
        st.tied_grad_done |= op.shared_params > 0;
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
        // Without gradient sync (no_sync) the unsharded gradients stay until the last
        // micro-batch's post-backward reduce-scatters what they accumulated.
        let mut grads = None;
        let mut reshard = t;
        if self.plan.grads_sharded && st.sync_grads {
            let mut g = std::mem::take(&mut self.unit_grads[u]);
            let mut after = t;
            // FSDP1's flat gradient exists before its post-backward hook reshards the unit.
            // Under no_sync the gradients accumulated so far are the unit's flat gradient,
            // which this micro-batch's flat gradient is added into: both live until the
            // reduction ends.
            if self.plan.fsdp1_grads() {
                let accumulated = if self.plan.accumulates_unsharded() { std::mem::take(&mut g) } else { Vec::new() };
                let (cat, flat) = self.fsdp1_concat(st.step, st.mb, u, t, &g);
                g = vec![flat];
                g.extend(accumulated);
                (after, reshard) = (cat, cat);
            }
            grads = Some((after, g));
        }
        if let Some(g) = self.gathered[u].take() {
            self.free_at(reshard, &[g]);
        }
        if let Some((after, g)) = grads {
            self.reduce_scatter(st.step, st.mb, u, after, g);
        }
    }

    /// FSDP / ZeRO-3 pre-forward of the unit `u` that `region` starts: all-gather it unless
    /// it is gathered already; the unit's first kernel waits for its all-gather. With
    /// `limit_all_gathers` the CPU waits until at most one other gathered block is
    /// outstanding.
    pub(super) fn pre_forward_unit(&mut self, st: &mut FwdPass, region: Region, u: usize, deps: &mut Vec<u32>) {
        let plan = self.plan;
        if self.gathers() && self.gathered[u].is_none() {
            let mut agdeps: Vec<u32> = st.step_dep.into_iter().collect();
            if plan.parallel.framework.fsdp2_buffers() {
                // FSDP2 has no rate limiter: its all-gather streams wait for the previous
                // unit's copy-out ([`Self::fsdp2_copy_out`]).
                agdeps.extend(self.fsdp2_fwd_copy_out);
            } else if plan.parallel.limit_all_gathers {
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
            let t = self.fsdp2_copy_out(st.step, st.mb, Phase::Forward, u, t, st.last_block_unit == Some(u));
            st.ag_fwd_task[u] = Some(t);
            deps.push(t);
        }
    }

    /// End of a unit's forward (kernel `t`): a block is resharded (`reshard_after_forward`);
    /// otherwise (SHARD_GRAD_OP) it stays gathered until its backward ends. FSDP2 with
    /// `reshard_after_forward = n` keeps this rank's 1/n of the gathered parameters
    /// (`FSDPParamGroup._to_sharded_post_forward`: a copy out of the unsharded tensors).
    pub(super) fn post_forward_unit(&mut self, step: u32, mb: u32, region: Region, u: usize, t: u32) {
        let root_ends = region == Region::Head && self.no_shard();
        let Some(g) = self.gathered[u] else { return };
        if !matches!(region, Region::Block(_)) && !root_ends || !self.resharded(u) {
            return;
        }
        self.gathered[u] = None;
        let Some(n) = self.plan.parallel.post_forward_shard else {
            self.free_at(t, &[g]);
            return;
        };
        let bytes = self.unit_gathered_bytes(u) / n;
        let (unit, dtype) = (&self.plan.units[u].name, self.pr().compute.name());
        let name = text!(self.names, "{unit} resharded after forward (1/{n}, {dtype})");
        let what = text!(self.names, "reshard {unit} to {n} ranks after forward");
        let b = self.buffer(bytes, Category::PostForwardShards, name);
        let c = self.task(
            COMPUTE,
            self.cost.copy_s(2 * bytes),
            [t],
            [b],
            TaskLabel::new(step, Phase::Forward, mb, what, TaskKind::Forward, Some(u)).with_work(0.0, 2 * bytes),
        );
        self.free_at(c, &[g]);
        self.post_fwd_shard[u] = Some(b);
    }
}
