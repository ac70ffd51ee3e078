//! Multi-token prediction (DeepSeek-V3 Sec. 2.2; Megatron-Core's `MultiTokenPredictionBlock`),
//! against figures derived by hand: the modules' own parameters (DeepSeek-V3's checkpoint
//! term by term), the FLOPs and saved bytes one module adds to a small model's DAG, where it
//! sits in a pipeline and what checkpoints it, the refusals, and `stepsim import megatron`'s
//! `--mtp-num-layers`.

use std::path::Path;

use stepsim::import::megatron::{self, MegatronArgs};
use stepsim::model::{self, OpKind, Region, TensorKind};
use stepsim::scenario::Scenario;

const H: u64 = 1024;
const F: u64 = 2816;
const V: u64 = 32000;
const SEQ: u64 = 2048;
const LAYERS: u64 = 4;

/// A small Llama (hidden 1024, 8 heads, ffn 2816, vocabulary 32000, untied) under Megatron,
/// with `mtp` lines in [model.mtp] (none: no section) and `extra` lines of [parallel] and
/// [training] replaced as given.
fn scenario(gpus: u64, mtp: Option<&str>, parallel: &str, training: &str) -> Scenario {
    let mtp = mtp.map_or(String::new(), |m| format!("[model.mtp]\n{m}\n"));
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {F}\nvocab = {V}\nmax_seq_len = {SEQ}\n\
         {mtp}\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = {gpus}\n\
         [parallel]\nframework = \"megatron\"\n{parallel}\n\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\ngrad_accum = 2\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n{training}\n"
    );
    Scenario::from_toml(Path::new("<mtp>"), &toml).unwrap_or_else(|e| panic!("{e}"))
}

fn error(toml: &str) -> String {
    match Scenario::from_toml(Path::new("bad.toml"), toml) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

/// DeepSeek-V3 with one MTP module (its released checkpoint's `model.layers.61`, less its
/// copies of the embedding and head, which training shares with the main model):
///
/// - the main model, as transformers counts it (tests/hf_config.rs): 671,026,404,352
/// - enorm, hnorm and shared_head.norm (Megatron's `final_layernorm`): 3 x 7,168 = 21,504
/// - eh_proj, 2 x 7,168 -> 7,168 without a bias: 102,760,448
/// - one transformer layer of the last block's kind, a MoE block: attention 187,121,664
///   (multi-head latent attention 187,107,328 and the two block RMSNorms 14,336) + the MoE MLP
///   11,320,164,352 (router 1,835,008, 256 experts of 44,040,192, one shared 44,040,192) =
///   11,507,286,016
///
/// Module: 21,504 + 102,760,448 + 11,507,286,016 = 11,610,067,968; total 682,636,472,320. With
/// the checkpoint's copies of the embedding and head (2 x 129,280 x 7,168 = 1,853,358,080) the
/// module is 13,463,426,048, "14B", and the checkpoint 684,489,830,400, "685B". Active: the
/// module uses 8 of its 256 routed experts, 248 x 44,040,192 = 10,921,967,616 fewer:
/// 688,100,352, on top of the main model's 37,552,282,624.
#[test]
fn deepseek_v3_with_one_mtp_module_counts_671b_plus_the_module_term_by_term() {
    let toml = "[model]\nname = \"deepseek-v3\"\n[model.mtp]\nlayers = 1\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 64\n\
                [parallel]\nframework = \"megatron\"\nsharding = \"zero1\"\nexpert = 64\n\
                [training]\nmicro_batch = 1\nseq_len = 4096\n";
    let s = Scenario::from_toml(Path::new("ds.toml"), toml).unwrap_or_else(|e| panic!("{e}"));
    let h = 7_168u64;
    let norms = 3 * h;
    assert_eq!(norms, 21_504);
    let eh_proj = 2 * h * h;
    assert_eq!(eh_proj, 102_760_448);
    let mla = 187_107_328u64;
    let attention = mla + 2 * h;
    assert_eq!(attention, 187_121_664);
    let expert = 3 * h * 2_048;
    assert_eq!(expert, 44_040_192);
    let moe = 256 * h + 256 * expert + expert;
    assert_eq!(moe, 11_320_164_352);
    let layer = attention + moe;
    assert_eq!(layer, 11_507_286_016);
    let module = norms + eh_proj + layer;
    assert_eq!(module, 11_610_067_968);
    assert_eq!(s.model.mtp_module_params(), module);
    assert_eq!(s.model.param_count(), 671_026_404_352 + module);
    assert_eq!(s.model.param_count(), 682_636_472_320);
    // The released checkpoint: the module with its own embedding and head copies.
    assert_eq!(s.model.param_count() + 2 * 129_280 * h, 684_489_830_400);
    let active_module = module - 248 * expert;
    assert_eq!(active_module, 688_100_352);
    assert_eq!(s.model.active_param_count(), 37_552_282_624 + active_module);
    // The DAG holds the same parameters (the module's embedding and head own none).
    let dag = model::build(&s.model, &s.workload);
    // Expert parallel 64: the DAG is one rank's, with 4 of the 256 routed experts.
    let own: u64 = dag.ops.iter().filter(|o| o.region == Region::Block(61)).map(|o| o.params).sum();
    assert_eq!(own, module - (256 - 4) * expert, "one expert-parallel rank's share of the module");
    for o in dag.ops.iter().filter(|o| o.name.starts_with("mtp.0.embedding") || o.name == "mtp.0.output") {
        assert_eq!((o.params, o.shared_params), (0, 129_280 * h), "{}", o.name);
    }
}

/// Without `[model.mtp]` a DeepSeek-V3 config's `num_nextn_predict_layers` turns nothing on
/// (transformers builds no module; Megatron trains them only under --mtp-num-layers); the
/// report says the checkpoint holds one.
#[test]
fn a_configs_num_nextn_predict_layers_is_reported_not_trained() {
    let toml = "[model]\nname = \"deepseek-v3\"\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 64\n\
                [parallel]\nframework = \"megatron\"\nsharding = \"zero1\"\nexpert = 64\n\
                [training]\nmicro_batch = 1\nseq_len = 4096\n";
    let s = Scenario::from_toml(Path::new("ds.toml"), toml).unwrap();
    assert!(s.model.mtp.is_none());
    assert_eq!(s.model.param_count(), 671_026_404_352);
    let src = s.model_source.as_deref().unwrap();
    assert!(src.contains("num_nextn_predict_layers = 1 multi-token prediction module(s) not trained"), "{src}");
}

/// One module on the small model, hand-derived (t = 2048 tokens, h = 1024, V = 32000, c = 2
/// bytes). Forward FLOPs it adds (2 per multiply-add, as the DAG counts its other ops):
/// enorm, hnorm, final norm 3 x 5 t h; eh_proj 2 t (2h) h; a transformer layer equal to the
/// last block; the head 2 t h V and the vocab-parallel loss 5 t V; the embedding lookup, the
/// concatenations and the acceptance argmax none. Megatron's `num_floating_point_operations`
/// counts the same layer (`num_layers + mtp_num_layers`), eh_proj as 6 x 2h^2 per token (3 x
/// our forward's 4 t h^2) and the logits as 6 h V x (mtp_num_layers + 1) per token: the terms
/// agree. Saved bytes the module's block keeps: enorm its input t h c and FP32 rstd 4t, hnorm
/// likewise, eh_proj its 2h-wide input, the layer what the last block saves, final norm its
/// input and rstd; the head's region adds the FP32 softmax t V 4 its loss saves, the token ids
/// the lookup saves (t x 8) and the (1 + D) t h c concatenation the heads save in place of the
/// final norm's output.
#[test]
fn one_module_adds_its_flops_and_saved_bytes_as_derived_by_hand() {
    let with = scenario(1, Some("layers = 1"), "", "");
    let without = scenario(1, None, "", "");
    let (dw, d0) = (model::build(&with.model, &with.workload), model::build(&without.model, &without.workload));
    let (t, h, v, c) = (SEQ as f64, H as f64, V as f64, 2.0);
    let last = Region::Block(LAYERS - 1);
    let layer_flops: f64 = d0.ops_of(last).map(|(_, o)| o.fwd_flops).sum();
    let added = 3.0 * 5.0 * t * h + 2.0 * t * 2.0 * h * h + layer_flops + 2.0 * t * h * v + 5.0 * t * v;
    let diff = dw.forward_flops() - d0.forward_flops();
    assert!((diff - added).abs() / added < 1e-12, "{diff} vs {added}");
    assert_eq!(dw.model_forward_flops(), dw.forward_flops());
    // Megatron's MTP terms, per token: eh_proj 6 x 2h^2, logits 6 h V; ours 3 x forward.
    let eh: f64 = dw.ops.iter().filter(|o| o.name == "mtp.0.eh_proj").map(|o| o.fwd_flops).sum();
    assert_eq!(3.0 * eh, t * 6.0 * 2.0 * h * h);
    let head: f64 = dw.ops.iter().filter(|o| o.name == "mtp.0.output").map(|o| o.fwd_flops).sum();
    assert_eq!(3.0 * head, t * 6.0 * h * v);

    let (t, h, v, c) = (SEQ, H, V, c as u64);
    let module = dw.saved_bytes(Region::Block(LAYERS), true);
    let layer = d0.saved_bytes(last, true);
    assert_eq!(module, layer + 3 * (t * h * c + 4 * t) + t * 2 * h * c);
    let head_added = dw.saved_bytes(Region::Head, true) - d0.saved_bytes(Region::Head, true);
    assert_eq!(head_added, 4 * t * v + 8 * t + 2 * t * h * c - t * h * c);
    // The second vocabulary-sized tensor is the big one: the module's FP32 softmax.
    let sm = dw.tensors.iter().find(|x| x.name == "mtp.0.loss.softmax").unwrap();
    assert_eq!((sm.bytes, sm.kind), (4 * t * v, TensorKind::Activation));
    // The module's own parameters, closed form and DAG: 3 norms, eh_proj, a dense block.
    let block = 4 * h * h + 2 * h + 3 * h * F;
    assert_eq!(with.model.mtp_module_params(), 3 * h + 2 * h * h + block);
    assert_eq!(dw.param_count(), with.model.param_count());
    assert_eq!(with.model.param_count() - without.model.param_count(), 3 * h + 2 * h * h + block);
    // Order: the module and its head before the main head, as GPTModel._postprocess runs them.
    let pos = |n: &str| dw.ops.iter().position(|o| o.name == n).unwrap_or_else(|| panic!("{n}"));
    assert!(pos("norm") < pos("mtp.0.embedding") && pos("mtp.0.final_layernorm") < pos("mtp.0.output"));
    assert!(pos("mtp.0.acceptance") < pos("output") && dw.ops[pos("mtp.0.embedding")].kind == OpKind::Embedding);
    // Two modules: the second reads the first's output through its hnorm.
    let two = scenario(1, Some("layers = 2"), "", "");
    let d2 = model::build(&two.model, &two.workload);
    let first_out = d2.ops.iter().find(|o| o.name == "mtp.0.final_layernorm").unwrap().outputs[0];
    assert!(d2.ops.iter().find(|o| o.name == "mtp.1.hnorm").unwrap().inputs.contains(&first_out));
    let all = d2.tensors.iter().find(|x| x.name == "mtp.concat_hidden.out").unwrap();
    assert_eq!(all.bytes, 3 * t * h * c);
}

/// Under tensor and sequence parallelism (Megatron-Core's `_concat_embeddings`): the module's
/// embedding is vocabulary-parallel and reduce-scattered to this rank's tokens as the main
/// one is; enorm, hnorm and their concatenation run on the t / tp tokens; `eh_proj` is
/// column-parallel (its 2h-wide input all-gathered, h / tp of its columns on this rank, 2h x
/// h / tp parameters) and its output columns are all-gathered (`gather_from_tensor_model_
/// parallel_region`, t x h bytes whole) and split back to the t / tp tokens for the layer
/// (`scatter_to_sequence_parallel_region`, whose backward all-gathers); the module's head
/// gathers its chunk of the hidden states as the main head does. Without sequence
/// parallelism nothing is split back and the module's input is the whole sequence.
#[test]
fn with_tensor_and_sequence_parallelism_eh_proj_gathers_its_columns_and_splits_the_tokens() {
    use stepsim::net::Collective;
    let sp = scenario(2, Some("layers = 1"), "tensor = 2\nsequence_parallel = true", "");
    let d = model::build(&sp.model, &sp.workload);
    let (t, h, c) = (SEQ, H, 2);
    let op = |n: &str| d.ops.iter().find(|o| o.name == n).unwrap_or_else(|| panic!("{n}"));
    let bytes = |n: &str| d.tensors.iter().find(|x| x.name == n).unwrap_or_else(|| panic!("{n}")).bytes;
    assert_eq!(bytes("mtp.0.embedding.sp_reduce_scatter.out"), t / 2 * h * c);
    assert_eq!(bytes("mtp.0.concat.out"), t / 2 * 2 * h * c);
    assert_eq!(bytes("mtp.0.eh_proj.sp_all_gather.out"), t * 2 * h * c);
    assert_eq!(bytes("mtp.0.eh_proj.out"), t * h / 2 * c);
    assert_eq!(op("mtp.0.eh_proj").params, 2 * h * h / 2);
    // Its saved input is the shard, gathered again for the weight gradient.
    assert_eq!(op("mtp.0.eh_proj").saves, vec![op("mtp.0.concat").outputs[0]]);
    assert!(d.ops.iter().any(|o| o.name == "mtp.0.eh_proj.sp_regather"));
    let gather = op("mtp.0.eh_proj.tp_all_gather").comm.unwrap();
    assert_eq!((gather.forward, gather.backward, gather.bytes), (Some(Collective::AllGather), None, t * h * c));
    let split = op("mtp.0.eh_proj.sp_scatter").comm.unwrap();
    assert_eq!((split.forward, split.backward), (None, Some(Collective::AllGather)));
    assert_eq!(bytes("mtp.0.eh_proj.sp_scatter.out"), t / 2 * h * c);
    assert!(d.ops.iter().any(|o| o.name == "mtp.0.output.sp_all_gather"));
    // The whole step runs and fits.
    let r = stepsim::simulate(&sp).unwrap().report;
    assert!(matches!(r.verdict, stepsim::report::Verdict::Fits { .. }));
    // Without sequence parallelism: the gathered columns are the layer's input.
    let tp = scenario(2, Some("layers = 1"), "tensor = 2", "");
    let d = model::build(&tp.model, &tp.workload);
    assert!(!d.ops.iter().any(|o| o.name == "mtp.0.eh_proj.sp_scatter"));
    let gathered = d.ops.iter().find(|o| o.name == "mtp.0.eh_proj.tp_all_gather").unwrap().outputs[0];
    let hnorm_in = d.ops.iter().find(|o| o.name == "mtp.0.layer.attention_norm").unwrap().inputs[0];
    assert_eq!(gathered, hnorm_in);
    assert_eq!(d.tensors[gathered].bytes, t * h * c);
}

/// Under context parallelism (`roll_tensor` with a CP group) each module runs on this rank's
/// share of the tokens: its embedding, enorm, hnorm, concatenation and eh_proj on s / cp
/// tokens, its layer's attention as the decoder's under context parallelism, its head and
/// loss on the rank's tokens; the boundary exchange of the rolled ids, labels and mask (one
/// element per sequence chunk) is not charged, and the report says so.
#[test]
fn with_context_parallelism_each_module_runs_on_the_ranks_tokens() {
    let (h, c) = (H, 2);
    let one = scenario(1, Some("layers = 1"), "", "");
    let cp = scenario(2, Some("layers = 1"), "context = 2", "");
    let (d1, d2) = (model::build(&one.model, &one.workload), model::build(&cp.model, &cp.workload));
    let bytes =
        |d: &model::LayerDag, n: &str| d.tensors.iter().find(|x| x.name == n).unwrap_or_else(|| panic!("{n}")).bytes;
    assert_eq!(bytes(&d1, "mtp.0.embedding.out"), SEQ * h * c);
    assert_eq!(bytes(&d2, "mtp.0.embedding.out"), SEQ / 2 * h * c);
    assert_eq!(bytes(&d2, "mtp.0.concat.out"), SEQ / 2 * 2 * h * c);
    assert_eq!(bytes(&d2, "mtp.0.loss.softmax"), bytes(&d1, "mtp.0.loss.softmax") / 2);
    // The module's layer attends as the decoder's layers do under context parallelism.
    let core = |d: &model::LayerDag, n: &str| d.ops.iter().find(|o| o.name == n).map(|o| o.fwd_flops).unwrap();
    assert_eq!(core(&d2, "mtp.0.layer.attention.core"), core(&d2, &format!("layers.{}.attention.core", LAYERS - 1)));
    let r = stepsim::simulate(&cp).unwrap().report;
    assert!(matches!(r.verdict, stepsim::report::Verdict::Fits { .. }));
    assert!(r.assumptions.iter().any(|a| a.contains("roll_tensor") && a.contains("context parallelism (2 ranks)")));
}

/// Megatron's full recompute wraps each module under `--recompute-method uniform`
/// (`_checkpointed_forward`) and skips it under `block` (a warning, "not supported for MTP
/// yet"); the module's embedding is computed outside the checkpoint and kept.
#[test]
fn uniform_full_recompute_checkpoints_the_module_and_block_recompute_does_not() {
    use stepsim::schedule::checkpoint;
    let full = "activation_checkpointing = \"full\"\n";
    let uniform =
        scenario(1, Some("layers = 1"), "", &format!("{full}recompute_method = \"uniform\"\nrecompute_num_layers = 1"));
    let block =
        scenario(1, Some("layers = 1"), "", &format!("{full}recompute_method = \"block\"\nrecompute_num_layers = 4"));
    for (s, module_checkpointed) in [(uniform, true), (block, false)] {
        let sim = stepsim::simulate(&s).unwrap();
        let ck = checkpoint::plan(&sim.dag, sim.plan());
        assert_eq!(ck.checkpointed.len() as u64, LAYERS + 1);
        assert!(ck.checkpointed[..LAYERS as usize].iter().all(|&x| x));
        assert_eq!(ck.checkpointed[LAYERS as usize], module_checkpointed);
        let emb = sim.dag.tensors.iter().position(|x| x.name == "mtp.0.embedding.out").unwrap();
        assert!(ck.tensors[emb].kept, "the module's embedding is its checkpoint's input");
        let eh = sim.dag.tensors.iter().position(|x| x.name == "mtp.0.concat.out").unwrap();
        assert_eq!(ck.tensors[eh].kept, !module_checkpointed);
    }
}

/// With a pipeline the modules sit on the last stage, which keeps a copy of the word
/// embedding for their lookups (its gradient all-reduced with the first stage's, as
/// `_allreduce_word_embedding_grads` does when `mtp_num_layers` is set); the first stage is
/// unchanged.
#[test]
fn the_last_pipeline_stage_holds_the_modules_and_an_embedding_copy() {
    let s = scenario(2, Some("layers = 1"), "pipeline = 2", "");
    let with = stepsim::simulate(&s).unwrap();
    let without = stepsim::simulate(&scenario(2, None, "pipeline = 2", "")).unwrap();
    let plan = |sim: &stepsim::Simulation, k: u64| {
        sim.classes().map(|c| c.class.plan.clone()).find(|p| p.stage == k).expect("a class per stage")
    };
    let block = 4 * H * H + 2 * H + 3 * H * F;
    let module = 3 * H + 2 * H * H + block;
    assert_eq!(plan(&with, 0).total_params(), plan(&without, 0).total_params());
    assert_eq!(plan(&with, 1).total_params(), plan(&without, 1).total_params() + module + V * H);
    assert!(plan(&with, 1).units.iter().any(|u| u.name == "mtp.0"));
    let all_reduces = |sim: &stepsim::Simulation| {
        sim.classes()
            .flat_map(|c| c.schedule.labels.iter().filter(|l| l.what.contains("all-reduce tied embedding")).cloned())
            .count()
    };
    assert_eq!(all_reduces(&without), 0, "untied embeddings, no MTP: nothing to tie");
    assert_eq!(all_reduces(&with), 2 * 2, "both stages, both steps");
    let text = stepsim::report::text::render(&with.report, &s);
    assert!(text.contains("layers 2-3 + 1 MTP module + LM head and loss"), "{text}");
    assert!(text.contains("multi-token prediction: 1 module after the last block"), "{text}");
    assert!(text.contains("multi-token prediction (Megatron-Core MultiTokenPredictionBlock"), "{text}");
    // NCCL's embedding group exists for the copy (untied embeddings: only because of MTP).
    assert!(text.contains("embedding group (first and last stage)"), "{text}");
    let plain = stepsim::report::text::render(&without.report, &scenario(2, None, "pipeline = 2", ""));
    assert!(!plain.contains("embedding group"), "{plain}");
}

/// What is not modelled is refused naming the field.
#[test]
fn malformed_and_unmodelled_mtp_is_refused_naming_the_field() {
    let base = |mtp: &str, parallel: &str, training: &str, model: &str| {
        format!(
            "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nvocab = 1000\n{model}\n[model.mtp]\n{mtp}\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 2\n[parallel]\n{parallel}\n[training]\nmicro_batch = 1\nseq_len = 256\n{training}\n"
        )
    };
    let mg = "framework = \"megatron\"";
    let cases = [
        (base("layers = 1", "framework = \"fsdp\"", "", ""), "model.mtp", "megatron"),
        (base("layers = 1", "", "", ""), "model.mtp", "torchtitan"),
        (base("", mg, "", ""), "model.mtp.layers", "is required"),
        (base("layers = 0", mg, "", ""), "model.mtp.layers", ""),
        (base("layers = 1\nloss_scale = -0.1", mg, "", ""), "model.mtp.loss_scale", "positive"),
        (base("layers = 1\nloss_scale = nan", mg, "", ""), "model.mtp.loss_scale", "positive"),
        (base("layers = 1\ndepth = 2", mg, "", ""), "model.mtp.depth", "unknown field"),
        (base("layers = 1", mg, "loss = \"fused-linear\"", ""), "training.loss", "fused-linear"),
        (base("layers = 1", mg, "activation_offload = \"overlapped\"", ""), "training.activation_offload", ""),
        (base("layers = 1", mg, "", "").replace("family = \"llama\"", "family = \"gpt\""), "model.mtp", "llama family"),
    ];
    for (toml, field, words) in cases {
        let e = error(&toml);
        assert!(e.contains(&format!("`{field}`")) && e.contains(words), "{field}: {e}");
    }
    // Inference and LoRA jobs do not train the modules.
    let inference = "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nvocab = 1000\n[model.mtp]\nlayers = 1\n\
                     [hardware]\ngpu = \"h100-sxm\"\ngpus = 1\n[job]\nkind = \"inference\"\n[inference]\nbatch = 1\nprompt_len = 16\ngen_len = 16\n";
    let e = error(inference);
    assert!(e.contains("`model.mtp`") && e.contains("training"), "{e}");
}

/// `--mtp-num-layers` and `--mtp-loss-scaling-factor` map to [model.mtp]; the scenario
/// validates with the modules counted.
#[test]
fn megatron_mtp_flags_import() {
    let base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --ffn-hidden-size 2816 --seq-length 2048 \
        --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear \
        --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size 8 --bf16";
    let args = MegatronArgs { gpu: "h100-sxm".into(), gpus: Some(8), gpus_per_node: None, vocab: Some(V) };
    let load = |extra: &str| {
        let im = megatron::import("cmd", &format!("{base} {extra}"), &args).unwrap_or_else(|e| panic!("{e}"));
        let s = Scenario::from_toml(Path::new("imported.toml"), &im.render("megatron"))
            .unwrap_or_else(|e| panic!("{e}\n{}", im.toml));
        (im, s)
    };
    let (im, s) = load("--mtp-num-layers 1 --mtp-loss-scaling-factor 0.3");
    assert!(im.toml.contains("[model.mtp]\nlayers = 1\nloss_scale = 0.3\n"), "{}", im.toml);
    let m = s.model.mtp.as_ref().unwrap();
    assert_eq!((m.layers, m.loss_scale), (1, 0.3));
    assert!(im.mapped.iter().any(|x| x == "multi-token prediction: 1 module(s), loss scale 0.3"), "{:?}", im.mapped);
    assert!(im.not_expressed.iter().all(|n| !n.contains("mtp")), "{:?}", im.not_expressed);
    let (_, plain) = load("");
    assert_eq!(s.model.param_count() - plain.model.param_count(), s.model.mtp_module_params());
    let (im, s) = load("--mtp-num-layers 2");
    assert_eq!(s.model.mtp.as_ref().map(|m| (m.layers, m.loss_scale)), Some((2, 0.1)));
    assert!(!im.toml.contains("loss_scale"), "{}", im.toml);
    for bad in ["--mtp-num-layers 0", "--mtp-num-layers 1 --mtp-loss-scaling-factor -1"] {
        let e = megatron::import("cmd", &format!("{base} {bad}"), &args).unwrap_err();
        assert!(e.key.starts_with("mtp_"), "{bad}: {e}");
    }
}
