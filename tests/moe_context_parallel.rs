//! A mixture of experts with context parallelism, as Megatron-Core runs it, against figures
//! derived by hand and against Megatron-Core's own rank layout:
//!
//! - the MoE layer sees only this rank's 1/cp of each sequence (`moe_layer.py`: the
//!   `[s/cp, b, h]` hidden states of its chunk; routing is per token, so nothing but the
//!   token count changes inside the layer): router rows, all-to-all bytes and saved copies;
//! - the experts fold over a stage's tensor x context x data ranks
//!   (`parallel_state.py` `initialize_model_parallel`: the expert `RankGenerator` has `cp=1`,
//!   `expert_data_parallel_size = world_size // (etp x ep x pp)`), so the context ranks join
//!   the expert-data-parallel group, while dense gradients reduce over data x context;
//! - the groups a simulation times collectives on, and the ranks each uneven-routing rank
//!   class stands for, equal the groups `generate_masked_orthogonal_rank_groups` builds in
//!   Megatron's order `tp-cp-ep-dp-pp` (ported below);
//! - NCCL's communicators, explain's context-parallel row, and Mixtral 8x7B with a ring of 2.
//!
//! The model is the small Mixtral-shaped llama of `tests/moe.rs` (hidden 1024, 8 experts of
//! 3584, top-2) over 4096 tokens.

use std::path::Path;

use stepsim::model::{self, CommGroup, Region};
use stepsim::net::Group;
use stepsim::plan::Plan;
use stepsim::scenario::Scenario;
use stepsim::schedule::{Cost, TaskKind};

const H: u64 = 1024;
const FE: u64 = 3584;
const E: u64 = 8;
const K: u64 = 2;
const SEQ: u64 = 4096;
const LAYERS: u64 = 4;
const VOCAB: u64 = 32000;
const GPUS_PER_NODE: u64 = 8;

/// The model on `gpus` H100s (8 a node) with `parallel` lines under Megatron-LM, one
/// sequence of `seq` tokens per micro-batch, and an optional `[moe]` section.
fn scenario_with(gpus: u64, parallel: &str, seq: u64, routing: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\nmax_seq_len = {SEQ}\n\
         [model.moe]\nnum_experts = {E}\ntop_k = {K}\nexpert_ffn_hidden = {FE}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\nframework = \"megatron\"\n{parallel}\n\
         {routing}\n\
         [training]\nmicro_batch = 1\nseq_len = {seq}\ngrad_accum = 2\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n"
    );
    Scenario::from_toml(Path::new("<moe-cp>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

fn scenario(gpus: u64, parallel: &str) -> Scenario {
    scenario_with(gpus, parallel, SEQ, "")
}

/// With a ring of 2 each GPU holds 2048 of the 4096 tokens: the router's GEMM has 2048 rows,
/// each all-to-all moves 2048 x top-2 x 1024 x 2 B = 8 MiB, and the block saves what a
/// GPU running a 2048-token sequence alone saves (by hand: the MLP's input, the FP32 scores,
/// the int64 indices and FP32 probabilities of the 4096 copies, the dispatched and combined
/// copies, Megatron's fused SwiGLU's gate and up outputs and the down projection's input).
/// With tensor 2 and sequence parallelism a GPU routes 4096 / 2 / 2 = 1024 rows.
#[test]
fn the_moe_layer_routes_this_ranks_share_of_the_sequence() {
    let s = scenario(16, "context = 2\nexpert = 8\nsharding = \"zero1\"");
    let dag = model::build(&s.model, &s.workload);
    let t = SEQ / 2;
    assert_eq!(dag.tokens(), t);
    assert_eq!(s.routed_copies(), t * K);
    let op = |name: &str| dag.ops.iter().find(|o| o.name == name).unwrap_or_else(|| panic!("{name}"));
    assert_eq!(op("layers.0.feed_forward.router").gemm, Some([t, E, H]));
    let a2a: Vec<_> = dag.ops.iter().filter(|o| o.comm.is_some_and(|c| c.group == CommGroup::Expert)).collect();
    assert_eq!(a2a.len() as u64, 2 * LAYERS);
    for o in &a2a {
        assert_eq!(o.comm.unwrap().bytes, t * K * H * 2, "{}", o.name);
        assert_eq!(o.comm.unwrap().bytes, 8 << 20);
    }
    // One expert per GPU (8 over 8): each grouped GEMM runs on all 4096 copies received.
    assert_eq!(op("layers.0.feed_forward.experts.w1").gemm, Some([t * K, FE, H]));
    // The same block as a GPU alone with half the sequence.
    let alone = scenario_with(8, "expert = 8\nsharding = \"zero1\"", t, "");
    let alone = model::build(&alone.model, &alone.workload);
    assert_eq!(dag.saved_bytes(Region::Block(1), true), alone.saved_bytes(Region::Block(1), true));
    let mut dense_cfg = s.model.clone();
    dense_cfg.moe = None;
    let dense = model::build(&dense_cfg, &s.workload);
    let c = 2;
    let copies = t * K;
    let attention = dense.saved_bytes(Region::Block(1), true) - (t * H * c + 3 * t * FE * c);
    // Megatron-Core scales the copies inside the experts' SwiGLU: the dispatched copies are
    // saved once (tests/moe.rs `a_moe_block_saves_the_routed_copies`).
    let moe = t * H * c + t * E * 4 + copies * 8 + copies * 4 + copies * H * c + 3 * copies * FE * c;
    assert_eq!(dag.saved_bytes(Region::Block(1), true), attention + moe);
    // Forward dispatch and combine, twice that backward, per block and micro-batch.
    let sim = stepsim::simulate(&s).unwrap();
    let n = sim.schedule().labels.iter().filter(|l| l.kind == TaskKind::AllToAll && l.step == 1).count() as u64;
    assert_eq!(n, 2 * LAYERS * 4);
    assert!(sim.report.assumptions.iter().any(|a| a.starts_with("mixture of experts with context parallel 2")));
    // Tensor 2 with sequence parallelism on top: 1024 rows per GPU.
    let tp = scenario(16, "tensor = 2\nsequence_parallel = true\ncontext = 2\nexpert = 4\nexpert_tensor = 1");
    let dag = model::build(&tp.model, &tp.workload);
    let rows = SEQ / 2 / 2;
    assert_eq!(tp.routed_copies(), rows * K);
    let router = dag.ops.iter().find(|o| o.name == "layers.0.feed_forward.router").unwrap();
    assert_eq!(router.gemm, Some([rows, E, H]));
    let dispatch = dag.ops.iter().find(|o| o.name == "layers.0.feed_forward.dispatch").unwrap();
    assert_eq!(dispatch.comm.unwrap().bytes, rows * K * H * 2);
}

/// Megatron-Core's `generate_masked_orthogonal_rank_groups` (parallel_state.py): with the
/// axes' sizes in order (fastest first), the groups varying the masked axes with the others
/// fixed, ranks = sum(index_i x prefix_product_i).
fn groups(sizes: &[u64], mask: &[bool]) -> Vec<Vec<u64>> {
    let strides: Vec<u64> = sizes.iter().scan(1, |p, &x| Some(std::mem::replace(p, *p * x))).collect();
    let world: u64 = sizes.iter().product();
    let decompose = |r: u64| -> Vec<u64> { sizes.iter().zip(&strides).map(|(&s, &d)| (r / d) % s).collect() };
    let mut out: Vec<Vec<u64>> = Vec::new();
    for r in 0..world {
        let idx = decompose(r);
        // The group's representative: the masked axes at 0.
        if idx.iter().zip(mask).any(|(&i, &m)| m && i != 0) {
            continue;
        }
        let n: u64 = sizes.iter().zip(mask).filter(|(_, &m)| m).map(|(&s, _)| s).product();
        let masked: Vec<usize> = (0..sizes.len()).filter(|&i| mask[i]).collect();
        let mut g = Vec::with_capacity(n as usize);
        for j in 0..n {
            let mut rest = j;
            let mut rank = r;
            for &i in &masked {
                rank += (rest % sizes[i]) * strides[i];
                rest /= sizes[i];
            }
            g.push(rank);
        }
        out.push(g);
    }
    out
}

/// The docstring's example: sizes [tp 2, dp 3, pp 4], the dp groups.
#[test]
fn the_rank_group_port_reproduces_megatrons_example() {
    let dp = groups(&[2, 3, 4], &[false, true, false]);
    assert_eq!(dp.len(), 8);
    assert_eq!(dp[0], vec![0, 2, 4]);
    assert_eq!(dp[1], vec![1, 3, 5]);
    assert_eq!(dp[7], vec![19, 21, 23]);
}

/// A group's size and how many of its ranks share the first one's node.
fn shape(g: &[u64]) -> (u64, u64) {
    let node = g[0] / GPUS_PER_NODE;
    (g.len() as u64, g.iter().filter(|&&r| r / GPUS_PER_NODE == node).count() as u64)
}

fn assert_group(what: &str, megatron: &[Vec<u64>], simulated: &Group) {
    // Every group of a kind has the same shape in these layouts.
    let shapes: Vec<(u64, u64)> = megatron.iter().map(|g| shape(g)).collect();
    assert!(shapes.windows(2).all(|w| w[0] == w[1]), "{what}: {shapes:?}");
    let (ranks, per_node) = shapes[0];
    assert_eq!(simulated.ranks, ranks, "{what}: size");
    if ranks > 1 {
        assert_eq!(simulated.ranks_per_node.min(ranks), per_node, "{what}: ranks per node ({megatron:?})");
    }
}

/// Expert state and groups, for layouts of tensor, context, expert tensor, expert and
/// pipeline: expert data parallel = tensor x context x data / (expert tensor x expert)
/// (`initialize_model_parallel`: world / (etp x ep x pp)); each GPU holds E / ep experts at
/// 1/etp of their width; ZeRO-1 shards the dense state over data x context and the expert
/// state over the expert-data-parallel group. The simulated tensor, context, data x context,
/// expert tensor, expert and expert-data groups have the sizes and node spans of Megatron's
/// groups from its two rank generators (dense `tp-cp-dp-pp`, expert `tp-ep-dp-pp` with
/// cp = 1).
#[test]
fn experts_fold_over_tensor_context_and_data_as_megatrons_rank_generators_do() {
    let attn = 4 * H * H + 2 * H;
    let expert = 3 * H * FE;
    // (gpus, tensor, context, expert tensor, expert, pipeline)
    for (gpus, tp, cp, etp, ep, pp) in [
        (16, 1, 2, 1, 8, 1),
        (16, 1, 2, 1, 4, 1),
        (16, 2, 2, 1, 8, 1),
        (16, 2, 2, 2, 4, 1),
        (32, 2, 4, 1, 8, 1),
        (32, 2, 4, 2, 8, 1),
        (16, 1, 4, 2, 8, 1),
        (32, 1, 2, 1, 8, 2),
        (64, 2, 2, 1, 8, 2),
    ] {
        let sp = if tp > 1 { "sequence_parallel = true\n" } else { "" };
        let s = scenario(
            gpus,
            &format!("tensor = {tp}\n{sp}context = {cp}\nexpert_tensor = {etp}\nexpert = {ep}\npipeline = {pp}\nsharding = \"zero1\""),
        );
        let case = format!("{gpus} GPUs tp {tp} cp {cp} etp {etp} ep {ep} pp {pp}");
        let dp = gpus / (tp * cp * pp);
        let edp = tp * cp * dp / (etp * ep);
        let dag = model::build(&s.model, &s.workload);
        let plan = Plan::new(&dag, s.parallel.clone(), s.training.clone(), gpus, GPUS_PER_NODE);
        assert_eq!(plan.dp, dp * cp, "{case}");
        assert_eq!(plan.edp, edp, "{case}");
        assert_eq!(s.parallel.model_parallel.expert_data_parallel(gpus), edp, "{case}");
        if pp == 1 {
            assert_eq!(plan.expert_params(), LAYERS * (E / ep) * expert / etp, "{case}");
            let opt: u64 = plan
                .units
                .iter()
                .map(|u| (u.params - u.expert_params).div_ceil(dp * cp) + u.expert_params.div_ceil(edp))
                .sum();
            assert_eq!(plan.model_state().optimizer_state, opt * 8, "{case}");
            if tp == 1 && etp == 1 {
                // By hand: per block the attention and router over data x context, the
                // block's E / ep experts over edp; the root (embeddings, norm, head) over
                // data x context.
                let by_hand = LAYERS * ((attn + E * H).div_ceil(dp * cp) + ((E / ep) * expert).div_ceil(edp))
                    + (2 * VOCAB * H + H).div_ceil(dp * cp);
                assert_eq!(opt, by_hand, "{case}");
            }
        }
        // Megatron's groups: dense order tp-cp-dp-pp; expert order tp-ep-dp-pp (cp = 1 in
        // the expert generator, which is built over the same world).
        let dense = [tp, cp, dp, pp];
        let expert_sizes = [etp, ep, edp, pp];
        let cost = Cost::for_plan(&s.cluster, &plan);
        assert_group(&format!("{case} tensor"), &groups(&dense, &[true, false, false, false]), &cost.tp_group);
        assert_group(&format!("{case} context"), &groups(&dense, &[false, true, false, false]), &cost.cp_group);
        assert_group(&format!("{case} data x context"), &groups(&dense, &[false, true, true, false]), &cost.dp_group);
        assert_group(
            &format!("{case} expert tensor"),
            &groups(&expert_sizes, &[true, false, false, false]),
            &cost.etp_group,
        );
        assert_group(&format!("{case} expert"), &groups(&expert_sizes, &[false, true, false, false]), &cost.ep_group);
        assert_group(
            &format!("{case} expert data"),
            &groups(&expert_sizes, &[false, false, true, false]),
            &cost.edp_group,
        );
        // Both generators agree on the pipeline groups (Megatron asserts it).
        assert_eq!(groups(&dense, &[false, false, false, true]), groups(&expert_sizes, &[false, false, false, true]));
        // Each all-to-all moves this GPU's 4096 / cp / tp rows x top-2 copies.
        let a2a = dag.ops.iter().find(|o| o.name == "layers.0.feed_forward.dispatch").unwrap();
        assert_eq!(a2a.comm.unwrap().bytes, SEQ / cp / tp * K * H * 2, "{case}");
    }
}

/// Under uneven routing each expert-parallel rank is a rank class; with a ring of 2 its GPUs
/// are still those Megatron places at that position of their expert-parallel group (the
/// expert generator has no context axis, so the context ranks only add expert-data-parallel
/// runs). 16 GPUs, tensor 2 (sequence parallel), context 2, expert 4, expert tensor 2: class
/// r holds GPUs 2r, 2r + 1, 2r + 8, 2r + 9. Each GPU routes 4096 / 2 / 2 = 1024 rows, so the
/// four ranks receive 4 x 2048 copies between them, the hot expert's rank 3/10 of them.
#[test]
fn uneven_routing_classes_are_megatrons_expert_parallel_ranks() {
    let (gpus, tp, cp, ep, etp) = (16, 2, 2, 4, 2);
    let s = scenario_with(
        gpus,
        &format!("tensor = {tp}\nsequence_parallel = true\ncontext = {cp}\nexpert = {ep}\nsharding = \"zero1\""),
        SEQ,
        "[moe]\nrouting = \"measured\"\ntokens_per_expert = [3, 1, 1, 1, 1, 1, 1, 1]",
    );
    assert_eq!(s.parallel.model_parallel.expert_tensor, etp);
    let copies = SEQ / cp / tp * K;
    assert_eq!(s.routed_copies(), copies);
    let loads = s.expert_loads().unwrap();
    assert_eq!(loads.iter().sum::<u64>(), ep * copies);
    // Expert 0 (3/10 of the copies) and expert 1 (1/10) live on expert-parallel rank 0:
    // 4 x 2048 x 4/10 = 3276.8 copies, rounded.
    assert!(loads[0].abs_diff(ep * copies * 4 / 10) <= 1, "{loads:?}");
    let sim = stepsim::simulate(&s).unwrap();
    assert_eq!(sim.job.classes.len() as u64, ep);
    let edp = gpus / (etp * ep);
    let ep_groups = groups(&[etp, ep, edp, 1], &[false, true, false, false]);
    for (r, class) in sim.job.classes.iter().enumerate() {
        let run = class.run.max(1);
        let mut mine: Vec<u64> =
            (0..class.count).map(|i| class.first_rank + (i / run) * class.stride + i % run).collect();
        mine.sort_unstable();
        let mut megatron: Vec<u64> = ep_groups.iter().map(|g| g[r]).collect();
        megatron.sort_unstable();
        assert_eq!(mine, megatron, "expert-parallel rank {r}");
    }
    assert_eq!(sim.job.classes[1].ranks(), "2-3 every 8, to 11");
    // The hot rank's grouped GEMMs run on what its expert-tensor pair received.
    let mut w = s.workload.clone();
    w.routed = Some(model::RoutedCopies { received: loads[0], busiest: loads[0] });
    let hot = model::build(&s.model, &w);
    let w1 = hot.ops.iter().find(|o| o.name == "layers.0.feed_forward.experts.w1").unwrap();
    assert_eq!(w1.gemm, Some([etp * loads[0] / (E / ep), FE / etp, H]));
}

/// NCCL's communicators for Megatron's groups with the context ranks folded in: 16 GPUs as
/// context 2 x data 8, expert 4: data x context (16: dense gradients), context (2: the ring),
/// expert (4: all-to-all), expert data (16 / 4 = 4: expert gradients).
#[test]
fn nccl_holds_the_context_and_expert_groups() {
    let s = scenario(16, "context = 2\nexpert = 4\nsharding = \"zero1\"");
    let names: Vec<String> = s.nccl_estimate().communicators.iter().map(|(c, _)| c.name.clone()).collect();
    for want in [
        "data parallel (16 ranks)",
        "context parallel (2 ranks)",
        "expert parallel (4 ranks, all-to-all)",
        "expert data parallel (4 ranks)",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
}

/// explain offers a ring for a mixture of experts under Megatron-Core: its ranks come out of
/// data parallelism (grad_accum doubled for the same batch), the experts keep their layout.
#[test]
fn explain_offers_context_parallelism_for_a_mixture_of_experts() {
    use stepsim::explain::counterfactual::variants;
    let s = scenario(16, "expert = 8\nsharding = \"zero1\"");
    let vs = variants(&s, 14).unwrap_or_else(|e| panic!("{e}"));
    let (label, v) = &vs[0];
    assert!(label.starts_with("context parallel 1 -> 2, grad_accum 2 -> 4"), "{label}");
    assert_eq!(v.parallel.model_parallel.context, 2);
    assert_eq!(v.parallel.model_parallel.expert, 8);
    assert_eq!(v.parallel.model_parallel.expert_data_parallel(16), 2);
    let sim = stepsim::simulate(v).unwrap();
    assert_eq!(sim.plan().edp, 2);
    // Under FSDP a mixture of experts is not given a ring.
    let fsdp = Scenario::from_toml(
        Path::new("<moe-fsdp>"),
        &format!(
            "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\n\
             [model.moe]\nnum_experts = {E}\ntop_k = {K}\nexpert_ffn_hidden = {FE}\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n[parallel]\nframework = \"fsdp\"\n\
             [training]\nmicro_batch = 1\nseq_len = {SEQ}\n"
        ),
    )
    .unwrap();
    let why = variants(&fsdp, 14).unwrap_err();
    assert!(why.contains("Megatron-Core"), "{why}");
}

/// Mixtral 8x7B as the shipped Megatron-Core run (32 H100s, PP 4 x EP 8, distributed
/// optimizer) with a ring of 2 taking its ranks from data parallelism (grad_accum 16 -> 32,
/// the same batch): each GPU holds 2048 of the 4096 tokens, so the saved activations halve
/// exactly (every saved tensor is per token, flash attention's included), the model state
/// per GPU stays (the experts fold over the same 8 GPUs of a stage; the distributed
/// optimizer shards over data x context = 8 either way), and the peak falls.
#[test]
fn mixtral_8x7b_with_a_ring_of_two_halves_its_activations() {
    let base = Scenario::load(Path::new("scenarios/mixtral-8x7b-h100-ep8.toml")).unwrap();
    let mut text = std::fs::read_to_string("scenarios/mixtral-8x7b-h100-ep8.toml").unwrap();
    text = text.replace("expert = 8\n", "expert = 8\ncontext = 2\n").replace("grad_accum = 16", "grad_accum = 32");
    let cp = Scenario::from_toml(Path::new("scenarios/mixtral-cp2.toml"), &text).unwrap();
    assert_eq!(cp.parallel.model_parallel.context, 2);
    assert_eq!(cp.tokens_per_step(), base.tokens_per_step());
    let (b, c) = (stepsim::simulate(&base).unwrap(), stepsim::simulate(&cp).unwrap());
    assert_eq!(b.plan().edp, 1);
    assert_eq!(c.plan().edp, 1);
    assert_eq!(c.report.model_state_per_gpu.total.bytes, b.report.model_state_per_gpu.total.bytes);
    let saved = |sim: &stepsim::Simulation| {
        let p = sim.report.peak.as_ref().unwrap();
        p.breakdown.iter().find(|c| c.label == "activations (saved)").map(|c| c.size.bytes).unwrap()
    };
    let (sb, sc) = (saved(&b), saved(&c));
    println!("saved activations at the peak: cp 1 {sb} B, cp 2 {sc} B");
    assert_eq!(2 * sc, sb);
    let (pb, pc) = (b.report.peak.as_ref().unwrap().allocated.bytes, c.report.peak.as_ref().unwrap().allocated.bytes);
    println!("peak allocated: cp 1 {pb} B, cp 2 {pc} B");
    assert!(pc < pb - sb / 3, "{pc} {pb}");
    assert!(matches!(c.report.verdict, stepsim::report::Verdict::Fits { .. }));
}
