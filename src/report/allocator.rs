//! The allocator's side of the report: `max_memory_allocated` / `max_memory_reserved`,
//! retries, the fragmentation and largest free block at the reserved peak, and on an OOM the
//! message PyTorch would print (with the simulated figures) next to stepsim's own verdict:
//! live tensors over capacity, or fragmentation.

use std::fmt::Write;

use serde::Serialize;

use super::{fmt_bytes, instant, Bytes, Instant};
use crate::engine::Trace;
use crate::memory::caching::format_size;
use crate::memory::{AllocatorKind, EmptyCacheAt, OomCause, Sample, Snapshot};
use crate::scenario::Scenario;
use crate::schedule::Schedule;

/// Memory held outside the allocator (cuBLAS workspaces are not: PyTorch allocates them
/// through it).
#[derive(Debug, Clone, Serialize)]
pub struct Outside {
    pub cuda_context: Bytes,
    pub nccl_buffers: Bytes,
    /// DeepEP's NVLink and RDMA buffers (`[moe] dispatcher = "deepep"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deepep_buffers: Option<Bytes>,
    pub total: Bytes,
}

/// The allocator's state at one instant.
#[derive(Debug, Clone, Serialize)]
pub struct AllocatorState {
    #[serde(flatten)]
    pub at: Option<Instant>,
    /// Live tensor bytes.
    pub live: Bytes,
    /// `memory_allocated()`: blocks handed out, tails not split off included.
    pub allocated: Bytes,
    pub reserved: Bytes,
    /// Reserved but unallocated (`memory_reserved() - memory_allocated()`).
    pub fragmentation: Bytes,
    pub largest_free_block: Bytes,
    /// Free bytes inside segments that also hold live blocks (`inactive_split_bytes`).
    pub inactive_split: Bytes,
}

/// Why the run ran out of memory, in PyTorch's words and in stepsim's.
#[derive(Debug, Clone, Serialize)]
pub struct OomDiagnosis {
    pub cause: OomCause,
    /// stepsim's verdict, one sentence.
    pub verdict: String,
    /// The `torch.OutOfMemoryError` message PyTorch would raise, with the simulated figures.
    pub pytorch_message: String,
    /// The request, rounded as the allocator rounds it.
    pub request: Bytes,
    /// What PyTorch's message says it tried to allocate: the segment the request needed.
    pub tried_to_allocate: Bytes,
    /// Device memory (`cudaMemGetInfo` total).
    pub device_total: Bytes,
    /// Device memory not in use (`cudaMemGetInfo` free) after the allocator released its cache.
    pub device_free: Bytes,
    /// Live tensors plus the request, against the allocator's capacity.
    pub live_plus_request: Bytes,
    pub capacity: Bytes,
    pub state: AllocatorState,
    /// For a fragmentation OOM: the same run with perfect packing (the exact model).
    pub without_fragmentation: Option<WithoutFragmentation>,
}

/// What the run does when no byte is lost to fragmentation (allocator.kind = "exact").
#[derive(Debug, Clone, Serialize)]
pub struct WithoutFragmentation {
    pub fits: bool,
    /// Where it runs out of memory even then.
    pub oom_at: Option<Instant>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AllocatorReport {
    pub kind: AllocatorKind,
    /// `PYTORCH_CUDA_ALLOC_CONF` the options correspond to ("" for the defaults).
    pub alloc_conf: String,
    pub empty_cache: Vec<EmptyCacheAt>,
    /// What the allocator may reserve: device memory less everything outside it.
    pub capacity: Bytes,
    pub outside: Outside,
    /// `torch.cuda.max_memory_allocated()`.
    pub max_memory_allocated: Bytes,
    /// `torch.cuda.max_memory_reserved()`.
    pub max_memory_reserved: Bytes,
    /// What nvidia-smi shows at the reserved peak: `max_memory_reserved` plus the memory held
    /// outside the allocator (CUDA context, NCCL buffers).
    pub nvidia_smi_peak: Bytes,
    /// The peak of live tensor bytes (what PyTorch's memory trackers count).
    pub peak_live: Bytes,
    /// `num_alloc_retries`: allocations that had to free the whole cache and retry.
    pub num_alloc_retries: u64,
    /// cudaMalloc (or page map) and cudaFree (or unmap) calls.
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_empty_cache: u64,
    /// At the first instant reserved reached its peak.
    pub at_peak_reserved: AllocatorState,
    /// At the first instant live bytes reached their peak.
    pub at_peak_allocated: AllocatorState,
    pub oom: Option<OomDiagnosis>,
}

fn state(snap: &Snapshot, at: Option<Instant>) -> AllocatorState {
    AllocatorState {
        at,
        live: Bytes::new(snap.allocated),
        allocated: Bytes::new(snap.allocated_blocks),
        reserved: Bytes::new(snap.reserved),
        fragmentation: Bytes::new(snap.reserved.saturating_sub(snap.allocated_blocks)),
        largest_free_block: Bytes::new(snap.largest_free_block),
        inactive_split: Bytes::new(snap.inactive_split_bytes),
    }
}

/// The message `DeviceCachingAllocator::malloc` raises (CUDACachingAllocator.cpp, commit
/// 001074d), with sizes printed as its `format_size` prints them.
pub fn pytorch_oom_message(
    segment: u64,
    device_total: u64,
    device_free: u64,
    in_use: u64,
    allocated: u64,
    reserved: u64,
) -> String {
    format!(
        "CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of {} of which {} is free. \
         Including non-PyTorch memory, this process has {} memory in use. Of the allocated memory {} is \
         allocated by PyTorch, and {} is reserved by PyTorch but unallocated. If reserved but unallocated \
         memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
         See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        format_size(segment),
        format_size(device_total),
        format_size(device_free),
        format_size(in_use),
        format_size(allocated),
        format_size(reserved.saturating_sub(allocated)),
    )
}

pub fn build(s: &Scenario, sched: &Schedule, trace: &Trace) -> AllocatorReport {
    let st = &trace.allocator;
    let a = &s.allocator;
    let capacity = s.allocator_capacity();
    let outside_total = s.outside_bytes();
    let at_sample = |smp: Option<&Sample>| smp.map(|smp| instant(sched, smp.task, smp.time_ns));
    let oom = trace.oom.as_ref().filter(|_| a.kind == AllocatorKind::Caching).map(|o| {
        let e = &o.error;
        let device_total = s.cluster.memory_bytes;
        let device_free = capacity.saturating_sub(e.reserved);
        let in_use = e.reserved + outside_total;
        let live_plus = e.allocated + e.requested;
        let verdict = match e.cause {
            OomCause::LiveTensors => format!(
                "live tensors exceed capacity: {} live + {} requested = {} > {} the allocator may use; no allocator setting or empty_cache() can fit this",
                fmt_bytes(e.allocated),
                fmt_bytes(e.requested),
                fmt_bytes(live_plus),
                fmt_bytes(capacity)
            ),
            OomCause::Fragmentation => format!(
                "fragmentation: the request would fit in free memory but no free block or segment can hold it ({} live + {} requested = {} of {}; {} reserved but unallocated, largest free block {}, {} free on the device for a {} segment)",
                fmt_bytes(e.allocated),
                fmt_bytes(e.requested),
                fmt_bytes(live_plus),
                fmt_bytes(capacity),
                fmt_bytes(e.reserved.saturating_sub(e.allocated_blocks)),
                fmt_bytes(e.largest_free_block),
                fmt_bytes(device_free),
                fmt_bytes(e.segment)
            ),
        };
        let snap = Snapshot {
            allocated: e.allocated,
            allocated_blocks: e.allocated_blocks,
            reserved: e.reserved,
            largest_free_block: e.largest_free_block,
            inactive_split_bytes: st.inactive_split_bytes,
        };
        OomDiagnosis {
            cause: e.cause,
            verdict,
            pytorch_message: pytorch_oom_message(
                e.segment,
                device_total,
                device_free,
                in_use,
                e.allocated_blocks,
                e.reserved,
            ),
            request: Bytes::new(e.requested),
            tried_to_allocate: Bytes::new(e.segment),
            device_total: Bytes::new(device_total),
            device_free: Bytes::new(device_free),
            live_plus_request: Bytes::new(live_plus),
            capacity: Bytes::new(capacity),
            state: state(&snap, Some(instant(sched, o.task as usize, o.time_ns))),
            without_fragmentation: None,
        }
    });
    AllocatorReport {
        kind: a.kind,
        alloc_conf: a.alloc_conf(),
        empty_cache: a.empty_cache.clone(),
        capacity: Bytes::new(capacity),
        outside: Outside {
            cuda_context: Bytes::new(s.cluster.cuda_context_bytes),
            nccl_buffers: Bytes::new(s.nccl_bytes()),
            deepep_buffers: (s.deepep_bytes() > 0).then(|| Bytes::new(s.deepep_bytes())),
            total: Bytes::new(outside_total),
        },
        max_memory_allocated: Bytes::new(st.peak_allocated_blocks),
        max_memory_reserved: Bytes::new(st.peak_reserved),
        nvidia_smi_peak: Bytes::new(st.peak_reserved.saturating_add(outside_total)),
        peak_live: Bytes::new(st.peak_allocated),
        num_alloc_retries: st.num_alloc_retries,
        num_device_alloc: st.num_device_alloc,
        num_device_free: st.num_device_free,
        num_empty_cache: st.num_empty_cache,
        at_peak_reserved: state(&st.at_peak_reserved, at_sample(trace.timeline.peak_reserved())),
        at_peak_allocated: state(&st.at_peak_allocated, at_sample(trace.timeline.peak())),
        oom,
    }
}

/// The assumption line naming the allocator model.
pub fn assumption(s: &Scenario) -> String {
    let a = &s.allocator;
    match a.kind {
        AllocatorKind::Exact => "allocator: exact live-byte accounting, every block rounded up to 512 B as PyTorch's caching allocator does (allocator.kind = \"exact\": no fragmentation modelled, reserved = allocated)".into(),
        AllocatorKind::Caching => format!(
            "allocator: PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp: 512 B rounding, small/large pools of 2 MiB / 20 MiB / 2 MiB-rounded segments, per-stream reuse, best-fit splitting, coalescing, free-and-retry), PYTORCH_CUDA_ALLOC_CONF={}",
            if a.alloc_conf().is_empty() { "(unset)".to_string() } else { a.alloc_conf() }
        ),
    }
}

/// The NCCL line: where `allocator.nccl_buffers` comes from, communicator by communicator.
pub fn nccl_assumption(s: &Scenario) -> String {
    if let Some(b) = s.allocator.nccl_buffers {
        return format!("NCCL buffers {} per GPU, as given (allocator.nccl_buffers)", fmt_bytes(b));
    }
    let e = s.nccl_estimate();
    if !e.modelled {
        return format!(
            "NCCL buffers 0: {} runs RCCL, whose buffers are not modelled; set allocator.nccl_buffers",
            s.cluster.gpu.name
        );
    }
    if e.communicators.is_empty() {
        return "NCCL buffers 0: one GPU, no communicator".into();
    }
    let c = &e.config;
    let parts: Vec<String> = e.communicators.iter().map(|(c, b)| format!("{} {}", c.name, fmt_bytes(*b))).collect();
    format!(
        "NCCL buffers {} per GPU, estimated for {} (src/net/nccl_memory.rs, from NCCL's source: every channel's connection holds LL, LL128 and SIMPLE buffers; NCCL_RUNTIME_CONNECT={}, NCCL_CUMEM_ENABLE={}, NCCL_NVLS_ENABLE={} ([nccl])): {}",
        fmt_bytes(e.per_gpu),
        e.class,
        u8::from(c.runtime_connect),
        u8::from(c.cumem),
        u8::from(c.nvls),
        parts.join(", ")
    )
}

/// The capacity assumption line: device memory less everything held outside the allocator.
pub fn capacity_assumption(s: &Scenario) -> String {
    let a = &s.allocator;
    let threads = if s.inference.is_some() {
        "one, by the first matmul"
    } else {
        "two, by the forward's first matmul (main thread) and the backward's (autograd's device thread)"
    };
    let deepep = match s.deepep_bytes() {
        0 => String::new(),
        b => format!(
            ", DeepEP buffers {b} (its NVLink buffer by cudaMalloc and, across nodes, its RDMA buffer in NVSHMEM: the larger of its dispatch and combine configurations' size hints for {} ranks, {} SMs, tokens of {} B; csrc/legacy/config.hpp)",
            s.parallel.model_parallel.expert,
            s.parallel.deepep.as_ref().map_or(0, |d| d.sms),
            s.model.hidden * s.training.precision.compute.bytes().max(2),
            b = fmt_bytes(b)
        ),
    };
    let te = match s.training.te_workspace {
        0 => String::new(),
        b => format!(
            "; Transformer Engine's GEMMs (Megatron-Core's blocks) take one more workspace of {} at their first GEMM and four more at the first grouped GEMM of a mixture of experts, one per compute stream (transformer_engine/pytorch/cpp_extensions/gemm.py get_cublas_workspace_size_bytes, common/util/multi_stream.cpp), cached for the process",
            fmt_bytes(b)
        ),
    };
    format!(
        "capacity = device memory {} less CUDA context {} (hardware.cuda_context) and NCCL buffers {} (allocator.nccl_buffers){deepep}; cuBLAS workspaces of {} each (allocator.cublas_workspace; PyTorch's CUBLAS_WORKSPACE_CONFIG default on {}, CublasHandlePool.cpp) come from the caching allocator, one per (cuBLAS handle, stream): {threads}{te}",
        fmt_bytes(s.cluster.memory_bytes),
        fmt_bytes(s.cluster.cuda_context_bytes),
        fmt_bytes(s.nccl_bytes()),
        fmt_bytes(a.cublas_workspace),
        s.cluster.gpu.name
    )
}

fn where_(at: &Option<Instant>) -> String {
    match at {
        Some(i) => {
            let layer = i.layer.map(|l| format!(", layer {l}")).unwrap_or_default();
            format!("step {}, {}{}, `{}`", i.step, i.phase.name(), layer, i.op)
        }
        None => "no allocation".into(),
    }
}

/// The text report's lines for an OOM: stepsim's verdict and PyTorch's message.
pub fn oom_text(r: &AllocatorReport, o: &mut String) {
    let Some(d) = &r.oom else { return };
    let _ = writeln!(o, "  stepsim's verdict: {}", d.verdict);
    match &d.without_fragmentation {
        Some(w) if w.fits => {
            let _ =
                writeln!(o, "  without fragmentation (perfect packing) the run fits: try expandable_segments = true");
        }
        Some(w) => {
            let _ = writeln!(
                o,
                "  without fragmentation (perfect packing) it still runs out of memory, at {}: removing fragmentation alone will not make it fit",
                where_(&w.oom_at)
            );
        }
        None => {}
    }
    let _ = writeln!(o, "  PyTorch would raise torch.OutOfMemoryError:");
    let _ = writeln!(o, "    {}", d.pytorch_message);
}

/// The text report's allocator section.
pub fn text(r: &AllocatorReport, o: &mut String) {
    let _ = writeln!(o);
    match r.kind {
        AllocatorKind::Exact => {
            let _ = writeln!(
                o,
                "Allocator  exact live-byte accounting (allocator.kind = \"exact\"): reserved = allocated, no fragmentation"
            );
            return;
        }
        AllocatorKind::Caching => {
            let conf = if r.alloc_conf.is_empty() { " unset".to_string() } else { format!("={}", r.alloc_conf) };
            let _ = writeln!(
                o,
                "Allocator  PyTorch CUDA caching allocator, PYTORCH_CUDA_ALLOC_CONF{conf}; it may reserve {} (device less {} held outside it)",
                fmt_bytes(r.capacity.bytes),
                fmt_bytes(r.outside.total.bytes)
            );
        }
    }
    let pa = &r.at_peak_allocated;
    let tails = pa.allocated.bytes.saturating_sub(pa.live.bytes);
    let _ = writeln!(
        o,
        "           max_memory_allocated {}, max_memory_reserved {} (live tensors peak at {}{})",
        fmt_bytes(r.max_memory_allocated.bytes),
        fmt_bytes(r.max_memory_reserved.bytes),
        fmt_bytes(r.peak_live.bytes),
        if tails > 0 {
            format!(", with {} more in block tails not split off", fmt_bytes(tails))
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        o,
        "           memory in use (nvidia-smi) at the reserved peak {} = max_memory_reserved + {} held outside the allocator",
        fmt_bytes(r.nvidia_smi_peak.bytes),
        fmt_bytes(r.outside.total.bytes)
    );
    let p = &r.at_peak_reserved;
    let _ = writeln!(
        o,
        "           at the reserved peak ({}): {} reserved but unallocated, largest free block {}, {} free inside split segments",
        where_(&p.at),
        fmt_bytes(p.fragmentation.bytes),
        fmt_bytes(p.largest_free_block.bytes),
        fmt_bytes(p.inactive_split.bytes)
    );
    let ec = if r.empty_cache.is_empty() {
        String::new()
    } else {
        format!(
            ", empty_cache() calls {} ({})",
            r.num_empty_cache,
            r.empty_cache.iter().map(|e| e.name()).collect::<Vec<_>>().join(", ")
        )
    };
    let _ = writeln!(
        o,
        "           allocation retries (num_alloc_retries) {}, segments allocated {} and freed {}{ec}",
        r.num_alloc_retries, r.num_device_alloc, r.num_device_free
    );
}

/// The reserved bytes to draw above the stacked categories of `memory.png`, one value per
/// plotted time: 0 at the start, one per timeline sample, the last one repeated up to `n`
/// values. None for the exact model, whose reserved is the top of the stack.
pub fn reserved_series(r: &AllocatorReport, trace: &Trace, n: usize) -> Option<Vec<u64>> {
    if r.kind == AllocatorKind::Exact {
        return None;
    }
    let mut v = Vec::with_capacity(n);
    v.push(0);
    v.extend(trace.timeline.samples().map(|s| s.reserved));
    let last = *v.last().unwrap_or(&0);
    v.resize(n.max(1), last);
    v.truncate(n);
    Some(v)
}
