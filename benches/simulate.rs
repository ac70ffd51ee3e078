//! Speed of the simulator itself. `cargo bench --bench simulate`.
//!
//! - `simulate_100b_32gpu` simulates the shipped 100b-32gpu-fsdp-ac scenario (two training
//!   steps of 80 layers, 32 GPUs simulated once): the target is under 20 ms per simulated step.
//! - `simulate_175b_pipeline` (issue 7) simulates GPT-3 175B on 1024 GPUs, TP 8 x PP 8 x DP 16,
//!   with 64 micro-batches per step, through the sweep's lean path ([`stepsim::simulate_lean`],
//!   the DAG built once outside the timed loop): symmetric ranks are simulated once, so one
//!   rank per pipeline stage (8 devices) runs. The target is under 20 ms per simulated step
//!   (issue 25; 100 ms before it); the bench reports time per call (all `training.steps`
//!   steps) and per simulated step. Each step's steady state is replayed rather than
//!   scheduled (`src/engine/period.rs`): 122 ms per step against 141 ms without, on the
//!   2-core development machine, where building the program and playing every allocation
//!   through the caching allocator are what remains (126-135 ms on 2026-12-06, after the
//!   GEMM kernel model; the caching allocator's layout never repeats from one period to the
//!   next in this run, so the replay cannot be skipped by comparing allocator states).
//!   63-65 ms per step on 2026-12-07 (79-83 before the stages' replays ran on both cores,
//!   below); the allocator's share of that, and why it alone
//!   exceeds the 20 ms target, is in `src/engine/period.rs`.
//!
//! Both run under the heap settings `stepsim run` sets first ([`stepsim::keep_freed_memory`]);
//! the figures before 2026-12-07 (session 39) ran under glibc's defaults, whose page faults
//! cost the pipeline bench about a fifth (96-107 against 79-83 ms per step, the 100B run
//! 7.8-9.1 against 5.6-6.0 ms). `benches/sweep.rs` keeps glibc's defaults: it starts a new
//! thread pool every iteration, and under these settings it ran 1,720 rather than 2,260
//! configurations/s on one thread, where one `stepsim sweep` process is unaffected (the
//! 10,000-configuration 100B sweep measured 1.01-1.05 without them against with).

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, SamplingMode};
use stepsim::scenario::Scenario;

fn scenario(name: &str) -> Scenario {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name);
    Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"))
}

fn simulate_100b_32gpu(c: &mut Criterion) {
    let s = scenario("100b-32gpu-fsdp-ac.toml");
    let steps = u64::from(s.training.steps);
    c.bench_function(&format!("simulate_100b_32gpu ({steps} steps)"), |b| {
        b.iter(|| std::hint::black_box(stepsim::simulate(&s).map(|sim| sim.report.peak.map(|p| p.allocated.bytes))))
    });
    let oom = scenario("100b-32gpu-fsdp.toml");
    c.bench_function("simulate_100b_32gpu_oom (stops at the OOM)", |b| {
        b.iter(|| std::hint::black_box(stepsim::simulate(&oom).is_ok()))
    });
}

/// The shipped GPT-3 175B scenario with 64 micro-batches per step (issue 7's configuration).
fn gpt3_175b_64_micro_batches() -> Scenario {
    let mut s = scenario("gpt3-175b.toml");
    s.training.grad_accum = 64;
    s
}

/// One lean simulation; the peak keeps the optimiser from discarding the work.
fn lean_peak(s: &Scenario, dag: &stepsim::model::LayerDag) -> Option<u64> {
    let r = stepsim::simulate_lean(s, dag, &[]).unwrap_or_else(|e| panic!("{e}"));
    r.peak.map(|p| p.allocated.bytes)
}

fn simulate_175b_pipeline(c: &mut Criterion) {
    let s = gpt3_175b_64_micro_batches();
    let dag = stepsim::model::build(&s.model, &s.workload);
    let steps = s.training.steps.max(1);
    let mut g = c.benchmark_group("simulate_175b_pipeline");
    // Ten samples of equal size (Flat): a run takes long enough that criterion's default
    // linearly growing samples would cost 55 runs.
    g.sample_size(10).sampling_mode(SamplingMode::Flat);
    g.bench_function(format!("tp8_pp8_dp16_64mb ({steps} steps)"), |b| {
        b.iter(|| std::hint::black_box(lean_peak(&s, &dag)))
    });
    // The same run, its time divided by the steps it simulates: the figure the target is for.
    g.bench_function("tp8_pp8_dp16_64mb (per simulated step)", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                std::hint::black_box(lean_peak(&s, &dag));
                total += t.elapsed();
            }
            total / steps
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = simulate_100b_32gpu, simulate_175b_pipeline
}
/// `criterion_main!`, after the heap settings the CLI runs under ([`stepsim::keep_freed_memory`]).
fn main() {
    stepsim::keep_freed_memory();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
