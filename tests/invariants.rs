//! Issue 22: a report asserts its own invariants before anything is written from it
//! (`stepsim::report::invariants`): each is broken here by hand on a real report and must be
//! named; every shipped scenario's report keeps them all.

use std::path::Path;

use stepsim::report::invariants::check;
use stepsim::report::Verdict;
use stepsim::scenario::Scenario;

fn sim(name: &str) -> stepsim::Simulation {
    let s = Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name)).unwrap();
    stepsim::simulate(&s).unwrap()
}

#[test]
fn every_broken_invariant_is_named() {
    let base = sim("gpt-1.3b-1gpu.toml").report;
    check(&base).unwrap();
    let broken = |f: &dyn Fn(&mut stepsim::report::Report), want: &str| {
        let mut r = base.clone();
        f(&mut r);
        let e = check(&r).expect_err(want);
        assert!(e.contains(want), "{e}");
    };
    broken(&|r| r.throughput.as_mut().unwrap().mfu = f64::NAN, "throughput.mfu = NaN");
    broken(&|r| r.steps[0].time_s = f64::INFINITY, "steps[0].time_s = inf");
    broken(&|r| r.peak.as_mut().unwrap().reserved.bytes = 1, "above peak reserved");
    broken(&|r| r.peak.as_mut().unwrap().breakdown[0].size.bytes = u64::MAX, "categories add up to");
    broken(&|r| r.phase_peaks[0].allocated.bytes = u64::MAX, "above the run's peak");
    broken(&|r| r.capacity.bytes = 1, "fits with");
    broken(&|r| r.model_state_per_gpu.gradients.bytes = u64::MAX, "gradients");
    broken(&|r| r.throughput.as_mut().unwrap().step_time_s = 0.0, "throughput: step 0 s");
    // At an OOM: nothing allocated beyond capacity.
    let mut oom = sim("fragmentation-oom.toml").report;
    check(&oom).unwrap();
    if let Verdict::Oom(o) = &mut oom.verdict {
        o.allocated.bytes = o.capacity.bytes + 1;
    } else {
        panic!("fragmentation-oom fits");
    }
    assert!(check(&oom).unwrap_err().contains("at the OOM"));
}

#[test]
fn every_shipped_scenario_keeps_the_invariants() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let s = Scenario::load(&p).unwrap();
            let sim = stepsim::simulate(&s).unwrap();
            sim.check_invariants().unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            n += 1;
        }
    }
    assert!(n >= 20);
}
