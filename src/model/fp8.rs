//! FP8 training (`[fp8]`): which GEMMs run on the FP8 tensor cores, what the casts cost and
//! what the linears keep for backward, per recipe, as the libraries' source does it.
//!
//! - **`delayed`**: Transformer Engine's `DelayedScaling` under Megatron-Core (NeMo's
//!   `fp8 = True, fp8_hybrid = True`). `fp8_autocast` wraps the transformer blocks only
//!   (`transformer_block.py`), so the block linears (TE `LayerNormLinear`, `Linear`,
//!   `GroupedLinear` for experts) run in FP8 and the LM head (Megatron's own
//!   `ColumnParallelLinear`), the router, the embeddings and the attention core
//!   (`fp8_dot_product_attention` off) stay in 16 bits. Forward, input-gradient and weight-
//!   gradient GEMMs are FP8 (`override_linear_precision = (False, False, not fp8_wgrad)`).
//!   TE 1.x (`module/linear.py`, `layernorm_linear.py`, v1.12): a `LayerNormLinear` writes
//!   its normalised input in FP8 straight from the norm kernel and saves that (1 B/element,
//!   the local shard under sequence parallelism), transposing it in backward
//!   (`fp8_transpose`: 1 B read, 1 B written); a `Linear` runs `fp8_cast_transpose_fused`
//!   on its input (2 B read, 1 + 1 B written) and saves the FP8 transpose (1 B/element);
//!   every FP8 linear casts and transposes its output gradient (`fp8_cast_transpose_bgrad`:
//!   2 B read, 2 B written). With Megatron's `is_first_microbatch`, each weight's FP8 copy
//!   and FP8 transpose are a persistent workspace (2 B/parameter, `base.py`
//!   `get_fp8_workspace`), refreshed once per step (2 B read, 2 B written per parameter).
//!   Scaling state per GEMM: FP32 amax histories of `amax_history_len` rows for input,
//!   weight and output gradient, and their scales.
//! - **`blockwise`** / **`mxfp8`**: Transformer Engine 2.x's `Float8BlockScaling` (Megatron
//!   `--fp8-recipe blockwise`: 1 x 128 blocks for activations and gradients, 128 x 128 for
//!   weights, FP32 scales; compute capability 9.0+, the DeepSeek-V3 recipe) and
//!   `MXFP8BlockScaling` (`--fp8-recipe mxfp8`: 1 x 32 blocks, E8M0 scales; compute
//!   capability 10.x). Scaling is current: each block's scale comes from its own amax as it
//!   is quantized, so no amax history is kept. The same linears and GEMMs as `delayed` run in
//!   FP8. TE 2.x's `Linear` (`module/linear.py`, d0067d0) quantizes its input rowwise and
//!   columnwise in one pass (2 B read, 1 + 1 B written) and keeps only the columnwise data for
//!   the weight gradient (`update_usage(rowwise_usage=False, columnwise_usage=True)`): 1
//!   B/element plus its scales (1/32 B: an FP32 per 128, an E8M0 per 32), nothing transposed in
//!   backward; the output gradient is quantized both ways (2 B read, 2 B written). The
//!   weight's FP8 copies, rowwise for the forward and columnwise for the input-gradient GEMM,
//!   persist across the step's micro-batches as delayed scaling's do (2 B per parameter, plus
//!   1/16 B of E8M0 scales for MXFP8; 128 x 128 blocks' FP32 scales are negligible).
//! - **`tensorwise`** / **`rowwise`**: torchao's `Float8Linear` with dynamic scaling, as
//!   torchtitan converts every linear but the LM head (`filter_fqns = ["output"]`). All
//!   three GEMMs are FP8 in both recipes (`Float8LinearConfig.from_recipe_name`). The input
//!   is saved in 16 bits (`matmul_with_hp_or_float8_args` saves `input_hp`), so activation
//!   memory is unchanged; every cast is dynamic: an amax pass then a cast. Traffic per
//!   element as torchao's own roofline model counts it
//!   (`torchao/testing/float8/roofline_utils.py`, v0.10): tensorwise activations and output
//!   gradients 2 B (amax) + 2 B read + 2 x 1 B written = 6 B, weights 8 B; rowwise
//!   activations 8 B, weights 10 B. The weight is cast on every micro-batch's forward and
//!   again for its backward.

use serde::Serialize;

use super::dag::{Fp8Gemm, LayerDag, OpKind, Region, Tensor, TensorKind};
use crate::net::Collective;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fp8Recipe {
    /// Transformer Engine delayed scaling (Megatron-Core, NeMo).
    Delayed,
    /// torchao float8, tensorwise dynamic scaling (torchtitan's default).
    Tensorwise,
    /// torchao float8, rowwise (axiswise) dynamic scaling.
    Rowwise,
    /// Transformer Engine 2.x `Float8BlockScaling` (1 x 128 / 128 x 128 blocks).
    Blockwise,
    /// Transformer Engine 2.x `MXFP8BlockScaling` (1 x 32 blocks, E8M0 scales).
    Mxfp8,
}

impl Fp8Recipe {
    pub fn name(self) -> &'static str {
        match self {
            Fp8Recipe::Delayed => "delayed",
            Fp8Recipe::Tensorwise => "tensorwise",
            Fp8Recipe::Rowwise => "rowwise",
            Fp8Recipe::Blockwise => "blockwise",
            Fp8Recipe::Mxfp8 => "mxfp8",
        }
    }

    /// A Transformer Engine recipe (run by Megatron-Core), which keeps FP8 copies of the saved
    /// inputs and persistent FP8 weight workspaces; torchao's keep neither.
    pub fn is_te(self) -> bool {
        matches!(self, Fp8Recipe::Delayed | Fp8Recipe::Blockwise | Fp8Recipe::Mxfp8)
    }

    /// Bytes of block scales per FP8 element of an activation or gradient (an FP32 per 128,
    /// an E8M0 per 32); 0 under per-tensor scaling.
    pub fn activation_scale_bytes(self) -> f64 {
        match self {
            Fp8Recipe::Blockwise => 4.0 / 128.0,
            Fp8Recipe::Mxfp8 => 1.0 / 32.0,
            _ => 0.0,
        }
    }

    /// Bytes of a linear's persistent FP8 weight copies (rowwise and columnwise) with their
    /// scales, for `params` parameters; 0 for torchao's recipes.
    pub fn workspace_bytes(self, params: u64) -> u64 {
        match self {
            Fp8Recipe::Delayed => 2 * params,
            // Two copies of an FP32 scale per 128 x 128 block.
            Fp8Recipe::Blockwise => 2 * params + 2 * 4 * params.div_ceil(128 * 128),
            Fp8Recipe::Mxfp8 => 2 * params + 2 * params.div_ceil(32),
            Fp8Recipe::Tensorwise | Fp8Recipe::Rowwise => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fp8Config {
    pub recipe: Fp8Recipe,
    /// Weight-gradient GEMMs in FP8 (TE `fp8_wgrad`, Megatron's default; off with
    /// `--no-fp8-wgrad`).
    pub wgrad: bool,
    /// Rows of each GEMM's amax history (delayed scaling).
    pub amax_history_len: u64,
    /// Micro-batches per step: a cached FP8 weight is refreshed once per step, so each
    /// micro-batch carries this share of the refresh.
    pub micro_batches: u64,
    /// tensorwise under FSDP: the float8 linears' weights are cast on each rank's shard
    /// and all-gathered in FP8 (torchao `enable_fsdp_float8_all_gather`, torchtitan
    /// `float8.enable_fsdp_float8_all_gather`; off by default in both).
    pub fsdp_all_gather: bool,
    /// The FSDP shard group the weights are all-gathered over (1 when they are not sharded).
    pub shard_group: u64,
}

impl Fp8Config {
    /// torchao's float8 tensor parallelism applies (torchtitan turns it on for tensorwise
    /// with sequence-parallel TP): sequence-parallel inputs cast on the shard and all-gathered
    /// in FP8.
    pub fn float8_tensor_parallel(&self, split: &super::TensorSplit) -> bool {
        self.recipe == Fp8Recipe::Tensorwise && split.tensor > 1 && split.sequence_parallel
    }
}

/// Bytes per element of the casts, as documented at the top of this module:
/// (forward per input element, backward per input element, backward per output-gradient
/// element, per parameter per micro-batch).
fn cast_traffic(recipe: Fp8Recipe, norm_fused: bool, micro_batches: u64) -> (f64, f64, f64, f64) {
    match recipe {
        Fp8Recipe::Delayed => {
            let refresh = 4.0 / micro_batches.max(1) as f64;
            if norm_fused {
                // The norm writes FP8 itself; backward transposes the saved FP8 copy.
                (0.0, 2.0, 4.0, refresh)
            } else {
                (4.0, 0.0, 4.0, refresh)
            }
        }
        // The input is cast forward and again (from the saved 16-bit copy) for the weight
        // gradient; the output gradient once per backward GEMM reading it (torchao eager
        // casts it for each of the two); the weight forward and backward.
        Fp8Recipe::Tensorwise => (6.0, 6.0, 12.0, 16.0),
        Fp8Recipe::Rowwise => (8.0, 8.0, 16.0, 20.0),
        // Quantized both ways at once, scales written beside; the saved columnwise copy needs
        // no transpose in backward.
        Fp8Recipe::Blockwise | Fp8Recipe::Mxfp8 => {
            let scales = 2.0 * recipe.activation_scale_bytes();
            (4.0 + scales, 0.0, 4.0 + scales, 4.0 / micro_batches.max(1) as f64)
        }
    }
}

/// Whether an op is one of the linears the recipe runs in FP8.
fn converted(dag: &LayerDag, id: usize) -> bool {
    let op = &dag.ops[id];
    op.kind == OpKind::Linear
        && matches!(op.region, Region::Block(_))
        && !op.name.ends_with(".router")
        && op.gemm.is_some_and(|[_, n, k]| n % 16 == 0 && k % 16 == 0)
}

/// Runs the block linears in FP8: marks their GEMMs, adds the casts' memory traffic to their
/// kernels, and (delayed scaling) replaces each saved 16-bit input with the FP8 copy the
/// library keeps.
///
/// torchtitan's float8 tensor parallelism (tensorwise with sequence parallelism:
/// `Float8ColwiseParallel` and `PrepareFloat8ModuleInput` in torchao/float8/
/// float8_tensor_parallel.py) casts a sequence-parallel input on this rank's shard, once
/// for the linears that read it (attention's q, k and v; the MLP's gate and up), and
/// all-gathers it in FP8; the gradient is reduce-scattered in 16 bits. With
/// `fsdp_all_gather`, the weight is cast on the shard before each FSDP all-gather (forward
/// and backward) and backward copies the gathered FP8 weight transposed for the
/// input-gradient GEMM (1 B read, 1 B written).
pub fn apply(dag: &mut LayerDag, cfg: &Fp8Config, c: u64) {
    let mut fp8_copy: Vec<Option<usize>> = vec![None; dag.tensors.len()];
    let split = dag.workload.split;
    let float8_tp = cfg.float8_tensor_parallel(&split);
    // Sequence-parallel inputs already cast (on the shard) for an earlier linear.
    let mut cast_on_shard = vec![false; dag.tensors.len()];
    for id in 0..dag.ops.len() {
        if !converted(dag, id) {
            continue;
        }
        let input = dag.ops[id].inputs[0];
        let out = dag.ops[id].outputs[0];
        let norm_fused =
            dag.tensors[input].producer.is_some_and(|p| dag.ops[p].kind == OpKind::Norm) || dag.ops[id].column_parallel;
        let (fwd_in, bwd_in, bwd_out, per_param) = cast_traffic(cfg.recipe, norm_fused, cfg.micro_batches);
        let in_elems = (dag.tensors[input].bytes / c) as f64;
        let out_elems = (dag.tensors[out].bytes / c) as f64;
        let w = (dag.ops[id].params + dag.ops[id].shared_params) as f64;
        let sp_gather = dag.tensors[input]
            .producer
            .filter(|&p| float8_tp && dag.ops[p].comm.is_some_and(|m| m.forward == Some(Collective::AllGather)));
        let fwd_cast = match sp_gather {
            Some(_) if cast_on_shard[input] => 0.0,
            Some(_) => {
                cast_on_shard[input] = true;
                fwd_in * in_elems / split.tensor as f64
            }
            None => fwd_in * in_elems,
        };
        let (w_fwd, w_bwd) = if cfg.fsdp_all_gather {
            let shard = 8.0 * w / cfg.shard_group.max(1) as f64;
            (shard, shard + 2.0 * w)
        } else {
            (per_param * w / 2.0, per_param * w / 2.0)
        };
        let op = &mut dag.ops[id];
        op.fp8 = Some(Fp8Gemm { wgrad: cfg.wgrad });
        op.chain_bytes[0] += fwd_cast + w_fwd;
        op.chain_bytes[1] += bwd_in * in_elems + bwd_out * out_elems + w_bwd;
        if !cfg.recipe.is_te() {
            continue;
        }
        // The saved input becomes its FP8 copy (one per 16-bit tensor, shared by the
        // linears reading it, as one fused QKV LayerNormLinear keeps one), with its block
        // scales.
        let saves = dag.ops[id].saves.clone();
        for (i, &t) in saves.iter().enumerate() {
            if dag.tensors[t].kind != TensorKind::Activation || dag.tensors[t].bytes % c != 0 {
                continue;
            }
            let copy = match fp8_copy[t] {
                Some(x) => x,
                None => {
                    let elems = dag.tensors[t].bytes / c;
                    dag.tensors.push(Tensor {
                        name: format!("{}.fp8", dag.tensors[t].name),
                        bytes: elems + (elems as f64 * cfg.recipe.activation_scale_bytes()).ceil() as u64,
                        kind: TensorKind::Activation,
                        producer: Some(id),
                    });
                    let x = dag.tensors.len() - 1;
                    fp8_copy.push(None);
                    fp8_copy[t] = Some(x);
                    dag.ops[id].outputs.push(x);
                    x
                }
            };
            dag.ops[id].saves[i] = copy;
        }
    }
    // The all-gathers of inputs cast on the shard move FP8, into an FP8 buffer.
    for (t, &cast) in cast_on_shard.iter().enumerate() {
        if !cast {
            continue;
        }
        dag.tensors[t].bytes /= c;
        if let Some(m) = dag.tensors[t].producer.and_then(|p| dag.ops[p].comm.as_mut()) {
            m.forward_bytes = Some(m.bytes / c);
        }
    }
}

/// Bytes of one FP8 linear's scaling state under delayed scaling: FP32 amax histories of
/// `len` rows and a scale and inverse scale, for its input, weight and output gradient.
pub fn scaling_state_bytes(len: u64) -> u64 {
    3 * (len + 2) * 4
}
