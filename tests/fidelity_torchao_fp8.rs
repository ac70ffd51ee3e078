//! Fidelity of torchao float8 training as torchtitan runs it, against torchtitan's own
//! measurements (tests/fixtures/torchtitan_float8.json): the asyncTP benchmark of June 2025
//! (copied from shared/reference/published.json `torchtitan_asynctp`; its vanilla-TP column)
//! and docs/performance.md Table 1.
//!
//! Compared: the speed-up of float8 over bf16 on the same GPUs (tokens/s per GPU, float8 /
//! bf16), within 10% per row. Not the absolute figures: every row ran on Grand Teton H100s
//! with 96 GB of HBM2e at a 500 W power limit, whose clocks and FP8/BF16 peaks are
//! unpublished; stepsim runs the H100 SXM (700 W, HBM3) with the capacity raised to 96 GB.
//! The ratio cancels the clock to first order (both runs' GEMMs on the same tensor cores at
//! the same clock); the memory-bound share does not scale alike, which the tolerance holds.
//! The absolute bf16 figures are printed: stepsim's SXM is 1.23x (70B) and 1.25x (8B)
//! faster, nearly the same on both, which is what a power-capped part would show.
//!
//! Run settings, from the fixture and torchtitan (torchtitan/models/llama3, its float8
//! converter): Llama 3.1 8B and 70B (vocabulary 128,256), sequence 8,192, FSDP2 with mixed
//! precision (fp32 parameters, bf16 compute, fp32 gradient reduce), tensor parallelism with
//! sequence parallelism, flash attention (SDPA), torch.compile; float8 converts every linear
//! but the LM head; "tensorwise" with float8 tensor parallelism (automatic) and the FSDP
//! float8 all-gather (`enable_fsdp_float8_all_gather`, which torchtitan's float8 docs
//! recommend with tensorwise); "rowwise" all-gathers in bf16 (torchao supports the float8
//! all-gather for tensorwise only). Table 1's "selective activation checkpointing" is
//! torchtitan's llama3_8b default, per-op (`selective_ac_option = "op"`).
//!
//! The async-TP column (torchtitan's `enable_async_tensor_parallel`: torch.compile's
//! micro-pipelined all-gather-matmul and matmul-reduce-scatter) is compared as its speed-up
//! over the vanilla column, within 15%, with `[parallel] async_tp`, which pipelines the same
//! collective-GEMM pairs as Megatron's `--tp-comm-overlap`. Every run is compiled
//! (`kernels = "compiled"`: fused element-wise chains, FlashAttention-2's measured rates).

use std::path::Path;

use serde_json::Value;
use stepsim::scenario::Scenario;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torchtitan_float8.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// One run: model, GPUs, tensor-parallel degree, local batch, checkpointing, float8 recipe.
fn run(model: &str, gpus: u64, tp: u64, batch: u64, ac: &str, recipe: Option<&str>) -> (f64, f64) {
    run_tp(model, gpus, tp, batch, ac, recipe, false)
}

/// The same, with torchtitan's async TP on or off.
fn run_tp(model: &str, gpus: u64, tp: u64, batch: u64, ac: &str, recipe: Option<&str>, async_tp: bool) -> (f64, f64) {
    let parallel = match (tp > 1, async_tp) {
        (true, true) => format!("tensor = {tp}\nsequence_parallel = true\nasync_tp = true\n"),
        (true, false) => format!("tensor = {tp}\nsequence_parallel = true\n"),
        _ => String::new(),
    };
    let fp8 = match recipe {
        Some("tensorwise") => "[fp8]\nrecipe = \"tensorwise\"\nfsdp_all_gather = true\n".to_string(),
        Some(r) => format!("[fp8]\nrecipe = \"{r}\"\n"),
        None => String::new(),
    };
    let toml = format!(
        "[model]\nname = \"{model}\"\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\nmemory_capacity = 96000000000\n\
         [parallel]\nframework = \"fsdp\"\nsharding = \"full_shard\"\n{parallel}\
         [training]\nmicro_batch = {batch}\nseq_len = 8192\ngrad_accum = 1\nprecision = \"fsdp-bf16-mixed\"\nattention = \"flash\"\nkernels = \"compiled\"\nactivation_checkpointing = \"{ac}\"\n{fp8}"
    );
    let s = Scenario::from_toml(Path::new("<torchtitan float8>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let r = stepsim::simulate(&s).unwrap().report;
    assert!(matches!(r.verdict, stepsim::report::Verdict::Fits { .. }), "{model} {recipe:?} does not fit in 96 GB");
    let t = r.throughput.unwrap();
    let peak = r.peak.unwrap().reserved.bytes as f64 / (1u64 << 30) as f64;
    (t.tokens_per_s_per_gpu, peak)
}

#[test]
fn float8_speedup_over_bf16_against_torchtitan() {
    let fx = fixture();
    let rows = fx["asynctp"]["metrics"]["rows"].as_array().unwrap();
    // (label, model, GPUs, TP, local batch, checkpointing) for the two blocks of rows.
    let setups = [
        ("70B, 256 GPUs, FSDP 32 x TP 8, full AC, batch 16", "llama-3.1-70b", 256, 8, 16, "full"),
        ("8B, 64 GPUs, FSDP 8 x TP 8, per-op SAC, batch 12", "llama-3.1-8b", 64, 8, 12, "selective-op"),
    ];
    println!("{:<52} {:<11} {:>9} {:>9} {:>8}", "run", "float8", "published", "stepsim", "error");
    let mut errors = Vec::new();
    for (k, (label, model, gpus, tp, batch, ac)) in setups.iter().enumerate() {
        let block = &rows[3 * k..3 * k + 3];
        assert_eq!(block[0][1], "bf16");
        let published_bf16 = block[0][2].as_f64().unwrap();
        let (bf16, _) = run(model, *gpus, *tp, *batch, ac, None);
        println!(
            "{label:<52} {:<11} {published_bf16:>9.1} {bf16:>9.1}   (absolute tokens/s/GPU; other GPUs, see the module doc)",
            "bf16"
        );
        for row in &block[1..] {
            let recipe = row[1].as_str().unwrap().trim_start_matches("float8 ");
            let published = row[2].as_f64().unwrap() / published_bf16;
            let (fp8, _) = run(model, *gpus, *tp, *batch, ac, Some(recipe));
            let ratio = fp8 / bf16;
            let err = ratio / published - 1.0;
            println!("{:<52} {recipe:<11} {published:>8.3}x {ratio:>8.3}x {:>+7.1}%", "", err * 100.0);
            errors.push((format!("{label} {recipe}"), err));
        }
    }
    // performance.md Table 1: float8 (compiled) over bf16 (compiled), FSDP only.
    let t1 = fx["performance_table1"]["rows"].as_array().unwrap();
    let published = t1[2][1].as_f64().unwrap() / t1[1][1].as_f64().unwrap();
    let (bf16, m_bf16) = run("llama-3.1-8b", 8, 1, 2, "selective-op", None);
    let (fp8, m_fp8) = run("llama-3.1-8b", 8, 1, 2, "selective-op", Some("tensorwise"));
    let ratio = fp8 / bf16;
    let err = ratio / published - 1.0;
    println!(
        "{:<52} {:<11} {published:>8.3}x {ratio:>8.3}x {:>+7.1}%",
        "8B, 8 GPUs, FSDP 8, per-op SAC, batch 2 (Table 1)",
        "tensorwise",
        err * 100.0
    );
    println!(
        "  Table 1 memory (max reserved): published {} / {} GiB (compile / + float8), stepsim {m_bf16:.1} / {m_fp8:.1} GiB",
        t1[1][2], t1[2][2]
    );
    errors.push(("Table 1 tensorwise".into(), err));
    for (label, e) in &errors {
        assert!(e.abs() <= 0.10, "{label}: float8 speed-up off by {:+.1}%", e * 100.0);
    }
}

/// performance.md Table 2: FSDP + context parallelism (PyTorch's context_parallel, torchtitan's
/// default all-gather rotation) with float8 and full checkpointing, 8 GPUs, 32K to 256K
/// tokens. Compared as each row's throughput over the CP 1 row's (same GPUs), within 35%,
/// and memory (max reserved, GiB) within 10%. The tolerance is wide because the gap is
/// open: stepsim keeps 0.62 / 0.35 / 0.19 of the CP 1 row's throughput where torchtitan
/// measured 0.65 / 0.28 / 0.14 (CP 4 and 8 come out 26% and 32% fast; the ring's
/// communication is small here). Timing attention by FlashAttention-2's measured rates
/// (faster than the old end-to-end fit on H100) widened it from 19% / 23%: the longer rows
/// are more attention, so they gained more. The rates are measured up to 16k tokens only and the longer blocks
/// here take the 16k rate; what PyTorch's context_parallel adds per ring step (SDPA per
/// block pair and the merge of partial outputs by their log-sum-exp) is not modelled.
#[test]
fn fsdp_context_parallel_rows_against_each_other() {
    let fx = fixture();
    let rows = fx["performance_table2"]["rows"].as_array().unwrap();
    let run = |cp: u64, seq: u64| {
        let context = if cp > 1 { format!("context = {cp}\n") } else { String::new() };
        let toml = format!(
            "[model]\nname = \"llama-3.1-8b\"\nmax_seq_len = {seq}\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\nmemory_capacity = 96000000000\n\
             [parallel]\nframework = \"fsdp\"\nsharding = \"full_shard\"\n{context}\
             [training]\nmicro_batch = 1\nseq_len = {seq}\ngrad_accum = 1\nprecision = \"fsdp-bf16-mixed\"\nkernels = \"compiled\"\nactivation_checkpointing = \"full\"\n\
             [fp8]\nrecipe = \"tensorwise\"\nfsdp_all_gather = true\n"
        );
        let s = Scenario::from_toml(Path::new("<torchtitan cp>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let r = stepsim::simulate(&s).unwrap().report;
        assert!(matches!(r.verdict, stepsim::report::Verdict::Fits { .. }), "CP {cp} does not fit");
        let gib = r.peak.unwrap().reserved.bytes as f64 / (1u64 << 30) as f64;
        (r.throughput.unwrap().tokens_per_s_per_gpu, gib)
    };
    let mut base = None;
    println!(
        "{:<14} {:>7} {:>10} {:>9} {:>8} {:>12} {:>12}",
        "run", "seq", "published", "stepsim", "error", "GiB pub", "GiB stepsim"
    );
    for row in rows {
        let (cp, seq, tps, gib) =
            (row[2].as_u64().unwrap(), row[3].as_u64().unwrap(), row[4].as_f64().unwrap(), row[5].as_f64().unwrap());
        let (ours, our_gib) = run(cp, seq);
        let (b_pub, b_ours) = *base.get_or_insert((tps, ours));
        let (p, o) = (tps / b_pub, ours / b_ours);
        let err = o / p - 1.0;
        println!(
            "{:<14} {seq:>7} {p:>9.3}x {o:>8.3}x {:>+7.1}% {gib:>12.1} {our_gib:>12.1}",
            row[0].as_str().unwrap(),
            err * 100.0
        );
        assert!(err.abs() <= 0.35, "{}: throughput relative to CP 1 off by {:+.1}%", row[0], err * 100.0);
        assert!((our_gib / gib - 1.0).abs() <= 0.10, "{}: memory {our_gib:.1} GiB vs {gib}", row[0]);
    }
}

/// The asyncTP benchmark's own comparison: async TP over vanilla TP on the same runs, each
/// within 15%. stepsim predicts 5-12% more speed-up than measured on the bf16 and rowwise
/// rows: the pairing assumes perfect max + min / tp pipelining; the decomposed GEMMs'
/// lower efficiency and the copies over symmetric memory are not modelled.
#[test]
fn async_tp_speedup_against_torchtitan() {
    let fx = fixture();
    let rows = fx["asynctp"]["metrics"]["rows"].as_array().unwrap();
    let setups = [
        ("70B, 256 GPUs, FSDP 32 x TP 8, full AC, batch 16", "llama-3.1-70b", 256, 16, "full"),
        ("8B, 64 GPUs, FSDP 8 x TP 8, per-op SAC, batch 12", "llama-3.1-8b", 64, 12, "selective-op"),
    ];
    println!("{:<52} {:<17} {:>9} {:>9} {:>8}", "run", "quantization", "published", "stepsim", "error");
    for (k, (label, model, gpus, batch, ac)) in setups.iter().enumerate() {
        for row in &rows[3 * k..3 * k + 3] {
            let q = row[1].as_str().unwrap();
            let recipe = (q != "bf16").then(|| q.trim_start_matches("float8 "));
            let published = row[4].as_f64().unwrap();
            let (vanilla, _) = run_tp(model, *gpus, 8, *batch, ac, recipe, false);
            let (fast, _) = run_tp(model, *gpus, 8, *batch, ac, recipe, true);
            let ratio = fast / vanilla;
            let err = ratio / published - 1.0;
            println!("{label:<52} {q:<17} {published:>8.2}x {ratio:>8.3}x {:>+7.1}%", err * 100.0);
            assert!(err.abs() <= 0.15, "{label} {q}: async TP speed-up off by {:+.1}%", err * 100.0);
        }
    }
}
