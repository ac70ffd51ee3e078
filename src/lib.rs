//! stepsim: a discrete-event simulator of one LLM training step across many GPUs.
//!
//! Data flows one way (docs/ARCHITECTURE.md): a [`scenario::Scenario`] is turned into a
//! [`model::LayerDag`] (petgraph), a [`plan::Plan`] says who holds which bytes,
//! [`job::compile`] turns the job into rank classes (each distinct program and how many GPUs
//! run it, written by [`schedule`]), [`job::run::run`] plays them all on one engine, each
//! class through its own [`memory::Allocator`], and [`report::job::build`] turns the run
//! into the verdict, the peak and its breakdown, and throughput.
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
pub mod import;
pub mod infer;
pub mod job;
pub mod memory;
pub mod model;
pub mod net;
pub mod plan;
pub mod recent;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod sweep;

/// Everything one simulation produced: the job's rank classes, their run, every class's
/// report and the job's.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub dag: model::LayerDag,
    pub job: job::Job,
    pub run: job::run::JobRun,
    /// The job's report: the headline class's, with every class in its table.
    pub report: report::Report,
    /// The class the headline is about ([`report::job::headline`]).
    pub headline: usize,
    /// Every class's own report, in class order.
    pub class_reports: Vec<report::Report>,
}

impl Simulation {
    /// The report's invariants ([`report::invariants`]), of the job's report and of every
    /// class's: what the CLI and the Python package check before they write or return one.
    pub fn check_invariants(&self) -> Result<(), String> {
        std::iter::once(&self.report).chain(&self.class_reports).try_for_each(|r| {
            report::invariants::check(r).map_err(|e| {
                format!("internal error: the report breaks its own invariant ({e}); nothing was written. Please report this with the scenario")
            })
        })
    }
}

/// What a simulation keeps beyond its report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimOptions {
    /// Each rank class's allocator history, for a PyTorch memory snapshot
    /// ([`report::snapshot`]): every allocation, free and segment with its address.
    pub history: bool,
    /// Simulate every period of a repeating schedule instead of extrapolating it
    /// ([`engine::RunOptions::every_period`]), in the job's run and the follow-up runs:
    /// the same figures, slower. What the test of the extrapolation compares with.
    pub every_period: bool,
    /// Play every rank of a `[jitter]` job in one event loop instead of one rank at a time
    /// between barriers ([`job::run::Mode::one_loop`]): the same figures, slower. What the
    /// test of the rank-by-rank runner compares with.
    pub one_loop: bool,
}

/// Simulates a validated scenario. Fails only on an internal scheduling error.
pub fn simulate(s: &scenario::Scenario) -> Result<Simulation, engine::Deadlock> {
    simulate_with(s, SimOptions::default())
}

/// Keeps the memory a configuration frees for the next one: what the CLI calls first, and
/// `benches/simulate.rs`, so that it times the simulator as `stepsim run` runs it (its doc
/// says why `benches/sweep.rs` does not). A pipeline's
/// program and trace are vectors of tens to hundreds of MB; glibc serves each above its mmap
/// threshold (128 KiB at first, adapting up to 32 MiB) with fresh pages from the kernel and
/// unmaps them when freed, and trims the heap's top above 128 KiB, so every configuration of
/// a GPT-3 3D sweep faulted its memory in again (about 7% of the sweep's time, most of it
/// the kernel's). With the threshold at its maximum and the heap trimmed only above 1 GiB
/// free, the next configuration reuses those pages. The process's peak is what it used, plus
/// what the heap holds unreturned (measured: 530 -> 590 MiB on the GPT-3 sweep's shard
/// 1/20). Elsewhere than glibc, nothing. Call it first.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc's allocator parameters; a value it refuses leaves the
    // default in place.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// [`simulate`], keeping what `opts` asks for. The figures are [`simulate`]'s, whatever it
/// keeps.
pub fn simulate_with(s: &scenario::Scenario, opts: SimOptions) -> Result<Simulation, engine::Deadlock> {
    let record = if opts.history { job::run::Record::History } else { job::run::Record::Curve };
    if let Some(cfg) = &s.inference {
        return simulate_inference(s, cfg, record);
    }
    let every =
        job::run::Mode { every_period: opts.every_period, one_loop: opts.one_loop, cancel: None, held: Vec::new() };
    // What checkpointing costs is the same job simulated without it: that run does not
    // depend on this one, so it runs beside it, and stops early if this one runs out of
    // memory (then there is no step time to compare).
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let without_checkpointing = (s.training.checkpointing != plan::Checkpointing::None).then(|| {
        let mut alt = s.clone();
        alt.training.checkpointing = plan::Checkpointing::None;
        alt
    });
    let (sim, without_checkpointing) = rayon::join(
        || {
            let sim = simulate_job(s, s.allocator_capacity(), record, every.clone(), true);
            if !matches!(&sim, Ok(x) if x.report.throughput.is_some()) {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            sim
        },
        || {
            without_checkpointing.map(|alt| {
                let mode = job::run::Mode { cancel: Some(cancel.clone()), ..every.clone() };
                simulate_job(&alt, u64::MAX / 4, job::run::Record::Peaks, mode, false)
            })
        },
    );
    let mut sim = sim?;
    // A fragmentation OOM: would perfect packing (no allocator overhead at all) fit?
    let fragmented = sim.report.allocator.oom.as_ref().is_some_and(|d| d.cause == memory::OomCause::Fragmentation);
    if fragmented {
        let mut alt = s.clone();
        alt.allocator.kind = memory::AllocatorKind::Exact;
        let mode = every.clone();
        let r = simulate_job(&alt, s.allocator_capacity(), job::run::Record::Peaks, mode, true)?.report;
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
    if let (Some(without), Some(with)) = (without_checkpointing, &sim.report.throughput) {
        // Not cancelled: this job ran to its step time.
        sim.report.checkpointing_cost = checkpointing_cost(with, &without?.report);
    }
    if let Some(loads) = s.expert_loads() {
        sim.report.routing = Some(routing_report(s, &loads, &sim.report, &every)?);
    }
    if let Some(off) = &s.parallel.offload {
        sim.report.offload = Some(offload_report(s, off, &sim, &every)?);
        if sim.job.classes.len() > 1 {
            sim.report.assumptions.push("offload on a pipeline: a node's host memory and NVMe are those of the stage that offloads the most, on every GPU of the node (an upper bound when a node holds several stages)".into());
        }
    }
    Ok(sim)
}

/// The job alone: [`simulate`]'s verdict, peaks and throughput without its follow-up runs
/// (the fragmentation check, the checkpointing cost, the offload and routing reports), on
/// the sweep's lean programs ([`simulate_lean`], trying the initialisation-only prefix
/// first): for callers that read only those figures (explain's counterfactuals, a dozen
/// variants of a job, two at a time). A full simulation held every task's name and every
/// memory sample: explain of a 1024-layer job reached 7.8 GB.
pub fn simulate_job_only(s: &scenario::Scenario) -> Result<report::Report, engine::Deadlock> {
    let dag = model::build(&s.model, &s.dag_workload());
    simulate_lean(s, &dag, &[schedule::Stage::Steps(0)])
}

/// Offload's figures: where the bytes live, from the plan; the traffic of the last step,
/// from the schedule's tasks and the partitions they move; the time side against the same
/// scenario without offload simulated with unbounded memory.
fn offload_report(
    s: &scenario::Scenario,
    off: &plan::OffloadConfig,
    sim: &Simulation,
    every: &job::run::Mode,
) -> Result<report::OffloadReport, engine::Deadlock> {
    use plan::OffloadDevice;
    let p = sim.plan();
    // A node's GPUs may hold different pipeline stages: its host and NVMe figures are those of
    // the class that offloads the most, on every GPU of the node (an upper bound).
    let ph = sim.job.classes.iter().map(|c| &*c.plan).max_by_key(|q| q.offloaded_bytes().host).unwrap_or(p);
    let where_ = ph.offloaded_bytes();
    let node = u64::from(s.cluster.gpus_per_node);
    let el = p.local_total(p.optimizer_sharded);
    let pb = s.training.precision.param.bytes();
    let state_bytes = p.optimizer_partition_bytes();
    // Parameter partitions fetched before the all-gathers of the last step.
    let last = s.training.steps;
    let fetched: u64 = match off.parameters {
        None => 0,
        Some(_) => sim
            .schedule()
            .program
            .tasks
            .iter()
            .map(|t| &sim.schedule().labels[t.label as usize])
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
    let r = simulate_job(&alt, u64::MAX / 4, job::run::Record::Peaks, every.clone(), true)?.report;
    let fsdp = s.parallel.framework.is_pytorch();
    let mode = match (fsdp, off.parameters) {
        (true, _) if s.parallel.framework.fsdp2_buffers() => "FSDP2 CPUOffloadPolicy(pin_memory=True)".to_string(),
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
    let (host_fits, nvme_fits) = ph.offload_fits(node);
    let parts = ph.offloaded_parts();
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
        // Reduced once per micro-batch, or once per step on a pipeline stage (gradients
        // accumulate unsharded there).
        d2h_bytes_per_step: report::Bytes::new(
            p.local_total(true)
                * plan::OffloadConfig::GRAD_BYTES_PER_PARAM
                * if p.pipeline() > 1 { 1 } else { s.training.grad_accum },
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

/// An inference job: its program through the runner, its report, and the largest batch and
/// context that fit.
fn simulate_inference(
    s: &scenario::Scenario,
    cfg: &infer::InferenceConfig,
    record: job::run::Record,
) -> Result<Simulation, engine::Deadlock> {
    let r = inference_run_with(s, cfg, true, false, record)?;
    let class = &r.job.classes[0];
    let mut report = report::inference::build(s, cfg, &r.dag, &class.schedule, &r.run.traces[0], &r.traffic);
    let fit =
        infer::max_fit(&s.model, cfg, |c| Ok(inference_run(s, c, false, true, false)?.run.traces[0].oom.is_none()))?;
    if let Some(inf) = report.inference.as_mut() {
        inf.max_fit = Some(fit);
    }
    Ok(Simulation { dag: r.dag, job: r.job, run: r.run, class_reports: vec![report.clone()], report, headline: 0 })
}

/// An inference job's run: its DAG, its job (one rank class: every GPU, a replica or a rank
/// of its tensor-parallel group, runs the same program), the run and what the program moves.
pub struct InferenceRun {
    pub dag: model::LayerDag,
    pub job: job::Job,
    pub run: job::run::JobRun,
    pub traffic: infer::program::Traffic,
}

/// Compiles the inference job `cfg` of scenario `s` and plays it through the one runner, with
/// the scenario's allocator; `names` labels tasks and buffers, `probe` is the capacity
/// search's program ([`infer::program::build_with`]), `curve` keeps every memory sample.
pub fn inference_run(
    s: &scenario::Scenario,
    cfg: &infer::InferenceConfig,
    names: bool,
    probe: bool,
    curve: bool,
) -> Result<InferenceRun, engine::Deadlock> {
    let record = if curve { job::run::Record::Curve } else { job::run::Record::Peaks };
    inference_run_with(s, cfg, names, probe, record)
}

fn inference_run_with(
    s: &scenario::Scenario,
    cfg: &infer::InferenceConfig,
    names: bool,
    probe: bool,
    record: job::run::Record,
) -> Result<InferenceRun, engine::Deadlock> {
    let tp = s.parallel.model_parallel.tensor;
    let c = infer::compile(&s.model, &s.workload, &s.cluster, tp, cfg, names, probe);
    let class = job::RankClass {
        role: job::Role::Replicas,
        stride: 1,
        run: 1,
        count: u64::from(s.cluster.gpus),
        first_rank: 0,
        plan: std::sync::Arc::new(plan_of(s, &c.dag)),
        schedule: c.schedule,
    };
    let job = job::Job { classes: vec![class], extra: Vec::new(), links: Vec::new() };
    // generate() calls no torch.cuda.empty_cache(): the training points do not apply.
    let settings = memory::AllocatorSettings { empty_cache: Vec::new(), ..s.allocator.clone() };
    let run =
        job::run::run(&job, &settings, s.allocator_capacity(), s.cluster.memory_bytes, 0, record, Default::default())?;
    Ok(InferenceRun { dag: c.dag, job, run, traffic: c.traffic })
}

/// Scenario -> DAG -> plan -> rank classes -> one run -> report, with the allocator capped at
/// `capacity`. Without `curve` the traces keep the peaks but not every sample, and no
/// class gets a report of its own (a counterfactual run whose report alone is read).
/// Without `names` the programs' tasks and buffers carry no text ([`schedule::build_lean`]):
/// for a caller that reads figures only.
fn simulate_job(
    s: &scenario::Scenario,
    capacity: u64,
    record: job::run::Record,
    mode: job::run::Mode,
    names: bool,
) -> Result<Simulation, engine::Deadlock> {
    let curve = matches!(record, job::run::Record::Curve | job::run::Record::History);
    let dag = model::build(&s.model, &s.dag_workload());
    let plan = plan_of(s, &dag);
    let steps = plan.training.steps;
    let loads = s.expert_loads();
    let job = job::compile(&dag, &plan, &s.cluster, s.jitter.as_ref(), loads.as_deref(), names, steps);
    let run = job::run::run(&job, &s.allocator, capacity, s.cluster.memory_bytes, steps, record, mode)?;
    let jr = report::job::build(s, &dag, &job, &run, curve);
    Ok(Simulation { dag, job, run, report: jr.report, headline: jr.headline, class_reports: jr.classes })
}

fn plan_of(s: &scenario::Scenario, dag: &model::LayerDag) -> plan::Plan {
    let gpus = u64::from(s.cluster.gpus);
    plan::Plan::new(dag, s.parallel.clone(), s.training.clone(), gpus, u64::from(s.cluster.gpus_per_node))
}

/// The sweep's simulation: [`simulate`]'s report, from lean programs (labels and buffers
/// without their text, see [`schedule::build_lean`]) on a DAG the caller built for `s` (and
/// may reuse across scenarios with the same model and workload), without the counterfactual
/// runs (`checkpointing_cost`, the fragmentation check). The verdict, the OOM's step, phase
/// and layer, the peaks and the throughput are [`simulate`]'s; op and tensor names are empty.
///
/// `early` lists program prefixes tried first, in build order ([`schedule::Stage`]): the
/// first that runs out of memory where the whole program would is the answer, at a fraction
/// of the cost of building and running every step. An unpipelined job of one program builds
/// it once, running each prefix as the builder reaches it ([`schedule::build_lean_staged`]);
/// so does a pipeline, every stage in lockstep, with a cut within step 1 in place of the
/// first forward ([`schedule::pipeline::build_staged`], [`schedule::Stage::Slots`]);
/// `[jitter]` or uneven routing builds each prefix of whole steps apart
/// ([`schedule::build_lean_prefix`]) and skips the rest.
pub fn simulate_lean(
    s: &scenario::Scenario,
    dag: &model::LayerDag,
    early: &[schedule::Stage],
) -> Result<report::Report, engine::Deadlock> {
    if let Some(cfg) = &s.inference {
        // Sweeps refuse inference bases; this keeps the API total.
        let r = inference_run(s, cfg, false, false, true)?;
        let sched = &r.job.classes[0].schedule;
        return Ok(report::inference::build(s, cfg, &r.dag, sched, &r.run.traces[0], &r.traffic));
    }
    simulate_lean_with(s, dag, early, job::run::Record::Peaks, |job, run| {
        report::job::build(s, dag, job, run, false).report
    })
}

/// [`simulate_lean`] answering with `finish` of the run that answers (a prefix's or the whole
/// program's) instead of its report: a sweep keeps a few figures of each configuration and
/// need not write the report's text. Each device's memory is kept as `record` says
/// ([`job::run::Record::Headline`] for a sweep row's peaks, `Peaks` for a report).
/// Training only (sweeps refuse inference bases).
pub fn simulate_lean_with<R>(
    s: &scenario::Scenario,
    dag: &model::LayerDag,
    early: &[schedule::Stage],
    record: job::run::Record,
    finish: impl Fn(&job::Job, &job::run::JobRun) -> R,
) -> Result<R, engine::Deadlock> {
    let plan = std::sync::Arc::new(plan_of(s, dag));
    let capacity = s.allocator_capacity();
    let all = plan.training.steps;
    let loads = s.expert_loads();
    let run_job = |job: &job::Job| {
        job::run::run(job, &s.allocator, capacity, s.cluster.memory_bytes, all, record, Default::default())
    };
    if job::one_program(plan.pipeline(), s.jitter.is_some(), loads.as_deref()) {
        use job::run::Progress;
        // Each prefix's run pauses where its gate ends (every later task waits for the gate:
        // an out-of-memory before then is the whole program's) and the next prefix, or the
        // whole program, carries it on from there rather than from the start.
        let go = |paused: &mut Option<job::run::Paused>, job: &job::Job, stop: Option<u32>| {
            let mode = job::run::Mode::default;
            if let Some(p) = paused.take() {
                if let Some(progress) = job::run::resume(p, job, &s.allocator, all, record, mode(), stop) {
                    return progress;
                }
            }
            match stop {
                Some(stop) => {
                    let device = s.cluster.memory_bytes;
                    job::run::run_until(job, &s.allocator, capacity, device, all, record, mode(), stop)
                }
                None => run_job(job).map(Progress::Done),
            }
        };
        let mut paused = None;
        let staged = schedule::build_lean_staged(dag, &plan, &s.cluster, early, |prefix| {
            let last = prefix.schedule.program.tasks.len().checked_sub(1)? as u32;
            let job = job::of_replicas(plan.clone(), prefix.schedule);
            match go(&mut paused, &job, Some(prefix.gate.unwrap_or(last))) {
                Ok(Progress::Done(run)) => Some(Ok(finish(&job, &run))),
                Ok(Progress::Paused(p)) => {
                    paused = Some(p);
                    None
                }
                Err(deadlock) => Some(Err(deadlock)),
            }
        });
        return match staged {
            schedule::Staged::Answered(answer) => answer,
            schedule::Staged::Whole(schedule) => {
                let job = job::of_replicas(plan.clone(), *schedule);
                match go(&mut paused, &job, None)? {
                    Progress::Done(run) => Ok(finish(&job, &run)),
                    Progress::Paused(_) => unreachable!("a run without a task to stop after runs to its end"),
                }
            }
        };
    }
    if job::plain_pipeline(plan.pipeline(), s.jitter.is_some(), loads.as_deref()) {
        let staged = schedule::pipeline::build_staged(dag, &plan, &s.cluster, early, |prefix| {
            let job = job::of_pipeline(&plan, prefix.pipeline);
            let held = engine::part_tasks(&job.parts(), &prefix.held);
            let mode = job::run::Mode { held, ..Default::default() };
            let run = job::run::run(&job, &s.allocator, capacity, s.cluster.memory_bytes, all, record, mode);
            match run {
                // An out-of-memory before a held task could start is the whole program's.
                Ok(run) => run.traces.iter().any(|t| t.oom.is_some()).then(|| Ok(finish(&job, &run))),
                Err(deadlock) => Some(Err(deadlock)),
            }
        });
        return match staged {
            schedule::Staged::Answered(answer) => answer,
            schedule::Staged::Whole(pipe) => {
                let job = job::of_pipeline(&plan, *pipe);
                let run = run_job(&job)?;
                Ok(finish(&job, &run))
            }
        };
    }
    let run_steps = |steps: u32| -> Result<_, engine::Deadlock> {
        let job = job::compile(dag, &plan, &s.cluster, s.jitter.as_ref(), loads.as_deref(), false, steps);
        let run = run_job(&job)?;
        Ok((job, run))
    };
    for &stage in early {
        let schedule::Stage::Steps(steps) = stage else { continue };
        if steps < all {
            let (job, run) = run_steps(steps)?;
            if run.traces.iter().any(|t| t.oom.is_some()) {
                return Ok(finish(&job, &run));
            }
        }
    }
    let (job, run) = run_steps(all)?;
    Ok(finish(&job, &run))
}

/// What activation checkpointing costs in time: `without` is the same scenario without it,
/// simulated with unbounded memory (it may not fit: only its timing and peak are used).
fn checkpointing_cost(with: &report::Throughput, without: &report::Report) -> Option<report::CheckpointingCost> {
    without.throughput.as_ref().map(|t| report::CheckpointingCost {
        step_time_without_s: t.step_time_s,
        step_time_with_s: with.step_time_s,
        slowdown: with.step_time_s / t.step_time_s - 1.0,
        peak_without: without.peak.as_ref().map(|p| p.allocated).unwrap_or(report::Bytes::new(0)),
    })
}

/// Uneven MoE routing: the hottest and coolest expert-parallel ranks, what the job needs and
/// how long its step takes (simulated again with unbounded memory if it ran out), beside the
/// same job under uniform routing at the real capacity.
fn routing_report(
    s: &scenario::Scenario,
    loads: &[u64],
    with: &report::Report,
    every: &job::run::Mode,
) -> Result<report::RoutingReport, engine::Deadlock> {
    let mode = every.clone();
    let (mut hot, mut cold) = (0, 0);
    for (r, &c) in loads.iter().enumerate() {
        if c > loads[hot] {
            hot = r;
        }
        if c < loads[cold] {
            cold = r;
        }
    }
    let ran_out = matches!(with.verdict, report::Verdict::Oom(_));
    let needed = if ran_out {
        simulate_job(s, u64::MAX / 4, job::run::Record::Peaks, mode.clone(), true)?.report
    } else {
        with.clone()
    };
    let mut uniform = s.clone();
    uniform.routing = schedule::routing::Routing::Uniform;
    uniform.capacity = None;
    let u = simulate_job(&uniform, s.allocator_capacity(), job::run::Record::Peaks, mode, true)?.report;
    let describe = match &s.routing {
        schedule::routing::Routing::Uniform => "uniform".to_string(),
        schedule::routing::Routing::Zipf { exponent, seed } => format!("zipf (exponent {exponent}, seed {seed})"),
        schedule::routing::Routing::Measured { .. } => "measured tokens per expert".to_string(),
    };
    Ok(report::RoutingReport {
        routing: describe,
        capacity_factor: s.capacity.map(|c| c.factor),
        padded: s.capacity.is_some_and(|c| c.pad),
        dropped_fraction: s.dropped_copies() as f64 / s.routed_copies().max(1) as f64,
        hottest_rank: hot as u64,
        hottest_copies: loads[hot],
        coolest_rank: cold as u64,
        coolest_copies: loads[cold],
        uniform_copies: s.routed_copies(),
        peak_needed: needed.peak.as_ref().map_or(report::Bytes::new(0), |p| p.allocated),
        step_time_s: needed.throughput.as_ref().map(|t| t.step_time_s),
        uniform_peak: u.peak.as_ref().map_or(report::Bytes::new(0), |p| p.allocated),
        uniform_fits: matches!(u.verdict, report::Verdict::Fits { .. }),
        uniform_step_time_s: u.throughput.as_ref().map(|t| t.step_time_s),
    })
}

/// One rank class of a simulation: its program, its view of the run, its own report.
#[derive(Debug, Clone, Copy)]
pub struct ClassSim<'a> {
    pub class: &'a job::RankClass,
    pub schedule: &'a schedule::Schedule,
    pub trace: &'a engine::Trace,
    pub report: &'a report::Report,
}

impl Simulation {
    /// Every rank class, in class order (pipeline stages in stage order).
    pub fn classes(&self) -> impl Iterator<Item = ClassSim<'_>> {
        self.job
            .classes
            .iter()
            .zip(&self.run.traces)
            .zip(&self.class_reports)
            .map(|((class, trace), report)| ClassSim { class, schedule: &class.schedule, trace, report })
    }

    /// The headline class.
    pub fn class(&self) -> &job::RankClass {
        &self.job.classes[self.headline]
    }

    /// The headline class's plan.
    pub fn plan(&self) -> &plan::Plan {
        &self.class().plan
    }

    /// The headline class's program.
    pub fn schedule(&self) -> &schedule::Schedule {
        &self.class().schedule
    }

    /// The headline class's view of the run.
    pub fn trace(&self) -> &engine::Trace {
        &self.run.traces[self.headline]
    }

    /// The memory samples recorded by the headline class's tasks of one step (0 =
    /// initialisation), optionally of one phase only.
    pub fn samples_in(&self, step: u32, phase: Option<schedule::Phase>) -> impl Iterator<Item = memory::Sample> + '_ {
        let labels = &self.schedule().labels;
        let tasks = &self.schedule().program.tasks;
        self.trace().timeline.samples().filter(move |s| {
            let l = &labels[tasks[s.task].label as usize];
            l.step == step && phase.is_none_or(|p| l.phase == p)
        })
    }

    /// The phase of the task that recorded a sample.
    pub fn phase_of(&self, s: &memory::Sample) -> schedule::Phase {
        let sched = self.schedule();
        sched.labels[sched.program.tasks[s.task].label as usize].phase
    }

    /// The highest `allocated` sample of one step (first one if tied), with its phase.
    pub fn step_peak(&self, step: u32) -> Option<(memory::Sample, schedule::Phase)> {
        let best = self.samples_in(step, None).fold(None, |best: Option<memory::Sample>, s| match best {
            Some(b) if b.allocated >= s.allocated => Some(b),
            _ => Some(s),
        })?;
        let phase = self.phase_of(&best);
        Some((best, phase))
    }

    /// The highest `allocated` bytes of one phase of one step.
    pub fn phase_peak(&self, step: u32, phase: schedule::Phase) -> Option<u64> {
        self.samples_in(step, Some(phase)).map(|s| s.allocated).max()
    }
}
