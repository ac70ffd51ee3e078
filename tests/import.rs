//! `stepsim import deepspeed` (issue 19): a ds_config.json becomes a scenario that validates
//! and runs, with what was mapped, assumed, not expressed and ignored listed in its header;
//! a config that cannot be imported exits 2 naming the file and the key, and writes nothing.

mod common;
use common::{stepsim, text};
use std::path::Path;

use stepsim::import::deepspeed::{import, DeepspeedArgs};
use stepsim::import::ModelArg;
use stepsim::scenario::Scenario;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deepspeed").join(name).display().to_string()
}

fn args(gpus: u64) -> DeepspeedArgs {
    DeepspeedArgs {
        model: ModelArg::Zoo("llama-3.1-8b".into()),
        gpu: "h100-sxm".into(),
        gpus,
        gpus_per_node: None,
        seq_len: 2048,
        micro_batch: None,
        grad_accum: None,
        checkpointing: "none".into(),
        dtype: None,
    }
}

fn scenario(config: &str, a: &DeepspeedArgs) -> Scenario {
    let im = import("ds.json", config, a).unwrap_or_else(|e| panic!("{e}"));
    Scenario::from_toml(Path::new("imported.toml"), &im.render("deepspeed")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn transformers_zero3_offload_config_imports_and_runs() {
    let d = tempfile::tempdir().unwrap();
    let out = stepsim(
        &[
            "import",
            "deepspeed",
            &fixture("hf_ds_config_zero3.json"),
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "8",
            "--micro-batch",
            "1",
            "--out",
            "s.toml",
        ],
        d.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("not expressed: zero_optimization.stage3_max_live_parameters"), "{stdout}");
    let s = Scenario::load(&d.path().join("s.toml")).unwrap();
    let file = std::fs::read_to_string(d.path().join("s.toml")).unwrap();
    for want in [
        "sharding = \"zero3\"",
        "framework = \"deepspeed\"",
        "optimizer = \"cpu\"",
        "parameters = \"cpu\"",
        "param_dtype = \"fp16\"",
        "# Read and ignored",
        "scheduler (a learning-rate schedule)",
    ] {
        assert!(file.contains(want), "{want} in\n{file}");
    }
    assert_eq!(s.model.param_count(), 8_030_261_248);
    let run = stepsim(&["run", "s.toml", "--out", "o"], d.path());
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert!(text(&run.stdout).contains("Offload"), "{}", text(&run.stdout));
}

#[test]
fn auto_values_need_the_trainers_arguments() {
    let d = tempfile::tempdir().unwrap();
    let base = [
        "import",
        "deepspeed",
        &fixture("hf_ds_config_zero2.json"),
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "a100-80gb",
        "--gpus",
        "16",
    ];
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--out", "s.toml"]);
        stepsim(&a, d.path())
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("hf_ds_config_zero2.json: key `train_micro_batch_size_per_gpu`") && err.contains("--micro-batch"),
        "{err}"
    );
    assert!(!d.path().join("s.toml").exists(), "nothing written");
    let out = run(&["--micro-batch", "2", "--grad-accum", "4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(".enabled`") && text(&out.stderr).contains("--dtype"), "{}", text(&out.stderr));
    let out = run(&["--micro-batch", "2", "--grad-accum", "4", "--dtype", "bf16"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = Scenario::load(&d.path().join("s.toml")).unwrap();
    assert_eq!((s.workload.micro_batch, s.training.grad_accum), (2, 4));
    assert_eq!(s.training.precision.preset, "bf16-mixed-adam");
}

#[test]
fn batch_sizes_follow_deepspeeds_rule() {
    let a = args(8);
    // train_batch_size and the micro-batch give the accumulation steps.
    let s = scenario(r#"{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}"#, &a);
    assert_eq!((s.workload.micro_batch, s.training.grad_accum), (2, 4));
    let s = scenario(r#"{"train_batch_size": 64, "gradient_accumulation_steps": 2}"#, &a);
    assert_eq!((s.workload.micro_batch, s.training.grad_accum), (4, 2));
    // All three must agree.
    let e = import(
        "ds.json",
        r#"{"train_batch_size": 60, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}"#,
        &a,
    )
    .unwrap_err();
    assert_eq!(e.key, "train_batch_size");
    assert!(e.message.contains("x data-parallel size 8"), "{e}");
    let e = import("ds.json", r#"{"train_batch_size": 60, "train_micro_batch_size_per_gpu": 2}"#, &a).unwrap_err();
    assert!(e.message.contains("not a multiple"), "{e}");
    let e = import("ds.json", r#"{"train_micro_batch_size_per_gpu": 0}"#, &a).unwrap_err();
    assert_eq!(e.key, "train_micro_batch_size_per_gpu");
}

#[test]
fn precision_and_the_bf16_optimizer() {
    let a = args(8);
    let bf16 = |stage: u32, extra: &str| {
        scenario(
            &format!(
                r#"{{"train_micro_batch_size_per_gpu": 1, "bf16": {{"enabled": true}}, "zero_optimization": {{"stage": {stage}}}{extra}}}"#
            ),
            &a,
        )
    };
    // ZeRO-1 accumulating in FP32 and ZeRO-0 under bf16 run BF16_Optimizer.
    assert_eq!(
        bf16(1, r#", "data_types": {"grad_accum_dtype": "fp32"}"#).training.precision.preset,
        "bf16-mixed-adam-fp32-grads"
    );
    assert_eq!(bf16(0, "").training.precision.preset, "bf16-mixed-adam-fp32-grads");
    assert_eq!(bf16(1, "").training.precision.preset, "bf16-mixed-adam");
    assert_eq!(bf16(2, "").training.precision.preset, "bf16-mixed-adam");
    let s = scenario(r#"{"train_micro_batch_size_per_gpu": 1}"#, &a);
    assert_eq!(s.training.precision.preset, "fp32");
    let e = import(
        "ds.json",
        r#"{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "fp16": {"enabled": true}}"#,
        &a,
    )
    .unwrap_err();
    assert_eq!(e.key, "fp16.enabled");
    let e = import("ds.json", r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 4}}"#, &a)
        .unwrap_err();
    assert_eq!(e.key, "zero_optimization.stage");
}

#[test]
fn keys_it_cannot_use_are_listed_not_dropped() {
    let im = import(
        "ds.json",
        r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "zero_quantized_weights": true, "mystery": 1}, "pipeline": {}, "steps_per_print": 10, "optimizer": {"type": "Lamb"}}"#,
        &args(8),
    )
    .unwrap();
    let all = im.not_expressed.join("\n");
    for want in
        ["zero_quantized_weights", "zero_optimization.mystery: not read", "pipeline: not read", "optimizer.type Lamb"]
    {
        assert!(all.contains(want), "{want} in\n{all}");
    }
    assert!(im.ignored.iter().any(|i| i.starts_with("steps_per_print")));
    assert!(im.render("deepspeed").contains("# Not expressed"));
}
