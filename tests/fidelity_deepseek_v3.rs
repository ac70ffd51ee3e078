//! Fidelity of the DualPipe, DeepEP and FP8 time model against DeepSeek-V3's pre-training:
//! 180K H800 GPU hours per trillion tokens on 2048 H800 (tests/fixtures/deepseek_v3_training.json,
//! DeepSeek-V3 Technical Report), about 1,543 tokens/s per GPU. Tolerance (issue 20): within
//! 15%. The configuration is the report's (PP 16 under DualPipe, EP 64 over 8 nodes, ZeRO-1,
//! no tensor parallelism, FP8 with 1 x 128 / 128 x 128 block scaling, recomputation of the
//! norms and MLA up-projections, MTP depth 1, 4K sequences, 15,360 of them a step); the layer
//! split is not published (the fixture says which is used). No constant is set for this row.
//!
//! The SwiGLU inputs are cached in FP8 as the report's Sec. 3.3.3 says, in Megatron-Core's
//! form (`--activation-func-fp8-input-store`).
//!
//! Memory has no published per-GPU figure to check against; the report says only that the
//! run used 80 GB H800s. stepsim's peaks for this layout exceed that (printed below;
//! docs/fidelity.md says what is not modelled), so the throughput scenario gives the
//! allocator 300 GB and the step runs to its end. A step's time does not depend on the
//! capacity unless a run stops. `peaks_against_the_h800` bounds how far above 80 GB they are.

use std::path::Path;

use serde_json::Value;
use stepsim::scenario::Scenario;

const SCENARIO: &str = r#"
[model]
name = "deepseek-v3"
max_seq_len = 4096
[model.mtp]
layers = 1
[hardware]
gpu = "h800"
gpus = 2048
memory_capacity = "300GB"
[parallel]
framework = "megatron"
pipeline = 16
expert = 64
sharding = "zero1"
stage_layers = [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1]
[moe]
dispatcher = "deepep"
# The report's complementary sequence-wise balance loss (alpha = 0.0001), beside its
# auxiliary-loss-free bias: Megatron-Core's seq_aux_loss.
aux_loss = "seq_aux_loss"
[megatron]
activation_func_fp8_input_store = true
[fp8]
recipe = "blockwise"
[training]
micro_batch = 1
seq_len = 4096
grad_accum = 120
precision = "bf16-mixed-adam-fp32-grads"
activation_checkpointing = "selective"
recompute_modules = ["layernorm", "mla_up_proj"]
attention = "flash"
optimizer_impl = "fused"
steps = 1
"#;

#[test]
fn deepseek_v3_pretraining_throughput_under_dualpipe() {
    let fx: Value =
        serde_json::from_str(&std::fs::read_to_string("tests/fixtures/deepseek_v3_training.json").unwrap()).unwrap();
    let published = fx["tokens_per_s_per_gpu"].as_f64().unwrap();
    assert!((1e12 / (fx["gpu_hours_per_trillion_tokens"].as_f64().unwrap() * 3600.0) - published).abs() < 0.1);
    let run = |schedule: &str| {
        let text = SCENARIO.replace("[parallel]\n", &format!("[parallel]\n{schedule}\n"));
        let s = Scenario::from_toml(Path::new("<deepseek-v3>"), &text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.dp_degree() * s.training.grad_accum, 15360);
        let sim = stepsim::simulate(&s).unwrap();
        assert!(
            matches!(sim.report.verdict, stepsim::report::Verdict::Fits { .. }),
            "{schedule}: the step runs to its end"
        );
        let t = sim.report.throughput.as_ref().unwrap();
        let peaks: Vec<f64> =
            sim.class_reports.iter().map(|r| r.peak.as_ref().map_or(0.0, |p| p.allocated.bytes as f64 / 1e9)).collect();
        (t.tokens_per_s / 2048.0, t.mfu, peaks)
    };
    println!("DeepSeek-V3 on 2048 H800, published {published:.0} tokens/s/GPU (180K GPU hours per trillion tokens)");
    println!("{:<28} {:>14} {:>8} {:>7}   peaks by stage, GB", "schedule", "tokens/s/GPU", "error", "MFU");
    let mut dual = 0.0;
    for (name, sched) in [("1F1B", "schedule = \"1f1b\""), ("DualPipe", "schedule = \"dualpipe\"")] {
        let (tps, mfu, peaks) = run(sched);
        let p: Vec<String> = peaks.iter().map(|x| format!("{x:.0}")).collect();
        println!(
            "{name:<28} {tps:>14.0} {:>+7.1}% {:>6.1}%   {}",
            (tps / published - 1.0) * 100.0,
            mfu * 100.0,
            p.join(" ")
        );
        if name == "DualPipe" {
            dual = tps;
        }
    }
    assert!((dual / published - 1.0).abs() < 0.15, "DualPipe {dual:.0} vs published {published:.0}");
}

/// What `explain` says about the same job under full recomputation on the H800's own 80 GB: a
/// middle rank runs out of memory in backward, and the largest things live are the activation
/// gradients and recomputed activations of several micro-batches, which DualPipe's
/// zero-bubble backwards keep for their W passes. The live list says so (the OOM's own live
/// set, as `explain` reads it, without the counterfactual runs).
#[test]
fn explain_names_what_the_w_passes_hold() {
    let text = SCENARIO
        .replace("memory_capacity = \"300GB\"\n", "")
        .replace("[fp8]\nrecipe = \"blockwise\"\n", "")
        .replace(
            "activation_checkpointing = \"selective\"\nrecompute_modules = [\"layernorm\", \"mla_up_proj\"]",
            "activation_checkpointing = \"full\"",
        )
        .replace("[parallel]\n", "[parallel]\nschedule = \"dualpipe\"\n");
    let s = Scenario::from_toml(Path::new("<deepseek-v3>"), &text).unwrap_or_else(|e| panic!("{e}"));
    let sim = stepsim::simulate(&s).unwrap();
    let stepsim::report::Verdict::Oom(o) = &sim.report.verdict else { panic!("fits") };
    assert_eq!(o.at.phase, stepsim::schedule::Phase::Backward);
    let live = sim.trace().oom.as_ref().unwrap().live.clone();
    let lines = stepsim::explain::live::from_buffers(&s, &sim, &live, o.at.layer, o.at.phase);
    for l in &lines[..2] {
        println!("{:>10.2} GB  {}", l.size.bytes as f64 / 1e9, l.reason);
        assert!(l.reason.contains("held until their W passes"), "{}", l.reason);
    }
}

/// The run trained on 80 GB H800s, so its peak was below 80 GB. Two of the report's memory
/// savings (Sec. 3.3.3) have no Megatron-Core form and are not modelled: the attention
/// output cached once in E5M6 for both the output projection's and the attention's backward
/// (stepsim keeps the attention's 16-bit copy and the projection's FP8 one), and activation
/// gradients before the MoE down projections in FP8 (stepsim holds them in 16 bits for the
/// deferred weight-gradient passes). The peak may exceed 80 GB by what those would save, and
/// this checks that it stays within 15% of 80 GB, and that caching the SwiGLU inputs in FP8
/// (which Megatron-Core can express) lowers every middle stage's peak.
#[test]
fn peaks_against_the_h800() {
    let peaks = |store: bool| {
        let text = SCENARIO
            .replace("[parallel]\n", "[parallel]\nschedule = \"dualpipe\"\n")
            .replace("activation_func_fp8_input_store = true", &format!("activation_func_fp8_input_store = {store}"));
        let s = Scenario::from_toml(Path::new("<deepseek-v3>"), &text).unwrap_or_else(|e| panic!("{e}"));
        let sim = stepsim::simulate(&s).unwrap();
        let p: Vec<f64> =
            sim.class_reports.iter().map(|r| r.peak.as_ref().map_or(0.0, |p| p.allocated.bytes as f64 / 1e9)).collect();
        p
    };
    let (with, without) = (peaks(true), peaks(false));
    let show = |p: &[f64]| p.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(" ");
    println!("DeepSeek-V3 under DualPipe, peak allocated by stage, GB (the run used 80 GB H800s)");
    println!("  SwiGLU inputs in BF16: {}", show(&without));
    println!("  SwiGLU inputs in FP8:  {}", show(&with));
    for (i, (a, b)) in with.iter().zip(&without).enumerate().skip(1).take(with.len() - 2) {
        assert!(a < b, "stage {i}: {a} GB with the FP8 store, {b} GB without");
    }
    let max = with.iter().cloned().fold(0.0, f64::max);
    assert!(max <= 80.0 * 1.15, "peak {max:.1} GB against the H800's 80 GB");
}
