//! Every error of a scenario file in one run (issue 19): after the first, each field an error
//! names is left out and the file read again ("knock-out recovery", src/scenario/recovery.rs),
//! so a file with three mistakes takes one run to see them, not three. One error prints as it
//! always has; an error the knock-out itself may have caused is never reported; a syntax error
//! stays one error.

mod common;
use common::{stepsim, text};
use std::path::{Path, PathBuf};

use stepsim::scenario::Scenario;

/// A valid scenario: 1.3B GPT on 8 x A100 80GB.
const BASE: &str = r#"description = "1.3B GPT on 8 x A100 80GB"

[model]
family = "gpt"
n_layers = 24
hidden = 2048
n_heads = 16
vocab = 50257
max_seq_len = 2048

[hardware]
gpu = "a100-80gb"
gpus = 8

[parallel]
sharding = "full_shard"

[training]
micro_batch = 4
seq_len = 2048
grad_accum = 2
"#;

/// BASE with each `(from, to)` line replaced (`from` must be there).
fn edit(edits: &[(&str, &str)]) -> String {
    let mut s = BASE.to_string();
    for (from, to) in edits {
        assert!(s.contains(from), "BASE has no `{from}`");
        s = s.replacen(from, to, 1);
    }
    s
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    p
}

/// Runs `run`, `check` and `explain` on `file`: each must exit 2 with nothing on stdout and
/// nothing written, and all three must print the same stderr, which is returned.
fn rejected(dir: &Path, file: &Path) -> String {
    let f = file.to_str().unwrap();
    let mut seen: Option<String> = None;
    for args in [vec!["run", f, "--out", "out"], vec!["check", f], vec!["explain", f, "--out", "out"]] {
        let o = stepsim(&args, dir);
        let stderr = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(o.stdout.is_empty(), "{args:?}: stdout {}", text(&o.stdout));
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        if let Some(s) = &seen {
            assert_eq!(&stderr, s, "{args:?} and `run` disagree");
        }
        seen = Some(stderr);
    }
    assert!(!dir.join("out").exists() && !dir.join("output").exists(), "outputs were written");
    seen.unwrap()
}

#[test]
fn three_independent_mistakes_are_reported_in_one_run() {
    let d = tempfile::tempdir().unwrap();
    // A misspelled key, a bad value, a cross-field value that does not fit.
    let body = edit(&[
        ("grad_accum = 2", "grad_accum = 2\noptimiser = \"adamw\"\nsteps = 0"),
        ("sharding = \"full_shard\"", "sharding = \"full_shard\"\ntensor = 3"),
    ]);
    let file = write(d.path(), "three.toml", &body);
    let stderr = rejected(d.path(), &file);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    // The first error as it always printed: serde's, with its line.
    let first =
        format!("error: {}: field `training.optimiser`: unknown field `optimiser`, expected one of", file.display());
    assert!(lines[0].starts_with(&first) && lines[0].ends_with("(line 23)"), "{stderr}");
    assert_eq!(
        lines[1],
        "2 more, each found by reading the file without the fields above it (fixing one can change the next):"
    );
    assert_eq!(
        lines[2],
        "  field `parallel.tensor`: tensor (3) x pipeline (1) = 3 must divide hardware.gpus (8); the data-parallel degree is gpus / (tensor x pipeline)"
    );
    assert_eq!(lines[3], "  field `training.steps`: must be a positive integer, got 0");

    // The library's error holds them too, and the same every time.
    let e = Scenario::load(&file).unwrap_err();
    assert_eq!((e.field.as_str(), e.also.len()), ("training.optimiser", 2));
    assert_eq!(e.also[0].0, "parallel.tensor");
    assert_eq!(e.also[1].0, "training.steps");
    assert_eq!(Scenario::load(&file).unwrap_err(), e);
    assert_eq!(format!("error: {e}\n"), stderr);
}

#[test]
fn further_type_errors_cite_their_line() {
    let body =
        edit(&[("grad_accum = 2", "grad_accum = 2\nsteps = \"two\""), ("n_layers = 24", "n_layers = 24\nlayers = 3")]);
    let e = Scenario::from_toml(Path::new("t.toml"), &body).unwrap_err();
    assert_eq!(e.field, "model.layers");
    assert!(e.message.ends_with("(line 6)"), "{e}");
    assert_eq!(
        e.also,
        vec![("training.steps".to_string(), "invalid type: string \"two\", expected i64 (line 23)".to_string())]
    );
}

#[test]
fn one_mistake_prints_exactly_as_before() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "one.toml", &edit(&[("grad_accum = 2", "grad_accum = 2\nsteps = 0")]));
    let stderr = rejected(d.path(), &file);
    assert_eq!(
        stderr,
        format!("error: {}: field `training.steps`: must be a positive integer, got 0\n", file.display())
    );
    assert!(Scenario::load(&file).unwrap_err().also.is_empty());
}

/// Leaving a field out can itself be an error ("is required", a missing field, a check that
/// names it): such errors are not the user's and are never listed; checking stops there.
#[test]
fn errors_the_knock_out_caused_are_not_reported() {
    let one_line = |body: &str, field: &str| {
        let e = Scenario::from_toml(Path::new("k.toml"), body).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.also.is_empty(), "{e}");
        let shown = e.to_string();
        assert!(!shown.contains("required") && !shown.contains("missing"), "{shown}");
    };
    // A required field with a bad value: leaving it out makes it "required".
    one_line(&edit(&[("hidden = 2048", "hidden = 0")]), "model.hidden");
    one_line(&edit(&[("micro_batch = 4", "micro_batch = 0")]), "training.micro_batch");
    // A misspelled required key: the key it meant is then missing (one mistake).
    one_line(&edit(&[("n_layers = 24", "n_layer = 24")]), "model.n_layer");
    one_line(&edit(&[("gpus = 8", "gpu_count = 8")]), "hardware.gpu_count");
    // A check that names the field left out (framework = "megatron" for Megatron's flags).
    one_line(
        &edit(&[
            ("sharding = \"full_shard\"", "framework = \"megatronn\""),
            ("grad_accum = 2", "grad_accum = 2\nactivation_checkpointing = \"full\"\nrecompute_method = \"block\""),
        ]),
        "parallel.framework",
    );
    // A required field with a bad value before another mistake: the other waits for the next
    // run (leaving out `hidden` leaves nothing sound to check it against).
    one_line(
        &edit(&[("hidden = 2048", "hidden = 0"), ("grad_accum = 2", "grad_accum = 2\nsteps = 0")]),
        "model.hidden",
    );
}

#[test]
fn a_syntax_error_is_one_error() {
    let d = tempfile::tempdir().unwrap();
    let body = edit(&[("[hardware]", "[hardware"), ("grad_accum = 2", "grad_accum = 2\nsteps = 0\noptimiser = 1")]);
    let file = write(d.path(), "syntax.toml", &body);
    let stderr = rejected(d.path(), &file);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("(line 11)"), "{stderr}");
}

#[test]
fn a_chain_of_bases_is_checked_as_merged() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "bases/base.toml", &edit(&[("gpus = 8", "gpus = 8\nnic_gbps = -1.0")]));
    write(d.path(), "mid.toml", "extends = \"bases/base.toml\"\n[training]\nsteps = 0\n");
    write(d.path(), "child.toml", "extends = \"mid.toml\"\n[parallel]\ntensor = 3\n[training]\noptimiser = \"sgd\"\n");
    // Relative, as a user types it: the chain is named as the files name each other.
    let stderr = rejected(d.path(), Path::new("child.toml"));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 5, "{stderr}");
    // The bases are named once, on the first error; the merged table has no lines to cite.
    assert!(lines[0].starts_with("error: child.toml: field `training.optimiser`: unknown field"), "{stderr}");
    assert!(lines[0].ends_with("(in the scenario as it extends mid.toml, which extends bases/base.toml)"), "{stderr}");
    assert!(lines[1].starts_with("3 more, each found"), "{stderr}");
    assert_eq!(lines[2], "  field `hardware.nic_gbps`: must be a positive number of Gb/s, got -1");
    assert!(lines[3].starts_with("  field `parallel.tensor`: tensor (3)"), "{stderr}");
    assert_eq!(lines[4], "  field `training.steps`: must be a positive integer, got 0");

    // One error in a chain prints as before; a syntax error in a base is that base's, alone.
    let one = write(d.path(), "one.toml", "extends = \"bases/ok.toml\"\n[training]\nsteps = 0\n");
    write(d.path(), "bases/ok.toml", BASE);
    let e = Scenario::load(&one).unwrap_err();
    assert!(e.also.is_empty(), "{e}");
    let base = d.path().join("bases/ok.toml");
    assert_eq!(
        e.message,
        format!("must be a positive integer, got 0 (in the scenario as it extends {})", base.display())
    );
    write(d.path(), "bases/broken.toml", "[model\n");
    let c = write(d.path(), "c.toml", "extends = \"bases/broken.toml\"\n[training]\nsteps = 0\n");
    let e = Scenario::load(&c).unwrap_err();
    assert!(e.file.ends_with("broken.toml") && e.also.is_empty(), "{e}");
}

#[test]
fn a_sweep_s_base_file_reports_every_error() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "base.toml", &edit(&[("grad_accum = 2", "grad_accum = 2\nsteps = 0\noptimiser = \"adamw\"")]));
    write(d.path(), "sweep.toml", "base = \"base.toml\"\n[axes]\ntraining.micro_batch = [1, 2]\n");
    let o = stepsim(&["sweep", "sweep.toml", "--out", "s"], d.path());
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("field `training.optimiser`") && stderr.contains("  field `training.steps`"), "{stderr}");
    assert!(!d.path().join("s").exists());
}

#[test]
fn at_most_twenty_errors_are_listed() {
    let extra: String = (0..30).map(|i| format!("extra_{i:02} = 1\n")).collect();
    let e = Scenario::from_toml(Path::new("many.toml"), &format!("{extra}{BASE}")).unwrap_err();
    assert_eq!(e.also.len(), 19, "{e}");
    assert!(
        e.to_string().lines().nth(1).is_some_and(|l| l.starts_with("19 more (stopping at 20 in all), each found")),
        "{e}"
    );
}
