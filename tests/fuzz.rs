//! A fuzzer of scenario files (issue 22): shipped scenarios with one or two fields mutated
//! to extreme values, wrong types and control characters, each run through the real binary
//! (`run`, or `explain`), checking the exit-code contract (0 or 2, never a panic's 101),
//! a time bound, and on exit 0 the report's own invariants.
//!
//! `cargo test --release --test fuzz` runs a short fixed-seed campaign (as CI does);
//! `STEPSIM_FUZZ_CASES=10000 STEPSIM_FUZZ_SEED=7 cargo test --release --test fuzz -- --nocapture`
//! runs a long one and prints its counts.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
];

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
    ("model.moe", "num_experts"),
    ("model.moe", "top_k"),
    ("model.moe", "expert_ffn_hidden"),
    ("model.moe", "shared_expert_ffn_hidden"),
    ("model.moe", "first_dense_layers"),
    ("moe", "routing"),
    ("moe", "zipf_exponent"),
    ("moe", "seed"),
    ("moe", "tokens_per_expert"),
    ("moe", "capacity_factor"),
    ("moe", "pad_to_capacity"),
    ("fp8", "recipe"),
    ("fp8", "wgrad"),
    ("fp8", "amax_history_len"),
    ("fp8", "fsdp_all_gather"),
    ("megatron", "overlap_grad_reduce"),
    ("megatron", "overlap_param_gather"),
    ("megatron", "tp_comm_overlap"),
    ("megatron", "ddp_bucket_size"),
    ("deepspeed", "reduce_bucket_size"),
    ("deepspeed", "sub_group_size"),
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
    ("allocator", "max_split_size_mb"),
    ("allocator", "roundup_power2_divisions"),
    ("jitter", "seed"),
    ("jitter", "compute_cv"),
    ("jitter", "stragglers"),
    ("inference", "batch"),
    ("inference", "prompt_len"),
    ("inference", "gen_len"),
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
    "\"selective-op\"",
    "\"full\"",
    "\"block\"",
    "\"fused-linear\"",
    "\"overlapped\"",
    "\"synchronous\"",
    "\"alltoall\"",
    "\"a2a\"",
    "[1, 2, 3, 4, 5, 6, 7, 8]",
    "[\"layernorm\", \"moe_act\"]",
    "\"\\u0000\"",
    "\"a\\rb\"",
    "true",
    "[]",
    "{}",
];

/// The report's invariants, on a run that exited 0.
fn check_report(json: &str) -> Result<(), String> {
    let r: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("report.json does not parse: {e}"))?;
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

/// One case: the base file with its mutations, run with a time bound.
struct Outcome {
    code: Option<i32>,
    seconds: f64,
    problem: Option<String>,
}

fn run_case(file: &Path, out: &Path, explain: bool, limit: Duration) -> Outcome {
    let t = Instant::now();
    let cmd = if explain { "explain" } else { "run" };
    let mut child = Command::new(env!("CARGO_BIN_EXE_stepsim"))
        .args([cmd, file.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start stepsim");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            let code = status.code();
            let mut problem = match code {
                Some(0) => std::fs::read_to_string(out.join("report.json"))
                    .map_err(|e| format!("exit 0 without report.json: {e}"))
                    .and_then(|j| check_report(&j))
                    .err(),
                Some(2) if err.trim().is_empty() => Some("exit 2 with an empty message".into()),
                Some(2) => None,
                _ => Some(format!("exit {code:?}: {}", err.lines().take(3).collect::<Vec<_>>().join(" | "))),
            };
            if code == Some(2) && out.join("report.json").exists() {
                problem = Some("exit 2 but report.json was written".into());
            }
            return Outcome { code, seconds: t.elapsed().as_secs_f64(), problem };
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Outcome { code: None, seconds: t.elapsed().as_secs_f64(), problem: Some("timed out".into()) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
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

#[test]
fn mutated_scenarios_keep_the_exit_code_contract() {
    let cases: usize = std::env::var("STEPSIM_FUZZ_CASES").ok().and_then(|x| x.parse().ok()).unwrap_or(300);
    let seed: u64 = std::env::var("STEPSIM_FUZZ_SEED").ok().and_then(|x| x.parse().ok()).unwrap_or(22);
    let limit = Duration::from_secs(30);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut ok, mut refused, mut slowest) = (0, 0, 0.0f64);
    let mut slowest_case = String::new();
    let mut problems = Vec::new();
    for i in 0..cases {
        let base_name = BASES[rng.random_range(0..BASES.len())];
        let mut text = std::fs::read_to_string(root.join("scenarios").join(base_name)).unwrap();
        let mut what = Vec::new();
        for _ in 0..rng.random_range(1..=2) {
            let (sec, key) = FIELDS[rng.random_range(0..FIELDS.len())];
            // Half the time a plausible size (the first nine values), so that many cases run.
            let val = if rng.random_bool(0.5) {
                VALUES[rng.random_range(0..9)]
            } else {
                VALUES[rng.random_range(0..VALUES.len())]
            };
            text = mutate(&text, sec, key, val);
            what.push(format!("{sec}.{key} = {val}"));
        }
        if rng.random_range(0..10) == 0 {
            // A control character in a comment.
            text.push_str("# \u{0}\r\n");
            what.push("NUL and CR in a comment".into());
        }
        let file = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&file, &text).unwrap();
        let out = dir.path().join(format!("out{i}"));
        let explain = rng.random_range(0..4) == 0;
        let o = run_case(&file, &out, explain, limit);
        if o.seconds > slowest {
            slowest = o.seconds;
            slowest_case = format!("{base_name} [{}]{}", what.join(", "), if explain { " (explain)" } else { "" });
        }
        match o.code {
            Some(0) => ok += 1,
            Some(2) => refused += 1,
            _ => {}
        }
        if let Some(p) = o.problem {
            problems.push(format!("{base_name} [{}]{}: {p}", what.join(", "), if explain { " (explain)" } else { "" }));
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    println!(
        "fuzz: seed {seed}, {cases} cases: {ok} ran (exit 0), {refused} refused (exit 2), {} problems; slowest {slowest:.1} s: {slowest_case}",
        problems.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
