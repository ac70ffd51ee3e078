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

/// (start, end) in ns of every task of `kind` in a class's program.
fn spans(c: &stepsim::ClassSim, kind: TaskKind) -> Vec<(u64, u64)> {
    let s = c.schedule;
    (0..s.program.tasks.len())
        .filter(|&i| s.labels[s.program.tasks[i].label as usize].kind == kind)
        .map(|i| (c.trace.start_ns[i], c.trace.end_ns[i]))
        .collect()
}

/// The end of the last task of `kind`, ns.
fn last_end(c: &stepsim::ClassSim, kind: TaskKind) -> u64 {
    spans(c, kind).iter().map(|x| x.1).max().unwrap()
}

/// The start of the first task of `kind`, ns.
fn first_start(c: &stepsim::ClassSim, kind: TaskKind) -> u64 {
    spans(c, kind).iter().map(|x| x.0).min().unwrap()
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

/// FSDP over each stage's data-parallel ranks (torchtitan's FSDP + PP): the stage all-gathers
/// each of its units once per step and keeps it gathered across micro-batches
/// (`reshard_after_forward` defaults to false with a pipeline), accumulates unsharded
/// gradients without syncing (`torch.distributed.pipelining`: `set_requires_gradient_sync
/// (False)` until the last backward) and reduce-scatters each unit once, after the stage's
/// last backward.
#[test]
fn fsdp_on_a_pipeline_gathers_and_reduces_each_unit_once_per_step() {
    let zero1 = stepsim::simulate(&pipelined("sharding = \"zero1\"", "")).unwrap();
    let fsdp = stepsim::simulate(&pipelined("sharding = \"full_shard\"", "")).unwrap();
    for (k, c) in fsdp.classes().enumerate() {
        let s = c.schedule;
        let kinds: Vec<TaskKind> = s.program.tasks.iter().map(|t| s.labels[t.label as usize].kind).collect();
        let units = c.class.plan.units.iter().filter(|u| u.shard_params > 0).count();
        let gathers = kinds.iter().filter(|&&x| x == TaskKind::AllGather).count();
        let reduces = kinds.iter().filter(|&&x| x == TaskKind::ReduceScatter).count();
        assert_eq!(gathers, units, "stage {k}: one all-gather per unit per step, not one per micro-batch");
        assert_eq!(reduces, units, "stage {k}: one reduce-scatter per unit per step");
        let all_reduces: Vec<&str> = s
            .program
            .tasks
            .iter()
            .map(|t| &s.labels[t.label as usize])
            .filter(|l| l.kind == TaskKind::AllReduce)
            .map(|l| l.what.as_str())
            .collect();
        assert!(
            all_reduces.iter().all(|w| w.contains("tied embedding")),
            "stage {k}: no data-parallel all-reduce besides FSDP's: {all_reduces:?}"
        );
        let last_backward = last_end(&c, TaskKind::Backward);
        assert!(
            first_start(&c, TaskKind::ReduceScatter) >= last_backward,
            "stage {k}: gradients reduced after the last backward"
        );
    }
    // At rest a stage holds half its parameters (data parallel 2 shards them); ZeRO-1 holds
    // them all.
    let at_rest = |s: &stepsim::Simulation| s.report.model_state_per_gpu.parameters.bytes;
    assert_eq!(at_rest(&zero1), 2 * at_rest(&fsdp));
    // At the peak the stage has all of them gathered, and its unsharded gradients (plus the
    // one op's gradient being accumulated into them).
    let peak = fsdp.report.peak.as_ref().unwrap();
    let cat = |key: &str| peak.breakdown.iter().find(|b| b.category == key).map_or(0, |b| b.size.bytes) as f64;
    let full = at_rest(&zero1) as f64;
    assert!((cat("gathered_parameters") / full - 1.0).abs() < 0.01, "{:?}", peak.breakdown);
    let grads = cat("unsharded_gradients") / full;
    assert!((1.0..1.1).contains(&grads), "{grads:.3} x the stage's parameters: {:?}", peak.breakdown);
    // The same under [jitter]: every rank's FSDP collectives wait for all ranks of its stage.
    let jittered =
        stepsim::simulate(&pipelined("sharding = \"full_shard\"", "[jitter]\nseed = 2\ncompute_cv = 0.05\n")).unwrap();
    assert_eq!(jittered.job.classes.len(), 8);
    assert!(step_time(&jittered) > step_time(&fsdp));
}

#[test]
fn deepspeed_zero3_on_a_pipeline_is_refused_with_the_reason() {
    let toml = "[model]\nfamily = \"gpt\"\nn_layers = 16\nhidden = 1024\nn_heads = 16\nvocab = 1024\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 8\n[parallel]\npipeline = 4\nsharding = \"zero3\"\nframework = \"deepspeed\"\n\
         [training]\nmicro_batch = 2\nseq_len = 1024\ngrad_accum = 8\n";
    let e = Scenario::from_toml(Path::new("<ds pp>"), toml).unwrap_err().to_string();
    assert!(e.contains("parallel.sharding") && e.contains("PipelineEngine"), "{e}");
}

/// FSDP CPU offload on each pipeline stage: the stage fetches each unit's parameter partition
/// from the host once per step (it stays gathered across the micro-batches) and copies each
/// unit's reduced gradient partition to the host once, after its last backward, where the
/// same offload without a pipeline copies once per micro-batch.
#[test]
fn offload_on_a_pipeline_moves_each_partition_once_per_step() {
    let off = stepsim::simulate(&pipelined("sharding = \"full_shard\"", "[offload]\nparameters = \"cpu\"\n")).unwrap();
    assert_eq!(off.job.classes.len(), 4);
    for (k, c) in off.classes().enumerate() {
        let s = c.schedule;
        let on = |name: &str| {
            let stream = s.program.streams.iter().position(|x| x == name).expect(name) as u16;
            s.program.tasks.iter().filter(|t| t.stream == stream).count()
        };
        let units = c.class.plan.units.iter().filter(|u| u.shard_params > 0).count();
        // Each unit's partition to the GPU once (the updated parameters stay on the host with
        // the optimizer: offload_params), each gradient partition to the host once.
        assert_eq!(on("h2d"), units, "stage {k}");
        assert_eq!(on("d2h"), units, "stage {k}");
    }
    let r = off.report.offload.as_ref().unwrap();
    let local = off.plan().local_total(true);
    assert_eq!(r.d2h_bytes_per_step.bytes, local * 4, "fp32 gradient partition once per step");
    assert!(r.host_fits && off.report.offload_fits);
    let base = stepsim::simulate(&pipelined("sharding = \"full_shard\"", "")).unwrap();
    assert!(step_time(&off) > step_time(&base), "PCIe copies and the CPU step cost time");
}
