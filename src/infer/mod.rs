//! Inference jobs (`[job] kind = "inference"`): load the weights (quantized or not), fill a
//! KV cache with the prompt's forward pass (prefill), then generate one token per forward
//! pass (decode), on one tensor-parallel group. The program is a one-class job that runs
//! through the same runner, engine and allocator model as training, so the verdict, the peak, memory.csv and memory.png mean the
//! same thing; the report adds time to first token, time per output token and the decode
//! bandwidth bound.
//!
//! What the program follows (sources in docs/research/issue8-sources.md):
//! - Hugging Face `generate()`: one prefill forward over the prompt, then `max_new_tokens - 1`
//!   decode forwards; the LM head runs on the last position only (`logits_to_keep = 1`), and
//!   its logits are copied to FP32 for sampling.
//! - `kv_cache = "static"` (HF `StaticCache`, gpt-fast): every layer's keys and values for
//!   `prompt_len + gen_len` tokens are allocated before the prompt runs, which is what lets
//!   decode run as one CUDA graph (`torch.compile(mode="reduce-overhead")`).
//! - `kv_cache = "dynamic"` (HF `DynamicCache`, `generate()`'s default): prefill keeps the
//!   prompt's keys and values; each decode step `torch.cat`s one token onto every layer's
//!   cache, allocating the longer tensor before freeing the shorter one, which the caching
//!   allocator has to place in ever larger blocks.
//! - weight-only quantization ([`crate::model::WeightFormat`]): decode kernels read the packed
//!   weights (GPTQ/AWQ/gpt-fast fuse dequantization into the GEMV); bitsandbytes NF4
//!   dequantizes the whole weight to the compute dtype whenever the input has more than one
//!   row (prefill; decode with batch > 1), a transient of out x in x 2 bytes per linear.

pub mod program;

use serde::Serialize;

use crate::engine::Deadlock;
use crate::hardware::Cluster;
use crate::model::{Dtype, KvDtype, LayerDag, ModelConfig, WeightFormat, Workload};
use crate::schedule::Schedule;

/// How the KV cache is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheKind {
    Static,
    Dynamic,
}

/// A validated `[inference]` section.
#[derive(Debug, Clone, Serialize)]
pub struct InferenceConfig {
    /// Sequences generated together.
    pub batch: u64,
    /// Prompt tokens per sequence.
    pub prompt_len: u64,
    /// Tokens generated per sequence (`max_new_tokens`).
    pub gen_len: u64,
    pub weights: WeightFormat,
    /// Activations, and the weights that are not quantized (embeddings, norms, LM head).
    pub compute_dtype: Dtype,
    pub kv_dtype: KvDtype,
    pub kv_cache: KvCacheKind,
    /// Decode replayed as a CUDA graph (no per-kernel launch overhead).
    pub cuda_graphs: bool,
    /// Bytes of the cuBLAS workspace the first matmul allocates through the caching
    /// allocator ([`crate::plan::TrainingConfig::blas_workspace`]; generation runs on one
    /// thread, so one workspace).
    pub blas_workspace: u64,
}

impl InferenceConfig {
    /// Tokens of context per sequence at the end of generation.
    pub fn context(&self) -> u64 {
        self.prompt_len + self.gen_len
    }

    /// "int4 (g128)", "nf4 + double quant", "bf16".
    pub fn weights_name(&self) -> String {
        match self.weights {
            WeightFormat::Half => self.compute_dtype.name().to_string(),
            WeightFormat::Int8 => "int8 (per-channel scales)".into(),
            WeightFormat::Int4 { group } => format!("int4 (group {group})"),
            WeightFormat::Nf4 { double_quant: true } => "nf4 + double quant".into(),
            WeightFormat::Nf4 { double_quant: false } => "nf4".into(),
        }
    }

    pub fn kv_dtype_name(&self) -> &'static str {
        match self.kv_dtype {
            KvDtype::Half => self.compute_dtype.name(),
            KvDtype::Fp8 => "fp8",
        }
    }
}

/// Per-kernel cost inside a CUDA graph: launches are gone, but each kernel still ramps up and
/// drains its last wave. An assumption (about 2 us for the short kernels of a decode step),
/// printed in every inference report.
pub const GRAPH_KERNEL_S: f64 = 2e-6;

/// An inference job compiled for one GPU of its tensor-parallel group: the prefill DAG,
/// the program and what it moves.
pub struct Compiled {
    pub dag: LayerDag,
    pub schedule: Schedule,
    pub traffic: program::Traffic,
}

/// Compiles the job `cfg` for `model` (in eval mode: no dropout) on `cluster`, split over
/// `tp` tensor-parallel ranks. `names`: label tasks and buffers (false for the capacity
/// search).
pub fn compile(
    model: &ModelConfig,
    workload: &Workload,
    cluster: &Cluster,
    tp: u64,
    cfg: &InferenceConfig,
    names: bool,
    probe: bool,
) -> Compiled {
    let mut model = model.clone();
    // model.eval(): no dropout.
    model.dropout = 0.0;
    let mut w = workload.clone();
    w.micro_batch = cfg.batch;
    w.seq_len = cfg.prompt_len;
    let dag = crate::model::build(&model, &w);
    let (schedule, traffic) = program::build_with(&dag, cfg, cluster, tp, names, probe);
    Compiled { dag, schedule, traffic }
}

/// The largest batch (at this context) and context (at this batch) that fit, each found by
/// bisection over whole simulations of the job.
#[derive(Debug, Clone, Serialize)]
pub struct MaxFit {
    pub max_batch: u64,
    /// prompt_len + gen_len, with gen_len as configured.
    pub max_context: u64,
    /// "memory" or why the search stopped before memory ran out.
    pub context_limited_by: String,
    pub batch_limited_by: String,
}

/// Largest x in [1, limit] with `ok(x)`, for `ok` monotone (true then false); 0 if none.
fn largest(limit: u64, mut ok: impl FnMut(u64) -> Result<bool, Deadlock>) -> Result<u64, Deadlock> {
    if limit == 0 || !ok(1)? {
        return Ok(0);
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while hi <= limit && ok(hi)? {
        lo = hi;
        hi *= 2;
    }
    let mut hi = hi.min(limit + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Most sequences the capacity search tries.
pub const MAX_BATCH_SEARCHED: u64 = 4096;
/// Longest context the search tries where the model sets no limit (rotary positions).
pub const MAX_CONTEXT_SEARCHED: u64 = 1 << 20;

/// The largest batch at the configured context and the longest context (prompt_len grown,
/// gen_len kept) at the configured batch for which `fits` (a whole simulation of the job)
/// holds, by bisection. Assumes memory grows with batch and context (it does: activations,
/// KV cache).
pub fn max_fit(
    model: &ModelConfig,
    cfg: &InferenceConfig,
    mut fits: impl FnMut(&InferenceConfig) -> Result<bool, Deadlock>,
) -> Result<MaxFit, Deadlock> {
    let max_batch = largest(MAX_BATCH_SEARCHED, |b| fits(&InferenceConfig { batch: b, ..cfg.clone() }))?;
    // Learned positions (GPT) stop at max_seq_len; rotary ones (Llama) do not.
    let (limit, why) = match model.family {
        crate::model::Family::Gpt => {
            (model.max_seq_len, format!("model.max_seq_len = {} (learned positions)", model.max_seq_len))
        }
        crate::model::Family::Llama => {
            (MAX_CONTEXT_SEARCHED, format!("the search stops at {MAX_CONTEXT_SEARCHED} tokens"))
        }
    };
    let prompt_limit = limit.saturating_sub(cfg.gen_len);
    let prompt = largest(prompt_limit, |p| fits(&InferenceConfig { prompt_len: p, ..cfg.clone() }))?;
    let max_context = if prompt == 0 { 0 } else { prompt + cfg.gen_len };
    Ok(MaxFit {
        max_batch,
        max_context,
        context_limited_by: if prompt == prompt_limit && prompt > 0 { why } else { "memory".into() },
        batch_limited_by: if max_batch == MAX_BATCH_SEARCHED {
            format!("the search stops at {MAX_BATCH_SEARCHED}")
        } else {
            "memory".into()
        },
    })
}
