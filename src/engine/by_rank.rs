//! `[jitter]`'s ranks one at a time: a run whose parts meet only at barriers is played part
//! by part between barriers, to the same trace as [`super::run_parts`]'s single event loop.
//!
//! Why: with 256 ranks the single loop interleaves 256 programs and allocators event by
//! event, so nearly every event finds its rank's state out of cache (the cost per task grew
//! 1.8x from 64 to 256 ranks, and [`super::run_parts`]' heap holds every rank's events).
//! Between two barriers the ranks do not interact: each has its own device, allocator and
//! links, and nothing but a barrier ties one rank's tasks to another's. So each rank runs
//! alone to the next barrier, many events on warm state, and the barrier's time is then the
//! latest of its dependencies' ends.
//!
//! What makes it the same trace, event for event (the single loop's order is (time, the
//! sequence number given when the end was scheduled)): a barrier takes no time and runs on
//! one stream in program order, so barrier j starts, and ends, at T_j, the later of its last
//! dependency's end and barrier j-1's end. Every event of a rank at a time below T_j comes
//! before the barrier's end, every event after T_j after it. At T_j itself, an end scheduled
//! before T_j has a smaller sequence number than the barrier's, scheduled at T_j, so it comes
//! before too. Only an end scheduled at T_j to happen at T_j (a zero-time "wait for" task
//! started then, or a task whose end a neighbour's start or end on its links rescheduled to
//! that instant) can fall on either side: it comes before the barrier if it was scheduled
//! before the poll that started the barrier. That poll follows either the event that
//! completed the barrier's last dependency (E*), or barrier j-1's end. Within E*'s rank the
//! order is the rank's own; in another rank, scheduling after (or while handling) an event
//! comes before E*'s poll if that event comes before E* in the single loop's heap: an end
//! scheduled at an earlier instant, or one of the few orders known among ends scheduled at
//! the same instant ([`Key`]). Where that does not decide, the runner gives up and the caller
//! runs the single loop; as it does on running out of memory (the single loop stops at the
//! first OOM across all ranks, and the others must not have run past it), on a cancelled run
//! and on a deadlock.
//!
//! The barriers' own effects on memory are none, apart from the single loop telling device
//! 0's allocator that the barrier stream finished its work (which the runner does too, at
//! the same point of device 0's calls).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{
    links, sample_bound, Allocator, Dependents, DeviceTrace, Flat, Link, Memory, Numbering, Program, Recorded,
    RunOptions, TaskLists,
};

/// Whether [`run`] can play `parts` (the last a barrier program, the others independent
/// ranks tied only to it by `links`) on `devices` allocators with `opts`.
pub fn applies(parts: &[&Program], links: &[Link], devices: usize, opts: &RunOptions) -> bool {
    let Some((barrier, ranks)) = parts.split_last() else { return false };
    if ranks.len() < 2 || devices != ranks.len() || opts.history {
        return false;
    }
    let is_barrier = barrier.streams.len() == 1
        && barrier.stream_device == [0]
        && barrier.buffers.is_empty()
        && barrier.stream_links.iter().all(|&l| l == 0)
        && barrier.sms == 0
        && barrier.tasks.iter().all(|t| t.duration_ns == 0 && t.ctas == 0 && t.stream == 0)
        && (0..barrier.tasks.len()).all(|t| barrier.deps.of(t).is_empty());
    if !is_barrier || ranks.iter().any(|p| !p.stream_device.is_empty()) {
        return false;
    }
    let num = Numbering::of(parts);
    let first_barrier = num.task[ranks.len()];
    let in_barrier = |t: u32| t as usize >= first_barrier;
    links.iter().all(|l| in_barrier(l.task) != in_barrier(l.dep))
        && opts.empty_cache_after.iter().all(|&t| !in_barrier(t))
}

/// Plays a run [`applies`] to, as [`super::run_parts`] would. `None`: it could not be played
/// apart (an OOM, a tie it cannot order, a deadlock, a cancel), and `allocs` have been used:
/// the caller runs the single loop on fresh ones.
pub fn run(
    parts: &[&Program],
    links: &[Link],
    allocs: &mut [&mut dyn Allocator],
    opts: &RunOptions,
) -> Option<DeviceTrace> {
    play(parts, links, allocs, opts).ok()
}

fn play(
    parts: &[&Program],
    links: &[Link],
    allocs: &mut [&mut dyn Allocator],
    opts: &RunOptions,
) -> Result<DeviceTrace, Bail> {
    let (barrier, ranks) = parts.split_last().ok_or(Bail::Deadlock)?;
    let m = ranks.len();
    let all = Numbering::of(parts);
    let nb = barrier.tasks.len();
    let first_barrier = all.task[m];
    // Each rank's view: its own numbering, and its ties to the barriers.
    let nums: Vec<Numbering> = (0..m).map(|k| Numbering::of(&parts[k..=k])).collect();
    // Per rank: (barrier, task) for each task waiting for a barrier, (task, barrier) for each
    // task a barrier waits for.
    let mut waits = vec![Vec::new(); m];
    let mut feeds = vec![Vec::new(); m];
    for l in links {
        let (t, d) = (l.task as usize, l.dep as usize);
        if d >= first_barrier {
            let k = all.part_of(t);
            waits[k].push(((d - first_barrier) as u32, (t - all.task[k]) as u32));
        } else {
            let k = all.part_of(d);
            feeds[k].push(((d - all.task[k]) as u32, (t - first_barrier) as u32));
        }
    }
    let fixed: Vec<Fixed> = (0..m).map(|k| Fixed::of(&all, k, &nums[k], opts, nb, &waits[k], &feeds[k])).collect();
    // Whether every rank takes no time on the same tasks (and so runs instant 0 alike).
    let zero = |p: &Program| p.tasks.iter().map(|t| t.duration_ns == 0).collect::<Vec<bool>>();
    let first = zero(ranks[0]);
    let same_start = ranks.iter().all(|p| p.tasks.len() == ranks[0].tasks.len() && zero(p) == first);
    let tables: Vec<Tables> = if ranks.iter().all(|p| Tables::shared(ranks[0], p)) {
        vec![Tables::of(&nums[0])]
    } else {
        nums.iter().map(Tables::of).collect()
    };
    let mut ranks: Vec<Rank> = allocs
        .chunks_mut(1)
        .zip(&nums)
        .zip(&fixed)
        .enumerate()
        .map(|(k, ((a, num), f))| {
            let t = &tables[k.min(tables.len() - 1)];
            Rank::new(k, same_start, num, f, t, a, opts)
        })
        .collect();
    // Barrier j's time, and how each rank orders its own zero-time tasks at that time
    // against it.
    let mut times = Vec::with_capacity(nb);
    let mut prev = 0u64;
    each(&mut ranks, |_, r| {
        r.poll(Trigger::Release { after: 0 })?;
        r.release_poll = r.polls;
        if nb > 0 {
            r.until_deps_of(0)?;
        }
        Ok(())
    })?;
    // One visit of each rank per barrier: up to the barrier's end, then on to every
    // dependency of the next one.
    for j in 0..nb {
        let start = BarrierStart::of(&ranks, j);
        let t = match start {
            BarrierStart::AfterPrevious => prev,
            BarrierStart::After { time, .. } | BarrierStart::Tied { time, .. } => time,
        };
        each(&mut ranks, |k, r| {
            r.through(t, &start)?;
            r.release(j, t, k == 0)?;
            if j + 1 < nb {
                r.until_deps_of(j + 1)?;
            }
            Ok(())
        })?;
        times.push(t);
        prev = t;
    }
    each(&mut ranks, |_, r| r.run_out())?;
    if opts.cancel.as_ref().is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
        return Err(Bail::Cancelled);
    }
    // The single loop's trace: every rank's, in the run's numbering, then the barriers'.
    let mut out = DeviceTrace {
        timelines: Vec::with_capacity(m),
        start_ns: Vec::with_capacity(all.tasks()),
        end_ns: Vec::with_capacity(all.tasks()),
        oom: None,
        end_time_ns: prev,
        stream_busy_ns: Vec::with_capacity(all.streams()),
        allocators: Vec::with_capacity(m),
        histories: Vec::with_capacity(m),
        periods_jumped: 0,
        oom_out_of_order: false,
    };
    for (k, r) in ranks.into_iter().enumerate() {
        let now = r.now;
        let mut d = r.mem.finish(now, None, 0);
        let mut timeline = d.timelines.swap_remove(0);
        timeline.offset_tasks(all.task[k] as i64);
        out.timelines.push(timeline);
        out.start_ns.append(&mut d.start_ns);
        out.end_ns.append(&mut d.end_ns);
        out.stream_busy_ns.append(&mut d.stream_busy_ns);
        out.allocators.append(&mut d.allocators);
        out.histories.append(&mut d.histories);
        out.end_time_ns = out.end_time_ns.max(now);
    }
    out.start_ns.extend_from_slice(&times);
    out.end_ns.extend_from_slice(&times);
    out.stream_busy_ns.push(0);
    Ok(out)
}

/// Keeps where the end of task `t`, just scheduled at `end` (position `pos`, `context`), was
/// scheduled, if that is `now` ([`Rank::instant`]).
fn note(
    instant: &mut Vec<(u32, u64, Trigger)>,
    at: &mut u64,
    now: u64,
    (t, end, pos, context): (u32, u64, u64, Trigger),
) {
    if end != now {
        return;
    }
    if *at != now {
        instant.clear();
        *at = now;
    }
    instant.push((t, pos, context));
}

/// Runs `f` on every rank, in parallel: between two barriers the ranks share nothing.
fn each<F>(ranks: &mut [Rank], f: F) -> Result<(), Bail>
where
    F: Fn(usize, &mut Rank) -> Result<(), Bail> + Sync,
{
    use rayon::prelude::*;
    ranks.par_iter_mut().enumerate().try_for_each(|(k, r)| f(k, r))
}

/// A rank program's event-loop tables ([`super::run_parts`]' `Flat` and `Dependents`, and
/// each task's count of dependencies): the same for ranks whose programs differ only in
/// their tasks' durations (`[jitter]`'s: their lists are one `Arc`), so built once for them.
struct Tables {
    flat: Flat,
    dependents: Dependents,
    remaining: Vec<u32>,
}

impl Tables {
    fn of(num: &Numbering) -> Tables {
        let flat = Flat::of(num, num.streams().max(1));
        let (dependents, remaining) = Dependents::of(num, &[], 0);
        Tables { flat, dependents, remaining }
    }

    /// Whether `p`'s tables are `first`'s: the same dependency lists, streams, links and
    /// thread blocks, durations aside.
    fn shared(first: &Program, p: &Program) -> bool {
        std::sync::Arc::ptr_eq(&first.deps, &p.deps)
            && first.streams.len() == p.streams.len()
            && first.stream_links == p.stream_links
            && first.tasks.len() == p.tasks.len()
            && first.tasks.iter().zip(&p.tasks).all(|(a, b)| a.stream == b.stream && a.ctas == b.ctas)
    }
}

/// A rank's tables that do not change as it runs.
struct Fixed {
    dev_of: Vec<usize>,
    local: Vec<usize>,
    empty_cache: Vec<bool>,
    /// Per barrier: the rank's tasks that wait for it.
    waits: TaskLists,
    /// Per task: the barriers it is a dependency of.
    feeds: TaskLists,
    /// Per barrier: how many of the rank's tasks it waits for.
    deps_of: Vec<u32>,
    /// The rank's streams (the barrier stream's index on device 0 is this).
    streams: usize,
    sms: u32,
}

impl Fixed {
    /// Rank `k`'s tables; `waits` and `feeds` are its (barrier, task) and (task, barrier)
    /// pairs of `barriers` barriers.
    fn of(
        all: &Numbering,
        k: usize,
        num: &Numbering,
        opts: &RunOptions,
        barriers: usize,
        waits: &[(u32, u32)],
        feeds: &[(u32, u32)],
    ) -> Fixed {
        let p = num.parts[0];
        let n = p.tasks.len();
        let mut deps_of = vec![0; barriers];
        for &(_, b) in feeds {
            deps_of[b as usize] += 1;
        }
        let mut empty_cache = vec![false; n];
        let to = all.task[k];
        for &t in &opts.empty_cache_after {
            if let Some(f) = (t as usize).checked_sub(to).and_then(|i| empty_cache.get_mut(i)) {
                *f = true;
            }
        }
        Fixed {
            dev_of: vec![0; p.streams.len().max(1)],
            local: (0..p.streams.len().max(1)).collect(),
            empty_cache,
            waits: TaskLists::from_pairs(barriers, waits),
            feeds: TaskLists::from_pairs(n, feeds),
            deps_of,
            streams: p.streams.len(),
            sms: p.sms,
        }
    }
}

/// The poll that started a task: after an event (the [`Key`] of the task that ended), or
/// after the end of the `after`th barrier (0: the run's first poll).
#[derive(Clone, Copy, PartialEq)]
enum Trigger {
    Event(Key),
    Release { after: usize },
}

/// What a task's [`Key`] needs of the poll that started it, kept for every task (the
/// trigger itself only for zero-time tasks: a quarter of the memory): the release poll
/// (`u32::MAX`: an event's), and at instant 0 the generation from the first poll
/// (`u32::MAX`: none).
#[derive(Clone, Copy)]
struct Origin {
    release: u32,
    generation: u32,
}

impl Origin {
    const NONE: Origin = Origin { release: u32::MAX, generation: u32::MAX };

    /// The origin of a task started by `trigger`'s poll; `at_zero`: at instant 0, every rank
    /// alike.
    fn of(trigger: Trigger, at_zero: bool) -> Origin {
        let (release, generation) = match trigger {
            Trigger::Release { after } => (after as u32, if after == 0 { 0 } else { u32::MAX }),
            Trigger::Event(k) => (u32::MAX, k.generation.map_or(u32::MAX, |g| g + 1)),
        };
        Origin { release, generation: if at_zero { generation } else { u32::MAX } }
    }
}

/// Where a task's end falls among the ends at the same instant on other ranks, as far as a
/// rank knows it. The single loop orders those by when each end was scheduled (its heap
/// sequence number): a task's end is scheduled when it starts, and again whenever a task
/// sharing its links or SMs starts or ends (`engine::links`). So ends scheduled at different
/// instants are in the order of those instants; among ends scheduled at one instant, only
/// these are ordered here, and only where each end was scheduled by its own task's start:
/// two tasks started in the same barrier's release poll start in rank order; at instant 0,
/// where every rank runs the same tasks (their zero-time tasks are the same ones), the tasks
/// started in the first poll and, generation by generation, those their ends start, are in
/// (generation, rank) order (each generation's tasks start as the previous generation's
/// ends are handled, a rank's before the next rank's).
#[derive(Clone, Copy, PartialEq, Debug)]
struct Key {
    /// The instant the end was last scheduled.
    scheduled: u64,
    /// Whether its own task's start scheduled it (else a neighbour's start or end did).
    own: bool,
    /// The release poll that started the task, if one did.
    release: Option<usize>,
    rank: usize,
    /// At instant 0: the task's generation from the first poll, where known.
    generation: Option<u32>,
}

impl Key {
    /// Whether an end with this key comes before one with `other`'s in the single loop
    /// (None: not known here).
    fn before(&self, other: &Key) -> Option<bool> {
        if self.scheduled != other.scheduled {
            return Some(self.scheduled < other.scheduled);
        }
        if !self.own || !other.own {
            return None;
        }
        if let (Some(a), Some(b)) = (self.generation, other.generation) {
            if (a, self.rank) != (b, other.rank) {
                return Some((a, self.rank) < (b, other.rank));
            }
        }
        match (self.release, other.release) {
            (Some(a), Some(b)) if (a, self.rank) != (b, other.rank) => Some((a, self.rank) < (b, other.rank)),
            _ => None,
        }
    }
}

/// Where barrier j started in the single loop's order.
enum BarrierStart {
    /// In the poll after barrier j-1's end: every dependency was done before it.
    AfterPrevious,
    /// In the poll after E*, the event of rank `key.rank` that completed the last
    /// dependency: at `time`, its poll the rank's `poll`th.
    After { time: u64, key: Key, poll: u64 },
    /// After one of several ranks' events at `time` that this runner cannot order.
    Tied { time: u64 },
}

impl BarrierStart {
    fn of(ranks: &[Rank], j: usize) -> BarrierStart {
        // Ranks whose last dependency of j ended after barrier j-1 ended.
        let late = ranks.iter().filter_map(|r| r.last_dep[j].filter(|d| d.releases > j));
        // The latest of them; `tied` while an equal or unordered one is not behind it.
        let mut best: Option<LastDep> = None;
        let mut tied = false;
        for d in late {
            match best {
                Some(b) if d.time < b.time => {}
                Some(b) if d.time == b.time => match d.key.before(&b.key) {
                    Some(true) => {}
                    Some(false) => {
                        best = Some(d);
                        tied = false;
                    }
                    None => tied = true,
                },
                _ => {
                    best = Some(d);
                    tied = false;
                }
            }
        }
        match best {
            None => BarrierStart::AfterPrevious,
            Some(d) if tied => BarrierStart::Tied { time: d.time },
            Some(d) => BarrierStart::After { time: d.time, key: d.key, poll: d.poll },
        }
    }
}

/// When a rank's last dependency of a barrier ended.
#[derive(Clone, Copy)]
struct LastDep {
    time: u64,
    key: Key,
    /// The rank's poll after it.
    poll: u64,
    /// Barriers released on the rank by then, plus one.
    releases: usize,
}

/// Why a run cannot be played apart.
#[derive(Debug)]
enum Bail {
    /// An allocation did not fit: the single loop stops at the first across all ranks.
    OutOfMemory,
    /// A zero-time task at a barrier's instant that this runner cannot order against it.
    Tie,
    /// Tasks left that can never start (or a rank's events ran out before a barrier's
    /// dependencies ended): the single loop reports it.
    Deadlock,
    Cancelled,
}

/// One rank's event loop: [`super::run_parts`]' loop over the rank's own part.
struct Rank<'p, 'a, 'b> {
    fixed: &'p Fixed,
    mem: Memory<'p, 'a, 'b>,
    /// The rank's program's streams, queues and dependents: one copy for all ranks whose
    /// programs differ only in durations ([`Tables`]).
    flat: &'p Flat,
    dependents: &'p Dependents,
    /// Each task's duration: the rank's own (`flat`'s are the first rank's).
    duration: Vec<u64>,
    remaining: Vec<u32>,
    head: Vec<usize>,
    busy: Vec<bool>,
    heap: BinaryHeap<Reverse<u128>>,
    started: Vec<u32>,
    candidates: Vec<usize>,
    shared: links::SharedLinks,
    moved: Vec<(u32, u64)>,
    now: u64,
    done: usize,
    polls: u64,
    /// Per task: the release poll that started it and its generation at instant 0
    /// ([`Origin`]).
    origin: Vec<Origin>,
    /// The ends scheduled at `instant_at` to happen at that very instant (a zero-time task's,
    /// or one a neighbour's start or end rescheduled to now), each with where the scheduling
    /// happened: (task, position, context). The position counts 2 per poll: 2p in poll p,
    /// 2p + 1 while handling the event after poll p; the context is the poll's trigger, or
    /// the event being handled. It orders such an end against a barrier at this instant.
    instant: Vec<(u32, u64, Trigger)>,
    instant_at: u64,
    /// Per task: when its end was last scheduled, and whether by its own start ([`Key`]).
    pushed: Vec<(u64, bool)>,
    /// Per barrier: its dependencies here not yet ended, and when the last one did.
    pending: Vec<u32>,
    last_dep: Vec<Option<LastDep>>,
    releases: usize,
    /// The poll after the last barrier's end (or the run's first).
    release_poll: u64,
    /// The rank's index in the run.
    rank: usize,
    /// Every rank takes no time on the same tasks, so all do the same at instant 0.
    same_start: bool,
    cancel_countdown: usize,
    cancel: Option<&'p std::sync::atomic::AtomicBool>,
}

impl<'p, 'a, 'b> Rank<'p, 'a, 'b> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank: usize,
        same_start: bool,
        num: &'p Numbering<'p>,
        fixed: &'p Fixed,
        tables: &'p Tables,
        allocs: &'a mut [&'b mut dyn Allocator],
        opts: &'p RunOptions,
    ) -> Rank<'p, 'a, 'b> {
        let n = num.tasks();
        let ns = num.streams().max(1);
        let (flat, dependents) = (&tables.flat, &tables.dependents);
        let mut remaining = tables.remaining.clone();
        let duration = num.parts[0].tasks.iter().map(|t| t.duration_ns).collect();
        for b in 0..fixed.waits.len() {
            for &t in fixed.waits.of(b) {
                remaining[t as usize] += 1;
            }
        }
        let mut timeline = opts.timeline();
        if let Some(&s) = sample_bound(num, flat, &fixed.dev_of, 1, &[]).first() {
            let own = fixed.empty_cache.iter().filter(|&&e| e).count();
            timeline.reserve(s + own);
        }
        let mem = Memory {
            num,
            dev_of: &fixed.dev_of,
            local: &fixed.local,
            empty_cache: &fixed.empty_cache,
            allocs,
            rec: Recorded::new(num, vec![timeline]),
        };
        let pending = fixed.deps_of.clone();
        let last_dep = vec![None; pending.len()];
        Rank {
            fixed,
            mem,
            flat,
            dependents,
            duration,
            remaining,
            head: vec![0; ns],
            busy: vec![false; ns],
            heap: BinaryHeap::new(),
            started: Vec::with_capacity(n),
            candidates: (0..ns).collect(),
            shared: links::SharedLinks::new(&[fixed.sms]),
            moved: Vec::new(),
            now: 0,
            done: 0,
            polls: 0,
            origin: vec![Origin::NONE; n],
            instant: Vec::new(),
            instant_at: 0,
            pushed: vec![(0, true); n],
            pending,
            last_dep,
            releases: 1,
            release_poll: 0,
            rank,
            same_start,
            cancel_countdown: super::CANCEL_POLL_EVENTS,
            cancel: opts.cancel.as_deref(),
        }
    }

    /// Starts what can start now, stream by stream ([`super::run_parts`]' poll).
    fn poll(&mut self, trigger: Trigger) -> Result<(), Bail> {
        self.polls += 1;
        self.candidates.sort_unstable();
        self.candidates.dedup();
        let program = self.mem.num.parts[0];
        let queues = &self.flat.queues;
        for &s in &self.candidates {
            if self.busy[s] || self.head[s] >= queues[s].len() {
                continue;
            }
            let ti = queues[s][self.head[s]];
            if self.remaining[ti as usize] > 0 {
                continue;
            }
            self.mem.start(ti, s, self.now).map_err(|_| Bail::OutOfMemory)?;
            self.origin[ti as usize] = Origin::of(trigger, self.now == 0 && self.same_start);
            self.busy[s] = true;
            self.head[s] += 1;
            let duration = self.duration[ti as usize];
            let link = program.stream_links.get(s).copied().unwrap_or(0);
            let pos = 2 * self.polls;
            if link == 0 {
                self.heap.push(Reverse(u128::from(self.now + duration) << 64 | self.started.len() as u128));
                self.started.push(ti);
                self.pushed[ti as usize] = (self.now, true);
                note(&mut self.instant, &mut self.instant_at, self.now, (ti, self.now + duration, pos, trigger));
            } else {
                let ctas = u32::from(self.flat.ctas[ti as usize]);
                self.shared.start(self.now, 0, link, ctas, ti, duration, &mut self.moved);
                for i in 0..self.moved.len() {
                    let (t, end) = self.moved[i];
                    self.shared.set_seq(0, t, self.started.len() as u64);
                    self.heap.push(Reverse(u128::from(end) << 64 | self.started.len() as u128));
                    self.started.push(t);
                    self.pushed[t as usize] = (self.now, t == ti);
                    note(&mut self.instant, &mut self.instant_at, self.now, (t, end, pos, trigger));
                }
            }
        }
        self.candidates.clear();
        Ok(())
    }

    /// Where the end of `t`, scheduled now to happen now, was scheduled.
    fn scheduled_now(&self, t: u32) -> Option<(u64, Trigger)> {
        if self.instant_at != self.now {
            return None;
        }
        self.instant.iter().rev().find(|e| e.0 == t).map(|e| (e.1, e.2))
    }

    /// The next event's time, dropping superseded ones; None when none is left.
    fn next_time(&mut self) -> Option<u64> {
        let program = self.mem.num.parts[0];
        while let Some(&Reverse(key)) = self.heap.peek() {
            let ti = self.started[key as u64 as usize];
            let s = self.flat.stream[ti as usize] as usize;
            if program.stream_links.get(s).copied().unwrap_or(0) != 0 && !self.shared.is_current(0, ti, key as u64) {
                self.heap.pop();
                continue;
            }
            return Some((key >> 64) as u64);
        }
        None
    }

    /// Handles the next event (a task's end) and the poll after it.
    fn event(&mut self) -> Result<(), Bail> {
        if let Some(c) = self.cancel {
            self.cancel_countdown -= 1;
            if self.cancel_countdown == 0 {
                self.cancel_countdown = super::CANCEL_POLL_EVENTS;
                if c.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(Bail::Cancelled);
                }
            }
        }
        let Some(Reverse(key)) = self.heap.pop() else { return Err(Bail::Deadlock) };
        let ti = self.started[key as u64 as usize];
        let stream = self.flat.stream[ti as usize] as usize;
        self.now = (key >> 64) as u64;
        // This end's place among the ends at this instant on other ranks.
        let (scheduled, own) = self.pushed[ti as usize];
        let o = self.origin[ti as usize];
        let some = |x: u32| (x != u32::MAX && own).then_some(x);
        let key = Key {
            scheduled,
            own,
            release: some(o.release).map(|r| r as usize),
            rank: self.rank,
            generation: some(o.generation),
        };
        let program = self.mem.num.parts[0];
        if program.stream_links.get(stream).copied().unwrap_or(0) != 0 {
            self.shared.finish(self.now, 0, ti, &mut self.moved);
            let pos = 2 * self.polls + 1;
            for i in 0..self.moved.len() {
                let (t, end) = self.moved[i];
                self.shared.set_seq(0, t, self.started.len() as u64);
                self.heap.push(Reverse(u128::from(end) << 64 | self.started.len() as u128));
                self.started.push(t);
                self.pushed[t as usize] = (self.now, false);
                note(&mut self.instant, &mut self.instant_at, self.now, (t, end, pos, Trigger::Event(key)));
            }
        }
        self.mem.end(ti, stream, self.now);
        self.busy[stream] = false;
        self.done += 1;
        self.candidates.push(stream);
        for &d in self.dependents.of_task(ti) {
            self.remaining[d as usize] -= 1;
            if self.remaining[d as usize] == 0 {
                self.candidates.push(self.flat.stream[d as usize] as usize);
            }
        }
        for &b in self.fixed.feeds.of(ti as usize) {
            let b = b as usize;
            self.pending[b] -= 1;
            if self.pending[b] == 0 {
                let releases = self.releases;
                self.last_dep[b] = Some(LastDep { time: self.now, key, poll: self.polls + 1, releases });
            }
        }
        self.poll(Trigger::Event(key))
    }

    /// Runs until every dependency of barrier `j` here has ended. Every event it handles
    /// comes before the barrier's end in the single loop, whatever that barrier's time: it
    /// comes before this rank's last dependency's end, which is E* or comes before E*.
    fn until_deps_of(&mut self, j: usize) -> Result<(), Bail> {
        while self.pending[j] > 0 {
            self.next_time().ok_or(Bail::Deadlock)?;
            self.event()?;
        }
        Ok(())
    }

    /// Runs every event that comes before barrier j's end at `t`, `start` saying where the
    /// barrier started; this is rank `k`.
    fn through(&mut self, t: u64, start: &BarrierStart) -> Result<(), Bail> {
        while let Some(time) = self.next_time() {
            if time > t {
                break;
            }
            if time == t {
                let Reverse(key) = *self.heap.peek().ok_or(Bail::Deadlock)?;
                let ti = self.started[key as u64 as usize];
                if self.pushed[ti as usize].0 == t && !self.before(ti, start)? {
                    break;
                }
            }
            self.event()?;
        }
        Ok(())
    }

    /// Whether the end of task `ti`, scheduled at the barrier's instant to happen then,
    /// comes before the barrier's end in the single loop.
    fn before(&self, ti: u32, start: &BarrierStart) -> Result<bool, Bail> {
        let (pos, trigger) = self.scheduled_now(ti).ok_or(Bail::Tie)?;
        match *start {
            // Scheduled in the poll after barrier j-1's end or before it: before barrier j,
            // which that poll started last.
            BarrierStart::AfterPrevious => Ok(pos <= 2 * self.release_poll),
            BarrierStart::After { key, poll: p, .. } if key.rank == self.rank => Ok(pos <= 2 * p),
            // Another rank's E*: a poll after a barrier's end came before it (E* ended
            // after barrier j-1 did); a poll after an event came before E*'s if the event
            // did.
            BarrierStart::After { key, .. } => match trigger {
                Trigger::Release { .. } => Ok(true),
                Trigger::Event(e) => e.before(&key).ok_or(Bail::Tie),
            },
            BarrierStart::Tied { .. } => match trigger {
                Trigger::Release { .. } => Ok(true),
                Trigger::Event(_) => Err(Bail::Tie),
            },
        }
    }

    /// Barrier `j` ends at `t`: the tasks waiting for it here may start.
    fn release(&mut self, j: usize, t: u64, device0: bool) -> Result<(), Bail> {
        self.now = t;
        if device0 {
            self.mem.allocs[0].stream_synced(self.fixed.streams, t);
        }
        for &w in self.fixed.waits.of(j) {
            self.remaining[w as usize] -= 1;
            if self.remaining[w as usize] == 0 {
                self.candidates.push(self.flat.stream[w as usize] as usize);
            }
        }
        self.releases += 1;
        self.poll(Trigger::Release { after: self.releases - 1 })?;
        self.release_poll = self.polls;
        Ok(())
    }

    /// Runs what is left.
    fn run_out(&mut self) -> Result<(), Bail> {
        while self.next_time().is_some() {
            self.event()?;
        }
        if self.done < self.remaining.len() {
            return Err(Bail::Deadlock);
        }
        Ok(())
    }
}
