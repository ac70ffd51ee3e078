//! The shipped scenarios through the real binary: exit codes, the verdict and OOM point each
//! one is there to show, the files written, determinism, the text report, `check`, `--json`,
//! and an output folder that cannot be created.

mod common;
use common::{stepsim, text};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
const PARAMS_100B: &str = "101,209,569,280";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Fits,
    /// Out of memory in this step and phase.
    Oom {
        step: u64,
        phase: &'static str,
    },
}

/// What every file in scenarios/ must show. A scenario added there without a line here fails
/// `every_shipped_scenario_has_an_expectation`.
const EXPECTED: &[(&str, Expect)] = &[
    ("100b-1gpu-bf16-weights", Expect::Oom { step: 0, phase: "init" }),
    ("100b-1gpu-zero-infinity", Expect::Fits),
    ("100b-1gpu-int4-inference", Expect::Fits),
    ("100b-4gpu-tp4-inference", Expect::Fits),
    ("100b-8gpu-ddp", Expect::Oom { step: 0, phase: "init" }),
    ("100b-8gpu-fsdp", Expect::Oom { step: 1, phase: "forward" }),
    ("100b-8gpu-fsdp-cpu-offload", Expect::Fits),
    ("100b-8gpu-zero3-offload", Expect::Fits),
    ("100b-32gpu-fsdp", Expect::Oom { step: 1, phase: "backward" }),
    ("100b-32gpu-fsdp-ac", Expect::Fits),
    ("empty-cache-oom", Expect::Oom { step: 2, phase: "forward" }),
    ("fragmentation-oom", Expect::Oom { step: 2, phase: "backward" }),
    ("gpt-1.3b-1gpu", Expect::Fits),
    ("gpt-13b-pp4-1f1b", Expect::Fits),
    ("gpt-13b-pp4-gpipe", Expect::Fits),
    ("gpt-13b-pp4-interleaved-1f1b", Expect::Fits),
    ("gpt3-175b", Expect::Fits),
    ("llama2-7b-h100-fp8", Expect::Fits),
    ("llama3-8b-128k-h100", Expect::Oom { step: 1, phase: "forward" }),
    ("llama3-8b-fsdp2-h100", Expect::Fits),
    ("llama2-70b-lora-1gpu", Expect::Oom { step: 0, phase: "init" }),
    ("llama2-70b-lora-8gpu", Expect::Fits),
    ("llama2-70b-qlora-1gpu", Expect::Fits),
    ("llama2-70b-qlora-8gpu", Expect::Fits),
    ("megatron-70b-h100-overlap", Expect::Fits),
    ("mixtral-8x7b-h100-ep8", Expect::Fits),
    ("mixtral-8x7b-h100-ep8-hot-expert", Expect::Oom { step: 1, phase: "forward" }),
    ("qwen3-30b-a3b-h100-ep16-deepep", Expect::Fits),
    ("qwen3-30b-a3b-h100-pp4-dualpipe", Expect::Fits),
];

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

fn scenario(name: &str) -> PathBuf {
    scenarios_dir().join(format!("{name}.toml"))
}

/// The stems of the `.toml` files in `dir`, sorted.
fn scenario_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Problems with the table against the files in `dir`: scenarios without an expectation and
/// expectations without a scenario.
fn table_problems(dir: &Path, table: &[(&str, Expect)]) -> Vec<String> {
    let files: BTreeSet<String> = scenario_names(dir).into_iter().collect();
    let expected: BTreeSet<String> = table.iter().map(|(n, _)| n.to_string()).collect();
    let mut problems: Vec<String> =
        files.difference(&expected).map(|n| format!("{n}.toml has no expectation in EXPECTED")).collect();
    problems.extend(expected.difference(&files).map(|n| format!("EXPECTED names {n}, which has no scenario file")));
    problems
}

/// `stepsim run <scenario> --out <out> [extra]`, which must exit 0 without a panic.
fn run_ok(scenario: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["run", scenario.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = stepsim(&args, out.parent().unwrap());
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{}: exit {:?}; stderr: {stderr}", scenario.display(), o.status.code());
    assert!(!stderr.contains("panicked"), "{}: panicked: {stderr}", scenario.display());
    o
}

fn read_report(out: &Path) -> Value {
    let path = out.join("report.json");
    let s = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// A byte count at a JSON pointer, e.g. `/verdict/requested/bytes`.
fn bytes(report: &Value, pointer: &str) -> u64 {
    report.pointer(pointer).and_then(Value::as_u64).unwrap_or_else(|| panic!("report.json has no integer {pointer}"))
}

fn str_at<'a>(report: &'a Value, pointer: &str) -> &'a str {
    report.pointer(pointer).and_then(Value::as_str).unwrap_or_else(|| panic!("report.json has no string {pointer}"))
}

/// Checks one shipped scenario's run; returns what is wrong.
fn check_shipped(name: &str, expect: Expect, stdout: &str, out: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut require = |ok: bool, what: String| {
        if !ok {
            bad.push(format!("{name}: {what}"));
        }
    };

    // The four files, non-empty; the plot a PNG; the Chrome trace valid JSON with events.
    for f in ["report.json", "memory.csv", "trace.json", "memory.png", "timeline.png"] {
        let len = std::fs::metadata(out.join(f)).map(|m| m.len()).unwrap_or(0);
        require(len > 0, format!("{f} missing or empty"));
    }
    let chrome: Value = serde_json::from_str(&std::fs::read_to_string(out.join("trace.json")).unwrap_or_default())
        .unwrap_or(Value::Null);
    let events = chrome.pointer("/traceEvents").and_then(Value::as_array).map_or(0, |e| e.len());
    require(events > 3, format!("trace.json has {events} events"));
    let png = std::fs::read(out.join("memory.png")).unwrap_or_default();
    require(png.starts_with(PNG_SIGNATURE), "memory.png does not start with the PNG signature".into());

    let r = read_report(out);
    require(str_at(&r, "/scenario") == name, format!("report.json names scenario {}", str_at(&r, "/scenario")));
    let verdict = str_at(&r, "/verdict/verdict");
    let capacity = bytes(&r, "/capacity/bytes");
    match expect {
        Expect::Fits => {
            require(verdict == "fits", format!("verdict {verdict}, want fits"));
            if verdict == "fits" {
                let peak = bytes(&r, "/peak/allocated/bytes");
                require(peak <= capacity, format!("peak {peak} B over capacity {capacity} B"));
                if str_at(&r, "/job") == "inference" {
                    let tps = r.pointer("/inference/timing/decode_tokens_per_s").and_then(Value::as_f64);
                    require(tps.is_some_and(|t| t > 0.0), format!("inference.timing.decode_tokens_per_s {tps:?}"));
                } else {
                    let mfu = r.pointer("/throughput/mfu").and_then(Value::as_f64);
                    require(mfu.is_some_and(|m| m > 0.0 && m < 1.0), format!("throughput.mfu {mfu:?} not in (0, 1)"));
                }
            }
            require(stdout.contains("FITS"), "text report does not say FITS".into());
        }
        Expect::Oom { step, phase } => {
            require(verdict == "oom", format!("verdict {verdict}, want oom"));
            if verdict == "oom" {
                let got_step = r.pointer("/verdict/step").and_then(Value::as_u64);
                require(got_step == Some(step), format!("OOM in step {got_step:?}, want {step}"));
                let got_phase = str_at(&r, "/verdict/phase");
                require(got_phase == phase, format!("OOM in phase {got_phase}, want {phase}"));
                let requested = bytes(&r, "/verdict/requested/bytes");
                let free = bytes(&r, "/verdict/free/bytes");
                require(requested > free, format!("requested {requested} B is not more than free {free} B"));
            }
            require(stdout.contains("OOM"), "text report does not say OOM".into());
        }
    }

    // Text report: decimal and binary units side by side.
    require(stdout.contains(" GB"), "text report has no GB".into());
    require(stdout.contains(" GiB"), "text report has no GiB".into());
    // The 100B model everywhere; a tensor-parallel one pads its vocabulary (Megatron's
    // --make-vocab-size-divisible-by), which adds (vocab - 50257) x 10240 embedding rows.
    let padded = r.pointer("/model/vocab").and_then(Value::as_u64).unwrap_or(50257).saturating_sub(50257);
    if name.starts_with("100b-") && padded == 0 {
        require(stdout.contains(PARAMS_100B), format!("text report does not give the parameter count {PARAMS_100B}"));
        require(bytes(&r, "/param_count") == 101_209_569_280, "report.json param_count is not 101,209,569,280".into());
    } else if name.starts_with("100b-") {
        let want = 101_209_569_280 + padded * 10240;
        require(
            bytes(&r, "/param_count") == want,
            format!("report.json param_count is not {want} (padded vocabulary)"),
        );
    }
    bad
}

#[test]
fn every_shipped_scenario_has_an_expectation() {
    let problems = table_problems(&scenarios_dir(), EXPECTED);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The completeness check itself: a scenario file the table does not know is reported.
#[test]
fn an_unlisted_scenario_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    for name in scenario_names(&scenarios_dir()) {
        std::fs::copy(scenario(&name), dir.path().join(format!("{name}.toml"))).unwrap();
    }
    assert!(table_problems(dir.path(), EXPECTED).is_empty());
    std::fs::copy(scenario("gpt-1.3b-1gpu"), dir.path().join("new-scenario.toml")).unwrap();
    assert_eq!(table_problems(dir.path(), EXPECTED), vec!["new-scenario.toml has no expectation in EXPECTED"]);
}

#[test]
fn shipped_scenarios_show_what_they_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    for name in scenario_names(&scenarios_dir()) {
        let Some(&(_, expect)) = EXPECTED.iter().find(|(n, _)| *n == name) else {
            bad.push(format!("{name}: no expectation in EXPECTED"));
            continue;
        };
        let out = tmp.path().join(&name);
        let o = run_ok(&scenario(&name), &out, &[]);
        bad.extend(check_shipped(&name, expect, &text(&o.stdout), &out));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The point of 100b-32gpu-fsdp: the per-GPU model state fits, the run does not.
#[test]
fn fsdp_32_gpus_average_fits_but_the_run_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&scenario("100b-32gpu-fsdp"), &out, &[]);
    let r = read_report(&out);
    let capacity = bytes(&r, "/capacity/bytes");
    let state = bytes(&r, "/model_state_per_gpu/total/bytes");
    assert!(state < capacity, "model state per GPU {state} B is not below capacity {capacity} B");
    assert_eq!(str_at(&r, "/verdict/verdict"), "oom");
    assert!(bytes(&r, "/verdict/requested/bytes") > bytes(&r, "/verdict/free/bytes"));
}

#[test]
fn runs_are_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["100b-32gpu-fsdp-ac", "gpt-1.3b-1gpu"] {
        let a = tmp.path().join(format!("{name}-a"));
        let b = tmp.path().join(format!("{name}-b"));
        let out_a = run_ok(&scenario(name), &a, &[]);
        let out_b = run_ok(&scenario(name), &b, &[]);
        for f in ["report.json", "memory.csv", "trace.json", "memory.png", "timeline.png"] {
            let fa = std::fs::read(a.join(f)).unwrap();
            let fb = std::fs::read(b.join(f)).unwrap();
            assert!(fa == fb, "{name}: {f} differs between two runs");
        }
        // The text report differs only in the folder it names.
        let ta = text(&out_a.stdout).replace(a.to_str().unwrap(), "OUT");
        let tb = text(&out_b.stdout).replace(b.to_str().unwrap(), "OUT");
        assert_eq!(ta, tb, "{name}: text report differs between two runs");
    }
}

#[test]
fn check_accepts_a_shipped_scenario() {
    let tmp = tempfile::tempdir().unwrap();
    let path = scenario("gpt-1.3b-1gpu");
    let o = stepsim(&["check", path.to_str().unwrap()], tmp.path());
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains("ok"), "stdout: {stdout}");
    assert!(stdout.contains("a100-80gb"), "stdout: {stdout}");
    // What it derived: the count by part, the layout, the filled-in defaults.
    for want in
        ["1,315,723,264 parameters = 24 blocks x", "x data 1", "tokens per step", "precision \"bf16-mixed-adam\""]
    {
        assert!(stdout.contains(want), "{want}: {stdout}");
    }
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none(), "check wrote files");
}

#[test]
fn json_flag_prints_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run_ok(&scenario("gpt-1.3b-1gpu"), &out, &["--json"]);
    let stdout = text(&o.stdout);
    let printed: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("--json stdout is not JSON: {e}\n{stdout}"));
    assert_eq!(printed, read_report(&out), "--json stdout differs from report.json");
    assert_eq!(str_at(&printed, "/verdict/verdict"), "fits");
}

#[test]
fn default_output_folder_is_output_slash_name() {
    let tmp = tempfile::tempdir().unwrap();
    let path = scenario("100b-1gpu-bf16-weights");
    let o = stepsim(&["run", path.to_str().unwrap()], tmp.path());
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    let out = tmp.path().join("output/100b-1gpu-bf16-weights");
    for f in ["report.json", "memory.csv", "memory.png"] {
        assert!(out.join(f).is_file(), "{} not written", out.join(f).display());
    }
}

#[test]
fn unwritable_output_folder_is_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    let path = scenario("100b-1gpu-bf16-weights");
    for out in [file.join("out"), file.clone()] {
        let o = stepsim(&["run", path.to_str().unwrap(), "--out", out.to_str().unwrap()], tmp.path());
        let stderr = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--out {}: exit {:?}; stderr: {stderr}", out.display(), o.status.code());
        assert!(stderr.starts_with("error: "), "--out {}: stderr: {stderr}", out.display());
        assert!(stderr.contains("cannot write"), "--out {}: stderr: {stderr}", out.display());
        assert!(!stderr.contains("panicked"), "--out {}: panicked: {stderr}", out.display());
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a folder");
}

/// `explain` covers training steps: an inference job is refused with a pointer to `run`.
#[test]
fn explain_refuses_an_inference_job() {
    let tmp = tempfile::tempdir().unwrap();
    let path = scenario("100b-1gpu-int4-inference");
    let o = stepsim(&["explain", path.to_str().unwrap(), "--out", tmp.path().join("x").to_str().unwrap()], tmp.path());
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(err.contains("100b-1gpu-int4-inference.toml") && err.contains("stepsim run"), "{err}");
    assert!(!tmp.path().join("x").exists());
}

/// Issue 22: outputs are all or nothing. A run that cannot write one of its files leaves
/// none of the new set behind (a folder in the way of memory.png, after report.json and
/// memory.csv were written), and a dangling `--out` link is named as such.
#[test]
fn a_failed_write_leaves_no_partial_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scenario = root.join("scenarios/gpt-1.3b-1gpu.toml");
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join("memory.png")).unwrap();
    let o = stepsim(&["run", scenario.to_str().unwrap(), "--out", out.to_str().unwrap()], tmp.path());
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("a folder is in the way"), "{}", text(&o.stderr));
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("memory.png")], "nothing new beside the folder");
    #[cfg(unix)]
    {
        let link = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("missing/folder"), &link).unwrap();
        let o = stepsim(&["run", scenario.to_str().unwrap(), "--out", link.to_str().unwrap()], tmp.path());
        assert_eq!(o.status.code(), Some(2));
        assert!(text(&o.stderr).contains("symbolic link to a folder that does not exist"), "{}", text(&o.stderr));
    }
}

/// Issue 22: a job too large for a full report (every task named, every sample kept) is
/// refused by `run` before any work, pointing to the sweep's lean path.
#[test]
fn a_job_too_large_for_a_full_report_is_refused_before_the_work() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let body = std::fs::read_to_string(root.join("scenarios/gpt-1.3b-1gpu.toml"))
        .unwrap()
        .replace("grad_accum = 2", "grad_accum = 2000");
    let file = tmp.path().join("big.toml");
    std::fs::write(&file, body).unwrap();
    let t = std::time::Instant::now();
    let o = stepsim(&["run", file.to_str().unwrap(), "--out", tmp.path().join("o").to_str().unwrap()], tmp.path());
    assert_eq!(o.status.code(), Some(2));
    let e = text(&o.stderr);
    assert!(
        e.contains("field `training.grad_accum`") && e.contains("a full report holds") && e.contains("stepsim sweep"),
        "{e}"
    );
    assert!(t.elapsed().as_secs_f64() < 5.0);
    assert!(!tmp.path().join("o").exists());
}
