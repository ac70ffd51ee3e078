//! trace.json past its event budget: repeated micro-batches become one slice per stream and
//! (step, phase, micro-batch) run, memory counters are bucketed, and nothing is lost that the
//! summary claims to keep: every task is either shown or counted in a slice, busy time adds
//! up, and the peak allocated and reserved samples are among the counters.

use std::path::Path;

use serde_json::Value;
use stepsim::report::chrome_trace::{self, Detail};
use stepsim::scenario::Scenario;

fn events(json: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(json).expect("trace.json is JSON");
    v["traceEvents"].as_array().unwrap().clone()
}

#[test]
fn a_summary_accounts_for_every_task_and_keeps_the_peaks() {
    let s = Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-13b-pp4-1f1b.toml")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    for (k, c) in sim.job.classes.iter().enumerate() {
        let (sched, tr) = (&c.schedule, &sim.run.traces[k]);
        let full = events(&chrome_trace::render_detail(sched, tr, 0, "x", Detail::Full));
        let text = chrome_trace::render_detail(sched, tr, 0, "x", Detail::Summary);
        let summary = events(&text);
        assert!(text.contains("stepsim run --trace full"), "a summary says it is one");
        let slices = |evs: &[Value], f: &dyn Fn(&Value) -> bool| evs.iter().filter(|e| e["ph"] == "X" && f(e)).count();
        let ran = tr.start_ns.iter().filter(|&&t| t != u64::MAX).count();
        assert_eq!(slices(&full, &|_| true), ran);
        let shown = slices(&summary, &|e| e["cat"] != "Summary");
        let counted: u64 =
            summary.iter().filter(|e| e["cat"] == "Summary").map(|e| e["args"]["ops"].as_u64().unwrap()).sum();
        assert_eq!(shown as u64 + counted, ran as u64, "class {k}: every task shown or counted");
        assert!(counted > 0, "class {k}: 16 micro-batches, 13 of them summarised");
        // Micro-batches 0, 1 and 15 are shown task by task; 2-14 only as slices.
        for e in summary.iter().filter(|e| e["ph"] == "X" && e["cat"] != "Summary") {
            let (mb, phase) = (e["args"]["micro_batch"].as_u64().unwrap(), e["args"]["phase"].as_str().unwrap());
            assert!(mb < 2 || mb == 15 || phase == "init" || phase == "optimizer", "{e}");
        }
        let busy = |evs: &[Value], summary: bool| -> f64 {
            evs.iter()
                .filter(|e| e["ph"] == "X")
                .map(|e| {
                    if summary && e["cat"] == "Summary" {
                        e["args"]["busy_us"].as_f64().unwrap()
                    } else {
                        e["dur"].as_f64().unwrap()
                    }
                })
                .sum()
        };
        let (bf, bs) = (busy(&full, false), busy(&summary, true));
        assert!((bf - bs).abs() < 1e-3 * bf.max(1.0), "class {k}: busy time {bf} vs {bs}");
        // The peaks survive bucketing.
        let peak = |evs: &[Value], key: &str| {
            evs.iter()
                .filter(|e| e["name"] == "memory (GB)")
                .map(|e| e["args"][key].as_f64().unwrap())
                .fold(0.0, f64::max)
        };
        for key in ["allocated", "reserved"] {
            assert_eq!(peak(&full, key), peak(&summary, key), "class {k}: peak {key}");
        }
        assert!(summary.len() < full.len());
    }
}

#[test]
fn small_jobs_keep_every_event_and_full_overrides_the_budget() {
    let s = Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-1.3b-1gpu.toml")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let tr = &sim.run.traces[0];
    assert!(chrome_trace::full_events(tr) < chrome_trace::EVENT_BUDGET);
    assert_eq!(chrome_trace::detail_for(&[tr], false), Detail::Full);
    // Many copies of the same trace pass the budget; --trace full keeps them whole.
    let many = vec![tr; chrome_trace::EVENT_BUDGET / chrome_trace::full_events(tr) + 1];
    assert_eq!(chrome_trace::detail_for(&many, false), Detail::Summary);
    assert_eq!(chrome_trace::detail_for(&many, true), Detail::Full);
}

#[test]
fn run_takes_trace_full_and_refuses_anything_else() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_stepsim"))
            .args(["run", "scenarios/gpt-1.3b-1gpu.toml", "--out", dir.path().to_str().unwrap()])
            .args(extra)
            .current_dir(root)
            .output()
            .unwrap()
    };
    assert!(run(&["--trace", "full"]).status.success());
    let bad = run(&["--trace", "everything"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("full"), "names what is allowed");
}

/// Issue 24: a pipeline's trace draws an arrow from the kernel that produced each activation
/// (or gradient) on one stage to the receive that waited for it on the next (or previous):
/// every flow has one start and one end, on two different rank classes, the end inside a
/// receive that starts when (or after) the arrow leaves.
#[test]
fn a_pipeline_trace_links_each_receive_to_its_sender() {
    let s = Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-13b-pp4-1f1b.toml")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let views: Vec<_> = sim.job.classes.iter().enumerate().map(|(k, c)| (&c.schedule, &sim.run.traces[k])).collect();
    let text = format!("{{\"traceEvents\":[{{}}{}]}}", chrome_trace::flow_events(&views, &sim.job.links, Detail::Full));
    let evs = events(&text);
    let starts: Vec<&Value> = evs.iter().filter(|e| e["ph"] == "s").collect();
    let ends: Vec<&Value> = evs.iter().filter(|e| e["ph"] == "f").collect();
    assert_eq!(starts.len(), ends.len());
    // 4 stages, 16 micro-batches: 3 x 16 activations forward and 3 x 16 gradients back per
    // step (and the tied embedding's all-reduce between first and last stage).
    let recvs = ends.iter().filter(|e| e["name"].as_str().unwrap().starts_with("recv ")).count();
    assert!(recvs >= 2 * 3 * 16, "{recvs} receive arrows");
    for (s, f) in starts.iter().zip(&ends) {
        assert_eq!(s["id"], f["id"]);
        assert_ne!(s["pid"], f["pid"], "an arrow crosses rank classes");
        assert!(s["ts"].as_f64().unwrap() <= f["ts"].as_f64().unwrap(), "{s} {f}");
        assert_eq!(f["bp"], "e");
    }
}
