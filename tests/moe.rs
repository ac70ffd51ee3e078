//! Mixture-of-experts, rule by rule, against figures derived by hand: expert parameter and
//! optimizer bytes per rank for each layout, all-to-all bytes per MoE block, the routed
//! activations a block saves, the collectives expert parallelism adds, and the report's
//! words. The model is a small Mixtral-shaped llama (hidden 1024, 8 experts of 3584, top-2)
//! so each case runs in well under a second.

use std::path::Path;

use stepsim::model::{self, OpKind, Region, RoutingScale, TensorKind};
use stepsim::scenario::Scenario;
use stepsim::schedule::TaskKind;

const H: u64 = 1024;
const FE: u64 = 3584;
const E: u64 = 8;
const K: u64 = 2;
const SEQ: u64 = 2048;
const LAYERS: u64 = 4;
const VOCAB: u64 = 32000;

/// The model on `gpus` H100s with `parallel` lines, Megatron-LM, micro-batch 1 x 2048.
fn scenario(gpus: u64, parallel: &str, moe_extra: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\nmax_seq_len = {SEQ}\n\
         [model.moe]\nnum_experts = {E}\ntop_k = {K}\nexpert_ffn_hidden = {FE}\n{moe_extra}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\nframework = \"megatron\"\n{parallel}\n\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\ngrad_accum = 2\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n"
    );
    Scenario::from_toml(Path::new("<moe>"), &toml).unwrap_or_else(|e| panic!("{e}"))
}

/// Closed form: attention (q, k, v, o at 1024 x 1024, two RMSNorms) plus router and 8
/// experts of three 1024 x 3584 matrices, per block; embeddings and head untied.
#[test]
fn parameter_counts_match_the_closed_form_and_the_dag() {
    let s = scenario(1, "", "");
    let attn = 4 * H * H + 2 * H;
    let expert = 3 * H * FE;
    let block = attn + E * H + E * expert;
    let total = LAYERS * block + 2 * VOCAB * H + H;
    assert_eq!(s.model.param_count(), total);
    assert_eq!(s.model.active_param_count(), total - LAYERS * (E - K) * expert);
    let dag = model::build(&s.model, &s.workload);
    assert_eq!(dag.param_count(), total);
    // One leading dense block: its MLP is the dense SwiGLU of ffn_hidden.
    let d = scenario(1, "", "first_dense_layers = 1");
    assert_eq!(d.model.param_count(), total - (E * H + E * expert) + 3 * H * FE);
    assert_eq!(model::build(&d.model, &d.workload).param_count(), d.model.param_count());
    // Shared experts with Qwen2-MoE's gate: 3 x h x width + h per MoE block.
    let sh = scenario(1, "", "shared_expert_ffn_hidden = 2048\nshared_expert_gate = true");
    assert_eq!(sh.model.param_count(), total + LAYERS * (3 * H * 2048 + H));
    assert_eq!(model::build(&sh.model, &sh.workload).param_count(), sh.model.param_count());
}

/// Each expert-parallel rank holds E / ep experts, each split expert_tensor ways; ZeRO-1
/// shards the dense state over the data-parallel ranks and the expert state over the
/// expert-data-parallel ones (tensor x data / (expert_tensor x ep), Megatron-Core's
/// `expert_data_parallel_size`). bf16-mixed-adam: 2 B parameters, 2 B gradients, 4 B master,
/// 8 B moments. `expert_tensor` defaults to `tensor`, as Megatron's
/// `--expert-tensor-parallel-size` does.
#[test]
fn expert_state_is_split_by_expert_parallelism_and_sharded_over_its_data_parallel_group() {
    let attn = 4 * H * H + 2 * H;
    let dense = LAYERS * (attn + E * H) + 2 * VOCAB * H + H;
    let expert = 3 * H * FE;
    for (gpus, tp, etp, ep, sharding) in [
        (8, 1, 1, 1, "none"),
        (8, 1, 1, 8, "none"),
        (8, 1, 1, 4, "zero1"),
        (16, 1, 1, 8, "zero1"),
        (16, 2, 1, 8, "zero1"),
        (16, 2, 2, 8, "zero1"),
        (16, 2, 2, 4, "zero1"),
        (16, 2, 1, 4, "zero1"),
        (8, 2, 2, 4, "none"),
        (8, 1, 2, 4, "zero1"),
    ] {
        let sp = if tp > 1 { "sequence_parallel = true\n" } else { "" };
        // The default (no expert_tensor line) where it is Megatron's: expert_tensor = tensor.
        let etp_line = if etp == tp { String::new() } else { format!("expert_tensor = {etp}\n") };
        let s = scenario(gpus, &format!("tensor = {tp}\n{sp}{etp_line}expert = {ep}\nsharding = \"{sharding}\""), "");
        assert_eq!(s.parallel.model_parallel.expert_tensor, etp);
        let sim = stepsim::simulate(&s).unwrap();
        let plan = sim.plan();
        let dp = gpus / tp;
        let edp = tp * dp / (etp * ep);
        let case = format!("{gpus} GPUs tp {tp} etp {etp} ep {ep} {sharding}");
        assert_eq!(plan.edp, edp, "{case}");
        let local_expert = LAYERS * (E / ep) * expert / etp;
        assert_eq!(plan.expert_params(), local_expert, "{case}");
        // Dense parameters are 1/tp per rank except the norms (replicated) and the router.
        let local_dense = plan.total_params() - local_expert;
        if tp == 1 {
            assert_eq!(local_dense, dense);
        }
        let ms = plan.model_state();
        assert_eq!(ms.parameters, (local_dense + local_expert) * 2);
        assert_eq!(ms.gradients, (local_dense + local_expert) * 2);
        let opt = if sharding == "zero1" {
            plan.units.iter().map(|u| (u.params - u.expert_params).div_ceil(dp) + u.expert_params.div_ceil(edp)).sum()
        } else {
            local_dense + local_expert
        };
        assert_eq!(ms.master_weights, opt * 4, "{case}");
        assert_eq!(ms.optimizer_state, opt * 8);
        if (gpus, tp, ep) == (16, 1, 8) {
            // By hand: 16 data-parallel ranks, experts on 2 each (edp 2): per block the dense
            // part over 16 and one expert over 2; the root (embeddings, norm, head) over 16.
            let by_hand =
                LAYERS * ((attn + E * H).div_ceil(16) + expert.div_ceil(2)) + (2 * VOCAB * H + H).div_ceil(16);
            assert_eq!(opt, by_hand);
        }
    }
}

/// By hand, 16 GPUs, tensor 2 (sequence parallel), expert 8, ZeRO-1, with the experts whole
/// (expert_tensor 1) and split (expert_tensor 2, Megatron's default with tensor 2): one
/// expert of 3 x 1024 x 3584 = 11,010,048 weights per MoE block and GPU, or half of it.
/// - expert_tensor 1: each expert on 16 / 8 = 2 GPUs (the tensor-parallel pair holds copies);
///   4 blocks x 11,010,048 = 44,040,192 expert parameters per GPU: 88,080,384 B of BF16
///   weights, as many of gradients; the optimizer's 12 B per element over 2: 264,241,152 B.
/// - expert_tensor 2: each expert's slice on 16 / (2 x 8) = 1 GPU; 4 x 5,505,024 =
///   22,020,096 per GPU: 44,040,192 B of weights, as many of gradients, 264,241,152 B of
///   master weights and moments (the same: a distributed optimizer splits all expert
///   state over the stage's 16 GPUs either way).
#[test]
fn expert_tensor_parallelism_halves_the_expert_weights_by_hand() {
    let model_state = |etp: u64| {
        let s = scenario(
            16,
            &format!("tensor = 2\nsequence_parallel = true\nexpert_tensor = {etp}\nexpert = 8\nsharding = \"zero1\""),
            "",
        );
        let dag = model::build(&s.model, &s.workload);
        let plan = stepsim::plan::Plan::new(&dag, s.parallel.clone(), s.training.clone(), 16, 8);
        let experts = plan.expert_params();
        let opt: u64 = plan.units.iter().map(|u| u.expert_params.div_ceil(plan.edp)).sum();
        (plan.edp, experts, experts * 2, opt * 12)
    };
    assert_eq!(model_state(1), (2, 44_040_192, 88_080_384, 264_241_152));
    assert_eq!(model_state(2), (1, 22_020_096, 44_040_192, 264_241_152));
}

/// Under expert tensor parallelism the token dispatcher all-gathers the copies the all-to-all
/// brought over the expert-tensor-parallel group before the experts and reduce-scatters the
/// experts' output after (`MoEAlltoAllTokenDispatcher.dispatch_postprocess` /
/// `combine_preprocess`): each moves expert_tensor x the rank's copies x hidden x 2 B; per
/// MoE block and micro-batch one all-gather and one reduce-scatter forward, and the reverse
/// backward; the all-to-alls keep their bytes. The expert GEMMs: FC1 (w1, w3) column- and FC2
/// (w2) row-parallel, M = the gathered copies per local expert, the width FE / expert_tensor;
/// a rank's FLOPs unchanged. The gathered copies are what w1 and w3 save: the block saves
/// (expert_tensor - 1) x copies x hidden x 2 B more than with the experts whole.
#[test]
fn expert_tensor_collectives_gemm_shapes_and_saved_copies() {
    for (gpus, tp, etp, ep) in [(8, 2, 2, 4), (8, 1, 2, 4), (8, 2, 1, 4), (16, 2, 2, 8)] {
        let sp = if tp > 1 { "sequence_parallel = true\n" } else { "" };
        let parallel = format!("tensor = {tp}\n{sp}expert_tensor = {etp}\nexpert = {ep}");
        let s = scenario(gpus, &parallel, "");
        let case = format!("{gpus} GPUs tp {tp} etp {etp} ep {ep}");
        let dag = model::build(&s.model, &s.workload);
        let copies = SEQ / tp * K;
        let gathered = etp * copies;
        let local = E / ep;
        let etp_ops: Vec<_> =
            dag.ops.iter().filter(|o| o.comm.is_some_and(|c| c.group == model::CommGroup::ExpertTensor)).collect();
        let a2a: Vec<_> =
            dag.ops.iter().filter(|o| o.comm.is_some_and(|c| c.group == model::CommGroup::Expert)).collect();
        assert_eq!(a2a.len() as u64, 2 * LAYERS, "{case}");
        for o in &a2a {
            assert_eq!(o.comm.unwrap().bytes, copies * H * 2, "{case} {}", o.name);
        }
        if etp == 1 {
            assert!(etp_ops.is_empty(), "{case}");
        } else {
            assert_eq!(etp_ops.len() as u64, 2 * LAYERS, "{case}");
            use stepsim::net::Collective::{AllGather, ReduceScatter};
            let ag = dag.ops.iter().find(|o| o.name == "layers.1.feed_forward.etp_all_gather").unwrap().comm.unwrap();
            assert_eq!((ag.forward, ag.backward, ag.bytes), (Some(AllGather), Some(ReduceScatter), gathered * H * 2));
            let rs =
                dag.ops.iter().find(|o| o.name == "layers.1.feed_forward.etp_reduce_scatter").unwrap().comm.unwrap();
            assert_eq!((rs.forward, rs.backward, rs.bytes), (Some(ReduceScatter), Some(AllGather), gathered * H * 2));
        }
        let op = |n: &str| dag.ops.iter().find(|o| o.name == format!("layers.1.feed_forward.experts.{n}")).unwrap();
        let (w1, w2) = (op("w1"), op("w2"));
        assert_eq!(w1.gemm, Some([gathered / local, FE / etp, H]), "{case}");
        assert_eq!(w2.gemm, Some([gathered / local, H, FE / etp]), "{case}");
        assert_eq!((w1.params, w2.params), (local * H * FE / etp, local * FE * H / etp));
        // A rank's expert FLOPs are those of its copies at the whole width.
        assert_eq!(w1.fwd_flops, 2.0 * (copies * H * FE) as f64, "{case}");
        // Saved: the gathered copies in place of the received ones.
        let mut whole = s.workload.clone();
        whole.split.expert_tensor = 1;
        let whole = model::build(&s.model, &whole);
        assert_eq!(
            dag.saved_bytes(Region::Block(1), true),
            whole.saved_bytes(Region::Block(1), true) + (etp - 1) * copies * H * 2,
            "{case}"
        );
        // The schedule: two micro-batches x layers x (2 forward + 2 backward) collectives of
        // the group, on the tensor-parallel stream.
        let sim = stepsim::simulate(&s).unwrap();
        let sched = sim.schedule();
        let tasks: Vec<_> = sched
            .program
            .tasks
            .iter()
            .filter(|t| {
                let l = &sched.labels[t.label as usize];
                l.step == 1 && l.what.contains(".etp_")
            })
            .collect();
        assert_eq!(tasks.len() as u64, if etp > 1 { 2 * LAYERS * 4 } else { 0 }, "{case}");
        assert!(tasks.iter().all(|t| sched.program.streams[t.stream as usize] == "tp"), "{case}");
    }
}

/// Megatron's default and rules: expert_tensor follows tensor unless given; a dense model
/// has none; experts with biases (gpt-oss) only with expert_tensor 1 (`transformer_config.py`:
/// "Bias in Moe is only supported when ETP==1").
#[test]
fn expert_tensor_defaults_to_tensor_and_refuses_biased_experts() {
    let tp2 = "tensor = 2\nsequence_parallel = true\nexpert = 4";
    assert_eq!(scenario(8, tp2, "").parallel.model_parallel.expert_tensor, 2);
    assert_eq!(scenario(8, tp2, "").workload.split.expert_tensor, 2);
    assert_eq!(scenario(8, &format!("{tp2}\nexpert_tensor = 1"), "").parallel.model_parallel.expert_tensor, 1);
    let dense = Scenario::load(Path::new("scenarios/gpt-1.3b-1gpu.toml")).unwrap();
    assert_eq!(dense.parallel.model_parallel.expert_tensor, 1);
    let oss = |etp: u64| {
        Scenario::from_toml(
            Path::new("<oss>"),
            &format!(
                "[model]\nname = \"gpt-oss-20b\"\n[hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
                 [parallel]\nframework = \"megatron\"\nexpert = 4\nexpert_tensor = {etp}\n\
                 [training]\nmicro_batch = 1\nseq_len = 4096\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n"
            ),
        )
    };
    assert!(oss(1).is_ok());
    let e = oss(2).unwrap_err();
    assert_eq!(e.field, "parallel.expert_tensor", "{e}");
    assert!(e.message.contains("Bias in Moe is only supported when ETP==1"), "{e}");
}

/// Under uneven routing each expert-parallel rank is a class of the expert-tensor-parallel
/// groups that hold its experts: with expert_tensor 2 and expert 4 on 16 GPUs, rank 1 is
/// GPUs 2-3, 10-11 ("2-3 every 8, to 11"); its DAG all-gathers twice its received copies.
#[test]
fn uneven_routing_with_expert_tensor_parallelism() {
    let s = routed(
        16,
        "tensor = 2\nsequence_parallel = true\nexpert = 4\nsharding = \"zero1\"",
        "routing = \"measured\"\ntokens_per_expert = [3, 1, 1, 1, 1, 1, 1, 1]",
    );
    assert_eq!(s.parallel.model_parallel.expert_tensor, 2);
    let loads = s.expert_loads().unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    assert_eq!(sim.job.classes.len(), 4);
    assert_eq!(sim.job.classes[1].ranks(), "2-3 every 8, to 11");
    assert_eq!(sim.job.classes[1].count, 4);
    let mut w = s.workload.clone();
    w.routed = Some(model::RoutedCopies { received: loads[0], busiest: loads[0] });
    let hot = model::build(&s.model, &w);
    let ag = hot.ops.iter().find(|o| o.name == "layers.0.feed_forward.etp_all_gather").unwrap();
    assert_eq!(ag.comm.unwrap().bytes, 2 * loads[0] * H * 2);
}

/// Dispatch and combine move every token copy: tokens x top_k x hidden x 2 B per all-to-all,
/// of this rank's rows (1/tp of the sequence under sequence parallelism); forward two per
/// block, backward two more; none without expert parallelism.
#[test]
fn all_to_all_bytes_and_count_per_moe_block() {
    for (gpus, tp, ep) in [(8, 1, 8), (8, 2, 4), (8, 1, 1)] {
        let sp = if tp > 1 { "sequence_parallel = true\n" } else { "" };
        let s = scenario(gpus, &format!("tensor = {tp}\n{sp}expert = {ep}"), "");
        let dag = model::build(&s.model, &s.workload);
        let rows = SEQ / tp;
        let a2a: Vec<_> =
            dag.ops.iter().filter(|o| o.comm.is_some_and(|c| c.group == model::CommGroup::Expert)).collect();
        if ep == 1 {
            assert!(a2a.is_empty());
        } else {
            assert_eq!(a2a.len() as u64, 2 * LAYERS);
            for o in &a2a {
                assert_eq!(o.comm.unwrap().bytes, rows * K * H * 2, "{}", o.name);
            }
        }
        let sim = stepsim::simulate(&s).unwrap();
        let sched = sim.schedule();
        let n = sched.labels.iter().filter(|l| l.kind == TaskKind::AllToAll && l.step == 1).count() as u64;
        // 2 micro-batches x layers x (2 forward + 2 backward).
        assert_eq!(n, if ep > 1 { 2 * LAYERS * 4 } else { 0 }, "tp {tp} ep {ep}");
    }
}

/// What a MoE block saves per micro-batch, by hand: the attention half as a dense block
/// saves it, then the MLP's input (the router's), the router's FP32 scores (rows x E x 4),
/// the chosen experts' int64 indices and FP32 probabilities (rows x k each), the dispatched
/// copies (read by w1 and w3) and the experts' SwiGLU tensors. Megatron-Core fuses SwiGLU
/// (`SwiGLUFunction` saves the gate and up outputs; the down projection saves the product):
/// 3 x copies x width; eager PyTorch also keeps the SiLU output: 4 x copies x width.
///
/// Where the probabilities scale the copies decides whether the copies are saved twice:
/// Megatron-Core 0.13 on scales them inside the fused SwiGLU (`weighted_bias_swiglu_impl`,
/// which saves the probabilities beside its input) and the unpermute only sums; before it,
/// and in Hugging Face's eager code, the product after the combine saves the combined copies
/// (copies x hidden more), and torchtitan's combine saves them upcast to FP32 (4 B each).
/// With `--activation-func-fp8-input-store` the fused SwiGLU keeps its gate and up outputs
/// as 1-byte E4M3 casts, in the dense MLP as in the experts.
#[test]
fn a_moe_block_saves_the_routed_copies() {
    let s = scenario(8, "expert = 8", "");
    assert!(s.workload.fused_swiglu, "Megatron fuses SwiGLU");
    assert_eq!(s.workload.routing_scale, RoutingScale::InActivation, "Megatron-Core scales in the experts");
    assert!(!s.workload.swiglu_fp8_input_store);
    let t = SEQ;
    let c = 2;
    let copies = t * K;
    use RoutingScale::*;
    for (fused, scale, fp8) in [
        (true, InActivation, false),
        (true, AfterCombine, false),
        (false, AfterCombine, false),
        (false, AfterCombineFp32, false),
        (true, AfterCombineFp32, false),
        (false, InActivation, false),
        (true, InActivation, true),
        (true, AfterCombine, true),
    ] {
        let mut w = s.workload.clone();
        w.fused_swiglu = fused;
        w.routing_scale = scale;
        w.swiglu_fp8_input_store = fp8;
        let dag = model::build(&s.model, &w);
        // The dense twin: same attention, dense SwiGLU of the same width.
        let mut dense_cfg = s.model.clone();
        dense_cfg.moe = None;
        let dense = model::build(&dense_cfg, &w);
        // Gate and up outputs' bytes per element as saved (an FP8 cast only where fused), and
        // what else eager SwiGLU keeps (the SiLU output): the product is the down projection's.
        let gate_up = if fused && fp8 { 2 } else { 2 * c };
        let swiglu = |n: u64| gate_up * n + if fused { c * n } else { 2 * c * n };
        let dense_mlp = t * H * c + swiglu(t * FE);
        let attention = dense.saved_bytes(Region::Block(1), true) - dense_mlp;
        // Scaling in the activation needs the fused kernel; without it the DAG scales after
        // the combine.
        let combined = match scale {
            InActivation if fused => 0,
            AfterCombineFp32 => copies * H * 4,
            _ => copies * H * c,
        };
        let moe = t * H * c + t * E * 4 + copies * 8 + copies * 4 + copies * H * c + combined + swiglu(copies * FE);
        assert_eq!(
            dag.saved_bytes(Region::Block(1), true),
            attention + moe,
            "fused {fused} {scale:?} fp8 input store {fp8}"
        );
    }
    let dag = model::build(&s.model, &s.workload);
    let copies = SEQ * K;
    // The indices are integer (no gradient); the copies are activations.
    let idx = dag.tensors.iter().find(|x| x.name == "layers.1.feed_forward.router.indices").unwrap();
    assert_eq!(idx.kind, TensorKind::Index);
    // Each expert GEMM's rows are the copies per local expert (8 experts over 8 ranks: one).
    let w1 = dag.ops.iter().find(|o| o.name == "layers.1.feed_forward.experts.w1").unwrap();
    assert_eq!(w1.kind, OpKind::Linear);
    assert!(w1.expert);
    assert_eq!(w1.gemm, Some([copies, FE, H]));
    assert_eq!(w1.params, H * FE);
    assert_eq!(w1.fwd_flops, 2.0 * (copies * H * FE) as f64);
}

/// Expert gradients are reduced over the expert-data-parallel group: with 8 experts on 8
/// ranks (edp 1) only the dense gradients cross the data-parallel group, so the reduction is
/// shorter than with every expert on every rank, where each rank's 8 experts' gradients are
/// all-reduced over all 8.
#[test]
fn expert_gradients_are_reduced_over_their_own_group() {
    let step = |ep: u64| {
        let sim = stepsim::simulate(&scenario(8, &format!("expert = {ep}"), "")).unwrap();
        let sched = sim.schedule();
        let tr = sim.trace();
        sched
            .program
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                let l = &sched.labels[t.label as usize];
                l.step == 1 && l.kind == TaskKind::AllReduce
            })
            .map(|(i, _)| (tr.end_ns[i] - tr.start_ns[i]) as f64)
            .sum::<f64>()
    };
    let (ep1, ep8) = (step(1), step(8));
    println!("gradient all-reduce busy: ep 1 {:.3} ms, ep 8 {:.3} ms", ep1 / 1e6, ep8 / 1e6);
    assert!(ep8 < 0.25 * ep1, "{ep1} {ep8}");
    assert!(ep8 > 0.0);
}

/// The report names the experts, the active parameters and the expert layout.
#[test]
fn the_report_says_what_runs_where() {
    let s = scenario(16, "expert = 8\nsharding = \"zero1\"", "");
    let sim = stepsim::simulate(&s).unwrap();
    let text = stepsim::report::text::render(&sim.report, &s);
    println!("{text}");
    for want in [
        "mixture of experts in every block: 8 experts of ffn 3584, top-2 routing",
        "active per token",
        "Experts    expert parallel 8: 1 of 8 experts of each MoE block on every GPU; each expert on 2 GPUs",
        "routing is uniform",
        "4096 token copies per micro-batch",
    ] {
        assert!(text.contains(want), "missing {want:?}");
    }
    // With expert tensor parallelism (Megatron's default under tensor 2) the layout says so.
    let s2 = scenario(16, "tensor = 2\nsequence_parallel = true\nexpert = 4\nsharding = \"zero1\"", "");
    let text2 = stepsim::report::text::render(&stepsim::simulate(&s2).unwrap().report, &s2);
    for want in [
        "Experts    expert tensor parallel 2: each expert's width split over 2 consecutive GPUs (1792 of 3584 per GPU",
        "expert parallel 4: 2 of 8 experts of each MoE block on every GPU; each expert slice on 2 GPUs",
        "expert tensor parallel 2 (Megatron-Core --expert-tensor-parallel-size)",
    ] {
        assert!(text2.contains(want), "missing {want:?} in\n{text2}");
    }
    assert_eq!(sim.report.active_param_count, Some(s.model.active_param_count()));
    assert_eq!(sim.report.param_count, s.model.param_count());
}

/// `explain` derives each model-state line from this rank's parameters: the dense ones
/// sharded over the data-parallel ranks, the experts over their expert-data-parallel group.
#[test]
fn explain_splits_the_optimizer_state_into_dense_and_expert_shards() {
    use stepsim::explain;
    let s = scenario(16, "expert = 8\nsharding = \"zero1\"", "");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let text = explain::render(&e, &s);
    println!("{text}");
    let plan = sim.plan();
    let dense = plan.total_params() - plan.expert_params();
    let want = format!(
        "8 B/param x ({} / 16 GPUs + {} expert params / 2 GPUs)",
        stepsim::report::human_count_with(dense, 1),
        stepsim::report::human_count_with(plan.expert_params(), 1)
    );
    assert!(text.contains(&want), "missing {want:?}");
}

/// The small model under uneven routing: `routing` is the `[moe]` section's body.
fn routed(gpus: u64, parallel: &str, routing: &str) -> Scenario {
    let toml = format!("[moe]\n{routing}\n");
    let text = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\nmax_seq_len = {SEQ}\n\
         [model.moe]\nnum_experts = {E}\ntop_k = {K}\nexpert_ffn_hidden = {FE}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\nframework = \"megatron\"\n{parallel}\n\
         {toml}\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\ngrad_accum = 2\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n"
    );
    Scenario::from_toml(Path::new("<moe>"), &text).unwrap_or_else(|e| panic!("{e}"))
}

/// Measured loads that are all equal are uniform routing: one class, the same peak and step
/// time as the uniform job.
#[test]
fn equal_measured_loads_reproduce_uniform_routing() {
    let uniform = stepsim::simulate(&scenario(16, "expert = 8\nsharding = \"zero1\"", "")).unwrap();
    let s = routed(
        16,
        "expert = 8\nsharding = \"zero1\"",
        "routing = \"measured\"\ntokens_per_expert = [5, 5, 5, 5, 5, 5, 5, 5]",
    );
    assert_eq!(s.expert_loads(), None);
    let sim = stepsim::simulate(&s).unwrap();
    assert_eq!(sim.job.classes.len(), 1);
    let step = |x: &stepsim::Simulation| x.report.throughput.as_ref().unwrap().step_time_s;
    assert_eq!(step(&sim), step(&uniform));
    assert_eq!(
        sim.report.peak.as_ref().unwrap().allocated.bytes,
        uniform.report.peak.as_ref().unwrap().allocated.bytes
    );
}

/// A capacity factor of 1 caps the hot expert at its even share: 3:1:...:1 over 8 experts of
/// 4096 copies gives the hot expert 1229 and each other about 410; capacity 512 keeps them
/// all, so nothing is dropped; at 0.75 (384) the hot expert drops 845 and the others 26 each
/// (410 - 384, or 25 for the 409s). Every expert-parallel rank of 16 GPUs in groups of 8 is
/// a class "r-(r + 8) every 8".
#[test]
fn a_capacity_factor_drops_what_exceeds_each_expert() {
    let hot = "routing = \"measured\"\ntokens_per_expert = [3, 1, 1, 1, 1, 1, 1, 1]";
    let s = routed(16, "expert = 8\nsharding = \"zero1\"", &format!("{hot}\ncapacity_factor = 0.75"));
    let copies = K * SEQ;
    let cap = s.capacity.unwrap();
    assert_eq!(cap.per_expert(copies, E), 384);
    let split = s.routing.expert_copies(E, copies);
    assert_eq!(split, vec![1229, 410, 410, 410, 410, 409, 409, 409]);
    assert_eq!(s.dropped_copies(), (1229 - 384) + 4 * 26 + 3 * 25);
    // One expert per rank: each receives 8 x 384 copies.
    assert_eq!(s.expert_loads(), Some(vec![8 * 384; 8]));
    let sim = stepsim::simulate(&s).unwrap();
    assert_eq!(sim.job.classes.len(), 8);
    assert_eq!(sim.job.classes[3].ranks(), "3-11 every 8");
    let rt = sim.report.routing.as_ref().unwrap();
    assert_eq!(rt.capacity_factor, Some(0.75));
    assert!((rt.dropped_fraction - s.dropped_copies() as f64 / copies as f64).abs() < 1e-12);
    let text = stepsim::report::text::render(&sim.report, &s);
    assert!(text.contains("capacity factor 0.75: 25.0% of each rank's token copies dropped"), "{text}");
    // Dropless, the hot expert's rank receives 0.3 of the group's 8 x 4096 copies (9830.4, rounded down).
    let dropless = routed(16, "expert = 8\nsharding = \"zero1\"", hot);
    assert_eq!(dropless.expert_loads().unwrap()[0], 8 * 4096 * 3 / 10);
}

/// One expert with three times its share: its rank receives (3 + 1) / (3 + 7) of 8 x 4096
/// copies (two experts per rank), saves and computes that many, and every rank's all-to-alls
/// last as long as its; the report names it beside the uniform job.
#[test]
fn a_hot_expert_makes_its_rank_the_headline_and_slows_every_rank() {
    let s = routed(8, "expert = 4", "routing = \"measured\"\ntokens_per_expert = [3, 1, 1, 1, 1, 1, 1, 1]");
    let copies = K * SEQ;
    let loads = s.expert_loads().unwrap();
    // 16384 x 0.4 = 6553.6 and 3 x 3276.8: rounded down, the 3 copies left go to the largest
    // remainders (0.8 each).
    assert_eq!(4 * copies, 16384);
    assert_eq!(loads, vec![6553, 3277, 3277, 3277]);
    let sim = stepsim::simulate(&s).unwrap();
    assert_eq!(sim.job.classes.len(), 4);
    // The hot rank's DAG: what it receives, and the busiest all-to-all everywhere.
    let cold = &sim.job.classes[1];
    assert!(matches!(cold.role, stepsim::job::Role::Expert { ep_rank: 1, .. }));
    let rt = sim.report.routing.as_ref().unwrap();
    println!("{}", stepsim::report::text::render(&sim.report, &s));
    assert_eq!(
        (rt.hottest_rank, rt.hottest_copies, rt.coolest_copies, rt.uniform_copies),
        (0, loads[0], loads[1], copies)
    );
    assert_eq!(sim.headline, 0, "the hot rank has the highest peak");
    assert!(rt.peak_needed.bytes > rt.uniform_peak.bytes);
    let (t, tu) = (rt.step_time_s.unwrap(), rt.uniform_step_time_s.unwrap());
    assert!(t > 1.1 * tu, "{t} vs uniform {tu}");
    // Every class's step ends together: the cold ranks wait for the hot one.
    let peaks: Vec<u64> = sim.class_reports.iter().map(|r| r.peak.as_ref().unwrap().allocated.bytes).collect();
    assert!(peaks[0] > peaks[1] && peaks[1] == peaks[2] && peaks[2] == peaks[3], "{peaks:?}");
    // The hot rank's routed activations: 1.6x the uniform copies' bytes in each block.
    let mut w = s.workload.clone();
    w.routed = Some(model::RoutedCopies { received: loads[0], busiest: loads[0] });
    let hot = model::build(&s.model, &w);
    let recv = hot.tensors.iter().find(|x| x.name == "layers.0.feed_forward.dispatch.out").unwrap();
    assert_eq!(recv.bytes, loads[0] * H * 2);
    let a2a = hot.ops.iter().find(|o| o.name == "layers.0.feed_forward.combine").unwrap();
    assert_eq!(a2a.comm.unwrap().bytes, loads[0] * H * 2);
    let text = stepsim::report::text::render(&sim.report, &s);
    assert!(
        text.contains("Routing    measured tokens per expert: expert-parallel rank 0 receives 6,553 token copies"),
        "{text}"
    );
    assert!(text.contains("Expert-parallel ranks under uneven routing"));
}

/// `explain` offers twice the expert parallelism for a mixture of experts (each GPU holds
/// half the experts), and no such row for a dense model.
#[test]
fn explain_offers_more_expert_parallelism() {
    use stepsim::explain;
    let mut s = scenario(8, "expert = 4\nsharding = \"zero1\"", "");
    // A device just too small for four experts per block on each GPU, so that explain
    // looks for changes: the peak with expert parallelism 8, plus the CUDA context.
    let mut ep8 = scenario(8, "expert = 8\nsharding = \"zero1\"", "");
    // NCCL's buffers grow with the all-to-all's peers; hold them at 0 to compare the
    // allocators alone.
    s.allocator.nccl_buffers = Some(0);
    ep8.allocator.nccl_buffers = Some(0);
    let need = stepsim::simulate(&ep8).unwrap().report.peak.unwrap().reserved.bytes;
    ep8.cluster.memory_bytes = need + s.cluster.cuda_context_bytes + (64 << 20);
    s.cluster = ep8.cluster.clone();
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, stepsim::report::Verdict::Oom(_)));
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = e.counterfactuals.iter().find(|c| c.change.starts_with("expert parallel 4 -> 8")).expect("an EP row");
    assert_eq!(row.fits, Some(true));
    let (_, v) = explain::counterfactual::variants(&s, 12).unwrap().remove(0);
    let direct = stepsim::simulate(&v).unwrap();
    assert_eq!(direct.plan().expert_params(), LAYERS * 3 * H * FE);
    assert_eq!(row.peak.unwrap().bytes, direct.report.peak.as_ref().unwrap().allocated.bytes);
    let dense = Scenario::load(Path::new("scenarios/gpt-1.3b-1gpu.toml")).unwrap();
    let dsim = stepsim::simulate(&dense).unwrap();
    let de = explain::explain(&dense, &dsim, explain::DEFAULT_MARGIN);
    assert!(!de.counterfactuals.iter().any(|c| c.change.contains("expert")));
}

/// DeepSeek-style: multi-head latent attention, one leading dense block, one shared expert.
/// Closed form by hand: the query's down (h x 256), its norm (256) and up (256 x 8 x 96); the
/// shared key-value down (h x (128 + 32)), the latent's norm (128) and up (128 x 8 x 128); the
/// output (8 x 64 x h); two block norms.
#[test]
fn multi_head_latent_attention_counts_and_saves_as_derived() {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\nmax_seq_len = {SEQ}\n\
         [model.mla]\nq_lora_rank = 256\nkv_lora_rank = 128\nqk_nope_head_dim = 64\nqk_rope_head_dim = 32\nv_head_dim = 64\n\
         [model.moe]\nnum_experts = {E}\ntop_k = {K}\nexpert_ffn_hidden = 512\nshared_expert_ffn_hidden = 512\nfirst_dense_layers = 1\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
         [parallel]\nframework = \"megatron\"\nexpert = 8\n\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n"
    );
    let s = Scenario::from_toml(Path::new("<mla>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    let attn = H * 256 + 256 + 256 * 8 * 96 + H * (128 + 32) + 128 + 128 * 8 * (64 + 64) + 8 * 64 * H + 2 * H;
    let moe = E * H + E * 3 * H * 512 + 3 * H * 512;
    let total = LAYERS * attn + 3 * H * FE + (LAYERS - 1) * moe + 2 * VOCAB * H + H;
    assert_eq!(s.model.param_count(), total);
    let mut whole = s.workload.clone();
    whole.split.expert = 1;
    let dag = model::build(&s.model, &whole);
    assert_eq!(dag.param_count(), total);
    // The attention core: Q K^T over 8 x 96, P V over 8 x 64; saves q, k (96 wide per head),
    // v and its output (64 wide) and the FP32 log-sum-exp.
    let core = dag.ops.iter().find(|o| o.name == "layers.1.attention.core").unwrap();
    let bss = (SEQ * SEQ) as f64;
    assert_eq!(core.fwd_flops, 2.0 * bss * (8 * 96 + 8 * 64) as f64);
    let saved: u64 = core.saves.iter().map(|&t| dag.tensors[t].bytes).sum();
    assert_eq!(saved, SEQ * 8 * 96 * 2 * 2 + SEQ * 8 * 64 * 2 * 2 + 8 * SEQ * 4);
    let sim = stepsim::simulate(&s).unwrap();
    let text = stepsim::report::text::render(&sim.report, &s);
    assert!(text.contains(
        "multi-head latent attention: query rank 256, key-value latent 128, per head q/k 64 + 32 rope, v 64"
    ));
}

/// Multi-head latent attention with tensor parallelism, as Megatron-Core's MLASelfAttention
/// splits it: the down projections (h x 256 and h x (128 + 32)) whole on every rank, run on
/// its rows (the sequence shard with sequence parallelism), the up projections and the output
/// split over the heads; before the up projections the latents (256 and 128 wide) and the
/// rope key (32) are all-gathered from the shards instead of the hidden state (1024 wide);
/// the model's FLOPs are unchanged; the duplicated projections' gradients are all-reduced
/// over the group once per step.
#[test]
fn latent_attention_splits_its_up_projections_and_gathers_latents() {
    let toml = |tensor: u64, sp: bool| {
        // Megatron requires sequence parallelism for experts under tensor parallelism: the
        // case without it is dense.
        let moe = if sp || tensor == 1 {
            format!("[model.moe]\nnum_experts = {E}\ntop_k = {K}\nexpert_ffn_hidden = 512\n")
        } else {
            String::new()
        };
        let ep = if moe.is_empty() { "" } else { "expert = 4\nexpert_tensor = 1\n" };
        format!(
            "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\nmax_seq_len = {SEQ}\n\
             [model.mla]\nq_lora_rank = 256\nkv_lora_rank = 128\nqk_nope_head_dim = 64\nqk_rope_head_dim = 32\nv_head_dim = 64\n\
             {moe}\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
             [parallel]\nframework = \"megatron\"\ntensor = {tensor}\nsequence_parallel = {sp}\n{ep}\
             [training]\nmicro_batch = 1\nseq_len = {SEQ}\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n"
        )
    };
    let load = |tensor: u64, sp: bool| Scenario::from_toml(Path::new("<mla-tp>"), &toml(tensor, sp)).unwrap();
    let dag = |s: &Scenario| model::build(&s.model, &s.workload);
    let one = dag(&load(1, false));
    let sp = dag(&load(2, true));
    let params = |d: &model::LayerDag, n: &str| {
        d.ops.iter().find(|o| o.name == format!("layers.0.attention.{n}")).unwrap().params
    };
    for (n, split) in [("wq_a", false), ("wkv_a", false), ("wq_b", true), ("wkv_b", true), ("wo", true)] {
        assert_eq!(params(&sp, n) * if split { 2 } else { 1 }, params(&one, n), "{n}");
    }
    // Forward collectives of the attention half: three latent all-gathers, no hidden one.
    let gathers: Vec<(String, u64)> = sp
        .ops
        .iter()
        .filter(|o| {
            o.name.starts_with("layers.0.attention.")
                && o.comm.is_some_and(|c| c.forward == Some(stepsim::net::Collective::AllGather))
        })
        .map(|o| (o.name.clone(), o.comm.unwrap().bytes))
        .collect();
    assert_eq!(
        gathers,
        [
            ("layers.0.attention.wq_b.sp_all_gather".to_string(), SEQ * 256 * 2),
            ("layers.0.attention.wkv_b.sp_all_gather".to_string(), SEQ * 128 * 2),
            ("layers.0.attention.k_pos_emb.sp_all_gather".to_string(), SEQ * 32 * 2),
        ]
    );
    // The down projections run on this rank's half of the tokens and save that half.
    let wq_a = sp.ops.iter().find(|o| o.name == "layers.0.attention.wq_a").unwrap();
    assert_eq!(sp.tensors[wq_a.saves[0]].bytes, SEQ / 2 * H * 2);
    assert!((sp.model_forward_flops() / one.model_forward_flops() - 1.0).abs() < 1e-3);
    // Their gradients, partial over the sequence shards, are all-reduced over the
    // tensor-parallel group once per step (finalize_model_grads): h x (256 + 128 + 32)
    // elements a block, in the gradients' dtype (bf16 here).
    let sim = stepsim::simulate(&load(2, true)).unwrap();
    let sched = sim.schedule();
    let ar: Vec<u64> = sched
        .labels
        .iter()
        .filter(|l| l.step == 1 && l.what.starts_with("all-reduce duplicated weights' gradients"))
        .map(|l| l.bytes)
        .collect();
    assert_eq!(ar, [LAYERS * H * (256 + 128 + 32) * 2]);
    // Without sequence parallelism the latents are read whole and the job runs either way.
    let plain = load(2, false);
    assert!(!stepsim::simulate(&plain)
        .unwrap()
        .schedule()
        .labels
        .iter()
        .any(|l| l.what.starts_with("all-reduce duplicated weights' gradients")));
    assert!(dag(&plain).ops.iter().any(|o| o.name == "layers.0.attention.wkv_b.tp_copy"));
    for s in [plain, load(2, true)] {
        let r = stepsim::simulate(&s).unwrap().report;
        assert!(r
            .assumptions
            .iter()
            .any(|a| a.contains("multi-head latent attention (Megatron-Core MLASelfAttention")));
    }
}

/// Latent attention with context parallelism under Megatron: Transformer Engine's ring sends
/// each step's keys and values flattened side by side, so MLA's 96-wide keys and 64-wide
/// values (per head, 8 heads) ride as they are: per ring step this rank's 1024 tokens x 8 x
/// (96 + 64) x 2 B, with two such receive buffers; every other op runs on half the tokens.
#[test]
fn latent_attention_runs_around_the_context_parallel_ring() {
    let toml = |cp: u64| {
        format!(
            "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {FE}\nvocab = {VOCAB}\nmax_seq_len = {SEQ}\n\
             [model.mla]\nq_lora_rank = 256\nkv_lora_rank = 128\nqk_nope_head_dim = 64\nqk_rope_head_dim = 32\nv_head_dim = 64\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 2\n\
             [parallel]\nframework = \"megatron\"\ncontext = {cp}\n\
             [training]\nmicro_batch = 1\nseq_len = {SEQ}\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n"
        )
    };
    let s = Scenario::from_toml(Path::new("<mla-cp>"), &toml(2)).unwrap();
    let dag = model::build(&s.model, &s.workload);
    let core = dag.ops.iter().find(|o| o.name == "layers.0.attention.core").unwrap();
    let kv = SEQ / 2 * 8 * (96 + 64) * 2;
    assert_eq!(core.cp_kv_bytes, kv);
    let whole = Scenario::from_toml(Path::new("<mla-cp>"), &toml(1)).unwrap();
    let whole_dag = model::build(&whole.model, &whole.workload);
    let wq_a = |d: &model::LayerDag| d.ops.iter().find(|o| o.name == "layers.0.attention.wq_a").unwrap().fwd_flops;
    assert_eq!(wq_a(&whole_dag), 2.0 * wq_a(&dag));
    let r = stepsim::simulate(&s).unwrap().report;
    assert!(r.throughput.is_some());
}

/// `explain` offers token dropping for a mixture of experts with expert parallelism, ranked
/// apart from the changes that keep the training problem.
#[test]
fn explain_offers_token_dropping_as_a_change_of_problem() {
    use stepsim::explain;
    let s = Scenario::load(Path::new("scenarios/mixtral-8x7b-h100-ep8-hot-expert.toml")).unwrap();
    let (_, v) = explain::counterfactual::variants(&s, 13).unwrap().remove(0);
    assert_eq!(v.capacity.map(|c| c.factor), Some(1.0));
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = e.counterfactuals.iter().find(|c| c.change.starts_with("capacity factor 1.0")).expect("a row");
    assert!(row.changes_problem);
    assert_eq!(row.fits, Some(true));
    assert!(!e.answer.starts_with("the cheapest change that fits on the same GPUs is \"capacity"), "{}", e.answer);
}
