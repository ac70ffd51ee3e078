//! GPU catalog: the figures every time and capacity number in a report traces back to.
//!
//! Each entry names its source. Capacities are the `memory.total` that `nvidia-smi` reports for
//! the part (MiB), because that is what `torch.cuda.get_device_properties().total_memory`
//! sees; the marketing "80 GB" is 80 GiB of HBM of which the driver exposes slightly less.
//! Peaks are dense (no 2:4 sparsity) BF16 tensor-core figures from the vendor datasheets as
//! collected in stas00's ml-engineering `compute/accelerator/README.md`; link bandwidths are
//! unidirectional per GPU (`network/README.md` of the same collection).
//!
//! GeForce parts (RTX 3090, 4090, 5090) and the A10G tensor-multiply FP16/BF16 (and, on Ada and
//! later, FP8) at half rate when they accumulate in FP32, and their datasheets quote both rates.
//! PyTorch's cuBLAS GEMMs accumulate in FP32 (`CUBLAS_COMPUTE_32F`), so their entries carry the
//! FP32-accumulate figures. A part with no GPU fabric (NVLink / xGMI) carries its PCIe x16
//! link, one direction, as its intra-node link; GeForce drivers expose no PCIe peer-to-peer, so
//! NCCL stages through host memory there (each entry says what was measured).
//!
//! A scenario may also describe a part that is not here (`gpu = "custom"` with
//! `[hardware.custom]`, see `crate::scenario`): its [`GpuSpec::name`] is then the user's.

use serde::Serialize;
use std::borrow::Cow;

/// One GPU model: what bounds memory, compute and communication.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuSpec {
    /// Catalog key used in scenario files (a user-defined GPU's own name for `gpu = "custom"`).
    pub name: Cow<'static, str>,
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
    /// run at once, for the GEMM model's waves and split-K (0: not known, for a user-defined
    /// GPU without `sms`: neither).
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

/// The largest `max_matmul_fraction` a part may have: a measured GEMM beats its datasheet
/// peak by up to 8% on GeForce cards, whose clocks run above the boost clock their datasheets
/// count (the RTX 4090's 1.082 below).
pub const MAX_MATMUL_FRACTION: f64 = 1.1;

/// A GPU architecture (NVIDIA compute capability, AMD gfx target): one variant per target the
/// libraries stepsim models key a default on (cuBLAS's workspace by compute capability, NCCL's
/// P2P read on sm80 only, NVLS on NVLink-SHARP parts, RCCL on gfx942).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// sm70.
    Volta,
    /// sm80 (GA100: A100, A30).
    Ampere,
    /// sm86 (GA10x: RTX 30, A10 / A10G, A40, RTX A6000). Not sm80: NCCL enables P2P read on
    /// compute capability 8.0 only (`ncclTopoCheckP2p`).
    Ga10x,
    /// sm89 (Ada: RTX 40, L4, L40S): FP8 tensor cores; compute capability 8.x, so PyTorch's
    /// smaller cuBLAS workspace.
    Ada,
    /// sm90.
    Hopper,
    /// sm100 (B200, GB200).
    Blackwell,
    /// sm120 (GB20x: RTX 50, RTX PRO Blackwell): compute capability 12.x (PyTorch's 32 MiB
    /// cuBLAS workspace) but no NVLink, so no NVLS.
    Gb20x,
    /// gfx942 (ROCm: RCCL and hipBLASLt instead of NCCL and cuBLAS).
    Cdna3,
}

impl Arch {
    /// Every architecture, with the name `[hardware.custom] arch` takes.
    pub const ALL: [(&'static str, Arch); 8] = [
        ("volta", Arch::Volta),
        ("ampere", Arch::Ampere),
        ("ga10x", Arch::Ga10x),
        ("ada", Arch::Ada),
        ("hopper", Arch::Hopper),
        ("blackwell", Arch::Blackwell),
        ("gb20x", Arch::Gb20x),
        ("cdna3", Arch::Cdna3),
    ];

    /// The name `[hardware.custom] arch` takes.
    pub fn name(self) -> &'static str {
        Arch::ALL.iter().find(|(_, a)| *a == self).map_or("", |(n, _)| n)
    }

    /// NVLink SHARP (NVSwitch multicast, NCCL's NVLS): data-center Hopper and Blackwell; the
    /// GB20x parts have compute capability 12.0 but no NVLink.
    pub fn nvlink_sharp(self) -> bool {
        matches!(self, Arch::Hopper | Arch::Blackwell)
    }

    /// The CUDA compute capability (major x 10 + minor) of the generation's parts, as NCCL's
    /// tuner groups them; None for the ROCm part.
    pub fn compute_capability(self) -> Option<u32> {
        match self {
            Arch::Volta => Some(70),
            Arch::Ampere => Some(80),
            Arch::Ga10x => Some(86),
            Arch::Ada => Some(89),
            Arch::Hopper => Some(90),
            Arch::Blackwell => Some(100),
            Arch::Gb20x => Some(120),
            Arch::Cdna3 => None,
        }
    }

    /// Tensor cores with FP8 (E4M3 / E5M2) inputs: sm89 and later.
    pub fn has_fp8(self) -> bool {
        matches!(self, Arch::Ada | Arch::Hopper | Arch::Blackwell | Arch::Gb20x | Arch::Cdna3)
    }
}

impl GpuSpec {
    /// Bytes of one cuBLAS workspace PyTorch allocates per (cuBLAS handle, stream) through
    /// its caching allocator when `CUBLAS_WORKSPACE_CONFIG` is unset
    /// (`aten/src/ATen/cuda/CublasHandlePool.cpp`, `parseChosenWorkspaceSize`):
    /// `:4096:8` = 32 MiB on compute capability 9.x (Hopper) and 10.x / 12.x (Blackwell,
    /// GB20x), `:4096:2:16:8` = 8 MiB + 128 KiB before (8.x: Ampere, GA10x, Ada); on ROCm
    /// hipBLASLt's 128 MiB for gfx942.
    pub fn blas_workspace_bytes(&self) -> u64 {
        match self.arch {
            Arch::Volta | Arch::Ampere | Arch::Ga10x | Arch::Ada => 2 * 4096 * 1024 + 8 * 16 * 1024,
            Arch::Hopper | Arch::Blackwell | Arch::Gb20x => 8 * 4096 * 1024,
            Arch::Cdna3 => 128 * MIB,
        }
    }

    /// Bytes of Transformer Engine's own cuBLAS workspace (`get_cublas_workspace_size_bytes`,
    /// transformer_engine/pytorch/cpp_extensions/gemm.py, NVIDIA/TransformerEngine d0067d0):
    /// 32 MiB + 1 KiB (NVFP4 GEMMs' scales) from compute capability 9.0, 4 MiB before. One
    /// per device for its GEMMs and one per compute stream (four,
    /// common/util/multi_stream.cpp) for its grouped GEMMs, each cached for the process.
    pub fn te_workspace_bytes(&self) -> u64 {
        match self.arch {
            Arch::Hopper | Arch::Blackwell | Arch::Gb20x => 32 * MIB + 1024,
            _ => 4 * MIB,
        }
    }
}

/// Transformer Engine's compute streams for grouped GEMMs (`num_compute_streams`,
/// transformer_engine/common/util/multi_stream.cpp): each has its own cuBLAS workspace.
pub const TE_GROUPED_GEMM_STREAMS: u64 = 4;

/// NVIDIA H100 SXM5 80GB (also the base of the H800 entry).
const H100_SXM: GpuSpec = GpuSpec {
    name: Cow::Borrowed("h100-sxm"),
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
};

/// The catalog. Keys are lowercase, as written in scenario files. Unless noted, figures are
/// the vendor datasheets' dense (no sparsity) peaks as tabulated in stas00's ml-engineering
/// `compute/accelerator/README.md`; link figures from its `network/README.md`; capacities the
/// `memory.total` of nvidia-smi output quoted in public logs and issues; matmul fractions
/// stas00's "Maximum achievable matmul FLOPS" table, or for parts it lacks the same
/// measurement (mamf-finder, BF16) in mag-/gpu_benchmark's README. An entry whose figure is an
/// estimate says so.
pub const CATALOG: &[GpuSpec] = &[
    GpuSpec {
        name: Cow::Borrowed("v100-32gb"),
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
        name: Cow::Borrowed("a10g"),
        // nvidia-smi: 23028 MiB (NVIDIA A10G, AWS G5).
        memory_bytes: 23_028 * MIB,
        // ESTIMATES: an AWS-only GA102 part with no NVIDIA datasheet. Baseten's "NVIDIA A10 vs
        // A10G" says it trades the A10's tensor throughput (125 TFLOP/s) for CUDA-core throughput
        // (the A10: 31.2). Derived here from its commonly reported 80 SMs at 1,710 MHz: FP32
        // 80 x 128 x 2 x 1.71 GHz = 35 TFLOP/s; tensor FP16/BF16 at GeForce GA102's FP32-
        // accumulate rate (half its FP16-accumulate one), 80 x 4 x 128 x 1.71 GHz = 70; TF32 35.
        bf16_flops: Some(70e12),
        fp16_flops: 70e12,
        tf32_flops: Some(35e12),
        fp32_flops: 35e12,
        // Ampere (GA10x) has no FP8 tensor cores.
        fp8_flops: None,
        // 600 GB/s GDDR6, as the A10.
        hbm_bytes_per_s: 600e9,
        // No NVLink: PCIe 4.0 x16, 31 GB/s per direction (stas00 network/README.md).
        nvlink_bytes_per_s: 31e9,
        pcie_gen: 4,
        // Not measured; assumed like the RTX A6000 (GA102): 131.2 of 154.8 TFLOP/s BF16 in
        // mag-/gpu_benchmark's MAMF table (mamf-finder, BF16, median of 100).
        max_matmul_fraction: 0.848,
        sms: 80,
        arch: Arch::Ga10x,
        default_node: "aws-g5",
        source: "AWS EC2 G5 (NVIDIA A10G, no NVIDIA datasheet); Baseten A10 vs A10G (estimates)",
    },
    GpuSpec {
        name: Cow::Borrowed("rtx-3090"),
        // nvidia-smi: 24576 MiB (NVIDIA GeForce RTX 3090).
        memory_bytes: 24_576 * MIB,
        // NVIDIA Ampere GA102 whitepaper, appendix A (GeForce RTX 3090): FP16/BF16 tensor 71
        // TFLOP/s dense with FP32 accumulate (142 with FP16 accumulate, which PyTorch does not
        // use), TF32 35.6, FP32 35.6.
        bf16_flops: Some(71e12),
        fp16_flops: 71e12,
        tf32_flops: Some(35.6e12),
        fp32_flops: 35.6e12,
        // Ampere (GA10x) has no FP8 tensor cores.
        fp8_flops: None,
        // 936 GB/s GDDR6X.
        hbm_bytes_per_s: 936e9,
        // PCIe 4.0 x16, 31 GB/s per direction. The NVLink bridge (56.25 GB/s per direction)
        // joins pairs only, and GeForce exposes no PCIe peer-to-peer: NCCL stages through host
        // memory, so an 8-GPU ring gets less (override hardware.nvlink_gb_per_s).
        nvlink_bytes_per_s: 31e9,
        pcie_gen: 4,
        // Not measured; assumed like the RTX A6000 (GA102): 131.2 of 154.8 TFLOP/s BF16 in
        // mag-/gpu_benchmark's MAMF table (mamf-finder, BF16, median of 100).
        max_matmul_fraction: 0.848,
        sms: 82,
        arch: Arch::Ga10x,
        default_node: "workstation",
        source: "NVIDIA Ampere GA102 whitepaper (GeForce RTX 3090, FP32-accumulate tensor rates)",
    },
    GpuSpec {
        name: Cow::Borrowed("a100-40gb"),
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
        name: Cow::Borrowed("a100-80gb"),
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
        name: Cow::Borrowed("rtx-4090"),
        // nvidia-smi: 24564 MiB (NVIDIA GeForce RTX 4090).
        memory_bytes: 24_564 * MIB,
        // NVIDIA Ada GPU architecture whitepaper, appendix (GeForce RTX 4090): FP16/BF16 tensor
        // 165.2 TFLOP/s dense with FP32 accumulate (330.3 with FP16 accumulate), TF32 82.6,
        // FP32 82.6.
        bf16_flops: Some(165.2e12),
        fp16_flops: 165.2e12,
        tf32_flops: Some(82.6e12),
        fp32_flops: 82.6e12,
        // Ada whitepaper: FP8 330.3 TFLOP/s dense with FP32 accumulate (660.6 with FP16).
        fp8_flops: Some(330.3e12),
        // 1,008 GB/s GDDR6X.
        hbm_bytes_per_s: 1.008e12,
        // PCIe 4.0 x16, 31 GB/s per direction (no NVLink). 4 x RTX 4090 all-reduce busbw
        // 25.9 GB/s with a P2P-enabling driver (tinygrad/open-gpu-kernel-modules#36), 84% of it;
        // the stock driver has no peer-to-peer and stages through host memory.
        nvlink_bytes_per_s: 31e9,
        pcie_gen: 4,
        // mag-/gpu_benchmark's MAMF table: 178.8 TFLOP/s BF16 (14336x4096x4096), 108.2% of the
        // FP32-accumulate peak: GeForce cards boost above the 2,520 MHz the datasheet counts.
        max_matmul_fraction: 1.082,
        sms: 128,
        arch: Arch::Ada,
        default_node: "workstation",
        source: "NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090, FP32-accumulate tensor rates)",
    },
    GpuSpec {
        name: Cow::Borrowed("l4"),
        // nvidia-smi: 23034 MiB (NVIDIA L4).
        memory_bytes: 23_034 * MIB,
        // NVIDIA L4 datasheet: BF16/FP16 tensor 242 TFLOP/s with sparsity (121 dense), TF32 120
        // (60 dense), FP32 30.3.
        bf16_flops: Some(121e12),
        fp16_flops: 121e12,
        tf32_flops: Some(60e12),
        fp32_flops: 30.3e12,
        // L4 datasheet: FP8 485 TFLOP/s with sparsity (242.5 dense).
        fp8_flops: Some(242.5e12),
        // 300 GB/s GDDR6.
        hbm_bytes_per_s: 300e9,
        // No NVLink: PCIe 4.0 x16, 31 GB/s per direction (stas00 network/README.md).
        nvlink_bytes_per_s: 31e9,
        pcie_gen: 4,
        // mag-/gpu_benchmark's MAMF table: 91.4 TFLOP/s BF16 (1024x6016x1792), 75.5% of 121.
        max_matmul_fraction: 0.755,
        sms: 58,
        arch: Arch::Ada,
        default_node: "aws-g6",
        source: "NVIDIA L4 datasheet; stas00 ml-engineering (PCIe 4 x16 31 GB/s)",
    },
    GpuSpec {
        name: Cow::Borrowed("l40s"),
        // nvidia-smi: 46068 MiB (NVIDIA L40S).
        memory_bytes: 46_068 * MIB,
        // NVIDIA L40S datasheet: BF16/FP16 tensor 362.05 TFLOP/s dense (733 with sparsity), TF32
        // 183, FP32 91.6.
        bf16_flops: Some(362.05e12),
        fp16_flops: 362.05e12,
        tf32_flops: Some(183e12),
        fp32_flops: 91.6e12,
        // L40S datasheet: FP8 733 TFLOP/s dense (1,466 with sparsity).
        fp8_flops: Some(733e12),
        // 864 GB/s GDDR6.
        hbm_bytes_per_s: 864e9,
        // No NVLink: PCIe 4.0 x16, 31 GB/s per direction (stas00 network/README.md).
        nvlink_bytes_per_s: 31e9,
        pcie_gen: 4,
        // mag-/gpu_benchmark's MAMF table: 252.0 TFLOP/s BF16 (4416x3776x3072), 69.6% of 362.05.
        max_matmul_fraction: 0.696,
        sms: 142,
        arch: Arch::Ada,
        default_node: "aws-g6e",
        source: "NVIDIA L40S datasheet; stas00 ml-engineering",
    },
    H100_SXM,
    GpuSpec {
        name: Cow::Borrowed("h100-pcie"),
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
        name: Cow::Borrowed("h100-nvl"),
        // nvidia-smi: 95830 MiB (NVIDIA H100 NVL, 94 GB HBM3).
        memory_bytes: 95_830 * MIB,
        // NVIDIA H100 datasheet (H100 NVL): BF16/FP16 1,671 TFLOP/s with sparsity (835.5 dense),
        // TF32 835 (417.5 dense), FP32 60.
        bf16_flops: Some(835.5e12),
        fp16_flops: 835.5e12,
        tf32_flops: Some(417.5e12),
        fp32_flops: 60e12,
        // H100 NVL datasheet: FP8 3,341 TFLOP/s with sparsity (1,670.5 dense).
        fp8_flops: Some(1670.5e12),
        // 3.9 TB/s HBM3.
        hbm_bytes_per_s: 3.9e12,
        // As h100-pcie: the NVLink bridge (600 GB/s, 300 per direction) joins pairs only, so a
        // ring over the node crosses PCIe 5 x16 (63 GB/s per direction). A 2-GPU job on one
        // bridged pair: hardware.nvlink_gb_per_s = 300.
        nvlink_bytes_per_s: 63e9,
        pcie_gen: 5,
        // mag-/gpu_benchmark's MAMF table: 488.5 TFLOP/s BF16 on one card, 58.5% of 835.5 (the
        // H100 NVL's power limit is configurable, 350-400 W).
        max_matmul_fraction: 0.585,
        sms: 132,
        arch: Arch::Hopper,
        default_node: "pcie-8gpu",
        source: "NVIDIA H100 datasheet (H100 NVL); stas00 ml-engineering (PCIe 5 x16 63 GB/s)",
    },
    // The export part: the H100 SXM die, HBM3 and clocks (NVIDIA H800 SXM5 datasheet: the
    // same BF16/FP16/TF32/FP8 peaks; FP64, which stepsim does not use, was cut) with 8 of
    // NVLink 4's 18 links: 400 GB/s, 200 per direction, on an HGX 8-GPU NVSwitch board.
    // DeepSeek-V3's report measures about 160 GB/s achievable (arXiv 2412.19437, 3.2.2).
    GpuSpec {
        name: Cow::Borrowed("h800"),
        nvlink_bytes_per_s: 200e9,
        default_node: "hgx-h800",
        source: "NVIDIA H800 SXM5 datasheet; DeepSeek-V3 technical report (NVLink, IB)",
        ..H100_SXM
    },
    GpuSpec {
        name: Cow::Borrowed("h20"),
        // nvidia-smi: 97871 MiB (NVIDIA H20, 96 GB HBM3).
        memory_bytes: 97_871 * MIB,
        // NVIDIA publishes no H20 datasheet; the specification as the press reported it (e.g.
        // Wccftech, willitrunai.com's H20 page): BF16/FP16 148 TFLOP/s dense, TF32 74, FP32 44.
        bf16_flops: Some(148e12),
        fp16_flops: 148e12,
        tf32_flops: Some(74e12),
        fp32_flops: 44e12,
        // Reported as INT8 296 TOPS; Hopper's FP8 rate equals its INT8 rate: FP8 296 TFLOP/s
        // dense (an inference from the architecture).
        fp8_flops: Some(296e12),
        // 4.0 TB/s HBM3.
        hbm_bytes_per_s: 4.0e12,
        // NVLink 4 kept: 900 GB/s, 450 per direction, on an HGX 8-GPU NVSwitch board.
        nvlink_bytes_per_s: 450e9,
        pcie_gen: 5,
        // Not measured; assumed like H100 SXM.
        max_matmul_fraction: 0.803,
        // 78 SMs as a Geekbench 6 listing reports (its tensor rate is capped by firmware, not
        // by the SM count).
        sms: 78,
        arch: Arch::Hopper,
        default_node: "hgx-h20",
        source: "NVIDIA H20 as the press reported it (no public NVIDIA datasheet)",
    },
    GpuSpec {
        name: Cow::Borrowed("h200"),
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
        name: Cow::Borrowed("gh200-96gb"),
        // nvidia-smi: 97871 MiB (NVIDIA GH200 480GB: 96 GB HBM3 beside 480 GB LPDDR5X).
        memory_bytes: 97_871 * MIB,
        // NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 SXM's GPU, BF16/FP16 1,979
        // TFLOP/s with sparsity (989 dense), TF32 494.5 dense, FP32 67.
        bf16_flops: Some(989e12),
        fp16_flops: 989e12,
        tf32_flops: Some(494.5e12),
        fp32_flops: 67e12,
        // GH200 datasheet: FP8 3,958 TFLOP/s with sparsity (1,979 dense).
        fp8_flops: Some(1979e12),
        // 4 TB/s HBM3 (96 GB version).
        hbm_bytes_per_s: 4.0e12,
        // NVLink 4: 18 links, 450 GB/s per direction; four superchips of a node reach each
        // other all-to-all over them (6 links a pair), which rings over the node use together.
        nvlink_bytes_per_s: 450e9,
        // The GPU reaches Grace's memory over NVLink-C2C (900 GB/s), not PCIe: offload copies
        // are modelled at PCIe 5's measured rates (set offload.h2d_gb_per_s / d2h_gb_per_s).
        pcie_gen: 5,
        // mag-/gpu_benchmark's MAMF table: 852.5 TFLOP/s BF16 on GH200 96GB, 86.2% of 989.
        max_matmul_fraction: 0.862,
        sms: 132,
        arch: Arch::Hopper,
        default_node: "quad-gh200",
        source: "NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3); stas00 ml-engineering",
    },
    GpuSpec {
        name: Cow::Borrowed("gh200-144gb"),
        // nvidia-smi: 146831 MiB (NVIDIA GH200 144G HBM3e).
        memory_bytes: 146_831 * MIB,
        // As gh200-96gb: the H100 SXM's GPU.
        bf16_flops: Some(989e12),
        fp16_flops: 989e12,
        tf32_flops: Some(494.5e12),
        fp32_flops: 67e12,
        fp8_flops: Some(1979e12),
        // 4.9 TB/s HBM3e (144 GB version).
        hbm_bytes_per_s: 4.9e12,
        nvlink_bytes_per_s: 450e9,
        // NVLink-C2C to Grace, as gh200-96gb.
        pcie_gen: 5,
        // stas00 MAMF table: 828.6 TFLOP/s BF16, 83.8% of 989 ("900W 141GiB HBM3e version").
        max_matmul_fraction: 0.838,
        sms: 132,
        arch: Arch::Hopper,
        default_node: "quad-gh200",
        source: "NVIDIA GH200 Grace Hopper Superchip datasheet (144 GB HBM3e); stas00 ml-engineering",
    },
    GpuSpec {
        name: Cow::Borrowed("rtx-5090"),
        // nvidia-smi: 32607 MiB (NVIDIA GeForce RTX 5090).
        memory_bytes: 32_607 * MIB,
        // NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090): FP16/BF16 tensor
        // 209.5 TFLOP/s dense with FP32 accumulate (419 with FP16 accumulate), TF32 104.8,
        // FP32 104.8.
        bf16_flops: Some(209.5e12),
        fp16_flops: 209.5e12,
        tf32_flops: Some(104.8e12),
        fp32_flops: 104.8e12,
        // The whitepaper: FP8 419 TFLOP/s dense with FP32 accumulate (838 with FP16).
        fp8_flops: Some(419e12),
        // 1,792 GB/s GDDR7.
        hbm_bytes_per_s: 1.792e12,
        // PCIe 5.0 x16, 63 GB/s per direction (no NVLink). Measured: 8 x RTX 5090 all-reduce
        // busbw 28 GB/s, 4 GPUs 35 GB/s (NVIDIA/nccl#1639, where NCCL's maintainer answers that
        // on PCIe systems the host's CPU and memory bound it), against the 50 this figure gives
        // at net::LINK_EFFICIENCY: for an 8-GPU server, hardware.nvlink_gb_per_s = 35 matches.
        nvlink_bytes_per_s: 63e9,
        pcie_gen: 5,
        // torch.matmul BF16 224.3 TFLOP/s at 16384x8192x1280 (SemiAnalysis matmul benchmark,
        // main-horse.github.io "Things I learned digging into 5090 perf"), 107.1% of the
        // FP32-accumulate peak; a single shape, not a search.
        max_matmul_fraction: 1.071,
        sms: 170,
        arch: Arch::Gb20x,
        default_node: "workstation",
        source: "NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090, FP32-accumulate tensor rates)",
    },
    GpuSpec {
        name: Cow::Borrowed("b200"),
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
        name: Cow::Borrowed("gb200"),
        // nvidia-smi: 189471 MiB (NVIDIA GB200: one of a superchip's two Blackwell GPUs).
        memory_bytes: 189_471 * MIB,
        // NVIDIA GB200 NVL72 specifications divided by its 72 GPUs (stas00's per-chip row):
        // BF16/FP16 2,500 TFLOP/s dense, TF32 1,250, FP32 80.
        bf16_flops: Some(2500e12),
        fp16_flops: 2500e12,
        tf32_flops: Some(1250e12),
        fp32_flops: 80e12,
        // The same: FP8 5,000 TFLOP/s dense.
        fp8_flops: Some(5000e12),
        // 8 TB/s HBM3e per GPU (576 TB/s over 72).
        hbm_bytes_per_s: 8.0e12,
        // NVLink 5: 900 GB/s per direction to the NVL72 NVSwitch domain.
        nvlink_bytes_per_s: 900e9,
        // As b200; the host link is NVLink-C2C to Grace (offload copies at PCIe 5's measured
        // rates unless offload.h2d_gb_per_s / d2h_gb_per_s say otherwise).
        pcie_gen: 6,
        // stas00 MAMF table: 1,822.0 TFLOP/s BF16, 72.9% of 2,500.
        max_matmul_fraction: 0.729,
        sms: 148,
        arch: Arch::Blackwell,
        default_node: "gb200-nvl72",
        source: "NVIDIA GB200 NVL72 specifications (per GPU); stas00 ml-engineering",
    },
    GpuSpec {
        name: Cow::Borrowed("mi300x"),
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
    GpuSpec {
        name: Cow::Borrowed("mi325x"),
        // 256 GB HBM3E. No rocm-smi figure was found; derived from the MI300X's, whose
        // rocm-smi VRAM total of 205,822,885,888 B is 192 GiB less 320 MiB: 256 GiB less 320
        // MiB (an estimate; override with hardware.memory_capacity).
        memory_bytes: 261_824 * MIB,
        // AMD Instinct MI325X datasheet: the MI300X's compute, 1307.4 TFLOP/s BF16/FP16 dense,
        // 653.7 TF32, 163.4 FP32 (matrix).
        bf16_flops: Some(1307.4e12),
        fp16_flops: 1307.4e12,
        tf32_flops: Some(653.7e12),
        fp32_flops: 163.4e12,
        // MI325X datasheet: 2,614.9 TFLOP/s FP8 dense.
        fp8_flops: Some(2614.9e12),
        // 6 TB/s HBM3E.
        hbm_bytes_per_s: 6.0e12,
        // Infinity Fabric as MI300X: 7 x 64 GB/s = 448 GB/s per GPU (stas00 network/README.md).
        nvlink_bytes_per_s: 448e9,
        pcie_gen: 5,
        // stas00 MAMF table: 784.9 TFLOP/s BF16 (TunableOp on, 1000 W; the table gives 60.4%
        // of a rounded 1,300), 60.0% of this entry's 1,307.4.
        max_matmul_fraction: 0.600,
        sms: 304,
        arch: Arch::Cdna3,
        default_node: "mi325x-8gpu",
        source: "AMD Instinct MI325X datasheet; stas00 ml-engineering network/README.md (xGMI)",
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
    /// The network the NICs are on, which sets the share of their rate collectives reach
    /// (`crate::schedule::cost::nic_efficiency`).
    pub fabric: Fabric,
    pub source: &'static str,
}

/// A node's inter-node network, as far as a measured NIC efficiency tells fabrics apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fabric {
    /// InfiniBand NDR, 400 Gb/s ConnectX-7.
    InfinibandNdr,
    /// AWS Elastic Fabric Adapter.
    Efa,
    /// Everything without its own measurement: HDR and EDR InfiniBand, RoCE, Slingshot,
    /// Ethernet.
    Other,
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
        fabric: Fabric::Other,
        source: "NVIDIA DGX-1 datasheet (4x EDR IB)",
    },
    // DGX A100: 8 x HDR 200 Gb/s (ConnectX-6) for the compute fabric.
    NodeSpec {
        name: "dgx-a100",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 25e9,
        nvswitch: true,
        fabric: Fabric::Other,
        source: "NVIDIA DGX A100 datasheet (8x HDR200)",
    },
    // DGX H100: 8 x NDR 400 Gb/s (ConnectX-7) = 3.2 Tb/s per node.
    NodeSpec {
        name: "dgx-h100",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        fabric: Fabric::InfinibandNdr,
        source: "NVIDIA DGX H100 datasheet (8x NDR400)",
    },
    NodeSpec {
        name: "hgx-h200",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        fabric: Fabric::InfinibandNdr,
        source: "HGX H200 reference design (8x NDR400)",
    },
    // DGX B200: 8 x 400 Gb/s (ConnectX-7).
    NodeSpec {
        name: "dgx-b200",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        fabric: Fabric::InfinibandNdr,
        source: "NVIDIA DGX B200 datasheet (8x 400 Gb/s)",
    },
    // AWS p4d.24xlarge: 8 x A100 40GB, EFA v1 4 x 100 Gb/s = 400 Gb/s per node.
    NodeSpec {
        name: "aws-p4d",
        gpus_per_node: 8,
        nics_per_node: 4,
        nic_bytes_per_s: 12.5e9,
        nvswitch: true,
        fabric: Fabric::Efa,
        source: "AWS p4d (EFA 4x100 Gb/s), stas00 network/README.md",
    },
    // AWS p4de.24xlarge: 8 x A100 80GB, the same EFA v1 4 x 100 Gb/s.
    NodeSpec {
        name: "aws-p4de",
        gpus_per_node: 8,
        nics_per_node: 4,
        nic_bytes_per_s: 12.5e9,
        nvswitch: true,
        fabric: Fabric::Efa,
        source: "AWS p4de (EFA 4x100 Gb/s)",
    },
    // AWS p5.48xlarge: 8 x H100, EFA v2 32 x 100 Gb/s = 3.2 Tb/s per node.
    NodeSpec {
        name: "aws-p5",
        gpus_per_node: 8,
        nics_per_node: 32,
        nic_bytes_per_s: 12.5e9,
        nvswitch: true,
        fabric: Fabric::Efa,
        source: "AWS p5 (EFA v2 32x100 Gb/s), stas00 network/README.md",
    },
    // A generic 8-GPU PCIe server with one NDR 400 Gb/s NIC per two GPUs.
    NodeSpec {
        name: "pcie-8gpu",
        gpus_per_node: 8,
        nics_per_node: 4,
        nic_bytes_per_s: 50e9,
        nvswitch: false,
        fabric: Fabric::InfinibandNdr,
        source: "generic PCIe server (4x NDR400), an assumption",
    },
    // 8 x MI300X platform with 8 x 400 Gb/s NICs (RoCE / IB).
    NodeSpec {
        name: "mi300x-8gpu",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: false,
        fabric: Fabric::Other,
        source: "AMD MI300X platform reference (8x 400 Gb/s)",
    },
    // 8 x MI325X on the same universal baseboard (xGMI), one 400 Gb/s NIC per GPU.
    NodeSpec {
        name: "mi325x-8gpu",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: false,
        fabric: Fabric::Other,
        source: "AMD MI325X platform (8x 400 Gb/s, as the MI300X platform)",
    },
    // A PCIe workstation of up to 4 GPUs (consumer cards ship in desktops of 1 to 4) with one
    // 100 Gb/s Ethernet NIC: an assumption. 8-GPU GeForce servers: node = "pcie-8gpu".
    NodeSpec {
        name: "workstation",
        gpus_per_node: 4,
        nics_per_node: 1,
        nic_bytes_per_s: 12.5e9,
        nvswitch: false,
        fabric: Fabric::Other,
        source: "generic 4-GPU PCIe workstation (1x 100 GbE), an assumption",
    },
    // AWS g5.48xlarge: 8 x A10G on PCIe, 100 Gb/s networking.
    NodeSpec {
        name: "aws-g5",
        gpus_per_node: 8,
        nics_per_node: 1,
        nic_bytes_per_s: 12.5e9,
        nvswitch: false,
        fabric: Fabric::Other,
        source: "AWS g5.48xlarge (8x A10G, 100 Gb/s)",
    },
    // AWS g6.48xlarge: 8 x L4 on PCIe, 100 Gb/s networking.
    NodeSpec {
        name: "aws-g6",
        gpus_per_node: 8,
        nics_per_node: 1,
        nic_bytes_per_s: 12.5e9,
        nvswitch: false,
        fabric: Fabric::Other,
        source: "AWS g6.48xlarge (8x L4, 100 Gb/s)",
    },
    // AWS g6e.48xlarge: 8 x L40S on PCIe, 400 Gb/s EFA networking.
    NodeSpec {
        name: "aws-g6e",
        gpus_per_node: 8,
        nics_per_node: 1,
        nic_bytes_per_s: 50e9,
        nvswitch: false,
        fabric: Fabric::Efa,
        source: "AWS g6e.48xlarge (8x L40S, 400 Gb/s EFA)",
    },
    // HGX H20: the HGX 8-GPU NVSwitch board; NICs assumed as HGX H100/H200 (8 x 400 Gb/s).
    NodeSpec {
        name: "hgx-h800",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        fabric: Fabric::InfinibandNdr,
        source: "HGX H800 8-GPU board; 8x 400 Gb/s InfiniBand a node as DeepSeek-V3's cluster (arXiv 2412.19437, Section 3.1)",
    },
    NodeSpec {
        name: "hgx-h20",
        gpus_per_node: 8,
        nics_per_node: 8,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        fabric: Fabric::InfinibandNdr,
        source: "HGX H20 8-GPU board; NICs as the HGX H100 reference (8x 400 Gb/s), an assumption",
    },
    // Four GH200 superchips a node, NVLink all-to-all (no NVSwitch), one 200 Gb/s NIC each:
    // HPE Cray EX254n (CSCS Alps: 4 x Slingshot-11 200 Gb/s), JSC JUPITER (4 x NDR200).
    NodeSpec {
        name: "quad-gh200",
        gpus_per_node: 4,
        nics_per_node: 4,
        nic_bytes_per_s: 25e9,
        nvswitch: false,
        fabric: Fabric::Other,
        source: "HPE Cray EX254n / JUPITER node: 4x GH200, 4x 200 Gb/s",
    },
    // GB200 NVL72: 72 GPUs in one NVLink 5 NVSwitch domain; each 4-GPU compute tray has four
    // ConnectX-7 400 Gb/s NICs, one per GPU (DGX GB200 user guide, networking). Jobs of more
    // than 72 GPUs: hardware.gpus_per_node must divide them (72 or a partition, e.g. 64).
    NodeSpec {
        name: "gb200-nvl72",
        gpus_per_node: 72,
        nics_per_node: 72,
        nic_bytes_per_s: 50e9,
        nvswitch: true,
        fabric: Fabric::InfinibandNdr,
        source: "NVIDIA GB200 NVL72 (72 GPUs per NVLink domain, 1x 400 Gb/s per GPU)",
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
    CATALOG.iter().map(|g| g.name.as_ref()).collect()
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
    /// `[nccl] nvls = false` (`NCCL_NVLS_ENABLE=0`): all-reduces inside a node run on rings
    /// even where the node has NVLS ([`Cluster::nvls`]). In the report as the scenario's
    /// NCCL settings, not here.
    #[serde(skip)]
    pub nvls_off: bool,
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
            nvls_off: false,
        })
    }

    /// What the allocator may hand out: device memory less the CUDA context.
    pub fn capacity_bytes(&self) -> u64 {
        self.memory_bytes.saturating_sub(self.cuda_context_bytes)
    }
    pub fn nodes(&self) -> u32 {
        self.gpus.div_ceil(self.gpus_per_node)
    }
    /// Whether the node preset's GPUs meet on NVSwitch (a node not in the catalog: no).
    pub fn nvswitch(&self) -> bool {
        node(&self.node).is_some_and(|n| n.nvswitch)
    }
    /// Whether NCCL can run NVLink SHARP (NVLS, NVSwitch multicast) inside a node: NVLink
    /// SHARP GPUs (data-center Hopper or Blackwell) on an NVSwitch fabric.
    pub fn nvls_capable(&self) -> bool {
        self.nvswitch() && self.gpu.arch.nvlink_sharp()
    }
    /// Whether NCCL runs all-reduces inside a node with NVLS ([`crate::net::NVLS_LATENCY_S`]):
    /// where the node has it, unless `[nccl] nvls = false`.
    pub fn nvls(&self) -> bool {
        self.nvls_capable() && !self.nvls_off
    }
    /// The node preset's network ([`NodeSpec::fabric`]).
    pub fn fabric(&self) -> Fabric {
        node(&self.node).map_or(Fabric::Other, |n| n.fabric)
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
            // Above 1.0 only where a measured GEMM beats the datasheet (GeForce boost clocks).
            assert!(g.max_matmul_fraction > 0.3 && g.max_matmul_fraction <= MAX_MATMUL_FRACTION);
        }
    }

    /// Every entry's figures agree with each other and with its architecture, and each is
    /// within the range real parts span, so a typo (a sparse figure, TB for GB, a missing
    /// zero) fails here.
    #[test]
    fn catalog_entries_are_consistent() {
        const GIB: u64 = 1 << 30;
        for g in CATALOG {
            let n = &g.name;
            assert!(!g.source.trim().is_empty(), "{n}: no source");
            // Memory: 16 GiB to 512 GiB, in whole MiB (nvidia-smi / rocm-smi report MiB) or
            // bytes for a datasheet figure.
            assert!(g.memory_bytes >= 16 * GIB && g.memory_bytes <= 512 * GIB, "{n}: memory {}", g.memory_bytes);
            // Dense peaks: BF16 equals FP16 wherever there is BF16 (no part differs); TF32
            // is half of it, or less (consumer parts' FP32-accumulate rates); FP8 twice it.
            match g.bf16_flops {
                Some(bf16) => assert_eq!(bf16, g.fp16_flops, "{n}: BF16 and FP16 peaks differ"),
                None => assert_eq!(g.arch, Arch::Volta, "{n}: only Volta lacks BF16"),
            }
            if let Some(tf32) = g.tf32_flops {
                // (2% for datasheets' rounding: the RTX 3090's 71 beside 35.6, the L40S's 362.05
                // beside 183 TF32 and 733 FP8)
                assert!(tf32 <= g.fp16_flops / 2.0 * 1.02 && tf32 >= g.fp32_flops * 0.99, "{n}: TF32 {tf32}");
            }
            assert_eq!(g.fp8_flops.is_some(), g.arch.has_fp8(), "{n}: FP8 tensor cores and the architecture");
            if let Some(fp8) = g.fp8_flops {
                assert!((fp8 / g.fp16_flops / 2.0 - 1.0).abs() < 0.02, "{n}: FP8 {fp8} is not twice FP16");
            }
            assert!(g.fp16_flops >= 50e12 && g.fp16_flops <= 5e15, "{n}: FP16 {}", g.fp16_flops);
            assert!(g.fp32_flops >= 10e12 && g.fp32_flops <= 200e12, "{n}: FP32 {}", g.fp32_flops);
            // Tensor cores at least twice FP32 (exactly twice on GeForce's FP32-accumulate rates,
            // to the datasheets' rounding).
            assert!(g.fp16_flops >= 1.98 * g.fp32_flops, "{n}: tensor cores slower than twice FP32");
            // Memory bandwidth 250 GB/s to 10 TB/s; the intra-node link from PCIe 4 x16 to
            // NVLink 5, and never faster than memory.
            assert!(g.hbm_bytes_per_s >= 250e9 && g.hbm_bytes_per_s <= 10e12, "{n}: HBM {}", g.hbm_bytes_per_s);
            assert!(
                g.nvlink_bytes_per_s >= 31e9 && g.nvlink_bytes_per_s <= 900e9,
                "{n}: link {}",
                g.nvlink_bytes_per_s
            );
            assert!(g.nvlink_bytes_per_s < g.hbm_bytes_per_s, "{n}: link faster than memory");
            assert!((3..=6).contains(&g.pcie_gen), "{n}: PCIe gen {}", g.pcie_gen);
            assert!(g.sms >= 40 && g.sms <= 320, "{n}: {} SMs", g.sms);
            // NVSwitch nodes for parts that have NVLink.
            let node = node(g.default_node).unwrap();
            // (H800's NVLink is 200 GB/s a direction, the least of the NVSwitch parts)
            if node.nvswitch {
                assert!(g.nvlink_bytes_per_s >= 200e9, "{n}: an NVSwitch node for a PCIe part");
            }
        }
    }

    #[test]
    fn blas_workspace_follows_the_compute_capability() {
        // PyTorch's CublasHandlePool.cpp: 32 MiB for major 9, 10, 12; 8 MiB + 128 KiB below.
        let ws = |name: &str| lookup(name).unwrap().blas_workspace_bytes();
        assert_eq!(ws("rtx-4090"), ws("a100-80gb"));
        assert_eq!(ws("rtx-3090"), 8 * MIB + 128 * 1024);
        assert_eq!(ws("rtx-5090"), 32 * MIB);
        assert_eq!(ws("gh200-96gb"), ws("h100-sxm"));
        assert_eq!(ws("mi325x"), 128 * MIB);
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
