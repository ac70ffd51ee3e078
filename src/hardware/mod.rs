//! GPU catalog: the figures every time and capacity number in a report traces back to.
//!
//! Each entry names its source. Capacities are the `memory.total` that `nvidia-smi` reports for
//! the part (MiB), because that is what `torch.cuda.get_device_properties().total_memory`
//! sees; the marketing "80 GB" is 80 GiB of HBM of which the driver exposes slightly less.
//! Peaks are dense (no 2:4 sparsity) BF16 tensor-core figures from the vendor datasheets as
//! collected in stas00's ml-engineering `compute/accelerator/README.md`; link bandwidths are
//! unidirectional per GPU (`network/README.md` of the same collection).

use serde::Serialize;

/// One GPU model: what bounds memory, compute and communication.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuSpec {
    /// Catalog key used in scenario files.
    pub name: &'static str,
    /// Device memory as `nvidia-smi` reports it, bytes.
    pub memory_bytes: u64,
    /// Dense BF16 tensor-core peak, FLOP/s.
    pub bf16_flops: f64,
    /// Dense FP32 (non-tensor-core) peak, FLOP/s; FP32 matmuls in PyTorch default to this
    /// unless TF32 is enabled.
    pub fp32_flops: f64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// NVLink bandwidth per GPU, one direction, bytes/s.
    pub nvlink_bytes_per_s: f64,
    /// Inter-node network bandwidth available to each GPU, one direction, bytes/s
    /// (one NIC per GPU in the reference node design).
    pub network_bytes_per_s: f64,
    /// Where the figures come from.
    pub source: &'static str,
}

const MIB: u64 = 1 << 20;

/// The catalog. Keys are lowercase, as written in scenario files.
pub const CATALOG: &[GpuSpec] = &[
    GpuSpec {
        name: "a100-40gb",
        // nvidia-smi: 40960 MiB (A100-SXM4-40GB).
        memory_bytes: 40_960 * MIB,
        // NVIDIA A100 datasheet: 312 TFLOP/s BF16 dense, 19.5 TFLOP/s FP32.
        bf16_flops: 312e12,
        fp32_flops: 19.5e12,
        // A100 40GB SXM: 1,555 GB/s HBM2.
        hbm_bytes_per_s: 1.555e12,
        // NVLink 3: 12 links, 300 GB/s per direction.
        nvlink_bytes_per_s: 300e9,
        // DGX A100: 8 x HDR 200 Gb/s = 25 GB/s per GPU.
        network_bytes_per_s: 25e9,
        source: "NVIDIA A100 datasheet; DGX A100 (8x HDR200); stas00 ml-engineering",
    },
    GpuSpec {
        name: "a100-80gb",
        // nvidia-smi: 81920 MiB (A100-SXM4-80GB).
        memory_bytes: 81_920 * MIB,
        bf16_flops: 312e12,
        fp32_flops: 19.5e12,
        // A100 80GB SXM: 2,039 GB/s HBM2e.
        hbm_bytes_per_s: 2.039e12,
        nvlink_bytes_per_s: 300e9,
        network_bytes_per_s: 25e9,
        source: "NVIDIA A100 datasheet; DGX A100 (8x HDR200); stas00 ml-engineering",
    },
    GpuSpec {
        name: "h100-sxm",
        // nvidia-smi: 81559 MiB (H100 80GB HBM3).
        memory_bytes: 81_559 * MIB,
        // NVIDIA H100 datasheet: 989 TFLOP/s BF16 dense (1979 with sparsity), 67 TFLOP/s FP32.
        bf16_flops: 989e12,
        fp32_flops: 67e12,
        // 3.35 TB/s HBM3.
        hbm_bytes_per_s: 3.35e12,
        // NVLink 4: 18 links, 450 GB/s per direction.
        nvlink_bytes_per_s: 450e9,
        // DGX H100: 8 x NDR 400 Gb/s = 50 GB/s per GPU.
        network_bytes_per_s: 50e9,
        source: "NVIDIA H100 datasheet; DGX H100 (8x NDR400); stas00 ml-engineering",
    },
    GpuSpec {
        name: "h200",
        // nvidia-smi: 143771 MiB (H200 141GB HBM3e).
        memory_bytes: 143_771 * MIB,
        // Same GH100 compute as H100 SXM: 989 TFLOP/s BF16 dense.
        bf16_flops: 989e12,
        fp32_flops: 67e12,
        // 4.8 TB/s HBM3e.
        hbm_bytes_per_s: 4.8e12,
        nvlink_bytes_per_s: 450e9,
        network_bytes_per_s: 50e9,
        source: "NVIDIA H200 datasheet; HGX H200 (8x NDR400); stas00 ml-engineering",
    },
];

/// Looks a GPU up by its catalog key.
pub fn lookup(name: &str) -> Option<&'static GpuSpec> {
    CATALOG.iter().find(|g| g.name == name)
}

/// Catalog keys, for error messages.
pub fn names() -> Vec<&'static str> {
    CATALOG.iter().map(|g| g.name).collect()
}

/// The cluster a scenario runs on, after overrides.
#[derive(Debug, Clone, Serialize)]
pub struct Cluster {
    pub gpu: GpuSpec,
    pub gpus: u32,
    pub gpus_per_node: u32,
    /// Usable device memory before the CUDA context is taken out.
    pub memory_bytes: u64,
    /// Memory the CUDA context and libraries hold outside PyTorch's allocator.
    pub cuda_context_bytes: u64,
}

impl Cluster {
    /// What the allocator may hand out: device memory less the CUDA context.
    pub fn capacity_bytes(&self) -> u64 {
        self.memory_bytes.saturating_sub(self.cuda_context_bytes)
    }
    pub fn nodes(&self) -> u32 {
        self.gpus.div_ceil(self.gpus_per_node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_keys_are_unique_and_lowercase() {
        let names = names();
        for (i, n) in names.iter().enumerate() {
            assert_eq!(n.to_lowercase(), *n);
            assert!(!names[i + 1..].contains(n), "{n} twice");
        }
        assert!(lookup("h100-sxm").is_some());
        assert!(lookup("H100").is_none());
    }

    #[test]
    fn eighty_gb_parts_hold_more_than_80e9_bytes() {
        // "80 GB" parts are 80 GiB of HBM; the driver exposes a little less than 80 GiB.
        for n in ["a100-80gb", "h100-sxm"] {
            let g = lookup(n).unwrap();
            assert!(g.memory_bytes > 80_000_000_000 && g.memory_bytes <= 80 << 30);
        }
    }
}
