//! Sweeps: axis expansion and filters, precise errors for bad sweep files (exit 2), the same
//! CSV whatever `--jobs`, shards that merge into the unsharded run, `--resume` that loses and
//! duplicates nothing, the lean simulation agreeing with `simulate`, and the shipped
//! capacity sweep answering its question.

mod common;
use common::{stepsim, text};
use std::path::{Path, PathBuf};

use serde_json::Value;
use stepsim::scenario::Scenario;
use stepsim::sweep::answer::Aggregator;
use stepsim::sweep::heatmap;
use stepsim::sweep::output::parse_row;
use stepsim::sweep::summary::{self, Outcome};
use stepsim::sweep::SweepSpec;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn scenario_path(name: &str) -> String {
    root().join("scenarios").join(format!("{name}.toml")).display().to_string()
}

/// A sweep of the 1.3B GPT: 4 GPU counts x 3 micro-batches x 2 shardings x 2 checkpointing
/// = 48 configurations; some run out of memory (DDP with large micro-batches), most fit.
fn small_sweep(extra: &str) -> String {
    format!(
        r#"name = "small"
base = {base:?}
{extra}
[axes]
hardware.gpus = [1, 2, 4, 8]
training.micro_batch = [4, 8, 16]
parallel.sharding = ["none", "full_shard"]
training.activation_checkpointing = ["none", "full"]
"#,
        base = scenario_path("gpt-1.3b-1gpu")
    )
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn spec_of(body: &str) -> SweepSpec {
    SweepSpec::from_toml(Path::new("test-sweep.toml"), body).unwrap_or_else(|e| panic!("{e}"))
}

fn spec_err(body: &str) -> String {
    match SweepSpec::from_toml(Path::new("bad.toml"), body) {
        Ok(_) => panic!("accepted:\n{body}"),
        Err(e) => {
            assert_eq!(e.exit_code(), 2, "{e}");
            e.to_string()
        }
    }
}

/// Runs `stepsim sweep` and requires exit 0; returns (stdout, stderr).
fn sweep_ok(args: &[&str], cwd: &Path) -> (String, String) {
    let mut a = vec!["sweep"];
    a.extend_from_slice(args);
    let o = stepsim(&a, cwd);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "stepsim {a:?}: exit {:?}\nstdout: {out}\nstderr: {err}", o.status.code());
    assert!(!err.contains("panicked"), "{err}");
    (out, err)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

// ---------------------------------------------------------------- expansion and filters

#[test]
fn axes_expand_in_file_order_with_the_first_axis_slowest() {
    let spec = spec_of(&small_sweep(""));
    let paths: Vec<&str> = spec.axes.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(
        paths,
        ["hardware.gpus", "training.micro_batch", "parallel.sharding", "training.activation_checkpointing"]
    );
    assert_eq!(spec.size, 4 * 3 * 2 * 2);
    assert_eq!(spec.value_indices(0), [0, 0, 0, 0]);
    assert_eq!(spec.value_indices(1), [0, 0, 0, 1]);
    assert_eq!(spec.value_indices(47), [3, 2, 1, 1]);
    assert_eq!(
        spec.describe(15),
        "hardware.gpus = 2, training.micro_batch = 4, parallel.sharding = \"full_shard\", training.activation_checkpointing = \"full\""
    );
    // Each point is the base with the axis values written in, validated as a scenario.
    let s = spec.point(15).unwrap().expect("no filter");
    assert_eq!(s.cluster.gpus, 2);
    assert_eq!(s.training.micro_batch, 4);
    assert_eq!(s.training.grad_accum, 2, "from the base");
    assert_eq!(s.parallel.sharding, stepsim::plan::Sharding::Zero3);
    assert_eq!(s.training.checkpointing, stepsim::plan::Checkpointing::Full);
    assert!(spec.csv_header().starts_with(
        "index,hardware.gpus,training.micro_batch,parallel.sharding,training.activation_checkpointing,gpus,"
    ));
}

#[test]
fn axes_can_be_sub_tables_or_quoted_paths_and_the_base_inline() {
    let body = r#"
[base.model]
family = "gpt"
n_layers = 2
hidden = 256
n_heads = 4
vocab = 1000
[base.hardware]
gpu = "h100-sxm"
gpus = 1
[base.training]
micro_batch = 1
seq_len = 128

[axes."training.seq_len"]
[axes.hardware]
gpus = [1, 2]
gpu = ["h100-sxm", "a100-80gb"]
"#;
    // `[axes."training.seq_len"]` is an empty table: not a list of values.
    let e = spec_err(body);
    assert!(e.contains("field `axes.training.seq_len`") && e.contains("non-empty list"), "{e}");
    let body = body.replace("[axes.\"training.seq_len\"]\n", "[axes]\n\"training.seq_len\" = [64, 128]\n");
    let spec = spec_of(&body);
    let paths: Vec<&str> = spec.axes.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, ["training.seq_len", "hardware.gpus", "hardware.gpu"]);
    let s = spec.point(spec.size - 1).unwrap().unwrap();
    assert_eq!((s.workload.seq_len, s.cluster.gpus, s.cluster.gpu.name.as_ref()), (128, 2, "a100-80gb"));
}

#[test]
fn filters_keep_exactly_the_configurations_that_satisfy_them() {
    let body = format!(
        r#"base = {base:?}
filter = ["micro_batch * grad_accum * dp = 64", "parallel.sharding != \"none\" ", "nodes <= 1"]
[axes]
hardware.gpus = [1, 2, 4, 8, 16]
training.micro_batch = [1, 2, 4, 8]
training.grad_accum = [1, 2, 4, 8, 16]
parallel.sharding = ["none", "zero2", "full_shard"]
"#,
        base = scenario_path("gpt-1.3b-1gpu")
    );
    let spec = spec_of(&body);
    let mut kept = 0;
    for i in 0..spec.size {
        let v = spec.value_indices(i);
        let (g, mb, ga) = ([1, 2, 4, 8, 16][v[0]], [1, 2, 4, 8][v[1]], [1, 2, 4, 8, 16][v[2]]);
        let want = mb * ga * g == 64 && v[3] != 0 && g <= 8;
        let got = spec.point(i).unwrap();
        assert_eq!(got.is_some(), want, "configuration {i}: {}", spec.describe(i));
        kept += usize::from(want);
    }
    assert_eq!(kept, 2 * 13, "two shardings x the 13 (gpus <= 8, mb, ga) triples with product 64");
}

#[test]
fn a_filter_can_leave_out_combinations_that_would_not_validate() {
    let body = format!(
        "base = {:?}\nfilter = [\"gpus % gpus_per_node = 0\"]\n[axes]\nhardware.gpus = [1, 4, 16]\nhardware.gpus_per_node = [1, 8]\n",
        scenario_path("gpt-1.3b-1gpu")
    );
    let spec = spec_of(&body);
    let kept: Vec<String> =
        (0..spec.size).filter(|&i| spec.point(i).unwrap().is_some()).map(|i| spec.describe(i)).collect();
    assert_eq!(
        kept,
        [
            "hardware.gpus = 1, hardware.gpus_per_node = 1",
            "hardware.gpus = 4, hardware.gpus_per_node = 1",
            "hardware.gpus = 16, hardware.gpus_per_node = 1",
            "hardware.gpus = 16, hardware.gpus_per_node = 8"
        ]
    );
    // Without the filter the first invalid combination is the error, and says how to avoid it.
    let spec = spec_of(&body.replace("filter = [\"gpus % gpus_per_node = 0\"]\n", ""));
    let e = spec.point(1).unwrap_err().to_string();
    assert!(
        e.contains("field `hardware.gpus_per_node`") && e.contains("a `filter` can leave such combinations out"),
        "{e}"
    );
}

#[test]
fn bad_filters_name_the_constraint_and_what_is_allowed() {
    let with = |f: &str| small_sweep(&format!("filter = [{f:?}]"));
    let e = spec_err(&with("micro_batchh = 4"));
    assert!(
        e.contains("field `filter[0]`") && e.contains("unknown name `micro_batchh`") && e.contains("global_batch"),
        "{e}"
    );
    let e = spec_err(&with("micro_batch * 4"));
    assert!(e.contains("filter[0]") && e.contains("compares two sides"), "{e}");
    let e = spec_err(&with("model.n_kv_heads = 4"));
    assert!(e.contains("`model.n_kv_heads` is neither an axis nor set in the base scenario"), "{e}");
    let e = spec_err(&with("gpus = (2"));
    assert!(e.contains("missing `)`"), "{e}");
    // Type errors surface per configuration, naming it.
    let spec = spec_of(&with("sharding < 3"));
    let e = spec.point(0).unwrap_err().to_string();
    assert!(e.contains("filter[0]") && e.contains("cannot compare a string") && e.contains("configuration 0"), "{e}");
    // Issue 22: an infinity equalled everything within the relative tolerance, so
    // `gpus * 1e400 = 5` kept every configuration.
    let e = spec_err(&with("gpus * 1e400 = 5"));
    assert!(e.contains("filter[0]") && e.contains("`1e400` is beyond the largest number"), "{e}");
    let spec = spec_of(&with("gpus * 1e300 * 1e300 = 5"));
    let e = spec.point(0).unwrap_err().to_string();
    assert!(e.contains("filter[0]") && e.contains("beyond the largest number") && e.contains("configuration 0"), "{e}");
}

#[test]
fn bad_sweep_files_give_precise_errors() {
    let base = scenario_path("gpt-1.3b-1gpu");
    let cases: &[(String, &[&str])] = &[
        (
            format!("base = {base:?}\n[axes]\ntraining.micro_batchh = [1, 2]\n"),
            &["bad.toml", "field `axes.training.micro_batchh`", "unknown field `micro_batchh`", "micro_batch"],
        ),
        (
            format!("base = {base:?}\n[axes]\nhardwre.gpus = [1, 2]\n"),
            &["field `axes.hardwre.gpus`", "unknown field `hardwre`", "hardware"],
        ),
        (
            format!("base = {base:?}\n[axes]\ntraining.micro_batch = [1, \"two\"]\n"),
            &["field `axes.training.micro_batch`", "value \"two\" (item 2 of the list)", "field `training.micro_batch`", "invalid type"],
        ),
        (
            format!("base = {base:?}\n[axes]\nhardware.gpus = 8\n"),
            &["field `axes.hardware.gpus`", "non-empty list"],
        ),
        (format!("base = {base:?}\n[axes]\nhardware.gpus = []\n"), &["field `axes.hardware.gpus`", "non-empty list"]),
        (format!("base = {base:?}\n[axes]\nhardware.gpus = [1, 1]\n"), &["field `axes.hardware.gpus`", "twice"]),
        (format!("base = {base:?}\n"), &["field `axes`", "no axes"]),
        ("[axes]\nhardware.gpus = [1]\n".to_string(), &["field `base`", "missing"]),
        ("base = \"no-such.toml\"\n[axes]\nhardware.gpus = [1]\n".to_string(), &["field `base`", "cannot read the base scenario"]),
        (format!("base = {base:?}\naxis = 3\n[axes]\nhardware.gpus = [1]\n"), &["field `axis`", "unknown field"]),
        (
            format!("base = {base:?}\n[axes]\nhardware.gpus = [1]\n[[objective]]\nminimize = \"cost\"\n"),
            &["field `objective[0].minimize`", "unknown metric \"cost\"", "\"gpu_hours\""],
        ),
        (
            format!("base = {base:?}\n[axes]\nhardware.gpus = [1]\n[[objective]]\nminimize = \"gpu_hours\"\n"),
            &["field `objective[0].minimize`", "token_budget"],
        ),
        (
            format!("base = {base:?}\n[axes]\nhardware.gpus = [1]\n[[objective]]\nminimize = \"gpus\"\nmaximize = \"mfu\"\n"),
            &["field `objective[0]`", "exactly one"],
        ),
        (
            format!("base = {base:?}\n[axes]\nhardware.gpus = [1]\n[heatmap]\nx = \"training.seq_len\"\n"),
            &["field `heatmap.x`", "not an axis", "\"hardware.gpus\""],
        ),
        (
            format!("base = {base:?}\ntoken_budget = -5\n[axes]\nhardware.gpus = [1]\n"),
            &["field `token_budget`", "positive"],
        ),
        (
            "[base.model]\nfamily = \"gpt\"\n[axes]\nhardware.gpus = [1]\n".to_string(),
            &["field `base.hardware`", "missing field"],
        ),
    ];
    for (body, wants) in cases {
        let e = spec_err(body);
        for w in *wants {
            assert!(e.contains(w), "error for\n{body}\nis `{e}`, which lacks `{w}`");
        }
    }
}

#[test]
fn an_invalid_configuration_names_its_axis_value_and_the_field() {
    // micro_batch = 0 has the right type, so only the configuration check catches it.
    let body = small_sweep("").replace("training.micro_batch = [4, 8, 16]", "training.micro_batch = [4, 0]");
    let spec = spec_of(&body);
    let e = spec.point(1 << 2).unwrap_err().to_string();
    assert!(
        e.contains("axis `training.micro_batch` = 0")
            && e.contains("field `training.micro_batch`: must be a positive integer, got 0"),
        "{e}"
    );
    // A combination that is invalid (4 GPUs with the base's 8 per node) names the configuration.
    let body = small_sweep("")
        .replace("hardware.gpus = [1, 2, 4, 8]", "hardware.gpus = [16, 4]\nhardware.gpus_per_node = [8]");
    let spec = spec_of(&body);
    let e = spec.point(spec.size - 1).unwrap_err().to_string();
    assert!(e.contains("field `hardware.gpus_per_node`") && e.contains("hardware.gpus = 4"), "{e}");
}

#[test]
fn bad_sweeps_and_flags_exit_2_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = write(tmp.path(), "bad.toml", &small_sweep("").replace("training.micro_batch", "training.micro_batchh"));
    let good = write(tmp.path(), "good.toml", &small_sweep(""));
    let invalid = write(tmp.path(), "invalid.toml", &small_sweep("").replace("[4, 8, 16]", "[4, 0]"));
    let inference = write(
        tmp.path(),
        "inference.toml",
        &format!("base = {:?}\n[axes]\n\"inference.batch\" = [1, 2]\n", scenario_path("100b-1gpu-int4-inference")),
    );
    let out = tmp.path().join("out");
    let o = out.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![bad.to_str().unwrap(), "--out", o], "field `axes.training.micro_batchh`"),
        (vec![invalid.to_str().unwrap(), "--out", o], "axis `training.micro_batch` = 0"),
        (vec![inference.to_str().unwrap(), "--out", o], "sweeps simulate training steps only"),
        (vec![good.to_str().unwrap(), "--out", o, "--shard", "0/4"], "1 <= I <= N"),
        (vec![good.to_str().unwrap(), "--out", o, "--shard", "5/4"], "1 <= I <= N"),
        (vec![good.to_str().unwrap(), "--out", o, "--jobs", "0"], "--jobs"),
        (vec!["missing.toml"], "cannot read the sweep file"),
        (vec!["merge", good.to_str().unwrap(), tmp.path().to_str().unwrap()], "not a sweep shard's output folder"),
    ];
    for (args, want) in cases {
        let mut a = vec!["sweep"];
        a.extend(args.iter().copied());
        let r = stepsim(&a, tmp.path());
        let err = text(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "stepsim {a:?}: exit {:?}; stderr {err}", r.status.code());
        assert!(err.contains(want), "stepsim {a:?}: stderr `{err}` lacks `{want}`");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out.join("sweep.csv").exists(), "stepsim {a:?} wrote sweep.csv");
    }
}

// ---------------------------------------------------------------- running

#[test]
fn jobs_1_and_2_give_identical_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let sw = write(tmp.path(), "small.toml", &small_sweep(""));
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let (out_a, _) = sweep_ok(&[sw.to_str().unwrap(), "--out", a.to_str().unwrap(), "--jobs", "1"], tmp.path());
    let (out_b, err_b) = sweep_ok(&[sw.to_str().unwrap(), "--out", b.to_str().unwrap(), "--jobs", "2"], tmp.path());
    let csv = read(&a.join("sweep.csv"));
    assert_eq!(csv, read(&b.join("sweep.csv")), "sweep.csv differs between --jobs 1 and 2");
    assert_eq!(read(&a.join("sweep.json")), read(&b.join("sweep.json")));
    assert_eq!(out_a.replace(a.to_str().unwrap(), "OUT"), out_b.replace(b.to_str().unwrap(), "OUT"));
    // One row per configuration, in configuration order; no partial file left behind.
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 48);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(parse_row(r, 4).unwrap().index, i as u64);
    }
    assert!(!b.join("sweep.csv.partial").exists());
    assert!(std::fs::read(b.join("heatmap.png")).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));
    // No progress bar when stderr is not a terminal: just the closing line.
    assert!(!err_b.contains('\r') && err_b.lines().count() == 1, "stderr: {err_b}");
}

#[test]
fn shards_merge_into_the_unsharded_run() {
    let tmp = tempfile::tempdir().unwrap();
    let sw = write(tmp.path(), "small.toml", &small_sweep(""));
    let sw = sw.to_str().unwrap();
    let whole = tmp.path().join("whole");
    sweep_ok(&[sw, "--out", whole.to_str().unwrap()], tmp.path());
    let mut dirs = Vec::new();
    let mut total = 0;
    for i in 1..=3 {
        let d = tmp.path().join(format!("shard{i}"));
        let shard = format!("{i}/3");
        let (out, _) = sweep_ok(&[sw, "--out", d.to_str().unwrap(), "--shard", &shard, "--jobs", "1"], tmp.path());
        assert!(out.contains(&format!("Shard {i}/3")), "{out}");
        assert!(!d.join("sweep.json").exists(), "a shard alone answers nothing");
        total += read(&d.join("sweep.csv")).lines().count() - 1;
        dirs.push(d.to_str().unwrap().to_string());
    }
    assert_eq!(total, 48, "the shards partition the sweep");
    // Merging needs every shard exactly once.
    let merged = tmp.path().join("merged");
    let r = stepsim(&["sweep", "merge", sw, &dirs[0], &dirs[2], "--out", merged.to_str().unwrap()], tmp.path());
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r.stderr).contains("missing shard(s) 2/3"), "{}", text(&r.stderr));
    let r =
        stepsim(&["sweep", "merge", sw, &dirs[0], &dirs[0], &dirs[1], "--out", merged.to_str().unwrap()], tmp.path());
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r.stderr).contains("given twice"), "{}", text(&r.stderr));
    // In any order, they merge into the unsharded run's files.
    let (out, _) =
        sweep_ok(&["merge", sw, &dirs[2], &dirs[0], &dirs[1], "--out", merged.to_str().unwrap()], tmp.path());
    assert!(out.contains("Smallest GPU count that fits"), "{out}");
    for f in ["sweep.csv", "sweep.json"] {
        assert_eq!(
            read(&merged.join(f)),
            read(&whole.join(f)),
            "{f} of the merged shards differs from the unsharded run"
        );
    }
    assert_eq!(std::fs::read(merged.join("heatmap.png")).unwrap(), std::fs::read(whole.join("heatmap.png")).unwrap());
    // Shards of another sweep are refused.
    let other = write(tmp.path(), "other.toml", &small_sweep("").replace("[1, 2, 4, 8]", "[1, 2, 4]"));
    let r = stepsim(&["sweep", "merge", other.to_str().unwrap(), &dirs[0], &dirs[1], &dirs[2]], tmp.path());
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r.stderr).contains("other axes"), "{}", text(&r.stderr));
}

/// Issue 22: a shard whose table lost, repeated or changed a row is refused by `merge`
/// (its manifest seals the table's row count and checksum), and a refused merge leaves the
/// output folder as it was.
#[test]
fn merge_refuses_damaged_shards_and_leaves_no_partial_output() {
    let tmp = tempfile::tempdir().unwrap();
    let sw = write(tmp.path(), "small.toml", &small_sweep(""));
    let sw = sw.to_str().unwrap();
    let dirs: Vec<PathBuf> = (1..=2)
        .map(|i| {
            let d = tmp.path().join(format!("shard{i}"));
            sweep_ok(&[sw, "--out", d.to_str().unwrap(), "--shard", &format!("{i}/2")], tmp.path());
            d
        })
        .collect();
    let csv = read(&dirs[1].join("sweep.csv"));
    let lines: Vec<&str> = csv.split_inclusive('\n').collect();
    let merged = tmp.path().join("merged");
    let damages: Vec<(String, String, &str)> = vec![
        ("a lost row".into(), [&lines[..5], &lines[6..]].concat().concat(), "rows where its manifest records"),
        ("a repeated row".into(), [&lines[..6], &lines[5..]].concat().concat(), "rows where its manifest records"),
        ("an edited figure".into(), csv.replacen(",fits,", ",oom,", 1), "checksum"),
        ("a cut last line".into(), csv[..csv.len() - 3].to_string(), "rows where its manifest records"),
    ];
    for (what, body, want) in damages {
        std::fs::write(dirs[1].join("sweep.csv"), &body).unwrap();
        let r = stepsim(
            &[
                "sweep",
                "merge",
                sw,
                dirs[0].to_str().unwrap(),
                dirs[1].to_str().unwrap(),
                "--out",
                merged.to_str().unwrap(),
            ],
            tmp.path(),
        );
        let err = text(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{what}: {err}");
        assert!(
            err.contains("shard 2/2's sweep.csv") && err.contains(want) && err.contains("run the shard again"),
            "{what}: {err}"
        );
        assert!(
            !merged.join("sweep.csv").exists() && !merged.join("sweep.json").exists(),
            "{what}: output left behind"
        );
    }
    // Undamaged, it merges.
    std::fs::write(dirs[1].join("sweep.csv"), &csv).unwrap();
    sweep_ok(
        &["merge", sw, dirs[0].to_str().unwrap(), dirs[1].to_str().unwrap(), "--out", merged.to_str().unwrap()],
        tmp.path(),
    );
    assert!(read(&merged.join("sweep.manifest.json")).contains("\"complete\": true"));
}

/// Issue 22: a shard the filter leaves empty writes an empty table, so the sweep can still
/// be merged; a sweep that keeps nothing at all is an error, sharded or not.
#[test]
fn an_empty_shard_writes_an_empty_table_that_merges() {
    let tmp = tempfile::tempdir().unwrap();
    // Keeps configurations 0 and 1 only (8 GPUs' shards 1 and 2 of 4 own them).
    let body = small_sweep("filter = [\"gpus = 1\", \"micro_batch = 4\", \"parallel.sharding = \\\"none\\\"\"]");
    let sw = write(tmp.path(), "tiny.toml", &body);
    let sw = sw.to_str().unwrap();
    let whole = tmp.path().join("whole");
    sweep_ok(&[sw, "--out", whole.to_str().unwrap()], tmp.path());
    let mut dirs = Vec::new();
    let mut empty = 0;
    for i in 1..=4 {
        let d = tmp.path().join(format!("s{i}"));
        sweep_ok(&[sw, "--out", d.to_str().unwrap(), "--shard", &format!("{i}/4")], tmp.path());
        let rows = read(&d.join("sweep.csv")).lines().count() - 1;
        empty += usize::from(rows == 0);
        dirs.push(d.to_str().unwrap().to_string());
    }
    assert!(empty >= 2, "expected empty shards");
    let merged = tmp.path().join("merged");
    let mut args = vec!["merge", sw];
    args.extend(dirs.iter().map(String::as_str));
    args.extend(["--out", merged.to_str().unwrap()]);
    sweep_ok(&args, tmp.path());
    assert_eq!(read(&merged.join("sweep.csv")), read(&whole.join("sweep.csv")));
    assert_eq!(read(&merged.join("sweep.json")), read(&whole.join("sweep.json")));
    // Nothing kept anywhere: refused, sharded or not.
    let none = write(tmp.path(), "none.toml", &small_sweep("filter = [\"gpus = 3\"]"));
    let r = stepsim(&["sweep", none.to_str().unwrap(), "--out", tmp.path().join("n").to_str().unwrap()], tmp.path());
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r.stderr).contains("no configuration passes the filter"), "{}", text(&r.stderr));
    let n1 = tmp.path().join("n1");
    sweep_ok(&[none.to_str().unwrap(), "--out", n1.to_str().unwrap(), "--shard", "1/1"], tmp.path());
    let r = stepsim(
        &[
            "sweep",
            "merge",
            none.to_str().unwrap(),
            n1.to_str().unwrap(),
            "--out",
            tmp.path().join("nm").to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r.stderr).contains("no configuration passes the filter"), "{}", text(&r.stderr));
}

/// Issue 22: when the answer cannot be written, neither sweep.json nor heatmap.png is left
/// (an earlier run's would not be this table's) and the manifest does not say complete;
/// `--resume` then finishes from the complete table without simulating again.
#[test]
fn a_sweep_whose_answer_cannot_be_written_leaves_no_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let sw = write(tmp.path(), "small.toml", &small_sweep(""));
    let sw = sw.to_str().unwrap();
    let out = tmp.path().join("out");
    sweep_ok(&[sw, "--out", out.to_str().unwrap()], tmp.path());
    let json = read(&out.join("sweep.json"));
    // A folder in the way of the heatmap's temporary file.
    std::fs::create_dir_all(out.join("heatmap.png.tmp.png/x")).unwrap();
    let r = stepsim(&["sweep", sw, "--out", out.to_str().unwrap()], tmp.path());
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    assert!(text(&r.stderr).contains("heatmap"), "{}", text(&r.stderr));
    assert!(!out.join("sweep.json").exists(), "sweep.json left beside a missing heatmap");
    assert!(read(&out.join("sweep.manifest.json")).contains("\"complete\": false"));
    assert!(!out.join("heatmap.png").exists(), "the earlier run's heatmap left beside this table");
    assert!(out.join("sweep.csv").exists(), "the complete table is kept for --resume");
    std::fs::remove_dir_all(out.join("heatmap.png.tmp.png")).unwrap();
    let (_, err) = sweep_ok(&[sw, "--out", out.to_str().unwrap(), "--resume"], tmp.path());
    assert!(!err.contains("simulated"), "{err}");
    assert_eq!(read(&out.join("sweep.json")), json);
    assert!(read(&out.join("sweep.manifest.json")).contains("\"complete\": true"));
    // A complete table edited afterwards is not reused.
    let csv = read(&out.join("sweep.csv"));
    std::fs::write(out.join("sweep.csv"), csv.replacen(",fits,", ",oom,", 1)).unwrap();
    let r = stepsim(&["sweep", sw, "--out", out.to_str().unwrap(), "--resume"], tmp.path());
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r.stderr).contains("checksum"), "{}", text(&r.stderr));
}

#[test]
fn resume_after_an_interruption_loses_and_duplicates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let sw = write(tmp.path(), "small.toml", &small_sweep(""));
    let sw = sw.to_str().unwrap();
    let whole = tmp.path().join("whole");
    sweep_ok(&[sw, "--out", whole.to_str().unwrap()], tmp.path());
    let csv = read(&whole.join("sweep.csv"));
    let manifest = read(&whole.join("sweep.manifest.json"));
    assert!(manifest.contains("\"complete\": true"), "{manifest}");

    // What an interrupted run leaves: the manifest (not complete) and a partial table whose
    // last row was torn mid-write.
    let cut = tmp.path().join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    std::fs::write(cut.join("sweep.manifest.json"), manifest.replace("\"complete\": true", "\"complete\": false"))
        .unwrap();
    let lines: Vec<&str> = csv.split_inclusive('\n').collect();
    let kept = 20;
    let torn = &lines[kept + 1][..lines[kept + 1].len() / 2];
    std::fs::write(cut.join("sweep.csv.partial"), format!("{}{torn}", lines[..=kept].concat())).unwrap();
    let (out, err) = sweep_ok(&[sw, "--out", cut.to_str().unwrap(), "--resume"], tmp.path());
    assert_eq!(read(&cut.join("sweep.csv")), csv, "the resumed table differs from the uninterrupted one");
    assert!(err.contains(&format!("simulated {} configurations", 48 - kept)), "{err}");
    assert!(err.contains(&format!("{kept} were already done")), "{err}");
    assert!(!cut.join("sweep.csv.partial").exists());
    assert!(out.contains("Smallest GPU count that fits"), "{out}");
    assert_eq!(read(&cut.join("sweep.json")), read(&whole.join("sweep.json")));

    // Resuming a complete sweep simulates nothing and gives the same answer.
    let (out2, err2) = sweep_ok(&[sw, "--out", cut.to_str().unwrap(), "--resume"], tmp.path());
    assert_eq!(out2, out);
    assert!(!err2.contains("simulated"), "{err2}");

    // A folder holding another sweep is not resumed into.
    let other = write(tmp.path(), "other.toml", &small_sweep("").replace("[1, 2, 4, 8]", "[1, 2]"));
    let r = stepsim(&["sweep", other.to_str().unwrap(), "--out", cut.to_str().unwrap(), "--resume"], tmp.path());
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    assert!(text(&r.stderr).contains("another sweep"), "{}", text(&r.stderr));
    assert_eq!(read(&cut.join("sweep.csv")), csv, "a refused resume must not touch the results");
}

// ---------------------------------------------------------------- the lean simulation

#[test]
fn the_lean_simulation_agrees_with_simulate() {
    let dir = root().join("scenarios");
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let s = Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
        let full = stepsim::simulate(&s).unwrap();
        let want = Outcome::from_report(&full.report, &s);
        assert_eq!(summary::simulate(&s).unwrap(), want, "{}", p.display());
        assert_eq!(summary::simulate_whole(&s).unwrap(), want, "{}", p.display());
        checked += 1;
    }
    assert!(checked >= 6);
}

/// Scenarios whose schedules cover the scheduler's branches: the shipped ones plus
/// checkpointing with gradient accumulation, selective recompute and DeepSpeed.
fn schedule_cases() -> Vec<Scenario> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root().join("scenarios")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            out.push(Scenario::load(&p).unwrap_or_else(|e| panic!("{e}")));
        }
    }
    out.extend(common::schedule_variants(&root()));
    out
}

#[test]
fn lean_schedules_and_their_prefixes_are_the_same_program() {
    use stepsim::schedule::{build, build_lean, build_lean_prefix, build_lean_staged, Stage, TaskKind};
    for s in schedule_cases() {
        let dag = stepsim::model::build(&s.model, &s.workload);
        let plan = stepsim::plan::Plan::new(
            &dag,
            s.parallel.clone(),
            s.training.clone(),
            u64::from(s.cluster.gpus),
            u64::from(s.cluster.gpus_per_node),
        );
        let full = build(&dag, &plan, &s.cluster);
        let lean = build_lean(&dag, &plan, &s.cluster);
        let (f, l) = (&full.program, &lean.program);
        // A task with its dependencies, allocations and frees.
        let task = |p: &stepsim::engine::Program, t: usize| {
            format!("{:?} {:?} {:?} {:?}", p.tasks[t], p.deps.of(t), p.alloc.of(t), p.free.of(t))
        };
        assert_eq!(f.tasks.len(), l.tasks.len(), "{}", s.name);
        for t in 0..f.tasks.len() {
            assert_eq!(task(f, t), task(l, t), "{}", s.name);
        }
        assert_eq!(f.buffers.len(), l.buffers.len());
        for (a, b) in f.buffers.iter().zip(l.buffers.iter()) {
            assert_eq!((a.bytes, a.category), (b.bytes, b.category), "{}", s.name);
        }
        for (a, b) in full.labels.iter().zip(lean.labels.iter()) {
            assert!(b.what.is_empty());
            assert_eq!(
                (a.step, a.phase, a.micro_batch, a.kind, a.unit, a.region),
                (b.step, b.phase, b.micro_batch, b.kind, b.unit, b.region),
                "{}",
                s.name
            );
        }
        assert_eq!(full.model_flops_per_step, lean.model_flops_per_step);
        assert_eq!(full.hardware_flops_per_step, lean.hardware_flops_per_step);

        // Every task of step k + 1 waits for step k's zero_grad (a dependency path, or a
        // stream predecessor that has one), which is what makes a prefix run exactly as far
        // as it goes.
        let label = |t: usize| &lean.labels[l.tasks[t].label as usize];
        let mut waits = vec![None::<u32>; l.tasks.len()]; // the latest step whose end it waits for
        let mut last_on_stream: Vec<Option<usize>> = vec![None; l.streams.len()];
        for (t, task) in l.tasks.iter().enumerate() {
            let mut w = last_on_stream[task.stream as usize].and_then(|p| waits[p]);
            for &d in l.deps.of(t) {
                assert!((d as usize) < t, "{}: task {t} depends on a later task", s.name);
                let d = d as usize;
                let via = if label(d).kind == TaskKind::ZeroGrad { Some(label(d).step) } else { waits[d] };
                w = w.max(via);
            }
            let step = label(t).step;
            if step >= 2 {
                assert!(w >= Some(step - 1), "{}: task {t} of step {step} does not wait for step {}", s.name, step - 1);
            }
            waits[t] = w;
            last_on_stream[task.stream as usize] = Some(t);
        }
        for k in 0..s.training.steps {
            let p = build_lean_prefix(&dag, &plan, &s.cluster, k);
            let n = p.program.tasks.len();
            assert!(n < l.tasks.len());
            assert!(lean.labels[l.tasks[n].label as usize].step == k + 1, "{}: prefix {k} ends mid-step", s.name);
            for t in 0..n {
                assert_eq!(task(&p.program, t), task(l, t), "{}: prefix {k}", s.name);
            }
        }
        if plan.pipeline() > 1 {
            continue;
        }

        // One builder handing out its prefixes as it grows: each is the program a builder
        // stopped there builds (a step prefix: `build_lean_prefix`'s, labels and FLOPs too),
        // and the whole program it carries on to is `build_lean`'s.
        let mut stages = vec![Stage::Steps(0), Stage::FirstForward];
        stages.extend((1..s.training.steps).map(Stage::Steps));
        let mut seen = Vec::new();
        let staged = build_lean_staged(&dag, &plan, &s.cluster, &stages, |p| {
            let n = p.schedule.program.tasks.len();
            for t in 0..n {
                assert_eq!(task(&p.schedule.program, t), task(l, t), "{}: {:?}", s.name, p.stage);
            }
            if let Stage::Steps(k) = p.stage {
                let q = build_lean_prefix(&dag, &plan, &s.cluster, k);
                assert_eq!(n, q.program.tasks.len(), "{}: {:?}", s.name, p.stage);
                assert_eq!(p.schedule.program.free, q.program.free, "{}: {:?}", s.name, p.stage);
                // A prefix's streams keep the links they have in the whole program (where a
                // collective holds thread blocks), so that its run can be carried on over it.
                assert_eq!(p.schedule.program.stream_links, l.stream_links, "{}: {:?}", s.name, p.stage);
                assert_eq!(p.schedule.labels.len(), q.labels.len());
                assert_eq!(p.schedule.hardware_flops_per_step, q.hardware_flops_per_step, "{}", s.name);
                assert_eq!(p.schedule.model_flops_per_step, q.model_flops_per_step, "{}", s.name);
                assert!(p.gate.is_none());
            }
            seen.push((p.stage, n, p.gate));
            None::<()>
        });
        let stepsim::schedule::Staged::Whole(whole) = staged else { panic!("{}: a probe that never answers", s.name) };
        assert_eq!(whole.program.tasks.len(), l.tasks.len(), "{}", s.name);
        assert_eq!(whole.program.free, l.free, "{}", s.name);
        assert_eq!(whole.program.deps, l.deps, "{}", s.name);
        assert_eq!(whole.program.alloc, l.alloc, "{}", s.name);
        assert_eq!(whole.program.stream_links, l.stream_links, "{}", s.name);
        assert_eq!(whole.hardware_flops_per_step, lean.hardware_flops_per_step, "{}", s.name);
        let offered: Vec<Stage> = seen.iter().map(|x| x.0).collect();
        let combined = plan.parallel.megatron.overlap_moe_expert_parallel_comm && plan.training.grad_accum > 1;
        let mut want = vec![Stage::Steps(0)];
        if s.training.steps >= 1 && !combined {
            want.push(Stage::FirstForward);
        }
        want.extend((1..s.training.steps).map(Stage::Steps));
        assert_eq!(offered, want, "{}", s.name);

        // The first forward's prefix ends where step 1's backward begins, and every later task
        // waits for its loss (a dependency path, or a stream predecessor that has one).
        if let Some(&(_, n, Some(loss))) = seen.iter().find(|x| x.0 == Stage::FirstForward) {
            assert!(n < l.tasks.len() && (loss as usize) < n, "{}", s.name);
            assert_eq!(label(n).phase, stepsim::schedule::Phase::Backward, "{}: the prefix ends mid-forward", s.name);
            let mut after = vec![false; l.tasks.len()];
            after[loss as usize] = true;
            let mut last_on_stream: Vec<Option<usize>> = vec![None; l.streams.len()];
            for (t, task) in l.tasks.iter().enumerate() {
                let mut w = after[t] || last_on_stream[task.stream as usize].is_some_and(|p| after[p]);
                w |= l.deps.of(t).iter().any(|&d| after[d as usize]);
                after[t] = w;
                if t >= n {
                    assert!(w, "{}: task {t} ({:?}) may start before the first forward's loss ends", s.name, label(t));
                }
                last_on_stream[task.stream as usize] = Some(t);
            }
        }

        // An answer ends the build there.
        let mut probes = 0;
        let first = build_lean_staged(&dag, &plan, &s.cluster, &stages, |p| {
            probes += 1;
            (p.stage == Stage::FirstForward).then_some(p.schedule.program.tasks.len())
        });
        match (first, combined) {
            (stepsim::schedule::Staged::Answered(n), false) => {
                assert_eq!(Some(n), seen.iter().find(|x| x.0 == Stage::FirstForward).map(|x| x.1));
                assert_eq!(probes, 2, "{}", s.name);
            }
            (stepsim::schedule::Staged::Whole(_), true) => {}
            _ => panic!("{}: the first forward's answer was not the result", s.name),
        }
    }
}

#[test]
fn trying_program_prefixes_first_changes_no_outcome() {
    use stepsim::schedule::Stage;
    // Every fourth configuration of the shipped sweep (init, forward, backward, optimizer and
    // step-2 OOMs, and fits), plus a DeepSpeed variant whose optimizer state exists at init.
    let spec = SweepSpec::load(&root().join("scenarios/sweeps/100b-capacity.toml")).unwrap();
    let mut phases = std::collections::BTreeSet::new();
    for i in (0..spec.size).step_by(4) {
        let s = spec.point(i).unwrap().unwrap();
        let whole = summary::simulate_whole(&s).unwrap();
        assert_eq!(summary::simulate(&s).unwrap(), whole, "configuration {i}: {}", spec.describe(i));
        // Every prefix tried, whatever the thread's statistics would choose.
        let dag = stepsim::model::build(&s.model, &s.workload);
        let all = [Stage::Steps(0), Stage::FirstForward, Stage::Steps(1)];
        let every = Outcome::from_report(&stepsim::simulate_lean(&s, &dag, &all).unwrap(), &s);
        assert_eq!(every, whole, "configuration {i} with every prefix: {}", spec.describe(i));
        // The figures taken from the run itself, without its report, at every prefix too.
        let lean = stepsim::simulate_lean_with(&s, &dag, &all, stepsim::job::run::Record::Headline, |job, run| {
            Outcome::of_run(&s, job, run)
        });
        assert_eq!(lean.unwrap(), whole, "configuration {i}, figures of the run: {}", spec.describe(i));
        phases.insert(whole.oom.map(|o| (o.step, o.phase.name())));
    }
    assert!(phases.len() >= 4, "the sample covers too few outcomes: {phases:?}");
    assert!(phases.contains(&Some((1, "forward"))), "no first-forward OOM in the sample: {phases:?}");
}

// ---------------------------------------------------------------- the shipped sweep

#[test]
fn the_shipped_capacity_sweep_names_the_smallest_gpu_count_that_fits() {
    let tmp = tempfile::tempdir().unwrap();
    let sw = root().join("scenarios/sweeps/100b-capacity.toml");
    let out = tmp.path().join("out");
    let (stdout, _) = sweep_ok(&[sw.to_str().unwrap(), "--out", out.to_str().unwrap()], tmp.path());
    let answer: Value = serde_json::from_str(&read(&out.join("sweep.json"))).unwrap();
    let spec = SweepSpec::load(&sw).unwrap();
    let csv = read(&out.join("sweep.csv"));
    let rows: Vec<_> = csv.lines().skip(1).map(|l| parse_row(l, spec.axes.len()).unwrap()).collect();
    assert_eq!(rows.len() as u64, spec.size);
    let smallest = rows.iter().filter(|r| r.fits).map(|r| r.gpus).min().expect("something fits");
    assert_eq!(answer["smallest_gpus_that_fit"].as_u64(), Some(smallest));
    assert!(stdout.contains(&format!("Smallest GPU count that fits: {smallest}\n")), "{stdout}");
    assert!(
        stdout.contains("Best configuration: #") && stdout.contains("Fastest configuration that fits: #"),
        "{stdout}"
    );
    assert_eq!(answer["best"]["gpus"].as_u64(), Some(smallest), "the objective minimises GPUs first");
    // 100B at 16 B/param: DDP and ZeRO-1 replicate the 202 GB of BF16 weights: never fits.
    for r in &rows {
        let sharding = &spec.axes[3].labels[spec.value_indices(r.index)[3]];
        if sharding == "none" || sharding == "zero1" {
            assert!(!r.fits && r.oom_phase == "init", "configuration {} ({sharding}) should OOM at init", r.index);
        }
    }
    assert!(stdout.contains("parallel.sharding = \"none\": 80 configurations; OOM in init"), "{stdout}");
    // Frontier: one point per GPU count that fits, ascending.
    let frontier = answer["frontier"].as_array().unwrap();
    assert_eq!(frontier[0]["gpus"].as_u64(), Some(smallest));
    assert!(frontier.windows(2).all(|w| w[0]["gpus"].as_u64() < w[1]["gpus"].as_u64()));
    let png = std::fs::read(out.join("heatmap.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    // The picture: sized to its 4 rows, a colour scale from 0, and in each cell that fits the
    // winner's checkpointing (its sharding, full_shard everywhere, is said once).
    let mut agg = Aggregator::new(&spec);
    rows.iter().for_each(|r| agg.add(r));
    let a = agg.finish();
    let plan = heatmap::plan(&a);
    let dim = |o: usize| u32::from_be_bytes(png[o..o + 4].try_into().unwrap()) as i32;
    assert_eq!((dim(16), dim(20)), (plan.width, plan.height));
    assert!(plan.height <= plan.top + (4 * plan.cell_h).max(plan.legend_h) + 80, "{plan:?}");
    assert_eq!(plan.scale.lo, 0.0);
    assert!(plan.scale.ticks.len() >= 3);
    assert_eq!(plan.winners.same, [("parallel.sharding".to_string(), "full_shard".to_string())]);
    for (i, c) in a.heatmap.cells.iter().enumerate() {
        if !c.winner.is_empty() {
            assert_eq!(plan.winners.lines[i].as_deref(), Some(c.winner[2].as_str()), "cell {i}");
        }
    }
}

#[test]
fn dp_in_a_filter_is_gpus_over_tensor_times_pipeline() {
    let body = format!(
        "base = {:?}\nfilter = [\"dp = 2\"]\n[axes]\nhardware.gpus = [2, 4, 8]\nparallel.pipeline = [1, 2]\n",
        scenario_path("gpt-1.3b-1gpu")
    );
    let spec = spec_of(&body);
    let kept: Vec<String> =
        (0..spec.size).filter(|&i| spec.point(i).unwrap().is_some()).map(|i| spec.describe(i)).collect();
    assert_eq!(kept, ["hardware.gpus = 2, parallel.pipeline = 1", "hardware.gpus = 4, parallel.pipeline = 2"]);
}

#[test]
fn dp_prunes_combinations_that_would_not_validate_by_the_same_rule() {
    // 4 GPUs in nodes of 3 does not validate; with pipeline 2 its dp is 2, so `dp = 4`
    // leaves it out before validation instead of reporting it.
    let body = format!(
        "base = {:?}\nfilter = [\"dp = 4\"]\n[axes]\nhardware.gpus = [4]\nhardware.gpus_per_node = [3]\nparallel.pipeline = [2]\n",
        scenario_path("gpt-1.3b-1gpu")
    );
    let spec = spec_of(&body);
    assert!(spec.point(0).unwrap().is_none(), "{}", spec.describe(0));
}

/// Issue 22: limits a sweep states and checks before any work: a filter nested deeper than
/// the parser's bound, a product of axes too large to enumerate (refused at once, not after
/// enumerating it), and `--jobs` beyond the machine.
#[test]
fn sweep_limits_are_checked_before_the_work() {
    let base = scenario_path("gpt-1.3b-1gpu");
    let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
    let e = spec_err(&format!("base = {base:?}\nfilter = [\"{deep} = 1\"]\n[axes]\nhardware.gpus = [1, 2]\n"));
    assert!(e.contains("filter[0]") && e.contains("nested deeper than 64"), "{e}");
    // 10,000 nested parentheses once overflowed the stack.
    let deeper = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
    let long = vec!["1"; 2000].join(" + ");
    for text in [deeper, long] {
        let e = spec_err(&format!("base = {base:?}\nfilter = [\"{text} = 1\"]\n[axes]\nhardware.gpus = [1, 2]\n"));
        assert!(e.contains("a constraint has at most 1000") && e.len() < 400, "{e}");
    }

    let tmp = tempfile::tempdir().unwrap();
    // 1000^3 = 10^9 configurations: refused in well under a second.
    let values = (1..=1000).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let huge = write(
        tmp.path(),
        "huge.toml",
        &format!("base = {base:?}\n[axes]\ntraining.steps = [{values}]\ntraining.seed_x = [{values}]\nhardware.gpus = [{values}]\n")
            .replace("training.seed_x", "training.grad_accum"),
    );
    let t = std::time::Instant::now();
    let out = common::stepsim(
        &["sweep", huge.to_str().unwrap(), "--out", tmp.path().join("o").to_str().unwrap()],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", common::text(&out.stderr));
    let err = common::text(&out.stderr);
    assert!(err.contains("1000000000 configurations") && err.contains("--shard"), "{err}");
    assert!(t.elapsed().as_secs_f64() < 5.0, "refused after {:?}", t.elapsed());
    let good = write(tmp.path(), "good.toml", &small_sweep(""));
    let out = common::stepsim(&["sweep", good.to_str().unwrap(), "--jobs", "100000"], tmp.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(common::text(&out.stderr).contains("--jobs: at most"), "{}", common::text(&out.stderr));
}

/// The shipped MoE sweep (Mixtral 8x7B at micro-batch 2 on 32 and 64 H100s): the filter keeps
/// the configurations of the same global batch, every expert-parallel degree but 1 fits with
/// some recomputation, and one GPU per expert-parallel degree 1 never does: without expert
/// parallelism every GPU holds all eight experts' state and routed activations.
#[test]
fn the_shipped_moe_sweep_varies_the_moe_knobs() {
    let tmp = tempfile::tempdir().unwrap();
    let sw = root().join("scenarios/sweeps/mixtral-moe-knobs.toml");
    let out = tmp.path().join("out");
    let (stdout, _) = sweep_ok(&[sw.to_str().unwrap(), "--out", out.to_str().unwrap()], tmp.path());
    assert!(stdout.contains("48 configurations (48 of 96 kept by the filter)"), "{stdout}");
    let spec = SweepSpec::load(&sw).unwrap();
    let csv = read(&out.join("sweep.csv"));
    let rows: Vec<_> = csv.lines().skip(1).map(|l| parse_row(l, spec.axes.len()).unwrap()).collect();
    let expert = |r: &stepsim::sweep::output::Row| spec.axes[3].labels[spec.value_indices(r.index)[3]].clone();
    for ep in ["2", "4", "8"] {
        assert!(rows.iter().any(|r| r.fits && expert(r) == ep), "expert {ep}: nothing fits\n{stdout}");
    }
    assert!(rows.iter().all(|r| expert(r) != "1" || !r.fits), "{stdout}");
    assert!(stdout.contains("parallel.expert = 1: 12 configurations; OOM in forward (step 1) 12"), "{stdout}");
}
