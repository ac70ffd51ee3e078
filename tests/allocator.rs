//! The caching-allocator model end to end:
//! - `fragmentation-oom`: the live tensors fit, PyTorch's default allocator runs out of memory
//!   from fragmentation (with the figures of PyTorch's message), `expandable_segments = true`
//!   fits, and so does perfect packing;
//! - `empty-cache-oom`: the live tensors exceed capacity, and `empty_cache()` after every step
//!   does not change the verdict;
//! - the caching model reports *allocated* exactly as the exact model does (what the
//!   PyTorch-tracker fidelity test compares);
//! - `[allocator]` validation names the field;
//! - a property test of random allocate / free / cross-stream free / sync / empty_cache
//!   sequences: allocated <= reserved <= capacity, the bookkeeping stays consistent, every byte
//!   freed comes back, and nothing panics.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use stepsim::memory::caching::{allocation_size, format_size, round_size};
use stepsim::memory::Allocator as _;
use stepsim::memory::{AllocatorKind, CachingAllocator, CachingConfig, OomCause};
use stepsim::report::Verdict;
use stepsim::scenario::Scenario;

fn path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.toml"))
}

fn load(name: &str) -> Scenario {
    Scenario::load(&path(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// The shipped scenario with its `[allocator]` section replaced.
fn with_allocator(name: &str, section: &str) -> Scenario {
    let src = std::fs::read_to_string(path(name)).unwrap();
    let cut = src.find("[allocator]").map_or(src.as_str(), |i| &src[..i]);
    let text = format!("{cut}\n[allocator]\n{section}\n");
    Scenario::from_toml(&path(name), &text).unwrap_or_else(|e| panic!("{e}"))
}

fn oom_at(v: &Verdict) -> Option<(u32, &'static str, String)> {
    match v {
        Verdict::Oom(o) => Some((o.at.step, o.at.phase.name(), o.at.op.clone())),
        Verdict::Fits { .. } => None,
    }
}

#[test]
fn fragmentation_oom_is_the_allocators_and_expandable_segments_fit() {
    let s = load("fragmentation-oom");
    assert_eq!(s.allocator.kind, AllocatorKind::Caching);
    let sim = stepsim::simulate(&s).unwrap();
    let r = &sim.report;
    assert_eq!(oom_at(&r.verdict), Some((2, "backward", "loss.log_softmax".to_string())));
    let d = r.allocator.oom.as_ref().expect("an allocator OOM diagnosis");
    assert_eq!(d.cause, OomCause::Fragmentation);
    assert!(d.verdict.starts_with("fragmentation: the request would fit in free memory"), "{}", d.verdict);

    // The request is the FP32 logits' gradient: 5 x 2048 x 50257 x 4 bytes, a multiple of
    // 512; PyTorch's message names its segment, rounded up to 2 MiB (kRoundLarge): 982 x 2 MiB.
    let request = 5 * 2048 * 50257 * 4u64;
    assert_eq!(d.request.bytes, request);
    assert_eq!(d.tried_to_allocate.bytes, 982 * (2 << 20));
    assert_eq!(d.tried_to_allocate.bytes, allocation_size(round_size(request, &CachingConfig::new(0))));

    // Live tensors plus the request fit; the device cannot hold a new segment.
    let st = &d.state;
    assert!(d.live_plus_request.bytes <= d.capacity.bytes);
    assert_eq!(d.live_plus_request.bytes, st.live.bytes + request);
    assert_eq!(d.device_free.bytes, d.capacity.bytes - st.reserved.bytes);
    assert!(d.device_free.bytes < d.tried_to_allocate.bytes);
    assert!(st.largest_free_block.bytes < request, "no cached block can hold it");
    assert!(st.fragmentation.bytes + d.device_free.bytes >= request, "free bytes exist, in pieces");
    assert!(r.allocator.num_alloc_retries >= 1, "PyTorch freed its cache and retried first");

    // The figures in PyTorch's message are the simulation's, printed as format_size prints.
    let m = &d.pytorch_message;
    assert!(m.starts_with("CUDA out of memory. Tried to allocate 1.92 GiB. "), "{m}");
    assert!(m.contains("GPU 0 has a total capacity of 40.00 GiB of which "), "{m}");
    for part in [
        format!("Tried to allocate {}.", format_size(d.tried_to_allocate.bytes)),
        format!("of which {} is free.", format_size(d.device_free.bytes)),
        format!("Of the allocated memory {} is allocated by PyTorch", format_size(st.allocated.bytes)),
        format!("and {} is reserved by PyTorch but unallocated.", format_size(st.fragmentation.bytes)),
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".to_string(),
    ] {
        assert!(m.contains(&part), "message lacks {part:?}: {m}");
    }
    // The report knows that perfect packing fits.
    assert!(d.without_fragmentation.as_ref().is_some_and(|w| w.fits));
    let text = stepsim::report::text::render(r, &s);
    assert!(text.contains("stepsim's verdict: fragmentation"), "{text}");
    assert!(text.contains(m.as_str()), "the text report prints PyTorch's message");

    // expandable_segments:True fits, under capacity.
    let e = stepsim::simulate(&with_allocator("fragmentation-oom", "expandable_segments = true")).unwrap();
    assert!(matches!(e.report.verdict, Verdict::Fits { .. }), "expandable segments: {:?}", oom_at(&e.report.verdict));
    assert!(e.report.allocator.max_memory_reserved.bytes <= e.report.allocator.capacity.bytes);
    assert_eq!(e.report.allocator.alloc_conf, "expandable_segments:True");
    // And so does the exact model: the live tensors fit.
    let x = stepsim::simulate(&with_allocator("fragmentation-oom", "kind = \"exact\"")).unwrap();
    assert!(matches!(x.report.verdict, Verdict::Fits { .. }));
    assert!(x.report.allocator.oom.is_none());
}

#[test]
fn empty_cache_cannot_free_live_tensors() {
    let s = load("empty-cache-oom");
    assert!(!s.allocator.empty_cache.is_empty());
    let with = stepsim::simulate(&s).unwrap();
    let without = stepsim::simulate(&with_allocator("empty-cache-oom", "")).unwrap();
    let at = oom_at(&with.report.verdict).expect("OOM with empty_cache()");
    assert_eq!(at.0, 2, "step 1 fits, so empty_cache() ran before the OOM");
    assert_eq!(Some(at), oom_at(&without.report.verdict), "empty_cache() does not move the OOM");
    for sim in [&with, &without] {
        let d = sim.report.allocator.oom.as_ref().unwrap();
        assert_eq!(d.cause, OomCause::LiveTensors);
        assert!(d.live_plus_request.bytes > d.capacity.bytes);
        assert!(d.verdict.starts_with("live tensors exceed capacity"), "{}", d.verdict);
    }
    assert_eq!(with.report.allocator.num_empty_cache, 1);
    assert_eq!(without.report.allocator.num_empty_cache, 0);
    // The call did hand the cache back: at the end of step 1, reserved drops and live bytes
    // stay; what it keeps is split segments that still hold live blocks.
    let step1: Vec<_> = with.samples_in(1, None).collect();
    let (before, after) = (step1[step1.len() - 2], step1[step1.len() - 1]);
    assert_eq!(after.allocated, before.allocated, "empty_cache() frees no live tensor");
    assert!(
        before.reserved - after.reserved > 5_000_000_000,
        "reserved {} -> {} at empty_cache()",
        before.reserved,
        after.reserved
    );
    let kept = without.samples_in(1, None).last().unwrap();
    assert_eq!(kept.allocated, after.allocated);
    assert!(kept.reserved > after.reserved, "without empty_cache() the cache stays reserved");
}

#[test]
fn caching_reports_the_same_allocated_bytes_as_the_exact_model() {
    for name in ["gpt-1.3b-1gpu", "100b-32gpu-fsdp-ac"] {
        let c = stepsim::simulate(&load(name)).unwrap();
        let x = stepsim::simulate(&with_allocator(name, "kind = \"exact\"")).unwrap();
        let a: Vec<(u64, u64, usize)> =
            c.trace().timeline.samples().map(|s| (s.time_ns, s.allocated, s.task)).collect();
        let b: Vec<(u64, u64, usize)> =
            x.trace().timeline.samples().map(|s| (s.time_ns, s.allocated, s.task)).collect();
        assert_eq!(a.len(), b.len(), "{name}");
        assert!(a == b, "{name}: allocated timelines differ");
        let (pc, px) = (c.report.peak.clone().unwrap(), x.report.peak.clone().unwrap());
        assert_eq!(pc.allocated.bytes, px.allocated.bytes, "{name}");
        assert!(pc.reserved.bytes >= pc.allocated.bytes, "{name}: caching reserves at least what is live");
        assert_eq!(px.reserved.bytes, px.allocated.bytes, "{name}: the exact model reserves what is live");
        assert!(c.trace().timeline.samples().all(|s| s.allocated <= s.reserved && s.allocated <= s.active));
    }
}

#[test]
fn allocator_fields_are_validated_with_their_names() {
    let base = std::fs::read_to_string(path("gpt-1.3b-1gpu")).unwrap();
    for (section, field, says) in [
        ("kind = \"cudaMallocAsync\"", "allocator.kind", "allowed: \"caching\", \"exact\""),
        ("max_split_size_mb = 19", "allocator.max_split_size_mb", ">= 20"),
        ("roundup_power2_divisions = 3", "allocator.roundup_power2_divisions", "power of 2"),
        ("empty_cache = [\"sometimes\"]", "allocator.empty_cache", "\"after_step\""),
        ("kind = \"exact\"\nexpandable_segments = true", "allocator.expandable_segments", "only applies"),
        ("nccl_buffers = -1", "allocator.nccl_buffers", ">= 0"),
        ("cublas_workspace = 100000000000", "allocator.cublas_workspace", "leave nothing"),
        ("nccl_buffers = 100000000000", "allocator.nccl_buffers", "leave nothing"),
        ("expandable = true", "allocator.expandable", "unknown field"),
    ] {
        let text = format!("{base}\n[allocator]\n{section}\n");
        let e = Scenario::from_toml(Path::new("x.toml"), &text).expect_err(section);
        assert_eq!(e.field, field, "{section}: {e}");
        assert!(e.message.contains(says), "{section}: {e}");
    }
    // NCCL's buffers come off the capacity; cuBLAS workspaces are the allocator's own
    // (PyTorch allocates them through it), sized by CUBLAS_WORKSPACE_CONFIG.
    let s = Scenario::from_toml(
        Path::new("x.toml"),
        &format!("{base}\n[allocator]\ncublas_workspace = 33554432\nnccl_buffers = 1000000000\n"),
    )
    .unwrap();
    assert_eq!(s.allocator_capacity(), s.cluster.capacity_bytes() - 1_000_000_000);
    assert_eq!(s.training.blas_workspace, 33_554_432);
    let a100 = Scenario::from_toml(Path::new("x.toml"), &base).unwrap();
    assert_eq!(a100.training.blas_workspace, 2 * 4096 * 1024 + 8 * 16 * 1024);
}

/// PyTorch takes one cuBLAS workspace per (handle, stream) from its caching allocator, and
/// each thread has its own handle: a training step holds two (the forward's main thread and
/// autograd's device thread), each allocated by its thread's first matmul and never freed;
/// 32 MiB on Hopper, 8 MiB + 128 KiB on an A100 (CUBLAS_WORKSPACE_CONFIG's defaults).
#[test]
fn a_training_step_holds_two_cublas_workspaces_from_the_first_matmul_of_each_thread() {
    use stepsim::memory::Category;
    for (gpu, each) in [("a100-80gb", 2 * 4096 * 1024 + 8 * 16 * 1024u64), ("h100-sxm", 32 << 20)] {
        let text = std::fs::read_to_string(path("gpt-1.3b-1gpu")).unwrap().replace("a100-80gb", gpu);
        let s = Scenario::from_toml(Path::new("x.toml"), &text).unwrap();
        let sim = stepsim::simulate(&s).unwrap();
        let sched = sim.schedule();
        let prog = &sched.program;
        let ws: Vec<usize> =
            (0..prog.buffers.len()).filter(|&b| prog.buffers[b].category == Category::BlasWorkspaces).collect();
        assert_eq!(ws.len(), 2, "{gpu}");
        assert!(ws.iter().all(|&b| prog.buffers[b].bytes == each), "{gpu}");
        // Allocated by the first forward matmul and the first backward matmul, never freed.
        let allocates = |b: usize| (0..prog.tasks.len()).find(|&t| prog.alloc.of(t).contains(&(b as u32))).unwrap();
        let label = |t: usize| &sched.labels[prog.tasks[t].label as usize];
        let (f, b) = (label(allocates(ws[0])), label(allocates(ws[1])));
        assert_eq!((f.step, f.phase.name(), f.what.as_str()), (1, "forward", "layers.0.attn.c_attn"), "{gpu}");
        assert_eq!((b.step, b.phase.name(), b.what.as_str()), (1, "backward", "output"), "{gpu}");
        assert!(ws.iter().all(|&w| (0..prog.tasks.len()).all(|t| !prog.free.of(t).contains(&(w as u32)))));
        let (peak, _) = sim.step_peak(2).unwrap();
        assert_eq!(peak.by_category[Category::BlasWorkspaces.index()], 2 * each);
    }
}

// ------------------------------------------------------------------ property test

#[derive(Debug, Clone)]
enum Op {
    /// Allocate `size` bytes on `stream`.
    Alloc {
        size: u64,
        stream: usize,
    },
    /// Free the `k`-th live tensor (mod the number live) from `stream` (another stream: a
    /// cross-stream free, held back until that stream syncs).
    Free {
        k: usize,
        stream: usize,
    },
    /// `stream` has completed its work up to now.
    Sync {
        stream: usize,
    },
    EmptyCache,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=(1 << 20),           // small pool
        (1u64 << 20)..(10 << 20),   // large pool, 20 MiB segments
        (10u64 << 20)..(160 << 20), // large pool, own segments
        Just(16u64 << 20),          // exact transformer-like sizes, to exercise reuse
        Just(48u64 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (size(), 0usize..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => (any::<usize>(), 0usize..3).prop_map(|(k, stream)| Op::Free { k, stream }),
        1 => (0usize..3).prop_map(|stream| Op::Sync { stream }),
        1 => Just(Op::EmptyCache),
    ]
}

fn config() -> impl Strategy<Value = CachingConfig> {
    (
        64u64..1024,
        any::<bool>(),
        prop_oneof![Just(None), (20u64..200).prop_map(Some)],
        prop_oneof![Just(0u64), Just(2), Just(4)],
    )
        .prop_map(|(cap_mib, expandable, max_split, div)| {
            let mut c = CachingConfig::new(cap_mib << 20);
            c.device_total = cap_mib << 20;
            c.expandable_segments = expandable;
            c.max_split_size = max_split.map_or(u64::MAX, |m| m << 20);
            c.roundup_power2_divisions = [div; stepsim::memory::caching::ROUNDUP_INTERVALS];
            c
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_books(cfg in config(), ops in prop::collection::vec(op(), 1..160)) {
        let cap = cfg.capacity;
        let mut a = CachingAllocator::new(cfg.clone());
        let mut live: Vec<(usize, u64)> = Vec::new();
        let mut next_id = 0usize;
        let mut now = 0u64;
        for op in &ops {
            now += 1;
            match *op {
                Op::Alloc { size, stream } => {
                    let before = a.allocated();
                    match a.malloc(next_id, size, stream) {
                        Ok(()) => {
                            live.push((next_id, round_size(size, &cfg)));
                        }
                        Err(e) => {
                            prop_assert_eq!(a.allocated(), before, "a failed malloc frees no live tensor");
                            prop_assert_eq!(e.allocated, before);
                            let fits = e.allocated + e.requested <= cap;
                            prop_assert_eq!(e.cause == OomCause::Fragmentation, fits);
                        }
                    }
                    next_id += 1;
                }
                Op::Free { k, stream } => {
                    if !live.is_empty() {
                        let (id, _) = live.swap_remove(k % live.len());
                        a.free_on(id, stream, now);
                    }
                }
                Op::Sync { stream } => a.stream_synced(stream, now),
                Op::EmptyCache => a.empty_cache(),
            }
            let s = a.stats();
            prop_assert_eq!(s.allocated, live.iter().map(|l| l.1).sum::<u64>(), "allocated = live tensors, rounded");
            prop_assert!(s.allocated <= s.allocated_blocks);
            prop_assert!(s.allocated_blocks <= s.active);
            prop_assert!(s.active <= s.reserved, "active {} > reserved {}", s.active, s.reserved);
            prop_assert!(s.reserved <= cap, "reserved {} > capacity {}", s.reserved, cap);
            prop_assert!(s.peak_reserved <= cap);
            if let Err(e) = a.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
        }
        // Every byte freed comes back: free everything, let every stream finish, empty the cache.
        for (id, _) in live.drain(..) {
            a.free(id);
        }
        for st in 0..3 {
            a.stream_synced(st, u64::MAX);
        }
        a.empty_cache();
        let s = a.stats();
        prop_assert_eq!((s.allocated, s.allocated_blocks, s.active, s.reserved, s.segments), (0, 0, 0, 0, 0));
        prop_assert!(a.segments().is_empty());
        if let Err(e) = a.check_invariants() {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// Under Megatron-Core the blocks' GEMMs run in Transformer Engine, which takes its own
/// cuBLAS workspace from the caching allocator at its first GEMM (`get_cublas_workspace`,
/// lru-cached per device): 32 MiB + 1 KiB from compute capability 9.0, 4 MiB before; its
/// grouped GEMMs (the experts') take one more per compute stream, four, at the first expert
/// GEMM. None is freed. The LM head (Megatron's own ColumnParallelLinear) and PyTorch's two
/// stay as they are.
#[test]
fn transformer_engine_takes_its_own_workspaces_under_megatron() {
    use stepsim::memory::Category;
    let te = |text: &str| {
        let s = Scenario::from_toml(Path::new("x.toml"), text).unwrap_or_else(|e| panic!("{e}"));
        let sim = stepsim::simulate(&s).unwrap();
        let sched = sim.schedule();
        let prog = &sched.program;
        let mut ws: Vec<(u64, String)> = (0..prog.buffers.len())
            .filter(|&b| prog.buffers[b].category == Category::BlasWorkspaces)
            .map(|b| (prog.buffers[b].bytes, prog.names[prog.buffers[b].name as usize].clone()))
            .collect();
        ws.sort();
        ws
    };
    let dense = |gpu: &str| {
        format!(
            "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 1024\nn_heads = 8\nvocab = 32000\n\
             [hardware]\ngpu = \"{gpu}\"\ngpus = 1\n[parallel]\nframework = \"megatron\"\n\
             [training]\nmicro_batch = 1\nseq_len = 1024\n"
        )
    };
    let h100 = te(&dense("h100-sxm"));
    let te_h100: Vec<&(u64, String)> = h100.iter().filter(|(_, n)| n.contains("Transformer Engine")).collect();
    assert_eq!(te_h100.len(), 1, "{h100:?}");
    assert_eq!(te_h100[0].0, (32 << 20) + 1024);
    assert_eq!(h100.len(), 3, "{h100:?}");
    let a100 = te(&dense("a100-80gb"));
    assert!(a100.iter().any(|(b, n)| *b == 4 << 20 && n.contains("Transformer Engine")), "{a100:?}");
    // A mixture of experts: four grouped-GEMM workspaces more.
    let moe = dense("h100-sxm")
        .replace("[hardware]", "[model.moe]\nnum_experts = 4\ntop_k = 2\nexpert_ffn_hidden = 512\n[hardware]");
    let m = te(&moe);
    assert_eq!(m.iter().filter(|(_, n)| n.contains("grouped-GEMM")).count(), 4, "{m:?}");
    // Outside Megatron there is none.
    let fsdp = te(&dense("h100-sxm").replace("\"megatron\"", "\"fsdp\""));
    assert!(fsdp.iter().all(|(_, n)| !n.contains("Transformer Engine")), "{fsdp:?}");
}
