//! Writers for `report.json`, `memory.csv`, `trace.json` and `memory.png`. Each file is written to a
//! temporary name and renamed into place, so a file that exists is complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::png::{MemoryPlot, OomMark, PhaseSpan, RankPanel};
use super::{fmt_bytes, phase_spans, Report};
use crate::engine::Trace;
use crate::memory::Category;
use crate::schedule::Schedule;

/// A file that could not be written.
#[derive(Debug)]
pub struct WriteError {
    pub path: PathBuf,
    pub message: String,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for WriteError {}

fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let tmp = path.with_extension("tmp-stepsim");
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        WriteError { path: path.to_path_buf(), message: e.to_string() }
    })
}

pub fn report_json(r: &Report) -> String {
    let mut s = serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// `memory.csv`: one row per change of a category's bytes, plus the allocated and reserved
/// totals, for each distinct rank class. Values hold until the next row of the same
/// (rank_class, category).
pub fn memory_csv(trace: &Trace, rank_class: &str) -> String {
    let mut o = String::with_capacity(trace.timeline.samples.len() * 48);
    o.push_str("time_s,rank_class,category,bytes\n");
    let mut prev = [u64::MAX; Category::COUNT];
    let mut prev_alloc = u64::MAX;
    let mut prev_res = u64::MAX;
    use std::fmt::Write as _;
    for s in &trace.timeline.samples {
        let t = s.time_ns as f64 / 1e9;
        for c in Category::ALL {
            let v = s.by_category[c.index()];
            if v != prev[c.index()] && !(prev[c.index()] == u64::MAX && v == 0) {
                let _ = writeln!(o, "{t:.9},{rank_class},{},{v}", c.key());
                prev[c.index()] = v;
            }
        }
        if s.allocated != prev_alloc {
            let _ = writeln!(o, "{t:.9},{rank_class},allocated,{}", s.allocated);
            prev_alloc = s.allocated;
        }
        if s.reserved != prev_res {
            let _ = writeln!(o, "{t:.9},{rank_class},reserved,{}", s.reserved);
            prev_res = s.reserved;
        }
    }
    o
}

pub fn memory_plot(r: &Report, sched: &Schedule, trace: &Trace, rank_label: &str) -> MemoryPlot {
    let cats: Vec<Category> = Category::ALL.to_vec();
    let mut times = Vec::with_capacity(trace.timeline.samples.len() + 1);
    let mut bytes: Vec<Vec<u64>> = vec![Vec::with_capacity(times.capacity()); cats.len()];
    times.push(0.0);
    for b in bytes.iter_mut() {
        b.push(0);
    }
    for s in &trace.timeline.samples {
        times.push(s.time_ns as f64 / 1e9);
        for (i, c) in cats.iter().enumerate() {
            bytes[i].push(s.by_category[c.index()]);
        }
    }
    let end = trace.end_time_ns as f64 / 1e9;
    if end > *times.last().unwrap_or(&0.0) {
        times.push(end);
        for b in bytes.iter_mut() {
            let last = *b.last().unwrap_or(&0);
            b.push(last);
        }
    }
    let phases = phase_spans(sched, trace)
        .into_iter()
        .filter(|p| p.1 != crate::schedule::Phase::Init || p.3 > p.2)
        .map(|(step, ph, a, b)| PhaseSpan {
            label: if step == 0 { ph.name().to_string() } else { format!("{} {}", ph.name(), step) },
            start_s: a as f64 / 1e9,
            end_s: b as f64 / 1e9,
        })
        .collect();
    let oom = match &r.verdict {
        super::Verdict::Oom(o) => Some(OomMark {
            time_s: o.at.time_s,
            label: format!("OOM: {} in {} (+{})", o.at.op, o.at.phase.name(), fmt_bytes(o.requested.bytes)),
        }),
        _ => None,
    };
    MemoryPlot {
        title: format!("stepsim: {} - memory per GPU ({} params)", r.scenario, r.param_count_human),
        panels: vec![RankPanel {
            label: rank_label.to_string(),
            capacity_bytes: r.capacity.bytes,
            categories: cats.iter().map(|c| c.label().to_string()).collect(),
            times_s: times,
            bytes,
            reserved: None,
            phases,
            oom,
        }],
    }
}

/// Writes report.json, memory.csv and memory.png into `dir` (created if missing).
pub fn write_all(dir: &Path, r: &Report, sched: &Schedule, trace: &Trace) -> Result<Vec<PathBuf>, WriteError> {
    std::fs::create_dir_all(dir).map_err(|e| WriteError {
        path: dir.to_path_buf(),
        message: format!("cannot create the output folder: {e}"),
    })?;
    let rank = r.rank_classes.first().map(|c| format!("ranks {}", c.ranks)).unwrap_or_else(|| "rank 0".into());
    let json = dir.join("report.json");
    atomic_write(&json, report_json(r).as_bytes())?;
    let csv = dir.join("memory.csv");
    atomic_write(&csv, memory_csv(trace, &rank).as_bytes())?;
    let chrome = dir.join("trace.json");
    atomic_write(&chrome, super::chrome_trace::render(sched, trace, 0, &rank).as_bytes())?;
    let png = dir.join("memory.png");
    let label = format!(
        "{} ({} GPUs, identical programs, simulated once)",
        rank,
        r.rank_classes.first().map_or(1, |c| c.count)
    );
    super::png::write_memory_png(&png, &memory_plot(r, sched, trace, &label))
        .map_err(|m| WriteError { path: png.clone(), message: m })?;
    let timeline = dir.join("timeline.png");
    let title = format!("stepsim: {} - streams of {} over time", r.scenario, rank);
    super::timeline_png::write(&timeline, &title, sched, trace)
        .map_err(|m| WriteError { path: timeline.clone(), message: m })?;
    Ok(vec![json, csv, chrome, png, timeline])
}
