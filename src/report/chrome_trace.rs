//! `trace.json` in the Chrome trace event format (opens in Perfetto or chrome://tracing):
//! one process per distinct rank class, one thread (track) per stream, a complete event
//! ("ph":"X") per task and counter events ("ph":"C") for allocated and reserved bytes and
//! for every memory category the run holds, so the step's overlap of compute and
//! communication can be read next to its memory.
//!
//! A trace that holds every task and every memory change of a large job (GPT-3 175B over 96
//! micro-batches: 0.7 million tasks, 3.4 million counter events, 860 MB) does not open in a
//! browser. Past [`EVENT_BUDGET`] events the job's trace is a [`Detail::Summary`]: every task
//! of the first [`DETAILED_MICRO_BATCHES`] and the last micro-batch of each step, of
//! initialisation and of the optimizer, and for the micro-batches between them one slice per
//! stream and run of consecutive tasks of one (step, phase, micro-batch), named for it and
//! counting its ops and busy time; the memory counters at most [`COUNTER_BUCKETS`] points per
//! rank class, each keeping the highest allocated sample of its stretch of time and the last
//! one (so peaks stay visible). `stepsim run --trace full` writes everything.

use std::fmt::Write;

use crate::engine::Trace;
use crate::memory::Category;
use crate::schedule::{Phase, Schedule};

fn esc(s: &str) -> std::borrow::Cow<'_, str> {
    // Most names need no escaping: borrowed as they are.
    if !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    std::borrow::Cow::Owned(o)
}

/// Bytes as GB with four decimals: what `{:.4}` prints of `bytes as f64 / 1e9`, from integer
/// arithmetic (fixed-precision float formatting falls to its slow exact path on many values).
/// The two agree except where the fifth decimal onwards is exactly a half (`bytes % 100_000 ==
/// 50_000`, where the double's rounding decides) or past 2^53 bytes: those take the float path.
struct Gb4(u64);

impl std::fmt::Display for Gb4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (q, r) = (self.0 / 100_000, self.0 % 100_000);
        if r == 50_000 || self.0 >= 1 << 53 {
            return write!(f, "{:.4}", self.0 as f64 / 1e9);
        }
        let q = if r > 50_000 { q + 1 } else { q };
        write!(f, "{}.{:04}", q / 10_000, q % 10_000)
    }
}

/// A FLOP count as `{:.0}` prints it: a whole number below 2^53 (every count the cost model
/// forms from sizes) as the integer it is, anything else through the float path.
struct Whole(f64);

impl std::fmt::Display for Whole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let x = self.0;
        if x.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&x) {
            write!(f, "{}", x as u64)
        } else {
            write!(f, "{x:.0}")
        }
    }
}

/// Microseconds with nanosecond precision, as the format expects.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// How much of the run trace.json holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Every task and every memory change.
    Full,
    /// Repeated micro-batches as one slice per stream and phase, memory counters bucketed.
    Summary,
    /// Every micro-batch as slices (only initialisation and the optimizer task by task),
    /// memory counters at [`SLICED_COUNTER_BUCKETS`] points: a summary's rank classes past the first
    /// [`DETAILED_CLASSES`] (a `[jitter]` job simulates one per rank).
    Slices,
}

/// Rank classes a summary shows task by task (the headline always among them); the rest are
/// [`Detail::Slices`].
pub const DETAILED_CLASSES: usize = 16;
/// Memory counter points of a [`Detail::Slices`] class (its peaks kept all the same).
pub const SLICED_COUNTER_BUCKETS: u64 = 200;

/// Whether a summary shows class `k` of `classes` only in outline (trace.json's slices, its
/// memory at [`SLICED_COUNTER_BUCKETS`] points, in trace.json and memory.csv alike): past the
/// first [`DETAILED_CLASSES`], the headline excepted.
pub fn outlined_class(k: usize, classes: usize, headline: usize) -> bool {
    classes > DETAILED_CLASSES && k >= DETAILED_CLASSES && k != headline
}

impl Detail {
    /// The detail of class `k` of `classes` in a job whose trace is at `self`.
    pub fn of_class(self, k: usize, classes: usize, headline: usize) -> Detail {
        if self == Detail::Summary && outlined_class(k, classes, headline) {
            Detail::Slices
        } else {
            self
        }
    }

    /// Which of a schedule's tasks this detail shows one by one.
    fn shown(self, sched: &Schedule) -> Vec<bool> {
        match self {
            Detail::Full => vec![true; sched.program.tasks.len()],
            Detail::Summary => detailed_tasks(sched),
            Detail::Slices => sched
                .program
                .tasks
                .iter()
                .map(|t| matches!(sched.labels[t.label as usize].phase, Phase::Init | Phase::Optimizer))
                .collect(),
        }
    }
}

/// Events past which a job's trace is summarised (about 50 MB of JSON): what Perfetto and
/// chrome://tracing open in seconds.
pub const EVENT_BUDGET: usize = 250_000;
/// Micro-batches of each step kept task by task in a summary (besides the step's last).
pub const DETAILED_MICRO_BATCHES: u32 = 2;
/// Memory counter points per rank class in a summary.
pub const COUNTER_BUCKETS: u64 = 2_000;

/// Events the full trace of one class holds: its tasks that ran and two counter events per
/// change of (allocated, reserved).
pub fn full_events(trace: &Trace) -> usize {
    let tasks = trace.start_ns.iter().zip(&trace.end_ns).filter(|(s, e)| **s != u64::MAX && **e != u64::MAX).count();
    let mut last = (u64::MAX, u64::MAX);
    let mut counters = 0;
    for s in trace.timeline.samples() {
        if (s.allocated, s.reserved) != last {
            last = (s.allocated, s.reserved);
            counters += 2;
        }
    }
    tasks + counters
}

/// The detail of a job's trace: [`Detail::Full`] if every class's events together fit in
/// [`EVENT_BUDGET`] (or `full` is asked for), else [`Detail::Summary`].
pub fn detail_for(traces: &[&Trace], full: bool) -> Detail {
    Detail::of(traces.iter().map(|t| full_events(t)).sum(), full)
}

impl Detail {
    /// A trace of `events` events in full: [`Detail::Full`] within [`EVENT_BUDGET`] or when
    /// `full` is asked for.
    pub fn of(events: usize, full: bool) -> Detail {
        if full || events <= EVENT_BUDGET {
            Detail::Full
        } else {
            Detail::Summary
        }
    }
}

/// Renders the trace of one rank class (`pid`), named `rank_label`, with every event.
pub fn render(sched: &Schedule, trace: &Trace, pid: u32, rank_label: &str) -> String {
    render_detail(sched, trace, pid, rank_label, Detail::Full)
}

/// Renders the trace of one rank class (`pid`), named `rank_label`, at `detail`.
pub fn render_detail(sched: &Schedule, trace: &Trace, pid: u32, rank_label: &str, detail: Detail) -> String {
    let prog = &sched.program;
    let mut o = String::with_capacity(prog.tasks.len() * 160 + 1024);
    if detail == Detail::Full {
        o.push_str("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    } else {
        let _ = writeln!(
            o,
            "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"stepsim\":\"summary: every task of initialisation, the optimizer and micro-batches 0-{} and the last of each step; between them one slice per stream and run of one (step, phase, micro-batch); memory counters at up to {COUNTER_BUCKETS} points per rank class (each stretch's highest and last sample). stepsim run --trace full writes every event.\"}},\"traceEvents\":[",
            DETAILED_MICRO_BATCHES - 1
        );
    }
    let _ = write!(
        o,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":\"{}\"}}}}",
        esc(rank_label)
    );
    for (i, s) in prog.streams.iter().enumerate() {
        let _ = write!(
            o,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{i},\"args\":{{\"name\":\"{}\"}}}}",
            esc(s)
        );
    }
    let detailed = detail.shown(sched);
    for (i, t) in prog.tasks.iter().enumerate() {
        let (start, end) = (trace.start_ns[i], trace.end_ns[i]);
        if start == u64::MAX || end == u64::MAX || !detailed[i] {
            continue;
        }
        let l = &sched.labels[t.label as usize];
        let layer = l.layer().map_or(String::from("null"), |x| x.to_string());
        let _ = write!(
            o,
            ",\n{{\"name\":\"{}\",\"cat\":\"{:?}\",\"ph\":\"X\",\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{},\"args\":{{\"step\":{},\"phase\":\"{}\",\"micro_batch\":{},\"layer\":{layer}{}}}}}",
            esc(&l.what),
            l.kind,
            t.stream,
            us(start),
            us(end - start),
            l.step,
            l.phase.name(),
            l.micro_batch,
            work_args(l, end - start)
        );
    }
    if detail != Detail::Full {
        aggregated_slices(&mut o, sched, trace, pid, &detailed);
    }
    // Memory counters at each change: allocated and reserved on one track, every category
    // the run ever holds (by the plot's names) on another.
    let held = trace.timeline.categories_held();
    let present: Vec<Category> = Category::ALL.iter().copied().filter(|c| held[c.index()]).collect();
    let kept = match detail {
        Detail::Full => vec![true; trace.timeline.sample_count()],
        Detail::Summary => trace.timeline.summary_samples(COUNTER_BUCKETS),
        Detail::Slices => trace.timeline.summary_samples(SLICED_COUNTER_BUCKETS),
    };
    let mut last = (u64::MAX, u64::MAX);
    for (s, _) in trace.timeline.samples().zip(&kept).filter(|(_, k)| **k) {
        if (s.allocated, s.reserved) == last {
            continue;
        }
        last = (s.allocated, s.reserved);
        let _ = write!(
            o,
            ",\n{{\"name\":\"memory (GB)\",\"ph\":\"C\",\"pid\":{pid},\"ts\":{},\"args\":{{\"allocated\":{},\"reserved\":{}}}}}",
            us(s.time_ns),
            Gb4(s.allocated),
            Gb4(s.reserved),
        );
        let _ = write!(
            o,
            ",\n{{\"name\":\"memory by category (GB)\",\"ph\":\"C\",\"pid\":{pid},\"ts\":{},\"args\":{{",
            us(s.time_ns)
        );
        for (k, c) in present.iter().enumerate() {
            let sep = if k == 0 { "" } else { "," };
            let _ = write!(o, "{sep}\"{}\":{}", esc(c.label()), Gb4(s.by_category[c.index()]));
        }
        o.push_str("}}");
    }
    o.push_str("\n]}\n");
    o
}

/// Which tasks a summary shows one by one: those of initialisation and the optimizer, and of
/// the first [`DETAILED_MICRO_BATCHES`] and the last micro-batch of each step.
fn detailed_tasks(sched: &Schedule) -> Vec<bool> {
    let labels = &sched.labels;
    let mut last_mb: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for t in &sched.program.tasks {
        let l = &labels[t.label as usize];
        let e = last_mb.entry(l.step).or_insert(0);
        *e = (*e).max(l.micro_batch);
    }
    sched
        .program
        .tasks
        .iter()
        .map(|t| {
            let l = &labels[t.label as usize];
            matches!(l.phase, Phase::Init | Phase::Optimizer)
                || l.micro_batch < DETAILED_MICRO_BATCHES
                || last_mb.get(&l.step) == Some(&l.micro_batch)
        })
        .collect()
}

/// Flow events (arrows in Perfetto and chrome://tracing) for the dependencies between rank
/// classes: a pipeline stage's send to the receive that waits for it, in each direction.
/// `classes[k]` is class k's schedule and trace; `links` number tasks one class after the
/// other ([`crate::engine::link_parts`]), and a link to or from a task outside the classes,
/// or one the trace does not show task by task, draws nothing. Each arrow leaves the
/// producing task's slice (the sender's last kernel for the data) at its start and enters the
/// receiving task's slice.
pub fn flow_events(classes: &[(&Schedule, &Trace)], links: &[crate::engine::Link], details: &[Detail]) -> String {
    let mut offsets = Vec::with_capacity(classes.len() + 1);
    let mut n = 0usize;
    for (s, _) in classes {
        offsets.push(n);
        n += s.program.tasks.len();
    }
    offsets.push(n);
    let shown: Vec<Vec<bool>> = classes.iter().zip(details).map(|((s, _), d)| d.shown(s)).collect();
    let locate = |g: u32| -> Option<(usize, usize)> {
        let g = g as usize;
        let k = offsets.partition_point(|&o| o <= g).checked_sub(1)?;
        (k < classes.len()).then(|| (k, g - offsets[k]))
    };
    let mut o = String::new();
    for (id, l) in links.iter().enumerate() {
        let (Some((kt, t)), Some((kd, d))) = (locate(l.task), locate(l.dep)) else { continue };
        let ((st, tt), (sd, td)) = (classes[kt], classes[kd]);
        let (ts, td_start) = (tt.start_ns[t], td.start_ns[d]);
        if ts == u64::MAX || td_start == u64::MAX || !shown[kt][t] || !shown[kd][d] {
            continue;
        }
        // Named for the receive: "recv activation from virtual stage 1 (micro-batch 3)".
        let what = &st.labels[st.program.tasks[t].label as usize].what;
        let _ = write!(
            o,
            ",\n{{\"name\":\"{}\",\"cat\":\"pipeline\",\"ph\":\"s\",\"id\":{id},\"pid\":{kd},\"tid\":{},\"ts\":{}}}",
            esc(what),
            sd.program.tasks[d].stream,
            us(td_start)
        );
        let _ = write!(
            o,
            ",\n{{\"name\":\"{}\",\"cat\":\"pipeline\",\"ph\":\"f\",\"bp\":\"e\",\"id\":{id},\"pid\":{kt},\"tid\":{},\"ts\":{}}}",
            esc(what),
            st.program.tasks[t].stream,
            us(ts)
        );
    }
    o
}

/// The slices of a summary: on each stream, each run of consecutive tasks (in the order they
/// ran) of one (step, phase, micro-batch) not shown one by one becomes one slice from the
/// first start to the last end, its busy time and op count in its arguments.
fn aggregated_slices(o: &mut String, sched: &Schedule, trace: &Trace, pid: u32, detailed: &[bool]) {
    let prog = &sched.program;
    let mut by_stream: Vec<Vec<usize>> = vec![Vec::new(); prog.streams.len()];
    for (i, t) in prog.tasks.iter().enumerate() {
        if !detailed[i] && trace.start_ns[i] != u64::MAX && trace.end_ns[i] != u64::MAX {
            if let Some(v) = by_stream.get_mut(t.stream as usize) {
                v.push(i);
            }
        }
    }
    for (stream, tasks) in by_stream.iter_mut().enumerate() {
        tasks.sort_by_key(|&i| (trace.start_ns[i], i));
        let mut k = 0;
        while k < tasks.len() {
            let first = &sched.labels[prog.tasks[tasks[k]].label as usize];
            let key = (first.step, first.phase, first.micro_batch);
            let (start, mut end, mut busy, mut ops) = (trace.start_ns[tasks[k]], 0, 0, 0);
            while k < tasks.len() {
                let i = tasks[k];
                let l = &sched.labels[prog.tasks[i].label as usize];
                if (l.step, l.phase, l.micro_batch) != key {
                    break;
                }
                end = end.max(trace.end_ns[i]);
                busy += trace.end_ns[i] - trace.start_ns[i];
                ops += 1;
                k += 1;
            }
            let _ = write!(
                o,
                ",\n{{\"name\":\"micro-batch {} {} ({ops} ops)\",\"cat\":\"Summary\",\"ph\":\"X\",\"pid\":{pid},\"tid\":{stream},\"ts\":{},\"dur\":{},\"args\":{{\"step\":{},\"phase\":\"{}\",\"micro_batch\":{},\"ops\":{ops},\"busy_us\":{}}}}}",
                key.2,
                key.1.name(),
                us(start),
                us(end - start),
                key.0,
                key.1.name(),
                key.2,
                us(busy)
            );
        }
    }
}

/// A task's cost-model figures as event args: FLOPs and the achieved TFLOP/s for a kernel,
/// bytes and the achieved GB/s for what moves data (nothing where the cost model charged
/// neither).
fn work_args(l: &crate::schedule::TaskLabel, dur_ns: u64) -> String {
    let secs = dur_ns as f64 / 1e9;
    let mut s = String::new();
    if l.flops > 0.0 {
        let _ = write!(s, ",\"flops\":{}", Whole(l.flops));
        if secs > 0.0 {
            let _ = write!(s, ",\"tflops_per_s\":{:.1}", l.flops / secs / 1e12);
        }
    }
    if l.bytes > 0 {
        let _ = write!(s, ",\"bytes\":{}", l.bytes);
        if secs > 0.0 {
            let _ = write!(s, ",\"gb_per_s\":{:.1}", l.bytes as f64 / secs / 1e9);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_formatting_prints_what_float_formatting_prints() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut values =
            vec![0, 1, 49_999, 50_000, 50_001, 150_000, 99_999_999_950_000, (1 << 53) - 1, 1 << 53, u64::MAX];
        for _ in 0..100_000 {
            // xorshift: bytes across every magnitude stepsim reports.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 40));
        }
        for b in values {
            assert_eq!(Gb4(b).to_string(), format!("{:.4}", b as f64 / 1e9), "{b}");
            let f = b as f64;
            assert_eq!(Whole(f).to_string(), format!("{f:.0}"), "{f}");
            assert_eq!(Whole(f * 0.5 + 0.25).to_string(), format!("{:.0}", f * 0.5 + 0.25));
        }
    }

    #[test]
    fn escapes_json_and_formats_microseconds() {
        assert_eq!(esc("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
        assert_eq!(us(1_234_567), "1234.567");
        assert_eq!(us(5), "0.005");
    }
}
