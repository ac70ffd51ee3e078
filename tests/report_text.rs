//! What a person reads in `run` and `explain` (issue 24's text report fixes): counts agree
//! in number, a one-node job says nothing about NICs, busy percentages stay within the step,
//! each framework prints its own settings, a LoRA job says what its bytes per parameter
//! count, and `run` and `explain` give the same headroom.

mod common;

use std::path::Path;

use common::{stepsim, text};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(scenario: &str, cmd: &str) -> String {
    // Tests run in parallel: each call its own folder.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("stepsim-text-{}-{n}-{cmd}-{scenario}", std::process::id()));
    let o = stepsim(&[cmd, &format!("scenarios/{scenario}.toml"), "--out", out.to_str().unwrap()], root());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    std::fs::remove_dir_all(&out).ok();
    text(&o.stdout)
}

#[test]
fn one_gpu_reads_in_the_singular_and_without_nics() {
    let t = run("gpt-1.3b-1gpu", "run");
    assert!(t.contains("(1 node x 1)") && t.contains("over 1 GPU,") && t.contains("naive average over 1 GPU "), "{t}");
    assert!(!t.contains(" 1 GPUs"), "{t}");
    assert!(!t.contains("across nodes;"), "a one-GPU job has no NICs to speak of:\n{t}");
}

#[test]
fn busy_percentages_stay_within_the_step() {
    // Tensor-parallel, data-parallel and pipeline streams all run at once here.
    let t = run("megatron-70b-h100-overlap", "run");
    let mut seen = 0;
    for line in t.lines().filter(|l| l.contains("busy: compute")) {
        let busy = &line[line.find("busy: ").unwrap()..];
        let pct = |key: &str| -> f64 {
            let rest = &busy[busy.find(key).unwrap() + key.len()..];
            rest[..rest.find('%').unwrap()].trim().parse().unwrap()
        };
        let (c, m) = (pct("busy: compute"), pct(", communication"));
        assert!((0.0..=100.0).contains(&c) && (0.0..=100.0).contains(&m), "{line}");
        seen += 1;
    }
    assert!(seen >= 2, "{t}");
}

#[test]
fn each_framework_prints_its_own_settings() {
    let ds = run("100b-8gpu-zero3-offload", "run");
    let line = ds.lines().find(|l| l.starts_with("Parallel")).unwrap();
    assert!(line.contains("reduce_bucket_size=") && !line.contains("backward_prefetch"), "{line}");
    let fsdp = run("100b-8gpu-fsdp-cpu-offload", "run");
    let line = fsdp.lines().find(|l| l.starts_with("Parallel")).unwrap();
    assert!(line.contains("backward_prefetch=") && !line.contains("reduce_bucket_size"), "{line}");
}

#[test]
fn a_lora_job_says_its_policy_bytes_are_the_adapters() {
    let t = run("llama2-70b-lora-8gpu", "run");
    let line = t.lines().find(|l| l.trim_start().starts_with("total")).unwrap();
    assert!(line.contains("trainable ones, the frozen base as stored"), "{line}");
}

#[test]
fn run_and_explain_give_the_same_headroom() {
    let r = run("gpt-1.3b-1gpu", "run");
    let e = run("gpt-1.3b-1gpu", "explain");
    let verdict = r.lines().find(|l| l.starts_with("Verdict")).unwrap();
    let headroom = &verdict[verdict.find("FITS: ").unwrap() + 6..verdict.find(" of headroom").unwrap()];
    assert!(e.contains(&format!("fits with {headroom} of headroom at the peak")), "{headroom}\n{e}");
}

#[test]
fn run_and_explain_agree_on_reserved_but_unallocated_at_an_oom() {
    let r = run("fragmentation-oom", "run");
    let e = run("fragmentation-oom", "explain");
    // run: "...; 0.17 GB (0.16 GiB) reserved but unallocated, largest free block ..."
    let line = r.lines().find(|l| l.contains("stepsim's verdict")).unwrap();
    let end = line.find(" reserved but unallocated").unwrap();
    let start = line[..end].rfind("; ").unwrap() + 2;
    let figure = &line[start..end];
    assert!(e.contains(&format!("+ {figure} reserved but unallocated")), "{figure}\n{e}");
}

#[test]
fn trace_json_counts_reserved_and_every_category() {
    let out = std::env::temp_dir().join(format!("stepsim-text-trace-{}", std::process::id()));
    let o = stepsim(&["run", "scenarios/gpt-1.3b-1gpu.toml", "--out", out.to_str().unwrap()], root());
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("trace.json")).unwrap()).unwrap();
    std::fs::remove_dir_all(&out).ok();
    let events = v["traceEvents"].as_array().unwrap();
    let counters = |name: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["ph"] == "C" && e["name"] == name).map(|e| &e["args"]).collect()
    };
    let totals = counters("memory (GB)");
    let parts = counters("memory by category (GB)");
    assert!(!totals.is_empty() && totals.len() == parts.len());
    for name in ["parameters", "master weights", "gradients", "optimizer state", "activations (saved)"] {
        assert!(parts[0].get(name).is_some(), "{name} missing from {}", parts[0]);
    }
    for (t, p) in totals.iter().zip(&parts) {
        let (alloc, reserved) = (t["allocated"].as_f64().unwrap(), t["reserved"].as_f64().unwrap());
        let sum: f64 = p.as_object().unwrap().values().map(|x| x.as_f64().unwrap()).sum();
        assert!(reserved + 1e-3 >= alloc && sum <= alloc + 1e-3 * 16.0, "{t} {p}");
    }
}
