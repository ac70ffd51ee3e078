//! The report of a pipeline-parallel run: every stage is its own rank class (its own peak,
//! model state and verdict), the headline verdict is the stage that runs out of memory (or,
//! if all fit, the one with the least headroom), and the step time spans all stages.

use serde::Serialize;

use super::{fmt_bytes, throughput_of, Bytes, RankClass, Report, StepTiming, Verdict};
use crate::plan::Plan;
use crate::scenario::Scenario;

/// One pipeline stage in the report.
#[derive(Debug, Clone, Serialize)]
pub struct StageSummary {
    pub stage: u64,
    /// Transformer blocks held, e.g. "0-11" (per chunk, comma-separated when interleaved).
    pub layers: String,
    pub embedding: bool,
    pub head: bool,
    pub model_state: Bytes,
    /// Peak `max_memory_allocated()` and `max_memory_reserved()` of the stage.
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
    /// "fits", "OOM", or "not reached" (another stage ran out of memory first).
    pub verdict: String,
}

fn layers_of(plan: &Plan) -> String {
    plan.chunks
        .iter()
        .map(|c| {
            if c.end_block > c.first_block + 1 {
                format!("{}-{}", c.first_block, c.end_block - 1)
            } else {
                format!("{}", c.first_block)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The stage the headline is about: the one that ran out of memory, else the highest peak
/// (reserved, what must fit).
pub fn primary(stages: &[&Report]) -> usize {
    if let Some(i) = stages.iter().position(|r| matches!(r.verdict, Verdict::Oom(_))) {
        return i;
    }
    let peak = |r: &Report| r.peak.as_ref().map_or(0, |p| p.reserved.bytes.max(p.allocated.bytes));
    let mut best = 0;
    for (i, r) in stages.iter().enumerate() {
        if peak(r) > peak(stages[best]) {
            best = i;
        }
    }
    best
}

/// Turns the primary stage's report into the pipeline's: rank classes per stage, the step
/// time from the first task of a step on any stage to the last, and throughput from it.
/// `spans` holds each step's (start, end) in ns across all stages; `hw_flops` is the
/// hardware FLOPs per GPU per step averaged over the stages.
pub fn finish(
    r: &mut Report,
    s: &Scenario,
    plans: &[&Plan],
    stages: &[&Report],
    spans: &[(u64, u64)],
    model_flops: f64,
    hw_flops: f64,
) {
    let oom = stages.iter().any(|x| matches!(x.verdict, Verdict::Oom(_)));
    let per = plans.first().map_or(1, |p| p.gpus / p.pipeline());
    r.rank_classes = plans
        .iter()
        .zip(stages)
        .enumerate()
        .map(|(k, (p, x))| {
            let k = k as u64;
            let verdict = match &x.verdict {
                Verdict::Oom(_) => "OOM".to_string(),
                Verdict::Fits { .. } if oom => "not reached (another stage ran out of memory first)".to_string(),
                Verdict::Fits { .. } => "fits".to_string(),
            };
            let peak = x.peak.as_ref();
            let summary = StageSummary {
                stage: k,
                layers: layers_of(p),
                embedding: p.chunks.iter().any(|c| c.embed),
                head: p.chunks.iter().any(|c| c.head),
                model_state: x.model_state_per_gpu.total,
                peak_allocated: peak.map_or(Bytes::new(0), |p| p.allocated),
                peak_reserved: peak.map_or(Bytes::new(0), |p| p.reserved),
                verdict,
            };
            let mut extra = String::new();
            if summary.embedding {
                extra.push_str(" + embedding");
            }
            if summary.head {
                extra.push_str(" + LM head and loss");
            }
            RankClass {
                ranks: format!("{}-{}", k * per, (k + 1) * per - 1),
                count: per,
                note: format!(
                    "pipeline stage {k}: layers {}{extra}; peak allocated {}, reserved {}; {}",
                    summary.layers,
                    fmt_bytes(summary.peak_allocated.bytes),
                    fmt_bytes(summary.peak_reserved.bytes),
                    summary.verdict
                ),
                stage: Some(summary),
            }
        })
        .collect();
    if oom {
        r.steps.clear();
        r.throughput = None;
        return;
    }
    let mut steps: Vec<StepTiming> = Vec::new();
    for st in &r.steps {
        let Some(&(a, b)) = spans.get(st.step as usize - 1) else { continue };
        let dur = (b - a) as f64 / 1e9;
        let mut t = st.clone();
        t.start_s = a as f64 / 1e9;
        t.time_s = dur;
        t.compute_idle_s = (dur - t.compute_busy_s).max(0.0);
        t.idle_s = (dur - t.compute_busy_s - t.exposed_comm_s).max(0.0);
        steps.push(t);
    }
    let plan = plans[0];
    r.throughput = steps.last().map(|st| {
        let mut tp = throughput_of(s, plan, model_flops, hw_flops, st, &steps);
        tp.assumptions.push(format!(
            "pipeline: {} stages, schedule {}, {} micro-batches per step; the bubble is the compute stream's idle time (Megatron-LM order of forwards and backwards, p2p transfers at {})",
            plan.pipeline(),
            plan.parallel.model_parallel.schedule.name(),
            plan.training.grad_accum,
            if plan.parallel.model_parallel.tensor * plan.dp >= plan.gpus_per_node { "each GPU's NIC rail share" } else { "NVLink" }
        ));
        tp
    });
    r.steps = steps;
}
