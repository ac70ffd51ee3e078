//! A mixture of experts under FSDP2 with expert parallelism, as torchtitan runs it
//! (`torchtitan/distributed/parallel_dims.py` `build_mesh`: the dense mesh `fsdp = dp_shard *
//! cp`, the sparse mesh `["pp", "dp_replicate", "efsdp", "ep"]` with `efsdp = dp_shard * cp *
//! tp // ep`; `torchtitan/distributed/fsdp.py` `apply_fsdp_to_decoder`: each MoE block one
//! `fully_shard` whose `shard_placement_fn` puts the routed experts on the efsdp mesh and the
//! rest on the fsdp mesh). Figures derived by hand for a small Mixtral-shaped llama (hidden
//! 1024, 8 experts of 3584, top-2, 4 blocks), as in tests/moe.rs.

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::schedule::TaskKind;

const H: u64 = 1024;
const FE: u64 = 3584;
const E: u64 = 8;
const LAYERS: u64 = 4;
const VOCAB: u64 = 32000;

fn toml(gpus: u64, parallel: &str) -> String {
    format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\nmax_seq_len = 2048\n\
         [model.moe]\nnum_experts = {E}\ntop_k = 2\nexpert_ffn_hidden = {FE}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\n{parallel}\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 1\nprecision = \"fsdp-bf16-mixed\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n"
    )
}

fn scenario(gpus: u64, parallel: &str) -> Scenario {
    Scenario::from_toml(Path::new("<moe_fsdp>"), &toml(gpus, parallel)).unwrap_or_else(|e| panic!("{e}"))
}

/// The job simulated, checked to fit.
fn fitting(gpus: u64, parallel: &str) -> (Scenario, stepsim::Simulation) {
    let s = scenario(gpus, parallel);
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, stepsim::report::Verdict::Fits { .. }), "{:?}", sim.report.verdict);
    (s, sim)
}

fn refused(gpus: u64, parallel: &str) -> String {
    match Scenario::from_toml(Path::new("<moe_fsdp>"), &toml(gpus, parallel)) {
        Ok(_) => panic!("accepted: {parallel}"),
        Err(e) => e.to_string(),
    }
}

/// The expert all-to-alls' bytes of a job whose ranks each route 1,024 tokens (checked).
fn dispatches_of_a_1024_token_shard(s: &Scenario) -> Vec<u64> {
    let dag = stepsim::model::build(&s.model, &s.workload);
    assert_eq!(dag.tokens(), 1024);
    dag.ops
        .iter()
        .filter(|o| o.comm.is_some_and(|c| c.group == stepsim::model::CommGroup::Expert))
        .map(|o| o.comm.unwrap().bytes)
        .collect()
}

/// (name, ranks) of each communicator NCCL's estimate holds.
fn nccl_groups(s: &Scenario) -> Vec<(String, u64)> {
    s.nccl_estimate().communicators.iter().map(|(c, _)| (c.name.clone(), c.ranks)).collect()
}

/// (what, payload bytes) of step 1's tasks of `kind` for unit `u`.
fn collectives(sim: &stepsim::Simulation, kind: TaskKind, u: usize) -> Vec<(String, u64)> {
    let sched = sim.schedule();
    sched
        .program
        .tasks
        .iter()
        .map(|t| &sched.labels[t.label as usize])
        .filter(|l| l.step == 1 && l.kind == kind && l.unit == Some(u))
        .map(|l| (l.what.clone(), l.bytes))
        .collect()
}

/// 16 H100s (two nodes), FSDP2 full_shard, expert 4: the fsdp mesh is all 16 ranks, the
/// efsdp mesh 16 / 4 = 4. Per block, by hand:
/// - non-expert: attention 4 x 1024^2 + two norms 2 x 1024, router 8 x 1024 = 4,204,544,
///   over 16: 262,784 elements a rank;
/// - routed experts: 8 / 4 = 2 experts of 3 x 1024 x 3584 = 22,020,096 on each EP rank,
///   over the 4 efsdp ranks: 5,505,024 elements a rank;
/// - root (embeddings, head, final norm): 2 x 32000 x 1024 + 1024 = 65,537,024 over 16 =
///   4,096,064.
///
/// The block's all-gather gathers 16 x 262,784 + 4 x 5,505,024 = 26,224,640 elements in
/// BF16 (52,449,280 B); its reduce-scatter the same count in FP32 (104,898,560 B). At rest
/// (fsdp-bf16-mixed: FP32 parameters and gradients, two FP32 Adam moments) a rank holds
/// 4 x 5,767,808 + 4,096,064 = 27,167,296 elements: 108,669,184 B of parameters, as many
/// of gradients, 217,338,368 B of moments.
#[test]
fn per_rank_shards_gathered_sizes_and_reduce_scatters_by_hand() {
    let s = scenario(16, "framework = \"fsdp2\"\nsharding = \"full_shard\"\nexpert = 4");
    let sim = stepsim::simulate(&s).unwrap();
    let plan = sim.plan();
    assert_eq!((plan.shard_group, plan.edp, plan.expert_shard_group), (16, 4, 4));
    let dense = 4 * H * H + 2 * H + E * H;
    assert_eq!(dense, 4_204_544);
    let local_experts = (E / 4) * 3 * H * FE;
    assert_eq!(local_experts, 22_020_096);
    for u in 1..=LAYERS as usize {
        assert_eq!(plan.units[u].expert_params, local_experts);
        assert_eq!(plan.expert_split(u), Some((262_784, 5_505_024)));
        assert_eq!(plan.units[u].shard_params, 262_784 + 5_505_024);
    }
    assert_eq!(plan.expert_split(0), None);
    assert_eq!(plan.units[0].shard_params, 4_096_064);
    let ms = plan.model_state();
    let at_rest = 4 * 5_767_808 + 4_096_064;
    assert_eq!(at_rest, 27_167_296);
    assert_eq!(ms.parameters, 108_669_184);
    assert_eq!(ms.gradients, 108_669_184);
    assert_eq!(ms.optimizer_state, 217_338_368);
    assert_eq!(ms.master_weights, 0);
    // One block: its forward and backward all-gathers, each over both meshes.
    let ag = collectives(&sim, TaskKind::AllGather, 1);
    assert_eq!(
        ag,
        vec![
            ("all-gather layers.0 (fsdp, efsdp meshes)".to_string(), 52_449_280),
            ("all-gather layers.0 (fsdp, efsdp meshes)".to_string(), 52_449_280)
        ]
    );
    let rs = collectives(&sim, TaskKind::ReduceScatter, 1);
    assert_eq!(rs, vec![("reduce-scatter layers.0 (fsdp, efsdp meshes)".to_string(), 104_898_560)]);
    // The report says which framework and which mesh.
    let text = stepsim::report::text::render(&sim.report, &s);
    assert!(text.contains("torchtitan (FSDP2 over expert parallelism)"), "{text}");
    assert!(text.contains("each expert on 4 GPUs (torchtitan's efsdp mesh"), "{text}");
    // The root has no experts: one all-gather over the fsdp mesh, as before.
    let root = collectives(&sim, TaskKind::AllGather, 0);
    assert!(root.iter().all(|(w, b)| w == "all-gather root (embeddings, final norm, head)" && *b == 65_537_024 * 2));
}

/// The expert shard shrinks as expert parallelism grows (efsdp = 16 / ep), the non-expert
/// shard does not: ep x efsdp is the 16 ranks, so a rank's expert shard is the same
/// 1/16 of all experts whatever ep is (what ep changes is what a block gathers).
#[test]
fn the_efsdp_mesh_is_fsdp_over_expert_parallelism() {
    for (ep, efsdp) in [(2, 8), (4, 4), (8, 2)] {
        let s = scenario(16, &format!("framework = \"fsdp2\"\nsharding = \"full_shard\"\nexpert = {ep}"));
        let sim = stepsim::simulate(&s).unwrap();
        let plan = sim.plan();
        assert_eq!(plan.expert_shard_group, efsdp, "ep {ep}");
        let local = (E * 3 * H * FE) / ep;
        assert_eq!(plan.expert_split(1), Some((262_784, local.div_ceil(efsdp))), "ep {ep}");
        assert_eq!(local / efsdp, E * 3 * H * FE / 16);
    }
    // With tensor parallelism 2 and the experts whole (torchtitan's EP: expert_tensor 1),
    // efsdp = 16 / 4 = 4 over dp_shard 8 x tp 2, the rest over the 8 data-parallel ranks.
    let s = scenario(
        16,
        "framework = \"fsdp2\"\nsharding = \"full_shard\"\ntensor = 2\nsequence_parallel = true\nexpert = 4\nexpert_tensor = 1",
    );
    let plan = stepsim::simulate(&s).unwrap().plan().clone();
    assert_eq!((plan.shard_group, plan.expert_shard_group), (8, 4));
    let local = E / 4 * 3 * H * FE;
    assert_eq!(plan.units[1].expert_params, local);
    assert_eq!(plan.expert_split(1).unwrap().1, local.div_ceil(4));
}

/// What stays refused, each naming its field.
#[test]
fn what_stays_refused() {
    let e = refused(16, "framework = \"fsdp\"\nsharding = \"full_shard\"\nexpert = 4");
    assert!(e.contains("parallel.sharding"), "{e}");
    // Under hybrid_shard the experts fold over each replica's shard group: ep must divide it.
    let e = refused(16, "framework = \"fsdp2\"\nsharding = \"hybrid_shard\"\nhsdp_shard_size = 2\nexpert = 4");
    assert!(e.contains("parallel.expert") && e.contains("shard group (2 ranks"), "{e}");
    // Context parallelism with a mixture of experts outside Megatron and torchtitan.
    let e = refused(16, "framework = \"fsdp\"\nsharding = \"full_shard\"\ncontext = 2");
    assert!(e.contains("parallel.context") && e.contains("FSDP1 / DDP"), "{e}");
    let e = refused(16, "framework = \"fsdp2\"\nsharding = \"zero2\"\nexpert = 4");
    assert!(e.contains("parallel.sharding"), "{e}");
    let e = refused(16, "framework = \"fsdp2\"\nsharding = \"full_shard\"\nexpert = 4\nreshard_after_forward = 4");
    assert!(e.contains("parallel.reshard_after_forward"), "{e}");
    // torchtitan keeps routed experts whole: expert_tensor (default: tensor) must be 1.
    let e = refused(
        16,
        "framework = \"fsdp2\"\nsharding = \"full_shard\"\ntensor = 2\nsequence_parallel = true\nexpert = 4",
    );
    assert!(e.contains("parallel.tensor") && e.contains("expert_tensor = 1"), "{e}");
    let e = refused(16, "framework = \"fsdp2\"\nsharding = \"full_shard\"\nexpert = 4\nexpert_tensor = 2");
    assert!(e.contains("parallel.expert_tensor"), "{e}");
    // ep must divide dp_shard x cp x tp.
    let e = refused(16, "framework = \"fsdp2\"\nsharding = \"full_shard\"\nexpert = 32");
    assert!(e.contains("parallel.expert"), "{e}");
    // A MoE with tensor parallelism alone is still ZeRO-1 at most.
    let e = refused(16, "framework = \"fsdp2\"\nsharding = \"full_shard\"\ntensor = 2\nsequence_parallel = true");
    assert!(e.contains("parallel.sharding"), "{e}");
}

/// Mixtral 8x7B on 16 H100s (two nodes), FSDP2 full_shard, activation checkpointing,
/// with expert parallelism 8 (torchtitan) against without (every block's 8 experts sharded
/// over all 16 ranks). A rank's state at rest is the same 1/16 of the model either way (ep x
/// efsdp = 16); with EP a block all-gathers its non-expert weights and its one local expert
/// (2 efsdp ranks' shards) instead of all 8 experts, and the tokens travel instead.
#[test]
fn mixtral_8x7b_on_16_h100_with_fsdp2_and_ep8() {
    let run = |expert: u64| {
        let toml = format!(
            "[model]\nname = \"mixtral-8x7b\"\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 16\n\
             [parallel]\nframework = \"fsdp2\"\nsharding = \"full_shard\"\nexpert = {expert}\n\
             [training]\nmicro_batch = 1\nseq_len = 4096\ngrad_accum = 1\nprecision = \"fsdp-bf16-mixed\"\nactivation_checkpointing = \"full\"\n"
        );
        let s = Scenario::from_toml(Path::new("<mixtral>"), &toml).unwrap_or_else(|e| panic!("{e}"));
        (stepsim::simulate(&s).unwrap(), s.model.param_count())
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let (ep8, whole) = run(8);
    let (ep1, _) = run(1);
    let block_gather = |sim: &stepsim::Simulation| collectives(sim, TaskKind::AllGather, 1)[0].1;
    for (name, sim) in [("EP 8", &ep8), ("no EP", &ep1)] {
        let ms = sim.plan().model_state();
        let r = &sim.report;
        let t = r.throughput.as_ref().unwrap();
        println!(
            "Mixtral 8x7B, 16 x H100, FSDP2 full_shard, {name}: parameters {:.2} GiB, gradients {:.2} GiB, optimizer {:.2} GiB a rank; block all-gather {:.3} GiB; peak allocated {:.2} GiB; step {:.3} s, MFU {:.3}; {:?}",
            gib(ms.parameters),
            gib(ms.gradients),
            gib(ms.optimizer_state),
            gib(block_gather(sim)),
            gib(r.peak.as_ref().unwrap().allocated.bytes),
            t.step_time_s,
            t.mfu,
            r.verdict
        );
    }
    let plan = ep8.plan();
    assert_eq!((plan.shard_group, plan.expert_shard_group), (16, 2));
    // The same state at rest, to the padding of the shards.
    let (a, b) = (plan.model_state().parameters, ep1.plan().model_state().parameters);
    assert!(a.abs_diff(b) < 64 * 4 * 16, "{a} {b}");
    assert!(a.abs_diff(whole * 4 / 16) < 64 * 4 * 16);
    // A block's BF16 all-gather: its non-expert part and one expert of 3 x 4096 x 14336
    // with EP; all eight without.
    let expert = 3 * 4096 * 14336u64;
    assert_eq!(block_gather(&ep1) - block_gather(&ep8), 7 * expert * 2);
    assert!(matches!(ep8.report.verdict, stepsim::report::Verdict::Fits { .. }), "{:?}", ep8.report.verdict);
    assert!(ep8.report.peak.as_ref().unwrap().allocated.bytes < ep1.report.peak.as_ref().unwrap().allocated.bytes);
}

/// torchtitan's meshes over 16 ranks (two nodes of 8) with tensor 2, expert 4
/// (`build_mesh`: dense `["dp_shard", "tp"]` = 8 x 2, sparse `["efsdp", "ep"]` = 4 x 4 over
/// the same flattened ranks): the fsdp group is the 8 ranks of one tp index (stride 2, 4 a
/// node), the ep group 4 consecutive ranks (one node), the efsdp group 4 ranks 4 apart (2 a
/// node). Those are the groups the collectives are costed on, and a block's all-gather takes
/// the fsdp mesh's all-gather of its non-expert part plus the efsdp mesh's of its experts
/// (its nominal duration; the engine may stretch it where other traffic shares the links).
#[test]
fn groups_follow_torchtitans_mesh_order_and_the_all_gather_runs_on_both() {
    use stepsim::net::Collective;
    let s = scenario(
        16,
        "framework = \"fsdp2\"\nsharding = \"full_shard\"\ntensor = 2\nsequence_parallel = true\nexpert = 4\nexpert_tensor = 1",
    );
    let sim = stepsim::simulate(&s).unwrap();
    let plan = sim.plan();
    let cost = stepsim::schedule::Cost::for_plan(&s.cluster, plan);
    let g = |x: &stepsim::net::Group| (x.ranks, x.ranks_per_node);
    assert_eq!(g(&cost.shard_group), (8, 4));
    assert_eq!(g(&cost.ep_group), (4, 4));
    assert_eq!(g(&cost.edp_group), (4, 2));
    let (dense, expert) = plan.expert_split(1).unwrap();
    // tensor 2: the attention's projections are halved, the norms and the router are not.
    assert_eq!(dense, (4 * H * H / 2 + 2 * H + E * H).div_ceil(8));
    assert_eq!(expert, (E / 4 * 3 * H * FE).div_ceil(4));
    let (d, e) = (dense * 8 * 2, expert * 4 * 2);
    let want = cost.shard_group.time_s(Collective::AllGather, d) + cost.edp_group.time_s(Collective::AllGather, e);
    let sched = sim.schedule();
    let got: Vec<u64> = sched
        .program
        .tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            let l = &sched.labels[t.label as usize];
            l.step == 1 && l.what == "all-gather layers.0 (fsdp, efsdp meshes)"
        })
        .map(|(_, t)| t.duration_ns)
        .collect();
    assert_eq!(got.len(), 2);
    for ns in got {
        assert!((ns as f64 - want * 1e9).abs() <= 2.0, "{ns} ns, want {:.0}", want * 1e9);
    }
}

/// torchtitan's combine scales each routed copy in FP32 (`routed_output.to(torch.float32) *
/// topk_scores`, torchtitan/models/common/token_dispatcher.py): the product keeps the FP32
/// copy for the scores' gradient, 4 B per element, where the copies themselves are BF16.
#[test]
fn the_combine_keeps_an_fp32_copy_of_the_routed_outputs() {
    let s = scenario(8, "framework = \"fsdp2\"\nsharding = \"full_shard\"\nexpert = 8");
    assert_eq!(s.workload.routing_scale, stepsim::model::RoutingScale::AfterCombineFp32);
    let dag = stepsim::model::build(&s.model, &s.workload);
    let copies = 2048 * 2;
    let find = |name: &str| dag.tensors.iter().position(|t| t.name == name).unwrap_or_else(|| panic!("{name}"));
    let up = find("layers.0.feed_forward.combine.out.float");
    assert_eq!(dag.tensors[up].bytes, copies * H * 4);
    assert_eq!(dag.tensors[find("layers.0.feed_forward.combine.out")].bytes, copies * H * 2);
    let unpermute = dag.ops.iter().find(|o| o.name == "layers.0.feed_forward.unpermute").unwrap();
    assert!(unpermute.saves.contains(&up));
    assert!(!unpermute.saves.contains(&find("layers.0.feed_forward.combine.out")));
}

/// torchtitan's HSDP over expert parallelism: 32 H100s (four nodes), hybrid_shard with the
/// shard group a node (8 ranks, 4 replicas), expert 4, so the efsdp mesh is 8 / 4 = 2 ranks
/// inside each replica. Per block, by hand: non-expert 4,204,544 over 8 = 525,568 elements a
/// rank; routed experts 2 x 3 x 1024 x 3584 = 22,020,096 on each EP rank, over 2 =
/// 11,010,048; root 65,537,024 over 8 = 8,192,128. The block gathers what it gathered under
/// full_shard (26,224,640 elements, BF16: 52,449,280 B), reduce-scatters it in FP32
/// (104,898,560 B), then all-reduces its FP32 shard across the 4 replicas: (525,568 +
/// 11,010,048) x 4 = 46,142,464 B. At rest a rank holds 4 x 11,535,616 + 8,192,128 =
/// 54,334,592 elements: 217,338,368 B of FP32 parameters.
#[test]
fn hsdp_folds_expert_parallelism_into_each_replica() {
    let s = scenario(32, "framework = \"fsdp2\"\nsharding = \"hybrid_shard\"\nexpert = 4");
    let sim = stepsim::simulate(&s).unwrap();
    let plan = sim.plan();
    assert_eq!((plan.shard_group, plan.edp, plan.expert_shard_group), (8, 2, 2));
    for u in 1..=LAYERS as usize {
        assert_eq!(plan.expert_split(u), Some((525_568, 11_010_048)));
    }
    assert_eq!(plan.units[0].shard_params, 8_192_128);
    assert_eq!(plan.model_state().parameters, 217_338_368);
    let ag = collectives(&sim, TaskKind::AllGather, 1);
    assert!(ag.iter().all(|(w, b)| w == "all-gather layers.0 (fsdp, efsdp meshes)" && *b == 52_449_280), "{ag:?}");
    let rs = collectives(&sim, TaskKind::ReduceScatter, 1);
    assert_eq!(rs, vec![("reduce-scatter layers.0 (fsdp, efsdp meshes)".to_string(), 104_898_560)]);
    let ar = collectives(&sim, TaskKind::AllReduce, 1);
    assert_eq!(ar, vec![("all-reduce layers.0 shard across nodes".to_string(), 46_142_464)]);
    let text = stepsim::report::text::render(&sim.report, &s);
    assert!(text.contains("each expert on 8 GPUs (4 replicas of torchtitan's efsdp mesh of 2 GPUs"), "{text}");
    // NCCL: the shard and replica groups, and the efsdp mesh.
    let names = nccl_groups(&s);
    for (name, ranks) in [("HSDP shard group (8 ranks)", 8), ("HSDP replica group (4 ranks)", 4)] {
        assert!(names.contains(&(name.to_string(), ranks)), "{names:?}");
    }
    assert!(names.iter().any(|(n, r)| n.starts_with("efsdp mesh (2 ranks") && *r == 2), "{names:?}");
}

/// torchtitan's context parallelism with expert parallelism: 16 H100s, FSDP2 full_shard,
/// context 2, expert 4. The fsdp mesh is dp_shard x cp = 8 x 2 = 16 ranks and the efsdp mesh
/// dp_shard x cp / ep = 4; each rank routes its own 1,024 of each sequence's 2,048 tokens, so
/// a dispatch moves 1,024 x 2 copies x 1,024 x 2 B = 4 MiB.
#[test]
fn context_parallel_ranks_join_the_efsdp_mesh() {
    let (s, sim) = fitting(16, "framework = \"fsdp2\"\nsharding = \"full_shard\"\ncontext = 2\nexpert = 4");
    let plan = sim.plan();
    assert_eq!((plan.shard_group, plan.edp, plan.expert_shard_group), (16, 4, 4));
    assert_eq!(plan.expert_split(1), Some((262_784, 5_505_024)));
    let a2a = dispatches_of_a_1024_token_shard(&s);
    assert_eq!(a2a.len() as u64, 2 * LAYERS);
    assert!(a2a.iter().all(|&b| b == 4 << 20), "{a2a:?}");
    assert!(sim
        .report
        .assumptions
        .iter()
        .any(|a| a.starts_with("mixture of experts with context parallel 2 (torchtitan)")));
}

/// torchtitan's HSDP with context parallelism over expert parallelism: 32 H100s (four nodes),
/// hybrid_shard with the shard group a node, context 2, expert 4. torchtitan's mesh for it:
/// dp_replicate 4 x dp_shard 4 x cp 2, the dense fsdp mesh dp_shard x cp = 8 (a node), the
/// sparse mesh dp_replicate 4 x efsdp (4 x 2 / 4 = 2) x ep 4. So the state per rank is the HSDP
/// job's (`hsdp_folds_expert_parallelism_into_each_replica`), the replicas' all-reduce the same,
/// and each rank routes its own 1,024 of each sequence's 2,048 tokens: a dispatch moves 1,024 x
/// 2 copies x 1,024 x 2 B = 4 MiB.
#[test]
fn hsdp_with_context_parallelism_folds_both_into_each_replica() {
    let (s, sim) = fitting(32, "framework = \"fsdp2\"\nsharding = \"hybrid_shard\"\ncontext = 2\nexpert = 4");
    let plan = sim.plan();
    assert_eq!((plan.shard_group, plan.edp, plan.expert_shard_group), (8, 2, 2));
    for u in 1..=LAYERS as usize {
        assert_eq!(plan.expert_split(u), Some((525_568, 11_010_048)));
    }
    assert_eq!(plan.model_state().parameters, 217_338_368);
    let ar = collectives(&sim, TaskKind::AllReduce, 1);
    assert_eq!(ar, vec![("all-reduce layers.0 shard across nodes".to_string(), 46_142_464)]);
    let a2a = dispatches_of_a_1024_token_shard(&s);
    assert_eq!(a2a.len() as u64, 2 * LAYERS);
    assert!(a2a.iter().all(|&b| b == 4 << 20), "{a2a:?}");
    let names = nccl_groups(&s);
    for (name, ranks) in [("HSDP shard group (8 ranks)", 8), ("HSDP replica group (4 ranks)", 4)] {
        assert!(names.contains(&(name.to_string(), ranks)), "{names:?}");
    }
    assert!(names.iter().any(|(n, r)| n.starts_with("efsdp mesh (2 ranks") && *r == 2), "{names:?}");
    assert!(names.iter().any(|(n, r)| n.starts_with("context parallel") && *r == 2), "{names:?}");
    let text = stepsim::report::text::render(&sim.report, &s);
    assert!(text.contains("each expert on 8 GPUs (4 replicas of torchtitan's efsdp mesh of 2 GPUs"), "{text}");
}
