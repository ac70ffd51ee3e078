//! Megatron-Core's `--overlap-moe-expert-parallel-comm` (the combined 1F1B schedule): the
//! order it runs a forward and another micro-batch's backward in, layer by layer
//! (`TransformerLayerSchedulePlan.run`, NVIDIA/Megatron-LM d98e8a6), what that hides, and the
//! configurations Megatron refuses. The model is a small Mixtral-shaped llama (hidden 1024,
//! 16 experts of 1792, top-2, 4 blocks) so each case runs in well under a second.

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::schedule::Phase;

const LAYERS: u64 = 4;

/// The model on `gpus` H100s (DGX nodes) under Megatron-LM with `parallel`, `megatron` and
/// `training` lines; micro-batch 1 x 2048.
fn toml(gpus: u64, parallel: &str, megatron: &str, training: &str) -> String {
    format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = 1024\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = 2048\n\
         [model.moe]\nnum_experts = 16\ntop_k = 2\nexpert_ffn_hidden = 1792\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\nnode = \"dgx-h100\"\n\
         [parallel]\nframework = \"megatron\"\nsharding = \"zero1\"\n{parallel}\n\
         [megatron]\n{megatron}\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n{training}\n"
    )
}

fn scenario(gpus: u64, parallel: &str, megatron: &str, training: &str) -> Scenario {
    Scenario::from_toml(Path::new("<ep-overlap>"), &toml(gpus, parallel, megatron, training))
        .unwrap_or_else(|e| panic!("{e}"))
}

const ON: &str = "overlap_moe_expert_parallel_comm = true";
const PLAIN: &str = "activation_checkpointing = \"none\"\ngrad_accum = 4";

/// Megatron's own checks (`TransformerConfig.__post_init__`), each naming the field.
#[test]
fn megatrons_preconditions_are_refused_with_the_field_named() {
    let cases = [
        ("expert = 1", PLAIN.to_string(), "only supported with expert model parallelism"),
        (
            "expert = 8\npipeline = 2\nschedule = \"1f1b\"",
            PLAIN.to_string(),
            "virtual_pipeline_model_parallel_size must be specified",
        ),
        ("expert = 8", "activation_checkpointing = \"full\"\ngrad_accum = 4".into(), "disable full recomputation"),
        (
            "expert = 8",
            "activation_checkpointing = \"selective\"\nrecompute_modules = [\"moe\"]\ngrad_accum = 4".into(),
            "disable moe in recompute_modules",
        ),
    ];
    for (parallel, training, says) in cases {
        let err = Scenario::from_toml(Path::new("<ep-overlap>"), &toml(16, parallel, ON, &training))
            .err()
            .unwrap_or_else(|| panic!("{parallel} / {training}: accepted"))
            .to_string();
        assert!(err.contains("megatron.overlap_moe_expert_parallel_comm"), "{err}");
        assert!(err.contains(says), "{err}");
    }
    // The same jobs without the flag are accepted.
    scenario(8, "expert = 8", "", "activation_checkpointing = \"full\"\ngrad_accum = 4");
}

/// The order of one combined step without a pipeline: micro-batch 1's forward beside
/// micro-batch 0's backward, forward layer i with backward layer 3 - i. On the expert-parallel
/// stream, per layer pair: the backward's combine, the forward's dispatch, the backward's
/// dispatch, the forward's combine; on the compute stream the forward's layer starts (its
/// attention) right after the backward's post-combine ops, before the backward's experts.
#[test]
fn a_forward_runs_layer_by_layer_beside_the_previous_micro_batchs_backward() {
    let sim = stepsim::simulate(&scenario(8, "expert = 8", ON, PLAIN)).unwrap();
    let sched = sim.schedule();
    let prog = &sched.program;
    // Step 1's tasks of micro-batch 1's forward and micro-batch 0's backward on a stream, in
    // program order, as "F1 name" / "B0 name".
    let passes = |stream: &str| -> Vec<String> {
        let on = prog.streams.iter().position(|s| s == stream).unwrap() as u16;
        prog.tasks
            .iter()
            .filter(|t| t.stream == on)
            .map(|t| &sched.labels[t.label as usize])
            .filter(|l| {
                l.step == 1
                    && (l.micro_batch == 1 && l.phase == Phase::Forward
                        || l.micro_batch == 0 && l.phase == Phase::Backward)
            })
            .map(|l| format!("{}{} {}", if l.phase == Phase::Forward { "F" } else { "B" }, l.micro_batch, l.what))
            .collect()
    };
    let a2a = passes("ep");
    let mut want = Vec::new();
    for i in 0..LAYERS {
        let j = LAYERS - 1 - i;
        want.push(format!("B0 layers.{j}.feed_forward.combine (backward)"));
        want.push(format!("F1 layers.{i}.feed_forward.dispatch"));
        want.push(format!("B0 layers.{j}.feed_forward.dispatch (backward)"));
        want.push(format!("F1 layers.{i}.feed_forward.combine"));
    }
    assert_eq!(a2a, want);
    // Compute: micro-batch 1's first attention kernel comes after micro-batch 0's last
    // block's post-combine backward and before its experts' backward.
    let order = passes("compute");
    let at = |s: &str| order.iter().position(|x| x.starts_with(s)).unwrap_or_else(|| panic!("{s} not in {order:?}"));
    let last = LAYERS - 1;
    assert!(at(&format!("B0 layers.{last}.feed_forward.unpermute")) < at("F1 layers.0.attention"));
    assert!(at("F1 layers.0.attention") < at(&format!("B0 layers.{last}.feed_forward.experts")));
    assert!(at(&format!("B0 layers.{last}.feed_forward.experts")) < at("F1 layers.0.feed_forward.experts"));
    assert!(at("F1 layers.0.feed_forward.experts") < at(&format!("B0 layers.{last}.attention")));
}

/// The same tasks at the same costs, reordered: what changes is how much of the all-to-all
/// time the other pass's compute hides. Token all-to-alls here cross nodes (expert 16 over
/// two 8-GPU nodes); 8 micro-batches, of which the first forward and the last backward run
/// alone.
/// Activations stay about one micro-batch's: while the forward has saved layers 0..i the
/// backward still holds layers 0..3-i.
#[test]
fn the_all_to_alls_are_hidden_and_the_peak_stays() {
    let training = "activation_checkpointing = \"none\"\ngrad_accum = 8";
    let run = |mg: &str| stepsim::simulate(&scenario(16, "expert = 16", mg, training)).unwrap();
    let (off, on) = (run(""), run(ON));
    let durations = |s: &stepsim::Simulation| {
        let mut d: Vec<u64> = s.schedule().program.tasks.iter().map(|t| t.duration_ns).collect();
        d.sort_unstable();
        d
    };
    assert_eq!(durations(&off), durations(&on), "the same tasks at the same costs");
    let t = |s: &stepsim::Simulation| s.report.throughput.as_ref().unwrap().step_time_s;
    let exposed = |s: &stepsim::Simulation| s.report.steps.last().unwrap().exposed_comm_s;
    let peak = |s: &stepsim::Simulation| s.report.peak.as_ref().unwrap().allocated.bytes as f64;
    println!(
        "step {:.2} -> {:.2} ms, exposed communication {:.2} -> {:.2} ms, peak {:.3} -> {:.3} GB",
        t(&off) * 1e3,
        t(&on) * 1e3,
        exposed(&off) * 1e3,
        exposed(&on) * 1e3,
        peak(&off) / 1e9,
        peak(&on) / 1e9
    );
    assert!(t(&on) < 0.95 * t(&off));
    assert!(exposed(&on) < 0.7 * exposed(&off));
    assert!((peak(&on) / peak(&off) - 1.0).abs() < 0.05);
}

/// With a pipeline the interleaved schedule warms up one forward more (so each paired
/// forward and backward are independent), and the combined steps shorten the step.
#[test]
fn a_pipeline_warms_up_one_forward_more_and_runs_faster() {
    use stepsim::plan::PipelineSchedule;
    use stepsim::schedule::pipeline::{order, order_with};
    let plain = order(PipelineSchedule::Interleaved, 2, 0, 4, 2);
    let ep = order_with(PipelineSchedule::Interleaved, 2, 0, 4, 2, true);
    let warm = |o: &[(bool, u32, usize)]| o.iter().take_while(|x| x.0).count();
    // Warm-up 2 (p - k - 1) + (v - 1) p = 4 forwards, then the first steady-state one.
    assert_eq!((warm(&plain), warm(&ep)), (5, 6));
    assert_eq!(plain.len(), ep.len());
    let par = "expert = 8\npipeline = 2\nschedule = \"interleaved-1f1b\"\nvirtual_stages = 2";
    let run = |mg: &str| {
        stepsim::simulate(&scenario(16, par, mg, PLAIN)).unwrap().report.throughput.as_ref().unwrap().step_time_s
    };
    let (off, on) = (run(""), run(ON));
    println!("pipeline 2 x 2 chunks: {:.2} -> {:.2} ms", off * 1e3, on * 1e3);
    assert!(on < off);
}
