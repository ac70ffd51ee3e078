//! A fuzzer of scenario files (issue 22): shipped scenarios with one or two fields mutated
//! to extreme values, wrong types and control characters, each run through the real binary
//! (`run`, or `explain`), checking the exit-code contract (0 or 2, never a panic's 101),
//! a time bound, and on exit 0 the report's own invariants and the same files, byte for
//! byte, from `run --every-period` (the periodic extrapolation, src/engine/period.rs, is
//! exact) or, for `explain`, from itself on one thread (its changes run in parallel); a `run`
//! that exits 0 is run again as a sweep of one configuration, whose row (the lean path) must
//! say what the full report says.
//!
//! A second test does the same for sweep files (extreme axis values, 10^9-configuration
//! products, deep and overflowing filters, bad flags) and for `sweep merge` of damaged shards
//! (a row lost, repeated, swapped or edited, a cut table, a deleted or cut manifest): every
//! damage must be refused with nothing written. Every case is bounded to 30 s and 4 GB
//! resident (read from /proc on Linux).
//!
//! A third sets one to three fields to values a user would write (`PLAUSIBLE`), so that most
//! of its cases run and the report's invariants, against memory.csv too, are checked on many
//! running jobs rather than on refusals. A fourth sets two to six sizes at their stated limits
//! together (`LIMITS`), where products of sizes that each pass can leave 64 bits.
//!
//! `cargo test --release --test fuzz` runs a short fixed-seed campaign (as CI does);
//! `STEPSIM_FUZZ_CASES=10000 STEPSIM_FUZZ_PLAUSIBLE=5000 STEPSIM_FUZZ_LIMITS=1000 STEPSIM_FUZZ_SWEEPS=2000 STEPSIM_FUZZ_SEED=7 cargo test --release --test fuzz -- --nocapture`
//! runs a long one and prints its counts (`STEPSIM_FUZZ_SHOW=1` prints each case's exit and
//! last line of stderr).

mod common;

use std::path::Path;
use std::time::Duration;

use common::fuzzing::{campaign_size, run_bounded, run_bounded_with, Outcome};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Small shipped scenarios (a case must run in seconds), one of each kind of job.
const BASES: &[&str] = &[
    "gpt-1.3b-1gpu.toml",
    "100b-8gpu-fsdp.toml",
    "gpt-13b-pp4-1f1b.toml",
    "100b-1gpu-int4-inference.toml",
    "llama2-70b-lora-8gpu.toml",
    "fragmentation-oom.toml",
    "megatron-70b-h100-overlap.toml",
    "mixtral-8x7b-h100-ep8.toml",
    "mixtral-8x7b-h100-ep8-hot-expert.toml",
    "llama2-7b-h100-fp8.toml",
    "qwen3-30b-a3b-h100-ep16-deepep.toml",
    "qwen3-30b-a3b-h100-pp4-dualpipe.toml",
    "100b-8gpu-zero3-offload.toml",
    "llama2-70b-qlora-1gpu.toml",
    CUSTOM_GPU_BASE,
];

/// A base that is not a shipped file: gpt-1.3b-1gpu.toml on `gpu = "custom"` (an RTX A6000 by
/// its datasheet, docs/scenario-format.md's example), so that `[hardware.custom]`'s fields are
/// mutated on a file that runs.
const CUSTOM_GPU_BASE: &str = "gpt-1.3b-1gpu.toml on a custom GPU";

/// The text of a base.
fn base_text(root: &Path, name: &str) -> String {
    if name != CUSTOM_GPU_BASE {
        return std::fs::read_to_string(root.join("scenarios").join(name)).unwrap();
    }
    let mut text = std::fs::read_to_string(root.join("scenarios/gpt-1.3b-1gpu.toml")).unwrap();
    text = mutate(&text, "hardware", "gpu", "\"custom\"");
    for (key, val) in [
        ("name", "\"rtx-a6000\""),
        ("memory", "51527024640"),
        ("bf16_tflops", "154.8"),
        ("tf32_tflops", "77.4"),
        ("fp32_tflops", "38.7"),
        ("hbm_gb_per_s", "768"),
        ("nvlink_gb_per_s", "31"),
        ("sms", "84"),
    ] {
        text = mutate(&text, "hardware.custom", key, val);
    }
    text
}

/// Numeric and enum fields a user sets, by section.
const FIELDS: &[(&str, &str)] = &[
    ("model", "n_layers"),
    ("model", "hidden"),
    ("model", "n_heads"),
    ("model", "n_kv_heads"),
    ("model", "vocab"),
    ("model", "max_seq_len"),
    ("model", "ffn_hidden"),
    ("model", "dropout"),
    ("model", "head_dim"),
    ("model", "name"),
    ("model", "qkv_bias"),
    ("hardware", "gpus"),
    ("hardware", "gpus_per_node"),
    ("hardware", "memory_capacity"),
    ("hardware", "cuda_context"),
    ("hardware", "nic_gbps"),
    ("parallel", "tensor"),
    ("parallel", "pipeline"),
    ("parallel", "virtual_stages"),
    ("parallel", "bucket_cap_mb"),
    ("parallel", "sharding"),
    ("parallel", "framework"),
    ("parallel", "expert"),
    ("parallel", "context"),
    ("parallel", "no_sync"),
    ("parallel", "hsdp_shard_size"),
    ("parallel", "context_rotate"),
    ("parallel", "context_comm"),
    ("parallel", "async_tp"),
    ("parallel", "expert_tensor"),
    ("parallel", "wrap"),
    ("parallel", "use_orig_params"),
    ("model.mtp", "layers"),
    ("model.mtp", "loss_scale"),
    ("offload", "parameters"),
    ("model.moe", "num_experts"),
    ("model.moe", "top_k"),
    ("model.moe", "expert_ffn_hidden"),
    ("model.moe", "shared_expert_ffn_hidden"),
    ("model.moe", "first_dense_layers"),
    ("model.moe", "every"),
    ("model.moe", "offset"),
    ("model.moe", "dense_layers"),
    ("moe", "routing"),
    ("moe", "zipf_exponent"),
    ("moe", "seed"),
    ("moe", "tokens_per_expert"),
    ("moe", "capacity_factor"),
    ("moe", "pad_to_capacity"),
    ("moe", "dispatcher"),
    ("moe", "deepep_sms"),
    ("moe", "aux_loss"),
    ("model.moe", "router_groups"),
    ("model.moe", "router_group_topk"),
    ("fp8", "recipe"),
    ("fp8", "wgrad"),
    ("fp8", "amax_history_len"),
    ("fp8", "fsdp_all_gather"),
    ("megatron", "overlap_grad_reduce"),
    ("megatron", "overlap_param_gather"),
    ("megatron", "tp_comm_overlap"),
    ("megatron", "overlap_moe_expert_parallel_comm"),
    ("megatron", "ddp_bucket_size"),
    ("megatron", "use_precision_aware_optimizer"),
    ("megatron", "main_grads_dtype"),
    ("megatron", "main_params_dtype"),
    ("megatron", "exp_avg_dtype"),
    ("megatron", "exp_avg_sq_dtype"),
    ("megatron", "offload_modules"),
    ("megatron", "min_offloaded_tensor_size"),
    ("megatron", "activation_offload_fraction"),
    ("megatron", "activation_func_fp8_input_store"),
    ("megatron", "store_param_remainders"),
    ("deepspeed", "reduce_bucket_size"),
    ("deepspeed", "sub_group_size"),
    ("deepspeed", "version"),
    ("deepspeed", "stage3_prefetch_bucket_size"),
    ("deepspeed", "stage3_max_live_parameters"),
    ("deepspeed", "stage3_max_reuse_distance"),
    ("deepspeed", "stage3_param_persistence_threshold"),
    ("training", "micro_batch"),
    ("training", "seq_len"),
    ("training", "grad_accum"),
    ("training", "steps"),
    ("training", "activation_checkpointing"),
    ("training", "checkpoint_every"),
    ("training", "recompute_method"),
    ("training", "recompute_num_layers"),
    ("training", "loss"),
    ("training", "activation_offload"),
    ("training", "activation_offload_layers"),
    ("training", "recompute_modules"),
    ("training", "attention"),
    ("allocator", "max_split_size_mb"),
    ("allocator", "roundup_power2_divisions"),
    ("jitter", "seed"),
    ("jitter", "compute_cv"),
    ("jitter", "stragglers"),
    ("inference", "batch"),
    ("inference", "prompt_len"),
    ("inference", "gen_len"),
    ("inference", "group_size"),
    ("inference", "weights"),
    ("inference", "kv_cache_dtype"),
    ("model", "tie_embeddings"),
    ("model", "qk_norm"),
    ("model", "family"),
    ("model.moe", "shared_expert_gate"),
    ("model.mla", "q_lora_rank"),
    ("model.mla", "kv_lora_rank"),
    ("model.mla", "qk_nope_head_dim"),
    ("model.mla", "qk_rope_head_dim"),
    ("model.mla", "v_head_dim"),
    ("hardware", "nics_per_node"),
    ("hardware", "nvlink_gb_per_s"),
    ("hardware.custom", "memory"),
    ("hardware.custom", "fp32_tflops"),
    ("hardware.custom", "hbm_gb_per_s"),
    ("hardware.custom", "nvlink_gb_per_s"),
    ("hardware.custom", "sms"),
    ("hardware.custom", "bf16_tflops"),
    ("hardware.custom", "max_matmul_fraction"),
    ("hardware.custom", "pcie_gen"),
    ("parallel", "reshard_after_forward"),
    ("parallel", "stage_layers"),
    ("parallel", "schedule"),
    ("parallel", "sequence_parallel"),
    ("deepspeed", "allgather_bucket_size"),
    ("offload", "optimizer"),
    ("offload", "cpu_memory"),
    ("offload", "nvme_capacity"),
    ("offload", "h2d_gb_per_s"),
    ("offload", "cpu_adam_params_per_s"),
    ("lora", "rank"),
    ("lora", "alpha"),
    ("lora", "dropout"),
    ("lora", "prepare_kbit_training"),
    ("allocator", "cublas_workspace"),
    ("allocator", "nccl_buffers"),
    ("jitter", "straggler_slowdown"),
    ("training", "optimizer"),
    ("training", "precision"),
    ("training", "kernels"),
];

/// Values the campaign writes (TOML text).
const VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "64",
    "1024",
    "65536",
    "2147483648",
    "4294967296",
    "9007199254740992",
    "9223372036854775807",
    "-9223372036854775808",
    "1e30",
    "-1e30",
    "0.5",
    "nan",
    "inf",
    "-inf",
    "\"x\"",
    "\"zipf\"",
    "\"measured\"",
    "\"delayed\"",
    "\"tensorwise\"",
    "\"rowwise\"",
    "\"blockwise\"",
    "\"mxfp8\"",
    "\"selective-op\"",
    "\"full\"",
    "\"block\"",
    "\"fused-linear\"",
    "\"overlapped\"",
    "\"synchronous\"",
    "\"alltoall\"",
    "\"deepep\"",
    "\"a2a\"",
    "\"gemma-2-9b\"",
    "\"gemma-3-1b\"",
    "\"pythia-6.9b\"",
    "\"olmo-2-7b\"",
    "\"gpt-oss-20b\"",
    "\"deepseek-v3\"",
    "\"fp8\"",
    "\"0.6\"",
    "\"0.13.2\"",
    "\"0.17\"",
    "\"fp16\"",
    "\"bf16\"",
    "\"cpu\"",
    "\"cudnn\"",
    "\"eager\"",
    "\"flash_attention_3\"",
    "[1, 2, 3, 4, 5, 6, 7, 8]",
    "[\"layernorm\", \"moe_act\"]",
    "[\"core_attn\", \"attn_proj\", \"expert_fc1\", \"moe_act\"]",
    "[\"attn_norm\", \"qkv_linear\", \"mlp_norm\"]",
    "\"\\u0000\"",
    "\"a\\rb\"",
    "true",
    "[]",
    "{}",
];

/// The report's invariants, on a run that exited 0.
fn check_report(r: &serde_json::Value) -> Result<(), String> {
    let bytes = |v: &serde_json::Value| v.get("bytes").and_then(|b| b.as_u64());
    if let Some(p) = r.get("peak").filter(|p| !p.is_null()) {
        let (a, res) = (bytes(&p["allocated"]), bytes(&p["reserved"]));
        let (Some(a), Some(res)) = (a, res) else { return Err("peak without bytes".into()) };
        if a > res {
            return Err(format!("peak allocated {a} > reserved {res}"));
        }
        for c in p["breakdown"].as_array().into_iter().flatten() {
            if bytes(c).is_none_or(|b| b > a) {
                return Err(format!("a category above the peak: {c}"));
            }
        }
        let cap = bytes(&r["capacity"]).unwrap_or(0);
        if r["verdict"]["verdict"] == "fits" && res > cap {
            return Err(format!("fits with {res} reserved over capacity {cap}"));
        }
    }
    let ms = &r["model_state_per_gpu"];
    if let Some(total) = bytes(&ms["total"]) {
        for k in ["parameters", "master_weights", "gradients", "optimizer_state"] {
            if bytes(&ms[k]).is_some_and(|b| b > total) {
                return Err(format!("model state {k} above its total"));
            }
        }
    }
    if let Some(t) = r.get("throughput").filter(|t| !t.is_null()) {
        let s = t["step_time_s"].as_f64().unwrap_or(f64::NAN);
        if !(s.is_finite() && s > 0.0) {
            return Err(format!("step time {s}"));
        }
    }
    Ok(())
}

/// The report's peak against its own parts and its memory timeline, on a run that exited 0:
/// the peak's breakdown sums to its allocated bytes; the peak is one rank class's largest
/// allocated sample in memory.csv; a job that fits never reserves over capacity, and its
/// headline class is the one that reserves most (report::job::headline's rule). Host rows,
/// for offload, are the node's memory and left out.
fn check_memory_csv(r: &serde_json::Value, out: &Path) -> Result<(), String> {
    let Some(p) = r.get("peak").filter(|p| !p.is_null()) else { return Ok(()) };
    let bytes = |v: &serde_json::Value| v.get("bytes").and_then(|b| b.as_u64()).unwrap_or(0);
    let (allocated, reserved) = (bytes(&p["allocated"]), bytes(&p["reserved"]));
    let parts: u64 = p["breakdown"].as_array().into_iter().flatten().map(bytes).sum();
    if parts != allocated {
        return Err(format!("the peak's breakdown sums to {parts}, its allocated bytes are {allocated}"));
    }
    let csv = std::fs::read_to_string(out.join("memory.csv")).map_err(|e| format!("no memory.csv: {e}"))?;
    // Each GPU rank class's largest allocated and reserved samples.
    let mut classes: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for line in csv.lines().skip(1) {
        // time_s,rank_class,category,bytes; a rank class with a comma is quoted.
        let f: Vec<&str> = line.rsplitn(3, ',').collect();
        let [b, category, time_class] = f[..] else { return Err(format!("memory.csv row {line:?}")) };
        let class = time_class.split_once(',').map_or("", |(_, c)| c);
        if class.trim_start_matches('"').starts_with("host") {
            continue;
        }
        let b: u64 = b.parse().map_err(|_| format!("memory.csv row {line:?}"))?;
        let most = classes.entry(class).or_default();
        match category {
            "allocated" => most.0 = most.0.max(b),
            "reserved" => most.1 = most.1.max(b),
            _ => {}
        }
    }
    if !classes.values().any(|&(a, _)| a == allocated) {
        return Err(format!(
            "the peak, {allocated} allocated, is no rank class's largest sample in memory.csv: {classes:?}"
        ));
    }
    let most_reserved = classes.values().map(|&(_, res)| res).max().unwrap_or(0);
    let cap = bytes(&r["capacity"]);
    if r["verdict"]["verdict"] == "fits" {
        if most_reserved > cap {
            return Err(format!("fits, but memory.csv reserves {most_reserved} of capacity {cap}"));
        }
        if most_reserved != reserved {
            return Err(format!("the headline reserves {reserved} at its peak, memory.csv's most is {most_reserved}"));
        }
    }
    Ok(())
}

/// A sweep's one row against the full report of the same job: the verdict, where it ran out
/// of memory, the peak's allocated and reserved bytes and the step time, each as sweep.csv
/// writes it (GB to 3 decimals, seconds to 6).
fn same_as_the_report(json: &str, csv: &str) -> Result<(), String> {
    let r: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("report.json: {e}"))?;
    let mut lines = csv.lines();
    let (Some(header), Some(row)) = (lines.next(), lines.next()) else { return Err(format!("sweep.csv: {csv:?}")) };
    let cell = |name: &str| {
        let k = header.split(',').position(|h| h == name)?;
        row.split(',').nth(k)
    };
    let gb = |v: &serde_json::Value| v["bytes"].as_u64().map(|b| format!("{:.3}", b as f64 / 1e9));
    let v = &r["verdict"];
    let at = |k: &str| match &v[k] {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        x => x.to_string(),
    };
    // Offloaded state the node's host memory or NVMe cannot hold fails at initialisation
    // whatever the GPU's verdict: a sweep's row says OOM at init (src/sweep/summary.rs).
    let node_fails = ["host_fits", "nvme_fits"].iter().any(|k| r["offload"][k] == false);
    let mut want = vec![];
    if at("verdict") == "oom" {
        want.extend([("verdict", at("verdict")), ("oom_step", at("step")), ("oom_phase", at("phase"))]);
        want.push(("oom_layer", at("layer")));
    } else if node_fails {
        want.extend([("verdict", "oom".into()), ("oom_step", "0".into()), ("oom_phase", "init".into())]);
        want.push(("step_time_s", String::new()));
    } else {
        want.push(("verdict", at("verdict")));
    }
    if let Some(p) = r.get("peak").filter(|p| !p.is_null()) {
        want.extend(gb(&p["allocated"]).map(|g| ("peak_allocated_gb", g)));
        want.extend(gb(&p["reserved"]).map(|g| ("peak_reserved_gb", g)));
    }
    if let Some(t) = r["throughput"]["step_time_s"].as_f64().filter(|_| !node_fails) {
        want.push(("step_time_s", format!("{t:.6}")));
    }
    for (name, value) in want {
        match cell(name) {
            Some(c) if c == value => {}
            c => return Err(format!("{name}: the sweep has {c:?}, the report {value:?}")),
        }
    }
    Ok(())
}

/// What `run` writes.
const OUTPUTS: &[&str] = &["report.json", "memory.csv", "trace.json", "memory.png", "timeline.png"];

fn run_case(file: &Path, out: &Path, explain: bool, limit: Duration) -> Outcome {
    let cmd = if explain { "explain" } else { "run" };
    let mut o = run_bounded(&[cmd, file.to_str().unwrap(), "--out", out.to_str().unwrap()], limit);
    if o.problem.is_none() {
        let code = o.code;
        let err = &o.stderr;
        o.problem = match code {
            Some(0) => std::fs::read_to_string(out.join("report.json"))
                .map_err(|e| format!("exit 0 without report.json: {e}"))
                .and_then(|j| serde_json::from_str(&j).map_err(|e| format!("report.json does not parse: {e}")))
                .and_then(|r| check_report(&r).and_then(|()| check_memory_csv(&r, out)))
                .err(),
            _ if code == Some(2) && out.join("report.json").exists() => {
                Some(format!("exit 2 but report.json was written ({})", err.trim()))
            }
            _ => None,
        };
    }
    o
}

/// Sets `section.key = value` in a TOML text (the value written as given; `section` may be
/// dotted).
fn mutate(base: &str, section: &str, key: &str, value: &str) -> String {
    let mut doc: toml::Table = toml::from_str(base).expect("shipped scenario parses");
    let v: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .map(|mut t| t.remove("v").unwrap())
        .unwrap_or_else(|_| toml::Value::String(value.to_string()));
    // A dotted section is a nested table (`model.moe`).
    let mut table = Some(&mut doc);
    for part in section.split('.') {
        table = table.and_then(|t| {
            t.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new())).as_table_mut()
        });
    }
    if let Some(t) = table {
        t.insert(key.to_string(), v);
    }
    toml::to_string(&doc).unwrap_or_else(|_| base.to_string())
}

/// Every base runs as it is: a base that is refused before any mutation would spend its share
/// of the campaign on refusals of one error.
#[test]
fn every_base_runs_unmutated() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    for (i, name) in BASES.iter().enumerate() {
        let file = dir.path().join(format!("base{i}.toml"));
        std::fs::write(&file, base_text(root, name)).unwrap();
        let o = run_case(&file, &dir.path().join(format!("out{i}")), false, Duration::from_secs(120));
        assert_eq!(o.code, Some(0), "{name}: {:?} {}", o.problem, o.stderr);
    }
}

/// A campaign's running tally: each case run through [`run_case`], the cases that ran (exit 0)
/// run again with `--every-period` (`run`) or on one thread (`explain`) and compared byte for
/// byte, and the problems found.
struct Campaign {
    dir: tempfile::TempDir,
    limit: Duration,
    cases: usize,
    ok: usize,
    refused: usize,
    checked_periods: usize,
    /// `explain` cases run again on one thread.
    checked_threads: usize,
    /// `run` cases run again as a sweep of one configuration.
    checked_sweeps: usize,
    slowest: (f64, String),
    largest: (u64, String),
    problems: Vec<String>,
}

impl Campaign {
    fn new() -> Campaign {
        Campaign {
            dir: tempfile::tempdir().unwrap(),
            limit: Duration::from_secs(30),
            cases: 0,
            ok: 0,
            refused: 0,
            checked_periods: 0,
            checked_threads: 0,
            checked_sweeps: 0,
            slowest: (0.0, String::new()),
            largest: (0, String::new()),
            problems: Vec::new(),
        }
    }

    /// Runs one scenario text (`run`, or `explain`), described as `case` in what it prints.
    fn case(&mut self, text: &str, explain: bool, case: String) {
        let i = self.cases;
        self.cases += 1;
        let file = self.dir.path().join(format!("case{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = self.dir.path().join(format!("out{i}"));
        let o = run_case(&file, &out, explain, self.limit);
        let case = format!("{case}{}", if explain { " (explain)" } else { "" });
        if std::env::var("STEPSIM_FUZZ_SHOW").is_ok() {
            println!("{:?} {case}: {}", o.code, o.stderr.lines().last().unwrap_or(""));
        }
        if o.seconds > self.slowest.0 {
            self.slowest = (o.seconds, case.clone());
        }
        if o.peak_rss > self.largest.0 {
            self.largest = (o.peak_rss, case.clone());
        }
        match o.code {
            Some(0) => self.ok += 1,
            Some(2) => self.refused += 1,
            _ => {}
        }
        if let Some(p) = o.problem {
            self.problems.push(format!("{case}: {p}"));
        } else if o.code == Some(0) {
            // A run again with every period simulated (src/engine/period.rs is exact); an
            // explain again on one thread (its changes are simulated in parallel, and the
            // answer must not depend on how many cores ran them). The same files, byte for byte.
            let again = self.dir.path().join(format!("again{i}"));
            let (f, a) = (file.to_str().unwrap(), again.to_str().unwrap());
            let (args, env, how): (Vec<&str>, &[(&str, &str)], &str) = if explain {
                self.checked_threads += 1;
                (vec!["explain", f, "--out", a], &[("RAYON_NUM_THREADS", "1")], "on one thread")
            } else {
                self.checked_periods += 1;
                (vec!["run", f, "--out", a, "--every-period"], &[], "with --every-period")
            };
            let r = run_bounded_with(&args, self.limit * 4, env);
            let files = OUTPUTS.iter().chain(&["explain.png"]);
            let differs =
                files.into_iter().find(|n| std::fs::read(out.join(n)).ok() != std::fs::read(again.join(n)).ok());
            if r.code != Some(0) || differs.is_some() {
                self.problems.push(format!(
                    "{case}: {how}: exit {:?}, {} differs",
                    r.code,
                    differs.unwrap_or(&"nothing")
                ));
            }
            let _ = std::fs::remove_dir_all(&again);
            if !explain {
                self.as_a_sweep(i, text, &file, &out, &case);
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }

    /// The case that ran again as a sweep of one configuration, which takes the lean path
    /// (no task named, no sample kept): its row must say what the full report said, to the
    /// digits the table prints. A sweep that refuses the job (exit 2) is not compared.
    fn as_a_sweep(&mut self, i: usize, text: &str, file: &Path, out: &Path, case: &str) {
        let doc: toml::Table = toml::from_str(text).unwrap();
        let Some(gpus) = section(&doc, "hardware").and_then(|h| h.get("gpus")).and_then(|g| g.as_integer()) else {
            return;
        };
        let spec = self.dir.path().join(format!("sweep{i}.toml"));
        let text = format!("name = \"one\"\nbase = {:?}\n[axes]\nhardware.gpus = [{gpus}]\n", file.to_str().unwrap());
        std::fs::write(&spec, text).unwrap();
        let swept = self.dir.path().join(format!("swept{i}"));
        let o = run_bounded(&["sweep", spec.to_str().unwrap(), "--out", swept.to_str().unwrap()], self.limit);
        if o.code == Some(0) {
            self.checked_sweeps += 1;
            let report = std::fs::read_to_string(out.join("report.json")).unwrap_or_default();
            let table = std::fs::read_to_string(swept.join("sweep.csv")).unwrap_or_default();
            if let Err(e) = same_as_the_report(&report, &table) {
                self.problems.push(format!("{case}: as a sweep of one: {e}"));
            }
        } else if let Some(p) = o.problem {
            self.problems.push(format!("{case}: as a sweep of one: {p}"));
        }
        let _ = std::fs::remove_dir_all(&swept);
    }

    /// Prints the tally and fails on any problem.
    fn finish(self, name: &str, seed: u64) {
        println!(
            "{name}: seed {seed}, {} cases: {} ran (exit 0; {} runs again with --every-period and {} as a sweep of one, {} explains again on one thread), {} refused (exit 2), {} problems; slowest {:.1} s: {}; most memory {:.2} GB: {}",
            self.cases,
            self.ok,
            self.checked_periods,
            self.checked_sweeps,
            self.checked_threads,
            self.refused,
            self.problems.len(),
            self.slowest.0,
            self.slowest.1,
            self.largest.0 as f64 / 1e9,
            self.largest.1
        );
        assert!(self.problems.is_empty(), "{}", self.problems.join("\n"));
    }
}

/// A campaign of `var` cases (`default` in `cargo test`) drawn from [`BASES`] with the seed
/// xor `salt`: `draw` mutates each base's text, saying what it did in `what`, and returns
/// whether the case is an `explain`; each case runs through [`Campaign::case`].
fn scenario_campaign(
    var: &str,
    default: usize,
    salt: u64,
    name: &str,
    mut draw: impl FnMut(&mut ChaCha8Rng, &mut String, &mut Vec<String>) -> bool,
) {
    let (cases, seed) = campaign_size(var, default);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ salt);
    let mut campaign = Campaign::new();
    for _ in 0..cases {
        let base_name = BASES[rng.random_range(0..BASES.len())];
        let mut text = base_text(root, base_name);
        let mut what = Vec::new();
        let explain = draw(&mut rng, &mut text, &mut what);
        campaign.case(&text, explain, format!("{base_name} [{}]", what.join(", ")));
    }
    campaign.finish(name, seed);
}

#[test]
fn mutated_scenarios_keep_the_exit_code_contract() {
    scenario_campaign("STEPSIM_FUZZ_CASES", 300, 0, "fuzz", |rng, text, what| {
        for _ in 0..rng.random_range(1..=2) {
            let (sec, key) = FIELDS[rng.random_range(0..FIELDS.len())];
            // Half the time a plausible size (the first nine values), so that many cases run.
            let val = if rng.random_bool(0.5) {
                VALUES[rng.random_range(0..9)]
            } else {
                VALUES[rng.random_range(0..VALUES.len())]
            };
            *text = mutate(text, sec, key, val);
            what.push(format!("{sec}.{key} = {val}"));
        }
        if rng.random_range(0..10) == 0 {
            // A control character in a comment.
            text.push_str("# \u{0}\r\n");
            what.push("NUL and CR in a comment".into());
        }
        rng.random_range(0..4) == 0
    });
}

/// The plausible campaign's seed 4600 found the full report and the sweep reading one job
/// two ways: ZeRO-Offload of the 100B model with 512 GB of host memory fits on each GPU, but
/// the node cannot hold its 1.62 TB of offloaded state, so the run fails at initialisation.
/// report.json's verdict is the GPU's, with `offload.host_fits` false; a sweep's row says OOM
/// at init. The comparison reads both by that rule.
#[test]
fn a_job_the_node_cannot_hold_is_an_oom_at_init_in_its_sweep() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = mutate(&base_text(root, "100b-8gpu-zero3-offload.toml"), "offload", "cpu_memory", "\"512GB\"");
    let mut campaign = Campaign::new();
    campaign.case(&text, false, "100b-8gpu-zero3-offload.toml [offload.cpu_memory = \"512GB\"]".into());
    assert_eq!((campaign.ok, campaign.checked_sweeps), (1, 1));
    campaign.finish("a job the node cannot hold", 0);
}

/// Sizes at or near their stated limits (docs/scenario-format.md, `scenario::limits`), drawn two
/// to six at a time: each field's limit is checked alone, but products of several sizes at
/// their limits can leave 64 bits where no single one does. (The first such campaign found a
/// micro-batch of 2^20 sequences through an MLP of 2^22 overflowing a GEMM's m x n x k, and
/// 2^22 experts of width 2^22 over a hidden state of 2^20 overflowing the parameter count.)
const LIMITS: &[(&str, &str, &[&str])] = &[
    ("model", "n_layers", &["1024", "1023", "512"]),
    ("model", "hidden", &["1048576", "1048574", "524288"]),
    ("model", "n_heads", &["65536", "32768", "1024"]),
    ("model", "n_kv_heads", &["1", "65536"]),
    ("model", "head_dim", &["1048576", "524288", "2"]),
    ("model", "ffn_hidden", &["4194304", "4194303"]),
    ("model", "vocab", &["16777216", "16777215"]),
    ("model", "max_seq_len", &["16777216"]),
    ("training", "seq_len", &["16777216", "4194304", "4096"]),
    ("training", "micro_batch", &["1048576", "256", "1"]),
    ("training", "grad_accum", &["65536", "1024"]),
    ("training", "steps", &["100"]),
    ("training", "activation_checkpointing", &["\"full\"", "\"selective\""]),
    ("hardware", "gpus", &["1048576", "524288", "1024"]),
    ("model.moe", "num_experts", &["4194304", "65536"]),
    ("model.moe", "top_k", &["4194304", "65536", "2"]),
    ("model.moe", "expert_ffn_hidden", &["4194304"]),
    ("model.moe", "shared_expert_ffn_hidden", &["4194304"]),
    ("model.mla", "kv_lora_rank", &["1048576"]),
    ("model.mla", "q_lora_rank", &["1048576"]),
    ("model.mla", "qk_nope_head_dim", &["1048576"]),
    ("model.mla", "v_head_dim", &["1048576"]),
    ("model.mtp", "layers", &["1024"]),
    ("parallel", "tensor", &["1048576", "1024", "8"]),
    ("parallel", "pipeline", &["1024", "512", "2"]),
    ("parallel", "virtual_stages", &["1024", "2"]),
    ("parallel", "expert", &["65536", "8"]),
    ("parallel", "context", &["1024", "2"]),
    ("parallel", "sharding", &["\"full_shard\"", "\"zero3\"", "\"none\""]),
    ("lora", "rank", &["1048576", "65536"]),
    ("inference", "batch", &["1048576"]),
    ("inference", "prompt_len", &["8388608"]),
    ("inference", "gen_len", &["8388608"]),
];

/// Scenarios with several sizes at their stated limits at once: each `run` or `explain` exits
/// 0 or 2 (never an overflow's exit 3) within the bounds, and one that runs keeps every
/// invariant and cross-check of [`Campaign::case`].
#[test]
fn scenarios_at_their_stated_limits_keep_the_contract() {
    scenario_campaign("STEPSIM_FUZZ_LIMITS", 40, 0x1717, "limits fuzz", |rng, text, what| {
        for _ in 0..rng.random_range(2..=6) {
            let (sec, key, values) = LIMITS[rng.random_range(0..LIMITS.len())];
            let val = values[rng.random_range(0..values.len())];
            *text = mutate(text, sec, key, val);
            what.push(format!("{sec}.{key} = {val}"));
        }
        rng.random_range(0..3) == 0
    });
}

/// Values a user would write, by field: every name an enum field allows, both booleans, and
/// sizes in the ranges the shipped scenarios use. The campaign that draws only these runs most
/// of its cases, so the report's invariants and the periodic extrapolation's byte-identity
/// are checked on many running jobs, where the extreme campaign mostly checks refusals.
const PLAUSIBLE: &[(&str, &str, &[&str])] = &[
    ("model", "n_layers", &["2", "4", "8", "12", "24", "32"]),
    ("model", "n_kv_heads", &["1", "2", "4", "8"]),
    ("model", "vocab", &["32000", "50257", "128256"]),
    ("model", "dropout", &["0.0", "0.1"]),
    ("model", "head_dim", &["64", "128"]),
    ("model", "name", &["gpt2", "llama-3.1-8b", "mistral-7b-v0.1", "gemma-3-1b", "gemma-2-9b", "gpt-oss-20b"]),
    ("model", "qkv_bias", &["true", "false"]),
    ("model", "tie_embeddings", &["true", "false"]),
    ("model", "qk_norm", &["true", "false"]),
    ("model", "family", &["\"gpt\"", "\"llama\""]),
    (
        "hardware",
        "gpu",
        &["\"a100-80gb\"", "\"a100-40gb\"", "\"h100-sxm\"", "\"h200\"", "\"b200\"", "\"mi300x\"", "\"l40s\""],
    ),
    ("hardware", "gpus", &["1", "2", "4", "8", "16", "32"]),
    ("hardware", "gpus_per_node", &["1", "4", "8"]),
    ("hardware", "memory_capacity", &["\"24GB\"", "\"40GB\"", "\"80GB\"", "\"80GiB\"", "\"141GB\""]),
    ("hardware", "cuda_context", &["\"0.5GB\"", "\"1GiB\""]),
    ("hardware", "nic_gbps", &["100", "200", "400"]),
    ("hardware", "nics_per_node", &["1", "4", "8"]),
    ("hardware", "nvlink_gb_per_s", &["300", "450", "900"]),
    ("parallel", "tensor", &["1", "2", "4", "8"]),
    ("parallel", "pipeline", &["1", "2", "4"]),
    ("parallel", "virtual_stages", &["1", "2"]),
    ("parallel", "bucket_cap_mb", &["1", "25", "100"]),
    (
        "parallel",
        "sharding",
        &["\"none\"", "\"zero1\"", "\"zero2\"", "\"shard_grad_op\"", "\"zero3\"", "\"full_shard\"", "\"hybrid_shard\""],
    ),
    ("parallel", "framework", &["\"fsdp\"", "\"fsdp1\"", "\"fsdp2\"", "\"deepspeed\"", "\"megatron\""]),
    ("parallel", "expert", &["1", "2", "4", "8"]),
    ("parallel", "context", &["1", "2", "4"]),
    ("parallel", "context_rotate", &["\"allgather\"", "\"alltoall\""]),
    ("parallel", "context_comm", &["\"p2p\"", "\"a2a\""]),
    ("parallel", "no_sync", &["true", "false"]),
    ("parallel", "hsdp_shard_size", &["2", "4", "8"]),
    ("parallel", "async_tp", &["true", "false"]),
    ("parallel", "expert_tensor", &["1", "2"]),
    ("parallel", "wrap", &["\"block\"", "\"peft\""]),
    ("parallel", "use_orig_params", &["true", "false"]),
    ("parallel", "reshard_after_forward", &["true", "false", "2"]),
    ("parallel", "schedule", &["\"gpipe\"", "\"1f1b\"", "\"interleaved-1f1b\"", "\"dualpipe\"", "\"dualpipev\""]),
    ("parallel", "sequence_parallel", &["true", "false"]),
    ("training", "micro_batch", &["1", "2", "4", "8"]),
    ("training", "seq_len", &["512", "1024", "2048", "4096", "8192"]),
    ("training", "grad_accum", &["1", "2", "4", "8"]),
    ("training", "steps", &["1", "2", "3", "4"]),
    ("training", "optimizer", &["\"adamw\"", "\"adam\"", "\"sgd\""]),
    ("training", "optimizer_impl", &["\"foreach\"", "\"fused\"", "\"for-loop\""]),
    (
        "training",
        "precision",
        &["\"bf16-mixed-adam\"", "\"bf16-mixed-adam-fp32-grads\"", "\"fsdp-bf16-mixed\"", "\"fp32\"", "\"bf16\""],
    ),
    ("training", "activation_checkpointing", &["\"none\"", "\"full\"", "\"selective\"", "\"selective-op\""]),
    ("training", "checkpoint_every", &["1", "2", "4"]),
    ("training", "recompute_method", &["\"uniform\"", "\"block\""]),
    ("training", "recompute_num_layers", &["1", "2", "4"]),
    ("training", "recompute_modules", &["[\"core_attn\"]", "[\"layernorm\", \"mlp\"]", "[\"moe_act\"]", "[\"moe\"]"]),
    ("training", "loss", &["\"eager\"", "\"vocab-parallel\"", "\"fused-linear\"", "\"compiled\""]),
    ("training", "activation_offload", &["\"none\"", "\"overlapped\"", "\"synchronous\""]),
    ("training", "activation_offload_layers", &["1", "2", "4"]),
    (
        "training",
        "attention",
        &[
            "\"flash\"",
            "\"math\"",
            "\"eager\"",
            "\"sdpa\"",
            "\"flash_attention_2\"",
            "\"flash_attention_3\"",
            "\"cudnn\"",
        ],
    ),
    ("training", "kernels", &["\"eager\"", "\"compiled\"", "\"fused\""]),
    ("model.moe", "num_experts", &["4", "8", "16", "64"]),
    ("model.moe", "top_k", &["1", "2", "4", "8"]),
    ("model.moe", "first_dense_layers", &["0", "1", "2"]),
    ("model.moe", "every", &["1", "2"]),
    ("model.moe", "shared_expert_gate", &["true", "false"]),
    ("moe", "routing", &["\"uniform\"", "\"zipf\""]),
    ("moe", "zipf_exponent", &["0.5", "1.0", "1.2"]),
    ("moe", "seed", &["1", "2", "3"]),
    ("moe", "capacity_factor", &["1.0", "1.25", "2.0"]),
    ("moe", "pad_to_capacity", &["true", "false"]),
    ("moe", "dispatcher", &["\"alltoall\"", "\"deepep\""]),
    ("moe", "deepep_sms", &["20", "24", "32"]),
    ("moe", "aux_loss", &["\"none\"", "\"aux_loss\"", "\"seq_aux_loss\"", "[\"aux_loss\", \"global_aux_loss\"]"]),
    ("fp8", "recipe", &["\"delayed\"", "\"blockwise\"", "\"mxfp8\"", "\"tensorwise\"", "\"rowwise\""]),
    ("fp8", "wgrad", &["true", "false"]),
    ("fp8", "amax_history_len", &["16", "1024"]),
    ("fp8", "fsdp_all_gather", &["true", "false"]),
    ("megatron", "overlap_grad_reduce", &["true", "false"]),
    ("megatron", "overlap_param_gather", &["true", "false"]),
    ("megatron", "tp_comm_overlap", &["true", "false"]),
    ("megatron", "overlap_moe_expert_parallel_comm", &["true", "false"]),
    ("megatron", "ddp_bucket_size", &["1e7", "4e7"]),
    ("megatron", "use_precision_aware_optimizer", &["true", "false"]),
    ("megatron", "main_grads_dtype", &["\"fp32\"", "\"bf16\""]),
    ("megatron", "exp_avg_dtype", &["\"fp32\"", "\"bf16\"", "\"fp8\""]),
    (
        "megatron",
        "offload_modules",
        &["[\"core_attn\", \"attn_proj\"]", "[\"attn_norm\", \"mlp_norm\"]", "[\"expert_fc1\", \"moe_act\"]"],
    ),
    ("megatron", "activation_offload_fraction", &["0.0", "0.5", "1.0"]),
    ("megatron", "store_param_remainders", &["true", "false"]),
    ("deepspeed", "reduce_bucket_size", &["5e7", "2e8", "5e8"]),
    ("deepspeed", "allgather_bucket_size", &["5e7", "5e8"]),
    ("deepspeed", "sub_group_size", &["1e8", "1e9"]),
    ("deepspeed", "version", &["\"0.9\"", "\"0.13.2\"", "\"0.16.5\""]),
    ("deepspeed", "stage3_prefetch_bucket_size", &["5e7", "5e8"]),
    ("deepspeed", "stage3_max_live_parameters", &["1e8", "1e9"]),
    ("deepspeed", "stage3_max_reuse_distance", &["1e8", "1e9"]),
    ("deepspeed", "stage3_param_persistence_threshold", &["1e4", "1e5", "1e6"]),
    ("allocator", "expandable_segments", &["true", "false"]),
    ("allocator", "max_split_size_mb", &["128", "512"]),
    ("allocator", "roundup_power2_divisions", &["1", "4", "8"]),
    ("allocator", "cublas_workspace", &["\"4MiB\"", "\"32MiB\""]),
    ("jitter", "seed", &["1", "2"]),
    ("jitter", "compute_cv", &["0.01", "0.03", "0.1"]),
    ("jitter", "stragglers", &["0", "1", "2"]),
    ("jitter", "straggler_slowdown", &["1.1", "1.5"]),
    ("inference", "batch", &["1", "4", "16"]),
    ("inference", "prompt_len", &["128", "2048"]),
    ("inference", "gen_len", &["16", "256"]),
    ("inference", "weights", &["\"bf16\"", "\"int8\"", "\"int4\"", "\"nf4\""]),
    ("inference", "kv_cache_dtype", &["\"bf16\"", "\"fp8\""]),
    ("offload", "optimizer", &["\"cpu\"", "\"nvme\"", "\"none\""]),
    ("offload", "parameters", &["\"cpu\"", "\"nvme\"", "\"none\""]),
    ("offload", "cpu_memory", &["\"512GB\"", "\"2TB\""]),
    ("lora", "rank", &["8", "16", "64"]),
    ("lora", "alpha", &["16", "32"]),
    ("lora", "base_weights", &["\"bf16\"", "\"nf4\""]),
    ("lora", "prepare_kbit_training", &["true", "false"]),
    ("lora", "dropout", &["0.0", "0.05"]),
    ("model.mtp", "layers", &["1"]),
];

/// The table at a dotted `section` of a scenario (`model.moe`), if the file has it.
fn section<'a>(doc: &'a toml::Table, section: &str) -> Option<&'a toml::Table> {
    section.split('.').try_fold(doc, |t, part| t.get(part)?.as_table())
}

/// A size the base already sets, halved or doubled (an integer halved only when even), so
/// that the model's and the cluster's shapes keep their divisibility most of the time.
fn scaled(text: &str, rng: &mut ChaCha8Rng) -> Option<(String, String, String)> {
    const SIZES: &[(&str, &str)] = &[
        ("model", "hidden"),
        ("model", "n_heads"),
        ("model", "ffn_hidden"),
        ("model", "n_layers"),
        ("model", "max_seq_len"),
        ("model.moe", "expert_ffn_hidden"),
        ("hardware", "gpus"),
        ("training", "micro_batch"),
        ("training", "seq_len"),
        ("training", "grad_accum"),
        ("parallel", "tensor"),
        ("parallel", "pipeline"),
        ("parallel", "expert"),
        ("inference", "batch"),
        ("inference", "prompt_len"),
        ("jitter", "compute_cv"),
        ("moe", "zipf_exponent"),
    ];
    let doc: toml::Table = toml::from_str(text).ok()?;
    let (sec, key) = SIZES[rng.random_range(0..SIZES.len())];
    let table = section(&doc, sec)?;
    // Drawn once the section is found (whether or not it sets the key), as the campaigns'
    // seeds were run.
    let up = rng.random_bool(0.5);
    let value = match table.get(key)? {
        toml::Value::Integer(n) if up => (n * 2).to_string(),
        toml::Value::Integer(n) if n % 2 == 0 => (n / 2).to_string(),
        toml::Value::Integer(n) => (n * 2).to_string(),
        toml::Value::Float(x) => format!("{:?}", if up { x * 2.0 } else { x / 2.0 }),
        _ => return None,
    };
    Some((sec.to_string(), key.to_string(), value))
}

/// Shipped scenarios with one to three fields set to values a user would write (`PLAUSIBLE`,
/// or a size the base sets halved or doubled): most run, and each that does keeps the
/// report's invariants and the same files from `run --every-period`; the rest are refused
/// with exit 2 (a combination the frameworks do not allow), never a panic. The extreme
/// campaign above runs about 4% of its cases, so it checks running jobs far less.
#[test]
fn plausible_scenarios_keep_their_invariants() {
    scenario_campaign("STEPSIM_FUZZ_PLAUSIBLE", 100, 0x9a1a, "plausible fuzz", |rng, text, what| {
        for _ in 0..rng.random_range(1..=3) {
            let pick = if rng.random_bool(0.3) { scaled(text, rng) } else { None };
            let (sec, key, val) = pick.unwrap_or_else(|| {
                // Mostly a field of a section the base has: a section added to a job it does
                // not apply to ([moe] on a dense model, [megatron] under FSDP) is refused.
                let doc: toml::Table = toml::from_str(text).unwrap();
                let fields: Vec<_> = PLAUSIBLE.iter().filter(|(sec, _, _)| section(&doc, sec).is_some()).collect();
                let (sec, key, values) = if fields.is_empty() || rng.random_bool(0.2) {
                    &PLAUSIBLE[rng.random_range(0..PLAUSIBLE.len())]
                } else {
                    fields[rng.random_range(0..fields.len())]
                };
                (sec.to_string(), key.to_string(), values[rng.random_range(0..values.len())].to_string())
            });
            *text = mutate(text, &sec, &key, &val);
            what.push(format!("{sec}.{key} = {val}"));
        }
        rng.random_range(0..4) == 0
    });
}

/// Sweep axes a case may draw: a path and TOML lists for it, plausible and extreme.
const SWEEP_AXES: &[(&str, &[&str])] = &[
    (
        "training.micro_batch",
        &["[1, 2]", "[0, 1]", "[-1]", "[1e30]", "[9223372036854775807]", "[]", "[\"x\"]", "[1, 2, 4, 8]"],
    ),
    ("hardware.gpus", &["[1, 2]", "[8, 16]", "[0]", "[4294967296]", "[1, 1, 1]"]),
    ("training.activation_checkpointing", &["[\"none\", \"full\"]", "[\"bogus\"]", "[true]"]),
    ("parallel.sharding", &["[\"none\", \"full_shard\"]", "[\"zero9\"]"]),
    ("model.n_layers", &["[2, 4]", "[2147483648]", "[nan]"]),
    ("training.seq_len", &["[128, 256]", "[16777217]", "[inf]"]),
    ("training.grad_accum", &["[1, 2]", "[1000000000000000000]"]),
    ("allocator.expandable_segments", &["[true, false]", "[2]"]),
];

/// Filters a case may draw: none, ordinary ones, and the kinds the issue found broken.
fn sweep_filter(rng: &mut ChaCha8Rng) -> String {
    let deep = |n: usize| format!("{}gpus{} = 1", "(".repeat(n), ")".repeat(n));
    let long = format!("gpus = {}1", "1 + ".repeat(600));
    let pick: [String; 12] = [
        String::new(),
        "gpus = 1".into(),
        "micro_batch * grad_accum * dp >= 2".into(),
        "gpus * 1e400 = 5".into(),
        "gpus * 1e300 * 1e300 = 5".into(),
        "micro_batch / 0 = 1".into(),
        "sharding < 3".into(),
        "gpus = ".into(),
        "x.y.z = 1".into(),
        deep(60),
        deep(10_000),
        long,
    ];
    // Half the sweeps have no filter, so that many run.
    let f = if rng.random_bool(0.5) { &pick[0] } else { &pick[rng.random_range(0..pick.len())] };
    if f.is_empty() {
        String::new()
    } else {
        format!("filter = [{f:?}]\n")
    }
}

/// A sweep file: one of a few small bases, one to three axes (sometimes three of a thousand
/// values each: 10^9 configurations, to be refused before any is enumerated), a filter, and
/// sometimes a bad token budget.
fn sweep_case(rng: &mut ChaCha8Rng, root: &Path) -> (String, String) {
    let bases = ["gpt-1.3b-1gpu.toml", "100b-8gpu-fsdp.toml", "fragmentation-oom.toml"];
    let base = root.join("scenarios").join(bases[rng.random_range(0..bases.len())]);
    let mut what = vec![base.file_name().unwrap().to_string_lossy().to_string()];
    let mut text = format!("name = \"fuzz\"\nbase = {:?}\n", base.to_str().unwrap());
    text.push_str(&sweep_filter(rng));
    match rng.random_range(0..12) {
        0 => text.push_str("token_budget = -1\n"),
        1 => text.push_str("token_budget = nan\n"),
        _ => {}
    }
    text.push_str("[axes]\n");
    if rng.random_range(0..10) == 0 {
        let thousand = format!("[{}]", (1..=1000).map(|i| i.to_string()).collect::<Vec<_>>().join(", "));
        for path in ["training.micro_batch", "training.grad_accum", "training.seq_len"] {
            text.push_str(&format!("{path} = {thousand}\n"));
        }
        what.push("10^9 configurations".into());
    } else {
        let mut used = Vec::new();
        for _ in 0..rng.random_range(1..=3) {
            let (path, values) = SWEEP_AXES[rng.random_range(0..SWEEP_AXES.len())];
            if used.contains(&path) {
                continue;
            }
            used.push(path);
            // Half the time the plausible first list, so that many sweeps run.
            let v = if rng.random_bool(0.5) { values[0] } else { values[rng.random_range(0..values.len())] };
            text.push_str(&format!("{path} = {v}\n"));
            what.push(format!("{path} = {v}"));
        }
    }
    if let Some(l) = text.lines().find(|l| l.starts_with("filter")) {
        what.push(l.chars().take(60).collect());
    }
    (text, what.join(", "))
}

/// Damages a copy of a finished shard's folder the way a disk, a copy or a hand can: every
/// one must make `merge` refuse (exit 2) and write nothing.
fn damage(dir: &Path, rng: &mut ChaCha8Rng) -> &'static str {
    let csv = dir.join("sweep.csv");
    let manifest = dir.join("sweep.manifest.json");
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let m = std::fs::read_to_string(&manifest).unwrap();
    let (what, csv_text, m_text): (&str, Option<String>, Option<String>) = match rng.random_range(0..10) {
        0 => ("a row lost", Some([&lines[..2], &lines[3..]].concat().concat()), None),
        1 => ("a row repeated", Some([&lines[..3], &lines[2..]].concat().concat()), None),
        2 => ("two rows swapped", Some([&lines[..1], &lines[2..3], &lines[1..2], &lines[3..]].concat().concat()), None),
        3 => ("the table cut mid-row", Some(text[..text.len() - 7].to_string()), None),
        4 => {
            // The last digit of the first row (a throughput or peak figure) changed.
            let mut row: Vec<char> = lines[1].chars().collect();
            let k = row.iter().rposition(|c| c.is_ascii_digit()).unwrap();
            row[k] = if row[k] == '9' { '0' } else { char::from(row[k] as u8 + 1) };
            let edited: String = row.into_iter().collect();
            ("a figure edited", Some([lines[0], &edited].concat() + &lines[2..].concat()), None)
        }
        5 => ("the manifest deleted", None, Some(String::new())),
        6 => ("the manifest cut", None, Some(m[..m.len() / 2].to_string())),
        7 => ("the manifest says unfinished", None, Some(m.replace("\"complete\": true", "\"complete\": false"))),
        8 => ("the table deleted", Some(String::new()), None),
        _ => ("the header changed", Some(text.replacen("index,", "idx,", 1)), None),
    };
    match csv_text {
        Some(c) if c.is_empty() => std::fs::remove_file(&csv).unwrap(),
        Some(c) => std::fs::write(&csv, c).unwrap(),
        None => {}
    }
    match m_text {
        Some(c) if c.is_empty() => std::fs::remove_file(&manifest).unwrap(),
        Some(c) => std::fs::write(&manifest, c).unwrap(),
        None => {}
    }
    what
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

/// Mutated sweep files and damaged shards (issue 22): every sweep exits 0 or 2 within the
/// time and memory bounds, one that fails leaves no sweep.json, and every damaged shard
/// makes `merge` refuse without writing a table or an answer.
#[test]
fn mutated_sweeps_and_damaged_shards_keep_the_contract() {
    let (cases, seed) = campaign_size("STEPSIM_FUZZ_SWEEPS", 40);
    let limit = Duration::from_secs(30);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    // One good sweep in two shards, copied and damaged by the merge cases.
    let good = dir.path().join("good.toml");
    let base = root.join("scenarios/gpt-1.3b-1gpu.toml");
    std::fs::write(
        &good,
        format!("name = \"good\"\nbase = {:?}\n[axes]\ntraining.micro_batch = [1, 2, 4, 8]\ntraining.activation_checkpointing = [\"none\", \"full\"]\n", base.to_str().unwrap()),
    )
    .unwrap();
    let shards: Vec<_> = (1..=2).map(|i| dir.path().join(format!("good-{i}"))).collect();
    for (i, s) in shards.iter().enumerate() {
        let o = run_bounded(
            &["sweep", good.to_str().unwrap(), "--out", s.to_str().unwrap(), "--shard", &format!("{}/2", i + 1)],
            limit,
        );
        assert_eq!(o.code, Some(0), "{}", o.stderr);
    }
    let (mut ok, mut refused, mut merges, mut slowest, mut most) = (0, 0, 0, 0.0f64, 0u64);
    let mut problems = Vec::new();
    for i in 0..cases {
        let out = dir.path().join(format!("sout{i}"));
        if rng.random_range(0..3) == 0 {
            // A merge of the good shards, one of them damaged (or, one time in five, not).
            merges += 1;
            let copies: Vec<_> = (0..2).map(|k| dir.path().join(format!("m{i}-{k}"))).collect();
            for (s, c) in shards.iter().zip(&copies) {
                copy_dir(s, c);
            }
            let what =
                if rng.random_range(0..5) == 0 { "nothing" } else { damage(&copies[rng.random_range(0..2)], &mut rng) };
            let o = run_bounded(
                &[
                    "sweep",
                    "merge",
                    good.to_str().unwrap(),
                    copies[0].to_str().unwrap(),
                    copies[1].to_str().unwrap(),
                    "--out",
                    out.to_str().unwrap(),
                ],
                limit,
            );
            let left = out.join("sweep.csv").exists() || out.join("sweep.json").exists();
            let problem = o.problem.clone().or_else(|| match (what, o.code) {
                ("nothing", Some(0)) => None,
                ("nothing", c) => Some(format!("an undamaged merge exited {c:?}: {}", o.stderr.trim())),
                (_, Some(2)) if left => Some("a refused merge left a table or an answer".into()),
                (_, Some(2)) => None,
                (_, c) => Some(format!("merged with {what}: exit {c:?}")),
            });
            if let Some(p) = problem {
                problems.push(format!("merge with {what}: {p}"));
            }
        } else {
            let (text, what) = sweep_case(&mut rng, root);
            let file = dir.path().join(format!("sweep{i}.toml"));
            std::fs::write(&file, &text).unwrap();
            let mut args = vec![
                "sweep".to_string(),
                file.to_str().unwrap().to_string(),
                "--out".into(),
                out.to_str().unwrap().into(),
            ];
            let flag = match rng.random_range(0..8) {
                0 => vec!["--jobs", ["0", "1", "100000"][rng.random_range(0..3)]],
                1 => vec!["--shard", ["0/2", "3/2", "1/0", "1/2", "x"][rng.random_range(0..5)]],
                _ => vec![],
            };
            args.extend(flag.iter().map(|s| s.to_string()));
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = run_bounded(&argv, limit);
            slowest = slowest.max(o.seconds);
            most = most.max(o.peak_rss);
            match o.code {
                Some(0) => ok += 1,
                Some(2) => refused += 1,
                _ => {}
            }
            let problem = o.problem.clone().or_else(|| {
                (o.code == Some(2) && out.join("sweep.json").exists())
                    .then(|| "exit 2 but sweep.json was written".into())
            });
            if std::env::var("STEPSIM_FUZZ_SHOW").is_ok() {
                println!("{:?} [{what}] {flag:?}: {}", o.code, o.stderr.lines().last().unwrap_or(""));
            }
            if let Some(p) = problem {
                problems.push(format!("sweep [{what}] {flag:?}: {p}"));
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    println!(
        "sweep fuzz: seed {seed}, {cases} cases: {ok} sweeps ran, {refused} refused, {merges} merges, {} problems; slowest {slowest:.2} s, most memory {:.2} GB",
        problems.len(),
        most as f64 / 1e9
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
