//! DeepSpeed ZeRO-3's parameter fetching, submodule by submodule, as its
//! `PartitionedParameterCoordinator` does it (runtime/zero/partitioned_param_coordinator.py,
//! v0.16.5; the same rules since the 2021 releases):
//!
//! - every module with parameters of its own (a linear, a norm, an embedding: an op here) is
//!   fetched by its pre-forward and pre-backward hooks (`fetch_sub_module`): an all-gather of
//!   its parameters if they are not available, which the module's kernel waits for;
//! - once a trace of one forward and backward has been recorded (from the second
//!   micro-batch on), each fetch also prefetches the next uses in the trace that are not
//!   available, up to `stage3_prefetch_bucket_size` elements and while fewer than
//!   `stage3_max_live_parameters` elements are available;
//! - the post-forward and post-backward hooks release a module's parameters
//!   (`release_sub_module`), except, with a trace, those prefetched for a later use and those
//!   used again within the next `stage3_max_reuse_distance` elements of the trace (so the
//!   last layers of a forward stay gathered into their backward); without a trace, always;
//! - a parameter of at most `stage3_param_persistence_threshold` elements is never
//!   partitioned (`ds_persist`): it is whole on every rank from initialisation and never
//!   fetched.
//!
//! Modelled at the granularity of an op (a module's weight and bias together); a tied LM
//! head fetches the word embedding it shares. Each all-gather's buffer is allocated when it
//! is issued, which is when the previous kernel has been issued (the CPU runs one op ahead);
//! a prefetch batch is one collective. Not modelled: ZeRO-3 with offloaded parameters (they
//! are fetched per block unit), mixture-of-experts parameters, and one flat buffer per
//! coalesced batch (each op's parameters get their own block).

use super::{Builder, Category, Collective, Phase, TaskKind, TaskLabel, COMPUTE, NCCL};
use crate::model::{LayerDag, OpKind, Region};
use crate::plan::{DeepspeedConfig, Plan};

/// The coordinator's state over one rank's program.
pub(super) struct Zero3Fetch {
    cfg: DeepspeedConfig,
    /// Per op: the op whose parameters it uses (itself, or for a tied LM head the embedding).
    key: Vec<usize>,
    /// Per op (by key): elements of its parameters; whether they are persistent.
    numel: Vec<u64>,
    persistent: Vec<bool>,
    /// The parameter uses of one micro-batch's forward and backward, in order (keys).
    trace: Vec<usize>,
    /// Per key: the gathered buffer and the all-gather that made it, while available.
    gathered: Vec<Option<(u32, u32)>>,
    /// Per key: the latest trace position a fetch or prefetch has covered
    /// (`__most_recent_step_id_param_fetched_for`).
    fetched_for: Vec<Option<usize>>,
    /// Next trace position, and the head of the prefetch queue (`__param_queue`).
    pos: usize,
    queue: usize,
    /// Elements gathered now (`__n_available_params`).
    available: u64,
    /// The trace has been recorded (after the first micro-batch's backward).
    complete: bool,
}

impl Zero3Fetch {
    /// The coordinator for this plan, if DeepSpeed ZeRO-3 fetches submodule by submodule
    /// (not with offloaded parameters or experts, which keep the per-block model).
    pub(super) fn new(dag: &LayerDag, plan: &Plan, chunk: (usize, usize), recompute: &[Vec<usize>]) -> Option<Self> {
        if !plan.zero3_fetches_modules() {
            return None;
        }
        let cfg = plan.parallel.deepspeed;
        let n = dag.ops.len();
        let embedding = dag.ops.iter().position(|o| o.kind == OpKind::Embedding && o.region == Region::Embed);
        let key: Vec<usize> = (0..n)
            .map(|i| {
                let o = &dag.ops[i];
                match embedding {
                    Some(e) if o.params == 0 && o.shared_params > 0 => e,
                    _ => i,
                }
            })
            .collect();
        let numel: Vec<u64> = dag.ops.iter().map(|o| o.params + o.shared_params).collect();
        let persistent = numel.iter().map(|&x| x > 0 && x <= cfg.stage3_param_persistence_threshold).collect();
        let mut me = Zero3Fetch {
            cfg,
            key,
            numel,
            persistent,
            trace: Vec::new(),
            gathered: vec![None; n],
            fetched_for: vec![None; n],
            pos: 0,
            queue: 0,
            available: 0,
            complete: false,
        };
        // The builder's own order: forward, then per block in reverse its recompute (full
        // checkpointing) before its backward.
        let (lo, hi) = chunk;
        let uses = |i: usize, me: &Zero3Fetch| dag.ops[i].comm.is_none() && me.fetches(i);
        me.trace = (lo..hi).filter(|&i| uses(i, &me)).map(|i| me.key[i]).collect();
        let mut prev: Option<Region> = None;
        for i in (lo..hi).rev() {
            let op = &dag.ops[i];
            if op.comm.is_some() {
                continue;
            }
            if prev != Some(op.region) {
                if let Region::Block(l) = op.region {
                    for &r in &recompute[l as usize] {
                        if uses(r, &me) {
                            me.trace.push(me.key[r]);
                        }
                    }
                }
            }
            prev = Some(op.region);
            if uses(i, &me) {
                me.trace.push(me.key[i]);
            }
        }
        Some(me)
    }

    /// Whether op `i` is fetched: it has parameters that are partitioned.
    pub(super) fn fetches(&self, i: usize) -> bool {
        let k = self.key[i];
        self.numel[k] > 0 && !self.persistent[k]
    }

    /// Elements of the persistent parameters, whole on every rank.
    pub(super) fn persistent_numel(&self) -> u64 {
        (0..self.numel.len()).filter(|&k| self.persistent[k] && self.key[k] == k).map(|k| self.numel[k]).sum()
    }

    /// Whether the parameters of the use at trace position `p` stay gathered after it.
    fn keeps(&self, k: usize, p: usize) -> bool {
        if !self.complete {
            return false;
        }
        if self.fetched_for[k].is_some_and(|f| f > p) {
            return true;
        }
        let mut traversed = 0;
        for &q in self.trace.get(p + 1..).unwrap_or_default() {
            if traversed >= self.cfg.stage3_max_reuse_distance {
                break;
            }
            if q == k {
                return true;
            }
            traversed += self.numel[q];
        }
        false
    }
}

impl Builder<'_> {
    /// A micro-batch's forward starts a new pass over the trace (`reset_step`).
    pub(super) fn zero3_start_pass(&mut self) {
        if let Some(z) = self.zero3.as_mut() {
            z.pos = 0;
            z.queue = 0;
            z.fetched_for.iter_mut().for_each(|f| *f = None);
        }
    }

    /// The end of a micro-batch's backward: the trace is complete from here on.
    pub(super) fn zero3_end_pass(&mut self) {
        if let Some(z) = self.zero3.as_mut() {
            debug_assert_eq!(z.pos, z.trace.len(), "ZeRO-3 trace out of step with the program");
            z.complete = true;
        }
    }

    /// `fetch_sub_module` before op `i`'s kernel: all-gather its parameters unless available,
    /// then prefetch along the trace. `after` is the last kernel issued (the CPU is at op
    /// `i`'s hook once it has issued that one). The kernel waits for the all-gather
    /// (`deps`). Returns the trace position, for [`Self::zero3_release`].
    pub(super) fn zero3_fetch(
        &mut self,
        i: usize,
        (step, mb, phase): (u32, u32, Phase),
        after: Option<u32>,
        deps: &mut Vec<u32>,
    ) -> Option<usize> {
        let z = self.zero3.as_mut()?;
        if !z.fetches(i) {
            return None;
        }
        let k = z.key[i];
        let p = z.pos;
        debug_assert_eq!(z.trace.get(p), Some(&k), "ZeRO-3 trace out of step at op {i}");
        z.pos += 1;
        let need = z.gathered[k].is_none();
        let mut batch = Vec::new();
        if z.complete {
            z.queue = z.queue.max(p + 1);
            z.fetched_for[k] = z.fetched_for[k].max(Some(p));
            let budget =
                z.cfg.stage3_max_live_parameters.saturating_sub(z.available).min(z.cfg.stage3_prefetch_bucket_size);
            let mut prefetching = 0;
            while z.queue < z.trace.len() && prefetching < budget {
                let q = z.trace[z.queue];
                z.fetched_for[q] = z.fetched_for[q].max(Some(z.queue));
                if z.gathered[q].is_none() && q != k && !batch.contains(&q) {
                    batch.push(q);
                    prefetching += z.numel[q];
                }
                z.queue += 1;
            }
        }
        let deps_ag: Vec<u32> = after.into_iter().collect();
        if need {
            self.zero3_all_gather(&[k], (step, mb, phase), deps_ag.clone(), "fetch");
        }
        let z = self.zero3.as_ref()?;
        if let Some((_, t)) = z.gathered[k] {
            deps.push(t);
        }
        if !batch.is_empty() {
            self.zero3_all_gather(&batch, (step, mb, phase), deps_ag, "prefetch");
        }
        Some(p)
    }

    /// `release_sub_module` after op `i`'s kernel `t` (its use at trace position `p`).
    pub(super) fn zero3_release(&mut self, i: usize, p: Option<usize>, t: u32) {
        let (Some(p), Some(z)) = (p, self.zero3.as_mut()) else { return };
        let k = z.key[i];
        if z.keeps(k, p) {
            return;
        }
        if let Some((b, _)) = z.gathered[k].take() {
            z.available -= z.numel[k];
            self.free_at(t, &[b]);
        }
    }

    /// One all-gather (a fetch, or a coalesced prefetch batch) of the parameters of `keys`,
    /// each into its own buffer allocated when it is issued.
    fn zero3_all_gather(&mut self, keys: &[usize], (step, mb, phase): (u32, u32, Phase), deps: Vec<u32>, what: &str) {
        let dag = self.dag;
        let c = self.pr().compute;
        let mut alloc = Vec::with_capacity(keys.len());
        let mut bytes = 0;
        for &k in keys {
            let el = self.zero3.as_ref().map_or(0, |z| z.numel[k]);
            bytes += el * c.bytes();
            alloc.push(self.buffer(
                el * c.bytes(),
                Category::GatheredParameters,
                text!(self.names, "{} gathered for {} (ZeRO-3 {what}, {})", dag.ops[k].name, phase.name(), c.name()),
            ));
        }
        let u = self.plan.unit_of(dag.ops[keys[0]].region);
        let secs = self.cost.collective_s(&self.cost.shard_group, Collective::AllGather, bytes);
        let name = match keys.len() {
            1 => text!(self.names, "all-gather {} (ZeRO-3 {what})", dag.ops[keys[0]].name),
            n => text!(self.names, "all-gather {n} modules from {} (ZeRO-3 {what})", dag.ops[keys[0]].name),
        };
        let label = TaskLabel::new(step, phase, mb, name, TaskKind::AllGather, Some(u)).with_work(0.0, bytes);
        let t = self.task(NCCL, secs, deps, alloc.clone(), label);
        let z = self.zero3.as_mut().expect("ZeRO-3 fetch");
        for (&k, &b) in keys.iter().zip(&alloc) {
            z.gathered[k] = Some((b, t));
            z.available += z.numel[k];
        }
    }

    /// Initialisation: the persistent parameters, whole on every rank (`ds_persist`).
    pub(super) fn zero3_persistent_init(&mut self) {
        let Some(el) = self.zero3.as_ref().map(Zero3Fetch::persistent_numel).filter(|&e| e > 0) else { return };
        let b = self.buffer(
            el * self.pr().param.bytes(),
            Category::Parameters,
            text!(
                self.names,
                "ZeRO-3 persistent parameters, whole (at most stage3_param_persistence_threshold {:e} elements each)",
                self.plan.parallel.deepspeed.stage3_param_persistence_threshold as f64
            ),
        );
        let label =
            TaskLabel::new(0, Phase::Init, 0, text!(self.names, "ZeRO-3 persistent parameters"), TaskKind::Init, None);
        self.task(COMPUTE, 0.0, [], [b], label);
    }
}
