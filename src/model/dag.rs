//! The layer DAG: a transformer as the ops that matter for memory, each knowing its
//! parameters, its FLOPs, the tensors it writes and the tensors autograd saves for backward.
//!
//! Saved tensors follow what PyTorch's autograd keeps for each op (and what Korthikanti et
//! al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Sec. 4.1 count):
//! a linear layer saves its input; a norm saves its input and FP32 per-row statistics; an
//! element-wise activation saves its input; a product saves both factors; a residual add
//! saves nothing; the attention core saves q, k, v and its output (plus, for math attention,
//! the s x s softmax output, and with dropout the mask and dropped probabilities; for flash
//! attention the FP32 log-sum-exp instead). Views (split, transpose, reshape of contiguous
//! data) allocate nothing and share their base's storage.

use petgraph::graph::{DiGraph, NodeIndex};
use serde::Serialize;

use super::config::{Attention, Dtype, Family, ModelConfig, Workload};

/// Index of a tensor in [`LayerDag::tensors`].
pub type TensorId = usize;
/// Index of an op in [`LayerDag::ops`] (also its topological position).
pub type OpId = usize;

/// What a tensor is, for categorising memory and for selective recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// An activation flowing between ops (gets a gradient).
    Activation,
    /// Small per-row FP32 statistics a kernel keeps for its backward (norm rstd, flash LSE).
    Stats,
    /// A dropout mask, one byte per element.
    Mask,
    /// The s x s attention probabilities of math attention (what selective recompute drops).
    AttentionScores,
    /// Integer token ids or targets (no gradient).
    Index,
}

/// A tensor storage the graph allocates.
#[derive(Debug, Clone, Serialize)]
pub struct Tensor {
    pub name: String,
    pub bytes: u64,
    pub kind: TensorKind,
    pub producer: Option<OpId>,
}

/// Which FSDP unit / checkpoint region an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Region {
    /// Embeddings (root unit, forward side).
    Embed,
    /// Transformer block `i`.
    Block(u64),
    /// Final norm, LM head and loss (root unit, head side).
    Head,
}

/// The coarse op type, which decides its cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Embedding,
    Norm,
    Linear,
    Rope,
    AttentionCore,
    Elementwise,
    Dropout,
    Cast,
    Loss,
}

/// One op of the forward pass.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    /// PyTorch-style qualified name, e.g. `layers.12.attention.wq`.
    pub name: String,
    pub kind: OpKind,
    pub region: Region,
    /// Parameter elements this op owns.
    pub params: u64,
    /// Parameters this op reads but another op owns (a tied LM head reads the embedding).
    pub shared_params: u64,
    /// Forward FLOPs (model FLOPs: 2 per multiply-add).
    pub fwd_flops: f64,
    /// Backward FLOPs as the kernels execute them.
    pub bwd_flops: f64,
    /// Bytes the forward kernel reads and writes (for memory-bound ops).
    pub fwd_bytes: f64,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
    /// Tensors autograd keeps alive for this op's backward.
    pub saves: Vec<TensorId>,
    /// Scratch the forward kernel needs while it runs (freed when it ends).
    pub fwd_scratch: u64,
    /// For matmuls: (M, N, K) of the forward GEMM (tokens, output features, input features),
    /// which decides how well it fills the GPU.
    pub gemm: Option<[u64; 3]>,
}

/// The model as a petgraph DAG of ops (edges carry the tensor flowing between them).
#[derive(Debug, Clone)]
pub struct LayerDag {
    pub ops: Vec<Op>,
    pub tensors: Vec<Tensor>,
    pub graph: DiGraph<OpId, TensorId>,
    /// Token ids fed to the embedding, and targets read by the loss.
    pub inputs: Vec<TensorId>,
    /// Constant buffers (rotary tables), bytes.
    pub buffer_bytes: u64,
    pub config: ModelConfig,
    pub workload: Workload,
}

impl LayerDag {
    /// Parameters counted from the ops (checked against the closed form in tests).
    pub fn param_count(&self) -> u64 {
        self.ops.iter().map(|o| o.params).sum()
    }
    pub fn region_params(&self, r: Region) -> u64 {
        self.ops.iter().filter(|o| o.region == r).map(|o| o.params).sum()
    }
    /// Ops in forward (topological) order.
    pub fn ops_of(&self, r: Region) -> impl Iterator<Item = (OpId, &Op)> {
        self.ops.iter().enumerate().filter(move |(_, o)| o.region == r)
    }
    /// Bytes of tensors saved for backward by the ops of a region (each storage once),
    /// optionally leaving out per-row statistics.
    pub fn saved_bytes(&self, r: Region, include_stats: bool) -> u64 {
        let mut seen = vec![false; self.tensors.len()];
        let mut total = 0;
        for (_, op) in self.ops_of(r) {
            for &t in &op.saves {
                if !seen[t] && (include_stats || self.tensors[t].kind != TensorKind::Stats) {
                    seen[t] = true;
                    total += self.tensors[t].bytes;
                }
            }
        }
        total
    }
    /// Model FLOPs of one forward pass of one micro-batch.
    pub fn forward_flops(&self) -> f64 {
        self.ops.iter().map(|o| o.fwd_flops).sum()
    }
    pub fn tokens(&self) -> u64 {
        self.workload.micro_batch * self.workload.seq_len
    }
}

struct Builder {
    ops: Vec<Op>,
    tensors: Vec<Tensor>,
    region: Region,
}

impl Builder {
    /// A tensor written by the op about to be added (the next index).
    fn tensor(&mut self, name: &str, elems: u64, bytes_per: u64, kind: TensorKind) -> TensorId {
        self.tensors.push(Tensor {
            name: name.to_string(),
            bytes: elems * bytes_per,
            kind,
            producer: Some(self.ops.len()),
        });
        self.tensors.len() - 1
    }
    fn input(&mut self, name: &str, elems: u64) -> TensorId {
        self.tensors.push(Tensor { name: name.to_string(), bytes: elems * 8, kind: TensorKind::Index, producer: None });
        self.tensors.len() - 1
    }
    #[allow(clippy::too_many_arguments)]
    fn op(
        &mut self,
        name: String,
        kind: OpKind,
        params: u64,
        flops: (f64, f64),
        inputs: Vec<TensorId>,
        outputs: Vec<TensorId>,
        saves: Vec<TensorId>,
    ) -> OpId {
        let io_bytes: u64 = inputs.iter().chain(outputs.iter()).map(|&t| self.tensors[t].bytes).sum();
        self.ops.push(Op {
            name,
            kind,
            region: self.region,
            params,
            shared_params: 0,
            fwd_flops: flops.0,
            bwd_flops: flops.1,
            fwd_bytes: io_bytes as f64,
            inputs,
            outputs,
            saves,
            fwd_scratch: 0,
            gemm: None,
        });
        self.ops.len() - 1
    }
}

/// Builds the DAG of one micro-batch's forward pass.
pub fn build(cfg: &ModelConfig, w: &Workload) -> LayerDag {
    let (b, s, h, f, v) = (w.micro_batch, w.seq_len, cfg.hidden, cfg.ffn_hidden, cfg.vocab);
    let t = b * s;
    let c = w.compute_dtype.bytes();
    let a = cfg.n_heads;
    let kvd = cfg.kv_dim();
    let tf = t as f64;
    let lin = |i: u64, o: u64| (2.0 * tf * i as f64 * o as f64, 4.0 * tf * i as f64 * o as f64);
    let mut bd = Builder { ops: Vec::new(), tensors: Vec::new(), region: Region::Embed };
    let tokens = bd.input("tokens", t);
    let targets = bd.input("targets", t);

    // Embedding: a gather; backward scatters into the weight gradient and keeps the ids.
    let mut x = bd.tensor("tok_embeddings.out", t * h, c, TensorKind::Activation);
    bd.op("tok_embeddings".into(), OpKind::Embedding, v * h, (0.0, 0.0), vec![tokens], vec![x], vec![tokens]);
    if cfg.family == Family::Gpt {
        let y = bd.tensor("pos_embeddings.out", t * h, c, TensorKind::Activation);
        bd.op(
            "pos_embeddings".into(),
            OpKind::Embedding,
            cfg.max_seq_len * h,
            (tf * h as f64, 0.0),
            vec![x],
            vec![y],
            vec![],
        );
        x = y;
    }

    let dropout = cfg.dropout > 0.0;
    for l in 0..cfg.n_layers {
        bd.region = Region::Block(l);
        let p = |n: &str| format!("layers.{l}.{n}");
        // --- attention half
        let n1 = norm_op(&mut bd, cfg.family, &p("attention_norm"), x, t, h, c);
        let (q, k, vv);
        match cfg.family {
            Family::Llama => {
                let q0 = bd.tensor(&p("attention.wq.out"), t * h, c, TensorKind::Activation);
                bd.op(p("attention.wq"), OpKind::Linear, h * h, lin(h, h), vec![n1], vec![q0], vec![n1]);
                let k0 = bd.tensor(&p("attention.wk.out"), t * kvd, c, TensorKind::Activation);
                bd.op(p("attention.wk"), OpKind::Linear, h * kvd, lin(h, kvd), vec![n1], vec![k0], vec![n1]);
                vv = bd.tensor(&p("attention.wv.out"), t * kvd, c, TensorKind::Activation);
                bd.op(p("attention.wv"), OpKind::Linear, h * kvd, lin(h, kvd), vec![n1], vec![vv], vec![n1]);
                // Rotary: q*cos + rotate_half(q)*sin; mul by a constant buffer saves only the
                // buffer, cat saves nothing, so nothing of q or k is kept.
                q = bd.tensor(&p("attention.rope.q"), t * h, c, TensorKind::Activation);
                k = bd.tensor(&p("attention.rope.k"), t * kvd, c, TensorKind::Activation);
                let id = bd.op(
                    p("attention.rope"),
                    OpKind::Rope,
                    0,
                    (6.0 * tf * (h + kvd) as f64, 6.0 * tf * (h + kvd) as f64),
                    vec![q0, k0],
                    vec![q, k],
                    vec![],
                );
                // q*cos and rotate_half(q) live while the sum is formed.
                bd.ops[id].fwd_scratch = 2 * t * h * c;
            }
            Family::Gpt => {
                let qkv = bd.tensor(&p("attn.c_attn.out"), t * 3 * h, c, TensorKind::Activation);
                bd.op(
                    p("attn.c_attn"),
                    OpKind::Linear,
                    3 * h * h + 3 * h,
                    lin(h, 3 * h),
                    vec![n1],
                    vec![qkv],
                    vec![n1],
                );
                // q, k, v are views of the fused projection's output.
                q = qkv;
                k = qkv;
                vv = qkv;
            }
        }
        let o = bd.tensor(&p("attention.core.out"), t * h, c, TensorKind::Activation);
        let att_f = 4.0 * (b * s * s * h) as f64;
        let mut saves = vec![q];
        for x in [k, vv] {
            if !saves.contains(&x) {
                saves.push(x);
            }
        }
        let mut outs = vec![o];
        match w.attention {
            Attention::Flash => {
                let lse = bd.tensor(&p("attention.core.lse"), b * a * s, 4, TensorKind::Stats);
                outs.push(lse);
                saves.push(o);
                saves.push(lse);
            }
            Attention::Math => {
                let probs = bd.tensor(&p("attention.core.softmax"), b * a * s * s, c, TensorKind::AttentionScores);
                outs.push(probs);
                saves.push(probs);
                if dropout {
                    let mask =
                        bd.tensor(&p("attention.core.dropout_mask"), b * a * s * s, 1, TensorKind::AttentionScores);
                    let dp = bd.tensor(&p("attention.core.dropout_out"), b * a * s * s, c, TensorKind::AttentionScores);
                    outs.push(mask);
                    outs.push(dp);
                    saves.push(mask);
                    saves.push(dp);
                }
            }
        }
        let inputs = saves.iter().copied().filter(|&x| x == q || x == k || x == vv).collect();
        // Flash backward recomputes the scores: 2.5x the forward's matmul work.
        let bwd_f = match w.attention {
            Attention::Flash => 2.5 * att_f,
            Attention::Math => 2.0 * att_f,
        };
        let core = bd.op(p("attention.core"), OpKind::AttentionCore, 0, (att_f, bwd_f), inputs, outs, saves);
        if w.attention == Attention::Math {
            // The raw scores exist while softmax runs.
            bd.ops[core].fwd_scratch = b * a * s * s * c;
        }
        let ao = bd.tensor(&p("attention.wo.out"), t * h, c, TensorKind::Activation);
        let wo_params = if cfg.family == Family::Gpt { h * h + h } else { h * h };
        bd.op(p("attention.wo"), OpKind::Linear, wo_params, lin(h, h), vec![o], vec![ao], vec![o]);
        let ao = if dropout { dropout_op(&mut bd, &p("attention.dropout"), ao, t * h, c) } else { ao };
        let h1 = bd.tensor(&p("residual1.out"), t * h, c, TensorKind::Activation);
        bd.op(p("residual1"), OpKind::Elementwise, 0, (tf * h as f64, 0.0), vec![x, ao], vec![h1], vec![]);

        // --- MLP half
        let n2 = norm_op(&mut bd, cfg.family, &p("ffn_norm"), h1, t, h, c);
        let mlp_out = match cfg.family {
            Family::Llama => {
                let g = bd.tensor(&p("feed_forward.w1.out"), t * f, c, TensorKind::Activation);
                bd.op(p("feed_forward.w1"), OpKind::Linear, h * f, lin(h, f), vec![n2], vec![g], vec![n2]);
                let u = bd.tensor(&p("feed_forward.w3.out"), t * f, c, TensorKind::Activation);
                bd.op(p("feed_forward.w3"), OpKind::Linear, h * f, lin(h, f), vec![n2], vec![u], vec![n2]);
                let sg = bd.tensor(&p("feed_forward.silu.out"), t * f, c, TensorKind::Activation);
                bd.op(
                    p("feed_forward.silu"),
                    OpKind::Elementwise,
                    0,
                    (4.0 * tf * f as f64, 8.0 * tf * f as f64),
                    vec![g],
                    vec![sg],
                    vec![g],
                );
                let m = bd.tensor(&p("feed_forward.mul.out"), t * f, c, TensorKind::Activation);
                bd.op(
                    p("feed_forward.mul"),
                    OpKind::Elementwise,
                    0,
                    (tf * f as f64, 2.0 * tf * f as f64),
                    vec![sg, u],
                    vec![m],
                    vec![sg, u],
                );
                let d = bd.tensor(&p("feed_forward.w2.out"), t * h, c, TensorKind::Activation);
                bd.op(p("feed_forward.w2"), OpKind::Linear, f * h, lin(f, h), vec![m], vec![d], vec![m]);
                d
            }
            Family::Gpt => {
                let g = bd.tensor(&p("mlp.c_fc.out"), t * f, c, TensorKind::Activation);
                bd.op(p("mlp.c_fc"), OpKind::Linear, h * f + f, lin(h, f), vec![n2], vec![g], vec![n2]);
                let ge = bd.tensor(&p("mlp.gelu.out"), t * f, c, TensorKind::Activation);
                bd.op(
                    p("mlp.gelu"),
                    OpKind::Elementwise,
                    0,
                    (8.0 * tf * f as f64, 16.0 * tf * f as f64),
                    vec![g],
                    vec![ge],
                    vec![g],
                );
                let d = bd.tensor(&p("mlp.c_proj.out"), t * h, c, TensorKind::Activation);
                bd.op(p("mlp.c_proj"), OpKind::Linear, f * h + h, lin(f, h), vec![ge], vec![d], vec![ge]);
                d
            }
        };
        let mlp_out = if dropout { dropout_op(&mut bd, &p("mlp.dropout"), mlp_out, t * h, c) } else { mlp_out };
        let y = bd.tensor(&p("residual2.out"), t * h, c, TensorKind::Activation);
        bd.op(p("residual2"), OpKind::Elementwise, 0, (tf * h as f64, 0.0), vec![h1, mlp_out], vec![y], vec![]);
        x = y;
    }

    // --- head
    bd.region = Region::Head;
    let nf = norm_op(&mut bd, cfg.family, "norm", x, t, h, c);
    let logits = bd.tensor("output.logits", t * v, c, TensorKind::Activation);
    let head_params = if cfg.tie_embeddings { 0 } else { v * h };
    let id = bd.op("output".into(), OpKind::Linear, head_params, lin(h, v), vec![nf], vec![logits], vec![nf]);
    if cfg.tie_embeddings {
        bd.ops[id].shared_params = v * h;
    }
    let mut logits = logits;
    let loss_dtype = if w.logits_fp32 { Dtype::Fp32 } else { w.compute_dtype };
    if loss_dtype != w.compute_dtype {
        // logits.float(): a copy; its backward saves nothing.
        let l32 = bd.tensor("output.logits.float", t * v, 4, TensorKind::Activation);
        bd.op("logits.float".into(), OpKind::Cast, 0, (0.0, 0.0), vec![logits], vec![l32], vec![]);
        logits = l32;
    }
    // cross_entropy = log_softmax (saves its output) + nll_loss (saves the targets).
    let lb = loss_dtype.bytes();
    let lsm = bd.tensor("loss.log_softmax", t * v, lb, TensorKind::Activation);
    bd.op(
        "loss.log_softmax".into(),
        OpKind::Loss,
        0,
        (5.0 * tf * v as f64, 5.0 * tf * v as f64),
        vec![logits],
        vec![lsm],
        vec![lsm],
    );
    let loss = bd.tensor("loss", 1, 4, TensorKind::Activation);
    bd.op("loss.nll".into(), OpKind::Loss, 0, (tf, tf), vec![lsm, targets], vec![loss], vec![targets]);

    let buffer_bytes = match cfg.family {
        // cos and sin tables, FP32, max_seq_len x head_dim each.
        Family::Llama => 2 * cfg.max_seq_len * cfg.head_dim() * 4,
        Family::Gpt => 0,
    };
    // GEMM shapes of the linear layers, from their input and output tensors.
    let cb = w.compute_dtype.bytes();
    for op in bd.ops.iter_mut().filter(|o| o.kind == OpKind::Linear) {
        let k = bd.tensors[op.inputs[0]].bytes / (t * cb);
        let n = bd.tensors[op.outputs[0]].bytes / (t * cb);
        op.gemm = Some([t, n, k]);
    }
    let mut graph = DiGraph::new();
    let nodes: Vec<NodeIndex> = (0..bd.ops.len()).map(|i| graph.add_node(i)).collect();
    for (i, op) in bd.ops.iter().enumerate() {
        for &t in &op.inputs {
            if let Some(p) = bd.tensors[t].producer {
                if p != i {
                    graph.add_edge(nodes[p], nodes[i], t);
                }
            }
        }
    }
    LayerDag {
        ops: bd.ops,
        tensors: bd.tensors,
        graph,
        inputs: vec![tokens, targets],
        buffer_bytes,
        config: cfg.clone(),
        workload: w.clone(),
    }
}

/// A LayerNorm (GPT: weight + bias, FP32 mean and rstd per row) or RMSNorm (Llama: weight,
/// FP32 rstd per row) over `t` rows of `h`: saves its input and the statistics; returns the
/// output tensor.
fn norm_op(bd: &mut Builder, family: Family, name: &str, x: TensorId, t: u64, h: u64, c: u64) -> TensorId {
    let (params, stats_per_row) = match family {
        Family::Llama => (h, 4),
        Family::Gpt => (2 * h, 8),
    };
    let out = bd.tensor(&format!("{name}.out"), t * h, c, TensorKind::Activation);
    let stats = bd.tensor(&format!("{name}.stats"), t, stats_per_row, TensorKind::Stats);
    let tf = t as f64;
    bd.op(
        name.to_string(),
        OpKind::Norm,
        params,
        (5.0 * tf * h as f64, 8.0 * tf * h as f64),
        vec![x],
        vec![out, stats],
        vec![x, stats],
    );
    out
}

fn dropout_op(bd: &mut Builder, name: &str, x: TensorId, elems: u64, c: u64) -> TensorId {
    let out = bd.tensor(&format!("{name}.out"), elems, c, TensorKind::Activation);
    let mask = bd.tensor(&format!("{name}.mask"), elems, 1, TensorKind::Mask);
    bd.op(name.to_string(), OpKind::Dropout, 0, (elems as f64, elems as f64), vec![x], vec![out, mask], vec![mask]);
    out
}
