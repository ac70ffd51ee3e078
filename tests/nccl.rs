//! NCCL's own device memory: which communicators each rank holds, by framework and layout,
//! and what they take off the allocator's capacity (src/scenario/nccl.rs,
//! src/net/nccl_memory.rs; the per-communicator byte counts are unit-tested there against
//! NCCL's source and nccl#964).

use std::path::Path;

use stepsim::scenario::Scenario;

fn scenario(gpu: &str, gpus: u64, parallel: &str, extra: &str) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = 8\nhidden = 2048\nn_heads = 16\nvocab = 50304\nmax_seq_len = 2048\ntie_embeddings = true\n\
         [hardware]\ngpu = \"{gpu}\"\ngpus = {gpus}\n\
         [parallel]\n{parallel}\n\
         [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 4\nattention = \"flash\"\n{extra}"
    );
    Scenario::from_toml(Path::new("<nccl>"), &toml).unwrap_or_else(|e| panic!("{e}"))
}

fn names(s: &Scenario) -> Vec<String> {
    s.nccl_estimate().communicators.iter().map(|(c, _)| c.name.clone()).collect()
}

#[test]
fn one_gpu_holds_no_communicator() {
    let s = scenario("h100-sxm", 1, "", "");
    assert_eq!(s.nccl_bytes(), 0);
    assert_eq!(s.allocator_capacity(), s.cluster.capacity_bytes());
}

#[test]
fn a_megatron_rank_holds_its_groups_and_the_largest_stage_counts() {
    // 32 H100s: tensor 4 x pipeline 4 x data 2, tied embeddings.
    let s = scenario(
        "h100-sxm",
        32,
        "framework = \"megatron\"\nsharding = \"zero1\"\ntensor = 4\nsequence_parallel = true\npipeline = 4",
        "",
    );
    let e = s.nccl_estimate();
    let n = names(&s);
    assert!(n.iter().any(|x| x.starts_with("tensor parallel (4 ranks)")), "{n:?}");
    assert!(n.iter().any(|x| x.starts_with("data parallel (2 ranks)")), "{n:?}");
    assert!(n.iter().any(|x| x.starts_with("model parallel (16 ranks")), "{n:?}");
    assert!(n.iter().any(|x| x.starts_with("world (32 ranks")), "{n:?}");
    // Stage 0 also holds the tied embedding's group; a middle stage sends to two
    // neighbours instead: the larger is reported.
    let first_or_middle =
        n.iter().any(|x| x.starts_with("embedding group")) || n.iter().any(|x| x.contains("2 neighbour"));
    assert!(first_or_middle, "{n:?}");
    assert_eq!(e.per_gpu, e.communicators.iter().map(|c| c.1).sum::<u64>());
    assert!(e.per_gpu > 1 << 30, "{}", e.per_gpu);
    assert_eq!(s.nccl_bytes(), e.per_gpu);
    assert_eq!(s.allocator_capacity(), s.cluster.capacity_bytes() - e.per_gpu);
}

#[test]
fn pytorch_fsdp_holds_its_data_parallel_communicator_only() {
    let s = scenario("h100-sxm", 8, "sharding = \"full_shard\"", "");
    assert_eq!(names(&s), vec!["data parallel (8 ranks)".to_string()]);
    // Inside one H100 node with NCCL >= 2.22: 196 MiB of channel structures, 34 MiB of NVLS
    // setup, 24 x 12 MiB of ring connections, 256 MiB of NVLS buffers (the gradient norm's
    // all-reduce).
    assert_eq!(s.nccl_bytes(), (196 + 34 + 288 + 256) << 20);
}

#[test]
fn nccl_settings_and_the_explicit_figure_are_honoured() {
    let lazy = scenario("a100-80gb", 8, "sharding = \"full_shard\"", "");
    let eager =
        scenario("a100-80gb", 8, "sharding = \"full_shard\"", "[nccl]\nruntime_connect = false\ncumem = false\n");
    // Eagerly connected: ring, tree and the shared network pool at init, no cuMem rounding.
    assert_eq!(eager.nccl_bytes(), (24 * 12 + 24 * 12 + 256) << 20);
    assert!(lazy.nccl_bytes() != eager.nccl_bytes());
    let given = scenario("a100-80gb", 8, "sharding = \"full_shard\"", "[allocator]\nnccl_buffers = 1000000000\n");
    assert_eq!(given.nccl_bytes(), 1_000_000_000);
    // NVLS needs NVSwitch multicast.
    let toml = "[model]\nfamily = \"gpt\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nvocab = 1000\nmax_seq_len = 128\n\
                [hardware]\ngpu = \"a100-80gb\"\ngpus = 8\n[training]\nmicro_batch = 1\nseq_len = 128\n[nccl]\nnvls = true\n";
    let e = Scenario::from_toml(Path::new("x.toml"), toml).unwrap_err();
    assert_eq!(e.field, "nccl.nvls", "{e}");
    assert!(e.message.contains("NVSwitch multicast"), "{e}");
}

#[test]
fn the_report_names_each_communicator() {
    let s = scenario("h100-sxm", 16, "sharding = \"full_shard\"\ntensor = 2", "");
    let sim = stepsim::simulate(&s).unwrap();
    let line = sim.report.assumptions.iter().find(|a| a.starts_with("NCCL buffers")).unwrap();
    assert!(line.contains("tensor parallel (2 ranks)") && line.contains("data parallel (8 ranks)"), "{line}");
    assert!(line.contains("NCCL_RUNTIME_CONNECT=1"), "{line}");
}

/// `explain` offers NCCL_NVLS_ENABLE=0 where NVLS is on: it frees NCCL's multicast buffers
/// (capacity, not peak), and here that is what fits.
#[test]
fn explain_offers_turning_nvls_off() {
    use stepsim::explain;
    let mut s = scenario("h100-sxm", 8, "sharding = \"full_shard\"", "");
    let need = stepsim::simulate(&s).unwrap().report.peak.unwrap().reserved.bytes;
    let mut off = s.clone();
    off.set_nvls(false);
    let saved = s.nccl_bytes() - off.nccl_bytes();
    assert_eq!(saved, (34 + 256) << 20);
    // A device just too small with NVLS's buffers and large enough without them.
    s.cluster.memory_bytes = need + s.cluster.cuda_context_bytes + off.nccl_bytes() + (64 << 20);
    let sim = stepsim::simulate(&s).unwrap();
    assert!(matches!(sim.report.verdict, stepsim::report::Verdict::Oom(_)));
    let e = explain::explain(&s, &sim, explain::DEFAULT_MARGIN);
    let row = e.counterfactuals.iter().find(|c| c.change.starts_with("NCCL_NVLS_ENABLE=0")).expect("an NVLS row");
    assert_eq!(row.fits, Some(true), "{row:?}");
    // Not offered where NVLS is off (an A100).
    let a100 = scenario("a100-80gb", 8, "sharding = \"full_shard\"", "");
    let sim = stepsim::simulate(&a100).unwrap();
    let e = explain::explain(&a100, &sim, explain::DEFAULT_MARGIN);
    assert!(!e.counterfactuals.iter().any(|c| c.change.starts_with("NCCL_NVLS")));
}

/// memory.csv carries what nvidia-smi shows beside `reserved`: the allocator's reserved bytes
/// plus the CUDA context and NCCL's buffers, whose peak is the report's.
#[test]
fn memory_csv_has_nvidia_smi_beside_reserved() {
    let s = scenario("h100-sxm", 8, "sharding = \"full_shard\"", "");
    let sim = stepsim::simulate(&s).unwrap();
    let traces: Vec<_> = sim.run.traces.iter().collect();
    let csv = stepsim::report::write::job_memory_csv(&sim.report, &traces);
    let series = |cat: &str| -> Vec<u64> {
        csv.lines()
            .filter(|l| l.split(',').nth(2) == Some(cat))
            .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
            .collect()
    };
    let (reserved, smi) = (series("reserved"), series("nvidia_smi"));
    let outside = s.cluster.cuda_context_bytes + s.nccl_bytes();
    assert_eq!(reserved.len(), smi.len());
    assert!(reserved.iter().zip(&smi).all(|(r, n)| r + outside == *n));
    assert_eq!(smi.iter().max().copied(), Some(sim.report.allocator.nvidia_smi_peak.bytes));
}
