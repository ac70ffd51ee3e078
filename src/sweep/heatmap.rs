//! `heatmap.png`: the answer's grid over two axes. A cell where something fits is coloured by
//! the colour metric of its best configuration (by the objective) and labelled with the
//! value; a cell where nothing fits is red, darker the earlier it fails (init, forward,
//! backward, optimizer) and labelled with that phase. The image is rendered to a temporary
//! name and renamed into place.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::answer::{cell_text, short_number, Answer, CellState};
use crate::report::png::{ensure_font, FONT};

const TEXT: RGBColor = RGBColor(0x20, 0x20, 0x20);
const GRID: RGBColor = RGBColor(0xff, 0xff, 0xff);
const EMPTY: RGBColor = RGBColor(0xee, 0xee, 0xee);
const BEST: RGBColor = RGBColor(0xff, 0x7f, 0x00);

/// OOM colours by phase: the earlier it fails, the darker.
fn oom_color(phase: &str) -> RGBColor {
    match phase {
        "init" => RGBColor(0x6b, 0x0f, 0x1a),
        "forward" => RGBColor(0xa3, 0x1d, 0x2b),
        "backward" => RGBColor(0xd6, 0x45, 0x4f),
        _ => RGBColor(0xf0, 0x8a, 0x8f),
    }
}

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
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp.png");
    let tmp = std::path::PathBuf::from(tmp);
    let rendered = catch_unwind(AssertUnwindSafe(|| render(&tmp, answer)))
        .unwrap_or_else(|_| Err("heatmap rendering panicked".to_string()));
    let result = rendered.and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|e| format!("cannot move {} to {}: {e}", tmp.display(), path.display()))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn font(size: f64) -> TextStyle<'static> {
    (FONT, size).into_font().color(&TEXT)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing the heatmap failed: {e}")
}

/// Text that fits in `width` pixels: shrinks the font down to `min`, then gives up (None).
fn fitted<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    size: f64,
    min: f64,
    width: i32,
) -> Option<f64> {
    let mut s = size;
    while s >= min {
        match area.estimate_text_size(text, &font(s)) {
            Ok((w, _)) if (w as i32) <= width => return Some(s),
            Ok(_) => s -= 1.0,
            Err(_) => return None,
        }
    }
    None
}

fn render(path: &Path, a: &Answer) -> Result<(), String> {
    let g = &a.heatmap;
    let nx = g.x_values.len().max(1);
    let ny = g.y_values.len().max(1);
    let cell_w: i32 = (1100 / nx as i32).clamp(28, 130);
    let cell_h: i32 = (700 / ny as i32).clamp(22, 56);
    let left: i32 = 190;
    let top: i32 = 116;
    let right: i32 = 230;
    let bottom: i32 = 90;
    let grid_w = cell_w * nx as i32;
    let grid_h = cell_h * ny as i32;
    let width = (left + grid_w + right).max(760);
    let bar_h = (grid_h - 40).clamp(80, 260);
    // The legend (colour bar, best marker, four OOM phases) must fit beside short grids.
    let legend_h = bar_h + 30 + 2 * 34 + 22 + 4 * 22 + 16;
    let height = (top + grid_h + bottom).max(top + legend_h).max(420);
    let root = BitMapBackend::new(path, (width as u32, height as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;

    // Title and what a cell is.
    let title = format!("{}: {} configurations, {} fit", a.sweep, a.configurations, a.fits);
    root.draw(&Text::new(title, (16, 12), font(22.0))).map_err(err)?;
    let others: Vec<&str> = a
        .best
        .as_ref()
        .or(a.fastest.as_ref())
        .map(|p| {
            p.config
                .iter()
                .map(|c| c.axis.as_str())
                .filter(|ax| *ax != g.x_axis && Some(*ax) != g.y_axis.as_deref())
                .collect()
        })
        .unwrap_or_default();
    let mut sub = format!(
        "colour and label: {} of the best configuration in each cell ({})",
        g.color,
        a.objective.join(", then ")
    );
    if !others.is_empty() {
        sub += &format!("; best over {}", others.join(", "));
    }
    let size = fitted(&root, &sub, 14.0, 9.0, width - 32).unwrap_or(9.0);
    root.draw(&Text::new(sub, (16, 44), font(size))).map_err(err)?;
    let note = "red: nothing in the cell fits; the label is the phase the furthest configuration reached before running out of memory";
    let size = fitted(&root, note, 13.0, 9.0, width - 32).unwrap_or(9.0);
    root.draw(&Text::new(note, (16, 66), font(size).color(&RGBColor(0x55, 0x55, 0x55)))).map_err(err)?;

    // Colour scale over the fitting cells.
    let values: Vec<f64> = g
        .cells
        .iter()
        .filter_map(|c| match c.state {
            CellState::Fits { value: Some(v), .. } => Some(v),
            _ => None,
        })
        .collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let norm = |v: f64| {
        let t = if hi > lo { (v - lo) / (hi - lo) } else { 1.0 };
        if g.higher_is_better {
            t
        } else {
            1.0 - t
        }
    };

    // Cells; the objective's best configuration is outlined.
    let best = a.best.as_ref().map(|b| b.index);
    for c in &g.cells {
        let x0 = left + c.x as i32 * cell_w;
        // Row 0 at the top.
        let y0 = top + c.y as i32 * cell_h;
        let fill = match &c.state {
            CellState::Empty => EMPTY,
            CellState::Oom { phase, .. } => oom_color(phase),
            CellState::Fits { value: Some(v), .. } => viridis(norm(*v)),
            CellState::Fits { value: None, .. } => viridis(0.5),
        };
        root.draw(&Rectangle::new([(x0, y0), (x0 + cell_w, y0 + cell_h)], fill.filled())).map_err(err)?;
        root.draw(&Rectangle::new([(x0, y0), (x0 + cell_w, y0 + cell_h)], GRID.stroke_width(2))).map_err(err)?;
        if matches!(&c.state, CellState::Fits { index, .. } if Some(*index) == best) {
            root.draw(&Rectangle::new([(x0 + 3, y0 + 3), (x0 + cell_w - 3, y0 + cell_h - 3)], BEST.stroke_width(3)))
                .map_err(err)?;
        }
        let text = cell_text(&c.state, &g.color);
        if let Some(s) = fitted(&root, &text, 15.0, 8.0, cell_w - 6) {
            if (cell_h as f64) >= s + 4.0 {
                let color = if luminance(fill) < 140.0 { WHITE } else { TEXT };
                let style = font(s).color(&color).pos(Pos::new(HPos::Center, VPos::Center));
                root.draw(&Text::new(text, (x0 + cell_w / 2, y0 + cell_h / 2), style)).map_err(err)?;
            }
        }
    }

    // Axis labels: values under the columns and left of the rows, then the axis names.
    let xstyle = |s: f64| font(s).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, v) in g.x_values.iter().enumerate() {
        let cx = left + i as i32 * cell_w + cell_w / 2;
        if let Some(s) = fitted(&root, v, 14.0, 8.0, cell_w - 2) {
            root.draw(&Text::new(v.clone(), (cx, top + grid_h + 6), xstyle(s))).map_err(err)?;
        }
    }
    root.draw(&Text::new(g.x_axis.clone(), (left + grid_w / 2, top + grid_h + 32), xstyle(16.0))).map_err(err)?;
    let ystyle = |s: f64| font(s).pos(Pos::new(HPos::Right, VPos::Center));
    for (j, v) in g.y_values.iter().enumerate() {
        let cy = top + j as i32 * cell_h + cell_h / 2;
        if let Some(s) = fitted(&root, v, 14.0, 8.0, left - 20) {
            if cell_h as f64 >= s {
                root.draw(&Text::new(v.clone(), (left - 8, cy), ystyle(s))).map_err(err)?;
            }
        }
    }
    if let Some(y) = &g.y_axis {
        let size = fitted(&root, y, 16.0, 9.0, left - 12).unwrap_or(9.0);
        root.draw(&Text::new(y.clone(), (8, top - 22), font(size))).map_err(err)?;
    }

    // Legend: the colour bar, then the OOM phases.
    let lx = left + grid_w + 36;
    if !values.is_empty() {
        let steps = 64;
        for k in 0..steps {
            // Top of the bar = best.
            let t = 1.0 - k as f64 / steps as f64;
            let y = top + (k * bar_h) / steps;
            let y1 = top + ((k + 1) * bar_h) / steps;
            root.draw(&Rectangle::new([(lx, y), (lx + 22, y1 + 1)], viridis(t).filled())).map_err(err)?;
        }
        let (best, worst) = if g.higher_is_better { (hi, lo) } else { (lo, hi) };
        let lstyle = font(13.0).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(format!("{} (best)", short_number(best, &g.color)), (lx + 30, top + 6), lstyle.clone()))
            .map_err(err)?;
        root.draw(&Text::new(short_number(worst, &g.color), (lx + 30, top + bar_h - 6), lstyle)).map_err(err)?;
        root.draw(&Text::new(g.color.clone(), (lx, top - 22), font(14.0))).map_err(err)?;
    }
    let mut ly = top + bar_h + 30;
    if best.is_some() {
        root.draw(&Rectangle::new([(lx, ly), (lx + 22, ly + 16)], BEST.stroke_width(3))).map_err(err)?;
        let style = font(13.0).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new("best by the objective", (lx + 30, ly + 8), style)).map_err(err)?;
        ly += 34;
    }
    if g.cells.iter().any(|c| c.state == CellState::Empty) {
        root.draw(&Rectangle::new([(lx, ly), (lx + 22, ly + 16)], EMPTY.filled())).map_err(err)?;
        let style = font(13.0).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new("no configuration (filter)", (lx + 30, ly + 8), style)).map_err(err)?;
        ly += 34;
    }
    let present: Vec<&str> = ["init", "forward", "backward", "optimizer"]
        .into_iter()
        .filter(|p| g.cells.iter().any(|c| matches!(&c.state, CellState::Oom { phase, .. } if phase == p)))
        .collect();
    if !present.is_empty() {
        root.draw(&Text::new("OOM in", (lx, ly), font(14.0))).map_err(err)?;
        ly += 22;
        for p in present {
            root.draw(&Rectangle::new([(lx, ly), (lx + 22, ly + 16)], oom_color(p).filled())).map_err(err)?;
            root.draw(&Text::new(p.to_string(), (lx + 30, ly + 8), font(13.0).pos(Pos::new(HPos::Left, VPos::Center))))
                .map_err(err)?;
            ly += 22;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}
