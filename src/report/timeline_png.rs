//! `timeline.png`: a Gantt view of every rank class's streams (compute and communication)
//! over the simulated steps, one row group per class (pipeline stages top to bottom) on one
//! shared time axis with the same plot width and legend column as `memory.png`, so a gap on
//! the compute stream can be matched with the collective it waits for, with the stage it
//! waits for, and with the memory it holds meanwhile.
//!
//! What is drawn:
//! - Each pixel column of a row shows the kind of task that ran longest in it (ties: the
//!   first in the legend), and runs of equal columns are one rectangle: a task narrower than
//!   a pixel still gets one. Where short tasks of different kinds alternate (a checkpointed
//!   backward: recompute, backward, layer by layer) the stretch is one block split top to
//!   bottom by each kind's share of its time ([`blocks`]), so recompute reads as a band
//!   of known size, not as texture.
//! - The compute row's background is grey: idle compute (the pipeline bubble, waiting on a
//!   dependency) shows as grey, not as white page.
//! - **Exposed communication** (the red band under a compute row): inside a step (a period
//!   `steps[].start_s .. start_s + time_s` of that class's report), the time the class's
//!   compute stream (stream 0) runs nothing while any of its communication streams runs a
//!   task. This is the rule behind report.json's `exposed_comm_s`, drawn where it happens;
//!   a column is marked when any of its time is exposed. Under offload, the time compute
//!   waits on host work alone (the CPU optimizer step, PCIe copies, NVMe: `exposed_host_s`)
//!   is a black band in the same strip, so a CPU-bound step does not read as a network one.
//! - **Step boundaries**: a vertical line at each step's start (the job report's
//!   `steps[].start_s`, or for a run without step timings (an OOM) the first start of each
//!   step's tasks), labelled "step 1", "step 2", ...
//! - At most [`MAX_GROUPS`] classes are drawn (the first, the last, the headline and evenly
//!   spaced ones between); a note under the axis names the ones left out. Beyond
//!   [`FULL_GROUPS`] classes each group is compact: its compute row and one row for all its
//!   communication streams. The image height is therefore bounded whatever the job.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::png::{ensure_font, fit_text, fmt_num, tick_decimals, FONT};
use super::StepTiming;
use crate::engine::Trace;
use crate::schedule::{Schedule, StreamClass, TaskKind};

/// Same width and legend column as memory.png, so the time axes line up.
const WIDTH: u32 = 1400;
const LEGEND_WIDTH: u32 = 310;
/// memory.png's chart margins and tick-label areas, for the same plot span.
const MARGIN_LEFT: u32 = 10;
const MARGIN_RIGHT: u32 = 6;
const Y_LABEL_AREA: u32 = 82;
const X_LABEL_AREA: u32 = 52;
const X_TICKS: usize = 14;
const TITLE_HEIGHT: u32 = 44;
/// Room above the plot for the step labels.
const STEP_LABEL_HEIGHT: u32 = 20;
const NOTE_LINE: u32 = 18;
const NOTE_MAX_LINES: usize = 6;
/// At most this many rank classes get a row group.
pub const MAX_GROUPS: usize = 16;
/// Up to this many groups (and [`FULL_ROWS`] rows), every stream has its own row.
pub const FULL_GROUPS: usize = 4;
const FULL_ROWS: usize = 24;
/// Bounds the image whatever the job: title, steps, [`MAX_GROUPS`] compact groups or the
/// full rows, axis, note.
pub const MAX_HEIGHT: u32 = 1100;

const IDLE: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);
const EXPOSED: RGBColor = RGBColor(0xD0, 0x00, 0x00);
/// Exposed host work: black, apart from the red of exposed communication under every
/// colour-vision deficiency, and from every task colour.
const EXPOSED_HOST: RGBColor = RGBColor(0x00, 0x00, 0x00);
const STEP_LINE: RGBColor = RGBColor(0x20, 0x20, 0x20);
const TEXT: RGBColor = RGBColor(0x20, 0x20, 0x20);

/// The legend's entries, in order: colour and name. A task's entry is [`entry`].
const ENTRIES: [(RGBColor, &str); 10] = [
    (RGBColor(0x00, 0x72, 0xB2), "forward"),
    (RGBColor(0xD5, 0x5E, 0x00), "backward"),
    (RGBColor(0x6A, 0x1B, 0x9A), "recompute (checkpointing)"),
    (RGBColor(0x00, 0x9E, 0x73), "all-gather"),
    (RGBColor(0xE6, 0x9F, 0x00), "reduce-scatter"),
    (RGBColor(0x56, 0xB4, 0xE9), "all-reduce"),
    (RGBColor(0xCC, 0x79, 0xA7), "all-to-all (MoE)"),
    (RGBColor(0xC8, 0xB4, 0x00), "send / recv, host copies"),
    (RGBColor(0x44, 0x44, 0x44), "optimizer.step()"),
    (RGBColor(0x99, 0x99, 0x99), "init / zero_grad"),
];

fn entry(kind: TaskKind) -> usize {
    match kind {
        TaskKind::Forward => 0,
        TaskKind::Backward => 1,
        TaskKind::Recompute => 2,
        TaskKind::AllGather => 3,
        TaskKind::ReduceScatter => 4,
        TaskKind::AllReduce => 5,
        TaskKind::AllToAll => 6,
        TaskKind::Send | TaskKind::Recv => 7,
        TaskKind::Optimizer => 8,
        TaskKind::ZeroGrad | TaskKind::Init => 9,
    }
}

/// One rank class to draw: its name, program, run and step timings.
pub struct Group<'a> {
    pub name: String,
    pub sched: &'a Schedule,
    pub trace: &'a Trace,
    pub steps: &'a [StepTiming],
}

/// Which classes are drawn and how, and the picture's size; [`write`] returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Indices of the drawn classes, in order (top to bottom).
    pub drawn: Vec<usize>,
    /// Indices of the classes left out, all named in `note`.
    pub left_out: Vec<usize>,
    /// Each group is its compute row and one communication row.
    pub compact: bool,
    /// The note under the axis, one string per line (empty: every class is drawn).
    pub note: Vec<String>,
    pub width: u32,
    pub height: u32,
}

/// Row geometry of one group, pixels.
struct Geometry {
    header: u32,
    compute: u32,
    exposed: u32,
    comm: u32,
    gap: u32,
}

const FULL: Geometry = Geometry { header: 17, compute: 24, exposed: 5, comm: 18, gap: 8 };
const COMPACT: Geometry = Geometry { header: 15, compute: 16, exposed: 4, comm: 8, gap: 5 };

/// The classes drawn: all up to [`MAX_GROUPS`], else the first, the last, the headline and
/// evenly spaced ones between.
fn pick(n: usize, headline: usize) -> Vec<usize> {
    if n <= MAX_GROUPS {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..MAX_GROUPS - 1).map(|i| i * (n - 1) / (MAX_GROUPS - 2)).collect();
    v.push(headline.min(n - 1));
    v.sort_unstable();
    v.dedup();
    v
}

/// Pixel width of `s` in the bundled font (an estimate if the font cannot measure it).
fn text_width(s: &str, size: f64) -> u32 {
    (FONT, size).into_font().box_size(s).map(|(w, _)| w).unwrap_or((s.chars().count() as f64 * size * 0.62) as u32)
}

/// Word-wraps `text` into lines of at most `max_px`.
fn wrap(text: &str, size: f64, max_px: u32) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let candidate = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
        if !line.is_empty() && text_width(&candidate, size) > max_px {
            lines.push(std::mem::take(&mut line));
            line = word.to_string();
        } else {
            line = candidate;
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// The note naming the classes left out: each by name if that fits in [`NOTE_MAX_LINES`],
/// else each run of consecutive ones by its class numbers, "classes 1-14, 16-29, ..." (at
/// most [`MAX_GROUPS`] + 1 runs, so it always fits).
fn note(names: &[String], drawn: &[usize], left_out: &[usize]) -> Vec<String> {
    if left_out.is_empty() {
        return Vec::new();
    }
    let head = format!(
        "{} of {} rank classes drawn (the first, the last, the headline and evenly spaced ones; every class is in trace.json and memory.csv). Left out:",
        drawn.len(),
        names.len()
    );
    let max_px = WIDTH - 2 * MARGIN_LEFT;
    let each = format!("{head} {}.", left_out.iter().map(|&k| names[k].as_str()).collect::<Vec<_>>().join("; "));
    let lines = wrap(&each, 13.0, max_px);
    if lines.len() <= NOTE_MAX_LINES {
        return lines;
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &k in left_out {
        match runs.last_mut() {
            Some(r) if r.1 + 1 == k => r.1 = k,
            _ => runs.push((k, k)),
        }
    }
    let parts: Vec<String> =
        runs.iter().map(|&(a, b)| if a == b { format!("{a}") } else { format!("{a}-{b}") }).collect();
    let head = format!(
        "{} of {} rank classes drawn (the first, the last, the headline and evenly spaced ones; every class is in trace.json and memory.csv). Left out, numbered as report.json's rank_classes from 0: classes",
        drawn.len(),
        names.len()
    );
    let mut lines = wrap(&format!("{head} {}.", parts.join(", ")), 13.0, max_px);
    lines.truncate(NOTE_MAX_LINES);
    lines
}

/// Which classes are drawn, how, and the image size, from the classes' names and stream
/// counts.
pub fn layout(names: &[String], streams: &[usize], headline: usize) -> Layout {
    let drawn = pick(names.len(), headline);
    let left_out: Vec<usize> = (0..names.len()).filter(|k| !drawn.contains(k)).collect();
    let rows: usize = drawn.iter().map(|&k| streams.get(k).copied().unwrap_or(1).max(1)).sum();
    let compact = drawn.len() > FULL_GROUPS || rows > FULL_ROWS;
    let body: u32 = drawn.iter().map(|&k| group_height(compact, streams.get(k).copied().unwrap_or(1))).sum();
    let note = note(names, &drawn, &left_out);
    let plot = TITLE_HEIGHT + STEP_LABEL_HEIGHT + body.max(40) + X_LABEL_AREA + 6;
    let height = plot.max(TITLE_HEIGHT + legend_height()) + note.len() as u32 * NOTE_LINE + 8;
    Layout { drawn, left_out, compact, note, width: WIDTH, height: height.min(MAX_HEIGHT) }
}

fn geometry(compact: bool) -> &'static Geometry {
    if compact {
        &COMPACT
    } else {
        &FULL
    }
}

fn group_height(compact: bool, streams: usize) -> u32 {
    let g = geometry(compact);
    let comm_rows = if compact { u32::from(streams > 1) } else { streams.saturating_sub(1) as u32 };
    g.header + g.compute + g.exposed + comm_rows * g.comm + g.gap
}

const LEGEND_ROW: u32 = 24;
const LEGEND_EXTRA_LINES: u32 = 10;

fn legend_height() -> u32 {
    16 + (ENTRIES.len() as u32 + LEGEND_EXTRA_LINES) * LEGEND_ROW
}

/// Writes the Gantt chart of `groups` (class `headline` is the report's headline); the
/// step lines come from `job_steps` (the job report's), else from the tasks' step labels.
/// Rendered next to `path` and renamed into place; a panic inside plotters is an error.
pub fn write(
    path: &Path,
    title: &str,
    groups: &[Group],
    headline: usize,
    job_steps: &[StepTiming],
) -> Result<Layout, String> {
    ensure_font()?;
    let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    let streams: Vec<usize> = groups.iter().map(|g| g.sched.program.streams.len()).collect();
    let lay = layout(&names, &streams, headline);
    let tmp = path.with_extension("tmp.png");
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render(&tmp, title, groups, &lay, job_steps)))
        .unwrap_or_else(|_| Err("rendering timeline.png panicked inside plotters".into()))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| format!("renaming {}: {e}", tmp.display())));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map(|()| lay)
}

/// Merges sorted-or-not intervals into disjoint sorted ones.
fn merged(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|x| x.1 > x.0);
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The exposed intervals of one class (see the module doc): inside each step period, the
/// union of its tasks on streams of class `which` (communication, or host work) minus the
/// union of what covers them (compute; for host work, compute and communication).
pub fn exposed_intervals(sched: &Schedule, trace: &Trace, steps: &[StepTiming], which: StreamClass) -> Vec<(u64, u64)> {
    let mut compute = Vec::new();
    let mut comm = Vec::new();
    for (i, t) in sched.program.tasks.iter().enumerate() {
        let (s, e) = (trace.start_ns[i], trace.end_ns[i]);
        if s == u64::MAX || e == u64::MAX || e <= s {
            continue;
        }
        let class = sched.stream_class(t.stream);
        if class == which {
            comm.push((s, e));
        } else if class == StreamClass::Compute || which == StreamClass::Host {
            compute.push((s, e));
        }
    }
    let (compute, comm) = (merged(compute), merged(comm));
    let periods = merged(
        steps
            .iter()
            .map(|st| ((st.start_s * 1e9).round() as u64, ((st.start_s + st.time_s) * 1e9).round() as u64))
            .collect(),
    );
    // comm ∩ periods, then minus compute; all three are sorted and disjoint.
    let mut within = Vec::new();
    let mut j = 0;
    for &(s, e) in &comm {
        while j < periods.len() && periods[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while k < periods.len() && periods[k].0 < e {
            let (a, b) = (s.max(periods[k].0), e.min(periods[k].1));
            if b > a {
                within.push((a, b));
            }
            k += 1;
        }
    }
    let mut out = Vec::new();
    let mut j = 0;
    for (s, e) in within {
        while j < compute.len() && compute[j].1 <= s {
            j += 1;
        }
        let mut cur = s;
        let mut k = j;
        while k < compute.len() && compute[k].0 < e {
            if compute[k].0 > cur {
                out.push((cur, compute[k].0));
            }
            cur = cur.max(compute[k].1);
            k += 1;
        }
        if cur < e {
            out.push((cur, e));
        }
    }
    out
}

/// Pixel columns of a row: per column the legend entry that ran longest in it (None: idle).
struct Raster {
    t0: f64,
    ns_per_col: f64,
    cols: usize,
}

impl Raster {
    /// The columns [first, last] an interval touches, with its overlap (ns) with each.
    fn spread(&self, s: u64, e: u64, mut f: impl FnMut(usize, f64)) {
        if self.cols == 0 || e <= s {
            return;
        }
        let (a, b) = ((s as f64 - self.t0) / self.ns_per_col, (e as f64 - self.t0) / self.ns_per_col);
        let first = (a.floor().max(0.0) as usize).min(self.cols - 1);
        let last = ((b.ceil() as usize).saturating_sub(1)).clamp(first, self.cols - 1);
        for c in first..=last {
            let overlap = (b.min(c as f64 + 1.0) - a.max(c as f64)).max(0.0) * self.ns_per_col;
            // A zero overlap still marks the column: a task narrower than a pixel gets one.
            f(c, overlap.max(1e-9));
        }
    }

    /// Per column: the time (ns) each legend entry ran in it.
    fn shares(&self, tasks: impl Iterator<Item = (u64, u64, usize)>) -> Vec<[f64; ENTRIES.len()]> {
        let mut acc = vec![[0f64; ENTRIES.len()]; self.cols];
        for (s, e, k) in tasks {
            self.spread(s, e, |c, ns| acc[c][k] += ns);
        }
        acc
    }

    fn marked(&self, intervals: &[(u64, u64)]) -> Vec<Option<usize>> {
        let mut m = vec![None; self.cols];
        for &(s, e) in intervals {
            self.spread(s, e, |c, _| m[c] = Some(0));
        }
        m
    }
}

/// Runs of equal non-idle columns: (first column, end column exclusive, value).
fn runs(cols: &[Option<usize>]) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut c = 0;
    while c < cols.len() {
        if let Some(k) = cols[c] {
            let mut e = c + 1;
            while e < cols.len() && cols[e] == Some(k) {
                e += 1;
            }
            out.push((c, e, k));
            c = e;
        } else {
            c += 1;
        }
    }
    out
}

/// Runs shorter than this many pixels that alternate are drawn as one block.
const MIX_PX: usize = 8;

/// A rectangle of a row: columns `a..b`, split top to bottom into the legend entries' shares
/// of its time, the rest (idle) left undrawn (one entry, share 1, for a plain run).
#[derive(Debug, Clone, PartialEq)]
struct Block {
    a: usize,
    b: usize,
    parts: Vec<(usize, f64)>,
}

/// The blocks of a row from each column's time per entry: each column shows the entry that
/// ran longest in it (ties: the first in the legend), runs of equal columns are one block, and
/// a stretch of at least `2 * MIX_PX` columns made only of runs shorter than [`MIX_PX`]
/// (idle gaps of one column included) with two entries or more is one block split by their
/// shares of its time (what is left is idle), so interleaved short tasks (a backward with its recompute, layer by layer) read
/// as a block of known composition rather than as stripes.
fn blocks(acc: &[[f64; ENTRIES.len()]], ns_per_col: f64) -> Vec<Block> {
    let dom: Vec<Option<usize>> = acc
        .iter()
        .map(|a| {
            let mut best: Option<usize> = None;
            for (k, &v) in a.iter().enumerate() {
                if v > 0.0 && best.is_none_or(|b| v > a[b]) {
                    best = Some(k);
                }
            }
            best
        })
        .collect();
    let rs = runs(&dom);
    let mut out = Vec::new();
    let mut i = 0;
    while i < rs.len() {
        // The longest stretch of short runs from i, joined across one-column gaps.
        let mut j = i;
        while j < rs.len() && rs[j].1 - rs[j].0 < MIX_PX && (j == i || rs[j].0 <= rs[j - 1].1 + 1) {
            j += 1;
        }
        let kinds = rs[i..j].iter().map(|r| r.2).collect::<std::collections::BTreeSet<_>>();
        if j > i + 1 && rs[j - 1].1 - rs[i].0 >= 2 * MIX_PX && kinds.len() > 1 {
            let (a, b) = (rs[i].0, rs[j - 1].1);
            let mut tot = [0f64; ENTRIES.len()];
            for col in &acc[a..b] {
                for (t, v) in tot.iter_mut().zip(col) {
                    *t += v;
                }
            }
            // Shares of the block's span: the rest of it (idle) is left undrawn.
            let sum: f64 = tot.iter().sum::<f64>().max((b - a) as f64 * ns_per_col);
            let parts = tot.iter().enumerate().filter(|(_, &v)| v > 0.0).map(|(k, &v)| (k, v / sum)).collect();
            out.push(Block { a, b, parts });
            i = j;
        } else {
            let (a, b, k) = rs[i];
            out.push(Block { a, b, parts: vec![(k, 1.0)] });
            i += 1;
        }
    }
    out
}

/// The tasks of the given streams that ran: (start, end, legend entry).
fn tasks_of<'a>(g: &'a Group, keep: impl Fn(u16) -> bool + 'a) -> impl Iterator<Item = (u64, u64, usize)> + 'a {
    g.sched.program.tasks.iter().enumerate().filter_map(move |(i, t)| {
        let (s, e) = (g.trace.start_ns[i], g.trace.end_ns[i]);
        (keep(t.stream) && s != u64::MAX && e != u64::MAX && t.duration_ns > 0)
            .then(|| (s, e.max(s + 1), entry(g.sched.labels[t.label as usize].kind)))
    })
}

/// Step starts (step number, seconds): the job's step timings, else each step's first task.
fn step_starts(groups: &[Group], drawn: &[usize], job_steps: &[StepTiming]) -> Vec<(u32, f64)> {
    if !job_steps.is_empty() {
        return job_steps.iter().map(|s| (s.step, s.start_s)).collect();
    }
    let mut first: std::collections::BTreeMap<u32, u64> = Default::default();
    for &k in drawn {
        let g = &groups[k];
        for (i, t) in g.sched.program.tasks.iter().enumerate() {
            let step = g.sched.labels[t.label as usize].step;
            let s = g.trace.start_ns[i];
            if step > 0 && s != u64::MAX {
                let v = first.entry(step).or_insert(s);
                *v = (*v).min(s);
            }
        }
    }
    first.into_iter().map(|(k, s)| (k, s as f64 / 1e9)).collect()
}

fn font(size: f64) -> TextStyle<'static> {
    (FONT, size).into_font().color(&TEXT)
}

fn header_text(g: &Group) -> String {
    match g.steps.last() {
        Some(st) if st.host_busy_s > 0.0 => format!(
            "{} - step {}: {} s; compute idle {} s, of which exposed communication {} s, host work {} s",
            g.name,
            st.step,
            fmt_num(st.time_s, 3),
            fmt_num(st.compute_idle_s, 3),
            fmt_num(st.exposed_comm_s, 3),
            fmt_num(st.exposed_host_s, 3)
        ),
        Some(st) => format!(
            "{} - step {}: {} s; compute idle {} s, of which exposed communication {} s",
            g.name,
            st.step,
            fmt_num(st.time_s, 3),
            fmt_num(st.compute_idle_s, 3),
            fmt_num(st.exposed_comm_s, 3)
        ),
        None => g.name.clone(),
    }
}

fn render(path: &Path, title: &str, groups: &[Group], lay: &Layout, job_steps: &[StepTiming]) -> Result<(), String> {
    let e = |what: &'static str| move |err: DrawingAreaErrorKind<_>| format!("drawing {what}: {err}");
    let root = BitMapBackend::new(path, (lay.width, lay.height)).into_drawing_area();
    root.fill(&WHITE).map_err(e("background"))?;
    let (title_area, rest) = root.split_vertically(TITLE_HEIGHT);
    let title_style = font(22.0).pos(Pos::new(HPos::Center, VPos::Center));
    if let Some(t) = fit_text(&title_area, title, &title_style, WIDTH - 40) {
        title_area.draw_text(&t, &title_style, ((WIDTH / 2) as i32, (TITLE_HEIGHT / 2) as i32)).map_err(e("title"))?;
    }
    let note_h = lay.note.len() as u32 * NOTE_LINE + 8;
    let (body, note_area) = rest.split_vertically(lay.height - TITLE_HEIGHT - note_h);
    let (chart_area, legend_area) = body.split_horizontally(WIDTH - LEGEND_WIDTH);

    let end_ns = lay.drawn.iter().map(|&k| groups[k].trace.end_time_ns).max().unwrap_or(0).max(1);
    let x1 = end_ns as f64 / 1e9;
    let rows_px: u32 =
        lay.drawn.iter().map(|&k| group_height(lay.compact, groups[k].sched.program.streams.len())).sum::<u32>();
    let (_, body_h) = chart_area.dim_in_pixel();
    let mut chart = ChartBuilder::on(&chart_area)
        .margin_top(STEP_LABEL_HEIGHT)
        .margin_left(MARGIN_LEFT)
        .margin_right(MARGIN_RIGHT)
        .margin_bottom(body_h.saturating_sub(STEP_LABEL_HEIGHT + rows_px.max(40) + X_LABEL_AREA))
        .x_label_area_size(X_LABEL_AREA)
        .y_label_area_size(Y_LABEL_AREA)
        .right_y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(0.0..x1, 0.0..1.0)
        .map_err(|err| format!("chart axes: {err}"))?;
    let x_dec = tick_decimals(0.0, x1, X_TICKS);
    let x_fmt = |v: &f64| fmt_num(*v, x_dec);
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(X_TICKS)
        .x_label_formatter(&x_fmt)
        .x_desc("time (s)")
        .bold_line_style(RGBColor(0xEE, 0xEE, 0xEE))
        .light_line_style(TRANSPARENT)
        .label_style(font(16.0))
        .axis_desc_style(font(18.0))
        .draw()
        .map_err(|err| format!("mesh: {err}"))?;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let (px0, px1, py0) = (xr.start, xr.end, yr.start);
    let cols = (px1 - px0).max(1) as usize;
    let raster = Raster { t0: 0.0, ns_per_col: end_ns as f64 / cols as f64, cols };
    let geo = geometry(lay.compact);
    // Pixel rectangles on the root area.
    let rect =
        |x0: i32, x1: i32, y0: i32, y1: i32, c: RGBColor| Rectangle::new([(x0, y0), (x1 - 1, y1 - 1)], c.filled());
    let left = |s: &str, y: i32, size: f64| -> Result<(), String> {
        let style = font(size).pos(Pos::new(HPos::Right, VPos::Center));
        let t = fit_text(&root, s, &style, Y_LABEL_AREA - 6).unwrap_or_default();
        root.draw_text(&t, &style, (px0 - 5, y)).map_err(|err| format!("drawing row labels: {err}"))
    };
    // A block's parts top to bottom, each as tall as its share (cumulative, rounded).
    let draw_blocks = |bl: &[Block], y0: i32, y1: i32| -> Result<(), String> {
        for b in bl {
            let mut acc = 0.0;
            for &(kind, share) in &b.parts {
                let top = y0 + (acc * f64::from(y1 - y0)).round() as i32;
                acc += share;
                let bottom = y0 + (acc * f64::from(y1 - y0)).round() as i32;
                if bottom > top {
                    root.draw(&rect(px0 + b.a as i32, px0 + b.b as i32, top, bottom, ENTRIES[kind].0))
                        .map_err(|err| format!("drawing tasks: {err}"))?;
                }
            }
        }
        Ok(())
    };
    let mut y = py0;
    let mut headers: Vec<(i32, i32)> = Vec::new();
    for &k in &lay.drawn {
        let g = &groups[k];
        let hstyle = font(13.0).pos(Pos::new(HPos::Left, VPos::Top));
        let header = fit_text(&root, &header_text(g), &hstyle, (px1 - px0 - 4) as u32).unwrap_or_default();
        root.draw_text(&header, &hstyle, (px0 + 2, y + 1)).map_err(e("group header"))?;
        headers.push((y, y + geo.header as i32));
        y += geo.header as i32;
        // Compute row: grey idle background, then the tasks, then the exposed band under it.
        let h = geo.compute as i32;
        root.draw(&rect(px0, px1, y, y + h, IDLE)).map_err(e("idle"))?;
        draw_blocks(&blocks(&raster.shares(tasks_of(g, |s| s == 0)), raster.ns_per_col), y, y + h)?;
        left(&g.sched.program.streams.first().cloned().unwrap_or_else(|| "compute".into()), y + h / 2, 14.0)?;
        y += h;
        for (which, color) in [(StreamClass::Comm, EXPOSED), (StreamClass::Host, EXPOSED_HOST)] {
            let exposed = raster.marked(&exposed_intervals(g.sched, g.trace, g.steps, which));
            for (a, b, _) in runs(&exposed) {
                root.draw(&rect(px0 + a as i32, px0 + b as i32, y, y + geo.exposed as i32 - 1, color))
                    .map_err(e("exposed communication"))?;
            }
        }
        y += geo.exposed as i32;
        // Communication: a row per stream, or one row for all of them.
        let n = g.sched.program.streams.len();
        let comm_rows: Vec<Vec<u16>> = if lay.compact {
            if n > 1 {
                vec![(1..n as u16).collect()]
            } else {
                vec![]
            }
        } else {
            (1..n as u16).map(|s| vec![s]).collect()
        };
        for streams in comm_rows {
            let h = geo.comm as i32;
            let pad = if lay.compact { 0 } else { 2 };
            draw_blocks(
                &blocks(&raster.shares(tasks_of(g, |s| streams.contains(&s))), raster.ns_per_col),
                y + pad,
                y + h - pad,
            )?;
            if !lay.compact {
                left(&g.sched.program.streams[streams[0] as usize], y + h / 2, 12.0)?;
            } else {
                left("comm", y + h / 2, 10.0)?;
            }
            y += h;
        }
        y += geo.gap as i32;
        // A thin separator between groups.
        root.draw(&rect(px0, px1, y - (geo.gap as i32) / 2, y - (geo.gap as i32) / 2 + 1, RGBColor(0xBB, 0xBB, 0xBB)))
            .map_err(e("separator"))?;
    }
    // Step boundaries over everything, labelled above the plot.
    let y_end = y.max(py0 + 40);
    for (step, s) in step_starts(groups, &lay.drawn, job_steps) {
        if !(s.is_finite() && s >= 0.0 && s <= x1) {
            continue;
        }
        let x = px0 + ((s / x1) * cols as f64).round() as i32;
        let x = x.min(px1 - 1);
        // Through every row, not through the group headers' text.
        let mut top = py0 - 4;
        for &(h0, h1) in headers.iter().chain(std::iter::once(&(y_end, y_end))) {
            if h0 > top {
                root.draw(&rect(x, x + 2, top, h0, STEP_LINE)).map_err(e("step line"))?;
            }
            top = h1;
        }
        let style = font(14.0).pos(Pos::new(HPos::Left, VPos::Bottom));
        root.draw_text(&format!("step {step}"), &style, (x + 3, py0 - 3)).map_err(e("step label"))?;
    }
    // Legend: task kinds present, then what the marks mean.
    let host = lay.drawn.iter().any(|&g| groups[g].steps.iter().any(|st| st.host_busy_s > 0.0));
    let present: Vec<bool> = (0..ENTRIES.len())
        .map(|k| lay.drawn.iter().any(|&g| groups[g].sched.labels.iter().any(|l| entry(l.kind) == k)))
        .collect();
    let mut ly = 16;
    for (k, (color, name)) in ENTRIES.iter().enumerate() {
        if !present[k] && (k == 6 || k == 7) {
            continue;
        }
        legend_area.draw(&Rectangle::new([(20, ly), (44, ly + 16)], color.filled())).map_err(e("legend"))?;
        legend_area.draw(&Text::new(*name, (54, ly), font(15.0))).map_err(e("legend"))?;
        ly += LEGEND_ROW as i32;
    }
    ly += 6;
    legend_area.draw(&Rectangle::new([(20, ly), (44, ly + 16)], IDLE.filled())).map_err(e("legend"))?;
    legend_area.draw(&Text::new("compute idle (pipeline bubble,", (54, ly), font(15.0))).map_err(e("legend"))?;
    legend_area.draw(&Text::new("dependencies, communication)", (54, ly + 18), font(15.0))).map_err(e("legend"))?;
    ly += LEGEND_ROW as i32 + 18;
    legend_area.draw(&Rectangle::new([(20, ly), (44, ly + 10)], ENTRIES[1].0.filled())).map_err(e("legend"))?;
    legend_area.draw(&Rectangle::new([(20, ly + 10), (44, ly + 16)], ENTRIES[2].0.filled())).map_err(e("legend"))?;
    legend_area.draw(&Text::new("short tasks that alternate: one", (54, ly), font(15.0))).map_err(e("legend"))?;
    legend_area.draw(&Text::new("block, split by each one's share", (54, ly + 18), font(15.0))).map_err(e("legend"))?;
    legend_area.draw(&Text::new("of its time (the rest: idle)", (54, ly + 36), font(15.0))).map_err(e("legend"))?;
    ly += LEGEND_ROW as i32 + 36;
    legend_area.draw(&Rectangle::new([(20, ly + 6), (44, ly + 10)], EXPOSED.filled())).map_err(e("legend"))?;
    for (i, line) in ["exposed communication: compute", "idle while a collective / transfer", "of the same rank runs"]
        .iter()
        .enumerate()
    {
        legend_area.draw(&Text::new(*line, (54, ly + 18 * i as i32), font(15.0))).map_err(e("legend"))?;
    }
    ly += LEGEND_ROW as i32 + 36;
    if host {
        legend_area.draw(&Rectangle::new([(20, ly + 6), (44, ly + 10)], EXPOSED_HOST.filled())).map_err(e("legend"))?;
        for (i, line) in
            ["exposed host work: compute idle", "while only offload's CPU step,", "PCIe copies or NVMe run"]
                .iter()
                .enumerate()
        {
            legend_area.draw(&Text::new(*line, (54, ly + 18 * i as i32), font(15.0))).map_err(e("legend"))?;
        }
        ly += LEGEND_ROW as i32 + 36;
    }
    legend_area.draw(&Rectangle::new([(31, ly), (32, ly + 16)], STEP_LINE.filled())).map_err(e("legend"))?;
    legend_area.draw(&Text::new("step start", (54, ly), font(15.0))).map_err(e("legend"))?;
    // The note: which classes are drawn and which are left out.
    for (i, line) in lay.note.iter().enumerate() {
        note_area
            .draw(&Text::new(line.as_str(), (MARGIN_LEFT as i32, 2 + (NOTE_LINE * i as u32) as i32), font(13.0)))
            .map_err(e("note"))?;
    }
    root.present().map_err(|err| format!("writing {}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(pattern: &[(usize, usize)]) -> Vec<[f64; ENTRIES.len()]> {
        let mut v = Vec::new();
        for &(kind, n) in pattern {
            for _ in 0..n {
                let mut c = [0.0; ENTRIES.len()];
                if kind < ENTRIES.len() {
                    c[kind] = 1.0;
                }
                v.push(c);
            }
        }
        v
    }

    #[test]
    fn interleaved_short_tasks_are_one_block_and_long_ones_stay_apart() {
        // Forward 20 columns, then backward 5 / recompute 2 alternating (a checkpointed
        // backward), then idle 3, optimizer 10.
        let mut p = vec![(0, 20)];
        for _ in 0..10 {
            p.extend([(1, 5), (2, 2)]);
        }
        p.extend([(99, 3), (8, 10)]);
        let b = blocks(&cols(&p), 1.0);
        assert_eq!(b.len(), 3, "{b:?}");
        assert_eq!(b[0], Block { a: 0, b: 20, parts: vec![(0, 1.0)] });
        assert_eq!((b[1].a, b[1].b), (20, 90));
        assert_eq!(b[1].parts.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((b[1].parts[1].1 - 2.0 / 7.0).abs() < 1e-9, "recompute's share of the block");
        assert_eq!(b[2], Block { a: 93, b: 103, parts: vec![(8, 1.0)] });
        // 1F1B-like alternation of long runs is drawn run by run.
        assert_eq!(blocks(&cols(&[(0, 9), (1, 12), (0, 9)]), 1.0).len(), 3);
    }
}
