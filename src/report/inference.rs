//! The report of an inference job: what the weights and the KV cache take, the memory
//! verdict of the whole `generate()` call, time to first token, time per output token, the
//! decode bandwidth bound, and the largest batch and context that fit.

use std::fmt::Write;

use serde::Serialize;

use super::{fmt_bytes, human_count, Bytes, ModelStateReport, RankClass, Report};
use crate::engine::Trace;
use crate::infer::program::Traffic;
use crate::infer::{InferenceConfig, KvCacheKind};
use crate::model::LayerDag;
use crate::scenario::Scenario;
use crate::schedule::{Phase, Schedule};

#[derive(Debug, Clone, Serialize)]
pub struct InferenceReport {
    pub batch: u64,
    pub prompt_len: u64,
    pub gen_len: u64,
    pub weights: String,
    pub compute_dtype: &'static str,
    pub kv_cache: KvCacheKind,
    pub kv_cache_dtype: &'static str,
    pub cuda_graphs: bool,
    pub tensor_parallel: u64,
    /// Independent copies of the model (gpus / tensor).
    pub replicas: u64,
    /// Weights on one GPU as stored, and what they would be in the compute dtype.
    pub weights_per_gpu: Bytes,
    pub weights_per_gpu_unquantized: Bytes,
    /// Stored bytes per parameter over the whole model (quantization scales included).
    pub weight_bytes_per_param: f64,
    /// Keys and values per token of context of one sequence on one GPU.
    pub kv_bytes_per_token: u64,
    /// The KV cache at the end of generation: batch x (prompt_len + gen_len) tokens.
    pub kv_cache_per_gpu: Bytes,
    /// `None` when generation ran out of memory.
    pub timing: Option<InferenceTiming>,
    pub max_fit: Option<MaxFit>,
}

#[derive(Debug, Clone, Serialize)]
pub struct InferenceTiming {
    /// Time to first token: the prompt's forward pass and the first sample.
    pub ttft_s: f64,
    pub prefill_tokens_per_s: f64,
    /// Mean time per output token after the first (one decode pass).
    pub tpot_s: f64,
    /// Generated tokens per second of one replica (batch / TPOT), and of all replicas.
    pub decode_tokens_per_s: f64,
    pub decode_tokens_per_s_all_replicas: f64,
    /// The whole generate() call.
    pub total_s: f64,
    /// HBM bytes one decode pass moves on one GPU (mean over the passes).
    pub decode_bytes_per_pass: Bytes,
    /// Those bytes at the datasheet HBM bandwidth: no decode pass can be faster.
    pub bandwidth_bound_tpot_s: f64,
    pub bandwidth_bound_tokens_per_s: f64,
    /// Bound over simulated TPOT (1 = at the bandwidth limit).
    pub bandwidth_utilisation: f64,
    /// Share of a decode pass the compute stream waits on tensor-parallel all-reduces.
    pub decode_comm_fraction: f64,
    pub decode_passes: u64,
}

pub use crate::infer::MaxFit;

pub fn build(
    s: &Scenario,
    cfg: &InferenceConfig,
    dag: &LayerDag,
    sched: &Schedule,
    trace: &Trace,
    traffic: &Traffic,
) -> Report {
    let cap = s.allocator_capacity();
    let (verdict, peak, phase_peaks) = super::memory_side(cap, sched, trace);
    let params = dag.config.param_count();
    let tp = s.parallel.model_parallel.tensor;
    let replicas = u64::from(s.cluster.gpus) / tp;
    let w = traffic.weight_bytes;
    let timing = if trace.oom.is_none() { timing(s, sched, trace, traffic, replicas) } else { None };
    let zero = Bytes::new(0);
    let msr = ModelStateReport {
        parameters: Bytes::new(w),
        master_weights: zero,
        gradients: zero,
        optimizer_state: zero,
        total: Bytes::new(w),
        bytes_per_param: w as f64 * tp as f64 / params.max(1) as f64,
        bytes_per_param_per_gpu: super::round4(w as f64 / params.max(1) as f64),
        naive_average: Bytes::new(w),
    };
    let ctx = cfg.context();
    let mut assumptions = vec![
        format!(
            "weights: transformer-block linears {} ({:.4} B/param with scales; AutoGPTQ / AutoAWQ / bitsandbytes formats, docs/research/issue8-sources.md), embeddings, norms and the LM head in {} (not quantized, as those tools leave them)",
            cfg.weights_name(),
            cfg.weights.bytes_per_param(),
            cfg.compute_dtype.name()
        ),
        format!(
            "KV cache: 2 (K, V) x {} layers x {} KV heads{} x head_dim {} x {} B = {} B per token per sequence on each GPU; {}",
            dag.config.n_layers,
            dag.config.n_kv_heads,
            if tp > 1 { format!(" / {tp} ranks (at least one each)") } else { String::new() },
            dag.config.head_dim(),
            cfg.kv_dtype.bytes(),
            traffic.kv_bytes_per_token,
            match cfg.kv_cache {
                KvCacheKind::Static => format!("static (HF StaticCache / gpt-fast): all {ctx} tokens x batch {} allocated before the prompt runs, and every decode pass's attention reads all of it (masked)", cfg.batch),
                KvCacheKind::Dynamic => "dynamic (HF DynamicCache, generate()'s default): prefill keeps the prompt's keys and values, each decode pass torch.cat's one token onto every layer (the longer tensor is allocated before the shorter is freed)".into(),
            }
        ),
        format!(
            "prefill: the layer DAG's forward ops without autograd (outputs freed after their last consumer, no saved tensors), each matmul's GEMM kernel by its shape as in training (the batch's prompt tokens as rows; under {}, below the measured shapes, at the steady GEMM rate), causal flash attention at half the full-attention FLOPs, the LM head on the last position only (logits_to_keep = 1), logits copied to FP32 for sampling",
            crate::schedule::cost::GEMM_TABLE_MIN_DIM
        ),
        format!(
            "decode: per layer an attention half and an MLP half, each the roofline of its bytes (weights as stored + KV cache + activations) at {:.0}% of {:.2} TB/s HBM against its FLOPs (GEMMs of {} row{}{}), plus {} per kernel{}",
            crate::schedule::cost::HBM_EFFICIENCY * 100.0,
            s.cluster.gpu.hbm_bytes_per_s / 1e12,
            cfg.batch,
            if cfg.batch == 1 { "" } else { "s" },
            if cfg.batch < crate::schedule::cost::GEMM_TABLE_MIN_DIM {
                format!(", under the {} of the measured GEMM shapes: weight-streaming kernels at the steady GEMM rate", crate::schedule::cost::GEMM_TABLE_MIN_DIM)
            } else {
                ": each kernel by its shape as in training".to_string()
            },
            if cfg.cuda_graphs { format!("{:.0} us (inside a CUDA graph, assumed)", crate::infer::GRAPH_KERNEL_S * 1e6) } else { format!("{:.0} us launch overhead (eager)", crate::schedule::cost::OP_OVERHEAD_S * 1e6) },
            if tp > 1 { "; under tensor parallelism two all-reduces of the batch's hidden state per layer (NCCL LL protocol inside a node: 6.6 us + 0.6 us per ring step)" } else { "" }
        ),
        "quantized weights: dequantization is assumed to hide under the weight reads (GPTQ/AWQ/gpt-fast fused kernels), which is optimistic: gpt-fast measured int8 at 95% and int4 at 79% of its BF16 decode bandwidth (tests/fixtures/gpt_fast_decode.json); bitsandbytes NF4 dequantizes each whole weight (a transient out x in x 2 B, written and read) whenever more than one row goes through it".into(),
        "loading the weights takes no simulated time (TTFT starts with the prompt on the device)".into(),
        super::allocator::capacity_assumption(s),
        super::allocator::assumption(s),
    ];
    if replicas > 1 {
        assumptions.push(format!("{replicas} replicas of {tp} GPU(s) serve independently; the figures are one replica's, tokens/s also for all"));
    }
    let inference = InferenceReport {
        batch: cfg.batch,
        prompt_len: cfg.prompt_len,
        gen_len: cfg.gen_len,
        weights: cfg.weights_name(),
        compute_dtype: cfg.compute_dtype.name(),
        kv_cache: cfg.kv_cache,
        kv_cache_dtype: cfg.kv_dtype_name(),
        cuda_graphs: cfg.cuda_graphs,
        tensor_parallel: tp,
        replicas,
        weights_per_gpu: Bytes::new(w),
        weights_per_gpu_unquantized: Bytes::new(traffic.weight_bytes_half),
        weight_bytes_per_param: super::round4(w as f64 * tp as f64 / params.max(1) as f64),
        kv_bytes_per_token: traffic.kv_bytes_per_token,
        kv_cache_per_gpu: Bytes::new(traffic.kv_bytes_final),
        timing,
        max_fit: None,
    };
    let gpus = u64::from(s.cluster.gpus);
    Report {
        scenario: s.name.clone(),
        description: s.description.clone(),
        model_source: s.model_source.clone(),
        stepsim_version: env!("CARGO_PKG_VERSION"),
        job: "inference",
        model: super::to_json(&s.model),
        param_count: params,
        param_count_human: human_count(params),
        active_param_count: None,
        trainable_params: 0,
        lora: None,
        hardware: super::to_json(&s.cluster),
        capacity: Bytes::new(cap),
        parallel: super::to_json(&s.parallel.model_parallel),
        training: serde_json::Value::Null,
        headline_class: 0,
        rank_classes: vec![RankClass {
            ranks: if gpus == 1 { "0".into() } else { format!("0-{}", gpus - 1) },
            count: gpus,
            note: "identical programs (tensor-parallel ranks and replicas): simulated once".into(),
            stage: None,
            rank: None,
            expert_rank: None,
        }],
        model_state_per_gpu: msr,
        verdict,
        peak,
        phase_peaks,
        steps: Vec::new(),
        throughput: None,
        checkpointing_cost: None,
        explanation: None,
        assumptions,
        allocator: super::allocator::build(s, sched, trace),
        offload: None,
        routing: None,
        fp8: None,
        activation_offload: None,
        offload_fits: true,
        inference: Some(inference),
    }
}

fn timing(s: &Scenario, sched: &Schedule, trace: &Trace, traffic: &Traffic, replicas: u64) -> Option<InferenceTiming> {
    let tasks = &sched.program.tasks;
    let (mut p0, mut p1, mut d1) = (u64::MAX, 0u64, 0u64);
    let mut comm_wait = 0u64;
    for (i, task) in tasks.iter().enumerate() {
        match sched.labels[task.label as usize].phase {
            Phase::Prefill => {
                p0 = p0.min(trace.start_ns[i]);
                p1 = p1.max(trace.end_ns[i]);
            }
            Phase::Decode => {
                d1 = d1.max(trace.end_ns[i]);
                if task.stream == crate::infer::program::TP {
                    comm_wait += task.duration_ns;
                }
            }
            _ => {}
        }
    }
    if p0 == u64::MAX {
        return None;
    }
    let cfg = s.inference.as_ref()?;
    let ttft = (p1 - p0) as f64 / 1e9;
    let passes = traffic.decode_steps;
    let decode_s = d1.saturating_sub(p1) as f64 / 1e9;
    let tpot = if passes > 0 { decode_s / passes as f64 } else { 0.0 };
    let bytes = if passes > 0 { traffic.decode_bytes / passes as f64 } else { 0.0 };
    let bound = bytes / s.cluster.gpu.hbm_bytes_per_s;
    let per_s = if tpot > 0.0 { cfg.batch as f64 / tpot } else { 0.0 };
    Some(InferenceTiming {
        ttft_s: ttft,
        prefill_tokens_per_s: (cfg.batch * cfg.prompt_len) as f64 / ttft.max(1e-12),
        tpot_s: tpot,
        decode_tokens_per_s: per_s,
        decode_tokens_per_s_all_replicas: per_s * replicas as f64,
        total_s: (d1.max(p1) - p0) as f64 / 1e9,
        decode_bytes_per_pass: Bytes::new(bytes.round() as u64),
        bandwidth_bound_tpot_s: bound,
        bandwidth_bound_tokens_per_s: if bound > 0.0 { cfg.batch as f64 / bound } else { 0.0 },
        bandwidth_utilisation: if tpot > 0.0 { super::round4(bound / tpot) } else { 0.0 },
        decode_comm_fraction: if decode_s > 0.0 { super::round4(comm_wait as f64 / 1e9 / decode_s) } else { 0.0 },
        decode_passes: passes,
    })
}

/// The job lines of the text report (in place of the training and model-state lines).
pub fn header(r: &Report, inf: &InferenceReport, o: &mut String) {
    let _ = writeln!(
        o,
        "Parallel   tensor parallel {} x {} replica(s); weights {} per GPU",
        inf.tensor_parallel,
        inf.replicas,
        fmt_bytes(inf.weights_per_gpu.bytes)
    );
    let _ = writeln!(
        o,
        "Inference  batch {} x (prompt {} + generate {}) tokens, weights {}, compute {}, KV cache {} {}, CUDA graphs {}",
        inf.batch,
        inf.prompt_len,
        inf.gen_len,
        inf.weights,
        inf.compute_dtype,
        match inf.kv_cache {
            KvCacheKind::Static => "static",
            KvCacheKind::Dynamic => "dynamic",
        },
        inf.kv_cache_dtype,
        if inf.cuda_graphs { "on" } else { "off" }
    );
    let _ = writeln!(o, "\nMemory per GPU");
    let _ = writeln!(
        o,
        "  weights            {}  = {:.4} B per parameter ({} params; {} if unquantized)",
        fmt_bytes(inf.weights_per_gpu.bytes),
        inf.weight_bytes_per_param,
        r.param_count_human,
        fmt_bytes(inf.weights_per_gpu_unquantized.bytes)
    );
    let _ = writeln!(
        o,
        "  KV cache           {}  = {} B per token x {} sequences x {} tokens",
        fmt_bytes(inf.kv_cache_per_gpu.bytes),
        inf.kv_bytes_per_token,
        inf.batch,
        inf.prompt_len + inf.gen_len
    );
}

/// The time and capacity lines of the text report.
pub fn timing_text(inf: &InferenceReport, o: &mut String) {
    match &inf.timing {
        Some(t) => {
            let _ = writeln!(o, "\nTime");
            let _ = writeln!(
                o,
                "  time to first token {:.1} ms (prefill {:.0} tokens/s); time per output token {:.2} ms over {} decode passes",
                t.ttft_s * 1e3,
                t.prefill_tokens_per_s,
                t.tpot_s * 1e3,
                t.decode_passes
            );
            let _ = writeln!(
                o,
                "  decode {:.1} tokens/s per replica ({:.1} per sequence), {:.1} tokens/s over all replicas; generate() {:.2} s",
                t.decode_tokens_per_s,
                if inf.batch > 0 { t.decode_tokens_per_s / inf.batch as f64 } else { 0.0 },
                t.decode_tokens_per_s_all_replicas,
                t.total_s
            );
            let _ = writeln!(
                o,
                "  bandwidth bound: {} per decode pass at datasheet HBM bandwidth = {:.2} ms ({:.1} tokens/s); simulated decode reaches {:.0}% of it{}",
                fmt_bytes(t.decode_bytes_per_pass.bytes),
                t.bandwidth_bound_tpot_s * 1e3,
                t.bandwidth_bound_tokens_per_s,
                t.bandwidth_utilisation * 100.0,
                if t.decode_comm_fraction > 0.0 {
                    format!("; tensor-parallel all-reduces take {:.0}% of decode", t.decode_comm_fraction * 100.0)
                } else {
                    String::new()
                }
            );
        }
        None => {
            let _ = writeln!(o, "\nTime       not reported: generation did not complete");
        }
    }
    if let Some(m) = &inf.max_fit {
        let _ = writeln!(o, "\nCapacity   (each by bisection over whole simulations of this job)");
        let _ = writeln!(
            o,
            "  largest batch at {} tokens of context: {} ({})",
            inf.prompt_len + inf.gen_len,
            m.max_batch,
            m.batch_limited_by
        );
        let _ = writeln!(
            o,
            "  longest context at batch {} (generating {}): {} tokens ({})",
            inf.batch, inf.gen_len, m.max_context, m.context_limited_by
        );
    }
}
