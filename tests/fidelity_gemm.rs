//! GEMM kernel time by shape against a kernel-level measurement: OpenXLA's H100 BF16 matmul
//! table (tests/fixtures/xla_gemm_h100.csv, its header gives the source and how it was
//! measured: median CUPTI kernel time per shape, b x [m, k] x [k, n] with b, m, n, k over
//! 1-4 and 256-4096). stepsim's model (`Cost::gemm_kernel_s`, src/schedule/cost.rs) was
//! fitted on this table: tiles in waves over the SMs, a per-tile K overhead, a fixed kernel
//! time and split-K for grids short of SMs. The comparison is at the kernel's own rate (the
//! H100's measured ceiling times `GEMM_STEADY_OVER_CEILING`), without the end-to-end
//! `MATMUL_EFFICIENCY` a training step applies on top.
//!
//! Tolerances: shapes of at least one full wave of output tiles (the training regime) within
//! 15% each, median within 5%; grids smaller than the SMs (split-K, chosen by cuBLAS's
//! heuristics, which the model only approximates) median within 10%, each within 55%.

use stepsim::hardware::Cluster;
use stepsim::model::Dtype;
use stepsim::schedule::cost::{gemm_steady_share, Cost, GEMM_TILE};

struct Row {
    b: u64,
    m: u64,
    n: u64,
    k: u64,
    flops_per_s: f64,
}

fn table() -> Vec<Row> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/xla_gemm_h100.csv");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("b,"))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let u = |i: usize| f[i].parse::<u64>().unwrap();
            Row { b: u(0), m: u(1), n: u(2), k: u(3), flops_per_s: f[4].parse().unwrap() }
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[test]
fn gemm_kernel_time_by_shape_matches_xla_h100_table() {
    let rows = table();
    assert_eq!(rows.len(), 375, "the table's 3 x 5 x 5 x 5 grid");
    let cost = Cost::new(&Cluster::of("h100-sxm", 8).unwrap(), Dtype::Bf16, 8);
    let rate = cost.peak_flops * gemm_steady_share(cost.matmul_ceiling);
    let mut full = Vec::new();
    let mut partial = Vec::new();
    // Per K and regime: (errors, measured TFLOP/s, predicted TFLOP/s) for the printed table.
    let ks = [256u64, 512, 1024, 2048, 4096];
    let mut by_k: Vec<[Vec<(f64, f64, f64)>; 2]> = ks.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for r in &rows {
        let flops = 2.0 * (r.b * r.m * r.n * r.k) as f64;
        let measured = flops / r.flops_per_s;
        let predicted = cost.gemm_kernel_s(rate, r.m, r.n, r.k, r.b);
        let err = predicted / measured - 1.0;
        let tiles = r.m.div_ceil(GEMM_TILE.0) * r.n.div_ceil(GEMM_TILE.1) * r.b;
        let regime = usize::from(tiles < cost.sms);
        let ki = ks.iter().position(|&k| k == r.k).unwrap();
        by_k[ki][regime].push((err, r.flops_per_s / 1e12, flops / predicted / 1e12));
        if regime == 0 {
            full.push(err);
        } else {
            partial.push(err);
        }
    }
    println!("H100 BF16 GEMM kernel time, stepsim vs OpenXLA's measured table (time error; + is slower)");
    println!("   K  grid          shapes  measured TFLOP/s  stepsim TFLOP/s  median |err|  max |err|");
    for (ki, k) in ks.iter().enumerate() {
        for (regime, name) in ["full waves", "under 1 wave"].iter().enumerate() {
            let v = &by_k[ki][regime];
            let mean = |f: fn(&(f64, f64, f64)) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
            println!(
                "{k:>5}  {name:<12}  {:>6}  {:>16.0}  {:>15.0}  {:>11.1}%  {:>8.1}%",
                v.len(),
                mean(|x| x.1),
                mean(|x| x.2),
                100.0 * median(v.iter().map(|x| x.0.abs()).collect()),
                100.0 * v.iter().map(|x| x.0.abs()).fold(0.0, f64::max),
            );
        }
    }
    let summary =
        |v: &[f64]| (median(v.iter().map(|e| e.abs()).collect()), v.iter().map(|e| e.abs()).fold(0.0, f64::max));
    let (full_med, full_max) = summary(&full);
    let (part_med, part_max) = summary(&partial);
    println!(
        "full waves: {} shapes, median |error| {:.1}%, max {:.1}%; under one wave: {} shapes, median {:.1}%, max {:.1}%",
        full.len(),
        full_med * 100.0,
        full_max * 100.0,
        partial.len(),
        part_med * 100.0,
        part_max * 100.0
    );
    assert!(full_med < 0.05 && full_max < 0.15, "full waves: median {full_med}, max {full_max}");
    assert!(part_med < 0.10 && part_max < 0.55, "under one wave: median {part_med}, max {part_max}");
}

/// The mechanisms one by one, on shapes of the table: the K loop's per-tile overhead makes a
/// short K slow (4096 x 4096 at K 256 runs at half its K 4096 rate, measured 392 vs 783
/// TFLOP/s), and a grid of fewer tiles than SMs splits K rather than leave SMs idle (a
/// 1024 x 1024 output over K 4096 is 64 tiles on 132 SMs, measured at 470 TFLOP/s, where one
/// tile per SM over the whole K would leave half the GPU idle).
#[test]
fn short_k_loops_and_small_grids_cost_what_the_kernel_data_shows() {
    let cost = Cost::new(&Cluster::of("h100-sxm", 8).unwrap(), Dtype::Bf16, 8);
    let rate = cost.peak_flops * gemm_steady_share(cost.matmul_ceiling);
    let tflops = |m: u64, n: u64, k: u64| 2.0 * (m * n * k) as f64 / cost.gemm_kernel_s(rate, m, n, k, 1) / 1e12;
    let (short, long) = (tflops(4096, 4096, 256), tflops(4096, 4096, 4096));
    assert!((short / 392.0 - 1.0).abs() < 0.1, "{short}");
    assert!((long / 783.0 - 1.0).abs() < 0.05, "{long}");
    let small = tflops(1024, 1024, 4096);
    assert!((small / 470.1 - 1.0).abs() < 0.1, "{small}");
    // Without the split: one wave of 64 tiles over the whole K loop.
    let unsplit = 2.0 * (1024u64 * 1024 * 4096) as f64
        / (stepsim::schedule::cost::GEMM_KERNEL_FIXED_S
            + (4096 + stepsim::schedule::cost::GEMM_TILE_K_OVERHEAD) as f64 * 2.0 * (128 * 128 * cost.sms) as f64
                / rate)
        / 1e12;
    assert!(small > 1.5 * unsplit, "{small} vs {unsplit}");
}

/// The report says where the GEMM kernel's steady rate comes from: measured on the H100,
/// carried to other GPUs as an assumption.
#[test]
fn the_report_says_which_gpu_the_kernel_table_measured() {
    let line = |file: &str| {
        let s = stepsim::scenario::Scenario::load(std::path::Path::new(&format!(
            "{}/scenarios/{file}",
            env!("CARGO_MANIFEST_DIR")
        )))
        .unwrap();
        let sim = stepsim::simulate(&s).unwrap();
        let t = sim.report.throughput.unwrap();
        t.assumptions.into_iter().find(|a| a.starts_with("matmuls at")).unwrap()
    };
    let h100 = line("llama3-8b-fsdp2-h100.toml");
    assert!(
        h100.contains("87.5% of peak (80.3% best achievable matmul x 1.090, OpenXLA's measured H100 table"),
        "{h100}"
    );
    let a100 = line("gpt-1.3b-1gpu.toml");
    assert!(a100.contains("94.7% of peak (86.9% best achievable matmul x 1.090, the ratio"), "{a100}");
    assert!(a100.contains("carried to this GPU: an assumption, no table for it"), "{a100}");
}
