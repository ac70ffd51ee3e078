//! DeepSeek's DualPipe (`parallel.schedule = "dualpipe"`; deepseek-ai/DualPipe 3da1bbe
//! `dualpipe/dualpipe.py`): which stages a rank holds and so its parameters, the group its
//! gradients and optimizer state are spread over, both directions' micro-batches crossing
//! the pipeline, the deferred weight-gradient passes and what they keep alive, and the
//! configurations it refuses. A 16-layer GPT on 8 H100s (PP 4 x DP 2) keeps each case well
//! under a second.

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::schedule::Phase;

const LAYERS: u64 = 16;

fn toml(parallel: &str, training: &str) -> String {
    format!(
        "[model]\nfamily = \"gpt\"\nn_layers = {LAYERS}\nhidden = 2048\nn_heads = 16\nvocab = 32000\nmax_seq_len = 2048\ntie_embeddings = false\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\nnode = \"dgx-h100\"\n\
         [parallel]\n{parallel}\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n{training}\n"
    )
}

fn scenario(parallel: &str, training: &str) -> Scenario {
    Scenario::from_toml(Path::new("<dualpipe>"), &toml(parallel, training)).unwrap_or_else(|e| panic!("{e}"))
}

const MEGATRON: &str = "framework = \"megatron\"\npipeline = 4";
/// When rank `k`'s first forward kernel of micro-batch `mb` in step 1 starts, ns.
fn first_forward(sim: &stepsim::Simulation, k: usize, mb: u32) -> u64 {
    let sched = &sim.job.classes[k].schedule;
    let tasks = &sched.program.tasks;
    (0..tasks.len())
        .filter(|&i| {
            let l = &sched.labels[tasks[i].label as usize];
            let compute = sched.program.streams[tasks[i].stream as usize] == "compute";
            l.step == 1 && l.micro_batch == mb && l.phase == Phase::Forward && compute
        })
        .map(|i| sim.run.traces[k].start_ns[i])
        .min()
        .unwrap()
}

const DUALPIPE: &str = "framework = \"megatron\"\npipeline = 4\nschedule = \"dualpipe\"";

/// Rank k holds model stages k and p - 1 - k: the end ranks the embedding, the head and
/// their own two blocks' worth of layers, every rank twice the parameters of a 1F1B stage
/// on average; ZeRO-1 shards the optimizer over both copies' data-parallel ranks (4 here).
#[test]
fn each_rank_holds_two_mirrored_stages_and_shards_over_both_copies() {
    let s = scenario(&format!("{DUALPIPE}\nsharding = \"zero1\""), "grad_accum = 8");
    let sim = stepsim::simulate(&s).unwrap();
    let one = stepsim::simulate(&scenario(&format!("{MEGATRON}\nsharding = \"zero1\""), "grad_accum = 8")).unwrap();
    let params = |sim: &stepsim::Simulation, k: usize| sim.job.classes[k].plan.total_params();
    let blocks = |sim: &stepsim::Simulation, k: usize| -> Vec<(u64, u64)> {
        sim.job.classes[k].plan.chunks.iter().map(|c| (c.first_block, c.end_block)).collect()
    };
    assert_eq!(blocks(&sim, 0), [(0, 4), (12, 16)]);
    assert_eq!(blocks(&sim, 1), [(4, 8), (8, 12)]);
    assert_eq!(blocks(&sim, 3), [(12, 16), (0, 4)]);
    for k in 0..4 {
        // Stage k's and stage 3 - k's parameters, as 1F1B holds them on two ranks.
        assert_eq!(params(&sim, k), params(&one, k) + params(&one, 3 - k), "rank {k}");
        let plan = &sim.job.classes[k].plan;
        assert_eq!(plan.shard_group, 4, "two data-parallel ranks x two copies");
        // Adam's two moments and the master, fp32: 12 bytes per element of a quarter of the
        // rank's parameters (each unit split over 4 ranks, rounded up).
        let st = plan.model_state();
        let quarter = plan.total_params() as f64 * 12.0 / 4.0;
        let units = plan.units.len() as f64;
        assert!(((st.optimizer_state + st.master_weights) as f64 - quarter).abs() <= units * 12.0, "rank {k}");
    }
    // The end ranks hold the embedding and the head once: no tied copy, no embedding group.
    let root = |sim: &stepsim::Simulation, k: usize| sim.job.classes[k].plan.units[0].params;
    assert_eq!(root(&sim, 0), root(&one, 0) + root(&one, 3));
}

/// Every rank runs each micro-batch of both directions forward and backward once per chunk;
/// the forward direction's micro-batch 0 starts on rank 0 and reaches rank 3 later, the
/// reverse direction's first micro-batch the other way round.
#[test]
fn both_directions_cross_the_pipeline() {
    let m = 8u32;
    let sim = stepsim::simulate(&scenario(DUALPIPE, &format!("grad_accum = {m}"))).unwrap();
    let fwd: Vec<u64> = (0..4).map(|k| first_forward(&sim, k, 0)).collect();
    let rev: Vec<u64> = (0..4).map(|k| first_forward(&sim, k, m / 2)).collect();
    assert!(fwd.windows(2).all(|w| w[0] < w[1]), "forward direction {fwd:?}");
    assert!(rev.windows(2).all(|w| w[0] > w[1]), "reverse direction {rev:?}");
    for k in 0..4 {
        let sched = &sim.job.classes[k].schedule;
        for mb in 0..m {
            // Each micro-batch's forward on this rank: one chunk (one stage) of it.
            let n = sched
                .labels
                .iter()
                .filter(|l| {
                    l.step == 1 && l.micro_batch == mb && l.phase == Phase::Forward && l.what.ends_with("attn.c_attn")
                })
                .count();
            assert_eq!(n as u64, LAYERS / 4, "rank {k} micro-batch {mb}");
        }
    }
}

/// A zero-bubble backward runs its input-gradient GEMMs and leaves the weight-gradient
/// GEMMs for a `W` pass: as many deferred GEMMs as GEMMs in the deferred chunks, with the
/// same time in all as the backward would have taken; the step keeps every GEMM's work.
#[test]
fn deferred_weight_gradients_run_in_w_passes() {
    let m = 8u64;
    let sim = stepsim::simulate(&scenario(DUALPIPE, &format!("grad_accum = {m}"))).unwrap();
    for k in 0..4u64 {
        let sched = &sim.job.classes[k as usize].schedule;
        let step1 = |pre: &str, suffix: &str| {
            sched.labels.iter().filter(|l| l.step == 1 && l.what.starts_with(pre) && l.what.ends_with(suffix)).count()
        };
        let h = k.min(3 - k);
        // Deferred backwards: phases 3 and 7 run P - h - 1 each (P = 2), phase 6 h + 1;
        // each defers its blocks' four GEMMs with weights (c_attn, the attention's output
        // projection, c_fc, c_proj), the end ranks' reverse chunk its LM head's too.
        let deferred = (2 * (2 - h - 1) + h + 1) as usize;
        let per_chunk = 4 * (LAYERS / 4) as usize;
        assert_eq!(step1("layers.", "(weight grad, deferred)"), deferred * per_chunk, "rank {k}");
        assert_eq!(step1("", "(weight grad, deferred)"), step1("", "(input grad)"), "rank {k}");
    }
    // The same GEMM work as 1F1B over the pipeline's ranks in each step, only moved.
    let one = stepsim::simulate(&scenario(MEGATRON, &format!("grad_accum = {m}"))).unwrap();
    let flops = |s: &stepsim::Simulation| s.job.classes.iter().map(|c| c.schedule.hardware_flops_per_step).sum::<f64>();
    assert!((flops(&sim) / flops(&one) - 1.0).abs() < 1e-12, "{} vs {}", flops(&sim), flops(&one));
}

/// DualPipe's bubble, (p/2 - 1)(F&B + B - 3W) against 1F1B's (p - 1)(F + B), is the point:
/// the compute stream of every rank idles less. Its cost is memory: every stage's parameters
/// twice, and the middle ranks hold the inputs of the weight-gradient GEMMs they defer.
#[test]
fn a_smaller_bubble_for_more_memory() {
    let training = "grad_accum = 16";
    let dual = stepsim::simulate(&scenario(DUALPIPE, training)).unwrap();
    let one = stepsim::simulate(&scenario(MEGATRON, training)).unwrap();
    let idle = |s: &stepsim::Simulation| s.report.steps.last().unwrap().compute_idle_s;
    let step = |s: &stepsim::Simulation| s.report.throughput.as_ref().unwrap().step_time_s;
    let peak = |s: &stepsim::Simulation| s.report.peak.as_ref().unwrap().allocated.bytes;
    println!(
        "1F1B {:.1} ms (idle {:.1} ms, peak {:.2} GB); DualPipe {:.1} ms (idle {:.1} ms, peak {:.2} GB)",
        step(&one) * 1e3,
        idle(&one) * 1e3,
        peak(&one) as f64 / 1e9,
        step(&dual) * 1e3,
        idle(&dual) * 1e3,
        peak(&dual) as f64 / 1e9
    );
    assert!(idle(&dual) < 0.7 * idle(&one));
    assert!(step(&dual) < step(&one));
    assert!(peak(&dual) > peak(&one));
}

/// DualPipe's own asserts and what stepsim does not simulate with it, each naming the field.
#[test]
fn what_dualpipe_needs_is_refused_with_the_field_named() {
    let cases = [
        (
            "framework = \"megatron\"\npipeline = 1\nschedule = \"dualpipe\"",
            "grad_accum = 8",
            "parallel.pipeline",
            "even number of stages",
        ),
        (DUALPIPE, "grad_accum = 6", "training.grad_accum", "at least 2 x parallel.pipeline (8)"),
        (DUALPIPE, "grad_accum = 9", "training.grad_accum", "an even number"),
        (
            "framework = \"fsdp\"\nsharding = \"full_shard\"\npipeline = 4\nschedule = \"dualpipe\"",
            "grad_accum = 8",
            "parallel.schedule",
            "parallel.framework = \"megatron\"",
        ),
    ];
    for (parallel, training, field, says) in cases {
        let err = match Scenario::from_toml(Path::new("<dualpipe>"), &toml(parallel, training)) {
            Ok(_) => panic!("{parallel} / {training}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(field), "{err}");
        assert!(err.contains(says), "{err}");
    }
    // DualPipe pairs its passes by itself: Megatron's all-to-all overlap is refused beside it.
    let text = toml(&format!("{DUALPIPE}\nexpert = 2"), "grad_accum = 8")
        .replace("family = \"gpt\"", "family = \"llama\"\nffn_hidden = 5632")
        .replace("[hardware]", "[model.moe]\nnum_experts = 4\ntop_k = 2\nexpert_ffn_hidden = 2048\n[hardware]")
        + "[megatron]\noverlap_moe_expert_parallel_comm = true\n";
    let err = Scenario::from_toml(Path::new("<dualpipe>"), &text).err().unwrap().to_string();
    assert!(err.contains("megatron.overlap_moe_expert_parallel_comm") && err.contains("DualPipe"), "{err}");
}

/// `explain` offers the pipeline schedules a job could switch to, each re-simulated: for a
/// Megatron 1F1B pipeline interleaving, DualPipe and DualPipeV (shorter bubbles, more memory); none
/// for a job without a pipeline; under DeepSpeed's pipeline engine (no interleaving, no
/// DualPipe here) the reasons.
#[test]
fn explain_offers_the_other_pipeline_schedules() {
    let s = scenario(MEGATRON, "grad_accum = 16");
    let sim = stepsim::simulate(&s).unwrap();
    let e = stepsim::explain::explain(&s, &sim, 0.99);
    let rows: Vec<_> = e.counterfactuals.iter().filter(|c| c.change.starts_with("schedule ")).collect();
    assert_eq!(rows.len(), 3, "{:?}", e.counterfactuals.iter().map(|c| &c.change).collect::<Vec<_>>());
    let base_peak = sim.report.peak.as_ref().unwrap().allocated.bytes;
    for c in &rows {
        assert_eq!(c.fits, Some(true), "{}", c.change);
        assert!(c.tokens_per_s_change.unwrap() > 0.0, "{}: {:?}", c.change, c.tokens_per_s_change);
        assert!(c.peak.as_ref().unwrap().bytes > base_peak, "{}", c.change);
    }
    assert!(rows.iter().any(|c| c.change.starts_with("schedule interleaved-1f1b")));
    assert!(rows.iter().any(|c| c.change.starts_with("schedule dualpipe:")));
    assert!(rows.iter().any(|c| c.change.starts_with("schedule dualpipev:")));
    // DeepSpeed: the reasons, no row re-simulated.
    let ds = scenario("framework = \"deepspeed\"\npipeline = 4\nsharding = \"zero1\"", "grad_accum = 16");
    let e = stepsim::explain::explain(&ds, &stepsim::simulate(&ds).unwrap(), 0.99);
    let c = e.counterfactuals.iter().find(|c| c.change.starts_with("pipeline schedule")).unwrap();
    assert_eq!(c.fits, None);
    let note = c.note.as_deref().unwrap();
    assert!(
        note.contains("no interleaved schedule") && note.contains("DualPipe is simulated under Megatron only"),
        "{note}"
    );
    // No pipeline, no row.
    let flat = scenario("framework = \"megatron\"\npipeline = 1", "grad_accum = 16");
    let e = stepsim::explain::explain(&flat, &stepsim::simulate(&flat).unwrap(), 0.99);
    assert!(e.counterfactuals.iter().all(|c| !c.change.contains("schedule")));
}

const DUALPIPEV: &str = "framework = \"megatron\"\npipeline = 4\nschedule = \"dualpipev\"";

/// DualPipeV (`dualpipev.py`): the model in 2p virtual stages, rank k holding virtual stages
/// k and 2p - 1 - k, one copy of it in the pipeline (the ranks' parameters add up to the
/// model's, as under 1F1B); rank 0 holds the embedding and the head.
#[test]
fn dualpipev_holds_one_copy_in_a_v() {
    let v = stepsim::simulate(&scenario(DUALPIPEV, "grad_accum = 8")).unwrap();
    let one = stepsim::simulate(&scenario(MEGATRON, "grad_accum = 8")).unwrap();
    let blocks = |k: usize| -> Vec<(u64, u64)> {
        v.job.classes[k].plan.chunks.iter().map(|c| (c.first_block, c.end_block)).collect()
    };
    assert_eq!(blocks(0), [(0, 2), (14, 16)]);
    assert_eq!(blocks(3), [(6, 8), (8, 10)]);
    let total = |s: &stepsim::Simulation| s.job.classes.iter().map(|c| c.plan.total_params()).sum::<u64>();
    assert_eq!(total(&v), total(&one));
    let plan0 = &v.job.classes[0].plan;
    assert!(plan0.chunks[0].embed && plan0.chunks[1].head);
    assert_eq!(plan0.shard_group, 1, "no sharding, one copy");
}

/// Every micro-batch goes down the ranks (chunk 0) and back up (chunk 1): its first forward
/// starts on ranks 0, 1, 2, 3 in that order. At the turn, rank 3 hands its chunk 0 output to
/// its chunk 1 with no transfer: it receives activations only from rank 2 and sends only to
/// it (one each per micro-batch), gradients likewise. The output it keeps is freed with its
/// chunk 0 backward: after 2 and after 3 steps the last rank holds the same bytes.
#[test]
fn dualpipev_turns_at_the_last_rank_without_a_transfer() {
    let m = 8usize;
    let sim = stepsim::simulate(&scenario(DUALPIPEV, &format!("grad_accum = {m}"))).unwrap();
    let starts: Vec<u64> = (0..4).map(|k| first_forward(&sim, k, 0)).collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
    let sched = &sim.job.classes[3].schedule;
    let step1 = |pre: &str| sched.labels.iter().filter(|l| l.step == 1 && l.what.starts_with(pre)).count();
    for what in ["recv activation from pipeline rank 2", "send activation to pipeline rank 2"] {
        assert_eq!(step1(what), m, "{what}");
    }
    for what in ["recv gradient from pipeline rank 2", "send gradient to pipeline rank 2"] {
        assert_eq!(step1(what), m, "{what}");
    }
    assert_eq!(step1("recv activation from pipeline rank 3") + step1("send activation to pipeline rank 3"), 0);
    let end = |steps: u32| {
        let s = scenario(DUALPIPEV, &format!("grad_accum = {m}\nsteps = {steps}"));
        let sim = stepsim::simulate(&s).unwrap();
        sim.run.traces.iter().map(|t| t.timeline.samples().last().unwrap().allocated).collect::<Vec<_>>()
    };
    assert_eq!(end(2), end(3));
}

/// DualPipeV's rules: two chunks per rank, at least 2p micro-batches (any count, unlike
/// DualPipe's even one).
#[test]
fn dualpipev_rules() {
    for (parallel, training, field, says) in [
        (
            format!("{DUALPIPEV}\nvirtual_stages = 3"),
            "grad_accum = 8",
            "parallel.virtual_stages",
            "two chunks per rank",
        ),
        (DUALPIPEV.to_string(), "grad_accum = 6", "training.grad_accum", "at least 2 x parallel.pipeline (8)"),
    ] {
        let err = Scenario::from_toml(Path::new("<dualpipe>"), &toml(&parallel, training)).err().unwrap().to_string();
        assert!(err.contains(field) && err.contains(says), "{err}");
    }
    stepsim::simulate(&scenario(DUALPIPEV, "grad_accum = 9")).unwrap();
}

/// Megatron's --overlap-grad-reduce under DualPipe: a chunk's buckets are reduced in its last
/// backward of the step, and where that backward deferred its weight gradients (zero bubble),
/// a bucket waits for the W pass of its last deferred GEMM, as Megatron-Core's hooks fire after
/// Transformer Engine's delayed wgrad. On rank 0 chunk 0's last backward defers (phase 7),
/// chunk 1's does not (phase 6, the first half). The step is no longer than with one
/// reduction after the last W.
#[test]
fn overlapped_gradient_buckets_wait_for_their_deferred_weight_gradients() {
    let on = scenario(&format!("{DUALPIPE}\nsharding = \"zero1\""), "grad_accum = 8");
    let text = toml(&format!("{DUALPIPE}\nsharding = \"zero1\""), "grad_accum = 8")
        + "[megatron]\noverlap_grad_reduce = true\nddp_bucket_size = 10000000\n";
    let overlap = Scenario::from_toml(Path::new("<dualpipe>"), &text).unwrap_or_else(|e| panic!("{e}"));
    let (plain, over) = (stepsim::simulate(&on).unwrap(), stepsim::simulate(&overlap).unwrap());
    let sched = &over.job.classes[0].schedule;
    let prog = &sched.program;
    let label = |t: u32| &sched.labels[prog.tasks[t as usize].label as usize];
    let mut after = Vec::new();
    for (i, t) in prog.tasks.iter().enumerate() {
        let l = &sched.labels[t.label as usize];
        if l.step == 1 && l.what.contains("gradient bucket") {
            let dep = prog.deps.of(i)[0];
            after.push(label(dep).what.clone());
        }
    }
    assert!(after.len() > 2, "{after:?}");
    assert!(after.iter().any(|w| w.ends_with("(weight grad, deferred)")), "{after:?}");
    assert!(after.iter().any(|w| !w.ends_with("(weight grad, deferred)")), "{after:?}");
    let step = |s: &stepsim::Simulation| s.report.throughput.as_ref().unwrap().step_time_s;
    println!("DualPipe, ZeRO-1: {:.2} ms; with --overlap-grad-reduce {:.2} ms", step(&plain) * 1e3, step(&over) * 1e3);
    assert!(step(&over) <= step(&plain));
}
