//! `stepsim._stepsim`: the Rust side of the `stepsim` Python package (the public API and
//! its documentation are in `python/stepsim/__init__.py`).
//!
//! Every call runs with the interpreter detached (`Python::detach`, formerly
//! `allow_threads`) and inside `catch_unwind`: a scenario or sweep error becomes
//! `stepsim.ScenarioError` / `stepsim.SweepError`, a simulator bug (a deadlock, a panic)
//! `stepsim.SimulationError`; no panic crosses into Python.
//!
//! What the CLI writes and refuses comes from the library functions the CLI calls
//! (`report::write::report_json` and `job_memory_csv`, `scenario::limits::full_report_fits`,
//! `explain::accepts`, `sweep::run`'s `worker_pool`, `check_size`, `configurations` and
//! `row`), so the package and the CLI cannot drift apart.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use rayon::prelude::*;

use stepsim::scenario::{Scenario, ScenarioError};
use stepsim::sweep::{SweepError, SweepSpec};

/// How scenarios and sweeps given as text (not a file) are named in errors.
const INLINE: &str = "<inline>";

// ---------------------------------------------------------------- errors

/// Why a call failed: carried out of the detached section, raised once attached again.
enum Failure {
    Scenario(ScenarioError),
    /// A sweep error, with the sweep's own file (or `<inline>`) to split its message.
    Sweep(SweepError, String),
    /// A bad argument: `ValueError`.
    Value(String),
    /// A simulator bug (a schedule that cannot run, a panic): `stepsim.SimulationError`.
    Internal(String),
}

impl Failure {
    fn into_pyerr(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Scenario(e) => raise(
                py,
                "ScenarioError",
                (e.to_string(), e.file.display().to_string(), e.field.clone(), e.message.clone()),
            ),
            Failure::Sweep(SweepError::Internal(m), _) => raise(py, "SimulationError", (m,)),
            Failure::Sweep(e, source) => {
                let kind = match e {
                    SweepError::Output(_) => "output",
                    _ => "input",
                };
                let text = e.to_string();
                let (file, field, message) = split_error(&text, &source);
                raise(py, "SweepError", (text.clone(), kind, file, field, message))
            }
            Failure::Value(m) => PyValueError::new_err(m),
            Failure::Internal(m) => raise(py, "SimulationError", (m,)),
        }
    }
}

/// An instance of one of `stepsim._errors`' exception classes, as a `PyErr`.
fn raise<'py, A>(py: Python<'py>, class: &str, args: A) -> PyErr
where
    A: pyo3::call::PyCallArgs<'py>,
{
    let made = py.import("stepsim._errors").and_then(|m| m.getattr(class)).and_then(|c| c.call1(args));
    match made {
        Ok(obj) => PyErr::from_value(obj),
        Err(e) => e,
    }
}

/// A sweep error's text, `<file>: field `<field>`: <message>` (or without the field), split
/// into its parts; `source` is the sweep's own file. Best effort: an error of the base
/// scenario names the base's file; an error of no file (`jobs`) keeps its text whole.
fn split_error(text: &str, source: &str) -> (String, String, String) {
    let (file, rest) = match text.strip_prefix(source).and_then(|r| r.strip_prefix(": ")) {
        Some(rest) => (source, rest),
        None => match text.find(": field `") {
            Some(k) => (&text[..k], &text[k + 2..]),
            None => ("", text),
        },
    };
    let field = rest.find("field `").and_then(|k| rest[k + 7..].split('`').next()).unwrap_or("");
    let lead = format!("field `{field}`: ");
    let message = rest.strip_prefix(&lead).unwrap_or(rest);
    (file.to_string(), field.to_string(), message.to_string())
}

/// Runs `f`, turning a panic into an internal failure.
fn guarded<T>(f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Failure::Internal(format!("internal error (a panic in the simulator): {what}")))
    })
}

// ---------------------------------------------------------------- scenarios

/// The name errors give: the file, or `<inline>`.
fn source_name(kind: &str, payload: &str) -> String {
    if kind == "path" {
        payload.to_string()
    } else {
        INLINE.to_string()
    }
}

/// Reads and validates a scenario given as a file (`path`), TOML text (`toml`) or a JSON
/// document of the scenario's tables (`json`, from a Python dict).
fn load_scenario(kind: &str, payload: &str) -> Result<Scenario, Failure> {
    let inline = Path::new(INLINE);
    match kind {
        "path" => Scenario::load(Path::new(payload)).map_err(Failure::Scenario),
        "toml" => Scenario::from_toml(inline, payload).map_err(Failure::Scenario),
        "json" => {
            let bad = |field: String, m: String| Failure::Scenario(ScenarioError::new(inline, field, m));
            let v: serde_json::Value =
                serde_json::from_str(payload).map_err(|e| bad(String::new(), format!("not a JSON document: {e}")))?;
            let t = json_to_toml(&v, "").map_err(|(f, m)| bad(f, m))?;
            if !t.is_table() {
                return Err(bad(
                    String::new(),
                    format!("a scenario is a table of sections ([model], [hardware], ...), got a {}", t.type_str()),
                ));
            }
            Scenario::from_value(inline, t).map_err(Failure::Scenario)
        }
        other => Err(Failure::Value(format!("unknown scenario source `{other}`"))),
    }
}

/// A JSON value as the TOML value a scenario file would hold; the error names the dotted
/// field.
fn json_to_toml(v: &serde_json::Value, at: &str) -> Result<toml::Value, (String, String)> {
    use serde_json::Value as J;
    Ok(match v {
        J::Null => {
            return Err((at.to_string(), "None has no TOML form: leave the field out to get its default".into()))
        }
        J::Bool(b) => toml::Value::Boolean(*b),
        J::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => toml::Value::Integer(i),
            (None, _) if n.is_u64() => {
                return Err((at.to_string(), format!("{n} is out of range: TOML integers are 64-bit signed")))
            }
            (None, Some(f)) => toml::Value::Float(f),
            (None, None) => return Err((at.to_string(), format!("{n} is not a number TOML can hold"))),
        },
        J::String(s) => toml::Value::String(s.clone()),
        J::Array(a) => toml::Value::Array(
            a.iter().enumerate().map(|(i, x)| json_to_toml(x, &format!("{at}[{i}]"))).collect::<Result<_, _>>()?,
        ),
        J::Object(m) => {
            let mut t = toml::Table::new();
            for (k, x) in m {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                t.insert(k.clone(), json_to_toml(x, &path)?);
            }
            toml::Value::Table(t)
        }
    })
}

// ---------------------------------------------------------------- simulate, explain

/// One finished simulation: its report.json text and what memory.csv is made from.
#[pyclass(module = "stepsim._stepsim", frozen)]
struct Simulation {
    sim: stepsim::Simulation,
    json: String,
    /// The scenario's name and `PYTORCH_CUDA_ALLOC_CONF`, for snapshots.
    scenario: String,
    alloc_conf: String,
}

impl Simulation {
    fn new(sim: stepsim::Simulation) -> Simulation {
        let json = stepsim::report::write::report_json(&sim.report);
        Simulation { sim, json, scenario: String::new(), alloc_conf: String::new() }
    }
}

/// `memory.csv` as `stepsim run` writes it.
fn memory_csv_text(sim: &stepsim::Simulation) -> String {
    let traces: Vec<&stepsim::engine::Trace> = sim.run.traces.iter().collect();
    stepsim::report::write::job_memory_csv(&sim.report, &traces)
}

/// memory.csv's rows as columns: time (s), rank class, category, bytes (a rank class that
/// holds a comma is quoted).
#[allow(clippy::type_complexity)]
fn memory_columns(text: &str) -> Result<(Vec<f64>, Vec<String>, Vec<usize>, Vec<usize>, Vec<u64>), String> {
    let (mut time, mut classes, mut cats) = (Vec::new(), Vec::<String>::new(), Vec::<String>::new());
    let (mut class_of, mut cat_of, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate().skip(1) {
        let bad = || format!("memory.csv line {}: `{line}` is not time,rank_class,category,bytes", n + 1);
        let fields = stepsim::sweep::output::split_csv(line).map_err(|_| bad())?;
        let [t, class, c, b] = fields.as_slice() else { return Err(bad()) };
        time.push(t.parse::<f64>().map_err(|_| bad())?);
        bytes.push(b.parse::<u64>().map_err(|_| bad())?);
        // Few distinct classes and categories: index them, so each Python string is made once.
        class_of.push(index_of(&mut classes, class));
        cat_of.push(index_of(&mut cats, c));
    }
    let mut names = classes;
    let first_cat = names.len();
    names.extend(cats);
    let cat_of = cat_of.into_iter().map(|i| i + first_cat).collect();
    Ok((time, names, class_of, cat_of, bytes))
}

fn index_of(names: &mut Vec<String>, s: &str) -> usize {
    match names.iter().rposition(|x| x == s) {
        Some(i) => i,
        None => {
            names.push(s.to_string());
            names.len() - 1
        }
    }
}

#[pymethods]
impl Simulation {
    /// report.json's text, exactly as `stepsim run` writes it.
    fn report_json(&self) -> &str {
        &self.json
    }

    /// memory.csv's text, exactly as `stepsim run` writes it.
    fn memory_csv(&self, py: Python<'_>) -> String {
        py.detach(|| memory_csv_text(&self.sim))
    }

    /// Each rank class's PyTorch memory snapshot, as `stepsim run --snapshot` writes them:
    /// (file name, pickle bytes) in class order; empty unless simulated with `snapshot`.
    fn snapshots<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Bound<'py, pyo3::types::PyBytes>)>> {
        let sim = &self.sim;
        if sim.run.traces.iter().all(|t| t.history.is_none()) {
            return Ok(Vec::new());
        }
        let files = py.detach(|| {
            let views: Vec<_> = (0..sim.job.classes.len())
                .map(|k| (&sim.job.classes[k].schedule, &sim.run.traces[k], &sim.class_reports[k]))
                .collect();
            stepsim::report::write::snapshots(&sim.report, &views, &self.scenario, &self.alloc_conf)
        });
        files
            .into_iter()
            .map(|(name, bytes)| match bytes {
                Ok(b) => Ok((name, pyo3::types::PyBytes::new(py, &b))),
                Err(m) => Err(Failure::Internal(m).into_pyerr(py)),
            })
            .collect()
    }

    /// memory.csv's columns: (time_s, rank_class, category, bytes) as lists.
    fn memory_columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let cols = py.detach(|| memory_columns(&memory_csv_text(&self.sim)));
        let (time, names, class_of, cat_of, bytes) = cols.map_err(|m| Failure::Internal(m).into_pyerr(py))?;
        let names: Vec<Bound<'py, PyString>> = names.iter().map(|s| PyString::new(py, s)).collect();
        let strings = |ix: &[usize]| PyList::new(py, ix.iter().map(|&i| names[i].clone()));
        PyTuple::new(py, [PyList::new(py, time)?, strings(&class_of)?, strings(&cat_of)?, PyList::new(py, bytes)?])
    }
}

/// Simulates a scenario as `stepsim run` does (same checks, same report); with `snapshot`,
/// as `stepsim run --snapshot` (each class's allocator history kept for
/// [`Simulation::snapshots`]).
#[pyfunction]
#[pyo3(signature = (kind, payload, snapshot=false))]
fn simulate(py: Python<'_>, kind: String, payload: String, snapshot: bool) -> PyResult<Simulation> {
    py.detach(move || {
        guarded(|| {
            let s = load_scenario(&kind, &payload)?;
            let path = source_name(&kind, &payload);
            stepsim::scenario::limits::full_report_fits(Path::new(&path), &s).map_err(Failure::Scenario)?;
            if snapshot && s.allocator.kind == stepsim::memory::AllocatorKind::Exact {
                return Err(Failure::Scenario(ScenarioError::new(
                    Path::new(&path),
                    "allocator.kind",
                    "a snapshot holds the caching allocator's segments and addresses; the exact model (\"exact\") has none: use \"caching\" (the default) or leave snapshot off",
                )));
            }
            let sim = stepsim::simulate_with(&s, stepsim::SimOptions { history: snapshot, ..Default::default() })
                .map_err(|e| Failure::Internal(e.to_string()))?;
            sim.check_invariants().map_err(Failure::Internal)?;
            let mut out = Simulation::new(sim);
            out.scenario = s.name.clone();
            out.alloc_conf = s.allocator.alloc_conf();
            Ok(out)
        })
    })
    .map_err(|f| f.into_pyerr(py))
}

/// Explains a scenario as `stepsim explain` does: (the simulation, whose report carries the
/// explanation, the explanation as JSON, its text).
#[pyfunction]
fn explain(py: Python<'_>, kind: String, payload: String, margin: f64) -> PyResult<(Simulation, String, String)> {
    py.detach(move || {
        guarded(|| {
            if !(0.0..1.0).contains(&margin) {
                return Err(Failure::Value(format!("margin: must be a fraction in [0, 1), got {margin}")));
            }
            let s = load_scenario(&kind, &payload)?;
            let path = source_name(&kind, &payload);
            stepsim::explain::accepts(Path::new(&path), &s).map_err(Failure::Scenario)?;
            let mut sim = stepsim::simulate(&s).map_err(|e| Failure::Internal(e.to_string()))?;
            let e = stepsim::explain::explain(&s, &sim, margin);
            sim.report.explanation = serde_json::to_value(&e).ok();
            sim.check_invariants().map_err(Failure::Internal)?;
            let json = serde_json::to_string(&e).map_err(|e| Failure::Internal(e.to_string()))?;
            let text = stepsim::explain::render(&e, &s);
            Ok((Simulation::new(sim), json, text))
        })
    })
    .map_err(|f| f.into_pyerr(py))
}

// ---------------------------------------------------------------- sweeps

/// A row's position in the run, and its index and CSV line (or why it failed).
type RowMsg = (usize, Result<(u64, String), Failure>);

/// The rows of a running sweep: an iterator fed by a background thread.
#[pyclass(module = "stepsim._stepsim", frozen)]
struct SweepRows {
    spec: Arc<SweepSpec>,
    /// sweep.csv's header, column by column.
    #[pyo3(get)]
    columns: Vec<String>,
    /// Configurations the sweep simulates (those that pass its filter).
    #[pyo3(get)]
    total: usize,
    state: Mutex<RowsState>,
    cancel: Arc<AtomicBool>,
}

struct RowsState {
    rx: Option<Receiver<RowMsg>>,
    ordered: bool,
    /// Ordered: the position to yield next, and rows that arrived early.
    next: usize,
    pending: BTreeMap<usize, (u64, String)>,
    yielded: usize,
    finished: bool,
}

impl Drop for SweepRows {
    fn drop(&mut self) {
        // Abandoned: the workers stop at their next configuration.
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// One configuration's sweep.csv line, as `stepsim sweep` writes it.
fn simulate_row(spec: &SweepSpec, index: u64) -> Result<(u64, String), SweepError> {
    let (line, _) = stepsim::sweep::run::row(spec, index)?;
    Ok((index, line))
}

/// Starts a sweep: checks the spec and enumerates its configurations (errors are raised
/// here), then simulates them on a rayon pool of `jobs` threads in the background.
#[pyfunction]
#[pyo3(signature = (kind, payload, jobs=None, ordered=false))]
fn sweep(py: Python<'_>, kind: String, payload: String, jobs: Option<usize>, ordered: bool) -> PyResult<SweepRows> {
    let source = source_name(&kind, &payload);
    let src = source.clone();
    py.detach(move || {
        guarded(|| {
            let fail = |e: SweepError| Failure::Sweep(e, src.clone());
            let spec = match kind.as_str() {
                "path" => SweepSpec::load(Path::new(&payload)),
                "toml" => SweepSpec::from_toml(Path::new(INLINE), &payload),
                other => return Err(Failure::Value(format!("unknown sweep source `{other}`"))),
            }
            .map_err(fail)?;
            let pool = stepsim::sweep::run::worker_pool(jobs, "jobs").map_err(fail)?;
            stepsim::sweep::run::check_size(&spec, None).map_err(fail)?;
            let kept = pool.install(|| stepsim::sweep::run::configurations(&spec, None)).map_err(fail)?;
            let header = spec.csv_header();
            let columns = stepsim::sweep::output::split_csv(header.trim_end())
                .map_err(|e| Failure::Internal(format!("sweep.csv header: {e}")))?;
            let spec = Arc::new(spec);
            let cancel = Arc::new(AtomicBool::new(false));
            let (tx, rx) = mpsc::channel::<RowMsg>();
            let total = kept.len();
            let (spec2, cancel2, src2) = (spec.clone(), cancel.clone(), src.clone());
            std::thread::Builder::new()
                .name("stepsim-sweep".into())
                .spawn(move || {
                    pool.install(|| {
                        let _ = kept.par_iter().enumerate().try_for_each_with(tx, |tx, (pos, &i)| {
                            if cancel2.load(Ordering::Relaxed) {
                                return Err(());
                            }
                            let row = guarded(|| simulate_row(&spec2, i).map_err(|e| Failure::Sweep(e, src2.clone())));
                            tx.send((pos, row)).map_err(|_| ())
                        });
                    });
                })
                .map_err(|e| Failure::Internal(format!("cannot start the sweep's thread: {e}")))?;
            let state =
                RowsState { rx: Some(rx), ordered, next: 0, pending: BTreeMap::new(), yielded: 0, finished: false };
            Ok(SweepRows { spec, columns, total, state: Mutex::new(state), cancel })
        })
    })
    .map_err(|f| f.into_pyerr(py))
}

/// A sweep.csv cell of a fixed column as a Python value: whole numbers as int, figures as
/// float, words as str, an empty cell as None.
fn fixed_cell<'py>(py: Python<'py>, column: &str, cell: &str) -> PyResult<Bound<'py, PyAny>> {
    if cell.is_empty() {
        return Ok(py.None().into_bound(py));
    }
    Ok(match column {
        "gpus" | "tokens_per_step" | "oom_step" | "oom_layer" => match cell.parse::<u64>() {
            Ok(n) => n.into_pyobject(py)?.into_any(),
            Err(_) => PyString::new(py, cell).into_any(),
        },
        "verdict" | "oom_phase" => PyString::new(py, cell).into_any(),
        _ => match cell.parse::<f64>() {
            Ok(x) => x.into_pyobject(py)?.into_any(),
            Err(_) => PyString::new(py, cell).into_any(),
        },
    })
}

/// An axis value as a Python value: int, float, bool or str as the sweep file gives it;
/// anything else (arrays, tables) as its CSV label.
fn axis_cell<'py>(py: Python<'py>, v: &toml::Value, label: &str) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        toml::Value::Integer(i) => i.into_pyobject(py)?.into_any(),
        toml::Value::Float(x) => x.into_pyobject(py)?.into_any(),
        toml::Value::Boolean(b) => b.into_pyobject(py)?.to_owned().into_any(),
        toml::Value::String(s) => PyString::new(py, s).into_any(),
        _ => PyString::new(py, label).into_any(),
    })
}

impl SweepRows {
    fn row<'py>(&self, py: Python<'py>, index: u64, line: &str) -> PyResult<Bound<'py, PyDict>> {
        let internal = |m: String| Failure::Internal(m).into_pyerr(py);
        let cells = stepsim::sweep::output::split_csv(line.trim_end_matches('\n')).map_err(internal)?;
        if cells.len() != self.columns.len() {
            return Err(internal(format!(
                "sweep row `{}` has {} fields for {} columns",
                line.trim_end(),
                cells.len(),
                self.columns.len()
            )));
        }
        let axes = &self.spec.axes;
        let vi = self.spec.value_indices(index);
        let d = PyDict::new(py);
        for (c, (name, cell)) in self.columns.iter().zip(&cells).enumerate() {
            let v = match c {
                0 => index.into_pyobject(py)?.into_any(),
                c if c <= axes.len() => axis_cell(py, &axes[c - 1].values[vi[c - 1]], cell)?,
                _ => fixed_cell(py, name, cell)?,
            };
            d.set_item(name, v)?;
        }
        Ok(d)
    }

    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, RowsState>> {
        self.state.lock().map_err(|_| PyRuntimeError::new_err("the sweep's state is poisoned"))
    }
}

#[pymethods]
impl SweepRows {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        loop {
            let rx = {
                let mut st = self.lock()?;
                if st.finished || st.yielded == self.total {
                    st.finished = true;
                    st.rx = None;
                    return Ok(None);
                }
                if st.ordered {
                    let next = st.next;
                    if let Some((index, line)) = st.pending.remove(&next) {
                        st.next += 1;
                        st.yielded += 1;
                        drop(st);
                        return self.row(py, index, &line).map(Some);
                    }
                }
                match st.rx.take() {
                    Some(rx) => rx,
                    None => return Err(PyRuntimeError::new_err("the sweep's rows are being read by another thread")),
                }
            };
            let (rx, got) = py.detach(move || {
                let got = rx.recv_timeout(Duration::from_millis(100));
                (rx, got)
            });
            let mut st = self.lock()?;
            st.rx = Some(rx);
            match got {
                Ok((_, Err(f))) => {
                    st.finished = true;
                    st.rx = None;
                    self.cancel.store(true, Ordering::Relaxed);
                    drop(st);
                    return Err(f.into_pyerr(py));
                }
                Ok((pos, Ok((index, line)))) => {
                    if st.ordered {
                        st.pending.insert(pos, (index, line));
                        continue;
                    }
                    st.yielded += 1;
                    drop(st);
                    return self.row(py, index, &line).map(Some);
                }
                Err(RecvTimeoutError::Timeout) => {
                    drop(st);
                    // Ctrl-C while waiting: KeyboardInterrupt (the workers stop when the
                    // iterator is dropped).
                    py.check_signals()?;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    st.finished = true;
                    st.rx = None;
                    drop(st);
                    return Err(Failure::Internal(
                        "the sweep's workers stopped before every configuration was simulated".into(),
                    )
                    .into_pyerr(py));
                }
            }
        }
    }

    /// Stops the sweep: the workers finish the configurations they are on and stop.
    fn close(&self) -> PyResult<()> {
        self.cancel.store(true, Ordering::Relaxed);
        let mut st = self.lock()?;
        st.finished = true;
        st.rx = None;
        Ok(())
    }
}

// ---------------------------------------------------------------- module

#[pymodule]
fn _stepsim(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_MARGIN", stepsim::explain::DEFAULT_MARGIN)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_class::<Simulation>()?;
    m.add_class::<SweepRows>()?;
    Ok(())
}
