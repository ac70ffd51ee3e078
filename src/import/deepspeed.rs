//! A DeepSpeed `ds_config.json` as a scenario: what the config decides (batch sizes, ZeRO
//! stage, precision, offload, ZeRO's bucket knobs) mapped to stepsim's fields by DeepSpeed's
//! own names; what it does not hold (the model, the GPUs, the sequence length, whether the
//! model checkpoints activations) taken from the command line; and every other key named as
//! read and ignored, or as not expressible, so nothing is dropped silently.
//!
//! Semantics follow DeepSpeed's `runtime/config.py` and `runtime/engine.py`:
//! - `train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x
//!   data-parallel size` (`_batch_assertion`); any two give the third, all three must agree;
//! - `bf16.enabled` / `fp16.enabled` pick the model dtype; with neither, FP32. ZeRO stage 0
//!   with BF16, or stage 1 with `data_types.grad_accum_dtype = "fp32"`, runs `BF16_Optimizer`
//!   (FP32 gradient accumulation: `_do_optimizer_sanity_check` returns BFLOAT16);
//! - `zero_optimization.stage` 0-3; `offload_optimizer.device` / `offload_param.device`
//!   "cpu" | "nvme" | "none";
//! - "auto" values are filled in by the Hugging Face Trainer from its own arguments, so each
//!   needs the matching flag here.

use serde_json::{Map, Value};

use super::{Import, ImportError, ModelArg};

/// What the command line adds to the config.
#[derive(Debug, Clone)]
pub struct DeepspeedArgs {
    pub model: ModelArg,
    pub gpu: String,
    pub gpus: u64,
    pub gpus_per_node: Option<u64>,
    pub seq_len: u64,
    pub micro_batch: Option<u64>,
    pub grad_accum: Option<u64>,
    pub checkpointing: String,
    /// "bf16" | "fp16" | "fp32": what the Trainer's --bf16 / --fp16 fill an "auto" with.
    pub dtype: Option<String>,
    /// The DeepSpeed release (`[deepspeed] version`); none: stepsim's default.
    pub version: Option<String>,
}

/// Keys read and ignored because they change neither memory nor time, with why.
const NO_EFFECT: &[(&str, &str)] = &[
    ("steps_per_print", "logging"),
    ("wall_clock_breakdown", "logging"),
    ("gradient_clipping", "clipping is on by default in stepsim's optimizer step (training.clip_grad_norm)"),
    ("scheduler", "a learning-rate schedule"),
    ("prescale_gradients", "scaling order, same traffic"),
    ("gradient_predivide_factor", "scaling order, same traffic"),
    ("zero_allow_untested_optimizer", "a check"),
    ("zero_force_ds_cpu_optimizer", "a check"),
    ("tensorboard", "logging"),
    ("wandb", "logging"),
    ("csv_monitor", "logging"),
    ("comms_logger", "logging"),
    ("flops_profiler", "profiling"),
    ("seed", "randomness"),
];

/// `zero_optimization` keys read and ignored, with why.
const ZERO_NO_EFFECT: &[(&str, &str)] = &[
    ("stage3_gather_16bit_weights_on_model_save", "checkpoint saving"),
    ("stage3_gather_fp16_weights_on_model_save", "checkpoint saving"),
    ("gather_16bit_weights_on_model_save", "checkpoint saving"),
    ("round_robin_gradients", "ordering of the offloaded gradient copies"),
    ("load_from_fp32_weights", "checkpoint loading"),
    ("elastic_checkpoint", "checkpoint loading"),
    ("ignore_unused_parameters", "a check"),
    ("reduce_scatter", "ZeRO-1/2 reduce with reduce-scatter (the default, what stepsim models)"),
    ("allgather_partitions", "ZeRO-1/2 gather updated partitions with all-gather (the default, what stepsim models)"),
];

/// `zero_optimization` keys stepsim cannot express yet, with what they change.
const ZERO_NOT_EXPRESSED: &[(&str, &str)] = &[
    ("stage3_model_persistence_threshold", "a cap on the persistent parameters' total (stepsim has none)"),
    ("zero_hpz_partition_size", "ZeRO++ hierarchical partitioning"),
    ("zero_quantized_weights", "ZeRO++ quantized all-gather"),
    ("zero_quantized_gradients", "ZeRO++ quantized reduce-scatter"),
    ("mics_shard_size", "MiCS sharding groups"),
];

/// The import of `config` (the file's text; `file` names it in errors).
pub fn import(file: &str, config: &str, a: &DeepspeedArgs) -> Result<Import, ImportError> {
    let err = |key: &str, msg: String| ImportError { file: file.to_string(), key: key.to_string(), message: msg };
    let v: Value = serde_json::from_str(config).map_err(|e| err("", format!("not valid JSON: {e}")))?;
    let Value::Object(o) = v else { return Err(err("", "not a JSON object (a ds_config.json is one)".into())) };
    let mut im = Import::default();
    // --- batch sizes
    let dp_guess = a.gpus; // data parallel = GPUs: the config holds no model parallelism.
    let count = |key: &str, flag: Option<u64>, flag_name: &str| -> Result<Option<u64>, ImportError> {
        match (o.get(key), flag) {
            (_, Some(f)) => Ok(Some(f)),
            (None | Some(Value::Null), None) => Ok(None),
            (Some(Value::String(s)), None) if s == "auto" => Err(err(
                key,
                format!("\"auto\" is filled in by the Hugging Face Trainer from its arguments; give {flag_name}"),
            )),
            (Some(x), None) => match x.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(err(key, format!("must be a positive whole number or \"auto\", got {x}"))),
            },
        }
    };
    let micro = count("train_micro_batch_size_per_gpu", a.micro_batch, "--micro-batch")?;
    let gas = count("gradient_accumulation_steps", a.grad_accum, "--grad-accum")?;
    // The Trainer fills an "auto" train_batch_size from the other two.
    let global = match o.get("train_batch_size") {
        Some(Value::String(s)) if s == "auto" => None,
        _ => count("train_batch_size", None, "")?,
    };
    // Which of the three set each scenario field (a flag overrides its key; a missing one is
    // derived from train_batch_size, or is 1 for the accumulation without it).
    let derived = |given: bool| if given || global.is_none() { None } else { Some("train_batch_size") };
    match derived(micro.is_some()) {
        Some(k) => im.from_key("training.micro_batch", k),
        None => im.from_either(
            "training.micro_batch",
            "--micro-batch",
            a.micro_batch.is_some(),
            "train_micro_batch_size_per_gpu",
        ),
    }
    match (derived(gas.is_some()), gas.is_some()) {
        (Some(k), _) => im.from_key("training.grad_accum", k),
        (None, true) => {
            im.from_either("training.grad_accum", "--grad-accum", a.grad_accum.is_some(), "gradient_accumulation_steps")
        }
        (None, false) => im.from_text("training.grad_accum", "key `gradient_accumulation_steps` (absent: 1)".into()),
    }
    let (micro, gas) = match (micro, gas, global) {
        (Some(m), Some(g), Some(t)) if wide(&[m, g, dp_guess]) != t as u128 => {
            return Err(err(
                "train_batch_size",
                format!("{t} != train_micro_batch_size_per_gpu {m} x gradient_accumulation_steps {g} x data-parallel size {dp_guess} (= {}), as DeepSpeed checks", wide(&[m, g, dp_guess])),
            ))
        }
        (Some(m), Some(g), _) => (m, g),
        (Some(m), None, Some(t)) => (m, divide(t, wide(&[m, dp_guess])).ok_or_else(|| err("train_batch_size", format!("{t} is not a multiple of train_micro_batch_size_per_gpu {m} x data-parallel size {dp_guess}")))?),
        (None, Some(g), Some(t)) => (divide(t, wide(&[g, dp_guess])).ok_or_else(|| err("train_batch_size", format!("{t} is not a multiple of gradient_accumulation_steps {g} x data-parallel size {dp_guess}")))?, g),
        (Some(m), None, None) => (m, 1),
        (None, None, Some(t)) => (divide(t, dp_guess as u128).ok_or_else(|| err("train_batch_size", format!("{t} is not a multiple of the data-parallel size {dp_guess}")))?, 1),
        (None, _, None) => {
            return Err(err(
                "train_micro_batch_size_per_gpu",
                "missing, and so is train_batch_size: give one in the config or --micro-batch".into(),
            ))
        }
    };
    im.mapped.push(format!(
        "batch: train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {gas} x {dp_guess} GPUs = train_batch_size {}",
        wide(&[micro, gas, dp_guess])
    ));
    // --- precision
    let enabled = |k: &str| -> Result<bool, ImportError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Object(s)) => match s.get("enabled") {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(Value::String(x)) if x == "auto" => match a.dtype.as_deref() {
                    Some(d) => Ok(d == k || (k == "bfloat16" && d == "bf16")),
                    None => Err(err(
                        &format!("{k}.enabled"),
                        "\"auto\" is filled in by the Hugging Face Trainer from --bf16 / --fp16; give --dtype bf16, fp16 or fp32".into(),
                    )),
                },
                Some(x) => Err(err(&format!("{k}.enabled"), format!("must be true or false, got {x}"))),
            },
            Some(x) => Err(err(k, format!("must be an object ({{\"enabled\": true}}), got {x}"))),
        }
    };
    let (bf16, fp16) = (enabled("bf16")? || enabled("bfloat16")?, enabled("fp16")?);
    if bf16 || fp16 {
        im.from_key("training.precision", if fp16 { "fp16.enabled" } else { "bf16.enabled" });
    }
    if bf16 && fp16 {
        return Err(err("fp16.enabled", "bf16 and fp16 are both enabled; DeepSpeed refuses that too".into()));
    }
    let zero = match o.get("zero_optimization") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(z)) => z.clone(),
        Some(x) => return Err(err("zero_optimization", format!("must be an object, got {x}"))),
    };
    let stage = match zero.get("stage") {
        None | Some(Value::Null) => 0,
        Some(x) => match x.as_u64() {
            Some(s) if s <= 3 => s,
            _ => return Err(err("zero_optimization.stage", format!("must be 0, 1, 2 or 3, got {x}"))),
        },
    };
    let grad_accum_fp32 = match o.get("data_types").and_then(|d| d.get("grad_accum_dtype")) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "fp32" || s == "float32" => true,
        Some(Value::String(s)) if ["bf16", "bfloat16", "fp16", "float16"].contains(&s.as_str()) => false,
        Some(x) => {
            return Err(err("data_types.grad_accum_dtype", format!("must be \"fp32\", \"bf16\" or \"fp16\", got {x}")))
        }
    };
    let mut training_extra = String::new();
    let preset = if bf16 {
        let bf16_optimizer = stage == 0 || (stage == 1 && grad_accum_fp32);
        if bf16_optimizer {
            im.mapped.push(format!(
                "precision: bf16 with ZeRO stage {stage}{}: DeepSpeed's BF16_Optimizer (FP32 gradient accumulation), preset bf16-mixed-adam-fp32-grads",
                if stage == 1 { " and data_types.grad_accum_dtype fp32" } else { "" }
            ));
            "bf16-mixed-adam-fp32-grads"
        } else {
            im.mapped.push("precision: bf16.enabled: BF16 weights and gradients, FP32 master and Adam moments (preset bf16-mixed-adam)".into());
            "bf16-mixed-adam"
        }
    } else if fp16 {
        im.mapped.push("precision: fp16.enabled: FP16 weights and gradients, FP32 master and Adam moments (bf16-mixed-adam with fp16 dtypes; the loss scaler's few floats are not counted)".into());
        training_extra.push_str("param_dtype = \"fp16\"\ncompute_dtype = \"fp16\"\ngrad_dtype = \"fp16\"\n");
        for field in ["training.param_dtype", "training.compute_dtype", "training.grad_dtype"] {
            im.from_key(field, "fp16.enabled");
        }
        "bf16-mixed-adam"
    } else {
        im.mapped.push("precision: neither bf16 nor fp16 enabled: FP32 throughout (preset fp32)".into());
        "fp32"
    };
    // --- ZeRO
    let sharding = ["none", "zero1", "zero2", "zero3"][stage as usize];
    if stage == 0 && bf16 {
        // BF16 without ZeRO is BF16_Optimizer, which partitions the FP32 master and moments
        // over data parallelism: stepsim's zero1 with FP32 gradients is the same optimizer.
        im.mapped.push("zero_optimization.stage 0 with bf16: BF16_Optimizer partitions the FP32 master and moments over data parallelism, simulated as sharding \"zero1\" (DeepSpeed picks the same optimizer there)".into());
    } else {
        im.mapped.push(format!("zero_optimization.stage {stage}: sharding \"{sharding}\" under DeepSpeed's semantics"));
    }
    let sharding = if stage == 0 && bf16 { "zero1" } else { sharding };
    im.from_key("parallel.sharding", "zero_optimization.stage");
    let mut ds = String::new();
    let mut no_ipg = false;
    for key in ["reduce_bucket_size", "allgather_bucket_size", "sub_group_size"] {
        match zero.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "auto" => {
                im.assumed.push(format!("zero_optimization.{key} \"auto\": DeepSpeed's default (the Trainer sets it from the model's hidden size; give a number to use it)"));
            }
            Some(x) => match x.as_f64() {
                // A bucket of 0 elements: DeepSpeed reduces each gradient on its own, with no
                // flat IPG buffer (stage3.py: a gradient larger than the bucket is not copied
                // into it), which is stepsim's contiguous_gradients = false.
                Some(n) if n == 0.0 && key == "reduce_bucket_size" => {
                    no_ipg = true;
                    im.mapped.push("zero_optimization.reduce_bucket_size 0: every gradient reduced on its own, no IPG buffer (contiguous_gradients = false)".into());
                }
                // More elements than any partition can hold (stepsim's bound, 2^40): one
                // sub-group of the whole partition, as DeepSpeed does.
                Some(n) if key == "sub_group_size" && n > MAX_ELEMENTS => {
                    im.from_key(&format!("deepspeed.{key}"), &format!("zero_optimization.{key}"));
                    ds.push_str(&format!("{key} = {MAX_ELEMENTS:e}\n"));
                    im.mapped.push(format!("zero_optimization.sub_group_size {n:e}: more than any partition, so one sub-group of the whole partition (written as 2^40, stepsim's bound)"));
                }
                Some(n) if n > 0.0 => {
                    im.from_key(&format!("deepspeed.{key}"), &format!("zero_optimization.{key}"));
                    ds.push_str(&format!("{key} = {n:e}\n"));
                    im.mapped.push(format!("zero_optimization.{key} {n:e} elements"));
                }
                _ => {
                    return Err(err(
                        &format!("zero_optimization.{key}"),
                        format!("must be a number of elements (>= 0), got {x}"),
                    ))
                }
            },
        }
    }
    // ZeRO-3's fetch knobs: 0 is a valid setting of each (no prefetch, no reuse, nothing
    // persistent).
    for key in [
        "stage3_prefetch_bucket_size",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_param_persistence_threshold",
    ] {
        match zero.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "auto" => {
                im.assumed.push(format!("zero_optimization.{key} \"auto\": DeepSpeed's default (the Trainer sets it from the model's hidden size; give a number to use it)"));
            }
            Some(x) => match x.as_f64() {
                Some(n) if (0.0..=MAX_ELEMENTS).contains(&n) => {
                    // The Trainer writes 0.9 x hidden^2 for the prefetch bucket, which need
                    // not be whole: stepsim takes the integer part (an element more or less).
                    let whole = match n.trunc() {
                        0.0 => "0".to_string(),
                        w => format!("{w:e}"),
                    };
                    im.from_key(&format!("deepspeed.{key}"), &format!("zero_optimization.{key}"));
                    ds.push_str(&format!("{key} = {whole}\n"));
                    im.mapped.push(format!("zero_optimization.{key} {whole} elements"));
                }
                _ => {
                    return Err(err(
                        &format!("zero_optimization.{key}"),
                        format!("must be a number of elements from 0 to 2^40, or \"auto\", got {x}"),
                    ))
                }
            },
        }
    }
    match &a.version {
        Some(v) => {
            im.from_flag("deepspeed.version", "--deepspeed-version");
            ds.push_str(&format!("version = {}\n", super::quote(v)));
            im.mapped.push(format!("--deepspeed-version {v}: [deepspeed] version"));
        }
        None => im.assumed.push(format!(
            "DeepSpeed {} (stepsim's default; --deepspeed-version gives the job's: before 0.8 initialisation leaves the parameters' blocks in PyTorch's cache, before 0.13.2 Adam's moments exist from initialisation)",
            crate::plan::DeepspeedConfig::default().version_name()
        )),
    }
    for key in ["contiguous_gradients", "overlap_comm"] {
        match zero.get(key) {
            _ if key == "contiguous_gradients" && no_ipg => {
                im.from_key("deepspeed.contiguous_gradients", "zero_optimization.reduce_bucket_size");
                ds.push_str("contiguous_gradients = false\n")
            }
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => {
                im.from_key(&format!("deepspeed.{key}"), &format!("zero_optimization.{key}"));
                ds.push_str(&format!("{key} = {b}\n"));
                im.mapped.push(format!("zero_optimization.{key} {b}"));
            }
            Some(x) => return Err(err(&format!("zero_optimization.{key}"), format!("must be true or false, got {x}"))),
        }
    }
    // --- offload
    let mut offload = String::new();
    for (key, field) in [("offload_optimizer", "optimizer"), ("offload_param", "parameters")] {
        let dev = match zero.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(x)) => x.get("device").cloned().unwrap_or(Value::Null),
            Some(x) => return Err(err(&format!("zero_optimization.{key}"), format!("must be an object, got {x}"))),
        };
        match dev {
            Value::String(d) if ["cpu", "nvme", "none"].contains(&d.as_str()) => {
                if d != "none" {
                    im.from_key(&format!("offload.{field}"), &format!("zero_optimization.{key}.device"));
                    offload.push_str(&format!("{field} = \"{d}\"\n"));
                    im.mapped.push(format!("zero_optimization.{key}.device \"{d}\""));
                }
            }
            Value::Null => {}
            x => {
                return Err(err(
                    &format!("zero_optimization.{key}.device"),
                    format!("must be \"cpu\", \"nvme\" or \"none\", got {x}"),
                ))
            }
        }
    }
    // The old spelling of offload_optimizer.device = "cpu".
    if zero.get("cpu_offload") == Some(&Value::Bool(true)) && !offload.contains("optimizer") {
        im.from_key("offload.optimizer", "zero_optimization.cpu_offload");
        offload.push_str("optimizer = \"cpu\"\n");
        im.mapped
            .push("zero_optimization.cpu_offload true (the old spelling of offload_optimizer.device \"cpu\")".into());
    }
    for (k, why) in ZERO_NOT_EXPRESSED {
        if zero.get(*k).is_some_and(|x| !x.is_null()) {
            im.not_expressed.push(format!("zero_optimization.{k}: {why}"));
        }
    }
    for (k, why) in ZERO_NO_EFFECT {
        if zero.contains_key(*k) {
            im.ignored.push(format!("zero_optimization.{k} ({why})"));
        }
    }
    let known_zero = [
        "stage",
        "reduce_bucket_size",
        "allgather_bucket_size",
        "sub_group_size",
        "stage3_prefetch_bucket_size",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_param_persistence_threshold",
        "contiguous_gradients",
        "overlap_comm",
        "offload_optimizer",
        "offload_param",
        "cpu_offload",
    ];
    for k in zero.keys() {
        let listed = known_zero.contains(&k.as_str())
            || ZERO_NOT_EXPRESSED.iter().any(|x| x.0 == k)
            || ZERO_NO_EFFECT.iter().any(|x| x.0 == k);
        if !listed {
            im.not_expressed.push(format!("zero_optimization.{k}: not read by stepsim"));
        }
    }
    // --- optimizer
    let optimizer = match o.get("optimizer").and_then(|x| x.get("type")) {
        None | Some(Value::Null) => {
            im.assumed.push("optimizer: none in the config (the script builds its own): AdamW assumed".into());
            im.from_text("training.optimizer", "the import's assumption of AdamW (the config has no optimizer)".into());
            "adamw"
        }
        Some(Value::String(t)) => {
            im.from_key("training.optimizer", "optimizer.type");
            match t.to_ascii_lowercase().as_str() {
                "adam" | "adamw" | "fusedadam" | "cpuadam" | "deepspeedcpuadam" => {
                    im.mapped.push(format!("optimizer.type {t}: AdamW (two FP32 moments)"));
                    "adamw"
                }
                "sgd" => {
                    im.mapped.push("optimizer.type SGD".into());
                    "sgd"
                }
                _ => {
                    im.not_expressed
                        .push(format!("optimizer.type {t}: only Adam, AdamW and SGD are modelled; AdamW assumed"));
                    "adamw"
                }
            }
        }
        Some(x) => return Err(err("optimizer.type", format!("must be a string, got {x}"))),
    };
    // --- activation checkpointing: the config tunes DeepSpeed's checkpointing API, which
    // only a model that calls deepspeed.checkpointing.checkpoint uses.
    if let Some(Value::Object(ac)) = o.get("activation_checkpointing") {
        for (k, v) in ac {
            if v.as_bool() == Some(true) && (k == "partition_activations" || k == "cpu_checkpointing") {
                im.not_expressed.push(format!(
                    "activation_checkpointing.{k}: DeepSpeed's partitioned / CPU checkpoints are not modelled"
                ));
            }
        }
    }
    im.assumed.push(format!(
        "activation checkpointing \"{}\" (--checkpointing): whether the model checkpoints is decided by its code, not by ds_config.json",
        a.checkpointing
    ));
    for (k, why) in NO_EFFECT {
        if o.contains_key(*k) {
            im.ignored.push(format!("{k} ({why})"));
        }
    }
    let known = [
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "bf16",
        "bfloat16",
        "fp16",
        "zero_optimization",
        "data_types",
        "optimizer",
        "activation_checkpointing",
    ];
    for k in o.keys() {
        if !known.contains(&k.as_str()) && !NO_EFFECT.iter().any(|x| x.0 == k) {
            im.not_expressed.push(format!("{k}: not read by stepsim"));
        }
    }
    // --- the scenario
    im.from_flag("training.seq_len", "--seq-len");
    im.from_flag("training.activation_checkpointing", "--checkpointing");
    im.from_flag("hardware.gpus", "--gpus");
    super::flag_origins(&mut im, Some(&a.model));
    let mut t = String::new();
    let description = format!("imported from {file} ({} x {}, ZeRO stage {stage})", a.gpus, a.gpu);
    t.push_str(&format!("description = {}\n\n", super::quote(&description)));
    t.push_str(&format!("[model]\n{}\n", a.model.toml()));
    t.push_str(&format!("\n[hardware]\ngpu = {}\ngpus = {}\n", super::quote(&a.gpu), a.gpus));
    if let Some(n) = a.gpus_per_node {
        t.push_str(&format!("gpus_per_node = {n}\n"));
    }
    t.push_str(&format!("\n[parallel]\nframework = \"deepspeed\"\nsharding = \"{sharding}\"\n"));
    t.push_str(&format!(
        "\n[training]\nmicro_batch = {micro}\nseq_len = {}\ngrad_accum = {gas}\noptimizer = \"{optimizer}\"\nprecision = \"{preset}\"\n{training_extra}activation_checkpointing = \"{}\"\n",
        a.seq_len, a.checkpointing
    ));
    if !ds.is_empty() {
        t.push_str(&format!("\n[deepspeed]\n{ds}"));
    }
    if !offload.is_empty() {
        t.push_str(&format!("\n[offload]\n{offload}"));
    }
    im.toml = t;
    Ok(im)
}

/// stepsim's bound on a bucket or sub-group, elements (`[deepspeed]`'s validation).
const MAX_ELEMENTS: f64 = (1u64 << 40) as f64;

fn divide(a: u64, b: u128) -> Option<u64> {
    let a = a as u128;
    (b > 0 && a % b == 0 && a / b > 0).then(|| (a / b) as u64)
}

/// A product of counts, in u128 so no input can wrap it.
fn wide(xs: &[u64]) -> u128 {
    xs.iter().fold(1u128, |p, &x| p.saturating_mul(x as u128))
}
