//! Helpers of the tests that check a faster way of playing a job against the plain one
//! (tests/periodic.rs, tests/by_rank.rs): a seeded generator of random scenarios, a device a
//! byte short of a run's peak, and the comparison of two simulations in everything they
//! recorded.

use stepsim::scenario::Scenario;
use stepsim::{SimOptions, Simulation};

/// `s` simulated the default way and with `plain` (the slower way it is checked against).
pub fn both(s: &Scenario, plain: SimOptions) -> (Simulation, Simulation) {
    let fast = stepsim::simulate(s).unwrap_or_else(|e| panic!("{e}"));
    let slow = stepsim::simulate_with(s, plain).unwrap_or_else(|e| panic!("{e}"));
    (fast, slow)
}

/// Shrinks `s`'s device so that its allocator holds one byte less than `bytes` (what the CUDA
/// context, NCCL's and DeepEP's buffers take stays outside it): a run that needed `bytes` at
/// its peak runs out of memory there.
pub fn a_byte_short_of(s: &mut Scenario, bytes: u64) {
    s.cluster.memory_bytes = s.cluster.cuda_context_bytes + s.nccl_bytes() + s.deepep_bytes() + bytes - 1;
}

/// Asserts the two simulations agree in everything they recorded: step spans, each class's
/// task times, memory timeline, allocator counters, OOM, stream busy time and end time, and
/// the reports.
pub fn assert_same_figures(name: &str, a: &Simulation, b: &Simulation) {
    assert_eq!(a.run.spans, b.run.spans, "{name}: step spans");
    assert_eq!(a.run.traces.len(), b.run.traces.len());
    for (c, (x, y)) in a.run.traces.iter().zip(&b.run.traces).enumerate() {
        assert!(x.start_ns == y.start_ns, "{name}: class {c}: task start times differ");
        assert!(x.end_ns == y.end_ns, "{name}: class {c}: task end times differ");
        assert!(x.timeline == y.timeline, "{name}: class {c}: memory timelines differ");
        assert_eq!(x.allocator, y.allocator, "{name}: class {c}: allocator counters");
        assert_eq!(x.oom, y.oom, "{name}: class {c}: OOM");
        assert_eq!(x.stream_busy_ns, y.stream_busy_ns, "{name}: class {c}: stream busy time");
        assert_eq!(x.end_time_ns, y.end_time_ns, "{name}: class {c}: end time");
    }
    let json = |s: &Simulation| serde_json::to_string(&s.report).expect("the report serializes");
    assert!(json(a) == json(b), "{name}: reports differ");
    for (x, y) in a.class_reports.iter().zip(&b.class_reports) {
        assert!(serde_json::to_string(x).unwrap() == serde_json::to_string(y).unwrap(), "{name}: class reports differ");
    }
}

/// A small, deterministic generator (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}
