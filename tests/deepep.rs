//! DeepEP's dispatch and combine (Megatron-Core's flex token dispatcher): the kernel-level
//! model against DeepEP's own benchmark table, the configurations it refuses, its buffers
//! outside the allocator, and what it changes in a job.
//!
//! The table (tests/fixtures/deepep/legacy_normal_kernels.md, from deepseek-ai/DeepEP
//! dd758ca docs/legacy.md "Normal kernels with NVLink and RDMA forwarding"): H800, ~160 GB/s
//! NVLink, one CX7 400 Gb/s NIC per GPU, 4096 tokens of hidden 7168, top-8 of 256 experts
//! from the best min(nodes, 4) node groups, FP8 dispatch (1 + 4/128 B per element) and BF16
//! combine. Its "bottleneck bandwidth" is logical: across nodes the RDMA bytes count a token
//! once per node it reaches, its own node included (tests/legacy/test_internode.py
//! `num_rdma_token_sent`); inside a node, every token a rank receives
//! (tests/legacy/test_intranode.py `nvl_recv_bytes`). Tolerance 15%, the for
//! throughput.

use std::path::Path;

use stepsim::net::deepep::DeepEp;
use stepsim::net::Group;
use stepsim::scenario::Scenario;

/// (EP ranks, dispatch GB/s, combine GB/s) from the table; EP 8 is the intranode row (NVLink).
const TABLE: [(u64, f64, f64); 4] = [(8, 153.0, 158.0), (16, 43.0, 43.0), (32, 58.0, 57.0), (64, 51.0, 50.0)];

#[test]
fn deepeps_benchmark_table_within_15_percent() {
    let gpu = stepsim::hardware::lookup("h800").unwrap();
    let node = stepsim::hardware::node("hgx-h800").unwrap();
    let (tokens, hidden) = (4096.0, 7168.0);
    println!("| EP | kind | measured GB/s | stepsim GB/s | error |");
    for (ep, dispatch, combine) in TABLE {
        let nodes = ep.div_ceil(8);
        let d = DeepEp { experts: 256, top_k: 8, groups: nodes, group_topk: nodes.min(4), sms: 20, shares: None };
        let g = Group {
            ranks: ep,
            ranks_per_node: ep.min(8),
            nvlink_bytes_per_s: gpu.nvlink_bytes_per_s,
            network_bytes_per_s: node.nic_bytes_per_s * f64::from(node.nics_per_node) / f64::from(node.gpus_per_node),
            network_efficiency: 0.94,
            ll_max_bytes_per_s: stepsim::net::ll_max_bus_bytes_per_s(Some(90)),
            nvls_channels: 0,
            nvls_rate_scale: 1.0,
            nvls_min_ranks: 5,
            ring_plateau: stepsim::net::ring_plateau(Some(90)),
        };
        let f = d.fanout(ep, ep.min(8));
        for (kind, measured, elem) in [("dispatch", dispatch, 1.0 + 4.0 / 128.0), ("combine", combine, 2.0)] {
            let token = hidden * elem;
            let t = d.time_s(&f, &g, (tokens * 8.0 * token) as u64);
            // The benchmark's logical bytes: per node reached across nodes, per rank inside one.
            let logical = tokens * token * if nodes > 1 { f.nodes } else { f.ranks };
            let predicted = logical / t / 1e9;
            let err = predicted / measured - 1.0;
            println!("| {ep} | {kind} | {measured:.0} | {predicted:.1} | {:+.1}% |", err * 100.0);
            assert!(err.abs() < 0.15, "EP {ep} {kind}: {predicted:.1} vs {measured}");
        }
    }
}

/// A MoE job across two nodes (16 experts over EP 16), Megatron-LM, micro-batch 1 x 2048.
fn toml(moe: &str, parallel: &str) -> String {
    format!(
        "[model]\nfamily = \"llama\"\nn_layers = 4\nhidden = 1024\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = 3584\nvocab = 32000\nmax_seq_len = 2048\n\
         [model.moe]\nnum_experts = 16\ntop_k = 4\nexpert_ffn_hidden = 1792\nrouter_groups = 2\nrouter_group_topk = 1\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 16\nnode = \"dgx-h100\"\n\
         [parallel]\nframework = \"megatron\"\nsharding = \"zero1\"\nexpert = 16\n{parallel}\n\
         [moe]\n{moe}\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 4\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n"
    )
}

#[test]
fn deepep_is_refused_where_it_does_not_run_or_is_not_simulated() {
    for (moe, field, says) in [
        ("dispatcher = \"deepep\"\ncapacity_factor = 1.0", "moe.dispatcher", "capacity factor"),
        ("dispatcher = \"deepep\"\ndeepep_sms = 21", "moe.deepep_sms", "even count"),
        ("deepep_sms = 24", "moe.deepep_sms", "applies to moe.dispatcher = \"deepep\""),
        ("dispatcher = \"nccl\"", "moe.dispatcher", "\"alltoall\", \"deepep\""),
    ] {
        let err = Scenario::from_toml(Path::new("<deepep>"), &toml(moe, "")).err().unwrap().to_string();
        assert!(err.contains(field) && err.contains(says), "{moe}: {err}");
    }
    // EP 12 has no DeepEP configuration.
    let t = toml("dispatcher = \"deepep\"", "").replace("expert = 16", "expert = 12").replace("gpus = 16", "gpus = 24");
    let t = t.replace("num_experts = 16", "num_experts = 24");
    let err = Scenario::from_toml(Path::new("<deepep>"), &t).err().unwrap().to_string();
    assert!(err.contains("moe.dispatcher") && err.contains("Unsupported number of EP ranks"), "{err}");
    // Groups must split the experts.
    let t = toml("", "").replace("router_groups = 2", "router_groups = 3");
    let err = Scenario::from_toml(Path::new("<deepep>"), &t).err().unwrap().to_string();
    assert!(err.contains("model.moe.router_groups"), "{err}");
}

/// The same job with NCCL's all-to-all and with DeepEP: DeepEP sends a token once per node
/// it reaches (here one other node at most: group-limited to 1 of 2 groups = nodes), so the
/// step is shorter; its buffers come off the allocator's capacity, by DeepEP's size hints.
#[test]
fn deepep_sends_less_and_holds_its_buffers_outside_the_allocator() {
    let load = |moe: &str| Scenario::from_toml(Path::new("<deepep>"), &toml(moe, "")).unwrap();
    let (a2a, dep) = (load(""), load("dispatcher = \"deepep\""));
    assert_eq!(a2a.deepep_bytes(), 0);
    // EP 16 (two nodes of 8), hidden 1024 in BF16, 20 SMs: 10 channels; receive chunks of
    // 288 NVLink tokens and 140 / 132 RDMA tokens (dispatch / combine; the larger counts).
    let per_token = 2048 + 8 + 1024 + 512 + 512;
    let align = |x: u64| x.div_ceil(128) * 128;
    let nvl = align(10 * 8 * (2 * 2 + 3) * 4 + 10 * 8 * 288 * per_token);
    let rdma = align(10 * 2 * 18 * 2 * 4 + 10 * 2 * 140 * (per_token + 16) * 2);
    assert_eq!(dep.deepep_bytes(), nvl + rdma);
    assert_eq!(a2a.allocator_capacity() - dep.allocator_capacity(), nvl + rdma);
    let step = |s: &Scenario| stepsim::simulate(s).unwrap().report.throughput.as_ref().unwrap().step_time_s;
    let (t_a2a, t_dep) = (step(&a2a), step(&dep));
    println!("step: all-to-all {:.2} ms, DeepEP {:.2} ms", t_a2a * 1e3, t_dep * 1e3);
    assert!(t_dep < t_a2a);
    let text = stepsim::report::text::render(&stepsim::simulate(&dep).unwrap().report, &dep);
    assert!(text.contains("DeepEP buffers") && text.contains("once per node it reaches"), "{text}");
    assert!(text.contains("top-4 routing from the best 1 of 2 groups"), "{text}");
}

/// Under uneven routing DeepEP's dispatch lasts until the busiest receiver has its tokens.
/// Inside one node (EP 8, NVLink only; 8 experts, top-2, no groups) with measured shares
/// 3:1:..:1, expert 0's rank holds 2.4x its uniform share: a token reaches it with
/// probability 1 - (1 - 1/4)^2.4 (uniform: 1 - C(7,2)/C(8,2) = 1/4), so it receives 8 ranks'
/// tokens at that rate, where every rank receives 8 x 1/4 of a rank's tokens uniformly.
/// Equal measured shares are uniform routing again, to the nanosecond.
#[test]
fn deepep_under_uneven_routing_waits_for_the_busiest_receiver() {
    let one_node = |moe: &str| {
        let t = toml(moe, "")
            .replace("num_experts = 16\ntop_k = 4", "num_experts = 8\ntop_k = 2")
            .replace("router_groups = 2\nrouter_group_topk = 1\n", "")
            .replace("gpus = 16", "gpus = 8")
            .replace("expert = 16", "expert = 8");
        Scenario::from_toml(Path::new("<deepep>"), &t).unwrap_or_else(|e| panic!("{e}"))
    };
    let dispatch_ns = |s: &Scenario| -> u64 {
        let sim = stepsim::simulate(s).unwrap();
        let sched = sim.schedule();
        let i = sched
            .program
            .tasks
            .iter()
            .position(|t| sched.labels[t.label as usize].what.ends_with("layers.0.feed_forward.dispatch"))
            .unwrap();
        sched.program.tasks[i].duration_ns
    };
    let uniform = one_node("dispatcher = \"deepep\"");
    let equal =
        one_node("dispatcher = \"deepep\"\nrouting = \"measured\"\ntokens_per_expert = [5, 5, 5, 5, 5, 5, 5, 5]");
    let hot = one_node("dispatcher = \"deepep\"\nrouting = \"measured\"\ntokens_per_expert = [3, 1, 1, 1, 1, 1, 1, 1]");
    let (u, e, h) = (dispatch_ns(&uniform), dispatch_ns(&equal), dispatch_ns(&hot));
    assert_eq!(u, e, "equal shares are uniform routing");
    // Hand-derived: the latency is common, the NVLink part scales with the receive.
    let p_hot = 1.0 - 0.75f64.powf(2.4);
    let alpha = stepsim::net::ALPHA_INTRA_S * 1e9;
    let ratio = (h as f64 - alpha) / (u as f64 - alpha);
    println!("dispatch: uniform {u} ns, hot expert {h} ns; NVLink part x{ratio:.4}, expected x{:.4}", p_hot / 0.25);
    assert!((ratio / (p_hot / 0.25) - 1.0).abs() < 1e-3, "{ratio} vs {}", p_hot / 0.25);
    // Less than NCCL's all-to-all of every copy to the same hot rank, which grows with the
    // copies themselves (2.4x), not with the tokens reached.
    assert!(p_hot / 0.25 < 2.4);
    let text = stepsim::report::text::render(&stepsim::simulate(&hot).unwrap().report, &hot);
    assert!(text.contains("the busiest receiver sets its length"), "{text}");
}

/// `explain` offers DeepEP and the all-to-all overlap for a mixture of experts under Megatron
/// with expert parallelism, each re-simulated: here (two nodes, NCCL's all-to-all, no
/// recompute) both apply and both are faster; a run explained as near capacity (margin 1.0)
/// lists them.
#[test]
fn explain_offers_deepep_and_the_all_to_all_overlap() {
    let s = Scenario::from_toml(Path::new("<deepep>"), &toml("", "")).unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let e = stepsim::explain::explain(&s, &sim, 1.0);
    for (row, label) in [("DeepEP", "moe.dispatcher = \"deepep\""), ("overlap", "overlap_moe_expert_parallel_comm")] {
        let c =
            e.counterfactuals.iter().find(|c| c.change.starts_with(label)).unwrap_or_else(|| {
                panic!("{row}: {:?}", e.counterfactuals.iter().map(|c| &c.change).collect::<Vec<_>>())
            });
        assert_eq!(c.fits, Some(true), "{row}");
        assert!(c.tokens_per_s_change.unwrap() > 0.0, "{row}: {:?}", c.tokens_per_s_change);
    }
}

/// The shipped Qwen3-30B-A3B job (16 H100, EP 16 across two nodes): it fits at the peak its
/// file states (69.6 GB, within 1%), and each of DeepEP and the all-to-all overlap shortens
/// the step, both together most, with the peak unchanged by the overlap.
#[test]
fn the_shipped_cross_node_moe_job_fits_and_each_feature_pays() {
    let path = Path::new("scenarios/qwen3-30b-a3b-h100-ep16-deepep.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let with = |deepep: bool, overlap: bool| {
        let t = text
            .replace(
                "dispatcher = \"deepep\"",
                if deepep { "dispatcher = \"deepep\"" } else { "dispatcher = \"alltoall\"" },
            )
            .replace(
                "overlap_moe_expert_parallel_comm = true",
                if overlap {
                    "overlap_moe_expert_parallel_comm = true"
                } else {
                    "overlap_moe_expert_parallel_comm = false"
                },
            );
        let s = Scenario::from_toml(path, &t).unwrap();
        let r = stepsim::simulate(&s).unwrap().report;
        assert!(matches!(r.verdict, stepsim::report::Verdict::Fits { .. }), "deepep {deepep} overlap {overlap}");
        (r.throughput.as_ref().unwrap().step_time_s, r.peak.as_ref().unwrap().allocated.bytes as f64)
    };
    let (both, peak) = with(true, true);
    let (neither, peak0) = with(false, false);
    let (dep, _) = with(true, false);
    let (ov, _) = with(false, true);
    println!(
        "step: neither {neither:.3} s, DeepEP {dep:.3} s, overlap {ov:.3} s, both {both:.3} s; peak {:.2} GB",
        peak / 1e9
    );
    assert!((peak / 69.56e9 - 1.0).abs() < 0.01, "{peak}");
    assert!(both < dep && dep < neither && both < ov && ov < neither);
    assert!((peak / peak0 - 1.0).abs() < 0.01);
}
