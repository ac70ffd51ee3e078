//! Context parallelism, rule by rule, against figures derived by hand: each rank's share of
//! the activations and FLOPs, the keys and values its ring passes, the ring's time, and the
//! groups gradients and optimizer state are spread over. A small llama (hidden 1024, 8
//! heads of which 2 KV heads, ffn 3584, 4 blocks) keeps each case well under a second.

use std::path::Path;

use stepsim::model::{self, OpKind, Region};
use stepsim::plan::Plan;
use stepsim::scenario::Scenario;
use stepsim::schedule::Cost;

const H: u64 = 1024;
const KV: u64 = 256; // 2 KV heads of 128
const F: u64 = 3584;
const LAYERS: u64 = 4;

fn scenario(gpus: u64, parallel: &str, seq: u64) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 2\nffn_hidden = {F}\nvocab = 32000\nmax_seq_len = {seq}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\nframework = \"megatron\"\nsharding = \"zero1\"\n{parallel}\n\
         [training]\nmicro_batch = 1\nseq_len = {seq}\ngrad_accum = 2\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n"
    );
    Scenario::from_toml(Path::new("<cp>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// A rank of a context-parallel ring holds 1/cp of each sequence: its saved activations are
/// those of the sequence's share run alone (flash attention saves q, k, v, the output and
/// the log-sum-exp of its own tokens), its linear FLOPs 1/cp, and its attention FLOPs 1/cp
/// of the whole sequence's (its queries against every key).
#[test]
fn a_rank_holds_its_share_of_the_sequence() {
    let dag = |s: &Scenario| model::build(&s.model, &s.workload);
    let cp2 = dag(&scenario(2, "context = 2", 8192));
    let half = dag(&scenario(1, "", 4096));
    let whole = dag(&scenario(1, "", 8192));
    assert_eq!(cp2.saved_bytes(Region::Block(0), true), half.saved_bytes(Region::Block(0), true));
    assert_eq!(cp2.tokens(), 4096);
    let flops = |d: &model::LayerDag, k: OpKind| d.ops.iter().filter(|o| o.kind == k).map(|o| o.fwd_flops).sum::<f64>();
    assert_eq!(flops(&cp2, OpKind::Linear), flops(&half, OpKind::Linear));
    assert_eq!(flops(&cp2, OpKind::AttentionCore), flops(&whole, OpKind::AttentionCore) / 2.0);
    // 2 b (s/cp) s (q/k width + v width) per layer: 2 x 4096 x 8192 x 2048.
    assert_eq!(flops(&cp2, OpKind::AttentionCore), LAYERS as f64 * 2.0 * 4096.0 * 8192.0 * 2048.0);
}

/// Each ring step passes this rank's keys and values: 4096 tokens x (256 + 256) x 2 B; two
/// receive buffers of that size live while the attention core runs.
#[test]
fn the_ring_passes_this_ranks_keys_and_values() {
    let s = scenario(2, "context = 2", 8192);
    let dag = model::build(&s.model, &s.workload);
    let core = dag.ops.iter().find(|o| o.name == "layers.0.attention.core").unwrap();
    let kv = 4096 * 2 * KV * 2;
    assert_eq!(core.cp_kv_bytes, kv);
    assert_eq!(core.fwd_scratch, 2 * kv);
    let plain = scenario(1, "", 8192);
    let dag = model::build(&plain.model, &plain.workload);
    assert!(dag.ops.iter().all(|o| o.cp_kv_bytes == 0));
}

/// The ring's time: cp steps of t / cp, every step after the first lasting as long as its
/// transfer when that is longer (NVLink at 80% of 450 GB/s inside a node, 5 us latency),
/// twice the bytes in backward. With context 8 x TP 2 the ring leaves the node (NICs).
#[test]
fn attention_waits_for_the_ring_only_when_the_transfer_is_longer() {
    let s = scenario(8, "context = 4", 8192);
    let dag = model::build(&s.model, &s.workload);
    let plan = Plan::new(&dag, s.parallel.clone(), s.training.clone(), 8, 8);
    let cost = Cost::for_plan(&s.cluster, &plan);
    assert_eq!(cost.cp_steps, 4);
    assert_eq!(cost.cp_bytes_per_s, 450e9 * 0.8);
    let mut core = dag.ops.iter().find(|o| o.name == "layers.0.attention.core").unwrap().clone();
    let t = cost.forward_s(&core);
    // Tiny key-value blocks: hidden under the compute.
    core.cp_kv_bytes = 1;
    assert!((cost.forward_s(&core) - t).abs() < 1e-12);
    // Huge ones: three transfers of 3.6 GB at 360 GB/s (+5 us) after the first block.
    core.cp_kv_bytes = 3_600_000_000;
    let comm = 5e-6 + 3.6e9 / 360e9;
    let no_ring = {
        let mut c = core.clone();
        c.cp_kv_bytes = 0;
        cost.forward_s(&c)
    };
    assert!((cost.forward_s(&core) - (no_ring / 4.0 + 3.0 * comm)).abs() < 1e-9);
    let (bwd, _) = cost.backward_split(&core);
    assert!(bwd > 3.0 * (5e-6 + 7.2e9 / 360e9));
    let wide = scenario(16, "context = 8\ntensor = 2\nsequence_parallel = true", 8192);
    let dag = model::build(&wide.model, &wide.workload);
    let plan = Plan::new(&dag, wide.parallel.clone(), wide.training.clone(), 16, 8);
    let cost = Cost::for_plan(&wide.cluster, &plan);
    assert!(cost.cp_bytes_per_s < 100e9, "the ring crosses nodes: {}", cost.cp_bytes_per_s);
}

/// Parameters are replicated over the ring: with 8 GPUs as context 2 x data 4 the
/// distributed optimizer shards the FP32 master and moments over all 8 (12 B/param / 8),
/// while each step consumes data-parallel 4 x micro-batch x sequence x grad_accum tokens.
#[test]
fn gradients_and_optimizer_state_spread_over_data_times_context() {
    let s = scenario(8, "context = 2", 8192);
    assert_eq!(s.dp_degree(), 4);
    assert_eq!(s.tokens_per_step(), 4 * 8192 * 2);
    let r = stepsim::simulate(&s).unwrap().report;
    let p = s.model.param_count();
    let ms = &r.model_state_per_gpu;
    assert_eq!(ms.optimizer_state.bytes, (8 * p).div_ceil(8));
    assert_eq!(ms.master_weights.bytes, (4 * p).div_ceil(8));
    assert!(r.assumptions.iter().any(|a| a.starts_with("context parallel 2 (Megatron-Core")));
    let t = r.throughput.as_ref().unwrap();
    assert_eq!(t.tokens_per_step, 4 * 8192 * 2);
}

/// Under FSDP, torchtitan's context parallelism (PyTorch's context_parallel, rotate method
/// "allgather" by default): the attention core all-gathers every rank's keys and values
/// (a cp x 4096 x 512 x 2 B buffer while it runs) and, in forward, computes its own block
/// while the all-gather's cp - 1 steps run: max(t / cp, 3 (5 us + block / 360 GB/s)) +
/// 3 t / cp. "alltoall" passes blocks around a ring like Transformer Engine's.
#[test]
fn fsdp_context_parallel_all_gathers_the_keys_and_values() {
    let fsdp = |rotate: &str| {
        let toml = format!(
            "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 2\nffn_hidden = {F}\nvocab = 32000\nmax_seq_len = 16384\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
             [parallel]\nframework = \"fsdp\"\nsharding = \"full_shard\"\ncontext = 4\n{rotate}\n\
             [training]\nmicro_batch = 1\nseq_len = 16384\ngrad_accum = 1\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nkernels = \"fused\"\n"
        );
        Scenario::from_toml(Path::new("<cp fsdp>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
    };
    let s = fsdp("");
    assert_eq!(s.parallel.model_parallel.context_comm, model::ContextComm::AllGather);
    let dag = model::build(&s.model, &s.workload);
    let core = dag.ops.iter().find(|o| o.name == "layers.0.attention.core").unwrap().clone();
    let kv = 4096 * 2 * KV * 2;
    assert_eq!((core.cp_kv_bytes, core.fwd_scratch), (kv, 4 * kv));
    let plan = Plan::new(&dag, s.parallel.clone(), s.training.clone(), 8, 8);
    assert_eq!(plan.shard_group, 8);
    let cost = Cost::for_plan(&s.cluster, &plan);
    let mut plain = core.clone();
    plain.cp_kv_bytes = 0;
    let t = cost.forward_s(&plain);
    let gather = 3.0 * (5e-6 + kv as f64 / 360e9);
    assert!((cost.forward_s(&core) - ((t / 4.0).max(gather) + 3.0 * t / 4.0)).abs() < 1e-12);
    let ring = fsdp("context_rotate = \"alltoall\"");
    assert_eq!(ring.parallel.model_parallel.context_comm, model::ContextComm::Ring);
    let dag = model::build(&ring.model, &ring.workload);
    let core = dag.ops.iter().find(|o| o.name == "layers.0.attention.core").unwrap();
    assert_eq!(core.fwd_scratch, 2 * kv);
    let r = stepsim::simulate(&s).unwrap().report;
    assert!(r.assumptions.iter().any(|a| a.starts_with("context parallel 4 (PyTorch's context_parallel")));
}

/// Ulysses (Megatron `--cp-comm-type a2a`; DeepSpeed's sequence parallelism): all-to-alls
/// move q, k and v (4096 tokens x (1024 + 256 + 256) x 2 B) in and the output (x 1024) out,
/// the attention kernel runs whole on its heads, and the all-to-alls add their time; the
/// head-sharded q, k and v exist beside the originals while they move. The heads must
/// divide by the degree: 2 KV heads over 4 ranks do not.
#[test]
fn ulysses_moves_q_k_v_and_the_output_by_all_to_all() {
    let s = scenario(8, "context = 2\ncontext_comm = \"a2a\"", 8192);
    assert_eq!(s.parallel.model_parallel.context_comm, model::ContextComm::AllToAll);
    let dag = model::build(&s.model, &s.workload);
    let core = dag.ops.iter().find(|o| o.name == "layers.0.attention.core").unwrap().clone();
    assert_eq!(core.cp_kv_bytes, 4096 * (H + KV + KV + H) * 2);
    assert_eq!(core.fwd_scratch, 4096 * (H + KV + KV) * 2);
    let plan = Plan::new(&dag, s.parallel.clone(), s.training.clone(), 8, 8);
    let cost = Cost::for_plan(&s.cluster, &plan);
    let mut plain = core.clone();
    plain.cp_kv_bytes = 0;
    let a2a = cost.cp_group.time_s(stepsim::net::Collective::AllToAll, core.cp_kv_bytes);
    assert!(a2a > 0.0);
    assert!((cost.forward_s(&core) - cost.forward_s(&plain) - a2a).abs() < 1e-12);
    let toml = |cp: u64| {
        format!(
            "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 2\nffn_hidden = {F}\nvocab = 32000\nmax_seq_len = 8192\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n[parallel]\nframework = \"deepspeed\"\nsharding = \"zero3\"\ncontext = {cp}\n\
             [training]\nmicro_batch = 1\nseq_len = 8192\ngrad_accum = 1\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n"
        )
    };
    let ds = Scenario::from_toml(Path::new("<ulysses>"), &toml(2)).unwrap();
    assert_eq!(ds.parallel.model_parallel.context_comm, model::ContextComm::AllToAll);
    let err = Scenario::from_toml(Path::new("<ulysses>"), &toml(4)).unwrap_err().to_string();
    assert!(err.contains("parallel.context") && err.contains("not divisible by 4"), "{err}");
}
