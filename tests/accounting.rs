//! Accounting against closed forms and published tables:
//! - parameter counts of the DAG against the closed forms of each family;
//! - saved activations per layer against Korthikanti et al. 2022 (Sec. 4.1, no parallelism):
//!   34 s b h + 5 a s^2 b bytes per GPT layer with math attention (16-bit activations, dropout
//!   on), and 34 s b h with flash attention (no s^2 term) — exactly, plus the small FP32 per-row
//!   statistics Korthikanti leaves out, checked separately;
//! - model-state bytes per GPU against the ZeRO paper's Table 1 (tests/fixtures/zero_table1.json,
//!   Rajbhandari et al. SC'20, 7.5B parameters, K = 12), within 1%, both from the plan and as
//!   the simulation holds them at the end of a steady-state backward.

use std::path::Path;

use stepsim::memory::Category;
use stepsim::model::{self, Attention, Dtype, Family, ModelConfig, Region, Workload};
use stepsim::scenario::Scenario;
use stepsim::schedule::{Phase, TaskKind};

fn gpt(l: u64, h: u64, a: u64, dropout: f64) -> ModelConfig {
    ModelConfig {
        family: Family::Gpt,
        n_layers: l,
        hidden: h,
        n_heads: a,
        n_kv_heads: a,
        ffn_hidden: 4 * h,
        vocab: 50257,
        max_seq_len: 2048,
        tie_embeddings: true,
        dropout,
        embedding_norm: false,
        head_dim_override: None,
        qkv_bias: false,
        qk_norm: false,
        moe: None,
        mla: None,
        style: Default::default(),
        sliding_window: None,
        mtp: None,
    }
}

#[test]
fn dag_parameter_counts_match_closed_forms() {
    let w = Workload::plain(1, 128, Attention::Flash);
    // 100B GPT of the shipped scenarios: 12h^2 + 13h per layer, tied V h, 2048 positions, final LN.
    let c = gpt(80, 10240, 80, 0.1);
    let h = 10240u64;
    assert_eq!(c.param_count(), 80 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h);
    assert_eq!(c.param_count(), 101_209_569_280);
    assert_eq!(model::build(&c, &w).param_count(), c.param_count());
    // Llama with grouped-query attention (Llama-2-70B shape): 68,976,648,192 parameters.
    let l = ModelConfig::llama2_70b();
    assert_eq!(l.param_count(), 68_976_648_192);
    assert_eq!(model::build(&l, &w).param_count(), l.param_count());
    // Every shipped scenario.
    for e in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let s = Scenario::load(&p).unwrap();
        // The whole model (a tensor-parallel scenario's DAG is one rank's share).
        let whole = Workload { split: Default::default(), ..s.workload.clone() };
        let dag = model::build(&s.model, &whole);
        // A LoRA DAG adds its adapters to the (frozen) model.
        let base = if dag.lora.is_some() { dag.frozen_params() } else { dag.param_count() };
        assert_eq!(base, s.model.param_count(), "{}", p.display());
    }
}

/// Saved bytes of one block, and the per-row statistics separately.
fn block_saved(cfg: &ModelConfig, w: &Workload) -> (u64, u64) {
    let dag = model::build(cfg, w);
    let all = dag.saved_bytes(Region::Block(0), true);
    let main = dag.saved_bytes(Region::Block(0), false);
    (main, all - main)
}

#[test]
fn activations_per_layer_follow_korthikanti() {
    for (s, b, h, a) in [(2048u64, 1u64, 4096u64, 32u64), (1024, 4, 1024, 16), (4096, 2, 12288, 96)] {
        let cfg = gpt(2, h, a, 0.1);
        let math = Workload::plain(b, s, Attention::Math);
        let (main, stats) = block_saved(&cfg, &math);
        assert_eq!(main, 34 * s * b * h + 5 * a * s * s * b, "math attention, s={s} b={b} h={h} a={a}");
        // Two LayerNorms keep FP32 mean and rstd per row.
        assert_eq!(stats, 2 * 8 * s * b);
        let flash = Workload { attention: Attention::Flash, ..math.clone() };
        let (main, stats) = block_saved(&cfg, &flash);
        assert_eq!(main, 34 * s * b * h, "flash attention drops the s^2 term");
        // ... and keeps the FP32 log-sum-exp per head and row.
        assert_eq!(stats, 2 * 8 * s * b + 4 * a * s * b);
        assert!((stats as f64) < 0.01 * main as f64);
        // Without dropout the two 1-byte masks (2 s b h) and, for math attention, the mask
        // and dropout output of the scores (3 a s^2 b) go away.
        let nod = gpt(2, h, a, 0.0);
        assert_eq!(block_saved(&nod, &flash).0, 32 * s * b * h);
        assert_eq!(block_saved(&nod, &math).0, 32 * s * b * h + 2 * a * s * s * b);
        // Hugging Face's eager attention saves the FP32 softmax (4 bytes a score) beside its
        // 16-bit copy: 4 a s^2 b more than the fused chain, with dropout or without.
        let eager = Workload { attention: Attention::Eager, ..math.clone() };
        assert_eq!(block_saved(&cfg, &eager).0, 34 * s * b * h + 9 * a * s * s * b);
        assert_eq!(block_saved(&nod, &eager).0, 32 * s * b * h + 6 * a * s * s * b);
        // In FP32 compute the casts are no-ops: the softmax is saved once.
        let fp32 = Workload { compute_dtype: Dtype::Fp32, ..eager.clone() };
        let fp32_math = Workload { compute_dtype: Dtype::Fp32, ..math.clone() };
        assert_eq!(block_saved(&nod, &fp32).0, block_saved(&nod, &fp32_math).0);
    }
}

/// Eager attention's passes and transients against math attention's on one op: the chain's
/// bytes per score (bf16: 30 forward and 28 backward against 2 and 3), the FP32 softmax's
/// scratch and the kernels it launches.
#[test]
fn eager_attention_runs_hugging_faces_chain() {
    let (s, b, h, a) = (1024u64, 2u64, 1024u64, 16u64);
    let cfg = gpt(2, h, a, 0.0);
    let base = Workload::plain(b, s, Attention::Math);
    let core = |w: &Workload| {
        let dag = model::build(&cfg, w);
        dag.ops.iter().find(|o| o.name == "layers.0.attention.core").unwrap().clone()
    };
    let n = (a * s * s * b) as f64;
    let math = core(&base);
    let eager = core(&Workload { attention: Attention::Eager, ..base.clone() });
    assert_eq!(math.chain_bytes, [2.0 * 2.0 * n, 3.0 * 2.0 * n]);
    assert_eq!(eager.chain_bytes, [30.0 * n, 28.0 * n]);
    // The GEMMs' traffic and FLOPs are the same kernels'.
    assert_eq!((eager.fwd_bytes, eager.bwd_bytes, eager.fwd_flops), (math.fwd_bytes, math.bwd_bytes, math.fwd_flops));
    assert_eq!(eager.fwd_scratch, 6 * a * s * s * b);
    assert_eq!(eager.bwd_scratch, 8 * a * s * s * b);
    assert_eq!(eager.launches, [7, 8]);
}

#[test]
fn selective_checkpointing_keeps_all_but_the_scores_and_the_schedule_frees_what_the_dag_says() {
    // One GPU, plenty of memory: the saved activations at the end of the forward must be the
    // DAG's per-layer figure times the layers plus the embedding/head terms.
    let base = |ck: &str, attn: &str| {
        format!(
            "[model]\nfamily = \"gpt\"\nn_layers = 4\nhidden = 1024\nn_heads = 16\nvocab = 50257\nmax_seq_len = 1024\ndropout = 0.1\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 1\n[training]\nmicro_batch = 2\nseq_len = 1024\nprecision = \"bf16-mixed-adam\"\n\
             activation_checkpointing = \"{ck}\"\nattention = \"{attn}\"\nsteps = 1\n"
        )
    };
    let end_of_forward = |toml: String| {
        let s = Scenario::from_toml(Path::new("<t>"), &toml).unwrap();
        let sim = stepsim::simulate(&s).unwrap();
        let labels = &sim.schedule().labels;
        let tasks = &sim.schedule().program.tasks;
        let last_fwd = sim
            .trace()
            .timeline
            .samples()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .find(|x| labels[tasks[x.task].label as usize].phase == Phase::Forward)
            .unwrap();
        (last_fwd.by_category[Category::Activations.index()], sim)
    };
    let (s, b, h, a) = (1024u64, 2u64, 1024u64, 16u64);
    let (none, sim) = end_of_forward(base("none", "math"));
    let dag = &sim.dag;
    let per_layer = dag.saved_bytes(Region::Block(0), true);
    // Token ids and targets are saved too but filed under inputs, not activations.
    let ids: u64 = dag.inputs.iter().map(|&t| dag.tensors[t].bytes).sum();
    let outside: u64 = dag.saved_bytes(Region::Embed, true) + dag.saved_bytes(Region::Head, true) - ids;
    // Rounded to 512-byte blocks per tensor as the allocator does; allow that slack only.
    let expect = 4 * per_layer + outside;
    assert!(none >= expect && none - expect < 64 * 512, "{none} vs {expect}");
    let (sel, _) = end_of_forward(base("selective", "math"));
    // Selective recompute (Korthikanti Table 2, no parallelism) drops exactly 5 a s^2 b per layer.
    let diff = none - sel;
    assert!(diff.abs_diff(4 * 5 * a * s * s * b) < 64 * 512, "dropped {diff}");
    let (full, _) = end_of_forward(base("full", "math"));
    // Full checkpointing keeps each block's input only: 2 s b h per layer.
    assert!((full - outside).abs_diff(4 * 2 * s * b * h) < 64 * 512, "{full} - {outside}");
}

/// ZeRO Table 1 (K = 12, GB = 1e9 B): baseline, Pos, Pos+g, Pos+g+p for DP = 1 ... 1024.
#[test]
fn model_state_matches_zero_table_1() {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zero_table1.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&src).unwrap();
    let psi_paper = v["params"].as_f64().unwrap();
    println!("{:>5} {:>10} {:>10} {:>10}  (stepsim GB, scaled to 7.5B / paper GB)", "dp", "stage", "stepsim", "paper");
    for row in v["rows"].as_array().unwrap() {
        let dp = row["dp"].as_u64().unwrap();
        for (stage, sharding, col) in [
            ("baseline", "none", "baseline_gb"),
            ("Pos", "zero1", "pos_gb"),
            ("Pos+g", "zero2", "pos_g_gb"),
            ("Pos+g+p", "zero3", "pos_g_p_gb"),
        ] {
            // A 7.46B GPT (36 x 4096) under DeepSpeed semantics; figures scaled to 7.5B.
            let toml = format!(
                "[model]\nfamily = \"gpt\"\nn_layers = 36\nhidden = 4096\nn_heads = 32\nvocab = 50257\nmax_seq_len = 128\n\
                 [hardware]\ngpu = \"a100-80gb\"\ngpus = {dp}\ngpus_per_node = {gpn}\nmemory_capacity = 100000000000000\n\
                 [parallel]\nsharding = \"{sharding}\"\nframework = \"deepspeed\"\n\
                 [training]\nmicro_batch = 1\nseq_len = 128\nprecision = \"bf16-mixed-adam\"\nsteps = 2\n{fp16}",
                gpn = dp.min(8),
                // The paper's mixed precision is FP16; DeepSpeed without ZeRO runs it through
                // FP16_Optimizer (BF16 there would be BF16_Optimizer, itself partitioned).
                fp16 = if sharding == "none" {
                    "param_dtype = \"fp16\"\ncompute_dtype = \"fp16\"\ngrad_dtype = \"fp16\"\n"
                } else {
                    ""
                }
            );
            let s = Scenario::from_toml(Path::new("<zero>"), &toml).unwrap();
            let sim = stepsim::simulate(&s).unwrap();
            let psi = sim.dag.param_count() as f64;
            let scale = psi_paper / psi;
            let planned = sim.plan().model_state().total() as f64 * scale / 1e9;
            let paper = row[col].as_f64().unwrap();
            println!("{dp:>5} {stage:>10} {planned:>10.3} {paper:>10.3}");
            assert!((planned - paper).abs() / paper < 0.01, "dp {dp} {stage}: {planned:.3} GB vs paper {paper} GB");
            // What the simulated GPU actually holds at the end of the steady-state backward's
            // kernels, before DeepSpeed's reduction epilogue trades ZeRO-1's full gradients
            // for the rank's partition.
            let labels = &sim.schedule().labels;
            let tasks = &sim.schedule().program.tasks;
            let last = sim.trace().timeline.samples().collect::<Vec<_>>().into_iter().rev().find(|x| {
                let l = &labels[tasks[x.task].label as usize];
                l.step == 2 && l.phase == Phase::Backward && l.kind == TaskKind::Backward
            });
            let held: u64 =
                [Category::Parameters, Category::MasterWeights, Category::Gradients, Category::OptimizerState]
                    .iter()
                    .map(|c| last.unwrap().by_category[c.index()])
                    .sum();
            // DeepSpeed's ZeRO-3 keeps an FP32 gradient of its largest optimizer sub-group
            // beyond the paper's K = 12 (src/plan/framework.rs `DeepspeedOptimizer::ZeroStage3`):
            // compared apart, by its size.
            let prog = &sim.schedule().program;
            let named = |prefix: &str| -> u64 {
                let named = prog.buffers.iter().filter(|b| prog.names[b.name as usize].starts_with(prefix));
                named.map(|b| b.bytes.div_ceil(512) * 512).sum()
            };
            let fp32_sub_group = named("ZeRO-3 FP32 gradient of the largest");
            if sharding == "zero3" {
                let part = sim.plan().local_total(true);
                assert_eq!(fp32_sub_group.div_ceil(512), (part.min(1_000_000_000) * 4).div_ceil(512), "dp {dp}");
            }
            // So are ZeRO-3's persistent parameters (at most stage3_param_persistence_threshold
            // elements each: the norms here), whole on every rank (`ds_persist`).
            let persistent = named("ZeRO-3 persistent parameters");
            if sharding == "zero3" {
                assert!(persistent > 0 && persistent < sim.plan().total_params() / 1000, "dp {dp}: {persistent}");
            }
            let held = (held - fp32_sub_group - persistent) as f64 * scale / 1e9;
            assert!((held - paper).abs() / paper < 0.01, "dp {dp} {stage}: simulated {held:.3} GB vs paper {paper} GB");
        }
    }
}
