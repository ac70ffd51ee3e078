//! What a sweep keeps of one simulation: the verdict, where it ran out of memory, the peak,
//! and the steady-state throughput. Everything else (timelines, schedules, names) is dropped
//! as soon as the row is formatted, so a sweep's memory does not grow with its length.

use std::cell::RefCell;
use std::rc::Rc;

use crate::engine::Deadlock;
use crate::job::run::JobRun;
use crate::job::Job;
use crate::model::{LayerDag, ModelConfig, Workload};
use crate::report::{Report, Verdict};
use crate::scenario::Scenario;
use crate::schedule::Phase;

/// Where a configuration ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OomAt {
    pub step: u32,
    pub phase: Phase,
    pub layer: Option<u64>,
}

/// Steady-state throughput of a configuration that fits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
}

/// One configuration's result, as the report states it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub oom: Option<OomAt>,
    pub gpus: u64,
    pub tokens_per_step: u64,
    /// Highest allocated / reserved bytes per GPU (up to the OOM instant when it does not fit).
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// What the allocator may use (device memory less what lives outside it).
    pub capacity: u64,
    pub throughput: Option<Rate>,
}

impl Outcome {
    /// The figures of a report (from [`crate::simulate`] or [`crate::simulate_lean`]).
    pub fn from_report(r: &Report, s: &Scenario) -> Outcome {
        let oom = match &r.verdict {
            // Offloaded state the node cannot hold fails at initialisation.
            Verdict::Fits { .. } if !r.offload_fits => Some(OomAt { step: 0, phase: Phase::Init, layer: None }),
            Verdict::Fits { .. } => None,
            Verdict::Oom(o) => Some(OomAt { step: o.at.step, phase: o.at.phase, layer: o.at.layer }),
        };
        Outcome {
            oom,
            gpus: u64::from(s.cluster.gpus),
            tokens_per_step: s.tokens_per_step(),
            peak_allocated: r.peak.as_ref().map_or(0, |p| p.allocated.bytes),
            peak_reserved: r.peak.as_ref().map_or(0, |p| p.reserved.bytes),
            capacity: r.capacity.bytes,
            throughput: r.throughput.as_ref().filter(|_| oom.is_none()).map(|t| Rate {
                step_time_s: t.step_time_s,
                tokens_per_s: t.tokens_per_s,
                mfu: t.mfu,
            }),
        }
    }
}

impl Outcome {
    /// The same figures as [`Outcome::from_report`] of the run's report, without building
    /// the report (its text, assumptions, breakdowns and largest tensors were a tenth of a
    /// 100B sweep's time): the headline class by the report's rule
    /// ([`crate::report::job::headline`]), its verdict and peaks, and the step time as the
    /// report takes it (a job of several classes: the last step the headline ran, timed over
    /// every class's tasks, from the end of the step before).
    pub fn of_run(s: &Scenario, job: &Job, run: &JobRun) -> Outcome {
        use crate::report::job::{headline, ClassFigures};
        let h = match job.classes.len() {
            1 => 0,
            _ => {
                headline(&job.classes.iter().zip(&run.traces).map(|(c, t)| ClassFigures::of(c, t)).collect::<Vec<_>>())
            }
        };
        let (class, trace) = (&job.classes[h], &run.traces[h]);
        let node = u64::from(s.cluster.gpus_per_node);
        let offload_fits = job.classes.iter().all(|c| c.plan.offload_fits(node) == (true, true));
        let oom = match &trace.oom {
            Some(o) => {
                let l = &class.schedule.labels[class.schedule.program.tasks[o.task as usize].label as usize];
                Some(OomAt { step: l.step, phase: l.phase, layer: l.layer() })
            }
            // Offloaded state the node cannot hold fails at initialisation.
            None if !offload_fits => Some(OomAt { step: 0, phase: Phase::Init, layer: None }),
            None => None,
        };
        let (peak_allocated, peak_reserved) = trace.timeline.peak_bytes().unwrap_or_default();
        let tokens = s.tokens_per_step();
        let throughput = match oom {
            Some(_) => None,
            // The last step, timed over every class from the end of the step before, as the
            // report times it: with nothing out of memory every class ran every step, so the
            // headline's last step is the run's.
            None => run
                .spans
                .iter()
                .rposition(|s| s.0 != u64::MAX)
                .and_then(|k| crate::report::job::job_step_span(&run.spans, k))
                .map(|(start, end)| {
                    let step_time_s = end.saturating_sub(start) as f64 / 1e9;
                    Rate {
                        step_time_s,
                        tokens_per_s: tokens as f64 / step_time_s,
                        mfu: crate::report::round4(crate::report::utilisation(
                            s,
                            &job.classes[0].plan,
                            class.schedule.model_flops_per_step,
                            step_time_s,
                        )),
                    }
                }),
        };
        Outcome {
            oom,
            gpus: u64::from(s.cluster.gpus),
            tokens_per_step: tokens,
            peak_allocated,
            peak_reserved,
            capacity: s.allocator_capacity(),
            throughput,
        }
    }

    /// What a sweep row must satisfy before it is written (the figures it prints; see
    /// [`crate::report::invariants`] for a whole report's).
    pub fn check(&self) -> Result<(), String> {
        if self.peak_allocated > self.peak_reserved {
            return Err(format!(
                "peak allocated {} B is above peak reserved {} B",
                self.peak_allocated, self.peak_reserved
            ));
        }
        if self.oom.is_none() && self.peak_reserved > self.capacity {
            return Err(format!("fits with {} B reserved, above capacity {} B", self.peak_reserved, self.capacity));
        }
        if let Some(t) = self.throughput {
            let ok = |x: f64| x.is_finite() && x >= 0.0;
            if !(ok(t.step_time_s) && t.step_time_s > 0.0 && ok(t.tokens_per_s) && ok(t.mfu)) {
                return Err(format!(
                    "throughput: step {} s, {} tokens/s, MFU {}",
                    t.step_time_s, t.tokens_per_s, t.mfu
                ));
            }
        }
        Ok(())
    }
}

/// DAGs recently built on this thread: configurations share the model and the micro-batch
/// shape, and building the DAG is a tenth of a simulation. A sweep cycles through its shapes
/// (the 100B bench sweep through 25 micro-batch x sequence pairs for every GPU count), and a
/// cache smaller than the cycle missed every time: at 8, building DAGs was a third of a
/// configuration that ran out of memory at initialisation.
const DAG_CACHE: usize = 32;

/// What a DAG is built from.
type DagKey = (ModelConfig, Workload);

thread_local! {
    static DAGS: RefCell<Vec<(DagKey, Rc<LayerDag>)>> = const { RefCell::new(Vec::new()) };
}

fn dag_for(s: &Scenario) -> Rc<LayerDag> {
    DAGS.with(|c| {
        let w = s.dag_workload();
        let make = || ((s.model.clone(), w.clone()), Rc::new(crate::model::build(&s.model, &w)));
        crate::recent::recall(&mut c.borrow_mut(), DAG_CACHE, |(m, x)| *m == s.model && *x == w, make)
    })
}

thread_local! {
    /// On this thread, configurations that ran out of memory in step 1's first forward, in
    /// the rest of step 1, and those that got past step 1: which prefixes pay.
    static STEP1: std::cell::Cell<(u64, u64, u64)> = const { std::cell::Cell::new((0, 0, 0)) };
}

/// Simulates one configuration for a sweep.
///
/// The program prefixes tried first (see [`crate::simulate_lean`]), by what they cost and
/// save on an unpipelined program, which is built once whatever is tried, its run paused at
/// each prefix's gate and carried on from there (a prefix that does not answer costs a copy
/// of the program so far and the pause, about 4% of a fitting configuration each: 360
/// fitting 100B configurations took 1.07 times as long trying all three as the binary before
/// the pause, which tried only initialisation on them after the first):
/// - initialisation alone, always: cheap, and where DDP and ZeRO-1 runs of large models stop;
/// - step 1's first forward while, on this thread, at least a quarter as many configurations
///   have run out of memory there as later: an answer saves building and running the rest;
/// - step 1 while at least half as many configurations have run out of memory in its
///   backward or optimizer as got past it: an answer saves the second step's build and run.
///
/// A pipeline (without `[jitter]` or uneven routing) is built once too, every stage in
/// lockstep ([`crate::schedule::pipeline::build_staged`]). Instead of the first forward it
/// tries step 1 cut after the first stage's warm-up, first backward and one slot more
/// ([`crate::schedule::pipeline::fill_slots`]), while at least an eighth as many
/// configurations have run out of memory in step 1 as got past it. On the GPT-3 3D sweep's
/// shard 1/20 (one job) it answered every step-1 forward and backward OOM, 58 of 131
/// configurations, in 6 and 20 ms on average where a fitting configuration takes 240 ms (two
/// such configurations timed alone went from 60 to 10-15 ms and from 150-215 to 10 ms). A
/// configuration that tries the cut and fits pays for the cut's short run and for building
/// its stages in lockstep rather than one by one (their builders alive at once); one that
/// does not try it is built stage by stage.
///
/// Either way the outcome is the full program's; only the time differs. The prefixes of a
/// pipeline under `[jitter]` or uneven routing are built apart and have no cut within a step:
/// step 1 is tried while more than three times as many configurations have run out of memory
/// in it as got past it, so not before one has. The whole program's run stops at its OOM too,
/// so a step-1 prefix that answers saves only the second step's build (about a sixth of such a
/// configuration's cost), where one that does not costs the first step's build and run again
/// (about half): measured on the GPT-3 3D sweep, where about as many configurations fail in
/// step 1 as pass it, trying it there was 8% slower than not. With nothing seen yet a failure
/// is no likelier than a pass, so the first configuration on a thread does not try it: a
/// sweep of one `[jitter]` configuration at 256 ranks paid half again its whole run for the
/// prefix. A plain pipeline tries step 1 by the same rule: though it is built once, a step-1
/// prefix that does not answer still costs the step's run, more than the second step's build
/// that an answer saves.
pub fn simulate(s: &Scenario) -> Result<Outcome, Deadlock> {
    use crate::schedule::Stage::{FirstForward, Slots, Steps};
    let dag = dag_for(s);
    let (forward, rest, past) = STEP1.with(|c| c.get());
    let loads = s.expert_loads();
    let pipelined =
        crate::job::plain_pipeline(s.parallel.model_parallel.pipeline, s.jitter.is_some(), loads.as_deref());
    let mut early = vec![Steps(0)];
    if pipelined {
        if 8 * (forward + rest) >= past {
            early.push(Slots(crate::schedule::pipeline::fill_slots(&s.parallel, s.training.grad_accum)));
        }
    } else if 4 * forward >= rest + past {
        early.push(FirstForward);
    }
    // Where an unpipelined program is built once, the first forward's prefix catches the
    // forward's OOMs first.
    let built_once = crate::job::one_program(s.parallel.model_parallel.pipeline, s.jitter.is_some(), loads.as_deref());
    let tried = if built_once { 2 * rest >= past } else { forward + rest > 3 * past };
    if tried {
        early.push(Steps(1));
    }
    // Sweeps refuse inference bases; this keeps the function total.
    let o = match s.inference {
        Some(_) => Outcome::from_report(&crate::simulate_lean(s, &dag, &early)?, s),
        None => crate::simulate_lean_with(s, &dag, &early, crate::job::run::Record::Headline, |job, run| {
            Outcome::of_run(s, job, run)
        })?,
    };
    STEP1.with(|c| {
        let (f, r, p) = c.get();
        match o.oom {
            Some(at) if at.step == 0 => {}
            Some(at) if at.step == 1 && at.phase == Phase::Forward => c.set((f + 1, r, p)),
            Some(at) if at.step == 1 => c.set((f, r + 1, p)),
            _ => c.set((f, r, p + 1)),
        }
    });
    Ok(o)
}

/// [`simulate`] without trying program prefixes first (for tests: the outcomes must agree).
pub fn simulate_whole(s: &Scenario) -> Result<Outcome, Deadlock> {
    let dag = dag_for(s);
    let report = crate::simulate_lean(s, &dag, &[])?;
    Ok(Outcome::from_report(&report, s))
}
