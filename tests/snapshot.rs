//! The PyTorch memory snapshot (`stepsim run --snapshot`): the allocator's history replays to
//! the simulated allocated and reserved curves exactly, its final segments tile and hold what
//! is live, and the pickle the CLI writes is one Python's `pickle` loads with
//! `torch.cuda.memory._snapshot()`'s keys.

mod common;
use common::{stepsim, text};
use std::path::Path;

use stepsim::memory::caching::round_size;
use stepsim::memory::history::{Action, BlockState, History, NO_TENSOR};
use stepsim::scenario::Scenario;

fn load(name: &str) -> Scenario {
    Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.toml"))).unwrap()
}

/// Replays `h`'s entries and checks, at every instant where the history or the timeline
/// changes, that the live bytes (each request rounded as the allocator rounds it) and the
/// reserved bytes equal the timeline's after everything that happened at that instant.
/// Returns the number of instants compared.
fn replay_matches_curve(s: &Scenario, h: &History, samples: &[stepsim::memory::Sample]) -> usize {
    let cfg = s.allocator.caching_config(s.allocator_capacity(), s.cluster.memory_bytes);
    let mut live = std::collections::HashMap::new();
    let (mut allocated, mut reserved) = (0u64, 0u64);
    // (time, allocated, reserved) after each instant, from the history and from the timeline.
    let mut from_history: Vec<(u64, u64, u64)> = Vec::new();
    for e in &h.events {
        match e.action {
            Action::Alloc => {
                let r = round_size(e.size, &cfg);
                assert!(live.insert(e.addr, r).is_none(), "two live tensors at address {}", e.addr);
                allocated += r;
            }
            Action::FreeRequested => allocated -= live.remove(&e.addr).expect("free of a live address"),
            Action::SegmentAlloc | Action::SegmentMap => reserved += e.size,
            Action::SegmentFree | Action::SegmentUnmap => reserved -= e.size,
            Action::FreeCompleted | Action::Oom => {}
        }
        match from_history.last_mut() {
            Some(last) if last.0 == e.time_ns => *last = (e.time_ns, allocated, reserved),
            _ => from_history.push((e.time_ns, allocated, reserved)),
        }
    }
    let mut from_curve: Vec<(u64, u64, u64)> = Vec::new();
    for x in samples {
        match from_curve.last_mut() {
            Some(last) if last.0 == x.time_ns => *last = (x.time_ns, x.allocated, x.reserved),
            _ => from_curve.push((x.time_ns, x.allocated, x.reserved)),
        }
    }
    let mut times: Vec<u64> = from_history.iter().chain(&from_curve).map(|x| x.0).collect();
    times.sort_unstable();
    times.dedup();
    let (mut i, mut j) = (0, 0);
    let (mut a, mut b) = ((0, 0), (0, 0));
    for &t in &times {
        while i < from_history.len() && from_history[i].0 <= t {
            a = (from_history[i].1, from_history[i].2);
            i += 1;
        }
        while j < from_curve.len() && from_curve[j].0 <= t {
            b = (from_curve[j].1, from_curve[j].2);
            j += 1;
        }
        assert_eq!(a, b, "{}: at {t} ns the history gives (allocated, reserved) {a:?}, the curve {b:?}", s.name);
    }
    // The final segments: blocks tile them, they add up to what is reserved, and the
    // allocated blocks are the live tensors.
    let mut total = 0;
    let mut live_at_end = 0;
    for seg in &h.segments {
        let mut at = seg.addr;
        for bl in &seg.blocks {
            assert_eq!(bl.addr, at, "{}: blocks of the segment at {} do not tile it", s.name, seg.addr);
            at += bl.size;
            if bl.state == BlockState::Allocated {
                assert_ne!(bl.tensor, NO_TENSOR);
                assert_eq!(live.get(&bl.addr).copied(), Some(round_size(bl.requested, &cfg)));
                live_at_end += 1;
            }
        }
        total += seg.total_size();
    }
    assert_eq!(total, reserved, "{}: the final segments hold what is reserved", s.name);
    assert_eq!(live_at_end, live.len(), "{}: every live tensor has its block", s.name);
    times.len()
}

fn check(s: &Scenario) {
    let sim = stepsim::simulate_with(s, stepsim::SimOptions { history: true, ..Default::default() }).unwrap();
    let plain = stepsim::simulate(s).unwrap();
    assert_eq!(
        stepsim::report::write::report_json(&sim.report),
        stepsim::report::write::report_json(&plain.report),
        "{}: recording the history changes nothing",
        s.name
    );
    for tr in &sim.run.traces {
        let h = tr.history.as_ref().expect("the caching allocator keeps a history");
        assert!(h.events.iter().any(|e| e.action == Action::Alloc));
        let n = replay_matches_curve(s, h, &tr.timeline.samples().collect::<Vec<_>>());
        assert!(n > 10, "{}: only {n} instants compared", s.name);
        let oom = h.events.iter().filter(|e| e.action == Action::Oom).count();
        assert_eq!(oom, usize::from(tr.oom.is_some()), "{}: one oom entry where the class ran out", s.name);
    }
}

#[test]
fn the_history_replays_to_the_curves_of_a_plain_run() {
    check(&load("gpt-1.3b-1gpu"));
}

#[test]
fn the_history_replays_through_fragmentation_empty_cache_and_oom() {
    // A fragmentation OOM (a retry that frees segments, then the oom entry) and
    // empty_cache() calls (segment_free entries).
    check(&load("fragmentation-oom"));
    check(&load("empty-cache-oom"));
}

#[test]
fn the_history_replays_with_expandable_segments() {
    let mut s = load("fragmentation-oom");
    s.allocator.expandable_segments = true;
    let sim = stepsim::simulate_with(&s, stepsim::SimOptions { history: true, ..Default::default() }).unwrap();
    let h = sim.run.traces[0].history.as_ref().unwrap();
    assert!(h.events.iter().any(|e| e.action == Action::SegmentMap), "pages are mapped, not cudaMalloc'd");
    assert!(!h.events.iter().any(|e| e.action == Action::SegmentAlloc));
    check(&s);
}

#[test]
fn the_history_replays_across_streams_and_rank_classes() {
    // FSDP frees gathered parameters from the compute stream that used them (pending frees);
    // a pipeline has one class, one history, per stage.
    check(&load("100b-32gpu-fsdp"));
    let s = load("gpt-13b-pp4-1f1b");
    check(&s);
}

#[test]
fn run_snapshot_writes_a_pickle_per_rank_class() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let one = dir.path().join("one");
    let o = stepsim(&["run", "scenarios/gpt-1.3b-1gpu.toml", "--snapshot", "--out", one.to_str().unwrap()], root);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("snapshot.pickle"));
    let bytes = std::fs::read(one.join("snapshot.pickle")).unwrap();
    assert_eq!(&bytes[..2], b"\x80\x02", "a protocol 2 pickle");
    assert_eq!(bytes.last(), Some(&b'.'), "closed by STOP");
    python_loads(&one.join("snapshot.pickle"));

    let pp = dir.path().join("pp");
    let o = stepsim(&["run", "scenarios/gpt-13b-pp4-1f1b.toml", "--snapshot", "--out", pp.to_str().unwrap()], root);
    assert!(o.status.success(), "{}", text(&o.stderr));
    for k in 0..4 {
        assert!(pp.join(format!("snapshot-stage-{k}.pickle")).is_file(), "stage {k}'s snapshot");
    }
    assert!(!pp.join("snapshot.pickle").exists());

    // Without --snapshot, no pickle.
    let plain = dir.path().join("plain");
    let o = stepsim(&["run", "scenarios/gpt-1.3b-1gpu.toml", "--out", plain.to_str().unwrap()], root);
    assert!(o.status.success());
    assert!(!plain.join("snapshot.pickle").exists());
}

#[test]
fn the_exact_allocator_has_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-1.3b-1gpu.toml"));
    let src = format!("{}\n[allocator]\nkind = \"exact\"\n", base.unwrap());
    let path = dir.path().join("exact.toml");
    std::fs::write(&path, src).unwrap();
    let out = dir.path().join("out");
    let o = stepsim(&["run", path.to_str().unwrap(), "--snapshot", "--out", out.to_str().unwrap()], dir.path());
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(err.contains("allocator.kind") && err.contains("caching"), "{err}");
    assert!(!out.exists(), "nothing written");
}

/// Where Python is installed, its `pickle` loads the file and finds the snapshot's keys (the
/// Python package's tests replay it against memory.csv too).
fn python_loads(path: &Path) {
    let check = "import pickle,sys\n\
        d=pickle.load(open(sys.argv[1],'rb'))\n\
        assert set(d)>={'segments','device_traces','allocator_settings'}, d.keys()\n\
        t=d['device_traces'][0]\n\
        assert {'action','addr','size','stream','time_us','frames'}<=set(t[-1]), t[-1]\n\
        s=d['segments'][0]\n\
        assert {'device','address','total_size','allocated_size','active_size','requested_size','stream','segment_type','segment_pool_id','is_expandable','blocks'}<=set(s)\n\
        assert all(sum(b['size'] for b in s['blocks'])==s['total_size'] for s in d['segments'])\n\
        print(len(t))\n";
    match std::process::Command::new("python3").arg("-c").arg(check).arg(path).output() {
        Ok(o) => assert!(o.status.success(), "python3 could not read the snapshot: {}", text(&o.stderr)),
        Err(e) => eprintln!("python3 not found ({e}): the pickle was not loaded by Python here"),
    }
}
