//! The Hugging Face families whose blocks differ from Llama's and GPT-2's: GPT-NeoX (Pythia),
//! OLMo, OLMo 2, Gemma 2 and Gemma 3. Each zoo model's parameters summed term by term from
//! its config.json, as transformers' modelling code holds them (independently of stepsim's
//! closed form), against the closed form and the layer DAG; then what each departure does to
//! the layer DAG (positions, norms, residual, soft-capping, sliding windows) and to a step.

use std::path::Path;

use stepsim::model::{build, Attention, SlidingWindow};
use stepsim::scenario::Scenario;

fn scenario(name: &str, seq: u64, checkpointing: &str) -> Scenario {
    let text = format!(
        "[model]\nname = \"{name}\"\n[hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n[parallel]\nsharding = \"full_shard\"\n\
         [training]\nmicro_batch = 1\nseq_len = {seq}\nactivation_checkpointing = \"{checkpointing}\"\n"
    );
    Scenario::from_toml(Path::new("<families>"), &text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn counts(name: &str, expected: u64) {
    let s = scenario(name, 1024, "none");
    assert_eq!(s.model.param_count(), expected, "{name}: closed form");
    assert_eq!(build(&s.model, &s.workload).param_count(), expected, "{name}: layer DAG");
}

/// Pythia-6.9B (`GPTNeoXForCausalLM`): per block the fused q/k/v projection with biases
/// (3h² + 3h), the dense output with bias (h² + h), two LayerNorms (2 x 2h), the MLP's two
/// biased linears (2hf + f + h); untied `embed_in` and `embed_out` (2Vh), the final LayerNorm
/// (2h); no position table (rotary). Pythia's README lists 6,857,302,016 parameters in total
/// and 6,444,163,072 without the embeddings.
#[test]
fn gpt_neox_counts_term_by_term() {
    let (h, f, v, l) = (4096u64, 16_384u64, 50_432u64, 32u64);
    let block = 4 * h * h + 4 * h + 4 * h + 2 * h * f + f + h;
    let total = l * block + 2 * v * h + 2 * h;
    assert_eq!(total, 6_857_302_016);
    assert_eq!(total - 2 * v * h, 6_444_163_072);
    counts("pythia-6.9b", total);
    // GPT-NeoX-20B (h 6144, 44 blocks, f 24576, the same vocabulary).
    let (h, f, l) = (6144u64, 24_576u64, 44u64);
    let total = l * (4 * h * h + 8 * h + 2 * h * f + f + h) + 2 * v * h + 2 * h;
    assert_eq!(total, 20_554_567_680);
    counts("gpt-neox-20b", total);
}

/// OLMo-7B (`OlmoForCausalLM`): Llama's projections (4h² of attention, 3hf of SwiGLU MLP)
/// and no norm parameters at all (`OlmoLayerNorm` has no weight or bias); untied (2Vh). The
/// Hub shows 6.89B.
#[test]
fn olmo_counts_term_by_term() {
    let (h, f, v, l) = (4096u64, 11_008u64, 50_304u64, 32u64);
    let total = l * (4 * h * h + 3 * h * f) + 2 * v * h;
    assert_eq!(total, 6_888_095_744);
    counts("olmo-7b", total);
}

/// OLMo-2-1124-7B (`Olmo2ForCausalLM`): Llama's projections, the post-attention and
/// post-feedforward RMSNorms (2h), `q_norm` over 32 heads x 128 and `k_norm` over 32 KV heads x
/// 128 (h each), the final norm (h), untied (2Vh). The Hub shows 7.3B.
#[test]
fn olmo2_counts_term_by_term() {
    let (h, f, v, l) = (4096u64, 11_008u64, 100_352u64, 32u64);
    let total = l * (4 * h * h + 3 * h * f + 2 * h + 2 * h) + 2 * v * h + h;
    assert_eq!(total, 7_298_617_344);
    counts("olmo-2-7b", total);
}

/// Gemma 2 (`Gemma2ForCausalLM`): q and o of heads x head_dim, k and v of kv_heads x head_dim,
/// four RMSNorms per block (input, post-attention, pre- and post-feedforward), the GeGLU MLP
/// (3hf), tied embeddings (Vh) and the final norm. The Hub shows 9.24B and 27.2B.
#[test]
fn gemma2_counts_term_by_term() {
    let v = 256_000u64;
    let gemma2 = |h: u64, l: u64, heads: u64, kv: u64, hd: u64, f: u64| {
        l * (2 * h * heads * hd + 2 * h * kv * hd + 4 * h + 3 * h * f) + v * h + h
    };
    let nine = gemma2(3584, 42, 16, 8, 256, 14_336);
    assert_eq!(nine, 9_241_705_984);
    counts("gemma-2-9b", nine);
    let twenty_seven = gemma2(4608, 46, 32, 16, 128, 36_864);
    assert_eq!(twenty_seven, 27_227_128_320);
    counts("gemma-2-27b", twenty_seven);
}

/// Gemma 3 1B (`Gemma3ForCausalLM`): Gemma 2's block plus a 256-wide RMSNorm each for the query
/// and key heads; 262,144 tied embeddings. The Gemma 3 report's Table 1 gives 302M embedding
/// and 698M non-embedding parameters.
#[test]
fn gemma3_counts_term_by_term() {
    let (h, f, v, l, hd) = (1152u64, 6912u64, 262_144u64, 26u64, 256u64);
    let block = 2 * h * 4 * hd + 2 * h * hd + 4 * h + 2 * hd + 3 * h * f;
    let total = l * block + v * h + h;
    assert_eq!(total, 999_885_952);
    assert_eq!(((v * h) as f64 / 1e6).round(), 302.0);
    assert_eq!(((total - v * h) as f64 / 1e6).round(), 698.0);
    counts("gemma-3-1b", total);
}

fn op<'a>(dag: &'a stepsim::model::LayerDag, name: &str) -> &'a stepsim::model::Op {
    dag.ops.iter().find(|o| o.name == name).unwrap_or_else(|| panic!("no op {name}"))
}

fn has(dag: &stepsim::model::LayerDag, name: &str) -> bool {
    dag.ops.iter().any(|o| o.name == name)
}

#[test]
fn gpt_neox_turns_a_quarter_of_each_head_and_feeds_the_mlp_the_block_input() {
    let s = scenario("pythia-6.9b", 2048, "none");
    let dag = build(&s.model, &s.workload);
    // Rotary positions, no table.
    assert!(!has(&dag, "pos_embeddings"));
    let rope = op(&dag, "layers.0.attention.rope");
    // 6 FLOPs per turned element: 32 of each of 32 query and 32 key heads, 2048 tokens.
    assert_eq!(rope.fwd_flops, 6.0 * 2048.0 * (2 * 32 * 32) as f64);
    // The cos and sin tables cover the 32 turned dimensions.
    assert_eq!(dag.buffer_bytes, 2 * 2048 * 32 * 4);
    // Parallel residual: both norms read the block's input.
    for l in 0..3 {
        let a = op(&dag, &format!("layers.{l}.attention_norm"));
        let m = op(&dag, &format!("layers.{l}.ffn_norm"));
        assert_eq!(a.inputs[0], m.inputs[0], "block {l}");
    }
    // Attention saves the turned q and k and the fused projection v is a view of.
    let core = op(&dag, "layers.0.attention.core");
    let names: Vec<&str> = core.saves.iter().map(|&t| dag.tensors[t].name.as_str()).collect();
    for n in ["layers.0.attention.rope.q", "layers.0.attention.rope.k", "layers.0.attn.c_attn.out"] {
        assert!(names.contains(&n), "{names:?}");
    }
}

#[test]
fn olmo_norms_have_no_weights_and_olmo2_norms_follow_the_sublayers() {
    let s = scenario("olmo-7b", 2048, "none");
    let dag = build(&s.model, &s.workload);
    for n in ["layers.0.attention_norm", "layers.0.ffn_norm", "norm"] {
        assert_eq!(op(&dag, n).params, 0, "{n}");
    }
    let s = scenario("olmo-2-7b", 2048, "none");
    let dag = build(&s.model, &s.workload);
    assert!(!has(&dag, "layers.0.attention_norm") && !has(&dag, "layers.0.ffn_norm"));
    assert_eq!(op(&dag, "layers.0.post_attention_norm").params, 4096);
    assert_eq!(op(&dag, "layers.0.post_feedforward_norm").params, 4096);
    // The query and key norms span every head: one 4096-wide row per token.
    let q = op(&dag, "layers.0.attention.q_norm");
    assert_eq!(q.params, 4096);
    assert_eq!(dag.tensors[q.outputs[0]].bytes, 2048 * 4096 * 2);
    // The q projection reads the block's input directly.
    assert_eq!(op(&dag, "layers.0.attention.wq").inputs[0], op(&dag, "layers.0.residual1").inputs[0]);
}

#[test]
fn gemma2_local_blocks_compute_the_window_band_and_soft_capping_saves_its_tanh() {
    let (s, w) = (8192u64, 4096u64);
    let model = scenario("gemma-2-9b", s, "none");
    let dag = build(&model.model, &model.workload);
    let flops = |l: u64| op(&dag, &format!("layers.{l}.attention.core")).fwd_flops;
    // Queries 0..=w meet i + 1 keys, the rest w + 1, against the s (s + 1) / 2 of the causal
    // triangle the full count stands for.
    let band = (w + 1) * (w + 2) / 2 + (s - w - 1) * (w + 1);
    let share = band as f64 / (s * (s + 1) / 2) as f64;
    assert_eq!(band, 25_171_968);
    assert!((SlidingWindow::causal_share(w, s) - share).abs() < 1e-15);
    // Even blocks local, odd blocks global (Gemma 2).
    assert!((flops(0) / flops(1) - share).abs() < 1e-12, "{} {}", flops(0), flops(1));
    assert_eq!(flops(1), flops(3));
    assert_eq!(flops(0), flops(2));
    // Within the window, a local block is a global one.
    let short = scenario("gemma-2-9b", 4096, "none");
    let dag4 = build(&short.model, &short.workload);
    let f4 = |l: u64| op(&dag4, &format!("layers.{l}.attention.core")).fwd_flops;
    assert_eq!(f4(0), f4(1));
    // Final logit soft-capping: tanh saves its 16-bit output, tokens x vocabulary.
    let tanh = op(&dag, "output.softcap.tanh");
    assert_eq!(tanh.saves.len(), 1);
    assert_eq!(dag.tensors[tanh.saves[0]].bytes, s * 256_000 * 2);
    assert!(op(&dag, "output.softcap.div").saves.is_empty() && op(&dag, "output.softcap.mul").saves.is_empty());
    // Math attention computes every score (no band) and saves the capped scores too.
    let mut math = model.workload.clone();
    math.attention = Attention::Math;
    let dag = build(&model.model, &math);
    let core = |l: u64| op(&dag, &format!("layers.{l}.attention.core"));
    assert_eq!(core(0).fwd_flops, core(1).fwd_flops);
    let capped = core(0).saves.iter().find(|&&t| dag.tensors[t].name == "layers.0.attention.core.softcap");
    assert_eq!(dag.tensors[*capped.expect("capped scores saved")].bytes, 16 * s * s * 2);
}

#[test]
fn gemma3_attends_globally_every_sixth_block_with_per_head_norms() {
    let s = scenario("gemma-3-1b", 4096, "none");
    let dag = build(&s.model, &s.workload);
    let flops = |l: u64| op(&dag, &format!("layers.{l}.attention.core")).fwd_flops;
    for l in 0..12 {
        let global = l == 5 || l == 11;
        assert_eq!(flops(l) == flops(5), global, "block {l}");
    }
    assert!(flops(0) < 0.25 * flops(5));
    assert_eq!(op(&dag, "layers.0.attention.q_norm").params, 256);
    assert!(!has(&dag, "output.softcap.tanh"));
}

#[test]
fn a_sliding_window_shortens_the_step_and_leaves_memory_alone() {
    // Mistral 7B at 16k tokens: every block's window is 4096.
    let s = scenario("mistral-7b-v0.1", 16_384, "full");
    let windowed = stepsim::simulate(&s).unwrap().report;
    let mut full = s.clone();
    full.model.sliding_window = None;
    let full = stepsim::simulate(&full).unwrap().report;
    let (tw, tf) = (windowed.throughput.unwrap().step_time_s, full.throughput.unwrap().step_time_s);
    assert!(tw < 0.9 * tf, "windowed {tw} s, full {tf} s");
    // FlashAttention saves the same tensors either way.
    assert_eq!(windowed.peak.unwrap().allocated, full.peak.unwrap().allocated);
}

/// gpt-oss (`GptOssForCausalLM`): per block q, k, v and o with biases (heads x 64 = 4096 wide
/// queries, 8 x 64 keys and values), one sink logit per head, two RMSNorms; a router with a
/// bias per expert; experts of `gate_up_proj` (h x 2f, bias 2f) and `down_proj` (f x h, bias
/// h); untied embeddings and the final norm. OpenAI's model card: 20.91B and 116.83B
/// parameters, 3.61B and 5.13B active per token, counting the unembedding and not the
/// embedding table (stepsim's active count has both, V x h more).
#[test]
fn gpt_oss_counts_term_by_term() {
    let (h, v, f, heads, kv, hd) = (2880u64, 201_088u64, 2880u64, 64u64, 8u64, 64u64);
    let attention = 2 * h * heads * hd + 2 * h * kv * hd + heads * hd + 2 * kv * hd + h + heads;
    assert_eq!(attention, 26_550_144);
    let expert = h * 2 * f + 2 * f + f * h + h;
    for (name, blocks, experts, total, card_active) in
        [("gpt-oss-20b", 24u64, 32u64, 20_914_757_184u64, 3.61), ("gpt-oss-120b", 36, 128, 116_829_156_672, 5.13)]
    {
        let block = attention + 2 * h + experts * h + experts + experts * expert;
        assert_eq!(blocks * block + 2 * v * h + h, total, "{name}");
        counts(name, total);
        let s = scenario(name, 1024, "none");
        let active = total - blocks * (experts - 4) * expert;
        assert_eq!(s.model.active_param_count(), active, "{name}");
        let card = (active - v * h) as f64 / 1e9;
        assert!((card - card_active).abs() < 0.005, "{name}: {card:.3}B active without the embedding table");
        // Even blocks attend through a 128-token window.
        let sw = s.model.sliding_window.as_ref().unwrap();
        assert_eq!((sw.window, sw.window_of(0), sw.window_of(1)), (128, Some(128), None));
    }
    // The DAG puts the sinks on the attention core and the biases on the router and experts.
    let s = scenario("gpt-oss-20b", 1024, "none");
    let dag = build(&s.model, &s.workload);
    assert_eq!(op(&dag, "layers.0.attention.core").params, 64);
    assert_eq!(op(&dag, "layers.0.attention.wo").params, 4096 * 2880 + 2880);
    assert_eq!(op(&dag, "layers.0.feed_forward.router").params, 32 * 2880 + 32);
    assert_eq!(op(&dag, "layers.0.feed_forward.experts.w2").params, 32 * (2880 * 2880 + 2880));
}

/// Llama 4's language models (`Llama4ForCausalLM` over the released configs' text_config): per
/// block q and o of 40 x 128, k and v of 8 x 128, two RMSNorms; MoE blocks a router (experts x
/// h), the experts (3 h f each, f = `intermediate_size`) and one shared expert of the same
/// width; dense blocks (Maverick's even ones) a SwiGLU MLP of `intermediate_size_mlp`; untied
/// embeddings. Meta's model cards: 17B active parameters, 109B and 400B in total, the totals
/// with the vision encoder this count leaves out (within 2%).
#[test]
fn llama4_counts_term_by_term_with_chunked_attention_and_interleaved_experts() {
    let (h, v, f, fd) = (5120u64, 202_048u64, 8192u64, 16_384u64);
    let attention = 2 * h * 40 * 128 + 2 * h * 8 * 128 + 2 * h;
    let expert = 3 * h * f;
    let dense = attention + 3 * h * fd;
    let outside = 2 * v * h + h;
    for (name, experts, every, total, card_total) in [
        ("llama-4-scout", 16u64, 1u64, 107_769_861_120u64, 109.0),
        ("llama-4-maverick", 128, 2, 400_711_848_960, 400.0),
    ] {
        let moe_blocks = 48 / every;
        let moe = attention + experts * h + experts * expert + expert;
        assert_eq!((48 - moe_blocks) * dense + moe_blocks * moe + outside, total, "{name}");
        counts(name, total);
        let s = scenario(name, 16_384, "full");
        let active = total - moe_blocks * (experts - 1) * expert;
        assert_eq!(s.model.active_param_count(), active, "{name}");
        assert!((active as f64 / 1e9 / 17.0 - 1.0).abs() < 0.02, "{name}: {active} active");
        assert!((total as f64 / 1e9 / card_total - 1.0).abs() < 0.02, "{name}: {total} in all");
        // Maverick's MoE blocks are the odd ones (interleave_moe_layer_step 2).
        let moe_at: Vec<u64> = (0..4).filter(|&l| s.model.is_moe_layer(l)).collect();
        assert_eq!(moe_at, if every == 1 { vec![0, 1, 2, 3] } else { vec![1, 3] }, "{name}");
        // Rotary blocks attend within 8192-token chunks, every 4th (NoPE) block globally.
        let dag = build(&s.model, &s.workload);
        let flops = |l: u64| op(&dag, &format!("layers.{l}.attention.core")).fwd_flops;
        let share = (2.0 * 8192.0 * 8193.0 / 2.0) / (16_384.0 * 16_385.0 / 2.0);
        assert!((SlidingWindow::chunked_share(8192, 16_384) - share).abs() < 1e-15);
        assert!((flops(0) / flops(3) - share).abs() < 1e-12, "{name}");
        assert_eq!(flops(3), flops(7));
    }
}
