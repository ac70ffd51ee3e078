//! `[deepspeed]`: the `zero_optimization` bucket settings of a user's `ds_config.json`, by
//! DeepSpeed's names, validated; DeepSpeed's defaults where absent.

use super::*;
use crate::plan::DeepspeedConfig;

/// A bucket of more elements than this is refused: 2^40 elements of 16 bits is 2 TB, more
/// than any GPU holds, and keeps every byte count far from wrapping.
const MAX_BUCKET_ELEMENTS: f64 = (1u64 << 40) as f64;

pub(super) fn validate_deepspeed(
    v: &V,
    d: Option<&DeepspeedSection>,
    framework: Framework,
) -> Result<DeepspeedConfig, ScenarioError> {
    let mut out = DeepspeedConfig::default();
    let Some(d) = d else { return Ok(out) };
    if framework != Framework::Deepspeed {
        return Err(v.err(
            "deepspeed",
            "the [deepspeed] section sets DeepSpeed's zero_optimization buckets; it needs parallel.framework = \"deepspeed\"",
        ));
    }
    // Every knob is a whole number of elements up to 2^40, and at least `min`: ZeRO-3's fetch
    // knobs take 0 as DeepSpeed's "none" (no prefetch, no reuse, nothing persistent).
    let knobs = [
        ("deepspeed.reduce_bucket_size", d.reduce_bucket_size, &mut out.reduce_bucket_size, 1.0, "5e8"),
        ("deepspeed.allgather_bucket_size", d.allgather_bucket_size, &mut out.allgather_bucket_size, 1.0, "5e8"),
        ("deepspeed.sub_group_size", d.sub_group_size, &mut out.sub_group_size, 1.0, "1e9"),
        (
            "deepspeed.stage3_prefetch_bucket_size",
            d.stage3_prefetch_bucket_size,
            &mut out.stage3_prefetch_bucket_size,
            0.0,
            "5e7",
        ),
        (
            "deepspeed.stage3_max_live_parameters",
            d.stage3_max_live_parameters,
            &mut out.stage3_max_live_parameters,
            0.0,
            "1e9",
        ),
        (
            "deepspeed.stage3_max_reuse_distance",
            d.stage3_max_reuse_distance,
            &mut out.stage3_max_reuse_distance,
            0.0,
            "1e9",
        ),
        (
            "deepspeed.stage3_param_persistence_threshold",
            d.stage3_param_persistence_threshold,
            &mut out.stage3_param_persistence_threshold,
            0.0,
            "1e5",
        ),
    ];
    for (field, x, into, min, default) in knobs {
        let Some(x) = x else { continue };
        if !((min..=MAX_BUCKET_ELEMENTS).contains(&x) && x.fract() == 0.0) {
            return Err(v.err(
                field,
                format!(
                    "must be a whole number of elements from {min} to 2^40 (DeepSpeed's default: {default}), got {x}"
                ),
            ));
        }
        *into = x as u64;
    }
    if let Some(c) = d.contiguous_gradients {
        out.contiguous_gradients = c;
    }
    if let Some(o) = d.overlap_comm {
        out.overlap_comm = o;
    }
    if let Some(s) = d.version.as_deref() {
        out.version = parse_version(s).ok_or_else(|| {
            v.err(
                "deepspeed.version",
                format!(
                    "must be a DeepSpeed release from 0.5 to 0.16 as \"MAJOR.MINOR\" or \"MAJOR.MINOR.PATCH\" (default \"{}\", the release stepsim follows), got {s:?}",
                    DeepspeedConfig::default().version_name()
                ),
            )
        })?;
    }
    Ok(out)
}

/// "0.6" or "0.13.2" within the releases whose initialisation stepsim knows (0.5 to 0.16).
fn parse_version(s: &str) -> Option<(u16, u16, u16)> {
    let mut parts = s.split('.').map(|p| {
        if p.is_empty() || p.len() > 4 || !p.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            p.parse::<u16>().ok()
        }
    });
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = match parts.next() {
        Some(p) => p?,
        None => 0,
    };
    if parts.next().is_some() || major != 0 || !(5..=16).contains(&minor) {
        return None;
    }
    Some((major, minor, patch))
}
