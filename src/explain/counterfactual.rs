//! Single changes to a configuration, each re-simulated: does it fit, at what peak, and at
//! what cost in speed against the original (timed with unbounded memory, since the original
//! may not fit). The cheapest change that fits is the one with the fewest GPU-seconds per
//! token.

use rayon::prelude::*;
use serde::Serialize;

use crate::plan::{BackwardPrefetch, CheckpointBlocks, Checkpointing, Sharding};
use crate::report::{fmt_bytes, Bytes, Verdict};
use crate::scenario::limits::MAX_TASKS;
use crate::scenario::Scenario;
use crate::schedule::Phase;
use crate::Simulation;

/// The standard set, in the order they are tried and printed.
pub const COUNTERFACTUAL_NAMES: &[&str] = &[
    "activation checkpointing: full",
    "activation checkpointing: selective",
    "micro-batch / 2, grad_accum x 2",
    "sequence length / 2",
    "more GPUs (next power-of-two multiple)",
    "shard more",
    "no backward prefetch",
    "limit_all_gathers = true",
    "a GPU with more memory",
    "expandable_segments = true",
    "CPU offload (ZeRO-Offload / FSDP CPUOffload)",
    "tensor parallelism x 2 (with sequence parallelism)",
    "expert parallelism x 2",
    "token dropping: capacity factor 1.0",
    "context parallelism (same batch)",
    "fused linear cross-entropy (Liger)",
    "activation checkpointing: per-op selective (torchtitan)",
    "activation offload to host memory",
    "reduce gradients every micro-batch (FSDP without no_sync)",
    "NCCL without NVLS buffers (NCCL_NVLS_ENABLE=0)",
    "DeepSpeed: smaller IPG bucket (reduce_bucket_size / 4, overlap_comm off)",
    "DeepSpeed ZeRO-3: smaller optimizer sub-groups (sub_group_size / 10)",
    "recompute the experts' activation (Megatron --recompute-modules moe_act)",
    "Megatron --use-precision-aware-optimizer (FP32 master as int16 remainders)",
    "DeepSpeed ZeRO-3: fewer live parameters (stage3_max_live_parameters, stage3_max_reuse_distance / 10)",
    "torch.compile (training.kernels = \"compiled\")",
    "DeepEP token dispatch (Megatron --moe-token-dispatcher-type flex)",
    "overlap the token all-to-alls (Megatron --overlap-moe-expert-parallel-comm)",
    "pipeline schedule (1F1B, interleaved 1F1B, DualPipe, DualPipeV)",
    "SwiGLU inputs saved in FP8 (Megatron --activation-func-fp8-input-store)",
    "flash attention (no s x s scores stored)",
    "QLoRA: the frozen base in 4-bit NF4 with double quantization",
    "more GPUs, fully sharded (where state stays replicated: FULL_SHARD / ZeRO-3, or the distributed optimizer)",
    "QLoRA without prepare_model_for_kbit_training's fp32 upcast (embeddings, norms, head and hidden states in 16 bits)",
];

/// More GPUs: doublings of the count, then a bisection to the smallest that fits.
const MORE_GPUS: usize = 4;
/// The index of the change that applies to mixtures of experts only (no row for a dense
/// model).
const EXPERT_PARALLEL: usize = 12;
/// Token dropping: a mixture of experts only; it changes the training problem.
const CAPACITY: usize = 13;
/// Context parallelism, as each framework runs it (Megatron's ring, torchtitan's all-gather,
/// DeepSpeed's Ulysses).
const CONTEXT: usize = 14;
/// Liger's fused linear cross-entropy: offered outside Megatron (which has its own loss).
const FUSED_LOSS: usize = 15;
/// torchtitan's per-op selective checkpointing: a PyTorch policy, offered outside Megatron.
const SELECTIVE_OP: usize = 16;
/// Activation offload: Megatron's --cpu-offloading, PyTorch's offload_wrapper elsewhere.
const ACT_OFFLOAD: usize = 17;
/// FSDP's no_sync turned off: offered only where it is on.
const SYNC_EACH: usize = 18;
/// NCCL's NVLS (NVSwitch multicast) buffers turned off: offered only where NVLS is on and
/// stepsim estimates NCCL's memory (NeMo's launcher sets NCCL_NVLS_ENABLE=0 to save it).
const NO_NVLS: usize = 19;
/// DeepSpeed's IPG bucket made smaller (ZeRO-1/2 with `contiguous_gradients`): offered
/// under DeepSpeed only.
const SMALLER_IPG: usize = 20;
/// DeepSpeed ZeRO-3's optimizer sub-groups made smaller, which shrinks the FP32 gradient of
/// the largest: offered under DeepSpeed only.
const SMALLER_SUB_GROUP: usize = 21;
/// Megatron's selective recomputation of the routed experts' activation (`moe_act`): a mixture
/// of experts under Megatron only.
const MOE_ACT: usize = 22;
/// Megatron's precision-aware optimizer with FP32 states: Transformer Engine's FusedAdam keeps
/// the FP32 master as the int16 remainder of each BF16 parameter (bit-exact, 2 B less per
/// sharded element). Megatron's distributed optimizer with BF16 parameters only.
const PRECISION_AWARE: usize = 23;
/// DeepSpeed ZeRO-3's fetch window made smaller: prefetching stops at a tenth of the live
/// parameters and a tenth of the reuse distance keeps fewer gathered (`zero3_fetch`): offered
/// under DeepSpeed only.
const FEWER_LIVE: usize = 24;
/// torch.compile of eager PyTorch model code: fused element-wise chains (and what they save).
/// Offered where the kernels are eager and eager PyTorch runs some of the model's ops as
/// chains ([`crate::model::eager::differs`]).
const COMPILE: usize = 25;
/// DeepEP in place of NCCL's all-to-all for a mixture of experts under Megatron with expert
/// parallelism: fewer bytes across nodes, its buffers off the capacity.
const DEEPEP: usize = 26;
/// Megatron's combined 1F1B: a mixture of experts under Megatron with expert parallelism.
const EP_OVERLAP: usize = 27;
/// Another pipeline schedule: 1F1B for GPipe, interleaving (2 chunks per stage) where the
/// framework has it, DualPipe under Megatron. Pipelines only.
const SCHEDULE: usize = 28;
/// Megatron's `--activation-func-fp8-input-store`: every fused SwiGLU keeps its input as an
/// FP8 cast. Megatron with a SwiGLU (llama-family) MLP only.
const FP8_INPUT_STORE: usize = 29;
/// Flash attention in place of materialised (math or eager) attention: the framework's fused
/// kernel. Offered where the scores are materialised.
const FLASH: usize = 30;
/// QLoRA in place of a 16-bit frozen base: bitsandbytes NF4 with double quantization (what the
/// QLoRA paper trains with), the other frozen weights in FP32 (`prepare_model_for_kbit_training`).
/// Offered for LoRA jobs with a 16-bit base outside one FSDP1 FlatParameter with the adapters
/// (a 4-bit base there is not simulated, as scenario validation says).
const QLORA: usize = 31;
/// More GPUs for a job that keeps some of its state replicated (DDP, FSDP1's NO_SHARD,
/// Megatron's DistributedDataParallel; the parameters under ZeRO-1 and -2, everything beyond a
/// node under HYBRID_SHARD): replicated state is the same on every GPU at any count, so
/// [`MORE_GPUS`] alone cannot fit a job whose replicated state does not fit one GPU. The same
/// doublings with the state fully sharded ([`fully_sharded`]). Printed after "more GPUs".
const MORE_GPUS_SHARDED: usize = 32;
/// QLoRA without `prepare_model_for_kbit_training`'s FP32 upcast: the embeddings, norms and
/// head stay in the compute dtype and the hidden states with them ([`crate::model::LoraConfig::prepare_kbit`]),
/// as Unsloth, and TRL with `dtype: bfloat16`, run QLoRA. Offered where the stream is FP32.
const NO_PREPARE: usize = 33;

/// The order rows are printed in: the standard set's, with the sharded "more GPUs" beside the
/// plain one.
fn table_order() -> impl Iterator<Item = usize> {
    (0..=MORE_GPUS)
        .chain([MORE_GPUS_SHARDED])
        .chain((MORE_GPUS + 1..COUNTERFACTUAL_NAMES.len()).filter(|&w| w != MORE_GPUS_SHARDED))
}

/// What a pair's label starts with: full checkpointing together with another change
/// ([`pairs`]).
pub const PAIR_PREFIX: &str = "full checkpointing + ";

#[derive(Debug, Clone, Serialize)]
pub struct Counterfactual {
    pub change: String,
    /// None when the change does not apply or is not modelled.
    pub fits: Option<bool>,
    pub oom_phase: Option<Phase>,
    pub peak: Option<Bytes>,
    /// The phase the peak falls in: several changes that fit often share one peak because
    /// each moves it to the same place (the optimizer step's), which this says.
    pub peak_phase: Option<Phase>,
    pub gpus: u64,
    pub step_time_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// Relative change of tokens/s per GPU against the original (timed with unbounded memory).
    pub tokens_per_s_change: Option<f64>,
    pub gpu_seconds_per_token: Option<f64>,
    pub note: Option<String>,
    /// The change alters the training problem (fewer tokens per sequence), not only how it
    /// runs: ranked apart from those that keep it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub changes_problem: bool,
    /// What the allocator could reserve in the changed run: a change that frees capacity
    /// (NCCL's buffers) helps without changing the peak.
    #[serde(skip)]
    pub capacity: u64,
}

/// The next catalog part with more memory, along the upgrade a user of `name` would make
/// (24 GB consumer cards to the 32 GB RTX 5090; AWS's 24 GB parts to the 48 GB L40S).
fn bigger_gpu(name: &str) -> Option<&'static str> {
    Some(match name {
        "v100-32gb" => "a100-40gb",
        "rtx-3090" | "rtx-4090" => "rtx-5090",
        "a10g" | "l4" | "rtx-5090" => "l40s",
        "a100-40gb" | "l40s" => "a100-80gb",
        // The H800's buyers (export-controlled markets) step up to the 96 GB H20.
        "h800" => "h20",
        "a100-80gb" | "h100-sxm" | "h100-pcie" | "h100-nvl" | "h20" | "gh200-96gb" => "h200",
        "h200" | "gh200-144gb" => "b200",
        "b200" | "gb200" => "mi300x",
        "mi300x" => "mi325x",
        _ => return None,
    })
}

/// The next sharding of a job's state, as "shard more" takes it: FULL_SHARD / ZeRO-3 from
/// none, one stage up from ZeRO-1 or -2, and the optimizer alone (ZeRO-1, Megatron's
/// `--use-distributed-optimizer`) where scenario validation allows no more: pipelines,
/// Megatron, and a mixture of experts with expert or tensor parallelism.
fn sharded(s: &Scenario) -> Result<Sharding, String> {
    let pipelined = s.parallel.model_parallel.pipeline > 1;
    let megatron = s.parallel.framework == crate::plan::Framework::Megatron;
    let mp = &s.parallel.model_parallel;
    let moe_folded = s.model.moe.is_some() && (mp.expert > 1 || mp.tensor > 1);
    Ok(match s.parallel.sharding {
        Sharding::None if pipelined || megatron || moe_folded => Sharding::Zero1,
        _ if moe_folded => {
            return Err("a mixture of experts with expert or tensor parallelism is simulated with ZeRO-1 at most".into())
        }
        _ if megatron => return Err("Megatron-LM shards the optimizer at most (--use-distributed-optimizer)".into()),
        _ if pipelined => return Err("pipeline parallelism runs with ZeRO-1 at most".into()),
        Sharding::None => Sharding::Zero3,
        Sharding::Zero1 => Sharding::Zero2,
        Sharding::Zero2 | Sharding::HybridShard => Sharding::Zero3,
        Sharding::Zero3 => return Err("already FULL_SHARD / ZeRO-3".into()),
    })
}

/// `s` on `gpus` GPUs of its type, with its table label. A job on one node it does not fill
/// (its count is its node size: one GPU, or four of an eight-GPU node) grows into nodes of its
/// preset's size (`hardware.node`: 8 GPUs for an HGX node), as GPUs are added in practice;
/// leaving the node size where it was would put every added GPU in a node of its own, behind
/// the network. A job across nodes keeps its node size. The label names the layout where it
/// changes.
fn on_gpus(s: &Scenario, gpus: u64) -> (String, Scenario) {
    let mut v = s.clone();
    let (old, per) = (u64::from(s.cluster.gpus), u64::from(s.cluster.gpus_per_node));
    let per_node = node_size(s, gpus);
    v.cluster.gpus = u32::try_from(gpus).unwrap_or(u32::MAX);
    v.cluster.gpus_per_node = u32::try_from(per_node).unwrap_or(u32::MAX);
    let layout = match gpus / per_node.max(1) {
        _ if per_node == per => String::new(),
        1 => " (one node)".to_string(),
        n => format!(" ({n} nodes of {per_node})"),
    };
    (format!("GPUs {old} -> {gpus}{layout}"), v)
}

/// The GPUs per node of `s` grown to `gpus` ([`on_gpus`]): its preset's node size once a
/// one-node job it does not fill grows past it (the count when it fits one node), else its
/// own.
fn node_size(s: &Scenario, gpus: u64) -> u64 {
    let (old, per) = (u64::from(s.cluster.gpus), u64::from(s.cluster.gpus_per_node));
    let preset = crate::hardware::node(&s.cluster.node).map_or(per, |n| u64::from(n.gpus_per_node));
    let fill = per == old && per < preset;
    match () {
        _ if fill && gpus <= preset => gpus,
        _ if fill && gpus % preset == 0 => preset,
        _ => per,
    }
}

/// The sharding under which more GPUs divide all of a job's state, for a job whose sharding
/// leaves some of it replicated: FULL_SHARD / ZeRO-3, or where scenario validation allows no
/// more than the optimizer sharded ([`sharded`]: pipelines, Megatron, a folded mixture of
/// experts) ZeRO-1 from none. Why not, for a job already sharded as far as it can be.
fn fully_sharded(s: &Scenario) -> Result<Sharding, String> {
    match s.parallel.sharding {
        Sharding::None => sharded(s),
        Sharding::Zero3 => Err("already FULL_SHARD / ZeRO-3: more GPUs shard it further".into()),
        // Where "shard more" may take it a stage further, FULL_SHARD is allowed.
        _ => sharded(s).map(|_| Sharding::Zero3),
    }
}

/// `s` on `gpus` GPUs as "more GPUs" (`which`, plain or sharded) builds it, with its label:
/// [`on_gpus`]'s node layout, and for the sharded change the state sharded as
/// [`fully_sharded`] takes it.
fn grown(s: &Scenario, which: usize, gpus: u64) -> Result<(String, Scenario), String> {
    let (label, mut v) = on_gpus(s, gpus);
    if which != MORE_GPUS_SHARDED {
        return Ok((label, v));
    }
    let next = fully_sharded(s)?;
    v.parallel.sharding = next;
    let skipped = unprepared(&mut v);
    Ok((format!("{label}, sharding {} -> {}{skipped}", s.parallel.sharding_display(), next.display()), v))
}

/// A QLoRA variant whose parameters a change shards under FSDP's flattened units: without
/// `prepare_model_for_kbit_training`, whose FP32 norms FSDP1 could not flatten with the 4-bit
/// weights' storage, and which TRL's trainers skip for sharded QLoRA (scenario validation's
/// rule and default, `scenario::lora`). Returns what the label adds.
fn unprepared(v: &mut Scenario) -> &'static str {
    let flat = v.parallel.flat_sharded_units();
    match v.workload.lora.as_mut().filter(|l| l.prepare_kbit) {
        Some(l) if flat => {
            l.prepare_kbit = false;
            ", without prepare_model_for_kbit_training's fp32 upcast (TRL skips it for sharded QLoRA)"
        }
        _ => "",
    }
}

/// The variants of one change: (label, scenario); several for "more GPUs".
pub fn variants(s: &Scenario, which: usize) -> Result<Vec<(String, Scenario)>, String> {
    let mut v = s.clone();
    let t = &s.training;
    Ok(match which {
        0 => {
            let every = t.checkpoint_blocks == CheckpointBlocks::All;
            if t.checkpointing == Checkpointing::Full && every {
                return Err("already on".into());
            }
            v.training.checkpointing = Checkpointing::Full;
            v.training.checkpoint_blocks = CheckpointBlocks::All;
            let label = if t.checkpointing == Checkpointing::Full {
                "activation checkpointing: full, every block".to_string()
            } else {
                COUNTERFACTUAL_NAMES[0].to_string()
            };
            vec![(label, v)]
        }
        1 => {
            if t.checkpointing != Checkpointing::None {
                return Err("already checkpointing".into());
            }
            if s.workload.attention == crate::model::Attention::Flash {
                return Err("no effect: with flash attention the s x s attention scores are never stored, so selective recomputation has nothing to drop".into());
            }
            v.training.checkpointing = Checkpointing::Selective;
            vec![(COUNTERFACTUAL_NAMES[1].into(), v)]
        }
        2 => {
            if t.micro_batch < 2 || t.micro_batch % 2 != 0 {
                return Err(format!("micro-batch {} cannot be halved", t.micro_batch));
            }
            v.training.micro_batch /= 2;
            v.workload.micro_batch /= 2;
            v.training.grad_accum *= 2;
            vec![(
                format!("micro-batch {}, grad_accum {} (same batch)", v.training.micro_batch, v.training.grad_accum),
                v,
            )]
        }
        3 => {
            if t.seq_len < 2 {
                return Err("sequence too short".into());
            }
            let mp = &s.parallel.model_parallel;
            if mp.sequence_parallel && (t.seq_len / 2) % mp.tensor != 0 {
                return Err(format!("half the sequence is not divisible by tensor parallel {}", mp.tensor));
            }
            v.training.seq_len /= 2;
            v.workload.seq_len /= 2;
            vec![(format!("sequence length {} (half the tokens)", v.training.seq_len), v)]
        }
        MORE_GPUS | MORE_GPUS_SHARDED => {
            if which == MORE_GPUS_SHARDED {
                fully_sharded(s)?;
            }
            // With [jitter] every data-parallel rank of every stage is simulated, up to the limit scenario
            // validation enforces; larger variants would not be valid scenarios.
            let out: Vec<_> = (1..=6)
                .filter_map(|k| grown(s, which, u64::from(s.cluster.gpus).saturating_mul(1 << k)).ok())
                .filter(|(_, v)| v.jitter.is_none() || v.jitter_ranks() <= crate::scenario::MAX_JITTER_RANKS)
                .collect();
            if out.is_empty() {
                return Err(format!(
                    "[jitter] simulates at most {} ranks (data-parallel x pipeline)",
                    crate::scenario::MAX_JITTER_RANKS
                ));
            }
            out
        }
        5 => {
            if s.cluster.gpus < 2 {
                return Err("nothing to shard over on one GPU".into());
            }
            let next = sharded(s)?;
            v.parallel.sharding = next;
            let skipped = unprepared(&mut v);
            vec![(format!("sharding {} -> {}{skipped}", s.parallel.sharding_display(), next.display()), v)]
        }
        6 | 7 if !s.parallel.framework.is_pytorch() => {
            return Err(format!(
                "an FSDP setting; {} does not read it",
                s.parallel.framework.display(s.parallel.sharding, s.cluster.gpus as u64)
            ));
        }
        6 | 7 if !matches!(s.parallel.sharding, Sharding::Zero2 | Sharding::Zero3 | Sharding::HybridShard) => {
            return Err("no parameters are gathered (DDP, ZeRO-1, NO_SHARD)".into());
        }
        6 => {
            if s.parallel.backward_prefetch == BackwardPrefetch::None || s.parallel.sharding == Sharding::None {
                return Err("no backward prefetch to turn off".into());
            }
            v.parallel.backward_prefetch = BackwardPrefetch::None;
            vec![("backward_prefetch = None".into(), v)]
        }
        7 => {
            if s.parallel.framework == crate::plan::Framework::Fsdp2 {
                return Err("FSDP2 has no limit_all_gathers (its all-gathers run one unit ahead)".into());
            }
            if s.parallel.limit_all_gathers || s.parallel.sharding == Sharding::None {
                return Err("already limited".into());
            }
            v.parallel.limit_all_gathers = true;
            vec![("limit_all_gathers = true".into(), v)]
        }
        8 => {
            let Some(g) = bigger_gpu(&s.cluster.gpu.name) else { return Err("no larger GPU in the catalog".into()) };
            let spec = crate::hardware::lookup(g).ok_or("catalog")?;
            v.cluster.gpu = spec.clone();
            v.cluster.memory_bytes = spec.memory_bytes;
            vec![(format!("GPU {} -> {g} ({:.0} GB)", s.cluster.gpu.name, spec.memory_bytes as f64 / 1e9), v)]
        }
        9 => {
            if s.allocator.kind != crate::memory::AllocatorKind::Caching || s.allocator.expandable_segments {
                return Err("not the caching allocator, or already expandable".into());
            }
            v.allocator.expandable_segments = true;
            vec![("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(), v)]
        }
        10 => {
            use crate::plan::{Framework, OffloadDevice};
            if s.parallel.offload.is_some() {
                return Err("already offloading".into());
            }
            if s.workload.lora.is_some() {
                return Err("offload with LoRA is not simulated yet".into());
            }
            if s.parallel.model_parallel.pipeline > 1 && s.parallel.framework == Framework::Deepspeed {
                return Err(
                    "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1, with which offload is not simulated".into()
                );
            }
            let (params, label) = match (s.parallel.framework, s.parallel.sharding) {
                (Framework::Deepspeed, Sharding::Zero2 | Sharding::Zero3) => {
                    (None, "DeepSpeed offload_optimizer.device = \"cpu\"")
                }
                (Framework::Deepspeed, _) => {
                    return Err("DeepSpeed offloads the optimizer with ZeRO stage 2 or 3".into())
                }
                (Framework::Fsdp2, Sharding::Zero3) => (Some(OffloadDevice::Cpu), "FSDP2 CPUOffloadPolicy()"),
                (Framework::Fsdp | Framework::Fsdp1, Sharding::Zero3) => {
                    (Some(OffloadDevice::Cpu), "FSDP CPUOffload(offload_params=True)")
                }
                (Framework::Fsdp | Framework::Fsdp1 | Framework::Fsdp2, _) => {
                    return Err("FSDP's CPU offload needs FULL_SHARD".into())
                }
                (Framework::Megatron, _) => return Err("offload is not simulated for Megatron-LM".into()),
            };
            v.parallel.offload =
                Some(crate::scenario::default_offload(&s.cluster, s.parallel.framework, OffloadDevice::Cpu, params));
            vec![(label.into(), v)]
        }
        11 => {
            // Megatron-style tensor parallelism inside a node, as scenario validation
            // requires it (src/scenario/parallel.rs): the degree divides the heads, KV heads,
            // FFN and vocabulary, fits a node and leaves a whole data-parallel degree.
            let mp = &s.parallel.model_parallel;
            let tp = mp.tensor * 2;
            let m = &s.model;
            let per_node = u64::from(s.cluster.gpus_per_node);
            let gpus = u64::from(s.cluster.gpus);
            if s.workload.lora.is_some() || s.parallel.offload.is_some() {
                return Err("tensor parallelism with LoRA or offload is not simulated".into());
            }
            if s.parallel.sharding == Sharding::HybridShard {
                return Err("hybrid_shard with tensor parallelism is not modelled".into());
            }
            if tp > per_node || gpus % (tp * mp.pipeline) != 0 {
                return Err(format!(
                    "tensor parallel {tp} does not fit a node of {per_node} GPUs or divide {gpus} GPUs"
                ));
            }
            if m.n_heads % tp != 0 || m.n_kv_heads % tp != 0 || m.ffn_hidden % tp != 0 {
                return Err(format!("tensor parallel {tp} does not divide the heads, KV heads and FFN"));
            }
            if t.seq_len % tp != 0 {
                return Err(format!("sequence parallelism needs the sequence ({}) divisible by {tp}", t.seq_len));
            }
            v.parallel.model_parallel.tensor = tp;
            v.parallel.model_parallel.sequence_parallel = true;
            v.workload.split = crate::model::TensorSplit { tensor: tp, sequence_parallel: true, ..v.workload.split };
            // Megatron pads the vocabulary to a multiple of 128 x tp
            // (--make-vocab-size-divisible-by 128).
            let padded = if m.vocab % tp == 0 { m.vocab } else { m.vocab.div_ceil(128 * tp) * 128 * tp };
            v.model.vocab = padded;
            let pad =
                if padded != m.vocab { format!(" (vocabulary padded {} -> {padded})", m.vocab) } else { String::new() };
            // The experts keep their layout: expert tensor parallelism stays what the
            // scenario has (Megatron's default would follow --tensor-model-parallel-size;
            // the label says so for a mixture of experts).
            let experts = match &m.moe {
                Some(_) => format!(", expert_tensor stays {}", mp.expert_tensor),
                None => String::new(),
            };
            vec![(format!("tensor parallel {} -> {tp}, sequence parallel{pad}{experts}", mp.tensor), v)]
        }
        EXPERT_PARALLEL => {
            // Megatron-Core's rules as scenario validation applies them (src/scenario/moe.rs):
            // the degree divides the experts and the stage's tensor x context x data-parallel
            // ranks.
            let Some(moe) = &s.model.moe else { return Err("not a mixture of experts".into()) };
            let mp = &s.parallel.model_parallel;
            let ep = mp.expert * 2;
            let ranks = mp.tensor * mp.context.max(1) * s.dp_degree();
            let etp = mp.expert_tensor;
            if moe.num_experts % ep != 0 || ranks % (etp * ep) != 0 {
                return Err(format!(
                    "expert parallel {ep}{} does not divide the {} experts and the {ranks} {} ranks of a stage",
                    if etp > 1 { format!(" (x expert tensor parallel {etp})") } else { String::new() },
                    moe.num_experts,
                    if mp.context > 1 { "tensor x context x data-parallel" } else { "tensor x data-parallel" }
                ));
            }
            if !matches!(s.parallel.sharding, Sharding::None | Sharding::Zero1) {
                return Err("expert parallelism is simulated with sharding none or zero1".into());
            }
            if s.jitter.is_some() {
                return Err("[jitter] with expert parallelism is not simulated".into());
            }
            if !s.routing.is_uniform() && ep * mp.pipeline > crate::scenario::MAX_JITTER_RANKS {
                return Err(format!(
                    "uneven routing simulates at most {} expert-parallel ranks x stages",
                    crate::scenario::MAX_JITTER_RANKS
                ));
            }
            v.parallel.model_parallel.expert = ep;
            v.workload.split.expert = ep;
            vec![(
                format!(
                    "expert parallel {} -> {ep} ({} experts of each MoE block per GPU)",
                    mp.expert,
                    moe.num_experts / ep
                ),
                v,
            )]
        }
        CAPACITY => {
            if s.model.moe.is_none() {
                return Err("not a mixture of experts".into());
            }
            if s.parallel.model_parallel.expert <= 1 {
                return Err("token dropping is simulated with expert parallelism only".into());
            }
            if s.capacity.is_some() {
                return Err("already dropping tokens".into());
            }
            if s.parallel.model_parallel.expert * s.parallel.model_parallel.pipeline > crate::scenario::MAX_JITTER_RANKS
            {
                return Err(format!(
                    "token dropping simulates at most {} expert-parallel ranks x stages",
                    crate::scenario::MAX_JITTER_RANKS
                ));
            }
            v.capacity = Some(crate::schedule::routing::Capacity { factor: 1.0, pad: false });
            let dropped = v.dropped_copies() as f64 / v.routed_copies().max(1) as f64;
            vec![(format!("capacity factor 1.0: drop {:.1}% of the token copies", dropped * 100.0), v)]
        }
        CONTEXT => {
            // The degrees scenario validation accepts (src/scenario/parallel.rs
            // validate_context): each doubling of the ring that still divides the GPUs and
            // splits the sequence into 2 x context chunks, with grad_accum multiplied alike so
            // the global batch stays (the ring takes its ranks from data parallelism).
            let mp = &s.parallel.model_parallel;
            // Under FSDP, torchtitan's default rotation (all-gather); Megatron's ring;
            // DeepSpeed's Ulysses, which needs the heads to divide by the degree.
            let comm = match s.parallel.framework {
                crate::plan::Framework::Fsdp | crate::plan::Framework::Fsdp1 | crate::plan::Framework::Fsdp2 => {
                    crate::model::ContextComm::AllGather
                }
                crate::plan::Framework::Megatron if mp.context > 1 => mp.context_comm,
                crate::plan::Framework::Megatron => crate::model::ContextComm::Ring,
                crate::plan::Framework::Deepspeed => crate::model::ContextComm::AllToAll,
            };
            let heads = (s.model.n_heads / mp.tensor.max(1), s.model.n_kv_heads / mp.tensor.max(1));
            if s.workload.attention != crate::model::Attention::Flash {
                return Err("context parallelism runs flash attention blocks".into());
            }
            if s.model.mla.is_some() || s.jitter.is_some() {
                return Err("context parallelism with latent attention or [jitter] is not simulated".into());
            }
            // A mixture of experts under Megatron-Core or torchtitan: the ring's ranks come out
            // of data parallelism, so a stage's tensor x context x data ranks, which the
            // experts fold over, stay as they are (the expert layout is unchanged; the context
            // ranks join the expert-data-parallel group, or efsdp mesh, the data ranks leave).
            // torchtitan's HSDP over experts is not simulated with a ring.
            use crate::plan::Framework;
            let framework = s.parallel.framework;
            if s.model.moe.is_some()
                && !(framework == Framework::Megatron
                    || (framework == Framework::Fsdp2 && s.parallel.sharding != Sharding::HybridShard))
            {
                return Err(
                    "context parallelism with a mixture of experts is simulated under Megatron-Core and torchtitan (FSDP2 full_shard) only".into()
                );
            }
            let dp = s.dp_degree();
            let out: Vec<_> = (1..=6u32)
                .map(|k| 1u64 << k)
                .filter(|&x| dp % x == 0)
                .filter(|&x| t.seq_len % (2 * mp.context * x) == 0)
                .filter(|&x| !mp.sequence_parallel || (t.seq_len / (mp.context * x)) % mp.tensor == 0)
                .filter(|&x| {
                    comm != crate::model::ContextComm::AllToAll
                        || (heads.0 % (mp.context * x) == 0 && heads.1 % (mp.context * x) == 0)
                })
                .filter(|&x| {
                    mp.schedule != crate::plan::PipelineSchedule::Interleaved || (t.grad_accum * x) % mp.pipeline == 0
                })
                .map(|x| {
                    let mut v = s.clone();
                    v.parallel.model_parallel.context = mp.context * x;
                    v.workload.split.context = mp.context * x;
                    if mp.context == 1 {
                        v.parallel.model_parallel.context_comm = comm;
                        v.workload.split.context_comm = comm;
                    }
                    v.training.grad_accum = t.grad_accum * x;
                    if let Some(f) = v.workload.fp8.as_mut() {
                        f.micro_batches = v.training.grad_accum;
                    }
                    let label = format!(
                        "context parallel {} -> {}, grad_accum {} -> {} (same batch)",
                        mp.context,
                        mp.context * x,
                        t.grad_accum,
                        v.training.grad_accum
                    );
                    (label, v)
                })
                .collect();
            if out.is_empty() {
                return Err(format!(
                    "no larger ring divides the {dp} data-parallel ranks and splits the sequence ({}) into 2 x context chunks",
                    t.seq_len
                ));
            }
            out
        }
        FUSED_LOSS => {
            if s.workload.loss == crate::model::LossKind::FusedLinear {
                return Err("already fused".into());
            }
            if s.parallel.model_parallel.tensor > 1 {
                return Err(
                    "Liger's fused linear cross-entropy needs the whole vocabulary on each GPU (no tensor parallelism)"
                        .into(),
                );
            }
            if s.workload.lora.is_some() {
                return Err("the fused loss with LoRA is not simulated".into());
            }
            v.workload.loss = crate::model::LossKind::FusedLinear;
            vec![("loss = \"fused-linear\" (Liger FusedLinearCrossEntropy: no full logits)".into(), v)]
        }
        SELECTIVE_OP => {
            match t.checkpointing {
                Checkpointing::SelectiveOp => return Err("already on".into()),
                Checkpointing::Full if t.checkpoint_blocks == CheckpointBlocks::All => {
                    return Err("full checkpointing of every block keeps less already".into())
                }
                _ => {}
            }
            v.training.checkpointing = Checkpointing::SelectiveOp;
            v.training.checkpoint_blocks = CheckpointBlocks::All;
            vec![("activation checkpointing: selective-op (torchtitan's per-op policy)".into(), v)]
        }
        ACT_OFFLOAD => {
            use crate::plan::{ActivationOffloadMethod, Framework};
            if t.activation_offload.is_some() {
                return Err("already offloading activations".into());
            }
            // Under Megatron, where --cpu-offloading is refused (a pipeline, selective
            // recompute), its fine-grained offloading of every applicable module.
            let pipeline = s.parallel.model_parallel.pipeline > 1;
            if s.parallel.framework == Framework::Megatron && (pipeline || t.checkpointing == Checkpointing::Selective)
            {
                use crate::plan::OffloadModules as M;
                let mut modules = M(M::ATTN_NORM | M::QKV_LINEAR | M::CORE_ATTN | M::ATTN_PROJ | M::MLP_NORM);
                if s.model.moe.is_some() {
                    modules.0 |= M::EXPERT_FC1 | M::MOE_ACT;
                }
                let a = crate::scenario::fine_grained(&s.cluster, s.model.n_layers, modules, M::MIN_ELEMENTS, 1.0);
                v.training.activation_offload = Some(a);
                let label = format!(
                    "activation offload: --fine-grained-activation-offloading --offload-modules {}",
                    modules.names().join(" ")
                );
                return Ok(vec![(label, v)]);
            }
            if t.checkpointing != Checkpointing::None {
                return Err("offload replaces checkpointing (Megatron refuses both at once; PyTorch wraps a block with one or the other)".into());
            }
            if pipeline {
                return Err("activation offload with pipeline parallelism is not simulated outside Megatron".into());
            }
            let method = match s.parallel.framework {
                Framework::Megatron => ActivationOffloadMethod::Overlapped,
                _ => ActivationOffloadMethod::Synchronous,
            };
            let blocks = method.most_blocks(s.model.n_layers);
            if blocks == 0 {
                return Err("one block: nothing to offload ahead of its backward".into());
            }
            let label = match method {
                ActivationOffloadMethod::Overlapped => format!("--cpu-offloading --cpu-offloading-num-layers {blocks}"),
                ActivationOffloadMethod::Synchronous | ActivationOffloadMethod::FineGrained => {
                    "offload_wrapper on every block (PyTorch save_on_cpu)".into()
                }
            };
            v.training.activation_offload = Some(crate::scenario::activation_offload(&s.cluster, method, blocks));
            vec![(format!("activation offload: {label}"), v)]
        }
        SYNC_EACH => {
            v.parallel.no_sync = false;
            vec![(
                "gradients reduce-scattered every micro-batch (no no_sync; Accelerate sync_each_batch=True)".into(),
                v,
            )]
        }
        NO_NVLS => {
            if s.allocator.nccl_buffers.is_some() {
                return Err("NCCL's memory is given (allocator.nccl_buffers)".into());
            }
            v.set_nvls(false);
            let saved = s.nccl_bytes().saturating_sub(v.nccl_bytes());
            if saved == 0 {
                return Err("no communicator all-reduces through NVLS".into());
            }
            vec![(
                format!(
                    "NCCL_NVLS_ENABLE=0 (NVLS buffers off: {} less NCCL memory per GPU; all-reduces inside a node on rings)",
                    fmt_bytes(saved)
                ),
                v,
            )]
        }
        SMALLER_IPG => {
            let plan_opt = deepspeed_optimizer(s);
            use crate::plan::DeepspeedOptimizer;
            let ds = &s.parallel.deepspeed;
            let bytes = |d: &crate::plan::DeepspeedConfig, dtype| match plan_opt {
                Some(DeepspeedOptimizer::ZeroStage3) => d.stage3_ipg_bytes(dtype),
                _ => d.ipg_bytes(dtype),
            };
            let dtype = s.training.precision.param;
            let stage = matches!(plan_opt, Some(DeepspeedOptimizer::ZeroStage12 | DeepspeedOptimizer::ZeroStage3));
            if !stage || bytes(ds, dtype) == 0 {
                return Err("no IPG bucket (DeepSpeed's ZeRO optimizers with contiguous_gradients)".into());
            }
            let size = (ds.reduce_bucket_size / 4).max(1);
            v.parallel.deepspeed.reduce_bucket_size = size;
            v.parallel.deepspeed.overlap_comm = false;
            let saved = bytes(ds, dtype).saturating_sub(bytes(&v.parallel.deepspeed, dtype));
            let overlap = if ds.overlap_comm { ", overlap_comm false" } else { "" };
            vec![(
                format!(
                    "DeepSpeed reduce_bucket_size {:e} -> {:e}{overlap} (IPG buckets {} smaller)",
                    ds.reduce_bucket_size as f64,
                    size as f64,
                    fmt_bytes(saved)
                ),
                v,
            )]
        }
        SMALLER_SUB_GROUP => {
            let stage3 = deepspeed_optimizer(s) == Some(crate::plan::DeepspeedOptimizer::ZeroStage3);
            if !stage3 {
                return Err("no FP32 sub-group gradient (DeepSpeed ZeRO-3 without offload)".into());
            }
            let ds = &s.parallel.deepspeed;
            let size = (ds.sub_group_size / 10).max(1);
            // The partition this rank steps: the model's parameters over the shard group (the
            // data-parallel ranks; no tensor or pipeline parallelism under ZeRO-3).
            let shard =
                crate::plan::shard_group(&s.parallel, u64::from(s.cluster.gpus), u64::from(s.cluster.gpus_per_node));
            let part = s.model.param_count().div_ceil(shard.max(1));
            v.parallel.deepspeed.sub_group_size = size;
            let sub = |d: &crate::plan::DeepspeedConfig| d.stage3_sub_group_elements(part);
            let saved = (sub(ds) - sub(&v.parallel.deepspeed)) * 4;
            if saved == 0 {
                return Err(format!("the partition ({part} elements) is one sub-group of {size} already"));
            }
            vec![(
                format!(
                    "DeepSpeed sub_group_size {:e} -> {:e} (FP32 sub-group gradient {} smaller)",
                    ds.sub_group_size as f64,
                    size as f64,
                    fmt_bytes(saved)
                ),
                v,
            )]
        }
        MOE_ACT => {
            use crate::plan::RecomputeModule;
            if s.model.moe.is_none() {
                return Err("not a mixture of experts".into());
            }
            let modules = match t.checkpointing {
                Checkpointing::Full if t.checkpoint_blocks == CheckpointBlocks::All => {
                    return Err("full checkpointing of every block keeps less already".into())
                }
                Checkpointing::Selective if t.recompute_modules.contains(&RecomputeModule::MoeAct) => {
                    return Err("already on".into())
                }
                // Megatron's --recompute-modules default is core_attn alone.
                Checkpointing::Selective => t.recompute_modules.clone(),
                _ => vec![RecomputeModule::CoreAttn],
            };
            v.training.checkpointing = Checkpointing::Selective;
            v.training.checkpoint_blocks = CheckpointBlocks::All;
            v.training.recompute_modules = modules.into_iter().chain([RecomputeModule::MoeAct]).collect();
            vec![(
                "recompute_modules + \"moe_act\" (selective): the routed experts' activation recomputed in backward"
                    .into(),
                v,
            )]
        }
        FP8_INPUT_STORE => {
            if s.workload.swiglu_fp8_input_store {
                return Err("already on".into());
            }
            v.workload.swiglu_fp8_input_store = true;
            vec![(
                "activation_func_fp8_input_store: the SwiGLU inputs saved as FP8 casts (--activation-func-fp8-input-store)"
                    .into(),
                v,
            )]
        }
        PRECISION_AWARE => {
            let pr = &t.precision;
            if pr.aware.is_some() {
                return Err("already on".into());
            }
            if s.parallel.sharding != Sharding::Zero1 {
                return Err("needs Megatron's distributed optimizer (sharding = \"zero1\")".into());
            }
            if pr.param != crate::model::Dtype::Bf16 || pr.master != Some(crate::model::Dtype::Fp32) {
                return Err("remainders need BF16 parameters under an FP32 master".into());
            }
            if !matches!(t.optimizer, crate::plan::OptimizerKind::Adam | crate::plan::OptimizerKind::AdamW) {
                return Err("the precision-aware optimizer is Adam only".into());
            }
            v.training.precision.aware = Some(crate::plan::PrecisionAware {
                main_params: crate::model::Dtype::Fp32,
                store_param_remainders: true,
                exp_avg: crate::plan::StateDtype::Fp32,
                exp_avg_sq: crate::plan::StateDtype::Fp32,
            });
            vec![(
                "use_precision_aware_optimizer: FP32 master as int16 remainders (TE 2.1+), 2 B/element less".into(),
                v,
            )]
        }
        FEWER_LIVE => {
            let offloaded = s.parallel.offload.as_ref().is_some_and(|o| o.parameters.is_some());
            if s.parallel.sharding != Sharding::Zero3 || offloaded {
                return Err("no ZeRO-3 fetching of on-GPU parameters".into());
            }
            let ds = &s.parallel.deepspeed;
            if ds.stage3_max_live_parameters == 0 && ds.stage3_max_reuse_distance == 0 {
                return Err("nothing is kept live already".into());
            }
            v.parallel.deepspeed.stage3_max_live_parameters = ds.stage3_max_live_parameters / 10;
            v.parallel.deepspeed.stage3_max_reuse_distance = ds.stage3_max_reuse_distance / 10;
            vec![(
                format!(
                    "DeepSpeed stage3_max_live_parameters {:e} -> {:e}, stage3_max_reuse_distance {:e} -> {:e}",
                    ds.stage3_max_live_parameters as f64,
                    (ds.stage3_max_live_parameters / 10) as f64,
                    ds.stage3_max_reuse_distance as f64,
                    (ds.stage3_max_reuse_distance / 10) as f64
                ),
                v,
            )]
        }
        COMPILE => {
            if s.workload.kernels != crate::model::KernelStack::Eager {
                return Err(format!("the kernels are {} already", s.workload.kernels.name()));
            }
            if !crate::model::eager::differs(&s.model) {
                return Err("this model's LayerNorm and GELU are single kernels in eager PyTorch too".into());
            }
            v.workload.kernels = crate::model::KernelStack::Compiled;
            v.workload.fused_swiglu = true;
            // torchtitan compiles its loss with the model, and Hugging Face's loss is part of
            // the compiled forward: Inductor's cross-entropy keeps no FP32 logits. Under
            // tensor parallelism (loss_parallel) the loss stays as it is.
            let loss = if s.workload.loss == crate::model::LossKind::Eager && s.parallel.model_parallel.tensor == 1 {
                v.workload.loss = crate::model::LossKind::Compiled;
                ", loss = \"compiled\": the cross-entropy fused, no FP32 copy of the logits"
            } else {
                ""
            };
            vec![(
                format!("torch.compile (kernels = \"compiled\"{loss}): fused norm, rotary and SiLU-product kernels, the FP32 norm copies no longer saved"),
                v,
            )]
        }
        FLASH => {
            if !s.workload.attention.materialised() {
                return Err("the attention is flash already".into());
            }
            v.workload.attention = crate::model::Attention::Flash;
            v.workload.flash_kernel = None;
            let how = if s.parallel.framework == crate::plan::Framework::Megatron {
                "Transformer Engine's fused attention"
            } else {
                "Hugging Face attn_implementation sdpa or flash_attention_2: FlashAttention-2"
            };
            vec![(format!("flash attention ({how}): no s x s scores stored"), v)]
        }
        DEEPEP => {
            let Some(moe) = &s.model.moe else { return Err("not a mixture of experts".into()) };
            if s.parallel.deepep.is_some() {
                return Err("already on".into());
            }
            if let Some(why) = crate::scenario::deepep_refusal(&s.parallel, s.capacity.is_some()) {
                return Err(why);
            }
            // Megatron's default --moe-flex-dispatcher-num-sms.
            v.parallel.deepep = Some(crate::scenario::deepep_for(moe, 20, &s.routing));
            vec![(
                "moe.dispatcher = \"deepep\": a token sent once per rank, and across nodes once per node, it reaches; DeepEP's buffers off the capacity, 20 SMs while it runs".into(),
                v,
            )]
        }
        EP_OVERLAP => {
            if s.model.moe.is_none() {
                return Err("not a mixture of experts".into());
            }
            if s.parallel.megatron.overlap_moe_expert_parallel_comm {
                return Err("already on".into());
            }
            if let Some(why) = crate::scenario::ep_overlap_refusal(&s.model, &s.parallel, t) {
                return Err(why);
            }
            v.parallel.megatron.overlap_moe_expert_parallel_comm = true;
            vec![(
                "overlap_moe_expert_parallel_comm: each forward layer by layer beside another micro-batch's backward, one's all-to-alls under the other's compute".into(),
                v,
            )]
        }
        SCHEDULE => schedule_variants(s)?,
        QLORA => {
            let Some(l) = v.workload.lora.as_mut() else { return Err("not a LoRA fine-tuning job".into()) };
            if l.base != crate::model::WeightFormat::Half {
                return Err("the base is 4-bit already".into());
            }
            if l.shared_flat {
                return Err(
                    "a 4-bit base in one FSDP1 FlatParameter with the adapters (wrap = \"block\") is not simulated"
                        .into(),
                );
            }
            l.base = crate::model::WeightFormat::Nf4 { double_quant: true };
            // prepare_model_for_kbit_training, as the QLoRA paper's script runs it, where its
            // FP32 stream is simulated (scenario validation refuses it elsewhere).
            l.prepare_kbit =
                s.model.family == crate::model::Family::Llama && crate::scenario::prepare_kbit_default(&s.parallel);
            let rest = if l.prepare_kbit {
                "the other frozen weights and the hidden states in fp32 (prepare_model_for_kbit_training)"
            } else {
                "the other frozen weights in 16 bits (lora.prepare_kbit_training = false)"
            };
            vec![(
                format!(
                    "QLoRA (lora.base_weights = nf4, double_quant = true): the frozen block linears in 4 bits, {rest}"
                ),
                v,
            )]
        }
        NO_PREPARE => {
            let Some(l) = v.workload.lora.as_mut().filter(|l| l.fp32_stream()) else {
                return Err("not a QLoRA job with prepare_model_for_kbit_training's fp32 upcast".into());
            };
            l.prepare_kbit = false;
            let label = format!("lora.prepare_kbit_training = false: the embeddings, norms and head stay in {}, and the hidden states with them (Unsloth; TRL with dtype bfloat16)", t.precision.compute.name());
            vec![(label, v)]
        }
        _ => return Err("no such change".into()),
    })
}

/// A DualPipe schedule as a variant (its forward-backward pairs replace Megatron's all-to-all
/// overlap, which it refuses beside them), or the reason it is not offered.
fn offer_dualpipe(
    out: &mut Vec<(String, Scenario)>,
    why: &mut Vec<String>,
    refusal: Option<String>,
    mut v: Scenario,
    label: &str,
) {
    match refusal {
        Some(w) => why.push(w),
        None => {
            v.parallel.megatron.overlap_moe_expert_parallel_comm = false;
            out.push((label.to_string(), v));
        }
    }
}

/// The pipeline schedules a job could switch to, each as its framework and stepsim's
/// validation take it; Err with the reasons where none can.
fn schedule_variants(s: &Scenario) -> Result<Vec<(String, Scenario)>, String> {
    use crate::plan::{Framework, PipelineSchedule as P};
    let mp = &s.parallel.model_parallel;
    let (p, m, layers) = (mp.pipeline, s.training.grad_accum, s.model.n_layers);
    let with = |schedule: P, chunks: u64| {
        let mut v = s.clone();
        let vm = &mut v.parallel.model_parallel;
        vm.schedule = schedule;
        vm.virtual_stages = chunks;
        if chunks != mp.virtual_stages {
            vm.stage_layers.clear();
        }
        v
    };
    let mut out = Vec::new();
    let mut why = Vec::new();
    if mp.schedule == P::Gpipe {
        out.push((
            "schedule 1f1b: stage k holds p - k micro-batches' activations, not all of them".to_string(),
            with(P::OneFOneB, 1),
        ));
    }
    if matches!(mp.schedule, P::Gpipe | P::OneFOneB) {
        if s.parallel.framework == Framework::Deepspeed {
            why.push("DeepSpeed's pipeline engine has no interleaved schedule".to_string());
        } else if !mp.stage_layers.is_empty() {
            why.push(
                "interleaving would need a split per virtual stage (parallel.stage_layers is per stage)".to_string(),
            );
        } else if layers % (2 * p) != 0 {
            why.push(format!("interleaving 2 chunks per stage needs model.n_layers ({layers}) divisible by {}", 2 * p));
        } else if m % p != 0 {
            why.push(format!("interleaving needs grad_accum ({m}) a multiple of the pipeline ({p})"));
        } else {
            out.push((
                "schedule interleaved-1f1b, 2 model chunks per stage: half the bubble, more activations in flight"
                    .to_string(),
                with(P::Interleaved, 2),
            ));
        }
    }
    if mp.schedule != P::DualPipe {
        let dualpipe_refusal = if s.parallel.framework != Framework::Megatron {
            Some("DualPipe is simulated under Megatron only".to_string())
        } else if p % 2 != 0 {
            Some(format!("DualPipe needs an even pipeline, got {p}"))
        } else if m % 2 != 0 || m < 2 * p {
            Some(format!("DualPipe needs an even grad_accum of at least {}, got {m}", 2 * p))
        } else if mp.virtual_stages > 1 && !mp.stage_layers.is_empty() {
            Some("DualPipe would need a split per stage (parallel.stage_layers is per virtual stage)".to_string())
        } else {
            None
        };
        offer_dualpipe(&mut out, &mut why, dualpipe_refusal, with(P::DualPipe, 1), "schedule dualpipe: micro-batches from both ends, each rank holding stages k and p - 1 - k (parameters twice), forwards beside the other direction's backwards");
    }
    if mp.schedule != P::DualPipeV {
        let refusal = if s.parallel.framework != Framework::Megatron {
            Some("DualPipeV is simulated under Megatron only".to_string())
        } else if m < 2 * p {
            Some(format!("DualPipeV needs a grad_accum of at least {}, got {m}", 2 * p))
        } else if !mp.stage_layers.is_empty() && mp.virtual_stages != 2 {
            Some("DualPipeV would need a split per virtual stage (parallel.stage_layers)".to_string())
        } else if layers < 2 * p {
            Some(format!("DualPipeV needs at least {} layers for its {} virtual stages", 2 * p, 2 * p))
        } else {
            None
        };
        offer_dualpipe(&mut out, &mut why, refusal, with(P::DualPipeV, 2), "schedule dualpipev: each micro-batch down the ranks and back up, DualPipe's overlapped pairs and zero-bubble passes with one copy of the model");
    }
    if out.is_empty() {
        return Err(if why.is_empty() {
            "already the shortest-bubble schedule stepsim simulates for this job".into()
        } else {
            why.join("; ")
        });
    }
    Ok(out)
}

/// The DeepSpeed optimizer wrapper a scenario's plan would use (the plan's own rule).
fn deepspeed_optimizer(s: &Scenario) -> Option<crate::plan::DeepspeedOptimizer> {
    crate::plan::DeepspeedOptimizer::for_plan(
        s.parallel.framework,
        s.parallel.sharding,
        &s.training.precision,
        s.parallel.offload.is_some(),
    )
}

fn measure(label: String, s: &Scenario, base_tps: Option<f64>) -> Counterfactual {
    let gpus = u64::from(s.cluster.gpus);
    let Ok(sim) = crate::simulate_job_only(s) else {
        return skipped(&label, gpus, "internal scheduling error".into());
    };
    let r = &sim;
    let (fits, oom_phase) = match &r.verdict {
        Verdict::Fits { .. } => (true, None),
        Verdict::Oom(o) => (false, Some(o.at.phase)),
    };
    // Offload that the node's host memory or NVMe cannot hold fails at initialisation.
    let host_oom = !r.offload_fits;
    let (fits, oom_phase) = if host_oom && fits { (false, Some(Phase::Init)) } else { (fits, oom_phase) };
    // One simulation alive at a time: the run that did not fit is dropped before its
    // unbounded twin is built (each holds the whole program of a large job).
    let timed = if fits {
        Some(sim)
    } else {
        drop(sim);
        unbounded(s)
    };
    let tp = timed.as_ref().and_then(|x| x.throughput.clone());
    let at_peak = timed.as_ref().and_then(|x| x.peak.as_ref());
    let (peak, peak_phase) = (at_peak.map(|p| p.allocated), at_peak.map(|p| p.at.phase));
    Counterfactual {
        change: label,
        fits: Some(fits),
        oom_phase,
        peak,
        peak_phase,
        gpus,
        step_time_s: tp.as_ref().map(|t| t.step_time_s),
        tokens_per_s: tp.as_ref().map(|t| t.tokens_per_s),
        tokens_per_s_change: tp.as_ref().zip(base_tps).map(|(t, b)| t.tokens_per_s_per_gpu / b - 1.0),
        gpu_seconds_per_token: tp.as_ref().map(|t| gpus as f64 / t.tokens_per_s),
        note: host_oom.then(|| "the node's host memory or NVMe cannot hold the offloaded state".into()),
        changes_problem: false,
        capacity: s.allocator_capacity(),
    }
}

/// The same scenario with unbounded memory: its timing and the peak it would need.
fn unbounded(s: &Scenario) -> Option<crate::report::Report> {
    let mut u = s.clone();
    u.cluster.memory_bytes = u64::MAX / 4;
    u.cluster.cuda_context_bytes = 0;
    crate::simulate_job_only(&u).ok()
}

/// Runs the standard set in parallel; the output order is the table's, whatever the threads.
/// A change that leaves the run out of memory with the original's peak and step time is
/// reported as having no effect; "more GPUs" is narrowed by bisection to the smallest count
/// that fits; when no single change fits, pairs with full checkpointing are tried.
pub fn run_all(s: &Scenario, sim: &Simulation) -> Vec<Counterfactual> {
    let fits_now = matches!(sim.report.verdict, Verdict::Fits { .. });
    let base = unbounded(s);
    let base_tps = base.as_ref().and_then(|x| x.throughput.as_ref().map(|t| t.tokens_per_s_per_gpu));
    let base_peak = base.as_ref().and_then(|x| x.peak.as_ref().map(|p| p.allocated.bytes));
    let base_step = base.as_ref().and_then(|x| x.throughput.as_ref().map(|t| t.step_time_s));
    // Only these figures are read from here on; the simulation itself is large.
    drop(base);
    let mut out = single_changes(s, base_tps, fits_now);
    for c in out.iter_mut() {
        let same = c.fits == Some(false)
            && c.capacity == s.allocator_capacity()
            && c.gpus == u64::from(s.cluster.gpus)
            && c.peak.map(|p| p.bytes) == base_peak
            && c.step_time_s.zip(base_step).is_some_and(|(a, b)| (a - b).abs() <= 1e-9 * b.max(1e-12));
        if same {
            c.fits = None;
            (c.peak, c.peak_phase, c.step_time_s, c.tokens_per_s, c.tokens_per_s_change) =
                (None, None, None, None, None);
            c.note = Some("no effect: the same peak and step time as the original, still out of memory".into());
        }
    }
    // Pairs when nothing fits on the GPUs the job has: a pair there is what a user without
    // more hardware can do, and one with more hardware may need fewer GPU-seconds per token
    // than any single hardware change (full checkpointing on 32 sharded GPUs against no
    // checkpointing on 136).
    if !out.iter().any(|c| c.fits == Some(true) && !c.changes_problem && same_hardware(c)) {
        out.extend(pairs(s, base_tps));
    }
    out
}

impl Counterfactual {
    /// Whether this row is a pair with full checkpointing rather than a single change.
    pub fn is_pair(&self) -> bool {
        self.change.starts_with(PAIR_PREFIX)
    }
}

fn skipped(name: &str, gpus: u64, why: String) -> Counterfactual {
    Counterfactual {
        change: name.into(),
        fits: None,
        oom_phase: None,
        peak: None,
        peak_phase: None,
        gpus,
        step_time_s: None,
        tokens_per_s: None,
        tokens_per_s_change: None,
        gpu_seconds_per_token: None,
        note: Some(why),
        changes_problem: false,
        capacity: 0,
    }
}

/// A change's scenarios, each with its table label.
type Variants = Vec<(String, Scenario)>;

/// The variants of a change that grows the job to try, smallest first, and why larger ones
/// are not. Two changes grow it: a context-parallel ring multiplies grad_accum by the ring
/// (the batch stays), and more GPUs under `[jitter]` add simulated ranks (every
/// data-parallel rank is simulated). A ring of 64, or 64 times the GPUs, holds 64 times the
/// job that [`super::accepts`] budgeted for one change: the hot-expert Mixtral on 1,024 GPUs
/// took 6.8 GB and 31 s in `explain` with every ring up to 64 simulated at once, a jittered
/// Llama 3.1 8B on 16 GPUs 5.8 GB and 28 s with counts up to 1,024. The variants kept hold
/// at most [`MAX_TASKS`] estimated tasks together, the lean path's bound for one simulation;
/// `larger` names what is left out in the reason.
fn budgeted(growing: Variants, larger: &str) -> Result<(Variants, Option<String>), String> {
    let mut held = 0u64;
    let mut kept = Vec::new();
    for (label, v) in growing {
        let tasks = v.estimated_tasks();
        if held.saturating_add(tasks) > MAX_TASKS {
            let sep = crate::report::text::sep;
            let why = format!(
                "{label} would simulate about {} tasks, which with the {} of those before it passes the {} explain simulates for one change; {larger} not tried",
                sep(tasks),
                sep(held),
                sep(MAX_TASKS)
            );
            return if kept.is_empty() { Err(why) } else { Ok((kept, Some(why))) };
        }
        held += tasks;
        kept.push((label, v));
    }
    Ok((kept, None))
}

/// [`variants`] as `explain` tries them: a change that grows the job held to one change's
/// task budget ([`budgeted`]), with why its larger variants are left out.
fn tried_variants(s: &Scenario, which: usize) -> Result<(Variants, Option<String>), String> {
    let vs = variants(s, which)?;
    match which {
        CONTEXT => budgeted(vs, "larger rings"),
        MORE_GPUS | MORE_GPUS_SHARDED => budgeted(vs, "larger counts"),
        _ => Ok((vs, None)),
    }
}

fn single_changes(s: &Scenario, base_tps: Option<f64>, fits_now: bool) -> Vec<Counterfactual> {
    // Each job's variants are simulated in order until one fits (the context-parallel ring
    // search); every other change's variants are jobs of one.
    let mut jobs: Vec<(usize, Variants)> = Vec::new();
    let mut skips: Vec<(usize, Counterfactual)> = Vec::new();
    // Why a growing change's larger variants were not tried, by change.
    let mut left_out: Vec<(usize, String)> = Vec::new();
    for (which, name) in COUNTERFACTUAL_NAMES.iter().enumerate() {
        let moe_only = [EXPERT_PARALLEL, CAPACITY, MOE_ACT, DEEPEP, EP_OVERLAP];
        if moe_only.contains(&which) && s.model.moe.is_none() {
            continue;
        }
        let megatron = s.parallel.framework == crate::plan::Framework::Megatron;
        if [MOE_ACT, PRECISION_AWARE, DEEPEP, EP_OVERLAP, FP8_INPUT_STORE].contains(&which) && !megatron {
            continue;
        }
        if which == FP8_INPUT_STORE && s.model.family != crate::model::Family::Llama {
            continue;
        }
        if which == COMPILE && s.workload.kernels != crate::model::KernelStack::Eager {
            continue;
        }
        if which == SCHEDULE && s.parallel.model_parallel.pipeline < 2 {
            continue;
        }
        if which == FLASH && !s.workload.attention.materialised() {
            continue;
        }
        if which == QLORA && !s.workload.lora.as_ref().is_some_and(|l| l.base == crate::model::WeightFormat::Half) {
            continue;
        }
        if which == MORE_GPUS_SHARDED && fully_sharded(s).is_err() {
            continue;
        }
        if which == NO_PREPARE && !s.workload.lora.as_ref().is_some_and(|l| l.fp32_stream()) {
            continue;
        }
        if ((which == FUSED_LOSS || which == SELECTIVE_OP) && megatron)
            || (which == SYNC_EACH && !s.parallel.no_sync)
            || (which == NO_NVLS && !s.nccl.nvls)
            || ((which == SMALLER_IPG || which == SMALLER_SUB_GROUP || which == FEWER_LIVE)
                && s.parallel.framework != crate::plan::Framework::Deepspeed)
        {
            continue;
        }
        match tried_variants(s, which) {
            Ok((vs, why)) => {
                if which == CONTEXT {
                    jobs.push((which, vs));
                } else {
                    jobs.extend(vs.into_iter().map(|lv| (which, vec![lv])));
                }
                left_out.extend(why.map(|why| (which, why)));
            }
            Err(why) => skips.push((which, skipped(name, u64::from(s.cluster.gpus), why))),
        }
    }
    let done: Vec<(usize, Counterfactual)> = jobs
        .par_iter()
        .flat_map_iter(|(w, chain)| {
            let mut tried = Vec::new();
            for (l, v) in chain {
                let c = measure(l.clone(), v, base_tps);
                let fits = c.fits == Some(true);
                tried.push((*w, c));
                if fits {
                    break;
                }
            }
            tried
        })
        .collect();
    let left_out_of = |which: usize| left_out.iter().find(|(w, _)| *w == which).map(|(_, why)| why.as_str());
    let mut out: Vec<(usize, Counterfactual)> = Vec::new();
    for which in table_order() {
        let mine: Vec<&Counterfactual> = done.iter().filter(|(w, _)| *w == which).map(|(_, c)| c).collect();
        let growing = which == MORE_GPUS || which == MORE_GPUS_SHARDED;
        if growing && !mine.is_empty() && fits_now {
            // A job explained near its capacity already fits: the first doubling, for what
            // it does to the peak and the speed; no search for a count that fits.
            let mut c = mine[0].clone();
            let n = s.cluster.gpus;
            let gpus = if n == 1 { "GPU" } else { "GPUs" };
            c.note =
                Some(format!("the job fits on its {n} {gpus} already: the first doubling, for its peak and speed"));
            out.push((which, c));
        } else if growing && !mine.is_empty() {
            out.push((which, fewest_gpus(s, which, &mine, base_tps, left_out_of(which))));
        } else if which == CONTEXT && !mine.is_empty() {
            // The smallest ring that fits (the search stopped there), else the largest tried.
            let pick = mine.iter().find(|c| c.fits == Some(true)).or(mine.last()).map(|c| (*c).clone());
            out.extend(pick.map(|mut c| {
                if c.fits != Some(true) && c.note.is_none() {
                    c.note = left_out_of(CONTEXT).map(str::to_string);
                }
                (which, c)
            }));
        } else {
            for c in mine {
                let mut c = c.clone();
                if which == 3 {
                    c.changes_problem = true;
                    c.note = Some("changes the training problem: half the tokens per sequence".into());
                }
                if which == QLORA {
                    c.note = Some("the frozen base quantized: Dettmers et al. 2023 (QLoRA) report NF4 with double quantization matching 16-bit LoRA fine-tuning".into());
                }
                if which == NO_PREPARE {
                    c.note = Some("the norms and head then compute in 16 bits: Unsloth measured a mean loss difference of about 8e-4 without the upcast (unsloth#1186); TRL's SFTTrainer no longer calls prepare_model_for_kbit_training (v0.26, trl#4577) but loads the model in float32 unless dtype says otherwise (v0.27)".into());
                }
                if which == CAPACITY {
                    c.changes_problem = true;
                    c.note = Some("changes the training problem: dropped token copies skip their expert (Megatron-Core --moe-expert-capacity-factor 1.0)".into());
                }
                out.push((which, c));
            }
        }
        out.extend(skips.iter().filter(|(w, _)| *w == which).cloned());
    }
    out.into_iter().map(|(_, c)| c).collect()
}

/// The smallest GPU count that fits, for "more GPUs" (`which`, plain or sharded): the first
/// doubling that fits, then bisection over the counts between it and the last doubling that
/// did not (whole nodes, whole model-parallel groups); the largest count tried if none fits,
/// saying so.
fn fewest_gpus(
    s: &Scenario,
    which: usize,
    doublings: &[&Counterfactual],
    base_tps: Option<f64>,
    left_out: Option<&str>,
) -> Counterfactual {
    let Some(k) = doublings.iter().position(|c| c.fits == Some(true)) else {
        let mut c = doublings[doublings.len() - 1].clone();
        c.note = Some(match left_out {
            Some(why) => format!("still OOM at {} GPUs ({why})", c.gpus),
            None => format!("still OOM at {} GPUs", c.gpus),
        });
        return c;
    };
    let gpus = u64::from(s.cluster.gpus);
    let mp = &s.parallel.model_parallel;
    let mut lo = if k == 0 { gpus } else { doublings[k - 1].gpus };
    let mut best = doublings[k].clone();
    let mut hi = best.gpus;
    // Whole nodes of the layout the count that fits has.
    let per_node = node_size(s, hi);
    let group = mp.tensor * mp.pipeline;
    let step = lcm(group.max(1), per_node.max(1));
    // Counts are multiples of `step`: halve the gap until no multiple lies strictly between.
    let searched = hi - lo > step;
    while hi - lo > step {
        let mid = (lo + (hi - lo) / 2).div_ceil(step) * step;
        if mid <= lo || mid >= hi {
            break;
        }
        // The doublings of this change were built, so every count between is too.
        let Ok((label, v)) = grown(s, which, mid) else { break };
        let c = measure(label, &v, base_tps);
        if c.fits == Some(true) {
            hi = mid;
            best = c;
        } else {
            lo = mid;
        }
    }
    let short = if lo == 1 { "1 GPU does not".to_string() } else { format!("{lo} GPUs do not") };
    best.note = Some(if searched {
        format!("the smallest count that fits (bisection over multiples of {step}); {short}")
    } else {
        format!("the smallest count that fits (no multiple of {step} lies between it and {lo}); {short}")
    });
    best
}

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut x: u64, mut y: u64| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}

/// The changes tried beside full checkpointing when no single change fits: micro-batch, GPU
/// count (and for a replicated job, GPU count with the state sharded), sharding, GPU, offload,
/// tensor parallelism, and for a LoRA job's 16-bit base QLoRA
/// (whose `prepare_model_for_kbit_training` turns checkpointing on in the first place).
const PAIRED: [usize; 8] = [2, MORE_GPUS, MORE_GPUS_SHARDED, 5, 8, 10, 11, QLORA];

/// When no single change fits: full activation checkpointing together with each of the
/// other changes that keep the problem ([`PAIRED`]), each re-simulated.
fn pairs(s: &Scenario, base_tps: Option<f64>) -> Vec<Counterfactual> {
    let Ok(mut ck) = variants(s, 0) else { return Vec::new() };
    let Some((_, ck)) = ck.pop() else { return Vec::new() };
    let mut jobs: Vec<(usize, String, Scenario)> = Vec::new();
    // Why a growing change's larger counts were not tried, by change.
    let mut left_out: Vec<(usize, String)> = Vec::new();
    for which in PAIRED {
        if let Ok((vs, why)) = tried_variants(&ck, which) {
            jobs.extend(vs.into_iter().map(|(l, v)| (which, format!("{PAIR_PREFIX}{l}"), v)));
            left_out.extend(why.map(|why| (which, why)));
        }
    }
    let done: Vec<(usize, Counterfactual)> =
        jobs.par_iter().map(|(w, l, v)| (*w, measure(l.clone(), v, base_tps))).collect();
    let mut out = Vec::new();
    for which in PAIRED {
        let mine: Vec<&Counterfactual> = done.iter().filter(|(w, _)| *w == which).map(|(_, c)| c).collect();
        if mine.is_empty() {
            continue;
        }
        if which == MORE_GPUS || which == MORE_GPUS_SHARDED {
            let why = left_out.iter().find(|(w, _)| *w == which).map(|(_, why)| why.as_str());
            let mut c = fewest_gpus(&ck, which, &mine, base_tps, why);
            c.change = format!("{PAIR_PREFIX}{}", c.change.trim_start_matches(PAIR_PREFIX));
            out.push(c);
        } else {
            out.extend(mine.into_iter().cloned());
        }
    }
    out
}

/// Whether a change, or a pair with full checkpointing, keeps the same GPUs (type and count).
fn same_hardware(c: &Counterfactual) -> bool {
    let change = c.change.trim_start_matches(PAIR_PREFIX);
    !(change.starts_with("GPUs ") || change.starts_with("GPU "))
}

/// The first line of the answer: the fastest change that fits on the same GPUs, else the
/// one needing the fewest GPU-seconds per token on other hardware.
pub fn answer(cfs: &[Counterfactual], status: &str) -> String {
    if status == "fits" {
        return "it fits; nothing to change".into();
    }
    let fits = |c: &&Counterfactual| c.fits == Some(true) && c.gpu_seconds_per_token.is_some() && !c.changes_problem;
    let cost = |c: &Counterfactual| c.gpu_seconds_per_token.unwrap_or(f64::MAX);
    let by_cost = |a: &&Counterfactual, b: &&Counterfactual| cost(a).total_cmp(&cost(b));
    let single = |c: &&Counterfactual| !c.is_pair();
    let same = cfs.iter().filter(fits).filter(single).filter(|c| same_hardware(c)).min_by(by_cost);
    let other = cfs.iter().filter(fits).filter(single).filter(|c| !same_hardware(c)).min_by(by_cost);
    let pair = cfs.iter().filter(fits).filter(|c| !single(c)).min_by(by_cost);
    let same_pair = cfs.iter().filter(fits).filter(|c| !single(c)).filter(|c| same_hardware(c)).min_by(by_cost);
    let problem = cfs.iter().filter(|c| c.changes_problem && c.fits == Some(true)).min_by(by_cost);
    let qlora = if cfs.iter().any(|c| c.change.starts_with(&format!("{PAIR_PREFIX}QLoRA"))) { ", QLoRA" } else { "" };
    let line = |c: &Counterfactual| {
        format!(
            "\"{}\": peak {}, {}{}",
            c.change,
            c.peak.map_or("-".into(), |p| fmt_bytes(p.bytes)),
            c.step_time_s.map_or(String::new(), |t| format!("{t:.3} s/step")),
            c.tokens_per_s_change
                .map_or(String::new(), |x| format!(", tokens/s per GPU {:+.1}% vs the original", x * 100.0))
        )
    };
    match (same, same_pair, other) {
        (Some(c), _, Some(o)) => format!(
            "the cheapest change that fits on the same GPUs is {}; with other hardware: {}",
            line(c),
            line(o)
        ),
        (Some(c), _, None) => format!("the cheapest change that fits on the same GPUs is {}", line(c)),
        (None, Some(p), o) => {
            let other = o.map_or(String::new(), |o| format!("; with other hardware: {}", line(o)));
            format!("no single change fits on the same GPUs; the cheapest pair that does is {}{other}", line(p))
        }
        (None, None, Some(o)) => {
            // A pair is named where it needs fewer GPU-seconds per token, else where it fits
            // on fewer GPUs: how many GPUs a job needs is the planner's other question.
            let fewest = cfs.iter().filter(fits).filter(|c| !single(c)).min_by_key(|c| c.gpus);
            let cheaper = match (pair, fewest) {
                (Some(p), _) if cost(p) < cost(o) => {
                    format!("; with full checkpointing as well, fewer GPU-seconds per token: {}", line(p))
                }
                (_, Some(p)) if p.gpus < o.gpus => format!("; on the fewest GPUs ({}): {}", p.gpus, line(p)),
                _ => String::new(),
            };
            format!("nothing fits on the same GPUs; the cheapest hardware change that fits is {} (fewest GPU-seconds per token){cheaper}", line(o))
        }
        (None, None, None) => match (pair, problem) {
            (Some(p), _) => format!("no single change that keeps the training problem fits; the cheapest pair tried that fits is {}", line(p)),
            (None, Some(q)) => format!("no change that keeps the training problem fits (full checkpointing was also tried with each of micro-batch, GPU count, sharding, GPU, offload{qlora} and tensor parallelism); only changing the problem does: {}", line(q)),
            (None, None) => format!("no single change in the standard set fits, nor full checkpointing together with any of micro-batch, GPU count, sharding, GPU, offload{qlora} or tensor parallelism"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{bigger_gpu, budgeted, variants, CONTEXT, MAX_TASKS, MORE_GPUS};
    use crate::hardware::{lookup, CATALOG};
    use crate::scenario::Scenario;

    /// The shipped hot-expert Mixtral job (PP 4 x EP 8, grad_accum 16) on `gpus` GPUs.
    fn mixtral_on(gpus: u32) -> Scenario {
        shipped_with("mixtral-8x7b-h100-ep8-hot-expert.toml", &[("gpus = 32", &format!("gpus = {gpus}"))], "")
    }

    /// A shipped scenario with each `(from, to)` replaced in its text, and `extra` appended.
    fn shipped_with(name: &str, edits: &[(&str, &str)], extra: &str) -> Scenario {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name);
        let mut text = std::fs::read_to_string(&path).unwrap();
        for (from, to) in edits {
            text = text.replace(from, to);
        }
        Scenario::from_toml(&path, &(text + extra)).unwrap()
    }

    /// The ring search keeps the rings whose tasks fit one change's budget together, smallest
    /// first, and says which ring it stopped before; on the shipped 32 GPUs every ring the
    /// data-parallel degree allows is kept.
    #[test]
    fn the_context_ring_search_holds_one_changes_task_budget() {
        let rings = |s: &Scenario| variants(s, CONTEXT).unwrap();
        let shipped = mixtral_on(32);
        let all = rings(&shipped);
        assert_eq!(all.len(), 3, "rings 2, 4 and 8 divide data parallelism 8");
        let (kept, left_out) = budgeted(all, "larger rings").unwrap();
        assert_eq!(kept.len(), 3);
        assert_eq!(left_out, None);
        // 1,024 GPUs: data parallelism 256 allows rings up to 64, which would simulate 64 x
        // grad_accum 16 micro-batches.
        let wide = mixtral_on(1024);
        let all = rings(&wide);
        assert_eq!(all.len(), 6);
        let estimates: Vec<u64> = all.iter().map(|(_, v)| v.estimated_tasks()).collect();
        let (kept, left_out) = budgeted(all, "larger rings").unwrap();
        let held: u64 = estimates[..kept.len()].iter().sum();
        assert!(held <= MAX_TASKS, "{held}");
        assert!(held + estimates[kept.len()] > MAX_TASKS, "{estimates:?}");
        assert_eq!(kept.last().unwrap().1.parallel.model_parallel.context, 8, "{estimates:?}");
        let why = left_out.unwrap();
        assert!(
            why.starts_with("context parallel 1 -> 16, grad_accum 16 -> 256 (same batch) would simulate about"),
            "{why}"
        );
        assert!(why.ends_with("larger rings not tried"), "{why}");
    }

    /// Under `[jitter]` every data-parallel rank is simulated, so each doubling of the GPUs
    /// doubles the tasks: torchtitan's Llama 3.1 8B recipe on 16 GPUs (micro-batch 4,
    /// grad_accum 8) keeps the doublings to 256 GPUs, whose tasks together stay within one
    /// change's budget. Without jitter the ranks simulated do not grow with the GPUs and every
    /// doubling is kept.
    #[test]
    fn more_gpus_under_jitter_holds_one_changes_task_budget() {
        let edits =
            [("gpus = 8", "gpus = 16"), ("micro_batch = 1", "micro_batch = 4"), ("grad_accum = 1", "grad_accum = 8")];
        let recipe = |extra: &str| shipped_with("llama3-8b-fsdp2-h100.toml", &edits, extra);
        let plain = recipe("");
        let (kept, left_out) = budgeted(variants(&plain, MORE_GPUS).unwrap(), "larger counts").unwrap();
        assert_eq!((kept.len(), left_out), (6, None));
        let jittered = recipe("\n[jitter]\nseed = 1\ncompute_cv = 0.03\n");
        let all = variants(&jittered, MORE_GPUS).unwrap();
        let estimates: Vec<u64> = all.iter().map(|(_, v)| v.estimated_tasks()).collect();
        let (kept, left_out) = budgeted(all, "larger counts").unwrap();
        assert_eq!(kept.last().unwrap().1.cluster.gpus, 256, "{estimates:?}");
        assert!(estimates[..kept.len()].iter().sum::<u64>() <= MAX_TASKS);
        let why = left_out.unwrap();
        assert!(
            why.starts_with("GPUs 16 -> 512 would simulate about") && why.ends_with("larger counts not tried"),
            "{why}"
        );
    }

    /// The upgrade list is kept by hand: every catalog part but the largest has an upgrade,
    /// and each names a catalog part with more memory.
    #[test]
    fn every_catalog_gpu_upgrades_to_a_larger_catalog_gpu() {
        let largest = CATALOG.iter().map(|g| g.memory_bytes).max().unwrap();
        for g in CATALOG {
            match bigger_gpu(&g.name) {
                Some(b) => {
                    let b = lookup(b).unwrap_or_else(|| panic!("{}: upgrade {b} is not in the catalog", g.name));
                    assert!(b.memory_bytes > g.memory_bytes, "{} -> {}: not more memory", g.name, b.name);
                }
                None => assert_eq!(g.memory_bytes, largest, "{}: no upgrade", g.name),
            }
        }
    }
}
