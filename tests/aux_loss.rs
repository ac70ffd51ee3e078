//! The mixture of experts' auxiliary load-balancing loss ([moe] aux_loss), rule by rule
//! against figures derived by hand: what Megatron-Core's router keeps and all-reduces for it in
//! every MoE block, what Hugging Face's `load_balancing_loss_func` holds at the end of the
//! forward, the defaults each framework takes (a config's `output_router_logits`), the errors
//! for what a framework does not compute, and the Megatron import of
//! `--moe-router-load-balancing-type` / `--moe-aux-loss-coeff`. The model is small (hidden
//! 1024, 4 blocks) so each case runs in well under a second.

use std::path::Path;

use stepsim::model::{self, AuxLoss, CommGroup};
use stepsim::scenario::Scenario;
use stepsim::schedule::Phase;

const H: u64 = 1024;
const SEQ: u64 = 2048;
const LAYERS: u64 = 4;

/// `experts` experts of top `k` on `gpus` H100s: `parallel` and `[moe]` lines as given.
fn toml(experts: u64, k: u64, gpus: u64, parallel: &str, moe: &str) -> String {
    format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = 2048\nvocab = 32000\nmax_seq_len = {SEQ}\n\
         [model.moe]\nnum_experts = {experts}\ntop_k = {k}\nexpert_ffn_hidden = 512\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\n{parallel}\n\
         [moe]\n{moe}\n\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\ngrad_accum = 2\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n"
    )
}

fn scenario(text: &str) -> Scenario {
    Scenario::from_toml(Path::new("<aux>"), text).unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> String {
    Scenario::from_toml(Path::new("job.toml"), text).unwrap_err().to_string()
}

fn peak(s: &Scenario) -> u64 {
    stepsim::simulate(s).unwrap().report.peak.as_ref().unwrap().allocated.bytes
}

/// Megatron-Core, tensor parallel 2 with sequence parallelism: each rank routes its 1,024 of
/// the 2,048 rows, so the scores kept per MoE block are 1,024 x 16 experts x 4 B = 64 KiB; the
/// routing map's scratch 1,024 x 16 x 5 B; each per-micro-batch loss all-reduces 16 int64
/// counts (128 B) over tensor x context, global_aux_loss over the stage.
#[test]
fn megatron_router_keeps_its_fp32_scores_and_all_reduces_the_counts() {
    let (e, rows) = (16, SEQ / 2);
    let par = "framework = \"megatron\"\ntensor = 2\nsequence_parallel = true";
    let s = scenario(&toml(e, 2, 2, par, "aux_loss = [\"aux_loss\", \"global_aux_loss\"]"));
    assert_eq!(s.workload.aux_loss, AuxLoss::Megatron { local: 1, global: true });
    let dag = model::build(&s.model, &s.workload);
    let aux: Vec<_> = dag.ops.iter().filter(|o| o.name.ends_with("router.aux_loss")).collect();
    assert_eq!(aux.len() as u64, LAYERS);
    for op in &aux {
        let saved: u64 = op.saves.iter().map(|&t| dag.tensors[t].bytes).sum();
        assert_eq!(saved, rows * e * 4, "{}", op.name);
        assert_eq!(op.fwd_scratch, rows * e * 5);
    }
    let comms = |g: CommGroup| {
        dag.ops.iter().filter(|o| o.comm.is_some_and(|c| c.group == g && c.bytes == e * 8)).count() as u64
    };
    assert_eq!(comms(CommGroup::TensorContext), LAYERS);
    assert_eq!(comms(CommGroup::Stage), LAYERS);
    // Without tensor (or context) parallelism the per-micro-batch loss's counts stay home.
    let one = scenario(&toml(e, 2, 1, "framework = \"megatron\"", "aux_loss = \"seq_aux_loss\""));
    let dag1 = model::build(&one.model, &one.workload);
    assert_eq!(dag1.ops.iter().filter(|o| o.name.ends_with("router.aux_loss")).count() as u64, LAYERS);
    assert!(dag1.ops.iter().all(|o| o.comm.is_none_or(|c| c.group != CommGroup::TensorContext)));
    // The scores cost memory: the peak rises with the loss on.
    let off = scenario(&toml(e, 2, 2, par, "aux_loss = \"none\""));
    assert_eq!(off.workload.aux_loss, AuxLoss::None);
    assert!(peak(&s) > peak(&off));
    // The report says what is kept and where the counts go.
    let r = stepsim::simulate(&s).unwrap().report;
    let said = r.assumptions.iter().find(|a| a.contains("auxiliary load-balancing loss")).unwrap();
    assert!(said.contains("once more in FP32") && said.contains("for global_aux_loss"), "{said}");
}

/// Hugging Face (FSDP, one GPU), 256 experts of top 8 and a vocabulary of 8,000: at the end of
/// the forward the loss holds the 4 blocks' router logits concatenated and softmaxed (4 x 2,048
/// x 256 x 2 B = 4 MiB each) and the one-hot mask in int64 with its float copy (4 x 2,048 x 8
/// x 256 x 12 B = 192 MiB), beside the language model's saved FP32 log-softmax (65 MB), more
/// than the cross-entropy's own moment (the logits, their FP32 copy and its log-softmax:
/// 164 MB).
#[test]
fn hugging_face_loss_holds_the_one_hot_mask_at_the_end_of_the_forward() {
    let (e, k) = (256, 8);
    let toml = |moe: &str| toml(e, k, 1, "sharding = \"full_shard\"", moe).replace("vocab = 32000", "vocab = 8000");
    let s = scenario(&toml("aux_loss = \"aux_loss\""));
    assert_eq!(s.workload.aux_loss, AuxLoss::AllBlocks);
    let dag = model::build(&s.model, &s.workload);
    let op = dag.ops.iter().find(|o| o.name == "load_balancing_loss").expect("the loss op");
    assert_eq!(op.inputs.len() as u64, LAYERS, "every block's router logits");
    let all = LAYERS * SEQ * e;
    assert_eq!(op.fwd_scratch, all * 2 + all * k * 12);
    assert_eq!(op.saves.iter().map(|&t| dag.tensors[t].bytes).sum::<u64>(), all * 2);
    // It comes after the language model's loss.
    let lm = dag.ops.iter().position(|o| o.name == "loss.nll").unwrap();
    assert!(dag.ops.iter().position(|o| o.name == "load_balancing_loss").unwrap() > lm);
    // While its kernels run, the GPU holds the mask, its copy and the concatenation on top of
    // what the language model's loss left.
    let sim = stepsim::simulate(&s).unwrap();
    let (labels, tasks) = (&sim.schedule().labels, &sim.schedule().program.tasks);
    let at = |what: &str| {
        sim.trace()
            .timeline
            .samples()
            .filter(|x| {
                let l = &labels[tasks[x.task].label as usize];
                l.phase == Phase::Forward && l.what == what
            })
            .map(|x| x.allocated)
            .max()
            .unwrap()
    };
    let (lb, nll) = (at("load_balancing_loss"), at("loss.nll"));
    println!("Hugging Face load-balancing loss: {lb} B allocated in it, {nll} B in the cross-entropy's last kernel");
    assert!(lb >= nll + all * k * 12 + all * 2, "{lb} vs {nll}");
}

/// A MoE `config.json` with `output_router_logits: true` turns the loss on for Hugging Face
/// model code (its `*ForCausalLM` computes it then), not for Megatron-Core or torchtitan,
/// which do not run that code.
#[test]
fn a_configs_output_router_logits_is_the_hugging_face_default() {
    let dir = std::env::temp_dir().join(format!("stepsim-aux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 2048, "vocab_size": 32000,
            "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512, "output_router_logits": true}"#,
    )
    .unwrap();
    let job = |parallel: &str| {
        format!(
            "[model]\nhf_config = \"config.json\"\n[hardware]\ngpu = \"h100-sxm\"\ngpus = 1\n[parallel]\n{parallel}\n\
             [training]\nmicro_batch = 1\nseq_len = 1024\n"
        )
    };
    let load = |p: &str| Scenario::from_toml(&dir.join("job.toml"), &job(p)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(load("sharding = \"full_shard\"").workload.aux_loss, AuxLoss::AllBlocks);
    assert_eq!(load("framework = \"megatron\"").workload.aux_loss, AuxLoss::None);
    assert_eq!(load("framework = \"fsdp2\"\nsharding = \"full_shard\"").workload.aux_loss, AuxLoss::None);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn what_a_framework_does_not_compute_is_refused_naming_the_field() {
    let cases = [
        ("framework = \"fsdp2\"\nsharding = \"full_shard\"", "aux_loss = \"aux_loss\"", "load_balance_coeff"),
        ("sharding = \"full_shard\"", "aux_loss = \"seq_aux_loss\"", "Megatron-Core's"),
        ("framework = \"megatron\"", "aux_loss = \"sinkhorn\"", "allowed: \"none\""),
        ("framework = \"megatron\"", "aux_loss = [\"none\", \"aux_loss\"]", "goes alone"),
        ("framework = \"megatron\"", "aux_loss = [\"aux_loss\", \"aux_loss\"]", "twice"),
        ("framework = \"megatron\"", "aux_loss = []", "names no loss"),
        ("framework = \"megatron\"", "aux_loss = 3", "a string or a list of strings"),
    ];
    for (par, moe, want) in cases {
        let e = error(&toml(16, 2, 1, par, moe));
        assert!(e.contains("aux_loss") && e.contains(want), "{moe}: {e}");
        assert!(e.contains("job.toml"), "{e}");
    }
    // Hugging Face model code under a DeepSpeed pipeline: the loss reads every stage's logits.
    let e = error(&toml(
        16,
        2,
        2,
        "framework = \"deepspeed\"\npipeline = 2\nsharding = \"zero1\"",
        "aux_loss = \"aux_loss\"",
    ));
    assert!(e.contains("moe.aux_loss") && (e.contains("pipeline") || e.contains("parallel.")), "{e}");
}

/// Megatron's functional test moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed trains with
/// `--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4`: imported as
/// seq_aux_loss. A coefficient of 0 (the default) computes none; lists pair up.
#[test]
fn megatron_import_reads_the_balancing_type_and_its_coefficient() {
    use stepsim::import::megatron::{self, MegatronArgs};
    let args = MegatronArgs { gpu: "h100-sxm".into(), gpus: Some(8), gpus_per_node: None, vocab: Some(32000) };
    let base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --max-position-embeddings 2048 \
                --micro-batch-size 1 --global-batch-size 8 --bf16 --num-experts 16 --moe-router-topk 2 \
                --expert-model-parallel-size 8 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear";
    let load = |extra: &str| {
        let im = megatron::import("cmd", &format!("{base} {extra}"), &args).unwrap_or_else(|e| panic!("{e}"));
        let s = Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron"))
            .unwrap_or_else(|e| panic!("{e}\n{}", im.toml));
        s.workload.aux_loss
    };
    assert_eq!(
        load("--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4"),
        AuxLoss::Megatron { local: 1, global: false }
    );
    assert_eq!(load("--moe-aux-loss-coeff 1e-2"), AuxLoss::Megatron { local: 1, global: false });
    assert_eq!(load(""), AuxLoss::None);
    assert_eq!(load("--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0"), AuxLoss::None);
    assert_eq!(
        load("--moe-router-load-balancing-type seq_aux_loss global_aux_loss --moe-aux-loss-coeff 1e-4 1e-3"),
        AuxLoss::Megatron { local: 1, global: true }
    );
    let e = megatron::import(
        "cmd",
        &format!("{base} --moe-router-load-balancing-type seq_aux_loss global_aux_loss --moe-aux-loss-coeff 1e-4"),
        &args,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("moe_aux_loss_coeff") && e.contains("one each"), "{e}");
}
