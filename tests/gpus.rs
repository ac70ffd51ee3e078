//! The GPU catalog's consumer and inference parts, and a user-defined GPU (issue 19):
//! fine-tuning on one RTX 4090 runs and fits, and `[hardware.custom]` with the catalog entry's
//! own figures simulates the same step.

use std::path::Path;

use stepsim::hardware::{self, Arch};
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
        "h800",
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

/// The catalog's RTX 4090 written out as `[hardware.custom]` is the same GPU: the same
/// figures, the same peak memory and step time; only the name and the source differ.
#[test]
fn a_custom_gpu_with_the_catalog_figures_simulates_the_same_step() {
    let custom = "gpu = \"custom\"\ngpus = 1\nnode = \"workstation\"\n\
                  [hardware.custom]\nname = \"my 4090\"\nmemory = \"24564MiB\"\nbf16_tflops = 165.2\ntf32_tflops = 82.6\n\
                  fp32_tflops = 82.6\nfp8_tflops = 330.3\nhbm_gb_per_s = 1008\nnvlink_gb_per_s = 31\npcie_gen = 4\nsms = 128\n\
                  max_matmul_fraction = 1.082\narch = \"ada\"";
    // [hardware.custom] must come after the [hardware] keys: it is a sub-table.
    let a = scenario(&qlora_8b("gpu = \"rtx-4090\"\ngpus = 1"));
    let b = scenario(&qlora_8b(custom));
    let catalog = hardware::lookup("rtx-4090").unwrap();
    let mut g = b.cluster.gpu.clone();
    assert_eq!(g.name, "my 4090");
    assert_eq!(g.source, "user-defined in [hardware.custom]");
    g.name = catalog.name.clone();
    g.source = catalog.source;
    g.default_node = catalog.default_node;
    assert_eq!(&g, catalog);
    let (sa, sb) = (stepsim::simulate(&a).unwrap(), stepsim::simulate(&b).unwrap());
    let reserved = |s: &stepsim::Simulation| s.report.peak.as_ref().unwrap().reserved.bytes;
    assert_eq!(reserved(&sa), reserved(&sb));
    let (ta, tb) = (sa.report.throughput.as_ref().unwrap(), sb.report.throughput.as_ref().unwrap());
    assert_eq!(ta.step_time_s, tb.step_time_s);
    assert!(tb.assumptions[0].contains("user-defined in [hardware.custom]"), "{}", tb.assumptions[0]);
}

/// The optional fields' defaults: name "custom", FP16 = BF16, no TF32 / FP8, PCIe 4, no SM
/// count (no waves or split-K, said so), a matmul ceiling of 0.8, Hopper's library defaults,
/// the generic PCIe server for a node.
#[test]
fn a_minimal_custom_gpu_takes_the_stated_defaults() {
    let toml = qlora_8b(
        "gpu = \"custom\"\ngpus = 1\n[hardware.custom]\nmemory = 34359738368\nbf16_tflops = 200\nfp32_tflops = 50\n\
         hbm_gb_per_s = 1500\nnvlink_gb_per_s = 63",
    );
    let s = scenario(&toml);
    let g = &s.cluster.gpu;
    assert_eq!(
        (g.name.as_ref(), g.memory_bytes, g.fp16_flops, g.bf16_flops),
        ("custom", 32 << 30, 200e12, Some(200e12))
    );
    assert_eq!((g.tf32_flops, g.fp8_flops, g.pcie_gen, g.sms), (None, None, 4, 0));
    assert_eq!((g.max_matmul_fraction, g.arch, s.cluster.node.as_str()), (0.8, Arch::Hopper, "pcie-8gpu"));
    assert_eq!(g.blas_workspace_bytes(), 32 << 20);
    let sim = stepsim::simulate(&s).unwrap();
    let t = sim.report.throughput.as_ref().unwrap();
    assert!(t.assumptions[1].contains("no waves or split-K (the GPU's SM count is not given)"), "{}", t.assumptions[1]);
    // A custom GPU without FP8 refuses FP8 training like a catalog part without it.
    let e = Scenario::from_toml(Path::new("gpus.toml"), &format!("{toml}\n[fp8]\nrecipe = \"tensorwise\"\n"));
    assert!(e.is_err());
}
