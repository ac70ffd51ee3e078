//! `hardware.gpu`: a catalog key, or `"custom"` with a `[hardware.custom]` table describing a
//! part the catalog lacks in the catalog's own terms (dense peaks by dtype, memory as
//! `nvidia-smi` reports it, link bandwidth per direction).
//!
//! `gpu = "custom"` must be written out, and the table is refused beside a catalog key: a
//! table that silently did nothing (or silently replaced a named part) would misreport. The
//! part's name is the user's ([`GpuSpec::name`] is a `Cow`: borrowed for the catalog, owned
//! here, so nothing leaks and catalog outputs are unchanged); its node defaults to
//! [`CUSTOM_DEFAULT_NODE`] unless `hardware.node` names another.

use super::*;
use crate::hardware::{Arch, GpuSpec};
use std::borrow::Cow;

/// The `hardware.gpu` value that reads the GPU from `[hardware.custom]`.
pub const CUSTOM: &str = "custom";
/// A user-defined GPU's node without `hardware.node`: the generic 8-GPU PCIe server (no
/// NVSwitch: no NVLS, NCCL's smaller channel count).
pub const CUSTOM_DEFAULT_NODE: &str = "pcie-8gpu";
/// `max_matmul_fraction` when not given: an assumption near the measured H100's 80.3%
/// (measured parts span 51% to 87%, GeForce cards up to 108% of their datasheets).
pub const DEFAULT_MATMUL_FRACTION: f64 = 0.8;
/// `pcie_gen` when not given.
pub const DEFAULT_PCIE_GEN: u8 = 4;
/// `arch` when not given: compute capability 9.x defaults (PyTorch's 32 MiB cuBLAS workspace,
/// NCCL without P2P read).
pub const DEFAULT_ARCH: &str = "hopper";
pub use crate::hardware::MAX_MATMUL_FRACTION;

/// The GPU a scenario runs on: the catalog's entry for `hardware.gpu`, or `[hardware.custom]`.
pub(super) fn validate_gpu(v: &V, h: &HardwareSection) -> Result<GpuSpec, ScenarioError> {
    match (h.gpu.as_str(), &h.custom) {
        (CUSTOM, Some(c)) => custom_gpu(v, h, c),
        (CUSTOM, None) => Err(v.err(
            "hardware.gpu",
            "\"custom\" reads the GPU from a [hardware.custom] table (memory, fp32_tflops, bf16_tflops and/or fp16_tflops, hbm_gb_per_s, nvlink_gb_per_s; see docs/scenario-format.md), and the scenario has none",
        )),
        (name, Some(_)) => Err(v.err(
            "hardware.custom",
            format!("describes the GPU of hardware.gpu = \"custom\", but hardware.gpu is \"{name}\": set gpu = \"custom\" or remove [hardware.custom]"),
        )),
        (name, None) => hardware::lookup(name).cloned().ok_or_else(|| {
            v.err(
                "hardware.gpu",
                format!(
                    "unknown GPU \"{name}\"; the catalog has: {}; or describe it with gpu = \"custom\" and [hardware.custom]",
                    hardware::names().join(", ")
                ),
            )
        }),
    }
}

fn custom_gpu(v: &V, h: &HardwareSection, c: &CustomGpuSection) -> Result<GpuSpec, ScenarioError> {
    // The overrides of a catalog part's figures would be a second place to say the same.
    for (field, set, own) in [
        ("hardware.memory_capacity", h.memory_capacity.is_some(), "memory"),
        ("hardware.nvlink_gb_per_s", h.nvlink_gb_per_s.is_some(), "nvlink_gb_per_s"),
    ] {
        if set {
            return Err(v.err(
                field,
                format!("overrides a catalog GPU's figure; a custom GPU gives it as [hardware.custom] {own}"),
            ));
        }
    }
    let name = match &c.name {
        None => CUSTOM.to_string(),
        Some(n) => custom_name(v, n)?,
    };
    let memory = v.bounded("hardware.custom.memory", c.memory, limits::MAX_GPU_MEMORY)?;
    // A positive, finite rate within its stated limit, in its unit (TFLOP/s, GB/s), scaled
    // to per second.
    let rate = |field: &str, x: f64, unit: &str, max: f64, scale: f64| -> Result<f64, ScenarioError> {
        if !(x > 0.0 && x.is_finite()) {
            return Err(v.err(field, format!("must be a positive number of {unit}, got {x}")));
        }
        if x > max {
            return Err(v.err(
                field,
                format!("must be at most {max} {unit}, got {x} (stepsim's stated limit; see docs/scenario-format.md)"),
            ));
        }
        Ok(x * scale)
    };
    let flops = |field: &str, x: f64| rate(field, x, "TFLOP/s", limits::MAX_TFLOPS, 1e12);
    let bf16 = c.bf16_tflops.map(|x| flops("hardware.custom.bf16_tflops", x)).transpose()?;
    let fp16 =
        match (c.fp16_tflops, bf16) {
            (Some(x), _) => flops("hardware.custom.fp16_tflops", x)?,
            (None, Some(b)) => b,
            (None, None) => return Err(v.err(
                "hardware.custom.bf16_tflops",
                "give the dense BF16 tensor peak (bf16_tflops), or fp16_tflops for a part without BF16 tensor cores",
            )),
        };
    let tf32 = c.tf32_tflops.map(|x| flops("hardware.custom.tf32_tflops", x)).transpose()?;
    let fp32 = flops("hardware.custom.fp32_tflops", c.fp32_tflops)?;
    let fp8 = c.fp8_tflops.map(|x| flops("hardware.custom.fp8_tflops", x)).transpose()?;
    let bandwidth = |field: &str, x: f64| rate(field, x, "GB/s", limits::MAX_GB_PER_S, 1e9);
    let hbm = bandwidth("hardware.custom.hbm_gb_per_s", c.hbm_gb_per_s)?;
    let link = bandwidth("hardware.custom.nvlink_gb_per_s", c.nvlink_gb_per_s)?;
    let pcie_gen = match c.pcie_gen {
        None => DEFAULT_PCIE_GEN,
        Some(g @ 3..=6) => g as u8,
        Some(g) => {
            return Err(v.err("hardware.custom.pcie_gen", format!("must be 3, 4, 5 or 6 (PCIe 3.0 to 6.0), got {g}")))
        }
    };
    let sms = match c.sms {
        None => 0,
        Some(x) => v.bounded("hardware.custom.sms", x, limits::MAX_SMS)? as u32,
    };
    let fraction = c.max_matmul_fraction.unwrap_or(DEFAULT_MATMUL_FRACTION);
    if !(fraction > 0.0 && fraction <= MAX_MATMUL_FRACTION) {
        return Err(v.err(
            "hardware.custom.max_matmul_fraction",
            format!(
                "must be in (0, {MAX_MATMUL_FRACTION}] (a measured GEMM's share of the BF16/FP16 peak), got {fraction}"
            ),
        ));
    }
    let names: Vec<&str> = Arch::ALL.iter().map(|(n, _)| *n).collect();
    let arch_name = v.choice("hardware.custom.arch", c.arch.as_deref().unwrap_or(DEFAULT_ARCH), &names)?;
    let arch = Arch::ALL.iter().find(|(n, _)| *n == arch_name).map_or(Arch::Hopper, |(_, a)| *a);
    if fp8.is_some() && !arch.has_fp8() {
        return Err(v.err(
            "hardware.custom.fp8_tflops",
            format!("arch \"{arch_name}\" has no FP8 tensor cores (ada, hopper, blackwell, gb20x and cdna3 have): remove fp8_tflops or set arch"),
        ));
    }
    Ok(GpuSpec {
        name: Cow::Owned(name),
        memory_bytes: memory,
        bf16_flops: bf16,
        fp16_flops: fp16,
        tf32_flops: tf32,
        fp32_flops: fp32,
        fp8_flops: fp8,
        hbm_bytes_per_s: hbm,
        nvlink_bytes_per_s: link,
        pcie_gen,
        max_matmul_fraction: fraction,
        sms,
        arch,
        default_node: CUSTOM_DEFAULT_NODE,
        source: "user-defined in [hardware.custom]",
    })
}

/// A custom GPU's name: what reports print, so short and plain, and not a catalog key (which
/// would read as the catalog's part).
fn custom_name(v: &V, n: &str) -> Result<String, ScenarioError> {
    let field = "hardware.custom.name";
    let plain = |ch: char| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.' | ' ' | '(' | ')');
    if n.trim().is_empty() || n.len() > 64 || !n.chars().all(plain) {
        return Err(
            v.err(field, "must be 1 to 64 characters of letters, digits, spaces and - _ . ( ), e.g. \"rtx-a6000\"")
        );
    }
    if hardware::lookup(n).is_some() {
        return Err(v.err(
            field,
            format!(
                "\"{n}\" is a catalog GPU: use gpu = \"{n}\" (without [hardware.custom]), or name this one differently"
            ),
        ));
    }
    Ok(n.to_string())
}
