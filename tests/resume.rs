//! A run paused where a program prefix's gate ends and carried on over the longer program
//! ([`stepsim::engine::Paused::resume`], [`stepsim::job::run::resume`]) is the longer
//! program's run from the start: every task's start and end, every memory sample of every
//! device, the allocator's counters and history. The sweeps' unpipelined configurations pause
//! at each prefix they try and carry the run on, where they used to run every prefix again
//! from the start.

use std::path::PathBuf;

mod common;

use stepsim::job::run::{self, JobRun, Mode, Progress, Record};
use stepsim::scenario::Scenario;
use stepsim::schedule::{build_lean_staged, Stage, Staged};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped unpipelined scenarios without `[jitter]` or uneven routing (one program for
/// every rank), and variants covering gradient accumulation, selective recomputation,
/// DeepSpeed, hybrid sharding and DDP.
fn cases() -> Vec<Scenario> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    for p in paths {
        let s = Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
        let loads = s.expert_loads();
        let one = stepsim::job::one_program(s.parallel.model_parallel.pipeline, s.jitter.is_some(), loads.as_deref());
        if one && s.inference.is_none() {
            out.push(s);
        }
    }
    out.extend(common::schedule_variants(&root()));
    out
}

/// `run` without the count of periods replayed (a run carried on from a pause replays only
/// the periods none of whose tasks had run).
fn figures(mut run: JobRun) -> JobRun {
    run.periods_jumped = 0;
    run
}

#[test]
fn a_run_carried_on_from_each_prefix_is_the_whole_programs_run() {
    let (mut carried, mut afresh, mut checked) = (0, 0, 0);
    for s in cases() {
        let dag = stepsim::model::build(&s.model, &s.workload);
        let plan = std::sync::Arc::new(stepsim::plan::Plan::new(
            &dag,
            s.parallel.clone(),
            s.training.clone(),
            u64::from(s.cluster.gpus),
            u64::from(s.cluster.gpus_per_node),
        ));
        let steps = plan.training.steps;
        // Every sample of the curve, on a device big enough that nothing runs out of memory
        // (an out-of-memory ends the run before any pause), and again with the allocator's
        // history.
        for record in [Record::Curve, Record::History] {
            let (capacity, device) = (u64::MAX / 8, u64::MAX / 8);
            let settings = &s.allocator;
            let mut paused: Option<run::Paused> = None;
            let mut pauses = 0;
            let stages = [Stage::Steps(0), Stage::FirstForward, Stage::Steps(1)];
            let staged = build_lean_staged(&dag, &plan, &s.cluster, &stages, |prefix| {
                let gate = prefix.gate.unwrap_or(prefix.schedule.program.tasks.len() as u32 - 1);
                let job = stepsim::job::of_replicas(plan.clone(), prefix.schedule);
                let progress = match paused.take() {
                    Some(p) => match run::resume(p, &job, settings, steps, record, Mode::default(), Some(gate)) {
                        Some(progress) => {
                            carried += 1;
                            progress
                        }
                        None => {
                            afresh += 1;
                            run::run_until(&job, settings, capacity, device, steps, record, Mode::default(), gate)
                        }
                    },
                    None => run::run_until(&job, settings, capacity, device, steps, record, Mode::default(), gate),
                };
                match progress.unwrap_or_else(|e| panic!("{}: {e}", s.name)) {
                    Progress::Paused(p) => {
                        pauses += 1;
                        paused = Some(p);
                        None
                    }
                    Progress::Done(_) => Some(()),
                }
            });
            let Staged::Whole(whole) = staged else { panic!("{}: a prefix ran to the program's end", s.name) };
            assert!(pauses >= 2, "{}: {pauses} pauses", s.name);
            let job = stepsim::job::of_replicas(plan.clone(), *whole);
            let fresh = run::run(&job, settings, capacity, device, steps, record, Mode::default()).unwrap();
            let p = paused.take().expect("the last prefix paused");
            let Some(progress) = run::resume(p, &job, settings, steps, record, Mode::default(), None) else {
                afresh += 1;
                continue;
            };
            carried += 1;
            let Ok(Progress::Done(resumed)) = progress else { panic!("{}: the resumed run did not end", s.name) };
            assert!(resumed.traces[0].end_ns.iter().all(|&e| e != u64::MAX), "{}: a task never ran", s.name);
            assert_eq!(figures(resumed), figures(fresh), "{} ({record:?})", s.name);
            checked += 1;
        }
    }
    println!("{checked} whole runs compared; {carried} runs carried on from a pause, {afresh} run afresh");
    assert!(checked >= 12, "{checked} runs compared");
    // Carrying on is the rule, not the exception: a fallback is for programs that file a free
    // under a task that has already ended.
    assert!(afresh * 10 <= carried, "{afresh} runs afresh against {carried} carried on");
}

#[test]
fn a_run_is_not_carried_on_over_a_program_that_changed_what_already_ran() {
    use stepsim::engine::{
        run_parts, run_parts_until, BufferSpec, Paused, Program, Progress as P, RunOptions, Task, TASK_STREAM,
    };
    use stepsim::memory::{Allocator, Category, ExactAllocator};
    let buf = |bytes| BufferSpec { bytes, category: Category::Activations, name: 0, pool: TASK_STREAM };
    // compute: a (allocates 0) -> gate; comm: c (after the gate, allocates 1, frees 0).
    let program = |tasks: usize, free_under_a: bool| {
        let mut p = Program { streams: vec!["compute".into(), "comm".into()], ..Default::default() };
        std::sync::Arc::make_mut(&mut p.buffers).extend([buf(1024), buf(2048)]);
        let a_frees: &[u32] = if free_under_a { &[1] } else { &[] };
        p.push_task(Task { stream: 0, duration_ns: 10, ..Default::default() }, &[], &[0], a_frees);
        p.push_task(Task { stream: 0, duration_ns: 5, ..Default::default() }, &[0], &[], &[]);
        if tasks > 2 {
            p.push_task(Task { stream: 1, duration_ns: 20, ..Default::default() }, &[1], &[1], &[0]);
        }
        p
    };
    let pause = |p: &Program, a: &mut ExactAllocator| -> Box<Paused> {
        let opts = RunOptions { stop_after: Some(1), ..Default::default() };
        match run_parts_until(&[p], &[], &mut [a as &mut dyn Allocator], &opts).unwrap() {
            P::Paused(p) => p,
            P::Done(_) => panic!("the prefix ran out"),
        }
    };
    let (prefix, whole) = (program(2, false), program(3, false));
    let mut a = ExactAllocator::new(1 << 20);
    let paused = pause(&prefix, &mut a);
    let Some(Ok(P::Done(resumed))) =
        paused.resume(&[&whole], &[], &mut [&mut a as &mut dyn Allocator], &RunOptions::default())
    else {
        panic!("not carried on")
    };
    let fresh = run_parts(
        &[&whole],
        &[],
        &mut [&mut ExactAllocator::new(1 << 20) as &mut dyn Allocator],
        &RunOptions::default(),
    )
    .unwrap();
    assert_eq!(resumed, fresh);
    assert_eq!((resumed.start_ns.clone(), resumed.end_time_ns), (vec![0, 10, 15], 35));
    // The longer program frees a buffer under a task that had already ended when the run
    // paused: the run so far is not its own, and is not carried on.
    let changed = program(3, true);
    let mut a = ExactAllocator::new(1 << 20);
    let paused = pause(&prefix, &mut a);
    assert!(paused.resume(&[&changed], &[], &mut [&mut a as &mut dyn Allocator], &RunOptions::default()).is_none());
}
