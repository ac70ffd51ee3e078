//! Activation checkpointing as the frameworks offer it, against figures derived by hand:
//! torchtitan's per-op policy (what it saves of a Llama block, what backward reruns),
//! torchtitan's every-n-th block, Megatron's `--recompute-method block`, and the order of
//! peaks and step times the policies give.
//!
//! The model: a Llama of hidden 1024 (8 heads, 2 KV heads), SwiGLU of 3584, at 4,096 tokens,
//! BF16. One block's tensors: x, q, o = T H 2 = 8,388,608 B; k, v = T 256 2 = 2,097,152 B;
//! the FFN's = T 3584 2 = 29,360,128 B; the attention's log-sum-exp T heads 4 = 131,072 B.

use std::path::Path;

use stepsim::plan::Plan;
use stepsim::scenario::Scenario;
use stepsim::schedule::checkpoint;

const T: u64 = 4096;
const X: u64 = T * 1024 * 2;
const KV: u64 = T * 256 * 2;
const F: u64 = T * 3584 * 2;
const LSE: u64 = T * 8 * 4;
const STATS: u64 = T * 4;

fn scenario(framework: &str, layers: u64, training: &str, parallel: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {layers}\nhidden = 1024\nn_heads = 8\nn_kv_heads = 2\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = {T}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
         [parallel]\nframework = \"{framework}\"\n{parallel}\n\
         [training]\nmicro_batch = 1\nseq_len = {T}\ngrad_accum = 8\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nkernels = \"fused\"\n{training}"
    );
    Scenario::from_toml(Path::new("<checkpointing>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// The checkpointing decisions for the whole model (stage 0 of one).
fn checkpoints(s: &Scenario) -> (stepsim::model::LayerDag, std::sync::Arc<checkpoint::Checkpoints>) {
    let dag = stepsim::model::build(&s.model, &s.workload);
    let plan = Plan::new(&dag, s.parallel.clone(), s.training.clone(), 8, 8);
    let c = checkpoint::plan(&dag, &plan);
    (dag, c)
}

/// torchtitan's per-op policy on a Llama block saves the attention kernel's outputs (o and
/// the log-sum-exp) and every other `aten.mm`'s: wq (1st) and wv (3rd) of wq/wk/wv/wo, w1
/// (1st) and w2 (3rd) of w1/w3/w2. The block also keeps its input, which its first norm
/// saves and which comes from outside the region. Everything else it saved is recomputed:
/// the norms and their statistics, rope's q and k, wk, wo and the residual, w3, SiLU and
/// the product.
#[test]
fn per_op_policy_keeps_attention_and_every_other_matmul() {
    let s = scenario("fsdp", 2, "activation_checkpointing = \"selective-op\"", "");
    let (dag, c) = checkpoints(&s);
    let kept = X + X + KV + X + LSE + F + X;
    assert_eq!(kept, 65_142_784);
    assert_eq!(c.kept_block_bytes(&dag), vec![kept; 2]);
    let rerun: Vec<&str> = c.recompute_ops[1].iter().map(|&i| dag.ops[i].name.as_str()).collect();
    assert_eq!(
        rerun,
        [
            "layers.1.attention_norm",
            "layers.1.attention.wk",
            "layers.1.attention.rope",
            "layers.1.attention.wo",
            "layers.1.residual1",
            "layers.1.ffn_norm",
            "layers.1.feed_forward.w3",
            "layers.1.feed_forward.silu",
            "layers.1.feed_forward.mul",
        ]
    );
    // Against no checkpointing: x, the norm's output and statistics, q and k after rope, v,
    // o, the log-sum-exp, the residual, the FFN norm's output and statistics, w1, SiLU, w3
    // and the product.
    let none = scenario("fsdp", 2, "activation_checkpointing = \"none\"", "");
    let (dag_n, c_n) = checkpoints(&none);
    let all = X + X + STATS + X + KV + KV + X + LSE + X + X + STATS + 4 * F;
    assert_eq!(c_n.kept_block_bytes(&dag_n), vec![all; 2]);
    assert!(c_n.recompute_ops.iter().all(Vec::is_empty));
}

/// The same policy inside `torch.compile`: AOTAutograd's partitioner saves a policy-saved
/// output only where backward reads it, so the down projection's output (read by nothing in
/// backward: it only joins the residual stream) is not kept, while the query projection's
/// (read by the recomputed rope) and w1's (read by SwiGLU's backward) are.
#[test]
fn compiled_per_op_policy_keeps_only_what_backward_reads() {
    let mut s = scenario("fsdp", 2, "activation_checkpointing = \"selective-op\"", "");
    s.workload.kernels = stepsim::model::KernelStack::Compiled;
    s.workload.fused_swiglu = true;
    let (dag, c) = checkpoints(&s);
    assert_eq!(c.kept_block_bytes(&dag), vec![X + X + KV + X + LSE + F; 2]);
    let kept = |name: &str| c.tensors[dag.tensors.iter().position(|t| t.name == name).unwrap()].kept;
    assert!(!kept("layers.1.feed_forward.w2.out"));
    assert!(kept("layers.1.attention.wq.out") && kept("layers.1.feed_forward.w1.out"));
    let rerun: Vec<&str> = c.recompute_ops[1].iter().map(|&i| dag.ops[i].name.as_str()).collect();
    assert!(!rerun.contains(&"layers.1.feed_forward.w2"), "{rerun:?}");
}

/// torchtitan's `selective_ac_option = "2"` wraps blocks 2, 4, ...: block 1 (index 0) keeps
/// everything, block 2 only its input, and so on; Megatron's `--recompute-method block
/// --recompute-num-layers 1` with two pipeline stages wraps the first block of each stage.
#[test]
fn which_blocks_full_checkpointing_wraps() {
    let none = scenario("fsdp", 4, "activation_checkpointing = \"none\"", "");
    let (dag, c) = checkpoints(&none);
    let all = c.kept_block_bytes(&dag)[0];
    let every2 = scenario("fsdp", 4, "activation_checkpointing = \"full\"\ncheckpoint_every = 2", "");
    let (dag, c) = checkpoints(&every2);
    assert_eq!(c.kept_block_bytes(&dag), vec![all, X, all, X]);
    assert_eq!(c.checkpointed, vec![false, true, false, true]);
    assert!(c.recompute_ops[0].is_empty() && !c.recompute_ops[1].is_empty());
    let block = scenario(
        "megatron",
        4,
        "activation_checkpointing = \"full\"\nrecompute_method = \"block\"\nrecompute_num_layers = 1",
        "pipeline = 2",
    );
    let (_, c) = checkpoints(&block);
    assert_eq!(c.checkpointed, vec![true, false, true, false]);
    // Uniform with one layer per checkpoint is every block, as is checkpoint_every = 1.
    let uniform = scenario(
        "megatron",
        4,
        "activation_checkpointing = \"full\"\nrecompute_method = \"uniform\"\nrecompute_num_layers = 1",
        "",
    );
    assert_eq!(checkpoints(&uniform).1.checkpointed, vec![true; 4]);
    let every1 = scenario("fsdp", 4, "activation_checkpointing = \"full\"\ncheckpoint_every = 1", "");
    assert_eq!(checkpoints(&every1).1.checkpointed, vec![true; 4]);
}

/// Peaks order as what the policies keep per block: none (6 X + 2 KV + 4 F + ... = 172 MB)
/// above every other block ((172 + 8.4) / 2 = 90 MB) above per-op (65 MB) above full
/// (X = 8.4 MB); step times the other way round as far as recomputation goes: the per-op policy reruns
/// no attention and half the matmuls, so it is slower than none and faster than full.
#[test]
fn peaks_and_step_times_order_as_the_policies_keep() {
    let run = |training: &str| {
        let s = scenario("fsdp", 8, training, "");
        let r = stepsim::simulate(&s).unwrap().report;
        (r.peak.as_ref().unwrap().allocated.bytes, r.throughput.as_ref().unwrap().step_time_s)
    };
    let (p_none, t_none) = run("activation_checkpointing = \"none\"");
    let (p_op, t_op) = run("activation_checkpointing = \"selective-op\"");
    let (p_half, _) = run("activation_checkpointing = \"full\"\ncheckpoint_every = 2");
    let (p_full, t_full) = run("activation_checkpointing = \"full\"");
    assert!(p_none > p_half && p_half > p_op && p_op > p_full, "{p_none} {p_half} {p_op} {p_full}");
    assert!(t_none < t_op && t_op < t_full, "{t_none} {t_op} {t_full}");
}

/// Megatron-Core's `--recompute-modules` (selective granularity) on the test Llama under
/// Megatron (fused SwiGLU: the block keeps x, both norms' outputs and statistics, q, k, v,
/// o, the log-sum-exp, the residual, the gate and up outputs and w2's input). "layernorm"
/// discards the two norms' outputs (2 X) and reruns the norms; "mlp" checkpoints the dense
/// MLP, dropping the gate and up outputs and w2's input (3 F) and rerunning the three ops
/// that make them.
#[test]
fn megatron_recompute_modules_drop_what_they_name() {
    let kept = |modules: &str| {
        let s = scenario("megatron", 2, &format!("activation_checkpointing = \"selective\"\n{modules}"), "");
        let (dag, c) = checkpoints(&s);
        let rerun: Vec<String> = c.recompute_ops[1].iter().map(|&i| dag.ops[i].name.clone()).collect();
        (c.kept_block_bytes(&dag)[1], rerun)
    };
    let (base, rerun) = kept("");
    assert!(rerun.is_empty(), "{rerun:?}");
    assert_eq!(base, X + X + STATS + X + KV + KV + X + LSE + X + X + STATS + 3 * F);
    let (ln, rerun) = kept("recompute_modules = [\"layernorm\"]");
    assert_eq!(ln, base - 2 * X);
    assert_eq!(rerun, ["layers.1.attention_norm", "layers.1.ffn_norm"]);
    let (mlp, rerun) = kept("recompute_modules = [\"core_attn\", \"mlp\"]");
    assert_eq!(mlp, base - 3 * F);
    assert_eq!(rerun.len(), 3, "{rerun:?}");
    assert!(rerun.iter().all(|n| n.starts_with("layers.1.feed_forward.")), "{rerun:?}");
}

/// On a mixture of experts: "moe_act" discards the experts' activation output and reruns
/// it alone; "moe" checkpoints the whole layer and keeps less still.
#[test]
fn moe_recompute_modules_keep_less_in_order() {
    let (base, _) = moe_kept("", "");
    let (act, rerun) = moe_kept("recompute_modules = [\"moe_act\"]", "");
    assert_eq!(rerun, ["layers.0.feed_forward.experts.swiglu"]);
    // Each token's two copies, 1024 wide, in BF16.
    assert_eq!(base - act, 2 * T * 1024 * 2);
    let (whole, _) = moe_kept("recompute_modules = [\"moe\"]", "");
    assert!(whole < act, "{whole} {act}");
}

/// What a two-block Megatron MoE (4 experts of 1024, top 2) keeps of block 0 under selective
/// recomputation of `modules`, with `megatron` lines, and what backward reruns.
fn moe_kept(modules: &str, megatron: &str) -> (u64, Vec<String>) {
    let moe = "[model.moe]\nnum_experts = 4\ntop_k = 2\nexpert_ffn_hidden = 1024\n";
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 1024\nn_heads = 8\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = {T}\n{moe}\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n[parallel]\nframework = \"megatron\"\n[megatron]\n{megatron}\n\
         [training]\nmicro_batch = 1\nseq_len = {T}\ngrad_accum = 8\nprecision = \"bf16-mixed-adam\"\nactivation_checkpointing = \"selective\"\n{modules}"
    );
    let s = Scenario::from_toml(Path::new("<moe>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    let (dag, c) = checkpoints(&s);
    let rerun: Vec<String> = c.recompute_ops[0].iter().map(|&i| dag.ops[i].name.clone()).collect();
    (c.kept_block_bytes(&dag)[0], rerun)
}

/// `--activation-func-fp8-input-store`: the experts' SwiGLU keeps its gate and up outputs
/// (each token's two copies, 2 x 1024 wide) as 1-byte casts instead of BF16. Under `moe_act`
/// the activation runs inside `CheckpointWithoutOutput`, which keeps its 16-bit input
/// itself, so the FP8 store saves nothing there and the rerun makes the cast again.
#[test]
fn fp8_input_store_halves_what_the_experts_activation_keeps() {
    let store = "activation_func_fp8_input_store = true";
    let (base, _) = moe_kept("", "");
    let (fp8, rerun) = moe_kept("", store);
    assert!(rerun.is_empty(), "{rerun:?}");
    assert_eq!(base - fp8, 2 * T * 2 * 1024);
    let (act, _) = moe_kept("recompute_modules = [\"moe_act\"]", "");
    let (act_fp8, rerun) = moe_kept("recompute_modules = [\"moe_act\"]", store);
    assert_eq!(act_fp8, act);
    assert_eq!(rerun, ["layers.0.feed_forward.experts.swiglu"]);
}
