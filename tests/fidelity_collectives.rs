//! Collective time by message size against nccl-tests.
//!
//! The model is NCCL's own tuner (`src/net`: ring LL, LL128 and Simple protocols at the
//! latencies and bandwidth shares of NCCL's `src/graph/tuning.cc`, LL's bus bandwidth capped
//! at the tuner's `llMaxBws` for Hopper, 141 GB/s) over NVLink at the efficiency measured on
//! large rings, and, inside an NVSwitch node, NVLink SHARP (NVLS) all-reduces at the rate
//! measured for each chunk size NCCL cuts the buffer into (`net::NVLS_BY_CHUNK`), the fastest
//! for the size.
//!
//! 1. Calibration: an all-reduce over the 8 H100s of one node, 8 B to 16 GiB
//!    (tests/fixtures/nccl_tests_h100_allreduce.csv, with its source). The NVLS rates were fitted
//!    on this table, so this checks the fit and the rings below 2 MiB: every size within 20%
//!    (the 32 B row excepted, a one-off twice its neighbours), from 2 MiB within 6%, the median
//!    within 5%.
//! 2. Validation, figures the model was not fitted on (stas00 ml-engineering
//!    `network/README.md`, as quoted in shared/reference/SEMANTICS.md section 5.3, copied into
//!    this file): 8 x H200 all-reduce bus bandwidth at 16 GiB with NVLS (482.26 GB/s) and with
//!    rings only (367.61), within 5%; 8 x B200 at 8 GiB with NVLS (838.0) and rings only
//!    (682.2), and its one-node message-size curve from 1 GiB, within 10% (the B200's NVLS
//!    rates are the H100's scaled by NVLink bandwidth and NCCL's NVLS efficiency, an
//!    assumption this checks); 128 MiB within 15%. Below it the B200 measurement is far slower
//!    than every protocol modelled (16 MiB: 255 GB/s against 346 from the LL128 ring; 1 MiB:
//!    36 against 85 from the LL ring, where 8 H100 measure 64): printed, not checked. The table
//!    of predicted against measured is printed.

use std::path::Path;

use stepsim::net::Collective;
use stepsim::scenario::Scenario;

fn measured() -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string("tests/fixtures/nccl_tests_h100_allreduce.csv").unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("bytes"))
        .map(|l| {
            let (b, t) = l.split_once(',').unwrap();
            (b.parse().unwrap(), t.parse().unwrap())
        })
        .collect()
}

/// One node of 8 `gpu`s; `nvls`: NCCL may use NVLS (`[nccl] nvls`).
fn node(gpu: &str, nvls: bool) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 2\nhidden = 1024\nn_heads = 16\nvocab = 50304\nmax_seq_len = 2048\n\
         [hardware]\ngpu = \"{gpu}\"\ngpus = 8\n[training]\nmicro_batch = 1\nseq_len = 2048\n[nccl]\nnvls = {nvls}\n"
    );
    Scenario::from_toml(Path::new("<node>"), &toml).unwrap_or_else(|e| panic!("{e}"))
}

/// nccl-tests' all-reduce bus bandwidth over the node's 8 GPUs, bytes/s.
fn busbw(s: &Scenario, bytes: u64) -> f64 {
    let g = stepsim::schedule::cost::group_on(&s.cluster, 8, 8);
    bytes as f64 * 2.0 * 7.0 / 8.0 / g.time_s(Collective::AllReduce, bytes)
}

#[test]
fn all_reduce_time_by_size_matches_nccl_tests_on_an_h100_node() {
    let s = node("h100-sxm", true);
    let g = stepsim::schedule::cost::group_on(&s.cluster, 8, 8);
    println!("all-reduce over 8 H100 (one node): stepsim vs nccl-tests");
    println!("{:>14} {:>12} {:>12} {:>8}", "bytes", "stepsim us", "measured us", "error");
    let mut errors = Vec::new();
    for (bytes, us) in measured() {
        let p = g.time_s(Collective::AllReduce, bytes) * 1e6;
        let e = p / us - 1.0;
        let note = if bytes == 32 { "  (one-off row, not checked)" } else { "" };
        println!("{bytes:>14} {p:>12.2} {us:>12.2} {:>+7.1}%{note}", e * 100.0);
        if bytes != 32 {
            errors.push((bytes, e));
        }
    }
    let mut abs: Vec<f64> = errors.iter().map(|e| e.1.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let median = abs[abs.len() / 2];
    let max = abs[abs.len() - 1];
    let large = errors.iter().filter(|e| e.0 >= 2 << 20).map(|e| e.1.abs()).fold(0.0, f64::max);
    println!("median |error| {:.1}%, max {:.1}%, from 2 MiB {:.1}%", median * 100.0, max * 100.0, large * 100.0);
    assert!(median < 0.05, "median |error| {:.1}%", median * 100.0);
    assert!(max < 0.20, "max |error| {:.1}%", max * 100.0);
    assert!(large < 0.06, "from 2 MiB: max |error| {:.1}%", large * 100.0);
}

/// A measured all-reduce: what, GPU, NVLS on, bytes, busbw GB/s, bound on |error| (None:
/// printed only).
type Row = (&'static str, &'static str, bool, u64, f64, Option<f64>);

#[test]
fn nvls_and_ring_bus_bandwidth_match_h200_and_b200_measurements() {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    let rows: [Row; 10] = [
        ("8 x H200, NVLS, 16 GiB", "h200", true, 16 * GIB, 482.26, Some(0.05)),
        ("8 x H200, rings only, 16 GiB", "h200", false, 16 * GIB, 367.61, Some(0.05)),
        ("8 x B200, NVLS, 8 GiB", "b200", true, 8 * GIB, 838.0, Some(0.10)),
        ("8 x B200, rings only, 8 GiB", "b200", false, 8 * GIB, 682.2, Some(0.10)),
        ("8 x B200, one node, 1 MiB", "b200", true, MIB, 36.06, None),
        ("8 x B200, one node, 16 MiB", "b200", true, 16 * MIB, 254.96, None),
        ("8 x B200, one node, 128 MiB", "b200", true, 128 * MIB, 568.38, Some(0.15)),
        ("8 x B200, one node, 1 GiB", "b200", true, GIB, 723.34, Some(0.10)),
        ("8 x B200, one node, 4 GiB", "b200", true, 4 * GIB, 740.64, Some(0.10)),
        ("8 x B200, one node, 16 GiB", "b200", true, 16 * GIB, 845.67, Some(0.10)),
    ];
    println!("{:32} {:>12} {:>12} {:>8}", "all-reduce", "stepsim GB/s", "measured", "error");
    let mut worst: f64 = 0.0;
    for (what, gpu, nvls, bytes, gbs, bound) in rows {
        let p = busbw(&node(gpu, nvls), bytes) / 1e9;
        let e = p / gbs - 1.0;
        let note = if bound.is_none() { "  (not checked)" } else { "" };
        println!("{what:32} {p:>12.1} {gbs:>12.1} {:>+7.1}%{note}", e * 100.0);
        if let Some(b) = bound {
            assert!(e.abs() < b, "{what}: {p:.1} GB/s against {gbs} ({:+.1}%)", e * 100.0);
            worst = worst.max(e.abs());
        }
    }
    println!("largest |error| of the rows checked {:.1}%", worst * 100.0);
}

/// The same measurement's curve across 4 nodes of 8 x B200 over 8 x 400 Gb/s EFA (stas00
/// ml-engineering `network/README.md`, as quoted in shared/reference/SEMANTICS.md 5.3):
/// all-reduce bus bandwidth by message size. Only the 16 GiB point went into the model (the
/// network efficiency, `net::NETWORK_EFFICIENCY`, is its per-GPU rate); 1 and 4 GiB are
/// validation, within 10%. The rings' latencies are NCCL's tuner's (`net::SIMPLE_NET_HOP_S`,
/// `net::ring_plateau`): with them 1 and 16 MiB come within 6%, where 5 and 10 us per step
/// (the assumption they replaced) gave +10% and +19%. 128 MiB stays 22% fast: the measurement
/// runs mid-sized messages below both its latency and its bandwidth, which nothing modelled
/// accounts for; those three are printed, not checked.
#[test]
fn all_reduce_across_four_b200_nodes_on_efa_by_message_size() {
    const MIB: u64 = 1 << 20;
    let toml =
        "[model]\nfamily = \"gpt\"\nn_layers = 2\nhidden = 1024\nn_heads = 16\nvocab = 50304\nmax_seq_len = 2048\n\
         [hardware]\ngpu = \"b200\"\ngpus = 32\nnode = \"aws-p5\"\nnics_per_node = 8\nnic_gbps = 400\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\n";
    let s = Scenario::from_toml(Path::new("<4 x 8 B200 on EFA>"), toml).unwrap_or_else(|e| panic!("{e}"));
    let g = stepsim::schedule::cost::group_on(&s.cluster, 32, 8);
    assert_eq!(g.nodes(), 4);
    let rows: [(u64, f64, Option<f64>); 6] = [
        (MIB, 5.37, None),
        (16 * MIB, 64.43, None),
        (128 * MIB, 197.94, None),
        (1024 * MIB, 361.99, Some(0.10)),
        (4096 * MIB, 377.34, Some(0.10)),
        (16384 * MIB, 381.80, Some(0.05)),
    ];
    println!("all-reduce, 4 nodes x 8 B200, EFA: bus bandwidth, GB/s");
    println!("{:>12} {:>10} {:>10} {:>8}", "bytes", "stepsim", "measured", "error");
    for (bytes, gbs, bound) in rows {
        let p = g.bus_bandwidth(Collective::AllReduce, bytes) / 1e9;
        let e = p / gbs - 1.0;
        let note = if bound.is_none() { "  (not checked)" } else { "" };
        println!("{bytes:>12} {p:>10.1} {gbs:>10.2} {:>+7.1}%{note}", e * 100.0);
        if let Some(b) = bound {
            assert!(e.abs() < b, "{bytes} B: {p:.1} GB/s against {gbs} ({:+.1}%)", e * 100.0);
        }
    }
}
