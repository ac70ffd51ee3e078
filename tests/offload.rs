//! Optimizer offload (DeepSpeed ZeRO-Offload, issue 8): what stays on the GPU, what goes to
//! the host, the PCIe traffic per step against the bytes the partitions hold, and the time
//! it costs.

use std::path::Path;

use stepsim::report::Verdict;
use stepsim::scenario::Scenario;
use stepsim::schedule::TaskKind;

const SCENARIO: &str = "scenarios/100b-8gpu-zero3-offload.toml";

fn load_with(edit: impl Fn(String) -> String) -> Scenario {
    let text = edit(std::fs::read_to_string(SCENARIO).unwrap());
    Scenario::from_toml(Path::new("offload.toml"), &text).unwrap_or_else(|e| panic!("{e}"))
}

/// ZeRO-3 over 8 GPUs: each rank's partition is a ceil(unit / 8) share of every FSDP-style
/// unit. On the GPU only the BF16 parameter partition stays (2 B/param); on the host the
/// FP32 master, two FP32 moments and the FP32 gradient partition (16 B/param), for all 8
/// ranks of the node: 1.62 TB of a DGX H100's 2 TB. Without offload the GPU would hold
/// 2 + 4 + 2 + 8 = 16 B/param of the partition: 14 B/param saved.
#[test]
fn offload_moves_master_moments_and_gradients_to_the_host() {
    let s = load_with(|t| t);
    let sim = stepsim::simulate(&s).unwrap();
    let shard = sim.plan.local_total(true);
    assert!((101_209_569_280 / 8..101_209_569_280 / 8 + 81 * 8).contains(&shard), "{shard}");
    let ms = &sim.report.model_state_per_gpu;
    assert_eq!(ms.parameters.bytes, 2 * shard);
    assert_eq!(ms.master_weights.bytes + ms.gradients.bytes + ms.optimizer_state.bytes, 0);
    let off = sim.report.offload.as_ref().unwrap();
    assert_eq!(off.host_bytes_per_gpu.bytes, 16 * shard);
    assert_eq!(off.host_bytes_per_node.bytes, 8 * 16 * shard);
    assert!(off.host_fits);
    assert_eq!(off.gpu_memory_saved.bytes, 14 * shard);
    assert!(matches!(sim.report.verdict, Verdict::Fits { .. }));
    // The same run without offload does not fit the GPU.
    let no = load_with(|t| t.replace("optimizer = \"cpu\"", "optimizer = \"none\""));
    assert!(matches!(stepsim::simulate(&no).unwrap().report.verdict, Verdict::Oom(_)));
}

/// The PCIe tasks of a steady step move exactly the partitions: every micro-batch's FP32
/// gradient partition to the host (4 B/param x 4 micro-batches) and the updated BF16
/// partition back (2 B/param), at the stated bandwidths; the CPU step takes the partition
/// over the stated DeepSpeedCPUAdam rate; and the step is slower than without offload.
#[test]
fn offload_traffic_per_step_matches_the_bytes_moved() {
    let s = load_with(|t| t);
    let sim = stepsim::simulate(&s).unwrap();
    let off = sim.report.offload.clone().unwrap();
    let cfg = s.parallel.offload.clone().unwrap();
    let shard = sim.plan.local_total(true) as f64;
    let (mut d2h, mut h2d, mut cpu) = (0.0, 0.0, 0.0);
    let prog = &sim.schedule.program;
    for t in &prog.tasks {
        let l = &sim.schedule.labels[t.label as usize];
        let stream = prog.streams[t.stream as usize].as_str();
        if l.step != 2 {
            continue;
        }
        let secs = t.duration_ns as f64 / 1e9;
        match (stream, l.kind) {
            ("pcie (offload)", TaskKind::Send) => d2h += secs * cfg.d2h_bytes_per_s,
            ("pcie (offload)", TaskKind::Recv) => h2d += secs * cfg.h2d_bytes_per_s,
            ("cpu (optimizer)", _) => cpu += secs,
            _ => {}
        }
    }
    println!("per step: D2H {:.1} GB, H2D {:.1} GB, CPU Adam {:.2} s", d2h / 1e9, h2d / 1e9, cpu);
    // Task durations are whole nanoseconds: 1e-6 relative.
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-6;
    assert!(close(d2h, 4.0 * 4.0 * shard) && close(d2h, off.d2h_bytes_per_step.bytes as f64), "{d2h}");
    assert!(close(h2d, 2.0 * shard) && close(h2d, off.h2d_bytes_per_step.bytes as f64), "{h2d}");
    assert!(close(cpu, shard / 1e9) && close(cpu, off.cpu_adam_s), "{cpu}");
    // H100 PCIe Gen5 pinned copies: 53 GB/s to the host, 35 GB/s back.
    assert_eq!((cfg.d2h_bytes_per_s, cfg.h2d_bytes_per_s), (53e9, 35e9));
    let (with, without) = (off.step_time_with_s.unwrap(), off.step_time_without_s.unwrap());
    // The CPU step and the copy back cannot overlap the step's compute.
    assert!(with > without + cpu, "{with} vs {without} + {cpu}");
}

/// A node with too little host memory for the offloaded partitions is reported, in the
/// JSON and loudly in the text.
#[test]
fn too_little_host_memory_is_a_host_oom() {
    let s = load_with(|t| t.replace("cpu_memory = 2000000000000", "cpu_memory = 1000000000000"));
    let sim = stepsim::simulate(&s).unwrap();
    assert!(!sim.report.offload.as_ref().unwrap().host_fits);
    let text = stepsim::report::text::render(&sim.report, &s);
    assert!(text.contains("HOST OOM"), "{text}");
}
