//! A model of PyTorch's CUDA caching allocator (the "native" backend), one per simulated GPU.
//!
//! Read from `c10/cuda/CUDACachingAllocator.cpp` at pytorch/pytorch commit
//! `001074d25084fdb87a799823e395a50f5ec044d3` and the allocator options in
//! `c10/core/AllocatorConfig.cpp` (commit `065861fb`); summarised in
//! `shared/reference/SEMANTICS.md` sections 1.1 to 1.14. The rules are re-derived here, not
//! copied, and each item below names the function it follows:
//!
//! - **Rounding** ([`round_size`], `round_size` / `roundup_power2_next_division`): every request
//!   is rounded up to a multiple of `kMinBlockSize` = 512 B; with `roundup_power2_divisions`
//!   set for the request's power-of-two interval (16 intervals from 1 MiB to 64 GiB,
//!   `AllocatorConfig::roundup_power2_divisions`), to the next of that many equal steps
//!   between two powers of two.
//! - **Pools** (`get_pool`): rounded requests up to `kSmallSize` = 1 MiB go to the small pool,
//!   larger ones to the large pool. Free blocks are kept per pool ordered by (stream, size,
//!   address) (`BlockComparatorSize`): **a block freed on one stream is only ever reused by
//!   requests on the same stream**.
//! - **Segment size** ([`allocation_size`], `get_allocation_size`): a new segment (`cudaMalloc`)
//!   for a small request is `kSmallBuffer` = 2 MiB; for a request under `kMinLargeAlloc` =
//!   10 MiB it is `kLargeBuffer` = 20 MiB; otherwise the request rounded up to `kRoundLarge` =
//!   2 MiB.
//! - **Best fit** (`get_free_block`): the smallest cached free block of the same pool and
//!   stream that is at least the request; with `max_split_size_mb`, an oversize block
//!   (>= max_split_size) is not handed to a smaller request, and an oversize request takes a
//!   cached block only if it is less than `kLargeBuffer` = 20 MiB larger.
//! - **Splitting** (`should_split`, `alloc_found_block`): the front of the block serves the
//!   request; the remainder is split off as a free block when, in the small pool (or with
//!   expandable segments), it is at least 512 B, and in the large pool when it is more than
//!   `kSmallSize` = 1 MiB *and* the request is under max_split_size. Otherwise the whole block
//!   is handed out, and its tail counts in `memory_allocated()`.
//! - **Free and coalescing** (`free`, `free_block`, `try_merge_blocks`): `allocated` drops at
//!   once; the block merges with free neighbours of the same segment (never across segments)
//!   and returns to its pool.
//! - **Stream-ordered reuse** (`recordStream`, `insert_events`, `process_events`): a block used
//!   on another stream than its allocation stream is, when freed, held back until an event
//!   recorded on each such stream completes; completed events are collected at the start of
//!   every `malloc` (and by `synchronize_and_free_events`).
//! - **Free and retry** (`malloc`, `alloc_block`, `release_available_cached_blocks`,
//!   `release_cached_blocks`): when no cached block fits, a new segment is allocated if the
//!   device has room; else, with max_split_size set, cached oversize blocks are freed and the
//!   allocation retried; else all events are synchronised, every cached block that is a whole
//!   segment is returned to the device, and the allocation is retried, counting one
//!   `num_alloc_retries`. If that fails too, the allocation is an OOM.
//! - **`empty_cache()`** (`emptyCache` = `release_cached_blocks`): the same release, at a point
//!   the program names; live tensors and split segments stay.
//! - **Expandable segments** (Note [Expandable Segments], `find_expandable_block`, `map_block`,
//!   `try_allocate_expandable_block`, `unmap_block`, `release_expandable_segment`): one segment
//!   per (stream, pool) reserves address space for 1 1/8 of the device and maps physical pages
//!   of 2 MiB (small pool) or 20 MiB (large pool) on demand at the lowest address that fits, so
//!   free blocks merge across what would have been separate segments. Releasing unmaps the
//!   pages that lie wholly inside free blocks.
//!
//! Not modelled: CUDA graph private pools, `garbage_collection_threshold` (it needs a memory
//! fraction), the time a retry's device synchronisation or `cudaFree` takes, and
//! `release_available_cached_blocks` under expandable segments (PyTorch asserts there).
//!
//! Two byte counts are kept apart: `allocated()` is the live tensors, each rounded by
//! `round_size` (what PyTorch's memory trackers count, and what [`super::ExactAllocator`]
//! reports); [`AllocatorStats::allocated_blocks`] is PyTorch's `memory_allocated()`, the sizes
//! of the blocks handed out, which also holds the tails `should_split` did not split off.

use std::collections::{BTreeMap, VecDeque};

use super::allocator::{AllocError, Allocator, AllocatorStats, OomCause, Snapshot};
use super::handles::HandleTable;
use super::history::{self, Action, BlockState, Event, History, NO_TENSOR};
use super::Totals;

/// `kMinBlockSize`: all sizes are rounded to at least this.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: the largest request served from the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: the segment size of the small pool (and its expandable page size).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kMinLargeAlloc`: requests under this (and over 1 MiB) get a `kLargeBuffer` segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kLargeBuffer`: large-pool segment for 1-10 MiB requests, expandable page size of the
/// large pool, the smallest allowed `max_split_size_mb` and the oversize rounding limit.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kRoundLarge`: larger requests get a segment rounded up to this.
pub const ROUND_LARGE: u64 = 2 << 20;
/// `kRoundUpPowerOfTwoIntervals` in `AllocatorConfig.cpp`: 1 MiB, 2 MiB, ... 32 GiB and up.
pub const ROUNDUP_INTERVALS: usize = 16;

const NIL: u32 = u32::MAX;
const MIB: u64 = 1 << 20;

/// The allocator's settings: `PYTORCH_CUDA_ALLOC_CONF` and the memory it may use.
#[derive(Debug, Clone, PartialEq)]
pub struct CachingConfig {
    /// Bytes the allocator may reserve from the device: device memory less everything held
    /// outside it (CUDA context, NCCL, cuBLAS). A segment that would pass this fails.
    pub capacity: u64,
    /// Device memory (`totalGlobalMem`): sizes the address space of an expandable segment.
    pub device_total: u64,
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
    /// `max_split_size_mb` in bytes; `u64::MAX` (the default) means unlimited.
    pub max_split_size: u64,
    /// `roundup_power2_divisions` for each power-of-two interval (index 0: under 2 MiB, 15:
    /// 32 GiB and up); 0 or 1 = off (the default).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
}

impl CachingConfig {
    /// PyTorch's defaults for a device whose allocator may reserve `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        CachingConfig {
            capacity,
            device_total: capacity,
            expandable_segments: false,
            max_split_size: u64::MAX,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
        }
    }
}

/// The number of divisions configured for the power-of-two interval of `size`
/// (`AllocatorConfig::roundup_power2_divisions(size)`).
fn divisions_for(size: u64, cfg: &CachingConfig) -> u64 {
    let log = 63 - u64::from(size.max(1).leading_zeros());
    let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS as u64 - 1);
    cfg.roundup_power2_divisions[index as usize]
}

/// `roundup_power2_next_division`: `size` rounded up to the next of `divisions` equal steps
/// between the powers of two around it (1200 with 4 divisions: 1280).
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.max(1).leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down + step
    }
}

/// `round_size`: the block size a request of `size` bytes is served with.
pub fn round_size(size: u64, cfg: &CachingConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = divisions_for(size, cfg);
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        roundup_power2_next_division(size, d)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// `get_allocation_size`: the segment a rounded request gets when nothing cached fits.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In its pool's free set.
    Free,
    /// Out of the pool: serving a tensor, or just taken to serve one.
    Taken,
    /// Freed, waiting for end-of-use events on other streams.
    Pending,
    /// Address space of an expandable segment with no physical pages behind it.
    Unmapped,
}

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    prev: u32,
    next: u32,
    seg: u32,
    pool: u32,
    state: State,
    /// Outstanding end-of-use events.
    events: u32,
    /// Streams other than the allocation stream that used the block (bit i: stream i).
    uses: u64,
    /// `round_size` of the request the block serves while it is taken.
    requested: u64,
}

#[derive(Debug, Clone)]
struct Segment {
    base: u64,
    /// The `cudaMalloc` size, or the address space an expandable segment reserves.
    size: u64,
    /// Page size of an expandable segment; 0 for a plain segment.
    page: u64,
    alive: bool,
}

/// A pool's free mapped blocks ordered by (size, address), the order of PyTorch's
/// `BlockComparatorSize`: best fit is the first block at or after (request, 0), ties going
/// to the lower address. Not a B-tree: the blocks sit in [`SIZE_CLASSES`] size classes
/// (four per power of two, in size order), each a short sorted vector, with a bitmap of the
/// classes that hold any. Every malloc and free searches and updates this set, the
/// allocator's hottest path: a class holds few blocks, so a search reads a cache line or two
/// and an insertion moves a few entries, where a B-tree walks nodes and allocates them and
/// one sorted vector per pool (of tens to hundreds of blocks) misses the cache at every
/// step of its search.
#[derive(Debug, Clone, Default)]
struct FreeSet {
    /// Empty until the first insertion, then one per size class.
    classes: Vec<SizeClass>,
    /// Bit c: class c holds a block.
    nonempty: [u64; SIZE_CLASSES / 64],
    len: usize,
}

/// The free blocks of one size class, sorted by key: one vector of (key, block), so that
/// an insertion or removal moves one run of entries, not a run of keys and one of blocks.
#[derive(Debug, Clone, Default)]
struct SizeClass {
    entries: Vec<FreeEntry>,
}

#[derive(Debug, Clone, Copy)]
struct FreeEntry {
    /// (size << 64 | address), sorted and unique: one integer compare per search step.
    key: u128,
    block: u32,
}

impl SizeClass {
    fn search(&self, key: u128) -> Result<usize, usize> {
        self.entries.binary_search_by(|e| e.key.cmp(&key))
    }
}

const SIZE_CLASSES: usize = 256;

/// The size class of `size`: the power of two and the next two bits, so the classes are in
/// size order.
fn size_class(size: u64) -> usize {
    if size < 4 {
        return size as usize;
    }
    let lg = 63 - size.leading_zeros() as usize;
    lg * 4 + ((size >> (lg - 2)) & 3) as usize
}

fn free_key((size, addr): (u64, u64)) -> u128 {
    u128::from(size) << 64 | u128::from(addr)
}

/// A block's place in a [`FreeSet`]: (size class, index in the class).
type FreePos = (usize, usize);

impl FreeSet {
    fn find(&self, key: (u64, u64)) -> Option<(usize, Result<usize, usize>)> {
        let c = size_class(key.0);
        Some((c, self.classes.get(c)?.search(free_key(key))))
    }

    fn insert(&mut self, key: (u64, u64), b: u32) {
        if self.classes.is_empty() {
            self.classes.resize_with(SIZE_CLASSES, SizeClass::default);
        }
        let c = size_class(key.0);
        let class = &mut self.classes[c];
        match class.search(free_key(key)) {
            Ok(i) => class.entries[i].block = b,
            Err(i) => {
                class.entries.insert(i, FreeEntry { key: free_key(key), block: b });
                self.nonempty[c / 64] |= 1 << (c % 64);
                self.len += 1;
            }
        }
    }

    fn remove(&mut self, key: (u64, u64)) {
        if let Some((c, Ok(i))) = self.find(key) {
            self.remove_at((c, i));
        }
    }

    fn get(&self, key: (u64, u64)) -> Option<u32> {
        match self.find(key)? {
            (c, Ok(i)) => Some(self.classes[c].entries[i].block),
            _ => None,
        }
    }

    /// The first class from `c` on that holds a block.
    fn next_nonempty(&self, c: usize) -> Option<usize> {
        let mut w = c / 64;
        let mut bits = *self.nonempty.get(w)? & (u64::MAX << (c % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *self.nonempty.get(w)?;
        }
    }

    /// The best fit for `size` bytes: the first block of at least that size, with its place.
    fn first_at_least(&self, size: u64) -> Option<(FreePos, u32)> {
        let c = size_class(size);
        if let Some(class) = self.classes.get(c) {
            let i = class.entries.partition_point(|e| e.key < free_key((size, 0)));
            if let Some(e) = class.entries.get(i) {
                return Some(((c, i), e.block));
            }
        }
        self.first_from(c + 1)
    }

    /// The block after the one at `pos`, in (size, address) order.
    fn after(&self, (c, i): FreePos) -> Option<(FreePos, u32)> {
        match self.classes[c].entries.get(i + 1) {
            Some(e) => Some(((c, i + 1), e.block)),
            None => self.first_from(c + 1),
        }
    }

    /// The first block of the classes from `c` on.
    fn first_from(&self, c: usize) -> Option<(FreePos, u32)> {
        let c = self.next_nonempty(c)?;
        Some(((c, 0), self.classes[c].entries[0].block))
    }

    /// Removes the block at `pos` (from [`FreeSet::at_least`]).
    fn remove_at(&mut self, (c, i): FreePos) {
        let class = &mut self.classes[c];
        class.entries.remove(i);
        if class.entries.is_empty() {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        self.len -= 1;
    }

    /// Every block, smallest first.
    fn blocks(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.classes.iter().flat_map(|class| class.entries.iter().map(|e| e.block))
    }

    fn largest_size(&self) -> Option<u64> {
        let c = (0..self.nonempty.len())
            .rev()
            .find(|&w| self.nonempty[w] != 0)
            .map(|w| w * 64 + 63 - self.nonempty[w].leading_zeros() as usize)?;
        self.classes[c].entries.last().map(|e| (e.key >> 64) as u64)
    }

    fn len(&self) -> usize {
        self.len
    }
}

#[derive(Debug, Clone, Default)]
struct Pool {
    /// Free mapped blocks by (size, address).
    free: FreeSet,
    /// Unmapped blocks of expandable segments by address.
    unmapped: BTreeMap<u64, u32>,
}

/// One segment as a snapshot shows it (`torch.cuda.memory_snapshot()`), for tests and reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub stream: usize,
    pub small: bool,
    pub expandable: bool,
    /// Mapped (reserved) bytes of the segment.
    pub reserved: u64,
    /// (size, allocated) of each mapped block, in address order.
    pub blocks: Vec<(u64, bool)>,
}

/// What [`CachingAllocator::start_history`] records: the trace so far, the time of the call
/// being served, and per block index the request and tensor of the block while it serves one.
#[derive(Debug, Clone, Default)]
struct Recorder {
    now: u64,
    /// The tensor whose `malloc` is being served: a segment it makes is its doing.
    serving: u32,
    events: Vec<Event>,
    requested: Vec<u64>,
    tensor: Vec<u32>,
}

/// The caching allocator of one GPU. See the module documentation for the rules.
#[derive(Debug, Clone)]
pub struct CachingAllocator {
    cfg: CachingConfig,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    segments: Vec<Segment>,
    /// Index: stream * 2 + (small pool as usize).
    pools: Vec<Pool>,
    /// Tensor id -> its block (NIL: not live).
    live: HandleTable<u32>,
    /// Per stream: (time the event was recorded, block), in recording order.
    events: Vec<VecDeque<(u64, u32)>>,
    /// Per stream: all work enqueued up to this time has completed.
    synced: Vec<u64>,
    pending_events: usize,
    next_addr: u64,
    stats: AllocatorStats,
    /// The history being recorded, if any (boxed: a run that records none pays one pointer).
    history: Option<Box<Recorder>>,
}

impl CachingAllocator {
    pub fn new(cfg: CachingConfig) -> Self {
        CachingAllocator {
            cfg,
            blocks: Vec::new(),
            spare: Vec::new(),
            segments: Vec::new(),
            pools: Vec::new(),
            live: HandleTable::new(NIL),
            events: Vec::new(),
            synced: Vec::new(),
            pending_events: 0,
            // Segments start at a 2 MiB boundary above zero, like device addresses.
            next_addr: ROUND_LARGE,
            stats: AllocatorStats::default(),
            history: None,
        }
    }

    pub fn config(&self) -> &CachingConfig {
        &self.cfg
    }

    /// Appends a trace entry if a history is being recorded.
    fn record(&mut self, action: Action, addr: u64, size: u64, pool: u32, tensor: u32) {
        if let Some(h) = self.history.as_mut() {
            let stream = Self::stream_of(pool) as u32;
            h.events.push(Event { action, addr, size, stream, time_ns: h.now, tensor });
        }
    }

    /// The request and tensor block `b` serves, as the history knows them.
    fn served_by(&self, b: u32) -> (u64, u32) {
        match self.history.as_deref() {
            Some(h) => (
                h.requested.get(b as usize).copied().unwrap_or(0),
                h.tensor.get(b as usize).copied().unwrap_or(NO_TENSOR),
            ),
            None => (0, NO_TENSOR),
        }
    }

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.spare.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    fn drop_block(&mut self, i: u32) {
        self.blocks[i as usize].state = State::Unmapped;
        self.blocks[i as usize].size = 0;
        self.spare.push(i);
    }

    fn pool_index(stream: usize, small: bool) -> u32 {
        (stream * 2 + small as usize) as u32
    }

    fn pool_mut(&mut self, p: u32) -> &mut Pool {
        let p = p as usize;
        if self.pools.len() <= p {
            self.pools.resize_with(p + 1, Pool::default);
        }
        &mut self.pools[p]
    }

    fn is_small(pool: u32) -> bool {
        pool % 2 == 1
    }

    fn stream_of(pool: u32) -> usize {
        (pool / 2) as usize
    }

    fn expandable(&self, b: u32) -> bool {
        // Only `expandable_segments` makes such segments: without it, no lookup.
        self.cfg.expandable_segments && self.segments[self.blocks[b as usize].seg as usize].page > 0
    }

    fn is_split(&self, b: u32) -> bool {
        let bl = &self.blocks[b as usize];
        bl.prev != NIL || bl.next != NIL
    }

    fn insert_free(&mut self, b: u32) {
        let (addr, size, pool) = {
            let bl = &mut self.blocks[b as usize];
            bl.state = State::Free;
            (bl.addr, bl.size, bl.pool)
        };
        self.pool_mut(pool).free.insert((size, addr), b);
    }

    fn remove_free(&mut self, b: u32) {
        let bl = &self.blocks[b as usize];
        let key = (bl.size, bl.addr);
        let pool = bl.pool;
        self.pool_mut(pool).free.remove(key);
    }

    /// `process_events`: blocks whose end-of-use events have completed return to their pool.
    fn process_events(&mut self) {
        if self.pending_events == 0 {
            return;
        }
        for s in 0..self.events.len() {
            while let Some(&(t, b)) = self.events[s].front() {
                if self.synced[s] < t {
                    break;
                }
                self.events[s].pop_front();
                self.pending_events -= 1;
                self.event_done(b);
            }
        }
    }

    fn event_done(&mut self, b: u32) {
        let bl = &mut self.blocks[b as usize];
        bl.events -= 1;
        if bl.events == 0 {
            self.free_block(b);
        }
    }

    /// `synchronize_and_free_events`: waits for every outstanding event.
    fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        for s in 0..self.events.len() {
            while let Some((_, b)) = self.events[s].pop_front() {
                self.pending_events -= 1;
                self.event_done(b);
            }
        }
    }

    /// The best-fitting free block of `pool` for `size` bytes, and its position in the
    /// pool's free set.
    fn best_fit(&self, pool: u32, size: u64) -> Option<(FreePos, u32)> {
        let p = self.pools.get(pool as usize)?;
        let (mut at, mut cand) = p.free.first_at_least(size)?;
        if self.expandable(cand) {
            // Best fit counts a block's unmapped tail as room it can grow into, so prefer a
            // later (larger) block that has less of it over the segment's growing end.
            let room = |b: u32| {
                let bl = &self.blocks[b as usize];
                let tail = if bl.next != NIL && self.blocks[bl.next as usize].state == State::Unmapped {
                    self.blocks[bl.next as usize].size
                } else {
                    0
                };
                bl.size + tail
            };
            while let Some((i, next)) = p.free.after(at) {
                if self.expandable(next) && room(next) < room(cand) {
                    (at, cand) = (i, next);
                } else {
                    break;
                }
            }
        }
        Some((at, cand))
    }

    /// `get_free_block`: best fit in the pool of the request's stream.
    fn get_free_block(&mut self, pool: u32, size: u64) -> Option<u32> {
        let (at, cand) = self.best_fit(pool, size)?;
        let csize = self.blocks[cand as usize].size;
        let max_split = self.cfg.max_split_size;
        // Do not hand an oversize block to a normal request...
        if size < max_split && csize >= max_split {
            return None;
        }
        // ... and round an oversize request up by at most kLargeBuffer.
        if size >= max_split && csize >= size.saturating_add(LARGE_BUFFER) {
            return None;
        }
        self.pools[pool as usize].free.remove_at(at);
        self.blocks[cand as usize].state = State::Taken;
        Some(cand)
    }

    /// `should_split`.
    fn should_split(&self, b: u32, size: u64) -> bool {
        let bl = &self.blocks[b as usize];
        let remaining = bl.size - size;
        if Self::is_small(bl.pool) || self.cfg.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.cfg.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `alloc_found_block`: takes `size` bytes off the front of `b`, splitting if told to.
    fn alloc_found_block(&mut self, b: u32, size: u64, split: bool) -> u32 {
        let already_split = self.is_split(b);
        let expandable = self.expandable(b);
        let block = if split {
            let rem = b;
            let (addr, prev, seg, pool) = {
                let r = &self.blocks[rem as usize];
                (r.addr, r.prev, r.seg, r.pool)
            };
            let nb = self.new_block(Block {
                addr,
                size,
                prev,
                next: rem,
                seg,
                pool,
                state: State::Taken,
                events: 0,
                uses: 0,
                requested: 0,
            });
            if prev != NIL {
                self.blocks[prev as usize].next = nb;
            }
            {
                let r = &mut self.blocks[rem as usize];
                r.prev = nb;
                r.addr += size;
                r.size -= size;
            }
            self.insert_free(rem);
            if !expandable {
                if already_split {
                    self.stats.inactive_split_bytes -= size;
                } else {
                    self.stats.inactive_split_bytes += self.blocks[rem as usize].size;
                }
            }
            nb
        } else {
            if already_split && !expandable {
                self.stats.inactive_split_bytes -= self.blocks[b as usize].size;
            }
            b
        };
        let bsize = self.blocks[block as usize].size;
        self.stats.allocated_blocks += bsize;
        self.stats.active += bsize;
        block
    }

    /// `alloc_block`: a new segment of `alloc_size` (or, with expandable segments, `size`
    /// more mapped bytes) if the device has room.
    fn alloc_block(&mut self, pool: u32, size: u64, alloc_size: u64, retry: bool) -> Option<u32> {
        if retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.cfg.expandable_segments {
            return self.try_allocate_expandable_block(pool, size);
        }
        if self.stats.reserved + alloc_size > self.cfg.capacity {
            return None;
        }
        let seg = self.segments.len() as u32;
        let base = self.next_addr;
        self.next_addr += alloc_size.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        self.segments.push(Segment { base, size: alloc_size, page: 0, alive: true });
        let by = self.history.as_deref().map_or(NO_TENSOR, |h| h.serving);
        self.record(Action::SegmentAlloc, base, alloc_size, pool, by);
        self.stats.reserved += alloc_size;
        self.stats.num_device_alloc += 1;
        self.stats.segments += 1;
        Some(self.new_block(Block {
            addr: base,
            size: alloc_size,
            prev: NIL,
            next: NIL,
            seg,
            pool,
            state: State::Taken,
            events: 0,
            uses: 0,
            requested: 0,
        }))
    }

    /// `try_merge_blocks`: merges free `src` into `dst` if both are free (or both unmapped);
    /// returns the bytes absorbed.
    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = self.blocks[src as usize].clone();
        let dst_mapped = self.blocks[dst as usize].state != State::Unmapped;
        let ok = match s.state {
            State::Free => dst_mapped,
            State::Unmapped => !dst_mapped,
            State::Taken | State::Pending => false,
        };
        if !ok {
            return 0;
        }
        if s.state == State::Free {
            self.remove_free(src);
        } else {
            self.pool_mut(s.pool).unmapped.remove(&s.addr);
        }
        let d = &mut self.blocks[dst as usize];
        if d.prev == src {
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.blocks[s.prev as usize].next = dst;
            }
        } else {
            d.next = s.next;
            if s.next != NIL {
                self.blocks[s.next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s.size;
        self.drop_block(src);
        s.size
    }

    /// `free_block`: merges a released block with its free neighbours and caches it.
    fn free_block(&mut self, b: u32) {
        if self.history.is_some() {
            let (requested, tensor) = self.served_by(b);
            let (addr, pool) = (self.blocks[b as usize].addr, self.blocks[b as usize].pool);
            self.record(Action::FreeCompleted, addr, requested, pool, tensor);
        }
        let original = self.blocks[b as usize].size;
        let expandable = self.expandable(b);
        let mut net: i64 = 0;
        let (prev, next) = (self.blocks[b as usize].prev, self.blocks[b as usize].next);
        for cand in [prev, next] {
            let absorbed = self.try_merge(b, cand);
            net -= absorbed as i64;
        }
        self.insert_free(b);
        if self.is_split(b) {
            net += self.blocks[b as usize].size as i64;
        }
        if !expandable {
            self.stats.inactive_split_bytes = (self.stats.inactive_split_bytes as i64 + net) as u64;
        }
        self.stats.active -= original;
    }

    /// `release_block`: returns a cached whole segment to the device.
    fn release_block(&mut self, b: u32) {
        let (seg, size) = (self.blocks[b as usize].seg, self.blocks[b as usize].size);
        let (addr, pool) = (self.blocks[b as usize].addr, self.blocks[b as usize].pool);
        self.record(Action::SegmentFree, addr, size, pool, NO_TENSOR);
        self.remove_free(b);
        self.segments[seg as usize].alive = false;
        self.stats.reserved -= size;
        self.stats.num_device_free += 1;
        self.stats.segments -= 1;
        self.drop_block(b);
    }

    /// `release_available_cached_blocks`: with max_split_size set, frees cached oversize
    /// blocks of the request's pool (one big enough, else the largest ones until enough).
    fn release_available_cached_blocks(&mut self, pool: u32, size: u64) -> bool {
        let max_split = self.cfg.max_split_size;
        if max_split == u64::MAX || self.cfg.expandable_segments {
            return false;
        }
        let key = size.max(max_split);
        let Some(p) = self.pools.get(pool as usize) else { return false };
        let fit = p.free.first_at_least(key).map(|(_, b)| b);
        if let Some(b) = fit {
            if !self.is_split(b) {
                self.release_block(b);
                return true;
            }
            return false;
        }
        let candidates: Vec<u32> = p.free.blocks().rev().collect();
        let mut released = 0;
        for b in candidates {
            if released >= key || self.blocks[b as usize].size < max_split {
                break;
            }
            if self.is_split(b) {
                continue;
            }
            released += self.blocks[b as usize].size;
            self.release_block(b);
        }
        released >= key
    }

    /// `release_cached_blocks` (`torch.cuda.empty_cache()`): synchronises outstanding
    /// events, frees every cached block that is a whole segment and unmaps the free pages of
    /// expandable segments.
    fn release_cached_blocks(&mut self) {
        self.synchronize_and_free_events();
        // Pool by pool in index order (PyTorch walks its large pool, then its small one, each
        // ordered by stream); the order does not change what is released.
        for p in 0..self.pools.len() {
            let blocks: Vec<u32> = self.pools[p].free.blocks().collect();
            let mut to_unmap = Vec::new();
            for b in blocks {
                if self.expandable(b) {
                    to_unmap.push(b);
                } else if !self.is_split(b) {
                    self.release_block(b);
                }
            }
            for b in to_unmap {
                if self.blocks[b as usize].state != State::Free {
                    continue; // merged into an earlier unmapped neighbour
                }
                self.unmap_block(b);
            }
        }
    }

    /// `find_expandable_block`: the lowest-addressed free-and-unmapped run of the pool with
    /// room for `size`, or the address space of a new expandable segment.
    fn find_expandable_block(&mut self, pool: u32, size: u64) -> u32 {
        let allocatable =
            |s: &Self, b: u32| b != NIL && matches!(s.blocks[b as usize].state, State::Free | State::Unmapped);
        let unmapped: Vec<u32> =
            self.pools.get(pool as usize).map(|p| p.unmapped.values().copied().collect()).unwrap_or_default();
        for c in unmapped {
            let mut cand = c;
            let prev = self.blocks[c as usize].prev;
            if allocatable(self, prev) {
                cand = prev;
            }
            let mut bytes = 0;
            let mut b = cand;
            while bytes < size && allocatable(self, b) {
                bytes += self.blocks[b as usize].size;
                b = self.blocks[b as usize].next;
            }
            if bytes >= size {
                return cand;
            }
        }
        let page = if Self::is_small(pool) { SMALL_BUFFER } else { LARGE_BUFFER };
        // 1 1/8 of the device's memory (capped so that addresses cannot overflow).
        let total = self.cfg.device_total.min(1 << 50);
        let va = (total + total / 8).div_ceil(page).max(1) * page;
        let seg = self.segments.len() as u32;
        let base = self.next_addr.div_ceil(page) * page;
        self.next_addr = base + va;
        self.segments.push(Segment { base, size: va, page, alive: true });
        let b = self.new_block(Block {
            addr: base,
            size: va,
            prev: NIL,
            next: NIL,
            seg,
            pool,
            state: State::Unmapped,
            events: 0,
            uses: 0,
            requested: 0,
        });
        self.pool_mut(pool).unmapped.insert(base, b);
        b
    }

    /// `map_block`: backs the first `size` bytes of unmapped `b` with whole pages.
    fn map_block(&mut self, b: u32, size: u64) -> bool {
        let (addr, bsize, seg, pool) = {
            let bl = &self.blocks[b as usize];
            (bl.addr, bl.size, bl.seg, bl.pool)
        };
        let s = &self.segments[seg as usize];
        let rel = addr - s.base;
        let mapped = (rel + size).div_ceil(s.page) * s.page - rel;
        if mapped == 0 || self.stats.reserved + mapped > self.cfg.capacity {
            return false;
        }
        self.pool_mut(pool).unmapped.remove(&addr);
        if mapped < bsize {
            let next = self.blocks[b as usize].next;
            let rest = self.new_block(Block {
                addr: addr + mapped,
                size: bsize - mapped,
                prev: b,
                next,
                seg,
                pool,
                state: State::Unmapped,
                events: 0,
                uses: 0,
                requested: 0,
            });
            if next != NIL {
                self.blocks[next as usize].prev = rest;
            }
            self.blocks[b as usize].next = rest;
            self.blocks[b as usize].size = mapped;
            self.pool_mut(pool).unmapped.insert(addr + mapped, rest);
        }
        self.blocks[b as usize].state = State::Free;
        let (prev, next) = (self.blocks[b as usize].prev, self.blocks[b as usize].next);
        self.try_merge(b, prev);
        self.try_merge(b, next);
        self.insert_free(b);
        let by = self.history.as_deref().map_or(NO_TENSOR, |h| h.serving);
        self.record(Action::SegmentMap, addr, mapped, pool, by);
        self.stats.reserved += mapped;
        self.stats.num_device_alloc += 1;
        true
    }

    /// `try_allocate_expandable_block`.
    fn try_allocate_expandable_block(&mut self, pool: u32, size: u64) -> Option<u32> {
        let mut cand = self.find_expandable_block(pool, size);
        if self.blocks[cand as usize].state == State::Unmapped {
            let s = self.blocks[cand as usize].size.min(size);
            if !self.map_block(cand, s) {
                return None;
            }
        }
        while self.blocks[cand as usize].size < size {
            let remaining = size - self.blocks[cand as usize].size;
            let next = self.blocks[cand as usize].next;
            if next == NIL {
                // The request is larger than the segment's whole virtual range (the device):
                // nothing to map it into, an out-of-memory like cudaMalloc's.
                return None;
            }
            let s = self.blocks[next as usize].size.min(remaining);
            if !self.map_block(next, s) {
                return None;
            }
            cand = next;
        }
        self.remove_free(cand);
        self.blocks[cand as usize].state = State::Taken;
        Some(cand)
    }

    /// A free block between `prev` and `next` (the caller links the neighbours to it), put
    /// in its pool's free set.
    fn free_piece(&mut self, addr: u64, size: u64, prev: u32, next: u32, seg: u32, pool: u32) -> u32 {
        let nb = self.new_block(Block {
            addr,
            size,
            prev,
            next,
            seg,
            pool,
            state: State::Free,
            events: 0,
            uses: 0,
            requested: 0,
        });
        self.insert_free(nb);
        nb
    }

    /// `unmap_block`: returns the pages lying wholly inside free block `b` to the device.
    fn unmap_block(&mut self, b: u32) {
        let (addr, size, seg, pool, prev, next) = {
            let bl = &self.blocks[b as usize];
            (bl.addr, bl.size, bl.seg, bl.pool, bl.prev, bl.next)
        };
        let s = &self.segments[seg as usize];
        let (base, page) = (s.base, s.page);
        let first = (addr - base).div_ceil(page);
        let last = (addr + size - base) / page;
        if first >= last {
            return;
        }
        let start = base + first * page;
        let len = (last - first) * page;
        self.remove_free(b);
        let before = start - addr;
        if before > 0 {
            let nb = self.free_piece(addr, before, prev, b, seg, pool);
            if prev != NIL {
                self.blocks[prev as usize].next = nb;
            }
            self.blocks[b as usize].prev = nb;
        }
        let after = size - before - len;
        if after > 0 {
            let nb = self.free_piece(start + len, after, b, next, seg, pool);
            if next != NIL {
                self.blocks[next as usize].prev = nb;
            }
            self.blocks[b as usize].next = nb;
        }
        {
            let bl = &mut self.blocks[b as usize];
            bl.addr = start;
            bl.size = len;
            bl.state = State::Unmapped;
        }
        let (p2, n2) = (self.blocks[b as usize].prev, self.blocks[b as usize].next);
        self.try_merge(b, p2);
        self.try_merge(b, n2);
        let a = self.blocks[b as usize].addr;
        self.pool_mut(pool).unmapped.insert(a, b);
        self.record(Action::SegmentUnmap, start, len, pool, NO_TENSOR);
        self.stats.reserved -= len;
        self.stats.num_device_free += 1;
        if !self.is_split(b) {
            // `release_expandable_segment`: nothing of the segment is mapped any more.
            self.pool_mut(pool).unmapped.remove(&a);
            self.segments[seg as usize].alive = false;
            self.drop_block(b);
        }
    }

    /// The largest cached free block of any pool and stream (`cacheInfo`).
    pub fn largest_free_block(&self) -> u64 {
        self.pools.iter().filter_map(|p| p.free.largest_size()).max().unwrap_or(0)
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            allocated: self.stats.allocated,
            allocated_blocks: self.stats.allocated_blocks,
            reserved: self.stats.reserved,
            largest_free_block: self.largest_free_block(),
            inactive_split_bytes: self.stats.inactive_split_bytes,
        }
    }

    fn update_peaks(&mut self) {
        let s = &mut self.stats;
        s.peak_allocated_blocks = s.peak_allocated_blocks.max(s.allocated_blocks);
        s.peak_active = s.peak_active.max(s.active);
        let new_allocated = s.allocated > s.peak_allocated;
        let new_reserved = s.reserved > s.peak_reserved;
        if new_allocated || new_reserved {
            let snap = self.snapshot();
            let s = &mut self.stats;
            if new_allocated {
                s.peak_allocated = s.allocated;
                s.at_peak_allocated = snap;
            }
            if new_reserved {
                s.peak_reserved = s.reserved;
                s.at_peak_reserved = snap;
            }
        }
    }

    /// `recordStream`: marks the live tensor `id` as used on `stream` (ignored on its own
    /// allocation stream), so that its block is reused only after that stream's work up to
    /// the free completes. Streams from 64 up are not tracked.
    pub fn record_stream(&mut self, id: usize, stream: usize) {
        if let Some(b) = self.live.get(id) {
            if b != NIL {
                self.record_stream_block(b, stream);
            }
        }
    }

    /// Every segment with its mapped blocks, in address order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.history_segments()
            .into_iter()
            .map(|seg| SegmentInfo {
                stream: seg.stream as usize,
                small: seg.small,
                expandable: seg.expandable,
                reserved: seg.total_size(),
                blocks: seg.blocks.iter().map(|b| (b.size, b.state != BlockState::Inactive)).collect(),
            })
            .collect()
    }

    /// Every segment (each mapped range of an expandable one) with its blocks' addresses,
    /// states and tensors, in address order: the `segments` of `torch.cuda.memory._snapshot()`.
    fn history_segments(&self) -> Vec<history::Segment> {
        let mut heads: Vec<u32> = (0..self.blocks.len() as u32)
            .filter(|&i| {
                let b = &self.blocks[i as usize];
                b.size > 0
                    && b.state != State::Unmapped
                    && (b.prev == NIL || self.blocks[b.prev as usize].state == State::Unmapped)
            })
            .collect();
        heads.sort_by_key(|&h| self.blocks[h as usize].addr);
        heads
            .into_iter()
            .map(|h| {
                let mut blocks = Vec::new();
                let mut b = h;
                while b != NIL && self.blocks[b as usize].state != State::Unmapped {
                    let bl = &self.blocks[b as usize];
                    let state = match bl.state {
                        State::Taken => BlockState::Allocated,
                        State::Pending => BlockState::PendingFree,
                        State::Free | State::Unmapped => BlockState::Inactive,
                    };
                    let (requested, tensor) =
                        if state == BlockState::Inactive { (0, NO_TENSOR) } else { self.served_by(b) };
                    blocks.push(history::Block { addr: bl.addr, size: bl.size, requested, state, tensor });
                    b = bl.next;
                }
                let pool = self.blocks[h as usize].pool;
                history::Segment {
                    addr: self.blocks[h as usize].addr,
                    stream: Self::stream_of(pool) as u32,
                    small: Self::is_small(pool),
                    expandable: self.expandable(h),
                    blocks,
                }
            })
            .collect()
    }

    /// Checks the internal bookkeeping: blocks tile each segment, the free sets hold exactly
    /// the free blocks, and the byte counters match the blocks. Returns what is wrong.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reserved = 0u64;
        let mut allocated_blocks = 0u64;
        let mut active = 0u64;
        let mut free_count = 0usize;
        for (si, s) in self.segments.iter().enumerate() {
            if !s.alive {
                continue;
            }
            let mut members: Vec<u32> = (0..self.blocks.len() as u32)
                .filter(|&b| self.blocks[b as usize].seg == si as u32 && self.blocks[b as usize].size > 0)
                .collect();
            members.sort_by_key(|&b| self.blocks[b as usize].addr);
            let mut at = s.base;
            for (k, &b) in members.iter().enumerate() {
                let bl = &self.blocks[b as usize];
                if bl.addr != at {
                    return Err(format!("segment {si}: block {b} at {} but expected {at}", bl.addr));
                }
                at += bl.size;
                let want_prev = if k == 0 { NIL } else { members[k - 1] };
                let want_next = members.get(k + 1).copied().unwrap_or(NIL);
                if bl.prev != want_prev || bl.next != want_next {
                    return Err(format!("segment {si}: block {b} has broken links"));
                }
                match bl.state {
                    State::Free => {
                        free_count += 1;
                        reserved += bl.size;
                        let in_pool =
                            self.pools.get(bl.pool as usize).and_then(|p| p.free.get((bl.size, bl.addr))) == Some(b);
                        if !in_pool {
                            return Err(format!("free block {b} is not in its pool"));
                        }
                        if k > 0 && self.blocks[want_prev as usize].state == State::Free {
                            return Err(format!("free blocks {want_prev} and {b} were not merged"));
                        }
                    }
                    State::Taken => {
                        reserved += bl.size;
                        allocated_blocks += bl.size;
                        active += bl.size;
                    }
                    State::Pending => {
                        reserved += bl.size;
                        active += bl.size;
                    }
                    State::Unmapped => {
                        if s.page == 0 {
                            return Err(format!("plain segment {si} has an unmapped block"));
                        }
                    }
                }
            }
            if at != s.base + s.size {
                return Err(format!("segment {si}: blocks cover {} of {} bytes", at - s.base, s.size));
            }
        }
        let pooled: usize = self.pools.iter().map(|p| p.free.len()).sum();
        if pooled != free_count {
            return Err(format!("{pooled} blocks in the pools but {free_count} free blocks"));
        }
        if reserved != self.stats.reserved {
            return Err(format!("reserved {} but segments hold {reserved}", self.stats.reserved));
        }
        if allocated_blocks != self.stats.allocated_blocks {
            return Err(format!("allocated {} but blocks hold {allocated_blocks}", self.stats.allocated_blocks));
        }
        if active != self.stats.active {
            return Err(format!("active {} but blocks hold {active}", self.stats.active));
        }
        if self.stats.reserved > self.cfg.capacity {
            return Err(format!("reserved {} over capacity {}", self.stats.reserved, self.cfg.capacity));
        }
        Ok(())
    }

    fn oom(&mut self, size: u64, alloc_size: u64) -> AllocError {
        self.stats.num_ooms += 1;
        let cause = if self.stats.allocated + size > self.cfg.capacity {
            OomCause::LiveTensors
        } else {
            OomCause::Fragmentation
        };
        AllocError {
            requested: size,
            allocated: self.stats.allocated,
            reserved: self.stats.reserved,
            capacity: self.cfg.capacity,
            allocated_blocks: self.stats.allocated_blocks,
            segment: alloc_size,
            largest_free_block: self.largest_free_block(),
            cause,
        }
    }
}

impl CachingAllocator {
    /// `free` of tensor `id` from `stream` at `now_ns`: `allocated` drops now; a block used
    /// on other streams waits for their events.
    /// Returns the bytes the tensor had accounted (its `round_size`; 0 if it was not live).
    fn release_tensor(&mut self, id: usize, stream: usize, now_ns: u64) -> u64 {
        let Some(slot) = self.live.get_mut(id) else { return 0 };
        let b = *slot;
        if b == NIL {
            return 0;
        }
        *slot = NIL;
        if self.history.is_some() {
            let (requested, tensor) = self.served_by(b);
            let (addr, pool) = (self.blocks[b as usize].addr, self.blocks[b as usize].pool);
            self.record(Action::FreeRequested, addr, requested, pool, tensor);
        }
        self.record_stream_block(b, stream);
        let (size, requested, uses) = {
            let bl = &mut self.blocks[b as usize];
            let u = bl.uses;
            bl.uses = 0;
            (bl.size, bl.requested, u)
        };
        self.stats.allocated -= requested;
        self.stats.allocated_blocks -= size;
        if uses == 0 {
            self.free_block(b);
            return requested;
        }
        // `insert_events`: one event per stream that used the block.
        let mut u = uses;
        while u != 0 {
            let s = u.trailing_zeros() as usize;
            u &= u - 1;
            if self.events.len() <= s {
                self.events.resize_with(s + 1, VecDeque::new);
                self.synced.resize(s + 1, 0);
            }
            self.events[s].push_back((now_ns, b));
            self.pending_events += 1;
            self.blocks[b as usize].events += 1;
        }
        self.blocks[b as usize].state = State::Pending;
        requested
    }

    /// `DeviceCachingAllocator::malloc`; the bytes accounted (`round_size`, 0 for none).
    fn malloc_rounded(&mut self, id: usize, bytes: u64, stream: usize) -> Result<u64, AllocError> {
        if self.live.slot(id) != NIL {
            // A handle reused while live: free the old tensor first (the engine never does).
            self.free(id);
        }
        if bytes == 0 {
            // `CUDACachingAllocator::allocate(0)` hands out a null pointer without a block.
            return Ok(0);
        }
        self.process_events();
        let size = round_size(bytes, &self.cfg);
        let pool = Self::pool_index(stream, size <= SMALL_SIZE);
        let alloc_size = allocation_size(size);
        let found = match self.get_free_block(pool, size) {
            Some(b) => Some(b),
            None => self
                .alloc_block(pool, size, alloc_size, false)
                .or_else(|| {
                    if self.release_available_cached_blocks(pool, size) {
                        self.alloc_block(pool, size, alloc_size, false)
                    } else {
                        None
                    }
                })
                .or_else(|| {
                    self.release_cached_blocks();
                    self.alloc_block(pool, size, alloc_size, true)
                }),
        };
        let Some(b) = found else {
            self.update_peaks();
            let device_free = self.cfg.capacity.saturating_sub(self.stats.reserved);
            self.record(Action::Oom, device_free, size, pool, id as u32);
            return Err(self.oom(size, alloc_size));
        };
        let split = self.should_split(b, size);
        let block = self.alloc_found_block(b, size, split);
        self.blocks[block as usize].requested = size;
        self.blocks[block as usize].state = State::Taken;
        if let Some(h) = self.history.as_mut() {
            let i = block as usize;
            if h.requested.len() <= i {
                h.requested.resize(i + 1, 0);
                h.tensor.resize(i + 1, NO_TENSOR);
            }
            (h.requested[i], h.tensor[i]) = (bytes, id as u32);
            let addr = self.blocks[i].addr;
            self.record(Action::Alloc, addr, bytes, pool, id as u32);
        }
        *self.live.slot_mut(id) = block;
        self.stats.allocated += size;
        self.update_peaks();
        Ok(size)
    }

    /// [`CachingAllocator::release_tensor`] at `now_ns`, the history's clock set to it (a
    /// plain `free` leaves the clock where it is); the bytes the tensor had accounted.
    fn release_at(&mut self, id: usize, stream: usize, now_ns: u64) -> u64 {
        if let Some(h) = self.history.as_mut() {
            h.now = now_ns;
        }
        self.release_tensor(id, stream, now_ns)
    }

    /// What a history stamps the entries of the call being served with.
    fn serving(&mut self, id: u32, now_ns: u64) {
        if let Some(h) = self.history.as_mut() {
            h.now = now_ns;
            h.serving = id;
        }
    }
}

impl Allocator for CachingAllocator {
    fn malloc(&mut self, id: usize, bytes: u64, stream: usize) -> Result<(), AllocError> {
        self.malloc_rounded(id, bytes, stream).map(|_| ())
    }

    /// Frees `id` as used on its allocation stream only.
    fn free(&mut self, id: usize) {
        if let Some(b) = self.live.get(id) {
            if b != NIL {
                let s = Self::stream_of(self.blocks[b as usize].pool);
                self.release_tensor(id, s, 0);
            }
        }
    }

    /// `free`: `allocated` drops now; a block used on other streams waits for their events.
    fn free_on(&mut self, id: usize, stream: usize, now_ns: u64) {
        self.release_at(id, stream, now_ns);
    }

    fn free_counted(&mut self, id: usize, bytes: u64, stream: usize, now_ns: u64) -> (u64, Totals) {
        let freed = self.release_at(id, stream, now_ns);
        debug_assert_eq!(freed, self.rounded(bytes), "tensor {id} freed with another size than allocated");
        (freed, self.totals())
    }

    fn stream_synced(&mut self, stream: usize, now_ns: u64) {
        if self.synced.len() <= stream {
            self.synced.resize(stream + 1, 0);
            self.events.resize_with(stream + 1, VecDeque::new);
        }
        self.synced[stream] = self.synced[stream].max(now_ns);
        if let Some(h) = self.history.as_mut() {
            h.now = now_ns;
        }
    }

    fn empty_cache(&mut self) {
        self.stats.num_empty_cache += 1;
        self.release_cached_blocks();
    }

    fn allocated(&self) -> u64 {
        self.stats.allocated
    }

    fn reserved(&self) -> u64 {
        self.stats.reserved
    }

    fn active(&self) -> u64 {
        self.stats.active
    }

    fn totals(&self) -> Totals {
        Totals { allocated: self.stats.allocated, reserved: self.stats.reserved, active: self.stats.active }
    }

    fn rounded(&self, bytes: u64) -> u64 {
        if bytes == 0 {
            0
        } else {
            round_size(bytes, &self.cfg)
        }
    }

    fn stats(&self) -> AllocatorStats {
        self.stats.clone()
    }

    fn malloc_at(&mut self, id: usize, bytes: u64, stream: usize, now_ns: u64) -> Result<(), AllocError> {
        self.malloc_counted(id, bytes, stream, now_ns).map(|_| ())
    }

    fn malloc_counted(
        &mut self,
        id: usize,
        bytes: u64,
        stream: usize,
        now_ns: u64,
    ) -> Result<(u64, Totals), AllocError> {
        self.serving(id as u32, now_ns);
        let r = self.malloc_rounded(id, bytes, stream);
        if let Some(h) = self.history.as_mut() {
            h.serving = NO_TENSOR;
        }
        Ok((r?, self.totals()))
    }

    fn start_history(&mut self) -> bool {
        self.history.get_or_insert_with(|| Box::new(Recorder { serving: NO_TENSOR, ..Recorder::default() }));
        true
    }

    fn take_history(&mut self) -> Option<History> {
        self.history.as_ref()?;
        let segments = self.history_segments();
        let h = self.history.take()?;
        Some(History {
            events: h.events,
            segments,
            settings: history::Settings {
                max_split_size: self.cfg.max_split_size,
                expandable_segments: self.cfg.expandable_segments,
                roundup_power2_divisions: self.cfg.roundup_power2_divisions.to_vec(),
            },
            capacity: self.cfg.capacity,
        })
    }
}

impl CachingAllocator {
    fn record_stream_block(&mut self, b: u32, stream: usize) {
        let bl = &mut self.blocks[b as usize];
        if stream < 64 && Self::stream_of(bl.pool) != stream {
            bl.uses |= 1 << stream;
        }
    }
}

/// Bytes as `format_size` in CUDACachingAllocator.cpp prints them: "bytes" up to 1 KiB, then
/// KiB, MiB and GiB with two decimals.
pub fn format_size(b: u64) -> String {
    if b <= 1024 {
        format!("{b} bytes")
    } else if b <= MIB {
        format!("{:.2} KiB", b as f64 / 1024.0)
    } else if b <= 1 << 30 {
        format!("{:.2} MiB", b as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_set_orders_as_a_sorted_map_by_size_then_address() {
        // Size classes are in size order.
        let classes: Vec<usize> = (0..5000u64).map(|s| size_class(s * 997)).collect();
        assert!(classes.windows(2).all(|w| w[0] <= w[1]) && size_class(u64::MAX) < SIZE_CLASSES);
        // Random insertions and removals; every search agrees with a map by (size, address).
        let (mut set, mut map) = (FreeSet::default(), std::collections::BTreeMap::new());
        let mut x = 12345u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        for i in 0..4000u32 {
            let size = [512, 1024, 2 << 20, 20 << 20, 3 << 30][next() as usize % 5] * (1 + next() % 4);
            let key = (size, (next() % 64) << 21);
            if next() % 3 == 0 {
                set.remove(key);
                map.remove(&key);
            } else {
                set.insert(key, i);
                map.insert(key, i);
            }
            let want = next() % (8 << 30);
            let got: Vec<u32> =
                std::iter::successors(set.first_at_least(want), |&(pos, _)| set.after(pos)).map(|(_, b)| b).collect();
            let expected: Vec<u32> = map.range((want, 0)..).map(|(_, &b)| b).collect();
            assert_eq!(got, expected);
            assert_eq!(set.len(), map.len());
            assert_eq!(set.largest_size(), map.keys().next_back().map(|k| k.0));
            assert_eq!(set.blocks().rev().collect::<Vec<_>>(), map.values().rev().copied().collect::<Vec<_>>());
        }
    }

    const M: u64 = MIB;

    fn alloc(capacity: u64) -> CachingAllocator {
        CachingAllocator::new(CachingConfig::new(capacity))
    }

    fn expandable(capacity: u64) -> CachingAllocator {
        let mut c = CachingConfig::new(capacity);
        c.expandable_segments = true;
        CachingAllocator::new(c)
    }

    fn ok(a: &CachingAllocator) {
        if let Err(e) = a.check_invariants() {
            panic!("{e}");
        }
    }

    /// (size, allocated) of every block of every segment, in address order.
    fn layout(a: &CachingAllocator) -> Vec<Vec<(u64, bool)>> {
        a.segments().into_iter().map(|s| s.blocks).collect()
    }

    /// The engine's one-call allocation and free answer what the separate calls would:
    /// the bytes `rounded` accounts and the totals after the call, on a plain and an
    /// expandable allocator, across frees from another stream and zero-byte tensors.
    #[test]
    fn counted_calls_answer_what_the_separate_calls_do() {
        for mut a in [alloc(1 << 30), expandable(1 << 30)] {
            let mut x: u64 = 0x2545_F491_4F6C_DD1D;
            let mut live: Vec<(usize, u64, usize)> = Vec::new();
            for id in 0..2000usize {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let bytes = match x % 5 {
                    0 => 0,
                    1 => x % 4096,
                    2 => (x % 40) * M / 3,
                    _ => (x % 8 + 1) * M,
                };
                let stream = (x >> 8) as usize % 2;
                let (delta, after) = a.malloc_counted(id, bytes, stream, id as u64).unwrap();
                assert_eq!((delta, after), (a.rounded(bytes), a.totals()));
                live.push((id, bytes, stream));
                if live.len() > 24 || x % 3 == 0 {
                    let (gone, bytes, s) = live.swap_remove((x >> 16) as usize % live.len());
                    let on = if x % 7 == 0 { 1 - s } else { s };
                    let (freed, after) = a.free_counted(gone, bytes, on, id as u64);
                    assert_eq!((freed, after), (a.rounded(bytes), a.totals()));
                    a.stream_synced(1 - s, id as u64);
                }
                ok(&a);
            }
        }
    }

    #[test]
    fn round_size_is_512_byte_blocks_by_default() {
        let c = CachingConfig::new(1 << 40);
        assert_eq!(round_size(1, &c), 512);
        assert_eq!(round_size(512, &c), 512);
        assert_eq!(round_size(513, &c), 1024);
        assert_eq!(round_size(10 * M + 1, &c), 10 * M + 512);
    }

    #[test]
    fn roundup_power2_divisions_rounds_to_equal_steps() {
        // The source's own example: 1200 with 4 divisions -> 1024, 1280, 1536, 1792 -> 1280.
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1024, 4), 1024);
        assert_eq!(roundup_power2_next_division(1280, 4), 1280);
        let mut c = CachingConfig::new(1 << 40);
        c.roundup_power2_divisions = [4; ROUNDUP_INTERVALS];
        // 1.2 MiB lies in [1 MiB, 2 MiB): steps of 256 KiB -> 1.25 MiB.
        assert_eq!(round_size(1_258_291, &c), 1_310_720);
        // Only sizes above 512 B x divisions are rounded this way.
        assert_eq!(round_size(1200, &c), 1536);
        // 2 divisions of [4 MiB, 8 MiB): 5 MiB + 1 -> 6 MiB.
        c.roundup_power2_divisions = [2; ROUNDUP_INTERVALS];
        assert_eq!(round_size(5 * M + 1, &c), 6 * M);
        let mut a = CachingAllocator::new(c);
        a.malloc(0, 5 * M + 1, 0).unwrap();
        assert_eq!(a.allocated(), 6 * M);
    }

    #[test]
    fn segment_size_follows_get_allocation_size() {
        assert_eq!(allocation_size(512), 2 * M);
        assert_eq!(allocation_size(M), 2 * M);
        assert_eq!(allocation_size(M + 512), 20 * M);
        assert_eq!(allocation_size(10 * M - 512), 20 * M);
        assert_eq!(allocation_size(10 * M), 10 * M);
        assert_eq!(allocation_size(10 * M + 512), 12 * M);
    }

    #[test]
    fn small_requests_share_2_mib_segments_and_large_ones_20_mib() {
        let mut a = alloc(1 << 30);
        a.malloc(0, M, 0).unwrap();
        assert_eq!(a.reserved(), 2 * M, "1 MiB is small: a 2 MiB segment");
        a.malloc(1, M, 0).unwrap();
        assert_eq!(a.reserved(), 2 * M, "the second 1 MiB is split from the same segment");
        a.malloc(2, M, 0).unwrap();
        assert_eq!(a.reserved(), 4 * M);
        a.malloc(3, M + 1, 0).unwrap();
        assert_eq!(a.reserved(), 24 * M, "over 1 MiB is large: a 20 MiB segment");
        let segs = a.segments();
        assert_eq!(segs.iter().filter(|s| s.small).count(), 2);
        assert_eq!(layout(&a)[2], vec![(M + 512, true), (19 * M - 512, false)]);
        ok(&a);
    }

    #[test]
    fn large_pool_keeps_a_tail_of_at_most_1_mib_unsplit() {
        let mut a = alloc(1 << 30);
        // 19 MiB from a 20 MiB segment leaves exactly 1 MiB: not > kSmallSize, not split.
        a.malloc(0, 19 * M, 0).unwrap();
        assert_eq!(layout(&a), vec![vec![(20 * M, true)]]);
        let s = a.stats();
        assert_eq!((s.allocated, s.allocated_blocks), (19 * M, 20 * M));
        // 18.5 MiB leaves 1.5 MiB: split off as a free block.
        a.malloc(1, 18 * M + M / 2, 0).unwrap();
        assert_eq!(layout(&a)[1], vec![(18 * M + M / 2, true), (M + M / 2, false)]);
        // The small pool splits any remainder of at least 512 B.
        a.malloc(3, M - 512, 0).unwrap();
        assert_eq!(layout(&a)[2], vec![(M - 512, true), (M + 512, false)]);
        ok(&a);
    }

    #[test]
    fn best_fit_takes_the_smallest_cached_block_that_fits() {
        let mut a = alloc(1 << 30);
        for (id, mb) in [(0, 30), (1, 50), (2, 40)] {
            a.malloc(id, mb * M, 0).unwrap();
        }
        for id in 0..3 {
            a.free(id);
        }
        assert_eq!(a.reserved(), 120 * M);
        a.malloc(3, 35 * M, 0).unwrap();
        assert_eq!(a.reserved(), 120 * M, "served from the cache");
        let l = layout(&a);
        assert_eq!(l[2], vec![(35 * M, true), (5 * M, false)], "the 40 MiB block, split");
        assert_eq!(a.largest_free_block(), 50 * M);
        ok(&a);
    }

    #[test]
    fn frees_coalesce_within_a_segment_never_across() {
        let mut a = alloc(1 << 30);
        for id in 0..4 {
            a.malloc(id, 5 * M, 0).unwrap();
        }
        assert_eq!(a.reserved(), 20 * M, "four 5 MiB blocks split from one 20 MiB segment");
        a.free(1);
        a.free(2);
        assert_eq!(layout(&a), vec![vec![(5 * M, true), (10 * M, false), (5 * M, true)]]);
        a.free(0);
        a.free(3);
        assert_eq!(layout(&a), vec![vec![(20 * M, false)]]);
        assert_eq!(a.stats().inactive_split_bytes, 0);
        ok(&a);
        // Two 12 MiB segments, both free, are not one 24 MiB block.
        let mut a = alloc(1 << 30);
        a.malloc(4, 12 * M, 0).unwrap();
        a.malloc(5, 12 * M, 0).unwrap();
        a.free(4);
        a.free(5);
        a.malloc(6, 22 * M, 0).unwrap();
        assert_eq!(a.reserved(), 24 * M + 22 * M);
        ok(&a);
    }

    #[test]
    fn a_block_freed_on_one_stream_is_not_reused_by_another() {
        let mut a = alloc(1 << 30);
        a.malloc(0, 40 * M, 1).unwrap();
        a.free(0);
        a.malloc(1, 40 * M, 0).unwrap();
        assert_eq!(a.reserved(), 80 * M, "stream 0 cannot use stream 1's cached block");
        a.malloc(2, 40 * M, 1).unwrap();
        assert_eq!(a.reserved(), 80 * M, "stream 1 can");
        ok(&a);
    }

    #[test]
    fn a_block_used_on_another_stream_waits_for_that_stream() {
        let mut a = alloc(1 << 30);
        // Allocated on stream 1 (say an all-gather), last used by stream 0, freed at t = 100.
        a.malloc(0, 40 * M, 1).unwrap();
        a.free_on(0, 0, 100);
        assert_eq!(a.allocated(), 0, "allocated drops at the free");
        assert_eq!(a.active(), 40 * M, "the block is still active: its event is pending");
        a.stream_synced(0, 99);
        a.malloc(1, 40 * M, 1).unwrap();
        assert_eq!(a.reserved(), 80 * M, "stream 0 has not reached the free yet: a new segment");
        a.stream_synced(0, 100);
        a.malloc(2, 40 * M, 1).unwrap();
        assert_eq!(a.reserved(), 80 * M, "the event completed; the next malloc reuses the block");
        assert_eq!(a.active(), 80 * M);
        // record_stream on a live tensor has the same effect at its free.
        a.record_stream(2, 0);
        a.free_on(2, 1, 200);
        assert_eq!(a.active(), 80 * M);
        a.empty_cache();
        assert_eq!(a.active(), 40 * M, "empty_cache synchronises outstanding events");
        assert_eq!(a.reserved(), 40 * M, "and releases the now-free segment");
        ok(&a);
    }

    #[test]
    fn a_failed_cudamalloc_releases_the_cache_and_retries() {
        let mut a = alloc(64 * M);
        a.malloc(0, 30 * M, 0).unwrap();
        a.malloc(1, 30 * M, 0).unwrap();
        a.free(0);
        a.free(1);
        assert_eq!(a.reserved(), 60 * M);
        a.malloc(2, 40 * M, 0).unwrap();
        let s = a.stats();
        assert_eq!(s.num_alloc_retries, 1);
        assert_eq!(s.reserved, 40 * M);
        assert_eq!((s.num_device_alloc, s.num_device_free), (3, 2));
        ok(&a);
    }

    #[test]
    fn pinned_splits_make_a_fragmentation_oom() {
        // Two 20 MiB segments, each holding a live 5 MiB block and a free 15 MiB one.
        let mut a = alloc(40 * M);
        a.malloc(0, 5 * M, 0).unwrap();
        a.malloc(1, 15 * M, 0).unwrap();
        a.malloc(2, 5 * M, 0).unwrap();
        a.free(1);
        assert_eq!(layout(&a), vec![vec![(5 * M, true), (15 * M, false)], vec![(5 * M, true), (15 * M, false)]]);
        let e = a.malloc(3, 20 * M, 0).unwrap_err();
        assert_eq!(e.cause, OomCause::Fragmentation, "10 MiB live + 20 MiB fits in 40 MiB");
        assert_eq!((e.requested, e.segment, e.allocated, e.reserved), (20 * M, 20 * M, 10 * M, 40 * M));
        assert_eq!(e.largest_free_block, 15 * M);
        assert_eq!(a.stats().num_alloc_retries, 1, "the retry was made and failed");
        assert_eq!(a.stats().inactive_split_bytes, 30 * M);
        ok(&a);
    }

    #[test]
    fn live_tensors_over_capacity_is_not_fragmentation() {
        let mut a = alloc(40 * M);
        a.malloc(0, 30 * M, 0).unwrap();
        let e = a.malloc(1, 12 * M, 0).unwrap_err();
        assert_eq!(e.cause, OomCause::LiveTensors);
        assert_eq!(a.allocated(), 30 * M, "a failed malloc frees nothing live");
    }

    /// Size drift: a smaller tensor reuses part of a bigger cached block, and its tail pins the
    /// segment. Expandable segments let that tail merge with the next free block.
    fn size_drift(a: &mut CachingAllocator) -> Result<(), AllocError> {
        a.malloc(0, 40 * M, 0)?;
        a.malloc(1, 40 * M, 0)?;
        a.free(0);
        a.malloc(2, 30 * M, 0)?;
        a.free(1);
        a.malloc(3, 50 * M, 0)
    }

    #[test]
    fn expandable_segments_remove_the_fragmentation_between_segments() {
        let mut plain = alloc(85 * M);
        let e = size_drift(&mut plain).unwrap_err();
        assert_eq!(e.cause, OomCause::Fragmentation, "30 + 50 MiB live fits in 85 MiB");
        assert_eq!(e.reserved, 40 * M, "the 40 MiB segment with the live 30 MiB stays");
        let mut exp = expandable(85 * M);
        size_drift(&mut exp).unwrap();
        assert_eq!(exp.reserved(), 80 * M, "four 20 MiB pages");
        assert_eq!(exp.stats().num_alloc_retries, 0);
        ok(&exp);
    }

    #[test]
    fn expandable_segments_map_20_mib_pages_and_merge_across_them() {
        // pytorch/devlogs "Why allocation order doesn't matter": 8 x 16 MiB map 7 x 20 MiB
        // pages; freed, they are one block that serves 4 x 32 MiB without mapping more.
        let mut exp = expandable(1 << 30);
        let mut plain = alloc(1 << 30);
        for a in [&mut exp, &mut plain] {
            for id in 0..8 {
                a.malloc(id, 16 * M, 0).unwrap();
            }
            for id in 0..8 {
                a.free(id);
            }
            for id in 8..12 {
                a.malloc(id, 32 * M, 0).unwrap();
            }
        }
        assert_eq!(exp.reserved(), 140 * M);
        assert_eq!(plain.reserved(), 256 * M, "eight stale 16 MiB segments + four 32 MiB ones");
        assert_eq!(exp.segments().len(), 1);
        ok(&exp);
        ok(&plain);
        // The small pool maps 2 MiB pages.
        let mut s = expandable(1 << 30);
        s.malloc(0, 600 << 10, 0).unwrap();
        assert_eq!(s.reserved(), 2 * M);
        ok(&s);
    }

    #[test]
    fn expandable_segments_release_whole_free_pages_only() {
        let mut a = expandable(1 << 30);
        a.malloc(0, 5 * M, 0).unwrap();
        a.malloc(1, 50 * M, 0).unwrap();
        a.malloc(2, 5 * M, 0).unwrap();
        assert_eq!(a.reserved(), 60 * M);
        a.free(1);
        a.empty_cache();
        // Free bytes 5..55 MiB: only the page 20..40 MiB lies wholly inside.
        assert_eq!(a.reserved(), 40 * M);
        ok(&a);
        a.free(0);
        a.free(2);
        a.empty_cache();
        assert_eq!(a.reserved(), 0);
        assert!(a.segments().is_empty());
        ok(&a);
    }

    #[test]
    fn pinned_splits_survive_expandable_segments_too() {
        // A live block on each page: nothing can be unmapped, no 20 MiB run is free.
        let mut a = expandable(40 * M);
        a.malloc(0, 5 * M, 0).unwrap();
        a.malloc(1, 15 * M, 0).unwrap();
        a.malloc(2, 5 * M, 0).unwrap();
        a.malloc(3, 15 * M, 0).unwrap();
        a.free(1);
        a.free(3);
        let e = a.malloc(4, 20 * M, 0).unwrap_err();
        assert_eq!(e.cause, OomCause::Fragmentation);
        ok(&a);
    }

    #[test]
    fn max_split_size_keeps_oversize_blocks_whole_and_for_big_requests() {
        let mut c = CachingConfig::new(1 << 30);
        c.max_split_size = 40 * M;
        let mut a = CachingAllocator::new(c.clone());
        a.malloc(0, 100 * M, 0).unwrap();
        a.free(0);
        // A normal request is not served from an oversize block.
        a.malloc(1, 30 * M, 0).unwrap();
        assert_eq!(a.reserved(), 130 * M);
        // An oversize request takes it only if it is less than 20 MiB bigger...
        a.malloc(2, 70 * M, 0).unwrap();
        assert_eq!(a.reserved(), 200 * M);
        a.free(2);
        a.malloc(3, 85 * M, 0).unwrap();
        assert_eq!(a.reserved(), 200 * M, "100 < 85 + 20: reused");
        // ... and then whole: the request is not under max_split_size, so no split.
        let l = layout(&a);
        assert!(l.contains(&vec![(100 * M, true)]) || l.contains(&vec![(70 * M, false)]), "{l:?}");
        ok(&a);
        // With the cache full, oversize cached blocks are released before the full flush.
        c.capacity = 150 * M;
        let mut a = CachingAllocator::new(c);
        a.malloc(0, 100 * M, 0).unwrap();
        a.free(0);
        a.malloc(1, 60 * M, 0).unwrap();
        let s = a.stats();
        assert_eq!((s.reserved, s.num_alloc_retries, s.num_device_free), (60 * M, 0, 1));
        ok(&a);
    }

    #[test]
    fn empty_cache_returns_cached_segments_and_keeps_live_ones() {
        let mut a = alloc(1 << 30);
        a.malloc(0, 40 * M, 0).unwrap();
        a.malloc(1, 40 * M, 0).unwrap();
        a.malloc(2, 5 * M, 0).unwrap();
        a.malloc(3, 5 * M, 0).unwrap();
        a.free(0);
        a.free(3);
        assert_eq!(a.reserved(), 100 * M);
        a.empty_cache();
        assert_eq!(a.reserved(), 60 * M, "the free 40 MiB segment goes; the split 20 MiB one stays");
        assert_eq!(a.allocated(), 45 * M);
        assert_eq!(a.stats().num_empty_cache, 1);
        ok(&a);
    }

    #[test]
    fn peaks_and_snapshots() {
        let mut a = alloc(1 << 30);
        a.malloc(0, 30 * M, 0).unwrap();
        a.malloc(1, 30 * M, 0).unwrap();
        a.free(0);
        a.malloc(2, 10 * M, 0).unwrap();
        let s = a.stats();
        assert_eq!((s.peak_allocated, s.peak_reserved), (60 * M, 60 * M));
        assert_eq!(s.at_peak_allocated.reserved, 60 * M);
        assert_eq!(s.at_peak_allocated.largest_free_block, 0);
        assert_eq!(a.largest_free_block(), 20 * M);
    }

    #[test]
    fn format_size_matches_pytorch() {
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(20 * M), "20.00 MiB");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
    }
}
