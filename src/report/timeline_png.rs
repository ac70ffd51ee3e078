//! `timeline.png`: a Gantt view of each distinct rank's streams (compute and NCCL) over the
//! simulated steps, ops coloured by kind, on the same time axis and plot width as
//! `memory.png`, so a gap on the compute stream can be matched with the collective it waits
//! for and with the memory it holds meanwhile.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::engine::Trace;
use crate::schedule::{Schedule, TaskKind};

const FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const FONT: &str = "sans-serif";
/// Same width and legend column as memory.png, so the time axes line up.
const WIDTH: u32 = 1400;
const LEGEND_WIDTH: u32 = 310;
const HEIGHT: u32 = 360;

fn ensure_font() -> Result<(), String> {
    static OK: OnceLock<bool> = OnceLock::new();
    if *OK.get_or_init(|| register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()) {
        Ok(())
    } else {
        Err("the bundled DejaVuSans.ttf could not be parsed as a font".into())
    }
}

/// Colour and legend name of each task kind.
fn style(kind: TaskKind) -> (RGBColor, &'static str) {
    match kind {
        TaskKind::Forward => (RGBColor(0x00, 0x72, 0xB2), "forward"),
        TaskKind::Backward => (RGBColor(0xD5, 0x5E, 0x00), "backward"),
        TaskKind::Recompute => (RGBColor(0xCC, 0x79, 0xA7), "recompute (checkpointing)"),
        TaskKind::AllGather => (RGBColor(0x00, 0x9E, 0x73), "all-gather"),
        TaskKind::ReduceScatter => (RGBColor(0xE6, 0x9F, 0x00), "reduce-scatter"),
        TaskKind::AllReduce => (RGBColor(0x56, 0xB4, 0xE9), "all-reduce"),
        TaskKind::AllToAll => (RGBColor(0x88, 0x22, 0x55), "all-to-all (MoE)"),
        TaskKind::Send | TaskKind::Recv => (RGBColor(0xF0, 0xE4, 0x42), "send / recv, host copies"),
        TaskKind::Optimizer => (RGBColor(0x44, 0x44, 0x44), "optimizer.step()"),
        TaskKind::ZeroGrad | TaskKind::Init => (RGBColor(0x99, 0x99, 0x99), "init / zero_grad"),
    }
}

/// Writes the Gantt chart of one rank class; `end_s` is the right edge of the time axis.
pub fn write(path: &Path, title: &str, sched: &Schedule, trace: &Trace) -> Result<(), String> {
    ensure_font()?;
    let tmp = path.with_extension("tmp.png");
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render(&tmp, title, sched, trace)))
        .unwrap_or_else(|_| Err("rendering timeline.png panicked inside plotters".into()))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| format!("renaming {}: {e}", tmp.display())));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

fn render(path: &Path, title: &str, sched: &Schedule, trace: &Trace) -> Result<(), String> {
    let e = |what: &'static str| move |err: DrawingAreaErrorKind<_>| format!("drawing {what}: {err}");
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(e("background"))?;
    let (chart_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
    let end_s = (trace.end_time_ns as f64 / 1e9).max(1e-9);
    let streams = sched.program.streams.len().max(1);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(title, (FONT, 22.0))
        .margin(10)
        .x_label_area_size(52)
        .y_label_area_size(82)
        .right_y_label_area_size(82)
        .build_cartesian_2d(0.0..end_s, 0.0..streams as f64)
        .map_err(|err| format!("chart axes: {err}"))?;
    let names = sched.program.streams.clone();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("time (s)")
        .y_labels(streams * 2 + 1)
        .y_label_formatter(&|y: &f64| {
            let i = y.floor() as usize;
            if (y - y.floor() - 0.5).abs() < 1e-6 && i < names.len() {
                names[names.len() - 1 - i].clone()
            } else {
                String::new()
            }
        })
        .label_style((FONT, 16.0))
        .axis_desc_style((FONT, 18.0))
        .draw()
        .map_err(|err| format!("mesh: {err}"))?;
    // One row per stream, compute on top; a task narrower than a pixel still gets one.
    let px = end_s / f64::from(WIDTH - LEGEND_WIDTH - 180);
    let mut rects = Vec::with_capacity(sched.program.tasks.len());
    for (i, t) in sched.program.tasks.iter().enumerate() {
        let (s, f) = (trace.start_ns[i], trace.end_ns[i]);
        if s == u64::MAX || f == u64::MAX || t.duration_ns == 0 {
            continue;
        }
        let row = (streams - 1 - t.stream as usize) as f64;
        let (x0, x1) = (s as f64 / 1e9, (f as f64 / 1e9).max(s as f64 / 1e9 + px));
        let (color, _) = style(sched.labels[t.label as usize].kind);
        rects.push(Rectangle::new([(x0, row + 0.15), (x1, row + 0.85)], color.filled()));
    }
    chart.draw_series(rects).map_err(|err| format!("tasks: {err}"))?;
    // Legend; transfers only where the program has them (pipeline p2p, offload copies).
    let mut kinds = vec![
        TaskKind::Forward,
        TaskKind::Backward,
        TaskKind::Recompute,
        TaskKind::AllGather,
        TaskKind::ReduceScatter,
        TaskKind::AllReduce,
    ];
    if sched.labels.iter().any(|l| l.kind == TaskKind::AllToAll) {
        kinds.push(TaskKind::AllToAll);
    }
    if sched.labels.iter().any(|l| matches!(l.kind, TaskKind::Send | TaskKind::Recv)) {
        kinds.push(TaskKind::Send);
    }
    kinds.extend([TaskKind::Optimizer, TaskKind::ZeroGrad]);
    for (k, kind) in kinds.iter().enumerate() {
        let (color, name) = style(*kind);
        let y = 60 + 28 * k as i32;
        legend_area.draw(&Rectangle::new([(20, y), (44, y + 18)], color.filled())).map_err(e("legend"))?;
        legend_area.draw(&Text::new(name, (54, y), (FONT, 16.0))).map_err(e("legend"))?;
    }
    root.present().map_err(|err| format!("writing {}: {err}", path.display()))
}
