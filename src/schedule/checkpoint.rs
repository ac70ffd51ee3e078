//! What survives the forward pass under each activation-checkpointing policy, decided once
//! per program: which saved tensors are kept and which recomputed, which blocks are
//! checkpoint regions, and which ops each region reruns in backward.
//!
//! - `full` (PyTorch `checkpoint_wrapper`, Megatron `--recompute-granularity full`): a
//!   checkpointed block keeps only what it reads from outside (its input); everything it
//!   saved is recomputed by rerunning the block's forward up to its last such tensor.
//!   Which blocks: all, every n-th (torchtitan), or the first n of each model chunk
//!   (Megatron `--recompute-method block`), see [`crate::plan::CheckpointBlocks`].
//! - `selective` (Megatron `--recompute-granularity selective`): by default only the
//!   attention core's s x s scores are recomputed; `--recompute-modules` adds modules, as
//!   Megatron-Core's TransformerConfig documents them: output-discarding ones
//!   (`layernorm`: the two block norms' outputs; `moe_act`: the routed experts' activation;
//!   `mla_up_proj`: MLA's up projections and RoPE) drop those outputs, checkpointed ones
//!   (`mlp`, `moe`, `shared_experts`) drop what the module saves of its own tensors; backward
//!   reruns the ops that write them, as for the per-op policy.
//! - `selective-op` (torchtitan's per-op policy, `_apply_op_sac` in
//!   torchtitan/distributed/activation_checkpoint.py): every block is a region whose policy
//!   saves the outputs of the attention kernel, of every other `aten.mm` (the first of each
//!   block saved; the counter is per region, as torchtitan's `mm_count_key` is per forward
//!   or recompute) and of the forward reduce-scatters; the rest of what the block saved is
//!   recomputed, and backward reruns only the ops that write it (and, transitively, what
//!   they read that was not saved).

use crate::model::{KernelStack, LayerDag, OpKind, Region, TensorKind};
use crate::net::Collective;
use crate::plan::{CheckpointBlocks, Checkpointing, Plan, RecomputeModule};

/// Per-tensor facts that do not change between micro-batches.
#[derive(Clone, Copy)]
pub struct TensorPlan {
    /// Kept after forward for backward (not dropped by checkpointing).
    pub kept: bool,
    /// Op whose backward ends the saved tensor's life (smallest saver index).
    pub last_saver: Option<usize>,
    /// Last forward consumer (largest consumer index).
    pub last_consumer: Option<usize>,
    /// Gets a gradient (a floating-point activation produced by an op).
    pub needs_grad: bool,
    /// Recomputed in backward.
    pub recomputed: bool,
}

/// The checkpointing decisions for one program.
pub struct Checkpoints {
    /// Per tensor of the DAG.
    pub tensors: Vec<TensorPlan>,
    /// Per block: the ops (forward order) rerun before its backward (full and per-op).
    pub recompute_ops: Vec<Vec<usize>>,
    /// Per block: a checkpoint region of a full or per-op policy.
    pub checkpointed: Vec<bool>,
}

impl Checkpoints {
    /// Bytes each block keeps from forward to backward: every kept tensor whose first saver
    /// (or, for a per-op policy's saved output nothing saves, whose producer) is in it.
    pub fn kept_block_bytes(&self, dag: &LayerDag) -> Vec<u64> {
        let mut out = vec![0; dag.blocks() as usize];
        for (t, tp) in self.tensors.iter().enumerate() {
            if !tp.kept {
                continue;
            }
            if let Some(Region::Block(l)) = tp.last_saver.or(dag.tensors[t].producer).map(|o| dag.ops[o].region) {
                out[l as usize] += dag.tensors[t].bytes;
            }
        }
        out
    }
}

/// What [`plan`] reads of a plan: configurations that agree on it (a sweep's, differing in
/// GPUs, sharding or micro-batches per step) share the answer for one DAG.
#[derive(Clone, PartialEq)]
struct Key {
    dag: u64,
    checkpointing: Checkpointing,
    modules: Vec<RecomputeModule>,
    blocks: CheckpointBlocks,
    chunk_layers: Vec<u64>,
}

/// The answers last computed on this thread, most recent last: room for every DAG a sweep
/// keeps (32, in `sweep::summary`) under two policies.
const CACHED: usize = 64;

thread_local! {
    static ANSWERS: std::cell::RefCell<Vec<(Key, std::sync::Arc<Checkpoints>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decides, for `plan`'s checkpointing policy, what each tensor of `dag` does between
/// forward and backward. Computed once per DAG and policy on a thread: the pass over every
/// op and tensor was a twentieth of a 100B capacity sweep, recomputed for each GPU count.
pub fn plan(dag: &LayerDag, plan: &Plan) -> std::sync::Arc<Checkpoints> {
    let key = Key {
        dag: dag.id,
        checkpointing: plan.training.checkpointing,
        modules: plan.training.recompute_modules.clone(),
        blocks: plan.training.checkpoint_blocks,
        chunk_layers: match plan.training.checkpoint_blocks {
            CheckpointBlocks::FirstPerChunk(_) => {
                plan.parallel.model_parallel.virtual_stage_layers(dag.config.n_layers)
            }
            _ => Vec::new(),
        },
    };
    ANSWERS.with(|c| {
        let make = || (key.clone(), std::sync::Arc::new(decide(dag, plan)));
        crate::recent::recall(&mut c.borrow_mut(), CACHED, |k| *k == key, make)
    })
}

/// [`plan`] itself.
fn decide(dag: &LayerDag, plan: &Plan) -> Checkpoints {
    let ck = plan.training.checkpointing;
    let mut tensors: Vec<TensorPlan> = (0..dag.tensors.len())
        .map(|t| TensorPlan {
            kept: false,
            last_saver: None,
            last_consumer: None,
            needs_grad: dag.tensors[t].kind == TensorKind::Activation && dag.tensors[t].producer.is_some(),
            recomputed: false,
        })
        .collect();
    for (i, op) in dag.ops.iter().enumerate() {
        for &t in &op.inputs {
            let tp = &mut tensors[t];
            tp.last_consumer = Some(tp.last_consumer.map_or(i, |c| c.max(i)));
        }
        for &t in &op.saves {
            let tp = &mut tensors[t];
            tp.last_saver = Some(tp.last_saver.map_or(i, |c| c.min(i)));
        }
    }
    let region_blocks = checkpointed_blocks(dag, plan);
    let sac_saved = if ck == Checkpointing::SelectiveOp { sac_saved_ops(dag) } else { Vec::new() };
    let moe = moe_blocks(dag);
    // Which saved tensors survive the forward pass.
    for op in &dag.ops {
        for &t in &op.saves {
            let producer = dag.tensors[t].producer;
            let internal = matches!(op.region, Region::Block(l) if region_blocks[l as usize])
                && producer.map(|p| dag.ops[p].region) == Some(op.region);
            let dropped = match ck {
                Checkpointing::None => false,
                Checkpointing::Full => internal,
                Checkpointing::Selective => selective_drop(dag, &plan.training.recompute_modules, &moe, t, op),
                Checkpointing::SelectiveOp => internal && !producer.is_some_and(|p| sac_saved[p]),
            };
            if dropped {
                tensors[t].recomputed = true;
            } else {
                tensors[t].kept = true;
            }
        }
    }
    // Megatron's `moe_act` reruns the experts' activation from inputs its
    // `CheckpointWithoutOutput` saves: the 16-bit FC1 output even where the activation itself
    // would have saved an FP8 copy (`--activation-func-fp8-input-store`), which is then made
    // again by the rerun.
    if ck == Checkpointing::Selective && plan.training.recompute_modules.contains(&RecomputeModule::MoeAct) {
        for (i, op) in dag.ops.iter().enumerate() {
            if !(experts_activation(op) && op.outputs.iter().any(|&t| tensors[t].recomputed)) {
                continue;
            }
            for &t in &op.inputs {
                if tensors[t].needs_grad && !tensors[t].kept {
                    tensors[t].kept = true;
                    tensors[t].last_saver = Some(tensors[t].last_saver.map_or(i, |c| c.min(i)));
                }
            }
        }
    }
    // A checkpoint region saves what it reads from outside (`torch.utils.checkpoint` saves
    // the wrapped function's inputs), whether or not an op inside saves it: eager RMSNorm,
    // for one, saves an FP32 copy of the block's input rather than the input. Its backward
    // ends the input's life with the region's first reader's.
    if matches!(ck, Checkpointing::Full | Checkpointing::SelectiveOp) {
        for (i, op) in dag.ops.iter().enumerate() {
            if !matches!(op.region, Region::Block(l) if region_blocks[l as usize]) {
                continue;
            }
            for &t in &op.inputs {
                let external = dag.tensors[t].producer.map(|p| dag.ops[p].region) != Some(op.region);
                if external && tensors[t].needs_grad && !tensors[t].kept {
                    tensors[t].kept = true;
                    tensors[t].last_saver = Some(tensors[t].last_saver.map_or(i, |c| c.min(i)));
                }
            }
        }
    }
    // The per-op policy keeps what its saved ops write, whoever reads it.
    for (i, op) in dag.ops.iter().enumerate() {
        if sac_saved.get(i).copied().unwrap_or(false) {
            for &t in &op.outputs {
                tensors[t].kept = true;
            }
        }
    }
    // A tensor kept by one saver is not recomputed for another.
    for tp in tensors.iter_mut() {
        if tp.kept {
            tp.recomputed = false;
        }
    }
    let recompute_ops = match ck {
        Checkpointing::SelectiveOp | Checkpointing::Selective => needed_recompute(dag, &tensors),
        Checkpointing::Full => full_recompute(dag, &tensors),
        _ => vec![Vec::new(); dag.blocks() as usize],
    };
    if ck == Checkpointing::SelectiveOp && dag.workload.kernels == KernelStack::Compiled {
        compiled_saves(dag, &sac_saved, &recompute_ops, &mut tensors);
    }
    let checkpointed = match ck {
        Checkpointing::Full | Checkpointing::SelectiveOp => region_blocks,
        _ => vec![false; dag.blocks() as usize],
    };
    Checkpoints { tensors, recompute_ops, checkpointed }
}

/// The per-op policy inside a compiled block: AOTAutograd's partitioner
/// (`min_cut_rematerialization_partition` in torch/_functorch/partitioners.py) takes the
/// policy's `MUST_SAVE` tags as nodes that cannot be recomputed, and saves a forward node only
/// where the backward graph needs it: as the input of a gradient formula, or of an op it
/// recomputes. Eager checkpointing caches every `MUST_SAVE` output for the rerun of the whole
/// region instead. So a saved op's output that no backward formula reads and no recomputed op
/// reads is not kept when compiled: a block's last matmul (the MLP's down projection, whose
/// output only joins the residual stream) is the one in a Llama block.
fn compiled_saves(dag: &LayerDag, sac_saved: &[bool], recompute_ops: &[Vec<usize>], tensors: &mut [TensorPlan]) {
    let mut read_by_rerun = vec![false; dag.tensors.len()];
    for &i in recompute_ops.iter().flatten() {
        for &t in &dag.ops[i].inputs {
            read_by_rerun[t] = true;
        }
    }
    for (i, op) in dag.ops.iter().enumerate() {
        if !sac_saved[i] {
            continue;
        }
        for &t in &op.outputs {
            if tensors[t].last_saver.is_none() && !read_by_rerun[t] {
                tensors[t].kept = false;
            }
        }
    }
}

/// Megatron's selective recomputation: whether tensor `t`, saved by `saver`, is dropped
/// under `modules`.
fn selective_drop(
    dag: &LayerDag,
    modules: &[RecomputeModule],
    moe_blocks: &[bool],
    t: usize,
    saver: &crate::model::Op,
) -> bool {
    let tensor = &dag.tensors[t];
    if tensor.kind == TensorKind::AttentionScores {
        return modules.contains(&RecomputeModule::CoreAttn);
    }
    let Some(p) = tensor.producer.map(|p| &dag.ops[p]) else { return false };
    if !matches!(p.region, Region::Block(_)) || p.region != saver.region {
        return false;
    }
    let moe = |op: &crate::model::Op| matches!(op.region, Region::Block(l) if moe_blocks[l as usize]);
    let moe_block = |op: &crate::model::Op| op.name.contains(".feed_forward.") && moe(op);
    let in_mlp = |op: &crate::model::Op| (op.name.contains(".mlp.") || op.name.contains(".feed_forward.")) && !moe(op);
    modules.iter().any(|m| match m {
        RecomputeModule::CoreAttn => false,
        RecomputeModule::Layernorm => {
            p.kind == OpKind::Norm
                && (p.name.ends_with(".attention_norm") || p.name.ends_with(".ffn_norm"))
                && tensor.name.ends_with(".out")
        }
        RecomputeModule::Mlp => in_mlp(p) && in_mlp(saver),
        RecomputeModule::Moe => moe_block(p) && moe_block(saver),
        RecomputeModule::MoeAct => experts_activation(p),
        RecomputeModule::SharedExperts => {
            p.name.contains(".shared_experts.") && saver.name.contains(".shared_experts.")
        }
        RecomputeModule::MlaUpProj => {
            p.name.ends_with(".attention.wq_b")
                || p.name.ends_with(".attention.wkv_b")
                || p.name.ends_with(".attention.rope")
        }
    })
}

/// The routed experts' activation, what Megatron's `moe_act` reruns.
fn experts_activation(op: &crate::model::Op) -> bool {
    op.expert && op.kind == OpKind::Elementwise
}

/// Per block: whether it holds a mixture-of-experts layer (a router).
fn moe_blocks(dag: &LayerDag) -> Vec<bool> {
    let mut out = vec![false; dag.blocks() as usize];
    for o in &dag.ops {
        if let Region::Block(l) = o.region {
            if o.name.ends_with(".router") {
                out[l as usize] = true;
            }
        }
    }
    out
}

/// Per block: whether a full or per-op checkpointing policy wraps it; every block unless
/// the scenario says otherwise.
fn checkpointed_blocks(dag: &LayerDag, plan: &Plan) -> Vec<bool> {
    let n = dag.blocks();
    match plan.training.checkpoint_blocks {
        // Megatron's `uniform` (one layer per checkpoint) wraps each multi-token prediction
        // module too (`MultiTokenPredictionLayer._checkpointed_forward`).
        CheckpointBlocks::All => vec![true; n as usize],
        CheckpointBlocks::EveryNth(k) => (0..n).map(|l| (l + 1) % k.max(1) == 0).collect(),
        // Megatron's `block`: the first k of each chunk's decoder layers; the multi-token
        // prediction modules are not checkpointed ("recompute_method == 'block' is not
        // supported for MTP yet. Skipping recompute.").
        CheckpointBlocks::FirstPerChunk(k) => {
            let mut out = vec![false; n as usize];
            let mut first = 0;
            for len in plan.parallel.model_parallel.virtual_stage_layers(dag.config.n_layers) {
                for l in first..(first + len.min(k)) {
                    out[l as usize] = true;
                }
                first += len;
            }
            out
        }
    }
}

/// The per-op policy's saved ops: per block, the attention kernel, every other bias-free
/// matmul (routed experts run grouped GEMMs, not `aten.mm`; LoRA's frozen base linears run
/// with adapters beside them and are left out) and the forward reduce-scatters of sequence
/// parallelism.
fn sac_saved_ops(dag: &LayerDag) -> Vec<bool> {
    let mut saved = vec![false; dag.ops.len()];
    let mut mm_count = vec![0u64; dag.blocks() as usize];
    for (i, op) in dag.ops.iter().enumerate() {
        let Region::Block(l) = op.region else { continue };
        saved[i] = match op.kind {
            OpKind::AttentionCore => true,
            OpKind::Linear => {
                let bias_free = op.gemm.is_some_and(|[_, n, k]| op.params == n * k);
                if bias_free && !op.expert && op.frozen_params == 0 {
                    mm_count[l as usize] += 1;
                    mm_count[l as usize] % 2 == 1
                } else {
                    false
                }
            }
            OpKind::TpComm => op.comm.is_some_and(|c| c.forward == Some(Collective::ReduceScatter)),
            _ => false,
        };
    }
    saved
}

/// Full checkpointing: each block's ops in forward order, up to the last one writing a
/// recomputed tensor.
fn full_recompute(dag: &LayerDag, tensors: &[TensorPlan]) -> Vec<Vec<usize>> {
    let mut block_ops: Vec<Vec<usize>> = vec![Vec::new(); dag.blocks() as usize];
    for (i, op) in dag.ops.iter().enumerate() {
        if let Region::Block(l) = op.region {
            if let Some(v) = block_ops.get_mut(l as usize) {
                v.push(i);
            }
        }
    }
    for ops in block_ops.iter_mut() {
        match ops.iter().rposition(|&i| dag.ops[i].outputs.iter().any(|&t| tensors[t].recomputed)) {
            Some(last) => ops.truncate(last + 1),
            None => ops.clear(),
        }
    }
    block_ops
}

/// The ops each block reruns in backward when only some of its outputs were kept: those
/// writing a tensor its backward needs, and, transitively, those writing what they read
/// that was not kept; in forward order.
fn needed_recompute(dag: &LayerDag, tensors: &[TensorPlan]) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); dag.blocks() as usize];
    // The attention scores are recomputed inside the attention core's backward
    // (`recompute::recompute_scores`), not by rerunning ops before the block.
    let mut need: Vec<bool> =
        tensors.iter().zip(&dag.tensors).map(|(t, d)| t.recomputed && d.kind != TensorKind::AttentionScores).collect();
    for i in (0..dag.ops.len()).rev() {
        let op = &dag.ops[i];
        let Region::Block(l) = op.region else { continue };
        if !op.outputs.iter().any(|&t| need[t] && !tensors[t].kept) {
            continue;
        }
        out[l as usize].push(i);
        for &t in &op.inputs {
            let p = dag.tensors[t].producer;
            if p.is_some_and(|p| dag.ops[p].region == op.region) && !tensors[t].kept {
                need[t] = true;
            }
        }
    }
    for v in out.iter_mut() {
        v.reverse();
    }
    out
}
