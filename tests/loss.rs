//! The loss at long sequence and large vocabulary, implementation by implementation, against
//! figures derived by hand: what each keeps of the tokens x vocabulary logits, the FLOPs the
//! fused linear cross-entropy moves into forward, and the peak each leaves. A small llama
//! (hidden 1024, 4 blocks) with a 128,256-word vocabulary at 8,192 tokens, where the head's
//! tensors (1.05e9 elements) dwarf the blocks'.

use std::path::Path;

use stepsim::model::{self, LossKind, OpKind, Region};
use stepsim::scenario::Scenario;

const H: u64 = 1024;
const V: u64 = 128_256;
const T: u64 = 8192;

fn scenario(framework: &str, loss: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 4\nhidden = {H}\nn_heads = 8\nffn_hidden = 3584\nvocab = {V}\nmax_seq_len = {T}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 1\n\
         [parallel]\nframework = \"{framework}\"\n\
         [training]\nmicro_batch = 1\nseq_len = {T}\ngrad_accum = 1\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n{loss}"
    );
    Scenario::from_toml(Path::new("<loss>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// Megatron's framework defaults to its own vocab-parallel cross-entropy, everything else
/// to eager PyTorch; each can be chosen.
#[test]
fn each_framework_defaults_to_its_own_cross_entropy() {
    assert_eq!(scenario("megatron", "").workload.loss, LossKind::VocabParallel);
    assert_eq!(scenario("fsdp", "").workload.loss, LossKind::Eager);
    assert_eq!(scenario("megatron", "loss = \"eager\"").workload.loss, LossKind::Eager);
    assert_eq!(scenario("fsdp", "loss = \"fused-linear\"").workload.loss, LossKind::FusedLinear);
}

/// Eager: 16-bit logits, an FP32 copy (logits.float()) and the FP32 log-softmax it saves.
/// Megatron: no copy; the logits are exponentiated in place into the FP32 softmax it saves.
/// Liger: no logits beyond one chunk of next_power_of_2(8192 / ceil(128256 / 1024) = 126)
/// = 128 tokens; it saves the input gradient (tokens x hidden) and the weight gradient
/// (vocab x hidden), 16-bit.
#[test]
fn what_each_loss_keeps_of_the_logits() {
    let dag = |s: &Scenario| model::build(&s.model, &s.workload);
    let eager = dag(&scenario("fsdp", ""));
    let names = |d: &model::LayerDag| d.tensors.iter().map(|t| (t.name.clone(), t.bytes)).collect::<Vec<_>>();
    let e = names(&eager);
    assert!(e.contains(&("output.logits".into(), T * V * 2)));
    assert!(e.contains(&("output.logits.float".into(), T * V * 4)));
    assert!(e.contains(&("loss.log_softmax".into(), T * V * 4)));
    let vp = dag(&scenario("megatron", ""));
    let n = names(&vp);
    assert!(n.contains(&("loss.softmax".into(), T * V * 4)));
    assert!(!n.iter().any(|(x, _)| x == "output.logits.float" || x == "loss.log_softmax"));
    assert!(!vp.ops.iter().any(|o| o.kind == OpKind::Cast));
    let fl = dag(&scenario("fsdp", "loss = \"fused-linear\""));
    let n = names(&fl);
    assert!(!n.iter().any(|(x, _)| x.starts_with("output.logits") || x.starts_with("loss.")));
    let head = fl.ops.iter().find(|o| o.name == "output").unwrap();
    assert_eq!(head.fwd_scratch, 128 * V * 2);
    let saved: u64 = head.saves.iter().map(|&t| fl.tensors[t].bytes).sum();
    assert_eq!(saved, T * H * 2 + V * H * 2);
    // The head's three GEMMs (logits, input and weight gradients) run in forward.
    let gemm = 2.0 * (T * H * V) as f64;
    assert_eq!(head.fwd_flops, 3.0 * gemm + 5.0 * (T * V) as f64);
    assert_eq!(head.bwd_flops, 0.0);
    // The same parameters either way.
    assert_eq!(fl.param_count(), eager.param_count());
    // Eager's head saves the log-softmax and the targets; Liger's saves neither but the two
    // gradients: the difference is 4 T V + 8 T - 2 V H bytes.
    assert_eq!(
        eager.saved_bytes(Region::Head, true) - fl.saved_bytes(Region::Head, true),
        4 * T * V + 8 * T - 2 * V * H
    );
}

/// The peaks order as the logits they keep: eager above Megatron's (one FP32 copy fewer)
/// above Liger's (no logits at all), and the fused loss is not slower than eager by more
/// than its extra pass.
#[test]
fn the_peak_follows_the_logits_kept() {
    let peak = |s: &Scenario| {
        let r = stepsim::simulate(s).unwrap().report;
        (r.peak.as_ref().unwrap().allocated.bytes, r.throughput.as_ref().unwrap().step_time_s)
    };
    let (eager, te) = peak(&scenario("megatron", "loss = \"eager\""));
    let (vp, _) = peak(&scenario("megatron", ""));
    let (fl, tf) = peak(&scenario("fsdp", "loss = \"fused-linear\""));
    assert!(eager >= vp + 4 * T * V - (1 << 21), "eager {eager} vocab-parallel {vp}");
    assert!(vp > fl + 4 * T * V, "vocab-parallel {vp} fused-linear {fl}");
    assert!(tf < te * 1.2, "fused-linear {tf} s vs eager {te} s");
}
