//! Speed of sweeps: a 1,000-configuration capacity sweep of the 100B GPT (the shipped
//! 100b-32gpu-fsdp base; GPUs 8..256 x micro-batch 1..16 x checkpointing x five shardings x
//! two backward prefetches), run end to end (check, simulate, write sweep.csv, answer,
//! sweep.json, heatmap.png) on 1 and on 2 threads. Criterion reports configurations per
//! second as the throughput. `cargo bench --bench sweep`; the target is at least 1,000
//! configurations/s on 2 threads.

use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use stepsim::sweep::{self, RunOptions, SweepSpec};

fn spec() -> SweepSpec {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/100b-32gpu-fsdp.toml");
    let body = format!(
        r#"name = "bench-100b-1000"
base = {base:?}
[axes]
hardware.gpus = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256]
training.micro_batch = [1, 2, 4, 8, 16]
training.activation_checkpointing = ["none", "full"]
parallel.sharding = ["none", "zero1", "zero2", "full_shard", "hybrid_shard"]
parallel.backward_prefetch = ["pre", "post"]
"#,
        base = base.display().to_string()
    );
    SweepSpec::from_toml(Path::new("bench-100b-1000.toml"), &body).unwrap_or_else(|e| panic!("{e}"))
}

fn sweep_1000(c: &mut Criterion) {
    let spec = spec();
    assert_eq!(spec.size, 1000);
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let mut g = c.benchmark_group("sweep_100b_1000_configs");
    g.throughput(Throughput::Elements(spec.size));
    for threads in [1usize, 2] {
        let opts = RunOptions {
            out: tmp.path().join(format!("t{threads}")),
            jobs: Some(threads),
            shard: None,
            resume: false,
            progress: false,
        };
        g.bench_with_input(BenchmarkId::new("threads", threads), &opts, |b, opts| {
            b.iter(|| {
                let done = sweep::run(&spec, opts).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(done.rows, 1000);
                std::hint::black_box(done.ooms)
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(12));
    targets = sweep_1000
}
criterion_main!(benches);
