//! The discrete-event core: runs one rank's [`Program`] of tasks on streams, in simulated
//! time, sending every allocation and free through an [`Allocator`].
//!
//! Ordering contract (what makes output byte-identical across runs): the event queue is a
//! binary heap keyed by (time, sequence number), so events at the same instant are handled
//! in the order they were scheduled; after each event, streams are polled in index order and
//! a stream starts its next task (program order) once the stream is idle and every
//! dependency has finished. Frees of a finishing task happen before allocations of the tasks
//! it unblocks. Time is integer nanoseconds. The engine knows nothing of models or
//! parallelism: tasks are opaque apart from their stream, duration, dependencies and memory
//! effects.
//!
//! What the allocator is told, in order, when a task ends at time t on stream s: each of its
//! frees, as made by stream s at t ([`Allocator::free_on`]: a buffer allocated on another
//! stream counts as used on s, so a caching model holds its block back until s has finished
//! its work up to t); then that s has completed its work up to t
//! ([`Allocator::stream_synced`]); then, if [`RunOptions::empty_cache_after`] names the task,
//! [`Allocator::empty_cache`].

pub mod by_rank;
pub mod links;
mod period;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::memory::history::NO_TENSOR;
use crate::memory::{AllocError, Allocator, AllocatorStats, Category, History, Timeline, Totals};

/// A tensor's lifetime: allocated when one task starts, freed when another ends.
#[derive(Debug, Clone)]
pub struct BufferSpec {
    pub bytes: u64,
    pub category: Category,
    /// Index into the program's name table (what the OOM report says this was).
    pub name: u32,
    /// The program stream whose allocator pool the buffer comes from: PyTorch allocates on
    /// the CPU's current stream, which is often not the stream that runs the work (a
    /// receive's buffer is `torch.empty` on the compute stream, then written by NCCL's).
    /// [`TASK_STREAM`]: the allocating task's own stream.
    pub pool: u16,
}

/// [`BufferSpec::pool`]: allocate on the stream of the task that allocates the buffer.
pub const TASK_STREAM: u16 = u16::MAX;

/// One unit of work on one stream. Its dependencies and memory effects are in the
/// program's [`TaskLists`] ([`Program::deps`], [`Program::alloc`], [`Program::free`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Task {
    pub stream: u16,
    /// Thread blocks the task's kernel holds on SMs while it runs (an NCCL collective's
    /// channels), which compute beside it cannot use ([`links`]); 0 for most tasks.
    pub ctas: u16,
    pub duration_ns: u64,
    /// Index into the scheduler's label table.
    pub label: u32,
}

/// One list of indices per task (its dependencies, or the buffers it allocates or frees),
/// all in one flat array: task t's list is `items[start[t]..start[t + 1]]`. A large program
/// has hundreds of thousands of tasks; a vector per task and list would cost an allocation
/// each to build and to free, and a cache miss each time the engine reads one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskLists {
    /// Empty, or one more entry than tasks, starting at 0.
    start: Vec<u32>,
    items: Vec<u32>,
}

impl TaskLists {
    /// Appends the next task's list.
    pub fn push(&mut self, items: &[u32]) {
        if self.start.is_empty() {
            self.start.push(0);
        }
        self.items.extend_from_slice(items);
        self.start.push(self.items.len() as u32);
    }

    /// How many indices task `t`'s list holds.
    pub fn len_of(&self, t: usize) -> usize {
        (self.start[t + 1] - self.start[t]) as usize
    }

    /// Task `t`'s list.
    pub fn of(&self, t: usize) -> &[u32] {
        &self.items[self.start[t] as usize..self.start[t + 1] as usize]
    }

    /// How many tasks have a list.
    pub fn len(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for `tasks` more lists of `items` indices in all.
    pub fn reserve(&mut self, tasks: usize, items: usize) {
        self.start.reserve(tasks + 1);
        self.items.reserve(items);
    }

    /// The lists of `tasks` tasks from (task, index) pairs given in any order of tasks: each
    /// task's list keeps its pairs' order (for a scheduler that decides a task's frees after
    /// writing later tasks).
    pub fn from_pairs(tasks: usize, pairs: &[(u32, u32)]) -> TaskLists {
        let mut start = vec![0u32; tasks + 1];
        for &(t, _) in pairs {
            start[t as usize + 1] += 1;
        }
        for i in 0..tasks {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut items = vec![0u32; pairs.len()];
        for &(t, x) in pairs {
            items[next[t as usize] as usize] = x;
            next[t as usize] += 1;
        }
        TaskLists { start, items }
    }
}

/// Everything one rank does, as the scheduler wrote it.
#[derive(Debug, Clone, Default)]
pub struct Program {
    pub streams: Vec<String>,
    /// The GPU each stream runs on (empty: all on device 0). Buffers live on the device of
    /// the task that allocates them; each device has its own allocator.
    pub stream_device: Vec<u16>,
    pub tasks: Vec<Task>,
    /// Per task: the tasks that must finish before it starts. This and the other lists and
    /// tables are shared between copies of a program that differ only in their tasks'
    /// durations (`[jitter]`'s ranks): 256 ranks held 256 copies, and the engine, visiting
    /// each rank in turn, found none of them in cache.
    pub deps: Arc<TaskLists>,
    /// Per task: the buffers allocated when it starts, in order.
    pub alloc: Arc<TaskLists>,
    /// Per task: the buffers freed when it ends.
    pub free: Arc<TaskLists>,
    pub buffers: Arc<Vec<BufferSpec>>,
    pub names: Arc<Vec<String>>,
    /// Per stream: the links its tasks occupy ([`links`] bits; empty or 0: none). Tasks on
    /// a common link of one device share it while they overlap.
    pub stream_links: Vec<u8>,
    /// The GPU's streaming multiprocessors, which collectives' thread blocks take from
    /// compute ([`Task::ctas`], [`links::SMS`]); 0: not modelled.
    pub sms: u32,
    /// Tasks after which the framework itself calls `torch.cuda.empty_cache()` (beside the
    /// points `[allocator] empty_cache` names).
    pub empty_cache_after: Vec<u32>,
    /// Where the scheduler began each slot of its micro-batch schedule (a micro-batch's
    /// forward or backward, in program order): a hint of where the program repeats itself,
    /// which the engine verifies task by task before it extrapolates ([`period`]).
    pub period_marks: Vec<u32>,
    /// Where the scheduler began each transformer block of a pass (its forward, or its
    /// backward with any recomputation): finer hints of the same kind, for programs whose
    /// passes repeat block after block rather than micro-batch after micro-batch (a step of
    /// one micro-batch, a pipeline's warm-up and cool-down), verified the same way.
    pub layer_marks: Vec<u32>,
    /// Entry s: the first task of step s or later, where the program's steps are in program
    /// order (step 0 is initialisation); empty where the scheduler does not say so. A step's
    /// tasks are then one range, so its span is read off the trace without every task's
    /// label ([`Program::step_range`]).
    pub step_starts: Vec<u32>,
}

impl Program {
    /// The tasks of step `s`, where [`Program::step_starts`] holds the steps (empty for a
    /// step beyond them, and for every step where it is empty).
    pub fn step_range(&self, s: usize) -> std::ops::Range<usize> {
        let at = |k: usize| self.step_starts.get(k).map_or(self.tasks.len(), |&t| t as usize);
        at(s)..at(s + 1)
    }

    /// Appends a task with its dependencies, allocations and frees; returns its index.
    pub fn push_task(&mut self, task: Task, deps: &[u32], alloc: &[u32], free: &[u32]) -> u32 {
        self.tasks.push(task);
        Arc::make_mut(&mut self.deps).push(deps);
        Arc::make_mut(&mut self.alloc).push(alloc);
        Arc::make_mut(&mut self.free).push(free);
        (self.tasks.len() - 1) as u32
    }
}

/// The allocation that did not fit.
#[derive(Debug, Clone, PartialEq)]
pub struct OomEvent {
    /// The device that ran out of memory.
    pub device: u16,
    pub task: u32,
    pub buffer: u32,
    pub time_ns: u64,
    pub error: AllocError,
    /// Buffers live at that instant.
    pub live: Vec<u32>,
}

/// What happened when the program ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub timeline: Timeline,
    /// Start and end of each task, ns (u64::MAX: never ran).
    pub start_ns: Vec<u64>,
    pub end_ns: Vec<u64>,
    pub oom: Option<OomEvent>,
    /// Time the last task finished (or the OOM instant).
    pub end_time_ns: u64,
    /// Busy nanoseconds per stream.
    pub stream_busy_ns: Vec<u64>,
    /// The allocator's counters at the end of the run.
    pub allocator: AllocatorStats,
    /// The allocator's history ([`RunOptions::history`]), if it keeps one.
    pub history: Option<History>,
}

/// What the engine does besides running tasks.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Tasks after whose end (and frees) the engine calls `empty_cache()`.
    pub empty_cache_after: Vec<u32>,
    /// Record the peaks and what a report reads, not every sample
    /// ([`Timeline::peaks_only`]): a caller that draws no curve spares writing one.
    pub peaks_only: bool,
    /// With `peaks_only`, the two peaks alone, without the marks a report's per-phase peaks
    /// read ([`Timeline::headline`]): a sweep row reads none.
    pub headline: bool,
    /// Have every allocator record its history ([`Allocator::start_history`]).
    pub history: bool,
    /// Simulate every period of a repeating stretch instead of extrapolating it
    /// ([`period`]): the same figures, slower; what the test of the extrapolation compares
    /// with. A run that records allocator histories always does.
    pub every_period: bool,
    /// Raised by another thread when this run's result is no longer wanted (a counterfactual
    /// run speculatively beside the job it qualifies, which ran out of memory): the event
    /// loop looks every [`CANCEL_POLL_EVENTS`] events and, raised, stops with the tasks not
    /// yet run as a [`Deadlock`], which the caller that raised it discards.
    pub cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Tasks that must not start (in the run's numbering): a program prefix's tasks that
    /// wait for work it does not hold ([`crate::schedule::pipeline::Prefix::held`]). The run
    /// stops, without an out-of-memory, as soon as one of them could start (its dependencies
    /// ended, its stream idle and at it): what came before is what the whole program does,
    /// what follows is not known. A run with held tasks simulates every period and ends
    /// without a [`Deadlock`] when nothing else can start.
    pub held: Vec<u32>,
    /// Pause right after this task (in the run's numbering) ends: its frees made and the
    /// tasks it unblocked counted, before anything else starts at that instant
    /// ([`run_parts_until`], [`Paused::resume`]).
    pub stop_after: Option<u32>,
    /// Replay each device's share of a jump of repeating periods ([`period`]) on its own,
    /// rather than interleaved as the event loop ran them: the same calls in the same order
    /// on every device (each event of a pipeline stage touches its own device's allocator
    /// and timeline only), each device's allocator in the cache while it is replayed, and
    /// the devices at once on rayon's threads where each runs one part. Not where an event
    /// may touch two devices (a part whose streams span devices). An out-of-memory inside
    /// such a replay may leave other devices past the instant it happened: the trace says so
    /// ([`DeviceTrace::oom_out_of_order`]) and the caller runs again without.
    pub replay_by_device: bool,
}

impl RunOptions {
    /// Whether the run replays repeating periods ([`period`]): not where it simulates every
    /// one, records histories or holds tasks. A run that may pause replays only periods that
    /// end before its gate ([`period::Periodic::short_of`]).
    fn replays_periods(&self) -> bool {
        !(self.every_period || self.history || !self.held.is_empty())
    }

    /// The repeating periods of a run of `num` these options replay, if any.
    fn periods(&self, num: &Numbering, links: &[Link]) -> Option<period::Periodic> {
        let per = self.replays_periods().then(|| period::Periodic::new(num, links, self.replay_by_device)).flatten()?;
        match self.stop_after {
            Some(gate) => per.short_of(gate),
            None => Some(per),
        }
    }

    /// A device's timeline as these options keep it.
    pub fn timeline(&self) -> Timeline {
        match (self.peaks_only, self.headline) {
            (false, _) => Timeline::default(),
            (true, false) => Timeline::peaks_only(),
            (true, true) => Timeline::headline(),
        }
    }
}

/// How many events the loop handles between looks at [`RunOptions::cancel`]: a few
/// hundred microseconds of work.
const CANCEL_POLL_EVENTS: usize = 1024;

fn totals(alloc: &dyn Allocator) -> Totals {
    alloc.totals()
}

/// A program that cannot run to completion for a reason other than memory: a scheduler bug.
#[derive(Debug, Clone, PartialEq)]
pub struct Deadlock {
    pub waiting: usize,
}

impl std::error::Error for Deadlock {}

impl std::fmt::Display for Deadlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "internal error: {} tasks can never start (dependency cycle in the schedule)", self.waiting)
    }
}

/// What happened when a program spanning several devices ran: one timeline and one set of
/// allocator counters per device; task times are global.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTrace {
    pub timelines: Vec<Timeline>,
    pub start_ns: Vec<u64>,
    pub end_ns: Vec<u64>,
    pub oom: Option<OomEvent>,
    pub end_time_ns: u64,
    pub stream_busy_ns: Vec<u64>,
    pub allocators: Vec<AllocatorStats>,
    pub histories: Vec<Option<History>>,
    /// Periods of repeating schedule played without the event loop ([`period`]).
    pub periods_jumped: u64,
    /// The run ran out of memory inside a jump replayed device by device
    /// ([`RunOptions::replay_by_device`]): what the other devices recorded is not what they
    /// held at that instant, and the run must be played again without it.
    pub oom_out_of_order: bool,
}

/// Runs `program` to completion or to the first allocation that does not fit.
pub fn run(program: &Program, alloc: &mut dyn Allocator) -> Result<Trace, Deadlock> {
    run_with(program, alloc, &RunOptions::default())
}

/// [`run`], with the allocator calls `opts` asks for.
pub fn run_with(program: &Program, alloc: &mut dyn Allocator, opts: &RunOptions) -> Result<Trace, Deadlock> {
    let mut d = run_devices(program, &mut [alloc], opts)?;
    Ok(Trace {
        timeline: d.timelines.swap_remove(0),
        start_ns: d.start_ns,
        end_ns: d.end_ns,
        oom: d.oom,
        end_time_ns: d.end_time_ns,
        stream_busy_ns: d.stream_busy_ns,
        allocator: d.allocators.swap_remove(0),
        history: d.histories.into_iter().next().flatten(),
    })
}

/// Runs a program whose streams span `allocs.len()` devices (`Program::stream_device`),
/// each device's buffers through its own allocator; the first allocation that does not fit
/// on any device stops the run. Allocators see device-local stream indices.
pub fn run_devices(
    program: &Program,
    allocs: &mut [&mut dyn Allocator],
    opts: &RunOptions,
) -> Result<DeviceTrace, Deadlock> {
    run_parts(&[program], &[], allocs, opts)
}

/// A dependency between tasks of different parts of a run ([`run_parts`]): `task` waits
/// for `dep`, both in the run's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub task: u32,
    pub dep: u32,
}

/// A dependency between tasks of two parts of a run, each in its part's own numbering:
/// task `task` of part `part` waits for task `dep` of part `dep_part`. What the programs'
/// builders write; [`link_parts`] numbers it for [`run_parts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartLink {
    pub part: usize,
    pub task: u32,
    pub dep_part: usize,
    pub dep: u32,
}

/// `links` in the numbering of a run of `parts` ([`run_parts`]).
pub fn link_parts(parts: &[&Program], links: &[PartLink]) -> Vec<Link> {
    let num = Numbering::of(parts);
    links
        .iter()
        .map(|l| Link {
            task: (num.task[l.part] + l.task as usize) as u32,
            dep: (num.task[l.dep_part] + l.dep as usize) as u32,
        })
        .collect()
}

/// Tasks given as (part, task in the part's numbering), in the numbering of a run of `parts`
/// ([`run_parts`]).
pub fn part_tasks(parts: &[&Program], tasks: &[(usize, u32)]) -> Vec<u32> {
    let num = Numbering::of(parts);
    tasks.iter().map(|&(k, t)| (num.task[k] + t as usize) as u32).collect()
}

/// Runs several programs as one, without copying them into one: part k's tasks, buffers and
/// streams are numbered after those of parts 0..k (task indices in `links`,
/// [`RunOptions::empty_cache_after`] and the trace use that numbering), and part k's streams
/// run on device k unless its `Program::stream_device` says otherwise. `links` adds the
/// dependencies between parts (a pipeline stage's receive waits for the previous stage's
/// send). The result is [`run_devices`]' on the programs merged into one, to the event.
pub fn run_parts(
    parts: &[&Program],
    links: &[Link],
    allocs: &mut [&mut dyn Allocator],
    opts: &RunOptions,
) -> Result<DeviceTrace, Deadlock> {
    debug_assert!(opts.stop_after.is_none(), "a run that may pause is run_parts_until's");
    match run_parts_until(parts, links, allocs, opts)? {
        Progress::Done(t) => Ok(t),
        Progress::Paused(p) => Err(Deadlock { waiting: p.state.flat.stream.len() - p.state.done }),
    }
}

/// How far a run got: to its end (or its out-of-memory), or paused after
/// [`RunOptions::stop_after`]'s task. (Returned once per run: the size of its larger
/// variant costs nothing worth a box.)
#[allow(clippy::large_enum_variant)]
pub enum Progress {
    Done(DeviceTrace),
    Paused(Box<Paused>),
}

/// A run paused right after [`RunOptions::stop_after`]'s task ended: its frees made, the
/// tasks it unblocked counted, nothing else started at that instant yet. Where every task a
/// longer program adds waits for that task, everything the run did so far is what the longer
/// program's run does up to that instant, and [`Paused::resume`] carries it on from there
/// over the longer program instead of running it again from the start.
pub struct Paused {
    state: LoopState,
    /// The paused program's frees: a longer program may file a free under a task that has
    /// already ended (or an `empty_cache()` call after it, `LoopState::empty_cache`), and
    /// then the run so far is not its own.
    free: Arc<TaskLists>,
    /// The task the run paused after, which every task the longer program adds waits for.
    gate: u32,
}

/// [`run_parts`], pausing after [`RunOptions::stop_after`]'s task ends (where it is set and
/// the run gets there: an out-of-memory or the end of the program comes back as
/// [`Progress::Done`]). A run that may pause replays only the repeating periods before the
/// task it pauses after ([`period::Periodic::short_of`]).
pub fn run_parts_until(
    parts: &[&Program],
    links: &[Link],
    allocs: &mut [&mut dyn Allocator],
    opts: &RunOptions,
) -> Result<Progress, Deadlock> {
    let num = Numbering::of(parts);
    let mut st = LoopState::new(&num, links, allocs.len().max(1), opts);
    if opts.history {
        for a in allocs.iter_mut() {
            a.start_history();
        }
    }
    st.per = opts.periods(&num, links);
    drive(st, &num, allocs, opts)
}

impl Paused {
    /// Carries the paused run on over `parts`, a program that extends the paused one: the
    /// same tasks first, then more, each of which waits, directly or through others, for the
    /// task the run paused after. `allocs` are the allocators the run so far used, and `opts`
    /// the options for the longer program (its `empty_cache()` calls, where to pause next).
    /// None where the run so far is not the longer program's: a free or an `empty_cache()`
    /// call filed under a task that has already ended, a stream that changed its links or its
    /// device, several parts, held tasks or links between parts (none of which the sweeps'
    /// unpipelined programs have); the caller then runs `parts` afresh on new allocators.
    pub fn resume(
        self: Box<Self>,
        parts: &[&Program],
        links: &[Link],
        allocs: &mut [&mut dyn Allocator],
        opts: &RunOptions,
    ) -> Option<Result<Progress, Deadlock>> {
        let Paused { mut state, free, gate } = *self;
        let st = &mut state;
        let num = Numbering::of(parts);
        let (old_n, n) = (st.flat.stream.len(), num.tasks());
        let ns = num.streams().max(1);
        if parts.len() != 1 || !links.is_empty() || !opts.held.is_empty() || n < old_n || ns < st.busy.len() {
            return None;
        }
        let p = parts[0];
        let nd = allocs.len().max(1);
        let (dev_of, local, link_of, sms) = streams_of(&num, ns, nd);
        let old_ns = st.busy.len();
        if dev_of[..old_ns] != st.dev_of[..] || link_of[..old_ns] != st.link_of[..] || sms != st.sms {
            return None;
        }
        let cache = empty_cache_flags(n, &opts.empty_cache_after);
        let ended = |t: usize| st.rec.end_ns[t] != u64::MAX;
        // A task's frees are only ever added to (the builder files them as it decides them,
        // [`TaskLists::from_pairs`] keeping their order), so a task that ended kept its own
        // if it has as many.
        if (0..old_n).any(|t| ended(t) && (free.len_of(t) != p.free.len_of(t) || st.empty_cache[t] != cache[t])) {
            return None;
        }
        debug_assert!(waits_for(p, gate, old_n), "a task the longer program adds does not wait for the pause");
        debug_assert!((0..old_n).all(|t| !ended(t) || free.of(t) == p.free.of(t)), "a free list shrank or changed");
        // The longer program's tables, the run so far carried over.
        st.rec.start_ns.resize(n, u64::MAX);
        st.rec.end_ns.resize(n, u64::MAX);
        let ended = |t: usize| st.rec.end_ns[t] != u64::MAX;
        st.flat.extend(&num, old_n, ns);
        // Only the tasks that have not ended will look up their dependents.
        let first_live = (0..n).find(|&t| !ended(t)).unwrap_or(n);
        let (dependents, _) = Dependents::of(&num, links, first_live);
        let mut remaining = std::mem::take(&mut st.remaining);
        remaining.resize(n, 0);
        for (t, r) in remaining.iter_mut().enumerate().skip(old_n) {
            *r = p.deps.of(t).iter().filter(|&&d| !ended(d as usize)).count() as u32;
            if *r == 0 {
                st.candidates.push(st.flat.stream[t] as usize);
            }
        }
        st.dependents = dependents;
        st.remaining = remaining;
        // Room in the timelines for what the added tasks may record ([`sample_bound`]).
        let mut grow = vec![0usize; nd];
        for t in old_n..n {
            grow[dev_of[st.flat.stream[t] as usize]] += 2 * p.alloc.of(t).len() + usize::from(cache[t]);
        }
        for (tl, g) in st.rec.timelines.iter_mut().zip(grow) {
            tl.reserve(g);
        }
        st.dev_of = dev_of;
        st.local = local;
        st.link_of = link_of;
        st.empty_cache = cache;
        st.head.resize(ns, 0);
        st.busy.resize(ns, false);
        st.rec.stream_busy_ns.resize(ns, 0);
        st.rec.part_of_stream = num.part_of_streams();
        st.rec.live_on.resize(num.buffers(), 0);
        // Repeating periods are replayed only where none of their tasks has run yet.
        st.jumped_before = jumped(st.jumped_before, st.per.as_ref());
        st.per = opts.periods(&num, links).and_then(|per| per.unstarted(&st.rec.start_ns));
        Some(drive(state, &num, allocs, opts))
    }
}

/// Whether every task of `p` from `from` on waits for `gate`'s end: through a dependency,
/// or behind a task on its stream that does (a stream runs its tasks in program order).
fn waits_for(p: &Program, gate: u32, from: usize) -> bool {
    let mut waits = vec![false; p.tasks.len()];
    let mut last_on_stream: Vec<Option<usize>> = vec![None; p.streams.len().max(1)];
    for (t, task) in p.tasks.iter().enumerate() {
        let s = task.stream as usize;
        waits[t] = t == gate as usize
            || last_on_stream[s].is_some_and(|q| waits[q])
            || p.deps.of(t).iter().any(|&d| waits[d as usize]);
        last_on_stream[s] = Some(t);
    }
    waits[from..].iter().all(|&w| w)
}

/// Each stream's device, its index among its device's streams (the allocator's view), the
/// links it occupies, and each device's SMs.
fn streams_of(num: &Numbering, ns: usize, nd: usize) -> (Vec<usize>, Vec<usize>, Vec<u8>, Vec<u32>) {
    let mut dev_of = vec![0usize; ns];
    for (k, p) in num.parts.iter().enumerate() {
        for j in 0..p.streams.len() {
            dev_of[num.stream[k] + j] = p.stream_device.get(j).map_or(k, |&d| d as usize);
        }
    }
    let mut local = vec![0usize; ns];
    let mut count = vec![0usize; nd];
    for s in 0..ns {
        local[s] = count[dev_of[s]];
        count[dev_of[s]] += 1;
    }
    let mut link_of = vec![0u8; ns];
    for (k, p) in num.parts.iter().enumerate() {
        for (j, &m) in p.stream_links.iter().enumerate().take(p.streams.len()) {
            link_of[num.stream[k] + j] = m;
        }
    }
    let mut sms = vec![0u32; nd];
    for (k, p) in num.parts.iter().enumerate() {
        for j in 0..p.streams.len() {
            let d = dev_of[num.stream[k] + j];
            sms[d] = sms[d].max(p.sms);
        }
    }
    (dev_of, local, link_of, sms)
}

/// Per task of a run of `n`, whether the engine calls `empty_cache()` after it.
fn empty_cache_flags(n: usize, after: &[u32]) -> Vec<bool> {
    let mut empty_cache = vec![false; n];
    for &t in after {
        if let Some(f) = empty_cache.get_mut(t as usize) {
            *f = true;
        }
    }
    empty_cache
}

/// Everything the event loop carries from one event to the next, owned, so that a run can
/// pause ([`Paused`]) and carry on.
struct LoopState {
    dev_of: Vec<usize>,
    local: Vec<usize>,
    empty_cache: Vec<bool>,
    link_of: Vec<u8>,
    sms: Vec<u32>,
    shared: links::SharedLinks,
    moved: Vec<(u32, u64)>,
    flat: Flat,
    dependents: Dependents,
    remaining: Vec<u32>,
    head: Vec<usize>,
    busy: Vec<bool>,
    /// Events keyed by (end time, sequence number) packed into one integer (time in the
    /// high half), the cheapest key to compare; the sequence number is the start's position
    /// in `started`, which says which task it was.
    heap: BinaryHeap<Reverse<u128>>,
    started: Vec<u32>,
    held: Vec<bool>,
    per: Option<period::Periodic>,
    /// Periods jumped before the run last carried on from a pause ([`Paused::resume`]
    /// replaces `per`).
    jumped_before: u64,
    now: u64,
    done: usize,
    /// Streams that may be able to start a task: at first all of them; after an event, the
    /// finished task's stream and the streams of the tasks it unblocked. Any other stream is
    /// as it was after the previous event (busy, drained, or its next task still waiting),
    /// so polling the candidates in index order starts exactly what polling every stream
    /// would. Starting a task never unblocks another, so one pass is enough.
    candidates: Vec<usize>,
    /// What [`Memory`] holds while the loop runs.
    rec: Recorded,
}

impl LoopState {
    fn new(num: &Numbering, links: &[Link], nd: usize, opts: &RunOptions) -> LoopState {
        let n = num.tasks();
        let ns = num.streams().max(1);
        let (dev_of, local, link_of, sms) = streams_of(num, ns, nd);
        let flat = Flat::of(num, ns);
        let (dependents, remaining) = Dependents::of(num, links, 0);
        let mut timelines = vec![opts.timeline(); nd];
        for (tl, n) in timelines.iter_mut().zip(sample_bound(num, &flat, &dev_of, nd, &opts.empty_cache_after)) {
            tl.reserve(n);
        }
        let mut held = Vec::new();
        if !opts.held.is_empty() {
            held = vec![false; n];
            opts.held.iter().for_each(|&t| held[t as usize] = true);
        }
        LoopState {
            shared: links::SharedLinks::new(&sms),
            dev_of,
            local,
            empty_cache: empty_cache_flags(n, &opts.empty_cache_after),
            link_of,
            sms,
            moved: Vec::new(),
            flat,
            dependents,
            remaining,
            head: vec![0usize; ns],
            busy: vec![false; ns],
            heap: BinaryHeap::new(),
            started: Vec::with_capacity(n),
            held,
            per: None,
            jumped_before: 0,
            now: 0,
            done: 0,
            candidates: (0..ns).collect(),
            rec: Recorded::new(num, timelines),
        }
    }
}

/// The periods a run has jumped: `before` its last carrying on from a pause
/// ([`LoopState::jumped_before`]) and those of its current `per`.
fn jumped(before: u64, per: Option<&period::Periodic>) -> u64 {
    before + per.map_or(0, |p| p.jumped)
}

/// The event loop, from where `state` stands to the end of the run, its out-of-memory, or
/// the end of [`RunOptions::stop_after`]'s task.
fn drive(
    state: LoopState,
    num: &Numbering,
    allocs: &mut [&mut dyn Allocator],
    opts: &RunOptions,
) -> Result<Progress, Deadlock> {
    let n = num.tasks();
    // The state as locals for the loop (fields behind a reference cost the hot loop loads
    // it cannot keep in registers), put back together where the run pauses.
    let LoopState {
        dev_of,
        local,
        empty_cache,
        link_of,
        sms,
        mut shared,
        mut moved,
        flat,
        dependents,
        mut remaining,
        mut head,
        mut busy,
        mut heap,
        mut started,
        held,
        mut per,
        jumped_before,
        mut now,
        mut done,
        mut candidates,
        rec,
    } = state;
    let Flat { stream: task_stream, duration, ctas, queues } = &flat;
    let mut mem = Memory { num, dev_of: &dev_of, local: &local, empty_cache: &empty_cache, allocs, rec };
    loop {
        // Start whatever can start now, stream by stream.
        candidates.sort_unstable();
        candidates.dedup();
        for &s in &candidates {
            if busy[s] || head[s] >= queues[s].len() {
                continue;
            }
            let ti = queues[s][head[s]];
            if remaining[ti as usize] > 0 {
                continue;
            }
            if !held.is_empty() && held[ti as usize] {
                return Ok(Progress::Done(mem.finish(now, None, jumped(jumped_before, per.as_ref()))));
            }
            if let Err(oom) = mem.start(ti, s, now) {
                return Ok(Progress::Done(mem.out_of_memory(oom, jumped(jumped_before, per.as_ref()))));
            }
            if let Some(p) = per.as_mut() {
                p.on_start(ti, now);
            }
            busy[s] = true;
            head[s] += 1;
            if link_of[s] == 0 {
                heap.push(Reverse(u128::from(now + duration[ti as usize]) << 64 | started.len() as u128));
                started.push(ti);
            } else {
                // On shared links: this task's end, and those of the tasks it slows down.
                let dv = dev_of[s];
                shared.start(now, dv, link_of[s], u32::from(ctas[ti as usize]), ti, duration[ti as usize], &mut moved);
                for &(t, end) in &moved {
                    shared.set_seq(dv, t, started.len() as u64);
                    heap.push(Reverse(u128::from(end) << 64 | started.len() as u128));
                    started.push(t);
                }
            }
        }
        candidates.clear();
        if let Some(c) = opts.cancel.as_ref().filter(|_| done % CANCEL_POLL_EVENTS == 0) {
            if c.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Deadlock { waiting: n - done });
            }
        }
        let Some(Reverse(key)) = heap.pop() else { break };
        let mut ti = started[key as u64 as usize];
        let stream = task_stream[ti as usize] as usize;
        let shares = link_of[stream] != 0;
        if shares && !shared.is_current(dev_of[stream], ti, key as u64) {
            // Superseded: the task's end moved when another transfer joined or left its links.
            continue;
        }
        now = (key >> 64) as u64;
        if let Some(p) = per.as_mut() {
            if let Some(i) = p.anchor_index(ti) {
                let mut st = period::State {
                    now: &mut now,
                    heap: &mut heap,
                    started: &mut started,
                    head: &mut head,
                    busy: &busy,
                    remaining: &mut remaining,
                    done: &mut done,
                    shared: &mut shared,
                    mem: &mut mem,
                };
                if let Err(oom) = p.cut(i, &mut ti, &mut st, queues, task_stream, &dependents) {
                    let mut dt = mem.out_of_memory(oom, jumped(jumped_before, Some(p)));
                    dt.oom_out_of_order = p.oom_out_of_order;
                    return Ok(Progress::Done(dt));
                }
            }
            p.on_finish(ti, now);
        }
        if shares {
            shared.finish(now, dev_of[stream], ti, &mut moved);
            for &(t, end) in &moved {
                shared.set_seq(dev_of[stream], t, started.len() as u64);
                heap.push(Reverse(u128::from(end) << 64 | started.len() as u128));
                started.push(t);
            }
        }
        mem.end(ti, stream, now);
        busy[stream] = false;
        done += 1;
        candidates.push(stream);
        for &d in dependents.of_task(ti) {
            remaining[d as usize] -= 1;
            if let Some(p) = per.as_mut() {
                p.on_unblock(ti, d);
            }
            if remaining[d as usize] == 0 {
                candidates.push(task_stream[d as usize] as usize);
            }
        }
        if opts.stop_after == Some(ti) {
            let rec = mem.rec;
            let state = LoopState {
                dev_of,
                local,
                empty_cache,
                link_of,
                sms,
                shared,
                moved,
                flat,
                dependents,
                remaining,
                head,
                busy,
                heap,
                started,
                held,
                per,
                jumped_before,
                now,
                done,
                candidates,
                rec,
            };
            let free = num.parts.first().map(|p| p.free.clone()).unwrap_or_default();
            return Ok(Progress::Paused(Box::new(Paused { state, free, gate: ti })));
        }
    }
    if done < n && held.is_empty() {
        return Err(Deadlock { waiting: n - done });
    }
    Ok(Progress::Done(mem.finish(now, None, jumped(jumped_before, per.as_ref()))))
}

/// What tasks do to memory as they start and end (every part's buffers on its device's
/// allocator and timeline), and the times they did it: the part of a run that
/// [`period`]'s extrapolation replays period by period.
pub(crate) struct Memory<'p, 'a, 'b> {
    num: &'p Numbering<'p>,
    pub(super) dev_of: &'p [usize],
    local: &'p [usize],
    empty_cache: &'p [bool],
    allocs: &'a mut [&'b mut dyn Allocator],
    rec: Recorded,
}

impl View<'_, '_> {
    /// [`Memory::start`] on the tables this view holds.
    #[inline]
    pub(super) fn start(&mut self, ti: u32, s: usize, now: u64) -> Result<(), OomEvent> {
        let num = self.num;
        let k = self.part_of_stream[s] as usize;
        let (prog, bo) = (num.parts[k], num.buffer[k]);
        let dv = self.dev_of[s];
        for &lb in prog.alloc.of(ti as usize - num.task[k]) {
            let spec = &prog.buffers[lb as usize];
            let b = bo + lb as usize;
            let alloc = &mut *self.allocs[dv - self.dev0];
            let pool = match spec.pool {
                TASK_STREAM => s,
                p => Some(num.stream[k] + p as usize).filter(|&g| self.dev_of[g] == dv).unwrap_or(s),
            };
            let (delta, after) = match alloc.malloc_counted(b, spec.bytes, self.local[pool], now) {
                Ok(d) => d,
                Err(error) => {
                    return Err(OomEvent {
                        device: dv as u16,
                        task: ti,
                        buffer: b as u32,
                        time_ns: now,
                        error,
                        live: Vec::new(),
                    })
                }
            };
            self.live_on[b - self.b0] = dv as u16 + 1;
            self.timelines[dv - self.dev0].record(now, spec.category, delta as i64, after, ti as usize);
        }
        self.start_ns[ti as usize - self.t0] = now;
        Ok(())
    }

    /// [`Memory::end`] on the tables this view holds.
    #[inline]
    pub(super) fn end(&mut self, ti: u32, stream: usize, now: u64) {
        let num = self.num;
        let k = self.part_of_stream[stream] as usize;
        let (prog, bo) = (num.parts[k], num.buffer[k]);
        let dv = self.dev_of[stream];
        for &lb in prog.free.of(ti as usize - num.task[k]) {
            let b = bo + lb as usize;
            if let Some(bd) = (self.live_on[b - self.b0] as usize).checked_sub(1) {
                let spec = &prog.buffers[lb as usize];
                let alloc = &mut *self.allocs[bd - self.dev0];
                // A buffer freed by another device's task (a pipeline send's source) is
                // released as if by its own device's first stream.
                let on = if bd == dv { self.local[stream] } else { 0 };
                let (freed, after) = alloc.free_counted(b, spec.bytes, on, now);
                self.live_on[b - self.b0] = 0;
                self.timelines[bd - self.dev0].record(now, spec.category, -(freed as i64), after, ti as usize);
            }
        }
        let alloc = &mut *self.allocs[dv - self.dev0];
        alloc.stream_synced(self.local[stream], now);
        if self.empty_cache[ti as usize] {
            alloc.empty_cache();
            self.timelines[dv - self.dev0].record_totals(now, totals(alloc), ti as usize);
        }
        self.end_ns[ti as usize - self.t0] = now;
        self.stream_busy_ns[stream - self.s0] += now - self.start_ns[ti as usize - self.t0];
    }
}

/// What a run has recorded so far of its buffers, its devices' memory and its tasks' times:
/// what [`Memory`] writes as tasks start and end, kept whole by a pause ([`Paused`]).
pub(crate) struct Recorded {
    /// Per buffer: 0 while it is not live, else 1 + its device (one array, so that an
    /// allocation or a free reads and writes one place per buffer).
    live_on: Vec<u16>,
    timelines: Vec<Timeline>,
    start_ns: Vec<u64>,
    end_ns: Vec<u64>,
    stream_busy_ns: Vec<u64>,
    /// The part each stream of the run belongs to ([`Numbering::part_of_streams`]): a task's
    /// part by its stream, where a search of the parts' first tasks was a few percent of a
    /// pipeline's replayed periods.
    part_of_stream: Vec<u32>,
}

impl Recorded {
    /// Nothing recorded yet for a run of `num`, its devices' `timelines` empty.
    fn new(num: &Numbering, timelines: Vec<Timeline>) -> Recorded {
        let n = num.tasks();
        Recorded {
            live_on: vec![0u16; num.buffers()],
            timelines,
            start_ns: vec![u64::MAX; n],
            end_ns: vec![u64::MAX; n],
            stream_busy_ns: vec![0; num.streams().max(1)],
            part_of_stream: num.part_of_streams(),
        }
    }
}

/// The `len` items of `v` after its first `skip`; `v` becomes what follows them.
fn split_off<'s, T>(v: &mut &'s mut [T], skip: usize, len: usize) -> &'s mut [T] {
    let (_, rest) = std::mem::take(v).split_at_mut(skip);
    let (mine, rest) = rest.split_at_mut(len);
    *v = rest;
    mine
}

/// What a task's start and end write, as [`Memory`] holds it or one device's share of it
/// ([`Memory::device_views`]): each table starts at the index its offset says (all 0 for the
/// whole), so that several devices' replays can run at once on disjoint parts of the tables.
pub(super) struct View<'v, 'b> {
    num: &'v Numbering<'v>,
    dev_of: &'v [usize],
    local: &'v [usize],
    empty_cache: &'v [bool],
    part_of_stream: &'v [u32],
    /// Devices from `dev0` on.
    allocs: &'v mut [&'b mut dyn Allocator],
    timelines: &'v mut [Timeline],
    dev0: usize,
    /// Buffers from `b0` on.
    live_on: &'v mut [u16],
    b0: usize,
    /// Tasks from `t0` on.
    start_ns: &'v mut [u64],
    end_ns: &'v mut [u64],
    t0: usize,
    /// Streams from `s0` on.
    stream_busy_ns: &'v mut [u64],
    s0: usize,
}

impl<'b> Memory<'_, '_, 'b> {
    /// The whole of what tasks write ([`View`]).
    #[inline]
    fn view(&mut self) -> View<'_, 'b> {
        View {
            num: self.num,
            dev_of: self.dev_of,
            local: self.local,
            empty_cache: self.empty_cache,
            part_of_stream: &self.rec.part_of_stream,
            allocs: &mut *self.allocs,
            timelines: &mut self.rec.timelines,
            dev0: 0,
            live_on: &mut self.rec.live_on,
            b0: 0,
            start_ns: &mut self.rec.start_ns,
            end_ns: &mut self.rec.end_ns,
            t0: 0,
            stream_busy_ns: &mut self.rec.stream_busy_ns,
            s0: 0,
        }
    }

    /// Task `ti` starts on stream `s` at `now`: its buffers are allocated, in order. The
    /// allocation that does not fit comes back without what was live
    /// ([`Memory::out_of_memory`] adds it).
    #[inline]
    fn start(&mut self, ti: u32, s: usize, now: u64) -> Result<(), OomEvent> {
        self.view().start(ti, s, now)
    }

    /// Task `ti` of `stream` ends at `now`: its frees, then its stream's sync, then the
    /// `empty_cache()` the program calls after it.
    #[inline]
    fn end(&mut self, ti: u32, stream: usize, now: u64) {
        self.view().end(ti, stream, now)
    }

    /// Whether every stream of part `k` runs on device `d`: then each start and end of the
    /// part's tasks touches that device's allocator and timeline alone.
    pub(super) fn part_on_device(&self, k: usize, d: usize) -> bool {
        self.dev_of[self.num.stream[k]..self.num.stream[k + 1]].iter().all(|&x| x == d)
    }

    /// One view per (device, part) of `owners`, each part on its device alone
    /// ([`Memory::part_on_device`]), each holding that device's allocator and timeline and
    /// the part's buffers, tasks and streams; None unless the devices are distinct and the
    /// parts distinct. A part's tasks, buffers and streams are contiguous in the run's
    /// numbering, so the views are disjoint slices.
    pub(super) fn device_views(&mut self, owners: &[(usize, usize)]) -> Option<Vec<View<'_, 'b>>> {
        let mut by_part = owners.to_vec();
        by_part.sort_unstable_by_key(|&(_, k)| k);
        let mut devices: Vec<usize> = owners.iter().map(|o| o.0).collect();
        devices.sort_unstable();
        devices.dedup();
        let num = self.num;
        if devices.len() != owners.len() || by_part.windows(2).any(|w| w[0].1 == w[1].1) {
            return None;
        }
        let mut allocs: Vec<Option<&mut [&mut dyn Allocator]>> = self.allocs.chunks_mut(1).map(Some).collect();
        let mut timelines: Vec<Option<&mut [Timeline]>> = self.rec.timelines.chunks_mut(1).map(Some).collect();
        let (mut live_on, mut start_ns, mut end_ns, mut busy) = (
            &mut self.rec.live_on[..],
            &mut self.rec.start_ns[..],
            &mut self.rec.end_ns[..],
            &mut self.rec.stream_busy_ns[..],
        );
        let (mut b0, mut t0, mut s0) = (0, 0, 0);
        let mut views = Vec::with_capacity(by_part.len());
        for &(d, k) in &by_part {
            let (bk, tk, sk) = (num.buffer[k], num.task[k], num.stream[k]);
            let mine_live = split_off(&mut live_on, bk - b0, num.buffer[k + 1] - bk);
            let mine_start = split_off(&mut start_ns, tk - t0, num.task[k + 1] - tk);
            let mine_end = split_off(&mut end_ns, tk - t0, num.task[k + 1] - tk);
            let mine_busy = split_off(&mut busy, sk - s0, num.stream[k + 1] - sk);
            (b0, t0, s0) = (num.buffer[k + 1], num.task[k + 1], num.stream[k + 1]);
            views.push(View {
                num,
                dev_of: self.dev_of,
                local: self.local,
                empty_cache: self.empty_cache,
                part_of_stream: &self.rec.part_of_stream,
                allocs: allocs[d].take()?,
                timelines: timelines[d].take()?,
                dev0: d,
                live_on: mine_live,
                b0: bk,
                start_ns: mine_start,
                end_ns: mine_end,
                t0: tk,
                stream_busy_ns: mine_busy,
                s0: sk,
            });
        }
        Some(views)
    }

    /// The run's trace as it stands at `now`, `periods_jumped` periods of it replayed.
    fn finish(self, now: u64, oom: Option<OomEvent>, periods_jumped: u64) -> DeviceTrace {
        DeviceTrace {
            timelines: self.rec.timelines,
            start_ns: self.rec.start_ns,
            end_ns: self.rec.end_ns,
            oom,
            end_time_ns: now,
            stream_busy_ns: self.rec.stream_busy_ns,
            allocators: self.allocs.iter().map(|a| a.stats()).collect(),
            histories: self.allocs.iter_mut().map(|a| a.take_history()).collect(),
            periods_jumped,
            oom_out_of_order: false,
        }
    }

    /// The run stops at the allocation that did not fit, with what was live on its device.
    fn out_of_memory(mut self, mut oom: OomEvent, periods_jumped: u64) -> DeviceTrace {
        let (dv, ti, now) = (oom.device as usize, oom.task as usize, oom.time_ns);
        oom.live = self
            .rec
            .live_on
            .iter()
            .enumerate()
            .filter(|(_, &on)| on as usize == dv + 1)
            .map(|(i, _)| i as u32)
            .collect();
        self.rec.start_ns[ti] = now;
        // The failed allocation released the cache before giving up.
        self.rec.timelines[dv].record_totals(now, totals(&*self.allocs[dv]), ti);
        self.finish(now, Some(oom), periods_jumped)
    }
}

/// Each of the first `devices` parts' view of a [`run_parts`] run whose part k runs on
/// device k: its tasks' times, its device's timeline and allocator counters, its streams'
/// busy time and the OOM if it happened there, all in the part's own indices.
pub fn part_traces(parts: &[&Program], devices: usize, t: DeviceTrace) -> Vec<Trace> {
    let num = Numbering::of(parts);
    let DeviceTrace {
        timelines, start_ns, end_ns, oom, end_time_ns, stream_busy_ns, allocators, mut histories, ..
    } = t;
    histories.resize(timelines.len(), None);
    timelines
        .into_iter()
        .zip(allocators)
        .zip(histories)
        .take(devices)
        .enumerate()
        .map(|(k, ((mut timeline, allocator), mut history))| {
            let (to, bo, so) = (num.task[k], num.buffer[k], num.stream[k]);
            let n = parts[k].tasks.len();
            timeline.shift_tasks(to);
            let oom = oom.as_ref().filter(|o| o.device as usize == k).map(|o| {
                let mut o = o.clone();
                o.task -= to as u32;
                o.buffer -= bo as u32;
                o.live.iter_mut().for_each(|b| *b -= bo as u32);
                o
            });
            // The history names tensors in the part's own numbering too.
            if let Some(h) = history.as_mut() {
                let local = |t: &mut u32| {
                    if *t != NO_TENSOR {
                        *t = t.checked_sub(bo as u32).unwrap_or(NO_TENSOR);
                    }
                };
                h.events.iter_mut().for_each(|e| local(&mut e.tensor));
                h.segments.iter_mut().flat_map(|s| s.blocks.iter_mut()).for_each(|b| local(&mut b.tensor));
            }
            Trace {
                timeline,
                start_ns: start_ns[to..to + n].to_vec(),
                end_ns: end_ns[to..to + n].to_vec(),
                oom,
                end_time_ns,
                stream_busy_ns: stream_busy_ns[so..so + parts[k].streams.len()].to_vec(),
                allocator,
                history,
            }
        })
        .collect()
}

/// A run's parts, and where each part's tasks, buffers and streams start in the run's
/// numbering (one more entry than parts: the totals).
struct Numbering<'a> {
    parts: &'a [&'a Program],
    task: Vec<usize>,
    buffer: Vec<usize>,
    stream: Vec<usize>,
}

impl<'a> Numbering<'a> {
    fn of(parts: &'a [&'a Program]) -> Numbering<'a> {
        let starts = |len: &dyn Fn(&Program) -> usize| {
            let mut v = Vec::with_capacity(parts.len() + 1);
            v.push(0);
            for p in parts {
                v.push(v.last().copied().unwrap_or(0) + len(p));
            }
            v
        };
        Numbering {
            parts,
            task: starts(&|p| p.tasks.len()),
            buffer: starts(&|p| p.buffers.len()),
            stream: starts(&|p| p.streams.len()),
        }
    }

    fn tasks(&self) -> usize {
        self.task.last().copied().unwrap_or(0)
    }

    fn buffers(&self) -> usize {
        self.buffer.last().copied().unwrap_or(0)
    }

    fn streams(&self) -> usize {
        self.stream.last().copied().unwrap_or(0)
    }

    /// Per stream of the run, the part it belongs to.
    fn part_of_streams(&self) -> Vec<u32> {
        let mut out = vec![0u32; self.streams()];
        for k in 0..self.parts.len() {
            out[self.stream[k]..self.stream[k + 1]].fill(k as u32);
        }
        out
    }

    /// The part task `t` belongs to (a part without tasks owns none).
    fn part_of(&self, t: usize) -> usize {
        self.task.partition_point(|&s| s <= t) - 1
    }
}

/// What the event loop reads of every task's record, in the run's numbering, copied out of
/// the parts' programs in one pass in program order: the loop then visits tasks in event
/// order without touching their records (a cache miss each in a large run).
struct Flat {
    /// The task's stream in the run's numbering.
    stream: Vec<u32>,
    duration: Vec<u64>,
    ctas: Vec<u16>,
    /// Each stream's tasks, in program order.
    queues: Vec<Vec<u32>>,
}

impl Flat {
    fn of(num: &Numbering, streams: usize) -> Flat {
        let n = num.tasks();
        let mut f = Flat {
            stream: Vec::with_capacity(n),
            duration: Vec::with_capacity(n),
            ctas: Vec::with_capacity(n),
            queues: vec![Vec::new(); streams],
        };
        for (k, p) in num.parts.iter().enumerate() {
            f.push(num.stream[k], &p.tasks);
        }
        f
    }

    /// Appends the tasks of a one-part run from `from` on (a paused run's program, extended).
    fn extend(&mut self, num: &Numbering, from: usize, streams: usize) {
        self.queues.resize(streams, Vec::new());
        self.push(0, &num.parts[0].tasks[from..]);
    }

    /// Appends `tasks`, whose streams are numbered from `first_stream` in the run.
    fn push(&mut self, first_stream: usize, tasks: &[Task]) {
        for t in tasks {
            let s = first_stream + t.stream as usize;
            self.queues[s].push(self.stream.len() as u32);
            self.stream.push(s as u32);
            self.duration.push(t.duration_ns);
            self.ctas.push(t.ctas);
        }
    }
}

/// At most how many samples each device's timeline records: one per allocation and one per
/// free of a buffer its tasks allocate, one per `empty_cache()` and one at an OOM. Reserving
/// them up front spares copying a growing timeline of a large program.
fn sample_bound(num: &Numbering, flat: &Flat, dev_of: &[usize], nd: usize, empty_cache_after: &[u32]) -> Vec<usize> {
    let mut n = vec![1usize; nd];
    for (k, p) in num.parts.iter().enumerate() {
        for (t, task) in p.tasks.iter().enumerate() {
            n[dev_of[num.stream[k] + task.stream as usize]] += 2 * p.alloc.of(t).len();
        }
    }
    for &t in empty_cache_after {
        if let Some(&s) = flat.stream.get(t as usize) {
            n[dev_of[s as usize]] += 1;
        }
    }
    n
}

/// Calls `f(task, dep)` for every dependency of a run on a task from `from` on, in the run's
/// numbering. (A task's dependencies come before it in its program.)
fn for_each_dep(num: &Numbering, links: &[Link], from: usize, mut f: impl FnMut(usize, usize)) {
    for (k, p) in num.parts.iter().enumerate() {
        let to = num.task[k];
        for i in from.saturating_sub(to)..p.deps.len() {
            for &d in p.deps.of(i) {
                if to + d as usize >= from {
                    f(to + i, to + d as usize);
                }
            }
        }
    }
    for l in links.iter().filter(|l| l.dep as usize >= from) {
        f(l.task as usize, l.dep as usize);
    }
}

/// Each task's dependents (the tasks that list it in `deps`, or wait for it through a
/// [`Link`]), in one flat array rather than a vector per task: a run has hundreds of
/// thousands of tasks.
struct Dependents {
    /// Task i's dependents are `list[start[i]..start[i + 1]]`.
    start: Vec<u32>,
    list: Vec<u32>,
}

impl Dependents {
    /// The dependents of every task from `from` on (those of earlier tasks left empty: a
    /// paused run carried on, whose tasks before `from` have all ended, never looks them
    /// up), and how many dependencies from `from` on each task has (all of them at 0).
    fn of(num: &Numbering, links: &[Link], from: usize) -> (Dependents, Vec<u32>) {
        let n = num.tasks();
        let mut start = vec![0u32; n + 1];
        let mut deps = vec![0u32; n];
        for_each_dep(num, links, from, |t, d| {
            start[d + 1] += 1;
            deps[t] += 1;
        });
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut list = vec![0u32; start[n] as usize];
        for_each_dep(num, links, from, |i, d| {
            list[next[d] as usize] = i as u32;
            next[d] += 1;
        });
        (Dependents { start, list }, deps)
    }

    fn of_task(&self, t: u32) -> &[u32] {
        &self.list[self.start[t as usize] as usize..self.start[t as usize + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::ExactAllocator;

    fn buf(bytes: u64) -> BufferSpec {
        BufferSpec { bytes, category: Category::Activations, name: 0, pool: TASK_STREAM }
    }

    /// A task: (stream, duration, deps, alloc, free).
    type T<'a> = (u16, u64, &'a [u32], &'a [u32], &'a [u32]);

    /// A program of `streams` streams running `tasks`, with `buffers`.
    fn program(streams: usize, tasks: &[T], buffers: Vec<BufferSpec>) -> Program {
        let mut p = Program { streams: vec!["compute".into(); streams], buffers: buffers.into(), ..Default::default() };
        for &(stream, duration_ns, deps, alloc, free) in tasks {
            p.push_task(Task { stream, duration_ns, ..Default::default() }, deps, alloc, free);
        }
        p
    }

    /// `periods` micro-batches of a compute task (its activation held two periods, and
    /// `leak` bytes never freed) and a collective after it, each period marked as a
    /// scheduler marks it.
    fn periodic(periods: u32, leak: u64) -> Program {
        let mut p = Program { streams: vec!["compute".into(), "nccl".into()], ..Default::default() };
        for i in 0..periods {
            p.period_marks.push(p.tasks.len() as u32);
            let (act, kept) = (p.buffers.len() as u32, p.buffers.len() as u32 + 1);
            std::sync::Arc::make_mut(&mut p.buffers).extend([buf(1 << 20), buf(leak)]);
            let prev: Vec<u32> = if i > 0 { vec![p.tasks.len() as u32 - 2] } else { vec![] };
            // The activation of two periods back is freed by this period's compute.
            let free: Vec<u32> = if i >= 2 { vec![act - 4] } else { vec![] };
            let c = p.push_task(Task { stream: 0, duration_ns: 100, ..Default::default() }, &prev, &[act, kept], &free);
            p.push_task(Task { stream: 1, duration_ns: 30, ..Default::default() }, &[c], &[], &[]);
        }
        p
    }

    #[test]
    fn a_raised_cancel_flag_stops_the_run_and_a_lowered_one_does_not() {
        let p = periodic(2_000, 0);
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opts = RunOptions { every_period: true, cancel: Some(flag.clone()), ..Default::default() };
        let full = run_devices(&p, &mut [&mut ExactAllocator::new(1 << 30)], &opts).unwrap();
        assert_eq!(full.end_ns.iter().filter(|&&e| e == u64::MAX).count(), 0);
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = run_devices(&p, &mut [&mut ExactAllocator::new(1 << 30)], &opts).unwrap_err();
        assert_eq!(err, Deadlock { waiting: p.tasks.len() });
    }

    #[test]
    fn a_repeating_schedule_is_jumped_to_the_same_trace() {
        let p = periodic(50, 1024);
        let run = |every_period| {
            let opts = RunOptions { every_period, ..Default::default() };
            run_devices(&p, &mut [&mut ExactAllocator::new(1 << 30)], &opts).unwrap()
        };
        let (fast, full) = (run(false), run(true));
        assert!(fast.periods_jumped >= 40, "jumped {}", fast.periods_jumped);
        assert_eq!(full.periods_jumped, 0);
        assert_eq!(DeviceTrace { periods_jumped: 0, ..fast }, full);
    }

    #[test]
    fn periods_marked_by_block_rather_than_by_slot_are_jumped_too() {
        // A step of one micro-batch repeats block after block, marked as such.
        let mut p = periodic(50, 1024);
        p.layer_marks = std::mem::take(&mut p.period_marks);
        let run = |every_period| {
            let opts = RunOptions { every_period, ..Default::default() };
            run_devices(&p, &mut [&mut ExactAllocator::new(1 << 30)], &opts).unwrap()
        };
        let (fast, full) = (run(false), run(true));
        assert!(fast.periods_jumped >= 40, "jumped {}", fast.periods_jumped);
        assert_eq!(DeviceTrace { periods_jumped: 0, ..fast }, full);
    }

    #[test]
    fn a_run_that_may_pause_jumps_only_the_periods_before_its_gate() {
        // The gate is the 31st period's collective, inside the repeating stretch.
        let p = periodic(50, 1024);
        let gate = 61;
        let until = |every_period| {
            let mut alloc = ExactAllocator::new(1 << 30);
            let opts = RunOptions { every_period, stop_after: Some(gate), ..Default::default() };
            let paused = match run_parts_until(&[&p], &[], &mut [&mut alloc], &opts).unwrap() {
                Progress::Paused(paused) => paused,
                Progress::Done(_) => panic!("the run did not pause at its gate"),
            };
            let jumped = paused.state.per.as_ref().map_or(0, |per| per.jumped);
            let (now, done) = (paused.state.now, paused.state.done);
            let opts = RunOptions { every_period, ..Default::default() };
            let Some(Ok(Progress::Done(t))) = paused.resume(&[&p], &[], &mut [&mut alloc], &opts) else {
                panic!("the run did not carry on to its end")
            };
            (jumped, now, done, t)
        };
        let (fast, full) = (until(false), until(true));
        assert!(fast.0 >= 20, "jumped {} periods before the gate", fast.0);
        assert!(fast.3.periods_jumped >= fast.0, "the jumps before the pause are counted");
        assert_eq!(full.0, 0);
        // Paused at the same instant after the same tasks, then the same run to the end.
        assert_eq!((fast.1, fast.2), (full.1, full.2));
        assert_eq!(full.2, gate as usize + 1);
        assert_eq!(DeviceTrace { periods_jumped: 0, ..fast.3 }, full.3);
    }

    #[test]
    fn running_out_of_memory_inside_the_periods_jumped_stops_where_the_full_run_does() {
        // 3 MiB of activations in flight plus 64 KiB leaked a period: out of memory in the
        // 33rd period, well inside the stretch jumped from the first repeats.
        let p = periodic(50, 64 << 10);
        let run = |every_period| {
            let opts = RunOptions { every_period, ..Default::default() };
            run_devices(&p, &mut [&mut ExactAllocator::new((3 << 20) + (32 << 16) + 1000)], &opts).unwrap()
        };
        let (fast, full) = (run(false), run(true));
        let oom = full.oom.as_ref().expect("the full run runs out");
        assert_eq!(oom.task, 64, "the 33rd period's compute");
        assert!(fast.periods_jumped > 0);
        assert_eq!(DeviceTrace { periods_jumped: 0, ..fast }, full);
    }

    #[test]
    fn streams_overlap_and_dependencies_wait() {
        // compute: a(10) -> c(5, waits for b); comm: b(20).
        let p = program(2, &[(0, 10, &[], &[], &[]), (1, 20, &[], &[], &[]), (0, 5, &[1], &[], &[])], vec![]);
        let t = run(&p, &mut ExactAllocator::new(1 << 20)).unwrap();
        assert_eq!(t.start_ns, vec![0, 0, 20]);
        assert_eq!(t.end_time_ns, 25);
        assert_eq!(t.stream_busy_ns, vec![15, 20]);
    }

    #[test]
    fn transfers_on_a_common_link_share_it() {
        // Two all-gathers of 100 ns on two streams (say FSDP's prefetch and tensor
        // parallelism's) that both use NVLink, a third on the NIC only, and compute.
        let mut p = program(
            4,
            &[(1, 100, &[], &[], &[]), (2, 100, &[], &[], &[]), (3, 100, &[], &[], &[]), (0, 10, &[0, 1], &[], &[])],
            vec![],
        );
        p.stream_links = vec![0, links::NVLINK, links::NVLINK | links::NET_TX, links::NET_RX];
        let t = run(&p, &mut ExactAllocator::new(1 << 20)).unwrap();
        // Sharing NVLink, the two finish together at 200: no more bandwidth than one after
        // the other. The receive shares nothing with them and ends at 100.
        assert_eq!(t.end_ns, vec![200, 200, 100, 210]);
        assert_eq!(t.stream_busy_ns, vec![10, 200, 200, 100]);
        // Without links the same program overlaps for free.
        p.stream_links.clear();
        let t = run(&p, &mut ExactAllocator::new(1 << 20)).unwrap();
        assert_eq!(t.end_ns, vec![100, 100, 100, 110]);
    }

    #[test]
    fn memory_is_allocated_at_start_freed_at_end_and_oom_stops() {
        let p = program(
            1,
            &[(0, 10, &[], &[0], &[]), (0, 10, &[], &[1], &[0, 1]), (0, 10, &[], &[2], &[])],
            vec![buf(1024), buf(1024), buf(4096)],
        );
        let t = run(&p, &mut ExactAllocator::new(3000)).unwrap();
        assert_eq!(t.timeline.peak().unwrap().allocated, 2048);
        let oom = t.oom.expect("4096 > 3000");
        assert_eq!((oom.task, oom.buffer, oom.time_ns), (2, 2, 20));
        assert!(oom.live.is_empty());
    }

    #[test]
    fn a_run_stops_where_a_held_task_could_start() {
        // compute: a (10 ns) -> b (held); comm: c (20 ns, after a) -> d (allocates 4096).
        let p = program(
            2,
            &[(0, 10, &[], &[0], &[]), (0, 10, &[0], &[], &[]), (1, 20, &[0], &[], &[]), (1, 10, &[2], &[1], &[])],
            vec![buf(1024), buf(4096)],
        );
        let held = |h: Vec<u32>| RunOptions { held: h, ..Default::default() };
        // b could start at 10, before d's allocation at 30 fails: the run stops there, with
        // no out-of-memory, as nothing after that instant is the whole program's.
        let t = run_with(&p, &mut ExactAllocator::new(3000), &held(vec![1])).unwrap();
        assert!(t.oom.is_none());
        assert_eq!((t.end_time_ns, t.start_ns[1], t.start_ns[3]), (10, u64::MAX, u64::MAX));
        // A held task never allocates.
        let t = run_with(&p, &mut ExactAllocator::new(3000), &held(vec![3])).unwrap();
        assert!(t.oom.is_none() && t.end_time_ns == 30);
        // With b waiting for d too, d's allocation fails before b could start: the whole
        // program's out-of-memory.
        let behind = program(
            2,
            &[(0, 10, &[], &[0], &[]), (0, 10, &[0, 3], &[], &[]), (1, 20, &[0], &[], &[]), (1, 10, &[2], &[1], &[])],
            vec![buf(1024), buf(4096)],
        );
        let t = run_with(&behind, &mut ExactAllocator::new(3000), &held(vec![1])).unwrap();
        let oom = t.oom.expect("d allocates 4096 > 3000 - 1024 before b can start");
        assert_eq!((oom.task, oom.time_ns), (3, 30));
        // Where every task left waits on a held one, the run ends without a deadlock.
        let t = run_with(&behind, &mut ExactAllocator::new(1 << 20), &held(vec![1])).unwrap();
        assert!(t.oom.is_none() && t.end_ns[1] == u64::MAX && t.end_ns[3] == 40);
    }

    #[test]
    fn cross_stream_frees_and_empty_cache_reach_the_allocator() {
        use crate::memory::{CachingAllocator, CachingConfig};
        const M: u64 = 1 << 20;
        // comm: a (allocates buffer 0, 40 MiB) -> compute: b (uses it, frees it) -> comm: c
        // (allocates buffer 1, 40 MiB: reuses the block) -> compute: d (frees 1; empty_cache).
        let p = program(
            2,
            &[(1, 10, &[], &[0], &[]), (0, 10, &[0], &[], &[0]), (1, 10, &[1], &[1], &[]), (0, 10, &[2], &[], &[1])],
            vec![buf(40 * M), buf(40 * M)],
        );
        let mut a = CachingAllocator::new(CachingConfig::new(1 << 30));
        let t = run_with(&p, &mut a, &RunOptions { empty_cache_after: vec![3], ..Default::default() }).unwrap();
        let s: Vec<_> = t.timeline.samples().collect();
        // After b's free the block is still active (its event on compute is recorded) ...
        assert_eq!((s[1].allocated, s[1].active, s[1].reserved), (0, 40 * M, 40 * M));
        // ... compute then completed its work up to the free, so c's malloc reuses it.
        assert_eq!((s[2].allocated, s[2].reserved), (40 * M, 40 * M));
        // empty_cache after d: the free segment goes back to the device.
        assert_eq!(s.last().unwrap().reserved, 0);
        assert_eq!((t.allocator.num_empty_cache, t.allocator.peak_reserved), (1, 40 * M));
    }

    #[test]
    fn parts_run_as_their_merged_program() {
        // Device 0: a (allocates its buffer) -> send (frees it). Device 1 the same, its first
        // task waiting for device 0's send through a link.
        let stage = |bytes: u64| program(1, &[(0, 10, &[], &[0], &[]), (0, 5, &[0], &[], &[0])], vec![buf(bytes)]);
        let (s0, s1) = (stage(1024), stage(2048));
        let mut merged = program(
            2,
            &[(0, 10, &[], &[0], &[]), (0, 5, &[0], &[], &[0]), (1, 10, &[1], &[1], &[]), (1, 5, &[2], &[], &[1])],
            vec![buf(1024), buf(2048)],
        );
        merged.stream_device = vec![0, 1];
        let run2 = |f: &dyn Fn(&mut [&mut dyn Allocator]) -> DeviceTrace| {
            let (mut a, mut b) = (ExactAllocator::new(1 << 20), ExactAllocator::new(1 << 20));
            f(&mut [&mut a, &mut b])
        };
        let whole = run2(&|al| run_devices(&merged, al, &RunOptions::default()).unwrap());
        let parts =
            run2(&|al| run_parts(&[&s0, &s1], &[Link { task: 2, dep: 1 }], al, &RunOptions::default()).unwrap());
        assert_eq!(parts.start_ns, vec![0, 10, 15, 25]);
        assert_eq!(
            (&parts.start_ns, &parts.end_ns, parts.end_time_ns),
            (&whole.start_ns, &whole.end_ns, whole.end_time_ns)
        );
        assert_eq!(parts.allocators, whole.allocators);
        for (p, w) in parts.timelines.iter().zip(&whole.timelines) {
            assert!(p.samples().eq(w.samples()));
        }
    }

    #[test]
    fn task_lists_from_pairs_keep_each_tasks_order() {
        let l = TaskLists::from_pairs(3, &[(2, 7), (0, 1), (2, 5), (0, 4)]);
        assert_eq!((l.len(), l.of(0), l.of(1), l.of(2)), (3, &[1, 4][..], &[][..], &[7, 5][..]));
        let mut m = TaskLists::default();
        for t in 0..3 {
            m.push(l.of(t));
        }
        assert_eq!(m, l);
    }

    #[test]
    fn a_cycle_is_reported_not_hung() {
        let p = program(1, &[(0, 1, &[0], &[], &[])], vec![]);
        assert_eq!(run(&p, &mut ExactAllocator::new(10)).unwrap_err(), Deadlock { waiting: 1 });
    }
}
