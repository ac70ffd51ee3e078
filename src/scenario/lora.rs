//! `[lora]`: PEFT's `LoraConfig` and QLoRA's frozen-base storage.

use super::*;

pub(super) fn validate_lora(
    v: &V,
    l: &LoraSection,
    model: &ModelConfig,
    parallel: &ParallelConfig,
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
            if l.double_quant.is_some() {
                return Err(v.err("lora.double_quant", "only applies to base_weights = \"nf4\" (QLoRA)"));
            }
            WeightFormat::Half
        }
    };
    Ok(crate::model::LoraConfig { rank, alpha, targets, dropout, base })
}
