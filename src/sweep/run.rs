//! Running a sweep: check every configuration, simulate them on rayon's pool, append rows to
//! `sweep.csv.partial` in configuration order (one flushed write per chunk, so an interrupted
//! sweep keeps every chunk that finished), rename it to `sweep.csv` when the last row is in,
//! then compute the answer, `sweep.json` and `heatmap.png` from that file.
//!
//! Files in the output folder:
//! - `sweep.manifest.json`: which sweep (fingerprint), which shard, how many configurations,
//!   sweep.csv's row count and checksum once it is in place, and `complete` once every output
//!   is (written last: a folder whose manifest is not complete holds no answer to trust);
//! - `sweep.csv.partial`: the rows so far of an unfinished run (`--resume` continues it);
//! - `sweep.csv`: only ever the complete table (renamed into place);
//! - `sweep.json`, `heatmap.png`: the answer (not written for a shard: `sweep merge` does).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::answer::{Aggregator, Answer};
use super::error::SweepError;
use super::output::{format_row, parse_row, row_index};
use super::spec::{Fnv64, SweepSpec};
use super::{heatmap, summary};

pub const CSV: &str = "sweep.csv";
pub const PARTIAL: &str = "sweep.csv.partial";
pub const MANIFEST: &str = "sweep.manifest.json";
pub const JSON: &str = "sweep.json";
pub const HEATMAP: &str = "heatmap.png";

/// Most configurations one run (or shard) takes on: its list of configuration indices is
/// held in memory (8 bytes each).
pub const MAX_CONFIGURATIONS: u64 = 20_000_000;
/// `--jobs` may always ask for this many workers, whatever the machine.
pub const MAX_JOBS_FLOOR: usize = 16;

/// Configurations per thread per chunk: a chunk is simulated in parallel, then appended.
const CHUNK_PER_THREAD: usize = 256;

/// `--shard I/N`: the I-th (1-based) of N deterministic slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("expected I/N with 1 <= I <= N (e.g. 2/8), got `{s}`");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (i, n) = (i.trim().parse::<u64>().map_err(|_| bad())?, n.trim().parse::<u64>().map_err(|_| bad())?);
        if n == 0 || i == 0 || i > n {
            return Err(bad());
        }
        Ok(Shard { index: i, count: n })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Whether configuration `index` belongs to this shard: a splitmix64 hash of the index
    /// picks the shard, so every shard gets a similar mix of cheap and costly configurations.
    pub fn owns(&self, index: u64) -> bool {
        splitmix64(index) % self.count == self.index - 1
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub out: PathBuf,
    /// Worker threads (None: rayon's default, one per core or `RAYON_NUM_THREADS`).
    pub jobs: Option<usize>,
    pub shard: Option<Shard>,
    pub resume: bool,
    /// Draw a progress bar on stderr (the CLI asks for one only when stderr is a terminal).
    pub progress: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Manifest {
    sweep: String,
    fingerprint: String,
    stepsim_version: String,
    /// "I/N" for a shard.
    shard: Option<String>,
    configurations: u64,
    /// sweep.csv's seal, once the complete table is in place: `merge` and `--resume` check
    /// the file against it, so a lost, duplicated or edited row is found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    csv: Option<Seal>,
    /// Every output is in place: sweep.csv, and (not for a shard) sweep.json and heatmap.png.
    complete: bool,
}

/// A finished sweep.csv's rows (the header not counted) and 64-bit FNV-1a checksum.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Seal {
    rows: u64,
    checksum: String,
}

/// Reads `csv` through once: its rows and checksum.
fn seal(csv: &Path) -> Result<Seal, SweepError> {
    let mut f = File::open(csv).map_err(|e| out_err(csv, "cannot open", e))?;
    let mut h = Fnv64::default();
    let mut lines = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(|e| out_err(csv, "cannot read", e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
    }
    Ok(Seal { rows: lines.saturating_sub(1), checksum: h.hex() })
}

/// Why `csv` does not match the seal its manifest recorded, if it does not.
fn check_seal(csv: &Path, want: Option<&Seal>) -> Result<Option<String>, SweepError> {
    let Some(want) = want else {
        return Ok(Some(format!("{MANIFEST} records no row count or checksum for it")));
    };
    let got = seal(csv)?;
    Ok(if got.rows != want.rows {
        Some(format!("it has {} rows where its manifest records {}", got.rows, want.rows))
    } else if got.checksum != want.checksum {
        Some(format!(
            "its checksum is {} where its manifest records {} (the table was damaged or edited)",
            got.checksum, want.checksum
        ))
    } else {
        None
    })
}

/// What a finished run or merge produced.
#[derive(Debug, Clone)]
pub struct Finished {
    /// None for a shard (its slice alone answers nothing: merge the shards).
    pub answer: Option<Answer>,
    pub files: Vec<PathBuf>,
    /// Configurations in the CSV.
    pub rows: u64,
    /// Rows simulated by this call (the rest came from `--resume` or the shards).
    pub simulated: u64,
    pub ooms: u64,
}

fn out_err(path: &Path, what: &str, e: impl std::fmt::Display) -> SweepError {
    SweepError::output(format!("{}: {what}: {e}", path.display()))
}

/// Runs (or resumes) a sweep into `opts.out`.
pub fn run(spec: &SweepSpec, opts: &RunOptions) -> Result<Finished, SweepError> {
    let pool = worker_pool(opts.jobs, "--jobs")?;
    check_size(spec, opts.shard)?;
    let threads = pool.current_num_threads();
    if opts.progress && spec.size > 100_000 {
        eprintln!("checking {} configurations...", spec.size);
    }
    let kept = pool.install(|| configurations(spec, opts.shard))?;
    std::fs::create_dir_all(&opts.out).map_err(|e| out_err(&opts.out, "cannot create the output folder", e))?;
    let manifest = Manifest {
        sweep: spec.name.clone(),
        fingerprint: spec.fingerprint.clone(),
        stepsim_version: env!("CARGO_PKG_VERSION").to_string(),
        shard: opts.shard.map(|s| s.to_string()),
        configurations: kept.len() as u64,
        csv: None,
        complete: false,
    };
    let out = &opts.out;
    let (csv, partial, mpath) = (out.join(CSV), out.join(PARTIAL), out.join(MANIFEST));
    let previous = read_manifest(&mpath).ok();
    let same = |m: &Manifest| m.fingerprint == manifest.fingerprint && m.shard == manifest.shard;

    // Where to start: --resume reuses a complete table of this sweep and continues an
    // unfinished one; otherwise (or with nothing to resume) the run starts over.
    enum Start {
        Reuse,
        Continue(File, usize, u64),
        Fresh,
    }
    let start = if opts.resume {
        match &previous {
            // The table is renamed into place only once complete, and sealed then.
            Some(m) if same(m) && m.csv.is_some() && csv.exists() => {
                if let Some(why) = check_seal(&csv, m.csv.as_ref())? {
                    return Err(SweepError::Input(format!(
                        "--resume: {}: {why}; run without --resume to start over",
                        csv.display()
                    )));
                }
                Start::Reuse
            }
            Some(m) if same(m) && partial.exists() => {
                let (n, o, f) = resume_partial(spec, &partial, &kept)?;
                Start::Continue(f, n, o)
            }
            Some(m) if !same(m) => {
                return Err(SweepError::Input(format!(
                    "--resume: {} holds the results of another sweep or shard ({}{}); run without --resume to start over there, or choose another --out",
                    out.display(),
                    m.sweep,
                    m.shard.as_ref().map(|s| format!(", shard {s}")).unwrap_or_default()
                )))
            }
            _ => {
                eprintln!("note: nothing to resume in {}; starting the sweep from the beginning", out.display());
                Start::Fresh
            }
        }
    } else {
        if partial.exists() {
            eprintln!("note: discarding the unfinished {} (use --resume to continue it)", partial.display());
        }
        Start::Fresh
    };
    let (file, done, mut ooms) = match start {
        Start::Reuse => (None, kept.len(), 0),
        Start::Continue(f, n, o) => (Some(f), n, o),
        Start::Fresh => {
            // Clear what an earlier run left, so nothing stale looks current: first the
            // manifest (not complete), then the files it vouched for.
            write_manifest(&mpath, &manifest)?;
            for f in [CSV, JSON, HEATMAP] {
                let p = out.join(f);
                if p.exists() {
                    std::fs::remove_file(&p).map_err(|e| out_err(&p, "cannot remove the previous result", e))?;
                }
            }
            let mut f = File::create(&partial).map_err(|e| out_err(&partial, "cannot create", e))?;
            f.write_all(spec.csv_header().as_bytes()).map_err(|e| out_err(&partial, "cannot write", e))?;
            (Some(f), 0, 0)
        }
    };
    let mut simulated = 0u64;
    let sealed = if let Some(mut f) = file {
        let progress = Progress::new(opts.progress, kept.len() as u64, done as u64, ooms);
        let chunk = CHUNK_PER_THREAD * threads;
        for ids in kept[done..].chunks(chunk) {
            let rows: Vec<Result<(String, bool), SweepError>> =
                pool.install(|| ids.par_iter().map(|&i| simulate_row(spec, i, &progress)).collect());
            let mut text = String::with_capacity(rows.len() * 160);
            let mut failure = None;
            for r in rows {
                match r {
                    Ok((line, oom)) => {
                        text.push_str(&line);
                        simulated += 1;
                        ooms += u64::from(oom);
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            f.write_all(text.as_bytes()).and_then(|()| f.flush()).map_err(|e| out_err(&partial, "cannot write", e))?;
            if let Some(e) = failure {
                progress.finish();
                return Err(e);
            }
        }
        progress.finish();
        drop(f);
        std::fs::rename(&partial, &csv).map_err(|e| out_err(&csv, "cannot move the finished table into place", e))?;
        Manifest { csv: Some(seal(&csv)?), ..manifest.clone() }
    } else {
        previous.unwrap_or(manifest.clone())
    };
    if opts.shard.is_some() {
        write_manifest(&mpath, &Manifest { complete: true, ..sealed })?;
        let ooms = if simulated == 0 { count_ooms(spec, &csv)? } else { ooms };
        return Ok(Finished { answer: None, files: vec![csv, mpath], rows: kept.len() as u64, simulated, ooms });
    }
    write_manifest(&mpath, &Manifest { complete: false, ..sealed.clone() })?;
    let mut fin = finalize(spec, out)?;
    write_manifest(&mpath, &Manifest { complete: true, ..sealed })?;
    fin.simulated = simulated;
    Ok(fin)
}

/// The thread pool of `jobs` workers (None: one per core), `flag` naming the option in
/// errors. More workers than a few per core only adds threads (and their stacks) to wait.
pub fn worker_pool(jobs: Option<usize>, flag: &str) -> Result<rayon::ThreadPool, SweepError> {
    if jobs == Some(0) {
        return Err(SweepError::Input(format!("{flag}: must be at least 1")));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max_jobs = (4 * cores).max(MAX_JOBS_FLOOR);
    if let Some(j) = jobs.filter(|&j| j > max_jobs) {
        return Err(SweepError::Input(format!(
            "{flag}: at most {max_jobs} on this machine ({cores} cores x 4), got {j}"
        )));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.unwrap_or(0))
        .build()
        .map_err(|e| SweepError::Internal(format!("cannot start the worker threads: {e}")))
}

/// The product of the axes bounds what the filter keeps: refuse before enumerating it.
pub fn check_size(spec: &SweepSpec, shard: Option<Shard>) -> Result<(), SweepError> {
    let share = spec.size.div_ceil(shard.map_or(1, |s| s.count));
    if share > MAX_CONFIGURATIONS {
        let shards = spec.size.div_ceil(MAX_CONFIGURATIONS);
        return Err(SweepError::Input(format!(
            "{}: the axes make {} configurations ({share} for this run), over the {MAX_CONFIGURATIONS} one run enumerates; split the sweep with --shard I/N (N >= {shards}) or narrow the axes",
            spec.source.display(),
            spec.size
        )));
    }
    Ok(())
}

/// The configuration indices this run simulates, in order: every index of the product (of
/// the shard) that validates and passes the filter. The first invalid configuration, in
/// index order, is the error. Runs on the current rayon pool; call [`check_size`] first.
pub fn configurations(spec: &SweepSpec, shard: Option<Shard>) -> Result<Vec<u64>, SweepError> {
    const BLOCK: u64 = 1024;
    let blocks = spec.size.div_ceil(BLOCK);
    let per: Vec<Result<Vec<u64>, SweepError>> = (0..blocks)
        .into_par_iter()
        .map(|b| {
            let mut v = Vec::new();
            for i in b * BLOCK..((b + 1) * BLOCK).min(spec.size) {
                if shard.is_some_and(|s| !s.owns(i)) {
                    continue;
                }
                if spec.point(i)?.is_some() {
                    v.push(i);
                }
            }
            Ok(v)
        })
        .collect();
    let mut kept = Vec::new();
    for r in per {
        kept.extend(r?);
        if kept.len() as u64 > MAX_CONFIGURATIONS {
            return Err(SweepError::Input(format!(
                "{}: more than {MAX_CONFIGURATIONS} configurations to run; split the sweep with --shard I/N",
                spec.source.display()
            )));
        }
    }
    // A shard the filter leaves empty still writes its (empty) table, so that `merge` can
    // complete; the sweep as a whole must keep something.
    if kept.is_empty() && shard.is_none() {
        return Err(no_configuration(spec));
    }
    Ok(kept)
}

fn no_configuration(spec: &SweepSpec) -> SweepError {
    SweepError::Input(format!("{}: field `filter`: no configuration passes the filter", spec.source.display()))
}

fn simulate_row(spec: &SweepSpec, index: u64, progress: &Progress) -> Result<(String, bool), SweepError> {
    let (line, oom) = row(spec, index)?;
    progress.tick(oom);
    Ok((line, oom))
}

/// Configuration `index`'s sweep.csv line, and whether it ran out of memory.
pub fn row(spec: &SweepSpec, index: u64) -> Result<(String, bool), SweepError> {
    let s = spec
        .point(index)?
        .ok_or_else(|| SweepError::Internal(format!("configuration {index} passed the filter once and not again")))?;
    let o = summary::simulate(&s).map_err(|e| {
        SweepError::Internal(format!(
            "{}: configuration {index} ({}): {e}",
            spec.source.display(),
            spec.describe(index)
        ))
    })?;
    o.check().map_err(|e| {
        SweepError::Internal(format!(
            "{}: configuration {index} ({}): the row breaks its own invariant ({e}); please report this with the sweep",
            spec.source.display(),
            spec.describe(index)
        ))
    })?;
    let oom = o.oom.is_some();
    Ok((format_row(spec, index, &o), oom))
}

/// Checks an unfinished table, cuts a torn last line, and opens it for appending. Returns
/// the rows already there, the OOMs among them, and the file.
fn resume_partial(spec: &SweepSpec, partial: &Path, kept: &[u64]) -> Result<(usize, u64, File), SweepError> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(partial)
        .map_err(|e| out_err(partial, "cannot open to resume", e))?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(|e| out_err(partial, "cannot read to resume", e))?;
    let header = spec.csv_header();
    let corrupt = |why: String| {
        SweepError::Input(format!(
            "--resume: {}: {why}; delete it or run without --resume to start over",
            partial.display()
        ))
    };
    if !text.starts_with(&header) {
        return Err(corrupt("its header is not this sweep's".into()));
    }
    let mut good = header.len();
    let mut n = 0usize;
    let mut ooms = 0u64;
    for line in text[header.len()..].split_inclusive('\n') {
        if !line.ends_with('\n') {
            break; // torn by the interruption: simulated again
        }
        let body = &line[..line.len() - 1];
        let row = parse_row(body, spec.axes.len()).map_err(|e| corrupt(format!("row {}: {e}", n + 1)))?;
        if kept.get(n) != Some(&row.index) {
            return Err(corrupt(format!("row {} is configuration {}, expected {:?}", n + 1, row.index, kept.get(n))));
        }
        ooms += u64::from(!row.fits);
        n += 1;
        good += line.len();
    }
    f.set_len(good as u64).map_err(|e| out_err(partial, "cannot cut the torn last row", e))?;
    f.seek(SeekFrom::End(0)).map_err(|e| out_err(partial, "cannot seek", e))?;
    Ok((n, ooms, f))
}

fn read_manifest(path: &Path) -> Result<Manifest, SweepError> {
    let text = std::fs::read_to_string(path).map_err(|e| out_err(path, "cannot read", e))?;
    serde_json::from_str(&text).map_err(|e| out_err(path, "not a sweep manifest", e))
}

fn write_manifest(path: &Path, m: &Manifest) -> Result<(), SweepError> {
    let text = serde_json::to_string_pretty(m).map_err(|e| SweepError::Internal(e.to_string()))? + "\n";
    write_atomic(path, text.as_bytes())
}

/// Writes to `<path>.tmp` and renames, so a file that exists is complete.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SweepError> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|e| out_err(&tmp, "cannot write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| out_err(path, "cannot move into place", e))
}

fn count_ooms(spec: &SweepSpec, csv: &Path) -> Result<u64, SweepError> {
    let mut n = 0;
    for_each_row(spec, csv, |r| n += u64::from(!r.fits))?;
    Ok(n)
}

/// Streams the rows of a complete table.
fn for_each_row(spec: &SweepSpec, csv: &Path, mut f: impl FnMut(&super::output::Row)) -> Result<u64, SweepError> {
    let file = File::open(csv).map_err(|e| out_err(csv, "cannot open", e))?;
    let mut lines = BufReader::new(file).lines();
    let header = spec.csv_header();
    match lines.next() {
        Some(Ok(h)) if h == header.trim_end() => {}
        _ => return Err(SweepError::Input(format!("{}: its header is not this sweep's", csv.display()))),
    }
    let mut n = 0;
    for (i, line) in lines.enumerate() {
        let line = line.map_err(|e| out_err(csv, "cannot read", e))?;
        let row = parse_row(&line, spec.axes.len())
            .map_err(|e| SweepError::Input(format!("{}: line {}: {e}", csv.display(), i + 2)))?;
        f(&row);
        n += 1;
    }
    Ok(n)
}

/// Computes the answer from `out/sweep.csv` and writes `sweep.json` and `heatmap.png`; on
/// failure neither is left behind (nor an earlier run's, which would not be this table's).
pub fn finalize(spec: &SweepSpec, out: &Path) -> Result<Finished, SweepError> {
    let answer = answer_files(spec, out);
    if answer.is_err() {
        for f in [JSON, HEATMAP] {
            let _ = std::fs::remove_file(out.join(f));
        }
    }
    answer
}

fn answer_files(spec: &SweepSpec, out: &Path) -> Result<Finished, SweepError> {
    let csv = out.join(CSV);
    let mut agg = Aggregator::new(spec);
    let rows = for_each_row(spec, &csv, |r| agg.add(r))?;
    let answer = agg.finish();
    let json = out.join(JSON);
    let text = serde_json::to_string_pretty(&answer).map_err(|e| SweepError::Internal(e.to_string()))? + "\n";
    write_atomic(&json, text.as_bytes())?;
    let png = out.join(HEATMAP);
    heatmap::write(&png, &answer).map_err(|e| out_err(&png, "cannot draw the heatmap", e))?;
    let ooms = answer.oom;
    Ok(Finished { answer: Some(answer), files: vec![csv, json, png], rows, simulated: 0, ooms })
}

/// Joins the complete outputs of all N shards of a sweep into `out`, in configuration
/// order (a streaming merge), and computes the answer: the same files an unsharded run
/// writes.
pub fn merge(spec: &SweepSpec, dirs: &[PathBuf], out: &Path) -> Result<Finished, SweepError> {
    if dirs.is_empty() {
        return Err(SweepError::Input("sweep merge: name the shards' output folders".into()));
    }
    let mut count = None;
    let mut total = 0u64;
    let mut seen: Vec<Option<PathBuf>> = Vec::new();
    for d in dirs {
        let m = read_manifest(&d.join(MANIFEST)).map_err(|_| {
            SweepError::Input(format!("{}: not a sweep shard's output folder (no readable {MANIFEST})", d.display()))
        })?;
        if m.fingerprint != spec.fingerprint {
            return Err(SweepError::Input(format!(
                "{}: holds sweep `{}` with other axes, filter, base or stepsim version than {}",
                d.display(),
                m.sweep,
                spec.source.display()
            )));
        }
        let shard: Shard = m
            .shard
            .as_deref()
            .ok_or_else(|| SweepError::Input(format!("{}: is an unsharded sweep, not a shard", d.display())))?
            .parse()
            .map_err(|e| SweepError::Input(format!("{}: {e}", d.display())))?;
        if !m.complete || !d.join(CSV).exists() {
            return Err(SweepError::Input(format!(
                "{}: shard {shard} is unfinished; run it again with --resume",
                d.display()
            )));
        }
        let damaged = match check_seal(&d.join(CSV), m.csv.as_ref())? {
            Some(why) => Some(why),
            None if m.csv.as_ref().is_some_and(|s| s.rows != m.configurations) => Some(format!(
                "it has {} rows where the shard ran {} configurations",
                m.csv.as_ref().map_or(0, |s| s.rows),
                m.configurations
            )),
            None => None,
        };
        if let Some(why) = damaged {
            return Err(SweepError::Input(format!(
                "{}: shard {shard}'s {CSV}: {why}; run the shard again (without --resume)",
                d.display()
            )));
        }
        total += m.configurations;
        if *count.get_or_insert(shard.count) != shard.count {
            return Err(SweepError::Input(format!(
                "{}: shard {shard} is of a split into {} shards; the others are of {}",
                d.display(),
                shard.count,
                count.unwrap_or(0)
            )));
        }
        seen.resize(shard.count as usize, None);
        if let Some(prev) = &seen[shard.index as usize - 1] {
            return Err(SweepError::Input(format!(
                "shard {shard} is given twice: {} and {}",
                prev.display(),
                d.display()
            )));
        }
        if d.canonicalize().ok() == out.canonicalize().ok() {
            return Err(SweepError::Input(format!(
                "--out {} is one of the shards; merge into another folder",
                out.display()
            )));
        }
        seen[shard.index as usize - 1] = Some(d.clone());
    }
    let missing: Vec<String> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| format!("{}/{}", i + 1, seen.len()))
        .collect();
    if !missing.is_empty() {
        return Err(SweepError::Input(format!("sweep merge: missing shard(s) {}", missing.join(", "))));
    }
    if total == 0 {
        return Err(no_configuration(spec));
    }
    std::fs::create_dir_all(out).map_err(|e| out_err(out, "cannot create the output folder", e))?;
    let partial = out.join(PARTIAL);
    let merged = merge_rows(spec, &seen, &partial);
    if merged.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    let rows = merged?;
    if rows != total {
        let _ = std::fs::remove_file(&partial);
        return Err(SweepError::Internal(format!("merged {rows} rows where the shards hold {total}")));
    }
    // From here `out` holds no answer until the manifest says complete.
    let manifest = Manifest {
        sweep: spec.name.clone(),
        fingerprint: spec.fingerprint.clone(),
        stepsim_version: env!("CARGO_PKG_VERSION").to_string(),
        shard: None,
        configurations: total,
        csv: None,
        complete: false,
    };
    let mpath = out.join(MANIFEST);
    write_manifest(&mpath, &manifest)?;
    let csv = out.join(CSV);
    std::fs::rename(&partial, &csv).map_err(|e| out_err(&csv, "cannot move the merged table into place", e))?;
    let sealed = Manifest { csv: Some(seal(&csv)?), ..manifest };
    write_manifest(&mpath, &sealed)?;
    let fin = finalize(spec, out)?;
    write_manifest(&mpath, &Manifest { complete: true, ..sealed })?;
    Ok(fin)
}

/// Streams the shards' rows, in configuration order, into `partial`; returns the rows
/// written. Each row must belong to the shard it came from and come after the one before.
fn merge_rows(spec: &SweepSpec, shards: &[Option<PathBuf>], partial: &Path) -> Result<u64, SweepError> {
    let header = spec.csv_header();
    let mut readers = Vec::new();
    for d in shards.iter().flatten() {
        let p = d.join(CSV);
        let f = File::open(&p).map_err(|e| out_err(&p, "cannot open", e))?;
        let mut lines = BufReader::new(f).lines();
        match lines.next() {
            Some(Ok(h)) if h == header.trim_end() => {}
            _ => return Err(SweepError::Input(format!("{}: its header is not this sweep's", p.display()))),
        }
        readers.push((p, lines));
    }
    let mut w = std::io::BufWriter::new(File::create(partial).map_err(|e| out_err(partial, "cannot create", e))?);
    w.write_all(header.as_bytes()).map_err(|e| out_err(partial, "cannot write", e))?;
    let mut heads: Vec<Option<(u64, String)>> = Vec::new();
    let next = |r: &mut (PathBuf, std::io::Lines<BufReader<File>>)| -> Result<Option<(u64, String)>, SweepError> {
        match r.1.next() {
            None => Ok(None),
            Some(Err(e)) => Err(out_err(&r.0, "cannot read", e)),
            Some(Ok(l)) => {
                let i = row_index(&l)
                    .ok_or_else(|| SweepError::Input(format!("{}: a row without an index", r.0.display())))?;
                Ok(Some((i, l)))
            }
        }
    };
    for r in readers.iter_mut() {
        heads.push(next(r)?);
    }
    let mut rows = 0u64;
    let mut last: Option<u64> = None;
    while let Some(k) = (0..heads.len()).filter(|&k| heads[k].is_some()).min_by_key(|&k| heads[k].as_ref().map(|h| h.0))
    {
        let (i, line) = heads[k].take().unwrap_or_default();
        let shard = Shard { index: k as u64 + 1, count: readers.len() as u64 };
        if !shard.owns(i) {
            return Err(SweepError::Input(format!(
                "{}: configuration {i} belongs to another shard than {shard}",
                readers[k].0.display()
            )));
        }
        if last.is_some_and(|l| l >= i) {
            return Err(SweepError::Input(format!(
                "{}: configuration {i} is out of order or given twice",
                readers[k].0.display()
            )));
        }
        last = Some(i);
        w.write_all(line.as_bytes())
            .and_then(|()| w.write_all(b"\n"))
            .map_err(|e| out_err(partial, "cannot write", e))?;
        rows += 1;
        heads[k] = next(&mut readers[k])?;
    }
    w.flush().map_err(|e| out_err(partial, "cannot write", e))?;
    Ok(rows)
}

/// The progress bar (done/total, OOMs so far, time left) on stderr, or nothing.
struct Progress {
    bar: Option<ProgressBar>,
    ooms: AtomicU64,
}

impl Progress {
    fn new(show: bool, total: u64, done: u64, ooms: u64) -> Progress {
        let bar = show.then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{bar:40.cyan/blue} {pos}/{len} configurations, {msg}, {rate}, {eta} left",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", s.per_sec());
            });
            b.set_style(style);
            b.set_position(done);
            b.set_message(format!("{ooms} OOM"));
            b.reset_eta();
            b
        });
        Progress { bar, ooms: AtomicU64::new(ooms) }
    }

    fn tick(&self, oom: bool) {
        if let Some(b) = &self.bar {
            b.inc(1);
            if oom {
                let n = self.ooms.fetch_add(1, Ordering::Relaxed) + 1;
                b.set_message(format!("{n} OOM"));
            }
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
