//! Models from Hugging Face `config.json` files and the shipped zoo (`models/`): every zoo
//! model's parameter count equals its released checkpoint's total exactly (the closed form
//! and the layer DAG's own count), fields beside the config override it, and a config is
//! found relative to the scenario file. Malformed and unsupported configs are in
//! tests/malformed.rs and the unit tests of src/model/hf.rs.

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
    ("phi-3-mini-4k", 3_821_079_552),
    ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-72b", 72_706_203_648),
    ("qwen3-8b", 8_190_735_360),
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
        assert_eq!(dag.param_count(), published, "{name}: the layer DAG");
    }
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
    for &(name, published) in PUBLISHED {
        let line = out.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}:\n{out}"));
        let with_commas = published
            .to_string()
            .as_bytes()
            .rchunks(3)
            .rev()
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(",");
        assert!(line.contains(&with_commas) && line.contains("https://huggingface.co/"), "{line}");
    }
}
