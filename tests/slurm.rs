//! examples/slurm/ end to end on one machine: submit.sh queues a 3-task job array and the
//! dependent merge through a stand-in for `sbatch` that runs each job at once, in order, as
//! Slurm would run them (array tasks with SLURM_ARRAY_TASK_ID, the `--export`ed variables, in
//! the `--chdir` folder). The merged sweep.csv and sweep.json equal an unsharded run's.

mod common;
use common::{stepsim, text};
use std::path::Path;
use std::process::Command;

/// A stand-in for `sbatch`: runs the script (each task of an `--array=LO-HI` in turn) with
/// the exported variables, prints a job id for `--parsable`, and fails if a task fails (so
/// the merge, queued `afterok`, is never reached).
const FAKE_SBATCH: &str = r#"#!/bin/bash
set -euo pipefail
array=""; chdir="."; exports=""
while [ $# -gt 1 ]; do
    case "$1" in
        --array=*) array="${1#--array=}" ;;
        --export=*) exports="${1#--export=}" ;;
        --chdir=*) chdir="${1#--chdir=}" ;;
        --parsable | --dependency=*) ;;
        *) echo "fake sbatch: unexpected option $1" >&2; exit 1 ;;
    esac
    shift
done
script="$1"
IFS=',' read -ra kv <<< "$exports"
for x in "${kv[@]}"; do
    if [ "$x" != ALL ]; then export "${x?}"; fi
done
n=$(( $(cat "$FAKE_SBATCH_COUNTER" 2>/dev/null || echo 100) + 1 ))
echo "$n" > "$FAKE_SBATCH_COUNTER"
cd "$chdir"
if [ -n "$array" ]; then
    for i in $(seq "${array%-*}" "${array#*-}"); do
        SLURM_ARRAY_TASK_ID=$i SLURM_CPUS_PER_TASK=1 bash "$script" > "task-$n-$i.log" 2>&1
    done
else
    bash "$script" > "job-$n.log" 2>&1
fi
echo "$n"
"#;

#[test]
fn the_slurm_example_runs_a_sharded_sweep_and_merges_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let sbatch = bin.join("sbatch");
    std::fs::write(&sbatch, FAKE_SBATCH).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sbatch, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let spec = dir.path().join("tiny.toml");
    let base = root.join("scenarios/gpt-1.3b-1gpu.toml");
    std::fs::write(
        &spec,
        format!(
            "name = \"tiny\"\nbase = \"{}\"\n\n[axes]\ntraining.micro_batch = [1, 2, 4]\ntraining.activation_checkpointing = [\"none\", \"full\"]\n",
            base.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("cluster");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let o = Command::new("bash")
        .arg(root.join("examples/slurm/submit.sh"))
        .args([spec.to_str().unwrap(), out.to_str().unwrap(), "3"])
        .env("PATH", path)
        .env("STEPSIM", env!("CARGO_BIN_EXE_stepsim"))
        .env("FAKE_SBATCH_COUNTER", dir.path().join("counter"))
        .output()
        .expect("bash runs submit.sh");
    let logs: String = std::fs::read_dir(&out)
        .map(|d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "log")).collect::<Vec<_>>())
        .unwrap_or_default()
        .iter()
        .map(|e| format!("{}:\n{}\n", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
        .collect();
    assert!(o.status.success(), "submit.sh failed: {}\n{}\n{logs}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).contains("queued array job 101 (3 shards) and merge job 102"), "{}", text(&o.stdout));
    for i in 1..=3 {
        assert!(out.join(format!("shard-{i}-of-3/sweep.csv")).is_file(), "shard {i} finished\n{logs}");
    }

    let direct = dir.path().join("direct");
    let d = stepsim(&["sweep", spec.to_str().unwrap(), "--out", direct.to_str().unwrap()], dir.path());
    assert!(d.status.success(), "{}", text(&d.stderr));
    for f in ["sweep.csv", "sweep.json"] {
        let merged = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("merged {f}: {e}\n{logs}"));
        assert_eq!(merged, std::fs::read(direct.join(f)).unwrap(), "{f}: the merged shards equal one run");
    }
    assert!(out.join("heatmap.png").is_file());
    assert_eq!(text(&std::fs::read(out.join("sweep.csv")).unwrap()).lines().count(), 7, "6 configurations");
}

#[test]
fn submit_refuses_a_bad_shard_count() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new("bash")
        .arg(root.join("examples/slurm/submit.sh"))
        .args(["x.toml", "/tmp/never", "0"])
        .output()
        .expect("bash runs submit.sh");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("N must be"), "{}", text(&o.stderr));
}
