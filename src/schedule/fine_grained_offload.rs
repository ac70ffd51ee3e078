//! Megatron-Core's fine-grained activation offloading (`--fine-grained-activation-offloading
//! --offload-modules ...`; megatron/core/pipeline_parallel/fine_grained_activation_offload.py,
//! NVIDIA/Megatron-LM d98e8a6), as stepsim schedules it:
//!
//! - **Groups.** Each listed module of each layer is a group (`on_group_start_forward`): the
//!   tensors its ops save for backward (`tensor_push` from the saved-tensor hooks), if they
//!   have at least `--min-offloaded-tensor-size` elements. A tensor another module also
//!   saves stays referenced on the GPU, so it is offloaded only when every op that saves it
//!   is in a listed module of the same layer; it belongs to the group of its last saver.
//! - **Forward.** A group commits when its module's forward ends (`group_offload`), the two
//!   norms after the residual add that still reads their input (`attn_norm_manager` /
//!   `mlp_norm_manager`, committed after the bias-dropout-add): its tensors are copied to
//!   pinned host memory on the device-to-host stream, which waits for compute; compute goes
//!   on, and each GPU copy is freed when the copy ends (`record_stream` on the copy stream, or
//!   the forced release of the module's input).
//! - **Backward.** A layer's groups are reloaded into new buffers on the host-to-device
//!   stream one layer ahead of the backward that needs them (Megatron reloads one group
//!   ahead, `bulk_reload` at each group's backward commit; a whole layer ahead is slightly
//!   more memory), after the group's own copy; a layer's first backward kernel waits for its
//!   reload. The chunk's last layer is reloaded when its backward starts (Megatron's
//!   `pre_reload_last_layer` starts it during the previous chunk's backward).
//! - **Kept on the GPU**: on the chunk whose backward follows its own forward (the pipeline's
//!   last chunk, or the model without a pipeline), the last group of each module name, about
//!   to be used at once (`should_bulk_offload`: "don't offload the last group with the same
//!   name if it's about to be used immediately").
//!
//! - **`--activation-offload-fraction`**: of each model chunk's eligible groups, in forward
//!   order, the last `int(n x (1 - fraction))` stay on the GPU (`post_warmup_callback`).
//!
//! Not modelled: `--delta-offload-bytes-across-pp-ranks` (it disables groups of the warm-up's
//! first micro-batches only, which one program per rank cannot express), the warm-up
//! iteration's bookkeeping (`post_warmup_callback`'s margin), CUDA-graph scopes, and the
//! duplicate copies of a tensor two groups save.

use super::checkpoint::TensorPlan;
use crate::model::{LayerDag, Region, TensorKind};
use crate::plan::{OffloadModules, Plan};

/// The groups of one rank's program: per group its layer (block), module bit and the op after
/// whose forward it commits; per op the groups committing there; per block its groups.
#[derive(Clone, Debug, Default)]
pub struct FineGroups {
    pub block: Vec<u64>,
    pub module: Vec<u8>,
    pub commit: Vec<usize>,
    pub at_op: Vec<Vec<u32>>,
    pub of_block: Vec<Vec<u32>>,
}

/// The module an op of a block belongs to, as Megatron's layer wraps them
/// (`TransformerLayer`, `SelfAttention` / `MLASelfAttention`, `TEGroupedMLP`): its bit in
/// [`OffloadModules`], or 0.
pub fn module_of(name: &str) -> u8 {
    let last = |s: &str| name.ends_with(s);
    if last(".attention_norm") {
        OffloadModules::ATTN_NORM
    } else if last(".attention.core") {
        OffloadModules::CORE_ATTN
    } else if last(".attention.wo") {
        OffloadModules::ATTN_PROJ
    } else if last(".ffn_norm") {
        OffloadModules::MLP_NORM
    } else if last(".experts.w1") || last(".experts.w3") {
        OffloadModules::EXPERT_FC1
    } else if last(".experts.swiglu") || last(".experts.silu") || last(".experts.mul") {
        OffloadModules::MOE_ACT
    } else if name.contains(".attention.") && !name.contains(".attention.dropout") || last(".attn.c_attn") {
        // The projections to queries, keys and values and what runs on them before the
        // core attention (head norms, rotary, MLA's down and up projections and norms).
        OffloadModules::QKV_LINEAR
    } else {
        0
    }
}

/// Per tensor the group that takes it to the host (None: it stays on the GPU), and the
/// groups. Only for fine-grained offloading; empty otherwise.
pub fn targets(dag: &LayerDag, plan: &Plan, tensors: &[TensorPlan]) -> (Vec<Option<u64>>, FineGroups) {
    let Some(a) = plan.training.activation_offload else { return Default::default() };
    let modules: OffloadModules = a.modules;
    let elem = dag.workload.compute_dtype.bytes().max(1);
    let n = dag.ops.len();
    let module: Vec<u8> = dag
        .ops
        .iter()
        .map(|o| match o.region {
            Region::Block(_) if o.comm.is_none() => module_of(&o.name) & modules.0,
            _ => 0,
        })
        .collect();
    // Every op that saves each tensor.
    let mut savers: Vec<Vec<usize>> = vec![Vec::new(); dag.tensors.len()];
    for (i, o) in dag.ops.iter().enumerate() {
        for &t in &o.saves {
            if !savers[t].contains(&i) {
                savers[t].push(i);
            }
        }
    }
    let mut groups = FineGroups {
        at_op: vec![Vec::new(); n],
        of_block: vec![Vec::new(); dag.blocks() as usize],
        ..Default::default()
    };
    let mut index = std::collections::HashMap::new();
    let mut of = vec![None; dag.tensors.len()];
    for (t, tp) in tensors.iter().enumerate() {
        let s = &savers[t];
        let Some(&latest) = s.iter().max() else { continue };
        if !tp.kept || s.iter().any(|&i| module[i] == 0 || dag.ops[i].region != dag.ops[latest].region) {
            continue;
        }
        let Region::Block(l) = dag.ops[latest].region else { continue };
        let per = if dag.tensors[t].kind == TensorKind::Stats { 4 } else { elem };
        if dag.tensors[t].bytes / per < a.min_elements {
            continue;
        }
        // Still read by a later layer's forward: it stays.
        if tp.last_consumer.is_some_and(|c| dag.ops[c].region != dag.ops[latest].region) {
            continue;
        }
        let commit = latest.max(tp.last_consumer.unwrap_or(latest));
        let g = *index.entry((l, module[latest])).or_insert_with(|| {
            groups.block.push(l);
            groups.module.push(module[latest]);
            groups.commit.push(commit);
            groups.block.len() - 1
        });
        groups.commit[g] = groups.commit[g].max(commit);
        of[t] = Some(g as u64);
    }
    // The chunk whose backward follows its own forward keeps each module's last group.
    let head = plan.chunks.iter().find(|c| c.holds(Region::Head));
    let mut kept = vec![false; groups.block.len()];
    if let Some(ch) = head {
        for bit in OffloadModules::ALL.iter().map(|(_, b)| *b) {
            let last = (0..groups.block.len())
                .filter(|&g| groups.module[g] == bit && ch.holds(Region::Block(groups.block[g])))
                .max_by_key(|&g| groups.block[g]);
            if let Some(g) = last {
                kept[g] = true;
            }
        }
    }
    // --activation-offload-fraction: of each model chunk's eligible groups, in forward order,
    // the last int(n x (1 - fraction)) stay (`post_warmup_callback`).
    if a.fraction < 1.0 {
        for ch in &plan.chunks {
            let mut eligible: Vec<usize> =
                (0..groups.block.len()).filter(|&g| !kept[g] && ch.holds(Region::Block(groups.block[g]))).collect();
            eligible.sort_by_key(|&g| groups.commit[g]);
            let disabled = (eligible.len() as f64 * (1.0 - a.fraction)) as usize;
            for &g in eligible.iter().rev().take(disabled) {
                kept[g] = true;
            }
        }
    }
    for x in of.iter_mut() {
        if x.is_some_and(|g| kept[g as usize]) {
            *x = None;
        }
    }
    for (g, _) in kept.iter().enumerate().filter(|(_, k)| !**k) {
        groups.at_op[groups.commit[g]].push(g as u32);
        groups.of_block[groups.block[g] as usize].push(g as u32);
    }
    (of, groups)
}
