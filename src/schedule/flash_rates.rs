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
//!
//! FlashAttention-3 and cuDNN, named by `training.attention`, take the FlashAttention-3
//! paper's separate forward and backward benchmarks instead (Shah et al. 2024,
//! arXiv:2407.08608; H100 80GB SXM5, BF16, the same set-up and FLOP count; copied with its
//! source into tests/fixtures/flash3_h100_attention.csv, which `tests/attention_kernels.rs`
//! checks these tables against):
//! - forward with the causal mask, head dim 64, 128 and 256: Figure 5 (b, d, f), the image
//!   `assets/flash3_fp16_fwd.png` in Dao-AILab/flash-attention (read at 0251105a);
//! - forward without it, head dim 64 and 128: Figure 5 (a, c), for the causal share below;
//! - backward, head dim 64 and 128: Figure 6, without the causal mask (transcribed; its
//!   FlashAttention-2 rows combine with the forward's into the FlashAttention-2 paper's
//!   non-causal forward + backward figure within 6%, which the test checks).
//!
//! A causal backward runs at the non-causal backward's rate times the kernel's causal over
//! non-causal forward rate at that length (the masked blocks' bookkeeping costs both passes
//! alike): an assumption, which FlashAttention-2's own figures bear out (its causal over
//! non-causal forward + backward rate is its forward ratio within 7% at every length, also
//! checked). Head dims between the measured ones interpolate; the backward's above 128 and
//! every table's below 64 take the nearest. FlashAttention-3 runs on Hopper only; cuDNN's
//! rates are used as fractions of the H100's dense BF16 peak on Hopper and Blackwell, as
//! FlashAttention-2's are; other GPUs have no measurement, and the scenario is refused.

use crate::hardware::Arch;
use crate::model::FlashKernel;

/// The sequence lengths of every table.
pub const SEQ_LENS: [u64; 6] = [512, 1024, 2048, 4096, 8192, 16384];

/// TFLOP/s (the benchmark's count), head dimension 64 and 128, A100 80GB SXM4.
const A100: [[f64; 6]; 2] = [[88.0, 119.0, 140.0, 156.0, 165.0, 171.0], [99.0, 133.0, 155.0, 173.0, 182.0, 189.0]];
const A100_PEAK: f64 = 312.0;

/// The same on H100 80GB SXM5.
const H100: [[f64; 6]; 2] = [[141.0, 192.0, 232.0, 257.0, 273.0, 284.0], [163.0, 221.0, 265.0, 294.0, 308.0, 328.0]];
const H100_PEAK: f64 = 989.0;

/// Linear interpolation in log2 of the sequence length, clamped to the measured lengths.
fn along_seq(row: &[f64; 6], seq: u64) -> f64 {
    let log = |i: usize| (SEQ_LENS[i] as f64).log2();
    let x = (seq.max(1) as f64).log2().clamp(log(0), log(5));
    let i = ((x - log(0)).floor() as usize).min(4);
    let f = x - log(i);
    row[i] + f * (row[i + 1] - row[i])
}

/// The FlashAttention-3 paper's H100 tables of one kernel (TFLOP/s in the benchmark's count,
/// sequence lengths [`SEQ_LENS`]).
pub struct PaperKernel {
    /// Forward with the causal mask, head dim 64, 128, 256.
    pub fwd_causal: [[f64; 6]; 3],
    /// Forward without it, head dim 64, 128.
    pub fwd: [[f64; 6]; 2],
    /// Backward without it, head dim 64, 128.
    pub bwd: [[f64; 6]; 2],
}

/// FlashAttention-2 as the FlashAttention-3 paper measured it (the tests' cross-check with
/// the FlashAttention-2 paper's own figures; stepsim times FlashAttention-2 by those).
const PAPER_FA2: PaperKernel = PaperKernel {
    fwd_causal: [
        [180.0, 229.0, 262.0, 284.0, 295.0, 299.0],
        [191.0, 260.0, 298.0, 319.0, 333.0, 335.0],
        [208.0, 251.0, 278.0, 293.0, 297.0, 298.0],
    ],
    fwd: [[282.0, 306.0, 318.0, 321.0, 322.0, 324.0], [309.0, 350.0, 362.0, 368.0, 370.0, 370.0]],
    bwd: [[198.0, 238.0, 264.0, 279.0, 287.0, 291.0], [214.0, 260.0, 291.0, 310.0, 318.0, 322.0]],
};

/// cuDNN's fused attention (the paper's cuDNN 9 run).
const PAPER_CUDNN: PaperKernel = PaperKernel {
    fwd_causal: [
        [225.0, 288.0, 334.0, 363.0, 379.0, 388.0],
        [315.0, 410.0, 484.0, 518.0, 529.0, 539.0],
        [308.0, 391.0, 450.0, 483.0, 497.0, 509.0],
    ],
    fwd: [[335.0, 373.0, 395.0, 408.0, 412.0, 413.0], [497.0, 574.0, 617.0, 609.0, 600.0, 595.0]],
    bwd: [[266.0, 348.0, 395.0, 417.0, 432.0, 433.0], [305.0, 408.0, 465.0, 499.0, 518.0, 516.0]],
};

/// FlashAttention-3.
const PAPER_FA3: PaperKernel = PaperKernel {
    fwd_causal: [
        [197.0, 265.0, 371.0, 420.0, 460.0, 473.0],
        [292.0, 423.0, 521.0, 579.0, 602.0, 616.0],
        [286.0, 427.0, 537.0, 612.0, 628.0, 642.0],
    ],
    fwd: [[333.0, 392.0, 460.0, 476.0, 496.0, 497.0], [467.0, 565.0, 625.0, 638.0, 646.0, 648.0]],
    bwd: [[272.0, 363.0, 422.0, 453.0, 472.0, 474.0], [316.0, 424.0, 501.0, 542.0, 559.0, 561.0]],
};

/// The head dimensions of the paper's causal forward tables.
pub const HEAD_DIMS: [f64; 3] = [64.0, 128.0, 256.0];

/// A kernel's tables in the FlashAttention-3 paper.
pub fn paper(kernel: FlashKernel) -> &'static PaperKernel {
    match kernel {
        FlashKernel::FlashAttention2 => &PAPER_FA2,
        FlashKernel::FlashAttention3 => &PAPER_FA3,
        FlashKernel::Cudnn => &PAPER_CUDNN,
    }
}

/// A row of `rows` (one per head dim of [`HEAD_DIMS`], as many as given) at `seq` keys and
/// head dim `head_dim`: along the sequence as [`along_seq`], linear between head dims, the
/// nearest outside them.
fn by_head_dim(rows: &[[f64; 6]], seq: u64, head_dim: u64) -> f64 {
    let n = rows.len();
    let d = (head_dim as f64).clamp(HEAD_DIMS[0], HEAD_DIMS[n - 1]);
    let i = (1..n).find(|&i| d <= HEAD_DIMS[i]).unwrap_or(n - 1);
    let (lo, hi) = (along_seq(&rows[i - 1], seq), along_seq(&rows[i], seq));
    let f = (d - HEAD_DIMS[i - 1]) / (HEAD_DIMS[i] - HEAD_DIMS[i - 1]);
    lo + f * (hi - lo)
}

impl PaperKernel {
    /// TFLOP/s of the causal forward.
    pub fn forward(&self, seq: u64, head_dim: u64) -> f64 {
        by_head_dim(&self.fwd_causal, seq, head_dim)
    }

    /// TFLOP/s of the causal backward: the non-causal backward's rate times the causal over
    /// non-causal forward rate (head dims taken within the backward's measured 64-128).
    pub fn backward(&self, seq: u64, head_dim: u64) -> f64 {
        let share = by_head_dim(&self.fwd_causal[..2], seq, head_dim) / by_head_dim(&self.fwd, seq, head_dim);
        by_head_dim(&self.bwd, seq, head_dim) * share
    }
}

/// Why a named kernel cannot be timed on a GPU generation, or None where it can.
pub fn unsupported(kernel: FlashKernel, arch: Arch) -> Option<String> {
    match (kernel, arch) {
        (FlashKernel::FlashAttention2, _) => None,
        (FlashKernel::FlashAttention3, Arch::Hopper) => None,
        (FlashKernel::FlashAttention3, _) => Some(format!(
            "FlashAttention-3 runs on Hopper GPUs only (H100, H800, H200); this GPU is {}: use \"flash_attention_2\" or \"flash\"",
            arch.name()
        )),
        (FlashKernel::Cudnn, Arch::Hopper | Arch::Blackwell) => None,
        (FlashKernel::Cudnn, _) => Some(format!(
            "stepsim has cuDNN attention's measured rates for Hopper (the FlashAttention-3 paper's H100 benchmark), used on Hopper and Blackwell; this GPU is {}: use \"flash_attention_2\" or \"flash\"",
            arch.name()
        )),
    }
}

/// A fused attention kernel's rate as a fraction of the 16-bit dense peak, on the work it
/// does (half of the causal square), for a query block meeting `seq` keys with heads of
/// `head_dim`, forward or `backward`. FlashAttention-2 runs both at its combined rate.
pub fn fraction(kernel: FlashKernel, arch: Arch, seq: u64, head_dim: u64, backward: bool) -> f64 {
    if kernel == FlashKernel::FlashAttention2 {
        return flash2_fraction(arch, seq, head_dim);
    }
    let paper = paper(kernel);
    let tflops = if backward { paper.backward(seq, head_dim) } else { paper.forward(seq, head_dim) };
    tflops / H100_PEAK
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
