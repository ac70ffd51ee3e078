//! The report of a job of several rank classes ([`crate::job`]): every class gets a row (its
//! own peak, model state and verdict; a pipeline stage's layers), the headline is one class
//! by one rule ([`headline`]), and the step time spans every class.

use serde::Serialize;

use super::{fmt_bytes, throughput_of, Bytes, Report, StepTiming, Verdict};
use crate::engine::Trace;
use crate::job::{run::JobRun, Job, RankClass, Role};
use crate::model::LayerDag;
use crate::plan::Plan;
use crate::scenario::Scenario;

/// One pipeline stage in the report (of a rank class that is a stage, or one rank of it).
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
            let blocks = match c.end_block - c.first_block {
                0 => String::new(),
                1 => format!("{}", c.first_block),
                _ => format!("{}-{}", c.first_block, c.end_block - 1),
            };
            let mtp = match c.mtp {
                0 => String::new(),
                d => format!("{d} MTP module{}", if d == 1 { "" } else { "s" }),
            };
            match (blocks.is_empty(), mtp.is_empty()) {
                (_, true) => blocks,
                (true, false) => mtp,
                (false, false) => format!("{blocks} + {mtp}"),
            }
        })
        .filter(|x| !x.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

/// What the per-class table and the headline rule read of each class: its verdict, its
/// peaks, its model state, when its last task ended.
#[derive(Debug, Clone, Copy)]
pub struct ClassFigures {
    pub oom: bool,
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
    pub model_state: Bytes,
    /// End of the class's last task, ns.
    pub end_ns: u64,
}

impl ClassFigures {
    /// A class's figures from its trace alone: the verdict and peaks [`super::memory_side`]
    /// reports, without the phase peaks and the largest live tensors it also gathers.
    pub fn of(c: &crate::job::RankClass, trace: &Trace) -> ClassFigures {
        let (allocated, reserved) = trace.timeline.peak_bytes().unwrap_or_default();
        ClassFigures {
            oom: trace.oom.is_some(),
            peak_allocated: Bytes::new(allocated),
            peak_reserved: Bytes::new(reserved),
            model_state: Bytes::new(c.plan.model_state().total()),
            end_ns: last_end(trace),
        }
    }

    fn of_report(r: &Report, trace: &Trace) -> ClassFigures {
        let peak = r.peak.as_ref();
        ClassFigures {
            oom: matches!(r.verdict, Verdict::Oom(_)),
            peak_allocated: peak.map_or(Bytes::new(0), |p| p.allocated),
            peak_reserved: peak.map_or(Bytes::new(0), |p| p.reserved),
            model_state: r.model_state_per_gpu.total,
            end_ns: last_end(trace),
        }
    }
}

/// End of a class's last task that ran, ns.
fn last_end(trace: &Trace) -> u64 {
    trace.end_ns.iter().filter(|&&e| e != u64::MAX).max().copied().unwrap_or(0)
}

/// The class the headline is about, by one rule for every job: the one that ran out of
/// memory (the run stops at the first OOM, so there is at most one), else the highest peak
/// (reserved, what must fit; the first of equals). The step time is not a class's: it spans
/// every class, so the class that finishes last sets it.
pub fn headline(classes: &[ClassFigures]) -> usize {
    if let Some(i) = classes.iter().position(|c| c.oom) {
        return i;
    }
    let peak = |c: &ClassFigures| c.peak_reserved.bytes.max(c.peak_allocated.bytes);
    let mut best = 0;
    for (i, c) in classes.iter().enumerate() {
        if peak(c) > peak(&classes[best]) {
            best = i;
        }
    }
    best
}

/// A job's report: the headline's, with every class in its table; each class's own report
/// too when asked for (the outputs draw and chart them).
#[derive(Debug, Clone)]
pub struct JobReport {
    pub report: Report,
    pub headline: usize,
    /// Every class's own report (empty unless asked for).
    pub classes: Vec<Report>,
}

/// Reports a job's run. A job of one class is reported as its class; with several, every
/// class gets a row of the table, the headline is [`headline`]'s, and the step time spans
/// every class.
pub fn build(s: &Scenario, dag: &LayerDag, job: &Job, run: &JobRun, per_class: bool) -> JobReport {
    let one = |k: usize| {
        let c = &job.classes[k];
        super::build(s, dag, &c.plan, &c.schedule, &run.traces[k])
    };
    let n = job.classes.len();
    if n == 1 {
        let report = one(0);
        let classes = if per_class { vec![report.clone()] } else { Vec::new() };
        return JobReport { report, headline: 0, classes };
    }
    let classes: Vec<Report> = if per_class { (0..n).map(one).collect() } else { Vec::new() };
    let figures: Vec<ClassFigures> = (0..n)
        .map(|k| match classes.get(k) {
            Some(r) => ClassFigures::of_report(r, &run.traces[k]),
            None => ClassFigures::of(&job.classes[k], &run.traces[k]),
        })
        .collect();
    let h = headline(&figures);
    let mut report = classes.get(h).cloned().unwrap_or_else(|| one(h));
    finish(&mut report, s, job, &figures, &run.spans, h);
    report.headline_class = h;
    // Offload: every class's host share must fit, not only the headline's.
    let node = u64::from(s.cluster.gpus_per_node);
    report.offload_fits = job.classes.iter().all(|c| c.plan.offload_fits(node) == (true, true));
    JobReport { report, headline: h, classes }
}

/// One row of the per-class table.
fn class_row(c: &RankClass, f: &ClassFigures, any_oom: bool) -> super::RankClass {
    let verdict = match (f.oom, any_oom, c.role) {
        (true, _, _) => "OOM".to_string(),
        (false, true, Role::Stage { .. }) => "not reached (another stage ran out of memory first)".to_string(),
        (false, true, _) => "not reached (another rank ran out of memory first)".to_string(),
        (false, false, _) => "fits".to_string(),
    };
    let plan = &c.plan;
    let stage = match c.role {
        Role::Stage { stage } | Role::Rank { stage: Some(stage), .. } | Role::Expert { stage: Some(stage), .. } => {
            Some(StageSummary {
                stage,
                layers: layers_of(plan),
                embedding: plan.chunks.iter().any(|c| c.embed),
                head: plan.chunks.iter().any(|c| c.head),
                model_state: f.model_state,
                peak_allocated: f.peak_allocated,
                peak_reserved: f.peak_reserved,
                verdict: verdict.clone(),
            })
        }
        _ => None,
    };
    let peaks =
        format!("peak allocated {}, reserved {}", fmt_bytes(f.peak_allocated.bytes), fmt_bytes(f.peak_reserved.bytes));
    let holds = |st: &StageSummary| {
        let mut parts = Vec::new();
        if !st.layers.is_empty() {
            parts.push(format!("layers {}", st.layers));
        }
        if st.embedding {
            parts.push("embedding".to_string());
        }
        if st.head {
            parts.push("LM head and loss".to_string());
        }
        parts.join(" + ")
    };
    let (note, rank) = match (c.role, &stage) {
        (Role::Stage { stage: k }, Some(st)) => {
            (format!("pipeline stage {k}: {}; {peaks}; {verdict}", holds(st)), None)
        }
        (Role::Rank { rank, .. }, st) => {
            let of_stage =
                st.as_ref().map_or(String::new(), |st| format!(" of pipeline stage {} ({})", st.stage, holds(st)));
            let end = if f.oom { String::new() } else { format!("; last task ends at {:.3} s", f.end_ns as f64 / 1e9) };
            (
                format!(
                    "data-parallel rank {rank}{of_stage}, its own compute draws ([jitter]): {peaks}{end}; {verdict}"
                ),
                Some(rank),
            )
        }
        (Role::Expert { ep_rank, copies, uniform, .. }, st) => {
            let of_stage =
                st.as_ref().map_or(String::new(), |st| format!(" of pipeline stage {} ({})", st.stage, holds(st)));
            let end = if f.oom { String::new() } else { format!("; last task ends at {:.3} s", f.end_ns as f64 / 1e9) };
            (
                format!(
                    "expert-parallel rank {ep_rank}{of_stage}: its experts receive {copies} token copies per micro-batch and MoE block ({:.2}x the uniform {uniform}); {peaks}{end}; {verdict}",
                    copies as f64 / uniform.max(1) as f64
                ),
                None,
            )
        }
        _ => (format!("identical programs: {peaks}; {verdict}"), None),
    };
    let expert_rank = match c.role {
        Role::Expert { ep_rank, .. } => Some(ep_rank),
        _ => None,
    };
    super::RankClass { ranks: c.ranks(), count: c.count, note, stage, rank, expert_rank }
}

/// Step `k`'s span (0-based) over every class's tasks, from [`JobRun::spans`]: the training
/// loop's period, from the end of the step before on every class (a class that finished
/// early may start the next step's work before the last one ends); the first step from its
/// first task.
pub fn job_step_span(spans: &[(u64, u64)], k: usize) -> Option<(u64, u64)> {
    let &(first, end) = spans.get(k)?;
    let start = k.checked_sub(1).and_then(|j| spans.get(j)).map_or(first, |&(_, prev_end)| prev_end);
    Some((start, end))
}

/// Turns the headline class's report into the job's: a row per class, the step time from
/// the end of the step before (the first step: its first task) on any class to the last
/// task of the step on any class, and throughput from it.
fn finish(r: &mut Report, s: &Scenario, job: &Job, figures: &[ClassFigures], spans: &[(u64, u64)], h: usize) {
    let oom = figures.iter().any(|f| f.oom);
    r.rank_classes = job.classes.iter().zip(figures).map(|(c, f)| class_row(c, f, oom)).collect();
    if oom {
        r.steps.clear();
        r.throughput = None;
        return;
    }
    let mut steps: Vec<StepTiming> = Vec::new();
    for st in &r.steps {
        let Some((a, b)) = job_step_span(spans, st.step as usize - 1) else { continue };
        let dur = b.saturating_sub(a) as f64 / 1e9;
        let mut t = st.clone();
        t.start_s = a as f64 / 1e9;
        t.time_s = dur;
        t.compute_idle_s = (dur - t.compute_busy_s).max(0.0);
        t.idle_s = (dur - t.compute_busy_s - t.exposed_comm_s - t.exposed_host_s).max(0.0);
        steps.push(t);
    }
    let plan = &job.classes[0].plan;
    let model_flops = job.classes[h].schedule.model_flops_per_step;
    let hw_flops =
        job.classes.iter().fold(0.0, |hw, c| hw + c.schedule.hardware_flops_per_step) / job.classes.len() as f64;
    r.throughput = steps.last().map(|st| {
        let mut tp = throughput_of(s, plan, model_flops, hw_flops, st, &steps);
        if plan.pipeline() > 1 {
            let schedule = plan.parallel.model_parallel.schedule;
            tp.assumptions.push(format!(
                "pipeline: {} stages, schedule {}, {} micro-batches per step{}; the bubble is the compute stream's idle time ({}, p2p transfers at {})",
                plan.pipeline(),
                schedule.name(),
                plan.training.grad_accum,
                match schedule {
                    crate::plan::PipelineSchedule::DualPipe => ", half entering at each end",
                    crate::plan::PipelineSchedule::DualPipeV => ", each down the ranks and back up",
                    _ => "",
                },
                match schedule {
                    crate::plan::PipelineSchedule::DualPipe => "DualPipe's order of forwards, backwards, overlapped forward-backward pairs and deferred weight-gradient passes, deepseek-ai/DualPipe dualpipe.py",
                    crate::plan::PipelineSchedule::DualPipeV => "DualPipeV's order of forwards, backwards, overlapped forward-backward pairs and deferred weight-gradient passes, deepseek-ai/DualPipe dualpipev.py",
                    _ => "Megatron-LM order of forwards and backwards",
                },
                if plan.parallel.model_parallel.tensor * plan.dp >= plan.gpus_per_node { "each GPU's NIC rail share" } else { "NVLink" }
            ));
        }
        tp
    });
    r.steps = steps;
}
