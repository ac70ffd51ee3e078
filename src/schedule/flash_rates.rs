//! FlashAttention-2's measured speed, the attention kernel PyTorch model code runs (SDPA's
//! flash backend is FlashAttention-2 from PyTorch 2.2; Hugging Face's `flash_attention_2`
//! calls it directly), by GPU generation, sequence length and head dimension.
//!
//! Source: the FlashAttention-2 paper's forward + backward benchmark (Dao 2023,
//! arXiv:2307.08691, Figures 4 and 7; `assets/flash2_a100_fwd_bwd_benchmark.png` and
//! `assets/flash2_h100_fwd_bwd_benchmark.png` in Dao-AILab/flash-attention, produced by
//! `benchmarks/benchmark_flash_attention.py`): causal, FP16, hidden 2048 (32 heads of 64 or
//! 16 of 128), batch x sequence = 16k tokens, on A100 80GB SXM4 and H100 80GB SXM5. The
//! benchmark counts `4 b s^2 heads head_dim / 2` FLOPs forward for causal attention (half the
//! square: the kernel skips the masked blocks) and 2.5 times that backward, so a rate in
//! its count is the rate of the work the kernel really does. stepsim's attention FLOPs count
//! the whole square (Megatron's MFU convention), so a kernel's time is half of those FLOPs
//! over the rate (`Cost::op_eff`: twice the fraction, against the whole square).
//!
//! The figures are combined forward + backward; forward and backward are taken to run at the
//! same rate (the FlashAttention-3 paper's separate H100 figures at 8k, head dim 128: 333 and
//! 318 TFLOP/s). Each generation's rates are used as fractions of that part's dense 16-bit
//! peak (A100 312, H100 989 TFLOP/s), for every part of the generation: Ampere's for Volta,
//! Ampere and Ada (Volta has no FlashAttention-2: SDPA runs the memory-efficient kernel there,
//! taken to run alike), Hopper's for Hopper and Blackwell (FlashAttention-2 has no
//! Blackwell-specific kernel). Outside 512-16k tokens the nearest measured length is used;
//! head dimensions between 64 and 128 interpolate, others take the nearer.

use crate::hardware::Arch;

const SEQ: [f64; 6] = [512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];

/// TFLOP/s (the benchmark's count), head dimension 64 and 128, A100 80GB SXM4.
const A100: [[f64; 6]; 2] = [[88.0, 119.0, 140.0, 156.0, 165.0, 171.0], [99.0, 133.0, 155.0, 173.0, 182.0, 189.0]];
const A100_PEAK: f64 = 312.0;

/// The same on H100 80GB SXM5.
const H100: [[f64; 6]; 2] = [[141.0, 192.0, 232.0, 257.0, 273.0, 284.0], [163.0, 221.0, 265.0, 294.0, 308.0, 328.0]];
const H100_PEAK: f64 = 989.0;

/// Linear interpolation in log2 of the sequence length, clamped to the measured lengths.
fn along_seq(row: &[f64; 6], seq: u64) -> f64 {
    let x = (seq.max(1) as f64).log2().clamp(SEQ[0].log2(), SEQ[5].log2());
    let i = ((x - SEQ[0].log2()).floor() as usize).min(4);
    let f = x - SEQ[i].log2();
    row[i] + f * (row[i + 1] - row[i])
}

/// FlashAttention-2's forward + backward rate as a fraction of the 16-bit dense peak, for an
/// attention kernel over `seq` keys per query block with heads of `head_dim`.
pub fn flash2_fraction(arch: Arch, seq: u64, head_dim: u64) -> f64 {
    let (table, peak) = match arch {
        Arch::Hopper | Arch::Blackwell | Arch::Gb20x => (&H100, H100_PEAK),
        Arch::Volta | Arch::Ampere | Arch::Ga10x | Arch::Ada | Arch::Cdna3 => (&A100, A100_PEAK),
    };
    let lo = along_seq(&table[0], seq);
    let hi = along_seq(&table[1], seq);
    let f = ((head_dim as f64 - 64.0) / 64.0).clamp(0.0, 1.0);
    (lo + f * (hi - lo)) / peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_points_come_back() {
        assert!((flash2_fraction(Arch::Ampere, 8192, 128) * 312.0 - 182.0).abs() < 1e-9);
        assert!((flash2_fraction(Arch::Hopper, 2048, 64) * 989.0 - 232.0).abs() < 1e-9);
        // Halfway in log2 between 2k and 4k, halfway between head dims 64 and 128.
        let mid = flash2_fraction(Arch::Ampere, 2896, 96) * 312.0;
        assert!((mid - (140.0 + 156.0 + 155.0 + 173.0) / 4.0).abs() < 0.1, "{mid}");
        // Clamped outside the measured range.
        assert_eq!(flash2_fraction(Arch::Hopper, 100, 32), flash2_fraction(Arch::Hopper, 512, 64));
        assert_eq!(flash2_fraction(Arch::Hopper, 1 << 20, 256), flash2_fraction(Arch::Hopper, 16384, 128));
    }
}
