//! `timeline.png`: a Gantt view of every rank class's streams (compute and communication)
//! over the simulated steps, one row group per class (pipeline stages top to bottom) on one
//! shared time axis with the same plot width and legend column as `memory.png`, so a gap on
//! the compute stream can be matched with the collective it waits for, with the stage it
//! waits for, and with the memory it holds meanwhile.
//!
//! What is drawn:
//! - **Occupancy, not the longest task**: each pixel column of a row is a stacked bar whose
//!   height is the share of the column's time each task kind ran on the row's streams
//!   (legend order, bottom to top), the rest of the column idle ([`column_fills`]). A column
//!   where a stream is busy 8% of the time is 8% filled, so a kind's drawn area tracks its
//!   share of the time: interleaved short tasks (a checkpointed backward: recompute and
//!   backward, layer by layer) read as two bands of known height. Heights are rounded with
//!   the rounding error carried to the next column, and a kind that ran at all in a column
//!   gets at least 1 pixel, so a task narrower than a pixel (a pipeline send) stays visible.
//! - The compute row's background is grey: idle compute (the pipeline bubble, waiting on a
//!   dependency) shows as grey; other streams' rows have a lighter background. A stream that
//!   ran no task has no row; the legend lists only the kinds that ran.
//! - **Exposed communication** (the red band under a compute row): inside a step (a period
//!   `steps[].start_s .. start_s + time_s` of that class's report; for a run without step
//!   timings, an OOM, the whole run), the time the class's compute stream (stream 0) runs
//!   nothing while any of its communication streams runs a task. This is the rule behind
//!   report.json's `exposed_comm_s`, drawn where it happens with a density equal to its share
//!   of each column ([`exposed_columns`]): a column is marked when the exposed time carried
//!   over the columns so far reaches half a column, so the band's drawn length is the exposed
//!   time to within half a column, and a column exposed 10% of its time is not drawn as a
//!   fully exposed one. Under offload, the time compute waits on host work alone (the CPU
//!   optimizer step, PCIe copies, NVMe: `exposed_host_s`) is a black band in the same strip,
//!   by the same rule, so a CPU-bound step does not read as a network one.
//! - **Step boundaries**: a vertical line at each step's start (the job report's
//!   `steps[].start_s`, or for a run without step timings (an OOM) the first start of each
//!   step's tasks), labelled "step 1", "step 2", ... The group headers are placed clear of
//!   the lines: the class name left of the first line after the start, the last step's
//!   timings right of the last line when they do not fit beside the name; only a header that
//!   fits neither way interrupts the lines.
//! - Inference: a dashed line where the first decode pass starts (the tasks' phase labels,
//!   prefill then decode).
//! - A run that ran out of memory says so in its group header (when, in which step and
//!   phase); one that ran out before anything took time (loading weights) gets a one-second
//!   axis and the sentence "out of memory during initialisation at t = 0: nothing ran".
//! - At most [`MAX_GROUPS`] classes are drawn (the first, the last, the headline and evenly
//!   spaced ones between); a note under the axis names the ones left out, and the title then
//!   says how many are drawn. Each group has a row per stream that ran a task while they fit
//!   (full, then medium row heights); beyond that each group is compact: its compute row and
//!   one row for all its other streams. The image height is therefore bounded whatever the
//!   job, and otherwise follows the rows and the (two-column) legend.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::intervals::{intersect, merged, minus};
use super::png::{ensure_font, fit_text, fmt_num, tick_decimals, FONT};
use super::StepTiming;
use crate::engine::Trace;
use crate::schedule::{Phase, Schedule, StreamClass, TaskKind};

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
/// Up to this many groups (and [`FULL_ROWS`] rows), every stream has its own full-height row.
pub const FULL_GROUPS: usize = 4;
const FULL_ROWS: usize = 24;
/// Row groups with a row per stream at medium height while they take at most this many
/// pixels; beyond, compact groups.
const MEDIUM_BODY: u32 = 820;
/// Bounds the image whatever the job: title, steps, [`MAX_GROUPS`] compact groups or the
/// full rows, axis, note.
pub const MAX_HEIGHT: u32 = 1100;
/// The plot's width in pixel columns: the image less the legend column, memory.png's
/// margins and both tick-label areas.
pub const PLOT_COLS: usize = (WIDTH - LEGEND_WIDTH - MARGIN_LEFT - MARGIN_RIGHT - 2 * Y_LABEL_AREA) as usize;

const IDLE: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);
/// Background of the rows of streams other than compute: lighter than idle compute.
const TRACK: RGBColor = RGBColor(0xF3, 0xF3, 0xF3);
const EXPOSED: RGBColor = RGBColor(0xD0, 0x00, 0x00);
/// Exposed host work: black, apart from the red of exposed communication under every
/// colour-vision deficiency, and from every task colour.
const EXPOSED_HOST: RGBColor = RGBColor(0x00, 0x00, 0x00);
const STEP_LINE: RGBColor = RGBColor(0x20, 0x20, 0x20);
const TEXT: RGBColor = RGBColor(0x20, 0x20, 0x20);

/// The number of legend entries (task kinds as drawn).
pub const KINDS: usize = 10;

/// The legend's entries, in order (also the stacking order, bottom to top): colour and
/// name. A task's entry is [`entry`].
const ENTRIES: [(RGBColor, &str); KINDS] = [
    (RGBColor(0x00, 0x72, 0xB2), "forward"),
    (RGBColor(0xD5, 0x5E, 0x00), "backward"),
    (RGBColor(0x6A, 0x1B, 0x9A), "recompute"),
    (RGBColor(0x00, 0x9E, 0x73), "all-gather"),
    (RGBColor(0xE6, 0x9F, 0x00), "reduce-scatter"),
    (RGBColor(0x56, 0xB4, 0xE9), "all-reduce"),
    (RGBColor(0xCC, 0x79, 0xA7), "all-to-all (MoE)"),
    (RGBColor(0xC8, 0xB4, 0x00), "p2p / host copy"),
    (RGBColor(0x44, 0x44, 0x44), "optimizer.step()"),
    (RGBColor(0x99, 0x99, 0x99), "init / zero_grad"),
];

/// The legend entry a task kind is drawn as.
pub fn entry(kind: TaskKind) -> usize {
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

/// A legend entry's name.
pub fn entry_name(k: usize) -> &'static str {
    ENTRIES[k].1
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
    /// Each group is its compute row and one row for its other streams.
    pub compact: bool,
    /// Row heights: 0 full, 1 medium, 2 compact.
    pub geometry: usize,
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

const GEOMETRIES: [Geometry; 3] = [
    Geometry { header: 17, compute: 24, exposed: 5, comm: 18, gap: 8 },
    Geometry { header: 16, compute: 20, exposed: 5, comm: 13, gap: 6 },
    Geometry { header: 15, compute: 16, exposed: 4, comm: 10, gap: 5 },
];
const COMPACT: usize = 2;

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
    super::png::greedy_wrap(text, |s| text_width(s, size) <= max_px)
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

/// Which classes are drawn, how, and the image size, from the classes' names and the
/// number of rows each would have (its streams that ran a task, compute included), with
/// room for the tallest legend.
pub fn layout(names: &[String], streams: &[usize], headline: usize) -> Layout {
    layout_with(names, streams, headline, legend_height(&Legend::tallest()))
}

fn layout_with(names: &[String], streams: &[usize], headline: usize, legend_h: u32) -> Layout {
    let drawn = pick(names.len(), headline);
    let left_out: Vec<usize> = (0..names.len()).filter(|k| !drawn.contains(k)).collect();
    let rows_of = |k: usize| streams.get(k).copied().unwrap_or(1).max(1);
    let rows: usize = drawn.iter().map(|&k| rows_of(k)).sum();
    let body_of = |geo: usize| drawn.iter().map(|&k| group_height(geo, rows_of(k))).sum::<u32>();
    let geometry = if drawn.len() <= FULL_GROUPS && rows <= FULL_ROWS {
        0
    } else if body_of(1) <= MEDIUM_BODY {
        1
    } else {
        COMPACT
    };
    let body = body_of(geometry);
    let note = note(names, &drawn, &left_out);
    let plot = TITLE_HEIGHT + STEP_LABEL_HEIGHT + body.max(40) + X_LABEL_AREA + 6;
    let height = plot.max(TITLE_HEIGHT + legend_h) + note.len() as u32 * NOTE_LINE + 8;
    Layout {
        drawn,
        left_out,
        compact: geometry == COMPACT,
        geometry,
        note,
        width: WIDTH,
        height: height.min(MAX_HEIGHT),
    }
}

/// The layout [`write`] draws `groups` with: each class's rows are its streams that ran a
/// task, and the legend holds what the drawn classes ran.
pub fn layout_of(groups: &[Group], headline: usize) -> Layout {
    let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    let streams: Vec<usize> = groups.iter().map(|g| 1 + active_streams(g).len()).collect();
    let drawn = pick(groups.len(), headline);
    layout_with(&names, &streams, headline, legend_height(&Legend::of(groups, &drawn)))
}

/// The streams other than compute that ran a task (one taking time), in order.
fn active_streams(g: &Group) -> Vec<u16> {
    let mut ran = vec![false; g.sched.program.streams.len()];
    for (i, t) in g.sched.program.tasks.iter().enumerate() {
        let (s, e) = (g.trace.start_ns[i], g.trace.end_ns[i]);
        if s != u64::MAX && e != u64::MAX && e > s {
            if let Some(r) = ran.get_mut(t.stream as usize) {
                *r = true;
            }
        }
    }
    (1..ran.len() as u16).filter(|&s| ran[s as usize]).collect()
}

fn group_height(geo: usize, rows: usize) -> u32 {
    let g = &GEOMETRIES[geo];
    let comm_rows = if geo == COMPACT { u32::from(rows > 1) } else { rows.saturating_sub(1) as u32 };
    g.header + g.compute + g.exposed + comm_rows * g.comm + g.gap
}

/// What the legend shows.
struct Legend {
    kinds: Vec<usize>,
    host: bool,
    decode: bool,
    /// Some task of a step (not initialisation) started: there are step lines.
    steps: bool,
    /// Some communication stream (not host work) ran a task: there can be a red band.
    comm: bool,
    /// Some row has a lone task's tinted line (known once drawn; the layout reserves its
    /// legend line).
    lone: bool,
}

impl Legend {
    fn tallest() -> Self {
        Legend { kinds: (0..KINDS).collect(), host: true, decode: true, steps: true, comm: true, lone: true }
    }

    fn of(groups: &[Group], drawn: &[usize]) -> Self {
        let mut present = [false; KINDS];
        let (mut decode, mut steps) = (false, false);
        for &k in drawn {
            let g = &groups[k];
            for (i, t) in g.sched.program.tasks.iter().enumerate() {
                let (s, e) = (g.trace.start_ns[i], g.trace.end_ns[i]);
                let l = &g.sched.labels[t.label as usize];
                steps |= l.step > 0 && s != u64::MAX;
                if s != u64::MAX && e != u64::MAX && e > s {
                    present[entry(l.kind)] = true;
                    decode |= l.phase == Phase::Decode;
                }
            }
        }
        let host = drawn.iter().any(|&g| groups[g].steps.iter().any(|st| st.host_busy_s > 0.0));
        let comm = drawn
            .iter()
            .any(|&k| active_streams(&groups[k]).iter().any(|&s| groups[k].sched.stream_class(s) == StreamClass::Comm));
        let kinds: Vec<usize> = (0..KINDS).filter(|&k| present[k]).collect();
        Legend { lone: !kinds.is_empty(), kinds, host, decode, steps, comm }
    }

    /// The marks explained under the kinds: swatch and text.
    fn marks(&self) -> Vec<(Mark, &'static str)> {
        let mut v = vec![(Mark::Idle, "idle (compute row / other rows)")];
        if !self.kinds.is_empty() {
            v.push((Mark::Fill, "fill height: share of time busy"));
        }
        if self.lone {
            v.push((Mark::Lone, "tinted line: a short task alone"));
        }
        if self.comm {
            v.push((Mark::Band(EXPOSED), "exposed communication"));
        }
        if self.host {
            v.push((Mark::Band(EXPOSED_HOST), "exposed host work (offload)"));
        }
        if self.steps {
            v.push((Mark::Line, "step start"));
        }
        if self.decode {
            v.push((Mark::Dashed, "prefill | decode"));
        }
        v
    }
}

#[derive(Clone, Copy)]
enum Mark {
    Idle,
    Fill,
    Band(RGBColor),
    Line,
    Dashed,
    Lone,
}

const LEGEND_TOP: u32 = 14;
const LEGEND_KIND_ROW: u32 = 19;
const LEGEND_MARK_ROW: u32 = 18;

fn legend_height(l: &Legend) -> u32 {
    LEGEND_TOP + (l.kinds.len() as u32).div_ceil(2) * LEGEND_KIND_ROW + 8 + l.marks().len() as u32 * LEGEND_MARK_ROW
}

/// The subject of the title: "every rank class", or how many of them are drawn.
fn classes_drawn(lay: &Layout) -> String {
    if lay.left_out.is_empty() {
        "every rank class".into()
    } else {
        format!("{} of {} rank classes", lay.drawn.len(), lay.drawn.len() + lay.left_out.len())
    }
}

/// Writes the Gantt chart of `groups` (class `headline` is the report's headline) titled
/// "stepsim: `scenario` - streams of `subject` over time" (None: of every rank class, or of
/// how many are drawn); the step lines come from `job_steps` (the job report's), else from
/// the tasks' step labels. Rendered next to `path` and renamed into place; a panic inside
/// plotters is an error.
pub fn write(
    path: &Path,
    scenario: &str,
    subject: Option<&str>,
    groups: &[Group],
    headline: usize,
    job_steps: &[StepTiming],
) -> Result<Layout, String> {
    ensure_font()?;
    let lay = layout_of(groups, headline);
    let subject = subject.map_or_else(|| classes_drawn(&lay), str::to_string);
    let title = format!("stepsim: {scenario} - streams of {subject} over time");
    super::png::render_atomically(path, "timeline.png", |tmp| render(tmp, &title, groups, &lay, job_steps))
        .map(|()| lay)
}

/// The exposed intervals of one class (see the module doc): inside each step period (the
/// whole run when there are no step timings, an OOM), the union of its tasks on streams of
/// class `which` (communication, or host work) minus the union of what covers them
/// (compute; for host work, compute and communication).
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
    let periods = if steps.is_empty() {
        vec![(0, trace.end_time_ns)]
    } else {
        merged(
            steps
                .iter()
                .map(|st| ((st.start_s * 1e9).round() as u64, ((st.start_s + st.time_s) * 1e9).round() as u64))
                .collect(),
        )
    };
    // comm ∩ periods, then minus compute; all three are sorted and disjoint.
    minus(&intersect(&comm, &periods), &compute)
}

/// Calls `f(column, overlap_ns)` for each of the `cols` columns of `ns_per_col` (from t = 0)
/// that the interval `s..e` overlaps.
fn spread(s: u64, e: u64, ns_per_col: f64, cols: usize, mut f: impl FnMut(usize, f64)) {
    if cols == 0 || e <= s || ns_per_col <= 0.0 {
        return;
    }
    let (a, b) = (s as f64 / ns_per_col, e as f64 / ns_per_col);
    if a >= cols as f64 {
        return;
    }
    let first = (a.floor().max(0.0) as usize).min(cols - 1);
    let last = ((b.ceil() as usize).saturating_sub(1)).clamp(first, cols - 1);
    for c in first..=last {
        let overlap = (b.min(c as f64 + 1.0) - a.max(c as f64)).max(0.0) * ns_per_col;
        if overlap > 0.0 {
            f(c, overlap);
        }
    }
}

/// The tasks of one class on `streams` that ran and took time: (start ns, end ns, legend
/// entry).
pub fn row_tasks(sched: &Schedule, trace: &Trace, streams: &[u16]) -> Vec<(u64, u64, usize)> {
    sched
        .program
        .tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let (s, e) = (trace.start_ns[i], trace.end_ns[i]);
            (streams.contains(&t.stream) && s != u64::MAX && e != u64::MAX && e > s)
                .then(|| (s, e, entry(sched.labels[t.label as usize].kind)))
        })
        .collect()
}

/// Per pixel column (`cols` of `ns_per_col` from t = 0) of a row `height` pixels tall: the
/// pixels each legend entry fills, stacked bottom to top in legend order. A column's fill is
/// its busy time over the column's time (over the sum of the busy times where several
/// streams drawn in one row overlap), each entry's pixels its share of that; the rounding
/// error of the column's total and of each entry is carried to the next column (within half
/// a pixel), so over a run of columns every entry's pixels add up to its time; an entry that
/// ran in a column gets at least one pixel, a fully busy column is filled to the top.
pub fn column_fills(tasks: &[(u64, u64, usize)], ns_per_col: f64, cols: usize, height: u32) -> Vec<[u32; KINDS]> {
    let mut busy = vec![[0f64; KINDS]; cols];
    for &(s, e, k) in tasks {
        spread(s, e, ns_per_col, cols, |c, ns| busy[c][k.min(KINDS - 1)] += ns);
    }
    let h = f64::from(height);
    let mut carry = [0f64; KINDS];
    let mut carry_total = 0f64;
    let clamp = |x: f64| x.clamp(-0.49, 0.49);
    busy.iter()
        .map(|b| {
            let mut px = [0u32; KINDS];
            let total: f64 = b.iter().sum();
            let present = b.iter().filter(|&&v| v > 0.0).count() as u32;
            if present == 0 {
                return px;
            }
            let scale = h / total.max(ns_per_col);
            let exact_total = (total * scale).min(h);
            let t = ((exact_total + carry_total).round().max(0.0) as u32).clamp(present.min(height), height);
            carry_total = clamp(exact_total + carry_total - f64::from(t));
            let mut want = [0f64; KINDS];
            for k in 0..KINDS {
                if b[k] > 0.0 {
                    want[k] = (b[k] * scale + carry[k]).max(0.0);
                    px[k] = (want[k].floor() as u32).max(1);
                }
            }
            // Bring the column to its total: take from the most over-drawn entry (keeping
            // one pixel each), give to the most under-drawn.
            let mut sum: u32 = px.iter().sum();
            while sum > t {
                let over = (0..KINDS).filter(|&k| px[k] > 1).max_by(|&a, &c| {
                    (f64::from(px[a]) - want[a]).total_cmp(&(f64::from(px[c]) - want[c])).then(c.cmp(&a))
                });
                let Some(k) = over else { break };
                px[k] -= 1;
                sum -= 1;
            }
            while sum < t {
                let under = (0..KINDS).filter(|&k| b[k] > 0.0).max_by(|&a, &c| {
                    (want[a] - f64::from(px[a])).total_cmp(&(want[c] - f64::from(px[c]))).then(c.cmp(&a))
                });
                let Some(k) = under else { break };
                px[k] += 1;
                sum += 1;
            }
            for k in 0..KINDS {
                if b[k] > 0.0 {
                    carry[k] = clamp(want[k] - f64::from(px[k]));
                }
            }
            px
        })
        .collect()
}

/// Columns that show a task with nothing else of their row within [`ALONE`] columns either
/// side: (column, the entry with the most pixels in it). A pipeline send in a pixel of which
/// it fills 4% is one pixel of fill; behind it goes a full-height line in a light tint of its
/// colour, so it can be found.
pub fn lone_columns(fills: &[[u32; KINDS]]) -> Vec<(usize, usize)> {
    let any = |c: usize| fills[c].iter().any(|&p| p > 0);
    (0..fills.len())
        .filter(|&c| any(c) && (c.saturating_sub(ALONE)..(c + ALONE + 1).min(fills.len())).all(|d| d == c || !any(d)))
        .map(|c| {
            let f = &fills[c];
            (c, (0..KINDS).max_by(|&a, &b| f[a].cmp(&f[b]).then(b.cmp(&a))).unwrap_or(0))
        })
        .collect()
}

/// See [`lone_columns`].
const ALONE: usize = 2;

/// `c` mixed with `onto`, `share` of `c`.
fn tint(c: RGBColor, onto: RGBColor, share: f64) -> RGBColor {
    let mix = |a: u8, b: u8| (f64::from(a) * share + f64::from(b) * (1.0 - share)).round() as u8;
    RGBColor(mix(c.0, onto.0), mix(c.1, onto.1), mix(c.2, onto.2))
}

/// The columns (`cols` of `ns_per_col` from t = 0) of an exposed band for `intervals`:
/// each column's exposed share is carried from column to column and a column that has
/// exposed time is marked when the carried sum reaches half a column (which is then taken
/// off it), so the marked columns' total is the intervals' total to within half a column
/// and their density follows the exposed share.
pub fn exposed_columns(intervals: &[(u64, u64)], ns_per_col: f64, cols: usize) -> Vec<bool> {
    let mut share = vec![0f64; cols];
    for &(s, e) in intervals {
        spread(s, e, ns_per_col, cols, |c, ns| share[c] += ns / ns_per_col);
    }
    let mut acc = 0.0;
    share
        .iter()
        .map(|&v| {
            if v <= 0.0 {
                return false;
            }
            acc += v.min(1.0);
            let mark = acc >= 0.5;
            if mark {
                acc -= 1.0;
            }
            mark
        })
        .collect()
}

/// The end of the time axis, seconds: when the last drawn class's run ended, or one second
/// for a run that ended at t = 0.
pub fn axis_end_s(groups: &[Group], drawn: &[usize]) -> f64 {
    match drawn.iter().map(|&k| groups[k].trace.end_time_ns).max().unwrap_or(0) {
        0 => 1.0,
        ns => ns as f64 / 1e9,
    }
}

/// What the plot says for a run that ended at t = 0 (out of memory while loading weights,
/// which takes no simulated time): "out of memory during initialisation at t = 0
/// (`load layers.32`): nothing ran". None for a run that took time.
pub fn nothing_ran(groups: &[Group], drawn: &[usize]) -> Option<String> {
    if drawn.iter().any(|&k| groups[k].trace.end_time_ns > 0) {
        return None;
    }
    let oom = drawn.iter().find_map(|&k| oom_text(&groups[k]));
    Some(oom.map_or_else(|| "the run ended at t = 0: nothing ran".to_string(), |o| format!("{o}: nothing ran")))
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

/// When a class's first decode pass starts (inference), ns.
fn decode_start(g: &Group) -> Option<u64> {
    g.sched
        .program
        .tasks
        .iter()
        .enumerate()
        .filter(|(i, t)| g.sched.labels[t.label as usize].phase == Phase::Decode && g.trace.start_ns[*i] != u64::MAX)
        .map(|(i, _)| g.trace.start_ns[i])
        .min()
}

fn font(size: f64) -> TextStyle<'static> {
    (FONT, size).into_font().color(&TEXT)
}

/// A time in seconds for a header: "0" for zero, else with enough decimals to be nonzero
/// (explain.png's rule, [`super::write::secs`]).
fn secs(ns: u64) -> String {
    if ns == 0 {
        "0".into()
    } else {
        format!("{} s", super::write::secs(ns as f64 / 1e9))
    }
}

/// What a class's out-of-memory error interrupted, in words: "out of memory during
/// initialisation at t = 0 (`load layers.32`)", "out of memory in step 1, backward, at
/// t = 0.742 s (`layers.3.mlp`)".
fn oom_text(g: &Group) -> Option<String> {
    let ev = g.trace.oom.as_ref()?;
    let label = g.sched.program.tasks.get(ev.task as usize).and_then(|t| g.sched.labels.get(t.label as usize));
    let at = format!("t = {}", secs(ev.time_ns));
    let mut s = match label {
        Some(l) if l.step == 0 => format!("out of memory during initialisation at {at}"),
        Some(l) => format!("out of memory in step {}, {}, at {at}", l.step, l.phase.name()),
        None => format!("out of memory at {at}"),
    };
    if let Some(l) = label.filter(|l| !l.what.is_empty()) {
        s.push_str(&format!(" (`{}`)", l.what));
    }
    Some(s)
}

/// A class's header: its name, and the last step's timings (or what stopped the run), in
/// wordings from the longest to the shortest.
fn header_parts(g: &Group) -> (String, Option<Vec<String>>) {
    let st = match g.steps.last() {
        Some(st) => st,
        None => return (g.name.clone(), oom_text(g).map(|o| vec![o])),
    };
    let (time, idle, comm) = (fmt_num(st.time_s, 3), fmt_num(st.compute_idle_s, 3), fmt_num(st.exposed_comm_s, 3));
    let host = fmt_num(st.exposed_host_s, 3);
    let long = if st.host_busy_s > 0.0 {
        format!(
            "step {}: {time} s; compute idle {idle} s, of which exposed communication {comm} s, host work {host} s",
            st.step
        )
    } else {
        format!("step {}: {time} s; compute idle {idle} s, of which exposed communication {comm} s", st.step)
    };
    let (short, shortest) = if st.host_busy_s > 0.0 {
        (
            format!("step {}: {time} s, compute idle {idle} s (exposed: comm. {comm} s, host {host} s)", st.step),
            format!("step {}: {time} s, idle {idle} s (exposed: comm. {comm} s, host {host} s)", st.step),
        )
    } else {
        (
            format!("step {}: {time} s, compute idle {idle} s (exposed comm. {comm} s)", st.step),
            format!("step {}: {time} s, idle {idle} s (exposed comm. {comm} s)", st.step),
        )
    };
    (g.name.clone(), Some(vec![long, short, shortest]))
}

/// A row label that fits the label area: the stream's name, a known abbreviation, or a
/// smaller font.
fn row_label(name: &str, size: f64) -> (String, f64) {
    let max = Y_LABEL_AREA - 8;
    if text_width(name, size) <= max {
        return (name.to_string(), size);
    }
    let short = match name {
        "all-gather copy-in" => "AG copy-in".to_string(),
        _ => name.replace("all-gather", "AG").replace("reduce-scatter", "RS").replace("all-reduce", "AR"),
    };
    let mut s = size;
    while text_width(&short, s) > max && s > 8.0 {
        s -= 1.0;
    }
    (short, s)
}

/// A header piece: text and left x.
struct Piece {
    text: String,
    x: i32,
}

/// Where a group's header goes: clear of the step lines at `lines` (pixels, sorted) if it
/// can (see the module doc), else across them.
fn place_header(name: &str, stats: Option<&[String]>, lines: &[i32], px0: i32, px1: i32) -> (Vec<Piece>, bool) {
    let size = 13.0;
    let w = |s: &str| text_width(s, size);
    let x0 = px0 + 3;
    let interior: Vec<i32> = lines.iter().copied().filter(|&x| x > px0 + 6 && x < px1 - 6).collect();
    let first = interior.first().copied().unwrap_or(px1) - 6;
    let Some(stats) = stats else {
        return (vec![Piece { text: name.into(), x: x0 }], x0 + w(name) as i32 <= first);
    };
    // Each wording, longest first: beside the name, else right of the last step line.
    let last_line = interior.last().copied();
    for s in stats {
        let full = format!("{name} - {s}");
        if x0 + w(&full) as i32 <= first {
            return (vec![Piece { text: full, x: x0 }], true);
        }
        if let Some(last) = last_line {
            if x0 + w(name) as i32 <= first && last + 5 + w(s) as i32 <= px1 - 2 {
                return (vec![Piece { text: name.into(), x: x0 }, Piece { text: s.clone(), x: last + 5 }], true);
            }
        }
    }
    let last = stats.last().map_or("", String::as_str);
    (vec![Piece { text: format!("{name} - {last}"), x: x0 }], false)
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

    let message = nothing_ran(groups, &lay.drawn);
    let nothing_ran = message.is_some();
    let x1 = axis_end_s(groups, &lay.drawn);
    let geo = &GEOMETRIES[lay.geometry];
    let rows: Vec<Vec<u16>> = lay.drawn.iter().map(|&k| active_streams(&groups[k])).collect();
    let rows_px: u32 = rows.iter().map(|r| group_height(lay.geometry, 1 + r.len())).sum::<u32>();
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
    debug_assert_eq!(cols, PLOT_COLS, "the plot's width in columns");
    let ns_per_col = x1 * 1e9 / cols as f64;
    let x_of = |s: f64| (px0 + ((s / x1) * cols as f64).round() as i32).min(px1 - 1);
    // Pixel rectangles on the root area, columns x0..x1 and rows y0..y1 (ends excluded): the
    // bitmap backend fills an opaque rectangle's corners as a half-open range, so a
    // one-pixel task is (x, x + 1); (x, x) would draw nothing.
    let rect = |x0: i32, x1: i32, y0: i32, y1: i32, c: RGBColor| Rectangle::new([(x0, y0), (x1, y1)], c.filled());
    let left = |s: &str, y: i32, size: f64| -> Result<(), String> {
        let (t, size) = row_label(s, size);
        let style = font(size).pos(Pos::new(HPos::Right, VPos::Center));
        root.draw_text(&t, &style, (px0 - 5, y)).map_err(|err| format!("drawing row labels: {err}"))
    };
    // A row's stacked columns from `y0` to its bottom `y1` on `bg`: equal neighbouring
    // columns are one rectangle, a lone task has a tinted line behind it (true: some has).
    let draw_fills = |fills: &[[u32; KINDS]], y0: i32, y1: i32, bg: RGBColor| -> Result<bool, String> {
        let lone = lone_columns(fills);
        for &(c, k) in &lone {
            root.draw(&rect(px0 + c as i32, px0 + c as i32 + 1, y0, y1, tint(ENTRIES[k].0, bg, 0.4)))
                .map_err(|err| format!("drawing tasks: {err}"))?;
        }
        let spans = |f: &[u32; KINDS]| {
            let mut v = Vec::new();
            let mut top = y1;
            for (k, &p) in f.iter().enumerate() {
                if p > 0 {
                    v.push((k, top - p as i32, top));
                    top -= p as i32;
                }
            }
            v
        };
        let mut c = 0;
        while c < fills.len() {
            let mut d = c + 1;
            while d < fills.len() && fills[d] == fills[c] {
                d += 1;
            }
            for (k, a, b) in spans(&fills[c]) {
                root.draw(&rect(px0 + c as i32, px0 + d as i32, a, b, ENTRIES[k].0))
                    .map_err(|err| format!("drawing tasks: {err}"))?;
            }
            c = d;
        }
        Ok(!lone.is_empty())
    };
    let mut lone = false;
    let steps = step_starts(groups, &lay.drawn, job_steps);
    let mut lines: Vec<i32> =
        steps.iter().filter(|(_, s)| s.is_finite() && *s >= 0.0 && *s <= x1).map(|&(_, s)| x_of(s)).collect();
    lines.sort_unstable();
    let mut y = py0;
    // Headers that cross a step line: (top, bottom, text pieces), drawn on white last.
    let mut headers: Vec<(i32, Vec<Piece>, bool)> = Vec::new();
    let mut decode: Vec<(i32, i32, i32)> = Vec::new();
    for (&k, streams) in lay.drawn.iter().zip(&rows) {
        let g = &groups[k];
        let (name, stats) = if nothing_ran { (g.name.clone(), None) } else { header_parts(g) };
        let (pieces, clear) = place_header(&name, stats.as_deref(), &lines, px0, px1);
        headers.push((y, pieces, clear));
        let top = y;
        y += geo.header as i32;
        // Compute row: grey idle background (up to the end of the run), the tasks' fills,
        // then the exposed bands under it.
        let h = geo.compute as i32;
        let run_end = if nothing_ran { px0 } else { x_of(g.trace.end_time_ns as f64 / 1e9) + 1 };
        root.draw(&rect(px0, run_end.max(px0), y, y + h, IDLE)).map_err(e("idle"))?;
        let fills = column_fills(&row_tasks(g.sched, g.trace, &[0]), ns_per_col, cols, geo.compute);
        lone |= draw_fills(&fills, y, y + h, IDLE)?;
        left(&g.sched.program.streams.first().cloned().unwrap_or_else(|| "compute".into()), y + h / 2, 14.0)?;
        y += h;
        for (which, color) in [(StreamClass::Comm, EXPOSED), (StreamClass::Host, EXPOSED_HOST)] {
            let marked = exposed_columns(&exposed_intervals(g.sched, g.trace, g.steps, which), ns_per_col, cols);
            let mut c = 0;
            while c < cols {
                if !marked[c] {
                    c += 1;
                    continue;
                }
                let mut d = c + 1;
                while d < cols && marked[d] {
                    d += 1;
                }
                root.draw(&rect(px0 + c as i32, px0 + d as i32, y, y + geo.exposed as i32 - 1, color))
                    .map_err(e("exposed communication"))?;
                c = d;
            }
        }
        y += geo.exposed as i32;
        // The other streams that ran: a row each, or one row for all of them.
        let comm_rows: Vec<Vec<u16>> = if lay.compact {
            if streams.is_empty() {
                vec![]
            } else {
                vec![streams.clone()]
            }
        } else {
            streams.iter().map(|&s| vec![s]).collect()
        };
        for row in comm_rows {
            let h = geo.comm as i32;
            let pad = if lay.compact { 0 } else { 2 };
            root.draw(&rect(px0, px1, y + pad, y + h - pad, TRACK)).map_err(e("rows"))?;
            let fills = column_fills(&row_tasks(g.sched, g.trace, &row), ns_per_col, cols, (h - 2 * pad) as u32);
            lone |= draw_fills(&fills, y + pad, y + h - pad, TRACK)?;
            if !lay.compact {
                left(&g.sched.program.streams[row[0] as usize], y + h / 2, 12.0)?;
            } else {
                left("comm", y + h / 2, 10.0)?;
            }
            y += h;
        }
        if let Some(d) = decode_start(g) {
            decode.push((x_of(d as f64 / 1e9), top + geo.header as i32, y));
        }
        y += geo.gap as i32;
        // A thin separator between groups.
        root.draw(&rect(px0, px1, y - (geo.gap as i32) / 2, y - (geo.gap as i32) / 2 + 1, RGBColor(0xBB, 0xBB, 0xBB)))
            .map_err(e("separator"))?;
    }
    let y_end = y.max(py0 + 40);
    // Prefill | decode: a dashed line through each group's rows.
    for &(x, a, b) in &decode {
        let mut t = a;
        while t < b {
            root.draw(&rect(x, x + 1, t, (t + 4).min(b), STEP_LINE)).map_err(e("phase line"))?;
            t += 7;
        }
    }
    // Step boundaries over everything, labelled above the plot.
    let label_style = font(14.0).pos(Pos::new(HPos::Left, VPos::Bottom));
    // Inference: "prefill" after the step's label, "decode" at the first decode pass, or
    // both in the step's label where the two would collide.
    let decode_x = decode.iter().map(|d| d.0).min();
    for (step, s) in &steps {
        if !(s.is_finite() && *s >= 0.0 && *s <= x1) {
            continue;
        }
        let x = x_of(*s);
        root.draw(&rect(x, x + 1, py0 - 4, y_end, STEP_LINE)).map_err(e("step line"))?;
        let mut text = format!("step {step}");
        if let Some(dx) = decode_x.filter(|&dx| dx > x) {
            text.push_str(": prefill");
            if x + 3 + text_width(&text, 14.0) as i32 + 8 <= dx + 4 {
                root.draw_text("decode", &label_style, (dx + 4, py0 - 3)).map_err(e("phase label"))?;
            } else {
                text.push_str(", then decode (dashed line)");
            }
        }
        root.draw_text(&text, &label_style, (x + 3, py0 - 3)).map_err(e("step label"))?;
    }
    // Group headers, on white where they cross a line.
    let hstyle = font(13.0).pos(Pos::new(HPos::Left, VPos::Top));
    for (top, pieces, clear) in &headers {
        for p in pieces {
            let text = if *clear {
                p.text.clone()
            } else {
                fit_text(&root, &p.text, &hstyle, (px1 - p.x - 2) as u32).unwrap_or_default()
            };
            if !clear {
                let w = text_width(&text, 13.0) as i32;
                root.draw(&rect(p.x - 2, (p.x + w + 3).min(px1), top + 1, top + geo.header as i32 - 1, WHITE))
                    .map_err(e("group header"))?;
            }
            root.draw_text(&text, &hstyle, (p.x, top + 1)).map_err(e("group header"))?;
        }
    }
    if let Some(msg) = message {
        let style = font(16.0).pos(Pos::new(HPos::Left, VPos::Center));
        let lines = wrap(&msg, 16.0, (px1 - px0 - 40) as u32);
        let y0 = py0 + geo.header as i32 + geo.compute as i32 / 2;
        for (i, line) in lines.iter().enumerate() {
            let (x, y) = (px0 + 12, y0 + 20 * i as i32);
            root.draw(&rect(x - 4, x + text_width(line, 16.0) as i32 + 4, y - 10, y + 10, WHITE))
                .map_err(e("message"))?;
            root.draw_text(line, &style, (x, y)).map_err(e("message"))?;
        }
    }
    draw_legend(&legend_area, &Legend { lone, ..Legend::of(groups, &lay.drawn) })?;
    // The note: which classes are drawn and which are left out.
    for (i, line) in lay.note.iter().enumerate() {
        note_area
            .draw(&Text::new(line.as_str(), (MARGIN_LEFT as i32, 2 + (NOTE_LINE * i as u32) as i32), font(13.0)))
            .map_err(e("note"))?;
    }
    root.present().map_err(|err| format!("writing {}: {err}", path.display()))
}

/// The legend: the task kinds that ran, in two columns, then what the marks mean.
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, l: &Legend) -> Result<(), String> {
    let e = |err: DrawingAreaErrorKind<DB::ErrorType>| format!("drawing the legend: {err}");
    let sw = |x0: i32, y0: i32, x1: i32, y1: i32, c: RGBColor| Rectangle::new([(x0, y0), (x1, y1)], c.filled());
    let top = LEGEND_TOP as i32;
    for (i, &k) in l.kinds.iter().enumerate() {
        let (col, row) = ((i % 2) as i32, (i / 2) as i32);
        let (x, y) = (12 + 150 * col, top + row * LEGEND_KIND_ROW as i32);
        area.draw(&sw(x, y, x + 20, y + 13, ENTRIES[k].0)).map_err(e)?;
        area.draw(&Text::new(ENTRIES[k].1, (x + 26, y), font(14.0))).map_err(e)?;
    }
    let mut y = top + (l.kinds.len() as i32 + 1) / 2 * LEGEND_KIND_ROW as i32 + 8;
    for (mark, text) in l.marks() {
        let x = 12;
        match mark {
            Mark::Idle => {
                area.draw(&sw(x, y, x + 9, y + 13, IDLE)).map_err(e)?;
                area.draw(&sw(x + 11, y, x + 20, y + 13, TRACK)).map_err(e)?;
            }
            Mark::Fill => {
                area.draw(&sw(x, y, x + 20, y + 13, IDLE)).map_err(e)?;
                for (i, h) in [4, 9, 13, 6, 11].iter().enumerate() {
                    let xi = x + 4 * i as i32;
                    area.draw(&sw(xi, y + 13 - h, xi + 3, y + 13, ENTRIES[0].0)).map_err(e)?;
                }
            }
            Mark::Band(c) => area.draw(&sw(x, y + 5, x + 20, y + 8, c)).map_err(e)?,
            Mark::Line => area.draw(&sw(x + 9, y, x + 10, y + 13, STEP_LINE)).map_err(e)?,
            Mark::Lone => {
                area.draw(&sw(x, y, x + 20, y + 13, TRACK)).map_err(e)?;
                area.draw(&sw(x + 9, y, x + 10, y + 13, tint(ENTRIES[7].0, TRACK, 0.4))).map_err(e)?;
                area.draw(&sw(x + 9, y + 12, x + 10, y + 13, ENTRIES[7].0)).map_err(e)?;
            }
            Mark::Dashed => {
                for t in [0, 5, 10] {
                    area.draw(&sw(x + 9, y + t, x + 10, y + t + 2, STEP_LINE)).map_err(e)?;
                }
            }
        }
        area.draw(&Text::new(text, (x + 26, y), font(14.0))).map_err(e)?;
        y += LEGEND_MARK_ROW as i32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_is_filled_by_its_busy_share() {
        // 10 columns of 100 ns, 20 px tall: a stream busy 8% of every column is 1-2 px per
        // column (1.6 on average), not a full bar.
        let tasks: Vec<_> = (0..10).map(|c| (c * 100 + 10, c * 100 + 18, 5)).collect();
        let f = column_fills(&tasks, 100.0, 10, 20);
        assert!(f.iter().all(|c| (1..=2).contains(&c[5])), "{f:?}");
        assert_eq!(f.iter().map(|c| c[5]).sum::<u32>(), 16, "the carried rounding adds up to 8% of 200 px");
        // A fully busy column is full; a 1 ns task still gets a pixel.
        let f = column_fills(&[(0, 100, 0), (150, 151, 7)], 100.0, 2, 24);
        assert_eq!((f[0][0], f[1][7], f[1].iter().sum::<u32>()), (24, 1, 1));
    }

    #[test]
    fn interleaved_kinds_stack_by_their_shares() {
        // Backward 70 ns, recompute 30 ns, alternating inside every column: two bands.
        let mut tasks = Vec::new();
        for c in 0..50u64 {
            tasks.push((c * 100, c * 100 + 70, 1));
            tasks.push((c * 100 + 70, c * 100 + 100, 2));
        }
        let f = column_fills(&tasks, 100.0, 50, 20);
        assert!(f.iter().all(|c| c[1] + c[2] == 20 && (6..=7).contains(&c[2])), "{f:?}");
        assert_eq!(f.iter().map(|c| c[2]).sum::<u32>(), 300);
    }

    #[test]
    fn the_exposed_band_has_the_density_of_its_share() {
        // Exposed 10% of each of 100 columns: 10 marked columns, not 100.
        let iv: Vec<_> = (0..100u64).map(|c| (c * 1000, c * 1000 + 100)).collect();
        let m = exposed_columns(&iv, 1000.0, 100);
        assert_eq!(m.iter().filter(|&&b| b).count(), 10);
        // A fully exposed stretch is solid.
        let m = exposed_columns(&[(2000, 7000)], 1000.0, 10);
        assert_eq!(m, [false, false, true, true, true, true, true, false, false, false]);
    }

    #[test]
    fn headers_stay_clear_of_the_step_lines() {
        ensure_font().unwrap();
        let stats = [
            "step 2: 2.399 s; compute idle 0.595 s, of which exposed communication 0.111 s".to_string(),
            "step 2: 2.399 s, compute idle 0.595 s (exposed comm. 0.111 s)".to_string(),
        ];
        let (p, clear) = place_header("stage 0 (ranks 0-3)", Some(&stats[..]), &[92, 547], 92, 1002);
        assert!(clear && p.len() == 2, "name left of the step-2 line, timings right of it");
        let end = |p: &Piece| p.x + text_width(&p.text, 13.0) as i32;
        assert!(end(&p[0]) <= 547 && p[1].x > 547 && end(&p[1]) <= 1002);
    }

    #[test]
    fn long_stream_names_are_abbreviated_not_cut() {
        ensure_font().unwrap();
        let (t, size) = row_label("all-gather copy-in", 12.0);
        assert_eq!(t, "AG copy-in");
        assert!(text_width(&t, size) <= Y_LABEL_AREA - 8);
        assert_eq!(row_label("nccl", 12.0).0, "nccl");
    }
}
