//! Jobs of several rank classes (issue 16): combinations that only compile once every job is
//! a list of rank classes on one runner. Each test checks something only the combination
//! shows.

use std::path::Path;

use stepsim::job::Role;
use stepsim::scenario::Scenario;
use stepsim::schedule::TaskKind;

/// A 16-layer GPT on 8 A100s: pipeline 4 x data parallel 2, 1F1B over 8 micro-batches.
fn pipelined(parallel: &str, extra: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 16\nhidden = 1024\nn_heads = 16\nvocab = 1024\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 8\ngpus_per_node = 8\n\
         [parallel]\npipeline = 4\nschedule = \"1f1b\"\n{parallel}\n\
         [training]\nmicro_batch = 2\nseq_len = 1024\ngrad_accum = 8\nsteps = 1\nattention = \"flash\"\n{extra}"
    );
    Scenario::from_toml(Path::new("<rank classes>"), &toml).unwrap()
}

fn step_time(sim: &stepsim::Simulation) -> f64 {
    sim.report.throughput.as_ref().expect("fits").step_time_s
}

/// The end of the last task of `kind` in a class's program, ns.
fn last_end(c: &stepsim::ClassSim, kind: TaskKind) -> u64 {
    let s = c.schedule;
    (0..s.program.tasks.len())
        .filter(|&i| s.labels[s.program.tasks[i].label as usize].kind == kind)
        .map(|i| c.trace.end_ns[i])
        .max()
        .unwrap()
}

/// The start of the first task of `kind`, ns.
fn first_start(c: &stepsim::ClassSim, kind: TaskKind) -> u64 {
    let s = c.schedule;
    (0..s.program.tasks.len())
        .filter(|&i| s.labels[s.program.tasks[i].label as usize].kind == kind)
        .map(|i| c.trace.start_ns[i])
        .min()
        .unwrap()
}

#[test]
fn jitter_on_a_pipeline_simulates_every_rank_of_every_stage() {
    let base = stepsim::simulate(&pipelined("", "")).unwrap();
    assert_eq!(base.job.classes.len(), 4, "symmetric: one class per stage");
    // No noise, no straggler: the 4 x 2 ranks run exactly the stages' programs.
    let quiet = stepsim::simulate(&pipelined("", "[jitter]\nseed = 1\n")).unwrap();
    assert_eq!(quiet.job.classes.len(), 8);
    let roles: Vec<Role> = quiet.job.classes.iter().map(|c| c.role).collect();
    assert_eq!(roles[0], Role::Rank { stage: Some(0), rank: 0 });
    assert_eq!(roles[7], Role::Rank { stage: Some(3), rank: 1 });
    assert_eq!(quiet.job.classes[5].ranks(), "5", "stage 2's second data-parallel rank is GPU 5");
    assert_eq!(step_time(&quiet), step_time(&base), "the barriers and replicated links cost nothing");
    assert_eq!(quiet.report.peak.as_ref().unwrap().allocated.bytes, base.report.peak.as_ref().unwrap().allocated.bytes);
}

#[test]
fn a_straggler_on_one_stage_delays_the_other_stages_and_the_other_replica() {
    let base = stepsim::simulate(&pipelined("", "")).unwrap();
    let slow =
        stepsim::simulate(&pipelined("", "[jitter]\nseed = 1\nstragglers = 1\nstraggler_slowdown = 0.5\n")).unwrap();
    let classes: Vec<stepsim::ClassSim> = slow.classes().collect();
    let at = |stage: u64, rank: u64| {
        classes.iter().find(|c| c.class.role == Role::Rank { stage: Some(stage), rank }).expect("every rank is a class")
    };
    // The straggler (the job's first simulated rank: stage 0, data-parallel rank 0) computes
    // 50% longer than its data-parallel peer.
    let busy = |c: &stepsim::ClassSim| c.trace.stream_busy_ns[0] as f64;
    let ratio = busy(at(0, 0)) / busy(at(0, 1));
    assert!((ratio - 1.5).abs() < 0.01, "straggler's compute {ratio:.3} x its peer's");
    // Its slowness travels down its own pipeline: the last stage's replica 0 finishes its
    // backwards later than replica 1, which shares no stage with the straggler.
    let (r0, r1) = (last_end(at(3, 0), TaskKind::Backward), last_end(at(3, 1), TaskKind::Backward));
    assert!(r0 > r1, "stage 3: replica 0 ends its backwards at {r0} ns, replica 1 at {r1} ns");
    // And the data-parallel gradient all-reduce holds replica 1 back by exactly that: on
    // every stage it starts on both replicas once the later of the two has finished.
    for k in 0..4 {
        let (a, b) = (at(k, 0), at(k, 1));
        let ready = last_end(a, TaskKind::Backward).max(last_end(b, TaskKind::Backward));
        for c in [a, b] {
            let start = first_start(c, TaskKind::AllReduce);
            assert!(start >= ready, "stage {k}: all-reduce at {start} ns before both replicas are done ({ready} ns)");
        }
        assert_eq!(first_start(a, TaskKind::AllReduce), first_start(b, TaskKind::AllReduce), "stage {k}");
    }
    assert!(step_time(&slow) > step_time(&base) * 1.2, "{} vs {}", step_time(&slow), step_time(&base));
    // The report has a row per rank, each saying which stage and rank it is.
    assert_eq!(slow.report.rank_classes.len(), 8);
    assert!(slow.report.rank_classes[0].note.contains("data-parallel rank 0 of pipeline stage 0"));
}
