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
pub mod hardware;
pub mod memory;
pub mod model;
pub mod net;
pub mod plan;
pub mod report;
pub mod scenario;
pub mod schedule;

use memory::ExactAllocator;

/// Everything one simulation produced.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub dag: model::LayerDag,
    pub plan: plan::Plan,
    pub schedule: schedule::Schedule,
    pub trace: engine::Trace,
    pub report: report::Report,
}

/// Simulates a validated scenario. Fails only on an internal scheduling error.
pub fn simulate(s: &scenario::Scenario) -> Result<Simulation, engine::Deadlock> {
    let mut sim = run_with_capacity(s, s.cluster.capacity_bytes())?;
    if s.training.checkpointing != plan::Checkpointing::None {
        sim.report.checkpointing_cost = checkpointing_cost(s, &sim.report)?;
    }
    Ok(sim)
}

/// DAG -> plan -> program -> engine -> report, with the allocator capped at `capacity`.
fn run_with_capacity(s: &scenario::Scenario, capacity: u64) -> Result<Simulation, engine::Deadlock> {
    let dag = model::build(&s.model, &s.workload);
    let gpus = u64::from(s.cluster.gpus);
    let plan = plan::Plan::new(&dag, s.parallel.clone(), s.training.clone(), gpus, u64::from(s.cluster.gpus_per_node));
    let schedule = schedule::build(&dag, &plan, &s.cluster);
    let trace = engine::run(&schedule.program, &mut ExactAllocator::new(capacity))?;
    let report = report::build(s, &dag, &plan, &schedule, &trace);
    Ok(Simulation { dag, plan, schedule, trace, report })
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
    let r = run_with_capacity(&alt, u64::MAX / 4)?.report;
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
