//! Offload (issue 8): DeepSpeed ZeRO-Offload and ZeRO-Infinity (parameters and optimizer on
//! CPU or NVMe), FSDP's CPUOffload(offload_params=True): what stays on the GPU, what goes to
//! the host and to NVMe, the PCIe and NVMe traffic per step against the bytes the partitions
//! hold, and the time it costs.

use std::path::Path;

use stepsim::report::Verdict;
use stepsim::scenario::Scenario;
use stepsim::schedule::TaskKind;

const SCENARIO: &str = "scenarios/100b-8gpu-zero3-offload.toml";

fn load_with(edit: impl Fn(String) -> String) -> Scenario {
    load_file_with(SCENARIO, edit)
}

fn load_file_with(path: &str, edit: impl Fn(String) -> String) -> Scenario {
    let text = edit(std::fs::read_to_string(path).unwrap());
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
    let shard = sim.plan().local_total(true);
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
    let shard = sim.plan().local_total(true) as f64;
    let (mut d2h, mut h2d, mut cpu) = (0.0, 0.0, 0.0);
    let prog = &sim.schedule().program;
    for t in &prog.tasks {
        let l = &sim.schedule().labels[t.label as usize];
        let stream = prog.streams[t.stream as usize].as_str();
        if l.step != 2 {
            continue;
        }
        let secs = t.duration_ns as f64 / 1e9;
        match (stream, l.kind) {
            ("d2h", TaskKind::Send) => d2h += secs * cfg.d2h_bytes_per_s,
            ("h2d", TaskKind::Recv) => h2d += secs * cfg.h2d_bytes_per_s,
            ("cpu", _) => cpu += secs,
            _ => {}
        }
    }
    println!("per step: D2H {:.1} GB, H2D {:.1} GB, CPU Adam {:.2} s", d2h / 1e9, h2d / 1e9, cpu);
    // Task durations are whole nanoseconds: 1e-6 relative.
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-6;
    assert!(close(d2h, 4.0 * 4.0 * shard) && close(d2h, off.d2h_bytes_per_step.bytes as f64), "{d2h}");
    assert!(close(h2d, 2.0 * shard) && close(h2d, off.h2d_bytes_per_step.bytes as f64), "{h2d}");
    assert!(close(cpu, shard / 1e9) && close(cpu, off.cpu_adam_s), "{cpu}");
    // H100 PCIe Gen5 pinned copies (copy engines): 53 GB/s to the host, 55.4 GB/s back.
    assert_eq!((cfg.d2h_bytes_per_s, cfg.h2d_bytes_per_s), (53e9, 55.4e9));
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

/// Bytes a step's tasks move, per stream, from their durations and the stated bandwidths
/// (task durations are whole nanoseconds: compare at 1e-6 relative).
#[derive(Debug, Default)]
struct Moved {
    h2d: f64,
    d2h: f64,
    nvme_read: f64,
    nvme_write: f64,
    cpu_s: f64,
    all_gathers: Vec<usize>,
}

fn moved(sim: &stepsim::Simulation, cfg: &stepsim::plan::OffloadConfig, step: u32) -> Moved {
    let mut m = Moved::default();
    let prog = &sim.schedule().program;
    for t in &prog.tasks {
        let l = &sim.schedule().labels[t.label as usize];
        if l.step != step {
            continue;
        }
        let secs = t.duration_ns as f64 / 1e9;
        match (prog.streams[t.stream as usize].as_str(), l.kind) {
            ("d2h", _) => m.d2h += secs * cfg.d2h_bytes_per_s,
            ("h2d", _) => m.h2d += secs * cfg.h2d_bytes_per_s,
            ("nvme", TaskKind::Recv) => m.nvme_read += secs * cfg.nvme_read_bytes_per_s,
            ("nvme", TaskKind::Send) => m.nvme_write += secs * cfg.nvme_write_bytes_per_s,
            ("cpu", _) => m.cpu_s += secs,
            (_, TaskKind::AllGather) => m.all_gathers.extend(l.unit),
            _ => {}
        }
    }
    m
}

fn close(a: f64, b: f64) -> bool {
    (a / b - 1.0).abs() < 1e-6
}

/// ZeRO-Infinity on one H100 (scenarios/100b-1gpu-zero-infinity.toml): parameters on the
/// host, optimizer on NVMe. Hand count, for P = 101,209,569,280 parameters on one rank:
/// - GPU: no parameter, gradient, master or optimizer bytes at rest.
/// - host: FP32 gradient partition 4 P + BF16 parameters 2 P + the optimizer's pinned swap
///   buffers 4 x 1e9 x 4 B = 16 GB: 623.26 GB.
/// - NVMe: FP32 master 4 P + two FP32 moments 8 P = 12 P = 1214.5 GB.
/// - per step: every micro-batch (4) gathers the root and all 80 blocks in forward and the
///   80 blocks again in backward (FULL_SHARD keeps the root gathered), each fetch a 2 B/param
///   H2D copy; the FP32 gradients go D2H every micro-batch (4 x 4 P); NVMe reads and writes
///   the 12 P of optimizer state once.
#[test]
fn zero_infinity_puts_parameters_on_the_host_and_the_optimizer_on_nvme() {
    let s = load_file_with("scenarios/100b-1gpu-zero-infinity.toml", |t| t);
    let sim = stepsim::simulate(&s).unwrap();
    let p = 101_209_569_280u64;
    assert_eq!(sim.plan().local_total(true), p);
    assert_eq!(sim.report.model_state_per_gpu.total.bytes, 0);
    let off = sim.report.offload.clone().unwrap();
    assert_eq!(off.host_bytes_per_gpu.bytes, 6 * p + 16_000_000_000);
    assert_eq!(off.nvme_bytes_per_gpu.bytes, 12 * p);
    assert!(off.host_fits && off.nvme_fits);
    assert!(matches!(sim.report.verdict, Verdict::Fits { .. }));

    let cfg = s.parallel.offload.clone().unwrap();
    let m = moved(&sim, &cfg, 2);
    let units = &sim.plan().units;
    let root = units[0].shard_params;
    let fetched_el = 4 * (2 * p - root);
    assert_eq!(m.all_gathers.len(), 4 * (81 + 80));
    assert!(close(m.h2d, 2.0 * fetched_el as f64), "{} vs {}", m.h2d, 2 * fetched_el);
    assert_eq!(off.h2d_bytes_per_step.bytes, 2 * fetched_el);
    assert!(close(m.d2h, 16.0 * p as f64) && off.d2h_bytes_per_step.bytes == 16 * p, "{}", m.d2h);
    assert!(close(m.nvme_read, 12.0 * p as f64) && close(m.nvme_write, 12.0 * p as f64), "{m:?}");
    assert_eq!((off.nvme_read_bytes_per_step.bytes, off.nvme_write_bytes_per_step.bytes), (12 * p, 12 * p));
    // One GPU per node: it has the node's whole NVMe bandwidth (DeepNVMe 10 / 5 GB/s).
    assert_eq!((cfg.nvme_read_bytes_per_s, cfg.nvme_write_bytes_per_s), (10e9, 5e9));
    // The optimizer step alone is read + CPU Adam + write, one after the other.
    let opt = 12.0 * p as f64 / 10e9 + p as f64 / 1e9 + 12.0 * p as f64 / 5e9;
    let with = off.step_time_with_s.unwrap();
    assert!(with > opt, "{with} vs {opt}");
    println!(
        "ZeRO-Infinity 100B on 1 x H100: step {with:.1} s (optimizer alone {opt:.1} s, no offload {:.1} s)",
        off.step_time_without_s.unwrap()
    );
}

/// FSDP's CPUOffload(offload_params=True) on 8 GPUs (scenarios/100b-8gpu-fsdp-cpu-offload.toml,
/// `fsdp-bf16-mixed`: FP32 parameters are the master). Hand count per rank, shard S:
/// - GPU: nothing at rest.
/// - host: FP32 shard 4 S + pinned FP32 gradient shard 4 S + two FP32 moments 8 S = 16 S.
/// - per step: each fetch copies the FP32 shard (4 B/param) before its all-gather, into a
///   temporary cast to the BF16 _mp_shard on the GPU; 4 micro-batches x (81 + 80) fetches.
/// - the CPU step runs PyTorch's AdamW at the stated 1e9 / 6 params/s.
#[test]
fn fsdp_cpu_offload_fetches_fp32_shards_and_steps_on_the_cpu() {
    let s = load_file_with("scenarios/100b-8gpu-fsdp-cpu-offload.toml", |t| t);
    let sim = stepsim::simulate(&s).unwrap();
    let shard = sim.plan().local_total(true);
    assert_eq!(sim.report.model_state_per_gpu.total.bytes, 0);
    let off = sim.report.offload.clone().unwrap();
    assert_eq!(off.host_bytes_per_gpu.bytes, 16 * shard);
    assert_eq!(off.nvme_bytes_per_gpu.bytes, 0);
    assert!(off.mode.starts_with("FSDP CPUOffload"), "{}", off.mode);
    let cfg = s.parallel.offload.clone().unwrap();
    let m = moved(&sim, &cfg, 2);
    let fetched_el: u64 = m.all_gathers.iter().map(|&u| sim.plan().units[u].shard_params).sum();
    assert_eq!(m.all_gathers.len(), 4 * (81 + 80));
    assert_eq!(fetched_el, 4 * (2 * shard - sim.plan().units[0].shard_params));
    assert!(close(m.h2d, 4.0 * fetched_el as f64) && off.h2d_bytes_per_step.bytes == 4 * fetched_el);
    assert!(close(m.cpu_s, shard as f64 / (1e9 / 6.0)), "{}", m.cpu_s);
    assert_eq!(m.nvme_read + m.nvme_write, 0.0);
    assert!(matches!(sim.report.verdict, Verdict::Fits { .. }));
    // Without offload the same FSDP run does not fit (100b-8gpu-fsdp's OOM).
    let no = load_file_with("scenarios/100b-8gpu-fsdp-cpu-offload.toml", |t| {
        t.replace("parameters = \"cpu\"", "parameters = \"none\"")
    });
    assert!(no.parallel.offload.is_none());
    assert!(matches!(stepsim::simulate(&no).unwrap().report.verdict, Verdict::Oom(_)));
}

/// The host rows of memory.csv: the node's pinned pieces and their total against capacity.
#[test]
fn host_memory_has_its_own_rows_in_memory_csv() {
    let s = load_with(|t| t);
    let sim = stepsim::simulate(&s).unwrap();
    let off = sim.report.offload.clone().unwrap();
    let rows = stepsim::report::write::host_csv(&off, sim.trace().end_time_ns);
    let total = format!(",host (node of 8 GPUs),allocated,{}", off.host_bytes_per_node.bytes);
    assert_eq!(rows.lines().filter(|l| l.ends_with(&total)).count(), 2, "{rows}");
    let sum: u64 =
        rows.lines().take(off.host_parts.len()).map(|l| l.rsplit(',').next().unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(sum, off.host_bytes_per_node.bytes);
}

/// A sweep row of a configuration whose host memory is too small does not fit, at init.
#[test]
fn a_sweep_counts_a_host_oom_as_not_fitting() {
    let s = load_with(|t| t.replace("cpu_memory = 2000000000000", "cpu_memory = 1000000000000"));
    let o = stepsim::sweep::summary::simulate_whole(&s).unwrap();
    let at = o.oom.expect("host OOM");
    assert_eq!((at.step, at.phase), (0, stepsim::schedule::Phase::Init));
    let ok = stepsim::sweep::summary::simulate_whole(&load_with(|t| t)).unwrap();
    assert!(ok.oom.is_none());
}

/// DeepSpeed's own estimator (tests/fixtures/deepspeed_estimator.json): a node's CPU memory
/// for ZeRO-3 model states is P x 18 (parameters and optimizer offloaded) or P x 16
/// (optimizer only) bytes, times its 1.5 buffer factor. stepsim's host bytes per node for the
/// same offload, per parameter, times that factor must reproduce the printed figures (GiB)
/// for the doc's models from their parameter counts; tolerance 0.2% (the counts are rounded
/// to 1M, the printed values to 0.01 GiB).
#[test]
fn host_bytes_per_parameter_match_deepspeeds_estimator() {
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("tests/fixtures/deepspeed_estimator.json").unwrap()).unwrap();
    let factor = fx["additional_buffer_factor"].as_f64().unwrap();
    println!("{:<7} {:>5} {:<12} {:>10} {:>10} {:>7}", "model", "gpus", "offload", "published", "stepsim", "error");
    for row in fx["rows"].as_array().unwrap() {
        let gpus = row["gpus_per_node"].as_u64().unwrap();
        let params_line = if row["offload"] == "param+optim" { "parameters = \"cpu\"\n" } else { "" };
        let s = load_with(|t| {
            t.replace("gpus = 8", &format!("gpus = {gpus}"))
                .replace("optimizer = \"cpu\"\n", &format!("optimizer = \"cpu\"\n{params_line}"))
        });
        let sim = stepsim::simulate(&s).unwrap();
        let off = sim.report.offload.clone().unwrap();
        let per_param = off.host_bytes_per_node.bytes as f64 / sim.plan().total_params() as f64;
        let p = row["params_m"].as_f64().unwrap() * 1e6;
        let predicted = p * per_param * factor / (1u64 << 30) as f64;
        let published = row["cpu_gib"].as_f64().unwrap();
        let err = predicted / published - 1.0;
        println!(
            "{:<7} {gpus:>5} {:<12} {published:>10.2} {predicted:>10.2} {:>+6.2}%",
            row["model"].as_str().unwrap(),
            row["offload"].as_str().unwrap(),
            100.0 * err
        );
        assert!(err.abs() < 0.002, "{row}: {predicted:.2} GiB vs {published}");
    }
}

/// FSDP2's CPUOffloadPolicy on the same job (`framework = "fsdp2"`): the same host state and
/// PCIe bytes as FSDP1's CPUOffload, with FSDP2's own buffers and streams:
/// - each fetched FP32 shard and its BF16 cast are freed by the all-gather copy-in that
///   reads them (`foreach_all_gather`), not by the all-gather;
/// - the sharded FP32 gradient goes to the host on the reduce-scatter stream
///   (`foreach_reduce`: `.to("cpu", non_blocking=True)`), so the next reduce-scatter waits for
///   it; each reduce-scatter input is kept to the next post-backward as without offload.
#[test]
fn fsdp2_cpu_offload_policy_copies_on_its_own_streams() {
    let s = load_file_with("scenarios/100b-8gpu-fsdp-cpu-offload.toml", |t| {
        t.replace("framework = \"fsdp\"", "framework = \"fsdp2\"")
    });
    let sim = stepsim::simulate(&s).unwrap();
    let shard = sim.plan().local_total(true);
    assert_eq!(sim.report.model_state_per_gpu.total.bytes, 0);
    let off = sim.report.offload.clone().unwrap();
    assert!(off.mode.starts_with("FSDP2 CPUOffloadPolicy"), "{}", off.mode);
    assert_eq!(off.host_bytes_per_gpu.bytes, 16 * shard);
    let cfg = s.parallel.offload.clone().unwrap();
    let m = moved(&sim, &cfg, 2);
    let fetched_el: u64 = m.all_gathers.iter().map(|&u| sim.plan().units[u].shard_params).sum();
    assert!(close(m.h2d, 4.0 * fetched_el as f64));
    assert_eq!(m.d2h, 0.0, "FSDP2's gradient copies run on the reduce-scatter stream");
    let prog = &sim.schedule().program;
    let labels = &sim.schedule().labels;
    let on = |what: &str| -> Vec<&str> {
        prog.tasks
            .iter()
            .filter(|t| labels[t.label as usize].step == 2 && labels[t.label as usize].what.contains(what))
            .map(|t| prog.streams[t.stream as usize].as_str())
            .collect()
    };
    let d2h = on("gradient partition to host");
    assert_eq!(d2h.len(), 4 * 81, "every unit every micro-batch");
    assert!(d2h.iter().all(|&x| x == "nccl"), "{:?}", &d2h[..3]);
    // The fetched shard's copies die at the copy-in, before the all-gather runs.
    let staged: Vec<usize> = (0..prog.buffers.len())
        .filter(|&b| prog.names[prog.buffers[b].name as usize].contains("the copied shard cast"))
        .collect();
    assert!(!staged.is_empty());
    let freer = |b: usize| (0..prog.tasks.len()).find(|&t| prog.free.of(t).contains(&(b as u32)));
    for &b in staged.iter().take(20) {
        let t = freer(b).expect("freed");
        assert!(labels[prog.tasks[t].label as usize].what.contains("all-gather copy-in"));
    }
    assert!(matches!(sim.report.verdict, Verdict::Fits { .. }));
}
