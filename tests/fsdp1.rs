//! FSDP1's own buffers, rule by rule (src/schedule/sharding.rs and
//! `Framework::fsdp1_buffers` cite `torch/distributed/fsdp/` of PyTorch 2.15): the
//! low-precision `_mp_shard` each all-gather sends, per-parameter gradients in `param_dtype`
//! concatenated into one flat gradient before the post-backward hook reshards the unit, and
//! that flat gradient cast to `reduce_dtype` on the post-backward stream, both live until the
//! reduce-scatter ends. The whole-step figures are checked against MemTracker in
//! tests/fidelity_pytorch.rs (the `fsdp1/f*` cases); these tests pin each rule on its own.

use std::path::Path;

use stepsim::memory::Category;
use stepsim::scenario::Scenario;

/// A 6-layer Llama (hidden 1024, FFN 4096) on 4 GPUs, FP32 sharded parameters with BF16
/// compute and FP32 reduction.
fn job(framework: &str, precision: &str) -> stepsim::Simulation {
    job_with(framework, precision, "full_shard")
}

fn job_with(framework: &str, precision: &str, sharding: &str) -> stepsim::Simulation {
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 6\nhidden = 1024\nn_heads = 8\nffn_hidden = 4096\nvocab = 2048\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 4\n\
         [parallel]\nframework = \"{framework}\"\nsharding = \"{sharding}\"\n\
         [training]\nmicro_batch = 1\nseq_len = 256\noptimizer = \"adam\"\nprecision = \"{precision}\"\nsteps = 2\n"
    );
    let s = Scenario::from_toml(Path::new("<fsdp1>"), &toml).unwrap_or_else(|e| panic!("{e}"));
    stepsim::simulate(&s).unwrap()
}

/// Parameters of one block: attention 4 x 1024^2, SwiGLU 3 x 1024 x 4096, two norms.
const BLOCK_PARAMS: u64 = 4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024;

/// Bytes of every buffer of `cat` whose name contains `what`.
fn buffers(sim: &stepsim::Simulation, cat: Category, what: &str) -> Vec<u64> {
    let prog = &sim.schedule().program;
    prog.buffers
        .iter()
        .filter(|b| b.category == cat && prog.names[b.name as usize].contains(what))
        .map(|b| b.bytes)
        .collect()
}

/// (start, end) of every task of step `step` whose text starts with `what`.
fn tasks(sim: &stepsim::Simulation, step: u32, what: &str) -> Vec<(u64, u64)> {
    let sched = sim.schedule();
    let tr = sim.trace();
    (0..sched.program.tasks.len())
        .filter(|&i| {
            let l = &sched.labels[sched.program.tasks[i].label as usize];
            l.step == step && l.what.starts_with(what)
        })
        .map(|i| (tr.start_ns[i], tr.end_ns[i]))
        .collect()
}

#[test]
fn each_all_gather_sends_a_low_precision_shard() {
    let sim = job("fsdp1", "fsdp-bf16-mixed");
    // One BF16 quarter of a block per all-gather: forward and backward, both steps.
    let shards = buffers(&sim, Category::GatheredParameters, "_mp_shard");
    assert!(shards.contains(&(BLOCK_PARAMS / 4 * 2)), "{shards:?}");
    // Pure BF16 parameters are all-gathered as they are.
    let sim = job("fsdp1", "bf16");
    assert!(buffers(&sim, Category::GatheredParameters, "this rank's shard").is_empty());
}

#[test]
fn a_unit_has_one_flat_gradient_in_param_dtype_and_one_cast_copy_in_reduce_dtype() {
    let sim = job("fsdp1", "fsdp-bf16-mixed");
    let flat = buffers(&sim, Category::UnshardedGradients, "flat gradient (bf16");
    assert!(flat.contains(&(BLOCK_PARAMS * 2)), "{flat:?}");
    let cast = buffers(&sim, Category::ReduceScatterBuffers, "cast to fp32");
    assert!(cast.contains(&(BLOCK_PARAMS * 4)), "{cast:?}");
    // The per-parameter gradients autograd computes are BF16 (the FFN's are the largest).
    let grads = buffers(&sim, Category::UnshardedGradients, "weight grad");
    assert_eq!(grads.iter().max(), Some(&(1024 * 4096 * 2)));
    // Without mixed precision there is nothing to cast: FP32 flat gradients are reduced.
    let sim = job("fsdp1", "fp32");
    assert!(buffers(&sim, Category::ReduceScatterBuffers, "").is_empty());
    assert!(buffers(&sim, Category::UnshardedGradients, "flat gradient (fp32").contains(&(BLOCK_PARAMS * 4)));
    // The generic "fsdp" keeps its per-parameter FP32 gradients and no flat copies.
    let sim = job("fsdp", "fsdp-bf16-mixed");
    assert!(buffers(&sim, Category::UnshardedGradients, "flat gradient").is_empty());
}

#[test]
fn a_units_gradients_are_concatenated_then_cast_then_reduce_scattered() {
    let sim = job("fsdp1", "fsdp-bf16-mixed");
    let cat = tasks(&sim, 2, "concatenate layers.3 gradients");
    let cast = tasks(&sim, 2, "cast layers.3 flat gradient to fp32");
    let rs = tasks(&sim, 2, "reduce-scatter layers.3");
    assert_eq!((cat.len(), cast.len(), rs.len()), (1, 1, 1), "{cat:?} {cast:?} {rs:?}");
    assert!(cat[0].1 <= cast[0].0 && cast[0].1 <= rs[0].0, "{cat:?} {cast:?} {rs:?}");
}

#[test]
fn fsdp1_holds_more_than_the_generic_model_at_the_backward_peak() {
    // The flat gradient and its FP32 copy (6 B per parameter of a unit, briefly with the
    // BF16 per-parameter gradients) against the generic model's FP32 per-parameter
    // gradients (4 B).
    let (s1, s0) = (job("fsdp1", "fsdp-bf16-mixed"), job("fsdp", "fsdp-bf16-mixed"));
    let (p1, ph1) = s1.step_peak(2).unwrap();
    let (p0, _) = s0.step_peak(2).unwrap();
    assert_eq!(ph1.name(), "backward");
    assert!(p1.allocated > p0.allocated, "{} vs {}", p1.allocated, p0.allocated);
}

#[test]
fn no_shard_casts_each_unit_and_keeps_its_flat_gradient_all_reduced_in_place() {
    let sim = job_with("fsdp1", "fsdp-bf16-mixed", "none");
    // Each unit's BF16 copy of the whole unit stands where gathered parameters would be
    // (`_mp_shard` is the unsharded parameter under NO_SHARD), the root's included.
    let copies = buffers(&sim, Category::GatheredParameters, "layers.2 cast for");
    assert!(copies.iter().all(|&b| b == BLOCK_PARAMS * 2) && !copies.is_empty(), "{copies:?}");
    assert!(!buffers(&sim, Category::GatheredParameters, "root").is_empty());
    assert!(buffers(&sim, Category::GatheredParameters, "this rank's shard").is_empty());
    // The flat BF16 gradient, and the FP32 gradient the all-reduce keeps (no cast copy
    // beside it, no DDP buckets).
    assert!(buffers(&sim, Category::UnshardedGradients, "flat gradient (bf16").contains(&(BLOCK_PARAMS * 2)));
    assert!(buffers(&sim, Category::Gradients, "flat grad (fp32, all-reduced in place)").contains(&(BLOCK_PARAMS * 4)));
    assert!(buffers(&sim, Category::ReduceScatterBuffers, "").is_empty());
    assert!(buffers(&sim, Category::CommBuffers, "DDP").is_empty());
    assert_eq!(tasks(&sim, 2, "all-reduce layers.3 flat gradient").len(), 1);
    assert!(tasks(&sim, 2, "reduce-scatter").is_empty());
    // Without mixed precision the units run on their FP32 parameters: nothing is cast.
    let sim = job_with("fsdp1", "fp32", "none");
    assert!(buffers(&sim, Category::GatheredParameters, "").is_empty());
}

#[test]
fn optimizer_only_sharding_is_refused_with_the_alternatives_named() {
    let toml =
        "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nffn_hidden = 1024\nvocab = 1000\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 4\n[parallel]\nframework = \"fsdp1\"\nsharding = \"zero1\"\n\
                [training]\nmicro_batch = 1\nseq_len = 128\n";
    let e = Scenario::from_toml(Path::new("<fsdp1>"), toml).unwrap_err().to_string();
    assert!(e.contains("parallel.sharding") && e.contains("NO_SHARD") && e.contains("\"fsdp\""), "{e}");
}

#[test]
fn no_sync_accumulates_the_flat_gradients_in_param_dtype() {
    let with = |framework: &str| {
        let toml = format!(
            "[model]\nfamily = \"llama\"\nn_layers = 6\nhidden = 1024\nn_heads = 8\nffn_hidden = 4096\nvocab = 2048\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 4\n\
             [parallel]\nframework = \"{framework}\"\nsharding = \"full_shard\"\nno_sync = true\n\
             [training]\nmicro_batch = 1\nseq_len = 256\ngrad_accum = 2\noptimizer = \"adam\"\nprecision = \"fsdp-bf16-mixed\"\nsteps = 2\n"
        );
        let s = Scenario::from_toml(Path::new("<fsdp1>"), &toml).unwrap_or_else(|e| panic!("{e}"));
        stepsim::simulate(&s).unwrap()
    };
    // FSDP1's post-backward returns before its cast under no_sync(): what accumulates over
    // the micro-batches is autograd's BF16 gradient (the generic model keeps FP32).
    let sim = with("fsdp1");
    let grads = buffers(&sim, Category::UnshardedGradients, "weight grad (unsharded");
    assert_eq!(grads.iter().max(), Some(&(1024 * 4096 * 2)));
    // The last micro-batch concatenates its own gradients, casts and reduce-scatters once.
    assert_eq!(tasks(&sim, 2, "reduce-scatter layers.3").len(), 1);
    assert_eq!(tasks(&sim, 2, "concatenate layers.3 gradients").len(), 1);
    let generic = with("fsdp");
    let (p1, _) = sim.step_peak(2).unwrap();
    let (p0, _) = generic.step_peak(2).unwrap();
    assert!(p1.allocated < p0.allocated, "{} vs {}", p1.allocated, p0.allocated);
}

#[test]
fn with_cpu_offload_the_flat_gradient_is_still_cast_before_its_reduce_scatter() {
    let toml = "[model]\nfamily = \"llama\"\nn_layers = 6\nhidden = 1024\nn_heads = 8\nffn_hidden = 4096\nvocab = 2048\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 4\n\
                [parallel]\nframework = \"fsdp1\"\nsharding = \"full_shard\"\n\
                [offload]\nparameters = \"cpu\"\n\
                [training]\nmicro_batch = 1\nseq_len = 256\noptimizer = \"adam\"\nprecision = \"fsdp-bf16-mixed\"\nsteps = 2\n";
    let s = Scenario::from_toml(Path::new("<fsdp1>"), toml).unwrap_or_else(|e| panic!("{e}"));
    let sim = stepsim::simulate(&s).unwrap();
    assert!(buffers(&sim, Category::ReduceScatterBuffers, "cast to fp32").contains(&(BLOCK_PARAMS * 4)));
    let cast = tasks(&sim, 2, "cast layers.3 flat gradient to fp32");
    let rs = tasks(&sim, 2, "reduce-scatter layers.3");
    assert!(cast.len() == 1 && rs.len() == 1 && cast[0].1 <= rs[0].0, "{cast:?} {rs:?}");
}

/// A pipeline stage numbers only its own units: the root's pre-backward prefetch of "the last
/// block" must not index past them (it panicked with `reshard_after_forward = true` set
/// explicitly on a pipeline, found in session 14).
#[test]
fn fsdp_on_a_pipeline_with_reshard_after_forward_runs() {
    for framework in ["fsdp", "fsdp1"] {
        let toml = format!(
            "[model]\nfamily = \"llama\"\nn_layers = 8\nhidden = 1024\nn_heads = 8\nffn_hidden = 4096\nvocab = 32000\n\
             [hardware]\ngpu = \"h100-sxm\"\ngpus = 16\n\
             [parallel]\nframework = \"{framework}\"\nsharding = \"full_shard\"\nreshard_after_forward = true\npipeline = 2\n\
             [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 2\nprecision = \"fsdp-bf16-mixed\"\n"
        );
        let s = Scenario::from_toml(Path::new("<fsdp1>"), &toml).unwrap_or_else(|e| panic!("{e}"));
        let sim = stepsim::simulate(&s).unwrap();
        assert!(sim.step_peak(2).is_some(), "{framework}");
    }
    // FSDP1's NO_SHARD on a pipeline is refused, with the alternatives named.
    let toml =
        "[model]\nfamily = \"llama\"\nn_layers = 8\nhidden = 1024\nn_heads = 8\nffn_hidden = 4096\nvocab = 32000\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 16\n\
                [parallel]\nframework = \"fsdp1\"\nsharding = \"none\"\npipeline = 2\n\
                [training]\nmicro_batch = 1\nseq_len = 2048\ngrad_accum = 2\n";
    let e = Scenario::from_toml(Path::new("<fsdp1>"), toml).unwrap_err().to_string();
    assert!(e.contains("parallel.sharding") && e.contains("NO_SHARD") && e.contains("pipeline"), "{e}");
}

/// LoRA (r = 8 on q_proj and v_proj) on the 6-layer Llama under FSDP1 in pure BF16, wrapped
/// as PEFT's `fsdp_auto_wrap_policy` does (`"peft"`) or per block with `use_orig_params`.
fn lora_scenario(wrap: &str) -> Scenario {
    let orig = if wrap == "block" { "use_orig_params = true\n" } else { "" };
    let toml = format!(
        "[model]\nfamily = \"llama\"\nn_layers = 6\nhidden = 1024\nn_heads = 8\nffn_hidden = 4096\nvocab = 2048\n\
         [hardware]\ngpu = \"h100-sxm\"\ngpus = 4\n\
         [parallel]\nframework = \"fsdp1\"\nsharding = \"full_shard\"\nwrap = \"{wrap}\"\n{orig}\
         [job]\nkind = \"finetune-lora\"\n[lora]\nrank = 8\ntarget_modules = [\"q_proj\", \"v_proj\"]\n\
         [training]\nmicro_batch = 1\nseq_len = 256\noptimizer = \"adam\"\nprecision = \"bf16\"\nsteps = 2\n"
    );
    Scenario::from_toml(Path::new("<fsdp1-lora>"), &toml).unwrap_or_else(|e| panic!("{e}"))
}

fn lora_job(wrap: &str) -> stepsim::Simulation {
    stepsim::simulate(&lora_scenario(wrap)).unwrap()
}

/// With a block's frozen base and its adapters in one FlatParameter (FSDP1,
/// `use_orig_params=True`, block wrap), the FlatParameter requires grad: every block's
/// gradient is the whole block's, reduce-scattered and kept, while the optimizer holds state
/// for the adapters only (the FullyShardedDataParallel docstring: "equivalent to not
/// freezing those parameters"). Counted by hand: a block is BLOCK_PARAMS + 2 adapters of
/// 8 x (1024 + 1024); gradients and Adam's two moments in BF16, shards over 4 ranks.
#[test]
fn lora_in_one_flat_parameter_keeps_the_frozen_base_gradients() {
    let adapters = 2 * 8 * (1024 + 1024);
    let shard = (BLOCK_PARAMS + adapters) / 4;
    assert_eq!((BLOCK_PARAMS + adapters) % 4, 0, "no padding to count");
    let block = lora_job("block");
    let peft = lora_job("peft");
    let (b, p) = (&block.report.model_state_per_gpu, &peft.report.model_state_per_gpu);
    println!(
        "6-layer LoRA, FSDP1: gradients {} B (block, use_orig_params) vs {} B (PEFT wrap); optimizer state {} vs {} B",
        b.gradients.bytes, p.gradients.bytes, b.optimizer_state.bytes, p.optimizer_state.bytes
    );
    assert_eq!(b.gradients.bytes, 6 * shard * 2, "every block's whole shard, BF16");
    assert_eq!(p.gradients.bytes, 6 * adapters / 4 * 2, "the adapters' shards only");
    assert_eq!(b.optimizer_state.bytes, 6 * adapters / 4 * 2 * 2, "Adam's moments for the adapters only");
    assert_eq!(b.optimizer_state.bytes, p.optimizer_state.bytes);
    // The timeline holds them: a sharded gradient per block in the block job.
    let sharded = buffers(&block, Category::Gradients, "sharded grad");
    assert!(sharded.iter().filter(|&&x| x == shard * 2).count() >= 6, "{sharded:?}");
    // Each block's flat gradient is its whole FlatParameter in BF16.
    let flat = buffers(&block, Category::UnshardedGradients, "flat gradient");
    assert!(flat.contains(&(4 * shard * 2)), "{flat:?}");
    // The frozen linears' weight-gradient GEMMs run (hardware FLOPs) but are not the model's
    // work: MFU's FLOPs are the same under both wraps, and the difference is exactly the
    // base GEMMs' forward FLOPs, 2 x tokens x their weights, per block.
    let (bs, ps) = (block.schedule(), peft.schedule());
    assert_eq!(bs.model_flops_per_step, ps.model_flops_per_step);
    let linear_weights = (4 * 1024 * 1024 + 3 * 1024 * 4096) as f64;
    let expect = 2.0 * 256.0 * linear_weights * 6.0;
    let extra = bs.hardware_flops_per_step - ps.hardware_flops_per_step;
    assert!((extra / expect - 1.0).abs() < 1e-9, "{extra} vs {expect}");
    let time = |s: &stepsim::Simulation| s.report.throughput.as_ref().unwrap().step_time_s;
    assert!(time(&block) > time(&peft));
    // The frozen linears keep their inputs again: per block the FFN norm's output (read by
    // w1 and w3) and the SwiGLU product (read by w2), t x (h + f) x 2 bytes; and the two
    // RMSNorms, whose weights are in the FlatParameter too, keep their normalised outputs for
    // those weights' gradients, t x h x 2 bytes each.
    let saved = |wrap: &str| {
        let s = lora_scenario(wrap);
        stepsim::model::build(&s.model, &s.workload).saved_bytes(stepsim::model::Region::Block(3), true)
    };
    assert_eq!(saved("block") - saved("peft"), 256 * (1024 + 4096) * 2 + 2 * 256 * 1024 * 2);
}

/// FSDP1 refuses what the block wrap would flatten together with `use_orig_params=False`
/// (uniform `requires_grad`) or with FP32 adapters over a BF16 base (uniform dtype); the
/// errors name the field and the way out.
#[test]
fn lora_block_wrap_refusals_name_the_fix() {
    let base = "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nffn_hidden = 1024\nvocab = 512\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 2\n[job]\nkind = \"finetune-lora\"\n[lora]\nrank = 4\n";
    let cases = [
        ("[parallel]\nframework = \"fsdp1\"\nsharding = \"full_shard\"\nwrap = \"block\"\n[training]\nmicro_batch = 1\nseq_len = 128\nprecision = \"bf16\"\n", "parallel.wrap", "use_orig_params"),
        ("[parallel]\nframework = \"fsdp1\"\nsharding = \"full_shard\"\nwrap = \"block\"\nuse_orig_params = true\n[training]\nmicro_batch = 1\nseq_len = 128\n", "training.precision", "uniform dtype"),
        ("[parallel]\nframework = \"fsdp2\"\nsharding = \"full_shard\"\nuse_orig_params = true\n[training]\nmicro_batch = 1\nseq_len = 128\n", "parallel.use_orig_params", "fsdp1"),
    ];
    for (extra, field, says) in cases {
        let err = Scenario::from_toml(Path::new("<lora>"), &format!("{base}{extra}")).unwrap_err().to_string();
        assert!(err.contains(field) && err.contains(says), "{err}");
    }
    let full = "[model]\nfamily = \"llama\"\nn_layers = 2\nhidden = 256\nn_heads = 4\nffn_hidden = 1024\nvocab = 512\n\
                [hardware]\ngpu = \"h100-sxm\"\ngpus = 2\n[parallel]\nframework = \"fsdp1\"\nsharding = \"full_shard\"\nwrap = \"peft\"\n[training]\nmicro_batch = 1\nseq_len = 128\n";
    let err = Scenario::from_toml(Path::new("<full>"), full).unwrap_err().to_string();
    assert!(err.contains("parallel.wrap") && err.contains("[lora]"), "{err}");
}
