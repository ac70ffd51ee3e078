//! `[model.mtp]`: DeepSeek-V3's multi-token prediction, by Megatron-Core's flag names
//! (`--mtp-num-layers`, `--mtp-loss-scaling-factor`), and what it is simulated with.
//!
//! Training the modules is Megatron-Core's (`MultiTokenPredictionBlock`); torchtitan's
//! DeepSeek-V3 builds none and Hugging Face transformers' `DeepseekV3ForCausalLM` neither
//! builds nor trains one, so the other frameworks are refused. A DeepSeek-V3 config's
//! `num_nextn_predict_layers` does not turn it on: Megatron trains the modules only under
//! `--mtp-num-layers`, and the report says what the config holds.

use super::*;
use crate::model::MtpConfig;

/// Megatron-Core's `TransformerConfig.mtp_loss_scaling_factor` default.
const MEGATRON_LOSS_SCALE: f64 = 0.1;

/// The section's fields: `layers` (required in the section, at least 1) and `loss_scale`.
pub(super) fn validate_mtp(v: &V, m: &ModelSection, family: Family) -> Result<Option<MtpConfig>, ScenarioError> {
    let Some(sec) = &m.mtp else { return Ok(None) };
    if family != Family::Llama {
        return Err(v.err(
            "model.mtp",
            "multi-token prediction is simulated for the llama family (DeepSeek-V3's; the gpt family's position table in its embedding is not modelled); set model.family = \"llama\"",
        ));
    }
    let Some(layers) = sec.layers else {
        return Err(
            v.err("model.mtp.layers", "is required in [model.mtp] (Megatron --mtp-num-layers; DeepSeek-V3 trains 1)")
        );
    };
    let layers = v.bounded("model.mtp.layers", layers, limits::MAX_LAYERS)?;
    let loss_scale = sec.loss_scale.unwrap_or(MEGATRON_LOSS_SCALE);
    if !(loss_scale.is_finite() && loss_scale > 0.0) {
        return Err(v.err(
            "model.mtp.loss_scale",
            format!("must be a positive number (Megatron --mtp-loss-scaling-factor, default 0.1), got {loss_scale}"),
        ));
    }
    Ok(Some(MtpConfig { layers, loss_scale }))
}

/// What multi-token prediction is not simulated with, each refused naming the field that
/// asks for it.
pub(super) fn check_mtp(
    v: &V,
    model: &ModelConfig,
    parallel: &ParallelConfig,
    workload: &Workload,
    training: &TrainingConfig,
    job: JobKind,
) -> Result<(), ScenarioError> {
    if model.mtp.is_none() {
        return Ok(());
    }
    if job != JobKind::Train {
        return Err(v.err(
            "model.mtp",
            "multi-token prediction is simulated in training (job.kind = \"train\") only: a LoRA fine-tune does not train the modules and inference does not run them here; leave out [model.mtp]",
        ));
    }
    if parallel.framework != Framework::Megatron {
        return Err(v.err(
            "model.mtp",
            "multi-token prediction is trained by Megatron-Core (--mtp-num-layers); torchtitan's DeepSeek-V3 has no MTP module and transformers does not train one: set parallel.framework = \"megatron\"",
        ));
    }
    if workload.loss == crate::model::LossKind::FusedLinear {
        return Err(v.err(
            "training.loss",
            "\"fused-linear\" is Liger-Kernel's, which Megatron's multi-token prediction does not use (process_mtp_loss computes the logits); use \"vocab-parallel\"",
        ));
    }
    if training.activation_offload.is_some_and(|a| a.method != crate::plan::ActivationOffloadMethod::FineGrained) {
        return Err(v.err(
            "training.activation_offload",
            "activation offload with multi-token prediction is not simulated yet; use \"none\"",
        ));
    }
    Ok(())
}
