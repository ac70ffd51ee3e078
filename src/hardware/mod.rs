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
    /// Device memory as `nvidia-smi` / `rocm-smi` reports it, bytes.
    pub memory_bytes: u64,
    /// Dense BF16 tensor-core peak, FLOP/s (None: the part has no BF16 tensor cores).
    pub bf16_flops: Option<f64>,
    /// Dense FP16 tensor-core peak, FLOP/s.
    pub fp16_flops: f64,
    /// Dense TF32 tensor-core peak, FLOP/s (None: no TF32). PyTorch uses TF32 for FP32
    /// matmuls only with `torch.backends.cuda.matmul.allow_tf32 = True` (off by default).
    pub tf32_flops: Option<f64>,
    /// FP32 (non-tensor-core) peak, FLOP/s: what FP32 matmuls get by default.
    pub fp32_flops: f64,
    /// Dense FP8 (E4M3 / E5M2) tensor-core peak, FLOP/s (None: no FP8 tensor cores, so FP8
    /// training is refused). FP8 GEMMs reach the same fraction of it as BF16 GEMMs of
    /// theirs: on H100 SXM cuBLASLt runs an 8192^3 E4M3 GEMM at 1,599-1,630 TFLOP/s
    /// (81-82% of 1,979) across 16 GPUs (a published cuBLASLt FP8 cross-check report,
    /// 2026-05-24), against the 80.3% BF16 ceiling of `max_matmul_fraction`.
    pub fp8_flops: Option<f64>,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Intra-node GPU-to-GPU bandwidth per GPU, one direction, bytes/s: NVLink/NVSwitch or
    /// AMD Infinity Fabric (xGMI); PCIe for parts without a GPU fabric.
    pub nvlink_bytes_per_s: f64,
    /// PCIe generation of the host link (x16).
    pub pcie_gen: u8,
    /// Best achievable dense matmul throughput as a fraction of the BF16/FP16 peak, measured
    /// with large square GEMMs (stas00 ml-engineering `compute/accelerator/README.md`,
    /// "Maximum achievable matmul FLOPS": A100 86.9%, H100 80.3%, B200 77.6%, MI300X 51.4%).
    pub max_matmul_fraction: f64,
    /// Streaming multiprocessors (NVIDIA) / compute units (AMD): how many GEMM output tiles
    /// run at once, for wave quantization.
    pub sms: u32,
    /// The architecture: what the libraries key their defaults on ([`GpuSpec::blas_workspace_bytes`],
    /// NCCL's P2P read and NVLS in `crate::scenario::nccl`).
    pub arch: Arch,
    /// The node layout this part usually ships in (a key of [`NODES`]).
    pub default_node: &'static str,
    /// Where the figures come from.
    pub source: &'static str,
}

const MIB: u64 = 1 << 20;

/// A GPU architecture (NVIDIA compute capability, AMD gfx target).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// sm70.
    Volta,
    /// sm80.
    Ampere,
    /// sm90.
    Hopper,
    /// sm100.
    Blackwell,
    /// gfx942 (ROCm: RCCL and hipBLASLt instead of NCCL and cuBLAS).
    Cdna3,
}

impl Arch {
    /// Hopper or later (NVIDIA).
    pub fn hopper_or_later(self) -> bool {
        matches!(self, Arch::Hopper | Arch::Blackwell)
    }
}

impl GpuSpec {
    /// Bytes of one cuBLAS workspace PyTorch allocates per (cuBLAS handle, stream) through
    /// its caching allocator when `CUBLAS_WORKSPACE_CONFIG` is unset
    /// (`aten/src/ATen/cuda/CublasHandlePool.cpp`, `parseChosenWorkspaceSize`):
    /// `:4096:8` = 32 MiB on compute capability 9.x (Hopper) and 10.x / 12.x (Blackwell),
    /// `:4096:2:16:8` = 8 MiB + 128 KiB before; on ROCm hipBLASLt's 128 MiB for gfx942.
    pub fn blas_workspace_bytes(&self) -> u64 {
        match self.arch {
            Arch::Volta | Arch::Ampere => 2 * 4096 * 1024 + 8 * 16 * 1024,
            Arch::Hopper | Arch::Blackwell => 8 * 4096 * 1024,
            Arch::Cdna3 => 128 * MIB,
        }
    }
}

/// The catalog. Keys are lowercase, as written in scenario files. Unless noted, figures are
/// the vendor datasheets' dense (no sparsity) peaks as tabulated in stas00's ml-engineering
/// `compute/accelerator/README.md`; link figures from its `network/README.md`.
pub const CATALOG: &[GpuSpec] = &[
    GpuSpec {
        name: "v100-32gb",
        // nvidia-smi: 32510 MiB (Tesla V100-SXM2-32GB).
        memory_bytes: 32_510 * MIB,
        // Volta has FP16 tensor cores only: 125 TFLOP/s; no BF16, no TF32; 15.7 FP32.
        bf16_flops: None,
        fp16_flops: 125e12,
        tf32_flops: None,
        fp32_flops: 15.7e12,
        // Volta and Ampere have no FP8 tensor cores.
        fp8_flops: None,
        // ~900 GB/s HBM2.
        hbm_bytes_per_s: 900e9,
        // NVLink 2: 6 links, 150 GB/s per direction.
        nvlink_bytes_per_s: 150e9,
        pcie_gen: 3,
        // not measured in the table; assumed like A100
        max_matmul_fraction: 0.85,
        sms: 80,
        arch: Arch::Volta,
        default_node: "dgx-1v",
        source: "NVIDIA V100 datasheet (SXM2); stas00 ml-engineering",
    },
    GpuSpec {
        name: "a100-40gb",
        // nvidia-smi: 40960 MiB (A100-SXM4-40GB).
        memory_bytes: 40_960 * MIB,
        // NVIDIA A100 datasheet: 312 TFLOP/s BF16/FP16 dense, 156 TF32, 19.5 FP32.
        bf16_flops: Some(312e12),
        fp16_flops: 312e12,
        tf32_flops: Some(156e12),
        fp32_flops: 19.5e12,
        // Ampere has no FP8 tensor cores.
        fp8_flops: None,
        // A100 40GB SXM: 1,555 GB/s HBM2.
        hbm_bytes_per_s: 1.555e12,
        // NVLink 3: 12 links, 300 GB/s per direction.
        nvlink_bytes_per_s: 300e9,
        pcie_gen: 4,
        max_matmul_fraction: 0.869,
        sms: 108,
        arch: Arch::Ampere,
        default_node: "dgx-a100",
        source: "NVIDIA A100 datasheet (SXM4); stas00 ml-engineering",
    },
    GpuSpec {
        name: "a100-80gb",
        // nvidia-smi: 81920 MiB (A100-SXM4-80GB).
        memory_bytes: 81_920 * MIB,
        bf16_flops: Some(312e12),
        fp16_flops: 312e12,
        tf32_flops: Some(156e12),
        fp32_flops: 19.5e12,
        // Ampere has no FP8 tensor cores.
        fp8_flops: None,
        // A100 80GB SXM: 2,039 GB/s HBM2e.
        hbm_bytes_per_s: 2.039e12,
        nvlink_bytes_per_s: 300e9,
        pcie_gen: 4,
        max_matmul_fraction: 0.869,
        sms: 108,
        arch: Arch::Ampere,
        default_node: "dgx-a100",
        source: "NVIDIA A100 datasheet (SXM4 80GB); stas00 ml-engineering",
    },
    GpuSpec {
        name: "h100-sxm",
        // nvidia-smi: 81559 MiB (H100 80GB HBM3).
        memory_bytes: 81_559 * MIB,
        // NVIDIA H100 datasheet: 989 TFLOP/s BF16/FP16 dense (1979 with sparsity), 494.5 TF32,
        // 67 FP32.
        bf16_flops: Some(989e12),
        fp16_flops: 989e12,
        tf32_flops: Some(494.5e12),
        fp32_flops: 67e12,
        // H100 SXM datasheet: 1,979 TFLOP/s FP8 dense (3,958 with sparsity).
        fp8_flops: Some(1979e12),
        // 3.35 TB/s HBM3.
        hbm_bytes_per_s: 3.35e12,
        // NVLink 4: 18 links, 450 GB/s per direction.
        nvlink_bytes_per_s: 450e9,
        pcie_gen: 5,
        max_matmul_fraction: 0.803,
        sms: 132,
        arch: Arch::Hopper,
        default_node: "dgx-h100",
        source: "NVIDIA H100 datasheet (SXM5); stas00 ml-engineering",
    },
    GpuSpec {
        name: "h100-pcie",
        // nvidia-smi: 81559 MiB (H100 PCIe 80GB).
        memory_bytes: 81_559 * MIB,
        // H100 PCIe: 756 TFLOP/s BF16/FP16 dense, 378 TF32, 51 FP32.
        bf16_flops: Some(756e12),
        fp16_flops: 756e12,
        tf32_flops: Some(378e12),
        fp32_flops: 51e12,
        // H100 PCIe datasheet: 1,513 TFLOP/s FP8 dense (3,026 with sparsity).
        fp8_flops: Some(1513e12),
        // 2.0 TB/s HBM2e.
        hbm_bytes_per_s: 2.0e12,
        // No NVSwitch: GPU-to-GPU traffic crosses PCIe 5 x16 (63 GB/s per direction); NVLink
        // bridges join pairs only, which a ring over 8 GPUs cannot rely on.
        nvlink_bytes_per_s: 63e9,
        pcie_gen: 5,
        // as H100 SXM
        max_matmul_fraction: 0.803,
        sms: 114,
        arch: Arch::Hopper,
        default_node: "pcie-8gpu",
        source: "NVIDIA H100 datasheet (PCIe); stas00 ml-engineering (PCIe 5 x16 63 GB/s)",
    },
    GpuSpec {
        name: "h200",
        // nvidia-smi: 143771 MiB (H200 141GB HBM3e).
        memory_bytes: 143_771 * MIB,
        // Same GH100 compute as H100 SXM.
        bf16_flops: Some(989e12),
        fp16_flops: 989e12,
        tf32_flops: Some(494.5e12),
        fp32_flops: 67e12,
        // H200 SXM datasheet: 1,979 TFLOP/s FP8 dense, as H100 SXM.
        fp8_flops: Some(1979e12),
        // 4.8 TB/s HBM3e.
        hbm_bytes_per_s: 4.8e12,
        nvlink_bytes_per_s: 450e9,
        pcie_gen: 5,
        // "H200 is the same" as H100
        max_matmul_fraction: 0.803,
        sms: 132,
        arch: Arch::Hopper,
        default_node: "hgx-h200",
        source: "NVIDIA H200 datasheet (SXM); stas00 ml-engineering",
    },
    GpuSpec {
        name: "b200",
        // 180 GB HBM3e per the HGX B200 datasheet (some sources say 192 GB; the
        // nvidia-smi figure was not available to us: override with memory_capacity).
        memory_bytes: 180_000_000_000,
        // HGX B200 (1000 W): 2250 TFLOP/s BF16/FP16 dense, 1125 TF32, 75 FP32 (datasheet
        // figures vary between 75 and 80 TFLOP/s FP32).
        bf16_flops: Some(2250e12),
        fp16_flops: 2250e12,
        tf32_flops: Some(1125e12),
        fp32_flops: 75e12,
        // HGX B200 datasheet: 4.5 PFLOP/s FP8 dense (9 with sparsity).
        fp8_flops: Some(4500e12),
        // 8 TB/s HBM3e.
        hbm_bytes_per_s: 8.0e12,
        // NVLink 5: 18 links, 900 GB/s per direction.
        nvlink_bytes_per_s: 900e9,
        pcie_gen: 6,
        max_matmul_fraction: 0.776,
        sms: 148,
        arch: Arch::Blackwell,
        default_node: "dgx-b200",
        source: "NVIDIA HGX B200 datasheet; stas00 ml-engineering",
    },
    GpuSpec {
        name: "mi300x",
        // 192 GB HBM3 (rocm-smi reports 192 GiB-class VRAM: 196,592 MiB).
        memory_bytes: 196_592 * MIB,
        // AMD Instinct MI300X datasheet: 1307.4 TFLOP/s BF16/FP16 dense, 653.7 TF32,
        // 163.4 FP32 (matrix).
        bf16_flops: Some(1307.4e12),
        fp16_flops: 1307.4e12,
        tf32_flops: Some(653.7e12),
        fp32_flops: 163.4e12,
        // MI300X datasheet: 2,614.9 TFLOP/s FP8 dense.
        fp8_flops: Some(2614.9e12),
        // 5.3 TB/s HBM3.
        hbm_bytes_per_s: 5.3e12,
        // Infinity Fabric (xGMI): 7 links of 64 GB/s to the other GPUs of the board,
        // 448 GB/s aggregate per GPU; RCCL rings use all of them.
        nvlink_bytes_per_s: 448e9,
        pcie_gen: 5,
        max_matmul_fraction: 0.514,
        sms: 304,
        arch: Arch::Cdna3,
        default_node: "mi300x-8gpu",
        source: "AMD Instinct MI300X datasheet; stas00 ml-engineering network/README.md (xGMI)",
    },
];

/// A node layout: how many GPUs share a node and its network interfaces.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeSpec {
    pub name: &'static str,
    pub gpus_per_node: u32,
    /// Compute-fabric NICs per node (storage/management NICs left out).
    pub nics_per_node: u32,
    /// Bandwidth of one NIC, one direction, bytes/s.
    pub nic_bytes_per_s: f64,
    /// The GPUs connect through NVSwitch (all-to-all NVLink): NCCL's channel count inside
    /// the node, and NVLS on Hopper and later ([`crate::net::nccl_memory`]).
    pub nvswitch: bool,
    pub source: &'static str,
}

/// Named node presets; a scenario may override each field.
pub const NODES: &[NodeSpec] = &[
    // NVIDIA DGX-1 (V100): 4 x EDR 100 Gb/s InfiniBand.
    NodeSpec {
        name: "dgx-1v",
        gpus_per_node: 8,
        nics_per_node: 4,
        nic_bytes_per_s: 12.5e9,
        nvswitch: false,
        source: "NVIDIA DGX-1 datasheet (4x EDR IB)",
    },
    // DGX A100: 8 x HDR 200 Gb/s (ConnectX-6) for the compute fabric.
    NodeSpec {
        name: "dgx-a100",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 25e9,
        nvswitch: true,
        source: "NVIDIA DGX A100 datasheet (8x HDR200)",
    },
    // DGX H100: 8 x NDR 400 Gb/s (ConnectX-7) = 3.2 Tb/s per node.
    NodeSpec {
        name: "dgx-h100",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        source: "NVIDIA DGX H100 datasheet (8x NDR400)",
    },
    NodeSpec {
        name: "hgx-h200",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        source: "HGX H200 reference design (8x NDR400)",
    },
    // DGX B200: 8 x 400 Gb/s (ConnectX-7).
    NodeSpec {
        name: "dgx-b200",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        source: "NVIDIA DGX B200 datasheet (8x 400 Gb/s)",
    },
    // AWS p4d.24xlarge: 8 x A100 40GB, EFA v1 4 x 100 Gb/s = 400 Gb/s per node.
    NodeSpec {
        name: "aws-p4d",
        gpus_per_node: 8,
        nics_per_node: 4,
        nic_bytes_per_s: 12.5e9,
        nvswitch: true,
        source: "AWS p4d (EFA 4x100 Gb/s), stas00 network/README.md",
    },
    // AWS p4de.24xlarge: 8 x A100 80GB, the same EFA v1 4 x 100 Gb/s.
    NodeSpec {
        name: "aws-p4de",
        gpus_per_node: 8,
        nics_per_node: 4,
        nic_bytes_per_s: 12.5e9,
        nvswitch: true,
        source: "AWS p4de (EFA 4x100 Gb/s)",
    },
    // AWS p5.48xlarge: 8 x H100, EFA v2 32 x 100 Gb/s = 3.2 Tb/s per node.
    NodeSpec {
        name: "aws-p5",
        gpus_per_node: 8,
        nics_per_node: 32,
        nic_bytes_per_s: 12.5e9,
        nvswitch: true,
        source: "AWS p5 (EFA v2 32x100 Gb/s), stas00 network/README.md",
    },
    // A generic 8-GPU PCIe server with one NDR 400 Gb/s NIC per two GPUs.
    NodeSpec {
        name: "pcie-8gpu",
        gpus_per_node: 8,
        nics_per_node: 4,
        nic_bytes_per_s: 50e9,
        nvswitch: false,
        source: "generic PCIe server (4x NDR400), an assumption",
    },
    // 8 x MI300X platform with 8 x 400 Gb/s NICs (RoCE / IB).
    NodeSpec {
        name: "mi300x-8gpu",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: false,
        source: "AMD MI300X platform reference (8x 400 Gb/s)",
    },
];

/// Looks a node preset up by its key.
pub fn node(name: &str) -> Option<&'static NodeSpec> {
    NODES.iter().find(|n| n.name == name)
}

pub fn node_names() -> Vec<&'static str> {
    NODES.iter().map(|n| n.name).collect()
}

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
    /// The node preset the network figures came from (before overrides).
    pub node: String,
    pub nics_per_node: u32,
    pub nic_bytes_per_s: f64,
    /// Usable device memory before the CUDA context is taken out.
    pub memory_bytes: u64,
    /// Memory the CUDA context and libraries hold outside PyTorch's allocator.
    pub cuda_context_bytes: u64,
}

impl Cluster {
    /// A cluster of `gpus` GPUs of catalog type `gpu` in its default node layout, without
    /// overrides (what a scenario gets when it names only the GPU and the count).
    pub fn of(gpu: &str, gpus: u32) -> Option<Cluster> {
        let g = lookup(gpu)?;
        let n = node(g.default_node)?;
        Some(Cluster {
            gpu: g.clone(),
            gpus,
            gpus_per_node: gpus.min(n.gpus_per_node),
            node: n.name.to_string(),
            nics_per_node: n.nics_per_node,
            nic_bytes_per_s: n.nic_bytes_per_s,
            memory_bytes: g.memory_bytes,
            cuda_context_bytes: 0,
        })
    }

    /// What the allocator may hand out: device memory less the CUDA context.
    pub fn capacity_bytes(&self) -> u64 {
        self.memory_bytes.saturating_sub(self.cuda_context_bytes)
    }
    pub fn nodes(&self) -> u32 {
        self.gpus.div_ceil(self.gpus_per_node)
    }
    /// Each GPU's share of its node's network, one direction, bytes/s.
    pub fn network_bytes_per_s(&self) -> f64 {
        self.nics_per_node as f64 * self.nic_bytes_per_s / self.gpus_per_node.max(1) as f64
    }
    /// Dense peak of the dtype kernels compute in, FLOP/s (FP32 without TF32, as PyTorch's
    /// default `allow_tf32 = False` for matmuls).
    pub fn peak_flops(&self, compute: crate::model::Dtype) -> f64 {
        use crate::model::Dtype;
        match compute {
            Dtype::Fp32 => self.gpu.fp32_flops,
            Dtype::Fp16 => self.gpu.fp16_flops,
            Dtype::Bf16 => self.gpu.bf16_flops.unwrap_or(self.gpu.fp32_flops),
        }
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
        for g in CATALOG {
            assert!(node(g.default_node).is_some(), "{}: unknown default node {}", g.name, g.default_node);
            assert!(g.fp16_flops >= g.fp32_flops && g.hbm_bytes_per_s > 0.0 && g.nvlink_bytes_per_s > 0.0);
            assert!(g.max_matmul_fraction > 0.3 && g.max_matmul_fraction <= 1.0);
        }
    }

    #[test]
    fn dgx_h100_gives_each_gpu_one_ndr400_nic() {
        let c = Cluster::of("h100-sxm", 16).unwrap();
        assert_eq!(c.network_bytes_per_s(), 50e9);
        assert_eq!(c.nodes(), 2);
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
