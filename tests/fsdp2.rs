//! FSDP2's own buffers, rule by rule (src/schedule/sharding.rs and
//! `Framework::fsdp2_buffers` cite `torch/distributed/fsdp/_fully_shard/` of PyTorch 2.15):
//! flat all-gather outputs copied out into the unsharded parameters, unsharded gradients in
//! `param_dtype`, flat `reduce_dtype` reduce-scatter inputs kept until the next unit's
//! post-backward. The whole-step figures are checked against FSDPMemTracker in
//! tests/fidelity_pytorch.rs (the `e*` cases); these tests pin each rule on its own.

use std::path::Path;

use stepsim::memory::Category;
use stepsim::scenario::Scenario;

/// A 6-layer Llama (hidden 1024, FFN 4096: 16,779,264 parameters per block) on 4 GPUs, FP32
/// sharded parameters with BF16 all-gathers and FP32 reduce-scatters.
fn job(framework: &str, extra: &str) -> stepsim::Simulation {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 6\nhidden = 1024\nn_heads = 8\nffn_hidden = 4096\nvocab = 2048\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 4\n\
         [parallel]\nframework = \"{framework}\"\nsharding = \"full_shard\"\n{extra}\n\
         [training]\nmicro_batch = 1\nseq_len = 256\noptimizer = \"adam\"\nprecision = \"fsdp-bf16-mixed\"\nsteps = 2\n"
    );
    let s = Scenario::from_toml(Path::new("<fsdp2>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    stepsim::simulate(&s).unwrap()
}

const BLOCK_PARAMS: u64 = 4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024;

/// (what, start, end) of every task of step `step` whose text starts with `what`.
fn tasks(sim: &stepsim::Simulation, step: u32, what: &str) -> Vec<(String, u64, u64)> {
    let sched = sim.schedule();
    let tr = sim.trace();
    sched
        .program
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (&sched.labels[t.label as usize], tr.start_ns[i], tr.end_ns[i]))
        .filter(|(l, _, _)| l.step == step && l.what.starts_with(what))
        .map(|(l, a, b)| (l.what.clone(), a, b))
        .collect()
}

/// The end of the first (in forward: the only forward) task starting with `what`.
fn end_of(sim: &stepsim::Simulation, step: u32, what: &str) -> u64 {
    tasks(sim, step, what).iter().map(|t| t.2).min().unwrap_or_else(|| panic!("no {what}"))
}

fn start_of(sim: &stepsim::Simulation, step: u32, what: &str) -> u64 {
    let t = tasks(sim, step, what);
    assert_eq!(t.len(), 1, "{what}: {t:?}");
    t[0].1
}

#[test]
fn the_backward_peak_holds_one_flat_all_gather_output_and_one_reduce_scatter_input() {
    let sim = job("fsdp2", "");
    let (peak, phase) = sim.step_peak(2).unwrap();
    assert_eq!(phase.name(), "backward");
    let at = |c: Category| peak.by_category[c.index()];
    // The next block's BF16 all-gather output (prefetched, not yet copied out) and the
    // previous block's FP32 reduce-scatter input (kept until this block's post-backward).
    assert_eq!(at(Category::AllGatherBuffers), BLOCK_PARAMS * 2);
    assert_eq!(at(Category::ReduceScatterBuffers), BLOCK_PARAMS * 4);
    let generic = job("fsdp", "");
    let (peak, _) = generic.step_peak(2).unwrap();
    assert_eq!(peak.by_category[Category::AllGatherBuffers.index()], 0);
    assert_eq!(peak.by_category[Category::ReduceScatterBuffers.index()], 0);
}

#[test]
fn unsharded_gradients_are_in_param_dtype_and_the_reduce_scatter_input_in_reduce_dtype() {
    for (framework, grad_bytes) in [("fsdp2", 2), ("fsdp", 4)] {
        let sim = job(framework, "");
        let prog = &sim.schedule().program;
        let of = |cat: Category| -> Vec<u64> {
            prog.buffers.iter().filter(|b| b.category == cat).map(|b| b.bytes).collect()
        };
        // The largest weight gradients are the FFN's, hidden x FFN.
        let grads = of(Category::UnshardedGradients);
        assert_eq!(grads.iter().max(), Some(&(1024 * 4096 * grad_bytes)), "{framework}");
        let inputs = of(Category::ReduceScatterBuffers);
        if framework == "fsdp2" {
            assert!(inputs.contains(&(BLOCK_PARAMS * 4)));
        } else {
            assert!(inputs.is_empty());
        }
    }
}

#[test]
fn a_reduce_scatter_input_is_freed_at_the_next_post_backward_after_its_reduce_scatter() {
    let sim = job("fsdp2", "");
    let waits = tasks(&sim, 2, "wait for the previous reduce-scatter");
    // One per unit after the first to be reduced (5 blocks and the root), and one at the
    // end of backward for the last.
    assert_eq!(waits.len(), 7);
    // Block 4's post-backward releases block 5's input: after block 5's reduce-scatter, and
    // before block 4's copy-in allocates its own.
    let rs5 = end_of(&sim, 2, "reduce-scatter layers.5");
    let copy_in4 = start_of(&sim, 2, "reduce-scatter copy-in layers.4");
    assert!(waits.iter().any(|w| w.1 >= rs5 && w.2 <= copy_in4), "{waits:?}");
}

#[test]
fn the_next_forward_all_gather_is_issued_after_the_copy_out() {
    let sim = job("fsdp2", "");
    for l in 0..5 {
        let copied = end_of(&sim, 2, &format!("all-gather copy-out layers.{l}"));
        let next = tasks(&sim, 2, &format!("all-gather copy-in layers.{}", l + 1));
        // Forward's copy-in (backward's comes later).
        let issued = next.iter().map(|t| t.1).min().unwrap();
        assert!(issued >= copied, "layers.{}: issued {issued} before layers.{l} copied out at {copied}", l + 1);
    }
}

#[test]
fn fsdp2_costs_copy_kernels_on_the_compute_stream() {
    let t = |sim: &stepsim::Simulation| sim.report.throughput.as_ref().unwrap().step_time_s;
    let (two, generic) = (job("fsdp2", ""), job("fsdp", ""));
    assert!(t(&two) > t(&generic), "fsdp2 {} vs fsdp {}", t(&two), t(&generic));
    assert!(!tasks(&two, 2, "all-gather copy-out").is_empty());
    assert!(tasks(&generic, 2, "all-gather copy-out").is_empty());
}

/// `reshard_after_forward = 2` on 4 ranks: after its forward each block keeps half of its
/// BF16 parameters (FSDP2's post-forward shard) until its backward all-gathers them over
/// those 2 ranks; an int outside FSDP2, or not dividing the shard group, is refused.
#[test]
fn an_int_reshard_after_forward_keeps_post_forward_shards() {
    let sim = job("fsdp2", "reshard_after_forward = 2");
    let prog = &sim.schedule().program;
    let shards: Vec<u64> =
        prog.buffers.iter().filter(|b| b.category == Category::PostForwardShards).map(|b| b.bytes).collect();
    // Six blocks per forward, two steps.
    assert_eq!(shards.len(), 12);
    assert!(shards.iter().all(|&b| b == BLOCK_PARAMS * 2 / 2));
    // Backward all-gathers over 2 ranks move half of what 4 ranks move: faster.
    // The later of layers.3's two all-gathers of the step is the backward's.
    let ag = |sim: &stepsim::Simulation| {
        let t = tasks(sim, 2, "all-gather layers.3");
        let last = t.iter().max_by_key(|t| t.1).unwrap();
        last.2 - last.1
    };
    assert!(ag(&sim) < ag(&job("fsdp2", "")), "post-forward all-gathers are over fewer ranks");
    for (framework, raf, says) in [
        ("fsdp", "2", "parallel.framework = \"fsdp2\""),
        ("fsdp2", "3", "must divide the 4 ranks"),
        ("fsdp2", "4", "must divide the 4 ranks"),
    ] {
        let toml = format!(
            "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nvocab = 1000\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 4\n\
             [parallel]\nframework = \"{framework}\"\nsharding = \"full_shard\"\nreshard_after_forward = {raf}\n\
             [training]\nmicro_batch = 1\nseq_len = 128\n"
        );
        let e = Scenario::from_toml(Path::new("x.toml"), &toml).unwrap_err();
        assert_eq!(e.field, "parallel.reshard_after_forward", "{e}");
        assert!(e.message.contains(says), "{e}");
    }
}
