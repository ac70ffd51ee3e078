//! `[megatron]`: Megatron-LM's communication-overlap flags, validated against the
//! parallelism they need, as Megatron's own argument checks do
//! (`megatron/training/arguments.py`, `validate_args`).

use super::*;
use crate::plan::MegatronConfig;

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
