//! The answer a planner wants from a sweep, computed in one pass over `sweep.csv` with memory
//! bounded by the axes (never by the number of configurations): the best configuration for
//! the objective, the smallest GPU count that fits, the fastest configuration, the frontier of
//! (GPUs, tokens/s) that fit, where it runs out of memory, and the heatmap grid.

use std::collections::BTreeMap;

use serde::Serialize;

use super::output::Row;
use super::spec::{literal, Criterion, Metric, SweepSpec};

/// One axis's value in a configuration.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AxisValue {
    pub axis: String,
    pub value: serde_json::Value,
    /// As TOML writes it (what to paste into a scenario file).
    #[serde(skip)]
    pub literal: String,
}

/// A configuration the answer names, with its figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Pick {
    pub index: u64,
    pub config: Vec<AxisValue>,
    pub gpus: u64,
    pub peak_allocated_gb: f64,
    pub peak_reserved_gb: f64,
    pub capacity_gb: f64,
    pub step_time_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub mfu: Option<f64>,
    pub gpu_hours: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FrontierPoint {
    pub gpus: u64,
    /// False when fewer GPUs already reach more tokens/s.
    pub pareto: bool,
    pub best: Pick,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PhaseCount {
    pub step: u32,
    pub phase: String,
    pub configurations: u64,
}

/// The values of one axis among a set of configurations.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AxisSpan {
    pub axis: String,
    /// True when every value of the axis occurs.
    pub any: bool,
    pub values: Vec<serde_json::Value>,
    #[serde(skip)]
    pub literals: Vec<String>,
}

/// The configurations that run out of memory in one (step, phase).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OomRegion {
    pub step: u32,
    pub phase: String,
    pub configurations: u64,
    pub axes: Vec<AxisSpan>,
}

/// An axis value with which nothing fits.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NeverFits {
    pub axis: String,
    pub value: serde_json::Value,
    #[serde(skip)]
    pub literal: String,
    pub configurations: u64,
    pub oom: Vec<PhaseCount>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CellState {
    /// No configuration here (the filter dropped them all).
    Empty,
    /// The best configuration of the cell by the objective, and its colour metric.
    Fits { index: u64, value: Option<f64> },
    /// Nothing fits; the furthest any configuration got before running out of memory.
    Oom { step: u32, phase: String },
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Cell {
    pub x: usize,
    pub y: usize,
    pub configurations: u64,
    pub fits: u64,
    #[serde(flatten)]
    pub state: CellState,
    /// The winning configuration's value on every axis (file order, as the CSV writes them);
    /// empty unless something fits. What the picture writes under the value.
    #[serde(skip)]
    pub winner: Vec<String>,
}

/// An axis as the heatmap picture names it.
#[derive(Debug, Clone, PartialEq)]
pub struct GridAxis {
    pub path: String,
    /// Each value as the CSV writes it.
    pub labels: Vec<String>,
    /// Numbers and booleans (written with a short axis name) rather than strings.
    pub numeric: bool,
}

/// The heatmap: cells over two axes, each the best of the configurations that share its
/// two values.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Grid {
    pub x_axis: String,
    pub x_values: Vec<String>,
    pub y_axis: Option<String>,
    pub y_values: Vec<String>,
    pub color: String,
    pub higher_is_better: bool,
    /// Row-major: y outer, x inner.
    pub cells: Vec<Cell>,
    /// Every axis of the sweep, in file order (for the winners' values).
    #[serde(skip)]
    pub axes: Vec<GridAxis>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Answer {
    pub sweep: String,
    pub description: String,
    /// Configurations simulated (after the filter).
    pub configurations: u64,
    /// Size of the cartesian product (before the filter).
    pub product: u64,
    pub fits: u64,
    pub oom: u64,
    pub objective: Vec<String>,
    pub token_budget: Option<f64>,
    pub best: Option<Pick>,
    pub smallest_gpus_that_fit: Option<u64>,
    pub fastest: Option<Pick>,
    pub frontier: Vec<FrontierPoint>,
    pub oom_regions: Vec<OomRegion>,
    pub never_fits: Vec<NeverFits>,
    pub heatmap: Grid,
}

fn phase_rank(p: &str) -> u8 {
    match p {
        "init" => 0,
        "forward" => 1,
        "backward" => 2,
        "optimizer" => 3,
        _ => 4,
    }
}

/// Whether `a` beats `b` under the criteria (missing figures lose; ties: lower index).
pub fn better(a: &Row, b: &Row, criteria: &[Criterion]) -> bool {
    for c in criteria {
        match (a.metric(c.metric), b.metric(c.metric)) {
            (Some(x), Some(y)) if x != y => return (x > y) == c.maximize,
            (Some(_), None) => return true,
            (None, Some(_)) => return false,
            _ => {}
        }
    }
    a.index < b.index
}

#[derive(Default)]
struct CellAgg {
    n: u64,
    fits: u64,
    best: Option<Row>,
    furthest: Option<PhaseKey>,
}

/// (step, phase rank, phase name): sorts in the order a step runs.
type PhaseKey = (u32, u8, String);

/// Configurations with one axis value: how many, how many fit, OOMs by phase.
type ValueAgg = (u64, u64, BTreeMap<PhaseKey, u64>);

struct RegionAgg {
    count: u64,
    seen: Vec<Vec<bool>>,
}

/// Streams rows (in any order) into the answer.
pub struct Aggregator<'a> {
    spec: &'a SweepSpec,
    total: u64,
    fits: u64,
    best: Option<Row>,
    fastest: Option<Row>,
    per_gpus: BTreeMap<u64, Row>,
    regions: BTreeMap<PhaseKey, RegionAgg>,
    /// Per axis, per value: configurations, those that fit, OOMs by (step, phase).
    per_value: Vec<Vec<ValueAgg>>,
    cells: Vec<CellAgg>,
    nx: usize,
}

impl<'a> Aggregator<'a> {
    pub fn new(spec: &'a SweepSpec) -> Self {
        let nx = spec.axes[spec.heatmap.x].values.len();
        let ny = spec.heatmap.y.map_or(1, |y| spec.axes[y].values.len());
        Aggregator {
            spec,
            total: 0,
            fits: 0,
            best: None,
            fastest: None,
            per_gpus: BTreeMap::new(),
            regions: BTreeMap::new(),
            per_value: spec.axes.iter().map(|a| vec![(0, 0, BTreeMap::new()); a.values.len()]).collect(),
            cells: (0..nx * ny).map(|_| CellAgg::default()).collect(),
            nx,
        }
    }

    pub fn add(&mut self, row: &Row) {
        let spec = self.spec;
        let vi = spec.value_indices(row.index);
        self.total += 1;
        let cell = vi[spec.heatmap.x] + spec.heatmap.y.map_or(0, |y| vi[y] * self.nx);
        let c = &mut self.cells[cell];
        c.n += 1;
        let phase_key = (row.oom_step.unwrap_or(0), phase_rank(&row.oom_phase), row.oom_phase.clone());
        if row.fits {
            self.fits += 1;
            c.fits += 1;
            let obj = &spec.objective;
            if c.best.as_ref().is_none_or(|b| better(row, b, obj)) {
                c.best = Some(row.clone());
            }
            if self.best.as_ref().is_none_or(|b| better(row, b, obj)) {
                self.best = Some(row.clone());
            }
            let fastest = [Criterion { metric: Metric::TokensPerS, maximize: true }];
            if self.fastest.as_ref().is_none_or(|b| better(row, b, &fastest)) {
                self.fastest = Some(row.clone());
            }
            let slot = self.per_gpus.get(&row.gpus);
            if slot.is_none_or(|b| better(row, b, &fastest)) {
                self.per_gpus.insert(row.gpus, row.clone());
            }
        } else {
            if c.furthest.as_ref().is_none_or(|f| (phase_key.0, phase_key.1) > (f.0, f.1)) {
                c.furthest = Some(phase_key.clone());
            }
            let axes = &spec.axes;
            let r = self.regions.entry(phase_key.clone()).or_insert_with(|| RegionAgg {
                count: 0,
                seen: axes.iter().map(|a| vec![false; a.values.len()]).collect(),
            });
            r.count += 1;
            for (k, &v) in vi.iter().enumerate() {
                r.seen[k][v] = true;
            }
        }
        for (k, &v) in vi.iter().enumerate() {
            let pv = &mut self.per_value[k][v];
            pv.0 += 1;
            if row.fits {
                pv.1 += 1;
            } else {
                *pv.2.entry(phase_key.clone()).or_insert(0) += 1;
            }
        }
    }

    fn config(&self, index: u64) -> Vec<AxisValue> {
        self.spec
            .axes
            .iter()
            .zip(self.spec.value_indices(index))
            .map(|(a, v)| AxisValue { axis: a.path.clone(), value: json(&a.values[v]), literal: literal(&a.values[v]) })
            .collect()
    }

    fn pick(&self, r: &Row) -> Pick {
        Pick {
            index: r.index,
            config: self.config(r.index),
            gpus: r.gpus,
            peak_allocated_gb: r.peak_allocated_gb,
            peak_reserved_gb: r.peak_reserved_gb,
            capacity_gb: r.capacity_gb,
            step_time_s: r.step_time_s,
            tokens_per_s: r.tokens_per_s,
            mfu: r.mfu,
            gpu_hours: r.gpu_hours,
        }
    }

    pub fn finish(self) -> Answer {
        let spec = self.spec;
        let mut frontier = Vec::new();
        let mut best_so_far = f64::NEG_INFINITY;
        for (g, r) in &self.per_gpus {
            let t = r.tokens_per_s.unwrap_or(0.0);
            let pareto = t > best_so_far;
            best_so_far = best_so_far.max(t);
            frontier.push(FrontierPoint { gpus: *g, pareto, best: self.pick(r) });
        }
        let span = |k: usize, seen: &[bool]| {
            let a = &spec.axes[k];
            AxisSpan {
                axis: a.path.clone(),
                any: seen.iter().all(|&s| s),
                values: a.values.iter().zip(seen).filter(|(_, &s)| s).map(|(v, _)| json(v)).collect(),
                literals: a.values.iter().zip(seen).filter(|(_, &s)| s).map(|(v, _)| literal(v)).collect(),
            }
        };
        let oom_regions = self
            .regions
            .iter()
            .map(|((step, _, phase), r)| OomRegion {
                step: *step,
                phase: phase.clone(),
                configurations: r.count,
                axes: r.seen.iter().enumerate().map(|(k, s)| span(k, s)).collect(),
            })
            .collect();
        let mut never_fits = Vec::new();
        for (k, a) in spec.axes.iter().enumerate() {
            // When nothing fits at all, every value would be listed: the count says it.
            if self.fits == 0 {
                break;
            }
            for (v, (n, f, phases)) in self.per_value[k].iter().enumerate() {
                if *n > 0 && *f == 0 {
                    never_fits.push(NeverFits {
                        axis: a.path.clone(),
                        value: json(&a.values[v]),
                        literal: literal(&a.values[v]),
                        configurations: *n,
                        oom: phases
                            .iter()
                            .map(|((step, _, phase), c)| PhaseCount {
                                step: *step,
                                phase: phase.clone(),
                                configurations: *c,
                            })
                            .collect(),
                    });
                }
            }
        }
        let hm = &spec.heatmap;
        let color = hm.color;
        let cells = self
            .cells
            .iter()
            .enumerate()
            .map(|(i, c)| Cell {
                x: i % self.nx,
                y: i / self.nx,
                configurations: c.n,
                fits: c.fits,
                state: match (&c.best, &c.furthest) {
                    (Some(b), _) => CellState::Fits { index: b.index, value: b.metric(color) },
                    (None, Some((step, _, phase))) => CellState::Oom { step: *step, phase: phase.clone() },
                    (None, None) => CellState::Empty,
                },
                winner: c.best.as_ref().map_or_else(Vec::new, |b| {
                    spec.axes.iter().zip(spec.value_indices(b.index)).map(|(a, v)| a.labels[v].clone()).collect()
                }),
            })
            .collect();
        let heatmap = Grid {
            x_axis: spec.axes[hm.x].path.clone(),
            x_values: spec.axes[hm.x].labels.clone(),
            y_axis: hm.y.map(|y| spec.axes[y].path.clone()),
            y_values: hm.y.map_or_else(Vec::new, |y| spec.axes[y].labels.clone()),
            color: color.key().to_string(),
            higher_is_better: spec
                .objective
                .iter()
                .find(|c| c.metric == color)
                .map_or(color.higher_is_better(), |c| c.maximize),
            cells,
            axes: spec
                .axes
                .iter()
                .map(|a| GridAxis {
                    path: a.path.clone(),
                    labels: a.labels.clone(),
                    numeric: a.values.iter().all(|v| !v.is_str()),
                })
                .collect(),
        };
        Answer {
            sweep: spec.name.clone(),
            description: spec.description.clone(),
            configurations: self.total,
            product: spec.size,
            fits: self.fits,
            oom: self.total - self.fits,
            objective: spec.objective.iter().map(|c| c.to_string()).collect(),
            token_budget: spec.token_budget,
            best: self.best.as_ref().map(|r| self.pick(r)),
            smallest_gpus_that_fit: self.per_gpus.keys().next().copied(),
            fastest: self.fastest.as_ref().map(|r| self.pick(r)),
            frontier,
            oom_regions,
            never_fits,
            heatmap,
        }
    }
}

fn json(v: &toml::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// 1234567.8 -> "1,234,568".
pub fn thousands(x: f64) -> String {
    let n = x.round() as i128;
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn configurations(n: u64) -> String {
    if n == 1 {
        "1 configuration".into()
    } else {
        format!("{n} configurations")
    }
}

fn config_text(config: &[AxisValue], skip: Option<&str>) -> String {
    config
        .iter()
        .filter(|a| Some(a.axis.as_str()) != skip)
        .map(|a| format!("{} = {}", a.axis, a.literal))
        .collect::<Vec<_>>()
        .join(", ")
}

fn figures(p: &Pick) -> String {
    let mut s = format!(
        "peak {:.2} GB allocated, {:.2} GB reserved of {:.2} GB",
        p.peak_allocated_gb, p.peak_reserved_gb, p.capacity_gb
    );
    if let (Some(st), Some(t), Some(m)) = (p.step_time_s, p.tokens_per_s, p.mfu) {
        s += &format!("; step {st:.3} s, {} tokens/s, MFU {:.1}%", thousands(t), m * 100.0);
    }
    if let Some(h) = p.gpu_hours {
        s += &format!("; {} GPU-hours for the token budget", thousands(h));
    }
    s
}

/// Short cell text: "1.23M", "OOM bwd".
pub fn cell_text(state: &CellState, metric: &str) -> String {
    match state {
        CellState::Empty => "-".into(),
        CellState::Oom { phase, .. } => format!("OOM {}", short_phase(phase)),
        CellState::Fits { value: Some(v), .. } => short_number(*v, metric),
        CellState::Fits { value: None, .. } => "fits".into(),
    }
}

pub fn short_phase(p: &str) -> &str {
    match p {
        "forward" => "fwd",
        "backward" => "bwd",
        "optimizer" => "opt",
        other => other,
    }
}

pub fn short_number(v: f64, metric: &str) -> String {
    match metric {
        "mfu" => format!("{:.1}%", v * 100.0),
        "step_time_s" => format!("{v:.2}s"),
        "gpus" => format!("{v:.0}"),
        _ if v.abs() >= 1e6 => format!("{:.2}M", v / 1e6),
        _ if v.abs() >= 1e4 => format!("{:.1}k", v / 1e3),
        _ if v.abs() >= 100.0 => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}

/// The printed answer.
pub fn render(a: &Answer) -> String {
    let mut s = String::new();
    let filtered = if a.configurations < a.product {
        format!(" ({} of {} kept by the filter)", a.configurations, a.product)
    } else {
        String::new()
    };
    s += &format!(
        "Sweep {}: {}{filtered}: {} fit, {} run out of memory\n",
        a.sweep,
        configurations(a.configurations),
        a.fits,
        a.oom
    );
    if !a.description.is_empty() {
        s += &format!("  {}\n", a.description);
    }
    s += &format!("\nObjective: {}\n", a.objective.join(", then "));
    match &a.best {
        None => s += "Best configuration: none fits\n",
        Some(b) => {
            s += &format!("Best configuration: #{}: {}\n", b.index, config_text(&b.config, None));
            s += &format!("  {}\n", figures(b));
        }
    }
    match a.smallest_gpus_that_fit {
        Some(g) => s += &format!("Smallest GPU count that fits: {g}\n"),
        None => s += "Smallest GPU count that fits: none of the GPU counts swept\n",
    }
    if let Some(f) = &a.fastest {
        s += &format!("Fastest configuration that fits: #{}: {}\n", f.index, config_text(&f.config, None));
        s += &format!("  {}\n", figures(f));
    }
    if !a.frontier.is_empty() {
        s += "\nFrontier: the most tokens/s that fits at each GPU count\n";
        s += &format!("  {:>6}  {:>12}  {:>10}  {:>6}  configuration\n", "GPUs", "tokens/s", "per GPU", "MFU");
        for p in &a.frontier {
            let t = p.best.tokens_per_s.unwrap_or(0.0);
            s += &format!(
                "  {:>6}  {:>12}  {:>10}  {:>6}  {}{}\n",
                p.gpus,
                thousands(t),
                thousands(t / p.gpus.max(1) as f64),
                p.best.mfu.map_or("-".into(), |m| format!("{:.1}%", m * 100.0)),
                config_text(&p.best.config, Some("hardware.gpus")),
                if p.pareto { "" } else { "  (dominated: fewer GPUs do better)" }
            );
        }
    }
    if !a.oom_regions.is_empty() {
        s += "\nWhere it runs out of memory, by the phase it fails in:\n";
        for r in &a.oom_regions {
            let axes: Vec<String> = r
                .axes
                .iter()
                .map(|x| {
                    if x.any {
                        format!("{} any", x.axis)
                    } else {
                        format!("{} in {{{}}}", x.axis, x.literals.join(", "))
                    }
                })
                .collect();
            s += &format!(
                "  {:<10} (step {}) {:>18}: {}\n",
                r.phase,
                r.step,
                configurations(r.configurations),
                axes.join("; ")
            );
        }
    }
    if !a.never_fits.is_empty() {
        s += "\nAxis values with which nothing fits:\n";
        for n in &a.never_fits {
            let phases: Vec<String> =
                n.oom.iter().map(|p| format!("{} (step {}) {}", p.phase, p.step, p.configurations)).collect();
            s += &format!(
                "  {} = {}: {}; OOM in {}\n",
                n.axis,
                n.literal,
                configurations(n.configurations),
                phases.join(", ")
            );
        }
    }
    let g = &a.heatmap;
    if g.x_values.len() <= 16 && g.y_values.len() <= 40 {
        let title = match &g.y_axis {
            Some(y) => format!("{} (rows) x {} (columns)", y, g.x_axis),
            None => g.x_axis.clone(),
        };
        s += &format!("\nHeatmap {title}: {} of the best configuration per cell\n", g.color);
        let ny = g.y_values.len().max(1);
        let texts: Vec<String> = g.cells.iter().map(|c| cell_text(&c.state, &g.color)).collect();
        let w = texts.iter().map(|t| t.len()).chain(g.x_values.iter().map(|v| v.len())).max().unwrap_or(4).max(4);
        let lw = g.y_values.iter().map(|v| v.len()).max().unwrap_or(0).max(4);
        s += &format!("  {:>lw$}", "");
        for v in &g.x_values {
            s += &format!("  {v:>w$}");
        }
        s += "\n";
        for y in 0..ny {
            s += &format!("  {:>lw$}", g.y_values.get(y).map_or("", String::as_str));
            for x in 0..g.x_values.len() {
                s += &format!("  {:>w$}", texts[y * g.x_values.len() + x]);
            }
            s += "\n";
        }
    }
    s
}
