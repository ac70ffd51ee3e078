//! stepsim: a discrete-event simulator of one LLM training step across many GPUs.
//!
//! Data flows one way (see DESIGN.md): a [`scenario::Scenario`] is turned into a
//! [`model::LayerDag`] (petgraph), a [`plan::Plan`] says who holds which bytes,
//! [`schedule::build`] writes each distinct rank's program of tasks, [`engine::run`] plays it
//! through a [`memory::Allocator`], and [`report::build`] turns the trace into the verdict,
//! the peak and its breakdown, and throughput.
//!
//! ```no_run
//! let s = stepsim::scenario::Scenario::load("scenarios/100b-32gpu-fsdp.toml".as_ref())?;
//! let sim = stepsim::simulate(&s)?;
//! println!("{}", stepsim::report::text::render(&sim.report, &s));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod engine;
pub mod explain;
pub mod hardware;
pub mod infer;
pub mod memory;
pub mod model;
pub mod net;
pub mod plan;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod sweep;

use memory::EmptyCacheAt;

/// Everything one simulation produced.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub dag: model::LayerDag,
    pub plan: plan::Plan,
    pub schedule: schedule::Schedule,
    pub trace: engine::Trace,
    pub report: report::Report,
    /// With pipeline parallelism, every stage (the fields above are the headline stage's,
    /// except `report`, which is the pipeline's).
    pub stages: Vec<StageSim>,
}

/// One pipeline stage's plan, program, run and report.
#[derive(Debug, Clone)]
pub struct StageSim {
    pub plan: plan::Plan,
    pub schedule: schedule::Schedule,
    pub trace: engine::Trace,
    pub report: report::Report,
}

/// Simulates a validated scenario. Fails only on an internal scheduling error.
pub fn simulate(s: &scenario::Scenario) -> Result<Simulation, engine::Deadlock> {
    if let Some(cfg) = &s.inference {
        return simulate_inference(s, cfg);
    }
    let mut sim = run_with_capacity(s, s.allocator_capacity(), true)?;
    // A fragmentation OOM: would perfect packing (no allocator overhead at all) fit?
    let fragmented = sim.report.allocator.oom.as_ref().is_some_and(|d| d.cause == memory::OomCause::Fragmentation);
    if fragmented {
        let mut alt = s.clone();
        alt.allocator.kind = memory::AllocatorKind::Exact;
        let r = run_with_capacity(&alt, s.allocator_capacity(), false)?.report;
        let w = report::allocator::WithoutFragmentation {
            fits: matches!(r.verdict, report::Verdict::Fits { .. }),
            oom_at: match r.verdict {
                report::Verdict::Oom(o) => Some(o.at),
                report::Verdict::Fits { .. } => None,
            },
        };
        if let Some(d) = sim.report.allocator.oom.as_mut() {
            d.without_fragmentation = Some(w);
        }
    }
    if s.training.checkpointing != plan::Checkpointing::None {
        sim.report.checkpointing_cost = checkpointing_cost(s, &sim.report)?;
    }
    if let Some(off) = &s.parallel.offload {
        sim.report.offload = Some(offload_report(s, off, &sim)?);
    }
    Ok(sim)
}

/// Offload's figures: where the bytes live, from the plan; the traffic of the last step,
/// from the schedule's tasks and the partitions they move; the time side against the same
/// scenario without offload simulated with unbounded memory.
fn offload_report(
    s: &scenario::Scenario,
    off: &plan::OffloadConfig,
    sim: &Simulation,
) -> Result<report::OffloadReport, engine::Deadlock> {
    use plan::OffloadDevice;
    let p = &sim.plan;
    let where_ = p.offloaded_bytes();
    let node = u64::from(s.cluster.gpus_per_node);
    let el = p.local_total(p.optimizer_sharded);
    let pb = s.training.precision.param.bytes();
    let state_bytes = p.optimizer_partition_bytes();
    // Parameter partitions fetched before the all-gathers of the last step.
    let last = s.training.steps;
    let fetched: u64 = match off.parameters {
        None => 0,
        Some(_) => sim
            .schedule
            .program
            .tasks
            .iter()
            .map(|t| &sim.schedule.labels[t.label as usize])
            .filter(|l| l.step == last && l.kind == schedule::TaskKind::AllGather)
            .filter_map(|l| l.unit)
            .map(|u| p.units[u].shard_params * pb)
            .sum(),
    };
    let (mut nvme_read, mut nvme_write) = (0, 0);
    if off.optimizer == OffloadDevice::Nvme {
        nvme_read += state_bytes;
        nvme_write += state_bytes;
    }
    if off.parameters == Some(OffloadDevice::Nvme) {
        nvme_read += fetched;
        nvme_write += p.local_total(p.params_sharded) * pb;
    }
    let h2d = if off.parameters.is_some() { fetched } else { el * pb };
    let mut alt = s.clone();
    alt.parallel.offload = None;
    let without = plan_of(&alt, &sim.dag).model_state().total();
    let r = run_with_capacity(&alt, u64::MAX / 4, false)?.report;
    let fsdp = s.parallel.framework == plan::Framework::Fsdp;
    let mode = match (fsdp, off.parameters) {
        (true, _) => "FSDP CPUOffload(offload_params=True)".to_string(),
        (false, None) if off.optimizer == OffloadDevice::Cpu => {
            "DeepSpeed ZeRO-Offload (offload_optimizer = cpu)".to_string()
        }
        (false, prm) => format!(
            "DeepSpeed ZeRO-Infinity (offload_optimizer = {}{})",
            off.optimizer.name(),
            prm.map_or(String::new(), |d| format!(", offload_param = {}", d.name()))
        ),
    };
    let gb = |x: f64| x / 1e9;
    let (host_fits, nvme_fits) = p.offload_fits(node);
    let parts = p.offloaded_parts();
    let holds: Vec<&str> = parts.iter().filter(|x| x.on == OffloadDevice::Cpu).map(|x| x.what).collect();
    let host_parts = parts
        .iter()
        .filter(|x| x.on == OffloadDevice::Cpu)
        .map(|x| report::HostPart {
            what: x.what.into(),
            category: x.category.key().into(),
            bytes_per_gpu: report::Bytes::new(x.bytes),
        })
        .collect();
    Ok(report::OffloadReport {
        mode,
        host_holds: holds.join(" + "),
        host_parts,
        gpus_per_node: s.cluster.gpus_per_node,
        optimizer_on: off.optimizer.name().into(),
        parameters_on: off.parameters.map_or("gpu", |d| d.name()).into(),
        host_bytes_per_gpu: report::Bytes::new(where_.host),
        host_bytes_per_node: report::Bytes::new(where_.host * node),
        host_capacity: report::Bytes::new(off.cpu_memory_bytes),
        host_fits,
        nvme_bytes_per_gpu: report::Bytes::new(where_.nvme),
        nvme_bytes_per_node: report::Bytes::new(where_.nvme * node),
        nvme_capacity: report::Bytes::new(off.nvme_capacity_bytes),
        nvme_fits,
        d2h_bytes_per_step: report::Bytes::new(
            p.local_total(true) * plan::OffloadConfig::GRAD_BYTES_PER_PARAM * s.training.grad_accum,
        ),
        h2d_bytes_per_step: report::Bytes::new(h2d),
        nvme_read_bytes_per_step: report::Bytes::new(nvme_read),
        nvme_write_bytes_per_step: report::Bytes::new(nvme_write),
        d2h_gb_per_s: gb(off.d2h_bytes_per_s),
        h2d_gb_per_s: gb(off.h2d_bytes_per_s),
        nvme_read_gb_per_s: gb(off.nvme_read_bytes_per_s),
        nvme_write_gb_per_s: gb(off.nvme_write_bytes_per_s),
        cpu_adam_s: el as f64 / off.cpu_adam_params_per_s,
        cpu_adam_params_per_s: off.cpu_adam_params_per_s,
        gpu_memory_saved: report::Bytes::new(without.saturating_sub(p.model_state().total())),
        step_time_without_s: r.throughput.map(|t| t.step_time_s),
        step_time_with_s: sim.report.throughput.as_ref().map(|t| t.step_time_s),
    })
}

/// An inference job: its program through the engine and allocator, its report, and the
/// largest batch and context that fit.
fn simulate_inference(s: &scenario::Scenario, cfg: &infer::InferenceConfig) -> Result<Simulation, engine::Deadlock> {
    let run = infer::run(s, cfg, true, false)?;
    let mut report = report::inference::build(s, cfg, &run.dag, &run.schedule, &run.trace, &run.traffic);
    let fit = infer::max_fit(s, cfg)?;
    if let Some(inf) = report.inference.as_mut() {
        inf.max_fit = Some(fit);
    }
    let plan = plan_of(s, &run.dag);
    Ok(Simulation { dag: run.dag, plan, schedule: run.schedule, trace: run.trace, report, stages: Vec::new() })
}

/// DAG -> plan -> program -> engine -> report, with the allocator capped at `capacity`.
/// Without `curve` the trace keeps the peaks but not every sample (a counterfactual run
/// whose report alone is read).
fn run_with_capacity(s: &scenario::Scenario, capacity: u64, curve: bool) -> Result<Simulation, engine::Deadlock> {
    let dag = model::build(&s.model, &s.workload);
    let plan = plan_of(s, &dag);
    if plan.pipeline() > 1 {
        return run_pipeline(s, capacity, dag, plan, true, curve);
    }
    let schedule = schedule::build(&dag, &plan, &s.cluster);
    if let Some(j) = &s.jitter {
        let (schedule, trace, report) = run_ranks(s, capacity, &dag, &plan, &schedule, j, curve)?;
        return Ok(Simulation { dag, plan, schedule, trace, report, stages: Vec::new() });
    }
    let (trace, report) = execute(s, capacity, &dag, &plan, &schedule, curve)?;
    Ok(Simulation { dag, plan, schedule, trace, report, stages: Vec::new() })
}

/// With `[jitter]`: every data-parallel rank simulated, each on its own device and
/// allocator, collectives waiting for all ranks ([`schedule::jitter::ranks`]). The report
/// is the rank that runs out of memory, or else the one that finishes last: its program
/// (with its own compute times), its timeline, its step times.
fn run_ranks(
    s: &scenario::Scenario,
    capacity: u64,
    dag: &model::LayerDag,
    plan: &plan::Plan,
    sched: &schedule::Schedule,
    j: &schedule::jitter::JitterConfig,
    curve: bool,
) -> Result<(schedule::Schedule, engine::Trace, report::Report), engine::Deadlock> {
    let n = plan.dp.max(1) as usize;
    let run = schedule::jitter::ranks(sched, j, n as u64);
    let devices: Vec<_> = run.programs.iter().map(|p| (p, sched.labels.as_slice())).collect();
    let dt = run_on_devices(s, capacity, &devices, &[&run.barrier], &run.links, curve)?;
    let mut parts: Vec<&engine::Program> = run.programs.iter().collect();
    parts.push(&run.barrier);
    let oom_rank = dt.oom.as_ref().map(|o| o.device as usize);
    let mut traces = engine::part_traces(&parts, n, dt);
    let last_end = |tr: &engine::Trace| tr.end_ns.iter().filter(|&&e| e != u64::MAX).max().copied().unwrap_or(0);
    let k = oom_rank.unwrap_or_else(|| (0..n).rev().max_by_key(|&r| last_end(&traces[r])).unwrap_or(0));
    let trace = traces.swap_remove(k);
    let mut programs = run.programs;
    let schedule = schedule::Schedule {
        program: programs.swap_remove(k),
        labels: sched.labels.clone(),
        model_flops_per_step: sched.model_flops_per_step,
        hardware_flops_per_step: sched.hardware_flops_per_step,
    };
    let report = report::build(s, dag, plan, &schedule, &trace);
    Ok((schedule, trace, report))
}

/// The pipeline-parallel path: every stage's program run as one multi-device program, each
/// stage on its own allocator, then one report per stage and the pipeline's headline.
fn run_pipeline(
    s: &scenario::Scenario,
    capacity: u64,
    dag: model::LayerDag,
    plan: plan::Plan,
    names: bool,
    curve: bool,
) -> Result<Simulation, engine::Deadlock> {
    let (stages, report, k) = pipeline_stages(s, capacity, &dag, &plan, names, curve)?;
    let head = &stages[k];
    Ok(Simulation {
        plan: head.plan.clone(),
        schedule: head.schedule.clone(),
        trace: head.trace.clone(),
        dag,
        report,
        stages,
    })
}

/// [`run_pipeline`]'s work: every stage's plan, program, run and report, the pipeline's
/// report, and which stage it is about. The lean path keeps only the report, so it pays for
/// no copy of the headline stage, and (without `curve`) for no memory curve.
fn pipeline_stages(
    s: &scenario::Scenario,
    capacity: u64,
    dag: &model::LayerDag,
    plan: &plan::Plan,
    names: bool,
    curve: bool,
) -> Result<(Vec<StageSim>, report::Report, usize), engine::Deadlock> {
    let pipe = schedule::pipeline::build(dag, plan, &s.cluster, names);
    let p = pipe.stages.len();
    let scheds: Vec<&schedule::Schedule> = pipe.stages.iter().map(|st| &st.schedule).collect();
    let devices: Vec<_> = scheds.iter().map(|sch| (&sch.program, sch.labels.as_slice())).collect();
    let dt = run_on_devices(s, capacity, &devices, &[], &pipe.links, curve)?;
    let spans = step_spans(&scheds, &dt, plan.training.steps);
    let stages_hw = scheds.iter().fold(0.0, |hw, sch| hw + sch.hardware_flops_per_step);
    let traces = pipe.stage_traces(dt);
    let mut stages = Vec::with_capacity(p);
    for (st, trace) in pipe.stages.into_iter().zip(traces) {
        let report = report::build(s, dag, &st.plan, &st.schedule, &trace);
        stages.push(StageSim { plan: st.plan, schedule: st.schedule, trace, report });
    }
    let reports: Vec<&report::Report> = stages.iter().map(|x| &x.report).collect();
    let plans: Vec<&plan::Plan> = stages.iter().map(|x| &x.plan).collect();
    let k = report::pipeline::primary(&reports);
    let mut rep = stages[k].report.clone();
    let model_flops = stages[k].schedule.model_flops_per_step;
    let hw = stages_hw / p as f64;
    report::pipeline::finish(&mut rep, s, &plans, &reports, &spans, model_flops, hw);
    Ok((stages, rep, k))
}

/// Each step's span across all stages of a run of the stages' programs (numbered one after
/// the other): (first start, last end), ns.
fn step_spans(stages: &[&schedule::Schedule], dt: &engine::DeviceTrace, steps: u32) -> Vec<(u64, u64)> {
    let mut spans = vec![(u64::MAX, 0u64); steps as usize];
    let mut i = 0;
    for sch in stages {
        for t in &sch.program.tasks {
            let l = &sch.labels[t.label as usize];
            if l.step >= 1 && dt.end_ns[i] != u64::MAX {
                let sp = &mut spans[l.step as usize - 1];
                sp.0 = sp.0.min(dt.start_ns[i]);
                sp.1 = sp.1.max(dt.end_ns[i]);
            }
            i += 1;
        }
    }
    spans
}

fn plan_of(s: &scenario::Scenario, dag: &model::LayerDag) -> plan::Plan {
    let gpus = u64::from(s.cluster.gpus);
    plan::Plan::new(dag, s.parallel.clone(), s.training.clone(), gpus, u64::from(s.cluster.gpus_per_node))
}

/// Engine -> report: plays a schedule through the scenario's allocator capped at `capacity`.
fn execute(
    s: &scenario::Scenario,
    capacity: u64,
    dag: &model::LayerDag,
    plan: &plan::Plan,
    schedule: &schedule::Schedule,
    curve: bool,
) -> Result<(engine::Trace, report::Report), engine::Deadlock> {
    let trace = play(s, capacity, schedule, curve)?;
    let report = report::build(s, dag, plan, schedule, &trace);
    Ok((trace, report))
}

/// Runs a schedule through the scenario's allocator capped at `capacity`, keeping every
/// memory sample if `curve`, else the peaks only.
fn play(
    s: &scenario::Scenario,
    capacity: u64,
    schedule: &schedule::Schedule,
    curve: bool,
) -> Result<engine::Trace, engine::Deadlock> {
    let opts = engine::RunOptions {
        empty_cache_after: empty_cache_tasks(&schedule.program, &schedule.labels, &s.allocator.empty_cache),
        peaks_only: !curve,
    };
    let mut alloc = s.allocator.build(capacity, s.cluster.memory_bytes);
    engine::run_with(&schedule.program, alloc.as_mut(), &opts)
}

/// The sweep's simulation: [`simulate`]'s report, from a lean schedule (labels and buffers
/// without their text, see [`schedule::build_lean`]) on a DAG the caller built for `s` (and
/// may reuse across scenarios with the same model and workload), without the counterfactual
/// runs (`checkpointing_cost`, the fragmentation check). The verdict, the OOM's step, phase
/// and layer, the peaks and the throughput are [`simulate`]'s; op and tensor names are empty.
///
/// `early` lists step counts (0 = initialisation only) whose program prefixes are tried
/// first, in order ([`schedule::build_lean_prefix`]): the first that runs out of memory is
/// the answer, at a fraction of the cost of building and running every step.
pub fn simulate_lean(
    s: &scenario::Scenario,
    dag: &model::LayerDag,
    early: &[u32],
) -> Result<report::Report, engine::Deadlock> {
    if let Some(cfg) = &s.inference {
        // Its own program (sweeps refuse inference bases; this keeps the API total).
        let run = infer::run(s, cfg, false, false)?;
        return Ok(report::inference::build(s, cfg, &run.dag, &run.schedule, &run.trace, &run.traffic));
    }
    let plan = plan_of(s, dag);
    let capacity = s.allocator_capacity();
    if plan.pipeline() > 1 {
        return pipeline_stages(s, capacity, dag, &plan, false, false).map(|(_, report, _)| report);
    }
    for &steps in early.iter().filter(|&&k| k < s.training.steps) {
        let prefix = schedule::build_lean_prefix(dag, &plan, &s.cluster, steps);
        let trace = play(s, capacity, &prefix, false)?;
        if trace.oom.is_some() {
            return Ok(report::build(s, dag, &plan, &prefix, &trace));
        }
    }
    let schedule = schedule::build_lean(dag, &plan, &s.cluster);
    if let Some(j) = &s.jitter {
        return run_ranks(s, capacity, dag, &plan, &schedule, j, false).map(|(_, _, report)| report);
    }
    execute(s, capacity, dag, &plan, &schedule, false).map(|(_, report)| report)
}

/// The tasks after which the program calls `torch.cuda.empty_cache()`: the last task of
/// initialisation; the last forward (backward) op of each micro-batch; each
/// `optimizer.step()`; the `zero_grad()` that ends each step.
fn empty_cache_tasks(prog: &engine::Program, labels: &[schedule::TaskLabel], points: &[EmptyCacheAt]) -> Vec<u32> {
    use schedule::TaskKind;
    let mut out = Vec::new();
    if points.is_empty() {
        return out;
    }
    let labels = || prog.tasks.iter().map(|t| &labels[t.label as usize]).enumerate();
    for &p in points {
        let kind = match p {
            EmptyCacheAt::AfterInit => TaskKind::Init,
            EmptyCacheAt::AfterForward => TaskKind::Forward,
            EmptyCacheAt::AfterBackward => TaskKind::Backward,
            EmptyCacheAt::AfterOptimizer => TaskKind::Optimizer,
            EmptyCacheAt::AfterStep => TaskKind::ZeroGrad,
        };
        // The last task of that kind in each (step, micro-batch), in program order.
        let mut last: Option<(u32, u32, usize)> = None;
        for (i, l) in labels() {
            if l.kind != kind {
                continue;
            }
            match last {
                Some((st, mb, _)) if st == l.step && mb == l.micro_batch => last = Some((st, mb, i)),
                Some((_, _, j)) => {
                    out.push(j as u32);
                    last = Some((l.step, l.micro_batch, i));
                }
                None => last = Some((l.step, l.micro_batch, i)),
            }
        }
        if let Some((_, _, j)) = last {
            out.push(j as u32);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Programs run as the parts of one run ([`engine::run_parts`]): the `devices` programs
/// (with their labels), each on its own device with the scenario's allocator capped at
/// `capacity`, then `extra`
/// (programs whose streams say which device they use), tied by `links`. Each device calls
/// `empty_cache()` where its own program does (a pipeline stage's or a rank's, not the
/// concatenation's). Every memory sample is kept if `curve`, else the peaks only.
fn run_on_devices(
    s: &scenario::Scenario,
    capacity: u64,
    devices: &[(&engine::Program, &[schedule::TaskLabel])],
    extra: &[&engine::Program],
    links: &[engine::Link],
    curve: bool,
) -> Result<engine::DeviceTrace, engine::Deadlock> {
    let mut empty_cache_after = Vec::new();
    let mut offset = 0;
    for &(prog, labels) in devices {
        let own = empty_cache_tasks(prog, labels, &s.allocator.empty_cache);
        empty_cache_after.extend(own.into_iter().map(|t| t + offset));
        offset += prog.tasks.len() as u32;
    }
    let opts = engine::RunOptions { empty_cache_after, peaks_only: !curve };
    let mut allocs: Vec<Box<dyn memory::Allocator>> =
        devices.iter().map(|_| s.allocator.build(capacity, s.cluster.memory_bytes)).collect();
    let mut refs: Vec<&mut dyn memory::Allocator> =
        allocs.iter_mut().map(|a| &mut **a as &mut dyn memory::Allocator).collect();
    let parts: Vec<&engine::Program> = devices.iter().map(|d| d.0).chain(extra.iter().copied()).collect();
    engine::run_parts(&parts, links, &mut refs, &opts)
}

/// What activation checkpointing costs in time: the same scenario without it, simulated
/// with unbounded memory (it may not fit: only its timing and peak are used).
fn checkpointing_cost(
    s: &scenario::Scenario,
    with: &report::Report,
) -> Result<Option<report::CheckpointingCost>, engine::Deadlock> {
    let Some(tp) = &with.throughput else { return Ok(None) };
    let mut alt = s.clone();
    alt.training.checkpointing = plan::Checkpointing::None;
    let r = run_with_capacity(&alt, u64::MAX / 4, false)?.report;
    Ok(r.throughput.map(|t| report::CheckpointingCost {
        step_time_without_s: t.step_time_s,
        step_time_with_s: tp.step_time_s,
        slowdown: tp.step_time_s / t.step_time_s - 1.0,
        peak_without: r.peak.map(|p| p.allocated).unwrap_or(report::Bytes::new(0)),
    }))
}

impl Simulation {
    /// The memory samples recorded by tasks of one step (0 = initialisation), optionally
    /// of one phase only.
    pub fn samples_in(&self, step: u32, phase: Option<schedule::Phase>) -> impl Iterator<Item = &memory::Sample> {
        let labels = &self.schedule.labels;
        let tasks = &self.schedule.program.tasks;
        self.trace.timeline.samples.iter().filter(move |s| {
            let l = &labels[tasks[s.task].label as usize];
            l.step == step && phase.is_none_or(|p| l.phase == p)
        })
    }

    /// The phase of the task that recorded a sample.
    pub fn phase_of(&self, s: &memory::Sample) -> schedule::Phase {
        self.schedule.labels[self.schedule.program.tasks[s.task].label as usize].phase
    }

    /// The highest `allocated` sample of one step (first one if tied), with its phase.
    pub fn step_peak(&self, step: u32) -> Option<(&memory::Sample, schedule::Phase)> {
        let best = self.samples_in(step, None).fold(None, |best: Option<&memory::Sample>, s| match best {
            Some(b) if b.allocated >= s.allocated => Some(b),
            _ => Some(s),
        })?;
        Some((best, self.phase_of(best)))
    }

    /// The highest `allocated` bytes of one phase of one step.
    pub fn phase_peak(&self, step: u32, phase: schedule::Phase) -> Option<u64> {
        self.samples_in(step, Some(phase)).map(|s| s.allocated).max()
    }
}
