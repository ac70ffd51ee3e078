//! The bandwidth PyTorch's kernels over materialised attention's s x s scores reach (Hugging
//! Face's eager attention), by GPU generation: a kernel-level measurement in place of the
//! generic memory-bound share ([`super::cost::HBM_EFFICIENCY`], an assumption).
//!
//! Source: the FlashAttention-2 paper's forward + backward benchmark (Dao 2023,
//! arXiv:2307.08691, Figure 4 on A100 80GB SXM4 and Figure 7 on H100 80GB SXM5; the images
//! `assets/flash2_a100_fwd_bwd_benchmark.png` and `assets/flash2_h100_fwd_bwd_benchmark.png` in
//! Dao-AILab/flash-attention), its "Pytorch" bars: standard attention as
//! `benchmarks/benchmark_flash_attention.py` writes it (`attention_pytorch`: a `baddbmm` with the
//! scale into a preallocated score tensor, `torch.softmax`, dropout at p = 0, which launches
//! nothing, and an `einsum` over V), FP16, batch x sequence = 16k tokens, hidden 2048, without
//! the causal mask (whose extra add Megatron's fused softmax does not run). Copied with its
//! source into tests/fixtures/standard_attention_h100_a100.csv.
//!
//! Those kernels are memory-bound on the scores at head dims 64 and 128 on both generations (a
//! score costs 2 x head-dim FLOPs per 2 bytes, under either GPU's ridge). The test times the
//! benchmark as stepsim times Hugging Face's eager attention, which runs the same PyTorch
//! kernels over the scores ([`crate::model::ScoresShape`]: each batched GEMM the slower of its
//! kernel and its traffic, the softmax passes after them): 8 bytes a score forward, 14
//! backward, plus the benchmark's own copies (its rearranges of a packed qkv, the einsum's
//! permutes, the stack of the q, k, v gradients, baddbmm's alpha scaling: 9 passes over a
//! 16k x 2048 tensor), which explain most of a trend with length it otherwise shows. The share
//! below is the one that minimises the mean |error| over the figure's ten non-causal points
//! per GPU (head dim 64 and 128, 512-8k tokens) on a 0.01 grid; `tests/attention_kernels.rs`
//! refits it and prints the table. At the generic 0.8 the same chain comes out 21-46% fast.
//!
//! Megatron-LM's CoreAttention (math attention: its own fused scale-mask-softmax kernel) keeps
//! the generic share: Korthikanti et al.'s Table 4 layer times (A100, math attention) hold at
//! it within 2.4%, and with its passes at Ampere's share below the 22B layer's forward comes
//! out 9.8% slow and Table 5's mean |error| 5.4% (both outside their bounds). Ampere's share
//! serves Volta, Ampere, the GA10x parts and Ada; Hopper's, Hopper, Blackwell and the ROCm part
//! (no measurement there): assumptions.

use crate::hardware::Arch;

/// A100 80GB SXM4: mean |error| 4.6% over the ten points, at most 13.2%.
pub const AMPERE: f64 = 0.53;
/// H100 80GB SXM5: mean |error| 5.4%, at most 17.9%.
pub const HOPPER: f64 = 0.63;

/// The share of HBM bandwidth PyTorch's kernels over materialised attention's scores reach.
pub fn scores_hbm_efficiency(arch: Arch) -> f64 {
    match arch {
        Arch::Volta | Arch::Ampere | Arch::Ga10x | Arch::Ada => AMPERE,
        Arch::Hopper | Arch::Blackwell | Arch::Gb20x | Arch::Cdna3 => HOPPER,
    }
}
