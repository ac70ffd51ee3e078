//! What was live at the failing (or peak) instant, grouped into lines a person can act on,
//! each with the reason those bytes exist.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::engine;
use crate::memory::{Category, ExactAllocator, PYTORCH_BLOCK};
use crate::plan::Sharding;
use crate::report::Bytes;
use crate::scenario::Scenario;
use crate::schedule::Phase;
use crate::Simulation;

#[derive(Debug, Clone, Serialize)]
pub struct LiveLine {
    pub category: &'static str,
    pub label: &'static str,
    pub size: Bytes,
    pub reason: String,
}

/// Buffers live just before the run's peak allocation (plus the one that made the peak):
/// the same program replayed against an exact allocator one byte short of the peak stops at
/// exactly that allocation and reports what was live.
pub fn live_at_sample(sim: &Simulation, index: usize) -> Vec<u32> {
    let Some(sample) = sim.trace().timeline.sample(index) else { return Vec::new() };
    let cap = sample.allocated.saturating_sub(1);
    match engine::run(&sim.schedule().program, &mut ExactAllocator::new(cap)) {
        Ok(t) => match t.oom {
            Some(o) => {
                let mut v = o.live;
                v.push(o.buffer);
                v
            }
            None => Vec::new(),
        },
        Err(_) => Vec::new(),
    }
}

/// The layer a buffer belongs to, from the names the scheduler gives ("layers.37...").
fn layer_of(name: &str) -> Option<u64> {
    // An activation's gradient is named after it ("grad of layers.3.mlp.out ...").
    let name = name.strip_prefix("grad of ").unwrap_or(name);
    name.strip_prefix("layers.")?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Under DualPipe, buffers of several micro-batches: "of n micro-batches: ..." saying why
/// (zero-bubble backwards keep what their deferred weight-gradient GEMMs read).
fn held_for_w(plan: &crate::plan::Plan, names: &[String]) -> Option<String> {
    let n = micro_batches(names).len();
    (plan.parallel.model_parallel.schedule.is_dualpipe() && n > 1).then(|| {
        format!("of {n} micro-batches: those of zero-bubble backwards are held until their W passes (the deferred weight-gradient GEMMs read them)")
    })
}

/// The micro-batches live buffers' names mention ("... (micro-batch 3)", "... (recomputed,
/// micro-batch 3)").
fn micro_batches(names: &[String]) -> BTreeSet<u64> {
    names.iter().filter_map(|x| x.rsplit_once("micro-batch ")?.1.split(')').next()?.parse().ok()).collect()
}

fn ranges(set: &BTreeSet<u64>) -> String {
    let v: Vec<u64> = set.iter().copied().collect();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { format!("{}", v[i]) } else { format!("{}-{}", v[i], v[j]) });
        i = j + 1;
    }
    parts.join(", ")
}

fn human(n: u64) -> String {
    crate::report::human_count_with(n, 1)
}

/// LoRA's model state by part (model::lora): the precision policy's bytes per parameter apply
/// to the trainable adapters only; the frozen base is held as stored (BF16, or NF4 block
/// linears with the rest in FP32), gets no gradient and no optimizer state, except where it
/// shares an FSDP1 FlatParameter with the adapters (`shared_flat`), which autograd gives a
/// gradient.
struct LoraParts {
    /// Elements that get optimizer state: the adapters.
    trainable: u64,
    /// Frozen elements in FlatParameters with the adapters (held as parameters are).
    flat_frozen: u64,
    /// Frozen elements held as stored, and their bytes.
    stored: u64,
    stored_bytes: u64,
    /// What the stored base is.
    base: String,
    /// QLoRA: bitsandbytes dequantizes each NF4 weight for its matmul.
    nf4: bool,
}

impl LoraParts {
    fn of(dag: &crate::model::LayerDag, l: &crate::model::LoraConfig) -> LoraParts {
        use crate::model::{OpKind, Region, WeightFormat};
        let block_linear = |o: &&crate::model::Op| o.kind == OpKind::Linear && matches!(o.region, Region::Block(_));
        let (lin_params, lin_bytes) = dag
            .ops
            .iter()
            .filter(block_linear)
            .fold((0u64, 0u64), |(p, b), o| (p + o.frozen_params, b + o.frozen_bytes));
        let per = lin_bytes as f64 / lin_params.max(1) as f64;
        let base = match l.base {
            WeightFormat::Nf4 { double_quant } => format!(
                "block linears in NF4{} at {per:.3} B/param with their scales, the embeddings, norms and head in {}",
                if double_quant { " with double quantization" } else { "" },
                if l.prepare_kbit {
                    "fp32 (prepare_model_for_kbit_training)"
                } else {
                    "16 bits (no prepare_model_for_kbit_training)"
                }
            ),
            _ => format!("{per:.0} B/param, 16-bit"),
        };
        let (stored, stored_bytes) = dag.stored_frozen();
        LoraParts {
            trainable: dag.trainable_params(),
            flat_frozen: dag.flat_frozen_params(),
            stored,
            stored_bytes,
            base,
            nf4: matches!(l.base, WeightFormat::Nf4 { .. }),
        }
    }

    /// Elements that get gradients.
    fn with_grads(&self) -> u64 {
        self.trainable + self.flat_frozen
    }
}

/// Groups live buffers by category and says why each group exists.
pub fn from_buffers(
    s: &Scenario,
    sim: &Simulation,
    live: &[u32],
    at_layer: Option<u64>,
    phase: Phase,
) -> Vec<LiveLine> {
    let prog = &sim.schedule().program;
    let plan = sim.plan();
    let pr = &plan.training.precision;
    // This rank's parameters: its stage's under a pipeline, its experts' under expert
    // parallelism (and, for LoRA, the frozen base too).
    let local = if sim.dag.lora.is_some() { sim.dag.param_count() } else { plan.total_params() };
    let lora = sim.dag.lora.as_ref().map(|l| LoraParts::of(&sim.dag, l));
    // The elements with gradients and with optimizer state: all of this rank's, or LoRA's.
    let (graded, stated) = lora.as_ref().map_or((local, local), |l| (l.with_grads(), l.trainable));
    let psi = human(graded);
    let n = plan.shard_group;
    let expert = plan.expert_params();
    let mut bytes = [0u64; Category::COUNT];
    let mut layers: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); Category::COUNT];
    let mut names: Vec<Vec<String>> = vec![Vec::new(); Category::COUNT];
    for &b in live {
        let spec = &prog.buffers[b as usize];
        let name = &prog.names[spec.name as usize];
        let c = spec.category.index();
        bytes[c] += spec.bytes.div_ceil(PYTORCH_BLOCK) * PYTORCH_BLOCK;
        if let Some(l) = layer_of(name) {
            layers[c].insert(l);
        }
        names[c].push(name.clone());
    }
    // "x N" or "x N / n GPUs" of `count` elements; a MoE rank's experts are sharded over
    // their own group.
    let times = |yes: bool, count: u64| match (yes, expert) {
        (true, e) if e > 0 && (n > 1 || plan.edp > 1) => {
            let over = |k: u64| if k > 1 { format!(" / {k} GPUs") } else { String::new() };
            format!("({}{} + {} expert params{})", human(count - e), over(n), human(e), over(plan.edp))
        }
        (true, _) if n > 1 => format!("{} / {n} GPUs", human(count)),
        _ => human(count),
    };
    let units = plan.units.len();
    let total_layers = s.model.n_layers;
    let (b, sl) = (s.training.micro_batch, s.training.seq_len);
    let mut out = Vec::new();
    for cat in Category::ALL {
        let c = cat.index();
        if bytes[c] == 0 {
            continue;
        }
        let reason = match cat {
            Category::Parameters => {
                let loaded = names[c].iter().filter(|x| x.contains("parameters")).count();
                let per = match &lora {
                    Some(l) => {
                        let over = if plan.params_sharded && n > 1 { format!(" / {n} GPUs") } else { String::new() };
                        let flat = match l.flat_frozen {
                            0 => String::new(),
                            f => format!(
                                " and {} in the blocks' FSDP1 FlatParameters with the adapters ({} B/param; wrap = \"block\" gives them gradients)",
                                human(f),
                                pr.param.bytes()
                            ),
                        };
                        format!(
                            "parameters: the frozen base, {} params as stored in {}{over} ({}){flat}, and the trainable LoRA adapters, {} {} B/param x {}",
                            human(l.stored),
                            crate::report::fmt_bytes(l.stored_bytes),
                            l.base,
                            pr.param.name(),
                            pr.param.bytes(),
                            times(plan.params_sharded, l.trainable)
                        )
                    }
                    None => format!(
                        "{} parameters: {} B/param x {}",
                        pr.param.name(),
                        pr.param.bytes(),
                        times(plan.params_sharded, local)
                    ),
                };
                let flat = plan.deepspeed_optimizer().filter(|_| plan.deepspeed_flattens());
                if let Some(ds) = flat {
                    // DeepSpeed's wrapper moved them into one flat buffer at initialisation.
                    format!("replicated {per}, flattened by DeepSpeed into one buffer ({})", ds.flat_params_name())
                } else if loaded < units {
                    format!("{per} ({loaded} of {units} units loaded so far)")
                } else if plan.params_sharded && plan.shard_group > 1 {
                    format!("sharded {per}")
                } else {
                    format!("replicated {per}")
                }
            }
            Category::MasterWeights => match pr.aware {
                Some(pa) if pa.remainders(pr.param) => format!(
                    "fp32 master weights kept by FusedAdam as int16 remainders of the bf16 parameters (store_param_remainders): 2 B/param x {}",
                    times(plan.optimizer_sharded, stated)
                ),
                _ => {
                    let m = pr.aware.map(|pa| pa.main_params).or(pr.master).map_or("fp32", |m| m.name());
                    format!(
                        "{m} master weights: {} B/param x {}",
                        pr.master.map_or(4, |_| pr.master_bytes()),
                        times(plan.optimizer_sharded, stated)
                    )
                }
            },
            Category::OptimizerState => {
                let k = plan.training.states_per_param();
                let dtypes = match pr.aware {
                    Some(pa) => format!("exp_avg {} + exp_avg_sq {}", pa.exp_avg.name(), pa.exp_avg_sq.name()),
                    None => pr.optimizer_state.name().to_string(),
                };
                format!(
                    "{k} {dtypes} optimizer moment(s){}: {} B/param x {}",
                    if lora.is_some() { " of the trainable LoRA adapters" } else { "" },
                    pr.state_bytes(k),
                    times(plan.optimizer_sharded, stated)
                )
            }
            Category::OptimizerTemp => {
                format!("optimizer.step() temporaries ({:?} implementation)", plan.training.optimizer_impl)
            }
            Category::Gradients => {
                let whose = match &lora {
                    Some(l) if l.flat_frozen > 0 => ": the adapters' and the frozen block weights' sharing their FSDP1 FlatParameters",
                    Some(_) => ": the trainable LoRA adapters' only (the frozen base gets none)",
                    None => "",
                };
                let what = if plan.deepspeed_optimizer() == Some(crate::plan::DeepspeedOptimizer::ZeroStage3) {
                    let sub = plan.parallel.deepspeed.stage3_sub_group_elements(plan.local_total(true));
                    format!(
                        "DeepSpeed ZeRO-3's gradient partitions ({} B/param x {}) and the FP32 gradient of its largest optimizer sub-group ({sub} elements x 4 B, sub_group_size {:e}), both kept from initialisation",
                        pr.grad.bytes(),
                        times(true, graded),
                        plan.parallel.deepspeed.sub_group_size as f64
                    )
                } else if plan.deepspeed_optimizer() == Some(crate::plan::DeepspeedOptimizer::Bf16Optimizer) {
                    format!(
                        "BF16_Optimizer's FP32 gradient accumulation buffer (4 B/param x {psi}, not partitioned) and the {} .grads autograd has produced in this backward, 2 B/param, with the FP32 copy update_hp_grads makes of one .grad at a time after backward",
                        pr.param.name()
                    )
                } else if plan.parallel.framework.fsdp1_no_shard(plan.parallel.sharding) {
                    format!(
                        "full {} flat gradients of {} of {units} units all-reduced so far (FSDP1 NO_SHARD), {} B/param",
                        pr.grad.name(),
                        names[c].len(),
                        pr.grad.bytes()
                    )
                } else if plan.grads_sharded {
                    format!(
                        "sharded {} gradients of {} of {units} units reduced so far ({} B/param x {})",
                        pr.grad.name(),
                        names[c].len(),
                        pr.grad.bytes(),
                        times(true, graded)
                    )
                } else if plan.parallel.framework == crate::plan::Framework::Megatron {
                    format!(
                        "Megatron's contiguous {} gradient buffer (every local parameter's main_grad): {} B/param x {psi}",
                        pr.grad.name(),
                        pr.grad.bytes()
                    )
                } else {
                    format!(
                        "full {} gradients (.grad) of {} parameter tensors, {} B/param",
                        pr.grad.name(),
                        names[c].len(),
                        pr.grad.bytes()
                    )
                };
                format!("{what}{whose}")
            }
            Category::UnshardedGradients => {
                let what = if plan.parallel.sharding == Sharding::None { "all-reduce" } else { "reduce-scatter" };
                let ls = if layers[c].is_empty() {
                    "the root unit".to_string()
                } else {
                    format!("layer(s) {}", ranges(&layers[c]))
                };
                let dtype = plan.unsharded_grad_dtype();
                format!("unsharded {} gradients of {ls} awaiting their {what}", dtype.name())
            }
            Category::GatheredParameters if plan.zero3_fetches_modules() => {
                // schedule/zero3_fetch.rs names each module's buffer "... (ZeRO-3 fetch|prefetch, dtype)".
                let n = names[c].len();
                let prefetched = names[c].iter().filter(|x| x.contains("ZeRO-3 prefetch")).count();
                let of = if layers[c].is_empty() {
                    "the embedding and head".to_string()
                } else {
                    format!("layer(s) {}", ranges(&layers[c]))
                };
                let ds = &plan.parallel.deepspeed;
                format!(
                    "parameters all-gathered in {} by DeepSpeed ZeRO-3's module-by-module fetching: {n} module(s) of {of}, {prefetched} of them prefetched along the trace (up to stage3_max_live_parameters {:e} elements), the others fetched for their use or kept for a reuse within stage3_max_reuse_distance {:e} elements",
                    pr.compute.name(),
                    ds.stage3_max_live_parameters as f64,
                    ds.stage3_max_reuse_distance as f64
                )
            }
            Category::GatheredParameters => {
                let no_shard = plan.parallel.framework.fsdp1_no_shard(plan.parallel.sharding);
                let mut parts: Vec<String> = names[c]
                    .iter()
                    .map(|x| {
                        let unit = [" gathered", " cast for", " _mp_shard", " weight cast ("]
                            .iter()
                            .filter_map(|m| x.find(m))
                            .min()
                            .map_or(x.to_string(), |i| x[..i].to_string());
                        let mp_shard = if x.contains("_mp_shard") { " (its _mp_shard, being all-gathered)" } else { "" };
                        let l = layer_of(x);
                        let ahead = match (l, at_layer, phase) {
                            (Some(l), Some(at), Phase::Forward) => l > at,
                            (Some(l), Some(at), Phase::Backward) => l < at,
                            _ => false,
                        };
                        if x.contains(" weight cast (recompute)") {
                            format!("{unit} (cast again for its recompute)")
                        } else if x.contains(" weight cast (") {
                            format!("{unit} (cast for its forward)")
                        } else if plan.pipeline() > 1 && !plan.reshard_after_forward && x.contains("gathered") {
                            // FSDP on a pipeline stage keeps its units gathered over the step.
                            format!("{unit} (kept gathered across the stage's micro-batches)")
                        } else if l.is_none() && x.contains("gathered") && !no_shard {
                            format!("{unit} (root unit: not resharded after forward)")
                        } else if ahead {
                            format!("{unit}{mp_shard} (prefetched)")
                        } else if x.contains(" for backward") {
                            format!("{unit}{mp_shard} (for its backward)")
                        } else if x.contains(" for forward") && phase == Phase::Backward {
                            format!("{unit} (kept since forward: not resharded)")
                        } else if x.contains(" for forward") {
                            format!("{unit}{mp_shard} (for its forward)")
                        } else {
                            x.clone()
                        }
                    })
                    .collect();
                parts.sort();
                parts.dedup();
                if parts.len() > 6 {
                    let k = parts.len();
                    parts.truncate(5);
                    parts.push(format!("... {} more", k - 5));
                }
                // forward.rs names autocast's copy of a weight for its matmul "... weight cast (..)".
                let casts = names[c].iter().filter(|x| x.contains(" weight cast (")).count();
                if casts == names[c].len() {
                    let whose = match &lora {
                        Some(l) if l.nf4 => format!(
                            " (the {} LoRA adapters; bitsandbytes dequantizes the NF4 base into scratch for each matmul)",
                            pr.param.name()
                        ),
                        Some(_) => {
                            format!(" (the {} LoRA adapters; the 16-bit frozen base is used as stored)", pr.param.name())
                        }
                        None => String::new(),
                    };
                    format!("weights cast to {} by autocast for their matmuls{whose}: {}", pr.compute.name(), parts.join(", "))
                } else if no_shard {
                    format!(
                        "parameters cast to {} (FSDP1 NO_SHARD: each unit's _mp_shard, freed at every reshard): {}",
                        pr.compute.name(),
                        parts.join(", ")
                    )
                } else if casts > 0 {
                    format!("parameters all-gathered in {}, and weights cast to it by autocast: {}", pr.compute.name(), parts.join(", "))
                } else {
                    format!("parameters all-gathered in {}: {}", pr.compute.name(), parts.join(", "))
                }
            }
            Category::Activations => {
                let k = layers[c].len() as u64;
                let per = if k > 0 { sim.dag.saved_bytes(crate::model::Region::Block(0), true) } else { 0 };
                let ck = match plan.training.checkpointing {
                    crate::plan::Checkpointing::Full => " (only each checkpointed block's input)",
                    crate::plan::Checkpointing::Selective => " (attention scores dropped)",
                    crate::plan::Checkpointing::None => "",
                    crate::plan::Checkpointing::SelectiveOp => {
                        " (per-op selective: attention and every other matmul's outputs kept, the rest recomputed)"
                    }
                };
                // Pipelining (and a GPipe schedule above all) keeps several micro-batches'
                // activations at once; their buffers name the micro-batch.
                let in_flight: BTreeSet<&str> =
                    names[c].iter().filter_map(|x| x.rsplit_once("(micro-batch ").map(|(_, m)| m)).collect();
                let whose = match in_flight.len() {
                    0 | 1 => format!("micro-batch {b} x {sl} tokens"),
                    m => format!("{m} micro-batches in flight ({b} x {sl} tokens each)"),
                };
                if k > 0 {
                    format!(
                        "activations saved by {k} of {total_layers} layers (layers {}) of {whose}{ck}, {} per layer and micro-batch without checkpointing, plus embedding/head/loss",
                        ranges(&layers[c]),
                        crate::report::fmt_bytes(per)
                    )
                } else {
                    "activations saved by the embedding, head and loss".to_string()
                }
            }
            Category::Recomputed => {
                let what = format!("activations recomputed for the backward of layer(s) {}", ranges(&layers[c]));
                held_for_w(plan, &names[c]).map_or(what.clone(), |held| format!("{what} {held}"))
            }
            Category::Transient if lora.as_ref().is_some_and(|l| l.nf4) => "forward intermediates not kept for backward, and kernel scratch (with the NF4 weight bitsandbytes dequantizes to bf16 for the matmul running)".to_string(),
            Category::Transient => "forward intermediates not kept for backward, and kernel scratch".to_string(),
            Category::ActivationGradients => {
                if let Some(held) = held_for_w(plan, &names[c]) {
                    format!("gradients w.r.t. activations of layer(s) {} {held}", ranges(&layers[c]))
                } else if layers[c].is_empty() {
                    "gradients w.r.t. activations: the loss's vocabulary-sized gradients and the head's".to_string()
                } else {
                    format!("gradients w.r.t. activations of layer(s) {} being differentiated", ranges(&layers[c]))
                }
            }
            Category::CommBuffers => {
                format!("communication buffers: {}", names[c].first().cloned().unwrap_or_default())
            }
            Category::Buffers => {
                let recipe = sim.dag.workload.fp8.map(|f| f.recipe).filter(|r| r.is_te());
                let te = match recipe {
                    Some(crate::model::Fp8Recipe::Delayed) => {
                        Some("Transformer Engine's FP8 weight and transpose workspaces (2 B per FP8 parameter) and amax histories")
                    }
                    Some(_) => Some("Transformer Engine's FP8 weight copies, rowwise and columnwise, with their block scales"),
                    None => None,
                };
                match (te, sim.dag.buffer_bytes > 0) {
                    (Some(t), true) => format!("module buffers: {t}, rotary tables"),
                    (Some(t), false) => format!("module buffers: {t}"),
                    _ => "module buffers (rotary tables)".to_string(),
                }
            }
            Category::Inputs => "token ids and targets".to_string(),
            Category::KvCache => "keys and values of every token of context (inference)".to_string(),
            Category::PostForwardShards => format!(
                "FSDP2 post-forward shards (reshard_after_forward = {}): 1/{} of the {} parameters of each unit whose forward is done ({} live), kept until its backward all-gathers them over those ranks",
                plan.parallel.post_forward_shard.unwrap_or(1),
                plan.parallel.post_forward_shard.unwrap_or(1),
                pr.compute.name(),
                names[c].len()
            ),
            Category::BlasWorkspaces => format!(
                "cuBLAS workspaces PyTorch takes from the caching allocator, {} per (cuBLAS handle, stream) (CUBLAS_WORKSPACE_CONFIG; {} default){}: {}",
                crate::report::fmt_bytes(plan.training.blas_workspace),
                s.cluster.gpu.name,
                match plan.training.te_workspace {
                    0 => String::new(),
                    b => format!(
                        ", and Transformer Engine's, {} each (one for its GEMMs, four for its grouped GEMMs; get_cublas_workspace_size_bytes)",
                        crate::report::fmt_bytes(b)
                    ),
                },
                names[c].join(", ")
            ),
            Category::AllGatherBuffers => format!(
                "FSDP2 flat {} all-gather outputs, not yet copied out into unsharded parameters: {}",
                pr.compute.name(),
                names[c].join(", ")
            ),
            Category::ReduceScatterBuffers if plan.parallel.framework.fsdp1_buffers() => format!(
                "FSDP1 flat gradients cast to {} (reduce_dtype) on the post-backward stream, kept until their reduce-scatter ends: {}",
                pr.grad.name(),
                names[c].join(", ")
            ),
            Category::ReduceScatterBuffers => format!(
                "FSDP2 flat {} (reduce_dtype) reduce-scatter inputs, kept until the next unit's post-backward: {}",
                pr.grad.name(),
                names[c].join(", ")
            ),
        };
        out.push(LiveLine { category: cat.key(), label: cat.label(), size: Bytes::new(bytes[c]), reason });
    }
    out.sort_by(|a, b| b.size.bytes.cmp(&a.size.bytes).then(a.category.cmp(b.category)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_and_ranges() {
        assert_eq!(layer_of("layers.37.mlp.c_fc.out (micro-batch 0)"), Some(37));
        assert_eq!(layer_of("layers.5 gathered for backward (bf16)"), Some(5));
        assert_eq!(layer_of("norm.out"), None);
        assert_eq!(layer_of("grad of layers.12.attention.out (micro-batch 3)"), Some(12));
        let names = ["grad of a (micro-batch 3)".to_string(), "x (recomputed, micro-batch 12)".into(), "y".into()];
        assert_eq!(micro_batches(&names).into_iter().collect::<Vec<_>>(), [3, 12]);
        let s: BTreeSet<u64> = [0, 1, 2, 5, 7, 8].into_iter().collect();
        assert_eq!(ranges(&s), "0-2, 5, 7-8");
    }
}
