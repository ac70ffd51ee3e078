//! Models from Hugging Face `config.json` files and the shipped zoo (`models/`): every zoo
//! model's parameter count equals its released checkpoint's total exactly (the closed form
//! and the layer DAG's own count; for mixture-of-experts models the active count too;
//! DeepSeek-V3, whose FP8 checkpoint gives no count, against its sum term by term), fields
//! beside the config override it, and a config is found relative to the scenario file.
//! Malformed and unsupported configs are in tests/malformed.rs and the unit tests of
//! src/model/hf.rs.

mod common;

use std::path::Path;

use stepsim::scenario::Scenario;

/// Each zoo model's published parameter count: the checkpoint's
/// `model.safetensors.index.json` total size over 2 bytes (BF16), tests/fixtures/hf/README.md.
const PUBLISHED: &[(&str, u64)] = &[
    ("gemma-7b", 8_537_680_896),
    // The families added with GPT-NeoX, OLMo, Gemma 2/3, gpt-oss and Llama 4 are summed term by term in
    // tests/hf_families.rs; there, each against the figure its authors publish.
    ("gemma-2-9b", 9_241_705_984),
    ("gemma-2-27b", 27_227_128_320),
    ("gemma-3-1b", 999_885_952),
    ("gpt-neox-20b", 20_554_567_680),
    ("gpt-oss-20b", 20_914_757_184),
    ("gpt-oss-120b", 116_829_156_672),
    ("llama-4-scout", 107_769_861_120),
    ("llama-4-maverick", 400_711_848_960),
    ("olmo-7b", 6_888_095_744),
    ("olmo-2-7b", 7_298_617_344),
    ("pythia-6.9b", 6_857_302_016),
    // openai-community/gpt2 and gpt2-xl: one model.safetensors each (no index); the counts are
    // transformers' GPT2LMHeadModel.num_parameters(), and nanoGPT's from_pretrained prints
    // 123.65M and 1555.97M for them, the same less the 1024 x n_embd position table.
    ("gpt2", 124_439_808),
    ("gpt2-xl", 1_557_611_200),
    ("llama-3.1-8b", 8_030_261_248),
    ("llama-3.1-70b", 70_553_706_496),
    ("llama-3.1-405b", 405_853_388_800),
    ("mistral-7b-v0.1", 7_241_732_096),
    ("mistral-nemo-12b", 12_247_782_400),
    // mistralai/Mixtral-8x7B-v0.1: index total_size 93,405,585,408 bytes / 2; the model card's
    // "46.7B total parameters".
    ("mixtral-8x7b", 46_702_792_704),
    // mistralai/Mixtral-8x22B-v0.1: index total_size 281,241,268,224 bytes / 2; the Hub's 141B.
    ("mixtral-8x22b", 140_620_634_112),
    ("phi-3-mini-4k", 3_821_079_552),
    // Qwen/Qwen1.5-MoE-A2.7B: index total_size 28,631,568,384 bytes / 2; the card's "14.3B
    // parameters in total".
    ("qwen1.5-moe-a2.7b", 14_315_784_192),
    ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-72b", 72_706_203_648),
    ("qwen3-8b", 8_190_735_360),
    // Qwen/Qwen3-30B-A3B: index total_size 61,064,245,248 bytes / 2; the card's "30.5B in
    // total".
    ("qwen3-30b-a3b", 30_532_122_624),
    // Qwen/Qwen3-235B-A22B: index total_size 470,187,269,120 bytes / 2; the card's "235B in
    // total".
    ("qwen3-235b-a22b", 235_093_634_560),
    // deepseek-ai/DeepSeek-V3: not a checkpoint total (its weights are FP8 with scales, and it
    // holds the multi-token-prediction module, 685B in all) but the model's own count, summed
    // term by term in `deepseek_v3_counts_term_by_term`: the paper's "671B total parameters".
    ("deepseek-v3", 671_026_404_352),
];

/// The mixture-of-experts zoo models' parameters one token uses (router, top-k experts and
/// shared experts of every block, plus attention, norms and embeddings): the closed form's
/// `active_param_count`, exact, and the rounded figure each model card gives (all count the
/// embeddings in): Mixtral's "12.9B active parameters" (8x7B) and "39B active" (8x22B), Qwen's
/// "2.7B activated" (Qwen1.5-MoE-A2.7B; 2.07B without embeddings), "3.3B activated"
/// (Qwen3-30B-A3B) and "22B activated" (Qwen3-235B-A22B).
const ACTIVE: &[(&str, u64, f64)] = &[
    // (model, active parameters, the card's figure in billions)
    ("mixtral-8x7b", 12_879_925_248, 12.9),
    ("mixtral-8x22b", 39_152_031_744, 39.0),
    ("qwen1.5-moe-a2.7b", 2_689_173_504, 2.7),
    ("qwen3-30b-a3b", 3_353_032_704, 3.3),
    ("qwen3-235b-a22b", 22_190_763_520, 22.0),
    // DeepSeek-V3's "37B activated for each token" (router, 8 routed and the shared expert).
    ("deepseek-v3", 37_552_282_624, 37.0),
];

fn scenario(model: &str, extra_model: &str, seq: u64) -> String {
    format!(
        "[model]\n{model}\n{extra_model}\n[hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n[parallel]\nsharding = \"full_shard\"\n\
         [training]\nmicro_batch = 1\nseq_len = {seq}\nactivation_checkpointing = \"full\"\n"
    )
}

#[test]
fn every_zoo_model_has_its_published_parameter_count() {
    assert_eq!(PUBLISHED.len(), stepsim::model::hf::ZOO.len(), "every zoo model has a published count here");
    for &(name, published) in PUBLISHED {
        let s = Scenario::from_toml(Path::new("<zoo>"), &scenario(&format!("name = \"{name}\""), "", 1024))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let dag = stepsim::model::build(&s.model, &s.workload);
        println!("{name:<18} {published:>16} closed form {:>16} DAG {:>16}", s.model.param_count(), dag.param_count());
        assert_eq!(s.model.param_count(), published, "{name}: closed form");
        // Mixture-of-experts models too: router, every expert and the shared experts.
        assert_eq!(dag.param_count(), published, "{name}: the layer DAG");
    }
}

#[test]
fn mixture_of_experts_zoo_models_have_their_active_parameter_counts() {
    for &(name, active, card_billions) in ACTIVE {
        let z = stepsim::model::hf::zoo(name).unwrap();
        let h = stepsim::model::hf::parse(z.config).unwrap();
        let m = h.moe.clone().unwrap_or_else(|| panic!("{name}: a mixture of experts"));
        let model = h.model_config(2048);
        let total = PUBLISHED.iter().find(|p| p.0 == name).unwrap().1;
        assert_eq!(model.param_count(), total, "{name}: total");
        assert_eq!(model.active_param_count(), active, "{name}: active");
        // Only the routed experts a token skips are inactive.
        let skipped = model.moe_layers() * (m.num_experts - m.top_k) * m.expert_params(model.hidden);
        assert_eq!(total - active, skipped, "{name}");
        // Cards round (Qwen3-30B-A3B's 3.35B is "3.3B"): within 2%.
        let billions = active as f64 / 1e9;
        assert!(
            (billions / card_billions - 1.0).abs() < 0.02,
            "{name}: {billions:.3}B active, the card says {card_billions}B"
        );
        // The scenario reads the same experts from the zoo name.
        let s = Scenario::from_toml(Path::new("<zoo>"), &scenario(&format!("name = \"{name}\""), "", 1024)).unwrap();
        assert_eq!(s.model.moe.as_ref(), Some(&m), "{name}: the scenario's experts");
        assert_eq!(s.model.active_param_count(), active, "{name}: the scenario's active count");
    }
}

#[test]
fn moe_layer_patterns_are_read_and_impossible_ones_refused_naming_the_key() {
    let base = r#""hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 4,
        "intermediate_size": 5632, "vocab_size": 1000"#;
    // DeepSeek's moe_layer_freq: MoE in blocks 0 and 2 of 4, the others dense.
    let h = stepsim::model::hf::parse(&format!(
        r#"{{"model_type": "deepseek_v3", {base}, "kv_lora_rank": 512, "n_routed_experts": 256, "moe_layer_freq": 2, "first_k_dense_replace": 0}}"#
    ))
    .unwrap();
    let model = h.model_config(2048);
    assert_eq!(model.moe_layers(), 2);
    let m = h.moe.clone().unwrap();
    let (dense, moe) = (model.block_params(1), model.block_params(0));
    assert_eq!(moe - dense, m.mlp_params(2048) - 3 * 2048 * 5632);
    assert_eq!(model.param_count(), model.params_outside_blocks() + 2 * dense + 2 * moe);
    // Qwen3-MoE's decoder_sparse_step 2: blocks 1 and 3.
    let h = stepsim::model::hf::parse(&format!(
        r#"{{"model_type": "qwen3_moe", {base}, "head_dim": 128, "decoder_sparse_step": 2}}"#
    ))
    .unwrap();
    let model = h.model_config(2048);
    assert_eq!((0..4).map(|l| model.is_moe_layer(l)).collect::<Vec<_>>(), [false, true, false, true]);
    // Through a scenario, the layer DAG builds the same blocks: its count equals the closed form.
    let dir = std::env::temp_dir().join(format!("stepsim-hf-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        format!(r#"{{"model_type": "qwen3_moe", {base}, "head_dim": 128, "decoder_sparse_step": 2}}"#),
    )
    .unwrap();
    let s = Scenario::from_toml(&dir.join("job.toml"), &scenario("hf_config = \"config.json\"", "", 2048)).unwrap();
    assert_eq!(s.model.param_count(), model.param_count());
    let dag = stepsim::model::build(&s.model, &s.workload);
    assert_eq!(dag.param_count(), model.param_count());
    assert!(dag.ops.iter().any(|o| o.name == "layers.0.feed_forward.w1"), "block 0 dense");
    assert!(dag.ops.iter().any(|o| o.name == "layers.1.feed_forward.router"), "block 1 MoE");
    assert!(stepsim::simulate(&s).is_ok());
    // A pattern with no MoE block left is refused, naming the key, through a scenario too.
    std::fs::write(
        dir.join("config.json"),
        format!(r#"{{"model_type": "qwen3_moe", {base}, "head_dim": 128, "decoder_sparse_step": 8}}"#),
    )
    .unwrap();
    let e = Scenario::from_toml(&dir.join("job.toml"), &scenario("hf_config = \"config.json\"", "", 2048))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`decoder_sparse_step`") && e.contains("model.hf_config"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// DeepSeek-V3 (deepseek-ai/DeepSeek-V3's config.json, models/deepseek-v3.json) summed by hand,
/// as transformers' `DeepseekV3ForCausalLM` holds it (no multi-token-prediction module; the
/// routers' `e_score_correction_bias` buffers are not parameters):
///
/// - embeddings and the untied LM head: 2 x 129,280 x 7,168 = 1,853,358,080
/// - attention of each of the 61 blocks (multi-head latent attention, 128 heads):
///   q_a_proj 7,168 x 1,536 = 11,010,048; q_a_layernorm 1,536;
///   q_b_proj 1,536 x 128 x (128 + 64) = 37,748,736;
///   kv_a_proj_with_mqa 7,168 x (512 + 64) = 4,128,768; kv_a_layernorm 512;
///   kv_b_proj 512 x 128 x (128 + 128) = 16,777,216; o_proj 128 x 128 x 7,168 = 117,440,512:
///   187,107,328, plus the input and post-attention RMSNorms 2 x 7,168: 187,121,664
/// - the 3 dense MLPs (first_k_dense_replace): 3 x 7,168 x 18,432 = 396,361,728 each
/// - the 58 MoE MLPs: router 256 x 7,168 = 1,835,008; 256 experts of 3 x 7,168 x 2,048 =
///   44,040,192 each, 11,274,289,152; one shared expert 44,040,192: 11,320,164,352 each
/// - the final norm 7,168
///
/// Total: 1,853,358,080 + 61 x 187,121,664 + 3 x 396,361,728 + 58 x 11,320,164,352 + 7,168
/// = 671,026,404,352 (the paper's "671B total parameters"). Active: the same with 8 of the
/// 256 routed experts per MoE block, i.e. 58 x 248 x 44,040,192 = 633,474,121,728 fewer:
/// 37,552,282,624 (the paper's "37B activated"). The released checkpoint's 685B adds the
/// MTP module (one more MoE block, its norms and its 2 x 7,168 -> 7,168 projection: 11.6B,
/// and its own copies of the embedding and head, 1.85B).
#[test]
fn deepseek_v3_counts_term_by_term() {
    let (h, v, heads, blocks) = (7_168u64, 129_280u64, 128u64, 61u64);
    let emb = 2 * v * h;
    assert_eq!(emb, 1_853_358_080);
    let mla = h * 1_536
        + 1_536
        + 1_536 * heads * (128 + 64)
        + h * (512 + 64)
        + 512
        + 512 * heads * (128 + 128)
        + heads * 128 * h;
    assert_eq!(mla, 187_107_328);
    let attention = mla + 2 * h;
    let dense = 3 * h * 18_432;
    assert_eq!(dense, 396_361_728);
    let (router, expert) = (256 * h, 3 * h * 2_048);
    assert_eq!((router, expert), (1_835_008, 44_040_192));
    let moe = router + 256 * expert + expert;
    assert_eq!(moe, 11_320_164_352);
    let total = emb + blocks * attention + 3 * dense + 58 * moe + h;
    assert_eq!(total, 671_026_404_352);
    let active = total - 58 * (256 - 8) * expert;
    assert_eq!(active, 37_552_282_624);

    let s = Scenario::from_toml(Path::new("<zoo>"), &scenario("name = \"deepseek-v3\"", "", 4096)).unwrap();
    let m = &s.model;
    assert_eq!(
        (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.ffn_hidden, m.vocab),
        (61, h, heads, heads, 18_432, v)
    );
    assert!(!m.tie_embeddings && m.head_dim_override.is_none() && !m.qkv_bias && !m.qk_norm);
    let a = m.mla.as_ref().unwrap();
    assert_eq!(
        (a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim),
        (1_536, 512, 128, 64, 128)
    );
    assert_eq!(a.params(h, heads), mla);
    let e = m.moe.as_ref().unwrap();
    assert_eq!((e.num_experts, e.top_k, e.expert_ffn_hidden, e.shared_expert_ffn_hidden), (256, 8, 2_048, 2_048));
    assert_eq!((e.first_dense_layers, e.shared_expert_gate, m.moe_layers()), (3, false, 58));
    assert_eq!((m.block_params(0), m.block_params(2)), (attention + dense, attention + dense));
    assert_eq!((m.block_params(3), m.block_params(60)), (attention + moe, attention + moe));
    assert_eq!(m.param_count(), total);
    assert_eq!(m.active_param_count(), active);
    let z = stepsim::model::hf::parse(stepsim::model::hf::zoo("deepseek-v3").unwrap().config).unwrap();
    assert_eq!(z.max_position_embeddings, Some(163_840));
    // The zoo file is the released config less its FP8 quantization_config, and says so.
    let zoo = stepsim::model::hf::zoo("deepseek-v3").unwrap();
    assert!(!zoo.config.contains("quantization_config") && zoo.source.contains("quantization_config"));
    // The layer DAG's own count agrees (every_zoo_model_has_its_published_parameter_count too).
    assert_eq!(stepsim::model::build(&s.model, &s.workload).param_count(), total);
}

#[test]
fn head_dim_biases_and_head_norms_reach_the_layer_dag() {
    // Gemma-7B: 16 heads of 256 = 4096-wide queries on a 3072-wide residual stream.
    let s = Scenario::from_toml(Path::new("<zoo>"), &scenario("name = \"gemma-7b\"", "", 2048)).unwrap();
    assert_eq!((s.model.head_dim(), s.model.q_dim()), (256, 4096));
    let dag = stepsim::model::build(&s.model, &s.workload);
    let wq = dag.ops.iter().find(|o| o.name == "layers.0.attention.wq").unwrap();
    assert_eq!(wq.gemm, Some([2048, 4096, 3072]));
    let wo = dag.ops.iter().find(|o| o.name == "layers.0.attention.wo").unwrap();
    assert_eq!(wo.gemm, Some([2048, 3072, 4096]));
    // Qwen2.5: q, k and v carry biases (3584 + 2 x 512 elements per block).
    let s = Scenario::from_toml(Path::new("<zoo>"), &scenario("name = \"qwen2.5-7b\"", "", 2048)).unwrap();
    let dag = stepsim::model::build(&s.model, &s.workload);
    let p = |n: &str| dag.ops.iter().find(|o| o.name == n).unwrap().params;
    assert_eq!(p("layers.0.attention.wq"), 3584 * 3584 + 3584);
    assert_eq!(p("layers.0.attention.wk"), 3584 * 512 + 512);
    // Qwen3: one 128-wide RMSNorm weight each for the query and the key heads.
    let s = Scenario::from_toml(Path::new("<zoo>"), &scenario("name = \"qwen3-8b\"", "", 2048)).unwrap();
    let dag = stepsim::model::build(&s.model, &s.workload);
    let p = |n: &str| dag.ops.iter().find(|o| o.name == n).unwrap().params;
    assert_eq!((p("layers.0.attention.q_norm"), p("layers.0.attention.k_norm")), (128, 128));
}

#[test]
fn fields_beside_a_config_override_it_and_paths_are_relative_to_the_scenario() {
    let dir = std::env::temp_dir().join(format!("stepsim-hf-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("cfg")).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2.5-7b-config.json");
    std::fs::copy(&fixture, dir.join("cfg/config.json")).unwrap();
    let path = dir.join("job.toml");
    let s = Scenario::from_toml(&path, &scenario("hf_config = \"cfg/config.json\"", "", 4096)).unwrap();
    assert_eq!(s.model.param_count(), 7_615_616_512);
    assert!(s.model_source.as_deref().unwrap().contains("model_type qwen2"));
    // Two layers instead of 28: the blocks' share goes, the embeddings stay.
    let small = Scenario::from_toml(&path, &scenario("hf_config = \"cfg/config.json\"", "n_layers = 2", 4096)).unwrap();
    let per_block = (7_615_616_512 - 1_089_998_336) / 28;
    assert_eq!(small.model.param_count(), 1_089_998_336 + 2 * per_block);
    assert!(small.model_source.as_deref().unwrap().contains("overridden: n_layers"));
    // And the override can turn the biases off.
    let nobias =
        Scenario::from_toml(&path, &scenario("hf_config = \"cfg/config.json\"", "qkv_bias = false", 4096)).unwrap();
    assert_eq!(nobias.model.param_count(), 7_615_616_512 - 28 * (3584 + 2 * 512));
    // The whole job runs, and the report names where the model came from.
    let sim = stepsim::simulate(&s).unwrap();
    assert!(sim.report.model_source.as_deref().unwrap().contains("cfg/config.json"));
    std::fs::remove_dir_all(&dir).ok();
}

/// An error of a model field the scenario does not set says the value is the config's (or the
/// zoo model's): the user wrote hf_config or name, not the field. A field the scenario sets
/// itself gets no such note.
#[test]
fn an_error_in_a_value_the_config_gives_names_the_config() {
    let path = Path::new("job.toml");
    let qwen = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2.5-7b-config.json");
    let qwen = format!("hf_config = {}", toml::Value::String(qwen.display().to_string()));
    // Qwen2.5-7B has 28 heads and 4 KV heads: 14 heads leave the config's 4 KV heads over.
    let e = Scenario::from_toml(path, &scenario(&qwen, "n_heads = 14", 4096)).unwrap_err();
    assert_eq!(e.field, "model.n_kv_heads", "{e}");
    let note = "(the scenario does not set model.n_kv_heads: the value comes from model.hf_config = \"";
    assert!(e.message.contains(note) && e.message.ends_with("qwen2.5-7b-config.json\")"), "{e}");
    let e = Scenario::from_toml(path, &scenario(&qwen, "n_heads = 14\nn_kv_heads = 4", 4096)).unwrap_err();
    assert_eq!(e.field, "model.n_kv_heads", "{e}");
    assert!(!e.message.contains("does not set"), "{e}");
    // The zoo's Llama 3.1 8B: 8 KV heads do not divide 4 heads.
    let e = Scenario::from_toml(path, &scenario("name = \"llama-3.1-8b\"", "n_heads = 4", 4096)).unwrap_err();
    assert!(
        e.message.ends_with("(the scenario does not set model.n_kv_heads: the value comes from the zoo model, model.name = \"llama-3.1-8b\")"),
        "{e}"
    );
}

#[test]
fn stepsim_models_lists_the_zoo_with_counts_and_sources() {
    let o = common::stepsim(&["models"], Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(o.status.code(), Some(0));
    let out = common::text(&o.stdout);
    let with_commas = |n: u64| {
        n.to_string().as_bytes().rchunks(3).rev().map(|c| std::str::from_utf8(c).unwrap()).collect::<Vec<_>>().join(",")
    };
    let line = |name: &str| {
        out.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}:\n{out}")).to_string()
    };
    for &(name, published) in PUBLISHED {
        let line = line(name);
        assert!(line.contains(&with_commas(published)) && line.contains("https://huggingface.co/"), "{line}");
    }
    // Mixture-of-experts models show the parameters a token uses beside the total.
    assert!(out.lines().next().unwrap().contains("active"), "{out}");
    for &(name, active, _) in ACTIVE {
        let line = line(name);
        assert!(line.contains(&with_commas(active)), "{line}");
    }
}

/// DeepSeek's group-limited routing: V3's router always takes a token's experts from its
/// best `topk_group` of `n_group` groups (transformers' defaults 8 and 4, the released
/// config's values); V2's only with `topk_method = "group_limited_greedy"`; groups that do
/// not split the experts are refused naming the keys.
#[test]
fn deepseek_group_limited_routing_is_read() {
    let s = Scenario::from_toml(Path::new("<zoo>"), &scenario("name = \"deepseek-v3\"", "", 1024)).unwrap();
    let m = s.model.moe.as_ref().unwrap();
    assert_eq!((m.router_groups, m.router_group_topk), (8, 4));
    let base = r#""hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 4,
        "intermediate_size": 5632, "vocab_size": 1000, "kv_lora_rank": 512, "num_experts_per_tok": 6"#;
    let v2 = |extra: &str| stepsim::model::hf::parse(&format!(r#"{{"model_type": "deepseek_v2", {base}{extra}}}"#));
    let groups = |extra: &str| v2(extra).map(|h| h.moe.map(|m| (m.router_groups, m.router_group_topk)));
    assert_eq!(groups(r#", "n_group": 8, "topk_group": 3"#).unwrap(), Some((1, 1)));
    assert_eq!(
        groups(r#", "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3"#).unwrap(),
        Some((8, 3))
    );
    let e = v2(r#", "topk_method": "group_limited_greedy", "n_group": 7, "topk_group": 3"#).unwrap_err();
    assert!(e.contains("n_group") && e.contains("topk_group"), "{e}");
}
