//! Periodic extrapolation of the schedule, exact: a pipeline's steady state (and a run of
//! micro-batches of gradient accumulation) repeats the same work, micro-batch after
//! micro-batch. Where the scheduling state at the start of one period equals the state a
//! few periods earlier, shifted in time and in task numbers, every later period until the
//! repeating stretch of the program ends is scheduled identically; the engine then plays
//! those periods' task starts and ends straight into the allocators and timelines, in the
//! order and at the instants the event loop would have produced them, without the loop's
//! bookkeeping (the event queue, dependency counts, stream polling, link sharing), and
//! picks the loop up after the last of them.
//!
//! Why memory is replayed rather than extrapolated: when a task starts or ends does not
//! depend on memory (an allocation either fits or ends the run), so the schedule can repeat
//! while the caching allocator's layout drifts from one micro-batch to the next, as it does
//! in a 1F1B steady state where a buffer's block moves between segments. Playing each
//! allocation and free through the allocator keeps every reserved byte, peak, OOM instant
//! and memory sample exactly the full simulation's. `tests/periodic.rs` checks every
//! shipped scenario's outputs against the full run ([`super::RunOptions::every_period`]).
//!
//! How the layout drifts, measured on `gpt3-175b`'s first stage (its segments and blocks at
//! every schedule slot, addresses left out): reserved memory is constant in the steady
//! state, and each forward-backward pair leaves the layout rotated by one segment in
//! address order, the live micro-batches walking through a ring of equal-size segments. So
//! the layout repeats only after as many periods as the ring has segments, longer than a
//! step. Best fit orders free blocks by (size, address), so addresses decide only between
//! free blocks of equal size; a window of periods with no such tie would repeat under any
//! permutation of segments, but 48% of that stage's best-fit calls have one. An exact jump
//! of the allocator would have to show that no tie it decides straddles the segment that
//! wraps, and relocate blocks rather than replay them.
//!
//! That jump was built and measured (2026-12-06, not kept): at each period's end, every
//! allocator's live segments were matched with the layout 1 to 20 periods earlier, each
//! live tensor renamed to the one its allocating task's shift allocates, looking for a
//! permutation of segments (with the address ties of the periods between checked under
//! it). On `gpt3-175b` with 64 micro-batches only the last stage's allocator ever matched:
//! the other seven stages' large pools never repeat within 20 periods under any permutation
//! (a stage holds its in-flight micro-batches in shared segments whose holes drift), and
//! among the shipped scenarios periods were moved only in `llama2-7b-h100-fp8`. Replaying
//! memory (about 40% of a fitting GPT-3 configuration's time) stays.
//!
//! What that replay costs sets a floor under a pipeline's simulated step (measured
//! 2026-12-07 on the 2-core development machine, `cargo bench --bench simulate` under
//! `perf`): `gpt3-175b` with 64 micro-batches makes 1.63 million allocator calls per step
//! (3,267,346 memory changes over its two steps, `stepsim run` on it), and the caching
//! allocator's `malloc_counted` / `free_counted` take 30% of the run's CPU time, about 30 ms
//! of the ~100 ms of CPU a step costs (86-93 ms a step of wall time on 2 cores, under glibc's
//! default heap settings, before the devices' replays ran at once): some 18 ns a call, a
//! best-fit search and a sorted insertion each. That alone is above issue 25's goal of 20 ms
//! a step of CPU; the goal would need the allocator's layout to repeat, which it does not
//! (above).
//!
//! Periods of two grains. The scheduler marks where each slot of its micro-batch schedule
//! begins ([`super::Program::period_marks`]) and where each transformer block of a pass
//! begins ([`super::Program::layer_marks`]): a step of one micro-batch (the 100B FSDP
//! sweep's configurations) repeats nothing micro-batch by micro-batch, but its forward and
//! its backward repeat block after block (a block's all-gather, kernels and reduce-scatter),
//! and `100b-32gpu-fsdp` jumps 73 of its forward's 80 blocks (it runs out of memory in the
//! first block of its backward). Where both
//! grains repeat, the wider stretch (the steady state) is taken; a run of several parts (a
//! pipeline's stages) looks for blocks only where none of its parts repeats slot by slot,
//! as its cuts are the whole run's and one stage's blocks repeat while the other stages run
//! passes of their own.
//!
//! A run that pauses after a gate task ([`super::RunOptions::stop_after`], a sweep trying a
//! prefix of the program) jumps the periods before the gate
//! ([`Periodic::short_of`]): the gate lies outside every stretch it may jump, so its end is
//! handled by the event loop, which pauses there as the full run would.
//!
//! Three steps, each conservative:
//! - **The program repeats** ([`stretches`]): among the scheduler's marks, runs of equal spacing
//!   are candidate periods of `dt` tasks, and every task of a run is checked against the one
//!   `dt` later: same stream, duration and thread blocks, dependencies shifted by the period
//!   (or the same, where they lie before the candidate). Every stretch is then stretched to
//!   the schedule slots of the longest period found (an interleaved pipeline's middle stage
//!   repeats every forward-backward pair, its first and last every few micro-batches), and
//!   the dependencies between parts (a pipeline's sends and receives) are checked likewise;
//!   one that does not repeat cuts its stretch short.
//! - **The schedule repeats** ([`Periodic::cut`]): each time the first task of a period
//!   ends, the scheduling state is written down with every task of a stretch numbered
//!   relative to the period and every time relative to now: the events pending and their
//!   order, what each stream runs next and whether it is busy, the tasks part-way through
//!   their dependencies, and the transfers in flight on shared links. Equal to a state up to
//!   [`MAX_CUT_LAG`] periods back, with nothing outside the stretches started or finished
//!   since: the schedule repeats with that lag.
//! - **The jump** (`Periodic::skip`): as many repeats as keep every task the last repeat
//!   touched inside its stretch; none if a task outside the stretches would become ready
//!   meanwhile. Each jumped repeat's starts and ends are replayed, shifted, through memory;
//!   the scheduling state is renumbered to the last repeat's end, where the loop goes on.
//!   With [`super::RunOptions::replay_by_device`] (what a job's run asks for), a jump over
//!   several pipeline stages is replayed device by device, each device's events in the
//!   order the interleaved replay gives them: the same calls on every allocator and
//!   timeline, with one allocator's blocks and free sets in the cache at a time (the GPT-3
//!   sweep's shard 1/20 in 0.87 of the time). Where each device runs one part (a stage),
//!   the devices are replayed at once on rayon's threads, each on its own slices of the
//!   run's tables ([`super::View`]): `stepsim run` and the pipeline bench replay on every
//!   core (79-83 -> 63-65 ms per step of the bench); a sweep, whose cores are busy with
//!   other configurations, is unchanged (0.99). An out-of-memory inside such a replay is
//!   not taken as the answer, since other devices may have gone past that instant: the
//!   caller plays the run again in order (`job::run::run`; `tests/periodic.rs` has runs
//!   that do).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

use rayon::prelude::*;

use super::{Dependents, Link, Memory, Numbering, OomEvent, Program, View};

const NONE: u32 = u32::MAX;
/// Fewest periods a stretch must hold to be worth the bookkeeping.
const MIN_PERIODS: u32 = 3;
/// The spacings of schedule slots tried: a 1F1B stage alternates forwards and backwards,
/// so its period spans two slots; an interleaved stage's, 2 x chunks x its micro-batch
/// group (16 for 2 chunks and groups of 4).
const MAX_LAG: usize = 32;
/// The spacings of blocks tried: models whose blocks alternate kinds repeat every few
/// (dense and MoE blocks in turn: 2; five sliding-window blocks to one global: 6).
const MAX_BLOCK_LAG: usize = 8;
/// The most periods a repeat of the schedule may span.
const MAX_CUT_LAG: usize = 4;

/// A stretch of one part's program, in its own numbering, in which every task is the one
/// `dt` tasks earlier shifted by a period: tasks `start..end`; dependencies from `base` on
/// shift with the period, earlier ones are the same for every period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stretch {
    pub base: u32,
    pub start: u32,
    pub end: u32,
    pub dt: u32,
}

/// The repeating stretches of `p`, verified task by task, in program order; with
/// `by_block`, also those of its passes' transformer blocks ([`Program::layer_marks`]).
pub(super) fn stretches(p: &Program, by_block: bool) -> Vec<Stretch> {
    let mut candidates: Vec<(u32, u32, u32)> = Vec::new();
    spaced(&p.period_marks, MAX_LAG, &mut candidates);
    if by_block {
        spaced(&p.layer_marks, MAX_BLOCK_LAG, &mut candidates);
    }
    // The widest candidates first, each kept where it overlaps none kept before: a
    // micro-batch schedule's steady state before the blocks of one of its passes.
    candidates.sort_by_key(|&(a, b, d)| (Reverse(b - a), d, a));
    let mut kept: Vec<(u32, u32, u32)> = Vec::new();
    for c in candidates {
        if kept.iter().all(|k| c.1 <= k.0 || c.0 >= k.1) {
            kept.push(c);
        }
    }
    let mut out: Vec<Stretch> = kept.into_iter().filter_map(|(a, b, dt)| verify(p, a, b, dt)).collect();
    out.sort_by_key(|s| s.start);
    out
}

/// Runs of equally spaced `marks` (every `lag`-th, up to `max_lag`) at least
/// [`MIN_PERIODS`] spacings long, as candidate stretches (first task, end, period).
fn spaced(marks: &[u32], max_lag: usize, candidates: &mut Vec<(u32, u32, u32)>) {
    for lag in 1..=max_lag.min(marks.len().saturating_sub(1)) {
        let diff = |i: usize| marks[i + lag].saturating_sub(marks[i]);
        let n = marks.len() - lag;
        let mut i = 0;
        while i < n {
            let d = diff(i);
            let mut j = i;
            while j + 1 < n && diff(j + 1) == d {
                j += 1;
            }
            let (a, b) = (marks[i], marks[j + lag]);
            if d > 0 && (b - a) / d >= MIN_PERIODS {
                candidates.push((a, b, d));
            }
            i = j + 1;
        }
    }
}

/// The longest run of tasks t of `a..b` with t ~ t + dt, as a stretch.
fn verify(p: &Program, a: u32, b: u32, dt: u32) -> Option<Stretch> {
    let mut found: Option<Stretch> = None;
    let close = |s: u32, e: u32, found: &mut Option<Stretch>| {
        let l = Stretch { base: a, start: s, end: e + dt, dt };
        if e > s && (l.end - l.start) / dt >= MIN_PERIODS && found.is_none_or(|f| l.end - l.start > f.end - f.start) {
            *found = Some(l);
        }
    };
    let (mut s, mut t) = (a, a);
    while t + dt < b {
        if same(p, t, dt, a) {
            t += 1;
        } else {
            close(s, t, &mut found);
            t += 1;
            s = t;
        }
    }
    close(s, t, &mut found);
    found
}

/// Whether task `t + dt` is scheduled as task `t` one period on: the same stream, duration
/// and thread blocks, its dependencies from task `base` on shifted by the period. What
/// the tasks allocate and free does not matter here: memory is replayed.
fn same(p: &Program, t: u32, dt: u32, base: u32) -> bool {
    let (ti, ui) = (t as usize, (t + dt) as usize);
    let (x, y) = (&p.tasks[ti], &p.tasks[ui]);
    if x.stream != y.stream || x.duration_ns != y.duration_ns || x.ctas != y.ctas {
        return false;
    }
    let (dx, dy) = (p.deps.of(ti), p.deps.of(ui));
    dx.len() == dy.len() && dx.iter().zip(dy).all(|(&d, &e)| e == if d >= base { d + dt } else { d })
}

/// `h` (a highest task so far, NONE for none) raised to `t`.
fn raise(h: &mut u32, t: u32) {
    if *h == NONE || t > *h {
        *h = t;
    }
}

/// The engine's state that [`Periodic`] reads and, at a jump, rewrites.
pub(super) struct State<'s, 'p, 'a, 'b> {
    pub now: &'s mut u64,
    pub heap: &'s mut BinaryHeap<Reverse<u128>>,
    pub started: &'s mut Vec<u32>,
    pub head: &'s mut [usize],
    pub busy: &'s [bool],
    pub remaining: &'s mut [u32],
    pub done: &'s mut usize,
    pub shared: &'s mut super::links::SharedLinks,
    pub mem: &'s mut Memory<'p, 'a, 'b>,
}

/// What the engine wrote down when a period began.
struct Cut {
    /// The anchor's stretch and the period's index in it.
    stretch: u16,
    index: u32,
    now: u64,
    seq: usize,
    done: usize,
    heads: Vec<usize>,
    /// Where the events after the cut begin in `Periodic::events` (absolute).
    events: usize,
    /// Of the period that ended at this cut: a task outside the stretches ran, and the
    /// highest task of each stretch touched.
    foreign: bool,
    hi: Vec<u32>,
    state: Vec<i64>,
}

/// The periodic extrapolation of one run: the parts' stretches and what the engine tells it.
pub(super) struct Periodic {
    /// Every part's stretches, in the run's numbering.
    stretches: Vec<Stretch>,
    /// Per task of the run: 1 + the stretch it lies in, 0 for none.
    within: Vec<u16>,
    /// Per task of the run: 1 + the stretch whose candidate it lies in (from its `base`),
    /// 0 for none.
    zone: Vec<u16>,
    /// The stretches whose periods' first tasks mark the cuts (one part's).
    anchors: Vec<u16>,
    /// Tasks of a stretch whose dependencies a task of a candidate has started to satisfy
    /// (some may have started since).
    frontier: Vec<u32>,
    /// Since the oldest cut kept, in order: each task start (task << 1) and end
    /// (task << 1 | 1) with its time; `events_base` is the absolute position of the first.
    events: Vec<(u64, u32)>,
    events_base: usize,
    /// Per stretch: the highest task touched since the last cut.
    hi: Vec<u32>,
    /// A task outside every stretch started or finished since the last cut.
    foreign: bool,
    /// The last cuts, oldest first.
    cuts: VecDeque<Cut>,
    /// Periods jumped so far.
    pub jumped: u64,
    /// Replay a jump device by device ([`super::RunOptions::replay_by_device`]).
    by_device: bool,
    /// An out-of-memory ended a jump replayed device by device.
    pub oom_out_of_order: bool,
}

impl Periodic {
    /// The stretches of a run's parts, or None where none repeats (or the dependencies
    /// between parts do not repeat with them).
    pub fn new(num: &Numbering, links: &[Link], by_device: bool) -> Option<Periodic> {
        // Each stretch's period in schedule slots (the scheduler's marks): a stage whose
        // chunks look alike repeats every slot pair where its neighbours repeat every few
        // micro-batches (an interleaved schedule's first and last stages), so every stretch is
        // stretched to the slots of the longest period, which the others divide.
        //
        // Blocks repeat within a pass, and the engine's cuts are the whole run's: where
        // several parts run at once (a pipeline's stages), one stage's blocks repeat while
        // the others run their own passes, so a run whose parts repeat slot by slot is cut
        // at slots alone (cutting at every block of a GPT-3 stage's warm-up as well cost the
        // GPT-3 sweep's shard 1/20 1.01-1.02 times the time, for no jump).
        let found_by = |by_block: bool| {
            let mut found = Vec::new();
            for (k, p) in num.parts.iter().enumerate() {
                for s in stretches(p, by_block) {
                    let slots = p.period_marks.iter().filter(|&&m| m >= s.start && m < s.start + s.dt).count().max(1);
                    found.push((k, s, slots));
                }
            }
            found
        };
        let mut found = found_by(num.parts.len() == 1);
        if found.is_empty() && num.parts.len() > 1 {
            found = found_by(true);
        }
        let slots = found.iter().map(|f| f.2).max()?;
        let mut all = Vec::new();
        let mut parts = Vec::new();
        for (k, s, n) in found {
            let dt = s.dt * (slots / n) as u32;
            if slots % n == 0 && (s.end - s.start) / dt >= MIN_PERIODS {
                let o = num.task[k] as u32;
                all.push(Stretch { base: s.base + o, start: s.start + o, end: s.end + o, dt });
                parts.push(k);
            }
        }
        if all.is_empty() || all.len() >= u16::MAX as usize {
            return None;
        }
        let anchor_part = parts[0];
        let anchors = (0..all.len()).filter(|&r| parts[r] == anchor_part).map(|r| r as u16 + 1).collect();
        let mut within = vec![0u16; num.tasks()];
        let mut zone = vec![0u16; num.tasks()];
        for (r, s) in all.iter().enumerate() {
            zone[s.base as usize..s.end as usize].fill(r as u16 + 1);
            within[s.start as usize..s.end as usize].fill(r as u16 + 1);
        }
        let mut per = Periodic {
            hi: vec![NONE; all.len()],
            stretches: all,
            within,
            zone,
            anchors,
            frontier: Vec::new(),
            events: Vec::new(),
            events_base: 0,
            foreign: false,
            cuts: VecDeque::new(),
            jumped: 0,
            by_device,
            oom_out_of_order: false,
        };
        // A dependency between parts inside the stretches repeats with them. Where one does
        // not (near a stretch's ends, a stage's dependency on another stage's warm-up or
        // cool-down), the stretch is cut short of it, from the nearer end.
        let set: HashSet<(u32, u32)> = links.iter().map(|l| (l.task, l.dep)).collect();
        let mut count: HashMap<u32, u32> = HashMap::new();
        for l in links {
            *count.entry(l.task).or_default() += 1;
        }
        loop {
            let mut failing: HashMap<u16, (u32, u32)> = HashMap::new();
            for l in links {
                let next = per.shift(l.task, 1);
                let r = per.within[l.task as usize];
                if r != 0 && per.within.get(next as usize) == Some(&r) {
                    let dep = match per.zone[l.dep as usize] {
                        0 => l.dep,
                        z => l.dep + per.stretches[z as usize - 1].dt,
                    };
                    if !set.contains(&(next, dep)) || count.get(&next) != count.get(&l.task) {
                        let f = failing.entry(r).or_insert((u32::MAX, 0));
                        *f = (f.0.min(l.task), f.1.max(l.task));
                    }
                }
            }
            if failing.is_empty() {
                break;
            }
            let mut failing: Vec<_> = failing.into_iter().collect();
            failing.sort_unstable();
            for (r, (lo, hi)) in failing {
                per.shorten(r, lo, hi);
            }
        }
        per.stretches.iter().any(|s| s.start < s.end).then_some(per)
    }

    /// Without the stretches any of whose tasks, or of the tasks their dependencies shift
    /// from, has started (`start_ns`: u64::MAX for a task that has not): a run carried on
    /// from a pause ([`super::Paused::resume`]) saw those starts before this was made, so it
    /// could not write down the state of their periods. None where no stretch is left.
    pub fn unstarted(mut self, start_ns: &[u64]) -> Option<Periodic> {
        for r in 0..self.stretches.len() {
            let s = self.stretches[r];
            if s.start < s.end && start_ns[s.base as usize..s.end as usize].iter().any(|&t| t != u64::MAX) {
                for t in s.start..s.end {
                    self.within[t as usize] = 0;
                }
                self.stretches[r].start = s.end;
            }
        }
        self.stretches.iter().any(|s| s.start < s.end).then_some(self)
    }

    /// Without the tasks from `gate` on in the stretch that holds it, so that a run that
    /// pauses after `gate` ends ([`super::RunOptions::stop_after`]) handles that end in its
    /// event loop: a jump replays tasks of the stretches only, and a task outside them can
    /// neither be in flight at two cuts whose states are equal (it would end at two
    /// instants) nor become ready inside the repeats jumped ([`Periodic::skip`] checks
    /// both). None where no stretch is left.
    pub fn short_of(mut self, gate: u32) -> Option<Periodic> {
        if let r @ 1.. = self.within.get(gate as usize).copied().unwrap_or(0) {
            let s = self.stretches[r as usize - 1];
            let end = if (gate - s.start) / s.dt >= MIN_PERIODS { gate } else { s.start };
            for t in end..s.end {
                self.within[t as usize] = 0;
            }
            self.stretches[r as usize - 1].end = end;
        }
        self.stretches.iter().any(|s| s.start < s.end).then_some(self)
    }

    /// Stretch `r` without its tasks `lo..=hi` (and those beyond them on the side nearer
    /// its end); dropped when fewer than [`MIN_PERIODS`] periods remain.
    fn shorten(&mut self, r: u16, lo: u32, hi: u32) {
        let s = self.stretches[r as usize - 1];
        let mid = s.start + (s.end - s.start) / 2;
        let (mut start, mut end) = if hi < mid {
            (hi + 1, s.end)
        } else if lo >= mid {
            (s.start, lo + s.dt)
        } else {
            (s.end, s.end)
        };
        if end <= start || (end - start) / s.dt < MIN_PERIODS {
            (start, end) = (s.end, s.end);
        }
        for t in (s.start..start).chain(end..s.end) {
            self.within[t as usize] = 0;
        }
        let st = &mut self.stretches[r as usize - 1];
        (st.start, st.end) = (start, end);
    }

    /// Task `t` `m` periods of its stretch on; itself outside the stretches.
    fn shift(&self, t: u32, m: u64) -> u32 {
        match self.within[t as usize] {
            0 => t,
            r => t + (m * u64::from(self.stretches[r as usize - 1].dt)) as u32,
        }
    }

    /// Task `t` as cut `i` numbers it: (1 + its stretch, number less i periods), or
    /// (0, number) outside the stretches.
    fn enc(&self, t: u32, i: u32) -> [i64; 2] {
        match self.within[t as usize] {
            0 => [0, i64::from(t)],
            r => [i64::from(r), i64::from(t) - i64::from(i) * i64::from(self.stretches[r as usize - 1].dt)],
        }
    }

    fn touch(&mut self, t: u32) {
        match self.within[t as usize] {
            0 => self.foreign = true,
            r => raise(&mut self.hi[r as usize - 1], t),
        }
    }

    #[inline]
    pub fn on_start(&mut self, t: u32, now: u64) {
        self.touch(t);
        self.events.push((now, t << 1));
    }

    /// Task `t` finished at `now` (after any cut).
    #[inline]
    pub fn on_finish(&mut self, t: u32, now: u64) {
        self.touch(t);
        self.events.push((now, t << 1 | 1));
    }

    /// Finished task `t` took one dependency off task `d`.
    #[inline]
    pub fn on_unblock(&mut self, t: u32, d: u32) {
        if self.zone[t as usize] != 0 && self.within[d as usize] != 0 {
            self.frontier.push(d);
        }
    }

    /// Where task `t`, whose end event is being handled, begins a period of an anchor
    /// stretch: (stretch, period index).
    #[inline]
    pub fn anchor_index(&self, t: u32) -> Option<(u16, u32)> {
        let r = self.within[t as usize];
        if r == 0 || !self.anchors.contains(&r) {
            return None;
        }
        let s = &self.stretches[r as usize - 1];
        let off = t - s.start;
        (off % s.dt == 0).then_some((r, off / s.dt))
    }

    /// The first task of period `i` of stretch `r` has just ended (`ti`; its end not yet
    /// handled): writes the schedule down and, where it repeats an earlier cut's, jumps as
    /// many repeats as the stretches allow, moving `ti` and the clock with it. An allocation
    /// that does not fit in the periods jumped ends the run there, as it would have.
    pub fn cut(
        &mut self,
        (r, i): (u16, u32),
        ti: &mut u32,
        st: &mut State,
        queues: &[Vec<u32>],
        task_stream: &[u32],
        dependents: &Dependents,
    ) -> Result<(), OomEvent> {
        let cur = Cut {
            stretch: r,
            index: i,
            now: *st.now,
            seq: st.started.len(),
            done: *st.done,
            heads: st.head.to_vec(),
            events: self.events_base + self.events.len(),
            foreign: self.foreign,
            hi: self.hi.clone(),
            state: self.state(i, st, queues),
        };
        // The nearest earlier cut whose schedule this one repeats, with nothing outside the
        // stretches run since.
        let mut lag = None;
        let mut foreign = cur.foreign;
        for (back, prev) in self.cuts.iter().rev().enumerate() {
            if foreign || prev.stretch != r || prev.index + back as u32 + 1 != i {
                break;
            }
            if prev.state == cur.state {
                lag = Some(back + 1);
                break;
            }
            foreign |= prev.foreign;
        }
        let jumped = match lag {
            Some(l) => self.skip(l, &cur, ti, st, queues, task_stream, dependents)?,
            None => false,
        };
        if jumped {
            self.cuts.clear();
            self.events.clear();
            self.events_base = 0;
        } else {
            self.cuts.push_back(cur);
            if self.cuts.len() > MAX_CUT_LAG {
                self.cuts.pop_front();
            }
            let from = self.cuts[0].events;
            self.events.drain(..from - self.events_base);
            self.events_base = from;
        }
        self.hi.iter_mut().for_each(|h| *h = NONE);
        self.foreign = false;
        Ok(())
    }

    /// The schedule at cut `i`, in period-relative numbers.
    fn state(&mut self, i: u32, st: &State, queues: &[Vec<u32>]) -> Vec<i64> {
        let now = *st.now;
        let seq0 = st.started.len() as u64;
        let mut out = Vec::new();
        let mut keys: Vec<u128> = st.heap.iter().map(|r| r.0).collect();
        keys.sort_unstable();
        out.push(keys.len() as i64);
        for k in keys {
            let (end, seq) = ((k >> 64) as u64, k as u64);
            out.extend([end as i64 - now as i64, seq as i64 - seq0 as i64]);
            out.extend(self.enc(st.started[seq as usize], i));
        }
        for (s, q) in queues.iter().enumerate() {
            out.push(i64::from(st.busy[s]));
            out.extend(q.get(st.head[s]).map_or([-2, -2], |&t| self.enc(t, i)));
        }
        let (start_ns, remaining) = (&st.mem.rec.start_ns, &*st.remaining);
        self.frontier.retain(|&t| start_ns[t as usize] == u64::MAX);
        self.frontier.sort_unstable();
        self.frontier.dedup();
        out.push(self.frontier.len() as i64);
        for &t in &self.frontier {
            out.extend(self.enc(t, i));
            out.push(i64::from(remaining[t as usize]));
        }
        st.shared.period_state(now, seq0, &|t: u32| self.enc(t, i), &mut out);
        out
    }

    /// Jumps from cut `cur`, whose schedule repeats the one `lag` cuts back, as many repeats
    /// as the stretches allow; false, changing nothing, where none can be.
    #[allow(clippy::too_many_arguments)]
    fn skip(
        &mut self,
        lag: usize,
        cur: &Cut,
        ti: &mut u32,
        st: &mut State,
        queues: &[Vec<u32>],
        task_stream: &[u32],
        dependents: &Dependents,
    ) -> Result<bool, OomEvent> {
        let prev = &self.cuts[self.cuts.len() - lag];
        let lag = lag as u64;
        let dt = cur.now - prev.now;
        let dseq = (cur.seq - prev.seq) as u64;
        let window = &self.events[prev.events - self.events_base..];
        // Every task the repeat touched, or the state names, stays inside its stretch.
        let mut hi = self.hi.clone();
        for c in self.cuts.iter().skip(self.cuts.len() - lag as usize + 1) {
            for (h, &x) in hi.iter_mut().zip(&c.hi) {
                if x != NONE {
                    raise(h, x);
                }
            }
        }
        let mut named: Vec<u32> = st.heap.iter().map(|r| st.started[r.0 as u64 as usize]).collect();
        named.extend(queues.iter().zip(st.head.iter()).filter_map(|(q, &h)| q.get(h).copied()));
        named.extend(self.frontier.iter().copied());
        for t in named {
            if let r @ 1.. = self.within[t as usize] {
                raise(&mut hi[r as usize - 1], t);
            }
        }
        let mut repeats = u64::MAX;
        for (s, &h) in self.stretches.iter().zip(&hi) {
            if h != NONE {
                repeats = repeats.min(u64::from((s.end - 1 - h) / s.dt) / lag);
            }
        }
        if repeats == 0 || repeats == u64::MAX {
            return Ok(false);
        }
        let k = repeats;
        let kl = k * lag;
        // No task outside the stretches may become ready in the repeats jumped.
        let mut dec: HashMap<u32, u32> = HashMap::new();
        for m in 1..=k {
            for &(_, e) in window.iter().filter(|e| e.1 & 1 == 1) {
                for &d in dependents.of_task(self.shift(e >> 1, m * lag)) {
                    if self.within[d as usize] == 0 {
                        *dec.entry(d).or_default() += 1;
                    }
                }
            }
        }
        if dec.iter().any(|(&d, &c)| st.remaining[d as usize] <= c) {
            return Ok(false);
        }
        // Each stream moves on by its repeat's tasks, every one of them of a stretch.
        let mut heads = Vec::with_capacity(queues.len());
        for (s, q) in queues.iter().enumerate() {
            let step = (cur.heads[s] - prev.heads[s]) as u64;
            let to = st.head[s] + (k * step) as usize;
            let ok = q[st.head[s]..to.min(q.len())].iter().all(|&t| self.within[t as usize] != 0)
                && match q.get(st.head[s]) {
                    Some(&h) if self.within[h as usize] != 0 => q.get(to) == Some(&self.shift(h, kl)),
                    _ => step == 0,
                };
            if !ok {
                return Ok(false);
            }
            heads.push(to);
        }
        if !st.shared.keeps_order(&|t: u32| self.shift(t, kl)) {
            return Ok(false);
        }
        // The jump: each repeat's starts and ends through memory, shifted, in order. Each
        // event's stream (the same a period on: [`stretches`] checks it) and the tasks one
        // repeat moves it by are looked up once, not per repeat.
        self.jumped += kl;
        let events: Vec<(u64, u32, u32, u32)> = window
            .iter()
            .map(|&(when, e)| {
                let t = e >> 1;
                let step = self.shift(t, lag) - t;
                (when, e, step, task_stream[t as usize])
            })
            .collect();
        let replay = |mem: &mut View, events: &[(u64, u32, u32, u32)]| -> Result<(), OomEvent> {
            for m in 1..=k {
                for &(when, e, step, s) in events {
                    let t = (e >> 1) + m as u32 * step;
                    let at = when + m * dt;
                    if e & 1 == 0 {
                        mem.start(t, s as usize, at)?;
                    } else {
                        mem.end(t, s as usize, at);
                    }
                }
            }
            Ok(())
        };
        match self.by_device.then(|| replay_by_device(&events, st.mem, &replay)).flatten() {
            Some(Err(oom)) => {
                self.oom_out_of_order = true;
                return Err(oom);
            }
            Some(Ok(())) => {}
            None => replay(&mut st.mem.view(), &events)?,
        }
        // The schedule, renumbered to the last repeat's end.
        for (&d, &c) in &dec {
            st.remaining[d as usize] -= c;
        }
        let mut frontier = Vec::with_capacity(self.frontier.len());
        for &t in &self.frontier {
            let u = self.shift(t, kl);
            st.remaining[u as usize] = st.remaining[t as usize];
            frontier.push(u);
        }
        self.frontier = frontier;
        let keys: Vec<u128> = st.heap.drain().map(|r| r.0).collect();
        st.started.resize(st.started.len() + (k * dseq) as usize, NONE);
        for key in keys {
            let (end, seq) = ((key >> 64) as u64, key as u64);
            let u = self.shift(st.started[seq as usize], kl);
            let s2 = seq + k * dseq;
            st.started[s2 as usize] = u;
            st.heap.push(Reverse(u128::from(end + k * dt) << 64 | u128::from(s2)));
        }
        st.shared.advance(k * dt, k * dseq, &|t: u32| self.shift(t, kl));
        st.head.copy_from_slice(&heads);
        *st.done += (k as usize) * (cur.done - prev.done);
        *st.now += k * dt;
        *ti = self.shift(*ti, kl);
        Ok(true)
    }
}

/// Replays `events` ([`Periodic::skip`]'s one repeat, `replay` playing every repeat of a
/// list) device by device ([`super::RunOptions::replay_by_device`]), the devices at once
/// where each runs one part; None, replaying nothing, where the events are on one device or
/// a part of theirs spans devices. An out-of-memory comes back as it is: the caller flags it
/// as out of order.
fn replay_by_device(
    events: &[(u64, u32, u32, u32)],
    mem: &mut Memory,
    replay: &(impl Fn(&mut View, &[(u64, u32, u32, u32)]) -> Result<(), OomEvent> + Sync),
) -> Option<Result<(), OomEvent>> {
    // Each device's events, in order, and the (device, part) pairs they come from.
    let mut mine: Vec<Vec<(u64, u32, u32, u32)>> = vec![Vec::new(); mem.allocs.len().max(1)];
    let mut owners: Vec<(usize, usize)> = Vec::new();
    for e in events {
        let s = e.3 as usize;
        let owner = (mem.dev_of[s], mem.rec.part_of_stream[s] as usize);
        if !owners.contains(&owner) {
            owners.push(owner);
        }
        mine[owner.0].push(*e);
    }
    let devices = mine.iter().filter(|m| !m.is_empty()).count();
    if devices < 2 || !owners.iter().all(|&(d, k)| mem.part_on_device(k, d)) {
        return None;
    }
    let outcome: Vec<Result<(), OomEvent>> = match mem.device_views(&owners) {
        // One part per device: the devices at once, on rayon's threads.
        Some(views) => views
            .into_par_iter()
            .map(|mut v| {
                let d = v.dev0;
                replay(&mut v, &mine[d])
            })
            .collect(),
        None => mine.iter().filter(|m| !m.is_empty()).map(|m| replay(&mut mem.view(), m)).collect(),
    };
    Some(outcome.into_iter().find_map(Result::err).map_or(Ok(()), Err))
}
