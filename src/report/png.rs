//! PNG rendering of simulated memory timelines (`memory.png`, `explain.png`).
//!
//! The picture is meant to answer "what filled the GPU, and when" at a glance, so every
//! panel uses the same colour for the same category, shows the capacity it is measured
//! against, and marks the OOM instant explicitly. Rendering must never take the simulator
//! down: bad or degenerate input becomes an `Err(String)`, never a panic.
//!
//! Layout, top to bottom: the figure's title and, when some rank classes are left out, a
//! note naming them; then per panel its caption, the *phase strip* (each training step's
//! label at the line where it begins, and a bar of the phases, forward / backward /
//! optimizer..., in light tints with their names where they fit), and the plot. The plot
//! is white: phases are not shaded in it, so no background can be taken for a memory
//! category; their boundaries are thin lines, drawn only where they are far enough apart
//! to read (a run of 96 micro-batches gets the strip alone). The categories are stacked as
//! plain fills, with no outline per segment (outlines between thousands of small steps
//! turned whole bands grey). The allocator's reserved bytes are a black line, the capacity
//! a dashed red one. The labels in the plot (the OOM, the capacity, the peak, and the peak
//! again in an OOM panel when it is elsewhere) are placed by [`place_labels`], which keeps
//! them off each other, the axes, the lines and, where it can, the data; a leader line joins
//! a label to its mark. The legend, outside the plot, lists every category drawn (the panel
//! grows to fit it), the lines, the phase tints, and what lives in host memory.
//!
//! A run whose samples all fall within a microsecond (an OOM while loading weights: no
//! simulated time passes during initialisation) is drawn on an allocation axis instead of
//! a time axis, so its ramp up to the OOM is visible.
//!
//! Labels are drawn with the bundled font through `ab_glyph` directly ([`draw_str`]), each
//! glyph at its own side bearing: plotters' text drops it, which closed the space in
//! "c_proj in".

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ab_glyph::{Font as _, FontRef, PxScale, ScaleFont as _};
use plotters::coord::Shift;
use plotters::prelude::*;
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
    /// When the peak `peak_op` names happens: marked there, in an OOM panel too when it is
    /// not the failing instant. None: the highest stacked total is marked (not in an OOM
    /// panel).
    pub peak_time_s: Option<f64>,
    /// The span of time to show (explain's window); None: the whole timeline. Phases may
    /// reach outside it: a step that began earlier is labelled with its start time.
    pub window_s: Option<(f64, f64)>,
}

/// A whole figure: one vertically stacked panel per distinct rank class.
#[derive(Debug, Clone)]
pub struct MemoryPlot {
    pub title: String,
    /// Said under the title (e.g. which rank classes have a panel and which are left out).
    pub note: Option<String>,
    pub panels: Vec<RankPanel>,
}

/// The font ships inside the binary so text renders identically on machines
/// without fontconfig/freetype (CI containers, cluster login nodes).
const FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
/// The family name the bundled font is registered under (see [`ensure_font`]).
pub(crate) const FONT: &str = "sans-serif";

const WIDTH: u32 = 1400;
/// A panel's height unless its legend needs more.
const PANEL_HEIGHT: u32 = 520;
/// Beyond this a legend is cut short ("… N more"): only a caller's own long list of
/// series gets there (the memory categories fit well within it).
const MAX_PANEL_HEIGHT: u32 = 1400;
const TITLE_HEIGHT: u32 = 56;
const NOTE_LINE_HEIGHT: u32 = 22;
const NOTE_MAX_LINES: usize = 4;
/// The panel's caption, above the phase strip.
const CAPTION_HEIGHT: u32 = 32;
/// The phase strip between the caption and the plot: a row of step labels and a bar of
/// the phases.
const STRIP_HEIGHT: u32 = 46;
const STRIP_STEP_ROW: i32 = 2;
const STRIP_BAR_TOP: i32 = 23;
const STRIP_BAR_HEIGHT: i32 = 20;
/// Kept outside the plot so a long category list never hides data.
const LEGEND_WIDTH: u32 = 310;
/// A bound on the image size: each panel costs ~2 MB of RGB buffer, and a
/// figure taller than this is unreadable anyway.
const MAX_PANELS: usize = 64;
/// Enough to keep first/min/max/last of every pixel column, which is all a
/// rasterised step function can show.
const SAMPLES_PER_COLUMN: usize = 4;
/// Room above the capacity line for the labels.
const HEADROOM: f64 = 1.15;
/// Below this fraction of capacity the y axis follows the data, with room above it for
/// the labels (the capacity is then named in the legend).
const ZOOM_BELOW: f64 = 0.5;
const ZOOMED_HEADROOM: f64 = 1.35;
/// Samples spread over less than this are drawn in allocation order, not on a time axis.
const EVENT_AXIS_SPAN_S: f64 = 1e-6;
/// Phase boundaries closer than this on average are left to the strip (micro-batches).
const MIN_BOUNDARY_SPACING_PX: i32 = 12;
/// Nor is a boundary drawn this close to the one before it.
const MIN_BOUNDARY_GAP_PX: i32 = 6;
const X_TICKS: usize = 14;
const Y_TICKS: usize = 10;
const GB: f64 = 1e9;
const GIB: f64 = 1_073_741_824.0;

const TITLE_SIZE: f64 = 28.0;
const NOTE_SIZE: f64 = 17.0;
const CAPTION_SIZE: f64 = 21.0;
const AXIS_DESC_SIZE: f64 = 18.0;
const LABEL_SIZE: f64 = 16.0;
const STRIP_SIZE: f64 = 15.0;
/// A line of label text.
const LINE_HEIGHT: i32 = 20;
/// Padding inside a label's box.
const PAD_X: i32 = 5;
const PAD_Y: i32 = 3;

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
const NOTE_COLOR: RGBColor = RGBColor(0x33, 0x33, 0x33);
const STEP_EDGE_COLOR: RGBAColor = RGBAColor(0x20, 0x20, 0x20, 0.75);

/// Writes a PNG; returns a human-readable error string on failure (never panics).
///
/// The image is rendered next to `path` and renamed into place, so a reader
/// polling for the file never sees a half-written PNG.
///
/// The plot is taken by value: each panel's series are consumed as they are stacked, so that
/// a run of tens of millions of samples does not hold its series twice (before, drawing such
/// a run's picture held about 2.4 GB on top of the simulation's 1.4 GB).
pub fn write_memory_png(path: &Path, plot: MemoryPlot) -> Result<(), String> {
    ensure_font()?;
    if glyph_font().is_none() {
        return Err("the bundled DejaVuSans.ttf could not be parsed as a font".to_string());
    }
    if plot.panels.len() > MAX_PANELS {
        return Err(format!("memory plot has {} panels; at most {MAX_PANELS} fit in one PNG", plot.panels.len()));
    }
    let (title, note) = (plot.title.clone(), plot.note.clone());
    let panels = prepared(plot)?;
    render_atomically(path, "plot", |tmp| render(tmp, &title, note.as_deref(), &panels))
}

/// The plot's panels, ready to draw, on one scale.
fn prepared(plot: MemoryPlot) -> Result<Vec<Prepared>, String> {
    let colors = category_colors(&plot.panels);
    // Panels are prepared on every core (a pipeline's stages each hold millions of samples).
    let mut panels = {
        use rayon::prelude::*;
        plot.panels
            .into_par_iter()
            .enumerate()
            .map(|(i, p)| prepare_panel(i, p, &colors))
            .collect::<Result<Vec<_>, _>>()?
    };
    // One scale for every panel, so stages and ranks compare by eye.
    let y_max = panels.iter().map(|p| p.y_max_gb).fold(0.0, f64::max);
    for p in panels.iter_mut() {
        p.y_max_gb = y_max;
    }
    Ok(panels)
}

/// Renders a PNG next to `path` and renames it into place, so a reader polling for the file
/// never sees a half-written picture; on failure nothing is left behind. plotters has
/// internal unwraps (font table lock, buffer sizing): a panic there costs a picture (an
/// error naming `what`), not the run. Every picture stepsim writes goes through here.
pub(crate) fn render_atomically(
    path: &Path,
    what: &str,
    render: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    let tmp = tmp_path(path);
    let rendered = catch_unwind(AssertUnwindSafe(|| render(&tmp)))
        .unwrap_or_else(|payload| Err(format!("{what} rendering panicked: {}", panic_text(&payload))));
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
    /// Sample positions on the x axis: seconds, or allocation numbers on an event axis.
    times: Vec<f64>,
    layers: Vec<Layer>,
    reserved_gb: Option<Vec<f64>>,
    phases: Vec<(String, f64, f64)>,
    oom: Option<OomMark>,
    host_note: Option<String>,
    peak_op: Option<String>,
    /// Where to mark the peak of live tensors: (x, GB).
    peak: Option<(f64, f64)>,
    /// The x axis counts allocations (all samples at one instant), not seconds.
    event_axis: bool,
}

fn prepare_panel(index: usize, p: RankPanel, colors: &HashMap<String, RGBColor>) -> Result<Prepared, String> {
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
    let RankPanel { times_s, categories, bytes, reserved, .. } = p;
    let p = RankPanel { times_s: Vec::new(), categories: Vec::new(), bytes: Vec::new(), reserved: None, ..p };

    // Non-finite times cannot be placed on an axis; out-of-order times are
    // tolerated (stable sort) rather than drawn as a scribble. The common case, every
    // time finite and in order, keeps the samples as they are (`order` None), without an
    // index or a copy of the times.
    let order: Option<Vec<usize>> = if times_s.iter().all(|t| t.is_finite()) && times_s.windows(2).all(|w| w[0] <= w[1])
    {
        None
    } else {
        let mut order: Vec<usize> = (0..n).filter(|&i| times_s[i].is_finite()).collect();
        if !order.windows(2).all(|w| times_s[w[0]] <= times_s[w[1]]) {
            order.sort_by(|&a, &b| times_s[a].total_cmp(&times_s[b]));
        }
        Some(order)
    };
    let in_order = |series: Vec<u64>| -> Vec<u64> {
        match &order {
            None => series,
            Some(o) => o.iter().map(|&i| series[i]).collect(),
        }
    };
    let mut times: Vec<f64> = match &order {
        None => times_s,
        Some(o) => o.iter().map(|&i| times_s[i]).collect(),
    };

    let mut running = vec![0u64; order.as_ref().map_or(n, Vec::len)];
    let mut layers = Vec::new();
    // Each category's series is dropped once it is stacked.
    for (name, series) in categories.into_iter().zip(bytes) {
        let series = in_order(series);
        if series.iter().all(|&b| b == 0) {
            continue;
        }
        for (acc, &b) in running.iter_mut().zip(&series) {
            *acc = acc.saturating_add(b);
        }
        drop(series);
        layers.push(Layer {
            color: colors.get(&name).copied().unwrap_or(PALETTE[0]),
            name,
            top_gb: running.iter().map(|&b| b as f64 / GB).collect(),
        });
    }
    drop(running);
    let reserved_gb = reserved.map(|r| in_order(r).iter().map(|&b| b as f64 / GB).collect::<Vec<_>>());

    let mut phases: Vec<(String, f64, f64)> = p
        .phases
        .iter()
        .filter(|ph| ph.start_s.is_finite() && ph.end_s.is_finite())
        .map(|ph| {
            let (a, b) = if ph.start_s <= ph.end_s { (ph.start_s, ph.end_s) } else { (ph.end_s, ph.start_s) };
            (ph.label.clone(), a, b)
        })
        .collect();
    let mut oom = p.oom.clone().filter(|o| o.time_s.is_finite());

    // Every sample at one instant (weights loading: no simulated time passes) would
    // collapse to a single step at t: drawn in allocation order instead.
    let event_axis = times.len() >= 2 && times[times.len() - 1] - times[0] < EVENT_AXIS_SPAN_S;
    let mut window = p.window_s.filter(|(a, b)| a.is_finite() && b.is_finite() && b > a);
    if event_axis {
        let count = times.len() as f64;
        times = (0..times.len()).map(|i| i as f64).collect();
        let name = phases.first().map_or("initialisation", |ph| phase_parts(&ph.0).0);
        let name = if name == "init" { "initialisation" } else { name };
        phases = vec![(format!("{name}: allocations in order, no simulated time passes"), 0.0, count)];
        // The failed request comes after the last allocation that succeeded.
        if let Some(o) = oom.as_mut() {
            o.time_s = count;
        }
        window = None;
    }

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
    let mut step_end = hi;
    if let Some((a, b)) = window {
        step_end = step_end.min(b);
        (lo, hi) = (a, b);
    }
    if hi - lo <= f64::EPSILON * lo.abs().max(1.0) * 16.0 {
        // A single instant still needs a visible width to draw its value.
        let pad = (lo.abs() * 1e-3).max(0.5);
        (lo, hi) = (lo - pad, hi + pad);
        step_end = hi;
    }
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
    // in the legend) rather than a stack squeezed into the bottom of it.
    let mut y_max_gb = if capacity_gb > 0.0 && data_max > 0.0 && data_max < ZOOM_BELOW * capacity_gb {
        data_max * ZOOMED_HEADROOM
    } else {
        capacity_gb.max(data_max) * HEADROOM
    };
    if !(y_max_gb.is_finite() && y_max_gb > 0.0) {
        y_max_gb = 1.0;
    }

    let mut prepared = Prepared {
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
        peak: None,
        event_axis,
    };
    prepared.peak = peak_mark(&prepared, p.peak_time_s);
    Ok(prepared)
}

/// Where the peak of live tensors is marked: at `peak_time` (the highest stacked total among
/// the samples at that instant) when it is given and in view; else, outside an OOM panel, the
/// first highest stacked total.
fn peak_mark(p: &Prepared, peak_time: Option<f64>) -> Option<(f64, f64)> {
    let top = &p.layers.last()?.top_gb;
    match peak_time.filter(|t| t.is_finite() && !p.event_axis) {
        Some(t) => {
            if t < p.x_range.0 || t > p.x_range.1 {
                return None;
            }
            let (a, b) = (p.times.partition_point(|&x| x < t), p.times.partition_point(|&x| x <= t));
            let at = top.get(a..b).unwrap_or(&[]).iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let v = if at.is_finite() { Some(at) } else { value_at(&p.times, top, t) };
            v.filter(|v| *v > 0.0).map(|v| (t, v))
        }
        None if p.oom.is_none() || (p.event_axis && peak_time.is_some()) => peak_of(p),
        None => None,
    }
}

/// Indices of the samples worth drawing when there are more samples than
/// pixels: per pixel column the first, lowest, highest and last sample, in
/// time order. Keeping the highest means a sub-pixel spike (the usual OOM
/// culprit) is never averaged away; keeping first/last keeps the step edges
/// between columns exact. `times` must be ascending.
fn decimate(times: &[f64], values: &[f64], t0: f64, t1: f64, columns: usize) -> Vec<usize> {
    let n = times.len().min(values.len());
    match column_runs(&times[..n], t0, t1, columns) {
        None => (0..n).collect(),
        Some(runs) => decimate_runs(values, &runs),
    }
}

/// Where each pixel column's run of samples ends (samples in time order), or None where
/// every sample is kept (few enough, or an empty time range). The same for every series
/// over `times`: a panel's layers share it, where each computed it sample by sample.
fn column_runs(times: &[f64], t0: f64, t1: f64, columns: usize) -> Option<Vec<usize>> {
    let n = times.len();
    let columns = columns.max(1);
    if n <= columns.saturating_mul(SAMPLES_PER_COLUMN) || t1.partial_cmp(&t0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let scale = columns as f64 / (t1 - t0);
    let column_of = |t: f64| (((t - t0) * scale).floor().max(0.0) as usize).min(columns - 1);
    let mut ends = Vec::with_capacity(columns);
    let mut start = 0;
    while start < n {
        let col = column_of(times[start]);
        let mut end = start + 1;
        while end < n && column_of(times[end]) == col {
            end += 1;
        }
        ends.push(end);
        start = end;
    }
    Some(ends)
}

/// The samples a series keeps over [`column_runs`]' runs: each run's first, lowest, highest
/// and last, in order, once each.
fn decimate_runs(values: &[f64], ends: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(ends.len() * SAMPLES_PER_COLUMN);
    let mut start = 0;
    for &end in ends {
        let (mut lo, mut hi) = (start, start);
        for (i, &v) in values.iter().enumerate().take(end).skip(start + 1) {
            if v < values[lo] {
                lo = i;
            }
            if v > values[hi] {
                hi = i;
            }
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
/// class or category names stay inside their box instead of overprinting
/// (plotters' measure: timeline.png's text; memory.png's is [`fit_px`]).
pub(crate) fn fit_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    style: &TextStyle,
    max_px: u32,
) -> Option<String> {
    shorten(text, |s| area.estimate_text_size(s, style).map(|(w, _)| w).unwrap_or(u32::MAX) <= max_px)
}

/// `text`, or its longest prefix with an ellipsis that `fits` (None: not even one
/// character does). Binary search on the prefix length: labels can be arbitrarily long and
/// each measurement walks the whole candidate string.
fn shorten(text: &str, fits: impl Fn(&str) -> bool) -> Option<String> {
    if fits(text) {
        return Some(text.to_string());
    }
    let chars: Vec<char> = text.chars().collect();
    let candidate = |keep: usize| chars[..keep].iter().collect::<String>() + "…";
    let (mut lo, mut hi) = (0usize, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(&candidate(mid)) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (lo > 0).then(|| candidate(lo))
}

/// The bundled font, parsed once for [`text_width`] and [`draw_str`].
fn glyph_font() -> Option<&'static FontRef<'static>> {
    static PARSED: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    PARSED.get_or_init(|| FontRef::try_from_slice(FONT_BYTES).ok()).as_ref()
}

/// The width in pixels of `text` at `size` px as [`draw_str`] draws it: advances and kerning.
fn text_width(text: &str, size: f64) -> i32 {
    let Some(font) = glyph_font() else {
        return (text.chars().count() as f64 * size * 0.6).ceil() as i32;
    };
    let f = font.as_scaled(PxScale::from(size as f32));
    let mut w = 0f32;
    let mut prev = None;
    for c in text.chars() {
        let id = f.glyph_id(c);
        if let Some(p) = prev {
            w += f.kern(p, id);
        }
        w += f.h_advance(id);
        prev = Some(id);
    }
    w.ceil() as i32
}

/// Draws `text` with its top-left corner at `pos` (pixels of `area`), each glyph at its
/// own side bearing.
fn draw_str<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    size: f64,
    color: RGBColor,
    pos: (i32, i32),
) -> Result<(), String> {
    let font = glyph_font().ok_or("the bundled DejaVuSans.ttf could not be parsed as a font")?;
    let scale = PxScale::from(size as f32);
    let f = font.as_scaled(scale);
    let baseline = pos.1 as f32 + f.ascent();
    let mut pen = pos.0 as f32;
    let mut prev = None;
    let mut coverage: Vec<(i32, i32, f32)> = Vec::new();
    for c in text.chars() {
        let id = f.glyph_id(c);
        if let Some(p) = prev {
            pen += f.kern(p, id);
        }
        if let Some(outline) = font.outline_glyph(id.with_scale_and_position(scale, ab_glyph::point(pen, baseline))) {
            let b = outline.px_bounds();
            outline.draw(|x, y, c| {
                if c > 0.0 {
                    coverage.push((b.min.x as i32 + x as i32, b.min.y as i32 + y as i32, c.min(1.0)));
                }
            });
        }
        pen += f.h_advance(id);
        prev = Some(id);
    }
    for (x, y, c) in coverage {
        area.draw_pixel((x, y), &color.mix(f64::from(c))).map_err(draw_err("text"))?;
    }
    Ok(())
}

/// Greedy word wrap: each line the most whole words that `fits` (a word too wide on its own
/// gets a line of its own). timeline.png's note and message and the sweep heatmap's caption
/// wrap with it, each measuring text its own way.
pub(crate) fn greedy_wrap(text: &str, fits: impl Fn(&str) -> bool) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let candidate = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
        if line.is_empty() || fits(&candidate) {
            line = candidate;
        } else {
            lines.push(std::mem::replace(&mut line, word.to_string()));
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Shortens `text` with an ellipsis until it is at most `max_px` wide ([`text_width`]).
fn fit_px(text: &str, size: f64, max_px: i32) -> Option<String> {
    shorten(text, |s| text_width(s, size) <= max_px)
}

/// Word-wraps `text` into at most `max_lines` lines of at most `max_px`, the last one
/// shortened with an ellipsis if text remains: long category names and OOM descriptions
/// are the most informative text in the figure, so they get more lines before they lose
/// words.
fn wrap_px(text: &str, size: f64, max_px: i32, max_lines: usize) -> Vec<String> {
    let width = |s: &str| text_width(s, size);
    let mut lines = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() && lines.len() < max_lines {
        if lines.len() + 1 == max_lines || width(rest) <= max_px {
            lines.extend(fit_px(rest, size, max_px));
            break;
        }
        // The longest run of whole words that fits (widths grow with every added word).
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

/// A rectangle in pixels: columns `x0..x1`, rows `y0..y1` (ends excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PxRect {
    pub x0: i32,
    pub y0: i32,
    pub x1: i32,
    pub y1: i32,
}

impl PxRect {
    pub(crate) fn at(x: i32, y: i32, w: i32, h: i32) -> PxRect {
        PxRect { x0: x, y0: y, x1: x + w, y1: y + h }
    }
    pub(crate) fn intersects(&self, o: &PxRect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
    pub(crate) fn contains(&self, o: &PxRect) -> bool {
        o.x0 >= self.x0 && o.x1 <= self.x1 && o.y0 >= self.y0 && o.y1 <= self.y1
    }
    fn grown(&self, m: i32) -> PxRect {
        PxRect { x0: self.x0 - m, y0: self.y0 - m, x1: self.x1 + m, y1: self.y1 + m }
    }
    /// The point of this rectangle nearest to `p`.
    fn nearest(&self, p: (i32, i32)) -> (i32, i32) {
        (p.0.clamp(self.x0, self.x1 - 1), p.1.clamp(self.y0, self.y1 - 1))
    }
}

/// What labels in a plot must keep clear of, in pixels.
pub(crate) struct Scene {
    /// The plotting area: labels stay inside it, off the axes and their tick labels.
    pub plot: PxRect,
    /// For each pixel column of the plot (x = plot.x0 + i), the rows the lines (reserved,
    /// capacity) pass through there, as inclusive spans.
    pub lines: Vec<Vec<(i32, i32)>>,
    /// For each pixel column, the top row of the drawn data (plot.y1 where there is none).
    pub data_top: Vec<i32>,
    /// Marks to keep clear of: the OOM line and marker, the failed request's bar, the peak.
    pub marks: Vec<PxRect>,
}

impl Scene {
    pub(crate) fn new(plot: PxRect) -> Scene {
        let columns = (plot.x1 - plot.x0).max(0) as usize;
        Scene { plot, lines: vec![Vec::new(); columns], data_top: vec![plot.y1; columns], marks: Vec::new() }
    }

    /// Adds a polyline (pixel points) as `half_width` pixels either side of its path.
    pub(crate) fn add_line(&mut self, points: &[(i32, i32)], half_width: i32) {
        for (col, span) in rasterize(points, self.plot.x0, self.lines.len()).into_iter().enumerate() {
            if let Some((a, b)) = span {
                self.lines[col].push((a - half_width, b + half_width));
            }
        }
    }

    /// Records the top edge of the data (a polyline of pixel points): labels stay above it
    /// where they can.
    pub(crate) fn add_data_top(&mut self, points: &[(i32, i32)]) {
        for (col, span) in rasterize(points, self.plot.x0, self.data_top.len()).into_iter().enumerate() {
            if let Some((a, _)) = span {
                self.data_top[col] = self.data_top[col].min(a);
            }
        }
    }

    fn columns(&self, r: &PxRect) -> std::ops::Range<usize> {
        let n = self.lines.len() as i32;
        let a = (r.x0 - self.plot.x0).clamp(0, n) as usize;
        let b = (r.x1 - self.plot.x0).clamp(0, n) as usize;
        a..b
    }

    /// How bad a spot `r` is for a label, given the labels already placed: 0 clear of
    /// everything; 1 over the data; 2 across a line; 3 over a mark or another label (or
    /// off the plot).
    fn cost(&self, r: &PxRect, placed: &[PxRect]) -> u8 {
        if !self.plot.contains(r) {
            return 4;
        }
        let g = r.grown(2);
        if placed.iter().chain(&self.marks).any(|o| o.intersects(&g)) {
            return 3;
        }
        let cols = self.columns(&g);
        if self.lines[cols.clone()].iter().any(|spans| spans.iter().any(|&(a, b)| a < g.y1 && g.y0 <= b)) {
            return 2;
        }
        if self.data_top[cols].iter().any(|&top| g.y1 > top) {
            return 1;
        }
        0
    }
}

/// For each of `columns` pixel columns from `x0`, the rows a polyline passes through there
/// (inclusive), or None where it does not reach.
fn rasterize(points: &[(i32, i32)], x0: i32, columns: usize) -> Vec<Option<(i32, i32)>> {
    let mut out: Vec<Option<(i32, i32)>> = vec![None; columns];
    let mut mark = |x: i32, y: i32| {
        if let Some(slot) = usize::try_from(x - x0).ok().and_then(|i| out.get_mut(i)) {
            *slot = Some(slot.map_or((y, y), |(a, b)| (a.min(y), b.max(y))));
        }
    };
    if let [only] = points {
        mark(only.0, only.1);
    }
    for w in points.windows(2) {
        let ((ax, ay), (bx, by)) = (w[0], w[1]);
        if ax == bx {
            mark(ax, ay);
            mark(ax, by);
            continue;
        }
        let ((ax, ay), (bx, by)) = if ax < bx { ((ax, ay), (bx, by)) } else { ((bx, by), (ax, ay)) };
        // Only the columns inside the plot matter: a long segment is clipped first.
        let first = ax.max(x0 - 1);
        let last = bx.min(x0 + columns as i32);
        for x in first..=last {
            let t = f64::from(x - ax) / f64::from(bx - ax);
            let y = f64::from(ay) + t * f64::from(by - ay);
            let t2 = (f64::from(x + 1 - ax) / f64::from(bx - ax)).min(1.0);
            let y2 = f64::from(ay) + t2 * f64::from(by - ay);
            mark(x, y.min(y2).floor() as i32);
            mark(x, y.max(y2).ceil() as i32);
        }
    }
    out
}

/// A label to place: the point it describes, and the spots it may take, best first.
pub(crate) struct Want {
    pub anchor: (i32, i32),
    pub options: Vec<PxRect>,
}

/// Places labels one after another, each at its first option of the lowest [`Scene::cost`]
/// (clear of everything, else over the data, else across a line, else over another label),
/// never outside the plot when an option inside it exists. Returns the chosen option's
/// index per label (None for a label with no options).
pub(crate) fn place_labels(scene: &Scene, wants: &[Want]) -> Vec<Option<usize>> {
    let mut placed: Vec<PxRect> = Vec::new();
    let mut out = Vec::with_capacity(wants.len());
    for want in wants {
        let mut best: Option<(u8, usize)> = None;
        for (i, r) in want.options.iter().enumerate() {
            let mut c = scene.cost(r, &placed);
            // A leader line through another label reads as pointing at it.
            if c < 3 && placed.iter().any(|o| segment_hits(want.anchor, r.nearest(want.anchor), o)) {
                c = 3;
            }
            if best.is_none_or(|(b, _)| c < b) {
                best = Some((c, i));
                if c == 0 {
                    break;
                }
            }
        }
        if let Some((_, i)) = best {
            placed.push(want.options[i]);
        }
        out.push(best.map(|b| b.1));
    }
    out
}

/// Whether the segment from `a` to `b` passes through `r` (sampled every 2 pixels).
fn segment_hits(a: (i32, i32), b: (i32, i32), r: &PxRect) -> bool {
    let steps = ((b.0 - a.0).abs().max((b.1 - a.1).abs()) / 2).max(1);
    (0..=steps).any(|k| {
        let x = a.0 + (b.0 - a.0) * k / steps;
        let y = a.1 + (b.1 - a.1) * k / steps;
        x >= r.x0 && x < r.x1 && y >= r.y0 && y < r.y1
    })
}

/// Spots for a `w` x `h` label around a mark at `a`: a grid of boxes above, beside and
/// below it, nearest first; at equal distance above before beside before below, and left of
/// the mark before right when `left_first`.
#[cfg(test)]
pub(crate) fn options_around(a: (i32, i32), size: (i32, i32), left_first: bool) -> Vec<PxRect> {
    scored_around(a, size, left_first).into_iter().map(|o| o.1).collect()
}

/// [`options_around`]'s boxes with their scores (distance from the mark plus the penalty of
/// their side), ascending.
fn scored_around(a: (i32, i32), (w, h): (i32, i32), left_first: bool) -> Vec<(i64, PxRect)> {
    let mut xs: Vec<(i32, i32)> = vec![(a.0 - w / 2, 1)];
    for k in 0..=14 {
        let (right, left) = ((a.0 + 6 + 40 * k, 0), (a.0 - 6 - w - 40 * k, 0));
        let (near, far) = if left_first { (left, right) } else { (right, left) };
        xs.push(near);
        xs.push((far.0, 1));
    }
    let mut ys: Vec<(i32, i32)> = vec![(a.1 - h / 2, 8)];
    for j in 0..=20 {
        ys.push((a.1 - 8 - h - 14 * j, 0));
        ys.push((a.1 + 8 + 14 * j, 16));
    }
    let mut out: Vec<(i64, PxRect)> = Vec::new();
    for &(x, xp) in &xs {
        for &(y, yp) in &ys {
            let r = PxRect::at(x, y, w, h);
            // A box over its own mark hides it.
            if r.grown(2).contains(&PxRect::at(a.0, a.1, 1, 1)) {
                continue;
            }
            let n = r.nearest(a);
            let (dx, dy) = (i64::from(n.0 - a.0), i64::from(n.1 - a.1));
            let d = ((dx * dx + dy * dy) as f64).sqrt() as i64;
            out.push((d + i64::from(xp + yp), r));
        }
    }
    out.sort_by_key(|o| o.0);
    out
}

/// Spots for a `w` x `h` label on a horizontal line at row `y` across `plot`: just below or
/// above it, at the left end, the right end, then points between.
pub(crate) fn options_along(plot: &PxRect, y: i32, (w, h): (i32, i32)) -> Vec<PxRect> {
    let (left, right) = (plot.x0 + 8, plot.x1 - 8 - w);
    let mut xs = vec![left, right];
    for k in 1..8 {
        xs.push(left + (right - left) * k / 8);
    }
    let mut out = Vec::new();
    for x in xs {
        out.push(PxRect::at(x, y + 5, w, h));
        out.push(PxRect::at(x, y - 5 - h, w, h));
    }
    out
}

/// The figure's layout: the note's lines under the title, the head's height (title and
/// note), each panel's legend and height, and the image's size.
struct Layout {
    note_lines: Vec<String>,
    head: u32,
    legends: Vec<Vec<LegendEntry>>,
    heights: Vec<u32>,
    size: (u32, u32),
}

fn layout(note: Option<&str>, panels: &[Prepared]) -> Layout {
    let note_lines = note.map(|n| wrap_px(n, NOTE_SIZE, WIDTH as i32 - 80, NOTE_MAX_LINES)).unwrap_or_default();
    let head = TITLE_HEIGHT + note_lines.len() as u32 * NOTE_LINE_HEIGHT + if note_lines.is_empty() { 0 } else { 8 };
    let legends: Vec<Vec<LegendEntry>> = panels.iter().map(legend_entries).collect();
    let heights: Vec<u32> = legends.iter().map(|l| panel_height(l)).collect();
    let body = if panels.is_empty() { PANEL_HEIGHT } else { heights.iter().sum() };
    Layout { note_lines, head, legends, heights, size: (WIDTH, head + body) }
}

fn render(path: &Path, title: &str, note: Option<&str>, panels: &[Prepared]) -> Result<(), String> {
    let layout = layout(note, panels);
    if panels.is_empty() {
        let root = BitMapBackend::new(path, layout.size).into_drawing_area();
        draw_figure(&root, title, &layout, panels)?;
        return root.present().map_err(|e| format!("writing {} failed: {e}", path.display()));
    }
    // Each panel owns a band of rows of the picture, drawn on its own core (a pipeline's
    // eight stages took 0.2 s one after the other); the head goes first. Nothing a panel
    // draws leaves its band, so the picture is the one drawn on a single canvas.
    let (w, h) = layout.size;
    let row = 3 * w as usize; // RGB, one byte each (plotters' default pixel format)
    let mut buf = vec![0u8; row * h as usize];
    let (head, mut rest) = buf.split_at_mut(row * layout.head as usize);
    let mut bands = Vec::with_capacity(panels.len());
    for &ph in &layout.heights {
        let (band, below) = rest.split_at_mut(row * ph as usize);
        bands.push((band, ph));
        rest = below;
    }
    {
        let root = BitMapBackend::with_buffer(head, (w, layout.head)).into_drawing_area();
        draw_head(&root, title, &layout)?;
    }
    {
        use rayon::prelude::*;
        bands.into_par_iter().zip(panels.par_iter().zip(layout.legends.par_iter())).try_for_each(
            |((band, ph), (panel, legend))| {
                let area = BitMapBackend::with_buffer(band, (w, ph)).into_drawing_area();
                area.fill(&WHITE).map_err(draw_err("background"))?;
                render_panel(&area, panel, legend)
            },
        )?;
    }
    // plotters' own encoder call (`present` on a file target), so the bytes are its.
    image::save_buffer(path, &buf, w, h, image::ColorType::Rgb8)
        .map_err(|e| format!("writing {} failed: {e}", path.display()))
}

/// The title and the note above the panels.
fn draw_head<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str, layout: &Layout) -> Result<(), String> {
    root.fill(&WHITE).map_err(draw_err("background"))?;
    if let Some(t) = fit_px(title, TITLE_SIZE, WIDTH as i32 - 40) {
        let x = (WIDTH as i32 - text_width(&t, TITLE_SIZE)) / 2;
        draw_str(root, &t, TITLE_SIZE, TEXT_COLOR, (x, (TITLE_HEIGHT as i32 - TITLE_SIZE as i32) / 2 - 2))?;
    }
    for (k, line) in layout.note_lines.iter().enumerate() {
        let x = (WIDTH as i32 - text_width(line, NOTE_SIZE)) / 2;
        draw_str(root, line, NOTE_SIZE, NOTE_COLOR, (x, TITLE_HEIGHT as i32 - 4 + k as i32 * NOTE_LINE_HEIGHT as i32))?;
    }
    Ok(())
}

fn draw_figure<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    layout: &Layout,
    panels: &[Prepared],
) -> Result<(), String> {
    draw_head(root, title, layout)?;
    let (_, mut rest) = root.split_vertically(layout.head);
    if panels.is_empty() {
        let text = "no rank classes to plot";
        let x = (WIDTH as i32 - text_width(text, AXIS_DESC_SIZE)) / 2;
        draw_str(&rest, text, AXIS_DESC_SIZE, TEXT_COLOR, (x, PANEL_HEIGHT as i32 / 2 - 10))?;
    }
    for ((panel, legend), h) in panels.iter().zip(&layout.legends).zip(&layout.heights) {
        let (area, below) = rest.split_vertically(*h);
        render_panel(&area, panel, legend)?;
        rest = below;
    }
    Ok(())
}

/// The plot's pixel frame in its panel's coordinates, and the data range it shows.
struct Frame {
    x_range: (f64, f64),
    y_max: f64,
    left: i32,
    top: i32,
    right: i32,
    bottom: i32,
}

impl Frame {
    fn px_x(&self, x: f64) -> i32 {
        let (x0, x1) = self.x_range;
        let f = ((x - x0) / (x1 - x0)).clamp(-10.0, 10.0);
        self.left + (f * f64::from(self.right - self.left)).round() as i32
    }
    fn px_y(&self, y: f64) -> i32 {
        let f = ((self.y_max - y) / self.y_max).clamp(-10.0, 10.0);
        self.top + (f * f64::from(self.bottom - self.top)).round() as i32
    }
    fn px(&self, (x, y): (f64, f64)) -> (i32, i32) {
        (self.px_x(x), self.px_y(y))
    }
    fn rect(&self) -> PxRect {
        PxRect { x0: self.left, y0: self.top, x1: self.right + 1, y1: self.bottom + 1 }
    }
}

/// A label in the plot: its text (one or more variants, e.g. on one line or wrapped onto
/// two), colour and border, and the spots it may take, each with the variant it fits.
struct Label {
    variants: Vec<Vec<String>>,
    color: RGBColor,
    border: Option<RGBColor>,
    anchor: (i32, i32),
    options: Vec<(usize, PxRect)>,
}

/// The spots of a label's variants (its text on one line, on two...; each scored by
/// [`scored_around`]) in one list, each with its variant: best score first, a later variant
/// only where it scores better by more than a few pixels.
fn nearest_first(variants: impl IntoIterator<Item = Vec<(i64, PxRect)>>) -> Vec<(usize, PxRect)> {
    let mut all: Vec<(i64, usize, PxRect)> = Vec::new();
    for (k, options) in variants.into_iter().enumerate() {
        all.extend(options.into_iter().map(|(score, r)| (score + 12 * k as i64, k, r)));
    }
    all.sort_by_key(|o| o.0);
    all.into_iter().map(|o| (o.1, o.2)).collect()
}

/// The size of a label's box holding `lines`.
fn label_size(lines: &[String]) -> (i32, i32) {
    let w = lines.iter().map(|l| text_width(l, LABEL_SIZE)).max().unwrap_or(0);
    (w + 2 * PAD_X, lines.len() as i32 * LINE_HEIGHT + 2 * PAD_Y)
}

fn render_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Prepared,
    legend: &[LegendEntry],
) -> Result<(), String> {
    let (w, _) = area.dim_in_pixel();
    let (chart_area, legend_area) = area.split_horizontally(w.saturating_sub(LEGEND_WIDTH));
    let (cw, _) = chart_area.dim_in_pixel();
    if let Some(c) = fit_px(&p.label, CAPTION_SIZE, cw as i32 - 40) {
        draw_str(area, &c, CAPTION_SIZE, TEXT_COLOR, ((cw as i32 - text_width(&c, CAPTION_SIZE)) / 2, 6))?;
    }
    let (_, chart_body) = chart_area.split_vertically(CAPTION_HEIGHT + STRIP_HEIGHT);
    let (x0, x1) = p.x_range;
    let y_max = p.y_max_gb;
    let y_max_gib = y_max * GB / GIB;

    let mut chart = ChartBuilder::on(&chart_body)
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
    let x_desc =
        if p.event_axis { "allocation order (each allocation in turn: no simulated time passes)" } else { "time (s)" };
    chart
        .configure_mesh()
        .x_desc(x_desc)
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

    let base = area.get_base_pixel();
    let (left, top) = chart.backend_coord(&(x0, y_max));
    let (right, bottom) = chart.backend_coord(&(x1, 0.0));
    let frame = Frame {
        x_range: (x0, x1),
        y_max,
        left: left - base.0,
        top: top - base.1,
        right: right - base.0,
        bottom: bottom - base.1,
    };
    let columns = (frame.right - frame.left).max(1) as usize;

    draw_strip(area, p, &frame)?;

    // Painter's algorithm: each layer is filled from zero up to its cumulative top, topmost
    // first, so lower layers overdraw the part of the upper fill that belongs to them. Each
    // curve is decimated on its own, which keeps every layer boundary's peaks. No outline:
    // strokes between thousands of small steps would paint whole bands their colour.
    let runs = column_runs(&p.times, x0, x1, columns);
    let layer_paths: Vec<Vec<(f64, f64)>> = p
        .layers
        .iter()
        .map(|l| {
            let keep = match &runs {
                Some(r) if l.top_gb.len() == p.times.len() => decimate_runs(&l.top_gb, r),
                _ => decimate(&p.times, &l.top_gb, x0, x1, columns),
            };
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

    // Phase boundaries over the stack, where they are far enough apart to read; step
    // boundaries always.
    let edges = phase_edges(p);
    if !edges.is_empty() && (frame.right - frame.left) / edges.len() as i32 >= MIN_BOUNDARY_SPACING_PX {
        let boundary = RGBAColor(0x30, 0x30, 0x30, 0.30);
        let mut last = i32::MIN / 2;
        for x in edges {
            let px = frame.px_x(x);
            // Nor two boundaries within a few pixels of each other: they would merge into a bar.
            if px - last < MIN_BOUNDARY_GAP_PX {
                continue;
            }
            last = px;
            area.draw(&PathElement::new(vec![(px, frame.top), (px, frame.bottom)], boundary.stroke_width(1)))
                .map_err(draw_err("phase boundaries"))?;
        }
    }
    for s in step_starts(p) {
        let px = frame.px_x(s);
        area.draw(&PathElement::new(vec![(px, frame.top), (px, frame.bottom)], STEP_EDGE_COLOR.stroke_width(2)))
            .map_err(draw_err("step boundaries"))?;
    }

    let mut scene = Scene::new(frame.rect());
    if let Some(path) = layer_paths.last() {
        scene.add_data_top(&path.iter().map(|&pt| frame.px(pt)).collect::<Vec<_>>());
    }
    if let Some(r) = &p.reserved_gb {
        let keep = decimate(&p.times, r, x0, x1, columns);
        let pts = step_points(&p.times, r, &keep, p.step_end);
        scene.add_line(&pts.iter().map(|&pt| frame.px(pt)).collect::<Vec<_>>(), 2);
        chart.draw_series(LineSeries::new(pts, RESERVED_COLOR.stroke_width(2))).map_err(draw_err("reserved line"))?;
    }
    let capacity_drawn = p.capacity_gb > 0.0 && p.capacity_gb <= y_max;
    if capacity_drawn {
        let cap = p.capacity_gb;
        chart
            .draw_series(DashedLineSeries::new(vec![(x0, cap), (x1, cap)], 12, 6, CAPACITY_COLOR.stroke_width(3)))
            .map_err(draw_err("capacity line"))?;
        let y = frame.px_y(cap);
        scene.add_line(&[(frame.left, y), (frame.right, y)], 2);
    }

    // The peak (in an OOM panel too: it may be another op, just before the failure), unless
    // it is the OOM's own point; drawn under the OOM's marks, which stay whole where the two
    // are close (the labels tell them apart).
    let oom_point = p.oom.as_ref().map(|oom| oom_marker(p, &frame, oom));
    let peak_at = p.peak.map(|pt| frame.px(pt)).filter(|&(px, py)| {
        px >= frame.left
            && px <= frame.right
            && oom_point.is_none_or(|(o, _)| (px - o.0).abs() > 2 || (py - o.1).abs() > 2)
    });
    if let Some((px, py)) = peak_at {
        area.draw(&Circle::new((px, py), 7, WHITE.filled()))
            .and_then(|_| area.draw(&Circle::new((px, py), 5, RESERVED_COLOR.filled())))
            .map_err(draw_err("peak mark"))?;
        scene.marks.push(PxRect::at(px - 7, py - 7, 15, 15));
    }
    let oom_at = match &p.oom {
        Some(oom) => Some(draw_oom_marks(area, p, &frame, oom, &mut scene)?),
        None => None,
    };

    // The labels, placed clear of each other, the lines and the data, most important first.
    let mut labels: Vec<Label> = Vec::new();
    let plot_w = frame.right - frame.left;
    if let (Some(oom), Some(anchor)) = (&p.oom, oom_at) {
        // On one line where it fits the plot, else wrapped onto two or three.
        let text = oom_text(oom);
        let mut variants: Vec<Vec<String>> = Vec::new();
        for (width, lines) in [(plot_w - 40, 1), ((plot_w / 2).clamp(160, 460), 3), ((plot_w / 3).clamp(160, 320), 4)] {
            let v = wrap_px(&text, LABEL_SIZE, width, lines);
            if !variants.contains(&v) && (lines > 1 || text_width(&text, LABEL_SIZE) <= width) {
                variants.push(v);
            }
        }
        let left_first = anchor.0 > (frame.left + frame.right) / 2;
        let options = nearest_first(variants.iter().map(|v| scored_around(anchor, label_size(v), left_first)));
        labels.push(Label { variants, color: OOM_COLOR, border: Some(OOM_COLOR), anchor, options });
    }
    if capacity_drawn {
        let lines = vec![format!("capacity {}", fmt_gb(p.capacity_gb))];
        let y = frame.px_y(p.capacity_gb);
        let options = options_along(&frame.rect(), y, label_size(&lines)).into_iter().map(|r| (0, r)).collect();
        let anchor = (frame.left + 8, y);
        labels.push(Label { variants: vec![lines], color: CAPACITY_COLOR, border: None, anchor, options });
    } else if p.capacity_gb > y_max {
        // Zoomed to the data: the legend gives the capacity's share; the plot says where it is.
        let lines = vec![format!("capacity {} is above this plot", fmt_gb(p.capacity_gb))];
        let options =
            options_along(&frame.rect(), frame.top - 1, label_size(&lines)).into_iter().map(|r| (0, r)).collect();
        let anchor = (frame.left + 8, frame.top);
        labels.push(Label { variants: vec![lines], color: CAPACITY_COLOR, border: None, anchor, options });
    }
    if let (Some(anchor), Some((_, gb))) = (peak_at, p.peak) {
        let text = match &p.peak_op {
            Some(op) if !op.is_empty() => format!("peak {} allocated, in {op}", fmt_gb(gb)),
            _ => format!("peak {} allocated", fmt_gb(gb)),
        };
        let two = wrap_px(&text, LABEL_SIZE, (plot_w / 2).clamp(160, 420), 2);
        let left_first = anchor.0 > frame.left + plot_w * 2 / 3;
        let one = vec![text];
        let options = nearest_first([
            scored_around(anchor, label_size(&one), left_first),
            scored_around(anchor, label_size(&two), left_first),
        ]);
        labels.push(Label { variants: vec![one, two], color: TEXT_COLOR, border: None, anchor, options });
    }
    let wants: Vec<Want> =
        labels.iter().map(|l| Want { anchor: l.anchor, options: l.options.iter().map(|o| o.1).collect() }).collect();
    for (label, choice) in labels.iter().zip(place_labels(&scene, &wants)) {
        let Some((k, rect)) = choice.and_then(|i| label.options.get(i)) else { continue };
        draw_label(area, &label.variants[*k], label.color, label.border, *rect, label.anchor)?;
    }

    if p.times.is_empty() {
        let text = "no memory samples";
        let x = (frame.left + frame.right - text_width(text, AXIS_DESC_SIZE)) / 2;
        draw_str(area, text, AXIS_DESC_SIZE, TEXT_COLOR, (x, (frame.top + frame.bottom) / 2 - 10))?;
    }
    draw_legend(&legend_area, legend)
}

/// The OOM's line, marker and failed request's bar; returns the marker's pixel, and records
/// them in `scene` for the labels to keep clear of.
fn draw_oom_marks<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Prepared,
    f: &Frame,
    oom: &OomMark,
    scene: &mut Scene,
) -> Result<(i32, i32), String> {
    let ((tx, ty), total) = oom_marker(p, f, oom);
    area.draw(&PathElement::new(vec![(tx, f.top), (tx, f.bottom)], OOM_COLOR.stroke_width(3)))
        .map_err(draw_err("OOM line"))?;
    scene.marks.push(PxRect { x0: tx - 2, y0: f.top, x1: tx + 3, y1: f.bottom + 1 });
    // The request that failed, as a bar on top of what was allocated: it is what crosses
    // the capacity line (clipped at the top of the plot).
    if oom.requested_bytes > 0 && total > 0.0 {
        let req = oom.requested_bytes as f64 / GB;
        let bar_top = f.px_y((total + req).min(f.y_max));
        let bar = [(tx - 18, bar_top), (tx - 6, ty)];
        area.draw(&Rectangle::new(bar, OOM_COLOR.mix(0.35).filled()))
            .and_then(|_| area.draw(&Rectangle::new(bar, OOM_COLOR.stroke_width(2))))
            .map_err(draw_err("failed request"))?;
        scene.marks.push(PxRect { x0: tx - 19, y0: bar_top - 1, x1: tx - 4, y1: ty + 2 });
    }
    area.draw(&Circle::new((tx, ty), 9, WHITE.filled()))
        .and_then(|_| area.draw(&Circle::new((tx, ty), 7, OOM_COLOR.filled())))
        .and_then(|_| area.draw(&Cross::new((tx, ty), 4, WHITE.stroke_width(2))))
        .map_err(draw_err("OOM marker"))?;
    scene.marks.push(PxRect::at(tx - 10, ty - 10, 21, 21));
    Ok((tx, ty))
}

/// Where the OOM's marker sits (pixels): on what was allocated at that instant (GB, also
/// returned), or on the capacity when that is unknown.
fn oom_marker(p: &Prepared, f: &Frame, oom: &OomMark) -> ((i32, i32), f64) {
    let (x0, x1) = p.x_range;
    let t = oom.time_s.clamp(x0, x1);
    let total = p.layers.last().and_then(|l| value_at(&p.times, &l.top_gb, t)).unwrap_or(0.0);
    let marker_gb = if total > 0.0 { total } else { p.capacity_gb.min(f.y_max) };
    ((f.px_x(t), f.px_y(marker_gb)), total)
}

/// The OOM label's text: callers often phrase it as "OOM: ..." already.
fn oom_text(oom: &OomMark) -> String {
    let label = oom.label.trim();
    if label.is_empty() {
        "OOM".to_string()
    } else if label.to_ascii_lowercase().starts_with("oom") {
        label.to_string()
    } else {
        format!("OOM: {label}")
    }
}

/// A label's box, text and, when it sits away from its mark, a leader line to the mark.
fn draw_label<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    lines: &[String],
    color: RGBColor,
    border: Option<RGBColor>,
    rect: PxRect,
    anchor: (i32, i32),
) -> Result<(), String> {
    let near = rect.nearest(anchor);
    if (near.0 - anchor.0).abs() + (near.1 - anchor.1).abs() > 8 {
        area.draw(&PathElement::new(vec![anchor, near], color.mix(0.8).stroke_width(1)))
            .map_err(draw_err("leader line"))?;
    }
    let corners = [(rect.x0, rect.y0), (rect.x1 - 1, rect.y1 - 1)];
    area.draw(&Rectangle::new(corners, WHITE.mix(0.92).filled())).map_err(draw_err("label box"))?;
    if let Some(b) = border {
        area.draw(&Rectangle::new(corners, b.stroke_width(1))).map_err(draw_err("label box"))?;
    }
    for (k, line) in lines.iter().enumerate() {
        draw_str(area, line, LABEL_SIZE, color, (rect.x0 + PAD_X, rect.y0 + PAD_Y + 1 + k as i32 * LINE_HEIGHT))?;
    }
    Ok(())
}

/// The light tint of a phase in the strip (and its legend swatch), by kind. The strip sits
/// above the plot, so a tint is never read as a memory category.
fn phase_tint(kind: &str) -> RGBColor {
    match kind {
        "forward" => RGBColor(0xD6, 0xEA, 0xF8),
        "backward" => RGBColor(0xFC, 0xE4, 0xC4),
        "optimizer" => RGBColor(0xE4, 0xDA, 0xF1),
        "prefill" => RGBColor(0xD9, 0xEE, 0xD6),
        "decode" => RGBColor(0xF7, 0xDC, 0xE7),
        _ => RGBColor(0xEC, 0xEC, 0xEC),
    }
}

/// The phases with something to show in the x range: (label, start, end), unclipped.
fn visible_phases(p: &Prepared) -> Vec<&(String, f64, f64)> {
    let (x0, x1) = p.x_range;
    p.phases.iter().filter(|(_, a, b)| *b > *a && *b > x0 && *a < x1).collect()
}

/// Phase boundaries strictly inside the x range, ascending.
fn phase_edges(p: &Prepared) -> Vec<f64> {
    let (x0, x1) = p.x_range;
    let mut edges: Vec<f64> =
        visible_phases(p).iter().flat_map(|(_, a, b)| [*a, *b]).filter(|x| *x > x0 && *x < x1).collect();
    edges.sort_by(f64::total_cmp);
    edges.dedup();
    edges
}

/// Where a training step begins inside the x range (a step's start after the first phase
/// of the timeline).
fn step_starts(p: &Prepared) -> Vec<f64> {
    let (x0, x1) = p.x_range;
    let all: Vec<(usize, &(String, f64, f64))> = p.phases.iter().enumerate().collect();
    let first = p.phases.iter().map(|ph| ph.1).fold(f64::INFINITY, f64::min);
    step_spans(&all).iter().map(|s| s.1).filter(|&s| s > first && s > x0 && s < x1).collect()
}

/// The phase strip above the plot: a bar of the phases in their tints with their names where
/// they fit (a short optimizer / prefill phase's name beside it, with an arrow), and above it
/// each training step's label at the line where the step begins ("step 2 (from t = 0.72 s)"
/// for one that began before the plot's window).
fn draw_strip<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Prepared, f: &Frame) -> Result<(), String> {
    let (x0, x1) = p.x_range;
    let top = CAPTION_HEIGHT as i32;
    let (bar_top, bar_bottom) = (top + STRIP_BAR_TOP, top + STRIP_BAR_TOP + STRIP_BAR_HEIGHT);
    let phases = visible_phases(p);
    let err = draw_err("phase strip");
    area.draw(&Rectangle::new([(f.left, bar_top), (f.right, bar_bottom)], RGBColor(0xF8, 0xF8, 0xF8).filled()))
        .map_err(&err)?;
    let span_px = |a: f64, b: f64| {
        let pa = f.px_x(a.max(x0));
        (pa, f.px_x(b.min(x1)).max(pa + 1))
    };
    for (label, a, b) in &phases {
        let (pa, pb) = span_px(*a, *b);
        area.draw(&Rectangle::new([(pa, bar_top), (pb, bar_bottom)], phase_tint(phase_parts(label).0).filled()))
            .map_err(&err)?;
    }
    area.draw(&Rectangle::new([(f.left, bar_top), (f.right, bar_bottom)], RGBColor(0xBB, 0xBB, 0xBB).stroke_width(1)))
        .map_err(&err)?;

    // Names inside their bands first, then the short phases' names beside theirs.
    const GAP: i32 = 8;
    let mut taken: Vec<(i32, i32)> = Vec::new();
    let free = |taken: &[(i32, i32)], a: i32, b: i32| {
        a >= f.left + 2 && b <= f.right - 2 && taken.iter().all(|&(ta, tb)| b + GAP <= ta || a >= tb + GAP)
    };
    let text_y = bar_top + (STRIP_BAR_HEIGHT - STRIP_SIZE as i32) / 2 - 1;
    let mut spill: Vec<(&str, i32, i32)> = Vec::new();
    for (label, a, b) in &phases {
        let name = phase_parts(label).0;
        let (pa, pb) = span_px(*a, *b);
        let w = text_width(name, STRIP_SIZE);
        let left = (pa + pb) / 2 - w / 2;
        if w + 6 <= pb - pa && free(&taken, left, left + w) {
            draw_str(area, name, STRIP_SIZE, TEXT_COLOR, (left, text_y))?;
            taken.push((left, left + w));
        } else if !matches!(name, "forward" | "backward") {
            spill.push((name, pa, pb));
        }
    }
    for (name, pa, pb) in spill {
        let after = format!("← {name}");
        let before = format!("{name} →");
        let (wa, wb) = (text_width(&after, STRIP_SIZE), text_width(&before, STRIP_SIZE));
        if free(&taken, pb + 3, pb + 3 + wa) {
            draw_str(area, &after, STRIP_SIZE, TEXT_COLOR, (pb + 3, text_y))?;
            taken.push((pb + 3, pb + 3 + wa));
        } else if free(&taken, pa - 3 - wb, pa - 3) {
            draw_str(area, &before, STRIP_SIZE, TEXT_COLOR, (pa - 3 - wb, text_y))?;
            taken.push((pa - 3 - wb, pa - 3));
        }
    }

    // Step labels at the line where each step begins.
    let all: Vec<(usize, &(String, f64, f64))> = p.phases.iter().enumerate().collect();
    let decimals = tick_decimals(x0, x1, X_TICKS) + 1;
    let steps: Vec<(u32, f64, f64)> = step_spans(&all).into_iter().filter(|&(_, a, b)| b > x0 && a < x1).collect();
    for (k, &(step, a, _)) in steps.iter().enumerate() {
        let began_before = a < x0 - (x1 - x0) * 1e-9;
        let sp = f.px_x(a.max(x0));
        if !began_before {
            area.draw(&PathElement::new(
                vec![(sp, top + STRIP_STEP_ROW), (sp, bar_bottom)],
                STEP_EDGE_COLOR.stroke_width(2),
            ))
            .map_err(&err)?;
        }
        // Each label ends before the next step's line.
        let limit = steps.get(k + 1).map_or(f.right, |next| f.px_x(next.1) - GAP);
        let mut texts = vec![format!("step {step}")];
        if began_before {
            let from = if a == 0.0 { "0".to_string() } else { fmt_num(a, decimals) };
            texts.insert(0, format!("step {step} (from t = {from} s)"));
        }
        let x = sp + 5;
        if let Some(text) = texts.into_iter().find(|t| x + text_width(t, STRIP_SIZE) <= limit) {
            draw_str(area, &text, STRIP_SIZE, TEXT_COLOR, (x, top + STRIP_STEP_ROW))?;
        }
    }
    Ok(())
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

/// A training run's steps as (step, start, end) over its phases; empty for a job without
/// forward, backward or optimizer phases (inference: prefill and decode), whose numbered
/// phases are not steps.
fn step_spans(phases: &[(usize, &(String, f64, f64))]) -> Vec<(u32, f64, f64)> {
    let training = phases.iter().any(|(_, (l, _, _))| matches!(phase_parts(l).0, "forward" | "backward" | "optimizer"));
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

/// A legend entry's mark.
#[derive(Debug, Clone, PartialEq)]
enum Swatch {
    /// A memory category's fill.
    Fill(RGBColor),
    /// A phase's tint in the strip.
    Tint(RGBColor),
    /// A line, dashed or not.
    Line(RGBColor, bool),
    /// The line where a training step begins.
    Edge,
    /// The OOM's marker.
    Marker,
    /// No mark: a note.
    Note,
}

/// One legend entry: its mark, its text already wrapped, and the text's colour.
#[derive(Debug, Clone)]
struct LegendEntry {
    swatch: Swatch,
    lines: Vec<String>,
    color: RGBColor,
}

const LEGEND_TOP: i32 = (CAPTION_HEIGHT + STRIP_HEIGHT) as i32 + 16;
/// An entry's first line, and each further one.
const LEGEND_ROW: i32 = 22;
const LEGEND_WRAP: i32 = 18;
const LEGEND_TEXT_X: i32 = 40;
const LEGEND_TEXT_PX: i32 = LEGEND_WIDTH as i32 - LEGEND_TEXT_X - 6;

fn entry_height(e: &LegendEntry) -> i32 {
    LEGEND_ROW + LEGEND_WRAP * (e.lines.len().max(1) as i32 - 1)
}

/// A panel tall enough for its legend (every category drawn is listed), within bounds.
fn panel_height(entries: &[LegendEntry]) -> u32 {
    let needed = LEGEND_TOP + entries.iter().map(entry_height).sum::<i32>() + 16;
    (needed.max(0) as u32).clamp(PANEL_HEIGHT, MAX_PANEL_HEIGHT)
}

/// The legend of a panel: the capacity and reserved lines, every category drawn (top of the
/// stack first, as in the picture), the OOM, the phase tints of the strip, the step line,
/// and what the rank keeps in host memory.
fn legend_entries(p: &Prepared) -> Vec<LegendEntry> {
    let entry = |swatch: Swatch, text: &str, lines: usize, color: RGBColor| LegendEntry {
        swatch,
        lines: wrap_px(text, LABEL_SIZE, LEGEND_TEXT_PX, lines),
        color,
    };
    let mut out = Vec::new();
    if p.capacity_gb > p.y_max_gb {
        // The peak the plot marks (the run's, from the report), else the highest drawn.
        let peak = p.peak.or_else(|| peak_of(p)).map_or(0.0, |x| x.1);
        let reserved = p.reserved_gb.as_ref().map_or(0.0, |r| r.iter().copied().fold(0.0, f64::max));
        let text = format!(
            "capacity {}: above this plot; the peak allocates {:.0}% of it, the allocator reserves {:.0}%",
            fmt_gb(p.capacity_gb),
            100.0 * peak / p.capacity_gb,
            100.0 * reserved / p.capacity_gb
        );
        out.push(entry(Swatch::Line(CAPACITY_COLOR, true), &text, 3, CAPACITY_COLOR));
    } else if p.capacity_gb > 0.0 {
        out.push(entry(
            Swatch::Line(CAPACITY_COLOR, true),
            &format!("capacity {}", fmt_gb(p.capacity_gb)),
            2,
            TEXT_COLOR,
        ));
    }
    if p.reserved_gb.is_some() {
        out.push(entry(Swatch::Line(RESERVED_COLOR, false), "allocator reserved", 1, TEXT_COLOR));
    }
    for l in p.layers.iter().rev() {
        out.push(entry(Swatch::Fill(l.color), &l.name, 2, TEXT_COLOR));
    }
    if let Some(o) = &p.oom {
        let bar = if o.requested_bytes > 0 { "; the bar: the request that failed" } else { "" };
        let text = if p.event_axis {
            format!("out of memory at allocation {} (no simulated time had passed){bar}", fmt_num(o.time_s, 0))
        } else {
            let decimals = tick_decimals(p.x_range.0, p.x_range.1, X_TICKS) + 1;
            format!("out of memory at {} s{bar}", fmt_num(o.time_s, decimals))
        };
        out.push(entry(Swatch::Marker, &text, 3, TEXT_COLOR));
    }
    if !p.event_axis {
        let mut kinds: Vec<&str> = Vec::new();
        for (label, _, _) in visible_phases(p) {
            let kind = phase_parts(label).0;
            if !kind.is_empty() && !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        for kind in kinds {
            let name = if kind == "optimizer" { "optimizer step" } else { kind };
            out.push(entry(Swatch::Tint(phase_tint(kind)), &format!("phase: {name} (strip above)"), 1, TEXT_COLOR));
        }
        if !step_starts(p).is_empty() {
            out.push(entry(Swatch::Edge, "a new training step begins", 1, TEXT_COLOR));
        }
    }
    if let Some(note) = &p.host_note {
        out.push(entry(Swatch::Note, note, 6, NOTE_COLOR));
    }
    out
}

/// Legend outside the plot, so it can never hide the peak it explains.
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, entries: &[LegendEntry]) -> Result<(), String> {
    let (_, h) = area.dim_in_pixel();
    let bottom = h as i32 - 12;
    let err = draw_err("legend");
    // `y` is the middle of an entry's first line.
    let mut y = LEGEND_TOP;
    for (k, e) in entries.iter().enumerate() {
        let entry_h = entry_height(e);
        // Only a caller's own very long list of series gets here: say how many are left.
        let needed = if k + 1 == entries.len() { entry_h } else { entry_h + LEGEND_ROW };
        if y + needed > bottom {
            let more = format!("… {} more", entries.len() - k);
            draw_str(area, &more, LABEL_SIZE, TEXT_COLOR, (LEGEND_TEXT_X, y - 10))?;
            break;
        }
        match &e.swatch {
            Swatch::Fill(c) => area
                .draw(&Rectangle::new([(10, y - 7), (32, y + 7)], c.filled()))
                .and_then(|_| area.draw(&Rectangle::new([(10, y - 7), (32, y + 7)], darken(*c).stroke_width(1)))),
            Swatch::Tint(c) => area.draw(&Rectangle::new([(6, y - 5), (36, y + 5)], c.filled())).and_then(|_| {
                area.draw(&Rectangle::new([(6, y - 5), (36, y + 5)], RGBColor(0xBB, 0xBB, 0xBB).stroke_width(1)))
            }),
            Swatch::Edge => {
                area.draw(&PathElement::new(vec![(21, y - 9), (21, y + 9)], STEP_EDGE_COLOR.stroke_width(2)))
            }
            Swatch::Line(c, true) => area
                .draw(&PathElement::new(vec![(8, y), (16, y)], c.stroke_width(3)))
                .and_then(|_| area.draw(&PathElement::new(vec![(24, y), (34, y)], c.stroke_width(3)))),
            Swatch::Line(c, false) => area.draw(&PathElement::new(vec![(8, y), (34, y)], c.stroke_width(2))),
            Swatch::Marker => area
                .draw(&PathElement::new(vec![(21, y - 10), (21, y + 10)], OOM_COLOR.stroke_width(3)))
                .and_then(|_| area.draw(&Circle::new((21, y), 7, OOM_COLOR.filled()))),
            Swatch::Note => Ok(()),
        }
        .map_err(&err)?;
        for (i, line) in e.lines.iter().enumerate() {
            draw_str(area, line, LABEL_SIZE, e.color, (LEGEND_TEXT_X, y - 10 + i as i32 * LEGEND_WRAP))?;
        }
        y += entry_h;
    }
    Ok(())
}

fn darken(c: RGBColor) -> RGBColor {
    RGBColor((c.0 as f64 * 0.75) as u8, (c.1 as f64 * 0.75) as u8, (c.2 as f64 * 0.75) as u8)
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
            peak_time_s: None,
            window_s: None,
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
            note: None,
            panels: vec![panel("rank class 0", 500, false), panel("rank class 1", 300, true)],
        };
        assert_eq!(write_memory_png(&path, plot.clone()), Ok(()));
        assert_png(&path);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// memory.png's panels are drawn in bands on every core: the file is the one a single
    /// canvas, drawn panel after panel, gives (long labels and an OOM mark included).
    #[test]
    fn panels_drawn_apart_make_the_single_canvas_picture() {
        let dir = scratch("bands");
        let mut long = panel(&"stage 3 (ranks 24-31): layers 24-31 + LM head and loss ".repeat(4), 400, true);
        long.peak_op = Some("layers.31.mlp.c_fc (micro-batch 7)".into());
        let plot = MemoryPlot {
            title: "bands".into(),
            note: Some("a note long enough to wrap onto a second line of the head ".repeat(6)),
            panels: vec![panel("rank class 0", 500, false), long, panel("rank class 2", 50, true)],
        };
        let (bands, canvas) = (dir.join("bands.png"), dir.join("canvas.png"));
        assert_eq!(write_memory_png(&bands, plot.clone()), Ok(()));
        let panels = prepared(plot.clone()).unwrap();
        let layout = layout(plot.note.as_deref(), &panels);
        let root = BitMapBackend::new(&canvas, layout.size).into_drawing_area();
        draw_figure(&root, &plot.title, &layout, &panels).unwrap();
        root.present().unwrap();
        drop(root);
        assert_png(&bands);
        assert!(std::fs::read(&bands).unwrap() == std::fs::read(&canvas).unwrap(), "the pictures differ");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        let dir = scratch("degenerate");
        let mut cases: Vec<MemoryPlot> = vec![MemoryPlot { title: String::new(), note: None, panels: vec![] }];
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
            peak_time_s: None,
            window_s: None,
        };
        cases.push(MemoryPlot { title: "empty panel".into(), note: None, panels: vec![empty.clone()] });
        let mut single = panel("single", 1, true);
        single.phases.clear();
        cases.push(MemoryPlot { title: "single".into(), note: None, panels: vec![single] });
        let mut flat = panel("same time", 50, true);
        flat.times_s = vec![3.0; 50];
        cases.push(MemoryPlot { title: "flat".into(), note: None, panels: vec![flat] });
        let mut zeros = panel("zeros", 20, false);
        zeros.bytes.iter_mut().for_each(|s| s.iter_mut().for_each(|b| *b = 0));
        zeros.reserved = None;
        zeros.capacity_bytes = 0;
        cases.push(MemoryPlot { title: "zeros".into(), note: None, panels: vec![zeros] });
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
        cases.push(MemoryPlot { title: "T".repeat(1000), note: None, panels: vec![weird] });
        let mut mismatched = panel("mismatched", 10, false);
        mismatched.bytes[1].pop();
        cases.push(MemoryPlot { title: "bad".into(), note: None, panels: vec![mismatched] });

        for (i, plot) in cases.iter().enumerate() {
            let path = dir.join(format!("case{i}.png"));
            let r = write_memory_png(&path, plot.clone());
            if r.is_ok() {
                assert_png(&path);
            }
        }
        let mismatch = cases.last().map(|p| write_memory_png(&dir.join("m.png"), p.clone()));
        assert!(matches!(mismatch, Some(Err(_))));
        // A directory that does not exist is an error, not a panic.
        let missing = dir.join("no/such/dir/x.png");
        assert!(write_memory_png(&missing, cases[1].clone()).is_err());
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
        let prepared = prepare_panel(0, p.clone(), &colors).unwrap();
        let (t, gb) = peak_of(&prepared).unwrap();
        let stacked: u64 = (0..3).map(|c| p.bytes[c][5]).sum::<u64>() + 40_000_000_000;
        assert!((t - 0.05).abs() < 1e-12, "{t}");
        assert!((gb - stacked as f64 / GB).abs() < 1e-9, "{gb}");
        // An empty panel has no peak to mark.
        let mut empty = panel("empty", 0, false);
        empty.phases.clear();
        assert!(peak_of(&prepare_panel(0, empty.clone(), &colors).unwrap()).is_none());
    }

    #[test]
    fn the_y_axis_follows_a_small_job_and_keeps_capacity_in_view_otherwise() {
        let small = panel("small", 50, false);
        let colors = category_colors(std::slice::from_ref(&small));
        let p = prepare_panel(0, small.clone(), &colors).unwrap();
        let data = p.layers.last().unwrap().top_gb.iter().copied().fold(0.0, f64::max);
        assert!(p.y_max_gb < p.capacity_gb && p.y_max_gb >= data, "{} vs {data}", p.y_max_gb);
        let mut big = panel("big", 50, false);
        big.capacity_bytes = 40_000_000_000;
        let p = prepare_panel(0, big.clone(), &colors).unwrap();
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
        let plot = MemoryPlot { title: "big".into(), note: None, panels: vec![panel("100k", 100_000, true)] };
        let start = std::time::Instant::now();
        assert_eq!(write_memory_png(&path, plot.clone()), Ok(()));
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

    /// Renders a figure into memory as [`write_memory_png`] would: (RGB bytes, width, height).
    fn render_rgb(plot: &MemoryPlot) -> (Vec<u8>, u32, u32) {
        ensure_font().unwrap();
        let colors = category_colors(&plot.panels);
        let panels: Vec<Prepared> =
            plot.panels.iter().enumerate().map(|(i, p)| prepare_panel(i, p.clone(), &colors).unwrap()).collect();
        let layout = layout(plot.note.as_deref(), &panels);
        let (w, h) = layout.size;
        let mut buf = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            draw_figure(&root, &plot.title, &layout, &panels).unwrap();
            root.present().unwrap();
        }
        (buf, w, h)
    }

    /// A training panel with every memory category, an OOM, steps and a host note.
    /// A panel whose times are all finite and in order is stacked in place (no index, no
    /// copy of its series); one that needs sorting goes through the index. Both give the same
    /// curves: here the same panel with a NaN-timed sample appended (dropped) and one sample
    /// moved out of place (sorted back).
    #[test]
    fn panels_in_order_and_out_of_order_stack_the_same_curves() {
        let p = full_panel(300);
        let mut q = p.clone();
        q.times_s.push(f64::NAN);
        q.bytes.iter_mut().for_each(|b| b.push(7));
        q.reserved.as_mut().unwrap().push(7);
        let (a, b) = (q.times_s.len() - 2, 100);
        q.times_s.swap(a, b);
        q.bytes.iter_mut().for_each(|s| s.swap(a, b));
        q.reserved.as_mut().unwrap().swap(a, b);
        let colors = category_colors(std::slice::from_ref(&p));
        let (x, y) = (prepare_panel(0, p, &colors).unwrap(), prepare_panel(0, q, &colors).unwrap());
        assert_eq!(x.times, y.times);
        assert_eq!(x.reserved_gb, y.reserved_gb);
        assert_eq!(x.layers.len(), y.layers.len());
        for (l, m) in x.layers.iter().zip(&y.layers) {
            assert_eq!((&l.name, &l.top_gb), (&m.name, &m.top_gb));
        }
    }

    fn full_panel(n: usize) -> RankPanel {
        let cats: Vec<String> = Category::ALL.iter().map(|c| c.label().to_string()).collect();
        let bytes = (0..cats.len())
            .map(|c| (0..n).map(|i| 300_000_000 + (c as u64 * 7 + i as u64) % 13 * 20_000_000).collect())
            .collect();
        let t = |i: usize| i as f64 * 0.01;
        let ph = |l: &str, a: usize, b: usize| PhaseSpan { label: l.to_string(), start_s: t(a), end_s: t(b) };
        RankPanel {
            label: "every category".into(),
            capacity_bytes: 12_000_000_000,
            categories: cats,
            times_s: (0..n).map(t).collect(),
            bytes,
            reserved: Some(vec![11_000_000_000; n]),
            phases: vec![
                ph("forward 1", 0, n / 4),
                ph("backward 1", n / 4, n / 2),
                ph("optimizer 1", n / 2, n / 2 + 5),
                ph("forward 2", n / 2 + 5, 3 * n / 4),
                ph("backward 2", 3 * n / 4, n),
            ],
            oom: Some(OomMark {
                time_s: t(n - 1),
                label: "OOM: c_proj in backward (+1 GB)".into(),
                requested_bytes: 1_000_000_000,
            }),
            host_note: Some(
                "in host memory, not on the GPU: 200 GB per GPU (FP32 master partition + optimizer state)".into(),
            ),
            peak_op: Some("`logits.float`".into()),
            peak_time_s: Some(t(n / 3)),
            window_s: None,
        }
    }

    #[test]
    fn the_legend_lists_every_category_drawn_in_its_own_colour() {
        let p = full_panel(200);
        let colors = category_colors(std::slice::from_ref(&p));
        let prepared = prepare_panel(0, p.clone(), &colors).unwrap();
        assert_eq!(prepared.layers.len(), Category::COUNT);
        let entries = legend_entries(&prepared);
        for (layer, cat) in prepared.layers.iter().zip(Category::ALL) {
            let own = CATEGORY_COLORS.iter().find(|(c, _)| *c == cat).map(|(_, col)| *col);
            let listed = entries.iter().find(|e| e.swatch == Swatch::Fill(layer.color));
            assert!(listed.is_some_and(|e| e.lines.join(" ") == layer.name), "{} is not in the legend", layer.name);
            assert_eq!(Some(layer.color), own, "{}", layer.name);
        }
        // The panel is tall enough for all of it: nothing is cut to "… N more".
        let needed = LEGEND_TOP + entries.iter().map(entry_height).sum::<i32>() + 16;
        assert!(panel_height(&entries) as i32 >= needed, "{} < {needed}", panel_height(&entries));
        // The host note and the phases' tints are there too.
        assert!(entries.iter().any(|e| e.swatch == Swatch::Note));
        for kind in ["forward", "backward", "optimizer"] {
            assert!(entries.iter().any(|e| e.swatch == Swatch::Tint(phase_tint(kind))), "{kind}");
        }
    }

    #[test]
    fn a_run_at_one_instant_is_drawn_in_allocation_order() {
        // Weights loading: every sample at t = 0, then the OOM.
        let n = 40;
        let mut p = panel("weights", n, true);
        p.times_s = vec![0.0; n];
        p.phases = vec![PhaseSpan { label: "init".into(), start_s: 0.0, end_s: 0.0 }];
        p.bytes[0] = (0..n as u64).map(|i| i * 2_000_000_000).collect();
        for series in p.bytes.iter_mut().skip(1) {
            series.iter_mut().for_each(|b| *b = 1_000_000_000);
        }
        if let Some(o) = p.oom.as_mut() {
            o.time_s = 0.0;
        }
        let colors = category_colors(std::slice::from_ref(&p));
        let prepared = prepare_panel(0, p.clone(), &colors).unwrap();
        assert!(prepared.event_axis);
        let (x0, x1) = prepared.x_range;
        assert!(x0 <= 0.0 && x1 >= n as f64, "{x0}..{x1}");
        assert!(prepared.times.windows(2).all(|w| w[1] - w[0] == 1.0), "one step per allocation");
        assert_eq!(prepared.oom.as_ref().map(|o| o.time_s), Some(n as f64), "the OOM after the last allocation");
        assert!(prepared.phases[0].0.starts_with("initialisation: allocations in order, no simulated time passes"));
        // The ramp is drawn: the stacked total climbs over the axis.
        let top = &prepared.layers.last().unwrap().top_gb;
        assert!(top.windows(2).all(|w| w[1] > w[0]));
        let entries = legend_entries(&prepared);
        assert!(entries.iter().any(|e| e.lines.join(" ").contains(&format!("out of memory at allocation {n}"))));
        assert!(render_rgb(&MemoryPlot { title: "weights".into(), note: None, panels: vec![p] }).2 > 0);
    }

    #[test]
    fn a_window_shows_its_span_and_keeps_whole_steps() {
        let mut p = full_panel(200);
        p.oom = None;
        p.window_s = Some((1.2, 1.9));
        let colors = category_colors(std::slice::from_ref(&p));
        let prepared = prepare_panel(0, p.clone(), &colors).unwrap();
        assert_eq!(prepared.x_range, (1.2, 1.9));
        // Step 2 began at 1.05, before the window: its start is still known for its label.
        let all: Vec<(usize, &(String, f64, f64))> = prepared.phases.iter().enumerate().collect();
        let steps = step_spans(&all);
        assert!(steps.iter().any(|s| s.0 == 2 && s.1 < 1.2), "{steps:?}");
        // The peak at 0.66 s is outside the window: not marked there.
        assert!(prepared.peak.is_none());
    }

    #[test]
    fn an_oom_panel_marks_the_peak_too_when_it_is_elsewhere() {
        let p = full_panel(200);
        let colors = category_colors(std::slice::from_ref(&p));
        let prepared = prepare_panel(0, p.clone(), &colors).unwrap();
        let (t, gb) = prepared.peak.expect("the peak is marked beside the OOM");
        assert!((t - 0.66).abs() < 1e-12, "{t}");
        assert!(gb > 0.0);
    }

    fn lcg(seed: &mut u64, m: i32) -> i32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 33) % m.max(1) as u64) as i32
    }

    #[test]
    fn placed_labels_keep_clear_of_each_other_the_axes_and_the_lines() {
        let plot = PxRect { x0: 100, y0: 60, x1: 960, y1: 440 };
        let mut seed = 7u64;
        for case in 0..60 {
            let mut scene = Scene::new(plot);
            let cap = plot.y0 + 40 + lcg(&mut seed, 60);
            scene.add_line(&[(plot.x0, cap), (plot.x1 - 1, cap)], 2);
            // A stepped reserved line below the capacity, the data below it.
            let (mut line, mut data) = (Vec::new(), Vec::new());
            let mut y = plot.y1 - 20;
            for x in (plot.x0..plot.x1).step_by(43) {
                line.push((x, y));
                data.push((x, y + 15));
                y = (y - lcg(&mut seed, 25)).max(cap + 30);
                line.push((x, y));
                data.push((x, y + 15));
            }
            scene.add_line(&line, 2);
            scene.add_data_top(&data);
            let marks = (0..3)
                .map(|_| (plot.x0 + 20 + lcg(&mut seed, 820), cap + 30 + lcg(&mut seed, 200)))
                .collect::<Vec<_>>();
            for &(x, y) in &marks {
                scene.marks.push(PxRect::at(x - 7, y - 7, 15, 15));
            }
            let wants: Vec<Want> = marks
                .iter()
                .map(|&a| {
                    let size = (140 + lcg(&mut seed, 260), 26 + 20 * lcg(&mut seed, 2));
                    Want { anchor: a, options: options_around(a, size, lcg(&mut seed, 2) == 0) }
                })
                .collect();
            let chosen = place_labels(&scene, &wants);
            let boxes: Vec<PxRect> = chosen.iter().zip(&wants).map(|(c, w)| w.options[c.expect("placed")]).collect();
            for (i, b) in boxes.iter().enumerate() {
                assert!(plot.contains(b), "case {case}: label {i} {b:?} reaches the axes");
                for (j, o) in boxes[..i].iter().enumerate() {
                    assert!(!b.intersects(o), "case {case}: labels {j} and {i} overlap: {o:?} {b:?}");
                }
                assert!(!scene.marks.iter().any(|m| m.intersects(b)), "case {case}: label {i} covers a mark");
                assert!(scene.cost(b, &[]) < 2, "case {case}: label {i} {b:?} crosses a line");
            }
        }
    }

    #[test]
    fn a_label_moves_off_a_line_and_off_the_data_when_there_is_room() {
        let plot = PxRect { x0: 0, y0: 0, x1: 600, y1: 400 };
        let mut scene = Scene::new(plot);
        scene.add_line(&[(0, 100), (599, 100)], 2);
        scene.add_data_top(&[(0, 300), (599, 300)]);
        // Its nearest spots straddle the line.
        let a = (300, 112);
        let want = Want { anchor: a, options: options_around(a, (200, 26), false) };
        let r = want.options[place_labels(&scene, std::slice::from_ref(&want))[0].unwrap()];
        assert_eq!(scene.cost(&r, &[]), 0, "{r:?}");
        assert!(r.y1 + 2 <= 98 || r.y0 - 2 > 102, "{r:?} crosses the line");
        assert!(r.y1 + 2 <= 300, "{r:?} covers the data");
    }

    #[test]
    fn no_phase_tint_inside_the_plot() {
        // The phases' tints live in the strip above the plot: no pixel below it (left of the
        // legend) has one, so no background reads as a memory category.
        let (buf, w, h) = render_rgb(&MemoryPlot { title: "tints".into(), note: None, panels: vec![full_panel(300)] });
        let tints: Vec<(u8, u8, u8)> =
            ["forward", "backward", "optimizer"].iter().map(|k| phase_tint(k)).map(|c| (c.0, c.1, c.2)).collect();
        let top = TITLE_HEIGHT + CAPTION_HEIGHT + STRIP_HEIGHT;
        let mut in_strip = 0;
        for y in 0..h {
            for x in 0..w - LEGEND_WIDTH {
                let i = ((y * w + x) * 3) as usize;
                if tints.contains(&(buf[i], buf[i + 1], buf[i + 2])) {
                    assert!(y < top, "a phase tint at ({x}, {y}), inside the plot");
                    in_strip += 1;
                }
            }
        }
        assert!(in_strip > 1000, "the strip shows the phases");
    }

    #[test]
    fn a_space_after_j_is_as_wide_as_any_other() {
        // plotters' text drops each glyph's side bearing, which narrowed the space after a
        // "j": "OOM: layers.79.mlp.c_proj in backward" read "c_projin".
        ensure_font().unwrap();
        const T: &str = "OOM: layers.79.mlp.c_proj in backward (+0.84 GB (0.78 GiB))";
        let (w, h) = (520u32, 30u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            draw_str(&root, T, LABEL_SIZE, OOM_COLOR, (4, 4)).unwrap();
            root.present().unwrap();
        }
        let inked = |x: i32| (0..h).any(|y| buf[((y * w + x as u32) * 3 + 1) as usize] < 170);
        // The widest run of blank columns around the space after `prefix`.
        let gap = |prefix: &str| {
            let at = 4 + text_width(prefix, LABEL_SIZE);
            let (mut best, mut run) = (0, 0);
            for x in at - 3..=4 + text_width(&format!("{prefix} "), LABEL_SIZE) + 3 {
                run = if inked(x) { 0 } else { run + 1 };
                best = best.max(run);
            }
            best
        };
        let after_j = gap("OOM: layers.79.mlp.c_proj");
        let after_n = gap("OOM: layers.79.mlp.c_proj in");
        assert!(
            after_j + 1 >= after_n && after_j >= 4,
            "the space after \"c_proj\" is {after_j} px, after \"in\" {after_n} px"
        );
        // And the text ends where its measured width says.
        assert!(inked(4 + text_width(T, LABEL_SIZE) - 3));
        assert!(!(4 + text_width(T, LABEL_SIZE) + 2..w as i32).any(inked));
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

    #[test]
    fn the_same_plot_gives_the_same_bytes() {
        let dir = scratch("same");
        let plot = MemoryPlot { title: "same".into(), note: Some("a note".into()), panels: vec![full_panel(300)] };
        let (a, b) = (dir.join("a.png"), dir.join("b.png"));
        assert_eq!(write_memory_png(&a, plot.clone()), Ok(()));
        assert_eq!(write_memory_png(&b, plot.clone()), Ok(()));
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
