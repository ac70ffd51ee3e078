//! PNG rendering of simulated memory timelines.
//!
//! The picture is meant to answer "what filled the GPU, and when" at a glance,
//! so every panel uses the same colour for the same category, shows the
//! capacity it is measured against, and marks the OOM instant explicitly.
//! Rendering must never take the simulator down: bad or degenerate input
//! becomes an `Err(String)`, never a panic.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::chart::DualCoordChartContext;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

use crate::memory::Category;

/// One phase band to shade (forward, backward, optimizer, init...).
#[derive(Debug, Clone)]
pub struct PhaseSpan {
    pub label: String,
    pub start_s: f64,
    pub end_s: f64,
}

/// The OOM instant to mark.
#[derive(Debug, Clone)]
pub struct OomMark {
    pub time_s: f64,
    pub label: String,
    /// The allocation that failed, drawn as a bar on top of what was allocated (0: unknown).
    pub requested_bytes: u64,
}

/// Memory over time of one distinct rank class, as a step function: value i holds from times_s[i] until times_s[i+1].
#[derive(Debug, Clone)]
pub struct RankPanel {
    /// e.g. "rank class 0: ranks 0-31 (identical programs)"
    pub label: String,
    /// Usable capacity line.
    pub capacity_bytes: u64,
    /// Stacking order bottom -> top.
    pub categories: Vec<String>,
    /// Ascending (may repeat a time).
    pub times_s: Vec<f64>,
    /// `bytes[category][i]`, same length as `times_s`.
    pub bytes: Vec<Vec<u64>>,
    /// Allocator reserved bytes, drawn as a line above the stack when Some.
    pub reserved: Option<Vec<u64>>,
    pub phases: Vec<PhaseSpan>,
    pub oom: Option<OomMark>,
    /// What the rank keeps in host memory instead (offload), in words: constant for the run,
    /// so it is stated in the legend rather than drawn as a band on the GPU's axis.
    pub host_note: Option<String>,
    /// The op running at the peak of live tensors, named beside the peak's mark.
    pub peak_op: Option<String>,
}

/// A whole figure: one vertically stacked panel per distinct rank class.
#[derive(Debug, Clone)]
pub struct MemoryPlot {
    pub title: String,
    pub panels: Vec<RankPanel>,
}

/// The font ships inside the binary so text renders identically on machines
/// without fontconfig/freetype (CI containers, cluster login nodes).
const FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
/// The family name the bundled font is registered under (see [`ensure_font`]).
pub(crate) const FONT: &str = "sans-serif";

const WIDTH: u32 = 1400;
const PANEL_HEIGHT: u32 = 520;
const TITLE_HEIGHT: u32 = 56;
/// Kept outside the plot so a long category list never hides data.
const LEGEND_WIDTH: u32 = 310;
/// A bound on the image size: each panel costs ~2 MB of RGB buffer, and a
/// figure taller than this is unreadable anyway.
const MAX_PANELS: usize = 64;
/// Enough to keep first/min/max/last of every pixel column, which is all a
/// rasterised step function can show.
const SAMPLES_PER_COLUMN: usize = 4;
const HEADROOM: f64 = 1.08;
/// Below this fraction of capacity the y axis follows the data, with room above it for
/// the phase labels and the capacity note.
const ZOOM_BELOW: f64 = 0.5;
const ZOOMED_HEADROOM: f64 = 1.35;
const X_TICKS: usize = 14;
const Y_TICKS: usize = 10;
const GB: f64 = 1e9;
const GIB: f64 = 1_073_741_824.0;

const TITLE_SIZE: f64 = 28.0;
const CAPTION_SIZE: f64 = 21.0;
const AXIS_DESC_SIZE: f64 = 18.0;
const LABEL_SIZE: f64 = 16.0;

/// Each memory category's own colour, the same in every picture, from Okabe-Ito's and Paul
/// Tol's colour-blind-safe schemes. Categories that sit next to each other in the stack or
/// live at the same time differ in lightness as well as hue, so they stay apart for
/// colour-blind readers too: parameters blue with their gathered copies a light sky blue;
/// gradients dark green, unsharded gradients a light mint; optimizer state a light yellow,
/// its temporaries a dark red; saved activations reddish purple between recomputed ones
/// (dark wine) and transient ones (pale pink); activation gradients vermillion; FSDP2's
/// all-gather output dark blue, its reduce-scatter input light pear; greys for inputs,
/// module buffers and workspaces.
const CATEGORY_COLORS: [(Category, RGBColor); 19] = [
    (Category::Parameters, RGBColor(0x00, 0x72, 0xB2)),
    (Category::GatheredParameters, RGBColor(0x56, 0xB4, 0xE9)),
    (Category::PostForwardShards, RGBColor(0x88, 0xCC, 0xEE)),
    (Category::MasterWeights, RGBColor(0x33, 0x22, 0x88)),
    (Category::Gradients, RGBColor(0x11, 0x77, 0x33)),
    (Category::UnshardedGradients, RGBColor(0x44, 0xBB, 0x99)),
    (Category::OptimizerState, RGBColor(0xEE, 0xCC, 0x66)),
    (Category::OptimizerTemp, RGBColor(0x99, 0x44, 0x55)),
    (Category::Activations, RGBColor(0xCC, 0x79, 0xA7)),
    (Category::Recomputed, RGBColor(0x88, 0x22, 0x55)),
    (Category::Transient, RGBColor(0xFF, 0xCC, 0xCC)),
    (Category::ActivationGradients, RGBColor(0xD5, 0x5E, 0x00)),
    (Category::Inputs, RGBColor(0x77, 0x77, 0x77)),
    (Category::KvCache, RGBColor(0x66, 0x33, 0x33)),
    (Category::CommBuffers, RGBColor(0x99, 0x99, 0x33)),
    (Category::AllGatherBuffers, RGBColor(0x22, 0x22, 0x55)),
    (Category::ReduceScatterBuffers, RGBColor(0xBB, 0xCC, 0x33)),
    (Category::Buffers, RGBColor(0x44, 0x44, 0x44)),
    (Category::BlasWorkspaces, RGBColor(0xCC, 0xCC, 0xCC)),
];

/// Colours for series that are not memory categories (a caller's own names), in order:
/// Okabe-Ito, then Paul Tol's muted and light schemes.
const PALETTE: [RGBColor; 20] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0xF0, 0xE4, 0x42),
    RGBColor(0x33, 0x22, 0x88),
    RGBColor(0x11, 0x77, 0x33),
    RGBColor(0x88, 0x22, 0x55),
    RGBColor(0xDD, 0xCC, 0x77),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0x44, 0xAA, 0x99),
    RGBColor(0xAA, 0x44, 0x99),
    RGBColor(0x99, 0x99, 0x33),
    RGBColor(0x77, 0xAA, 0xDD),
    RGBColor(0xEE, 0x88, 0x66),
    RGBColor(0xFF, 0xAA, 0xBB),
    RGBColor(0xBB, 0xCC, 0x33),
    RGBColor(0x99, 0x99, 0x99),
    RGBColor(0x55, 0x55, 0x55),
];
const CAPACITY_COLOR: RGBColor = RGBColor(0xD0, 0x00, 0x00);
const OOM_COLOR: RGBColor = RGBColor(0x9B, 0x00, 0x20);
const RESERVED_COLOR: RGBColor = RGBColor(0x00, 0x00, 0x00);
const TEXT_COLOR: RGBColor = RGBColor(0x20, 0x20, 0x20);

/// Writes a PNG; returns a human-readable error string on failure (never panics).
///
/// The image is rendered next to `path` and renamed into place, so a reader
/// polling for the file never sees a half-written PNG.
pub fn write_memory_png(path: &Path, plot: &MemoryPlot) -> Result<(), String> {
    ensure_font()?;
    if plot.panels.len() > MAX_PANELS {
        return Err(format!("memory plot has {} panels; at most {MAX_PANELS} fit in one PNG", plot.panels.len()));
    }
    let colors = category_colors(&plot.panels);
    let mut panels =
        plot.panels.iter().enumerate().map(|(i, p)| prepare_panel(i, p, &colors)).collect::<Result<Vec<_>, _>>()?;
    // One scale for every panel, so stages and ranks compare by eye.
    let y_max = panels.iter().map(|p| p.y_max_gb).fold(0.0, f64::max);
    for p in panels.iter_mut() {
        p.y_max_gb = y_max;
    }

    let tmp = tmp_path(path);
    // plotters has internal unwraps (font table lock, buffer sizing); a bug
    // there must cost us a picture, not the simulation run.
    let rendered = catch_unwind(AssertUnwindSafe(|| render(&tmp, &plot.title, &panels)))
        .unwrap_or_else(|payload| Err(format!("plot rendering panicked: {}", panic_text(&payload))));
    let result = rendered.and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|e| format!("cannot move {} to {}: {e}", tmp.display(), path.display()))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// plotters' encoder picks the format from the extension, so the temporary
/// name must still end in `.png` even though the final name need not.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".tmp.png");
    PathBuf::from(name)
}

fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Registration is global in plotters; doing it once keeps repeated report
/// writes from re-parsing the font, and remembers a failure instead of
/// retrying it.
pub(crate) fn ensure_font() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the bundled DejaVuSans.ttf could not be parsed as a font".to_string())
    }
}

/// Colours are keyed by category name across the whole figure so that
/// "gradients" is the same colour in every panel, even when a panel skips
/// some all-zero categories. While the category list fits the palette, a
/// name's colour follows its position in the list, so two runs that list the
/// same categories colour them the same however different their data. A
/// longer list colours only categories that have data, in order, to put off
/// the palette wrapping around.
fn category_colors(panels: &[RankPanel]) -> HashMap<String, RGBColor> {
    let fixed = |name: &str| CATEGORY_COLORS.iter().find(|(c, _)| c.label() == name).map(|(_, col)| *col);
    let mut out: HashMap<String, RGBColor> = HashMap::new();
    for name in panels.iter().flat_map(|p| p.categories.iter()) {
        if let Some(c) = fixed(name) {
            out.insert(name.clone(), c);
        }
    }
    let mut names: Vec<&String> = Vec::new();
    for name in panels.iter().flat_map(|p| p.categories.iter()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.len() > PALETTE.len() {
        names.clear();
        for p in panels {
            for (name, series) in p.categories.iter().zip(&p.bytes) {
                if !names.contains(&name) && series.iter().any(|&b| b > 0) {
                    names.push(name);
                }
            }
        }
    }
    names.retain(|n| !out.contains_key(*n));
    // Other names take the palette's colours that no category here has already.
    let taken: Vec<RGBColor> = out.values().copied().collect();
    let free: Vec<RGBColor> = PALETTE.iter().copied().filter(|c| !taken.contains(c)).collect();
    let free = if free.is_empty() { PALETTE.to_vec() } else { free };
    out.extend(names.into_iter().enumerate().map(|(i, name)| (name.clone(), free[i % free.len()])));
    out
}

/// One stacked category, as the cumulative (top-edge) curve in GB.
struct Layer {
    name: String,
    color: RGBColor,
    top_gb: Vec<f64>,
}

/// A panel validated and reduced to plain f64 curves, so drawing code never
/// has to think about indexing, ordering or overflow.
struct Prepared {
    label: String,
    capacity_gb: f64,
    x_range: (f64, f64),
    /// Where the last sample's value stops being drawn: the end of the known
    /// timeline, not the axis padding, so nothing is invented after an OOM.
    step_end: f64,
    y_max_gb: f64,
    times: Vec<f64>,
    layers: Vec<Layer>,
    reserved_gb: Option<Vec<f64>>,
    phases: Vec<(String, f64, f64)>,
    oom: Option<OomMark>,
    host_note: Option<String>,
    peak_op: Option<String>,
}

fn prepare_panel(index: usize, p: &RankPanel, colors: &HashMap<String, RGBColor>) -> Result<Prepared, String> {
    let n = p.times_s.len();
    let what = |s: &str| format!("memory plot panel {index} ({:?}): {s}", p.label);
    if p.bytes.len() != p.categories.len() {
        return Err(what(&format!("{} categories but {} byte series", p.categories.len(), p.bytes.len())));
    }
    for (name, series) in p.categories.iter().zip(&p.bytes) {
        if series.len() != n {
            return Err(what(&format!("category {name:?} has {} samples but there are {n} times", series.len())));
        }
    }
    if let Some(r) = &p.reserved {
        if r.len() != n {
            return Err(what(&format!("reserved has {} samples but there are {n} times", r.len())));
        }
    }

    // Non-finite times cannot be placed on an axis; out-of-order times are
    // tolerated (stable sort) rather than drawn as a scribble.
    let mut order: Vec<usize> = (0..n).filter(|&i| p.times_s[i].is_finite()).collect();
    if !order.windows(2).all(|w| p.times_s[w[0]] <= p.times_s[w[1]]) {
        order.sort_by(|&a, &b| p.times_s[a].total_cmp(&p.times_s[b]));
    }
    let times: Vec<f64> = order.iter().map(|&i| p.times_s[i]).collect();

    let mut running = vec![0u64; order.len()];
    let mut layers = Vec::new();
    for (name, series) in p.categories.iter().zip(&p.bytes) {
        if order.iter().all(|&i| series[i] == 0) {
            continue;
        }
        for (acc, &i) in running.iter_mut().zip(&order) {
            *acc = acc.saturating_add(series[i]);
        }
        layers.push(Layer {
            name: name.clone(),
            color: colors.get(name).copied().unwrap_or(PALETTE[0]),
            top_gb: running.iter().map(|&b| b as f64 / GB).collect(),
        });
    }
    let reserved_gb = p.reserved.as_ref().map(|r| order.iter().map(|&i| r[i] as f64 / GB).collect::<Vec<_>>());

    let phases: Vec<(String, f64, f64)> = p
        .phases
        .iter()
        .filter(|ph| ph.start_s.is_finite() && ph.end_s.is_finite())
        .map(|ph| {
            let (a, b) = if ph.start_s <= ph.end_s { (ph.start_s, ph.end_s) } else { (ph.end_s, ph.start_s) };
            (ph.label.clone(), a, b)
        })
        .collect();
    let oom = p.oom.clone().filter(|o| o.time_s.is_finite());

    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    let xs =
        times.iter().copied().chain(phases.iter().flat_map(|(_, a, b)| [*a, *b])).chain(oom.iter().map(|o| o.time_s));
    for x in xs {
        lo = lo.min(x);
        hi = hi.max(x);
    }
    if !lo.is_finite() || !hi.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if hi - lo <= f64::EPSILON * lo.abs().max(1.0) * 16.0 {
        // A single instant still needs a visible width to draw its value.
        let pad = (lo.abs() * 1e-3).max(0.5);
        (lo, hi) = (lo - pad, hi + pad);
    }
    let step_end = hi;
    if let Some(o) = &oom {
        // An OOM usually ends the timeline; without padding its line and
        // marker would sit on the plot border, half clipped.
        let span = hi - lo;
        if hi - o.time_s < 0.02 * span {
            hi += 0.03 * span;
        }
        if o.time_s - lo < 0.02 * span {
            lo -= 0.03 * span;
        }
    }

    let capacity_gb = p.capacity_bytes as f64 / GB;
    let max_total = layers.last().map(|l| l.top_gb.iter().copied().fold(0.0, f64::max)).unwrap_or(0.0);
    let max_reserved = reserved_gb.as_ref().map(|r| r.iter().copied().fold(0.0, f64::max)).unwrap_or(0.0);
    let data_max = max_total.max(max_reserved);
    // A job far below capacity gets an axis scaled to its data (the capacity is then named
    // above the plot) rather than a stack squeezed into the bottom of it.
    let mut y_max_gb = if capacity_gb > 0.0 && data_max > 0.0 && data_max < ZOOM_BELOW * capacity_gb {
        data_max * ZOOMED_HEADROOM
    } else {
        capacity_gb.max(data_max) * HEADROOM
    };
    if !(y_max_gb.is_finite() && y_max_gb > 0.0) {
        y_max_gb = 1.0;
    }

    Ok(Prepared {
        label: p.label.clone(),
        capacity_gb,
        x_range: (lo, hi),
        step_end,
        y_max_gb,
        times,
        layers,
        reserved_gb,
        phases,
        oom,
        host_note: p.host_note.clone(),
        peak_op: p.peak_op.clone(),
    })
}

/// Indices of the samples worth drawing when there are more samples than
/// pixels: per pixel column the first, lowest, highest and last sample, in
/// time order. Keeping the highest means a sub-pixel spike (the usual OOM
/// culprit) is never averaged away; keeping first/last keeps the step edges
/// between columns exact. `times` must be ascending.
fn decimate(times: &[f64], values: &[f64], t0: f64, t1: f64, columns: usize) -> Vec<usize> {
    let n = times.len().min(values.len());
    let columns = columns.max(1);
    if n <= columns.saturating_mul(SAMPLES_PER_COLUMN) || t1.partial_cmp(&t0) != Some(std::cmp::Ordering::Greater) {
        return (0..n).collect();
    }
    let scale = columns as f64 / (t1 - t0);
    let column_of = |t: f64| (((t - t0) * scale).floor().max(0.0) as usize).min(columns - 1);
    let mut out = Vec::with_capacity(columns * SAMPLES_PER_COLUMN);
    let mut start = 0;
    while start < n {
        let col = column_of(times[start]);
        let mut end = start + 1;
        let (mut lo, mut hi) = (start, start);
        while end < n && column_of(times[end]) == col {
            if values[end] < values[lo] {
                lo = end;
            }
            if values[end] > values[hi] {
                hi = end;
            }
            end += 1;
        }
        let mut picks = [start, lo, hi, end - 1];
        picks.sort_unstable();
        let mut last = None;
        for i in picks {
            if last != Some(i) {
                out.push(i);
                last = Some(i);
            }
        }
        start = end;
    }
    out
}

/// Turns sampled values into the corner points of a step function (each
/// value holds until the next sample), extending the last value to `x_end`
/// so the final state stays visible instead of collapsing to zero width.
fn step_points(times: &[f64], values: &[f64], keep: &[usize], x_end: f64) -> Vec<(f64, f64)> {
    let mut pts = Vec::with_capacity(keep.len() * 2 + 1);
    let mut prev: Option<f64> = None;
    for &i in keep {
        let (t, v) = (times[i], values[i]);
        if let Some(pv) = prev {
            pts.push((t, pv));
        }
        pts.push((t, v));
        prev = Some(v);
    }
    if let (Some(pv), Some(&(t_last, _))) = (prev, pts.last()) {
        if x_end > t_last {
            pts.push((x_end, pv));
        }
    }
    pts
}

/// Value of the step function at `t` (the last sample at or before `t`).
fn value_at(times: &[f64], values: &[f64], t: f64) -> Option<f64> {
    let idx = times.partition_point(|&x| x <= t);
    if idx == 0 {
        None
    } else {
        values.get(idx - 1).copied()
    }
}

fn draw_err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("drawing {what} failed: {e}")
}

fn font(size: f64) -> TextStyle<'static> {
    (FONT, size).into_font().color(&TEXT_COLOR)
}

/// Decimals needed for the tick labels plotters will generate on `lo..hi`
/// with at most `max_ticks` ticks. Mirrors plotters' own step choice (a
/// power of ten divided by 2, 5 or 10, counting only ticks aligned to the
/// step inside the range) so labels are neither "1.000" nor two "0"s; where
/// rounding makes the count uncertain it errs towards more decimals.
pub(crate) fn tick_decimals(lo: f64, hi: f64, max_ticks: usize) -> usize {
    let span = hi - lo;
    if !(lo.is_finite() && hi.is_finite() && span > 0.0) || max_ticks == 0 {
        return 0;
    }
    // Ticks exactly on an end may be dropped from the count: undercounting
    // only costs a redundant decimal, overcounting would repeat labels.
    let fits = |step: f64| {
        let first = (lo / step + 1e-6).ceil();
        let last = (hi / step - 1e-6).floor();
        last - first + 1.0 <= max_ticks as f64
    };
    let mut step = 10f64.powf(span.log10().ceil());
    'refine: for _ in 0..40 {
        for div in [2.0, 5.0, 10.0] {
            if !fits(step / div) {
                break 'refine;
            }
        }
        step /= 10.0;
    }
    // `step` is now the finest power of ten that fits; the 1/2 or 1/5 step
    // plotters may refine it to needs one more decimal.
    let finest = if fits(step / 2.0) { step / 2.0 } else { step };
    (-(finest.log10() + 1e-9).floor()).clamp(0.0, 9.0) as usize
}

pub(crate) fn fmt_num(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    // "-0" and "-0.00" read as a bug in a memory axis.
    if s.trim_start_matches('-').chars().all(|c| c == '0' || c == '.') {
        s.trim_start_matches('-').to_string()
    } else {
        s
    }
}

fn fmt_gb(bytes_gb: f64) -> String {
    format!("{} GB ({} GiB)", fmt_num(bytes_gb, 1), fmt_num(bytes_gb * GB / GIB, 1))
}

/// Shortens `text` with an ellipsis until it fits `max_px`, so long rank
/// class or category names stay inside their box instead of overprinting.
pub(crate) fn fit_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    style: &TextStyle,
    max_px: u32,
) -> Option<String> {
    let width = |s: &str| area.estimate_text_size(s, style).map(|(w, _)| w).unwrap_or(u32::MAX);
    if width(text) <= max_px {
        return Some(text.to_string());
    }
    // Binary search on the prefix length: labels can be arbitrarily long
    // and each measurement walks the whole candidate string.
    let chars: Vec<char> = text.chars().collect();
    let candidate = |keep: usize| chars[..keep].iter().collect::<String>() + "…";
    let (mut lo, mut hi) = (0usize, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if width(&candidate(mid)) <= max_px {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (lo > 0).then(|| candidate(lo))
}

/// Word-wraps `text` into at most `max_lines` lines of `max_px`, the last
/// one shortened with an ellipsis if text remains: long category names and
/// OOM descriptions are the most informative text in the figure, so they
/// get a second line before they lose words.
fn wrap_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    style: &TextStyle,
    max_px: u32,
    max_lines: usize,
) -> Vec<String> {
    let width = |s: &str| area.estimate_text_size(s, style).map(|(w, _)| w).unwrap_or(u32::MAX);
    let mut lines = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() && lines.len() < max_lines {
        if lines.len() + 1 == max_lines || width(rest) <= max_px {
            lines.extend(fit_text(area, rest, style, max_px));
            break;
        }
        // The longest run of whole words that fits (binary search: widths
        // grow with every added word).
        let spaces: Vec<usize> = rest.match_indices(' ').map(|(i, _)| i).collect();
        let fits = |k: usize| width(&rest[..spaces[k]]) <= max_px;
        let (mut lo, mut hi) = (0usize, spaces.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let split = match lo.checked_sub(1).map(|k| spaces[k]) {
            Some(i) => i,
            // A single word wider than the box: break it mid-word.
            None => {
                let chars: Vec<(usize, char)> = rest.char_indices().collect();
                let (mut a, mut b) = (1usize, chars.len());
                while a < b {
                    let mid = (a + b).div_ceil(2);
                    let end = chars.get(mid).map_or(rest.len(), |c| c.0);
                    if width(&rest[..end]) <= max_px {
                        a = mid;
                    } else {
                        b = mid - 1;
                    }
                }
                chars.get(a).map_or(rest.len(), |c| c.0)
            }
        };
        lines.push(rest[..split].trim_end().to_string());
        rest = rest[split..].trim_start();
    }
    lines
}

fn render(path: &Path, title: &str, panels: &[Prepared]) -> Result<(), String> {
    let rows = panels.len().max(1) as u32;
    let height = TITLE_HEIGHT + rows * PANEL_HEIGHT;
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err("background"))?;
    let (title_area, body) = root.split_vertically(TITLE_HEIGHT);
    let title_style = font(TITLE_SIZE).pos(Pos::new(HPos::Center, VPos::Center));
    if let Some(t) = fit_text(&title_area, title, &title_style, WIDTH - 40) {
        title_area
            .draw_text(&t, &title_style, ((WIDTH / 2) as i32, (TITLE_HEIGHT / 2) as i32))
            .map_err(draw_err("title"))?;
    }

    if panels.is_empty() {
        let style = font(AXIS_DESC_SIZE).pos(Pos::new(HPos::Center, VPos::Center));
        body.draw_text("no rank classes to plot", &style, ((WIDTH / 2) as i32, (PANEL_HEIGHT / 2) as i32))
            .map_err(draw_err("empty-figure note"))?;
    }
    for (panel, area) in panels.iter().zip(body.split_evenly((panels.len().max(1), 1))) {
        render_panel(&area, panel)?;
    }
    root.present().map_err(|e| format!("writing {} failed: {e}", path.display()))
}

fn render_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Prepared) -> Result<(), String> {
    let (w, _) = area.dim_in_pixel();
    let (chart_area, legend_area) = area.split_horizontally(w.saturating_sub(LEGEND_WIDTH));
    let (x0, x1) = p.x_range;
    let y_max = p.y_max_gb;
    let y_max_gib = y_max * GB / GIB;

    let caption_style = font(CAPTION_SIZE);
    let caption =
        fit_text(&chart_area, &p.label, &caption_style, w.saturating_sub(LEGEND_WIDTH + 40)).unwrap_or_default();
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(caption, caption_style)
        .margin_top(8)
        .margin_left(10)
        .margin_right(6)
        .margin_bottom(6)
        .x_label_area_size(52)
        .y_label_area_size(82)
        .right_y_label_area_size(82)
        .build_cartesian_2d(x0..x1, 0.0..y_max)
        .map_err(draw_err("chart axes"))?
        .set_secondary_coord(x0..x1, 0.0..y_max_gib);

    let x_dec = tick_decimals(x0, x1, X_TICKS);
    let y_dec = tick_decimals(0.0, y_max, Y_TICKS);
    let gib_dec = tick_decimals(0.0, y_max_gib, Y_TICKS);
    let x_fmt = |v: &f64| fmt_num(*v, x_dec);
    let y_fmt = |v: &f64| fmt_num(*v, y_dec);
    let gib_fmt = |v: &f64| fmt_num(*v, gib_dec);
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("memory (GB = 1e9 B)")
        .label_style(font(LABEL_SIZE))
        .axis_desc_style(font(AXIS_DESC_SIZE))
        .x_labels(X_TICKS)
        .y_labels(Y_TICKS)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .bold_line_style(RGBColor(0xDD, 0xDD, 0xDD))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(draw_err("mesh"))?;
    chart
        .configure_secondary_axes()
        .y_desc("memory (GiB = 2^30 B)")
        .label_style(font(LABEL_SIZE))
        .axis_desc_style(font(AXIS_DESC_SIZE))
        .y_labels(Y_TICKS)
        .y_label_formatter(&gib_fmt)
        .draw()
        .map_err(draw_err("GiB axis"))?;

    let (plot_w, _) = chart.plotting_area().dim_in_pixel();
    let columns = plot_w.max(1) as usize;

    // Phase bands go first so the data stays fully saturated on top of them.
    let visible_phases: Vec<(usize, &(String, f64, f64))> = p
        .phases
        .iter()
        .enumerate()
        // A zero-length phase has nothing to shade and would only add a label
        // that collides with its neighbours.
        .filter(|(_, (_, a, b))| *b > *a && *b >= x0 && *a <= x1)
        .collect();
    chart
        .draw_series(visible_phases.iter().map(|(_, (label, a, b))| {
            Rectangle::new([(a.max(x0), 0.0), (b.min(x1), y_max)], band_color(phase_parts(label).0).filled())
        }))
        .map_err(draw_err("phase bands"))?;

    // Painter's algorithm: each layer is filled from zero up to its
    // cumulative top, topmost first, so lower layers overdraw the part of
    // the upper fill that belongs to them. Each curve is decimated on its
    // own, which keeps every layer boundary's peaks.
    let layer_paths: Vec<Vec<(f64, f64)>> = p
        .layers
        .iter()
        .map(|l| {
            let keep = decimate(&p.times, &l.top_gb, x0, x1, columns);
            step_points(&p.times, &l.top_gb, &keep, p.step_end)
        })
        .collect();
    for (layer, path) in p.layers.iter().zip(&layer_paths).rev() {
        if path.is_empty() {
            continue;
        }
        let mut poly = path.clone();
        if let (Some(&(first_x, _)), Some(&(last_x, _))) = (path.first(), path.last()) {
            poly.push((last_x, 0.0));
            poly.push((first_x, 0.0));
        }
        chart
            .draw_series(std::iter::once(Polygon::new(poly, layer.color.filled())))
            .map_err(draw_err("stacked area"))?;
    }
    for (layer, path) in p.layers.iter().zip(&layer_paths) {
        // A faint edge separates similar colours without turning short
        // spikes (a few pixels wide) into solid outline colour.
        let edge = darken(layer.color).mix(0.45);
        chart
            .draw_series(std::iter::once(PathElement::new(path.clone(), edge.stroke_width(1))))
            .map_err(draw_err("layer edge"))?;
    }

    // Phase boundaries drawn over the stack, so phases stay readable where
    // the stack hides the band tint.
    let boundary = RGBAColor(0x30, 0x30, 0x30, 0.35);
    let mut edges: Vec<f64> =
        visible_phases.iter().flat_map(|(_, (_, a, b))| [*a, *b]).filter(|x| *x > x0 && *x < x1).collect();
    edges.sort_by(f64::total_cmp);
    edges.dedup();
    chart
        .draw_series(edges.iter().map(|&x| PathElement::new(vec![(x, 0.0), (x, y_max)], boundary.stroke_width(1))))
        .map_err(draw_err("phase boundaries"))?;
    // Step boundaries: where each training step after the first begins.
    let step_edge = RGBAColor(0x20, 0x20, 0x20, 0.75);
    let starts: Vec<f64> = step_spans(&visible_phases).iter().skip(1).map(|s| s.1).filter(|x| *x > x0).collect();
    chart
        .draw_series(starts.iter().map(|&x| PathElement::new(vec![(x, 0.0), (x, y_max)], step_edge.stroke_width(2))))
        .map_err(draw_err("step boundaries"))?;

    if let Some(r) = &p.reserved_gb {
        let keep = decimate(&p.times, r, x0, x1, columns);
        let pts = step_points(&p.times, r, &keep, p.step_end);
        chart.draw_series(LineSeries::new(pts, RESERVED_COLOR.stroke_width(2))).map_err(draw_err("reserved line"))?;
    }

    if p.capacity_gb > y_max {
        // The axis is zoomed to the data: say where the capacity is.
        let style = font(LABEL_SIZE).color(&CAPACITY_COLOR);
        let peak = peak_of(p).map_or(0.0, |x| x.1);
        let reserved = p.reserved_gb.as_ref().map_or(0.0, |r| r.iter().copied().fold(0.0, f64::max));
        let text = format!(
            "capacity {} is above this plot: the peak allocates {:.0}% of it, the allocator reserves {:.0}%",
            fmt_gb(p.capacity_gb),
            100.0 * peak / p.capacity_gb,
            100.0 * reserved / p.capacity_gb
        );
        let (tw, th) = area.estimate_text_size(&text, &style).unwrap_or((0, 0));
        let y = PHASE_ROW_TOP + 2 * PHASE_ROW_HEIGHT + 6;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x0, y_max))
                    + Rectangle::new([(4, y - 2), (tw as i32 + 14, y + th as i32 + 6)], WHITE.mix(0.85).filled())
                    + Text::new(text, (9, y), style),
            ))
            .map_err(draw_err("capacity note"))?;
    } else if p.capacity_gb > 0.0 {
        let cap = p.capacity_gb;
        chart
            .draw_series(DashedLineSeries::new(vec![(x0, cap), (x1, cap)], 12, 6, CAPACITY_COLOR.stroke_width(3)))
            .map_err(draw_err("capacity line"))?;
        let style = font(LABEL_SIZE).color(&CAPACITY_COLOR);
        let text = format!("capacity {}", fmt_gb(cap));
        let (tw, th) = area.estimate_text_size(&text, &style).unwrap_or((0, 0));
        let (tw, th) = (tw as i32, th as i32);
        // Memory is usually low early in the run, so the label goes at the
        // left end, unless the OOM label will need that corner.
        let oom_on_left = p.oom.as_ref().is_some_and(|o| o.time_s < x0 + 0.45 * (x1 - x0));
        let (anchor, dx) = if oom_on_left { ((x1, cap), -(tw + 14)) } else { ((x0, cap), 4) };
        chart
            .draw_series(std::iter::once(
                EmptyElement::at(anchor)
                    + Rectangle::new([(dx, 5), (dx + tw + 10, th + 16)], WHITE.mix(0.85).filled())
                    + Text::new(text, (dx + 5, 8), style),
            ))
            .map_err(draw_err("capacity label"))?;
    }

    // Offloaded state lives in host memory for the whole run: stated in the plot, under the
    // labels and the capacity note, since it is not on this GPU's axis.
    if let Some(note) = &p.host_note {
        let style = font(LABEL_SIZE).color(&RGBColor(0x33, 0x33, 0x33));
        let (plot_w, _) = chart.plotting_area().dim_in_pixel();
        let lines = wrap_text(area, note, &style, plot_w.saturating_sub(40), 3);
        let line_h = LABEL_SIZE as i32 + 4;
        let tw =
            lines.iter().map(|l| area.estimate_text_size(l, &style).map_or(0, |(w, _)| w as i32)).max().unwrap_or(0);
        let y = PHASE_ROW_TOP + 3 * PHASE_ROW_HEIGHT + 16;
        let backdrop = EmptyElement::at((x0, y_max))
            + Rectangle::new([(4, y - 2), (tw + 14, y + lines.len() as i32 * line_h + 4)], WHITE.mix(0.6).filled());
        chart.draw_series(std::iter::once(backdrop)).map_err(draw_err("host note"))?;
        for (k, l) in lines.into_iter().enumerate() {
            let text = EmptyElement::at((x0, y_max)) + Text::new(l, (9, y + k as i32 * line_h), style.clone());
            chart.draw_series(std::iter::once(text)).map_err(draw_err("host note"))?;
        }
    }

    // The peak of live tensors, marked and labelled (an OOM panel marks the failure instead).
    if p.oom.is_none() {
        if let Some((t, peak)) = peak_of(p) {
            let style = font(LABEL_SIZE);
            let text = match &p.peak_op {
                Some(op) if !op.is_empty() => format!("peak {} allocated, in {op}", fmt_gb(peak)),
                _ => format!("peak {} allocated", fmt_gb(peak)),
            };
            let (tw, th) = area.estimate_text_size(&text, &style).unwrap_or((0, 0));
            let (tw, th) = (tw as i32, th as i32);
            // Right of the point unless that runs off the plot.
            let (px, _) = chart.backend_coord(&(t, peak));
            let (right, _) = chart.backend_coord(&(x1, peak));
            let dx = if px + tw + 24 < right { 10 } else { -(tw + 20) };
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((t, peak))
                        + Circle::new((0, 0), 5, RESERVED_COLOR.filled())
                        + Rectangle::new([(dx, -th - 14), (dx + tw + 10, -4)], WHITE.mix(0.85).filled())
                        + Text::new(text, (dx + 5, -th - 10), style),
                ))
                .map_err(draw_err("peak label"))?;
        }
    }

    let labels = place_phase_labels(&chart, area, &visible_phases, p);
    let rows_used = labels.iter().map(|l| l.row + 1).max().unwrap_or(0);
    // Phase labels after the data so nothing covers them; they live in the
    // headroom above the data.
    let label_style = font(LABEL_SIZE);
    for l in labels {
        let (tw, th) = area.estimate_text_size(&l.text, &label_style).unwrap_or((0, 0));
        let y = PHASE_ROW_TOP + l.row as i32 * PHASE_ROW_HEIGHT;
        let backdrop = if l.row > 0 { WHITE.mix(0.8) } else { TRANSPARENT };
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x0, y_max))
                    + Rectangle::new(
                        [(l.left - 3, y - 2), (l.left + tw as i32 + 3, y + th as i32 + 4)],
                        backdrop.filled(),
                    )
                    + Text::new(l.text, (l.left, y), label_style.clone()),
            ))
            .map_err(draw_err("phase label"))?;
    }

    // The OOM mark is the most important thing on the panel: drawn last.
    if let Some(oom) = &p.oom {
        draw_oom(&mut chart, area, p, oom, PHASE_ROW_TOP + rows_used as i32 * PHASE_ROW_HEIGHT + 4)?;
    }
    if p.times.is_empty() {
        let style = font(AXIS_DESC_SIZE).pos(Pos::new(HPos::Center, VPos::Center));
        chart
            .draw_series(std::iter::once(Text::new("no memory samples", ((x0 + x1) / 2.0, y_max / 2.0), style)))
            .map_err(draw_err("empty-panel note"))?;
    }

    draw_legend(&legend_area, p)
}

/// The time and height (GB) of the highest stacked total, the first time it is reached.
fn peak_of(p: &Prepared) -> Option<(f64, f64)> {
    let top = &p.layers.last()?.top_gb;
    let mut best: Option<(f64, f64)> = None;
    for (&t, &v) in p.times.iter().zip(top) {
        if v > 0.0 && best.is_none_or(|(_, b)| v > b) {
            best = Some((t, v));
        }
    }
    best
}

const PHASE_ROW_TOP: i32 = 3;
const PHASE_ROW_HEIGHT: i32 = 21;

/// A phase label's final text, row, and left edge in pixels relative to the
/// plot's left edge.
struct PhaseLabel {
    text: String,
    row: usize,
    left: i32,
}

/// A phase label's name and step: "backward 2" is ("backward", Some(2)).
fn phase_parts(label: &str) -> (&str, Option<u32>) {
    match label.rsplit_once(' ') {
        Some((name, n)) => match n.parse() {
            Ok(step) => (name, Some(step)),
            Err(_) => (label, None),
        },
        None => (label, None),
    }
}

/// The background of a phase, by its kind, so a band reads without its label (the legend
/// names them): forward sky blue, backward orange, the optimizer grey, the rest faint.
fn band_color(phase: &str) -> RGBAColor {
    match phase {
        "forward" => RGBAColor(0x56, 0xB4, 0xE9, 0.16),
        "backward" => RGBAColor(0xE6, 0x9F, 0x00, 0.14),
        "optimizer" => RGBAColor(0x60, 0x60, 0x60, 0.22),
        _ => RGBAColor(0x80, 0x80, 0x80, 0.08),
    }
}

/// A training run's steps as (step, start, end) over its phases; empty for a job without a
/// backward (inference), whose numbered phases are not steps.
fn step_spans(phases: &[(usize, &(String, f64, f64))]) -> Vec<(u32, f64, f64)> {
    let training = phases.iter().any(|(_, (l, _, _))| matches!(phase_parts(l).0, "backward" | "optimizer"));
    let mut out: Vec<(u32, f64, f64)> = Vec::new();
    if !training {
        return out;
    }
    for (_, (label, a, b)) in phases {
        let Some(step) = phase_parts(label).1 else { continue };
        match out.iter_mut().find(|s| s.0 == step) {
            Some(s) => {
                s.1 = s.1.min(*a);
                s.2 = s.2.max(*b);
            }
            None => out.push((step, *a, *b)),
        }
    }
    out.sort_by(|x, y| x.1.total_cmp(&y.1));
    out
}

/// Labels in two rows above the data. A training run gets one label per step in the first
/// row ("step 2", always shown where it fits) and each phase's kind in the second, where its
/// band holds it (the optimizer's short phase may spill into free space beside it); a label
/// that does not fit is left out, never shortened, since the band's colour and the legend
/// already say what it is. Another job (inference) gets its phases' names in the first row.
fn place_phase_labels<DB: DrawingBackend>(
    chart: &DualCoordChartContext<'_, DB, F64Coord, F64Coord>,
    measure: &DrawingArea<DB, Shift>,
    phases: &[(usize, &(String, f64, f64))],
    p: &Prepared,
) -> Vec<PhaseLabel> {
    const GAP: i32 = 10;
    let (x0, x1) = p.x_range;
    let style = font(LABEL_SIZE);
    let (plot_left, _) = chart.backend_coord(&(x0, p.y_max_gb));
    let (plot_right, _) = chart.backend_coord(&(x1, p.y_max_gb));
    let span = plot_right - plot_left;
    let width = |s: &str| measure.estimate_text_size(s, &style).map(|(w, _)| w as i32).unwrap_or(i32::MAX / 4);
    let px = |t: f64| chart.backend_coord(&(t.clamp(x0, x1), p.y_max_gb)).0 - plot_left;
    let steps = step_spans(phases);
    // (text, row, band start, band end, may spill)
    let mut wanted: Vec<(String, usize, f64, f64, bool)> = Vec::new();
    for (step, a, b) in &steps {
        wanted.push((format!("step {step}"), 0, *a, *b, false));
    }
    let phase_row = usize::from(!steps.is_empty());
    for (_, (label, a, b)) in phases {
        let name = phase_parts(label).0;
        if !label.is_empty() {
            wanted.push((name.to_string(), phase_row, *a, *b, name == "optimizer"));
        }
    }
    wanted.sort_by(|x, y| x.1.cmp(&y.1).then(x.2.total_cmp(&y.2)));
    let mut row_end = [i32::MIN / 2; 2];
    let mut out = Vec::new();
    for (text, row, a, b, spill) in wanted {
        let (pa, pb) = (px(a), px(b));
        let w = width(&text);
        if w > span - 4 || (!spill && w > pb - pa - 6) {
            continue;
        }
        let left = ((pa + pb) / 2 - w / 2).clamp(2, (span - w - 2).max(2));
        if left >= row_end[row] + GAP {
            row_end[row] = left + w;
            out.push(PhaseLabel { text, row, left });
        }
    }
    out
}

type F64Coord = Cartesian2d<RangedCoordf64, RangedCoordf64>;

fn draw_oom<DB: DrawingBackend>(
    chart: &mut DualCoordChartContext<'_, DB, F64Coord, F64Coord>,
    measure: &DrawingArea<DB, Shift>,
    p: &Prepared,
    oom: &OomMark,
    label_top: i32,
) -> Result<(), String> {
    let (x0, x1) = p.x_range;
    let y_max = p.y_max_gb;
    let t = oom.time_s.clamp(x0, x1);
    chart
        .draw_series(std::iter::once(PathElement::new(vec![(t, 0.0), (t, y_max)], OOM_COLOR.stroke_width(3))))
        .map_err(draw_err("OOM line"))?;
    let total = p.layers.last().and_then(|l| value_at(&p.times, &l.top_gb, t)).unwrap_or(0.0);
    let marker_y = if total > 0.0 { total } else { p.capacity_gb.min(y_max) };
    chart
        .draw_series(std::iter::once(
            EmptyElement::at((t, marker_y))
                + Circle::new((0, 0), 9, WHITE.filled())
                + Circle::new((0, 0), 7, OOM_COLOR.filled())
                + Cross::new((0, 0), 4, WHITE.stroke_width(2)),
        ))
        .map_err(draw_err("OOM marker"))?;
    // The request that failed, as a bar on top of what was allocated: it is what crosses
    // the capacity line (clipped at the top of the plot).
    if oom.requested_bytes > 0 && total > 0.0 {
        let req = oom.requested_bytes as f64 / GB;
        let top = (total + req).min(y_max);
        let h = chart.backend_coord(&(t, total)).1 - chart.backend_coord(&(t, top)).1;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((t, total))
                    + Rectangle::new([(-18, -h), (-6, 0)], OOM_COLOR.mix(0.35).filled())
                    + Rectangle::new([(-18, -h), (-6, 0)], OOM_COLOR.stroke_width(2)),
            ))
            .map_err(draw_err("failed request"))?;
    }

    let style = font(LABEL_SIZE).color(&OOM_COLOR);
    // Callers often phrase the label as "OOM: ..." already.
    let text = if oom.label.trim().is_empty() {
        "OOM".to_string()
    } else if oom.label.trim_start().to_ascii_lowercase().starts_with("oom") {
        oom.label.trim().to_string()
    } else {
        format!("OOM: {}", oom.label.trim())
    };
    let (px, _) = chart.backend_coord(&(t, y_max));
    let (plot_left, _) = chart.backend_coord(&(x0, y_max));
    let (plot_right, _) = chart.backend_coord(&(x1, y_max));
    // Put the label on whichever side of the line has more room for it.
    let (room_left, room_right) = (px - plot_left - 24, plot_right - px - 24);
    let on_right = room_right >= room_left;
    let room = room_left.max(room_right).max(40) as u32;
    let lines = wrap_text(measure, &text, &style, room, 3);
    if lines.is_empty() {
        return Ok(());
    }
    let line_h = LABEL_SIZE as i32 + 4;
    let tw =
        lines.iter().map(|l| measure.estimate_text_size(l, &style).map_or(0, |(w, _)| w as i32)).max().unwrap_or(0);
    let box_h = lines.len() as i32 * line_h + 10;
    // Keep the box off the capacity line so both stay readable.
    let cap_px = chart.backend_coord(&(t, p.capacity_gb)).1 - chart.backend_coord(&(t, y_max)).1;
    let y = if p.capacity_gb > 0.0 && cap_px >= label_top - 3 && cap_px <= label_top + box_h + 3 {
        cap_px + 6
    } else {
        label_top
    };
    let dx = if on_right { 10 } else { -(tw + 20) };
    chart
        .draw_series(std::iter::once(
            EmptyElement::at((t, y_max))
                + Rectangle::new([(dx, y), (dx + tw + 10, y + box_h)], WHITE.mix(0.9).filled())
                + Rectangle::new([(dx, y), (dx + tw + 10, y + box_h)], OOM_COLOR.stroke_width(1)),
        ))
        .map_err(draw_err("OOM label box"))?;
    for (k, line) in lines.into_iter().enumerate() {
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((t, y_max)) + Text::new(line, (dx + 5, y + 6 + k as i32 * line_h), style.clone()),
            ))
            .map_err(draw_err("OOM label"))?;
    }
    Ok(())
}

fn darken(c: RGBColor) -> RGBColor {
    RGBColor((c.0 as f64 * 0.75) as u8, (c.1 as f64 * 0.75) as u8, (c.2 as f64 * 0.75) as u8)
}

/// Legend outside the plot, so it can never hide the peak it explains.
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Prepared) -> Result<(), String> {
    enum Swatch {
        Fill(RGBColor),
        Band(RGBAColor),
        Line(RGBColor, bool),
        Edge,
        Marker,
    }
    let mut entries: Vec<(Swatch, String)> = p
        .layers
        .iter()
        .rev() // top of the stack listed first, matching the picture
        .map(|l| (Swatch::Fill(l.color), l.name.clone()))
        .collect();
    if p.reserved_gb.is_some() {
        entries.insert(0, (Swatch::Line(RESERVED_COLOR, false), "allocator reserved".to_string()));
    }
    if p.capacity_gb > 0.0 {
        entries.insert(0, (Swatch::Line(CAPACITY_COLOR, true), format!("capacity {}", fmt_gb(p.capacity_gb))));
    }
    if let Some(o) = &p.oom {
        let decimals = tick_decimals(p.x_range.0, p.x_range.1, X_TICKS) + 1;
        let bar = if o.requested_bytes > 0 { "; the bar: the request that failed" } else { "" };
        entries.push((Swatch::Marker, format!("out of memory at {} s{bar}", fmt_num(o.time_s, decimals))));
    }
    // The phase backgrounds, for a training run (their labels may be left out where narrow).
    let phases: Vec<(usize, &(String, f64, f64))> = p.phases.iter().enumerate().collect();
    let steps = step_spans(&phases);
    if !steps.is_empty() {
        for (kind, name) in [
            ("forward", "forward (background)"),
            ("backward", "backward (background)"),
            ("optimizer", "optimizer step (background)"),
        ] {
            if p.phases.iter().any(|(l, _, _)| phase_parts(l).0 == kind) {
                entries.push((Swatch::Band(band_color(kind)), name.to_string()));
            }
        }
        if steps.len() > 1 {
            entries.push((Swatch::Edge, "a new training step begins".to_string()));
        }
    }

    let style = font(LABEL_SIZE);
    let (w, h) = area.dim_in_pixel();
    let (top, row, wrap_row, x_text) = (44, 26, 19, 42);
    let bottom = h as i32 - 16;
    let text_px = w.saturating_sub(x_text as u32 + 8);
    let left_style = style.pos(Pos::new(HPos::Left, VPos::Center));
    let mut y = top;
    for (k, (swatch, name)) in entries.iter().enumerate() {
        let lines = wrap_text(area, name, &style, text_px, 2);
        let entry_h = row + wrap_row * (lines.len().max(1) as i32 - 1);
        // Leave room for the "… N more" line unless this is the last entry.
        let needed = if k + 1 == entries.len() { entry_h } else { entry_h + row };
        if y + needed > bottom {
            let more = format!("… {} more", entries.len() - k);
            area.draw_text(&more, &left_style, (x_text, y)).map_err(draw_err("legend text"))?;
            break;
        }
        match swatch {
            Swatch::Fill(c) => area
                .draw(&Rectangle::new([(10, y - 8), (32, y + 8)], c.filled()))
                .and_then(|_| area.draw(&Rectangle::new([(10, y - 8), (32, y + 8)], darken(*c).stroke_width(1)))),
            Swatch::Band(c) => area.draw(&Rectangle::new([(10, y - 8), (32, y + 8)], c.filled())).and_then(|_| {
                area.draw(&Rectangle::new([(10, y - 8), (32, y + 8)], RGBColor(0xBB, 0xBB, 0xBB).stroke_width(1)))
            }),
            Swatch::Edge => area.draw(&PathElement::new(
                vec![(21, y - 10), (21, y + 10)],
                RGBAColor(0x20, 0x20, 0x20, 0.75).stroke_width(2),
            )),
            Swatch::Line(c, dashed) => {
                if *dashed {
                    area.draw(&PathElement::new(vec![(8, y), (16, y)], c.stroke_width(3)))
                        .and_then(|_| area.draw(&PathElement::new(vec![(24, y), (34, y)], c.stroke_width(3))))
                } else {
                    area.draw(&PathElement::new(vec![(8, y), (34, y)], c.stroke_width(2)))
                }
            }
            Swatch::Marker => area
                .draw(&PathElement::new(vec![(21, y - 11), (21, y + 11)], OOM_COLOR.stroke_width(3)))
                .and_then(|_| area.draw(&Circle::new((21, y), 7, OOM_COLOR.filled()))),
        }
        .map_err(draw_err("legend swatch"))?;
        for (i, line) in lines.iter().enumerate() {
            area.draw_text(line, &left_style, (x_text, y + i as i32 * wrap_row)).map_err(draw_err("legend text"))?;
        }
        y += entry_h;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "stepsim-png-{}-{}-{name}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
        ));
        let _ = std::fs::create_dir_all(&dir);
        dir
    }

    fn panel(label: &str, n: usize, oom: bool) -> RankPanel {
        let times: Vec<f64> = (0..n).map(|i| i as f64 * 0.01).collect();
        let cats = ["parameters", "gradients", "optimizer state", "activations"];
        let bytes = cats
            .iter()
            .enumerate()
            .map(|(c, _)| (0..n).map(|i| ((c as u64 + 1) * 2_000_000_000) + (i as u64 % 37) * 50_000_000).collect())
            .collect();
        RankPanel {
            label: label.to_string(),
            capacity_bytes: 80_000_000_000,
            categories: cats.iter().map(|s| s.to_string()).collect(),
            times_s: times.clone(),
            bytes,
            reserved: Some((0..n).map(|i| 24_000_000_000 + (i as u64 % 11) * 100_000_000).collect()),
            phases: vec![
                PhaseSpan { label: "forward".into(), start_s: 0.0, end_s: n as f64 * 0.004 },
                PhaseSpan { label: "backward".into(), start_s: n as f64 * 0.004, end_s: n as f64 * 0.01 },
            ],
            oom: oom.then(|| OomMark {
                time_s: n as f64 * 0.007,
                label: "alloc of 4 GB failed".into(),
                requested_bytes: 4_000_000_000,
            }),
            host_note: None,
            peak_op: None,
        }
    }

    fn assert_png(path: &Path) {
        let data = std::fs::read(path).unwrap_or_default();
        assert!(data.len() > 10_000, "PNG suspiciously small: {} bytes", data.len());
        assert_eq!(&data[..8], &PNG_SIGNATURE);
        assert!(!tmp_path(path).exists(), "temporary file left behind");
    }

    #[test]
    fn two_panel_plot_is_a_png() {
        let dir = scratch("two");
        let path = dir.join("memory.png");
        let plot = MemoryPlot {
            title: "test plot".into(),
            panels: vec![panel("rank class 0", 500, false), panel("rank class 1", 300, true)],
        };
        assert_eq!(write_memory_png(&path, &plot), Ok(()));
        assert_png(&path);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        let dir = scratch("degenerate");
        let mut cases: Vec<MemoryPlot> = vec![MemoryPlot { title: String::new(), panels: vec![] }];
        let empty = RankPanel {
            label: String::new(),
            capacity_bytes: 0,
            categories: vec![],
            times_s: vec![],
            bytes: vec![],
            reserved: None,
            phases: vec![],
            oom: None,
            host_note: None,
            peak_op: None,
        };
        cases.push(MemoryPlot { title: "empty panel".into(), panels: vec![empty.clone()] });
        let mut single = panel("single", 1, true);
        single.phases.clear();
        cases.push(MemoryPlot { title: "single".into(), panels: vec![single] });
        let mut flat = panel("same time", 50, true);
        flat.times_s = vec![3.0; 50];
        cases.push(MemoryPlot { title: "flat".into(), panels: vec![flat] });
        let mut zeros = panel("zeros", 20, false);
        zeros.bytes.iter_mut().for_each(|s| s.iter_mut().for_each(|b| *b = 0));
        zeros.reserved = None;
        zeros.capacity_bytes = 0;
        cases.push(MemoryPlot { title: "zeros".into(), panels: vec![zeros] });
        let mut weird = panel("weird", 10, true);
        weird.times_s[3] = f64::NAN;
        weird.times_s.swap(1, 7);
        weird.phases.push(PhaseSpan { label: "x".repeat(500), start_s: f64::INFINITY, end_s: 1.0 });
        weird.phases.push(PhaseSpan { label: "reversed".into(), start_s: 0.09, end_s: 0.01 });
        weird.bytes[0][2] = u64::MAX;
        weird.label = "L".repeat(1000);
        if let Some(o) = weird.oom.as_mut() {
            o.time_s = 1e12;
        }
        cases.push(MemoryPlot { title: "T".repeat(1000), panels: vec![weird] });
        let mut mismatched = panel("mismatched", 10, false);
        mismatched.bytes[1].pop();
        cases.push(MemoryPlot { title: "bad".into(), panels: vec![mismatched] });

        for (i, plot) in cases.iter().enumerate() {
            let path = dir.join(format!("case{i}.png"));
            let r = write_memory_png(&path, plot);
            if r.is_ok() {
                assert_png(&path);
            }
        }
        let mismatch = cases.last().map(|p| write_memory_png(&dir.join("m.png"), p));
        assert!(matches!(mismatch, Some(Err(_))));
        // A directory that does not exist is an error, not a panic.
        let missing = dir.join("no/such/dir/x.png");
        assert!(write_memory_png(&missing, &cases[1]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_peak_mark_sits_on_the_first_highest_stacked_total() {
        let mut p = panel("peak", 50, false);
        // The same spike in activations at samples 5 and 42 (the other layers repeat every 37
        // samples, so the totals are equal): the first is the peak.
        for i in [5, 42] {
            p.bytes[3][i] = 40_000_000_000;
        }
        let colors = category_colors(std::slice::from_ref(&p));
        let prepared = prepare_panel(0, &p, &colors).unwrap();
        let (t, gb) = peak_of(&prepared).unwrap();
        let stacked: u64 = (0..3).map(|c| p.bytes[c][5]).sum::<u64>() + 40_000_000_000;
        assert!((t - 0.05).abs() < 1e-12, "{t}");
        assert!((gb - stacked as f64 / GB).abs() < 1e-9, "{gb}");
        // An empty panel has no peak to mark.
        let mut empty = panel("empty", 0, false);
        empty.phases.clear();
        assert!(peak_of(&prepare_panel(0, &empty, &colors).unwrap()).is_none());
    }

    #[test]
    fn the_y_axis_follows_a_small_job_and_keeps_capacity_in_view_otherwise() {
        let small = panel("small", 50, false);
        let colors = category_colors(std::slice::from_ref(&small));
        let p = prepare_panel(0, &small, &colors).unwrap();
        let data = p.layers.last().unwrap().top_gb.iter().copied().fold(0.0, f64::max);
        assert!(p.y_max_gb < p.capacity_gb && p.y_max_gb >= data, "{} vs {data}", p.y_max_gb);
        let mut big = panel("big", 50, false);
        big.capacity_bytes = 40_000_000_000;
        let p = prepare_panel(0, &big, &colors).unwrap();
        assert!(p.y_max_gb >= p.capacity_gb, "the capacity line stays in view near capacity");
    }

    #[test]
    fn decimation_keeps_column_maxima() {
        let n = 200_000;
        let times: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let mut values: Vec<f64> = (0..n).map(|i| (i % 100) as f64).collect();
        values[123_457] = 1e6;
        values[7] = -5.0;
        let keep = decimate(&times, &values, 0.0, n as f64, 1000);
        assert!(keep.len() <= 1000 * SAMPLES_PER_COLUMN);
        assert!(keep.windows(2).all(|w| w[0] < w[1]), "indices must stay in time order");
        assert!(keep.contains(&123_457), "global peak dropped");
        assert!(keep.contains(&7), "global minimum dropped");
        assert_eq!(keep.first(), Some(&0));
        assert_eq!(keep.last(), Some(&(n - 1)));
        // Every column's maximum survives.
        let per_col = n / 1000;
        for col in 0..1000 {
            let range = col * per_col..(col + 1) * per_col;
            let max = values[range.clone()].iter().copied().fold(f64::MIN, f64::max);
            let kept = keep.iter().filter(|i| range.contains(i)).map(|&i| values[i]).fold(f64::MIN, f64::max);
            assert_eq!(kept, max, "column {col}");
        }
        // Small inputs pass through untouched.
        assert_eq!(decimate(&times[..10], &values[..10], 0.0, 10.0, 1000), (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn many_samples_render_quickly() {
        let dir = scratch("big");
        let path = dir.join("big.png");
        let plot = MemoryPlot { title: "big".into(), panels: vec![panel("100k", 100_000, true)] };
        let start = std::time::Instant::now();
        assert_eq!(write_memory_png(&path, &plot), Ok(()));
        let took = start.elapsed();
        assert_png(&path);
        // Generous bound: unoptimised test builds are slow; the point is that
        // the cost does not scale with the sample count.
        assert!(took.as_secs_f64() < 5.0, "took {took:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_category_has_its_own_colour() {
        for cat in Category::ALL {
            assert_eq!(CATEGORY_COLORS.iter().filter(|(c, _)| *c == cat).count(), 1, "{cat:?}");
        }
        let distinct: std::collections::HashSet<(u8, u8, u8)> =
            CATEGORY_COLORS.iter().map(|(_, c)| (c.0, c.1, c.2)).collect();
        assert_eq!(distinct.len(), CATEGORY_COLORS.len());
    }

    #[test]
    fn steps_come_from_the_phase_labels_of_a_training_run() {
        let ph = |l: &str, a: f64, b: f64| (l.to_string(), a, b);
        let phases =
            [ph("init", 0.0, 0.1), ph("forward 1", 0.1, 0.2), ph("backward 1", 0.2, 0.4), ph("optimizer 1", 0.4, 0.45)];
        let phases2 = [ph("forward 2", 0.45, 0.6), ph("backward 2", 0.6, 0.8)];
        let all: Vec<(usize, &(String, f64, f64))> = phases.iter().chain(&phases2).enumerate().collect();
        assert_eq!(step_spans(&all), vec![(1, 0.1, 0.45), (2, 0.45, 0.8)]);
        assert_eq!(phase_parts("backward 12"), ("backward", Some(12)));
        assert_eq!(phase_parts("init"), ("init", None));
        // Inference's numbered phases are not training steps.
        let inf = [ph("prefill 1", 0.0, 0.1), ph("decode 1", 0.1, 0.5)];
        let inf: Vec<(usize, &(String, f64, f64))> = inf.iter().enumerate().collect();
        assert!(step_spans(&inf).is_empty());
    }

    #[test]
    fn colours_follow_names_across_panels() {
        let a = panel("a", 5, false);
        let mut b = panel("b", 5, false);
        b.categories.reverse();
        b.bytes.reverse();
        let colors = category_colors(&[a.clone(), b]);
        assert_eq!(colors.len(), a.categories.len());
        let distinct: std::collections::HashSet<(u8, u8, u8)> = colors.values().map(|c| (c.0, c.1, c.2)).collect();
        assert_eq!(distinct.len(), colors.len());
        // A memory category keeps its own colour in every picture.
        let own = |cat: Category| CATEGORY_COLORS.iter().find(|(c, _)| *c == cat).map(|(_, col)| (col.0, col.1, col.2));
        assert_eq!(colors.get("parameters").map(|c| (c.0, c.1, c.2)), own(Category::Parameters));
        assert_eq!(colors.get("optimizer state").map(|c| (c.0, c.1, c.2)), own(Category::OptimizerState));
    }

    #[test]
    fn tick_labels_get_enough_decimals() {
        assert_eq!(tick_decimals(0.0, 6.4, X_TICKS), 1); // 0.5 s ticks
        assert_eq!(tick_decimals(0.0, 7.6, X_TICKS), 0); // 1 s ticks
        assert_eq!(tick_decimals(0.3, 7.3, X_TICKS), 1); // 0.5 ... 7.0: 14 ticks
        assert_eq!(tick_decimals(0.0, 85.3, Y_TICKS), 0);
        assert_eq!(tick_decimals(0.0, 0.001, X_TICKS), 4);
        assert_eq!(tick_decimals(2.0, 2.0, X_TICKS), 0);
        assert_eq!(fmt_num(-0.0001, 2), "0.00");
    }

    #[test]
    fn step_points_hold_values() {
        let pts = step_points(&[0.0, 1.0, 2.0], &[1.0, 3.0, 2.0], &[0, 1, 2], 4.0);
        assert_eq!(pts, vec![(0.0, 1.0), (1.0, 1.0), (1.0, 3.0), (2.0, 3.0), (2.0, 2.0), (4.0, 2.0)]);
        assert_eq!(value_at(&[0.0, 1.0, 2.0], &[1.0, 3.0, 2.0], 1.5), Some(3.0));
        assert_eq!(value_at(&[0.0, 1.0], &[1.0, 3.0], -1.0), None);
    }

    /// CIE L* of an sRGB colour.
    fn lightness(c: RGBColor) -> f64 {
        let lin = |v: u8| {
            let v = f64::from(v) / 255.0;
            if v <= 0.04045 {
                v / 12.92
            } else {
                ((v + 0.055) / 1.055).powf(2.4)
            }
        };
        let y = 0.2126 * lin(c.0) + 0.7152 * lin(c.1) + 0.0722 * lin(c.2);
        if y > 0.008856 {
            116.0 * y.cbrt() - 16.0
        } else {
            903.3 * y
        }
    }

    #[test]
    fn categories_that_live_together_differ_in_lightness() {
        let color = |cat: Category| CATEGORY_COLORS.iter().find(|(c, _)| *c == cat).map(|(_, col)| *col).unwrap();
        use Category::*;
        for (a, b) in [
            (Gradients, UnshardedGradients),
            (OptimizerState, ActivationGradients),
            (OptimizerState, OptimizerTemp),
            (Activations, Recomputed),
            (Activations, Transient),
            (Recomputed, Transient),
            (ReduceScatterBuffers, AllGatherBuffers),
            (Parameters, GatheredParameters),
            (Inputs, BlasWorkspaces),
        ] {
            let d = (lightness(color(a)) - lightness(color(b))).abs();
            assert!(d >= 20.0, "{a:?} and {b:?} differ by only {d:.1} in L*");
        }
    }
}
