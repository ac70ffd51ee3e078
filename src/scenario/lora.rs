//! `[lora]`: PEFT's `LoraConfig` and QLoRA's frozen-base storage.

use super::*;

pub(super) fn validate_lora(
    v: &V,
    l: &LoraSection,
    model: &ModelConfig,
    parallel: &ParallelConfig,
    wrap: Option<&str>,
    precision: &crate::plan::Precision,
) -> Result<crate::model::LoraConfig, ScenarioError> {
    use crate::model::lora::{default_targets, module_names};
    use crate::model::WeightFormat;
    let mp = &parallel.model_parallel;
    if mp.pipeline > 1 || mp.tensor > 1 {
        let field = if mp.pipeline > 1 { "parallel.pipeline" } else { "parallel.tensor" };
        return Err(v.err(field, "LoRA with Megatron tensor / pipeline parallelism is not simulated yet; use data parallelism (DDP or FSDP sharding)"));
    }
    let rank = v.positive("lora.rank", l.rank.unwrap_or(8))?;
    if rank > model.hidden {
        return Err(v.err("lora.rank", format!("{rank} is more than model.hidden ({}): not a low rank", model.hidden)));
    }
    let alpha = l.alpha.unwrap_or(8.0);
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(v.err("lora.alpha", format!("must be a positive number, got {alpha}")));
    }
    let dropout = l.dropout.unwrap_or(0.0);
    if !(0.0..1.0).contains(&dropout) {
        return Err(v.err("lora.dropout", format!("must be in [0, 1), got {dropout}")));
    }
    let names = module_names(model.family);
    let targets = l.target_modules.clone().unwrap_or_else(|| default_targets(model.family));
    if targets.is_empty() {
        return Err(v.err("lora.target_modules", "must name at least one module"));
    }
    for t in &targets {
        if t != "all-linear" && !names.iter().any(|(n, _)| n == t) {
            let allowed: Vec<String> =
                names.iter().map(|(n, _)| format!("\"{n}\"")).chain(["\"all-linear\"".to_string()]).collect();
            return Err(v.err(
                "lora.target_modules",
                format!(
                    "unknown module \"{t}\" for the {} family; allowed: {}",
                    format!("{:?}", model.family).to_lowercase(),
                    allowed.join(", ")
                ),
            ));
        }
    }
    let base = match v.choice("lora.base_weights", l.base_weights.as_deref().unwrap_or("bf16"), &["bf16", "nf4"])? {
        "nf4" => WeightFormat::Nf4 { double_quant: l.double_quant.unwrap_or(false) },
        _ => {
            for (field, set) in [
                ("lora.double_quant", l.double_quant.is_some()),
                ("lora.prepare_kbit_training", l.prepare_kbit_training.is_some()),
            ] {
                if set {
                    return Err(v.err(field, "only applies to base_weights = \"nf4\" (QLoRA)"));
                }
            }
            WeightFormat::Half
        }
    };
    // TRL's trainers skip prepare_model_for_kbit_training for a sharded QLoRA model ("one
    // should never call peft_module_casting_to_bf16 or prepare_model_for_kbit_training when
    // doing QLoRA + FSDP / DS-Zero3", trl/trainer/sft_trainer.py `is_sharded_qlora`).
    let prepare_kbit = base != WeightFormat::Half && l.prepare_kbit_training.unwrap_or(prepare_kbit_default(parallel));
    if prepare_kbit && parallel.flat_sharded_units() {
        return Err(v.err("lora.prepare_kbit_training", "FSDP1 flattens a unit's parameters into one tensor of one dtype, and prepare_model_for_kbit_training's fp32 norms would share a block's unit with the 4-bit weights' bf16 storage (FSDP-QLoRA's bnb_4bit_quant_storage): FSDP1 refuses (\"Must flatten tensors with uniform dtype\"), which is why TRL skips the call for sharded QLoRA; set lora.prepare_kbit_training = false (the default under FSDP), or parallel.framework = \"fsdp2\" (per-parameter sharding)"));
    }
    if prepare_kbit && model.family == crate::model::Family::Gpt {
        return Err(v.err("lora.prepare_kbit_training", "prepare_model_for_kbit_training's FP32 residual stream (the FP32 embeddings, LayerNorms and head it leaves carry every block's hidden states in FP32) is simulated for the llama family only; set lora.prepare_kbit_training = false (the other frozen weights and the stream in 16 bits, as Unsloth, or TRL with dtype bfloat16, leave them) or use a llama-family model"));
    }
    let shared_flat = shares_flat_parameter(v, wrap, parallel, precision, &base)?;
    Ok(crate::model::LoraConfig { rank, alpha, targets, dropout, base, prepare_kbit, shared_flat, input_casts: None })
}

/// `lora.prepare_kbit_training` where the scenario does not say: on where the parameters are
/// held whole, off where they are sharded (TRL's trainers skip the call for sharded QLoRA).
pub fn prepare_kbit_default(parallel: &ParallelConfig) -> bool {
    !parallel.params_sharded()
}

/// Whether a block's frozen base and its adapters share one FSDP1 FlatParameter
/// ([`crate::model::LoraConfig::shared_flat`]): FSDP1 with the block wrap policy. PEFT's
/// policy (`wrap = "peft"`, the default for LoRA: Hugging Face's Trainer sets
/// `fsdp_auto_wrap_policy(model)` for a PEFT model, `_fsdp_qlora_plugin_updates`) wraps the
/// adapters apart. FSDP1 flattens one dtype per FlatParameter and, with
/// `use_orig_params=False`, one `requires_grad`.
fn shares_flat_parameter(
    v: &V,
    wrap: Option<&str>,
    parallel: &ParallelConfig,
    precision: &crate::plan::Precision,
    base: &crate::model::WeightFormat,
) -> Result<bool, ScenarioError> {
    if wrap != Some("block") || parallel.framework != crate::plan::Framework::Fsdp1 {
        return Ok(false);
    }
    if parallel.offload.is_some() {
        return Err(v.err("offload", "offload with LoRA's frozen base and adapters in one FSDP1 FlatParameter (wrap = \"block\") is not simulated yet; use parallel.wrap = \"peft\""));
    }
    if !parallel.use_orig_params {
        return Err(v.err("parallel.wrap", "\"block\" puts each block's frozen base and its LoRA adapters in one FSDP1 FlatParameter, which use_orig_params=False refuses (ValueError: `FlatParameter` requires uniform `requires_grad`); set parallel.wrap = \"peft\" (PEFT's fsdp_auto_wrap_policy, the adapters in units of their own: what Hugging Face's Trainer sets for a LoRA model) or parallel.use_orig_params = true"));
    }
    if *base != crate::model::WeightFormat::Half {
        return Err(v.err("lora.base_weights", "a 4-bit base in one FSDP1 FlatParameter with the adapters (FSDP-QLoRA's bnb_4bit_quant_storage) is not simulated yet; use parallel.wrap = \"peft\""));
    }
    if precision.param != precision.compute {
        return Err(v.err("training.precision", format!("FSDP1 flattens a unit's parameters into one tensor of one dtype: with wrap = \"block\" the frozen base ({}) and the adapters ({}; PEFT's autocast_adapter_dtype upcasts them) would share one, and FSDP1 refuses (\"Must flatten tensors with uniform dtype\"); set training.precision = \"bf16\" (the adapters in the base's dtype: autocast_adapter_dtype=False) or parallel.wrap = \"peft\"", precision.compute.name(), precision.param.name())));
    }
    Ok(true)
}
