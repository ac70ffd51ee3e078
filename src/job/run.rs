//! One runner for every job: all rank classes on one engine, each on its own device with
//! its own allocator, the extra programs (barriers) beside them, tied by the job's links.
//! A job of one class is the plain run; nothing here knows which roles the classes play.

use super::Job;
use crate::engine::{self, Deadlock, Program, RunOptions, Trace};
use crate::memory::{Allocator, AllocatorSettings, EmptyCacheAt};
use crate::schedule::{TaskKind, TaskLabel};

/// What a job's run produced: each class's view of it (its tasks' times, its device's
/// timeline and allocator, the OOM if it happened there), and each step's span across
/// every class.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRun {
    pub traces: Vec<Trace>,
    /// Each step's (first start, last end) over every class's tasks, ns; (u64::MAX, 0) for
    /// a step that did not run.
    pub spans: Vec<(u64, u64)>,
    /// Periods of repeating schedule the engine played without its event loop
    /// ([`crate::engine::RunOptions::every_period`]).
    pub periods_jumped: u64,
    /// Whether the ranks were played one at a time between barriers
    /// ([`crate::engine::by_rank`]) rather than in one event loop.
    pub by_rank: bool,
    /// Whether the run was played twice: the first ran out of memory inside a jump of
    /// repeating periods replayed device by device ([`RunOptions::replay_by_device`]), and
    /// this is the second, replayed in order.
    pub played_again: bool,
}

/// What a run keeps of each device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The peaks and what a report reads ([`crate::memory::Timeline::peaks_only`]).
    Peaks,
    /// The peaks alone, what a sweep row reads ([`crate::memory::Timeline::headline`]).
    Headline,
    /// Every memory sample.
    Curve,
    /// Every sample and the allocator's history (`--snapshot`).
    History,
}

/// How the engine plays a job, beside what it keeps.
#[derive(Debug, Clone, Default)]
pub struct Mode {
    /// Simulate every period of a repeating schedule instead of replaying it
    /// ([`crate::engine::RunOptions::every_period`]; the same figures, slower).
    pub every_period: bool,
    /// Stop when raised ([`crate::engine::RunOptions::cancel`]).
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Play every rank in one event loop, even where they meet only at barriers and could
    /// be played one by one ([`crate::engine::by_rank`]; the same figures, slower): what
    /// the test of the rank-by-rank runner compares with.
    pub one_loop: bool,
    /// Tasks that must not start, in the run's numbering (classes in order, then the extra
    /// programs): [`crate::engine::RunOptions::held`]. The run is played in one loop.
    pub held: Vec<u32>,
}

impl Mode {
    pub fn every_period(every_period: bool) -> Mode {
        Mode { every_period, ..Default::default() }
    }
}

/// Plays `job` with the allocator of `settings` capped at `capacity` on each class's
/// device (`device_total`: the GPU's whole memory, for the allocator's own accounting),
/// keeping what `record` says. `steps` is the number of steps the job's programs were
/// compiled for at most.
pub fn run(
    job: &Job,
    settings: &AllocatorSettings,
    capacity: u64,
    device_total: u64,
    steps: u32,
    record: Record,
    mode: Mode,
) -> Result<JobRun, Deadlock> {
    let opts = RunOptions { replay_by_device: true, ..options(job, settings, record, mode.clone()) };
    let parts = job.parts();
    let mut apart = None;
    if !mode.one_loop && opts.held.is_empty() && engine::by_rank::applies(&parts, &job.links, job.classes.len(), &opts)
    {
        let mut allocs = allocators(job, settings, capacity, device_total);
        apart = engine::by_rank::run(&parts, &job.links, &mut refs(&mut allocs), &opts);
    }
    let by_rank = apart.is_some();
    let mut played_again = false;
    let dt = match apart {
        Some(dt) => dt,
        None => {
            let mut allocs = allocators(job, settings, capacity, device_total);
            let dt = engine::run_parts(&parts, &job.links, &mut refs(&mut allocs), &opts)?;
            if dt.oom_out_of_order {
                // Out of memory inside a jump replayed device by device: again, in order.
                let opts = RunOptions { replay_by_device: false, ..opts };
                played_again = true;
                let mut allocs = allocators(job, settings, capacity, device_total);
                engine::run_parts(&parts, &job.links, &mut refs(&mut allocs), &opts)?
            } else {
                dt
            }
        }
    };
    Ok(JobRun { played_again, ..job_run(job, dt, steps, by_rank) })
}

/// How far [`run_until`] got.
pub enum Progress {
    Done(JobRun),
    /// Paused after the task it was asked to stop after ([`engine::Paused`]), with the
    /// allocators it used.
    Paused(Paused),
}

/// A job's run paused after a task, to be carried on over a job whose programs extend this
/// one's ([`resume`]).
pub struct Paused {
    engine: Box<engine::Paused>,
    allocs: Vec<Box<dyn Allocator>>,
}

/// [`run`], in one event loop, pausing after task `stop_after` (in the run's numbering) ends
/// ([`engine::RunOptions::stop_after`]).
#[allow(clippy::too_many_arguments)]
pub fn run_until(
    job: &Job,
    settings: &AllocatorSettings,
    capacity: u64,
    device_total: u64,
    steps: u32,
    record: Record,
    mode: Mode,
    stop_after: u32,
) -> Result<Progress, Deadlock> {
    let opts = RunOptions { stop_after: Some(stop_after), ..options(job, settings, record, mode) };
    let mut allocs = allocators(job, settings, capacity, device_total);
    let progress = engine::run_parts_until(&job.parts(), &job.links, &mut refs(&mut allocs), &opts)?;
    Ok(progress_of(job, progress, allocs, steps))
}

/// Carries `paused` on over `job`, whose programs extend the paused run's, to its end or to
/// the end of task `stop_after`. None where the run so far is not `job`'s
/// ([`engine::Paused::resume`]): the caller runs `job` afresh.
pub fn resume(
    paused: Paused,
    job: &Job,
    settings: &AllocatorSettings,
    steps: u32,
    record: Record,
    mode: Mode,
    stop_after: Option<u32>,
) -> Option<Result<Progress, Deadlock>> {
    let opts = RunOptions { stop_after, ..options(job, settings, record, mode) };
    let Paused { engine, mut allocs } = paused;
    let progress = engine.resume(&job.parts(), &job.links, &mut refs(&mut allocs), &opts)?;
    Some(progress.map(|p| progress_of(job, p, allocs, steps)))
}

fn progress_of(job: &Job, p: engine::Progress, allocs: Vec<Box<dyn Allocator>>, steps: u32) -> Progress {
    match p {
        engine::Progress::Done(dt) => Progress::Done(job_run(job, dt, steps, false)),
        engine::Progress::Paused(engine) => Progress::Paused(Paused { engine, allocs }),
    }
}

/// The engine's options for `job`: the `empty_cache()` calls the program and `settings`
/// make, and what `record` and `mode` ask for.
fn options(job: &Job, settings: &AllocatorSettings, record: Record, mode: Mode) -> RunOptions {
    let mut empty_cache_after = Vec::new();
    let mut offset = 0;
    for c in &job.classes {
        let prog = &c.schedule.program;
        let mut own = empty_cache_tasks(prog, &c.schedule.labels, &settings.empty_cache);
        own.extend_from_slice(&prog.empty_cache_after);
        own.sort_unstable();
        own.dedup();
        empty_cache_after.extend(own.into_iter().map(|t| t + offset));
        offset += prog.tasks.len() as u32;
    }
    RunOptions {
        empty_cache_after,
        peaks_only: matches!(record, Record::Peaks | Record::Headline),
        headline: record == Record::Headline,
        history: record == Record::History,
        every_period: mode.every_period,
        cancel: mode.cancel,
        held: mode.held,
        stop_after: None,
        replay_by_device: false,
    }
}

/// An allocator per class's device.
fn allocators(job: &Job, settings: &AllocatorSettings, capacity: u64, device_total: u64) -> Vec<Box<dyn Allocator>> {
    job.classes.iter().map(|_| settings.build(capacity, device_total)).collect()
}

fn refs(allocs: &mut [Box<dyn Allocator>]) -> Vec<&mut dyn Allocator> {
    allocs.iter_mut().map(|a| &mut **a as &mut dyn Allocator).collect()
}

/// Each class's view of the engine's trace, and each step's span.
fn job_run(job: &Job, dt: engine::DeviceTrace, steps: u32, by_rank: bool) -> JobRun {
    let parts = job.parts();
    let spans = step_spans(job, &dt, steps);
    let periods_jumped = dt.periods_jumped;
    let traces = engine::part_traces(&parts, job.classes.len(), dt);
    JobRun { traces, spans, periods_jumped, by_rank, played_again: false }
}

/// Each step's span across all classes (their tasks numbered one class after the other).
fn step_spans(job: &Job, dt: &engine::DeviceTrace, steps: u32) -> Vec<(u64, u64)> {
    let mut spans = vec![(u64::MAX, 0u64); steps as usize];
    let mut offset = 0;
    for c in &job.classes {
        let n = c.schedule.program.tasks.len();
        let (start, end) = (&dt.start_ns[offset..offset + n], &dt.end_ns[offset..offset + n]);
        step_extents(&c.schedule, start, end, &mut spans);
        offset += n;
    }
    spans
}

/// Widens `spans[s - 1]` (step s's first start, last end) by the tasks of each step s >= 1
/// of `sched` that ran (`start` and `end` are its tasks' times; an end of u64::MAX: not
/// run). A program whose steps are ranges ([`crate::engine::Program::step_starts`]) is read
/// range by range, the others task by task through their labels.
pub(crate) fn step_extents(sched: &crate::schedule::Schedule, start: &[u64], end: &[u64], spans: &mut [(u64, u64)]) {
    let mut widen = |step: usize, i: usize| {
        if step >= 1 && end[i] != u64::MAX {
            if let Some(sp) = spans.get_mut(step - 1) {
                sp.0 = sp.0.min(start[i]);
                sp.1 = sp.1.max(end[i]);
            }
        }
    };
    let prog = &sched.program;
    if prog.step_starts.is_empty() {
        for (i, t) in prog.tasks.iter().enumerate() {
            widen(sched.labels[t.label as usize].step as usize, i);
        }
    } else {
        for s in 1..prog.step_starts.len() {
            for i in prog.step_range(s) {
                widen(s, i);
            }
        }
    }
}

/// The tasks after which the program calls `torch.cuda.empty_cache()`: the last task of
/// initialisation; the last forward (backward) op of each micro-batch; each
/// `optimizer.step()`; the `zero_grad()` that ends each step.
pub fn empty_cache_tasks(prog: &Program, labels: &[TaskLabel], points: &[EmptyCacheAt]) -> Vec<u32> {
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
