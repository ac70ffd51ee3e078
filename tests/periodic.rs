//! The periodic extrapolation of the schedule (src/engine/period.rs) is exact: every shipped
//! scenario, a seeded set of random steps of one micro-batch (whose transformer blocks are
//! the periods; each again a byte short of its live bytes), and a seeded set of random
//! pipelines and accumulation runs (some run out of
//! memory inside the periods played without the event loop, some inside periods replayed
//! device by device, which are played again in order), give the same task times,
//! memory samples, allocator counters, OOM and report as simulating every period. For every
//! random case a sweep's runs, which try prefixes of the program (pausing at a gate and
//! jumping only the periods before it, `Periodic::short_of`, or holding a pipeline's slots)
//! and carry the run on, give the row simulating every period gives: verdict, where it runs
//! out of memory, peaks and throughput.
//! `cargo test --release --test periodic -- --nocapture` prints the periods each case jumped;
//! `STEPSIM_PERIODIC_CASES=400 STEPSIM_PERIODIC_SEED=7 cargo test --release --test periodic
//! -- --nocapture` runs longer campaigns of the random sets (the seed is mixed into each
//! set's own).

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::sweep::summary::{self, Outcome};
use stepsim::{SimOptions, Simulation};

mod same_run;
use same_run::{a_byte_short_of, assert_same_figures, both, Rng};

/// What the default run is checked against: every period simulated.
fn plain() -> SimOptions {
    SimOptions { every_period: true, ..Default::default() }
}

/// How many random cases a set runs (`STEPSIM_PERIODIC_CASES`, else `default`), and its
/// generator: the set's own seed, mixed with `STEPSIM_PERIODIC_SEED` where that is given.
fn campaign(default: usize, seed: u64) -> (usize, Rng) {
    let var =
        |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().unwrap_or_else(|e| panic!("{name}={v}: {e}")));
    let cases = var("STEPSIM_PERIODIC_CASES").map_or(default, |n| n as usize);
    let seed = var("STEPSIM_PERIODIC_SEED").map_or(seed, |x| seed ^ x.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (cases, Rng(seed))
}

/// Asserts a sweep's answer for `s` (`summary::simulate`: the prefixes its statistics
/// choose, and every prefix of its kind of program) is the one simulating every period gives.
fn assert_sweep_agrees(name: &str, s: &Scenario, full: &Simulation) {
    use stepsim::schedule::Stage;
    let want = Outcome::from_report(&full.report, s);
    assert_eq!(summary::simulate(s).unwrap_or_else(|e| panic!("{e}")), want, "{name}: the sweep's answer");
    let dag = stepsim::model::build(&s.model, &s.workload);
    let all = if s.parallel.model_parallel.pipeline > 1 {
        let fill = stepsim::schedule::pipeline::fill_slots(&s.parallel, s.training.grad_accum);
        vec![Stage::Steps(0), Stage::Slots(fill), Stage::Steps(1)]
    } else {
        vec![Stage::Steps(0), Stage::FirstForward, Stage::Steps(1)]
    };
    let every = stepsim::simulate_lean(s, &dag, &all).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(Outcome::from_report(&every, s), want, "{name}: the sweep's answer, every prefix tried");
}

/// Asserts the two simulations agree in everything they recorded; returns the periods the
/// extrapolating one jumped.
fn assert_same(name: &str, fast: &Simulation, full: &Simulation) -> u64 {
    assert_eq!(full.run.periods_jumped, 0, "{name}: the full run jumped");
    assert_same_figures(name, fast, full);
    fast.run.periods_jumped
}

#[test]
fn every_shipped_scenario_matches_the_full_simulation() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    files.sort();
    let mut jumped = Vec::new();
    for f in &files {
        let s = Scenario::load(f).unwrap_or_else(|e| panic!("{e}"));
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        let (fast, full) = both(&s, plain());
        let j = assert_same(&name, &fast, &full);
        println!("{name:45} {j:>5} periods jumped");
        jumped.push((name, j));
    }
    // The flagship pipeline's steady state is played without the event loop in both steps
    // (96 micro-batches a step, 8 stages: 86 of each step's periods).
    let gpt3 = jumped.iter().find(|(n, _)| n == "gpt3-175b").map(|j| j.1);
    assert!(gpt3.is_some_and(|j| j >= 150), "gpt3-175b jumped {gpt3:?} periods");
}

/// A random small GPT: pipelined (1F1B, interleaved, GPipe) or not, with gradient
/// accumulation, tensor parallelism, checkpointing and a framework drawn at random.
fn random_scenario(rng: &mut Rng) -> String {
    let pipeline = [1u64, 2, 4][(rng.next() % 3) as usize];
    let tensor = [1u64, 2][(rng.next() % 2) as usize];
    let schedule = if pipeline > 1 { rng.pick(&["1f1b", "interleaved-1f1b", "gpipe"]) } else { "1f1b" };
    let virtual_stages = if schedule == "interleaved-1f1b" { 2 } else { 1 };
    let layers = pipeline * virtual_stages * rng.range(1, 3);
    let grad_accum = rng.range(6, 24) * if schedule == "interleaved-1f1b" { pipeline } else { 1 };
    let framework =
        if pipeline > 1 { rng.pick(&["megatron", "fsdp"]) } else { rng.pick(&["megatron", "fsdp", "deepspeed"]) };
    let sharding = match framework {
        "megatron" => rng.pick(&["none", "zero1"]),
        "deepspeed" => rng.pick(&["zero1", "zero2"]),
        _ if pipeline > 1 => "none",
        _ => rng.pick(&["none", "full_shard", "shard_grad_op"]),
    };
    let checkpointing = rng.pick(&["none", "full", "selective"]);
    let gpus = pipeline * tensor * rng.range(1, 2);
    let vs = if virtual_stages > 1 { format!("virtual_stages = {virtual_stages}\n") } else { String::new() };
    let sched = if pipeline > 1 { format!("schedule = \"{schedule}\"\n{vs}") } else { String::new() };
    format!(
        "[model]\nfamily = \"gpt\"\nn_layers = {layers}\nhidden = {hidden}\nn_heads = 8\nvocab = 8192\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\ngpus_per_node = {per_node}\n\
         [parallel]\ntensor = {tensor}\npipeline = {pipeline}\n{sched}framework = \"{framework}\"\nsharding = \"{sharding}\"\n\
         [training]\nmicro_batch = {mb}\nseq_len = 1024\ngrad_accum = {grad_accum}\nsteps = {steps}\n\
         activation_checkpointing = \"{checkpointing}\"\nattention = \"flash\"\n",
        hidden = [512u64, 1024][(rng.next() % 2) as usize],
        per_node = gpus.min(8),
        mb = rng.range(1, 4),
        steps = rng.range(1, 3),
    )
}

#[test]
fn random_pipelines_and_accumulation_runs_match_the_full_simulation() {
    let (n, mut rng) = campaign(40, 0x005E_ED0F_5EED);
    let (mut cases, mut jumped_cases, mut ooms, mut jumped_ooms, mut again) = (0, 0, [0, 0], 0, 0);
    while cases < n {
        let toml = random_scenario(&mut rng);
        let Ok(mut s) = Scenario::from_toml(Path::new("<random>"), &toml) else { continue };
        cases += 1;
        let (fast, full) = both(&s, plain());
        let j = assert_same(&format!("case {cases}:\n{toml}"), &fast, &full);
        assert_sweep_agrees(&format!("case {cases}:\n{toml}"), &s, &full);
        jumped_cases += usize::from(j > 0);
        // Again on smaller devices: one a byte short of the run's highest reservation (the
        // allocator frees its cache and retries, and may still run out, inside the periods
        // jumped or not), one a byte short of its highest live bytes (it runs out).
        let peak = |f: &dyn Fn(&stepsim::memory::AllocatorStats) -> u64| {
            fast.run.traces.iter().map(|t| f(&t.allocator)).max().unwrap_or(0)
        };
        let (reserved, allocated) = (peak(&|a| a.peak_reserved), peak(&|a| a.peak_allocated));
        for (what, bytes) in [("reservation", reserved), ("live bytes", allocated)] {
            a_byte_short_of(&mut s, bytes);
            let (fast, full) = both(&s, plain());
            let name = format!("case {cases}, a byte short of its {what}:\n{toml}");
            let jo = assert_same(&name, &fast, &full);
            assert_sweep_agrees(&name, &s, &full);
            let oom = fast.run.traces.iter().any(|t| t.oom.is_some());
            ooms[usize::from(what == "live bytes")] += usize::from(oom);
            jumped_ooms += usize::from(oom && jo > 0);
            again += usize::from(fast.run.played_again);
            println!(
                "case {cases:2}: {j:>3} periods jumped; {jo:>3} a byte short of its {what} (out of memory: {oom})"
            );
        }
    }
    // The set exercises what it checks: most cases repeat, and the smaller devices run out.
    println!("{jumped_cases} of {cases} cases jumped; out of memory a byte short of the reservation {}, of the live bytes {}; {jumped_ooms} after jumping, {again} of them inside a jump replayed device by device (played again in order)", ooms[0], ooms[1]);
    assert!(jumped_cases >= cases / 2, "only {jumped_cases} of {cases} cases jumped a period");
    assert_eq!(ooms[1], cases, "every device a byte short of the live bytes runs out");
    assert!(jumped_ooms > 0, "no run ran out of memory after a jump");
    assert!(again > 0, "no run ran out of memory inside a jump replayed device by device");
}

/// A random small model trained one micro-batch a step without a pipeline: what repeats is
/// its passes' transformer blocks (`Program::layer_marks`), not micro-batches. GPT or Llama
/// (grouped-query attention; a third of them a mixture of experts, in every block or every
/// other one, whose blocks repeat two by two); Megatron, FSDP, FSDP2 or DeepSpeed.
fn random_step_of_one_micro_batch(rng: &mut Rng) -> String {
    let tensor = [1u64, 2][(rng.next() % 2) as usize];
    let framework = rng.pick(&["megatron", "fsdp", "fsdp2", "deepspeed"]);
    let sharding = match framework {
        "megatron" => rng.pick(&["none", "zero1"]),
        "deepspeed" => rng.pick(&["zero1", "zero2", "zero3"]),
        "fsdp2" => "full_shard",
        _ => rng.pick(&["none", "full_shard", "shard_grad_op", "hybrid_shard"]),
    };
    let tensor = if framework == "megatron" { tensor } else { 1 };
    let hidden = [512u64, 1024][(rng.next() % 2) as usize];
    let family = rng.pick(&["gpt", "llama"]);
    let mut model = format!("family = \"{family}\"\n");
    let mut parallel = String::new();
    if family == "llama" {
        model += &format!("n_kv_heads = {}\n", [2u64, 8][(rng.next() % 2) as usize]);
        if rng.next() % 3 == 0 {
            let every = rng.range(1, 2);
            model += &format!(
                "[model.moe]\nnum_experts = 4\ntop_k = 2\nexpert_ffn_hidden = {}\nevery = {every}\noffset = {}\n",
                hidden / 2,
                every - 1
            );
            if tensor > 1 {
                // Megatron-Core routes each tensor-parallel rank's sequence shard.
                parallel += "sequence_parallel = true\n";
            }
        }
    }
    let gpus = tensor * [2u64, 4, 8][(rng.next() % 3) as usize];
    format!(
        "[model]\nn_layers = {layers}\nhidden = {hidden}\nn_heads = 8\nvocab = 8192\nmax_seq_len = 1024\n{model}\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\ngpus_per_node = {per_node}\n\
         [parallel]\ntensor = {tensor}\nframework = \"{framework}\"\nsharding = \"{sharding}\"\n{parallel}\
         [training]\nmicro_batch = {mb}\nseq_len = 1024\ngrad_accum = 1\nsteps = {steps}\n\
         activation_checkpointing = \"{checkpointing}\"\nattention = \"flash\"\n",
        layers = rng.range(4, 12),
        per_node = gpus.min(8),
        mb = rng.range(1, 4),
        steps = rng.range(1, 3),
        checkpointing = rng.pick(&["none", "full", "selective"]),
    )
}

#[test]
fn random_steps_of_one_micro_batch_match_the_full_simulation() {
    let (n, mut rng) = campaign(24, 0x0B10_C5ED);
    let (mut cases, mut jumped_cases, mut jumped_ooms) = (0, 0, 0);
    let (mut llama, mut moe) = (0, 0);
    while cases < n {
        let toml = random_step_of_one_micro_batch(&mut rng);
        let Ok(mut s) = Scenario::from_toml(Path::new("<random>"), &toml) else { continue };
        cases += 1;
        llama += usize::from(toml.contains("\"llama\""));
        moe += usize::from(toml.contains("[model.moe]"));
        let (fast, full) = both(&s, plain());
        let j = assert_same(&format!("case {cases}:\n{toml}"), &fast, &full);
        assert_sweep_agrees(&format!("case {cases}:\n{toml}"), &s, &full);
        jumped_cases += usize::from(j > 0);
        // Again a byte short of the run's highest live bytes: it runs out, often inside the
        // blocks jumped.
        let allocated = fast.run.traces.iter().map(|t| t.allocator.peak_allocated).max().unwrap_or(0);
        a_byte_short_of(&mut s, allocated);
        let (fast, full) = both(&s, plain());
        let jo = assert_same(&format!("case {cases}, a byte short of its live bytes:\n{toml}"), &fast, &full);
        assert_sweep_agrees(&format!("case {cases}, a byte short of its live bytes:\n{toml}"), &s, &full);
        assert!(fast.run.traces.iter().any(|t| t.oom.is_some()), "case {cases} fits a byte short of its live bytes");
        jumped_ooms += usize::from(jo > 0);
        println!("case {cases:2}: {j:>3} blocks jumped; {jo:>3} a byte short of its live bytes");
    }
    println!("{jumped_cases} of {cases} cases ({llama} Llama, {moe} of them a mixture of experts) jumped blocks; {jumped_ooms} ran out of memory after jumping");
    assert!(llama > 0 && moe > 0, "the set has {llama} Llama cases, {moe} mixtures of experts");
    assert!(jumped_cases >= cases / 2, "only {jumped_cases} of {cases} cases jumped a block");
    assert!(jumped_ooms > 0, "no run ran out of memory after jumping blocks");
}
