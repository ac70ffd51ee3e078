//! Speed of the caching-allocator model: one million allocate/free pairs of transformer-like
//! sizes (`cargo bench --bench allocator`). The sizes are those of one GPT block's tensors
//! at hidden 4096, 2048 tokens, bf16 (16 MiB hidden states, 48 MiB QKV, 64 MiB MLP
//! activations, 8 MiB dropout masks, 32 MiB weights, 16 KiB norm statistics and small
//! scalars); each allocation lives for a pseudo-random number of later allocations (up to 96
//! tensors live), on the compute stream, one in eight on a second stream, and one in sixteen
//! freed by the other stream (record_stream). Target: at least 5 million operations per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use stepsim::memory::{Allocator, CachingAllocator, CachingConfig};

const PAIRS: usize = 1_000_000;
const MIB: u64 = 1 << 20;
const SIZES: [u64; 10] =
    [16 * MIB, 48 * MIB, 64 * MIB, 8 * MIB, 32 * MIB, 16 << 10, 4096, 16 * MIB + 8192, 64 * MIB, 96 * MIB];

/// Runs `PAIRS` allocate/free pairs; returns the reserved peak so nothing is optimised away.
fn pairs(expandable: bool) -> u64 {
    let mut cfg = CachingConfig::new(80 << 30);
    cfg.device_total = 80 << 30;
    cfg.expandable_segments = expandable;
    let mut a = CachingAllocator::new(cfg);
    const SLOTS: usize = 96;
    let mut live: [Option<(usize, usize)>; SLOTS] = [None; SLOTS];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut t = 0u64;
    for i in 0..PAIRS {
        // xorshift64*: deterministic, cheap.
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let slot = (r >> 8) as usize % SLOTS;
        if let Some((id, stream)) = live[slot].take() {
            t += 1;
            if r & 15 == 0 {
                a.free_on(id, 1 - stream, t);
                a.stream_synced(1 - stream, t);
            } else {
                a.free_on(id, stream, t);
            }
        }
        let stream = usize::from(r & 7 == 0);
        let size = SIZES[(r >> 32) as usize % SIZES.len()];
        a.malloc(i, size, stream).expect("80 GiB holds 96 live tensors");
        live[slot] = Some((i, stream));
    }
    a.stats().peak_reserved
}

fn alloc_free_pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("caching_allocator");
    g.sample_size(10);
    g.throughput(Throughput::Elements(2 * PAIRS as u64));
    g.bench_function("1M alloc/free pairs", |b| b.iter(|| std::hint::black_box(pairs(false))));
    g.bench_function("1M alloc/free pairs, expandable segments", |b| b.iter(|| std::hint::black_box(pairs(true))));
    g.finish();
}

criterion_group!(benches, alloc_free_pairs);
criterion_main!(benches);
