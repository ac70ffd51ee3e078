//! `[job]` and `[inference]`: which kind of job a file describes, and an inference job's
//! batch, lengths, weight and KV formats.

use super::*;

/// `[job] kind`, and the sections it requires and rules out.
pub(super) fn job_kind(v: &V, f: &ScenarioFile) -> Result<JobKind, ScenarioError> {
    let kind = f.job.as_ref().and_then(|j| j.kind.as_deref()).unwrap_or("train");
    let job = match v.choice("job.kind", kind, &["train", "inference", "finetune-lora"])? {
        "train" => JobKind::Train,
        "inference" => JobKind::Inference,
        _ => JobKind::FinetuneLora,
    };
    match (job, f.lora.is_some()) {
        (JobKind::FinetuneLora, false) => {
            return Err(v.err("lora", "missing section [lora] (job.kind = \"finetune-lora\" needs the adapters' rank and target_modules, or their defaults: write [lora] with no keys)"))
        }
        (JobKind::Train | JobKind::Inference, true) => {
            return Err(v.err("lora", "[lora] applies to LoRA fine-tuning: add [job] kind = \"finetune-lora\" or remove it"))
        }
        _ => {}
    }
    let job_train = if job == JobKind::FinetuneLora { JobKind::Train } else { job };
    match (job_train, f.training.is_some(), f.inference.is_some()) {
        (JobKind::Train, _, true) => Err(v.err(
            "inference",
            "[inference] applies to inference jobs: add [job] kind = \"inference\" (and drop [training]) or remove it",
        )),
        (JobKind::Train, false, false) => {
            Err(v.err("training", "missing section [training] (a training job needs micro_batch and seq_len)"))
        }
        (JobKind::FinetuneLora, _, _) => Ok(job),
        (JobKind::Inference, true, _) => Err(v.err(
            "training",
            "[training] does not apply to job.kind = \"inference\": the batch and lengths go in [inference]",
        )),
        (JobKind::Inference, false, false) => Err(v.err(
            "inference",
            "missing section [inference] (job.kind = \"inference\" needs batch, prompt_len and gen_len)",
        )),
        _ => Ok(job),
    }
}

pub(super) fn inference_lengths(v: &V, i: &InferenceSection) -> Result<(i64, i64, i64), ScenarioError> {
    let batch = v.positive("inference.batch", i.batch)?;
    let prompt = v.positive("inference.prompt_len", i.prompt_len)?;
    let gen = v.positive("inference.gen_len", i.gen_len)?;
    const MAX: u64 = 1 << 22;
    for (field, x) in [("inference.batch", batch), ("inference.prompt_len", prompt), ("inference.gen_len", gen)] {
        if x > MAX {
            return Err(v.err(field, format!("at most {MAX} is simulated, got {x}")));
        }
    }
    Ok((batch as i64, prompt as i64, gen as i64))
}

/// The training section an inference job stands for: one step of batch x prompt_len.
pub(super) fn inference_standin(batch: i64, prompt_len: i64) -> TrainingSection {
    // Its dtypes are replaced by the job's once [inference] is validated (FP16: every GPU has it).
    TrainingSection {
        micro_batch: batch,
        seq_len: prompt_len,
        precision: Some("bf16".into()),
        compute_dtype: Some("fp16".into()),
        ..Default::default()
    }
}

pub(super) fn validate_inference(
    v: &V,
    i: &InferenceSection,
    cluster: &Cluster,
    parallel: &ParallelConfig,
    jitter: bool,
) -> Result<crate::infer::InferenceConfig, ScenarioError> {
    use crate::infer::{InferenceConfig, KvCacheKind};
    use crate::model::{KvDtype, WeightFormat};
    let (batch, prompt_len, gen_len) = inference_lengths(v, i)?;
    if parallel.sharding != Sharding::None {
        return Err(v.err("parallel.sharding", "inference keeps whole (or tensor-parallel) weights on every GPU: sharding (FSDP / ZeRO) applies to training; use \"none\" with parallel.tensor for tensor parallelism"));
    }
    let mp = &parallel.model_parallel;
    if mp.pipeline > 1 {
        return Err(v.err("parallel.pipeline", "pipeline-parallel inference is not simulated yet; use parallel.tensor"));
    }
    if mp.sequence_parallel {
        return Err(v.err("parallel.sequence_parallel", "sequence parallelism applies to training; remove it"));
    }
    if jitter {
        return Err(v.err("jitter", "per-rank jitter is simulated for training steps only; remove [jitter]"));
    }
    let weights = i.weights.as_deref().unwrap_or("bf16");
    let weights = v.choice("inference.weights", weights, &["bf16", "fp16", "int8", "int4", "nf4"])?;
    if i.group_size.is_some() && weights != "int4" {
        return Err(v.err("inference.group_size", "only applies to weights = \"int4\" (GPTQ / AWQ groups)"));
    }
    if i.double_quant.is_some() && weights != "nf4" {
        return Err(v.err("inference.double_quant", "only applies to weights = \"nf4\" (bitsandbytes)"));
    }
    let format = match weights {
        "int8" => WeightFormat::Int8,
        "int4" => WeightFormat::Int4 { group: v.positive("inference.group_size", i.group_size.unwrap_or(128))? },
        "nf4" => WeightFormat::Nf4 { double_quant: i.double_quant.unwrap_or(false) },
        _ => WeightFormat::Half,
    };
    let default_compute = if weights == "fp16" { "fp16" } else { "bf16" };
    let compute_name = i.compute_dtype.as_deref().unwrap_or(default_compute);
    let compute = match v.choice("inference.compute_dtype", compute_name, &["bf16", "fp16"])? {
        "fp16" => Dtype::Fp16,
        _ => Dtype::Bf16,
    };
    if matches!(weights, "bf16" | "fp16") && weights != compute_name {
        return Err(v.err(
            "inference.compute_dtype",
            format!("{weights} weights compute in {weights}; set compute_dtype = \"{weights}\" or leave it out"),
        ));
    }
    if compute == Dtype::Bf16 && cluster.gpu.bf16_flops.is_none() {
        let field = if i.compute_dtype.is_some() { "inference.compute_dtype" } else { "inference.weights" };
        return Err(
            v.err(field, format!("{} has no BF16 tensor cores; use compute_dtype = \"fp16\"", cluster.gpu.name))
        );
    }
    let kv_name = i.kv_cache_dtype.as_deref().unwrap_or(compute.name());
    let kv_dtype = if kv_name == "fp8" {
        KvDtype::Fp8
    } else if kv_name == compute.name() {
        KvDtype::Half
    } else {
        return Err(v.err(
            "inference.kv_cache_dtype",
            format!(
                "unknown or mismatched dtype \"{kv_name}\"; allowed: \"{}\" (the compute dtype), \"fp8\"",
                compute.name()
            ),
        ));
    };
    let kv_cache =
        match v.choice("inference.kv_cache", i.kv_cache.as_deref().unwrap_or("static"), &["static", "dynamic"])? {
            "dynamic" => KvCacheKind::Dynamic,
            _ => KvCacheKind::Static,
        };
    if kv_cache == KvCacheKind::Dynamic && kv_dtype == KvDtype::Fp8 {
        return Err(v.err(
            "inference.kv_cache_dtype",
            "an FP8 KV cache is preallocated (vLLM, TensorRT-LLM): use kv_cache = \"static\"",
        ));
    }
    let cuda_graphs = i.cuda_graphs.unwrap_or(kv_cache == KvCacheKind::Static);
    if cuda_graphs && kv_cache == KvCacheKind::Dynamic {
        return Err(v.err("inference.cuda_graphs", "a CUDA graph replays fixed shapes; a dynamic cache grows every step: use kv_cache = \"static\" or cuda_graphs = false"));
    }
    Ok(InferenceConfig {
        batch: batch as u64,
        prompt_len: prompt_len as u64,
        gen_len: gen_len as u64,
        weights: format,
        compute_dtype: compute,
        kv_dtype,
        kv_cache,
        cuda_graphs,
        blas_workspace: 0,
    })
}
