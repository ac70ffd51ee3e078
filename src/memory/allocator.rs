//! The allocator interface and the exact live-byte allocator.
//!
//! The engine calls [`Allocator::malloc`] for every tensor when the task that creates it
//! starts, [`Allocator::free_on`] when the task that last uses it ends (naming that task's
//! stream and the time), and [`Allocator::stream_synced`] whenever a stream's work up to a
//! time has completed, so a model of stream-ordered reuse knows when a block freed by another
//! stream may be handed out again. Two models implement the trait:
//! [`super::CachingAllocator`], PyTorch's CUDA caching allocator (segments, pools, splitting,
//! fragmentation), and [`ExactAllocator`], which counts live bytes only, rounded as PyTorch
//! rounds every block (`kMinBlockSize = 512` in `c10/cuda/CUDACachingAllocator.cpp`), so its
//! "allocated" is what `torch.cuda.memory_allocated()` would read without fragmentation.

use serde::Serialize;

/// PyTorch's minimum block size and rounding unit, bytes.
pub const PYTORCH_BLOCK: u64 = 512;

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// The live tensors plus the request exceed what the allocator may use: no allocator
    /// could serve it, and `empty_cache()` cannot help.
    LiveTensors,
    /// The request would fit in the memory not held by live tensors, but no cached free block
    /// and no new segment can hold it.
    Fragmentation,
}

/// Why an allocation failed, with the facts PyTorch's OOM message gives.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocError {
    /// The request as the allocator rounds it (`round_size`).
    pub requested: u64,
    /// Bytes of live tensors, each rounded (what the exact model counts).
    pub allocated: u64,
    /// Bytes reserved from the device after the allocator released what it could.
    pub reserved: u64,
    /// Bytes the allocator may reserve.
    pub capacity: u64,
    /// PyTorch's `memory_allocated()`: sizes of the blocks handed out.
    pub allocated_blocks: u64,
    /// What PyTorch's message says it "tried to allocate": the segment the request needed
    /// (`get_allocation_size`), not the request itself.
    pub segment: u64,
    /// The largest cached free block, of any stream.
    pub largest_free_block: u64,
    pub cause: OomCause,
}

/// The allocator's state at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub allocated: u64,
    pub allocated_blocks: u64,
    pub reserved: u64,
    pub largest_free_block: u64,
    /// Free bytes inside segments that also hold live blocks (`inactive_split_bytes`): what
    /// neither reuse of a bigger request nor `empty_cache()` can recover.
    pub inactive_split_bytes: u64,
}

/// Counters as `torch.cuda.memory_stats()` would give them (names follow PyTorch's
/// `DeviceStats`), plus snapshots at the two peaks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AllocatorStats {
    /// Live tensor bytes, each rounded by `round_size`.
    pub allocated: u64,
    pub peak_allocated: u64,
    /// `allocated_bytes`: block sizes handed out, unsplit tails included.
    pub allocated_blocks: u64,
    /// `max_memory_allocated()`.
    pub peak_allocated_blocks: u64,
    /// `reserved_bytes`: segments (or mapped pages) held from the device.
    pub reserved: u64,
    /// `max_memory_reserved()`.
    pub peak_reserved: u64,
    /// `active_bytes`: allocated blocks plus freed ones still waiting on other streams.
    pub active: u64,
    pub peak_active: u64,
    pub inactive_split_bytes: u64,
    /// Segments currently held (`segment.all.current`).
    pub segments: u64,
    /// `num_alloc_retries`: allocations that had to release the whole cache and retry.
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// `num_device_alloc` / `num_device_free`: cudaMalloc (or page map) and cudaFree calls.
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// `num_sync_all_streams`: event synchronisations (retries and empty_cache calls).
    pub num_sync_all_streams: u64,
    /// `torch.cuda.empty_cache()` calls the program made.
    pub num_empty_cache: u64,
    /// The state when `allocated` first reached its peak.
    pub at_peak_allocated: Snapshot,
    /// The state when `reserved` first reached its peak.
    pub at_peak_reserved: Snapshot,
}

/// A model of a device allocator, one per simulated GPU. `Send`: a `[jitter]` run plays its
/// ranks, each with its own allocator, on several threads between barriers
/// ([`crate::engine::by_rank`]).
pub trait Allocator: Send {
    /// Allocates `bytes` for the tensor with handle `id` (unique while it lives) on `stream`.
    fn malloc(&mut self, id: usize, bytes: u64, stream: usize) -> Result<(), AllocError>;
    /// [`Allocator::malloc`] at `now_ns` of the run: what a model that keeps a history
    /// ([`Allocator::start_history`]) stamps the entries with.
    fn malloc_at(&mut self, id: usize, bytes: u64, stream: usize, now_ns: u64) -> Result<(), AllocError> {
        let _ = now_ns;
        self.malloc(id, bytes, stream)
    }
    /// Frees the tensor with handle `id`, used on its allocation stream only.
    fn free(&mut self, id: usize);
    /// Frees `id` at `now_ns` from a task on `stream`. When that is not the stream the tensor
    /// was allocated on, the tensor counts as used there (`record_stream`): a caching model
    /// may reuse its block only once `stream` has completed its work up to `now_ns`.
    fn free_on(&mut self, id: usize, stream: usize, now_ns: u64) {
        let _ = (stream, now_ns);
        self.free(id);
    }
    /// `stream` has completed all the work it was given up to `now_ns`.
    fn stream_synced(&mut self, stream: usize, now_ns: u64) {
        let _ = (stream, now_ns);
    }
    /// `torch.cuda.empty_cache()`: returns cached, unused memory to the device.
    fn empty_cache(&mut self) {}
    /// Bytes held by live tensors, each rounded as the allocator rounds it.
    fn allocated(&self) -> u64;
    /// Bytes reserved from the device (`memory_reserved`).
    fn reserved(&self) -> u64;
    /// Bytes of blocks in use or waiting on another stream (`active_bytes`).
    fn active(&self) -> u64 {
        self.allocated()
    }
    /// `allocated`, `reserved` and `active` at once: the engine reads them after every
    /// allocation and free, so a model that has them at hand answers in one call.
    fn totals(&self) -> super::Totals {
        super::Totals { allocated: self.allocated(), reserved: self.reserved(), active: self.active() }
    }
    /// Bytes the allocator would account for a request of `bytes`.
    fn rounded(&self, bytes: u64) -> u64;
    /// [`Allocator::malloc_at`], then the bytes it accounted ([`Allocator::rounded`]) and
    /// the totals after it: what the engine records of every allocation, in one call (a
    /// pipeline's replayed periods make millions of them, and a model that rounds the
    /// request once answers without rounding it again).
    fn malloc_counted(
        &mut self,
        id: usize,
        bytes: u64,
        stream: usize,
        now_ns: u64,
    ) -> Result<(u64, super::Totals), AllocError> {
        self.malloc_at(id, bytes, stream, now_ns)?;
        Ok((self.rounded(bytes), self.totals()))
    }
    /// [`Allocator::free_on`] of the live tensor `id` of `bytes`, then the bytes it had
    /// accounted and the totals after it, as [`Allocator::malloc_counted`].
    fn free_counted(&mut self, id: usize, bytes: u64, stream: usize, now_ns: u64) -> (u64, super::Totals) {
        self.free_on(id, stream, now_ns);
        (self.rounded(bytes), self.totals())
    }
    /// The counters so far.
    fn stats(&self) -> AllocatorStats;
    /// Starts recording every allocation, free and segment change with its address
    /// (`torch.cuda.memory._record_memory_history()`); false for a model without addresses.
    fn start_history(&mut self) -> bool {
        false
    }
    /// What was recorded since [`Allocator::start_history`], with the segments as they are
    /// now (recording stops); None if nothing was.
    fn take_history(&mut self) -> Option<super::History> {
        None
    }
}

/// Exact live-byte accounting: reserved equals allocated, no fragmentation.
#[derive(Debug, Clone)]
pub struct ExactAllocator {
    capacity: u64,
    /// Each live tensor's rounded bytes (0: none).
    live: super::handles::HandleTable<u64>,
    stats: AllocatorStats,
}

impl ExactAllocator {
    pub fn new(capacity: u64) -> Self {
        ExactAllocator { capacity, live: super::handles::HandleTable::new(0), stats: AllocatorStats::default() }
    }

    fn set(&mut self, allocated: u64) {
        let s = &mut self.stats;
        s.allocated = allocated;
        s.allocated_blocks = allocated;
        s.reserved = allocated;
        s.active = allocated;
        if allocated > s.peak_allocated {
            s.peak_allocated = allocated;
            s.peak_allocated_blocks = allocated;
            s.peak_reserved = allocated;
            s.peak_active = allocated;
            let snap = Snapshot { allocated, allocated_blocks: allocated, reserved: allocated, ..Default::default() };
            s.at_peak_allocated = snap;
            s.at_peak_reserved = snap;
        }
    }
}

impl Allocator for ExactAllocator {
    fn malloc(&mut self, id: usize, bytes: u64, _stream: usize) -> Result<(), AllocError> {
        let r = self.rounded(bytes);
        let allocated = self.stats.allocated;
        if allocated + r > self.capacity {
            self.stats.num_ooms += 1;
            return Err(AllocError {
                requested: r,
                allocated,
                reserved: allocated,
                capacity: self.capacity,
                allocated_blocks: allocated,
                segment: r,
                largest_free_block: 0,
                cause: OomCause::LiveTensors,
            });
        }
        let old = std::mem::replace(self.live.slot_mut(id), r);
        self.set(allocated - old + r);
        Ok(())
    }
    fn free(&mut self, id: usize) {
        if let Some(b) = self.live.get_mut(id) {
            let freed = std::mem::take(b);
            let now = self.stats.allocated - freed;
            self.set(now);
        }
    }
    fn empty_cache(&mut self) {
        self.stats.num_empty_cache += 1;
    }
    fn allocated(&self) -> u64 {
        self.stats.allocated
    }
    fn reserved(&self) -> u64 {
        self.stats.reserved
    }
    fn rounded(&self, bytes: u64) -> u64 {
        if bytes == 0 {
            0
        } else {
            bytes.div_ceil(PYTORCH_BLOCK) * PYTORCH_BLOCK
        }
    }
    fn stats(&self) -> AllocatorStats {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_512_and_frees_exactly() {
        let mut a = ExactAllocator::new(4096);
        a.malloc(0, 1, 0).unwrap();
        assert_eq!(a.allocated(), 512);
        a.malloc(1, 513, 0).unwrap();
        assert_eq!(a.allocated(), 512 + 1024);
        a.free(0);
        assert_eq!(a.allocated(), 1024);
        a.free(0);
        assert_eq!(a.allocated(), 1024, "double free must not go negative");
        assert_eq!(a.stats().peak_allocated, 1536);
        assert_eq!(a.reserved(), a.allocated());
    }

    #[test]
    fn fails_past_capacity_with_the_facts() {
        let mut a = ExactAllocator::new(2048);
        a.malloc(0, 1536, 0).unwrap();
        let e = a.malloc(1, 1000, 0).unwrap_err();
        assert_eq!(
            e,
            AllocError {
                requested: 1024,
                allocated: 1536,
                reserved: 1536,
                capacity: 2048,
                allocated_blocks: 1536,
                segment: 1024,
                largest_free_block: 0,
                cause: OomCause::LiveTensors,
            }
        );
        assert_eq!(a.allocated(), 1536, "a failed malloc changes nothing");
    }
}
