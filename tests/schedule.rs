//! Scheduling rules, checked on the simulated timeline: when FSDP/ZeRO/DDP state is created
//! and freed, what prefetching and the all-gather limiter keep live, gradient accumulation.

use std::path::Path;

use stepsim::memory::Category;
use stepsim::scenario::Scenario;
use stepsim::schedule::{Phase, TaskKind};
use stepsim::Simulation;

fn sim(parallel: &str, training: &str, gpus: u32) -> Simulation {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 8\nhidden = 2048\nn_heads = 16\nvocab = 32000\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\ngpus_per_node = {gpn}\nmemory_capacity = 1000000000000\n\
         [parallel]\n{parallel}\n[training]\nmicro_batch = 2\nseq_len = 1024\nprecision = \"bf16-mixed-adam\"\n{training}\n",
        gpn = gpus.min(8)
    );
    let s = Scenario::from_toml(Path::new("<schedule test>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    stepsim::simulate(&s).unwrap()
}

/// Max over the samples of (step, phase) of a category's bytes.
fn max_in(s: &Simulation, step: u32, phase: Phase, cat: Category) -> u64 {
    s.samples_in(step, Some(phase)).map(|x| x.by_category[cat.index()]).max().unwrap_or(0)
}

/// The value of a category at the first sample of (step, phase).
fn first_in(s: &Simulation, step: u32, phase: Phase, cat: Category) -> u64 {
    s.samples_in(step, Some(phase)).next().map_or(0, |x| x.by_category[cat.index()])
}

fn block_gathered(s: &Simulation) -> u64 {
    s.plan().units[1].shard_params * s.plan().shard_group * 2
}

#[test]
fn adam_state_at_the_first_step_but_at_init_under_deepspeed_before_0_13_2() {
    let f = sim("sharding = \"full_shard\"", "", 8);
    assert_eq!(max_in(&f, 1, Phase::Forward, Category::OptimizerState), 0);
    assert_eq!(max_in(&f, 1, Phase::Backward, Category::OptimizerState), 0);
    let want = f.plan().model_state().optimizer_state;
    assert_eq!(max_in(&f, 1, Phase::Optimizer, Category::OptimizerState), want);
    assert_eq!(first_in(&f, 2, Phase::Forward, Category::OptimizerState), want);
    // DeepSpeed before v0.13.2 stepped the optimizer on zero gradients as it initialised
    // (initialize_optimizer_states); since 18179807f the moments come with the first step.
    let ds = "sharding = \"zero3\"\nframework = \"deepspeed\"";
    let d = sim(ds, "[deepspeed]\nversion = \"0.13.1\"", 8);
    assert_eq!(max_in(&d, 0, Phase::Init, Category::OptimizerState), want);
    assert_eq!(first_in(&d, 1, Phase::Forward, Category::OptimizerState), want);
    let d = sim(ds, "", 8);
    assert_eq!(max_in(&d, 0, Phase::Init, Category::OptimizerState), 0);
    assert_eq!(max_in(&d, 1, Phase::Backward, Category::OptimizerState), 0);
    assert_eq!(max_in(&d, 1, Phase::Optimizer, Category::OptimizerState), want);
    // Master weights exist from init under both.
    assert_eq!(first_in(&f, 1, Phase::Forward, Category::MasterWeights), f.plan().model_state().master_weights);
}

#[test]
fn gradients_appear_in_backward_and_zero_grad_frees_them() {
    let f = sim("sharding = \"full_shard\"", "", 8);
    assert_eq!(max_in(&f, 1, Phase::Forward, Category::Gradients), 0);
    assert_eq!(max_in(&f, 1, Phase::Backward, Category::Gradients), f.plan().model_state().gradients);
    assert_eq!(first_in(&f, 2, Phase::Forward, Category::Gradients), 0);
    // Unsharded gradients never outlive the step's backward.
    assert_eq!(first_in(&f, 1, Phase::Optimizer, Category::UnshardedGradients), 0);
}

#[test]
fn limit_all_gathers_bounds_gathered_blocks_in_forward() {
    let b = |limit: bool| {
        let s = sim(&format!("sharding = \"full_shard\"\nlimit_all_gathers = {limit}"), "", 8);
        let root = s.plan().units[0].shard_params * s.plan().shard_group * 2;
        (max_in(&s, 1, Phase::Forward, Category::GatheredParameters) - root) / block_gathered(&s)
    };
    assert!(b(true) <= 2, "with the limiter at most two blocks are gathered, got {}", b(true));
    assert!(b(false) > 2, "without it the all-gathers run ahead of compute, got {}", b(false));
}

#[test]
fn backward_prefetch_policy_sets_how_many_blocks_are_gathered() {
    let g = |p: &str| {
        let s = sim(&format!("sharding = \"full_shard\"\nbackward_prefetch = \"{p}\""), "", 8);
        let root = s.plan().units[0].shard_params * s.plan().shard_group * 2;
        (max_in(&s, 1, Phase::Backward, Category::GatheredParameters) - root) as f64 / block_gathered(&s) as f64
    };
    let (pre, post, none) = (g("pre"), g("post"), g("none"));
    assert!((pre - 2.0).abs() < 0.01, "BACKWARD_PRE: current + prefetched = 2 blocks, got {pre}");
    assert!(post <= 1.01 && none <= 1.01, "POST/none keep one block at a time: {post} {none}");
    // ... and no prefetch exposes the all-gathers: the step is slower.
    let t = |p: &str| {
        sim(&format!("sharding = \"full_shard\"\nbackward_prefetch = \"{p}\""), "", 8)
            .report
            .throughput
            .unwrap()
            .step_time_s
    };
    assert!(t("none") > t("pre"));
}

#[test]
fn shard_grad_op_keeps_gathered_parameters_from_forward_to_backward() {
    let s = sim("sharding = \"shard_grad_op\"", "", 8);
    let root = s.plan().units[0].shard_params * s.plan().shard_group * 2;
    let at_end_of_forward = max_in(&s, 1, Phase::Forward, Category::GatheredParameters) - root;
    assert_eq!(at_end_of_forward, 8 * block_gathered(&s));
    // Its gradients are sharded, its parameters too at rest.
    let ms = s.plan().model_state();
    assert_eq!(ms.parameters, s.plan().local_total(true) * 2);
}

#[test]
fn hybrid_shard_shards_inside_a_node_only() {
    let h = sim("sharding = \"hybrid_shard\"", "", 32);
    let f8 = sim("sharding = \"full_shard\"", "", 8);
    assert_eq!(h.plan().shard_group, 8);
    assert_eq!(h.plan().model_state(), f8.plan().model_state());
    // Each reduce-scatter is followed by a cross-node all-reduce of the shard.
    let ars = h.schedule().labels.iter().filter(|l| l.kind == TaskKind::AllReduce && l.step == 1).count();
    let rss = h.schedule().labels.iter().filter(|l| l.kind == TaskKind::ReduceScatter && l.step == 1).count();
    assert_eq!(ars, rss);
    assert_eq!(rss, 9);
}

#[test]
fn ddp_all_reduces_25_mb_buckets_and_keeps_bucket_copies() {
    let s = sim("sharding = \"none\"", "", 8);
    let grad_bytes = s.plan().total_params() * 2;
    let ars = s.schedule().labels.iter().filter(|l| l.kind == TaskKind::AllReduce && l.step == 1).count() as u64;
    // One all-reduce per full 25 MB bucket, plus the last partial one; a bucket closes on the
    // op that fills it, so it may hold a little more than 25 MB.
    assert!(
        ars <= grad_bytes.div_ceil(25_000_000) && ars >= grad_bytes / 25_000_000 / 4,
        "{ars} buckets for {grad_bytes} B"
    );
    assert_eq!(max_in(&s, 0, Phase::Init, Category::CommBuffers), grad_bytes);
    let v = sim("sharding = \"none\"\ngradient_as_bucket_view = true", "", 8);
    assert_eq!(max_in(&v, 0, Phase::Init, Category::CommBuffers), 0);
}

#[test]
fn gradient_accumulation_does_not_stack_activations() {
    let one = sim("sharding = \"full_shard\"", "grad_accum = 1", 8);
    let four = sim("sharding = \"full_shard\"", "grad_accum = 4", 8);
    let a1 = max_in(&one, 1, Phase::Forward, Category::Activations);
    let a4 = max_in(&four, 1, Phase::Forward, Category::Activations);
    assert_eq!(a1, a4, "each micro-batch's activations are freed by its backward");
    // The sharded gradient is created once and accumulated into.
    assert_eq!(max_in(&four, 1, Phase::Backward, Category::Gradients), four.plan().model_state().gradients);
    // Four micro-batches take about four times as long.
    let t1 = one.report.throughput.as_ref().unwrap().step_time_s;
    let t4 = four.report.throughput.as_ref().unwrap().step_time_s;
    assert!(t4 > 3.5 * t1 && t4 < 4.5 * t1, "{t1} {t4}");
    assert_eq!(four.report.throughput.unwrap().tokens_per_step, 4 * 2 * 1024 * 8);
}

#[test]
fn zero1_and_zero2_shard_the_optimizer_but_not_the_parameters() {
    let z1 = sim("sharding = \"zero1\"\nframework = \"deepspeed\"", "", 8);
    let z2 = sim("sharding = \"zero2\"\nframework = \"deepspeed\"", "", 8);
    let full = z1.plan().total_params();
    assert_eq!(z1.plan().model_state().parameters, full * 2);
    assert_eq!(z2.plan().model_state().parameters, full * 2);
    assert_eq!(z1.plan().model_state().gradients, full * 2);
    assert!(z2.plan().model_state().gradients < full * 2 / 7);
    // ZeRO-2 frees each unit's full gradients after its reduce-scatter.
    assert!(max_in(&z2, 1, Phase::Backward, Category::UnshardedGradients) < full * 2 / 2);
}

fn jittered(jitter: &str) -> Simulation {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 12\nhidden = 1024\nn_heads = 16\nvocab = 50257\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 64\n[parallel]\nsharding = \"full_shard\"\n\
         [training]\nmicro_batch = 4\nseq_len = 1024\nsteps = 6\n{jitter}"
    );
    stepsim::simulate(&Scenario::from_toml(Path::new("<jitter test>"), &toml).unwrap()).unwrap()
}

#[test]
fn jitter_and_stragglers_slow_the_step_reproducibly() {
    let step = |s: &Simulation| s.report.throughput.as_ref().unwrap().step_time_s;
    let base = jittered("");
    let j = jittered("[jitter]\nseed = 3\ncompute_cv = 0.05\n");
    let again = jittered("[jitter]\nseed = 3\ncompute_cv = 0.05\n");
    let other = jittered("[jitter]\nseed = 4\ncompute_cv = 0.05\n");
    let slow = jittered("[jitter]\nseed = 3\ncompute_cv = 0.05\nstragglers = 1\nstraggler_slowdown = 0.2\n");
    assert!(step(&j) > step(&base), "collectives wait for the slowest of 64 ranks");
    assert_eq!(stepsim::report::write::report_json(&j.report), stepsim::report::write::report_json(&again.report));
    assert_ne!(j.trace().end_time_ns, other.trace().end_time_ns, "another seed draws other times");
    // Every rank is simulated and the report is the rank that finishes last: the 20%
    // straggler, whose own compute is ~20% longer (its per-op draws average ~1). This step is
    // communication-bound, so the others wait less than that: the step grows by less than
    // the straggler's slowdown, more than the noise alone costs.
    let compute = |s: &Simulation| s.report.steps.last().unwrap().compute_busy_s;
    let c = compute(&slow) / compute(&base);
    assert!((1.15..1.25).contains(&c), "straggler's compute x{c:.3}");
    assert!(step(&slow) > step(&j) && step(&slow) < 1.2 * step(&base), "{} vs {}", step(&slow), step(&base));
    let js = j.report.throughput.as_ref().unwrap().jitter.as_ref().unwrap();
    assert_eq!(js.steps, 5);
    assert!(js.min_s <= js.median_s && js.median_s <= js.p99_s && js.p99_s <= js.max_s);
    assert!(base.report.throughput.as_ref().unwrap().jitter.is_none());
}

/// Link sharing (issue 4): with tensor parallelism 2 and DDP over the 4 replicas of one
/// node, the TP all-reduces and DDP's bucket all-reduces both use NVLink; where they overlap
/// they share it. Replaying the same program with no links declared, every collective gets
/// NVLink to itself: the shared run can only be slower, and the NCCL and TP streams' busy
/// time grows by what they waited for each other.
#[test]
fn tensor_and_data_parallel_collectives_share_nvlink() {
    let s = sim("tensor = 2\nsharding = \"none\"", "grad_accum = 2", 8);
    let prog = &s.schedule().program;
    let link = |name: &str| prog.stream_links[prog.streams.iter().position(|x| x == name).unwrap()];
    use stepsim::engine::links::{NET_RX, NET_TX, NVLINK};
    assert_eq!((link("compute"), link("nccl"), link("tp")), (stepsim::engine::links::SMS, NVLINK, NVLINK));
    let mut alone = prog.clone();
    alone.stream_links.clear();
    let big = || stepsim::memory::ExactAllocator::new(u64::MAX / 4);
    let shared = stepsim::engine::run(prog, &mut big()).unwrap();
    let free = stepsim::engine::run(&alone, &mut big()).unwrap();
    println!(
        "step end {:.3} ms shared vs {:.3} ms with links to themselves; nccl busy {:.3} vs {:.3} ms, tp {:.3} vs {:.3} ms",
        shared.end_time_ns as f64 / 1e6,
        free.end_time_ns as f64 / 1e6,
        shared.stream_busy_ns[1] as f64 / 1e6,
        free.stream_busy_ns[1] as f64 / 1e6,
        shared.stream_busy_ns[2] as f64 / 1e6,
        free.stream_busy_ns[2] as f64 / 1e6
    );
    assert!(shared.end_time_ns >= free.end_time_ns);
    assert!(shared.stream_busy_ns[1] + shared.stream_busy_ns[2] > free.stream_busy_ns[1] + free.stream_busy_ns[2]);
    // Across nodes the data-parallel collectives use the NICs, both ways.
    let wide = sim("tensor = 8\nsharding = \"none\"", "", 16);
    let p = &wide.schedule().program;
    let nccl = p.stream_links[p.streams.iter().position(|x| x == "nccl").unwrap()];
    assert_eq!(nccl, NET_TX | NET_RX);
}

/// Under `[jitter]` every data-parallel rank runs its own program on its own device: each
/// collective starts on every rank at once, when the last rank has issued it, and the ranks'
/// compute differs.
#[test]
fn with_jitter_every_rank_is_simulated_and_collectives_wait_for_all() {
    use stepsim::engine::{link_parts, part_traces, run_parts, Program};
    use stepsim::memory::{Allocator, ExactAllocator};
    use stepsim::schedule::jitter::{ranks, JitterConfig};
    let s = sim("sharding = \"full_shard\"", "", 4);
    let cfg = JitterConfig { seed: 9, compute_cv: 0.1, stragglers: 1, straggler_slowdown: 0.3 };
    let run = ranks(s.schedule(), &cfg, 4, 0, 0);
    let mut parts: Vec<&Program> = run.programs.iter().collect();
    parts.push(&run.barrier);
    let mut allocs: Vec<ExactAllocator> = (0..4).map(|_| ExactAllocator::new(u64::MAX / 4)).collect();
    let mut refs: Vec<&mut dyn Allocator> = allocs.iter_mut().map(|a| a as &mut dyn Allocator).collect();
    let dt = run_parts(&parts, &link_parts(&parts, &run.links), &mut refs, &Default::default()).unwrap();
    let traces = part_traces(&parts, 4, dt);
    let prog = &s.schedule().program;
    let mut checked = 0;
    for (i, t) in prog.tasks.iter().enumerate() {
        let kind = s.schedule().labels[t.label as usize].kind;
        if t.stream != 1 || !matches!(kind, TaskKind::AllGather | TaskKind::ReduceScatter) {
            continue;
        }
        let start = traces[0].start_ns[i];
        assert!(traces.iter().all(|tr| tr.start_ns[i] == start), "collective {i} starts together");
        for &d in prog.deps.of(i) {
            assert!(traces.iter().all(|tr| tr.end_ns[d as usize] <= start), "after every rank's dependency");
        }
        checked += 1;
    }
    assert!(checked > 10, "{checked}");
    // The straggler (rank 0) computes ~30% longer than the others.
    let busy = |r: usize| traces[r].stream_busy_ns[0] as f64;
    assert!(busy(0) > 1.2 * busy(1) && busy(0) > 1.2 * busy(3), "{} {} {}", busy(0), busy(1), busy(3));
}

/// NCCL's thread blocks take SMs from compute (src/engine/links.rs): FSDP's all-gathers and
/// reduce-scatters inside one H100 node hold 24 ring channels' blocks of the 132 SMs while
/// they run, so every compute kernel they overlap runs at 108/132 of its solo rate. Replayed
/// without the compute stream's SMS bit, the same program runs its compute at solo speed:
/// the report's contention is what the step loses, bounded by what 24 of 132 SMs can cost
/// over the time collectives run.
#[test]
fn collectives_thread_blocks_slow_the_compute_they_overlap() {
    let s = sim("sharding = \"full_shard\"", "", 8);
    let prog = &s.schedule().program;
    assert_eq!((prog.stream_links[0], prog.sms), (stepsim::engine::links::SMS, 132));
    let collectives: Vec<u16> = prog.tasks.iter().filter(|t| t.stream == 1 && t.ctas > 0).map(|t| t.ctas).collect();
    assert!(!collectives.is_empty() && collectives.iter().all(|&c| c == 24), "{collectives:?}");
    let mut solo = prog.clone();
    solo.stream_links[0] = 0;
    let big = || stepsim::memory::ExactAllocator::new(u64::MAX / 4);
    let (with, without) =
        (stepsim::engine::run(prog, &mut big()).unwrap(), stepsim::engine::run(&solo, &mut big()).unwrap());
    let st = s.report.steps.last().unwrap();
    println!(
        "step end {:.3} ms with SM sharing vs {:.3} ms without; contention {:.3} ms in step 2, communication busy {:.3} ms",
        with.end_time_ns as f64 / 1e6,
        without.end_time_ns as f64 / 1e6,
        st.sm_contention_s * 1e3,
        st.comm_busy_s * 1e3
    );
    assert!(with.end_time_ns > without.end_time_ns);
    assert!(st.sm_contention_s > 0.0);
    // While collectives run, compute does 24/132 less: over the communication-busy time at most
    // that share is lost, stretched by the slower rate.
    assert!(st.sm_contention_s <= st.comm_busy_s * (24.0 / 108.0) + 1e-9);
}

/// An uneven split per virtual stage (Megatron's `--pipeline-model-parallel-layout`, counted
/// in decoder layers): virtual stage j (chunk j / p of stage j % p) holds its entry's blocks
/// in model order; a first entry of 0 is a chunk of the embedding alone (the layout's "E|"),
/// a last one of the final norm, head and loss ("|L"). The same job split evenly runs the
/// same FLOPs.
#[test]
fn stage_layers_split_virtual_stages_and_the_last_may_hold_only_the_head() {
    let par = |split: &str| {
        format!("framework = \"megatron\"\npipeline = 2\nschedule = \"interleaved-1f1b\"\nvirtual_stages = 2\n{split}")
    };
    let s = sim(&par("stage_layers = [3, 2, 3, 0]"), "grad_accum = 4", 2);
    let stages: Vec<(String, bool, bool)> = s
        .report
        .rank_classes
        .iter()
        .map(|c| c.stage.as_ref().unwrap())
        .map(|st| (st.layers.clone(), st.embedding, st.head))
        .collect();
    assert_eq!(stages, [("0-2,5-7".to_string(), true, false), ("3-4".to_string(), false, true)]);
    // A first entry of 0: the embedding alone (the layout's "E|").
    let e = sim(&par("stage_layers = [0, 4, 4, 0]"), "grad_accum = 4", 2);
    let st = e.report.rank_classes[0].stage.as_ref().unwrap();
    assert_eq!((st.layers.as_str(), st.embedding), ("4-7", true));
    let even = sim(&par(""), "grad_accum = 4", 2);
    // MFU x step time is the model FLOPs per step (over the peak): the same work.
    let work = |s: &Simulation| s.report.throughput.as_ref().map(|t| t.mfu * t.step_time_s).unwrap();
    assert!((work(&s) / work(&even) - 1.0).abs() < 1e-3, "{} {}", work(&s), work(&even));
    // A zero anywhere but last, or one entry per stage under interleaving, is refused.
    for (split, says) in [("[3, 0, 3, 2]", "at least one layer"), ("[4, 4]", "one entry per virtual stage")] {
        let toml = format!(
            "[model]\nfamily = \"llama\"\nn_layers = 8\nhidden = 2048\nn_heads = 16\nvocab = 32000\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 2\n[parallel]\n{}\n[training]\nmicro_batch = 2\nseq_len = 1024\ngrad_accum = 4\n",
            par(&format!("stage_layers = {split}"))
        );
        let e = Scenario::from_toml(Path::new("<split>"), &toml).err().unwrap().to_string();
        assert!(e.contains("parallel.stage_layers") && e.contains(says), "{split}: {e}");
    }
}

/// A program whose steps follow one another says where each begins
/// (`Program::step_starts`), and each step's range holds exactly the tasks labelled with
/// it: the step spans a report and a sweep row time are read off those ranges.
#[test]
fn each_step_is_one_range_of_the_program_where_the_scheduler_says_so() {
    let cases = [
        ("sharding = \"full_shard\"", "grad_accum = 2"),
        ("sharding = \"zero1\"", ""),
        ("tensor = 2\npipeline = 2\nschedule = \"1f1b\"", "grad_accum = 4"),
        (
            "pipeline = 2\nvirtual_stages = 2\nschedule = \"interleaved-1f1b\"",
            "grad_accum = 4\nactivation_checkpointing = \"full\"",
        ),
    ];
    for (parallel, training) in cases {
        let s = sim(parallel, training, 8);
        for c in s.classes() {
            let sched = c.schedule;
            let prog = &sched.program;
            assert!(!prog.step_starts.is_empty(), "{parallel}: steps not recorded as ranges");
            let mut seen = 0;
            for step in 0..prog.step_starts.len() {
                let r = prog.step_range(step);
                seen += r.len();
                for t in r {
                    let l = &sched.labels[prog.tasks[t].label as usize];
                    assert_eq!(l.step as usize, step, "{parallel}: task {t} ({}) outside its step's range", l.what);
                }
            }
            assert_eq!(seen, prog.tasks.len(), "{parallel}: the ranges do not cover the program");
        }
    }
}
