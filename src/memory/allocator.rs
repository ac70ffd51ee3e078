//! The allocator interface and the exact live-byte allocator.
//!
//! The engine calls [`Allocator::malloc`] for every tensor and [`Allocator::free`] when it
//! dies. The caching-allocator model (segments, pools, fragmentation) implements the same
//! trait; [`ExactAllocator`] counts live bytes only, rounded as PyTorch rounds every block
//! (`kMinBlockSize = 512` in `c10/cuda/CUDACachingAllocator.cpp`), so its "allocated" is
//! what `torch.cuda.memory_allocated()` would read.

/// PyTorch's minimum block size and rounding unit, bytes.
pub const PYTORCH_BLOCK: u64 = 512;

/// Why an allocation failed, with the facts PyTorch's OOM message gives.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocError {
    pub requested: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub capacity: u64,
}

/// A model of a device allocator, one per simulated GPU.
pub trait Allocator {
    /// Allocates `bytes` for the tensor with handle `id` (unique while it lives) on `stream`.
    fn malloc(&mut self, id: usize, bytes: u64, stream: usize) -> Result<(), AllocError>;
    /// Frees the tensor with handle `id`.
    fn free(&mut self, id: usize);
    /// Bytes held by live tensors (`memory_allocated`).
    fn allocated(&self) -> u64;
    /// Bytes reserved from the device (`memory_reserved`).
    fn reserved(&self) -> u64;
    /// Bytes the allocator would account for a request of `bytes`.
    fn rounded(&self, bytes: u64) -> u64;
}

/// Exact live-byte accounting: reserved equals allocated, no fragmentation.
#[derive(Debug, Clone)]
pub struct ExactAllocator {
    capacity: u64,
    allocated: u64,
    live: Vec<u64>,
}

impl ExactAllocator {
    pub fn new(capacity: u64) -> Self {
        ExactAllocator { capacity, allocated: 0, live: Vec::new() }
    }
}

impl Allocator for ExactAllocator {
    fn malloc(&mut self, id: usize, bytes: u64, _stream: usize) -> Result<(), AllocError> {
        let r = self.rounded(bytes);
        if self.allocated + r > self.capacity {
            return Err(AllocError {
                requested: r,
                allocated: self.allocated,
                reserved: self.allocated,
                capacity: self.capacity,
            });
        }
        if self.live.len() <= id {
            self.live.resize(id + 1, 0);
        }
        self.live[id] = r;
        self.allocated += r;
        Ok(())
    }
    fn free(&mut self, id: usize) {
        if let Some(b) = self.live.get_mut(id) {
            self.allocated -= *b;
            *b = 0;
        }
    }
    fn allocated(&self) -> u64 {
        self.allocated
    }
    fn reserved(&self) -> u64 {
        self.allocated
    }
    fn rounded(&self, bytes: u64) -> u64 {
        if bytes == 0 {
            0
        } else {
            bytes.div_ceil(PYTORCH_BLOCK) * PYTORCH_BLOCK
        }
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
    }

    #[test]
    fn fails_past_capacity_with_the_facts() {
        let mut a = ExactAllocator::new(2048);
        a.malloc(0, 1536, 0).unwrap();
        let e = a.malloc(1, 1000, 0).unwrap_err();
        assert_eq!(e, AllocError { requested: 1024, allocated: 1536, reserved: 1536, capacity: 2048 });
        assert_eq!(a.allocated(), 1536, "a failed malloc changes nothing");
    }
}
