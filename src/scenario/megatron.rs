//! `[megatron]`: Megatron-LM's communication-overlap flags, validated against the
//! parallelism they need, as Megatron's own argument checks do
//! (`megatron/training/arguments.py`, `validate_args`).

use super::*;
use crate::plan::{
    Checkpointing, MegatronConfig, OptimizerKind, ParallelConfig, PipelineSchedule, Precision, PrecisionAware,
    RecomputeModule, StateDtype, TrainingConfig,
};

/// A bucket of more elements than this is refused (2^40 elements of FP32 is 4 TB).
const MAX_BUCKET_ELEMENTS: f64 = (1u64 << 40) as f64;

pub(super) fn validate_megatron(
    v: &V,
    m: Option<&MegatronSection>,
    framework: Framework,
    sharding: Sharding,
    mp: &ModelParallel,
) -> Result<MegatronConfig, ScenarioError> {
    let mut out = MegatronConfig::default();
    let Some(m) = m else { return Ok(out) };
    if framework != Framework::Megatron {
        return Err(v.err(
            "megatron",
            "the [megatron] section sets Megatron-LM's overlap flags; it needs parallel.framework = \"megatron\"",
        ));
    }
    out.overlap_grad_reduce = m.overlap_grad_reduce.unwrap_or(false);
    out.overlap_param_gather = m.overlap_param_gather.unwrap_or(false);
    out.tp_comm_overlap = m.tp_comm_overlap.unwrap_or(false);
    out.overlap_moe_expert_parallel_comm = m.overlap_moe_expert_parallel_comm.unwrap_or(false);
    if out.overlap_param_gather && sharding != Sharding::Zero1 {
        return Err(v.err(
            "megatron.overlap_param_gather",
            "--overlap-param-gather is only supported with the distributed optimizer (parallel.sharding = \"zero1\")",
        ));
    }
    if out.overlap_param_gather && !out.overlap_grad_reduce {
        return Err(v.err(
            "megatron.overlap_param_gather",
            "--overlap-grad-reduce should be turned on when using --overlap-param-gather (set megatron.overlap_grad_reduce = true)",
        ));
    }
    if out.tp_comm_overlap && !(mp.tensor > 1 && mp.sequence_parallel) {
        return Err(v.err(
            "megatron.tp_comm_overlap",
            "tensor-parallel communication overlap needs tensor parallelism with sequence parallelism (parallel.tensor > 1 and parallel.sequence_parallel = true)",
        ));
    }
    if let Some(x) = m.ddp_bucket_size {
        if !((1.0..=MAX_BUCKET_ELEMENTS).contains(&x) && x.fract() == 0.0) {
            return Err(v.err(
                "megatron.ddp_bucket_size",
                format!("must be a whole number of elements from 1 to 2^40 (Megatron's default is max(4e7, 1e6 x data-parallel size)), got {x}"),
            ));
        }
        if !out.overlap_grad_reduce {
            return Err(v.err(
                "megatron.ddp_bucket_size",
                "buckets exist only with --overlap-grad-reduce (Megatron reduces one bucket otherwise); set megatron.overlap_grad_reduce = true",
            ));
        }
        out.bucket_size = Some(x as u64);
    }
    Ok(out)
}

/// `--overlap-moe-expert-parallel-comm` against the rest of the job, as Megatron-Core's
/// `TransformerConfig.__post_init__` checks it (NVIDIA/Megatron-LM d98e8a6,
/// megatron/core/transformer/transformer_config.py).
pub(super) fn check_ep_overlap(
    v: &V,
    model: &ModelConfig,
    parallel: &ParallelConfig,
    training: &TrainingConfig,
) -> Result<(), ScenarioError> {
    if !parallel.megatron.overlap_moe_expert_parallel_comm {
        return Ok(());
    }
    match ep_overlap_refusal(model, parallel, training) {
        Some(w) => Err(v.err("megatron.overlap_moe_expert_parallel_comm", w)),
        None => Ok(()),
    }
}

/// Why Megatron refuses `--overlap-moe-expert-parallel-comm` for this job (None: it runs
/// it), in Megatron's words with the field to change. The rule `[megatron]` and `explain`
/// share.
pub fn ep_overlap_refusal(model: &ModelConfig, parallel: &ParallelConfig, training: &TrainingConfig) -> Option<String> {
    let mp = &parallel.model_parallel;
    if mp.expert < 2 {
        Some("overlap_moe_expert_parallel_comm is only supported with expert model parallelism (set parallel.expert > 1 on a mixture-of-experts model)".to_string())
    } else if mp.schedule.is_dualpipe() {
        Some("DualPipe (and DualPipeV) already runs each steady-state forward beside the other direction's backward with their all-to-alls under each other's compute; leave megatron.overlap_moe_expert_parallel_comm unset".to_string())
    } else if mp.pipeline > 1 && mp.schedule != PipelineSchedule::Interleaved {
        Some("virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1 (set parallel.schedule = \"interleaved-1f1b\" with parallel.virtual_stages)".to_string())
    } else if training.checkpointing == Checkpointing::Full {
        Some("disable full recomputation when enabling overlap_moe_expert_parallel_comm (training.activation_checkpointing = \"none\" or \"selective\")".to_string())
    } else if training.checkpointing == Checkpointing::Selective
        && training.recompute_modules.contains(&RecomputeModule::Moe)
    {
        Some("disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm (drop \"moe\" from training.recompute_modules)".to_string())
    } else if !matches!(training.precision.compute, Dtype::Bf16 | Dtype::Fp16) {
        Some(format!("overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model; training.precision \"{}\" computes in {}", training.precision.preset, training.precision.compute.name()))
    } else if model.mtp.as_ref().is_some_and(|m| m.layers > 1) {
        Some(
            "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm ([model.mtp] layers = 1)"
                .to_string(),
        )
    } else {
        None
    }
}

/// `[megatron] use_precision_aware_optimizer` and its dtypes, applied to the precision policy,
/// with Megatron's own checks (`OptimizerConfig.__post_init__`, `get_megatron_optimizer`,
/// `validate_args` in megatron/training/arguments.py).
pub(super) fn apply_precision_aware(
    v: &V,
    m: Option<&MegatronSection>,
    sharding: Sharding,
    optimizer: OptimizerKind,
    precision: &mut Precision,
) -> Result<(), ScenarioError> {
    let Some(m) = m else { return Ok(()) };
    let on = m.use_precision_aware_optimizer.unwrap_or(false);
    let dtype_fields = [
        ("megatron.main_grads_dtype", &m.main_grads_dtype),
        ("megatron.main_params_dtype", &m.main_params_dtype),
        ("megatron.exp_avg_dtype", &m.exp_avg_dtype),
        ("megatron.exp_avg_sq_dtype", &m.exp_avg_sq_dtype),
    ];
    if !on {
        for (field, val) in dtype_fields {
            if val.as_deref().is_some_and(|d| d != "fp32") {
                return Err(v.err(
                    field,
                    "a dtype other than fp32 needs --use-precision-aware-optimizer (set megatron.use_precision_aware_optimizer = true)",
                ));
            }
        }
        if m.store_param_remainders.is_some() {
            return Err(v.err(
                "megatron.store_param_remainders",
                "applies to the precision-aware optimizer only (set megatron.use_precision_aware_optimizer = true)",
            ));
        }
        return Ok(());
    }
    if sharding != Sharding::Zero1 {
        return Err(v.err(
            "megatron.use_precision_aware_optimizer",
            "--use-precision-aware-optimizer only supported with distributed optimizer (parallel.sharding = \"zero1\")",
        ));
    }
    if !matches!(optimizer, OptimizerKind::Adam | OptimizerKind::AdamW) {
        return Err(v.err(
            "megatron.use_precision_aware_optimizer",
            "--use-precision-aware-optimizer only supported with adam (training.optimizer = \"adam\" or \"adamw\")",
        ));
    }
    if precision.master.is_none() {
        return Err(v.err(
            "megatron.use_precision_aware_optimizer",
            format!(
                "the precision-aware optimizer keeps a master copy of 16-bit parameters; training.precision \"{}\" has none (use \"bf16-mixed-adam\" or \"bf16-mixed-adam-fp32-grads\")",
                precision.preset
            ),
        ));
    }
    let pick = |field: &str, val: &Option<String>, allowed: &[&str]| -> Result<String, ScenarioError> {
        let d = val.as_deref().unwrap_or("fp32");
        if allowed.contains(&d) {
            Ok(d.to_string())
        } else {
            Err(v.err(
                field,
                format!(
                    "unknown dtype \"{d}\"; allowed: {}",
                    allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
                ),
            ))
        }
    };
    let grads = pick("megatron.main_grads_dtype", &m.main_grads_dtype, &["fp32", "bf16"])?;
    let params = pick("megatron.main_params_dtype", &m.main_params_dtype, &["fp32", "fp16"])?;
    let states = ["fp32", "fp16", "bf16", "fp8"];
    let exp_avg = pick("megatron.exp_avg_dtype", &m.exp_avg_dtype, &states)?;
    let exp_avg_sq = pick("megatron.exp_avg_sq_dtype", &m.exp_avg_sq_dtype, &states)?;
    if m.main_grads_dtype.is_some() {
        // Megatron's gradient buffer is in main_grads_dtype (bf16: no FP32 accumulation).
        let g = Dtype::parse(&grads).unwrap_or(Dtype::Fp32);
        if g == Dtype::Bf16 && precision.grad == Dtype::Fp32 {
            return Err(v.err(
                "megatron.main_grads_dtype",
                format!(
                    "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32 is set, and training.precision \"{}\" (or training.grad_dtype) accumulates gradients in fp32; use training.precision = \"bf16-mixed-adam\"",
                    precision.preset
                ),
            ));
        }
        precision.grad = g;
    }
    let main_params = Dtype::parse(&params).unwrap_or(Dtype::Fp32);
    precision.master = Some(main_params);
    precision.aware = Some(PrecisionAware {
        main_params,
        store_param_remainders: m.store_param_remainders.unwrap_or(true),
        exp_avg: StateDtype::parse(&exp_avg).unwrap_or(StateDtype::Fp32),
        exp_avg_sq: StateDtype::parse(&exp_avg_sq).unwrap_or(StateDtype::Fp32),
    });
    Ok(())
}

/// `[megatron] activation_func_fp8_input_store` (`--activation-func-fp8-input-store`):
/// Megatron-Core's `TransformerConfig.__post_init__` allows it for SwiGLU only ("Storing
/// activation input in FP8 is supported only for SwiGLU.").
pub(super) fn fp8_input_store(v: &V, m: Option<&MegatronSection>, model: &ModelConfig) -> Result<bool, ScenarioError> {
    let on = m.and_then(|m| m.activation_func_fp8_input_store).unwrap_or(false);
    if on && model.family != crate::model::Family::Llama {
        return Err(v.err(
            "megatron.activation_func_fp8_input_store",
            "storing the activation's input in FP8 is supported only for SwiGLU (a llama-family MLP); this model's MLP is GELU",
        ));
    }
    Ok(on)
}
