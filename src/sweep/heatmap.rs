//! `heatmap.png`: the answer's grid over two axes. A cell where something fits is coloured by
//! the colour metric of its best configuration (by the objective) and says the value and, on
//! a second line, that configuration's values on the other axes; a cell where nothing fits is
//! red, darker the earlier it fails (init, forward, backward, optimizer) and says that phase.
//!
//! The colour scale runs from 0 (or the lowest value, when one is negative) to a round number
//! at or above the highest, so equal differences look equal; the colour bar beside the grid
//! has numbered ticks, the metric's unit and which way is better, and marks the range the
//! cells span. The picture is sized to what it holds (the grid, the legend, the captions),
//! everything is laid out by [`plan`] before anything is drawn, and the image is rendered to a
//! temporary name and renamed into place.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::answer::{cell_text, short_number, Answer, CellState, Grid, GridAxis};
use crate::report::png::{ensure_font, FONT};

const TEXT: RGBColor = RGBColor(0x20, 0x20, 0x20);
const MUTED: RGBColor = RGBColor(0x4a, 0x4a, 0x4a);
const GRID: RGBColor = RGBColor(0xff, 0xff, 0xff);
const EMPTY: RGBColor = RGBColor(0xee, 0xee, 0xee);
const BEST: RGBColor = RGBColor(0xff, 0x7f, 0x00);

/// Font sizes (pixels). The captions are as large as the axis names.
const TITLE: f64 = 22.0;
const CAPTION: f64 = 16.0;
const AXIS_NAME: f64 = 16.0;
const TICK: f64 = 14.0;
const LEGEND: f64 = 14.0;
const VALUE: f64 = 15.0;
const VALUE_MIN: f64 = 9.0;
/// The winner's other axis values: preferred and smallest size.
const WINNER: f64 = 13.0;
const WINNER_MIN: f64 = 11.0;
const PAD: i32 = 16;
/// Space between the grid and the legend.
const GAP: i32 = 36;
const BAR_W: i32 = 22;

/// OOM colours by phase: the earlier it fails, the darker.
fn oom_color(phase: &str) -> RGBColor {
    match phase {
        "init" => RGBColor(0x6b, 0x0f, 0x1a),
        "forward" => RGBColor(0xa3, 0x1d, 0x2b),
        "backward" => RGBColor(0xd6, 0x45, 0x4f),
        _ => RGBColor(0xf0, 0x8a, 0x8f),
    }
}

const PHASES: [&str; 4] = ["init", "forward", "backward", "optimizer"];

/// Viridis, sampled at nine stops (matplotlib's `viridis`).
const VIRIDIS: [(u8, u8, u8); 9] = [
    (0x44, 0x01, 0x54),
    (0x47, 0x2c, 0x7a),
    (0x3b, 0x51, 0x8b),
    (0x2c, 0x71, 0x8e),
    (0x21, 0x90, 0x8d),
    (0x27, 0xad, 0x81),
    (0x5c, 0xc8, 0x63),
    (0xaa, 0xdc, 0x32),
    (0xfd, 0xe7, 0x25),
];

fn viridis(t: f64) -> RGBColor {
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.5 };
    let x = t * (VIRIDIS.len() - 1) as f64;
    let i = (x.floor() as usize).min(VIRIDIS.len() - 2);
    let f = x - i as f64;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    let mix = |p: u8, q: u8| (p as f64 + (q as f64 - p as f64) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

fn luminance(c: RGBColor) -> f64 {
    0.2126 * c.0 as f64 + 0.7152 * c.1 as f64 + 0.0722 * c.2 as f64
}

/// Writes the heatmap of `answer` to `path` (a `.png`).
pub fn write(path: &Path, answer: &Answer) -> Result<(), String> {
    ensure_font()?;
    crate::report::png::render_atomically(path, "heatmap", |tmp| render(tmp, answer))
}

fn font(size: f64) -> TextStyle<'static> {
    (FONT, size).into_font().color(&TEXT)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing the heatmap failed: {e}")
}

/// Width of `text` in pixels at `size` (0 when the font cannot lay it out).
fn text_w(text: &str, size: f64) -> i32 {
    font(size).font.box_size(text).map_or(0, |(w, _)| w as i32)
}

/// The largest size in `size` down to `min` (whole pixels) at which `text` fits `width`.
fn fitted(text: &str, size: f64, min: f64, width: i32) -> Option<f64> {
    let mut s = size;
    while s >= min {
        if text_w(text, s) <= width {
            return Some(s);
        }
        s -= 1.0;
    }
    None
}

/// Greedy word wrap at `width` pixels (a word longer than the width gets a line of its own).
fn wrap(text: &str, size: f64, width: i32) -> Vec<String> {
    crate::report::png::greedy_wrap(text, |s| text_w(s, size) <= width)
}

/// The colour metric's unit and name for people.
fn metric_unit(metric: &str) -> &'static str {
    match metric {
        "gpus" => "GPUs",
        "tokens_per_s" => "tokens/s",
        "tokens_per_s_per_gpu" => "tokens/s per GPU",
        "step_time_s" => "step time, s",
        "mfu" => "MFU, %",
        "peak_allocated_gb" => "peak allocated, GB",
        "peak_reserved_gb" => "peak reserved, GB",
        "headroom_gb" => "headroom, GB",
        "gpu_hours" => "GPU-hours",
        _ => "",
    }
}

/// The colour scale: `lo` is 0 unless a value is negative, `hi` the first tick at or above
/// the highest value; ticks every `step`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub step: f64,
    pub ticks: Vec<f64>,
    /// The lowest and highest value in the cells (None when no cell has one).
    pub observed: Option<(f64, f64)>,
    pub higher_is_better: bool,
}

fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return 1.0;
    }
    let e = 10f64.powf(raw.log10().floor());
    let f = raw / e;
    let n = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * e
}

impl Scale {
    fn new(values: &[f64], higher_is_better: bool) -> Scale {
        let values: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let observed = if values.is_empty() {
            None
        } else {
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            Some((lo, hi))
        };
        let (vmin, vmax) = observed.unwrap_or((0.0, 1.0));
        let raw_lo = vmin.min(0.0);
        let raw_hi = vmax.max(0.0);
        let step = nice_step((raw_hi - raw_lo) / 4.0);
        let lo = (raw_lo / step).floor() * step;
        let mut n = ((raw_hi - lo) / step - 1e-9).ceil().max(1.0) as usize;
        if lo + n as f64 * step < raw_hi {
            n += 1;
        }
        let ticks: Vec<f64> = (0..=n).map(|i| lo + i as f64 * step).collect();
        let hi = ticks[n];
        Scale { lo, hi, step, ticks, observed, higher_is_better }
    }

    /// Position on the scale, 0 at `lo`, 1 at `hi`.
    fn t(&self, v: f64) -> f64 {
        ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }

    /// The colour of `v`: the brightest colour is the better end.
    pub fn color(&self, v: f64) -> RGBColor {
        let t = self.t(v);
        viridis(if self.higher_is_better { t } else { 1.0 - t })
    }

    /// A tick's label: one unit (%, k, M) and as many decimals as the step needs.
    fn label(&self, v: f64, metric: &str) -> String {
        let (scale, suffix) = if metric == "mfu" {
            (100.0, "%")
        } else if metric == "gpus" {
            (1.0, "")
        } else if self.hi.abs().max(self.lo.abs()) >= 1e6 {
            (1e-6, "M")
        } else if self.hi.abs().max(self.lo.abs()) >= 1e4 {
            (1e-3, "k")
        } else {
            (1.0, "")
        };
        let step = self.step * scale;
        let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
        let x = v * scale;
        let x = if x.abs() < 0.5 * 10f64.powi(-(decimals as i32)) { 0.0 } else { x };
        if x == 0.0 && suffix != "%" {
            return "0".to_string();
        }
        format!("{x:.decimals$}{suffix}")
    }
}

/// The short name of an axis for a number in a cell: the last part of its path, its initials
/// when it has several words (`training.micro_batch` -> `mb`, `parallel.tp` -> `tp`).
fn short_axis(path: &str) -> String {
    let last = path.rsplit('.').next().unwrap_or(path);
    let words: Vec<&str> = last.split(['_', '-']).filter(|w| !w.is_empty()).collect();
    if words.len() > 1 {
        words.iter().filter_map(|w| w.chars().next()).collect()
    } else {
        last.to_string()
    }
}

/// How each value of the axes written in the cells reads: in full, and abbreviated (a string
/// value's first word when no other value, of this axis or of the others shown, reads the
/// same; numbers and booleans as `mb=4` either way). Never cut inside a word.
fn value_texts(axes: &[&GridAxis]) -> Vec<(Vec<String>, Vec<String>)> {
    let full: Vec<Vec<String>> = axes
        .iter()
        .map(|a| {
            if a.numeric {
                let s = short_axis(&a.path);
                a.labels.iter().map(|l| format!("{s}={l}")).collect()
            } else {
                a.labels.clone()
            }
        })
        .collect();
    let mut taken: Vec<String> = full.iter().flatten().cloned().collect();
    let mut out = Vec::new();
    for (k, a) in axes.iter().enumerate() {
        let mut short = full[k].clone();
        if !a.numeric {
            let firsts: Vec<String> = a
                .labels
                .iter()
                .map(|l| l.split(['_', '-', ' ']).find(|w| !w.is_empty()).unwrap_or(l).to_string())
                .collect();
            for (i, f) in firsts.iter().enumerate() {
                let clash = firsts.iter().enumerate().any(|(j, g)| j != i && g == f)
                    || taken.iter().any(|t| t == f && *t != a.labels[i]);
                if f.len() < a.labels[i].len() && !clash {
                    short[i] = f.clone();
                    taken.push(f.clone());
                }
            }
        }
        out.push((full[k].clone(), short));
    }
    out
}

/// What the cells' second line shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Winners {
    /// Axes (paths) written in the cells, in order.
    pub shown: Vec<String>,
    /// Whether their values are abbreviated.
    pub abbreviated: bool,
    /// Axes that vary between the cells' winners but do not fit in the cells.
    pub dropped: Vec<String>,
    /// Axes on which every winner agrees (or with one value): said once, in the caption.
    pub same: Vec<(String, String)>,
    /// Per cell (row-major), the second line.
    pub lines: Vec<Option<String>>,
    pub size: f64,
}

/// Everything the picture shows, laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub width: i32,
    pub height: i32,
    pub title: String,
    pub title_size: f64,
    /// The caption under the title, wrapped; (line, muted).
    pub caption: Vec<(String, bool)>,
    pub left: i32,
    pub top: i32,
    pub cell_w: i32,
    pub cell_h: i32,
    pub scale: Scale,
    pub winners: Winners,
    /// The colour bar's height; the legend's total height.
    pub bar_h: i32,
    pub legend_h: i32,
    /// Every `x_every`-th column label is written (1: all), at `x_size`.
    pub x_every: usize,
    pub x_size: f64,
    pub y_every: usize,
    pub y_size: f64,
}

/// The values of the winners on the axes that are not plotted, fitted into `cell_w` x
/// `cell_h` cells: every axis in full, then abbreviated, then without the last axis (file
/// order is the priority), down to none.
fn winners(g: &Grid, cell_w: i32, cell_h: i32, value_h: f64) -> Winners {
    let plotted = [Some(g.x_axis.as_str()), g.y_axis.as_deref()];
    let fitting: Vec<usize> = (0..g.cells.len())
        .filter(|&i| matches!(g.cells[i].state, CellState::Fits { .. }) && g.cells[i].winner.len() == g.axes.len())
        .collect();
    let mut same = Vec::new();
    let mut varying = Vec::new();
    for (k, a) in g.axes.iter().enumerate() {
        if plotted.contains(&Some(a.path.as_str())) {
            continue;
        }
        let first = fitting.first().map(|&i| g.cells[i].winner[k].clone());
        let agree = fitting.iter().all(|&i| Some(&g.cells[i].winner[k]) == first.as_ref());
        match first {
            Some(v) if agree => same.push((a.path.clone(), v)),
            Some(_) => varying.push(k),
            None if a.labels.len() == 1 => same.push((a.path.clone(), a.labels[0].clone())),
            None => {}
        }
    }
    let none = |dropped: Vec<String>, same| Winners {
        shown: Vec::new(),
        abbreviated: false,
        dropped,
        same,
        lines: vec![None; g.cells.len()],
        size: WINNER,
    };
    let all: Vec<String> = varying.iter().map(|&k| g.axes[k].path.clone()).collect();
    // Room for a second line under the value.
    if varying.is_empty() || (cell_h as f64) < value_h + WINNER_MIN + 10.0 {
        return none(all, same);
    }
    for n in (1..=varying.len()).rev() {
        let axes: Vec<&GridAxis> = varying[..n].iter().map(|&k| &g.axes[k]).collect();
        let texts = value_texts(&axes);
        for abbreviated in [false, true] {
            let line = |i: usize| -> String {
                varying[..n]
                    .iter()
                    .enumerate()
                    .map(|(j, &k)| {
                        let v = g.axes[k].labels.iter().position(|l| *l == g.cells[i].winner[k]).unwrap_or(0);
                        let (full, short) = &texts[j];
                        if abbreviated {
                            short[v].clone()
                        } else {
                            full[v].clone()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let lines: Vec<(usize, String)> = fitting.iter().map(|&i| (i, line(i))).collect();
            let widest = lines.iter().map(|(_, l)| text_w(l, WINNER)).max().unwrap_or(0);
            let widest_line = lines.iter().find(|(_, l)| text_w(l, WINNER) == widest).map(|(_, l)| l.as_str());
            let Some(size) = widest_line.and_then(|l| fitted(l, WINNER, WINNER_MIN, cell_w - 8)) else {
                continue;
            };
            if lines.iter().any(|(_, l)| text_w(l, size) > cell_w - 8) {
                continue;
            }
            let mut per_cell = vec![None; g.cells.len()];
            for (i, l) in lines {
                per_cell[i] = Some(l);
            }
            let shown = all[..n].to_vec();
            if abbreviated && texts.iter().all(|(f, s)| f == s) {
                // Nothing was shortened: the full texts did not fit either.
                continue;
            }
            return Winners { shown, abbreviated, dropped: all[n..].to_vec(), same, lines: per_cell, size };
        }
    }
    none(all, same)
}

/// Lays the picture out: cell sizes from what they hold, the caption wrapped to the width, the
/// height from the rows, the legend and the caption (no empty band).
pub fn plan(a: &Answer) -> Plan {
    // Text is measured with the bundled font (a no-op once registered).
    let _ = ensure_font();
    let g = &a.heatmap;
    let nx = g.x_values.len().max(1);
    let ny = g.y_values.len().max(1);
    let values: Vec<f64> = g
        .cells
        .iter()
        .filter_map(|c| match c.state {
            CellState::Fits { value: Some(v), .. } => Some(v),
            _ => None,
        })
        .collect();
    let scale = Scale::new(&values, g.higher_is_better);

    // Cells: wide enough for the value and the winners' full values, within 1400 x 900 px.
    let texts: Vec<String> = g.cells.iter().map(|c| cell_text(&c.state, &g.color)).collect();
    let widest_value = texts.iter().map(|t| text_w(t, VALUE)).max().unwrap_or(0);
    let full_lines = winners(g, 10_000, 1_000, VALUE);
    let widest_line = full_lines.lines.iter().flatten().map(|l| text_w(l, WINNER)).max().unwrap_or(0);
    let widest_x = g.x_values.iter().map(|v| text_w(v, TICK)).max().unwrap_or(0);
    let want_w = (widest_value.max(widest_line).max(widest_x) + 16).clamp(64, 190);
    let cell_w = want_w.min((1400 / nx as i32).max(28));
    let rows_h = |want: i32| want.min((900 / ny as i32).max(20));
    let mut cell_h = rows_h(if full_lines.shown.is_empty() { 40 } else { 54 });
    let winners = winners(g, cell_w, cell_h, VALUE);
    if winners.shown.is_empty() {
        cell_h = rows_h(40);
    }

    // Axis labels: all of them if they fit, else every k-th (never cut, never overlapping).
    let (x_every, x_size) = match fitted_all(&g.x_values, TICK, 10.0, cell_w - 4) {
        Some(s) => (1, s),
        None => ((((widest_x + 8) / cell_w.max(1)) + 1).max(1) as usize, TICK),
    };
    let (y_every, y_size) =
        if cell_h >= 16 { (1, TICK) } else { (((18 + cell_h - 1) / cell_h.max(1)).max(1) as usize, TICK.min(12.0)) };
    let widest_y = g.y_values.iter().map(|v| text_w(v, y_size)).max().unwrap_or(0);
    let left = PAD + widest_y.max(24) + 14;
    let grid_w = cell_w * nx as i32;
    let grid_h = cell_h * ny as i32;

    // The legend's width and height.
    let unit = metric_unit(&g.color);
    let direction = if g.higher_is_better { "higher is better" } else { "lower is better" };
    let legend_head = [g.color.clone(), format!("{unit}, {direction}")];
    let tick_labels: Vec<String> = scale.ticks.iter().map(|&t| scale.label(t, &g.color)).collect();
    let observed = scale
        .observed
        .map(|(lo, hi)| format!("cells: {} to {}", short_number(lo, &g.color), short_number(hi, &g.color)));
    let best_cell = legend_best(a);
    let empty = g.cells.iter().any(|c| c.state == CellState::Empty);
    let phases = present_phases(g);
    let mut legend_texts: Vec<String> = legend_head.to_vec();
    legend_texts.extend(tick_labels.iter().map(|t| format!("{t}       ")));
    legend_texts.extend(observed.clone());
    if best_cell {
        legend_texts.push(format!("{}best by the objective", " ".repeat(8)));
    }
    if empty {
        legend_texts.push(format!("{}no configuration (filter)", " ".repeat(8)));
    }
    legend_texts.extend(phases.iter().map(|p| format!("{}{p}", " ".repeat(8))));
    let bar_h = if values.is_empty() { 0 } else { grid_h.clamp(160, 320) };
    let mut legend_h = if values.is_empty() { 0 } else { bar_h + 12 + 22 };
    legend_h += if best_cell { 26 } else { 0 } + if empty { 26 } else { 0 };
    if !phases.is_empty() {
        legend_texts.push("nothing fits: OOM in".to_string());
        legend_h += 24 + 22 * phases.len() as i32;
    }
    let legend_w = legend_texts.iter().map(|t| text_w(t, LEGEND)).max().unwrap_or(0).max(BAR_W + 60);

    let width = (left + grid_w + GAP + legend_w + PAD).max(760);
    let title = format!("{}: {} configurations, {} fit", a.sweep, a.configurations, a.fits);
    let title_size = fitted(&title, TITLE, 14.0, width - 2 * PAD).unwrap_or(14.0);
    let caption_w = width - 2 * PAD;
    let mut caption = Vec::new();
    for (text, muted) in caption_texts(a, &winners, &scale) {
        caption.extend(wrap(&text, CAPTION, caption_w).into_iter().map(|l| (l, muted)));
    }
    // Title, caption, then room above the grid for the y axis's name and the legend's head.
    let top = PAD + 30 + caption.len() as i32 * 22 + 10 + 44;
    let below_grid = 6 + TICK as i32 + 12 + AXIS_NAME as i32 + PAD;
    let height = (top + grid_h + below_grid).max(top + legend_h + PAD);
    Plan {
        width,
        height,
        title,
        title_size,
        caption,
        left,
        top,
        cell_w,
        cell_h,
        scale,
        winners,
        bar_h,
        legend_h,
        x_every,
        x_size,
        y_every,
        y_size,
    }
}

fn fitted_all(texts: &[String], size: f64, min: f64, width: i32) -> Option<f64> {
    texts.iter().try_fold(size, |s, t| fitted(t, s, min, width))
}

/// Whether the overall best configuration is outlined in some cell.
fn legend_best(a: &Answer) -> bool {
    let best = a.best.as_ref().map(|b| b.index);
    a.heatmap.cells.iter().any(|c| matches!(&c.state, CellState::Fits { index, .. } if Some(*index) == best))
}

fn present_phases(g: &Grid) -> Vec<&'static str> {
    PHASES
        .into_iter()
        .filter(|p| g.cells.iter().any(|c| matches!(&c.state, CellState::Oom { phase, .. } if phase == p)))
        .collect()
}

/// The caption's paragraphs: what a cell is, what its colour and lines say, what red means.
fn caption_texts(a: &Answer, w: &Winners, scale: &Scale) -> Vec<(String, bool)> {
    let g = &a.heatmap;
    let mut out = Vec::new();
    let over: Vec<&str> =
        g.axes.iter().map(|x| x.path.as_str()).filter(|p| *p != g.x_axis && Some(*p) != g.y_axis.as_deref()).collect();
    let cell_axes = match &g.y_axis {
        Some(y) => format!("{} and {}", g.x_axis, y),
        None => g.x_axis.clone(),
    };
    let mut first = format!(
        "Each cell: the best configuration by the objective ({}) among those with the cell's {cell_axes}",
        a.objective.join(", then ")
    );
    if !over.is_empty() {
        first += &format!(", i.e. the best over {}", over.join(", "));
    }
    first.push('.');
    out.push((first, false));
    let mut second = format!("Colour and first line: its {} ({})", g.color, metric_unit(&g.color));
    second += &format!(", on a scale from {} to {}.", scale.label(scale.lo, &g.color), scale.label(scale.hi, &g.color));
    if !w.shown.is_empty() {
        second +=
            &format!(" Second line: its {}{}.", w.shown.join(", "), if w.abbreviated { " (abbreviated)" } else { "" });
    }
    if !w.same.is_empty() {
        let same: Vec<String> = w.same.iter().map(|(p, v)| format!("{p} = {v}")).collect();
        second += &format!(" In every cell that fits: {}.", same.join(", "));
    }
    if !w.dropped.is_empty() {
        second += &format!(
            " Not written in the cells (no room): {} (sweep.json gives each cell's configuration index).",
            w.dropped.join(", ")
        );
    }
    if scale.observed.is_some() {
        out.push((second, false));
    }
    if g.cells.iter().any(|c| matches!(c.state, CellState::Oom { .. })) {
        out.push((
            "Red: nothing in the cell fits; it names the phase the furthest configuration reached before running out of memory.".to_string(),
            true,
        ));
    }
    out
}

fn render(path: &Path, a: &Answer) -> Result<(), String> {
    let g = &a.heatmap;
    let p = plan(a);
    let nx = g.x_values.len().max(1) as i32;
    let ny = g.y_values.len().max(1) as i32;
    let (left, top, cell_w, cell_h) = (p.left, p.top, p.cell_w, p.cell_h);
    let grid_w = cell_w * nx;
    let grid_h = cell_h * ny;
    let root = BitMapBackend::new(path, (p.width as u32, p.height as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;

    // Title and caption.
    root.draw(&Text::new(p.title.clone(), (PAD, PAD - 4), font(p.title_size))).map_err(err)?;
    for (i, (line, muted)) in p.caption.iter().enumerate() {
        let style = font(CAPTION).color(if *muted { &MUTED } else { &TEXT });
        root.draw(&Text::new(line.clone(), (PAD, PAD + 30 + i as i32 * 22), style)).map_err(err)?;
    }

    // Cells; the objective's best configuration is outlined.
    let best = a.best.as_ref().map(|b| b.index);
    for (i, c) in g.cells.iter().enumerate() {
        let x0 = left + c.x as i32 * cell_w;
        // Row 0 at the top.
        let y0 = top + c.y as i32 * cell_h;
        let fill = match &c.state {
            CellState::Empty => EMPTY,
            CellState::Oom { phase, .. } => oom_color(phase),
            CellState::Fits { value: Some(v), .. } => p.scale.color(*v),
            CellState::Fits { value: None, .. } => viridis(0.5),
        };
        root.draw(&Rectangle::new([(x0, y0), (x0 + cell_w, y0 + cell_h)], fill.filled())).map_err(err)?;
        root.draw(&Rectangle::new([(x0, y0), (x0 + cell_w, y0 + cell_h)], GRID.stroke_width(2))).map_err(err)?;
        if matches!(&c.state, CellState::Fits { index, .. } if Some(*index) == best) {
            root.draw(&Rectangle::new([(x0 + 3, y0 + 3), (x0 + cell_w - 3, y0 + cell_h - 3)], BEST.stroke_width(3)))
                .map_err(err)?;
        }
        let color = if luminance(fill) < 140.0 { WHITE } else { TEXT };
        let text = cell_text(&c.state, &g.color);
        let Some(s) = fitted(&text, VALUE, VALUE_MIN, cell_w - 6).filter(|s| cell_h as f64 >= s + 4.0) else {
            continue;
        };
        let line = p.winners.lines.get(i).cloned().flatten();
        let cx = x0 + cell_w / 2;
        match line {
            Some(line) => {
                let s2 = p.winners.size;
                let block = (s + 3.0 + s2) as i32;
                let y = y0 + (cell_h - block) / 2;
                let style = font(s).color(&color).pos(Pos::new(HPos::Center, VPos::Top));
                root.draw(&Text::new(text, (cx, y), style)).map_err(err)?;
                let style = font(s2).color(&color).pos(Pos::new(HPos::Center, VPos::Top));
                root.draw(&Text::new(line, (cx, y + s as i32 + 3), style)).map_err(err)?;
            }
            None => {
                let style = font(s).color(&color).pos(Pos::new(HPos::Center, VPos::Center));
                root.draw(&Text::new(text, (cx, y0 + cell_h / 2), style)).map_err(err)?;
            }
        }
    }

    // Axis labels: values under the columns and left of the rows, then the axis names.
    let xstyle = |s: f64| font(s).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, v) in g.x_values.iter().enumerate().step_by(p.x_every) {
        let cx = left + i as i32 * cell_w + cell_w / 2;
        root.draw(&Text::new(v.clone(), (cx, top + grid_h + 6), xstyle(p.x_size))).map_err(err)?;
    }
    let x_name_y = top + grid_h + 6 + TICK as i32 + 12;
    root.draw(&Text::new(g.x_axis.clone(), (left + grid_w / 2, x_name_y), xstyle(AXIS_NAME))).map_err(err)?;
    let ystyle = font(p.y_size).pos(Pos::new(HPos::Right, VPos::Center));
    for (j, v) in g.y_values.iter().enumerate().step_by(p.y_every) {
        let cy = top + j as i32 * cell_h + cell_h / 2;
        root.draw(&Text::new(v.clone(), (left - 8, cy), ystyle.clone())).map_err(err)?;
    }
    if let Some(y) = &g.y_axis {
        root.draw(&Text::new(y.clone(), (PAD, top - 26), font(AXIS_NAME))).map_err(err)?;
    }

    // Legend: the colour bar with its ticks and the cells' range, then the markers.
    let lx = left + grid_w + GAP;
    let lstyle = font(LEGEND).pos(Pos::new(HPos::Left, VPos::Center));
    let mut ly = top;
    if let Some((vmin, vmax)) = p.scale.observed {
        let sc = &p.scale;
        let bar_h = p.bar_h;
        let unit = metric_unit(&g.color);
        let direction = if g.higher_is_better { "higher is better" } else { "lower is better" };
        root.draw(&Text::new(g.color.clone(), (lx, top - 44), font(LEGEND))).map_err(err)?;
        root.draw(&Text::new(format!("{unit}, {direction}"), (lx, top - 26), font(LEGEND).color(&MUTED)))
            .map_err(err)?;
        // Top of the bar = the top of the scale.
        let y_of = |v: f64| top + ((1.0 - sc.t(v)) * bar_h as f64).round() as i32;
        let steps = 128;
        for k in 0..steps {
            let v = sc.hi - (k as f64 + 0.5) / steps as f64 * (sc.hi - sc.lo);
            let (y, y1) = (top + (k * bar_h) / steps, top + ((k + 1) * bar_h) / steps);
            root.draw(&Rectangle::new([(lx, y), (lx + BAR_W, y1 + 1)], sc.color(v).filled())).map_err(err)?;
        }
        root.draw(&Rectangle::new([(lx, top), (lx + BAR_W, top + bar_h)], TEXT.stroke_width(1))).map_err(err)?;
        for &t in &sc.ticks {
            let y = y_of(t);
            root.draw(&PathElement::new(vec![(lx + BAR_W, y), (lx + BAR_W + 5, y)], TEXT.stroke_width(1)))
                .map_err(err)?;
            root.draw(&Text::new(sc.label(t, &g.color), (lx + BAR_W + 9, y), lstyle.clone())).map_err(err)?;
        }
        // The cells' range: a bracket left of the bar.
        let (ya, yb) = (y_of(vmax), y_of(vmin));
        let bx = lx - 7;
        let bracket = vec![(bx + 5, ya), (bx, ya), (bx, yb), (bx + 5, yb)];
        root.draw(&PathElement::new(bracket, TEXT.stroke_width(2))).map_err(err)?;
        let range = format!("cells: {} to {}", short_number(vmin, &g.color), short_number(vmax, &g.color));
        root.draw(&Text::new(range, (lx - 7, top + bar_h + 12 + 8), lstyle.clone())).map_err(err)?;
        ly = top + bar_h + 12 + 22 + 4;
    }
    if legend_best(a) {
        root.draw(&Rectangle::new([(lx, ly), (lx + BAR_W, ly + 16)], BEST.stroke_width(3))).map_err(err)?;
        root.draw(&Text::new("best by the objective", (lx + 30, ly + 8), lstyle.clone())).map_err(err)?;
        ly += 26;
    }
    if g.cells.iter().any(|c| c.state == CellState::Empty) {
        root.draw(&Rectangle::new([(lx, ly), (lx + BAR_W, ly + 16)], EMPTY.filled())).map_err(err)?;
        root.draw(&Text::new("no configuration (filter)", (lx + 30, ly + 8), lstyle.clone())).map_err(err)?;
        ly += 26;
    }
    let phases = present_phases(g);
    if !phases.is_empty() {
        root.draw(&Text::new("nothing fits: OOM in", (lx, ly + 2), font(LEGEND))).map_err(err)?;
        ly += 24;
        for ph in phases {
            root.draw(&Rectangle::new([(lx, ly), (lx + BAR_W, ly + 16)], oom_color(ph).filled())).map_err(err)?;
            root.draw(&Text::new(ph.to_string(), (lx + 30, ly + 8), lstyle.clone())).map_err(err)?;
            ly += 22;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::answer::Aggregator;
    use crate::sweep::output::Row;
    use crate::sweep::SweepSpec;

    fn spec(axes: &str, heatmap: &str) -> SweepSpec {
        let base = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/gpt-1.3b-1gpu.toml");
        let body = format!("name = \"t\"\nbase = {base:?}\n[axes]\n{axes}\n{heatmap}\n");
        SweepSpec::from_toml(Path::new("t.toml"), &body).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every configuration of `spec`; `tokens` gives its tokens/s from its value indices, or
    /// None for an OOM in the forward pass.
    fn answer(spec: &SweepSpec, tokens: impl Fn(&[usize]) -> Option<f64>) -> Answer {
        let mut agg = Aggregator::new(spec);
        for index in 0..spec.size {
            let t = tokens(&spec.value_indices(index));
            agg.add(&Row {
                index,
                gpus: 8,
                tokens_per_step: 8192,
                fits: t.is_some(),
                oom_step: t.is_none().then_some(1),
                oom_phase: if t.is_some() { String::new() } else { "forward".into() },
                oom_layer: None,
                peak_allocated_gb: 40.0,
                peak_reserved_gb: 42.0,
                capacity_gb: 80.0,
                step_time_s: t.map(|t| 8192.0 / t),
                tokens_per_s: t,
                mfu: t.map(|t| t / 100_000.0),
                gpu_hours: None,
            });
        }
        agg.finish()
    }

    const FOUR_AXES: &str = "hardware.gpus = [1, 2, 4]\ntraining.micro_batch = [4, 8]\n\
        parallel.sharding = [\"none\", \"full_shard\", \"hybrid_shard\"]\n\
        training.activation_checkpointing = [\"none\", \"full\"]";

    #[test]
    fn each_cell_says_the_winners_values_on_the_other_axes() {
        let s = spec(FOUR_AXES, "");
        // The winner's sharding and checkpointing change from cell to cell.
        let a = answer(&s, |v| {
            Some(
                1000.0 * (1 + v[0] + v[1]) as f64
                    + if v[2] == (v[0] + v[1]) % 3 { 500.0 } else { 0.0 }
                    + if v[3] == v[0] % 2 { 100.0 } else { 0.0 },
            )
        });
        let p = plan(&a);
        assert_eq!(p.winners.shown, ["parallel.sharding", "training.activation_checkpointing"]);
        assert!(p.winners.dropped.is_empty() && p.winners.same.is_empty());
        for (i, c) in a.heatmap.cells.iter().enumerate() {
            let line = p.winners.lines[i].as_deref().expect("every cell fits and has room");
            let want = format!("{}, {}", c.winner[2], c.winner[3]);
            assert_eq!(line, want, "cell {i}");
            assert!(!line.contains("..."));
        }
        // The caption says what the second line is, at the axis names' size or larger.
        let caption: String = p.caption.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>().join(" ");
        assert!(caption.contains("Second line: its parallel.sharding, training.activation_checkpointing"), "{caption}");
        const { assert!(CAPTION >= AXIS_NAME && CAPTION >= TICK) };
    }

    #[test]
    fn axes_the_winners_agree_on_are_said_once_and_narrow_cells_drop_the_rest() {
        let s = spec(FOUR_AXES, "");
        let a = answer(&s, |v| {
            Some(
                1000.0 * (1 + v[0]) as f64 + if v[2] == 1 { 500.0 } else { 0.0 } + if v[3] == v[1] { 1.0 } else { 0.0 },
            )
        });
        let p = plan(&a);
        assert_eq!(p.winners.same, [("parallel.sharding".to_string(), "full_shard".to_string())]);
        assert_eq!(p.winners.shown, ["training.activation_checkpointing"]);
        assert!(p.caption.iter().any(|(l, _)| l.contains("parallel.sharding = full_shard")));
        // 60 columns: no room for a second line; the caption names what is left out.
        let mbs: Vec<String> = (1..=60).map(|m| m.to_string()).collect();
        let axes = format!(
            "training.micro_batch = [{}]\nparallel.sharding = [\"none\", \"full_shard\"]\n\
             training.activation_checkpointing = [\"none\", \"full\"]",
            mbs.join(", ")
        );
        let s = spec(&axes, "");
        let a = answer(&s, |v| Some(1000.0 + if v[2] == v[0] % 2 { 10.0 } else { 0.0 }));
        let p = plan(&a);
        assert!(p.winners.shown.is_empty());
        assert_eq!(p.winners.dropped, ["training.activation_checkpointing"]);
        assert!(p.winners.lines.iter().all(Option::is_none));
        let caption: String = p.caption.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>().join(" ");
        assert!(caption.contains("Not written in the cells (no room): training.activation_checkpointing"), "{caption}");
    }

    #[test]
    fn abbreviations_keep_whole_words_and_stay_unambiguous() {
        let sharding = GridAxis {
            path: "parallel.sharding".into(),
            labels: vec!["none".into(), "full_shard".into(), "hybrid_shard".into(), "hybrid_zero2".into()],
            numeric: false,
        };
        let ckpt = GridAxis {
            path: "training.activation_checkpointing".into(),
            labels: vec!["none".into(), "full".into()],
            numeric: false,
        };
        let mb = GridAxis { path: "training.micro_batch".into(), labels: vec!["4".into(), "8".into()], numeric: true };
        let t = value_texts(&[&sharding, &ckpt, &mb]);
        // "full" would read as checkpointing's value, "hybrid" as two shardings: kept whole.
        assert_eq!(t[0].1, ["none", "full_shard", "hybrid_shard", "hybrid_zero2"]);
        assert_eq!(t[1].1, ["none", "full"]);
        assert_eq!(t[2].0, ["mb=4", "mb=8"]);
        let t = value_texts(&[&sharding, &mb]);
        assert_eq!(t[0].1, ["none", "full", "hybrid_shard", "hybrid_zero2"]);
    }

    #[test]
    fn the_colour_scale_starts_at_zero_and_has_numbered_ticks() {
        // 36.8% and 50.1% MFU: a quarter of the scale apart, not its two ends.
        let sc = Scale::new(&[0.368, 0.501, 0.45], true);
        assert_eq!(sc.lo, 0.0);
        assert!(sc.hi >= 0.501 && sc.hi < 0.75, "{sc:?}");
        assert_eq!(sc.ticks.first(), Some(&0.0));
        assert_eq!(sc.ticks.last(), Some(&sc.hi));
        assert!(sc.t(0.501) - sc.t(0.368) < 0.3);
        let labels: Vec<String> = sc.ticks.iter().map(|&t| sc.label(t, "mfu")).collect();
        assert_eq!(labels, ["0%", "20%", "40%", "60%"]);
        let sc = Scale::new(&[22_100.0, 198_800.0], true);
        let labels: Vec<String> = sc.ticks.iter().map(|&t| sc.label(t, "tokens_per_s")).collect();
        assert_eq!(labels, ["0", "50k", "100k", "150k", "200k"]);
        // Lower is better: the bright end is 0.
        let sc = Scale::new(&[2.5, 39.7], false);
        assert_eq!(sc.color(0.0), viridis(1.0));
        assert_eq!(sc.color(sc.hi), viridis(0.0));
    }

    #[test]
    fn the_picture_is_as_tall_as_its_rows_and_renders_the_same_bytes() {
        for rows in [1usize, 2, 4, 12, 30] {
            let mbs: Vec<String> = (1..=rows).map(|m| m.to_string()).collect();
            let axes = format!(
                "hardware.gpus = [1, 2, 4, 8]\ntraining.micro_batch = [{}]\n\
                 training.activation_checkpointing = [\"none\", \"full\"]",
                mbs.join(", ")
            );
            let s = spec(&axes, "");
            let a = answer(&s, |v| (v[0] > 0).then(|| 1000.0 * (v[0] + v[1]) as f64 + v[2] as f64));
            let p = plan(&a);
            let grid_bottom = p.top + p.cell_h * rows as i32;
            // Nothing below the grid but its labels, unless the legend is taller.
            assert!(p.height <= (grid_bottom + 70).max(p.top + p.legend_h + PAD), "{rows} rows: {p:?}");
            assert!(p.height - grid_bottom <= 70 || p.legend_h > p.cell_h * rows as i32, "{rows} rows");
            let dir = tempfile::tempdir().unwrap();
            let (one, two) = (dir.path().join("one.png"), dir.path().join("two.png"));
            write(&one, &a).unwrap();
            write(&two, &a).unwrap();
            let bytes = std::fs::read(&one).unwrap();
            assert_eq!(bytes, std::fs::read(&two).unwrap());
            let dim = |o: usize| u32::from_be_bytes(bytes[o..o + 4].try_into().unwrap()) as i32;
            assert_eq!((dim(16), dim(20)), (p.width, p.height));
            assert!(!dir.path().join("one.png.tmp.png").exists());
        }
    }
}
