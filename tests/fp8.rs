//! FP8 training, rule by rule, against figures derived by hand: which linears run in FP8,
//! what each recipe keeps for backward, the cast traffic it adds, and Transformer Engine's
//! persistent workspaces in the simulated memory. A small llama (hidden 1024, ffn 3584,
//! 4 blocks, sequence 2048) keeps each case well under a second.

use std::path::Path;

use stepsim::model::{self, OpKind, Region};
use stepsim::scenario::Scenario;

const H: u64 = 1024;
const F: u64 = 3584;
const SEQ: u64 = 2048;
const LAYERS: u64 = 4;

fn scenario(framework: &str, fp8: &str, extra: &str) -> Scenario {
    scenario_on("h100-sxm", framework, fp8, extra).unwrap_or_else(|e| panic!("{e}"))
}

fn scenario_on(gpu: &str, framework: &str, fp8: &str, extra: &str) -> Result<Scenario, String> {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {F}\nvocab = 32000\nmax_seq_len = {SEQ}\n{extra}\
         [hardware]\ngpu = \"{gpu}\"\ngpus = 1\n\
         [parallel]\nframework = \"{framework}\"\n\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\ngrad_accum = 4\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\nactivation_checkpointing = \"none\"\n\
         [allocator]\nkind = \"exact\"\n{fp8}"
    );
    Scenario::from_toml(Path::new("<fp8>"), &toml).map_err(|e| format!("{e}\n{toml}"))
}

const DELAYED: &str = "[fp8]\nrecipe = \"delayed\"\namax_history_len = 1024\n";

/// The block linears run in FP8, the LM head and embeddings do not; under delayed scaling
/// every FP8 linear's three GEMMs are FP8 unless wgrad is off.
#[test]
fn the_block_linears_run_in_fp8_and_the_head_does_not() {
    let s = scenario("megatron", DELAYED, "");
    let dag = model::build(&s.model, &s.workload);
    let fp8: Vec<&str> = dag.ops.iter().filter(|o| o.fp8.is_some()).map(|o| o.name.as_str()).collect();
    // q, k, v, o, w1, w3, w2 per block.
    assert_eq!(fp8.len() as u64, 7 * LAYERS, "{fp8:?}");
    assert!(dag
        .ops
        .iter()
        .filter(|o| matches!(o.region, Region::Block(_)) && o.kind == OpKind::Linear)
        .all(|o| o.fp8.is_some()));
    let head = dag.ops.iter().find(|o| o.name == "output").unwrap();
    assert!(head.fp8.is_none());
    assert!(dag.ops.iter().filter(|o| o.fp8.is_some()).all(|o| o.fp8.unwrap().wgrad));
    let off = scenario("megatron", "[fp8]\nrecipe = \"delayed\"\nwgrad = false\n", "");
    let dag = model::build(&off.model, &off.workload);
    assert!(dag.ops.iter().filter_map(|o| o.fp8).all(|g| !g.wgrad));
}

/// Transformer Engine keeps FP8 copies of the linears' inputs: per block and token, the
/// attention norm's output (h, shared by q, k, v: 2 B -> 1 B), the MLP norm's output (h) and
/// the SwiGLU output w2 reads (ffn) drop a byte per element; the attention output is saved
/// twice, in 16 bits by flash attention and in FP8 by the output projection (+h). Net:
/// -(h + ffn) bytes per token. torchao keeps the 16-bit input: no change.
#[test]
fn delayed_scaling_saves_fp8_copies_of_linear_inputs_and_torchao_does_not() {
    let t = SEQ;
    let saved = |s: &Scenario| model::build(&s.model, &s.workload).saved_bytes(Region::Block(0), true);
    let bf16 = saved(&scenario("megatron", "", ""));
    let fp8 = saved(&scenario("megatron", DELAYED, ""));
    assert_eq!(bf16 - fp8, t * (H + F), "bf16 {bf16} fp8 {fp8}");
    let plain = saved(&scenario("fsdp", "", ""));
    let tw = saved(&scenario("fsdp", "[fp8]\nrecipe = \"tensorwise\"\n", ""));
    assert_eq!(plain, tw);
}

/// Cast traffic per linear: torchao tensorwise casts the input (amax 2 B + cast 2 B read,
/// 2 x 1 B written = 6 B per element) forward and again backward, the output gradient twice
/// (12 B per element) and the weight forward and backward (8 + 8 B per parameter, half on
/// each side); rowwise 8 B, 16 B and 20 B. Delayed scaling: a plain Linear (the attention
/// output projection) cast-transposes its input (4 B) forward; a norm-fed LayerNormLinear
/// only transposes its FP8 copy backward (2 B); every output gradient 4 B; the weight
/// workspace refresh 4 B per parameter once per step (grad_accum 4).
#[test]
fn casts_add_the_documented_traffic() {
    let t = SEQ as f64;
    let (h, w) = (H as f64, (H * H) as f64);
    let op = |s: &Scenario, name: &str| {
        let dag = model::build(&s.model, &s.workload);
        dag.ops.iter().find(|o| o.name == name).unwrap().chain_bytes
    };
    let tw = scenario("fsdp", "[fp8]\nrecipe = \"tensorwise\"\n", "");
    let c = op(&tw, "layers.0.attention.wq");
    assert_eq!(c, [6.0 * t * h + 8.0 * w, 6.0 * t * h + 12.0 * t * h + 8.0 * w]);
    let rw = scenario("fsdp", "[fp8]\nrecipe = \"rowwise\"\n", "");
    let c = op(&rw, "layers.0.attention.wq");
    assert_eq!(c, [8.0 * t * h + 10.0 * w, 8.0 * t * h + 16.0 * t * h + 10.0 * w]);
    let d = scenario("megatron", DELAYED, "");
    let refresh = 4.0 * w / 4.0 / 2.0;
    assert_eq!(op(&d, "layers.0.attention.wq"), [refresh, 2.0 * t * h + 4.0 * t * h + refresh]);
    assert_eq!(op(&d, "layers.0.attention.wo"), [4.0 * t * h + refresh, 4.0 * t * h + refresh]);
    // Without FP8 none of this exists.
    assert_eq!(op(&scenario("megatron", "", ""), "layers.0.attention.wo"), [0.0, 0.0]);
}

/// Delayed scaling's persistent state: 2 B per FP8 parameter (the FP8 weight and its FP8
/// transpose) plus per FP8 linear three FP32 amax histories of 1024 rows with a scale and
/// an inverse scale each. Initialisation grows by exactly that (exact allocator, which
/// still rounds each request to 512 B).
#[test]
fn transformer_engine_workspaces_are_resident_from_initialisation() {
    let block_linear_params = LAYERS * (4 * H * H + 3 * H * F);
    let linears = 7 * LAYERS;
    // The allocator rounds every request up to 512 B.
    let expected = 2 * block_linear_params + (linears * 3 * (1024 + 2) * 4).div_ceil(512) * 512;
    let init = |s: &Scenario| {
        let r = stepsim::simulate(s).unwrap().report;
        let fp8 = r.fp8.as_ref().map(|f| f.weight_workspaces.bytes);
        (r.phase_peaks.iter().find(|p| p.step == 0).unwrap().allocated.bytes, fp8)
    };
    let (bf16, none) = init(&scenario("megatron", "", ""));
    let (fp8, ws) = init(&scenario("megatron", DELAYED, ""));
    assert_eq!(none, None);
    assert_eq!(ws, Some(2 * block_linear_params));
    assert_eq!(fp8 - bf16, expected);
    // Under a pipeline of 2 a GPU holds its stage's half of the blocks' workspaces.
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {F}\nvocab = 32000\nmax_seq_len = {SEQ}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 2\n[parallel]\nframework = \"megatron\"\npipeline = 2\n\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\ngrad_accum = 4\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n{DELAYED}"
    );
    let s = Scenario::from_toml(Path::new("<fp8 pp2>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    let r = stepsim::simulate(&s).unwrap().report;
    assert_eq!(r.fp8.map(|f| f.weight_workspaces.bytes), Some(block_linear_params));
}

/// FP8 halves the block GEMMs' compute time on H100 (1,979 vs 989 TFLOP/s): the step is
/// faster, though a model this small gains only ~8% (its casts, memory-bound ops and the
/// 16-bit LM head over 32,000 words weigh as much as the block GEMMs), and the report
/// states the FP8 peak and that MFU stays against the BF16 peak.
#[test]
fn fp8_steps_are_faster_and_say_what_they_assume() {
    let step = |s: &Scenario| {
        let r = stepsim::simulate(s).unwrap().report;
        (r.throughput.as_ref().unwrap().step_time_s, r)
    };
    let (bf16, _) = step(&scenario("megatron", "", ""));
    let (fp8, r) = step(&scenario("megatron", DELAYED, ""));
    assert!(fp8 < bf16 * 0.95, "fp8 {fp8} bf16 {bf16}");
    assert!(fp8 > bf16 * 0.5, "no more than the GEMMs' 2x: fp8 {fp8} bf16 {bf16}");
    let t = r.throughput.as_ref().unwrap();
    assert!(t
        .assumptions
        .iter()
        .any(|a| a.contains("1979 TFLOP/s dense FP8 peak") && a.contains("MFU and HFU against the bf16 peak")));
    assert!(r.assumptions.iter().any(|a| a.starts_with("FP8 delayed scaling (Transformer Engine")));
    let f = r.fp8.as_ref().unwrap();
    assert_eq!((f.fp8_linears, f.linears), (7 * LAYERS, 7 * LAYERS + 1));
}

/// torchtitan's float8 tensor parallelism (tensorwise, TP 2 with sequence parallelism, 8
/// GPUs, FULL_SHARD over the 4 data-parallel ranks, `fsdp_all_gather`). The attention
/// norm's output is cast once, on this rank's shard of the sequence (6 B x t h / 2,
/// charged to wq; wk and wv cast nothing in forward), and all-gathered in FP8 (t h x 1 B
/// forward; the backward reduce-scatter of its gradient stays t h x 2 B), into an FP8
/// buffer. The row-parallel wo reads its local input and casts it itself. Each weight is
/// cast on the shard before its two all-gathers (8 B x w / 4 each) and copied transposed
/// for backward (2 B x w); the block's FSDP unit gathers its seven linears at 1 B/param.
#[test]
fn float8_tensor_parallel_and_fp8_all_gather_move_fp8() {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = {LAYERS}\nhidden = {H}\nn_heads = 8\nffn_hidden = {F}\nvocab = 32000\nmax_seq_len = {SEQ}\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 8\n\
         [parallel]\nframework = \"fsdp\"\nsharding = \"full_shard\"\ntensor = 2\nsequence_parallel = true\n\
         [training]\nmicro_batch = 1\nseq_len = {SEQ}\ngrad_accum = 1\nprecision = \"bf16-mixed-adam\"\nattention = \"flash\"\n\
         [fp8]\nrecipe = \"tensorwise\"\nfsdp_all_gather = true\n"
    );
    let s = Scenario::from_toml(Path::new("<fp8 tp>"), &toml).unwrap();
    let dag = model::build(&s.model, &s.workload);
    let (t, h) = (SEQ as f64, H as f64);
    let w = h * h / 2.0;
    let op = |name: &str| dag.ops.iter().find(|o| o.name == name).unwrap_or_else(|| panic!("no op {name}"));
    let shard_cast = 8.0 * w / 4.0;
    assert_eq!(
        op("layers.0.attention.wq").chain_bytes,
        [6.0 * t * h / 2.0 + shard_cast, 6.0 * t * h + 12.0 * t * h / 2.0 + shard_cast + 2.0 * w]
    );
    assert_eq!(op("layers.0.attention.wk").chain_bytes[0], shard_cast);
    assert_eq!(op("layers.0.attention.wo").chain_bytes[0], 6.0 * t * h / 2.0 + shard_cast);
    // The all-gather feeding q, k, v: FP8 forward, 16-bit backward, an FP8 output buffer.
    let wq = op("layers.0.attention.wq");
    let gather = dag.tensors[wq.inputs[0]].producer.map(|p| &dag.ops[p]).unwrap();
    let comm = gather.comm.unwrap();
    assert_eq!((comm.forward_bytes, comm.bytes), (Some(SEQ * H), 2 * SEQ * H), "{}", gather.name);
    assert_eq!(dag.tensors[wq.inputs[0]].bytes, SEQ * H);
    // The block unit all-gathers its seven linears (2 h^2 + 1.5 h F local parameters) in FP8,
    // its two norms in 16 bits.
    let plan = stepsim::plan::Plan::new(&dag, s.parallel.clone(), s.training.clone(), 8, 8);
    assert_eq!(plan.units[1].fp8_gathered, 2 * H * H + 3 * H * F / 2);
    assert_eq!(plan.units[1].params - plan.units[1].fp8_gathered, 2 * H);
    assert_eq!(plan.units[0].fp8_gathered, 0);
    // Rowwise has neither: 16-bit all-gathers, the input cast per linear.
    let rw = Scenario::from_toml(
        Path::new("<fp8 tp>"),
        &toml.replace("recipe = \"tensorwise\"\nfsdp_all_gather = true", "recipe = \"rowwise\""),
    )
    .unwrap();
    let dag = model::build(&rw.model, &rw.workload);
    let wk = dag.ops.iter().find(|o| o.name == "layers.0.attention.wk").unwrap();
    assert_eq!(wk.chain_bytes[0], 8.0 * t * h + 10.0 * w);
    assert!(dag.ops.iter().filter_map(|o| o.comm).all(|c| c.forward_bytes.is_none()));
}

/// Transformer Engine 2.x's block scaling (`--fp8-recipe blockwise`, `mxfp8`): the saved input
/// is the columnwise FP8 copy with its scales, 1 + 1/32 B per element (an FP32 per 128, an
/// E8M0 per 32), so per block and token the saving of delayed scaling less the scales of the
/// four FP8 copies (3h + ffn elements); the input is quantized both ways forward (4 B read and
/// written plus 2/32 B of scales), nothing is transposed backward, the output gradient costs
/// as much; the weight copies, rowwise and columnwise, persist with their scales (MXFP8: 2 +
/// 2/32 B per parameter) and no amax history is kept.
#[test]
fn block_scaling_saves_columnwise_fp8_with_scales_and_keeps_no_history() {
    let t = SEQ;
    let saved = |s: &Scenario| model::build(&s.model, &s.workload).saved_bytes(Region::Block(0), true);
    let bf16 = saved(&scenario("megatron", "", ""));
    let mx = scenario_on("b200", "megatron", "[fp8]\nrecipe = \"mxfp8\"\n", "").unwrap();
    let bw = scenario("megatron", "[fp8]\nrecipe = \"blockwise\"\n", "");
    for s in [&mx, &bw] {
        assert_eq!(bf16 - saved(s), t * (H + F) - t * (3 * H + F) / 32);
    }
    let op = |s: &Scenario, name: &str| {
        let dag = model::build(&s.model, &s.workload);
        dag.ops.iter().find(|o| o.name == name).unwrap().chain_bytes
    };
    let (tf, h, w) = (t as f64, H as f64, (H * H) as f64);
    let refresh = 4.0 * w / 4.0 / 2.0;
    let q = 4.0 + 2.0 / 32.0;
    assert_eq!(op(&bw, "layers.0.attention.wq"), [q * tf * h + refresh, q * tf * h + refresh]);
    // Persistent state: 4 blocks of 4h^2 + 3h ffn FP8 parameters, each unit's workspace a
    // multiple of 512 B already; no amax histories.
    let p = 4 * H * H + 3 * H * F;
    let init = |s: &Scenario| {
        let r = stepsim::simulate(s).unwrap().report;
        (r.phase_peaks.iter().find(|x| x.step == 0).unwrap().allocated.bytes, r.fp8.map(|f| f.weight_workspaces.bytes))
    };
    let (plain, _) = init(&scenario_on("b200", "megatron", "", "").unwrap());
    let (with, ws) = init(&mx);
    assert_eq!(ws, Some(LAYERS * (2 * p + 2 * p / 32)));
    assert_eq!(with - plain, LAYERS * (2 * p + 2 * p / 32));
}

/// Where Transformer Engine runs the block recipes (quantization.py: block scaling on
/// compute capability 9.0+, MXFP8 on 10.x) and only under Megatron; no amax history for them.
#[test]
fn block_recipes_are_refused_where_transformer_engine_does_not_run_them() {
    for (gpu, framework, fp8, field, says) in [
        ("h100-sxm", "megatron", "recipe = \"mxfp8\"", "fp8.recipe", "compute capability 10.x"),
        ("l40s", "megatron", "recipe = \"blockwise\"", "fp8.recipe", "compute capability 9.0"),
        ("h100-sxm", "fsdp", "recipe = \"blockwise\"", "fp8.recipe", "Transformer Engine recipe"),
        ("h100-sxm", "megatron", "recipe = \"blockwise\"\namax_history_len = 16", "fp8.amax_history_len", "delayed"),
    ] {
        let e = scenario_on(gpu, framework, &format!("[fp8]\n{fp8}\n"), "").err().unwrap();
        assert!(e.contains(field) && e.contains(says), "{gpu} {fp8}: {e}");
    }
    // wgrad applies to every Transformer Engine recipe.
    scenario("megatron", "[fp8]\nrecipe = \"blockwise\"\nwgrad = false\n", "");
}
