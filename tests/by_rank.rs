//! Playing `[jitter]`'s ranks one at a time between barriers (src/engine/by_rank.rs) is
//! exact: a seeded set of random jobs with jitter and stragglers (DDP, FSDP, ZeRO, Megatron,
//! DeepSpeed, tensor parallelism, accumulation, checkpointing; pipelines, which the runner
//! leaves to the single loop; devices a byte short of what the run needs, where it gives up
//! on running out of memory), and a job under uneven MoE routing, give the same task times,
//! memory samples, allocator counters, OOM and reports as the single event loop.
//! `cargo test --release --test by_rank -- --nocapture` prints which way each case ran.

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::{SimOptions, Simulation};

mod same_run;
use same_run::{a_byte_short_of, assert_same_figures, both, Rng};

/// What the default run is checked against: every rank in one event loop.
fn plain() -> SimOptions {
    SimOptions { one_loop: true, ..Default::default() }
}

/// Asserts the two simulations agree in everything they recorded; returns whether the
/// first played its ranks apart.
fn assert_same(name: &str, apart: &Simulation, one: &Simulation) -> bool {
    assert!(!one.run.by_rank, "{name}: the single loop was asked for");
    assert_same_figures(name, apart, one);
    apart.run.by_rank
}

/// A random small GPT with `[jitter]`: data-parallel ranks 2 to 6 under a framework and
/// sharding drawn at random, now and then pipelined; the jitter from none (stragglers only,
/// where the ranks tie at every barrier) to large.
fn random_scenario(rng: &mut Rng) -> String {
    let pipeline = [1u64, 1, 1, 2][(rng.next() % 4) as usize];
    let tensor = [1u64, 1, 2][(rng.next() % 3) as usize];
    let framework = if pipeline > 1 {
        rng.pick(&["megatron", "fsdp"])
    } else {
        rng.pick(&["megatron", "fsdp", "fsdp", "fsdp2", "deepspeed"])
    };
    let sharding = match framework {
        "megatron" => rng.pick(&["none", "zero1"]),
        "deepspeed" => rng.pick(&["zero1", "zero2", "zero3"]),
        _ if pipeline > 1 => "none",
        "fsdp2" => "full_shard",
        _ => rng.pick(&["none", "full_shard", "shard_grad_op", "hybrid_shard"]),
    };
    let checkpointing = rng.pick(&["none", "full", "selective"]);
    let dp = rng.range(2, 6);
    let gpus = pipeline * tensor * dp;
    let per_node = if gpus <= 8 { gpus } else { [8u64, 4, 2].into_iter().find(|n| gpus % n == 0).unwrap_or(1) };
    let sched = if pipeline > 1 { "schedule = \"1f1b\"\n" } else { "" };
    let cv = rng.pick(&["0.0", "0.01", "0.05", "0.3"]);
    let stragglers = if cv == "0.0" { rng.range(1, 2) } else { rng.range(0, 1) };
    format!(
        "[model]\nfamily = \"gpt\"\nn_layers = {layers}\nhidden = {hidden}\nn_heads = 8\nvocab = 8192\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\ngpus_per_node = {per_node}\n\
         [parallel]\ntensor = {tensor}\npipeline = {pipeline}\n{sched}framework = \"{framework}\"\nsharding = \"{sharding}\"\n\
         [training]\nmicro_batch = {mb}\nseq_len = 1024\ngrad_accum = {grad_accum}\nsteps = {steps}\n\
         activation_checkpointing = \"{checkpointing}\"\nattention = \"flash\"\n\
         [jitter]\nseed = {seed}\ncompute_cv = {cv}\nstragglers = {stragglers}\nstraggler_slowdown = {slow}\n",
        layers = pipeline * rng.range(1, 4),
        hidden = [512u64, 1024][(rng.next() % 2) as usize],
        mb = rng.range(1, 4),
        grad_accum = rng.range(1, 4) * pipeline,
        steps = rng.range(1, 2),
        seed = rng.next() % 1000,
        slow = rng.pick(&["0.1", "0.5"]),
    )
}

#[test]
fn random_jitter_jobs_match_the_single_loop() {
    let mut rng = Rng(0x0B1_2A4C);
    let (mut cases, mut apart, mut ooms, mut tied, mut unpipelined) = (0, 0, 0, 0, 0);
    while cases < 80 {
        let toml = random_scenario(&mut rng);
        // A combination stepsim does not model (hybrid sharding with tensor parallelism) is
        // drawn again.
        let Ok(mut s) = Scenario::from_toml(Path::new("<random>"), &toml) else { continue };
        cases += 1;
        let (a, one) = both(&s, plain());
        let played = assert_same(&format!("case {cases}:\n{toml}"), &a, &one);
        apart += usize::from(played);
        unpipelined += usize::from(toml.contains("pipeline = 1\n"));
        tied += usize::from(toml.contains("compute_cv = 0.0\n") && played);
        // Again on a device a byte short of the run's highest live bytes: it runs out of
        // memory, and the runner hands the job to the single loop.
        let allocated = a.run.traces.iter().map(|t| t.allocator.peak_allocated).max().unwrap_or(0);
        a_byte_short_of(&mut s, allocated);
        let (a, one) = both(&s, plain());
        assert_same(&format!("case {cases}, a byte short:\n{toml}"), &a, &one);
        let oom = a.run.traces.iter().any(|t| t.oom.is_some());
        ooms += usize::from(oom);
        let brief: Vec<&str> = toml
            .lines()
            .filter(|l| {
                ["framework", "sharding", "pipeline", "tensor", "compute_cv", "stragglers ", "grad_accum"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .collect();
        println!(
            "case {cases:2}: played {}; a byte short: out of memory {oom} ({})",
            if played { "by rank" } else { "in one loop" },
            brief.join(", ")
        );
    }
    println!("{apart} of {cases} cases played by rank, of {unpipelined} unpipelined ({tied} of them with ties at every barrier); {ooms} ran out of memory a byte short");
    // The set exercises what it checks: every unpipelined case plays apart (the runner
    // leaves pipelines to the single loop), ties included, and every smaller device runs out.
    assert_eq!(apart, unpipelined, "{apart} of {unpipelined} unpipelined cases played by rank");
    assert!(tied > 0, "no case with tied ranks played by rank");
    assert_eq!(ooms, cases, "every device a byte short of the live bytes runs out");
}

#[test]
fn uneven_moe_routing_on_one_stage_matches_the_single_loop() {
    let toml = "[model]\nname = \"mixtral-8x7b\"\nn_layers = 4\nmax_seq_len = 4096\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\nnode = \"dgx-h100\"\n\
                [parallel]\nframework = \"megatron\"\nexpert = 8\nsharding = \"zero1\"\n\
                [moe]\naux_loss = \"aux_loss\"\nrouting = \"zipf\"\nzipf_exponent = 0.8\nseed = 1\n\
                [training]\nmicro_batch = 1\nseq_len = 4096\ngrad_accum = 4\nsteps = 2\n\
                precision = \"bf16-mixed-adam-fp32-grads\"\nactivation_checkpointing = \"full\"\nattention = \"flash\"\n";
    let s = Scenario::from_toml(Path::new("<moe>"), toml).unwrap_or_else(|e| panic!("{e}"));
    let (a, one) = both(&s, plain());
    assert!(a.run.traces.iter().all(|t| t.oom.is_none()), "the MoE job fits");
    assert!(assert_same("uneven routing", &a, &one), "uneven routing on one stage plays by rank");
}
