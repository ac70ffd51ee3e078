//! Writers for `report.json`, `memory.csv`, `trace.json` and `memory.png`. Each file is written to a
//! temporary name and renamed into place, so a file that exists is complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::png::{MemoryPlot, OomMark, PhaseSpan, RankPanel};
use super::{fmt_bytes, phase_spans, Report};
use crate::engine::Trace;
use crate::memory::Category;
use crate::schedule::Schedule;

/// A file that could not be written.
#[derive(Debug)]
pub struct WriteError {
    pub path: PathBuf,
    pub message: String,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for WriteError {}

fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let tmp = path.with_extension("tmp-stepsim");
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        WriteError { path: path.to_path_buf(), message: e.to_string() }
    })
}

/// All or nothing on disk: `write` puts its files into a staging folder inside `dir`; once
/// every one is written they are moved into `dir` (renames within one folder). A failure
/// leaves `dir`'s previous files as they were and removes the staging folder, so a reader
/// never finds a new report.json beside an old memory.csv, or half a set.
pub fn publish(
    dir: &Path,
    write: impl FnOnce(&Path) -> Result<Vec<PathBuf>, WriteError>,
) -> Result<Vec<PathBuf>, WriteError> {
    let err = |path: &Path, message: String| WriteError { path: path.to_path_buf(), message };
    if dir.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) && dir.metadata().is_err() {
        return Err(err(dir, "is a symbolic link to a folder that does not exist (or a loop of links)".into()));
    }
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create the output folder: {e}")))?;
    let staging = dir.join(".stepsim-partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| err(&staging, format!("cannot create a staging folder: {e}")))?;
    // Removed however this function is left, a panic's unwinding included.
    struct Staging<'a>(&'a Path);
    impl Drop for Staging<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _staging = Staging(&staging);
    let written = match write(&staging) {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            let path = e.path.strip_prefix(&staging).map_or(e.path.clone(), |rel| dir.join(rel));
            return Err(WriteError { path, message: e.message });
        }
    };
    // What could stop a rename inside one folder: a folder in the way. Checked for every
    // file before the first one moves.
    if let Some(dest) = written
        .iter()
        .map(|p| dir.join(p.file_name().unwrap_or_default()))
        .find(|d| d.symlink_metadata().is_ok_and(|m| m.is_dir()))
    {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(err(&dest, "a folder is in the way of this output file".into()));
    }
    let mut out = Vec::with_capacity(written.len());
    for p in written {
        let dest = dir.join(p.file_name().unwrap_or_default());
        std::fs::rename(&p, &dest).map_err(|e| err(&dest, e.to_string()))?;
        out.push(dest);
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(out)
}

pub fn report_json(r: &Report) -> String {
    let mut s = serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// Nanoseconds printed as seconds with nine decimals.
struct Secs9(u64);

impl std::fmt::Display for Secs9 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:09}", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}

/// Rows past which a job's memory.csv is a summary (about 55 MB): what a spreadsheet or pandas
/// opens in seconds.
pub const MEMORY_CSV_ROW_BUDGET: usize = 1_000_000;

/// How much of the run the output files hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputDetail {
    /// trace.json with every event past its budget (`run --trace full`).
    pub full_trace: bool,
    /// memory.csv with every change past its budget (`run --memory-csv full`).
    pub full_memory_csv: bool,
}

/// `memory.csv` of one rank class: one row per change of a category's bytes, plus the
/// allocated and reserved totals and what nvidia-smi shows (reserved plus `outside`: the CUDA
/// context and NCCL's buffers); values hold until the next row of the same (rank_class,
/// category). Of every sample, or only those `keep` marks (a summary).
fn memory_csv_of(trace: &Trace, rank_class: &str, outside: u64, keep: Option<&[bool]>) -> String {
    // A class's name may hold a comma ("stage 0, expert rank 3 (ranks 3)"): quoted (RFC 4180).
    let rank_class = &super::csv_field(rank_class);
    let rows = keep.map_or(trace.timeline.sample_count(), |k| k.iter().filter(|&&x| x).count());
    let mut o = String::with_capacity(rows * 48);
    o.push_str("time_s,rank_class,category,bytes\n");
    use std::fmt::Write as _;
    // Seconds with nine decimals, from the integer nanoseconds (what `{:.9}` of the f64 prints,
    // without float formatting's exact path).
    for_each_row(trace, outside, keep, |t, key, v| {
        let _ = writeln!(o, "{},{rank_class},{key},{v}", Secs9(t));
    });
    o
}

/// memory.csv's rows of one class, in order, as (time in ns, category key, bytes): a row
/// where a category's bytes (or the allocated, reserved, nvidia-smi or active total) differ
/// from its previous row, at the samples `keep` marks (every sample for None).
fn for_each_row(trace: &Trace, outside: u64, keep: Option<&[bool]>, mut emit: impl FnMut(u64, &str, u64)) {
    let mut prev = [u64::MAX; Category::COUNT];
    let mut prev_alloc = u64::MAX;
    let mut prev_res = u64::MAX;
    let mut prev_active = u64::MAX;
    for (i, s) in trace.timeline.samples().enumerate() {
        if keep.is_some_and(|k| !k[i]) {
            continue;
        }
        let t = s.time_ns;
        for c in Category::ALL {
            let v = s.by_category[c.index()];
            if v != prev[c.index()] && !(prev[c.index()] == u64::MAX && v == 0) {
                emit(t, c.key(), v);
                prev[c.index()] = v;
            }
        }
        if s.allocated != prev_alloc {
            emit(t, "allocated", s.allocated);
            prev_alloc = s.allocated;
        }
        if s.reserved != prev_res {
            emit(t, "reserved", s.reserved);
            emit(t, "nvidia_smi", s.reserved.saturating_add(outside));
            prev_res = s.reserved;
        }
        if s.active != prev_active {
            emit(t, "active", s.active);
            prev_active = s.active;
        }
    }
}

pub fn memory_plot(r: &Report, sched: &Schedule, trace: &Trace, rank_label: &str) -> MemoryPlot {
    // Only the categories the run ever holds: the plot draws no empty layer and colours each
    // category by its own name, and a large run's series are copied once per category.
    let held = trace.timeline.categories_held();
    let cats: Vec<Category> = Category::ALL.iter().copied().filter(|c| held[c.index()]).collect();
    let room = trace.timeline.sample_count() + 2;
    let mut times = Vec::with_capacity(room);
    // One allocation per series (`vec![v; n]` would clone `v` without its capacity).
    let mut bytes: Vec<Vec<u64>> = (0..cats.len()).map(|_| Vec::with_capacity(room)).collect();
    times.push(0.0);
    for b in bytes.iter_mut() {
        b.push(0);
    }
    for s in trace.timeline.samples() {
        times.push(s.time_ns as f64 / 1e9);
        for (i, c) in cats.iter().enumerate() {
            bytes[i].push(s.by_category[c.index()]);
        }
    }
    let end = trace.end_time_ns as f64 / 1e9;
    if end > *times.last().unwrap_or(&0.0) {
        times.push(end);
        for b in bytes.iter_mut() {
            let last = *b.last().unwrap_or(&0);
            b.push(last);
        }
    }
    let reserved = super::allocator::reserved_series(&r.allocator, trace, times.len());
    // A zero-length init is left out, unless nothing else happens (an OOM while loading
    // weights): memory.png then names it on its allocation axis.
    let zero_span = trace.end_time_ns == 0;
    let phases = phase_spans(sched, trace)
        .into_iter()
        .filter(|p| p.1 != crate::schedule::Phase::Init || p.3 > p.2 || zero_span)
        .map(|(step, ph, a, b)| PhaseSpan {
            label: if step == 0 { ph.name().to_string() } else { format!("{} {}", ph.name(), step) },
            start_s: a as f64 / 1e9,
            end_s: b as f64 / 1e9,
        })
        .collect();
    let oom = match &r.verdict {
        super::Verdict::Oom(o) => Some(OomMark {
            time_s: o.at.time_s,
            label: format!("OOM: {} in {} (+{})", o.at.op, o.at.phase.name(), fmt_bytes(o.requested.bytes)),
            requested_bytes: o.requested.bytes,
        }),
        _ => None,
    };
    MemoryPlot {
        title: format!("stepsim: {} - memory per GPU ({} params)", r.scenario, r.param_count_human),
        note: None,
        panels: vec![RankPanel {
            label: rank_label.to_string(),
            capacity_bytes: r.capacity.bytes,
            categories: cats.iter().map(|c| c.label().to_string()).collect(),
            times_s: times,
            bytes,
            reserved,
            phases,
            oom,
            host_note: host_note(r),
            peak_op: r.peak.as_ref().map(|p| format!("`{}`", p.at.op)),
            peak_time_s: r.peak.as_ref().map(|p| p.at.time_s),
            window_s: None,
        }],
    }
}

/// What offload keeps in pinned host memory, for memory.png's legend.
fn host_note(r: &Report) -> Option<String> {
    if let Some(o) = &r.offload {
        return Some(format!(
            "in host memory, not on the GPU: {} per GPU ({}); {} per node of {}",
            fmt_bytes(o.host_bytes_per_gpu.bytes),
            o.host_holds,
            fmt_bytes(o.host_bytes_per_node.bytes),
            fmt_bytes(o.host_capacity.bytes)
        ));
    }
    r.activation_offload.as_ref().map(|a| {
        format!(
            "in host memory, not on the GPU: {} per GPU and micro-batch of offloaded activations ({})",
            fmt_bytes(a.host_bytes_per_gpu.bytes),
            a.method
        )
    })
}

/// One rank class's program, run and report, for the per-class outputs.
pub type ClassView<'a> = (&'a Schedule, &'a Trace, &'a Report);

/// At most this many classes get a memory.png panel: the first, the last, the headline
/// class, the one with the highest peak and evenly spaced ones between (all of them up to
/// this count); the figure names the ones left out.
const MAX_CLASS_PANELS: usize = 8;

/// The classes (by index, ascending) that get a panel, of `n` with the given peaks.
fn class_panels(n: usize, headline: usize, peaks: &[u64]) -> Vec<usize> {
    if n <= MAX_CLASS_PANELS {
        return (0..n).collect();
    }
    let highest = (0..n).max_by_key(|&k| (peaks.get(k).copied().unwrap_or(0), std::cmp::Reverse(k))).unwrap_or(0);
    let mut v = vec![0, n - 1, headline.min(n - 1), highest];
    v.sort_unstable();
    v.dedup();
    // Then, one at a time, the class farthest from those already chosen: evenly spaced.
    while v.len() < MAX_CLASS_PANELS {
        let gap = |k: usize| v.iter().map(|&x| x.abs_diff(k)).min().unwrap_or(n);
        match (0..n).filter(|k| !v.contains(k)).max_by_key(|&k| (gap(k), std::cmp::Reverse(k))) {
            Some(k) => {
                v.push(k);
                v.sort_unstable();
            }
            None => break,
        }
    }
    v
}

/// Names a set of classes compactly: "stages 1, 3-4, 6" or "stage 0, expert ranks 1-2, 4-7;
/// stage 1, expert ranks 0-2" (their roles grouped by what precedes the last number).
fn name_classes(roles: &[String]) -> String {
    let mut groups: Vec<(String, Vec<u64>)> = Vec::new();
    let mut loose: Vec<String> = Vec::new();
    for role in roles {
        match role.rsplit_once(' ').and_then(|(prefix, n)| n.parse::<u64>().ok().map(|n| (prefix, n))) {
            Some((prefix, n)) => match groups.iter_mut().find(|g| g.0 == prefix) {
                Some(g) => g.1.push(n),
                None => groups.push((prefix.to_string(), vec![n])),
            },
            None => loose.push(role.clone()),
        }
    }
    let mut parts: Vec<String> = groups
        .into_iter()
        .map(|(prefix, mut ns)| {
            ns.sort_unstable();
            ns.dedup();
            let mut ranges: Vec<String> = Vec::new();
            let mut i = 0;
            while i < ns.len() {
                let mut j = i;
                while j + 1 < ns.len() && ns[j + 1] == ns[j] + 1 {
                    j += 1;
                }
                ranges.push(if j > i { format!("{}-{}", ns[i], ns[j]) } else { ns[i].to_string() });
                i = j + 1;
            }
            let prefix = if ns.len() > 1 {
                match prefix.rsplit_once(' ') {
                    Some((head, last)) => format!("{head} {}", plural(last)),
                    None => plural(&prefix),
                }
            } else {
                prefix
            };
            format!("{prefix} {}", ranges.join(", "))
        })
        .collect();
    parts.extend(loose);
    parts.join("; ")
}

fn plural(word: &str) -> String {
    if word.ends_with('s') {
        format!("{word}es")
    } else {
        format!("{word}s")
    }
}

/// The note under memory.png's title when some classes have no panel: which are drawn and
/// which are left out.
fn left_out_note(r: &Report, n: usize, shown: &[usize]) -> Option<String> {
    if shown.len() >= n {
        return None;
    }
    let role = |k: usize| r.rank_classes.get(k).map_or(format!("class {k}"), |c| class_role(c, k));
    let drawn: Vec<String> = shown.iter().map(|&k| role(k)).collect();
    let left: Vec<String> = (0..n).filter(|k| !shown.contains(k)).map(role).collect();
    Some(format!(
        "{} of {n} rank classes drawn ({}); left out: {} (every class's memory over time is in memory.csv)",
        shown.len(),
        name_classes(&drawn),
        name_classes(&left)
    ))
}

/// A class's name in the outputs: "stage 2 (ranks 8-11)", "data-parallel rank 5 (ranks
/// 20-23)", "stage 1, data-parallel rank 0 (ranks 4-7)".
fn class_name(r: &Report, k: usize) -> String {
    r.rank_classes.get(k).map_or(format!("class {k}"), |c| class_label(c, k))
}

/// [`class_name`] of a class the report describes.
fn class_label(c: &super::RankClass, k: usize) -> String {
    format!("{} (ranks {})", class_role(c, k), c.ranks)
}

/// What a class is, without its ranks: "stage 2", "stage 0, expert rank 3".
fn class_role(c: &super::RankClass, k: usize) -> String {
    match (&c.stage, c.rank) {
        _ if c.expert_rank.is_some() => {
            let e = c.expert_rank.unwrap_or(0);
            c.stage.as_ref().map_or(format!("expert rank {e}"), |st| format!("stage {}, expert rank {e}", st.stage))
        }
        (Some(st), None) => format!("stage {}", st.stage),
        (None, Some(r)) => format!("data-parallel rank {r}"),
        (Some(st), Some(r)) => format!("stage {}, data-parallel rank {r}", st.stage),
        (None, None) => format!("class {k}"),
    }
}

/// Writes a job's outputs: [`write_all`] for a job of one class; with several,
/// memory.csv and trace.json hold every class (one rank class, one trace process each),
/// memory.png a panel per class (up to 8), timeline.png a row group per class (up to 16).
pub fn write_job(
    dir: &Path,
    r: &Report,
    classes: &[ClassView],
    links: &[crate::engine::Link],
    headline: usize,
    plan: &OutputPlan,
) -> Result<Vec<PathBuf>, WriteError> {
    let (sched, trace, _) = classes[headline];
    let traces: Vec<&Trace> = classes.iter().map(|c| c.1).collect();
    let detail = plan.trace;
    // Built on whichever core writes it, beside trace.json and memory.png.
    let csv = || job_memory_csv_at(r, &traces, plan.keep.as_deref());
    if classes.len() == 1 {
        return write_files(dir, r, (sched, trace), (&[], 0), (Some(detail), true), csv);
    }
    // The files are independent: trace.json and memory.png of every class are rendered while
    // the rest are written (two cores halve a large job's writing).
    let trace_json = || -> Result<(), WriteError> {
        let label = |k: usize| class_name(r, k);
        let mut chrome = String::new();
        let details: Vec<_> = (0..classes.len()).map(|k| detail.of_class(k, classes.len(), headline)).collect();
        for (k, (sc, tr, _)) in classes.iter().enumerate() {
            let t = super::chrome_trace::render_detail(sc, tr, k as u32, &label(k), details[k]);
            let body = t.trim_end().trim_end_matches("]}").trim_end();
            if k == 0 {
                chrome.push_str(body);
            } else {
                chrome.push_str(",\n");
                chrome.push_str(body.split_once('\n').map_or("", |x| x.1));
            }
        }
        let views: Vec<(&Schedule, &Trace)> = classes.iter().map(|c| (c.0, c.1)).collect();
        chrome.push_str(&super::chrome_trace::flow_events(&views, links, &details));
        chrome.push_str("\n]}\n");
        atomic_write(&dir.join("trace.json"), chrome.as_bytes())
    };
    let memory_png = || -> Result<(), WriteError> {
        let peaks: Vec<u64> = classes.iter().map(|c| c.2.peak.as_ref().map_or(0, |p| p.allocated.bytes)).collect();
        let shown = class_panels(classes.len(), headline, &peaks);
        let mut plot: Option<MemoryPlot> = None;
        let plots: Vec<MemoryPlot> = {
            use rayon::prelude::*;
            shown
                .par_iter()
                .map(|&k| {
                    let (sc, tr, rk) = classes[k];
                    memory_plot(rk, sc, tr, &panel_caption(r, k))
                })
                .collect()
        };
        for p in plots {
            match plot.as_mut() {
                None => plot = Some(p),
                Some(m) => m.panels.extend(p.panels),
            }
        }
        let mut plot = plot.unwrap_or_else(|| memory_plot(r, sched, trace, &headline_ranks(r)));
        plot.note = left_out_note(r, classes.len(), &shown);
        let png = dir.join("memory.png");
        super::png::write_memory_png(&png, plot).map_err(|m| WriteError { path: png.clone(), message: m })
    };
    std::fs::create_dir_all(dir).map_err(|e| WriteError {
        path: dir.to_path_buf(),
        message: format!("cannot create the output folder: {e}"),
    })?;
    let (written, (chrome, png)) = rayon::join(
        || write_files(dir, r, (sched, trace), (classes, headline), (None, false), csv),
        || rayon::join(trace_json, memory_png),
    );
    let written = written?;
    chrome?;
    png?;
    Ok(written)
}

/// A class's panel caption: its name, the layers a pipeline stage holds, and its GPUs, as in
/// "stage 0 (ranks 0): layers 0-1 + embedding; 1 GPU",
/// "stage 3 (ranks 24-31): layers 24-31 + LM head and loss; 8 GPUs, identical programs" or
/// "data-parallel rank 5 (ranks 5): 1 GPU, its own compute draws". "Identical programs"
/// only where several GPUs share the panel.
fn panel_caption(r: &Report, k: usize) -> String {
    let c = r.rank_classes.get(k);
    let count = c.map_or(1, |c| c.count);
    let gpus = if count == 1 { "1 GPU".to_string() } else { format!("{count} GPUs") };
    let programs = match c {
        Some(c) if c.rank.is_some() => ", its own compute draws",
        Some(c) if c.expert_rank.is_some() => ", its experts' own load",
        _ if count > 1 => ", identical programs",
        _ => "",
    };
    let layers = c.and_then(|c| c.stage.as_ref()).map_or(String::new(), |st| {
        let mut held = format!("layers {}", st.layers);
        if st.embedding {
            held.push_str(" + embedding");
        }
        if st.head {
            held.push_str(" + LM head and loss");
        }
        format!("{held}; ")
    });
    format!("{}: {layers}{gpus}{programs}", class_name(r, k))
}

/// `--snapshot`: each rank class's allocator history as a PyTorch memory snapshot
/// ([`super::snapshot`]): `snapshot.pickle` for a job of one class, else
/// `snapshot-<class>.pickle` per class (`snapshot-stage-2.pickle`). A class whose run kept
/// no history (the exact allocator) is an error: the snapshot needs addresses.
pub fn write_snapshots(
    dir: &Path,
    r: &Report,
    classes: &[ClassView],
    scenario: &str,
    alloc_conf: &str,
) -> Result<Vec<PathBuf>, WriteError> {
    let mut out = Vec::new();
    for (name, bytes) in snapshots(r, classes, scenario, alloc_conf) {
        let path = dir.join(name);
        let bytes = bytes.map_err(|message| WriteError { path: path.clone(), message })?;
        atomic_write(&path, &bytes)?;
        out.push(path);
    }
    Ok(out)
}

/// Each rank class's snapshot file name and pickle ([`write_snapshots`] writes them; the
/// Python package hands them over); an error for a class whose run kept no history.
pub fn snapshots(
    r: &Report,
    classes: &[ClassView],
    scenario: &str,
    alloc_conf: &str,
) -> Vec<(String, Result<Vec<u8>, String>)> {
    classes
        .iter()
        .enumerate()
        .map(|(k, (sc, tr, _))| {
            let label = match (classes.len(), r.rank_classes.get(k)) {
                (1, Some(c)) if c.count == 1 => "the GPU (rank 0)".to_string(),
                (1, Some(c)) => format!("every GPU: {} run the same program (ranks {})", c.count, c.ranks),
                _ => class_name(r, k),
            };
            let name = if classes.len() == 1 { "snapshot.pickle".to_string() } else { snapshot_name(&label) };
            let bytes = match tr.history.as_ref() {
                None => Err("no allocator history was recorded (a snapshot needs the caching allocator's addresses: [allocator] kind = \"caching\")".to_string()),
                Some(h) => {
                    let origin = super::snapshot::Origin { scenario, rank_class: &label, alloc_conf };
                    Ok(super::snapshot::render(h, sc, &origin))
                }
            };
            (name, bytes)
        })
        .collect()
}

/// A class's snapshot file name from its label: "stage 1, data-parallel rank 0 (ranks 4-7)"
/// gives `snapshot-stage-1-data-parallel-rank-0.pickle`.
fn snapshot_name(label: &str) -> String {
    let role = label.split(" (ranks").next().unwrap_or(label);
    let mut slug = String::new();
    for c in role.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
    }
    format!("snapshot-{}.pickle", slug.trim_end_matches('-'))
}

/// memory.csv rows of a node's host memory under offload (rank class "host (node of N
/// GPUs)"): each pinned piece and their total against the node's capacity. The pieces are
/// pinned when the engine initialises and held to the end, so each has a row at the start
/// and at the end of the run.
pub fn host_csv(off: &super::OffloadReport, end_ns: u64) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let n = u64::from(off.gpus_per_node);
    let class = format!("host (node of {n} GPUs)");
    for t in [0, end_ns] {
        let t = t as f64 / 1e9;
        for p in &off.host_parts {
            let _ = writeln!(o, "{t:.9},{class},{},{}", p.category, p.bytes_per_gpu.bytes * n);
        }
        let _ = writeln!(o, "{t:.9},{class},allocated,{}", off.host_bytes_per_node.bytes);
        let _ = writeln!(o, "{t:.9},{class},capacity,{}", off.host_capacity.bytes);
    }
    o
}

/// "ranks 0-31": the GPUs of the class the headline is about.
fn headline_ranks(r: &Report) -> String {
    r.rank_classes.get(r.headline_class).map(|c| format!("ranks {}", c.ranks)).unwrap_or_else(|| "rank 0".into())
}

/// Writes report.json, memory.csv (every change unless past [`MEMORY_CSV_ROW_BUDGET`] rows),
/// trace.json (every event unless past [`super::chrome_trace::EVENT_BUDGET`]), memory.png and
/// timeline.png into `dir` (created if missing); `output` asks for every row and event.
pub fn write_all(
    dir: &Path,
    r: &Report,
    sched: &Schedule,
    trace: &Trace,
    output: OutputDetail,
) -> Result<Vec<PathBuf>, WriteError> {
    let plan = OutputPlan::of(r, &[trace], output);
    write_files(dir, r, (sched, trace), (&[], 0), (Some(plan.trace), true), || {
        job_memory_csv_at(r, &[trace], plan.keep.as_deref())
    })
}

/// What a job's output files hold, decided once from the run's size and what was asked for:
/// trace.json's detail, and the memory samples memory.csv keeps (None: every change; else each
/// class's summary samples, as trace.json's counters: every stretch's highest allocated and
/// reserved and its last sample, at [`super::chrome_trace::COUNTER_BUCKETS`] stretches per
/// class).
pub struct OutputPlan {
    pub trace: super::chrome_trace::Detail,
    keep: Option<Vec<Vec<bool>>>,
    /// The full files' sizes, where they are summarised: trace events, memory.csv rows.
    trace_events: usize,
    csv_rows: usize,
    row_budget: usize,
    /// Rank classes the trace holds.
    classes: usize,
}

impl OutputPlan {
    pub fn of(r: &Report, traces: &[&Trace], output: OutputDetail) -> OutputPlan {
        OutputPlan::with_row_budget(r, traces, output, MEMORY_CSV_ROW_BUDGET)
    }

    /// [`OutputPlan::of`] with memory.csv summarised past `rows` rows instead of
    /// [`MEMORY_CSV_ROW_BUDGET`] (tests show a summary on a small job).
    pub fn with_row_budget(r: &Report, traces: &[&Trace], output: OutputDetail, rows: usize) -> OutputPlan {
        use super::chrome_trace::{full_events, Detail};
        use rayon::prelude::*;
        // Each class's count is a pass over its samples: one class per core.
        let trace_events: usize = if output.full_trace { 0 } else { traces.par_iter().map(|t| full_events(t)).sum() };
        let trace = Detail::of(trace_events, output.full_trace);
        let outside = r.allocator.outside.total.bytes;
        let count = |tr: &&Trace| {
            let mut n = 0usize;
            for_each_row(tr, outside, None, |_, _, _| n += 1);
            n
        };
        let csv_rows: usize = if output.full_memory_csv { 0 } else { traces.par_iter().map(count).sum() };
        // Classes past the first 16 (a [jitter] job's ranks) at trace.json's outline points.
        use super::chrome_trace::{outlined_class, COUNTER_BUCKETS, SLICED_COUNTER_BUCKETS};
        let n = traces.len();
        let buckets =
            |k: usize| if outlined_class(k, n, r.headline_class) { SLICED_COUNTER_BUCKETS } else { COUNTER_BUCKETS };
        let keep = (csv_rows > rows)
            .then(|| traces.par_iter().enumerate().map(|(k, t)| t.timeline.summary_samples(buckets(k))).collect());
        OutputPlan { trace, keep, trace_events, csv_rows, row_budget: rows, classes: traces.len() }
    }

    /// What the files leave out, a sentence each, for the run's text: which of trace.json and
    /// memory.csv are summaries, and how to get everything.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.trace == super::chrome_trace::Detail::Summary {
            let classes = if self.classes > super::chrome_trace::DETAILED_CLASSES {
                format!(
                    " in {} of the {} rank classes (the rest as slices only, their memory at {} points)",
                    super::chrome_trace::DETAILED_CLASSES,
                    self.classes,
                    super::chrome_trace::SLICED_COUNTER_BUCKETS
                )
            } else {
                String::new()
            };
            notes.push(format!(
                "trace.json is a summary ({} events in full, past {}): micro-batches 0-{} and the last of each step task by task{classes}, the rest one slice per stream and phase; `stepsim run --trace full` writes every event",
                super::text::sep(self.trace_events as u64),
                super::text::sep(super::chrome_trace::EVENT_BUDGET as u64),
                super::chrome_trace::DETAILED_MICRO_BATCHES - 1
            ));
        }
        if self.keep.is_some() {
            use super::chrome_trace::{COUNTER_BUCKETS, DETAILED_CLASSES, SLICED_COUNTER_BUCKETS};
            let stretches = if self.classes > DETAILED_CLASSES {
                format!(
                    "in each stretch of a rank class ({} per class in {DETAILED_CLASSES} of the {} classes, the headline among them; {} in the rest)",
                    super::text::sep(COUNTER_BUCKETS),
                    self.classes,
                    SLICED_COUNTER_BUCKETS
                )
            } else {
                format!("in each of {} stretches per rank class", super::text::sep(COUNTER_BUCKETS))
            };
            notes.push(format!(
                "memory.csv is a summary ({} rows in full, past {}): {stretches}, the samples of the highest allocated and reserved bytes and the last; `stepsim run --memory-csv full` writes every change",
                super::text::sep(self.csv_rows as u64),
                super::text::sep(self.row_budget as u64),
            ));
        }
        notes
    }
}

/// A job's memory.csv with every change: for one rank class its rows labelled by the
/// headline's ranks, and the node's host rows under offload; for several, every class's rows
/// labelled by the class (`traces` in class order). What the Python package returns; `run`
/// writes [`OutputPlan`]'s (a summary past [`MEMORY_CSV_ROW_BUDGET`] rows).
pub fn job_memory_csv(r: &Report, traces: &[&Trace]) -> String {
    job_memory_csv_at(r, traces, None)
}

/// [`job_memory_csv`] at the samples `keep` marks per class (every change for None).
fn job_memory_csv_at(r: &Report, traces: &[&Trace], keep: Option<&[Vec<bool>]>) -> String {
    let outside = r.allocator.outside.total.bytes;
    let kept = |k: usize| keep.map(|v| v[k].as_slice());
    if traces.len() == 1 {
        let trace = traces[0];
        let mut rows = memory_csv_of(trace, &headline_ranks(r), outside, kept(0));
        if let Some(off) = &r.offload {
            rows.push_str(&host_csv(off, trace.end_time_ns));
        }
        return rows;
    }
    let mut csv = String::new();
    for (k, tr) in traces.iter().enumerate() {
        let label = class_name(r, k);
        let part = memory_csv_of(tr, &label, outside, kept(k));
        csv.push_str(if k == 0 { &part } else { part.split_once('\n').map_or("", |x| x.1) });
    }
    csv
}

/// [`write_all`], with trace.json at `detail` (None: not written here, by a caller that writes
/// every class's).
fn write_files(
    dir: &Path,
    r: &Report,
    (sched, trace): (&Schedule, &Trace),
    (classes, headline): (&[ClassView], usize),
    (detail, memory_png): (Option<super::chrome_trace::Detail>, bool),
    memory_csv_rows: impl FnOnce() -> String + Send,
) -> Result<Vec<PathBuf>, WriteError> {
    std::fs::create_dir_all(dir).map_err(|e| WriteError {
        path: dir.to_path_buf(),
        message: format!("cannot create the output folder: {e}"),
    })?;
    let rank = headline_ranks(r);
    let json = dir.join("report.json");
    let csv = dir.join("memory.csv");
    let chrome = dir.join("trace.json");
    let png = dir.join("memory.png");
    let timeline = dir.join("timeline.png");
    let gpus = r.rank_classes.get(r.headline_class).map_or(1, |c| c.count);
    let text_files = || -> Result<(), WriteError> {
        atomic_write(&json, report_json(r).as_bytes())?;
        atomic_write(&csv, memory_csv_rows().as_bytes())?;
        if let Some(detail) = detail {
            atomic_write(&chrome, super::chrome_trace::render_detail(sched, trace, 0, &rank, detail).as_bytes())?;
        }
        Ok(())
    };
    let memory = || -> Result<(), WriteError> {
        if !memory_png {
            return Ok(());
        }
        let label = if r.throughput.as_ref().is_some_and(|t| t.jitter.is_some()) {
            format!("{rank} ({gpus} GPUs; [jitter]: every data-parallel rank simulated, the headline rank shown)")
        } else if gpus == 1 {
            format!("{rank} (1 GPU)")
        } else {
            format!("{rank} ({gpus} GPUs, identical programs, simulated once)")
        };
        super::png::write_memory_png(&png, memory_plot(r, sched, trace, &label))
            .map_err(|m| WriteError { path: png.clone(), message: m })
    };
    let timeline_png = || -> Result<(), WriteError> {
        let (title, groups) = if classes.len() <= 1 {
            // "rank 0", not "ranks 0", for one GPU.
            let subject = if gpus == 1 { rank.replacen("ranks ", "rank ", 1) } else { rank.clone() };
            let name = format!("{subject} ({} GPU{})", gpus, if gpus == 1 { "" } else { "s" });
            let group = super::timeline_png::Group { name, sched, trace, steps: &r.steps };
            (Some(subject), vec![group])
        } else {
            let groups = classes
                .iter()
                .enumerate()
                .map(|(k, &(sc, tr, rk))| super::timeline_png::Group {
                    name: class_name(r, k),
                    sched: sc,
                    trace: tr,
                    steps: &rk.steps,
                })
                .collect();
            (None, groups)
        };
        let headline = if classes.len() <= 1 { 0 } else { headline };
        super::timeline_png::write(&timeline, &r.scenario, title.as_deref(), &groups, headline, &r.steps)
            .map(|_| ())
            .map_err(|m| WriteError { path: timeline.clone(), message: m })
    };
    // Independent files, rendered on both cores; the first failure in file order is reported.
    let (text, (memory, timeline_result)) = rayon::join(text_files, || rayon::join(memory, timeline_png));
    text?;
    memory?;
    timeline_result?;
    Ok(vec![json, csv, chrome, png, timeline])
}

/// `explain.png`: the memory timeline around `at_s` (the failing or peak instant), so the
/// categories stacked there can be read off; the window covers the last fifth of the run up
/// to that instant.
pub fn explain_png(dir: &Path, r: &Report, sched: &Schedule, trace: &Trace, at_s: f64) -> Result<PathBuf, WriteError> {
    std::fs::create_dir_all(dir).map_err(|e| WriteError {
        path: dir.to_path_buf(),
        message: format!("cannot create the output folder: {e}"),
    })?;
    let rank = headline_ranks(r);
    // An OOM at t = 0 (while loading weights): no simulated time has passed, so there is no
    // "fifth of the run" to show; memory.png draws every allocation in order.
    let subtitle = if at_s < 1e-6 {
        format!("{rank}: every allocation up to t = {} s (no simulated time passes in initialisation)", secs(at_s))
    } else {
        format!("{rank}: the {} s before t = {} s", secs(at_s * 0.2), secs(at_s))
    };
    let mut plot = memory_plot(r, sched, trace, &subtitle);
    plot.title = format!("stepsim explain: {} - what filled the GPU", r.scenario);
    let (t0, t1) = (at_s * 0.8, at_s + (at_s * 0.01).max(1e-6));
    for p in &mut plot.panels {
        p.window_s = Some((t0, t1));
        let keep: Vec<usize> = (0..p.times_s.len()).filter(|&i| p.times_s[i] >= t0 && p.times_s[i] <= t1).collect();
        // Start the window with the value in force at t0.
        let first = p.times_s.iter().rposition(|&t| t < t0);
        let idx: Vec<usize> = first.into_iter().chain(keep).collect();
        p.times_s = idx.iter().map(|&i| p.times_s[i].max(t0)).collect();
        p.bytes = p.bytes.iter().map(|b| idx.iter().map(|&i| b[i]).collect()).collect();
        if let Some(res) = &p.reserved {
            p.reserved = Some(idx.iter().map(|&i| res[i]).collect());
        }
        // The phases are kept whole: the picture shows those in the window, and labels a step
        // that began before it with its start.
    }
    let png = dir.join("explain.png");
    super::png::write_memory_png(&png, plot).map_err(|m| WriteError { path: png.clone(), message: m })?;
    Ok(png)
}

/// Seconds for a sentence: three decimals, or three significant digits below 0.1 s (never
/// "0.000 s" for a time that is not zero).
pub(crate) fn secs(s: f64) -> String {
    if s == 0.0 || !s.is_finite() {
        return "0".to_string();
    }
    let decimals = if s.abs() >= 0.1 { 3 } else { (2 - s.abs().log10().floor() as i32).clamp(3, 12) as usize };
    format!("{s:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_eight_class_panels_spread_over_the_classes() {
        assert_eq!(class_panels(5, 2, &[1, 2, 3, 4, 5]), vec![0, 1, 2, 3, 4]);
        let peaks: Vec<u64> = (0..16).map(|k| 100 - k).collect();
        let v = class_panels(16, 0, &peaks);
        assert_eq!(v.len(), MAX_CLASS_PANELS);
        assert!(v.windows(2).all(|w| w[0] < w[1]) && v[0] == 0 && v[7] == 15, "{v:?}");
        // The headline and the highest peak always have a panel.
        let mut peaks = vec![1u64; 32];
        peaks[11] = 9;
        let v = class_panels(32, 3, &peaks);
        assert_eq!(v.len(), MAX_CLASS_PANELS);
        assert!(v.contains(&3) && v.contains(&11) && v.contains(&0) && v.contains(&31), "{v:?}");
    }

    #[test]
    fn classes_are_named_compactly() {
        let roles = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            name_classes(&roles(&["stage 1", "stage 2", "stage 4", "stage 6", "stage 7", "stage 8"])),
            "stages 1-2, 4, 6-8"
        );
        assert_eq!(
            name_classes(&roles(&["stage 0, expert rank 1", "stage 0, expert rank 2", "stage 1, expert rank 0"])),
            "stage 0, expert ranks 1-2; stage 1, expert rank 0"
        );
        assert_eq!(name_classes(&roles(&["class 3"])), "class 3");
        assert_eq!(name_classes(&roles(&["classes?"])), "classes?");
    }

    #[test]
    fn seconds_never_read_as_zero_when_they_are_not() {
        assert_eq!(secs(0.0), "0");
        assert_eq!(secs(1.4494), "1.449");
        assert_eq!(secs(0.0287), "0.0287");
        assert_eq!(secs(0.00004), "0.0000400");
        assert_ne!(secs(1e-7), "0.000");
    }
}
