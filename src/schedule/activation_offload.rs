//! Activation offload (`training.activation_offload`): the tensors a block keeps for its
//! backward go to pinned host memory after the block's forward and come back before its
//! backward.
//!
//! - **overlapped**: Megatron-Core `--cpu-offloading --cpu-offloading-num-layers n`, which
//!   drives Transformer Engine's `AsyncDoubleBufferGroupOffloadHandler` (cpu_offload_v1.py)
//!   with one group per layer. A window map spreads the n offloaded groups over the model's
//!   L layers: `window[i] = (L / n)(i + 1) - 1`, plus `i + 1` for the first `L % n` groups and
//!   the last such `i + 1` after them. Forward: group 0's copy starts on the device-to-host
//!   stream when layer 0's forward commits; when layer `window[k]` commits, compute waits
//!   for group k's copy, frees group k on the GPU and starts group k + 1's copy. Backward:
//!   when backward reaches layer `window[k - 1]` (k groups still on the host), compute waits
//!   for the reloads so far and group k - 1's reload starts on the host-to-device stream
//!   into freshly allocated buffers; layer 0's backward waits for every reload.
//! - **synchronous** (PyTorch `offload_wrapper`, `save_on_cpu(pin_memory=True)`): the pack
//!   hook's copy runs on the compute stream (modelled as one copy per block after its
//!   forward, freeing the block's tensors), the unpack hook's copy back on the compute stream
//!   when backward reaches the block; compute waits for both.
//!
//! A tensor is offloaded when its first saver is in an offloaded block and no forward op
//! after that block reads it (a tensor still read forward stays on the GPU).

use super::backward::Bwd;
use super::checkpoint::TensorPlan;
use super::forward::FwdPass;
use super::{Builder, Category, Phase, TaskKind, TaskLabel, COMPUTE};
use crate::model::{LayerDag, Region};
use crate::plan::{ActivationOffloadMethod, Plan};

/// Per block, what one micro-batch offloaded (tensor ids and their buffers) and the copies
/// that took it to the host and back.
#[derive(Clone, Default)]
pub(crate) struct BlockOffload {
    pub tensors: Vec<usize>,
    pub buffers: Vec<u32>,
    pub copy: Option<u32>,
    pub reload: Option<u32>,
}

/// Per tensor, the block whose offload takes it to the host (None: it stays on the GPU),
/// decided once per program: a kept tensor whose first saver is in one of the first
/// `blocks` blocks and that no forward op after that block reads. Empty without offload.
pub fn offload_targets(dag: &LayerDag, plan: &Plan, tensors: &[TensorPlan]) -> Vec<Option<u64>> {
    let Some(a) = plan.training.activation_offload else { return Vec::new() };
    if a.method == ActivationOffloadMethod::FineGrained {
        // Fine-grained: per tensor its group ([`super::fine_grained_offload`]).
        return super::fine_grained_offload::targets(dag, plan, tensors).0;
    }
    tensors
        .iter()
        .map(|tp| {
            let saver = tp.last_saver.filter(|_| tp.kept)?;
            let region = dag.ops[saver].region;
            let Region::Block(l) = region else { return None };
            let read_later = tp.last_consumer.is_some_and(|c| dag.ops[c].region != region);
            (l < a.blocks && !read_later).then_some(l)
        })
        .collect()
}

/// Bytes one micro-batch keeps in pinned host memory per GPU (what the report prints).
/// Only the tensors of this rank's model chunks count.
pub fn host_bytes(dag: &LayerDag, plan: &Plan) -> u64 {
    let ck = super::checkpoint::plan(dag, plan);
    let tensors = &ck.tensors;
    let targets = offload_targets(dag, plan, tensors);
    let here = |t: &crate::model::Tensor| {
        t.producer.is_none_or(|p| plan.chunks.is_empty() || plan.chunks.iter().any(|c| c.holds(dag.ops[p].region)))
    };
    targets.iter().zip(&dag.tensors).filter(|(l, t)| l.is_some() && here(t)).map(|(_, t)| t.bytes).sum()
}

impl Builder<'_> {
    /// Forward's buffer `b` of kept tensor `t` (made by op `i`): freed after its saver's
    /// backward, or handed to its block's offload.
    pub(super) fn keep_for_backward(&self, st: &mut FwdPass, t: usize, b: u32, i: usize) {
        match self.offload_of.get(t).copied().flatten() {
            Some(l) => {
                let o = &mut st.offload[l as usize];
                o.tensors.push(t);
                o.buffers.push(b);
            }
            None => st.free_bwd.push(self.ck.tensors[t].last_saver.unwrap_or(i), b),
        }
    }

    /// The end of block `l`'s forward (its last task `after`): synchronous, the block's
    /// copy to the host on the compute stream; overlapped, Transformer Engine's commit.
    pub(super) fn offload_block(&mut self, st: &mut FwdPass, l: usize, after: u32) {
        let Some(cfg) = self.plan.training.activation_offload else { return };
        let n = cfg.blocks as usize;
        match cfg.method {
            ActivationOffloadMethod::Synchronous => {
                if l < n {
                    let t = self.offload_copy(st, l, COMPUTE, after);
                    let bufs = std::mem::take(&mut st.offload[l].buffers);
                    self.free_at(t, &bufs);
                }
            }
            ActivationOffloadMethod::FineGrained => {}
            ActivationOffloadMethod::Overlapped => {
                if l == 0 {
                    self.offload_copy(st, 0, self.d2h_stream, after);
                }
                let k = st.offload_count;
                if k < n && self.offload_window[k] == l as u64 {
                    // Compute waits for group k's copy, then drops the GPU copies.
                    let copy = st.offload[k].copy;
                    let what = text!(self.names, "wait for layers.{k}'s offload, free it (Transformer Engine window)");
                    let label = TaskLabel::new(st.step, Phase::Forward, st.mb, what, TaskKind::Forward, None)
                        .with_region(Region::Block(l as u64));
                    let sync =
                        self.task(COMPUTE, 0.0, copy.into_iter().chain([after]).collect::<Vec<u32>>(), [], label);
                    let bufs = std::mem::take(&mut st.offload[k].buffers);
                    self.free_at(sync, &bufs);
                    st.last = sync;
                    if k + 1 < n {
                        self.offload_copy(st, k + 1, self.d2h_stream, sync);
                    }
                    st.offload_count += 1;
                }
            }
        }
    }

    /// Block `l`'s tensors copied to the host on `stream` after task `after`.
    fn offload_copy(&mut self, st: &mut FwdPass, l: usize, stream: u16, after: u32) -> u32 {
        let cfg = self.plan.training.activation_offload.expect("activation offload");
        let bytes = self.offloaded_bytes(&st.offload[l]);
        let what = text!(self.names, "offload layers.{l} saved activations to host ({bytes} B, D2H)");
        let label = TaskLabel::new(st.step, Phase::Forward, st.mb, what, TaskKind::Send, None)
            .with_region(Region::Block(l as u64))
            .with_work(0.0, bytes);
        let t = self.task(stream, bytes as f64 / cfg.d2h_bytes_per_s, [after], [], label);
        st.offload[l].copy = Some(t);
        t
    }

    /// Block `l`'s tensors back into new buffers, freed where the originals would have
    /// been, on `stream` after task `after`.
    fn reload(&mut self, st: &mut Bwd, l: usize, stream: u16, after: u32) -> u32 {
        let cfg = self.plan.training.activation_offload.expect("activation offload");
        let tensors = st.offload[l].tensors.clone();
        let mb = st.mb;
        let alloc = self.reload_buffers(st, &tensors);
        let bytes = self.offloaded_bytes(&st.offload[l]);
        let what = text!(self.names, "reload layers.{l} saved activations from host ({bytes} B, H2D)");
        let label = TaskLabel::new(st.step, Phase::Backward, mb, what, TaskKind::Recv, None)
            .with_region(Region::Block(l as u64))
            .with_work(0.0, bytes);
        let deps: Vec<u32> = st.offload[l].copy.into_iter().chain([after]).collect();
        let t = self.task(stream, bytes as f64 / cfg.h2d_bytes_per_s, deps, alloc, label);
        st.offload[l].reload = Some(t);
        t
    }

    /// New buffers for `tensors` coming back from the host, freed where the originals would
    /// have been (after their last saver's backward).
    fn reload_buffers(&mut self, st: &mut Bwd, tensors: &[usize]) -> Vec<u32> {
        let mb = st.mb;
        let mut alloc = Vec::with_capacity(tensors.len());
        for &t in tensors {
            let b = self.buffer(
                self.dag.tensors[t].bytes,
                Category::Activations,
                text!(self.names, "{} (micro-batch {mb}, reloaded from host)", self.dag.tensors[t].name),
            );
            alloc.push(b);
            st.free_bwd.push(self.ck.tensors[t].last_saver.unwrap_or(0), b);
        }
        alloc
    }

    fn offloaded_bytes(&self, o: &BlockOffload) -> u64 {
        o.tensors.iter().map(|&t| self.dag.tensors[t].bytes).sum()
    }

    /// The start of block `l`'s backward (the first kernel waits for `deps`): synchronous,
    /// the block's reload on the compute stream; overlapped, Transformer Engine's backward
    /// commit (wait for the reloads so far, start the next group's) and, at layer 0, the
    /// wait for every reload.
    pub(super) fn reload_block(&mut self, st: &mut Bwd, l: usize, deps: &mut Vec<u32>) {
        let Some(cfg) = self.plan.training.activation_offload else { return };
        let n = cfg.blocks as usize;
        match cfg.method {
            ActivationOffloadMethod::Synchronous => {
                if l < n {
                    let t = self.reload(st, l, COMPUTE, st.last_bwd_task);
                    deps.push(t);
                }
            }
            ActivationOffloadMethod::FineGrained => self.reload_groups(st, l, deps),
            ActivationOffloadMethod::Overlapped => {
                let k = st.offload_count;
                if k >= 1 && self.offload_window[k - 1] == l as u64 {
                    deps.extend(st.last_reload);
                    let after = st.last_bwd_task;
                    let t = self.reload(st, k - 1, self.h2d_stream, after);
                    st.last_reload = Some(t);
                    if k > 1 {
                        st.offload_count -= 1;
                    }
                }
                // A block's own reload was waited for at a later commit already; layer 0
                // waits for them all (the last suffices: the stream runs them in order).
                if l < n {
                    deps.extend(st.offload[l].reload);
                }
                if l == 0 {
                    deps.extend(st.last_reload);
                }
            }
        }
    }
}

impl Builder<'_> {
    /// Fine-grained offloading after op `i`'s forward (task `after`): each group committing
    /// there is copied to the host on the device-to-host stream, its GPU copies freed when
    /// the copy ends.
    pub(super) fn commit_groups(&mut self, st: &mut FwdPass, i: usize, after: u32) {
        let Some(fine) = &self.fine else { return };
        if fine.at_op[i].is_empty() {
            return;
        }
        for g in fine.at_op[i].clone() {
            let g = g as usize;
            if st.offload[g].tensors.is_empty() {
                continue;
            }
            let fine = self.fine.as_ref().expect("fine-grained");
            let (l, module) = (fine.block[g], crate::plan::OffloadModules::name(fine.module[g]));
            let bytes = self.offloaded_bytes(&st.offload[g]);
            let what = text!(self.names, "offload layers.{l} {module} saved activations to host ({bytes} B, D2H)");
            let label = TaskLabel::new(st.step, Phase::Forward, st.mb, what, TaskKind::Send, None)
                .with_region(Region::Block(l))
                .with_work(0.0, bytes);
            let rate = self.plan.training.activation_offload.map_or(1.0, |a| a.d2h_bytes_per_s);
            let t = self.task(self.d2h_stream, bytes as f64 / rate, [after], [], label);
            st.offload[g].copy = Some(t);
            let bufs = std::mem::take(&mut st.offload[g].buffers);
            self.free_at(t, &bufs);
        }
    }

    /// Fine-grained offloading at the end of a chunk's forward: a group none of whose commit
    /// points ran (none should) keeps its tensors on the GPU, freed as if never offloaded.
    pub(super) fn keep_uncommitted(&mut self, st: &mut FwdPass) {
        if self.fine.is_none() {
            return;
        }
        for g in 0..st.offload.len() {
            if st.offload[g].copy.is_none() && !st.offload[g].buffers.is_empty() {
                let o = std::mem::take(&mut st.offload[g]);
                for (t, b) in o.tensors.into_iter().zip(o.buffers) {
                    st.free_bwd.push(self.ck.tensors[t].last_saver.unwrap_or(0), b);
                }
            }
        }
    }

    /// Fine-grained offloading at the start of block `l`'s backward: its groups' reload (if
    /// the layer after it did not start it), which the block's first kernel waits for, then
    /// the reload of the layer before it in this chunk.
    fn reload_groups(&mut self, st: &mut Bwd, l: usize, deps: &mut Vec<u32>) {
        // The chunk's first layer in backward is reloaded when its backward is reached: after
        // the task the program issued last (the pass's own last task is its forward's, long
        // before under a pipeline). Megatron starts it as the chunk before finishes
        // (`pre_reload_last_layer`).
        let reached = self.last_task().map_or(st.last_bwd_task, |t| t.max(st.last_bwd_task));
        if let Some(t) = self.reload_layer(st, l, reached) {
            deps.push(t);
        }
        if l > 0 {
            self.reload_layer(st, l - 1, st.last_bwd_task.max(reached));
        }
    }

    /// Layer `l`'s offloaded groups back into new buffers (freed where the originals would
    /// have been) in one host-to-device copy after task `after` and the groups' own copies;
    /// None when it holds nothing on the host. Issued once.
    fn reload_layer(&mut self, st: &mut Bwd, l: usize, after: u32) -> Option<u32> {
        let groups: Vec<usize> = self
            .fine
            .as_ref()
            .and_then(|f| f.of_block.get(l))
            .map(|g| g.iter().map(|&g| g as usize).filter(|&g| !st.offload[g].tensors.is_empty()).collect())
            .unwrap_or_default();
        let first = *groups.first()?;
        if let Some(t) = st.offload[first].reload {
            return Some(t);
        }
        let mb = st.mb;
        let mut alloc = Vec::new();
        let mut deps = vec![after];
        let mut bytes = 0;
        for &g in &groups {
            deps.extend(st.offload[g].copy);
            bytes += self.offloaded_bytes(&st.offload[g]);
            let tensors = st.offload[g].tensors.clone();
            alloc.extend(self.reload_buffers(st, &tensors));
        }
        let what = text!(self.names, "reload layers.{l} saved activations from host ({bytes} B, H2D)");
        let label = TaskLabel::new(st.step, Phase::Backward, mb, what, TaskKind::Recv, None)
            .with_region(Region::Block(l as u64))
            .with_work(0.0, bytes);
        let rate = self.plan.training.activation_offload.map_or(1.0, |a| a.h2d_bytes_per_s);
        let t = self.task(self.h2d_stream, bytes as f64 / rate, deps, alloc, label);
        for &g in &groups {
            st.offload[g].reload = Some(t);
        }
        Some(t)
    }
}

/// Transformer Engine's window map: the layer whose forward commit waits for offload group
/// i (and whose backward commit starts group i's reload).
pub fn offload_window(groups: u64, layers: u64) -> Vec<u64> {
    let mut w = Vec::with_capacity(groups as usize);
    let mut constant = 0;
    for i in 0..groups {
        let mut x = (layers / groups.max(1)) * (i + 1) - 1;
        if i < layers % groups.max(1) {
            x += i + 1;
            constant = i + 1;
        } else {
            x += constant;
        }
        w.push(x);
    }
    w
}
