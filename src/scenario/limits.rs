//! Stated limits, checked before any work starts: per-field maxima where a larger value is
//! not a training job any more (and would overflow stepsim's 64-bit byte counts), the largest
//! single tensor a job may hold, and the simulation's size. Each limit is in docs/scenario-format.md,
//! the scenario format reference; an error names the field and what to reduce.

use super::{ScenarioError, V};
use crate::model::{ModelConfig, Workload};

/// Transformer blocks: 1024 (published models have up to about 130; `explain` simulates a
/// dozen variants of a job, which must stay within seconds).
pub const MAX_LAYERS: u64 = 1024;
/// Hidden size: 2^20 (published models stay under 2^15).
pub const MAX_HIDDEN: u64 = 1 << 20;
/// Attention heads.
pub const MAX_HEADS: u64 = 1 << 16;
/// MLP hidden size.
pub const MAX_FFN: u64 = 1 << 22;
/// Vocabulary: 2^24 tokens (published vocabularies stay under 2^18).
pub const MAX_VOCAB: u64 = 1 << 24;
/// Sequence length and position table: 2^24 tokens.
pub const MAX_SEQ: u64 = 1 << 24;
/// Sequences per micro-batch.
pub const MAX_MICRO_BATCH: u64 = 1 << 20;
/// Tokens per micro-batch (micro_batch x seq_len).
pub const MAX_TOKENS: u64 = 1 << 32;
/// Micro-batches per step.
pub const MAX_GRAD_ACCUM: u64 = 1 << 16;
/// GPUs in a job.
pub const MAX_GPUS: u64 = 1 << 20;
/// `[hardware.custom] memory`: 2^44 bytes (16 TiB; announced parts stay under 1 TiB).
pub const MAX_GPU_MEMORY: u64 = 1 << 44;
/// `[hardware.custom]` peaks: 10^6 TFLOP/s (an exaFLOP/s per GPU; shipped parts reach 10^4).
pub const MAX_TFLOPS: f64 = 1e6;
/// `[hardware.custom]` bandwidths: 10^6 GB/s (a PB/s; HBM is near 10^4).
pub const MAX_GB_PER_S: f64 = 1e6;
/// `[hardware.custom] sms`: 2^16 (shipped parts have up to 304).
pub const MAX_SMS: u64 = 1 << 16;
/// DDP's `bucket_cap_mb`: 2^24 MiB (16 TiB). A bucket larger than the model is one bucket,
/// so any larger value means the same; the bound keeps its bytes exact.
pub const MAX_BUCKET_CAP_MB: f64 = (1u64 << 24) as f64;
/// The largest single tensor: 2^56 bytes (72 PB). Beyond it no GPU could hold it, and
/// products of the job's sizes start to leave stepsim's 64-bit byte counts.
pub const MAX_TENSOR_BYTES: u128 = 1 << 56;
/// Tasks a simulation may hold, estimated before it is built as ranks simulated x steps x
/// micro-batches x 3 (forward, backward, collectives) x (16 ops per block + 16), an upper
/// bound (the shipped scenarios hold 0.4-0.97 of it). The largest published configuration
/// stepsim is checked against, Narayanan et al. 2021 Table 2's 530B PTD-P on 560 GPUs (1120
/// micro-batches of 105 layers), estimates 11.4 million; the lean path (sweeps) holds about
/// 100 bytes per task.
pub const MAX_TASKS: u64 = 16_000_000;
/// Tasks `stepsim run` and `explain` report in full (every task and buffer named, every memory
/// sample kept, trace.json and memory.csv written): about 2.5 kB per task (the shipped
/// GPT-3 175B run: 0.69 million tasks, 1.7 GB), so this bound keeps a run near 4 GB. Larger
/// jobs run through `stepsim sweep`'s lean path.
pub const MAX_REPORT_TASKS: u64 = 2_000_000;

impl V<'_> {
    /// A positive integer no larger than `max`.
    pub(super) fn bounded(&self, field: &str, v: i64, max: u64) -> Result<u64, ScenarioError> {
        let x = self.positive(field, v)?;
        if x > max {
            return Err(self.err(
                field,
                format!("must be at most {max}, got {x} (stepsim's stated limit; see docs/scenario-format.md)"),
            ));
        }
        Ok(x)
    }
}

/// Parameters a model may hold: 2^50 (1.1 x 10^15; published models hold under 10^13). The
/// sizes are each bounded, but their products are not: 2^22 experts of width 2^22 over a
/// hidden state of 2^20 would pass every field's limit and hold 2^66 parameters. Under this
/// bound every parameter count stepsim takes in 64 bits (a block, an expert, the model) and
/// 16 bytes of state for each stay exact.
pub const MAX_PARAMS: u128 = 1 << 50;

/// An upper bound on a model's parameters, computed in 128 bits from its sizes (each
/// projection counted with a bias, four two-vector norms a block), so that it can be checked
/// before any 64-bit count is taken; within 1.2x of the count for every zoo model (tested);
/// and the field whose size adds the most, for the refusal to name.
pub fn param_bound(m: &ModelConfig) -> (u128, &'static str) {
    let u = u128::from;
    let h = u(m.hidden);
    let head = u(m.head_dim_override.unwrap_or(m.hidden / m.n_heads.max(1)));
    let (q, kv) = (u(m.n_heads) * head, u(m.n_kv_heads) * head);
    let attention = match &m.mla {
        Some(a) => {
            let (heads, qk) = (u(m.n_heads), u(a.qk_nope_head_dim) + u(a.qk_rope_head_dim));
            let (rq, rkv) = (u(a.q_lora_rank), u(a.kv_lora_rank));
            (h + 1) * (rq + heads * qk)
                + (rq + 1) * heads * qk
                + (h + 1) * (rkv + qk)
                + (rkv + 1) * heads * (qk + u(a.v_head_dim))
                + (heads * u(a.v_head_dim) + 1) * h
        }
        None => 2 * (h + 1) * (q + kv) + (q + 1) * h + 2 * (q + kv) + u(m.n_heads),
    };
    // Llama's gate, up and down projections; GPT's fc and proj.
    let mats = if m.family == crate::model::Family::Gpt { 2 } else { 3 };
    let dense = mats * (h + 1) * (u(m.ffn_hidden) + 1);
    let experts = m.moe.as_ref().map_or(0, |e| {
        u(e.num_experts) * (3 * (h + 1) * (u(e.expert_ffn_hidden) + 1) + h + 1)
            + 3 * (h + 1) * (u(e.shared_expert_ffn_hidden) + 1)
    });
    // Four norms of two vectors each per block; the MoE blocks hold experts, the others a
    // dense MLP; a multi-token module is a block with the wider MLP and a 2h -> h projection.
    let moe_blocks = u(m.moe_layers());
    let dense_blocks = u(m.n_layers) - moe_blocks;
    let mtp = m.mtp.as_ref().map_or(0, |x| u(x.layers));
    let blocks = u(m.n_layers) + mtp;
    let mlps = dense_blocks * dense + moe_blocks * experts + mtp * (dense.max(experts) + 2 * h * h);
    let embeddings = if m.tie_embeddings { 1 } else { 2 } * u(m.vocab) * h;
    let positions = m.position_table().map_or(0, u) * h + 8 * h;
    let field = [
        (blocks * attention, if m.mla.is_some() { "model.mla.kv_lora_rank" } else { "model.n_heads" }),
        (dense_blocks * dense, "model.ffn_hidden"),
        (moe_blocks * experts, "model.moe.num_experts"),
        (embeddings, "model.vocab"),
        (positions, "model.max_seq_len"),
    ]
    .into_iter()
    .max_by_key(|(p, _)| *p)
    .map_or("model.hidden", |(_, f)| f);
    (blocks * (attention + 16 * h) + mlps + embeddings + positions, field)
}

/// Refuses a model over [`MAX_PARAMS`], naming the field whose size adds the most.
pub(super) fn check_params(v: &V, m: &ModelConfig) -> Result<(), ScenarioError> {
    let (bound, field) = param_bound(m);
    if bound > MAX_PARAMS {
        return Err(v.err(
            field,
            format!(
                "the model would hold up to {:.3e} parameters over {} blocks (an upper bound from its sizes, within 1.2x of the count), this field's size adding the most: over the 2^50 ({:.3e}) parameters stepsim counts (published models hold under 1e13); reduce it",
                bound as f64,
                m.n_layers,
                MAX_PARAMS as f64
            ),
        ));
    }
    Ok(())
}

/// Refuses a job whose largest tensor would exceed [`MAX_TENSOR_BYTES`]: the logits, the
/// attention scores (math (materialised) attention), and an inference job's whole KV cache at `context`
/// tokens (bounded by the same figure times 16).
pub(super) fn check_tensors(v: &V, m: &ModelConfig, w: &Workload, context: Option<u64>) -> Result<(), ScenarioError> {
    let (b, s) = (u128::from(w.micro_batch), u128::from(w.seq_len));
    let tokens = b * s;
    if tokens > u128::from(MAX_TOKENS) {
        return Err(v.err(
            "training.micro_batch",
            format!("micro_batch x seq_len = {tokens} tokens per micro-batch; at most {MAX_TOKENS}"),
        ));
    }
    let too_big = |bytes: u128| bytes > MAX_TENSOR_BYTES;
    let logits = tokens * u128::from(m.vocab) * 4;
    if too_big(logits) {
        return Err(v.err(
            "model.vocab",
            format!("the FP32 logits of one micro-batch would be {logits} bytes (micro_batch x seq_len x vocab x 4), over the {MAX_TENSOR_BYTES} bytes stepsim counts"),
        ));
    }
    if let Some(moe) = &m.moe {
        // The routed copies of a micro-batch's tokens, through the widest expert layer; an
        // expert-tensor-parallel group wider than the tensor-parallel one gathers the copies
        // of expert_tensor / tensor micro-batches.
        let gathered = u128::from((w.split.expert_tensor / w.split.tensor.max(1)).max(1));
        let copies = tokens * gathered * u128::from(moe.top_k) * u128::from(m.hidden.max(moe.expert_ffn_hidden)) * 4;
        if too_big(copies) {
            return Err(v.err(
                "model.moe.top_k",
                format!(
                    "the routed token copies of one micro-batch would be {copies} bytes (micro_batch x seq_len x top_k x width x 4{}), over the {MAX_TENSOR_BYTES} bytes stepsim counts",
                    if gathered > 1 { format!(" x {gathered} micro-batches gathered by expert tensor parallelism") } else { String::new() }
                ),
            ));
        }
    }
    if w.attention.materialised() {
        let scores = b * u128::from(m.n_heads) * s * s * 4;
        if too_big(scores) {
            return Err(v.err(
                "training.seq_len",
                format!("math (materialised) attention's scores of one micro-batch would be {scores} bytes (micro_batch x n_heads x seq_len^2 x 4), over the {MAX_TENSOR_BYTES} bytes stepsim counts; use training.attention = \"flash\" or a shorter sequence"),
            ));
        }
    }
    if let Some(ctx) = context {
        let kv = b * u128::from(ctx) * u128::from(m.n_layers) * u128::from(m.hidden.max(m.kv_dim())) * 2 * 4;
        if kv > 16 * MAX_TENSOR_BYTES {
            return Err(v.err(
                "inference.batch",
                format!("the KV cache would be about {kv} bytes (batch x context x layers x hidden x 2 x 4), over the {} bytes stepsim counts", 16 * MAX_TENSOR_BYTES),
            ));
        }
    }
    Ok(())
}

/// The ranks a job simulates one by one, for [`estimated_tasks`]: every data-parallel rank
/// under `[jitter]` (`jitter_dp`); under uneven MoE routing every expert-parallel rank plus
/// the routing report's uniform job (ep + 1; its rerun with unbounded memory, only for a job
/// that runs out, is not counted); else one.
pub fn simulated_ranks(jitter_dp: Option<u64>, ep: u64, uneven_routing: bool) -> u64 {
    match (jitter_dp, uneven_routing) {
        (Some(dp), _) => dp,
        (None, true) => ep + 1,
        (None, false) => 1,
    }
}

/// [`MAX_TASKS`]' estimate of a job's tasks.
pub fn estimated_tasks(n_layers: u64, steps: u64, grad_accum: u64, ranks: u64) -> u128 {
    u128::from(ranks) * u128::from(steps) * u128::from(grad_accum) * 3 * (16 * u128::from(n_layers) + 16)
}

/// Refuses a simulation larger than [`MAX_TASKS`], saying what to reduce.
pub(super) fn check_size(v: &V, n_layers: u64, steps: u64, grad_accum: u64, ranks: u64) -> Result<(), ScenarioError> {
    let est = estimated_tasks(n_layers, steps, grad_accum, ranks);
    if est > u128::from(MAX_TASKS) {
        return Err(v.err(
            "training.grad_accum",
            format!(
                "this job would simulate about {est} tasks (ranks simulated {ranks} x steps {steps} x grad_accum {grad_accum} x 3 x (16 x {n_layers} layers + 16)), over the {MAX_TASKS} stepsim simulates in one run; reduce training.steps (2 shows the steady state), training.grad_accum, model.n_layers or the ranks [jitter] simulates"
            ),
        ));
    }
    Ok(())
}

/// A full report (`stepsim run`, `explain`, the Python package's `simulate`) names every
/// task and keeps every memory sample: a job too large for it is refused (`stepsim sweep`
/// runs it on the lean path).
pub fn full_report_fits(path: &std::path::Path, s: &super::Scenario) -> Result<(), ScenarioError> {
    let est = s.estimated_tasks();
    if est > MAX_REPORT_TASKS {
        return Err(ScenarioError::new(
            path,
            "training.grad_accum",
            format!(
                "this job would simulate about {est} tasks, over the {MAX_REPORT_TASKS} a full report holds (every task named, every memory sample kept: about 2.5 kB each); reduce training.steps (2 shows the steady state) or training.grad_accum, or run it as a one-configuration sweep (`stepsim sweep`, lean path, up to {MAX_TASKS} tasks)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf::{parse, ZOO};

    /// The bound is above the closed-form count of every zoo model (dense, MoE, latent
    /// attention, GPT and Llama families, with and without a multi-token module) and within
    /// 1.2x of it, so that it refuses only what no GPU count could train.
    #[test]
    fn the_parameter_bound_is_above_every_zoo_models_count_and_close_to_it() {
        for z in ZOO {
            let mut m = parse(z.config).unwrap().model_config(4096);
            for mtp in [None, Some(crate::model::MtpConfig { layers: 2, loss_scale: 0.1 })] {
                m.mtp = mtp;
                let (bound, _) = param_bound(&m);
                let count = u128::from(m.param_count());
                assert!(bound >= count && bound * 10 <= count * 12, "{}: bound {bound}, count {count}", z.name);
            }
        }
    }

    /// A config.json's counts are bounded by the largest of these limits, so that the
    /// scenario's tighter bounds, not the reader's, name each size's field.
    #[test]
    fn a_config_json_count_is_bounded_by_the_largest_size_limit() {
        let largest = [MAX_LAYERS, MAX_HIDDEN, MAX_HEADS, MAX_FFN, MAX_VOCAB, MAX_SEQ].into_iter().max();
        assert_eq!(Some(crate::model::hf::MAX_COUNT), largest);
    }
}
