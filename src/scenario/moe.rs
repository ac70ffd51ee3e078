//! `[model.moe]` and `[parallel] expert` / `expert_tensor`: a mixture-of-experts MLP, from the
//! section or a MoE `config.json`, and the expert (and expert tensor) parallelism it runs
//! with (Megatron-Core's rules: `megatron/training/arguments.py` `validate_args`,
//! `parallel_state.py`, `transformer_config.py`).

use super::*;
use crate::model::hf::HfModel;
use crate::model::{MlaConfig, MoeConfig};
use crate::schedule::routing::{Capacity, Routing};

/// The model's MoE MLP: the section's fields over the config's; None for a dense model.
pub(super) fn validate_moe(
    v: &V,
    m: &ModelSection,
    hf: Option<&HfModel>,
    family: Family,
    n_layers: u64,
) -> Result<Option<MoeConfig>, ScenarioError> {
    let base = hf.and_then(|h| h.moe.clone());
    let Some(sec) = &m.moe else {
        if let Some(b) = base.as_ref().filter(|b| !(0..n_layers).any(|l| b.is_moe_layer(l))) {
            return Err(v.err(
                "model.n_layers",
                format!(
                    "{n_layers} blocks hold none of the config's mixture-of-experts blocks ({}): use more",
                    b.pattern_words(n_layers)
                ),
            ));
        }
        return Ok(base);
    };
    if family != Family::Llama {
        return Err(v.err(
            "model.moe",
            "mixture-of-experts MLPs are SwiGLU experts of the llama family; set model.family = \"llama\"",
        ));
    }
    let num = |field: &str, own: Option<i64>, from: Option<u64>| -> Result<u64, ScenarioError> {
        match (own, from) {
            (Some(x), _) => v.bounded(field, x, limits::MAX_FFN),
            (None, Some(x)) => Ok(x),
            (None, None) => {
                Err(v.err(field, "is required in [model.moe] (or give a MoE model.name / model.hf_config)"))
            }
        }
    };
    let num_experts = num("model.moe.num_experts", sec.num_experts, base.as_ref().map(|b| b.num_experts))?;
    let top_k = num("model.moe.top_k", sec.top_k, base.as_ref().map(|b| b.top_k))?;
    if top_k > num_experts {
        return Err(v.err(
            "model.moe.top_k",
            format!("routes each token to top_k of model.moe.num_experts ({num_experts}) experts: at most {num_experts}, got {top_k}"),
        ));
    }
    let expert_ffn_hidden =
        num("model.moe.expert_ffn_hidden", sec.expert_ffn_hidden, base.as_ref().map(|b| b.expert_ffn_hidden))?;
    let shared_expert_ffn_hidden = match sec.shared_expert_ffn_hidden {
        Some(x) if x < 0 => {
            return Err(
                v.err("model.moe.shared_expert_ffn_hidden", format!("must be >= 0 (0: no shared experts), got {x}"))
            )
        }
        Some(0) => 0,
        Some(x) => v.bounded("model.moe.shared_expert_ffn_hidden", x, limits::MAX_FFN)?,
        None => base.as_ref().map_or(0, |b| b.shared_expert_ffn_hidden),
    };
    let shared_expert_gate = sec.shared_expert_gate.unwrap_or(base.as_ref().is_some_and(|b| b.shared_expert_gate));
    if shared_expert_gate && shared_expert_ffn_hidden == 0 {
        return Err(v.err(
            "model.moe.shared_expert_gate",
            "gates the shared experts: set model.moe.shared_expert_ffn_hidden too",
        ));
    }
    let first_dense_layers = match sec.first_dense_layers {
        Some(x) if x < 0 || x as u64 >= n_layers => {
            return Err(v.err(
                "model.moe.first_dense_layers",
                format!("must be between 0 and model.n_layers - 1 ({}), got {x}", n_layers.saturating_sub(1)),
            ))
        }
        Some(x) => x as u64,
        None => base.as_ref().map_or(0, |b| b.first_dense_layers),
    };
    let every = match sec.every {
        Some(x) => v.bounded("model.moe.every", x, limits::MAX_LAYERS)?,
        None => base.as_ref().map_or(1, |b| b.every),
    };
    let offset = match sec.offset {
        Some(x) if x < 0 || x as u64 >= every => {
            return Err(v.err(
                "model.moe.offset",
                format!(
                    "block l is a mixture of experts when l % every ({every}) == offset: between 0 and {}, got {x}",
                    every - 1
                ),
            ))
        }
        Some(x) => x as u64,
        None if sec.every.is_some() => 0,
        None => base.as_ref().map_or(0, |b| b.offset),
    };
    let dense_layers = match &sec.dense_layers {
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for &l in list {
                if l < 0 || l as u64 >= n_layers {
                    return Err(v.err(
                        "model.moe.dense_layers",
                        format!(
                            "block indices between 0 and model.n_layers - 1 ({}), got {l}",
                            n_layers.saturating_sub(1)
                        ),
                    ));
                }
                out.push(l as u64);
            }
            out.sort_unstable();
            out.dedup();
            out
        }
        None => {
            base.as_ref().map_or_else(Vec::new, |b| b.dense_layers.iter().copied().filter(|&l| l < n_layers).collect())
        }
    };
    let groups = match sec.router_groups {
        Some(x) => v.positive("model.moe.router_groups", x)?,
        None => base.as_ref().map_or(1, |b| b.router_groups),
    };
    let group_topk = match sec.router_group_topk {
        Some(x) => v.positive("model.moe.router_group_topk", x)?,
        None if sec.router_groups.is_some() => groups,
        None => base.as_ref().map_or(1, |b| b.router_group_topk).min(groups),
    };
    if group_topk > groups {
        return Err(v.err(
            "model.moe.router_group_topk",
            format!("picks groups among model.moe.router_groups ({groups}): at most {groups}, got {group_topk}"),
        ));
    }
    if num_experts % groups != 0 {
        return Err(v.err(
            "model.moe.router_groups",
            format!(
                "must divide model.moe.num_experts ({num_experts}) into groups of consecutive experts, got {groups}"
            ),
        ));
    }
    if top_k > group_topk * (num_experts / groups) {
        return Err(v.err(
            "model.moe.router_group_topk",
            format!(
                "a token's top_k ({top_k}) experts come from router_group_topk of the {groups} groups of {} experts: at least {} groups, got {group_topk}",
                num_experts / groups,
                top_k.div_ceil(num_experts / groups)
            ),
        ));
    }
    let moe = MoeConfig {
        num_experts,
        top_k,
        expert_ffn_hidden,
        shared_expert_ffn_hidden,
        shared_expert_gate,
        first_dense_layers,
        every,
        offset,
        dense_layers,
        biases: base.as_ref().is_some_and(|b| b.biases),
        router_groups: groups,
        router_group_topk: group_topk,
    };
    if !(0..n_layers).any(|l| moe.is_moe_layer(l)) {
        return Err(v.err(
            "model.moe.every",
            format!("with first_dense_layers {first_dense_layers}, offset {offset} and the dense_layers listed, none of the {n_layers} blocks is a mixture of experts"),
        ));
    }
    Ok(Some(moe))
}

/// `[parallel] expert` and `expert_tensor`: the expert-parallel and expert-tensor-parallel
/// degrees, folded over the tensor-, context- and data-parallel ranks of a stage
/// (Megatron-Core's parallel folding: `parallel_state.py` `initialize_model_parallel` builds
/// the expert groups from a second `RankGenerator` of expert tensor x expert x expert data x
/// pipeline over the same ranks, with `cp=1`: "CP is only included in default RankGenerator,
/// and EP only in expert RankGenerator", so the context-parallel ranks of a stage become
/// expert-data-parallel ranks, `expert_data_parallel_size = world_size //
/// (expert_tensor x expert x pipeline)`). Its one assertion on the degrees, "world_size ... is
/// not divisible by expert_tensor_model_pipeline_parallel size", is expert tensor x expert
/// dividing a stage's tensor x context x data ranks. Returns (expert, expert_tensor); (1, 1)
/// for a dense model.
#[allow(clippy::too_many_arguments)]
pub(super) fn validate_expert_parallel(
    v: &V,
    p: &ParallelSection,
    model: &ModelConfig,
    tensor: u64,
    sequence_parallel: bool,
    context: u64,
    dp: u64,
    sharding: Sharding,
    framework: Framework,
) -> Result<(u64, u64), ScenarioError> {
    let ep = match p.expert {
        Some(x) => v.positive("parallel.expert", x)?,
        None => 1,
    };
    let etp_given = match p.expert_tensor {
        Some(x) => Some(v.positive("parallel.expert_tensor", x)?),
        None => None,
    };
    if model.mla.is_some() && tensor > 1 && framework != Framework::Megatron {
        return Err(v.err(
            "parallel.tensor",
            "tensor parallelism with multi-head latent attention is simulated as Megatron-Core splits it (parallel.framework = \"megatron\"); use parallel.tensor = 1 here",
        ));
    }
    let Some(moe) = &model.moe else {
        if ep > 1 {
            return Err(v.err(
                "parallel.expert",
                "expert parallelism needs a mixture-of-experts model ([model.moe], or a MoE model.name / model.hf_config)",
            ));
        }
        if etp_given.is_some_and(|x| x > 1) {
            return Err(v.err(
                "parallel.expert_tensor",
                "expert tensor parallelism splits the experts of a mixture-of-experts model ([model.moe], or a MoE model.name / model.hf_config)",
            ));
        }
        return Ok((1, 1));
    };
    // Megatron's default: `arguments.py` `validate_args` (and `ModelParallelConfig.
    // __post_init__`) set expert_tensor_parallel_size = tensor_model_parallel_size when the
    // flag is not given.
    let etp = etp_given.unwrap_or(tensor);
    // The field an error about the expert-tensor degree names: the one the file sets.
    let etp_field = if etp_given.is_some() { "parallel.expert_tensor" } else { "parallel.tensor" };
    let etp_default = if etp_given.is_some() {
        String::new()
    } else {
        format!(
            " (parallel.expert_tensor defaults to parallel.tensor, {tensor}, as Megatron's --expert-tensor-parallel-size does: set parallel.expert_tensor = 1 to keep each expert whole)"
        )
    };
    if moe.num_experts % ep != 0 {
        return Err(v.err(
            "parallel.expert",
            format!(
                "must divide model.moe.num_experts ({}): every rank holds the same number of experts, got {ep}",
                moe.num_experts
            ),
        ));
    }
    // A stage's ranks the experts fold over: tensor x context x data (the context-parallel
    // ranks hold the same experts and reduce their gradients together).
    let context = context.max(1);
    let ranks = tensor * context * dp;
    let stage = if context > 1 {
        format!("tensor x context x data-parallel ranks ({tensor} x {context} x {dp} = {ranks})")
    } else {
        format!("tensor x data-parallel ranks ({tensor} x {dp} = {ranks})")
    };
    if ranks % ep != 0 {
        return Err(v.err(
            "parallel.expert",
            format!("expert parallelism is folded over a stage's {stage}: it must divide them, got {ep}"),
        ));
    }
    // Widened: both degrees come from the file, and their product may not fit a u64 (one that
    // does not cannot divide the stage's ranks either).
    let folded = u128::from(etp) * u128::from(ep);
    if u128::from(ranks) % folded != 0 {
        // parallel_state.py: "world_size ... is not divisible by
        // expert_tensor_model_pipeline_parallel size".
        return Err(v.err(
            if etp_given.is_some() { "parallel.expert_tensor" } else { "parallel.expert" },
            format!(
                "expert tensor x expert parallelism ({etp} x {ep} = {folded}) is folded over a stage's {stage}: it must divide them{etp_default}"
            ),
        ));
    }
    if moe.expert_ffn_hidden % etp != 0 {
        // GroupedMLP / TEGroupedLinear: divide(moe_ffn_hidden_size, tp_size).
        return Err(v.err(
            etp_field,
            format!(
                "expert tensor parallelism splits each expert's width over {etp} ranks: model.moe.expert_ffn_hidden ({}) is not divisible by {etp}{etp_default}",
                moe.expert_ffn_hidden
            ),
        ));
    }
    if moe.biases && etp > 1 {
        // transformer_config.py: "Bias in Moe is only supported when ETP==1".
        return Err(v.err(
            etp_field,
            format!("this model's experts have biases, which Megatron-Core supports with expert tensor parallelism 1 only (\"Bias in Moe is only supported when ETP==1\"), got {etp}{etp_default}"),
        ));
    }
    if tensor > 1 && !sequence_parallel {
        return Err(v.err(
            "parallel.sequence_parallel",
            "a mixture of experts with tensor parallelism needs sequence parallelism (Megatron-Core: \"When using expert parallelism and tensor parallelism, sequence parallelism must be used\"; each tensor-parallel rank routes its own sequence shard); set parallel.sequence_parallel = true",
        ));
    }
    if framework == Framework::Fsdp2 && matches!(sharding, Sharding::Zero3 | Sharding::HybridShard) && ep > 1 {
        validate_fsdp2_expert_parallel(v, etp, etp_field)?;
    } else if (ep > 1 || tensor > 1 || etp > 1) && !matches!(sharding, Sharding::None | Sharding::Zero1) {
        return Err(v.err(
            "parallel.sharding",
            "a mixture of experts with expert or tensor parallelism is simulated with sharding = \"none\" (DDP / Megatron DDP) or \"zero1\" (distributed optimizer), or with framework = \"fsdp2\", sharding = \"full_shard\" and parallel.expert > 1 (torchtitan's FSDP2 over expert parallelism); other FSDP / ZeRO-2/3 sharding of expert parameters is not modelled yet",
        ));
    }
    Ok((ep, etp))
}

/// torchtitan's FSDP2 with expert parallelism (`framework = "fsdp2"`, `sharding =
/// "full_shard"`, `expert > 1`): the expert-parallel ranks are borrowed from the FSDP ranks.
/// `torchtitan/distributed/parallel_dims.py` `ParallelDims._validate` requires `ep` to divide
/// `dp_shard * cp * tp` (the check above: tensor x context x data ranks), and its mesh
/// (`build_mesh`: the sparse mesh `["pp", "dp_replicate", "efsdp", "ep"]` with `efsdp =
/// dp_shard * cp * tp // ep`, `ep` the innermost, consecutive ranks) keeps each routed expert
/// whole (`torchtitan/models/common/MOE_SHARDING.md`: with EP on, routed expert weights
/// `Shard(0)` on EP): expert tensor parallelism 1, whose folding is Megatron-Core's with
/// `expert_tensor = 1` ([`crate::plan::ModelParallel::expert_data_parallel`]). torchtitan's
/// earlier ETP = TP (commit aeb3a4baf, removed since) is not simulated: its dispatch differs
/// from Megatron's. Hybrid sharding (`dp_replicate` > 1, `sharding = "hybrid_shard"`) folds
/// expert parallelism over each replica's shard group instead ([`validate_hsdp_expert_parallel`]).
fn validate_fsdp2_expert_parallel(v: &V, etp: u64, etp_field: &str) -> Result<(), ScenarioError> {
    if etp != 1 {
        return Err(v.err(
            etp_field,
            format!("torchtitan's expert parallelism keeps each routed expert whole (its sparse mesh is efsdp x ep, the experts Shard(0) over ep): set parallel.expert_tensor = 1 (it defaults to parallel.tensor), got {etp}"),
        ));
    }
    Ok(())
}

/// torchtitan's HSDP with expert parallelism (`framework = "fsdp2"`, `sharding =
/// "hybrid_shard"`, `expert > 1`): `build_mesh` unflattens the data-parallel ranks into
/// `dp_replicate x dp_shard` and the sparse mesh into `dp_replicate x efsdp x ep` with `efsdp
/// = dp_shard * cp * tp // ep`, so the expert-parallel ranks are borrowed from each replica's
/// shard group (`ParallelDims._validate`: ep must divide `dp_shard * cp * tp`); each replica
/// holds every expert, sharded over its efsdp ranks, and the replicas all-reduce the experts'
/// gradient shards as they do the rest. `shard` is the resolved shard group, which holds a
/// replica's context ranks (torchtitan's fsdp mesh dp_shard x cp), so context parallelism
/// folds into efsdp as under full_shard.
pub(super) fn validate_hsdp_expert_parallel(v: &V, ep: u64, shard: u64) -> Result<(), ScenarioError> {
    if shard % ep != 0 {
        return Err(v.err(
            "parallel.expert",
            format!("under hybrid_shard expert parallelism is folded over each replica's shard group ({shard} ranks: parallel.hsdp_shard_size, or a node): it must divide it, got {ep}"),
        ));
    }
    Ok(())
}

/// `[moe] dispatcher`: how token copies reach their experts' ranks, with the checks DeepEP
/// and Megatron's flex dispatcher make (`Buffer.get_dispatch_config`: its EP sizes; an even
/// SM count across nodes, `Config::get_nvl_buffer_size_hint`).
pub(super) fn validate_dispatcher(
    v: &V,
    sec: Option<&RoutingSection>,
    model: &ModelConfig,
    parallel: &ParallelConfig,
    routing: &Routing,
    capacity: bool,
    gpu_sms: u64,
) -> Result<Option<crate::net::deepep::DeepEp>, ScenarioError> {
    let Some(sec) = sec else { return Ok(None) };
    let field = "moe.dispatcher";
    let kind = v.choice(field, sec.dispatcher.as_deref().unwrap_or("alltoall"), &["alltoall", "deepep"])?;
    if kind != "deepep" {
        if sec.deepep_sms.is_some() {
            return Err(v.err("moe.deepep_sms", "sets DeepEP's SMs: applies to moe.dispatcher = \"deepep\" only"));
        }
        return Ok(None);
    }
    let Some(moe) = &model.moe else { return Ok(None) };
    if let Some(w) = deepep_refusal(parallel, capacity) {
        return Err(v.err(field, w));
    }
    let sms = match sec.deepep_sms {
        Some(x) => v.positive("moe.deepep_sms", x)?,
        None => 20,
    };
    if sms % 2 != 0 || sms > gpu_sms / 2 {
        return Err(v.err(
            "moe.deepep_sms",
            format!("DeepEP runs two SMs per channel: an even count up to half the GPU's {gpu_sms} SMs (compute keeps the rest), got {sms}"),
        ));
    }
    Ok(Some(deepep_for(moe, sms, routing)))
}

/// Why DeepEP cannot carry this mixture of experts' tokens (None: it can): Megatron's flex
/// dispatcher only, DeepEP's EP sizes, and what stepsim does not simulate with it. The rule
/// `[moe] dispatcher` and `explain` share.
pub fn deepep_refusal(parallel: &ParallelConfig, capacity: bool) -> Option<String> {
    let mp = &parallel.model_parallel;
    let ranks = crate::net::deepep::supported_ranks();
    if parallel.framework != Framework::Megatron {
        Some("DeepEP is Megatron-Core's flex token dispatcher (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep): set parallel.framework = \"megatron\"".to_string())
    } else if mp.expert < 2 {
        Some("DeepEP moves tokens between expert-parallel ranks: set parallel.expert > 1".to_string())
    } else if !ranks.contains(&mp.expert) {
        Some(format!(
            "DeepEP has a configuration for expert-parallel groups of {} ranks only (Buffer.get_dispatch_config: \"Unsupported number of EP ranks\"), got parallel.expert = {}",
            ranks.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
            mp.expert
        ))
    } else if mp.expert_tensor > 1 {
        Some("DeepEP with expert tensor parallelism (over the expert-tensor x expert group) is not simulated yet; set parallel.expert_tensor = 1".to_string())
    } else if capacity {
        Some("DeepEP with a capacity factor is not simulated yet (Megatron's flex dispatcher is dropless); leave out moe.capacity_factor".to_string())
    } else {
        None
    }
}

/// DeepEP over `moe`'s experts and `routing`, its kernels on `sms` SMs.
pub fn deepep_for(moe: &MoeConfig, sms: u64, routing: &Routing) -> crate::net::deepep::DeepEp {
    crate::net::deepep::DeepEp {
        experts: moe.num_experts,
        top_k: moe.top_k,
        groups: moe.router_groups,
        group_topk: moe.router_group_topk,
        sms,
        shares: (!routing.is_uniform()).then(|| routing.expert_shares(moe.num_experts).into()),
    }
}

/// `[moe]`: the router's spread of tokens over the experts.
pub(super) fn validate_routing(
    v: &V,
    sec: Option<&RoutingSection>,
    model: &ModelConfig,
    parallel: &ParallelConfig,
) -> Result<(Routing, Option<Capacity>), ScenarioError> {
    let Some(sec) = sec else { return Ok((Routing::Uniform, None)) };
    let Some(moe) = &model.moe else {
        return Err(v.err(
            "moe",
            "routing applies to a mixture-of-experts model ([model.moe], or a MoE model.name / model.hf_config)",
        ));
    };
    let kind =
        v.choice("moe.routing", sec.routing.as_deref().unwrap_or("uniform"), &["uniform", "zipf", "measured"])?;
    let only = |field: &str, set: bool, kinds: &str| -> Result<(), ScenarioError> {
        if set && !kinds.split(',').any(|k| k == kind) {
            return Err(v.err(field, format!("applies to moe.routing = \"{}\" only", kinds.replace(',', "\" or \""))));
        }
        Ok(())
    };
    only("moe.zipf_exponent", sec.zipf_exponent.is_some(), "zipf")?;
    only("moe.seed", sec.seed.is_some(), "zipf")?;
    only("moe.tokens_per_expert", sec.tokens_per_expert.is_some(), "measured")?;
    let routing = match kind {
        "zipf" => {
            let exponent = sec.zipf_exponent.unwrap_or(1.0);
            if !(0.0..=10.0).contains(&exponent) {
                return Err(v.err(
                    "moe.zipf_exponent",
                    format!("must be in [0, 10] (0: uniform, 1: the classic law), got {exponent}"),
                ));
            }
            let seed = match sec.seed {
                Some(x) if x < 0 => return Err(v.err("moe.seed", format!("must be a non-negative integer, got {x}"))),
                Some(x) => x as u64,
                None => 0,
            };
            Routing::Zipf { exponent, seed }
        }
        "measured" => {
            let Some(t) = &sec.tokens_per_expert else {
                return Err(v.err(
                    "moe.tokens_per_expert",
                    "is required with moe.routing = \"measured\": one count per expert, in expert order",
                ));
            };
            if t.len() as u64 != moe.num_experts {
                return Err(v.err(
                    "moe.tokens_per_expert",
                    format!(
                        "needs one entry per expert (model.moe.num_experts = {}), got {}",
                        moe.num_experts,
                        t.len()
                    ),
                ));
            }
            if let Some(bad) = t.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
                return Err(v.err("moe.tokens_per_expert", format!("entries must be finite and >= 0, got {bad}")));
            }
            if t.iter().sum::<f64>() <= 0.0 {
                return Err(v.err("moe.tokens_per_expert", "at least one expert must receive tokens"));
            }
            Routing::Measured { tokens_per_expert: t.clone() }
        }
        _ => Routing::Uniform,
    };
    let mp = &parallel.model_parallel;
    let capacity = match sec.capacity_factor {
        Some(f) if !(f > 0.0 && f <= 1000.0) => {
            return Err(v.err(
                "moe.capacity_factor",
                format!("must be a number in (0, 1000] (1.0: each expert takes its even share), got {f}"),
            ))
        }
        Some(f) => {
            if mp.expert <= 1 {
                return Err(v.err(
                    "moe.capacity_factor",
                    "token dropping is simulated with expert parallelism (parallel.expert > 1) only",
                ));
            }
            Some(Capacity { factor: f, pad: sec.pad_to_capacity.unwrap_or(false) })
        }
        None => {
            if sec.pad_to_capacity == Some(true) {
                return Err(
                    v.err("moe.pad_to_capacity", "pads every expert to its capacity: set moe.capacity_factor too")
                );
            }
            None
        }
    };
    if (!routing.is_uniform() || capacity.is_some()) && mp.expert > 1 {
        // Each expert-parallel rank of each stage is simulated as its own rank class.
        let classes = mp.expert * mp.pipeline;
        if classes > MAX_JITTER_RANKS {
            return Err(v.err(
                "moe.routing",
                format!("uneven routing simulates every expert-parallel rank of every pipeline stage: at most {MAX_JITTER_RANKS}, got {classes} (expert {} x pipeline {})", mp.expert, mp.pipeline),
            ));
        }
    }
    Ok((routing, capacity))
}

/// `[model.mla]`: multi-head latent attention, the section's fields over the config's.
pub(super) fn validate_mla(
    v: &V,
    m: &ModelSection,
    hf: Option<&HfModel>,
    family: Family,
) -> Result<Option<MlaConfig>, ScenarioError> {
    let base = hf.and_then(|h| h.mla.clone());
    let Some(sec) = &m.mla else { return Ok(base) };
    if family != Family::Llama {
        return Err(v.err(
            "model.mla",
            "multi-head latent attention applies to the llama family; set model.family = \"llama\"",
        ));
    }
    let num = |field: &str, own: Option<i64>, from: Option<u64>| -> Result<u64, ScenarioError> {
        match (own, from) {
            (Some(x), _) => v.bounded(field, x, limits::MAX_HIDDEN),
            (None, Some(x)) => Ok(x),
            (None, None) => {
                Err(v.err(field, "is required in [model.mla] (or give a DeepSeek model.name / model.hf_config)"))
            }
        }
    };
    let q_lora_rank = match sec.q_lora_rank {
        Some(0) => 0,
        Some(x) => v.bounded("model.mla.q_lora_rank", x, limits::MAX_HIDDEN)?,
        None => base.as_ref().map_or(0, |b| b.q_lora_rank),
    };
    let rope = num("model.mla.qk_rope_head_dim", sec.qk_rope_head_dim, base.as_ref().map(|b| b.qk_rope_head_dim))?;
    if rope % 2 != 0 {
        return Err(v.err("model.mla.qk_rope_head_dim", format!("rotary embeddings need an even width, got {rope}")));
    }
    Ok(Some(MlaConfig {
        q_lora_rank,
        kv_lora_rank: num("model.mla.kv_lora_rank", sec.kv_lora_rank, base.as_ref().map(|b| b.kv_lora_rank))?,
        qk_nope_head_dim: num(
            "model.mla.qk_nope_head_dim",
            sec.qk_nope_head_dim,
            base.as_ref().map(|b| b.qk_nope_head_dim),
        )?,
        qk_rope_head_dim: rope,
        v_head_dim: num("model.mla.v_head_dim", sec.v_head_dim, base.as_ref().map(|b| b.v_head_dim))?,
    }))
}

/// `[moe] aux_loss`: which auxiliary load-balancing losses the framework's router computes.
/// Megatron-Core runs any of its per-block losses (`--moe-router-load-balancing-type` with
/// `--moe-aux-loss-coeff` above 0); Hugging Face model code one, over every block at the end
/// of the forward, whenever the config's `output_router_logits` is set (which is the default
/// here); torchtitan has none.
pub(super) fn validate_aux_loss(
    v: &V,
    sec: Option<&RoutingSection>,
    parallel: &ParallelConfig,
    hf_router_logits: bool,
) -> Result<crate::model::AuxLoss, ScenarioError> {
    use crate::model::AuxLoss;
    const FIELD: &str = "moe.aux_loss";
    let fw = parallel.framework;
    let names = match sec.and_then(|s| s.aux_loss.as_ref()) {
        Some(n) => n.0.clone(),
        None if hf_router_logits && fw != Framework::Megatron && fw != Framework::Fsdp2 => vec!["aux_loss".into()],
        None => return Ok(AuxLoss::None),
    };
    if names.is_empty() {
        return Err(v.err(FIELD, "names no loss: give \"none\" or the losses the router computes"));
    }
    for n in &names {
        if n != "none" && !AuxLoss::MEGATRON_TYPES.contains(&n.as_str()) {
            return Err(v.err(
                FIELD,
                format!("unknown value \"{n}\"; allowed: \"none\", \"aux_loss\", \"seq_aux_loss\", \"global_aux_loss\" (one, or a list of the last three)"),
            ));
        }
        if names.iter().filter(|m| *m == n).count() > 1 {
            return Err(v.err(FIELD, format!("names \"{n}\" twice")));
        }
    }
    if names.iter().any(|n| n == "none") {
        if names.len() > 1 {
            return Err(v.err(FIELD, "\"none\" goes alone, not in a list with losses"));
        }
        return Ok(AuxLoss::None);
    }
    match fw {
        Framework::Megatron => {
            let local = names.iter().filter(|n| *n != "global_aux_loss").count() as u8;
            Ok(AuxLoss::Megatron { local, global: names.iter().any(|n| n == "global_aux_loss") })
        }
        Framework::Fsdp2 => Err(v.err(
            FIELD,
            "torchtitan's mixture of experts has no auxiliary loss (it balances the experts with a bias updated by the optimizer, load_balance_coeff, which costs nothing per token); use \"none\"",
        )),
        _ => {
            if let Some(n) = names.iter().find(|n| *n != "aux_loss") {
                return Err(v.err(
                    FIELD,
                    format!("\"{n}\" is Megatron-Core's (parallel.framework = \"megatron\"); Hugging Face model code computes one loss, \"aux_loss\" (load_balancing_loss_func, with output_router_logits = true)"),
                ));
            }
            if parallel.model_parallel.pipeline > 1 {
                return Err(v.err(
                    FIELD,
                    format!("Hugging Face's load-balancing loss reads every block's router logits at the end of the forward, which a pipeline of {} stages splits over GPUs (its model code is not a pipeline module); use \"none\", or parallel.pipeline = 1", parallel.model_parallel.pipeline),
                ));
            }
            Ok(AuxLoss::AllBlocks)
        }
    }
}
