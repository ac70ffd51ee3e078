//! HYBRID_SHARD with an explicit shard group (`[parallel] hsdp_shard_size`: FSDP2's HSDP
//! mesh, torchtitan `data_parallel_shard_degree`), against figures derived by hand: model
//! state per GPU is 16 B/param (bf16-mixed Adam) over the shard group, and each unit's
//! reduced shard is all-reduced across the replicas once per micro-batch, unless a single
//! group spans every rank.

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::schedule::TaskKind;

const GPUS: u64 = 32;

fn scenario(shard: Option<u64>) -> Scenario {
    let size = shard.map_or(String::new(), |n| format!("hsdp_shard_size = {n}\n"));
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 4\nhidden = 1024\nn_heads = 8\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = 2048\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {GPUS}\n\
         [parallel]\nframework = \"fsdp\"\nsharding = \"hybrid_shard\"\n{size}\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 2\nprecision = \"bf16-mixed-adam\"\nactivation_checkpointing = \"none\"\n"
    );
    Scenario::from_toml(Path::new("<hsdp>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// (model state bytes per GPU, replica all-reduces in one step, parameters).
fn run(s: &Scenario) -> (u64, usize, u64) {
    let dag = stepsim::model::build(&s.model, &s.workload);
    let plan = stepsim::plan::Plan::new(&dag, s.parallel.clone(), s.training.clone(), GPUS, 8);
    let sched = stepsim::schedule::build_with(&dag, &plan, &s.cluster, false, 1);
    let all_reduces = sched.labels.iter().filter(|l| l.kind == TaskKind::AllReduce).count();
    (plan.model_state().total(), all_reduces, dag.param_count())
}

#[test]
fn the_shard_group_sets_the_state_and_the_replicas_all_reduce() {
    // Five units (root + four blocks), two micro-batches: one all-reduce of each unit's
    // shard per micro-batch while there is more than one replica.
    let (node, ar_node, params) = run(&scenario(None));
    let (four, ar_four, _) = run(&scenario(Some(4)));
    let (all, ar_all, _) = run(&scenario(Some(GPUS)));
    // Each unit's flat parameter is padded to a multiple of the group: within one element
    // per unit and rank of 16 B/param over the group.
    let near = |x: u64, shard: u64| x.abs_diff(16 * params / shard) <= 16 * 5;
    assert!(near(node, 8), "{node}");
    assert!(near(four, 4), "{four}");
    assert!(near(all, GPUS), "{all}");
    assert_eq!((ar_node, ar_four, ar_all), (10, 10, 0));
}
