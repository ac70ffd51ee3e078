//! `sweep.csv`: one row per configuration, in configuration order, written and read back
//! with fixed decimals so a sweep gives the same bytes whatever `--jobs` or `--shard` did.
//!
//! Columns: `index` (position in the full cartesian product, first axis slowest), one column
//! per axis (its dotted path), `gpus`, `tokens_per_step`, `verdict` (`fits` | `oom`),
//! `oom_step`, `oom_phase`, `oom_layer` (empty when it fits or the OOM is outside a layer),
//! `peak_allocated_gb`, `peak_reserved_gb`, `capacity_gb` (GB = 1e9 bytes),
//! `step_time_s`, `tokens_per_s`, `mfu` (steady-state step; empty on OOM), and `gpu_hours`
//! when the sweep sets `token_budget`.

use super::spec::{label, Metric, SweepSpec};
use super::summary::Outcome;

const FIXED: [&str; 13] = [
    "gpus",
    "tokens_per_step",
    "verdict",
    "oom_step",
    "oom_phase",
    "oom_layer",
    "peak_allocated_gb",
    "peak_reserved_gb",
    "capacity_gb",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "gpu_hours",
];

/// The header line (with its newline).
pub fn header(spec: &SweepSpec) -> String {
    let mut cols = vec!["index".to_string()];
    cols.extend(spec.axes.iter().map(|a| csv_field(&a.path)));
    let n = if spec.token_budget.is_some() { FIXED.len() } else { FIXED.len() - 1 };
    cols.extend(FIXED[..n].iter().map(|s| s.to_string()));
    format!("{}\n", cols.join(","))
}

/// One configuration's row (with its newline).
pub fn format_row(spec: &SweepSpec, index: u64, o: &Outcome) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(160);
    let _ = write!(s, "{index}");
    for (a, vi) in spec.axes.iter().zip(spec.value_indices(index)) {
        s.push(',');
        s.push_str(&csv_field(&a.labels[vi]));
    }
    let _ = write!(s, ",{},{}", o.gpus, o.tokens_per_step);
    match &o.oom {
        None => s.push_str(",fits,,,"),
        Some(at) => {
            let _ = write!(s, ",oom,{},{},", at.step, at.phase.name());
            if let Some(l) = at.layer {
                let _ = write!(s, "{l}");
            }
        }
    }
    let _ = write!(
        s,
        ",{:.3},{:.3},{:.3}",
        o.peak_allocated as f64 / 1e9,
        o.peak_reserved as f64 / 1e9,
        o.capacity as f64 / 1e9
    );
    match o.throughput {
        Some(t) if o.oom.is_none() => {
            let _ = write!(s, ",{:.6},{:.1},{:.4}", t.step_time_s, t.tokens_per_s, t.mfu);
            if let Some(budget) = spec.token_budget {
                let hours = o.gpus as f64 * budget / t.tokens_per_s / 3600.0;
                let _ = write!(s, ",{hours:.1}");
            }
        }
        _ => {
            s.push_str(",,,");
            if spec.token_budget.is_some() {
                s.push(',');
            }
        }
    }
    s.push('\n');
    s
}

/// A row read back from `sweep.csv` (what the answer and the heatmap are computed from).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub index: u64,
    pub gpus: u64,
    pub tokens_per_step: u64,
    pub fits: bool,
    pub oom_step: Option<u32>,
    /// `init` | `forward` | `backward` | `optimizer`; empty when it fits.
    pub oom_phase: String,
    pub oom_layer: Option<u64>,
    pub peak_allocated_gb: f64,
    pub peak_reserved_gb: f64,
    pub capacity_gb: f64,
    pub step_time_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub mfu: Option<f64>,
    pub gpu_hours: Option<f64>,
}

impl Row {
    /// The metric's value (None for throughput figures of a configuration that does not fit).
    pub fn metric(&self, m: Metric) -> Option<f64> {
        match m {
            Metric::Gpus => Some(self.gpus as f64),
            Metric::TokensPerS => self.tokens_per_s,
            Metric::TokensPerSPerGpu => self.tokens_per_s.map(|t| t / self.gpus.max(1) as f64),
            Metric::StepTimeS => self.step_time_s,
            Metric::Mfu => self.mfu,
            Metric::PeakAllocatedGb => Some(self.peak_allocated_gb),
            Metric::PeakReservedGb => Some(self.peak_reserved_gb),
            Metric::HeadroomGb => Some(self.capacity_gb - self.peak_reserved_gb.max(self.peak_allocated_gb)),
            Metric::GpuHours => self.gpu_hours,
        }
    }
}

/// Parses one line (without its newline) of a sweep with `axes` axes.
pub fn parse_row(line: &str, axes: usize) -> Result<Row, String> {
    let f = split_csv(line)?;
    let want = 1 + axes + FIXED.len();
    if f.len() != want && f.len() != want - 1 {
        return Err(format!("expected {} or {} fields, found {}", want - 1, want, f.len()));
    }
    let k = 1 + axes;
    let num = |i: usize, what: &str| -> Result<Option<f64>, String> {
        match f.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(x) => x.parse::<f64>().map(Some).map_err(|_| format!("{what}: `{x}` is not a number")),
        }
    };
    let int = |i: usize, what: &str| -> Result<Option<u64>, String> {
        match f.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(x) => x.parse::<u64>().map(Some).map_err(|_| format!("{what}: `{x}` is not an integer")),
        }
    };
    let fits = match f[k + 2].as_str() {
        "fits" => true,
        "oom" => false,
        v => return Err(format!("verdict: `{v}` is neither `fits` nor `oom`")),
    };
    Ok(Row {
        index: int(0, "index")?.ok_or("index is empty")?,
        gpus: int(k, "gpus")?.unwrap_or(0),
        tokens_per_step: int(k + 1, "tokens_per_step")?.unwrap_or(0),
        fits,
        oom_step: int(k + 3, "oom_step")?.map(|s| s as u32),
        oom_phase: f[k + 4].clone(),
        oom_layer: int(k + 5, "oom_layer")?,
        peak_allocated_gb: num(k + 6, "peak_allocated_gb")?.unwrap_or(0.0),
        peak_reserved_gb: num(k + 7, "peak_reserved_gb")?.unwrap_or(0.0),
        capacity_gb: num(k + 8, "capacity_gb")?.unwrap_or(0.0),
        step_time_s: num(k + 9, "step_time_s")?,
        tokens_per_s: num(k + 10, "tokens_per_s")?,
        mfu: num(k + 11, "mfu")?,
        gpu_hours: num(k + 12, "gpu_hours")?,
    })
}

/// The index (first field) of a row, without parsing the rest.
pub fn row_index(line: &str) -> Option<u64> {
    line.split(',').next()?.parse().ok()
}

/// A CSV field, quoted when it must be (RFC 4180): memory.csv's rule too.
pub use crate::report::csv_field;

/// Splits one CSV line into fields (RFC 4180 quoting).
pub fn split_csv(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' && at_start {
            quoted = true;
            at_start = false;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
            at_start = true;
        } else {
            cur.push(c);
            at_start = false;
        }
    }
    if quoted {
        return Err("unterminated quoted field".into());
    }
    out.push(cur);
    Ok(out)
}

/// The axis values of a row as `path = value` pairs (strings bare).
pub fn axis_values(spec: &SweepSpec, index: u64) -> Vec<(String, String)> {
    spec.axes.iter().zip(spec.value_indices(index)).map(|(a, vi)| (a.path.clone(), label(&a.values[vi]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_round_trip() {
        let fields = ["plain", "with,comma", "with \"quote\"", ""];
        let line = fields.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(",");
        assert_eq!(split_csv(&line).unwrap(), fields);
        assert!(split_csv("\"open").is_err());
    }
}
