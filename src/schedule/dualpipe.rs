//! DeepSeek's DualPipe (deepseek-ai/DualPipe 3da1bbe, `dualpipe/dualpipe.py`; DeepSeek-V3
//! technical report, Sec. 3.2.1), a bidirectional pipeline.
//!
//! Half of a step's micro-batches enter at rank 0 and flow to rank `p - 1` (the forward
//! direction), half enter at rank `p - 1` and flow back (the reverse direction). Rank `k`
//! therefore holds model stage `k` for the first and stage `p - 1 - k` for the second: two
//! copies of every stage's parameters in the pipeline ([`crate::plan::Plan::stage_chunks`]),
//! whose gradients are reduced together ([`crate::plan::ModelParallel::stage_copies`]).
//!
//! `DualPipe.step` runs eight phases on each rank, with `h = min(k, p - 1 - k)`, `P = p / 2`
//! and `N` micro-batches per direction. "Phase 0" is the direction in which the rank sits
//! in the first half of the pipeline, "phase 1" the other:
//!
//! | phase | repeats | chunks |
//! |---|---|---|
//! | 1 nF0 | 2 (P - h - 1) | F0 |
//! | 2 nF0F1 | h + 1 | F0 F1 |
//! | 3 nB1W1F1 | P - h - 1 | B1 (weight gradients deferred), W, F1 |
//! | 4 nF0B1F1B0 | N - p + h + 1 | F0 & B1, F1 & B0 |
//! | 5 nB1F1B0 | P - h - 1 | B1, F1 & B0 |
//! | 6 nB1B0 | h + 1 | B1 B0 (the second half with weight gradients deferred) |
//! | 7 nWB0 | P - h - 1 | W, B0 (deferred) |
//! | 8 nW | h + 1 | W |
//!
//! `F & B` is `_forward_backward_chunk`: a forward and the other direction's backward as one
//! overlapped step, layer by layer, each one's all-to-alls under the other's compute
//! ([`super::ep_overlap`]'s pairing, which Megatron-Core's combined 1F1B took from it). The
//! middle ranks run their first phase-4 pair apart ("we don't overlap these two chunks to
//! further reduce bubble size").
//!
//! A backward with its weight gradients deferred (zero bubble, `WeightGradStore`) runs only
//! the input-gradient GEMMs, so the gradient reaches the previous rank sooner; each GEMM's
//! weight-gradient half is queued with what it reads (the saved input and the output's
//! gradient, kept alive until then), and `W` runs one deferred backward's queue, oldest
//! first.

use std::collections::{HashMap, VecDeque};

use super::ep_overlap::PairedBackward;
use super::{Builder, TaskLabel, COMPUTE};

/// One entry of a rank's DualPipe order: (chunk, micro-batch) pairs, chunk 0 the forward
/// direction's stage and chunk 1 the reverse direction's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    F(usize, u32),
    /// A backward; true: its weight gradients are deferred to a later `W`.
    B(usize, u32, bool),
    /// The oldest deferred backward's weight gradients.
    W,
    /// A forward and a backward overlapped.
    FB((usize, u32), (usize, u32)),
}

/// Rank `k`'s order over a step of `m` micro-batches (`m / 2` per direction, the forward
/// direction's numbered `0..m/2`, the reverse's `m/2..m`) on `p` ranks, as `DualPipe.step`
/// runs it.
pub fn order(p: u64, k: u64, m: u64) -> Vec<Slot> {
    // Phase 0 is the forward direction on the first half of the ranks, the reverse on the
    // second (`phase ^= self.is_in_second_half`); the middle ranks are p/2 - 1 and p/2.
    let (half, h) = (p / 2, k.min(p - 1 - k));
    let flip = usize::from(k >= half);
    let n = (m / 2) as u32;
    phases(half, h, n, flip, k + 1 == half || k == half, |c, i| c as u32 * n + i)
}

/// Rank `k`'s order under DualPipeV (`DualPipeV.step`): DualPipe's phases with the ranks in
/// place of the half ranks and every micro-batch through both chunks (chunk 0 down the V,
/// chunk 1 back up), numbered `0..m`; the last rank, where the V turns, runs its first
/// phase-4 pair apart.
pub fn order_v(p: u64, k: u64, m: u64) -> Vec<Slot> {
    phases(p, k, m as u32, 0, k + 1 == p, |_, i| i)
}

/// `DualPipe.step`'s eight phases over `half` ranks on rank `h` of them, `n` micro-batches
/// per chunk; `flip` maps phases to chunks, `middle` marks the rank whose first phase-4
/// pair runs apart, `mb(chunk, i)` numbers chunk's i-th micro-batch.
fn phases(half: u64, h: u64, n: u32, flip: usize, middle: bool, mb: impl Fn(usize, u32) -> u32) -> Vec<Slot> {
    let mut next_f = [0u32; 2];
    let mut next_b = [0u32; 2];
    let mut f = |phase: usize| {
        let c = phase ^ flip;
        next_f[c] += 1;
        (c, mb(c, next_f[c] - 1))
    };
    let mut b = |phase: usize| {
        let c = phase ^ flip;
        next_b[c] += 1;
        (c, mb(c, next_b[c] - 1))
    };
    let mut out = Vec::with_capacity(6 * n as usize);
    let bwd = |(c, mb): (usize, u32), zb: bool| Slot::B(c, mb, zb);
    for _ in 0..2 * (half - h - 1) {
        let (c, mb) = f(0);
        out.push(Slot::F(c, mb));
    }
    for _ in 0..h + 1 {
        let (c, mb) = f(0);
        out.push(Slot::F(c, mb));
        let (c, mb) = f(1);
        out.push(Slot::F(c, mb));
    }
    for _ in 0..half - h - 1 {
        out.push(bwd(b(1), true));
        out.push(Slot::W);
        let (c, mb) = f(1);
        out.push(Slot::F(c, mb));
    }
    for i in 0..(u64::from(n) + h + 1).saturating_sub(2 * half) {
        let (fw, bw) = (f(0), b(1));
        if i == 0 && middle {
            out.push(Slot::F(fw.0, fw.1));
            out.push(bwd(bw, false));
        } else {
            out.push(Slot::FB(fw, bw));
        }
        out.push(Slot::FB(f(1), b(0)));
    }
    for _ in 0..half - h - 1 {
        out.push(bwd(b(1), false));
        out.push(Slot::FB(f(1), b(0)));
    }
    // `step_6 // 2` with step_6 = h + 1.
    let mid = h.div_ceil(2);
    let mut zb = false;
    for i in 0..h + 1 {
        if i == mid && h % 2 == 1 {
            zb = true;
        }
        out.push(bwd(b(1), zb));
        if i == mid && h % 2 == 0 {
            zb = true;
        }
        out.push(bwd(b(0), zb));
    }
    for _ in 0..half - h - 1 {
        out.push(Slot::W);
        out.push(bwd(b(0), true));
    }
    out.extend((0..h + 1).map(|_| Slot::W));
    out
}

/// One weight-gradient GEMM held back by a deferred backward: its task as it will be
/// issued, and the buffers it reads, freed when it ends.
#[derive(Debug)]
pub(super) struct DeferredWgrad {
    /// The op whose weight gradient this is.
    pub op: usize,
    /// Megatron's gradient bucket the op closes, reduced once this GEMM has run:
    /// (step, micro-batch).
    pub bucket: Option<(u32, u32)>,
    pub seconds: f64,
    pub deps: Vec<u32>,
    pub alloc: Vec<u32>,
    pub frees: Vec<u32>,
    pub label: TaskLabel,
}

/// The rank's `WeightGradStore`: whether the backward being built defers, the GEMMs it has
/// deferred so far, and earlier deferred backwards' queues, oldest first.
#[derive(Debug, Default)]
pub(super) struct WeightGradStore {
    pub enabled: bool,
    pub cache: Vec<DeferredWgrad>,
    pub queue: VecDeque<Vec<DeferredWgrad>>,
}

impl Builder<'_> {
    /// One step's forwards and backwards in DualPipe's order.
    pub(super) fn dualpipe_passes(&mut self, step: u32) {
        let mp = &self.plan.parallel.model_parallel;
        let (p, k, m) = (mp.pipeline, self.plan.stage, self.plan.training.grad_accum);
        let order =
            if mp.schedule == crate::plan::PipelineSchedule::DualPipeV { order_v(p, k, m) } else { order(p, k, m) };
        let mut pending = HashMap::new();
        // Each chunk's last backward of the step: where Megatron's --overlap-grad-reduce
        // reduces its buckets.
        let backward_of = |s: &Slot| match *s {
            Slot::B(c, _, _) | Slot::FB(_, (c, _)) => Some(c),
            _ => None,
        };
        let last_bwd: Vec<Option<usize>> =
            (0..2).map(|c| order.iter().rposition(|s| backward_of(s) == Some(c))).collect();
        for (n, slot) in order.into_iter().enumerate() {
            self.mark_period();
            let sync = |c: usize| last_bwd[c] == Some(n);
            match slot {
                Slot::F(c, mb) => {
                    let f = self.forward(step, mb, c);
                    pending.insert((mb, c), f);
                }
                Slot::B(c, mb, zb) => {
                    let f = pending.remove(&(mb, c)).expect("DualPipe runs a backward after its forward");
                    self.wgrad.enabled = zb;
                    self.backward(step, mb, c, f, false, sync(c));
                    self.wgrad.enabled = false;
                    if zb {
                        let cache = std::mem::take(&mut self.wgrad.cache);
                        self.wgrad.queue.push_back(cache);
                    }
                }
                Slot::W => self.deferred_weight_grads(),
                Slot::FB((fc, fmb), (bc, bmb)) => {
                    let fwd = pending.remove(&(bmb, bc)).expect("DualPipe runs a backward after its forward");
                    let b = PairedBackward { mb: bmb, chunk: bc, fwd, last_mb: false, sync_grads: sync(bc) };
                    let f = self.forward_backward(step, fmb, fc, b);
                    pending.insert((fmb, fc), f);
                }
            }
        }
        debug_assert!(self.wgrad.queue.is_empty(), "every deferred weight gradient runs in the step");
    }

    /// `W`: the oldest deferred backward's weight-gradient GEMMs, each freeing what it read.
    fn deferred_weight_grads(&mut self) {
        let Some(group) = self.wgrad.queue.pop_front() else { return };
        let mut last = None;
        for d in group {
            let t = self.task(COMPUTE, d.seconds, d.deps, d.alloc, d.label);
            self.free_at(t, &d.frees);
            if let (Some((step, mb)), Some(k)) = (d.bucket, self.mg_buckets.of_op[d.op]) {
                self.megatron_bucket_reduce(step, mb, k as usize, t);
            }
            last = Some(t);
        }
        self.step_comm.extend(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forwards, backwards per chunk, W passes and deferring backwards; panics if a backward
    /// comes before its own forward (the builder's `expect` relies on it).
    fn count(o: &[Slot]) -> ([u32; 2], [u32; 2], usize, usize) {
        let (mut f, mut b, mut w, mut zb) = ([0; 2], [0; 2], 0, 0);
        let mut done = std::collections::HashSet::new();
        for s in o {
            match *s {
                Slot::F(c, mb) => {
                    done.insert((c, mb));
                }
                Slot::B(c, mb, _) => assert!(done.contains(&(c, mb)), "{s:?} before its forward"),
                Slot::FB(fw, bw) => {
                    assert!(done.contains(&bw), "{s:?}: backward before its forward");
                    done.insert(fw);
                }
                Slot::W => {}
            }
        }
        for s in o {
            match *s {
                Slot::F(c, _) => f[c] += 1,
                Slot::B(c, _, z) => {
                    b[c] += 1;
                    zb += usize::from(z);
                }
                Slot::W => w += 1,
                Slot::FB((fc, _), (bc, _)) => {
                    f[fc] += 1;
                    b[bc] += 1;
                }
            }
        }
        (f, b, w, zb)
    }

    #[test]
    fn every_rank_runs_each_micro_batch_of_both_directions_once() {
        for p in [2, 4, 8, 16] {
            for m in [2 * p, 2 * p + 2, 5 * p] {
                for k in 0..p {
                    let o = order(p, k, m);
                    let (f, b, w, zb) = count(&o);
                    let n = (m / 2) as u32;
                    assert_eq!((f, b), ([n, n], [n, n]), "p {p} rank {k} m {m}");
                    // Every deferred backward has its W, and no W comes before its backward.
                    assert_eq!(w, zb, "p {p} rank {k} m {m}");
                    let mut open = 0i64;
                    for s in &o {
                        match s {
                            Slot::B(_, _, true) => open += 1,
                            Slot::W => open -= 1,
                            _ => {}
                        }
                        assert!(open >= 0);
                    }
                }
            }
        }
    }

    #[test]
    fn dualpipev_runs_every_micro_batch_through_both_chunks_once() {
        for p in [2, 3, 4, 8] {
            for m in [2 * p, 2 * p + 1, 5 * p] {
                for k in 0..p {
                    let o = order_v(p, k, m);
                    let (f, b, w, zb) = count(&o);
                    let m = m as u32;
                    assert_eq!((f, b), ([m, m], [m, m]), "p {p} rank {k}");
                    assert_eq!(w, zb, "p {p} rank {k}");
                    // Chunk 1 of a micro-batch never runs before its chunk 0 on this rank.
                    let mut down = vec![false; m as usize];
                    for s in &o {
                        match *s {
                            Slot::F(0, i) | Slot::FB((0, i), _) => down[i as usize] = true,
                            _ => {}
                        }
                        if let Slot::F(1, i) | Slot::FB((1, i), _) = *s {
                            assert!(down[i as usize], "p {p} rank {k}: mb {i} up before down");
                        }
                    }
                }
            }
        }
        // Rank 0 of 4: 2 (4 - 0 - 1) = 6 forwards down the V first, then one each way.
        let o = order_v(4, 0, 8);
        assert_eq!(o[..7], (0..7).map(|i| Slot::F(0, i)).collect::<Vec<_>>()[..]);
        assert_eq!(o[7], Slot::F(1, 0));
    }

    #[test]
    fn rank_zero_of_eight_warms_up_with_six_forwards_of_its_own_direction() {
        // p = 8, rank 0: h = 0, phase 1 runs 2 (4 - 0 - 1) = 6 forwards of direction 0,
        // then one forward of each direction.
        let o = order(8, 0, 20);
        let fwd0: Vec<Slot> = (0..7).map(|i| Slot::F(0, i)).collect();
        assert_eq!(o[..7], fwd0[..]);
        assert_eq!(o[7], Slot::F(1, 10));
        // The last rank mirrors it: phase 0 is the reverse direction there.
        let o = order(8, 7, 20);
        assert_eq!(o[0], Slot::F(1, 10));
        assert_eq!(o[7], Slot::F(0, 0));
        // A middle rank (3) starts phase 4 with a forward and a backward apart.
        let o = order(8, 3, 20);
        let first_pair = o.iter().position(|s| matches!(s, Slot::FB(..))).unwrap();
        assert!(matches!(o[first_pair - 2], Slot::F(..)) && matches!(o[first_pair - 1], Slot::B(_, _, false)));
    }
}
