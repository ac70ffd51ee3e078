//! The GPU catalog's consumer and inference parts (issue 19): fine-tuning on one RTX 4090
//! runs and fits, and a small full fine-tune runs on every part added with them.

use std::path::Path;

use stepsim::report::Verdict;
use stepsim::scenario::Scenario;

/// Llama-3.1-8B (the zoo's config.json) fine-tuned with QLoRA on one GPU: NF4 with double
/// quantization, rank 16 on every linear, full checkpointing, 1 x 2048 tokens.
fn qlora_8b(hardware: &str) -> String {
    format!(
        "[model]\nname = \"llama-3.1-8b\"\nmax_seq_len = 2048\n\
         [hardware]\n{hardware}\n\
         [job]\nkind = \"finetune-lora\"\n\
         [lora]\nrank = 16\nalpha = 32.0\ntarget_modules = [\"all-linear\"]\nbase_weights = \"nf4\"\ndouble_quant = true\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 4\noptimizer = \"adamw\"\nactivation_checkpointing = \"full\"\n"
    )
}

fn scenario(toml: &str) -> Scenario {
    Scenario::from_toml(Path::new("gpus.toml"), toml).unwrap_or_else(|e| panic!("{e}"))
}

/// The QLoRA recipe's point: an 8B model fine-tunes on one 24 GB card. The base is 8.03B
/// parameters at about 0.52 B each in NF4 plus the FP32 embeddings and head (4.2 GB); the peak
/// stays well under the 4090's 24,564 MiB, and the step is compute-bound at the card's
/// FP32-accumulate BF16 peak (165.2 TFLOP/s), which MFU is measured against.
#[test]
fn qlora_of_an_8b_model_fits_one_rtx_4090() {
    let s = scenario(&qlora_8b("gpu = \"rtx-4090\"\ngpus = 1"));
    assert_eq!(s.cluster.gpu.name, "rtx-4090");
    assert_eq!(s.cluster.memory_bytes, 24_564 << 20);
    assert_eq!(s.cluster.node, "workstation");
    let sim = stepsim::simulate(&s).unwrap();
    let r = &sim.report;
    assert!(matches!(r.verdict, Verdict::Fits { .. }), "{:?}", r.verdict);
    let peak = r.peak.as_ref().unwrap().reserved.bytes;
    assert!(peak > 8_000_000_000 && peak < 20_000_000_000, "peak reserved {peak}");
    let t = r.throughput.as_ref().expect("a timed step");
    assert!(t.mfu > 0.2 && t.mfu < 1.0 && t.hfu >= t.mfu, "MFU {} HFU {}", t.mfu, t.hfu);
    assert!(t.assumptions[0].starts_with("peak 165 TFLOP/s dense bf16 (NVIDIA Ada"), "{}", t.assumptions[0]);
    // The same job in BF16 LoRA holds the 16 GB base: more than the NF4 one.
    let lora = scenario(
        &qlora_8b("gpu = \"rtx-4090\"\ngpus = 1").replace("base_weights = \"nf4\"\ndouble_quant = true\n", ""),
    );
    let lora = stepsim::simulate(&lora).unwrap();
    assert!(lora.report.model_state_per_gpu.parameters.bytes > 15_000_000_000);
    assert!(sim.report.model_state_per_gpu.parameters.bytes < 9_000_000_000);
}

/// A small full fine-tune (GPT 350M, BF16 mixed-precision AdamW) on each consumer and inference
/// part runs, fits, and is timed no faster than the part's peak allows.
#[test]
fn a_small_full_fine_tune_runs_on_every_new_part() {
    for gpu in [
        "rtx-3090",
        "rtx-4090",
        "rtx-5090",
        "l4",
        "l40s",
        "a10g",
        "h100-nvl",
        "h20",
        "gh200-96gb",
        "gh200-144gb",
        "gb200",
        "mi325x",
    ] {
        let toml = format!(
            "[model]\nfamily = \"gpt\"\nn_layers = 24\nhidden = 1024\nn_heads = 16\nvocab = 50257\nmax_seq_len = 1024\n\
             [hardware]\ngpu = \"{gpu}\"\ngpus = 1\n\
             [training]\nmicro_batch = 4\nseq_len = 1024\ngrad_accum = 2\noptimizer = \"adamw\"\nprecision = \"bf16-mixed-adam\"\n"
        );
        let s = scenario(&toml);
        let sim = stepsim::simulate(&s).unwrap();
        assert!(matches!(sim.report.verdict, Verdict::Fits { .. }), "{gpu}: {:?}", sim.report.verdict);
        let t = sim.report.throughput.as_ref().unwrap();
        assert!(t.mfu > 0.0 && t.mfu < 1.0, "{gpu}: MFU {}", t.mfu);
    }
}
