//! Tensor, sequence and pipeline parallelism:
//! - activation bytes per layer of one tensor-parallel rank against Korthikanti et al. 2022
//!   Table 2, exactly: TP s b h (10 + 24/t + 5 a s / (h t)), TP + SP s b h (34/t + 5 a s /
//!   (h t)), and selective recompute dropping the 5 a s / (h t) term;
//! - pipeline schedules: 1F1B holds p - k in-flight micro-batches on stage k (the first stage
//!   peaks highest), GPipe holds all of them;
//! - fidelity: Korthikanti et al. 2022 Table 4 single-layer times of the 22B model and Table 5
//!   iteration times (tests/fixtures/korthikanti_table5.json), predicted vs published printed
//!   for every row.

use std::path::Path;

use serde_json::Value;
use stepsim::model::{self, Attention, Family, ModelConfig, Region, TensorKind, TensorSplit, Workload};
use stepsim::scenario::Scenario;

fn gpt(h: u64, a: u64) -> ModelConfig {
    ModelConfig {
        family: Family::Gpt,
        n_layers: 2,
        hidden: h,
        n_heads: a,
        n_kv_heads: a,
        ffn_hidden: 4 * h,
        vocab: 51200,
        max_seq_len: 2048,
        tie_embeddings: true,
        dropout: 0.1,
        embedding_norm: false,
        head_dim_override: None,
        qkv_bias: false,
        qk_norm: false,
        moe: None,
        mla: None,
        style: Default::default(),
        sliding_window: None,
        mtp: None,
    }
}

/// Saved bytes of block 0 without per-row statistics, and without the s x s scores too.
fn saved(cfg: &ModelConfig, s: u64, b: u64, t: u64, sp: bool) -> (u64, u64) {
    let w = Workload {
        split: TensorSplit { tensor: t, sequence_parallel: sp, ..Default::default() },
        ..Workload::plain(b, s, Attention::Math)
    };
    let dag = model::build(cfg, &w);
    let all = dag.saved_bytes(Region::Block(0), false);
    let mut seen = vec![false; dag.tensors.len()];
    let mut scores = 0;
    for (_, op) in dag.ops_of(Region::Block(0)) {
        for &x in &op.saves {
            if !seen[x] && dag.tensors[x].kind == TensorKind::AttentionScores {
                seen[x] = true;
                scores += dag.tensors[x].bytes;
            }
        }
    }
    (all, all - scores)
}

#[test]
fn tensor_parallel_activations_follow_korthikanti_table2_exactly() {
    for (s, b, h, a, t) in [(2048u64, 1u64, 6144u64, 64u64, 8u64), (2048, 4, 12288, 96, 8), (1024, 2, 4096, 32, 2)] {
        let cfg = gpt(h, a);
        let sbh = s * b * h;
        let scores = 5 * a * s * s * b / t;
        let (all, sel) = saved(&cfg, s, b, t, false);
        assert_eq!(all, 10 * sbh + 24 * sbh / t + scores, "TP, s={s} b={b} h={h} a={a} t={t}");
        assert_eq!(sel, 10 * sbh + 24 * sbh / t, "TP + selective");
        let (all, sel) = saved(&cfg, s, b, t, true);
        assert_eq!(all, 34 * sbh / t + scores, "TP + SP");
        assert_eq!(sel, 34 * sbh / t, "TP + SP + selective");
    }
}

#[test]
fn tensor_parallel_ranks_hold_a_tth_of_the_split_weights() {
    let cfg = gpt(4096, 32);
    let w = |t| Workload {
        split: TensorSplit { tensor: t, sequence_parallel: false, ..Default::default() },
        ..Workload::plain(1, 2048, Attention::Flash)
    };
    let one = model::build(&cfg, &w(1));
    let eight = model::build(&cfg, &w(8));
    // Per block: 12 h^2 + 7h split (qkv weights and biases, proj and fc weights, fc bias),
    // 6h replicated (two LayerNorms, the two row-parallel biases).
    let h = 4096u64;
    assert_eq!(eight.region_params(Region::Block(0)), (12 * h * h + 7 * h) / 8 + 6 * h);
    assert_eq!(one.region_params(Region::Block(0)), 12 * h * h + 13 * h);
    // Model FLOPs are the whole model's whatever the split.
    assert!((eight.model_forward_flops() / one.model_forward_flops() - 1.0).abs() < 1e-9);
}

fn pipeline_scenario(schedule: &str, extra: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 16\nhidden = 1024\nn_heads = 16\nvocab = 1024\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 4\ngpus_per_node = 4\n\
         [parallel]\npipeline = 4\nschedule = \"{schedule}\"\n{extra}\n\
         [training]\nmicro_batch = 2\nseq_len = 1024\ngrad_accum = 8\nsteps = 1\nattention = \"flash\"\n"
    );
    Scenario::from_toml(Path::new("<pipeline>"), &toml).unwrap()
}

fn stage_activation_peaks(s: &Scenario) -> Vec<u64> {
    let sim = stepsim::simulate(s).unwrap();
    assert_eq!(sim.job.classes.len(), 4);
    let act = stepsim::memory::Category::Activations.index();
    sim.classes().map(|st| st.trace.timeline.samples().map(|x| x.by_category[act]).max().unwrap_or(0)).collect()
}

#[test]
fn one_f_one_b_first_stage_holds_the_most_in_flight_activations() {
    let ofob = stage_activation_peaks(&pipeline_scenario("1f1b", ""));
    let gpipe = stage_activation_peaks(&pipeline_scenario("gpipe", ""));
    println!("saved activations per stage, 1F1B: {ofob:?}\nGPipe: {gpipe:?}");
    // Stage k holds p - k micro-batches in flight: 4, 3, 2, 1 (the last stage's one includes
    // the head's saved tensors).
    for k in 0..3 {
        let r = ofob[k] as f64 / ofob[k + 1] as f64;
        let want = (4 - k) as f64 / (3 - k) as f64;
        assert!((r / want - 1.0).abs() < 0.15 || k == 2, "stage {k}/{}: {r} vs {want} ({ofob:?})", k + 1);
    }
    assert!(ofob[0] > ofob[1] && ofob[1] > ofob[2], "{ofob:?}");
    // GPipe keeps all 8 micro-batches of the first stage: about twice 1F1B's 4.
    let r = gpipe[0] as f64 / ofob[0] as f64;
    assert!(r > 1.6 && r < 2.2, "GPipe / 1F1B first-stage activations {r}");
}

/// Tied word embeddings under pipelining: the first stage's embedding and the last stage's
/// copy for the LM head are all-reduced between the two stages after both finish their
/// backwards (Megatron-LM's `_allreduce_embedding_grads`), on those two stages only;
/// untied embeddings have no such collective.
#[test]
fn tied_embedding_gradients_are_all_reduced_between_first_and_last_stage() {
    let what = "all-reduce tied embedding gradients (first and last stage)";
    for tied in [true, false] {
        let mut s = pipeline_scenario("1f1b", "");
        s.model.tie_embeddings = tied;
        let sim = stepsim::simulate(&s).unwrap();
        let mut starts = Vec::new();
        for (k, st) in sim.classes().enumerate() {
            let sch = st.schedule;
            let mut last_bwd = 0;
            let mut found = Vec::new();
            for (i, t) in sch.program.tasks.iter().enumerate() {
                let l = &sch.labels[t.label as usize];
                if l.kind == stepsim::schedule::TaskKind::Backward {
                    last_bwd = last_bwd.max(st.trace.end_ns[i]);
                }
                if l.what == what {
                    found.push((st.trace.start_ns[i], t.duration_ns));
                }
            }
            let ends = tied && (k == 0 || k == 3);
            assert_eq!(found.len(), usize::from(ends), "stage {k}, tied {tied}: {found:?}");
            if let Some(&(start, dur)) = found.first() {
                assert!(start >= last_bwd && dur > 0, "stage {k}: starts {start} before its last backward {last_bwd}");
                starts.push((start, last_bwd));
            }
        }
        if tied {
            // One collective: both sides start together, after both stages' backwards.
            assert_eq!(starts[0].0, starts[1].0, "{starts:?}");
            assert!(starts[0].0 >= starts[0].1.max(starts[1].1), "{starts:?}");
        }
    }
}

/// Pipeline transfers block compute as Megatron-LM's `_communicate` does (`batch_isend_irecv`,
/// wait, synchronize): no stage computes while one of its sends is in flight, and a receive
/// posted with a send overlaps it (opposite link directions) instead of following it.
#[test]
fn pipeline_sends_block_compute_and_overlap_their_receives() {
    use stepsim::schedule::TaskKind;
    for schedule in ["1f1b", "interleaved-1f1b", "gpipe"] {
        let extra = if schedule == "interleaved-1f1b" { "virtual_stages = 2" } else { "" };
        let sim = stepsim::simulate(&pipeline_scenario(schedule, extra)).unwrap();
        let mut overlapped = 0;
        for (k, st) in sim.classes().enumerate() {
            let sch = st.schedule;
            let span = |i: usize| (st.trace.start_ns[i], st.trace.end_ns[i]);
            let kind = |i: usize| sch.labels[sch.program.tasks[i].label as usize].kind;
            let n = sch.program.tasks.len();
            let compute: Vec<(u64, u64)> = (0..n)
                .filter(|&i| matches!(kind(i), TaskKind::Forward | TaskKind::Backward | TaskKind::Recompute))
                .map(span)
                .collect();
            let sends: Vec<(u64, u64)> = (0..n).filter(|&i| kind(i) == TaskKind::Send).map(span).collect();
            let recvs: Vec<(u64, u64)> = (0..n).filter(|&i| kind(i) == TaskKind::Recv).map(span).collect();
            for &(s0, s1) in &sends {
                for &(c0, c1) in &compute {
                    assert!(
                        c1 <= s0 || c0 >= s1,
                        "{schedule} stage {k}: compute [{c0}, {c1}) during send [{s0}, {s1})"
                    );
                }
                overlapped += recvs.iter().filter(|&&(r0, r1)| r0 < s1 && r1 > s0).count();
            }
        }
        assert!(overlapped > 0, "{schedule}: no receive overlaps a send");
        // Megatron-Core's --overlap-p2p-communication: sends run beside compute, and the step
        // is no slower.
        let extra = format!("{extra}\noverlap_p2p_communication = true");
        let free = stepsim::simulate(&pipeline_scenario(schedule, &extra)).unwrap();
        let beside = free.classes().any(|st| {
            let sch = st.schedule;
            let kind = |i: usize| sch.labels[sch.program.tasks[i].label as usize].kind;
            let n = sch.program.tasks.len();
            (0..n).filter(|&i| kind(i) == TaskKind::Send).any(|s| {
                (0..n)
                    .filter(|&c| kind(c) == TaskKind::Forward || kind(c) == TaskKind::Backward)
                    .any(|c| st.trace.start_ns[c] < st.trace.end_ns[s] && st.trace.end_ns[c] > st.trace.start_ns[s])
            })
        });
        assert!(beside, "{schedule}: with overlap, no send runs beside compute");
        let (t_block, t_free) = (sim.report.steps[0].time_s, free.report.steps[0].time_s);
        assert!(t_free <= t_block, "{schedule}: overlapped {t_free} s vs blocking {t_block} s");
    }
}

/// Korthikanti et al. 2022 Appendix B / Figure 9 (tests/fixtures/korthikanti_fig9.json):
/// activation memory per pipeline rank of the 530B model (TP 8 x PP 35, 3 layers per stage,
/// micro-batch 1) with output-tensor deallocation: rank 0 ~10.5 GB, rank 34 ~1.5 GB. The
/// copy reads the values off a figure ("~"), so the tolerance is wide: rank 0 within 20%,
/// rank 34 within 30%, and rank 0 holding at least 5x rank 34 (its 35 micro-batches in
/// flight against 1). Stated reading (fixture): full recomputation without sequence
/// parallelism, plain 1F1B; 35 micro-batches, the fewest that fill rank 0. "Activation
/// memory" here is the peak of everything that is not model state: saved and recomputed
/// activations, forward transients, activation gradients and the token ids.
#[test]
fn per_stage_activation_memory_against_korthikanti_figure9() {
    use stepsim::memory::Category;
    let f: Value = serde_json::from_str(include_str!("fixtures/korthikanti_fig9.json")).unwrap();
    let (first_pub, last_pub) =
        (f["figures_gb"]["rank0_with_deallocation"].as_f64().unwrap(), f["figures_gb"]["rank34"].as_f64().unwrap());
    let toml = "[model]\nfamily = \"gpt\"\nn_layers = 105\nhidden = 20480\nn_heads = 128\nvocab = 51200\nmax_seq_len = 2048\ndropout = 0.1\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = 280\ngpus_per_node = 8\n\
         [parallel]\ntensor = 8\npipeline = 35\nschedule = \"1f1b\"\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 35\nsteps = 1\nprecision = \"bf16-mixed-adam\"\n\
         activation_checkpointing = \"full\"\nattention = \"math\"\noptimizer_impl = \"fused\"\n";
    let s = Scenario::from_toml(Path::new("<figure9>"), toml).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let cats = [
        Category::Activations,
        Category::Recomputed,
        Category::Transient,
        Category::ActivationGradients,
        Category::Inputs,
    ];
    let peak = |k: usize| {
        let samples: Vec<_> = sim.run.traces[k].timeline.samples().collect();
        samples.iter().map(|x| cats.iter().map(|c| x.by_category[c.index()]).sum::<u64>()).max().unwrap() as f64 / 1e9
    };
    let (first, last) = (peak(0), peak(34));
    println!(
        "activation memory: rank 0 {first:.2} GB (published ~{first_pub}), rank 34 {last:.2} GB (published ~{last_pub})"
    );
    assert!((first / first_pub - 1.0).abs() <= 0.20, "rank 0: {first:.2} GB");
    assert!((last / last_pub - 1.0).abs() <= 0.30, "rank 34: {last:.2} GB");
    assert!(first > 5.0 * last, "{first} vs {last}");
}

#[test]
fn the_pipeline_bubble_comes_out_of_the_simulation() {
    // 1F1B's bubble is (p - 1) / m of the ideal time: with 8 micro-batches and 4 stages the
    // step takes ~(8 + 3) / 8 of the work of one stage; interleaving 2 chunks shrinks it.
    let sim = stepsim::simulate(&pipeline_scenario("1f1b", "")).unwrap();
    let st = &sim.report.steps[0];
    let ideal = st.compute_busy_s;
    let ratio = st.time_s / ideal;
    println!("1F1B: step {:.4} s, compute {:.4} s, ratio {ratio:.3}", st.time_s, ideal);
    assert!(ratio > 1.25 && ratio < 1.5, "{ratio}");
    let inter = stepsim::simulate(&pipeline_scenario("interleaved-1f1b", "virtual_stages = 2")).unwrap();
    let t2 = &inter.report.steps[0];
    assert!(t2.time_s < st.time_s, "interleaved {} vs 1F1B {}", t2.time_s, st.time_s);
}

/// Korthikanti et al. 2022 Table 5: iteration time with full recompute (TP, no SP) and with
/// selective recompute + sequence parallelism, and the Megatron-LM README's MFU / HFU of the
/// latter (tests/fixtures/megatron_mfu.json), every row simulated on the lean path (the 530B
/// and 1T pipelines, 35 x 280 and 64 x 512 stage micro-batches, take most of this test's
/// ~13 s in a release build, ~20 s in the test profile).
///
/// The 1T rows run the interleaved schedule with 2 model chunks per stage (the copy of
/// Table 3 names interleaving only for 175B and 530B; 2 is the most the 1T's 2 layers per
/// stage allow, and Narayanan et al.'s 1T on the same machine, tests/fidelity_megatron.rs,
/// is reproduced within 5% with it; plain 1F1B's 63 / 512 bubble makes these rows 12% slow).
///
/// The goal, asserted: a mean absolute error under 4% and no row over 8%. With the
/// global calibration of src/schedule/cost.rs (MATMUL_EFFICIENCY 0.80, fitted against every
/// throughput suite together, not this table alone) the rows land between -3.4% (22B
/// selective + SP) and +6.4% (530B full recompute), mean 3.6%. At the earlier calibration
/// (0.78) and model the mean was 5.3%. What moved it: a matmul's backward GEMMs quantized by
/// their own output shapes (the input gradient [M, K], the weight gradient [N, K]); the
/// optimizer step's gradient cast, clip and master copy passes (the 22B rows' ~120 ms outside
/// the layers); the refit. Pipeline transfers that block compute as Megatron's do (a fidelity
/// fix that brought Narayanan's rows to a 3% median) cost this table about 1 point. What
/// remains is systematic: the full recompute rows are 5-6% slow, the selective ones within
/// 1-5%; Megatron a year earlier (tests/fidelity_megatron.rs) was slower on like
/// configurations, so one calibration sits between the two papers.
#[test]
fn iteration_times_against_korthikanti_table5() {
    let f: Value = serde_json::from_str(include_str!("fixtures/korthikanti_table5.json")).unwrap();
    let mfu: Value = serde_json::from_str(include_str!("fixtures/megatron_mfu.json")).unwrap();
    println!("{:<6} {:<22} {:>10} {:>10} {:>8}", "model", "mode", "published", "stepsim", "error");
    let mut errs = Vec::new();
    let mut flop_ratios = Vec::new();
    for row in f["rows"].as_array().unwrap() {
        let name = row[0].as_str().unwrap();
        let n = |i: usize| row[i].as_u64().unwrap();
        let (a, h, l, tp, pp, gpus, batch, mb, v) = (n(1), n(2), n(3), n(4), n(5), n(6), n(7), n(8), n(9));
        for (mode, published) in [("full", row[10].as_f64().unwrap()), ("selective+sp", row[11].as_f64().unwrap())] {
            let sel = mode != "full";
            let vs = if v > 1 { format!("virtual_stages = {v}\n") } else { String::new() };
            let toml = format!(
                "[model]\nfamily = \"gpt\"\nn_layers = {l}\nhidden = {h}\nn_heads = {a}\nvocab = 51200\nmax_seq_len = 2048\ndropout = 0.1\n\
                 [hardware]\ngpu = \"a100-80gb\"\ngpus = {gpus}\ngpus_per_node = 8\n\
                 [parallel]\ntensor = {tp}\nsequence_parallel = {sel}\npipeline = {pp}\n{vs}\
                 [training]\nmicro_batch = {mb}\nseq_len = 2048\ngrad_accum = {}\nsteps = 1\nprecision = \"bf16-mixed-adam\"\n\
                 activation_checkpointing = \"{}\"\nattention = \"math\"\noptimizer_impl = \"fused\"\n",
                batch / mb,
                if sel { "selective" } else { "full" }
            );
            let s = Scenario::from_toml(Path::new("<table5>"), &toml).unwrap();
            let dag = model::build(&s.model, &s.workload);
            let r = stepsim::simulate_lean(&s, &dag, &[]).unwrap();
            let tp = r.throughput.as_ref().expect("fits");
            let t = tp.step_time_s;
            let e = t / published - 1.0;
            println!("{name:<6} {mode:<22} {published:>10.2} {t:>10.2} {:>7.1}%", e * 100.0);
            if sel {
                let m = &mfu["rows"].as_array().unwrap().iter().find(|x| x["model"] == name).expect("MFU row");
                let (pm, ph) = (m["mfu"].as_f64().unwrap(), m["hfu"].as_f64().unwrap());
                // FLOPs per step as each side counts them: utilization x time.
                let (fm, fh) = ((tp.mfu * t) / (pm * published), (tp.hfu * t) / (ph * published));
                println!(
                    "       MFU {:.1}% (published {:.1}%), HFU {:.1}% ({:.1}%); model FLOPs x{fm:.4}, hardware FLOPs x{fh:.4} of Megatron's count",
                    tp.mfu * 100.0,
                    pm * 100.0,
                    tp.hfu * 100.0,
                    ph * 100.0
                );
                flop_ratios.push((name.to_string(), fm, fh));
            }
            errs.push((format!("{name} {mode}"), e));
        }
    }
    let mae = errs.iter().map(|e| e.1.abs()).sum::<f64>() / errs.len() as f64;
    let over = errs.iter().filter(|e| e.1.abs() > 0.08).count();
    println!(
        "mean absolute error {:.1}% over {} rows (goal < 4%); {over} rows over 8% (goal none)",
        mae * 100.0,
        errs.len()
    );
    for (row, e) in &errs {
        assert!(e.abs() <= 0.08, "{row}: {:.1}% off the published iteration time", e * 100.0);
    }
    // The Megatron-LM README's MFU / HFU of the selective + SP runs (megatron_mfu.json):
    // stepsim counts the same model FLOPs (3 x forward, attention and the LM head included)
    // within 1%. Its hardware FLOPs add the recomputed attention scores once, as they run;
    // Megatron's HFU formula counts them as s / (3 h) instead of s / (6 h), three times that,
    // so stepsim's hardware FLOPs sit 1-3% under Megatron's count (3.0% for 22B's short
    // hidden, 0.9% for 1T).
    for (row, fm, fh) in &flop_ratios {
        assert!((fm - 1.0).abs() <= 0.01, "{row}: model FLOPs x{fm:.4} of Megatron's");
        assert!((0.96..=1.0).contains(fh), "{row}: hardware FLOPs x{fh:.4} of Megatron's");
    }
    assert_eq!(flop_ratios.len(), 4);
    assert!(mae < 0.04, "mean absolute error {:.1}% (goal under 4%)", mae * 100.0);
}

/// Korthikanti et al. 2022 Table 4: forward and backward time of one transformer layer of
/// the 22B model (a = 64, h = 6144, t = 8, s = 2048, b = 4), ms: the span of layer 1's tasks
/// (compute and tensor-parallel collectives) in a 4-layer model, recomputation included in
/// backward. Tolerance 5% per figure. `TABLE4_OPS=1` prints every task of the layer.
#[test]
fn single_layer_times_against_korthikanti_table4() {
    let rows = [
        ("baseline", false, "none", 7.7, 11.9),
        ("sequence parallel", true, "none", 7.2, 11.8),
        ("full recompute", false, "full", 7.7, 19.5),
        ("selective recompute", false, "selective", 7.7, 13.2),
        ("selective + sequence parallel", true, "selective", 7.2, 13.1),
    ];
    println!(
        "{:<30} {:>8} {:>8} {:>7}   {:>8} {:>8} {:>7}",
        "22B layer (ms)", "fwd pub", "stepsim", "error", "bwd pub", "stepsim", "error"
    );
    let mut worst: f64 = 0.0;
    for (name, sp, ac, f_pub, b_pub) in rows {
        let toml = format!(
            "[model]\nfamily = \"gpt\"\nn_layers = 4\nhidden = 6144\nn_heads = 64\nvocab = 51200\nmax_seq_len = 2048\ndropout = 0.1\n\
             [hardware]\ngpu = \"a100-80gb\"\ngpus = 8\ngpus_per_node = 8\n\
             [parallel]\ntensor = 8\nsequence_parallel = {sp}\n\
             [training]\nmicro_batch = 4\nseq_len = 2048\ngrad_accum = 1\nsteps = 1\nprecision = \"bf16-mixed-adam\"\n\
             activation_checkpointing = \"{ac}\"\nattention = \"math\"\noptimizer_impl = \"fused\"\n"
        );
        let s = Scenario::from_toml(Path::new("<table4>"), &toml).unwrap();
        let sim = stepsim::simulate(&s).unwrap();
        let sch = sim.schedule();
        let tr = sim.trace();
        let span = |phase: stepsim::schedule::Phase| {
            let (mut lo, mut hi) = (u64::MAX, 0);
            for (i, t) in sch.program.tasks.iter().enumerate() {
                let l = &sch.labels[t.label as usize];
                if l.step == 1 && l.phase == phase && l.region == Some(Region::Block(1)) {
                    lo = lo.min(tr.start_ns[i]);
                    hi = hi.max(tr.end_ns[i]);
                    if std::env::var("TABLE4_OPS").is_ok() {
                        println!("    {:?} {:<50} {:>8.3} ms", l.kind, l.what, t.duration_ns as f64 / 1e6);
                    }
                }
            }
            (hi - lo) as f64 / 1e6
        };
        let f = span(stepsim::schedule::Phase::Forward);
        let b = span(stepsim::schedule::Phase::Backward);
        let (ef, eb) = (f / f_pub - 1.0, b / b_pub - 1.0);
        println!(
            "{name:<30} {f_pub:>8.1} {f:>8.2} {:>+6.1}%   {b_pub:>8.1} {b:>8.2} {:>+6.1}%",
            ef * 100.0,
            eb * 100.0
        );
        worst = worst.max(ef.abs()).max(eb.abs());
    }
    println!("largest |error| {:.1}%", worst * 100.0);
    assert!(worst <= 0.05, "a Table 4 layer time is {:.1}% off", worst * 100.0);
}
