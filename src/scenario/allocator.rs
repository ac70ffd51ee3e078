//! `[allocator]`: PyTorch's caching allocator options (`PYTORCH_CUDA_ALLOC_CONF`), the
//! `empty_cache()` points and the memory held outside the allocator.

use super::*;

/// `[allocator]`: option values as `PYTORCH_CUDA_ALLOC_CONF` accepts them
/// (`AllocatorConfig::parseArgs` in c10/core/AllocatorConfig.cpp).
pub(super) fn validate_allocator(
    v: &V,
    a: &AllocatorSection,
    cluster: &Cluster,
) -> Result<AllocatorSettings, ScenarioError> {
    let mut out = AllocatorSettings { cublas_workspace: cluster.gpu.blas_workspace_bytes(), ..Default::default() };
    if let Some(k) = &a.kind {
        out.kind = match v.choice("allocator.kind", k, &["caching", "exact"])? {
            "caching" => AllocatorKind::Caching,
            _ => AllocatorKind::Exact,
        };
    }
    let caching_only =
        |field: &str| v.err(field, "only applies to allocator.kind = \"caching\" (the exact model has no segments)");
    if let Some(e) = a.expandable_segments {
        if out.kind == AllocatorKind::Exact {
            return Err(caching_only("allocator.expandable_segments"));
        }
        out.expandable_segments = e;
    }
    if let Some(m) = a.max_split_size_mb {
        if out.kind == AllocatorKind::Exact {
            return Err(caching_only("allocator.max_split_size_mb"));
        }
        // "CachingAllocator option max_split_size_mb too small, must be >= 20" (kLargeBuffer).
        if m < 20 {
            return Err(
                v.err("allocator.max_split_size_mb", format!("must be >= 20 (MiB), as PyTorch requires; got {m}"))
            );
        }
        out.max_split_size_mb = Some(m as u64);
    }
    if let Some(d) = a.roundup_power2_divisions {
        if out.kind == AllocatorKind::Exact {
            return Err(caching_only("allocator.roundup_power2_divisions"));
        }
        if d < 0 || (d > 0 && !(d as u64).is_power_of_two()) {
            return Err(v.err(
                "allocator.roundup_power2_divisions",
                format!("must be 0 (off) or a power of 2, as PyTorch requires; got {d}"),
            ));
        }
        out.roundup_power2_divisions = d as u64;
    }
    if let Some(points) = &a.empty_cache {
        for p in points {
            let at = EmptyCacheAt::parse(p).ok_or_else(|| {
                v.err(
                    "allocator.empty_cache",
                    format!(
                        "unknown point \"{p}\"; allowed: {}",
                        EmptyCacheAt::NAMES.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
            if !out.empty_cache.contains(&at) {
                out.empty_cache.push(at);
            }
        }
        out.empty_cache.sort();
    }
    let bytes = |field: &str, x: Option<i64>| match x {
        Some(x) if x < 0 => Err(v.err(field, format!("must be >= 0 bytes, got {x}"))),
        x => Ok(x.map(|x| x as u64)),
    };
    if let Some(x) = bytes("allocator.cublas_workspace", a.cublas_workspace)? {
        out.cublas_workspace = x;
    }
    out.nccl_buffers = bytes("allocator.nccl_buffers", a.nccl_buffers)?;
    if out.cublas_workspace.saturating_mul(2) >= cluster.capacity_bytes() {
        return Err(v.err(
            "allocator.cublas_workspace",
            format!(
                "two cuBLAS workspaces of {} bytes (one per thread: forward and autograd's backward) leave nothing of the {} bytes the CUDA context leaves; CUBLAS_WORKSPACE_CONFIG's default is {} bytes on {}",
                out.cublas_workspace,
                cluster.capacity_bytes(),
                cluster.gpu.blas_workspace_bytes(),
                cluster.gpu.name
            ),
        ));
    }
    let nccl = out.nccl_buffers.unwrap_or(0);
    if nccl >= cluster.capacity_bytes() {
        return Err(v.err(
            "allocator.nccl_buffers",
            format!(
                "NCCL buffers ({} bytes) leave nothing of the {} bytes the CUDA context leaves",
                nccl,
                cluster.capacity_bytes()
            ),
        ));
    }
    Ok(out)
}
