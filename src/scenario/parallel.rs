//! `[parallel]`'s Megatron-LM dimensions: tensor, sequence and pipeline parallelism, the
//! pipeline schedule and stage layers, and what they compose with.

use super::*;
use crate::model::ContextComm;

/// `[parallel]`'s Megatron-LM degrees: they must divide the GPUs, the heads (and KV heads),
/// the vocabulary-parallel split and the layers, as Megatron's own argument checks demand.
pub(super) fn validate_model_parallel(
    v: &V,
    p: &ParallelSection,
    model: &ModelConfig,
    gpus: u64,
    gpus_per_node: u64,
    sharding: Sharding,
) -> Result<ModelParallel, ScenarioError> {
    let tensor = match p.tensor {
        Some(x) => v.positive("parallel.tensor", x)?,
        None => 1,
    };
    let pipeline = match p.pipeline {
        Some(x) => v.positive("parallel.pipeline", x)?,
        None => 1,
    };
    let context = match p.context {
        Some(x) => v.positive("parallel.context", x)?,
        None => 1,
    };
    // In u128: the product of three positive i64 values cannot wrap there.
    let product = u128::from(tensor) * u128::from(pipeline) * u128::from(context);
    if product > u128::from(gpus) || u128::from(gpus) % product != 0 {
        let (field, cp) = if context > 1 {
            ("parallel.context", format!(" x context ({context})"))
        } else {
            ("parallel.tensor", String::new())
        };
        return Err(v.err(
            field,
            format!(
                "tensor ({tensor}) x pipeline ({pipeline}){cp} = {product} must divide hardware.gpus ({gpus}); the data-parallel degree is gpus / (tensor x pipeline{})",
                if context > 1 { " x context" } else { "" }
            ),
        ));
    }
    if tensor > gpus_per_node {
        return Err(v.err(
            "parallel.tensor",
            format!(
                "tensor parallelism runs inside a node: at most hardware.gpus_per_node ({gpus_per_node}), got {tensor}"
            ),
        ));
    }
    if model.n_heads % tensor != 0 || model.n_kv_heads % tensor != 0 {
        return Err(v.err(
            "parallel.tensor",
            format!(
                "must divide model.n_heads ({}) and the KV heads ({}), got {tensor}",
                model.n_heads, model.n_kv_heads
            ),
        ));
    }
    if model.ffn_hidden % tensor != 0 || model.vocab % tensor != 0 {
        return Err(v.err(
            "parallel.tensor",
            format!(
                "must divide model.ffn_hidden ({}) and model.vocab ({}) (pad the vocabulary as Megatron's --make-vocab-size-divisible-by does), got {tensor}",
                model.ffn_hidden, model.vocab
            ),
        ));
    }
    let sequence_parallel = p.sequence_parallel.unwrap_or(false);
    if sequence_parallel && tensor == 1 {
        return Err(v.err("parallel.sequence_parallel", "needs tensor parallelism (parallel.tensor > 1)"));
    }
    let schedule = match v.choice(
        "parallel.schedule",
        p.schedule.as_deref().unwrap_or(if p.virtual_stages.unwrap_or(1) > 1 { "interleaved-1f1b" } else { "1f1b" }),
        &["gpipe", "1f1b", "interleaved-1f1b", "dualpipe", "dualpipev"],
    )? {
        "gpipe" => PipelineSchedule::Gpipe,
        "1f1b" => PipelineSchedule::OneFOneB,
        "dualpipe" => PipelineSchedule::DualPipe,
        "dualpipev" => PipelineSchedule::DualPipeV,
        _ => PipelineSchedule::Interleaved,
    };
    if schedule == PipelineSchedule::DualPipeV && pipeline < 2 {
        return Err(v.err("parallel.pipeline", "DualPipeV needs at least 2 pipeline ranks"));
    }
    if schedule == PipelineSchedule::DualPipe && (pipeline < 2 || pipeline % 2 != 0) {
        return Err(v.err(
            "parallel.pipeline",
            format!("DualPipe feeds micro-batches from both ends of the pipeline and needs an even number of stages (at least 2), got {pipeline}"),
        ));
    }
    let virtual_stages = match p.virtual_stages {
        Some(x) => v.positive("parallel.virtual_stages", x)?,
        None if schedule == PipelineSchedule::DualPipeV => 2,
        None => 1,
    };
    if schedule == PipelineSchedule::DualPipeV && virtual_stages != 2 {
        return Err(v.err(
            "parallel.virtual_stages",
            format!("DualPipeV holds two chunks per rank (the V's way down and back up): 2, or leave it unset; got {virtual_stages}"),
        ));
    }
    if virtual_stages > 1 && !matches!(schedule, PipelineSchedule::Interleaved | PipelineSchedule::DualPipeV) {
        return Err(v.err("parallel.virtual_stages", "model chunks per stage need schedule = \"interleaved-1f1b\""));
    }
    if schedule == PipelineSchedule::Interleaved && (virtual_stages < 2 || pipeline < 2) {
        return Err(v.err(
            "parallel.virtual_stages",
            "interleaved-1f1b needs parallel.pipeline >= 2 and parallel.virtual_stages >= 2 (model chunks per stage)",
        ));
    }
    let layers = model.n_layers;
    let stage_layers = match &p.stage_layers {
        None => Vec::new(),
        Some(list) => {
            // One entry per virtual stage, in model order (Megatron's
            // --pipeline-model-parallel-layout with its stages' decoder layers counted): the
            // first may be 0, a stage of the embedding alone (the layout's "E|"), and the last,
            // a stage of the final norm, the head and the loss alone ("|L").
            let chunks = pipeline * virtual_stages;
            if list.len() as u64 != chunks {
                let what = if virtual_stages > 1 {
                    format!("one entry per virtual stage (pipeline x virtual_stages = {chunks}), in model order")
                } else {
                    format!("one entry per pipeline stage ({pipeline})")
                };
                return Err(v.err("parallel.stage_layers", format!("needs {what}, got {}", list.len())));
            }
            let mut out = Vec::new();
            for (j, &x) in list.iter().enumerate() {
                let last = j + 1 == list.len();
                if x < 0 || (x == 0 && !last && j != 0) || (x == 0 && pipeline < 2) {
                    return Err(v.err(
                        "parallel.stage_layers",
                        format!("every stage needs at least one layer, but the first, which may hold only the embedding (0), and the last, which may hold only the head and the loss (0); got {x} at entry {j}"),
                    ));
                }
                out.push(x as u64);
            }
            let sum: u64 = out.iter().sum();
            if sum != layers {
                return Err(v.err(
                    "parallel.stage_layers",
                    format!("the stages' layers add up to {sum}, but model.n_layers is {layers}"),
                ));
            }
            out
        }
    };
    if stage_layers.is_empty() && layers < pipeline * virtual_stages {
        return Err(v.err(
            "parallel.pipeline",
            format!(
                "{} pipeline stages x {virtual_stages} chunks need at least as many layers, model.n_layers is {layers}",
                pipeline
            ),
        ));
    }
    if stage_layers.is_empty() && schedule == PipelineSchedule::Interleaved && layers % (pipeline * virtual_stages) != 0
    {
        return Err(v.err(
            "parallel.virtual_stages",
            format!(
                "interleaving needs model.n_layers ({layers}) divisible by pipeline x virtual_stages ({})",
                pipeline * virtual_stages
            ),
        ));
    }
    if pipeline > 1 && sharding == Sharding::HybridShard {
        return Err(v.err(
            "parallel.sharding",
            "hybrid_shard with pipeline parallelism is not simulated yet; use \"full_shard\" or \"shard_grad_op\" (FSDP over each stage's data-parallel ranks, as torchtitan does), \"zero1\" or \"none\"",
        ));
    }
    if tensor > 1 && sharding == Sharding::HybridShard {
        return Err(v.err(
            "parallel.sharding",
            "hybrid_shard with tensor parallelism is not modelled; use \"full_shard\" over the data-parallel ranks",
        ));
    }
    let overlap_p2p = p.overlap_p2p_communication.unwrap_or(false);
    if p.overlap_p2p_communication.is_some() && pipeline < 2 {
        return Err(v.err(
            "parallel.overlap_p2p_communication",
            "only applies to pipeline parallelism (parallel.pipeline > 1)",
        ));
    }
    Ok(ModelParallel {
        tensor,
        sequence_parallel,
        pipeline,
        virtual_stages,
        schedule,
        stage_layers,
        overlap_p2p,
        expert: 1,
        expert_tensor: 1,
        context,
        context_comm: crate::model::ContextComm::Ring,
    })
}

/// `[parallel] context`: what context parallelism is simulated with. Megatron-Core splits each
/// sequence into 2 x context chunks (rank i holds chunks i and 2 x context - 1 - i, which
/// balances causal attention), so the sequence must divide by 2 x context, and with sequence
/// parallelism each rank's share again by the tensor-parallel degree.
#[allow(clippy::too_many_arguments)]
pub(super) fn validate_context(
    v: &V,
    p: &ParallelSection,
    mp: &ModelParallel,
    model: &ModelConfig,
    framework: Framework,
    attention: Attention,
    seq_len: u64,
    job: JobKind,
) -> Result<ContextComm, ScenarioError> {
    let cp = mp.context;
    if cp == 1 {
        for (field, set) in [
            ("parallel.context_rotate", p.context_rotate.is_some()),
            ("parallel.context_comm", p.context_comm.is_some()),
        ] {
            if set {
                return Err(v.err(field, "applies to context parallelism (parallel.context > 1)"));
            }
        }
        return Ok(ContextComm::Ring);
    }
    let refuse = |msg: String| Err(v.err("parallel.context", msg));
    if job != JobKind::Train {
        return refuse("context parallelism is simulated for training jobs only".into());
    }
    if !framework.is_pytorch() && p.context_rotate.is_some() {
        return Err(v.err(
            "parallel.context_rotate",
            "is PyTorch's context_parallel option (framework = \"fsdp\"); Megatron-Core sets parallel.context_comm, DeepSpeed runs Ulysses",
        ));
    }
    if framework != Framework::Megatron && p.context_comm.is_some() {
        return Err(v.err(
            "parallel.context_comm",
            "is Megatron-Core's --cp-comm-type (framework = \"megatron\"); under FSDP set parallel.context_rotate",
        ));
    }
    let comm = match framework {
        Framework::Megatron => {
            match v.choice("parallel.context_comm", p.context_comm.as_deref().unwrap_or("p2p"), &["p2p", "a2a"])? {
                "p2p" => ContextComm::Ring,
                _ => ContextComm::AllToAll,
            }
        }
        Framework::Fsdp | Framework::Fsdp1 | Framework::Fsdp2 => {
            match v.choice(
                "parallel.context_rotate",
                p.context_rotate.as_deref().unwrap_or("allgather"),
                &["allgather", "alltoall"],
            )? {
                "allgather" => ContextComm::AllGather,
                _ => ContextComm::Ring,
            }
        }
        // DeepSpeed's sequence parallelism is Ulysses (deepspeed.sequence.layer.DistributedAttention).
        Framework::Deepspeed => ContextComm::AllToAll,
    };
    if comm == ContextComm::AllToAll {
        let heads = model.n_heads / mp.tensor.max(1);
        let kv = model.n_kv_heads / mp.tensor.max(1);
        if heads % cp != 0 || kv % cp != 0 {
            return refuse(format!(
                "Ulysses all-to-all gives each of the {cp} ranks 1/{cp} of the heads: this rank's {heads} query and {kv} key-value heads are not divisible by {cp}"
            ));
        }
    }
    if attention != Attention::Flash {
        return refuse("context parallelism runs flash (fused) attention blocks around the ring; set training.attention = \"flash\"".into());
    }
    if model.mla.is_some() && framework != Framework::Megatron {
        // Megatron-Core runs it (`multi_latent_attention.py` `MLASelfAttention`: the latent
        // up-projected into per-head keys and values before Transformer Engine's attention,
        // the rotary key's position offsets taken per context-parallel rank); Transformer
        // Engine's ring sends the keys and values flattened side by side
        // (`context_parallel.py`: `torch.cat((k.view(-1), v.view(-1)))`), so MLA's unequal
        // key and value widths ride as they are. PyTorch's context parallelism around SDPA
        // is not simulated for them.
        return refuse(
            "context parallelism with multi-head latent attention is simulated as Megatron-Core runs it (parallel.framework = \"megatron\"); use parallel.context = 1 here".into(),
        );
    }
    if model.moe.is_some() && !matches!(framework, Framework::Megatron | Framework::Fsdp2) {
        // Megatron-Core folds the context-parallel ranks into the expert layout (see
        // `moe.rs` `validate_expert_parallel`), and so does torchtitan (FSDP2): its sparse mesh
        // unflattens dp_shard x cp x tp into efsdp x ep with ep innermost
        // (`parallel_dims.py` `build_mesh`), the same consecutive expert-parallel groups and
        // efsdp = dp_shard * cp * tp // ep, and each rank routes its own share of each
        // sequence. FSDP1 / DDP model code and DeepSpeed-Ulysses with DeepSpeed-MoE are other
        // layouts, not modelled.
        return refuse(format!(
            "context parallelism with a mixture of experts is simulated as Megatron-Core or torchtitan run it (parallel.framework = \"megatron\" or \"fsdp2\"); {}'s layout of experts over context-parallel ranks is not modelled",
            match framework {
                Framework::Deepspeed => "DeepSpeed",
                _ => "FSDP1 / DDP model code",
            }
        ));
    }
    if seq_len % (2 * cp) != 0 {
        return Err(v.err(
            "training.seq_len",
            format!("context parallelism splits each sequence into 2 x {cp} load-balanced chunks: {seq_len} is not divisible by {}", 2 * cp),
        ));
    }
    if mp.sequence_parallel && (seq_len / cp) % mp.tensor != 0 {
        return Err(v.err(
            "training.seq_len",
            format!(
                "each context-parallel rank's {} tokens are split again over {} sequence-parallel ranks: not divisible",
                seq_len / cp,
                mp.tensor
            ),
        ));
    }
    Ok(comm)
}
