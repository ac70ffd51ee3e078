//! Scenario files as people write them (issue 19): sizes with units, and `extends` to share a
//! base. A scenario written either way is the same scenario as the one spelled out in full;
//! a chain that cannot be read is an error naming the file and `extends`.

mod common;
use common::{stepsim, text};
use std::path::Path;

use stepsim::scenario::Scenario;

const BASE: &str = r#"description = "1.3B GPT on 1 x A100 80GB"
name = "the-base"

[model]
family = "gpt"
n_layers = 24
hidden = 2048
n_heads = 16
vocab = 50257
max_seq_len = 2048

[hardware]
gpu = "a100-80gb"
gpus = 1

[training]
micro_batch = 4
seq_len = 2048
grad_accum = 2
activation_checkpointing = "none"
"#;

fn write(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn sizes_with_units_are_the_same_bytes() {
    let d = tempfile::tempdir().unwrap();
    let with = |v: &str| {
        let body = BASE.replace("gpus = 1\n", &format!("gpus = 1\nmemory_capacity = {v}\ncuda_context = \"512MiB\"\n"));
        Scenario::load(&write(d.path(), "s.toml", &body)).unwrap()
    };
    let bytes = with("25769803776");
    for v in ["\"24GiB\"", "\"24 GiB\"", "\"25769803776\"", "\"25.769803776GB\"", "25769803776.0"] {
        let s = with(v);
        assert_eq!(s.cluster.memory_bytes, bytes.cluster.memory_bytes, "{v}");
        assert_eq!(s.allocator_capacity(), bytes.allocator_capacity(), "{v}");
    }
    assert_eq!(with("\"24e9\"").cluster.memory_bytes, 24_000_000_000);
    assert_eq!(bytes.cluster.memory_bytes, 24 << 30);
}

#[test]
fn a_scenario_that_extends_a_base_is_the_base_with_its_changes() {
    let d = tempfile::tempdir().unwrap();
    let base = write(d.path(), "bases/base.toml", BASE);
    let child = write(
        d.path(),
        "runs/mb1.toml",
        "extends = \"../bases/base.toml\"\n[training]\nmicro_batch = 1\ngrad_accum = 8\n",
    );
    let (b, c) = (Scenario::load(&base).unwrap(), Scenario::load(&child).unwrap());
    // Spelled out in full, the child is the base with two fields changed.
    let full = write(
        d.path(),
        "runs/full.toml",
        &BASE.replace("micro_batch = 4", "micro_batch = 1").replace("grad_accum = 2", "grad_accum = 8"),
    );
    let f = Scenario::load(&full).unwrap();
    assert_eq!(c.workload.micro_batch, 1);
    assert_eq!(c.training.grad_accum, 8);
    assert_eq!(c.workload.seq_len, b.workload.seq_len);
    assert_eq!(c.description, b.description, "description is inherited");
    assert_eq!(b.name, "the-base");
    assert_eq!(c.name, "mb1", "name is not: the child is named for its own file");
    let (rc, rf) = (stepsim::simulate(&c).unwrap(), stepsim::simulate(&f).unwrap());
    let peak = |r: &stepsim::Simulation| r.report.peak.as_ref().map(|p| p.allocated.bytes);
    assert_eq!(peak(&rc), peak(&rf));
    assert!(peak(&rc).is_some());
}

#[test]
fn a_bases_config_json_stays_relative_to_the_base() {
    let d = tempfile::tempdir().unwrap();
    let zoo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/llama-3.1-8b.json")).unwrap();
    write(d.path(), "bases/cfg/config.json", &zoo);
    write(
        d.path(),
        "bases/base.toml",
        "[model]\nhf_config = \"cfg/config.json\"\n[hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
         [parallel]\nsharding = \"full_shard\"\n[training]\nmicro_batch = 1\nseq_len = 2048\n",
    );
    let mid = write(d.path(), "mid/mid.toml", "extends = \"../bases/base.toml\"\n[training]\nseq_len = 4096\n");
    let child = write(d.path(), "runs/a/child.toml", "extends = \"../../mid/mid.toml\"\n[training]\nmicro_batch = 2\n");
    for p in [&mid, &child] {
        let s = Scenario::load(p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.model.param_count(), 8_030_261_248, "{}", p.display());
        assert_eq!(s.workload.seq_len, 4096);
    }
}

#[test]
fn chains_that_cannot_be_read_name_the_file_and_extends() {
    let d = tempfile::tempdir().unwrap();
    let err = |p: &Path| Scenario::load(p).unwrap_err();
    // A cycle.
    let a = write(d.path(), "a.toml", &format!("extends = \"b.toml\"\n{}", &BASE[BASE.find("[model]").unwrap()..]));
    write(d.path(), "b.toml", "extends = \"a.toml\"\n");
    let e = err(&a);
    assert_eq!(e.field, "extends");
    assert!(e.message.contains("comes back to a file already in it") && e.message.contains("b.toml"), "{e}");
    // A base that is not there.
    let m = write(d.path(), "m.toml", "extends = \"nowhere.toml\"\n");
    let e = err(&m);
    assert!(e.file.ends_with("m.toml") && e.field == "extends" && e.message.contains("nowhere.toml"), "{e}");
    // Not a string.
    let n = write(d.path(), "n.toml", "extends = 3\n");
    let e = err(&n);
    assert!(e.field == "extends" && e.message.contains("got integer"), "{e}");
    // Too deep: 20 files each extending the next.
    write(d.path(), "deep/f20.toml", BASE);
    for k in (0..20).rev() {
        write(d.path(), &format!("deep/f{k}.toml"), &format!("extends = \"f{}.toml\"\n", k + 1));
    }
    let e = err(&d.path().join("deep/f0.toml"));
    assert!(e.field == "extends" && e.message.contains("at most 16 files"), "{e}");
    // A syntax error in the base names the base and its line.
    write(d.path(), "broken.toml", "[model\n");
    let c = write(d.path(), "c.toml", "extends = \"broken.toml\"\n");
    let e = err(&c);
    assert!(e.file.ends_with("broken.toml") && e.message.contains("line 1"), "{e}");
    // A bad value after merging names the loaded file and says it extends a base.
    let v = write(d.path(), "v.toml", "extends = \"bases/base.toml\"\n[training]\nmicro_batch = 0\n");
    write(d.path(), "bases/base.toml", BASE);
    let e = err(&v);
    assert!(e.file.ends_with("v.toml") && e.field == "training.micro_batch", "{e}");
    assert!(e.message.contains("as it extends") && e.message.contains("base.toml"), "{e}");
    // Scenario text given directly cannot extend.
    let e = Scenario::from_toml(Path::new("inline.toml"), &format!("extends = \"x.toml\"\n{BASE}")).unwrap_err();
    assert_eq!(e.field, "extends");
}

#[test]
fn run_and_sweep_take_an_extended_scenario() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "base.toml", BASE);
    write(d.path(), "small.toml", "extends = \"base.toml\"\n[model]\nn_layers = 2\n[training]\nsteps = 1\n");
    let out = stepsim(&["run", "small.toml", "--out", "o"], d.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("scenario small"), "{}", text(&out.stdout));
    write(
        d.path(),
        "sweep.toml",
        "base = \"small.toml\"\n[axes]\ntraining.micro_batch = [1, 2]\nhardware.memory_capacity = [\"40GB\", \"80GiB\"]\n",
    );
    let out = stepsim(&["sweep", "sweep.toml", "--out", "s"], d.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let csv = std::fs::read_to_string(d.path().join("s/sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
}
