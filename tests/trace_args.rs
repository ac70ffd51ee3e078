//! trace.json's event args carry what the cost model charged each task for: the FLOPs of every
//! compute task add up to the schedule's hardware FLOPs per step (forward, backward and
//! recompute, on this rank), no task runs faster than the GPU's peak, and communication
//! that takes time carries the bytes it moved (a LoRA job's frozen root reduces nothing).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use stepsim::report::chrome_trace::{self, Detail};
use stepsim::scenario::Scenario;

/// Every task of every shipped scenario's trace: communication carries its bytes, and on a
/// job that completes its steps, the FLOPs add up.
fn check(name: &str) {
    let s = Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name)).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let peak = s.cluster.gpu.bf16_flops.expect("a BF16 GPU").max(s.cluster.gpu.fp8_flops.unwrap_or(0.0));
    let complete = sim.run.traces.iter().all(|t| t.oom.is_none());
    for (k, c) in sim.job.classes.iter().enumerate() {
        let (sched, tr) = (&c.schedule, &sim.run.traces[k]);
        let v: Value = serde_json::from_str(&chrome_trace::render_detail(sched, tr, 0, "x", Detail::Full)).unwrap();
        let mut per_step: BTreeMap<u64, f64> = BTreeMap::new();
        let mut comm_bytes = 0u64;
        for e in v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X") {
            let a = &e["args"];
            if let Some(f) = a["flops"].as_f64() {
                *per_step.entry(a["step"].as_u64().unwrap()).or_default() += f;
                if let Some(r) = a["tflops_per_s"].as_f64() {
                    // Causal flash attention's FLOPs are the whole square's (the MFU
                    // convention); FlashAttention-2 computes half of it, so its rate on that
                    // count may read up to twice the peak.
                    let bound = if e["name"].as_str().unwrap().ends_with("attention.core") { 2.0 } else { 1.0 };
                    assert!(r * 1e12 <= bound * peak * 1.001, "{name} class {k}: {e} runs above the GPU's peak");
                }
            }
            let cat = e["cat"].as_str().unwrap();
            let moved = e["dur"].as_f64().unwrap() > 0.0;
            if moved && ["AllGather", "ReduceScatter", "AllReduce", "AllToAll", "Send", "Recv"].contains(&cat) {
                comm_bytes += a["bytes"].as_u64().unwrap_or_else(|| panic!("{name}: {e} has no bytes"));
            }
        }
        if !complete {
            continue;
        }
        assert!(!per_step.is_empty(), "{name} class {k}: no FLOPs in the trace");
        for (step, f) in per_step {
            let hw = sched.hardware_flops_per_step;
            assert!(
                (f - hw).abs() <= 1e-9 * hw,
                "{name} class {k} step {step}: {f} FLOPs in the trace, {hw} scheduled"
            );
        }
        if sim.job.classes.len() > 1 || s.cluster.gpus > 1 {
            assert!(comm_bytes > 0, "{name} class {k}: communication without bytes");
        }
    }
}

#[test]
fn one_gpu_without_checkpointing() {
    check("gpt-1.3b-1gpu.toml");
}

#[test]
fn fsdp_with_full_checkpointing_counts_the_recompute() {
    check("100b-32gpu-fsdp-ac.toml");
}

#[test]
fn every_pipeline_stage() {
    check("gpt-13b-pp4-1f1b.toml");
}

#[test]
fn every_shipped_scenario() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    for name in names {
        let s = Scenario::load(&dir.join(&name)).unwrap();
        if s.inference.is_some() {
            continue;
        }
        check(&name);
    }
}
