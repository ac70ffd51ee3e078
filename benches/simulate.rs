//! Speed of the simulator itself. `simulate_100b_32gpu` simulates the shipped
//! 100b-32gpu-fsdp-ac scenario (two training steps of 80 layers, 32 GPUs simulated once):
//! the target is under 20 ms per simulated step. `cargo bench --bench simulate`.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = simulate_100b_32gpu
}
criterion_main!(benches);
