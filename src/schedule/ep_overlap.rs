//! Megatron-Core's `--overlap-moe-expert-parallel-comm`: the combined 1F1B schedule
//! (NVIDIA/Megatron-LM d98e8a6, `pipeline_parallel/combined_1f1b.py`,
//! `models/common/model_chunk_schedule_plan.py`). In the steady state a forward and another
//! micro-batch's backward run as one step, layer by layer: forward layer i beside backward
//! layer n - 1 - i of the chunk, so each pass's token all-to-alls run on the
//! communication stream while the other pass computes. Per layer pair
//! (`TransformerLayerSchedulePlan.run`):
//!
//! ```text
//! comm:    combine bwd      | dispatch fwd, dispatch bwd | combine fwd
//! compute: attention fwd    | experts bwd, experts fwd   | attention bwd
//! ```
//!
//! Here a layer's ops split at its dispatch and combine all-to-alls into: before the
//! dispatch (attention, router, permute), the dispatch, the experts, the combine, and after
//! the combine (unpermute, shared experts, residual). The two passes' tasks are written in
//! the order above; the engine's streams and dependencies then overlap them as the CUDA
//! streams do. A dense layer has no all-to-all: its forward comes before the paired
//! backward. Without a pipeline the first forward and the last backward run alone
//! (`combined_1f1b_schedule_for_no_pipelining`); with one, Megatron requires the interleaved
//! schedule and warms up one forward more, so the paired passes are independent
//! (`get_pp_rank_microbatches`).

use super::{Builder, Fwd};
use crate::model::{CommGroup, Region};

/// One layer's ops in a chunk (`lo..hi`), cut at its all-to-alls: `dispatch` and `combine`
/// are op indices, None for a dense layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LayerOps {
    pub lo: usize,
    pub hi: usize,
    pub a2a: Option<(usize, usize)>,
}

/// A chunk's ops: those before its first block (the embedding), its layers, and those after
/// (the final norm, heads, loss). Ops between two blocks belong to the earlier layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ChunkOps {
    pub head: (usize, usize),
    pub layers: Vec<LayerOps>,
    pub tail: (usize, usize),
}

impl ChunkOps {
    pub(super) fn of(dag: &crate::model::LayerDag, lo: usize, hi: usize) -> ChunkOps {
        let is_block = |i: usize| matches!(dag.ops[i].region, Region::Block(_));
        let Some(first) = (lo..hi).find(|&i| is_block(i)) else {
            return ChunkOps { head: (lo, hi), layers: Vec::new(), tail: (hi, hi) };
        };
        let last = (lo..hi).rev().find(|&i| is_block(i)).unwrap_or(first) + 1;
        let mut starts = vec![first];
        for i in first + 1..last {
            if is_block(i) && dag.ops[i].region != dag.ops[i - 1].region {
                starts.push(i);
            }
        }
        let layers = starts
            .iter()
            .enumerate()
            .map(|(k, &s)| {
                let e = starts.get(k + 1).copied().unwrap_or(last);
                let expert: Vec<usize> =
                    (s..e).filter(|&i| dag.ops[i].comm.is_some_and(|c| c.group == CommGroup::Expert)).collect();
                let a2a = match expert[..] {
                    [d, c] => Some((d, c)),
                    _ => None,
                };
                LayerOps { lo: s, hi: e, a2a }
            })
            .collect();
        ChunkOps { head: (lo, first), layers, tail: (last, hi) }
    }
}

/// The backward of a pipeline step that runs beside a forward: its micro-batch, chunk and
/// forward, and the flags [`Builder::backward_begin`] takes.
pub(super) struct PairedBackward {
    pub mb: u32,
    pub chunk: usize,
    pub fwd: Fwd,
    pub last_mb: bool,
    pub sync_grads: bool,
}

impl Builder<'_> {
    /// The forward of (`mb`, `chunk`) and backward `b` as one combined 1F1B step; returns the
    /// forward's state for its own backward later.
    pub(super) fn forward_backward(&mut self, step: u32, mb: u32, chunk: usize, b: PairedBackward) -> Fwd {
        if self.chunk_layers.is_empty() {
            // The chunks' layer cuts, once per program.
            self.chunk_layers = self.chunk_ops.iter().map(|&(lo, hi)| ChunkOps::of(self.dag, lo, hi)).collect();
        }
        let layers = std::mem::take(&mut self.chunk_layers);
        let (f_ops, b_ops) = (&layers[chunk], &layers[b.chunk]);
        // The forward's receive and pre-process, then the backward's receive and
        // post-process (loss and head), as `TransformerModelChunkSchedulePlan.run` orders them.
        let mut fs = self.forward_begin(step, mb, chunk);
        for i in f_ops.head.0..f_ops.head.1 {
            self.forward_op(&mut fs, i);
        }
        let mut bs = self.backward_begin(step, b.mb, b.chunk, b.fwd, b.last_mb, b.sync_grads);
        for i in (b_ops.tail.0..b_ops.tail.1).rev() {
            self.backward_op(&mut bs, i);
        }
        let (nf, nb) = (f_ops.layers.len(), b_ops.layers.len());
        let pairs = nf.min(nb);
        let fwd = |s: &mut Self, st: &mut super::forward::FwdPass, r: std::ops::Range<usize>| {
            for i in r {
                s.forward_op(st, i);
            }
        };
        let bwd = |s: &mut Self, st: &mut super::backward::Bwd, r: std::ops::Range<usize>| {
            for i in r.rev() {
                s.backward_op(st, i);
            }
        };
        for k in 0..pairs {
            let (f, g) = (f_ops.layers[k], b_ops.layers[nb - 1 - k]);
            // Each layer cut at its all-to-alls, [lo, d) d (d, c) c (c, hi); a dense layer's
            // cuts both sit at its end (`n` = 0), which empties every range but [lo, hi).
            let ((fd, fc), nf) = (f.a2a.unwrap_or((f.hi, f.hi)), usize::from(f.a2a.is_some()));
            let ((gd, gc), ng) = (g.a2a.unwrap_or((g.hi, g.hi)), usize::from(g.a2a.is_some()));
            // comm: the backward's combine; compute: the rest of its layer after it.
            bwd(self, &mut bs, gc..g.hi);
            // compute: the forward up to its dispatch (attention, router, permute).
            fwd(self, &mut fs, f.lo..fd);
            // compute: the backward's experts.
            bwd(self, &mut bs, gd + ng..gc);
            // comm: the forward's dispatch, then the backward's.
            fwd(self, &mut fs, fd..fd + nf);
            bwd(self, &mut bs, gd..gd + ng);
            // compute: the forward's experts; comm: its combine.
            fwd(self, &mut fs, fd + nf..fc + nf);
            // compute: the backward's attention (a dense layer's whole backward).
            bwd(self, &mut bs, g.lo..gd);
            // compute: the forward's unpermute, shared experts and residual.
            fwd(self, &mut fs, fc + nf..f.hi);
        }
        for g in b_ops.layers[..nb - pairs].iter().rev() {
            bwd(self, &mut bs, g.lo..g.hi);
        }
        for f in &f_ops.layers[pairs..] {
            fwd(self, &mut fs, f.lo..f.hi);
        }
        fwd(self, &mut fs, f_ops.tail.0..f_ops.tail.1);
        let out = self.forward_end(fs);
        bwd(self, &mut bs, b_ops.head.0..b_ops.head.1);
        self.backward_end(bs);
        self.chunk_layers = layers;
        out
    }
}
