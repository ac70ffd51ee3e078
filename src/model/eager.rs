//! What eager PyTorch launches for the Llama family's memory-bound ops, kernel by kernel, where
//! a fused kernel (Megatron / Transformer Engine) or `torch.compile` launches one.
//!
//! The counts follow the model code and PyTorch's autograd formulas
//! (`tools/autograd/derivatives.yaml`): every element-wise op is its own kernel that reads its
//! inputs from HBM and writes its output there, and every op autograd records runs its own
//! backward kernels. Bytes are per element of the op's input, for compute dtype `c` bytes
//! (16-bit: 2); FP32 intermediates are 4 bytes. Reductions write one value per row, which is
//! left out (a row has thousands of elements).

/// Whether eager PyTorch runs any of this model's ops as a chain where a fused stack runs one
/// kernel: the Llama family's RMSNorm and rotary embeddings, GPT-NeoX's rotary embeddings.
/// GPT-style LayerNorm, GELU and residual adds are single kernels in eager PyTorch too.
pub fn differs(cfg: &super::ModelConfig) -> bool {
    cfg.family == super::Family::Llama || cfg.style.rotary_dims.is_some()
}

/// HBM traffic and kernel launches of an eager op, forward and backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EagerCost {
    /// Bytes read and written per element, forward and backward.
    pub bytes: [f64; 2],
    /// Kernels launched, forward and backward.
    pub kernels: [u32; 2],
}

/// An upcast to FP32 and its downcast back: nothing when the compute dtype is FP32 already
/// (`x.float()` and `type_as` then return their input).
fn cast(c: f64) -> (f64, u32) {
    if c < 4.0 {
        (c + 4.0, 1)
    } else {
        (0.0, 0)
    }
}

/// torchtitan's `RMSNorm` (`torchtitan/models/norms.py` at 9dec370:
/// `self._norm(x.float()).type_as(x) * self.weight`, `_norm(x) = x * torch.rsqrt(x.pow(2)
/// .mean(-1, keepdim=True) + eps)`) and Hugging Face's `LlamaRMSNorm` (the same chain).
///
/// Forward: `x.float()` (c + 4), `pow(2)` (8), `mean` (4), `+ eps` and `rsqrt` (per row),
/// `x * rsqrt` (8), `type_as` (4 + c), `* weight` (2 c): 8 kernels.
///
/// Backward: the weight product's `grad * weight` (2 c), `grad * normed` (3 c) and its sum over
/// rows (c); `type_as`'s cast (c + 4); `x * rsqrt`'s `grad * rsqrt` (8), `grad * x` (12) and its
/// row sum (4); `rsqrt` and `+ eps` (per row, 2 kernels); `mean`'s expanded division (4);
/// `pow`'s `pow_backward` (`grad * 2 * x.pow(1)`: 8 + 8 + 12); the sum of the FP32 copy's two
/// gradients (12); `float()`'s cast back (4 + c): 15 kernels.
///
/// What autograd saves: the FP32 copy (`pow` and the product both save it), the 16-bit
/// normalised output (the weight product saves it) and `rsqrt`'s result per row; the 16-bit
/// input itself is not saved ([`rmsnorm_saves`]).
pub fn rmsnorm(c: u64, weight: bool) -> EagerCost {
    let (grad_b, grad_k) = rmsnorm_weight_grad(c);
    let c = c as f64;
    let (cast_b, cast_k) = cast(c);
    // The weight product: `* weight` forward; `grad * weight` (2 c, 1 kernel) and the weight's
    // own gradient backward.
    let (w_fwd, w_bwd, w_k) = if weight { (2.0 * c, 2.0 * c + grad_b, (1, 1 + grad_k)) } else { (0.0, 0.0, (0, 0)) };
    EagerCost {
        bytes: [
            cast_b + 8.0 + 4.0 + 8.0 + cast_b + w_fwd,
            w_bwd + cast_b + 8.0 + 12.0 + 4.0 + 4.0 + 28.0 + 12.0 + cast_b,
        ],
        kernels: [2 * cast_k + 5 + w_k.0, w_k.1 + cast_k + 3 + 2 + 1 + 3 + 1 + cast_k],
    }
}

/// Bytes per element and kernels of eager RMSNorm's weight gradient, which a frozen weight
/// skips: `grad * normed` (3 c) and its sum over rows (c), in `c`-byte elements of the saved
/// normalised tensor (`c` = 1: per byte of it).
pub fn rmsnorm_weight_grad(c: u64) -> (f64, u32) {
    (4.0 * c as f64, 2)
}

/// Bytes per element eager RMSNorm keeps for backward: the FP32 copy, and the normalised
/// 16-bit output where a weight multiplies it.
pub fn rmsnorm_saves(c: u64, weight: bool) -> (u64, u64) {
    (4, if weight { c } else { 0 })
}

/// Bytes per element of the largest FP32 temporary eager RMSNorm's forward holds beside its
/// saved tensors and output: `pow(2)`'s output until `mean` reads it, then the product until
/// `type_as` reads it.
pub const RMSNORM_SCRATCH: u64 = 4;

/// torchtitan's `apply_rotary_emb` (9dec370), per element of q or k: `x.float()` (c + 4), the
/// complex product with `freqs_cis` (8), `type_as` (4 + c); backward the same three kernels in
/// reverse (the product's gradient multiplies by the conjugate). 3 kernels each way. Hugging
/// Face's `apply_rotary_pos_emb` (`q * cos + rotate_half(q) * sin`: negation, concatenation,
/// two products and a sum) moves about as much in 16 bits over five kernels; torchtitan's
/// chain stands for both.
pub fn rope(c: u64) -> EagerCost {
    let c = c as f64;
    let (cast_b, cast_k) = cast(c);
    let b = 2.0 * cast_b + 8.0;
    EagerCost { bytes: [b, b], kernels: [1 + 2 * cast_k, 1 + 2 * cast_k] }
}

/// Hugging Face's `apply_rotary_pos_emb` as its kernels run, per element of q or k in
/// `c`-byte elements, where no cast brackets it (QLoRA's FP32 q and k,
/// [`super::dag`]'s `Builder::stream`): `rotate_half` negates one half (c) and concatenates (2 c),
/// `q * cos` and `rotate_half(q) * sin` (2 c each; the tables broadcast over heads and
/// tokens, counted once), the sum (3 c): 10 c over 5 kernels. Backward: the products'
/// gradients `grad * cos`, `grad * sin` (2 c each), the negation's (c), the two halves'
/// `slice_backward` (a zero-filled full tensor and the half copied in: 2 c each, 2 kernels
/// each) and the sums of q's three gradients (3 c each, 2): 15 c over 9 kernels. In 16 bits
/// the forward moves what torchtitan's cast-bracketed chain does ([`rope`]: 20 B), which
/// stands for both there.
pub fn rope_unfused(c: u64) -> EagerCost {
    let c = c as f64;
    EagerCost { bytes: [10.0 * c, 15.0 * c], kernels: [5, 9] }
}

/// Bytes per element of eager rotary embedding's temporaries: the FP32 copy and the FP32
/// product, both live until `type_as` reads the product.
pub const ROPE_SCRATCH: u64 = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_in_bf16_moves_nine_times_a_fused_kernel() {
        // A fused RMSNorm reads x and writes y: 4 bytes per element in BF16.
        let e = rmsnorm(2, true);
        assert_eq!(e.bytes, [36.0, 92.0]);
        assert_eq!(e.kernels, [8, 15]);
        // OLMo-style weightless norms skip the weight product.
        let e = rmsnorm(2, false);
        assert_eq!(e.bytes, [32.0, 80.0]);
        assert_eq!(e.kernels, [7, 12]);
        // In FP32 the casts are no-ops.
        assert_eq!(rmsnorm(4, true).kernels, [6, 13]);
        assert_eq!(rmsnorm(4, true).bytes, [28.0, 92.0]);
    }

    #[test]
    fn hugging_face_rope_without_casts() {
        // In 16 bits its forward moves what torchtitan's chain moves; in FP32, twice that.
        assert_eq!(rope_unfused(2).bytes[0], rope(2).bytes[0]);
        assert_eq!(rope_unfused(4), EagerCost { bytes: [40.0, 60.0], kernels: [5, 9] });
    }

    #[test]
    fn rope_through_fp32() {
        assert_eq!(rope(2), EagerCost { bytes: [20.0, 20.0], kernels: [3, 3] });
        assert_eq!(rope(4), EagerCost { bytes: [8.0, 8.0], kernels: [1, 1] });
    }
}
