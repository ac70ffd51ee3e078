//! Valid-looking combinations (issue 22): a small model under random choices of framework,
//! sharding, parallelism, checkpointing, accumulation, offload and precision, each of which a
//! user may write. Every combination must either simulate or be refused with a scenario
//! error: never a panic. The mutation fuzzer (tests/fuzz.rs) mostly produces refusals;
//! this one mostly produces jobs, which is where a panic like session 14's (FSDP on a
//! pipeline with `reshard_after_forward = true`) hides.
//!
//! `STEPSIM_COMBOS=2000 STEPSIM_COMBOS_SEED=3 cargo test --release --test combos -- --nocapture`
//! runs a longer campaign.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepsim::scenario::Scenario;

fn pick<'a>(rng: &mut ChaCha8Rng, xs: &[&'a str]) -> &'a str {
    xs[rng.random_range(0..xs.len())]
}

fn scenario(rng: &mut ChaCha8Rng) -> String {
    let framework = pick(rng, &["fsdp", "fsdp1", "fsdp2", "deepspeed", "megatron"]);
    let sharding = pick(rng, &["none", "zero1", "shard_grad_op", "full_shard", "hybrid_shard"]);
    let tp = pick(rng, &["1", "1", "2"]);
    let pp = pick(rng, &["1", "1", "2"]);
    let cp = pick(rng, &["1", "1", "2"]);
    let mut parallel = format!(
        "framework = \"{framework}\"\nsharding = \"{sharding}\"\ntensor = {tp}\npipeline = {pp}\ncontext = {cp}\n"
    );
    for (key, values) in [
        ("reshard_after_forward", &["true", "false"][..]),
        ("no_sync", &["true", "false"]),
        ("backward_prefetch", &["\"pre\"", "\"post\"", "\"none\""]),
        ("sequence_parallel", &["true", "false"]),
        ("limit_all_gathers", &["true", "false"]),
    ] {
        if rng.random_bool(0.3) {
            parallel += &format!("{key} = {}\n", pick(rng, values));
        }
    }
    let precision = pick(rng, &["fsdp-bf16-mixed", "bf16-mixed-adam", "bf16", "fp32", "bf16-mixed-adam-fp32-grads"]);
    let ac = pick(rng, &["none", "full", "selective", "selective-op"]);
    let accum = pick(rng, &["1", "2", "4"]);
    let gpus = pick(rng, &["1", "4", "8", "16"]);
    let kernels = pick(rng, &["eager", "compiled", "fused"]);
    let offload = if rng.random_bool(0.15) { "[offload]\nparameters = \"cpu\"\n" } else { "" };
    let deepspeed = if framework == "deepspeed" && rng.random_bool(0.4) {
        pick(
            rng,
            &[
                "[deepspeed]\nreduce_bucket_size = 5e7\nsub_group_size = 1e7\noverlap_comm = true\n",
                // An early release (init-time moments, cached blocks) and a tight ZeRO-3 fetch window.
                "[deepspeed]\nversion = \"0.6\"\nstage3_prefetch_bucket_size = 1e6\nstage3_max_live_parameters = 3e6\nstage3_max_reuse_distance = 1e6\nstage3_param_persistence_threshold = 0\n",
            ],
        )
    } else {
        ""
    };
    format!(
        "[model]\nfamily = \"llama\"\nn_layers = 4\nhidden = 512\nn_heads = 8\nn_kv_heads = 4\nffn_hidden = 1536\nvocab = 8000\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\n{parallel}{offload}{deepspeed}\
         [training]\nmicro_batch = 1\nseq_len = 512\ngrad_accum = {accum}\nprecision = \"{precision}\"\nactivation_checkpointing = \"{ac}\"\nkernels = \"{kernels}\"\nsteps = 2\n"
    )
}

#[test]
fn valid_looking_combinations_simulate_or_are_refused_never_panic() {
    let cases: usize = std::env::var("STEPSIM_COMBOS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    let seed: u64 = std::env::var("STEPSIM_COMBOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(14);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut ran, mut refused) = (0, 0);
    let mut panics = Vec::new();
    for _ in 0..cases {
        let toml = scenario(&mut rng);
        let outcome = std::panic::catch_unwind(|| match Scenario::from_toml(Path::new("<combo>"), &toml) {
            Err(_) => None,
            // A simulated run's peak: what it allocated can never exceed what it reserved.
            Ok(s) => Some(stepsim::simulate(&s).ok().and_then(|sim| {
                let p = sim.report.peak?;
                (p.allocated.bytes > p.reserved.bytes)
                    .then(|| format!("allocated {} > reserved {}", p.allocated.bytes, p.reserved.bytes))
            })),
        });
        match outcome {
            Ok(Some(None)) => ran += 1,
            Ok(Some(Some(why))) => panics.push(format!("{why}\n{toml}")),
            Ok(None) => refused += 1,
            Err(_) => panics.push(toml),
        }
    }
    println!("combos: seed {seed}, {cases} cases: {ran} simulated, {refused} refused, {} problems", panics.len());
    assert!(panics.is_empty(), "panicked or broke an invariant on:\n{}", panics.join("\n---\n"));
    assert!(ran * 4 >= cases, "only {ran} of {cases} combinations simulated: the generator drifted into refusals");
}
