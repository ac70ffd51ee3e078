//! `[fp8]`: FP8 training, validated against what each library supports: Transformer
//! Engine's delayed scaling as Megatron-Core drives it, torchao's dynamic float8 recipes as
//! torchtitan drives them under FSDP.

use super::*;
use crate::model::{Fp8Config, Fp8Recipe};

/// Longest amax history accepted (Transformer Engine's own default is 1,024 rows).
const MAX_AMAX_HISTORY: i64 = 1 << 20;

pub(super) struct Fp8Context<'a> {
    pub framework: Framework,
    pub cluster: &'a Cluster,
    pub compute: Dtype,
    pub job: JobKind,
    pub micro_batches: u64,
    pub sharding: Sharding,
    /// The ranks FSDP shards parameters over (`plan::shard_group`).
    pub shard_group: u64,
}

pub(super) fn validate_fp8(v: &V, f: Option<&Fp8Section>, cx: &Fp8Context) -> Result<Option<Fp8Config>, ScenarioError> {
    let Some(f) = f else { return Ok(None) };
    let Some(name) = f.recipe.as_deref() else {
        return Err(v.err(
            "fp8.recipe",
            "is required: \"delayed\", \"blockwise\" or \"mxfp8\" (Transformer Engine under Megatron-Core / NeMo), \"tensorwise\" or \"rowwise\" (torchao float8 under FSDP, torchtitan)",
        ));
    };
    let recipe = match v.choice("fp8.recipe", name, &["delayed", "blockwise", "mxfp8", "tensorwise", "rowwise"])? {
        "delayed" => Fp8Recipe::Delayed,
        "blockwise" => Fp8Recipe::Blockwise,
        "mxfp8" => Fp8Recipe::Mxfp8,
        "tensorwise" => Fp8Recipe::Tensorwise,
        _ => Fp8Recipe::Rowwise,
    };
    if cx.cluster.gpu.fp8_flops.is_none() {
        return Err(v.err(
            "fp8",
            format!(
                "{} has no FP8 tensor cores; FP8 training needs an Ada, Hopper, Blackwell or MI300-class part (e.g. RTX 4090, L40S, H100, H200, B200, MI300X; remove [fp8] to train in 16 bits)",
                cx.cluster.gpu.name
            ),
        ));
    }
    if cx.job != JobKind::Train {
        return Err(v.err("fp8", "FP8 is simulated for training jobs only (not LoRA fine-tuning or inference)"));
    }
    if cx.compute == Dtype::Fp32 {
        return Err(v.err(
            "fp8",
            "FP8 training casts a 16-bit model's GEMM inputs; set training.precision to a bf16 or fp16 preset",
        ));
    }
    // Transformer Engine's support checks (transformer_engine/pytorch/quantization.py):
    // block scaling needs compute capability 9.0+, MXFP8 10.x.
    use crate::hardware::Arch;
    let arch = cx.cluster.gpu.arch;
    let supported = match recipe {
        Fp8Recipe::Blockwise => matches!(arch, Arch::Hopper | Arch::Blackwell | Arch::Gb20x),
        Fp8Recipe::Mxfp8 => arch == Arch::Blackwell,
        _ => true,
    };
    if !supported {
        return Err(v.err(
            "fp8.recipe",
            format!(
                "\"{name}\" is not supported on {} (Transformer Engine: {}); use \"delayed\"",
                cx.cluster.gpu.name,
                if recipe == Fp8Recipe::Mxfp8 {
                    "MXFP8 needs compute capability 10.x, a B200 or GB200"
                } else {
                    "FP8 block scaled GEMM requires compute capability 9.0 or higher"
                }
            ),
        ));
    }
    match (recipe, cx.framework) {
        (r, Framework::Megatron) if r.is_te() => {}
        (r, _) if r.is_te() => {
            return Err(v.err(
                "fp8.recipe",
                format!("\"{name}\" is a Transformer Engine recipe as Megatron-Core runs it (parallel.framework = \"megatron\"); under FSDP use torchao's \"tensorwise\" or \"rowwise\""),
            ))
        }
        (_, Framework::Fsdp | Framework::Fsdp1 | Framework::Fsdp2) => {}
        (_, _) => {
            return Err(v.err(
                "fp8.recipe",
                format!(
                    "\"{name}\" is torchao's float8 training as torchtitan runs it under FSDP (parallel.framework = \"fsdp\"); with Megatron-Core use \"delayed\", \"blockwise\" or \"mxfp8\""
                ),
            ))
        }
    }
    if !recipe.is_te() && f.wgrad.is_some() {
        return Err(v.err(
            "fp8.wgrad",
            "applies to Transformer Engine's recipes (\"delayed\", \"blockwise\", \"mxfp8\"); torchao's run every GEMM in FP8",
        ));
    }
    if recipe != Fp8Recipe::Delayed && f.amax_history_len.is_some() {
        return Err(v.err(
            "fp8.amax_history_len",
            "applies to recipe = \"delayed\" only (block scaling and torchao's dynamic recipes scale as they quantize and keep no amax history)",
        ));
    }
    let amax_history_len = match f.amax_history_len {
        None => 1,
        Some(x) if (1..=MAX_AMAX_HISTORY).contains(&x) => x as u64,
        Some(x) => {
            return Err(v.err(
                "fp8.amax_history_len",
                format!("must be a whole number of rows from 1 to 2^20 (Megatron's default is 1, Transformer Engine's 1024), got {x}"),
            ))
        }
    };
    let fsdp_all_gather = f.fsdp_all_gather.unwrap_or(false);
    if fsdp_all_gather {
        if recipe != Fp8Recipe::Tensorwise {
            return Err(v.err(
                "fp8.fsdp_all_gather",
                "torchao all-gathers FP8 weights under FSDP with recipe = \"tensorwise\" only",
            ));
        }
        if !matches!(cx.sharding, Sharding::Zero3 | Sharding::Zero2 | Sharding::HybridShard) {
            return Err(v.err(
                "fp8.fsdp_all_gather",
                "needs FSDP to shard the parameters (parallel.sharding = \"full_shard\", \"shard_grad_op\" or \"hybrid_shard\")",
            ));
        }
    }
    Ok(Some(Fp8Config {
        recipe,
        wgrad: f.wgrad.unwrap_or(true),
        amax_history_len,
        micro_batches: cx.micro_batches,
        fsdp_all_gather,
        shard_group: if fsdp_all_gather { cx.shard_group } else { 1 },
    }))
}
