//! A torchtitan job TOML (`train_configs/*.toml`) as a scenario. torchtitan trains with
//! FSDP2 (`fully_shard`) over `data_parallel_shard_degree`, HSDP when
//! `data_parallel_replicate_degree` > 1, tensor parallelism with sequence-parallel norms,
//! pipeline and context parallelism, per-op or full activation checkpointing and torchao
//! float8; the mapping follows its `config/job_config.py` and `distributed/parallel_dims.py`:
//! - the degrees multiply to the world size; `data_parallel_shard_degree = -1` takes what the
//!   others leave, which needs `--gpus`;
//! - `training.local_batch_size` (older: `batch_size`) is the micro-batch; with a
//!   `global_batch_size` the accumulation steps are global / (local x data-parallel size);
//! - `mixed_precision_param` (bfloat16) / `mixed_precision_reduce` (float32) are FSDP2's
//!   `MixedPrecisionPolicy` over FP32 sharded parameters: preset `fsdp-bf16-mixed`;
//! - `activation_checkpoint.mode`: "selective" with `selective_ac_option = "op"` is the per-op
//!   policy (`selective-op`), with an integer n every n-th block fully checkpointed;
//! - `model.converters = ["float8"]` is torchao float8 (`[float8] recipe_name`, default
//!   tensorwise; `enable_fsdp_float8_all_gather`).

use toml::{Table, Value};

use super::{Import, ImportError, ModelArg};

/// What the command line adds to the config.
#[derive(Debug, Clone)]
pub struct TorchtitanArgs {
    /// Overrides the config's `model.name` / `flavor`.
    pub model: Option<ModelArg>,
    pub gpu: String,
    /// The world size, needed when `data_parallel_shard_degree = -1`.
    pub gpus: Option<u64>,
    pub gpus_per_node: Option<u64>,
}

/// torchtitan's llama3 flavors that are a zoo model (the same dimensions and vocabulary).
const FLAVORS: &[(&str, &str, &str)] =
    &[("llama3", "8B", "llama-3.1-8b"), ("llama3", "70B", "llama-3.1-70b"), ("llama3", "405B", "llama-3.1-405b")];

/// Sections read and ignored: they change neither memory nor time.
const NO_EFFECT: &[&str] = &[
    "profiling",
    "metrics",
    "checkpoint",
    "lr_scheduler",
    "comm",
    "validation",
    "fault_tolerance",
    "experimental",
    "memory_estimation",
];

pub fn import(file: &str, config: &str, a: &TorchtitanArgs) -> Result<Import, ImportError> {
    let err = |key: &str, msg: String| ImportError { file: file.to_string(), key: key.to_string(), message: msg };
    let t: Table = toml::from_str(config).map_err(|e| err("", format!("not valid TOML: {}", e.message())))?;
    let mut im = Import::default();
    let section = |name: &str| -> Result<Table, ImportError> {
        match t.get(name) {
            None => Ok(Table::new()),
            Some(Value::Table(s)) => Ok(s.clone()),
            Some(x) => Err(err(name, format!("must be a table, got {}", x.type_str()))),
        }
    };
    let (job, model, training, par, ac, f8, opt, compile) = (
        section("job")?,
        section("model")?,
        section("training")?,
        section("parallelism")?,
        section("activation_checkpoint")?,
        section("float8")?,
        section("optimizer")?,
        section("compile")?,
    );
    let int = |s: &Table, sec: &str, key: &str, default: i64| -> Result<i64, ImportError> {
        match s.get(key) {
            None => Ok(default),
            Some(Value::Integer(n)) => Ok(*n),
            Some(x) => Err(err(&format!("{sec}.{key}"), format!("must be an integer, got {x}"))),
        }
    };
    let string = |s: &Table, sec: &str, key: &str, default: &str| -> Result<String, ImportError> {
        match s.get(key) {
            None => Ok(default.to_string()),
            Some(Value::String(x)) => Ok(x.clone()),
            Some(x) => Err(err(&format!("{sec}.{key}"), format!("must be a string, got {x}"))),
        }
    };
    let boolean = |s: &Table, sec: &str, key: &str| -> Result<bool, ImportError> {
        match s.get(key) {
            None => Ok(false),
            Some(Value::Boolean(b)) => Ok(*b),
            Some(x) => Err(err(&format!("{sec}.{key}"), format!("must be true or false, got {x}"))),
        }
    };
    // --- model
    let model_arg = match &a.model {
        Some(m) => {
            im.mapped.push("model: from --model".into());
            m.clone()
        }
        None => {
            let (name, flavor) = (string(&model, "model", "name", "")?, string(&model, "model", "flavor", "")?);
            match FLAVORS.iter().find(|f| f.0 == name && f.1 == flavor) {
                Some(f) => {
                    im.from_key("model.name", "model.flavor");
                    im.mapped.push(format!("model.name \"{name}\", flavor \"{flavor}\": zoo model {} (the same dimensions and vocabulary)", f.2));
                    ModelArg::Zoo(f.2.to_string())
                }
                None => {
                    return Err(err(
                        "model.flavor",
                        format!(
                            "\"{name}\" / \"{flavor}\" is not a flavor stepsim knows ({}); give --model with a zoo model or a config.json",
                            FLAVORS.iter().map(|f| format!("{} {}", f.0, f.1)).collect::<Vec<_>>().join(", ")
                        ),
                    ))
                }
            }
        }
    };
    // --- parallelism
    let degree = |key: &str| -> Result<i64, ImportError> {
        let d = int(&par, "parallelism", key, 1)?;
        if d < 1 && !(key == "data_parallel_shard_degree" && d == -1) {
            return Err(err(
                &format!("parallelism.{key}"),
                format!(
                    "must be a positive integer{}, got {d}",
                    if key == "data_parallel_shard_degree" { " or -1" } else { "" }
                ),
            ));
        }
        Ok(d)
    };
    let (rep, tp, pp, cp) = (
        degree("data_parallel_replicate_degree")?,
        degree("tensor_parallel_degree")?,
        degree("pipeline_parallel_degree")?,
        degree("context_parallel_degree")?,
    );
    let shard_cfg = int(&par, "parallelism", "data_parallel_shard_degree", -1)?;
    if shard_cfg < 1 && shard_cfg != -1 {
        return Err(err(
            "parallelism.data_parallel_shard_degree",
            format!("must be a positive integer or -1, got {shard_cfg}"),
        ));
    }
    let others = [rep, tp, pp, cp].iter().fold(1u128, |p, &d| p.saturating_mul(d as u128));
    let others =
        u64::try_from(others).map_err(|_| err("parallelism", format!("the degrees multiply to {others} GPUs")))?;
    let (gpus, shard) = match (shard_cfg, a.gpus) {
        (-1, None) => {
            return Err(err(
                "parallelism.data_parallel_shard_degree",
                "-1 takes the GPUs the other degrees leave; give --gpus (the world size)".into(),
            ))
        }
        (-1, Some(g)) => {
            if g % others != 0 || g < others {
                return Err(err(
                    "parallelism.data_parallel_shard_degree",
                    format!("--gpus {g} is not a multiple of replicate {rep} x tensor {tp} x pipeline {pp} x context {cp} = {others}"),
                ));
            }
            (g, g / others)
        }
        (s, g) => {
            let world = others
                .checked_mul(s as u64)
                .ok_or_else(|| err("parallelism", "the degrees multiply to more than 2^64 GPUs".into()))?;
            if let Some(g) = g.filter(|&g| g != world) {
                return Err(err(
                    "parallelism",
                    format!("the degrees multiply to {world} GPUs (replicate {rep} x shard {s} x tensor {tp} x pipeline {pp} x context {cp}), not --gpus {g}"),
                ));
            }
            (world, s as u64)
        }
    };
    im.mapped.push(format!(
        "parallelism: replicate {rep} x shard {shard} x tensor {tp} x pipeline {pp} x context {cp} = {gpus} GPUs"
    ));
    let sharding = match (shard > 1, rep > 1) {
        (true, true) => "hybrid_shard",
        (true, false) => "full_shard",
        (false, _) => "none",
    };
    let shard_key = "parallelism.data_parallel_shard_degree";
    im.from_either("hardware.gpus", "--gpus", a.gpus.is_some(), "parallelism");
    im.from_key("parallel.sharding", shard_key);
    im.from_either("parallel.hsdp_shard_size", "--gpus", shard_cfg == -1, shard_key);
    for (field, key) in [
        ("parallel.reshard_after_forward", "fsdp_reshard_after_forward"),
        ("parallel.tensor", "tensor_parallel_degree"),
        ("parallel.sequence_parallel", "tensor_parallel_degree"),
        ("parallel.async_tp", "enable_async_tensor_parallel"),
        ("parallel.pipeline", "pipeline_parallel_degree"),
        ("parallel.schedule", "pipeline_parallel_schedule"),
        ("parallel.context", "context_parallel_degree"),
    ] {
        im.from_key(field, &format!("parallelism.{key}"));
    }
    let mut par_toml = format!("framework = \"fsdp2\"\nsharding = \"{sharding}\"\n");
    if sharding == "hybrid_shard" {
        par_toml.push_str(&format!("hsdp_shard_size = {shard}\n"));
    }
    im.mapped.push(format!(
        "FSDP2 (fully_shard): sharding \"{sharding}\"{}",
        if sharding == "hybrid_shard" { format!(" (HSDP, {shard} ranks per shard group)") } else { String::new() }
    ));
    match string(&par, "parallelism", "fsdp_reshard_after_forward", "default")?.as_str() {
        "default" => im
            .assumed
            .push("fsdp_reshard_after_forward \"default\": stepsim's default (reshard, except with a pipeline)".into()),
        "always" => {
            par_toml.push_str("reshard_after_forward = true\n");
            im.mapped.push("fsdp_reshard_after_forward \"always\"".into());
        }
        "never" => {
            par_toml.push_str("reshard_after_forward = false\n");
            im.mapped.push("fsdp_reshard_after_forward \"never\"".into());
        }
        x => {
            return Err(err(
                "parallelism.fsdp_reshard_after_forward",
                format!("must be \"default\", \"always\" or \"never\", got \"{x}\""),
            ))
        }
    }
    if tp > 1 {
        par_toml.push_str(&format!("tensor = {tp}\nsequence_parallel = true\n"));
        im.mapped.push(format!("tensor_parallel_degree {tp}, with torchtitan's sequence-parallel norms"));
        if boolean(&par, "parallelism", "enable_async_tensor_parallel")? {
            par_toml.push_str("async_tp = true\n");
            im.mapped.push("enable_async_tensor_parallel".into());
        }
    }
    if pp > 1 {
        let sched = string(&par, "parallelism", "pipeline_parallel_schedule", "1F1B")?;
        let s = match sched.as_str() {
            "1F1B" => "1f1b",
            "GPipe" => "gpipe",
            "Interleaved1F1B" => "interleaved-1f1b",
            "DualPipeV" => {
                im.not_expressed.push("pipeline_parallel_schedule \"DualPipeV\": stepsim simulates DualPipeV on Megatron-style ranks only (parallel.framework = \"megatron\", schedule = \"dualpipev\"), not with FSDP; 1F1B simulated instead".to_string());
                "1f1b"
            }
            x => {
                im.not_expressed.push(format!("pipeline_parallel_schedule \"{x}\": 1F1B simulated instead"));
                "1f1b"
            }
        };
        par_toml.push_str(&format!("pipeline = {pp}\nschedule = \"{s}\"\n"));
        im.mapped.push(format!("pipeline_parallel_degree {pp}, schedule {sched}"));
    }
    if cp > 1 {
        par_toml.push_str(&format!("context = {cp}\n"));
        im.mapped.push(format!("context_parallel_degree {cp}"));
    }
    // --- training
    im.from_key(
        "training.micro_batch",
        if training.contains_key("batch_size") && !training.contains_key("local_batch_size") {
            "training.batch_size"
        } else {
            "training.local_batch_size"
        },
    );
    let local = match (training.get("local_batch_size"), training.get("batch_size")) {
        (Some(_), _) => int(&training, "training", "local_batch_size", 8)?,
        (None, Some(_)) => int(&training, "training", "batch_size", 8)?,
        (None, None) => 8,
    };
    if local < 1 {
        return Err(err("training.local_batch_size", format!("must be a positive integer, got {local}")));
    }
    let dp = (rep as u64).saturating_mul(shard);
    let global = int(&training, "training", "global_batch_size", -1)?;
    let accum = if global <= 0 {
        1
    } else if global as u128 % (local as u128 * dp as u128) == 0 {
        (global as u128 / (local as u128 * dp as u128)) as u64
    } else {
        return Err(err(
            "training.global_batch_size",
            format!("{global} is not a multiple of local_batch_size {local} x data-parallel size {dp}"),
        ));
    };
    let seq = int(&training, "training", "seq_len", 2048)?;
    if seq < 1 {
        return Err(err("training.seq_len", format!("must be a positive integer, got {seq}")));
    }
    im.mapped.push(format!("training: local batch {local} x seq {seq}, {accum} micro-batch(es) per step"));
    let param = string(&training, "training", "mixed_precision_param", "bfloat16")?;
    let reduce = string(&training, "training", "mixed_precision_reduce", "float32")?;
    let preset = match (param.as_str(), reduce.as_str()) {
        ("bfloat16", "float32") => "fsdp-bf16-mixed",
        ("float32", "float32") => "fp32",
        (p, r) => {
            return Err(err(
                "training.mixed_precision_param",
                format!("param \"{p}\" with reduce \"{r}\" is not a policy stepsim has a preset for (bfloat16/float32 or float32/float32)"),
            ))
        }
    };
    im.mapped.push(format!("mixed_precision_param {param}, mixed_precision_reduce {reduce}: preset {preset}"));
    let clip = match training.get("max_norm") {
        None => true,
        Some(v) => v.as_float().or(v.as_integer().map(|i| i as f64)).is_some_and(|x| x > 0.0),
    };
    let compiled = boolean(&training, "training", "compile")? || boolean(&compile, "compile", "enable")?;
    // `compile.components` (default ["model", "loss"]); before it, `training.compile` compiled
    // both (the loss since bbb1b61, 2025-04).
    let components: Vec<String> = match compile.get("components") {
        None => vec!["model".into(), "loss".into()],
        Some(Value::Array(v)) => v.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        Some(x) => return Err(err("compile.components", format!("must be a list of strings, got {x}"))),
    };
    let kernels = if compiled && components.iter().any(|c| c == "model") {
        im.mapped.push("compile: kernels = \"compiled\" (torch.compile's fused element-wise kernels)".into());
        "compiled"
    } else {
        im.mapped.push("compile off: kernels = \"eager\" (eager PyTorch's element-wise kernels)".into());
        "eager"
    };
    let loss_toml = if compiled && components.iter().any(|c| c == "loss") {
        if tp > 1 {
            im.not_expressed.push(
                "the compiled loss under tensor parallelism (loss_parallel): simulated as eager cross-entropy".into(),
            );
            ""
        } else {
            im.mapped.push(
                "compile of the loss: loss = \"compiled\" (Inductor's fused cross-entropy: no FP32 copy of the logits)"
                    .into(),
            );
            "loss = \"compiled\"\n"
        }
    } else {
        ""
    };
    // --- checkpointing
    let mode = string(&ac, "activation_checkpoint", "mode", "selective")?;
    let option = match ac.get("selective_ac_option") {
        None => "2".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Integer(n)) => n.to_string(),
        Some(x) => {
            return Err(err(
                "activation_checkpoint.selective_ac_option",
                format!("must be \"op\" or an integer, got {x}"),
            ))
        }
    };
    let mut ac_toml = String::new();
    let checkpointing = match mode.as_str() {
        "none" => "none",
        "full" => "full",
        "selective" if option == "op" => "selective-op",
        "selective" => match option.parse::<u64>() {
            Ok(n) if n >= 1 => {
                ac_toml = format!("checkpoint_every = {n}\n");
                "full"
            }
            _ => {
                return Err(err(
                    "activation_checkpoint.selective_ac_option",
                    format!("must be \"op\" or a positive integer, got \"{option}\""),
                ))
            }
        },
        x => {
            return Err(err(
                "activation_checkpoint.mode",
                format!("\"{x}\" is not modelled; \"none\", \"full\" and \"selective\" are"),
            ))
        }
    };
    im.mapped.push(format!(
        "activation_checkpoint mode \"{mode}\"{}: {checkpointing}{}",
        if mode == "selective" { format!(" option \"{option}\"") } else { String::new() },
        if ac_toml.is_empty() { String::new() } else { format!(", every {option} blocks") }
    ));
    // --- optimizer
    let name = string(&opt, "optimizer", "name", "AdamW")?;
    let optimizer = match name.as_str() {
        "AdamW" => "adamw",
        "Adam" => "adam",
        x => {
            im.not_expressed
                .push(format!("optimizer.name \"{x}\": only Adam and AdamW are modelled here; AdamW assumed"));
            "adamw"
        }
    };
    let implementation = match string(&opt, "optimizer", "implementation", "fused")?.as_str() {
        "fused" => "fused",
        "foreach" => "foreach",
        "for-loop" => "for-loop",
        x => {
            return Err(err(
                "optimizer.implementation",
                format!("must be \"fused\", \"foreach\" or \"for-loop\", got \"{x}\""),
            ))
        }
    };
    // --- float8
    let converters: Vec<String> = match model.get("converters") {
        None => Vec::new(),
        Some(Value::Array(v)) => v.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        Some(x) => return Err(err("model.converters", format!("must be a list of strings, got {x}"))),
    };
    let mut fp8 = String::new();
    for c in &converters {
        if c == "float8" {
            let recipe = string(&f8, "float8", "recipe_name", "tensorwise")?;
            if recipe != "tensorwise" && recipe != "rowwise" {
                return Err(err(
                    "float8.recipe_name",
                    format!("\"{recipe}\" is not modelled; \"tensorwise\" and \"rowwise\" are"),
                ));
            }
            let ag = boolean(&f8, "float8", "enable_fsdp_float8_all_gather")?;
            fp8 = format!("recipe = \"{recipe}\"\nfsdp_all_gather = {ag}\n");
            im.mapped.push(format!(
                "model.converters float8: torchao float8 {recipe}{}",
                if ag { " with the FP8 all-gather" } else { "" }
            ));
        } else {
            im.not_expressed.push(format!("model.converters \"{c}\""));
        }
    }
    // --- what is left
    for (k, v) in &t {
        if NO_EFFECT.contains(&k.as_str()) {
            im.ignored.push(format!("[{k}]"));
        } else if ![
            "job",
            "model",
            "training",
            "parallelism",
            "activation_checkpoint",
            "float8",
            "optimizer",
            "compile",
        ]
        .contains(&k.as_str())
        {
            im.not_expressed.push(format!("[{k}]{}", if v.is_table() { "" } else { " (a top-level key)" }));
        }
    }
    im.assumed.push("attention: flash (torchtitan's SDPA picks the flash kernel on these GPUs)".into());
    // --- the scenario
    for (field, key) in [
        ("training.grad_accum", "training.global_batch_size"),
        ("training.seq_len", "training.seq_len"),
        ("training.precision", "training.mixed_precision_param"),
        ("training.optimizer", "optimizer.name"),
        ("training.optimizer_impl", "optimizer.implementation"),
        ("training.activation_checkpointing", "activation_checkpoint.mode"),
        ("training.checkpoint_every", "activation_checkpoint.selective_ac_option"),
        ("training.kernels", "compile.enable"),
        ("training.loss", "compile.components"),
        ("training.clip_grad_norm", "training.max_norm"),
        ("fp8.recipe", "float8.recipe_name"),
        ("fp8.fsdp_all_gather", "float8.enable_fsdp_float8_all_gather"),
    ] {
        im.from_key(field, key);
    }
    im.from_text("training.attention", "the import's assumption of flash attention (torchtitan's SDPA)".into());
    super::flag_origins(&mut im, a.model.as_ref());
    let description = string(&job, "job", "description", "torchtitan job")?;
    let mut s = format!(
        "description = {}\n\n",
        super::quote(&format!("{description} (imported from {file}, {gpus} x {})", a.gpu))
    );
    s.push_str(&format!(
        "[model]\n{}\n\n[hardware]\ngpu = {}\ngpus = {gpus}\n",
        model_arg.toml(),
        super::quote(&a.gpu)
    ));
    if let Some(n) = a.gpus_per_node {
        s.push_str(&format!("gpus_per_node = {n}\n"));
    }
    s.push_str(&format!("\n[parallel]\n{par_toml}"));
    s.push_str(&format!(
        "\n[training]\nmicro_batch = {local}\nseq_len = {seq}\ngrad_accum = {accum}\nprecision = \"{preset}\"\noptimizer = \"{optimizer}\"\noptimizer_impl = \"{implementation}\"\nactivation_checkpointing = \"{checkpointing}\"\n{ac_toml}attention = \"flash\"\nkernels = \"{kernels}\"\n{loss_toml}clip_grad_norm = {clip}\n"
    ));
    if !fp8.is_empty() {
        s.push_str(&format!("\n[fp8]\n{fp8}"));
    }
    im.toml = s;
    Ok(im)
}
