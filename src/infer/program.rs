//! The inference program of one tensor-parallel rank: weights and (static) KV cache at
//! initialisation, the prompt's forward pass over the layer DAG, then one decode pass per
//! generated token after the first.
//!
//! Prefill walks the training DAG's forward ops without autograd: nothing is saved, each
//! output lives until its last consumer has run, per-row statistics are not kept, and the
//! loss is not computed; the LM head runs on the last position of each sequence. Causal flash
//! attention skips the masked half of the score blocks, so prefill attention costs half the
//! DAG's (training-convention) attention FLOPs.
//!
//! A decode pass is two tasks per layer (attention half, MLP half, split at the first
//! residual add) plus the embedding and the head: at one token per sequence each is a handful
//! of small kernels whose time is the roofline of the bytes they stream (weights as stored,
//! the KV cache read, the activations) against the FLOPs they do, plus a per-kernel cost
//! (launch overhead in eager mode, [`super::GRAPH_KERNEL_S`] inside a CUDA graph). Under
//! tensor parallelism each half ends in an all-reduce of the batch's hidden state on the
//! `tp` stream, which the next half waits for.

use serde::Serialize;

use super::{InferenceConfig, KvCacheKind, GRAPH_KERNEL_S};
use crate::engine::{BufferSpec, Program, Task};
use crate::hardware::Cluster;
use crate::memory::Category;
use crate::model::{LayerDag, Op, OpKind, Region, TensorKind, WeightFormat};
use crate::net::Collective;
use crate::schedule::cost::{ns, Cost, GEMM_TABLE_MIN_DIM, HBM_EFFICIENCY, OP_OVERHEAD_S};
use crate::schedule::{Phase, Schedule, TaskKind, TaskLabel};

pub const COMPUTE: u16 = 0;
pub const TP: u16 = 1;

/// What the program stores, moves and computes on one rank, for the report's figures and
/// bounds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Traffic {
    /// Weights as stored on this rank (quantized linears, scales included).
    pub weight_bytes: u64,
    /// Weights of this rank had they stayed in the compute dtype.
    pub weight_bytes_half: u64,
    /// KV-cache bytes per token of context of one sequence on this rank.
    pub kv_bytes_per_token: u64,
    /// The whole KV cache at the end of generation (batch x context tokens).
    pub kv_bytes_final: u64,
    pub prefill_flops: f64,
    pub decode_steps: u64,
    /// HBM bytes all decode passes read and write (weights, KV cache, activations).
    pub decode_bytes: f64,
    pub decode_flops: f64,
    /// Kernels per decode pass (what the per-kernel cost multiplies).
    pub decode_kernels: u64,
}

/// Bytes of an op's weights as stored: block linears in the quantized format (their bias in
/// the compute dtype), everything else in the compute dtype.
pub fn weight_bytes(op: &Op, fmt: WeightFormat, c: u64) -> u64 {
    match (op.kind, op.region, op.gemm) {
        (OpKind::Linear, Region::Block(_), Some([_, n, k])) if fmt != WeightFormat::Half && op.params > 0 => {
            fmt.linear_bytes(k, n) + op.params.saturating_sub(n * k) * c
        }
        _ => op.params * c,
    }
}

/// One half of a transformer block at one token per sequence.
#[derive(Debug, Clone, Default)]
struct Half {
    name: &'static str,
    weight_bytes: u64,
    /// Linear (weight) FLOPs per sequence.
    lin_flops: f64,
    /// Seconds of the half's linears in one decode pass over the batch: each a [sequences, n]
    /// x [n, k] GEMM, the same in every layer and pass (computed once).
    lin_s: f64,
    /// Activation bytes read and written per sequence (non-linear ops, linear inputs/outputs).
    act_bytes: f64,
    /// Live activations per sequence while the half runs.
    live_bytes: u64,
    has_attention: bool,
    /// The largest linear's `out x in` (NF4's dequantized transient).
    largest_linear: u64,
    linear_elems: u64,
    kernels: u64,
    /// The all-reduce that ends the half under tensor parallelism, bytes per sequence.
    comm_bytes: u64,
}

struct B<'a> {
    dag: &'a LayerDag,
    cfg: &'a InferenceConfig,
    cost: Cost,
    tp: u64,
    prog: Program,
    labels: Vec<TaskLabel>,
    names: bool,
    probe: bool,
    traffic: Traffic,
    c: u64,
}

/// Builds the program of one tensor-parallel rank (every rank of the group runs the same;
/// data-parallel replicas are independent servers). `dag` is the prefill graph: batch x
/// prompt tokens, split `tp` ways, no dropout.
pub fn build(dag: &LayerDag, cfg: &InferenceConfig, cluster: &Cluster, tp: u64) -> (Schedule, Traffic) {
    build_with(dag, cfg, cluster, tp, true, false)
}

/// [`build`] with the choice of names (false: every label and buffer name empty) and of a
/// `probe`: with a static cache every decode pass allocates the same, so a probe for the
/// capacity search runs only the first and the last (the whole program's memory verdict,
/// not its timing); a dynamic cache always runs every pass.
pub fn build_with(
    dag: &LayerDag,
    cfg: &InferenceConfig,
    cluster: &Cluster,
    tp: u64,
    names: bool,
    probe: bool,
) -> (Schedule, Traffic) {
    let mut cost = Cost::new(cluster, cfg.compute_dtype, 1);
    cost.tp_group = crate::schedule::cost::group_on(cluster, tp, tp);
    let prog = Program {
        streams: vec!["compute".into(), "tp".into()],
        names: vec![String::new()].into(),
        ..Default::default()
    };
    let c = cfg.compute_dtype.bytes();
    let mut b = B { dag, cfg, cost, tp, prog, labels: Vec::new(), names, probe, traffic: Traffic::default(), c };
    let mut keep = b.init();
    let (last, kv) = b.prefill();
    if b.cfg.kv_cache == KvCacheKind::Dynamic {
        keep.kv = kv;
    }
    b.decode(&keep, last);
    let flops = b.traffic.prefill_flops + b.traffic.decode_flops;
    let sched = Schedule {
        program: b.prog,
        labels: b.labels.into(),
        model_flops_per_step: flops,
        hardware_flops_per_step: flops,
    };
    (sched, b.traffic)
}

/// Buffers that live from initialisation (or prefill) to the end of generation.
struct Kept {
    /// Per layer: the keys and values (static: preallocated; dynamic: filled by prefill).
    kv: Vec<Option<(u32, u32)>>,
}

impl B<'_> {
    fn name(&mut self, f: impl FnOnce() -> String) -> u32 {
        if !self.names {
            return 0;
        }
        std::sync::Arc::make_mut(&mut self.prog.names).push(f());
        (self.prog.names.len() - 1) as u32
    }

    fn buffer(&mut self, bytes: u64, category: Category, f: impl FnOnce() -> String) -> u32 {
        let name = self.name(f);
        std::sync::Arc::make_mut(&mut self.prog.buffers).push(BufferSpec {
            bytes,
            category,
            name,
            pool: crate::engine::TASK_STREAM,
        });
        (self.prog.buffers.len() - 1) as u32
    }

    #[allow(clippy::too_many_arguments)]
    fn task(
        &mut self,
        stream: u16,
        seconds: f64,
        deps: Vec<u32>,
        alloc: Vec<u32>,
        free: Vec<u32>,
        (step, phase, kind): (u32, Phase, TaskKind),
        region: Option<Region>,
        what: impl FnOnce() -> String,
    ) -> u32 {
        let what = if self.names { what() } else { String::new() };
        let mut label = TaskLabel::new(step, phase, 0, what, kind, None);
        label.region = region;
        self.labels.push(label);
        let task = Task { stream, ctas: 0, duration_ns: ns(seconds), label: (self.labels.len() - 1) as u32 };
        self.prog.push_task(task, &deps, &alloc, &free)
    }

    /// KV bytes of `tokens` tokens of the whole batch in one layer, keys or values.
    fn kv_layer_bytes(&self, tokens: u64) -> u64 {
        let per_token_all_layers = self.traffic.kv_bytes_per_token;
        self.cfg.batch * tokens * per_token_all_layers / (2 * self.dag.config.n_layers)
    }

    /// Weights, rotary tables, the token ids and (static) the whole KV cache.
    fn init(&mut self) -> Kept {
        let dag = self.dag;
        let cfg = self.cfg;
        let c = self.c;
        self.traffic.kv_bytes_per_token = crate::model::kv_bytes_per_token(&dag.config, self.tp, cfg.kv_dtype);
        self.traffic.kv_bytes_final = cfg.batch * cfg.context() * self.traffic.kv_bytes_per_token;
        let init = (0, Phase::Init, TaskKind::Init);
        for op in &dag.ops {
            let bytes = weight_bytes(op, cfg.weights, c);
            if bytes == 0 {
                continue;
            }
            self.traffic.weight_bytes += bytes;
            self.traffic.weight_bytes_half += op.params * c;
            let fmt = if op.kind == OpKind::Linear && matches!(op.region, Region::Block(_)) {
                cfg.weights_name()
            } else {
                cfg.compute_dtype.name().to_string()
            };
            let buf = self.buffer(bytes, Category::Parameters, || format!("{} weight ({fmt})", op.name));
            self.task(COMPUTE, 0.0, vec![], vec![buf], vec![], init, Some(op.region), || format!("load {}", op.name));
        }
        if dag.buffer_bytes > 0 {
            let buf = self.buffer(dag.buffer_bytes, Category::Buffers, || "rotary cos/sin tables".into());
            self.task(COMPUTE, 0.0, vec![], vec![buf], vec![], init, None, || "rotary embedding buffers".into());
        }
        let n = dag.config.n_layers as usize;
        let mut kv = vec![None; n];
        if cfg.kv_cache == KvCacheKind::Static {
            let bytes = self.kv_layer_bytes(cfg.context());
            let ctx = cfg.context();
            for (l, slot) in kv.iter_mut().enumerate() {
                let k = self.buffer(bytes, Category::KvCache, || {
                    format!("layers.{l} key cache ({} x {ctx} tokens)", cfg.batch)
                });
                let v = self.buffer(bytes, Category::KvCache, || {
                    format!("layers.{l} value cache ({} x {ctx} tokens)", cfg.batch)
                });
                self.task(COMPUTE, 0.0, vec![], vec![k, v], vec![], init, Some(Region::Block(l as u64)), || {
                    format!("StaticCache: allocate layers.{l}")
                });
                *slot = Some((k, v));
            }
        }
        // generate() keeps the ids (and appends each new token) to the end.
        let tokens = self.buffer(cfg.batch * cfg.prompt_len * 8, Category::Inputs, || "input_ids (int64)".into());
        self.task(COMPUTE, 0.0, vec![], vec![tokens], vec![], init, None, || "input_ids to device".into());
        Kept { kv }
    }

    /// A kernel's time: its matmuls (`lin_s`, each GEMM by its shape) and attention FLOPs
    /// against the HBM traffic of `bytes`, whichever is longer.
    fn roofline(&self, lin_s: f64, att_flops: f64, bytes: f64) -> f64 {
        let c = &self.cost;
        let att = att_flops / (c.peak_flops * c.eff(OpKind::AttentionCore));
        (lin_s + att).max(bytes / (c.hbm * HBM_EFFICIENCY))
    }

    /// A matmul of `flops` with output [m, n] and inner dimension k, each GEMM kernel by its
    /// shape as in training; at the steady rate where the op has no GEMM shape or fewer rows
    /// than the measured shapes ([`GEMM_TABLE_MIN_DIM`]: a decode pass's weight-streaming
    /// kernels, bound by their HBM traffic).
    fn gemm_s(&self, gemm: Option<[u64; 3]>, flops: f64) -> f64 {
        let c = &self.cost;
        match gemm {
            Some(g) if g[0] >= GEMM_TABLE_MIN_DIM => c.gemm_s(g, flops),
            _ => flops / (c.peak_flops * c.eff(OpKind::Linear)),
        }
    }

    fn tp_s(&self, op: Collective, bytes: u64) -> f64 {
        self.cost.collective_s(&self.cost.tp_group, op, bytes)
    }

    /// The prompt's forward pass; returns the task that samples the first token and, for a
    /// dynamic cache, each layer's keys and values it keeps.
    fn prefill(&mut self) -> (u32, Vec<Option<(u32, u32)>>) {
        let dag = self.dag;
        let cfg = self.cfg;
        let c = self.c;
        let step = (1, Phase::Prefill, TaskKind::Forward);
        // Ops that run: no loss, no FP32 copy of all positions' logits; the head runs apart.
        let head = dag.ops.iter().position(|o| o.region == Region::Head && o.kind == OpKind::Linear);
        let runs = |i: usize, o: &Op| !matches!(o.kind, OpKind::Loss | OpKind::Cast) && Some(i) != head;
        let mut last_use = vec![None; dag.tensors.len()];
        for (i, op) in dag.ops.iter().enumerate() {
            if runs(i, op) || Some(i) == head {
                for &t in &op.inputs {
                    last_use[t] = Some(i);
                }
            }
        }
        // Frees owed at the end of each op; an op without a compute task of its own hands
        // them to the next one that has.
        let mut frees: Vec<Vec<u32>> = vec![Vec::new(); dag.ops.len()];
        let mut owed: Vec<u32> = Vec::new();
        let mut wait: Vec<u32> = Vec::new();
        let mut last_compute = None;
        let mut kv = vec![None; dag.config.n_layers as usize];
        let mut workspace = cfg.blas_workspace > 0;
        for (i, op) in dag.ops.iter().enumerate() {
            if !runs(i, op) || op.kind == OpKind::TpComm {
                owed.append(&mut frees[i]);
                if let Some((coll, comm)) = op.comm.and_then(|m| m.forward.map(|f| (f, m))).filter(|_| runs(i, op)) {
                    let dur = self.tp_s(coll, comm.bytes);
                    let deps = last_compute.into_iter().collect();
                    let label = (1, Phase::Prefill, TaskKind::AllReduce);
                    let t = self.task(TP, dur, deps, vec![], vec![], label, Some(op.region), || op.name.clone());
                    wait.push(t);
                }
                continue;
            }
            let mut alloc = Vec::new();
            if workspace && op.kind == OpKind::Linear {
                // The first matmul allocates the thread's cuBLAS workspace, kept for good.
                workspace = false;
                alloc.push(self.buffer(cfg.blas_workspace, Category::BlasWorkspaces, || "cuBLAS workspace".into()));
            }
            let mut free = std::mem::take(&mut owed);
            for &t in &op.outputs {
                let tensor = &dag.tensors[t];
                if tensor.kind == TensorKind::Stats || tensor.bytes == 0 {
                    continue;
                }
                let b = self.buffer(tensor.bytes, Category::Transient, || tensor.name.clone());
                alloc.push(b);
                match last_use[t] {
                    Some(u) if u > i => frees[u].push(b),
                    _ => free.push(b),
                }
            }
            if op.fwd_scratch > 0 {
                let b = self.buffer(op.fwd_scratch, Category::Transient, || format!("{} scratch", op.name));
                alloc.push(b);
                free.push(b);
            }
            let mut bytes = op.fwd_bytes + (weight_bytes(op, cfg.weights, c) + op.shared_params * c) as f64;
            if let (WeightFormat::Nf4 { .. }, OpKind::Linear, Region::Block(_), Some([_, n, k])) =
                (cfg.weights, op.kind, op.region, op.gemm)
            {
                // bitsandbytes dequantizes the whole weight for a multi-row input.
                let b = self.buffer(n * k * c, Category::Transient, || format!("{} dequantized weight", op.name));
                alloc.push(b);
                free.push(b);
                bytes += (2 * n * k * c) as f64;
            }
            let (mut lin, mut att) = (0.0, 0.0);
            match op.kind {
                OpKind::Linear => lin = op.fwd_flops,
                OpKind::AttentionCore => {
                    att = op.fwd_flops / 2.0;
                    if let (KvCacheKind::Dynamic, Region::Block(l)) = (cfg.kv_cache, op.region) {
                        let layer = self.kv_layer_bytes(cfg.prompt_len);
                        let k = self.buffer(layer, Category::KvCache, || format!("layers.{l} keys (DynamicCache)"));
                        let v = self.buffer(layer, Category::KvCache, || format!("layers.{l} values (DynamicCache)"));
                        alloc.extend([k, v]);
                        kv[l as usize] = Some((k, v));
                    }
                }
                _ => {}
            }
            let dur = OP_OVERHEAD_S + self.roofline(self.gemm_s(op.gemm, lin), att, bytes);
            self.traffic.prefill_flops += lin + att;
            free.append(&mut frees[i]);
            let deps = std::mem::take(&mut wait);
            let t = self.task(COMPUTE, dur, deps, alloc, free, step, Some(op.region), || op.name.clone());
            last_compute = Some(t);
        }
        let mut extra = std::mem::take(&mut owed);
        if let Some(h) = head {
            extra.append(&mut frees[h]);
        }
        let head = head.map(|h| &dag.ops[h]);
        let sample = self.head_and_sample(head, Phase::Prefill, std::mem::take(&mut wait), 0.0, extra);
        (sample, kv)
    }

    /// The final norm's output at the last positions through the LM head, the logits'
    /// all-gather under TP, their FP32 copy and sampling; `extra_bytes` (the final norm in
    /// decode) join the head's traffic, `free` is freed when the head has run. Returns the
    /// sampling task.
    fn head_and_sample(
        &mut self,
        head: Option<&Op>,
        phase: Phase,
        deps: Vec<u32>,
        extra_bytes: f64,
        free: Vec<u32>,
    ) -> u32 {
        let cfg = self.cfg;
        let c = self.c;
        let v = self.dag.config.vocab;
        let vt = v / self.tp;
        let h = self.dag.config.hidden;
        let bsz = cfg.batch;
        let (weight, flops, gemm, name) = match head {
            Some(op) => {
                let per_row = op.fwd_flops / self.dag.tokens() as f64;
                let gemm = op.gemm.map(|[_, n, k]| [bsz, n, k]);
                ((op.params + op.shared_params) * c, per_row * bsz as f64, gemm, op.name.clone())
            }
            None => (vt * h * c, 2.0 * (bsz * h * vt) as f64, Some([bsz, vt, h]), "output".to_string()),
        };
        let logits = self.buffer(bsz * vt * c, Category::Transient, || format!("{name}.logits (last position)"));
        let bytes = extra_bytes + weight as f64 + (bsz * (h + vt) * c) as f64;
        let per_kernel = self.per_kernel();
        let dur = self.roofline(self.gemm_s(gemm, flops), 0.0, bytes) + per_kernel;
        if phase == Phase::Decode {
            self.traffic.decode_flops += flops;
            self.traffic.decode_bytes += bytes;
            self.traffic.decode_kernels += 1;
        } else {
            self.traffic.prefill_flops += flops;
        }
        let label = (1, phase, TaskKind::Forward);
        let t = self.task(COMPUTE, dur, deps, vec![logits], free, label, Some(Region::Head), || {
            format!("{name} (last position)")
        });
        let mut deps = vec![t];
        let mut free = vec![logits];
        if self.tp > 1 {
            let gathered = self.buffer(bsz * v * c, Category::CommBuffers, || "logits all-gathered".into());
            let dur = self.tp_s(Collective::AllGather, bsz * v * c);
            let label = (1, phase, TaskKind::AllGather);
            let g = self.task(TP, dur, vec![t], vec![gathered], vec![], label, Some(Region::Head), || {
                "all-gather logits".into()
            });
            deps = vec![g];
            free.push(gathered);
        }
        let f32 = self.buffer(bsz * v * 4, Category::Transient, || "logits.float() for sampling".into());
        free.push(f32);
        let sbytes = (bsz * v * (c + 2 * 4)) as f64;
        let dur = sbytes / (self.cost.hbm * HBM_EFFICIENCY) + per_kernel;
        if phase == Phase::Decode {
            self.traffic.decode_bytes += sbytes;
            self.traffic.decode_kernels += 1;
        }
        self.task(COMPUTE, dur, deps, vec![f32], free, label, Some(Region::Head), || "sample next token".into())
    }

    fn per_kernel(&self) -> f64 {
        if self.cfg.cuda_graphs {
            GRAPH_KERNEL_S
        } else {
            OP_OVERHEAD_S
        }
    }

    /// Block 0's two halves at one token per sequence (every block is the same).
    fn halves(&self) -> [Half; 2] {
        let dag = self.dag;
        let c = self.c;
        let rows = dag.tokens() as f64;
        let block: Vec<&Op> = dag.ops.iter().filter(|o| o.region == Region::Block(0)).collect();
        let split = block.iter().position(|o| o.name.ends_with("residual1")).map_or(block.len(), |i| i + 1);
        let mut out = [Half { name: "attention", ..Default::default() }, Half { name: "mlp", ..Default::default() }];
        for (j, op) in block.iter().enumerate() {
            let h = &mut out[usize::from(j >= split)];
            if op.kind == OpKind::TpComm {
                if op.comm.and_then(|m| m.forward).is_some() {
                    h.comm_bytes = op.comm.map_or(0, |m| m.bytes) / dag.tokens().max(1);
                }
                continue;
            }
            let fused = matches!(op.kind, OpKind::Elementwise | OpKind::Rope | OpKind::Dropout | OpKind::Cast);
            if !self.cfg.cuda_graphs || !fused {
                h.kernels += 1;
            }
            h.act_bytes += op.fwd_bytes / rows;
            h.live_bytes += op.outputs.iter().map(|&t| dag.tensors[t].bytes).sum::<u64>() / dag.tokens().max(1);
            if op.kind == OpKind::AttentionCore {
                h.has_attention = true;
            }
            h.weight_bytes += weight_bytes(op, self.cfg.weights, c);
            if op.kind == OpKind::Linear {
                h.lin_flops += op.fwd_flops / rows;
                let bsz = self.cfg.batch;
                h.lin_s += self.gemm_s(op.gemm.map(|[_, n, k]| [bsz, n, k]), op.fwd_flops / rows * bsz as f64);
                if let Some([_, n, k]) = op.gemm {
                    h.largest_linear = h.largest_linear.max(n * k);
                    h.linear_elems += n * k;
                }
            }
        }
        out
    }

    /// Decode passes 1 ..= gen_len - 1, each attending to prompt_len + j tokens.
    fn decode(&mut self, keep: &Kept, after: u32) {
        let dag = self.dag;
        let cfg = self.cfg;
        let c = self.c;
        let bsz = cfg.batch;
        let n = dag.config.n_layers;
        let h = dag.config.hidden;
        let halves = self.halves();
        let embed = dag.ops.iter().find(|o| o.region == Region::Embed && o.kind == OpKind::Embedding);
        let embed_comm = dag.ops.iter().any(|o| o.region == Region::Embed && o.comm.and_then(|m| m.forward).is_some());
        let head = dag.ops.iter().find(|o| o.region == Region::Head && o.kind == OpKind::Linear);
        let norm_bytes = (bsz * h * c * 2) as f64;
        let nf4_multi_row = matches!(cfg.weights, WeightFormat::Nf4 { .. }) && bsz > 1;
        let mut kv: Vec<Option<(u32, u32)>> = keep.kv.clone();
        let mut prev = after;
        let per_kernel = self.per_kernel();
        for j in 1..cfg.gen_len {
            if self.probe && cfg.kv_cache == KvCacheKind::Static && j > 1 && j + 1 < cfg.gen_len {
                continue;
            }
            let ctx = cfg.prompt_len + j;
            let step = (1, Phase::Decode, TaskKind::Forward);
            self.traffic.decode_steps += 1;
            // Embedding lookup of the sampled tokens.
            let ebytes = (bsz * h * c) as f64 * 2.0;
            let x = self.buffer(bsz * h * c, Category::Transient, || format!("decode {j}: hidden state"));
            let dur = ebytes / (self.cost.hbm * HBM_EFFICIENCY) + per_kernel;
            self.traffic.decode_bytes += ebytes;
            self.traffic.decode_kernels += 1;
            let ename = embed.map_or("tok_embeddings".to_string(), |o| o.name.clone());
            let mut last = self.task(COMPUTE, dur, vec![prev], vec![x], vec![], step, Some(Region::Embed), || {
                format!("decode {j}: {ename}")
            });
            if self.tp > 1 && embed_comm {
                let dur = self.tp_s(Collective::AllReduce, bsz * h * c);
                last = self.task(
                    TP,
                    dur,
                    vec![last],
                    vec![],
                    vec![],
                    (1, Phase::Decode, TaskKind::AllReduce),
                    Some(Region::Embed),
                    || format!("decode {j}: tok_embeddings.tp_all_reduce"),
                );
            }
            for l in 0..n {
                for half in &halves {
                    let mut alloc = Vec::new();
                    let mut free = Vec::new();
                    let act = self.buffer(half.live_bytes * bsz, Category::Transient, || {
                        format!("decode {j}: layers.{l}.{} activations", half.name)
                    });
                    alloc.push(act);
                    free.push(act);
                    let mut bytes = half.weight_bytes as f64 + half.act_bytes * bsz as f64;
                    let mut att = 0.0;
                    let mut kernels = half.kernels;
                    if half.has_attention {
                        // A static cache is handed to attention whole (masked), as HF
                        // StaticCache and gpt-fast do: every step reads all of it.
                        let read = if cfg.kv_cache == KvCacheKind::Static { cfg.context() } else { ctx };
                        let layer = self.kv_layer_bytes(ctx);
                        bytes += 2.0 * self.kv_layer_bytes(read) as f64 - 2.0 * layer as f64;
                        bytes += 2.0 * layer as f64;
                        att = 4.0 * (bsz * read * h / self.tp) as f64;
                        if cfg.kv_cache == KvCacheKind::Dynamic {
                            // torch.cat: the longer keys and values, then the shorter ones go.
                            let (ok, ov) = kv[l as usize].unwrap_or((0, 0));
                            let nk =
                                self.buffer(layer, Category::KvCache, || format!("layers.{l} keys ({ctx} tokens)"));
                            let nv =
                                self.buffer(layer, Category::KvCache, || format!("layers.{l} values ({ctx} tokens)"));
                            alloc.push(nk);
                            alloc.push(nv);
                            free.push(ok);
                            free.push(ov);
                            kv[l as usize] = Some((nk, nv));
                            bytes += 2.0 * (2 * layer) as f64;
                            kernels += 2;
                        }
                    }
                    if nf4_multi_row {
                        let b = self.buffer(half.largest_linear * c, Category::Transient, || {
                            format!("decode {j}: layers.{l}.{} dequantized weight", half.name)
                        });
                        alloc.push(b);
                        free.push(b);
                        bytes += 2.0 * (half.linear_elems * c) as f64;
                    }
                    let lin = half.lin_flops * bsz as f64;
                    let dur = self.roofline(half.lin_s, att, bytes) + kernels as f64 * per_kernel;
                    self.traffic.decode_bytes += bytes;
                    self.traffic.decode_flops += lin + att;
                    self.traffic.decode_kernels += kernels;
                    let name = half.name;
                    last = self.task(COMPUTE, dur, vec![last], alloc, free, step, Some(Region::Block(l)), || {
                        format!("decode {j}: layers.{l}.{name}")
                    });
                    if self.tp > 1 && half.comm_bytes > 0 {
                        let dur = self.tp_s(Collective::AllReduce, half.comm_bytes * bsz);
                        last = self.task(
                            TP,
                            dur,
                            vec![last],
                            vec![],
                            vec![],
                            (1, Phase::Decode, TaskKind::AllReduce),
                            Some(Region::Block(l)),
                            || format!("decode {j}: layers.{l}.{name}.tp_all_reduce"),
                        );
                    }
                }
            }
            // Final norm, then the head on the new token; the hidden state lives until then.
            prev = self.head_and_sample(head, Phase::Decode, vec![last], norm_bytes, vec![x]);
        }
    }
}
