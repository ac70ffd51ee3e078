//! `stepsim explain`: why a run OOMs (or nearly does), in the user's terms, and which single
//! change makes it fit at what cost in speed.
//!
//! The answer follows the OOM checklist: write the configuration down; find the failing
//! phase (init -> weights and initialisation, forward -> activations and input size,
//! backward -> gradients, activation peak, gathered parameters, optimizer step -> first
//! creation of optimizer state); look at what was live and why each part was there; change
//! one thing and re-measure both memory and speed. Every counterfactual is a full
//! re-simulation, run in parallel with rayon.

pub mod counterfactual;
pub mod live;

use serde::Serialize;

use crate::report::{fmt_bytes, Bytes, Verdict};
use crate::scenario::Scenario;
use crate::schedule::Phase;
use crate::Simulation;

pub use counterfactual::{Counterfactual, COUNTERFACTUAL_NAMES};
pub use live::LiveLine;

/// By default a run that fits but peaks within 5% of capacity is explained too.
pub const DEFAULT_MARGIN: f64 = 0.05;

/// About how many times `explain` simulates a job: the job itself, each single change, and
/// each GPU count it tries. Its size bound is the job's tasks times this. The changes that
/// grow the job, a context-parallel ring (grad_accum multiplied by the ring) and more GPUs
/// under `[jitter]` (every data-parallel rank simulated), hold their own bound: the variants
/// each tries stay within `MAX_TASKS` together (`counterfactual`'s `budgeted`).
pub const SIMULATIONS: u64 = 16;

/// Whether `explain` takes this scenario: training and LoRA fine-tuning jobs (not inference) that a
/// full report holds and whose [`SIMULATIONS`] runs together stay within the lean path's
/// bound. The error names `path`.
pub fn accepts(path: &std::path::Path, s: &Scenario) -> Result<(), crate::scenario::ScenarioError> {
    use crate::scenario::limits::{full_report_fits, MAX_TASKS};
    use crate::scenario::ScenarioError;
    if s.inference.is_some() {
        return Err(ScenarioError::new(path, "", "explain covers training steps; for an inference job, `stepsim run` reports what was live at an OOM and the largest batch and context that fit"));
    }
    full_report_fits(path, s)?;
    let total = s.estimated_tasks().saturating_mul(SIMULATIONS);
    if total > MAX_TASKS {
        return Err(ScenarioError::new(
            path,
            "training.grad_accum",
            format!(
                "explain simulates this job about {SIMULATIONS} times (each change, each GPU count), about {total} tasks in all, over {MAX_TASKS}; reduce training.steps (2 shows the steady state), training.grad_accum or model.n_layers, or `stepsim run` it"
            ),
        ));
    }
    Ok(())
}

/// The structured explanation (also carried in report.json).
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// "oom", "near_capacity" or "fits".
    pub status: &'static str,
    pub summary: String,
    pub step: u32,
    pub phase: Phase,
    /// What that phase's OOMs are usually about.
    pub phase_meaning: &'static str,
    pub layer: Option<u64>,
    pub op: String,
    pub requested: Option<Bytes>,
    pub time_s: f64,
    /// What was live at the instant, largest first, each with its reason.
    pub live: Vec<LiveLine>,
    pub live_total: Bytes,
    pub capacity: Bytes,
    /// The naive per-GPU average of model state (total state / GPUs) and what it leaves out.
    pub naive_average: Bytes,
    pub naive_leaves_out: Vec<String>,
    pub naive_note: String,
    /// Model state live beyond its naive share, by category, and why (empty when the live
    /// state is within half again of it).
    pub naive_beyond: Vec<String>,
    /// Whether `torch.cuda.empty_cache()` would help, and why.
    pub empty_cache: String,
    pub counterfactuals: Vec<Counterfactual>,
    /// The first line of the answer: the cheapest change that fits, if any.
    pub answer: String,
}

/// Each model-state category this GPU holds at rest ([`crate::report::ModelStateReport`]) at
/// more than half again its share of the naive average (the precision policy's bytes per
/// parameter of that category over the GPU count), with what the layout does that the
/// spreadsheet figure ignores: the sharding mode leaves it whole on every GPU, or only model
/// parallelism divides it. "Divide by the GPUs" is the first figure a planner checks; this
/// says where it breaks. The bytes live at the instant are given beside it where they differ
/// (an OOM while the state is still being created).
fn beyond_naive(s: &Scenario, sim: &Simulation, live: &[LiveLine], naive: u64) -> Vec<String> {
    let plan = &sim.job.classes[sim.headline].plan;
    let ms = &sim.report.model_state_per_gpu;
    if sim.dag.lora.is_some() || naive == 0 || ms.bytes_per_param <= 0.0 {
        return Vec::new();
    }
    let [param, grad, master, state] =
        plan.training.precision.bytes_per_param_by_part(plan.training.states_per_param());
    let by_category = [
        ("parameters", param, ms.parameters.bytes),
        ("gradients", grad, ms.gradients.bytes),
        ("master_weights", master, ms.master_weights.bytes),
        ("optimizer_state", state, ms.optimizer_state.bytes),
    ];
    let gpus = plan.gpus.max(1);
    let dp = plan.dp.max(1);
    let model_parallel = gpus / dp;
    let sharding = s.parallel.sharding_display();
    let ep = plan.parallel.model_parallel.expert;
    let mut out = Vec::new();
    for (key, bytes_per_param, at_rest) in by_category {
        let share = naive as f64 * bytes_per_param as f64 / ms.bytes_per_param;
        if share <= 0.0 || (at_rest as f64) <= 1.5 * share {
            continue;
        }
        let times = at_rest as f64 / share;
        let why = if (times / gpus as f64 - 1.0).abs() < 0.1 {
            format!("a whole copy on every GPU under {sharding}")
        } else if dp > 1 && model_parallel > 1 && (times / dp as f64 - 1.0).abs() < 0.15 {
            format!(
                "divided only by the {model_parallel} model-parallel ranks: each of the {dp} data-parallel replicas holds it whole under {sharding}"
            )
        } else if ep > 1 {
            let dense = if model_parallel > 1 {
                format!("divided only by the {model_parallel} model-parallel ranks")
            } else {
                "whole".to_string()
            };
            format!(
                "the experts are divided over the {ep} expert-parallel ranks, the dense layers {dense} on each of the {dp} data-parallel replicas, under {sharding}"
            )
        } else {
            format!("under {sharding}, over {dp} data-parallel replicas of {model_parallel} model-parallel ranks each")
        };
        let live_now: u64 = live.iter().filter(|l| l.category == key).map(|l| l.size.bytes).sum();
        let now = if live_now == at_rest {
            String::new()
        } else {
            format!(" ({} of it live at this instant)", fmt_bytes(live_now))
        };
        out.push(format!(
            "{} {} per GPU at rest{now}, {times:.1}x their naive share of {}: {why}",
            key.replace('_', " "),
            fmt_bytes(at_rest),
            fmt_bytes(share.round() as u64)
        ));
    }
    out
}

pub fn phase_meaning(p: Phase) -> &'static str {
    match p {
        Phase::Init => "while loading weights and creating persistent state: the parameters (and master copy / optimizer state where the framework creates them at init) do not fit",
        Phase::Forward => "in the forward pass: saved activations grow with micro-batch x sequence length on top of the model state and the gathered layers",
        Phase::Backward => "in backward: all saved activations are live when it starts, and gradients, the gathered (and prefetched) layers and loss/activation gradients stack on top",
        Phase::Optimizer => "at optimizer.step(): Adam's moments are created at the first step (PyTorch allocates optimizer state lazily), plus the step's temporaries",
        Phase::Prefill => "in prefill: the prompt's activations (batch x prompt tokens, freed layer by layer) on top of the weights and the KV cache",
        Phase::Decode => "in decode: the KV cache grows by one token per sequence per step on top of the weights",
    }
}

/// Explains a finished simulation; `margin` is the fraction of capacity that counts as
/// "near". Counterfactuals are simulated in parallel.
pub fn explain(s: &Scenario, sim: &Simulation, margin: f64) -> Explanation {
    let r = &sim.report;
    let cap = r.capacity.bytes;
    // The instant to explain: the failing allocation, or the peak of a run that fits.
    let (status, at, requested, bufs) = match &r.verdict {
        Verdict::Oom(o) => (
            "oom",
            Some(o.at.clone()),
            Some(o.requested),
            sim.trace().oom.as_ref().map_or(Vec::new(), |x| x.live.clone()),
        ),
        Verdict::Fits { .. } => {
            let pk = r.peak.as_ref();
            let near = pk.is_some_and(|p| p.allocated.bytes as f64 >= cap as f64 * (1.0 - margin));
            let idx = sim.trace().timeline.peak_index.unwrap_or(0);
            (
                if near { "near_capacity" } else { "fits" },
                pk.map(|p| p.at.clone()),
                None,
                live::live_at_sample(sim, idx),
            )
        }
    };
    let step = at.as_ref().map_or(0, |a| a.step);
    let phase = at.as_ref().map_or(Phase::Init, |a| a.phase);
    let layer = at.as_ref().and_then(|a| a.layer);
    let op = at.as_ref().map_or(String::new(), |a| a.op.clone());
    let time_s = at.as_ref().map_or(0.0, |a| a.time_s);
    let live = live::from_buffers(s, sim, &bufs, layer, phase);
    let mut live = live;
    let empty_cache = empty_cache_advice(s, r);
    // The allocator's share at that instant, split as `run` reports it: reserved but
    // unallocated (`memory_reserved() - memory_allocated()`, PyTorch's figure), and the
    // rounding inside allocated blocks (sizes rounded up, tails not split off).
    if let Some(d) = &r.allocator.oom {
        let st = &d.state;
        let unallocated = st.reserved.bytes.saturating_sub(st.allocated.bytes);
        let rounding = st.allocated.bytes.saturating_sub(st.live.bytes);
        if unallocated > 0 {
            live.push(LiveLine {
                category: "allocator",
                label: "allocator: reserved but unallocated",
                size: Bytes::new(unallocated),
                reason: format!(
                    "allocator: reserved but unallocated (cached free blocks and split remainders; largest free block {})",
                    fmt_bytes(st.largest_free_block.bytes)
                ),
            });
        }
        if rounding > 0 {
            live.push(LiveLine {
                category: "allocator",
                label: "allocator: rounding in allocated blocks",
                size: Bytes::new(rounding),
                reason: "allocator: rounding in allocated blocks (sizes rounded up to 512 B, block tails too small to split off)".into(),
            });
        }
        live.sort_by(|a, b| b.size.bytes.cmp(&a.size.bytes).then(a.category.cmp(b.category)));
    }
    let live_total: u64 = live.iter().map(|l| l.size.bytes).sum();
    let naive = r.model_state_per_gpu.naive_average;
    let state_keys = ["parameters", "master_weights", "gradients", "optimizer_state"];
    // (the allocator's own line is not model state either)
    let naive_leaves_out: Vec<String> = live
        .iter()
        .filter(|l| !state_keys.contains(&l.category) && l.size.bytes > 0)
        .map(|l| format!("{} ({})", l.reason, fmt_bytes(l.size.bytes)))
        .collect();
    let live_state: u64 = live.iter().filter(|l| state_keys.contains(&l.category)).map(|l| l.size.bytes).sum();
    let naive_note = if live_state < naive.bytes {
        format!(
            "the naive average ({}) counts model state that does not exist yet at this instant (only {} of it is live): {}",
            fmt_bytes(naive.bytes),
            fmt_bytes(live_state),
            "gradients exist only from backward until zero_grad(set_to_none=True), and PyTorch creates Adam's moments at the first optimizer.step()"
        )
    } else if live_state as f64 >= 1.5 * naive.bytes as f64 {
        format!(
            "{} of model state is live here, {:.1}x the naive average",
            fmt_bytes(live_state),
            live_state as f64 / naive.bytes.max(1) as f64
        )
    } else {
        format!("all {} of the naive average is live here", fmt_bytes(naive.bytes))
    };

    let naive_beyond = beyond_naive(s, sim, &live, naive.bytes);

    let counterfactuals = if status == "fits" { Vec::new() } else { counterfactual::run_all(s, sim) };
    let answer = counterfactual::answer(&counterfactuals, status);
    let where_ = layer.map(|l| format!(", layer {l}")).unwrap_or_default();
    let summary = match status {
        "oom" => {
            let cached: u64 = live.iter().filter(|l| l.category == "allocator").map(|l| l.size.bytes).sum();
            let unallocated = r.allocator.oom.as_ref().map_or(0, |d| d.state.reserved.bytes.saturating_sub(d.state.allocated.bytes));
            let rounding = cached.saturating_sub(unallocated);
            format!(
                "OOM in {}{}, op `{}`: {} in live tensors{}{} of {} capacity, {} more requested",
                if step == 0 { "initialisation".to_string() } else { format!("step {step}, {}", phase.name()) },
                where_,
                op,
                fmt_bytes(live_total - cached),
                if rounding > 0 { format!(" + {} of rounding in allocated blocks", fmt_bytes(rounding)) } else { String::new() },
                if unallocated > 0 { format!(" + {} reserved but unallocated", fmt_bytes(unallocated)) } else { String::new() },
                fmt_bytes(cap),
                requested.map_or(String::new(), |b| fmt_bytes(b.bytes))
            )
        }
        "near_capacity" => format!(
            "fits, but the peak ({}) in step {step}, {}{where_} is within {:.0}% of the {} capacity",
            fmt_bytes(live_total),
            phase.name(),
            margin * 100.0,
            fmt_bytes(cap)
        ),
        _ => match &r.verdict {
            // The same headroom `run` prints: capacity less what the allocator reserved.
            crate::report::Verdict::Fits { headroom } => format!(
                "fits with {} of headroom at the peak (capacity less max_memory_reserved, as `run` reports; {} counting live tensors only)",
                fmt_bytes(headroom.bytes),
                fmt_bytes(cap.saturating_sub(live_total))
            ),
            crate::report::Verdict::Oom(_) => format!("fits with {} to spare at the peak", fmt_bytes(cap.saturating_sub(live_total))),
        },
    };
    Explanation {
        status,
        summary,
        step,
        phase,
        phase_meaning: phase_meaning(phase),
        layer,
        op,
        requested,
        time_s,
        live,
        live_total: Bytes::new(live_total),
        capacity: Bytes::new(cap),
        naive_average: naive,
        naive_leaves_out,
        naive_note,
        naive_beyond,
        empty_cache,
        counterfactuals,
        answer,
    }
}

/// The plain-language report.
pub fn render(e: &Explanation, s: &Scenario) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let c = &s.cluster;
    let t = &s.training;
    let p = &s.parallel;
    let _ = writeln!(o, "stepsim explain - {}", s.name);
    let _ = writeln!(
        o,
        "Configuration: {} {} layers x hidden {} ({} parameters) on {} x {} ({}), {}, micro-batch {} x seq {} x grad_accum {}, precision {}, checkpointing {}",
        format!("{:?}", s.model.family).to_lowercase(),
        s.model.n_layers,
        s.model.hidden,
        s.model.param_count(),
        c.gpus,
        c.gpu.name,
        fmt_bytes(c.capacity_bytes()),
        p.sharding_display(),
        t.micro_batch,
        t.seq_len,
        t.grad_accum,
        t.precision.preset,
        t.checkpointing.name()
    );
    let _ = writeln!(o, "\n{}", e.summary);
    if e.status != "fits" {
        let _ = writeln!(o, "That is {}.", e.phase_meaning);
    }
    let _ = writeln!(o, "\nWhat was live at that instant (largest first):");
    for l in &e.live {
        let _ = writeln!(o, "  {:>24}  {}", fmt_bytes(l.size.bytes), l.reason);
    }
    let _ = writeln!(o, "  {:>24}  total held", fmt_bytes(e.live_total.bytes));
    let _ =
        writeln!(o, "\nThe naive per-GPU average (total model state / GPUs) is {}.", fmt_bytes(e.naive_average.bytes));
    let _ = writeln!(o, "  {}.", e.naive_note);
    if !e.naive_beyond.is_empty() {
        let _ = writeln!(o, "  The layout does not divide all of it by the {} GPUs:", s.cluster.gpus);
        for x in &e.naive_beyond {
            let _ = writeln!(o, "    - {x}");
        }
    }
    if !e.naive_leaves_out.is_empty() {
        let _ = writeln!(o, "  It leaves out:");
        for x in &e.naive_leaves_out {
            let _ = writeln!(o, "    - {x}");
        }
    }
    let _ = writeln!(o, "\nWould torch.cuda.empty_cache() help? {}.", e.empty_cache);
    if !e.counterfactuals.is_empty() {
        let _ = writeln!(o, "\nSingle changes, each re-simulated:");
        let _ = writeln!(
            o,
            "  {:<44} {:>5} {:>26}  {:<9} {:>11} {:>13}",
            "change", "fits", "peak", "peak in", "step time", "tokens/s/GPU"
        );
        let mut pairs_started = false;
        for cf in &e.counterfactuals {
            if !pairs_started && cf.is_pair() {
                pairs_started = true;
                let lead = if e.counterfactuals.iter().any(|c| c.fits == Some(true) && !c.changes_problem) {
                    "No single change that keeps the training problem fits on the same GPUs"
                } else {
                    "No single change that keeps the training problem fits"
                };
                let _ = writeln!(o, "  {lead}; full checkpointing with each other change:");
            }
            let fits = match cf.fits {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            };
            let peak = cf.peak.map_or("-".to_string(), |b| fmt_bytes(b.bytes));
            let st = cf.step_time_s.map_or("-".to_string(), |x| format!("{x:.3} s"));
            let tps = cf.tokens_per_s_change.map_or("-".to_string(), |x| format!("{:+.1}%", x * 100.0));
            let at = cf.peak_phase.map_or("-", |p| p.name());
            // A label wider than its column has a line of its own, so the figures stay in
            // their columns.
            let label = if cf.change.chars().count() > 44 {
                let _ = writeln!(o, "  {}", cf.change);
                ""
            } else {
                cf.change.as_str()
            };
            let _ = writeln!(o, "  {label:<44} {fits:>5} {peak:>26}  {at:<9} {st:>11} {tps:>13}");
            if let Some(n) = &cf.note {
                let _ = writeln!(o, "      {n}");
            }
        }
        let _ = writeln!(o, "  (peak and time of a change that does not fit: as if memory were unbounded; peak in: the phase of the peak; tokens/s per GPU against the original, timed the same way)");
    }
    let _ = writeln!(o, "\nAnswer: {}", e.answer);
    o
}

/// Would `torch.cuda.empty_cache()` help? Only cached (reserved, unallocated) memory can be
/// returned, and PyTorch already returns it and retries before raising an OOM.
fn empty_cache_advice(s: &Scenario, r: &crate::report::Report) -> String {
    use crate::memory::{AllocatorKind, OomCause};
    if s.allocator.kind == AllocatorKind::Exact {
        return "no: with exact live-byte accounting ([allocator] kind = \"exact\") nothing is cached; every byte above is a live tensor".into();
    }
    match &r.allocator.oom {
        Some(d) if d.cause == OomCause::Fragmentation && d.without_fragmentation.as_ref().is_some_and(|w| !w.fits) => {
            let at = d.without_fragmentation.as_ref().and_then(|w| w.oom_at.as_ref());
            format!(
                "no: fragmentation ({} reserved but unallocated) only brings the failure forward; with perfect packing the run still runs out of memory{}, so the live tensors are the problem and empty_cache() (which frees only cached blocks, and which PyTorch already tries before failing) cannot help",
                fmt_bytes(d.state.reserved.bytes.saturating_sub(d.state.live.bytes)),
                at.map_or(String::new(), |a| format!(" at step {}, {}, `{}`", a.step, a.phase.name(), a.op))
            )
        }
        Some(d) if d.cause == OomCause::Fragmentation => format!(
            "no: this OOM is fragmentation. {} is reserved but unallocated, yet no free block or new segment can hold the {} request; PyTorch already frees its cached blocks and retries before failing ({} retries), so empty_cache() cannot avoid it. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ([allocator] expandable_segments = true), which grows segments instead of leaving holes between them",
            fmt_bytes(d.state.reserved.bytes.saturating_sub(d.state.live.bytes)),
            fmt_bytes(d.request.bytes),
            r.allocator.num_alloc_retries
        ),
        Some(_) => "no: the live tensors plus the request exceed capacity; empty_cache() returns only cached blocks and cannot free tensors in use".into(),
        None => "not needed: the run fits".into(),
    }
}
