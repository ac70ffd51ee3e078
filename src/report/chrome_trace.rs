//! `trace.json` in the Chrome trace event format (opens in Perfetto or chrome://tracing):
//! one process per distinct rank class, one thread (track) per stream, a complete event
//! ("ph":"X") per task and counter events ("ph":"C") for allocated and reserved bytes and
//! for every memory category the run holds, so the step's overlap of compute and
//! communication can be read next to its memory.

use std::fmt::Write;

use crate::engine::Trace;
use crate::memory::Category;
use crate::schedule::Schedule;

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
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
    o
}

/// Microseconds with nanosecond precision, as the format expects.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// Renders the trace of one rank class (`pid`), named `rank_label`.
pub fn render(sched: &Schedule, trace: &Trace, pid: u32, rank_label: &str) -> String {
    let prog = &sched.program;
    let mut o = String::with_capacity(prog.tasks.len() * 160 + 1024);
    o.push_str("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
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
    for (i, t) in prog.tasks.iter().enumerate() {
        let (start, end) = (trace.start_ns[i], trace.end_ns[i]);
        if start == u64::MAX || end == u64::MAX {
            continue;
        }
        let l = &sched.labels[t.label as usize];
        let layer = l.layer().map_or(String::from("null"), |x| x.to_string());
        let _ = write!(
            o,
            ",\n{{\"name\":\"{}\",\"cat\":\"{:?}\",\"ph\":\"X\",\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{},\"args\":{{\"step\":{},\"phase\":\"{}\",\"micro_batch\":{},\"layer\":{layer}}}}}",
            esc(&l.what),
            l.kind,
            t.stream,
            us(start),
            us(end - start),
            l.step,
            l.phase.name(),
            l.micro_batch
        );
    }
    // Memory counters at each change: allocated and reserved on one track, every category
    // the run ever holds (by the plot's names) on another.
    let present: Vec<Category> = Category::ALL
        .iter()
        .copied()
        .filter(|c| trace.timeline.samples.iter().any(|s| s.by_category[c.index()] > 0))
        .collect();
    let mut last = (u64::MAX, u64::MAX);
    for s in &trace.timeline.samples {
        if (s.allocated, s.reserved) == last {
            continue;
        }
        last = (s.allocated, s.reserved);
        let _ = write!(
            o,
            ",\n{{\"name\":\"memory (GB)\",\"ph\":\"C\",\"pid\":{pid},\"ts\":{},\"args\":{{\"allocated\":{:.4},\"reserved\":{:.4}}}}}",
            us(s.time_ns),
            s.allocated as f64 / 1e9,
            s.reserved as f64 / 1e9,
        );
        let _ = write!(
            o,
            ",\n{{\"name\":\"memory by category (GB)\",\"ph\":\"C\",\"pid\":{pid},\"ts\":{},\"args\":{{",
            us(s.time_ns)
        );
        for (k, c) in present.iter().enumerate() {
            let sep = if k == 0 { "" } else { "," };
            let _ = write!(o, "{sep}\"{}\":{:.4}", esc(c.label()), s.by_category[c.index()] as f64 / 1e9);
        }
        o.push_str("}}");
    }
    o.push_str("\n]}\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_json_and_formats_microseconds() {
        assert_eq!(esc("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
        assert_eq!(us(1_234_567), "1234.567");
        assert_eq!(us(5), "0.005");
    }
}
