//! FSDP gradient accumulation without gradient sync (`[parallel] no_sync`: FSDP1
//! `no_sync()`, FSDP2 `set_requires_gradient_sync(False)`, HF Accelerate's default), against
//! figures derived by hand: every unit's unsharded gradient accumulates over the step's
//! micro-batches (the whole model's, in the gradient dtype, live at the last backward) and
//! each unit is reduce-scattered once per step instead of once per micro-batch.

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::schedule::TaskKind;

fn scenario(no_sync: bool) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 4\nhidden = 1024\nn_heads = 8\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = 2048\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
         [parallel]\nframework = \"fsdp\"\nsharding = \"full_shard\"\nno_sync = {no_sync}\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 4\nprecision = \"bf16-mixed-adam\"\nactivation_checkpointing = \"none\"\n"
    );
    Scenario::from_toml(Path::new("<no_sync>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

fn reduce_scatters_per_step(s: &Scenario) -> usize {
    let dag = stepsim::model::build(&s.model, &s.workload);
    let plan = stepsim::plan::Plan::new(&dag, s.parallel.clone(), s.training.clone(), 8, 8);
    let sched = stepsim::schedule::build_with(&dag, &plan, &s.cluster, false, 1);
    sched.labels.iter().filter(|l| l.kind == TaskKind::ReduceScatter).count()
}

#[test]
fn no_sync_reduces_once_per_step_and_holds_every_unsharded_gradient() {
    let (sync, nosync) = (scenario(false), scenario(true));
    // Five FSDP units (the root and four blocks), four micro-batches.
    assert_eq!(reduce_scatters_per_step(&sync), 5 * 4);
    assert_eq!(reduce_scatters_per_step(&nosync), 5);
    let unsharded = |s: &Scenario| {
        let r = stepsim::simulate(s).unwrap().report;
        let p = r.peak.unwrap();
        let b = p.breakdown.iter().find(|c| c.category == "unsharded_gradients").map_or(0, |c| c.size.bytes);
        (b, p.allocated.bytes, r.param_count)
    };
    let (g0, p0, params) = unsharded(&sync);
    let (g1, p1, _) = unsharded(&nosync);
    // At the peak of the accumulating run every parameter's BF16 gradient is live.
    assert_eq!(g1, params * 2);
    assert!(g0 < g1 / 2, "{g0} {g1}");
    assert!(p1 > p0 + params, "{p1} {p0}");
}
