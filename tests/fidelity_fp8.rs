//! Fidelity of FP8 training (Transformer Engine delayed scaling under Megatron-Core) against
//! the NeMo Framework performance summary (tests/fixtures/nemo_perf_2412.json, copied from
//! shared/reference/published.json `nemo_perf_2412`): FP8 pretraining on DGX-H100, tokens/s
//! per GPU.
//!
//! Tolerance (issue 21): every row stepsim can express within +-15%, the median |error|
//! within 10%. Compared on tokens/s/GPU, which needs no FLOPs formula (NeMo's
//! `FLOPsMeasurementCallback` reproduces the table's TFLOP/s from it, see the fixture).
//!
//! The run settings are the NeMo-Framework-Launcher configurations the fixture's
//! `run_settings` cite (launcher_scripts/conf/training/*.yaml, the h100 FP8 example
//! scripts, Megatron-Core's transformer_block.py): FP8 hybrid with delayed scaling and FP8
//! weight gradients in the transformer blocks, the LM head in BF16; BF16 weights with an
//! FP32 master and the distributed optimizer overlapping its gradient reduce-scatter and
//! parameter all-gather; gradients reduced in BF16 (`grad_sync_dtype=bf16` in the FP8
//! scripts); flash attention; no recomputation; sequence parallelism where TP > 1, with
//! TP communication overlap where the yaml turns it on (GPT3-20B, Llama2-70B, Llama3-70B);
//! the table's interleaving and context parallelism (Transformer Engine's ring attention);
//! padded vocabularies (a multiple of 128 x TP). Not expressed: Nemotron (squared-ReLU MLP);
//! the test says so when it prints.
//!
//! Stated assumptions where the sources are silent: plain DGX-H100 nodes (8 GPUs, NVLink 4,
//! 8 x NDR400); the amax history as each yaml sets it (1024 rows; 1 for Llama2 13B/70B);
//! GPT3 with dropout 0.1 as the launcher's yaml.

use std::path::Path;

use serde_json::Value;
use stepsim::scenario::Scenario;

struct Row {
    model: String,
    gpus: u64,
    gbs: u64,
    mbs: u64,
    seq: u64,
    tp: u64,
    pp: u64,
    cp: u64,
    vp: u64,
    published: f64,
}

/// The architecture block of a scenario (layers, hidden, heads, kv heads, ffn, vocab,
/// amax history rows, TP communication overlap), or None where stepsim cannot express it.
fn model(name: &str, tp: u64) -> Option<(String, u64, bool)> {
    let pad = |v: u64| v.div_ceil(128 * tp) * 128 * tp;
    let gpt = |l: u64, h: u64, a: u64| {
        format!(
            "family = \"gpt\"\nn_layers = {l}\nhidden = {h}\nn_heads = {a}\nvocab = {}\nmax_seq_len = 2048\ntie_embeddings = true\ndropout = 0.1\n",
            pad(50257)
        )
    };
    let llama = |l: u64, h: u64, a: u64, kv: u64, f: u64, v: u64| {
        format!(
            "family = \"llama\"\nn_layers = {l}\nhidden = {h}\nn_heads = {a}\nn_kv_heads = {kv}\nffn_hidden = {f}\nvocab = {}\nmax_seq_len = 4096\ntie_embeddings = false\n",
            pad(v)
        )
    };
    Some(match name {
        "GPT3-5B" => (gpt(24, 4096, 32), 1024, false),
        "GPT3-20B" => (gpt(44, 6144, 48), 1024, true),
        "GPT3-175B" => (gpt(96, 12288, 96), 1024, false),
        "LLAMA2-7B" => (llama(32, 4096, 32, 32, 11008, 32000), 1024, false),
        "LLAMA2-13B" => (llama(40, 5120, 40, 40, 13824, 32000), 1, false),
        "LLAMA2-70B" => (llama(80, 8192, 64, 8, 28672, 32000), 1, true),
        "LLAMA3-8B" => (llama(32, 4096, 32, 8, 14336, 128256).replace("4096\ntie", "8192\ntie"), 1024, false),
        "LLAMA3-70B" => (llama(80, 8192, 64, 8, 28672, 128256).replace("4096\ntie", "8192\ntie"), 1024, true),
        _ => return None,
    })
}

fn scenario(r: &Row, fp8: bool) -> Option<String> {
    let (m, amax, tp_overlap) = model(&r.model, r.tp)?;
    let dp = r.gpus / r.tp / r.pp / r.cp;
    let ga = r.gbs / dp / r.mbs;
    let mut par = format!("framework = \"megatron\"\nsharding = \"zero1\"\ntensor = {}\ncontext = {}\n", r.tp, r.cp);
    if r.tp > 1 {
        par += "sequence_parallel = true\n";
    }
    if r.pp > 1 {
        par += &format!("pipeline = {}\n", r.pp);
        par += &if r.vp > 1 {
            format!("schedule = \"interleaved-1f1b\"\nvirtual_stages = {}\n", r.vp)
        } else {
            "schedule = \"1f1b\"\n".to_string()
        };
    }
    let fp8 = if fp8 { format!("[fp8]\nrecipe = \"delayed\"\namax_history_len = {amax}\n") } else { String::new() };
    Some(format!(
        "[model]\n{m}\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {}\nnode = \"dgx-h100\"\n\
         [parallel]\n{par}\
         [megatron]\noverlap_grad_reduce = true\noverlap_param_gather = true\ntp_comm_overlap = {tp_overlap}\n\
         [training]\nmicro_batch = {}\nseq_len = {}\ngrad_accum = {ga}\nprecision = \"bf16-mixed-adam\"\n\
         activation_checkpointing = \"none\"\nattention = \"flash\"\n{fp8}",
        r.gpus, r.mbs, r.seq
    ))
}

/// Tokens/s per GPU over the steady-state step.
fn simulate(r: &Row, toml: &str) -> f64 {
    let s = Scenario::from_toml(Path::new("<nemo-fp8>"), toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let dag = stepsim::model::build(&s.model, &s.workload);
    let rep = stepsim::simulate_lean(&s, &dag, &[]).unwrap();
    assert!(matches!(rep.verdict, stepsim::report::Verdict::Fits { .. }), "{} does not fit:\n{toml}", r.model);
    let t = rep.throughput.as_ref().unwrap();
    (r.gbs * r.seq) as f64 / t.step_time_s / r.gpus as f64
}

#[test]
fn nemo_fp8_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nemo_perf_2412.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let rows: Vec<Row> = v["metrics"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let n = |i: usize| x[i].as_u64().unwrap();
            Row {
                model: x[0].as_str().unwrap().to_string(),
                gpus: n(1),
                gbs: n(2),
                mbs: n(3),
                seq: n(4),
                tp: n(5),
                pp: n(6),
                cp: n(7),
                vp: n(8),
                published: x[9].as_f64().unwrap(),
            }
        })
        .collect();
    assert_eq!(rows.len(), 12, "every row is listed");
    println!(
        "{:>12} {:>4} {:>3} {:>3} {:>3} {:>3} {:>10} {:>9} {:>17} {:>8}",
        "model", "GPUs", "TP", "PP", "CP", "VP", "published", "stepsim", "error", "bf16"
    );
    let mut errors = Vec::new();
    let mut failures = Vec::new();
    for r in &rows {
        let head = format!(
            "{:>12} {:>4} {:>3} {:>3} {:>3} {:>3} {:>10.0}",
            r.model, r.gpus, r.tp, r.pp, r.cp, r.vp, r.published
        );
        let (Some(fp8), Some(bf16)) = (scenario(r, true), scenario(r, false)) else {
            let why =
                if r.cp > 1 { "context parallelism not simulated yet" } else { "squared-ReLU MLP not expressible" };
            println!("{head}   (not compared: {why})");
            continue;
        };
        let pred = simulate(r, &fp8);
        let plain = simulate(r, &bf16);
        let err = pred / r.published - 1.0;
        println!("{head} {pred:>9.0} {:>+16.1}% {plain:>8.0}", err * 100.0);
        // FP8 never makes a step slower than BF16 in the model.
        assert!(pred > plain, "{}: FP8 {pred:.0} <= BF16 {plain:.0} tokens/s/GPU", r.model);
        if err.abs() > 0.15 {
            failures.push(format!("{}: {pred:.0} vs {} tokens/s/GPU ({:+.1}%)", r.model, r.published, err * 100.0));
        }
        errors.push(err.abs());
    }
    assert!(errors.len() >= 9, "the GPT3, Llama 2 and Llama 3 rows are compared");
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    println!("median |error| {:.1}% over {} rows", median * 100.0, errors.len());
    assert!(failures.is_empty(), "outside 15%:\n{}", failures.join("\n"));
    assert!(median <= 0.10, "median |error| {:.1}% > 10%", median * 100.0);
}
