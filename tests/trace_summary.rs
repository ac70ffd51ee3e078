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

/// The job's memory.csv as `run` writes it with `detail` and a budget of `rows` rows, and
/// what the run's text says of its files.
fn memory_csv(
    sim: &stepsim::Simulation,
    detail: stepsim::report::write::OutputDetail,
    rows: usize,
) -> (Vec<String>, String) {
    use stepsim::report::write::{self, OutputPlan};
    let views: Vec<_> = (0..sim.job.classes.len())
        .map(|k| (&sim.job.classes[k].schedule, &sim.run.traces[k], &sim.class_reports[k]))
        .collect();
    let traces: Vec<_> = views.iter().map(|v| v.1).collect();
    let plan = OutputPlan::with_row_budget(&sim.report, &traces, detail, rows);
    let dir = tempfile::tempdir().unwrap();
    write::write_job(dir.path(), &sim.report, &views, &sim.job.links, sim.headline, &plan).unwrap();
    (plan.notes(), std::fs::read_to_string(dir.path().join("memory.csv")).unwrap())
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

/// `run --trace full` and `run --memory-csv full` are accepted, anything else for them refused
/// naming what is allowed; a small job's files are whole and the run says nothing of summaries.
#[test]
fn run_takes_trace_full_and_memory_csv_full_and_refuses_anything_else() {
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
    for flag in ["--trace", "--memory-csv"] {
        let ok = run(&[flag, "full"]);
        assert!(ok.status.success(), "{flag}");
        assert!(!String::from_utf8_lossy(&ok.stdout).contains("is a summary"), "a small job's files are whole");
        let bad = run(&[flag, "everything"]);
        assert_eq!(bad.status.code(), Some(2), "{flag}");
        assert!(String::from_utf8_lossy(&bad.stderr).contains("full"), "{flag}: names what is allowed");
    }
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
    let text = format!(
        "{{\"traceEvents\":[{{}}{}]}}",
        chrome_trace::flow_events(&views, &sim.job.links, &vec![Detail::Full; views.len()])
    );
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

/// Issue 25: memory.csv past its row budget keeps the samples trace.json's counters keep, and
/// each kept row is the full file's value at that instant: fewer rows, the same peaks, the same
/// final state, and the run says so. Shown on a 4-stage pipeline with a budget of 1,000 rows.
#[test]
fn a_memory_csv_summary_keeps_exact_values_and_every_peak() {
    use std::collections::BTreeMap;
    use stepsim::report::write::{self, OutputDetail};
    let s = Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-13b-pp4-1f1b.toml")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let (notes, full) = memory_csv(&sim, OutputDetail::default(), write::MEMORY_CSV_ROW_BUDGET);
    assert!(notes.iter().all(|n| !n.contains("memory.csv")), "a small job's memory.csv is whole");
    let (notes, summary) = memory_csv(&sim, OutputDetail::default(), 1_000);
    assert!(notes.iter().any(|n| n.contains("memory.csv is a summary") && n.contains("--memory-csv full")));
    // --memory-csv full overrides the budget.
    let asked = OutputDetail { full_memory_csv: true, ..Default::default() };
    assert_eq!(memory_csv(&sim, asked, 1_000).1, full);

    type Row = (u64, String, String, u64);
    let rows = |text: &str| -> Vec<Row> {
        let mut r = text.lines();
        assert_eq!(r.next(), Some("time_s,rank_class,category,bytes"));
        r.map(|l| {
            let f: Vec<&str> = l.rsplitn(3, ',').collect();
            let (head, cat, bytes) = (f[2], f[1], f[0]);
            let (t, class) = head.split_once(',').unwrap();
            let (sec, frac) = t.split_once('.').unwrap();
            let ns = sec.parse::<u64>().unwrap() * 1_000_000_000 + frac.parse::<u64>().unwrap();
            (ns, class.to_string(), cat.to_string(), bytes.parse().unwrap())
        })
        .collect()
    };
    let (full, summary) = (rows(&full), rows(&summary));
    assert!(summary.len() * 3 < full.len(), "{} rows of {}", summary.len(), full.len());
    // The values (class, category) takes at instant t in the full file: the one holding from
    // before t and those of its rows at t (several ops can run at one instant; a kept sample is
    // one of them).
    let mut history: BTreeMap<(String, String), Vec<(u64, u64)>> = BTreeMap::new();
    for (t, c, k, v) in &full {
        history.entry((c.clone(), k.clone())).or_default().push((*t, *v));
    }
    let at = |c: &str, k: &str, t: u64| -> Vec<u64> {
        let h = &history[&(c.to_string(), k.to_string())];
        let before = h.partition_point(|&(x, _)| x < t);
        let mut vals: Vec<u64> = h[before..].iter().take_while(|&&(x, _)| x == t).map(|&(_, v)| v).collect();
        if before > 0 {
            vals.push(h[before - 1].1);
        }
        vals
    };
    for (t, c, k, v) in &summary {
        assert!(at(c, k, *t).contains(v), "{c} {k} at {t} ns: {v} is not a value the full file has then");
    }
    let peaks = |rs: &[Row]| {
        let mut m: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (_, c, k, v) in rs.iter().filter(|r| r.2 == "allocated" || r.2 == "reserved") {
            let e = m.entry((c.clone(), k.clone())).or_default();
            *e = (*e).max(*v);
        }
        m
    };
    assert_eq!(peaks(&full), peaks(&summary));
    let last = |rs: &[Row]| -> BTreeMap<(String, String), u64> {
        rs.iter().map(|(_, c, k, v)| ((c.clone(), k.clone()), *v)).collect()
    };
    assert_eq!(last(&full), last(&summary), "every class and category ends where the full file does");
}

/// Issue 25: a summary of a job with more rank classes than [`chrome_trace::DETAILED_CLASSES`]
/// (a `[jitter]` job simulates one per data-parallel rank) shows the first 16 classes'
/// micro-batches 0-1 task by task and the rest as slices only: every task still shown or
/// counted, the file far smaller, and the run says so.
#[test]
fn a_summary_of_many_rank_classes_slices_all_but_sixteen() {
    let text = "[model]\nfamily = \"llama\"\nn_layers = 4\nhidden = 512\nn_heads = 8\nvocab = 1000\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 24\n[parallel]\nsharding = \"full_shard\"\n\
                [training]\nmicro_batch = 1\nseq_len = 512\n[jitter]\nseed = 3\ncompute_cv = 0.05\n";
    let s = Scenario::from_toml(Path::new("<jitter>"), text).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    assert_eq!(sim.job.classes.len(), 24);
    let n = sim.job.classes.len();
    for k in 0..n {
        let d = Detail::Summary.of_class(k, n, sim.headline);
        assert_eq!(d == Detail::Slices, k >= chrome_trace::DETAILED_CLASSES && k != sim.headline, "class {k}");
        assert_eq!(Detail::Full.of_class(k, n, sim.headline), Detail::Full);
    }
    let (sched, tr) = (&sim.job.classes[20].schedule, &sim.run.traces[20]);
    let sliced = events(&chrome_trace::render_detail(sched, tr, 20, "x", Detail::Slices));
    let ran = tr.start_ns.iter().filter(|&&t| t != u64::MAX).count() as u64;
    let shown = sliced.iter().filter(|e| e["ph"] == "X" && e["cat"] != "Summary").count() as u64;
    let counted: u64 =
        sliced.iter().filter(|e| e["cat"] == "Summary").map(|e| e["args"]["ops"].as_u64().unwrap()).sum();
    assert_eq!(shown + counted, ran, "every task shown or counted");
    for e in sliced.iter().filter(|e| e["ph"] == "X" && e["cat"] != "Summary") {
        let phase = e["args"]["phase"].as_str().unwrap();
        assert!(phase == "init" || phase == "optimizer", "{e}");
    }
    let full = events(&chrome_trace::render_detail(sched, tr, 20, "x", Detail::Full));
    let slices = |evs: &[Value]| evs.iter().filter(|e| e["ph"] == "X").count();
    assert!(slices(&sliced) * 5 < slices(&full), "{} slices of {}", slices(&sliced), slices(&full));
    // Its memory at fewer points, the peaks kept.
    let peak = |evs: &[Value], key: &str| {
        evs.iter().filter(|e| e["name"] == "memory (GB)").map(|e| e["args"][key].as_f64().unwrap()).fold(0.0, f64::max)
    };
    for key in ["allocated", "reserved"] {
        assert_eq!(peak(&full, key), peak(&sliced, key), "peak {key}");
    }
    let points = sliced.iter().filter(|e| e["name"] == "memory (GB)").count() as u64;
    assert!(points <= 3 * chrome_trace::SLICED_COUNTER_BUCKETS + 1, "{points} memory points");
}

/// Issue 25: memory.csv's summary of such a job follows trace.json: the first 16 classes (the
/// headline among them) at 2,000 stretches, the rest at 200, every class's peaks kept.
#[test]
fn a_memory_csv_summary_of_many_rank_classes_outlines_all_but_sixteen() {
    use std::collections::BTreeMap;
    use stepsim::report::write::{self, OutputDetail};
    let text = "[model]\nfamily = \"llama\"\nn_layers = 8\nhidden = 512\nn_heads = 8\nvocab = 1000\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 24\n[parallel]\nsharding = \"full_shard\"\n\
                [training]\nmicro_batch = 1\nseq_len = 512\ngrad_accum = 4\n[jitter]\nseed = 3\ncompute_cv = 0.05\n";
    let s = Scenario::from_toml(Path::new("<jitter>"), text).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let asked = OutputDetail { full_memory_csv: true, ..Default::default() };
    let full = memory_csv(&sim, asked, write::MEMORY_CSV_ROW_BUDGET).1;
    let (notes, summary) = memory_csv(&sim, OutputDetail::default(), 1_000);
    assert!(notes.iter().any(|n| n.contains("16 of the 24 classes") && n.contains("200 in the rest")));
    // Per class, in the file's order (the classes' order): the instants it has rows at, and
    // its highest allocated and reserved.
    let per_class = |text: &str| {
        let mut order: Vec<String> = Vec::new();
        let mut m: BTreeMap<String, (std::collections::BTreeSet<String>, u64, u64)> = BTreeMap::new();
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.rsplitn(3, ',').collect();
            let (head, cat, bytes) = (f[2], f[1], f[0].parse::<u64>().unwrap());
            let (t, class) = head.split_once(',').unwrap();
            if !m.contains_key(class) {
                order.push(class.to_string());
            }
            let e = m.entry(class.to_string()).or_default();
            e.0.insert(t.to_string());
            match cat {
                "allocated" => e.1 = e.1.max(bytes),
                "reserved" => e.2 = e.2.max(bytes),
                _ => {}
            }
        }
        order.into_iter().map(|c| m[&c].clone()).collect::<Vec<_>>()
    };
    let (full, summary) = (per_class(&full), per_class(&summary));
    assert_eq!((full.len(), summary.len()), (24, 24));
    let outline = 3 * stepsim::report::chrome_trace::SLICED_COUNTER_BUCKETS as usize + 1;
    for (k, (f, s)) in full.iter().zip(&summary).enumerate() {
        assert_eq!((f.1, f.2), (s.1, s.2), "class {k}: peaks kept");
        assert!(f.0.len() > outline, "class {k}: {} instants, too few to tell", f.0.len());
        let outlined = stepsim::report::chrome_trace::outlined_class(k, 24, sim.headline);
        assert_eq!(s.0.len() <= outline, outlined, "class {k}: {} of {} instants kept", s.0.len(), f.0.len());
    }
}
