//! The allocator's own record of what it did, as PyTorch keeps it under
//! `torch.cuda.memory._record_memory_history()`: every allocation, free and segment change
//! with its address, size, stream and time, and the segments and blocks at the end. It is what
//! `torch.cuda.memory._snapshot()` returns, so a simulated run can be opened in the tools
//! PyTorch users already read their real runs with (pytorch.org/memory_viz,
//! `torch.cuda._memory_viz`); [`crate::report::snapshot`] writes it in that format.
//!
//! The actions and the sizes they carry follow `record_trace` in
//! `c10/cuda/CUDACachingAllocator.cpp`: `alloc` carries the size the caller asked for (not
//! the rounded block), `free_requested` the same size when the tensor is freed,
//! `free_completed` when its block returns to the pool (at once, or once the other streams
//! that used it have passed the free), `segment_alloc` / `segment_free` each `cudaMalloc` /
//! `cudaFree`, `segment_map` / `segment_unmap` the pages of an expandable segment, `oom` the
//! failed request (rounded) with the device memory still free in its address field.

use serde::Serialize;

/// What one trace entry records (`TraceEntry::Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl Action {
    /// The name `torch.cuda.memory._snapshot()` gives the action.
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

/// No tensor: the entry is about a segment, or the tensor's id was not known.
pub const NO_TENSOR: u32 = u32::MAX;

/// One trace entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub action: Action,
    /// The block's or segment's address; for [`Action::Oom`], the bytes the device could
    /// still have given the allocator (PyTorch's `device_free`).
    pub addr: u64,
    pub size: u64,
    /// The allocator-local stream (the block's allocation stream).
    pub stream: u32,
    /// Simulated time, ns.
    pub time_ns: u64,
    /// The engine's handle of the tensor: the one allocated or freed, an OOM's request, or
    /// the request a segment was made for (`segment_alloc`, `segment_map`).
    pub tensor: u32,
}

/// A block's state in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Serving a tensor: `active_allocated`.
    Allocated,
    /// Freed, waiting on other streams' events: `active_pending_free`.
    PendingFree,
    /// Cached and free: `inactive`.
    Inactive,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::Allocated => "active_allocated",
            BlockState::PendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment at the end of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    /// The size the tensor asked for (0 for a free block).
    pub requested: u64,
    pub state: BlockState,
    /// The tensor it serves or last served ([`NO_TENSOR`] for a free block).
    pub tensor: u32,
}

/// One segment (for an expandable segment, one contiguous mapped range, as PyTorch's
/// `snapshot()` reports it) at the end of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub addr: u64,
    pub stream: u32,
    /// Small pool (`segment_type` "small").
    pub small: bool,
    pub expandable: bool,
    /// Blocks in address order, tiling the segment.
    pub blocks: Vec<Block>,
}

impl Segment {
    pub fn total_size(&self) -> u64 {
        self.blocks.iter().map(|b| b.size).sum()
    }
}

/// The allocator's settings as the snapshot's `allocator_settings` gives them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// Bytes; `u64::MAX` for unlimited.
    pub max_split_size: u64,
    pub expandable_segments: bool,
    /// One value per power-of-two interval (1 MiB, 2 MiB, ...).
    pub roundup_power2_divisions: Vec<u64>,
}

/// Everything a device's allocator recorded, and its state at the end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct History {
    pub events: Vec<Event>,
    pub segments: Vec<Segment>,
    pub settings: Settings,
    /// The bytes the allocator may reserve.
    pub capacity: u64,
}
