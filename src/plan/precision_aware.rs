//! Megatron-Core's precision-aware optimizer (`--use-precision-aware-optimizer`): the
//! distributed optimizer hands its shard to Transformer Engine's `FusedAdam`, which keeps the
//! master weights and both Adam moments itself, each in a dtype of its own
//! (`--main-params-dtype`, `--exp-avg-dtype`, `--exp-avg-sq-dtype`), and reads the gradients
//! in `--main-grads-dtype` (megatron/core/optimizer/__init__.py `_get_megatron_optimizer_based_on_param_groups`,
//! distrib_optimizer.py `_build_model_and_main_param_groups`: no FP32 `shard_main_param`;
//! optimizer_config.py `OptimizerConfig`; NVIDIA/Megatron-LM d98e8a64dd).
//!
//! What FusedAdam does with them (transformer_engine/pytorch/optimizers/fused_adam.py,
//! NVIDIA/TransformerEngine 04912bf):
//! - `store_param_remainders` (Megatron's `OptimizerConfig` default, no command-line flag; off
//!   before TE 2.1): an FP32 master of BF16 parameters is stored as its low 16 bits (int16),
//!   the high 16 being the BF16 parameter itself, and updated together with it by
//!   `multi_tensor_adam_param_remainder`;
//! - a state not in FP32 is unscaled into a new FP32 tensor for the kernel
//!   (`get_unscaled_state`: `.float()`, and for FP16 a multiply by its scale), for every
//!   parameter of the group before the one multi-tensor kernel, and written back after it
//!   (`_apply_scale`: amax, scale, copy); the FP32 copies live until the group's step ends
//!   (`del unscaled_lists`). Megatron's distributed optimizer puts nearly every element in
//!   one group, so the step holds an FP32 copy of each such state for the whole shard.

use serde::Serialize;

use crate::model::Dtype;

/// The dtype FusedAdam stores one of Adam's moments in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateDtype {
    Fp32,
    Bf16,
    Fp16,
    /// `torch.uint8` holding FP8 (E4M3) with one FP32 scale per tensor.
    Fp8,
}

impl StateDtype {
    pub fn parse(s: &str) -> Option<StateDtype> {
        Some(match s {
            "fp32" => StateDtype::Fp32,
            "bf16" => StateDtype::Bf16,
            "fp16" => StateDtype::Fp16,
            "fp8" => StateDtype::Fp8,
            _ => return None,
        })
    }
    pub fn bytes(self) -> u64 {
        match self {
            StateDtype::Fp32 => 4,
            StateDtype::Bf16 | StateDtype::Fp16 => 2,
            StateDtype::Fp8 => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            StateDtype::Fp32 => "fp32",
            StateDtype::Bf16 => "bf16",
            StateDtype::Fp16 => "fp16",
            StateDtype::Fp8 => "fp8",
        }
    }
    /// HBM bytes per element of `get_unscaled_state` (to FP32) and of `_apply_scale` (back),
    /// as the code runs them: BF16 `.float()` then `.bfloat16()` and `copy_`; FP16 `.float()`
    /// and a scale multiply, then `aminmax`, an in-place multiply and `copy_`; FP8 `.float()`,
    /// then `aminmax` and a quantizing `copy_`. Zero for FP32 (used in place).
    pub fn unscale_rescale_bytes(self) -> (u64, u64) {
        match self {
            StateDtype::Fp32 => (0, 0),
            StateDtype::Bf16 => (2 + 4, (4 + 2) + (2 + 2)),
            StateDtype::Fp16 => ((2 + 4) + (4 + 4), 4 + (4 + 4) + (4 + 2)),
            StateDtype::Fp8 => (1 + 4, 4 + (4 + 1)),
        }
    }
}

/// `--use-precision-aware-optimizer` and the dtypes it allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PrecisionAware {
    /// `--main-params-dtype`: fp32 or fp16 (the master FusedAdam keeps).
    pub main_params: Dtype,
    /// `OptimizerConfig.store_param_remainders`.
    pub store_param_remainders: bool,
    /// `--exp-avg-dtype`.
    pub exp_avg: StateDtype,
    /// `--exp-avg-sq-dtype`.
    pub exp_avg_sq: StateDtype,
}

impl PrecisionAware {
    /// Whether the FP32 master is kept as int16 remainders of `param`'s BF16 values.
    pub fn remainders(&self, param: Dtype) -> bool {
        self.store_param_remainders && self.main_params == Dtype::Fp32 && param == Dtype::Bf16
    }

    /// Bytes per sharded element of the master FusedAdam keeps.
    pub fn master_bytes(&self, param: Dtype) -> u64 {
        if self.remainders(param) {
            2
        } else {
            self.main_params.bytes()
        }
    }

    /// Bytes per sharded element of the two moments.
    pub fn state_bytes(&self) -> u64 {
        self.exp_avg.bytes() + self.exp_avg_sq.bytes()
    }

    /// The stored states that are not FP32 (the master only as FP16: remainders are used in
    /// place), each unscaled into an FP32 copy for the step.
    pub fn scaled_states(&self) -> Vec<StateDtype> {
        let mut out: Vec<StateDtype> =
            [self.exp_avg, self.exp_avg_sq].into_iter().filter(|s| *s != StateDtype::Fp32).collect();
        if self.main_params == Dtype::Fp16 {
            out.push(StateDtype::Fp16);
        }
        out
    }

    /// FP32 copies the step holds at once, bytes per sharded element.
    pub fn step_temp_bytes(&self) -> u64 {
        4 * self.scaled_states().len() as u64
    }

    /// One line for the report.
    pub fn describe(&self, param: Dtype) -> String {
        let temp = self.step_temp_bytes();
        format!(
            "Megatron --use-precision-aware-optimizer (Transformer Engine FusedAdam{}): per sharded element master {} B, moments {} + {} B; {}",
            if self.remainders(param) { ", store_param_remainders" } else { "" },
            self.master_bytes(param),
            self.exp_avg.bytes(),
            self.exp_avg_sq.bytes(),
            if temp > 0 {
                format!("the step unscales each non-FP32 state into an FP32 copy of the whole shard ({temp} B per element, held until the step ends)")
            } else {
                "every state FP32, used in place".to_string()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remainders_only_for_an_fp32_master_of_bf16_parameters() {
        let pa = PrecisionAware {
            main_params: Dtype::Fp32,
            store_param_remainders: true,
            exp_avg: StateDtype::Fp32,
            exp_avg_sq: StateDtype::Fp32,
        };
        assert_eq!(pa.master_bytes(Dtype::Bf16), 2);
        assert_eq!(pa.master_bytes(Dtype::Fp16), 4);
        assert_eq!(PrecisionAware { store_param_remainders: false, ..pa }.master_bytes(Dtype::Bf16), 4);
        assert_eq!(PrecisionAware { main_params: Dtype::Fp16, ..pa }.master_bytes(Dtype::Bf16), 2);
        assert_eq!(pa.step_temp_bytes(), 0);
    }

    #[test]
    fn low_precision_moments_shrink_the_state_and_need_fp32_copies_at_the_step() {
        let pa = PrecisionAware {
            main_params: Dtype::Fp16,
            store_param_remainders: true,
            exp_avg: StateDtype::Bf16,
            exp_avg_sq: StateDtype::Fp8,
        };
        assert_eq!(pa.state_bytes(), 3);
        // exp_avg, exp_avg_sq and the FP16 master each unscaled to FP32.
        assert_eq!(pa.step_temp_bytes(), 12);
    }
}
