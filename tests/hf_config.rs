//! Models from Hugging Face `config.json` files and the shipped zoo (`models/`): every zoo
//! model's parameter count equals its released checkpoint's total exactly (the closed form
//! and the layer DAG's own count; for mixture-of-experts models the active count too), fields
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
        let s = Scenario::from_toml(Path::new("<zoo>"), &scenario(&format!("name = \"{name}\""), "", 2048))
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
        let s = Scenario::from_toml(Path::new("<zoo>"), &scenario(&format!("name = \"{name}\""), "", 2048)).unwrap();
        assert_eq!(s.model.moe.as_ref(), Some(&m), "{name}: the scenario's experts");
        assert_eq!(s.model.active_param_count(), active, "{name}: the scenario's active count");
    }
}

#[test]
fn moe_configs_the_block_cannot_express_are_refused_naming_why() {
    let base = r#""hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 4,
        "intermediate_size": 5632, "vocab_size": 1000"#;
    let e = stepsim::model::hf::parse(&format!(
        r#"{{"model_type": "deepseek_v3", {base}, "kv_lora_rank": 512, "n_routed_experts": 256}}"#
    ))
    .unwrap_err();
    assert!(e.contains("deepseek_v3") && e.contains("multi-head latent attention"), "{e}");
    let e = stepsim::model::hf::parse(&format!(
        r#"{{"model_type": "qwen3_moe", {base}, "head_dim": 128, "decoder_sparse_step": 2}}"#
    ))
    .unwrap_err();
    assert!(e.contains("`decoder_sparse_step`"), "{e}");
    // And through a scenario, the error names the config file's key too.
    let dir = std::env::temp_dir().join(format!("stepsim-hf-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        format!(r#"{{"model_type": "qwen3_moe", {base}, "head_dim": 128, "decoder_sparse_step": 2}}"#),
    )
    .unwrap();
    let e = Scenario::from_toml(&dir.join("job.toml"), &scenario("hf_config = \"config.json\"", "", 2048))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`decoder_sparse_step`") && e.contains("model.hf_config"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
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
