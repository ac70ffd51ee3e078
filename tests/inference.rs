//! Inference jobs (issue 8): memory accounting against hand-derived figures, decode time
//! against the bandwidth bound, the dynamic cache's growth, fidelity against gpt-fast's
//! published decode speeds, and the shipped scenarios' verdicts.

use std::path::Path;

use stepsim::report::Verdict;
use stepsim::scenario::Scenario;

fn scenario(name: &str, toml: &str) -> Scenario {
    Scenario::from_toml(Path::new(name), toml).unwrap_or_else(|e| panic!("{e}"))
}

fn inf(r: &stepsim::report::Report) -> &stepsim::report::inference::InferenceReport {
    r.inference.as_ref().expect("an inference report")
}

const LLAMA2_70B: &str = r#"
[model]
family = "llama"
n_layers = 80
hidden = 8192
n_heads = 64
n_kv_heads = 8
ffn_hidden = 28672
vocab = 32000
max_seq_len = 4096
tie_embeddings = false
"#;

const LLAMA2_7B: &str = r#"
[model]
family = "llama"
n_layers = 32
hidden = 4096
n_heads = 32
ffn_hidden = 11008
vocab = 32000
max_seq_len = 4096
tie_embeddings = false
"#;

fn job(model: &str, gpus: u32, tensor: u32, inference: &str) -> Scenario {
    let text = format!(
        "{model}\n[hardware]\ngpu = \"a100-80gb\"\ngpus = {gpus}\n\n[parallel]\ntensor = {tensor}\n\n[job]\nkind = \"inference\"\n\n[inference]\n{inference}\n"
    );
    scenario("inference-test.toml", &text)
}

/// The 100B GPT in int4 (group 128) on one H100: the weights by hand. Per block the four
/// linears hold 12 h^2 weights at 0.5 B plus an FP16 scale and a 4-bit zero (2.5 B) per 128
/// inputs per output, their 9 h biases and the two LayerNorms' 4 h parameters in BF16; the
/// token and position embeddings and the final LayerNorm in BF16 (the head is tied).
#[test]
fn int4_weights_and_kv_cache_match_the_hand_count() {
    let s = Scenario::load(Path::new("scenarios/100b-1gpu-int4-inference.toml")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let r = inf(&sim.report);
    let h: u64 = 10240;
    let block = 12 * h * h / 2 + 12 * h * h / 128 * 5 / 2 + (9 * h + 4 * h) * 2;
    let expected = 80 * block + (50257 + 2048) * h * 2 + 2 * h * 2;
    assert_eq!(r.weights_per_gpu.bytes, expected);
    println!("100B int4 g128 weights: {:.2} GB", expected as f64 / 1e9);
    // 2 (K, V) x 80 layers x 80 heads x 128 x 2 B per token; 1024 + 256 tokens, batch 1.
    assert_eq!(r.kv_bytes_per_token, 2 * 80 * 80 * 128 * 2);
    assert_eq!(r.kv_cache_per_gpu.bytes, 3_276_800 * 1280);
    // The peak is weights + the static cache + one layer's prefill activations (< 1 GB).
    let Verdict::Fits { .. } = sim.report.verdict else { panic!("should fit") };
    let peak = sim.report.peak.as_ref().unwrap().allocated.bytes;
    let floor = expected + 3_276_800 * 1280;
    assert!(peak >= floor && peak < floor + 1_000_000_000, "peak {peak} vs weights + cache {floor}");
}

/// Decode can never beat reading its bytes at the datasheet bandwidth, and at batch 1 a
/// decode pass is that read plus small per-kernel costs: within 65-100% of the bound. The
/// bytes per pass are the weights but the embedding table (a lookup reads one row per
/// sequence) plus the whole static cache (attention reads it masked), within 1%
/// (activations, logits).
#[test]
fn decode_is_bandwidth_bound_at_batch_one() {
    let s = job(LLAMA2_7B, 1, 1, "batch = 1\nprompt_len = 512\ngen_len = 32");
    let sim = stepsim::simulate(&s).unwrap();
    let r = inf(&sim.report);
    let t = r.timing.as_ref().expect("timing");
    assert_eq!(t.decode_passes, 31);
    assert!(t.tpot_s >= t.bandwidth_bound_tpot_s);
    assert!(t.bandwidth_utilisation > 0.65 && t.bandwidth_utilisation <= 1.0, "{}", t.bandwidth_utilisation);
    let embedding = 32000 * 4096 * 2;
    let expected = (r.weights_per_gpu.bytes - embedding + r.kv_cache_per_gpu.bytes) as f64;
    let got = t.decode_bytes_per_pass.bytes as f64;
    assert!((got / expected - 1.0).abs() < 0.01, "{got} vs {expected}");
    // The bound is those bytes over the A100's 2.039 TB/s.
    assert!((t.bandwidth_bound_tpot_s - got / 2.039e12).abs() < 1e-9);
    // Batch 8 reads the same weights for 8 tokens: far more tokens/s, same order of TPOT.
    let s8 = job(LLAMA2_7B, 1, 1, "batch = 8\nprompt_len = 512\ngen_len = 32");
    let sim8 = stepsim::simulate(&s8).unwrap();
    let t8 = inf(&sim8.report).timing.clone().unwrap();
    assert!(
        t8.decode_tokens_per_s > 5.0 * t.decode_tokens_per_s,
        "{} vs {}",
        t8.decode_tokens_per_s,
        t.decode_tokens_per_s
    );
}

/// HF's DynamicCache grows each layer's keys and values by torch.cat: the cache peaks at the
/// end of generation (batch x context tokens), not at prefill, and the caching allocator
/// holds more than is live (each longer tensor is allocated before the shorter is freed).
#[test]
fn dynamic_cache_grows_to_the_end_of_generation() {
    let s = job(LLAMA2_7B, 1, 1, "batch = 4\nprompt_len = 256\ngen_len = 64\nkv_cache = \"dynamic\"");
    let sim = stepsim::simulate(&s).unwrap();
    let r = &sim.report;
    let peak = r.peak.as_ref().unwrap();
    assert_eq!(peak.at.phase, stepsim::schedule::Phase::Decode);
    let kv = peak.breakdown.iter().find(|c| c.category == "kv_cache").unwrap().size.bytes;
    // 2 x 32 layers x 32 heads x 128 x 2 B = 512 KiB per token; at the last pass the cache
    // holds prompt + 63 tokens, plus the one layer being extended (its old copy).
    let per_token = 2 * 32 * 32 * 128 * 2u64;
    let last = 4 * (256 + 63) * per_token;
    let layer = 4 * (256 + 62) * per_token / 32;
    assert!(kv >= last && kv <= last + layer, "kv {kv} vs {last} + {layer}");
    assert!(peak.reserved.bytes > peak.allocated.bytes);
    assert!(!inf(r).cuda_graphs, "a dynamic cache runs eager by default");
}

/// gpt-fast's published batch-1 decode on 8 x A100-80GB (tests/fixtures/gpt_fast_decode.json,
/// from the gpt-fast README): BF16 rows (Llama-2-7B on one GPU, Llama-2-70B with TP 2, 4,
/// 8) within +-15%. The quantized rows (int8, int4 g32) are printed and must come out
/// faster than published: stepsim assumes dequantization hides under the weight reads, which
/// gpt-fast's kernels do not quite achieve (the report says so). Prompt 5 tokens, 200 new
/// tokens, static cache, CUDA graphs, as gpt-fast's benchmark runs.
#[test]
fn decode_speed_matches_gpt_fast() {
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("tests/fixtures/gpt_fast_decode.json").unwrap()).unwrap();
    println!("{:<12} {:<9} {:>3} {:>10} {:>10} {:>7}", "model", "weights", "tp", "published", "stepsim", "error");
    let mut worst: f64 = 0.0;
    for row in fixture["rows"].as_array().unwrap() {
        let model = row["model"].as_str().unwrap();
        let weights = row["weights"].as_str().unwrap();
        let tp = row["tensor"].as_u64().unwrap() as u32;
        let published = row["tokens_per_s"].as_f64().unwrap();
        let w = match weights {
            "int4-g32" => "weights = \"int4\"\ngroup_size = 32".to_string(),
            x => format!("weights = \"{x}\""),
        };
        let m = if model == "llama-2-7b" { LLAMA2_7B } else { LLAMA2_70B };
        let s = job(m, tp, tp, &format!("batch = 1\nprompt_len = 5\ngen_len = 200\n{w}"));
        let sim = stepsim::simulate(&s).unwrap();
        let got = inf(&sim.report).timing.as_ref().unwrap().decode_tokens_per_s;
        let err = got / published - 1.0;
        println!("{model:<12} {weights:<9} {tp:>3} {published:>10.2} {got:>10.2} {:>+6.1}%", err * 100.0);
        if weights == "bf16" {
            assert!(err.abs() < 0.15, "{model} {weights} tp {tp}: {got:.2} vs {published:.2} tokens/s");
            worst = worst.max(err.abs());
        } else {
            assert!(got > published, "{model} {weights}: {got:.2} should exceed {published:.2} (optimistic kernels)");
        }
    }
    println!("worst BF16 row: {:.1}%", worst * 100.0);
}

/// The shipped scenarios: 100B in int4 on one H100 fits with room for 7 sequences of 1280
/// tokens (84.98 GB capacity - 53.39 GB of weights = 31.6 GB, 4.19 GB of cache each), and
/// the capacity search's answers are consistent with direct runs; in BF16 with TP 4 it fits
/// too. The same model in BF16 on one GPU runs out of memory loading its weights.
#[test]
fn shipped_inference_scenarios_verdicts() {
    let s = Scenario::load(Path::new("scenarios/100b-1gpu-int4-inference.toml")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, Verdict::Fits { .. }));
    let fit = inf(&sim.report).max_fit.clone().unwrap();
    assert_eq!(fit.max_batch, 7);
    assert_eq!(fit.max_context, 2048);
    assert!(fit.context_limited_by.contains("max_seq_len"));
    let cfg = s.inference.clone().unwrap();
    for (batch, fits) in [(7, true), (8, false)] {
        let c = stepsim::infer::InferenceConfig { batch, ..cfg.clone() };
        let r = stepsim::inference_run(&s, &c, false, false, true).unwrap();
        assert_eq!(r.run.traces[0].oom.is_none(), fits, "batch {batch}");
    }

    let s = Scenario::load(Path::new("scenarios/100b-4gpu-tp4-inference.toml")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, Verdict::Fits { .. }));
    let r = inf(&sim.report);
    // 101.2B x 2 B / 4 plus replicated norms and biases.
    assert!((r.weights_per_gpu.gb - 50.64).abs() < 0.01, "{}", r.weights_per_gpu.gb);
    let t = r.timing.as_ref().unwrap();
    assert!(t.decode_comm_fraction > 0.0);

    let text = std::fs::read_to_string("scenarios/100b-1gpu-int4-inference.toml").unwrap();
    let bf16 = text.replace("weights = \"int4\"\ngroup_size = 128\n", "weights = \"bf16\"\n");
    let sim = stepsim::simulate(&scenario("bf16.toml", &bf16)).unwrap();
    let Verdict::Oom(o) = &sim.report.verdict else { panic!("BF16 weights should not fit on one GPU") };
    assert_eq!(o.at.phase, stepsim::schedule::Phase::Init);
    assert_eq!(inf(&sim.report).max_fit.as_ref().unwrap().max_batch, 0);
}

/// The same scenario and seed give byte-identical output.
#[test]
fn inference_reports_are_deterministic() {
    let s = job(LLAMA2_7B, 1, 1, "batch = 2\nprompt_len = 64\ngen_len = 16\nkv_cache = \"dynamic\"");
    let a = stepsim::report::write::report_json(&stepsim::simulate(&s).unwrap().report);
    let b = stepsim::report::write::report_json(&stepsim::simulate(&s).unwrap().report);
    assert_eq!(a, b);
}

/// Prefill's matmuls run as training's do, each GEMM kernel by its shape (the prompt's tokens
/// as rows); a decode pass's single-row GEMMs lie below the measured shapes (256 and up) and
/// take the steady rate against their weight reads. Llama-2-7B on one A100, a 2048-token
/// prompt: the MLP's gate projection w1 (2048 rows, 4096 in, 11008 out) is compute-bound, and
/// its prefill kernel takes the kernel model's time plus the launch overhead.
#[test]
fn prefill_gemms_take_their_kernel_time_by_shape() {
    use stepsim::model::OpKind;
    use stepsim::schedule::cost::{self, Cost};
    use stepsim::schedule::Phase;
    let s = job(LLAMA2_7B, 1, 1, "batch = 1\nprompt_len = 2048\ngen_len = 4\n");
    let sim = stepsim::simulate(&s).unwrap();
    let op = sim.dag.ops.iter().find(|o| o.kind == OpKind::Linear && o.name.ends_with("feed_forward.w1")).unwrap();
    let [m, n, k] = op.gemm.unwrap();
    assert_eq!(m, 2048);
    let c = Cost::new(&s.cluster, s.training.precision.compute, 1);
    let rate =
        c.peak_flops * cost::MATMUL_EFFICIENCY * s.cluster.gpu.max_matmul_fraction * cost::GEMM_STEADY_OVER_CEILING;
    let kernel = c.gemm_kernel_s(rate, m, n, k, 1);
    let steady = op.fwd_flops / rate;
    assert!(kernel > steady * 1.01, "the shape costs something: {kernel} vs {steady}");
    let sched = &sim.job.classes[0].schedule;
    let prefill = sched
        .program
        .tasks
        .iter()
        .find(|t| {
            let l = &sched.labels[t.label as usize];
            l.phase == Phase::Prefill && l.what == op.name
        })
        .unwrap();
    assert_eq!(prefill.duration_ns, cost::ns(cost::OP_OVERHEAD_S + kernel));
}
