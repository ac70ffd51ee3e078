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
    /// QLoRA: PEFT's `prepare_model_for_kbit_training` ran (`utils/other.py`: every 16-bit
    /// parameter that is not 4-bit is cast to FP32, so the embeddings, norms and head are
    /// stored in FP32 and the residual stream runs in FP32: [`LoraConfig::fp32_stream`]).
    /// False: they stay in the compute dtype, as Unsloth (unsloth#1186) and TRL with `dtype:
    /// bfloat16` leave them (TRL's SFTTrainer stopped calling it in v0.26, trl#4577, but loads
    /// the model in float32 by default from v0.27: docs/research/trl-sft-config.md).
    pub prepare_kbit: bool,
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
    /// The adapters' element bytes where PEFT casts each adapter's input to them (None where
    /// it does not). Over a 16-bit base PEFT casts a targeted linear's input to the adapters'
    /// dtype before lora_A (`x = self._cast_input_dtype(x, lora_A.weight.dtype)`,
    /// `tuners/lora/layer.py`: FP32 adapters under `autocast_adapter_dtype=True`, PEFT's
    /// default), and autocast casts that back to the compute dtype for lora_A's matmul: a
    /// fresh copy per adapter (autocast caches casts of leaf parameters only), which lora_A
    /// saves for its weight gradient in place of `x`. Where the adapters are held in the
    /// compute dtype, or sharded and gathered in it, lora_A reads and saves `x` itself. Over a
    /// 4-bit base PEFT casts only when autocast is off (`tuners/lora/bnb.py`:
    /// `requires_conversion = not torch.is_autocast_enabled()`), so never here. Set from the
    /// plan where a scenario's DAG is built ([`crate::plan::Precision::autocast_casts`]), not
    /// by the scenario file.
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
    /// How the reports name the frozen base's storage.
    pub fn base_label(&self) -> &'static str {
        match self.base {
            WeightFormat::Nf4 { double_quant: true } => "nf4 + double quant (QLoRA)",
            WeightFormat::Nf4 { .. } => "nf4 (QLoRA)",
            _ => "bf16",
        }
    }

    /// The hidden states run in FP32 through every block ([`LoraConfig::prepare_kbit`]).
    pub fn fp32_stream(&self) -> bool {
        self.prepare_kbit && matches!(self.base, WeightFormat::Nf4 { .. })
    }

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
    let other_bytes = if qlora && cfg.prepare_kbit { 4 } else { 2 };
    let mut added = Added { tensors: Vec::new(), first: dag.tensors.len() };
    for (i, op) in dag.ops.iter_mut().enumerate() {
        if cfg.shared_flat && matches!(op.region, Region::Block(_)) {
            share_flat(op, cfg, family, i, &mut added, c);
            continue;
        }
        // The tied head reads the (frozen) embedding: no gradient to route there any more.
        let tied = op.shared_params;
        if op.shared_params > 0 {
            op.fwd_bytes += (op.shared_params * c) as f64;
            op.shared_params = 0;
        }
        let base = op.params;
        let block_linear = op.kind == OpKind::Linear && matches!(op.region, Region::Block(_));
        op.frozen_params = base;
        op.frozen_bytes = match (block_linear, op.gemm) {
            (true, Some([_, n, k])) if base > 0 => {
                cfg.base.linear_bytes(k, n) + base.saturating_sub(n * k) * if qlora { other_bytes } else { c }
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
                    let (per_byte, kernels) = super::eager::rmsnorm_weight_grad(1);
                    op.bwd_bytes = op.bwd_bytes.map(|b| b - per_byte * dag.tensors[n].bytes as f64);
                    op.launches[1] = op.launches[1].saturating_sub(kernels);
                }
            }
            OpKind::Linear => {
                let Some([t, n, k]) = op.gemm else { continue };
                // Element bytes of the input and output as the graph carries them: the
                // compute dtype's, or FP32 on QLoRA's FP32 stream ([`LoraConfig::fp32_stream`]).
                let xb = dag.tensors[op.inputs[0]].bytes / (t * k).max(1);
                let ob = dag.tensors[op.outputs[0]].bytes / (t * n).max(1);
                if qlora && block_linear {
                    // bitsandbytes' MatMul4Bit runs `dequantize_4bit` as a kernel of its own
                    // before each matmul with the weight, the forward's and the input
                    // gradient's (autograd/_functions.py): it reads the NF4 codes and scales
                    // and writes the 16-bit weight the GEMM then reads, one after the other,
                    // so its time adds to the GEMM's instead of hiding under its roofline.
                    op.fwd_scratch += n * k * c;
                    add_kernel(op, [cfg.base.linear_bytes(k, n) + n * k * c; 2]);
                }
                // An FP32 input is cast to the compute dtype for the GEMM (bitsandbytes'
                // `x.to(self.compute_dtype)`; autocast for the head) and a 4-bit linear's
                // output cast back to its input's dtype (`.to(inp_dtype)`): a transient
                // 16-bit copy and a kernel each way, the gradient cast back in backward.
                for (elems, b) in [(t * k, xb), (t * n, ob)].into_iter().filter(|&(_, b)| b != c) {
                    op.fwd_scratch += elems * c;
                    op.bwd_scratch += elems * c;
                    add_kernel(op, [elems * (b + c); 2]);
                }
                if !block_linear && other_bytes != c && base + tied > 0 {
                    // The head's frozen FP32 weight under 16-bit autocast: a fresh cast for
                    // each forward (autocast caches only casts of leaves that require grad),
                    // which the matmul keeps for the input gradient until the head's backward.
                    let name = format!("{}.weight.autocast", op.name);
                    added.kept(op, i, name, (base + tied) * c, TensorKind::Activation);
                    add_kernel(op, [(base + tied) * (other_bytes + c), 0]);
                }
                // Only the input gradient of the frozen weight.
                op.bwd_flops = op.fwd_flops;
                let x = op.inputs.first().copied();
                if block_linear && cfg.targets_op(family, &op.name) {
                    // lora_A reads its own copy of x (dropout's, or a cast): the frozen
                    // weight needs no x for its input gradient, so x is kept for nobody then.
                    if add_adapter(op, cfg, [t, n, k], [xb, ob], (i, &mut added), c) {
                        op.saves.retain(|s| Some(*s) != x);
                    }
                } else {
                    // A frozen linear keeps nothing for backward.
                    op.saves.retain(|s| Some(*s) != x);
                }
            }
            _ => {}
        }
    }
    dag.tensors.extend(added.tensors);
    dag.lora = Some(cfg.clone());
}

/// The tensors the pass adds, numbered after the DAG's own.
struct Added {
    tensors: Vec<Tensor>,
    first: usize,
}

impl Added {
    /// A tensor op `i` writes and keeps for its backward.
    fn kept(&mut self, op: &mut super::dag::Op, i: usize, name: String, bytes: u64, kind: TensorKind) {
        self.tensors.push(Tensor { name, bytes, kind, producer: Some(i) });
        let id = self.first + self.tensors.len() - 1;
        op.outputs.push(id);
        op.saves.push(id);
    }
}

/// A memory-bound kernel `op` runs one after another with its GEMMs (`Op::chain_bytes`): the
/// bytes it moves forward and backward, a launch each way it runs (0 bytes: not that way).
fn add_kernel(op: &mut super::dag::Op, bytes: [u64; 2]) {
    for (d, b) in bytes.into_iter().enumerate() {
        op.chain_bytes[d] += b as f64;
        op.launches[d] += u32::from(b > 0);
    }
}

/// A targeted linear's adapters, as PEFT's LoRA layer runs them under autocast
/// (`tuners/lora/layer.py` over a 16-bit base, `bnb.py` over a 4-bit one):
/// `result + lora_B(lora_A(dropout(x))) * scaling`. Adds lora_A (r x in) and lora_B
/// (out x r) to `params`, their FLOPs, what they save, and their memory-bound kernels:
/// - lora_A's input: x where it is in the compute dtype; PEFT's explicit cast to the adapters'
///   dtype first where [`LoraConfig::input_casts`] says; dropout's copy of that, and its
///   mask, where `lora_dropout` > 0; autocast's fresh cast to the compute dtype for the matmul
///   where the result is not in it. lora_A saves the last of these, lora_B saves x A;
/// - after the adapters: `* scaling` (a kernel each way over the out x tokens output), the
///   sum with the base's result (promoted to its dtype; the adapters' share of the gradient
///   cast down in backward where that differs), and over a 4-bit base bitsandbytes'
///   `result = result.clone()` (PEFT's "defensively clone" for 4-bit).
///
/// `[xb, ob]` are the element bytes of x and of the base's result. Returns whether x itself
/// is no longer read by lora_A (so nobody on the adapters' account keeps it).
fn add_adapter(
    op: &mut super::dag::Op,
    cfg: &LoraConfig,
    [t, n, k]: [u64; 3],
    [xb, ob]: [u64; 2],
    (i, added): (usize, &mut Added),
    c: u64,
) -> bool {
    let r = cfg.rank;
    let adapter = r * (k + n);
    op.params += adapter;
    let f = 2.0 * (t * adapter) as f64;
    op.fwd_flops += f;
    op.bwd_flops += 2.0 * f;
    added.kept(op, i, format!("{}.lora_A.out", op.name), t * r * c, TensorKind::Activation);
    let (tk, tn) = (t * k, t * n);
    // PEFT's cast to the adapters' dtype, then dropout, in the dtype lora_A is handed.
    let explicit = cfg.input_casts.filter(|&a| a != xb);
    let d = explicit.unwrap_or(xb);
    if let Some(a) = explicit {
        op.fwd_scratch += tk * a;
        add_kernel(op, [tk * (xb + a); 2]);
    }
    let mut own = explicit.is_some();
    if cfg.dropout > 0.0 {
        added.kept(op, i, format!("{}.lora_dropout.mask", op.name), tk, TensorKind::Mask);
        add_kernel(op, [tk * (2 * d + 1); 2]);
        if d == c {
            added.kept(op, i, format!("{}.lora_dropout.out", op.name), tk * c, TensorKind::Activation);
        } else {
            op.fwd_scratch += tk * d;
        }
        own = true;
    }
    if d != c {
        // Autocast's cast for lora_A's matmul: a fresh tensor, which lora_A saves.
        added.kept(op, i, format!("{}.lora_A.input", op.name), tk * c, TensorKind::Activation);
        add_kernel(op, [tk * (d + c); 2]);
        own = true;
    }
    if d != c || explicit.is_some() {
        // The gradient of lora_A's input in the wider dtype while it is cast back.
        op.bwd_scratch += tk * d.max(xb);
    }
    // `* scaling` over lora_B's output, each way.
    add_kernel(op, [2 * tn * c; 2]);
    // The sum with the base's result: forward reads both and writes the result's dtype;
    // backward passes the gradient through, cast down for the adapters where they differ.
    add_kernel(op, [tn * (2 * ob + c), if ob != c { tn * (ob + c) } else { 0 }]);
    if matches!(cfg.base, WeightFormat::Nf4 { .. }) {
        op.fwd_scratch += tn * ob;
        add_kernel(op, [2 * tn * ob, 0]);
    }
    own
}

/// A block op whose frozen weights share the block's FlatParameter with the adapters
/// ([`LoraConfig::shared_flat`]): trained as in full training (gradient, weight-gradient
/// GEMM, saved input), its base counted in `flat_frozen`, adapters added where targeted.
fn share_flat(op: &mut super::dag::Op, cfg: &LoraConfig, family: Family, i: usize, added: &mut Added, c: u64) {
    op.flat_frozen = op.params;
    if let (OpKind::Linear, Some(gemm)) = (op.kind, op.gemm) {
        if cfg.targets_op(family, &op.name) {
            add_adapter(op, cfg, gemm, [c, c], (i, added), c);
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
