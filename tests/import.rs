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
        version: None,
    }
}

/// The job's DeepSpeed release goes to `[deepspeed] version`; without it the default is
/// listed as an assumption. A release stepsim does not know is refused when the scenario is
/// validated, with the field named.
#[test]
fn the_deepspeed_release_is_taken_from_the_command_line() {
    let config =
        r#"{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}"#;
    let im = import("ds.json", config, &args(8)).unwrap();
    assert!(im.assumed.iter().any(|a| a.starts_with("DeepSpeed 0.16.5")), "{:?}", im.assumed);
    let old = DeepspeedArgs { version: Some("0.6.5".into()), ..args(8) };
    let s = scenario(config, &old);
    assert_eq!(s.parallel.deepspeed.version, (0, 6, 5));
    let bad = DeepspeedArgs { version: Some("1.0".into()), ..args(8) };
    let im = import("ds.json", config, &bad).unwrap();
    let e = Scenario::from_toml(Path::new("imported.toml"), &im.render("deepspeed")).unwrap_err();
    assert_eq!(e.field, "deepspeed.version", "{e}");
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
    assert!(!stdout.contains("not expressed: zero_optimization.stage3"), "{stdout}");
    let s = Scenario::load(&d.path().join("s.toml")).unwrap();
    let file = std::fs::read_to_string(d.path().join("s.toml")).unwrap();
    for want in [
        "sharding = \"zero3\"",
        "framework = \"deepspeed\"",
        "optimizer = \"cpu\"",
        "parameters = \"cpu\"",
        "param_dtype = \"fp16\"",
        "stage3_prefetch_bucket_size = 0\n",
        "stage3_max_live_parameters = 1e9\n",
        "stage3_param_persistence_threshold = 0\n",
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

// ---------------------------------------------------------------- torchtitan

use stepsim::import::torchtitan::{self, TorchtitanArgs};

fn titan(config: &str, gpus: Option<u64>) -> Result<Scenario, String> {
    let a = TorchtitanArgs { model: None, gpu: "h100-sxm".into(), gpus, gpus_per_node: None };
    let im = torchtitan::import("job.toml", config, &a).map_err(|e| e.to_string())?;
    Scenario::from_toml(Path::new("imported.toml"), &im.render("torchtitan")).map_err(|e| e.to_string())
}

fn titan_fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torchtitan").join(name).display().to_string()
}

#[test]
fn torchtitans_own_llama3_configs_import_and_run() {
    let d = tempfile::tempdir().unwrap();
    let run = |cfg: &str, extra: &[&str]| {
        let mut a = vec!["import", "torchtitan", cfg, "--gpu", "a100-80gb", "--out", "s.toml"];
        a.extend_from_slice(extra);
        stepsim(&a, d.path())
    };
    let cfg8 = titan_fixture("llama3_8b.toml");
    let out = run(&cfg8, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("key `parallelism.data_parallel_shard_degree`: -1")
            && text(&out.stderr).contains("--gpus"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.path().join("s.toml").exists());
    let out = run(&cfg8, &["--gpus", "64"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = Scenario::load(&d.path().join("s.toml")).unwrap();
    assert_eq!(s.model.param_count(), 8_030_261_248);
    assert_eq!((s.workload.micro_batch, s.workload.seq_len, s.cluster.gpus), (1, 8192, 64));
    assert_eq!(s.training.precision.preset, "fsdp-bf16-mixed");
    let file = std::fs::read_to_string(d.path().join("s.toml")).unwrap();
    for want in [
        "framework = \"fsdp2\"",
        "sharding = \"full_shard\"",
        "activation_checkpointing = \"selective-op\"",
        "optimizer_impl = \"fused\"",
    ] {
        assert!(file.contains(want), "{want} in\n{file}");
    }
    let r = stepsim(&["run", "s.toml", "--out", "o"], d.path());
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let out = run(&titan_fixture("llama3_70b.toml"), &["--gpus", "64"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = Scenario::load(&d.path().join("s.toml")).unwrap();
    assert_eq!(s.parallel.model_parallel.tensor, 8);
    assert!(s.parallel.model_parallel.sequence_parallel);
}

#[test]
fn torchtitan_degrees_batches_checkpointing_and_float8() {
    let base = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 2\nseq_len = 4096\n";
    // HSDP: replicate x shard, the world from the degrees.
    let s = titan(
        &format!("{base}[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 8\n"),
        None,
    )
    .unwrap();
    assert_eq!(s.cluster.gpus, 16);
    // The degrees and --gpus must agree.
    let e = titan(&format!("{base}[parallelism]\ndata_parallel_shard_degree = 8\n"), Some(16)).unwrap_err();
    assert!(e.contains("multiply to 8 GPUs"), "{e}");
    // global_batch_size gives the accumulation.
    let s =
        titan(&format!("{base}global_batch_size = 64\n[parallelism]\ndata_parallel_shard_degree = 8\n"), None).unwrap();
    assert_eq!((s.workload.micro_batch, s.training.grad_accum), (2, 4));
    let e = titan(&format!("{base}global_batch_size = 60\n[parallelism]\ndata_parallel_shard_degree = 8\n"), None)
        .unwrap_err();
    assert!(e.contains("not a multiple"), "{e}");
    // selective with an integer: every n-th block fully checkpointed.
    let s = titan(&format!("{base}[parallelism]\ndata_parallel_shard_degree = 8\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"2\"\n"), None).unwrap();
    assert_eq!(s.training.checkpointing.name(), "full");
    let e = titan(
        &format!(
            "{base}[parallelism]\ndata_parallel_shard_degree = 8\n[activation_checkpoint]\nmode = \"memory_budget\"\n"
        ),
        None,
    )
    .unwrap_err();
    assert!(e.contains("activation_checkpoint.mode"), "{e}");
    // An unknown flavor needs --model.
    let e = titan(
        "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[parallelism]\ndata_parallel_shard_degree = 8\n",
        None,
    )
    .unwrap_err();
    assert!(e.contains("model.flavor") && e.contains("--model"), "{e}");
    // float8 through the converters.
    let a = TorchtitanArgs { model: None, gpu: "h100-sxm".into(), gpus: None, gpus_per_node: None };
    let im = torchtitan::import(
        "job.toml",
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"float8\"]\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n[parallelism]\ndata_parallel_shard_degree = 8\n[float8]\nenable_fsdp_float8_all_gather = true\n[compile]\nenable = true\n[mystery]\nx = 1\n",
        &a,
    )
    .unwrap();
    assert!(im.toml.contains("[fp8]\nrecipe = \"tensorwise\"\nfsdp_all_gather = true"), "{}", im.toml);
    assert!(im.mapped.iter().any(|n| n.starts_with("compile")), "{:?}", im.mapped);
    assert!(im.toml.contains("kernels = \"compiled\""), "{}", im.toml);
    assert!(im.not_expressed.iter().any(|n| n.starts_with("[mystery]")), "{:?}", im.not_expressed);
    Scenario::from_toml(Path::new("imported.toml"), &im.render("torchtitan")).unwrap_or_else(|e| panic!("{e}"));
}

// ---------------------------------------------------------------- Megatron-LM

use stepsim::import::megatron::{self, MegatronArgs};

fn megatron_args(gpus: Option<u64>, vocab: Option<u64>) -> MegatronArgs {
    MegatronArgs { gpu: "h100-sxm".into(), gpus, gpus_per_node: None, vocab }
}

/// A Megatron command line on 8 GPUs imported and loaded as a scenario.
fn megatron_scenario(cmd: &str, vocab: u64) -> (stepsim::import::Import, Scenario) {
    let im = megatron::import("cmd", cmd, &megatron_args(Some(8), Some(vocab))).unwrap_or_else(|e| panic!("{e}"));
    let s = Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron"))
        .unwrap_or_else(|e| panic!("{e}\n{}", im.toml));
    (im, s)
}

/// A Llama-style job's `arguments` block in the layout Megatron's `_print_args` writes (name,
/// dots to column 48, value), with arguments at their defaults among them as a real log has.
const LLAMA_LOG: &str = "\
using world size: 16, data-parallel-size: 8, tensor-model-parallel-size: 2
------------------------ arguments ------------------------
  accumulate_allreduce_grads_in_fp32 .............. False
  add_bias_linear ................................. False
  add_qkv_bias .................................... False
  bf16 ............................................ True
  ckpt_format ..................................... torch_dist
  clip_grad ....................................... 1.0
  cpu_offloading .................................. True
  fp16 ............................................ False
  ffn_hidden_size ................................. 2816
  global_batch_size ............................... 64
  group_query_attention ........................... True
  hidden_dropout .................................. 0.0
  hidden_size ..................................... 1024
  kv_channels ..................................... 64
  max_position_embeddings ......................... 4096
  micro_batch_size ................................ 2
  normalization ................................... RMSNorm
  num_attention_heads ............................. 16
  num_layers ...................................... 4
  num_query_groups ................................ 4
  overlap_grad_reduce ............................. True
  padded_vocab_size ............................... 32000
  pipeline_model_parallel_size .................... 1
  position_embedding_type ......................... rope
  recompute_granularity ........................... selective
  seq_length ...................................... 4096
  sequence_parallel ............................... True
  swiglu .......................................... True
  tensor_model_parallel_size ...................... 2
  untie_embeddings_and_output_weights ............. True
  use_distributed_optimizer ....................... True
  world_size ...................................... 16
-------------------- end of arguments ---------------------
";

#[test]
fn megatrons_gpt3_175b_command_line_imports() {
    let cmd = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron/gpt3_175b_command.txt"),
    )
    .unwrap();
    // The world size from torchrun's --nproc_per_node 8 x --nnodes 128.
    let im = megatron::import("cmd.txt", &cmd, &megatron_args(None, Some(51200))).unwrap_or_else(|e| panic!("{e}"));
    let s = Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.cluster.gpus, 1024);
    let mp = &s.parallel.model_parallel;
    assert_eq!((mp.tensor, mp.pipeline), (8, 16));
    assert_eq!((s.workload.micro_batch, s.training.grad_accum), (1, 192));
    // GPT-3 175B: 96 x (12 h^2 + 13 h) + (V + s) h + 2h.
    let h = 12288u64;
    assert_eq!(s.model.param_count(), 96 * (12 * h * h + 13 * h) + (51200 + 2048) * h + 2 * h);
    assert!(im.not_expressed.iter().any(|n| n.starts_with("rampup_batch_size")), "{:?}", im.not_expressed);
    assert!(im.ignored.iter().any(|n| n == "lr"));
    // The vocabulary comes from the tokenizer.
    let e = megatron::import("cmd.txt", &cmd, &megatron_args(None, None)).unwrap_err();
    assert!(e.key == "padded_vocab_size" && e.message.contains("--vocab"), "{e}");
    let e = megatron::import("cmd.txt", &cmd, &megatron_args(Some(512), Some(51200))).unwrap_err();
    assert!(e.message.contains("1024 GPUs, --gpus 512"), "{e}");
}

#[test]
fn a_megatron_log_block_imports_and_runs() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("train.log"), LLAMA_LOG).unwrap();
    let out = stepsim(&["import", "megatron", "train.log", "--gpu", "h100-sxm", "--out", "s.toml"], d.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("cpu_offloading = True"), "{}", text(&out.stdout));
    let file = std::fs::read_to_string(d.path().join("s.toml")).unwrap();
    // A log argument at its default is not named as unexpressed (ckpt_format has no effect
    // and is listed with the ignored ones).
    assert!(
        !file.contains("ckpt_format =") && !file.contains("--ckpt-format"),
        "a default-valued log argument is not listed:\n{file}"
    );
    let s = Scenario::load(&d.path().join("s.toml")).unwrap();
    assert_eq!(s.cluster.gpus, 16);
    assert_eq!((s.workload.micro_batch, s.training.grad_accum), (2, 4));
    assert_eq!((s.model.n_heads, s.model.n_kv_heads, s.model.ffn_hidden, s.model.vocab), (16, 4, 2816, 32000));
    assert!(!s.model.tie_embeddings);
    for want in [
        "framework = \"megatron\"",
        "sharding = \"zero1\"",
        "overlap_grad_reduce = true",
        "activation_checkpointing = \"selective\"",
    ] {
        assert!(file.contains(want), "{want} in\n{file}");
    }
    let r = stepsim(&["run", "s.toml", "--out", "o"], d.path());
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    // A block between GPT and Llama is refused, naming what breaks it.
    let mixed = LLAMA_LOG.replace(
        "position_embedding_type ......................... rope",
        "position_embedding_type ......................... learned_absolute",
    );
    let e = megatron::import("train.log", &mixed, &megatron_args(None, None)).unwrap_err();
    assert!(e.key == "normalization" && e.message.contains("learned_absolute"), "{e}");
}

/// Megatron-Core's MoE flags map to [model.moe] and [moe]: `--moe-layer-freq` as an int (blocks
/// 0, N, 2N, ...) or a list expression, shared experts, the capacity factor and padding.
#[test]
fn megatron_moe_layer_frequency_shared_experts_and_capacity_import() {
    let base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --swiglu \
        --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --micro-batch-size 1 \
        --global-batch-size 8 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --bf16";
    let load = |extra: &str| megatron_scenario(&format!("{base} {extra}"), 32000);
    let (_, s) = load("--moe-layer-freq 2");
    assert_eq!((0..4).map(|l| s.model.is_moe_layer(l)).collect::<Vec<_>>(), [true, false, true, false]);
    let (im, s) = load("--moe-layer-freq ([0]*1+[1]*3) --moe-shared-expert-intermediate-size 1024");
    assert_eq!((0..4).map(|l| s.model.is_moe_layer(l)).collect::<Vec<_>>(), [false, true, true, true]);
    assert_eq!(s.model.moe.as_ref().unwrap().shared_expert_ffn_hidden, 1024);
    assert!(im.not_expressed.iter().all(|n| !n.contains("shared")), "{:?}", im.not_expressed);
    let (_, s) = load("--moe-layer-freq [1,0,0,1]");
    assert_eq!(s.model.moe.as_ref().unwrap().dense_layers, [1, 2]);
    let (im, s) =
        load("--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity --expert-model-parallel-size 2");
    assert!(s.capacity.is_some());
    assert!(im.toml.contains("[moe]\ncapacity_factor = 1.25\npad_to_capacity = true"), "{}", im.toml);
    let (im, s) = load(
        "--expert-model-parallel-size 8 --moe-router-num-groups 4 --moe-router-group-topk 2 \
         --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep --moe-flex-dispatcher-num-sms 24",
    );
    let moe = s.model.moe.as_ref().unwrap();
    assert_eq!((moe.router_groups, moe.router_group_topk), (4, 2));
    assert_eq!(s.parallel.deepep.map(|d| (d.groups, d.group_topk, d.sms)), Some((4, 2, 24)));
    assert!(im.mapped.iter().any(|m| m.contains("flex on DeepEP")), "{:?}", im.mapped);
    let (im, s) =
        load("--expert-model-parallel-size 8 --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep");
    assert!(s.parallel.deepep.is_none());
    assert!(im.not_expressed.iter().any(|n| n.contains("hybridep")), "{:?}", im.not_expressed);
    let (im, s) = load("--fp8-format hybrid --fp8-recipe blockwise");
    assert_eq!(s.workload.fp8.map(|f| f.recipe.name()), Some("blockwise"));
    assert!(im.mapped.iter().any(|m| m.contains("Float8BlockScaling")), "{:?}", im.mapped);
    let (im, s) = load("--fp8-format hybrid --fp8-recipe tensorwise");
    assert_eq!(s.workload.fp8.map(|f| f.recipe.name()), Some("delayed"));
    assert!(im.not_expressed.iter().any(|n| n.contains("current scaling")), "{:?}", im.not_expressed);
    let (im, s) = load("--expert-model-parallel-size 8 --overlap-moe-expert-parallel-comm");
    assert!(s.parallel.megatron.overlap_moe_expert_parallel_comm);
    assert!(im.mapped.iter().any(|m| m == "--overlap-moe-expert-parallel-comm"), "{:?}", im.mapped);
    for bad in ["--moe-layer-freq [1,0]", "--moe-layer-freq [0]*4", "--moe-layer-freq [2]*4", "--moe-layer-freq 0"] {
        let e = megatron::import("cmd", &format!("{base} {bad}"), &megatron_args(Some(8), Some(32000))).unwrap_err();
        assert_eq!(e.key, "moe_layer_freq", "{bad}: {e}");
    }
}

/// `--expert-tensor-parallel-size` maps to `[parallel] expert_tensor`; without it the scenario
/// takes Megatron's default, the tensor-parallel size; a log prints the resolved value, equal
/// to the tensor size when not given, and a dense model's is read and ignored.
#[test]
fn megatron_expert_tensor_parallel_size_imports() {
    let base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --swiglu \
        --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --micro-batch-size 1 \
        --global-batch-size 8 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --bf16 \
        --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer";
    let load = |extra: &str| megatron_scenario(&format!("{base} {extra}"), 32000);
    let (im, s) = load("--expert-model-parallel-size 4 --expert-tensor-parallel-size 1");
    assert!(im.toml.contains("expert = 4\nexpert_tensor = 1\n"), "{}", im.toml);
    assert_eq!((s.parallel.model_parallel.expert, s.parallel.model_parallel.expert_tensor), (4, 1));
    assert!(im.mapped.iter().any(|m| m.contains("expert 4") && !m.contains("expert tensor")), "{:?}", im.mapped);
    assert!(im.not_expressed.iter().all(|n| !n.contains("expert-tensor")), "{:?}", im.not_expressed);
    // Not given: Megatron's default, the tensor size, in Megatron and in the scenario.
    let (im, s) = load("--expert-model-parallel-size 4");
    assert!(!im.toml.contains("expert_tensor"), "{}", im.toml);
    assert_eq!(s.parallel.model_parallel.expert_tensor, 2);
    assert!(im.mapped.iter().any(|m| m.contains("expert 4, expert tensor 2")), "{:?}", im.mapped);
    // Given equal to the tensor size (as a log prints it): the same scenario.
    let (im2, s2) = load("--expert-model-parallel-size 4 --expert-tensor-parallel-size 2");
    assert_eq!(im2.toml, im.toml);
    assert_eq!(s2.parallel.model_parallel.expert_tensor, 2);
    // A dense model's flag splits nothing.
    let dense = base.replace("--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512", "");
    let im = megatron::import(
        "cmd",
        &format!("{dense} --expert-tensor-parallel-size 2"),
        &megatron_args(Some(8), Some(32000)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!im.toml.contains("expert_tensor"), "{}", im.toml);
    assert!(im.ignored.iter().any(|k| k == "expert_tensor_parallel_size"), "{:?}", im.ignored);
    Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron")).unwrap_or_else(|e| panic!("{e}"));
    // Refused as Megatron refuses it: 2 x 8 does not divide 8 ranks.
    let im = megatron::import(
        "cmd",
        &format!("{base} --expert-model-parallel-size 8 --expert-tensor-parallel-size 2"),
        &megatron_args(Some(8), Some(32000)),
    )
    .unwrap();
    let e = Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron")).unwrap_err();
    assert_eq!(e.field, "parallel.expert", "{e}");
}

/// Absurd numbers in any importer are errors (or a scenario the validator refuses), never a
/// wrapped product or a panic: the importers' products are formed in u128.
#[test]
fn huge_numbers_are_refused_not_wrapped() {
    let big = u64::MAX;
    let mg = format!(
        "--num-layers 4 --hidden-size {big} --num-attention-heads 16 --seq-length 4096 --swiglu --normalization RMSNorm \
         --position-embedding-type rope --disable-bias-linear --tensor-model-parallel-size {big} \
         --pipeline-model-parallel-size {big} --micro-batch-size {big} --global-batch-size {big}"
    );
    let r = megatron::import("cmd", &mg, &megatron_args(Some(big), Some(32000)));
    if let Ok(im) = r {
        assert!(Scenario::from_toml(Path::new("i.toml"), &im.render("megatron")).is_err());
    }
    let ds = format!(
        r#"{{"train_batch_size": {big}, "train_micro_batch_size_per_gpu": {big}, "gradient_accumulation_steps": {big}}}"#
    );
    assert!(import("ds.json", &ds, &args(big)).is_err());
    let tt = format!(
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = {}\nglobal_batch_size = {}\n\
         [parallelism]\ndata_parallel_replicate_degree = {m}\ndata_parallel_shard_degree = {m}\ntensor_parallel_degree = {m}\n\
         pipeline_parallel_degree = {m}\ncontext_parallel_degree = {m}\n",
        i64::MAX,
        i64::MAX,
        m = i64::MAX
    );
    if let Ok(s) = titan(&tt, None) {
        panic!("{} GPUs accepted", s.cluster.gpus);
    }
    // No GPU at all divided the global batch by zero (found by tests/fuzz_import.rs); the
    // command line's --gpus 0 is refused by the flag's own range.
    let cmd = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1";
    let e = megatron::import("cmd", cmd, &megatron_args(Some(0), Some(32000))).unwrap_err();
    assert!(e.key == "world_size" && e.message.contains("at least one GPU"), "{e}");
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("cmd"), cmd).unwrap();
    let out = stepsim(&["import", "megatron", "cmd", "--gpu", "h100-sxm", "--gpus", "0"], d.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("'--gpus <GPUS>'"), "{}", text(&out.stderr));
}

/// Megatron's `validate_args` turns FP32 gradient accumulation on for --bf16 (since 2021)
/// unless --grad-reduce-in-bf16 says otherwise; a log prints the value after that rule.
#[test]
fn megatron_bf16_command_lines_accumulate_in_fp32() {
    let base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \
                --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16";
    let preset = |cmd: &str| megatron_scenario(cmd, 50304).1.training.precision.preset;
    assert_eq!(preset(base), "bf16-mixed-adam-fp32-grads");
    assert_eq!(preset(&format!("{base} --grad-reduce-in-bf16")), "bf16-mixed-adam");
    assert_eq!(preset(&format!("{base} --accumulate-allreduce-grads-in-fp32")), "bf16-mixed-adam-fp32-grads");
}

/// Two of Megatron-LM's own functional tests (tests/fixtures/megatron_functional) as their
/// MODEL_ARGS give them: `--vocab-size` padded as `vocab_size_with_padding` pads it (131073
/// to a multiple of 128 x tensor), GPT-style blocks with grouped-query attention, both ways
/// of naming model chunks, multi-head latent attention, `--attention-backend unfused` (math
/// attention), and logging / checkpointing flags listed as ignored rather than unexpressed.
#[test]
fn megatron_functional_test_arguments_import_as_megatron_reads_them() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron_functional");
    let read = |n: &str| std::fs::read_to_string(dir.join(format!("{n}.args"))).unwrap();
    let load = |im: &stepsim::import::Import| {
        Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron")).unwrap_or_else(|e| panic!("{e}"))
    };
    // GPT 7B, TP 1 x PP 4 with one layer per virtual stage (8 chunks per stage).
    let im = megatron::import("a", &read("gpt3_7b_tp1_pp4_memory_speed"), &megatron_args(Some(8), None)).unwrap();
    let s = load(&im);
    assert_eq!((s.model.vocab, s.model.n_heads, s.model.n_kv_heads), (131200, 32, 8));
    assert!(im.mapped.iter().any(|m| m.contains("131073 padded to 131200")), "{:?}", im.mapped);
    assert_eq!(s.parallel.model_parallel.virtual_stages, 8);
    // Term by term: a block's fused QKV (h + 1) x (h + 2 x 1024), its projection h^2 + h, two
    // LayerNorms 4h, the MLP 2 x 4h^2 + 4h + h; 32 blocks, two 131,200 x h embeddings, 8,192
    // learned positions, the final LayerNorm.
    let h = 4096u64;
    let block = (h + 1) * (h + 2048) + h * h + h + 4 * h + 2 * h * 4 * h + 4 * h + h;
    assert_eq!(s.model.param_count(), 32 * block + 2 * 131200 * h + 8192 * h + 2 * h);
    assert_eq!(s.model.param_count(), 6_747_004_928);
    for quiet in ["log_params_norm", "mock_data", "ckpt_format", "async_save"] {
        assert!(im.ignored.iter().any(|i| i == quiet), "{quiet}: {:?}", im.ignored);
    }
    // With tensor parallelism 4 the multiple is 512.
    let im = megatron::import("b", &read("gpt3_7b_tp4_pp1_memory_speed"), &megatron_args(Some(8), None)).unwrap();
    assert_eq!(load(&im).model.vocab, 131584);
    // The MoE test: MLA, unfused attention, --num-virtual-stages-per-pipeline-rank.
    let im = megatron::import(
        "c",
        &read("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed"),
        &megatron_args(Some(8), Some(50432)),
    )
    .unwrap();
    let s = load(&im);
    let mla = s.model.mla.as_ref().expect("MLA");
    assert_eq!(
        (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim),
        (1536, 512, 128, 64, 128)
    );
    assert_eq!(s.workload.attention, stepsim::model::Attention::Math);
    assert_eq!(s.parallel.model_parallel.virtual_stages, 4);
    assert_eq!(s.model.mtp.as_ref().map(|m| m.layers), Some(1));
    // --no-rope-fusion is the one flag left; --moe-permute-fusion is what stepsim simulates.
    assert_eq!(im.not_expressed.len(), 1, "{:?}", im.not_expressed);
    assert!(im.not_expressed[0].starts_with("--no-rope-fusion"), "{:?}", im.not_expressed);
    assert!(im.mapped.iter().any(|m| m.starts_with("--moe-permute-fusion")), "{:?}", im.mapped);
    // --activation-func-fp8-input-store reaches [megatron].
    let text = read("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed") + "\n--activation-func-fp8-input-store\n";
    let im = megatron::import("c", &text, &megatron_args(Some(8), Some(50432))).unwrap();
    assert!(load(&im).workload.swiglu_fp8_input_store);
}

/// Megatron-LM's fine-grained offloading test (tests/fixtures/megatron_functional): its
/// `--pipeline-model-parallel-layout Et*3|(tt|)*6mL` is 8 virtual stages over pipeline 2 (4
/// chunks each) of 3, 2 x 6 and 0 decoder layers, the MTP layer with the loss;
/// `--fine-grained-activation-offloading --offload-modules [...]` maps to [megatron]
/// offload_modules.
#[test]
fn megatron_layout_and_fine_grained_offloading_import() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron_functional");
    let text =
        std::fs::read_to_string(dir.join("gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading.args")).unwrap();
    let im = megatron::import("f", &text, &megatron_args(Some(8), Some(50432))).unwrap();
    let s = Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron")).unwrap_or_else(|e| panic!("{e}"));
    let mp = &s.parallel.model_parallel;
    assert_eq!((mp.pipeline, mp.virtual_stages), (2, 4));
    assert_eq!(mp.stage_layers, vec![3, 2, 2, 2, 2, 2, 2, 0]);
    let a = s.training.activation_offload.expect("fine-grained offload");
    assert_eq!((a.method.name(), a.modules.0, a.min_elements), ("fine-grained", 127, 1 << 20));
    // The parser: Megatron's own example, and what it refuses.
    use stepsim::import::megatron::pipeline_layout;
    assert!(pipeline_layout("Ettt|(tt|)*29,m|L", 16, 61, 0).unwrap_err().contains("MTP"));
    assert_eq!(pipeline_layout("Ettt|(tt|)*28,ttmL", 2, 61, 1).unwrap(), [vec![3], vec![2; 29]].concat());
    assert!(pipeline_layout("tE|L", 1, 1, 0).unwrap_err().contains("embedding"));
    assert!(pipeline_layout("Et|tL", 2, 3, 0).unwrap_err().contains("2 decoder layers"));
    assert!(pipeline_layout("Et|t|L", 2, 2, 0).unwrap_err().contains("not a multiple"));
    assert!(pipeline_layout("Ex|L", 2, 0, 0).unwrap_err().contains("`x`"));
}

/// `--kv-channels` away from hidden / heads on GPT-style blocks is refused by its own key (it
/// was refused as the scenario's `model.head_dim`, a field the user never wrote; found by
/// tests/fuzz_import.rs); at that width it is accepted.
#[test]
fn gpt_style_kv_channels_are_refused_by_their_key() {
    let base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1";
    let e = megatron::import("cmd", &format!("{base} --kv-channels 128"), &megatron_args(Some(8), Some(32000)))
        .unwrap_err();
    assert!(e.key == "kv_channels" && e.message.contains("= 64"), "{e}");
    let im =
        megatron::import("cmd", &format!("{base} --kv-channels 64"), &megatron_args(Some(8), Some(32000))).unwrap();
    assert!(Scenario::from_toml(Path::new("i.toml"), &im.render("megatron")).is_ok());
    // Experts in GPT-style blocks likewise, by --num-experts (they were refused as the
    // scenario's model.moe, asking for a model.family the user never wrote).
    let e =
        megatron::import("cmd", &format!("{base} --num-experts 8"), &megatron_args(Some(8), Some(32000))).unwrap_err();
    assert!(e.key == "num_experts" && e.message.contains("--swiglu"), "{e}");
}

/// The dotted names of every value a scenario's TOML sets (arrays are leaves).
fn leaves(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in t {
        let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(sub) => leaves(sub, &name, out),
            _ => out.push(name),
        }
    }
}

/// Sets `dotted` in `t` to `v`, making the tables on its way.
fn set_dotted(t: &mut toml::Table, dotted: &str, v: toml::Value) {
    let (path, last) = dotted.rsplit_once('.').map_or(("", dotted), |(p, l)| (p, l));
    let mut at = t;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        at = at.entry(part).or_insert_with(|| toml::Value::Table(toml::Table::new())).as_table_mut().unwrap();
    }
    at.insert(last.to_string(), v);
}

/// Each importer records where every field it writes came from (a config key, a flag, or the
/// argument a default derives from), so that a scenario which does not validate is refused by
/// what the user wrote. Checked on every shipped config: each value the scenario sets has an
/// origin (but the description and the framework, which the importer itself names), and each
/// recorded origin is of a field the scenario format has (a field that is not would be refused
/// as unknown, not as the wrong type).
#[test]
fn every_field_an_import_writes_names_where_it_came_from() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let mut imports: Vec<(String, stepsim::import::Import)> = Vec::new();
    for (name, version, fp16) in
        [("hf_ds_config_zero2.json", None, false), ("hf_ds_config_zero3.json", Some("0.14.4"), true)]
    {
        let mut config = read(&format!("deepspeed/{name}"));
        if fp16 {
            config =
                config.replace("\"fp16\": {\n        \"enabled\": \"auto\"", "\"fp16\": {\n        \"enabled\": true");
        }
        let a = DeepspeedArgs {
            micro_batch: Some(2),
            grad_accum: Some(4),
            dtype: Some(if fp16 { "fp16" } else { "bf16" }.into()),
            version: version.map(str::to_string),
            gpus_per_node: Some(8),
            ..args(8)
        };
        imports.push((name.into(), import(name, &config, &a).unwrap_or_else(|e| panic!("{e}"))));
    }
    for f in std::fs::read_dir(root.join("megatron_functional")).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_some_and(|e| e == "args") {
            let name = path.display().to_string();
            let im =
                megatron::import(&name, &std::fs::read_to_string(&path).unwrap(), &megatron_args(Some(8), Some(50432)))
                    .unwrap_or_else(|e| panic!("{e}"));
            imports.push((name, im));
        }
    }
    let cmd = read("megatron/gpt3_175b_command.txt");
    imports.push(("175b".into(), megatron::import("175b", &cmd, &megatron_args(None, Some(51200))).unwrap()));
    imports.push(("log".into(), megatron::import("log", LLAMA_LOG, &megatron_args(None, None)).unwrap()));
    for name in ["llama3_8b.toml", "llama3_70b.toml"] {
        let gpus = Some(if name == "llama3_8b.toml" { 8 } else { 64 });
        let a = TorchtitanArgs { model: None, gpu: "h100-sxm".into(), gpus, gpus_per_node: Some(8) };
        let mut config = read(&format!("torchtitan/{name}"));
        if name == "llama3_70b.toml" {
            config = config.replace("# converters = [\"float8\"]", "converters = [\"float8\"]");
            config = config.replace("[float8]\n", "[float8]\nrecipe_name = \"rowwise\"\n");
        }
        imports.push((name.into(), torchtitan::import(name, &config, &a).unwrap_or_else(|e| panic!("{e}"))));
    }
    let exempt = ["description", "parallel.framework"];
    let (mut checked, mut missing) = (0, Vec::new());
    for (name, im) in &imports {
        let t: toml::Table = toml::from_str(&im.toml).unwrap();
        let mut written = Vec::new();
        leaves(&t, "", &mut written);
        for field in written.iter().filter(|f| !exempt.contains(&f.as_str())) {
            if !im.origins.iter().any(|(f, _)| f == field) {
                missing.push(format!("{name}: {field}"));
            }
            checked += 1;
        }
        for (field, origin) in &im.origins {
            let mut bad = t.clone();
            set_dotted(&mut bad, field, toml::Value::Table(toml::Table::new()));
            // A section given as an empty table may even validate; a field that is not one of
            // the format's is refused as unknown.
            if let Err(e) = Scenario::from_toml(Path::new("o.toml"), &toml::to_string(&bad).unwrap()) {
                assert!(
                    !e.to_string().contains("unknown field"),
                    "{name}: {origin} names `{field}`, not a scenario field: {e}"
                );
            }
        }
    }
    assert!(missing.is_empty(), "fields written without an origin:\n{}", missing.join("\n"));
    let origins: usize = imports.iter().map(|(_, im)| im.origins.len()).sum();
    println!("{checked} written fields have an origin; {origins} origins recorded");
    assert!(checked > 200, "{checked} fields checked");
}

/// A scenario that does not validate is refused naming the key or flag that set the field,
/// and the field (the message may refer to it); nothing is written and no file of the scenario
/// that was never written is named.
#[test]
fn an_imported_scenario_that_does_not_validate_names_the_key_that_set_it() {
    let d = tempfile::tempdir().unwrap();
    let cmd = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron/gpt3_175b_command.txt"),
    )
    .unwrap();
    std::fs::write(d.path().join("heads.txt"), cmd.replace("--num-attention-heads 96", "--num-attention-heads 100"))
        .unwrap();
    std::fs::write(
        d.path().join("pp.txt"),
        cmd.replace("--pipeline-model-parallel-size 16", "--pipeline-model-parallel-size 7"),
    )
    .unwrap();
    std::fs::write(d.path().join("ok.txt"), &cmd).unwrap();
    let import = |file: &str, gpu: &str| {
        stepsim(&["import", "megatron", file, "--gpu", gpu, "--vocab", "51200", "--out", "s.toml"], d.path())
    };
    for (file, gpu, says) in [
        (
            "heads.txt",
            "a100-80gb",
            "key `num_attention_heads` (the scenario's `model.n_heads`): must divide model.hidden (12288)",
        ),
        ("pp.txt", "a100-80gb", "pp.txt: key `pipeline_model_parallel_size`: tensor 8 x pipeline 7"),
        ("ok.txt", "a100-sxm-80gb", "--gpu (the scenario's `hardware.gpu`): unknown GPU \"a100-sxm-80gb\""),
    ] {
        let out = import(file, gpu);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!err.contains(".toml"), "names a scenario file that was never written: {err}");
        assert!(!d.path().join("s.toml").exists());
    }
    // The flag that overrides a key is the one named.
    let ds = fixture("hf_ds_config_zero3.json");
    let out = stepsim(
        &[
            "import",
            "deepspeed",
            &ds,
            "--model",
            "llama-3.1-8b",
            "--gpus",
            "8",
            "--gpu",
            "h100-sxm",
            "--micro-batch",
            "2000000",
            "--grad-accum",
            "1",
            "--dtype",
            "bf16",
        ],
        d.path(),
    );
    let err = text(&out.stderr);
    assert!(err.contains("--micro-batch (the scenario's `training.micro_batch`): must be at most 1048576"), "{err}");
}
