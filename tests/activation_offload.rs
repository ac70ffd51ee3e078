//! Activation offload against figures derived by hand: Transformer Engine's window map,
//! the bytes that go to the host, the copy time a synchronous offload adds, and what the
//! overlapped one saves. A small llama (hidden 1024, 2 KV heads, SwiGLU 3584, 8 blocks) at
//! 4,096 tokens on one H100, BF16: each block keeps x, the norms' outputs and statistics,
//! q, k, v, o, the log-sum-exp, the residual, and the MLP's four ffn-wide tensors.

use std::path::Path;

use stepsim::scenario::Scenario;
use stepsim::schedule::activation_offload::offload_window;

const T: u64 = 4096;
const X: u64 = T * 1024 * 2;
const KV: u64 = T * 256 * 2;
const F: u64 = T * 3584 * 2;
const BLOCK: u64 = 6 * X + 2 * KV + 2 * T * 4 + T * 8 * 4 + 4 * F;
/// Megatron's fused SwiGLU keeps the gate and up outputs and w2's input: one ffn-wide tensor
/// fewer.
const MEGATRON_BLOCK: u64 = BLOCK - F;

fn scenario(framework: &str, offload: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 8\nhidden = 1024\nn_heads = 8\nn_kv_heads = 2\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = {T}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 1\n\
         [parallel]\nframework = \"{framework}\"\n\
         [training]\nmicro_batch = 1\nseq_len = {T}\ngrad_accum = 1\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nkernels = \"fused\"\nloss = \"eager\"\nactivation_checkpointing = \"none\"\n{offload}"
    );
    Scenario::from_toml(Path::new("<activation offload>"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// (peak allocated bytes, step seconds, host bytes per GPU) of step 2.
fn run(s: &Scenario) -> (u64, f64, Option<u64>) {
    let r = stepsim::simulate(s).unwrap().report;
    (
        r.peak.as_ref().unwrap().allocated.bytes,
        r.throughput.as_ref().unwrap().step_time_s,
        r.activation_offload.as_ref().map(|a| a.host_bytes_per_gpu.bytes),
    )
}

/// cpu_offload_v1.py's window map: n groups over L layers, `(L / n)(i + 1) - 1` plus the
/// remainder's share. 31 of 32: every group waited for one layer later; 4 of 32: every 8th
/// layer; 3 of 8: L / n = 2, L % n = 2, so 1 + 1, 3 + 2, 5 + 2.
#[test]
fn transformer_engine_window_map() {
    assert_eq!(offload_window(31, 32), (1..=31).collect::<Vec<u64>>());
    assert_eq!(offload_window(4, 32), vec![7, 15, 23, 31]);
    assert_eq!(offload_window(3, 8), vec![2, 5, 7]);
}

/// PyTorch's offload_wrapper on every block: the host holds 8 blocks' saved tensors, and
/// the step grows by exactly their copies, out at 53 GB/s and back at 55.4 GB/s on the
/// compute stream (one GPU: nothing else to overlap or wait for).
#[test]
fn synchronous_offload_adds_its_copies_to_the_step() {
    let (p0, t0, h0) = run(&scenario("fsdp", ""));
    assert_eq!(h0, None);
    let (p1, t1, h1) = run(&scenario("fsdp", "activation_offload = \"synchronous\""));
    assert_eq!(h1, Some(8 * BLOCK));
    let copies = 8.0 * BLOCK as f64 * (1.0 / 53e9 + 1.0 / 55.4e9);
    assert!((t1 - t0 - copies).abs() < 1e-6 * t0, "step {t1} vs {t0} + copies {copies}");
    // Without offload all eight blocks are resident when backward starts; with it only the
    // last block's reload and what backward itself makes.
    assert!(p1 + 6 * BLOCK < p0, "peak {p1} vs {p0}");
    // Only the first two blocks: a quarter of the copies.
    let (_, t2, h2) = run(&scenario("fsdp", "activation_offload = \"synchronous\"\nactivation_offload_layers = 2"));
    assert_eq!(h2, Some(2 * BLOCK));
    assert!((t2 - t0 - copies / 4.0).abs() < 1e-6 * t0);
}

/// Megatron's --cpu-offloading of 7 of 8 layers: copies on their own streams, at most two
/// groups on the GPU in forward, so the peak drops by about five blocks; the step is no
/// faster than without offload and no slower than the same copies on the compute stream.
#[test]
fn overlapped_offload_keeps_two_groups_and_hides_what_compute_covers() {
    let (p0, t0, _) = run(&scenario("megatron", ""));
    let (p1, t1, h1) = run(&scenario("megatron", "activation_offload = \"overlapped\""));
    assert_eq!(h1, Some(7 * MEGATRON_BLOCK));
    assert!(p1 + 5 * MEGATRON_BLOCK < p0, "peak {p1} vs {p0}");
    let copies = 7.0 * MEGATRON_BLOCK as f64 * (1.0 / 53e9 + 1.0 / 55.4e9);
    assert!(t1 >= t0 && t1 < t0 + copies, "step {t1} vs {t0} (+ {copies} if nothing overlapped)");
}

/// `stepsim check` names the savers a scenario sets, in the scenario's own words.
#[test]
fn check_names_the_offload() {
    let s = scenario("megatron", "activation_offload = \"overlapped\"\nactivation_offload_layers = 3");
    let text = stepsim::report::check::summary(&s);
    assert!(text.contains("activation_offload = \"overlapped\" (first 3 blocks)"), "{text}");
    let plain = stepsim::report::check::summary(&scenario("fsdp", ""));
    assert!(!plain.contains("activation_offload"), "{plain}");
    let fine = scenario(
        "megatron",
        "[megatron]\noffload_modules = [\"attn_proj\", \"core_attn\"]\nactivation_offload_fraction = 0.5\n",
    );
    let text = stepsim::report::check::summary(&fine);
    assert!(
        text.contains("fine-grained activation offloading of core_attn, attn_proj in every layer (tensors of 1048576+ elements, the first 50% of each chunk's groups)"),
        "{text}"
    );
}

/// Megatron-Core's fine-grained offloading of `core_attn` and `attn_proj` (each layer's two
/// groups): flash attention saves q (x-sized), k and v (kv-sized), its output and the
/// log-sum-exp; the output is also `linear_proj`'s saved input, so it goes with the later
/// group, attn_proj; the log-sum-exp (8 heads x 4,096 FP32 = 32,768 elements) is under
/// --min-offloaded-tensor-size (1,048,576 elements) and stays. k and v are exactly 1,048,576
/// elements and go. Per layer 2 x + 2 kv; the last layer keeps both groups (its backward
/// comes first, right after the forward: `should_bulk_offload`), so 7 layers' worth go to
/// the host. The peak (the loss, before any reload) is lower by exactly that, and the step
/// is as long: the copies run on their own streams while compute covers them. With
/// `core_attn` alone the output stays (linear_proj still holds it).
#[test]
fn fine_grained_offload_takes_each_modules_saved_tensors_by_hand() {
    let fine = |modules: &str| scenario("megatron", &format!("[megatron]\noffload_modules = [{modules}]\n"));
    let (p0, t0, _) = run(&scenario("megatron", ""));
    let (p1, t1, h1) = run(&fine("\"core_attn\", \"attn_proj\""));
    let host = 7 * (2 * X + 2 * KV);
    assert_eq!(h1, Some(host));
    assert_eq!(p0 - p1, host);
    assert!((t1 / t0 - 1.0).abs() < 0.01, "{t0} -> {t1}");
    let (_, _, h2) = run(&fine("\"core_attn\""));
    assert_eq!(h2, Some(7 * (X + 2 * KV)));
    // A smaller threshold takes the log-sum-exp too.
    let s = scenario(
        "megatron",
        "[megatron]\noffload_modules = [\"core_attn\", \"attn_proj\"]\nmin_offloaded_tensor_size = 1024\n",
    );
    assert_eq!(run(&s).2, Some(host + 7 * T * 8 * 4));
    // --activation-offload-fraction 0.5: of the 14 eligible groups (layers 0-6, core_attn
    // then attn_proj), the last int(14 x 0.5) = 7 stay: layers 0-2 whole and layer 3's
    // core_attn (q, k, v) go.
    let s = scenario(
        "megatron",
        "[megatron]\noffload_modules = [\"core_attn\", \"attn_proj\"]\nactivation_offload_fraction = 0.5\n",
    );
    assert_eq!(run(&s).2, Some(3 * (2 * X + 2 * KV) + X + 2 * KV));
}

/// What Megatron's TransformerConfig refuses, and what stepsim does not simulate, each
/// naming the field.
#[test]
fn fine_grained_offload_refusals_name_the_field() {
    let bad = |extra: &str, field: &str, words: &str| {
        let toml = format!(
            "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nvocab = 1000\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 1\n[parallel]\nframework = \"megatron\"\n\
             [training]\nmicro_batch = 1\nseq_len = 256\n{extra}"
        );
        let e = Scenario::from_toml(Path::new("bad.toml"), &toml)
            .err()
            .unwrap_or_else(|| panic!("accepted: {extra}"))
            .to_string();
        assert!(e.contains(&format!("`{field}`")) && e.contains(words), "{field}: {e}");
    };
    let oc = "[megatron]\noffload_modules = [\"core_attn\"]\n";
    let cases = [
        ("[megatron]\noffload_modules = [\"attn_proj\"]\n".to_string(), "megatron.offload_modules", "core_attn"),
        ("[megatron]\noffload_modules = [\"mlp\"]\n".into(), "megatron.offload_modules", "attn_norm"),
        ("[megatron]\noffload_modules = []\n".into(), "megatron.offload_modules", "at least one"),
        ("[megatron]\noffload_modules = [\"fused_group_mlp\"]\n".into(), "megatron.offload_modules", "not simulated"),
        (format!("activation_offload = \"overlapped\"\n{oc}"), "megatron.offload_modules", "cpu-offloading"),
        (format!("activation_checkpointing = \"full\"\n{oc}"), "megatron.offload_modules", "full recomputation"),
        (
            "[megatron]\nmin_offloaded_tensor_size = 1024\n".into(),
            "megatron.min_offloaded_tensor_size",
            "offload_modules",
        ),
        (
            "[megatron]\nactivation_offload_fraction = 0.5\n".into(),
            "megatron.activation_offload_fraction",
            "offload_modules",
        ),
        (format!("{oc}activation_offload_fraction = 1.5\n"), "megatron.activation_offload_fraction", "from 0 to 1"),
        (format!("{oc}min_offloaded_tensor_size = 0\n"), "megatron.min_offloaded_tensor_size", ""),
    ];
    for (extra, field, words) in cases {
        bad(&extra, field, words);
    }
}

/// Under an interleaved pipeline a chunk's backward comes long after its forward: its first
/// layer is reloaded when the backward is reached (Megatron's `pre_reload_last_layer`), not
/// when the forward ends, and each later layer one layer ahead. So at no instant do more
/// than three layers' reloaded groups wait on the GPU (the layer in backward, the one
/// prefetched, and the next chunk's first), whatever the micro-batches in flight.
#[test]
fn fine_grained_reloads_wait_for_the_backward_under_a_pipeline() {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 8\nhidden = 1024\nn_heads = 8\nn_kv_heads = 2\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = {T}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 2\n\
         [parallel]\nframework = \"megatron\"\npipeline = 2\nschedule = \"interleaved-1f1b\"\nvirtual_stages = 2\n\
         [training]\nmicro_batch = 1\nseq_len = {T}\ngrad_accum = 8\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n\
         [megatron]\noffload_modules = [\"core_attn\", \"attn_proj\"]\n"
    );
    let s = Scenario::from_toml(Path::new("<pipelined offload>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    let sim = stepsim::simulate_with(&s, stepsim::SimOptions { history: true, ..Default::default() }).unwrap();
    for (c, class) in sim.job.classes.iter().enumerate() {
        let prog = &class.schedule.program;
        let h = sim.run.traces[c].history.as_ref().unwrap();
        let mut live = std::collections::HashSet::new();
        let mut most = 0;
        let mut reloads = 0;
        for e in &h.events {
            let name = || &prog.names[prog.buffers[e.tensor as usize].name as usize];
            match e.action {
                stepsim::memory::history::Action::Alloc if name().contains("reloaded from host") => {
                    reloads += 1;
                    // "layers.L.<tensor> (micro-batch m, ...)": one entry per (layer, micro-batch).
                    let n = name();
                    let layer = n.split('.').nth(1).unwrap_or("").to_string();
                    let mb = n.split("micro-batch ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("").to_string();
                    live.insert((e.tensor, layer, mb));
                }
                stepsim::memory::history::Action::FreeRequested => {
                    live.retain(|x| x.0 != e.tensor);
                }
                _ => {}
            }
            let pairs: std::collections::HashSet<_> = live.iter().map(|x| (&x.1, &x.2)).collect();
            most = most.max(pairs.len());
        }
        assert!(reloads > 0, "class {c} reloads nothing");
        assert!(most <= 3, "class {c}: {most} layers' reloads wait at once");
    }
}
