//! Fidelity of the time model with tensor and pipeline parallelism against Narayanan et al.
//! 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"),
//! Table 1: GPT models of 1.7B to 1T parameters on 32 to 3072 A100 80GB (Selene, 8 GPUs and
//! 8 x 200 Gb/s HDR per node), TFLOP/s per GPU achieved (fixture
//! tests/fixtures/narayanan_table1.json, copied from shared/reference with its source), and
//! Table 2's PTD-P rows; also two runs outside the paper with the same figure of merit: the
//! Megatron-LM README's GPT-3 175B example and BLOOM-176B's production run.
//!
//! Tolerance (issue 7): every compared row within +-15%, the median |error| within 10%. The
//! test prints predicted vs published for every row and the rows it skips with the reason.
//! No constant is set per row: the one calibration of src/schedule/cost.rs.
//!
//! Every row is simulated (the 1T row's pipeline runs 512 micro-batches through 64 stages
//! of 2 layers on the lean path, a few seconds; the test peaks at ~7 GB of memory).
//!
//! The published figure counts the paper's FLOPs per iteration (its Eq. 3, with the extra
//! forward pass of full recomputation): F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)); the
//! prediction is the same F over stepsim's steady-state step time and the GPU count.
//!
//! Stated assumptions (the table does not give them): micro-batch 1 (Megatron's GPT
//! scripts of the time); full activation recomputation and mixed precision as the paper
//! says; the interleaved 1F1B schedule where PP > 1, with the smallest number of model chunks
//! per stage (>= 2) that divides the stage's layers; no distributed optimizer (Megatron 2021:
//! every data-parallel rank holds the whole FP32 optimizer state of its model-parallel
//! partition, `sharding = "none"`); math attention (no flash attention in 2021), dropout 0.1,
//! vocabulary 51200, sequence 2048.

use std::path::Path;

use serde_json::Value;
use stepsim::scenario::Scenario;

fn chunks_per_stage(layers: u64, pp: u64) -> u64 {
    (2..=layers / pp).find(|v| (layers / pp) % v == 0).unwrap_or(1)
}

/// One Megatron-LM GPT run as the paper describes it: TFLOP/s per GPU by the paper's Eq. 3
/// over stepsim's steady-state step time.
struct Run {
    layers: u64,
    hidden: u64,
    heads: u64,
    tp: u64,
    pp: u64,
    gpus: u64,
    batch: u64,
    micro_batch: u64,
    /// Interleaved 1F1B (the paper's runs) or plain 1F1B (the README's example script).
    interleaved: bool,
}

const SEQ: u64 = 2048;
const VOCAB: u64 = 51200;

fn tflops_per_gpu(r: &Run) -> f64 {
    tflops_and_step(r).0
}

/// TFLOP/s per GPU by Eq. 3 and the steady-state step time, seconds.
fn tflops_and_step(r: &Run) -> (f64, f64) {
    let Run { layers, hidden, heads, tp, pp, gpus, batch, micro_batch, interleaved } = *r;
    let dp = gpus / (tp * pp);
    let mbs = batch / (dp * micro_batch);
    let pipeline = if pp > 1 && !interleaved {
        format!("pipeline = {pp}\nschedule = \"1f1b\"\n")
    } else if pp > 1 {
        let v = chunks_per_stage(layers, pp);
        format!("pipeline = {pp}\nschedule = \"interleaved-1f1b\"\nvirtual_stages = {v}\n")
    } else {
        String::new()
    };
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = {layers}\nhidden = {hidden}\nn_heads = {heads}\nvocab = {VOCAB}\n\
         max_seq_len = {SEQ}\ndropout = 0.1\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = {gpus}\nnode = \"dgx-a100\"\n\
         [parallel]\ntensor = {tp}\n{pipeline}sharding = \"none\"\n\
         [training]\nmicro_batch = {micro_batch}\nseq_len = {SEQ}\ngrad_accum = {mbs}\nprecision = \"bf16-mixed-adam\"\n\
         activation_checkpointing = \"full\"\nattention = \"math\"\noptimizer_impl = \"fused\"\n"
    );
    let step = step_time_s(&toml);
    (eq3_tflops_per_gpu(batch, layers, hidden, VOCAB, step, gpus), step)
}

/// The steady-state step time of a scenario given as TOML, which must fit.
fn step_time_s(toml: &str) -> f64 {
    let s = Scenario::from_toml(Path::new("<megatron>"), toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let dag = stepsim::model::build(&s.model, &s.workload);
    let rep = stepsim::simulate_lean(&s, &dag, &[]).unwrap();
    assert!(matches!(rep.verdict, stepsim::report::Verdict::Fits { .. }), "does not fit:\n{toml}");
    rep.throughput.as_ref().unwrap().step_time_s
}

/// Narayanan et al.'s Eq. 3 (full recomputation's extra forward included) over a step time.
fn eq3_tflops_per_gpu(batch: u64, layers: u64, hidden: u64, vocab: u64, step: f64, gpus: u64) -> f64 {
    let (b, s_, l, h, v) = (batch as f64, SEQ as f64, layers as f64, hidden as f64, vocab as f64);
    let flops = 96.0 * b * s_ * l * h * h * (1.0 + s_ / (6.0 * h) + v / (16.0 * l * h));
    flops / step / gpus as f64 / 1e12
}

/// Checks the tolerance over (label, error) pairs and prints the median.
fn check(errors: &mut [(String, f64)]) {
    let failures: Vec<String> =
        errors.iter().filter(|(_, e)| e.abs() > 0.15).map(|(l, e)| format!("{l}: {:+.1}%", e * 100.0)).collect();
    let mut abs: Vec<f64> = errors.iter().map(|(_, e)| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let median = abs[abs.len() / 2];
    println!("median |error| {:.1}% over {} rows", median * 100.0, abs.len());
    assert!(failures.is_empty(), "outside 15%:\n{}", failures.join("\n"));
    assert!(median <= 0.10, "median |error| {:.1}% > 10%", median * 100.0);
}

#[test]
fn narayanan_table1_weak_scaling_throughput() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/narayanan_table1.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut errors = Vec::new();
    println!(
        "{:>8} {:>4} {:>3} {:>5} {:>6} {:>10} {:>10} {:>8}",
        "params", "TP", "PP", "GPUs", "batch", "published", "stepsim", "error"
    );
    for row in v["metrics"]["rows"].as_array().unwrap() {
        let f = |i: usize| row[i].as_f64().unwrap();
        let params = f(0);
        let run = Run {
            layers: f(3) as u64,
            hidden: f(2) as u64,
            heads: f(1) as u64,
            tp: f(4) as u64,
            pp: f(5) as u64,
            gpus: f(7) as u64,
            batch: f(8) as u64,
            micro_batch: 1,
            interleaved: true,
        };
        let published = f(9);
        let pred = tflops_per_gpu(&run);
        let err = pred / published - 1.0;
        println!(
            "{params:>7}B {:>4} {:>3} {:>5} {:>6} {published:>10.0} {pred:>10.1} {:>+7.1}%",
            run.tp,
            run.pp,
            run.gpus,
            run.batch,
            err * 100.0
        );
        errors.push((format!("{params}B on {} GPUs", run.gpus), err));
    }
    assert_eq!(errors.len(), 10, "every row is compared");
    check(&mut errors);
}

/// Narayanan et al. 2021 Table 2, the PTD-P rows (tests/fixtures/narayanan_table2.json):
/// 175B (96 layers x 12288, 96 heads) with TP 8 x PP 12 and 530B (105 x 20480, 128 heads)
/// with TP 8 x PP 35, micro-batch 1 as the table states, on 1, 2 and 4 times the smallest
/// GPU count at a fixed global batch. The ZeRO-3 rows are classified in
/// tests/fidelity_throughput.rs.
#[test]
fn narayanan_table2_ptdp_throughput() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/narayanan_table2.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut errors = Vec::new();
    println!("{:>8} {:>5} {:>6} {:>10} {:>10} {:>8}", "params", "GPUs", "batch", "published", "stepsim", "error");
    for row in v["metrics"]["rows"].as_array().unwrap() {
        if row[0] != "PTD-P" {
            continue;
        }
        let params = row[1].as_f64().unwrap();
        let (layers, hidden, heads, pp) = if params < 200.0 { (96, 12288, 96, 12) } else { (105, 20480, 128, 35) };
        let run = Run {
            layers,
            hidden,
            heads,
            tp: 8,
            pp,
            gpus: row[4].as_u64().unwrap(),
            batch: row[3].as_u64().unwrap(),
            micro_batch: row[5].as_u64().unwrap(),
            interleaved: true,
        };
        assert_eq!(row[2].as_u64().unwrap(), 8 * pp, "model-parallel size");
        let published = row[6].as_f64().unwrap();
        let pred = tflops_per_gpu(&run);
        let err = pred / published - 1.0;
        println!("{params:>7}B {:>5} {:>6} {published:>10.0} {pred:>10.1} {:>+7.1}%", run.gpus, run.batch, err * 100.0);
        errors.push((format!("{params}B on {} GPUs", run.gpus), err));
    }
    assert_eq!(errors.len(), 6, "every PTD-P row is compared");
    check(&mut errors);
}

/// The Megatron-LM README's GPT-3 175B example (tests/fixtures/megatron_readme_gpt3.json):
/// examples/pretrain_gpt3_175B.sh on 1024 A100, TP 8 x PP 16 x DP 8, plain 1F1B over 192
/// micro-batches of 1, full recompute; "around 32 seconds" per iteration and 138 TFLOP/s per
/// GPU. Same tolerance as the tables: within 15%.
#[test]
fn megatron_readme_gpt3_175b_example() {
    let f: Value = serde_json::from_str(include_str!("fixtures/megatron_readme_gpt3.json")).unwrap();
    let rows = f["metrics"]["rows"].as_array().unwrap();
    let (published_s, published_tflops) = (rows[0][1].as_f64().unwrap(), rows[1][1].as_f64().unwrap());
    let run = Run {
        layers: 96,
        hidden: 12288,
        heads: 96,
        tp: 8,
        pp: 16,
        gpus: 1024,
        batch: 1536,
        micro_batch: 1,
        interleaved: false,
    };
    let (tflops, step) = tflops_and_step(&run);
    let (e_s, e_t) = (step / published_s - 1.0, tflops / published_tflops - 1.0);
    println!("iteration {step:.2} s vs ~{published_s} s ({:+.1}%); {tflops:.1} vs {published_tflops} TFLOP/s per GPU ({:+.1}%)", e_s * 100.0, e_t * 100.0);
    assert!(e_s.abs() <= 0.15 && e_t.abs() <= 0.15, "{e_s} {e_t}");
}

/// BLOOM-176B's production run (tests/fixtures/bloom176b.json; BigScience tr11 on Jean
/// Zay): Megatron-DeepSpeed, TP 4 x PP 12 x DP 8 on 384 A100 80GB, micro-batch 2, global
/// batch 2048 (128 micro-batches per pipeline), full recompute, BF16 with DeepSpeed's
/// BF16_Optimizer (ZeRO-1 over data parallelism, FP32 gradient accumulation), the tied
/// embeddings counted as layers by the pipeline partition (stage 0: embedding + 5 blocks,
/// stages 1-10: 6, stage 11: 5 + the head), 4 x 100 Gb/s Omni-Path per 8-GPU node.
/// Published: 105.22 s per iteration and 149.02 TFLOP/s per GPU by the same Eq. 3 (its
/// "4*2" coefficient). Stated assumptions: DeepSpeed's pipeline schedule as 1F1B (its
/// TrainSchedule is PipeDream-flush), math attention with dropout 0.1, ALiBi and the
/// embedding layer norm left out (their FLOPs and bytes are well under 1%), learned
/// position embeddings kept (29M parameters). Same tolerance as the tables: within 15%.
#[test]
fn bloom_176b_production_run() {
    let f: Value = serde_json::from_str(include_str!("fixtures/bloom176b.json")).unwrap();
    let published_s = f["figures"]["iteration_s"].as_f64().unwrap();
    let published_tflops = f["figures"]["tflops_per_gpu"].as_f64().unwrap();
    let (layers, hidden, heads, vocab, gpus, batch) = (70u64, 14336u64, 112u64, 250880u64, 384u64, 2048u64);
    let stages = [5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5].map(|x: u64| x.to_string()).join(", ");
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = {layers}\nhidden = {hidden}\nn_heads = {heads}\nvocab = {vocab}\n\
         max_seq_len = {SEQ}\ndropout = 0.1\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = {gpus}\nnode = \"dgx-a100\"\nnics_per_node = 4\nnic_gbps = 100\n\
         [parallel]\ntensor = 4\npipeline = 12\nschedule = \"1f1b\"\nstage_layers = [{stages}]\nsharding = \"zero1\"\n\
         [training]\nmicro_batch = 2\nseq_len = {SEQ}\ngrad_accum = 128\nprecision = \"bf16-mixed-adam-fp32-grads\"\n\
         activation_checkpointing = \"full\"\nattention = \"math\"\noptimizer_impl = \"fused\"\n"
    );
    let step = step_time_s(&toml);
    let tflops = eq3_tflops_per_gpu(batch, layers, hidden, vocab, step, gpus);
    let (e_s, e_t) = (step / published_s - 1.0, tflops / published_tflops - 1.0);
    println!(
        "BLOOM-176B: iteration {step:.2} s vs {published_s} s ({:+.1}%); {tflops:.1} vs {published_tflops} TFLOP/s per GPU ({:+.1}%)",
        e_s * 100.0,
        e_t * 100.0
    );
    assert!(e_s.abs() <= 0.15 && e_t.abs() <= 0.15, "{e_s} {e_t}");
}
