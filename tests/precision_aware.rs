//! Megatron's precision-aware optimizer (`[megatron] use_precision_aware_optimizer`), rule by
//! rule on a small job whose figures follow from the parameter count
//! (src/plan/precision_aware.rs cites Megatron-Core's and Transformer Engine's source).

use std::path::Path;

use stepsim::memory::Category;
use stepsim::scenario::Scenario;
use stepsim::schedule::Phase;

/// A 24-layer GPT (about 1.3B parameters) on 8 A100s, Megatron's distributed optimizer,
/// with `megatron` in its `[megatron]` section.
fn toml(megatron: &str, precision: &str) -> String {
    format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 24\nhidden = 2048\nn_heads = 16\nvocab = 50304\nmax_seq_len = 2048\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 8\n\
         [parallel]\nframework = \"megatron\"\nsharding = \"zero1\"\n\
         [megatron]\n{megatron}\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 2\nprecision = \"{precision}\"\nattention = \"flash\"\n"
    )
}

fn job(megatron: &str) -> stepsim::Simulation {
    let s = Scenario::from_toml(Path::new("<pa>"), &toml(megatron, "bf16-mixed-adam-fp32-grads"))
        .unwrap_or_else(|e| panic!("{e}"));
    stepsim::simulate(&s).unwrap()
}

fn refused(megatron: &str, precision: &str) -> String {
    Scenario::from_toml(Path::new("<pa>"), &toml(megatron, precision)).unwrap_err().to_string()
}

/// Highest bytes of `cat` over the samples of `phase` in `step`.
fn most(sim: &stepsim::Simulation, cat: Category, phase: Phase, step: u32) -> u64 {
    sim.samples_in(step, Some(phase)).map(|x| x.by_category[cat.index()]).max().unwrap_or(0)
}

#[test]
fn remainders_halve_the_master_and_leave_the_moments_fp32() {
    let base = job("");
    let on = job("use_precision_aware_optimizer = true");
    let el = base.plan().local_total(true);
    assert_eq!(el, on.plan().local_total(true));
    // FP32 master 4 B -> int16 remainders 2 B; moments 2 x 4 B either way.
    assert_eq!(base.plan().model_state().master_weights, 4 * el);
    assert_eq!(on.plan().model_state().master_weights, 2 * el);
    assert_eq!(on.plan().model_state().optimizer_state, 8 * el);
    // FusedAdam makes its master at the first step, with the moments; none at init.
    assert_eq!(most(&on, Category::MasterWeights, Phase::Init, 0), 0);
    assert_eq!(most(&on, Category::MasterWeights, Phase::Optimizer, 1), 2 * el);
    // All states FP32: used in place, no FP32 copies at the step.
    assert_eq!(most(&on, Category::OptimizerTemp, Phase::Optimizer, 1), 0);
}

#[test]
fn low_precision_moments_shrink_the_state_and_are_unscaled_for_the_step() {
    let bf16 = job("use_precision_aware_optimizer = true\nexp_avg_dtype = \"bf16\"\nexp_avg_sq_dtype = \"bf16\"");
    let el = bf16.plan().local_total(true);
    assert_eq!(bf16.plan().model_state().optimizer_state, 4 * el);
    // Both moments unscaled into FP32 copies of the whole shard, held through the kernel.
    assert_eq!(most(&bf16, Category::OptimizerTemp, Phase::Optimizer, 1), 8 * el);
    let fp8 = job("use_precision_aware_optimizer = true\nexp_avg_dtype = \"fp8\"\nexp_avg_sq_dtype = \"fp16\"\nmain_params_dtype = \"fp16\"");
    // FP8 1 B + FP16 2 B; an FP16 master (no remainders) 2 B, unscaled too.
    assert_eq!(fp8.plan().model_state().optimizer_state, 3 * el);
    assert_eq!(fp8.plan().model_state().master_weights, 2 * el);
    assert_eq!(most(&fp8, Category::OptimizerTemp, Phase::Optimizer, 1), 12 * el);
}

#[test]
fn bf16_main_grads_are_the_gradient_buffer_dtype() {
    let s = Scenario::from_toml(
        Path::new("<pa>"),
        &toml("use_precision_aware_optimizer = true\nmain_grads_dtype = \"bf16\"", "bf16-mixed-adam"),
    )
    .unwrap();
    assert_eq!(s.training.precision.grad, stepsim::model::Dtype::Bf16);
    let sim = stepsim::simulate(&s).unwrap();
    // Megatron's gradient buffer holds every local parameter's main_grad: 2 B each.
    assert_eq!(sim.plan().model_state().gradients, 2 * sim.plan().local_total(false));
}

#[test]
fn the_step_moves_what_fused_adam_reads_and_writes() {
    let t = |m: &str| job(m).plan().training.optimizer_step_bytes();
    // Without: clip 3 x 4, Adam (master r/w 8 + grad 4 + moments r/w 16), master -> BF16 6.
    assert_eq!(t(""), 12 + 28 + 6);
    // Remainders: clip 12; one kernel reads the FP32 gradient 4, moments r/w 16, and the BF16
    // parameter with its int16 remainder r/w 2 x (2 + 2).
    assert_eq!(t("use_precision_aware_optimizer = true"), 12 + 4 + 16 + 8);
    // BF16 moments: unscale 2 x (2 + 4), the kernel on FP32 copies, rescale 2 x (4 + 2 + 2 + 2).
    assert_eq!(
        t("use_precision_aware_optimizer = true\nexp_avg_dtype = \"bf16\"\nexp_avg_sq_dtype = \"bf16\""),
        12 + 12 + (4 + 16 + 8) + 20
    );
}

#[test]
fn megatron_s_checks_are_kept() {
    let e = refused("exp_avg_dtype = \"bf16\"", "bf16-mixed-adam");
    assert!(e.contains("megatron.exp_avg_dtype") && e.contains("use_precision_aware_optimizer"), "{e}");
    let e = refused("use_precision_aware_optimizer = true\nexp_avg_sq_dtype = \"int8\"", "bf16-mixed-adam");
    assert!(e.contains("megatron.exp_avg_sq_dtype") && e.contains("\"fp8\""), "{e}");
    let e = refused("use_precision_aware_optimizer = true\nmain_params_dtype = \"bf16\"", "bf16-mixed-adam");
    assert!(e.contains("megatron.main_params_dtype") && e.contains("\"fp16\""), "{e}");
    let e = refused("use_precision_aware_optimizer = true\nmain_grads_dtype = \"bf16\"", "bf16-mixed-adam-fp32-grads");
    assert!(e.contains("megatron.main_grads_dtype") && e.contains("accumulate-allreduce-grads-in-fp32"), "{e}");
    let e = Scenario::from_toml(
        Path::new("<pa>"),
        &toml("use_precision_aware_optimizer = true", "bf16-mixed-adam").replace("sharding = \"zero1\"", ""),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("distributed optimizer"), "{e}");
    let e = refused("use_precision_aware_optimizer = true", "bf16");
    assert!(e.contains("master"), "{e}");
}

#[test]
fn explain_offers_the_remainders_under_the_distributed_optimizer() {
    // On a 32 GB V100 at micro-batch 64 the job does not fit, so explain tries its changes.
    let small = toml("", "bf16-mixed-adam-fp32-grads")
        .replace("a100-80gb", "v100-32gb")
        .replace("micro_batch = 1", "micro_batch = 64")
        .replace(
            "precision = \"bf16-mixed-adam-fp32-grads\"",
            "precision = \"bf16-mixed-adam-fp32-grads\"\ncompute_dtype = \"fp16\"\nparam_dtype = \"fp16\"",
        );
    let s = Scenario::from_toml(Path::new("<pa>"), &small).unwrap_or_else(|e| panic!("{e}"));
    let sim = stepsim::simulate(&s).unwrap();
    let e = stepsim::explain::explain(&s, &sim, stepsim::explain::DEFAULT_MARGIN);
    // FP16 parameters: no remainders (they need BF16 ones), so the row says why.
    let row = e.counterfactuals.iter().find(|c| c.change.contains("precision-aware")).expect("a row");
    assert!(row.note.as_deref().unwrap_or("").contains("BF16"), "{row:?}");
    // With BF16 parameters the row is re-simulated, 2 B per sharded element lower.
    let bf16 = toml("", "bf16-mixed-adam-fp32-grads").replace("micro_batch = 1", "micro_batch = 64");
    let s = Scenario::from_toml(Path::new("<pa>"), &bf16).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let e = stepsim::explain::explain(&s, &sim, stepsim::explain::DEFAULT_MARGIN);
    let row = e
        .counterfactuals
        .iter()
        .find(|c| c.change.contains("use_precision_aware_optimizer"))
        .expect("offered under Megatron's distributed optimizer");
    // Re-simulated (the activations set this job's peak, so it still does not fit), and a
    // step that moves fewer bytes (remainders: no separate master-to-parameter copy).
    assert!(row.fits.is_some() && row.peak.is_some(), "{row:?}");
    assert!(row.tokens_per_s_change.unwrap() >= 0.0, "{row:?}");
}

#[test]
fn megatron_s_flags_import_from_the_command_line_and_the_log() {
    use stepsim::import::megatron::{import, MegatronArgs};
    let args = MegatronArgs { gpu: "a100-80gb".into(), gpus: Some(8), gpus_per_node: None, vocab: Some(50304) };
    let base = "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
                --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 16 --bf16 \
                --use-distributed-optimizer";
    let cmd = format!("{base} --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype fp8");
    let s = Scenario::from_toml(Path::new("i.toml"), &import("cmd.txt", &cmd, &args).unwrap().render("megatron"))
        .unwrap_or_else(|e| panic!("{e}"));
    let pa = s.training.precision.aware.expect("precision-aware");
    assert_eq!((pa.exp_avg.name(), pa.exp_avg_sq.name()), ("bf16", "fp8"));
    assert!(pa.store_param_remainders);
    // A log prints torch dtypes; at their fp32 defaults without the flag nothing is set.
    let log = format!("{base} --exp-avg-dtype torch.float32 --main-grads-dtype torch.float32");
    let s = Scenario::from_toml(Path::new("i.toml"), &import("cmd.txt", &log, &args).unwrap().render("megatron"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(s.training.precision.aware.is_none());
    let bad = format!("{base} --use-precision-aware-optimizer --exp-avg-dtype int4");
    let e = import("cmd.txt", &bad, &args).unwrap_err().to_string();
    assert!(e.contains("exp_avg_dtype") && e.contains("int4"), "{e}");
}
