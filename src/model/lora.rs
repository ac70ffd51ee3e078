//! LoRA / QLoRA (`[job] kind = "finetune-lora"`): the layer DAG of a frozen base with
//! trainable low-rank adapters, as PEFT builds it (sources: docs/research/issue8-sources.md).
//!
//! After [`apply`], an op's `params` are its *trainable* elements (the adapters' A: r x in
//! and B: out x r on each targeted linear, nothing elsewhere), so gradients, optimizer state,
//! reduce-scatters and DDP buckets are sized from the adapters alone; the frozen base weights
//! move to `frozen_params` / `frozen_bytes` (stored in the base format: BF16, or NF4 blocks
//! for QLoRA with the other parameters upcast to FP32 by `prepare_model_for_kbit_training`).
//!
//! What autograd does with a frozen base:
//! - a frozen linear computes only its input gradient in backward (no weight-gradient GEMM:
//!   half its training backward) and does not keep its input for backward, unless an
//!   adapter on it does (lora_A saves its input);
//! - a targeted linear adds lora_A (saves x, or with `lora_dropout` > 0 its own dropout copy
//!   of x and the mask) and lora_B (saves x A, tokens x r);
//! - NF4: bitsandbytes dequantizes the whole weight to the compute dtype for every call with
//!   more than one row, forward and backward: a transient out x in x 2 B, written and read,
//!   by a kernel that runs before the GEMM (its time adds: `Op::chain_bytes`).

use serde::Serialize;

use super::config::Family;
use super::dag::{LayerDag, OpKind, Region, Tensor, TensorKind};
use super::quant::WeightFormat;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoraConfig {
    /// `r`.
    pub rank: u64,
    /// `lora_alpha`: scales the update, changes no byte or FLOP (reported only).
    pub alpha: f64,
    /// PEFT `target_modules`, as Hugging Face names them ("q_proj", "c_attn", "all-linear").
    pub targets: Vec<String>,
    /// `lora_dropout` (PEFT default 0: an identity, nothing extra saved).
    pub dropout: f64,
    /// Storage of the frozen block linears: `Half` (LoRA) or `Nf4` (QLoRA).
    pub base: WeightFormat,
    /// Each block's frozen base and its adapters share one FSDP1 FlatParameter: FSDP1 with
    /// `use_orig_params=True` and a block-level wrap policy (Accelerate's
    /// `TRANSFORMER_BASED_WRAP`) rather than PEFT's `fsdp_auto_wrap_policy`, which wraps the
    /// adapters apart. The FlatParameter then requires grad, and the block is trained as if
    /// nothing were frozen except by the optimizer: PyTorch's `FullyShardedDataParallel`
    /// docstring warns that "the gradient memory usage will be higher than expected (namely,
    /// equivalent to not freezing those parameters)" (pytorch#104967, after #98221 allowed
    /// the mix). In `_flat_param.py` (`_use_unsharded_views`, `as_params=False`) every
    /// original parameter is a view of the flat parameter during forward, so autograd
    /// differentiates the frozen weights too: their weight-gradient GEMMs run and the
    /// linears keep their inputs; `_use_sharded_grad_views` hands no gradient to a frozen
    /// parameter, so the optimizer holds state for the adapters only ([`super::Op::flat_frozen`]).
    pub shared_flat: bool,
    /// The adapters' element bytes where autocast copies each adapter's input (None where it
    /// does not). PEFT casts a targeted linear's input to the adapters' dtype before lora_A
    /// (`x = self._cast_input_dtype(x, lora_A.weight.dtype)`, `tuners/lora/layer.py`: FP32
    /// adapters under `autocast_adapter_dtype=True`, PEFT's default), and autocast casts that
    /// back to the compute dtype for lora_A's matmul: a fresh copy per adapter (autocast
    /// caches casts of leaf parameters only), which lora_A saves for its weight gradient in
    /// place of `x`. Where the adapters are held in the compute dtype, or sharded and gathered
    /// in it, lora_A reads and saves `x` itself. Set from the plan where a scenario's DAG is
    /// built ([`crate::plan::Precision::autocast_casts`]), not by the scenario file.
    #[serde(skip)]
    pub input_casts: Option<u64>,
}

/// PEFT's default `target_modules` per model type (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`).
pub fn default_targets(family: Family) -> Vec<String> {
    match family {
        Family::Llama => vec!["q_proj".into(), "v_proj".into()],
        Family::Gpt => vec!["c_attn".into()],
    }
}

/// The Hugging Face module names a family has, and the DAG op names (suffixes) they are.
pub fn module_names(family: Family) -> &'static [(&'static str, &'static [&'static str])] {
    match family {
        Family::Llama => &[
            ("q_proj", &["attention.wq"]),
            ("k_proj", &["attention.wk"]),
            ("v_proj", &["attention.wv"]),
            ("o_proj", &["attention.wo"]),
            ("gate_proj", &["feed_forward.w1"]),
            ("up_proj", &["feed_forward.w3"]),
            ("down_proj", &["feed_forward.w2"]),
        ],
        // GPT-2's attn.c_proj and mlp.c_proj share a name, so PEFT's "c_proj" matches both.
        Family::Gpt => {
            &[("c_attn", &["attn.c_attn"]), ("c_proj", &["attention.wo", "mlp.c_proj"]), ("c_fc", &["mlp.c_fc"])]
        }
    }
}

impl LoraConfig {
    fn targets_op(&self, family: Family, name: &str) -> bool {
        if self.targets.iter().any(|t| t == "all-linear") {
            return true;
        }
        module_names(family)
            .iter()
            .filter(|(hf, _)| self.targets.iter().any(|t| t == hf))
            .any(|(_, ops)| ops.iter().any(|o| name.ends_with(o)))
    }
}

/// Turns a training DAG into its LoRA fine-tuning DAG; `c` is the compute dtype's bytes.
pub fn apply(dag: &mut LayerDag, cfg: &LoraConfig, c: u64) {
    let family = dag.config.family;
    let qlora = matches!(cfg.base, WeightFormat::Nf4 { .. });
    // prepare_model_for_kbit_training: what is not 4-bit is held in FP32.
    let other_bytes = if qlora { 4 } else { 2 };
    let mut new_tensors: Vec<Tensor> = Vec::new();
    let first_new = dag.tensors.len();
    for (i, op) in dag.ops.iter_mut().enumerate() {
        if cfg.shared_flat && matches!(op.region, Region::Block(_)) {
            share_flat(op, cfg, family, i, first_new, &mut new_tensors, c);
            continue;
        }
        // The tied head reads the (frozen) embedding: no gradient to route there any more.
        if op.shared_params > 0 {
            op.fwd_bytes += (op.shared_params * c) as f64;
            op.shared_params = 0;
        }
        let base = op.params;
        let block_linear = op.kind == OpKind::Linear && matches!(op.region, Region::Block(_));
        op.frozen_params = base;
        op.frozen_bytes = match (block_linear, op.gemm) {
            (true, Some([_, n, k])) if base > 0 => {
                cfg.base.linear_bytes(k, n) + base.saturating_sub(n * k) * if qlora { 4 } else { c }
            }
            _ => base * other_bytes,
        };
        op.params = 0;
        match op.kind {
            OpKind::Embedding => {
                op.bwd_flops = 0.0;
                op.saves.clear();
            }
            OpKind::Norm => {
                // Eager RMSNorm's `normed * weight` keeps `normed` for the weight's gradient
                // only (autograd saves a product's other operand for the operand that requires
                // grad): with the weight frozen it keeps nothing of it, and backward skips
                // `grad * normed` and its sum over rows ([`super::eager::rmsnorm_weight_grad`]).
                let normed = op.saves.iter().position(|&s| dag.tensors[s].name.ends_with(".normed"));
                if let Some(p) = normed {
                    let n = op.saves.remove(p);
                    let elems = (dag.tensors[n].bytes / c) as f64;
                    let (bytes, kernels) = super::eager::rmsnorm_weight_grad(c);
                    op.bwd_bytes = op.bwd_bytes.map(|b| b - bytes * elems);
                    op.launches[1] = op.launches[1].saturating_sub(kernels);
                }
            }
            OpKind::Linear => {
                let Some([t, n, k]) = op.gemm else { continue };
                if qlora && block_linear {
                    // bitsandbytes' MatMul4Bit runs `dequantize_4bit` as a kernel of its own
                    // before each matmul with the weight, the forward's and the input
                    // gradient's (autograd/_functions.py): it reads the NF4 codes and scales
                    // and writes the 16-bit weight the GEMM then reads, one after the other,
                    // so its time adds to the GEMM's instead of hiding under its roofline.
                    let dequant = (cfg.base.linear_bytes(k, n) + n * k * c) as f64;
                    op.fwd_scratch += n * k * c;
                    op.chain_bytes[0] += dequant;
                    op.chain_bytes[1] += dequant;
                    op.launches[0] += 1;
                    op.launches[1] += 1;
                }
                // Only the input gradient of the frozen weight.
                op.bwd_flops = op.fwd_flops;
                if block_linear && cfg.targets_op(family, &op.name) {
                    add_adapter(op, cfg, [t, n, k], i, first_new, &mut new_tensors, c);
                    // lora_A reads its own copy of x (dropout's, or autocast's): the frozen
                    // weight needs no x for its input gradient, so x is kept for nobody here.
                    if cfg.dropout > 0.0 || cfg.input_casts.is_some() {
                        let x = op.inputs.first().copied();
                        op.saves.retain(|s| Some(*s) != x);
                    }
                } else {
                    // A frozen linear keeps nothing for backward.
                    let x = op.inputs.first().copied();
                    op.saves.retain(|s| Some(*s) != x);
                }
            }
            _ => {}
        }
    }
    dag.tensors.extend(new_tensors);
    dag.lora = Some(cfg.clone());
}

/// A targeted linear's adapters: lora_A (r x in) and lora_B (out x r) as `params`, their
/// FLOPs, and what they save (x A; with `lora_dropout` its own dropout copy of x and mask).
fn add_adapter(
    op: &mut super::dag::Op,
    cfg: &LoraConfig,
    [t, n, k]: [u64; 3],
    i: usize,
    first_new: usize,
    new_tensors: &mut Vec<Tensor>,
    c: u64,
) {
    let r = cfg.rank;
    let adapter = r * (k + n);
    op.params += adapter;
    let f = 2.0 * (t * adapter) as f64;
    op.fwd_flops += f;
    op.bwd_flops += 2.0 * f;
    let mut add = |name: String, bytes: u64, kind: TensorKind| {
        new_tensors.push(Tensor { name, bytes, kind, producer: Some(i) });
        first_new + new_tensors.len() - 1
    };
    let xa = add(format!("{}.lora_A.out", op.name), t * r * c, TensorKind::Activation);
    op.outputs.push(xa);
    op.saves.push(xa);
    if cfg.dropout > 0.0 {
        // lora_A's input in the compute dtype: dropout's output, or with autocast's copies
        // the cast of dropout's output in the adapters' dtype.
        let d = add(format!("{}.lora_dropout.out", op.name), t * k * c, TensorKind::Activation);
        let m = add(format!("{}.lora_dropout.mask", op.name), t * k, TensorKind::Mask);
        op.outputs.extend([d, m]);
        op.saves.extend([d, m]);
    } else if cfg.input_casts.is_some() {
        let x = add(format!("{}.lora_A.input", op.name), t * k * c, TensorKind::Activation);
        op.outputs.push(x);
        op.saves.push(x);
    }
    if let Some(a) = cfg.input_casts {
        // PEFT's copy of x in the adapters' dtype (and with dropout its dropped copy, the
        // same size) lives while lora_A's input is cast from it; backward's gradient of that
        // copy comes back in the adapters' dtype and is cast down to x's. Each cast is a
        // kernel of its own beside the GEMMs: forward x -> adapters' dtype (c read, a
        // written) and back (a read, c written), dropout's pass over the wider copy where
        // there is one; backward the two casts of the gradient.
        let copies = if cfg.dropout > 0.0 { 2 } else { 1 };
        op.fwd_scratch += copies * t * k * a;
        op.bwd_scratch += t * k * a;
        let cast = (2 * t * k * (c + a)) as f64;
        op.chain_bytes[0] += cast;
        op.chain_bytes[1] += cast;
        op.launches[0] += 2;
        op.launches[1] += 2;
    }
}

/// A block op whose frozen weights share the block's FlatParameter with the adapters
/// ([`LoraConfig::shared_flat`]): trained as in full training (gradient, weight-gradient
/// GEMM, saved input), its base counted in `flat_frozen`, adapters added where targeted.
fn share_flat(
    op: &mut super::dag::Op,
    cfg: &LoraConfig,
    family: Family,
    i: usize,
    first_new: usize,
    new_tensors: &mut Vec<Tensor>,
    c: u64,
) {
    op.flat_frozen = op.params;
    if let (OpKind::Linear, Some(gemm)) = (op.kind, op.gemm) {
        if cfg.targets_op(family, &op.name) {
            add_adapter(op, cfg, gemm, i, first_new, new_tensors, c);
        }
    }
}

impl LayerDag {
    /// Trainable elements (all parameters, unless LoRA froze the base).
    pub fn trainable_params(&self) -> u64 {
        self.ops.iter().map(|o| o.params - o.flat_frozen).sum()
    }
    pub fn frozen_params(&self) -> u64 {
        self.ops.iter().map(|o| o.frozen_params + o.flat_frozen).sum()
    }
    /// Frozen elements held as stored (BF16, or NF4 block linears with the rest in FP32), and
    /// their bytes: the frozen base outside FlatParameters shared with the adapters.
    pub fn stored_frozen(&self) -> (u64, u64) {
        self.ops.iter().fold((0, 0), |(p, b), o| (p + o.frozen_params, b + o.frozen_bytes))
    }
    /// Frozen elements in FlatParameters shared with the adapters ([`LoraConfig::shared_flat`]),
    /// held and given gradients as parameters are.
    pub fn flat_frozen_params(&self) -> u64 {
        self.ops.iter().map(|o| o.flat_frozen).sum()
    }
}
