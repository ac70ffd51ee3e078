//! `stepsim explain`: an OOM in each phase is explained with that phase and its dominant
//! category; the counterfactual table's verdicts agree with simulating each change directly;
//! the CLI writes explain.png and carries the explanation in report.json.

use std::path::{Path, PathBuf};
use std::process::Command;

use stepsim::explain::{self, counterfactual};
use stepsim::scenario::Scenario;

fn shipped(name: &str) -> Scenario {
    Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name)).unwrap()
}

fn inline(toml: &str) -> Scenario {
    Scenario::from_toml(Path::new("<explain test>"), toml).unwrap_or_else(|e| panic!("{e}"))
}

fn shipped_text(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name)).unwrap()
}

/// The 100B FSDP scenario with full checkpointing on 24 GPUs: forward and backward fit, the
/// first optimizer.step() creates Adam's moments (8 B/param / 24 = 34 GB) and does not.
fn optimizer_oom() -> Scenario {
    let t = shipped_text("100b-32gpu-fsdp.toml")
        .replace("gpus = 32", "gpus = 24")
        .replace("activation_checkpointing = \"none\"", "activation_checkpointing = \"full\"");
    inline(&t)
}

/// A 1.3B GPT at micro-batch 48 x 2048 on one A100 80GB: activations overflow in forward.
fn forward_oom() -> Scenario {
    inline(
        "[model]\nfamily = \"gpt\"\nn_layers = 24\nhidden = 2048\nn_heads = 16\nvocab = 50257\nmax_seq_len = 2048\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 1\n[training]\nmicro_batch = 48\nseq_len = 2048\nprecision = \"bf16-mixed-adam\"\n",
    )
}

#[test]
fn each_phase_is_named_with_its_dominant_category() {
    let cases: Vec<(&str, Scenario, &str, &str)> = vec![
        ("load", shipped("100b-8gpu-ddp.toml"), "init", "parameters"),
        ("forward", forward_oom(), "forward", "activations"),
        ("backward", shipped("100b-32gpu-fsdp.toml"), "backward", "activations"),
        ("first optimizer step", optimizer_oom(), "optimizer", "optimizer_state"),
    ];
    for (what, s, phase, dominant) in cases {
        let sim = stepsim::simulate(&s).unwrap();
        let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
        assert_eq!(e.status, "oom", "{what}");
        assert_eq!(e.phase.name(), phase, "{what}");
        assert_eq!(e.live.first().map(|l| l.category), Some(dominant), "{what}: {:?}", e.live);
        let text = explain::render(&e, &s);
        assert!(text.contains(phase) && text.contains("GiB") && text.contains("Answer:"), "{what}");
        // Every live line says why it is there.
        assert!(e.live.iter().all(|l| !l.reason.is_empty()));
    }
}

#[test]
fn the_32_gpu_story_leaves_activations_out_of_the_naive_average() {
    let s = shipped("100b-32gpu-fsdp.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    assert!(e.naive_average.bytes < e.capacity.bytes, "the average fits");
    assert!(e.naive_leaves_out.iter().any(|x| x.contains("activations saved by 80 of 80 layers")));
    assert!(e.naive_leaves_out.iter().any(|x| x.contains("all-gathered") && x.contains("prefetched")));
    assert!(e.naive_note.contains("does not exist yet"), "{}", e.naive_note);
    // FULL_SHARD divides every part of the model state by the GPUs.
    assert!(e.naive_beyond.is_empty(), "{:?}", e.naive_beyond);
}

/// Three fixes of the 32-GPU story fit at one peak, 63.32 GB, because each moves the peak to
/// Adam's step; the table says so in its `peak in` column. A label wider than its column has a
/// line of its own, so every row's figures stay under their headers.
#[test]
fn the_table_says_where_each_peak_falls_and_keeps_its_columns() {
    use stepsim::schedule::Phase;
    let s = shipped("100b-32gpu-fsdp.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = |prefix: &str| e.counterfactuals.iter().find(|c| c.change.starts_with(prefix)).unwrap();
    let full = row("activation checkpointing: full");
    let per_op = row("activation checkpointing: selective-op");
    assert_eq!((full.peak_phase, per_op.peak_phase), (Some(Phase::Optimizer), Some(Phase::Optimizer)));
    assert_eq!(full.peak, per_op.peak);
    assert_eq!(row("GPUs 32 ->").peak_phase, Some(Phase::Backward));
    assert_eq!(row("shard more").peak_phase, None, "a change not tried has no peak");
    let text = explain::render(&e, &s);
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Single changes"))
        .skip(1)
        .take_while(|l| !l.starts_with("  (peak and time"))
        .collect();
    let header = table[0];
    let end_of = |l: &str, word: &str| l.find(word).map(|i| i + word.len());
    let peak_end = end_of(header, "peak ").unwrap() - 1;
    let phase_at = header.find("peak in").unwrap();
    let mut rows = 0;
    for l in &table[1..] {
        let Some(gib) = end_of(l, "GiB)") else { continue };
        rows += 1;
        assert_eq!(gib, peak_end, "a peak out of its column:\n{header}\n{l}");
        let at = l[phase_at..].split_whitespace().next().unwrap();
        assert!(["init", "forward", "backward", "optimizer"].contains(&at), "{l}");
    }
    assert_eq!(rows, e.counterfactuals.iter().filter(|c| c.peak.is_some()).count());
    let tp = table.iter().position(|l| l.trim_start().starts_with("tensor parallel 1 -> 2")).unwrap();
    assert!(!table[tp].contains("GB") && table[tp + 1].trim_start().starts_with("yes"), "{}", table[tp]);
}

/// Where the naive average breaks, it says which state the layout keeps whole: DDP keeps all
/// four parts on every GPU; ZeRO-1 with tensor parallelism divides the parameters and
/// gradients only by the tensor-parallel ranks, and shards the rest.
#[test]
fn state_the_layout_does_not_divide_is_named_against_its_naive_share() {
    let s = shipped("100b-8gpu-ddp.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    assert_eq!(e.naive_beyond.len(), 4, "{:?}", e.naive_beyond);
    for (line, part) in e.naive_beyond.iter().zip(["parameters", "gradients", "master weights", "optimizer state"]) {
        assert!(
            line.starts_with(part) && line.contains("8.0x") && line.contains("a whole copy on every GPU"),
            "{line}"
        );
    }
    // The OOM comes while the parameters load: what is live then is said beside the figure.
    assert!(e.naive_beyond[0].contains("of it live at this instant"), "{}", e.naive_beyond[0]);

    let s = inline(
        "[model]\nfamily = \"gpt\"\nn_layers = 8\nhidden = 2048\nn_heads = 16\nvocab = 50304\nmax_seq_len = 2048\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 16\n[parallel]\nframework = \"megatron\"\nsharding = \"zero1\"\ntensor = 2\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\nprecision = \"bf16-mixed-adam\"\n",
    );
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    assert_eq!(e.status, "fits");
    let parts: Vec<&str> = e.naive_beyond.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(parts, ["parameters", "gradients"], "{:?}", e.naive_beyond);
    for line in &e.naive_beyond {
        assert!(
            line.contains("divided only by the 2 model-parallel ranks") && line.contains("8 data-parallel replicas"),
            "{line}"
        );
    }
    let text = explain::render(&e, &s);
    assert!(
        text.contains("of model state is live here") && text.contains("does not divide all of it by the 16 GPUs"),
        "{text}"
    );
}

#[test]
fn counterfactual_verdicts_agree_with_direct_runs() {
    let s = shipped("100b-32gpu-fsdp.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    assert!(e.counterfactuals.iter().any(|c| c.fits == Some(true)), "some single change fits");
    // Tensor parallelism 2 halves every GPU's weights and activations and keeps the step
    // shortest of the changes that fit on these GPUs (its FSDP collectives run over 16 ranks).
    assert!(e.answer.contains("tensor parallel 1 -> 2"), "{}", e.answer);
    // GPT's linears carry biases (addmm, which torchtitan's per-op policy does not save), so
    // the per-op policy keeps little more than full checkpointing but does not rerun the
    // attention kernel: the same peak (set in the optimizer step), a faster step.
    let row = |name: &str| e.counterfactuals.iter().find(|c| c.change.starts_with(name)).unwrap();
    let (op, full) = (row("activation checkpointing: selective-op"), row("activation checkpointing: full"));
    assert_eq!((op.fits, full.fits), (Some(true), Some(true)));
    assert_eq!(op.peak.as_ref().map(|b| b.bytes), full.peak.as_ref().map(|b| b.bytes));
    assert!(op.step_time_s < full.step_time_s);
    let mut checked = 0;
    for which in 0..counterfactual::COUNTERFACTUAL_NAMES.len() {
        let Ok(variants) = counterfactual::variants(&s, which) else { continue };
        for (label, v) in variants {
            let Some(row) = e.counterfactuals.iter().find(|c| c.change == label) else { continue };
            let direct = stepsim::simulate(&v).unwrap();
            let fits = matches!(direct.report.verdict, stepsim::report::Verdict::Fits { .. });
            if row.fits.is_none() {
                // Reported as having no effect: it must still be out of memory.
                assert!(row.note.as_deref().is_some_and(|n| n.starts_with("no effect")) && !fits, "{label}");
            } else {
                assert_eq!(row.fits, Some(fits), "{label}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} rows checked");
}

#[test]
fn a_run_near_capacity_is_explained_and_one_far_from_it_is_not() {
    let s = shipped("gpt-1.3b-1gpu.toml");
    let sim = stepsim::simulate(&s).unwrap();
    assert_eq!(explain::explain(&s, &sim, 0.05).status, "fits");
    let e = explain::explain(&s, &sim, 0.9);
    assert_eq!(e.status, "near_capacity");
    assert!(!e.live.is_empty() && !e.counterfactuals.is_empty());
    // A job that fits is not searched for the fewest GPUs that fit: the first doubling is
    // shown as such, never as the original count "not fitting".
    // The plain doubling and, for this DDP job, the sharded one.
    let gpus: Vec<_> = e.counterfactuals.iter().filter(|c| c.change.starts_with("GPUs ")).collect();
    assert_eq!(gpus.len(), 2);
    for c in gpus {
        let note = c.note.as_deref().unwrap();
        assert!(note.contains("fits on its 1 GPU already") && !note.contains("do not"), "{note}");
    }
}

#[test]
fn cli_writes_explain_png_and_the_explanation_in_report_json() {
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = dir.path().join("out");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/100b-32gpu-fsdp.toml");
    let o = Command::new(env!("CARGO_BIN_EXE_stepsim"))
        .arg("explain")
        .arg(&scenario)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("OOM in step 1, backward") && text.contains("Single changes"), "{text}");
    let png = std::fs::read(out.join("explain.png")).unwrap();
    assert!(png.starts_with(&[0x89, b'P', b'N', b'G']));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(r.pointer("/explanation/phase").and_then(|v| v.as_str()), Some("backward"));
    assert!(r.pointer("/explanation/counterfactuals").and_then(|v| v.as_array()).is_some_and(|a| a.len() >= 8));
    // A bad margin is a flag error.
    let o = Command::new(env!("CARGO_BIN_EXE_stepsim"))
        .arg("explain")
        .arg(&scenario)
        .args(["--margin", "2"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--margin"));
}

#[test]
fn a_fragmentation_oom_says_so_and_recommends_expandable_segments() {
    let s = shipped("fragmentation-oom.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    assert_eq!(e.status, "oom");
    assert!(
        e.empty_cache.contains("fragmentation") && e.empty_cache.contains("expandable_segments"),
        "{}",
        e.empty_cache
    );
    assert!(e.live.iter().any(|l| l.category == "allocator"), "the reserved-but-unallocated bytes are a line");
    let row = e
        .counterfactuals
        .iter()
        .find(|c| c.change.contains("expandable_segments"))
        .expect("an expandable-segments row");
    assert_eq!(row.fits, Some(true), "{row:?}");
}

/// A pipeline-parallel run near capacity: GPipe keeps all 16 micro-batches' activations on
/// the last stage. Every counterfactual must stay a valid scenario (sharding stops at ZeRO-1
/// under pipelining; FULL_SHARD there used to panic in the scheduler), and the live
/// activations are described as the micro-batches in flight.
#[test]
fn explain_with_pipeline_parallelism_counts_micro_batches_in_flight() {
    let out = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gpt-13b-pp4-gpipe.toml");
    let o = Command::new(env!("CARGO_BIN_EXE_stepsim"))
        .arg("explain")
        .arg(&scenario)
        .args(["--margin", "0.2", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}\n{text}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("of 16 micro-batches in flight (2 x 2048 tokens each)"), "{text}");
    assert!(text.contains("-> ZeRO-1 (optimizer state sharded)"), "{text}");
    assert!(!text.contains("-> FULL_SHARD"), "{text}");
}

/// "More GPUs" stays a valid scenario: with `[jitter]`, which simulates every data-parallel
/// rank up to 1,024, only the multiples within that limit are offered (each, written as
/// TOML, is a valid scenario).
#[test]
fn more_gpus_under_jitter_stays_within_the_simulated_ranks() {
    let t = shipped_text("100b-32gpu-fsdp.toml").replace("gpus = 32", "gpus = 256")
        + "\n[jitter]\nseed = 7\ncompute_cv = 0.03\n";
    let s = inline(&t);
    let v = counterfactual::variants(&s, 4).unwrap();
    let gpus: Vec<u32> = v.iter().map(|(_, x)| x.cluster.gpus).collect();
    assert_eq!(gpus, vec![512, 1024]);
    for g in gpus {
        inline(&t.replace("gpus = 256", &format!("gpus = {g}")));
    }
    let at_limit = inline(&t.replace("gpus = 256", "gpus = 1024"));
    let e = counterfactual::variants(&at_limit, 4).unwrap_err();
    assert!(e.contains("1024"), "{e}");
    // Without jitter all six doublings are offered.
    assert_eq!(counterfactual::variants(&inline(&shipped_text("100b-32gpu-fsdp.toml")), 4).unwrap().len(), 6);
}

/// Issue 24's ranking: changes that keep the training problem are ranked first (halving the
/// sequence is set apart), a change with no effect says so, and "more GPUs" is the smallest
/// count that fits, found by bisection, not the next doubling.
#[test]
fn explain_ranks_problem_keeping_changes_and_bisects_the_gpu_count() {
    let s = shipped("100b-32gpu-fsdp.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let seq = e.counterfactuals.iter().find(|c| c.change.starts_with("sequence length")).unwrap();
    assert!(seq.changes_problem && seq.fits.is_some(), "{seq:?}");
    assert!(!e.answer.contains("sequence length"), "{}", e.answer);
    let sel = e.counterfactuals.iter().find(|c| c.change == "activation checkpointing: selective").unwrap();
    assert!(sel.fits.is_none() && sel.note.as_deref().unwrap().contains("no effect"), "{sel:?}");
    let more = e.counterfactuals.iter().find(|c| c.change.starts_with("GPUs ")).unwrap();
    assert_eq!(more.fits, Some(true));
    let n = more.gpus;
    assert!(n % 8 == 0 && n > 64 && !n.is_power_of_two(), "{n} GPUs: between the failing and the fitting doubling");
    let mut fewer = s.clone();
    fewer.cluster.gpus = (n - 8) as u32;
    let r = stepsim::simulate(&fewer).unwrap();
    assert!(matches!(r.report.verdict, stepsim::report::Verdict::Oom(_)), "{} GPUs fit too", n - 8);
}

/// When no single change fits, pairs with full checkpointing are tried and the answer says
/// what was tried rather than advising to "combine changes" untried. The 100B DDP job at
/// micro-batch 64: 80 checkpointed layer inputs of 64 x 2048 x 10240 in bf16 are 215 GB on
/// every GPU, which neither halving the micro-batch, tensor parallelism 2, an H200 nor more
/// GPUs (sharded or not) bring under 80 GB.
#[test]
fn explain_tries_pairs_when_no_single_change_fits() {
    let s = inline(&shipped_text("100b-8gpu-ddp.toml").replace("micro_batch = 1", "micro_batch = 64"));
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    assert!(e.counterfactuals.iter().any(|c| c.change.starts_with("full checkpointing + ")), "pairs tried");
    assert!(!e.answer.contains("combine changes"), "{}", e.answer);
    assert!(e.answer.contains("full checkpointing together with"), "{}", e.answer);
}

/// The single-change row "GPUs 8 -> N, sharding `change`" of an explanation.
fn grown_row<'a>(e: &'a explain::Explanation, change: &str) -> &'a counterfactual::Counterfactual {
    let sharding = format!(", sharding {change}");
    let row = e.counterfactuals.iter().find(|c| c.change.starts_with("GPUs 8 -> ") && c.change.ends_with(&sharding));
    row.unwrap_or_else(|| panic!("no row ending {sharding}: {:?}", e.counterfactuals))
}

/// More GPUs for a job that replicates its state: DDP's 1.6 TB of model state per GPU does
/// not shrink with the count ("GPUs 8 -> 512" stays out of memory), so the sharded variant
/// is tried beside it, bisected to the fewest GPUs that fit, and, since nothing fits on the
/// 8 GPUs, paired with full checkpointing. That pair at 32 GPUs is the shipped
/// `100b-32gpu-fsdp-ac` written by hand, and its row is that run's peak and step time.
#[test]
fn more_gpus_for_a_replicated_job_shards_the_state() {
    let s = shipped("100b-8gpu-ddp.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = |prefix: &str| {
        e.counterfactuals.iter().find(|c| c.change.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} row"))
    };
    let plain = row("GPUs 8 -> ");
    assert_eq!((plain.fits, plain.gpus), (Some(false), 512), "{plain:?}");
    let sharded = grown_row(&e, "NO_SHARD (DDP) -> FULL_SHARD / ZeRO-3");
    assert_eq!(sharded.fits, Some(true), "{sharded:?}");
    let n = sharded.gpus;
    assert!(n % 8 == 0 && n > 32 && n < 512, "{n}");
    let on = |gpus: u64| {
        let t = shipped_text("100b-8gpu-ddp.toml")
            .replace("gpus = 8\n", &format!("gpus = {gpus}\n"))
            .replace("sharding = \"none\"", "sharding = \"full_shard\"");
        matches!(stepsim::simulate(&inline(&t)).unwrap().report.verdict, stepsim::report::Verdict::Fits { .. })
    };
    assert!(on(n) && !on(n - 8), "{n} GPUs fit and {} do not", n - 8);
    assert!(sharded.note.as_deref().unwrap().contains(&format!("{} GPUs do not", n - 8)), "{sharded:?}");

    let pair = row("full checkpointing + GPUs 8 -> 32, sharding NO_SHARD (DDP) -> FULL_SHARD / ZeRO-3");
    assert_eq!(pair.fits, Some(true), "{pair:?}");
    let by_hand = stepsim::simulate(&shipped("100b-32gpu-fsdp-ac.toml")).unwrap().report;
    assert_eq!(pair.peak.map(|p| p.bytes), by_hand.peak.as_ref().map(|p| p.allocated.bytes));
    assert_eq!(pair.step_time_s, by_hand.throughput.as_ref().map(|t| t.step_time_s));
    assert!(
        e.answer.contains(&format!("\"GPUs 8 -> {n}, sharding")) && e.answer.contains("on the fewest GPUs (32)"),
        "{}",
        e.answer
    );
    let text = explain::render(&e, &s);
    assert!(text.contains("fits on the same GPUs; full checkpointing with each other change"), "{text}");

    // A fully sharded job has no such row: "more GPUs" shards it further already; nor a
    // Megatron job, whose distributed optimizer is as far as it shards.
    for name in ["100b-32gpu-fsdp.toml", "llama3-8b-128k-h100.toml"] {
        let s = shipped(name);
        let sim = stepsim::simulate(&s).unwrap();
        let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
        assert!(!e.counterfactuals.iter().any(|c| c.change.contains(", sharding ")), "{name}: {:?}", e.counterfactuals);
    }
    // DeepSpeed ZeRO-2 replicates the parameters: 202 GB of them on every GPU at any count,
    // until ZeRO-3 shards them too.
    let z2 = inline(
        &shipped_text("100b-8gpu-ddp.toml")
            .replace("sharding = \"none\"", "sharding = \"zero2\"\nframework = \"deepspeed\""),
    );
    let sim = stepsim::simulate(&z2).unwrap();
    let e = explain::explain(&z2, &sim, explain::DEFAULT_MARGIN);
    let plain = e.counterfactuals.iter().find(|c| c.change == "GPUs 8 -> 512").unwrap();
    assert_eq!(plain.fits, Some(false));
    let full = grown_row(&e, "SHARD_GRAD_OP / ZeRO-2 -> FULL_SHARD / ZeRO-3");
    assert_eq!(full.fits, Some(true), "{full:?}");
}

/// A job on one node it does not fill grows into whole nodes of its preset when explain adds
/// GPUs, as GPUs are added in practice (not one node per added GPU behind the network); a job
/// across nodes keeps its node size. Each variant, written as TOML, is a valid scenario.
#[test]
fn more_gpus_fill_the_node_before_adding_nodes() {
    let t = shipped_text("gpt-1.3b-1gpu.toml");
    let s = inline(&t);
    let v = counterfactual::variants(&s, 4).unwrap();
    let layout: Vec<(u32, u32)> = v.iter().map(|(_, x)| (x.cluster.gpus, x.cluster.gpus_per_node)).collect();
    assert_eq!(layout, [(2, 2), (4, 4), (8, 8), (16, 8), (32, 8), (64, 8)]);
    assert_eq!(v[0].0, "GPUs 1 -> 2 (one node)");
    assert_eq!(v[3].0, "GPUs 1 -> 16 (2 nodes of 8)");
    for (g, per) in layout {
        inline(&t.replace("gpus = 1\n", &format!("gpus = {g}\ngpus_per_node = {per}\n")));
    }
    // The sharded variant: the same layouts, FULL_SHARD.
    let sharded = counterfactual::variants(&s, 32).unwrap();
    assert_eq!(sharded.len(), 6);
    for (label, x) in &sharded {
        assert_eq!(x.parallel.sharding, stepsim::plan::Sharding::Zero3, "{label}");
        assert!(label.ends_with(", sharding NO_SHARD (DDP) -> FULL_SHARD / ZeRO-3"), "{label}");
    }
    // Across nodes the node size stays: 16 GPUs in 2 nodes of 8 become 2 x 16 in 4 of 8.
    let across = inline(&shipped_text("gpt-13b-pp4-1f1b.toml"));
    let v = counterfactual::variants(&across, 4).unwrap();
    assert!(v.iter().all(|(l, x)| x.cluster.gpus_per_node == 8 && !l.contains("node")), "{:?}", v[0].0);
}

/// Tensor parallelism is among the single changes: on the 32-GPU FSDP job, TP 2 with
/// sequence parallelism (the vocabulary padded as Megatron pads it) fits.
#[test]
fn explain_proposes_tensor_parallelism() {
    let s = shipped("100b-32gpu-fsdp.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let tp = e.counterfactuals.iter().find(|c| c.change.starts_with("tensor parallel 1 -> 2")).unwrap();
    assert_eq!(tp.fits, Some(true), "{tp:?}");
    assert!(tp.change.contains("vocabulary padded 50257 -> 50432"), "{}", tp.change);
}

/// Issue 21's long-context case: Llama 3.1 8B at 128K tokens on 8 H100 runs out of memory as
/// configured; explain's answer is context parallelism, the smallest ring that fits (8, with
/// grad_accum 8 to keep the batch), while more GPUs and tensor parallelism 2 do not fit.
#[test]
fn explain_answers_a_long_context_oom_with_context_parallelism() {
    let s = shipped("llama3-8b-128k-h100.toml");
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, stepsim::report::Verdict::Oom(_)));
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let cp = e.counterfactuals.iter().find(|c| c.change.starts_with("context parallel 1 -> ")).unwrap();
    assert_eq!(cp.fits, Some(true), "{cp:?}");
    assert!(cp.change.contains("context parallel 1 -> 8, grad_accum 1 -> 8"), "{}", cp.change);
    assert!(e.answer.contains("context parallel 1 -> 8"), "{}", e.answer);
    for other in ["GPUs ", "tensor parallel 1 -> 2"] {
        let c = e.counterfactuals.iter().find(|c| c.change.starts_with(other)).unwrap();
        assert_eq!(c.fits, Some(false), "{c:?}");
    }
    // Liger's fused loss is not offered under Megatron (which has its own cross-entropy);
    // under FSDP it is, and context parallelism is offered as torchtitan runs it (PyTorch's
    // context_parallel, keys and values all-gathered).
    assert!(!e.counterfactuals.iter().any(|c| c.change.contains("fused-linear")));
    let fsdp = shipped("100b-32gpu-fsdp.toml");
    let sim = stepsim::simulate(&fsdp).unwrap();
    let e = explain::explain(&fsdp, &sim, explain::DEFAULT_MARGIN);
    let cp = e.counterfactuals.iter().find(|c| c.change.starts_with("context parallel 1 -> ")).unwrap();
    assert_eq!(cp.fits, Some(true), "{cp:?}");
    let (_, v) = stepsim::explain::counterfactual::variants(&fsdp, 14).unwrap().swap_remove(0);
    assert_eq!(v.parallel.model_parallel.context_comm, stepsim::model::ContextComm::AllGather);
    assert_eq!(v.workload.split.context_comm, stepsim::model::ContextComm::AllGather);
    assert!(e.counterfactuals.iter().any(|c| c.change.contains("fused-linear")));
}

/// Issue 20: under Megatron a mixture of experts is offered Megatron's `--recompute-modules
/// moe_act` (the routed experts' activation discarded in forward and rerun in backward), which
/// lowers the peak of the shipped Mixtral job; a dense model gets no such row.
#[test]
fn a_megatron_mixture_of_experts_is_offered_recomputing_the_experts_activation() {
    use stepsim::plan::{Checkpointing, RecomputeModule};
    let which = counterfactual::COUNTERFACTUAL_NAMES.iter().position(|n| n.contains("moe_act")).unwrap();
    let s = shipped("mixtral-8x7b-h100-ep8.toml");
    let variants = counterfactual::variants(&s, which).unwrap();
    assert_eq!(variants.len(), 1);
    let (label, v) = &variants[0];
    assert!(label.contains("moe_act"), "{label}");
    assert_eq!(v.training.checkpointing, Checkpointing::Selective);
    assert!(v.training.recompute_modules.contains(&RecomputeModule::MoeAct));
    assert!(v.training.recompute_modules.contains(&RecomputeModule::CoreAttn), "Megatron's default kept");
    let peak = |s: &stepsim::scenario::Scenario| stepsim::simulate(s).unwrap().report.peak.unwrap().allocated.bytes;
    assert!(peak(v) < peak(&s), "the experts' activation no longer kept");
    // Already on: no row; a dense model: none either.
    assert!(counterfactual::variants(v, which).is_err());
    assert!(counterfactual::variants(&shipped("gpt-1.3b-1gpu.toml"), which).is_err());
}

/// An eager Llama job that runs out of memory is offered torch.compile, re-simulated: the
/// compiled kernels are faster (fewer passes over HBM) and keep less (no FP32 norm copies).
/// A compiled job, and a GPT-style model whose eager kernels are already single ones, are not.
#[test]
fn an_eager_llama_job_is_offered_torch_compile() {
    let toml = |kernels: &str, family: &str| {
        format!(
            "[model]\nfamily = \"{family}\"\nn_layers = 8\nhidden = 4096\nn_heads = 32\nvocab = 128256\nmax_seq_len = 8192\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 1\n\
             [training]\nmicro_batch = 4\nseq_len = 8192\nprecision = \"bf16-mixed-adam\"\nkernels = \"{kernels}\"\n"
        )
    };
    let label =
        |e: &explain::Explanation| e.counterfactuals.iter().find(|c| c.change.starts_with("torch.compile")).cloned();
    let s = inline(&toml("eager", "llama"));
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, stepsim::report::Verdict::Oom(_)), "the eager job should not fit");
    // The eager job's own peak with memory unbounded, as the table times its rows.
    let unbounded =
        inline(&toml("eager", "llama").replace("gpus = 1\n", "gpus = 1\nmemory_capacity = 10000000000000\n"));
    let base = stepsim::simulate(&unbounded).unwrap().report.peak.unwrap().allocated.bytes;
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = label(&e).expect("a torch.compile row");
    assert!(row.tokens_per_s_change.is_some_and(|c| c > 0.0), "{row:?}");
    assert!(row.peak.is_some_and(|p| p.bytes < base), "{row:?} vs {base}");
    for (kernels, family) in [("compiled", "llama"), ("eager", "gpt")] {
        let s = inline(&toml(kernels, family));
        let sim = stepsim::simulate(&s).unwrap();
        let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
        assert!(label(&e).is_none_or(|c| c.fits.is_none()), "{kernels} {family}: {:?}", label(&e));
    }
}

/// Mistral 7B fine-tuned with Hugging Face's eager attention (FSDP, 8 A100, 4k tokens, no
/// checkpointing): its FP32 softmax and 16-bit copy (6 bytes a score) run out of memory in the
/// forward where the fused chain's 2 bytes a score would fit, and the answer is flash
/// attention. A flash job is offered no such row.
#[test]
fn an_eager_attention_oom_is_answered_with_flash_attention() {
    let toml = |attention: &str| {
        format!(
            "[model]\nname = \"mistral-7b-v0.1\"\n[hardware]\ngpu = \"a100-80gb\"\ngpus = 8\n\
             [parallel]\nframework = \"fsdp1\"\nsharding = \"full_shard\"\n\
             [training]\nmicro_batch = 1\nseq_len = 4096\nsteps = 2\nprecision = \"fsdp-bf16-mixed\"\n\
             activation_checkpointing = \"none\"\nattention = \"{attention}\"\n"
        )
    };
    let verdict = |attention: &str| {
        let s = inline(&toml(attention));
        let sim = stepsim::simulate(&s).unwrap();
        (s, sim)
    };
    let (_, math) = verdict("math");
    assert!(matches!(math.report.verdict, stepsim::report::Verdict::Fits { .. }));
    let (s, sim) = verdict("eager");
    let stepsim::report::Verdict::Oom(oom) = &sim.report.verdict else { panic!("eager attention should not fit") };
    assert_eq!(oom.at.phase.name(), "forward");
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = e.counterfactuals.iter().find(|c| c.change.starts_with("flash attention")).expect("a flash row");
    assert_eq!(row.fits, Some(true), "{row:?}");
    assert!(row.tokens_per_s_change.is_some_and(|c| c > 0.0), "{row:?}");
    assert!(e.answer.contains("flash attention"), "{}", e.answer);
    let (s, sim) = verdict("flash");
    let e = explain::explain(&s, &sim, 0.5);
    assert!(e.counterfactuals.iter().all(|c| !c.change.starts_with("flash attention")));
}

/// LoRA fine-tuning is explained in LoRA's terms: the parameters as the frozen base held as
/// stored plus the trainable adapters, the gradients and Adam's moments of the adapters only.
/// A 16-bit 70B base does not load on one A100; QLoRA (the base in NF4 with double
/// quantization) is offered, fits on the same GPU, agrees with simulating that scenario
/// directly, and costs speed (the dequantization kernels).
#[test]
fn lora_jobs_are_explained_in_lora_terms_and_qlora_is_offered() {
    let s = shipped("llama2-70b-lora-1gpu.toml");
    explain::accepts(Path::new("lora.toml"), &s).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    assert_eq!((e.status, e.phase.name()), ("oom", "init"));
    let params = e.live.iter().find(|l| l.category == "parameters").unwrap();
    // 68,976,648,192 frozen parameters at 2 B: 137.95 GB; rank 16 on q_proj and v_proj:
    // 32.8M adapters in fp32.
    assert!(
        params.reason.contains("the frozen base, 69.0B params as stored in 137.95 GB")
            && params.reason.contains("2 B/param, 16-bit")
            && params.reason.contains("trainable LoRA adapters, fp32 4 B/param x 32.8M"),
        "{}",
        params.reason
    );
    let q = e.counterfactuals.iter().find(|c| c.change.starts_with("QLoRA")).expect("a QLoRA row");
    assert_eq!(q.fits, Some(true));
    assert!(q.tokens_per_s_change.is_some_and(|x| x < 0.0), "{q:?}");
    assert!(e.answer.contains("on the same GPUs is \"QLoRA"), "{}", e.answer);
    let (_, v) = (0..counterfactual::COUNTERFACTUAL_NAMES.len())
        .filter_map(|w| counterfactual::variants(&s, w).ok())
        .flatten()
        .find(|(l, _)| l.starts_with("QLoRA"))
        .unwrap();
    let direct = stepsim::simulate(&v).unwrap();
    assert_eq!(direct.report.peak.as_ref().map(|p| p.allocated.bytes), q.peak.map(|p| p.bytes));
    // Where no single change fits, QLoRA is tried beside full checkpointing too (Llama 3.1 8B
    // at 4 x 4096 on a 24 GB A10G: the FP32 logits alone are 8.4 GB), and the answer says so.
    let a10g = inline(
        "[model]\nname = \"llama-3.1-8b\"\n[hardware]\ngpu = \"a10g\"\ngpus = 1\n[job]\nkind = \"finetune-lora\"\n[lora]\nrank = 16\n\
         [training]\nmicro_batch = 4\nseq_len = 4096\ngrad_accum = 2\n",
    );
    let sim = stepsim::simulate(&a10g).unwrap();
    let e = explain::explain(&a10g, &sim, explain::DEFAULT_MARGIN);
    assert!(e.counterfactuals.iter().any(|c| c.change.starts_with("full checkpointing + QLoRA")));
    assert!(e.answer.contains("offload, QLoRA or tensor parallelism"), "{}", e.answer);
    // Already 4-bit: no QLoRA row; the adapters' gradients and moments at their own count.
    let s = shipped("llama2-70b-qlora-1gpu.toml");
    let sim = stepsim::simulate(&s).unwrap();
    let e = explain::explain(&s, &sim, 0.6);
    assert!(!e.counterfactuals.iter().any(|c| c.change.starts_with("QLoRA")));
    let reason = |cat: &str| e.live.iter().find(|l| l.category == cat).map(|l| l.reason.clone()).unwrap();
    assert!(reason("optimizer_state").contains("of the trainable LoRA adapters: 8 B/param x 207.1M"));
    assert!(reason("gradients").contains("the trainable LoRA adapters' only"));
    assert!(reason("parameters").contains("block linears in NF4 with double quantization at 0.516 B/param"));
    // The parameters line's bytes are the parts it names: the base as stored and the adapters
    // at 4 B (each of the 81 units' buffers rounded up to 512 B).
    let stored = sim.dag.stored_frozen().1;
    let live = e.live.iter().find(|l| l.category == "parameters").unwrap().size.bytes;
    let parts = stored + 4 * sim.dag.trainable_params();
    assert!(live >= parts && live - parts < 1 << 20, "{live} vs {parts}");
}

/// A QLoRA job whose FP32 hidden states (prepare_model_for_kbit_training) overflow a 48 GB
/// L40S: explain offers the job without the upcast (what Unsloth, or TRL with `dtype: bfloat16`, runs),
/// which fits on the same GPU and is the answer; its row equals the job simulated with
/// `lora.prepare_kbit_training = false`. Growing it into FSDP drops the call, as TRL does for
/// sharded QLoRA (and scenario validation refuses it under FSDP1's flat units); a job without
/// the upcast gets no such row.
#[test]
fn qlora_without_the_fp32_upcast_is_offered_where_the_stream_is_fp32() {
    let text = shipped_text("llama2-70b-qlora-1gpu.toml").replace("gpu = \"a100-80gb\"", "gpu = \"l40s\"");
    let s = inline(&text);
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, stepsim::report::Verdict::Oom(_)));
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = e.counterfactuals.iter().find(|c| c.change.starts_with("lora.prepare_kbit_training = false")).unwrap();
    assert_eq!(row.fits, Some(true), "{row:?}");
    assert!(e.answer.contains("lora.prepare_kbit_training = false"), "{}", e.answer);
    let off = inline(&text.replace("double_quant = true\n", "double_quant = true\nprepare_kbit_training = false\n"));
    let direct = stepsim::simulate(&off).unwrap();
    assert_eq!(row.peak.as_ref().unwrap().bytes, direct.report.peak.as_ref().unwrap().allocated.bytes);
    let grown = e.counterfactuals.iter().find(|c| c.change.contains("FULL_SHARD")).unwrap();
    assert!(grown.change.contains("without prepare_model_for_kbit_training"), "{}", grown.change);
    let (_, v) = counterfactual::variants(&s, 33).unwrap().remove(0);
    assert!(!v.workload.lora.unwrap().prepare_kbit);
    assert!(counterfactual::variants(&shipped("llama2-70b-qlora-8gpu.toml"), 33).is_err());
}
