//! Fused attention kernels named by `training.attention` ("flash_attention_2",
//! "flash_attention_3", "cudnn") against the kernel benchmarks they are timed by
//! (tests/fixtures/flash3_h100_attention.csv, with its sources: the FlashAttention-3 paper's
//! H100 forward and backward figures and the FlashAttention-2 paper's H100 forward + backward
//! figure).
//!
//! - stepsim's tables (src/schedule/flash_rates.rs) equal the fixture's rows;
//! - the FlashAttention-3 paper's backward figure, read from a transcription, agrees with the
//!   FlashAttention-2 paper: FlashAttention-2's forward and backward rates there combine
//!   (3.5 / (1 / forward + 2.5 / backward)) into the FlashAttention-2 paper's own non-causal
//!   forward + backward rate within 6% at every length and head dim;
//! - the assumption that a causal backward keeps the forward's causal share: the
//!   FlashAttention-2 paper's causal over non-causal forward + backward rate equals the
//!   FlashAttention-3 paper's causal over non-causal forward rate of FlashAttention-2 within
//!   7% everywhere, 3% at the median;
//! - a scenario's attention core runs at those rates, and the kernels that have no
//!   measurement on a GPU are refused by name.

use std::collections::HashMap;
use std::path::Path;

use stepsim::hardware::Arch;
use stepsim::model::{FlashKernel, OpKind};
use stepsim::scenario::Scenario;
use stepsim::schedule::flash_rates::{self, HEAD_DIMS, SEQ_LENS};

/// (source, kernel, pass, causal, head_dim, seq) -> TFLOP/s.
type Rows = HashMap<(String, String, String, bool, u64, u64), f64>;

fn fixture() -> Rows {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/flash3_h100_attention.csv"))
            .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("source,"))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let key =
                (f[0].into(), f[1].into(), f[2].into(), f[3] == "1", f[4].parse().unwrap(), f[5].parse().unwrap());
            (key, f[6].parse().unwrap())
        })
        .collect()
}

fn get(rows: &Rows, source: &str, kernel: &str, pass: &str, causal: bool, d: u64, s: u64) -> f64 {
    rows[&(source.to_string(), kernel.to_string(), pass.to_string(), causal, d, s)]
}

const KERNELS: [FlashKernel; 3] = [FlashKernel::FlashAttention2, FlashKernel::FlashAttention3, FlashKernel::Cudnn];

#[test]
fn tables_are_the_fixture() {
    let rows = fixture();
    for k in KERNELS {
        let p = flash_rates::paper(k);
        for (i, &s) in SEQ_LENS.iter().enumerate() {
            for (j, &d) in HEAD_DIMS.iter().enumerate() {
                assert_eq!(p.fwd_causal[j][i], get(&rows, "fa3_paper", k.name(), "fwd", true, d as u64, s));
                if j < 2 {
                    assert_eq!(p.fwd[j][i], get(&rows, "fa3_paper", k.name(), "fwd", false, d as u64, s));
                    assert_eq!(p.bwd[j][i], get(&rows, "fa3_paper", k.name(), "bwd", false, d as u64, s));
                }
            }
        }
    }
    // FlashAttention-2, as stepsim times it: the FlashAttention-2 paper's causal figure.
    for &s in &SEQ_LENS {
        for d in [64, 128] {
            let ours = flash_rates::flash2_fraction(Arch::Hopper, s, d) * 989.0;
            assert!((ours - get(&rows, "fa2_paper", "flash_attention_2", "fwd_bwd", true, d, s)).abs() < 1e-9);
        }
    }
}

#[test]
fn the_backward_figure_agrees_with_the_flashattention2_paper() {
    let rows = fixture();
    println!("FlashAttention-2 on H100, forward + backward TFLOP/s");
    println!(
        "{:>4} {:>6} {:>22} {:>10} {:>7} {:>20} {:>14} {:>7}",
        "hd", "seq", "non-causal, combined", "FA2 paper", "error", "causal share, fwd", "FA2 paper", "error"
    );
    let mut shares = Vec::new();
    for d in [64, 128] {
        for &s in &SEQ_LENS {
            let f = get(&rows, "fa3_paper", "flash_attention_2", "fwd", false, d, s);
            let b = get(&rows, "fa3_paper", "flash_attention_2", "bwd", false, d, s);
            let combined = 3.5 / (1.0 / f + 2.5 / b);
            let paper = get(&rows, "fa2_paper", "flash_attention_2", "fwd_bwd", false, d, s);
            let e = combined / paper - 1.0;
            let fwd_share = get(&rows, "fa3_paper", "flash_attention_2", "fwd", true, d, s) / f;
            let paper_share = get(&rows, "fa2_paper", "flash_attention_2", "fwd_bwd", true, d, s) / paper;
            let es = fwd_share / paper_share - 1.0;
            println!(
                "{d:>4} {s:>6} {combined:>22.0} {paper:>10.0} {:>+6.1}% {fwd_share:>20.3} {paper_share:>14.3} {:>+6.1}%",
                e * 100.0,
                es * 100.0
            );
            assert!(e.abs() < 0.06, "head dim {d}, {s} tokens: combined {combined:.0} vs {paper}");
            assert!(es.abs() < 0.07, "head dim {d}, {s} tokens: causal share {fwd_share:.3} vs {paper_share:.3}");
            shares.push(es.abs());
        }
    }
    shares.sort_by(f64::total_cmp);
    let median = (shares[5] + shares[6]) / 2.0;
    println!("causal share: median |error| {:.1}%", median * 100.0);
    assert!(median < 0.03);
}

#[test]
fn rates_between_and_beyond_the_measured_points() {
    let rows = fixture();
    for k in [FlashKernel::FlashAttention3, FlashKernel::Cudnn] {
        let p = flash_rates::paper(k);
        // Measured points come back: the forward directly, the backward scaled by the
        // forward's causal share.
        let fwd = get(&rows, "fa3_paper", k.name(), "fwd", true, 128, 4096);
        assert!((p.forward(4096, 128) - fwd).abs() < 1e-9);
        let share = fwd / get(&rows, "fa3_paper", k.name(), "fwd", false, 128, 4096);
        let bwd = get(&rows, "fa3_paper", k.name(), "bwd", false, 128, 4096) * share;
        assert!((p.backward(4096, 128) - bwd).abs() < 1e-9);
        // Head dim 192 (DeepSeek's multi-head latent attention) lies halfway between 128 and
        // 256 forward; the backward, measured to 128, takes 128's.
        let mid = (fwd + get(&rows, "fa3_paper", k.name(), "fwd", true, 256, 4096)) / 2.0;
        assert!((p.forward(4096, 192) - mid).abs() < 1e-9);
        assert_eq!(p.backward(4096, 192), p.backward(4096, 128));
        // Below and above the measured lengths: the nearest.
        assert_eq!(p.forward(128, 64), p.forward(512, 64));
        assert_eq!(p.backward(1 << 20, 128), p.backward(16384, 128));
        // As a share of the H100's dense BF16 peak.
        let f = flash_rates::fraction(k, Arch::Hopper, 4096, 128, false);
        assert!((f * 989.0 - fwd).abs() < 1e-9);
    }
}

fn h100_llama(attention: &str, gpu: &str, framework: &str) -> Result<Scenario, String> {
    let toml = format!(
        "[model]\nname = \"llama-3.1-8b\"\n[hardware]\ngpu = \"{gpu}\"\ngpus = 8\n\
         [parallel]\nframework = \"{framework}\"\n{}\
         [training]\nmicro_batch = 1\nseq_len = 8192\nprecision = \"{}\"\nattention = \"{attention}\"\n",
        if framework == "megatron" { "tensor = 8\nsequence_parallel = true\n" } else { "sharding = \"full_shard\"\n" },
        if framework == "megatron" { "bf16-mixed-adam" } else { "fsdp-bf16-mixed" }
    );
    Scenario::from_toml(Path::new("attention.toml"), &toml).map_err(|e| e.to_string())
}

/// The attention core's forward and backward seconds in a scenario's DAG, and its FLOPs.
fn core_times(s: &Scenario) -> (f64, f64, f64, f64) {
    let dag = stepsim::model::build(&s.model, &s.workload);
    let gpus = u64::from(s.cluster.gpus);
    let plan = stepsim::plan::Plan::new(
        &dag,
        s.parallel.clone(),
        s.training.clone(),
        gpus,
        u64::from(s.cluster.gpus_per_node),
    );
    let cost = stepsim::schedule::cost::Cost::for_plan(&s.cluster, &plan);
    let op = dag.ops.iter().find(|o| o.kind == OpKind::AttentionCore).expect("an attention core");
    (cost.forward_s(op), cost.backward_split(op).0, op.fwd_flops, op.bwd_flops)
}

#[test]
fn a_named_kernel_times_the_attention_core_at_its_rates() {
    let rows = fixture();
    let overhead = stepsim::schedule::cost::OP_OVERHEAD_S;
    println!("Llama 3.1 8B on 8 H100 (FSDP), 8192 tokens, head dim 128: one block's attention core");
    println!("{:<20} {:>12} {:>12}", "training.attention", "forward ms", "backward ms");
    let mut fwd_ms = Vec::new();
    for (name, kernel) in [("flash", None), ("flash_attention_3", Some("flash_attention_3")), ("cudnn", Some("cudnn"))]
    {
        let s = h100_llama(name, "h100-sxm", "fsdp2").unwrap();
        let (f, b, ff, bf) = core_times(&s);
        println!("{name:<20} {:>12.3} {:>12.3}", f * 1e3, b * 1e3);
        if let Some(k) = kernel {
            // Half of the whole square's FLOPs at the measured rate (compute-bound at 8k).
            let fwd = get(&rows, "fa3_paper", k, "fwd", true, 128, 8192);
            let share = fwd / get(&rows, "fa3_paper", k, "fwd", false, 128, 8192);
            let bwd = get(&rows, "fa3_paper", k, "bwd", false, 128, 8192) * share;
            assert!(((f - overhead) / (ff / 2.0 / (fwd * 1e12)) - 1.0).abs() < 1e-6, "{name} forward");
            assert!((b / (bf / 2.0 / (bwd * 1e12)) - 1.0).abs() < 0.01, "{name} backward");
        }
        fwd_ms.push(f);
    }
    // FlashAttention-2 (PyTorch's default) is the slowest of the three on Hopper.
    assert!(fwd_ms[0] > fwd_ms[2] && fwd_ms[2] > fwd_ms[1], "{fwd_ms:?}");
    // Megatron's default keeps its fit; naming a kernel times it by the kernel's rates.
    let fit = core_times(&h100_llama("flash", "h100-sxm", "megatron").unwrap());
    let cudnn = core_times(&h100_llama("cudnn", "h100-sxm", "megatron").unwrap());
    assert!(cudnn.0 < fit.0, "cuDNN's measured rate is above the fit's");
}

#[test]
fn kernels_without_a_measurement_are_refused() {
    let e = h100_llama("flash_attention_3", "a100-80gb", "fsdp2").unwrap_err();
    assert!(e.contains("attention.toml") && e.contains("training.attention") && e.contains("Hopper"), "{e}");
    let e = h100_llama("flash_attention_3", "b200", "fsdp2").unwrap_err();
    assert!(e.contains("Hopper GPUs only"), "{e}");
    let e = h100_llama("cudnn", "a100-80gb", "fsdp2").unwrap_err();
    assert!(e.contains("cuDNN") && e.contains("ampere"), "{e}");
    // cuDNN on Blackwell takes Hopper's shares of the peak; FlashAttention-2 runs anywhere.
    h100_llama("cudnn", "b200", "fsdp2").unwrap();
    h100_llama("flash_attention_2", "a100-80gb", "megatron").unwrap();
    let e = h100_llama("flash_attention_4", "h100-sxm", "fsdp2").unwrap_err();
    assert!(e.contains("\"flash_attention_3\"") && e.contains("\"cudnn\""), "{e}");
}

/// (gpu, causal, head dim, seq) -> TFLOP/s of standard attention, forward + backward.
fn standard_attention() -> HashMap<(String, bool, u64, u64), f64> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/standard_attention_h100_a100.csv"
    ))
    .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("gpu,"))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            ((f[0].into(), f[1] == "1", f[2].parse().unwrap(), f[3].parse().unwrap()), f[4].parse().unwrap())
        })
        .collect()
}

/// The FlashAttention benchmark's set-up as a scenario (hidden 2048, 16k tokens, no
/// dropout, math attention) and its attention core's cost.
fn benchmark_core(gpu: &str, head_dim: u64, seq: u64) -> (stepsim::schedule::cost::Cost, stepsim::model::Op) {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 1\nhidden = 2048\nn_heads = {}\nvocab = 32000\nmax_seq_len = {seq}\n\
         [hardware]\ngpu = \"{gpu}\"\ngpus = 1\n\
         [training]\nmicro_batch = {}\nseq_len = {seq}\nprecision = \"bf16-mixed-adam\"\nattention = \"math\"\n",
        2048 / head_dim,
        16384 / seq
    );
    let s = Scenario::from_toml(Path::new("benchmark.toml"), &toml).unwrap_or_else(|e| panic!("{e}"));
    let dag = stepsim::model::build(&s.model, &s.workload);
    let plan = stepsim::plan::Plan::new(&dag, s.parallel.clone(), s.training.clone(), 1, 1);
    let cost = stepsim::schedule::cost::Cost::for_plan(&s.cluster, &plan);
    let mut op = dag.ops.iter().find(|o| o.kind == OpKind::AttentionCore).unwrap().clone();
    // The benchmark's chain is math attention's (a GEMM with the scale, a softmax, a GEMM)
    // run by PyTorch's own kernels: timed per GEMM at their measured share, as eager
    // attention is.
    let heads = 2048 / head_dim;
    op.scores = Some(stepsim::model::ScoresShape {
        batch: 16384 / seq * heads,
        queries: seq,
        keys: seq,
        qk: head_dim,
        v: head_dim,
        bytes: 2,
    });
    (cost, op)
}

/// What the benchmark's `attention_pytorch` moves besides attention itself, which Megatron's
/// CoreAttention (strided batched GEMMs over its [s, b, heads, d] layout) and stepsim's
/// attention core do not: the rearranges of q and k out of the packed qkv into (b h) t d
/// and (b h) d s (a copy each), the einsum's of v into (b h) s d and of the output gradient
/// back (a copy each), the stack of the q, k and v gradients into the packed gradient (three
/// copies), and baddbmm's backward scaling its q and k gradients by alpha (two more passes):
/// 9 passes reading and writing the 16k x 2048 x 2 bytes of one of q, k, v, each a kernel.
fn benchmark_copies_s(cost: &stepsim::schedule::cost::Cost) -> f64 {
    let pass = 2.0 * (16384 * 2048 * 2) as f64;
    9.0 * (pass / (cost.hbm * stepsim::schedule::cost::HBM_EFFICIENCY) + stepsim::schedule::cost::OP_OVERHEAD_S)
}

/// stepsim's standard attention (forward + backward) against the FlashAttention-2 paper's
/// "Pytorch" bars, without the causal mask: relative errors of the ten points of `gpu` with
/// the scores passes at `eff` of HBM bandwidth.
fn standard_errors(gpu: &str, key: &str, eff: f64, measured: &HashMap<(String, bool, u64, u64), f64>) -> Vec<f64> {
    let mut errors = Vec::new();
    for d in [64u64, 128] {
        for s in [512u64, 1024, 2048, 4096, 8192] {
            let (mut cost, op) = benchmark_core(gpu, d, s);
            // Isolated kernels: no share of a training step.
            (cost.scores_eff, cost.scores_gemm_eff) = (eff, 1.0);
            let t = cost.forward_s(&op) + cost.backward_split(&op).0 + benchmark_copies_s(&cost);
            let flops = 3.5 * 4.0 * ((16384 / s) * s * s * 2048) as f64;
            errors.push(flops / t / 1e12 / measured[&(key.to_string(), false, d, s)] - 1.0);
        }
    }
    errors
}

#[test]
fn standard_attention_against_the_flashattention2_paper() {
    let measured = standard_attention();
    for (gpu, key, share) in [
        ("a100-80gb", "a100", stepsim::schedule::scores_rates::AMPERE),
        ("h100-sxm", "h100", stepsim::schedule::scores_rates::HOPPER),
    ] {
        let mae = |e: &[f64]| e.iter().map(|x| x.abs()).sum::<f64>() / e.len() as f64;
        // The share is the one that minimises the mean |error| on a 0.01 grid.
        let best = (30..=90)
            .map(|p| (p, mae(&standard_errors(gpu, key, f64::from(p) / 100.0, &measured))))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert_eq!(f64::from(best.0) / 100.0, share, "{gpu}: the fit is {}", best.0);
        let errors = standard_errors(gpu, key, share, &measured);
        let at_generic = standard_errors(gpu, key, stepsim::schedule::cost::HBM_EFFICIENCY, &measured);
        println!("standard attention on {gpu}, forward + backward, scores passes at {share} of HBM");
        println!("{:>4} {:>6} {:>10} {:>10} {:>10}", "hd", "seq", "measured", "error", "at 0.80");
        for (i, (e, g)) in errors.iter().zip(&at_generic).enumerate() {
            let (d, s) = ([64, 128][i / 5], [512, 1024, 2048, 4096, 8192][i % 5]);
            println!(
                "{d:>4} {s:>6} {:>10.0} {:>+9.1}% {:>+9.1}%",
                measured[&(key.to_string(), false, d, s)],
                e * 100.0,
                g * 100.0
            );
        }
        println!("mean |error| {:.1}% (at 0.80 of HBM: {:.1}%)", mae(&errors) * 100.0, mae(&at_generic) * 100.0);
        assert!(mae(&errors) < 0.07, "{gpu}");
        assert!(errors.iter().all(|e| e.abs() < 0.20), "{gpu}: {errors:?}");
    }
}
