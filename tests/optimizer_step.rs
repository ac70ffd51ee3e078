//! The optimizer step's temporaries by implementation and PyTorch release
//! (src/schedule/optimizer.rs, `torch/optim/adam.py`).

use std::path::Path;

use stepsim::memory::Category;
use stepsim::scenario::Scenario;

/// A 1.3B GPT under DDP on 8 A100s with FP32 Adam state (`fsdp-bf16-mixed`: FP32
/// parameters, gradients and moments).
fn job(training: &str) -> stepsim::Simulation {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 24\nhidden = 2048\nn_heads = 16\nvocab = 50257\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 8\n\
         [parallel]\nsharding = \"none\"\n\
         [training]\nmicro_batch = 1\nseq_len = 1024\noptimizer = \"adam\"\noptimizer_impl = \"foreach\"\nprecision = \"fsdp-bf16-mixed\"\n{training}"
    );
    let s = Scenario::from_toml(Path::new("<opt>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    stepsim::simulate(&s).unwrap()
}

fn step_temporaries(sim: &stepsim::Simulation) -> u64 {
    let prog = &sim.schedule().program;
    prog.buffers.iter().filter(|b| b.category == Category::OptimizerTemp).map(|b| b.bytes).max().unwrap()
}

/// Before PyTorch 2.1 foreach Adam kept the square root of the second moments and an
/// out-of-place denominator (`denom = torch._foreach_add(exp_avg_sq_sqrt, eps)`); since
/// pytorch#104780 the denominator is computed in place: one 4 B/parameter buffer less at
/// every step, the first included.
#[test]
fn foreach_adam_before_2_1_holds_one_more_fp32_intermediate() {
    let old = job("torch_version = \"2.0\"\n");
    let new = job("");
    let params = old.plan().local_total(false);
    assert_eq!(step_temporaries(&old), 2 * 4 * params);
    assert_eq!(step_temporaries(&new), 4 * params);
    let peak = |s: &stepsim::Simulation| s.phase_peak(1, stepsim::schedule::Phase::Optimizer).unwrap();
    assert_eq!(peak(&old) - peak(&new), 4 * params);
}

#[test]
fn the_torch_version_is_validated() {
    for bad in ["2", "3.0", "1.9", "two.one", "2.1.x", "2.16"] {
        let toml = format!(
            "[model]\nfamily = \"gpt\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nvocab = 1000\nmax_seq_len = 128\n\
             [hardware]\ngpu = \"a100-80gb\"\ngpus = 1\n[training]\nmicro_batch = 1\nseq_len = 128\ntorch_version = \"{bad}\"\n"
        );
        let e = Scenario::from_toml(Path::new("x.toml"), &toml).unwrap_err();
        assert_eq!(e.field, "training.torch_version", "{bad}: {e}");
        assert!(e.message.contains("\"1.10\" to \"2.15\""), "{bad}: {e}");
    }
}
