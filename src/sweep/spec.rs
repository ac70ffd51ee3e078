//! Sweep files: a base scenario plus axes of values for scenario fields, a filter, an
//! objective and the heatmap's axes; expansion of the cartesian product into scenarios.
//!
//! Every configuration is the base scenario's TOML tree with each axis's value written at its
//! dotted path, validated by [`Scenario::from_value`], so a sweep point gets exactly the
//! validation and the messages a scenario file gets. Configuration `index` enumerates the
//! product with the first axis varying slowest (nested loops in file order).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::error::SweepError;
use super::filter::{Constraint, Env};
use crate::scenario::{Scenario, ScenarioFile};

/// One axis: a scenario field by its dotted path and the values it takes.
#[derive(Debug, Clone)]
pub struct Axis {
    pub path: String,
    pub values: Vec<toml::Value>,
    /// Each value as the CSV and the answer show it (strings unquoted).
    pub labels: Vec<String>,
}

/// A figure of merit of a configuration that fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Gpus,
    TokensPerS,
    TokensPerSPerGpu,
    StepTimeS,
    Mfu,
    PeakAllocatedGb,
    PeakReservedGb,
    HeadroomGb,
    /// GPU-hours to train on `token_budget` tokens.
    GpuHours,
}

impl Metric {
    pub const ALL: [Metric; 9] = [
        Metric::Gpus,
        Metric::TokensPerS,
        Metric::TokensPerSPerGpu,
        Metric::StepTimeS,
        Metric::Mfu,
        Metric::PeakAllocatedGb,
        Metric::PeakReservedGb,
        Metric::HeadroomGb,
        Metric::GpuHours,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Metric::Gpus => "gpus",
            Metric::TokensPerS => "tokens_per_s",
            Metric::TokensPerSPerGpu => "tokens_per_s_per_gpu",
            Metric::StepTimeS => "step_time_s",
            Metric::Mfu => "mfu",
            Metric::PeakAllocatedGb => "peak_allocated_gb",
            Metric::PeakReservedGb => "peak_reserved_gb",
            Metric::HeadroomGb => "headroom_gb",
            Metric::GpuHours => "gpu_hours",
        }
    }

    pub fn parse(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.key() == s)
    }

    /// Whether more is better when the objective does not say (heatmap colour scale).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::TokensPerS | Metric::TokensPerSPerGpu | Metric::Mfu | Metric::HeadroomGb)
    }

    fn allowed() -> String {
        Metric::ALL.iter().map(|m| format!("\"{}\"", m.key())).collect::<Vec<_>>().join(", ")
    }
}

/// One criterion of the objective: the first decides, later ones break ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Criterion {
    pub metric: Metric,
    pub maximize: bool,
}

impl fmt::Display for Criterion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", if self.maximize { "maximize" } else { "minimize" }, self.metric.key())
    }
}

/// The heatmap: two axes (indices into [`SweepSpec::axes`]) and the colour.
#[derive(Debug, Clone)]
pub struct HeatmapSpec {
    pub x: usize,
    /// None when the sweep has a single axis.
    pub y: Option<usize>,
    pub color: Metric,
}

/// A parsed and checked sweep file.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    pub name: String,
    pub description: String,
    /// The sweep file.
    pub source: PathBuf,
    /// The base scenario's file (the sweep file itself when the base is inline).
    pub base_source: PathBuf,
    base: toml::Table,
    pub axes: Vec<Axis>,
    pub filters: Vec<Constraint>,
    pub objective: Vec<Criterion>,
    /// Tokens to train on, for `gpu_hours`.
    pub token_budget: Option<f64>,
    pub heatmap: HeatmapSpec,
    /// Product of the axis lengths (before the filter).
    pub size: u64,
    /// Identifies the sweep's configurations and the simulator version (resume, merge).
    pub fingerprint: String,
}

// ---------------------------------------------------------------- file types

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFile {
    name: Option<String>,
    description: Option<String>,
    base: Option<toml::Value>,
    axes: Option<AxisEntries>,
    #[serde(default)]
    filter: Vec<String>,
    #[serde(default)]
    objective: Vec<ObjectiveEntry>,
    token_budget: Option<f64>,
    heatmap: Option<HeatmapFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjectiveEntry {
    minimize: Option<String>,
    maximize: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeatmapFile {
    x: Option<String>,
    y: Option<String>,
    color: Option<String>,
}

/// `[axes]` in document order, dotted keys and sub-tables flattened to dotted paths.
struct AxisEntries(Vec<(String, toml::Value)>);

enum Node {
    Table(Vec<(String, Node)>),
    Leaf(toml::Value),
}

impl<'de> Deserialize<'de> for AxisEntries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Node::Table(entries) = Node::deserialize(d)? else {
            return Err(de::Error::custom("must be a table of `dotted.path = [values]`"));
        };
        let mut out = Vec::new();
        flatten("", entries, &mut out);
        Ok(AxisEntries(out))
    }
}

fn flatten(prefix: &str, entries: Vec<(String, Node)>, out: &mut Vec<(String, toml::Value)>) {
    if entries.is_empty() && !prefix.is_empty() {
        // An empty table (`[axes.x]` with nothing under it) is a mistake to report.
        out.push((prefix.to_string(), toml::Value::Table(toml::Table::new())));
    }
    for (k, n) in entries {
        let path = if prefix.is_empty() { k } else { format!("{prefix}.{k}") };
        match n {
            Node::Table(t) => flatten(&path, t, out),
            Node::Leaf(v) => out.push((path, v)),
        }
    }
}

/// Where `axes.<path> = ...` is written in the source (None: not found line by line, e.g.
/// inside an inline table). TOML gathers dotted keys with the same first part into one
/// table, so the parser's order is not always the order the axes were written in.
fn axis_position(src: &str, path: &str) -> Option<usize> {
    let norm =
        |k: &str| k.split('.').map(|p| p.trim().trim_matches('"').trim_matches('\'')).collect::<Vec<_>>().join(".");
    let want = format!("axes.{path}");
    let mut table = String::new();
    let mut pos = 0;
    for line in src.split_inclusive('\n') {
        let start = pos;
        pos += line.len();
        let t = line.trim();
        if t.starts_with('[') {
            table = norm(t.trim_start_matches('[').split(']').next().unwrap_or(""));
        } else if let Some((k, _)) = t.split_once('=') {
            let key = norm(k);
            let full = if table.is_empty() { key } else { format!("{table}.{key}") };
            if full == want {
                return Some(start);
            }
        }
    }
    None
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of values or a table of axes")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    entries.push((k, map.next_value::<Node>()?));
                }
                Ok(Node::Table(entries))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<toml::Value>()? {
                    v.push(x);
                }
                Ok(Node::Leaf(toml::Value::Array(v)))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Leaf(toml::Value::Boolean(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Leaf(toml::Value::Integer(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
                i64::try_from(v).map(|v| Node::Leaf(toml::Value::Integer(v))).map_err(E::custom)
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Leaf(toml::Value::Float(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Leaf(toml::Value::String(v.to_string())))
            }
        }
        d.deserialize_any(NodeVisitor)
    }
}

// ---------------------------------------------------------------- loading

impl SweepSpec {
    /// Reads and checks a sweep file.
    pub fn load(path: &Path) -> Result<SweepSpec, SweepError> {
        let src = std::fs::read_to_string(path)
            .map_err(|e| SweepError::field(path, "", format!("cannot read the sweep file: {e}")))?;
        SweepSpec::from_toml(path, &src)
    }

    /// Parses and checks sweep text; `path` names it in errors and anchors a relative `base`.
    pub fn from_toml(path: &Path, src: &str) -> Result<SweepSpec, SweepError> {
        let file: SweepFile =
            toml::from_str(src).map_err(|e| SweepError::scenario(&crate::scenario::error::from_toml(path, src, &e)))?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "sweep".into());
        let name = file.name.clone().unwrap_or(stem);
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
            return Err(SweepError::field(
                path,
                "name",
                format!("\"{name}\" cannot name an output folder; use letters, digits, '-', '_' or '.'"),
            ));
        }

        // --- base
        let (base, base_source) = match file.base {
            None => {
                return Err(SweepError::field(
                    path,
                    "base",
                    "missing: give the base scenario as a path (base = \"../my-run.toml\", relative to this file) or inline ([base.model], [base.hardware], ...)",
                ))
            }
            Some(toml::Value::String(p)) => {
                let dir = path.parent().unwrap_or(Path::new("."));
                let bp = dir.join(&p);
                if let Err(e) = std::fs::metadata(&bp) {
                    return Err(SweepError::field(
                        path,
                        "base",
                        format!("cannot read the base scenario `{}`: {e}", bp.display()),
                    ));
                }
                // The base must be a valid scenario on its own (its own `extends` resolved):
                // errors name its file and line.
                let base = Scenario::load(&bp).map_err(|e| SweepError::scenario(&e))?;
                training_only(path, &base)?;
                let (table, _) = crate::scenario::extends::resolve(&bp).map_err(|e| SweepError::scenario(&e))?;
                (table, bp)
            }
            Some(toml::Value::Table(t)) => {
                let base =
                    Scenario::from_value(path, toml::Value::Table(t.clone())).map_err(|e| inline_base_error(path, &e))?;
                training_only(path, &base)?;
                (t, path.to_path_buf())
            }
            Some(other) => {
                return Err(SweepError::field(
                    path,
                    "base",
                    format!("must be a path (string) or a table, got {}", other.type_str()),
                ))
            }
        };

        // --- axes
        let mut raw_axes = file.axes.map(|a| a.0).unwrap_or_default();
        raw_axes.sort_by_key(|(p, _)| axis_position(src, p).unwrap_or(usize::MAX));
        if raw_axes.is_empty() {
            return Err(SweepError::field(
                path,
                "axes",
                "no axes: add e.g. [axes] with `hardware.gpus = [8, 16, 32]` (any scenario field by its dotted path)",
            ));
        }
        let mut axes: Vec<Axis> = Vec::new();
        for (p, v) in raw_axes {
            let field = format!("axes.{p}");
            if axes.iter().any(|a| a.path == p) {
                return Err(SweepError::field(path, &field, "is given twice"));
            }
            let toml::Value::Array(values) = v else {
                return Err(SweepError::field(
                    path,
                    &field,
                    format!("must be a non-empty list of values, e.g. `{p} = [...]`; got {}", v.type_str()),
                ));
            };
            if values.is_empty() {
                return Err(SweepError::field(path, &field, "must be a non-empty list of values"));
            }
            let labels: Vec<String> = values.iter().map(label).collect();
            for (i, l) in labels.iter().enumerate() {
                if labels[..i].contains(l) {
                    return Err(SweepError::field(
                        path,
                        &field,
                        format!("lists the value {} twice", literal(&values[i])),
                    ));
                }
            }
            // Each value alone must be of the right type for its field (whether it is valid in
            // combination with the other axes is checked per configuration).
            for (i, value) in values.iter().enumerate() {
                let mut tree = base.clone();
                set_path(&mut tree, &p, value.clone()).map_err(|m| SweepError::field(path, &field, m))?;
                let tree = toml::Value::Table(tree);
                if ScenarioFile::deserialize(tree.clone()).is_ok() {
                    continue;
                }
                let detail = match Scenario::from_value(path, tree) {
                    Err(se) if !se.field.is_empty() => format!("field `{}`: {}", se.field, se.message),
                    Err(se) => se.message,
                    Ok(_) => "does not fit the scenario format".to_string(),
                };
                return Err(SweepError::field(
                    path,
                    &field,
                    format!("value {} (item {} of the list): {detail}", literal(value), i + 1),
                ));
            }
            axes.push(Axis { path: p, values, labels });
        }
        let mut size: u64 = 1;
        for a in &axes {
            size = size.checked_mul(a.values.len() as u64).ok_or_else(|| {
                SweepError::field(path, "axes", "the product of the axes has more than 2^64 configurations")
            })?;
        }

        // --- filter
        let mut filters = Vec::new();
        for (i, text) in file.filter.iter().enumerate() {
            // A long constraint is quoted by its start.
            let shown: String = if text.chars().count() > 80 {
                text.chars().take(80).chain("...".chars()).collect()
            } else {
                text.clone()
            };
            let c = Constraint::parse(text, &axes, &base)
                .map_err(|m| SweepError::field(path, &format!("filter[{i}]"), format!("`{shown}`: {m}")))?;
            filters.push(c);
        }

        // --- objective
        let token_budget = file.token_budget;
        if let Some(t) = token_budget {
            if !(t > 0.0 && t.is_finite()) {
                return Err(SweepError::field(
                    path,
                    "token_budget",
                    format!("must be a positive number of tokens, got {t}"),
                ));
            }
        }
        let mut objective = Vec::new();
        for (i, o) in file.objective.iter().enumerate() {
            let field = format!("objective[{i}]");
            let (name, maximize) = match (&o.minimize, &o.maximize) {
                (Some(m), None) => (m, false),
                (None, Some(m)) => (m, true),
                _ => {
                    return Err(SweepError::field(
                        path,
                        &field,
                        "each [[objective]] entry has exactly one of `minimize = \"<metric>\"` or `maximize = \"<metric>\"`",
                    ))
                }
            };
            let sub = format!("{field}.{}", if maximize { "maximize" } else { "minimize" });
            let metric = Metric::parse(name).ok_or_else(|| {
                SweepError::field(path, &sub, format!("unknown metric \"{name}\"; allowed: {}", Metric::allowed()))
            })?;
            if metric == Metric::GpuHours && token_budget.is_none() {
                return Err(SweepError::field(
                    path,
                    &sub,
                    "\"gpu_hours\" needs `token_budget` (tokens to train on) at the top of the sweep file",
                ));
            }
            objective.push(Criterion { metric, maximize });
        }
        if objective.is_empty() {
            objective = vec![
                Criterion { metric: Metric::Gpus, maximize: false },
                Criterion { metric: Metric::TokensPerS, maximize: true },
            ];
        }

        // --- heatmap
        let hm = file.heatmap.unwrap_or(HeatmapFile { x: None, y: None, color: None });
        let find = |field: &str, p: &str| {
            axes.iter().position(|a| a.path == p).ok_or_else(|| {
                SweepError::field(
                    path,
                    field,
                    format!(
                        "\"{p}\" is not an axis; axes: {}",
                        axes.iter().map(|a| format!("\"{}\"", a.path)).collect::<Vec<_>>().join(", ")
                    ),
                )
            })
        };
        let x = match &hm.x {
            Some(p) => find("heatmap.x", p)?,
            None => 0,
        };
        let y = match &hm.y {
            Some(p) => Some(find("heatmap.y", p)?),
            None => (0..axes.len()).find(|&i| i != x),
        };
        if y == Some(x) {
            return Err(SweepError::field(path, "heatmap.y", "must be a different axis from heatmap.x"));
        }
        let color = match &hm.color {
            Some(c) => {
                let m = Metric::parse(c).ok_or_else(|| {
                    SweepError::field(
                        path,
                        "heatmap.color",
                        format!("unknown metric \"{c}\"; allowed: {}", Metric::allowed()),
                    )
                })?;
                if m == Metric::GpuHours && token_budget.is_none() {
                    return Err(SweepError::field(path, "heatmap.color", "\"gpu_hours\" needs `token_budget`"));
                }
                m
            }
            // The first criterion other than the GPU count (an axis, or one value for the
            // whole sweep: as a colour it says little).
            None => objective.iter().map(|c| c.metric).find(|&m| m != Metric::Gpus).unwrap_or(Metric::TokensPerS),
        };

        let fingerprint = fingerprint(&base, &axes, &filters, token_budget);
        let spec = SweepSpec {
            name,
            description: file.description.unwrap_or_default(),
            source: path.to_path_buf(),
            base_source,
            base,
            axes,
            filters,
            objective,
            token_budget,
            heatmap: HeatmapSpec { x, y, color },
            size,
            fingerprint,
        };
        Ok(spec)
    }

    /// The value index of each axis for configuration `index`.
    pub fn value_indices(&self, index: u64) -> Vec<usize> {
        let mut out = vec![0; self.axes.len()];
        let mut rest = index;
        for (k, a) in self.axes.iter().enumerate().rev() {
            let n = a.values.len() as u64;
            out[k] = (rest % n) as usize;
            rest /= n;
        }
        out
    }

    /// The base tree with configuration `index`'s values written in.
    pub fn tree(&self, index: u64) -> toml::Table {
        let mut t = self.base.clone();
        for (a, vi) in self.axes.iter().zip(self.value_indices(index)) {
            // Checked when the spec was loaded: every path reaches a table.
            let _ = set_path(&mut t, &a.path, a.values[vi].clone());
        }
        t
    }

    /// "hardware.gpus = 16, parallel.sharding = \"full_shard\"".
    pub fn describe(&self, index: u64) -> String {
        self.axes
            .iter()
            .zip(self.value_indices(index))
            .map(|(a, vi)| format!("{} = {}", a.path, literal(&a.values[vi])))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Configuration `index` as a validated scenario, or None when the filter drops it. A
    /// configuration that does not validate is an error unless the filter, evaluated on its
    /// raw values, drops it.
    pub fn point(&self, index: u64) -> Result<Option<Scenario>, SweepError> {
        let tree = self.tree(index);
        let s = match Scenario::from_value(&self.source, toml::Value::Table(tree.clone())) {
            Ok(s) => s,
            Err(e) => {
                let raw = Env { scenario: None, tree: &tree };
                if self.filters.iter().any(|c| c.eval(&raw) == Ok(false)) {
                    return Ok(None);
                }
                return Err(self.invalid(index, &e));
            }
        };
        let env = Env { scenario: Some(&s), tree: &tree };
        for (i, c) in self.filters.iter().enumerate() {
            let keep = c.eval(&env).map_err(|m| {
                SweepError::Input(format!(
                    "{}: field `filter[{i}]`: `{}`: {m} (in configuration {index}: {})",
                    self.source.display(),
                    c.text,
                    self.describe(index)
                ))
            })?;
            if !keep {
                return Ok(None);
            }
        }
        Ok(Some(s))
    }

    fn invalid(&self, index: u64, e: &crate::scenario::ScenarioError) -> SweepError {
        let vi = self.value_indices(index);
        let what = match self.axes.iter().position(|a| a.path == e.field) {
            Some(k) => format!(
                "axis `{}` = {} (in configuration {index}: {})",
                e.field,
                literal(&self.axes[k].values[vi[k]]),
                self.describe(index)
            ),
            None => format!("configuration {index} ({})", self.describe(index)),
        };
        let field = if e.field.is_empty() { String::new() } else { format!("field `{}`: ", e.field) };
        SweepError::Input(format!(
            "{}: {what}: {field}{} (a `filter` can leave such combinations out)",
            self.source.display(),
            e.message
        ))
    }

    /// The CSV header of this sweep's rows.
    pub fn csv_header(&self) -> String {
        super::output::header(self)
    }
}

fn inline_base_error(path: &Path, e: &crate::scenario::ScenarioError) -> SweepError {
    let field = if e.field.is_empty() { "base".to_string() } else { format!("base.{}", e.field) };
    SweepError::field(path, &field, &e.message)
}

/// Writes `value` at the dotted `path` of `tree`, creating tables on the way.
pub(crate) fn set_path(tree: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("`{path}` is not a dotted path of scenario fields"));
    }
    let mut t = tree;
    for (i, p) in parts[..parts.len() - 1].iter().enumerate() {
        let entry = t.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(sub) => sub,
            other => {
                return Err(format!(
                    "`{}` is a {} in the base scenario, not a table of fields",
                    parts[..=i].join("."),
                    other.type_str()
                ))
            }
        };
    }
    t.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// The value at a dotted path of a tree, if any.
pub(crate) fn get_path<'t>(tree: &'t toml::Table, path: &str) -> Option<&'t toml::Value> {
    let mut parts = path.split('.');
    let mut v = tree.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

/// A value as a CSV cell and in tables: strings bare, everything else as TOML writes it.
pub fn label(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => literal(other),
    }
}

/// A value as TOML writes it (strings quoted): what to paste into a scenario file.
pub fn literal(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => other.to_string(),
    }
}

/// 64-bit FNV-1a: the sweep's fingerprint and the checksum of a finished sweep.csv (it
/// detects a damaged or edited table; it is not a defence against tampering).
#[derive(Debug, Clone, Copy)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Fnv64 {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// FNV-1a over everything that decides the sweep's rows.
fn fingerprint(base: &toml::Table, axes: &[Axis], filters: &[Constraint], budget: Option<f64>) -> String {
    let mut h = Fnv64::default();
    let mut feed = |s: &str| {
        h.update(s.as_bytes());
        h.update(&[0xff]);
    };
    feed(env!("CARGO_PKG_VERSION"));
    feed(&toml::Value::Table(base.clone()).to_string());
    for a in axes {
        feed(&a.path);
        for v in &a.values {
            feed(&literal(v));
        }
    }
    for f in filters {
        feed(&f.text);
    }
    feed(&format!("{budget:?}"));
    h.hex()
}

/// Sweeps simulate training steps; an inference base is refused up front rather than swept
/// through the training path.
fn training_only(path: &Path, base: &Scenario) -> Result<(), SweepError> {
    if base.job == crate::scenario::JobKind::Inference {
        return Err(SweepError::field(
            path,
            "base",
            "is an inference job (job.kind = \"inference\"): sweeps simulate training steps only; `stepsim run` reports an inference job's largest batch and context that fit",
        ));
    }
    Ok(())
}
